//! Chaos for leader election: two replicas (each a Manager with leader election and a
//! controller copying every ConfigMap of `default` into a namespace of its own) over one
//! envtest, under the seeded fault schedule of `envtest::chaos` and a writer churning the
//! inputs, while the leader is repeatedly *stopped and resumed*.
//!
//! How a stop is simulated in-process: each replica runs on its own current-thread tokio runtime
//! in its own OS thread; a stop is a task of that runtime blocking the thread on a channel until
//! the test resumes it. As under SIGSTOP, nothing of that replica runs meanwhile (no timer, no
//! I/O, no renewal) while the kernel keeps buffering what envtest sends it; on resume every
//! timer is due and every socket ready at once. A replica whose manager ended (a deposed leader
//! fails with `LeadershipLost`) is restarted as a new *instance*, as a pod's container would be;
//! instance `n` writes only under namespace `out-n`, so the request log says which instance
//! sent a write.
//!
//! Checked: once stopped, an instance passes no `ctx.ensure_leading()` check again (after it
//! resumes, the other replica holds the lease and its term has lapsed by its clock), so it
//! starts no write after the other replica acquired; the writes the request log shows from it
//! after the takeover are only those already past their check when it stopped (at most one per
//! worker: the gap no client-side check closes, see `controller::leadership`); and at the end
//! (faults cleared, no more stops) the last leader's namespace mirrors the inputs. A short run is part of `cargo test`; `controller_leader_chaos_long` runs 20 seeds
//! (`KINFORMER_CHAOS_SEED=<n>` replays one, `KINFORMER_CHAOS_SECS` sets the chaos time).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::random_write;
use controller::{Action, BoxError, Context, LeaderElectionConfig, Manager, ManagerStatus, Request, reconciler_fn};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const NAMES: usize = 20;
/// Instances get namespaces `out-0 .. out-INSTANCES`.
const INSTANCES: usize = 200;
const LEASE: (Duration, Duration, Duration) = (
    Duration::from_millis(1000),
    Duration::from_millis(750),
    Duration::from_millis(200),
);
const WAIT: Duration = Duration::from_secs(30);
const INPUTS: &str = "/api/v1/namespaces/default/configmaps";
const WORKERS: usize = 2;

/// Per instance, how many `ensure_leading` checks passed (each is followed by one write).
type Checks = Arc<Vec<AtomicUsize>>;

fn value(cm: &ConfigMap) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get("v")).cloned()
}

/// One replica: its manager instances run one after another on a runtime of their own.
struct Replica {
    /// The instance running now and its status.
    current: Arc<Mutex<Option<(usize, ManagerStatus)>>>,
    /// Sends the receiver a stop blocks on; the runtime answers on the oneshot once stopped.
    stops: tokio::sync::mpsc::UnboundedSender<(std::sync::mpsc::Receiver<()>, tokio::sync::oneshot::Sender<()>)>,
    shutdown: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Replica {
    fn start(url: String, identity: &'static str, instances: Arc<AtomicUsize>, checks: Checks) -> Self {
        let current: Arc<Mutex<Option<(usize, ManagerStatus)>>> = Arc::default();
        let (stops, mut stop_rx) =
            tokio::sync::mpsc::unbounded_channel::<(std::sync::mpsc::Receiver<()>, tokio::sync::oneshot::Sender<()>)>();
        let shutdown = CancellationToken::new();
        let thread = std::thread::spawn({
            let (current, shutdown) = (current.clone(), shutdown.clone());
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    // The stopper: blocks this runtime's only thread until resumed.
                    tokio::spawn(async move {
                        while let Some((resume, stopped)) = stop_rx.recv().await {
                            let _ = stopped.send(());
                            let _ = resume.recv();
                        }
                    });
                    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
                    while !shutdown.is_cancelled() {
                        let instance = instances.fetch_add(1, Ordering::SeqCst);
                        assert!(instance < INSTANCES, "more instances than namespaces");
                        let manager = instance_manager(client.clone(), identity, instance, checks.clone());
                        *current.lock().unwrap() = Some((instance, manager.status()));
                        let result = manager.run(shutdown.clone()).await;
                        eprintln!("replica {identity} instance {instance} ended: {result:?}");
                        *current.lock().unwrap() = None;
                    }
                });
            }
        });
        Replica {
            current,
            stops,
            shutdown,
            thread: Some(thread),
        }
    }

    fn leading_instance(&self) -> Option<usize> {
        self.current
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|(instance, status)| status.is_leader().then_some(*instance))
    }

    fn instance(&self) -> Option<usize> {
        self.current.lock().unwrap().as_ref().map(|(instance, _)| *instance)
    }

    /// Stops the replica's runtime; returns the handle that resumes it.
    async fn stop(&self) -> std::sync::mpsc::Sender<()> {
        let (resume, blocked_on) = std::sync::mpsc::channel();
        let (stopped_tx, stopped) = tokio::sync::oneshot::channel();
        self.stops.send((blocked_on, stopped_tx)).unwrap();
        stopped.await.unwrap();
        resume
    }

    async fn join(mut self) {
        self.shutdown.cancel();
        if let Some(thread) = self.thread.take() {
            tokio::task::spawn_blocking(move || thread.join().unwrap())
                .await
                .unwrap();
        }
    }
}

/// Instance `n` of a replica: copies every ConfigMap of `default` into `out-n` (deletes the copy
/// of one that is gone), every write behind `ctx.ensure_leading()`.
fn instance_manager(client: kube::Client, identity: &str, instance: usize, checks: Checks) -> Manager {
    let config = LeaderElectionConfig::new("default", "chaos-leader", identity)
        .lease_duration(LEASE.0)
        .renew_deadline(LEASE.1)
        .retry_period(LEASE.2);
    let mut manager = Manager::builder(client)
        .no_http_servers()
        .handle_signals(false)
        .graceful_shutdown_timeout(Duration::from_secs(5))
        .leader_election(config)
        .build()
        .unwrap();
    let out = format!("out-{instance}");
    let reconciler = reconciler_fn(move |req: Request, ctx: Context<ConfigMap>| {
        let out = out.clone();
        let checks = checks.clone();
        let ensure_leading = move |ctx: &Context<ConfigMap>| {
            ctx.ensure_leading()?;
            checks[instance].fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(())
        };
        async move {
            if req.namespace.as_deref() != Some("default") {
                return Ok::<_, BoxError>(Action::Done);
            }
            let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), &out);
            let Some(input) = ctx.get(&req)? else {
                ensure_leading(&ctx)?;
                match api.delete(&req.name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                return Ok(Action::Done);
            };
            let mut copy = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(req.name.clone()),
                    namespace: Some(out.clone()),
                    ..ObjectMeta::default()
                },
                data: input.data.clone(),
                ..ConfigMap::default()
            };
            match api.get_opt(&req.name).await? {
                Some(existing) if existing.data == copy.data => {}
                Some(existing) => {
                    copy.metadata.resource_version = existing.metadata.resource_version;
                    ensure_leading(&ctx)?;
                    api.replace(&req.name, &PostParams::default(), &copy).await?;
                }
                None => {
                    ensure_leading(&ctx)?;
                    api.create(&PostParams::default(), &copy).await?;
                }
            }
            Ok(Action::Done)
        }
    });
    let built = manager
        .controller("copier")
        .for_resource::<ConfigMap>()
        .workers(WORKERS)
        .build(reconciler)
        .unwrap();
    manager.add(built);
    manager
}

async fn writer(client: kube::Client, seed: u64, stop: CancellationToken) {
    let mut rng = StdRng::seed_from_u64(seed);
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    while !stop.is_cancelled() {
        random_write(&api, &mut rng, NAMES).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = f() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn contents(env: &envtest::Server, namespace: &str) -> BTreeMap<String, Option<String>> {
    env.objects_of(&format!("/api/v1/namespaces/{namespace}/configmaps"))
        .unwrap()
        .into_iter()
        .map(|o| serde_json::from_value::<ConfigMap>(o).unwrap())
        .filter_map(|cm| cm.metadata.name.clone().map(|name| (name, value(&cm))))
        .filter(|(name, _)| name.starts_with("cm-"))
        .collect()
}

async fn run_seed(seed: u64, chaos: Duration) {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for n in 0..INSTANCES {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(format!("out-{n}")),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces.create(&PostParams::default(), &ns).await.unwrap();
    }
    let instances = Arc::new(AtomicUsize::new(0));
    let checks: Checks = Arc::new((0..INSTANCES).map(|_| AtomicUsize::new(0)).collect());
    let replicas = [
        Replica::start(env.base_url().to_owned(), "a", instances.clone(), checks.clone()),
        Replica::start(env.base_url().to_owned(), "b", instances.clone(), checks.clone()),
    ];
    let stop = CancellationToken::new();
    let writes = tokio::spawn(writer(client.clone(), seed, stop.clone()));
    let faults = tokio::spawn({
        let (faults, stop) = (env.faults(), stop.clone());
        async move { envtest::chaos::inject_faults(&faults, INPUTS, seed, stop).await }
    });

    let mut rng = StdRng::seed_from_u64(seed ^ 0x1eade5);
    let started = Instant::now();
    let mut cycles = 0;
    let mut violations = Vec::new();
    let mut in_flight_at_stop = 0;
    while started.elapsed() < chaos {
        let (stopped, instance) = until(WAIT, "a leader", || {
            replicas
                .iter()
                .enumerate()
                .find_map(|(i, r)| r.leading_instance().map(|instance| (i, instance)))
        })
        .await;
        let resume = replicas[stopped].stop().await;
        let stopped_at = Instant::now();
        let checked_at_stop = checks[instance].load(Ordering::SeqCst);
        let other = &replicas[1 - stopped];
        until(WAIT, "the other replica to take over", || other.leading_instance()).await;
        // From now on, a write of the stopped instance is a deposed leader's.
        env.faults().clear_requests();
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        // Stopped for at least renew_deadline: its term has lapsed by its own clock whatever
        // the other replica did (a restore of the store to a backup without the Lease, or with
        // it free, lets the other acquire at once: the store going back in time is outside
        // what leader election can guard).
        tokio::time::sleep_until(stopped_at + LEASE.1).await;
        resume.send(()).unwrap();
        // The resumed instance finds its term over and ends; a new instance replaces it.
        until(WAIT, "the stopped instance to end", || {
            (replicas[stopped].instance() != Some(instance)).then_some(())
        })
        .await;
        let prefix = format!("/namespaces/out-{instance}/");
        let late: Vec<String> = env
            .requests()
            .into_iter()
            .filter(|r| matches!(r.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE") && r.path.contains(&prefix))
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        let checked_after = checks[instance].load(Ordering::SeqCst) - checked_at_stop;
        if checked_after > 0 {
            violations.push(format!(
                "instance {instance} passed {checked_after} checks after it was stopped"
            ));
        }
        // Writes already past their check when the instance stopped: one per worker at most.
        if late.len() > WORKERS {
            violations.push(format!("instance {instance} wrote after the takeover: {late:?}"));
        }
        in_flight_at_stop += late.len();
        cycles += 1;
    }
    stop.cancel();
    writes.await.unwrap();
    let injected = faults.await.unwrap();
    env.faults().clear();

    // Convergence: the leader's namespace mirrors the inputs.
    let inputs = contents(&env, "default");
    let settle = Instant::now() + Duration::from_secs(60);
    loop {
        let leader = replicas.iter().find_map(Replica::leading_instance);
        if let Some(leader) = leader
            && contents(&env, &format!("out-{leader}")) == inputs
        {
            break;
        }
        assert!(
            Instant::now() < settle,
            "seed {seed}: the leader's copies did not converge within 60 s (leader {leader:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(violations.is_empty(), "seed {seed}: {violations:?}");
    assert!(cycles >= 1, "seed {seed}: no stop/resume cycle ran");
    eprintln!(
        "leader chaos seed {seed}: {cycles} stop/resume cycles, {} instances, {injected} faults, {} inputs, \
         {in_flight_at_stop} writes already past their check when stopped",
        instances.load(Ordering::SeqCst),
        inputs.len()
    );
    for replica in replicas {
        replica.join().await;
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_leader_chaos_short() {
    for seed in envtest::chaos::seeds(&[31, 32]) {
        run_seed(seed, envtest::chaos::chaos_time(4)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long chaos run: cargo test -p kinformer-controller --test chaos_leader -- --ignored"]
async fn controller_leader_chaos_long() {
    for seed in envtest::chaos::seeds(&(300..320).collect::<Vec<_>>()) {
        run_seed(seed, envtest::chaos::chaos_time(15)).await;
    }
}
