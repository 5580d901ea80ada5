//! The changes every queue hands the informer, and handlers receive (client-go's `Delta`,
//! `DeltaType`, `Deltas` and `DeletedFinalStateUnknown`).
//!
//! Where it sits: the reflector turns watch events into [`DeltaType`]s; both queues (the
//! default [`RealFifo`](crate::RealFifo) and the [`DeltaFifo`](crate::DeltaFifo)) hold
//! [`Delta`]s and pop a key's [`Deltas`]; the informer applies them to the cache and hands
//! handlers the [`DeltaObject`] (on delete, [`DeletedObject`]: the last state, or a
//! [`DeletedFinalStateUnknown`] tombstone when the delete was inferred from a relist).

use std::sync::Arc;

/// What happened to an object (client-go `DeltaType`). client-go 1.36's `ReplacedAll`,
/// `SyncAll` and `Bookmark` are not delta types here but [`QueueItem`] variants, since they
/// carry no single object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeltaType {
    /// Created (a watch ADDED).
    Added,
    /// Modified (a watch MODIFIED).
    Updated,
    /// Deleted (a watch DELETED, or a tombstone from `replace`).
    Deleted,
    /// Listed again by `replace` (when `emit_delta_type_replaced` is on).
    Replaced,
    /// Re-delivered by a periodic resync, or listed by `replace` when `Replaced` is off.
    Sync,
}

/// An object deleted while the watch was down: `obj` is the last state the cache had
/// (client-go `DeletedFinalStateUnknown`). The real final state is unknown.
#[derive(Debug)]
pub struct DeletedFinalStateUnknown<K> {
    /// The object's key.
    pub key: String,
    /// The last known state of the object.
    pub obj: Arc<K>,
}

impl<K> Clone for DeletedFinalStateUnknown<K> {
    fn clone(&self) -> Self {
        DeletedFinalStateUnknown {
            key: self.key.clone(),
            obj: self.obj.clone(),
        }
    }
}

/// The object a [`Delta`] carries: the object itself or, for a delete the watch missed, a
/// [`DeletedFinalStateUnknown`] tombstone.
#[derive(Debug)]
pub enum DeltaObject<K> {
    /// The object as the server sent it.
    Object(Arc<K>),
    /// A tombstone: the object was gone from a relist.
    DeletedFinalStateUnknown(DeletedFinalStateUnknown<K>),
}

/// What `on_delete` receives: the last state of the object, or a tombstone when the delete
/// was inferred from a relist.
pub type DeletedObject<K> = DeltaObject<K>;

impl<K> Clone for DeltaObject<K> {
    fn clone(&self) -> Self {
        match self {
            DeltaObject::Object(o) => DeltaObject::Object(o.clone()),
            DeltaObject::DeletedFinalStateUnknown(t) => DeltaObject::DeletedFinalStateUnknown(t.clone()),
        }
    }
}

impl<K> DeltaObject<K> {
    /// The object, or the tombstone's last known state.
    pub fn object(&self) -> &Arc<K> {
        match self {
            DeltaObject::Object(o) => o,
            DeltaObject::DeletedFinalStateUnknown(t) => &t.obj,
        }
    }

    /// Whether this is a tombstone.
    pub fn is_tombstone(&self) -> bool {
        matches!(self, DeltaObject::DeletedFinalStateUnknown(_))
    }
}

/// One change to one object (client-go `Delta`).
#[derive(Debug)]
pub struct Delta<K> {
    /// What happened.
    pub kind: DeltaType,
    /// The object after the change (for `Deleted`, its last state).
    pub object: DeltaObject<K>,
}

impl<K> Clone for Delta<K> {
    fn clone(&self) -> Self {
        Delta {
            kind: self.kind,
            object: self.object.clone(),
        }
    }
}

/// Every queued change to one key, oldest first (client-go `Deltas`). Never empty.
#[derive(Debug)]
pub struct Deltas<K> {
    /// The key the changes belong to.
    pub key: String,
    /// The changes, oldest first.
    pub deltas: Vec<Delta<K>>,
}

impl<K> Deltas<K> {
    /// The oldest change.
    pub fn oldest(&self) -> Option<&Delta<K>> {
        self.deltas.first()
    }

    /// The newest change.
    pub fn newest(&self) -> Option<&Delta<K>> {
        self.deltas.last()
    }
}
