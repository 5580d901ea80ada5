//! The sharding metrics over envtest (issue #26): `kinformer_sharding_objects`,
//! `kinformer_sharding_moves_total` by reason and `kinformer_sharding_drain_duration_seconds`,
//! read from the leader's registry and checked against what the API server holds. Several
//! Managers in one process against one API server, each with a sharded ConfigMap controller and
//! the ring's sharder (run by whichever Manager leads); and a sharder alone, against shard Leases
//! the test writes, for a drain that outlives the sharder that began it. Real HTTP, real Leases
//! and labels; short real durations (lease 2 s, renew deadline 1.5 s, retry 300 ms, membership
//! check 100 ms).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::sharding::{LEASE, NAMESPACE, RENEW, RETRY, WAIT};
use controller::sharding::{RING_LABEL, Sharder, ShardingConfig, ring};
use controller::{Action, Context, LeaderElectionConfig, ManagerStatus, Request, reconciler_fn};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const RING: &str = "cms";
/// The objects `obj-0` to `obj-<N - 1>`.
const N: usize = 120;

fn sharding(id: &str) -> ShardingConfig {
    common::sharding::shard_config(RING, id)
}

fn shard_label() -> String {
    format!("shard.kinformer.io/{RING}")
}

fn drain_label() -> String {
    format!("drain.shard.kinformer.io/{RING}")
}

/// The series of `kinformer_sharding_moves_total` for `reason`, as exposed.
fn moves_series(reason: &str) -> String {
    format!("kinformer_sharding_moves_total{{reason=\"{reason}\",ring=\"{RING}\"}}")
}

/// The series of the drain histogram's count, as exposed.
fn drains_series() -> String {
    format!("kinformer_sharding_drain_duration_seconds_count{{ring=\"{RING}\"}}")
}

/// The series of the drain histogram's sum, as exposed.
fn drain_seconds_series() -> String {
    format!("kinformer_sharding_drain_duration_seconds_sum{{ring=\"{RING}\"}}")
}

/// The series of `kinformer_sharding_objects` for `shard`, as exposed.
fn objects_series(shard: &str) -> String {
    format!("kinformer_sharding_objects{{ring=\"{RING}\",shard=\"{shard}\"}}")
}

/// A Manager (leader election on one lease shared by all) running the sharded ConfigMap
/// controller (its reconciles do nothing) and the ring's sharder.
struct Shard {
    id: String,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), controller::ManagerError>>,
    status: ManagerStatus,
    registry: prometheus::Registry,
}

impl Shard {
    fn start(env: &envtest::Server, id: &str) -> Self {
        let mut manager = common::sharding::shard_manager(env, "sharding-metrics-test", id);
        let config = sharding(id);
        let controller = manager
            .controller("configmaps")
            .sharded(config.clone())
            .for_resource::<ConfigMap>()
            .workers(2)
            .build(reconciler_fn(|_: Request, _: Context<ConfigMap>| async {
                Ok::<_, controller::BoxError>(Action::Done)
            }))
            .unwrap();
        common::sharding::add_with_sharder::<ConfigMap>(&mut manager, controller, &config);
        let (status, registry) = (manager.status(), manager.metrics().registry().clone());
        let (shutdown, task) = common::sharding::run(manager);
        Shard {
            id: id.to_owned(),
            shutdown,
            task,
            status,
            registry,
        }
    }

    /// Shuts the shard down gracefully (its shard Lease released); its Manager's run succeeds.
    async fn stop(mut self) {
        self.shutdown.cancel();
        (&mut self.task).await.unwrap().unwrap();
    }

    /// Kills the shard: its Manager's task aborted, its shard Lease left to expire.
    async fn kill(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

/// envtest (tracing initialised) with `n` ConfigMaps `obj-<i>` in the namespace.
async fn setup(n: usize) -> (envtest::Server, kube::Client) {
    let env = common::sharding::envtest_with_objects(NAMESPACE, n).await;
    let client = env.client();
    (env, client)
}

/// Each object's `(shard label, draining)` on the server.
async fn labels(client: &kube::Client) -> BTreeMap<String, (Option<String>, bool)> {
    common::sharding::labels(&Api::namespaced(client.clone(), NAMESPACE), RING).await
}

/// The objects labelled for `shard` on the server.
async fn on_shard(client: &kube::Client, shard: &str) -> Vec<String> {
    labels(client)
        .await
        .into_iter()
        .filter(|(_, (s, _))| s.as_deref() == Some(shard))
        .map(|(name, _)| name)
        .collect()
}

/// Polls until every object is labelled, not draining, with the shard the ring of `shards`
/// assigns it; returns the assignment.
async fn until_assigned(client: &kube::Client, shards: &[&str]) -> BTreeMap<String, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let labels = labels(client).await;
        let wrong = labels.iter().find(|(name, (shard, draining))| {
            *draining || shard.as_deref() != ring::assign(shards, &format!("{NAMESPACE}/{name}"))
        });
        match wrong {
            None if labels.len() == N => {
                return labels
                    .into_iter()
                    .map(|(name, (shard, _))| (name, shard.unwrap_or_default()))
                    .collect();
            }
            _ => assert!(
                Instant::now() < deadline,
                "not assigned on {shards:?} within {WAIT:?}: {wrong:?} of {} objects",
                labels.len()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls until `series` in `registry` reads `expected` (an absent series reads 0); fails with
/// the last value read after `WAIT`.
async fn until_sample(registry: &prometheus::Registry, series: &str, expected: f64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let value = common::registry_sample(registry, series).unwrap_or(0.0);
        if value == expected {
            return;
        }
        assert!(Instant::now() < deadline, "{series} reads {value}, expected {expected}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until the leader's `kinformer_sharding_objects` equals, for each of `live`, the number
/// of objects `assignment` (the server's) has labelled for it, and exports no series for
/// `gone`.
async fn until_objects_counted(
    registry: &prometheus::Registry,
    assignment: &BTreeMap<String, String>,
    live: &[&str],
    gone: &[&str],
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let counted: Vec<(&str, Option<f64>)> = live
            .iter()
            .chain(gone)
            .map(|shard| (*shard, common::registry_sample(registry, &objects_series(shard))))
            .collect();
        let expected: Vec<(&str, Option<f64>)> = live
            .iter()
            .map(|shard| {
                let own = assignment.values().filter(|s| s == shard).count();
                (*shard, Some(own as f64))
            })
            .chain(gone.iter().map(|shard| (*shard, None)))
            .collect();
        if counted == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "kinformer_sharding_objects {counted:?}, the server has {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The moves counted so far in `registry`, by reason, and the drains timed.
fn counts(registry: &prometheus::Registry) -> [f64; 4] {
    let read = |series: &str| common::registry_sample(registry, series).unwrap_or(0.0);
    [
        read(&moves_series("drained")),
        read(&moves_series("released")),
        read(&moves_series("expired")),
        read(&drains_series()),
    ]
}

/// Objects per shard, moves by reason and drain timings through a join, a graceful shutdown and
/// a kill, each checked against the objects the server shows moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sharding_metrics_count_the_objects_and_the_moves_by_reason() {
    let (env, client) = setup(N).await;

    // Three shards: the leader's gauge counts each one's objects as the server labels them.
    let mut shards: Vec<Shard> = ["shard-0", "shard-1", "shard-2"]
        .iter()
        .map(|id| Shard::start(&env, id))
        .collect();
    let three = ["shard-0", "shard-1", "shard-2"];
    let before = until_assigned(&client, &three).await;
    let deadline = Instant::now() + WAIT;
    let leader = loop {
        if let Some(leader) = shards.iter().position(|s| s.status.is_leader()) {
            break leader;
        }
        assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let registry = shards[leader].registry.clone();
    until_objects_counted(&registry, &before, &three, &["shard-3"]).await;
    let leader_id = shards[leader].id.clone();

    // A fourth joins: every object that moves to it is counted as drained, and timed.
    let [drained, released, expired, timed] = counts(&registry);
    shards.push(Shard::start(&env, "shard-3"));
    let four = ["shard-0", "shard-1", "shard-2", "shard-3"];
    let after = until_assigned(&client, &four).await;
    let moved = after.iter().filter(|(name, shard)| before[*name] != **shard).count();
    assert!(moved > 0, "no object moved to shard-3");
    until_sample(&registry, &moves_series("drained"), drained + moved as f64).await;
    until_sample(&registry, &drains_series(), timed + moved as f64).await;
    let seconds = common::registry_sample(&registry, &drain_seconds_series()).unwrap_or(0.0);
    assert!(seconds > 0.0, "{moved} drains timed at {seconds} s in all");
    assert_eq!(counts(&registry)[1..3], [released, expired], "no shard went");
    until_objects_counted(&registry, &after, &four, &[]).await;
    eprintln!("{moved} of {N} objects drained to shard-3, {seconds:.3} s of drains in all");

    // A shard (not the leader) shut down gracefully: its objects move at once, as released.
    let [drained, released, expired, timed] = counts(&registry);
    let graceful = shards.iter().position(|s| s.id != leader_id).unwrap();
    let graceful = shards.remove(graceful);
    let graceful_id = graceful.id.clone();
    let its_objects = on_shard(&client, &graceful_id).await.len();
    assert!(its_objects > 0);
    let stopped = Instant::now();
    graceful.stop().await;
    let live: Vec<&str> = shards.iter().map(|s| s.id.as_str()).collect();
    let assignment = until_assigned(&client, &live).await;
    until_sample(&registry, &moves_series("released"), released + its_objects as f64).await;
    assert_eq!(
        counts(&registry),
        [drained, released + its_objects as f64, expired, timed],
        "{graceful_id}'s {its_objects} objects counted as released alone"
    );
    until_objects_counted(&registry, &assignment, &live, &[graceful_id.as_str()]).await;
    eprintln!(
        "{graceful_id} shut down: its {its_objects} objects counted as released after {:?}",
        stopped.elapsed()
    );

    // A shard (not the leader) killed: once its Lease expired, its objects move, as expired.
    let [drained, released, expired, timed] = counts(&registry);
    let victim = shards.iter().position(|s| s.id != leader_id).unwrap();
    let victim = shards.remove(victim);
    let victim_id = victim.id.clone();
    let its_objects = on_shard(&client, &victim_id).await.len();
    assert!(its_objects > 0);
    let killed = Instant::now();
    victim.kill().await;
    let live: Vec<&str> = shards.iter().map(|s| s.id.as_str()).collect();
    let assignment = until_assigned(&client, &live).await;
    until_sample(&registry, &moves_series("expired"), expired + its_objects as f64).await;
    assert_eq!(
        counts(&registry),
        [drained, released, expired + its_objects as f64, timed],
        "{victim_id}'s {its_objects} objects counted as expired alone"
    );
    until_objects_counted(
        &registry,
        &assignment,
        &live,
        &[graceful_id.as_str(), victim_id.as_str()],
    )
    .await;
    eprintln!(
        "{victim_id} killed: its {its_objects} objects counted as expired after {:?}",
        killed.elapsed()
    );

    for shard in shards {
        shard.stop().await;
    }
    env.shutdown().await;
}

/// A Manager running the ring's sharder alone, leader elected (identity `identity`).
struct SharderManager {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), controller::ManagerError>>,
    status: ManagerStatus,
    registry: prometheus::Registry,
}

impl SharderManager {
    fn start(env: &envtest::Server, identity: &str) -> Self {
        let election = LeaderElectionConfig::new(NAMESPACE, "sharding-metrics-failover", identity)
            .lease_duration(LEASE)
            .renew_deadline(RENEW)
            .retry_period(RETRY);
        let mut manager = common::elected_manager(env.client(), election);
        let sharder = Sharder::<ConfigMap>::new(manager.leader_factory(), &sharding("sharder"))
            .metrics(manager.metrics().clone())
            .build()
            .unwrap();
        manager.add(sharder);
        let (status, registry) = (manager.status(), manager.metrics().registry().clone());
        let (shutdown, task) = common::sharding::run(manager);
        SharderManager {
            shutdown,
            task,
            status,
            registry,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Writes shard `shard`'s Lease, held by it, renewed now, valid for an hour: a live shard
/// that needs no renewal during the test.
async fn write_live_lease(leases: &Api<Lease>, shard: &str) {
    let now = MicroTime(jiff::Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(format!("{RING}-{shard}")),
            namespace: Some(NAMESPACE.into()),
            labels: Some(BTreeMap::from([(RING_LABEL.to_owned(), RING.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(format!("{shard}_test")),
            lease_duration_seconds: Some(3600),
            renew_time: Some(now.clone()),
            acquire_time: Some(now),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &lease).await.unwrap();
}

/// A drain begun by one sharder and acknowledged after it stopped is timed and counted by the
/// next: the drain's start travels on the object (its drain-started annotation), not in the
/// memory of the sharder that began it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_begun_before_a_sharder_failover_is_timed_by_the_next_sharder() {
    const OBJECTS: usize = 30;
    let (env, client) = setup(OBJECTS).await;
    let (api, leases): (Api<ConfigMap>, Api<Lease>) = (
        Api::namespaced(client.clone(), NAMESPACE),
        Api::namespaced(client.clone(), NAMESPACE),
    );
    let annotation = Sharder::<ConfigMap>::DRAIN_STARTED_ANNOTATION;

    // shard-a alone: the first sharder assigns everything to it.
    write_live_lease(&leases, "shard-a").await;
    let first = SharderManager::start(&env, "replica-0");
    common::eventually(WAIT, "every object on shard-a", || {
        let client = client.clone();
        async move {
            let labels = labels(&client).await;
            labels.len() == OBJECTS && labels.values().all(|(s, d)| s.as_deref() == Some("shard-a") && !d)
        }
    })
    .await;

    // shard-b joins: the first sharder drains the objects that move to it (no shard runs to
    // acknowledge), each marked with its drain's start.
    write_live_lease(&leases, "shard-b").await;
    let two = ["shard-a", "shard-b"];
    let moving: Vec<String> = (0..OBJECTS)
        .map(|i| format!("obj-{i}"))
        .filter(|name| ring::assign(&two, &format!("{NAMESPACE}/{name}")) == Some("shard-b"))
        .collect();
    assert!(!moving.is_empty());
    let deadline = Instant::now() + WAIT;
    let started: BTreeMap<String, jiff::Timestamp> = loop {
        let objects = api.list(&ListParams::default()).await.unwrap().items;
        let marked: BTreeMap<String, jiff::Timestamp> = objects
            .iter()
            .filter(|cm| moving.contains(&cm.name_any()) && cm.labels().contains_key(&drain_label()))
            .filter_map(|cm| Some((cm.name_any(), cm.annotations().get(annotation)?.parse().ok()?)))
            .collect();
        if marked.len() == moving.len() {
            break marked;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} moving objects draining with a drain start",
            marked.len(),
            moving.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(first.status.is_leader());
    assert_eq!(counts(&first.registry)[0], 0.0, "nothing acknowledged yet");
    first.stop().await;

    // The next sharder leads before the drains are acknowledged.
    let second = SharderManager::start(&env, "replica-1");
    common::until_leading(WAIT, &second.status).await;
    let acknowledged = jiff::Timestamp::now();
    // shard-a acknowledges, as its worker would: both labels removed, conditional on the
    // resourceVersion read.
    for name in &moving {
        let cm = api.get(name).await.unwrap();
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": cm.metadata.resource_version,
            "labels": {shard_label(): null, drain_label(): null},
        }});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    // The second sharder assigns them to shard-b, counts them as drained and times each from
    // its annotation: at least from the drain's start to the acknowledgement.
    until_assigned_to(&api, &moving, "shard-b", annotation).await;
    let n = moving.len() as f64;
    until_sample(&second.registry, &moves_series("drained"), n).await;
    until_sample(&second.registry, &drains_series(), n).await;
    let seconds = common::registry_sample(&second.registry, &drain_seconds_series()).unwrap_or(0.0);
    let least: f64 = started
        .values()
        .map(|at| acknowledged.duration_since(*at).as_secs_f64())
        .sum();
    assert!(
        seconds >= least,
        "{n} drains timed at {seconds} s in all, less than the {least} s from their starts to the acknowledgements"
    );
    eprintln!("{n} drains begun before the failover, timed at {seconds:.3} s in all (at least {least:.3} s)");
    second.stop().await;
    env.shutdown().await;
}

/// Polls until each of `names` is labelled `shard`, not draining, and carries no `annotation`.
async fn until_assigned_to(api: &Api<ConfigMap>, names: &[String], shard: &str, annotation: &str) {
    let pending = async || {
        let objects = api.list(&ListParams::default()).await.unwrap().items;
        let pending: Vec<String> = objects
            .iter()
            .filter(|cm| names.contains(&cm.name_any()))
            .filter(|cm| {
                cm.labels().get(&shard_label()).map(String::as_str) != Some(shard)
                    || cm.labels().contains_key(&drain_label())
                    || cm.annotations().contains_key(annotation)
            })
            .map(|cm| cm.name_any())
            .collect();
        (!pending.is_empty()).then_some(pending)
    };
    let failure = |pending: Vec<String>| format!("not assigned to {shard} without a drain start: {pending:?}");
    common::sharding::until_none(WAIT, Duration::from_millis(50), pending, failure).await;
}
