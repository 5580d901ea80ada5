//! Regression tests for issue #28, "one authenticated request must not crash or exhaust
//! envtest": objects built deeper than every recursive walk can take (a JSON patch's `copy`
//! doubles the depth), objects grown exponentially by copies, and objects past the size bound.
//! Each once crashed envtest or stored what it should refuse; see `limits.rs` for the bounds. That
//! a patch is computed off the store's lock, so a costly one no longer stalls every other request,
//! is checked by the unit tests in `rest.rs`.

mod common;

use envtest::{Config, MAX_DEPTH, MAX_JSON_PATCH_OPERATIONS, Server};
use serde_json::{Value, json};

const CM: &str = "/api/v1/namespaces/default/configmaps";
const JSON_PATCH: &str = "application/json-patch+json";
const MERGE_PATCH: &str = "application/merge-patch+json";
const STRATEGIC_PATCH: &str = "application/strategic-merge-patch+json";
const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// `{"a": {"a": … leaf}}`, `levels` objects deep (built without `json!`, which would serialize
/// the inner value again).
fn nested(levels: usize, leaf: Value) -> Value {
    let mut v = leaf;
    for _ in 0..levels {
        let mut m = serde_json::Map::new();
        m.insert("a".into(), v);
        v = Value::Object(m);
    }
    v
}

async fn create_configmap(base: &str, name: &str, data: Value) {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data});
    let (code, body) = common::raw(base, "POST", CM, "application/json", cm.to_string().into_bytes()).await;
    assert_eq!(code, 201, "{body}");
}

async fn patch(base: &str, path: &str, content_type: &str, body: &Value) -> (u16, Value) {
    common::raw(base, "PATCH", path, content_type, body.to_string().into_bytes()).await
}

/// The server still answers, and the object is as it was.
async fn assert_alive_and_unchanged(base: &str, name: &str, data: &Value) {
    let (code, cm) = common::raw(base, "GET", &format!("{CM}/{name}"), "application/json", vec![]).await;
    assert_eq!(code, 200, "the server still answers");
    assert!(&cm["data"] == data, "the object is unchanged");
}

/// A JSON patch whose `copy` operations double the depth of `/d` each time: the probe that built
/// a ConfigMap ~13,000 levels deep and killed the process with a stack overflow.
fn depth_doubling_patch(doublings: u32) -> Value {
    let mut ops = vec![json!({"op": "add", "path": "/d", "value": {"a": 1}})];
    let mut depth = 1usize;
    for _ in 0..doublings {
        ops.push(json!({"op": "copy", "from": "/d", "path": format!("/d{}", "/a".repeat(depth))}));
        depth *= 2;
    }
    Value::Array(ops)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_patch_doubling_an_objects_depth_is_refused_not_a_crash() {
    let env = Server::start(Config::default()).await.unwrap();
    let base = env.base_url().to_string();
    let data = json!({"k": "v"});
    create_configmap(&base, "deep", data.clone()).await;
    let (code, status) = patch(&base, &format!("{CM}/deep"), JSON_PATCH, &depth_doubling_patch(14)).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["reason"], "Invalid");
    assert!(status["message"].as_str().unwrap().contains("levels deep"), "{status}");
    assert_alive_and_unchanged(&base, "deep", &data).await;
    // A patch that stays within the bound is applied as before.
    let (code, status) = patch(&base, &format!("{CM}/deep"), JSON_PATCH, &depth_doubling_patch(5)).await;
    assert_eq!(code, 200, "{status}");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_strategic_and_apply_patches_past_the_depth_bound_are_refused() {
    let env = Server::start(Config::default()).await.unwrap();
    let base = env.base_url().to_string();
    let data = json!({"k": "v"});
    create_configmap(&base, "deep", data.clone()).await;
    // Deeper than the bound, shallower than serde_json's parser's 128.
    let deep = nested(MAX_DEPTH + 10, json!(1));
    let path = format!("{CM}/deep");
    for ct in [MERGE_PATCH, STRATEGIC_PATCH] {
        let (code, status) = patch(&base, &path, ct, &json!({"x": deep})).await;
        assert_eq!(code, 422, "{ct}: {status}");
        assert!(status["message"].as_str().unwrap().contains("levels deep"), "{status}");
    }
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep"}, "x": deep});
    let (code, status) = patch(&base, &format!("{path}?fieldManager=m"), APPLY_PATCH, &config).await;
    assert_eq!(code, 422, "apply: {status}");
    // Creating such an object is refused the same way.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deeper"}, "x": deep});
    let (code, status) = common::raw(&base, "POST", CM, "application/json", cm.to_string().into_bytes()).await;
    assert_eq!(code, 422, "create: {status}");
    assert_alive_and_unchanged(&base, "deep", &data).await;
    env.shutdown().await;
}

/// A CRD whose schema nests `levels` objects.
fn crd_with_schema_levels(levels: usize) -> Value {
    let mut schema = json!({"type": "string"});
    for _ in 0..levels {
        schema = json!({"type": "object", "properties": {"a": schema}});
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "deeps.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "deeps", "singular": "deep", "kind": "Deep"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": schema}}}}]}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_schema_past_the_depth_bound_is_refused() {
    const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let env = Server::start(Config::default()).await.unwrap();
    let base = env.base_url().to_string();
    // 58 schema levels are 124 JSON levels: parseable, past the bound.
    let (code, status) = common::raw(
        &base,
        "POST",
        CRDS,
        "application/json",
        crd_with_schema_levels(58).to_string().into_bytes(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["details"]["kind"], "CustomResourceDefinition", "{status}");
    // A CRD within the bound, then a JSON patch doubling its schema's depth (the probe that
    // crashed envtest at 400 levels).
    let (code, status) = common::raw(
        &base,
        "POST",
        CRDS,
        "application/json",
        crd_with_schema_levels(2).to_string().into_bytes(),
    )
    .await;
    assert_eq!(code, 201, "{status}");
    let spec = "/spec/versions/0/schema/openAPIV3Schema/properties/spec";
    let mut ops = Vec::new();
    let mut depth = 1usize;
    for _ in 0..9 {
        let to = format!("{spec}{}", "/properties/a".repeat(depth));
        ops.push(json!({"op": "copy", "from": spec, "path": to}));
        depth *= 2;
    }
    let (code, status) = patch(
        &base,
        &format!("{CRDS}/deeps.example.com"),
        JSON_PATCH,
        &Value::Array(ops),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    let (code, _) = common::raw(
        &base,
        "GET",
        "/openapi/v3/apis/example.com/v1",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 200, "the server still answers and publishes the CRD's schema");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_patch_growing_an_object_exponentially_is_refused_while_it_applies() {
    let env = Server::start(Config::default()).await.unwrap();
    let base = env.base_url().to_string();
    let data = json!({"k": "v"});
    create_configmap(&base, "grow", data.clone()).await;
    // Each copy doubles /g: 1 KiB × 2^16 = 64 MiB asked for by a 1.7 KiB patch.
    let mut ops = vec![json!({"op": "add", "path": "/g", "value": {"s": "x".repeat(1024)}})];
    for i in 0..16 {
        ops.push(json!({"op": "copy", "from": "/g", "path": format!("/g/c{i}")}));
    }
    let (code, status) = patch(&base, &format!("{CM}/grow"), JSON_PATCH, &Value::Array(ops)).await;
    assert_eq!(code, 422, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("accumulated size increase of copy"),
        "{status}"
    );
    // More operations than kube-apiserver's maximum: refused before any is applied.
    let ops = vec![json!({"op": "test", "path": "/data/k", "value": "v"}); MAX_JSON_PATCH_OPERATIONS + 1];
    let (code, status) = patch(&base, &format!("{CM}/grow"), JSON_PATCH, &Value::Array(ops)).await;
    assert_eq!(code, 413, "{status}");
    assert_eq!(
        status["message"],
        format!(
            "Request entity too large: The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            MAX_JSON_PATCH_OPERATIONS + 1
        )
    );
    assert_alive_and_unchanged(&base, "grow", &data).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_past_the_size_bound_is_refused_after_every_kind_of_write() {
    let env = Server::start(Config::default()).await.unwrap();
    let base = env.base_url().to_string();
    let mib = "x".repeat(1024 * 1024);
    let data = json!({"a": mib, "b": mib});
    create_configmap(&base, "big", data.clone()).await;
    let path = format!("{CM}/big");
    // Each body is under the 3 MiB request limit; each result is over the object bound.
    let add = json!({"data": {"c": "y".repeat(1024 * 1024 + 10)}});
    for ct in [MERGE_PATCH, STRATEGIC_PATCH] {
        let (code, status) = patch(&base, &path, ct, &add).await;
        assert_eq!(code, 413, "{ct}: {}", status["message"]);
        assert_eq!(status["reason"], "RequestEntityTooLarge");
    }
    let ops = json!([{"op": "copy", "from": "/data/a", "path": "/data/c"}]);
    let (code, status) = patch(&base, &path, JSON_PATCH, &ops).await;
    assert_eq!(code, 413, "json patch: {}", status["message"]);
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"c": "y".repeat(1024 * 1024 + 10)}});
    let (code, status) = patch(&base, &format!("{path}?fieldManager=m"), APPLY_PATCH, &config).await;
    assert_eq!(code, 413, "apply: {}", status["message"]);
    assert_alive_and_unchanged(&base, "big", &data).await;
    env.shutdown().await;
}
