//! Whether a webhook is called for a request: kube-apiserver's `ShouldCallHook` (rules,
//! `matchPolicy`, `namespaceSelector`, `objectSelector`, then `matchConditions`), over a webhook
//! as its configuration's JSON.
//!
//! Rules are matched against the request's resource first. When none matches and the webhook's
//! `matchPolicy` is `Equivalent` (the default), they are matched against each equivalent
//! resource — the same group and resource served in another version: every other served
//! version of a CRD; envtest serves each built-in resource in one version, so a built-in has
//! none — and the first rule (in order) that matches one picks the version the webhook is
//! called in (`mod.rs` converts the objects to it).
//!
//! `matchConditions` are evaluated last, on the objects in the version the webhook is called
//! in, as kube-apiserver's `matchconditions` matcher: any condition `false` skips the webhook
//! (even if another failed to evaluate); otherwise an evaluation error skips it under
//! `failurePolicy: Ignore` and fails the request with `403` under `Fail`.

use super::Attributes;
use crate::resources::ResourceInfo;
use crate::scale::selector_string;
use crate::selectors::LabelSelector;
use serde_json::{Value, json};

/// The strings of a list field (absent: empty).
fn strings<'a>(v: &'a Value, field: &str) -> impl Iterator<Item = &'a str> {
    v.get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// Whether one `RuleWithOperations` matches `attrs` with its resource taken as `info`.
fn rule_matches(rule: &Value, attrs: &Attributes<'_>, info: &ResourceInfo) -> bool {
    let op = attrs.operation.as_str();
    let any_of = |field: &str, want: &str| strings(rule, field).any(|s| s == "*" || s == want);
    if !any_of("operations", op) || !any_of("apiGroups", &info.group) || !any_of("apiVersions", &info.version) {
        return false;
    }
    let (resource, sub) = (info.plural.as_str(), attrs.subresource.unwrap_or(""));
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
        "Cluster" => !info.namespaced,
        "Namespaced" => info.namespaced,
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

/// Which resource a webhook's rules matched a request as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Matched<'a> {
    /// The request's own resource and version.
    AsRequested,
    /// An equivalent resource (another served version of it), matched under
    /// `matchPolicy: Equivalent`: the webhook is called in that version.
    Equivalent(&'a ResourceInfo),
}

/// The rule match of `webhook` for `attrs`: the request's resource, else (under
/// `matchPolicy: Equivalent`) the first equivalent resource an earlier rule matches.
fn rules_match<'e>(
    webhook: &Value,
    attrs: &Attributes<'_>,
    equivalents: &'e [std::sync::Arc<ResourceInfo>],
) -> Option<Matched<'e>> {
    let rules = webhook.get("rules").and_then(Value::as_array)?;
    if rules.iter().any(|rule| rule_matches(rule, attrs, attrs.info)) {
        return Some(Matched::AsRequested);
    }
    if webhook.get("matchPolicy").and_then(Value::as_str) != Some("Equivalent") {
        return None;
    }
    rules.iter().find_map(|rule| {
        equivalents
            .iter()
            .filter(|e| e.version != attrs.info.version)
            .find(|e| rule_matches(rule, attrs, e))
            .map(|e| Matched::Equivalent(e))
    })
}

/// Whether `webhook` is called for `attrs`, and in which resource: a rule matches (the
/// request's resource, or under `matchPolicy: Equivalent` one of `equivalents`), the
/// namespace's labels (for a namespace, its own) match `namespaceSelector` (cluster-scoped
/// objects always do), and the new or the old object's labels match `objectSelector`.
/// `matchConditions` are not evaluated here (see [`conditions_match`]): they see the objects
/// in the version matched.
///
/// `namespace` is the namespace the object lives in, as stored; `object` the new object, if
/// any.
pub(crate) fn should_call<'e>(
    webhook: &Value,
    attrs: &Attributes<'_>,
    namespace: Option<&Value>,
    object: Option<&Value>,
    equivalents: &'e [std::sync::Arc<ResourceInfo>],
) -> Option<Matched<'e>> {
    let matched = rules_match(webhook, attrs, equivalents)?;
    if !selectors_match(webhook, attrs, namespace, object) {
        return None;
    }
    Some(matched)
}

/// Whether the namespace and object selectors of `webhook` match.
fn selectors_match(webhook: &Value, attrs: &Attributes<'_>, namespace: Option<&Value>, object: Option<&Value>) -> bool {
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

/// The variables a match condition may name (kube-apiserver's also `authorizer`, which envtest,
/// having no authorizer, does not declare).
pub(crate) const CONDITION_VARIABLES: &[&str] = &["object", "oldObject", "request"];

/// What a webhook's `matchConditions` decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Conditions {
    /// All true (or none): call the webhook.
    Call,
    /// One is false, or one failed under `failurePolicy: Ignore`: skip the webhook.
    Skip,
    /// One failed to evaluate under `failurePolicy: Fail`: the errors, as kube-apiserver
    /// aggregates them (one alone, or `[e1, e2]`).
    Failed(String),
}

/// Evaluates `webhook`'s `matchConditions` with `object`, `oldObject` (`null` when absent) and
/// `request` (the `AdmissionReview`'s request the webhook would get).
pub(crate) fn conditions_match(
    webhook: &Value,
    object: Option<&Value>,
    old: Option<&Value>,
    request: &Value,
) -> Conditions {
    let Some(conditions) = webhook.get("matchConditions").and_then(Value::as_array) else {
        return Conditions::Call;
    };
    let null = Value::Null;
    let variables = [
        ("object", object.unwrap_or(&null)),
        ("oldObject", old.unwrap_or(&null)),
        ("request", request),
    ];
    let mut errors = Vec::new();
    for condition in conditions {
        let expression = condition.get("expression").and_then(Value::as_str).unwrap_or("").trim();
        match crate::cel::evaluate_admission_expression(expression, &variables) {
            Ok(true) => {}
            Ok(false) => return Conditions::Skip,
            Err(e) => errors.push(format!("expression '{expression}' resulted in error: {e}")),
        }
    }
    match errors.len() {
        0 => Conditions::Call,
        _ if webhook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore") => Conditions::Skip,
        1 => Conditions::Failed(errors.remove(0)),
        _ => Conditions::Failed(format!("[{}]", errors.join(", "))),
    }
}

/// The `request` a match condition sees: the review's request with every field of
/// `AdmissionRequest` present (zero values for the absent ones), as cel-go's typed request has
/// them.
pub(crate) fn condition_request(review_request: &Value) -> Value {
    let mut req = review_request.clone();
    if let Some(map) = req.as_object_mut() {
        for (field, zero) in [
            ("name", json!("")),
            ("namespace", json!("")),
            ("subResource", json!("")),
            ("requestSubResource", json!("")),
            ("dryRun", json!(false)),
        ] {
            map.entry(field).or_insert(zero);
        }
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Operation;
    use crate::resources::Registry;
    use std::sync::Arc;

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
                should_call(&hook(resources, &["*"]), &a, Some(&obj), Some(&obj), &[]).is_some(),
                *want,
                "{resources:?} {sub:?}"
            );
        }
        for op in [Operation::Create, Operation::Update, Operation::Delete] {
            let a = attrs(&deploy, None, op, None);
            assert_eq!(
                should_call(&hook(&["*"], &["UPDATE"]), &a, Some(&obj), Some(&obj), &[]).is_some(),
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
        assert!(should_call(&h, &a, Some(&plain), Some(&obj), &[]).is_some());
        assert!(should_call(&h, &a, Some(&skipped), Some(&obj), &[]).is_none());
        let a = attrs(&ns, None, Operation::Create, None);
        assert!(
            should_call(&h, &a, None, Some(&skipped), &[]).is_none(),
            "a namespace by its own labels"
        );
        let mut h = hook(&["*"], &["*"]);
        h["objectSelector"] = json!({"matchLabels": {"hooked": "true"}});
        let labelled = json!({"metadata": {"labels": {"hooked": "true"}}});
        let a = attrs(&cm, None, Operation::Update, Some(&labelled));
        assert!(
            should_call(&h, &a, Some(&plain), Some(&obj), &[]).is_some(),
            "the old object matches"
        );
        let a = attrs(&cm, None, Operation::Update, Some(&obj));
        assert!(should_call(&h, &a, Some(&plain), Some(&obj), &[]).is_none());
        let a = attrs(&cm, None, Operation::Delete, Some(&labelled));
        assert!(should_call(&h, &a, Some(&plain), None, &[]).is_some());
    }

    #[test]
    fn equivalent_versions_match_under_equivalent_only_in_rule_order() {
        let mut v1 = crate::resources::Registry::new().get("", "v1", "configmaps").unwrap();
        Arc::make_mut(&mut v1).group = "example.com".into();
        let alpha = Arc::new(ResourceInfo {
            version: "v1alpha1".into(),
            ..(*v1).clone()
        });
        let beta = Arc::new(ResourceInfo {
            version: "v1beta1".into(),
            ..(*v1).clone()
        });
        let rule = |version: &str| json!({"apiGroups": ["example.com"], "apiVersions": [version], "resources": ["configmaps"], "operations": ["*"]});
        let mut h = json!({"rules": [rule("v1beta1"), rule("v1alpha1")], "matchPolicy": "Equivalent"});
        let obj = json!({"metadata": {}});
        let a = attrs(&v1, None, Operation::Create, None);
        let equivalents = [alpha.clone(), beta.clone()];
        assert_eq!(
            should_call(&h, &a, Some(&obj), Some(&obj), &equivalents),
            Some(Matched::Equivalent(&beta)),
            "the first rule that matches an equivalent picks it"
        );
        h["matchPolicy"] = json!("Exact");
        assert_eq!(should_call(&h, &a, Some(&obj), Some(&obj), &equivalents), None);
        h["rules"] = json!([rule("v1")]);
        assert_eq!(
            should_call(&h, &a, Some(&obj), Some(&obj), &equivalents),
            Some(Matched::AsRequested)
        );
    }

    #[test]
    fn a_false_condition_skips_whatever_the_errors_and_errors_follow_the_failure_policy() {
        let obj = json!({"metadata": {"name": "x"}});
        let request = condition_request(&json!({"operation": "CREATE"}));
        let with = |conditions: Value, policy: &str| json!({"failurePolicy": policy, "matchConditions": conditions});
        let broken = |name: &str| json!({"name": name, "expression": "object.nope == 1"});
        let false_one = json!({"name": "f", "expression": "request.operation == 'DELETE'"});
        let true_one = json!({"name": "t", "expression": "object.metadata.name == 'x' && oldObject == null && request.name == ''"});
        let run = |h: &Value| conditions_match(h, Some(&obj), None, &request);
        assert_eq!(run(&with(json!([true_one]), "Fail")), Conditions::Call);
        assert_eq!(run(&with(json!([broken("a"), false_one]), "Fail")), Conditions::Skip);
        assert_eq!(run(&with(json!([broken("a")]), "Ignore")), Conditions::Skip);
        assert_eq!(
            run(&with(json!([broken("a"), true_one, broken("b")]), "Fail")),
            Conditions::Failed(
                "[expression 'object.nope == 1' resulted in error: no such key: nope, expression 'object.nope == 1' resulted in error: no such key: nope]"
                    .into()
            )
        );
    }
}
