//! CustomResourceDefinitions: creating one serves its resource, deleting one stops serving it and
//! removes its objects (kube-apiserver's apiextensions controllers, collapsed into the write path).
//!
//! Supported: `spec.group`, `spec.names` (plural, singular, kind, shortNames, categories),
//! `spec.scope`, every `served` version, the `status` and `scale` subresources, and each
//! version's `openAPIV3Schema`, which prunes, defaults and validates the custom resources
//! (`schema.rs`).

use crate::object;
use crate::resources::{Registry, ResourceInfo, ScalePaths};
use crate::status::ApiError;
use crate::storage::Inner;
use serde_json::{Value, json};

pub(crate) const CRD_KEY: &str = "apiextensions.k8s.io/customresourcedefinitions";

fn is_crd(info: &ResourceInfo) -> bool {
    info.key() == CRD_KEY
}

/// The resources a CRD object serves.
fn served(crd: &Value) -> Vec<ResourceInfo> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let plural = s(&names["plural"]);
    let kind = s(&names["kind"]);
    let singular = match s(&names["singular"]) {
        x if x.is_empty() => kind.to_ascii_lowercase(),
        x => x,
    };
    let short_names: Vec<String> = names["shortNames"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let categories: Vec<String> = names["categories"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"].as_bool().unwrap_or(true))
        .map(|v| ResourceInfo {
            group: s(&spec["group"]),
            version: s(&v["name"]),
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: short_names.clone(),
            status_subresource: v["subresources"].get("status").is_some(),
            categories: categories.clone(),
            scale: v["subresources"].get("scale").map(|sc| ScalePaths {
                spec_replicas: s(&sc["specReplicasPath"]),
                status_replicas: s(&sc["statusReplicasPath"]),
                label_selector: sc["labelSelectorPath"].as_str().map(str::to_owned),
            }),
        })
        .collect()
}

/// Validates a CRD body (a no-op for other resources): `422 Invalid` on a missing group, names,
/// versions, or a name that is not `<plural>.<group>`.
pub(crate) fn validate(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if !is_crd(info) {
        return Ok(());
    }
    let name = object::name(obj);
    let spec = &obj["spec"];
    let group = spec["group"].as_str().unwrap_or("");
    let plural = spec["names"]["plural"].as_str().unwrap_or("");
    let kind = spec["names"]["kind"].as_str().unwrap_or("");
    let invalid = |m: &str| Err(ApiError::invalid("CustomResourceDefinition", name, m.to_owned()));
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return invalid("spec.group, spec.names.plural and spec.names.kind are required");
    }
    if name != format!("{plural}.{group}") {
        return invalid("metadata.name: Invalid value: must be spec.names.plural+\".\"+spec.group");
    }
    let versions = spec["versions"].as_array().map(Vec::len).unwrap_or(0);
    if versions == 0 || served(obj).iter().any(|r| r.version.is_empty()) {
        return invalid("spec.versions: Required value: must have exactly one storage version and named versions");
    }
    if !matches!(spec["scope"].as_str(), Some("Namespaced" | "Cluster")) {
        return invalid("spec.scope: Unsupported value: supported values: \"Cluster\", \"Namespaced\"");
    }
    // Every CEL rule (`x-kubernetes-validations`) compiles and refers only to what is declared.
    let mut errs = Vec::new();
    for (i, v) in spec["versions"].as_array().into_iter().flatten().enumerate() {
        if let Some(schema) = v.get("schema").and_then(|s| s.get("openAPIV3Schema")) {
            let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
            errs.extend(crate::cel::check_schema(schema, &path));
        }
    }
    if !errs.is_empty() {
        return Err(crate::field::invalid("apiextensions.k8s.io", "CustomResourceDefinition", name, &errs));
    }
    Ok(())
}

/// Called after every write, under the store lock. For CRDs: register (and mark Established)
/// or unregister the served resources; on delete, remove the custom objects.
pub(crate) fn on_write(registry: &Registry, inner: &mut Inner, info: &ResourceInfo, obj: &Value, deleted: bool) {
    if !is_crd(info) {
        return;
    }
    let resources = served(obj);
    let group = obj["spec"]["group"].as_str().unwrap_or("").to_owned();
    let plural = obj["spec"]["names"]["plural"].as_str().unwrap_or("").to_owned();
    if deleted {
        registry.remove(&group, &plural);
        let key = format!("{group}/{plural}");
        let keys: Vec<(String, String)> = inner
            .objects(&key)
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        for (ns, name) in keys {
            inner.remove(&key, &ns, &name);
        }
        return;
    }
    if object::is_terminating(obj) {
        return;
    }
    registry.remove(&group, &plural);
    for r in resources {
        registry.insert(r);
    }
    let established = obj["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Established"));
    if !established {
        let mut next = obj.clone();
        let now = object::now_timestamp();
        next["status"] = json!({
            "acceptedNames": obj["spec"]["names"],
            "storedVersions": obj["spec"]["versions"].as_array().into_iter().flatten()
                .filter(|v| v["storage"].as_bool().unwrap_or(false))
                .map(|v| v["name"].clone()).collect::<Vec<_>>(),
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
        });
        inner.put(CRD_KEY, next);
    }
}
