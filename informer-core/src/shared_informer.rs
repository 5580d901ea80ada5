//! The shared informer: one list/watch, one cache, many handlers (client-go
//! `shared_informer.go`).
//!
//! `run` wires the data path: [`Reflector`] → queue ([`RealFifo`] by default, or
//! [`DeltaFifo`], see [`QueueKind`]) → `process_batch` → the [`Indexer`] and the shared
//! processor → one listener per handler. Each popped batch is applied to the cache under one
//! write lock (readers see all of it or none; a relist is one item, so it is atomic too), and
//! its notifications are handed to the listeners in order in one go (non-blocking handlers are
//! then called right there, on the informer's task; see `listener.rs`). The batch's
//! notifications, which hold the objects it replaced, and the cached objects it deleted
//! (removed from the cache under the write lock, not freed there) then go to the partition's
//! lister-watcher to be freed ([`ListerWatcher::release`]: an `ApiListerWatcher` drops them on
//! its decoding thread, which allocated their contents, so one malloc arena serves them and no
//! other thread takes that arena's lock to free them). Handlers may be added
//! before or after `run`; one added after start is first replayed the whole cache as adds
//! (with `is_in_initial_list`), and its registration reports synced once those were handled.
//!
//! Resync periods follow client-go: each handler asks for a period (at least 1 s); the
//! informer checks for due resyncs every *resync check period*. A handler added before start
//! with a shorter period lowers the check period; one added after start gets at least the
//! check period. A check period of zero means no resync at all.
//!
//! Partitions: an informer made with [`SharedIndexInformer::partitioned`] runs one reflector,
//! queue and store per [`Partition`] (controller-runtime's multi-namespace cache: one
//! list/watch per namespace) and is one informer to everything above it: one set of handlers
//! hearing every partition's changes, one [`Indexer`] that is the merged view of the
//! partitions' stores (a key goes to its namespace's store; lists and index lookups merge),
//! synced once every partition synced. Each partition's relist replaces its own store only.
//! Batches of all partitions are applied under the informer's one `block_deltas` lock, so a
//! late handler's replay sees them all or none. An informer of one partition is the plain
//! informer: [`new`](SharedIndexInformer::new) makes one.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use kube::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cache_apply;
use crate::delta_fifo::{DeltaFifo, DeltaFifoOptions};
use crate::event_handler::ResourceEventHandler;
use crate::fifo::{PopError, ProcessError, Queue, QueueItem};
use crate::index::Indexers;
use crate::indexer::Indexer;
use crate::listener::{ListenerOptions, Notification, ProcessorListener};
use crate::listwatch::ListerWatcher;
use crate::processor::{SharedProcessor, determine_resync_period};
use crate::real_fifo::RealFifo;
use crate::reflector::{
    LastSyncResourceVersion, Reflector, ReflectorConfig, ReflectorMetrics, TransformFunc, WatchErrorHandler,
};
use crate::store::Store;
use crate::thread_safe_store::{IndexError, ThreadSafeStore};
use crate::undecodable::{type_name, warn_marked};

/// The shortest resync period a handler can ask for (client-go `minimumResyncPeriod`).
pub const MINIMUM_RESYNC_PERIOD: Duration = Duration::from_secs(1);

/// Errors from configuring an informer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InformerError {
    /// The informer has stopped; it takes no more handlers.
    #[error("the informer has stopped")]
    Stopped,
    /// This can only be changed before the informer starts.
    #[error("the informer has already started")]
    AlreadyStarted,
    /// An index could not be added.
    #[error(transparent)]
    Index(#[from] IndexError),
}

/// Which queue sits between an informer's reflector and its cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueueKind {
    /// [`RealFifo`]: every event in order, relists and resyncs applied atomically, batches
    /// processed without the queue's lock (client-go 1.36's default). The default.
    #[default]
    RealFifo,
    /// [`DeltaFifo`]: changes coalesced per key, one key per pop (client-go before 1.36).
    DeltaFifo,
}

/// How an informer is set up. Build it with `Default` and the setters.
#[derive(Clone)]
#[non_exhaustive]
pub struct InformerConfig<K> {
    /// The default handler resync period, and the initial resync check period (zero: none).
    pub resync_period: Duration,
    /// Index functions besides the built-in namespace index.
    pub indexers: Indexers<K>,
    /// How the reflector lists and watches (its `resync_period` is set by the informer).
    pub reflector: ReflectorConfig,
    /// The queue between reflector and cache.
    pub queue: QueueKind,
}

impl<K> Default for InformerConfig<K> {
    fn default() -> Self {
        InformerConfig {
            resync_period: Duration::ZERO,
            indexers: Indexers::new(),
            reflector: ReflectorConfig::default(),
            queue: QueueKind::default(),
        }
    }
}

impl<K> InformerConfig<K> {
    /// Sets the default resync period.
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = period;
        self
    }

    /// Adds an index function.
    #[must_use]
    pub fn indexer(mut self, name: impl Into<String>, f: impl Fn(&K) -> Vec<String> + Send + Sync + 'static) -> Self {
        self.indexers.insert(name.into(), Arc::new(f));
        self
    }

    /// Sets the reflector's configuration.
    #[must_use]
    pub fn reflector(mut self, reflector: ReflectorConfig) -> Self {
        self.reflector = reflector;
        self
    }

    /// Chooses the queue between reflector and cache (default [`QueueKind::RealFifo`]).
    #[must_use]
    pub fn queue(mut self, queue: QueueKind) -> Self {
        self.queue = queue;
        self
    }
}

/// How a handler is registered (client-go `HandlerOptions`). Build it with `Default` and the
/// setters.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct HandlerOptions {
    /// The resync period the handler wants (`None`: the informer's default); see
    /// [`SharedIndexInformer::add_event_handler_with_resync_period`] for the rules.
    pub resync_period: Option<Duration>,
    /// The handler promises never to block (it only filters and enqueues, say): it is called
    /// inline by the informer's task, right after each batch reached the cache, instead of on
    /// a thread of the runtime's blocking pool (see [`ResourceEventHandler::is_non_blocking`], which
    /// declares the same from the handler's side; either one suffices). A handler that blocks
    /// anyway stalls the informer and a runtime worker.
    pub non_blocking: bool,
    /// A name for the handler (the `handler` label of its metrics; default: the informer's
    /// name and a number).
    pub name: Option<String>,
    /// Bound the handler's buffer: past this many pending notifications they are coalesced by
    /// object key (an add and its updates become one add, updates one update, an update and a
    /// delete the delete), so a stalled handler holds about one notification per object
    /// instead of one per event. `None` (the default, as client-go): unbounded, every event kept.
    pub max_pending: Option<usize>,
}

impl HandlerOptions {
    /// Sets the handler's resync period.
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = Some(period);
        self
    }

    /// Names the handler (the `handler` label of its metrics).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Bounds the handler's buffer (see [`HandlerOptions::max_pending`](HandlerOptions#structfield.max_pending)).
    #[must_use]
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.max_pending = Some(max_pending);
        self
    }

    /// Declares the handler non-blocking (see [`HandlerOptions::non_blocking`](HandlerOptions#structfield.non_blocking)).
    #[must_use]
    pub fn non_blocking(mut self) -> Self {
        self.non_blocking = true;
        self
    }
}

struct Settings<K> {
    started: bool,
    stopped: bool,
    resync_check_period: Duration,
    default_handler_resync_period: Duration,
    transform: Option<TransformFunc<K>>,
    watch_error_handler: Option<WatchErrorHandler>,
}

/// One list/watch of an informer and the namespace its objects are in (see
/// [`SharedIndexInformer::partitioned`]).
#[non_exhaustive]
pub struct Partition<K> {
    /// The namespace every object it lists is in; `None`: any (all namespaces, or a
    /// cluster-scoped type).
    pub namespace: Option<String>,
    /// Where it lists and watches.
    pub lister_watcher: Arc<dyn ListerWatcher<K>>,
    /// How it lists and watches (its own selectors; its name is the reflector's, in logs).
    pub reflector: ReflectorConfig,
}

impl<K> Partition<K> {
    /// A partition holding the objects of `namespace` (`None`: of any), listed and watched
    /// through `lister_watcher` as `reflector` says.
    pub fn new(
        namespace: Option<String>,
        lister_watcher: Arc<dyn ListerWatcher<K>>,
        reflector: ReflectorConfig,
    ) -> Self {
        Partition {
            namespace,
            lister_watcher,
            reflector,
        }
    }
}

/// A partition as the informer runs it: its store is the part of the informer's indexer it
/// writes.
struct Part<K> {
    lister_watcher: Arc<dyn ListerWatcher<K>>,
    reflector_config: ReflectorConfig,
    store: Arc<ThreadSafeStore<K>>,
    indexer: Indexer<K>,
    /// Its reflector's: each partition relists and resumes at its own.
    last_sync_resource_version: LastSyncResourceVersion,
}

struct Inner<K> {
    /// Invariant: the partitions' namespaces are distinct, and `indexer` is the merged view of
    /// their stores (the one store itself for one partition).
    parts: Vec<Part<K>>,
    /// The informer's own: its name, and the reflector settings of a one-partition informer.
    reflector_config: ReflectorConfig,
    queue: QueueKind,
    indexer: Indexer<K>,
    processor: SharedProcessor<K>,
    settings: Mutex<Settings<K>>,
    /// Serializes `process_batch` with late handler registration, so a late handler's cache
    /// replay and the live notifications after it neither overlap nor leave a gap.
    block_deltas: Mutex<()>,
    /// The queues between each partition's reflector and `process_batch`, made by `run`.
    /// Held as the `Queue` trait: the informer does not care which FIFO it drives.
    fifos: OnceLock<Vec<Arc<dyn Queue<K>>>>,
    reflector_metrics: Arc<ReflectorMetrics>,
    next_listener_id: AtomicU64,
    handle_deltas_panics: AtomicU64,
}

/// Stops an informer's listeners and marks it stopped when `run`'s future goes away, however
/// that happens.
struct StopGuard<'a, K: Resource + Send + Sync + 'static>(&'a SharedIndexInformer<K>);

impl<K: Resource + Send + Sync + 'static> Drop for StopGuard<'_, K> {
    fn drop(&mut self) {
        self.0.inner.settings.lock().unwrap_or_else(|p| p.into_inner()).stopped = true;
        self.0.inner.processor.stop_listeners();
    }
}

/// A shared informer with an indexed cache (client-go `SharedIndexInformer`).
///
/// Cloning is cheap and yields a handle to the same informer.
pub struct SharedIndexInformer<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for SharedIndexInformer<K> {
    fn clone(&self) -> Self {
        SharedIndexInformer {
            inner: self.inner.clone(),
        }
    }
}

/// A snapshot of one handler's listener, for metrics (`kinformer_informer_listener_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerStats {
    /// The handler's name ([`HandlerOptions::name`](HandlerOptions#structfield.name)).
    pub handler: String,
    /// Notifications waiting for the handler.
    pub pending: usize,
    /// The bound on `pending`, if any.
    pub max_pending: Option<usize>,
    /// Notifications delivered so far.
    pub delivered: u64,
    /// Notifications lost because the handler panicked.
    pub handler_panics: u64,
    /// Notifications folded into others because the buffer passed its bound.
    pub coalesced: u64,
}

impl ListenerStats {
    fn of<K: Resource + Send + Sync + 'static>(listener: &ProcessorListener<K>) -> Self {
        ListenerStats {
            handler: listener.name().to_string(),
            pending: listener.pending(),
            max_pending: listener.max_pending(),
            delivered: listener.metrics.delivered.load(Ordering::Relaxed),
            handler_panics: listener.metrics.handler_panics.load(Ordering::Relaxed),
            coalesced: listener.metrics.coalesced.load(Ordering::Relaxed),
        }
    }
}

/// A snapshot of an informer's counters, for metrics: its reflector's and every handler's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InformerStats {
    /// The informer's name (the `informer` label).
    pub informer: String,
    /// Whether the initial list has been processed into the cache.
    pub synced: bool,
    /// Objects in the cache.
    pub cached_objects: usize,
    /// Completed lists (initial and relists).
    pub lists: u64,
    /// Relists forced by a 410 Gone/Expired.
    pub relists_after_gone: u64,
    /// Watch requests made.
    pub watches: u64,
    /// Watch events applied.
    pub events: u64,
    /// List and watch errors.
    pub errors: u64,
    /// Objects that did not decode or had no name, each time one arrived (see
    /// [`ReflectorMetrics::malformed_objects`]).
    pub malformed_objects: u64,
    /// Bookmarks received.
    pub bookmarks: u64,
    /// Keys the cache marks undecodable now (objects the server has that do not decode), by
    /// reason ([`Undecodable::reason`]); reasons with none are left out.
    pub undecodable_objects: std::collections::BTreeMap<&'static str, u64>,
    /// Every handler's listener.
    pub listeners: Vec<ListenerStats>,
}

/// The handle of an added handler (client-go `ResourceEventHandlerRegistration`).
pub struct ResourceEventHandlerRegistration<K> {
    listener: Arc<ProcessorListener<K>>,
    informer: SharedIndexInformer<K>,
}

impl<K: Resource + Send + Sync + 'static> ResourceEventHandlerRegistration<K> {
    /// True once the informer has synced and this handler has been handed every object of the
    /// initial list (or, for a handler added after start, of the cache replay).
    pub fn has_synced(&self) -> bool {
        self.informer.has_synced() && self.listener.initial_delivered()
    }

    /// Notifications queued for this handler and not yet delivered.
    pub fn pending(&self) -> usize {
        self.listener.pending()
    }

    /// Notifications delivered so far.
    pub fn delivered(&self) -> u64 {
        self.listener.metrics.delivered.load(Ordering::Relaxed)
    }

    /// Notifications lost because the handler panicked.
    pub fn handler_panics(&self) -> u64 {
        self.listener.metrics.handler_panics.load(Ordering::Relaxed)
    }

    /// Notifications folded into others because the buffer passed its bound.
    pub fn coalesced(&self) -> u64 {
        self.listener.metrics.coalesced.load(Ordering::Relaxed)
    }

    /// The handler's counters, as [`SharedIndexInformer::listener_stats`] reports them.
    pub fn stats(&self) -> ListenerStats {
        ListenerStats::of(&self.listener)
    }

    /// The resync period in effect for this handler (zero: none).
    pub fn resync_period(&self) -> Duration {
        self.listener.resync_period()
    }
}

impl<K> SharedIndexInformer<K>
where
    K: Resource + Send + Sync + 'static,
{
    /// An informer over `lister_watcher`.
    pub fn new(lister_watcher: impl ListerWatcher<K>, config: InformerConfig<K>) -> Self {
        Self::from_arc(Arc::new(lister_watcher), config)
    }

    /// An informer over a shared `lister_watcher`.
    pub fn from_arc(lister_watcher: Arc<dyn ListerWatcher<K>>, config: InformerConfig<K>) -> Self {
        let partition = Partition::new(None, lister_watcher, config.reflector.clone());
        Self::partitioned(vec![partition], config)
    }

    /// One informer over several list/watches, each holding the objects of its own namespace
    /// (see the module docs): handlers, the cache and `has_synced` span them all. The
    /// partitions' namespaces must differ (a later one naming an earlier one's namespace is
    /// dropped, with a warning). `config.reflector` names the informer; each partition lists
    /// and watches with its own reflector settings.
    pub fn partitioned(partitions: Vec<Partition<K>>, config: InformerConfig<K>) -> Self {
        let mut parts: Vec<(Option<String>, Part<K>)> = Vec::with_capacity(partitions.len());
        for partition in partitions {
            if parts.iter().any(|(namespace, _)| *namespace == partition.namespace) {
                warn!(informer = %config.reflector.name, namespace = ?partition.namespace,
                    "a second partition for one namespace ignored");
                continue;
            }
            let (indexer, store) = Indexer::with_store(config.indexers.clone());
            parts.push((
                partition.namespace,
                Part {
                    lister_watcher: partition.lister_watcher,
                    reflector_config: partition.reflector,
                    store,
                    indexer,
                    last_sync_resource_version: LastSyncResourceVersion::default(),
                },
            ));
        }
        let indexer = Indexer::merged(
            parts
                .iter()
                .map(|(namespace, p)| (namespace.clone(), p.indexer.clone())),
        );
        SharedIndexInformer {
            inner: Arc::new(Inner {
                parts: parts.into_iter().map(|(_, part)| part).collect(),
                reflector_config: config.reflector,
                queue: config.queue,
                indexer,
                processor: SharedProcessor::new(),
                settings: Mutex::new(Settings {
                    started: false,
                    stopped: false,
                    resync_check_period: config.resync_period,
                    default_handler_resync_period: config.resync_period,
                    transform: None,
                    watch_error_handler: None,
                }),
                block_deltas: Mutex::new(()),
                fifos: OnceLock::new(),
                reflector_metrics: Arc::new(ReflectorMetrics::default()),
                next_listener_id: AtomicU64::new(0),
                handle_deltas_panics: AtomicU64::new(0),
            }),
        }
    }

    // No code panics while holding these locks; take over a poisoned one.
    fn settings(&self) -> MutexGuard<'_, Settings<K>> {
        self.inner.settings.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn block_deltas(&self) -> MutexGuard<'_, ()> {
        self.inner.block_deltas.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a handler with the informer's default resync period.
    pub fn add_event_handler(
        &self,
        handler: impl ResourceEventHandler<K>,
    ) -> Result<ResourceEventHandlerRegistration<K>, InformerError> {
        self.add_event_handler_with_options(handler, HandlerOptions::default())
    }

    /// Adds a handler that also wants every object re-delivered every `resync_period`
    /// (zero: never), under client-go's rules (see the module docs).
    pub fn add_event_handler_with_resync_period(
        &self,
        handler: impl ResourceEventHandler<K>,
        resync_period: Duration,
    ) -> Result<ResourceEventHandlerRegistration<K>, InformerError> {
        self.add_event_handler_with_options(handler, HandlerOptions::default().resync_period(resync_period))
    }

    /// Adds a handler with `options` (client-go `AddEventHandlerWithOptions`).
    pub fn add_event_handler_with_options(
        &self,
        handler: impl ResourceEventHandler<K>,
        options: HandlerOptions,
    ) -> Result<ResourceEventHandlerRegistration<K>, InformerError> {
        let mut settings = self.settings();
        if settings.stopped {
            return Err(InformerError::Stopped);
        }
        let mut resync_period = options.resync_period.unwrap_or(settings.default_handler_resync_period);
        if !resync_period.is_zero() {
            if resync_period < MINIMUM_RESYNC_PERIOD {
                warn!(requested = ?resync_period, "resync period too small, using the minimum of 1s");
                resync_period = MINIMUM_RESYNC_PERIOD;
            }
            if resync_period < settings.resync_check_period {
                if settings.started {
                    warn!(requested = ?resync_period, check = ?settings.resync_check_period,
                        "informer already started: resync period raised to the resync check period");
                    resync_period = settings.resync_check_period;
                } else {
                    // Before start the check period can still come down to this handler's.
                    settings.resync_check_period = resync_period;
                    self.inner.processor.resync_check_period_changed(resync_period);
                }
            }
        }
        let id = self.inner.next_listener_id.fetch_add(1, Ordering::Relaxed);
        let effective = determine_resync_period(resync_period, settings.resync_check_period);
        let non_blocking = options.non_blocking || handler.is_non_blocking();
        let listener = ProcessorListener::new(
            Arc::new(handler),
            ListenerOptions {
                informer: self.inner.reflector_config.name.clone(),
                name: options
                    .name
                    .unwrap_or_else(|| format!("{}-{id}", self.inner.reflector_config.name)),
                requested_resync_period: resync_period,
                resync_period: effective,
                non_blocking,
                max_pending: options.max_pending,
            },
        );
        let registration = ResourceEventHandlerRegistration {
            listener: listener.clone(),
            informer: self.clone(),
        };
        if !settings.started {
            self.inner.processor.add_listener(listener);
            return Ok(registration);
        }
        // Started: replay the cache to the new handler with no delta processed in between.
        drop(settings);
        let _block = self.block_deltas();
        if !self.inner.processor.add_listener(listener.clone()) {
            return Err(InformerError::Stopped); // `run` stopped meanwhile
        }
        listener.add_all(self.inner.indexer.list().into_iter().map(|obj| Notification::Add {
            obj,
            is_in_initial_list: true,
        }));
        Ok(registration)
    }

    /// Removes a handler; it gets no further notifications (a notification it is handling
    /// completes). Idempotent, as client-go's `RemoveEventHandler`: removing a registration
    /// twice, or one of another informer, does nothing. Returns whether this call removed it.
    pub fn remove_event_handler(&self, registration: &ResourceEventHandlerRegistration<K>) -> bool {
        if !Arc::ptr_eq(&registration.informer.inner, &self.inner) {
            return false;
        }
        // Not while a batch is being distributed, as client-go holds blockDeltas here.
        let _block = self.block_deltas();
        self.inner.processor.remove_listener(&registration.listener)
    }

    /// Sets a transform applied to every object before it enters the queue, where the object
    /// is decoded (see [`TransformFunc`]). Before start only.
    pub fn set_transform(&self, transform: impl Fn(K) -> K + Send + Sync + 'static) -> Result<(), InformerError> {
        let mut settings = self.settings();
        if settings.started {
            return Err(InformerError::AlreadyStarted);
        }
        settings.transform = Some(Arc::new(transform));
        Ok(())
    }

    /// Sets a handler called with every list/watch error. Before start only.
    pub fn set_watch_error_handler(
        &self,
        handler: impl Fn(&crate::ListWatchError) + Send + Sync + 'static,
    ) -> Result<(), InformerError> {
        let mut settings = self.settings();
        if settings.started {
            return Err(InformerError::AlreadyStarted);
        }
        settings.watch_error_handler = Some(Arc::new(handler));
        Ok(())
    }

    /// Adds index functions; objects already cached are indexed at once.
    pub fn add_indexers(&self, indexers: Indexers<K>) -> Result<(), InformerError> {
        Ok(self.inner.indexer.add_indexers(indexers)?)
    }

    /// The informer's cache.
    pub fn indexer(&self) -> &Indexer<K> {
        &self.inner.indexer
    }

    /// The informer's cache (client-go `GetStore`; the same object as [`indexer`](Self::indexer)).
    pub fn store(&self) -> &Indexer<K> {
        &self.inner.indexer
    }

    /// True once the initial list has been fully processed into the cache (of every
    /// partition).
    pub fn has_synced(&self) -> bool {
        self.inner
            .fifos
            .get()
            .is_some_and(|fifos| fifos.iter().all(|fifo| fifo.has_synced()))
    }

    /// Waits until [`has_synced`](Self::has_synced), or returns false if `shutdown` fires first
    /// (client-go `WaitForCacheSync`, polling every 10 ms).
    pub async fn wait_for_cache_sync(&self, shutdown: &CancellationToken) -> bool {
        loop {
            if self.has_synced() {
                return true;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    }

    /// The resourceVersion the reflector last synced to (client-go `LastSyncResourceVersion`):
    /// it may be ahead of the cache while events are still queued. Of several partitions, the
    /// newest of theirs.
    pub fn last_sync_resource_version(&self) -> String {
        // Partitions' resourceVersions are the API server's, compared as numbers.
        self.inner
            .parts
            .iter()
            .map(|part| part.last_sync_resource_version.get())
            .max_by_key(|rv| (rv.parse::<u64>().unwrap_or(0), rv.clone()))
            .unwrap_or_default()
    }

    /// The resourceVersion the cache has caught up with: of the last change, relist or
    /// bookmark applied to it (client-go `LastStoreSyncResourceVersion`), so bookmarks
    /// advance it without an object change. Empty until the first, and always empty on the
    /// [`DeltaFifo`], which applies changes per key rather than in the server's order, as
    /// client-go returns "" without its AtomicFIFO.
    pub fn last_store_sync_resource_version(&self) -> String {
        match self.inner.queue {
            QueueKind::DeltaFifo => String::new(),
            _ => self.inner.indexer.last_store_sync_resource_version(),
        }
    }

    /// Whether `run` has been called.
    pub fn has_started(&self) -> bool {
        self.settings().started
    }

    /// Whether `run` has returned.
    pub fn is_stopped(&self) -> bool {
        self.settings().stopped
    }

    /// The informer's name (its reflector's; the `informer` label of its metrics).
    pub fn name(&self) -> &str {
        &self.inner.reflector_config.name
    }

    /// A snapshot of every registered handler's listener (pending notifications, deliveries,
    /// panics, coalesced notifications), for metrics.
    pub fn listener_stats(&self) -> Vec<ListenerStats> {
        self.inner
            .processor
            .listeners()
            .iter()
            .map(|l| ListenerStats::of(l))
            .collect()
    }

    /// A snapshot of the informer's counters (reflector and handlers), for metrics.
    pub fn stats(&self) -> InformerStats {
        let m = &self.inner.reflector_metrics;
        InformerStats {
            informer: self.name().to_string(),
            synced: self.has_synced(),
            cached_objects: self.inner.indexer.len(),
            lists: ReflectorMetrics::get(&m.lists),
            relists_after_gone: ReflectorMetrics::get(&m.relists_after_gone),
            watches: ReflectorMetrics::get(&m.watches),
            events: ReflectorMetrics::get(&m.events),
            errors: ReflectorMetrics::get(&m.errors),
            malformed_objects: ReflectorMetrics::get(&m.malformed_objects),
            bookmarks: ReflectorMetrics::get(&m.bookmarks),
            undecodable_objects: self.inner.indexer.undecodable().into_iter().fold(
                std::collections::BTreeMap::new(),
                |mut by_reason, (_, u)| {
                    *by_reason.entry(u.reason).or_insert(0) += 1;
                    by_reason
                },
            ),
            listeners: self.listener_stats(),
        }
    }

    /// The reflector's counters (lists, watches, errors, malformed objects, ...).
    pub fn reflector_metrics(&self) -> &Arc<ReflectorMetrics> {
        &self.inner.reflector_metrics
    }

    /// The resync check period in effect.
    pub fn resync_check_period(&self) -> Duration {
        self.settings().resync_check_period
    }

    /// Runs the informer until `shutdown` is cancelled. Returns after the reflectors stopped
    /// and every handler's listener finished its notification in progress. A second call
    /// returns at once.
    pub async fn run(&self, shutdown: CancellationToken) {
        let pipelines = {
            let mut settings = self.settings();
            if settings.started {
                warn!(informer = %self.inner.reflector_config.name, "informer already started; run ignored");
                return;
            }
            settings.started = true;
            let fifos: Vec<Arc<dyn Queue<K>>> = self
                .inner
                .parts
                .iter()
                .map(|part| -> Arc<dyn Queue<K>> {
                    match self.inner.queue {
                        QueueKind::RealFifo => Arc::new(RealFifo::new()),
                        QueueKind::DeltaFifo => Arc::new(DeltaFifo::new(DeltaFifoOptions {
                            known_objects: Some(Arc::new(part.indexer.clone())),
                            emit_delta_type_replaced: true,
                        })),
                    }
                })
                .collect();
            let _ = self.inner.fifos.set(fifos.clone());
            let mut pipelines = Vec::with_capacity(fifos.len());
            for (i, (part, fifo)) in self.inner.parts.iter().zip(&fifos).enumerate() {
                // The processor decides once per tick which handlers are due a resync: the
                // first partition asks it and resyncs every partition's queue when any is due.
                let should_resync: Arc<dyn Fn() -> bool + Send + Sync> = if i == 0 {
                    let (processor, others) = (self.clone(), fifos[1..].to_vec());
                    Arc::new(move || {
                        let due = processor.inner.processor.should_resync();
                        if due {
                            // A closed queue takes no resync; its partition is stopping.
                            others.iter().for_each(|fifo| drop(fifo.resync()));
                        }
                        due
                    })
                } else {
                    Arc::new(|| false)
                };
                let mut reflector = Reflector::new(
                    part.lister_watcher.clone(),
                    fifo.clone() as Arc<dyn Store<K>>,
                    part.reflector_config
                        .clone()
                        .resync_period(settings.resync_check_period),
                )
                .with_should_resync(should_resync)
                .with_last_sync_resource_version(part.last_sync_resource_version.clone())
                .with_metrics(self.inner.reflector_metrics.clone());
                if let Some(transform) = settings.transform.clone() {
                    reflector = reflector.with_transform(transform);
                }
                if let Some(handler) = settings.watch_error_handler.clone() {
                    reflector = reflector.with_watch_error_handler(handler);
                }
                pipelines.push((reflector, fifo.clone(), part.store.clone(), part.lister_watcher.clone()));
            }
            pipelines
        };
        info!(informer = %self.inner.reflector_config.name, queue = ?self.inner.queue,
            partitions = pipelines.len(), "starting informer");
        self.inner.processor.run(tokio::runtime::Handle::current());
        // If `run`'s future is dropped (its task aborted) the listeners must not deliver after
        // it: the guard stops them and marks the informer stopped.
        let _guard = StopGuard(self);

        let runs = pipelines.iter().map(|(reflector, fifo, store, lister_watcher)| {
            let shutdown = shutdown.clone();
            async move {
                let reflector_run = async {
                    reflector.run(shutdown.clone()).await;
                    fifo.close();
                };
                let process_loop = async {
                    let mut process = |batch: &[QueueItem<K>], is_in_initial_list: bool| {
                        let (notifications, removed) = self.process_batch(store, batch, is_in_initial_list);
                        if !notifications.is_empty() || !removed.is_empty() {
                            lister_watcher.release(Box::new((notifications, removed)));
                        }
                        Ok::<(), ProcessError>(())
                    };
                    loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            popped = fifo.pop(&mut process) => match popped {
                                Ok(_) => {}
                                Err(PopError::Closed) => return,
                            },
                        }
                    }
                };
                tokio::join!(reflector_run, process_loop);
            }
        });
        futures::future::join_all(runs).await;

        self.settings().stopped = true;
        self.inner.processor.stop().await;
        debug!(informer = %self.inner.reflector_config.name, "informer stopped");
    }

    /// Panics caught while applying deltas to the cache (from user index functions).
    pub fn handle_deltas_panics(&self) -> u64 {
        self.inner.handle_deltas_panics.load(Ordering::Relaxed)
    }

    /// Applies a batch popped from one partition's queue to that partition's store under one
    /// write lock, then hands its notifications to the listeners in order (client-go
    /// `processDeltas` / `processDeltasInBatch`) and, once the informer's locks are released,
    /// calls the non-blocking handlers inline (see `listener.rs`). Returns the batch's
    /// notifications, which hold the objects it replaced, and the cached objects it deleted
    /// (a delete's notification holds its final state, not the cached object): `run` hands
    /// both to the partition's lister-watcher to free ([`ListerWatcher::release`]), so none
    /// is freed here.
    ///
    /// A panic here can only come from user code in the cache's path (an index function): the
    /// item being applied is dropped (the cache stays as it was before it, since index values
    /// are computed before anything changes), logged and counted, and the rest of the batch
    /// goes on.
    fn process_batch(
        &self,
        store: &ThreadSafeStore<K>,
        batch: &[QueueItem<K>],
        is_in_initial_list: bool,
    ) -> (cache_apply::Outgoing<K>, Vec<Arc<K>>) {
        let block = self.block_deltas();
        let mut notifications = Vec::with_capacity(batch.len());
        let mut removed = Vec::new();
        let mut new_marks = Vec::new();
        {
            let mut cache = store.writer();
            for item in batch {
                let applied = catch_unwind(AssertUnwindSafe(|| {
                    cache_apply::apply_item(
                        &mut cache,
                        item,
                        is_in_initial_list,
                        &mut notifications,
                        &mut removed,
                        &mut new_marks,
                    )
                }));
                if applied.is_err() {
                    self.inner.handle_deltas_panics.fetch_add(1, Ordering::Relaxed);
                    let key = match item {
                        QueueItem::Deltas(d) => d.key.as_str(),
                        QueueItem::ReplacedAll(_) => "(relist)",
                        QueueItem::Undecodable(change) => change.key(),
                        _ => "",
                    };
                    error!(informer = %self.inner.reflector_config.name, key,
                        "panic while applying a change to the cache (an index function?); change dropped");
                }
            }
        }
        if !new_marks.is_empty() {
            let kind = type_name::<K>();
            for (key, undecodable) in &new_marks {
                warn_marked(&self.inner.reflector_config.name, &kind, key, undecodable);
            }
        }
        let inline = self.inner.processor.distribute(&notifications);
        // Non-blocking handlers are called here, on the thread that applied the batch, but
        // with the informer's locks released: one may register or remove a handler.
        drop(block);
        for drain in inline {
            drain.run();
        }
        (notifications, removed)
    }
}

#[cfg(test)]
mod model_tests {
    //! Property test: any sequence of reflector writes (add/update/delete/replace/resync, and
    //! objects that stop decoding), interleaved with pops through the real `process_batch`, on
    //! either queue, leaves the cache equal to the server's state (an undecodable object marked,
    //! with its last decoded version if it had one), every index consistent, and a handler's
    //! view (built only from the notifications it received) equal to the cache: no delete is
    //! lost, no object resurrected, no undecodable object taken for deleted.

    use std::collections::{BTreeMap, HashMap};

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use proptest::prelude::*;

    use super::*;
    use crate::delta::DeletedObject;
    use crate::event_handler::ResourceEventHandlerFuncs;
    use crate::fifo::ReplacedAll;
    use crate::listwatch::{ListPage, ListWatchError, WatchStream};

    /// The informer is driven by hand here; its lister-watcher is never called.
    struct Unused;

    impl ListerWatcher<ConfigMap> for Unused {
        fn list(
            &self,
            _: &kube::api::ListParams,
        ) -> futures::future::BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
            Box::pin(futures::future::pending())
        }

        fn watch(
            &self,
            _: &kube::api::WatchParams,
            _: &str,
        ) -> futures::future::BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
            Box::pin(futures::future::pending())
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// The server creates or modifies object `i` (watch ADDED/MODIFIED).
        Apply(u8, u8),
        /// The server deletes object `i` if it exists (watch DELETED).
        Delete(u8),
        /// The server creates or modifies object `i` into a version that does not decode.
        Break(u8),
        /// The server's state changes unseen, then a relist replaces the store (`None`: an
        /// object that does not decode).
        Relist(Vec<(u8, Option<u8>)>),
        Resync,
        /// The informer pops up to n items.
        Pop(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..8, 0u8..4).prop_map(|(i, v)| Op::Apply(i, v)),
            2 => (0u8..8).prop_map(Op::Delete),
            2 => (0u8..8).prop_map(Op::Break),
            1 => proptest::collection::vec((0u8..8, proptest::option::weighted(0.7, 0u8..4)), 0..6)
                .prop_map(Op::Relist),
            1 => Just(Op::Resync),
            3 => (1u8..5).prop_map(Op::Pop),
        ]
    }

    fn object(i: u8, value: u8, rv: u64) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("o{i}")),
                namespace: Some(format!("ns{}", i % 3)),
                resource_version: Some(rv.to_string()),
                labels: Some(BTreeMap::from([("v".to_string(), value.to_string())])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    fn key(i: u8) -> String {
        format!("ns{}/o{i}", i % 3)
    }

    fn label(cm: &ConfigMap) -> String {
        cm.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("v"))
            .cloned()
            .unwrap_or_default()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
        #[test]
        fn cache_and_handler_view_converge_to_the_server_state_on_the_real_fifo(ops in proptest::collection::vec(op(), 1..60)) {
            converge(ops, QueueKind::RealFifo);
        }

        #[test]
        fn cache_and_handler_view_converge_to_the_server_state_on_the_delta_fifo(ops in proptest::collection::vec(op(), 1..60)) {
            converge(ops, QueueKind::DeltaFifo);
        }
    }

    fn converge(ops: Vec<Op>, queue: QueueKind) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let informer: SharedIndexInformer<ConfigMap> = SharedIndexInformer::from_arc(
                Arc::new(Unused),
                InformerConfig::default().indexer("v", |cm: &ConfigMap| vec![label(cm)]),
            );
            let view: Arc<Mutex<HashMap<String, String>>> = Arc::default();
            let handler = {
                let (add_view, update_view, delete_view) = (view.clone(), view.clone(), view.clone());
                ResourceEventHandlerFuncs::new()
                    .on_add(move |o: &Arc<ConfigMap>, _| {
                        add_view.lock().unwrap().insert(meta_key(o), label(o));
                    })
                    .on_update(move |_, n: &Arc<ConfigMap>| {
                        update_view.lock().unwrap().insert(meta_key(n), label(n));
                    })
                    .on_delete(move |d: DeletedObject<ConfigMap>| {
                        let removed = delete_view.lock().unwrap().remove(&meta_key(d.object()));
                        assert!(removed.is_some(), "delete of an object the handler never had");
                    })
            };
            let registration = informer.add_event_handler(handler).unwrap();
            // A second handler with a bounded buffer that stalls until every op is applied, so
            // its notifications pile up and get coalesced: its view must converge too.
            let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let bounded_view: Arc<Mutex<HashMap<String, String>>> = Arc::default();
            let bounded = {
                let (add_view, update_view, delete_view) =
                    (bounded_view.clone(), bounded_view.clone(), bounded_view.clone());
                let (g1, g2, g3) = (go.clone(), go.clone(), go.clone());
                let wait = |go: &std::sync::atomic::AtomicBool| {
                    while !go.load(Ordering::SeqCst) {
                        std::thread::park_timeout(Duration::from_millis(1));
                    }
                };
                ResourceEventHandlerFuncs::new()
                    .on_add(move |o: &Arc<ConfigMap>, _| {
                        wait(&g1);
                        let previous = add_view.lock().unwrap().insert(meta_key(o), label(o));
                        assert!(previous.is_none(), "add of an object the handler already had");
                    })
                    .on_update(move |_, n: &Arc<ConfigMap>| {
                        wait(&g2);
                        let previous = update_view.lock().unwrap().insert(meta_key(n), label(n));
                        assert!(previous.is_some(), "update of an object the handler never had");
                    })
                    .on_delete(move |d: DeletedObject<ConfigMap>| {
                        wait(&g3);
                        let removed = delete_view.lock().unwrap().remove(&meta_key(d.object()));
                        assert!(removed.is_some(), "delete of an object the handler never had");
                    })
            };
            let bounded_registration = informer
                .add_event_handler_with_options(bounded, HandlerOptions::default().max_pending(3))
                .unwrap();
            // Release the stalled handler however this case ends: a failed assertion must fail
            // the case, not leave a blocking-pool thread waiting and the runtime's drop hung.
            struct Release(Arc<std::sync::atomic::AtomicBool>);
            impl Drop for Release {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let _release = Release(go.clone());
            informer.inner.processor.run(tokio::runtime::Handle::current());
            type Probe<T> = Box<dyn Fn() -> T>;
            type UnderTest = (Arc<dyn Queue<ConfigMap>>, Probe<bool>, Probe<Result<(), String>>);
            let (fifo, is_empty, check_fifo): UnderTest = match queue {
                QueueKind::RealFifo => {
                    let fifo = Arc::new(RealFifo::new().with_batch_size(3));
                    let (a, b) = (fifo.clone(), fifo.clone());
                    (
                        fifo,
                        Box::new(move || a.is_empty()),
                        Box::new(move || {
                            let _ = &b;
                            Ok(())
                        }),
                    )
                }
                QueueKind::DeltaFifo => {
                    let fifo = Arc::new(DeltaFifo::new(DeltaFifoOptions {
                        known_objects: Some(Arc::new(informer.indexer().clone())),
                        emit_delta_type_replaced: true,
                    }));
                    let (a, b) = (fifo.clone(), fifo.clone());
                    (
                        fifo,
                        Box::new(move || a.is_empty()),
                        Box::new(move || b.check_invariants()),
                    )
                }
            };
            let mut process = |batch: &[QueueItem<ConfigMap>], initial: bool| {
                informer.process_batch(&informer.inner.parts[0].store, batch, initial);
                Ok(())
            };

            // key → the value on the server, `None` when it does not decode.
            let mut server: HashMap<String, Option<String>> = HashMap::new();
            // key → the last decodable value written to the queue since the key was created.
            let mut last_decoded: HashMap<String, String> = HashMap::new();
            let undecodable = |rv: u64| crate::Undecodable::new(rv.to_string(), "invalid type: x");
            let mut rv = 0u64;
            for op in ops {
                match op {
                    Op::Apply(i, v) => {
                        rv += 1;
                        let existed = server.insert(key(i), Some(v.to_string())).is_some();
                        last_decoded.insert(key(i), v.to_string());
                        let obj = object(i, v, rv);
                        if existed {
                            fifo.update(obj).unwrap()
                        } else {
                            fifo.add(obj).unwrap()
                        }
                    }
                    Op::Delete(i) => {
                        if let Some(value) = server.remove(&key(i)) {
                            rv += 1;
                            last_decoded.remove(&key(i));
                            match value {
                                Some(_) => fifo.delete(object(i, 0, rv)).unwrap(),
                                None => fifo.delete_undecodable(key(i), &rv.to_string()).unwrap(),
                            }
                        }
                    }
                    Op::Break(i) => {
                        rv += 1;
                        server.insert(key(i), None);
                        fifo.mark_undecodable(key(i), undecodable(rv)).unwrap();
                    }
                    Op::Relist(list) => {
                        rv += 1;
                        server.clear();
                        let mut objects = BTreeMap::new();
                        let mut marks = BTreeMap::new();
                        for (i, v) in list {
                            server.insert(key(i), v.map(|v| v.to_string()));
                            match v {
                                Some(v) => {
                                    marks.remove(&key(i));
                                    objects.insert(key(i), object(i, v, rv));
                                }
                                None => {
                                    objects.remove(&key(i));
                                    marks.insert(key(i), undecodable(rv));
                                }
                            }
                        }
                        last_decoded.retain(|k, _| server.contains_key(k));
                        for (k, obj) in &objects {
                            last_decoded.insert(k.clone(), label(obj));
                        }
                        fifo.replace_with_undecodable(
                            objects.into_values().collect(),
                            marks.into_iter().collect(),
                            &rv.to_string(),
                        )
                        .unwrap();
                    }
                    Op::Resync => fifo.resync().unwrap(),
                    Op::Pop(n) => {
                        for _ in 0..n {
                            if is_empty() {
                                break;
                            }
                            fifo.pop(&mut process).await.unwrap().unwrap();
                        }
                    }
                }
                check_fifo().unwrap();
                informer.indexer().check_invariants().unwrap();
            }
            while !is_empty() {
                fifo.pop(&mut process).await.unwrap().unwrap();
            }

            let cache: HashMap<String, String> = informer
                .indexer()
                .list()
                .iter()
                .map(|o| (meta_key(o), label(o)))
                .collect();
            let expected: HashMap<String, String> = server
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.clone().or_else(|| last_decoded.get(k).cloned())?)))
                .collect();
            assert_eq!(
                cache, expected,
                "cache equals the server, undecodable objects as last decoded"
            );
            let mut marked: Vec<String> = informer.indexer().undecodable().into_iter().map(|(k, _)| k).collect();
            marked.sort();
            let mut expected_marks: Vec<String> = server
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| k.clone())
                .collect();
            expected_marks.sort();
            assert_eq!(marked, expected_marks, "exactly the undecodable objects are marked");
            informer.indexer().check_invariants().unwrap();
            if rv > 0 && queue == QueueKind::RealFifo {
                assert_eq!(
                    informer.last_store_sync_resource_version(),
                    rv.to_string(),
                    "the cache caught up with the last change"
                );
            }
            let limit = std::time::Instant::now() + Duration::from_secs(10);
            while registration.pending() > 0 || *view.lock().unwrap() != cache {
                assert!(
                    std::time::Instant::now() < limit,
                    "handler view {:?} != cache {cache:?}",
                    view.lock().unwrap()
                );
                std::thread::yield_now();
            }
            assert_eq!(
                registration.handler_panics(),
                0,
                "a handler assertion failed (see the log)"
            );
            go.store(true, Ordering::SeqCst);
            while bounded_registration.pending() > 0 || *bounded_view.lock().unwrap() != cache {
                assert!(
                    std::time::Instant::now() < limit,
                    "bounded view {:?} != cache {cache:?}",
                    bounded_view.lock().unwrap()
                );
                std::thread::yield_now();
            }
            assert_eq!(
                bounded_registration.handler_panics(),
                0,
                "a bounded handler assertion failed (see the log)"
            );
            let stats = bounded_registration.stats();
            assert!(stats.pending == 0 && stats.max_pending == Some(3));
            informer.inner.processor.stop().await;
        });
    }

    fn named(prefix: &str, i: usize, rv: u64) -> Arc<ConfigMap> {
        crate::testing::configmap(&format!("{prefix}{i}"), &rv.to_string())
    }

    fn replaced_all(prefix: &str, n: usize, rv: u64) -> QueueItem<ConfigMap> {
        QueueItem::ReplacedAll(ReplacedAll {
            resource_version: rv.to_string(),
            objects: (0..n)
                .map(|i| (format!("ns/{prefix}{i}"), named(prefix, i, rv)))
                .collect(),
            undecodable: Vec::new(),
        })
    }

    #[test]
    fn a_reader_never_sees_half_of_a_relist() {
        let informer: SharedIndexInformer<ConfigMap> =
            SharedIndexInformer::from_arc(Arc::new(Unused), InformerConfig::default());
        informer.process_batch(&informer.inner.parts[0].store, &[replaced_all("a", 2000, 1)], true);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let cache = informer.indexer().clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut snapshots = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let names: Vec<String> = cache.list().iter().map(|o| o.metadata.name.clone().unwrap()).collect();
                    let a = names.iter().filter(|n| n.starts_with('a')).count();
                    let b = names.len() - a;
                    assert!(
                        (a == 2000 && b == 0) || (a == 0 && b == 2000),
                        "a reader saw {a} old and {b} new objects"
                    );
                    snapshots += 1;
                }
                snapshots
            })
        };
        for round in 0..20u64 {
            let prefix = if round % 2 == 0 { "b" } else { "a" };
            informer.process_batch(
                &informer.inner.parts[0].store,
                &[replaced_all(prefix, 2000, round + 2)],
                false,
            );
        }
        stop.store(true, Ordering::Relaxed);
        let snapshots = reader.join().expect("no torn snapshot");
        assert!(snapshots > 0);
        assert_eq!(informer.last_store_sync_resource_version(), "21");
    }

    #[test]
    fn a_deleted_object_is_handed_back_to_be_freed_not_dropped_under_the_lock() {
        use crate::delta::{Delta, DeltaObject, DeltaType, Deltas};
        let informer: SharedIndexInformer<ConfigMap> =
            SharedIndexInformer::from_arc(Arc::new(Unused), InformerConfig::default());
        let store = &informer.inner.parts[0].store;
        let _ = informer.process_batch(store, &[replaced_all("a", 1, 1)], true);
        let cached = Arc::downgrade(&informer.indexer().list()[0]);
        let delete = QueueItem::Deltas(Deltas {
            key: "ns/a0".into(),
            deltas: vec![Delta {
                kind: DeltaType::Deleted,
                object: DeltaObject::Object(named("a", 0, 2)),
            }],
        });
        let (notifications, removed) = informer.process_batch(store, &[delete], false);
        assert!(informer.indexer().list().is_empty());
        assert_eq!(notifications.len(), 1, "the delete, holding the final state");
        let cached_now = cached.upgrade().expect("the removed object is still alive");
        assert!(matches!(removed.as_slice(), [r] if Arc::ptr_eq(r, &cached_now)));
        drop(cached_now);
        // What `run` hands to `ListerWatcher::release` held the last reference.
        drop((notifications, removed));
        assert!(cached.upgrade().is_none());
    }

    #[tokio::test]
    async fn a_relist_notifies_tombstones_first_then_listed_objects_in_list_order() {
        let informer: SharedIndexInformer<ConfigMap> =
            SharedIndexInformer::from_arc(Arc::new(Unused), InformerConfig::default());
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let handler = {
            let (a, u, d) = (seen.clone(), seen.clone(), seen.clone());
            ResourceEventHandlerFuncs::new()
                .on_add(move |o: &Arc<ConfigMap>, initial| {
                    a.lock().unwrap().push(format!("add {} {initial}", meta_key(o)));
                })
                .on_update(move |old: &Arc<ConfigMap>, new: &Arc<ConfigMap>| {
                    let (o, n) = (
                        old.metadata.resource_version.clone().unwrap(),
                        new.metadata.resource_version.clone().unwrap(),
                    );
                    u.lock().unwrap().push(format!("update {} {o}->{n}", meta_key(new)));
                })
                .on_delete(move |gone: DeletedObject<ConfigMap>| {
                    d.lock().unwrap().push(format!(
                        "delete {} tombstone={}",
                        meta_key(gone.object()),
                        gone.is_tombstone()
                    ));
                })
        };
        let registration = informer.add_event_handler(handler).unwrap();
        informer.inner.processor.run(tokio::runtime::Handle::current());
        informer.process_batch(&informer.inner.parts[0].store, &[replaced_all("a", 2, 1)], true);
        // a0 changes, a1 is gone, c0 is new; the watch missed all of it.
        let relist = QueueItem::ReplacedAll(ReplacedAll {
            resource_version: "5".into(),
            objects: vec![("ns/c0".into(), named("c", 0, 5)), ("ns/a0".into(), named("a", 0, 4))],
            undecodable: Vec::new(),
        });
        informer.process_batch(
            &informer.inner.parts[0].store,
            &[relist, QueueItem::Bookmark("6".into())],
            false,
        );
        while registration.pending() > 0 || seen.lock().unwrap().len() < 5 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "add ns/a0 true",
                "add ns/a1 true",
                "delete ns/a1 tombstone=true",
                "add ns/c0 false",
                "update ns/a0 1->4",
            ]
        );
        assert_eq!(
            informer.last_store_sync_resource_version(),
            "6",
            "the bookmark advanced it"
        );
        informer.inner.processor.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stalled_handlers_beyond_the_worker_count_delay_neither_others_nor_the_runtime() {
        let informer: SharedIndexInformer<ConfigMap> =
            SharedIndexInformer::from_arc(Arc::new(Unused), InformerConfig::default());
        let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Released however the test ends, so a failed assertion cannot leave pool threads
        // blocked and the runtime's drop waiting for them.
        struct Release(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Release {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let _release = Release(release.clone());
        let stalled_calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Four handlers that block (more than the runtime has workers) until released.
        for _ in 0..4 {
            let (release, calls) = (release.clone(), stalled_calls.clone());
            informer
                .add_event_handler(ResourceEventHandlerFuncs::new().on_add(move |_: &Arc<ConfigMap>, _| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    while !release.load(Ordering::SeqCst) {
                        std::thread::park_timeout(Duration::from_millis(1));
                    }
                }))
                .unwrap();
        }
        let fast_seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let fast = {
            let seen = fast_seen.clone();
            ResourceEventHandlerFuncs::new().on_add(move |_: &Arc<ConfigMap>, _| {
                seen.fetch_add(1, Ordering::SeqCst);
            })
        };
        let fast_reg = informer
            .add_event_handler_with_options(fast, HandlerOptions::default().non_blocking())
            .unwrap();
        informer.inner.processor.run(tokio::runtime::Handle::current());
        informer.process_batch(&informer.inner.parts[0].store, &[replaced_all("a", 100, 1)], true);
        // The fast handler and this task (on the async workers) keep going while four
        // blocking-pool threads sit in the stalled handlers.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        // (The initial-list count drops just after each call returns: wait for both.)
        while fast_seen.load(Ordering::SeqCst) < 100 || !fast_reg.listener.initial_delivered() {
            assert!(tokio::time::Instant::now() < deadline, "the fast handler was delayed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Each stalled handler is (or will be) inside its first call, and only that one.
        while stalled_calls.load(Ordering::SeqCst) < 4 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "a stalled handler never started"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(stalled_calls.load(Ordering::SeqCst), 4);
        release.store(true, Ordering::SeqCst);
        informer.inner.processor.stop().await;
    }

    fn meta_key(o: &ConfigMap) -> String {
        crate::meta_namespace_key(o).unwrap()
    }
}
