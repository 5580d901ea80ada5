//! The JSON patch a mutating webhook answers, computed from the typed object its handler
//! returned, so users edit a typed object and never write patches.
//!
//! Where it sits: between the handler's result and the `AdmissionResponse`. Diffing the request's
//! raw object against the serialized result would be wrong for a typed `K`: fields `K` does not
//! know (added by a newer API version, or another webhook) would vanish from the serialized
//! result and become `remove` operations, and fields `K` serializes that the raw object lacks
//! (an empty list, a `null`) would become spurious `add`s. So the handler's *change* is taken
//! from two serializations of `K` (before and after), replayed onto the raw object ([`rebase`]),
//! and the patch is the diff of the raw object against that (json-patch's `diff`). What the
//! handler did not touch stays byte-for-byte as the API server sent it, inside list items too:
//! a changed list is replayed item by item (by index), so appending a sidecar container or
//! editing one item keeps the fields `K` does not know in every other item, and in the edited
//! one. Items are matched by index because that is all two typed serializations can tell: a
//! handler that reorders a list sees each moved item as a change at its new index, so that
//! item's unknown fields come from the raw item that was at that index (or are dropped, for an
//! index the raw list lacks). controller-runtime
//! reaches a similar end by dropping every `remove` operation of its defaulter's patch by
//! default; here a handler may still remove a field it knows.

use serde_json::Value;

/// `raw` with the change from `before` to `after` applied: where `before` and `after` are equal
/// `raw` is kept; where both are objects, keys are compared one by one (a key `after` dropped
/// is removed from `raw`); where all three are arrays and `raw` has as many items as `before`,
/// items are rebased index by index (items `after` adds are taken from it, items it dropped
/// from the end are removed); anywhere else (a changed scalar, or `raw` has another shape
/// there) `after`'s value is taken whole.
pub(crate) fn rebase(raw: &Value, before: &Value, after: &Value) -> Value {
    if before == after {
        return raw.clone();
    }
    match (raw, before, after) {
        (Value::Object(raw), Value::Object(before), Value::Object(after)) => {
            let mut out = raw.clone();
            for key in before.keys() {
                if !after.contains_key(key) {
                    out.remove(key);
                }
            }
            for (key, new) in after {
                let merged = match (raw.get(key), before.get(key)) {
                    (Some(raw_value), Some(old)) => rebase(raw_value, old, new),
                    _ => new.clone(),
                };
                // A key the typed object serializes but the raw object lacks, unchanged by the
                // handler (e.g. an empty list `K` writes by default), stays absent.
                if raw.get(key).is_none() && before.get(key) == Some(new) {
                    continue;
                }
                out.insert(key.clone(), merged);
            }
            Value::Object(out)
        }
        // `before` is `raw` read as `K`: a typed list keeps every item, so equal lengths say
        // index `i` of `before` is index `i` of `raw`.
        (Value::Array(raw), Value::Array(before), Value::Array(after)) if raw.len() == before.len() => Value::Array(
            after
                .iter()
                .enumerate()
                .map(|(i, new)| match (raw.get(i), before.get(i)) {
                    (Some(raw_item), Some(old)) => rebase(raw_item, old, new),
                    _ => new.clone(),
                })
                .collect(),
        ),
        _ => after.clone(),
    }
}

/// The JSON patch from `raw` to `raw` with the handler's change (`before` → `after`) applied.
pub(crate) fn patch(raw: &Value, before: &Value, after: &Value) -> json_patch::Patch {
    json_patch::diff(raw, &rebase(raw, before, after))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn untouched_unknown_fields_stay_and_defaults_are_not_added() {
        let raw = json!({"metadata": {"name": "a"}, "spec": {"replicas": 1, "future": true}});
        // `K` does not know `spec.future` and writes an empty `tags`.
        let before = json!({"metadata": {"name": "a"}, "spec": {"replicas": 1, "tags": []}});
        let after = json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"replicas": 1, "tags": []}});
        let patched = rebase(&raw, &before, &after);
        assert_eq!(
            patched,
            json!({"metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"replicas": 1, "future": true}})
        );
        let ops = serde_json::to_value(patch(&raw, &before, &after)).unwrap();
        assert_eq!(
            ops,
            json!([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}])
        );
    }

    #[test]
    fn changed_and_removed_fields() {
        let raw = json!({"spec": {"replicas": 1, "image": "a", "extra": 1}});
        let before = json!({"spec": {"replicas": 1, "image": "a"}});
        let after = json!({"spec": {"replicas": 3}});
        assert_eq!(
            rebase(&raw, &before, &after),
            json!({"spec": {"replicas": 3, "extra": 1}})
        );
    }

    #[test]
    fn unknown_fields_inside_list_items_survive_an_append_and_an_edit() {
        // `K` does not know the containers' `future` field.
        let raw = json!({"spec": {"containers": [
            {"name": "app", "image": "a", "future": 1},
            {"name": "log", "image": "l", "future": 2},
        ]}});
        let before = json!({"spec": {"containers": [
            {"name": "app", "image": "a"},
            {"name": "log", "image": "l"},
        ]}});
        // Appends a sidecar.
        let appended = json!({"spec": {"containers": [
            {"name": "app", "image": "a"},
            {"name": "log", "image": "l"},
            {"name": "proxy", "image": "p"},
        ]}});
        assert_eq!(
            rebase(&raw, &before, &appended),
            json!({"spec": {"containers": [
                {"name": "app", "image": "a", "future": 1},
                {"name": "log", "image": "l", "future": 2},
                {"name": "proxy", "image": "p"},
            ]}})
        );
        let ops = serde_json::to_value(patch(&raw, &before, &appended)).unwrap();
        assert_eq!(
            ops,
            json!([{"op": "add", "path": "/spec/containers/2", "value": {"name": "proxy", "image": "p"}}])
        );
        // Edits one item.
        let edited = json!({"spec": {"containers": [
            {"name": "app", "image": "a2"},
            {"name": "log", "image": "l"},
        ]}});
        assert_eq!(
            rebase(&raw, &before, &edited),
            json!({"spec": {"containers": [
                {"name": "app", "image": "a2", "future": 1},
                {"name": "log", "image": "l", "future": 2},
            ]}})
        );
        // Drops the last one.
        let dropped = json!({"spec": {"containers": [{"name": "app", "image": "a"}]}});
        assert_eq!(
            rebase(&raw, &before, &dropped),
            json!({"spec": {"containers": [{"name": "app", "image": "a", "future": 1}]}})
        );
    }

    #[test]
    fn a_field_added_where_raw_has_none() {
        let raw = json!({"spec": {}});
        let before = json!({"spec": {"tags": []}});
        let after = json!({"spec": {"tags": ["x"]}});
        assert_eq!(rebase(&raw, &before, &after), json!({"spec": {"tags": ["x"]}}));
    }
}
