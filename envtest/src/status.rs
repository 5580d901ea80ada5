//! `Status` objects: how the API server reports failures (and some successes).
//!
//! Every error envtest returns is a `meta/v1 Status` with the HTTP code, `reason` and `details`
//! kube-apiserver would use, because clients branch on them: kube-runtime relists on a `410`
//! `Expired`, client-go retries `429` after `Retry-After`, `kubectl` prints `message`.
//! See <https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions>.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

/// An API error: rendered as a `Status` object with `code` as the HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (`404`, `409`, ...).
    pub code: u16,
    /// Machine-readable `StatusReason` (`NotFound`, `AlreadyExists`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details` (name, group, kind, retryAfterSeconds), if any.
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429/503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// `404 NotFound` for a named object.
    pub fn not_found(resource: &str, name: &str) -> Self {
        let mut e = Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"));
        e.details = Some(json!({"name": name, "kind": resource}));
        e
    }

    /// `404 NotFound` for a path the server does not serve.
    pub fn no_route() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource")
    }

    /// `409 AlreadyExists`.
    pub fn already_exists(resource: &str, name: &str) -> Self {
        let mut e = Self::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists"));
        e.details = Some(json!({"name": name, "kind": resource}));
        e
    }

    /// `409 Conflict` (stale resourceVersion, failed precondition).
    pub fn conflict(resource: &str, name: &str, why: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"),
        );
        e.details = Some(json!({"name": name, "kind": resource}));
        e
    }

    /// An error with `details` already built (`field::invalid` builds the causes of a 422).
    pub(crate) fn with_details(code: u16, reason: &'static str, message: String, details: Value) -> Self {
        let mut e = Self::new(code, reason, message);
        e.details = Some(details);
        e
    }

    /// `400 BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// `422 Invalid` (a field failed validation).
    pub fn invalid(kind: &str, name: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        let mut e = Self::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {message}"));
        e.details = Some(json!({"name": name, "kind": kind}));
        e
    }

    /// `410 Expired`: a resourceVersion or continue token older than the watch cache window.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// `405 MethodNotAllowed`.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// `415 UnsupportedMediaType`.
    pub fn unsupported_media_type(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {ct:?})"
            ),
        )
    }

    /// `406 NotAcceptable`: no representation the `Accept` header allows.
    pub fn not_acceptable(accept: &str) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf (asked for {accept:?})"
            ),
        )
    }

    /// `413 RequestEntityTooLarge`.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// `401 Unauthorized`.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// `403 Forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// `504 Timeout` (e.g. "Too large resource version").
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// What kube-apiserver answers a list or watch at a resourceVersion it has not reached
    /// after waiting for it: `504 Timeout`, "Timeout: Too large resource version: N, current:
    /// M", the `ResourceVersionTooLarge` cause, and a retry after one second (client-go's
    /// reflector then relists from the latest state).
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        );
        e.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }));
        e.retry_after = Some(1);
        e
    }

    /// An injected server-side failure: 500, 503 or 429 (with `Retry-After`).
    pub fn injected(code: u16, retry_after: u32) -> Self {
        let (reason, message) = match code {
            429 => ("TooManyRequests", "injected: too many requests, please try again later"),
            503 => (
                "ServiceUnavailable",
                "injected: the server is currently unable to handle the request",
            ),
            410 => ("Expired", "injected: too old resource version"),
            _ => (
                "InternalError",
                "injected: an error on the server has prevented the request from succeeding",
            ),
        };
        let mut e = Self::new(code, reason, message);
        if matches!(code, 429 | 503) {
            e.retry_after = Some(retry_after);
            e.details = Some(json!({"retryAfterSeconds": retry_after}));
        }
        e
    }

    /// `500 InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(details), Some(map)) = (&self.details, s.as_object_mut()) {
            map.insert("details".into(), details.clone());
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = json_response(code, &self.to_status());
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// A `Status` with `status: Success` (returned by a delete that removed the object at once).
pub(crate) fn success(kind: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "kind": kind, "uid": uid},
    })
}

/// A JSON response, its top-level fields in the API server's order (see [`ApiServerOrder`]).
pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    let bytes = match body {
        Value::Object(map) => serde_json::to_vec(&ApiServerOrder(map)),
        other => serde_json::to_vec(other),
    }
    .unwrap_or_default();
    (
        code,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        bytes,
    )
        .into_response()
}

/// A top-level object written as kube-apiserver writes it (Go struct order): `kind`,
/// `apiVersion`, `metadata`, then the rest (`items` of a list, `spec`, `status`, ...). envtest
/// stores objects as `serde_json::Value`, whose maps are sorted, which would put a list's
/// `items` before its `metadata`; clients may rely on the server's order (kinformer reads a
/// page's `continue` token from the bytes in front of its items to request the next page early).
struct ApiServerOrder<'a>(&'a serde_json::Map<String, Value>);

/// The fields [`ApiServerOrder`] writes first, in this order.
const LEADING_FIELDS: [&str; 3] = ["kind", "apiVersion", "metadata"];

impl serde::Serialize for ApiServerOrder<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for field in LEADING_FIELDS {
            if let Some(value) = self.0.get(field) {
                map.serialize_entry(field, value)?;
            }
        }
        for (field, value) in self.0 {
            if !LEADING_FIELDS.contains(&field.as_str()) {
                map.serialize_entry(field, value)?;
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_written_kind_api_version_metadata_then_items() {
        let list = json!({"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "c"}, "kind": "ConfigMapList", "apiVersion": "v1"});
        let Value::Object(map) = &list else { unreachable!() };
        let text = serde_json::to_string(&ApiServerOrder(map)).unwrap();
        assert_eq!(
            text,
            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"continue":"c"},"items":[{"metadata":{"name":"a"}}]}"#
        );
        let object = json!({"status": {}, "spec": {}, "metadata": {}, "apiVersion": "v1", "kind": "Pod"});
        let Value::Object(map) = &object else { unreachable!() };
        let text = serde_json::to_string(&ApiServerOrder(map)).unwrap();
        assert_eq!(
            text,
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{},"spec":{},"status":{}}"#
        );
    }
}
