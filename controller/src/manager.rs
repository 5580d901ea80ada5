//! The [`Manager`]: runs controllers (and any other [`Runnable`]) over one shared informer
//! factory, with leader election, `/metrics`, `/healthz` and `/readyz`, and a bounded
//! graceful shutdown (controller-runtime's `pkg/manager`).
//!
//! ```no_run
//! use controller::{Action, Context, Manager, Request, reconciler_fn};
//! use k8s_openapi::api::apps::v1::Deployment;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let mut manager = Manager::builder(client)
//!     .leader_election(controller::LeaderElectionConfig::new("kube-system", "my-controller", "pod-a"))
//!     .build()?;
//! let reconciler = reconciler_fn(|_req: Request, _ctx: Context<Deployment>| async {
//!     Ok::<_, kube::Error>(Action::Done)
//! });
//! manager.add(manager.controller("deployments").for_resource::<Deployment>().build(reconciler)?);
//! manager.run(CancellationToken::new()).await?; // also stops on SIGINT/SIGTERM
//! # Ok(()) }
//! ```
//!
//! # What `run` does
//! 1. Serves `/metrics` (Prometheus text: the controllers', work queues' and manager's
//!    series), `/healthz` (200 while running) and `/readyz` (503 until every cache synced;
//!    then 200, saying `leading` or `standby` under leader election; a standby whose last
//!    successful read of the Lease is older than
//!    [`LeaderElector::observation_bound`] cannot reach the API server and answers 503).
//! 2. Starts the factory's informers and the runnables that need no leadership.
//! 3. Waits for the caches (failing after `cache_sync_timeout` with the informers that did
//!    not sync), then starts the controllers: at once without leader election, or once the
//!    Lease is acquired. A standby keeps its informers running, so its caches are warm and
//!    its queues hold every key when it takes over.
//! 4. Runs until the token is cancelled, SIGINT or SIGTERM arrives, a runnable fails, or the
//!    lease is lost (client-go's `renewDeadline` passed without a renewal: the controllers
//!    are stopped at once, without the graceful shutdown: they take no more keys, not even
//!    queued ones, and the reconciles in flight are aborted; `run` returns
//!    [`ManagerError::LeadershipLost`], as controller-runtime exits, so no two leaders ever
//!    act at once). The controllers do not wait for that: they get the lease's term
//!    ([`Runnable::start_leading`]) and check it by the clock before every reconcile and event
//!    write, and their reconcilers' token fires at its validity deadline (see
//!    [`Leadership`]).
//! 5. Stops the runnables (each within the graceful shutdown timeout: a controller reconciles
//!    the keys already queued first), then releases the Lease, then stops the informers and
//!    the HTTP server. Returns `Err` if any component failed, so a binary exits non-zero.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use factory::{FactoryError, SharedInformerFactory};
pub use http_serving::ServingConfig;
use kube::Client;
use prometheus::{IntGaugeVec, Opts};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::builder::{Controller, ControllerBuilder};
use crate::leader_election::{LeaderElectionConfig, LeaderElectionError, LeaderElector};
use crate::leadership::Leadership;
use crate::metrics::{InformerCollector, Metrics};
use crate::reconciler::BoxError;
use crate::runnable::Runnable;

/// Errors of building or running a [`Manager`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The metrics/health address could not be bound.
    #[error("binding the metrics and health endpoint on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Registering the manager's metrics failed.
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The leader election configuration is invalid.
    #[error(transparent)]
    LeaderElection(#[from] LeaderElectionError),
    /// The caches did not sync in time.
    #[error("caches not synced within {timeout:?}: {informers:?}")]
    CacheSyncTimeout {
        /// How long the manager waited.
        timeout: Duration,
        /// The informers that had not synced (`apiVersion/Kind`).
        informers: Vec<String>,
    },
    /// The lease was lost; the controllers were stopped.
    #[error("leader election lost: {0}")]
    LeadershipLost(LeaderElectionError),
    /// A runnable failed.
    #[error("{name} failed: {source}")]
    Runnable {
        /// The runnable's name.
        name: String,
        /// Its error.
        source: BoxError,
    },
    /// Runnables were still running after the graceful shutdown timeout.
    #[error("runnables still running after the graceful shutdown timeout of {timeout:?}: {names:?}")]
    ShutdownTimeout {
        /// The timeout.
        timeout: Duration,
        /// The runnables that had not stopped.
        names: Vec<String>,
    },
}

/// Builds a [`Manager`].
#[must_use]
pub struct ManagerBuilder {
    client: Client,
    factory: Option<SharedInformerFactory>,
    registry: Option<prometheus::Registry>,
    metrics_addr: Option<SocketAddr>,
    http_serving: ServingConfig,
    leader_election: Option<LeaderElectionConfig>,
    graceful_shutdown_timeout: Duration,
    cache_sync_timeout: Duration,
    handle_signals: bool,
}

impl ManagerBuilder {
    /// The informer factory controllers get their informers from (default: one with no
    /// resync, stripping managedFields).
    pub fn factory(mut self, factory: SharedInformerFactory) -> Self {
        self.factory = Some(factory);
        self
    }

    /// The Prometheus registry `/metrics` serves (default: a new one).
    pub fn registry(mut self, registry: prometheus::Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served (default `127.0.0.1:8080`; port 0
    /// picks a free one, see [`Manager::metrics_addr`]).
    pub fn metrics_addr(mut self, addr: SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// Serves no HTTP endpoint.
    pub fn no_metrics_server(mut self) -> Self {
        self.metrics_addr = None;
        self
    }

    /// The HTTP endpoint's header-read, idle and TLS-handshake timeouts and connection cap
    /// (default [`ServingConfig::default`]: controller-runtime's 32 s header read, 90 s idle,
    /// 1 MiB of headers; at most 900 connections).
    pub fn http_serving(mut self, config: ServingConfig) -> Self {
        self.http_serving = config;
        self
    }

    /// Runs the controllers only while holding this Lease.
    pub fn leader_election(mut self, config: LeaderElectionConfig) -> Self {
        self.leader_election = Some(config);
        self
    }

    /// How long runnables get to stop after shutdown begins (default 30 s).
    pub fn graceful_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.graceful_shutdown_timeout = timeout;
        self
    }

    /// How long to wait for the caches before failing (default 2 min).
    pub fn cache_sync_timeout(mut self, timeout: Duration) -> Self {
        self.cache_sync_timeout = timeout;
        self
    }

    /// Whether SIGINT and SIGTERM start a graceful shutdown (default true).
    pub fn handle_signals(mut self, on: bool) -> Self {
        self.handle_signals = on;
        self
    }

    /// The manager; binds the HTTP endpoint now, so its address is known before `run`.
    pub fn build(self) -> Result<Manager, ManagerError> {
        let factory = self.factory.unwrap_or_else(|| {
            SharedInformerFactory::builder(self.client.clone())
                .strip_managed_fields(true)
                .build()
        });
        let registry = self.registry.unwrap_or_default();
        let metrics = Metrics::new(&registry)?;
        let leader_status = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ),
            &["name"],
        )?;
        registry.register(Box::new(leader_status.clone()))?;
        let stats_factory = factory.clone();
        registry.register(Box::new(InformerCollector::new(Arc::new(move || {
            stats_factory.informer_stats()
        }))?))?;
        let elector = self
            .leader_election
            .map(|config| LeaderElector::new(self.client.clone(), config))
            .transpose()?;
        let listener = match self.metrics_addr {
            Some(addr) => {
                let bind = || -> std::io::Result<std::net::TcpListener> {
                    let listener = std::net::TcpListener::bind(addr)?;
                    listener.set_nonblocking(true)?;
                    Ok(listener)
                };
                Some(bind().map_err(|source| ManagerError::Bind { addr, source })?)
            }
            None => None,
        };
        let metrics_addr = listener.as_ref().and_then(|l| l.local_addr().ok());
        Ok(Manager {
            client: self.client,
            factory,
            metrics,
            status: ManagerStatus {
                inner: Arc::new(StatusInner {
                    synced: AtomicBool::new(false),
                    stopping: AtomicBool::new(false),
                    elector: elector.clone(),
                }),
            },
            elector,
            leader_status,
            listener,
            metrics_addr,
            http_serving: self.http_serving,
            runnables: Vec::new(),
            graceful_shutdown_timeout: self.graceful_shutdown_timeout,
            cache_sync_timeout: self.cache_sync_timeout,
            handle_signals: self.handle_signals,
        })
    }
}

/// What `/readyz` reports, readable from outside while the manager runs. Cheap to clone.
#[derive(Clone)]
pub struct ManagerStatus {
    inner: Arc<StatusInner>,
}

struct StatusInner {
    synced: AtomicBool,
    /// Set when shutdown begins: `/readyz` turns 503 so no traffic is sent to a leaving pod.
    stopping: AtomicBool,
    elector: Option<LeaderElector>,
}

impl ManagerStatus {
    /// Whether every cache has synced.
    pub fn is_ready(&self) -> bool {
        self.inner.synced.load(Ordering::Acquire)
    }

    /// Whether this process leads (always true without leader election).
    pub fn is_leader(&self) -> bool {
        self.inner.elector.as_ref().is_none_or(LeaderElector::is_leader)
    }

    /// The holder of the lease as last observed (`None` without leader election).
    pub fn leader(&self) -> Option<String> {
        self.inner.elector.as_ref().and_then(LeaderElector::leader)
    }
}

/// Runs controllers and other runnables over one informer factory. See the [module
/// docs](self).
pub struct Manager {
    client: Client,
    factory: SharedInformerFactory,
    metrics: Metrics,
    status: ManagerStatus,
    elector: Option<LeaderElector>,
    leader_status: IntGaugeVec,
    listener: Option<std::net::TcpListener>,
    metrics_addr: Option<SocketAddr>,
    http_serving: ServingConfig,
    runnables: Vec<Box<dyn Runnable>>,
    graceful_shutdown_timeout: Duration,
    cache_sync_timeout: Duration,
    handle_signals: bool,
}

impl Manager {
    /// A builder with controller-runtime's defaults.
    pub fn builder(client: Client) -> ManagerBuilder {
        ManagerBuilder {
            client,
            factory: None,
            registry: None,
            metrics_addr: Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
            http_serving: ServingConfig::default(),
            leader_election: None,
            graceful_shutdown_timeout: Duration::from_secs(30),
            cache_sync_timeout: Duration::from_secs(120),
            handle_signals: true,
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The shared informer factory.
    pub fn factory(&self) -> &SharedInformerFactory {
        &self.factory
    }

    /// The metrics registered in the manager's registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served, if anywhere.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// A handle on readiness and leadership.
    pub fn status(&self) -> ManagerStatus {
        self.status.clone()
    }

    /// A controller builder on the manager's factory and metrics registry. Its graceful
    /// shutdown timeout is set a little below the manager's (90%), so the controller reports
    /// what it dropped before the manager would abort it.
    pub fn controller(&self, name: impl Into<String>) -> ControllerBuilder {
        Controller::new(name, &self.factory)
            .metrics(self.metrics.clone())
            .graceful_shutdown_timeout(self.graceful_shutdown_timeout.mul_f64(0.9))
    }

    /// Adds a controller or another runnable.
    pub fn add(&mut self, runnable: impl Runnable) {
        self.runnables.push(Box::new(runnable));
    }

    /// Runs everything until `shutdown` fires (or a signal, a failure, a lost lease), then shuts
    /// down gracefully. See the [module docs](self).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ManagerError> {
        let Manager {
            client: _,
            factory,
            metrics,
            status,
            elector,
            leader_status,
            listener,
            metrics_addr,
            http_serving,
            runnables,
            graceful_shutdown_timeout,
            cache_sync_timeout,
            handle_signals,
        } = self;
        let stop = shutdown.child_token();
        let mut failures: Vec<ManagerError> = Vec::new();
        // Stopped last: informers and the HTTP server keep serving while runnables finish.
        let infrastructure = CancellationToken::new();
        let _signals = handle_signals.then(|| spawn_signal_handler(stop.clone()));
        let server = match listener {
            Some(listener) => match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => Some(tokio::spawn(serve(
                    listener,
                    metrics.clone(),
                    status.clone(),
                    http_serving,
                    infrastructure.clone(),
                ))),
                Err(source) => {
                    let addr = metrics_addr.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
                    return Err(ManagerError::Bind { addr, source });
                }
            },
            None => None,
        };
        if let Some(addr) = metrics_addr {
            info!(%addr, "serving /metrics, /healthz and /readyz");
        }

        let (leader_runnables, other_runnables): (Vec<_>, Vec<_>) =
            runnables.into_iter().partition(|r| r.needs_leader_election());
        factory.start(&infrastructure);
        let mut tasks = RunningTasks::default();
        let runnables_stop = stop.child_token();
        // Fired when the lease is lost: the runnables stop without finishing their work.
        let stop_now = CancellationToken::new();
        tasks.stop_now = stop_now.clone();
        for runnable in other_runnables {
            tasks.spawn(runnable, runnables_stop.clone());
        }

        info!("waiting for caches to sync");
        match factory.wait_for_cache_sync_timeout(&stop, cache_sync_timeout).await {
            Ok(()) => {
                status.inner.synced.store(true, Ordering::Release);
                info!("caches synced");
            }
            Err(FactoryError::CacheSyncTimeout { timeout, informers }) => {
                error!(?timeout, ?informers, "caches did not sync");
                failures.push(ManagerError::CacheSyncTimeout { timeout, informers });
                stop.cancel();
            }
            Err(e) => info!(reason = %e, "stopped before the caches synced"),
        }

        // Leadership: the election task sends the leader runnables' token once leading, and
        // reports a lost lease; it releases the lease only when `election_stop` fires, after
        // the runnables stopped.
        let election_stop = CancellationToken::new();
        let (lost_tx, mut lost_rx) = tokio::sync::mpsc::channel::<LeaderElectionError>(1);
        let (leading_tx, mut leading_rx) = tokio::sync::mpsc::channel::<Leadership>(1);
        let election = match (&elector, stop.is_cancelled()) {
            (_, true) => None,
            (None, false) => {
                let _ = leading_tx.try_send(Leadership::unconditional());
                None
            }
            (Some(elector), false) => {
                let (elector, election_stop, gauge) = (
                    elector.clone(),
                    election_stop.clone(),
                    leader_status.with_label_values(&[elector.lease_name()]),
                );
                gauge.set(0);
                Some(tokio::spawn(async move {
                    info!(identity = %elector.identity(), "waiting to acquire the lease");
                    if !elector.acquire(&election_stop).await {
                        return;
                    }
                    gauge.set(1);
                    info!(identity = %elector.identity(), "acquired the lease: leading");
                    let _ = leading_tx.try_send(elector.leadership());
                    let result = elector.renew(&election_stop).await;
                    gauge.set(0);
                    if let Err(e) = result {
                        let _ = lost_tx.try_send(e);
                    }
                }))
            }
        };

        let leading = runnables_stop.child_token();
        let mut leadership_lost = false;
        let mut leader_runnables = Some(leader_runnables);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                Some(leadership) = leading_rx.recv(), if leader_runnables.is_some() => {
                    for runnable in leader_runnables.take().unwrap_or_default() {
                        tasks.spawn_leading(runnable, leading.clone(), leadership.clone());
                    }
                }
                lost = lost_rx.recv(), if election.is_some() => {
                    // `None`: the election task ended without a word (it panicked), so nobody
                    // renews the lease: as good as lost.
                    let lost = match lost {
                        Some(lost) => ManagerError::LeadershipLost(lost),
                        None => ManagerError::Runnable {
                            name: "leader election".into(),
                            source: "the leader election task ended unexpectedly".into(),
                        },
                    };
                    error!(error = %lost, "leader election lost: stopping the controllers now");
                    // `stop_now` first: a controller that sees `leading` must already know not
                    // to reconcile its queued keys.
                    stop_now.cancel();
                    leading.cancel();
                    failures.push(lost);
                    leadership_lost = true;
                    break;
                }
                Some((name, result)) = tasks.join_next() => {
                    match result {
                        Ok(()) => info!(runnable = %name, "runnable finished"),
                        Err(source) => {
                            error!(runnable = %name, error = %source, "runnable failed: shutting down");
                            failures.push(ManagerError::Runnable { name, source });
                            break;
                        }
                    }
                }
            }
        }

        info!("shutting down");
        status.inner.stopping.store(true, Ordering::Release);
        stop.cancel();
        // Another process may lead already: no grace period for reconciles in flight (as
        // controller-runtime, which drops its graceful shutdown timeout to zero here).
        let timeout = if leadership_lost {
            Duration::ZERO
        } else {
            graceful_shutdown_timeout
        };
        let all_done = tokio::time::timeout(timeout, async {
            while let Some((name, result)) = tasks.join_next().await {
                if let Err(source) = result {
                    failures.push(ManagerError::Runnable { name, source });
                }
            }
        })
        .await;
        if all_done.is_err() {
            let left = tasks.abort_all().await;
            if !leadership_lost {
                warn!(
                    ?timeout,
                    ?left,
                    "runnables still running after the graceful shutdown timeout: aborted"
                );
                failures.push(ManagerError::ShutdownTimeout { timeout, names: left });
            }
        }
        // The runnables have stopped: now the lease may go (released if configured).
        election_stop.cancel();
        if let Some(election) = election {
            let _ = tokio::time::timeout(Duration::from_secs(5), election).await;
        }
        infrastructure.cancel();
        factory.shutdown().await;
        if let Some(server) = server {
            let _ = server.await;
        }
        info!(failures = failures.len(), "manager stopped");
        match failures.into_iter().next() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }
}

/// The runnables' tasks, with their names (also for tasks that panicked or were aborted).
#[derive(Default)]
struct RunningTasks {
    tasks: JoinSet<Result<(), BoxError>>,
    names: HashMap<tokio::task::Id, String>,
    /// Every runnable's `stop_now`.
    stop_now: CancellationToken,
}

impl RunningTasks {
    fn spawn(&mut self, runnable: Box<dyn Runnable>, shutdown: CancellationToken) {
        let name = runnable.name().to_owned();
        info!(runnable = %name, "starting runnable");
        let handle = self
            .tasks
            .spawn(runnable.start_with_stop_now(shutdown, self.stop_now.clone()));
        self.names.insert(handle.id(), name);
    }

    /// Spawns a runnable that needs leader election, under `leadership`.
    fn spawn_leading(&mut self, runnable: Box<dyn Runnable>, shutdown: CancellationToken, leadership: Leadership) {
        let name = runnable.name().to_owned();
        info!(runnable = %name, "starting runnable");
        let handle = self
            .tasks
            .spawn(runnable.start_leading(shutdown, self.stop_now.clone(), leadership));
        self.names.insert(handle.id(), name);
    }

    /// The next runnable to end, with its result (a panic becomes an error).
    async fn join_next(&mut self) -> Option<(String, Result<(), BoxError>)> {
        let (id, result) = match self.tasks.join_next_with_id().await? {
            Ok((id, result)) => (id, result),
            Err(e) => (e.id(), Err(format!("panicked: {e}").into())),
        };
        let name = self.names.remove(&id).unwrap_or_else(|| "a runnable".to_owned());
        Some((name, result))
    }

    /// Aborts what is still running, waits until it ended, and returns its names.
    async fn abort_all(&mut self) -> Vec<String> {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        let mut left: Vec<String> = self.names.drain().map(|(_, name)| name).collect();
        left.sort();
        left
    }
}

/// Cancels `stop` on SIGINT or SIGTERM; a second signal exits the process at once with status
/// 1 (as controller-runtime). The returned guard ends the task.
fn spawn_signal_handler(stop: CancellationToken) -> tokio_util::sync::DropGuard {
    let guard = CancellationToken::new();
    let done = guard.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => Some(signal),
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                None
            }
        };
        for signals in 0.. {
            let terminated = async {
                #[cfg(unix)]
                if let Some(signal) = terminate.as_mut() {
                    signal.recv().await;
                    return;
                }
                std::future::pending::<()>().await;
            };
            tokio::select! {
                () = done.cancelled() => return,
                _ = tokio::signal::ctrl_c() => {}
                () = terminated => {}
            }
            if signals > 0 {
                error!("second signal: exiting without waiting for the graceful shutdown");
                std::process::exit(1);
            }
            info!("signal received: shutting down (a second one exits at once)");
            stop.cancel();
        }
    });
    guard.drop_guard()
}

#[derive(Clone)]
struct HttpState {
    metrics: Metrics,
    status: ManagerStatus,
}

/// Serves `/metrics`, `/healthz` and `/readyz` until `stop`, with controller-runtime's
/// header-read and idle timeouts and a connection cap (the `http-serving` crate), so no client
/// holds a connection forever.
async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    status: ManagerStatus,
    serving: ServingConfig,
    stop: CancellationToken,
) {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz_handler))
        .with_state(HttpState { metrics, status });
    http_serving::serve(listener, app, None, serving, stop).await;
}

async fn metrics_handler(State(state): State<HttpState>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.encode(),
    )
}

async fn readyz_handler(State(state): State<HttpState>) -> (StatusCode, String) {
    if state.status.inner.stopping.load(Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into());
    }
    if !state.status.is_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n".into());
    }
    match &state.status.inner.elector {
        None => (StatusCode::OK, "ok\n".into()),
        Some(elector) if elector.is_leader() => (StatusCode::OK, "ok: leading\n".into()),
        // A standby is ready only while it can reach the API server: one that cannot would
        // not take over when the leader goes, nor know whether it went.
        Some(elector) if elector.is_observing() => (StatusCode::OK, "ok: standby\n".into()),
        Some(elector) => {
            let since = match elector.last_observed() {
                Some(at) => format!("for {:?}", at.elapsed()),
                None => "yet".to_owned(),
            };
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "standby: cannot reach the API server (no successful read of the lease {since}; bound {:?})\n",
                    elector.observation_bound()
                ),
            )
        }
    }
}
