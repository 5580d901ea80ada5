//! The priority queue over envtest: after a start with a backlog of existing objects (all enqueued
//! by the initial list, at low priority), a changed object is reconciled before the backlog;
//! with the priority queue switched off it waits behind it. A requeue keeps the key's low
//! priority. Orders and counts only, no timing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{configmap, envtest_with_factory, eventually, sample};
use controller::{Action, BoxError, Context, Controller, Metrics, Request, reconciler_fn};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);
const BACKLOG: usize = 300;

/// What the reconciles saw, in order: the name and the ConfigMap's `data.value`.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Starts a one-worker controller over `BACKLOG` existing ConfigMaps whose first reconcile waits
/// for the test; changes the last ConfigMap of the list while the backlog is queued, lets the
/// worker go, and returns how many reconciles came before the first that saw the change. The
/// first reconcile asks to be requeued at once: at the low priority it came with, it is
/// reconciled again last, after the whole backlog.
async fn reconciles_before_the_change(use_priority_queue: bool) -> usize {
    let (env, factory) = envtest_with_factory().await;
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    // Names sort as they are created, so the initial list ends with the one we change.
    for i in 0..BACKLOG {
        cms.create(
            &PostParams::default(),
            &configmap("default", &format!("cm-{i:04}"), "old"),
        )
        .await
        .unwrap();
    }
    let changed = format!("cm-{:04}", BACKLOG - 1);

    let seen: Seen = Arc::default();
    // The first reconcile holds the only worker until the test adds a permit.
    let gate = Arc::new(Semaphore::new(0));
    // The controller's cache, read through the informer the controller shares.
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
                let first = {
                    let mut seen = seen.lock().unwrap();
                    seen.push((req.name.clone(), value));
                    seen.len() == 1
                };
                if first {
                    gate.acquire().await.unwrap().forget();
                    // A requeue: it keeps the priority the key came with, the initial list's.
                    return Ok::<_, BoxError>(Action::RequeueAfter(Duration::ZERO));
                }
                Ok(Action::Done)
            }
        }
    });
    let registry = prometheus::Registry::new();
    let built = Controller::new("backlog", &factory)
        .metrics(Metrics::new(&registry).unwrap())
        .for_resource::<ConfigMap>()
        .workers(1)
        .use_priority_queue(use_priority_queue)
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
    if use_priority_queue {
        let depth = sample(
            &common::gather(&registry),
            r#"workqueue_depth{name="backlog",priority="-100"}"#,
        );
        assert_eq!(
            depth,
            (BACKLOG - 1) as f64,
            "the initial list is queued at low priority"
        );
    }

    let patch = serde_json::json!({ "data": { "value": "new" } });
    cms.patch(&changed, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    if use_priority_queue {
        // The update raised the queued key to priority 0.
        eventually(WAIT, "the change is queued at priority 0", || {
            let depth = sample(
                &common::gather(&registry),
                r#"workqueue_depth{name="backlog",priority="0"}"#,
            );
            async move { depth == 1.0 }
        })
        .await;
    } else {
        // The FIFO queue merges the update with the queued key: wait only for the cache, so the
        // key's reconcile sees the change wherever it is in line.
        eventually(WAIT, "the cache has the change", || {
            let value = cache
                .get_by_key(&format!("default/{changed}"))
                .and_then(|cm| cm.data.as_ref()?.get("value").cloned());
            async move { value.as_deref() == Some("new") }
        })
        .await;
    }
    gate.add_permits(1);

    eventually(WAIT, "the backlog and the requeue are reconciled", || {
        let n = seen.lock().unwrap().len();
        async move { n == BACKLOG + 1 }
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0].0, "cm-0000");
    assert_eq!(seen[BACKLOG].0, "cm-0000", "the requeue came last, behind the backlog");
    let position = seen.iter().position(|(_, value)| value == "new").unwrap();
    assert_eq!(seen[position].0, changed);
    shutdown.cancel();
    run.await.unwrap().unwrap();
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
