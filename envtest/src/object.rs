//! Accessors for the `metadata` of objects stored as [`serde_json::Value`].
//!
//! envtest never deserializes objects into typed structs: it stores what the client sent, plus the
//! fields the API server owns (`uid`, `creationTimestamp`, `resourceVersion`, `generation`,
//! `deletionTimestamp`). These helpers read and write those fields without panicking on any shape
//! of input.

use serde_json::{Map, Value};

/// `metadata.name`, or `""`.
pub(crate) fn name(obj: &Value) -> &str {
    meta_str(obj, "name")
}

/// `metadata.namespace`, or `""`.
pub(crate) fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace")
}

/// `metadata.uid`, or `""`.
pub(crate) fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid")
}

/// `metadata.resourceVersion`, or `""`.
pub(crate) fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion")
}

/// A string field of `metadata`, or `""` when absent or not a string.
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `metadata.labels` as (key, value) pairs; non-string values are skipped.
pub(crate) fn labels(obj: &Value) -> impl Iterator<Item = (&str, &str)> {
    obj.get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|m| m.iter())
        .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
}

/// `metadata.finalizers` (string entries only).
pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// Whether `metadata.deletionTimestamp` is set.
pub(crate) fn is_terminating(obj: &Value) -> bool {
    !meta_str(obj, "deletionTimestamp").is_empty()
}

/// The uids named in `metadata.ownerReferences`.
pub(crate) fn owner_uids(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata` as a mutable map, created (replacing a non-object) if needed.
///
/// Returns `None` only when `obj` itself is not a JSON object.
pub(crate) fn metadata_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let map = obj.as_object_mut()?;
    let meta = map.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

/// Sets a field of `metadata` (no-op on non-objects).
pub(crate) fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if let Some(meta) = metadata_mut(obj) {
        meta.insert(field.to_owned(), value);
    }
}

/// Removes a field of `metadata`.
pub(crate) fn remove_meta(obj: &mut Value, field: &str) {
    if let Some(meta) = metadata_mut(obj) {
        meta.remove(field);
    }
}

/// The current time as a Kubernetes `Time` (RFC 3339, second precision, UTC).
pub(crate) fn now_timestamp() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A fresh random uid in the UUID v4 text form.
pub(crate) fn new_uid() -> String {
    let b: [u8; 16] = rand::random();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// `n` random lowercase alphanumerics, for `generateName`.
pub(crate) fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..n)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The object without `metadata` and `status`: what `generation` tracks.
///
/// Kubernetes bumps `metadata.generation` when the desired state changes, never for status or
/// metadata-only writes.
pub(crate) fn spec_part(obj: &Value) -> Value {
    match obj {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `obj` without `metadata`, `apiVersion` and `kind`: what custom resources' generation tracks.
pub(crate) fn without_metadata(obj: &Value) -> Value {
    match obj {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "apiVersion" | "kind"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accessors_tolerate_any_shape() {
        for v in [
            json!(null),
            json!(1),
            json!({"metadata": 3}),
            json!({"metadata": {"name": 1}}),
        ] {
            assert_eq!(name(&v), "");
            assert_eq!(labels(&v).count(), 0);
            assert!(finalizers(&v).is_empty());
        }
    }

    #[test]
    fn uid_and_timestamp_shapes() {
        assert_eq!(new_uid().len(), 36);
        let ts = now_timestamp();
        assert!(ts.ends_with('Z') && ts.len() == 20, "{ts}");
    }
}
