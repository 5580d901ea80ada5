//! [`Config`]: how a [`Server`](crate::Server) is set up.

use http_serving::ServingConfig;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Settings for [`Server::start`](crate::Server::start). `Config::default()` suits tests: a port
/// chosen by the OS on 127.0.0.1, a watch cache large enough for ordinary tests, and bookmarks
/// every second.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Address to bind; must be a loopback address. Default `127.0.0.1:0`.
    pub listen: SocketAddr,
    /// Events kept in the watch cache ring. A watch or list at a revision older than the ring's
    /// window gets `410 Expired`. Default 4096.
    pub watch_cache_size: usize,
    /// Capacity of each watcher's input buffer. Default 128.
    pub watcher_buffer: usize,
    /// How long a watcher's input may stay full before it is terminated. Default 1 s.
    pub slow_watcher_grace: Duration,
    /// Interval of BOOKMARK events for watches that allow them. Default 1 s.
    pub bookmark_interval: Duration,
    /// Largest accepted request body (larger: `413`). Default 3 MiB, as kube-apiserver.
    pub max_body_bytes: usize,
    /// Require `Authorization: Bearer <token>` (else `401`). Default none.
    pub token: Option<String>,
    /// Requests kept in the request log (oldest dropped first). Default 100 000.
    pub request_log_capacity: usize,
    /// Bytes the request log may hold (its entries' method, path and query; oldest dropped
    /// first past it), so long query strings cannot grow it without bound. Default 64 MiB.
    pub request_log_bytes: usize,
    /// Header-read, idle and TLS-handshake timeouts, header size and connection cap of the HTTP
    /// server. Default [`ServingConfig::default`]: kube-apiserver's 32 s header read, 90 s idle,
    /// 1 MiB of headers; 10 s handshake; 900 connections.
    pub serving: ServingConfig,
    /// With [`tls`](Config::tls): the directory holding the CA and serving key pair, created on
    /// first start and reused after, so kubeconfigs survive a restart (see
    /// [`Config::cert_dir`]). Default none: a new CA at every start, kept in memory.
    pub cert_dir: Option<PathBuf>,
    /// Serve HTTPS with a CA and serving certificate made at start (see
    /// [`Server::ca_certificate_pem`](crate::Server::ca_certificate_pem)). Default off: plain
    /// HTTP on loopback, the cheaper transport for tests.
    pub tls: bool,
    /// How long a list or watch at a resourceVersion the server has not reached yet waits for
    /// it before `504` "Too large resource version" (kube-apiserver's watch cache waits 3 s).
    /// Default 3 s.
    pub too_large_resource_version_wait: Duration,
    /// Where admission and conversion webhooks that name a `service` are reached: envtest has
    /// no cluster network, so `(namespace, name)` maps to a `host:port` (the service's `port`
    /// is not used; the certificate is still verified for `<name>.<namespace>.svc`). Set with
    /// [`Config::webhook_service`]. Default empty: a call to a service fails.
    pub webhook_services: BTreeMap<(String, String), String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            watch_cache_size: 4096,
            watcher_buffer: 128,
            slow_watcher_grace: Duration::from_secs(1),
            bookmark_interval: Duration::from_secs(1),
            max_body_bytes: 3 * 1024 * 1024,
            token: None,
            request_log_capacity: 100_000,
            request_log_bytes: 64 * 1024 * 1024,
            serving: ServingConfig::default(),
            cert_dir: None,
            tls: false,
            too_large_resource_version_wait: Duration::from_secs(3),
            webhook_services: BTreeMap::new(),
        }
    }
}

impl Config {
    /// Routes webhook calls to the service `namespace`/`name` to `address` (`host:port`), as a
    /// cluster's service network would: see [`Config::webhook_services`].
    #[must_use]
    pub fn webhook_service(
        mut self,
        namespace: impl Into<String>,
        name: impl Into<String>,
        address: impl Into<String>,
    ) -> Self {
        self.webhook_services
            .insert((namespace.into(), name.into()), address.into());
        self
    }

    /// Sets how long a list or watch at a future resourceVersion waits for it.
    #[must_use]
    pub fn too_large_resource_version_wait(mut self, wait: Duration) -> Self {
        self.too_large_resource_version_wait = wait;
        self
    }

    /// Sets the listen address (loopback only).
    #[must_use]
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Sets the watch cache ring size.
    #[must_use]
    pub fn watch_cache_size(mut self, n: usize) -> Self {
        self.watch_cache_size = n;
        self
    }

    /// Sets each watcher's input buffer size.
    #[must_use]
    pub fn watcher_buffer(mut self, n: usize) -> Self {
        self.watcher_buffer = n;
        self
    }

    /// Sets the grace period of a watcher with a full buffer.
    #[must_use]
    pub fn slow_watcher_grace(mut self, d: Duration) -> Self {
        self.slow_watcher_grace = d;
        self
    }

    /// Sets the bookmark interval.
    #[must_use]
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }

    /// Sets the request body limit.
    #[must_use]
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.max_body_bytes = n;
        self
    }

    /// Requires this bearer token.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Serves HTTPS: clients are tested over the transport a real cluster uses, and kubectl
    /// sends bearer tokens (it sends them only over HTTPS).
    #[must_use]
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Sets the request log capacity.
    #[must_use]
    pub fn request_log_capacity(mut self, n: usize) -> Self {
        self.request_log_capacity = n;
        self
    }

    /// Sets the request log's byte budget.
    #[must_use]
    pub fn request_log_bytes(mut self, bytes: usize) -> Self {
        self.request_log_bytes = bytes;
        self
    }

    /// Sets the HTTP server's timeouts and connection cap.
    #[must_use]
    pub fn serving(mut self, serving: ServingConfig) -> Self {
        self.serving = serving;
        self
    }

    /// Keeps the TLS CA and serving key pair in `dir` (implies [`tls`](Config::tls)), as
    /// kube-apiserver's `--cert-dir`: the first start creates `dir` (mode 0700) and writes
    /// `ca.crt`/`ca.key` and `apiserver.crt`/`apiserver.key` (kubeadm's names; keys mode 0600);
    /// later starts reuse them, so a client holding an old kubeconfig still trusts the server.
    /// A serving certificate that has expired (or expires within a day) or does not name the
    /// listen address is made again, signed by the same CA.
    #[must_use]
    pub fn cert_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cert_dir = Some(dir.into());
        self.tls = true;
        self
    }
}
