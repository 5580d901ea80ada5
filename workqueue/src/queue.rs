//! The basic work queue: deduplicating, FIFO, and never handing one item to two workers.
//!
//! This is client-go's `workqueue.Typed`. Event handlers [`add`](Queue::add) keys; workers loop
//! on [`get`](Queue::get), reconcile, and call [`done`](Queue::done). Because an item is queued at
//! most once and never processed concurrently, a burst of events for one object costs one
//! reconcile, and reconcilers need no per-key locking.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use workqueue::Queue;
//!
//! let queue = Queue::new();
//! queue.add("default/nginx");
//! queue.add("default/nginx"); // already queued: merged with the first add
//! assert_eq!(queue.len(), 1);
//!
//! let item = queue.get().await.unwrap();
//! queue.add(item); // re-added while processing: queued again once done
//! assert_eq!(queue.len(), 0);
//! queue.done(&item);
//! assert_eq!(queue.len(), 1);
//!
//! queue.shut_down();
//! assert_eq!(queue.get().await, None);
//! # }
//! ```

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::{MetricsProvider, QueueMetrics, UNFINISHED_WORK_UPDATE_PERIOD};

/// Configuration of a queue (client-go's `QueueConfig`).
///
/// There is no clock field: queues read [`tokio::time::Instant`], so tests control time with
/// `tokio::time::pause` and `advance` instead of a fake clock.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct QueueConfig {
    /// The queue's name: the `name` label of its metrics and a field of its log events. Only a
    /// named queue records metrics.
    pub name: Option<String>,
    /// Where metrics go. `None` (the default) records nothing, like client-go's
    /// `noopMetricsProvider`.
    pub metrics_provider: Option<Arc<dyn MetricsProvider>>,
}

impl QueueConfig {
    /// Sets the queue's name.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the provider of the queue's metrics.
    #[must_use]
    pub fn metrics_provider(mut self, provider: Arc<dyn MetricsProvider>) -> Self {
        self.metrics_provider = Some(provider);
        self
    }
}

impl fmt::Debug for QueueConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueConfig")
            .field("name", &self.name)
            .field("metrics_provider", &self.metrics_provider.is_some())
            .finish()
    }
}

/// A work queue of `T`s (client-go's `workqueue.Typed`).
///
/// A cheaply cloneable handle: clones share one queue. See the [module docs](self).
pub struct Queue<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

struct Shared<T> {
    /// `""` for an unnamed queue.
    name: String,
    state: Mutex<State<T>>,
    /// Woken once per item pushed to `State::queue` (like `sync.Cond.Signal`) and for every waiter
    /// on shutdown. Waiters register before they inspect the state, so no wake-up is lost.
    item_available: Notify,
    /// Wakes `shut_down_with_drain` when the queue becomes idle or the drain is cancelled.
    drained: Notify,
    /// Cancelled on shutdown; stops the tasks serving this queue (metrics refresher, the
    /// delaying queue's timer).
    shutdown: CancellationToken,
}

/// The queue proper, reachable only through `Shared::lock`.
///
/// Invariants:
/// - `queue` holds no duplicates, and the set of items in `queue` is exactly `dirty ∖ processing`:
///   an item waits at most once, and never while a worker holds it.
/// - An item in `dirty ∩ processing` was added while being processed; `done` pushes it to
///   `queue`.
/// - `queue` is in order of (re-)insertion, so items are handed out FIFO.
/// - Once `shutting_down`, `dirty` only shrinks: adds are ignored.
struct State<T> {
    queue: VecDeque<T>,
    /// Items that need processing: queued, or added again while processing.
    dirty: HashSet<T>,
    /// Items handed out by `get` and not yet `done`.
    processing: HashSet<T>,
    shutting_down: bool,
    /// Set by `shut_down_with_drain`, cleared by `shut_down`: whether `get` still hands out queued
    /// items while shutting down, and whether a drain is being waited for.
    drain: bool,
    metrics: Option<QueueMetrics<T>>,
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> Default for Queue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> Queue<T> {
    /// Creates an unnamed queue without metrics.
    pub fn new() -> Self {
        Self::with_config(QueueConfig::default())
    }

    /// Creates a queue from `config`.
    ///
    /// A queue with a name and a metrics provider spawns a Tokio task refreshing its
    /// unfinished-work gauges every 500 ms, until shutdown or until the last handle is dropped.
    /// Outside a Tokio runtime those two gauges stay at zero (and a warning is logged).
    pub fn with_config(config: QueueConfig) -> Self {
        let name = config.name.unwrap_or_default();
        let metrics = match &config.metrics_provider {
            Some(provider) if !name.is_empty() => Some(QueueMetrics::new(&**provider, &name)),
            _ => None,
        };
        let has_metrics = metrics.is_some();
        let queue = Self {
            shared: Arc::new(Shared {
                name,
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    shutting_down: false,
                    drain: false,
                    metrics,
                }),
                item_available: Notify::new(),
                drained: Notify::new(),
                shutdown: CancellationToken::new(),
            }),
        };
        if has_metrics {
            queue.spawn_unfinished_work_updater();
        }
        queue
    }

    /// Marks `item` as needing processing.
    ///
    /// Queued at the back unless it is already queued (the adds merge) or being processed (it is
    /// queued again when [`done`](Self::done) is called). Ignored after shutdown.
    pub fn add(&self, item: T) {
        let mut state = self.shared.lock();
        if state.shutting_down {
            drop(state);
            tracing::debug!(queue = %self.shared.name, "work queue shutting down, dropping added item");
            return;
        }
        if state.add(item) {
            drop(state);
            self.shared.item_available.notify_one();
        }
    }

    /// Waits for an item and hands it out; the caller must call [`done`](Self::done) with it.
    ///
    /// Returns `None` once the queue is shut down; after
    /// [`shut_down_with_drain`](Self::shut_down_with_drain), only once nothing is left queued.
    ///
    /// Cancel safe: dropping the future takes nothing from the queue.
    pub async fn get(&self) -> Option<T> {
        loop {
            let mut notified = pin!(self.shared.item_available.notified());
            notified.as_mut().enable();
            match self.shared.lock().next() {
                Next::Item(item) => return Some(item),
                Next::ShutDown => return None,
                Next::Wait => {}
            }
            notified.await;
        }
    }

    /// Marks `item`, handed out by [`get`](Self::get), as processed.
    ///
    /// If it was added again meanwhile, it is queued again now. Calling `done` for an item that
    /// is not being processed does nothing (client-go would queue it a second time).
    pub fn done(&self, item: &T) {
        let mut state = self.shared.lock();
        match state.done(item) {
            Done::Requeued => {
                drop(state);
                self.shared.item_available.notify_one();
            }
            Done::Finished if state.is_idle() => {
                drop(state);
                self.shared.drained.notify_waiters();
            }
            Done::Finished | Done::NotProcessing => {}
        }
    }

    /// Number of items waiting to be handed out (not counting items being processed).
    pub fn len(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// Whether no item is waiting to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shuts the queue down now: later adds are ignored and [`get`](Self::get) returns `None`,
    /// even while items are queued. Items being processed may still be marked done. Cancels a
    /// pending [`shut_down_with_drain`](Self::shut_down_with_drain), which then returns.
    pub fn shut_down(&self) {
        self.shut_down_inner(false);
    }

    /// Shuts the queue down and waits until it is drained: later adds are ignored, workers keep
    /// getting the items still queued, and this returns once nothing is queued or being processed.
    ///
    /// Workers must keep calling [`get`](Self::get) and [`done`](Self::done) until `get` returns
    /// `None`, or this never returns. Unlike client-go, which returns as soon as no item is being
    /// processed, queued items count as unfinished work: when this returns, every item the queue
    /// accepted has been processed.
    pub async fn shut_down_with_drain(&self) {
        self.shut_down_inner(true);
        loop {
            let mut notified = pin!(self.shared.drained.notified());
            notified.as_mut().enable();
            {
                let state = self.shared.lock();
                if !state.drain || state.is_idle() {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Whether the queue is shutting down (or shut down).
    pub fn shutting_down(&self) -> bool {
        self.shared.lock().shutting_down
    }

    fn shut_down_inner(&self, drain: bool) {
        {
            let mut state = self.shared.lock();
            state.shutting_down = true;
            state.drain = drain;
        }
        tracing::debug!(queue = %self.shared.name, drain, "shutting down work queue");
        self.shared.shutdown.cancel();
        self.shared.item_available.notify_waiters();
        self.shared.drained.notify_waiters();
    }

    /// The queue's name, `""` if unnamed.
    pub(crate) fn name(&self) -> &str {
        &self.shared.name
    }

    /// Cancelled when the queue shuts down.
    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.shared.shutdown
    }

    /// Counts a delayed add in `workqueue_retries_total`.
    pub(crate) fn record_retry(&self) {
        if let Some(metrics) = &self.shared.lock().metrics {
            metrics.retry();
        }
    }

    fn spawn_unfinished_work_updater(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                queue = %self.shared.name,
                "work queue created outside a Tokio runtime: unfinished-work metrics will not update"
            );
            return;
        };
        // The task holds a weak handle so that dropping every queue handle also ends it.
        let shared: Weak<Shared<T>> = Arc::downgrade(&self.shared);
        let shutdown = self.shared.shutdown.clone();
        runtime.spawn(async move {
            let mut ticker = tokio::time::interval(UNFINISHED_WORK_UPDATE_PERIOD);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = ticker.tick() => {}
                }
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                if let Some(metrics) = &shared.lock().metrics {
                    metrics.update_unfinished_work();
                }
            }
        });
    }

    /// Panics if the state invariants do not hold.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.shared.lock().check_invariants();
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Queue")
            .field("name", &self.shared.name)
            .field("len", &state.queue.len())
            .field("processing", &state.processing.len())
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic under the lock can only come from `T`'s `Hash`/`Eq`/`Clone` or from a metrics
        // implementation. It may leave that one item half-moved, but the queue stays memory-safe
        // and usable for every other item, which beats making every worker panic in turn.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What `get` should do, decided by `State::next`.
enum Next<T> {
    /// Hand out this item.
    Item(T),
    /// Return `None`: shut down (and, when draining, nothing left queued).
    ShutDown,
    /// Wait for an add.
    Wait,
}

/// What `State::done` did.
enum Done {
    /// The item had been added again while processing and is queued again.
    Requeued,
    /// The item is finished.
    Finished,
    /// The item was not being processed.
    NotProcessing,
}

impl<T: Clone + Eq + Hash> State<T> {
    /// Adds `item`; returns whether it was pushed to `queue` (and a waiter should be woken).
    fn add(&mut self, item: T) -> bool {
        if self.dirty.contains(&item) {
            return false;
        }
        if let Some(metrics) = &mut self.metrics {
            metrics.add(&item);
        }
        if self.processing.contains(&item) {
            self.dirty.insert(item);
            return false;
        }
        self.dirty.insert(item.clone());
        self.queue.push_back(item);
        true
    }

    /// Hands out the next item if there is one to hand out.
    fn next(&mut self) -> Next<T> {
        // Shut down without drain: stop at once, leaving queued items queued.
        if self.shutting_down && !self.drain {
            return Next::ShutDown;
        }
        match self.pop() {
            Some(item) => Next::Item(item),
            None if self.shutting_down => Next::ShutDown,
            None => Next::Wait,
        }
    }

    fn pop(&mut self) -> Option<T> {
        let item = self.queue.pop_front()?;
        if let Some(metrics) = &mut self.metrics {
            metrics.get(&item);
        }
        self.dirty.remove(&item);
        self.processing.insert(item.clone());
        Some(item)
    }

    fn done(&mut self, item: &T) -> Done {
        if !self.processing.remove(item) {
            return Done::NotProcessing;
        }
        if let Some(metrics) = &mut self.metrics {
            metrics.done(item);
        }
        if self.dirty.contains(item) {
            self.queue.push_back(item.clone());
            Done::Requeued
        } else {
            Done::Finished
        }
    }

    /// Nothing queued and nothing being processed: a drain is complete.
    fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.processing.is_empty()
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        let queued: HashSet<&T> = self.queue.iter().collect();
        assert_eq!(queued.len(), self.queue.len(), "an item is queued twice");
        let waiting: HashSet<&T> = self.dirty.difference(&self.processing).collect();
        assert!(queued == waiting, "queued items differ from dirty ∖ processing");
    }
}

#[cfg(test)]
mod tests;
