//! Helpers shared by the sharding integration tests (issue #26): tracing, envtest with a
//! namespace of `obj-<i>` ConfigMaps, a shard's elected Manager with the ring's sharder, the
//! objects' shard and drain labels on the server, and a tracker of every shard's reconciles.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controller::sharding::{Sharder, ShardingConfig};
use controller::{LeaderElectionConfig, Manager, ManagerError, Runnable};
use factory::FactoryResource;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The namespace of the shards' Leases and objects.
pub const NAMESPACE: &str = "default";
/// The lease duration of the shards' Leases and of their leader election (short, real).
pub const LEASE: Duration = Duration::from_secs(2);
/// The shards' renew deadline.
pub const RENEW: Duration = Duration::from_millis(1500);
/// The shards' retry period.
pub const RETRY: Duration = Duration::from_millis(300);
/// The sharder's membership check interval.
pub const CHECK: Duration = Duration::from_millis(100);
/// How long a test waits for what it polls (convergence, a move, a sample).
pub const WAIT: Duration = Duration::from_secs(60);

/// Logs to the test's output, filtered by `RUST_LOG`; once per process.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// envtest (tracing initialised) with `n` ConfigMaps `obj-<i>` (`v: "1"`) in `namespace`.
pub async fn envtest_with_objects(namespace: &str, n: usize) -> envtest::Server {
    init_tracing();
    let env = envtest::Server::start(envtest::Config::default())
        .await
        .expect("envtest");
    let api: Api<ConfigMap> = Api::namespaced(env.client(), namespace);
    for i in 0..n {
        let object = super::configmap(namespace, &format!("obj-{i}"), "1");
        api.create(&PostParams::default(), &object).await.unwrap();
    }
    env
}

/// A Manager for shard `id` that elects its leader on Lease `lease` in [`NAMESPACE`] (shared by
/// every shard) with [`LEASE`], [`RENEW`] and [`RETRY`]; each incarnation an identity of its
/// own, as a restarted pod's.
pub fn shard_manager(env: &envtest::Server, lease: &str, id: &str) -> Manager {
    static INCARNATION: AtomicUsize = AtomicUsize::new(0);
    let identity = format!("{id}-{}", INCARNATION.fetch_add(1, Ordering::SeqCst));
    let election = LeaderElectionConfig::new(NAMESPACE, lease, identity)
        .lease_duration(LEASE)
        .renew_deadline(RENEW)
        .retry_period(RETRY);
    super::elected_manager(env.client(), election)
}

/// Shard `id`'s configuration in ring `ring`: its Lease in [`NAMESPACE`], renewed with the
/// shards' timing, the sharder checking the membership every [`CHECK`].
pub fn shard_config(ring: &str, id: &str) -> ShardingConfig {
    ShardingConfig::new(ring, id)
        .namespace(NAMESPACE)
        .lease_timing(LEASE, RENEW, RETRY)
        .membership_check_interval(CHECK)
}

/// Adds `controller` and the ring's sharder of `K` (on the Manager's leader factory, its
/// metrics in the Manager's) to `manager`.
pub fn add_with_sharder<K: FactoryResource>(manager: &mut Manager, controller: impl Runnable, config: &ShardingConfig) {
    let sharder = Sharder::<K>::new(manager.leader_factory(), config)
        .metrics(manager.metrics().clone())
        .build()
        .unwrap();
    manager.add(controller);
    manager.add(sharder);
}

/// Runs `manager` in a task: the token that shuts it down, and the task.
pub fn run(manager: Manager) -> (CancellationToken, JoinHandle<Result<(), ManagerError>>) {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));
    (shutdown, task)
}

/// Polls `pending` every `every` until it answers `None`; fails once `timeout` has passed, with
/// `failure` of its last answer.
pub async fn until_none<T>(
    timeout: Duration,
    every: Duration,
    mut pending: impl AsyncFnMut() -> Option<T>,
    failure: impl Fn(T) -> String,
) {
    let deadline = Instant::now() + timeout;
    while let Some(why) = pending().await {
        assert!(Instant::now() < deadline, "{}", failure(why));
        tokio::time::sleep(every).await;
    }
}

/// Each object's (`obj-*` in `api`) `(shard label, draining)` in ring `ring`, on the server.
pub async fn labels(api: &Api<ConfigMap>, ring: &str) -> BTreeMap<String, (Option<String>, bool)> {
    let (shard, drain) = (
        format!("shard.kinformer.io/{ring}"),
        format!("drain.shard.kinformer.io/{ring}"),
    );
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| cm.name_any().starts_with("obj-"))
        .map(|cm| {
            let labels = cm.labels();
            (
                cm.name_any(),
                (labels.get(&shard).cloned(), labels.contains_key(&drain)),
            )
        })
        .collect()
}

/// One reconcile in flight, until dropped.
pub struct InFlight {
    tracker: Tracker,
    key: String,
    shard: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.tracker.exit(&self.key, &self.shard);
    }
}

/// The reconciles in flight and the last reconciler of each key, shared by every shard.
#[derive(Clone, Default)]
pub struct Tracker(Arc<Mutex<TrackerInner>>);

#[derive(Default)]
struct TrackerInner {
    in_flight: HashMap<String, String>,
    overlaps: Vec<String>,
    last: HashMap<String, String>,
    /// The `data.v` each key's last reconcile of a cached object saw.
    seen: HashMap<String, String>,
    /// Reconciles entered, by shard.
    count: HashMap<String, usize>,
    /// Reconciles entered, by key and shard.
    by_key: HashMap<(String, String), usize>,
    /// Every reconcile entered: when, of which key, by which shard.
    entries: Vec<(Instant, String, String)>,
    /// Every reconcile exited (returned or aborted): when, of which key, by which shard.
    exits: Vec<(Instant, String, String)>,
}

/// What [`Tracker::seen`] holds for a key whose last reconcile found no object in the cache
/// (deleted, or not its shard's).
pub const ABSENT: &str = "<absent>";

impl Tracker {
    /// Records a reconcile entering; it exits when the guard is dropped (also when its future is
    /// dropped: a killed shard's reconcile was aborted, it no longer runs).
    pub fn enter(&self, key: &str, shard: &str, value: Option<&str>) -> InFlight {
        let mut t = self.0.lock().unwrap();
        if let Some(value) = value {
            t.seen.insert(key.to_owned(), value.to_owned());
        }
        *t.count.entry(shard.to_owned()).or_default() += 1;
        *t.by_key.entry((key.to_owned(), shard.to_owned())).or_default() += 1;
        t.entries.push((Instant::now(), key.to_owned(), shard.to_owned()));
        if let Some(other) = t.in_flight.insert(key.to_owned(), shard.to_owned()) {
            let overlap = format!("{key}: {shard} entered while {other} reconciled it");
            t.overlaps.push(overlap);
        }
        t.last.insert(key.to_owned(), shard.to_owned());
        InFlight {
            tracker: self.clone(),
            key: key.to_owned(),
            shard: shard.to_owned(),
        }
    }

    fn exit(&self, key: &str, shard: &str) {
        let mut t = self.0.lock().unwrap();
        t.exits.push((Instant::now(), key.to_owned(), shard.to_owned()));
        if t.in_flight.get(key).is_some_and(|s| s == shard) {
            t.in_flight.remove(key);
        }
    }

    /// Overlaps, and reconciles of objects not labelled for the reconciling shard.
    pub fn overlaps(&self) -> Vec<String> {
        self.0.lock().unwrap().overlaps.clone()
    }

    pub fn violation(&self, what: String) {
        self.0.lock().unwrap().overlaps.push(what);
    }

    /// How many reconciles `shard` entered.
    pub fn count(&self, shard: &str) -> usize {
        self.0.lock().unwrap().count.get(shard).copied().unwrap_or(0)
    }

    /// How many reconciles of `key` `shard` entered.
    pub fn reconciles(&self, key: &str, shard: &str) -> usize {
        let t = self.0.lock().unwrap();
        t.by_key.get(&(key.to_owned(), shard.to_owned())).copied().unwrap_or(0)
    }

    pub fn last(&self, key: &str) -> Option<String> {
        self.0.lock().unwrap().last.get(key).cloned()
    }

    /// The shard id of `key`'s last reconciler (a tracker name is `<shard-id>` or
    /// `<shard-id>#<process>`).
    pub fn last_shard(&self, key: &str) -> Option<String> {
        self.last(key)
            .map(|name| name.split('#').next().unwrap_or_default().to_owned())
    }

    /// When each of `keys` was first reconciled at or after `since` by one of `shards`; `None`
    /// for a key none of them reconciled since.
    pub fn first_reconciles(&self, keys: &[String], shards: &[&str], since: Instant) -> Vec<Option<Instant>> {
        let t = self.0.lock().unwrap();
        let mut first: HashMap<&str, Instant> = HashMap::new();
        for (at, key, shard) in &t.entries {
            if *at >= since && shards.contains(&shard.as_str()) {
                first.entry(key.as_str()).or_insert(*at);
            }
        }
        keys.iter().map(|key| first.get(key.as_str()).copied()).collect()
    }

    /// Whether `shard` entered a reconcile at or after `since`.
    pub fn entered_since(&self, shard: &str, since: Instant) -> bool {
        let t = self.0.lock().unwrap();
        t.entries
            .iter()
            .rev()
            .take_while(|(at, _, _)| *at >= since)
            .any(|(_, _, s)| s == shard)
    }

    /// When the last reconcile of `key` entered, if one did.
    pub fn last_entry(&self, key: &str) -> Option<Instant> {
        let t = self.0.lock().unwrap();
        t.entries.iter().rev().find(|(_, k, _)| k == key).map(|(at, _, _)| *at)
    }

    /// When `shard`'s last reconcile of `key` exited, if it reconciled `key`.
    pub fn last_exit(&self, key: &str, shard: &str) -> Option<Instant> {
        let t = self.0.lock().unwrap();
        t.exits
            .iter()
            .rev()
            .find(|(_, k, s)| k == key && s == shard)
            .map(|(at, _, _)| *at)
    }

    /// The `data.v` `key`'s last reconcile saw ([`ABSENT`]: the object was not cached).
    pub fn seen(&self, key: &str) -> Option<String> {
        self.0.lock().unwrap().seen.get(key).cloned()
    }
}
