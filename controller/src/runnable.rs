//! [`Runnable`]: what a [`Manager`](crate::Manager) runs (controller-runtime's `Runnable` and
//! `LeaderElectionRunnable`): every [`BuiltController`](crate::BuiltController), and tasks of
//! your own ([`runnable_fn`]).
//!
//! Where it sits: between the Manager, which starts runnables under its leadership rules, and
//! the controllers, which implement it; neither imports the other through it.

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::healthz::Checker;
use crate::leadership::Leadership;
use crate::reconciler::BoxError;

/// Something the [`Manager`](crate::Manager) runs: a [`BuiltController`](crate::BuiltController), or your own
/// task (controller-runtime's `Runnable` and `LeaderElectionRunnable`).
pub trait Runnable: Send + 'static {
    /// A name for logs and errors.
    fn name(&self) -> &str;

    /// Whether it may run only while this process leads (default: true, as controllers).
    fn needs_leader_election(&self) -> bool {
        true
    }

    /// The readiness checks it brings to the [`Manager`](crate::Manager)'s `/readyz`, which
    /// registers them when the runnable is added (default: none). A
    /// [sharded](crate::ControllerBuilder::sharded) [`BuiltController`](crate::BuiltController)
    /// brings `shard-<ring>`, failing while its shard does not hold its shard Lease
    /// ([`ShardReadiness`](crate::sharding::ShardReadiness)).
    fn readyz_checks(&self) -> Vec<Checker> {
        Vec::new()
    }

    /// Runs until `shutdown` fires; an `Err` makes the manager shut down and fail.
    fn start(self: Box<Self>, shutdown: CancellationToken) -> BoxFuture<'static, Result<(), BoxError>>;

    /// Runs as [`start`](Self::start), and stops at once, without finishing its work, when
    /// `stop_now` fires. The manager starts every runnable this way, and fires `stop_now` when
    /// the lease is lost (another process may lead already), right before `shutdown` and
    /// before aborting whatever still runs. The default ignores `stop_now`, leaving it to that
    /// abort; a [`BuiltController`](crate::BuiltController) stops taking keys from its queue.
    fn start_with_stop_now(
        self: Box<Self>,
        shutdown: CancellationToken,
        stop_now: CancellationToken,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        let _ = stop_now;
        self.start(shutdown)
    }

    /// As [`start_with_stop_now`](Self::start_with_stop_now), under `leadership`: the manager
    /// starts the runnables that [need leader election](Self::needs_leader_election) this
    /// way, with the lease's current term ([`Leadership::unconditional`] without leader
    /// election). Its token fires the instant the lease stops being valid by the local clock,
    /// before the manager's own reaction (`stop_now`); guard writes with
    /// [`Leadership::check`]. The default ignores it; a
    /// [`BuiltController`](crate::BuiltController) stops at once when it ends, and checks it
    /// before every reconcile and event write.
    fn start_leading(
        self: Box<Self>,
        shutdown: CancellationToken,
        stop_now: CancellationToken,
        leadership: Leadership,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        let _ = leadership;
        self.start_with_stop_now(shutdown, stop_now)
    }
}

/// A [`Runnable`] made of a closure.
pub struct RunnableFn<F> {
    name: String,
    needs_leader_election: bool,
    f: F,
}

/// A [`Runnable`] running `f(shutdown)`.
pub fn runnable_fn<F, Fut>(name: impl Into<String>, needs_leader_election: bool, f: F) -> RunnableFn<F>
where
    F: FnOnce(CancellationToken) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    RunnableFn {
        name: name.into(),
        needs_leader_election,
        f,
    }
}

impl<F, Fut> Runnable for RunnableFn<F>
where
    F: FnOnce(CancellationToken) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn needs_leader_election(&self) -> bool {
        self.needs_leader_election
    }

    fn start(self: Box<Self>, shutdown: CancellationToken) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin((self.f)(shutdown))
    }
}

/// The identity of this process for leader election and events: `$HOSTNAME` (a pod's name), or
/// the host name, or `kinformer`.
pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "kinformer".to_owned())
}
