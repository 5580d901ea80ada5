//! One listener per registered handler (client-go `processorListener`).
//!
//! `distribute` appends to the listener's buffer and returns: the buffer grows without bound
//! (client-go's `RingGrowing`), so a slow handler never blocks the informer or any other
//! handler. A listener costs no thread of its own: when notifications arrive for an idle
//! listener, one *drain* delivers the buffer in order until it is empty. At most one drain per
//! listener runs at a time (the `scheduled` flag is the drain's token), which keeps each
//! handler's notifications in order and one at a time.
//!
//! Where a drain runs depends on whether the handler may block:
//!
//! - A **non-blocking** handler (declared by [`ResourceEventHandler::is_non_blocking`] or
//!   `HandlerOptions::non_blocking`; the controller's enqueue handlers are) is drained *inline*:
//!   the thread that applied the batch to the cache takes the drain's token while it hands the
//!   batch over ([`hand_over`](ProcessorListener::hand_over)) and, once it released the
//!   informer's locks, delivers right there ([`InlineDrain::run`]), up to
//!   [`INLINE_BUDGET`] notifications. Nothing waits in a buffer, no task or thread is woken,
//!   and the replaced object of an update is freed by the thread that decoded its successor
//!   (an object freed on another thread than the one that allocated it costs glibc's malloc an
//!   arena lock, measured as futex calls per event). What is left over past the budget (a
//!   relist or resync of a large cache), and a late handler's replay, go to a task on the
//!   async workers that yields every [`NON_BLOCKING_BUDGET`] notifications; while that task
//!   holds the token, new batches are appended behind it, so the order is kept. A
//!   non-blocking handler must never block: it would stall the informer (and its runtime
//!   worker).
//! - A handler that **may block** (the default: handlers are plain synchronous calls) is
//!   drained on the runtime's blocking pool (`spawn_blocking`): a handler that blocks or
//!   stalls holds one pool thread and delays neither the reflector (on the async workers and
//!   its lister-watcher's decoding thread) nor any other handler (the pool grows, to 512
//!   threads by default). A pool of the listeners' own was tried and dropped: tokio's paused
//!   clock (the tests' timers) does not advance while a `spawn_blocking` task runs, but does
//!   while a thread of our own works, so a paused-time test could no longer tell a handler's
//!   work from idleness. Idle listeners
//!   hold no thread and no task: 1,000 registrations cost buffers, not 1,000 threads.
//!
//! client-go runs every handler on a goroutine of its own listener; running non-blocking ones
//! inline is what kube-runtime's stream consumers do, and what makes the watch path cheaper
//! than a hand-over per event.
//!
//! A handler that panics loses that one notification, which is logged and counted; the
//! listener goes on.
//!
//! The listener owns its drains: it keeps each drain's `JoinHandle` (the one scheduled, and a
//! finished one until the next is spawned), and [`join_drains`](ProcessorListener::join_drains),
//! which the processor calls when the informer stops, awaits them, so no drain outlives the
//! informer's `run`. A drain that dies of a panic escaping the handler's guard (a panic payload
//! whose own drop panics, say) is logged at ERROR naming the informer and the listener when it
//! happens, leaves the listener usable (a new drain takes over what is pending), and is
//! reported again when its handle is joined; an inline drain that does is caught there, so the
//! informer goes on.
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

use futures::FutureExt;
use kube::Resource;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, error, warn};

use crate::delta::DeletedObject;
use crate::event_handler::ResourceEventHandler;
use crate::store::meta_namespace_key;

/// Notifications a non-blocking drain task delivers before it yields to the runtime.
pub(crate) const NON_BLOCKING_BUDGET: usize = 64;

/// Notifications an [`InlineDrain`] delivers on the distributing thread before it hands the
/// rest to a task: a batch popped from the queue (at most 1,000 changes) is delivered whole, a
/// relist or resync of a large cache does not hold the informer's task for long.
pub(crate) const INLINE_BUDGET: usize = 4096;

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
/// `in_call` is set only while a drain is inside the handler; `drains` holds the handle of
/// every drain spawned and not yet found finished (the scheduled one, at most one finished
/// before it).
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
    drains: Vec<JoinHandle<()>>,
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
    /// The informer's name, for logs.
    informer: String,
}

/// How a listener is set up.
pub(crate) struct ListenerOptions {
    pub(crate) name: String,
    pub(crate) informer: String,
    pub(crate) requested_resync_period: Duration,
    pub(crate) resync_period: Duration,
    pub(crate) non_blocking: bool,
    pub(crate) max_pending: Option<usize>,
}

impl<K: Resource + Send + Sync + 'static> ProcessorListener<K> {
    pub(crate) fn new(handler: Arc<dyn ResourceEventHandler<K>>, options: ListenerOptions) -> Arc<Self> {
        let ListenerOptions {
            name,
            informer,
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
                drains: Vec::new(),
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
            informer,
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
    /// blocks on the handler. A late handler's replay comes this way: it is delivered by a
    /// drain even for a non-blocking handler, so the registration returns at once.
    pub(crate) fn add_all(self: &Arc<Self>, notifications: impl IntoIterator<Item = Notification<K>>) {
        let mut buffer = self.buffer();
        if !self.append(&mut buffer, notifications) {
            return;
        }
        if let Some(runtime) = self.claim_drain(&mut buffer) {
            self.spawn_drain(&mut buffer, &runtime);
        }
    }

    /// Appends notifications in order under one lock, as [`add_all`](Self::add_all); but for a
    /// non-blocking listener with no drain scheduled, the caller takes the drain's token
    /// instead of a task: it must then [`run`](InlineDrain::run) the returned drain (after
    /// releasing any lock a handler may need: the informer's), which delivers on its thread.
    #[must_use = "the returned drain holds the listener's token: run it"]
    pub(crate) fn hand_over(
        self: &Arc<Self>,
        notifications: impl IntoIterator<Item = Notification<K>>,
    ) -> Option<InlineDrain<K>> {
        if !self.non_blocking {
            self.add_all(notifications);
            return None;
        }
        let mut buffer = self.buffer();
        if !self.append(&mut buffer, notifications) {
            return None;
        }
        let runtime = self.claim_drain(&mut buffer)?;
        Some(InlineDrain {
            listener: self.clone(),
            runtime,
        })
    }

    /// Whether the handler was declared non-blocking (drained inline).
    pub(crate) fn is_non_blocking(&self) -> bool {
        self.non_blocking
    }

    /// Appends notifications to the buffer (coalescing past the bound); false if the listener
    /// stopped and nothing was appended.
    fn append(&self, buffer: &mut Buffer<K>, notifications: impl IntoIterator<Item = Notification<K>>) -> bool {
        if buffer.stopped {
            return false;
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
            self.coalesce(buffer);
        }
        true
    }

    /// If a drain is due and none is scheduled, marks one scheduled and returns the runtime
    /// to spawn it on.
    fn claim_drain(&self, buffer: &mut Buffer<K>) -> Option<Handle> {
        if buffer.scheduled || buffer.stopped || buffer.pending.is_empty() {
            return None;
        }
        let runtime = buffer.runtime.clone()?;
        buffer.scheduled = true;
        Some(runtime)
    }

    /// Spawns the drain `claim_drain` scheduled and keeps its handle (after dropping the
    /// handles of drains found finished, reporting any that panicked). Under the buffer's
    /// lock, so a `join_drains` after `stop` finds every drain ever spawned (spawning does not
    /// run the drain, which takes the lock itself).
    fn spawn_drain(self: &Arc<Self>, buffer: &mut Buffer<K>, runtime: &Handle) {
        let listener = DrainGuard(self.clone());
        let drain = if self.non_blocking {
            runtime.spawn(async move {
                let mut delivered = 0usize;
                while listener.0.deliver_next() {
                    delivered += 1;
                    if delivered.is_multiple_of(NON_BLOCKING_BUDGET) {
                        tokio::task::yield_now().await;
                    }
                }
            })
        } else {
            runtime.spawn_blocking(move || while listener.0.deliver_next() {})
        };
        self.prune_drains(buffer);
        buffer.drains.push(drain);
    }

    /// Awaits every drain spawned (call after [`stop`](Self::stop), so each ends after the
    /// notification in progress); one that panicked is reported at ERROR.
    pub(crate) async fn join_drains(&self) {
        let drains = std::mem::take(&mut self.buffer().drains);
        for drain in drains {
            self.report_drain(drain.await);
        }
    }

    /// Whether a drain of this listener may still be running; drops (and reports) the handles
    /// of finished ones.
    pub(crate) fn has_running_drains(&self) -> bool {
        let mut buffer = self.buffer();
        self.prune_drains(&mut buffer);
        !buffer.drains.is_empty()
    }

    /// Drops the handles of finished drains, reporting any that panicked.
    fn prune_drains(&self, buffer: &mut Buffer<K>) {
        let mut running = Vec::with_capacity(buffer.drains.len() + 1);
        for mut drain in std::mem::take(&mut buffer.drains) {
            match (&mut drain).now_or_never() {
                Some(outcome) => self.report_drain(outcome),
                None => running.push(drain),
            }
        }
        buffer.drains = running;
    }

    /// The number of drains whose handles the listener holds (spawned, not yet found finished).
    #[cfg(test)]
    pub(crate) fn drains_held(&self) -> usize {
        self.buffer().drains.len()
    }

    fn report_drain(&self, outcome: Result<(), tokio::task::JoinError>) {
        match outcome {
            Ok(()) => {}
            Err(e) if e.is_panic() => {
                error!(informer = %self.informer, listener = %self.name,
                    "a listener's drain task panicked (outside the handler's guard); its notification is lost");
            }
            // Cancelled: the runtime shut down under it.
            Err(e) => debug!(informer = %self.informer, listener = %self.name, error = %e, "listener drain cancelled"),
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
        if let Some(runtime) = self.claim_drain(&mut buffer) {
            self.spawn_drain(&mut buffer, &runtime);
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
        if let Err(panic) = outcome {
            self.metrics.handler_panics.fetch_add(1, Ordering::Relaxed);
            error!(informer = %self.informer, listener = %self.name, panic = %panic_message(&*panic),
                "event handler panicked; notification dropped");
            // Dropped here, outside the guard: a payload whose drop panics unwinds the drain.
            drop(panic);
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

/// The drain of a non-blocking listener that [`hand_over`](ProcessorListener::hand_over) gave
/// to the distributing thread: it holds the listener's token until [`run`](Self::run) ends or
/// hands the rest to a task.
pub(crate) struct InlineDrain<K> {
    listener: Arc<ProcessorListener<K>>,
    /// Where the rest goes past the budget.
    runtime: Handle,
}

impl<K: Resource + Send + Sync + 'static> InlineDrain<K> {
    /// Delivers what is pending on this thread, up to [`INLINE_BUDGET`] notifications, then
    /// spawns a task for whatever is left (and for what arrives meanwhile). A panic escaping
    /// the handler's guard is caught here (the informer must go on): logged, and the listener
    /// handed on as a dying drain task would.
    pub(crate) fn run(self) {
        let listener = &self.listener;
        let delivered_all = catch_unwind(AssertUnwindSafe(|| {
            for _ in 0..INLINE_BUDGET {
                if !listener.deliver_next() {
                    return true;
                }
            }
            false
        }));
        match delivered_all {
            Ok(true) => {}
            Ok(false) => {
                // Still holding the token: a task takes over from here, in order.
                let mut buffer = listener.buffer();
                listener.spawn_drain(&mut buffer, &self.runtime);
            }
            Err(escaped) => {
                listener.drain_died();
                // Its drop may panic as well (as the payload it escaped from did): leak it
                // rather than unwind the informer.
                std::mem::forget(escaped);
            }
        }
    }
}

/// The listener as a running drain task holds it: if the drain unwinds (a panic that escaped
/// the handler's guard), hands on as if the drain had ended normally (see
/// [`drain_died`](ProcessorListener::drain_died)).
struct DrainGuard<K: Resource + Send + Sync + 'static>(Arc<ProcessorListener<K>>);

impl<K: Resource + Send + Sync + 'static> Drop for DrainGuard<K> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.drain_died();
        }
    }
}

impl<K: Resource + Send + Sync + 'static> ProcessorListener<K> {
    /// A drain died of a panic that escaped the handler's guard: logs it and hands on as if
    /// the drain had ended normally (not in a call; a new drain scheduled for what is still
    /// pending), so neither `wait_stopped` nor the pending notifications wait for it forever.
    fn drain_died(self: &Arc<Self>) {
        error!(informer = %self.informer, listener = %self.name,
            "a listener's drain panicked outside the handler's guard; the notification in progress is lost");
        let mut buffer = self.buffer();
        buffer.in_call = false;
        buffer.scheduled = false;
        if let Some(runtime) = self.claim_drain(&mut buffer) {
            self.spawn_drain(&mut buffer, &runtime);
        }
        drop(buffer);
        self.left_call.notify_waiters();
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

/// The message of a panic's payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
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

#[cfg(test)]
mod tests {
    //! Drain ownership: the listener holds its drains' handles and joins them, and a drain that
    //! dies of a panic escaping the handler's guard is reported and leaves the listener usable.

    use std::sync::Mutex as StdMutex;

    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;
    use crate::event_handler::ResourceEventHandlerFuncs;
    use crate::processor::SharedProcessor;

    fn listener(
        name: &str,
        non_blocking: bool,
        handler: ResourceEventHandlerFuncs<ConfigMap>,
    ) -> Arc<ProcessorListener<ConfigMap>> {
        ProcessorListener::new(
            Arc::new(handler),
            ListenerOptions {
                name: name.into(),
                informer: "v1/ConfigMap".into(),
                requested_resync_period: Duration::ZERO,
                resync_period: Duration::ZERO,
                non_blocking,
                max_pending: None,
            },
        )
    }

    fn add(name: &str) -> Notification<ConfigMap> {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        Notification::Add {
            obj: Arc::new(cm),
            is_in_initial_list: false,
        }
    }

    /// Yields until no drain of `listener` is scheduled; panics after 10,000 yields.
    async fn until_idle(listener: &ProcessorListener<ConfigMap>) {
        for _ in 0..10_000 {
            if !listener.buffer().scheduled {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("a drain is still scheduled after 10,000 yields");
    }

    fn alive_tasks() -> usize {
        Handle::current().metrics().num_alive_tasks()
    }

    #[tokio::test]
    async fn the_processor_joins_a_drain_still_queued_when_it_stops() {
        let processor = SharedProcessor::<ConfigMap>::new();
        let before = alive_tasks();
        let (queued, removed) = (
            listener("queued", true, ResourceEventHandlerFuncs::default()),
            listener("removed", true, ResourceEventHandlerFuncs::default()),
        );
        assert!(processor.add_listener(queued.clone()) && processor.add_listener(removed.clone()));
        processor.run(Handle::current());
        // A replay goes to a drain task even for a non-blocking listener; on this one-thread
        // runtime nothing has yielded: both drains are spawned, not yet run.
        queued.add_all([add("a")]);
        removed.add_all([add("a")]);
        assert_eq!(alive_tasks(), before + 2, "one drain per listener");
        assert!(processor.remove_listener(&removed));
        assert_eq!(queued.drains_held(), 1);
        processor.stop().await;
        assert_eq!(
            alive_tasks(),
            before,
            "stop joined both drains, the removed listener's too"
        );
        assert_eq!(queued.drains_held(), 0);
        assert!(!removed.has_running_drains());
    }

    #[tokio::test]
    async fn finished_drains_are_dropped_when_the_next_one_is_spawned() {
        let listener = listener("many", true, ResourceEventHandlerFuncs::default());
        listener.start(&Handle::current());
        for round in 0..10 {
            listener.add_all([add(&format!("o{round}"))]);
            // Let the drain run to its end.
            until_idle(&listener).await;
        }
        assert!(listener.drains_held() <= 2, "{} handles held", listener.drains_held());
        listener.stop();
        listener.join_drains().await;
        assert_eq!(listener.drains_held(), 0);
        assert_eq!(listener.metrics.delivered.load(Ordering::Relaxed), 10);
    }

    /// A panic payload whose drop panics too: dropped after the handler's guard caught it, it
    /// unwinds the drain itself.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                panic!("the payload's drop panicked");
            }
        }
    }

    /// Collects what `tracing` prints on this thread.
    #[derive(Clone, Default)]
    struct Captured(Arc<StdMutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_drain_killed_by_a_panic_is_reported_and_the_listener_keeps_delivering() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let seen = Arc::new(StdMutex::new(Vec::<String>::new()));
        let sink = seen.clone();
        let handler = ResourceEventHandlerFuncs::default().on_add(move |cm: &Arc<ConfigMap>, _| {
            let name = cm.metadata.name.clone().unwrap_or_default();
            if name == "bomb" {
                std::panic::panic_any(Bomb);
            }
            sink.lock().unwrap().push(name);
        });
        let listener = listener("bombed", true, handler);
        listener.start(&Handle::current());
        listener.add_all([add("before"), add("bomb"), add("lost")]);
        // The drain dies on "bomb"; the guard hands "lost" on to a new drain.
        until_idle(&listener).await;
        assert!(!listener.buffer().in_call, "the dead drain left the listener in a call");
        listener.add_all([add("after")]);
        until_idle(&listener).await;
        assert_eq!(*seen.lock().unwrap(), ["before", "lost", "after"]);
        listener.stop();
        listener.wait_stopped().await;
        listener.join_drains().await;
        assert_eq!(listener.drains_held(), 0);
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let died = log
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains("drain") && l.contains("panicked"))
            .collect::<Vec<_>>();
        assert!(!died.is_empty(), "the dead drain was not reported:\n{log}");
        assert!(
            died.iter()
                .all(|l| l.contains("informer=v1/ConfigMap") && l.contains("listener=bombed")),
            "{died:?}"
        );
    }
}
