//! How the plain [`Queue`](crate::Queue) and the [`PriorityQueue`](crate::PriorityQueue) hand
//! items to waiting workers: the lock both queues take, the `get` calls parked for an item
//! ([`Parking`]), and the future of `get` ([`Get`]).
//!
//! Waking is `sync.Cond.Signal`'s: a `get` parks only under the queue's lock and only when it
//! found nothing to hand out. Every item made gettable unparks the oldest parked `get` and wakes
//! it once the lock is released ([`wake_one`]), shutdown unparks them all, and a `get` dropped
//! after its wake-up passes it on if items are still gettable: no wake-up is lost, and while
//! every worker is busy (nothing parked) an add wakes nobody and touches no other memory.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::task::{Context, Poll, Waker};

/// Failed `try_lock`s before [`lock`] blocks, and the longest pause between two, in `spin_loop`
/// hints. Backing off 1, 2, 4, … 256 hints, then 256 three more times: about 1300 hints in all
/// (~30 µs where a hint costs 25 ns, as on the benchmark machine). Measured with the throughput
/// bench: shorter back-offs (8 retries up to 64) lose most of the gain.
const LOCK_RETRIES: u32 = 12;
const MAX_BACKOFF_SPINS: u32 = 256;

/// Locks a queue's state.
///
/// Under contention, backs off before retrying instead of grabbing the lock the moment it is
/// released: the holder then takes it again while its cache lines are still local, which is what
/// makes two workers faster than one rather than slower (see BENCHMARKS.md). Uncontended, the
/// first `try_lock` succeeds; after the bounded spin (a few thousand cycles), it waits as usual,
/// so a preempted holder is not spun on for long.
pub(crate) fn lock<S>(state: &Mutex<S>) -> MutexGuard<'_, S> {
    let mut backoff = 1;
    for _ in 0..LOCK_RETRIES {
        match state.try_lock() {
            Ok(guard) => return guard,
            Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                for _ in 0..backoff {
                    std::hint::spin_loop();
                }
                backoff = (backoff * 2).min(MAX_BACKOFF_SPINS);
            }
        }
    }
    // A panic under the lock can only come from the item type's `Hash`/`Eq`/`Clone` or from a
    // metrics implementation. It may leave that one item half-moved, but the queue stays
    // memory-safe and usable for every other item, which beats making every worker panic in turn.
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `get` calls waiting for an item, part of a queue's locked state.
pub(crate) struct Parking {
    /// Oldest first, by id (ids increase, so this is sorted).
    parked: VecDeque<(u64, Waker)>,
    /// The id the next parked `get` gets.
    next_id: u64,
}

impl Parking {
    pub(crate) fn new() -> Self {
        Self {
            parked: VecDeque::new(),
            next_id: 0,
        }
    }

    /// Registers a parked `get`; returns its id.
    fn park(&mut self, waker: Waker) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.parked.push_back((id, waker));
        id
    }

    /// Unparks the oldest parked `get`, if any; the caller wakes it after releasing the lock.
    pub(crate) fn unpark_one(&mut self) -> Option<Waker> {
        self.parked.pop_front().map(|(_, waker)| waker)
    }

    /// Unparks the `n` oldest parked `get`s (all of them if fewer are parked); the caller wakes
    /// them after releasing the lock.
    pub(crate) fn unpark(&mut self, n: usize) -> Vec<Waker> {
        let n = n.min(self.parked.len());
        self.parked.drain(..n).map(|(_, waker)| waker).collect()
    }

    /// Unparks every parked `get` (at shutdown); the caller wakes them after releasing the lock.
    pub(crate) fn unpark_all(&mut self) -> impl Iterator<Item = Waker> + use<> {
        std::mem::take(&mut self.parked).into_iter().map(|(_, waker)| waker)
    }

    fn index(&self, id: u64) -> Option<usize> {
        self.parked.binary_search_by_key(&id, |(parked, _)| *parked).ok()
    }

    /// If `get` `id` is still parked, makes `waker` the one it is woken with and returns true.
    fn refresh(&mut self, id: u64, waker: &Waker) -> bool {
        let Some(index) = self.index(id) else {
            return false;
        };
        self.parked[index].1.clone_from(waker);
        true
    }

    /// If `get` `id` is still parked, removes it and returns true.
    fn leave(&mut self, id: u64) -> bool {
        let Some(index) = self.index(id) else {
            return false;
        };
        self.parked.remove(index);
        true
    }
}

/// What a `get` should do, decided by [`Handout::next`].
pub(crate) enum Next<T> {
    /// Hand out this item.
    Item(T),
    /// Return `None`: shutting down and nothing left to hand out.
    ShutDown,
    /// Wait for an item.
    Wait,
}

/// A queue's locked state, as its `get` sees it.
pub(crate) trait Handout {
    /// What `get` hands out.
    type Item;

    /// The `get`s parked on this queue.
    fn parking(&mut self) -> &mut Parking;

    /// Hands out the next item if there is one to hand out: client-go's `Get`, which hands out
    /// queued items whether or not the queue is shutting down, and reports the shutdown only
    /// once nothing is left.
    fn next(&mut self) -> Next<Self::Item>;

    /// Whether an item is there to hand out.
    fn has_ready(&self) -> bool;
}

/// Unparks the oldest parked `get`, if any, and wakes it once `state`'s lock is released.
pub(crate) fn wake_one<S: Handout>(mut state: MutexGuard<'_, S>) {
    let waker = state.parking().unpark_one();
    drop(state);
    if let Some(waker) = waker {
        waker.wake();
    }
}

/// The future of a queue's `get`.
///
/// The first poll takes an item under the lock if one is there, so a busy worker never parks.
/// Otherwise it parks in the state's [`Parking`]; an item made gettable unparks it (removes it
/// from `Parking`) before waking it, so a poll that finds itself still parked was not woken for
/// an item and just refreshes its waker.
pub(crate) struct Get<'a, S: Handout> {
    state: &'a Mutex<S>,
    /// Our id in the state's `Parking`, from parking until we see we were unparked.
    parked: Option<u64>,
}

impl<'a, S: Handout> Get<'a, S> {
    pub(crate) fn new(state: &'a Mutex<S>) -> Self {
        Self { state, parked: None }
    }
}

impl<S: Handout> Future for Get<'_, S> {
    type Output = Option<S::Item>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut state = lock(this.state);
        if let Some(id) = this.parked {
            if state.parking().refresh(id, cx.waker()) {
                return Poll::Pending;
            }
            this.parked = None;
        }
        match state.next() {
            Next::Item(item) => Poll::Ready(Some(item)),
            Next::ShutDown => Poll::Ready(None),
            Next::Wait => {
                this.parked = Some(state.parking().park(cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}

impl<S: Handout> Drop for Get<'_, S> {
    fn drop(&mut self) {
        let Some(id) = self.parked else {
            return;
        };
        let mut state = lock(self.state);
        if state.parking().leave(id) {
            return;
        }
        // Unparked for an item we will never take: pass the wake-up on.
        if state.has_ready() {
            wake_one(state);
        }
    }
}
