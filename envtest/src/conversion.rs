//! Conversion of custom resources between the versions of their CRD (apiextensions-apiserver's
//! `pkg/apiserver/conversion`).
//!
//! Where it sits: every object of a custom resource is stored in its CRD's storage version
//! (`crd::storage_version`). A request that names another version has its body converted to the
//! storage version before it is stored (create, update, patch, apply, `/status`, `/scale`), and
//! the objects it reads converted to its version before they are answered (get, list — one
//! conversion for the whole list —, each watch event, the object a write or delete returns). A
//! write's own logic (the patch, the status reset, validation against the version's schema)
//! runs on the object in the request's version, as kube-apiserver's per-version storage does:
//! read, convert to the request's version, change, validate, convert to the storage version,
//! store.
//!
//! Only objects whose `apiVersion` differs from the wanted one are converted (an object
//! stored before the storage version changed may already be in it). The CRD's
//! `spec.conversion.strategy` says how:
//! - `None`: only `apiVersion` is rewritten (the versions share one schema);
//! - `Webhook`: a `ConversionReview` (`apiextensions.k8s.io/v1`, or `v1beta1` if that is the
//!   first the CRD lists) is POSTed to `spec.conversion.webhook.clientConfig` by
//!   `webhook_client.rs` (TLS verified against the `caBundle`, 30 s timeout, `?timeout=30s` on
//!   the URL), and the response
//!   checked as kube-apiserver checks it: the `uid` matches, `result.status` is `Success`, as
//!   many objects as were sent, each in the wanted version, of the same kind, with the same
//!   name, namespace and uid; its other metadata is put back from the original but for labels
//!   and annotations, which the webhook may change. Any failure fails the request with `500`
//!   and kube-apiserver's message, `conversion webhook for <group>/<version>, Kind=<Kind>
//!   failed: <why>`.

use crate::resources::ResourceInfo;
use crate::status::ApiError;
use crate::storage::Storage;
use crate::webhook_client::WebhookClient;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The `ConversionReview` versions envtest sends, in the order it prefers them; a CRD's
/// `conversionReviewVersions` must list one.
pub(crate) const REVIEW_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// How long a conversion webhook may take (kube-apiserver's conversion webhook client timeout).
pub(crate) const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// How one CRD converts its objects between versions, read from its `spec.conversion`.
#[derive(Debug, Clone)]
pub(crate) struct Converter {
    group: String,
    kind: String,
    strategy: Strategy,
    /// Calls the webhook (shared with admission).
    client: WebhookClient,
}

#[derive(Debug, Clone)]
enum Strategy {
    /// Rewrite `apiVersion` only.
    None,
    /// A built-in resource stored in another resource's form: an `events.k8s.io/v1` Event
    /// stored as a core `v1` Event (`events.rs`).
    Events,
    /// Ask the webhook.
    Webhook {
        /// `spec.conversion.webhook.clientConfig` (`url` or `service`, `caBundle`).
        client_config: Value,
        /// The `ConversionReview` version to send (`v1` or `v1beta1`).
        review_version: &'static str,
    },
}

impl Converter {
    /// The converter of `crd` (a stored, valid CRD: an unknown strategy converts as `None`,
    /// since validation refused it at the CRD's write).
    pub(crate) fn for_crd(crd: &Value, client: &WebhookClient) -> Converter {
        let spec = &crd["spec"];
        let conversion = &spec["conversion"];
        let strategy = match conversion["strategy"].as_str() {
            Some("Webhook") => {
                let webhook = &conversion["webhook"];
                let review_version = webhook["conversionReviewVersions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .find_map(|v| REVIEW_VERSIONS.iter().find(|r| **r == v).copied())
                    .unwrap_or("v1");
                Strategy::Webhook {
                    client_config: webhook["clientConfig"].clone(),
                    review_version,
                }
            }
            _ => Strategy::None,
        };
        Converter {
            group: spec["group"].as_str().unwrap_or("").to_owned(),
            kind: spec["names"]["kind"].as_str().unwrap_or("").to_owned(),
            strategy,
            client: client.clone(),
        }
    }

    /// The converter between the two Event views (`events.rs`), converting to `group`'s form
    /// (`""` for core `v1`, where Events are stored; `events.k8s.io`).
    pub(crate) fn events(group: &str, client: &WebhookClient) -> Converter {
        Converter {
            group: group.to_owned(),
            kind: "Event".to_owned(),
            strategy: Strategy::Events,
            client: client.clone(),
        }
    }

    /// `group/version` (`version` alone for the core group).
    pub(crate) fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// Converts one object to `version` (unchanged if it is in it already).
    pub(crate) async fn convert(&self, obj: Value, version: &str) -> Result<Value, ApiError> {
        let mut out = self.convert_all(vec![obj], version, Shape::Object).await?;
        out.pop()
            .ok_or_else(|| failed(&gvk_of(&Value::Null, &self.kind), "no objects returned"))
    }

    /// Converts the items of a list to `version` in one conversion (one webhook call for every
    /// item not in it already), keeping their order.
    pub(crate) async fn convert_list(&self, items: Vec<Value>, version: &str) -> Result<Vec<Value>, ApiError> {
        self.convert_all(items, version, Shape::List).await
    }

    async fn convert_all(&self, mut objects: Vec<Value>, version: &str, shape: Shape) -> Result<Vec<Value>, ApiError> {
        let desired = self.api_version(version);
        let todo: Vec<usize> = (0..objects.len())
            .filter(|i| objects[*i]["apiVersion"].as_str() != Some(desired.as_str()))
            .collect();
        if todo.is_empty() {
            return Ok(objects);
        }
        match &self.strategy {
            Strategy::None => {
                for i in todo {
                    if let Some(map) = objects[i].as_object_mut() {
                        map.insert("apiVersion".into(), Value::String(desired.clone()));
                    }
                }
                Ok(objects)
            }
            Strategy::Events => {
                for i in todo {
                    objects[i] = crate::events::convert(std::mem::take(&mut objects[i]), &desired);
                }
                Ok(objects)
            }
            Strategy::Webhook {
                client_config,
                review_version,
            } => {
                // The source version named in errors: the first object sent, as kube-apiserver
                // names the object (or list) it was converting.
                let source = gvk_of(&objects[todo[0]], &self.kind);
                let uid = crate::object::new_uid();
                let sent: Vec<Value> = todo.iter().map(|i| objects[*i].clone()).collect();
                let review = review_request(review_version, &uid, &desired, &sent);
                tracing::debug!(group = %self.group, kind = %self.kind, %desired, objects = sent.len(), "calling conversion webhook");
                let response = self
                    .client
                    .post(client_config, &review, WEBHOOK_TIMEOUT)
                    .await
                    .map_err(|e| {
                        tracing::warn!(group = %self.group, kind = %self.kind, %desired, error = %e, "conversion webhook call failed");
                        // kube-apiserver's conversion message carries the HTTP client's error
                        // alone (`Post "<url>": <why>`).
                        let why = e.to_string();
                        failed(&source, why.strip_prefix("failed to call webhook: ").unwrap_or(&why))
                    })?;
                let converted = check_review(review_version, &uid, &response).map_err(|why| failed(&source, &why))?;
                if converted.len() != sent.len() {
                    return Err(internal(format!(
                        "conversion webhook for {source} returned {} objects, expected {}",
                        converted.len(),
                        sent.len()
                    )));
                }
                for (at, (i, converted)) in todo.into_iter().zip(converted).enumerate() {
                    objects[i] = check_converted(&objects[i], converted, &desired)
                        .map_err(|e| internal(e.message(&source, shape, at)))?;
                }
                Ok(objects)
            }
        }
    }
}

/// The converter of `info`, if its objects may be stored in another version or form: its CRD's
/// for a custom resource, the Event views' for `events.k8s.io` Events (for a watch, which
/// converts each event's object as it is sent).
pub(crate) fn for_resource(storage: &Storage, info: &ResourceInfo, client: &WebhookClient) -> Option<Converter> {
    if info.group == crate::events::EVENTS_GROUP && crate::events::is_event(&info.group, &info.plural) {
        return Some(Converter::events(&info.group, client));
    }
    let crd = crate::crd::of_resource(&storage.lock(), info)?;
    Some(Converter::for_crd(&crd, client))
}

/// For a built-in resource stored in another resource's form (`events.k8s.io` Events, stored
/// as core Events): the converter to the stored form and the converter back to `info`'s.
pub(crate) fn builtin_storage_form(info: &ResourceInfo, client: &WebhookClient) -> Option<(Converter, Converter)> {
    (info.group == crate::events::EVENTS_GROUP && crate::events::is_event(&info.group, &info.plural))
        .then(|| (Converter::events("", client), Converter::events(&info.group, client)))
}

/// `obj`, computed in a request's version, in `crd`'s storage version (itself if it is in it).
pub(crate) async fn to_storage_version(crd: &Value, client: &WebhookClient, obj: Value) -> Result<Value, ApiError> {
    let Some(storage_version) = crate::crd::storage_version(crd) else {
        return Ok(obj);
    };
    Converter::for_crd(crd, client).convert(obj, storage_version).await
}

/// `obj`, read from the store, in the version the request for `info` names.
pub(crate) async fn to_request_version(
    crd: &Value,
    client: &WebhookClient,
    info: &ResourceInfo,
    obj: Arc<Value>,
) -> Result<Arc<Value>, ApiError> {
    if obj["apiVersion"].as_str() == Some(info.api_version().as_str()) {
        return Ok(obj);
    }
    Converter::for_crd(crd, client)
        .convert(Arc::unwrap_or_clone(obj), &info.version)
        .await
        .map(Arc::new)
}

/// A list's items read from the store, in the version the request for `info` names: one
/// conversion for every item that is not in it.
pub(crate) async fn list_to_request_version(
    crd: &Value,
    client: &WebhookClient,
    info: &ResourceInfo,
    items: Vec<Value>,
) -> Result<Vec<Value>, ApiError> {
    Converter::for_crd(crd, client).convert_list(items, &info.version).await
}

/// Whether a conversion was of one object or of a list's items: kube-apiserver words their
/// errors differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Object,
    List,
}

/// `500` with no reason (kube-apiserver's `StatusReasonUnknown`: the converter's error is not a
/// `Status`), as kubectl prints it: `Error from server: <message>`.
fn internal(message: String) -> ApiError {
    ApiError::new(500, "", message)
}

fn failed(source: &str, why: &str) -> ApiError {
    internal(format!("conversion webhook for {source} failed: {why}"))
}

/// `group/version, Kind=Kind` of an object, as Go prints a `GroupVersionKind`.
fn gvk_of(obj: &Value, kind: &str) -> String {
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let kind = obj["kind"].as_str().unwrap_or(kind);
    format!("{api_version}, Kind={kind}")
}

/// The `ConversionReview` sent to the webhook.
fn review_request(review_version: &str, uid: &str, desired: &str, objects: &[Value]) -> Value {
    json!({
        "apiVersion": format!("apiextensions.k8s.io/{review_version}"),
        "kind": "ConversionReview",
        "request": {
            "uid": uid,
            "desiredAPIVersion": desired,
            "objects": objects,
        },
    })
}

/// The converted objects of a webhook's `ConversionReview`, or why it is refused, as
/// kube-apiserver's `getConvertedObjectsFromResponse` words it (`v1beta1` responses are not
/// checked for their kind and uid, as there).
fn check_review(review_version: &str, uid: &str, review: &Value) -> Result<Vec<Value>, String> {
    if review_version == "v1" {
        let got_version = review["apiVersion"].as_str().unwrap_or("");
        let got_kind = review["kind"].as_str().unwrap_or("");
        if got_version != "apiextensions.k8s.io/v1" || got_kind != "ConversionReview" {
            let (group, version) = got_version.rsplit_once('/').unwrap_or(("", got_version));
            let got = if group.is_empty() {
                format!("/{version}, Kind={got_kind}")
            } else {
                format!("{group}/{version}, Kind={got_kind}")
            };
            return Err(format!(
                "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got {got}"
            ));
        }
    }
    let response = match review.get("response") {
        Some(r) if r.is_object() => r,
        _ => return Err("no response provided".into()),
    };
    if review_version == "v1" {
        let got = response["uid"].as_str().unwrap_or("");
        if got != uid {
            return Err(format!("expected response.uid=\"{uid}\", got \"{got}\""));
        }
    }
    let result = &response["result"];
    let status = result["status"].as_str().unwrap_or("");
    if status != "Success" {
        return Err(match result["message"].as_str() {
            Some(m) if !m.is_empty() => m.to_owned(),
            _ => format!("response.result.status was '{status}', not 'Success'"),
        });
    }
    Ok(response["convertedObjects"].as_array().cloned().unwrap_or_default())
}

/// Why a converted object is refused.
enum Invalid {
    /// Not an object, or in the wrong group/version or kind.
    Object(String),
    /// Name, namespace or uid changed (`validateConvertedObject`).
    Identity(String),
    /// Metadata that cannot be restored, or labels/annotations that are not valid.
    Metadata(String),
}

impl Invalid {
    /// kube-apiserver's message for this failure of the `at`th converted object.
    fn message(&self, source: &str, shape: Shape, at: usize) -> String {
        match (self, shape) {
            (Invalid::Object(why), Shape::Object) => {
                format!("conversion webhook for {source} returned invalid object at index 0: {why}")
            }
            (Invalid::Identity(why), Shape::Object) => {
                format!("conversion webhook for {source} returned invalid object: {why}")
            }
            (Invalid::Metadata(why), Shape::Object) => {
                format!("conversion webhook for {source} returned invalid metadata: {why}")
            }
            (Invalid::Object(why) | Invalid::Identity(why), Shape::List) => {
                format!("conversion webhook for {source} returned invalid converted object at index {at}: {why}")
            }
            (Invalid::Metadata(why), Shape::List) => {
                format!("conversion webhook for {source} returned invalid metadata in object at index {at}: {why}")
            }
        }
    }
}

/// Checks one converted object against the `original` it came from and restores its metadata
/// (kube-apiserver's checks in `webhookConverter.Convert`, `validateConvertedObject` and
/// `restoreObjectMeta`): the result is the webhook's object with the original's metadata and
/// the webhook's labels and annotations.
fn check_converted(original: &Value, converted: Value, desired: &str) -> Result<Value, Invalid> {
    let Value::Object(mut converted) = converted else {
        return Err(Invalid::Object(
            "invalid type, expected=Unstructured, got=a non-object".into(),
        ));
    };
    let got_version = converted.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if got_version != desired {
        return Err(Invalid::Object(format!(
            "invalid groupVersion (expected {desired}, received {got_version})"
        )));
    }
    let (want_kind, got_kind) = (
        original["kind"].as_str().unwrap_or(""),
        converted.get("kind").and_then(Value::as_str).unwrap_or(""),
    );
    if want_kind != got_kind {
        return Err(Invalid::Object(format!(
            "invalid kind (expected {want_kind}, received {got_kind})"
        )));
    }
    let meta = |m: Option<&Value>, f: &str| {
        m.and_then(|m| m.get(f))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    for (field, what) in [("name", "name"), ("namespace", "namespace"), ("uid", "UID")] {
        let (want, got) = (
            meta(original.get("metadata"), field),
            meta(converted.get("metadata"), field),
        );
        if want != got {
            return Err(Invalid::Identity(format!("must have the same {what}: {want} != {got}")));
        }
    }
    let response_meta = match converted.get("metadata") {
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(Invalid::Metadata(format!(
                "invalid metadata of type {} in converted object",
                json_type(other)
            )));
        }
        None => return Err(Invalid::Metadata("missing metadata in converted object".into())),
    };
    let mut restored: Map<String, Value> = original["metadata"].as_object().cloned().unwrap_or_default();
    for field in ["labels", "annotations"] {
        match response_meta.get(field) {
            None | Some(Value::Null) => {
                restored.remove(field);
            }
            Some(Value::Object(map)) => {
                if let Some((key, value)) = map.iter().find(|(_, v)| !v.is_string()) {
                    return Err(Invalid::Metadata(format!(
                        "metadata.{field}[{key}] must be a string, but is {} in converted object",
                        json_type(value)
                    )));
                }
                if restored.get(field) != Some(&Value::Object(map.clone())) {
                    check_labels_or_annotations(field, map).map_err(Invalid::Metadata)?;
                }
                restored.insert(field.to_owned(), Value::Object(map.clone()));
            }
            Some(other) => {
                return Err(Invalid::Metadata(format!(
                    "invalid metadata.{field} of type {} in converted object",
                    json_type(other)
                )));
            }
        }
    }
    converted.insert("metadata".into(), Value::Object(restored));
    Ok(Value::Object(converted))
}

/// Labels or annotations a webhook changed must still be valid, by ObjectMeta's rules (the
/// annotations' path is `metadata.annotation`, as kube-apiserver writes it there).
fn check_labels_or_annotations(field: &str, map: &Map<String, Value>) -> Result<(), String> {
    use crate::field::FieldError;
    use crate::validation::{label_value, qualified_name};
    let mut errors = Vec::new();
    for (key, value) in map {
        if field == "labels" {
            errors.extend(
                qualified_name(key)
                    .into_iter()
                    .map(|m| FieldError::invalid("metadata.labels", json!(key), m)),
            );
            let value = value.as_str().unwrap_or("");
            errors.extend(
                label_value(value)
                    .into_iter()
                    .map(|m| FieldError::invalid("metadata.labels", json!(value), m)),
            );
        } else {
            let lower = key.to_ascii_lowercase();
            errors.extend(
                qualified_name(&lower)
                    .into_iter()
                    .map(|m| FieldError::invalid("metadata.annotation", json!(key), m)),
            );
        }
    }
    match errors.as_slice() {
        [] => Ok(()),
        [one] => Err(one.to_string()),
        many => Err(format!(
            "[{}]",
            many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// The Go type kube-apiserver's messages name for a JSON value.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(_) => "int64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn original() -> Value {
        json!({
            "apiVersion": "example.com/v1alpha1",
            "kind": "Foo",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"l": "1"}, "finalizers": ["f"]},
            "spec": {"size": 3},
        })
    }

    #[tokio::test]
    async fn none_rewrites_only_the_api_version_of_objects_in_another_version() {
        let crd = json!({"spec": {"group": "example.com", "names": {"kind": "Foo"},
            "conversion": {"strategy": "None"}}});
        let converter = Converter::for_crd(&crd, &WebhookClient::default());
        let already = json!({"apiVersion": "example.com/v1", "kind": "Foo", "metadata": {"name": "b"}});
        let out = converter
            .convert_list(vec![original(), already.clone()], "v1")
            .await
            .unwrap();
        let mut want = original();
        want["apiVersion"] = json!("example.com/v1");
        assert_eq!(out, vec![want, already]);
    }

    #[test]
    fn a_review_is_checked_as_kube_apiserver_checks_it() {
        let ok = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u", "result": {"status": "Success"}, "convertedObjects": [{"a": 1}]}});
        assert_eq!(check_review("v1", "u", &ok).unwrap(), vec![json!({"a": 1})]);
        let mut wrong_uid = ok.clone();
        wrong_uid["response"]["uid"] = json!("x");
        assert_eq!(
            check_review("v1", "u", &wrong_uid).unwrap_err(),
            "expected response.uid=\"u\", got \"x\""
        );
        assert!(
            check_review("v1beta1", "u", &wrong_uid).is_ok(),
            "v1beta1 skips the uid"
        );
        let mut failure = ok.clone();
        failure["response"]["result"] = json!({"status": "Failure", "message": "no way"});
        assert_eq!(check_review("v1", "u", &failure).unwrap_err(), "no way");
        failure["response"]["result"] = json!({"status": "Failure"});
        assert_eq!(
            check_review("v1", "u", &failure).unwrap_err(),
            "response.result.status was 'Failure', not 'Success'"
        );
        let mut wrong_kind = ok.clone();
        wrong_kind["kind"] = json!("AdmissionReview");
        assert_eq!(
            check_review("v1", "u", &wrong_kind).unwrap_err(),
            "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got apiextensions.k8s.io/v1, Kind=AdmissionReview"
        );
        assert_eq!(
            check_review(
                "v1",
                "u",
                &json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"})
            )
            .unwrap_err(),
            "no response provided"
        );
    }

    #[test]
    fn converted_objects_keep_the_original_metadata_but_labels_and_annotations() {
        let mut converted = original();
        converted["apiVersion"] = json!("example.com/v1");
        converted["spec"] = json!({"replicas": 3});
        converted["metadata"]["labels"] = json!({"l": "2"});
        converted["metadata"]["annotations"] = json!({"a": "b"});
        converted["metadata"]["finalizers"] = json!([]);
        converted["metadata"]["resourceVersion"] = json!("999");
        let out = check_converted(&original(), converted, "example.com/v1").unwrap_or_else(|_| panic!());
        assert_eq!(out["spec"], json!({"replicas": 3}));
        assert_eq!(out["metadata"]["labels"], json!({"l": "2"}));
        assert_eq!(out["metadata"]["annotations"], json!({"a": "b"}));
        assert_eq!(out["metadata"]["finalizers"], json!(["f"]), "restored");
        assert_eq!(out["metadata"]["resourceVersion"], "7", "restored");

        let refused = |converted: Value| match check_converted(&original(), converted, "example.com/v1") {
            Err(e) => e.message("example.com/v1alpha1, Kind=Foo", Shape::Object, 0),
            Ok(_) => panic!("accepted"),
        };
        let mut wrong = original();
        assert_eq!(
            refused(wrong.clone()),
            "conversion webhook for example.com/v1alpha1, Kind=Foo returned invalid object at index 0: invalid groupVersion (expected example.com/v1, received example.com/v1alpha1)"
        );
        wrong["apiVersion"] = json!("example.com/v1");
        wrong["metadata"]["uid"] = json!("u2");
        assert_eq!(
            refused(wrong.clone()),
            "conversion webhook for example.com/v1alpha1, Kind=Foo returned invalid object: must have the same UID: u1 != u2"
        );
        wrong["metadata"]["uid"] = json!("u1");
        wrong["metadata"]["labels"] = json!({"l": "not valid"});
        assert!(
            refused(wrong).starts_with(
                "conversion webhook for example.com/v1alpha1, Kind=Foo returned invalid metadata: metadata.labels: Invalid value: \"not valid\""
            )
        );
    }
}
