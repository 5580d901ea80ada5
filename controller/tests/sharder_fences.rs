//! The sharder over envtest (issue #26), alone in a Manager that elects it, against shard
//! Leases the test writes itself: what a newly elected sharder grants the shards it finds, how
//! it tends the Leases of a ring with no object, and how it finds an owner's children. Real
//! HTTP, real Leases and labels; short real durations (lease 3 s, membership check 100 ms).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use controller::LeaderElectionConfig;
use controller::sharding::{FENCE_ANNOTATION, RING_LABEL, Sharder, ShardingConfig};
use factory::SharedInformerFactory;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const RING: &str = "cms";
const NAMESPACE: &str = "default";
const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(300);
const CHECK: Duration = Duration::from_millis(100);
/// Scheduling and HTTP on a busy 2-core machine (debug build), and the test's own polling.
const SLACK: Duration = Duration::from_millis(2500);
const WAIT: Duration = Duration::from_secs(30);

/// envtest, its client, and its Leases in `NAMESPACE`.
async fn start_envtest() -> (envtest::Server, kube::Client, Api<Lease>) {
    let env = common::sharding::envtest_with_objects(NAMESPACE, 0).await;
    let client = env.client();
    let leases = Api::namespaced(client.clone(), NAMESPACE);
    (env, client, leases)
}

fn sharding() -> ShardingConfig {
    ShardingConfig::new(RING, "sharder")
        .namespace(NAMESPACE)
        .lease_timing(LEASE, RENEW, RETRY)
        .membership_check_interval(CHECK)
}

fn shard_label() -> String {
    format!("shard.kinformer.io/{RING}")
}

/// A Manager that runs only the ring's sharder (owning Secrets with `children`), leader
/// elected, running; its leader factory (the sharder's informers).
struct SharderManager {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), controller::ManagerError>>,
    leader_factory: SharedInformerFactory,
}

impl SharderManager {
    /// Starts the Manager and waits until it leads.
    async fn start(env: &envtest::Server, children: bool) -> Self {
        Self::start_with(env, children, |sharder| sharder).await
    }

    /// As [`start`](Self::start), with the sharder's settings changed by `configure`.
    async fn start_with(
        env: &envtest::Server,
        children: bool,
        configure: impl FnOnce(Sharder<ConfigMap>) -> Sharder<ConfigMap>,
    ) -> Self {
        let election = LeaderElectionConfig::new(NAMESPACE, "sharder-fences-test", "replica-0")
            .lease_duration(LEASE)
            .renew_deadline(RENEW)
            .retry_period(RETRY);
        let mut manager = common::elected_manager(env.client(), election);
        let sharder =
            Sharder::<ConfigMap>::new(manager.leader_factory(), &sharding()).metrics(manager.metrics().clone());
        let sharder = if children { sharder.owns::<Secret>() } else { sharder };
        manager.add(configure(sharder).build().unwrap());
        let (status, leader_factory) = (manager.status(), manager.leader_factory().clone());
        let (shutdown, task) = common::sharding::run(manager);
        common::until_leading(WAIT, &status).await;
        SharderManager {
            shutdown,
            task,
            leader_factory,
        }
    }

    /// Stops the Manager, then envtest.
    async fn stop(self, env: envtest::Server) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
        env.shutdown().await;
    }
}

/// Writes shard `shard`'s Lease (created, or replaced): held by `holder` (`""`: released),
/// renewed at `renewed`, with the sharder's fence `fence` if any.
async fn write_lease(api: &Api<Lease>, shard: &str, holder: &str, renewed: jiff::Timestamp, fence: Option<&str>) {
    let name = format!("{RING}-{shard}");
    let mut lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(BTreeMap::from([(RING_LABEL.to_owned(), RING.to_owned())])),
            annotations: fence.map(|f| BTreeMap::from([(FENCE_ANNOTATION.to_owned(), f.to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(LEASE.as_secs() as i32),
            renew_time: Some(MicroTime(renewed)),
            acquire_time: Some(MicroTime(renewed)),
            ..LeaseSpec::default()
        }),
    };
    match api.get_opt(&name).await.unwrap() {
        Some(existing) => {
            lease.metadata.resource_version = existing.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &lease).await.unwrap();
        }
        None => {
            api.create(&PostParams::default(), &lease).await.unwrap();
        }
    }
}

/// Writes shard `shard`'s Lease held by it and renewed now, and keeps it renewed (every `RETRY`)
/// until the token fires: a live shard, as the sharder sees it.
async fn live_shard(leases: &Api<Lease>, shard: &str) -> CancellationToken {
    write_lease(leases, shard, shard, jiff::Timestamp::now(), None).await;
    let stop = CancellationToken::new();
    let (api, shard, done) = (leases.clone(), shard.to_owned(), stop.clone());
    tokio::spawn(async move {
        while !done.is_cancelled() {
            let name = format!("{RING}-{shard}");
            let patch = serde_json::json!({"spec": {"renewTime": MicroTime(jiff::Timestamp::now())}});
            let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
            tokio::time::sleep(RETRY).await;
        }
    });
    stop
}

/// Whether Lease `name` carries a sharder's fence.
async fn fenced(leases: &Api<Lease>, name: &str) -> bool {
    leases
        .get(name)
        .await
        .unwrap()
        .annotations()
        .contains_key(FENCE_ANNOTATION)
}

/// Between two polls for something due by `deadline`: fails once `deadline` has passed, with
/// `failure` given the time that was allowed (`deadline - since`); else waits 50 ms.
async fn poll_again(since: Instant, deadline: Instant, failure: impl FnOnce(Duration) -> String) {
    assert!(Instant::now() < deadline, "{}", failure(deadline - since));
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Polls until Lease `name` is deleted; fails at `deadline` (told as a time since `since`).
async fn until_deleted(leases: &Api<Lease>, name: &str, since: Instant, deadline: Instant) {
    while leases.get_opt(name).await.unwrap().is_some() {
        poll_again(since, deadline, |within| {
            format!("{name} not deleted within {within:?}")
        })
        .await;
    }
}

/// A newly elected sharder gives every shard it finds a full lease duration before judging it
/// gone, as client-go's elector gives a Lease it has just observed: here shard-x's Lease is held
/// but its `renewTime` is already a lease duration old by the sharder's clock (a shard whose clock
/// lags, or whose renewals the previous sharder saw and this one has not). For a lease duration
/// from the election the sharder only asks shard-x to drain (it counts it live); after that, with
/// no renewal seen, it fences the Lease, moves the objects to the live shard-0 and lifts the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_sharder_gives_every_shard_it_finds_a_lease_duration() {
    let (env, client, leases) = start_envtest().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let n = 20;
    for i in 0..n {
        let mut cm = common::configmap(NAMESPACE, &format!("obj-{i}"), "1");
        cm.metadata.labels = Some(BTreeMap::from([(shard_label(), "shard-x".to_owned())]));
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let renewing = live_shard(&leases, "shard-0").await;
    let stale = jiff::Timestamp::now() - jiff::SignedDuration::try_from(LEASE + Duration::from_secs(1)).unwrap();
    write_lease(&leases, "shard-x", "shard-x", stale, None).await;
    let shard_x = format!("{RING}-shard-x");

    let sharder = SharderManager::start(&env, false).await;
    // The sharder's term began at or before this; its grace ends a lease duration after its
    // first judgement of the ring, later still.
    let leading = Instant::now();

    // Within the grace: nothing moved off shard-x, its Lease not fenced; the sharder is at work
    // (it asked shard-x to drain the objects the ring gives shard-0).
    let mut drains_seen = false;
    while leading.elapsed() < LEASE - Duration::from_millis(200) {
        assert!(
            !fenced(&leases, &shard_x).await,
            "shard-x fenced {:?} after the election",
            leading.elapsed()
        );
        for (name, (shard, draining)) in common::sharding::labels(&cms, RING).await {
            assert_eq!(
                shard.as_deref(),
                Some("shard-x"),
                "{name} moved {:?} after the election",
                leading.elapsed()
            );
            drains_seen |= draining;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(drains_seen, "the sharder did not judge shard-x live (no drain asked)");

    // Then, shard-x not renewed: its objects move to shard-0 under a fence, lifted after.
    let deadline = leading + LEASE + CHECK + SLACK;
    loop {
        let all = common::sharding::labels(&cms, RING).await;
        if all.values().all(|l| *l == (Some("shard-0".to_owned()), false)) && !fenced(&leases, &shard_x).await {
            break;
        }
        poll_again(leading, deadline, |within| {
            format!("shard-x's objects not moved (fence lifted) within {within:?}: {all:?}")
        })
        .await;
    }
    eprintln!("shard-x's objects moved {:?} after the election", leading.elapsed());

    renewing.cancel();
    sharder.stop(env).await;
}

/// A sharder that died while it fenced a shard leaves the fence on the Lease; in a ring with no
/// object the new sharder has no object to reconcile, yet it takes the fence over and lifts it
/// (no object is labelled for the shard), from the Leases alone; and it deletes the released
/// Lease once it has been free for the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fence_left_in_a_ring_with_no_object_is_lifted() {
    let (env, _, leases) = start_envtest().await;
    let name = format!("{RING}-shard-x");
    // Taken first: the Lease is free from `written`, which is not before `written_at`.
    let written_at = Instant::now();
    let written = jiff::Timestamp::now();
    write_lease(&leases, "shard-x", "", written, Some("left-by-a-dead-sharder")).await;

    let sharder = SharderManager::start(&env, false).await;
    let leading = Instant::now();
    let deadline = leading + CHECK + SLACK;
    while fenced(&leases, &name).await {
        poll_again(leading, deadline, |within| {
            format!("the fence left on {name} not lifted within {within:?}")
        })
        .await;
    }
    eprintln!("fence lifted {:?} after the election", leading.elapsed());

    // Released at `written`, unfenced now: deleted once free for twice the lease duration.
    until_deleted(&leases, &name, written_at, written_at + 2 * LEASE + CHECK + SLACK).await;
    assert!(
        written_at.elapsed() >= 2 * LEASE,
        "deleted after {:?}, before the grace",
        written_at.elapsed()
    );

    sharder.stop(env).await;
}

/// The sharder finds an owner's children by the owner-uid index it adds to the child type's
/// informer ([`Sharder::OWNER_UID_INDEX`]), not by scanning every child: the index is there on
/// the leader factory's Secret informer, holds each ConfigMap's Secret under the ConfigMap's uid
/// (a Secret owned without `controller: true` under none), and the children carry their owner's
/// label.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn children_are_found_by_their_owners_uid() {
    let (env, client, leases) = start_envtest().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let n = 10;
    let mut uids = BTreeMap::new();
    for i in 0..n {
        let name = format!("obj-{i}");
        let owner = cms
            .create(&PostParams::default(), &common::configmap(NAMESPACE, &name, "1"))
            .await
            .unwrap();
        let uid = owner.metadata.uid.unwrap();
        // obj-0 also has a child it owns without being its controller: not indexed.
        for (child, controller) in [(name.clone(), true), (format!("{name}-other"), false)] {
            if !controller && i != 0 {
                continue;
            }
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(child),
                    namespace: Some(NAMESPACE.into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        name: name.clone(),
                        uid: uid.clone(),
                        controller: Some(controller),
                        ..OwnerReference::default()
                    }]),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            };
            secrets.create(&PostParams::default(), &secret).await.unwrap();
        }
        uids.insert(name, uid);
    }
    let renewing = live_shard(&leases, "shard-0").await;

    let sharder = SharderManager::start(&env, true).await;
    let index = Sharder::<ConfigMap>::OWNER_UID_INDEX;
    let informer = sharder.leader_factory.metadata_informer_for::<Secret>().unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let indexed = uids.iter().all(|(name, uid)| {
            let children: Vec<String> = informer
                .indexer()
                .by_index(index, uid)
                .unwrap_or_else(|e| panic!("the sharder's Secret informer has no index {index}: {e}"))
                .iter()
                .map(|s| s.name_any())
                .collect();
            children == [name.clone()]
        });
        let label = shard_label();
        let children_labelled = secrets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|s| s.name_any().starts_with("obj-") && !s.name_any().ends_with("-other"))
            .all(|s| s.labels().get(&label).map(String::as_str) == Some("shard-0"));
        if indexed && children_labelled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "children not indexed by owner uid (indexed: {indexed}) or not labelled (labelled: {children_labelled})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The child whose owner is not its controller does not follow it.
    let other = secrets.get("obj-0-other").await.unwrap();
    assert_eq!(other.labels().get(&shard_label()), None);

    renewing.cancel();
    sharder.stop(env).await;
}

/// The deletion grace is a setting ([`Sharder::deletion_grace`]): with four lease durations, a
/// released Lease outlives the default grace (two) and is deleted after four; a grace not longer
/// than the lease duration is refused when the sharder is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_deletion_grace_is_a_setting() {
    let (env, client, leases) = start_envtest().await;
    let factory = SharedInformerFactory::new(client, Duration::ZERO);
    let refused = Sharder::<ConfigMap>::new(&factory, &sharding())
        .deletion_grace(LEASE)
        .build()
        .err()
        .expect("a grace of one lease duration is refused");
    assert!(
        matches!(&refused, controller::ControllerError::InvalidConfig(why) if why.contains("deletion grace")),
        "{refused}"
    );

    let name = format!("{RING}-shard-x");
    let grace = 4 * LEASE;
    let sharder = SharderManager::start_with(&env, false, |sharder| sharder.deletion_grace(grace)).await;
    // Taken first: the Lease is free from `released`, which is not before `released_at`.
    let released_at = Instant::now();
    write_lease(&leases, "shard-x", "", jiff::Timestamp::now(), None).await;
    // Kept past the default grace.
    let past_default = released_at + 2 * LEASE + CHECK + SLACK;
    while Instant::now() < past_default {
        assert!(
            leases.get_opt(&name).await.unwrap().is_some(),
            "{name} deleted {:?} after its release, before the grace of {grace:?}",
            released_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Deleted after the configured one.
    until_deleted(&leases, &name, released_at, released_at + grace + CHECK + SLACK).await;
    let elapsed = released_at.elapsed();
    eprintln!("released Lease deleted {elapsed:?} after its release (grace {grace:?})");
    assert!(
        elapsed >= grace,
        "deleted after {elapsed:?}, before the grace of {grace:?}"
    );

    sharder.stop(env).await;
}
