//! The controller's work queue, [`WorkQueue`]: between the handlers (`handler.rs`, `source.rs`)
//! and the workers (`controller.rs`). By default a [`PriorityQueue`], as controller-runtime's
//! since 0.20 ([`use_priority_queue`](crate::Controller::use_priority_queue), its
//! `UsePriorityQueue`): keys from an informer's initial list and from resyncs are added at
//! [`LOW_PRIORITY`], keys from real changes at 0, so after a restart a changed object is
//! reconciled before the backlog of unchanged ones. Switched off, it is the plain FIFO
//! [`RateLimitingQueue`], where every priority is ignored.
//!
//! A key's retries (error backoff, `RequeueAfter`) are added at the priority it was handed out
//! with, as controller-runtime's reconcile handler does.

use std::time::Duration;

use workqueue::{AddOpts, PriorityQueue, QueueConfig, RateLimiter, RateLimitingQueue, TaskPanicked};

use crate::object_key::ObjectKey;

/// The priority of keys added for objects from an informer's initial list and from resyncs
/// (an update that kept the resourceVersion): controller-runtime's `handler.LowPriority`.
pub const LOW_PRIORITY: i32 = -100;

/// The priority of keys added for real changes, and of [`WorkQueue::add`].
pub const NORMAL_PRIORITY: i32 = 0;

/// A controller's work queue of [`ObjectKey`]s: a [`PriorityQueue`] or, with the priority queue
/// switched off, a [`RateLimitingQueue`]. A cheaply cloneable handle.
#[derive(Clone, Debug)]
pub struct WorkQueue {
    inner: Inner,
}

#[derive(Clone, Debug)]
enum Inner {
    Priority(PriorityQueue<ObjectKey>),
    Fifo(RateLimitingQueue<ObjectKey>),
}

impl WorkQueue {
    /// A queue named `config`'s name: a priority queue if `priority`, else a FIFO one.
    pub(crate) fn new(priority: bool, rate_limiter: Box<dyn RateLimiter<ObjectKey>>, config: QueueConfig) -> Self {
        let inner = if priority {
            Inner::Priority(PriorityQueue::with_config(rate_limiter, config))
        } else {
            Inner::Fifo(RateLimitingQueue::with_config(rate_limiter, config))
        };
        Self { inner }
    }

    /// Whether this is a priority queue (priorities are ignored otherwise).
    pub fn is_priority_queue(&self) -> bool {
        matches!(self.inner, Inner::Priority(_))
    }

    /// Enqueues `key` now at [`NORMAL_PRIORITY`] (merged with a pending add of the same key).
    pub fn add(&self, key: ObjectKey) {
        self.add_with_priority(key, NORMAL_PRIORITY);
    }

    /// Enqueues `key` now at `priority` (higher first); a key already queued keeps the higher
    /// of the two priorities. The FIFO queue ignores the priority.
    pub fn add_with_priority(&self, key: ObjectKey, priority: i32) {
        match &self.inner {
            Inner::Priority(queue) => queue.add_with_priority(key, priority),
            Inner::Fifo(queue) => queue.add(key),
        }
    }

    /// Enqueues `key` at [`NORMAL_PRIORITY`] once `delay` has passed.
    pub fn add_after(&self, key: ObjectKey, delay: Duration) {
        self.add_after_with_priority(key, delay, NORMAL_PRIORITY);
    }

    /// Enqueues `key` at `priority` once `delay` has passed.
    pub fn add_after_with_priority(&self, key: ObjectKey, delay: Duration, priority: i32) {
        match &self.inner {
            Inner::Priority(queue) => queue.add_with_opts(key, AddOpts::default().after(delay).priority(priority)),
            Inner::Fifo(queue) => queue.add_after(key, delay),
        }
    }

    /// Enqueues `key` at `priority` after its rate limiter's backoff, recording a failure.
    pub fn add_rate_limited_with_priority(&self, key: ObjectKey, priority: i32) {
        match &self.inner {
            Inner::Priority(queue) => queue.add_with_opts(key, AddOpts::default().rate_limited().priority(priority)),
            Inner::Fifo(queue) => queue.add_rate_limited(key),
        }
    }

    /// Waits for a key and its priority ([`NORMAL_PRIORITY`] from the FIFO queue); `None` once
    /// shut down and empty.
    pub(crate) async fn get(&self) -> Option<(ObjectKey, i32)> {
        match &self.inner {
            Inner::Priority(queue) => queue.get_with_priority().await,
            Inner::Fifo(queue) => queue.get().await.map(|key| (key, NORMAL_PRIORITY)),
        }
    }

    /// Marks a key handed out by `get` as processed.
    pub(crate) fn done(&self, key: &ObjectKey) {
        match &self.inner {
            Inner::Priority(queue) => queue.done(key),
            Inner::Fifo(queue) => queue.done(key),
        }
    }

    /// Resets `key`'s backoff.
    pub(crate) fn forget(&self, key: &ObjectKey) {
        match &self.inner {
            Inner::Priority(queue) => queue.forget(key),
            Inner::Fifo(queue) => queue.forget(key),
        }
    }

    /// How many times `key` was rate-limited since it was last forgotten.
    pub fn num_requeues(&self, key: &ObjectKey) -> usize {
        match &self.inner {
            Inner::Priority(queue) => queue.num_requeues(key),
            Inner::Fifo(queue) => queue.num_requeues(key),
        }
    }

    /// Number of keys ready to be handed out.
    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Priority(queue) => queue.len(),
            Inner::Fifo(queue) => queue.len(),
        }
    }

    /// Whether no key is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key accepted and not yet finished (queued, waiting for a retry, being reconciled).
    pub fn unfinished(&self) -> Vec<ObjectKey> {
        match &self.inner {
            Inner::Priority(queue) => queue.unfinished(),
            Inner::Fifo(queue) => queue.unfinished(),
        }
    }

    /// Whether the queue is shutting down.
    pub fn shutting_down(&self) -> bool {
        match &self.inner {
            Inner::Priority(queue) => queue.shutting_down(),
            Inner::Fifo(queue) => queue.shutting_down(),
        }
    }

    pub(crate) fn shut_down(&self) {
        match &self.inner {
            Inner::Priority(queue) => queue.shut_down(),
            Inner::Fifo(queue) => queue.shut_down(),
        }
    }

    pub(crate) async fn join_tasks(&self) -> Result<(), TaskPanicked> {
        match &self.inner {
            Inner::Priority(queue) => queue.join_tasks().await,
            Inner::Fifo(queue) => queue.join_tasks().await,
        }
    }
}
