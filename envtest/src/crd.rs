//! CustomResourceDefinitions: creating one serves its resource, deleting one stops serving it and
//! removes its objects (kube-apiserver's apiextensions controllers, collapsed into the write path).
//!
//! Supported: `spec.group`, `spec.names` (plural, singular, kind, shortNames, categories),
//! `spec.scope`, every `served` version, the `status` and `scale` subresources, and each
//! version's `openAPIV3Schema`, which prunes, defaults and validates the custom resources
//! (`schema.rs`).
//!
//! Versions, as kube-apiserver serves them: exactly one `storage` version (else `422`), in which
//! every object is stored (`conversion.rs` converts to and from the version a request names);
//! `status.storedVersions` lists every version that has been the storage version; versions are
//! ordered by Kubernetes' version priority ([`compare_versions`]: `v1 > v1beta2 > v1beta1 >
//! v1alpha1`), so discovery's preferred version is the highest served one, not the first
//! listed; a `deprecated` version answers every request with its [`deprecation_warning`].

use crate::field::{self, FieldError};
use crate::object;
use crate::resources::{Registry, ResourceInfo, ScalePaths};
use crate::status::ApiError;
use crate::storage::Inner;
use serde_json::{Value, json};
use std::cmp::Ordering;

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

/// Validates a CRD body (a no-op for other resources), as kube-apiserver's CRD validation: one
/// `422 Invalid` listing every failure (a missing group or names, a name that is not
/// `<plural>.<group>`, a scope other than `Namespaced`/`Cluster`, version names that are not
/// unique DNS-1035 labels, not exactly one storage version, a conversion that is not `None` or a
/// `Webhook` with one of `url`/`service` and a `ConversionReview` version envtest speaks).
pub(crate) fn validate(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if !is_crd(info) {
        return Ok(());
    }
    let name = object::name(obj);
    let spec = &obj["spec"];
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let (group, plural, kind) = (
        text(&spec["group"]),
        text(&spec["names"]["plural"]),
        text(&spec["names"]["kind"]),
    );
    let mut errs = Vec::new();
    for (value, path) in [
        (&group, "spec.group"),
        (&plural, "spec.names.plural"),
        (&kind, "spec.names.kind"),
    ] {
        if value.is_empty() {
            errs.push(FieldError::required(path, ""));
        }
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if !matches!(spec["scope"].as_str(), Some("Namespaced" | "Cluster")) {
        errs.push(FieldError::not_supported(
            "spec.scope",
            spec["scope"].clone(),
            &[json!("Cluster"), json!("Namespaced")],
        ));
    }
    errs.extend(validate_versions(spec));
    errs.extend(validate_conversion(&spec["conversion"]));
    errs.extend(validate_printer_columns(spec));
    // Every CEL rule (`x-kubernetes-validations`) compiles and refers only to what is declared.
    for (i, v) in spec["versions"].as_array().into_iter().flatten().enumerate() {
        if let Some(schema) = v.get("schema").and_then(|s| s.get("openAPIV3Schema")) {
            let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
            errs.extend(crate::cel::check_schema(schema, &path));
        }
    }
    if errs.is_empty() {
        return Ok(());
    }
    Err(field::invalid(
        "apiextensions.k8s.io",
        "CustomResourceDefinition",
        name,
        &errs,
    ))
}

/// `spec.versions`: at least one, names unique DNS-1035 labels, exactly one `storage: true`.
fn validate_versions(spec: &Value) -> Vec<FieldError> {
    let versions = spec["versions"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut errs = Vec::new();
    if versions.is_empty() {
        errs.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
        return errs;
    }
    let mut seen = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let name = v["name"].as_str().unwrap_or("");
        for e in crate::validation::dns1035_label(name) {
            errs.push(FieldError::invalid(format!("spec.versions[{i}].name"), json!(name), e));
        }
        if seen.contains(&name) {
            errs.push(FieldError::invalid(
                "spec.versions",
                json!(version_names(spec)),
                "must contain unique version names",
            ));
        }
        seen.push(name);
        if let Some(warning) = v.get("deprecationWarning").filter(|w| !w.is_null()) {
            let deprecated = v["deprecated"].as_bool().unwrap_or(false);
            let control = |w: &str| w.char_indices().find(|(_, c)| c.is_control()).map(|(at, _)| at);
            let detail = match warning.as_str() {
                _ if !deprecated => Some("can only be set for deprecated versions".to_owned()),
                Some("") => Some("must not be an empty string".to_owned()),
                Some(w) if w.len() > 256 => Some("must be <= 256 characters long".to_owned()),
                Some(w) => control(w).map(|at| {
                    format!("must only contain printable UTF-8 characters; control character found at index {at}")
                }),
                None => Some("must be a string".to_owned()),
            };
            if let Some(detail) = detail {
                errs.push(FieldError::invalid(
                    format!("spec.versions[{i}].deprecationWarning"),
                    warning.clone(),
                    detail,
                ));
            }
        }
    }
    let storage = versions
        .iter()
        .filter(|v| v["storage"].as_bool().unwrap_or(false))
        .count();
    if storage != 1 {
        errs.push(FieldError::invalid(
            "spec.versions",
            json!(version_names(spec)),
            "must have exactly one version marked as storage version",
        ));
    }
    errs
}

/// `spec.versions[i].additionalPrinterColumns`, as kube-apiserver's
/// `ValidateCustomResourceColumnDefinition` (its field paths name the Go field, `JSONPath`): a
/// name, a known type and format, and a JSONPath that starts with `.`. A path that passes this
/// but does not parse is not refused: the table then ends before that column (`table.rs`).
fn validate_printer_columns(spec: &Value) -> Vec<FieldError> {
    const TYPES: &str = "boolean,date,integer,number,string";
    const FORMATS: &str = "byte,date,date-time,double,float,int32,int64,password";
    let mut errs = Vec::new();
    for (i, v) in spec["versions"].as_array().into_iter().flatten().enumerate() {
        for (j, col) in v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let at = |f: &str| format!("spec.versions[{i}].additionalPrinterColumns[{j}].{f}");
            let text = |k: &str| col[k].as_str().unwrap_or("");
            if text("name").is_empty() {
                errs.push(FieldError::required(at("name"), ""));
            }
            match text("type") {
                "" => errs.push(FieldError::required(at("type"), format!("must be one of {TYPES}"))),
                t if !TYPES.split(',').any(|k| k == t) => errs.push(FieldError::invalid(
                    at("type"),
                    json!(t),
                    format!("must be one of {TYPES}"),
                )),
                _ => {}
            }
            let format = text("format");
            if !format.is_empty() && !FORMATS.split(',').any(|k| k == format) {
                errs.push(FieldError::invalid(
                    at("format"),
                    json!(format),
                    format!("must be one of {FORMATS}"),
                ));
            }
            match text("jsonPath") {
                "" => errs.push(FieldError::required(at("JSONPath"), "")),
                p if !p.starts_with('.') => errs.push(FieldError::invalid(
                    at("JSONPath"),
                    json!(p),
                    "must be a simple json path starting with .",
                )),
                _ => {}
            }
        }
    }
    errs
}

/// `spec.conversion`: strategy `None` (the default) or `Webhook` with a client config.
fn validate_conversion(conversion: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if conversion.is_null() {
        return errs;
    }
    let strategy = &conversion["strategy"];
    match strategy.as_str() {
        Some("None") => {
            if conversion.get("webhook").is_some_and(|w| !w.is_null()) {
                errs.push(FieldError::forbidden(
                    "spec.conversion.webhookClientConfig",
                    "should not be set when strategy is not set to Webhook",
                ));
            }
        }
        Some("Webhook") => {
            let webhook = &conversion["webhook"];
            let config = &webhook["clientConfig"];
            let (url, service) = (
                config.get("url").filter(|u| !u.is_null()),
                config.get("service").filter(|s| !s.is_null()),
            );
            if config.is_null() {
                errs.push(FieldError::required(
                    "spec.conversion.webhookClientConfig",
                    "required when strategy is set to Webhook",
                ));
            } else if url.is_some() == service.is_some() {
                errs.push(FieldError::required(
                    "spec.conversion.webhookClientConfig",
                    "exactly one of url or service is required",
                ));
            } else if let Some(url) = url
                && !url.as_str().is_some_and(|u| u.starts_with("https://"))
            {
                errs.push(FieldError::invalid(
                    "spec.conversion.webhookClientConfig.url",
                    url.clone(),
                    "'https' is the only allowed URL scheme",
                ));
            }
            let review: Vec<&str> = webhook["conversionReviewVersions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if review.is_empty() {
                errs.push(FieldError::required("spec.conversion.conversionReviewVersions", ""));
            } else if !review.iter().any(|v| crate::conversion::REVIEW_VERSIONS.contains(v)) {
                errs.push(FieldError::invalid(
                    "spec.conversion.conversionReviewVersions",
                    json!(review),
                    format!(
                        "must include at least one of {}",
                        crate::conversion::REVIEW_VERSIONS.join(", ")
                    ),
                ));
            }
        }
        _ => errs.push(FieldError::not_supported(
            "spec.conversion.strategy",
            strategy.clone(),
            &[json!("None"), json!("Webhook")],
        )),
    }
    errs
}

fn version_names(spec: &Value) -> Vec<&str> {
    spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v["name"].as_str().unwrap_or(""))
        .collect()
}

/// The CustomResourceDefinition serving `info`, if it is a custom resource.
pub(crate) fn of_resource(inner: &Inner, info: &ResourceInfo) -> Option<std::sync::Arc<Value>> {
    if crate::typed::is_built_in(info) {
        return None;
    }
    inner.get(CRD_KEY, "", &format!("{}.{}", info.plural, info.group))
}

/// The version entry `version` of a CRD (`spec.versions[*]` with that name).
pub(crate) fn version<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"].as_str() == Some(version))
}

/// The storage version's name (the one `storage: true` version of a valid CRD).
pub(crate) fn storage_version(crd: &Value) -> Option<&str> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["storage"].as_bool().unwrap_or(false))?["name"]
        .as_str()
}

/// Appends the storage version to `status.storedVersions` if it is not there, as the CRD
/// registry strategy does on every create and update of the main resource: the list is what a
/// storage migration has to clear before an old version may leave `spec.versions`.
pub(crate) fn record_stored_version(crd: &mut Value) {
    let Some(storage) = storage_version(crd).map(str::to_owned) else {
        return;
    };
    let Some(map) = crd.as_object_mut() else {
        return;
    };
    let status = map.entry("status").or_insert_with(|| json!({}));
    if !status.is_object() {
        *status = json!({});
    }
    let stored = &mut status["storedVersions"];
    match stored.as_array_mut() {
        Some(list) if list.iter().any(|v| v.as_str() == Some(storage.as_str())) => {}
        Some(list) => list.push(Value::String(storage)),
        None => *stored = json!([storage]),
    }
}

/// The `Warning` a request to `version` gets if the CRD marks it `deprecated`: its
/// `deprecationWarning`, else kube-apiserver's default, `<group>/<version> <Kind> is
/// deprecated`, followed by `; use <group>/<v> <Kind>` naming the highest-priority served,
/// non-deprecated version of higher priority than this one, if there is one.
pub(crate) fn deprecation_warning(crd: &Value, version_name: &str) -> Option<String> {
    let v = version(crd, version_name)?;
    if !v["deprecated"].as_bool().unwrap_or(false) {
        return None;
    }
    if let Some(w) = v["deprecationWarning"].as_str() {
        return Some(w.to_owned());
    }
    let group = crd["spec"]["group"].as_str().unwrap_or("");
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or("");
    let mut msg = format!("{group}/{version_name} {kind} is deprecated");
    let newer = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["served"].as_bool().unwrap_or(false) && !o["deprecated"].as_bool().unwrap_or(false))
        .filter_map(|o| o["name"].as_str())
        .filter(|o| compare_versions(version_name, o) == Ordering::Less)
        .max_by(|a, b| compare_versions(a, b));
    if let Some(newer) = newer {
        msg.push_str(&format!("; use {group}/{newer} {kind}"));
    }
    Some(msg)
}

/// A version name's place in Kubernetes' version priority (apimachinery's
/// `parseKubeVersion`): `v<major>[(alpha|beta)<minor>]`, or `None` for other names.
fn kube_version(v: &str) -> Option<(u8, u64, u64)> {
    let rest = v.strip_prefix('v')?;
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let major: u64 = rest[..digits].parse().ok()?;
    let tail = &rest[digits..];
    let (stability, minor) = if tail.is_empty() {
        (2, "0")
    } else if let Some(m) = tail.strip_prefix("beta") {
        (1, m)
    } else {
        (0, tail.strip_prefix("alpha")?)
    };
    if minor.is_empty() || !minor.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stability, major, minor.parse().ok()?))
}

/// Compares two version names by Kubernetes' version priority, as apimachinery's
/// `CompareKubeAwareVersionStrings`: `Greater` when `a` comes first. GA before beta before
/// alpha, then the higher major, then the higher minor (`v2 > v1 > v1beta2 > v1beta1 >
/// v1alpha1`); names that are not kube-like come after all kube-like ones, alphabetically.
pub(crate) fn compare_versions(a: &str, b: &str) -> Ordering {
    match (kube_version(a), kube_version(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Greater,
        (None, Some(_)) => Ordering::Less,
        (None, None) => b.cmp(a),
    }
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
            "storedVersions": obj["status"]["storedVersions"],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
        });
        record_stored_version(&mut next);
        inner.put(CRD_KEY, next);
    }
}

/// kube-apiserver's defaults and registry strategy for a CRD body, run on every write before
/// validation: `spec.conversion` defaults to `{strategy: None}`, and the storage version joins
/// `status.storedVersions` ([`record_stored_version`]).
pub(crate) fn defaults(crd: &mut Value) {
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut)
        && spec.get("conversion").is_none_or(Value::is_null)
    {
        spec.insert("conversion".into(), json!({"strategy": "None"}));
    }
    record_stored_version(crd);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_by_kubernetes_priority() {
        let mut versions = vec![
            "v1alpha1",
            "foo",
            "v1",
            "v11alpha2",
            "v1beta1",
            "v2",
            "v1beta2",
            "bar",
            "v10",
            "v12alpha1",
        ];
        versions.sort_by(|a, b| compare_versions(b, a));
        assert_eq!(
            versions,
            [
                "v10",
                "v2",
                "v1",
                "v1beta2",
                "v1beta1",
                "v12alpha1",
                "v11alpha2",
                "v1alpha1",
                "bar",
                "foo"
            ]
        );
        assert_eq!(compare_versions("v1", "v1"), Ordering::Equal);
        assert_eq!(compare_versions("v1beta", "v1alpha1"), Ordering::Less, "not kube-like");
    }

    #[test]
    fn deprecation_warnings_name_the_newer_served_version() {
        let crd = json!({"spec": {"group": "example.com", "names": {"kind": "Foo"}, "versions": [
            {"name": "v1alpha1", "served": true, "deprecated": true},
            {"name": "v1beta1", "served": true, "deprecated": true, "deprecationWarning": "use v1, really"},
            {"name": "v1", "served": true},
            {"name": "v2", "served": false},
        ]}});
        assert_eq!(
            deprecation_warning(&crd, "v1alpha1").unwrap(),
            "example.com/v1alpha1 Foo is deprecated; use example.com/v1 Foo"
        );
        assert_eq!(deprecation_warning(&crd, "v1beta1").unwrap(), "use v1, really");
        assert_eq!(deprecation_warning(&crd, "v1"), None);
        let alone = json!({"spec": {"group": "example.com", "names": {"kind": "Foo"}, "versions": [
            {"name": "v1", "served": true, "deprecated": true}]}});
        assert_eq!(
            deprecation_warning(&alone, "v1").unwrap(),
            "example.com/v1 Foo is deprecated"
        );
    }

    #[test]
    fn stored_versions_gain_the_storage_version_once() {
        let mut crd = json!({"spec": {"versions": [{"name": "v1", "storage": false}, {"name": "v2", "storage": true}]},
            "status": {"storedVersions": ["v1"]}});
        record_stored_version(&mut crd);
        record_stored_version(&mut crd);
        assert_eq!(crd["status"]["storedVersions"], json!(["v1", "v2"]));
    }
}
