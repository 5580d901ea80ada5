//! The tasks a queue spawns, owned by the queue: the delaying queue's timer and a named queue's
//! metrics refresher.
//!
//! Each is spawned through [`spawn_owned`], which catches a panic in its body and logs it at
//! ERROR with the queue's and the task's names at once (a panic there comes from `T`'s trait
//! impls, see `Waiting::lock`); the queue keeps the handle, and
//! [`Queue::join_tasks`](crate::Queue::join_tasks) waits for every task after shutdown and
//! returns the first panic as a [`TaskPanicked`]. Both tasks end on shutdown or when the last
//! queue handle is dropped, so a dropped queue leaves no task behind either.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// A task of a queue panicked (see [`Queue::join_tasks`](crate::Queue::join_tasks)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("work queue {queue:?}: task {task} panicked: {message}")]
#[non_exhaustive]
pub struct TaskPanicked {
    /// The queue's name, `""` if unnamed.
    pub queue: String,
    /// The task: `"delaying queue timer"` or `"unfinished-work metrics"`.
    pub task: &'static str,
    /// The panic's message.
    pub message: String,
}

/// A spawned task of a queue: its name and handle. Its output is the panic's message, if any.
pub(crate) type OwnedTask = (&'static str, JoinHandle<Option<String>>);

/// Spawns `body` on `runtime` as the queue `queue`'s task `task`: a panic in it is logged at
/// ERROR when it happens and becomes the task's output.
pub(crate) fn spawn_owned(
    runtime: &Handle,
    queue: String,
    task: &'static str,
    body: impl Future<Output = ()> + Send + 'static,
) -> OwnedTask {
    let handle = runtime.spawn(async move {
        let panic = AssertUnwindSafe(body).catch_unwind().await.err()?;
        let message = panic_message(&*panic).to_owned();
        tracing::error!(queue = %queue, task, panic = %message, "work queue task panicked");
        Some(message)
    });
    (task, handle)
}

/// Waits for `tasks`; the first panic among them, if any.
pub(crate) async fn join(queue: &str, tasks: Vec<OwnedTask>) -> Result<(), TaskPanicked> {
    let mut first = None;
    for (task, handle) in tasks {
        let message = match handle.await {
            Ok(None) => continue,
            Ok(Some(message)) => message,
            // Only a runtime shutting down cancels them (nothing aborts them); the body catches
            // its panics, so none reaches here, but report one rather than lose it.
            Err(e) if e.is_panic() => panic_message(&*e.into_panic()).to_owned(),
            Err(_) => continue,
        };
        first.get_or_insert(TaskPanicked {
            queue: queue.to_owned(),
            task,
            message,
        });
    }
    first.map_or(Ok(()), Err)
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}
