//! The controller's shutdown line counts the reconciles it aborts, not its worker tasks. Alone in
//! its test binary: it installs the process's global `tracing` subscriber to read the line.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{configmap, envtest_with_factory, eventually};
use controller::{Action, Context, Controller, Request, reconciler_fn};
use envtest::logs::Logs;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn stop_now_logs_the_reconciles_in_flight_not_the_workers() {
    // Four workers: one in a reconcile that never ends, three waiting for a key. The shutdown
    // line counts the one reconcile it aborts.
    let logs = Logs::default();
    logs.set_global_default(tracing::Level::WARN).unwrap();
    let (env, factory) = envtest_with_factory().await;
    let started: Arc<Mutex<Vec<String>>> = Arc::default();
    let reconciler = {
        let started = started.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            started.lock().unwrap().push(req.name.clone());
            async move {
                std::future::pending::<()>().await;
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        })
    };
    let built = Controller::new("stopped", &factory)
        .for_resource::<ConfigMap>()
        .workers(4)
        .build(reconciler)
        .unwrap();
    let (shutdown, stop_now) = (CancellationToken::new(), CancellationToken::new());
    factory.start(&shutdown);
    let run = tokio::spawn(built.run_with_stop_now(shutdown.clone(), stop_now.clone()));
    Api::<ConfigMap>::namespaced(env.client(), "default")
        .create(&PostParams::default(), &configmap("default", "held", "0"))
        .await
        .unwrap();
    eventually(WAIT, "held reconciling", || {
        let ok = started.lock().unwrap().iter().any(|name| name == "held");
        async move { ok }
    })
    .await;
    stop_now.cancel();
    let result = tokio::time::timeout(WAIT, run).await.expect("run returned").unwrap();
    assert!(result.is_ok(), "{result:?}");
    let logs = logs.text();
    let line = logs
        .lines()
        .find(|line| line.contains("stopped at once"))
        .unwrap_or_else(|| panic!("no shutdown line in:\n{logs}"));
    assert!(line.contains("controller=stopped"), "{line}");
    assert!(line.contains("in_flight=1 "), "{line}");
    shutdown.cancel();
    env.shutdown().await;
}
