//! informer-core: client-go's `tools/cache` in typed, async Rust.
//!
//! This crate is the heart of kinformer's data path:
//!
//! ```text
//! API server ──list/watch──▶ Reflector ──▶ RealFifo ──pop──▶ process_batch ──▶ Indexer (cache)
//!                                                                   │
//!                                                                   └──▶ processor ──▶ one listener
//!                                                                        per handler ──▶ ResourceEventHandler
//! ```
//!
//! - [`ListerWatcher`] / [`ApiListerWatcher`] (`listwatch.rs`): list and watch over `kube::Api`.
//! - [`Reflector`] (`reflector.rs`): ListAndWatch, relist on 410, backoff, resync ticks.
//! - [`RealFifo`] (`real_fifo.rs`, the default) or [`DeltaFifo`] (`delta_fifo.rs`) behind the
//!   [`Queue`] trait (`fifo.rs`): every event in order with atomic relists, or per-key deltas
//!   with [`DeletedFinalStateUnknown`] tombstones; `resync`, `has_synced`.
//! - [`Indexer`] (`indexer.rs`, `thread_safe_store.rs`, `index.rs`): the cache of `Arc<K>`
//!   with named indexes.
//! - [`SharedIndexInformer`] (`shared_informer.rs`, `processor.rs`, `listener.rs`): ties
//!   them together and fans notifications out to [`ResourceEventHandler`]s.
//! - [`Lister`] (`listers.rs`): read-only views of the cache.
//! - [`Undecodable`] (`undecodable.rs`): objects the server has that do not decode stay known
//!   to the cache, marked, never taken for deleted ([`Lookup`]).
//!
//! ```no_run
//! use informer_core::{ApiListerWatcher, InformerConfig, ResourceEventHandlerFuncs, SharedIndexInformer};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let informer = SharedIndexInformer::new(
//!     ApiListerWatcher::new(kube::Api::<ConfigMap>::all(client)),
//!     InformerConfig::default(),
//! );
//! informer.add_event_handler(
//!     ResourceEventHandlerFuncs::new().on_add(|cm: &std::sync::Arc<ConfigMap>, _| {
//!         println!("configmap {:?}", cm.metadata.name);
//!     }),
//! )?;
//! let shutdown = CancellationToken::new();
//! tokio::spawn({ let informer = informer.clone(); let s = shutdown.clone(); async move { informer.run(s).await } });
//! informer.wait_for_cache_sync(&shutdown).await;
//! println!("{} configmaps cached", informer.indexer().len());
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod backoff;
mod cache_apply;
pub mod client;
mod compact;
pub mod delta;
pub mod delta_fifo;
pub mod error_chain;
pub mod event_handler;
pub mod fifo;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod index;
pub mod indexer;
mod listener;
pub mod listers;
pub mod listwatch;
mod processor;
pub mod real_fifo;
pub mod reflector;
pub mod shared_informer;
mod skip_managed_fields;
pub mod store;
#[cfg(test)]
mod testing;
pub mod thread_safe_store;
pub mod undecodable;

pub use backoff::{Backoff, BackoffConfig};
pub use delta::{DeletedFinalStateUnknown, DeletedObject, Delta, DeltaObject, DeltaType, Deltas};
pub use delta_fifo::{DeltaFifo, DeltaFifoOptions};
pub use error_chain::ErrorChain;
pub use event_handler::{FilteringResourceEventHandler, ResourceEventHandler, ResourceEventHandlerFuncs};
pub use fifo::{PopError, ProcessError, ProcessFn, Queue, QueueItem, ReplacedAll};
pub use index::{IndexFunc, Indexers, NAMESPACE_INDEX, meta_namespace_index_func};
pub use indexer::Indexer;
pub use kube::core::{Expression, Selector};
pub use listers::{Lister, NamespaceLister};
pub use listwatch::{
    ApiListerWatcher, DEFAULT_PAGES_AHEAD, ListPage, ListWatchError, ListerWatcher, MalformedObject, WatchStream,
};
pub use real_fifo::RealFifo;
pub use reflector::{
    LastSyncResourceVersion, Reflector, ReflectorConfig, ReflectorMetrics, ShouldResyncFunc, State, TransformFunc,
    WatchErrorHandler,
};
pub use shared_informer::{
    HandlerOptions, InformerConfig, InformerError, InformerStats, ListenerStats, MINIMUM_RESYNC_PERIOD, Partition,
    QueueKind, ResourceEventHandlerRegistration, SharedIndexInformer,
};
pub use store::{KeyError, KnownObjects, Store, StoreError, meta_namespace_key, split_meta_namespace_key};
pub use thread_safe_store::{IndexError, ThreadSafeStore};
pub use undecodable::{Lookup, Undecodable, UndecodableChange};
