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

/// Checks a reply as kube-apiserver's `VerifyAdmissionResponse`: the review's version and
/// kind (v1), the request's uid, a patch only of type `JSONPatch`. Validating webhooks'
/// patches are ignored.
pub(crate) fn reply(version: &str, uid: &str, review: &Value, mutating: bool) -> Result<Reply, String> {
    if version == "v1" {
        let api_version = review.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = review.get("kind").and_then(Value::as_str).unwrap_or("");
        if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
            return Err(format!(
                "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {api_version}, Kind={kind}"
            ));
        }
    }
    let Some(response) = review.get("response").filter(|r| r.is_object()) else {
        return Err("response was absent".into());
    };
    let got_uid = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if got_uid != uid {
        return Err(format!("expected response.uid={uid:?}, got {got_uid:?}"));
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
    let patch_b64 = response.get("patch").and_then(Value::as_str).unwrap_or("");
    let patch_type = response.get("patchType").and_then(Value::as_str).unwrap_or("");
    let patch = if !mutating || patch_b64.is_empty() {
        None
    } else {
        if version == "v1" && patch_type != "JSONPatch" {
            return Err(format!("response.patchType must be JSONPatch, got {patch_type:?}"));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch_b64)
            .map_err(|e| format!("response.patch is not base64: {e}"))?;
        Some(serde_json::from_slice(&bytes).map_err(|e| format!("response.patch is not a JSON patch: {e}"))?)
    };
    Ok(Reply {
        allowed,
        status: response.get("status").cloned(),
        warnings,
        patch,
    })
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
        assert!(reply("v1", "u", &patched, false).unwrap().patch.is_none());
    }
}
