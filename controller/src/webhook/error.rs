//! [`WebhookError`]: what can go wrong building or starting the webhook server, or registering
//! a webhook. Errors of a single request are not here: they are answered to the caller as an
//! error `AdmissionResponse` or a failed `ConversionReview`, never raised.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors of the webhook server's setup.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The server's address could not be bound; the message names the setting that chose it.
    #[error("binding the webhook server on {addr} (set by WebhookServerConfig::addr): {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The serving certificate or key could not be read, parsed, or they do not match.
    #[error("webhook serving certificate {}: {reason}", path.display())]
    Certificate {
        /// The file that failed.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The TLS configuration could not be built.
    #[error("webhook TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// Registering the webhook metrics failed.
    #[error("registering webhook metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// A webhook is already registered at this path.
    #[error("a webhook is already registered at {path}")]
    PathInUse {
        /// The path.
        path: String,
    },
    /// A path does not start with `/`.
    #[error("webhook path {path:?} does not start with '/'")]
    InvalidPath {
        /// The path.
        path: String,
    },
    /// A conversion is inconsistent: a spoke of another group or kind than its hub, or a
    /// version given twice, or a kind registered twice.
    #[error("conversion for {kind}: {reason}")]
    Conversion {
        /// The hub's `group/Kind`.
        kind: String,
        /// What is wrong.
        reason: String,
    },
}
