//! Multi-version CRDs as kube-apiserver serves them: the preferred version by version priority,
//! one storage version, `None` and `Webhook` conversion on every read and write (kubectl in both
//! versions, a webhook that is down, watches), deprecation warnings, the status subresource's
//! write rules, and printer columns in `kubectl get`.

mod common;

use common::webhook_server::{WebhookServer, conversion_response};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// `foos.example.com`, listed v1alpha1, v1 (storage), v1beta1; one schema (`spec.size`,
/// `status`), the status subresource, conversion `None`. v1 has printer columns, v1alpha1 is
/// deprecated with the default warning, v1beta1 with its own.
fn foo_crd() -> Value {
    let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
        "status": {"type": "object", "properties": {
            "ready": {"type": "boolean"},
            "conditions": {"type": "array", "items": {"type": "object", "properties": {
                "type": {"type": "string"}, "status": {"type": "string"}}}}}},
    }}});
    let version = |name: &str, storage: bool| json!({"name": name, "served": true, "storage": storage, "schema": schema, "subresources": {"status": {}}});
    let mut v1alpha1 = version("v1alpha1", false);
    v1alpha1["deprecated"] = json!(true);
    let mut v1 = version("v1", true);
    v1["additionalPrinterColumns"] = json!([
        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
        {"name": "Wide", "type": "string", "jsonPath": ".metadata.labels.tier", "priority": 1},
    ]);
    let mut v1beta1 = version("v1beta1", false);
    v1beta1["deprecated"] = json!(true);
    v1beta1["deprecationWarning"] = json!("v1beta1 foos go away in 2.0");
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "foos.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "foos", "singular": "foo", "kind": "Foo"},
            "versions": [v1alpha1, v1, v1beta1],
        },
    })
}

/// `widgets.conv.example.com`: v1alpha1 has `spec.size`, v1 (storage) `spec.replicas`,
/// converted by the webhook at `client_config`; v1alpha1 is deprecated.
fn widget_crd(client_config: Value) -> Value {
    let schema = |field: &str| {
        json!({"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {field: {"type": "integer"}}},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.conv.example.com"},
        "spec": {
            "group": "conv.example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1alpha1", "served": true, "storage": false, "deprecated": true,
                    "schema": schema("size"), "subresources": {"status": {},
                        "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.replicas"}}},
                {"name": "v1", "served": true, "storage": true, "schema": schema("replicas"),
                    "subresources": {"status": {},
                        "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}},
            ],
            "conversion": {"strategy": "Webhook", "webhook": {
                "clientConfig": client_config, "conversionReviewVersions": ["v1"]}},
        },
    })
}

/// The widget conversion: `spec.size` (v1alpha1) ↔ `spec.replicas` (v1).
fn convert_widget(mut obj: Value, desired: &str) -> Value {
    let spec = obj["spec"].as_object_mut().cloned().unwrap_or_default();
    let (from, to) = if desired.ends_with("/v1") {
        ("size", "replicas")
    } else {
        ("replicas", "size")
    };
    let mut out = spec.clone();
    if let Some(v) = out.remove(from) {
        out.insert(to.to_owned(), v);
    }
    obj["spec"] = Value::Object(out);
    obj["apiVersion"] = json!(desired);
    obj
}

async fn conversion_webhook() -> WebhookServer {
    WebhookServer::start(|_, review| conversion_response(&review, convert_widget)).await
}

/// envtest serving the widget CRD, converted by a webhook the test runs: the server, its
/// client and the webhook (which the test may stop).
async fn start_with_converted_widgets() -> (envtest::Server, kube::Client, WebhookServer) {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let webhook = conversion_webhook().await;
    create_crd(&client, widget_crd(webhook.client_config("/convert"))).await;
    (env, client, webhook)
}

async fn create_crd(client: &kube::Client, crd: Value) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.create(&PostParams::default(), &serde_json::from_value(crd).unwrap())
        .await
        .unwrap();
}

/// The namespaced API of `kind` in `group/version`.
fn api(client: &kube::Client, group: &str, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client.clone(), "default", &resource)
}

fn foos(client: &kube::Client, version: &str) -> Api<DynamicObject> {
    api(client, "example.com", version, "Foo", "foos")
}

fn widgets(client: &kube::Client, version: &str) -> Api<DynamicObject> {
    api(client, "conv.example.com", version, "Widget", "widgets")
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// A v1 widget `name` with `spec.replicas`.
fn widget_v1(name: &str, replicas: i64) -> DynamicObject {
    object(json!({"apiVersion": "conv.example.com/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"replicas": replicas}}))
}

fn value(obj: &DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap()
}

/// The objects envtest stores for a collection path.
fn stored(env: &envtest::Server, path: &str) -> Vec<Value> {
    env.objects_of(path).unwrap()
}

/// GET `path` through `client`: status, `Warning` headers, body.
async fn get_raw(client: &kube::Client, path: &str) -> (u16, Vec<String>, Value) {
    let request = http::Request::get(path).body(kube::client::Body::empty()).unwrap();
    let response = client.send(request).await.unwrap();
    let status = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let body = response.into_body().collect_bytes().await.unwrap();
    (status, warnings, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn the_preferred_version_is_the_highest_by_priority_not_the_first_listed() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    create_crd(&env.client(), foo_crd()).await;
    let (_, _, group) = get_raw(&env.client(), "/apis/example.com").await;
    assert_eq!(group["preferredVersion"]["version"], "v1", "{group}");
    let order: Vec<&str> = group["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["v1", "v1beta1", "v1alpha1"]);
    let (_, _, groups) = get_raw(&env.client(), "/apis").await;
    let listed = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "example.com")
        .unwrap();
    assert_eq!(listed["preferredVersion"]["groupVersion"], "example.com/v1");
    assert_eq!(listed["versions"], group["versions"]);
    env.shutdown().await;
}

#[tokio::test]
async fn none_conversion_rewrites_the_api_version_and_stores_in_the_storage_version() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    create_crd(&client, foo_crd()).await;
    let created = foos(&client, "v1alpha1")
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "example.com/v1alpha1", "kind": "Foo",
                "metadata": {"name": "f1"}, "spec": {"size": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(
        value(&created)["apiVersion"],
        "example.com/v1alpha1",
        "answered in the request's version"
    );

    let stored = stored(&env, "/apis/example.com/v1/namespaces/default/foos");
    assert_eq!(stored.len(), 1, "stored once");
    assert_eq!(stored[0]["apiVersion"], "example.com/v1", "in the storage version");
    assert_eq!(stored[0]["spec"]["size"], 3);

    for version in ["v1", "v1beta1", "v1alpha1"] {
        let got = value(&foos(&client, version).get("f1").await.unwrap());
        assert_eq!(got["apiVersion"], format!("example.com/{version}"));
        assert_eq!(got["spec"]["size"], 3);
        let list = foos(&client, version).list(&Default::default()).await.unwrap();
        assert_eq!(list.items.len(), 1);
        assert_eq!(value(&list.items[0])["apiVersion"], format!("example.com/{version}"));
    }

    // A patch in a non-storage version is applied to the object in that version and stored in
    // the storage version.
    let patched = foos(&client, "v1beta1")
        .patch(
            "f1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(value(&patched)["apiVersion"], "example.com/v1beta1");
    let again = stored_one(&env);
    assert_eq!(
        (again["apiVersion"].as_str(), again["spec"]["size"].as_i64()),
        (Some("example.com/v1"), Some(4))
    );
    env.shutdown().await;
}

fn stored_one(env: &envtest::Server) -> Value {
    stored(env, "/apis/example.com/v1/namespaces/default/foos").remove(0)
}

#[tokio::test]
async fn a_crd_has_exactly_one_storage_version_and_records_every_one_it_had() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for storage in [[true, true], [false, false]] {
        let mut crd = foo_crd();
        crd["spec"]["versions"][0]["storage"] = json!(storage[0]);
        crd["spec"]["versions"][1]["storage"] = json!(storage[1]);
        let e = api_error(
            crds.create(&PostParams::default(), &serde_json::from_value(crd).unwrap())
                .await
                .unwrap_err(),
        );
        assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"), "{storage:?}: {e:?}");
        assert!(
            e.message.starts_with("CustomResourceDefinition.apiextensions.k8s.io \"foos.example.com\" is invalid: spec.versions: Invalid value: ")
                && e.message.ends_with(": must have exactly one version marked as storage version"),
            "{e:?}"
        );
    }
    create_crd(&client, foo_crd()).await;
    let crd = crds.get("foos.example.com").await.unwrap();
    assert_eq!(crd.status.unwrap().stored_versions, Some(vec!["v1".to_owned()]));
    // Moving storage to v1beta1 keeps v1 in storedVersions: objects may still be stored in it.
    crds.patch(
        "foos.example.com",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([
                {"op": "replace", "path": "/spec/versions/1/storage", "value": false},
                {"op": "replace", "path": "/spec/versions/2/storage", "value": true},
            ]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    let crd = crds.get("foos.example.com").await.unwrap();
    assert_eq!(
        crd.status.unwrap().stored_versions,
        Some(vec!["v1".to_owned(), "v1beta1".to_owned()])
    );
    env.shutdown().await;
}

#[tokio::test]
async fn deprecated_versions_warn_on_every_request() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    create_crd(&client, foo_crd()).await;
    let path = |v: &str| format!("/apis/example.com/{v}/namespaces/default/foos");
    let (code, warnings, _) = get_raw(&client, &path("v1alpha1")).await;
    assert_eq!(code, 200);
    assert_eq!(
        warnings,
        ["299 - \"example.com/v1alpha1 Foo is deprecated; use example.com/v1 Foo\""]
    );
    let (code, warnings, _) = get_raw(&client, &format!("{}/missing", path("v1beta1"))).await;
    assert_eq!(code, 404, "a failed request warns too");
    assert_eq!(warnings, ["299 - \"v1beta1 foos go away in 2.0\""]);
    let (_, warnings, _) = get_raw(&client, &path("v1")).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    env.shutdown().await;
}

#[tokio::test]
async fn status_is_ignored_on_create_and_update_and_status_writes_change_only_status() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    create_crd(&client, foo_crd()).await;
    let api = foos(&client, "v1");
    let created = api
        .create(
            &PostParams::default(),
            &object(
                json!({"apiVersion": "example.com/v1", "kind": "Foo", "metadata": {"name": "s"},
                "spec": {"size": 1}, "status": {"ready": true}}),
            ),
        )
        .await
        .unwrap();
    assert!(
        value(&created).get("status").is_none(),
        "create drops status: {:?}",
        created
    );
    assert!(stored_one(&env).get("status").is_none());

    // /status changes status only: the spec and label sent with it are reset.
    let mut body = value(&created);
    body["status"] = json!({"ready": true});
    body["spec"]["size"] = json!(9);
    body["metadata"]["labels"] = json!({"tier": "web"});
    let after = value(
        &api.replace_status("s", &PostParams::default(), &object(body))
            .await
            .unwrap(),
    );
    assert_eq!(after["status"], json!({"ready": true}));
    assert_eq!(after["spec"]["size"], 1);
    assert!(after["metadata"]["labels"].is_null(), "{after}");

    // The main resource's update and patch keep the stored status.
    let mut body = after.clone();
    body["status"] = json!({"ready": false});
    body["spec"]["size"] = json!(2);
    let updated = value(&api.replace("s", &PostParams::default(), &object(body)).await.unwrap());
    assert_eq!(
        (updated["spec"]["size"].as_i64(), &updated["status"]),
        (Some(2), &json!({"ready": true}))
    );
    let patched = value(
        &api.patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": false}})),
        )
        .await
        .unwrap(),
    );
    assert_eq!(patched["status"], json!({"ready": true}));
    env.shutdown().await;
}

#[tokio::test]
async fn a_conversion_webhook_that_is_down_fails_other_versions_with_500() {
    let (env, client, mut webhook) = start_with_converted_widgets().await;
    widgets(&client, "v1")
        .create(&PostParams::default(), &widget_v1("w", 2))
        .await
        .unwrap();
    let got = value(&widgets(&client, "v1alpha1").get("w").await.unwrap());
    assert_eq!(got["spec"], json!({"size": 2}), "converted while the webhook is up");
    webhook.stop().await;

    let url = webhook.url("/convert?timeout=30s");
    let e = api_error(widgets(&client, "v1alpha1").get("w").await.unwrap_err());
    assert_eq!(e.code, 500, "{e:?}");
    assert!(
        e.message.starts_with(&format!(
            "conversion webhook for conv.example.com/v1, Kind=Widget failed: Post \"{url}\": "
        )),
        "{e:?}"
    );
    let e = api_error(
        widgets(&client, "v1alpha1")
            .list(&Default::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 500, "{e:?}");
    let e = api_error(
        widgets(&client, "v1alpha1")
            .create(
                &PostParams::default(),
                &object(json!({"apiVersion": "conv.example.com/v1alpha1", "kind": "Widget",
                    "metadata": {"name": "w2"}, "spec": {"size": 1}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 500, "{e:?}");
    assert!(
        e.message
            .starts_with("conversion webhook for conv.example.com/v1alpha1, Kind=Widget failed: "),
        "{e:?}"
    );
    // The storage version needs no webhook.
    let got = value(&widgets(&client, "v1").get("w").await.unwrap());
    assert_eq!(got["spec"], json!({"replicas": 2}));
    assert_eq!(
        stored(&env, "/apis/conv.example.com/v1/namespaces/default/widgets").len(),
        1
    );
    env.shutdown().await;
}

#[tokio::test]
async fn the_status_and_scale_subresources_convert_too() {
    let (env, client, mut webhook) = start_with_converted_widgets().await;
    widgets(&client, "v1")
        .create(&PostParams::default(), &widget_v1("w", 2))
        .await
        .unwrap();
    let alpha = widgets(&client, "v1alpha1");
    // v1alpha1's scale reads its own path, .spec.size, of the converted object.
    let scale = alpha.get_scale("w").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    alpha
        .patch_scale(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 6}})),
        )
        .await
        .unwrap();
    let status = value(
        &alpha
            .patch_status(
                "w",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"replicas": 6}})),
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        (status["apiVersion"].as_str(), &status["spec"]),
        (Some("conv.example.com/v1alpha1"), &json!({"size": 6}))
    );
    let stored = stored(&env, "/apis/conv.example.com/v1/namespaces/default/widgets").remove(0);
    assert_eq!(
        (&stored["spec"], &stored["status"]),
        (&json!({"replicas": 6}), &json!({"replicas": 6})),
        "written through v1alpha1's subresources, stored in v1"
    );

    webhook.stop().await;
    let e = api_error(alpha.get_scale("w").await.unwrap_err());
    assert_eq!(e.code, 500, "{e:?}");
    let e = api_error(alpha.get_status("w").await.unwrap_err());
    assert_eq!(e.code, 500, "{e:?}");
    let e = api_error(alpha.delete("w", &Default::default()).await.unwrap_err());
    assert_eq!(e.code, 500, "a delete reads the object in its version too: {e:?}");
    assert_eq!(stored_len(&env), 1);
    env.shutdown().await;
}

fn stored_len(env: &envtest::Server) -> usize {
    stored(env, "/apis/conv.example.com/v1/namespaces/default/widgets").len()
}

#[tokio::test]
async fn a_watch_whose_conversion_fails_ends_with_an_error_event() {
    let (env, client, mut webhook) = start_with_converted_widgets().await;
    let mut events = widgets(&client, "v1alpha1")
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    webhook.stop().await;
    widgets(&client, "v1")
        .create(&PostParams::default(), &widget_v1("w", 1))
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("an event within 10s")
        .unwrap()
        .expect("an event before the end");
    match event {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 500, "{status:?}");
            assert!(
                status
                    .message
                    .starts_with("conversion webhook for conv.example.com/v1, Kind=Widget failed: "),
                "{status:?}"
            );
        }
        other => panic!("expected an ERROR event, got {other:?}"),
    }
    let end = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("the stream ends within 10s");
    assert!(matches!(end, Ok(None)), "{end:?}");
    env.shutdown().await;
}

#[tokio::test]
async fn a_webhook_that_changes_an_objects_identity_is_refused() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let webhook = WebhookServer::start(|_, review| {
        conversion_response(&review, |obj, desired| {
            let mut out = convert_widget(obj, desired);
            out["metadata"]["uid"] = json!("changed");
            out
        })
    })
    .await;
    create_crd(&client, widget_crd(webhook.client_config("/convert"))).await;
    let e = api_error(
        widgets(&client, "v1alpha1")
            .create(
                &PostParams::default(),
                &object(json!({"apiVersion": "conv.example.com/v1alpha1", "kind": "Widget",
                    "metadata": {"name": "w"}, "spec": {"size": 1}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 500);
    assert!(
        e.message.starts_with(
            "conversion webhook for conv.example.com/v1alpha1, Kind=Widget returned invalid object: must have the same UID: "
        ),
        "{e:?}"
    );
    assert!(stored(&env, "/apis/conv.example.com/v1/namespaces/default/widgets").is_empty());
    env.shutdown().await;
}

#[tokio::test]
async fn a_watch_in_a_non_storage_version_receives_converted_events() {
    let (env, client, _webhook) = start_with_converted_widgets().await;
    let alpha = widgets(&client, "v1alpha1");
    let mut events = alpha.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let v1 = widgets(&client, "v1");
    v1.create(&PostParams::default(), &widget_v1("w", 7)).await.unwrap();
    v1.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 8}})),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .expect("an event within 10s")
            .unwrap()
            .expect("the watch goes on");
        match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => seen.push(value(&o)),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    for (event, size) in seen.iter().zip([7, 8]) {
        assert_eq!(event["apiVersion"], "conv.example.com/v1alpha1");
        assert_eq!(event["spec"], json!({"size": size}));
    }
    env.shutdown().await;
}

// kubectl: the machine's binary against envtest, in a temporary HOME.

fn kubectl_available() -> bool {
    Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

struct Kubectl {
    home: PathBuf,
}

impl Kubectl {
    fn new(env: &envtest::Server, name: &str) -> Kubectl {
        let home = std::env::temp_dir().join(format!("envtest-crd-versions-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        env.write_kubeconfig(home.join("kubeconfig")).unwrap();
        Kubectl { home }
    }

    async fn run(&self, args: &[&str]) -> Output {
        let home = self.home.clone();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            Command::new("kubectl")
                .args(&args)
                .arg("--request-timeout=20s")
                .env("HOME", &home)
                .env("KUBECONFIG", home.join("kubeconfig"))
                .output()
                .unwrap()
        })
        .await
        .unwrap()
    }

    /// Runs kubectl and returns (stdout, stderr), failing the test if it fails.
    async fn ok(&self, args: &[&str]) -> (String, String) {
        let out = self.run(args).await;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "kubectl {args:?} failed: {stdout}\n{stderr}");
        (stdout, stderr)
    }

    fn file(&self, name: &str, content: &str) -> String {
        let path = self.home.join(name);
        std::fs::write(&path, content).unwrap();
        path_str(&path)
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn path_str(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_conversion_round_trips_through_kubectl_in_both_versions() {
    if !kubectl_available() {
        eprintln!("SKIPPED: kubectl is not installed on this machine");
        return;
    }
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let webhook = conversion_webhook().await;
    create_crd(&env.client(), widget_crd(webhook.client_config("/convert"))).await;
    let kubectl = Kubectl::new(&env, "webhook");

    // Written in v1alpha1 (spec.size), stored in v1 (spec.replicas).
    let alpha = kubectl.file(
        "alpha.yaml",
        "apiVersion: conv.example.com/v1alpha1\nkind: Widget\nmetadata: {name: a}\nspec: {size: 3}\n",
    );
    let (_, stderr) = kubectl.ok(&["apply", "-f", &alpha]).await;
    assert!(
        stderr.contains("Warning: conv.example.com/v1alpha1 Widget is deprecated; use conv.example.com/v1 Widget"),
        "{stderr}"
    );
    let stored = stored(&env, "/apis/conv.example.com/v1/namespaces/default/widgets");
    assert_eq!(
        (stored[0]["apiVersion"].as_str(), &stored[0]["spec"]),
        (Some("conv.example.com/v1"), &json!({"replicas": 3}))
    );
    // kubectl's default is the preferred version, v1.
    let (out, _) = kubectl.ok(&["get", "widgets", "a", "-o", "json"]).await;
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (got["apiVersion"].as_str(), &got["spec"]),
        (Some("conv.example.com/v1"), &json!({"replicas": 3}))
    );
    let (out, _) = kubectl
        .ok(&[
            "get",
            "widgets.v1alpha1.conv.example.com",
            "a",
            "-o",
            "jsonpath={.spec.size}",
        ])
        .await;
    assert_eq!(out, "3");

    // Applied again in v1alpha1: a patch computed on the v1alpha1 object.
    kubectl.file(
        "alpha.yaml",
        "apiVersion: conv.example.com/v1alpha1\nkind: Widget\nmetadata: {name: a}\nspec: {size: 4}\n",
    );
    kubectl.ok(&["apply", "-f", &alpha]).await;
    let (out, _) = kubectl
        .ok(&["get", "widgets", "a", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(out, "4");

    // Written in v1, read in v1alpha1.
    let v1 = kubectl.file(
        "v1.yaml",
        "apiVersion: conv.example.com/v1\nkind: Widget\nmetadata: {name: b}\nspec: {replicas: 5}\n",
    );
    kubectl.ok(&["apply", "-f", &v1]).await;
    let (out, _) = kubectl
        .ok(&["get", "widgets.v1alpha1.conv.example.com", "b", "-o", "json"])
        .await;
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (got["apiVersion"].as_str(), &got["spec"]),
        (Some("conv.example.com/v1alpha1"), &json!({"size": 5}))
    );
    // Every review envtest sent was an apiextensions.k8s.io/v1 ConversionReview.
    let received = webhook.received();
    assert!(!received.is_empty());
    for (path, review) in received {
        assert_eq!(path, "/convert");
        assert_eq!(review["apiVersion"], "apiextensions.k8s.io/v1");
        assert!(review["request"]["uid"].as_str().is_some_and(|u| !u.is_empty()));
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printer_columns_reach_kubectl_get() {
    if !kubectl_available() {
        eprintln!("SKIPPED: kubectl is not installed on this machine");
        return;
    }
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    create_crd(&client, foo_crd()).await;
    let api = foos(&client, "v1");
    api.create(
        &PostParams::default(),
        &object(json!({"apiVersion": "example.com/v1", "kind": "Foo",
            "metadata": {"name": "f1", "labels": {"tier": "web"}}, "spec": {"size": 3}})),
    )
    .await
    .unwrap();
    api.patch_status(
        "f1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}})),
    )
    .await
    .unwrap();
    let kubectl = Kubectl::new(&env, "columns");
    let (out, _) = kubectl.ok(&["get", "foos"]).await;
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines, [vec!["NAME", "SIZE", "READY"], vec!["f1", "3", "True"]], "{out}");
    let (out, _) = kubectl.ok(&["get", "foos", "-o", "wide"]).await;
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        lines,
        [vec!["NAME", "SIZE", "READY", "WIDE"], vec!["f1", "3", "True", "web"]],
        "{out}"
    );
    // A watch asked for a Table sends one per event: `kubectl get --watch` prints the change in
    // the same columns.
    let mut watch = tokio::process::Command::new("kubectl")
        .args(["get", "foos", "--watch"])
        .env("HOME", &kubectl.home)
        .env("KUBECONFIG", kubectl.home.join("kubeconfig"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut next_line = async || {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("kubectl prints within 20s")
            .unwrap()
            .expect("kubectl goes on watching");
        line.split_whitespace().map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(next_line().await, ["NAME", "SIZE", "READY"]);
    assert_eq!(next_line().await, ["f1", "3", "True"]);
    api.patch(
        "f1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 4}})),
    )
    .await
    .unwrap();
    assert_eq!(
        next_line().await,
        ["f1", "4", "True"],
        "the event, as a row of the same table"
    );
    watch.kill().await.unwrap();
    // A version without columns: Name and Age.
    let (out, _) = kubectl.ok(&["get", "foos.v1beta1.example.com"]).await;
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "AGE"], "{out}");
    assert_eq!(lines[1][0], "f1", "{out}");
    assert!(lines[1][1].ends_with('s'), "an age in seconds: {out}");
    env.shutdown().await;
}
