//! Building blocks of the admission tests: `AdmissionReview` answers a test webhook returns,
//! webhook configurations created through the API, and readers of what a webhook received.

use super::webhook_server::WebhookServer;
use envtest::{Config, Server};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// An `AdmissionReview` (v1) answer to `review`: its uid echoed, `allowed`, and `extra` merged
/// into the response (status, warnings, patch).
pub fn answer(review: &Value, allowed: bool, extra: Value) -> Value {
    let mut response = json!({"uid": review["request"]["uid"], "allowed": allowed});
    if let (Some(r), Some(e)) = (response.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            r.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// A mutating answer applying `patch` (a JSON patch).
pub fn patched(review: &Value, patch: Value) -> Value {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
    answer(review, true, json!({"patchType": "JSONPatch", "patch": encoded}))
}

/// One webhook of a configuration: `name`, calling `client_config`, for `rules`, with
/// `extra` fields (policies, selectors) merged in.
pub fn webhook(name: &str, client_config: Value, rules: Value, extra: Value) -> Value {
    let mut w = json!({"name": name, "clientConfig": client_config, "rules": rules,
        "sideEffects": "None", "admissionReviewVersions": ["v1"]});
    if let (Some(w), Some(e)) = (w.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            w.insert(k.clone(), v.clone());
        }
    }
    w
}

/// A rule for `resources` of the core group on `operations`.
pub fn core_rule(resources: &[&str], operations: &[&str]) -> Value {
    json!([{"apiGroups": [""], "apiVersions": ["v1"], "resources": resources, "operations": operations}])
}

/// Creates the ValidatingWebhookConfiguration `name` of `webhooks`.
pub async fn validating(client: &kube::Client, name: &str, webhooks: Vec<Value>) {
    create_configuration::<ValidatingWebhookConfiguration>(client, name, webhooks).await;
}

/// Creates the MutatingWebhookConfiguration `name` of `webhooks`.
pub async fn mutating(client: &kube::Client, name: &str, webhooks: Vec<Value>) {
    create_configuration::<MutatingWebhookConfiguration>(client, name, webhooks).await;
}

/// envtest with `webhooks` registered as the ValidatingWebhookConfiguration `name`: the server
/// and its client.
pub async fn start_validating(name: &str, webhooks: Vec<Value>) -> (Server, kube::Client) {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    validating(&client, name, webhooks).await;
    (env, client)
}

/// envtest with `webhooks` registered as the MutatingWebhookConfiguration `name`: the server
/// and its client.
pub async fn start_mutating(name: &str, webhooks: Vec<Value>) -> (Server, kube::Client) {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    mutating(&client, name, webhooks).await;
    (env, client)
}

async fn create_configuration<K>(client: &kube::Client, name: &str, webhooks: Vec<Value>)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Clone
        + std::fmt::Debug,
{
    let config: K = serde_json::from_value(json!({"metadata": {"name": name}, "webhooks": webhooks})).unwrap();
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// A ConfigMap `name` with `labels` and one data key.
pub fn configmap(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})).unwrap()
}

/// The API error of a failed write (panics on success: tests only).
pub fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A port on 127.0.0.1 where nothing listens (bound, then released).
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The reviews `server` received on `path`.
pub fn reviews(server: &WebhookServer, path: &str) -> Vec<Value> {
    server
        .received()
        .into_iter()
        .filter(|(p, _)| p == path)
        .map(|(_, b)| b)
        .collect()
}
