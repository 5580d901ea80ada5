//! CRDs, garbage collection of dependents, namespace deletion, discovery, auth, kubeconfig.

mod common;

use common::{code, wait_for};
use envtest::{Config, Server};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::discovery::Discovery;
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn crd(scope: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                          "subresources": {"status": {}}}]
        }
    }))
    .unwrap()
}

fn widget_api(client: kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets");
    Api::namespaced_with(client, ns, &ar)
}

#[tokio::test]
async fn crd_serves_and_unserves_its_resource() {
    let env = Server::start(Config::default()).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    let widgets = widget_api(env.client(), "default");
    assert_eq!(code(&widgets.list(&ListParams::default()).await.unwrap_err()), 404);

    crds.create(&PostParams::default(), &crd("Namespaced")).await.unwrap();
    let established = crds.get("widgets.example.com").await.unwrap();
    assert!(
        established
            .status
            .unwrap()
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );

    let w: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 1}, "status": {"ok": false}
    }))
    .unwrap();
    let created = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.data["spec"]["size"], 1);
    assert_eq!(created.metadata.generation, Some(1));
    // Status subresource: main writes ignore status, status writes ignore spec.
    let pp = PatchParams::default();
    let o = widgets
        .patch(
            "w1",
            &pp,
            &Patch::Merge(json!({"spec": {"size": 2}, "status": {"ok": true}})),
        )
        .await
        .unwrap();
    assert_eq!(o.data["spec"]["size"], 2);
    assert_eq!(o.metadata.generation, Some(2));
    let o = widgets
        .patch_status(
            "w1",
            &pp,
            &Patch::Merge(json!({"spec": {"size": 3}, "status": {"ok": true}})),
        )
        .await
        .unwrap();
    assert_eq!(o.data["status"]["ok"], true);
    assert_eq!(o.data["spec"]["size"], 2);

    // Discovery shows it, with its short name.
    let discovery = Discovery::new(env.client()).run().await.unwrap();
    let found = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .any(|(ar, _)| ar.plural == "widgets" && ar.group == "example.com");
    assert!(found, "widgets not in discovery");

    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(code(&widgets.list(&ListParams::default()).await.unwrap_err()), 404);
    assert!(env.objects_of("/api/v1/namespaces/default/configmaps").is_ok());
    assert!(
        env.objects_of("/apis/example.com/v1/namespaces/default/widgets")
            .is_err()
    );

    // Recreating it serves an empty collection: the old objects were removed.
    crds.create(&PostParams::default(), &crd("Namespaced")).await.unwrap();
    assert!(widgets.list(&ListParams::default()).await.unwrap().items.is_empty());
    env.shutdown().await;
}

#[tokio::test]
async fn invalid_crd_is_422() {
    let env = Server::start(Config::default()).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    let mut bad = crd("Namespaced");
    bad.metadata.name = Some("wrong.name".into());
    let e = crds.create(&PostParams::default(), &bad).await.unwrap_err();
    assert_eq!(code(&e), 422);
    env.shutdown().await;
}

#[tokio::test]
async fn owner_references_garbage_collect_dependents() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let mut owner = ConfigMap::default();
    owner.metadata.name = Some("owner".into());
    let owner = api.create(&PostParams::default(), &owner).await.unwrap();
    let oref = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]);
    for name in ["dep1", "dep2"] {
        let d: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": oref}})).unwrap();
        api.create(&PostParams::default(), &d).await.unwrap();
    }
    // A grand-dependent: deletion cascades.
    let dep1 = api.get("dep1").await.unwrap();
    let g: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "grand", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "dep1", "uid": dep1.metadata.uid}]}}))
    .unwrap();
    api.create(&PostParams::default(), &g).await.unwrap();
    api.delete("owner", &DeleteParams::background()).await.unwrap();
    wait_for(T, "dependents to be collected", || {
        let left = env.objects_of("/api/v1/namespaces/default/configmaps").unwrap().len();
        async move { left == 0 }
    })
    .await;

    // Orphan propagation keeps the dependents and removes the reference.
    let owner = api
        .create(&PostParams::default(), &{
            let mut o = ConfigMap::default();
            o.metadata.name = Some("owner2".into());
            o
        })
        .await
        .unwrap();
    let d: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "kept", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner2", "uid": owner.metadata.uid}]}}))
    .unwrap();
    api.create(&PostParams::default(), &d).await.unwrap();
    api.delete("owner2", &DeleteParams::orphan()).await.unwrap();
    let kept = api.get("kept").await.unwrap();
    assert!(kept.metadata.owner_references.unwrap_or_default().is_empty());
    env.shutdown().await;
}

#[tokio::test]
async fn namespace_deletion_removes_contents_then_namespace() {
    let env = Server::start(Config::default()).await.unwrap();
    let nss: Api<Namespace> = Api::all(env.client());
    let mut ns = Namespace::default();
    ns.metadata.name = Some("doomed".into());
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "doomed");
    for i in 0..3 {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(format!("c{i}"));
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    nss.delete("doomed", &DeleteParams::default()).await.unwrap();
    // Terminating namespaces accept no new content.
    let mut c = ConfigMap::default();
    c.metadata.name = Some("late".into());
    if let Err(e) = api.create(&PostParams::default(), &c).await {
        assert!(matches!(code(&e), 403 | 404));
    }
    wait_for(T, "the namespace to be gone", || {
        let nss = nss.clone();
        async move { nss.get_opt("doomed").await.unwrap().is_none() }
    })
    .await;
    assert!(
        env.objects_of("/api/v1/namespaces/doomed/configmaps")
            .unwrap()
            .is_empty()
    );
    env.shutdown().await;
}

#[tokio::test]
async fn discovery_version_and_health() {
    let env = Server::start(Config::default()).await.unwrap();
    let v = env.client().apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
    let discovery = Discovery::new(env.client()).run().await.unwrap();
    let mut plurals: Vec<String> = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .map(|(ar, _)| ar.plural)
        .collect();
    plurals.sort();
    for want in [
        "configmaps",
        "deployments",
        "leases",
        "namespaces",
        "customresourcedefinitions",
    ] {
        assert!(plurals.iter().any(|p| p == want), "{want} missing: {plurals:?}");
    }
    for path in ["/healthz", "/readyz", "/livez"] {
        let (code, _) = common::raw(env.base_url(), "GET", path, "text/plain", vec![]).await;
        assert_eq!(code, 200, "{path}");
    }
    let (_, v1) = common::raw(env.base_url(), "GET", "/api/v1", "application/json", vec![]).await;
    let cm = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "configmaps")
        .unwrap();
    assert_eq!(cm["shortNames"], json!(["cm"]));
    env.shutdown().await;
}

#[tokio::test]
async fn bearer_token_is_enforced_and_kubeconfig_works() {
    let env = Server::start(Config::default().token("s3cret")).await.unwrap();
    let (code, body) = common::raw(env.base_url(), "GET", "/api/v1/namespaces", "application/json", vec![]).await;
    assert_eq!(code, 401);
    assert_eq!(body["reason"], "Unauthorized");
    // The server's own client carries the token.
    let nss: Api<Namespace> = Api::all(env.client());
    nss.list(&ListParams::default()).await.unwrap();
    // So does a client built from the written kubeconfig.
    let dir = std::env::temp_dir().join(format!("envtest-kc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    env.write_kubeconfig(&path).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(cfg).unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    cms.list(&ListParams::default()).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    env.shutdown().await;
}

#[tokio::test]
async fn a_dependent_created_after_its_owner_was_deleted_is_collected() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let mut owner = ConfigMap::default();
    owner.metadata.name = Some("gone".into());
    let owner = api.create(&PostParams::default(), &owner).await.unwrap();
    api.delete("gone", &DeleteParams::background()).await.unwrap();
    // A controller whose cache lags creates a child of the deleted owner: the collector (woken
    // by the create, not only by deletes) removes it; an unowned object stays.
    let oref = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": owner.metadata.uid}]);
    let late: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "late", "ownerReferences": oref}})).unwrap();
    api.create(&PostParams::default(), &late).await.unwrap();
    let mut free = ConfigMap::default();
    free.metadata.name = Some("free".into());
    api.create(&PostParams::default(), &free).await.unwrap();
    wait_for(T, "the orphaned dependent to be collected", || {
        let api = api.clone();
        async move { api.get_opt("late").await.unwrap().is_none() }
    })
    .await;
    assert!(api.get_opt("free").await.unwrap().is_some());
    env.shutdown().await;
}
