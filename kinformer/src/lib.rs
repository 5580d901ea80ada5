//! kinformer: client-go's informer machinery in typed, async Rust.
//!
//! This facade re-exports the public API; generated code refers to it as `::kinformer`.
//! - [`cache`]: Reflector, DeltaFIFO, Indexer, SharedIndexInformer (`informer-core`).
//! - [`workqueue`]: the rate-limited work queue between handlers and reconcilers.
//! - [`factory`]: `SharedInformerFactory`.

pub use informer_core as cache;
pub use workqueue;
pub use factory;
