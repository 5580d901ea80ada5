//! DeltaFIFO: a queue of the changes to each object, by key (client-go `delta_fifo.go`).
//!
//! The reflector writes every event into it; the informer pops one key at a time and gets
//! all of that key's changes since the last pop, oldest first ([`Deltas`]). Keeping
//! per-key history instead of only the latest object is what lets the informer tell a delete
//! from an update and deliver both even when they arrive back to back.
//!
//! Two mechanisms need the informer's cache (the *known objects*):
//! - [`replace`](Store::replace) after a relist queues a `Deleted` delta carrying a
//!   [`DeletedFinalStateUnknown`] tombstone for every key the cache has but the list lacks:
//!   the watch missed that delete, and the last state we saw is all we have.
//! - [`resync`](Store::resync) re-queues a `Sync` delta for every cached object, except keys
//!   that already have queued deltas: those will be delivered anyway, and a `Sync` carrying
//!   the cache's older copy queued after them would roll the object back.
//!
//! An object that does not decode (see [`undecodable`](crate::undecodable)) has no delta: its
//! key holds a pending [`UndecodableChange`] beside its deltas, popped with them and applied
//! after them. A later delta of the key (other than a `Sync`) drops the pending mark, since
//! the informer clears the mark when it applies that delta anyway. `replace` counts the keys
//! it could not decode as present (no tombstone for them), marks them, and clears the marks of
//! keys it no longer lists.
//!
//! ```
//! use std::sync::Arc;
//! use informer_core::{DeltaFifo, DeltaFifoOptions, DeltaType, Indexer, Queue, QueueItem, Store};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let cache: Indexer<ConfigMap> = Indexer::default();
//! let fifo = DeltaFifo::new(
//!     DeltaFifoOptions::default()
//!         .known_objects(Arc::new(cache.clone()))
//!         .emit_delta_type_replaced(true),
//! );
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("a".into());
//! fifo.add(Arc::new(cm.clone())).unwrap();
//! fifo.delete(Arc::new(cm)).unwrap();
//! let mut process = |batch: &[QueueItem<ConfigMap>], _initial: bool| {
//!     let QueueItem::Deltas(deltas) = &batch[0] else { panic!("a DeltaFifo pops Deltas") };
//!     let kinds: Vec<DeltaType> = deltas.deltas.iter().map(|d| d.kind).collect();
//!     assert_eq!(kinds, [DeltaType::Added, DeltaType::Deleted]); // both, oldest first
//!     Ok(())
//! };
//! fifo.pop(&mut process).await.unwrap().unwrap();
//! # });
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;
use kube::Resource;
use tokio::sync::Notify;

use crate::delta::{DeletedFinalStateUnknown, Delta, DeltaObject, DeltaType, Deltas};
use crate::fifo::{PopError, ProcessError, ProcessFn, Queue, QueueItem};
use crate::store::{KnownObjects, Store, StoreError, meta_namespace_key};
use crate::undecodable::{Undecodable, UndecodableChange};

/// Options for a [`DeltaFifo`] (client-go `DeltaFIFOOptions`). Build them with `Default` and
/// the setters.
#[non_exhaustive]
pub struct DeltaFifoOptions<K> {
    /// The informer's cache, used by `replace` to find deletions and by `resync`.
    pub known_objects: Option<Arc<dyn KnownObjects<K>>>,
    /// Queue `Replaced` instead of `Sync` for listed objects (informers turn this on).
    pub emit_delta_type_replaced: bool,
}

impl<K> Default for DeltaFifoOptions<K> {
    fn default() -> Self {
        DeltaFifoOptions {
            known_objects: None,
            emit_delta_type_replaced: false,
        }
    }
}

impl<K> DeltaFifoOptions<K> {
    /// Sets the informer's cache, used by `replace` and `resync`.
    #[must_use]
    pub fn known_objects(mut self, known_objects: Arc<dyn KnownObjects<K>>) -> Self {
        self.known_objects = Some(known_objects);
        self
    }

    /// Queue `Replaced` (true) or `Sync` (false) for listed objects.
    #[must_use]
    pub fn emit_delta_type_replaced(mut self, emit: bool) -> Self {
        self.emit_delta_type_replaced = emit;
        self
    }
}

/// The queue of per-key changes (client-go `DeltaFIFO`).
pub struct DeltaFifo<K> {
    inner: Mutex<Inner<K>>,
    /// Wakes a waiting `pop` when an item is queued or the queue closes.
    not_empty: Notify,
    known_objects: Option<Arc<dyn KnownObjects<K>>>,
    emit_delta_type_replaced: bool,
}

/// The state under the lock.
///
/// Invariants: every key in `items` or `marks` is in `queue` exactly once and vice versa;
/// every entry of `items` holds at least one delta; `initial_population_count` only decreases
/// once `populated` is set.
struct Inner<K> {
    items: HashMap<String, Vec<Delta<K>>>,
    /// A change to the key's undecodable mark, to apply after the key's deltas.
    marks: HashMap<String, UndecodableChange>,
    queue: VecDeque<String>,
    /// Set by the first `replace`, or by any add/update/delete before it.
    populated: bool,
    /// Items queued by the first `replace` not yet popped.
    initial_population_count: usize,
    closed: bool,
}

impl<K: Resource + Send + Sync + 'static> DeltaFifo<K> {
    /// An empty queue.
    pub fn new(options: DeltaFifoOptions<K>) -> Self {
        DeltaFifo {
            inner: Mutex::new(Inner {
                items: HashMap::new(),
                marks: HashMap::new(),
                queue: VecDeque::new(),
                populated: false,
                initial_population_count: 0,
                closed: false,
            }),
            not_empty: Notify::new(),
            known_objects: options.known_objects,
            emit_delta_type_replaced: options.emit_delta_type_replaced,
        }
    }

    // Every method restores the invariants before it can panic (key computation happens before
    // any mutation), so a poisoned lock is taken over rather than propagated.
    fn lock(&self) -> MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The number of keys queued.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queued keys, in pop order.
    pub fn list_keys(&self) -> Vec<String> {
        self.lock().queue.iter().cloned().collect()
    }

    /// A copy of the deltas queued for `key`.
    pub fn get_by_key(&self, key: &str) -> Option<Deltas<K>> {
        let inner = self.lock();
        inner.items.get(key).map(|d| Deltas {
            key: key.to_string(),
            deltas: d.clone(),
        })
    }

    /// Checks the invariants documented on the queue's state; for tests.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let inner = self.lock();
        let queued: HashSet<&String> = inner.queue.iter().collect();
        if queued.len() != inner.queue.len() {
            return Err("a key is queued twice".into());
        }
        let pending: HashSet<&String> = inner.items.keys().chain(inner.marks.keys()).collect();
        if queued != pending {
            return Err("queue and items disagree".into());
        }
        if inner.items.values().any(Vec::is_empty) {
            return Err("an item has no deltas".into());
        }
        Ok(())
    }

    /// Queues an add or update delta for `obj` and wakes a waiting pop.
    fn queue_change(&self, kind: DeltaType, obj: Arc<K>) -> Result<(), StoreError> {
        let key = meta_namespace_key(obj.as_ref())?;
        let mut inner = self.lock();
        Self::ensure_open(&inner)?;
        inner.populated = true;
        inner.queue_action(key, kind, DeltaObject::Object(obj));
        drop(inner);
        self.not_empty.notify_waiters();
        Ok(())
    }

    fn ensure_open(inner: &Inner<K>) -> Result<(), StoreError> {
        if inner.closed { Err(StoreError::Closed) } else { Ok(()) }
    }
}

impl<K> Inner<K> {
    /// Appends a delta to `key`, collapsing a repeated delete, and queues the key if new. A
    /// delta other than `Sync` supersedes the key's pending mark: applying it clears the mark.
    fn queue_action(&mut self, key: String, kind: DeltaType, object: DeltaObject<K>) {
        let mark_pending = if kind == DeltaType::Sync {
            self.marks.contains_key(&key)
        } else {
            self.marks.remove(&key).is_some()
        };
        match self.items.get_mut(&key) {
            Some(deltas) => {
                deltas.push(Delta { kind, object });
                dedup_deltas(deltas);
            }
            None => {
                self.items.insert(key.clone(), vec![Delta { kind, object }]);
                if !mark_pending {
                    self.queue.push_back(key);
                }
            }
        }
    }

    /// Sets the key's pending mark change (the newest wins) and queues the key if new.
    fn queue_mark(&mut self, change: UndecodableChange) {
        let key = change.key().to_string();
        if !self.items.contains_key(&key) && !self.marks.contains_key(&key) {
            self.queue.push_back(key.clone());
        }
        self.marks.insert(key, change);
    }

    /// Whether `key` has deltas or a mark change queued.
    fn is_queued(&self, key: &str) -> bool {
        self.items.contains_key(key) || self.marks.contains_key(key)
    }

    fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }
}

/// Collapses the two newest deltas when both are deletes (client-go `dedupDeltas`): the
/// older one is kept unless it is a tombstone, since a real final state carries more
/// information than a tombstone's last known state.
fn dedup_deltas<K>(deltas: &mut Vec<Delta<K>>) {
    let n = deltas.len();
    if n < 2 {
        return;
    }
    if deltas[n - 1].kind == DeltaType::Deleted && deltas[n - 2].kind == DeltaType::Deleted {
        let newest = deltas.pop();
        if let Some(newest) = newest
            && deltas[n - 2].object.is_tombstone()
        {
            deltas[n - 2] = newest;
        }
    }
}

impl<K: Resource + Send + Sync + 'static> Store<K> for DeltaFifo<K> {
    fn add(&self, obj: Arc<K>) -> Result<(), StoreError> {
        self.queue_change(DeltaType::Added, obj)
    }

    fn update(&self, obj: Arc<K>) -> Result<(), StoreError> {
        self.queue_change(DeltaType::Updated, obj)
    }

    /// Queues a delete. A delete of a key neither cached nor queued is dropped: there is
    /// nothing downstream that could still hold it.
    fn delete(&self, obj: Arc<K>) -> Result<(), StoreError> {
        let key = meta_namespace_key(obj.as_ref())?;
        let mut inner = self.lock();
        Self::ensure_open(&inner)?;
        inner.populated = true;
        let queued = inner.items.contains_key(&key);
        let known = match &self.known_objects {
            Some(known) => known.get_by_key(&key).is_some(),
            None => false,
        };
        if !queued && !known {
            // Nothing downstream holds the object, but a mark may remain to clear.
            let marked = inner.marks.contains_key(&key)
                || self
                    .known_objects
                    .as_ref()
                    .is_some_and(|known| known.undecodable_keys().contains(&key));
            if marked {
                let resource_version = obj.meta().resource_version.clone().unwrap_or_default();
                inner.queue_mark(UndecodableChange::Deleted { key, resource_version });
                drop(inner);
                self.not_empty.notify_waiters();
            }
            return Ok(());
        }
        inner.queue_action(key, DeltaType::Deleted, DeltaObject::Object(obj));
        drop(inner);
        self.not_empty.notify_waiters();
        Ok(())
    }

    fn replace(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), StoreError> {
        self.replace_with_undecodable(list, Vec::new(), resource_version)
    }

    /// Queues the listed objects, tombstones for the known keys missing from the list, a mark
    /// for each key that did not decode (present: no tombstone, the cached version stays), and
    /// the clearing of every other mark, queued or cached.
    fn replace_with_undecodable(
        &self,
        list: Vec<Arc<K>>,
        undecodable: Vec<(String, Undecodable)>,
        _resource_version: &str,
    ) -> Result<(), StoreError> {
        // Keys first, so an object without a name fails the call before anything changes.
        let mut keyed = Vec::with_capacity(list.len());
        for obj in list {
            keyed.push((meta_namespace_key(obj.as_ref())?, obj));
        }
        let kind = if self.emit_delta_type_replaced {
            DeltaType::Replaced
        } else {
            DeltaType::Sync
        };
        let cached_marks = match &self.known_objects {
            Some(known) => known.undecodable_keys(),
            None => Vec::new(),
        };
        let mut inner = self.lock();
        Self::ensure_open(&inner)?;
        // Every key this replace queues something for: the initial population.
        let mut touched: HashSet<String> = HashSet::with_capacity(keyed.len() + undecodable.len());
        for (key, obj) in keyed {
            touched.insert(key.clone());
            inner.queue_action(key, kind, DeltaObject::Object(obj));
        }
        // Present, though not decoded: never taken for deletions.
        let mut present = touched.clone();
        for (key, undecodable) in undecodable {
            present.insert(key.clone());
            touched.insert(key.clone());
            inner.queue_mark(UndecodableChange::Marked { key, undecodable });
        }

        // Deletions the watch missed: first keys still queued (their newest delta is the last
        // state we saw), then keys only the cache holds.
        let queued_missing: Vec<(String, Arc<K>)> = inner
            .items
            .iter()
            .filter(|(key, _)| !present.contains(*key))
            .filter_map(|(key, deltas)| {
                let newest = deltas.last()?;
                if newest.kind == DeltaType::Deleted {
                    return None; // already queued as deleted
                }
                Some((key.clone(), newest.object.object().clone()))
            })
            .collect();
        for (key, obj) in queued_missing {
            touched.insert(key.clone());
            let tombstone = DeletedFinalStateUnknown { key: key.clone(), obj };
            inner.queue_action(
                key,
                DeltaType::Deleted,
                DeltaObject::DeletedFinalStateUnknown(tombstone),
            );
        }
        if let Some(known) = &self.known_objects {
            for key in known.list_keys() {
                if present.contains(&key) || inner.items.contains_key(&key) {
                    continue;
                }
                let Some(obj) = known.get_by_key(&key) else { continue };
                touched.insert(key.clone());
                let tombstone = DeletedFinalStateUnknown { key: key.clone(), obj };
                inner.queue_action(
                    key,
                    DeltaType::Deleted,
                    DeltaObject::DeletedFinalStateUnknown(tombstone),
                );
            }
        }
        // Marks of keys no longer listed, pending or cached, are cleared (after the key's
        // tombstone, if it has one).
        let stale_marks: Vec<String> = inner
            .marks
            .keys()
            .filter(|key| !present.contains(*key))
            .cloned()
            .chain(cached_marks.into_iter().filter(|key| !present.contains(key)))
            .collect();
        for key in stale_marks {
            touched.insert(key.clone());
            inner.queue_mark(UndecodableChange::Deleted {
                key,
                resource_version: String::new(),
            });
        }

        if !inner.populated {
            inner.populated = true;
            inner.initial_population_count = touched.len();
        }
        drop(inner);
        self.not_empty.notify_waiters();
        Ok(())
    }

    /// Queues the mark after the key's queued deltas.
    fn mark_undecodable(&self, key: String, undecodable: Undecodable) -> Result<(), StoreError> {
        let mut inner = self.lock();
        Self::ensure_open(&inner)?;
        inner.populated = true;
        inner.queue_mark(UndecodableChange::Marked { key, undecodable });
        drop(inner);
        self.not_empty.notify_waiters();
        Ok(())
    }

    /// Queues the delete: a tombstone carrying the last state queued or cached, if any (the
    /// final state did not decode, so it is unknown), and the clearing of the mark.
    fn delete_undecodable(&self, key: String, resource_version: &str) -> Result<(), StoreError> {
        let cached = match &self.known_objects {
            Some(known) => known.get_by_key(&key),
            None => None,
        };
        let mut inner = self.lock();
        Self::ensure_open(&inner)?;
        inner.populated = true;
        let last_state = match inner.items.get(&key).and_then(|deltas| deltas.last()) {
            Some(newest) if newest.kind == DeltaType::Deleted => None,
            Some(newest) => Some(newest.object.object().clone()),
            None => cached,
        };
        if let Some(obj) = last_state {
            let tombstone = DeletedFinalStateUnknown { key: key.clone(), obj };
            inner.queue_action(
                key.clone(),
                DeltaType::Deleted,
                DeltaObject::DeletedFinalStateUnknown(tombstone),
            );
        }
        inner.queue_mark(UndecodableChange::Deleted {
            key,
            resource_version: resource_version.to_string(),
        });
        drop(inner);
        self.not_empty.notify_waiters();
        Ok(())
    }

    fn resync(&self) -> Result<(), StoreError> {
        let Some(known) = &self.known_objects else {
            return Ok(());
        };
        let mut inner = self.lock();
        Self::ensure_open(&inner)?;
        let mut queued_any = false;
        for key in known.list_keys() {
            // A key with queued deltas will be delivered anyway; a Sync carrying the cache's
            // older copy behind them would deliver stale state last.
            if inner.is_queued(&key) {
                continue;
            }
            let Some(obj) = known.get_by_key(&key) else { continue };
            inner.queue_action(key, DeltaType::Sync, DeltaObject::Object(obj));
            queued_any = true;
        }
        drop(inner);
        if queued_any {
            self.not_empty.notify_waiters();
        }
        Ok(())
    }
}

impl<K: Resource + Send + Sync + 'static> Queue<K> for DeltaFifo<K> {
    fn pop<'a>(
        &'a self,
        process: &'a mut ProcessFn<'_, K>,
    ) -> BoxFuture<'a, Result<Result<(), ProcessError>, PopError>> {
        Box::pin(async move {
            loop {
                let notified = self.not_empty.notified();
                tokio::pin!(notified);
                // Register for wake-ups before looking, so an add between the look and the
                // wait is not missed.
                notified.as_mut().enable();
                {
                    let mut inner = self.lock();
                    if let Some(key) = inner.queue.pop_front() {
                        let is_in_initial_list = !inner.has_synced();
                        let deltas = inner.items.remove(&key).filter(|d| !d.is_empty());
                        let mark = inner.marks.remove(&key);
                        if inner.initial_population_count > 0 {
                            inner.initial_population_count -= 1;
                        }
                        // The key's deltas, then its mark change.
                        let mut batch = Vec::with_capacity(2);
                        if let Some(deltas) = deltas {
                            batch.push(QueueItem::Deltas(Deltas {
                                key: key.clone(),
                                deltas,
                            }));
                        }
                        if let Some(mark) = mark {
                            batch.push(QueueItem::Undecodable(mark));
                        }
                        if batch.is_empty() {
                            continue; // unreachable by the invariants; skip rather than panic
                        }
                        // `process` runs under the lock, as in client-go: `has_synced` must not
                        // report the initial list done while its last item is mid-processing.
                        let result = process(&batch, is_in_initial_list);
                        if let Err(ProcessError::Requeue(_)) = &result
                            && !inner.is_queued(&key)
                        {
                            inner.queue.push_back(key.clone());
                            for item in batch {
                                match item {
                                    QueueItem::Deltas(deltas) => {
                                        inner.items.insert(key.clone(), deltas.deltas);
                                    }
                                    QueueItem::Undecodable(mark) => {
                                        inner.marks.insert(key.clone(), mark);
                                    }
                                    _ => {}
                                }
                            }
                        }
                        return Ok(result);
                    }
                    if inner.closed {
                        return Err(PopError::Closed);
                    }
                }
                notified.await;
            }
        })
    }

    fn has_synced(&self) -> bool {
        self.lock().has_synced()
    }

    fn close(&self) {
        self.lock().closed = true;
        self.not_empty.notify_waiters();
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::indexer::Indexer;
    use crate::testing::configmap as cm;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn fifo_with(known: &Indexer<ConfigMap>) -> DeltaFifo<ConfigMap> {
        DeltaFifo::new(DeltaFifoOptions {
            known_objects: Some(Arc::new(known.clone())),
            emit_delta_type_replaced: true,
        })
    }

    /// Pops one item, returning its key, delta kinds and whether it was in the initial list.
    async fn pop(fifo: &DeltaFifo<ConfigMap>) -> (String, Vec<DeltaType>, bool) {
        let mut out = None;
        let mut process = |batch: &[QueueItem<ConfigMap>], initial: bool| {
            let QueueItem::Deltas(d) = &batch[0] else {
                panic!("a DeltaFifo pops Deltas")
            };
            out = Some((d.key.clone(), d.deltas.iter().map(|d| d.kind).collect(), initial));
            Ok(())
        };
        fifo.pop(&mut process).await.expect("open").expect("processed");
        out.expect("popped")
    }

    #[tokio::test]
    async fn deltas_accumulate_per_key_oldest_first_and_keys_stay_fifo() {
        let fifo = fifo_with(&Indexer::default());
        fifo.add(cm("a", "1")).unwrap();
        fifo.add(cm("b", "2")).unwrap();
        fifo.update(cm("a", "3")).unwrap();
        fifo.delete(cm("a", "3")).unwrap();
        fifo.check_invariants().unwrap();
        assert_eq!(fifo.list_keys(), ["ns/a", "ns/b"]);
        let (key, kinds, _) = pop(&fifo).await;
        assert_eq!(key, "ns/a");
        assert_eq!(kinds, [DeltaType::Added, DeltaType::Updated, DeltaType::Deleted]);
        assert_eq!(pop(&fifo).await.0, "ns/b");
        assert!(fifo.is_empty());
    }

    fn tombstone(name: &str, rv: &str) -> DeltaObject<ConfigMap> {
        DeltaObject::DeletedFinalStateUnknown(DeletedFinalStateUnknown {
            key: format!("ns/{name}"),
            obj: cm(name, rv),
        })
    }

    #[test]
    fn two_deletes_collapse_keeping_the_real_object_over_a_tombstone() {
        let delete = |object| Delta {
            kind: DeltaType::Deleted,
            object,
        };
        // Real delete, then a tombstone: the real final state is kept.
        let mut deltas = vec![delete(DeltaObject::Object(cm("a", "5"))), delete(tombstone("a", "4"))];
        dedup_deltas(&mut deltas);
        assert_eq!(deltas.len(), 1);
        assert!(!deltas[0].object.is_tombstone());
        // Tombstone, then a real delete: the real one replaces it.
        let mut deltas = vec![delete(tombstone("a", "4")), delete(DeltaObject::Object(cm("a", "7")))];
        dedup_deltas(&mut deltas);
        assert_eq!(deltas.len(), 1);
        assert_eq!(
            deltas[0].object.object().metadata.resource_version.as_deref(),
            Some("7")
        );
        // Two real deletes: the older is kept (client-go's isDeletionDup).
        let mut deltas = vec![
            delete(DeltaObject::Object(cm("a", "5"))),
            delete(DeltaObject::Object(cm("a", "6"))),
        ];
        dedup_deltas(&mut deltas);
        assert_eq!(deltas.len(), 1);
        assert_eq!(
            deltas[0].object.object().metadata.resource_version.as_deref(),
            Some("5")
        );
        // An update between deletes is not collapsed.
        let mut deltas = vec![
            delete(DeltaObject::Object(cm("a", "5"))),
            Delta {
                kind: DeltaType::Added,
                object: DeltaObject::Object(cm("a", "6")),
            },
            delete(DeltaObject::Object(cm("a", "7"))),
        ];
        dedup_deltas(&mut deltas);
        assert_eq!(deltas.len(), 3);
    }

    #[tokio::test]
    async fn a_delete_queued_behind_a_relist_tombstone_collapses_with_it() {
        let known = Indexer::default();
        known.add(cm("a", "1")).unwrap();
        let fifo = fifo_with(&known);
        fifo.replace(vec![], "6").unwrap();
        fifo.delete(cm("a", "7")).unwrap();
        let deltas = fifo.get_by_key("ns/a").unwrap();
        assert_eq!(deltas.deltas.len(), 1);
        assert!(!deltas.deltas[0].object.is_tombstone());
    }

    #[tokio::test]
    async fn delete_of_an_unknown_unqueued_key_is_dropped() {
        let fifo = fifo_with(&Indexer::default());
        fifo.delete(cm("ghost", "1")).unwrap();
        assert!(fifo.is_empty());
    }

    #[tokio::test]
    async fn replace_queues_tombstones_for_known_objects_missing_from_the_list() {
        let known = Indexer::default();
        known.add(cm("kept", "1")).unwrap();
        known.add(cm("gone", "2")).unwrap();
        let fifo = fifo_with(&known);
        fifo.replace(vec![cm("kept", "3"), cm("new", "4")], "4").unwrap();
        fifo.check_invariants().unwrap();

        let gone = fifo.get_by_key("ns/gone").unwrap();
        assert_eq!(gone.deltas.len(), 1);
        assert_eq!(gone.deltas[0].kind, DeltaType::Deleted);
        match &gone.deltas[0].object {
            DeltaObject::DeletedFinalStateUnknown(t) => {
                assert_eq!(t.key, "ns/gone");
                assert_eq!(t.obj.metadata.resource_version.as_deref(), Some("2"));
            }
            other => panic!("expected a tombstone, got {other:?}"),
        }
        assert_eq!(fifo.get_by_key("ns/kept").unwrap().deltas[0].kind, DeltaType::Replaced);
        assert_eq!(fifo.get_by_key("ns/new").unwrap().deltas[0].kind, DeltaType::Replaced);
    }

    #[tokio::test]
    async fn replace_tombstones_queued_keys_missing_from_the_list() {
        let fifo = fifo_with(&Indexer::default());
        fifo.add(cm("queued", "1")).unwrap();
        fifo.replace(vec![], "2").unwrap();
        let kinds: Vec<_> = fifo
            .get_by_key("ns/queued")
            .unwrap()
            .deltas
            .iter()
            .map(|d| d.kind)
            .collect();
        assert_eq!(kinds, [DeltaType::Added, DeltaType::Deleted]);
    }

    #[tokio::test]
    async fn replace_without_replaced_type_emits_sync() {
        let fifo: DeltaFifo<ConfigMap> = DeltaFifo::new(DeltaFifoOptions::default());
        fifo.replace(vec![cm("a", "1")], "1").unwrap();
        assert_eq!(fifo.get_by_key("ns/a").unwrap().deltas[0].kind, DeltaType::Sync);
    }

    #[tokio::test]
    async fn has_synced_only_after_the_initial_population_is_popped() {
        let known = Indexer::default();
        known.add(cm("stale", "1")).unwrap();
        let fifo = fifo_with(&known);
        assert!(!fifo.has_synced(), "not populated yet");
        fifo.replace(vec![cm("a", "2"), cm("b", "3")], "3").unwrap();
        // Two listed objects plus one queued deletion.
        assert!(!fifo.has_synced());
        assert!(pop(&fifo).await.2, "first item is in the initial list");
        assert!(pop(&fifo).await.2);
        assert!(!fifo.has_synced());
        assert!(pop(&fifo).await.2);
        assert!(fifo.has_synced());
        // A second replace does not reset the initial population.
        fifo.replace(vec![cm("a", "4")], "4").unwrap();
        assert!(fifo.has_synced());
        assert!(!pop(&fifo).await.2, "later items are not in the initial list");
    }

    #[tokio::test]
    async fn resync_skips_keys_with_pending_deltas() {
        let known = Indexer::default();
        known.add(cm("a", "1")).unwrap();
        known.add(cm("b", "1")).unwrap();
        let fifo = fifo_with(&known);
        fifo.update(cm("a", "2")).unwrap();
        fifo.resync().unwrap();
        let a: Vec<_> = fifo.get_by_key("ns/a").unwrap().deltas.iter().map(|d| d.kind).collect();
        assert_eq!(a, [DeltaType::Updated], "no Sync queued behind a pending update");
        let b = fifo.get_by_key("ns/b").unwrap();
        assert_eq!(b.deltas[0].kind, DeltaType::Sync);
        assert_eq!(
            b.deltas[0].object.object().metadata.resource_version.as_deref(),
            Some("1")
        );
    }

    #[tokio::test]
    async fn requeue_puts_the_item_back() {
        let fifo = fifo_with(&Indexer::default());
        fifo.add(cm("a", "1")).unwrap();
        let mut process = |_: &[QueueItem<ConfigMap>], _| Err(ProcessError::Requeue("later".into()));
        let result = fifo.pop(&mut process).await.unwrap();
        assert!(matches!(result, Err(ProcessError::Requeue(_))));
        assert_eq!(fifo.list_keys(), ["ns/a"]);
        fifo.check_invariants().unwrap();
    }

    #[tokio::test]
    async fn pop_waits_for_an_item_and_close_wakes_it() {
        let fifo = Arc::new(fifo_with(&Indexer::default()));
        let waiter = {
            let fifo = fifo.clone();
            tokio::spawn(async move {
                let mut process = |_: &[QueueItem<ConfigMap>], _| Ok(());
                fifo.pop(&mut process).await.map(|_| ())
            })
        };
        tokio::task::yield_now().await;
        fifo.add(cm("a", "1")).unwrap();
        assert_eq!(waiter.await.unwrap(), Ok(()));

        let waiter = {
            let fifo = fifo.clone();
            tokio::spawn(async move {
                let mut process = |_: &[QueueItem<ConfigMap>], _| Ok(());
                fifo.pop(&mut process).await.map(|_| ())
            })
        };
        tokio::task::yield_now().await;
        fifo.close();
        assert_eq!(waiter.await.unwrap(), Err(PopError::Closed));
        assert_eq!(fifo.add(cm("b", "2")), Err(StoreError::Closed));
    }

    #[tokio::test]
    async fn an_object_without_a_name_is_a_typed_error() {
        let fifo = fifo_with(&Indexer::default());
        let nameless = Arc::new(ConfigMap::default());
        assert!(matches!(fifo.add(nameless.clone()), Err(StoreError::Key(_))));
        assert!(matches!(
            fifo.replace(vec![cm("a", "1"), nameless], "1"),
            Err(StoreError::Key(_))
        ));
        assert!(fifo.is_empty(), "a failed replace changes nothing");
    }

    /// Pops one key: its delta kinds (empty if it had none) and its mark change, if any.
    async fn pop_with_mark(fifo: &DeltaFifo<ConfigMap>) -> (Vec<DeltaType>, Option<UndecodableChange>) {
        let mut out = None;
        let mut process = |batch: &[QueueItem<ConfigMap>], _initial: bool| {
            let mut kinds = Vec::new();
            let mut mark = None;
            for item in batch {
                match item {
                    QueueItem::Deltas(d) => kinds.extend(d.deltas.iter().map(|d| d.kind)),
                    QueueItem::Undecodable(change) => mark = Some(change.clone()),
                    _ => panic!("a DeltaFifo pops Deltas and marks"),
                }
            }
            out = Some((kinds, mark));
            Ok(())
        };
        fifo.pop(&mut process).await.expect("open").expect("processed");
        out.expect("popped")
    }

    fn marked(key: &str, rv: &str) -> UndecodableChange {
        UndecodableChange::Marked {
            key: key.into(),
            undecodable: Undecodable::new(rv, "invalid type: x"),
        }
    }

    #[tokio::test]
    async fn a_mark_pops_after_its_keys_deltas_and_a_later_delta_supersedes_it() {
        let fifo = fifo_with(&Indexer::default());
        fifo.add(cm("a", "1")).unwrap();
        fifo.mark_undecodable("ns/a".into(), Undecodable::new("2", "invalid type: x"))
            .unwrap();
        fifo.mark_undecodable("ns/b".into(), Undecodable::new("3", "invalid type: x"))
            .unwrap();
        fifo.update(cm("b", "4")).unwrap();
        fifo.check_invariants().unwrap();
        assert_eq!(fifo.list_keys(), ["ns/a", "ns/b"], "one queue slot per key");
        let (kinds, mark) = pop_with_mark(&fifo).await;
        assert_eq!(kinds, [DeltaType::Added]);
        let Some(UndecodableChange::Marked { key, undecodable }) = mark else {
            panic!("a's mark, after its delta")
        };
        assert_eq!((key.as_str(), undecodable.resource_version.as_str()), ("ns/a", "2"));
        assert_eq!(
            pop_with_mark(&fifo).await,
            (vec![DeltaType::Updated], None),
            "b decoded after its mark: the mark is superseded"
        );
        assert!(fifo.is_empty());
        fifo.check_invariants().unwrap();
    }

    #[tokio::test]
    async fn replace_keeps_undecodable_keys_present_and_clears_stale_marks() {
        let cache = Indexer::default();
        cache.add(cm("kept", "1")).unwrap();
        cache.add(cm("gone", "1")).unwrap();
        cache
            .mark_undecodable("ns/stale".into(), Undecodable::new("1", "invalid type: x"))
            .unwrap();
        let fifo = fifo_with(&cache);
        fifo.replace_with_undecodable(
            vec![],
            vec![("ns/kept".into(), Undecodable::new("5", "invalid type: x"))],
            "5",
        )
        .unwrap();
        fifo.check_invariants().unwrap();
        let mut popped = Vec::new();
        for _ in 0..3 {
            let key = fifo.list_keys()[0].clone();
            popped.push((key, pop_with_mark(&fifo).await));
        }
        popped.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            popped,
            [
                ("ns/gone".to_string(), (vec![DeltaType::Deleted], None)),
                ("ns/kept".to_string(), (vec![], Some(marked("ns/kept", "5")))),
                (
                    "ns/stale".to_string(),
                    (
                        vec![],
                        Some(UndecodableChange::Deleted {
                            key: "ns/stale".into(),
                            resource_version: String::new()
                        })
                    )
                ),
            ],
            "no tombstone for the undecodable key; the stale mark is cleared"
        );
        assert!(fifo.has_synced(), "marks count in the initial population");
    }

    #[tokio::test]
    async fn the_delete_of_an_undecodable_object_carries_its_last_state_as_a_tombstone() {
        let cache = Indexer::default();
        cache.add(cm("a", "1")).unwrap();
        let fifo = fifo_with(&cache);
        fifo.delete_undecodable("ns/a".into(), "2").unwrap();
        fifo.add(cm("a", "3")).unwrap();
        // Recreated after: the delete (a tombstone of the cached state) comes first.
        let (kinds, mark) = pop_with_mark(&fifo).await;
        assert_eq!(kinds, [DeltaType::Deleted, DeltaType::Added]);
        assert_eq!(mark, None, "the recreate supersedes the mark's clearing");
        fifo.check_invariants().unwrap();
    }
}
