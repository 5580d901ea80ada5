//! A `kube::Client` whose failed requests name the server they went to.
//!
//! Where it sits: under every list, watch and write the informers and controllers send. A
//! request that gets no answer (connection refused, a TLS failure, a timeout) comes back from
//! `kube::Client` as `kube::Error::Service` holding hyper's error, which says
//! `client error (Connect): tcp connect error: Connection refused` and nothing about where to:
//! `kube::Client` does not keep the URL it was built from. A Go client's error is a `url.Error`
//! that always names it (`Get "https://127.0.0.1:6443/api/v1/pods": dial tcp …: connect:
//! connection refused`); a client built here does the same: its transport errors are a
//! [`RequestError`] (`GET https://127.0.0.1:6443/api/v1/pods?limit=500`) whose source is
//! hyper's error.
//!
//! Only errors kube reports as `kube::Error::Service` are wrapped; an error kube classifies
//! itself (`kube::Error::Auth`, …) keeps its variant, so code that
//! matches on kube's variants sees what it would see with `Client::try_default()`.
//!
//! The [`Reflector`](crate::Reflector) finds the [`RequestError`] in a failed list's source
//! chain ([`server_of`]) and its root cause ([`transport_cause`]) and logs
//! `list failed: connection refused to https://127.0.0.1:6443 (pods)`. With a client built
//! any other way the line names the cause and the resource, not the server.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube::Error> {
//! // Instead of kube::Client::try_default(): the same kubeconfig / in-cluster inference.
//! let client = informer_core::client::infer().await?;
//! # Ok(()) }
//! ```

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::Request;
use kube::{Client, Config};

type BoxError = Box<dyn Error + Send + Sync>;

/// A client from the kubeconfig or the in-cluster environment, as `kube::Client::try_default()`
/// infers it, whose transport errors name the server ([module docs](self)).
///
/// # Errors
///
/// `kube::Error::InferConfig` when no configuration is found, or what
/// [`from_config`] returns.
pub async fn infer() -> Result<Client, kube::Error> {
    from_config(Config::infer().await.map_err(kube::Error::InferConfig)?)
}

/// A client for `config`, as `kube::Client::try_from(config)`, whose transport errors name
/// `config.cluster_url` ([module docs](self)).
///
/// # Errors
///
/// What `kube::Client::try_from` returns for a configuration it cannot use (TLS material,
/// authentication setup).
pub fn from_config(config: Config) -> Result<Client, kube::Error> {
    let server: Arc<str> = Arc::from(config.cluster_url.to_string().trim_end_matches('/'));
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&NameServerLayer { server })
        .build())
}

/// A request that got no answer from the server at [`server`](Self::server): what failed is
/// its [`source`](Error::source). Displays as `GET https://127.0.0.1:6443/api/v1/pods?limit=500`.
#[derive(Debug)]
pub struct RequestError {
    method: http::Method,
    server: Arc<str>,
    path: String,
    source: BoxError,
}

impl RequestError {
    /// The server's URL, as the client was configured with it (`https://127.0.0.1:6443`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The request's method.
    pub fn method(&self) -> &http::Method {
        &self.method
    }

    /// The request's full URL.
    pub fn url(&self) -> String {
        format!("{}{}", self.server, self.path)
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}{}", self.method, self.server, self.path)
    }
}

impl Error for RequestError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

/// The server a failed request went to, if `e` or one of its sources is a [`RequestError`].
pub fn server_of<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a str> {
    chain(e)
        .find_map(|e| e.downcast_ref::<RequestError>())
        .map(RequestError::server)
}

/// Why a request got no answer, in a few words (`connection refused`, `connection reset`,
/// `timed out`, …), if `e` or one of its sources is an I/O error; `None` otherwise (the server
/// answered, or the failure is not a socket's).
pub fn transport_cause(e: &(dyn Error + 'static)) -> Option<String> {
    use std::io::ErrorKind;
    let io = chain(e).filter_map(|e| e.downcast_ref::<std::io::Error>()).last()?;
    Some(
        match io.kind() {
            ErrorKind::ConnectionRefused => "connection refused",
            ErrorKind::ConnectionReset => "connection reset",
            ErrorKind::ConnectionAborted => "connection aborted",
            ErrorKind::NotConnected => "not connected",
            ErrorKind::AddrNotAvailable => "address not available",
            ErrorKind::HostUnreachable => "host unreachable",
            ErrorKind::NetworkUnreachable => "network unreachable",
            ErrorKind::TimedOut => "timed out",
            ErrorKind::UnexpectedEof => "connection closed",
            ErrorKind::BrokenPipe => "broken pipe",
            _ => return Some(io.to_string()),
        }
        .to_string(),
    )
}

fn chain<'a>(e: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(e), |&e| e.source())
}

/// Wraps the client's service so that its errors name the server.
struct NameServerLayer {
    server: Arc<str>,
}

impl<S> tower::Layer<S> for NameServerLayer {
    type Service = NameServer<S>;

    fn layer(&self, inner: S) -> NameServer<S> {
        NameServer {
            inner,
            server: self.server.clone(),
        }
    }
}

#[derive(Clone)]
struct NameServer<S> {
    inner: S,
    server: Arc<str>,
}

impl<S, B> tower::Service<Request<B>> for NameServer<S>
where
    S: tower::Service<Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = request.method().clone();
        let path = request
            .uri()
            .path_and_query()
            .map_or_else(|| request.uri().path().to_string(), ToString::to_string);
        let server = self.server.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            response.await.map_err(|e| {
                let e: BoxError = e.into();
                // kube turns its own errors into their variants (kube::Error::Auth, …): leave
                // them to it. (A bare hyper::Error, kube's HyperError, never comes out of
                // the service: hyper-util's client wraps it in its own error.)
                if e.is::<kube::Error>() {
                    return e;
                }
                Box::new(RequestError {
                    method,
                    server,
                    path,
                    source: e,
                }) as BoxError
            })
        })
    }
}
