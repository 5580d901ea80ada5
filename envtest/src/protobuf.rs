//! Decoding the protobuf bodies kubectl's `create` generators send.
//!
//! kubectl posts what its `create` generators and `run` make (namespace, configmap, secret,
//! serviceaccount, deployment, job, cronjob, service, role, clusterrole, rolebinding,
//! clusterrolebinding, ingress, pod) as `application/vnd.kubernetes.protobuf`, with no JSON
//! fallback: the bytes `k8s\0`, then a `runtime.Unknown` (`typeMeta{apiVersion, kind}`, `raw` =
//! the object's own protobuf encoding). This decoder walks field tables of those messages (the
//! numbers and JSON names of the API's `generated.proto`, for the fields a created object carries)
//! and produces the JSON envtest stores. Go writes every non-pointer field, so a zero value of a
//! non-pointer field is left out as Go's JSON would; a field the tables do not know is skipped
//! when zero and refused (`415`, "send JSON") when set, so nothing is lost silently. Other kinds
//! answer `415`. See
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

/// What a protobuf field holds and how it becomes JSON.
#[derive(Clone, Copy)]
enum Ty {
    /// `string`.
    Str,
    /// `bool`.
    Bool,
    /// `int32`/`int64` (varint; negative values as 64-bit two's complement).
    Int,
    /// A nested message.
    Msg(&'static [F]),
    /// A nested message whose fields JSON puts in the parent (Go's `json:",inline"`).
    Inline(&'static [F]),
    /// `map<string, string>`.
    StrMap,
    /// `map<string, bytes>`.
    BytesMap,
    /// `map<string, Quantity>`.
    QuantityMap,
    /// `resource.Quantity`: its string.
    Quantity,
    /// `intstr.IntOrString`: a number or a string.
    IntOrString,
    /// `meta/v1.Time`: RFC 3339, absent when zero.
    Time,
}

/// One field of a message: number, JSON name, type, whether repeated, whether Go holds it in
/// a pointer (then a zero value is kept: `replicas: 0` is not "unset").
#[derive(Clone, Copy)]
struct F {
    num: u64,
    name: &'static str,
    ty: Ty,
    repeated: bool,
    ptr: bool,
}

const fn f(num: u64, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: false,
        ptr: false,
    }
}

/// A field Go holds in a pointer.
const fn p(num: u64, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: false,
        ptr: true,
    }
}

/// A repeated field.
const fn r(num: u64, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: true,
        ptr: false,
    }
}

/// Whether a field's raw value is its zero value (what Go's encoder writes for an unset
/// non-pointer field).
fn is_zero(f: &Field<'_>) -> bool {
    match f {
        Field::Varint(v) => *v == 0,
        Field::Bytes(b) => b.is_empty(),
        Field::Fixed => true,
    }
}

/// `map<string, V>` entry: key 1, value 2.
fn map_entry<'a>(b: &'a [u8]) -> Result<(String, Option<Field<'a>>), ApiError> {
    let mut k = String::new();
    let mut v = None;
    for (num, f) in fields(b)? {
        match (num, f) {
            (1, Field::Bytes(x)) => k = string(x)?,
            (2, f) => v = Some(f),
            _ => {}
        }
    }
    Ok((k, v))
}

fn bytes_of<'a>(f: Field<'a>, what: &str) -> Result<&'a [u8], ApiError> {
    match f {
        Field::Bytes(b) => Ok(b),
        _ => Err(bad(&format!("{what}: expected a length-delimited field"))),
    }
}

/// The JSON of one field value; `None` for a zero value of a non-pointer field (Go's JSON
/// leaves those out, kube-apiserver would too).
fn value(def: &F, f: Field<'_>) -> Result<Option<Value>, ApiError> {
    let keep_zero = def.ptr || def.repeated;
    Ok(match def.ty {
        Ty::Str => {
            let s = string(bytes_of(f, def.name)?)?;
            (keep_zero || !s.is_empty()).then_some(Value::String(s))
        }
        Ty::Bool => match f {
            Field::Varint(v) => (keep_zero || v != 0).then_some(Value::Bool(v != 0)),
            _ => return Err(bad(&format!("{}: expected a varint", def.name))),
        },
        Ty::Int => match f {
            // Two's complement: int32/int64 negatives arrive as 10-byte varints.
            Field::Varint(v) => (keep_zero || v != 0).then_some(json!(v as i64)),
            _ => return Err(bad(&format!("{}: expected a varint", def.name))),
        },
        Ty::Msg(fields) | Ty::Inline(fields) => Some(Value::Object(message(bytes_of(f, def.name)?, fields)?)),
        Ty::Quantity => {
            let mut q = String::new();
            for (num, f) in self::fields(bytes_of(f, def.name)?)? {
                if let (1, Field::Bytes(x)) = (num, f) {
                    q = string(x)?;
                }
            }
            Some(Value::String(q))
        }
        Ty::IntOrString => {
            let (mut ty, mut int, mut text) = (0u64, 0i64, String::new());
            for (num, f) in self::fields(bytes_of(f, def.name)?)? {
                match (num, f) {
                    (1, Field::Varint(v)) => ty = v,
                    (2, Field::Varint(v)) => int = v as i64 as i32 as i64,
                    (3, Field::Bytes(x)) => text = string(x)?,
                    _ => {}
                }
            }
            Some(if ty == 1 { Value::String(text) } else { json!(int) })
        }
        Ty::Time => {
            let (mut secs, mut nanos) = (0i64, 0i64);
            for (num, f) in self::fields(bytes_of(f, def.name)?)? {
                match (num, f) {
                    (1, Field::Varint(v)) => secs = v as i64,
                    (2, Field::Varint(v)) => nanos = v as i64,
                    _ => {}
                }
            }
            if secs == 0 && nanos == 0 {
                None
            } else {
                let t = k8s_openapi::jiff::Timestamp::from_second(secs).map_err(|e| bad(&format!("time: {e}")))?;
                Some(Value::String(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()))
            }
        }
        Ty::StrMap | Ty::BytesMap | Ty::QuantityMap => {
            return Err(bad("a map is decoded entry by entry"));
        }
    })
}

/// Decodes a message with the field table `defs`. A field the table does not know is skipped
/// when it holds its zero value (Go writes every non-pointer field) and refused otherwise, so
/// nothing a client sent is silently lost.
fn message(b: &[u8], defs: &'static [F]) -> Result<Map<String, Value>, ApiError> {
    let mut obj = Map::new();
    for (num, raw) in fields(b)? {
        let Some(def) = defs.iter().find(|d| d.num == num) else {
            if is_zero(&raw) {
                continue;
            }
            return Err(ApiError::unsupported_media_type(&format!(
                "application/vnd.kubernetes.protobuf with field {num} set, which envtest's decoder does not know next to {:?}; send JSON",
                defs.iter().map(|d| d.name).collect::<Vec<_>>()
            )));
        };
        match def.ty {
            Ty::StrMap | Ty::BytesMap | Ty::QuantityMap => {
                let (k, v) = map_entry(bytes_of(raw, def.name)?)?;
                let v = match (def.ty, v) {
                    (_, None) => Value::String(String::new()),
                    (Ty::StrMap, Some(Field::Bytes(x))) => Value::String(string(x)?),
                    (Ty::BytesMap, Some(Field::Bytes(x))) => Value::String(base64(x)),
                    (Ty::QuantityMap, Some(f)) => value(&f_quantity(def), f)?.unwrap_or(Value::Null),
                    _ => return Err(bad(&format!("{}: bad map value", def.name))),
                };
                if let Value::Object(m) = obj.entry(def.name).or_insert_with(|| json!({})) {
                    m.insert(k, v);
                }
            }
            Ty::Inline(_) => {
                if let Some(Value::Object(inner)) = value(def, raw)? {
                    obj.extend(inner);
                }
            }
            _ if def.repeated => {
                if let Some(v) = value(def, raw)?
                    && let Value::Array(a) = obj.entry(def.name).or_insert_with(|| json!([]))
                {
                    a.push(v);
                }
            }
            _ => {
                if let Some(v) = value(def, raw)? {
                    obj.insert(def.name.to_owned(), v);
                }
            }
        }
    }
    Ok(obj)
}

/// The definition a `map<string, Quantity>` value decodes with.
fn f_quantity(def: &F) -> F {
    F {
        ty: Ty::Quantity,
        ..*def
    }
}

/// The field table of `apiVersion`/`kind`, for the kinds kubectl's generators create.
fn table(api_version: &str, kind: &str) -> Option<&'static [F]> {
    use tables::*;
    Some(match (api_version, kind) {
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("v1", "Pod") => POD,
        ("v1", "Service") => SERVICE,
        ("apps/v1", "Deployment") => DEPLOYMENT,
        ("batch/v1", "Job") => JOB,
        ("batch/v1", "CronJob") => CRON_JOB,
        ("rbac.authorization.k8s.io/v1", "Role") => ROLE,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => CLUSTER_ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => ROLE_BINDING,
        ("networking.k8s.io/v1", "Ingress") => INGRESS,
        _ => return None,
    })
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
    let Some(defs) = table(&api_version, &kind) else {
        return Err(ApiError::unsupported_media_type(&format!(
            "application/vnd.kubernetes.protobuf for {api_version}/{kind} (envtest decodes protobuf for the kinds kubectl's create generators send; send JSON)"
        )));
    };
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), Value::String(api_version));
    obj.insert("kind".into(), Value::String(kind));
    obj.extend(message(raw, defs)?);
    Ok(Value::Object(obj))
}

/// Field tables of the Kubernetes messages (numbers and JSON names from the API's
/// `generated.proto` files; `p` marks Go pointer fields).
mod tables {
    use super::{F, Ty, f, p, r};
    use Ty::*;

    /// A message whose every field must be zero (the status of an object being created).
    const ZERO: &[F] = &[];

    const OWNER_REFERENCE: &[F] = &[
        f(1, "kind", Str),
        f(3, "name", Str),
        f(4, "uid", Str),
        f(5, "apiVersion", Str),
        p(6, "controller", Bool),
        p(7, "blockOwnerDeletion", Bool),
    ];
    const OBJECT_META: &[F] = &[
        f(1, "name", Str),
        f(2, "generateName", Str),
        f(3, "namespace", Str),
        f(5, "uid", Str),
        f(6, "resourceVersion", Str),
        f(7, "generation", Int),
        f(8, "creationTimestamp", Time),
        f(11, "labels", StrMap),
        f(12, "annotations", StrMap),
        r(13, "ownerReferences", Msg(OWNER_REFERENCE)),
        r(14, "finalizers", Str),
    ];
    const LABEL_SELECTOR_REQUIREMENT: &[F] = &[f(1, "key", Str), f(2, "operator", Str), r(3, "values", Str)];
    const LABEL_SELECTOR: &[F] = &[
        f(1, "matchLabels", StrMap),
        r(2, "matchExpressions", Msg(LABEL_SELECTOR_REQUIREMENT)),
    ];
    const LOCAL_OBJECT_REFERENCE: &[F] = &[f(1, "name", Str)];
    const OBJECT_REFERENCE: &[F] = &[
        f(1, "kind", Str),
        f(2, "namespace", Str),
        f(3, "name", Str),
        f(4, "uid", Str),
        f(5, "apiVersion", Str),
        f(6, "resourceVersion", Str),
        f(7, "fieldPath", Str),
    ];

    pub(super) const NAMESPACE: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "spec", Msg(&[r(1, "finalizers", Str)])),
        f(3, "status", Msg(ZERO)),
    ];
    pub(super) const CONFIG_MAP: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "data", StrMap),
        f(3, "binaryData", BytesMap),
        p(4, "immutable", Bool),
    ];
    pub(super) const SECRET: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "data", BytesMap),
        f(3, "type", Str),
        f(4, "stringData", StrMap),
        p(5, "immutable", Bool),
    ];
    pub(super) const SERVICE_ACCOUNT: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        r(2, "secrets", Msg(OBJECT_REFERENCE)),
        r(3, "imagePullSecrets", Msg(LOCAL_OBJECT_REFERENCE)),
        p(4, "automountServiceAccountToken", Bool),
    ];

    const CONTAINER_PORT: &[F] = &[
        f(1, "name", Str),
        f(2, "hostPort", Int),
        f(3, "containerPort", Int),
        f(4, "protocol", Str),
        f(5, "hostIP", Str),
    ];
    const ENV_VAR: &[F] = &[f(1, "name", Str), f(2, "value", Str)];
    const RESOURCE_REQUIREMENTS: &[F] = &[f(1, "limits", QuantityMap), f(2, "requests", QuantityMap)];
    const CONTAINER: &[F] = &[
        f(1, "name", Str),
        f(2, "image", Str),
        r(3, "command", Str),
        r(4, "args", Str),
        f(5, "workingDir", Str),
        r(6, "ports", Msg(CONTAINER_PORT)),
        r(7, "env", Msg(ENV_VAR)),
        f(8, "resources", Msg(RESOURCE_REQUIREMENTS)),
        f(13, "terminationMessagePath", Str),
        f(14, "imagePullPolicy", Str),
        f(16, "stdin", Bool),
        f(17, "stdinOnce", Bool),
        f(18, "tty", Bool),
        f(20, "terminationMessagePolicy", Str),
        p(24, "restartPolicy", Str),
    ];
    const POD_SPEC: &[F] = &[
        r(2, "containers", Msg(CONTAINER)),
        f(3, "restartPolicy", Str),
        p(4, "terminationGracePeriodSeconds", Int),
        p(5, "activeDeadlineSeconds", Int),
        f(6, "dnsPolicy", Str),
        f(7, "nodeSelector", StrMap),
        f(8, "serviceAccountName", Str),
        f(9, "serviceAccount", Str),
        f(10, "nodeName", Str),
        f(11, "hostNetwork", Bool),
        f(12, "hostPID", Bool),
        f(13, "hostIPC", Bool),
        r(15, "imagePullSecrets", Msg(LOCAL_OBJECT_REFERENCE)),
        f(16, "hostname", Str),
        f(17, "subdomain", Str),
        f(19, "schedulerName", Str),
        r(20, "initContainers", Msg(CONTAINER)),
        p(21, "automountServiceAccountToken", Bool),
        f(24, "priorityClassName", Str),
        p(25, "priority", Int),
        p(27, "shareProcessNamespace", Bool),
        p(30, "enableServiceLinks", Bool),
        p(37, "hostUsers", Bool),
    ];
    const POD_TEMPLATE_SPEC: &[F] = &[f(1, "metadata", Msg(OBJECT_META)), f(2, "spec", Msg(POD_SPEC))];
    pub(super) const POD: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "spec", Msg(POD_SPEC)),
        f(3, "status", Msg(ZERO)),
    ];

    const INT_OR_STRING: Ty = IntOrString;
    const ROLLING_UPDATE_DEPLOYMENT: &[F] = &[p(1, "maxUnavailable", INT_OR_STRING), p(2, "maxSurge", INT_OR_STRING)];
    const DEPLOYMENT_STRATEGY: &[F] = &[f(1, "type", Str), p(2, "rollingUpdate", Msg(ROLLING_UPDATE_DEPLOYMENT))];
    const DEPLOYMENT_SPEC: &[F] = &[
        p(1, "replicas", Int),
        p(2, "selector", Msg(LABEL_SELECTOR)),
        f(3, "template", Msg(POD_TEMPLATE_SPEC)),
        f(4, "strategy", Msg(DEPLOYMENT_STRATEGY)),
        f(5, "minReadySeconds", Int),
        p(6, "revisionHistoryLimit", Int),
        f(7, "paused", Bool),
        p(9, "progressDeadlineSeconds", Int),
    ];
    pub(super) const DEPLOYMENT: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "spec", Msg(DEPLOYMENT_SPEC)),
        f(3, "status", Msg(ZERO)),
    ];

    const SERVICE_PORT: &[F] = &[
        f(1, "name", Str),
        f(2, "protocol", Str),
        f(3, "port", Int),
        f(4, "targetPort", INT_OR_STRING),
        f(5, "nodePort", Int),
        p(6, "appProtocol", Str),
    ];
    const SERVICE_SPEC: &[F] = &[
        r(1, "ports", Msg(SERVICE_PORT)),
        f(2, "selector", StrMap),
        f(3, "clusterIP", Str),
        f(4, "type", Str),
        r(5, "externalIPs", Str),
        f(7, "sessionAffinity", Str),
        f(8, "loadBalancerIP", Str),
        r(9, "loadBalancerSourceRanges", Str),
        f(10, "externalName", Str),
        f(11, "externalTrafficPolicy", Str),
        f(12, "healthCheckNodePort", Int),
        f(13, "publishNotReadyAddresses", Bool),
        p(17, "ipFamilyPolicy", Str),
        r(18, "clusterIPs", Str),
        r(19, "ipFamilies", Str),
        p(20, "allocateLoadBalancerNodePorts", Bool),
        p(21, "loadBalancerClass", Str),
        p(22, "internalTrafficPolicy", Str),
        p(23, "trafficDistribution", Str),
    ];
    pub(super) const SERVICE: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "spec", Msg(SERVICE_SPEC)),
        f(3, "status", Msg(ZERO)),
    ];

    const JOB_SPEC: &[F] = &[
        p(1, "parallelism", Int),
        p(2, "completions", Int),
        p(3, "activeDeadlineSeconds", Int),
        p(4, "selector", Msg(LABEL_SELECTOR)),
        p(5, "manualSelector", Bool),
        f(6, "template", Msg(POD_TEMPLATE_SPEC)),
        p(7, "backoffLimit", Int),
        p(8, "ttlSecondsAfterFinished", Int),
        p(9, "completionMode", Str),
        p(10, "suspend", Bool),
        p(12, "backoffLimitPerIndex", Int),
        p(13, "maxFailedIndexes", Int),
        p(14, "podReplacementPolicy", Str),
        p(15, "managedBy", Str),
    ];
    pub(super) const JOB: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "spec", Msg(JOB_SPEC)),
        f(3, "status", Msg(ZERO)),
    ];
    const JOB_TEMPLATE_SPEC: &[F] = &[f(1, "metadata", Msg(OBJECT_META)), f(2, "spec", Msg(JOB_SPEC))];
    const CRON_JOB_SPEC: &[F] = &[
        f(1, "schedule", Str),
        p(2, "startingDeadlineSeconds", Int),
        f(3, "concurrencyPolicy", Str),
        p(4, "suspend", Bool),
        f(5, "jobTemplate", Msg(JOB_TEMPLATE_SPEC)),
        p(6, "successfulJobsHistoryLimit", Int),
        p(7, "failedJobsHistoryLimit", Int),
        p(8, "timeZone", Str),
    ];
    pub(super) const CRON_JOB: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "spec", Msg(CRON_JOB_SPEC)),
        f(3, "status", Msg(ZERO)),
    ];

    const POLICY_RULE: &[F] = &[
        r(1, "verbs", Str),
        r(2, "apiGroups", Str),
        r(3, "resources", Str),
        r(4, "resourceNames", Str),
        r(5, "nonResourceURLs", Str),
    ];
    pub(super) const ROLE: &[F] = &[f(1, "metadata", Msg(OBJECT_META)), r(2, "rules", Msg(POLICY_RULE))];
    pub(super) const CLUSTER_ROLE: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        r(2, "rules", Msg(POLICY_RULE)),
        p(
            3,
            "aggregationRule",
            Msg(&[r(1, "clusterRoleSelectors", Msg(LABEL_SELECTOR))]),
        ),
    ];
    const SUBJECT: &[F] = &[
        f(1, "kind", Str),
        f(2, "apiGroup", Str),
        f(3, "name", Str),
        f(4, "namespace", Str),
    ];
    /// RoleBinding and ClusterRoleBinding have the same fields.
    pub(super) const ROLE_BINDING: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        r(2, "subjects", Msg(SUBJECT)),
        f(
            3,
            "roleRef",
            Msg(&[f(1, "apiGroup", Str), f(2, "kind", Str), f(3, "name", Str)]),
        ),
    ];

    const SERVICE_BACKEND_PORT: &[F] = &[f(1, "name", Str), f(2, "number", Int)];
    const INGRESS_BACKEND: &[F] = &[p(
        4,
        "service",
        Msg(&[f(1, "name", Str), f(2, "port", Msg(SERVICE_BACKEND_PORT))]),
    )];
    const HTTP_INGRESS_PATH: &[F] = &[
        f(1, "path", Str),
        f(2, "backend", Msg(INGRESS_BACKEND)),
        p(3, "pathType", Str),
    ];
    const INGRESS_RULE: &[F] = &[
        f(1, "host", Str),
        // IngressRuleValue is inline in JSON: its `http` sits in the rule.
        f(
            2,
            "",
            Inline(&[p(1, "http", Msg(&[r(1, "paths", Msg(HTTP_INGRESS_PATH))]))]),
        ),
    ];
    const INGRESS_SPEC: &[F] = &[
        p(1, "defaultBackend", Msg(INGRESS_BACKEND)),
        r(2, "tls", Msg(&[r(1, "hosts", Str), f(2, "secretName", Str)])),
        r(3, "rules", Msg(INGRESS_RULE)),
        p(4, "ingressClassName", Str),
    ];
    pub(super) const INGRESS: &[F] = &[
        f(1, "metadata", Msg(OBJECT_META)),
        f(2, "spec", Msg(INGRESS_SPEC)),
        f(3, "status", Msg(ZERO)),
    ];
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

    fn varint_bytes(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    fn varint_field(num: u64, v: u64) -> Vec<u8> {
        [varint_bytes(num << 3), varint_bytes(v)].concat()
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let tm = [field(1, api_version.as_bytes()), field(2, kind.as_bytes())].concat();
        [b"k8s\0".to_vec(), field(1, &tm), field(2, raw)].concat()
    }

    #[test]
    fn zero_values_go_pointers_stay_and_unknown_set_fields_are_refused() {
        // A Deployment with replicas 0 (a pointer: kept), paused false (not: left out), an
        // empty status, a maxSurge of "25%" and a negative minReadySeconds.
        let surge = [varint_field(1, 1), field(3, b"25%")].concat();
        let strategy = [field(1, b"RollingUpdate"), field(2, &field(2, &surge))].concat();
        let spec = [
            varint_field(1, 0),
            varint_field(7, 0),
            field(4, &strategy),
            varint_field(5, (-5i64) as u64),
        ]
        .concat();
        let raw = [field(1, &field(1, b"d")), field(2, &spec), field(3, b"")].concat();
        let d = decode(&envelope("apps/v1", "Deployment", &raw)).unwrap();
        assert_eq!(
            d,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                "spec": {"replicas": 0, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}},
                         "minReadySeconds": -5},
                "status": {}})
        );
        // Field 99 of DeploymentSpec set: refused rather than dropped.
        let raw = [field(2, &varint_field(99, 1))].concat();
        assert_eq!(decode(&envelope("apps/v1", "Deployment", &raw)).unwrap_err().code, 415);
        // ... and skipped when zero, as Go writes every non-pointer field.
        let raw = [field(2, &varint_field(99, 0))].concat();
        assert!(decode(&envelope("apps/v1", "Deployment", &raw)).is_ok());
        assert_eq!(
            decode(&envelope("policy/v1", "PodDisruptionBudget", &[]))
                .unwrap_err()
                .code,
            415
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for body in [&b"k8s"[..], b"k8s\0\xff\xff\xff", b"k8s\0\x0a\x7f", b"k8s\0\x0b", b""] {
            assert!(decode(body).is_err());
        }
        assert_eq!(base64(b"hello"), "aGVsbG8=");
    }
}
