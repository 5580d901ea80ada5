//! Field ownership (`metadata.managedFields`) and server-side apply, as kube-apiserver's
//! structured-merge-diff keeps them.
//!
//! Every write records which manager set which fields: a create, update or non-apply patch by
//! manager `m` (the `fieldManager` parameter, else the User-Agent up to its first `/`) makes `m`
//! the owner (`operation: Update`) of every field it changed and takes those fields from every
//! other manager. A server-side apply (`application/apply-patch+yaml`) by `m`:
//! 1. owns exactly the fields of the applied configuration (`operation: Apply`);
//! 2. conflicts (`409 Conflict`, one `FieldManagerConflict` cause per field) when it sets a
//!    field another manager owns to a different value, unless `force=true`, which takes the
//!    field over;
//! 3. removes the fields `m` applied last time and no longer applies, unless another manager
//!    also owns them;
//! 4. merges the configuration into the object: maps by key, associative lists by their keys
//!    (containers by `name`, ports by `containerPort`/`port` and `protocol`, …; a CRD's
//!    `x-kubernetes-list-type: map` by its `x-kubernetes-list-map-keys`), sets by value, and
//!    every other list as one atomic value.
//!
//! Fields are paths of [`Element`]s, rendered in `managedFields` as FieldsV1
//! (`{"f:spec":{"f:replicas":{}}}`, `k:{"name":"c"}` for a list item by key, `v:"x"` for a set
//! item, `.` for an item itself). Not tracked, as in kube-apiserver: `apiVersion`, `kind` and the
//! server-owned metadata (name, namespace, uid, resourceVersion, generation, timestamps,
//! managedFields). Differences: the built-in kinds' list types come from a table of the list
//! fields a controller meets rather than from the full OpenAPI schema, and a map value counts
//! as its leaves only (no `.` member for a map a manager created empty).

use crate::status::ApiError;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Element {
    /// A field of an object (`f:name`).
    Field(String),
    /// An item of an associative list, by its key fields as a JSON object (`k:{...}`).
    Key(String),
    /// An item of a set list, by its value as JSON (`v:...`).
    Value(String),
}

/// A field path.
pub(crate) type Path = Vec<Element>;
/// A set of field paths (what one manager owns).
pub(crate) type FieldSet = BTreeSet<Path>;

/// How a list's items are identified.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ListType {
    /// The whole list is one value.
    Atomic,
    /// Items are scalars identified by value.
    Set,
    /// Items are objects identified by these fields.
    Map(Vec<String>),
}

/// Where list types come from: a CRD version's schema, or the built-in table.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Schema<'a> {
    /// A built-in kind.
    BuiltIn,
    /// A custom resource, with the schema node of the current value.
    Custom(&'a Value),
    /// A custom resource's root: its `metadata` is ObjectMeta (finalizers a set, owner
    /// references by uid), whatever the CRD's schema says of it.
    CustomRoot(&'a Value),
}

impl<'a> Schema<'a> {
    fn child(self, key: &str) -> Schema<'a> {
        match self {
            Schema::BuiltIn => Schema::BuiltIn,
            Schema::CustomRoot(_) if key == "metadata" => Schema::BuiltIn,
            Schema::Custom(s) | Schema::CustomRoot(s) => Schema::Custom(
                s.get("properties")
                    .and_then(|p| p.get(key))
                    .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
                    .unwrap_or(&Value::Null),
            ),
        }
    }

    fn items(self) -> Schema<'a> {
        match self {
            Schema::BuiltIn => Schema::BuiltIn,
            Schema::Custom(s) | Schema::CustomRoot(s) => Schema::Custom(s.get("items").unwrap_or(&Value::Null)),
        }
    }

    /// The list type of `field` (whose value is `items`) under this node.
    fn list_type(self, field: &str, items: &[Value]) -> ListType {
        match self {
            Schema::Custom(s) | Schema::CustomRoot(s) => {
                let list = s.get("properties").and_then(|p| p.get(field)).unwrap_or(&Value::Null);
                match list.get("x-kubernetes-list-type").and_then(Value::as_str) {
                    Some("map") => ListType::Map(
                        list.get("x-kubernetes-list-map-keys")
                            .and_then(Value::as_array)
                            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                            .unwrap_or_default(),
                    ),
                    Some("set") => ListType::Set,
                    _ => ListType::Atomic,
                }
            }
            Schema::BuiltIn => built_in_list_type(field, items),
        }
    }
}

/// The associative and set lists of the built-in kinds that controllers write, by field name
/// (kube-apiserver's `x-kubernetes-list-map-keys`/patch merge keys for these fields).
fn built_in_list_type(field: &str, items: &[Value]) -> ListType {
    let keys = |k: &[&str]| ListType::Map(k.iter().map(|s| (*s).to_owned()).collect());
    let has = |f: &str| items.iter().all(|i| i.get(f).is_some()) && !items.is_empty();
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => keys(&["name"]),
        "volumeMounts" => keys(&["mountPath"]),
        "volumeDevices" => keys(&["devicePath"]),
        "conditions" => keys(&["type"]),
        "ownerReferences" => keys(&["uid"]),
        "hostAliases" => keys(&["ip"]),
        "topologySpreadConstraints" => keys(&["topologyKey", "whenUnsatisfiable"]),
        "ports" if has("containerPort") => keys(&["containerPort", "protocol"]),
        "ports" if has("port") => keys(&["port", "protocol"]),
        "finalizers" => ListType::Set,
        _ => ListType::Atomic,
    }
}

/// Top-level and metadata fields the server owns: never tracked.
fn untracked(path: &[&str]) -> bool {
    matches!(
        path,
        ["apiVersion"]
            | ["kind"]
            | [
                "metadata",
                "name" | "namespace" | "uid" | "resourceVersion" | "generation"
            ]
            | [
                "metadata",
                "creationTimestamp" | "deletionTimestamp" | "deletionGracePeriodSeconds"
            ]
            | ["metadata", "managedFields" | "selfLink" | "generateName"]
    )
}

/// The key of an associative list item: its key fields, as compact JSON. A port's `protocol`
/// key defaults to `TCP` (as the server defaults it), so a configuration that leaves it out
/// names the stored port.
fn item_key(item: &Value, keys: &[String]) -> String {
    let mut m = Map::new();
    for k in keys {
        match item.get(k) {
            Some(v) => {
                m.insert(k.clone(), v.clone());
            }
            None if k == "protocol" => {
                m.insert(k.clone(), json!("TCP"));
            }
            None => {}
        }
    }
    Value::Object(m).to_string()
}

/// Whether `item` is the one `key` names (a missing `protocol` is `TCP`).
fn key_matches(item: &Value, key: &Map<String, Value>) -> bool {
    key.iter().all(|(kf, kv)| match item.get(kf) {
        Some(v) => v == kv,
        None => kf == "protocol" && kv == "TCP",
    })
}

/// Every field path set in `obj` (its leaves, plus each list item by key or value).
pub(crate) fn fields_of(obj: &Value, schema: Schema<'_>) -> FieldSet {
    let mut out = FieldSet::new();
    let mut names = Vec::new();
    walk(obj, schema, &mut Vec::new(), &mut names, &mut out);
    out
}

fn walk(v: &Value, schema: Schema<'_>, path: &mut Path, names: &mut Vec<String>, out: &mut FieldSet) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                names.push(k.clone());
                let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
                if !untracked(&name_refs) && !child.is_null() {
                    path.push(Element::Field(k.clone()));
                    match child {
                        Value::Array(items) => {
                            list(items, schema.list_type(k, items), schema.child(k), path, names, out)
                        }
                        _ => walk(child, schema.child(k), path, names, out),
                    }
                    path.pop();
                }
                names.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

fn list(
    items: &[Value],
    ty: ListType,
    schema: Schema<'_>,
    path: &mut Path,
    names: &mut Vec<String>,
    out: &mut FieldSet,
) {
    match ty {
        ListType::Atomic => {
            out.insert(path.clone());
        }
        ListType::Set => {
            for item in items {
                path.push(Element::Value(item.to_string()));
                out.insert(path.clone());
                path.pop();
            }
        }
        ListType::Map(keys) => {
            for item in items {
                path.push(Element::Key(item_key(item, &keys)));
                out.insert(path.clone());
                names.push(String::new());
                walk(item, schema.items(), path, names, out);
                names.pop();
                path.pop();
            }
        }
    }
}

/// The value at `path` in `obj`, if set.
fn get<'a>(obj: &'a Value, path: &[Element]) -> Option<&'a Value> {
    let mut cur = obj;
    for e in path {
        cur = match e {
            Element::Field(f) => cur.get(f)?,
            Element::Key(k) => {
                let key: Map<String, Value> = serde_json::from_str(k).ok()?;
                cur.as_array()?.iter().find(|i| key_matches(i, &key))?
            }
            Element::Value(v) => {
                let value: Value = serde_json::from_str(v).ok()?;
                cur.as_array()?.iter().find(|i| **i == value)?
            }
        };
    }
    Some(cur)
}

/// Whether `path` ends in a key field of the list item it is in (`k:{"name":"c"}` / `f:name`).
fn is_key_field(path: &[Element]) -> bool {
    match path {
        [.., Element::Key(k), Element::Field(f)] => serde_json::from_str::<Map<String, Value>>(k)
            .map(|key| key.contains_key(f))
            .unwrap_or(false),
        _ => false,
    }
}

/// Removes the value at `path` from `obj` (a list item by key or value, or an object field).
fn remove(obj: &mut Value, path: &[Element]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for e in parents {
        let next = match e {
            Element::Field(f) => cur.get_mut(f),
            Element::Key(k) => {
                let Ok(key) = serde_json::from_str::<Map<String, Value>>(k) else {
                    return;
                };
                cur.as_array_mut()
                    .and_then(|a| a.iter_mut().find(|i| key_matches(i, &key)))
            }
            Element::Value(_) => None,
        };
        let Some(next) = next else { return };
        cur = next;
    }
    match last {
        Element::Field(f) => {
            if let Some(m) = cur.as_object_mut() {
                m.remove(f);
            }
        }
        Element::Key(k) => {
            if let (Ok(key), Some(a)) = (serde_json::from_str::<Map<String, Value>>(k), cur.as_array_mut()) {
                a.retain(|i| !key_matches(i, &key));
            }
        }
        Element::Value(v) => {
            if let (Ok(value), Some(a)) = (serde_json::from_str::<Value>(v), cur.as_array_mut()) {
                a.retain(|i| *i != value);
            }
        }
    }
}

/// Merges an applied configuration into `live`: objects by key, associative lists by item key,
/// sets by value, anything else replaced.
fn merge(live: &mut Value, applied: &Value, schema: Schema<'_>) {
    let (Some(l), Some(a)) = (live.as_object_mut(), applied.as_object()) else {
        *live = applied.clone();
        return;
    };
    for (k, av) in a {
        match (l.get_mut(k), av) {
            (Some(lv @ Value::Object(_)), Value::Object(_)) => merge(lv, av, schema.child(k)),
            (Some(Value::Array(litems)), Value::Array(aitems)) => match schema.list_type(k, aitems) {
                ListType::Atomic => *litems = aitems.clone(),
                ListType::Set => {
                    for i in aitems {
                        if !litems.contains(i) {
                            litems.push(i.clone());
                        }
                    }
                }
                ListType::Map(keys) => {
                    for ai in aitems {
                        let key = item_key(ai, &keys);
                        match litems.iter_mut().find(|li| item_key(li, &keys) == key) {
                            Some(li) => merge(li, ai, schema.child(k).items()),
                            None => litems.push(ai.clone()),
                        }
                    }
                }
            },
            _ => {
                l.insert(k.clone(), av.clone());
            }
        }
    }
}

/// A path as kube-apiserver prints it in a conflict: `.spec.containers[name="c"].image`.
fn render(path: &[Element]) -> String {
    let mut s = String::new();
    for e in path {
        match e {
            Element::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Element::Key(k) => {
                let key: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = key.iter().map(|(kf, kv)| format!("{kf}={kv}")).collect();
                s.push_str(&format!("[{}]", parts.join(",")));
            }
            Element::Value(v) => s.push_str(&format!("[={v}]")),
        }
    }
    s
}

/// FieldsV1 of a set: a tree of `f:`/`k:`/`v:` keys, `{}` at leaves, `.` where an item itself
/// is a member and has children.
pub(crate) fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for e in path {
            let key = match e {
                Element::Field(f) => format!("f:{f}"),
                Element::Key(k) => format!("k:{k}"),
                Element::Value(v) => format!("v:{v}"),
            };
            let entry = node.entry(key).or_insert_with(|| Value::Object(Map::new()));
            let Some(next) = entry.as_object_mut() else { break };
            node = next;
        }
    }
    // An item that is a member and has children says so with ".".
    fn mark(node: &mut Map<String, Value>, set: &FieldSet, path: &mut Path) {
        for (k, child) in node.iter_mut() {
            let e = match k.split_at_checked(2) {
                Some(("f:", f)) => Element::Field(f.to_owned()),
                Some(("k:", x)) => Element::Key(x.to_owned()),
                Some(("v:", x)) => Element::Value(x.to_owned()),
                _ => continue,
            };
            path.push(e);
            if let Some(c) = child.as_object_mut()
                && !c.is_empty()
            {
                mark(c, set, path);
                if set.contains(path) {
                    c.insert(".".into(), json!({}));
                }
            }
            path.pop();
        }
    }
    mark(&mut root, set, &mut Vec::new());
    Value::Object(root)
}

/// The set a FieldsV1 tree names.
pub(crate) fn from_fields_v1(v: &Value) -> FieldSet {
    fn go(node: &Value, path: &mut Path, out: &mut FieldSet) {
        let Some(map) = node.as_object() else { return };
        for (k, child) in map {
            if k == "." {
                out.insert(path.clone());
                continue;
            }
            let e = match k.split_at_checked(2) {
                Some(("f:", f)) => Element::Field(f.to_owned()),
                Some(("k:", x)) => Element::Key(x.to_owned()),
                Some(("v:", x)) => Element::Value(x.to_owned()),
                _ => continue,
            };
            path.push(e);
            if child.as_object().is_some_and(Map::is_empty) {
                out.insert(path.clone());
            } else {
                go(child, path, out);
            }
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    go(v, &mut Vec::new(), &mut out);
    out
}

/// One `managedFields` entry, decoded.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    subresource: String,
    time: Value,
    fields: FieldSet,
}

impl Entry {
    fn same_owner(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    fn to_json(&self) -> Value {
        let mut e = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(&self.fields),
        });
        if !self.subresource.is_empty() {
            e["subresource"] = json!(self.subresource);
        }
        e
    }
}

/// The entry of `writer`'s `operation` in `list`, created empty if it has none, stamped with
/// the time and apiVersion of this write.
fn own<'l>(list: &'l mut Vec<Entry>, writer: &Writer<'_>, operation: &str) -> &'l mut Entry {
    let at = match list
        .iter()
        .position(|e| e.same_owner(writer.manager, operation, writer.subresource))
    {
        Some(i) => i,
        None => {
            list.push(Entry {
                manager: writer.manager.to_owned(),
                operation: operation.to_owned(),
                api_version: String::new(),
                subresource: writer.subresource.to_owned(),
                time: Value::Null,
                fields: FieldSet::new(),
            });
            list.len() - 1
        }
    };
    let e = &mut list[at];
    e.time = json!(crate::object::now_timestamp());
    e.api_version = writer.api_version.clone();
    e
}

fn entries(obj: &Value) -> Vec<Entry> {
    obj.get("metadata")
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            Entry {
                manager: s("manager"),
                operation: s("operation"),
                api_version: s("apiVersion"),
                subresource: s("subresource"),
                time: e.get("time").cloned().unwrap_or(Value::Null),
                fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
            }
        })
        .collect()
}

fn store(obj: &mut Value, list: &[Entry]) {
    let list: Vec<Value> = list
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(Entry::to_json)
        .collect();
    if list.is_empty() {
        crate::object::remove_meta(obj, "managedFields");
    } else {
        crate::object::set_meta(obj, "managedFields", Value::Array(list));
    }
}

/// Who writes and how: the manager, the object's apiVersion, and the subresource (`""` or
/// `status`).
#[derive(Debug, Clone)]
pub(crate) struct Writer<'a> {
    /// The field manager.
    pub(crate) manager: &'a str,
    /// `apiVersion` of the request.
    pub(crate) api_version: String,
    /// `""`, or the subresource written.
    pub(crate) subresource: &'a str,
}

/// Records an Update by `writer` that turned `cur` (`None` for a create) into `new`: the
/// manager gains every field it changed, the others lose them. Leaves `new`'s managedFields
/// as they were when nothing but managedFields changed.
pub(crate) fn record_update(cur: Option<&Value>, new: &mut Value, writer: &Writer<'_>, schema: Schema<'_>) {
    let mut list = cur.map(entries).unwrap_or_default();
    let before = cur.map(|c| fields_of(c, schema)).unwrap_or_default();
    let after = fields_of(new, schema);
    let changed: FieldSet = after
        .iter()
        .filter(|p| cur.is_none_or(|c| get(c, p) != get(new, p)))
        .cloned()
        .collect();
    let removed: FieldSet = before.difference(&after).cloned().collect();
    if changed.is_empty() && removed.is_empty() {
        let keep = cur.and_then(|c| c.get("metadata")).and_then(|m| m.get("managedFields"));
        match keep {
            Some(k) => crate::object::set_meta(new, "managedFields", k.clone()),
            None => crate::object::remove_meta(new, "managedFields"),
        }
        return;
    }
    for e in &mut list {
        e.fields.retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    own(&mut list, writer, "Update").fields.extend(changed);
    store(new, &list);
}

/// Server-side apply of `config` by `writer` onto `cur` (`None`: the object does not exist).
/// Returns the object to write, managedFields included, or the `409` of the conflicts.
pub(crate) fn apply(
    cur: Option<&Value>,
    config: &Value,
    writer: &Writer<'_>,
    force: bool,
    schema: Schema<'_>,
    resource: &str,
    name: &str,
) -> Result<Value, ApiError> {
    let mut list = cur.map(entries).unwrap_or_default();
    // A null in an apply configuration sets nothing (typed clients send `creationTimestamp:
    // null`); it neither owns nor deletes a field.
    let config = &without_nulls(config);
    let applied = fields_of(config, schema);
    let empty = json!({});
    let live = cur.unwrap_or(&empty);
    // Conflicts: another manager owns a field this configuration sets to a different value.
    let mut conflicts: BTreeMap<String, Vec<(String, Path)>> = BTreeMap::new();
    for e in &list {
        if e.same_owner(writer.manager, "Apply", writer.subresource) {
            continue;
        }
        for p in e.fields.intersection(&applied) {
            // Paths in a set are leaves (a scalar, an atomic list, an empty object) or list items;
            // a leaf conflicts when the two values differ.
            let differs = match (get(config, p), get(live, p)) {
                (Some(a), Some(l)) => a != l,
                (Some(_), None) => true,
                _ => false,
            };
            // A list item by key is a member without a value of its own.
            let is_item = matches!(p.last(), Some(Element::Key(_)));
            if differs && !is_item {
                conflicts
                    .entry(e.manager.clone())
                    .or_default()
                    .push((e.api_version.clone(), p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(&conflicts, resource, name));
    }
    // Forcing takes over exactly the conflicting fields; equal values stay shared.
    if force {
        for e in &mut list {
            if let Some(taken) = conflicts.get(&e.manager)
                && !e.same_owner(writer.manager, "Apply", writer.subresource)
            {
                e.fields.retain(|p| !taken.iter().any(|(_, t)| t == p));
            }
        }
    }
    // Removal: what this manager applied before and applies no more, owned by nobody else.
    let mut next = live.clone();
    let previous: FieldSet = list
        .iter()
        .find(|e| e.same_owner(writer.manager, "Apply", writer.subresource))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: FieldSet = list
        .iter()
        .filter(|e| !e.same_owner(writer.manager, "Apply", writer.subresource))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let gone: Vec<&Path> = previous
        .iter()
        .filter(|p| !applied.contains(*p) && !others.contains(*p))
        // Keep an item whose children someone else still owns, and a kept item's key fields.
        .filter(|p| !others.iter().any(|o| o.len() > p.len() && o.starts_with(p)))
        .filter(|p| !is_key_field(p))
        .collect();
    // Remove only the topmost paths: an item's fields go with the item (and the item could not
    // be found by its key once its key field were gone).
    for p in &gone {
        if !gone.iter().any(|q| q.len() < p.len() && p.starts_with(q)) {
            remove(&mut next, p);
        }
    }
    merge(&mut next, config, schema);
    own(&mut list, writer, "Apply").fields = applied;
    // An apply that changes nothing (same object, same ownership) keeps managedFields, times
    // included, so it is a no-op write: no new resourceVersion, no watch event.
    let unchanged_object = without_managed_fields(&next) == without_managed_fields(live);
    let original = cur.map(entries).unwrap_or_default();
    let same_ownership = original.len() == list.iter().filter(|e| !e.fields.is_empty()).count()
        && original.iter().all(|o| {
            list.iter()
                .any(|e| e.same_owner(&o.manager, &o.operation, &o.subresource) && e.fields == o.fields)
        });
    if cur.is_some() && unchanged_object && same_ownership {
        return Ok(live.clone());
    }
    store(&mut next, &list);
    Ok(next)
}

fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| (k.clone(), without_nulls(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

fn without_managed_fields(obj: &Value) -> Value {
    let mut o = obj.clone();
    crate::object::remove_meta(&mut o, "managedFields");
    o
}

/// The `409` of an apply's conflicts, worded as kube-apiserver words it.
fn conflict_error(conflicts: &BTreeMap<String, Vec<(String, Path)>>, resource: &str, name: &str) -> ApiError {
    let total: usize = conflicts.values().map(Vec::len).sum();
    let mut causes = Vec::new();
    let mut parts = Vec::new();
    for (manager, fields) in conflicts {
        let api_version = fields.first().map(|(v, _)| v.as_str()).unwrap_or("");
        for (_, p) in fields {
            causes.push(json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with {manager:?} using {api_version}"),
                "field": render(p),
            }));
        }
        if fields.len() == 1 {
            parts.push(format!(
                "conflict with {manager:?} using {api_version}: {}",
                render(&fields[0].1)
            ));
        } else {
            let list: Vec<String> = fields.iter().map(|(_, p)| format!("- {}", render(p))).collect();
            parts.push(format!(
                "conflicts with {manager:?} using {api_version}:\n{}",
                list.join("\n")
            ));
        }
    }
    let message = format!(
        "Apply failed with {total} conflict{}: {}",
        if total == 1 { "" } else { "s" },
        parts.join("\n")
    );
    ApiError::with_details(
        409,
        "Conflict",
        message,
        json!({"name": name, "kind": resource, "causes": causes}),
    )
}

/// The manager of a request: `fieldManager`, else the User-Agent up to its first `/`.
pub(crate) fn manager_of(field_manager: Option<&str>, user_agent: Option<&str>) -> String {
    match field_manager.filter(|m| !m.is_empty()) {
        Some(m) => m.to_owned(),
        None => user_agent
            .and_then(|u| u.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(m: &str) -> Writer<'_> {
        Writer {
            manager: m,
            api_version: "apps/v1".into(),
            subresource: "",
        }
    }

    /// Applies `config` to `cur` as `manager`, on a Deployment named web.
    fn apply_as(cur: Option<&Value>, config: &Value, manager: &str, force: bool) -> Result<Value, ApiError> {
        apply(
            cur,
            config,
            &writer(manager),
            force,
            Schema::BuiltIn,
            "deployments.apps",
            "web",
        )
    }

    fn deployment(replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    #[test]
    fn field_sets_round_trip_through_fields_v1() {
        let set = fields_of(&deployment(1, "i"), Schema::BuiltIn);
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1,
            json!({"f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
        );
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn apply_owns_merges_and_removes_what_it_no_longer_applies() {
        let first = apply_as(None, &deployment(2, "nginx:1"), "a", false).unwrap();
        let mut config = deployment(2, "nginx:1");
        config["metadata"]["labels"] = json!({});
        config["metadata"].as_object_mut().unwrap().remove("labels");
        let second = apply_as(Some(&first), &config, "a", false).unwrap();
        assert!(
            second["metadata"].get("labels").is_none_or(|l| l.get("app").is_none()),
            "{second}"
        );
        assert_eq!(second["spec"]["replicas"], 2);
        let entries = entries(&second);
        assert_eq!(entries.len(), 1);
        assert_eq!(
            (entries[0].manager.as_str(), entries[0].operation.as_str()),
            ("a", "Apply")
        );
    }

    #[test]
    fn a_second_manager_conflicts_unless_it_forces() {
        let first = apply_as(None, &deployment(2, "nginx:1"), "a", false).unwrap();
        let same = apply_as(Some(&first), &deployment(2, "nginx:1"), "b", false);
        assert!(same.is_ok(), "equal values are shared, not conflicts");
        let err = apply_as(Some(&first), &deployment(3, "nginx:1"), "b", false).unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(
            err.message,
            r#"Apply failed with 1 conflict: conflict with "a" using apps/v1: .spec.replicas"#
        );
        let replicas_only = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 3}});
        let forced = apply_as(Some(&first), &replicas_only, "b", true).unwrap();
        assert_eq!(forced["spec"]["replicas"], 3);
        let a = entries(&forced).into_iter().find(|e| e.manager == "a").unwrap();
        assert!(
            !a.fields.iter().any(|p| render(p) == ".spec.replicas"),
            "forced away from a"
        );
    }

    #[test]
    fn ports_without_protocol_are_the_stored_tcp_ports() {
        let mut config = deployment(1, "nginx:1");
        config["spec"]["template"]["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80}]);
        let first = apply_as(None, &config, "a", false).unwrap();
        // The server defaults protocol; the next apply must find the same port.
        let mut stored = first.clone();
        stored["spec"]["template"]["spec"]["containers"][0]["ports"] =
            json!([{"containerPort": 80, "protocol": "TCP"}]);
        let second = apply_as(Some(&stored), &config, "a", false).unwrap();
        assert_eq!(
            second["spec"]["template"]["spec"]["containers"][0]["ports"],
            json!([{"containerPort": 80, "protocol": "TCP"}])
        );
        assert_eq!(second, stored, "a re-apply of the same configuration is a no-op");
    }

    #[test]
    fn forcing_takes_only_the_conflicting_fields() {
        let first = apply_as(None, &deployment(3, "x"), "a", false).unwrap();
        let forced = apply_as(Some(&first), &deployment(5, "x"), "b", true).unwrap();
        let a = entries(&forced).into_iter().find(|e| e.manager == "a").unwrap();
        let owned: Vec<String> = a.fields.iter().map(|p| render(p)).collect();
        assert!(!owned.contains(&".spec.replicas".to_owned()));
        assert!(
            owned.iter().any(|p| p.ends_with(".image")),
            "the shared image stays a's too: {owned:?}"
        );
    }

    #[test]
    fn updates_take_the_fields_they_change() {
        let first = apply_as(None, &deployment(2, "nginx:1"), "a", false).unwrap();
        let mut next = first.clone();
        next["spec"]["replicas"] = json!(5);
        record_update(Some(&first), &mut next, &writer("kubectl-scale"), Schema::BuiltIn);
        let list = entries(&next);
        let scale = list.iter().find(|e| e.manager == "kubectl-scale").unwrap();
        assert_eq!(scale.operation, "Update");
        assert_eq!(
            scale.fields.iter().map(|p| render(p)).collect::<Vec<_>>(),
            [".spec.replicas"]
        );
        let a = list.iter().find(|e| e.manager == "a").unwrap();
        assert!(!a.fields.iter().any(|p| render(p) == ".spec.replicas"));
        // No change: managedFields as they were.
        let mut same = next.clone();
        record_update(Some(&next), &mut same, &writer("other"), Schema::BuiltIn);
        assert_eq!(same, next);
    }

    #[test]
    fn managers_come_from_the_parameter_or_the_user_agent() {
        assert_eq!(manager_of(Some("ctl"), Some("kubectl/v1.32")), "ctl");
        assert_eq!(manager_of(None, Some("kubectl/v1.32.4 (linux/amd64)")), "kubectl");
        assert_eq!(manager_of(Some(""), None), "unknown");
    }
}
