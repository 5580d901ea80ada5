//! Fan-out of notifications to every listener (client-go `sharedProcessor`).
//!
//! `distribute` hands a batch of notifications to each listener under a read lock: each
//! listener takes its part of the batch under one lock of its own, so a batch of N changes
//! costs each listener one wake-up, not N. Listeners whose handlers may block get theirs
//! first (their drains start on other threads at once); the non-blocking ones are handed
//! theirs last and come back as [`InlineDrain`]s, which the caller runs on its own thread once
//! it released the informer's locks (see `listener.rs`). Resync notifications (updates whose
//! resourceVersion did not change) go only to the listeners whose resync period is due, which
//! `should_resync` works out on each resync tick.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;
use tracing::warn;

use crate::listener::{InlineDrain, Notification, ProcessorListener};

struct Entry<K> {
    listener: Arc<ProcessorListener<K>>,
    /// Due a resync in the current resync round.
    syncing: bool,
}

struct Inner<K> {
    listeners: Vec<Entry<K>>,
    /// The runtime listeners deliver on; set by `run`.
    runtime: Option<Handle>,
    /// Set by `stop`: no listener may be added after it, or its deliveries would outlive `run`.
    stopped: bool,
    /// Listeners removed while their drain may still run, joined by `stop` (pruned of those
    /// whose drains are all finished whenever another is removed).
    removed: Vec<Arc<ProcessorListener<K>>>,
}

pub(crate) struct SharedProcessor<K> {
    inner: RwLock<Inner<K>>,
}

/// client-go `determineResyncPeriod`: zero stays zero; with no resync checks there is no
/// resync; otherwise at least the check period.
pub(crate) fn determine_resync_period(desired: Duration, check: Duration) -> Duration {
    if desired.is_zero() {
        return Duration::ZERO;
    }
    if check.is_zero() {
        warn!(?desired, "resync period requested, but the informer does not resync");
        return Duration::ZERO;
    }
    desired.max(check)
}

impl<K: kube::Resource + Send + Sync + 'static> SharedProcessor<K> {
    pub(crate) fn new() -> Self {
        SharedProcessor {
            inner: RwLock::new(Inner {
                listeners: Vec::new(),
                runtime: None,
                stopped: false,
                removed: Vec::new(),
            }),
        }
    }

    // No code panics while holding this lock; take over a poisoned one.
    fn read(&self) -> RwLockReadGuard<'_, Inner<K>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner<K>> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a listener; starts it if the processor runs. False (and nothing added) once the
    /// processor has stopped.
    pub(crate) fn add_listener(&self, listener: Arc<ProcessorListener<K>>) -> bool {
        let mut inner = self.write();
        if inner.stopped {
            return false;
        }
        if let Some(runtime) = &inner.runtime {
            listener.start(runtime);
        }
        inner.listeners.push(Entry {
            listener,
            syncing: true,
        });
        true
    }

    /// Removes and stops a listener. False if it was not registered.
    pub(crate) fn remove_listener(&self, listener: &Arc<ProcessorListener<K>>) -> bool {
        let mut inner = self.write();
        let before = inner.listeners.len();
        inner.listeners.retain(|e| !Arc::ptr_eq(&e.listener, listener));
        let removed = inner.listeners.len() != before;
        if removed {
            listener.stop();
            inner.removed.retain(|l| l.has_running_drains());
            inner.removed.push(listener.clone());
        }
        removed
    }

    /// Hands each `(notification, sync)` of `batch`, in order, to every listener, or for a
    /// `sync` one only to the listeners due a resync: first to the listeners whose handlers may
    /// block, then to the non-blocking ones, whose drains the caller gets back to
    /// [`run`](InlineDrain::run) (after releasing its locks, in the order returned).
    #[must_use = "the inline drains hold their listeners' tokens: run them"]
    pub(crate) fn distribute(&self, batch: &[(Notification<K>, bool)]) -> Vec<InlineDrain<K>> {
        let mut inline = Vec::new();
        if batch.is_empty() {
            return inline;
        }
        let inner = self.read();
        let part = |entry: &Entry<K>| {
            let syncing = entry.syncing;
            batch
                .iter()
                .filter(move |(_, sync)| !sync || syncing)
                .map(|(notification, _)| notification.clone())
        };
        for entry in inner.listeners.iter().filter(|e| !e.listener.is_non_blocking()) {
            entry.listener.add_all(part(entry));
        }
        for entry in inner.listeners.iter().filter(|e| e.listener.is_non_blocking()) {
            inline.extend(entry.listener.hand_over(part(entry)));
        }
        inline
    }

    /// Marks the listeners whose resync is due and schedules their next one; true if any is due.
    pub(crate) fn should_resync(&self) -> bool {
        let now = Instant::now();
        let mut inner = self.write();
        let mut any = false;
        for entry in &mut inner.listeners {
            entry.syncing = entry.listener.should_resync(now);
            if entry.syncing {
                any = true;
                entry.listener.determine_next_resync(now);
            }
        }
        any
    }

    /// Applies a new resync check period to every listener's requested period.
    pub(crate) fn resync_check_period_changed(&self, check: Duration) {
        let inner = self.read();
        for entry in &inner.listeners {
            let period = determine_resync_period(entry.listener.requested_resync_period, check);
            entry.listener.set_resync_period(period);
        }
    }

    /// Every registered listener.
    pub(crate) fn listeners(&self) -> Vec<Arc<ProcessorListener<K>>> {
        self.read().listeners.iter().map(|e| e.listener.clone()).collect()
    }

    /// Starts every listener, delivering on `runtime` (and so do listeners added later).
    pub(crate) fn run(&self, runtime: Handle) {
        let mut inner = self.write();
        for entry in &inner.listeners {
            entry.listener.start(&runtime);
        }
        inner.runtime = Some(runtime);
    }

    /// Stops every listener (after the notification each is handling) without waiting, and
    /// refuses new ones.
    pub(crate) fn stop_listeners(&self) {
        let mut inner = self.write();
        inner.stopped = true;
        for entry in &inner.listeners {
            entry.listener.stop();
        }
    }

    /// Stops every listener, waits until none is inside its handler any more, and joins every
    /// drain task they spawned (those of listeners removed before too), so none outlives this.
    pub(crate) async fn stop(&self) {
        self.stop_listeners();
        let (listeners, removed) = {
            let mut inner = self.write();
            let listeners: Vec<_> = inner.listeners.iter().map(|e| e.listener.clone()).collect();
            (listeners, std::mem::take(&mut inner.removed))
        };
        for listener in listeners.iter().chain(&removed) {
            listener.wait_stopped().await;
            listener.join_drains().await;
        }
    }
}
