//! Decoding the protobuf bodies kubectl's `create` generators send.
//!
//! kubectl posts `create namespace|configmap|secret|serviceaccount` objects as
//! `application/vnd.kubernetes.protobuf`, with no JSON fallback: the bytes `k8s\0`, then a
//! `runtime.Unknown` (`typeMeta{apiVersion, kind}`, `raw` = the object's own protobuf encoding).
//! This is a small hand-written decoder for those kinds (ObjectMeta and the few fields the
//! generators set), producing the JSON envtest stores. Other kinds answer `415`. See
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#protobuf-encoding>.

use crate::status::ApiError;
use serde_json::{Map, Value, json};

/// One decoded field value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn bad(what: &str) -> ApiError {
    ApiError::bad_request(format!("invalid protobuf body: {what}"))
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, ApiError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or_else(|| bad("truncated varint"))?;
        *pos += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(bad("varint too long"))
}

/// Splits a message into (field number, value) pairs.
fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ApiError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (num, wire) = (key >> 3, key & 7);
        let f = match wire {
            0 => Field::Varint(varint(buf, &mut pos)?),
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                if pos + n > buf.len() {
                    return Err(bad("truncated fixed field"));
                }
                pos += n;
                Field::Fixed
            }
            2 => {
                let n = usize::try_from(varint(buf, &mut pos)?).map_err(|_| bad("length"))?;
                let end = pos
                    .checked_add(n)
                    .filter(|e| *e <= buf.len())
                    .ok_or_else(|| bad("truncated field"))?;
                let b = &buf[pos..end];
                pos = end;
                Field::Bytes(b)
            }
            _ => return Err(bad("unsupported wire type")),
        };
        out.push((num, f));
    }
    Ok(out)
}

fn string(b: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad("string is not UTF-8"))
}

/// Standard base64, as JSON carries `[]byte`.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        out.push(A[(n >> 18) as usize & 63] as char);
        out.push(A[(n >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 {
            A[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 { A[n as usize & 63] as char } else { '=' });
    }
    out
}

/// A `map<string, string|bytes>` entry.
fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), ApiError> {
    let mut k = String::new();
    let mut v = Value::String(String::new());
    for (num, f) in fields(b)? {
        match (num, f) {
            (1, Field::Bytes(x)) => k = string(x)?,
            (2, Field::Bytes(x)) if bytes_value => v = Value::String(base64(x)),
            (2, Field::Bytes(x)) => v = Value::String(string(x)?),
            _ => {}
        }
    }
    Ok((k, v))
}

fn insert_entry(obj: &mut Map<String, Value>, field: &str, b: &[u8], bytes_value: bool) -> Result<(), ApiError> {
    let (k, v) = map_entry(b, bytes_value)?;
    if let Value::Object(m) = obj.entry(field).or_insert_with(|| json!({})) {
        m.insert(k, v);
    }
    Ok(())
}

/// `ObjectMeta`: the fields a create request carries.
fn object_meta(b: &[u8]) -> Result<Value, ApiError> {
    let mut m = Map::new();
    for (num, f) in fields(b)? {
        // Go's encoder writes empty strings for unset fields: skip them.
        let f = match f {
            Field::Bytes([]) if matches!(num, 1..=6) => continue,
            f => f,
        };
        match (num, f) {
            (1, Field::Bytes(x)) => {
                m.insert("name".into(), Value::String(string(x)?));
            }
            (2, Field::Bytes(x)) => {
                m.insert("generateName".into(), Value::String(string(x)?));
            }
            (3, Field::Bytes(x)) => {
                m.insert("namespace".into(), Value::String(string(x)?));
            }
            (11, Field::Bytes(x)) => insert_entry(&mut m, "labels", x, false)?,
            (12, Field::Bytes(x)) => insert_entry(&mut m, "annotations", x, false)?,
            (14, Field::Bytes(x)) => {
                let s = Value::String(string(x)?);
                if let Value::Array(a) = m.entry("finalizers").or_insert_with(|| json!([])) {
                    a.push(s);
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

/// The object inside `raw`, for the kinds kubectl's generators create.
fn object(api_version: &str, kind: &str, raw: &[u8]) -> Result<Value, ApiError> {
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), Value::String(api_version.to_owned()));
    obj.insert("kind".into(), Value::String(kind.to_owned()));
    for (num, f) in fields(raw)? {
        let x = match f {
            Field::Bytes(x) => x,
            Field::Varint(v) => {
                if matches!((kind, num), ("ConfigMap", 4) | ("Secret", 5)) {
                    obj.insert("immutable".into(), Value::Bool(v != 0));
                }
                continue;
            }
            Field::Fixed => continue,
        };
        match (kind, num) {
            (_, 1) => {
                obj.insert("metadata".into(), object_meta(x)?);
            }
            ("ConfigMap", 2) => insert_entry(&mut obj, "data", x, false)?,
            ("ConfigMap", 3) => insert_entry(&mut obj, "binaryData", x, true)?,
            ("Secret", 2) => insert_entry(&mut obj, "data", x, true)?,
            ("Secret", 3) => {
                obj.insert("type".into(), Value::String(string(x)?));
            }
            ("Secret", 4) => insert_entry(&mut obj, "stringData", x, false)?,
            _ => {}
        }
    }
    Ok(Value::Object(obj))
}

/// Decodes a `k8s\0` + `runtime.Unknown` body into the JSON object it carries.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| bad("missing the k8s\\0 prefix"))?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (num, f) in fields(envelope)? {
        match (num, f) {
            (1, Field::Bytes(tm)) => {
                for (n, f) in fields(tm)? {
                    match (n, f) {
                        (1, Field::Bytes(x)) => api_version = string(x)?,
                        (2, Field::Bytes(x)) => kind = string(x)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    if !matches!(
        (api_version.as_str(), kind.as_str()),
        ("v1", "Namespace" | "ConfigMap" | "Secret" | "ServiceAccount")
    ) {
        return Err(ApiError::unsupported_media_type(&format!(
            "application/vnd.kubernetes.protobuf for {api_version}/{kind} (envtest decodes protobuf only for v1 Namespace, ConfigMap, Secret, ServiceAccount; send JSON)"
        )));
    }
    object(&api_version, &kind, raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    fn entry(k: &str, v: &[u8]) -> Vec<u8> {
        [field(1, k.as_bytes()), field(2, v)].concat()
    }

    #[test]
    fn decodes_a_configmap_like_kubectl_sends() {
        let meta = [field(1, b"c1"), field(3, b"default"), field(11, &entry("app", b"x"))].concat();
        let raw = [
            field(1, &meta),
            field(2, &entry("a", b"b")),
            field(3, &entry("bin", b"\x00\x01")),
        ]
        .concat();
        let tm = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &tm), field(2, &raw)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(v["kind"], "ConfigMap");
        assert_eq!(v["metadata"]["name"], "c1");
        assert_eq!(v["metadata"]["labels"]["app"], "x");
        assert_eq!(v["data"]["a"], "b");
        assert_eq!(v["binaryData"]["bin"], "AAE=");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for body in [&b"k8s"[..], b"k8s\0\xff\xff\xff", b"k8s\0\x0a\x7f", b"k8s\0\x0b", b""] {
            assert!(decode(body).is_err());
        }
        assert_eq!(base64(b"hello"), "aGVsbG8=");
    }
}
