//! The queue between the reflector and the informer (client-go `fifo.go`'s `Queue`).
//!
//! The informer drives a [`Queue`] without caring which one it is: today the
//! [`DeltaFifo`](crate::DeltaFifo); client-go 1.36 defaults to an in-order `RealFIFO` with
//! batch pops, which fits behind the same trait.

use futures::future::BoxFuture;

use crate::delta_fifo::Deltas;
use crate::store::Store;

/// What `process` tells [`Queue::pop`] about the item it was handed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
pub enum PopError {
    /// The queue was closed (client-go `ErrFIFOClosed`).
    #[error("the queue is closed")]
    Closed,
}

/// The processing function handed to [`Queue::pop`]: a batch of items (one key's `Deltas`
/// each, in order) and whether they belong to the initial list. `DeltaFifo` hands over one key
/// at a time; an in-order FIFO with batch pops (client-go 1.36's `RealFIFO`) hands over many.
pub type ProcessFn<'a, K> = dyn FnMut(&[Deltas<K>], bool) -> Result<(), ProcessError> + Send + 'a;

/// A queue of changes fed by a reflector and drained by an informer.
pub trait Queue<K>: Store<K> {
    /// Waits for items and hands them to `process` while no other pop runs, so that
    /// [`has_synced`](Queue::has_synced) never reports an item as done before it was processed.
    /// Returns what `process` returned, or [`PopError::Closed`] once the queue is closed.
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
