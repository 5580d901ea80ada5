//! A rate-limiting work queue that hands out the highest priority first (controller-runtime's
//! `priorityqueue`).
//!
//! Where it sits: between a controller's event handlers and its workers, in place of a
//! [`RateLimitingQueue`](crate::RateLimitingQueue). After a restart every cached object is
//! enqueued by the informer's initial list; the controller adds those keys at a low priority, so a
//! key added because its object really changed (priority 0) is reconciled next instead of behind
//! the whole backlog.
//!
//! The rules, controller-runtime's:
//! - Every item carries a priority (`i32`, higher first); items of one priority leave in the order
//!   they became ready (FIFO within a priority).
//! - An item is queued at most once. Adding one already queued keeps the *highest* of the two
//!   priorities and the *earliest* of the two ready times. Raised to a higher priority, it joins
//!   the back of that priority's line (FIFO among the items of its new priority).
//! - [`add_with_opts`](PriorityQueue::add_with_opts) with a delay or rate-limited (the rate
//!   limiter's wait, or the given delay if shorter) lands at its priority when due, behind the
//!   items of that priority already ready.
//! - One worker per item: an item handed out by [`get`](PriorityQueue::get) and added again before
//!   [`done`](PriorityQueue::done) waits, at the priority it was added with, until `done`; its place
//!   in line is the one it was added at.
//! - Shutdown and drain are the plain [`Queue`](crate::Queue)'s (see [`queue`](mod@crate::queue#shutdown)):
//!   adds are then ignored, items waiting for their time are dropped (still listed by
//!   [`unfinished`](PriorityQueue::unfinished)), items already ready are still handed out.
//! - Metrics are the plain queue's, with `workqueue_depth` by priority (see [`metrics`](crate::metrics)).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use workqueue::{AddOpts, PriorityQueue, default_controller_rate_limiter};
//!
//! let queue = PriorityQueue::new(default_controller_rate_limiter());
//! for key in ["default/a", "default/b"] {
//!     queue.add_with_opts(key, AddOpts::default().priority(-100)); // initial list
//! }
//! queue.add("default/changed"); // a real change: priority 0
//! assert_eq!(queue.get_with_priority().await, Some(("default/changed", 0)));
//! assert_eq!(queue.get_with_priority().await, Some(("default/a", -100)));
//! # }
//! ```
//!
//! # Differences from controller-runtime
//! controller-runtime hands items to workers from a goroutine of its own and buffers adds; here
//! `get` takes the first ready item under the queue's lock, and an add is visible at once (no
//! buffer), so `len` right after `add` counts it. An item already waiting for its time that is
//! added again without a delay becomes ready at the back of its priority (controller-runtime
//! keeps the place it was first added at); every item that becomes ready joins the back, as
//! controller-runtime's timer does. `shut_down_with_drain` waits as the plain queue's does
//! (controller-runtime's only shuts down).

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::default_rate_limiters::RateLimiter;
use crate::metrics::{QueueMetrics, UNFINISHED_WORK_UPDATE_PERIOD};
use crate::parking::{Get, Handout, Next, Parking, wake_one};
use crate::queue::QueueConfig;
use crate::tasks::{OwnedTask, TaskPanicked, spawn_owned};

/// Stand-in deadline for delays too large to add to `Instant::now()` (as the delaying queue's).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// How to add an item to a [`PriorityQueue`] (controller-runtime's `priorityqueue.AddOpts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AddOpts {
    /// Add it once this has passed (zero: now).
    pub after: Duration,
    /// Add it after the wait the rate limiter asks for (recording a failure of it), or after
    /// [`after`](Self::after) if that is shorter and not zero.
    pub rate_limited: bool,
    /// Its priority, higher first; `None` is 0.
    pub priority: Option<i32>,
}

impl AddOpts {
    /// Adds once `after` has passed.
    #[must_use]
    pub fn after(mut self, after: Duration) -> Self {
        self.after = after;
        self
    }

    /// Adds after the rate limiter's wait.
    #[must_use]
    pub fn rate_limited(mut self) -> Self {
        self.rate_limited = true;
        self
    }

    /// Adds at `priority`.
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }
}

/// A deduplicating, rate-limiting work queue ordered by priority (controller-runtime's
/// `PriorityQueue`). See the [module docs](self).
///
/// A cheaply cloneable handle; clones share the queue and the rate limiter. Creating one spawns
/// its timer task (and a named queue's metrics task), which end at shutdown or when the last
/// handle is dropped; [`join_tasks`](Self::join_tasks) waits for them.
pub struct PriorityQueue<T> {
    shared: Arc<Shared<T>>,
    rate_limiter: Arc<dyn RateLimiter<T>>,
    /// Dropping the last handle stops the queue's tasks (but does not shut the queue down).
    _stop_tasks: Arc<DropGuard>,
}

impl<T> Clone for PriorityQueue<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            rate_limiter: Arc::clone(&self.rate_limiter),
            _stop_tasks: Arc::clone(&self._stop_tasks),
        }
    }
}

struct Shared<T> {
    /// `""` for an unnamed queue.
    name: String,
    state: Mutex<State<T>>,
    /// Wakes `shut_down_with_drain` when the queue becomes idle or the drain is cancelled.
    drained: Notify,
    /// Wakes the timer task when the earliest waiting item changed.
    earliest_changed: Notify,
    /// Cancelled on shutdown: stops the timer and metrics tasks.
    shutdown: CancellationToken,
    tasks: Mutex<Vec<OwnedTask>>,
}

/// The queue proper, reachable only through `Shared::lock`.
///
/// Every item present has one [`Item`] in `items`; where else it is follows from it:
/// - queued with a ready time (`Queued::ready_at` is `Some(t)`): in `waiting` under
///   `(t, counter)`, and nowhere else;
/// - queued, ready, not being processed: *live* in `ready`, as `(counter, item)` in the line of
///   its priority (`ready[Reverse(priority)]`), so the first live entry of the first line is the
///   highest priority's oldest item;
/// - queued, ready, and being processed (added again while a worker holds it): live in neither
///   map, *held*; `done` puts it into its line at the place (counter) it was added with;
/// - being processed and not queued: live in neither map.
///
/// A line is one `VecDeque` per priority (priorities are few), sorted by counter: adds push to
/// its back, `get` pops its front. An entry is live iff the item's [`Item`] says it is queued,
/// ready, not processing, at that priority with that counter; an item raised to a higher
/// priority leaves a *stale* entry in its old line (not removed from the middle of the line),
/// skipped by `get` and swept from a line whose stale entries outnumber its live ones.
///
/// Further invariants: `processing` counts the items with `Item::processing`; `ready_len` and
/// each `Line::live` count the live entries; counters are unique (`next_counter` only grows), so
/// no two entries share a key; once `shutting_down`, no item enters `items` and nothing moves
/// from `waiting` to `ready` (waiting items are dropped, but stay in `items` so `unfinished`
/// lists them).
///
/// Waking `get`s is the plain [`Queue`](crate::Queue)'s (see [`crate::parking`]): a `get` parks
/// (enters `parking`) only under the lock and only when it found nothing ready; every item made
/// ready unparks the oldest parked `get`.
struct State<T> {
    items: HashMap<T, Item, foldhash::fast::RandomState>,
    ready: BTreeMap<Reverse<i32>, Line<T>>,
    /// Live entries in `ready`.
    ready_len: usize,
    waiting: BTreeMap<(Instant, u64), T>,
    next_counter: u64,
    processing: usize,
    shutting_down: bool,
    /// Set by `shut_down_with_drain`, cleared by `shut_down`.
    drain: bool,
    metrics: Option<QueueMetrics<T>>,
    /// `get` calls waiting for an item.
    parking: Parking,
}

/// The ready items of one priority, by counter (see [`State`]).
struct Line<T> {
    entries: VecDeque<(u64, T)>,
    /// How many of `entries` are live (the others are stale).
    live: usize,
}

impl<T> Default for Line<T> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            live: 0,
        }
    }
}

/// Empty lines kept in `State::ready` (so that a queue that keeps emptying does not reallocate
/// its lines); past this many lines, empty ones are dropped.
const KEPT_LINES: usize = 8;

/// A line's stale entries are swept once they are more than this many and more than its live ones.
const MIN_STALE_SWEEP: usize = 32;

/// Whether the entry `(counter, item)` of the line of `priority` is live (see [`State`]).
fn is_live(entry: Option<&Item>, priority: i32, counter: u64) -> bool {
    entry.is_some_and(|entry| {
        !entry.processing
            && entry.queued
                == Some(Queued {
                    priority,
                    counter,
                    ready_at: None,
                })
    })
}

/// One item's state.
#[derive(Clone, Copy, Debug)]
struct Item {
    /// Handed out by `get` and not yet `done`.
    processing: bool,
    /// Whether (and how) it is queued.
    queued: Option<Queued>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Queued {
    priority: i32,
    /// Its place in line: among items of one priority, the lower leaves first.
    counter: u64,
    /// `None`: ready.
    ready_at: Option<Instant>,
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> PriorityQueue<T> {
    /// Creates an unnamed queue without metrics, retrying as `rate_limiter` says.
    ///
    /// # Panics
    /// Outside a Tokio runtime, since it spawns the timer task.
    pub fn new(rate_limiter: impl RateLimiter<T> + 'static) -> Self {
        Self::with_config(rate_limiter, QueueConfig::default())
    }

    /// Creates a queue from `config`, retrying as `rate_limiter` says. A named queue with a
    /// metrics provider records client-go's metrics, its depth by priority.
    ///
    /// # Panics
    /// Outside a Tokio runtime, since it spawns the timer task.
    pub fn with_config(rate_limiter: impl RateLimiter<T> + 'static, config: QueueConfig) -> Self {
        Self::with_boxed_config(Arc::new(rate_limiter), config)
    }

    /// As [`with_config`](Self::with_config), with a shared rate limiter.
    ///
    /// # Panics
    /// Outside a Tokio runtime, since it spawns the timer task.
    pub fn with_boxed_config(rate_limiter: Arc<dyn RateLimiter<T>>, config: QueueConfig) -> Self {
        let name = config.name.unwrap_or_default();
        let metrics = match &config.metrics_provider {
            Some(provider) if !name.is_empty() => Some(QueueMetrics::with_priorities(&**provider, &name)),
            _ => None,
        };
        let has_metrics = metrics.is_some();
        let shared = Arc::new(Shared {
            name,
            state: Mutex::new(State {
                items: HashMap::default(),
                ready: BTreeMap::new(),
                ready_len: 0,
                waiting: BTreeMap::new(),
                next_counter: 0,
                processing: 0,
                shutting_down: false,
                drain: false,
                metrics,
                parking: Parking::new(),
            }),
            drained: Notify::new(),
            earliest_changed: Notify::new(),
            shutdown: CancellationToken::new(),
            tasks: Mutex::new(Vec::new()),
        });
        // Cancelled by shutdown (parent) or by dropping the last handle.
        let stop = shared.shutdown.child_token();
        let runtime = tokio::runtime::Handle::current();
        // The tasks hold weak handles so that dropping every queue handle also ends them.
        let timer = spawn_owned(
            &runtime,
            shared.name.clone(),
            "priority queue timer",
            waiting_loop(Arc::clone(&shared), stop.clone()),
        );
        shared.own_task(timer);
        if has_metrics {
            let task = spawn_owned(
                &runtime,
                shared.name.clone(),
                "unfinished-work metrics",
                unfinished_work_loop(Arc::downgrade(&shared), stop.clone()),
            );
            shared.own_task(task);
        }
        Self {
            shared,
            rate_limiter,
            _stop_tasks: Arc::new(stop.drop_guard()),
        }
    }

    /// Adds `item` now at priority 0. See [`add_with_opts`](Self::add_with_opts).
    pub fn add(&self, item: T) {
        self.add_with_opts(item, AddOpts::default());
    }

    /// Adds `item` now at `priority`.
    pub fn add_with_priority(&self, item: T, priority: i32) {
        self.add_with_opts(item, AddOpts::default().priority(priority));
    }

    /// Adds `item` at priority 0 once `delay` has passed. Counted in `workqueue_retries_total`
    /// unless the delay is zero.
    pub fn add_after(&self, item: T, delay: Duration) {
        self.add_with_opts(item, AddOpts::default().after(delay));
    }

    /// Adds `item` at priority 0 after the wait its rate limiter asks for, recording a failure.
    pub fn add_rate_limited(&self, item: T) {
        self.add_with_opts(item, AddOpts::default().rate_limited());
    }

    /// Adds `item` as `opts` say (controller-runtime's `AddWithOpts`): merged with the item if
    /// it is already queued (the highest priority, the earliest ready time), held until
    /// [`done`](Self::done) if it is being processed. Ignored once the queue is shutting down.
    pub fn add_with_opts(&self, item: T, opts: AddOpts) {
        // The token is cancelled right after the flag is set (checked again under the lock).
        if self.shared.shutdown.is_cancelled() {
            tracing::debug!(queue = %self.shared.name, "work queue shutting down, dropping added item");
            return;
        }
        let mut after = opts.after;
        if opts.rate_limited {
            // Outside the lock: the limiter has locks of its own.
            let limited = self.rate_limiter.when(&item);
            if after.is_zero() || limited < after {
                after = limited;
            }
        }
        let ready_at = (!after.is_zero()).then(|| {
            let now = Instant::now();
            now.checked_add(after).unwrap_or(now + FAR_FUTURE)
        });
        let priority = opts.priority.unwrap_or(0);
        let mut state = self.shared.lock();
        if state.shutting_down {
            return;
        }
        let added = state.add(item, priority, ready_at);
        if added.ready {
            wake_one(state);
        } else {
            drop(state);
        }
        if added.earliest_changed {
            self.shared.earliest_changed.notify_one();
        }
    }

    /// Waits for an item and hands it out; the caller must call [`done`](Self::done) with it.
    /// See [`get_with_priority`](Self::get_with_priority).
    pub async fn get(&self) -> Option<T> {
        self.get_with_priority().await.map(|(item, _)| item)
    }

    /// Waits for the ready item of highest priority (the oldest of that priority) and hands it
    /// out with its priority; the caller must call [`done`](Self::done) with it.
    ///
    /// Returns `None` once the queue is shutting down and nothing ready is left, as
    /// [`Queue::get`](crate::Queue::get) does. Cancel safe: dropping the future takes nothing
    /// from the queue, and a wake-up it received passes to another `get`.
    pub async fn get_with_priority(&self) -> Option<(T, i32)> {
        Get::new(&self.shared.state).await
    }

    /// Marks `item`, handed out by `get`, as processed. If it was added again meanwhile (without
    /// a delay, or its delay passed), it is ready again now, at the priority and place it was
    /// added with. Calling `done` for an item that is not being processed does nothing.
    pub fn done(&self, item: &T) {
        let mut state = self.shared.lock();
        match state.done(item) {
            Done::Requeued => wake_one(state),
            Done::Finished if state.drain && state.is_idle() => {
                drop(state);
                self.shared.drained.notify_waiters();
            }
            Done::Finished | Done::NotProcessing => {}
        }
    }

    /// Resets `item`'s backoff: call it when the item succeeded or is given up on.
    pub fn forget(&self, item: &T) {
        self.rate_limiter.forget(item);
    }

    /// How many times `item` was rate-limited since it was last forgotten.
    pub fn num_requeues(&self, item: &T) -> usize {
        self.rate_limiter.num_requeues(item)
    }

    /// Number of items ready to be handed out (not those waiting for their time, being
    /// processed, or held until their `done`).
    pub fn len(&self) -> usize {
        self.shared.lock().ready_len
    }

    /// Whether no item is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of items ready to be handed out at each priority, highest first.
    pub fn len_by_priority(&self) -> Vec<(i32, usize)> {
        let state = self.shared.lock();
        state
            .ready
            .iter()
            .filter(|(_, line)| line.live > 0)
            .map(|(Reverse(priority), line)| (*priority, line.live))
            .collect()
    }

    /// Shuts the queue down without waiting: later adds are ignored, items waiting for their
    /// time are dropped, and [`get`](Self::get) keeps handing out the ready items until none is
    /// left. Cancels a pending [`shut_down_with_drain`](Self::shut_down_with_drain).
    pub fn shut_down(&self) {
        self.shut_down_inner(false);
    }

    /// Shuts the queue down as [`shut_down`](Self::shut_down) does, then waits until nothing is
    /// ready or being processed. Workers must keep calling `get` and `done` until `get` returns
    /// `None`. See [`Queue::shut_down_with_drain`](crate::Queue::shut_down_with_drain).
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

    /// Every item accepted and not yet finished: ready, waiting for its time, being processed,
    /// or held. After shutdown and once the workers stopped, these are the items the queue
    /// accepted that no worker finished.
    pub fn unfinished(&self) -> Vec<T> {
        self.shared.lock().items.keys().cloned().collect()
    }

    /// Waits for the queue's tasks (its timer, a named queue's metrics task) to end after
    /// [`shut_down`](Self::shut_down); the first that panicked, if any. See
    /// [`Queue::join_tasks`](crate::Queue::join_tasks).
    pub async fn join_tasks(&self) -> Result<(), TaskPanicked> {
        let tasks = std::mem::take(&mut *self.shared.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        crate::tasks::join(&self.shared.name, tasks).await
    }

    fn shut_down_inner(&self, drain: bool) {
        let parked = {
            let mut state = self.shared.lock();
            state.shutting_down = true;
            state.drain = drain;
            state.parking.unpark_all()
        };
        tracing::debug!(queue = %self.shared.name, drain, "shutting down priority work queue");
        self.shared.shutdown.cancel();
        for waker in parked {
            waker.wake();
        }
        self.shared.drained.notify_waiters();
    }

    /// Panics if the state invariants do not hold.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.shared.lock().check_invariants();
    }

    /// Number of items waiting for their ready time.
    #[cfg(test)]
    pub(crate) fn waiting_len(&self) -> usize {
        self.shared.lock().waiting.len()
    }
}

impl<T> fmt::Debug for PriorityQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("PriorityQueue")
            .field("name", &self.shared.name)
            .field("ready", &state.ready_len)
            .field("waiting", &state.waiting.len())
            .field("processing", &state.processing)
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        crate::parking::lock(&self.state)
    }

    fn own_task(&self, task: OwnedTask) {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }
}

/// The timer task: moves items whose time has come to `ready`, then sleeps until the next ready
/// time or until an earlier item arrives. Stops at shutdown (the waiting items are dropped) or
/// when the last handle is gone.
async fn waiting_loop<T: Clone + Eq + Hash>(shared: Arc<Shared<T>>, stop: CancellationToken) {
    // Holding the queue is fine: dropping the last handle cancels `stop`.
    loop {
        let mut earliest_changed = pin!(shared.earliest_changed.notified());
        earliest_changed.as_mut().enable();
        let (wakers, next) = {
            let mut state = shared.lock();
            let (moved, next) = state.move_ready(Instant::now());
            (state.parking.unpark(moved), next)
        };
        for waker in wakers {
            waker.wake();
        }
        let sleep = tokio::time::sleep_until(next.unwrap_or_else(|| Instant::now() + FAR_FUTURE));
        tokio::select! {
            () = stop.cancelled() => break,
            () = earliest_changed => {}
            () = sleep => {}
        }
    }
    tracing::debug!(queue = %shared.name, "priority queue timer stopped");
}

/// Refreshes a named queue's unfinished-work gauges every 500 ms (see [`crate::metrics`]).
async fn unfinished_work_loop<T: Clone + Eq + Hash>(shared: Weak<Shared<T>>, stop: CancellationToken) {
    let mut ticker = tokio::time::interval(UNFINISHED_WORK_UPDATE_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let Some(shared) = shared.upgrade() else { return };
        if let Some(metrics) = &shared.lock().metrics {
            metrics.update_unfinished_work();
        }
    }
}

/// What `State::add` changed.
struct Added {
    /// An item became ready to hand out: wake a `get`.
    ready: bool,
    /// The earliest waiting time changed: re-arm the timer.
    earliest_changed: bool,
}

/// What `State::done` did.
enum Done {
    /// The item was held and is ready again.
    Requeued,
    /// The item is finished (or waits for its time).
    Finished,
    /// The item was not being processed.
    NotProcessing,
}

impl<T: Clone + Eq + Hash> State<T> {
    fn counter(&mut self) -> u64 {
        let counter = self.next_counter;
        self.next_counter += 1;
        counter
    }

    fn earliest(&self) -> Option<Instant> {
        self.waiting.first_key_value().map(|((at, _), _)| *at)
    }

    /// Puts `item` into the line of `priority` at `counter`'s place (the back, unless `done`
    /// requeues a held item at the place it was added at). The caller makes its [`Item`] say so.
    fn push_ready(&mut self, priority: i32, counter: u64, item: T) {
        let line = self.ready.entry(Reverse(priority)).or_default();
        match line.entries.back() {
            Some((last, _)) if *last > counter => {
                let at = line.entries.partition_point(|(other, _)| *other < counter);
                line.entries.insert(at, (counter, item));
            }
            _ => line.entries.push_back((counter, item)),
        }
        line.live += 1;
        self.ready_len += 1;
    }

    /// The live entry `(priority, counter)` is about to go stale (its item is raised to another
    /// priority; the caller updates its [`Item`]). Sweeps the line if stale entries dominate it.
    fn unready(&mut self, priority: i32, counter: u64) {
        let Some(line) = self.ready.get_mut(&Reverse(priority)) else {
            return;
        };
        line.live -= 1;
        self.ready_len -= 1;
        let stale = line.entries.len() - line.live;
        if stale > MIN_STALE_SWEEP && stale > line.live {
            let items = &self.items;
            line.entries
                .retain(|(other, item)| *other != counter && is_live(items.get(item), priority, *other));
        }
    }

    /// Adds `item` at `priority`, ready now (`ready_at` `None`) or at `ready_at`.
    fn add(&mut self, item: T, priority: i32, ready_at: Option<Instant>) -> Added {
        let mut added = Added {
            ready: false,
            earliest_changed: false,
        };
        if ready_at.is_some()
            && let Some(metrics) = &self.metrics
        {
            metrics.retry();
        }
        let earliest_before = self.earliest();
        let counter = self.counter();
        // The common case, an item not present: one lookup.
        let item = match self.items.entry(item) {
            Entry::Vacant(vacant) => {
                let item = vacant.key().clone();
                vacant.insert(Item {
                    processing: false,
                    queued: Some(Queued {
                        priority,
                        counter,
                        ready_at,
                    }),
                });
                match ready_at {
                    Some(at) => {
                        self.waiting.insert((at, counter), item);
                    }
                    None => {
                        if let Some(metrics) = &mut self.metrics {
                            metrics.add_at(&item, priority);
                        }
                        self.push_ready(priority, counter, item);
                        added.ready = true;
                    }
                }
                added.earliest_changed = self.earliest() != earliest_before;
                return added;
            }
            Entry::Occupied(occupied) => (occupied.key().clone(), *occupied.get()),
        };
        let (item, mut entry) = item;
        let new = match entry.queued {
            // New, or being processed and not yet added again.
            None => {
                let queued = Queued {
                    priority,
                    counter,
                    ready_at,
                };
                match ready_at {
                    Some(at) => {
                        self.waiting.insert((at, counter), item.clone());
                    }
                    None => {
                        if let Some(metrics) = &mut self.metrics {
                            metrics.add_at(&item, priority);
                        }
                        if !entry.processing {
                            self.push_ready(priority, counter, item.clone());
                            added.ready = true;
                        }
                    }
                }
                queued
            }
            Some(old) => self.merge(&item, entry.processing, old, priority, ready_at, counter, &mut added),
        };
        entry.queued = Some(new);
        self.items.insert(item, entry);
        added.earliest_changed = self.earliest() != earliest_before;
        added
    }

    /// Merges an add (`priority`, `ready_at`, a fresh `counter`) into the queued `old`: the
    /// higher priority, the earlier ready time; moves the entry in `ready`/`waiting` to match.
    #[allow(clippy::too_many_arguments)]
    fn merge(
        &mut self,
        item: &T,
        processing: bool,
        old: Queued,
        priority: i32,
        ready_at: Option<Instant>,
        counter: u64,
        added: &mut Added,
    ) -> Queued {
        let raised = priority > old.priority;
        let priority = old.priority.max(priority);
        match (old.ready_at, ready_at) {
            // Ready, stays ready: moves only if raised, to the back of its new priority.
            (None, _) => {
                if !raised {
                    return old;
                }
                if let Some(metrics) = &self.metrics {
                    metrics.reprioritize(old.priority, priority);
                }
                if !processing {
                    self.unready(old.priority, old.counter);
                    self.push_ready(priority, counter, item.clone());
                }
                Queued {
                    priority,
                    counter,
                    ready_at: None,
                }
            }
            // Waiting, now ready: joins the back of its priority.
            (Some(at), None) => {
                self.waiting.remove(&(at, old.counter));
                if let Some(metrics) = &mut self.metrics {
                    metrics.add_at(item, priority);
                }
                if !processing {
                    self.push_ready(priority, counter, item.clone());
                    added.ready = true;
                }
                Queued {
                    priority,
                    counter,
                    ready_at: None,
                }
            }
            // Waiting, still waiting: the earlier time.
            (Some(at), Some(new_at)) => {
                if new_at >= at {
                    return Queued { priority, ..old };
                }
                self.waiting.remove(&(at, old.counter));
                self.waiting.insert((new_at, old.counter), item.clone());
                Queued {
                    priority,
                    counter: old.counter,
                    ready_at: Some(new_at),
                }
            }
        }
    }

    /// Takes the first live entry of the first line with one, marking its item processing.
    fn pop_ready(&mut self) -> Option<(T, i32)> {
        if self.ready_len == 0 {
            return None;
        }
        let items = &mut self.items;
        let mut found = None;
        for (Reverse(priority), line) in &mut self.ready {
            if line.live == 0 {
                line.entries.clear();
                continue;
            }
            while let Some((counter, item)) = line.entries.pop_front() {
                let Some(entry) = items.get_mut(&item) else { continue };
                if !is_live(Some(entry), *priority, counter) {
                    continue;
                }
                entry.processing = true;
                entry.queued = None;
                line.live -= 1;
                found = Some((item, *priority));
                break;
            }
            break;
        }
        let found = found?;
        self.ready_len -= 1;
        if self.ready.len() > KEPT_LINES {
            self.ready.retain(|_, line| line.live > 0);
        }
        Some(found)
    }

    fn done(&mut self, item: &T) -> Done {
        // One lookup on the common path: remove, and put back only if the item stays.
        let Some((item, mut entry)) = self.items.remove_entry(item) else {
            return Done::NotProcessing;
        };
        if !entry.processing {
            self.items.insert(item, entry);
            return Done::NotProcessing;
        }
        self.processing -= 1;
        if let Some(metrics) = &mut self.metrics {
            metrics.done(&item);
        }
        let Some(queued) = entry.queued else {
            return Done::Finished;
        };
        entry.processing = false;
        if queued.ready_at.is_some() {
            self.items.insert(item, entry);
            return Done::Finished;
        }
        self.items.insert(item.clone(), entry);
        self.push_ready(queued.priority, queued.counter, item);
        Done::Requeued
    }

    /// Moves the items whose time has come (at `now`) to `ready`; returns how many became
    /// gettable and the next ready time. Nothing moves once shutting down.
    fn move_ready(&mut self, now: Instant) -> (usize, Option<Instant>) {
        if self.shutting_down {
            return (0, None);
        }
        let mut moved = 0;
        while let Some(entry) = self.waiting.first_entry()
            && entry.key().0 <= now
        {
            let item = entry.remove();
            let counter = self.counter();
            let Some(state) = self.items.get_mut(&item) else {
                continue;
            };
            let Some(queued) = &mut state.queued else { continue };
            queued.ready_at = None;
            queued.counter = counter;
            let (priority, processing) = (queued.priority, state.processing);
            if let Some(metrics) = &mut self.metrics {
                metrics.add_at(&item, priority);
            }
            if !processing {
                self.push_ready(priority, counter, item);
                moved += 1;
            }
        }
        (moved, self.earliest())
    }

    /// Nothing ready and nothing being processed: a drain is complete.
    fn is_idle(&self) -> bool {
        self.ready_len == 0 && self.processing == 0
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        let mut ready = 0;
        let mut waiting = 0;
        let mut processing = 0;
        for (item, entry) in &self.items {
            processing += usize::from(entry.processing);
            let Some(queued) = entry.queued else {
                assert!(entry.processing, "an item neither queued nor processing");
                continue;
            };
            match queued.ready_at {
                Some(at) => {
                    waiting += 1;
                    assert!(self.waiting.get(&(at, queued.counter)) == Some(item), "waiting entry");
                }
                None if entry.processing => {}
                None => {
                    ready += 1;
                    let line = &self.ready[&Reverse(queued.priority)];
                    assert!(
                        line.entries
                            .iter()
                            .any(|(counter, it)| *counter == queued.counter && it == item),
                        "ready entry"
                    );
                }
            }
        }
        let mut live = 0;
        for (Reverse(priority), line) in &self.ready {
            assert!(
                line.entries
                    .iter()
                    .zip(line.entries.iter().skip(1))
                    .all(|(a, b)| a.0 < b.0),
                "line not sorted by counter"
            );
            let line_live = line
                .entries
                .iter()
                .filter(|(counter, item)| is_live(self.items.get(item), *priority, *counter))
                .count();
            assert_eq!(line_live, line.live, "live count of line {priority}");
            live += line_live;
        }
        assert_eq!(ready, live, "ready holds an item not ready");
        assert_eq!(ready, self.ready_len, "ready_len");
        assert_eq!(waiting, self.waiting.len(), "waiting holds an item not waiting");
        assert_eq!(processing, self.processing, "processing count");
    }
}

impl<T: Clone + Eq + Hash> Handout for State<T> {
    type Item = (T, i32);

    fn parking(&mut self) -> &mut Parking {
        &mut self.parking
    }

    /// Hands out the first ready item, if any, with its priority.
    fn next(&mut self) -> Next<(T, i32)> {
        let Some((item, priority)) = self.pop_ready() else {
            return if self.shutting_down { Next::ShutDown } else { Next::Wait };
        };
        self.processing += 1;
        if let Some(metrics) = &mut self.metrics {
            metrics.get_at(&item, priority);
        }
        Next::Item((item, priority))
    }

    fn has_ready(&self) -> bool {
        self.ready_len != 0
    }
}

#[cfg(test)]
mod tests;
