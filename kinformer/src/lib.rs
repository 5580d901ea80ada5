//! kinformer: client-go's informer machinery in typed, async Rust.
//!
//! This facade re-exports the public API; generated code refers to it as `::kinformer`.
//!
//! - [`cache`] (`informer-core`): Reflector, DeltaFIFO, Indexer, SharedIndexInformer, listers.
//! - [`workqueue`]: the rate-limited work queue between handlers and reconcilers.
//! - [`factory`]: `SharedInformerFactory`, one shared informer per resource type.

pub use factory;
pub use informer_core as cache;
pub use workqueue;
