//! SharedIndexInformer and Reflector behaviour driven by a scripted API server, under tokio's
//! paused clock where time matters (resync, backoff).
//!
//! The suite (`suites/informer_fake.rs`) runs twice: on the [`RealFifo`](informer_core::RealFifo),
//! the default queue, and on the [`DeltaFifo`](informer_core::DeltaFifo).

mod common;

/// The suite on the RealFifo.
mod real_fifo {
    const QUEUE: informer_core::QueueKind = informer_core::QueueKind::RealFifo;
    include!("suites/informer_fake.rs");
}

/// The suite on the DeltaFifo.
mod delta_fifo {
    const QUEUE: informer_core::QueueKind = informer_core::QueueKind::DeltaFifo;
    include!("suites/informer_fake.rs");
}
