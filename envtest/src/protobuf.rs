//! Decoding the protobuf bodies kubectl's `create` generators send (phase 3; not yet supported).

use crate::status::ApiError;
use serde_json::Value;

/// Decodes a `k8s\0` + `runtime.Unknown` body into the JSON object it carries.
pub(crate) fn decode(_body: &[u8]) -> Result<Value, ApiError> {
    Err(ApiError::unsupported_media_type("application/vnd.kubernetes.protobuf"))
}
