//! kinformer: client-go's informer machinery in typed, async Rust.
//!
//! This facade re-exports the public API; generated code refers to it as `::kinformer`.
//!
//! - [`cache`] (`informer-core`): Reflector, DeltaFIFO, Indexer, SharedIndexInformer, listers.
//! - [`workqueue`]: the rate-limited work queue between handlers and reconcilers.
//! - [`factory`]: `SharedInformerFactory`, one shared informer per resource type, with typed
//!   accessors for the built-in resources (`factory.apps().v1().deployments()`).
//! - [`Informer`]: `#[derive(Informer)]` for your own resource types.

pub use factory;
pub use informer_core as cache;
pub use informer_derive::Informer;
pub use workqueue;
