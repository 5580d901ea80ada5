//! Server-side apply with field ownership, over HTTP with `kube::Client`: `managedFields` per
//! manager, removal of fields a manager stops applying, `409` conflicts between managers unless
//! forced, updates recorded under their manager, no-op applies, and a CRD's associative lists.

mod common;

use envtest::{Config, Server};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn deployment(replicas: i32, env: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx:1.27", "env": env}]}}}
    })
}

/// `(manager, operation)` of each managedFields entry.
fn managers(d: &Deployment) -> Vec<(String, String)> {
    d.metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|e| {
            (
                e.manager.clone().unwrap_or_default(),
                e.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// The FieldsV1 of `manager`'s entry.
fn fields_of(d: &Deployment, manager: &str) -> Value {
    d.metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|e| e.manager.as_deref() == Some(manager))
        .and_then(|e| e.fields_v1.as_ref())
        .map(|f| f.0.clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn apply_removes_fields_it_stops_applying_and_conflicts_between_managers() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<Deployment> = Api::namespaced(env.client(), "default");
    let ci = PatchParams::apply("ci");
    let env_ab = json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]);
    let first = api
        .patch("web", &ci, &Patch::Apply(deployment(2, env_ab)))
        .await
        .unwrap();
    assert_eq!(managers(&first), [("ci".to_owned(), "Apply".to_owned())]);
    let owned = fields_of(&first, "ci");
    assert_eq!(owned["f:spec"]["f:replicas"], json!({}));
    assert!(
        owned["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"]["f:env"]["k:{\"name\":\"A\"}"]
            .is_object(),
        "{owned}"
    );

    // The same configuration again: nothing changes, not even the resourceVersion.
    let env_ab = json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]);
    let again = api
        .patch("web", &ci, &Patch::Apply(deployment(2, env_ab)))
        .await
        .unwrap();
    assert_eq!(again.metadata.resource_version, first.metadata.resource_version);

    // Without B and without the label: both go, as the manager no longer applies them.
    let mut config = deployment(2, json!([{"name": "A", "value": "1"}]));
    config["metadata"].as_object_mut().unwrap().remove("labels");
    let second = api.patch("web", &ci, &Patch::Apply(config)).await.unwrap();
    let container = &second.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
    let names: Vec<&str> = container.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["A"]);
    assert!(second.metadata.labels.as_ref().is_none_or(|l| !l.contains_key("app")));

    // Another manager setting replicas to another value conflicts.
    let other = PatchParams::apply("autoscaler");
    let err = api
        .patch(
            "web",
            &other,
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 5}})),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        status.message,
        r#"Apply failed with 1 conflict: conflict with "ci" using apps/v1: .spec.replicas"#
    );
    let cause = &status.details.as_ref().unwrap().causes[0];
    assert_eq!(
        (cause.reason.as_str(), cause.field.as_str()),
        ("FieldManagerConflict", ".spec.replicas")
    );
    // The same value is shared, not a conflict; force takes the field over.
    api.patch(
        "web",
        &other,
        &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}})),
    )
    .await
    .unwrap();
    let forced = api
        .patch(
            "web",
            &other.clone().force(),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(forced.spec.as_ref().unwrap().replicas, Some(5));
    assert!(
        fields_of(&forced, "ci")["f:spec"].get("f:replicas").is_none(),
        "taken from ci"
    );
    assert_eq!(fields_of(&forced, "autoscaler")["f:spec"]["f:replicas"], json!({}));
    // Now ci conflicts when it applies its old value.
    let err = api
        .patch(
            "web",
            &ci,
            &Patch::Apply(deployment(2, json!([{"name": "A", "value": "1"}]))),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.message.contains(r#"conflict with "autoscaler""#)),
        "{err:?}"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn updates_are_recorded_under_their_manager() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("c".into());
    cm.data = Some([("a".to_owned(), "1".to_owned())].into());
    let pp = PostParams {
        field_manager: Some("creator".into()),
        ..Default::default()
    };
    let created = api.create(&pp, &cm).await.unwrap();
    let entries = created.metadata.managed_fields.clone().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].manager.as_deref(), entries[0].operation.as_deref()),
        (Some("creator"), Some("Update"))
    );
    assert_eq!(entries[0].fields_v1.as_ref().unwrap().0, json!({"f:data": {"f:a": {}}}));
    // A merge patch by another manager takes the key it changed.
    let pp = PatchParams {
        field_manager: Some("editor".into()),
        ..Default::default()
    };
    let patched = api
        .patch("c", &pp, &Patch::Merge(json!({"data": {"a": "2", "b": "3"}})))
        .await
        .unwrap();
    let entries = patched.metadata.managed_fields.unwrap();
    let by = |m: &str| {
        entries
            .iter()
            .find(|e| e.manager.as_deref() == Some(m))
            .map(|e| e.fields_v1.as_ref().unwrap().0.clone())
    };
    assert_eq!(by("editor"), Some(json!({"f:data": {"f:a": {}, "f:b": {}}})));
    assert_eq!(by("creator"), None, "creator owned only data.a, now the editor's");
    // Without fieldManager, the User-Agent names the manager (kube's is `kube-rs`... up to '/').
    let ua_patched = api
        .patch("c", &PatchParams::default(), &Patch::Merge(json!({"data": {"c": "4"}})))
        .await
        .unwrap();
    assert!(
        ua_patched
            .metadata
            .managed_fields
            .unwrap()
            .iter()
            .any(|e| e.manager.as_deref().is_some_and(|m| !m.is_empty() && m != "editor")),
    );
    env.shutdown().await;
}

#[tokio::test]
async fn a_crds_map_lists_are_merged_by_key_between_managers() {
    let env = Server::start(Config::default()).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "routes.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "routes", "singular": "route", "kind": "Route"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": {
                    "rules": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["host"],
                        "items": {"type": "object", "required": ["host"], "properties": {
                            "host": {"type": "string"}, "backend": {"type": "string"}}}},
                    "tags": {"type": "array", "items": {"type": "string"}},
                }}}}}}]}
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Route"), "routes");
    let routes: Api<DynamicObject> = Api::namespaced_with(env.client(), "default", &ar);
    let config = |rules: Value, tags: Value| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "example.com/v1", "kind": "Route", "metadata": {"name": "r"},
            "spec": {"rules": rules, "tags": tags}}))
        .unwrap()
    };
    routes
        .patch(
            "r",
            &PatchParams::apply("team-a"),
            &Patch::Apply(config(json!([{"host": "a", "backend": "x"}]), json!(["a"]))),
        )
        .await
        .unwrap();
    let merged = routes
        .patch(
            "r",
            &PatchParams::apply("team-b"),
            &Patch::Apply(config(json!([{"host": "b", "backend": "y"}]), json!(["a"]))),
        )
        .await
        .unwrap();
    let hosts: Vec<&str> = merged.data["spec"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["host"].as_str())
        .collect();
    assert_eq!(hosts, ["a", "b"], "items by key from both managers");
    // An atomic list is one field: a different value conflicts.
    let err = routes
        .patch(
            "r",
            &PatchParams::apply("team-b"),
            &Patch::Apply(config(json!([{"host": "b", "backend": "y"}]), json!(["b"]))),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.message.contains(".spec.tags")),
        "{err:?}"
    );
    // team-a stops applying its rule: it goes, team-b's stays.
    let after = routes
        .patch(
            "r",
            &PatchParams::apply("team-a"),
            &Patch::Apply(config(json!([]), json!(["a"]))),
        )
        .await
        .unwrap();
    assert_eq!(after.data["spec"]["rules"], json!([{"host": "b", "backend": "y"}]));
    env.shutdown().await;
}

#[tokio::test]
async fn strategic_merge_patch_merges_lists_by_their_merge_keys() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<Deployment> = Api::namespaced(env.client(), "default");
    let mut d: Deployment = serde_json::from_value(deployment(1, json!([{"name": "A", "value": "1"}]))).unwrap();
    let template = d.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    template
        .containers
        .push(serde_json::from_value(json!({"name": "sidecar", "image": "envoy:1"})).unwrap());
    api.create(&PostParams::default(), &d).await.unwrap();
    // What `kubectl set image` and `kubectl set env` send: one container, one variable.
    let patched = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "web", "image": "nginx:1.28", "env": [{"name": "B", "value": "2"}]}]}}}})),
        )
        .await
        .unwrap();
    let containers = &patched
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers;
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["web", "sidecar"],
        "the sidecar is kept: containers merge by name"
    );
    assert_eq!(containers[0].image.as_deref(), Some("nginx:1.28"));
    let env_names: Vec<&str> = containers[0].env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env_names, ["A", "B"]);
    // `$patch: delete` removes one item.
    let patched = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().template.spec.unwrap().containers.len(), 1);

    // Custom resources do not take strategic merge patches, as on kube-apiserver.
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Thing"), "things");
    let things: Api<DynamicObject> = Api::namespaced_with(env.client(), "default", &ar);
    let thing: DynamicObject =
        serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}}))
            .unwrap();
    things.create(&PostParams::default(), &thing).await.unwrap();
    let err = things
        .patch(
            "t",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"a": 1}})),
        )
        .await
        .unwrap_err();
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 415), "{err:?}");
    env.shutdown().await;
}
