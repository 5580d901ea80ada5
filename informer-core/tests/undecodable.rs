//! An object that does not decode must never look deleted (issue #24), end to end over
//! envtest: a custom resource read through a hand-written Rust type (`spec.size: i32`) while
//! the CRD's schema lets `spec.size` be anything, so the server holds objects the type cannot
//! decode.
//!
//! The suite (`suites/undecodable.rs`) runs on both queues: the RealFifo carries marks as log
//! items and relists as one `ReplacedAll`; the DeltaFifo carries them per key beside the deltas.

mod common;

/// The suite on the RealFifo.
mod real_fifo {
    const QUEUE: informer_core::QueueKind = informer_core::QueueKind::RealFifo;
    include!("suites/undecodable.rs");
}

/// The suite on the DeltaFifo.
mod delta_fifo {
    const QUEUE: informer_core::QueueKind = informer_core::QueueKind::DeltaFifo;
    include!("suites/undecodable.rs");
}
