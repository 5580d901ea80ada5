//! The watch cache (kube-apiserver's `Cacher` + `watchCache`) and one `cacheWatcher` per watch.
//!
//! - [`WatchCache`] keeps a bounded ring of the most recent events. A watch may start at any
//!   revision `>= window_start()`; older ones get `410 Expired`, which is what makes clients relist
//!   (<https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>).
//!   The ring is global across resources because the revision counter is (like etcd's).
//! - Each watch request gets a [`CacheWatcher`]: a task with a bounded input channel, its filter
//!   (namespace, labels, fields), its start revision, bookmark timer and deadline. The writer
//!   dispatches with `try_send` under the store lock, so it never waits for a watcher.
//! - Each event is sent as the watch asked: the object (converted to the watch's version for a
//!   custom resource whose storage version differs, `conversion.rs`), its
//!   `PartialObjectMetadata`, or a one-row `Table` (`table.rs`).
//! - A watcher whose input is full is marked *lagging*: the dispatcher stops sending to it. If it
//!   drains its input within the grace period it catches up from the ring (nothing lost, order
//!   kept); if it stays full past the grace period, or the ring no longer reaches back to its last
//!   revision, it is terminated and its stream closes. The client re-watches from the last
//!   revision it saw and either resumes or gets `410`. So one slow client never stalls the writers
//!   or the other watchers, and memory stays bounded by the ring and the channel sizes.

use crate::selectors::Filter;
use crate::storage::Storage;
use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One write, as the cache keeps it.
#[derive(Debug)]
pub(crate) struct WatchCacheEvent {
    /// The write's revision.
    pub(crate) rv: u64,
    /// Storage key of the resource (`group/plural`).
    pub(crate) resource: Arc<str>,
    pub(crate) kind: EventType,
    /// The object after the write (for a delete: the last state, at revision `rv`).
    pub(crate) object: Arc<Value>,
    /// The object before the write (`None` for a create).
    pub(crate) prev: Option<Arc<Value>>,
    /// `object` serialized once, shared by every watcher.
    object_json: Bytes,
}

impl WatchCacheEvent {
    pub(crate) fn new(rv: u64, resource: &str, kind: EventType, object: Arc<Value>, prev: Option<Arc<Value>>) -> Self {
        let object_json = Bytes::from(serde_json::to_vec(&*object).unwrap_or_default());
        WatchCacheEvent {
            rv,
            resource: Arc::from(resource),
            kind,
            object,
            prev,
            object_json,
        }
    }
}

/// The registry side of a watcher, owned by the cache.
#[derive(Debug)]
struct WatcherHandle {
    resource: Arc<str>,
    namespace: Option<String>,
    input: mpsc::Sender<Arc<WatchCacheEvent>>,
    /// Shared with the watcher task: set when `input` was full and dispatch stopped.
    lagging: Arc<AtomicBool>,
    /// When the watcher started lagging (None while it keeps up).
    lagging_since: Option<Instant>,
    cancel: CancellationToken,
}

/// Settings of the cache and its watchers.
#[derive(Debug, Clone)]
pub(crate) struct WatchCacheConfig {
    pub(crate) capacity: usize,
    pub(crate) watcher_buffer: usize,
    pub(crate) grace: Duration,
}

/// The ring of recent events and the registered watchers. Lives inside the store's lock.
///
/// Invariants: `events` are in strictly increasing `rv`; `events.len() <= capacity`; every event
/// with `rv > window_start` (up to the store's current revision) is in `events`; a watcher in
/// `watchers` with `lagging_since == None` has been sent every event of its resource since it
/// registered.
#[derive(Debug)]
pub(crate) struct WatchCache {
    events: VecDeque<Arc<WatchCacheEvent>>,
    window_start: u64,
    watchers: HashMap<u64, WatcherHandle>,
    next_id: u64,
    config: WatchCacheConfig,
}

/// What a new watcher receives from [`WatchCache::register`].
pub(crate) struct Registration {
    pub(crate) id: u64,
    pub(crate) input: mpsc::Receiver<Arc<WatchCacheEvent>>,
    pub(crate) lagging: Arc<AtomicBool>,
    pub(crate) cancel: CancellationToken,
}

impl WatchCache {
    pub(crate) fn new(config: WatchCacheConfig, window_start: u64) -> Self {
        WatchCache {
            events: VecDeque::with_capacity(config.capacity.min(65_536)),
            window_start,
            watchers: HashMap::new(),
            next_id: 0,
            config,
        }
    }

    /// The oldest revision a watch can start from.
    pub(crate) fn window_start(&self) -> u64 {
        self.window_start
    }

    /// Number of events held (never more than the capacity).
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// The ring's capacity.
    pub(crate) fn capacity(&self) -> usize {
        self.config.capacity
    }

    /// Number of registered watchers.
    pub(crate) fn watcher_count(&self) -> usize {
        self.watchers.len()
    }

    /// Appends an event, evicting the oldest, and dispatches it to the resource's watchers.
    pub(crate) fn push(&mut self, event: WatchCacheEvent) {
        let event = Arc::new(event);
        if self.config.capacity == 0 {
            self.window_start = event.rv;
        } else {
            while self.events.len() >= self.config.capacity {
                if let Some(old) = self.events.pop_front() {
                    self.window_start = old.rv;
                }
            }
            self.events.push_back(event.clone());
        }
        self.dispatch(&event);
    }

    fn dispatch(&mut self, event: &Arc<WatchCacheEvent>) {
        let now = Instant::now();
        let grace = self.config.grace;
        let ns = crate::object::namespace(&event.object);
        let mut dead = Vec::new();
        for (id, w) in self.watchers.iter_mut() {
            if w.resource != event.resource || w.namespace.as_deref().is_some_and(|n| n != ns) {
                continue;
            }
            if let Some(since) = w.lagging_since {
                if now.duration_since(since) > grace {
                    dead.push(*id);
                }
                continue;
            }
            match w.input.try_send(event.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    w.lagging_since = Some(now);
                    w.lagging.store(true, Ordering::SeqCst);
                }
                Err(TrySendError::Closed(_)) => dead.push(*id),
            }
        }
        for id in dead {
            self.terminate(id);
        }
    }

    /// Terminates watchers that stayed lagging past the grace period or whose task is gone.
    pub(crate) fn sweep(&mut self) {
        let now = Instant::now();
        let grace = self.config.grace;
        let dead: Vec<u64> = self
            .watchers
            .iter()
            .filter(|(_, w)| {
                w.input.is_closed() || w.lagging_since.is_some_and(|since| now.duration_since(since) > grace)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            self.terminate(id);
        }
    }

    fn terminate(&mut self, id: u64) {
        if let Some(w) = self.watchers.remove(&id) {
            tracing::debug!(id, resource = %w.resource, "terminating watcher");
            w.cancel.cancel();
        }
    }

    /// The cached events of `resource` with revision `> rv`, or `None` if the cache no longer
    /// reaches back to `rv`.
    pub(crate) fn events_since(&self, resource: &str, rv: u64) -> Option<Vec<Arc<WatchCacheEvent>>> {
        if rv < self.window_start {
            return None;
        }
        let start = self.events.partition_point(|e| e.rv <= rv);
        Some(
            self.events
                .range(start..)
                .filter(|e| &*e.resource == resource)
                .cloned()
                .collect(),
        )
    }

    /// Registers a watcher; events of `resource` pushed from now on go to its input.
    pub(crate) fn register(&mut self, resource: &str, namespace: Option<String>) -> Registration {
        let id = self.next_id;
        self.next_id += 1;
        let (tx, rx) = mpsc::channel(self.config.watcher_buffer.max(1));
        let lagging = Arc::new(AtomicBool::new(false));
        let cancel = CancellationToken::new();
        self.watchers.insert(
            id,
            WatcherHandle {
                resource: Arc::from(resource),
                namespace,
                input: tx,
                lagging: lagging.clone(),
                lagging_since: None,
                cancel: cancel.clone(),
            },
        );
        Registration {
            id,
            input: rx,
            lagging,
            cancel,
        }
    }

    /// Removes a watcher (its task ended).
    pub(crate) fn unregister(&mut self, id: u64) {
        self.watchers.remove(&id);
    }

    /// For a lagging watcher whose input is drained: the events it missed, and dispatch resumes.
    /// `None` if it was terminated or the ring no longer reaches back to `last_rv`.
    fn catch_up(&mut self, id: u64, last_rv: u64) -> Option<Vec<Arc<WatchCacheEvent>>> {
        let resource = self.watchers.get(&id)?.resource.clone();
        let Some(events) = self.events_since(&resource, last_rv) else {
            self.terminate(id);
            return None;
        };
        let w = self.watchers.get_mut(&id)?;
        w.lagging_since = None;
        w.lagging.store(false, Ordering::SeqCst);
        Some(events)
    }

    fn is_lagging(&self, id: u64) -> bool {
        self.watchers.get(&id).is_none_or(|w| w.lagging_since.is_some())
    }

    /// Closes every open watch (their streams end; clients re-watch).
    pub(crate) fn close_all(&mut self) {
        let ids: Vec<u64> = self.watchers.keys().copied().collect();
        for id in ids {
            self.terminate(id);
        }
    }

    /// Drops every cached event: watches and continue tokens older than `current_rv` expire.
    pub(crate) fn compact(&mut self, current_rv: u64) {
        self.events.clear();
        self.window_start = current_rv;
    }
}

/// What a watch sends before live events.
pub(crate) enum InitialEvents {
    /// Synthetic `ADDED` for the current state (resourceVersion `""`/`"0"`, sendInitialEvents).
    Objects(Vec<Arc<Value>>),
    /// Cached events after the requested revision.
    Events(Vec<Arc<WatchCacheEvent>>),
}

/// Serializes a watch event line.
fn event_line(kind: &str, object_json: &[u8]) -> Bytes {
    let mut line = Vec::with_capacity(object_json.len() + 32);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(object_json);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// An `ERROR` event carrying a Status.
pub(crate) fn error_line(status: &Value) -> Bytes {
    event_line("ERROR", &serde_json::to_vec(status).unwrap_or_default())
}

/// An `ADDED` event whose object no Kubernetes type decodes (`metadata.labels` is a string), for
/// the malformed-watch fault. It carries the watch's own revision, so it moves no client forward.
pub(crate) fn malformed_line(api_version: &str, kind: &str, namespace: &str, rv: u64) -> Bytes {
    let object = serde_json::json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": "envtest-malformed",
            "namespace": namespace,
            "resourceVersion": rv.to_string(),
            "labels": "not-a-map",
        },
    });
    event_line("ADDED", &serde_json::to_vec(&object).unwrap_or_default())
}

/// One watch: its filter, position and stream (kube-apiserver's `cacheWatcher`).
pub(crate) struct CacheWatcher {
    pub(crate) storage: Arc<Storage>,
    pub(crate) registration: Registration,
    pub(crate) filter: Filter,
    /// apiVersion/kind for bookmark objects.
    pub(crate) api_version: String,
    pub(crate) kind: String,
    /// Send each object as a `PartialObjectMetadata` (the client's `Accept` asked for it).
    pub(crate) metadata_only: bool,
    /// For a custom resource watched in a version other than its storage version: the
    /// converter and the version each object is converted to before it is sent
    /// (`conversion.rs`). A failed conversion ends the watch with an `ERROR` event.
    pub(crate) convert: Option<(crate::conversion::Converter, String)>,
    /// Send each object as a one-row `meta.k8s.io` `Table` (the client's `Accept` asked for
    /// one, as `kubectl get --watch` does): the convertor, what rows hold, the Table's version.
    pub(crate) table: Option<(crate::table::TableConvertor, crate::table::IncludeObject, &'static str)>,
    /// The last revision the client has been brought up to.
    pub(crate) last_rv: u64,
    pub(crate) initial: InitialEvents,
    /// Send the `k8s.io/initial-events-end` bookmark after the initial events.
    pub(crate) initial_events_end: bool,
    pub(crate) bookmark_interval: Option<Duration>,
    pub(crate) deadline: Option<Instant>,
    /// Also cancelled when the server shuts down.
    pub(crate) server_cancel: CancellationToken,
    pub(crate) output: mpsc::Sender<Bytes>,
}

impl CacheWatcher {
    /// Runs the watch until the client goes away, the deadline passes, or it is terminated.
    pub(crate) async fn run(mut self) {
        let id = self.registration.id;
        let _ = self.run_inner().await;
        self.storage.lock().cache.unregister(id);
    }

    async fn run_inner(&mut self) -> Option<()> {
        let initial = std::mem::replace(&mut self.initial, InitialEvents::Objects(Vec::new()));
        match initial {
            InitialEvents::Objects(objects) => {
                for obj in objects {
                    if self.filter.matches(&obj) {
                        let obj = self.converted(&obj).await?;
                        let json = serde_json::to_vec(&self.rendered(&obj)).unwrap_or_default();
                        self.send(event_line("ADDED", &json)).await?;
                    }
                }
            }
            InitialEvents::Events(events) => {
                for ev in events {
                    self.send_event(&ev).await?;
                }
            }
        }
        if self.initial_events_end {
            let line = self.bookmark_line(self.last_rv, true);
            self.send(line).await?;
        }
        let mut ticker = self.bookmark_interval.map(|every| {
            let mut t = tokio::time::interval_at(Instant::now() + every, every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        loop {
            if self.registration.lagging.load(Ordering::SeqCst) && self.registration.input.is_empty() {
                let missed = {
                    let mut inner = self.storage.lock();
                    inner.cache.catch_up(self.registration.id, self.last_rv)
                }?;
                for ev in missed {
                    self.send_event(&ev).await?;
                }
            }
            let deadline = self.deadline;
            tokio::select! {
                biased;
                _ = self.registration.cancel.cancelled() => return None,
                _ = self.server_cancel.cancelled() => return None,
                _ = sleep_until_opt(deadline) => return None,
                _ = self.output.closed() => return None,
                ev = self.registration.input.recv() => {
                    let ev = ev?;
                    self.send_event(&ev).await?;
                }
                _ = tick_opt(&mut ticker) => {
                    let rv = {
                        let inner = self.storage.lock();
                        let caught_up = self.registration.input.is_empty()
                            && !inner.cache.is_lagging(self.registration.id);
                        caught_up.then(|| inner.current_rv())
                    };
                    if let Some(rv) = rv.filter(|rv| *rv >= self.last_rv) {
                        self.last_rv = rv;
                        let line = self.bookmark_line(rv, false);
                        self.send(line).await?;
                    }
                }
            }
        }
    }

    async fn send_event(&mut self, ev: &WatchCacheEvent) -> Option<()> {
        if ev.rv <= self.last_rv {
            return Some(());
        }
        self.last_rv = ev.rv;
        let now = self.filter.matches(&ev.object);
        let before = ev.prev.as_ref().is_some_and(|p| self.filter.matches(p));
        let kind = match ev.kind {
            EventType::Added if now => "ADDED",
            EventType::Modified if now && before => "MODIFIED",
            EventType::Modified if now => "ADDED",
            EventType::Modified if before => "DELETED",
            EventType::Deleted if now || before => "DELETED",
            _ => return Some(()),
        };
        if self.needs_conversion(&ev.object) || self.metadata_only || self.table.is_some() {
            let obj = self.converted(&ev.object).await?;
            let json = serde_json::to_vec(&self.rendered(&obj)).unwrap_or_default();
            return self.send(event_line(kind, &json)).await;
        }
        self.send(event_line(kind, &ev.object_json)).await
    }

    /// An event's object as the client asked for it: a one-row `Table`, a
    /// `PartialObjectMetadata`, or the object.
    fn rendered(&self, obj: &Arc<Value>) -> Value {
        match &self.table {
            Some((convertor, include, version)) => convertor.table(&[obj], None, *include, version),
            None if self.metadata_only => crate::request::partial_object_metadata(obj),
            None => (**obj).clone(),
        }
    }

    /// Whether `obj` is in another version than the watch's.
    fn needs_conversion(&self, obj: &Value) -> bool {
        self.convert.as_ref().is_some_and(|(converter, version)| {
            obj["apiVersion"].as_str() != Some(converter.api_version(version).as_str())
        })
    }

    /// `obj` in the watch's version (itself when no conversion applies). A failed conversion
    /// sends an `ERROR` event with its `Status` and ends the watch (`None`).
    async fn converted(&self, obj: &Arc<Value>) -> Option<Arc<Value>> {
        let Some((converter, version)) = self.convert.as_ref().filter(|_| self.needs_conversion(obj)) else {
            return Some(obj.clone());
        };
        match converter.convert((**obj).clone(), version).await {
            Ok(o) => Some(Arc::new(o)),
            Err(e) => {
                tracing::warn!(
                    api_version = %converter.api_version(version),
                    kind = %self.kind,
                    error = %e.message,
                    "watch event conversion failed; ending the watch"
                );
                self.send(error_line(&e.to_status())).await?;
                None
            }
        }
    }

    fn bookmark_line(&self, rv: u64, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = if self.metadata_only {
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata})
        } else {
            json!({"kind": self.kind, "apiVersion": self.api_version, "metadata": metadata})
        };
        event_line("BOOKMARK", &serde_json::to_vec(&obj).unwrap_or_default())
    }

    /// Sends a line to the client; `None` when the watch must end.
    async fn send(&self, line: Bytes) -> Option<()> {
        tokio::select! {
            biased;
            _ = self.registration.cancel.cancelled() => None,
            _ = self.server_cancel.cancelled() => None,
            _ = sleep_until_opt(self.deadline) => None,
            r = self.output.send(line) => r.ok(),
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn tick_opt(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(capacity: usize, buffer: usize) -> WatchCacheConfig {
        WatchCacheConfig {
            capacity,
            watcher_buffer: buffer,
            grace: Duration::from_millis(50),
        }
    }

    fn ev(rv: u64) -> WatchCacheEvent {
        WatchCacheEvent::new(
            rv,
            "/configmaps",
            EventType::Added,
            Arc::new(json!({"metadata": {"name": format!("o{rv}"), "namespace": "d"}})),
            None,
        )
    }

    #[test]
    fn ring_is_bounded_and_window_moves() {
        let mut c = WatchCache::new(cfg(3, 10), 0);
        for rv in 1..=5 {
            c.push(ev(rv));
            assert!(c.len() <= 3);
        }
        assert_eq!(c.window_start(), 2);
        assert!(c.events_since("/configmaps", 1).is_none());
        let evs = c.events_since("/configmaps", 2).unwrap();
        assert_eq!(evs.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert!(c.events_since("/configmaps", 5).unwrap().is_empty());
        c.compact(5);
        assert_eq!(c.len(), 0);
        assert!(c.events_since("/configmaps", 4).is_none());
        assert!(c.events_since("/configmaps", 5).is_some());
    }

    #[tokio::test]
    async fn full_watcher_lags_then_catches_up_or_is_terminated() {
        let mut c = WatchCache::new(cfg(100, 2), 0);
        let mut r = c.register("/configmaps", None);
        for rv in 1..=4 {
            c.push(ev(rv));
        }
        assert!(r.lagging.load(Ordering::SeqCst));
        assert_eq!(r.input.recv().await.unwrap().rv, 1);
        assert_eq!(r.input.recv().await.unwrap().rv, 2);
        let missed = c.catch_up(r.id, 2).unwrap();
        assert_eq!(missed.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![3, 4]);
        assert!(!r.lagging.load(Ordering::SeqCst));

        // Lag again and stay full past the grace period: terminated.
        for rv in 5..=8 {
            c.push(ev(rv));
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        c.sweep();
        assert!(r.cancel.is_cancelled());
        assert_eq!(c.watcher_count(), 0);
    }
}
