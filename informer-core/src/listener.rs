//! One listener per registered handler (client-go `processorListener`).
//!
//! `distribute` appends to the listener's buffer and returns: the buffer grows without bound
//! (client-go's `RingGrowing`), so a slow handler never blocks the informer or any other
//! handler. A listener costs no thread of its own: when notifications arrive for an idle
//! listener, one *drain* is scheduled on the tokio runtime that runs the informer, and it
//! delivers the buffer in order until it is empty. At most one drain per listener runs at a
//! time, which keeps each handler's notifications in order and one at a time.
//!
//! Handlers are plain synchronous calls that may block, so by default a drain runs on the
//! runtime's blocking pool (`spawn_blocking`): a handler that blocks or stalls holds one pool
//! thread and delays neither the reflector (on the async workers) nor any other handler (the
//! pool grows). A handler registered as non-blocking (`HandlerOptions::non_blocking`, which
//! the controller's enqueue handlers use) is drained by a task on the async workers instead,
//! yielding every few notifications; it must never block. Idle listeners of either kind
//! hold no thread and no task: 1,000 registrations cost buffers, not 1,000 threads.
//!
//! A handler that panics loses that one notification, which is logged and counted; the
//! listener goes on.
//!
//! The buffer is unbounded by default, as client-go's. A registration may set a bound
//! (`HandlerOptions::max_pending`): when the buffer grows past it, pending notifications are
//! *coalesced by object key*, as a DeltaFifo would have: an add followed by updates becomes one
//! add of the newest state, updates collapse into one from the oldest to the newest state, an
//! update followed by a delete becomes the delete, and an add followed by a delete vanishes (the
//! handler never saw the object). The buffer then holds at most about one notification per
//! object, whatever the handler's speed; what was folded is counted. A handler that needs every
//! intermediate state must not set a bound.

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kube::Resource;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{error, warn};

use crate::delta::DeletedObject;
use crate::event_handler::ResourceEventHandler;
use crate::store::meta_namespace_key;

/// Notifications a non-blocking drain delivers before it yields to the runtime.
const NON_BLOCKING_BUDGET: usize = 64;

/// A change to deliver to a handler.
pub(crate) enum Notification<K> {
    Add { obj: Arc<K>, is_in_initial_list: bool },
    Update { old: Arc<K>, new: Arc<K> },
    Delete(DeletedObject<K>),
}

impl<K> Clone for Notification<K> {
    fn clone(&self) -> Self {
        match self {
            Notification::Add {
                obj,
                is_in_initial_list,
            } => Notification::Add {
                obj: obj.clone(),
                is_in_initial_list: *is_in_initial_list,
            },
            Notification::Update { old, new } => Notification::Update {
                old: old.clone(),
                new: new.clone(),
            },
            Notification::Delete(obj) => Notification::Delete(obj.clone()),
        }
    }
}

impl<K> Notification<K> {
    fn is_initial_add(&self) -> bool {
        matches!(
            self,
            Notification::Add {
                is_in_initial_list: true,
                ..
            }
        )
    }
}

/// Buffer state.
///
/// Invariants: once `stopped` is set nothing is appended and nothing more is delivered;
/// `scheduled` is set exactly while a drain is queued or running, and a drain is scheduled
/// whenever `pending` is non-empty, `runtime` is set and the listener is not stopped;
/// `in_call` is set only while a drain is inside the handler.
struct Buffer<K> {
    pending: VecDeque<Notification<K>>,
    /// Coalesce when `pending` grows past this (None: unbounded); raised after a coalescing
    /// that could not get under it, so coalescing stays amortised O(1) per notification.
    coalesce_at: Option<usize>,
    stopped: bool,
    /// The runtime drains are scheduled on; set by `start`.
    runtime: Option<Handle>,
    scheduled: bool,
    in_call: bool,
}

struct Resync {
    /// The period in effect (0: none), after the informer's rules were applied.
    period: Duration,
    next: Instant,
}

/// Counters of one listener.
#[derive(Debug, Default)]
pub struct ListenerMetrics {
    /// Notifications handed to the handler.
    pub delivered: AtomicU64,
    /// Notifications lost because the handler panicked.
    pub handler_panics: AtomicU64,
    /// Notifications folded into others because the buffer passed its bound.
    pub coalesced: AtomicU64,
}

pub(crate) struct ProcessorListener<K> {
    handler: Arc<dyn ResourceEventHandler<K>>,
    buffer: Mutex<Buffer<K>>,
    /// Wakes `wait_stopped` when a stopped listener leaves its handler call.
    left_call: Notify,
    /// Drained by a task on the async workers instead of the blocking pool.
    non_blocking: bool,
    /// The bound on `pending` past which notifications are coalesced by key.
    max_pending: Option<usize>,
    /// The period the handler asked for.
    pub(crate) requested_resync_period: Duration,
    resync: Mutex<Resync>,
    /// Initial-list adds queued but not yet handled: the registration is synced at zero.
    initial_pending: AtomicUsize,
    pub(crate) metrics: ListenerMetrics,
    name: String,
}

/// How a listener is set up.
pub(crate) struct ListenerOptions {
    pub(crate) name: String,
    pub(crate) requested_resync_period: Duration,
    pub(crate) resync_period: Duration,
    pub(crate) non_blocking: bool,
    pub(crate) max_pending: Option<usize>,
}

impl<K: Resource + Send + Sync + 'static> ProcessorListener<K> {
    pub(crate) fn new(handler: Arc<dyn ResourceEventHandler<K>>, options: ListenerOptions) -> Arc<Self> {
        let ListenerOptions {
            name,
            requested_resync_period,
            resync_period,
            non_blocking,
            max_pending,
        } = options;
        let max_pending = max_pending.map(|m| m.max(1));
        Arc::new(ProcessorListener {
            handler,
            buffer: Mutex::new(Buffer {
                pending: VecDeque::new(),
                coalesce_at: max_pending,
                stopped: false,
                runtime: None,
                scheduled: false,
                in_call: false,
            }),
            left_call: Notify::new(),
            non_blocking,
            max_pending,
            requested_resync_period,
            resync: Mutex::new(Resync {
                period: resync_period,
                next: Instant::now() + resync_period,
            }),
            initial_pending: AtomicUsize::new(0),
            metrics: ListenerMetrics::default(),
            name,
        })
    }

    // Nothing panics while these locks are held (handlers run outside them), so poisoning
    // cannot happen; take the guard over if it ever does.
    fn buffer(&self) -> MutexGuard<'_, Buffer<K>> {
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn resync_state(&self) -> MutexGuard<'_, Resync> {
        self.resync.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends notifications in order under one lock, scheduling at most one drain; never
    /// blocks on the handler.
    pub(crate) fn add_all(self: &Arc<Self>, notifications: impl IntoIterator<Item = Notification<K>>) {
        let mut buffer = self.buffer();
        if buffer.stopped {
            return;
        }
        let mut initial = 0;
        for notification in notifications {
            if notification.is_initial_add() {
                initial += 1;
            }
            buffer.pending.push_back(notification);
        }
        if initial > 0 {
            self.initial_pending.fetch_add(initial, Ordering::SeqCst);
        }
        if let Some(at) = buffer.coalesce_at
            && buffer.pending.len() > at
        {
            self.coalesce(&mut buffer);
        }
        let runtime = self.claim_drain(&mut buffer);
        drop(buffer);
        if let Some(runtime) = runtime {
            self.spawn_drain(&runtime);
        }
    }

    /// If a drain is due and none is scheduled, marks one scheduled and returns the runtime
    /// to spawn it on (spawned after the lock is released).
    fn claim_drain(&self, buffer: &mut Buffer<K>) -> Option<Handle> {
        if buffer.scheduled || buffer.stopped || buffer.pending.is_empty() {
            return None;
        }
        let runtime = buffer.runtime.clone()?;
        buffer.scheduled = true;
        Some(runtime)
    }

    fn spawn_drain(self: &Arc<Self>, runtime: &Handle) {
        let listener = self.clone();
        if self.non_blocking {
            runtime.spawn(async move {
                let mut delivered = 0usize;
                while listener.deliver_next() {
                    delivered += 1;
                    if delivered.is_multiple_of(NON_BLOCKING_BUDGET) {
                        tokio::task::yield_now().await;
                    }
                }
            });
        } else {
            runtime.spawn_blocking(move || while listener.deliver_next() {});
        }
    }

    /// Folds the pending notifications by object key (see the module docs).
    fn coalesce(&self, buffer: &mut Buffer<K>) {
        let before = buffer.pending.len();
        let mut slots: Vec<Option<Notification<K>>> = Vec::with_capacity(before);
        // Key → slot of its newest live notification.
        let mut latest: HashMap<String, usize> = HashMap::new();
        let mut initial_dropped = 0;
        for notification in buffer.pending.drain(..) {
            let Some(key) = notification_key(&notification) else {
                slots.push(Some(notification));
                continue;
            };
            let previous = latest.get(&key).copied();
            let merged = match (previous.and_then(|i| slots[i].take()), notification) {
                (Some(Notification::Add { is_in_initial_list, .. }), Notification::Update { new, .. }) => {
                    Merge::Replace(Notification::Add {
                        obj: new,
                        is_in_initial_list,
                    })
                }
                (Some(Notification::Add { is_in_initial_list, .. }), Notification::Delete(_)) => {
                    if is_in_initial_list {
                        initial_dropped += 1;
                    }
                    Merge::Vanish
                }
                (Some(Notification::Update { old, .. }), Notification::Update { new, .. }) => {
                    Merge::Replace(Notification::Update { old, new })
                }
                (Some(Notification::Update { .. }), Notification::Delete(gone)) => {
                    Merge::Replace(Notification::Delete(gone))
                }
                (Some(kept), next) => Merge::Append(kept, next),
                (None, next) => Merge::New(next),
            };
            match merged {
                Merge::Replace(n) => {
                    if let Some(i) = previous {
                        slots[i] = Some(n);
                    }
                }
                Merge::Vanish => {
                    latest.remove(&key);
                }
                Merge::Append(kept, next) => {
                    if let Some(i) = previous {
                        slots[i] = Some(kept);
                    }
                    latest.insert(key, slots.len());
                    slots.push(Some(next));
                }
                Merge::New(next) => {
                    latest.insert(key, slots.len());
                    slots.push(Some(next));
                }
            }
        }
        buffer.pending = slots.into_iter().flatten().collect();
        if initial_dropped > 0 {
            let _ = self
                .initial_pending
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(initial_dropped));
        }
        let after = buffer.pending.len();
        let folded = before - after;
        self.metrics.coalesced.fetch_add(folded as u64, Ordering::Relaxed);
        if let Some(max) = self.max_pending {
            // Still over the bound: as many objects as that are pending; wait for the buffer
            // to double before trying again.
            buffer.coalesce_at = Some(max.max(after.saturating_mul(2)));
        }
        warn!(listener = %self.name, before, after, folded, "slow handler: pending notifications coalesced by key");
    }

    /// The bound on pending notifications, if any.
    pub(crate) fn max_pending(&self) -> Option<usize> {
        self.max_pending
    }

    /// The listener's name (the `handler` label of its metrics).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Notifications waiting for the handler.
    pub(crate) fn pending(&self) -> usize {
        self.buffer().pending.len()
    }

    /// Whether every initial-list add queued so far was handled.
    pub(crate) fn initial_delivered(&self) -> bool {
        self.initial_pending.load(Ordering::SeqCst) == 0
    }

    /// Starts delivery on `runtime` (once; later calls and calls after `stop` do nothing).
    pub(crate) fn start(self: &Arc<Self>, runtime: &Handle) {
        let mut buffer = self.buffer();
        if buffer.runtime.is_some() || buffer.stopped {
            return;
        }
        buffer.runtime = Some(runtime.clone());
        let runtime = self.claim_drain(&mut buffer);
        drop(buffer);
        if let Some(runtime) = runtime {
            self.spawn_drain(&runtime);
        }
    }

    /// Stops delivery after the notification in progress; pending ones are dropped.
    pub(crate) fn stop(&self) {
        let mut buffer = self.buffer();
        buffer.stopped = true;
        let dropped = buffer.pending.len();
        buffer.pending.clear();
        drop(buffer);
        self.initial_pending.store(0, Ordering::SeqCst);
        if dropped > 0 {
            warn!(listener = %self.name, dropped, "listener stopped with notifications pending");
        }
    }

    /// Waits until a stopped listener is out of its handler call (at once if it is in none).
    pub(crate) async fn wait_stopped(&self) {
        loop {
            let left = self.left_call.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            if !self.buffer().in_call {
                return;
            }
            left.await;
        }
    }

    /// Delivers the oldest pending notification. False when there is none (or the listener
    /// stopped): the drain ends and the listener is no longer scheduled.
    fn deliver_next(&self) -> bool {
        let notification = {
            let mut buffer = self.buffer();
            let next = if buffer.stopped {
                None
            } else {
                buffer.pending.pop_front()
            };
            match next {
                Some(n) => {
                    buffer.in_call = true;
                    n
                }
                None => {
                    buffer.scheduled = false;
                    crate::fifo::release_if_idle(&mut buffer.pending);
                    return false;
                }
            }
        };
        let initial = notification.is_initial_add();
        let handler = &self.handler;
        let outcome = catch_unwind(AssertUnwindSafe(|| match notification {
            Notification::Add {
                obj,
                is_in_initial_list,
            } => handler.on_add(&obj, is_in_initial_list),
            Notification::Update { old, new } => handler.on_update(&old, &new),
            Notification::Delete(obj) => handler.on_delete(obj),
        }));
        self.metrics.delivered.fetch_add(1, Ordering::Relaxed);
        if outcome.is_err() {
            self.metrics.handler_panics.fetch_add(1, Ordering::Relaxed);
            error!(listener = %self.name, "event handler panicked; notification dropped");
        }
        if initial {
            // Saturating: `stop` may have reset the count meanwhile.
            let _ = self
                .initial_pending
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
        let mut buffer = self.buffer();
        buffer.in_call = false;
        if let (Some(max), Some(at)) = (self.max_pending, buffer.coalesce_at)
            && at > max
            && buffer.pending.len() <= max
        {
            buffer.coalesce_at = Some(max); // drained back under the bound
        }
        if buffer.stopped {
            drop(buffer);
            self.left_call.notify_waiters();
        }
        true
    }

    /// Whether this listener is due a resync at `now`.
    pub(crate) fn should_resync(&self, now: Instant) -> bool {
        let resync = self.resync_state();
        !resync.period.is_zero() && now >= resync.next
    }

    /// Schedules the next resync one period after `now`.
    pub(crate) fn determine_next_resync(&self, now: Instant) {
        let mut resync = self.resync_state();
        resync.next = now + resync.period;
    }

    /// Changes the period in effect.
    pub(crate) fn set_resync_period(&self, period: Duration) {
        let mut resync = self.resync_state();
        resync.period = period;
    }

    /// The period in effect.
    pub(crate) fn resync_period(&self) -> Duration {
        self.resync_state().period
    }
}

/// What coalescing does with a key's previous pending notification and the next one.
enum Merge<K> {
    /// Both fold into this, in the previous one's place.
    Replace(Notification<K>),
    /// Both go (an add and a delete the handler never saw).
    Vanish,
    /// Nothing folds: keep the previous one and append the next.
    Append(Notification<K>, Notification<K>),
    /// The key had nothing pending.
    New(Notification<K>),
}

/// The object key a notification is about.
fn notification_key<K: Resource>(notification: &Notification<K>) -> Option<String> {
    match notification {
        Notification::Add { obj, .. } => meta_namespace_key(obj.as_ref()).ok(),
        Notification::Update { new, .. } => meta_namespace_key(new.as_ref()).ok(),
        Notification::Delete(DeletedObject::DeletedFinalStateUnknown(t)) => Some(t.key.clone()),
        Notification::Delete(DeletedObject::Object(obj)) => meta_namespace_key(obj.as_ref()).ok(),
    }
}
