//! Validation as kube-apiserver does it: strict decoding of built-in kinds, ObjectMeta rules,
//! `fieldValidation`, CRD structural schemas (pruning, defaults, validation), generation only
//! where a kind tracks it, and the `/scale` subresource. Every request goes through
//! `kube::Client` over HTTP; every expected answer is kube-apiserver's code, reason and field.

mod common;

use envtest::{Config, Server};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::core::Status;
use serde_json::{Value, json};

/// Sends `body` to `path` (with `query`) through the kube client: the object or the Status.
async fn send(client: &kube::Client, method: &str, path: &str, body: &Value) -> Result<Value, Box<Status>> {
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("Content-Type", content_type)
        .body(serde_json::to_vec(body).unwrap())
        .unwrap();
    match client.request::<Value>(req).await {
        Ok(v) => Ok(v),
        Err(kube::Error::Api(status)) => Err(status),
        Err(other) => panic!("{method} {path}: not an API answer: {other:?}"),
    }
}

/// The field paths of a 422's causes.
fn cause_fields(s: &Status) -> Vec<String> {
    s.details
        .as_ref()
        .map(|d| d.causes.iter().map(|c| c.field.clone()).collect())
        .unwrap_or_default()
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn invalid_built_in_objects_get_kube_apiservers_answers() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let cm = |meta: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta});
    // (what, path, body, code, reason, fields of the causes or a part of the message)
    let cases: Vec<(&str, &str, Value, u16, &str, &str)> = vec![
        (
            "replicas of the wrong type",
            "/apis/apps/v1/namespaces/default/deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                   "spec": {"replicas": "x", "selector": {"matchLabels": {"a": "b"}},
                            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
            400,
            "BadRequest",
            r#"Deployment in version "v1" cannot be handled as a Deployment: spec.replicas: invalid type: string "x""#,
        ),
        (
            "labels as a list",
            CMS,
            cm(json!({"name": "a", "labels": [1]})),
            400,
            "BadRequest",
            "metadata.labels",
        ),
        (
            "ownerReferences as a string",
            CMS,
            cm(json!({"name": "a", "ownerReferences": "x"})),
            400,
            "BadRequest",
            "metadata.ownerReferences",
        ),
        (
            "finalizers as a number",
            CMS,
            cm(json!({"name": "a", "finalizers": 5})),
            400,
            "BadRequest",
            "metadata.finalizers",
        ),
        (
            "upper-case name",
            CMS,
            cm(json!({"name": "Bad_Name"})),
            422,
            "Invalid",
            "metadata.name",
        ),
        (
            "label value with a space",
            CMS,
            cm(json!({"name": "a", "labels": {"k": "bad value!"}})),
            422,
            "Invalid",
            "metadata.labels",
        ),
        (
            "label key with two slashes",
            CMS,
            cm(json!({"name": "a", "labels": {"a/b/c": "v"}})),
            422,
            "Invalid",
            "metadata.labels",
        ),
        (
            "unqualified finalizer",
            CMS,
            cm(json!({"name": "a", "finalizers": ["plain"]})),
            422,
            "Invalid",
            "metadata.finalizers[0]",
        ),
        (
            "owner reference without uid",
            CMS,
            cm(
                json!({"name": "a", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": ""}]}),
            ),
            422,
            "Invalid",
            "metadata.ownerReferences.uid",
        ),
        (
            "annotations over 256 KiB",
            CMS,
            cm(json!({"name": "a", "annotations": {"a": "x".repeat(256 * 1024)}})),
            422,
            "Invalid",
            "metadata.annotations",
        ),
        (
            "service name starting with a digit",
            "/api/v1/namespaces/default/services",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "1svc"}, "spec": {"ports": [{"port": 80}]}}),
            422,
            "Invalid",
            "metadata.name",
        ),
        (
            "namespace name with a dot",
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a.b"}}),
            422,
            "Invalid",
            "metadata.name",
        ),
        (
            "unknown field with fieldValidation=Strict",
            "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "extra": 1}),
            400,
            "BadRequest",
            r#"strict decoding error: unknown field "extra""#,
        ),
    ];
    for (what, path, body, code, reason, expect) in cases {
        let status = send(&client, "POST", path, &body).await.expect_err(what);
        assert_eq!(
            (status.code, status.reason.as_str()),
            (code, reason),
            "{what}: {status:?}"
        );
        if code == 422 {
            assert!(cause_fields(&status).contains(&expect.to_owned()), "{what}: {status:?}");
            assert!(status.message.contains(" is invalid: "), "{what}: {}", status.message);
        } else {
            assert!(status.message.contains(expect), "{what}: {}", status.message);
        }
    }
    // The exact words of one, as kubectl prints them.
    let status = send(&client, "POST", CMS, &cm(json!({"name": "Bad_Name"})))
        .await
        .unwrap_err();
    assert_eq!(
        status.message,
        "ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    );
    let cause = &status.details.as_ref().unwrap().causes[0];
    assert_eq!(
        (cause.reason.as_str(), cause.field.as_str()),
        ("FieldValueInvalid", "metadata.name")
    );

    // Without Strict, unknown fields are dropped, as kube-apiserver stores only what its type knows.
    let kept = send(
        &client,
        "POST",
        CMS,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept", "bogus": 1}, "data": {"k": "v"}, "extra": 1}),
    )
    .await
    .unwrap();
    assert!(
        kept.get("extra").is_none() && kept["metadata"].get("bogus").is_none(),
        "{kept}"
    );
    assert_eq!(kept["data"]["k"], "v");
    // A Secret's stringData is stored as data.
    let secret = send(
        &client,
        "POST",
        "/api/v1/namespaces/default/secrets?fieldValidation=Strict",
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}),
    )
    .await
    .unwrap();
    assert_eq!(secret["data"]["password"], "aHVudGVyMg==");
    assert!(secret.get("stringData").is_none());
    // Nothing invalid was stored.
    assert_eq!(env.objects_of(CMS).unwrap().len(), 1);
    env.shutdown().await;
}

#[tokio::test]
async fn generation_is_kept_only_by_kinds_that_track_it() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut c = ConfigMap::default();
    c.metadata.name = Some("c".into());
    let created = cms.create(&PostParams::default(), &c).await.unwrap();
    assert_eq!(created.metadata.generation, None, "ConfigMaps have no generation");
    let patched = cms
        .patch("c", &PatchParams::default(), &Patch::Merge(json!({"data": {"a": "b"}})))
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, None);

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}
    }))
    .unwrap();
    assert_eq!(
        deployments
            .create(&PostParams::default(), &d)
            .await
            .unwrap()
            .metadata
            .generation,
        Some(1)
    );
    let generation = |patch: Value| {
        let deployments = deployments.clone();
        async move {
            deployments
                .patch("web", &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap()
                .metadata
                .generation
        }
    };
    assert_eq!(
        generation(json!({"metadata": {"labels": {"x": "y"}}})).await,
        Some(1),
        "labels: no"
    );
    assert_eq!(
        generation(json!({"metadata": {"annotations": {"x": "y"}}})).await,
        Some(2),
        "a Deployment's annotations: yes"
    );
    assert_eq!(generation(json!({"spec": {"paused": true}})).await, Some(3));
    assert_eq!(
        generation(json!({"metadata": {"generation": 40}})).await,
        Some(3),
        "clients cannot set it"
    );

    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "rs"},
        "spec": {"selector": {"matchLabels": {"app": "rs"}},
                 "template": {"metadata": {"labels": {"app": "rs"}}, "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}
    }))
    .unwrap();
    sets.create(&PostParams::default(), &rs).await.unwrap();
    let annotated = sets
        .patch(
            "rs",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(annotated.metadata.generation, Some(1), "a ReplicaSet's annotations: no");
    env.shutdown().await;
}

fn crd(name_suffix: &str, version: Value) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("foos{name_suffix}.example.com")},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": format!("foos{name_suffix}"), "singular": "foo", "kind": format!("Foo{name_suffix}")},
            "versions": [version],
        }
    }))
    .unwrap()
}

fn foo_schema() -> Value {
    json!({"type": "object", "properties": {
        "spec": {"type": "object", "required": ["image"], "properties": {
            "image": {"type": "string", "minLength": 1, "pattern": "^[a-z0-9./:-]+$"},
            "replicas": {"type": "integer", "minimum": 0, "default": 1},
            "mode": {"type": "string", "enum": ["Fast", "Safe"], "default": "Safe"},
            "port": {"x-kubernetes-int-or-string": true},
            "selector": {"type": "string"},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        }},
        "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
    }})
}

#[tokio::test]
async fn custom_resources_are_pruned_defaulted_and_validated_by_their_schema() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(
        &PostParams::default(),
        &crd(
            "",
            json!({"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": foo_schema()}, "subresources": {"status": {}}}),
        ),
    )
    .await
    .unwrap();
    let path = "/apis/example.com/v1/namespaces/default/foos";
    let foo =
        |spec: Value| json!({"apiVersion": "example.com/v1", "kind": "Foo", "metadata": {"name": "a"}, "spec": spec});

    let created = send(
        &client,
        "POST",
        path,
        &foo(json!({"image": "nginx:1", "unknown": true, "port": "http", "extra": {"free": {"form": 1}}})),
    )
    .await
    .unwrap();
    assert_eq!(
        created["spec"],
        json!({"image": "nginx:1", "replicas": 1, "mode": "Safe", "port": "http", "extra": {"free": {"form": 1}}}),
        "unknown field pruned, defaults applied, preserved subtree kept"
    );
    assert_eq!(created["metadata"]["generation"], 1);

    let status = send(
        &client,
        "POST",
        &format!("{path}?fieldValidation=Strict"),
        &foo(json!({"image": "x", "unknown": 1})),
    )
    .await
    .unwrap_err();
    assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
    assert!(
        status
            .message
            .ends_with(r#"strict decoding error: unknown field "spec.unknown""#),
        "{}",
        status.message
    );

    let mut bad = foo(json!({"replicas": "three", "mode": "Slow", "port": true}));
    bad["metadata"]["name"] = json!("b");
    let status = send(&client, "POST", path, &bad).await.unwrap_err();
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"), "{status:?}");
    let mut fields = cause_fields(&status);
    fields.sort();
    assert_eq!(fields, ["spec.image", "spec.mode", "spec.port", "spec.replicas"]);
    assert!(
        status.message.starts_with(r#"Foo.example.com "b" is invalid: ["#),
        "{}",
        status.message
    );
    assert!(
        status.message.contains(
            r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#
        ),
        "{}",
        status.message
    );
    let causes = &status.details.as_ref().unwrap().causes;
    let replicas = causes.iter().find(|c| c.field == "spec.replicas").unwrap();
    assert_eq!(replicas.reason, "FieldValueTypeInvalid");
    let mode = causes.iter().find(|c| c.field == "spec.mode").unwrap();
    assert_eq!(
        (mode.reason.as_str(), mode.message.as_str()),
        (
            "FieldValueNotSupported",
            r#"Unsupported value: "Slow": supported values: "Fast", "Safe""#
        )
    );

    // Updates are checked too: a merge patch that breaks the schema is refused.
    let status = send(
        &client,
        "PATCH",
        &format!("{path}/a"),
        &json!({"spec": {"replicas": -1}}),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code, 422);
    assert!(
        status
            .message
            .ends_with("spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"),
        "{}",
        status.message
    );
    // Custom resources only warn about an unqualified finalizer.
    send(
        &client,
        "PATCH",
        &format!("{path}/a"),
        &json!({"metadata": {"finalizers": ["plain"]}, "spec": {"replicas": 2}}),
    )
    .await
    .unwrap();
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Foo"), "foos");
    let foos: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let a = foos.get("a").await.unwrap();
    assert_eq!(a.data["spec"]["replicas"], 2);
    assert_eq!(a.metadata.generation, Some(2));
    env.shutdown().await;
}

#[tokio::test]
async fn the_scale_subresource_reads_and_writes_replicas() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}
    }))
    .unwrap();
    let created = deployments.create(&PostParams::default(), &d).await.unwrap();
    let scale_path = "/apis/apps/v1/namespaces/default/deployments/web/scale";
    let req = http::Request::get(scale_path).body(Vec::new()).unwrap();
    let scale: Value = client.request(req).await.unwrap();
    assert_eq!(
        scale,
        json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": "web", "namespace": "default", "uid": created.metadata.uid,
                         "resourceVersion": created.metadata.resource_version,
                         "creationTimestamp": created.metadata.creation_timestamp},
            "spec": {"replicas": 2}, "status": {"replicas": 0, "selector": "app=web"}})
    );
    // What kubectl scale sends.
    let scaled = send(&client, "PATCH", scale_path, &json!({"spec": {"replicas": 5}}))
        .await
        .unwrap();
    assert_eq!(
        (scaled["kind"].as_str(), scaled["spec"]["replicas"].as_i64()),
        (Some("Scale"), Some(5))
    );
    let after = deployments.get("web").await.unwrap();
    assert_eq!(after.spec.unwrap().replicas, Some(5));
    assert_eq!(after.metadata.generation, Some(2));
    // A PUT carrying a stale resourceVersion is a conflict on the parent.
    let mut stale = scale.clone();
    stale["spec"]["replicas"] = json!(1);
    let status = send(&client, "PUT", scale_path, &stale).await.unwrap_err();
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status
            .message
            .starts_with(r#"Operation cannot be fulfilled on deployments.apps "web""#),
        "{}",
        status.message
    );
    let status = send(&client, "PATCH", scale_path, &json!({"spec": {"replicas": -1}}))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code, status.message.as_str()),
        (
            422,
            r#"Scale.autoscaling "web" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"#
        )
    );
    // Discovery lists it, as kubectl scale needs.
    let discovery: Value = client
        .request(http::Request::get("/apis/apps/v1").body(Vec::new()).unwrap())
        .await
        .unwrap();
    let entry = discovery["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "deployments/scale")
        .cloned()
        .expect("deployments/scale in discovery");
    assert_eq!(
        (entry["group"].as_str(), entry["kind"].as_str()),
        (Some("autoscaling"), Some("Scale"))
    );

    // A CRD that declares the scale subresource.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(
        &PostParams::default(),
        &crd(
            "s",
            json!({"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": foo_schema()},
            "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".spec.selector"}}}),
        ),
    )
    .await
    .unwrap();
    let path = "/apis/example.com/v1/namespaces/default/fooss";
    send(
        &client,
        "POST",
        path,
        &json!({"apiVersion": "example.com/v1", "kind": "Foos", "metadata": {"name": "f"},
                "spec": {"image": "i", "replicas": 3, "selector": "app=f"}}),
    )
    .await
    .unwrap();
    let scale = send(
        &client,
        "PATCH",
        &format!("{path}/f/scale"),
        &json!({"spec": {"replicas": 4}}),
    )
    .await
    .unwrap();
    assert_eq!(scale["spec"]["replicas"], 4);
    assert_eq!(scale["status"], json!({"replicas": 0, "selector": "app=f"}));
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Foos"), "fooss");
    let f = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &ar)
        .get("f")
        .await
        .unwrap();
    assert_eq!(f.data["spec"]["replicas"], 4);
    env.shutdown().await;
}

#[tokio::test]
async fn an_object_being_deleted_gains_no_finalizer_and_an_apply_sets_no_managed_fields() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let path = "/api/v1/namespaces/default/configmaps";
    send(
        &client,
        "POST",
        path,
        &json!({"metadata": {"name": "held", "finalizers": ["a.example.com/x"]}}),
    )
    .await
    .unwrap();
    cms.delete("held", &Default::default()).await.unwrap();
    // Removing a finalizer is allowed; adding one is not (kube-apiserver's ObjectMeta rule).
    let added = send(
        &client,
        "PATCH",
        &format!("{path}/held"),
        &json!({"metadata": {"finalizers": ["a.example.com/x", "b.example.com/y"]}}),
    )
    .await
    .unwrap_err();
    assert_eq!((added.code, added.reason.as_str()), (422, "Invalid"));
    assert_eq!(cause_fields(&added), ["metadata.finalizers"]);
    assert!(
        added.message.contains(
            r#"Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"b.example.com/y"}"#
        ),
        "{}",
        added.message
    );
    send(
        &client,
        "PATCH",
        &format!("{path}/held"),
        &json!({"metadata": {"finalizers": []}}),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());

    // An apply configuration carrying managedFields: 400, as kube-apiserver's field manager.
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "applied", "managedFields": [{"manager": "me", "operation": "Apply"}]}});
    let err = cms
        .patch("applied", &PatchParams::apply("me"), &Patch::Apply(&cm))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.message.as_str()),
            (400, "metadata.managedFields must be nil")
        ),
        other => panic!("{other:?}"),
    }
    cm["metadata"].as_object_mut().unwrap().remove("managedFields");
    cms.patch("applied", &PatchParams::apply("me"), &Patch::Apply(&cm))
        .await
        .unwrap();
    env.shutdown().await;
}
