//! Bounds on what the server can make the client read: a list page or a watch event larger than
//! `ApiListerWatcher`'s limit is a typed error, read no further, and the informer goes on.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use informer_core::{ApiListerWatcher, ListWatchError, ListerWatcher};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, PostParams, WatchParams};

fn configmap(name: &str, bytes: usize) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(BTreeMap::from([("v".to_string(), "x".repeat(bytes))]));
    cm
}

async fn next(
    stream: &mut informer_core::WatchStream<ConfigMap>,
) -> Option<Result<kube::api::WatchEvent<ConfigMap>, ListWatchError>> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an item in time")
}

#[tokio::test]
async fn a_list_page_over_the_bound_is_a_typed_error() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &configmap("big", 200_000))
        .await
        .unwrap();

    let bounded = ApiListerWatcher::new(api.clone()).max_page_bytes(100_000);
    match bounded.list(&ListParams::default()).await {
        Err(ListWatchError::TooLarge { what, limit }) => assert_eq!((what, limit), ("list page", 100_000)),
        other => panic!("expected TooLarge, got {:?}", other.map(|p| p.items.len())),
    }
    let roomy = ApiListerWatcher::new(api).max_page_bytes(1_000_000);
    assert_eq!(roomy.list(&ListParams::default()).await.unwrap().items.len(), 1);
    env.shutdown().await;
}

#[tokio::test]
async fn a_watch_event_over_the_bound_ends_the_stream_with_a_typed_error_after_the_events_before_it() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let lw = ApiListerWatcher::new(api.clone()).max_event_bytes(100_000);
    let rv = lw.list(&ListParams::default()).await.unwrap().resource_version;
    let mut stream = lw.watch(&WatchParams::default().timeout(30), &rv).await.unwrap();
    api.create(&PostParams::default(), &configmap("small", 10))
        .await
        .unwrap();
    api.create(&PostParams::default(), &configmap("big", 200_000))
        .await
        .unwrap();
    api.create(&PostParams::default(), &configmap("after", 10))
        .await
        .unwrap();

    match next(&mut stream).await {
        Some(Ok(kube::api::WatchEvent::Added(cm))) => assert_eq!(cm.metadata.name.as_deref(), Some("small")),
        other => panic!("expected the small object first, got {other:?}"),
    }
    match next(&mut stream).await {
        Some(Err(ListWatchError::TooLarge { what, limit })) => assert_eq!((what, limit), ("watch event", 100_000)),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(
        next(&mut stream).await.is_none(),
        "the stream ends after an oversized event"
    );
    env.shutdown().await;
}
