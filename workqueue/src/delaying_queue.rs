//! A work queue that can add items later (client-go's `DelayingInterface`).
//!
//! Items given to [`add_after`](DelayingQueue::add_after) wait in a min-heap of ready times; a
//! timer task moves each into the queue when its time comes. Adding an item that is already
//! waiting keeps the earlier of the two ready times, so a retry scheduled by a fast path is never
//! postponed by a slow one.
//!
//! At shutdown the timer stops, as client-go's waiting loop does: items still waiting for their
//! time are dropped (they never become queued, so `get` does not hand them out), while items
//! already queued are handed out as [`Queue::shut_down`] says. The dropped ones stay listed by
//! [`unfinished`](DelayingQueue::unfinished), so a controller can report them.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use std::time::Duration;
//! use workqueue::DelayingQueue;
//!
//! let queue = DelayingQueue::new();
//! queue.add_after("default/nginx", Duration::from_secs(10));
//! assert_eq!(queue.len(), 0);
//! // Time is paused in this example: `get` waits ten virtual seconds.
//! assert_eq!(queue.get().await, Some("default/nginx"));
//! # }
//! ```

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::queue::{Queue, QueueConfig};
use crate::tasks::{TaskPanicked, spawn_owned};

/// Stand-in deadline for delays too large to add to `Instant::now()` (30 years, like Tokio's own
/// far future). Such items effectively never become ready.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// A [`Queue`] with [`add_after`](Self::add_after) (client-go's `delayingType`).
///
/// A cheaply cloneable handle. Creating one spawns the timer task, which stops when the queue
/// shuts down or the last handle is dropped; the queue holds its handle, and
/// [`join_tasks`](Self::join_tasks) waits for it after shutdown.
pub struct DelayingQueue<T> {
    queue: Queue<T>,
    shared: Arc<Waiting<T>>,
    /// Dropping the last handle cancels the timer task (but does not shut the queue down).
    _stop_timer: Arc<DropGuard>,
}

impl<T> Clone for DelayingQueue<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            shared: Arc::clone(&self.shared),
            _stop_timer: Arc::clone(&self._stop_timer),
        }
    }
}

/// Items waiting for their ready time, shared by the handles and the timer task.
struct Waiting<T> {
    heap: Mutex<ReadyHeap<T>>,
    /// Wakes the timer task when an item becomes the earliest, so it sleeps until the right time.
    earliest_changed: Notify,
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> Default for DelayingQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> DelayingQueue<T> {
    /// Creates an unnamed delaying queue without metrics.
    ///
    /// # Panics
    /// Outside a Tokio runtime, since it spawns the timer task.
    pub fn new() -> Self {
        Self::with_config(QueueConfig::default())
    }

    /// Creates a delaying queue from `config`.
    ///
    /// # Panics
    /// Outside a Tokio runtime, since it spawns the timer task.
    pub fn with_config(config: QueueConfig) -> Self {
        let queue = Queue::with_config(config);
        let shared = Arc::new(Waiting {
            heap: Mutex::new(ReadyHeap::default()),
            earliest_changed: Notify::new(),
        });
        // Cancelled by the queue's shutdown (parent) or by dropping the last handle.
        let stop = queue.shutdown_token().child_token();
        let timer = spawn_owned(
            &tokio::runtime::Handle::current(),
            queue.name().to_owned(),
            "delaying queue timer",
            waiting_loop(queue.clone(), Arc::clone(&shared), stop.clone()),
        );
        queue.own_task(timer);
        Self {
            queue,
            shared,
            _stop_timer: Arc::new(stop.drop_guard()),
        }
    }

    /// Adds `item` once `delay` has passed; a zero delay adds it now.
    ///
    /// If `item` is already waiting, it keeps the earlier ready time. Ignored after shutdown.
    /// Counted in `workqueue_retries_total`.
    pub fn add_after(&self, item: T, delay: Duration) {
        if self.queue.shutting_down() {
            tracing::debug!(queue = %self.queue.name(), "work queue shutting down, dropping delayed item");
            return;
        }
        self.queue.record_retry();
        if delay.is_zero() {
            self.queue.add(item);
            return;
        }
        let now = Instant::now();
        let ready_at = now.checked_add(delay).unwrap_or_else(|| now + FAR_FUTURE);
        if self.shared.lock().insert(item, ready_at) {
            self.shared.earliest_changed.notify_one();
        }
    }

    /// Adds `item` now. See [`Queue::add`].
    pub fn add(&self, item: T) {
        self.queue.add(item);
    }

    /// Waits for an item. See [`Queue::get`].
    pub async fn get(&self) -> Option<T> {
        self.queue.get().await
    }

    /// Marks `item` as processed. See [`Queue::done`].
    pub fn done(&self, item: &T) {
        self.queue.done(item);
    }

    /// Number of items ready to be handed out, not counting items still waiting for their time.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no item is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Shuts down the queue and stops the timer task: items still waiting for their time are
    /// dropped, while [`get`](Self::get) keeps handing out the items already queued and returns
    /// `None` once none is left. See [`Queue::shut_down`].
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    /// Shuts down as [`shut_down`](Self::shut_down) does (items still waiting for their time are
    /// dropped), then waits for the queued and in-flight items to be done. See
    /// [`Queue::shut_down_with_drain`].
    pub async fn shut_down_with_drain(&self) {
        self.queue.shut_down_with_drain().await;
    }

    /// Waits for the timer task (and a named queue's metrics task) to end after
    /// [`shut_down`](Self::shut_down); the first that panicked, if any. See
    /// [`Queue::join_tasks`].
    pub async fn join_tasks(&self) -> Result<(), TaskPanicked> {
        self.queue.join_tasks().await
    }

    /// Every item accepted and not yet finished: those of [`Queue::unfinished`] and those still
    /// waiting for their ready time (each once). After shutdown the waiting ones are the items
    /// the shutdown dropped.
    pub fn unfinished(&self) -> Vec<T> {
        let mut items = self.queue.unfinished();
        let known: std::collections::HashSet<&T> = items.iter().collect();
        let waiting: Vec<T> = {
            let heap = self.shared.lock();
            heap.ready_at
                .keys()
                .filter(|item| !known.contains(item))
                .cloned()
                .collect()
        };
        items.extend(waiting);
        items
    }

    /// Whether the queue is shutting down.
    pub fn shutting_down(&self) -> bool {
        self.queue.shutting_down()
    }

    /// Number of items waiting for their ready time.
    #[cfg(test)]
    pub(crate) fn waiting_len(&self) -> usize {
        self.shared.lock().len()
    }
}

impl<T> fmt::Debug for DelayingQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelayingQueue")
            .field("queue", &self.queue)
            .field("waiting", &self.shared.lock().ready_at.len())
            .finish()
    }
}

impl<T> Waiting<T> {
    fn lock(&self) -> MutexGuard<'_, ReadyHeap<T>> {
        // As in `Queue`: a panic under this lock comes from `T`'s trait impls; keep serving the
        // other items rather than panicking in every caller.
        self.heap.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The timer task: moves items whose time has come into the queue, then sleeps until the next
/// ready time or until an earlier item arrives.
///
/// client-go also wakes this loop every 10 s as a safety net against missed signals; `Notify`
/// keeps a permit for a wake-up that arrives while we are busy, so none is needed here.
async fn waiting_loop<T: Clone + Eq + Hash + Send + Sync + 'static>(
    queue: Queue<T>,
    shared: Arc<Waiting<T>>,
    stop: CancellationToken,
) {
    loop {
        let next = {
            // Items move under the heap lock, so `unfinished` always finds each in one place; an
            // item the queue refuses (it shut down meanwhile) stays waiting, still listed by
            // `unfinished`, instead of vanishing from both.
            let mut heap = shared.lock();
            if !heap.pop_ready(Instant::now(), |item| queue.try_add(item)) {
                break;
            }
            heap.next_ready_at()
        };
        let sleep = tokio::time::sleep_until(next.unwrap_or_else(|| Instant::now() + FAR_FUTURE));
        tokio::select! {
            () = stop.cancelled() => break,
            () = shared.earliest_changed.notified() => {}
            () = sleep => {}
        }
    }
    tracing::debug!(queue = %queue.name(), "delaying queue timer stopped");
}

/// A min-heap of items by ready time, with at most one live entry per item.
///
/// Invariants: every item in `ready_at` has exactly one heap entry whose time equals
/// `ready_at[item]` (its live entry). Other heap entries are stale, left behind when an item was
/// rescheduled earlier, and are skipped when popped; a stale entry always has a later time than
/// its item's live one. `seq` breaks ties so items ready at the same time leave in add order.
struct ReadyHeap<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    ready_at: HashMap<T, Instant>,
    next_seq: u64,
}

impl<T> Default for ReadyHeap<T> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            ready_at: HashMap::new(),
            next_seq: 0,
        }
    }
}

struct Entry<T> {
    ready_at: Instant,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.ready_at, self.seq).cmp(&(other.ready_at, other.seq))
    }
}

impl<T: Clone + Eq + Hash> ReadyHeap<T> {
    /// Schedules `item` at `ready_at` unless it is already scheduled no later. Returns whether it
    /// became the earliest entry (the timer must re-arm).
    fn insert(&mut self, item: T, ready_at: Instant) -> bool {
        if let Some(&existing) = self.ready_at.get(&item)
            && existing <= ready_at
        {
            return false;
        }
        let earliest = self.heap.peek().is_none_or(|Reverse(head)| ready_at < head.ready_at);
        self.ready_at.insert(item.clone(), ready_at);
        self.heap.push(Reverse(Entry {
            ready_at,
            seq: self.next_seq,
            item,
        }));
        self.next_seq += 1;
        earliest
    }

    /// Hands the items ready at `now` to `accept`, earliest first, removing each it takes. The
    /// first item it gives back stays waiting, as it was, with the later ones; returns whether
    /// every ready item was taken.
    fn pop_ready(&mut self, now: Instant, mut accept: impl FnMut(T) -> Result<(), T>) -> bool {
        while let Some(Reverse(head)) = self.heap.peek()
            && head.ready_at <= now
        {
            let Some(Reverse(Entry { ready_at, seq, item })) = self.heap.pop() else {
                break;
            };
            if self.ready_at.get(&item) != Some(&ready_at) {
                continue; // stale
            }
            self.ready_at.remove(&item);
            if let Err(item) = accept(item) {
                self.ready_at.insert(item.clone(), ready_at);
                self.heap.push(Reverse(Entry { ready_at, seq, item }));
                return false;
            }
        }
        true
    }

    /// When the timer must next wake (possibly for a stale entry, which is harmless).
    fn next_ready_at(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(head)| head.ready_at)
    }

    /// Number of items waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.ready_at.len()
    }
}

#[cfg(test)]
mod tests;
