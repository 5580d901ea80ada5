//! [`WebhookServer`]: the HTTPS server the webhooks are served on (controller-runtime's
//! `webhook.Server`), and [`WebhookServerConfig`].
//!
//! Where it sits: a `TcpListener` bound at [`WebhookServer::new`] → the `http-serving` crate
//! (connection cap, header-read, idle and TLS-handshake timeouts) with a rustls configuration
//! whose certificate comes from a [`CertWatcher`] → one axum handler that finds the webhook
//! registered at the request's path (a map read per request, so webhooks registered while the
//! server runs are served at once) → the webhook, under a tracing span and the metrics.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use http_serving::ServingConfig;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span, field::Empty, info, info_span};

use super::admission::{AdmissionRegistration, MutatingWebhook, Mutator, ValidatingWebhook, Validator};
use super::certwatcher::CertWatcher;
use super::conversion::{Conversion, ConversionHook};
use super::error::WebhookError;
use super::metrics::WebhookMetrics;
use crate::reconciler::BoxError;
use crate::runnable::Runnable;

/// The path conversion webhooks are served at (controller-runtime's `/convert`).
pub const CONVERSION_PATH: &str = "/convert";

/// The largest request body read (controller-runtime's 7 MiB: an object and its old version
/// at etcd's 1.5 MiB limit each, JSON-escaped, with room).
const MAX_REQUEST_BYTES: usize = 7 * 1024 * 1024;

/// How long the server waits, once stopped, for the handler tasks it aborted to unwind.
const HANDLER_UNWIND_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// Where and how the webhook server serves (controller-runtime's `webhook.Options`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WebhookServerConfig {
    /// The address to listen on (default `0.0.0.0:9443`, controller-runtime's port on every
    /// interface, so kube-apiserver reaches the pod through its Service).
    pub addr: SocketAddr,
    /// The directory holding the serving certificate and key (default
    /// `<temp dir>/k8s-webhook-server/serving-certs`, controller-runtime's; mount cert-manager's
    /// Secret there).
    pub cert_dir: PathBuf,
    /// The certificate file's name in `cert_dir` (default `tls.crt`): a PEM chain, leaf first.
    pub cert_name: String,
    /// The key file's name in `cert_dir` (default `tls.key`): a PEM private key.
    pub key_name: String,
    /// Header-read, idle and TLS-handshake timeouts and the connection cap.
    pub serving: ServingConfig,
}

impl Default for WebhookServerConfig {
    fn default() -> Self {
        WebhookServerConfig {
            addr: SocketAddr::from(([0, 0, 0, 0], 9443)),
            cert_dir: std::env::temp_dir().join("k8s-webhook-server").join("serving-certs"),
            cert_name: "tls.crt".into(),
            key_name: "tls.key".into(),
            serving: ServingConfig::default(),
        }
    }
}

impl WebhookServerConfig {
    /// The address to listen on (port 0 picks a free one: see [`WebhookServer::local_addr`]).
    #[must_use]
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// The directory of the certificate and key.
    #[must_use]
    pub fn cert_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cert_dir = dir.into();
        self
    }

    /// The certificate file's name in the directory.
    #[must_use]
    pub fn cert_name(mut self, name: impl Into<String>) -> Self {
        self.cert_name = name.into();
        self
    }

    /// The key file's name in the directory.
    #[must_use]
    pub fn key_name(mut self, name: impl Into<String>) -> Self {
        self.key_name = name.into();
        self
    }

    /// The serving limits (default [`ServingConfig::default`]).
    #[must_use]
    pub fn serving(mut self, serving: ServingConfig) -> Self {
        self.serving = serving;
        self
    }
}

/// A request as a webhook sees it.
pub(crate) struct HookRequest {
    pub(crate) content_type: Option<String>,
    pub(crate) body: Bytes,
    /// The request's span: a webhook records `uid`, `kind`, `operation` on it.
    pub(crate) span: Span,
    /// Where a webhook spawns its handler's task, so the server joins it at shutdown.
    pub(crate) tasks: TaskTracker,
    pub(crate) metrics: WebhookMetrics,
}

/// A webhook's HTTP answer.
pub(crate) struct HookResponse {
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
}

impl HookResponse {
    /// 200 with `body` as JSON.
    pub(crate) fn json(body: &impl Serialize) -> HookResponse {
        match serde_json::to_vec(body) {
            Ok(body) => HookResponse {
                status: StatusCode::OK,
                content_type: "application/json",
                body,
            },
            Err(e) => HookResponse::internal(format!("encoding the response: {e}")),
        }
    }

    /// 500 with `message`, logged.
    pub(crate) fn internal(message: String) -> HookResponse {
        tracing::error!(error = %message, "webhook response failed");
        HookResponse {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            content_type: "text/plain; charset=utf-8",
            body: format!("{message}\n").into_bytes(),
        }
    }

    pub(crate) fn bad_request(message: String) -> HookResponse {
        HookResponse {
            status: StatusCode::BAD_REQUEST,
            content_type: "text/plain; charset=utf-8",
            body: format!("{message}\n").into_bytes(),
        }
    }
}

/// One webhook at one path.
pub(crate) trait Hook: Send + Sync + 'static {
    fn serve(self: Arc<Self>, request: HookRequest) -> BoxFuture<'static, HookResponse>;
}

/// The text of a caught panic.
pub(crate) fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    match panic.downcast::<String>() {
        Ok(message) => *message,
        Err(panic) => match panic.downcast::<&'static str>() {
            Ok(message) => (*message).to_owned(),
            Err(_) => "a non-string panic payload".to_owned(),
        },
    }
}

/// The webhook server: register webhooks on it, and run it (the [`Manager`](crate::Manager)
/// runs the one configured with
/// [`ManagerBuilder::webhook_server`](crate::ManagerBuilder::webhook_server); it is also a
/// [`Runnable`] that needs no leader election, and [`start`](Self::start) runs it alone).
/// Cheap to clone: clones register on the same server.
#[derive(Clone)]
pub struct WebhookServer {
    inner: Arc<Inner>,
}

struct Inner {
    config: WebhookServerConfig,
    /// Taken by the one `start`.
    listener: Mutex<Option<std::net::TcpListener>>,
    addr: SocketAddr,
    /// Invariant: every path of `registrations` is a key here, and `CONVERSION_PATH` is one
    /// exactly when a conversion was registered.
    hooks: RwLock<HashMap<String, Arc<dyn Hook>>>,
    registrations: RwLock<Vec<AdmissionRegistration>>,
    conversion: Arc<ConversionHook>,
    metrics: WebhookMetrics,
    tasks: TaskTracker,
}

impl std::fmt::Debug for WebhookServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookServer")
            .field("addr", &self.inner.addr)
            .field("cert_dir", &self.inner.config.cert_dir)
            .finish_non_exhaustive()
    }
}

impl WebhookServer {
    /// A server on `config.addr` (bound now, so [`local_addr`](Self::local_addr) is known),
    /// its metrics registered in `registry`. The certificate is read when it starts.
    ///
    /// # Errors
    /// [`WebhookError::Bind`] if the address cannot be bound; [`WebhookError::Metrics`] if the
    /// registry already has the webhook metrics (one server per registry).
    pub fn new(config: WebhookServerConfig, registry: &prometheus::Registry) -> Result<WebhookServer, WebhookError> {
        let bind = || -> std::io::Result<std::net::TcpListener> {
            let listener = std::net::TcpListener::bind(config.addr)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        };
        let listener = bind().map_err(|source| WebhookError::Bind {
            addr: config.addr,
            source,
        })?;
        let addr = listener.local_addr().unwrap_or(config.addr);
        Ok(WebhookServer {
            inner: Arc::new(Inner {
                metrics: WebhookMetrics::new(registry)?,
                config,
                listener: Mutex::new(Some(listener)),
                addr,
                hooks: RwLock::new(HashMap::new()),
                registrations: RwLock::new(Vec::new()),
                conversion: Arc::new(ConversionHook {
                    kinds: RwLock::new(HashMap::new()),
                }),
                tasks: TaskTracker::new(),
            }),
        })
    }

    /// The address it listens on (the port picked, if the config's was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The configuration.
    pub fn config(&self) -> &WebhookServerConfig {
        &self.inner.config
    }

    /// Serves a validating webhook for `K` at its path; returns the path.
    ///
    /// # Errors
    /// [`WebhookError::PathInUse`] or [`WebhookError::InvalidPath`].
    pub fn register_validating<K, V>(&self, webhook: ValidatingWebhook<K, V>) -> Result<String, WebhookError>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
        V: Validator<K>,
    {
        let (registration, hook) = webhook.into_hook();
        self.register_admission(registration, hook)
    }

    /// Serves a mutating webhook for `K` at its path; returns the path.
    ///
    /// # Errors
    /// [`WebhookError::PathInUse`] or [`WebhookError::InvalidPath`].
    pub fn register_mutating<K, M>(&self, webhook: MutatingWebhook<K, M>) -> Result<String, WebhookError>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned + Serialize + Clone + Send + 'static,
        M: Mutator<K>,
    {
        let (registration, hook) = webhook.into_hook();
        self.register_admission(registration, hook)
    }

    fn register_admission(
        &self,
        registration: AdmissionRegistration,
        hook: Arc<dyn Hook>,
    ) -> Result<String, WebhookError> {
        let path = registration.path.clone();
        self.insert_hook(&path, hook)?;
        info!(path = %path, webhook = %registration.name, mutating = registration.mutating, "webhook registered");
        self.inner
            .registrations
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(registration);
        Ok(path)
    }

    fn insert_hook(&self, path: &str, hook: Arc<dyn Hook>) -> Result<(), WebhookError> {
        if !path.starts_with('/') {
            return Err(WebhookError::InvalidPath { path: path.to_owned() });
        }
        let mut hooks = self.inner.hooks.write().unwrap_or_else(|e| e.into_inner());
        if hooks.contains_key(path) {
            return Err(WebhookError::PathInUse { path: path.to_owned() });
        }
        hooks.insert(path.to_owned(), hook);
        Ok(())
    }

    /// Serves the conversion of one kind at [`CONVERSION_PATH`] (one path for every kind, as
    /// controller-runtime).
    ///
    /// # Errors
    /// [`WebhookError::Conversion`] if `conversion` is inconsistent or its kind is registered
    /// already; [`WebhookError::PathInUse`] if an admission webhook took `/convert`.
    pub fn register_conversion<H>(&self, conversion: Conversion<H>) -> Result<(), WebhookError>
    where
        H: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        let (kind, converter) = conversion.into_kind()?;
        {
            let mut hooks = self.inner.hooks.write().unwrap_or_else(|e| e.into_inner());
            let conversion: Arc<dyn Hook> = self.inner.conversion.clone();
            match hooks.get(CONVERSION_PATH) {
                None => {
                    hooks.insert(CONVERSION_PATH.to_owned(), conversion);
                }
                Some(existing) if Arc::ptr_eq(existing, &conversion) => {}
                Some(_) => {
                    return Err(WebhookError::PathInUse {
                        path: CONVERSION_PATH.into(),
                    });
                }
            }
        }
        let mut kinds = self.inner.conversion.kinds.write().unwrap_or_else(|e| e.into_inner());
        if kinds.contains_key(&kind) {
            return Err(WebhookError::Conversion {
                kind,
                reason: "registered already".into(),
            });
        }
        info!(%kind, path = CONVERSION_PATH, "conversion webhook registered");
        kinds.insert(kind, converter);
        Ok(())
    }

    /// Whether a conversion is registered (so [`CONVERSION_PATH`] is served).
    pub fn has_conversion(&self) -> bool {
        !self
            .inner
            .conversion
            .kinds
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    pub(crate) fn registrations(&self) -> Vec<AdmissionRegistration> {
        self.inner
            .registrations
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the certificate and takes the listener: the serving future, or why it cannot
    /// serve. The Manager calls this before its caches start (a conversion webhook may be
    /// needed to list them), and runs the future with its other HTTP servers.
    pub(crate) fn prepare(&self, shutdown: CancellationToken) -> Result<BoxFuture<'static, ()>, WebhookError> {
        let config = &self.inner.config;
        let watcher = CertWatcher::new(
            config.cert_dir.join(&config.cert_name),
            config.cert_dir.join(&config.key_name),
        )?;
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(watcher));
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = self
            .inner
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| WebhookError::Bind {
                addr: self.inner.addr,
                source: std::io::Error::other("the webhook server was started already"),
            })?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| WebhookError::Bind {
            addr: self.inner.addr,
            source,
        })?;
        let router = Router::new()
            .fallback(dispatch)
            .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
            .with_state(self.inner.clone());
        let serving = config.serving.clone();
        let tasks = self.inner.tasks.clone();
        let addr = self.inner.addr;
        Ok(Box::pin(async move {
            info!(%addr, "serving webhooks");
            http_serving::serve(listener, router, Some(Arc::new(tls)), serving, shutdown).await;
            // Every request has ended, so every handler task was joined or aborted: wait for
            // the aborted ones to unwind. One stuck in blocking code (never reaching an
            // `.await`) cannot be aborted; it is named and left after a bound.
            tasks.close();
            if tokio::time::timeout(HANDLER_UNWIND_BOUND, tasks.wait()).await.is_err() {
                tracing::warn!(
                    %addr,
                    handlers = tasks.len(),
                    bound = ?HANDLER_UNWIND_BOUND,
                    "webhook handlers aborted after their timeout are still running (blocked outside an .await)"
                );
            }
            info!(%addr, "webhook server stopped");
        }))
    }

    /// Serves until `shutdown` fires, then lets the requests in flight finish.
    ///
    /// # Errors
    /// [`WebhookError::Certificate`] if the certificate cannot be read at start,
    /// [`WebhookError::Bind`] if the server was started already.
    pub async fn start(&self, shutdown: CancellationToken) -> Result<(), WebhookError> {
        self.prepare(shutdown)?.await;
        Ok(())
    }
}

impl Runnable for WebhookServer {
    fn name(&self) -> &str {
        "webhook server"
    }

    /// Webhooks are served on every replica (controller-runtime's webhook server is not a
    /// `LeaderElectionRunnable`).
    fn needs_leader_election(&self) -> bool {
        false
    }

    fn start(self: Box<Self>, shutdown: CancellationToken) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move { WebhookServer::start(&self, shutdown).await.map_err(Into::into) })
    }
}

async fn dispatch(State(inner): State<Arc<Inner>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path();
    let hook = inner.hooks.read().unwrap_or_else(|e| e.into_inner()).get(path).cloned();
    let Some(hook) = hook else {
        return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    };
    let span = info_span!(
        "webhook",
        webhook = %path,
        uid = Empty,
        kind = Empty,
        operation = Empty,
        dry_run = Empty
    );
    let in_flight = inner.metrics.start(path);
    let request = HookRequest {
        content_type: headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body,
        span: span.clone(),
        tasks: inner.tasks.clone(),
        metrics: inner.metrics.clone(),
    };
    let response = hook.serve(request).instrument(span).await;
    in_flight.finish(response.status.as_u16());
    (
        response.status,
        [(header::CONTENT_TYPE, response.content_type)],
        response.body,
    )
        .into_response()
}
