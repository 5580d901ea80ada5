//! A minimal OpenAPI v3 surface for kubectl: `/openapi/v3` (the index) and
//! `/openapi/v3/{api|apis/group}/{version}` documents whose PATCH operations declare the
//! `fieldValidation` query parameter. That declaration is how kubectl learns the server
//! validates fields, which `kubectl apply` requires. Schemas are empty (no client-side
//! validation, no `explain`).

use crate::resources::Registry;
use serde_json::{Value, json};
use std::collections::BTreeSet;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Answers `/openapi/v3...`, or `None`.
pub(crate) fn handle(registry: &Registry, path: &str) -> Option<Value> {
    let rest = path.strip_prefix("/openapi/v3")?;
    let all = registry.all();
    let gvs: BTreeSet<(String, String)> = all.iter().map(|r| (r.group.clone(), r.version.clone())).collect();
    let rest = rest.trim_matches('/');
    if rest.is_empty() {
        let paths: serde_json::Map<String, Value> = gvs
            .iter()
            .map(|(g, v)| {
                let p = gv_path(g, v);
                (
                    p.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=envtest")}),
                )
            })
            .collect();
        return Some(json!({"paths": paths}));
    }
    let (group, version) = gvs.iter().find(|(g, v)| gv_path(g, v) == rest)?.clone();
    let mut paths = serde_json::Map::new();
    for r in all.iter().filter(|r| r.group == group && r.version == version) {
        let base = format!("/{}", gv_path(&group, &version));
        let item = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{base}/{}/{{name}}", r.plural)
        };
        let gvk = json!([{"group": group, "version": version, "kind": r.kind}]);
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        paths.insert(
            item,
            json!({
                "get": {"operationId": format!("read{}", r.kind), "x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk[0], "responses": {"200": {"description": "OK"}}},
                "put": {"operationId": format!("replace{}", r.kind), "x-kubernetes-action": "put", "x-kubernetes-group-version-kind": gvk[0], "parameters": params, "responses": {"200": {"description": "OK"}}},
                "patch": {"operationId": format!("patch{}", r.kind), "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk[0], "parameters": params, "responses": {"200": {"description": "OK"}}},
                "delete": {"operationId": format!("delete{}", r.kind), "x-kubernetes-action": "delete", "x-kubernetes-group-version-kind": gvk[0], "responses": {"200": {"description": "OK"}}},
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-envtest"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
