//! Fault injection and the request log, for reliability tests.
//!
//! [`Faults`] is a cloneable handle (from [`Server::faults`](crate::Server::faults)); the same
//! operations are served on the loopback admin endpoint `POST /_envtest/faults/...`:
//!
//! | path | effect |
//! |---|---|
//! | `close-watches` | close every open watch now |
//! | `expire-watches?count=N` | answer the next N watch requests with HTTP 410 `Expired` |
//! | `malformed-watches?count=N` | start the next N watch streams with an object that does not decode |
//! | `fail?prefix=P&code=C&count=N&retryAfter=S` | answer the next N requests under path P with C (500/503/429) |
//! | `latency?ms=M` | delay every API request by M ms (0 clears; at most 60 s) |
//! | `compact` | drop the watch cache: older revisions expire |
//! | `restart` | drop all watchers and the cache; keep objects and the revision counter |
//!
//! [`Faults::snapshot`] and [`Faults::restore`] (Rust API only) go further: a restart on an
//! older backup of the store, with objects *and* the revision counter put back.
//!
//! Counts and delays are bounded ([`MAX_FAULT_COUNT`], [`MAX_LATENCY`],
//! [`MAX_RETRY_AFTER_SECS`]) and added with saturating arithmetic, so no value a client sends
//! can overflow or stall the server for good. With a token set, these routes require it.
//!
//! The request log records every API request (method, path, query, watch?, `Accept`, the
//! impersonated user) so tests can assert on what a client actually sent. It is bounded twice,
//! oldest entries dropped first: by entries (`Config::request_log_capacity`, default
//! 100,000) and by bytes (`Config::request_log_bytes`, default 64 MiB, counting each entry's
//! strings and fixed size), since 100,000 requests with 60 KB query strings would otherwise
//! hold ~6 GB. An entry larger than the whole byte budget is not recorded.

use crate::status::ApiError;
use crate::storage::{Snapshot, Storage};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest injected latency: a fault must not park the server for good.
pub const MAX_LATENCY: Duration = Duration::from_secs(60);

/// The most requests one fault can affect.
pub const MAX_FAULT_COUNT: usize = 1_000_000;

/// The longest `Retry-After` a failure fault sends.
pub const MAX_RETRY_AFTER_SECS: u32 = 3600;

/// One request as the server received it. Only the server makes these; fields may be added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordedRequest {
    /// HTTP method (`GET`, `POST`, ...).
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// The raw query string (`""` if none).
    pub query: String,
    /// Whether it was a watch (`watch=true`/`1`).
    pub is_watch: bool,
    /// The (first) `Accept` header (`""` if absent or not visible ASCII), e.g. a metadata-only
    /// client's `application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,...`.
    pub accept: String,
    /// Who the request acts as: its `Impersonate-User` header (`""` if absent or not visible
    /// ASCII). envtest authenticates one token and enforces no RBAC, so a test that runs a
    /// client as a ServiceAccount (kube's `AuthInfo::impersonate`) finds that client's requests
    /// by this field and checks them against the RBAC rules it expects.
    pub user: String,
}

impl RecordedRequest {
    /// What this entry costs the request log's byte budget: its strings and its fixed size.
    fn log_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.method.len()
            + self.path.len()
            + self.query.len()
            + self.accept.len()
            + self.user.len()
    }

    /// The decoded value of a query parameter.
    pub fn param(&self, name: &str) -> Option<String> {
        crate::request::parse_query(&self.query)
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

#[derive(Debug, Clone)]
struct PathFault {
    prefix: String,
    code: u16,
    remaining: usize,
    retry_after: u32,
}

#[derive(Debug, Default)]
struct State {
    expire_watches: usize,
    malformed_watches: usize,
    malformed_sent: u64,
    restores: u64,
    path_faults: Vec<PathFault>,
    latency: Duration,
    log: VecDeque<RecordedRequest>,
    /// The sum of [`RecordedRequest::log_bytes`] over `log`.
    log_bytes: usize,
}

/// Handle to inject faults into a running server and read its request log. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Faults {
    state: Arc<Mutex<State>>,
    storage: Arc<Storage>,
    log_capacity: usize,
    log_byte_budget: usize,
}

impl Faults {
    pub(crate) fn new(storage: Arc<Storage>, log_capacity: usize, log_byte_budget: usize) -> Self {
        Faults {
            state: Arc::default(),
            storage,
            log_capacity,
            log_byte_budget,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes every open watch now. Clients see their stream end and re-watch.
    pub fn close_watches(&self) {
        self.storage.lock().cache.close_all();
    }

    /// Answers the next `n` watch requests with HTTP 410 (`Status` reason `Expired`). Counts
    /// add up, saturating at [`MAX_FAULT_COUNT`].
    pub fn expire_next_watches(&self, n: usize) {
        let mut state = self.state();
        state.expire_watches = state.expire_watches.saturating_add(n).min(MAX_FAULT_COUNT);
    }

    /// Starts each of the next `n` watch streams with one event whose object does not decode as
    /// any Kubernetes type (its `metadata.labels` is a string), before the real events. A client
    /// must skip it and lose nothing: the event stands for no change on the server. Counts add
    /// up, saturating at [`MAX_FAULT_COUNT`].
    pub fn malform_next_watches(&self, n: usize) {
        let mut state = self.state();
        state.malformed_watches = state.malformed_watches.saturating_add(n).min(MAX_FAULT_COUNT);
    }

    /// Whether the watch being started gets a malformed first event (and counts it off).
    pub(crate) fn take_malformed_watch(&self) -> bool {
        let mut state = self.state();
        let take = state.malformed_watches > 0;
        if take {
            state.malformed_watches -= 1;
            state.malformed_sent = state.malformed_sent.saturating_add(1);
        }
        take
    }

    /// How many watch streams the malformed-watch fault has started with a malformed event.
    pub fn malformed_watches_sent(&self) -> u64 {
        self.state().malformed_sent
    }

    /// Answers the next `count` requests whose path starts with `prefix` with `code`
    /// (500, 503 or 429; 429 and 503 carry `Retry-After: retry_after_secs`).
    pub fn fail_next(&self, prefix: impl Into<String>, code: u16, count: usize, retry_after_secs: u32) {
        self.state().path_faults.push(PathFault {
            prefix: prefix.into(),
            code,
            remaining: count.min(MAX_FAULT_COUNT),
            retry_after: retry_after_secs.min(MAX_RETRY_AFTER_SECS),
        });
    }

    /// Delays every API request by `latency` (zero clears), at most [`MAX_LATENCY`].
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency.min(MAX_LATENCY);
    }

    /// Drops the watch cache: watches and continue tokens at older revisions get `410`.
    /// Open watches continue.
    pub fn compact(&self) {
        let mut inner = self.storage.lock();
        let rv = inner.current_rv();
        inner.cache.compact(rv);
    }

    /// Simulates an API server restart: closes all watches and drops the cache; objects and the
    /// revision counter are kept.
    pub fn restart(&self) {
        let mut inner = self.storage.lock();
        inner.cache.close_all();
        let rv = inner.current_rv();
        inner.cache.compact(rv);
    }

    /// The store's objects and revision now, for a later [`restore`](Self::restore).
    pub fn snapshot(&self) -> Snapshot {
        self.storage.lock().snapshot()
    }

    /// Simulates an API server restarted on an older backup of its store (an etcd restore
    /// without `--bump-revision`): every object and the revision counter go back to
    /// `snapshot`, so the resourceVersion *decreases*; every watch closes and the watch cache
    /// starts empty at the snapshot's revision. A client resuming from a newer resourceVersion
    /// gets "too large resource version" until the counter passes it again; once it has, the
    /// writes in between are invisible to a watch from that resourceVersion (no client can
    /// tell, which is why etcd restores bump the revision and mark it compacted). Leases go back
    /// too: another replica may acquire a lease its holder still leads by its own clock, as
    /// after a real restore. The served resources are not rolled back: a CRD established after
    /// the snapshot is still served.
    pub fn restore(&self, snapshot: &Snapshot) {
        // Counted first: whoever sees the restored state sees the new count.
        self.state().restores += 1;
        self.storage.lock().restore(snapshot);
    }

    /// How many times [`restore`](Self::restore) was called.
    pub fn restores(&self) -> u64 {
        self.state().restores
    }

    /// Clears all pending injected faults and latency.
    pub fn clear(&self) {
        let mut s = self.state();
        s.expire_watches = 0;
        s.malformed_watches = 0;
        s.path_faults.clear();
        s.latency = Duration::ZERO;
    }

    /// The recorded requests, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state().log.iter().cloned().collect()
    }

    /// Empties the request log.
    pub fn clear_requests(&self) {
        let mut s = self.state();
        s.log.clear();
        s.log_bytes = 0;
    }

    /// Records a request and decides whether a fault answers it. Returns the latency to apply
    /// and, if a fault fires, the error to answer with.
    pub(crate) fn on_request(&self, req: RecordedRequest) -> (Duration, Option<ApiError>) {
        let mut s = self.state();
        let latency = s.latency;
        let mut fault = None;
        if req.is_watch && s.expire_watches > 0 {
            s.expire_watches -= 1;
            fault = Some(ApiError::injected(410, 0));
        }
        if fault.is_none()
            && let Some(f) = s
                .path_faults
                .iter_mut()
                .find(|f| f.remaining > 0 && req.path.starts_with(&f.prefix))
        {
            f.remaining -= 1;
            fault = Some(ApiError::injected(f.code, f.retry_after));
        }
        s.path_faults.retain(|f| f.remaining > 0);
        let bytes = req.log_bytes();
        if self.log_capacity > 0 && bytes <= self.log_byte_budget {
            while s.log.len() >= self.log_capacity || s.log_bytes + bytes > self.log_byte_budget {
                let Some(oldest) = s.log.pop_front() else { break };
                s.log_bytes -= oldest.log_bytes();
            }
            s.log_bytes += bytes;
            s.log.push_back(req);
        }
        (latency, fault)
    }
}

/// The loopback admin endpoint: `POST /_envtest/faults/<op>?...`, `GET /_envtest/requests`.
pub(crate) fn admin(faults: &Faults, method: &http::Method, op: &str, query: &str) -> axum::response::Response {
    use crate::status::json_response;
    use http::StatusCode;
    use serde_json::json;
    let q = crate::request::Query::parse(query);
    let num = |name: &str, default: u64| -> Result<u64, ApiError> { Ok(q.uint(name)?.unwrap_or(default)) };
    let result: Result<(), ApiError> = (|| {
        match (method.as_str(), op) {
            ("GET", "requests") => {
                return Err(ApiError::internal("unreachable"));
            }
            ("POST", "faults/close-watches") => faults.close_watches(),
            ("POST", "faults/expire-watches") => {
                faults.expire_next_watches(usize::try_from(num("count", 1)?).unwrap_or(MAX_FAULT_COUNT))
            }
            ("POST", "faults/malformed-watches") => {
                faults.malform_next_watches(usize::try_from(num("count", 1)?).unwrap_or(MAX_FAULT_COUNT))
            }
            ("POST", "faults/fail") => {
                let code = num("code", 500)?;
                if !matches!(code, 429 | 500 | 503) {
                    return Err(ApiError::bad_request("code must be 429, 500 or 503"));
                }
                faults.fail_next(
                    q.get("prefix").unwrap_or("/"),
                    code as u16,
                    usize::try_from(num("count", 1)?).unwrap_or(MAX_FAULT_COUNT),
                    u32::try_from(num("retryAfter", 1)?).unwrap_or(MAX_RETRY_AFTER_SECS),
                );
            }
            ("POST", "faults/latency") => {
                faults.set_latency(Duration::from_millis(num("ms", 0)?));
            }
            ("POST", "faults/compact") => faults.compact(),
            ("POST", "faults/restart") => faults.restart(),
            ("POST", "faults/clear") => faults.clear(),
            _ => return Err(ApiError::no_route()),
        }
        Ok(())
    })();
    if method == http::Method::GET && op == "requests" {
        let log: Vec<_> = faults
            .requests()
            .into_iter()
            .map(|r| {
                json!({
                    "method": r.method,
                    "path": r.path,
                    "query": r.query,
                    "watch": r.is_watch,
                    "accept": r.accept,
                })
            })
            .collect();
        return json_response(StatusCode::OK, &json!(log));
    }
    match result {
        Ok(()) => json_response(StatusCode::OK, &json!({"ok": true})),
        Err(e) => axum::response::IntoResponse::into_response(e),
    }
}
