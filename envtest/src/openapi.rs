//! OpenAPI v3 for kubectl: `/openapi/v3` (the index) and one document per group-version, with
//! the operations kubectl looks for and the schemas of the kinds served there.
//!
//! Two kubectl commands read these documents:
//! - `kubectl apply` (and create/replace) checks that the PATCH operation of the kind declares
//!   the `fieldValidation` query parameter; if so it leaves validation to the server (which
//!   envtest does, see `typed.rs` and `schema.rs`) instead of validating against OpenAPI v2;
//! - `kubectl explain` finds the kind through the `x-kubernetes-group-version-kind` of an
//!   operation in `paths`, then the schema in `components.schemas` whose
//!   `x-kubernetes-group-version-kind` names it, and walks its `properties`, `$ref`s and
//!   `allOf`s.
//!
//! Built-in schemas come from k8s-openapi's `schemars` implementations (named as
//! kube-apiserver names them, `io.k8s.api.apps.v1.Deployment`, references as
//! `#/components/schemas/...`); a custom resource's is its CRD version's `openAPIV3Schema`,
//! named `<reversed group>.<version>.<Kind>` with `metadata` a reference to `ObjectMeta`, as
//! kube-apiserver publishes it. The index's `?hash=` is a hash of each document, so kubectl's
//! cache of a group-version is refreshed when a CRD changes it.

use crate::resources::{Registry, ResourceInfo};
use crate::storage::Storage;
use crate::typed::{self, KindVisitor};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Registers the visited type's schema (and everything it refers to) in the generator and
/// returns its name.
struct Register<'a>(&'a mut SchemaGenerator);

impl KindVisitor for Register<'_> {
    type Output = String;
    fn visit<K>(self) -> String
    where
        K: k8s_openapi::Resource + DeserializeOwned + Serialize + schemars::JsonSchema,
    {
        self.0.subschema_for::<K>();
        K::schema_name().into_owned()
    }
}

/// The schema name kube-apiserver gives a custom resource: `com.example.v1.Foo`.
fn custom_schema_name(info: &ResourceInfo) -> String {
    let group: Vec<&str> = info.group.split('.').rev().collect();
    format!("{}.{}.{}", group.join("."), info.version, info.kind)
}

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// A custom resource's schema as published: the CRD version's `openAPIV3Schema` with
/// `apiVersion`, `kind` and a `metadata` reference to ObjectMeta.
pub(crate) fn custom_schema(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(map) = s.as_object_mut() {
        let props = map.entry("properties").or_insert_with(|| json!({}));
        if let Some(props) = props.as_object_mut() {
            props.insert(
                "apiVersion".into(),
                json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}),
            );
            props.insert(
                "kind".into(),
                json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}),
            );
            props.insert(
                "metadata".into(),
                json!({"allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}], "description": "Standard object's metadata."}),
            );
        }
    }
    s
}

/// The document of one group-version, `None` if nothing is served there.
fn document(storage: &Storage, resources: &[&ResourceInfo]) -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let mut kinds: Vec<(String, &ResourceInfo)> = Vec::new();
    let mut custom: Map<String, Value> = Map::new();
    for r in resources {
        if let Some(name) = typed::dispatch(&r.group, &r.version, &r.kind, Register(&mut generator)) {
            kinds.push((name, r));
            continue;
        }
        let crd = storage
            .lock()
            .get(crate::crd::CRD_KEY, "", &format!("{}.{}", r.plural, r.group));
        if let Some(schema) = crd.as_deref().and_then(|c| crate::schema::of_version(c, &r.version)) {
            generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>();
            let name = custom_schema_name(r);
            custom.insert(name.clone(), custom_schema(schema));
            kinds.push((name, r));
        }
    }
    let mut schemas = generator.take_definitions(true);
    schemas.extend(custom);
    for (name, r) in &kinds {
        if let Some(Value::Object(s)) = schemas.get_mut(name) {
            s.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": r.group, "kind": r.kind, "version": r.version}]),
            );
        }
    }
    let mut paths = Map::new();
    for (name, r) in &kinds {
        let base = format!("/{}", gv_path(&r.group, &r.version));
        let (collection, item) = if r.namespaced {
            (
                format!("{base}/namespaces/{{namespace}}/{}", r.plural),
                format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural),
            )
        } else {
            (format!("{base}/{}", r.plural), format!("{base}/{}/{{name}}", r.plural))
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        let body = json!({"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}}}});
        let op = |verb: &str, action: &str, with_params: bool| {
            let mut o = json!({
                "operationId": format!("{verb}{}", r.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "responses": body,
            });
            if with_params {
                o["parameters"] = params.clone();
            }
            o
        };
        paths.insert(
            collection,
            json!({"post": op("create", "post", true), "get": op("list", "list", false)}),
        );
        paths.insert(
            item,
            json!({
                "get": op("read", "get", false),
                "put": op("replace", "put", true),
                "patch": op("patch", "patch", true),
                "delete": op("delete", "delete", false),
            }),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0-envtest"},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// A stable hash of a document, for the index's `?hash=`.
fn hash(doc: &Value) -> String {
    let mut h = std::hash::DefaultHasher::new();
    doc.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// Answers `/openapi/v3...`, or `None`.
pub(crate) fn handle(registry: &Registry, storage: &Storage, path: &str) -> Option<Value> {
    let rest = path.strip_prefix("/openapi/v3")?;
    let all = registry.all();
    let gvs: BTreeSet<(String, String)> = all.iter().map(|r| (r.group.clone(), r.version.clone())).collect();
    let of_gv = |g: &str, v: &str| -> Vec<&ResourceInfo> {
        all.iter()
            .filter(|r| r.group == g && r.version == v)
            .map(|r| r.as_ref())
            .collect()
    };
    let rest = rest.trim_matches('/');
    if rest.is_empty() {
        let paths: Map<String, Value> = gvs
            .iter()
            .map(|(g, v)| {
                let p = gv_path(g, v);
                let h = hash(&document(storage, &of_gv(g, v)));
                (
                    p.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={h}")}),
                )
            })
            .collect();
        return Some(json!({"paths": paths}));
    }
    let (group, version) = gvs.iter().find(|(g, v)| gv_path(g, v) == rest)?;
    Some(document(storage, &of_gv(group, version)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_documents_carry_schemas_with_their_kinds() {
        let registry = Registry::new();
        let storage = Storage::new(crate::watch_cache::WatchCache::new(
            crate::watch_cache::WatchCacheConfig {
                capacity: 16,
                watcher_buffer: 16,
                grace: std::time::Duration::from_secs(1),
            },
            0,
        ));
        let doc = handle(&registry, &storage, "/openapi/v3/apis/apps/v1").unwrap();
        let schemas = &doc["components"]["schemas"];
        let deployment = &schemas["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            deployment["x-kubernetes-group-version-kind"],
            json!([{"group": "apps", "kind": "Deployment", "version": "v1"}])
        );
        let spec_ref = deployment["properties"]["spec"]["allOf"][0]["$ref"].as_str().unwrap();
        assert_eq!(spec_ref, "#/components/schemas/io.k8s.api.apps.v1.DeploymentSpec");
        assert_eq!(
            schemas["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["replicas"]["type"],
            "integer"
        );
        assert!(schemas.get(OBJECT_META).is_some());
        let patch = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Deployment");
        let index = handle(&registry, &storage, "/openapi/v3").unwrap();
        let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"].as_str().unwrap();
        assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="), "{url}");
    }

    #[test]
    fn custom_schema_names_reverse_the_group() {
        let info = crate::resources::builtin().into_iter().next().unwrap();
        let info = ResourceInfo {
            group: "stable.example.com".into(),
            version: "v1".into(),
            kind: "Foo".into(),
            ..info
        };
        assert_eq!(custom_schema_name(&info), "com.example.stable.v1.Foo");
    }
}
