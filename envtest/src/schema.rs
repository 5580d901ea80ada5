//! Custom resources checked against their CRD's structural schema: pruning, defaulting,
//! validation.
//!
//! What kube-apiserver's apiextensions server does with a custom resource's body, in its order
//! (<https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/>):
//! 1. pruning: fields the version's `openAPIV3Schema` does not declare are dropped (refused with
//!    `fieldValidation=Strict`), except under `x-kubernetes-preserve-unknown-fields: true`, in an
//!    `x-kubernetes-embedded-resource`'s `apiVersion`/`kind`/`metadata`, or where
//!    `additionalProperties` allows any key; a `null` for a field that is not `nullable` is
//!    dropped too;
//! 2. defaulting: an absent field with a `default` gets it (defaults of the defaults' children
//!    too);
//! 3. validation: `type` (with `x-kubernetes-int-or-string`), `nullable`, `required`, `enum`,
//!    `minimum`/`maximum` (and their exclusive forms), `multipleOf`, `minLength`/`maxLength`,
//!    `pattern`, `minItems`/`maxItems`, `minProperties`/`maxProperties`, `items`,
//!    `additionalProperties`; each failure a [`FieldError`] worded as kube-openapi words it
//!    (`spec.replicas in body must be of type integer: "string"`);
//! 4. CEL rules (`x-kubernetes-validations`, `cel/mod.rs`), with the stored object on update for
//!    transition rules, unless step 3 found a type, required, enum or size error (then one
//!    `<nil>: Invalid value: "null": some validation rules were not checked …` instead).
//!
//! Not checked (listed in envtest's module docs): `allOf`/`anyOf`/`oneOf`/`not`, `format`, and
//! the uniqueness of `x-kubernetes-list-type: set` and `map` items.

use crate::field::{ErrorType, FieldError, join};
use serde_json::{Map, Value, json};

/// The `openAPIV3Schema` of `version` in `crd`, if it has one.
pub(crate) fn of_version<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"].as_str() == Some(version))?
        .get("schema")?
        .get("openAPIV3Schema")
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

/// The schema `additionalProperties` gives every key, if it is a schema (not `true`/`false`).
fn additional(schema: &Value) -> Option<&Value> {
    schema.get("additionalProperties").filter(|a| a.is_object())
}

/// Prunes `obj` (a whole custom resource) in place; returns the paths of the fields dropped
/// (the `unknown field` list `Strict` refuses). `apiVersion`, `kind` and `metadata` are the
/// server's, never pruned here.
pub(crate) fn prune(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut dropped = Vec::new();
    if let Some(map) = obj.as_object_mut() {
        prune_object(schema, map, "", true, &mut dropped);
    }
    dropped
}

fn prune_object(schema: &Value, map: &mut Map<String, Value>, path: &str, root: bool, dropped: &mut Vec<String>) {
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let embedded = flag(schema, "x-kubernetes-embedded-resource");
    let props = properties(schema);
    let extra = additional(schema);
    let any_key = schema.get("additionalProperties").and_then(Value::as_bool) == Some(true);
    let keys: Vec<String> = map.keys().cloned().collect();
    for key in keys {
        let child = join(path, &key);
        // The root's (and an embedded resource's) apiVersion, kind and metadata are
        // ObjectMeta's business, whatever the schema says of them (many CRDs declare
        // `metadata: {type: object}`, which would otherwise prune every name).
        if (root || embedded) && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let sub = props.and_then(|p| p.get(&key)).or(extra);
        match sub {
            Some(sub) => {
                let Some(v) = map.get_mut(&key) else { continue };
                if v.is_null() && !flag(sub, "nullable") {
                    map.remove(&key);
                    continue;
                }
                prune_value(sub, v, &child, dropped);
            }
            None if preserve || any_key => {}
            None => {
                map.remove(&key);
                dropped.push(child);
            }
        }
    }
}

fn prune_value(schema: &Value, v: &mut Value, path: &str, dropped: &mut Vec<String>) {
    match v {
        Value::Object(map) => prune_object(schema, map, path, false, dropped),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_value(item_schema, item, &format!("{path}[{i}]"), dropped);
                }
            }
        }
        _ => {}
    }
}

/// Applies the schema's `default`s to absent fields of `obj`, in place.
pub(crate) fn default(schema: &Value, obj: &mut Value) {
    match obj {
        Value::Object(map) => {
            if let Some(props) = properties(schema) {
                for (key, sub) in props {
                    if let Some(d) = sub.get("default")
                        && map.get(key).is_none_or(Value::is_null)
                    {
                        map.insert(key.clone(), d.clone());
                    }
                    if let Some(v) = map.get_mut(key) {
                        default(sub, v);
                    }
                }
            }
            if let Some(sub) = additional(schema) {
                for v in map.values_mut() {
                    default(sub, v);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                for item in items {
                    default(sub, item);
                }
            }
        }
        _ => {}
    }
}

/// Validates `obj` (a whole custom resource, pruned and defaulted) against `schema`; the
/// top-level `apiVersion`, `kind` and `metadata` are left to ObjectMeta validation. Then the
/// schema's CEL rules (`cel`), with `old`, the stored object on update, for transition rules;
/// unless a type, required, enum or size error already makes the object the wrong shape for them,
/// as kube-apiserver's `hasBlockingErr`.
pub(crate) fn validate(schema: &Value, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(map) = obj.as_object() {
        let top = Map::from_iter(
            map.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        let mut root_schema = schema.clone();
        if let Some(req) = root_schema.get_mut("required").and_then(Value::as_array_mut) {
            req.retain(|r| !matches!(r.as_str(), Some("apiVersion" | "kind" | "metadata")));
        }
        if let Some(props) = root_schema.get_mut("properties").and_then(Value::as_object_mut) {
            for k in ["apiVersion", "kind", "metadata"] {
                props.remove(k);
            }
        }
        check(&root_schema, &Value::Object(top), "", &mut errs);
    }
    if crate::cel::has_rules(schema) {
        let blocking = errs.iter().any(|e| {
            matches!(
                e.ty,
                ErrorType::NotSupported
                    | ErrorType::Required
                    | ErrorType::TooLong
                    | ErrorType::TooMany
                    | ErrorType::TypeInvalid
            )
        });
        if blocking {
            errs.push(FieldError::invalid(
                "<nil>",
                json!("null"),
                "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
            ));
        } else {
            errs.extend(crate::cel::validate(schema, obj, old));
        }
    }
    errs
}

/// The JSON type name kube-openapi reports for `v`.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(expected: &str, actual: &str) -> bool {
    expected == actual || (expected == "number" && actual == "integer")
}

/// "`path` in body": how kube-openapi names the field inside its message.
fn in_body(path: &str) -> String {
    format!("{path} in body")
}

fn number(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// A schema number as kube-openapi prints it (integral values without a fraction).
fn show_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

fn check(schema: &Value, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let actual = type_name(v);
    if v.is_null() {
        if flag(schema, "nullable") {
            return;
        }
        if let Some(t) = schema.get("type").and_then(Value::as_str) {
            errs.push(FieldError::type_invalid(
                path,
                json!(actual),
                format!("{} must be of type {t}: {:?}", in_body(path), actual),
            ));
        }
        return;
    }
    if flag(schema, "x-kubernetes-int-or-string") {
        if !matches!(actual, "integer" | "string") {
            errs.push(FieldError::type_invalid(
                path,
                json!(actual),
                format!("{} must be of type integer,string: {:?}", in_body(path), actual),
            ));
        }
    } else if let Some(t) = schema.get("type").and_then(Value::as_str)
        && !type_matches(t, actual)
    {
        errs.push(FieldError::type_invalid(
            path,
            json!(actual),
            format!("{} must be of type {t}: {:?}", in_body(path), actual),
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        errs.push(FieldError::not_supported(path, v.clone(), allowed));
    }
    match v {
        Value::Number(_) => check_number(schema, v, path, errs),
        Value::String(s) => check_string(schema, s, path, errs),
        Value::Array(items) => {
            let n = items.len();
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && n as u64 > max
            {
                errs.push(FieldError::too_many(path, n, max));
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (n as u64) < min
            {
                errs.push(FieldError::invalid(
                    path,
                    json!(n),
                    format!("{} should have at least {min} items", in_body(path)),
                ));
            }
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                for (i, item) in items.iter().enumerate() {
                    check(sub, item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Value::Object(map) => {
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for r in required.iter().filter_map(Value::as_str) {
                    if map.get(r).is_none_or(Value::is_null) {
                        errs.push(FieldError::required(join(path, r), ""));
                    }
                }
            }
            let n = map.len();
            if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
                && n as u64 > max
            {
                errs.push(FieldError::too_many(path, n, max));
            }
            if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
                && (n as u64) < min
            {
                errs.push(FieldError::invalid(
                    path,
                    json!(n),
                    format!("{} should have at least {min} properties", in_body(path)),
                ));
            }
            let props = properties(schema);
            let extra = additional(schema);
            for (key, child) in map {
                if let Some(sub) = props.and_then(|p| p.get(key)).or(extra) {
                    check(sub, child, &join(path, key), errs);
                }
            }
        }
        _ => {}
    }
}

fn check_number(schema: &Value, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(x) = number(v) else { return };
    let bound = |key: &str| schema.get(key).and_then(number);
    if let Some(min) = bound("minimum") {
        let exclusive = flag(schema, "exclusiveMinimum");
        if x < min || (exclusive && x == min) {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errs.push(FieldError::invalid(
                path,
                v.clone(),
                format!("{} should be {rel} {}", in_body(path), show_number(min)),
            ));
        }
    }
    if let Some(max) = bound("maximum") {
        let exclusive = flag(schema, "exclusiveMaximum");
        if x > max || (exclusive && x == max) {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            errs.push(FieldError::invalid(
                path,
                v.clone(),
                format!("{} should be {rel} {}", in_body(path), show_number(max)),
            ));
        }
    }
    if let Some(m) = bound("multipleOf")
        && m > 0.0
        && (x / m).fract() != 0.0
    {
        errs.push(FieldError::invalid(
            path,
            v.clone(),
            format!("{} should be a multiple of {}", in_body(path), show_number(m)),
        ));
    }
}

fn check_string(schema: &Value, s: &str, path: &str, errs: &mut Vec<FieldError>) {
    // kube-openapi counts characters (runes) for the length bounds.
    let chars = s.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && chars > max
    {
        errs.push(FieldError::too_long(path, usize::try_from(max).unwrap_or(usize::MAX)));
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && chars < min
    {
        errs.push(FieldError::invalid(
            path,
            json!(s),
            format!("{} should be at least {min} chars long", in_body(path)),
        ));
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
        // A pattern the regex engine cannot compile is the CRD's fault; kube-apiserver refuses
        // such a CRD at creation, envtest skips the check.
        && let Ok(re) = regex::Regex::new(pattern)
        && !re.is_match(s)
    {
        errs.push(FieldError::invalid(
            path,
            json!(s),
            format!("{} should match '{pattern}'", in_body(path)),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["image"], "properties": {
                "image": {"type": "string", "minLength": 3, "maxLength": 10, "pattern": "^[a-z]+$"},
                "replicas": {"type": "integer", "minimum": 0, "maximum": 5, "default": 1},
                "color": {"type": "string", "enum": ["red", "blue"]},
                "port": {"x-kubernetes-int-or-string": true},
                "ratio": {"type": "number", "nullable": true},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                "env": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "value": {"type": "string", "default": "x"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "template": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {}},
            }},
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        }})
    }

    /// The errors as text, sorted (object keys may iterate in insertion or sorted order).
    fn fields(errs: &[FieldError]) -> Vec<String> {
        let mut v: Vec<String> = errs.iter().map(ToString::to_string).collect();
        v.sort();
        v
    }

    #[test]
    fn unknown_fields_are_pruned_where_the_schema_does_not_preserve_them() {
        let mut schema = schema();
        schema["properties"]["metadata"] = json!({"type": "object"});
        let mut obj = json!({"apiVersion": "x/v1", "kind": "Foo", "metadata": {"name": "a"},
            "spec": {"image": "abc", "bogus": 1, "env": [{"name": "a", "junk": true}],
                "labels": {"any": "thing"}, "raw": {"free": {"form": 1}},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
                "ratio": null, "color": null},
            "extra": 1});
        let mut dropped = prune(&schema, &mut obj);
        dropped.sort();
        assert_eq!(
            dropped,
            ["extra", "spec.bogus", "spec.env[0].junk", "spec.template.spec"]
        );
        assert!(
            obj["spec"].get("color").is_none(),
            "null of a non-nullable field is dropped"
        );
        assert_eq!(obj["spec"]["ratio"], Value::Null, "nullable keeps its null");
        assert_eq!(obj["spec"]["raw"], json!({"free": {"form": 1}}));
        assert_eq!(obj["spec"]["template"]["metadata"], json!({"name": "p"}));
        assert_eq!(
            obj["metadata"],
            json!({"name": "a"}),
            "a declared metadata is still ObjectMeta"
        );
    }

    #[test]
    fn defaults_fill_absent_fields_at_every_depth() {
        let mut obj = json!({"spec": {"image": "abc", "env": [{"name": "a"}, {"name": "b", "value": "y"}]}});
        default(&schema(), &mut obj);
        assert_eq!(obj["spec"]["replicas"], 1);
        assert_eq!(
            obj["spec"]["env"],
            json!([{"name": "a", "value": "x"}, {"name": "b", "value": "y"}])
        );
    }

    #[test]
    fn validation_words_errors_as_kube_openapi() {
        let obj = json!({"apiVersion": "x/v1", "kind": "Foo", "metadata": {"name": "a"},
            "spec": {"replicas": "x", "color": "green", "port": true, "tags": ["a", "b", "c"],
                "labels": {"k": 1}}});
        assert_eq!(
            fields(&validate(&schema(), &obj, None)),
            [
                r#"spec.color: Unsupported value: "green": supported values: "red", "blue""#,
                "spec.image: Required value",
                r#"spec.labels.k: Invalid value: "integer": spec.labels.k in body must be of type string: "integer""#,
                r#"spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean""#,
                r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#,
                "spec.tags: Too many: 3: must have at most 2 items",
            ]
        );
        let obj = json!({"spec": {"image": "AB", "replicas": -1}, "status": {"ready": "yes"}});
        assert_eq!(
            fields(&validate(&schema(), &obj, None)),
            [
                r#"spec.image: Invalid value: "AB": spec.image in body should be at least 3 chars long"#,
                r#"spec.image: Invalid value: "AB": spec.image in body should match '^[a-z]+$'"#,
                "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
                r#"status.ready: Invalid value: "string": status.ready in body must be of type boolean: "string""#,
            ]
        );
        let long = json!({"spec": {"image": "abcdefghijkl", "replicas": 6, "ratio": null, "port": "http"}});
        assert_eq!(
            fields(&validate(&schema(), &long, None)),
            [
                "spec.image: Too long: may not be more than 10 bytes",
                "spec.replicas: Invalid value: 6: spec.replicas in body should be less than or equal to 5",
            ]
        );
    }
}
