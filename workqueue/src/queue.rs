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
//! queue.add("default/redis"); // shutting down: ignored
//! let item = queue.get().await.unwrap(); // what was queued is still handed out...
//! assert_eq!(item, "default/nginx");
//! queue.done(&item);
//! assert_eq!(queue.get().await, None); // ...and once the queue is empty, workers stop
//! # }
//! ```
//!
//! # Shutdown
//! As client-go's: after [`shut_down`](Queue::shut_down) adds are ignored, but
//! [`get`](Queue::get) keeps handing out the items already queued, and returns `None` only once
//! nothing is queued, so workers that loop until `None` finish the accepted work.
//! [`shut_down_with_drain`](Queue::shut_down_with_drain) does the same and also waits until
//! every item is processed. To stop without processing what is queued, stop calling `get`.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::{MetricsProvider, QueueMetrics, UNFINISHED_WORK_UPDATE_PERIOD};
use crate::parking::{Get, Handout, Next, Parking, wake_one};
use crate::tasks::{OwnedTask, TaskPanicked, spawn_owned};

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
    /// Wakes `shut_down_with_drain` when the queue becomes idle or the drain is cancelled.
    drained: Notify,
    /// Cancelled on shutdown; stops the tasks serving this queue (metrics refresher, the
    /// delaying queue's timer).
    shutdown: CancellationToken,
    /// Those tasks, joined by `join_tasks` (see [`crate::tasks`]). Touched only when a task is
    /// spawned or joined, never on the hot path.
    tasks: Mutex<Vec<OwnedTask>>,
}

/// The queue proper, reachable only through `Shared::lock`.
///
/// client-go keeps two sets, `dirty` (needs processing) and `processing` (in a worker's hands).
/// Here each item present has one [`Ticket`] instead, and whether it is queued or being processed
/// follows from its ticket and `popped`, so that `get` needs no hash lookup at all: of the three
/// lookups client-go makes per item (add, get, done), we make two.
///
/// Invariants:
/// - `queue[i]` is the item whose ticket position is `popped + i`, and no other item has a
///   position `>= popped`: the items in `queue` are exactly the queued ones, each once, in the
///   order they were (re-)queued, so they are handed out FIFO.
/// - An item with a position `< popped` has been handed out by `get` and not yet `done`: it is in
///   one worker's hands, and since only popping hands items out, in no other worker's.
/// - `dirty` is set only on items being processed: added again meanwhile, `done` queues them again.
/// - Once `shutting_down`, no item enters `items`: adds are ignored. Items already queued are
///   still handed out (and items dirty when it began are requeued by `done`), so `items` only
///   shrinks from then on.
/// - A `get` parks (enters `parking`) only under the lock and only when it found nothing to hand
///   out; every push to `queue` unparks the oldest parked `get` (see [`crate::parking`]).
struct State<T> {
    queue: VecDeque<T>,
    /// How many items were ever popped from `queue`.
    popped: u64,
    /// Every item that is queued or being processed. Hashed with foldhash: keys are hashed
    /// twice per item (add, done), and SipHash was a third of the queue's own time. Keys come
    /// from our own handlers, not from an adversary, so HashDoS resistance is not needed.
    items: HashMap<T, Ticket, foldhash::fast::RandomState>,
    shutting_down: bool,
    /// Set by `shut_down_with_drain`, cleared by `shut_down` (client-go's `drain`): whether a
    /// drain is being waited for. `get` behaves the same either way.
    drain: bool,
    metrics: Option<QueueMetrics<T>>,
    /// `get` calls waiting for an item.
    parking: Parking,
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
    /// unfinished-work gauges every 500 ms, until shutdown or until the last handle is dropped
    /// (see [`join_tasks`](Self::join_tasks)).
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
                    popped: 0,
                    items: HashMap::default(),
                    shutting_down: false,
                    drain: false,
                    metrics,
                    parking: Parking::new(),
                }),
                drained: Notify::new(),
                shutdown: CancellationToken::new(),
                tasks: Mutex::new(Vec::new()),
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
    /// queued again when [`done`](Self::done) is called). Ignored once the queue is shutting
    /// down.
    pub fn add(&self, item: T) {
        if self.try_add(item).is_err() {
            tracing::debug!(queue = %self.shared.name, "work queue shutting down, dropping added item");
        }
    }

    /// Adds `item` as [`add`](Self::add) does, or gives it back if the queue is shutting down.
    pub(crate) fn try_add(&self, item: T) -> Result<(), T> {
        let mut state = self.shared.lock();
        if state.shutting_down {
            return Err(item);
        }
        if state.add(item) {
            wake_one(state);
        }
        Ok(())
    }

    /// Waits for an item and hands it out; the caller must call [`done`](Self::done) with it.
    ///
    /// Returns `None` once the queue is shutting down and nothing is queued (client-go's `Get`
    /// returning `shutdown = true`): after either kind of shutdown, the items still queued are
    /// handed out first. A `get` waiting when the queue shuts down returns `None`. Items being
    /// processed do not count: a worker gets `None` while another still holds an item, and if
    /// that item was added again before the shutdown, its `done` queues it again for the worker
    /// still looping.
    ///
    /// Cancel safe: dropping the future takes nothing from the queue.
    pub async fn get(&self) -> Option<T> {
        Get::new(&self.shared.state).await
    }

    /// Marks `item`, handed out by [`get`](Self::get), as processed.
    ///
    /// If it was added again meanwhile, it is queued again now. Calling `done` for an item that
    /// is not being processed does nothing (client-go would queue it a second time).
    pub fn done(&self, item: &T) {
        let mut state = self.shared.lock();
        match state.done(item) {
            Done::Requeued => wake_one(state),
            // Only a drain waits for idleness (`shut_down` wakes it separately).
            Done::Finished if state.drain && state.is_idle() => {
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

    /// Shuts the queue down without waiting (client-go's `ShutDown`): later adds are ignored,
    /// [`get`](Self::get) keeps handing out the items already queued and returns `None` once
    /// none is left, and items being processed may still be marked [`done`](Self::done).
    ///
    /// Cancels a pending [`shut_down_with_drain`](Self::shut_down_with_drain), which then
    /// returns (client-go's way to force a shutdown on a second signal). Workers that must not
    /// process what is still queued have to stop calling `get` themselves.
    pub fn shut_down(&self) {
        self.shut_down_inner(false);
    }

    /// Shuts the queue down as [`shut_down`](Self::shut_down) does, then waits until it is
    /// drained: until nothing is queued or being processed.
    ///
    /// Workers must keep calling [`get`](Self::get) and [`done`](Self::done) until `get` returns
    /// `None`, or this returns only when [`shut_down`](Self::shut_down) cancels the wait.
    /// client-go's `ShutDownWithDrain` waits only for the items being processed, so it can
    /// return between one worker's `Done` and its next `Get` while items are still queued; here
    /// queued items count as unfinished work too, so that when this returns, every item the
    /// queue accepted has been processed.
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

    /// Every item accepted and not yet finished: queued, being processed, or added again while
    /// being processed. After shutdown and once the workers stopped, these are the items the
    /// queue accepted that no worker finished: a controller reports them as dropped.
    pub fn unfinished(&self) -> Vec<T> {
        self.shared.lock().items.keys().cloned().collect()
    }

    /// Whether the queue is shutting down (or shut down).
    pub fn shutting_down(&self) -> bool {
        self.shared.lock().shutting_down
    }

    fn shut_down_inner(&self, drain: bool) {
        let parked = {
            let mut state = self.shared.lock();
            state.shutting_down = true;
            state.drain = drain;
            state.parking.unpark_all()
        };
        tracing::debug!(queue = %self.shared.name, drain, "shutting down work queue");
        self.shared.shutdown.cancel();
        for waker in parked {
            waker.wake();
        }
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
        let task = spawn_owned(
            &runtime,
            self.shared.name.clone(),
            "unfinished-work metrics",
            async move {
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
            },
        );
        self.own_task(task);
    }

    /// Keeps `task` (spawned to serve this queue, ending at shutdown) for `join_tasks`.
    pub(crate) fn own_task(&self, task: OwnedTask) {
        self.shared.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }

    /// Waits for the tasks this queue spawned (a named queue's metrics refresher, a delaying
    /// queue's timer) to end, and reports the first that panicked (each panic was also logged at
    /// ERROR when it happened). They end at [`shut_down`](Self::shut_down), so call it after
    /// that: before, it waits until then. Joins each task once; a later call returns `Ok` at once.
    pub async fn join_tasks(&self) -> Result<(), TaskPanicked> {
        let tasks = std::mem::take(&mut *self.shared.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        crate::tasks::join(&self.shared.name, tasks).await
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
            .field("processing", &(state.items.len() - state.queue.len()))
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}

/// The last handle is gone: stop the tasks serving the queue now rather than at their next tick.
impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        crate::parking::lock(&self.state)
    }
}

/// An item's place in the queue's history.
#[derive(Clone, Copy, Debug)]
struct Ticket {
    /// The item was the `position`-th push to `State::queue` ever. Because the queue is FIFO, it
    /// is still queued iff `position >= State::popped`.
    position: u64,
    /// Added again while being processed (never set while queued).
    dirty: bool,
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
        let popped = self.popped;
        let next_position = self.next_position();
        match self.items.entry(item) {
            Entry::Occupied(mut entry) => {
                let ticket = *entry.get();
                if ticket.position >= popped || ticket.dirty {
                    return false; // already queued, or already to be queued again
                }
                if let Some(metrics) = &mut self.metrics {
                    metrics.add(entry.key());
                }
                entry.get_mut().dirty = true;
                false
            }
            Entry::Vacant(entry) => {
                if let Some(metrics) = &mut self.metrics {
                    metrics.add(entry.key());
                }
                self.queue.push_back(entry.key().clone());
                entry.insert(Ticket {
                    position: next_position,
                    dirty: false,
                });
                true
            }
        }
    }

    fn pop(&mut self) -> Option<T> {
        let item = self.queue.pop_front()?;
        // Its ticket position is now below `popped`: it is being processed.
        self.popped += 1;
        if let Some(metrics) = &mut self.metrics {
            metrics.get(&item);
        }
        Some(item)
    }

    fn done(&mut self, item: &T) -> Done {
        // One lookup on the common path: remove, and put back only if the item stays.
        let Some((item, ticket)) = self.items.remove_entry(item) else {
            return Done::NotProcessing;
        };
        if ticket.position >= self.popped {
            self.items.insert(item, ticket); // queued, not being processed
            return Done::NotProcessing;
        }
        if let Some(metrics) = &mut self.metrics {
            metrics.done(&item);
        }
        if !ticket.dirty {
            return Done::Finished;
        }
        let ticket = Ticket {
            position: self.next_position(),
            dirty: false,
        };
        self.queue.push_back(item.clone());
        self.items.insert(item, ticket);
        Done::Requeued
    }

    /// The position the next push to `queue` gets.
    fn next_position(&self) -> u64 {
        self.popped + self.queue.len() as u64
    }

    /// Nothing queued and nothing being processed: a drain is complete.
    fn is_idle(&self) -> bool {
        self.items.is_empty()
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        for (offset, item) in self.queue.iter().enumerate() {
            let ticket = self.items.get(item).expect("a queued item has no ticket");
            assert_eq!(ticket.position, self.popped + offset as u64, "queue order");
            assert!(!ticket.dirty, "a queued item is marked dirty");
        }
        let queued = self
            .items
            .values()
            .filter(|ticket| ticket.position >= self.popped)
            .count();
        assert_eq!(queued, self.queue.len(), "an item claims to be queued but is not");
    }
}

impl<T: Clone + Eq + Hash> Handout for State<T> {
    type Item = T;

    fn parking(&mut self) -> &mut Parking {
        &mut self.parking
    }

    fn next(&mut self) -> Next<T> {
        match self.pop() {
            Some(item) => Next::Item(item),
            None if self.shutting_down => Next::ShutDown,
            None => Next::Wait,
        }
    }

    fn has_ready(&self) -> bool {
        !self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests;
