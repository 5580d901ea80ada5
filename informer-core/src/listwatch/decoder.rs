//! The thread that decodes what an [`ApiListerWatcher`](super::ApiListerWatcher) receives:
//! its list pages and its watch reads, one job after another, in the order they were handed
//! over.
//!
//! Why one thread for both: glibc's malloc serves each thread from an arena of its own and
//! gives a freed block back to the arena it came from. List pages used to be decoded on
//! tokio's blocking pool and watch events on the async workers, so the listed objects and the
//! objects that replace them came from different arenas: a listed object freed when an update
//! replaced it went back to an arena the watch decoder never allocates from, and the process
//! grew by one object per update until every listed object had been replaced (peak RSS 1.5–1.7×
//! kube-runtime's). Decoded on one thread, every object of a lister-watcher comes from one
//! arena, and what an update frees is what the next update allocates.
//!
//! The network stays on tokio: the requests, the reads of response bodies and the prefetch of
//! list pages run as before, and hand their bytes to this thread. A page fetched ahead queues
//! behind the page being decoded, so fetching still overlaps decoding; the watch stream reads
//! the connection while the previous read is decoded (`ApiListerWatcher::watch`).
//!
//! Lifetime: the first job starts the thread (`kinformer-decode`); it ends once it has been
//! idle for [`IDLE`] (a quiet watch, a stopped informer) or its lister-watcher is gone, and the
//! next job starts it again, so a stopped informer holds no thread. A job that panics (a
//! user's `compact` function) is logged; its caller gets `None` and the thread goes on. If a
//! thread cannot be started, the job runs on the caller.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tracing::{error, warn};

/// A unit of work for the thread.
type Job = Box<dyn FnOnce() + Send>;

/// How long the thread waits for a job before it ends.
pub(super) const IDLE: Duration = Duration::from_secs(10);

/// The sending end of a running thread's jobs.
///
/// Invariant: `Some` exactly while a thread runs that takes jobs from it; the thread sets it to
/// `None` itself, under this lock and with no job left, before it ends.
type Slot = Mutex<Option<Sender<Job>>>;

/// A decoding thread (see the module doc). Clones share the thread.
#[derive(Clone, Default)]
pub(super) struct DecodeThread {
    slot: Arc<Slot>,
}

fn lock(slot: &Slot) -> MutexGuard<'_, Option<Sender<Job>>> {
    // No code panics while holding it.
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DecodeThread {
    /// Runs `job` on the thread, after the jobs handed over before it; the future resolves to
    /// its result, or `None` if it panicked.
    pub(super) fn run<T, F>(&self, job: F) -> impl Future<Output = Option<T>> + Send + 'static + use<T, F>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (done, result) = tokio::sync::oneshot::channel();
        self.submit(Box::new(move || {
            // The caller may have gone (a watch dropped): nothing to hand the result to.
            let _ = done.send(job());
        }));
        async move { result.await.ok() }
    }

    /// Drops `garbage` on the thread, after the jobs handed over before it: objects it
    /// decoded go back to its arena from the thread that allocates from it.
    pub(super) fn release(&self, garbage: Box<dyn std::any::Any + Send>) {
        self.submit(Box::new(move || drop(garbage)));
    }

    fn submit(&self, job: Job) {
        let mut slot = lock(&self.slot);
        let job = match slot.as_ref() {
            Some(jobs) => match jobs.send(job) {
                Ok(()) => return,
                // The thread is gone (it panicked outside a job): start another.
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (jobs, receiver) = mpsc::channel::<Job>();
        let weak = Arc::downgrade(&self.slot);
        match std::thread::Builder::new()
            .name("kinformer-decode".into())
            .spawn(move || work(receiver, weak))
        {
            Ok(_) => {
                // The new thread cannot end before it took this job: ending needs `slot`'s lock.
                let _ = jobs.send(job);
                *slot = Some(jobs);
            }
            Err(e) => {
                drop(slot);
                warn!(error = %e, "could not start a decoding thread; decoding on the caller");
                job();
            }
        }
    }
}

/// The thread's loop: jobs in order until it is idle for [`IDLE`] or its slot is gone.
fn work(jobs: Receiver<Job>, slot: Weak<Slot>) {
    loop {
        let job = match jobs.recv_timeout(IDLE) {
            Ok(job) => job,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let Some(slot) = slot.upgrade() else { return };
                let mut sender = lock(&slot);
                // A job sent while we timed out is still taken.
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => {
                        *sender = None;
                        return;
                    }
                }
            }
        };
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            error!(
                thread = "kinformer-decode",
                "a decoding job panicked (a compact function?); its page or watch read is lost"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_in_order_on_one_thread_and_a_panic_costs_only_its_job() {
        let decoder = DecodeThread::default();
        let first = decoder.run(|| std::thread::current().id());
        let panics = decoder.run(|| -> u32 { panic!("a job that panics") });
        let last = decoder.run(|| std::thread::current().id());
        let (first, panics, last) = (first.await, panics.await, last.await);
        assert!(first.is_some() && first == last, "one thread: {first:?} {last:?}");
        assert_ne!(first, Some(std::thread::current().id()));
        assert_eq!(panics, None);
    }

    #[tokio::test]
    async fn the_thread_ends_when_its_decoder_is_dropped() {
        /// Sends when the thread that holds it ends (thread-locals are dropped then).
        struct SendOnDrop(std::sync::mpsc::Sender<()>);
        impl Drop for SendOnDrop {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        thread_local! {
            static HELD: std::cell::RefCell<Option<SendOnDrop>> = const { std::cell::RefCell::new(None) };
        }
        let decoder = DecodeThread::default();
        let (ended, thread_ended) = std::sync::mpsc::channel();
        let held = decoder.run(move || HELD.with(|held| *held.borrow_mut() = Some(SendOnDrop(ended))));
        assert_eq!(held.await, Some(()));
        assert!(
            thread_ended.try_recv().is_err(),
            "the thread runs on while its decoder lives"
        );
        drop(decoder);
        assert!(thread_ended.recv_timeout(Duration::from_secs(5)).is_ok());
    }
}
