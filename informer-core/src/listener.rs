//! One listener per registered handler (client-go `processorListener`).
//!
//! `distribute` appends to the listener's buffer and returns: the buffer grows without bound
//! (client-go's `RingGrowing`), so a slow handler never blocks the informer or any other
//! handler. Each listener delivers from its buffer on its own thread, in order. Handlers are
//! plain synchronous calls, and a thread (not a tokio task) means a handler that blocks
//! cannot starve the runtime that runs the reflector. A handler that panics loses that one
//! notification, which is logged and counted; the listener goes on.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{error, warn};

use crate::delta_fifo::DeletedObject;
use crate::event_handler::ResourceEventHandler;

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

/// Buffer state. Invariant: once `stopped` is set nothing is appended.
struct Buffer<K> {
    pending: VecDeque<Notification<K>>,
    stopped: bool,
    started: bool,
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
}

pub(crate) struct ProcessorListener<K> {
    handler: Arc<dyn ResourceEventHandler<K>>,
    buffer: Mutex<Buffer<K>>,
    wake: Condvar,
    /// The period the handler asked for.
    pub(crate) requested_resync_period: Duration,
    resync: Mutex<Resync>,
    /// Initial-list adds queued but not yet handled: the registration is synced at zero.
    initial_pending: AtomicUsize,
    pub(crate) metrics: ListenerMetrics,
    name: String,
}

impl<K: Send + Sync + 'static> ProcessorListener<K> {
    pub(crate) fn new(
        name: String,
        handler: Arc<dyn ResourceEventHandler<K>>,
        requested_resync_period: Duration,
        resync_period: Duration,
    ) -> Arc<Self> {
        Arc::new(ProcessorListener {
            handler,
            buffer: Mutex::new(Buffer {
                pending: VecDeque::new(),
                stopped: false,
                started: false,
            }),
            wake: Condvar::new(),
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

    /// Appends a notification; never blocks on the handler.
    pub(crate) fn add(&self, notification: Notification<K>) {
        let mut buffer = self.buffer();
        if buffer.stopped {
            return;
        }
        if let Notification::Add {
            is_in_initial_list: true,
            ..
        } = notification
        {
            self.initial_pending.fetch_add(1, Ordering::SeqCst);
        }
        buffer.pending.push_back(notification);
        drop(buffer);
        self.wake.notify_one();
    }

    /// Notifications waiting for the handler.
    pub(crate) fn pending(&self) -> usize {
        self.buffer().pending.len()
    }

    /// Whether every initial-list add queued so far was handled.
    pub(crate) fn initial_delivered(&self) -> bool {
        self.initial_pending.load(Ordering::SeqCst) == 0
    }

    /// Starts the delivery thread (once). The receiver completes when the thread exits.
    pub(crate) fn start(self: &Arc<Self>) -> Option<oneshot::Receiver<()>> {
        {
            let mut buffer = self.buffer();
            if buffer.started || buffer.stopped {
                return None;
            }
            buffer.started = true;
        }
        let (done_tx, done_rx) = oneshot::channel();
        let listener = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("kinformer-listener-{}", self.name))
            .spawn(move || {
                listener.run();
                let _ = done_tx.send(());
            });
        match spawned {
            Ok(_) => Some(done_rx),
            Err(e) => {
                error!(listener = %self.name, error = %e, "cannot start listener thread");
                None
            }
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
        self.wake.notify_all();
    }

    fn next(&self) -> Option<Notification<K>> {
        let mut buffer = self.buffer();
        loop {
            if buffer.stopped {
                return None;
            }
            if let Some(n) = buffer.pending.pop_front() {
                return Some(n);
            }
            buffer = self.wake.wait(buffer).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn run(&self) {
        while let Some(notification) = self.next() {
            let initial = matches!(
                notification,
                Notification::Add {
                    is_in_initial_list: true,
                    ..
                }
            );
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
        }
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
