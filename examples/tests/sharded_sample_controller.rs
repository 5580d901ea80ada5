//! The sample-controller sharded (issue #26): three processes of the real binary with
//! `--shards` against envtest through a kubeconfig, each shard's id its hostname (as a pod's
//! name). Once the leader's sharder sees the three shards, Foos are created; they end up each
//! labelled with the live shard the ring assigns it, its Deployment carrying the same label, and
//! reconciled by that shard only (every `Synced` Event on a Foo names its shard as the
//! reporting instance). Each process's informer caches, as its `/metrics` reports them, hold
//! only its own shard's Foos and Deployments, within 20% of a third of them; the sharder's
//! caches (every Foo's and Deployment's metadata, the shard Leases) are filled on the replica
//! leading and empty on the others. When the leader is killed, another replica takes the lead,
//! starts the sharder's informers, and the dead shard's Foos move to the survivors.

// The resource is called Foo, as upstream: `foo` names one, not a placeholder.
#![allow(clippy::disallowed_names)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use examples::sample_controller::{Foo, FooSpec, RING};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kinformer::controller::sharding::{DRAIN_LABEL_PREFIX, RING_LABEL, SHARD_LABEL_PREFIX, ring};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

/// Foos created: enough for a third of them to be a fair share (the ring's hash is fixed, so
/// the counts are the same on every run).
const FOOS: usize = 300;
const SHARDS: [&str; 3] = ["shard-a", "shard-b", "shard-c"];
const NAMESPACE: &str = "default";

/// Kills the process when the test ends, as a node failure would (no graceful release).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One process of the binary: a shard, and a candidate for the lead.
struct Replica {
    id: &'static str,
    metrics: SocketAddr,
    _process: Guard,
}

impl Replica {
    /// Starts `sample-controller --shards` as shard `id` (its hostname) and waits for the
    /// metrics address it prints.
    fn start(kubeconfig: &Path, home: &Path, id: &'static str) -> Replica {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sample-controller"))
            .args([
                "--shards",
                "--metrics-addr",
                "127.0.0.1:0",
                "--health-probe-addr",
                "127.0.0.1:0",
                "--kubeconfig",
            ])
            .arg(kubeconfig)
            // The shard id by default, and the Events' reporting instance.
            .env("HOSTNAME", id)
            .env("HOME", home)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let process = Guard(child);
        let (line_tx, lines) = std::sync::mpsc::channel();
        // Drains the pipe for the process's whole life: a full pipe would block it.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = line_tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut printed = Vec::new();
        let metrics = loop {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|e| panic!("{id} printed no metrics address ({e}): {printed:#?}"));
            let addr = line
                .split_once("metrics on http://")
                .and_then(|(_, rest)| rest.strip_suffix("/metrics"));
            if let Some(addr) = addr {
                break addr.parse().unwrap();
            }
            printed.push(line);
        };
        let joined = format!("sample-controller: shard {id} of the ring {RING}");
        assert!(printed.contains(&joined), "{id}: {printed:#?}");
        Replica {
            id,
            metrics,
            _process: process,
        }
    }

    async fn metrics(&self) -> String {
        let (code, body) = support::http_get(self.metrics, "/metrics").await;
        assert_eq!(code, 200, "{}: /metrics answered {code}", self.id);
        body
    }

    /// The objects in each of its informers' caches (`kinformer_informer_cached_objects`).
    async fn caches(&self) -> BTreeMap<String, usize> {
        let body = self.metrics().await;
        support::samples(&body, "kinformer_informer_cached_objects")
            .into_iter()
            .map(|(labels, value)| (label(labels, "informer").unwrap_or(labels).to_owned(), value as usize))
            .collect()
    }

    /// The shards its sharder counts objects for (`kinformer_sharding_objects`): the live
    /// shards as the sharder sees them; none on a replica that does not lead.
    async fn sharder_sees(&self) -> BTreeSet<String> {
        let body = self.metrics().await;
        support::samples(&body, "kinformer_sharding_objects")
            .into_iter()
            .filter(|(labels, _)| label(labels, "ring") == Some(RING))
            .filter_map(|(labels, _)| label(labels, "shard").map(str::to_owned))
            .collect()
    }
}

/// The value of label `name` in a sample's labels (`a="x",b="y"`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &labels[start..];
    Some(&rest[..rest.find('"')?])
}

/// Polls `check` every 100 ms until it gives a value; panics with its last reason after
/// `timeout`.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => panic!("timed out after {timeout:?} waiting for {what}: {why}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The shard the leader election Lease's holder runs as (its identity is `<hostname>_<uuid>`).
async fn lease_holder(client: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get_opt("sample-controller")
        .await
        .ok()??;
    let holder = lease.spec?.holder_identity?;
    Some(holder.split('_').next()?.to_owned())
}

fn shard_label() -> String {
    format!("{SHARD_LABEL_PREFIX}{RING}")
}

/// Each Foo's shard, once every Foo is labelled with the shard the ring assigns it among
/// `live` (no drain pending), has its Deployment, labelled the same, and a status; else why not.
async fn assigned(client: &Client, live: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let list = ListParams::default();
    let foos = Api::<Foo>::namespaced(client.clone(), NAMESPACE)
        .list(&list)
        .await
        .map_err(|e| e.to_string())?
        .items;
    if foos.len() != FOOS {
        return Err(format!("{} Foos", foos.len()));
    }
    let deployments: BTreeMap<String, Deployment> = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .list(&list)
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .map(|d| (d.name_any(), d))
        .collect();
    let (shard_label, drain_label) = (shard_label(), format!("{DRAIN_LABEL_PREFIX}{RING}"));
    let mut assignment = BTreeMap::new();
    for foo in &foos {
        let name = foo.name_any();
        let wanted = ring::assign(live, &format!("{NAMESPACE}/{name}")).unwrap();
        let label = foo.labels().get(&shard_label);
        if label.map(String::as_str) != Some(wanted) || foo.labels().contains_key(&drain_label) {
            return Err(format!(
                "Foo {name} has labels {:?}; the ring assigns {wanted}",
                foo.labels()
            ));
        }
        let Some(deployment) = deployments.get(&foo.spec.deployment_name) else {
            return Err(format!("Foo {name} has no Deployment"));
        };
        if deployment.labels().get(&shard_label) != label {
            return Err(format!("Deployment {name} has labels {:?}", deployment.labels()));
        }
        if foo.status.is_none() {
            return Err(format!("Foo {name} has no status"));
        }
        assignment.insert(name, wanted.to_owned());
    }
    Ok(assignment)
}

/// Who reported each Foo synced: the reporting instances of its `Synced` Events.
async fn synced_by(client: &Client) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let events = Api::<Event>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    let mut by = BTreeMap::<String, BTreeSet<String>>::new();
    for event in events {
        let regarding = event.regarding.unwrap_or_default();
        if event.reason.as_deref() == Some("Synced") && regarding.kind.as_deref() == Some("Foo") {
            by.entry(regarding.name.unwrap_or_default())
                .or_default()
                .insert(event.reporting_instance.unwrap_or_default());
        }
    }
    Ok(by)
}

/// Every Foo reported synced by its own shard and no other.
async fn synced_by_its_shard_only(client: &Client, assignment: &BTreeMap<String, String>) -> Result<(), String> {
    let by = synced_by(client).await?;
    for (foo, shard) in assignment {
        match by.get(foo) {
            None => return Err(format!("no Synced Event on Foo {foo}")),
            Some(shards) if shards.len() == 1 && shards.contains(shard) => {}
            // Never right, so no point waiting: a Foo reconciled by a shard it is not labelled for.
            Some(shards) => panic!("Foo {foo}, labelled for {shard}, reported synced by {shards:?}"),
        }
    }
    Ok(())
}

/// The replica's caches, once they hold what they should: its shard's informers (Foo and
/// Deployment, selecting on its label) exactly its `own` Foos and their Deployments; the
/// sharder's informers (every other one) every Foo's and Deployment's metadata and the `shards`
/// shard Leases if it leads, nothing otherwise.
async fn caches_settled(
    replica: &Replica,
    own: usize,
    leads: bool,
    shards: usize,
) -> Result<BTreeMap<String, usize>, String> {
    let caches = replica.caches().await;
    let selector = format!("{}={}", shard_label(), replica.id);
    let (mine, sharder): (Vec<_>, Vec<_>) = caches.iter().partition(|(name, _)| name.contains(&selector));
    if mine.len() != 2 || mine.iter().any(|(_, n)| **n != own) {
        return Err(format!(
            "{}: its shard's caches hold {mine:?}, not {own} each",
            replica.id
        ));
    }
    for (name, n) in sharder {
        let wanted = match (leads, name.contains("Lease")) {
            (false, _) => 0,
            (true, true) => shards,
            (true, false) => FOOS,
        };
        if *n != wanted {
            return Err(format!(
                "{} (leading: {leads}): the sharder's informer {name} holds {n}, not {wanted}",
                replica.id
            ));
        }
    }
    Ok(caches)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_shard_processes_each_reconcile_and_cache_only_their_own_foos() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let dir = temp_dir("sharded-sample-controller");
    let kubeconfig = dir.join("kubeconfig");
    env.write_kubeconfig(&kubeconfig).unwrap();
    let mut replicas: Vec<Replica> = SHARDS.iter().map(|&id| Replica::start(&kubeconfig, &dir, id)).collect();

    // The ring, as the leader's sharder sees it: all three shards.
    let all: BTreeSet<String> = SHARDS.iter().map(|s| s.to_string()).collect();
    let leader = eventually(
        "the leader's sharder to see the three shards",
        Duration::from_secs(60),
        || async {
            let holder = lease_holder(&client).await.ok_or("no leader yet")?;
            let replica = replicas.iter().find(|r| r.id == holder).ok_or("an unknown leader")?;
            let sees = replica.sharder_sees().await;
            if sees == all {
                Ok(holder)
            } else {
                Err(format!("{holder}'s sharder sees {sees:?}"))
            }
        },
    )
    .await;

    let foos: Api<Foo> = Api::namespaced(client.clone(), NAMESPACE);
    for i in 0..FOOS {
        let name = format!("foo-{i}");
        let spec = FooSpec {
            deployment_name: name.clone(),
            replicas: Some(1),
        };
        foos.create(&PostParams::default(), &Foo::new(&name, spec))
            .await
            .unwrap();
    }
    let started = Instant::now();
    let assignment = eventually("every Foo to be assigned and synced", Duration::from_secs(120), || {
        assigned(&client, &SHARDS)
    })
    .await;
    eprintln!("{FOOS} Foos assigned and synced in {:.1?}", started.elapsed());
    eventually("a Synced Event on every Foo", Duration::from_secs(30), || {
        synced_by_its_shard_only(&client, &assignment)
    })
    .await;

    // Each shard's share: within 20% of a third, and exactly what its caches hold.
    let mut share = BTreeMap::<&str, usize>::new();
    for shard in assignment.values() {
        *share.entry(shard.as_str()).or_default() += 1;
    }
    let third = FOOS as f64 / 3.0;
    for replica in &replicas {
        let own = share.get(replica.id).copied().unwrap_or(0);
        assert!(
            (own as f64 - third).abs() <= 0.2 * third,
            "{} has {own} of {FOOS} Foos: {share:?}",
            replica.id
        );
        let leads = replica.id == leader;
        let caches = eventually("the caches to settle", Duration::from_secs(30), || {
            caches_settled(replica, own, leads, SHARDS.len())
        })
        .await;
        eprintln!("{} (leading: {leads}) caches: {caches:?}", replica.id);
    }

    // The leader dies without releasing anything: another replica takes the lead and starts
    // the sharder's informers, and the dead shard's Foos move to the two survivors.
    let dead = replicas.iter().position(|r| r.id == leader).unwrap();
    drop(replicas.remove(dead));
    let survivors: Vec<&str> = replicas.iter().map(|r| r.id).collect();
    let started = Instant::now();
    let assignment = eventually("the dead shard's Foos to move", Duration::from_secs(90), || {
        assigned(&client, &survivors)
    })
    .await;
    let new_leader = lease_holder(&client).await.unwrap();
    assert!(survivors.contains(&new_leader.as_str()), "{new_leader} leads");
    eprintln!("failover to {new_leader}: Foos reassigned in {:.1?}", started.elapsed());
    let mut share = BTreeMap::<&str, usize>::new();
    for shard in assignment.values() {
        *share.entry(shard.as_str()).or_default() += 1;
    }
    // The dead shard's Lease is deleted by the new leader's sharder once it has been expired
    // for the grace (twice the lease duration of 15 s).
    let leases = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    let selector = format!("{RING_LABEL}={RING}");
    eventually(
        "the dead shard's Lease to be deleted",
        Duration::from_secs(90),
        || async {
            let names: Vec<String> = leases
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?
                .items
                .iter()
                .map(|lease| lease.name_any())
                .collect();
            if names.len() == replicas.len() {
                Ok(())
            } else {
                Err(format!("shard Leases {names:?}"))
            }
        },
    )
    .await;
    eprintln!(
        "the dead shard's Lease deleted {:.1?} after the kill",
        started.elapsed()
    );
    for replica in &replicas {
        let own = share.get(replica.id).copied().unwrap_or(0);
        let leads = replica.id == new_leader;
        eventually("the survivors' caches to settle", Duration::from_secs(30), || {
            caches_settled(replica, own, leads, replicas.len())
        })
        .await;
    }
    drop(replicas);
    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
