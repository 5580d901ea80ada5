//! Controller sharding over envtest (issue #26): several Managers in one process against one
//! API server, each with a sharded ConfigMap controller and the ring's sharder (run by
//! whichever Manager leads). Real HTTP, real Leases and labels; short real durations (lease
//! 2 s, renew deadline 1.5 s, retry 300 ms, membership check 100 ms).
//!
//! Every reconcile is instrumented: a shared map of the keys in flight, by shard, records any
//! key entered by one shard while another still had it (an overlap), through every membership
//! change of the scenario. Converged means: every object carries the shard label of a live
//! shard in the expected set, no drain label, and its last reconcile was by that shard.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controller::sharding::{Sharder, ShardingConfig, ring};
use controller::{Action, Context, LeaderElectionConfig, Manager, ManagerStatus, Request, reconciler_fn};
use informer_core::Indexer;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, PostParams};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const RING: &str = "cms";
const NAMESPACE: &str = "default";
const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(1500);
const RETRY: Duration = Duration::from_millis(300);
const CHECK: Duration = Duration::from_millis(100);
/// Scheduling, HTTP and the survivors' reconciles on a busy 2-core machine (debug build): the
/// "drain" part of the takeover bound.
const SLACK: Duration = Duration::from_millis(2500);
const WAIT: Duration = Duration::from_secs(60);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The reconciles in flight and the last reconciler of each key, shared by every shard.
#[derive(Clone, Default)]
struct Tracker(Arc<Mutex<TrackerInner>>);

#[derive(Default)]
struct TrackerInner {
    in_flight: HashMap<String, String>,
    overlaps: Vec<String>,
    last: HashMap<String, String>,
}

impl Tracker {
    fn enter(&self, key: &str, shard: &str) {
        let mut t = self.0.lock().unwrap();
        if let Some(other) = t.in_flight.insert(key.to_owned(), shard.to_owned()) {
            let overlap = format!("{key}: {shard} entered while {other} reconciled it");
            t.overlaps.push(overlap);
        }
        t.last.insert(key.to_owned(), shard.to_owned());
    }

    fn exit(&self, key: &str, shard: &str) {
        let mut t = self.0.lock().unwrap();
        if t.in_flight.get(key).is_some_and(|s| s == shard) {
            t.in_flight.remove(key);
        }
    }

    fn overlaps(&self) -> Vec<String> {
        self.0.lock().unwrap().overlaps.clone()
    }

    fn last(&self, key: &str) -> Option<String> {
        self.0.lock().unwrap().last.get(key).cloned()
    }
}

fn sharding(id: &str) -> ShardingConfig {
    ShardingConfig::new(RING, id)
        .namespace(NAMESPACE)
        .lease_timing(LEASE, RENEW, RETRY)
        .membership_check_interval(CHECK)
}

struct Shard {
    id: String,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), controller::ManagerError>>,
    cache: Indexer<ConfigMap>,
    status: ManagerStatus,
    config: ShardingConfig,
}

/// A Manager (leader election on one lease shared by all) with the sharded controller and the
/// sharder, running.
fn start_shard(env: &envtest::Server, id: &str, tracker: &Tracker) -> Shard {
    let election = LeaderElectionConfig::new(NAMESPACE, "sharding-test", id)
        .lease_duration(LEASE)
        .renew_deadline(RENEW)
        .retry_period(RETRY);
    let mut manager = Manager::builder(env.client())
        .no_http_servers()
        .handle_signals(false)
        .leader_election(election)
        .build()
        .unwrap();
    let config = sharding(id);
    let (tracker, shard) = (tracker.clone(), id.to_owned());
    let controller = manager
        .controller("configmaps")
        .sharded(config.clone())
        .for_resource::<ConfigMap>()
        .workers(4)
        .build(reconciler_fn(move |req: Request, ctx: Context<ConfigMap>| {
            let (tracker, shard) = (tracker.clone(), shard.clone());
            async move {
                // Deletions are not part of the scenario: a key absent from the cache is not work.
                if ctx.get(&req)?.is_none() {
                    return Ok(Action::Done);
                }
                tracker.enter(&req.name, &shard);
                // The reconcile's "work": long enough for overlaps to show.
                tokio::time::sleep(Duration::from_millis(3)).await;
                tracker.exit(&req.name, &shard);
                Ok::<_, controller::BoxError>(Action::Done)
            }
        }))
        .unwrap();
    let cache = controller.context().indexer().clone();
    let sharder = Sharder::<ConfigMap>::new(manager.factory(), &config)
        .metrics(manager.metrics().clone())
        .build()
        .unwrap();
    manager.add(controller);
    manager.add(sharder);
    let readiness = config.readiness.clone();
    manager.add_readyz_check("shard", move || readiness.check());
    let status = manager.status();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));
    Shard {
        id: id.to_owned(),
        shutdown,
        task,
        cache,
        status,
        config,
    }
}

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("v".to_string(), "1".to_string())])),
        ..ConfigMap::default()
    }
}

async fn create_objects(client: &kube::Client, n: usize) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    for i in 0..n {
        api.create(&PostParams::default(), &configmap(&format!("obj-{i}")))
            .await
            .unwrap();
    }
}

/// Each object's shard label (`None`: unlabelled or draining), as the server has it.
async fn assignment(client: &kube::Client) -> BTreeMap<String, Option<String>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let shard_label = format!("shard.kinformer.io/{RING}");
    let drain_label = format!("drain.shard.kinformer.io/{RING}");
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| cm.metadata.name.as_deref().is_some_and(|n| n.starts_with("obj-")))
        .map(|cm| {
            let labels = cm.metadata.labels.unwrap_or_default();
            let shard = labels
                .get(&shard_label)
                .cloned()
                .filter(|_| !labels.contains_key(&drain_label));
            (cm.metadata.name.unwrap(), shard)
        })
        .collect()
}

/// Why the scenario has not converged on `shards` yet (`None`: it has).
async fn not_converged(client: &kube::Client, tracker: &Tracker, shards: &[&str], n: usize) -> Option<String> {
    let assignment = assignment(client).await;
    if assignment.len() != n {
        return Some(format!("{} objects", assignment.len()));
    }
    for (name, shard) in &assignment {
        let Some(shard) = shard else {
            return Some(format!("{name} unassigned or draining"));
        };
        let expected = ring::assign(shards, &format!("{NAMESPACE}/{name}")).unwrap();
        if shard != expected {
            return Some(format!("{name} on {shard}, expected {expected}"));
        }
        if tracker.last(name).as_deref() != Some(shard.as_str()) {
            return Some(format!(
                "{name} last reconciled by {:?}, labelled {shard}",
                tracker.last(name)
            ));
        }
    }
    None
}

async fn until_converged(client: &kube::Client, tracker: &Tracker, shards: &[&str], n: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let Some(why) = not_converged(client, tracker, shards, n).await else {
            return;
        };
        assert!(
            Instant::now() < deadline,
            "not converged on {shards:?} within {timeout:?}: {why}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scenario(n: usize) {
    init_tracing();
    let env = envtest::Server::start(envtest::Config::default())
        .await
        .expect("envtest");
    let client = env.client();
    let tracker = Tracker::default();
    create_objects(&client, n).await;

    // Three shards: every object labelled with exactly one live shard and reconciled by it.
    let mut shards: Vec<Shard> = ["shard-0", "shard-1", "shard-2"]
        .iter()
        .map(|id| start_shard(&env, id, &tracker))
        .collect();
    until_converged(&client, &tracker, &["shard-0", "shard-1", "shard-2"], n, WAIT).await;
    assert_eq!(tracker.overlaps(), Vec::<String>::new());
    for shard in &shards {
        assert!(shard.config.readiness.check().is_ok(), "{} ready", shard.id);
    }

    // Each shard's cache holds its own objects only: about a third each (within 20%).
    let deadline = Instant::now() + WAIT;
    let three = assignment(&client).await;
    for shard in &shards {
        let own = three
            .values()
            .filter(|s| s.as_deref() == Some(shard.id.as_str()))
            .count();
        while shard.cache.list().len() != own {
            assert!(
                Instant::now() < deadline,
                "{} caches {} objects, owns {own}",
                shard.id,
                shard.cache.list().len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let share = own as f64 / n as f64;
        assert!(
            (1.0 / 3.0 * 0.8..=1.0 / 3.0 * 1.2).contains(&share),
            "{} caches {own} of {n}",
            shard.id
        );
    }

    // A fourth shard joins: about a quarter of the objects move (within 1.3x), all to it.
    let before = three;
    shards.push(start_shard(&env, "shard-3", &tracker));
    let four = ["shard-0", "shard-1", "shard-2", "shard-3"];
    until_converged(&client, &tracker, &four, n, WAIT).await;
    let after = assignment(&client).await;
    let moved: Vec<&String> = after
        .iter()
        .filter(|(k, v)| before[*k] != **v)
        .map(|(k, _)| k)
        .collect();
    assert!(moved.iter().all(|k| after[*k].as_deref() == Some("shard-3")));
    let share = moved.len() as f64 / n as f64;
    assert!((0.25 / 1.3..=0.25 * 1.3).contains(&share), "moved share {share}");
    assert_eq!(tracker.overlaps(), Vec::<String>::new());

    // The sharder runs on the leader; the next steps stop two shards that do not lead.
    let leader = shards.iter().position(|s| s.status.is_leader()).expect("a leader");
    let mut others: Vec<usize> = (0..shards.len()).filter(|i| *i != leader).collect();

    // A shard shut down gracefully hands its objects over.
    let graceful = shards.remove(others.remove(0));
    graceful.shutdown.cancel();
    graceful.task.await.unwrap().unwrap();
    let live: Vec<String> = shards.iter().map(|s| s.id.clone()).collect();
    let live_refs: Vec<&str> = live.iter().map(String::as_str).collect();
    until_converged(&client, &tracker, &live_refs, n, WAIT).await;
    assert_eq!(tracker.overlaps(), Vec::<String>::new());

    // A shard killed without releasing its lease: the survivors reconcile its objects within
    // the lease duration + a retry period + the drain (SLACK).
    let victim_index = shards.iter().position(|s| !s.status.is_leader()).expect("a standby");
    let victim = shards.remove(victim_index);
    victim.task.abort();
    let killed = Instant::now();
    let live: Vec<String> = shards.iter().map(|s| s.id.clone()).collect();
    let live_refs: Vec<&str> = live.iter().map(String::as_str).collect();
    until_converged(&client, &tracker, &live_refs, n, LEASE + RETRY + CHECK + SLACK).await;
    eprintln!(
        "{} killed: its objects reconciled by the survivors after {:?}",
        victim.id,
        killed.elapsed()
    );
    assert_eq!(tracker.overlaps(), Vec::<String>::new());

    for shard in shards {
        shard.shutdown.cancel();
        shard.task.await.unwrap().unwrap();
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_shards_join_leave_and_die_without_overlap() {
    scenario(300).await;
}

/// The full count (slow in a debug build on a small machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "3,000 objects: run with --ignored"]
async fn three_thousand_objects() {
    scenario(3000).await;
}
