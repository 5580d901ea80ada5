//! Discovery and health: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/{group}/{version}`,
//! `/healthz`, `/readyz`, `/livez`.
//!
//! A group's versions are listed by Kubernetes' version priority, the highest preferred (`v1`
//! before `v1beta1` whatever order a CRD lists them in).
//!
//! Only legacy (unaggregated) discovery is served, as plain `application/json`; kubectl asks for
//! aggregated discovery first and falls back to it
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#discovery-api>).

use crate::resources::{Registry, ResourceInfo};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

const VERBS_NAMESPACED: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The `/version` document. The minor version makes kubectl's dispatcher pick its 1.33 build.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-envtest",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn resource_entries(resources: &[&Arc<ResourceInfo>]) -> Vec<Value> {
    let mut out = Vec::new();
    for r in resources {
        out.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS_NAMESPACED,
            "shortNames": r.short_names,
        }));
        if !r.categories.is_empty()
            && let Some(entry) = out.last_mut().and_then(Value::as_object_mut)
        {
            entry.insert("categories".into(), json!(r.categories));
        }
        if r.status_subresource {
            out.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if r.scale.is_some() {
            out.push(json!({
                "name": format!("{}/scale", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    out
}

/// The `APIGroup` of `group` serving `versions` (repeats allowed): its versions ordered by
/// Kubernetes' version priority (`crd::compare_versions`), the first of them preferred, as
/// kube-apiserver's CRD discovery orders them. kubectl uses the preferred version.
fn api_group(group: &str, mut versions: Vec<&str>) -> Value {
    versions.sort_by(|a, b| crate::crd::compare_versions(b, a));
    versions.dedup();
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
        "versions": versions,
    })
}

/// Answers a discovery or health path, or `None` if `path` is not one.
pub(crate) fn handle(registry: &Registry, path: &str) -> Option<Value> {
    let all = registry.all();
    let path = path.trim_end_matches('/');
    match path {
        "/version" => return Some(version()),
        "/healthz" | "/readyz" | "/livez" => return Some(Value::String("ok".into())),
        "/api" => {
            return Some(json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }));
        }
        "/apis" => {
            let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for r in all.iter().filter(|r| !r.group.is_empty()) {
                groups.entry(&r.group).or_default().push(&r.version);
            }
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(g, versions)| {
                    let mut group = api_group(g, versions);
                    if let Some(map) = group.as_object_mut() {
                        map.remove("kind");
                        map.remove("apiVersion");
                    }
                    group
                })
                .collect();
            return Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}));
        }
        _ => {}
    }
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version) = match segs.as_slice() {
        ["api", v] => ("", *v),
        ["apis", g, v] => (*g, *v),
        ["apis", g] => {
            let versions: Vec<&str> = all
                .iter()
                .filter(|r| r.group == *g)
                .map(|r| r.version.as_str())
                .collect();
            if versions.is_empty() {
                return None;
            }
            return Some(api_group(g, versions));
        }
        _ => return None,
    };
    let resources: Vec<&Arc<ResourceInfo>> = all
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resource_entries(&resources),
    }))
}
