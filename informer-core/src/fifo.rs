//! The queue between the reflector and the informer (client-go `fifo.go`'s `Queue`).
//!
//! The informer drives a [`Queue`] without caring which one it is: the in-order
//! [`RealFifo`](crate::RealFifo) (client-go 1.36's default, and kinformer's) or the per-key
//! [`DeltaFifo`](crate::DeltaFifo). Both hand the informer [`QueueItem`]s in batches.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::delta::Deltas;
use crate::store::Store;
use crate::undecodable::{Undecodable, UndecodableChange};

/// One unit a [`Queue`] hands to the informer's processing function.
///
/// The [`DeltaFifo`](crate::DeltaFifo) only produces [`Deltas`](QueueItem::Deltas) (every
/// queued change of one key). The [`RealFifo`](crate::RealFifo) produces one `Deltas` per
/// watch event and carries a relist, a resync and a bookmark as single items, so each reaches
/// the cache atomically and in order with the events around it (client-go's `ReplacedAll`,
/// `SyncAll` and `Bookmark` deltas).
#[derive(Debug)]
#[non_exhaustive]
pub enum QueueItem<K> {
    /// Changes to one key, oldest first.
    Deltas(Deltas<K>),
    /// A relist: the whole content as of a resourceVersion (client-go `ReplacedAll`). Known
    /// objects missing from it are deleted (with a
    /// [`DeletedFinalStateUnknown`](crate::DeletedFinalStateUnknown) tombstone) when it is
    /// applied, under the same lock as the new content.
    ReplacedAll(ReplacedAll<K>),
    /// Re-deliver every cached object to the handlers due a resync (client-go `SyncAll`).
    SyncAll,
    /// The server's resourceVersion advanced with no object change (client-go `Bookmark`).
    Bookmark(String),
    /// An object that does not decode was marked, or deleted (see
    /// [`undecodable`](crate::undecodable)); after the key's changes queued before it.
    Undecodable(UndecodableChange),
}

/// The content of a relist (client-go `ReplacedAllInfo`).
#[derive(Debug)]
pub struct ReplacedAll<K> {
    /// The list's resourceVersion.
    pub resource_version: String,
    /// The listed objects with their keys, in list order.
    pub objects: Vec<(String, Arc<K>)>,
    /// The keys of listed objects that did not decode: present, so not deleted, and the
    /// cache's whole set of undecodable marks once applied.
    pub undecodable: Vec<(String, Undecodable)>,
}

/// What `process` tells [`Queue::pop`] about the item it was handed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// Put the item back unless newer deltas for its key arrived meanwhile (client-go `ErrRequeue`).
    #[error("requeue: {0}")]
    Requeue(String),
    /// Processing failed; the item is dropped.
    #[error("processing failed: {0}")]
    Failed(String),
}

/// Why [`Queue::pop`] returned without an item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PopError {
    /// The queue was closed (client-go `ErrFIFOClosed`).
    #[error("the queue is closed")]
    Closed,
}

/// The processing function handed to [`Queue::pop`]: a batch of items, in queue order, and
/// whether they belong to the initial list. `DeltaFifo` hands over one key at a time; the
/// `RealFifo` hands over up to its batch size.
pub type ProcessFn<'a, K> = dyn FnMut(&[QueueItem<K>], bool) -> Result<(), ProcessError> + Send + 'a;

/// A queue of changes fed by a reflector and drained by an informer.
pub trait Queue<K>: Store<K> {
    /// Waits for items and hands them to `process`; [`has_synced`](Queue::has_synced) never
    /// reports an item as done before `process` returned. One consumer at a time: the
    /// informer's processing loop. Returns what `process` returned, or [`PopError::Closed`]
    /// once the queue is closed and (for the `RealFifo`) drained.
    fn pop<'a>(
        &'a self,
        process: &'a mut ProcessFn<'_, K>,
    ) -> BoxFuture<'a, Result<Result<(), ProcessError>, PopError>>;

    /// True once the first `replace` happened and everything it queued has been popped.
    fn has_synced(&self) -> bool;

    /// Closes the queue: waiting and later pops return [`PopError::Closed`].
    fn close(&self);

    /// Whether [`close`](Queue::close) was called.
    fn is_closed(&self) -> bool;
}

/// Above this many slots, an emptied buffer gives its memory back.
const IDLE_KEEP: usize = 1024;

/// Gives an emptied buffer's memory back once a burst is over (the initial list leaves a slot
/// per object; client-go's queues and listener rings keep their largest size for good). A
/// buffer that still holds items, or that never grew past a small size, is left as it is.
pub(crate) fn release_if_idle<T>(buffer: &mut VecDeque<T>) {
    if buffer.is_empty() && buffer.capacity() > IDLE_KEEP {
        *buffer = VecDeque::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emptied_buffer_gives_its_memory_back_only_past_the_idle_size() {
        let mut burst: VecDeque<u32> = (0..5000).collect();
        release_if_idle(&mut burst);
        assert_eq!(burst.len(), 5000, "a buffer with items is kept");
        burst.clear();
        release_if_idle(&mut burst);
        assert_eq!(burst.capacity(), 0);
        let mut small: VecDeque<u32> = (0..10).collect();
        small.clear();
        let capacity = small.capacity();
        release_if_idle(&mut small);
        assert_eq!(small.capacity(), capacity);
    }
}
