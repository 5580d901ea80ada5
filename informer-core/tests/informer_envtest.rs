//! The informer end to end, over real HTTP: envtest serves the API, `kube::Client` talks to
//! it, and the cache must equal what the server holds, through pagination, watch drops,
//! both forms of 410, streaming lists, dynamic objects and malformed objects.
//!
//! The suite (`suites/informer_envtest.rs`) runs twice: on the [`RealFifo`](informer_core::RealFifo),
//! the default queue, and on the [`DeltaFifo`](informer_core::DeltaFifo).

mod common;

/// The suite on the RealFifo.
mod real_fifo {
    const QUEUE: informer_core::QueueKind = informer_core::QueueKind::RealFifo;
    include!("suites/informer_envtest.rs");
}

/// The suite on the DeltaFifo.
mod delta_fifo {
    const QUEUE: informer_core::QueueKind = informer_core::QueueKind::DeltaFifo;
    include!("suites/informer_envtest.rs");
}
