//! The built controller's runtime, [`BuiltController`] (controller-runtime's
//! `pkg/internal/controller`, on client-go's informers): handlers on the factory's shared
//! informers feed a rate-limited work queue of [`ObjectKey`]s; workers hand each key to a
//! [`Reconciler`]. The [`Controller`](crate::Controller) builder that makes one is in
//! `builder.rs`, the sources' plumbing in `source.rs`.
//!
//! ```no_run
//! use controller::{Action, Context, Controller, Request, reconciler_fn};
//! use factory::SharedInformerFactory;
//! use k8s_openapi::api::apps::v1::Deployment;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube::Client) -> Result<(), controller::ControllerError> {
//! let factory = SharedInformerFactory::new(client, std::time::Duration::ZERO);
//! let reconciler = reconciler_fn(|req: Request, ctx: Context<Deployment>| async move {
//!     let Some(deployment) = ctx.get(&req)? else { return Ok::<_, controller::BoxError>(Action::Done) };
//!     // ... compare `deployment` with the desired state, write through kube::Api ...
//!     # let _ = deployment;
//!     Ok(Action::Done)
//! });
//! Controller::new("deployments", &factory)
//!     .for_resource::<Deployment>()
//!     .owns::<ConfigMap>()
//!     .workers(4)
//!     .run(reconciler, CancellationToken::new())
//!     .await
//! # }
//! ```
//!
//! # Guarantees
//! - One watch per type: handlers go on the factory's shared informers, so any number of
//!   controllers (and listers) of one type share one list/watch.
//! - No key is reconciled by two workers at once (the work queue's rule); a key changed while
//!   it is being reconciled is reconciled again afterwards, so the last reconcile of a key sees
//!   its last state.
//! - A deleted primary is reconciled too: its key arrives and [`Context::get`] says it is gone
//!   (kube-runtime does not reconcile deletions).
//! - Workers start only once every informer of the controller has synced *and* delivered its
//!   initial list to this controller's handlers, so the first reconciles see a full cache.
//! - A panicking reconcile is caught: the worker survives, and the panic takes the error path
//!   as a [`ReconcilePanic`] carrying its message (logged, counted, seen by the error policy,
//!   retried rate-limited by default). With [`recover_panic(false)`](crate::Controller::recover_panic)
//!   the controller stops at once instead and its run fails.
//! - A reconcile never holds a worker past the [reconcile
//!   timeout](crate::Controller::reconcile_timeout), if one is set: its token is cancelled and
//!   its future dropped, and it takes the error path as a [`ReconcileTimeout`].
//! - Failed reconciles are treated as the [`outcome`](crate::outcome) module's table says:
//!   [`TerminalError`]s are not retried, [`RequeueAfterError`]s are retried after their delay,
//!   other errors as the error policy says, or rate-limited; a stale-cache race (a 409 or 404
//!   from the API server, see [`error_chain`](crate::error_chain)) is a requeue logged at INFO.
//!   Each log line of a failed reconcile names the controller and the key as fields of its own
//!   (not only of the INFO `reconcile` span), and prints the error's chain once
//!   ([`ErrorChain`]).
//! - Under a [`Manager`](crate::Manager) with leader election, a deposed leader writes nothing
//!   for the controller: before every reconcile a worker checks the lease's term by the local
//!   clock ([`Leadership`], see [`run_leading`](BuiltController::run_leading)) and puts a key
//!   taken after it lapsed back, unreconciled; the event recorder refuses every write once it
//!   lapsed; reconcilers guard their own writes with [`Context::ensure_leading`] and stop
//!   waiting on [`Context::cancelled`], which fires at the validity deadline itself. A refusal
//!   ([`NotLeader`] anywhere in a reconcile error's chain) is logged at INFO: a deposed leader
//!   skipping work is an expected race, not a failure.
//!
//! # Shutdown
//! When the shutdown token fires: the handlers are removed (no new keys) and the queue is shut
//! down. As with controller-runtime, whose workers loop on client-go's `Get`, the workers keep
//! reconciling the keys already queued and stop once the queue is empty; keys waiting for a
//! retry are dropped, and so are retries a reconcile asks for from now on (the queue ignores
//! them). The whole drain gets
//! [`graceful_shutdown_timeout`](crate::Controller::graceful_shutdown_timeout): reconciles still
//! running then are aborted, the keys still queued are left, and `run` returns
//! [`ControllerError::ShutdownTimeout`]. Every key the queue accepted and no worker finished
//! (still queued, waiting for a retry, its retry refused, or aborted) is logged and counted in
//! `kinformer_controller_dropped_keys_total`: nothing is dropped silently. (A restarted
//! controller reconciles every object again from its initial list.)
//!
//! A controller owns every task it spawns: its workers (a `JoinSet`), its event recorder's sink,
//! its triggers' forwarders (`source.rs`) and its work queue's timer and metrics tasks are all
//! joined before `run` returns, so a stopped controller leaves nothing running. A panic in one
//! of them is logged at ERROR with the controller's name and the task's (a reconcile's panic
//! takes the error path, see above).
//!
//! [`run_with_stop_now`](BuiltController::run_with_stop_now) adds a second token for when
//! finishing the work would be wrong, such as a lost leader election lease (another process
//! may lead already): once it fires, no worker takes another key, queued or not, and the
//! reconciles in flight are aborted at once; the keys left are reported dropped as above. The
//! [`Manager`](crate::Manager) fires it when its lease is lost.
use std::any::Any;
use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use factory::{FactoryError, SharedInformerFactory};
use futures::FutureExt;
use futures::future::BoxFuture;
use informer_core::InformerError;
use kube::Resource;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::error_chain::{ErrorChain, stale_cache_race};
use crate::event_recorder::EventRecorder;
use crate::healthz::Checker;
use crate::leadership::{Leadership, NotLeader};
use crate::metrics::ControllerMetrics;
use crate::object_key::{ObjectKey, Request};
use crate::outcome::{ReconcilePanic, ReconcileTimeout, RequeueAfterError, TerminalError, find_in_chain};
use crate::rbac::Permissions;
use crate::reconciler::{Action, BoxError, Context, Reconciler, RunScope};
use crate::runnable::Runnable;
use crate::sharding::{Admit, ShardGate, ShardMembership};
use crate::source::ErasedRegistration;
use crate::work_queue::WorkQueue;

/// How long in-flight reconciles may take to finish after shutdown (controller-runtime's
/// default graceful shutdown timeout).
pub const DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a controller waits for its caches before giving up (controller-runtime's
/// `CacheSyncTimeout` default).
pub const DEFAULT_CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors of building or running a controller.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// The factory refused an informer (it was shut down).
    #[error(transparent)]
    Factory(#[from] FactoryError),
    /// An informer refused the controller's handler (it was stopped).
    #[error(transparent)]
    Informer(#[from] InformerError),
    /// The metric families could not be registered.
    #[error("registering controller metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The builder was given an impossible setting.
    #[error("invalid controller configuration: {0}")]
    InvalidConfig(String),
    /// Two sources of one type read two informers (other cache options through
    /// [`SourceOptions::informer_with`](crate::SourceOptions::informer_with)), so
    /// [`Context::lister_for`](crate::Context::lister_for) could not tell which cache it means.
    /// A controller reads one cache per type, as controller-runtime's one cache per type
    /// refuses conflicting `ByObject` options: give both sources one informer, and filter each
    /// with its own predicates (such as a `LabelSelectorPredicate`).
    #[error(
        "controller {controller}: two informers of one type, [{first}] and [{second}]: a controller reads one cache per type; use one informer and per-source predicates"
    )]
    ConflictingCaches {
        /// The controller's name.
        controller: String,
        /// The informer the first source of the type reads.
        first: String,
        /// The informer another source of the type reads.
        second: String,
    },
    /// Some informers did not sync in time (a wrong group or a missing CRD, typically).
    #[error("controller {controller}: caches not synced within {timeout:?}: {informers:?}")]
    CacheSyncTimeout {
        /// The controller's name.
        controller: String,
        /// How long it waited.
        timeout: Duration,
        /// The informers that had not synced.
        informers: Vec<String>,
    },
    /// The workers had not finished the queued keys when the graceful shutdown timeout passed:
    /// the reconciles running were aborted, and their keys and those still queued reported as
    /// dropped.
    #[error("controller {controller}: {in_flight} reconciles still running after {timeout:?}; aborted")]
    ShutdownTimeout {
        /// The controller's name.
        controller: String,
        /// The graceful shutdown timeout.
        timeout: Duration,
        /// How many reconciles were aborted.
        in_flight: usize,
    },
    /// A reconcile panicked with panic recovery off
    /// ([`recover_panic(false)`](crate::Controller::recover_panic)): the controller stopped at
    /// once, as after `stop_now` (controller-runtime re-panics and the process dies; a library
    /// must not end the process, so it returns this and a [`Manager`](crate::Manager) shuts
    /// down and fails).
    #[error("controller {controller}: a reconcile panicked: {message}")]
    ReconcilePanicked {
        /// The controller's name.
        controller: String,
        /// The panic's message.
        message: String,
    },
    /// A sharded controller lost its shard Lease while running (it could not renew it within
    /// `renew_deadline`: the API server was unreachable, or another holder took it): its
    /// workers stopped at once, and it does not rejoin by itself. A
    /// [`Manager`](crate::Manager) then shuts down and fails, as controller-runtime's does
    /// after losing the leader lease: the process restarts and joins as a fresh member.
    #[error("controller {controller}: lost shard lease {lease} of ring {ring}: {reason}")]
    ShardLeaseLost {
        /// The controller's name.
        controller: String,
        /// The ring.
        ring: String,
        /// The shard Lease's name.
        lease: String,
        /// Why it was lost, as the renewal reported it.
        reason: String,
    },
}

/// A function of a reconcile's error (the reconciler's own, a [`ReconcileTimeout`] or a
/// [`ReconcilePanic`]), the request and the context, returning what to do with the key
/// (kube-runtime's `error_policy`). Set with
/// [`Controller::error_policy`](crate::Controller::error_policy).
pub type ErrorPolicy<K> =
    Arc<dyn Fn(&(dyn std::error::Error + Send + Sync + 'static), &Request, &Context<K>) -> Action + Send + Sync>;

/// What a controller does with its reconciles' outcomes, as the builder set it.
pub(crate) struct Outcomes<K> {
    /// `None`: controller-runtime's rate-limited retry.
    pub(crate) error_policy: Option<ErrorPolicy<K>>,
    /// `None`: no timeout.
    pub(crate) reconcile_timeout: Option<Duration>,
    pub(crate) recover_panic: bool,
}

impl<K> Clone for Outcomes<K> {
    fn clone(&self) -> Self {
        Outcomes {
            error_policy: self.error_policy.clone(),
            reconcile_timeout: self.reconcile_timeout,
            recover_panic: self.recover_panic,
        }
    }
}
/// A controller with its handlers registered and its reconciler bound: run it with
/// [`run`](Self::run), or add it to a [`Manager`](crate::Manager).
pub struct BuiltController<K, R> {
    pub(crate) name: String,
    pub(crate) factory: SharedInformerFactory,
    pub(crate) queue: WorkQueue,
    pub(crate) reconciler: Arc<R>,
    pub(crate) context: Context<K>,
    pub(crate) registrations: Vec<Box<dyn ErasedRegistration>>,
    pub(crate) metrics: ControllerMetrics,
    pub(crate) workers: usize,
    pub(crate) graceful_shutdown_timeout: Duration,
    pub(crate) cache_sync_timeout: Duration,
    pub(crate) recorder: EventRecorder,
    pub(crate) owns_recorder: bool,
    pub(crate) outcomes: Outcomes<K>,
    /// Keys whose retry a reconcile asked for once the queue was shutting down (so the queue
    /// refused it): reported dropped with the queue's unfinished keys, each key once.
    pub(crate) refused_retries: RefusedRetries,
    /// This replica's shard of a ring, if sharded (see [`crate::sharding`]).
    pub(crate) sharding: Option<Arc<ShardGate>>,
    /// The API access its sources, declared writes and event recorder need.
    pub(crate) permissions: Permissions,
}

/// See [`BuiltController::refused_retries`].
pub(crate) type RefusedRetries = Arc<std::sync::Mutex<Vec<ObjectKey>>>;

impl<K, R> BuiltController<K, R>
where
    K: Resource + Send + Sync + 'static,
    R: Reconciler<K>,
{
    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The API access the controller needs: `get`, `list`, `watch` on each source's type, the
    /// writes declared with [`Controller::writes`](crate::Controller::writes) and
    /// [`writes_status`](crate::Controller::writes_status), and its event recorder's
    /// ([`Permissions::events`]). [`crate::manifests`] writes them as its RBAC rules.
    pub fn permissions(&self) -> &Permissions {
        &self.permissions
    }

    /// The controller's work queue: add keys to it, at any priority, to trigger reconciles from
    /// outside the informers (controller-runtime's channel source).
    pub fn queue(&self) -> &WorkQueue {
        &self.queue
    }

    /// The context its reconciles get.
    pub fn context(&self) -> &Context<K> {
        &self.context
    }

    /// Whether every informer of the controller has synced and delivered its initial list to
    /// the controller's handlers.
    pub fn has_synced(&self) -> bool {
        self.registrations.iter().all(|r| r.has_synced())
    }

    /// Waits for the caches, runs the workers until `shutdown` fires, then shuts down as the
    /// [module docs](self) say: the keys already queued are reconciled within the graceful
    /// shutdown timeout. Does not start the informers: the caller (or the
    /// [`Manager`](crate::Manager)) starts the factory.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ControllerError> {
        self.run_with_stop_now(shutdown, CancellationToken::new()).await
    }

    /// As [`run`](Self::run), and when `stop_now` fires (while running or during the graceful
    /// shutdown), stops at once: no worker takes another key, the reconciles in flight are
    /// aborted, and every key left is reported dropped. Returns `Ok` then: stopping was asked
    /// for. For when another process may already act on the same objects, such as after losing
    /// a leader election lease (the [`Manager`](crate::Manager) uses it so).
    pub async fn run_with_stop_now(
        self,
        shutdown: CancellationToken,
        stop_now: CancellationToken,
    ) -> Result<(), ControllerError> {
        if let Some(gate) = self.sharding.clone() {
            return self.run_sharded(&gate, shutdown, stop_now).await;
        }
        self.run_leading(shutdown, stop_now, Leadership::unconditional()).await
    }

    /// A sharded controller's run: joins the ring (acquires and labels its shard Lease, waits
    /// until it carries no fence), lists the shard's objects, reports ready, runs under that
    /// Lease's term as under a leader's (its workers stop at once if it cannot be renewed), and
    /// after the workers stopped (the graceful drain included) releases the Lease, so the
    /// sharder moves its objects at once and no other shard reconciles one of them before this
    /// one finished. A Lease lost while running (not renewed within
    /// `renew_deadline`) stops the workers at once and returns
    /// [`ControllerError::ShardLeaseLost`]: the shard does not rejoin in place.
    async fn run_sharded(
        self,
        gate: &ShardGate,
        shutdown: CancellationToken,
        stop_now: CancellationToken,
    ) -> Result<(), ControllerError> {
        let membership = ShardMembership::new(gate.client().clone(), &gate.config, &self.name)
            .map_err(|e| ControllerError::InvalidConfig(format!("controller {}: shard lease: {e}", self.name)))?;
        let Some((leadership, renewing)) = membership.join(&shutdown).await else {
            // Shut down before joining: the run holds no term, so it cleans up under one that
            // has already ended (its workers reconcile nothing, not even the keys its informers
            // queued while it waited: this shard's objects may be moving under a fence).
            let ended = Leadership::unconditional();
            ended.token().cancel();
            return self.run_leading(shutdown, stop_now, ended).await;
        };
        let name = self.name.clone();
        // The run's LIST of its shard's objects, before it reports ready and before any worker
        // admits a key: a tombstone counts only if newer than it (drain.rs, `# Deletions`).
        // Stopped (shutdown, or the term ended) before it succeeded, the run goes on to stop,
        // and an admission during its graceful shutdown lists then.
        tokio::select! {
            () = gate.list_at_join(&name) => membership.ready(&leadership),
            () = shutdown.cancelled() => {}
            () = stop_now.cancelled() => {}
            () = leadership.token().cancelled() => {}
        }
        let result = self.run_leading(shutdown.clone(), stop_now.clone(), leadership).await;
        // The workers stopped: either stopping was asked for, or the term ended (the Lease
        // could not be renewed). Rejoining in place is not done: this run consumed the
        // controller, and a fresh member should start from a fresh cache and queue.
        let lost = membership.leave(renewing).await;
        let asked = shutdown.is_cancelled() || stop_now.is_cancelled();
        match (result, lost, asked) {
            (Err(e), _, _) => Err(e),
            (Ok(()), Some(reason), _) => Err(ControllerError::ShardLeaseLost {
                controller: name,
                ring: gate.config.ring.clone(),
                lease: gate.config.lease_name(),
                reason,
            }),
            (Ok(()), None, false) => Err(ControllerError::ShardLeaseLost {
                controller: name,
                ring: gate.config.ring.clone(),
                lease: gate.config.lease_name(),
                reason: "its term ended before shutdown was asked for".into(),
            }),
            (Ok(()), None, true) => Ok(()),
        }
    }

    /// As [`run_with_stop_now`](Self::run_with_stop_now), only while `leadership` holds (the
    /// [`Manager`](crate::Manager) passes its lease's term): when it ends, the controller stops
    /// at once as if `stop_now` fired. Before every reconcile a worker checks it by the clock
    /// ([`Leadership::is_valid`]): a key taken after it lapsed is not reconciled but put back,
    /// logged below ERROR. The reconciles' [`Context`] carries it
    /// ([`Context::ensure_leading`], [`Context::token`]), and the event recorder refuses every
    /// write once it lapsed.
    pub async fn run_leading(
        self,
        shutdown: CancellationToken,
        stop_now: CancellationToken,
        leadership: Leadership,
    ) -> Result<(), ControllerError> {
        // Ends with the term, or when `stop_now` fires (run_workers forwards it).
        let leadership = leadership.narrowed();
        let context = self.context.scoped(RunScope::new(leadership.clone()));
        self.recorder.set_leadership(leadership.clone());
        let recorder_stop = CancellationToken::new();
        let recorder_task = self.owns_recorder.then(|| {
            let (recorder, stop) = (self.recorder.clone(), recorder_stop.clone());
            tokio::spawn(async move { recorder.run(stop).await })
        });
        let result = self.run_workers(&shutdown, &stop_now, &context).await;
        recorder_stop.cancel();
        if let Some(mut task) = recorder_task {
            let ended = match tokio::time::timeout(Duration::from_secs(5), &mut task).await {
                Ok(ended) => ended,
                Err(_) => {
                    warn!(controller = %self.name, "event recorder did not finish writing within 5s: aborted");
                    task.abort();
                    task.await
                }
            };
            if let Err(e) = ended
                && e.is_panic()
            {
                error!(controller = %self.name, task = "event recorder", panic = %panic_message(&*e.into_panic()),
                    "controller task panicked");
            }
        }
        self.registrations.iter().for_each(|r| r.remove());
        self.join_tasks().await;
        result
    }

    /// Joins the tasks the controller's parts spawned, once they were told to stop (handlers
    /// removed, queue shut down): the triggers' and the work queue's. Their panics were logged
    /// when they happened; the queue's is logged again here with the controller's name.
    async fn join_tasks(&self) {
        self.queue.shut_down(); // already, on every path; the queue's tasks end with it
        for task in self.registrations.iter().filter_map(|r| r.take_task()) {
            // A trigger catches and logs its own panic; an abort (runtime shutdown) is no news.
            let _ = task.await;
        }
        if let Err(e) = self.queue.join_tasks().await {
            error!(controller = %self.name, task = e.task, panic = %e.message, "work queue task panicked");
        }
    }

    async fn wait_for_sync(
        &self,
        shutdown: &CancellationToken,
        stop_now: &CancellationToken,
    ) -> Result<bool, ControllerError> {
        let started = Instant::now();
        let mut last_report = started;
        loop {
            if self.has_synced() {
                info!(controller = %self.name, elapsed = ?started.elapsed(), "caches synced");
                return Ok(true);
            }
            let unsynced = || -> Vec<String> {
                self.registrations
                    .iter()
                    .filter(|r| !r.has_synced())
                    .map(|r| r.informer_name())
                    .collect()
            };
            if started.elapsed() >= self.cache_sync_timeout {
                return Err(ControllerError::CacheSyncTimeout {
                    controller: self.name.clone(),
                    timeout: self.cache_sync_timeout,
                    informers: unsynced(),
                });
            }
            if last_report.elapsed() >= Duration::from_secs(5) {
                last_report = Instant::now();
                info!(controller = %self.name, waiting_for = ?unsynced(), elapsed = ?started.elapsed(), "waiting for caches to sync");
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(false),
                () = stop_now.cancelled() => return Ok(false),
                () = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    }

    /// Runs the workers with `context` (this run's). `stop_now` is forwarded to the context's
    /// leadership token, which stands for it from here on (it also fires when the term ends).
    async fn run_workers(
        &self,
        shutdown: &CancellationToken,
        stop_now: &CancellationToken,
        context: &Context<K>,
    ) -> Result<(), ControllerError> {
        let halt = context.leadership().token().clone();
        let mut run = std::pin::pin!(self.run_workers_until_halted(shutdown, stop_now, &halt, context));
        tokio::select! {
            result = &mut run => return result,
            () = stop_now.cancelled() => halt.cancel(),
        }
        run.await
    }

    /// `stop_now` here is the halt token; the workers also watch `external_stop_now` itself, so
    /// one finishing a reconcile as it fires takes no other key, forwarded or not.
    async fn run_workers_until_halted(
        &self,
        shutdown: &CancellationToken,
        external_stop_now: &CancellationToken,
        stop_now: &CancellationToken,
        context: &Context<K>,
    ) -> Result<(), ControllerError> {
        info!(controller = %self.name, workers = self.workers, "starting controller; waiting for caches");
        let synced = match self.wait_for_sync(shutdown, stop_now).await {
            Ok(synced) => synced,
            Err(e) => {
                self.stop_intake();
                self.report_dropped();
                return Err(e);
            }
        };
        let mut workers = JoinSet::new();
        // The reconciles running now (not the worker tasks: an idle worker waits for a key).
        let reconciling = Arc::new(AtomicUsize::new(0));
        // A reconcile's panic with recovery off: the controller stops at once and fails.
        let mut panicked = None;
        if synced {
            self.metrics.max_concurrent_reconciles.set(self.workers as i64);
            for _ in 0..self.workers {
                workers.spawn(self.worker(external_stop_now, context, &reconciling).run());
            }
            info!(controller = %self.name, workers = self.workers, "workers started");
            loop {
                tokio::select! {
                    // Stopping first: a worker that saw the term end returns right after.
                    biased;
                    () = shutdown.cancelled() => break,
                    () = stop_now.cancelled() => break,
                    Some(ended) = workers.join_next() => {
                        if let Err(e) = ended {
                            if e.is_panic() && !self.outcomes.recover_panic {
                                let message = panic_message(&*e.into_panic()).to_owned();
                                error!(controller = %self.name, panic = %message,
                                    "a reconcile panicked and panic recovery is off: stopping the controller at once");
                                panicked = Some(message);
                                break;
                            }
                            // Otherwise reconcile panics are caught, so this is a bug in the
                            // worker itself; keep the controller at full strength rather than idle.
                            error!(controller = %self.name, error = ?e, "a worker ended unexpectedly: restarting it");
                        }
                        self.metrics.active_workers.set(0);
                        workers.spawn(self.worker(external_stop_now, context, &reconciling).run());
                    }
                }
            }
        }
        // Shutdown or halt: the reconciles in flight (and those of a graceful drain) are told.
        context.token().cancel();
        self.stop_intake();
        let ending = if let Some(message) = panicked {
            Ending::Panicked(message)
        } else if stop_now.is_cancelled() {
            Ending::StoppedNow
        } else {
            info!(controller = %self.name, queued = self.queue.len(),
                "shutting down: no new keys; reconciling the keys already queued");
            let drained = tokio::time::timeout(self.graceful_shutdown_timeout, async {
                while workers.join_next().await.is_some() {}
            });
            tokio::select! {
                drained = drained => match drained {
                    Ok(()) => Ending::Drained,
                    Err(_) => Ending::TimedOut,
                },
                () = stop_now.cancelled() => Ending::StoppedNow,
            }
        };
        // Read before the abort: the reconciles it cuts short. Idle workers are aborted too, but
        // dropped nothing.
        let in_flight = reconciling.load(Ordering::SeqCst);
        if !workers.is_empty() {
            workers.abort_all();
            while workers.join_next().await.is_some() {}
            self.metrics.active_workers.set(0);
        }
        let result = match ending {
            Ending::Drained => Ok(()),
            Ending::TimedOut => {
                error!(controller = %self.name, in_flight, queued = self.queue.len(),
                    timeout = ?self.graceful_shutdown_timeout,
                    "queued keys not finished within the graceful shutdown timeout: reconciles in flight aborted");
                Err(ControllerError::ShutdownTimeout {
                    controller: self.name.clone(),
                    timeout: self.graceful_shutdown_timeout,
                    in_flight,
                })
            }
            Ending::StoppedNow => {
                warn!(controller = %self.name, in_flight, queued = self.queue.len(),
                    "stopped at once: reconciles in flight aborted, queued keys not reconciled");
                Ok(())
            }
            Ending::Panicked(message) => {
                // The panicked worker never decremented it.
                self.metrics.active_workers.set(0);
                Err(ControllerError::ReconcilePanicked {
                    controller: self.name.clone(),
                    message,
                })
            }
        };
        self.report_dropped();
        info!(controller = %self.name, "controller stopped");
        result
    }

    fn worker(
        &self,
        stop_now: &CancellationToken,
        context: &Context<K>,
        reconciling: &Arc<AtomicUsize>,
    ) -> Worker<K, R> {
        Worker {
            name: self.name.clone(),
            reconciling: Arc::clone(reconciling),
            stop_now: stop_now.clone(),
            refused_retries: Arc::clone(&self.refused_retries),
            queue: self.queue.clone(),
            reconciler: self.reconciler.clone(),
            shard: self.sharding.clone(),
            context: context.clone(),
            metrics: self.metrics.clone(),
            outcomes: self.outcomes.clone(),
        }
    }

    /// Removes the handlers and shuts the queue down: no key enters from here on, and the
    /// workers stop once they have taken every key still queued.
    fn stop_intake(&self) {
        self.registrations.iter().for_each(|r| r.remove());
        self.queue.shut_down();
    }

    /// Logs and counts every key the queue accepted that no worker finished, and every key whose
    /// retry the shut-down queue refused; each key once, though it may be both (waiting for a
    /// retry asked for before the shutdown, and refused another one during the drain).
    fn report_dropped(&self) {
        let mut dropped = self.queue.unfinished();
        dropped.append(&mut self.refused_retries.lock().unwrap_or_else(|p| p.into_inner()));
        if dropped.is_empty() {
            return;
        }
        dropped.sort_unstable();
        dropped.dedup();
        self.metrics.dropped_keys.inc_by(dropped.len() as u64);
        let mut keys = String::new();
        for key in dropped.iter().take(20) {
            let _ = write!(keys, "{key} ");
        }
        warn!(controller = %self.name, dropped = dropped.len(), keys = %keys.trim_end(),
            "keys accepted but not reconciled before shutdown");
    }
}

/// One reconcile in the controller's count of those running, for as long as it lives.
struct Running<'a>(&'a AtomicUsize);

impl<'a> Running<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How the workers ended after shutdown.
enum Ending {
    /// They reconciled every queued key within the graceful shutdown timeout.
    Drained,
    /// The graceful shutdown timeout passed first.
    TimedOut,
    /// `stop_now` fired.
    StoppedNow,
    /// A reconcile panicked with panic recovery off (its message).
    Panicked(String),
}

/// One worker: takes keys until the queue is shut down and empty, or until `stop_now` fires or
/// the leadership ends (its context's leadership token, which `stop_now` is forwarded to).
struct Worker<K, R> {
    name: String,
    /// The controller's count of reconciles running, shared by its workers.
    reconciling: Arc<AtomicUsize>,
    stop_now: CancellationToken,
    refused_retries: RefusedRetries,
    queue: WorkQueue,
    reconciler: Arc<R>,
    /// A sharded controller's drain handling.
    shard: Option<Arc<ShardGate>>,
    context: Context<K>,
    metrics: ControllerMetrics,
    outcomes: Outcomes<K>,
}

impl<K, R> Worker<K, R>
where
    K: Resource + Send + Sync + 'static,
    R: Reconciler<K>,
{
    async fn run(self) {
        loop {
            // `biased`: once `stop_now` fired, not even a key already queued is taken.
            let key = tokio::select! {
                biased;
                () = self.stop_now.cancelled() => return,
                () = self.context.leadership().token().cancelled() => return,
                key = self.queue.get() => key,
            };
            // Its retries keep the priority it came with (controller-runtime's reconcileHandler).
            let Some((key, priority)) = key else { return };
            // By the clock, not by `stop_now`: right after the process resumes from a stop, the
            // timer that ends the term may not have run yet.
            if let Err(not_leader) = self.context.ensure_leading() {
                info!(controller = %self.name, key = %key, reason = %not_leader,
                    "reconcile not started: this replica may no longer lead; the key is put back");
                self.put_back(&key, priority);
                self.queue.done(&key);
                // The term's timer fires at once if it has not (or shutdown comes): no busy loop.
                self.context.token().cancelled().await;
                return;
            }
            // A sharded controller hands a draining object over instead of reconciling it.
            if let Some(gate) = &self.shard {
                match gate.admit(&self.name, &key).await {
                    Admit::Reconcile => {}
                    Admit::Skip => {
                        self.queue.forget(&key);
                        self.queue.done(&key);
                        continue;
                    }
                    Admit::Retry => {
                        self.retry(&key, None, priority);
                        self.queue.done(&key);
                        continue;
                    }
                }
            }
            // Counted until dropped: an aborted or panicking reconcile leaves the count too.
            let _running = Running::enter(&self.reconciling);
            self.metrics.active_workers.inc();
            self.reconcile(&key, priority).await;
            self.queue.done(&key);
            self.metrics.active_workers.dec();
        }
    }

    async fn reconcile(&self, key: &ObjectKey, priority: i32) {
        let attempt = self.queue.num_requeues(key);
        let span = info_span!("reconcile", controller = %self.name, key = %key, attempt,
            result = tracing::field::Empty);
        let started = Instant::now();
        let outcome = self.call_reconciler(key).instrument(span.clone()).await;
        let elapsed = started.elapsed();
        self.metrics.time.observe(elapsed.as_secs_f64());
        let _entered = span.enter();
        let result = match outcome {
            Ok(Action::Done) => {
                self.queue.forget(key);
                self.metrics.success.inc();
                "success"
            }
            Ok(Action::Requeue) => {
                self.retry(key, None, priority);
                self.metrics.requeue.inc();
                "requeue"
            }
            Ok(Action::RequeueAfter(delay)) => {
                self.queue.forget(key);
                self.retry(key, Some(delay), priority);
                self.metrics.requeue_after.inc();
                "requeue_after"
            }
            Err(e) => self.on_error(key, priority, &e, elapsed),
        };
        span.record("result", result);
        debug!(?elapsed, result, "reconciled");
    }

    /// Runs the reconciler under the timeout, catching its panics; a timeout and a recovered
    /// panic come back as errors ([`ReconcileTimeout`], [`ReconcilePanic`]). With recovery off
    /// a panic is counted, then resumed: it ends this worker's task (see `run_workers`).
    async fn call_reconciler(&self, key: &ObjectKey) -> Result<Action, BoxError> {
        // With a timeout, the reconcile gets a token of its own to cancel.
        let context = match self.outcomes.reconcile_timeout {
            Some(_) => self.context.for_one_reconcile(),
            None => self.context.clone(),
        };
        // The call itself is inside the caught future: a closure reconciler may panic before it
        // returns its future, and that panic must be caught like one inside it.
        let call = AssertUnwindSafe(async { self.reconciler.reconcile(key.clone(), &context).await }).catch_unwind();
        let caught = match self.outcomes.reconcile_timeout {
            None => call.await,
            Some(timeout) => {
                let mut call = std::pin::pin!(call);
                tokio::select! {
                    caught = &mut call => caught,
                    () = tokio::time::sleep(timeout) => {
                        // Told first, so anything it spawned with the token stops too; the
                        // future is dropped when this block ends.
                        context.token().cancel();
                        self.metrics.timeouts.inc();
                        return Err(Box::new(ReconcileTimeout::new(timeout)));
                    }
                }
            }
        };
        match caught {
            Ok(Ok(action)) => Ok(action),
            Ok(Err(e)) => Err(e.into()),
            Err(panic) => {
                self.metrics.panics.inc();
                if !self.outcomes.recover_panic {
                    // Counted, then passed on as controller-runtime does; the controller ends.
                    self.metrics.error.inc();
                    self.metrics.errors.inc();
                    std::panic::resume_unwind(panic);
                }
                Err(Box::new(ReconcilePanic::new(panic_message(&*panic))))
            }
        }
    }

    /// The error path: log and count, then forget, retry after a delay, ask the error policy,
    /// or retry rate-limited (the [`outcome`](crate::outcome) module's table); returns the
    /// `result` label it counted.
    ///
    /// Every line names the controller and the key itself: the `reconcile` span is at INFO, so
    /// under the default `warn` filter its fields are not shown. A stale-cache race (409/404, see
    /// [`error_chain`](crate::error_chain)) is an INFO requeue; an error that is retried is a
    /// WARN; one that ends the retries (terminal) or a recovered panic is an ERROR.
    fn on_error(&self, key: &ObjectKey, priority: i32, e: &BoxError, elapsed: Duration) -> &'static str {
        let e: &(dyn std::error::Error + Send + Sync + 'static) = &**e;
        let terminal = find_in_chain::<TerminalError>(e).is_some();
        let requeue_after = find_in_chain::<RequeueAfterError>(e).is_some();
        let not_leader = is_not_leader(e) || !self.context.is_leading();
        if !terminal
            && !requeue_after
            && !not_leader
            && let Some(status) = stale_cache_race(e)
        {
            self.metrics.requeue.inc();
            info!(controller = %self.name, key = %key, code = status.code, reason = %status.reason,
                error = %status.message, ?elapsed, "reconcile raced a stale cache: requeued");
            self.retry(key, None, priority);
            return "requeue";
        }
        self.metrics.error.inc();
        self.metrics.errors.inc();
        let error = ErrorChain(e);
        if not_leader {
            // The expected race of a deposed leader, not a failure of the reconciler.
            info!(controller = %self.name, key = %key, %error, ?elapsed,
                "reconcile stopped: this replica may no longer lead");
        } else if terminal || find_in_chain::<ReconcilePanic>(e).is_some() {
            error!(controller = %self.name, key = %key, %error, ?elapsed, "reconcile failed");
        } else {
            warn!(controller = %self.name, key = %key, %error, ?elapsed, "reconcile failed: retrying");
        }
        if terminal {
            self.metrics.terminal_errors.inc();
            self.queue.forget(key);
            debug!("terminal error: the key is not retried");
            return "error";
        }
        if let Some(requeue) = find_in_chain::<RequeueAfterError>(e) {
            self.retry(key, Some(requeue.after()), priority);
            return "error";
        }
        let Some(policy) = &self.outcomes.error_policy else {
            self.retry(key, None, priority);
            return "error";
        };
        let request = key.clone();
        let action = match std::panic::catch_unwind(AssertUnwindSafe(|| policy(e, &request, &self.context))) {
            Ok(action) => action,
            Err(panic) => {
                error!(controller = %self.name, key = %key, panic = %panic_message(&*panic),
                    "the error policy panicked: retrying rate-limited");
                Action::Requeue
            }
        };
        debug!(?action, "error policy");
        match action {
            Action::Done => self.queue.forget(key),
            Action::Requeue => self.retry(key, None, priority),
            Action::RequeueAfter(delay) => self.retry(key, Some(delay), priority),
        }
        "error"
    }
}

impl<K, R> Worker<K, R> {
    /// Puts a key taken but not reconciled back into the queue (it is still processing, so it
    /// is queued again when done), or keeps it to be reported as dropped once the queue shuts
    /// down.
    fn put_back(&self, key: &ObjectKey, priority: i32) {
        if self.queue.shutting_down() {
            self.refused_retries
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(key.clone());
        } else {
            self.queue.add_with_priority(key.clone(), priority);
        }
    }

    /// Schedules a retry (rate-limited, or after `delay`); once the queue is shutting down it
    /// would be ignored, so the key is kept to be reported as dropped instead.
    fn retry(&self, key: &ObjectKey, delay: Option<Duration>, priority: i32) {
        if self.queue.shutting_down() {
            debug!(controller = %self.name, key = %key, "retry asked for during shutdown: key dropped");
            self.refused_retries
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(key.clone());
            return;
        }
        match delay {
            Some(delay) => self.queue.add_after_with_priority(key.clone(), delay, priority),
            None => self.queue.add_rate_limited_with_priority(key.clone(), priority),
        }
    }
}

/// Whether `e` or one of its sources is a [`NotLeader`].
fn is_not_leader(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<NotLeader>() {
            return true;
        }
        next = e.source();
    }
    false
}

pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a non-string panic payload)")
}

/// A controller that is dropped (never run, or its `run` future aborted) takes its handlers off
/// the shared informers, so they stop feeding a queue nobody reads.
impl<K, R> Drop for BuiltController<K, R> {
    fn drop(&mut self) {
        self.registrations.iter().for_each(|r| r.remove());
        self.queue.shut_down();
    }
}

impl<K, R> Runnable for BuiltController<K, R>
where
    K: Resource + Send + Sync + 'static,
    R: Reconciler<K>,
{
    fn name(&self) -> &str {
        &self.name
    }

    /// A sharded controller runs on every replica, under its shard Lease.
    fn needs_leader_election(&self) -> bool {
        self.sharding.is_none()
    }

    /// A sharded controller's `shard-<ring>`: its shard's
    /// [`ShardReadiness::check`](crate::sharding::ShardReadiness::check), failing until the shard
    /// joined the ring (its Lease acquired, labelled and not fenced) and once its Lease's term
    /// lapsed or it left.
    fn readyz_checks(&self) -> Vec<Checker> {
        self.sharding
            .iter()
            .map(|gate| {
                let readiness = gate.config.readiness.clone();
                Checker::new(format!("shard-{}", gate.config.ring), move || readiness.check())
            })
            .collect()
    }

    fn start(self: Box<Self>, shutdown: CancellationToken) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move { (*self).run(shutdown).await.map_err(BoxError::from) })
    }

    fn start_with_stop_now(
        self: Box<Self>,
        shutdown: CancellationToken,
        stop_now: CancellationToken,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            (*self)
                .run_with_stop_now(shutdown, stop_now)
                .await
                .map_err(BoxError::from)
        })
    }

    fn start_leading(
        self: Box<Self>,
        shutdown: CancellationToken,
        stop_now: CancellationToken,
        leadership: Leadership,
    ) -> BoxFuture<'static, Result<(), BoxError>> {
        Box::pin(async move {
            (*self)
                .run_leading(shutdown, stop_now, leadership)
                .await
                .map_err(BoxError::from)
        })
    }
}

#[cfg(test)]
mod tests;
