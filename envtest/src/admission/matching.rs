//! Whether a webhook is called for a request: kube-apiserver's `ShouldCallHook` (rules,
//! `namespaceSelector`, `objectSelector`), over a webhook as its configuration's JSON.
//!
//! Rules are matched exactly (`matchPolicy: Exact`); `Equivalent` matches the same way, as envtest
//! serves each built-in resource in one version and a request is matched in its own version.

use super::Attributes;
use crate::scale::selector_string;
use crate::selectors::LabelSelector;
use serde_json::Value;

/// The strings of a list field (absent: empty).
fn strings<'a>(v: &'a Value, field: &str) -> impl Iterator<Item = &'a str> {
    v.get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// Whether one `RuleWithOperations` matches `attrs`.
fn rule_matches(rule: &Value, attrs: &Attributes<'_>) -> bool {
    let op = attrs.operation.as_str();
    let any_of = |field: &str, want: &str| strings(rule, field).any(|s| s == "*" || s == want);
    if !any_of("operations", op)
        || !any_of("apiGroups", &attrs.info.group)
        || !any_of("apiVersions", &attrs.info.version)
    {
        return false;
    }
    let (resource, sub) = (attrs.info.plural.as_str(), attrs.subresource.unwrap_or(""));
    let resource_ok = strings(rule, "resources").any(|r| match r.split_once('/') {
        // `*` is every resource without a subresource, `x` is x alone; `x/*` and `*/*` take
        // the main resource too (a `*` matches the empty subresource).
        None => sub.is_empty() && (r == "*" || r == resource),
        Some((res, subres)) => (res == "*" || res == resource) && (subres == "*" || subres == sub),
    });
    if !resource_ok {
        return false;
    }
    match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
        "Cluster" => !attrs.info.namespaced,
        "Namespaced" => attrs.info.namespaced,
        _ => true,
    }
}

/// Whether a `LabelSelector` (absent or null: everything) matches `obj`'s labels. A selector
/// that does not parse matches nothing (kube-apiserver's validation refuses it at creation).
fn selector_matches(selector: Option<&Value>, obj: &Value) -> bool {
    match selector {
        None | Some(Value::Null) => true,
        Some(sel) => LabelSelector::parse(&selector_string(sel)).is_ok_and(|s| s.matches(obj)),
    }
}

/// Whether `webhook` is called for `attrs`: a rule matches, the namespace's labels (for a
/// namespace, its own) match `namespaceSelector` (cluster-scoped objects always do), and the
/// new or the old object's labels match `objectSelector`.
///
/// `namespace` is the namespace the object lives in, as stored; `object` the new object, if
/// any.
pub(crate) fn should_call(
    webhook: &Value,
    attrs: &Attributes<'_>,
    namespace: Option<&Value>,
    object: Option<&Value>,
) -> bool {
    let rules = webhook.get("rules").and_then(Value::as_array);
    if !rules.is_some_and(|r| r.iter().any(|rule| rule_matches(rule, attrs))) {
        return false;
    }
    let ns_selector = webhook.get("namespaceSelector");
    let ns_ok = if attrs.info.group.is_empty() && attrs.info.plural == "namespaces" {
        // A namespace is matched by its own labels (the old object's on a delete).
        match object.or(attrs.old) {
            Some(o) => selector_matches(ns_selector, o),
            None => true,
        }
    } else if !attrs.info.namespaced {
        true
    } else {
        let empty = serde_json::json!({});
        selector_matches(ns_selector, namespace.unwrap_or(&empty))
    };
    if !ns_ok {
        return false;
    }
    let obj_selector = webhook.get("objectSelector");
    let candidates: Vec<&Value> = object.into_iter().chain(attrs.old).collect();
    if candidates.is_empty() {
        return selector_matches(obj_selector, &serde_json::json!({}));
    }
    candidates.iter().any(|o| selector_matches(obj_selector, o))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Operation;
    use crate::resources::Registry;
    use serde_json::json;

    fn attrs<'a>(
        info: &'a crate::resources::ResourceInfo,
        sub: Option<&'a str>,
        op: Operation,
        old: Option<&'a Value>,
    ) -> Attributes<'a> {
        Attributes {
            info,
            subresource: sub,
            namespace: "default",
            name: "x",
            operation: op,
            old,
            dry_run: false,
            options: Value::Null,
        }
    }

    fn hook(resources: &[&str], ops: &[&str]) -> Value {
        json!({"rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": resources, "operations": ops}]})
    }

    #[test]
    fn resources_and_subresources_match_as_kube_apiserver_does() {
        let registry = Registry::new();
        let deploy = registry.get("apps", "v1", "deployments").unwrap();
        let obj = json!({"metadata": {}});
        let cases: &[(&[&str], Option<&str>, bool)] = &[
            (&["*"], None, true),
            (&["*"], Some("status"), false),
            (&["*/*"], None, true),
            (&["*/*"], Some("status"), true),
            (&["deployments"], None, true),
            (&["deployments"], Some("status"), false),
            (&["deployments/status"], Some("status"), true),
            (&["deployments/status"], None, false),
            (&["deployments/*"], Some("scale"), true),
            (&["deployments/*"], None, true),
            (&["*/scale"], Some("scale"), true),
            (&["*/scale"], Some("status"), false),
            (&["pods"], None, false),
        ];
        for (resources, sub, want) in cases {
            let a = attrs(&deploy, *sub, Operation::Create, None);
            assert_eq!(
                should_call(&hook(resources, &["*"]), &a, Some(&obj), Some(&obj)),
                *want,
                "{resources:?} {sub:?}"
            );
        }
        for op in [Operation::Create, Operation::Update, Operation::Delete] {
            let a = attrs(&deploy, None, op, None);
            assert_eq!(
                should_call(&hook(&["*"], &["UPDATE"]), &a, Some(&obj), Some(&obj)),
                op == Operation::Update
            );
        }
    }

    #[test]
    fn selectors_see_the_namespace_and_the_old_or_new_object() {
        let registry = Registry::new();
        let cm = registry.get("", "v1", "configmaps").unwrap();
        let ns = registry.get("", "v1", "namespaces").unwrap();
        let mut h = hook(&["*"], &["*"]);
        h["namespaceSelector"] = json!({"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]});
        let plain = json!({"metadata": {"name": "default"}});
        let skipped = json!({"metadata": {"name": "default", "labels": {"skip": "yes"}}});
        let obj = json!({"metadata": {"name": "x"}});
        let a = attrs(&cm, None, Operation::Create, None);
        assert!(should_call(&h, &a, Some(&plain), Some(&obj)));
        assert!(!should_call(&h, &a, Some(&skipped), Some(&obj)));
        let a = attrs(&ns, None, Operation::Create, None);
        assert!(
            !should_call(&h, &a, None, Some(&skipped)),
            "a namespace by its own labels"
        );
        let mut h = hook(&["*"], &["*"]);
        h["objectSelector"] = json!({"matchLabels": {"hooked": "true"}});
        let labelled = json!({"metadata": {"labels": {"hooked": "true"}}});
        let a = attrs(&cm, None, Operation::Update, Some(&labelled));
        assert!(should_call(&h, &a, Some(&plain), Some(&obj)), "the old object matches");
        let a = attrs(&cm, None, Operation::Update, Some(&obj));
        assert!(!should_call(&h, &a, Some(&plain), Some(&obj)));
        let a = attrs(&cm, None, Operation::Delete, Some(&labelled));
        assert!(should_call(&h, &a, Some(&plain), None));
    }
}
