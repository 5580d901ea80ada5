//! The priority queue over envtest: after a start with a backlog of existing objects (all enqueued
//! by the initial list, at low priority), a changed object is reconciled before the backlog;
//! with the priority queue switched off it waits behind it. A requeue and a failed reconcile's
//! retry keep the key's low priority; a key a user adds at a higher priority overtakes a backlog
//! at priority 0. Orders and counts only, no timing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{configmap, envtest_with_factory, eventually, sample};
use controller::{
    Action, BoxError, Context, Controller, ControllerError, Metrics, ObjectKey, Request, WorkQueue, reconciler_fn,
};
use informer_core::Indexer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use workqueue::ItemExponentialFailureRateLimiter;

const WAIT: Duration = Duration::from_secs(60);
const BACKLOG: usize = 300;

/// What the reconciles saw, in order: the name and the ConfigMap's `data.value`.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// How the first reconcile ends once the test lets it go.
#[derive(Clone, Copy, PartialEq)]
enum First {
    /// Asks to be requeued at once (`RequeueAfter(0)`).
    Requeue,
    /// Fails: retried rate-limited (by a limiter without delay here, so only the priority orders
    /// the retry).
    Fail,
    /// Done.
    Done,
}

/// A one-worker controller over `BACKLOG` existing ConfigMaps (all queued by the initial list)
/// whose first reconcile holds the worker until `release`.
struct Held {
    env: envtest::Server,
    /// The controller's name, its queue's.
    name: String,
    cms: Api<ConfigMap>,
    /// The controller's cache (the informer the controller shares).
    cache: Indexer<ConfigMap>,
    seen: Seen,
    gate: Arc<Semaphore>,
    queue: WorkQueue,
    registry: prometheus::Registry,
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), ControllerError>>,
}

impl Held {
    /// Creates the backlog, starts the controller and waits until its first reconcile holds
    /// the worker with the rest of the backlog queued behind it.
    async fn start(name: &str, use_priority_queue: bool, first: First) -> Held {
        let (env, factory) = envtest_with_factory().await;
        let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
        // Names sort as they are created, so the initial list is in name order.
        for i in 0..BACKLOG {
            cms.create(
                &PostParams::default(),
                &configmap("default", &format!("cm-{i:04}"), "old"),
            )
            .await
            .unwrap();
        }
        let seen: Seen = Arc::default();
        // The first reconcile holds the only worker until the test adds a permit.
        let gate = Arc::new(Semaphore::new(0));
        let cache = factory.informer_for::<ConfigMap>().unwrap().indexer().clone();
        let reconciler = reconciler_fn({
            let (seen, gate, cache) = (seen.clone(), gate.clone(), cache.clone());
            move |req: Request, _ctx: Context<ConfigMap>| {
                let (seen, gate, cache) = (seen.clone(), gate.clone(), cache.clone());
                async move {
                    let value = cache
                        .get_by_key(&format!("default/{}", req.name))
                        .and_then(|cm| cm.data.as_ref()?.get("value").cloned())
                        .unwrap_or_default();
                    let is_first = {
                        let mut seen = seen.lock().unwrap();
                        seen.push((req.name.clone(), value));
                        seen.len() == 1
                    };
                    if !is_first {
                        return Ok(Action::Done);
                    }
                    gate.acquire().await.unwrap().forget();
                    match first {
                        // A requeue or a retry keeps the priority the key came with: the
                        // initial list's.
                        First::Requeue => Ok::<_, BoxError>(Action::RequeueAfter(Duration::ZERO)),
                        First::Fail => Err(BoxError::from("the first reconcile fails")),
                        First::Done => Ok(Action::Done),
                    }
                }
            }
        });
        let registry = prometheus::Registry::new();
        let built = Controller::new(name, &factory)
            .metrics(Metrics::new(&registry).unwrap())
            .for_resource::<ConfigMap>()
            .workers(1)
            .use_priority_queue(use_priority_queue)
            // No backoff: a failed key is added back at once, where its priority puts it.
            .rate_limiter(ItemExponentialFailureRateLimiter::new(Duration::ZERO, Duration::ZERO))
            .build(reconciler)
            .unwrap();
        assert_eq!(built.queue().is_priority_queue(), use_priority_queue);
        let queue = built.queue().clone();
        let shutdown = CancellationToken::new();
        factory.start(&shutdown);
        let run = tokio::spawn(built.run(shutdown.clone()));

        eventually(WAIT, "the first reconcile holds the worker", || {
            let n = seen.lock().unwrap().len();
            async move { n == 1 }
        })
        .await;
        assert_eq!(queue.len(), BACKLOG - 1, "the initial list is queued behind it");
        let held = Held {
            env,
            name: name.to_owned(),
            cms,
            cache,
            seen,
            gate,
            queue,
            registry,
            shutdown,
            run,
        };
        if use_priority_queue {
            assert_eq!(
                held.depth("-100"),
                (BACKLOG - 1) as f64,
                "the initial list is queued at low priority"
            );
        }
        held
    }

    /// `workqueue_depth` of the controller's queue (named after it) at `priority`.
    fn depth(&self, priority: &str) -> f64 {
        let series = format!(r#"workqueue_depth{{name="{}",priority="{priority}"}}"#, self.name);
        sample(&common::gather(&self.registry), &series)
    }

    /// Lets the first reconcile go and waits for `reconciles` reconciles in all; returns the
    /// names and values they saw, in order.
    async fn release(&self, reconciles: usize) -> Vec<(String, String)> {
        self.gate.add_permits(1);
        eventually(WAIT, "the backlog is reconciled", || {
            let n = self.seen.lock().unwrap().len();
            async move { n == reconciles }
        })
        .await;
        self.seen.lock().unwrap().clone()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.run.await.unwrap().unwrap();
        self.env.shutdown().await;
    }
}

/// Changes the last ConfigMap of the list while the backlog is queued behind the first
/// reconcile, lets the worker go, and returns how many reconciles came before the first that
/// saw the change. The first reconcile asks to be requeued at once: at the low priority it came
/// with, it is reconciled again last, after the whole backlog.
async fn reconciles_before_the_change(use_priority_queue: bool) -> usize {
    let held = Held::start("backlog", use_priority_queue, First::Requeue).await;
    let changed = format!("cm-{:04}", BACKLOG - 1);
    let patch = serde_json::json!({ "data": { "value": "new" } });
    held.cms
        .patch(&changed, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    if use_priority_queue {
        // The update raised the queued key to priority 0.
        eventually(WAIT, "the change is queued at priority 0", || {
            let depth = held.depth("0");
            async move { depth == 1.0 }
        })
        .await;
    } else {
        // The FIFO queue merges the update with the queued key: wait only for the cache, so the
        // key's reconcile sees the change wherever it is in line.
        eventually(WAIT, "the cache has the change", || {
            let value = held
                .cache
                .get_by_key(&format!("default/{changed}"))
                .and_then(|cm| cm.data.as_ref()?.get("value").cloned());
            async move { value.as_deref() == Some("new") }
        })
        .await;
    }
    let seen = held.release(BACKLOG + 1).await;
    assert_eq!(seen[0].0, "cm-0000");
    assert_eq!(seen[BACKLOG].0, "cm-0000", "the requeue came last, behind the backlog");
    let position = seen.iter().position(|(_, value)| value == "new").unwrap();
    assert_eq!(seen[position].0, changed);
    held.stop().await;
    position
}

#[tokio::test]
async fn a_change_overtakes_the_initial_list_with_the_priority_queue() {
    let before = reconciles_before_the_change(true).await;
    // Only the reconcile that held the worker came first.
    assert_eq!(before, 1, "the change waited behind {before} reconciles");
}

#[tokio::test]
async fn a_change_waits_behind_the_initial_list_with_the_fifo_queue() {
    // The control: the same start without the priority queue reconciles the change at its place
    // in the initial list, the last.
    let before = reconciles_before_the_change(false).await;
    assert_eq!(before, BACKLOG - 1);
}

/// A reconcile that fails is retried at the priority its key came with, as controller-runtime's
/// reconcile handler does: the first key of the initial list (low priority), retried without
/// backoff, lands behind the rest of the initial list, not ahead of it.
#[tokio::test]
async fn a_failed_reconcile_is_retried_at_the_priority_it_came_with() {
    let held = Held::start("failing", true, First::Fail).await;
    let seen = held.release(BACKLOG + 1).await;
    assert_eq!(seen[0].0, "cm-0000");
    assert_eq!(
        seen[1].0, "cm-0001",
        "the retry did not overtake the low-priority backlog"
    );
    assert_eq!(seen[BACKLOG].0, "cm-0000", "the retry came last, behind the backlog");
    held.stop().await;
}

/// A user may add a key at any priority through the built controller's queue: a key added at
/// priority 10 overtakes a backlog of keys at priority 0, although it was added last.
#[tokio::test]
async fn a_key_added_at_a_higher_priority_overtakes_a_normal_backlog() {
    let held = Held::start("user-priority", true, First::Done).await;
    // The user raises the whole queued backlog to priority 0, in name order.
    for i in 1..BACKLOG {
        held.queue.add(ObjectKey::namespaced("default", format!("cm-{i:04}")));
    }
    assert_eq!(held.depth("0"), (BACKLOG - 1) as f64, "the backlog is at priority 0");
    let urgent = format!("cm-{:04}", BACKLOG - 1);
    held.queue
        .add_with_priority(ObjectKey::namespaced("default", &urgent), 10);
    assert_eq!(held.depth("10"), 1.0);
    let seen = held.release(BACKLOG).await;
    let order: Vec<&str> = seen.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(order[..3], ["cm-0000", urgent.as_str(), "cm-0001"]);
    held.stop().await;
}
