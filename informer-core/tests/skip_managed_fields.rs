//! `ApiListerWatcher::skip_managed_fields` over envtest: listed and watched objects arrive
//! without `metadata.managedFields`, with no transform involved, and everything else intact.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use informer_core::{ApiListerWatcher, ListerWatcher};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::Api;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};

fn configmap(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.labels = Some(BTreeMap::from([("app".to_string(), "web".to_string())]));
    cm.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("test".into()),
        operation: Some("Update".into()),
        ..ManagedFieldsEntry::default()
    }]);
    cm.data = Some(BTreeMap::from([(
        "managedFields".to_string(),
        "a data key, kept".to_string(),
    )]));
    cm
}

#[tokio::test]
async fn listed_and_watched_objects_arrive_without_managed_fields() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &configmap("listed")).await.unwrap();
    let plain = ApiListerWatcher::new(api.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        plain.items[0].metadata.managed_fields.is_some(),
        "the server keeps them"
    );

    let lw = ApiListerWatcher::new(api.clone()).skip_managed_fields(true);
    let page = lw.list(&ListParams::default()).await.unwrap();
    let listed = &page.items[0];
    assert_eq!(listed.metadata.managed_fields, None);
    assert_eq!(listed.metadata.labels.as_ref().unwrap()["app"], "web");
    assert_eq!(listed.data.as_ref().unwrap()["managedFields"], "a data key, kept");

    let mut events = lw.watch(&WatchParams::default(), &page.resource_version).await.unwrap();
    api.create(&PostParams::default(), &configmap("watched")).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event in time")
        .expect("a stream item")
        .expect("an event");
    match event {
        WatchEvent::Added(cm) => {
            assert_eq!(cm.metadata.name.as_deref(), Some("watched"));
            assert_eq!(cm.metadata.managed_fields, None);
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
}
