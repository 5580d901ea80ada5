//! [`Error`]: why a [`Server`](crate::Server) could not start or be used.

/// Errors of the envtest API (not of requests: those are `Status` objects on the wire).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The listen address is not a loopback address.
    #[error("envtest binds only to loopback addresses, not {0}")]
    NotLoopback(std::net::SocketAddr),
    /// Binding or another I/O step failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Building the kube client failed.
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
    /// The base URL did not parse (should not happen).
    #[error("invalid URL: {0}")]
    Url(String),
    /// A path given to a helper such as `objects_of` is not a resource path.
    #[error("not a served resource path: {0}")]
    UnknownPath(String),
    /// Making the TLS certificates or configuration failed.
    #[error("TLS: {0}")]
    Tls(String),
    /// Writing a kubeconfig failed to serialize.
    #[error("serializing: {0}")]
    Serialize(#[from] serde_json::Error),
}
