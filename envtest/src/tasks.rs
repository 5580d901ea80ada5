//! The tasks alive on the current tokio runtime, for tests that check a component joins every
//! task it spawned (its shutdown leaves the count where it was before the component started).
//!
//! Where it sits: outside the server, beside the tests (like [`crate::logs`]); nothing in the
//! request path uses it. Shared from here as [`crate::logs`] is: the crates whose tests count
//! tasks have envtest as a dev-dependency.
//!
//! Meant for a `current_thread` runtime: there no task starts or ends between two counts but
//! by what the test awaits.
//!
//! ```
//! use envtest::tasks::{alive_tasks, until_alive};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let before = alive_tasks();
//! let _task = tokio::spawn(async {});
//! assert_eq!(alive_tasks(), before + 1, "spawned, not run yet");
//! assert_eq!(until_alive(before).await, before, "ran and ended");
//! # });
//! ```

/// Tasks alive on the current runtime: spawned and not yet ended.
///
/// # Panics
///
/// Outside a tokio runtime, as `tokio::runtime::Handle::current` does.
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current().metrics().num_alive_tasks()
}

/// Yields until `alive_tasks() == want` or 1,000 yields passed; the last count seen.
///
/// For a task that ends on its own soon (a panic, a cancelled token): it needs the runtime's
/// turns to end, and this gives them without sleeping.
pub async fn until_alive(want: usize) -> usize {
    for _ in 0..1_000 {
        if alive_tasks() == want {
            break;
        }
        tokio::task::yield_now().await;
    }
    alive_tasks()
}
