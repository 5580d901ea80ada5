//! client-go's `util/workqueue` in async Rust.
//!
//! The work queue sits between an informer's `ResourceEventHandler`s and the reconciler workers:
//! handlers [`add`](Queue::add) the keys of changed objects, workers [`get`](Queue::get) keys,
//! reconcile, and mark them [`done`](Queue::done). The queue merges repeated adds of a waiting
//! key, never hands one key to two workers at once, and re-queues a key that changed while it was
//! being reconciled. [`DelayingQueue`] adds items later, [`RateLimitingQueue`] adds them after a
//! per-item backoff chosen by a [`RateLimiter`], [`PriorityQueue`] does all of that and hands out
//! the highest priority first (controller-runtime's priority queue), and named queues export client-go's Prometheus
//! metrics (see [`metrics`]).
//!
//! Shutdown is client-go's: once a queue is shut down, adds are ignored and items waiting for a
//! delay are dropped, but [`get`](Queue::get) keeps handing out the items already queued and
//! returns `None` only when none is left, so a `while let Some(key) = queue.get().await` worker
//! finishes the accepted work and then stops (see [`queue`](mod@queue#shutdown)).
//!
//! A queue owns the tasks it spawns (a delaying queue's timer, a named queue's metrics refresher):
//! they end at shutdown or when the last handle is dropped, a panic in one is logged at ERROR with
//! the queue's name, and [`join_tasks`](Queue::join_tasks) waits for them after shutdown and
//! returns that panic as a [`TaskPanicked`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use workqueue::{default_controller_rate_limiter, RateLimitingQueue};
//!
//! let queue = RateLimitingQueue::new(default_controller_rate_limiter());
//! queue.add("default/nginx".to_owned()); // from an event handler
//!
//! while let Some(key) = queue.get().await {
//!     let reconciled: Result<(), ()> = Ok(()); // reconcile `key` here
//!     match reconciled {
//!         Ok(()) => queue.forget(&key),            // success: reset its backoff
//!         Err(()) => queue.add_rate_limited(key.clone()), // failure: retry later
//!     }
//!     queue.done(&key);
//!     # queue.shut_down();
//! }
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod default_rate_limiters;
pub mod delaying_queue;
pub mod metrics;
mod parking;
pub mod priority_queue;
pub mod queue;
pub mod rate_limiting_queue;
mod tasks;

pub use default_rate_limiters::{
    BucketRateLimiter, ItemExponentialFailureRateLimiter, ItemFastSlowRateLimiter, MaxOfRateLimiter, RateLimiter,
    WithMaxWaitRateLimiter, default_controller_rate_limiter, with_max_wait,
};
pub use delaying_queue::DelayingQueue;
pub use metrics::{DepthWithPriorityMetric, MetricsProvider, PrometheusMetricsProvider};
pub use priority_queue::{AddOpts, PriorityQueue};
pub use queue::{Queue, QueueConfig};
pub use rate_limiting_queue::RateLimitingQueue;
pub use tasks::TaskPanicked;
