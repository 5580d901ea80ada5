//! The [`Manager`]: runs controllers (and any other [`Runnable`]) over one shared informer
//! factory, with leader election, `/metrics`, `/healthz` and `/readyz`, and a bounded
//! graceful shutdown (controller-runtime's `pkg/manager`).
//!
//! ```no_run
//! use controller::{Action, Context, LeaderElectionConfig, Manager, Request, reconciler_fn};
//! use k8s_openapi::api::apps::v1::Deployment;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let mut manager = Manager::builder(client)
//!     .leader_election(LeaderElectionConfig::with_default_identity("kube-system", "my-controller"))
//!     .handle_signals(true) // a binary's main: SIGINT/SIGTERM start the graceful shutdown
//!     .build()?;
//! manager.add_healthz_check("disk", || Ok(()));
//! let reconciler = reconciler_fn(|_req: Request, _ctx: Context<Deployment>| async {
//!     Ok::<_, kube::Error>(Action::Done)
//! });
//! manager.add(manager.controller("deployments").for_resource::<Deployment>().build(reconciler)?);
//! manager.run(CancellationToken::new()).await?;
//! # Ok(()) }
//! ```
//!
//! # Endpoints
//!
//! Two servers, as controller-runtime's `Metrics.BindAddress` and `HealthProbeBindAddress`,
//! both on every interface by default so Prometheus and the kubelet reach a pod:
//! `/metrics` on `0.0.0.0:8080` (Prometheus text: the controllers', work queues', informers'
//! and manager's series), and the probes on `0.0.0.0:8081`. Either can be moved (port 0 picks
//! a free one; `127.0.0.1` keeps it local) or turned off. Both use the `http-serving` crate's
//! timeouts and connection cap. A third, the HTTPS webhook server (`0.0.0.0:9443`), runs only
//! when configured ([`ManagerBuilder::webhook_server`]; see [`webhook`](crate::webhook)).
//!
//! The probes answer as controller-runtime's `pkg/healthz` (see [`healthz`]):
//! `/healthz` and `/readyz` run every check (`?verbose` lists them, `?exclude=name` skips
//! one; 500 when one fails), `/healthz/<name>` and `/readyz/<name>` run one. Checks of your
//! own: [`Manager::add_healthz_check`], [`Manager::add_readyz_check`]; a runnable's own
//! ([`Runnable::readyz_checks`]) join `/readyz` when it is added. Built in:
//!
//! | endpoint | check | fails when |
//! |---|---|---|
//! | `/healthz` | `leaderElection` (with leader election) | the Lease still names this replica but was not renewed for `renew_deadline` + [`leader_election_health_tolerance`](ManagerBuilder::leader_election_health_tolerance) (client-go's `HealthzAdaptor`): a wedged leader, which the kubelet should restart |
//! | `/healthz` | `ping` (only when no other) | never |
//! | `/readyz` | `informer-sync` | a cache has not synced yet |
//! | `/readyz` | `shutdown` | shutdown has begun |
//! | `/readyz` | `leaderElection` (with leader election) | a standby's last successful read of the Lease is older than [`LeaderElector::observation_bound`]: it cannot reach the API server |
//! | `/readyz` | `shard-<ring>` (each [sharded](crate::ControllerBuilder::sharded) controller added) | its shard does not hold its shard Lease ([`ShardReadiness`](crate::sharding::ShardReadiness)): not joined yet (the Lease held by another, or fenced by the sharder), its term lapsed, or it left the ring |
//!
//! # What `run` does (controller-runtime's order of runnable groups)
//! 1. Starts the HTTP servers (and the webhook server, if configured with
//!    [`webhook_server`](ManagerBuilder::webhook_server): on every replica, before the caches,
//!    as a conversion webhook may be needed to list them), then the factory's informers (the caches), and waits for the
//!    caches (failing after `cache_sync_timeout` with the informers that did not sync).
//! 2. Then starts the runnables that need no leader election (controller-runtime's
//!    `Others`), so they see synced caches, and then leader election.
//! 3. Starts the controllers (and other runnables that need leader election): at once
//!    without leader election, or once the Lease is acquired. A standby keeps its informers
//!    running, so its caches are warm and its queues hold every key when it takes over. The
//!    informers of the [leader factory](Manager::leader_factory) are the exception: they
//!    start only when this replica starts leading, right before these runnables (which wait
//!    for their caches), so a standby holds none of their objects.
//!    Runnables added while `run` runs ([`ManagerHandle::add`]) start at once under the same
//!    rules (a leader-election runnable waits for the lease).
//! 4. Runs until the token is cancelled, a signal arrives (only with
//!    [`handle_signals`](ManagerBuilder::handle_signals)), a runnable fails, or the lease is
//!    lost (client-go's `renewDeadline` passed without a renewal: the controllers are stopped
//!    at once, without the graceful shutdown: they take no more keys, not even queued ones,
//!    and the reconciles in flight are aborted; `run` returns
//!    [`ManagerError::LeadershipLost`], as controller-runtime exits, so no two leaders ever
//!    act at once). The controllers do not wait for that: they get the lease's term
//!    ([`Runnable::start_leading`]) and check it by the clock before every reconcile and event
//!    write, and their reconcilers' token fires at its validity deadline (see
//!    [`Leadership`]).
//! 5. Stops the runnables (each within the graceful shutdown timeout: a controller reconciles
//!    the keys already queued first; a zero timeout, or a second signal, aborts them without
//!    waiting), then releases the Lease, then stops the informers and the HTTP servers, and
//!    joins every task it spawned (dropping the `run` future instead aborts them all: a
//!    dropped leader stops renewing its lease). Returns `Err` if anything failed (several failures:
//!    [`ManagerError::Multiple`]), so a binary exits non-zero. It never exits the process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::routing::get;
use factory::{FactoryError, SharedInformerFactory};
pub use http_serving::ServingConfig;
use kube::Client;
use prometheus::{IntGaugeVec, Opts};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, error, info, warn};

use crate::builder::{Controller, ControllerBuilder};
use crate::healthz::{self, Checker};
use crate::leader_election::{LeaderElectionConfig, LeaderElectionError, LeaderElector};
use crate::leadership::Leadership;
use crate::metrics::{InformerCollector, Metrics};
use crate::reconciler::BoxError;
use crate::runnable::Runnable;
use crate::webhook::{WebhookError, WebhookServer, WebhookServerConfig};

/// Errors of building or running a [`Manager`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The metrics or health probe address could not be bound. The message names the
    /// builder setting that chose the address (`ManagerBuilder::metrics_addr` or
    /// `health_probe_addr`), so a port already in use says what to change.
    #[error(
        "binding the {what} endpoint on {addr} (set by ManagerBuilder::{}): {source}",
        bind_setting(what)
    )]
    Bind {
        /// Which endpoint: `metrics` or `health probe`.
        what: &'static str,
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
    /// A runnable, or a task of the manager's own (named so), failed or panicked.
    #[error("{name} failed: {source}")]
    Runnable {
        /// The runnable's or task's name.
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
    /// A runnable was added after the manager began to shut down (controller-runtime's
    /// "can't accept new runnable as stop procedure is already engaged"); it was not started.
    #[error("cannot add {name}: the manager is shutting down")]
    Stopped {
        /// The runnable's name.
        name: String,
    },
    /// The webhook server could not be built or started (its address, its certificate).
    #[error(transparent)]
    Webhook(#[from] WebhookError),
    /// Several failures, in the order they happened: e.g. a runnable failed and the graceful
    /// shutdown that followed timed out (controller-runtime joins them the same way).
    #[error("{} failures: {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Multiple(Vec<ManagerError>),
}

impl ManagerError {
    /// The failures this error stands for: itself, or those of [`Multiple`](Self::Multiple).
    pub fn failures(&self) -> Vec<&ManagerError> {
        match self {
            ManagerError::Multiple(errors) => errors.iter().collect(),
            other => vec![other],
        }
    }

    fn join(mut failures: Vec<ManagerError>) -> Result<(), ManagerError> {
        match failures.len() {
            0 => Ok(()),
            1 => Err(failures.remove(0)),
            _ => Err(ManagerError::Multiple(failures)),
        }
    }
}

/// Builds a [`Manager`].
#[must_use]
pub struct ManagerBuilder {
    client: Client,
    factory: Option<SharedInformerFactory>,
    leader_factory: Option<SharedInformerFactory>,
    registry: Option<prometheus::Registry>,
    metrics_addr: Option<SocketAddr>,
    health_probe_addr: Option<SocketAddr>,
    http_serving: ServingConfig,
    leader_election: Option<LeaderElectionConfig>,
    leader_election_health_tolerance: Duration,
    graceful_shutdown_timeout: Duration,
    cache_sync_timeout: Duration,
    handle_signals: bool,
    reconcile_timeout: Option<Duration>,
    webhook_server: Option<WebhookServerConfig>,
}

impl ManagerBuilder {
    /// The informer factory controllers get their informers from (default: one with no
    /// resync, stripping managedFields).
    pub fn factory(mut self, factory: SharedInformerFactory) -> Self {
        self.factory = Some(factory);
        self
    }

    /// The factory of the informers only the leader needs, [`Manager::leader_factory`]
    /// (default: one with no resync, stripping managedFields, watching every namespace; give
    /// it the namespaces of [`factory`](Self::factory) if that one is restricted).
    pub fn leader_factory(mut self, factory: SharedInformerFactory) -> Self {
        self.leader_factory = Some(factory);
        self
    }

    /// The Prometheus registry `/metrics` serves (default: a new one).
    pub fn registry(mut self, registry: prometheus::Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Where `/metrics` is served (default `0.0.0.0:8080`, controller-runtime's `:8080`, so
    /// Prometheus reaches a pod; `127.0.0.1` keeps it local; port 0 picks a free one, see
    /// [`Manager::metrics_addr`]).
    pub fn metrics_addr(mut self, addr: SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// Serves no `/metrics`.
    pub fn no_metrics_server(mut self) -> Self {
        self.metrics_addr = None;
        self
    }

    /// Where `/healthz` and `/readyz` are served (controller-runtime's
    /// `HealthProbeBindAddress`; default `0.0.0.0:8081`, so the kubelet reaches a pod;
    /// `127.0.0.1` keeps it local; port 0 picks a free one, see
    /// [`Manager::health_probe_addr`]).
    pub fn health_probe_addr(mut self, addr: SocketAddr) -> Self {
        self.health_probe_addr = Some(addr);
        self
    }

    /// Serves no `/healthz` and `/readyz`.
    pub fn no_health_probe_server(mut self) -> Self {
        self.health_probe_addr = None;
        self
    }

    /// Serves neither `/metrics` nor the probes.
    pub fn no_http_servers(self) -> Self {
        self.no_metrics_server().no_health_probe_server()
    }

    /// The HTTP endpoints' header-read, idle and TLS-handshake timeouts and connection cap
    /// (default [`ServingConfig::default`]: controller-runtime's 32 s header read, 90 s idle,
    /// 1 MiB of headers; at most 900 connections), for each of the two servers.
    pub fn http_serving(mut self, config: ServingConfig) -> Self {
        self.http_serving = config;
        self
    }

    /// Serves webhooks over HTTPS with `config` (default: no webhook server; controller-runtime's
    /// listens on `:9443`, as [`WebhookServerConfig::default`] does). The server is bound at
    /// [`build`](Self::build) and started by [`Manager::run`] before the caches, on every
    /// replica (no leader election); register webhooks on [`Manager::webhook_server`]. See
    /// [`webhook`](crate::webhook).
    pub fn webhook_server(mut self, config: WebhookServerConfig) -> Self {
        self.webhook_server = Some(config);
        self
    }

    /// Runs the controllers only while holding this Lease.
    pub fn leader_election(mut self, config: LeaderElectionConfig) -> Self {
        self.leader_election = Some(config);
        self
    }

    /// How long past `renew_deadline` a leader may go without a renewal before `/healthz`
    /// fails (client-go's `HealthzAdaptor` timeout; default 20 s, as kube-controller-manager).
    pub fn leader_election_health_tolerance(mut self, tolerance: Duration) -> Self {
        self.leader_election_health_tolerance = tolerance;
        self
    }

    /// How long runnables get to stop after shutdown begins (default 30 s). Zero means "do
    /// not wait": they are aborted at once, and that is no error (as controller-runtime).
    pub fn graceful_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.graceful_shutdown_timeout = timeout;
        self
    }

    /// How long to wait for the caches before failing (default 2 min).
    pub fn cache_sync_timeout(mut self, timeout: Duration) -> Self {
        self.cache_sync_timeout = timeout;
        self
    }

    /// The reconcile timeout of the manager's controllers that set none of their own (default:
    /// none); see [`Controller::reconcile_timeout`].
    pub fn reconcile_timeout(mut self, timeout: Duration) -> Self {
        self.reconcile_timeout = Some(timeout);
        self
    }

    /// Whether SIGINT and SIGTERM start a graceful shutdown, and a second one aborts the
    /// runnables without waiting (default false: a library does not take the process's
    /// signals unless asked; controller-runtime's `SetupSignalHandler` is opt-in too). `run`
    /// returns in every case; the process is never exited.
    pub fn handle_signals(mut self, on: bool) -> Self {
        self.handle_signals = on;
        self
    }

    /// The manager; binds the HTTP endpoints now, so their addresses are known before `run`.
    pub fn build(self) -> Result<Manager, ManagerError> {
        let factory = self.factory.unwrap_or_else(|| {
            SharedInformerFactory::builder(self.client.clone())
                .strip_managed_fields(true)
                .build()
        });
        let leader_factory = self.leader_factory.unwrap_or_else(|| {
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
        let stats_factories = [factory.clone(), leader_factory.clone()];
        registry.register(Box::new(InformerCollector::new(Arc::new(move || {
            stats_factories
                .iter()
                .flat_map(SharedInformerFactory::informer_stats)
                .collect()
        }))?))?;
        let elector = self
            .leader_election
            .map(|config| LeaderElector::new(self.client.clone(), config))
            .transpose()?;
        let webhook_server = self
            .webhook_server
            .map(|config| WebhookServer::new(config, &registry))
            .transpose()?;
        let metrics_listener = bind("metrics", self.metrics_addr)?;
        let probe_listener = bind("health probe", self.health_probe_addr)?;
        let status = ManagerStatus {
            inner: Arc::new(StatusInner {
                synced: AtomicBool::new(false),
                stopping: AtomicBool::new(false),
                elector: elector.clone(),
            }),
        };
        let checks = Arc::new(ProbeChecks::builtin(&status, self.leader_election_health_tolerance));
        let handle = ManagerHandle {
            state: Arc::new(Mutex::new(AddState::Pending(Vec::new()))),
            checks: checks.clone(),
        };
        Ok(Manager {
            client: self.client,
            factory,
            leader_factory,
            metrics,
            status,
            elector,
            leader_status,
            metrics_addr: local_addr(metrics_listener.as_ref()),
            probe_addr: local_addr(probe_listener.as_ref()),
            metrics_listener,
            probe_listener,
            checks,
            http_serving: self.http_serving,
            handle,
            graceful_shutdown_timeout: self.graceful_shutdown_timeout,
            cache_sync_timeout: self.cache_sync_timeout,
            handle_signals: self.handle_signals,
            reconcile_timeout: self.reconcile_timeout,
            webhook_server,
        })
    }
}

/// The [`ManagerBuilder`] method that sets the address of endpoint `what` (of
/// [`ManagerError::Bind`]).
fn bind_setting(what: &str) -> &'static str {
    if what == "metrics" {
        "metrics_addr"
    } else {
        "health_probe_addr"
    }
}

fn bind(what: &'static str, addr: Option<SocketAddr>) -> Result<Option<std::net::TcpListener>, ManagerError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let bind = || -> std::io::Result<std::net::TcpListener> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    };
    bind()
        .map(Some)
        .map_err(|source| ManagerError::Bind { what, addr, source })
}

fn local_addr(listener: Option<&std::net::TcpListener>) -> Option<SocketAddr> {
    listener.and_then(|l| l.local_addr().ok())
}

/// What `/readyz` reports, readable from outside while the manager runs. Cheap to clone.
#[derive(Clone)]
pub struct ManagerStatus {
    inner: Arc<StatusInner>,
}

struct StatusInner {
    synced: AtomicBool,
    /// Set when shutdown begins: `/readyz` fails so no traffic is sent to a leaving pod.
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

/// The probes' checks. Built-in ones first, then the user's, in the order added.
struct ProbeChecks {
    healthz: RwLock<Vec<Checker>>,
    readyz: RwLock<Vec<Checker>>,
}

impl ProbeChecks {
    fn builtin(status: &ManagerStatus, tolerance: Duration) -> Self {
        let mut healthz = Vec::new();
        let mut readyz = Vec::new();
        let synced = status.clone();
        readyz.push(Checker::new("informer-sync", move || {
            if synced.is_ready() {
                Ok(())
            } else {
                Err("caches not synced".into())
            }
        }));
        let stopping = status.clone();
        readyz.push(Checker::new("shutdown", move || {
            if stopping.inner.stopping.load(Ordering::Acquire) {
                Err("shutting down".into())
            } else {
                Ok(())
            }
        }));
        if let Some(elector) = &status.inner.elector {
            let wedged = elector.clone();
            healthz.push(Checker::new("leaderElection", move || {
                wedged.check(tolerance).map_err(Into::into)
            }));
            let observing = elector.clone();
            readyz.push(Checker::new("leaderElection", move || standby_readiness(&observing)));
        }
        ProbeChecks {
            healthz: RwLock::new(healthz),
            readyz: RwLock::new(readyz),
        }
    }

    fn list(&self, readiness: bool) -> Vec<Checker> {
        let checks = if readiness { &self.readyz } else { &self.healthz };
        let checks = checks.read().unwrap_or_else(|e| e.into_inner()).clone();
        if checks.is_empty() {
            return vec![Checker::ping()];
        }
        checks
    }

    fn add(&self, readiness: bool, checker: Checker) {
        let checks = if readiness { &self.readyz } else { &self.healthz };
        checks.write().unwrap_or_else(|e| e.into_inner()).push(checker);
    }
}

/// A standby is ready only while it can reach the API server: one that cannot would not take
/// over when the leader goes, nor know whether it went.
fn standby_readiness(elector: &LeaderElector) -> Result<(), BoxError> {
    if elector.is_leader() || elector.is_observing() {
        return Ok(());
    }
    let since = match elector.last_observed() {
        Some(at) => format!("for {:?}", at.elapsed()),
        None => "yet".to_owned(),
    };
    Err(format!(
        "standby: cannot reach the API server (no successful read of the lease {since}; bound {:?})",
        elector.observation_bound()
    )
    .into())
}

/// Adds runnables to a [`Manager`], before or while it runs (controller-runtime's
/// `mgr.Add` after `Start`). Cheap to clone; get one with [`Manager::handle`].
#[derive(Clone)]
pub struct ManagerHandle {
    state: Arc<Mutex<AddState>>,
    /// The probes' checks, which a runnable's [`readyz_checks`](Runnable::readyz_checks) join.
    checks: Arc<ProbeChecks>,
}

enum AddState {
    /// `run` has not started: kept until it does.
    Pending(Vec<Box<dyn Runnable>>),
    /// `run` is running: sent to it, started at once under the leadership rules.
    Running(mpsc::UnboundedSender<Box<dyn Runnable>>),
    /// Shutdown began: refused.
    Stopped,
}

impl ManagerHandle {
    /// Adds a runnable. Before `run`, it starts with the others; while `run` runs, at once
    /// (one that needs no leader election once the caches synced, one that needs it while
    /// this replica leads, or when it next does). Its [`readyz_checks`](Runnable::readyz_checks)
    /// (a sharded controller's `shard-<ring>`) join `/readyz` before it can start. Refused with
    /// [`ManagerError::Stopped`] once shutdown began.
    pub fn add(&self, runnable: impl Runnable) -> Result<(), ManagerError> {
        self.add_boxed(Box::new(runnable))
    }

    fn add_boxed(&self, runnable: Box<dyn Runnable>) -> Result<(), ManagerError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Registered before the runnable can start, so `/readyz` never passes on its behalf in
        // between (a send refused below only happens once the run is gone).
        let register = |runnable: &dyn Runnable| {
            for check in runnable.readyz_checks() {
                debug!(
                    runnable = runnable.name(),
                    check = check.name(),
                    "readiness check added"
                );
                self.checks.add(true, check);
            }
        };
        match &mut *state {
            AddState::Pending(runnables) => {
                register(&*runnable);
                runnables.push(runnable);
                Ok(())
            }
            AddState::Running(sender) => {
                register(&*runnable);
                sender.send(runnable).map_err(|rejected| ManagerError::Stopped {
                    name: rejected.0.name().to_owned(),
                })
            }
            AddState::Stopped => Err(ManagerError::Stopped {
                name: runnable.name().to_owned(),
            }),
        }
    }
}

/// Runs controllers and other runnables over one informer factory. See the [module
/// docs](self).
pub struct Manager {
    client: Client,
    factory: SharedInformerFactory,
    leader_factory: SharedInformerFactory,
    metrics: Metrics,
    status: ManagerStatus,
    elector: Option<LeaderElector>,
    leader_status: IntGaugeVec,
    metrics_listener: Option<std::net::TcpListener>,
    metrics_addr: Option<SocketAddr>,
    probe_listener: Option<std::net::TcpListener>,
    probe_addr: Option<SocketAddr>,
    checks: Arc<ProbeChecks>,
    http_serving: ServingConfig,
    handle: ManagerHandle,
    graceful_shutdown_timeout: Duration,
    cache_sync_timeout: Duration,
    handle_signals: bool,
    reconcile_timeout: Option<Duration>,
    webhook_server: Option<WebhookServer>,
}

impl Manager {
    /// A builder with controller-runtime's defaults (metrics on `0.0.0.0:8080`, probes on
    /// `0.0.0.0:8081`, 30 s graceful shutdown, no signal handling).
    pub fn builder(client: Client) -> ManagerBuilder {
        ManagerBuilder {
            client,
            factory: None,
            leader_factory: None,
            registry: None,
            metrics_addr: Some(SocketAddr::from(([0, 0, 0, 0], 8080))),
            health_probe_addr: Some(SocketAddr::from(([0, 0, 0, 0], 8081))),
            http_serving: ServingConfig::default(),
            leader_election: None,
            leader_election_health_tolerance: Duration::from_secs(20),
            graceful_shutdown_timeout: Duration::from_secs(30),
            cache_sync_timeout: Duration::from_secs(120),
            handle_signals: false,
            reconcile_timeout: None,
            webhook_server: None,
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

    /// The factory of informers only the leader needs, such as a sharding ring's
    /// [`Sharder`](crate::sharding::Sharder)'s: [`run`](Self::run) starts its informers when
    /// this replica starts leading (without leader election, once the caches synced), before
    /// the runnables that need leader election, and stops them at shutdown (a lost lease ends
    /// the run). A standby's caches of it stay empty, so each replica holds only what it
    /// reconciles. The runnables reading it wait for their own caches, as every controller
    /// does; `/readyz`'s `informer-sync` does not (a standby is ready without them). Its
    /// informers are on `/metrics` with the factory's.
    pub fn leader_factory(&self) -> &SharedInformerFactory {
        &self.leader_factory
    }

    /// The metrics registered in the manager's registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Where `/metrics` is served, if anywhere.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Where `/healthz` and `/readyz` are served, if anywhere.
    pub fn health_probe_addr(&self) -> Option<SocketAddr> {
        self.probe_addr
    }

    /// The webhook server, if configured ([`ManagerBuilder::webhook_server`]): register
    /// webhooks on it, before or while the manager runs.
    pub fn webhook_server(&self) -> Option<&WebhookServer> {
        self.webhook_server.as_ref()
    }

    /// Where webhooks are served, if anywhere.
    pub fn webhook_addr(&self) -> Option<SocketAddr> {
        self.webhook_server.as_ref().map(WebhookServer::local_addr)
    }

    /// A handle on readiness and leadership.
    pub fn status(&self) -> ManagerStatus {
        self.status.clone()
    }

    /// A handle that adds runnables, also while [`run`](Self::run) runs.
    pub fn handle(&self) -> ManagerHandle {
        self.handle.clone()
    }

    /// A controller builder on the manager's factory and metrics registry. Its graceful
    /// shutdown timeout is set a little below the manager's (90%), so the controller reports
    /// what it dropped before the manager would abort it. It gets the manager's
    /// [`reconcile_timeout`](ManagerBuilder::reconcile_timeout), if any, unless it sets its own.
    pub fn controller(&self, name: impl Into<String>) -> ControllerBuilder {
        let builder = Controller::new(name, &self.factory)
            .metrics(self.metrics.clone())
            .graceful_shutdown_timeout(self.graceful_shutdown_timeout.mul_f64(0.9));
        match self.reconcile_timeout {
            Some(timeout) => builder.reconcile_timeout(timeout),
            None => builder,
        }
    }

    /// Adds a controller or another runnable, started by [`run`](Self::run). Its
    /// [`readyz_checks`](Runnable::readyz_checks) join `/readyz`: a
    /// [sharded](crate::ControllerBuilder::sharded) controller's `shard-<ring>` fails while its
    /// shard does not hold its shard Lease. To add one while the manager runs, use
    /// [`handle`](Self::handle).
    pub fn add(&mut self, runnable: impl Runnable) {
        if let Err(e) = self.handle.add(runnable) {
            // Unreachable: `run` consumes the manager, so it has not started.
            warn!(error = %e, "runnable not added");
        }
    }

    /// Adds a liveness check to `/healthz` (controller-runtime's `AddHealthzCheck`): a failing
    /// one makes the kubelet restart the pod. See [`healthz`].
    pub fn add_healthz_check(
        &mut self,
        name: impl Into<String>,
        check: impl Fn() -> Result<(), BoxError> + Send + Sync + 'static,
    ) {
        self.checks.add(false, Checker::new(name, check));
    }

    /// Adds a readiness check to `/readyz` (controller-runtime's `AddReadyzCheck`): a failing
    /// one takes the pod out of its Services' endpoints.
    pub fn add_readyz_check(
        &mut self,
        name: impl Into<String>,
        check: impl Fn() -> Result<(), BoxError> + Send + Sync + 'static,
    ) {
        self.checks.add(true, Checker::new(name, check));
    }

    /// Runs everything until `shutdown` fires (or a signal, a failure, a lost lease), then shuts
    /// down gracefully. See the [module docs](self).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ManagerError> {
        let Manager {
            client: _,
            factory,
            leader_factory,
            metrics,
            status,
            elector,
            leader_status,
            metrics_listener,
            metrics_addr,
            probe_listener,
            probe_addr,
            checks,
            http_serving,
            handle,
            graceful_shutdown_timeout,
            cache_sync_timeout,
            handle_signals,
            reconcile_timeout: _,
            webhook_server,
        } = self;
        let stop = shutdown.child_token();
        // Every task this run spawns is owned by it: if the run future is dropped (aborted, or
        // its caller gave up), the runnables' JoinSet aborts them, the election, server and
        // signal tasks are aborted by their handles, and these guards stop the runnables and
        // the informers (a dropped leader stops renewing its lease, so another takes over).
        let _stop_on_drop = stop.clone().drop_guard();
        // Fired by a second signal: no more waiting for the runnables.
        let force = CancellationToken::new();
        let mut failures: Vec<ManagerError> = Vec::new();
        // Stopped last: informers and the HTTP servers keep serving while runnables finish.
        let infrastructure = CancellationToken::new();
        let _infrastructure_on_drop = infrastructure.clone().drop_guard();
        let signals = handle_signals.then(|| {
            let (guard, task) = spawn_signal_handler(stop.clone(), force.clone());
            (guard, AbortOnDropHandle::new(task))
        });

        // 1. HTTP servers (controller-runtime's `HTTPServers` group, started first).
        let mut servers: Vec<(&'static str, AbortOnDropHandle<()>)> = Vec::new();
        let metrics_app = Router::new()
            .route("/metrics", get(metrics_handler))
            .with_state(metrics.clone());
        let probe_app = Router::new()
            .route("/healthz", get(healthz_root))
            .route("/healthz/{name}", get(healthz_single))
            .route("/readyz", get(readyz_root))
            .route("/readyz/{name}", get(readyz_single))
            .with_state(checks.clone());
        for (what, listener, addr, app) in [
            ("metrics server", metrics_listener, metrics_addr, metrics_app),
            ("health probe server", probe_listener, probe_addr, probe_app),
        ] {
            let Some(listener) = listener else { continue };
            let addr = addr.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    info!(%addr, server = what, "serving");
                    let (serving, stop) = (http_serving.clone(), infrastructure.clone());
                    servers.push((
                        what,
                        AbortOnDropHandle::new(tokio::spawn(http_serving::serve(listener, app, None, serving, stop))),
                    ));
                }
                Err(source) => {
                    failures.push(ManagerError::Bind {
                        what: if what == "metrics server" {
                            "metrics"
                        } else {
                            "health probe"
                        },
                        addr,
                        source,
                    });
                    stop.cancel();
                }
            }
        }

        // The webhook server, before the caches (controller-runtime's `Webhooks` group): a
        // conversion webhook may be needed to list them.
        if let Some(webhook_server) = webhook_server {
            match webhook_server.prepare(infrastructure.clone()) {
                Ok(serving) => servers.push(("webhook server", AbortOnDropHandle::new(tokio::spawn(serving)))),
                Err(e) => {
                    error!(error = %e, "cannot start the webhook server");
                    failures.push(ManagerError::Webhook(e));
                    stop.cancel();
                }
            }
        }

        // Runnables added from now on come through this channel.
        let (add_tx, mut add_rx) = mpsc::unbounded_channel::<Box<dyn Runnable>>();
        let initial = {
            let mut state = handle.state.lock().unwrap_or_else(|e| e.into_inner());
            match std::mem::replace(&mut *state, AddState::Running(add_tx)) {
                AddState::Pending(runnables) => runnables,
                AddState::Running(_) | AddState::Stopped => Vec::new(),
            }
        };
        let (mut waiting_leaders, mut waiting_others): (Vec<_>, Vec<_>) =
            initial.into_iter().partition(|r| r.needs_leader_election());

        // 2. Caches.
        factory.start(&infrastructure);
        let mut tasks = RunningTasks::default();
        let runnables_stop = stop.child_token();
        // Fired when the lease is lost: the runnables stop without finishing their work.
        let stop_now = CancellationToken::new();
        tasks.stop_now = stop_now.clone();
        info!("waiting for caches to sync");
        let mut sync = std::pin::pin!(factory.wait_for_cache_sync_timeout(&stop, cache_sync_timeout));
        let mut synced = false;

        // Leadership: the election task sends the term once leading, and reports a lost lease;
        // it releases the lease only when `election_stop` fires, after the runnables stopped.
        let election_stop = CancellationToken::new();
        let (lost_tx, mut lost_rx) = mpsc::channel::<LeaderElectionError>(1);
        let (leading_tx, mut leading_rx) = mpsc::channel::<Leadership>(1);
        let mut election: Option<AbortOnDropHandle<()>> = None;
        let mut leadership: Option<Leadership> = None;
        let leading = runnables_stop.child_token();
        let mut leadership_lost = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                result = &mut sync, if !synced => {
                    synced = true;
                    match result {
                        Ok(()) => {
                            status.inner.synced.store(true, Ordering::Release);
                            info!("caches synced");
                        }
                        Err(FactoryError::CacheSyncTimeout { timeout, informers }) => {
                            error!(?timeout, ?informers, "caches did not sync");
                            failures.push(ManagerError::CacheSyncTimeout { timeout, informers });
                            break;
                        }
                        Err(e) => {
                            info!(reason = %e, "stopped before the caches synced");
                            break;
                        }
                    }
                    // 3. Runnables that need no leader election (`Others`), on synced caches.
                    for runnable in waiting_others.drain(..) {
                        tasks.spawn(runnable, runnables_stop.clone());
                    }
                    // 4. Leader election.
                    election = match &elector {
                        None => {
                            let _ = leading_tx.try_send(Leadership::unconditional());
                            None
                        }
                        Some(elector) => Some(AbortOnDropHandle::new(spawn_election(
                            elector.clone(),
                            election_stop.clone(),
                            leader_status.with_label_values(&[elector.lease_name()]),
                            leading_tx.clone(),
                            lost_tx.clone(),
                        ))),
                    };
                }
                Some(term) = leading_rx.recv() => {
                    // The leader's own informers, before the runnables that read them.
                    leader_factory.start(&infrastructure);
                    for runnable in waiting_leaders.drain(..) {
                        tasks.spawn_leading(runnable, leading.clone(), term.clone());
                    }
                    leadership = Some(term);
                }
                Some(runnable) = add_rx.recv() => {
                    match (&leadership, runnable.needs_leader_election(), synced) {
                        (Some(term), true, _) => {
                            // Informers it asked the leader factory for since the last start.
                            leader_factory.start(&infrastructure);
                            tasks.spawn_leading(runnable, leading.clone(), term.clone());
                        }
                        (None, true, _) => {
                            debug!(runnable = runnable.name(), "added: starts when leading");
                            waiting_leaders.push(runnable);
                        }
                        (_, false, true) => tasks.spawn(runnable, runnables_stop.clone()),
                        (_, false, false) => {
                            debug!(runnable = runnable.name(), "added: starts once the caches synced");
                            waiting_others.push(runnable);
                        }
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
        // No more runnables: refuse new ones, drop those not started.
        *handle.state.lock().unwrap_or_else(|e| e.into_inner()) = AddState::Stopped;
        add_rx.close();
        while let Ok(runnable) = add_rx.try_recv() {
            waiting_others.push(runnable);
        }
        let never_started: Vec<&str> = waiting_others
            .iter()
            .chain(&waiting_leaders)
            .map(|r| r.name())
            .collect();
        if !never_started.is_empty() {
            info!(runnables = ?never_started, "shutting down before these runnables started");
        }
        // Another process may lead already: no grace period for reconciles in flight (as
        // controller-runtime, which drops its graceful shutdown timeout to zero here).
        let timeout = if leadership_lost {
            Duration::ZERO
        } else {
            graceful_shutdown_timeout
        };
        if timeout.is_zero() {
            // "Do not wait" (controller-runtime returns at once): abort, and say so at INFO.
            let left = tasks.abort_all().await;
            if !left.is_empty() {
                info!(?left, "no graceful shutdown period: runnables aborted");
            }
        } else {
            let all_done = async {
                while let Some((name, result)) = tasks.join_next().await {
                    if let Err(source) = result {
                        failures.push(ManagerError::Runnable { name, source });
                    }
                }
            };
            let ended = tokio::select! {
                () = all_done => true,
                () = tokio::time::sleep(timeout) => false,
                () = force.cancelled() => {
                    warn!("second signal: aborting the runnables without waiting");
                    tasks.abort_all().await;
                    true
                }
            };
            if !ended {
                let left = tasks.abort_all().await;
                warn!(
                    ?timeout,
                    ?left,
                    "runnables still running after the graceful shutdown timeout: aborted"
                );
                failures.push(ManagerError::ShutdownTimeout { timeout, names: left });
            }
        }
        // The runnables have stopped: now the lease may go (released if configured). The
        // release retries until `renew_deadline`; the task gets a second more.
        election_stop.cancel();
        if let Some(mut election) = election {
            let bound = elector.as_ref().map_or(Duration::ZERO, |e| e.config().renew_deadline) + Duration::from_secs(1);
            let joined = match tokio::time::timeout(bound, &mut election).await {
                Ok(joined) => joined,
                Err(_) => {
                    warn!(?bound, "the leader election task did not stop in time: aborted");
                    election.abort();
                    election.await
                }
            };
            if let Err(e) = joined
                && e.is_panic()
            {
                error!(task = "leader election", error = %e, "task panicked");
                failures.push(ManagerError::Runnable {
                    name: "leader election".into(),
                    source: format!("panicked: {e}").into(),
                });
            }
        }
        infrastructure.cancel();
        factory.shutdown().await;
        leader_factory.shutdown().await;
        for (name, server) in servers {
            if let Err(e) = server.await
                && e.is_panic()
            {
                error!(task = name, error = %e, "task panicked");
                failures.push(ManagerError::Runnable {
                    name: name.into(),
                    source: format!("panicked: {e}").into(),
                });
            }
        }
        if let Some((guard, task)) = signals {
            guard.cancel();
            if let Err(e) = task.await
                && e.is_panic()
            {
                error!(task = "signal handler", error = %e, "task panicked");
            }
        }
        info!(failures = failures.len(), "manager stopped");
        ManagerError::join(failures)
    }
}

/// The election task: acquire, hand the term to the run loop, renew until `stop` (then release)
/// or until the lease is lost (reported on `lost`).
fn spawn_election(
    elector: LeaderElector,
    stop: CancellationToken,
    gauge: prometheus::IntGauge,
    leading: mpsc::Sender<Leadership>,
    lost: mpsc::Sender<LeaderElectionError>,
) -> JoinHandle<()> {
    gauge.set(0);
    tokio::spawn(async move {
        info!(identity = %elector.identity(), "waiting to acquire the lease");
        if !elector.acquire(&stop).await {
            return;
        }
        gauge.set(1);
        info!(identity = %elector.identity(), "acquired the lease: leading");
        let _ = leading.try_send(elector.leadership());
        let result = elector.renew(&stop).await;
        gauge.set(0);
        if let Err(e) = result {
            let _ = lost.try_send(e);
        }
    })
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

/// Cancels `stop` on SIGINT or SIGTERM, and `force` on a second one (controller-runtime's
/// `SetupSignalHandler` exits the process there; a library returns instead). Cancel the
/// returned token to end the task, then join it.
fn spawn_signal_handler(stop: CancellationToken, force: CancellationToken) -> (CancellationToken, JoinHandle<()>) {
    let guard = CancellationToken::new();
    let done = guard.clone();
    let task = tokio::spawn(async move {
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
                warn!("second signal: not waiting for the graceful shutdown");
                force.cancel();
                return;
            }
            info!("signal received: shutting down (a second one stops waiting)");
            stop.cancel();
        }
    });
    (guard, task)
}

async fn metrics_handler(State(metrics): State<Metrics>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics.encode(),
    )
}

type Probe = ([(axum::http::HeaderName, &'static str); 1], (StatusCode, String));

fn probe(answer: (StatusCode, String)) -> Probe {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        answer,
    )
}

fn not_found() -> (StatusCode, String) {
    (StatusCode::NOT_FOUND, "404 page not found\n".into())
}

async fn healthz_root(State(checks): State<Arc<ProbeChecks>>, RawQuery(query): RawQuery) -> Probe {
    probe(healthz::root(&checks.list(false), query.as_deref(), "healthz"))
}

async fn readyz_root(State(checks): State<Arc<ProbeChecks>>, RawQuery(query): RawQuery) -> Probe {
    probe(healthz::root(&checks.list(true), query.as_deref(), "readyz"))
}

async fn healthz_single(State(checks): State<Arc<ProbeChecks>>, Path(name): Path<String>) -> Probe {
    probe(healthz::single(&checks.list(false), &name).unwrap_or_else(not_found))
}

async fn readyz_single(State(checks): State<Arc<ProbeChecks>>, Path(name): Path<String>) -> Probe {
    probe(healthz::single(&checks.list(true), &name).unwrap_or_else(not_found))
}
