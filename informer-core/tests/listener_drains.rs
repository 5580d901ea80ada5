//! A listener's drain that dies of a panic, over envtest: the informer keeps delivering to the
//! handler and its shutdown returns (the dead drain neither wedges the listener nor is lost).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use informer_core::{ApiListerWatcher, HandlerOptions, InformerConfig, ResourceEventHandlerFuncs, SharedIndexInformer};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

/// A panic payload whose drop panics too: dropped after the listener's guard caught the
/// handler's panic, it unwinds the drain task itself.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("the payload's drop panicked");
        }
    }
}

async fn create(api: &Api<ConfigMap>, name: &str) {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    api.create(&PostParams::default(), &cm).await.unwrap();
}

#[tokio::test]
async fn a_drain_killed_by_a_panic_neither_stops_delivery_nor_wedges_shutdown() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let informer = SharedIndexInformer::<ConfigMap>::new(
        ApiListerWatcher::<ConfigMap>::new(Api::namespaced(client.clone(), "default")),
        InformerConfig::default(),
    );
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = seen.clone();
    for non_blocking in [true, false] {
        let sink = sink.clone();
        let options = HandlerOptions::default().name(if non_blocking { "async" } else { "blocking" });
        let options = if non_blocking { options.non_blocking() } else { options };
        informer
            .add_event_handler_with_options(
                ResourceEventHandlerFuncs::default().on_add(move |cm: &Arc<ConfigMap>, _| {
                    let name = cm.metadata.name.clone().unwrap_or_default();
                    if name == "bomb" {
                        std::panic::panic_any(Bomb);
                    }
                    sink.lock()
                        .unwrap()
                        .push(format!("{}:{name}", if non_blocking { "async" } else { "blocking" }));
                }),
                options,
            )
            .unwrap();
    }
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (informer, shutdown) = (informer.clone(), shutdown.clone());
        async move { informer.run(shutdown).await }
    });
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    create(&api, "bomb").await;
    create(&api, "after").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = seen.lock().unwrap().clone();
        if got.contains(&"async:after".to_string()) && got.contains(&"blocking:after".to_string()) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "after never delivered: {got:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats = informer.stats();
    assert!(stats.listeners.iter().all(|l| l.handler_panics == 1), "{stats:?}");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the informer's run returned: a dead drain does not wedge the listener")
        .unwrap();
    assert!(informer.is_stopped());
    env.shutdown().await;
}
