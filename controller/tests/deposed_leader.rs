//! A deposed leader never writes (issue 28): a leader whose lease lapses by its own clock starts
//! no reconcile, its reconciles' token fires at that instant, and its event writes are refused;
//! a leader stopped with SIGSTOP past its lease and resumed sends no write after another replica
//! took over; a standby that cannot reach the API server is not ready.
//!
//! The first two tests run under paused tokio time against envtest in the same runtime: every
//! request goes over loopback TCP and is answered before the runtime idles, so the clock only
//! jumps (auto-advance) when every task waits for a timer, and an instant measured on it is
//! exact. The child-process test and the readiness test use real time with polled deadlines.

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{configmap, create_configmaps, eventually, http_get, until_leading};
use controller::{
    Action, BoxError, Context, EventRecorder, EventRecorderConfig, EventType, LeaderElectionConfig, Manager,
    ManagerError, NotLeader, ObjectKey, Reporter, Request, reconciler_fn,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams, WatchEvent, WatchParams};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE_NAME: &str = "deposed";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases/deposed";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const WAIT: Duration = Duration::from_secs(20);

/// What the paused-time controller saw: every reconcile's key and start, and the context of
/// the reconcile of `slow` (which waits for its token).
#[derive(Default)]
struct Probe {
    starts: Mutex<Vec<(String, Instant)>>,
    slow: Mutex<Option<Context<ConfigMap>>>,
}

impl Probe {
    fn started(&self, name: &str) -> bool {
        self.starts.lock().unwrap().iter().any(|(n, _)| n == name)
    }
}

fn is_write(method: &str) -> bool {
    matches!(method, "POST" | "PUT" | "PATCH" | "DELETE")
}

/// A manager leading with client-go's default timing (15 s / 10 s / 2 s: under paused time they
/// cost nothing) and one controller on ConfigMaps whose events go through `recorder` (run by the
/// test). Returns the controller's queue too.
fn paused_manager(
    client: kube::Client,
    probe: Arc<Probe>,
    recorder: EventRecorder,
) -> (Manager, controller::WorkQueue) {
    let config = LeaderElectionConfig::new("default", LEASE_NAME, "leader");
    let mut manager = Manager::builder(client)
        .no_http_servers()
        .handle_signals(false)
        .leader_election(config)
        .build()
        .unwrap();
    let reconciler = reconciler_fn(move |req: Request, ctx: Context<ConfigMap>| {
        let probe = probe.clone();
        async move {
            probe.starts.lock().unwrap().push((req.name.clone(), Instant::now()));
            if req.name == "slow" {
                if let Some(cm) = ctx.get(&req).expect("decodes") {
                    ctx.recorder()
                        .publish(&*cm, EventType::Normal, "Slow", "Reconcile", "a slow reconcile");
                }
                *probe.slow.lock().unwrap() = Some(ctx.clone());
                ctx.cancelled().await;
                ctx.ensure_leading()?;
                unreachable!("the token fires only once this replica may no longer lead");
            }
            Ok::<_, BoxError>(Action::Done)
        }
    });
    let built = manager
        .controller("fenced")
        .recorder(recorder)
        .for_resource::<ConfigMap>()
        .workers(2)
        .build(reconciler)
        .unwrap();
    let queue = built.queue().clone();
    manager.add(built);
    (manager, queue)
}

/// The lease's validity lapses (every renewal fails): the in-flight reconcile's token fires at
/// the validity deadline exactly, the context refuses writes with `NotLeader`, an event retried
/// after the deadline is refused instead of written, no reconcile starts after it, and the
/// manager fails with `LeadershipLost`.
#[tokio::test(start_paused = true)]
async fn a_lapsed_lease_fires_the_token_at_the_deadline_and_refuses_every_write() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let probe = Arc::new(Probe::default());
    // Its failed writes are retried 15–25 s later: after the 10 s renew deadline.
    let recorder = EventRecorder::with_config(
        client.clone(),
        Reporter::new("kinformer.dev/fenced", "leader"),
        EventRecorderConfig::default().retry_delay(Duration::from_secs(20)),
    );
    let sink_stop = CancellationToken::new();
    let sink = tokio::spawn({
        let (recorder, stop) = (recorder.clone(), sink_stop.clone());
        async move { recorder.run(stop).await }
    });
    let (manager, _queue) = paused_manager(client.clone(), probe.clone(), recorder.clone());
    let status = manager.status();
    let run = tokio::spawn(manager.run(CancellationToken::new()));
    until_leading(WAIT, &status).await;

    // The slow reconcile's event fails once (500, not retried by kube's client): its retry is
    // due after the deadline.
    env.faults().fail_next(EVENTS_PATH, 500, 1, 0);
    create_configmaps(&client, &["slow"]).await;
    eventually(WAIT, "the slow reconcile is in flight", || {
        let ok = probe.slow.lock().unwrap().is_some();
        async move { ok }
    })
    .await;
    let ctx = probe.slow.lock().unwrap().clone().unwrap();
    let elector = ctx.leadership().elector().expect("under leader election").clone();
    assert!(ctx.is_leading() && ctx.ensure_leading().is_ok());
    eventually(WAIT, "the event's first write failed", || {
        let failed = env
            .requests()
            .iter()
            .any(|r| r.path == EVENTS_PATH && r.method == "POST");
        async move { failed }
    })
    .await;

    // Every renewal fails from now on. Once one request of a renewal has failed, no earlier
    // attempt is in flight (attempts are serialized) and the deadline cannot move any more.
    let before = env.requests().len();
    env.faults().fail_next(LEASE_PATH, 500, envtest::MAX_FAULT_COUNT, 0);
    eventually(WAIT, "a renewal failed", || {
        let failed = env.requests()[before..].iter().any(|r| r.path == LEASE_PATH);
        async move { failed }
    })
    .await;
    let deadline = elector.leading_until().expect("still in its term");
    assert!(ctx.is_leading(), "valid until the deadline");

    ctx.token().cancelled().await;
    let fired = Instant::now();
    // tokio's timers have millisecond resolution, rounded up.
    assert!(
        fired >= deadline && fired <= deadline + Duration::from_millis(1),
        "the token fired {:?} from the deadline",
        fired
            .checked_duration_since(deadline)
            .map_or_else(|| format!("-{:?}", deadline - fired), |late| format!("{late:?}"))
    );
    assert!(!ctx.is_leading());
    assert!(matches!(ctx.ensure_leading(), Err(NotLeader::LeaseLapsed { .. })));
    assert!(!elector.is_leader());

    // A framework write after the deadline: refused when published...
    let refused = recorder.stats().refused;
    recorder.publish(
        &configmap("default", "slow", "1"),
        EventType::Warning,
        "Late",
        "Reconcile",
        "published after the deadline",
    );
    assert_eq!(recorder.stats().refused, refused + 1);

    let result = tokio::time::timeout(WAIT, run)
        .await
        .expect("the manager stopped")
        .unwrap();
    assert!(matches!(result, Err(ManagerError::LeadershipLost(_))), "{result:?}");
    let starts = probe.starts.lock().unwrap().clone();
    assert!(
        starts.iter().all(|(_, at)| *at < deadline),
        "a reconcile started after the deadline: {starts:?}"
    );

    // ...and the retry of the event that failed before the deadline is refused, not sent.
    let events_before = env.requests().iter().filter(|r| r.path == EVENTS_PATH).count();
    eventually(Duration::from_secs(60), "the event's retry is refused", || {
        let refused_retry = recorder.stats().refused >= refused + 2;
        async move { refused_retry }
    })
    .await;
    let events_after = env.requests().iter().filter(|r| r.path == EVENTS_PATH).count();
    assert_eq!(events_before, events_after, "no event write after the deadline");
    assert_eq!(recorder.stats().written, 0);
    assert!(env.objects_of(EVENTS_PATH).unwrap().is_empty());
    sink_stop.cancel();
    sink.await.unwrap();
    env.shutdown().await;
}

/// What a resumed process sees: its clock has jumped past the validity deadline and a worker
/// takes a key before any timer (renewal, watchdog) has run. The key is not reconciled.
#[tokio::test(start_paused = true)]
async fn a_key_taken_after_the_clock_jumped_past_the_deadline_is_not_reconciled() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let probe = Arc::new(Probe::default());
    let recorder = EventRecorder::new(client.clone(), Reporter::new("kinformer.dev/fenced", "leader"));
    let (manager, queue) = paused_manager(client.clone(), probe.clone(), recorder);
    let status = manager.status();
    let run = tokio::spawn(manager.run(CancellationToken::new()));
    until_leading(WAIT, &status).await;
    create_configmaps(&client, &["before"]).await;
    eventually(WAIT, "reconciled while leading", || {
        let ok = probe.started("before");
        async move { ok }
    })
    .await;

    // The worker is woken by the key; the clock jumps a whole lease duration before it runs.
    queue.add(ObjectKey::namespaced("default", "jumped"));
    tokio::time::advance(Duration::from_secs(15)).await;

    let result = tokio::time::timeout(WAIT, run)
        .await
        .expect("the manager stopped")
        .unwrap();
    assert!(matches!(result, Err(ManagerError::LeadershipLost(_))), "{result:?}");
    assert!(!probe.started("jumped"), "a key was reconciled after the deadline");
    env.shutdown().await;
}

/// A standby whose every request fails turns `/readyz` 500 within its observation bound (it
/// said "ok: standby" forever before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_cannot_reach_the_api_server_is_not_ready() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let leader = replica(env.client(), "leader", Some(local()));
    let standby = replica(env.client(), "standby", Some(local()));
    let (leader_status, standby_status) = (leader.status(), standby.status());
    let addr = standby.health_probe_addr().unwrap();
    let stop = CancellationToken::new();
    let leader_run = tokio::spawn(leader.run(stop.clone()));
    eventually(WAIT, "the leader leads", || {
        let ok = leader_status.is_leader();
        async move { ok }
    })
    .await;
    let standby_run = tokio::spawn(standby.run(stop.clone()));
    eventually(WAIT, "the standby is ready", || async move {
        http_get(addr, "/readyz").await == (200, "ok".into())
    })
    .await;
    assert!(!standby_status.is_leader());

    // The API server fails every request (500: kube's client does not retry it).
    env.faults().fail_next("/", 500, envtest::MAX_FAULT_COUNT, 0);
    let failing = Instant::now();
    // Its last successful read was before `failing`: 500 at most one bound later.
    let bound = ELECTION.0.max(ELECTION.2.mul_f64(2.2) + ELECTION.1);
    let slack = Duration::from_millis(700);
    eventually(
        bound + slack + Duration::from_secs(5),
        "the standby reports 500",
        || async move { http_get(addr, "/readyz").await.0 == 500 },
    )
    .await;
    let took = failing.elapsed();
    let (code, body) = http_get(addr, "/readyz/leaderElection").await;
    println!("standby not ready {took:?} after the API server began failing (bound {bound:?}): {body}");
    assert_eq!(code, 500);
    assert!(body.contains("cannot reach the API server"), "{body}");
    assert!(
        http_get(addr, "/readyz")
            .await
            .1
            .contains("[-]leaderElection failed: reason withheld"),
        "the root path lists the failing check"
    );
    assert!(took <= bound + slack, "{took:?} > {bound:?} + {slack:?}");

    env.faults().clear();
    stop.cancel();
    let _ = leader_run.await.unwrap();
    let _ = standby_run.await.unwrap();
    env.shutdown().await;
}

fn local() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 0))
}

// ---------------------------------------------------------------------------------------------
// A real stop and resume of a child process.

/// Set to envtest's URL in the child's environment: the child then acts as a replica.
const CHILD_URL_ENV: &str = "KINFORMER_DEPOSED_CHILD_URL";
/// Prefix of the lines the child prints for the parent.
const LINE: &str = "deposed-child:";
/// The replicas' timing: lease 2 s, renew deadline 1.5 s, retry 0.5 s.
const ELECTION: (Duration, Duration, Duration) = (
    Duration::from_secs(2),
    Duration::from_millis(1500),
    Duration::from_millis(500),
);

/// A replica: leader election on the shared lease as `identity`; a controller that copies every
/// ConfigMap of `default` into `out-<identity>` (creating it) with an Event about the copy, so
/// the path of every write names the replica that sent it. `default/hold` waits for
/// `default/gate` to be created (on a watch of its own) before it writes. Every write is guarded by
/// `ctx.ensure_leading()`.
fn replica(client: kube::Client, identity: &str, metrics: Option<std::net::SocketAddr>) -> Manager {
    let config = LeaderElectionConfig::new("default", LEASE_NAME, identity)
        .lease_duration(ELECTION.0)
        .renew_deadline(ELECTION.1)
        .retry_period(ELECTION.2);
    let builder = Manager::builder(client).handle_signals(false).leader_election(config);
    let builder = match metrics {
        Some(addr) => builder.no_metrics_server().health_probe_addr(addr),
        None => builder.no_http_servers(),
    };
    let mut manager = builder.build().unwrap();
    let out = format!("out-{identity}");
    let reconciler = reconciler_fn(move |req: Request, ctx: Context<ConfigMap>| {
        let out = out.clone();
        async move {
            if req.namespace.as_deref() != Some("default")
                || req.name == "gate"
                || ctx.get(&req).expect("decodes").is_none()
            {
                return Ok::<_, BoxError>(Action::Done);
            }
            if req.name == "hold" {
                // Waits on I/O, not on a timer: when the process resumes, the gate's watch event
                // is already in the socket and wakes this reconcile in the same driver turn as
                // the expired timers of the lease.
                let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), "default");
                let params = WatchParams::default().fields("metadata.name=gate").timeout(290);
                let mut gate = api.watch(&params, "0").await?.boxed();
                println!("{LINE} HOLDING {req}");
                while let Some(event) = gate.try_next().await? {
                    if let WatchEvent::Added(_) = event {
                        break;
                    }
                }
            }
            ctx.ensure_leading()?;
            let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), &out);
            match api
                .create(&PostParams::default(), &configmap(&out, &req.name, "1"))
                .await
            {
                Ok(copy) => {
                    ctx.recorder().publish(
                        &copy,
                        EventType::Normal,
                        "Copied",
                        "Reconcile",
                        &format!("copied {req}"),
                    );
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            println!("{LINE} RECONCILED {req}");
            Ok(Action::Done)
        }
    });
    let built = manager
        .controller(format!("copier-{identity}"))
        .for_resource::<ConfigMap>()
        .build(reconciler)
        .unwrap();
    manager.add(built);
    manager
}

/// The child replica of the test below; does nothing unless spawned by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of a_stopped_and_resumed_leader_sends_no_write_after_another_took_over"]
async fn deposed_replica_child() {
    let Ok(url) = std::env::var(CHILD_URL_ENV) else {
        return;
    };
    let config = kube::Config::new(url.parse().expect("envtest URL"));
    let manager = replica(kube::Client::try_from(config).expect("client"), "child", None);
    let status = manager.status();
    let run = tokio::spawn(manager.run(CancellationToken::new()));
    eventually(WAIT, "the child leads", || {
        let ok = status.is_leader();
        async move { ok }
    })
    .await;
    println!("{LINE} LEADING");
    let result = run.await.expect("manager task");
    println!("{LINE} EXITED {result:?}");
}

/// The child's lines, read as they come.
#[derive(Clone, Default)]
struct ChildLines(Arc<Mutex<Vec<String>>>);

impl ChildLines {
    async fn wait_for(&self, what: &str) {
        eventually(WAIT, &format!("the child to print {what:?}"), || {
            let seen = self.0.lock().unwrap().iter().any(|line| line.contains(what));
            async move { seen }
        })
        .await;
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

fn names_in(env: &envtest::Server, namespace: &str) -> Vec<String> {
    let mut names: Vec<String> = env
        .objects_of(&format!("/api/v1/namespaces/{namespace}/configmaps"))
        .unwrap()
        .into_iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .filter(|name| name != "kube-root-ca.crt")
        .collect();
    names.sort();
    names
}

/// A leader in a child process, stopped with SIGSTOP in the middle of a reconcile and resumed
/// after another replica took over and wrote, sends no write afterwards: none of its paths (its
/// copies, its Events) appears in envtest's request log after the takeover, and it exits with
/// `LeadershipLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_and_resumed_leader_sends_no_write_after_another_took_over() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    for ns in ["out-child", "out-main"] {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }
    create_configmaps(&client, &["a", "b"]).await;
    let inputs: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "deposed_replica_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_URL_ENV, env.base_url())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the child replica");
    let pid = child.id().expect("child pid");
    let lines = ChildLines::default();
    let reader = tokio::spawn({
        let lines = lines.clone();
        let stdout = child.stdout.take().expect("child stdout");
        async move {
            let mut stdout = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = stdout.next_line().await {
                // libtest's "test deposed_replica_child ... " may precede the first line.
                if let Some(at) = line.find(LINE) {
                    lines.0.lock().unwrap().push(line[at..].to_owned());
                }
            }
        }
    });
    lines.wait_for("LEADING").await;
    eventually(WAIT, "the child copied a and b", || {
        let names = names_in(&env, "out-child");
        async move { names == ["a", "b"] }
    })
    .await;
    // A reconcile in flight at the stop: it waits for the gate, then would write.
    inputs
        .create(&PostParams::default(), &configmap("default", "hold", "1"))
        .await
        .unwrap();
    lines.wait_for("HOLDING default/hold").await;

    let main = replica(client.clone(), "main", None);
    let main_status = main.status();
    let main_run = tokio::spawn(main.run(CancellationToken::new()));
    eventually(WAIT, "main stands by, seeing the child lead", || {
        let ok = main_status.leader().as_deref() == Some("child") && main_status.is_ready();
        async move { ok }
    })
    .await;

    signal(pid, "-STOP");
    // While the child is stopped: the gate opens and a new input arrives (its watch will
    // deliver both when it resumes).
    inputs
        .create(&PostParams::default(), &configmap("default", "gate", "1"))
        .await
        .unwrap();
    inputs
        .create(&PostParams::default(), &configmap("default", "c", "1"))
        .await
        .unwrap();
    eventually(WAIT, "main takes over", || {
        let ok = main_status.is_leader();
        async move { ok }
    })
    .await;
    // From here on every write under out-child would be the resumed child's.
    env.faults().clear_requests();
    eventually(WAIT, "main copied every input", || {
        let names = names_in(&env, "out-main");
        async move { names == ["a", "b", "c", "hold"] }
    })
    .await;

    signal(pid, "-CONT");
    let exit = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the resumed child exits")
        .expect("child status");
    let _ = reader.await;
    let printed = lines.all();
    println!("child exited with {exit}; printed {printed:?}");
    assert!(
        printed.iter().any(|l| l.contains("EXITED Err(LeadershipLost")),
        "the child's manager ends with LeadershipLost: {printed:?}"
    );
    let late: Vec<_> = env
        .requests()
        .into_iter()
        .filter(|r| is_write(&r.method) && r.path.contains("/namespaces/out-child/"))
        .collect();
    assert!(late.is_empty(), "the resumed child wrote after the takeover: {late:?}");
    assert_eq!(names_in(&env, "out-child"), ["a", "b"], "no copy by the deposed child");
    assert!(main_status.is_leader(), "main still leads");
    main_run.abort();
    env.shutdown().await;
}
