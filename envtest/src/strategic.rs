//! Strategic merge patch (`application/strategic-merge-patch+json`), what `kubectl apply`
//! (client-side), `kubectl edit`, `kubectl patch` and `kubectl rollout restart` send.
//!
//! A JSON merge patch, except for lists the built-in types declare mergeable: a list of objects
//! with a patch merge key is merged item by item (containers, init and ephemeral containers,
//! env and volumes by `name`, volumeMounts by `mountPath`, container ports by `containerPort`,
//! Service ports by `port`, conditions by `type`, ownerReferences by `uid`, hostAliases by `ip`,
//! imagePullSecrets by `name`), and `finalizers` is merged as a set. The directives: `null`
//! deletes a field; `{"$patch": "delete", <key>}` deletes a list item; `{"$patch": "replace"}`
//! replaces a map or (as a list item) the whole list; `$retainKeys` keeps only the listed keys;
//! `$deleteFromPrimitiveList/<field>` removes values from a merged primitive list;
//! `$setElementOrder/<field>` is accepted (the order is the patched list's).
//! See <https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/>.
//! Custom resources do not support it (`415`), as in kube-apiserver.

use crate::status::ApiError;
use serde_json::{Map, Value};

/// How a list field merges.
enum Strategy {
    /// Items are objects merged by this key.
    MergeKey(&'static str),
    /// Items are scalars merged as a set.
    Primitive,
    /// The patch's list replaces the target's.
    Replace,
}

fn strategy(field: &str, items: &[Value]) -> Strategy {
    let has = |f: &str| items.iter().any(|i| i.get(f).is_some());
    match field {
        "containers" | "initContainers" | "ephemeralContainers" | "env" | "volumes" | "imagePullSecrets" => {
            Strategy::MergeKey("name")
        }
        "volumeMounts" => Strategy::MergeKey("mountPath"),
        "conditions" => Strategy::MergeKey("type"),
        "ownerReferences" => Strategy::MergeKey("uid"),
        "hostAliases" => Strategy::MergeKey("ip"),
        "ports" if has("containerPort") => Strategy::MergeKey("containerPort"),
        "ports" if has("port") => Strategy::MergeKey("port"),
        "finalizers" => Strategy::Primitive,
        _ => Strategy::Replace,
    }
}

fn bad(message: &str) -> ApiError {
    ApiError::bad_request(format!("invalid strategic merge patch: {message}"))
}

/// Applies the strategic merge patch `patch` (a JSON object) to `target`.
pub(crate) fn apply(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Some(p) = patch.as_object() else {
        return Err(bad("the patch must be a JSON object"));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Some(t) = target.as_object_mut() {
        merge_map(t, p)?;
    }
    Ok(())
}

/// What is stored of a patch's new map or item: the patch applied to nothing, so directives
/// and `null`s (deletions of what is not there) leave no trace.
fn strip(value: &Value) -> Value {
    match value {
        Value::Object(m) => {
            let mut fresh = Map::new();
            match merge_map(&mut fresh, m) {
                Ok(()) => Value::Object(fresh),
                // Only a bad directive fails; the caller's own merge reports it.
                Err(_) => Value::Object(Map::new()),
            }
        }
        Value::Array(a) => Value::Array(a.iter().filter(|i| i.get("$patch").is_none()).map(strip).collect()),
        other => other.clone(),
    }
}

fn merge_map(target: &mut Map<String, Value>, patch: &Map<String, Value>) -> Result<(), ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = Map::new();
            let rest: Map<String, Value> = patch
                .iter()
                .filter(|(k, _)| k.as_str() != "$patch")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            merge_map(&mut replaced, &rest)?;
            *target = replaced;
            return Ok(());
        }
        Some("delete") => {
            target.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(bad(&format!("unknown patch type {other:?}"))),
    }
    for (k, pv) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = pv.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(items)) = target.get_mut(field) {
                items.retain(|i| !remove.contains(i));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match pv {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.remove(k);
                    continue;
                }
                match target.get_mut(k) {
                    Some(Value::Object(tm)) => merge_map(tm, pm)?,
                    _ => {
                        target.insert(k.clone(), strip(pv));
                    }
                }
            }
            Value::Array(items) => {
                let merged = match (strategy(k, items), target.get_mut(k)) {
                    (Strategy::MergeKey(key), Some(Value::Array(t))) => {
                        merge_by_key(t, items, key)?;
                        true
                    }
                    (Strategy::Primitive, Some(Value::Array(t))) => {
                        for i in items {
                            if !t.contains(i) {
                                t.push(i.clone());
                            }
                        }
                        true
                    }
                    _ => false,
                };
                if !merged {
                    let kept: Vec<Value> = items.iter().filter(|i| i.get("$patch").is_none()).map(strip).collect();
                    target.insert(k.clone(), Value::Array(kept));
                }
            }
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
    }
    if let Some(retain) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn merge_by_key(target: &mut Vec<Value>, patch: &[Value], key: &str) -> Result<(), ApiError> {
    if patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *target = patch.iter().filter(|i| i.get("$patch").is_none()).map(strip).collect();
        return Ok(());
    }
    for item in patch {
        let Some(pm) = item.as_object() else {
            return Err(bad(&format!("a list merged by {key:?} holds a non-object item")));
        };
        let Some(k) = pm.get(key) else {
            return Err(bad(&format!("an item of a list merged by {key:?} has no {key:?}")));
        };
        let pos = target.iter().position(|t| t.get(key) == Some(k));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(pos) = pos {
                target.remove(pos);
            }
            continue;
        }
        match pos.and_then(|p| target.get_mut(p)).and_then(Value::as_object_mut) {
            Some(t) => merge_map(t, pm)?,
            None => target.push(strip(item)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x/a"]},
            "spec": {"containers": [
                {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
                {"name": "side", "image": "side:1"}],
                "tolerations": [{"key": "t"}]}})
    }

    #[test]
    fn lists_with_a_merge_key_merge_by_item() {
        let mut p = pod();
        apply(
            &mut p,
            &json!({"spec": {"containers": [{"name": "app", "image": "app:2",
            "env": [{"name": "B", "value": "2"}]}]}}),
        )
        .unwrap();
        assert_eq!(p["spec"]["containers"][0]["image"], "app:2");
        assert_eq!(
            p["spec"]["containers"][0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        assert_eq!(p["spec"]["containers"][1]["name"], "side", "the other container stays");
        apply(
            &mut p,
            &json!({"spec": {"containers": [{"name": "side", "$patch": "delete"}],
            "tolerations": [{"key": "u"}]}}),
        )
        .unwrap();
        assert_eq!(p["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(
            p["spec"]["tolerations"],
            json!([{"key": "u"}]),
            "no merge key: replaced"
        );
    }

    #[test]
    fn directives_delete_replace_and_retain() {
        let mut p = pod();
        apply(
            &mut p,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}, "finalizers": ["x/b"],
            "$deleteFromPrimitiveList/finalizers": ["x/a"]}}),
        )
        .unwrap();
        assert_eq!(p["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(p["metadata"]["finalizers"], json!(["x/b"]));
        apply(
            &mut p,
            &json!({"metadata": {"labels": {"$patch": "replace", "only": "1"}}}),
        )
        .unwrap();
        assert_eq!(p["metadata"]["labels"], json!({"only": "1"}));
        apply(
            &mut p,
            &json!({"spec": {"$retainKeys": ["containers"], "containers": [{"name": "app", "image": "app:3"}]}}),
        )
        .unwrap();
        assert!(p["spec"].get("tolerations").is_none());
        apply(
            &mut p,
            &json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "new", "image": "n"}]}}),
        )
        .unwrap();
        assert_eq!(p["spec"]["containers"], json!([{"name": "new", "image": "n"}]));
        assert_eq!(
            apply(&mut p, &json!({"spec": {"containers": [{"image": "nameless"}]}}))
                .unwrap_err()
                .code,
            400
        );
    }
}
