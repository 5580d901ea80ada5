//! replicaset-lite over envtest: a Manager in-process runs the controller and the fake kubelet;
//! the tests drive ReplicaSets through the API and check the Pods, the status, the Pod index,
//! and, from envtest's request log, that no Pod is ever created or deleted twice, also while
//! the Pod informer lags the controller's writes. The last tests run the binary end to end.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use examples::demo::{Instrumented, Stats};
use examples::replicaset_lite::{
    self, ControllerExpectations, POD_CONTROLLER_UID_INDEX, PodWrites, ReplicaCounts, ReplicaSetController, WriteCounts,
};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kinformer::controller::{Manager, ManagerError};
use kinformer::factory::SharedInformerFactory;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const PODS: &str = "/api/v1/namespaces/default/pods";

/// Polls `cond` every 20 ms until it holds; fails the test after 60 s.
async fn eventually<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// envtest, and a Manager running replicaset-lite and the fake kubelet on it.
struct Harness {
    env: envtest::Server,
    client: Client,
    factory: SharedInformerFactory,
    writes: PodWrites,
    expectations: ControllerExpectations,
    expectation_waits: Arc<std::sync::atomic::AtomicUsize>,
    stats: Stats,
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), ManagerError>>,
}

impl Harness {
    async fn start() -> Harness {
        Self::start_with_pod_lag(Duration::ZERO).await
    }

    /// With a non-zero `lag`, every Pod event waits `lag` before it enters the Pod informer,
    /// one after the other (the informer's transform blocks its reflector): the cache falls
    /// behind the controller's own writes, as a slow watch makes it.
    async fn start_with_pod_lag(lag: Duration) -> Harness {
        // RUST_LOG=debug shows the controller's logs of a failing test.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
        let client = env.client();
        let mut factory = SharedInformerFactory::builder(client.clone()).strip_managed_fields(true);
        if !lag.is_zero() {
            factory = factory.transform::<Pod>(move |pod| {
                tokio::task::block_in_place(|| std::thread::sleep(lag));
                pod
            });
        }
        let factory = factory.build();
        let mut manager = Manager::builder(client.clone())
            .factory(factory.clone())
            .no_http_servers()
            .handle_signals(false)
            .build()
            .unwrap();
        let reconciler = ReplicaSetController::new(&factory).unwrap();
        let (writes, expectations) = (reconciler.writes(), reconciler.expectations());
        let expectation_waits = reconciler.expectation_waits();
        let stats = Stats::default();
        let instrumented = Instrumented {
            inner: reconciler,
            stats: stats.clone(),
            verbose: false,
        };
        manager.add(replicaset_lite::controller(&manager, expectations.clone(), instrumented).unwrap());
        manager.add(replicaset_lite::fake_kubelet(&factory).unwrap());
        let status = manager.status();
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(manager.run(shutdown.clone()));
        eventually("the manager's caches to sync", || async { status.is_ready() }).await;
        Harness {
            env,
            client,
            factory,
            writes,
            expectations,
            expectation_waits,
            stats,
            shutdown,
            run,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.run.await.unwrap().unwrap();
        self.env.shutdown().await;
    }

    fn replicasets(&self) -> Api<ReplicaSet> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn create(&self, name: &str, replicas: i32) -> ReplicaSet {
        self.replicasets()
            .create(&PostParams::default(), &replicaset(name, replicas))
            .await
            .unwrap()
    }

    async fn scale(&self, name: &str, replicas: i32) {
        let patch = serde_json::json!({"spec": {"replicas": replicas}});
        self.replicasets()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// The live Pods `rs` controls, from the API server. Listed cluster-wide, so a fault
    /// injected under [`PODS`] hits only the controller's and the kubelet's requests.
    async fn owned_pods(&self, rs: &ReplicaSet) -> Vec<Pod> {
        let uid = rs.uid().unwrap();
        Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|r| r.controller == Some(true) && r.uid == uid)
            })
            .collect()
    }

    /// Whether `name` has exactly `replicas` Running and Ready Pods and a status saying so for
    /// its current generation.
    async fn converged(&self, name: &str, replicas: i32) -> bool {
        let Some(rs) = self.replicasets().get_opt(name).await.unwrap() else {
            return false;
        };
        let owned = self.owned_pods(&rs).await;
        let running = owned.iter().all(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") && replicaset_lite::is_ready(p)
        });
        let expected = ReplicaCounts {
            replicas,
            fully_labeled_replicas: replicas,
            ready_replicas: replicas,
            available_replicas: replicas,
            observed_generation: rs.metadata.generation.unwrap(),
        };
        owned.len() == replicas as usize && running && ReplicaCounts::reported(&rs) == Some(expected)
    }

    async fn wait_converged(&self, name: &str, replicas: i32) {
        eventually(&format!("{name} to converge to {replicas} replicas"), || {
            self.converged(name, replicas)
        })
        .await;
    }

    /// As [`wait_converged`](Self::wait_converged), changing an annotation of the ReplicaSet
    /// before each look, so it is reconciled again and again meanwhile. Fails as soon as the
    /// server has received more than `max_posts` Pod creations or `max_deletes` deletions.
    async fn wait_converged_while_poked(&self, name: &str, replicas: i32, max_posts: usize, max_deletes: usize) {
        let mut pokes = 0u32;
        eventually(
            &format!("{name} to converge to {replicas} replicas while poked"),
            || {
                pokes += 1;
                let patch = serde_json::json!({"metadata": {"annotations": {"poke": pokes.to_string()}}});
                async move {
                    self.replicasets()
                        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .unwrap();
                    let (posts, deletes) = (self.pod_posts(), self.pod_deletes());
                    assert!(posts <= max_posts, "{posts} Pod creations, at most {max_posts} needed");
                    assert!(
                        deletes <= max_deletes,
                        "{deletes} Pod deletions, at most {max_deletes} needed"
                    );
                    self.converged(name, replicas).await
                }
            },
        )
        .await;
    }

    /// Pod creations the server received (failed ones included).
    fn pod_posts(&self) -> usize {
        self.env
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == PODS)
            .count()
    }

    /// Pod deletions the server received.
    fn pod_deletes(&self) -> usize {
        self.env
            .requests()
            .iter()
            .filter(|r| r.method == "DELETE" && r.path.starts_with(&format!("{PODS}/")) && !r.path.ends_with("/status"))
            .count()
    }
}

fn replicaset(name: &str, replicas: i32) -> ReplicaSet {
    replicaset_lite::example_replicaset(name, replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_converge_to_the_replicas_and_the_status_reports_them_ready() {
    let h = Harness::start().await;
    let rs = h.create("web", 3).await;
    h.wait_converged("web", 3).await;

    let pods = h.owned_pods(&rs).await;
    for pod in &pods {
        let name = pod.name_any();
        let suffix = name
            .strip_prefix("web-")
            .unwrap_or_else(|| panic!("{name} is not web-<suffix>"));
        assert_eq!(suffix.len(), 5, "{name}");
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("web"));
        let owner = &pod.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("ReplicaSet", "web"));
        assert_eq!(owner.block_owner_deletion, Some(true));
    }
    let status = h.replicasets().get("web").await.unwrap().status.unwrap();
    assert_eq!(status.replicas, 3);
    assert_eq!(status.ready_replicas, Some(3));
    assert_eq!(status.available_replicas, Some(3));
    assert_eq!(status.fully_labeled_replicas, Some(3));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 3, deleted: 0 });
    assert_eq!(h.pod_posts(), 3);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scaling_up_and_down_creates_and_deletes_only_the_difference() {
    let h = Harness::start().await;
    h.create("web", 2).await;
    h.wait_converged("web", 2).await;

    h.scale("web", 5).await;
    h.wait_converged("web", 5).await;
    assert_eq!(h.replicasets().get("web").await.unwrap().metadata.generation, Some(2));
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 5, deleted: 0 });

    h.scale("web", 1).await;
    h.wait_converged("web", 1).await;
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 5, deleted: 4 });
    assert_eq!((h.pod_posts(), h.pod_deletes()), (5, 4));

    h.scale("web", 0).await;
    h.wait_converged("web", 0).await;
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 5, deleted: 5 });
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_deleted_behind_the_controllers_back_is_replaced() {
    let h = Harness::start().await;
    let rs = h.create("web", 2).await;
    h.wait_converged("web", 2).await;
    let before: BTreeSet<String> = h.owned_pods(&rs).await.iter().map(|p| p.name_any()).collect();
    let victim = before.first().unwrap().clone();

    h.pods().delete(&victim, &DeleteParams::default()).await.unwrap();
    h.wait_converged("web", 2).await;
    let after: BTreeSet<String> = h.owned_pods(&rs).await.iter().map(|p| p.name_any()).collect();
    assert!(!after.contains(&victim));
    assert_eq!(
        after.difference(&before).count(),
        1,
        "one replacement: {before:?} → {after:?}"
    );
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 3, deleted: 0 });
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expectations_prevent_double_creation_and_deletion_while_the_pod_informer_lags() {
    // Each Pod event reaches the cache 150 ms late, one after the other: after the controller
    // creates 6 Pods, its cache shows all of them only about a second later. Meanwhile the
    // test keeps touching the ReplicaSet, so reconciles keep coming while the cache lags; each
    // must see the expectations pending and leave the Pods alone.
    let h = Harness::start_with_pod_lag(Duration::from_millis(150)).await;
    h.create("web", 6).await;
    h.wait_converged_while_poked("web", 6, 6, 0).await;
    assert_eq!(h.pod_posts(), 6, "every Pod created exactly once");
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 6, deleted: 0 });
    assert!(
        h.expectation_waits.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "some reconciles ran while the expectations were pending: {:?}",
        h.stats.summary()
    );

    h.scale("web", 2).await;
    h.wait_converged_while_poked("web", 2, 6, 4).await;
    assert_eq!(h.pod_deletes(), 4, "every surplus Pod deleted exactly once");
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 6, deleted: 4 });
    assert_eq!(h.pod_posts(), 6);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_create_lowers_the_expectations_and_is_retried() {
    let h = Harness::start().await;
    // The first request under the Pods path is the controller's first create (no Pod exists
    // for the kubelet to update yet): it fails, the slow-start burst stops there, and the
    // three expected creations are given up at once instead of waiting 5 minutes.
    h.env.faults().fail_next(PODS, 500, 1, 0);
    h.create("web", 3).await;
    h.wait_converged("web", 3).await;
    assert_eq!(h.pod_posts(), 4, "one failed create, then three");
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 3, deleted: 0 });
    assert!(h.stats.summary().errors >= 1, "{:?}", h.stats.summary());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pod_index_returns_exactly_each_replicasets_pods() {
    let h = Harness::start().await;
    let a = h.create("a", 2).await;
    let b = h.create("b", 3).await;
    // Labelled as a's Pods, but no controller owns it: the lite controller does not adopt.
    let orphan = Pod {
        metadata: ObjectMeta {
            name: Some("orphan".into()),
            labels: Some([("app".to_string(), "a".to_string())].into()),
            ..ObjectMeta::default()
        },
        spec: replicaset("a", 1).spec.unwrap().template.unwrap().spec,
        status: None,
    };
    h.pods().create(&PostParams::default(), &orphan).await.unwrap();
    h.wait_converged("a", 2).await;
    h.wait_converged("b", 3).await;

    let index = h.factory.core().v1().pods().unwrap().informer().indexer().clone();
    for rs in [&a, &b] {
        let from_api: BTreeSet<String> = h.owned_pods(rs).await.iter().map(|p| p.name_any()).collect();
        let uid = rs.uid().unwrap();
        eventually(&format!("the index to serve {}'s Pods", rs.name_any()), || {
            let from_index: BTreeSet<String> = index
                .by_index(POD_CONTROLLER_UID_INDEX, &uid)
                .unwrap()
                .iter()
                .map(|p| p.name_any())
                .collect();
            let same = from_index == from_api;
            async move { same }
        })
        .await;
        assert!(!from_api.contains("orphan"));
    }
    assert_eq!(h.owned_pods(&a).await.len(), 2, "the orphan was not counted");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_replicasets_pods_are_garbage_collected_and_its_expectations_forgotten() {
    let h = Harness::start().await;
    let rs = h.create("web", 3).await;
    h.wait_converged("web", 3).await;
    assert!(h.expectations.pending("default/web").is_some());

    h.replicasets().delete("web", &DeleteParams::default()).await.unwrap();
    eventually("web's Pods to be garbage-collected", || async {
        h.owned_pods(&rs).await.is_empty()
    })
    .await;
    eventually("web's expectations to be forgotten", || async {
        h.expectations.pending("default/web").is_none()
    })
    .await;
    assert_eq!(h.writes.get("default/web"), WriteCounts { created: 3, deleted: 0 });
    h.stop().await;
}

#[test]
fn the_demo_binary_converges_without_double_creation() {
    let out = Command::new(env!("CARGO_BIN_EXE_replicaset-lite"))
        .args(["--embedded", "--quiet", "--timeout", "90"])
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{stderr}", out.status);
    for line in [
        "▸ caches synced",
        "converged: 2 ReplicaSets (rs-1 ×4, rs-2 ×2), every Pod Running and Ready, status reported",
        "garbage-collected: the Pods of ReplicaSet rs-3",
        "pods: 10 created for 10 needed, 2 deleted for 2 needed; never more Pods than replicas",
        "RESULT: converged in",
        "│ Pods created             │       10 │",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    assert!(
        !stdout.contains("  reconcile "),
        "--quiet prints no reconcile lines:\n{stdout}"
    );
}

#[test]
fn the_demo_binary_fails_with_a_message_when_it_cannot_converge_in_time() {
    let out = Command::new(env!("CARGO_BIN_EXE_replicaset-lite"))
        .args(["--embedded", "--quiet", "--timeout", "0"])
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("replicaset-lite: did not converge: timed out waiting for"),
        "{stderr}"
    );
}
