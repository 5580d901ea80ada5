//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch and
//! server-side apply.
//!
//! A strategic merge patch merges lists by the built-in types' merge keys (`strategic.rs`).
//! Server-side apply (`apply-patch+yaml`, JSON
//! subset of YAML only) is not a patch of this module in the server: `field_manager.rs` merges it
//! with field ownership; `apply` here is its plain-merge form, kept for the fuzz targets. See
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#patch-and-apply>.

use crate::status::ApiError;
use serde_json::Value;

/// The kind of patch, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json` (lists merged by the built-in types' keys).
    Strategic,
    /// `application/apply-patch+yaml` (create-or-merge).
    Apply,
}

impl PatchKind {
    /// Recognizes the content type (parameters such as `; charset=utf-8` are ignored).
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(PatchKind::Apply),
            _ => None,
        }
    }
}

/// Applies `body` to `target` in place.
pub fn apply(kind: PatchKind, target: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    let patch: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    match kind {
        PatchKind::Strategic => crate::strategic::apply(target, &patch),
        PatchKind::Merge | PatchKind::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(target, &patch);
            Ok(())
        }
        PatchKind::Json => {
            let ops: json_patch::Patch =
                serde_json::from_value(patch).map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(target, &ops)
                .map_err(|e| ApiError::invalid("patch", "", format!("the JSON patch could not be applied: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_and_json_patch() {
        let mut v = json!({"a": 1, "b": {"c": 2}});
        apply(PatchKind::Merge, &mut v, br#"{"b":{"c":null,"d":3}}"#).unwrap();
        assert_eq!(v, json!({"a": 1, "b": {"d": 3}}));
        apply(PatchKind::Json, &mut v, br#"[{"op":"replace","path":"/a","value":5}]"#).unwrap();
        assert_eq!(v["a"], 5);
        assert_eq!(
            apply(PatchKind::Json, &mut v, br#"[{"op":"test","path":"/a","value":6}]"#)
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(apply(PatchKind::Merge, &mut v, b"nope").unwrap_err().code, 400);
        assert_eq!(apply(PatchKind::Merge, &mut v, b"[1]").unwrap_err().code, 400);
    }
}
