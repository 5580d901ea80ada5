//! A reconcile that loses a race with the informer cache (the API server answers a write with
//! 409 or 404) is a requeue, not an error: counted as `result="requeue"`, retried rate-limited,
//! not shown to the error policy; a real API error beside it stays an error. Over envtest, with
//! the API server's own answers.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Calls, RecordingLimiter, configmap, create_configmaps, envtest_with_factory, eventually, gather, sample};
use controller::{Action, Context, Controller, ObjectKey, Request, reconciler_fn};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use tokio_util::sync::CancellationToken;
use workqueue::ItemExponentialFailureRateLimiter;

const WAIT: Duration = Duration::from_secs(20);

/// A reconciler's error that prints its source (as `#[error("{0}")]` wrappers do).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SyncError(#[source] kube::Error);

fn result(registry: &prometheus::Registry, result: &str) -> f64 {
    let series = format!(r#"controller_runtime_reconcile_total{{controller="stale",result="{result}"}}"#);
    sample(&gather(registry), &series)
}

#[tokio::test]
async fn a_conflict_or_not_found_from_the_server_is_a_requeue_and_a_real_error_stays_an_error() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let calls = Calls::default();
    let reconciler = {
        let calls = calls.clone();
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let n = calls.record(&req.name);
            let api = api.clone();
            async move {
                if n > 1 {
                    return Ok(Action::Done);
                }
                let answer = match req.name.as_str() {
                    // 409 AlreadyExists: the object exists (the cache had not shown it yet).
                    "exists" => api
                        .create(&PostParams::default(), &configmap("default", "exists", "again"))
                        .await
                        .map(drop),
                    // 404 NotFound: the object went away meanwhile.
                    "gone" => api.delete("never-created", &DeleteParams::default()).await.map(drop),
                    // 422 Invalid: a real error (the control).
                    _ => api
                        .create(&PostParams::default(), &configmap("default", "Not_A_Name", "x"))
                        .await
                        .map(drop),
                };
                answer.map_err(SyncError)?;
                Ok::<_, SyncError>(Action::Done)
            }
        })
    };
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let limiter = RecordingLimiter::new(ItemExponentialFailureRateLimiter::<ObjectKey>::new(
        Duration::from_millis(5),
        Duration::from_secs(1000),
    ));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let seen = seen.clone();
        Controller::new("stale", &factory)
            .metrics(controller::Metrics::new(&registry).unwrap())
            .for_resource::<ConfigMap>()
            .rate_limiter(limiter.clone())
            .error_policy(move |_err, req, _ctx| {
                seen.lock().unwrap().push(req.name.clone());
                Action::Requeue
            })
            .run(reconciler, shutdown.clone())
    });
    create_configmaps(&client, &["exists", "gone", "invalid"]).await;
    eventually(WAIT, "every key failed once and then reconciled", || {
        let done = ["exists", "gone", "invalid"]
            .iter()
            .all(|name| calls.times(name).len() >= 2);
        async move { done }
    })
    .await;
    // The races: requeued rate-limited (a backoff step, then the success's forget).
    for name in ["exists", "gone"] {
        assert_eq!(limiter.of(name), [Some(Duration::from_millis(5)), None], "{name}");
    }
    // Only the real error reaches the error policy and the error counters.
    assert_eq!(*seen.lock().unwrap(), ["invalid"]);
    assert_eq!(result(&registry, "requeue"), 2.0);
    assert_eq!(result(&registry, "error"), 1.0);
    let errors = sample(
        &gather(&registry),
        r#"controller_runtime_reconcile_errors_total{controller="stale"}"#,
    );
    assert_eq!(errors, 1.0);
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}
