//! http-serving: the HTTP/1.1 serving under envtest's API server and the controller Manager's
//! `/metrics`, `/healthz`, `/readyz` (and a webhook server later), with the protections Go's
//! `http.Server` gives kube-apiserver and controller-runtime and `axum::serve` lacks.
//!
//! Where it sits: between a `TcpListener` and an `axum::Router`. [`serve`] accepts connections
//! under a cap, runs the TLS handshake under a deadline, and closes a connection whose client
//! is too slow to send a request's headers or that stays idle between requests; a response
//! that streams (a watch) is never cut. Limits and their defaults ([`ServingConfig`]):
//!
//! | limit | default | source |
//! |---|---|---|
//! | header-read timeout | 32 s | kube-apiserver / controller-runtime `ReadHeaderTimeout` |
//! | idle timeout | 90 s | kube-apiserver / controller-runtime `IdleTimeout` |
//! | TLS handshake timeout | 10 s | Go's `http.DefaultTransport` (client side) |
//! | request line + headers | 1 MiB | kube-apiserver / controller-runtime `MaxHeaderBytes` |
//! | connections at once | 900 | none upstream; below the usual 1024 open files |
//! | TCP keep-alive | 3 min | kube-apiserver's `defaultKeepAlivePeriod` |
//!
//! A connection over the cap is not accepted until one closes (it waits in the kernel's
//! backlog, as with Go's `netutil.LimitListener`); the timeouts bound how long that can take.
//! How each deadline applies is the transition table in `activity.rs`. HTTP/1.1 only (axum is
//! built without HTTP/2 here, and envtest's ALPN offers `http/1.1`).
//!
//! ```
//! # async fn demo() -> std::io::Result<()> {
//! use axum::{Router, routing::get};
//! use tokio_util::sync::CancellationToken;
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let router = Router::new().route("/healthz", get(|| async { "ok" }));
//! let cancel = CancellationToken::new();
//! let server = tokio::spawn(http_serving::serve(
//!     listener,
//!     router,
//!     None, // or Some(Arc<rustls::ServerConfig>) for HTTPS
//!     http_serving::ServingConfig::default(),
//!     cancel.clone(),
//! ));
//! cancel.cancel();
//! server.await?;
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

mod activity;
mod config;
mod serve;

pub use config::{
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADER_BYTES, DEFAULT_READ_HEADER_TIMEOUT,
    DEFAULT_TCP_KEEPALIVE, DEFAULT_TLS_HANDSHAKE_TIMEOUT, ServingConfig,
};
pub use serve::serve;
