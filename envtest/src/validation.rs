//! ObjectMeta validation, as kube-apiserver runs it on every create and update.
//!
//! apimachinery's `api/validation/objectmeta.go` and `util/validation` in Rust: the name rule
//! of the resource (DNS subdomain for most, DNS label for namespaces, DNS-1035 label for
//! services, path segment for RBAC), `generateName`, label keys and values, annotation keys and
//! their 256 KiB total, ownerReferences' shape and single controller, and finalizer names
//! (built-in kinds also refuse an unqualified finalizer that is not a standard one). Every rule
//! reports with kube-apiserver's field path and message, so a test that expects a
//! `422 Invalid` here gets the same one from a cluster.

use crate::field::{FieldError, join};
use crate::resources::ResourceInfo;
use serde_json::{Value, json};

/// Longest label value, name part of a qualified name, and DNS label.
const MAX_LABEL: usize = 63;
/// Longest DNS subdomain.
const MAX_SUBDOMAIN: usize = 253;
/// The most bytes all annotations (keys and values) may take together.
pub(crate) const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_ERR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// Finalizers kube-apiserver accepts without a domain on built-in kinds.
const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];

fn max_len(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `s` is non-empty, made of `inner` characters, and starts and ends with an `edge` one.
fn shaped(s: &str, edge: impl Fn(u8) -> bool, inner: impl Fn(u8) -> bool) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => edge(f) && edge(l) && b.iter().all(|&c| edge(c) || inner(c)),
        _ => false,
    }
}

fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

fn lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_label_shaped(s: &str) -> bool {
    shaped(s, lower_alnum, |c| c == b'-')
}

fn is_subdomain_shaped(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(is_label_shaped)
}

/// `IsDNS1123Subdomain`: the messages for `v`, empty when valid.
pub(crate) fn dns1123_subdomain(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > MAX_SUBDOMAIN {
        errs.push(max_len(MAX_SUBDOMAIN));
    }
    if !is_subdomain_shaped(v) {
        errs.push(DNS1123_SUBDOMAIN_ERR.to_owned());
    }
    errs
}

/// `IsDNS1123Label`.
pub(crate) fn dns1123_label(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > MAX_LABEL {
        errs.push(max_len(MAX_LABEL));
    }
    if !is_label_shaped(v) {
        errs.push(if is_subdomain_shaped(v) {
            "must not contain dots".to_owned()
        } else {
            DNS1123_LABEL_ERR.to_owned()
        });
    }
    errs
}

/// `IsDNS1035Label`.
pub(crate) fn dns1035_label(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > MAX_LABEL {
        errs.push(max_len(MAX_LABEL));
    }
    let starts_with_letter = v.as_bytes().first().is_some_and(u8::is_ascii_lowercase);
    if !starts_with_letter || !is_label_shaped(v) {
        errs.push(DNS1035_LABEL_ERR.to_owned());
    }
    errs
}

/// `IsQualifiedName`: an optional DNS-subdomain prefix and `/`, then a name part.
pub(crate) fn qualified_name(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = v.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_ERR} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > MAX_LABEL {
        errs.push(format!("name part {}", max_len(MAX_LABEL)));
    }
    if !shaped(name, alnum, |c| matches!(c, b'-' | b'_' | b'.')) {
        errs.push(format!("name part {QUALIFIED_NAME_ERR}"));
    }
    errs
}

/// `IsValidLabelValue`: empty, or a name part of at most 63 characters.
pub(crate) fn label_value(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > MAX_LABEL {
        errs.push(max_len(MAX_LABEL));
    }
    if !v.is_empty() && !shaped(v, alnum, |c| matches!(c, b'-' | b'_' | b'.')) {
        errs.push(LABEL_VALUE_ERR.to_owned());
    }
    errs
}

/// `path.IsValidPathSegmentName` (RBAC names): anything a URL path segment can hold.
fn path_segment(v: &str, prefix: bool) -> Vec<String> {
    let mut errs = Vec::new();
    if !prefix && (v == "." || v == "..") {
        errs.push(format!("may not be '{v}'"));
    }
    for bad in ["/", "%"] {
        if v.contains(bad) {
            errs.push(format!("may not contain '{bad}'"));
        }
    }
    errs
}

/// The rule a resource's names follow (its registry's `ValidateName` function).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameRule {
    /// `NameIsDNSSubdomain`: most resources, custom resources included.
    Subdomain,
    /// `ValidateNamespaceName`: a DNS label.
    Label,
    /// `ValidateServiceName`: a DNS-1035 label (starts with a letter).
    Dns1035,
    /// `ValidateRBACName`: a path segment.
    PathSegment,
}

fn name_rule(info: &ResourceInfo) -> NameRule {
    match (info.group.as_str(), info.kind.as_str()) {
        ("", "Namespace") => NameRule::Label,
        ("", "Service") => NameRule::Dns1035,
        ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
        _ => NameRule::Subdomain,
    }
}

fn check_name(rule: NameRule, name: &str, prefix: bool) -> Vec<String> {
    match rule {
        NameRule::Subdomain => dns1123_subdomain(name),
        NameRule::Label => dns1123_label(name),
        NameRule::Dns1035 => dns1035_label(name),
        NameRule::PathSegment => path_segment(name, prefix),
    }
}

/// `maskTrailingDash`: a generateName may end in `-`, the generated suffix follows it.
fn mask_trailing_dash(s: &str) -> String {
    // As apimachinery does it: the last two bytes give way to an `a` (the dash cannot end a
    // name; the suffix will). A prefix cut inside a character is left whole and fails anyway.
    if s.len() > 1 && s.ends_with('-') {
        match s.get(..s.len() - 2) {
            Some(head) => format!("{head}a"),
            None => s.to_owned(),
        }
    } else {
        s.to_owned()
    }
}

fn str_field<'a>(m: &'a Value, key: &str) -> &'a str {
    m.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Validates the metadata of `obj`, an object of `info` about to be stored; `builtin` selects
/// the built-in kinds' stricter finalizer rule. Returns every failure, in kube-apiserver's order.
pub(crate) fn object_meta(info: &ResourceInfo, obj: &Value, builtin: bool) -> Vec<FieldError> {
    let empty = json!({});
    let meta = obj.get("metadata").unwrap_or(&empty);
    let rule = name_rule(info);
    let mut errs = Vec::new();
    let generate_name = str_field(meta, "generateName");
    if !generate_name.is_empty() {
        for m in check_name(rule, &mask_trailing_dash(generate_name), true) {
            errs.push(FieldError::invalid("metadata.generateName", json!(generate_name), m));
        }
    }
    let name = str_field(meta, "name");
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        for m in check_name(rule, name, false) {
            errs.push(FieldError::invalid("metadata.name", json!(name), m));
        }
        if (info.group.as_str(), info.kind.as_str()) == ("batch", "CronJob") && name.len() > 52 {
            errs.push(FieldError::invalid("metadata.name", json!(name), max_len(52)));
        }
    }
    if info.namespaced {
        let ns = str_field(meta, "namespace");
        if ns.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else {
            for m in dns1123_label(ns) {
                errs.push(FieldError::invalid("metadata.namespace", json!(ns), m));
            }
        }
    }
    if let Some(g) = meta.get("generation").and_then(Value::as_i64)
        && g < 0
    {
        errs.push(FieldError::invalid(
            "metadata.generation",
            json!(g),
            "must be greater than or equal to 0",
        ));
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            for m in qualified_name(k) {
                errs.push(FieldError::invalid("metadata.labels", json!(k), m));
            }
            for m in label_value(v.as_str().unwrap_or("")) {
                errs.push(FieldError::invalid("metadata.labels", v.clone(), m));
            }
        }
    }
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0usize;
        for (k, v) in annotations {
            for m in qualified_name(&k.to_ascii_lowercase()) {
                errs.push(FieldError::invalid("metadata.annotations", json!(k), m));
            }
            total = total
                .saturating_add(k.len())
                .saturating_add(v.as_str().map_or(0, str::len));
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT {
            errs.push(FieldError::too_long(
                "metadata.annotations",
                TOTAL_ANNOTATION_SIZE_LIMIT,
            ));
        }
    }
    owner_references(meta, &mut errs);
    let finalizers: Vec<&str> = meta
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for f in &finalizers {
        for m in qualified_name(f) {
            errs.push(FieldError::invalid("metadata.finalizers", json!(f), m));
        }
    }
    if finalizers.contains(&"orphan") && finalizers.contains(&"foregroundDeletion") {
        errs.push(FieldError::invalid(
            "metadata.finalizers",
            json!(finalizers),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    if builtin {
        for (i, f) in finalizers.iter().enumerate() {
            if !f.contains('/') && !STANDARD_FINALIZERS.contains(f) {
                errs.push(FieldError::invalid(
                    format!("metadata.finalizers[{i}]"),
                    json!(f),
                    "name is neither a standard finalizer name nor is it fully qualified",
                ));
            }
        }
    }
    errs
}

/// `ValidateOwnerReferences`: every reference names apiVersion, kind, name and uid; at most one
/// is the controller. Paths carry no index, as kube-apiserver's do.
fn owner_references(meta: &Value, errs: &mut Vec<FieldError>) {
    let Some(refs) = meta.get("ownerReferences").and_then(Value::as_array) else {
        return;
    };
    let path = "metadata.ownerReferences";
    let mut controller: Option<String> = None;
    for r in refs {
        let api_version = str_field(r, "apiVersion");
        let version = api_version.rsplit('/').next().unwrap_or("");
        if version.is_empty() {
            errs.push(FieldError::invalid(
                join(path, "apiVersion"),
                json!(api_version),
                "version must not be empty",
            ));
        }
        for (key, what) in [("kind", "kind"), ("name", "name"), ("uid", "uid")] {
            let v = str_field(r, key);
            if v.is_empty() {
                errs.push(FieldError::invalid(
                    join(path, key),
                    json!(v),
                    format!("{what} must not be empty"),
                ));
            }
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            let this = format!("{}/{}", str_field(r, "kind"), str_field(r, "name"));
            match &controller {
                Some(first) => errs.push(FieldError::invalid(
                    path,
                    Value::Array(refs.clone()),
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"
                    ),
                )),
                None => controller = Some(this),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin;

    fn info(kind: &str) -> ResourceInfo {
        builtin().into_iter().find(|r| r.kind == kind).unwrap()
    }

    #[test]
    fn name_rules_follow_the_resource() {
        assert!(dns1123_subdomain("a.b-c").is_empty());
        assert_eq!(dns1123_subdomain("A"), vec![DNS1123_SUBDOMAIN_ERR.to_owned()]);
        assert_eq!(dns1123_label("a.b"), vec!["must not contain dots".to_owned()]);
        assert!(dns1035_label("1abc").len() == 1);
        assert!(dns1035_label("abc-1").is_empty());
        assert_eq!(dns1123_subdomain(&"a".repeat(254)), vec![max_len(253)]);
        assert!(path_segment("system:controller:x", false).is_empty());
        assert_eq!(path_segment("a/b", false), vec!["may not contain '/'".to_owned()]);
        let svc = object_meta(
            &info("Service"),
            &json!({"metadata": {"name": "1svc", "namespace": "d"}}),
            true,
        );
        assert_eq!(svc.len(), 1);
        assert_eq!(svc[0].field, "metadata.name");
    }

    #[test]
    fn qualified_names_and_label_values() {
        assert!(qualified_name("app.kubernetes.io/name").is_empty());
        assert_eq!(qualified_name("/x"), vec!["prefix part must be non-empty".to_owned()]);
        assert_eq!(qualified_name("a/b/c").len(), 1);
        assert_eq!(qualified_name("x/").len(), 2, "empty name part: both messages");
        assert!(label_value("").is_empty());
        assert_eq!(label_value("bad value!"), vec![LABEL_VALUE_ERR.to_owned()]);
        assert_eq!(label_value(&"a".repeat(64)), vec![max_len(63)]);
    }

    #[test]
    fn metadata_errors_carry_kube_apiservers_paths() {
        let obj = json!({"metadata": {
            "name": "ok", "namespace": "default",
            "labels": {"bad key!": "v", "k": "bad value!"},
            "annotations": {"a": "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT)},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "A", "name": "a", "uid": "1", "controller": true},
                {"apiVersion": "v1", "kind": "B", "name": "b", "uid": "", "controller": true},
            ],
            "finalizers": ["example.com/ok", "plain"],
        }});
        let errs = object_meta(&info("ConfigMap"), &obj, true);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.labels",
                "metadata.labels",
                "metadata.annotations",
                "metadata.ownerReferences.uid",
                "metadata.ownerReferences",
                "metadata.finalizers[1]",
            ]
        );
        assert!(errs[4].detail.ends_with("references for A/a and B/b"));
        // Custom resources only warn about an unqualified finalizer.
        assert!(
            object_meta(
                &info("ConfigMap"),
                &json!({"metadata": {"name": "x", "namespace": "d", "finalizers": ["plain"]}}),
                false
            )
            .is_empty()
        );
    }

    #[test]
    fn generate_name_may_end_in_a_dash() {
        let ok = json!({"metadata": {"name": "web-abcde", "generateName": "web-", "namespace": "d"}});
        assert!(object_meta(&info("Pod"), &ok, true).is_empty());
        let missing = object_meta(&info("Pod"), &json!({"metadata": {"namespace": "d"}}), true);
        assert_eq!(
            missing[0].to_string(),
            "metadata.name: Required value: name or generateName is required"
        );
    }
}
