//! Leader election over envtest (real HTTP, the real `kube::Client`): one leader among racing
//! candidates, takeover after a crash (lease expiry) and after a release (next retry), loss of
//! leadership when renewals fail or another writer takes the Lease, and config validation.
//!
//! Durations are short and real (an HTTP server cannot run under paused time): lease 2 s,
//! renew deadline 1.5 s, retry period 250 ms. Every bound asserted is derived in the test from
//! these (client-go's jitter makes an acquire attempt `retry × [1, 2.2)` apart) plus `SLACK`
//! for scheduling and HTTP on a busy 2-core machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controller::leader_election::JITTER_FACTOR;
use controller::{LeaderElectionConfig, LeaderElectionError, LeaderElector};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "default";
const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(1500);
const RETRY: Duration = Duration::from_millis(250);
/// Scheduling and HTTP latency allowance for every upper bound.
const SLACK: Duration = Duration::from_millis(500);
/// For waits that are not measured.
const WAIT: Duration = Duration::from_secs(10);

fn config(lease: &str, identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig::new(NAMESPACE, lease, identity)
        .lease_duration(LEASE)
        .renew_deadline(RENEW)
        .retry_period(RETRY)
}

fn elector(env: &envtest::Server, lease: &str, identity: &str) -> LeaderElector {
    LeaderElector::new(env.client(), config(lease, identity)).expect("valid config")
}

/// The longest pause between two acquire attempts.
fn max_acquire_pause() -> Duration {
    RETRY.mul_f64(1.0 + JITTER_FACTOR)
}

/// Runs `acquire` then `renew`, as the Manager does: `Ok(true)` after leading and stepping down
/// on shutdown, `Ok(false)` if shutdown came first.
fn run(elector: &LeaderElector, shutdown: &CancellationToken) -> JoinHandle<Result<bool, LeaderElectionError>> {
    let (elector, shutdown) = (elector.clone(), shutdown.clone());
    tokio::spawn(async move {
        if !elector.acquire(&shutdown).await {
            return Ok(false);
        }
        elector.renew(&shutdown).await.map(|()| true)
    })
}

/// Spawns `renew` for an elector that already acquired.
fn renewing(elector: &LeaderElector, shutdown: &CancellationToken) -> JoinHandle<Result<(), LeaderElectionError>> {
    let (elector, shutdown) = (elector.clone(), shutdown.clone());
    tokio::spawn(async move { elector.renew(&shutdown).await })
}

/// Acquires with `elector`, starts its renewals, and lets two renewal rounds pass.
async fn acquired_and_renewing(
    elector: &LeaderElector,
    shutdown: &CancellationToken,
) -> JoinHandle<Result<(), LeaderElectionError>> {
    assert!(elector.acquire(shutdown).await);
    let task = renewing(elector, shutdown);
    tokio::time::sleep(RETRY * 2).await;
    task
}

/// Polls `cond` every 5 ms; returns when it first held. Fails after `timeout`.
async fn until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Instant {
    let start = Instant::now();
    loop {
        if cond() {
            return Instant::now();
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or("")
}

async fn lease_spec(api: &Api<Lease>, name: &str) -> LeaseSpec {
    api.get(name).await.expect("get lease").spec.expect("lease spec")
}

/// Every version of one Lease, from a watch opened before the test acts.
struct LeaseHistory {
    versions: Arc<Mutex<Vec<LeaseSpec>>>,
    task: JoinHandle<()>,
}

impl LeaseHistory {
    async fn watch(api: &Api<Lease>, name: &str) -> Self {
        let rv = api
            .list(&ListParams::default())
            .await
            .expect("list leases")
            .metadata
            .resource_version
            .expect("list resourceVersion");
        let params = WatchParams::default().fields(&format!("metadata.name={name}"));
        let stream = api.watch(&params, &rv).await.expect("watch leases");
        let versions: Arc<Mutex<Vec<LeaseSpec>>> = Arc::default();
        let task = tokio::spawn({
            let versions = versions.clone();
            async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    match event.expect("watch event") {
                        WatchEvent::Added(lease) | WatchEvent::Modified(lease) => {
                            versions.lock().unwrap().push(lease.spec.unwrap_or_default());
                        }
                        WatchEvent::Error(e) => panic!("watch error: {e:?}"),
                        WatchEvent::Deleted(_) | WatchEvent::Bookmark(_) => {}
                    }
                }
            }
        });
        LeaseHistory { versions, task }
    }

    fn versions(&self) -> Vec<LeaseSpec> {
        self.versions.lock().unwrap().clone()
    }
}

impl Drop for LeaseHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Samples `is_leader()` of every elector every 10 ms until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<SampleStats>,
}

#[derive(Debug, Default)]
struct SampleStats {
    samples: usize,
    /// Samples in which more than one elector said it leads.
    overlaps: usize,
    /// Per elector, the samples in which it led.
    leading: Vec<usize>,
}

impl Sampler {
    fn start(electors: &[LeaderElector]) -> Self {
        let electors = electors.to_vec();
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut stats = SampleStats {
                    leading: vec![0; electors.len()],
                    ..SampleStats::default()
                };
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let leading: Vec<bool> = electors.iter().map(LeaderElector::is_leader).collect();
                    stats.samples += 1;
                    stats.overlaps += usize::from(leading.iter().filter(|l| **l).count() > 1);
                    for (count, led) in stats.leading.iter_mut().zip(&leading) {
                        *count += usize::from(*led);
                    }
                }
                stats
            }
        });
        Sampler { stop, task }
    }

    async fn finish(self) -> SampleStats {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("sampler")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_candidates_racing_for_an_absent_lease_elect_exactly_one() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<Lease> = Api::namespaced(env.client(), NAMESPACE);
    let history = LeaseHistory::watch(&api, "race").await;
    let (a, b) = (elector(&env, "race", "a"), elector(&env, "race", "b"));
    let sampler = Sampler::start(&[a.clone(), b.clone()]);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let (task_a, task_b) = (run(&a, &shutdown), run(&b, &shutdown));

    let elected = until(WAIT, "a leader", || a.is_leader() || b.is_leader()).await;
    let (winner, loser, winner_task, loser_task) = if a.is_leader() {
        (&a, &b, task_a, task_b)
    } else {
        (&b, &a, task_b, task_a)
    };
    println!("{} elected after {:?}", winner.identity(), elected - started);
    // Both found no Lease, so both tried to create it: one got 409 AlreadyExists.
    assert!(elected - started < SLACK, "the first attempt elects a leader");

    // The loser must stay standby while the winner renews, for well over one lease duration
    // (a loser that ignored renewals would take over after LEASE).
    let window = until(WAIT, "the loser to observe the winner", || {
        loser.leader().as_deref() == Some(winner.identity())
    })
    .await;
    while window.elapsed() < LEASE * 5 / 2 {
        assert!(winner.is_leader(), "the winner keeps leading while it renews");
        assert!(!loser.is_leader(), "the loser stays standby");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    shutdown.cancel();
    assert!(
        winner_task.await.unwrap().expect("the winner steps down cleanly"),
        "the winner led"
    );
    assert!(
        !loser_task.await.unwrap().expect("the loser stops cleanly"),
        "the loser never led"
    );
    let stats = sampler.finish().await;
    println!("is_leader samples: {stats:?}");
    assert_eq!(stats.overlaps, 0, "both said they lead at once: {stats:?}");
    assert!(stats.samples > 200, "{stats:?}");
    let loser_index = usize::from(loser.identity() == "b");
    assert_eq!(stats.leading[loser_index], 0, "{stats:?}");

    // Every version of the Lease names the winner, until its release empties it.
    until(WAIT, "the release in the watch", || {
        history.versions().last().is_some_and(|spec| holder(spec).is_empty())
    })
    .await;
    let versions = history.versions();
    let (released, held) = versions.split_last().expect("versions");
    assert!(
        held.iter().all(|spec| holder(spec) == winner.identity()),
        "{versions:#?}"
    );
    assert!(
        versions.iter().all(|spec| spec.lease_transitions == Some(0)),
        "{versions:#?}"
    );
    assert!(
        held.len() >= 8,
        "renewed every retry period for 5 s: {} versions",
        held.len()
    );
    assert!(
        held.windows(2)
            .all(|w| w[0].renew_time < w[1].renew_time && w[0].acquire_time == w[1].acquire_time)
    );
    assert_eq!(released.lease_duration_seconds, Some(1));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_never_overlap_and_one_holds_the_lease() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<Lease> = Api::namespaced(env.client(), NAMESPACE);
    let history = LeaseHistory::watch(&api, "crowd").await;
    let electors: Vec<_> = (0..5)
        .map(|i| elector(&env, "crowd", &format!("candidate-{i}")))
        .collect();
    let sampler = Sampler::start(&electors);
    let shutdown = CancellationToken::new();
    let tasks: Vec<_> = electors.iter().map(|e| run(e, &shutdown)).collect();
    until(WAIT, "a leader", || electors.iter().any(LeaderElector::is_leader)).await;
    tokio::time::sleep(LEASE * 3 / 2).await;
    let leaders: Vec<_> = electors
        .iter()
        .filter(|e| e.is_leader())
        .map(LeaderElector::identity)
        .collect();
    assert_eq!(leaders.len(), 1, "{leaders:?}");
    for e in &electors {
        assert_eq!(
            e.leader().as_deref(),
            Some(leaders[0]),
            "{} observed the leader",
            e.identity()
        );
    }
    shutdown.cancel();
    let mut led = 0;
    for task in tasks {
        led += usize::from(task.await.unwrap().expect("clean stop"));
    }
    assert_eq!(led, 1);
    let stats = sampler.finish().await;
    assert_eq!(stats.overlaps, 0, "{stats:?}");
    assert_eq!(stats.leading.iter().filter(|n| **n > 0).count(), 1, "{stats:?}");
    let holders: std::collections::BTreeSet<String> = history
        .versions()
        .iter()
        .map(|s| holder(s).to_owned())
        .filter(|h| !h.is_empty())
        .collect();
    assert_eq!(holders.len(), 1, "{holders:?}");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_once_its_lease_expires() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<Lease> = Api::namespaced(env.client(), NAMESPACE);
    let (a, b) = (elector(&env, "crash", "a"), elector(&env, "crash", "b"));
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    assert!(a.acquire(&stop_a).await);
    let task_a = renewing(&a, &stop_a);
    let before = lease_spec(&api, "crash").await;
    let task_b = run(&b, &stop_b);
    until(WAIT, "b to observe a", || b.leader().as_deref() == Some("a")).await;
    // Let a renew a few times, so the crash is mid-term.
    tokio::time::sleep(RETRY * 3).await;

    task_a.abort(); // a crash: no release
    let crashed = Instant::now();
    assert!(task_a.await.unwrap_err().is_cancelled());
    // b takes over at its first attempt after it has seen the record unchanged for LEASE.
    // It saw a's last renewal (sent at most RETRY + latency before the crash) within one acquire
    // pause of it, and the takeover attempt comes at most one more pause after the expiry.
    let bound = LEASE + max_acquire_pause() * 2 + SLACK;
    let took = until(bound * 2, "b to take over", || b.is_leader()).await - crashed;
    println!("b took over {took:?} after the crash (bound {bound:?})");
    assert!(took <= bound, "{took:?} > {bound:?}");
    assert!(
        took >= LEASE - RETRY - Duration::from_millis(100),
        "b waited out a's lease: {took:?}"
    );
    // a's own view expired by itself, no later than b could take over.
    assert!(!a.is_leader(), "a crashed elector's is_leader() expires with its lease");

    let after = lease_spec(&api, "crash").await;
    assert_eq!(holder(&after), "b");
    assert_eq!(after.lease_transitions, before.lease_transitions.map(|t| t + 1));
    assert!(after.acquire_time > before.acquire_time, "{before:?} -> {after:?}");
    assert_eq!(after.lease_duration_seconds, Some(2));
    stop_b.cancel();
    assert!(task_b.await.unwrap().unwrap());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_over_within_one_acquire_pause() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<Lease> = Api::namespaced(env.client(), NAMESPACE);
    let history = LeaseHistory::watch(&api, "handover").await;
    let (a, b) = (elector(&env, "handover", "a"), elector(&env, "handover", "b"));
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    assert!(a.acquire(&stop_a).await);
    let task_a = renewing(&a, &stop_a);
    let task_b = run(&b, &stop_b);
    until(WAIT, "b to observe a", || b.leader().as_deref() == Some("a")).await;

    stop_a.cancel();
    task_a.await.unwrap().expect("a steps down cleanly");
    let released = Instant::now();
    assert!(!a.is_leader());
    let bound = max_acquire_pause() + SLACK;
    let took = until(bound * 2, "b to take over", || b.is_leader()).await - released;
    println!("b took over {took:?} after the release (bound {bound:?})");
    assert!(took <= bound, "{took:?} > {bound:?}");

    // a wrote client-go's release record; b then took the free lease as a new holder.
    let versions = history.versions();
    let release = versions
        .iter()
        .position(|s| holder(s).is_empty())
        .expect("a release in the history");
    let (held_by_a, rest) = (&versions[release - 1], &versions[release..]);
    assert_eq!(holder(held_by_a), "a");
    assert_eq!(rest[0].lease_duration_seconds, Some(1));
    assert_eq!(rest[0].lease_transitions, held_by_a.lease_transitions);
    let taken = rest.iter().find(|s| holder(s) == "b").expect("b in the history");
    assert_eq!(taken.lease_transitions, held_by_a.lease_transitions.map(|t| t + 1));
    assert!(taken.acquire_time > held_by_a.acquire_time);
    assert_eq!(a.leader().as_deref(), None, "a observed its own release");
    stop_b.cancel();
    assert!(task_b.await.unwrap().unwrap());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_without_release_leaves_the_lease_to_expire() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<Lease> = Api::namespaced(env.client(), NAMESPACE);
    let a = LeaderElector::new(env.client(), config("kept", "a").release_on_cancel(false)).unwrap();
    let stop = CancellationToken::new();
    let task = acquired_and_renewing(&a, &stop).await;
    stop.cancel();
    task.await.unwrap().expect("clean stop");
    assert!(!a.is_leader(), "stopped leading at once");
    let spec = lease_spec(&api, "kept").await;
    assert_eq!((holder(&spec), spec.lease_duration_seconds), ("a", Some(2)));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_renewals_lose_leadership_after_the_renew_deadline() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let a = elector(&env, "flaky", "a");
    let stop = CancellationToken::new();
    assert!(a.acquire(&stop).await);
    let task = renewing(&a, &stop);
    // Mid-way between two renewals, so the failing round starts up to RETRY after the faults.
    tokio::time::sleep(RETRY * 5 / 2).await;
    assert!(a.is_leader());

    let lease_path = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/flaky");
    env.faults().fail_next(&lease_path, 500, 100_000, 0);
    let failing = Instant::now();
    // The leader gives up RENEW after its last successful renewal was sent: that was before
    // the faults, and at most RETRY (plus one request) before them.
    let bound = RENEW + SLACK;
    let result = tokio::time::timeout(bound * 2, task)
        .await
        .expect("renew gave up")
        .unwrap();
    let took = failing.elapsed();
    env.faults().clear();
    println!("renew gave up {took:?} after the faults began (bound {bound:?})");
    match &result {
        Err(LeaderElectionError::LeadershipLost {
            holder: None,
            last_error: Some(kube::Error::Api(status)),
            ..
        }) if status.code == 500 => {}
        other => panic!("expected LeadershipLost after 500s, got {other:?}"),
    }
    assert!(!a.is_leader());
    assert!(took <= bound, "{took:?} > {bound:?}");
    assert!(
        took >= RENEW - RETRY - Duration::from_millis(100),
        "retried until the deadline: {took:?}"
    );
    // One attempt every RETRY until the deadline, each a write of the cached Lease then a read:
    // about RENEW / RETRY reads (+ 1 before the faults: acquire's).
    let attempts = env
        .requests()
        .iter()
        .filter(|r| r.path == lease_path && r.method == "GET")
        .count();
    assert!((3..=12).contains(&attempts), "{attempts} reads");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writer_taking_the_lease_ends_leadership_at_the_next_renewal() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<Lease> = Api::namespaced(env.client(), NAMESPACE);
    let a = elector(&env, "stolen", "a");
    let stop = CancellationToken::new();
    let task = acquired_and_renewing(&a, &stop).await;

    let taken = loop {
        let mut lease = api.get("stolen").await.unwrap();
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("intruder".into());
        }
        match api.replace("stolen", &PostParams::default(), &lease).await {
            Ok(_) => break Instant::now(),
            Err(kube::Error::Api(s)) if s.code == 409 => continue, // a renewed in between
            Err(e) => panic!("{e}"),
        }
    };
    let bound = RETRY + SLACK;
    let result = tokio::time::timeout(RENEW + SLACK, task)
        .await
        .expect("renew returned")
        .unwrap();
    let took = taken.elapsed();
    println!("renew saw the intruder {took:?} after the write (bound {bound:?})");
    match &result {
        Err(LeaderElectionError::LeadershipLost { holder: Some(h), .. }) if h == "intruder" => {}
        other => panic!("expected LeadershipLost to the intruder, got {other:?}"),
    }
    assert!(took <= bound, "{took:?} > {bound:?}");
    assert!(!a.is_leader());
    assert_eq!(a.leader().as_deref(), Some("intruder"));
    assert_eq!(
        holder(&lease_spec(&api, "stolen").await),
        "intruder",
        "a did not overwrite it"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_stops_when_shutdown_fires_and_renew_needs_the_lease() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let (a, b) = (elector(&env, "standby", "a"), elector(&env, "standby", "b"));
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    assert!(a.acquire(&stop_a).await);
    let task_a = renewing(&a, &stop_a);
    let task_b = run(&b, &stop_b);
    until(WAIT, "b to observe a", || b.leader().as_deref() == Some("a")).await;
    stop_b.cancel();
    let cancelled = Instant::now();
    assert!(!task_b.await.unwrap().unwrap(), "b never led");
    assert!(
        cancelled.elapsed() < Duration::from_millis(100),
        "acquire returns at once on shutdown"
    );
    assert!(matches!(
        b.renew(&stop_b).await,
        Err(LeaderElectionError::NotLeading { .. })
    ));
    assert!(a.is_leader());
    stop_a.cancel();
    task_a.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn invalid_configs_are_rejected_with_client_go_rules() {
    // No request is made: any client will do.
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let defaults = LeaderElectionConfig::new("ns", "lease", "me");
    assert_eq!(
        (
            defaults.lease_duration,
            defaults.renew_deadline,
            defaults.retry_period,
            defaults.release_on_cancel
        ),
        (
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2),
            true
        )
    );
    let secs = Duration::from_secs;
    let ms = Duration::from_millis;
    let cases = [
        (
            defaults.clone().lease_duration(secs(10)),
            "leaseDuration must be greater than renewDeadline",
        ),
        (
            defaults.clone().lease_duration(secs(9)),
            "leaseDuration must be greater than renewDeadline",
        ),
        (
            defaults.clone().renew_deadline(ms(2400)),
            "renewDeadline must be greater than retryPeriod*JitterFactor",
        ),
        (
            defaults.clone().retry_period(Duration::ZERO).renew_deadline(ms(1)),
            "retryPeriod must be greater than zero",
        ),
        (LeaderElectionConfig::new("ns", "lease", ""), "identity is empty"),
        (LeaderElectionConfig::new("", "lease", "me"), "must not be empty"),
        (LeaderElectionConfig::new("ns", "", "me"), "must not be empty"),
    ];
    for (config, message) in cases {
        match LeaderElector::new(client.clone(), config.clone()) {
            Err(LeaderElectionError::InvalidConfig(m)) => assert!(m.contains(message), "{config:?}: {m}"),
            other => panic!("{config:?} accepted: {other:?}"),
        }
    }
    for config in [
        defaults.clone(),
        defaults.clone().renew_deadline(ms(2401)),
        config("lease", "me"),
    ] {
        let elector = LeaderElector::new(client.clone(), config).expect("valid");
        assert!(!elector.is_leader());
        assert_eq!(elector.leader(), None);
    }
    let elector = LeaderElector::new(client, defaults).unwrap();
    assert_eq!((elector.identity(), elector.lease_name()), ("me", "lease"));
}

/// The module's doc example, kept here too so `cargo test --test leader_election` runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_doc_example() -> Result<(), Box<dyn std::error::Error>> {
    let env = envtest::Server::start(envtest::Config::default()).await?;
    let config = LeaderElectionConfig::new("default", "my-controller", "pod-a")
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_millis(1500))
        .retry_period(Duration::from_millis(200));
    let elector = LeaderElector::new(env.client(), config)?;
    let shutdown = CancellationToken::new();
    let acquired = elector.acquire(&shutdown).await;
    if acquired {
        let renewing = tokio::spawn({
            let (elector, shutdown) = (elector.clone(), shutdown.clone());
            async move { elector.renew(&shutdown).await }
        });
        assert!(elector.is_leader());
        shutdown.cancel();
        renewing.await??;
    }
    assert!(acquired && !elector.is_leader());
    env.shutdown().await;
    Ok(())
}

/// A clean shutdown leaves the Lease released even when the cached Lease is stale (another
/// write changed its resourceVersion, as a renewal abandoned at cancel time can) and the
/// first release attempts fail: the release reads the Lease first and retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_reads_the_lease_first_and_retries_after_a_conflict() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<Lease> = Api::namespaced(env.client(), NAMESPACE);
    let a = elector(&env, "stale", "a");
    let stop = CancellationToken::new();
    let task = acquired_and_renewing(&a, &stop).await;
    let before = lease_spec(&api, "stale").await;
    // A write the elector did not make: its cached resourceVersion is stale now, so a release
    // conditional on it would get 409 Conflict and leave the lease held.
    let mut lease = api.get("stale").await.unwrap();
    lease
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("touched".into(), "yes".into());
    loop {
        match api.replace("stale", &PostParams::default(), &lease).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                lease = api.get("stale").await.unwrap(); // a renewed in between
                lease
                    .metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert("touched".into(), "yes".into());
            }
            Err(e) => panic!("{e}"),
        }
    }
    // And the first two release requests fail.
    let lease_path = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/stale");
    env.faults().fail_next(&lease_path, 409, 2, 0);
    stop.cancel();
    task.await.unwrap().expect("clean stop");
    // A release that gave up early leaves a failure unspent; it must not fail the test's own
    // read, so that such a release fails on the holder below.
    env.faults().clear();
    let after = lease_spec(&api, "stale").await;
    assert_eq!(holder(&after), "", "released: {after:?}");
    assert_eq!(after.lease_duration_seconds, Some(1));
    assert_eq!(after.lease_transitions, before.lease_transitions, "transitions kept");
    assert_eq!(a.leader(), None);
    env.shutdown().await;
}

/// client-go's `<hostname>_<uuid>`.
#[test]
fn the_default_identity_is_hostname_underscore_uuid() {
    let identity = controller::default_identity();
    let (host, uuid) = identity.rsplit_once('_').expect("an underscore");
    assert_eq!(host, controller::hostname());
    let groups: Vec<&str> = uuid.split('-').collect();
    assert_eq!(
        groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12],
        "{uuid}"
    );
    assert!(
        uuid.chars()
            .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert!(groups[2].starts_with('4'), "version 4: {uuid}");
    assert!(
        matches!(&groups[3][..1], "8" | "9" | "a" | "b"),
        "RFC 4122 variant: {uuid}"
    );
    assert_ne!(identity, controller::default_identity(), "random per call");
    let config = LeaderElectionConfig::with_default_identity("ns", "lease");
    assert!(config.identity.starts_with(&format!("{host}_")));
}

/// The callbacks fire: new leader (ourselves), started leading with a valid term, stopped
/// leading once when the term ends; a standby sees the new leader only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_callbacks_fire_on_start_stop_and_new_leader() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let events: Arc<Mutex<Vec<String>>> = Arc::default();
    let callbacks = |who: &'static str| {
        let (e1, e2, e3) = (events.clone(), events.clone(), events.clone());
        controller::LeaderCallbacks::new()
            .on_started_leading(move |term| {
                e1.lock()
                    .unwrap()
                    .push(format!("{who}: started valid={}", term.is_valid()))
            })
            .on_stopped_leading(move || e2.lock().unwrap().push(format!("{who}: stopped")))
            .on_new_leader(move |leader| e3.lock().unwrap().push(format!("{who}: new leader {leader}")))
    };
    let a = LeaderElector::new(env.client(), config("callbacks", "a").callbacks(callbacks("a"))).unwrap();
    let b = LeaderElector::new(env.client(), config("callbacks", "b").callbacks(callbacks("b"))).unwrap();
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    assert!(a.acquire(&stop_a).await);
    let task_a = renewing(&a, &stop_a);
    let task_b = run(&b, &stop_b);
    until(WAIT, "b to observe a", || b.leader().as_deref() == Some("a")).await;
    stop_b.cancel();
    assert!(!task_b.await.unwrap().unwrap());
    stop_a.cancel();
    task_a.await.unwrap().unwrap();
    let events = events.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            "a: new leader a",
            "a: started valid=true",
            "b: new leader a",
            "a: stopped"
        ],
        "{events:?}"
    );
}

/// client-go's `HealthzAdaptor`: a leader whose renewals stop (wedged: nothing runs `renew`)
/// fails the check once `renew_deadline` plus the tolerance passed since its last renewal; a
/// standby and a replica that released pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_fails_for_a_wedged_leader() {
    envtest::logs::init_from_env(tracing::Level::ERROR);
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let tolerance = Duration::from_millis(300);
    let (a, b) = (elector(&env, "wedged", "a"), elector(&env, "wedged", "b"));
    assert!(a.check(tolerance).is_ok(), "never led");
    let stop = CancellationToken::new();
    let acquired = Instant::now();
    assert!(a.acquire(&stop).await);
    // Nobody renews: a wedged leader. b stands by.
    let task_b = run(&b, &stop);
    until(WAIT, "b to observe a", || b.leader().as_deref() == Some("a")).await;
    let failed = until(WAIT, "the check to fail", || a.check(tolerance).is_err()).await;
    let took = failed - acquired;
    assert!(took >= RENEW + tolerance, "failed early: {took:?}");
    assert!(took <= RENEW + tolerance + SLACK, "failed late: {took:?}");
    assert!(matches!(
        a.check(tolerance),
        Err(LeaderElectionError::RenewalOverdue { lease, .. }) if lease == "default/wedged"
    ));
    assert!(b.check(tolerance).is_ok(), "a standby passes");
    stop.cancel();
    let _ = task_b.await.unwrap();
    env.shutdown().await;
}
