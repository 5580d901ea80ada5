//! The bounds on what one request may build, so that a single authenticated request can neither
//! crash envtest nor exhaust its memory.
//!
//! | Limit | Value | kube-apiserver |
//! |---|---|---|
//! | nesting depth of a stored object ([`MAX_DEPTH`]) | 100 | 10,000 (its JSON decoder) |
//! | operations in a JSON patch ([`MAX_JSON_PATCH_OPERATIONS`]) | 10,000 | the same (`maxJSONPatchOperations`) |
//! | bytes a JSON patch's `copy` operations add ([`MAX_JSON_PATCH_COPY_BYTES`]) | 3 MiB | the same (`--json-patch-max-copy-bytes`) |
//! | encoded size of a stored object ([`MAX_OBJECT_BYTES`]) | 3 MiB | 3 MiB request bodies; etcd refuses 1.5 MiB values |
//!
//! Why depth needs a bound of its own: serde_json refuses a document nested deeper than 128 when
//! it parses one, but a patch builds values without parsing them: a JSON patch that `copy`s a
//! subtree into itself doubles the depth at every operation. Every walk over a stored object
//! (clone, comparison, drop, serialization, merge, strategic merge, field ownership, CRD schema
//! pruning, defaulting and validation, typed decoding) recurses once per level, so an object of
//! unbounded depth overflows the stack of the thread that touches it and aborts the process.
//! [`depth`] itself is iterative, so it is safe on a value of any depth, and every value built
//! from a request is measured with it before anything else walks it.
//!
//! Why 100 and not kube-apiserver's 10,000: the deepest Kubernetes type nests about 15 levels,
//! and serde_json clients (kube-rs, kinformer) refuse more than 128 levels when they parse, so an
//! object must stay some levels below 128 for a list (`items` adds 2) or a `Table` (adds 3) that
//! holds it to be readable at all. At 100 levels the heaviest walk (decoding a CRD into its
//! k8s-openapi type, a large recursive struct) needs a fraction of a tokio worker's 2 MiB stack in
//! an unoptimized build: `every_walk_at_the_depth_bound_fits_a_quarter_of_a_worker_stack` below
//! runs them all on a 512 KiB stack.
//!
//! Why 3 MiB for an object: it is kube-apiserver's request body limit (`--max-request-bytes`
//! default), the largest object a client can send in one create or update, and the limit
//! kube-apiserver puts on the bytes a JSON patch's copies may add. etcd's own limit (1.5 MiB per
//! value) is not mirrored: envtest stores JSON, not protobuf, and a test that writes a large
//! object should fail where kube-apiserver's front door fails, with its `413`.

use crate::field::{self, FieldError};
use crate::resources::ResourceInfo;
use crate::status::ApiError;
use serde_json::Value;

/// The deepest nesting a stored object may have: a scalar is 0 deep, `{}` and `[]` are 1,
/// `{"a": {}}` is 2. See the module docs for why 100.
pub const MAX_DEPTH: usize = 100;

/// The most operations a JSON patch may have (kube-apiserver's `maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The most bytes the `copy` operations of one JSON patch may add, counted as the JSON encoding
/// of each copied value (evanphx/json-patch's `AccumulatedCopySizeLimit`, which kube-apiserver
/// sets to its request body limit, 3 MiB).
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// The largest stored object, as JSON bytes (kube-apiserver's request body limit, 3 MiB).
pub const MAX_OBJECT_BYTES: usize = 3 * 1024 * 1024;

/// The nesting depth of `v` (see [`MAX_DEPTH`]). Iterative: safe on a value of any depth.
pub(crate) fn depth(v: &Value) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((v, above)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Object(m) => Box::new(m.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => continue,
        };
        let here = above + 1;
        deepest = deepest.max(here);
        stack.extend(children.map(|c| (c, here)));
    }
    deepest
}

/// The length of `v`'s JSON encoding, or `None` once it passes `limit` (the encoding stops
/// there). Serializing recurses: call only on a value whose [`depth`] is known to be bounded.
pub(crate) fn encoded_len(v: &Value, limit: usize) -> Option<usize> {
    struct Counter {
        len: usize,
        limit: usize,
    }
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.len = self.len.saturating_add(buf.len());
            if self.len > self.limit {
                return Err(std::io::Error::other("over the limit"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter { len: 0, limit };
    serde_json::to_writer(&mut counter, v).ok()?;
    Some(counter.len)
}

/// The `422` for a patch whose result would nest deeper than [`MAX_DEPTH`], worded as
/// kube-apiserver words a patched object it cannot decode (`patch: Invalid value: …`).
pub(crate) fn too_deep_patch(depth: usize) -> ApiError {
    let detail = format!("the patched object would be nested {depth} levels deep; the limit is {MAX_DEPTH}");
    field::invalid("", "", "", &[FieldError::invalid("patch", Value::Null, detail)])
}

/// Refuses an object of `info` about to be stored: `422 Invalid` deeper than [`MAX_DEPTH`] (a
/// request body may reach serde_json's 128 levels), naming the top-level field that is too deep;
/// `413 RequestEntityTooLarge` past [`MAX_OBJECT_BYTES`], as kube-apiserver answers a body over
/// its limit.
pub(crate) fn check_object(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if let Value::Object(fields) = obj {
        let errs: Vec<FieldError> = fields
            .iter()
            .map(|(k, v)| (k, depth(v) + 1))
            .filter(|(_, d)| *d > MAX_DEPTH)
            .map(|(k, d)| {
                FieldError::invalid(
                    k.as_str(),
                    Value::Null,
                    format!("the object is nested {d} levels deep; the limit is {MAX_DEPTH}"),
                )
            })
            .collect();
        if !errs.is_empty() {
            return Err(field::invalid(&info.group, &info.kind, crate::object::name(obj), &errs));
        }
    }
    if encoded_len(obj, MAX_OBJECT_BYTES).is_none() {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_OBJECT_BYTES}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `{"a": {"a": … {"a": leaf}}}`, `levels` objects deep, built without recursion.
    /// (`json!` would serialize the inner value again, recursively.)
    pub(crate) fn nested(levels: usize, leaf: Value) -> Value {
        let mut v = leaf;
        for _ in 0..levels {
            let mut m = serde_json::Map::new();
            m.insert("a".into(), v);
            v = Value::Object(m);
        }
        v
    }

    #[test]
    fn depth_counts_containers_and_survives_any_depth() {
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!({})), 1);
        assert_eq!(depth(&json!([[], {"a": [1]}])), 3);
        // Deeper than any recursive walk survives; dropped iteratively (no recursive Drop).
        let mut v = nested(200_000, json!(1));
        assert_eq!(depth(&v), 200_000);
        while let Value::Object(m) = &mut v {
            let next = m.remove("a").unwrap_or(Value::Null);
            v = next;
        }
    }

    #[test]
    fn encoded_len_is_exact_below_the_limit_and_stops_past_it() {
        let v = json!({"a": [1, "x\"y"], "b": null});
        let exact = serde_json::to_vec(&v).unwrap().len();
        assert_eq!(encoded_len(&v, 1000), Some(exact));
        assert_eq!(encoded_len(&v, exact), Some(exact));
        assert_eq!(encoded_len(&v, exact - 1), None);
    }

    /// A CRD whose `openAPIV3Schema` nests objects as deep as [`MAX_DEPTH`] allows (each schema
    /// level is two JSON levels, `properties` and the field), and a custom resource of that
    /// CRD nested to the bound.
    fn deepest_crd_and_object() -> (Value, Value) {
        // The CRD wraps its schema in 6 levels: the object, spec, versions, the version,
        // schema, openAPIV3Schema.
        let schema_levels = (MAX_DEPTH - 6) / 2;
        let mut schema = json!({"type": "string", "default": "x"});
        for _ in 0..schema_levels {
            schema = json!({"type": "object", "properties": {"a": schema}, "required": ["a"]});
        }
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "deeps.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "deeps", "kind": "Deep"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": schema}}]}
        });
        assert_eq!(depth(&crd), 6 + 2 * schema_levels);
        let mut obj = nested(schema_levels - 1, json!({}));
        obj["apiVersion"] = json!("example.com/v1");
        obj["kind"] = json!("Deep");
        obj["metadata"] = json!({"name": "d", "namespace": "default"});
        (crd, obj)
    }

    /// The bound is chosen so that every recursive walk envtest makes over a stored object is
    /// safe on a tokio worker's 2 MiB stack; this runs them, unoptimized, on a quarter of it.
    #[test]
    fn every_walk_at_the_depth_bound_fits_a_quarter_of_a_worker_stack() {
        use crate::field_manager::{self, Schema, Writer};
        use crate::patch::{self, PatchKind};
        let walks = || {
            let crd_info = crate::resources::builtin()
                .into_iter()
                .find(|r| r.kind == "CustomResourceDefinition")
                .unwrap();
            let cm_info = crate::resources::builtin()
                .into_iter()
                .find(|r| r.kind == "ConfigMap")
                .unwrap();
            let (crd, mut obj) = deepest_crd_and_object();
            // Decoding a CRD into k8s-openapi's recursive JSONSchemaProps: the heaviest walk.
            let decoded = crate::typed::decode(&crd_info, &crd, crate::typed::FieldValidation::Strict).unwrap();
            assert_eq!(depth(&decoded), depth(&crd));
            check_object(&crd_info, &decoded).unwrap();
            // A custom resource pruned, defaulted and validated by that schema.
            let schema = crate::schema::of_version(&crd, "v1").unwrap();
            crate::schema::prune(schema, &mut obj);
            crate::schema::default(schema, &mut obj);
            assert!(crate::schema::validate(schema, &obj, None).is_empty());
            let _ = crate::openapi::custom_schema(schema);
            // Field ownership, merge and strategic merge patches, JSON patch, of objects at the bound.
            let writer = Writer {
                manager: "m",
                api_version: "v1".into(),
                subresource: "",
            };
            let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
            cm["deep"] = nested(MAX_DEPTH - 1, json!(1));
            check_object(&cm_info, &cm).unwrap();
            let mut updated = cm.clone();
            updated["deep2"] = cm["deep"].clone();
            field_manager::record_update(Some(&cm), &mut updated, &writer, Schema::BuiltIn);
            let applied = field_manager::apply(Some(&cm), &updated, &writer, true, Schema::BuiltIn, "c", "c").unwrap();
            field_manager::record_update(Some(&obj), &mut obj.clone(), &writer, Schema::CustomRoot(schema));
            let body = serde_json::to_vec(&json!({"deep3": cm["deep"]})).unwrap();
            let mut target = applied.clone();
            patch::apply(PatchKind::Merge, &mut target, &body).unwrap();
            patch::apply(PatchKind::Strategic, &mut target, &body).unwrap();
            let ops = serde_json::to_vec(&json!([{"op": "copy", "from": "/deep", "path": "/deep4"}])).unwrap();
            patch::apply(PatchKind::Json, &mut target, &ops).unwrap();
            // Comparison, serialization, drop.
            assert!(target != cm);
            assert!(encoded_len(&target, usize::MAX).is_some());
            drop(target);
        };
        std::thread::Builder::new()
            .stack_size(512 * 1024)
            .spawn(walks)
            .unwrap()
            .join()
            .unwrap();
    }
}
