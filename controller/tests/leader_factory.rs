//! The Manager's leader factory over envtest: its informers start only on the replica that
//! leads, before the runnables that need leader election (which find their caches synced); a
//! standby, ready on its own factory's caches, has not listed them at all; when the leader
//! steps down, the next one starts them. `/metrics` exports them with the factory's.
//!
//! Lease timing is short and real (an HTTP server cannot run under paused time): lease 2 s,
//! renew deadline 1.5 s, retry period 300 ms.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{create_configmaps, elected_manager, eventually, registry_sample, until_leading};
use controller::{LeaderElectionConfig, ManagerStatus, runnable_fn};
use informer_core::SharedIndexInformer;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

/// One replica: a Manager with leader election on `default/leader-factory-test`, a Secret
/// informer on its factory (every replica) and a ConfigMap informer on its leader factory,
/// read by a leader-election runnable that counts the objects it finds once synced.
struct Replica {
    status: ManagerStatus,
    registry: prometheus::Registry,
    leader_only: SharedIndexInformer<ConfigMap>,
    /// What the leader-election runnable found in the leader-only cache when it started
    /// (`usize::MAX`: not started).
    seen_by_runnable: Arc<AtomicUsize>,
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), controller::ManagerError>>,
}

fn start(env: &envtest::Server, identity: &str) -> Replica {
    let election = LeaderElectionConfig::new("default", "leader-factory-test", identity)
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_millis(1500))
        .retry_period(Duration::from_millis(300))
        .release_on_cancel(true);
    let mut manager = elected_manager(env.client(), election);
    manager.factory().informer_for::<Secret>().unwrap();
    let leader_only = manager.leader_factory().informer_for::<ConfigMap>().unwrap();
    let seen_by_runnable = Arc::new(AtomicUsize::new(usize::MAX));
    let (informer, seen) = (leader_only.clone(), seen_by_runnable.clone());
    manager.add(runnable_fn("reads-the-leader-cache", true, move |stop| async move {
        // Started by the Manager once leading: the leader factory's informer runs by then.
        if informer.wait_for_cache_sync(&stop).await {
            seen.store(informer.indexer().len(), Ordering::SeqCst);
        }
        stop.cancelled().await;
        Ok(())
    }));
    let shutdown = CancellationToken::new();
    Replica {
        status: manager.status(),
        registry: manager.metrics().registry().clone(),
        leader_only,
        seen_by_runnable,
        shutdown: shutdown.clone(),
        run: tokio::spawn(manager.run(shutdown)),
    }
}

impl Replica {
    /// Waits until this replica leads and its runnable (`whose` it is, in the message) found
    /// the leader-only cache synced: with the three ConfigMaps, exported, as it was synced
    /// before the runnable started.
    async fn leads_with_the_cache_synced(&self, whose: &str) {
        until_leading(WAIT, &self.status).await;
        let what = format!("{whose} runnable to find the leader-only cache synced");
        eventually(WAIT, &what, || {
            let seen = self.seen_by_runnable.load(Ordering::SeqCst);
            async move { seen != usize::MAX }
        })
        .await;
        assert_eq!(self.seen_by_runnable.load(Ordering::SeqCst), 3);
        assert_eq!(exported_configmaps(&self.registry), Some(3.0));
    }

    /// Shuts the replica down (releasing its lease if it leads); its run succeeds.
    async fn stop(self) {
        self.shutdown.cancel();
        self.run.await.unwrap().unwrap();
    }
}

/// `kinformer_informer_cached_objects` of the ConfigMap informer in `registry`.
fn exported_configmaps(registry: &prometheus::Registry) -> Option<f64> {
    registry_sample(
        registry,
        "kinformer_informer_cached_objects{informer=\"v1/ConfigMap\"} ",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_factory_informers_run_on_the_leader_only_and_start_on_takeover() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    create_configmaps(&env.client(), &["a", "b", "c"]).await;

    let first = start(&env, "first");
    first.leads_with_the_cache_synced("the leader's").await;

    // A standby: ready (its factory's caches synced), its leader-only informer never listed.
    let second = start(&env, "second");
    eventually(WAIT, "the standby to be ready", || {
        let ready = second.status.is_ready();
        async move { ready }
    })
    .await;
    assert!(!second.status.is_leader());
    let stats = second.leader_only.stats();
    assert_eq!((stats.lists, stats.synced, stats.cached_objects), (0, false, 0));
    assert_eq!(exported_configmaps(&second.registry), Some(0.0));
    assert_eq!(second.seen_by_runnable.load(Ordering::SeqCst), usize::MAX);

    // The leader steps down (its run ends, the lease released): the standby takes over and
    // starts the leader-only informers before its runnable.
    first.stop().await;
    second.leads_with_the_cache_synced("the new leader's").await;

    second.stop().await;
    env.shutdown().await;
}
