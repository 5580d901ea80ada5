//! Events: `events.k8s.io/v1` and core `v1` Events are two views of one store.
//!
//! Where it sits: between the REST handlers and the store, as a built-in version conversion
//! (`conversion.rs` runs it where it runs a CRD's). kube-apiserver keeps every Event in one
//! etcd resource, `events`, in the core form (its storage factory's cohabiting resources),
//! and serves `events.k8s.io/v1` by converting each object (kubernetes'
//! `pkg/apis/events/v1/conversion.go`). envtest does the same: [`ResourceInfo::key`] names
//! one storage for both resources, objects are stored as core `v1` Events, and a request
//! through `events.k8s.io/v1` has its body converted to the core form before it is stored and
//! every object it reads (get, list, watch, a write's answer) converted back. So an Event a
//! controller records through `events.k8s.io/v1` is listed by `kubectl get events` and shown
//! by `kubectl describe`, and one written through core `v1` is seen by an `events.k8s.io`
//! informer.
//!
//! The fields, `events.k8s.io/v1` ↔ core `v1`: `note` ↔ `message`, `regarding` ↔
//! `involvedObject`, `reportingController` ↔ `reportingComponent`, `deprecatedSource` ↔
//! `source`, `deprecatedFirstTimestamp` ↔ `firstTimestamp`, `deprecatedLastTimestamp` ↔
//! `lastTimestamp`, `deprecatedCount` ↔ `count`; `eventTime`, `series`, `reason`, `type`,
//! `action`, `related` and `reportingInstance` have the same names in both.
//!
//! [`ResourceInfo::key`]: crate::resources::ResourceInfo::key

use serde_json::{Map, Value};

/// The group of the second view.
pub(crate) const EVENTS_GROUP: &str = "events.k8s.io";

/// `(events.k8s.io/v1 field, core v1 field)` for every field whose name differs.
const RENAMED: &[(&str, &str)] = &[
    ("note", "message"),
    ("regarding", "involvedObject"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// The fields a core Event can be selected by besides `metadata.name` and
/// `metadata.namespace` (kube-apiserver's `event.ToSelectableFields`; `source` is
/// `source.component`). Selectors are matched on the stored, core form, so they name the core
/// fields through either view.
const SELECTABLE_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// The field selector fields `info` supports beyond `metadata.name` and `metadata.namespace`.
pub(crate) fn selectable_fields(info: &crate::resources::ResourceInfo) -> &'static [&'static str] {
    if is_event(&info.group, &info.plural) {
        SELECTABLE_FIELDS
    } else {
        &[]
    }
}

/// Whether `(group, plural)` is one of the two Event resources.
pub(crate) fn is_event(group: &str, plural: &str) -> bool {
    plural == "events" && (group.is_empty() || group == EVENTS_GROUP)
}

/// `event` (in either form) in the form of `api_version` (`v1` or `events.k8s.io/v1`), its
/// `apiVersion` set; an object already in that form is returned unchanged.
pub(crate) fn convert(event: Value, api_version: &str) -> Value {
    let Value::Object(mut map) = event else {
        return event;
    };
    if map.get("apiVersion").and_then(Value::as_str) == Some(api_version) {
        return Value::Object(map);
    }
    let to_events_group = api_version.starts_with(EVENTS_GROUP);
    let mut out = Map::with_capacity(map.len());
    for (key, value) in std::mem::take(&mut map) {
        let renamed = RENAMED.iter().find_map(|(group_name, core_name)| {
            if to_events_group {
                (key == *core_name).then_some(*group_name)
            } else {
                (key == *group_name).then_some(*core_name)
            }
        });
        out.insert(renamed.map_or(key, str::to_owned), value);
    }
    out.insert("apiVersion".into(), Value::String(api_version.to_owned()));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_map_both_ways() {
        let group = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "note": "scaled", "regarding": {"kind": "Deployment", "name": "web"},
            "reportingController": "ctl", "reportingInstance": "ctl-1", "reason": "Scaled",
            "type": "Normal", "action": "Scale", "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z"},
            "deprecatedCount": 3, "deprecatedSource": {"component": "c"},
            "deprecatedFirstTimestamp": "2026-01-01T00:00:00Z",
            "deprecatedLastTimestamp": "2026-01-01T00:00:02Z"});
        let core = convert(group.clone(), "v1");
        assert_eq!(
            core,
            json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "e", "namespace": "default"},
                "message": "scaled", "involvedObject": {"kind": "Deployment", "name": "web"},
                "reportingComponent": "ctl", "reportingInstance": "ctl-1", "reason": "Scaled",
                "type": "Normal", "action": "Scale", "eventTime": "2026-01-01T00:00:00.000000Z",
                "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:01.000000Z"},
                "count": 3, "source": {"component": "c"},
                "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:02Z"})
        );
        assert_eq!(convert(core.clone(), "events.k8s.io/v1"), group);
        assert_eq!(convert(core.clone(), "v1"), core, "already in the form");
    }
}
