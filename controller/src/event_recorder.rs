//! [`EventRecorder`]: Kubernetes Events about objects, aggregated as client-go's `tools/events`.
//!
//! Where it sits: reconcilers record events through their [`Context`](crate::Context)
//! (`ctx.recorder().publish(&foo, EventType::Normal, "Synced", "Reconcile", "Foo synced")`).
//! Publishing never blocks: it puts the event on a bounded queue (1000, client-go's broadcaster
//! queue) and, when that is full, drops it (logged and counted). The sink task,
//! [`EventRecorder::run`], is run by the [`Controller`](crate::Controller) that made the
//! recorder (each controller reports under its own name, as client-go components do), or by
//! whoever passed a recorder to the builder; it aggregates repeats and writes
//! `events.k8s.io/v1` Events.
//!
//! ```text
//! reconcile ─publish─▶ bounded queue ─▶ run: EventCache ─create / merge patch─▶ API server
//!             (full: drop + count)       ▲ refresh period, flush, finish (6 min idle), shutdown
//! ```
//!
//! Aggregation (client-go `tools/events`, `eventBroadcasterImpl.recordToSink`): the first
//! occurrence of an event creates it, named `<regarding name>.<hex unix nanos>` in the regarding
//! object's namespace (`default` for cluster-scoped objects). An *isomorphic* repeat (same
//! regarding and related object, type, reason, action and note; the reporting controller and
//! instance are the recorder's) turns the cached event into a series: `series {count: 2,
//! lastObservedTime}` is written at once with a merge patch. Further repeats only bump the count
//! in memory; the count is written by the periodic refresh, by [`EventRecorder::flush`], when the
//! series finishes (no repeat for 6 minutes: final count written, event evicted from the cache)
//! and on shutdown. So a hot loop of 1000 identical events costs a create and two or three
//! patches. A patch answered `404` (the Event expired, its TTL is an hour) creates it again.
//!
//! If the server does not serve `events.k8s.io/v1` (a `404` on create whose `Status` does not
//! name a missing namespace), the recorder falls back to core/v1 `Event`s for the rest of its
//! life (client-go `tools/record`: `involvedObject`, `source`, `count`, `firstTimestamp`,
//! `lastTimestamp`; a repeat patches `count` and `lastTimestamp`).
//!
//! Where it differs from client-go, and why:
//! - The isomorphism key includes the note: client-go's `eventKey` omits it, so a second
//!   message about the same object and reason is folded into the first event's series and never
//!   shown. It leaves out the object's `resourceVersion` (as `tools/record`'s correlator does), so
//!   a reconciler that updates the object on every pass still aggregates.
//! - The refresh period defaults to 30 s, not 30 minutes, and only series whose count changed
//!   are written. client-go's refresh only keeps series from expiring; with 30 minutes a hot loop
//!   shows `count: 2` for half an hour. 30 s costs at most one patch per *active* series per
//!   period; an idle series is not rewritten (it finishes within 6 minutes anyway).
//! - One task writes, one request at a time (a server slower than the event rate fills the
//!   queue and `publish` drops, as client-go's full broadcaster does); a failed write is retried
//!   on a schedule (12 tries, 10 s ± 25%) without holding up other events, where client-go
//!   sleeps in a goroutine per event. Transport errors, timeouts, `429` and `5xx` are retried; client-go gives
//!   up on any `Status` error, losing events to a briefly overloaded server. Other rejections
//!   (`403`, `422`, ...) are logged and counted as failed.
//! - The fallback is decided by the first create, not by discovery when the recorder is built
//!   (`NewEventBroadcasterAdapter`), so building a recorder costs no request. In the fallback the
//!   same series policy applies instead of `tools/record`'s `EventCorrelator` (no spam filter, no
//!   "combined from similar events" messages: events with distinct notes stay distinct).
//! - [`EventRecorder::flush`] has no client-go equivalent, and shutdown writes pending series
//!   counts (client-go drops them).
//! - Notes longer than the API allows (1024 bytes) end in ` ...` instead of being rejected;
//!   reason and action are cut to 128 bytes. Event names are unique per recorder (the nanosecond
//!   suffix is bumped if the clock repeats), so `AlreadyExists` on create can only mean an earlier
//!   attempt of ours landed and is treated as success.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use controller::event_recorder::{EventRecorder, EventType, Reporter};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use tokio_util::sync::CancellationToken;
//!
//! let env = envtest::Server::start(envtest::Config::default()).await?;
//! let reporter = Reporter::new("example.dev/foo-controller", "foo-controller-0");
//! let recorder = EventRecorder::new(env.client(), reporter);
//! let shutdown = CancellationToken::new();
//! let sink = tokio::spawn({
//!     let (recorder, shutdown) = (recorder.clone(), shutdown.clone());
//!     async move { recorder.run(shutdown).await }
//! });
//!
//! let mut foo = ConfigMap::default();
//! foo.metadata.name = Some("foo".into());
//! foo.metadata.namespace = Some("default".into());
//! for _ in 0..100 {
//!     recorder.publish(&foo, EventType::Normal, "Synced", "Reconcile", "Foo synced");
//! }
//! recorder.flush().await; // one Event, series.count 100, three writes
//! assert_eq!(recorder.stats().written, 3);
//! shutdown.cancel();
//! sink.await?;
//! env.shutdown().await;
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::leadership::{Leadership, NotLeader};

/// Longest `reason` and `action` the API accepts (bytes).
const REASON_LIMIT: usize = 128;
/// Longest `note` the API accepts (bytes).
const NOTE_LIMIT: usize = 1024;
/// Shortest timer period: `tokio::time::interval` panics on zero.
const MIN_PERIOD: Duration = Duration::from_millis(1);
/// Longest timer period or retry delay: `Instant + Duration` panics on overflow, so larger
/// settings (`Duration::MAX` to switch the refresh off) are cut to a year.
const MAX_PERIOD: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The `type` of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something expected happened (`Normal`).
    Normal,
    /// Something may need attention (`Warning`).
    Warning,
}

impl EventType {
    /// The API's spelling: `Normal` or `Warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who reports: controller name (`reportingController`) and instance (`reportingInstance`, e.g.
/// pod/host name).
///
/// `events.k8s.io/v1` requires both: the controller a qualified name such as
/// `example.dev/foo-controller`, the instance at most 128 bytes. In the core/v1 fallback they
/// become `source.component` and `source.host`.
#[derive(Clone, Debug)]
pub struct Reporter {
    /// `reportingController`, e.g. `example.dev/foo-controller`.
    pub controller: String,
    /// `reportingInstance`, e.g. the pod or host name.
    pub instance: String,
}

impl Reporter {
    /// A reporter from its controller and instance names.
    pub fn new(controller: impl Into<String>, instance: impl Into<String>) -> Self {
        Reporter {
            controller: controller.into(),
            instance: instance.into(),
        }
    }
}

/// Settings of an [`EventRecorder`]: `EventRecorderConfig::default()` plus setters.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EventRecorderConfig {
    /// Events queued between `publish` and the sink; when full, `publish` drops. Default 1000
    /// (client-go's `maxQueuedEvents`).
    pub queue_capacity: usize,
    /// How often changed series counts are written. Default 30 s (client-go: 30 minutes; see the
    /// [module docs](self) for why).
    pub refresh_period: Duration,
    /// A series without a repeat for this long is finished: its final count is written and it
    /// leaves the cache, as does a single event this old. Also the period of that check.
    /// Default 6 minutes (client-go's `finishTime`).
    pub finish_time: Duration,
    /// Attempts per write before it is given up (counted as failed). Default 12 (client-go's
    /// `maxTriesPerEvent`).
    pub max_tries: u32,
    /// Delay before a failed write is retried, ± 25% jitter. Default 10 s (client-go's).
    /// This and the periods above are cut to one year; `Duration::MAX` switches the refresh off.
    pub retry_delay: Duration,
    /// Time limit of one API request. Default 10 s.
    pub request_timeout: Duration,
}

impl Default for EventRecorderConfig {
    fn default() -> Self {
        EventRecorderConfig {
            queue_capacity: 1000,
            refresh_period: Duration::from_secs(30),
            finish_time: Duration::from_secs(6 * 60),
            max_tries: 12,
            retry_delay: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
        }
    }
}

impl EventRecorderConfig {
    /// Sets the queue capacity (at least 1).
    #[must_use]
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.queue_capacity = n;
        self
    }

    /// Sets the refresh period of series counts.
    #[must_use]
    pub fn refresh_period(mut self, period: Duration) -> Self {
        self.refresh_period = period;
        self
    }

    /// Sets how long a series may stay idle before it finishes.
    #[must_use]
    pub fn finish_time(mut self, d: Duration) -> Self {
        self.finish_time = d;
        self
    }

    /// Sets the attempts per write (at least 1).
    #[must_use]
    pub fn max_tries(mut self, n: u32) -> Self {
        self.max_tries = n;
        self
    }

    /// Sets the delay before a failed write is retried.
    #[must_use]
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.retry_delay = d;
        self
    }

    /// Sets the time limit of one API request.
    #[must_use]
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }
}

/// Counters of an [`EventRecorder`], read with [`EventRecorder::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventRecorderStats {
    /// Successful writes: creates and patches.
    pub written: u64,
    /// Events dropped by `publish` because the queue was full.
    pub dropped: u64,
    /// Writes given up: rejected by the server, or still failing after `max_tries` attempts
    /// (plus events about an object without a name, which cannot be named).
    pub failed: u64,
    /// Events held in the aggregation cache now (a gauge).
    pub cached: u64,
    /// Events and writes refused because the recorder's [`Leadership`] had ended (a deposed
    /// leader's: see [`EventRecorder::set_leadership`]).
    pub refused: u64,
}

/// Records Kubernetes Events about objects, aggregating repeats as client-go does. A cheap handle:
/// clones share the queue, the cache and the counters. See the [module docs](self).
#[derive(Clone)]
pub struct EventRecorder {
    inner: Arc<Inner>,
}

impl fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventRecorder")
            .field("reporter", &self.inner.reporter)
            .field("core_v1_fallback", &self.inner.core_v1.load(Ordering::Relaxed))
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

struct Inner {
    client: kube::Client,
    reporter: Reporter,
    config: EventRecorderConfig,
    queue: mpsc::Sender<Message>,
    /// The queue's receiving end and the aggregation cache. A running `run` takes them out (so
    /// there is one sink at a time) and puts them back when it returns or is dropped, so a
    /// restarted `run` continues the same series.
    sink_state: Mutex<Option<SinkState>>,
    /// The nanosecond suffix of the last event name handed out; names never repeat.
    last_name_nanos: AtomicI64,
    /// Set once `events.k8s.io/v1` turned out not to be served; never cleared.
    core_v1: AtomicBool,
    /// Set while `publish` is dropping, so a full queue logs one warning, not one per event.
    overflowing: AtomicBool,
    /// Every publish and every write is refused once this ended (`None`: never refused).
    leadership: Mutex<Option<Leadership>>,
    written: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    cached: AtomicU64,
    refused: AtomicU64,
}

enum Message {
    Event(Box<Occurrence>),
    /// Write everything pending, then answer.
    Flush(oneshot::Sender<()>),
}

/// One published event, as it travels from `publish` to the sink.
struct Occurrence {
    key: EventKey,
    /// `<regarding name>.<hex unix nanos>`; used only if this occurrence creates the event.
    name: String,
    namespace: String,
    regarding: ObjectReference,
    related: Option<ObjectReference>,
    time: Timestamp,
}

/// An object reference as far as isomorphism goes: everything but `resourceVersion`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RefKey {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    field_path: Option<String>,
}

impl From<&ObjectReference> for RefKey {
    fn from(r: &ObjectReference) -> Self {
        RefKey {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
            field_path: r.field_path.clone(),
        }
    }
}

/// What makes two events isomorphic (client-go's `eventKey`, plus the note). The reporting
/// controller and instance are the recorder's own, the same for every entry of its cache.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventKey {
    regarding: RefKey,
    related: Option<RefKey>,
    event_type: EventType,
    reason: String,
    action: String,
    note: String,
}

/// A pending retry of an entry's write.
#[derive(Clone, Copy, Debug)]
struct Retry {
    at: Instant,
    /// Failed attempts so far.
    tries: u32,
}

/// One aggregated event.
///
/// Invariants: `count >= 1` and `0 <= synced_count <= count`; the entry is *dirty* (has
/// something to write) iff `synced_count < count`; a scheduled `retry` implies dirty. `created` means the server has had an Event named `name` (it may since have
/// expired: a patch answered 404 clears it).
#[derive(Clone, Debug)]
struct CachedEvent {
    name: String,
    namespace: String,
    regarding: ObjectReference,
    related: Option<ObjectReference>,
    event_time: Timestamp,
    /// Occurrences so far; 2 or more makes a series.
    count: i32,
    last_observed: Timestamp,
    created: bool,
    /// The count last written, or given up on.
    synced_count: i32,
    retry: Option<Retry>,
}

impl CachedEvent {
    fn dirty(&self) -> bool {
        self.synced_count < self.count
    }

    fn is_series(&self) -> bool {
        self.count >= 2
    }
}

/// The aggregation state (client-go's `eventCache`), without I/O: which events exist, their
/// counts, and what is still to be written.
#[derive(Default)]
struct EventCache {
    entries: HashMap<EventKey, CachedEvent>,
}

impl EventCache {
    /// Counts an occurrence. Returns the key if it must be written now: a first occurrence
    /// (create) or the first repeat (the series starts with count 2), unless a retry of the entry
    /// is already scheduled and will write it.
    fn observe(&mut self, occurrence: Occurrence) -> Option<EventKey> {
        match self.entries.entry(occurrence.key) {
            Entry::Occupied(mut slot) => {
                let entry = slot.get_mut();
                entry.count = entry.count.saturating_add(1);
                entry.last_observed = entry.last_observed.max(occurrence.time);
                (entry.count == 2 && entry.retry.is_none()).then(|| slot.key().clone())
            }
            Entry::Vacant(slot) => {
                let key = slot.key().clone();
                slot.insert(CachedEvent {
                    name: occurrence.name,
                    namespace: occurrence.namespace,
                    regarding: occurrence.regarding,
                    related: occurrence.related,
                    event_time: occurrence.time,
                    count: 1,
                    last_observed: occurrence.time,
                    created: false,
                    synced_count: 0,
                    retry: None,
                });
                Some(key)
            }
        }
    }

    /// Keys of the entries matching `pred`.
    fn keys_where(&self, pred: impl Fn(&CachedEvent) -> bool) -> Vec<EventKey> {
        self.entries
            .iter()
            .filter(|(_, e)| pred(e))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Entries that are finished at `now` (client-go `finishSeries`): series without a repeat for
    /// `finish_time`, single events older than that.
    fn finished(&self, now: Timestamp, finish_time: Duration) -> Vec<EventKey> {
        let limit = SignedDuration::try_from(finish_time).unwrap_or(SignedDuration::MAX);
        self.keys_where(|e| {
            let since = if e.is_series() { e.last_observed } else { e.event_time };
            now.duration_since(since) > limit
        })
    }

    fn earliest_retry(&self) -> Option<Instant> {
        self.entries.values().filter_map(|e| e.retry.map(|r| r.at)).min()
    }
}

struct SinkState {
    queue: mpsc::Receiver<Message>,
    cache: EventCache,
}

/// Puts the sink state back into its slot when `run` returns or its future is dropped.
struct ReturnOnDrop<'a> {
    slot: &'a Mutex<Option<SinkState>>,
    state: Option<SinkState>,
}

impl Drop for ReturnOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            *lock(self.slot) = Some(state);
        }
    }
}

/// The slot's critical sections only move an `Option` in or out, so a poisoned lock holds a
/// consistent value and is taken over.
fn lock(slot: &Mutex<Option<SinkState>>) -> MutexGuard<'_, Option<SinkState>> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

impl EventRecorder {
    /// A recorder writing through `client` as `reporter`, with the default
    /// [`EventRecorderConfig`]. Nothing runs until [`run`](Self::run) is spawned.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self::with_config(client, reporter, EventRecorderConfig::default())
    }

    /// A recorder with explicit settings.
    pub fn with_config(client: kube::Client, reporter: Reporter, config: EventRecorderConfig) -> Self {
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        EventRecorder {
            inner: Arc::new(Inner {
                client,
                reporter,
                config,
                queue: tx,
                sink_state: Mutex::new(Some(SinkState {
                    queue: rx,
                    cache: EventCache::default(),
                })),
                last_name_nanos: AtomicI64::new(0),
                core_v1: AtomicBool::new(false),
                overflowing: AtomicBool::new(false),
                leadership: Mutex::new(None),
                written: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                cached: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// Who this recorder reports as.
    pub fn reporter(&self) -> &Reporter {
        &self.inner.reporter
    }

    /// Records and writes events only while `leadership` holds: once it ended (a leader stopped
    /// past its lease, say), [`publish`](Self::publish) drops every event and the sink sends no
    /// write, each refusal logged below ERROR and counted in
    /// [`EventRecorderStats::refused`]. A [`Controller`](crate::Controller) sets its own
    /// leadership on its recorder when it runs (the last one run, for a shared recorder). A
    /// kinformer addition: client-go's recorders write regardless.
    pub fn set_leadership(&self, leadership: Leadership) {
        *self.inner.leadership.lock().unwrap_or_else(|e| e.into_inner()) = Some(leadership);
    }

    /// Records an event about `regarding`. Non-blocking (call it from reconcile): hands the event
    /// to the sink through a bounded queue; when the queue is full the event is dropped, logged
    /// (one warning per overflow) and counted in [`EventRecorderStats::dropped`].
    pub fn publish<K: kube::Resource<DynamicType = ()>>(
        &self,
        regarding: &K,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        self.enqueue(&regarding.object_ref(&()), None, event_type, reason, action, note);
    }

    /// [`publish`](Self::publish) for any object reference (dynamic objects): build it with
    /// kube's `Resource::object_ref(&dt)`.
    pub fn publish_for(
        &self,
        regarding: &ObjectReference,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        self.enqueue(regarding, None, event_type, reason, action, note);
    }

    /// [`publish_for`](Self::publish_for) with a second object the event is about (`related`,
    /// e.g. the Pod a ReplicaSet created), as client-go's `Eventf(regarding, related, ...)`.
    pub fn publish_with_related(
        &self,
        regarding: &ObjectReference,
        related: &ObjectReference,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        self.enqueue(regarding, Some(related), event_type, reason, action, note);
    }

    fn enqueue(
        &self,
        regarding: &ObjectReference,
        related: Option<&ObjectReference>,
        event_type: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let inner = &*self.inner;
        if let Err(not_leader) = inner.check_leading() {
            inner.refused.fetch_add(1, Ordering::Relaxed);
            info!(
                controller = %inner.reporter.controller,
                namespace = regarding.namespace.as_deref().unwrap_or(""),
                name = regarding.name.as_deref().unwrap_or(""),
                %event_type,
                reason,
                error = %not_leader,
                "event not recorded: this replica may no longer lead"
            );
            return;
        }
        let Some(name) = regarding.name.as_deref().filter(|n| !n.is_empty()) else {
            inner.failed.fetch_add(1, Ordering::Relaxed);
            warn!(%event_type, reason, "event not recorded: the regarding object has no name");
            return;
        };
        let time = Timestamp::now();
        let nanos = unique_nanos(&inner.last_name_nanos, time);
        let namespace = regarding
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .unwrap_or("default");
        let occurrence = Occurrence {
            key: EventKey {
                regarding: RefKey::from(regarding),
                related: related.map(RefKey::from),
                event_type,
                reason: truncate(reason, REASON_LIMIT, ""),
                action: truncate(action, REASON_LIMIT, ""),
                note: truncate(note, NOTE_LIMIT, " ..."),
            },
            name: format!("{name}.{nanos:x}"),
            namespace: namespace.to_owned(),
            regarding: regarding.clone(),
            related: related.cloned(),
            time,
        };
        debug!(
            kind = regarding.kind.as_deref().unwrap_or(""),
            namespace,
            name,
            %event_type,
            reason,
            action,
            note,
            "event"
        );
        match inner.queue.try_send(Message::Event(Box::new(occurrence))) {
            Ok(()) => {
                if inner.overflowing.swap(false, Ordering::Relaxed) {
                    info!(
                        controller = %inner.reporter.controller,
                        dropped_total = inner.dropped.load(Ordering::Relaxed),
                        "event queue accepts events again"
                    );
                }
            }
            Err(_) => {
                // Full (the sink is behind or not running). `Closed` cannot happen: `inner`
                // holds the receiver.
                let dropped_total = inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if inner.overflowing.swap(true, Ordering::Relaxed) {
                    debug!(namespace, name, dropped_total, "event queue full: dropped");
                } else {
                    warn!(
                        controller = %inner.reporter.controller,
                        capacity = inner.config.queue_capacity,
                        namespace,
                        name,
                        reason,
                        dropped_total,
                        "event queue full: dropping events until the sink catches up"
                    );
                }
            }
        }
    }

    /// The sink task: receives published events, aggregates and writes them, refreshes series
    /// periodically, finishes idle ones, retries failed writes, and when `shutdown` fires takes
    /// what is still queued, writes pending series counts once and returns. Spawned by the
    /// [`Manager`](crate::Manager) (or a standalone controller); spawns nothing itself.
    ///
    /// One `run` at a time: a second concurrent call logs a warning and returns at once. A `run`
    /// started after another returned continues its series.
    pub async fn run(&self, shutdown: CancellationToken) {
        let Some(state) = lock(&self.inner.sink_state).take() else {
            warn!(
                controller = %self.inner.reporter.controller,
                "EventRecorder::run is already running; this call returns at once"
            );
            return;
        };
        let mut guard = ReturnOnDrop {
            slot: &self.inner.sink_state,
            state: Some(state),
        };
        let Some(SinkState { queue, cache }) = guard.state.as_mut() else {
            return;
        };
        let mut sink = Sink {
            inner: &self.inner,
            cache,
            next_retry: None,
        };
        sink.run(queue, &shutdown).await;
    }

    /// Waits until every event published before this call has been written or aggregated, and
    /// pending series counts written (one attempt each; a write that fails stays scheduled for
    /// retry). Needs [`run`](Self::run): if it is not running, this waits until it runs. For
    /// tests and graceful shutdown.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.inner.queue.send(Message::Flush(done)).await.is_ok() {
            // An error means the sink was dropped mid-flush: nothing more to wait for.
            let _ = wait.await;
        }
    }

    /// The counters (plain atomics, readable at any time).
    pub fn stats(&self) -> EventRecorderStats {
        let inner = &*self.inner;
        EventRecorderStats {
            written: inner.written.load(Ordering::Relaxed),
            dropped: inner.dropped.load(Ordering::Relaxed),
            failed: inner.failed.load(Ordering::Relaxed),
            cached: inner.cached.load(Ordering::Relaxed),
            refused: inner.refused.load(Ordering::Relaxed),
        }
    }
}

/// A nanosecond timestamp for an event name, strictly greater than the last one handed out.
fn unique_nanos(last: &AtomicI64, time: Timestamp) -> i64 {
    let now = i64::try_from(time.as_nanosecond()).unwrap_or(i64::MAX);
    let mut unique = now;
    // The closure always returns `Some`, so this cannot fail.
    let _ = last.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |prev| {
        unique = now.max(prev.saturating_add(1));
        Some(unique)
    });
    unique
}

/// `s` cut to at most `max` bytes (at a character boundary), ending in `suffix` if cut.
fn truncate(s: &str, max: usize, suffix: &str) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(suffix.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &s[..end])
}

/// The sink while `run` runs: the aggregation cache and the writer.
struct Sink<'a> {
    inner: &'a Inner,
    cache: &'a mut EventCache,
    /// When the earliest scheduled retry is due.
    next_retry: Option<Instant>,
}

impl Sink<'_> {
    async fn run(&mut self, queue: &mut mpsc::Receiver<Message>, shutdown: &CancellationToken) {
        let config = &self.inner.config;
        let refresh_period = config.refresh_period.clamp(MIN_PERIOD, MAX_PERIOD);
        let finish_period = config.finish_time.clamp(MIN_PERIOD, MAX_PERIOD);
        let mut refresh = tokio::time::interval_at(Instant::now() + refresh_period, refresh_period);
        refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut finish = tokio::time::interval_at(Instant::now() + finish_period, finish_period);
        finish.set_missed_tick_behavior(MissedTickBehavior::Delay);
        self.next_retry = self.cache.earliest_retry();
        debug!(controller = %self.inner.reporter.controller, "event recorder sink started");
        loop {
            let retry_at = self.next_retry;
            // Timers first: a steady stream of events must not starve them.
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = sleep_until(retry_at) => self.retry_due().await,
                _ = refresh.tick() => self.refresh().await,
                _ = finish.tick() => self.finish_series().await,
                message = queue.recv() => match message {
                    Some(message) => self.handle(message).await,
                    None => break,
                },
            }
        }
        // What was published before shutdown is still queued: aggregate it (only that much, so
        // a publisher in a hot loop cannot keep us here), then write every pending count once.
        for _ in 0..queue.len() {
            let Ok(message) = queue.try_recv() else { break };
            self.handle(message).await;
        }
        self.write_pending().await;
        debug!(
            controller = %self.inner.reporter.controller,
            cached = self.cache.entries.len(),
            "event recorder sink stopped"
        );
    }

    async fn handle(&mut self, message: Message) {
        match message {
            Message::Event(occurrence) => {
                if let Some(key) = self.cache.observe(*occurrence) {
                    self.sync(&key).await;
                }
                self.update_cached_gauge();
            }
            Message::Flush(done) => {
                self.write_pending().await;
                let _ = done.send(());
            }
        }
    }

    /// Writes every dirty entry once, scheduled retries included (flush and shutdown).
    async fn write_pending(&mut self) {
        for key in self.cache.keys_where(CachedEvent::dirty) {
            self.sync(&key).await;
        }
        self.next_retry = self.cache.earliest_retry();
    }

    /// The periodic refresh: writes changed series counts (entries waiting for a retry wait).
    async fn refresh(&mut self) {
        for key in self.cache.keys_where(|e| e.dirty() && e.retry.is_none()) {
            self.sync(&key).await;
        }
    }

    async fn retry_due(&mut self) {
        let now = Instant::now();
        for key in self.cache.keys_where(|e| e.retry.is_some_and(|r| r.at <= now)) {
            self.sync(&key).await;
        }
        self.next_retry = self.cache.earliest_retry();
    }

    /// client-go `finishSeries`: writes the final count of series idle for `finish_time` and
    /// evicts them and old single events. An entry whose final write is to be retried stays.
    async fn finish_series(&mut self) {
        let finished = self.cache.finished(Timestamp::now(), self.inner.config.finish_time);
        for key in finished {
            self.sync(&key).await;
            if self.cache.entries.get(&key).is_some_and(|e| e.retry.is_none())
                && let Some(entry) = self.cache.entries.remove(&key)
            {
                debug!(event = %entry.name, namespace = %entry.namespace, count = entry.count, "event finished");
            }
        }
        self.next_retry = self.cache.earliest_retry();
        self.update_cached_gauge();
    }

    fn update_cached_gauge(&self) {
        let n = u64::try_from(self.cache.entries.len()).unwrap_or(u64::MAX);
        self.inner.cached.store(n, Ordering::Relaxed);
    }

    /// Brings the server up to date with one entry, if it is dirty: one attempt; a retryable
    /// failure schedules a retry, anything else (or the last try) gives the write up.
    async fn sync(&mut self, key: &EventKey) {
        let Some(entry) = self.cache.entries.get(key) else {
            return;
        };
        if !entry.dirty() {
            return;
        }
        let mut attempt = entry.clone();
        let result = self.inner.write(key, &mut attempt).await;
        // The sink is the only writer of the cache, so the entry is as it was before the await.
        let Some(entry) = self.cache.entries.get_mut(key) else {
            return;
        };
        entry.created = attempt.created;
        let err = match result {
            Ok(()) => {
                entry.synced_count = attempt.count;
                entry.retry = None;
                return;
            }
            Err(WriteError::NotLeader(not_leader)) => {
                // Not retried: this replica is stopping, the next leader records its own.
                entry.synced_count = entry.count;
                entry.retry = None;
                self.inner.refused.fetch_add(1, Ordering::Relaxed);
                info!(
                    controller = %self.inner.reporter.controller,
                    event = %entry.name,
                    namespace = %entry.namespace,
                    regarding = entry.regarding.name.as_deref().unwrap_or(""),
                    reason = %key.reason,
                    error = %not_leader,
                    "event write refused: this replica may no longer lead"
                );
                return;
            }
            Err(err) => err,
        };
        let tries = entry.retry.map_or(0, |r| r.tries).saturating_add(1);
        let config = &self.inner.config;
        if err.is_retryable() && tries < config.max_tries {
            let delay = config
                .retry_delay
                .min(MAX_PERIOD)
                .mul_f64(rand::random_range(0.75..1.25));
            let at = Instant::now() + delay;
            entry.retry = Some(Retry { at, tries });
            self.next_retry = Some(self.next_retry.map_or(at, |next| next.min(at)));
            warn!(
                event = %entry.name,
                namespace = %entry.namespace,
                reason = %key.reason,
                tries,
                retry_in = ?delay,
                error = %err,
                "could not write event; will retry"
            );
        } else {
            entry.synced_count = entry.count;
            entry.retry = None;
            self.inner.failed.fetch_add(1, Ordering::Relaxed);
            error!(
                event = %entry.name,
                namespace = %entry.namespace,
                reason = %key.reason,
                tries,
                error = %err,
                "could not write event; giving up"
            );
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("request timed out")]
    Timeout,
    #[error("the server kept contradicting itself (create: exists; patch: not found)")]
    Inconsistent,
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
}

impl WriteError {
    fn status(&self) -> Option<&kube::core::Status> {
        match self {
            WriteError::Kube(kube::Error::Api(status)) => Some(status),
            _ => None,
        }
    }

    fn is_not_found(&self) -> bool {
        self.status().is_some_and(|s| s.code == 404)
    }

    fn is_already_exists(&self) -> bool {
        self.status().is_some_and(|s| s.is_already_exists())
    }

    /// A 404 on create that is not about a missing namespace: the API itself is not served.
    /// (kube-apiserver answers a missing namespace with `NotFound` naming `namespaces`; an
    /// unserved group with a plain `404 page not found`.)
    fn is_unserved(&self) -> bool {
        self.status()
            .is_some_and(|s| s.code == 404 && s.details.as_ref().is_none_or(|d| d.kind != "namespaces"))
    }

    fn is_retryable(&self) -> bool {
        match self {
            WriteError::Timeout | WriteError::Inconsistent => true,
            WriteError::NotLeader(_) => false,
            WriteError::Kube(kube::Error::Api(s)) => matches!(s.code, 429 | 500 | 502 | 503 | 504),
            WriteError::Kube(kube::Error::BuildRequest(_)) => false,
            // Transport errors, and responses that did not decode (the write may have landed:
            // a retried create then finds it exists).
            WriteError::Kube(_) => true,
        }
    }
}

/// `{"series": {...}}`: the merge patch that updates an events.k8s.io/v1 series.
#[derive(Debug, Serialize)]
struct SeriesPatch {
    series: EventSeries,
}

/// `{"count": n, "lastTimestamp": t}`: the merge patch that updates a core/v1 event.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CountPatch {
    count: i32,
    last_timestamp: Time,
}

impl Inner {
    fn check_leading(&self) -> Result<(), NotLeader> {
        match &*self.leadership.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(leadership) => leadership.check(),
            None => Ok(()),
        }
    }

    /// Writes `ev` (create, or patch its count), following the server's answers: a patch that
    /// finds no event creates it again, a create that finds it exists patches it, and a create
    /// refused because `events.k8s.io/v1` is not served switches to core/v1 for good. Updates
    /// `ev.created`.
    async fn write(&self, key: &EventKey, ev: &mut CachedEvent) -> Result<(), WriteError> {
        // Patch → 404 → create → exists → patch is the longest honest path, plus one fallback.
        for _ in 0..5 {
            let core_v1 = self.core_v1.load(Ordering::Relaxed);
            if ev.created {
                if !ev.is_series() {
                    return Ok(());
                }
                match self.patch(core_v1, ev).await {
                    Ok(()) => return Ok(()),
                    Err(e) if e.is_not_found() => {
                        debug!(event = %ev.name, namespace = %ev.namespace, "event gone (expired?); creating it again");
                        ev.created = false;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                match self.create(core_v1, key, ev).await {
                    Ok(()) => {
                        ev.created = true;
                        return Ok(());
                    }
                    Err(e) if e.is_already_exists() => {
                        // Names are unique per recorder: an earlier attempt of ours landed.
                        ev.created = true;
                    }
                    Err(e) if !core_v1 && e.is_unserved() => {
                        if !self.core_v1.swap(true, Ordering::Relaxed) {
                            warn!(
                                controller = %self.reporter.controller,
                                error = %e,
                                "events.k8s.io/v1 is not served; recording core/v1 Events from now on"
                            );
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Err(WriteError::Inconsistent)
    }

    async fn create(&self, core_v1: bool, key: &EventKey, ev: &CachedEvent) -> Result<(), WriteError> {
        let pp = PostParams::default();
        if core_v1 {
            let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &ev.namespace);
            self.call(api.create(&pp, &self.core_v1_event(key, ev))).await?;
        } else {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &ev.namespace);
            self.call(api.create(&pp, &self.events_v1_event(key, ev))).await?;
        }
        self.written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn patch(&self, core_v1: bool, ev: &CachedEvent) -> Result<(), WriteError> {
        let pp = PatchParams::default();
        if core_v1 {
            let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &ev.namespace);
            let body = CountPatch {
                count: ev.count,
                last_timestamp: Time(ev.last_observed),
            };
            self.call(api.patch(&ev.name, &pp, &Patch::Merge(&body))).await?;
        } else {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &ev.namespace);
            let body = SeriesPatch { series: series_of(ev) };
            self.call(api.patch(&ev.name, &pp, &Patch::Merge(&body))).await?;
        }
        self.written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sends `request` (a lazy future: nothing is sent before it is polled) unless the
    /// leadership ended, bounded by the request timeout.
    async fn call<T>(&self, request: impl Future<Output = kube::Result<T>>) -> Result<T, WriteError> {
        self.check_leading()?;
        match tokio::time::timeout(self.config.request_timeout, request).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(WriteError::Timeout),
        }
    }

    /// client-go `makeEvent` (tools/events), with the series if the count is already above 1.
    fn events_v1_event(&self, key: &EventKey, ev: &CachedEvent) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(ev.name.clone()),
                namespace: Some(ev.namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(ev.event_time)),
            series: ev.is_series().then(|| series_of(ev)),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone()),
            action: Some(key.action.clone()),
            reason: Some(key.reason.clone()),
            regarding: Some(ev.regarding.clone()),
            related: ev.related.clone(),
            note: Some(key.note.clone()),
            type_: Some(key.event_type.as_str().to_owned()),
            ..Event::default()
        }
    }

    /// client-go `makeEvent` (tools/record). `eventTime` stays unset, as there: core/v1
    /// validation then applies its legacy rules, which the count/timestamp fields belong to.
    fn core_v1_event(&self, key: &EventKey, ev: &CachedEvent) -> CoreEvent {
        CoreEvent {
            metadata: ObjectMeta {
                name: Some(ev.name.clone()),
                namespace: Some(ev.namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ev.regarding.clone(),
            related: ev.related.clone(),
            reason: Some(key.reason.clone()),
            message: Some(key.note.clone()),
            action: Some(key.action.clone()),
            type_: Some(key.event_type.as_str().to_owned()),
            source: Some(EventSource {
                component: Some(self.reporter.controller.clone()),
                host: Some(self.reporter.instance.clone()),
            }),
            reporting_component: Some(self.reporter.controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone()),
            count: Some(ev.count),
            first_timestamp: Some(Time(ev.event_time)),
            last_timestamp: Some(Time(ev.last_observed)),
            ..CoreEvent::default()
        }
    }
}

fn series_of(ev: &CachedEvent) -> EventSeries {
    EventSeries {
        count: ev.count,
        last_observed_time: MicroTime(ev.last_observed),
    }
}
