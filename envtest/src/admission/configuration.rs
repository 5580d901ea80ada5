//! kube-apiserver's validation of `ValidatingWebhookConfiguration` and
//! `MutatingWebhookConfiguration` (admissionregistration/v1), run with the other object
//! validation before a configuration is stored: the field paths and texts of its 422.
//!
//! Checked: webhook names (required, a DNS subdomain of at least three segments, unique in
//! the configuration), `clientConfig` (exactly one of `url` or `service`; an `https` URL with a
//! host, no query, fragment or user; a service's namespace and name), `sideEffects` (required,
//! `None` or `NoneOnDryRun`), `admissionReviewVersions` (required, one of `v1`/`v1beta1`, no
//! duplicates), `failurePolicy`, `matchPolicy`, `reinvocationPolicy`, `timeoutSeconds` (1..=30),
//! each rule's operations, resources and scope, and `matchConditions` (at most 64; names
//! required, qualified names, unique; expressions required and compiled with the variables
//! `object`, `oldObject` and `request`: `compilation failed: ...` at
//! `webhooks[i].matchConditions[j].expression`). Not checked: the label selectors' syntax.

use crate::field::FieldError;
use crate::resources::ResourceInfo;
use serde_json::{Value, json};

/// Validates a webhook configuration; nothing for other kinds.
pub(crate) fn validate(info: &ResourceInfo, obj: &Value) -> Vec<FieldError> {
    let mutating = match (info.group.as_str(), info.kind.as_str()) {
        (super::GROUP, "MutatingWebhookConfiguration") => true,
        (super::GROUP, "ValidatingWebhookConfiguration") => false,
        _ => return Vec::new(),
    };
    let mut errs = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (i, hook) in obj
        .get("webhooks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("webhooks[{i}]");
        let name = hook.get("name").and_then(Value::as_str).unwrap_or("");
        errs.extend(fully_qualified(&format!("{path}.name"), name));
        if !name.is_empty() {
            if names.contains(&name) {
                errs.push(FieldError::duplicate(format!("{path}.name"), json!(name)));
            }
            names.push(name);
        }
        webhook(hook, &path, mutating, &mut errs);
    }
    errs
}

/// kube-apiserver's defaults for a webhook configuration (`SetDefaults_ValidatingWebhook`,
/// `SetDefaults_MutatingWebhook`, `SetDefaults_Rule`, `SetDefaults_ServiceReference`): what a
/// client reads back and what the chain calls with.
pub(crate) fn default(kind: &str, obj: &mut Value) {
    let set = |m: &mut serde_json::Map<String, Value>, k: &str, v: Value| {
        if m.get(k).is_none_or(Value::is_null) {
            m.insert(k.to_owned(), v);
        }
    };
    let Some(hooks) = obj.get_mut("webhooks").and_then(Value::as_array_mut) else {
        return;
    };
    for hook in hooks.iter_mut().filter_map(Value::as_object_mut) {
        set(hook, "failurePolicy", json!("Fail"));
        set(hook, "matchPolicy", json!("Equivalent"));
        set(hook, "namespaceSelector", json!({}));
        set(hook, "objectSelector", json!({}));
        set(hook, "timeoutSeconds", json!(10));
        if kind == "MutatingWebhookConfiguration" {
            set(hook, "reinvocationPolicy", json!("Never"));
        }
        if let Some(rules) = hook.get_mut("rules").and_then(Value::as_array_mut) {
            for rule in rules.iter_mut().filter_map(Value::as_object_mut) {
                set(rule, "scope", json!("*"));
            }
        }
        if let Some(service) = hook
            .get_mut("clientConfig")
            .and_then(|c| c.get_mut("service"))
            .and_then(Value::as_object_mut)
        {
            set(service, "port", json!(443));
        }
    }
}

/// `IsFullyQualifiedName`.
fn fully_qualified(path: &str, name: &str) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(path, "")];
    }
    let errs = crate::validation::dns1123_subdomain(name);
    if !errs.is_empty() {
        return vec![FieldError::invalid(path, json!(name), errs.join(","))];
    }
    if name.split('.').count() < 3 {
        return vec![FieldError::invalid(
            path,
            json!(name),
            "should be a domain with at least three segments separated by dots",
        )];
    }
    Vec::new()
}

/// A string field checked against its allowed values (absent: fine, it is defaulted).
fn one_of(hook: &Value, path: &str, field: &str, allowed: &[&str], errs: &mut Vec<FieldError>) {
    if let Some(v) = hook.get(field).filter(|v| !v.is_null())
        && !v.as_str().is_some_and(|s| allowed.contains(&s))
    {
        let allowed: Vec<Value> = allowed.iter().map(|s| json!(s)).collect();
        errs.push(FieldError::not_supported(
            format!("{path}.{field}"),
            v.clone(),
            &allowed,
        ));
    }
}

/// The checks of one webhook other than its name.
fn webhook(hook: &Value, path: &str, mutating: bool, errs: &mut Vec<FieldError>) {
    client_config(
        hook.get("clientConfig").unwrap_or(&Value::Null),
        &format!("{path}.clientConfig"),
        errs,
    );
    match hook.get("sideEffects").filter(|v| !v.is_null()) {
        None => errs.push(FieldError::required(
            format!("{path}.sideEffects"),
            "must specify one of None, NoneOnDryRun",
        )),
        Some(_) => one_of(hook, path, "sideEffects", &["None", "NoneOnDryRun"], errs),
    }
    let versions: Vec<&Value> = hook
        .get("admissionReviewVersions")
        .and_then(Value::as_array)
        .map(|v| v.iter().collect())
        .unwrap_or_default();
    let versions_path = format!("{path}.admissionReviewVersions");
    if versions.is_empty() {
        errs.push(FieldError::required(&versions_path, "must specify one of v1, v1beta1"));
    } else {
        let mut seen: Vec<&str> = Vec::new();
        for (j, v) in versions.iter().enumerate() {
            let s = v.as_str().unwrap_or("");
            let label = crate::validation::dns1035_label(s);
            if !label.is_empty() {
                errs.push(FieldError::invalid(
                    format!("{versions_path}[{j}]"),
                    json!(s),
                    label.join(","),
                ));
            } else if seen.contains(&s) {
                errs.push(FieldError::invalid(
                    format!("{versions_path}[{j}]"),
                    json!(s),
                    "duplicate version",
                ));
            }
            seen.push(s);
        }
        if !seen.iter().any(|s| super::review::VERSIONS.contains(s)) {
            errs.push(FieldError::invalid(
                &versions_path,
                json!(seen),
                "must include at least one of v1, v1beta1",
            ));
        }
    }
    one_of(hook, path, "failurePolicy", &["Fail", "Ignore"], errs);
    one_of(hook, path, "matchPolicy", &["Equivalent", "Exact"], errs);
    if mutating {
        one_of(hook, path, "reinvocationPolicy", &["IfNeeded", "Never"], errs);
    }
    if let Some(t) = hook.get("timeoutSeconds").filter(|v| !v.is_null())
        && !t.as_i64().is_some_and(|t| (1..=30).contains(&t))
    {
        errs.push(FieldError::invalid(
            format!("{path}.timeoutSeconds"),
            t.clone(),
            "the timeout value must be between 1 and 30 seconds",
        ));
    }
    match_conditions(hook, &format!("{path}.matchConditions"), errs);
    for (j, rule) in hook
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        rule_errors(rule, &format!("{path}.rules[{j}]"), errs);
    }
}

/// The most `matchConditions` a webhook may have.
const MAX_MATCH_CONDITIONS: usize = 64;

/// `matchConditions`, as kube-apiserver's `validateMatchConditions`.
fn match_conditions(hook: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let conditions = hook
        .get("matchConditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if conditions.len() > MAX_MATCH_CONDITIONS {
        errs.push(FieldError::too_many(
            path,
            conditions.len(),
            MAX_MATCH_CONDITIONS as u64,
        ));
    }
    let mut names: Vec<&str> = Vec::new();
    for (j, condition) in conditions.iter().enumerate() {
        let at = format!("{path}[{j}]");
        let expression = condition.get("expression").and_then(Value::as_str).unwrap_or("");
        if expression.trim().is_empty() {
            errs.push(FieldError::required(format!("{at}.expression"), ""));
        } else if let Err(e) =
            crate::cel::check_admission_expression(expression.trim(), super::matching::CONDITION_VARIABLES)
        {
            errs.push(FieldError::invalid(
                format!("{at}.expression"),
                json!(expression.trim()),
                format!("compilation failed: {e}"),
            ));
        }
        let name = condition.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() {
            errs.push(FieldError::required(format!("{at}.name"), ""));
        } else {
            for e in crate::validation::qualified_name(name) {
                errs.push(FieldError::invalid(format!("{at}.name"), json!(name), e));
            }
            if names.contains(&name) {
                errs.push(FieldError::duplicate(format!("{at}.name"), json!(name)));
            }
            names.push(name);
        }
    }
}

/// `clientConfig`: exactly one of `url` and `service`, each well formed.
fn client_config(config: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let url = config.get("url").filter(|v| !v.is_null());
    let service = config.get("service").filter(|v| !v.is_null());
    match (url, service) {
        (Some(url), None) => {
            let s = url.as_str().unwrap_or("");
            let url_path = format!("{path}.url");
            let invalid = |why: &str| FieldError::invalid(&url_path, json!(s), why);
            match s.parse::<http::Uri>() {
                Err(e) => errs.push(invalid(&e.to_string())),
                Ok(u) if u.host().is_none_or(str::is_empty) => errs.push(invalid("host must be specified")),
                Ok(u) if u.scheme_str() != Some("https") => {
                    errs.push(invalid("'https' is the only allowed URL scheme"))
                }
                Ok(u) if u.query().is_some() => errs.push(invalid("query parameters are not permitted")),
                Ok(u) if u.authority().is_some_and(|a| a.as_str().contains('@')) => {
                    errs.push(invalid("user information is not permitted in the URL"))
                }
                Ok(_) if s.contains('#') => errs.push(invalid("fragments are not permitted")),
                Ok(_) => {}
            }
        }
        (None, Some(service)) => {
            for field in ["namespace", "name"] {
                if service.get(field).and_then(Value::as_str).unwrap_or("").is_empty() {
                    errs.push(FieldError::required(
                        format!("{path}.service.{field}"),
                        format!("service {field} is required"),
                    ));
                }
            }
            if let Some(p) = service.get("port").and_then(Value::as_i64)
                && !(1..=65535).contains(&p)
            {
                errs.push(FieldError::invalid(
                    format!("{path}.service.port"),
                    json!(p),
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
        }
        _ => errs.push(FieldError::required(path, "exactly one of url or service is required")),
    }
}

/// One `RuleWithOperations`.
fn rule_errors(rule: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let list = |field: &str| -> Vec<&str> {
        rule.get(field)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let ops = list("operations");
    if ops.is_empty() {
        errs.push(FieldError::required(format!("{path}.operations"), ""));
    }
    let allowed = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
    for (k, op) in ops.iter().enumerate() {
        if !allowed.contains(op) {
            let allowed: Vec<Value> = allowed.iter().map(|s| json!(s)).collect();
            errs.push(FieldError::not_supported(
                format!("{path}.operations[{k}]"),
                json!(op),
                &allowed,
            ));
        }
    }
    if ops.len() > 1 && ops.contains(&"*") {
        errs.push(FieldError::invalid(
            format!("{path}.operations"),
            json!(ops),
            "if '*' is present, must not specify other operations",
        ));
    }
    for field in ["apiGroups", "apiVersions"] {
        if list(field).is_empty() {
            errs.push(FieldError::required(format!("{path}.{field}"), ""));
        }
    }
    let resources = list("resources");
    if resources.is_empty() {
        errs.push(FieldError::required(format!("{path}.resources"), ""));
    }
    if resources.contains(&"*/*") && resources.len() > 1 {
        errs.push(FieldError::invalid(
            format!("{path}.resources"),
            json!(resources),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if resources.contains(&"*") && resources.iter().any(|r| *r != "*" && !r.contains('/')) {
        errs.push(FieldError::invalid(
            format!("{path}.resources"),
            json!(resources),
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
    if let Some(scope) = rule.get("scope").filter(|v| !v.is_null())
        && !scope
            .as_str()
            .is_some_and(|s| ["*", "Cluster", "Namespaced"].contains(&s))
    {
        errs.push(FieldError::not_supported(
            format!("{path}.scope"),
            scope.clone(),
            &[json!("*"), json!("Cluster"), json!("Namespaced")],
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    fn valid_hook(name: &str) -> Value {
        json!({"name": name, "clientConfig": {"url": "https://127.0.0.1:9443/validate"},
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]})
    }

    fn errors(hooks: Value) -> Vec<String> {
        let info = Registry::new()
            .get(super::super::GROUP, "v1", "validatingwebhookconfigurations")
            .unwrap();
        validate(&info, &json!({"metadata": {"name": "c"}, "webhooks": hooks}))
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn webhook_configurations_are_validated_with_kube_apiservers_paths() {
        assert!(errors(json!([valid_hook("a.example.com")])).is_empty());
        assert_eq!(
            errors(json!([
                valid_hook("a.example.com"),
                valid_hook("example.com"),
                valid_hook("a.example.com")
            ])),
            [
                "webhooks[1].name: Invalid value: \"example.com\": should be a domain with at least three segments separated by dots",
                "webhooks[2].name: Duplicate value: \"a.example.com\"",
            ]
        );
        let mut h = valid_hook("a.example.com");
        h["clientConfig"]["service"] = json!({"namespace": "ns", "name": "svc"});
        h.as_object_mut().unwrap().remove("sideEffects");
        h["admissionReviewVersions"] = json!(["v2"]);
        assert_eq!(
            errors(json!([h])),
            [
                "webhooks[0].clientConfig: Required value: exactly one of url or service is required",
                "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun",
                "webhooks[0].admissionReviewVersions: Invalid value: [\"v2\"]: must include at least one of v1, v1beta1",
            ]
        );
        let mut h = valid_hook("a.example.com");
        h["sideEffects"] = json!("Unknown");
        h.as_object_mut().unwrap().remove("admissionReviewVersions");
        assert_eq!(
            errors(json!([h])),
            [
                "webhooks[0].sideEffects: Unsupported value: \"Unknown\": supported values: \"None\", \"NoneOnDryRun\"",
                "webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1",
            ]
        );
    }
}
