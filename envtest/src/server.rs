//! [`Server`]: binds 127.0.0.1, routes requests to the verbs, streams watches.
//!
//! One `axum` fallback handler decodes every request itself (paths are dynamic: CRDs add
//! resources at run time). Order of checks per request: bearer token (all routes but the health probes), admin endpoint, request log
//! and injected faults, then discovery or the resource verbs. Connections are served by the
//! `http-serving` crate ([`Config::serving`](crate::Config)): header-read, idle and handshake
//! timeouts, a connection cap, TCP_NODELAY.

use crate::config::Config;
use crate::error::Error;
use crate::faults::{Faults, RecordedRequest};
use crate::patch::PatchKind;
use crate::request::{self, Query, Representation, ResourcePath, Route};
use crate::resources::Registry;
use crate::rest::{self, Rest};
use crate::status::{self, ApiError};
use crate::storage::Storage;
use crate::watch_cache::{CacheWatcher, InitialEvents, WatchCache, WatchCacheConfig};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{Method, StatusCode, header};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Shared state of a running server.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) rest: Rest,
    pub(crate) faults: Faults,
    pub(crate) config: Config,
    /// Cancelled on shutdown; ends every watch and background task.
    pub(crate) cancel: CancellationToken,
}

/// A running envtest API server. Dropping it stops it (open watches end).
pub struct Server {
    addr: SocketAddr,
    base_url: String,
    /// The CA of a TLS server: PEM and DER.
    ca: Option<(String, Vec<u8>)>,
    app: Arc<App>,
    task: Option<JoinHandle<()>>,
    client: kube::Client,
}

impl Server {
    /// Starts a server: binds `config.listen` (loopback only), creates the namespaces `default`,
    /// `kube-system`, `kube-public` and `kube-node-lease`, and serves until shut down or dropped.
    pub async fn start(config: Config) -> Result<Server, Error> {
        if !config.listen.ip().is_loopback() {
            return Err(Error::NotLoopback(config.listen));
        }
        let cache = WatchCache::new(
            WatchCacheConfig {
                capacity: config.watch_cache_size,
                watcher_buffer: config.watcher_buffer,
                grace: config.slow_watcher_grace,
            },
            0,
        );
        let storage = Arc::new(Storage::new(cache));
        let registry = Registry::new();
        let rest = Rest {
            storage: storage.clone(),
            registry: registry.clone(),
            gc: Arc::new(tokio::sync::Notify::new()),
            admission: crate::admission::Admission::new(crate::webhook_client::WebhookClient::new(
                config.webhook_services.clone(),
            )),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            if let Some(info) = registry.get("", "v1", "namespaces") {
                let path = ResourcePath {
                    info,
                    namespace: None,
                    name: None,
                    subresource: None,
                };
                rest.create(
                    &path,
                    json!({"metadata": {"name": ns}}),
                    &rest::WriteOptions {
                        manager: "kube-apiserver".into(),
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| Error::Url(e.to_string()))?;
            }
        }
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let certificates = match (&config.cert_dir, config.tls) {
            (Some(dir), _) => Some(crate::tls::Certificates::load_or_create(dir, addr.ip())?),
            (None, true) => Some(crate::tls::Certificates::generate()?),
            (None, false) => None,
        };
        let scheme = if certificates.is_some() { "https" } else { "http" };
        let base_url = format!("{scheme}://{addr}");
        let cancel = CancellationToken::new();
        let faults = Faults::new(storage.clone(), config.request_log_capacity, config.request_log_bytes);
        let app = Arc::new(App {
            rest: rest.clone(),
            faults,
            config: config.clone(),
            cancel: cancel.clone(),
        });
        let router = Router::new().fallback(handle).with_state(app.clone());
        let ca = certificates.as_ref().map(|c| (c.ca_pem.clone(), c.ca_der.clone()));
        // Header-read, idle and handshake timeouts, the connection cap, TCP_NODELAY: see the
        // http-serving crate.
        let task = tokio::spawn(http_serving::serve(
            listener,
            router,
            certificates.map(|c| c.server_config),
            config.serving.clone(),
            cancel.clone(),
        ));
        tokio::spawn(crate::gc::run(storage.clone(), rest.gc.clone(), cancel.clone()));
        tokio::spawn(sweep_watchers(storage, config.slow_watcher_grace, cancel.clone()));
        let client = kube::Client::try_from(kube_config(
            &base_url,
            config.token.as_deref(),
            ca.as_ref().map(|(_, der)| der.as_slice()),
        )?)?;
        tracing::info!(%base_url, "envtest API server started");
        Ok(Server {
            addr,
            base_url,
            ca,
            app,
            task: Some(task),
            client,
        })
    }

    /// `http://127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with [`Config::tls`](crate::Config::tls).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// With [`Config::tls`](crate::Config::tls): the PEM of the CA that signed the serving
    /// certificate, which clients must trust (the kubeconfigs and `kube_config` carry it).
    pub fn ca_certificate_pem(&self) -> Option<&str> {
        self.ca.as_ref().map(|(pem, _)| pem.as_str())
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `kube::Config` for this server: its token, and with TLS its CA as the only root (kube's
    /// defaults otherwise, including its retry of 429/503/504 responses: set
    /// `default_retry = false` to see injected faults directly).
    pub fn kube_config(&self) -> kube::Config {
        kube_config(
            &self.base_url,
            self.app.config.token.as_deref(),
            self.ca.as_ref().map(|(_, der)| der.as_slice()),
        )
        .unwrap_or_else(|_| kube::Config::new(http::Uri::from_static("http://127.0.0.1")))
    }

    /// A `kube::Client` for this server, built on the calling task's runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_config()).unwrap_or_else(|_| self.client.clone())
    }

    /// The fault-injection and request-log handle.
    pub fn faults(&self) -> Faults {
        self.app.faults.clone()
    }

    /// The recorded requests, oldest first (same as `faults().requests()`).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.app.faults.requests()
    }

    /// The current objects at a collection path such as `/api/v1/namespaces/default/configmaps`
    /// or `/apis/apps/v1/deployments` (all namespaces), in list order.
    pub fn objects_of(&self, path: &str) -> Result<Vec<Value>, Error> {
        let Ok(Route::Resource(p)) = request::route(&self.app.rest.registry, path) else {
            return Err(Error::UnknownPath(path.to_owned()));
        };
        let inner = self.app.rest.storage.lock();
        Ok(inner
            .objects(&p.info.key())
            .map(|objs| {
                objs.iter()
                    .filter(|((ns, _), _)| p.namespace.as_ref().is_none_or(|n| n == ns))
                    .filter(|((_, name), _)| p.name.as_ref().is_none_or(|n| n == name))
                    .map(|(_, o)| (**o).clone())
                    // In the path's form: `events.k8s.io` Events are stored as core Events.
                    .map(|o| match crate::events::is_event(&p.info.group, &p.info.plural) {
                        true => crate::events::convert(o, &p.info.api_version()),
                        false => o,
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The revision of the last write (the global resourceVersion counter).
    pub fn current_resource_version(&self) -> u64 {
        self.app.rest.storage.lock().current_rv()
    }

    /// Events held in the watch cache ring (never more than `Config::watch_cache_size`).
    pub fn watch_cache_len(&self) -> usize {
        self.app.rest.storage.lock().cache.len()
    }

    /// The watch cache ring's capacity (`Config::watch_cache_size`).
    pub fn watch_cache_capacity(&self) -> usize {
        self.app.rest.storage.lock().cache.capacity()
    }

    /// The oldest revision a watch can start from; older ones get `410 Expired`.
    pub fn watch_cache_window_start(&self) -> u64 {
        self.app.rest.storage.lock().cache.window_start()
    }

    /// Number of open watches.
    pub fn watcher_count(&self) -> usize {
        self.app.rest.storage.lock().cache.watcher_count()
    }

    /// Writes a kubeconfig (JSON, which is valid YAML) pointing at this server.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        crate::kubeconfig::write(
            path.as_ref(),
            &self.base_url,
            self.app.config.token.as_deref(),
            self.ca_certificate_pem(),
        )
    }

    /// Stops the server: ends every watch and waits (up to 5 s) for connections to close.
    pub async fn shutdown(mut self) {
        self.app.cancel.cancel();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.app.cancel.cancel();
    }
}

fn kube_config(base_url: &str, token: Option<&str>, ca_der: Option<&[u8]>) -> Result<kube::Config, Error> {
    let uri: http::Uri = base_url
        .parse()
        .map_err(|e: http::uri::InvalidUri| Error::Url(e.to_string()))?;
    let mut config = kube::Config::new(uri);
    config.root_cert = ca_der.map(|der| vec![der.to_vec()]);
    if let Some(t) = token {
        let value = http::HeaderValue::from_str(&format!("Bearer {t}")).map_err(|e| Error::Url(e.to_string()))?;
        config.headers.push((header::AUTHORIZATION, value));
    }
    Ok(config)
}

/// Whether an `Authorization` header value is `Bearer <token>`, in time that does not depend on
/// where the two first differ (a timing side channel would let a client guess the token a byte
/// at a time). The loop runs over the expected value's length whatever was sent, every byte is
/// compared with `subtle`'s branch-free operations, and the lengths are compared the same way.
fn bearer_token_matches(given: Option<&[u8]>, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let given = given.unwrap_or_default();
    let expected = [b"Bearer ".as_slice(), token.as_bytes()];
    let expected = expected.iter().flat_map(|part| part.iter());
    let mut same = (given.len() as u64).ct_eq(&(("Bearer ".len() + token.len()) as u64));
    for (i, e) in expected.enumerate() {
        // Past the end of what was sent, compare with 0 (the lengths already differ).
        same &= given.get(i).copied().unwrap_or(0).ct_eq(e);
    }
    same.into()
}

/// Terminates watchers that stayed full past the grace period even when no writes arrive.
async fn sweep_watchers(storage: Arc<Storage>, grace: Duration, cancel: CancellationToken) {
    let every = (grace / 2).max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => storage.lock().cache.sweep(),
        }
    }
}

async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let q = Query::parse(&query);
    let is_watch = method == Method::GET && q.flag("watch");
    let health = matches!(path.as_str(), "/healthz" | "/readyz" | "/livez");
    // The token guards every route but the health probes, the admin routes included: they
    // read the request log and inject faults.
    if let Some(token) = &app.config.token
        && !health
    {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes);
        if !bearer_token_matches(given, token) {
            return ApiError::unauthorized().into_response();
        }
    }
    if let Some(op) = path.strip_prefix("/_envtest/") {
        return crate::faults::admin(&app.faults, &method, op, &query).into_response();
    }
    let (latency, fault) = app.faults.on_request(RecordedRequest {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        is_watch,
        accept: req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
        user: req
            .headers()
            .get("impersonate-user")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
    });
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some(f) = fault {
        return f.into_response();
    }
    match serve(&app, req, &method, &path, &q, is_watch).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn serve(
    app: &Arc<App>,
    req: Request,
    method: &Method,
    path: &str,
    q: &Query,
    is_watch: bool,
) -> Result<Response, ApiError> {
    let route = match request::route(&app.rest.registry, path) {
        Ok(r) => r,
        Err(e) => return Err(e),
    };
    let p = match route {
        Route::Resource(p) => p,
        Route::Other => return other(app, method, path),
    };
    let rest = &app.rest;
    let dry_run = q.get("dryRun").is_some_and(|v| !v.is_empty());
    let field_manager = q.get("fieldManager").filter(|m| !m.is_empty()).map(str::to_owned);
    let user_agent = req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok());
    let write = rest::WriteOptions {
        dry_run,
        field_validation: crate::typed::FieldValidation::from_query(q.get("fieldValidation"))?,
        manager: crate::field_manager::manager_of(field_manager.as_deref(), user_agent),
        field_manager,
        force: q.flag("force"),
        ..Default::default()
    };
    // A deprecated CRD version warns on every request to it, as kube-apiserver's CRD handler.
    if let Some(warning) = crate::crd::of_resource(&rest.storage.lock(), &p.info)
        .and_then(|crd| crate::crd::deprecation_warning(&crd, &p.info.version))
    {
        write.warnings.add(warning);
    }
    let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let list = *method == Method::GET && p.name.is_none() && !is_watch;
    let representation = if *method == Method::GET {
        request::negotiate(accept, list)?
    } else {
        Representation::Full
    };
    if *method == Method::GET
        && (is_watch || list)
        && q.get("continue").is_none_or(str::is_empty)
        && let Some(rv) = rest::parse_rv(q.get("resourceVersion"))?
    {
        wait_for_resource_version(app, rv).await?;
    }
    let ok =
        |(code, body): (u16, Value)| status::json_response(StatusCode::from_u16(code).unwrap_or(StatusCode::OK), &body);
    let out = match *method {
        Method::GET if is_watch => watch(app, &p, q, representation),
        Method::GET if p.subresource.as_deref() == Some("scale") => {
            Ok(status::json_response(StatusCode::OK, &rest.get_scale(&p).await?))
        }
        Method::GET if p.name.is_some() => {
            async {
                let obj = rest.get(&p).await?;
                Ok(match representation {
                    Representation::Full => status::json_response(StatusCode::OK, &obj),
                    Representation::Metadata => {
                        status::json_response(StatusCode::OK, &request::partial_object_metadata(&obj))
                    }
                    Representation::Table(v) => status::json_response(
                        StatusCode::OK,
                        &crate::table::render(&rest.storage, &p.info, &obj, false, q, v)?,
                    ),
                })
            }
            .await
        }
        Method::GET => {
            async {
                let list = rest.list(&p, q).await?;
                Ok(match representation {
                    Representation::Full => status::json_response(StatusCode::OK, &list),
                    Representation::Metadata => {
                        status::json_response(StatusCode::OK, &request::partial_object_metadata_list(&list))
                    }
                    Representation::Table(v) => status::json_response(
                        StatusCode::OK,
                        &crate::table::render(&rest.storage, &p.info, &list, true, q, v)?,
                    ),
                })
            }
            .await
        }
        Method::POST => {
            let (ct, body) = read_body(app, req).await?;
            let obj = decode_object(&ct, &body)?;
            rest.create(&p, obj, &write).await.map(ok)
        }
        Method::PUT => {
            let (ct, body) = read_body(app, req).await?;
            let obj = decode_object(&ct, &body)?;
            rest.update(&p, obj, &write).await.map(ok)
        }
        Method::PATCH => {
            let (ct, body) = read_body(app, req).await?;
            let kind = PatchKind::from_content_type(&ct).ok_or_else(|| ApiError::unsupported_media_type(&ct))?;
            rest.patch(&p, kind, &body, &write).await.map(ok)
        }
        Method::DELETE => {
            let (_, body) = read_body(app, req).await?;
            let options = if body.iter().all(u8::is_ascii_whitespace) {
                Value::Object(Default::default())
            } else {
                serde_json::from_slice(&body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
            };
            if p.name.is_some() {
                rest.delete(&p, &options, q, &write).await.map(ok)
            } else {
                rest.delete_collection(&p, &options, q, &write).await.map(ok)
            }
        }
        _ => Err(ApiError::method_not_allowed()),
    };
    // Warnings reach the client on success and on failure alike, as kube-apiserver's.
    let mut response = out.unwrap_or_else(IntoResponse::into_response);
    for text in write.warnings.take() {
        if let Some(value) = warning_header(&text) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    Ok(response)
}

/// `299 - "<text>"`: a warning as kube-apiserver writes it (RFC 7234 warn-code 299, no agent,
/// the text quoted with `"` and `\` escaped, control characters as spaces).
fn warning_header(text: &str) -> Option<http::HeaderValue> {
    let mut quoted = String::with_capacity(text.len() + 8);
    quoted.push_str("299 - \"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            c if c.is_control() => quoted.push(' '),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    http::HeaderValue::from_bytes(quoted.as_bytes()).ok()
}

/// Discovery, health, OpenAPI, or 404.
fn other(app: &Arc<App>, method: &Method, path: &str) -> Result<Response, ApiError> {
    if *method != Method::GET {
        return Err(ApiError::no_route());
    }
    if let Some(doc) = crate::openapi::handle(&app.rest.registry, &app.rest.storage, path) {
        return Ok(status::json_response(StatusCode::OK, &doc));
    }
    match crate::discovery::handle(&app.rest.registry, path) {
        Some(Value::String(s)) => {
            Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], s).into_response())
        }
        Some(doc) => Ok(status::json_response(StatusCode::OK, &doc)),
        None => Err(ApiError::no_route()),
    }
}

async fn read_body(app: &Arc<App>, req: Request) -> Result<(String, Bytes), ApiError> {
    let limit = app.config.max_body_bytes;
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    let body = axum::body::to_bytes(req.into_body(), limit)
        .await
        .map_err(|_| ApiError::too_large(limit))?;
    Ok((ct, body))
}

fn decode_object(ct: &str, body: &[u8]) -> Result<Value, ApiError> {
    let media = ct.split(';').next().unwrap_or("").trim();
    match media {
        "application/vnd.kubernetes.protobuf" => crate::protobuf::decode(body),
        "" | "application/json" | "*/*" | "application/yaml" | "text/plain" => {
            serde_json::from_slice(body).map_err(|e| {
                ApiError::bad_request(format!(
                    "the object provided is unrecognized or malformed: json parse error: {e}"
                ))
            })
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Starts a watch (see `watch_cache.rs` for the cacheWatcher's behaviour).
/// Waits up to [`Config::too_large_resource_version_wait`](crate::Config) for the server to
/// reach `rv`, as kube-apiserver's watch cache does before it answers a list or watch at a
/// revision it has not seen with "Too large resource version" (a client that talked to a newer
/// server, or wrote through another one, gets the state it asked for if it arrives in time).
async fn wait_for_resource_version(app: &Arc<App>, rv: u64) -> Result<(), ApiError> {
    let mut revisions = app.rest.storage.revisions();
    let reached = revisions.wait_for(|current| *current >= rv);
    match tokio::time::timeout(app.config.too_large_resource_version_wait, reached).await {
        Ok(Ok(_)) => Ok(()),
        // The wait ran out (or the store is gone): say how far the store got.
        _ => Err(ApiError::too_large_resource_version(
            rv,
            app.rest.storage.lock().current_rv(),
        )),
    }
}

fn watch(app: &Arc<App>, p: &ResourcePath, q: &Query, representation: Representation) -> Result<Response, ApiError> {
    if p.subresource.is_some() {
        return Err(ApiError::method_not_allowed());
    }
    let mut filter = rest::filter_from(p, q)?;
    if let Some(name) = &p.name {
        // GET .../{name}?watch=true watches one object, like fieldSelector=metadata.name={name}.
        let fields = format!("{},metadata.name={name}", q.get("fieldSelector").unwrap_or(""));
        filter.fields = crate::selectors::FieldSelector::parse_with(&fields, crate::events::selectable_fields(&p.info))
            .map_err(ApiError::bad_request)?;
    }
    let rv = rest::parse_rv(q.get("resourceVersion"))?;
    let timeout = q.uint("timeoutSeconds")?;
    let bookmarks = q.flag("allowWatchBookmarks");
    let send_initial = q.get("sendInitialEvents").filter(|s| !s.is_empty());
    if send_initial.is_some() && q.get("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(ApiError::invalid(
            "ListOptions",
            "",
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    let table = match representation {
        Representation::Table(version) => Some(crate::table::for_watch(&app.rest.storage, &p.info, q, version)?),
        _ => None,
    };
    let key = p.info.key();
    let mut inner = app.rest.storage.lock();
    let current = inner.current_rv();
    let objects_now = |inner: &crate::storage::Inner| -> Vec<Arc<Value>> {
        inner
            .objects(&key)
            .map(|o| o.values().cloned().collect())
            .unwrap_or_default()
    };
    let (initial, last_rv, initial_end) = match (send_initial, rv) {
        (Some("true"), _) => (InitialEvents::Objects(objects_now(&inner)), current, true),
        (Some(_), None | Some(0)) => (InitialEvents::Events(Vec::new()), current, false),
        (None, None | Some(0)) => (InitialEvents::Objects(objects_now(&inner)), current, false),
        // Never a silent watch from the future: the wait in `serve` has passed, so this is a
        // revision the server still has not reached.
        (_, Some(n)) if n > current => return Err(ApiError::too_large_resource_version(n, current)),
        (_, Some(n)) => match inner.cache.events_since(&key, n) {
            Some(events) => (InitialEvents::Events(events), n, false),
            None => {
                drop(inner);
                let status = ApiError::expired(format!(
                    "too old resource version: {n} ({})",
                    app.rest.storage.lock().cache.window_start()
                ))
                .to_status();
                let (tx, rx) = mpsc::channel(1);
                let _ = tx.try_send(crate::watch_cache::error_line(&status));
                return Ok(stream_response(rx));
            }
        },
    };
    let registration = inner.cache.register(&key, filter.namespace.clone());
    drop(inner);
    let (tx, rx) = mpsc::channel(64);
    if app.faults.take_malformed_watch() {
        // The channel is new and empty: this cannot fail for want of room.
        let _ = tx.try_send(crate::watch_cache::malformed_line(
            &p.info.api_version(),
            &p.info.kind,
            filter.namespace.as_deref().unwrap_or("default"),
            last_rv,
        ));
    }
    let watcher = CacheWatcher {
        storage: app.rest.storage.clone(),
        registration,
        filter,
        api_version: p.info.api_version(),
        kind: p.info.kind.clone(),
        metadata_only: representation == Representation::Metadata,
        convert: crate::conversion::for_resource(&app.rest.storage, &p.info, app.rest.admission.client())
            .map(|c| (c, p.info.version.clone())),
        table,
        last_rv,
        initial,
        initial_events_end: initial_end,
        bookmark_interval: bookmarks.then_some(app.config.bookmark_interval),
        // A timeout too far in the future to represent is no deadline at all (checked: a
        // client-chosen number must not overflow the clock).
        deadline: timeout
            .filter(|t| *t > 0)
            .and_then(|t| tokio::time::Instant::now().checked_add(Duration::from_secs(t))),
        server_cancel: app.cancel.clone(),
        output: tx,
    };
    tokio::spawn(watcher.run());
    Ok(stream_response(rx))
}

#[cfg(test)]
mod tests {
    use super::bearer_token_matches;

    #[test]
    fn bearer_tokens_match_only_exactly() {
        let token = "s3cret-token";
        assert!(bearer_token_matches(Some(b"Bearer s3cret-token"), token));
        for wrong in [
            &b""[..],
            b"Bearer ",
            b"Bearer s3cret-toke",
            b"Bearer s3cret-tokenX",
            b"Bearer S3cret-token",
            b"bearer s3cret-token",
            b"Basic s3cret-token",
            b"Bearer s3cret-token\0",
        ] {
            assert!(
                !bearer_token_matches(Some(wrong), token),
                "{:?}",
                String::from_utf8_lossy(wrong)
            );
        }
        assert!(!bearer_token_matches(None, token));
        // A prefix of the token padded with NULs to its length is still wrong.
        assert!(!bearer_token_matches(Some(b"Bearer s3cret\0\0\0\0\0\0\0"), token));
    }
}
