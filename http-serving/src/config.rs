//! [`ServingConfig`]: the timeouts and limits of one HTTP server.

use std::time::Duration;

/// kube-apiserver's and controller-runtime's `ReadHeaderTimeout`: "just shy of
/// requestTimeoutUpperBound" (34 s) in kube-apiserver's `secure_serving.go`; controller-runtime's
/// `internal/httpserver.New` uses the same for the metrics, health and webhook servers.
pub const DEFAULT_READ_HEADER_TIMEOUT: Duration = Duration::from_secs(32);

/// kube-apiserver's and controller-runtime's `IdleTimeout`: 90 s, which "matches
/// http.DefaultTransport keep-alive timeout" (clients drop an idle connection at 90 s too).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a client may take to finish its TLS handshake: 10 s, the handshake timeout of Go's
/// `http.DefaultTransport` (the client side). Go's server uses its `ReadHeaderTimeout` (32 s in
/// kube-apiserver) for this; a client gives up at 10 s, so waiting longer only holds a connection
/// whose client has left.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// kube-apiserver's and controller-runtime's `MaxHeaderBytes`: 1 MiB (`1 << 20`) for the request
/// line and headers.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 1 << 20;

/// Connections served at once. Neither kube-apiserver nor controller-runtime caps connections
/// (kube-apiserver caps requests in flight, not counting watches); this cap keeps a flood of
/// connections below the usual soft limit of open files (1024) less a margin for the process's
/// own files.
pub const DEFAULT_MAX_CONNECTIONS: usize = 900;

/// kube-apiserver's TCP keep-alive period on accepted connections (`defaultKeepAlivePeriod`,
/// 3 min): a peer that vanished (a laptop closed mid-watch) is found even on a connection busy
/// with a silent watch.
pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(180);

/// The timeouts and limits of one HTTP server ([`serve`](crate::serve)).
///
/// ```
/// use std::time::Duration;
/// let config = http_serving::ServingConfig::default()
///     .read_header_timeout(Duration::from_secs(5))
///     .max_connections(64);
/// assert_eq!(config.idle_timeout, Duration::from_secs(90));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServingConfig {
    /// How long a client may take to send a request's line and headers, counted from the end of
    /// the TLS handshake for a connection's first request and from the first byte of each later
    /// one. Past it the connection is closed. Default [`DEFAULT_READ_HEADER_TIMEOUT`] (32 s).
    pub read_header_timeout: Duration,
    /// How long a keep-alive connection may stay open with no request in flight and no byte of
    /// the next one. Never applies while a response streams (a watch). Default
    /// [`DEFAULT_IDLE_TIMEOUT`] (90 s).
    pub idle_timeout: Duration,
    /// How long a TLS handshake may take. Default [`DEFAULT_TLS_HANDSHAKE_TIMEOUT`] (10 s).
    pub tls_handshake_timeout: Duration,
    /// Largest request line plus headers; larger gets `431`. Default
    /// [`DEFAULT_MAX_HEADER_BYTES`] (1 MiB).
    pub max_header_bytes: usize,
    /// Connections served at once (at least 1). Over the cap, new connections are not accepted:
    /// they wait in the kernel's listen backlog until one closes, as with Go's
    /// `netutil.LimitListener`, so a burst is served late rather than refused, and the process
    /// never runs out of file descriptors. Default [`DEFAULT_MAX_CONNECTIONS`] (900).
    pub max_connections: usize,
    /// TCP keep-alive idle time on accepted connections (`None`: off). Default
    /// [`DEFAULT_TCP_KEEPALIVE`] (3 min).
    pub tcp_keepalive: Option<Duration>,
}

impl Default for ServingConfig {
    fn default() -> Self {
        ServingConfig {
            read_header_timeout: DEFAULT_READ_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            tls_handshake_timeout: DEFAULT_TLS_HANDSHAKE_TIMEOUT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            tcp_keepalive: Some(DEFAULT_TCP_KEEPALIVE),
        }
    }
}

impl ServingConfig {
    /// Sets the header-read timeout.
    #[must_use]
    pub fn read_header_timeout(mut self, timeout: Duration) -> Self {
        self.read_header_timeout = timeout;
        self
    }

    /// Sets the idle timeout of keep-alive connections.
    #[must_use]
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets the TLS handshake timeout.
    #[must_use]
    pub fn tls_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.tls_handshake_timeout = timeout;
        self
    }

    /// Sets the largest request line plus headers.
    #[must_use]
    pub fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.max_header_bytes = bytes;
        self
    }

    /// Sets the cap on connections served at once (at least 1).
    #[must_use]
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets the TCP keep-alive idle time (`None`: off).
    #[must_use]
    pub fn tcp_keepalive(mut self, time: Option<Duration>) -> Self {
        self.tcp_keepalive = time;
        self
    }
}
