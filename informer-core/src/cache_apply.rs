//! Applying what the queue pops to the cache (client-go `processDeltas`,
//! `processReplacedAllInfo`), beside the cache it changes (`thread_safe_store.rs`).
//!
//! In the data path: `SharedIndexInformer::process_batch` pops a batch from a partition's queue,
//! takes the store's writer and calls [`apply_item`] for each item; each call changes the cache
//! and appends the notifications the change makes, which `process_batch` then hands to the
//! listeners (`processor.rs`). Nothing here knows about handlers or locks beyond the writer it is
//! given.

use std::collections::HashMap;
use std::sync::Arc;

use kube::Resource;
use tracing::warn;

use crate::delta::{DeletedFinalStateUnknown, Delta, DeltaObject, DeltaType};
use crate::fifo::{QueueItem, ReplacedAll};
use crate::indexer::record_resource_version;
use crate::listener::Notification;
use crate::thread_safe_store::{Content, FastHash, Inner as CacheState, Items, Writer as CacheWriter};
use crate::undecodable::{Undecodable, UndecodableChange};

/// A notification and whether it is a resync (only for handlers due one).
pub(crate) type Outgoing<K> = Vec<(Notification<K>, bool)>;

/// Applies one queue item to the cache, appending the notifications it makes to `out`, the
/// cached objects it removes without a notification holding them to `removed` (so that the
/// caller, not the write lock's holder, decides where they are freed), and the undecodable
/// marks it makes anew (to log once) to `new_marks`.
pub(crate) fn apply_item<K: Resource>(
    cache: &mut CacheWriter<'_, K>,
    item: &QueueItem<K>,
    initial: bool,
    out: &mut Outgoing<K>,
    removed: &mut Vec<Arc<K>>,
    new_marks: &mut Vec<(String, Undecodable)>,
) {
    match item {
        QueueItem::Deltas(deltas) => {
            for delta in &deltas.deltas {
                apply_delta(cache, &deltas.key, delta, initial, out, removed);
            }
        }
        QueueItem::ReplacedAll(replaced) => apply_replaced_all(cache, replaced, initial, out, new_marks),
        QueueItem::Undecodable(UndecodableChange::Marked { key, undecodable }) => {
            // The decoded version cached, if any, stays; handlers hear nothing.
            if !undecodable.resource_version.is_empty() {
                cache.set_resource_version(&undecodable.resource_version);
            }
            if cache.mark(key.clone(), undecodable.clone()) {
                new_marks.push((key.clone(), undecodable.clone()));
            }
        }
        QueueItem::Undecodable(UndecodableChange::Deleted { key, resource_version }) => {
            // The final state did not decode: handlers get the last decoded one as a tombstone.
            if !resource_version.is_empty() {
                cache.set_resource_version(resource_version);
            }
            cache.unmark(key);
            if let Some(old) = cache.remove(key) {
                let tombstone = DeletedFinalStateUnknown {
                    key: key.clone(),
                    obj: old,
                };
                out.push((
                    Notification::Delete(DeltaObject::DeletedFinalStateUnknown(tombstone)),
                    false,
                ));
            }
        }
        QueueItem::SyncAll => {
            // Handlers due a resync get every cached object as it stands now.
            out.extend(cache.values().map(|obj| {
                let update = Notification::Update {
                    old: obj.clone(),
                    new: obj.clone(),
                };
                (update, true)
            }));
        }
        QueueItem::Bookmark(rv) => cache.set_resource_version(rv),
    }
}

fn apply_delta<K: Resource>(
    cache: &mut CacheState<K>,
    key: &str,
    delta: &Delta<K>,
    initial: bool,
    out: &mut Outgoing<K>,
    removed: &mut Vec<Arc<K>>,
) {
    match (delta.kind, &delta.object) {
        (DeltaType::Deleted, object) => {
            // The delete of an object the cache does not hold reaches no handler: none of them
            // was ever told about it (the DeltaFifo drops those when queued; the RealFifo
            // cannot tell then).
            cache.unmark(key);
            if let Some(old) = cache.remove(key) {
                if let DeltaObject::Object(obj) = object {
                    record_resource_version(cache, obj);
                }
                out.push((Notification::Delete(object.clone()), false));
                // The notification holds the delete's final state, not the cached object:
                // that one is freed by the caller, off the write lock.
                removed.push(old);
            }
        }
        (kind, DeltaObject::Object(obj)) => {
            // A version that decoded clears the mark; a Sync re-delivers the cache's own copy
            // and says nothing about the server's version.
            if kind != DeltaType::Sync {
                cache.unmark(key);
            }
            let old = cache.upsert(key, obj.clone());
            // A watch event's resourceVersion is the newest the cache has seen; a Sync or
            // Replaced delta (DeltaFifo) carries an older one.
            if matches!(delta.kind, DeltaType::Added | DeltaType::Updated) {
                record_resource_version(cache, obj);
            }
            match old {
                Some(old) => {
                    // An update that did not change the resourceVersion is a resync (a Sync
                    // delta, or a Replaced one for an unchanged object): only handlers due a
                    // resync get it.
                    let is_sync = old.meta().resource_version == obj.meta().resource_version;
                    out.push((Notification::Update { old, new: obj.clone() }, is_sync));
                }
                None => out.push((
                    Notification::Add {
                        obj: obj.clone(),
                        is_in_initial_list: initial,
                    },
                    false,
                )),
            }
        }
        (kind, DeltaObject::DeletedFinalStateUnknown(t)) => {
            // Only Deleted deltas carry tombstones; anything else is a bug upstream.
            warn!(key = %t.key, ?kind, "tombstone on a non-delete delta ignored");
        }
    }
}

/// Applies a relist (client-go `processReplacedAllInfo`): cached objects missing from the list
/// are deleted with a tombstone, listed ones added or updated, all in one swap of the cache's
/// content. Handlers hear of the deletions first, then of the listed objects in list order.
/// Keys listed but undecodable are present: their cached version, if any, stays, unnotified,
/// and they become the cache's whole set of undecodable marks.
///
/// The diff and the new content are built off the write lock, so readers are not held while
/// it runs; only the swap is (see `thread_safe_store`'s module doc).
fn apply_replaced_all<K: Resource>(
    cache: &mut CacheWriter<'_, K>,
    replaced: &ReplacedAll<K>,
    initial: bool,
    out: &mut Outgoing<K>,
    new_marks: &mut Vec<(String, Undecodable)>,
) {
    let (marks, mut notifications) = cache.replace_off_lock(|cache| diff_replaced_all(cache, replaced, initial));
    new_marks.extend(cache.set_marks(marks));
    cache.set_resource_version(&replaced.resource_version);
    out.append(&mut notifications);
}

/// The undecodable keys of a relist, with why: the cache's whole set of marks after it.
type Marks = HashMap<String, Undecodable>;

/// The new content of a relist, its undecodable marks and its notifications, from the content
/// it replaces (read, not changed).
fn diff_replaced_all<K: Resource>(
    cache: &CacheState<K>,
    replaced: &ReplacedAll<K>,
    initial: bool,
) -> (Content<K>, (Marks, Outgoing<K>)) {
    let mut items = Items::with_capacity_and_hasher(replaced.objects.len(), FastHash::default());
    for (key, obj) in &replaced.objects {
        items.insert(key.clone(), obj.clone());
    }
    let marks: Marks = replaced.undecodable.iter().cloned().collect();
    let mut notifications = Vec::with_capacity(replaced.objects.len());
    for (key, old) in cache.iter() {
        if marks.contains_key(key) && !items.contains_key(key) {
            continue; // present, not decoded: the last decoded version stays
        }
        if !items.contains_key(key) {
            let tombstone = DeletedFinalStateUnknown {
                key: key.clone(),
                obj: old.clone(),
            };
            notifications.push((
                Notification::Delete(DeltaObject::DeletedFinalStateUnknown(tombstone)),
                false,
            ));
        }
    }
    for (key, obj) in &replaced.objects {
        notifications.push(match cache.get(key) {
            Some(old) => {
                let is_sync = old.meta().resource_version == obj.meta().resource_version;
                (
                    Notification::Update {
                        old: old.clone(),
                        new: obj.clone(),
                    },
                    is_sync,
                )
            }
            None => (
                Notification::Add {
                    obj: obj.clone(),
                    is_in_initial_list: initial,
                },
                false,
            ),
        });
    }
    // The last decoded versions of undecodable keys stay (after the listed objects were
    // indexed in list order: they are few).
    let mut kept = Vec::new();
    for key in marks.keys() {
        if !items.contains_key(key)
            && let Some(old) = cache.get(key)
        {
            kept.push((key.clone(), old.clone()));
        }
    }
    // If an index function panics here, nothing has changed and nothing is notified.
    let content = if kept.is_empty() {
        cache.replacement(items, Some(&replaced.objects))
    } else {
        items.extend(kept);
        cache.replacement(items, None)
    };
    (content, (marks, notifications))
}
