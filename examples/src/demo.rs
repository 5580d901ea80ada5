//! What the example binaries share: the embedded API server, a reconciler wrapper that prints
//! one line per reconcile and keeps the figures of the summary table, and the table itself.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer::controller::{Action, Context, ErrorChain, Reconciler, Request, stale_cache_race};
use kube::api::{Api, PostParams};

/// An error of the example programs, shown to the user as one line.
pub type DemoError = Box<dyn std::error::Error + Send + Sync>;

/// envtest started in-process, with its kubeconfig written to a file kubectl can use.
pub struct Embedded {
    /// The server.
    pub server: envtest::Server,
    /// The kubeconfig pointing at it.
    pub kubeconfig: PathBuf,
}

/// Starts envtest on a free loopback port and writes its kubeconfig under the temp directory.
pub async fn start_embedded(program: &str) -> Result<Embedded, DemoError> {
    let server = envtest::Server::start(envtest::Config::default()).await?;
    let kubeconfig = std::env::temp_dir().join(format!("{program}-{}.kubeconfig", std::process::id()));
    server.write_kubeconfig(&kubeconfig)?;
    Ok(Embedded { server, kubeconfig })
}

/// Creates `crds` and waits until the server serves them.
pub async fn install_crds(client: &kube::Client, crds: &[CustomResourceDefinition]) -> Result<(), DemoError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        match api.create(&PostParams::default(), crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let established = api.get_opt(&name).await?.is_some_and(|crd| {
                crd.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"))
            });
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("CRD {name} not established within 10s").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// One reconcile as the summary counts it.
#[derive(Clone, Debug)]
struct Sample {
    result: &'static str,
    took: Duration,
}

/// The figures of the summary table: every reconcile's result and duration.
#[derive(Clone, Default)]
pub struct Stats {
    samples: Arc<Mutex<Vec<Sample>>>,
}

/// The summary of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Reconciles run.
    pub reconciles: usize,
    /// Reconciles that failed.
    pub errors: usize,
    /// Reconciles that asked to be run again (`Requeue`, `RequeueAfter`).
    pub requeues: usize,
    /// Median reconcile duration.
    pub p50: Duration,
    /// 99th percentile reconcile duration.
    pub p99: Duration,
}

impl Stats {
    /// Records one reconcile and prints its `line` under the same lock, so every reconcile
    /// [`print_summary`](Self::print_summary) counts has its line above the table, and no other.
    fn record(&self, result: &'static str, took: Duration, line: Option<String>) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push(Sample { result, took });
        if let Some(line) = line {
            println!("{line}");
        }
    }

    /// The figures so far.
    pub fn summary(&self) -> Summary {
        Self::summarize(&self.samples.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Prints the summary table (see [`print_summary`]) of the figures so far, with no
    /// reconcile line printed in between; returns the figures.
    pub fn print_summary(&self, objects: &[(&str, usize)]) -> Summary {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let summary = Self::summarize(&samples);
        print_summary(objects, &summary);
        summary
    }

    fn summarize(samples: &[Sample]) -> Summary {
        let mut took: Vec<Duration> = samples.iter().map(|s| s.took).collect();
        took.sort_unstable();
        let percentile = |p: f64| -> Duration {
            if took.is_empty() {
                return Duration::ZERO;
            }
            let rank = ((p * took.len() as f64).ceil() as usize).clamp(1, took.len());
            took[rank - 1]
        };
        Summary {
            reconciles: samples.len(),
            errors: samples.iter().filter(|s| s.result == "error").count(),
            requeues: samples.iter().filter(|s| s.result.starts_with("requeue")).count(),
            p50: percentile(0.50),
            p99: percentile(0.99),
        }
    }
}

/// Wraps a reconciler: prints one line per reconcile (when `verbose`) and records it in
/// [`Stats`]. The result is the one the controller counts: a 409 or 404 from the API server
/// is a stale-cache race the controller requeues
/// ([`stale_cache_race`](kinformer::controller::stale_cache_race)), shown as `requeue` with the
/// server's reason; any other error as `error` with its chain printed once.
pub struct Instrumented<R> {
    /// The wrapped reconciler.
    pub inner: R,
    /// Where the figures go.
    pub stats: Stats,
    /// Whether to print a line per reconcile.
    pub verbose: bool,
}

impl<K, R> Reconciler<K> for Instrumented<R>
where
    K: Send + Sync + 'static,
    R: Reconciler<K>,
    R::Error: std::error::Error + 'static,
{
    type Error = R::Error;

    async fn reconcile(&self, req: Request, ctx: &Context<K>) -> Result<Action, Self::Error> {
        let started = Instant::now();
        let shown = req.to_string();
        let outcome = self.inner.reconcile(req, ctx).await;
        let took = started.elapsed();
        let (result, detail) = match &outcome {
            Ok(Action::Done) => ("success", String::new()),
            Ok(Action::Requeue) => ("requeue", String::new()),
            Ok(Action::RequeueAfter(d)) => ("requeue_after", format!(" after {d:?}")),
            Err(e) => match stale_cache_race(e) {
                Some(status) => (
                    "requeue",
                    format!(": {} {}: {}", status.code, status.reason, status.message),
                ),
                None => ("error", format!(": {}", ErrorChain(e))),
            },
        };
        let line = self.verbose.then(|| {
            format!(
                "  reconcile {:<10} {shown:<28} {result}{detail} ({:.1} ms)",
                ctx.controller_name(),
                took.as_secs_f64() * 1e3
            )
        });
        self.stats.record(result, took, line);
        outcome
    }
}

/// Prints the summary table.
pub fn print_summary(objects: &[(&str, usize)], summary: &Summary) {
    println!();
    println!("  ┌──────────────────────────┬──────────┐");
    for (what, n) in objects {
        println!("  │ {what:<24} │ {n:>8} │");
    }
    println!("  │ {:<24} │ {:>8} │", "reconciles", summary.reconciles);
    println!("  │ {:<24} │ {:>8} │", "errors", summary.errors);
    println!("  │ {:<24} │ {:>8} │", "requeues", summary.requeues);
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    println!("  │ {:<24} │ {:>8} │", "p50 reconcile latency", ms(summary.p50));
    println!("  │ {:<24} │ {:>8} │", "p99 reconcile latency", ms(summary.p99));
    println!("  └──────────────────────────┴──────────┘");
}

/// Logs to stderr through `tracing`, filtered by RUST_LOG (default: warnings), in colour only
/// on a terminal.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,controller=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The kubeconfig of the cluster to run against: `explicit` (`--kubeconfig`) alone; `None` (run
/// the embedded demo) without it or with `embedded` (`--embedded`). An exported KUBECONFIG never
/// sends a demo to a real cluster by itself: the demo keeps its embedded server and prints one
/// line saying so.
pub fn cluster_kubeconfig(explicit: Option<&std::path::Path>, embedded: bool) -> Option<PathBuf> {
    if embedded {
        return None;
    }
    if explicit.is_none() && std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty()) {
        println!(
            "▸ KUBECONFIG is set but not used: the demo runs on its embedded API server \
             (--kubeconfig \"$KUBECONFIG\" runs it against that cluster)"
        );
    }
    explicit.map(std::path::Path::to_path_buf)
}

/// A client for the current context of the kubeconfig at `path`, whose connection errors name
/// the server ([`kinformer::cache::client`]).
pub async fn client_from_kubeconfig(path: &std::path::Path) -> Result<kube::Client, DemoError> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
    Ok(kinformer::cache::client::from_config(config)?)
}

/// Polls `cond` every 25 ms until it is true; an error once `deadline` passed, naming `what`.
pub async fn wait_until<F, Fut>(deadline: Instant, what: &str, mut cond: F) -> Result<(), DemoError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, DemoError>>,
{
    loop {
        if cond().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The flags every example binary has (flattened into each binary's own `Args`).
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Run the scripted demo on an in-process API server (the default without a kubeconfig).
    #[arg(long, conflicts_with = "kubeconfig")]
    pub embedded: bool,
    /// Run against the cluster of this kubeconfig until SIGINT/SIGTERM, with leader election
    /// (an exported KUBECONFIG alone does not: the demo stays on its embedded server).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// How long the demo may take to converge before it fails.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub timeout: u64,
    /// Where to serve /metrics (default: a free loopback port in the demo, 0.0.0.0:8080
    /// against a cluster, so Prometheus reaches it).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where to serve /healthz and /readyz (default: a free loopback port in the demo,
    /// 0.0.0.0:8081 against a cluster, so the kubelet's probes reach it).
    #[arg(long, value_name = "ADDR")]
    pub health_probe_addr: Option<std::net::SocketAddr>,
    /// The namespace of the demo's objects and of the leader election Lease.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Do not print a line per reconcile.
    #[arg(long)]
    pub quiet: bool,
}

/// The manager of a binary run against a real cluster: leader election on the Lease
/// `lease_name` in `--namespace` (identity: `<hostname>_<uuid>`), `/metrics` on
/// `--metrics-addr` and `/healthz`, `/readyz` on `--health-probe-addr`, by default on every
/// interface at ports 8080 and 8081 so Prometheus and the kubelet reach a pod; SIGINT and
/// SIGTERM start the graceful shutdown.
pub fn cluster_manager(
    client: kube::Client,
    args: &CommonArgs,
    lease_name: &str,
) -> Result<kinformer::controller::Manager, DemoError> {
    cluster_manager_builder(client, args, lease_name)
        .build()
        .map_err(manager_error)
}

/// The builder of [`cluster_manager`], for a binary that sets more (its informer factory).
pub fn cluster_manager_builder(
    client: kube::Client,
    args: &CommonArgs,
    lease_name: &str,
) -> kinformer::controller::ManagerBuilder {
    use kinformer::controller::{LeaderElectionConfig, Manager};
    let metrics = args
        .metrics_addr
        .unwrap_or(std::net::SocketAddr::from(([0, 0, 0, 0], 8080)));
    let probes = args
        .health_probe_addr
        .unwrap_or(std::net::SocketAddr::from(([0, 0, 0, 0], 8081)));
    Manager::builder(client)
        .metrics_addr(metrics)
        .health_probe_addr(probes)
        .handle_signals(true)
        .leader_election(LeaderElectionConfig::with_default_identity(&args.namespace, lease_name))
}

/// A Manager's build error for the user: an address that could not be bound (a port already in
/// use) names the flag that sets it; any other error as it is.
pub fn manager_error(e: kinformer::controller::ManagerError) -> DemoError {
    use kinformer::controller::ManagerError;
    match e {
        ManagerError::Bind { what, addr, source } => {
            let flag = if what == "metrics" {
                "--metrics-addr"
            } else {
                "--health-probe-addr"
            };
            format!(
                "cannot serve the {what} endpoint on {addr}: {source}; choose another address with \
                 {flag} (127.0.0.1:0 takes any free port)"
            )
            .into()
        }
        other => other.into(),
    }
}

/// Where a manager serves its endpoints, for messages.
pub fn display_addr(manager: &kinformer::controller::Manager) -> String {
    manager
        .metrics_addr()
        .map_or_else(|| "(none)".into(), |a| a.to_string())
}

/// The process's exit status for `result`, printing the error as `program: error`.
pub fn exit_code(program: &str, result: Result<(), DemoError>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
