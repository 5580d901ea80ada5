//! Field errors: what failed validation, where, and how kube-apiserver words it.
//!
//! apimachinery's `util/validation/field` in Rust. A [`FieldError`] renders as
//! `<field>: <type>[: <value>][: <detail>]` (`metadata.name: Invalid value: "Foo": a lowercase
//! RFC 1123 subdomain must …`), and a list of them becomes one `422 Invalid` [`ApiError`] whose
//! `details.causes` carry each error's reason (`FieldValueInvalid`, `FieldValueRequired`, …), its
//! field path and its message without the path, as `NewInvalid` builds them. Clients branch on
//! those causes (kubectl prints the message; controllers read `causes[].field`), so the wording
//! and the reasons are kube-apiserver's.

use crate::status::ApiError;
use serde_json::{Value, json};

/// The kind of a [`FieldError`] (apimachinery's `field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorType {
    /// A required value is missing.
    Required,
    /// A value is malformed or out of range.
    Invalid,
    /// A value of the wrong JSON type (a CRD schema's `type`).
    TypeInvalid,
    /// A value outside an enumeration.
    NotSupported,
    /// A string or map over its size limit.
    TooLong,
    /// A list with more items than allowed.
    TooMany,
    /// A change the rules forbid (no new finalizers on an object being deleted, …).
    Forbidden,
    /// A value that must be unique is repeated (a CEL rule's `FieldValueDuplicate` reason).
    Duplicate,
}

impl ErrorType {
    /// The text that opens the error body (`Invalid value`, `Required value`, …).
    fn text(self) -> &'static str {
        match self {
            ErrorType::Required => "Required value",
            ErrorType::Invalid | ErrorType::TypeInvalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::Duplicate => "Duplicate value",
        }
    }

    /// The `StatusCause.reason` (`metav1.CauseType`).
    fn reason(self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::TypeInvalid => "FieldValueTypeInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::Duplicate => "FieldValueDuplicate",
        }
    }

    /// Whether the body shows the bad value (Go leaves it out for Required, Forbidden, TooLong
    /// and Internal).
    fn shows_value(self) -> bool {
        !matches!(self, ErrorType::Required | ErrorType::TooLong | ErrorType::Forbidden)
    }
}

/// One validation failure at a field path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FieldError {
    /// What kind of failure.
    pub(crate) ty: ErrorType,
    /// The field path, dotted with `[i]` and `[key]` (`spec.template.spec.containers[0].image`).
    pub(crate) field: String,
    /// The offending value (shown for the types that show one).
    pub(crate) value: Value,
    /// Why, in kube-apiserver's words; may be empty.
    pub(crate) detail: String,
}

impl FieldError {
    fn new(ty: ErrorType, field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        FieldError {
            ty,
            field: field.into(),
            value,
            detail: detail.into(),
        }
    }

    /// `field.Required`.
    pub(crate) fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Required, field, Value::Null, detail)
    }

    /// `field.Invalid`.
    pub(crate) fn invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Invalid, field, value, detail)
    }

    /// `field.TypeInvalid` (a schema `type` mismatch).
    pub(crate) fn type_invalid(field: impl Into<String>, value: Value, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::TypeInvalid, field, value, detail)
    }

    /// `field.NotSupported`, listing the allowed values.
    pub(crate) fn not_supported(field: impl Into<String>, value: Value, allowed: &[Value]) -> Self {
        let list: Vec<String> = allowed.iter().map(go_value).collect();
        Self::new(
            ErrorType::NotSupported,
            field,
            value,
            format!("supported values: {}", list.join(", ")),
        )
    }

    /// `field.TooLong`: "may not be more than `max` bytes".
    pub(crate) fn too_long(field: impl Into<String>, max: usize) -> Self {
        Self::new(
            ErrorType::TooLong,
            field,
            Value::Null,
            format!("may not be more than {max} bytes"),
        )
    }

    /// `field.Forbidden`.
    pub(crate) fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ErrorType::Forbidden, field, Value::Null, detail)
    }

    /// `field.Duplicate`: the value, no detail.
    pub(crate) fn duplicate(field: impl Into<String>, value: Value) -> Self {
        Self::new(ErrorType::Duplicate, field, value, "")
    }

    /// `field.TooMany`: "must have at most `max` items".
    pub(crate) fn too_many(field: impl Into<String>, actual: usize, max: u64) -> Self {
        Self::new(
            ErrorType::TooMany,
            field,
            json!(actual),
            format!("must have at most {max} items"),
        )
    }

    /// The error without its field path (`ErrorBody`): what a `StatusCause` message holds.
    pub(crate) fn body(&self) -> String {
        let mut s = self.ty.text().to_owned();
        if self.ty.shows_value() {
            s.push_str(": ");
            s.push_str(&go_value(&self.value));
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// A value as Go's `%q`/`%v` print it in field errors: strings quoted, numbers and booleans
/// bare, `null` for nil; objects and arrays as compact JSON (Go prints its own struct syntax
/// there, which a JSON server cannot reproduce).
pub(crate) fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => Value::String(s.clone()).to_string(),
        other => other.to_string(),
    }
}

/// Appends `child` to a field path: `spec` + `replicas` = `spec.replicas`.
pub(crate) fn join(path: &str, child: &str) -> String {
    if path.is_empty() {
        child.to_owned()
    } else {
        format!("{path}.{child}")
    }
}

/// The `422 Invalid` for `errors` on object `name` of `kind` in `group`, as `NewInvalid` builds
/// it: message `Kind.group "name" is invalid: <error>` (several errors as `[e1, e2]`, repeated
/// texts once), `details.causes` one per error. `errors` must not be empty.
pub(crate) fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> ApiError {
    let qualified = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    let mut texts: Vec<String> = Vec::new();
    for e in errors {
        let t = e.to_string();
        if !texts.contains(&t) {
            texts.push(t);
        }
    }
    let message = match texts.as_slice() {
        [] => format!("{qualified} {} is invalid", go_value(&json!(name))),
        [one] => format!("{qualified} {} is invalid: {one}", go_value(&json!(name))),
        many => format!(
            "{qualified} {} is invalid: [{}]",
            go_value(&json!(name)),
            many.join(", ")
        ),
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| json!({"reason": e.ty.reason(), "message": e.body(), "field": e.field}))
        .collect();
    let mut details = json!({"name": name, "kind": kind, "causes": causes});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    ApiError::with_details(422, "Invalid", message, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_render_as_apimachinery_does() {
        let e = FieldError::invalid("metadata.name", json!("Foo"), "bad");
        assert_eq!(e.to_string(), r#"metadata.name: Invalid value: "Foo": bad"#);
        assert_eq!(
            FieldError::required("spec.foo", "").to_string(),
            "spec.foo: Required value"
        );
        assert_eq!(
            FieldError::too_long("metadata.annotations", 262144).to_string(),
            "metadata.annotations: Too long: may not be more than 262144 bytes"
        );
        assert_eq!(
            FieldError::too_many("spec.items", 4, 3).to_string(),
            "spec.items: Too many: 4: must have at most 3 items"
        );
        assert_eq!(
            FieldError::not_supported("spec.color", json!("x"), &[json!("a"), json!("b")]).to_string(),
            r#"spec.color: Unsupported value: "x": supported values: "a", "b""#
        );
        assert_eq!(
            FieldError::invalid("spec.replicas", json!(-1), "must be greater than or equal to 0").to_string(),
            "spec.replicas: Invalid value: -1: must be greater than or equal to 0"
        );
    }

    #[test]
    fn invalid_status_names_the_kind_group_and_causes() {
        let errs = [
            FieldError::invalid("metadata.name", json!("A"), "x"),
            FieldError::required("spec.selector", ""),
        ];
        let e = invalid("apps", "Deployment", "A", &errs);
        assert_eq!(e.code, 422);
        assert_eq!(e.reason, "Invalid");
        assert_eq!(
            e.message,
            r#"Deployment.apps "A" is invalid: [metadata.name: Invalid value: "A": x, spec.selector: Required value]"#
        );
        let d = e.details.unwrap();
        assert_eq!(d["group"], "apps");
        assert_eq!(d["causes"][1]["reason"], "FieldValueRequired");
        assert_eq!(d["causes"][0]["message"], r#"Invalid value: "A": x"#);
        assert_eq!(d["causes"][0]["field"], "metadata.name");
        let core = invalid("", "ConfigMap", "c", &errs[..1]);
        assert!(core.message.starts_with(r#"ConfigMap "c" is invalid: metadata.name"#));
        assert!(core.details.unwrap().get("group").is_none());
    }
}
