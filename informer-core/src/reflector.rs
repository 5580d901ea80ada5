//! The reflector: keeps a [`Store`] in step with the server by ListAndWatch
//! (client-go `reflector.go`).
//!
//! It lists (paginated, [`ReflectorConfig::page_size`] per page) and `replace`s the store
//! with the result, then watches from the list's resourceVersion and turns every event into
//! `add`/`update`/`delete`. BOOKMARKs only move the resourceVersion on.
//!
//! The protocol is an explicit state machine ([`State`]) with one transition per step, in
//! the manner of kube-runtime's watcher:
//!
//! | from | outcome | to |
//! |---|---|---|
//! | `List` | listed | `Watch(list rv)` |
//! | `List` | continue token expired mid-list | the same list finished in one unpaginated request |
//! | `List` | 410 (the rv we listed at is too old) | `List` with rv `""` (a consistent read), after backoff |
//! | `List` | other error | `List`, after backoff |
//! | `Watch(rv)` | stream ended normally | `Watch(last rv)`, at once |
//! | `Watch(rv)` | HTTP 410 on the request, or an ERROR event with a 410 `Status` | `List` at the last rv (served from the watch cache), after backoff |
//! | `Watch(rv)` | other error, or a stream that closed within a second with no events | `Watch(last rv)`, after backoff |
//!
//! kube-runtime relists only on the in-stream form of 410 and retries an HTTP 410 forever;
//! both forms relist here. Every relist waits a backoff delay first, as client-go's
//! `BackoffUntil` loop does, so a server answering 410 again and again is not hammered. Other
//! errors re-watch from the last resourceVersion rather than relisting as client-go does: the
//! resourceVersion is still valid, and a relist of a large resource after every transient error
//! is what overloads servers during incidents. Lists at a specific resourceVersion are not
//! paginated (the server's watch cache serves them whole), as in client-go; an object without
//! a name, or a list or bookmark without a resourceVersion, is rejected rather than trusted.
//!
//! Backoff is client-go's (800 ms doubling to 30 s, jittered, reset after 2 minutes without
//! failure); the watch timeout is drawn from `[min_watch_timeout, 2 × min_watch_timeout)` (5–10
//! minutes by default) so that many clients do not re-watch in lockstep. A malformed object is
//! logged with its key, counted in [`ReflectorMetrics`], and skipped; the watch goes on.
//!
//! With [`ReflectorConfig::use_watch_list`] the initial list is streamed
//! (`sendInitialEvents=true`): initial ADDED events are collected until the BOOKMARK
//! annotated `k8s.io/initial-events-end`, then replace the store, and the same stream goes on
//! as the watch. If the server refuses or the stream fails first, that round falls back to
//! list+watch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use kube::api::{ListParams, WatchEvent, WatchParams};
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::{Backoff, BackoffConfig};
use crate::delta_fifo::DeltaType;
use crate::listwatch::{ListWatchError, ListerWatcher, MalformedObject, WatchStream};
use crate::store::{Store, StoreError, meta_namespace_key};

/// Transforms each object before it enters the store (client-go `TransformFunc`), e.g. to
/// drop `managedFields` and save memory.
pub type TransformFunc<K> = Arc<dyn Fn(K) -> K + Send + Sync>;

/// Called with every list/watch error (client-go `WatchErrorHandler`).
pub type WatchErrorHandler = Arc<dyn Fn(&ListWatchError) + Send + Sync>;

/// Asked on each resync tick whether to resync now (the informer's processor answers).
pub type ShouldResyncFunc = Arc<dyn Fn() -> bool + Send + Sync>;

/// The annotation on the BOOKMARK that ends a streamed initial list.
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// How a reflector lists and watches.
#[derive(Debug, Clone, PartialEq)]
pub struct ReflectorConfig {
    /// Names the reflector in logs (e.g. the resource).
    pub name: String,
    /// Objects per list page; 0 lists in one request.
    pub page_size: u32,
    /// Label selector for list and watch.
    pub label_selector: Option<String>,
    /// Field selector for list and watch.
    pub field_selector: Option<String>,
    /// How often to resync the store; zero disables resync.
    pub resync_period: Duration,
    /// The watch timeout is drawn from `[min_watch_timeout, 2 × min_watch_timeout)`.
    pub min_watch_timeout: Duration,
    /// Stream the initial list (`sendInitialEvents=true`) instead of listing.
    pub use_watch_list: bool,
    /// Retry backoff.
    pub backoff: BackoffConfig,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        ReflectorConfig {
            name: "reflector".to_string(),
            page_size: 500,
            label_selector: None,
            field_selector: None,
            resync_period: Duration::ZERO,
            min_watch_timeout: Duration::from_secs(300),
            use_watch_list: false,
            backoff: BackoffConfig::default(),
        }
    }
}

impl ReflectorConfig {
    /// Sets the name used in logs.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the list page size (0: no paging).
    #[must_use]
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size;
        self
    }

    /// Restricts list and watch to objects matching a label selector.
    #[must_use]
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Restricts list and watch to objects matching a field selector.
    #[must_use]
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    /// Sets the resync period (zero: never).
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = period;
        self
    }

    /// Streams the initial list instead of listing.
    #[must_use]
    pub fn use_watch_list(mut self, on: bool) -> Self {
        self.use_watch_list = on;
        self
    }

    /// Sets the minimum watch timeout.
    #[must_use]
    pub fn min_watch_timeout(mut self, timeout: Duration) -> Self {
        self.min_watch_timeout = timeout;
        self
    }

    /// Sets the retry backoff.
    #[must_use]
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = backoff;
        self
    }
}

/// Counters a reflector keeps, readable while it runs (for metrics and tests).
#[derive(Debug, Default)]
pub struct ReflectorMetrics {
    /// Completed lists (initial and relists).
    pub lists: AtomicU64,
    /// Relists forced by a 410 Gone/Expired.
    pub relists_after_gone: AtomicU64,
    /// Watch requests made.
    pub watches: AtomicU64,
    /// Watch events applied to the store.
    pub events: AtomicU64,
    /// List and watch errors (other than malformed objects).
    pub errors: AtomicU64,
    /// Objects skipped because they did not decode or had no name.
    pub malformed_objects: AtomicU64,
    /// Bookmarks received.
    pub bookmarks: AtomicU64,
}

impl ReflectorMetrics {
    fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The resourceVersion a reflector last synced to, shared with its owner.
#[derive(Debug, Clone, Default)]
pub struct LastSyncResourceVersion(Arc<RwLock<String>>);

impl LastSyncResourceVersion {
    /// The current value (`""` before the first list).
    pub fn get(&self) -> String {
        self.0.read().map(|rv| rv.clone()).unwrap_or_default()
    }

    fn set(&self, rv: &str) {
        if let Ok(mut guard) = self.0.write() {
            guard.clear();
            guard.push_str(rv);
        }
    }
}

/// Where the ListAndWatch protocol stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// A list is needed. `rv_unavailable`: the server forgot our resourceVersion (410), so
    /// the list must be a consistent read (`resourceVersion=""`).
    List {
        /// Whether the last resourceVersion is known to be expired.
        rv_unavailable: bool,
    },
    /// Watching from a resourceVersion.
    Watch {
        /// The resourceVersion to watch from.
        resource_version: String,
    },
}

/// The result of one step of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Transition {
    /// Go on with this state now.
    Now(State),
    /// Wait a backoff delay, then go on with this state.
    AfterBackoff(State),
    /// The store is closed: stop.
    Stop,
}

/// Keeps a store in step with one resource on the server.
pub struct Reflector<K> {
    config: ReflectorConfig,
    lister_watcher: Arc<dyn ListerWatcher<K>>,
    store: Arc<dyn Store<K>>,
    should_resync: Option<ShouldResyncFunc>,
    watch_error_handler: Option<WatchErrorHandler>,
    transform: Option<TransformFunc<K>>,
    last_sync_resource_version: LastSyncResourceVersion,
    metrics: Arc<ReflectorMetrics>,
}

impl<K> Reflector<K>
where
    K: Resource + Send + Sync + 'static,
{
    /// A reflector that feeds `store` from `lister_watcher`.
    pub fn new(lister_watcher: Arc<dyn ListerWatcher<K>>, store: Arc<dyn Store<K>>, config: ReflectorConfig) -> Self {
        Reflector {
            config,
            lister_watcher,
            store,
            should_resync: None,
            watch_error_handler: None,
            transform: None,
            last_sync_resource_version: LastSyncResourceVersion::default(),
            metrics: Arc::new(ReflectorMetrics::default()),
        }
    }

    /// Asks `f` on every resync tick whether to resync (default: always).
    #[must_use]
    pub fn with_should_resync(mut self, f: ShouldResyncFunc) -> Self {
        self.should_resync = Some(f);
        self
    }

    /// Calls `f` with every list/watch error.
    #[must_use]
    pub fn with_watch_error_handler(mut self, f: WatchErrorHandler) -> Self {
        self.watch_error_handler = Some(f);
        self
    }

    /// Transforms every object before it enters the store.
    #[must_use]
    pub fn with_transform(mut self, f: TransformFunc<K>) -> Self {
        self.transform = Some(f);
        self
    }

    /// Shares the last-synced resourceVersion with `handle` (used by the informer).
    #[must_use]
    pub fn with_last_sync_resource_version(mut self, handle: LastSyncResourceVersion) -> Self {
        self.last_sync_resource_version = handle;
        self
    }

    /// Shares counters with `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<ReflectorMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The resourceVersion last synced to (`""` before the first list).
    pub fn last_sync_resource_version(&self) -> String {
        self.last_sync_resource_version.get()
    }

    /// The reflector's counters.
    pub fn metrics(&self) -> &Arc<ReflectorMetrics> {
        &self.metrics
    }

    /// Runs ListAndWatch and the resync timer until `shutdown` is cancelled or the store closes.
    pub async fn run(&self, shutdown: CancellationToken) {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = self.list_and_watch() => {}
            _ = self.resync_loop() => {}
        }
        debug!(reflector = %self.config.name, "reflector stopped");
    }

    async fn list_and_watch(&self) {
        let mut backoff = Backoff::new(self.config.backoff.clone());
        let mut state = State::List { rv_unavailable: false };
        loop {
            let transition = match state {
                State::List { rv_unavailable } => self.step_list(rv_unavailable).await,
                State::Watch { resource_version } => self.step_watch(resource_version).await,
            };
            state = match transition {
                Transition::Now(next) => next,
                Transition::AfterBackoff(next) => {
                    let delay = backoff.next_delay();
                    debug!(reflector = %self.config.name, ?delay, "backing off");
                    tokio::time::sleep(delay).await;
                    next
                }
                Transition::Stop => return,
            };
        }
    }

    async fn resync_loop(&self) {
        let period = self.config.resync_period;
        if period.is_zero() {
            return futures::future::pending().await;
        }
        loop {
            tokio::time::sleep(period).await;
            if self.should_resync.as_ref().is_none_or(|f| f()) {
                debug!(reflector = %self.config.name, "forcing resync");
                if let Err(StoreError::Closed) = self.store.resync() {
                    return futures::future::pending().await;
                }
            }
        }
    }

    fn report(&self, error: &ListWatchError) {
        ReflectorMetrics::inc(&self.metrics.errors);
        if let Some(handler) = &self.watch_error_handler {
            handler(error);
        }
    }

    fn skip_malformed(&self, malformed: &MalformedObject) {
        ReflectorMetrics::inc(&self.metrics.malformed_objects);
        warn!(
            reflector = %self.config.name,
            key = malformed.key.as_deref().unwrap_or("<unknown>"),
            error = %malformed.error,
            "skipping malformed object",
        );
    }

    fn transformed(&self, obj: K) -> Arc<K> {
        match &self.transform {
            Some(transform) => Arc::new(transform(obj)),
            None => Arc::new(obj),
        }
    }

    /// Transforms `obj` and keeps it if it has a key; an object without a name (which the
    /// store could not hold) is logged, counted and skipped.
    fn push_keyed(&self, items: &mut Vec<Arc<K>>, obj: K) {
        let obj = self.transformed(obj);
        match meta_namespace_key(obj.as_ref()) {
            Ok(_) => items.push(obj),
            Err(e) => self.skip_malformed(&MalformedObject {
                key: None,
                error: e.to_string(),
            }),
        }
    }

    fn watch_params(&self) -> WatchParams {
        let min = self.config.min_watch_timeout.as_secs().max(1);
        let timeout = rand::rng().random_range(min..min * 2);
        let mut params = WatchParams::default().timeout(u32::try_from(timeout).unwrap_or(u32::MAX));
        params.label_selector = self.config.label_selector.clone();
        params.field_selector = self.config.field_selector.clone();
        params
    }

    async fn step_list(&self, rv_unavailable: bool) -> Transition {
        if self.config.use_watch_list {
            match self.watch_list().await {
                Ok(Some((stream, rv))) => return self.consume_watch(stream, rv, Instant::now()).await,
                Ok(None) => return Transition::Stop,
                Err(e) => {
                    self.report(&e);
                    warn!(reflector = %self.config.name, error = %e, "streaming list failed, falling back to list+watch");
                }
            }
        }
        match self.list(rv_unavailable).await {
            Ok(Some(rv)) => Transition::Now(State::Watch { resource_version: rv }),
            Ok(None) => Transition::Stop,
            Err(e) if e.is_gone() => {
                self.report(&e);
                ReflectorMetrics::inc(&self.metrics.relists_after_gone);
                info!(reflector = %self.config.name, error = %e, "list expired, relisting with a consistent read");
                Transition::AfterBackoff(State::List { rv_unavailable: true })
            }
            Err(e) => {
                self.report(&e);
                warn!(reflector = %self.config.name, error = %e, "list failed");
                Transition::AfterBackoff(State::List { rv_unavailable })
            }
        }
    }

    /// Lists every page and replaces the store. `Ok(None)`: the store is closed.
    async fn list(&self, rv_unavailable: bool) -> Result<Option<String>, ListWatchError> {
        // client-go's relistResourceVersion: "" after a 410 (consistent read), else the last
        // synced rv, or "0" (any, served from the watch cache) before the first list.
        let last = self.last_sync_resource_version.get();
        let resource_version = match (rv_unavailable, last.as_str()) {
            (true, _) => None,
            (false, "") => Some("0".to_string()),
            (false, rv) => Some(rv.to_string()),
        };
        // client-go pages only lists served from etcd ("") or "any" ("0"); a list at a specific
        // resourceVersion is served whole from the watch cache.
        let paged = self.config.page_size > 0 && matches!(resource_version.as_deref(), None | Some("0"));
        let mut items = Vec::new();
        let mut continue_token: Option<String> = None;
        let started = Instant::now();
        let list_rv = loop {
            let mut params = ListParams {
                label_selector: self.config.label_selector.clone(),
                field_selector: self.config.field_selector.clone(),
                limit: paged.then_some(self.config.page_size),
                continue_token: continue_token.clone(),
                ..ListParams::default()
            };
            if continue_token.is_none() {
                params.resource_version = resource_version.clone();
            }
            let page = match self.lister_watcher.list(&params).await {
                Ok(page) => page,
                Err(e) if e.is_gone() && continue_token.is_some() => {
                    // The continue token expired mid-list (client-go's pager FullListIfExpired):
                    // a list slower than compaction would never finish page by page, so list
                    // the rest at once: everything, unpaginated, at the original version.
                    info!(reflector = %self.config.name, listed = items.len(), "continue token expired, listing in one request");
                    items.clear();
                    params.limit = None;
                    params.continue_token = None;
                    params.resource_version = resource_version.clone();
                    self.lister_watcher.list(&params).await?
                }
                Err(e) => return Err(e),
            };
            for malformed in &page.malformed {
                self.skip_malformed(malformed);
            }
            items.reserve(page.items.len());
            for obj in page.items {
                self.push_keyed(&mut items, obj);
            }
            match page.continue_token {
                Some(token) if params.limit.is_some() => {
                    info!(reflector = %self.config.name, listed = items.len(), elapsed = ?started.elapsed(), "listing");
                    continue_token = Some(token);
                }
                _ => break page.resource_version,
            }
        };
        if list_rv.is_empty() {
            // Watching from "" would mean "current state": missed deletes would go unnoticed.
            return Err(ListWatchError::Decode("the list carries no resourceVersion".into()));
        }
        let count = items.len();
        match self.store.replace(items, &list_rv) {
            Ok(()) => {}
            Err(StoreError::Closed) => return Ok(None),
            Err(StoreError::Key(e)) => return Err(ListWatchError::Decode(format!("listed object without a key: {e}"))),
        }
        self.last_sync_resource_version.set(&list_rv);
        ReflectorMetrics::inc(&self.metrics.lists);
        info!(reflector = %self.config.name, objects = count, resource_version = %list_rv, elapsed = ?started.elapsed(), "listed");
        Ok(Some(list_rv))
    }

    /// Streams the initial list. `Ok(None)`: the store is closed.
    async fn watch_list(&self) -> Result<Option<(WatchStream<K>, String)>, ListWatchError> {
        let mut params = self.watch_params();
        params.bookmarks = true;
        params.send_initial_events = true;
        ReflectorMetrics::inc(&self.metrics.watches);
        let mut stream = self.lister_watcher.watch(&params, "").await?;
        let mut initial: HashMap<String, Arc<K>> = HashMap::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => {
                    let obj = self.transformed(obj);
                    match meta_namespace_key(obj.as_ref()) {
                        Ok(key) => {
                            initial.insert(key, obj);
                        }
                        Err(e) => self.skip_malformed(&MalformedObject {
                            key: None,
                            error: e.to_string(),
                        }),
                    }
                }
                Ok(WatchEvent::Deleted(obj)) => {
                    if let Ok(key) = meta_namespace_key(&obj) {
                        initial.remove(&key);
                    }
                }
                Ok(WatchEvent::Bookmark(bookmark)) => {
                    ReflectorMetrics::inc(&self.metrics.bookmarks);
                    let end = bookmark
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END_ANNOTATION)
                        .is_some_and(|v| v == "true");
                    if end {
                        let rv = bookmark.metadata.resource_version;
                        let count = initial.len();
                        match self.store.replace(initial.into_values().collect(), &rv) {
                            Ok(()) => {}
                            Err(StoreError::Closed) => return Ok(None),
                            Err(StoreError::Key(e)) => return Err(ListWatchError::Decode(e.to_string())),
                        }
                        self.last_sync_resource_version.set(&rv);
                        ReflectorMetrics::inc(&self.metrics.lists);
                        info!(reflector = %self.config.name, objects = count, resource_version = %rv, "streamed initial list");
                        return Ok(Some((stream, rv)));
                    }
                }
                Ok(WatchEvent::Error(status)) => {
                    return Err(ListWatchError::Api {
                        code: status.code,
                        reason: status.reason.clone(),
                        message: status.message.clone(),
                        retry_after_seconds: None,
                    });
                }
                Err(ListWatchError::Malformed(m)) => self.skip_malformed(&m),
                Err(e) => return Err(e),
            }
        }
        Err(ListWatchError::Decode(
            "the stream ended before the initial-events-end bookmark".into(),
        ))
    }

    async fn step_watch(&self, resource_version: String) -> Transition {
        let params = self.watch_params();
        ReflectorMetrics::inc(&self.metrics.watches);
        let started = Instant::now();
        match self.lister_watcher.watch(&params, &resource_version).await {
            Ok(stream) => self.consume_watch(stream, resource_version, started).await,
            Err(e) => self.after_watch_error(e, resource_version),
        }
    }

    fn after_watch_error(&self, error: ListWatchError, resource_version: String) -> Transition {
        self.report(&error);
        if error.is_gone() {
            ReflectorMetrics::inc(&self.metrics.relists_after_gone);
            // As client-go: relist at the last resourceVersion first (served from the server's
            // watch cache, not etcd); only if that list is expired too is it a consistent read.
            info!(reflector = %self.config.name, error = %error, "watch expired, relisting");
            Transition::AfterBackoff(State::List { rv_unavailable: false })
        } else {
            warn!(reflector = %self.config.name, error = %error, %resource_version, "watch failed");
            Transition::AfterBackoff(State::Watch { resource_version })
        }
    }

    /// Applies events until the stream ends or fails.
    async fn consume_watch(
        &self,
        mut stream: WatchStream<K>,
        mut resource_version: String,
        started: Instant,
    ) -> Transition {
        let mut events = 0u64;
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(event) => event,
                Err(ListWatchError::Malformed(m)) => {
                    self.skip_malformed(&m);
                    continue;
                }
                Err(e) => return self.after_watch_error(e, resource_version),
            };
            events += 1;
            let (obj, change) = match event {
                WatchEvent::Added(obj) => (obj, DeltaType::Added),
                WatchEvent::Modified(obj) => (obj, DeltaType::Updated),
                WatchEvent::Deleted(obj) => (obj, DeltaType::Deleted),
                WatchEvent::Bookmark(bookmark) => {
                    ReflectorMetrics::inc(&self.metrics.bookmarks);
                    // A bookmark without a resourceVersion carries nothing; watching from ""
                    // later would replay current state and hide missed deletes.
                    if !bookmark.metadata.resource_version.is_empty() {
                        resource_version = bookmark.metadata.resource_version;
                        self.last_sync_resource_version.set(&resource_version);
                    }
                    continue;
                }
                WatchEvent::Error(status) => {
                    let error = ListWatchError::Api {
                        code: status.code,
                        reason: status.reason.clone(),
                        message: status.message.clone(),
                        retry_after_seconds: None,
                    };
                    return self.after_watch_error(error, resource_version);
                }
            };
            let new_rv = obj.meta().resource_version.clone();
            let obj = self.transformed(obj);
            let applied = match change {
                DeltaType::Deleted => self.store.delete(obj),
                DeltaType::Updated => self.store.update(obj),
                _ => self.store.add(obj),
            };
            match applied {
                Ok(()) => {}
                Err(StoreError::Closed) => return Transition::Stop,
                Err(StoreError::Key(e)) => {
                    self.skip_malformed(&MalformedObject {
                        key: None,
                        error: e.to_string(),
                    });
                    continue;
                }
            }
            ReflectorMetrics::inc(&self.metrics.events);
            if let Some(rv) = new_rv.filter(|rv| !rv.is_empty()) {
                resource_version = rv;
                self.last_sync_resource_version.set(&resource_version);
            }
        }
        if events == 0 && started.elapsed() < Duration::from_secs(1) {
            // A watch that closes at once, over and over, would spin: treat it as a failure.
            warn!(reflector = %self.config.name, "watch closed within a second without events");
            return Transition::AfterBackoff(State::Watch { resource_version });
        }
        debug!(reflector = %self.config.name, events, "watch ended, re-watching");
        Transition::Now(State::Watch { resource_version })
    }
}
