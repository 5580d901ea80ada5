//! `meta.k8s.io/v1` `Table` responses: what `kubectl get` prints.
//!
//! Where it sits: on the read path, after the object or list is read (and converted to the
//! request's version), when the `Accept` header asks for `as=Table` first (`request.rs`
//! negotiates it; kubectl sends `application/json;as=Table;v=v1;g=meta.k8s.io,...`), and for
//! each event of a watch that asks for one (`kubectl get --watch`): a one-row Table per event,
//! with the column definitions each time (kubectl prints the header once while they stay the
//! same).
//!
//! Columns, as kube-apiserver's table convertors:
//! - a custom resource: `Name`, then its version's `additionalPrinterColumns` (name, type,
//!   format, description, priority; each value found by the column's JSONPath, the first match,
//!   typed by the column's `type`, a `date` shown as an age), or `Age` when the version declares
//!   none (apiextensions-apiserver's `tableconvertor` and its default columns);
//! - a built-in kind: kube-apiserver's printer columns for it (`builtin.rs`: a Pod's `Ready`,
//!   `Status`, `Restarts`, `Age`, and with priority 1 `IP`, `Node`, …), each cell computed from
//!   the stored object as the Go printer computes it.
//!
//! Each row's `object` is the object's `PartialObjectMetadata` (`includeObject=Metadata`, the
//! default), the object itself (`Object`) or nothing (`None`). JSONPath is evaluated by the
//! `jsonpath-rust` crate (RFC 9535) after each `.name` step of Kubernetes' JSONPath is rewritten
//! as `['name']`, since Kubernetes allows names (`-`, `/`) that RFC 9535's shorthand does not.

mod builtin;

use crate::request::partial_object_metadata;
use crate::resources::ResourceInfo;
use crate::status::ApiError;
use jsonpath_rust::JsonPath;
use serde_json::{Value, json};
use std::sync::OnceLock;

/// What a row's `object` holds (the `includeObject` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IncludeObject {
    /// Nothing.
    None,
    /// A `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses `includeObject` (absent or empty: `Metadata`); other values are a `400`, as
    /// kube-apiserver's "unrecognized includeObject value".
    pub(crate) fn from_query(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("" | "Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(ApiError::bad_request(format!(
                "unrecognized includeObject value: {other:?}"
            ))),
        }
    }
}

/// One column: its definition and how a cell is found.
#[derive(Debug, Clone)]
struct Column {
    /// The `TableColumnDefinition`.
    definition: Value,
    /// What fills the cells.
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    /// `metadata.name`.
    Name,
    /// The age of `metadata.creationTimestamp`.
    Age,
    /// A printer column: the JSONPath (RFC 9535 form) and the column's type.
    Path { path: String, ty: String },
    /// A built-in kind's column (`builtin.rs`).
    Builtin(builtin::CellFn),
}

/// The table convertor of one resource version.
#[derive(Debug, Clone)]
pub(crate) struct TableConvertor {
    columns: Vec<Column>,
}

/// `ObjectMeta`'s documentation of `field`, as kube-apiserver describes its `Name` and `Age`
/// columns (`metav1.ObjectMeta{}.SwaggerDoc()`), taken from k8s-openapi's schema.
fn object_meta_doc(field: &str) -> String {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    let schema = SCHEMA.get_or_init(|| {
        schemars::schema_for!(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta)
            .as_value()
            .clone()
    });
    schema["properties"][field]["description"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn name_column() -> Column {
    Column {
        definition: json!({"name": "Name", "type": "string", "format": "name",
            "description": object_meta_doc("name"), "priority": 0}),
        source: Source::Name,
    }
}

fn age_column(ty: &str) -> Column {
    Column {
        definition: json!({"name": "Age", "type": ty, "format": "",
            "description": object_meta_doc("creationTimestamp"), "priority": 0}),
        source: Source::Age,
    }
}

/// The columns of the built-in resource `group/plural`, their definitions built once (the
/// descriptions come from k8s-openapi's schemas, which are costly to generate).
fn builtin_columns(group: &str, plural: &str) -> Vec<Column> {
    type Cache = std::sync::Mutex<std::collections::HashMap<(String, String), Vec<Column>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (group.to_owned(), plural.to_owned());
    if let Some(found) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return found.clone();
    }
    let columns: Vec<Column> = builtin::columns(group, plural)
        .into_iter()
        .map(|c| {
            let description = match c.doc {
                builtin::Doc::Text(t) => t.to_owned(),
                builtin::Doc::Field(schema, field) => schema()["properties"][field]["description"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            };
            Column {
                definition: json!({"name": c.name, "type": c.ty, "format": c.format,
                    "description": description, "priority": c.priority}),
                source: Source::Builtin(c.cell),
            }
        })
        .collect();
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, columns.clone());
    columns
}

impl TableConvertor {
    /// The convertor of `info`: its CRD version's printer columns when `crd` serves it, else
    /// the built-in default.
    pub(crate) fn for_resource(info: &ResourceInfo, crd: Option<&Value>) -> Self {
        let Some(version) = crd.and_then(|c| crate::crd::version(c, &info.version)) else {
            return TableConvertor {
                columns: builtin_columns(&info.group, &info.plural),
            };
        };
        let declared = version["additionalPrinterColumns"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut columns = vec![name_column()];
        if declared.is_empty() {
            columns.push(age_column("date"));
        }
        for c in declared {
            let text = |k: &str| c[k].as_str().unwrap_or("").to_owned();
            let path = text("jsonPath");
            let Some(parsed) = rfc9535(&path) else {
                // kube-apiserver's table convertor stops at a column whose path does not parse
                // and serves the columns before it (CRD validation only checks the leading `.`).
                tracing::warn!(resource = %info.qualified(), json_path = %path,
                    "a CRD's printer column has an invalid JSONPath; the table ends before it");
                break;
            };
            let description = match text("description") {
                d if d.is_empty() => format!("Custom resource definition column (in JSONPath format): {path}"),
                d => d,
            };
            columns.push(Column {
                definition: json!({"name": text("name"), "type": text("type"), "format": text("format"),
                    "description": description, "priority": c["priority"].as_i64().unwrap_or(0)}),
                source: Source::Path {
                    path: parsed,
                    ty: text("type"),
                },
            });
        }
        TableConvertor { columns }
    }

    /// The `Table` (`meta.k8s.io/<table_version>`) of `objects`, with `list_metadata` (a list's
    /// resourceVersion, continue token, remainingItemCount) or, for one object, its
    /// resourceVersion.
    pub(crate) fn table(
        &self,
        objects: &[&Value],
        list_metadata: Option<&Value>,
        include: IncludeObject,
        table_version: &str,
    ) -> Value {
        let metadata = match list_metadata {
            Some(m) => {
                let mut out = serde_json::Map::new();
                for f in ["resourceVersion", "continue", "remainingItemCount"] {
                    if let Some(v) = m.get(f) {
                        out.insert(f.into(), v.clone());
                    }
                }
                Value::Object(out)
            }
            None => {
                json!({"resourceVersion": objects.first().map(|o| crate::object::resource_version(o)).unwrap_or("")})
            }
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let rows: Vec<Value> = objects
            .iter()
            .map(|obj| {
                // An `events.k8s.io` Event is printed from its core view, as kube-apiserver
                // prints both Event APIs with the core printer (`events.rs`).
                let core_view;
                let printed: &Value = if obj["apiVersion"].as_str() == Some("events.k8s.io/v1") {
                    core_view = crate::events::convert((*obj).clone(), "v1");
                    &core_view
                } else {
                    obj
                };
                let cells: Vec<Value> = self.columns.iter().map(|c| cell(&c.source, printed, now)).collect();
                let mut row = json!({"cells": cells});
                let object = match include {
                    IncludeObject::None => None,
                    IncludeObject::Object => Some((*obj).clone()),
                    IncludeObject::Metadata => {
                        let mut partial = partial_object_metadata(obj);
                        partial["apiVersion"] = json!(format!("meta.k8s.io/{table_version}"));
                        Some(partial)
                    }
                };
                if let Some(o) = object {
                    row["object"] = o;
                }
                row
            })
            .collect();
        json!({
            "kind": "Table",
            "apiVersion": format!("meta.k8s.io/{table_version}"),
            "metadata": metadata,
            "columnDefinitions": self.columns.iter().map(|c| c.definition.clone()).collect::<Vec<_>>(),
            "rows": rows,
        })
    }
}

/// The `Table` answering a GET of `body` (one object, or a list when `list`) of `info`, whose
/// objects are in the request's version; `includeObject` from `q`.
pub(crate) fn render(
    storage: &crate::storage::Storage,
    info: &ResourceInfo,
    body: &Value,
    list: bool,
    q: &crate::request::Query,
    table_version: &str,
) -> Result<Value, ApiError> {
    let include = IncludeObject::from_query(q.get("includeObject"))?;
    let crd = crate::crd::of_resource(&storage.lock(), info);
    let convertor = TableConvertor::for_resource(info, crd.as_deref());
    Ok(if list {
        let items: Vec<&Value> = body["items"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
        convertor.table(&items, body.get("metadata"), include, table_version)
    } else {
        convertor.table(&[body], None, include, table_version)
    })
}

/// What a watch asked for as a `Table` sends: the convertor of `info`, what its rows hold
/// (`includeObject` from `q`) and the Table's version.
pub(crate) fn for_watch(
    storage: &crate::storage::Storage,
    info: &ResourceInfo,
    q: &crate::request::Query,
    table_version: &'static str,
) -> Result<(TableConvertor, IncludeObject, &'static str), ApiError> {
    let include = IncludeObject::from_query(q.get("includeObject"))?;
    let crd = crate::crd::of_resource(&storage.lock(), info);
    Ok((
        TableConvertor::for_resource(info, crd.as_deref()),
        include,
        table_version,
    ))
}

/// One cell, as kube-apiserver's CRD table convertor fills it: `null` (kubectl's `<none>`)
/// when the path finds nothing or the value does not fit the column's type.
fn cell(source: &Source, obj: &Value, now: k8s_openapi::jiff::Timestamp) -> Value {
    match source {
        Source::Name => json!(crate::object::name(obj)),
        Source::Age => json!(age(crate::object::meta_str(obj, "creationTimestamp"), now)),
        Source::Builtin(cell) => cell(obj, now),
        Source::Path { path, ty } => {
            let Some(value) = obj
                .query(path)
                .ok()
                .and_then(|found| found.first().map(|v| (*v).clone()))
            else {
                return Value::Null;
            };
            typed_cell(ty, value, now)
        }
    }
}

/// A found value as a cell of a column of type `ty` (kube-apiserver's `cellForJSONValue`; a
/// `string` column prints any value as JSONPath prints it).
fn typed_cell(ty: &str, value: Value, now: k8s_openapi::jiff::Timestamp) -> Value {
    match (ty, value) {
        (_, Value::Null) => Value::Null,
        ("string", Value::String(s)) => Value::String(s),
        ("string", other) => Value::String(other.to_string()),
        ("integer", Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .map_or(Value::Null, |i| json!(i)),
        ("number", Value::Number(n)) => n.as_f64().map_or(Value::Null, |f| json!(f)),
        ("boolean", Value::Bool(b)) => Value::Bool(b),
        ("date", Value::String(s)) => json!(age(&s, now)),
        _ => Value::Null,
    }
}

/// How long ago an RFC 3339 `timestamp` was, as kube-apiserver's
/// `ConvertToHumanReadableDateType` says it (`<unknown>` for none, `<invalid>` if unparsable).
fn age(timestamp: &str, now: k8s_openapi::jiff::Timestamp) -> String {
    if timestamp.is_empty() {
        return "<unknown>".into();
    }
    match timestamp.parse::<k8s_openapi::jiff::Timestamp>() {
        Ok(t) => human_duration(now.as_second().saturating_sub(t.as_second())),
        Err(_) => "<invalid>".into(),
    }
}

/// apimachinery's `duration.HumanDuration`: two or three significant figures (`90s`, `5m3s`,
/// `3h10m`, `2d4h`, `3y20d`).
fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            d => format!("{}y{d}d", hours / 24 / 365),
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// A Kubernetes JSONPath (`.status.conditions[?(@.type=="Ready")].status`, optionally in
/// `{...}`) in RFC 9535 form (`$['status']['conditions'][?(@.type=="Ready")]['status']`):
/// each `.name` step (with `\.` for a literal dot) becomes `['name']`, bracketed steps are kept.
/// `None` for what is not such a path.
fn rfc9535(path: &str) -> Option<String> {
    let path = path.trim();
    let path = path.strip_prefix('{').and_then(|p| p.strip_suffix('}')).unwrap_or(path);
    let mut out = String::from("$");
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                let mut name = String::new();
                while let Some(&n) = chars.peek() {
                    match n {
                        '\\' => {
                            chars.next();
                            name.push(chars.next()?);
                        }
                        '.' | '[' => break,
                        _ => {
                            name.push(n);
                            chars.next();
                        }
                    }
                }
                if name.is_empty() {
                    return None;
                }
                let quoted = name.replace('\\', "\\\\").replace('\'', "\\'");
                out.push_str(&format!("['{quoted}']"));
            }
            '[' => {
                // Copy through the matching `]`, skipping brackets inside quotes.
                out.push('[');
                let (mut depth, mut quote) = (1usize, None::<char>);
                loop {
                    let n = chars.next()?;
                    out.push(n);
                    match (quote, n) {
                        (Some(q), _) if n == q => quote = None,
                        (Some(_), _) => {}
                        (None, '\'' | '"') => quote = Some(n),
                        (None, '[') => depth += 1,
                        (None, ']') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_jsonpaths_become_rfc9535() {
        assert_eq!(rfc9535(".spec.replicas").unwrap(), "$['spec']['replicas']");
        assert_eq!(
            rfc9535(".status.conditions[?(@.type==\"Ready\")].status").unwrap(),
            "$['status']['conditions'][?(@.type==\"Ready\")]['status']"
        );
        assert_eq!(
            rfc9535("{.metadata.labels.app\\.kubernetes\\.io/name}").unwrap(),
            "$['metadata']['labels']['app.kubernetes.io/name']"
        );
        assert_eq!(rfc9535(".spec.items[0].name").unwrap(), "$['spec']['items'][0]['name']");
        assert!(rfc9535("spec").is_none());
        assert!(rfc9535(".spec[0").is_none());
    }

    #[test]
    fn human_durations_match_apimachinery() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (303, "5m3s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600 + 600, "3h10m"),
            (8 * 3600, "8h"),
            (52 * 3600, "2d4h"),
            (10 * 86400, "10d"),
            (3 * 365 * 86400 + 20 * 86400, "3y20d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn printer_columns_fill_typed_cells() {
        let info = ResourceInfo {
            group: "example.com".into(),
            version: "v1".into(),
            plural: "foos".into(),
            singular: "foo".into(),
            kind: "Foo".into(),
            namespaced: true,
            short_names: vec![],
            status_subresource: false,
            categories: vec![],
            scale: None,
        };
        let crd = json!({"spec": {"versions": [{"name": "v1", "additionalPrinterColumns": [
            {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status", "priority": 1},
            {"name": "Missing", "type": "string", "jsonPath": ".spec.nothing"},
            {"name": "Wrong", "type": "boolean", "jsonPath": ".spec.replicas"},
        ]}]}});
        let obj = json!({"metadata": {"name": "a", "resourceVersion": "5"}, "spec": {"replicas": 3},
            "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        let table = TableConvertor::for_resource(&info, Some(&crd)).table(&[&obj], None, IncludeObject::Metadata, "v1");
        let names: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["Name", "Replicas", "Ready", "Missing", "Wrong"],
            "no Age when columns are declared"
        );
        assert_eq!(table["columnDefinitions"][2]["priority"], 1);
        assert_eq!(table["rows"][0]["cells"], json!(["a", 3, "True", null, null]));
        assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(table["metadata"]["resourceVersion"], "5");
        assert!(
            table["columnDefinitions"][0]["description"]
                .as_str()
                .unwrap()
                .starts_with("Name must be unique within a namespace"),
            "{table}"
        );

        let none = json!({"spec": {"versions": [{"name": "v1"}]}});
        let table = TableConvertor::for_resource(&info, Some(&none)).table(&[&obj], None, IncludeObject::None, "v1");
        assert_eq!(table["columnDefinitions"][1]["name"], "Age");
        assert_eq!(table["columnDefinitions"][1]["type"], "date");
        assert_eq!(table["rows"][0]["cells"], json!(["a", "<unknown>"]));
        assert!(table["rows"][0].get("object").is_none());
    }
}
