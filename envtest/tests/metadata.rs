//! Metadata-only responses (`Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`),
//! as kube-apiserver answers them, through kube's own `*_metadata` calls.

mod common;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};

fn configmap(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    cm.data = Some([("payload".to_string(), "x".repeat(1000))].into());
    cm
}

/// GET `path` with `accept`: the status code and the body as JSON.
async fn get_with_accept(client: &kube::Client, path: &str, accept: &str) -> Result<serde_json::Value, u16> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())
        .unwrap();
    match client.request_text(request).await {
        Ok(text) => Ok(serde_json::from_str(&text).unwrap()),
        Err(e) => Err(common::code(&e)),
    }
}

#[tokio::test]
async fn list_get_and_watch_answer_partial_object_metadata_when_asked() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &configmap("a")).await.unwrap();

    let list = api.list_metadata(&Default::default()).await.unwrap();
    assert_eq!(list.types.kind, "PartialObjectMetadataList");
    assert_eq!(list.types.api_version, "meta.k8s.io/v1");
    assert_eq!(list.items.len(), 1);
    let item = &list.items[0];
    assert_eq!(item.types.as_ref().unwrap().kind, "PartialObjectMetadata");
    assert_eq!(item.metadata.name.as_deref(), Some("a"));
    assert_eq!(item.metadata.labels.as_ref().unwrap()["app"], "web");

    let one = api.get_metadata("a").await.unwrap();
    assert_eq!(one.types.unwrap().kind, "PartialObjectMetadata");
    assert!(one.metadata.uid.is_some());

    // On the wire: no data, just kind, apiVersion and metadata.
    let raw = get_with_accept(
        &env.client(),
        "/api/v1/namespaces/default/configmaps",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    )
    .await
    .unwrap();
    let keys: Vec<&String> = raw["items"][0].as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(raw["items"][0].get("data").is_none());

    let rv = list.metadata.resource_version.unwrap();
    let mut events = api
        .watch_metadata(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &configmap("b")).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("an event within 10 s")
        .unwrap();
    match event {
        Some(WatchEvent::Added(meta)) => {
            assert_eq!(meta.metadata.name.as_deref(), Some("b"));
            assert_eq!(meta.types.unwrap().kind, "PartialObjectMetadata");
        }
        other => panic!("expected ADDED b, got {other:?}"),
    }
    env.shutdown().await;
}

#[tokio::test]
async fn accept_is_negotiated_in_order_and_an_impossible_one_is_406() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();
    let path = "/api/v1/namespaces/default/configmaps";

    // kubectl's Accept: the Table it asks for first.
    let table = get_with_accept(
        &client,
        path,
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
    )
    .await
    .unwrap();
    assert_eq!(
        (table["kind"].as_str(), table["apiVersion"].as_str()),
        (Some("Table"), Some("meta.k8s.io/v1"))
    );
    assert_eq!(table["rows"][0]["cells"][0], "a");
    // A Table of another meta.k8s.io version is skipped for the plain list that follows.
    let list = get_with_accept(
        &client,
        path,
        "application/json;as=Table;v=v2;g=meta.k8s.io,application/json",
    )
    .await
    .unwrap();
    assert_eq!(list["kind"], "ConfigMapList");

    // The single-object form asked of a list, with no fallback: nothing fits.
    let wrong = get_with_accept(
        &client,
        path,
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
    )
    .await;
    assert_eq!(wrong.unwrap_err(), 406);

    // ...with the plain fallback client-go's metadata client sends: the list as stored.
    let fallback = get_with_accept(
        &client,
        path,
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json",
    )
    .await
    .unwrap();
    assert_eq!(fallback["kind"], "ConfigMapList");
    env.shutdown().await;
}
