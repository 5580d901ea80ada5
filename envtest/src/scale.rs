//! The `/scale` subresource: an `autoscaling/v1` `Scale` view of a resource's replica count.
//!
//! Served for Deployments, ReplicaSets and StatefulSets, and for a CRD version that declares
//! `subresources.scale` (`specReplicasPath`, `statusReplicasPath`, `labelSelectorPath`).
//! `kubectl scale` patches it (`{"spec":{"replicas":N}}`, a merge patch), or with
//! `--current-replicas`/`--resource-version` reads it and PUTs it back; the HorizontalPodAutoscaler
//! does the same. What kube-apiserver does, envtest does: GET answers the Scale (name, namespace,
//! uid, resourceVersion and creationTimestamp of the parent; `spec.replicas`; `status.replicas`,
//! `0` when unset; `status.selector` as a label-selector string); a write copies only
//! `spec.replicas` into the parent, honours a non-empty `metadata.resourceVersion` as a
//! precondition (`409 Conflict` naming the parent), and answers the Scale of the stored parent.
//! The parent's generation moves as for any spec change.

use crate::field::{self, FieldError};
use crate::object;
use crate::patch::{self, PatchKind};
use crate::request::ResourcePath;
use crate::resources::{ResourceInfo, ScalePaths};
use crate::rest::{Rest, WriteOptions, WriteResult};
use crate::status::ApiError;
use serde_json::{Map, Value, json};

/// The value at a dotted path such as `.spec.replicas`.
fn at<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').filter(|s| !s.is_empty()).try_fold(obj, |v, k| v.get(k))
}

/// Sets the value at a dotted path, creating objects on the way.
pub(crate) fn set_at(obj: &mut Value, path: &str, value: Value) {
    let keys: Vec<&str> = path.split('.').filter(|s| !s.is_empty()).collect();
    let Some((last, parents)) = keys.split_last() else {
        return;
    };
    let mut cur = obj;
    for k in parents {
        let Some(map) = cur.as_object_mut() else { return };
        let next = map.entry((*k).to_owned()).or_insert_with(|| Value::Object(Map::new()));
        if !next.is_object() {
            *next = Value::Object(Map::new());
        }
        cur = next;
    }
    if let Some(map) = cur.as_object_mut() {
        map.insert((*last).to_owned(), value);
    }
}

/// A `LabelSelector` object as the string kube-apiserver puts in `status.selector`
/// (`LabelSelectorAsSelector(...).String()`): requirements sorted by key, values sorted.
pub(crate) fn selector_string(sel: &Value) -> String {
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("").to_owned();
        let mut values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        values.sort_unstable();
        let text = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.clone(),
            "DoesNotExist" => format!("!{key}"),
            _ => continue,
        };
        reqs.push((key, text));
    }
    reqs.sort();
    reqs.into_iter().map(|(_, t)| t).collect::<Vec<_>>().join(",")
}

/// The `Scale` of `obj`.
pub(crate) fn scale_of(paths: &ScalePaths, obj: &Value) -> Result<Value, ApiError> {
    let spec = at(obj, &paths.spec_replicas).and_then(Value::as_i64).ok_or_else(|| {
        ApiError::internal(format!(
            "Internal error occurred: the spec replicas field {:?} does not exist",
            paths.spec_replicas
        ))
    })?;
    let status = at(obj, &paths.status_replicas).and_then(Value::as_i64).unwrap_or(0);
    let selector = match paths.label_selector.as_deref().and_then(|p| at(obj, p)) {
        Some(Value::String(s)) => s.clone(),
        Some(sel @ Value::Object(_)) => selector_string(sel),
        _ => String::new(),
    };
    let mut meta = Map::new();
    for f in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
        if let Some(v) = obj.get("metadata").and_then(|m| m.get(f)) {
            meta.insert(f.to_owned(), v.clone());
        }
    }
    let mut scale = json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": meta,
        "spec": {},
        "status": {"replicas": status},
    });
    if spec != 0 {
        scale["spec"]["replicas"] = json!(spec);
    }
    if !selector.is_empty() {
        scale["status"]["selector"] = json!(selector);
    }
    Ok(scale)
}

fn paths_of(info: &ResourceInfo) -> Result<&ScalePaths, ApiError> {
    info.scale.as_ref().ok_or_else(ApiError::no_route)
}

fn name_of(path: &ResourcePath) -> Result<&str, ApiError> {
    path.name.as_deref().ok_or_else(ApiError::method_not_allowed)
}

impl Rest {
    /// GET `.../<name>/scale`.
    pub(crate) async fn get_scale(&self, path: &ResourcePath) -> Result<Value, ApiError> {
        let paths = paths_of(&path.info)?;
        let obj = self
            .get(&ResourcePath {
                subresource: None,
                ..path.clone()
            })
            .await?;
        scale_of(paths, &obj)
    }

    /// PUT `.../<name>/scale` with a `Scale` body: an update of the main resource's replicas,
    /// admitted as the `Scale` (`Rest::guaranteed_update`).
    pub(crate) async fn update_scale(&self, path: &ResourcePath, scale: &Value, opts: &WriteOptions) -> WriteResult {
        let info = &path.info;
        let paths = paths_of(info)?;
        let name = name_of(path)?.to_owned();
        if let Some(kind) = scale.get("kind").and_then(Value::as_str).filter(|k| *k != "Scale") {
            return Err(ApiError::bad_request(format!(
                "the kind of the provided object ({kind}) does not match the subresource (kind Scale)"
            )));
        }
        let replicas = match scale.get("spec").and_then(|s| s.get("replicas")) {
            None | Some(Value::Null) if !crate::typed::is_built_in(info) => {
                return Err(ApiError::bad_request(format!(
                    "the spec replicas field {:?} cannot be empty",
                    paths.spec_replicas
                )));
            }
            None | Some(Value::Null) => 0,
            Some(v) => v.as_i64().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Scale in version \"v1\" cannot be handled as a Scale: spec.replicas: invalid type: {v}, expected i32"
                ))
            })?,
        };
        if replicas < 0 {
            let err = FieldError::invalid("spec.replicas", json!(replicas), "must be greater than or equal to 0");
            return Err(field::invalid("autoscaling", "Scale", &name, &[err]));
        }
        let precondition = scale
            .get("metadata")
            .and_then(|m| m.get("resourceVersion"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let main = ResourcePath {
            subresource: None,
            ..path.clone()
        };
        let (code, stored) = self
            .guaranteed_update(&main, Some("scale"), opts, |cur| {
                if !precondition.is_empty() && precondition != object::resource_version(cur) {
                    return Err(ApiError::conflict(
                        &info.qualified(),
                        &name,
                        "the object has been modified; please apply your changes to the latest version and try again",
                    ));
                }
                let mut next = cur.clone();
                set_at(&mut next, &paths.spec_replicas, json!(replicas));
                Ok(next)
            })
            .await?;
        Ok((code, scale_of(paths, &stored)?))
    }

    /// PATCH `.../<name>/scale`: the patch applies to the current `Scale`, which is then written
    /// as by [`Rest::update_scale`].
    pub(crate) async fn patch_scale(
        &self,
        path: &ResourcePath,
        kind: PatchKind,
        body: &[u8],
        opts: &WriteOptions,
    ) -> WriteResult {
        if kind == PatchKind::Apply {
            return Err(ApiError::unsupported_media_type("application/apply-patch+yaml"));
        }
        let mut scale = self.get_scale(path).await?;
        let before = object::resource_version(&scale).to_owned();
        patch::apply(kind, &mut scale, body)?;
        // A patch carries the current resourceVersion unless it set one itself.
        if object::resource_version(&scale).is_empty() {
            object::set_meta(&mut scale, "resourceVersion", json!(before));
        }
        self.update_scale(path, &scale, opts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_render_as_label_selector_strings() {
        let sel = json!({"matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod", "dev"]},
            {"key": "tier", "operator": "DoesNotExist"},
            {"key": "c", "operator": "Exists"},
        ]});
        assert_eq!(selector_string(&sel), "a=1,b=2,c,env in (dev,prod),!tier");
    }

    #[test]
    fn a_scale_shows_the_parents_replicas_and_selector() {
        let paths = ScalePaths::workload();
        let d = json!({"metadata": {"name": "web", "namespace": "default", "uid": "u", "resourceVersion": "7",
            "labels": {"x": "y"}}, "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}},
            "status": {}});
        assert_eq!(
            scale_of(&paths, &d).unwrap(),
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": "web", "namespace": "default", "uid": "u", "resourceVersion": "7"},
                "spec": {"replicas": 3}, "status": {"replicas": 0, "selector": "app=web"}})
        );
        let mut o = json!({});
        set_at(&mut o, ".spec.x.replicas", json!(2));
        assert_eq!(o, json!({"spec": {"x": {"replicas": 2}}}));
        assert_eq!(scale_of(&paths, &json!({})).unwrap_err().code, 500);
    }
}
