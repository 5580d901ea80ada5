//! RealFIFO: every change, in the order it happened (client-go `the_real_fifo.go`, with the
//! `InOrderInformers`, `AtomicFIFO` and `UnlockWhileProcessing` behaviour client-go 1.36 turns
//! on by default). kinformer's informers use it unless configured otherwise.
//!
//! Where the [`DeltaFifo`](crate::DeltaFifo) keeps one entry per key and folds later changes
//! into it, the RealFifo is a plain log: each watch event is one [`QueueItem::Deltas`] holding
//! one [`Delta`], and nothing is coalesced, so handlers see every change in the order the server
//! made it, across keys too. A relist, a resync and a bookmark are *one* item each
//! ([`QueueItem::ReplacedAll`], [`QueueItem::SyncAll`], [`QueueItem::Bookmark`]): the informer
//! applies a relist to its cache under one write lock, working out the deletions the watch
//! missed against the cache *at that point of the log*, so a reader never sees half of a relist
//! and no queued event can be mistaken for a deletion. An object that does not decode travels
//! the same way: a mark (or the delete of a marked key) is one [`QueueItem::Undecodable`] in
//! the log, and a relist carries the keys it could not decode in its `ReplacedAll`, so that
//! they are not taken for deletions (see [`undecodable`](crate::undecodable)). That is also
//! why the RealFifo needs no view of the informer's cache (client-go's `KnownObjects`): the
//! informer works deletions and resyncs out when it applies the item.
//!
//! [`pop`](Queue::pop) takes up to [`batch_size`](RealFifo::with_batch_size) items (never
//! mixing the initial population with later items) and runs the processing function *without*
//! the queue's lock, so the reflector keeps appending while the cache is updated and handlers
//! are notified. [`has_synced`](Queue::has_synced) turns true once everything the first
//! `replace` queued (and whatever was queued before it) has been processed, or at once if an
//! add/update/delete came before any `replace`, as in client-go.
//!
//! Unlike client-go, which keeps the lock while processing once more than two batches are
//! queued (to slow the reflector down), the RealFifo never blocks the reflector: applying a
//! batch is cache updates and buffer appends (handlers run on their own listeners), so the
//! consumer keeps up, and blocking would stall a tokio worker thread instead of a goroutine.
//!
//! ```
//! use std::sync::Arc;
//! use informer_core::{DeltaType, Queue, QueueItem, RealFifo, Store};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let fifo: RealFifo<ConfigMap> = RealFifo::new();
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("a".into());
//! fifo.add(Arc::new(cm.clone())).unwrap();
//! fifo.update(Arc::new(cm.clone())).unwrap();
//! fifo.delete(Arc::new(cm)).unwrap();
//! let mut kinds = Vec::new();
//! let mut process = |batch: &[QueueItem<ConfigMap>], _initial: bool| {
//!     for item in batch {
//!         if let QueueItem::Deltas(d) = item {
//!             kinds.extend(d.deltas.iter().map(|d| d.kind));
//!         }
//!     }
//!     Ok(())
//! };
//! fifo.pop(&mut process).await.unwrap().unwrap();
//! assert_eq!(kinds, [DeltaType::Added, DeltaType::Updated, DeltaType::Deleted]); // every one, in order
//! # });
//! ```

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;
use kube::Resource;
use tokio::sync::Notify;

use crate::delta::{Delta, DeltaObject, DeltaType, Deltas};
use crate::fifo::{PopError, ProcessError, ProcessFn, Queue, QueueItem, ReplacedAll};
use crate::store::{KeyError, Store, StoreError, meta_namespace_key};
use crate::undecodable::{Undecodable, UndecodableChange};

/// The most items one [`pop`](Queue::pop) hands over by default (client-go `defaultBatchSize`).
pub const DEFAULT_BATCH_SIZE: usize = 1000;

/// The in-order queue of changes (client-go `RealFIFO` with atomic events).
pub struct RealFifo<K> {
    inner: Mutex<Inner<K>>,
    /// Wakes a waiting `pop` when an item is queued or the queue closes.
    not_empty: Notify,
    batch_size: usize,
}

/// The state under the lock.
///
/// Invariants: `initial_population_count <= items.len() + popped-but-unprocessed items`;
/// `synced` implies `populated` and, once set, is never cleared.
struct Inner<K> {
    items: VecDeque<QueueItem<K>>,
    /// Set by the first `replace`, or by any add/update/delete before it.
    populated: bool,
    /// Items queued up to and including the first `replace` that are not yet processed.
    initial_population_count: usize,
    /// `populated` and the initial population processed (client-go closes `synced` then).
    synced: bool,
    closed: bool,
}

impl<K> Inner<K> {
    fn check_synced(&mut self) {
        if self.populated && self.initial_population_count == 0 {
            self.synced = true;
        }
    }

    /// Marks the queue populated by a direct change (not a `replace`), as client-go's
    /// Add/Update/Delete do.
    fn populated_by_change(&mut self) {
        self.populated = true;
        self.check_synced();
    }
}

impl<K> Default for RealFifo<K> {
    fn default() -> Self {
        RealFifo {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                populated: false,
                initial_population_count: 0,
                synced: false,
                closed: false,
            }),
            not_empty: Notify::new(),
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }
}

impl<K> RealFifo<K> {
    /// An empty queue with the default batch size.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the most items one `pop` hands over (at least 1).
    #[must_use]
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    // Nothing panics while this lock is held (keys are computed and `process` runs outside
    // it), so a poisoned lock is taken over rather than propagated.
    fn lock(&self) -> MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The number of items queued.
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `item`, marking the queue populated by a direct change if `change` is set.
    fn push(&self, item: QueueItem<K>, change: bool) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(StoreError::Closed);
        }
        if change {
            inner.populated_by_change();
        }
        inner.items.push_back(item);
        drop(inner);
        self.not_empty.notify_one();
        Ok(())
    }
}

impl<K: Resource> RealFifo<K> {
    fn push_change(&self, kind: DeltaType, obj: Arc<K>) -> Result<(), StoreError> {
        self.push(change_item(kind, obj)?, true)
    }
}

/// The queue item of one watch event: its key and the one delta.
fn change_item<K: Resource>(kind: DeltaType, obj: Arc<K>) -> Result<QueueItem<K>, KeyError> {
    let key = meta_namespace_key(obj.as_ref())?;
    Ok(QueueItem::Deltas(Deltas {
        key,
        deltas: vec![Delta {
            kind,
            object: DeltaObject::Object(obj),
        }],
    }))
}

impl<K: Resource + Send + Sync + 'static> Store<K> for RealFifo<K> {
    fn add(&self, obj: Arc<K>) -> Result<(), StoreError> {
        self.push_change(DeltaType::Added, obj)
    }

    fn update(&self, obj: Arc<K>) -> Result<(), StoreError> {
        self.push_change(DeltaType::Updated, obj)
    }

    /// Queues a delete. Unlike the `DeltaFifo`, the queue cannot tell whether the object is
    /// known; the informer skips the delete of a key its cache does not hold when applying it.
    fn delete(&self, obj: Arc<K>) -> Result<(), StoreError> {
        self.push_change(DeltaType::Deleted, obj)
    }

    fn replace(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), StoreError> {
        self.replace_with_undecodable(list, Vec::new(), resource_version)
    }

    /// Queues the whole list, with the keys that did not decode, as one
    /// [`QueueItem::ReplacedAll`]. Keys are computed first, so an object without a name fails
    /// the call before anything is queued.
    fn replace_with_undecodable(
        &self,
        list: Vec<Arc<K>>,
        undecodable: Vec<(String, Undecodable)>,
        resource_version: &str,
    ) -> Result<(), StoreError> {
        let mut objects = Vec::with_capacity(list.len());
        for obj in list {
            objects.push((meta_namespace_key(obj.as_ref())?, obj));
        }
        let item = QueueItem::ReplacedAll(ReplacedAll {
            resource_version: resource_version.to_string(),
            objects,
            undecodable,
        });
        let mut inner = self.lock();
        if inner.closed {
            return Err(StoreError::Closed);
        }
        inner.items.push_back(item);
        if !inner.populated {
            // client-go: everything queued so far, this relist included, is the initial population.
            inner.populated = true;
            inner.initial_population_count = inner.items.len();
        }
        drop(inner);
        self.not_empty.notify_one();
        Ok(())
    }

    /// Queues one [`QueueItem::SyncAll`]: the informer re-delivers its cache as it stands when
    /// the item is applied, so a resync can never deliver an object older than a queued event.
    fn resync(&self) -> Result<(), StoreError> {
        self.push(QueueItem::SyncAll, false)
    }

    fn bookmark(&self, resource_version: &str) -> Result<(), StoreError> {
        self.push(QueueItem::Bookmark(resource_version.to_string()), false)
    }

    /// Queues the mark in order with the events around it, as one
    /// [`QueueItem::Undecodable`]: a change like any other (it populates the queue).
    fn mark_undecodable(&self, key: String, undecodable: Undecodable) -> Result<(), StoreError> {
        self.push(
            QueueItem::Undecodable(UndecodableChange::Marked { key, undecodable }),
            true,
        )
    }

    /// Queues the delete in order; the informer deletes the cached version, if any, when it
    /// applies it.
    fn delete_undecodable(&self, key: String, resource_version: &str) -> Result<(), StoreError> {
        let resource_version = resource_version.to_string();
        self.push(
            QueueItem::Undecodable(UndecodableChange::Deleted { key, resource_version }),
            true,
        )
    }

    /// Queues the changes in order under one lock and wakes the consumer once. Keys are
    /// computed before the lock is taken.
    fn apply_changes(&self, changes: Vec<(DeltaType, Arc<K>)>) -> Result<Vec<KeyError>, StoreError> {
        let mut skipped = Vec::new();
        let mut items = Vec::with_capacity(changes.len());
        for (kind, obj) in changes {
            let kind = match kind {
                DeltaType::Replaced | DeltaType::Sync => DeltaType::Added,
                kind => kind,
            };
            match change_item(kind, obj) {
                Ok(item) => items.push(item),
                Err(e) => skipped.push(e),
            }
        }
        if items.is_empty() {
            return Ok(skipped);
        }
        let mut inner = self.lock();
        if inner.closed {
            return Err(StoreError::Closed);
        }
        inner.populated_by_change();
        inner.items.extend(items);
        drop(inner);
        self.not_empty.notify_one();
        Ok(skipped)
    }
}

impl<K: Resource + Send + Sync + 'static> Queue<K> for RealFifo<K> {
    fn pop<'a>(
        &'a self,
        process: &'a mut ProcessFn<'_, K>,
    ) -> BoxFuture<'a, Result<Result<(), ProcessError>, PopError>> {
        Box::pin(async move {
            let (batch, is_in_initial_list) = loop {
                let notified = self.not_empty.notified();
                tokio::pin!(notified);
                // Register before looking, so an item queued between the look and the wait
                // is not missed.
                notified.as_mut().enable();
                {
                    let mut inner = self.lock();
                    if !inner.items.is_empty() {
                        let is_in_initial_list = !inner.synced;
                        let mut n = inner.items.len().min(self.batch_size);
                        if inner.initial_population_count > 0 {
                            // Never mix the initial population with later items: those are
                            // not part of the initial list.
                            n = n.min(inner.initial_population_count);
                        }
                        let batch: Vec<QueueItem<K>> = inner.items.drain(..n).collect();
                        crate::fifo::release_if_idle(&mut inner.items);
                        break (batch, is_in_initial_list);
                    }
                    if inner.closed {
                        return Err(PopError::Closed);
                    }
                }
                notified.await;
            };

            // The lock is not held here: the reflector keeps appending while the batch is
            // applied. The initial population count drops only afterwards, so `has_synced`
            // never reports the initial list done while its last batch is mid-flight.
            let result = process(&batch, is_in_initial_list);
            let requeue = matches!(result, Err(ProcessError::Requeue(_)));
            let mut inner = self.lock();
            if requeue {
                // Put the batch back at the front, in order: nothing popped it meanwhile
                // (one consumer), and items queued since stay behind it.
                for item in batch.into_iter().rev() {
                    inner.items.push_front(item);
                }
            } else if inner.initial_population_count > 0 {
                inner.initial_population_count = inner.initial_population_count.saturating_sub(batch.len());
                inner.check_synced();
            }
            Ok(result)
        })
    }

    fn has_synced(&self) -> bool {
        self.lock().synced
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
    use crate::testing::configmap as cm;
    use k8s_openapi::api::core::v1::ConfigMap;

    /// A readable summary of an item: `Added ns/a`, `ReplacedAll@5 [ns/a, ns/b]`, `SyncAll`, `Bookmark@7`.
    fn describe(item: &QueueItem<ConfigMap>) -> String {
        match item {
            QueueItem::Deltas(d) => {
                let kinds: Vec<String> = d.deltas.iter().map(|d| format!("{:?}", d.kind)).collect();
                format!("{} {}", kinds.join("+"), d.key)
            }
            QueueItem::ReplacedAll(r) => {
                let keys: Vec<&str> = r.objects.iter().map(|(k, _)| k.as_str()).collect();
                format!("ReplacedAll@{} [{}]", r.resource_version, keys.join(", "))
            }
            QueueItem::SyncAll => "SyncAll".into(),
            QueueItem::Bookmark(rv) => format!("Bookmark@{rv}"),
            QueueItem::Undecodable(UndecodableChange::Marked { key, undecodable }) => {
                format!("Undecodable@{} {key}", undecodable.resource_version)
            }
            QueueItem::Undecodable(change) => format!("UndecodableDeleted {}", change.key()),
        }
    }

    /// Pops one batch: its items described, and whether it was in the initial list.
    async fn pop(fifo: &RealFifo<ConfigMap>) -> (Vec<String>, bool) {
        let mut out = None;
        let mut process = |batch: &[QueueItem<ConfigMap>], initial: bool| {
            out = Some((batch.iter().map(describe).collect(), initial));
            Ok(())
        };
        fifo.pop(&mut process).await.expect("open").expect("processed");
        out.expect("popped")
    }

    #[tokio::test]
    async fn every_change_is_kept_in_order_with_no_coalescing_per_key() {
        let fifo = RealFifo::new();
        fifo.add(cm("a", "1")).unwrap();
        fifo.add(cm("b", "2")).unwrap();
        fifo.update(cm("a", "3")).unwrap();
        fifo.delete(cm("a", "4")).unwrap();
        fifo.add(cm("a", "5")).unwrap();
        let (items, _) = pop(&fifo).await;
        assert_eq!(
            items,
            ["Added ns/a", "Added ns/b", "Updated ns/a", "Deleted ns/a", "Added ns/a"]
        );
        assert!(fifo.is_empty());
    }

    #[tokio::test]
    async fn replace_resync_and_bookmark_are_one_item_each_in_log_order() {
        let fifo = RealFifo::new();
        fifo.replace(vec![cm("a", "2"), cm("b", "2")], "2").unwrap();
        fifo.update(cm("a", "3")).unwrap();
        fifo.resync().unwrap();
        fifo.bookmark("4").unwrap();
        fifo.replace(vec![cm("a", "5")], "5").unwrap();
        // The first pop stops at the end of the initial population (the first relist).
        assert_eq!(pop(&fifo).await, (vec!["ReplacedAll@2 [ns/a, ns/b]".to_string()], true));
        let (rest, initial) = pop(&fifo).await;
        assert_eq!(rest, ["Updated ns/a", "SyncAll", "Bookmark@4", "ReplacedAll@5 [ns/a]"]);
        assert!(!initial);
    }

    #[tokio::test]
    async fn pops_are_bounded_by_the_batch_size() {
        let fifo = RealFifo::new().with_batch_size(2);
        for i in 0..5 {
            fifo.add(cm(&format!("o{i}"), "1")).unwrap();
        }
        assert_eq!(pop(&fifo).await.0.len(), 2);
        assert_eq!(pop(&fifo).await.0.len(), 2);
        assert_eq!(pop(&fifo).await.0.len(), 1);
    }

    #[tokio::test]
    async fn has_synced_waits_for_the_initial_population_and_initial_items_are_flagged() {
        let fifo = RealFifo::new();
        assert!(!fifo.has_synced());
        fifo.replace(vec![cm("a", "1")], "1").unwrap();
        fifo.add(cm("b", "2")).unwrap();
        assert!(!fifo.has_synced(), "not before the relist is processed");

        // Observe has_synced from inside the processing function: still false mid-flight.
        let mut seen = Vec::new();
        let mut process = |batch: &[QueueItem<ConfigMap>], initial: bool| {
            seen.push((
                batch.iter().map(describe).collect::<Vec<_>>(),
                initial,
                fifo.has_synced(),
            ));
            Ok(())
        };
        fifo.pop(&mut process).await.unwrap().unwrap();
        fifo.pop(&mut process).await.unwrap().unwrap();
        assert_eq!(
            seen,
            [
                (vec!["ReplacedAll@1 [ns/a]".to_string()], true, false),
                (vec!["Added ns/b".to_string()], false, true),
            ]
        );
        assert!(fifo.has_synced());
    }

    #[tokio::test]
    async fn a_change_before_any_replace_counts_as_synced_as_in_client_go() {
        let fifo = RealFifo::new();
        fifo.add(cm("a", "1")).unwrap();
        assert!(fifo.has_synced());
        // A later replace is not an initial population any more.
        fifo.replace(vec![cm("b", "2")], "2").unwrap();
        assert!(fifo.has_synced());
        let (_, initial) = pop(&fifo).await;
        assert!(!initial);
    }

    #[tokio::test]
    async fn a_batch_of_changes_is_queued_in_order_and_a_nameless_object_is_skipped() {
        let fifo = RealFifo::new();
        let mut nameless = ConfigMap::default();
        nameless.metadata.namespace = Some("ns".into());
        let skipped = fifo
            .apply_changes(vec![
                (DeltaType::Added, cm("a", "1")),
                (DeltaType::Updated, cm("a", "2")),
                (DeltaType::Updated, Arc::new(nameless)),
                (DeltaType::Deleted, cm("b", "3")),
            ])
            .unwrap();
        assert_eq!(skipped, [KeyError]);
        assert!(fifo.has_synced(), "a change before any replace populates the queue");
        assert_eq!(pop(&fifo).await.0, ["Added ns/a", "Updated ns/a", "Deleted ns/b"]);
        fifo.close();
        assert_eq!(
            fifo.apply_changes(vec![(DeltaType::Added, cm("c", "4"))]),
            Err(StoreError::Closed)
        );
    }

    #[tokio::test]
    async fn an_empty_initial_list_syncs_once_popped() {
        let fifo = RealFifo::new();
        fifo.replace(Vec::new(), "1").unwrap();
        assert!(!fifo.has_synced());
        assert_eq!(pop(&fifo).await, (vec!["ReplacedAll@1 []".to_string()], true));
        assert!(fifo.has_synced());
    }

    #[tokio::test]
    async fn the_reflector_appends_while_a_batch_is_processed() {
        let fifo = RealFifo::new();
        fifo.add(cm("a", "1")).unwrap();
        // The processing function writes to the queue: it would deadlock if pop held the lock.
        let mut process = |_: &[QueueItem<ConfigMap>], _| {
            fifo.add(cm("b", "2")).unwrap();
            Ok(())
        };
        fifo.pop(&mut process).await.unwrap().unwrap();
        assert_eq!(pop(&fifo).await.0, ["Added ns/b"]);
    }

    #[tokio::test]
    async fn requeue_puts_the_batch_back_in_front_in_order() {
        let fifo = RealFifo::new();
        fifo.add(cm("a", "1")).unwrap();
        fifo.add(cm("b", "2")).unwrap();
        let mut process = |_: &[QueueItem<ConfigMap>], _| {
            fifo.add(cm("c", "3")).unwrap();
            Err(ProcessError::Requeue("later".into()))
        };
        let result = fifo.pop(&mut process).await.unwrap();
        assert!(matches!(result, Err(ProcessError::Requeue(_))));
        assert_eq!(pop(&fifo).await.0, ["Added ns/a", "Added ns/b", "Added ns/c"]);
    }

    #[tokio::test]
    async fn close_wakes_a_waiting_pop_after_the_queue_drains() {
        let fifo = Arc::new(RealFifo::<ConfigMap>::new());
        fifo.add(cm("a", "1")).unwrap();
        fifo.close();
        assert!(fifo.is_closed());
        assert!(fifo.add(cm("b", "2")).is_err(), "a closed queue takes nothing");
        assert_eq!(pop(&fifo).await.0, ["Added ns/a"], "queued items still pop");
        let waiter = {
            let fifo = fifo.clone();
            tokio::spawn(async move {
                let mut process = |_: &[QueueItem<ConfigMap>], _| Ok(());
                fifo.pop(&mut process).await.map(|_| ())
            })
        };
        assert_eq!(waiter.await.unwrap(), Err(PopError::Closed));
    }

    #[tokio::test]
    async fn an_object_without_a_name_is_a_typed_error_and_queues_nothing() {
        let fifo = RealFifo::new();
        let nameless = Arc::new(ConfigMap::default());
        assert_eq!(fifo.add(nameless.clone()), Err(StoreError::Key(crate::KeyError)));
        assert_eq!(
            fifo.replace(vec![cm("a", "1"), nameless], "1"),
            Err(StoreError::Key(crate::KeyError))
        );
        assert!(fifo.is_empty());
        assert!(!fifo.has_synced());
    }
}
