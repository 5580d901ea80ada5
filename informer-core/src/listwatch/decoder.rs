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
//! kube-runtime's). Decoded on one thread, a lister-watcher's objects come from one arena: their
//! contents (strings, maps and lists: almost all of their bytes) and the `Arc` each is cached
//! in, which the thread allocates right after decoding the object (with the reflector's
//! transform, if it has one: `ListerWatcher::list_shared`, `watch_shared`). What an update frees
//! (handed back with `ListerWatcher::release`) is what the next update allocates.
//!
//! The network stays on tokio: the requests, the reads of response bodies and the prefetch of
//! list pages run as before, and hand their bytes to this thread. A page fetched ahead queues
//! behind the page being decoded, so fetching still overlaps decoding; the watch stream reads
//! the connection while the previous read is decoded (`ApiListerWatcher::watch_shared`).
//!
//! Lifetime: the first job starts the thread (`kinformer-decode`); it ends once it has been
//! idle for [`IDLE`] (a quiet watch, a stopped informer) or its lister-watcher is gone (after
//! running the jobs already queued), and the next job starts it again, so a stopped informer
//! holds no thread. A job whose caller is gone (a watch dropped, a page's fetch aborted) is
//! skipped. A job that panics (a user's `compact` function or the reflector's transform on a
//! list page's object; a watch line's panic is caught on its own and skipped as a malformed
//! object) is logged with its resource and the panic's message; its caller gets `None` (the
//! list page fails and the list is retried, the watch ends and is resumed from its last
//! resourceVersion) and the thread goes on.
//!
//! Jobs run on tokio's blocking pool instead (`spawn_blocking`, panics caught the same way) if
//! a thread cannot be started (logged once; this `DecodeThread` does not try again) or if the
//! lister-watcher was told to ([`ApiListerWatcher::decode_on_blocking_pool`]): tokio's paused
//! clock does not advance while a blocking-pool task runs, but does while this thread works.
//!
//! [`ApiListerWatcher::decode_on_blocking_pool`]: super::ApiListerWatcher::decode_on_blocking_pool

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tracing::{error, warn};

/// A unit of work for the thread.
type Job = Box<dyn FnOnce() + Send>;

/// How long the thread waits for a job before it ends.
pub(super) const IDLE: Duration = Duration::from_secs(10);

/// Where jobs run, and the sending end of a running thread's jobs.
///
/// Invariant: `jobs` is `Some` exactly while a thread runs that takes jobs from it; the thread
/// sets it to `None` itself, under this lock and with no job left, before it ends.
#[derive(Default)]
struct State {
    jobs: Option<Sender<Job>>,
    /// Jobs go to tokio's blocking pool: asked for, or a thread could not be started.
    blocking_pool: bool,
}

type Slot = Mutex<State>;

/// A decoding thread (see the module doc). Clones share the thread.
#[derive(Clone, Default)]
pub(super) struct DecodeThread {
    slot: Arc<Slot>,
}

fn lock(slot: &Slot) -> MutexGuard<'_, State> {
    // No code panics while holding it.
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The message a panic was raised with, if it is a string (as `panic!`'s are).
pub(super) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(message), _) => message,
        (None, Some(message)) => message,
        (None, None) => "(not a string)",
    }
}

impl DecodeThread {
    /// Runs `job` on the thread, after the jobs handed over before it; the future resolves to
    /// its result, or `None` if it panicked (logged, naming `resource`). The job is skipped if
    /// the future was dropped before the job's turn came.
    pub(super) fn run<T, F>(
        &self,
        resource: Arc<str>,
        job: F,
    ) -> impl Future<Output = Option<T>> + Send + 'static + use<T, F>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (done, result) = tokio::sync::oneshot::channel();
        self.submit(Box::new(move || {
            // The caller is gone (a watch dropped, a page's fetch aborted): nothing to do.
            if done.is_closed() {
                return;
            }
            match catch_unwind(AssertUnwindSafe(job)) {
                Ok(value) => {
                    let _ = done.send(value);
                }
                Err(panic) => error!(
                    resource = %resource,
                    panic = panic_message(panic.as_ref()),
                    "a decoding job panicked (a compact or transform function?): its list page fails, or its \
                     watch ends and is resumed from its last resourceVersion"
                ),
            }
        }));
        async move { result.await.ok() }
    }

    /// Drops `garbage` on the thread, after the jobs handed over before it: objects it
    /// decoded go back to its arena from the thread that allocates from it.
    pub(super) fn release(&self, garbage: Box<dyn Any + Send>) {
        self.submit(Box::new(move || drop(garbage)));
    }

    /// From now on, runs jobs on tokio's blocking pool (`on`) or on the thread.
    pub(super) fn set_blocking_pool(&self, on: bool) {
        lock(&self.slot).blocking_pool = on;
    }

    fn submit(&self, job: Job) {
        let mut state = lock(&self.slot);
        if state.blocking_pool {
            drop(state);
            on_blocking_pool(job);
            return;
        }
        let job = match state.jobs.as_ref() {
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
                state.jobs = Some(jobs);
            }
            Err(e) => {
                state.blocking_pool = true;
                drop(state);
                warn!(error = %e, "could not start a decoding thread; decoding on tokio's blocking pool from now on");
                on_blocking_pool(job);
            }
        }
    }
}

/// Runs `job` on tokio's blocking pool, or right here outside a runtime; a panic is caught.
fn on_blocking_pool(job: Job) {
    let job = move || {
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            error!("a decoding job panicked on the blocking pool");
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(job)),
        Err(_) => job(),
    }
}

/// The thread's loop: jobs in order until it is idle for [`IDLE`] or its slot is gone (then
/// the jobs still queued run first).
fn work(jobs: Receiver<Job>, slot: Weak<Slot>) {
    loop {
        let job = match jobs.recv_timeout(IDLE) {
            Ok(job) => job,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let Some(slot) = slot.upgrade() else {
                    // Its lister-watcher is gone: what it queued still runs (its callers may
                    // wait for it).
                    while let Ok(job) = jobs.try_recv() {
                        run_job(job);
                    }
                    return;
                };
                let mut state = lock(&slot);
                // A job sent while we timed out is still taken.
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => {
                        state.jobs = None;
                        return;
                    }
                }
            }
        };
        run_job(job);
    }
}

/// Runs one job; `run`'s jobs catch their own panics (and log them with their resource), so
/// this only keeps the thread alive.
fn run_job(job: Job) {
    if catch_unwind(AssertUnwindSafe(job)).is_err() {
        error!(thread = "kinformer-decode", "a decoding job panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_in_order_on_one_thread_and_a_panic_costs_only_its_job() {
        let decoder = DecodeThread::default();
        let first = decoder.run("configmaps".into(), || std::thread::current().id());
        let panics = decoder.run("configmaps".into(), || -> u32 { panic!("a job that panics") });
        let last = decoder.run("configmaps".into(), || std::thread::current().id());
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
        let held = decoder.run("configmaps".into(), move || {
            HELD.with(|held| *held.borrow_mut() = Some(SendOnDrop(ended)))
        });
        assert_eq!(held.await, Some(()));
        assert!(
            thread_ended.try_recv().is_err(),
            "the thread runs on while its decoder lives"
        );
        drop(decoder);
        assert!(thread_ended.recv_timeout(Duration::from_secs(5)).is_ok());
    }

    #[tokio::test]
    async fn a_job_whose_caller_is_gone_is_skipped() {
        let decoder = DecodeThread::default();
        // Holds the thread until the test lets it go, so the next job waits in the queue.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let blocker = decoder.run("configmaps".into(), move || wait.recv_timeout(Duration::from_secs(5)));
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let abandoned = {
            let ran = ran.clone();
            decoder.run("configmaps".into(), move || {
                ran.store(true, std::sync::atomic::Ordering::SeqCst)
            })
        };
        drop(abandoned);
        go.send(()).unwrap();
        assert!(blocker.await.is_some_and(|waited| waited.is_ok()));
        // A job after it has run once this one is answered: the abandoned one was skipped.
        assert_eq!(decoder.run("configmaps".into(), || 1).await, Some(1));
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn on_the_blocking_pool_jobs_run_off_the_thread_and_panics_are_caught() {
        let decoder = DecodeThread::default();
        decoder.set_blocking_pool(true);
        let name = decoder.run("configmaps".into(), || std::thread::current().name().map(str::to_owned));
        assert_ne!(name.await.flatten().as_deref(), Some("kinformer-decode"));
        let panics = decoder.run("configmaps".into(), || -> u32 { panic!("a job that panics") });
        assert_eq!(panics.await, None);
        assert_eq!(decoder.run("configmaps".into(), || 2).await, Some(2));
        assert!(lock(&decoder.slot).jobs.is_none(), "no thread was started");
    }
}
