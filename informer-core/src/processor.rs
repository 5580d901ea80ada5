//! Fan-out of notifications to every listener (client-go `sharedProcessor`).
//!
//! `distribute` appends to each listener's buffer under a read lock and returns at once.
//! Resync notifications (updates whose resourceVersion did not change) go only to the
//! listeners whose resync period is due, which `should_resync` works out on each resync tick.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::warn;

use crate::listener::{Notification, ProcessorListener};

struct Entry<K> {
    listener: Arc<ProcessorListener<K>>,
    /// Due a resync in the current resync round.
    syncing: bool,
}

struct Inner<K> {
    listeners: Vec<Entry<K>>,
    started: bool,
    /// Set by `stop`: no listener may be added after it, or its thread would outlive `run`.
    stopped: bool,
    /// Exit signals of started listener threads.
    running: Vec<oneshot::Receiver<()>>,
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

impl<K: Send + Sync + 'static> SharedProcessor<K> {
    pub(crate) fn new() -> Self {
        SharedProcessor {
            inner: RwLock::new(Inner {
                listeners: Vec::new(),
                started: false,
                stopped: false,
                running: Vec::new(),
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
        if inner.started
            && let Some(done) = listener.start()
        {
            inner.running.push(done);
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
        drop(inner);
        if removed {
            listener.stop();
        }
        removed
    }

    /// Hands `notification` to every listener, or with `sync` only to those due a resync.
    pub(crate) fn distribute(&self, notification: Notification<K>, sync: bool) {
        let inner = self.read();
        for entry in &inner.listeners {
            if !sync || entry.syncing {
                entry.listener.add(notification.clone());
            }
        }
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

    /// Starts every listener.
    pub(crate) fn run(&self) {
        let mut inner = self.write();
        inner.started = true;
        let mut started = Vec::new();
        for entry in &inner.listeners {
            if let Some(done) = entry.listener.start() {
                started.push(done);
            }
        }
        inner.running.extend(started);
    }

    /// Stops every listener (after the notification each is handling) without waiting, and
    /// refuses new ones. Returns the exit signals of their threads.
    pub(crate) fn stop_listeners(&self) -> Vec<oneshot::Receiver<()>> {
        let mut inner = self.write();
        inner.stopped = true;
        for entry in &inner.listeners {
            entry.listener.stop();
        }
        std::mem::take(&mut inner.running)
    }

    /// Stops every listener and waits for their threads to exit.
    pub(crate) async fn stop(&self) {
        let running = self.stop_listeners();
        for done in running {
            let _ = done.await;
        }
    }
}
