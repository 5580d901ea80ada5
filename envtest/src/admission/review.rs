//! `AdmissionReview`: the request envtest sends a webhook and the checks on its reply, as
//! kube-apiserver's `webhook/request` package builds and verifies them.

use super::Attributes;
use crate::resources::ResourceInfo;
use crate::status::ApiError;
use base64::Engine;
use serde_json::{Value, json};

/// The `AdmissionReview` versions envtest speaks, in kube-apiserver's order of preference; a
/// webhook gets the first of its `admissionReviewVersions` listed here.
pub(crate) const VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// The `AdmissionReview` request for `attrs` with `object` (the new object; none on delete)
/// and `old`, sent to a webhook whose rules matched the request as `matched` (`kind` and
/// `resource` are `matched`'s; `requestKind` and `requestResource` the request's own).
pub(crate) fn request(
    version: &str,
    uid: &str,
    attrs: &Attributes<'_>,
    matched: &ResourceInfo,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Value {
    let kind_and_resource = |info: &ResourceInfo| {
        let kind = if attrs.subresource == Some("scale") {
            json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
        } else {
            json!({"group": info.group, "version": info.version, "kind": info.kind})
        };
        (
            kind,
            json!({"group": info.group, "version": info.version, "resource": info.plural}),
        )
    };
    let (kind, resource) = kind_and_resource(matched);
    let (request_kind, request_resource) = kind_and_resource(attrs.info);
    let mut req = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": request_kind,
        "requestResource": request_resource,
        "operation": attrs.operation.as_str(),
        "userInfo": {"username": super::USER, "groups": ["system:masters", "system:authenticated"]},
        "object": object.cloned().unwrap_or(Value::Null),
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": attrs.dry_run,
        "options": attrs.options,
    });
    if let Some(sub) = attrs.subresource {
        req["subResource"] = json!(sub);
        req["requestSubResource"] = json!(sub);
    }
    if !attrs.name.is_empty() {
        req["name"] = json!(attrs.name);
    }
    if !attrs.namespace.is_empty() {
        req["namespace"] = json!(attrs.namespace);
    }
    json!({
        "apiVersion": format!("admission.k8s.io/{version}"),
        "kind": "AdmissionReview",
        "request": req,
    })
}

/// A webhook's verified answer.
#[derive(Debug)]
pub(crate) struct Reply {
    /// `response.allowed`.
    pub(crate) allowed: bool,
    /// `response.status`, for a denial.
    pub(crate) status: Option<Value>,
    /// `response.warnings`.
    pub(crate) warnings: Vec<String>,
    /// The decoded JSON patch of a mutating webhook, if any.
    pub(crate) patch: Option<json_patch::Patch>,
}

/// Checks a reply as kube-apiserver's `VerifyAdmissionResponse`. v1: the request's uid, the
/// review's version and kind, and for a mutating webhook a patch and a `patchType` together,
/// the type `JSONPatch`; a validating webhook may return neither. v1beta1 checks none of these
/// (its patch is taken as a JSON patch, a validating webhook's is ignored), as kube-apiserver
/// kept v1beta1's original, looser handling.
pub(crate) fn reply(version: &str, uid: &str, review: &Value, mutating: bool) -> Result<Reply, String> {
    let Some(response) = review.get("response").filter(|r| r.is_object()) else {
        return Err("webhook response was absent".into());
    };
    let patch = patch_bytes(response.get("patch").unwrap_or(&Value::Null))?;
    let patch_type = match response.get("patchType").unwrap_or(&Value::Null) {
        Value::Null => None,
        Value::String(t) => Some(t.as_str()),
        other => return Err(unmarshal_error(other, "patchType", "v1.PatchType")),
    };
    if version == "v1" {
        let got_uid = response.get("uid").and_then(Value::as_str).unwrap_or("");
        if got_uid != uid {
            return Err(format!("expected response.uid={uid:?}, got {got_uid:?}"));
        }
        let api_version = review.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = review.get("kind").and_then(Value::as_str).unwrap_or("");
        if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
            return Err(format!(
                "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {api_version}, Kind={kind}"
            ));
        }
        if mutating {
            match (&patch, patch_type) {
                (Some(_), None) => return Err("webhook returned response.patch but not response.patchType".into()),
                (None, Some(_)) => return Err("webhook returned response.patchType but not response.patch".into()),
                (_, Some("")) => return Err("webhook returned invalid response.patchType of \"\"".into()),
                (_, Some(t)) if t != "JSONPatch" => return Err(format!("unsupported patch type {t:?}")),
                _ => {}
            }
        } else if patch.is_some() {
            return Err("validating webhook may not return response.patch".into());
        } else if patch_type.is_some() {
            return Err("validating webhook may not return response.patchType".into());
        }
    }
    let allowed = response.get("allowed").and_then(Value::as_bool).unwrap_or(false);
    let warnings = response
        .get("warnings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    let patch = match patch {
        Some(bytes) if mutating => {
            Some(serde_json::from_slice(&bytes).map_err(|e| format!("response.patch is not a JSON patch: {e}"))?)
        }
        _ => None,
    };
    Ok(Reply {
        allowed,
        status: response.get("status").cloned(),
        warnings,
        patch,
    })
}

/// `response.patch` decoded as Go decodes a `[]byte`: a base64 string, or an array of numbers
/// 0-255 (as kube-rs's `AdmissionResponse` writes it); `null`, `""` and `[]` are no patch.
fn patch_bytes(patch: &Value) -> Result<Option<Vec<u8>>, String> {
    let bytes = match patch {
        Value::Null => Vec::new(),
        Value::String(s) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| format!("response.patch is not base64: {e}"))?,
        Value::Array(items) => items
            .iter()
            .map(|b| {
                b.as_u64()
                    .and_then(|b| u8::try_from(b).ok())
                    .ok_or_else(|| unmarshal_error(b, "patch", "uint8"))
            })
            .collect::<Result<_, _>>()?,
        other => return Err(unmarshal_error(other, "patch", "[]uint8")),
    };
    Ok((!bytes.is_empty()).then_some(bytes))
}

/// Go's `UnmarshalTypeError` text for `value` in `response.<field>` of Go type `go_type`.
fn unmarshal_error(value: &Value, field: &str, go_type: &str) -> String {
    let what = match value {
        Value::Null => "null".to_owned(),
        Value::Bool(_) => "bool".to_owned(),
        Value::Number(n) => format!("number {n}"),
        Value::String(_) => "string".to_owned(),
        Value::Array(_) => "array".to_owned(),
        Value::Object(_) => "object".to_owned(),
    };
    format!("json: cannot unmarshal {what} into Go struct field AdmissionReview.response.{field} of type {go_type}")
}

/// The `StatusReason`s a denial's `reason` can carry through (ApiError's reason is one of
/// the known ones; another is sent as none).
const REASONS: [&str; 20] = [
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Invalid",
    "ServerTimeout",
    "StoreReadError",
    "Timeout",
    "TooManyRequests",
    "BadRequest",
    "MethodNotAllowed",
    "NotAcceptable",
    "RequestEntityTooLarge",
    "UnsupportedMediaType",
    "InternalError",
    "Expired",
    "ServiceUnavailable",
    "",
];

/// A denial as kube-apiserver's `ToStatusErr`: the webhook's code (`403` when under 400), its
/// reason and details, and the message `admission webhook "<name>" denied the request: <msg>`
/// (or its reason, or "without explanation").
pub(crate) fn denied(name: &str, status: Option<&Value>) -> ApiError {
    let empty = json!({});
    let status = status.unwrap_or(&empty);
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(403);
    let reason_text = status.get("reason").and_then(Value::as_str).unwrap_or("");
    let message = status.get("message").and_then(Value::as_str).unwrap_or("");
    let denied_by = format!("admission webhook {name:?} denied the request");
    let message = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !reason_text.is_empty() {
        format!("{denied_by}: {reason_text}")
    } else {
        format!("{denied_by} without explanation")
    };
    let reason = REASONS.iter().find(|r| **r == reason_text).copied().unwrap_or("");
    let mut e = ApiError::new(code, reason, message);
    e.details = status.get("details").filter(|d| d.is_object()).cloned();
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_read_as_kube_apiservers() {
        let e = denied(
            "v.example.com",
            Some(&json!({"code": 422, "reason": "Invalid", "message": "no"})),
        );
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(e.message, "admission webhook \"v.example.com\" denied the request: no");
        let e = denied("v.example.com", None);
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "admission webhook \"v.example.com\" denied the request without explanation"
        );
        let e = denied("v.example.com", Some(&json!({"code": 200, "reason": "Custom"})));
        assert_eq!((e.code, e.reason), (403, ""));
        assert_eq!(
            e.message,
            "admission webhook \"v.example.com\" denied the request: Custom"
        );
    }

    #[test]
    fn replies_are_verified() {
        let ok = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "u", "allowed": true, "warnings": ["w"]}});
        let r = reply("v1", "u", &ok, true).unwrap();
        assert!(r.allowed && r.patch.is_none());
        assert_eq!(r.warnings, ["w"]);
        assert!(
            reply("v1", "other", &ok, true)
                .unwrap_err()
                .contains("expected response.uid")
        );
        let mut bad_kind = ok.clone();
        bad_kind["apiVersion"] = json!("admission.k8s.io/v1beta1");
        assert!(reply("v1", "u", &bad_kind, true).is_err());
        let patch = base64::engine::general_purpose::STANDARD.encode(r#"[{"op":"add","path":"/a","value":1}]"#);
        let mut patched = ok.clone();
        patched["response"]["patch"] = json!(patch);
        assert!(reply("v1", "u", &patched, true).unwrap_err().contains("patchType"));
        patched["response"]["patchType"] = json!("JSONPatch");
        assert!(reply("v1", "u", &patched, true).unwrap().patch.is_some());
        assert_eq!(
            reply("v1", "u", &patched, false).unwrap_err(),
            "validating webhook may not return response.patch"
        );
        patched["response"]["patchType"] = json!("JSONMergePatch");
        assert_eq!(
            reply("v1", "u", &patched, true).unwrap_err(),
            "unsupported patch type \"JSONMergePatch\""
        );
    }

    #[test]
    fn a_patch_is_base64_or_an_array_of_bytes() {
        let text = r#"[{"op":"add","path":"/a","value":1}]"#;
        let mut r = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "u", "allowed": true, "patchType": "JSONPatch",
                "patch": text.as_bytes()}});
        assert!(reply("v1", "u", &r, true).unwrap().patch.is_some());
        r["response"]["patch"] = json!({"op": "add"});
        assert_eq!(
            reply("v1", "u", &r, true).unwrap_err(),
            "json: cannot unmarshal object into Go struct field AdmissionReview.response.patch of type []uint8"
        );
        r["response"]["patch"] = json!([300]);
        assert!(reply("v1", "u", &r, true).unwrap_err().contains("number 300"));
        r["response"]["patch"] = json!(true);
        assert!(reply("v1", "u", &r, true).unwrap_err().contains("unmarshal bool"));
        r["response"]["patch"] = json!([]);
        assert_eq!(
            reply("v1", "u", &r, true).unwrap_err(),
            "webhook returned response.patchType but not response.patch"
        );
    }

    #[test]
    fn v1beta1_replies_are_not_checked_for_uid_kind_or_patch_type() {
        let text = r#"[{"op":"add","path":"/a","value":1}]"#;
        let r = json!({"response": {"uid": "other", "allowed": true,
            "patch": base64::engine::general_purpose::STANDARD.encode(text)}});
        let ok = reply("v1beta1", "u", &r, true).unwrap();
        assert!(ok.allowed && ok.patch.is_some());
        assert!(reply("v1beta1", "u", &r, false).unwrap().patch.is_none());
        assert_eq!(
            reply("v1beta1", "u", &json!({}), true).unwrap_err(),
            "webhook response was absent"
        );
    }
}
