//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch and
//! server-side apply.
//!
//! A strategic merge patch merges lists by the built-in types' merge keys (`strategic.rs`).
//! Server-side apply (`apply-patch+yaml`, JSON
//! subset of YAML only) is not a patch of this module in the server: `field_manager.rs` merges it
//! with field ownership; `apply` here is its plain-merge form, kept for the fuzz targets. See
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#patch-and-apply>.

use crate::limits::{self, MAX_DEPTH, MAX_JSON_PATCH_COPY_BYTES, MAX_JSON_PATCH_OPERATIONS};
use crate::status::ApiError;
use json_patch::{AddOperation, CopyOperation, MoveOperation, PatchOperation, ReplaceOperation, TestOperation};
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

/// Applies `body` to `target` in place. `target` must be at most [`MAX_DEPTH`] deep (every
/// stored object is); so is the result, or the patch is refused with `422` (see `limits.rs`).
/// On an error `target` may be partly patched: patch a copy.
pub fn apply(kind: PatchKind, target: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    let patch: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    match kind {
        PatchKind::Strategic | PatchKind::Merge | PatchKind::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request(match kind {
                    PatchKind::Strategic => "invalid strategic merge patch: the patch must be a JSON object",
                    _ => "a merge patch must be a JSON object",
                }));
            }
            // Merging takes each value from the target or the patch, so the result is no
            // deeper than the deeper of the two: bounding the patch bounds the result.
            let d = limits::depth(&patch);
            if d > MAX_DEPTH {
                return Err(limits::too_deep_patch(d));
            }
            if kind == PatchKind::Strategic {
                crate::strategic::apply(target, &patch)
            } else {
                json_patch::merge(target, &patch);
                Ok(())
            }
        }
        PatchKind::Json => apply_json_patch(target, patch),
    }
}

/// Applies a JSON patch (RFC 6902) one operation at a time, as kube-apiserver with
/// evanphx/json-patch: at most [`MAX_JSON_PATCH_OPERATIONS`] operations (`413`), at most
/// [`MAX_JSON_PATCH_COPY_BYTES`] added by `copy` operations (`422`), and, beyond
/// kube-apiserver, no operation may place a value deeper than [`MAX_DEPTH`] (`422`).
///
/// Every check is made before the operation runs, on the operation alone (the depth of its
/// target path plus the depth of the value it places; the size of the value it copies), so the
/// document never grows past the bounds while the patch is applied, and no check walks the
/// whole document.
fn apply_json_patch(target: &mut Value, patch: Value) -> Result<(), ApiError> {
    if let Some(ops) = patch.as_array()
        && ops.len() > MAX_JSON_PATCH_OPERATIONS
    {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "Request entity too large: The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                ops.len()
            ),
        ));
    }
    let ops: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    // kube-apiserver answers a failed operation with a generic 422 (reason Invalid) whose message
    // is json-patch's error.
    let unprocessable = |message: String| ApiError::new(422, "Invalid", message);
    let mut copied = 0usize;
    for op in &ops.0 {
        // The depth of the value the operation places, if it places one.
        let placed = match op {
            PatchOperation::Add(AddOperation { value, .. })
            | PatchOperation::Replace(ReplaceOperation { value, .. }) => Some(limits::depth(value)),
            PatchOperation::Copy(CopyOperation { from, .. }) => match target.pointer(from.as_str()) {
                Some(v) => {
                    let budget = MAX_JSON_PATCH_COPY_BYTES - copied;
                    let Some(len) = limits::encoded_len(v, budget) else {
                        return Err(unprocessable(format!(
                            "Unable to complete the copy, the accumulated size increase of copy is more than {MAX_JSON_PATCH_COPY_BYTES}, exceeding the limit {MAX_JSON_PATCH_COPY_BYTES}"
                        )));
                    };
                    copied += len;
                    Some(limits::depth(v))
                }
                None => None,
            },
            // A move to a path no deeper than its source cannot deepen the document.
            PatchOperation::Move(MoveOperation { from, path }) if path.count() > from.count() => {
                target.pointer(from.as_str()).map(limits::depth)
            }
            _ => None,
        };
        if let Some(d) = placed {
            let total = op.path().count() + d;
            if total > MAX_DEPTH {
                return Err(limits::too_deep_patch(total));
            }
        }
        // evanphx/json-patch (kube-apiserver's) passes a `test` of `null` on a member its parent
        // lacks: "absent" and "null" are one answer there.
        if let PatchOperation::Test(TestOperation {
            path,
            value: Value::Null,
        }) = op
            && target.pointer(path.as_str()).is_none()
            && path
                .as_str()
                .rsplit_once('/')
                .is_some_and(|(parent, _)| target.pointer(parent).is_some_and(Value::is_object))
        {
            continue;
        }
        json_patch::patch_unsafe(target, std::slice::from_ref(op))
            .map_err(|e| unprocessable(format!("the JSON patch could not be applied: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_test_of_null_passes_on_an_absent_member_as_in_evanphx_json_patch() {
        let mut v = json!({"metadata": {"name": "a"}});
        let absent = br#"[{"op":"test","path":"/metadata/finalizers","value":null},
            {"op":"add","path":"/metadata/finalizers","value":["x"]}]"#;
        apply(PatchKind::Json, &mut v, absent).unwrap();
        assert_eq!(v["metadata"]["finalizers"], json!(["x"]));
        // Present and not null: the test fails; a missing parent fails too.
        let present = br#"[{"op":"test","path":"/metadata/finalizers","value":null}]"#;
        assert_eq!(apply(PatchKind::Json, &mut v, present).unwrap_err().code, 422);
        let no_parent = br#"[{"op":"test","path":"/spec/x","value":null}]"#;
        assert_eq!(apply(PatchKind::Json, &mut v, no_parent).unwrap_err().code, 422);
    }

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
