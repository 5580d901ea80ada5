//! The controller's ownership of its tasks, without an API server: the informers are never
//! started, so the controller waits for its caches until the shutdown token fires.

use envtest::logs::Logs;
use envtest::tasks::{alive_tasks, until_alive};
use k8s_openapi::api::core::v1::ConfigMap;

use super::*;
use crate::{Controller, reconciler_fn};

/// A factory whose client points nowhere (its informers are never started).
fn factory() -> SharedInformerFactory {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    SharedInformerFactory::new(kube::Client::try_from(config).unwrap(), Duration::ZERO)
}

#[tokio::test(flavor = "current_thread")]
async fn a_stopped_controller_leaves_no_task_running() {
    let factory = factory();
    let before = alive_tasks();
    let (keys, signals) = futures::channel::mpsc::unbounded::<ObjectKey>();
    let controller = Controller::new("owned", &factory)
        .for_resource::<ConfigMap>()
        .reconcile_on(signals)
        .reconcile_all_on(futures::stream::pending::<()>())
        .build(reconciler_fn(|_, _: Context<ConfigMap>| async {
            Ok::<_, kube::Error>(Action::Done)
        }))
        .unwrap();
    assert!(alive_tasks() > before, "the triggers' tasks and the queue's timer run");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(controller.run(shutdown.clone()));
    tokio::task::yield_now().await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        alive_tasks(),
        before,
        "every task of the controller (and its run) joined"
    );
    drop(keys);
}

#[tokio::test(flavor = "current_thread")]
async fn a_panicking_trigger_is_logged_with_the_controller_and_the_trigger() {
    let logs = Logs::default();
    let _default = logs.set_default(tracing::Level::INFO);
    let factory = factory();
    let before = alive_tasks();
    let bomb = futures::stream::poll_fn(|_| -> std::task::Poll<Option<ObjectKey>> { panic!("trigger boom") });
    let controller = Controller::new("bombed", &factory)
        .for_resource::<ConfigMap>()
        .reconcile_on(bomb)
        .build(reconciler_fn(|_, _: Context<ConfigMap>| async {
            Ok::<_, kube::Error>(Action::Done)
        }))
        .unwrap();
    let spawned = alive_tasks() - before;
    assert_eq!(
        until_alive(before + spawned - 1).await,
        before + spawned - 1,
        "the trigger's task ended"
    );
    let text = logs.text();
    let line = text.lines().find(|l| l.contains("trigger task panicked")).expect(&text);
    assert!(
        line.contains("ERROR")
            && line.contains("controller=bombed")
            && line.contains("trigger=\"reconcile_on\"")
            && line.contains("trigger boom"),
        "{line}"
    );
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    controller.run(shutdown).await.unwrap();
    assert_eq!(alive_tasks(), before);
}
