//! Built-in objects decoded as their Kubernetes types before they are stored.
//!
//! kube-apiserver decodes every request body into the Go type of its kind and stores what it
//! encodes back: a value of the wrong JSON type is refused (`400 BadRequest`, "Deployment in
//! version "v1" cannot be handled as a Deployment: …"), fields the type does not know are
//! dropped, and `fieldValidation=Strict` (what kubectl sends by default) refuses them instead
//! ("strict decoding error: unknown field "spec.foo""). envtest does the same with k8s-openapi's
//! types, so a body a cluster would refuse is refused here and what a client reads back is what a
//! cluster would store. Custom resources get the same treatment for their `metadata` (decoded as
//! `ObjectMeta`); their bodies are checked against their schema in `schema.rs`.
//!
//! Differences, deliberate: the decode error names the field path and serde's reason
//! (`spec.replicas: invalid type: string "x", expected i32`) where Go names its struct field
//! (`Go struct field DeploymentSpec.spec.replicas of type int32`); with `fieldValidation=Warn`
//! (the default) unknown fields are dropped without a `Warning` header.

use crate::resources::ResourceInfo;
use crate::status::ApiError;
use k8s_openapi::api::{admissionregistration, apps, batch, coordination, core, discovery, events, networking, rbac};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// What to do with fields the type does not know (the `fieldValidation` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them (kube-apiserver also sends a `Warning` header; envtest does not).
    #[default]
    Warn,
    /// Refuse the request with `400 BadRequest`.
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter (absent or empty: `Warn`, kube-apiserver's default).
    pub(crate) fn from_query(v: Option<&str>) -> Result<Self, ApiError> {
        match v.unwrap_or("") {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation must be one of \"Ignore\", \"Warn\" or \"Strict\", got {other:?}"
            ))),
        }
    }
}

/// `<Kind> in version "<v>" cannot be handled as a <Kind>: <why>`: kube-apiserver's decode error.
pub(crate) fn cannot_handle(info: &ResourceInfo, why: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version \"{v}\" cannot be handled as a {kind}: {why}",
        kind = info.kind,
        v = info.version
    ))
}

/// Decodes `obj` as `K` (naming the failing field) and encodes it back.
fn round_trip<K: DeserializeOwned + Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: K = serde_path_to_error::deserialize(obj).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            inner.to_string()
        } else {
            format!("{path}: {inner}")
        }
    })?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// A Secret's `stringData` is write-only: kube-apiserver merges it into `data` (base64) and
/// never stores it.
fn secret(obj: &Value) -> Result<Value, String> {
    let mut s: core::v1::Secret = serde_path_to_error::deserialize(obj).map_err(|e| e.to_string())?;
    if let Some(string_data) = s.string_data.take() {
        let data = s.data.get_or_insert_with(Default::default);
        for (k, v) in string_data {
            data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
        }
    }
    serde_json::to_value(&s).map_err(|e| e.to_string())
}

/// Something done with the Kubernetes type of a built-in kind: [`dispatch`] calls `visit`
/// with the type. The one table of kinds to types, shared by decoding and the OpenAPI
/// documents.
pub(crate) trait KindVisitor {
    /// What the visit returns.
    type Output;
    /// Called with `K`, the type of the kind asked for.
    fn visit<K>(self) -> Self::Output
    where
        K: k8s_openapi::Resource + DeserializeOwned + Serialize + schemars::JsonSchema;
}

/// Calls `visitor` with the type of `group`/`version`/`kind`; `None` if it is not built in.
pub(crate) fn dispatch<V: KindVisitor>(group: &str, version: &str, kind: &str, visitor: V) -> Option<V::Output> {
    Some(match (group, version, kind) {
        ("", "v1", "Namespace") => visitor.visit::<core::v1::Namespace>(),
        ("", "v1", "Node") => visitor.visit::<core::v1::Node>(),
        ("", "v1", "ConfigMap") => visitor.visit::<core::v1::ConfigMap>(),
        ("", "v1", "Secret") => visitor.visit::<core::v1::Secret>(),
        ("", "v1", "Pod") => visitor.visit::<core::v1::Pod>(),
        ("", "v1", "Service") => visitor.visit::<core::v1::Service>(),
        ("", "v1", "Endpoints") => visitor.visit::<core::v1::Endpoints>(),
        ("", "v1", "Event") => visitor.visit::<core::v1::Event>(),
        ("", "v1", "ServiceAccount") => visitor.visit::<core::v1::ServiceAccount>(),
        ("", "v1", "PersistentVolumeClaim") => visitor.visit::<core::v1::PersistentVolumeClaim>(),
        ("apps", "v1", "Deployment") => visitor.visit::<apps::v1::Deployment>(),
        ("apps", "v1", "ReplicaSet") => visitor.visit::<apps::v1::ReplicaSet>(),
        ("apps", "v1", "StatefulSet") => visitor.visit::<apps::v1::StatefulSet>(),
        ("apps", "v1", "DaemonSet") => visitor.visit::<apps::v1::DaemonSet>(),
        ("batch", "v1", "Job") => visitor.visit::<batch::v1::Job>(),
        ("batch", "v1", "CronJob") => visitor.visit::<batch::v1::CronJob>(),
        ("coordination.k8s.io", "v1", "Lease") => visitor.visit::<coordination::v1::Lease>(),
        ("discovery.k8s.io", "v1", "EndpointSlice") => visitor.visit::<discovery::v1::EndpointSlice>(),
        ("events.k8s.io", "v1", "Event") => visitor.visit::<events::v1::Event>(),
        ("networking.k8s.io", "v1", "Ingress") => visitor.visit::<networking::v1::Ingress>(),
        ("rbac.authorization.k8s.io", "v1", "Role") => visitor.visit::<rbac::v1::Role>(),
        ("rbac.authorization.k8s.io", "v1", "RoleBinding") => visitor.visit::<rbac::v1::RoleBinding>(),
        ("rbac.authorization.k8s.io", "v1", "ClusterRole") => visitor.visit::<rbac::v1::ClusterRole>(),
        ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding") => visitor.visit::<rbac::v1::ClusterRoleBinding>(),
        ("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration") => {
            visitor.visit::<admissionregistration::v1::MutatingWebhookConfiguration>()
        }
        ("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration") => {
            visitor.visit::<admissionregistration::v1::ValidatingWebhookConfiguration>()
        }
        ("apiextensions.k8s.io", "v1", "CustomResourceDefinition") => visitor.visit::<CustomResourceDefinition>(),
        _ => return None,
    })
}

/// Decodes into the visited type and encodes back.
struct RoundTrip<'a>(&'a Value);

impl KindVisitor for RoundTrip<'_> {
    type Output = Result<Value, String>;
    fn visit<K>(self) -> Self::Output
    where
        K: k8s_openapi::Resource + DeserializeOwned + Serialize + schemars::JsonSchema,
    {
        round_trip::<K>(self.0)
    }
}

/// The round trip of a built-in kind, `None` for other kinds.
fn built_in(info: &ResourceInfo, obj: &Value) -> Option<Result<Value, String>> {
    if (info.group.as_str(), info.version.as_str(), info.kind.as_str()) == ("", "v1", "Secret") {
        return Some(secret(obj));
    }
    dispatch(&info.group, &info.version, &info.kind, RoundTrip(obj))
}

/// A visit that only tells the kind is known.
struct Known;

impl KindVisitor for Known {
    type Output = ();
    fn visit<K>(self) -> Self::Output
    where
        K: k8s_openapi::Resource + DeserializeOwned + Serialize + schemars::JsonSchema,
    {
    }
}

/// Whether envtest knows `info`'s kind as a Kubernetes type (custom resources are not).
pub(crate) fn is_built_in(info: &ResourceInfo) -> bool {
    dispatch(&info.group, &info.version, &info.kind, Known).is_some()
}

/// Decodes `obj`, a request body for `info` with `kind` and `apiVersion` already set, the way
/// kube-apiserver does: built-in kinds as their type, custom resources' `metadata` as
/// `ObjectMeta`. Returns the object as it will be stored (unknown fields of typed parts dropped)
/// or the `400` kube-apiserver would answer, in `Strict` mode also for unknown fields.
pub(crate) fn decode(info: &ResourceInfo, obj: &Value, validation: FieldValidation) -> Result<Value, ApiError> {
    let decoded = match built_in(info, obj) {
        Some(r) => r.map_err(|why| cannot_handle(info, &why))?,
        None => {
            let mut out = obj.clone();
            if let Some(meta) = obj.get("metadata") {
                let typed =
                    round_trip::<ObjectMeta>(meta).map_err(|why| cannot_handle(info, &format!("metadata.{why}")))?;
                out["metadata"] = typed;
            }
            out
        }
    };
    if validation == FieldValidation::Strict {
        let mut unknown = Vec::new();
        unknown_fields(obj, &decoded, "", &mut unknown);
        // A Secret's stringData is known: it was moved into data.
        if (info.group.as_str(), info.kind.as_str()) == ("", "Secret") {
            unknown.retain(|f| f != "stringData");
        }
        refuse_unknown(info, &unknown)?;
    }
    Ok(decoded)
}

/// The `400` for unknown fields in `Strict` mode (nothing when there are none).
pub(crate) fn refuse_unknown(info: &ResourceInfo, unknown: &[String]) -> Result<(), ApiError> {
    if unknown.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = unknown.iter().map(|f| format!("unknown field {f:?}")).collect();
    Err(cannot_handle(
        info,
        &format!("strict decoding error: {}", list.join(", ")),
    ))
}

/// Collects the paths of fields present (and not `null`) in `sent` but absent from `kept`.
pub(crate) fn unknown_fields(sent: &Value, kept: &Value, path: &str, out: &mut Vec<String>) {
    match (sent, kept) {
        (Value::Object(s), Value::Object(k)) => {
            for (key, v) in s {
                let child = crate::field::join(path, key);
                match k.get(key) {
                    Some(kv) => unknown_fields(v, kv, &child, out),
                    None if !v.is_null() => out.push(child),
                    None => {}
                }
            }
        }
        (Value::Array(s), Value::Array(k)) => {
            for (i, (sv, kv)) in s.iter().zip(k).enumerate() {
                unknown_fields(sv, kv, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;
    use serde_json::json;

    fn info(kind: &str) -> ResourceInfo {
        builtin()
            .into_iter()
            .find(|r| r.kind == kind && r.group != "events.k8s.io")
            .unwrap()
    }

    #[test]
    fn every_built_in_resource_has_a_type() {
        for r in builtin() {
            assert!(is_built_in(&r), "{}", r.qualified());
        }
    }

    #[test]
    fn a_wrong_type_is_a_bad_request_naming_the_field() {
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
            "spec": {"replicas": "x", "selector": {}, "template": {}}});
        let e = decode(&info("Deployment"), &d, FieldValidation::Warn).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.starts_with(r#"Deployment in version "v1" cannot be handled as a Deployment: spec.replicas: invalid type: string "x""#),
            "{}",
            e.message
        );
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": [1]}});
        let e = decode(&info("ConfigMap"), &cm, FieldValidation::Warn).unwrap_err();
        assert!(
            e.message.contains("metadata.labels: invalid type: sequence"),
            "{}",
            e.message
        );
    }

    #[test]
    fn unknown_fields_are_dropped_or_refused_when_strict() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "bogus": 1},
            "data": {"a": "b"}, "extra": {"y": 1}, "nulled": null});
        let kept = decode(&info("ConfigMap"), &cm, FieldValidation::Warn).unwrap();
        assert_eq!(
            kept,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}})
        );
        let e = decode(&info("ConfigMap"), &cm, FieldValidation::Strict).unwrap_err();
        assert_eq!(
            e.message,
            r#"ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: unknown field "extra", unknown field "metadata.bogus""#
        );
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "imagee": "nginx"}]}});
        let e = decode(&info("Pod"), &pod, FieldValidation::Strict).unwrap_err();
        assert!(
            e.message.ends_with(r#"unknown field "spec.containers[0].imagee""#),
            "{}",
            e.message
        );
    }

    #[test]
    fn secret_string_data_is_stored_as_data() {
        let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"a": "YQ=="}, "stringData": {"b": "bee"}});
        let kept = decode(&info("Secret"), &s, FieldValidation::Strict).unwrap();
        assert_eq!(kept["data"], json!({"a": "YQ==", "b": "YmVl"}));
        assert!(kept.get("stringData").is_none());
    }
}
