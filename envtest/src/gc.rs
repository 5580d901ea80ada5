//! Background garbage collection: dependents whose owners are gone, and namespace deletion.
//!
//! kube-apiserver delegates both to controllers (the garbage collector and the namespace
//! controller in kube-controller-manager); envtest runs one small collector task that wakes after
//! deletes. Dependents (objects whose `ownerReferences` all name uids that no longer exist) are
//! deleted with background propagation; a terminating namespace has its contents deleted and is
//! removed once empty. Objects with finalizers get `deletionTimestamp` and stay until the
//! finalizers are removed. See
//! <https://kubernetes.io/docs/concepts/architecture/garbage-collection/>.

use crate::object;
use crate::storage::{Inner, Storage};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Removes owner references to `uid` from every object (propagationPolicy=Orphan).
pub(crate) fn orphan_dependents(inner: &mut Inner, uid: &str) {
    let dependents: Vec<(String, Value)> = inner
        .all_objects()
        .filter(|(_, o)| object::owner_uids(o).iter().any(|u| u == uid))
        .map(|(k, o)| (k.to_owned(), (**o).clone()))
        .collect();
    for (key, mut obj) in dependents {
        if let Some(refs) = obj
            .get_mut("metadata")
            .and_then(|m| m.get_mut("ownerReferences"))
            .and_then(Value::as_array_mut)
        {
            refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
        }
        inner.put(&key, obj);
    }
}

/// Deletes one object as a background delete would: mark it if it has finalizers, else remove.
fn delete(inner: &mut Inner, key: &str, obj: &Value) {
    if object::is_terminating(obj) {
        return;
    }
    let ns = object::namespace(obj).to_owned();
    let name = object::name(obj).to_owned();
    if object::finalizers(obj).is_empty() {
        inner.remove(key, &ns, &name);
    } else {
        let mut next = obj.clone();
        object::set_meta(&mut next, "deletionTimestamp", Value::String(object::now_timestamp()));
        object::set_meta(&mut next, "deletionGracePeriodSeconds", json!(0));
        inner.put(key, next);
    }
}

/// One collection pass; returns whether anything changed.
pub(crate) fn collect(inner: &mut Inner) -> bool {
    let uids: HashSet<String> = inner.all_objects().map(|(_, o)| object::uid(o).to_owned()).collect();
    let terminating_ns: HashSet<String> = inner
        .objects("/namespaces")
        .map(|m| {
            m.values()
                .filter(|o| object::is_terminating(o))
                .map(|o| object::name(o).to_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut doomed: Vec<(String, Value)> = Vec::new();
    let mut occupied: HashSet<String> = HashSet::new();
    for (key, obj) in inner.all_objects() {
        if key == "/namespaces" {
            continue;
        }
        let ns = object::namespace(obj);
        if terminating_ns.contains(ns) {
            occupied.insert(ns.to_owned());
            doomed.push((key.to_owned(), (**obj).clone()));
            continue;
        }
        let owners = object::owner_uids(obj);
        if !owners.is_empty() && owners.iter().all(|u| !uids.contains(u)) {
            doomed.push((key.to_owned(), (**obj).clone()));
        }
    }
    let mut changed = false;
    for (key, obj) in doomed {
        if !object::is_terminating(&obj) {
            delete(inner, &key, &obj);
            changed = true;
        }
    }
    for ns in terminating_ns {
        if occupied.contains(&ns) {
            continue;
        }
        let still_occupied = inner
            .all_objects()
            .any(|(k, o)| k != "/namespaces" && object::namespace(o) == ns);
        let Some(ns_obj) = inner.get("/namespaces", "", &ns) else {
            continue;
        };
        if !still_occupied && object::finalizers(&ns_obj).is_empty() {
            inner.remove("/namespaces", "", &ns);
            changed = true;
        }
    }
    changed
}

/// Runs the collector until `cancel`: a pass after every wake-up, repeated while it changes
/// something (so deletion cascades through owner chains).
pub(crate) async fn run(storage: Arc<Storage>, wake: Arc<Notify>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = wake.notified() => {}
        }
        for _ in 0..64 {
            let changed = collect(&mut storage.lock());
            if !changed {
                break;
            }
            tokio::task::yield_now().await;
        }
    }
}
