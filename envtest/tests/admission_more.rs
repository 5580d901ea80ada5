//! More of envtest's admission chain against real HTTPS webhooks: the forms of a mutating
//! patch (base64 or kube-rs's array of bytes), v1beta1 reviews, what a create with
//! `generateName` and a write to a Namespace send, the namespace checks that run before any
//! webhook, deletecollection admitted per object, selectors on deletes and namespaces; and the
//! CRD printer-column check.

mod common;

use base64::Engine;
use common::admission::{
    answer, api_error, configmap, core_rule, mutating, reviews, start_validating, validating, webhook,
};
use common::webhook_server::WebhookServer;
use envtest::{Config, Server};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const ADD_LABEL: &str = r#"[{"op":"add","path":"/metadata/labels","value":{"patched":"yes"}}]"#;

/// A patch written as an array of numbers (Go decodes a `[]byte` from it too; kube-rs's
/// `AdmissionResponse` writes it so) is applied like a base64 one; a patch of another JSON
/// shape fails the call as an invalid response.
#[tokio::test]
async fn a_patch_as_an_array_of_bytes_is_applied_and_another_shape_refused() {
    let hooks = WebhookServer::start(|path, review| {
        let patch = match path {
            "/array" => json!(ADD_LABEL.as_bytes()),
            _ => json!({"op": "add"}),
        };
        answer(&review, true, json!({"patchType": "JSONPatch", "patch": patch}))
    })
    .await;
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let hook = |name: &str, path: &str, label: &str| {
        webhook(
            name,
            hooks.client_config(path),
            core_rule(&["configmaps"], &["CREATE"]),
            json!({"objectSelector": {"matchLabels": {"hook": label}}}),
        )
    };
    mutating(
        &client,
        "patches",
        vec![
            hook("array.example.com", "/array", "array"),
            hook("object.example.com", "/object", "object"),
        ],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &configmap("a", json!({"hook": "array"})))
        .await
        .unwrap();
    assert_eq!(
        created.metadata.labels.unwrap().get("patched").map(String::as_str),
        Some("yes")
    );
    let e = api_error(
        cms.create(&PostParams::default(), &configmap("b", json!({"hook": "object"})))
            .await,
    );
    assert_eq!(e.code, 500);
    assert!(
        e.message.contains("failed calling webhook \"object.example.com\": received invalid webhook response: json: cannot unmarshal object"),
        "{}",
        e.message
    );
    env.shutdown().await;
}

/// A webhook that speaks only v1beta1 gets a v1beta1 review, and its answer is honoured as
/// kube-apiserver honours v1beta1 answers: neither the uid nor the kind is checked, and a
/// patch without `patchType` is a JSON patch.
#[tokio::test]
async fn a_v1beta1_webhook_gets_a_v1beta1_review_and_its_answer_is_honoured() {
    let hooks = WebhookServer::start(|_, _review| {
        let patch = base64::engine::general_purpose::STANDARD.encode(ADD_LABEL);
        json!({"response": {"uid": "not-the-request-uid", "allowed": true, "patch": patch}})
    })
    .await;
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let mut hook = webhook(
        "beta.example.com",
        hooks.client_config("/beta"),
        core_rule(&["configmaps"], &["CREATE"]),
        json!({}),
    );
    hook["admissionReviewVersions"] = json!(["v1beta1"]);
    mutating(&client, "beta", vec![hook]).await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &configmap("beta", json!({})))
        .await
        .unwrap();
    assert_eq!(
        created.metadata.labels.unwrap().get("patched").map(String::as_str),
        Some("yes")
    );
    let calls = reviews(&hooks, "/beta");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(calls[0]["request"]["object"]["metadata"]["name"], "beta");
    env.shutdown().await;
}

/// envtest calling `hooks` on every ConfigMap create: a mutating webhook (`m.example.com`) on
/// `/mutate`, then a validating one (`v.example.com`) on `/validate`. The server and its client.
async fn start_with_configmap_create_hooks(hooks: &WebhookServer) -> (Server, kube::Client) {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let hook = |name: &str, path: &str| {
        webhook(
            name,
            hooks.client_config(path),
            core_rule(&["configmaps"], &["CREATE"]),
            json!({}),
        )
    };
    mutating(&client, "m", vec![hook("m.example.com", "/mutate")]).await;
    validating(&client, "v", vec![hook("v.example.com", "/validate")]).await;
    (env, client)
}

/// With `generateName`, mutating webhooks see no name (the name is generated after them, in
/// kube-apiserver's BeforeCreate); validating webhooks see the generated one.
#[tokio::test]
async fn mutating_webhooks_see_generate_name_before_the_name_is_generated() {
    let hooks = WebhookServer::start(|_, review| answer(&review, true, json!({}))).await;
    let (env, client) = start_with_configmap_create_hooks(&hooks).await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}, "data": {"k": "v"}})).unwrap();
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let name = created.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    let m = &reviews(&hooks, "/mutate")[0]["request"];
    assert_eq!(m.get("name").and_then(Value::as_str).unwrap_or(""), "");
    assert_eq!(m["object"]["metadata"].get("name"), None);
    assert_eq!(m["object"]["metadata"]["generateName"], "gen-");
    let v = &reviews(&hooks, "/validate")[0]["request"];
    assert_eq!(v["name"], name.as_str());
    assert_eq!(v["object"]["metadata"]["name"], name.as_str());
    env.shutdown().await;
}

/// A create in a namespace that does not exist is refused with kube-apiserver's 404 before
/// any webhook is called (its NamespaceLifecycle plugin runs first).
#[tokio::test]
async fn a_create_in_a_missing_namespace_reaches_no_webhook() {
    let hooks = WebhookServer::start(|_, review| answer(&review, true, json!({}))).await;
    let (env, client) = start_with_configmap_create_hooks(&hooks).await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "missing");
    let e = api_error(cms.create(&PostParams::default(), &configmap("a", json!({}))).await);
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "namespaces \"missing\" not found");
    assert!(hooks.received().is_empty(), "{:?}", hooks.received());
    env.shutdown().await;
}

/// A write to a Namespace is admitted in that namespace (`request.namespace` is its name, as
/// kube-apiserver's RequestInfo reads it from `/api/v1/namespaces/<name>`), a create of one in
/// none; a namespaceSelector matches a Namespace by its own labels.
#[tokio::test]
async fn a_namespace_is_admitted_in_itself_and_selected_by_its_own_labels() {
    let hooks = WebhookServer::start(|_, review| answer(&review, true, json!({}))).await;
    let (env, client) = start_validating(
        "namespaces",
        vec![webhook(
            "ns.example.com",
            hooks.client_config("/ns"),
            core_rule(&["namespaces"], &["CREATE", "UPDATE", "DELETE"]),
            json!({"namespaceSelector": {"matchLabels": {"watched": "true"}}}),
        )],
    )
    .await;
    let namespaces = Api::<Namespace>::all(client.clone());
    for (name, watched) in [("seen", "true"), ("unseen", "false")] {
        let ns = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"watched": watched}}})).unwrap();
        namespaces.create(&PostParams::default(), &ns).await.unwrap();
        let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
        namespaces
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        namespaces.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let calls = reviews(&hooks, "/ns");
    let seen: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|c| {
            let r = &c["request"];
            (
                r["operation"].as_str().unwrap(),
                r["name"].as_str().unwrap_or(""),
                r.get("namespace").and_then(Value::as_str).unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("CREATE", "seen", ""),
            ("UPDATE", "seen", "seen"),
            ("DELETE", "seen", "seen")
        ]
    );
    env.shutdown().await;
}

/// deletecollection admits each object's DELETE (objectSelector reading the old object's
/// labels) and, as kube-apiserver with its default single delete-collection worker, deletes in
/// order and stops at the first denial, which fails the request: objects before the denied one
/// are gone, it and those after it remain.
#[tokio::test]
async fn deletecollection_is_admitted_per_object_and_stops_at_a_denial() {
    let hooks = WebhookServer::start(|_, review| {
        let name = review["request"]["oldObject"]["metadata"]["name"]
            .as_str()
            .unwrap_or("");
        if name == "b" {
            answer(&review, false, json!({"status": {"code": 403, "message": "b is kept"}}))
        } else {
            answer(&review, true, json!({}))
        }
    })
    .await;
    let (env, client) = start_validating(
        "deletes",
        vec![webhook(
            "keep.example.com",
            hooks.client_config("/delete"),
            core_rule(&["configmaps"], &["DELETE"]),
            json!({"objectSelector": {"matchLabels": {"checked": "true"}}}),
        )],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    for (name, checked) in [("a", "true"), ("b", "true"), ("c", "true"), ("d", "false")] {
        cms.create(
            &PostParams::default(),
            &configmap(name, json!({"checked": checked, "set": "x"})),
        )
        .await
        .unwrap();
    }
    let e = api_error(
        cms.delete_collection(&DeleteParams::default(), &ListParams::default().labels("set=x"))
            .await,
    );
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "admission webhook \"keep.example.com\" denied the request: b is kept"
    );
    let left: Vec<String> = cms
        .list(&ListParams::default().labels("set=x"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(left, ["b", "c", "d"]);
    let names: Vec<String> = reviews(&hooks, "/delete")
        .iter()
        .map(|r| {
            r["request"]["oldObject"]["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(names, ["a", "b"], "each object's DELETE, in order, up to the denial");
    // The old object's labels decide the objectSelector: `d` is not checked, so deleting the
    // rest goes through once `b` is relabelled.
    let patch = json!({"metadata": {"labels": {"checked": "false"}}});
    cms.patch("b", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    cms.delete_collection(&DeleteParams::default(), &ListParams::default().labels("set=x"))
        .await
        .unwrap();
    assert_eq!(reviews(&hooks, "/delete").len(), 3, "only c is sent again");
    env.shutdown().await;
}

/// A CRD whose printer column's JSONPath does not start with `.` is refused as
/// kube-apiserver refuses it (422, at the Go field name `JSONPath`).
#[tokio::test]
async fn a_printer_column_path_without_a_leading_dot_is_refused() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let env = Server::start(Config::default()).await.unwrap();
    let crds = Api::<CustomResourceDefinition>::all(env.client());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": "spec.size"}]}]}
    }))
    .unwrap();
    let e = api_error(crds.create(&PostParams::default(), &crd).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message.contains(
            "spec.versions[0].additionalPrinterColumns[0].JSONPath: Invalid value: \"spec.size\": must be a simple json path starting with ."
        ),
        "{}",
        e.message
    );
    env.shutdown().await;
}

/// A CRD rule longer than cel-go's 100,000 code points (here a chain of 100,000 terms, which
/// would overflow the stack of whatever parsed it) is refused when the CRD is written.
#[tokio::test]
async fn a_crd_rule_over_the_size_limit_is_refused() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let env = Server::start(Config::default()).await.unwrap();
    let crds = Api::<CustomResourceDefinition>::all(env.client());
    let crd = |rule: String| -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": {"name": "gadgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "properties": {"n": {"type": "integer"}},
                        "x-kubernetes-validations": [{"rule": rule}]}}}]}
        }))
        .unwrap()
    };
    let long = format!("self.n == {}", vec!["1"; 100_000].join("+"));
    let e = api_error(crds.create(&PostParams::default(), &crd(long)).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .contains("expression code point size exceeds limit: size: 200009, limit 100000"),
        "{}",
        &e.message[e.message.len().saturating_sub(300)..]
    );
    let chain = format!("self.n == {}", vec!["1"; 1_000].join("+"));
    let e = api_error(crds.create(&PostParams::default(), &crd(chain)).await);
    assert!(
        e.message.contains("expression recursion limit exceeded: 250"),
        "{}",
        &e.message[e.message.len().saturating_sub(300)..]
    );
    env.shutdown().await;
}
