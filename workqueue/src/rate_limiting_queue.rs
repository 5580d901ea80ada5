//! A delaying queue that retries failed items after a backoff (client-go's
//! `RateLimitingInterface`).
//!
//! A worker that fails to reconcile an item calls [`add_rate_limited`]; the queue asks its
//! [`RateLimiter`] how long the item should wait and adds it after that. When the item finally
//! succeeds, the worker calls [`forget`] so its next failure starts the backoff over.
//!
//! [`add_rate_limited`]: RateLimitingQueue::add_rate_limited
//! [`forget`]: RateLimitingQueue::forget
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! use std::time::Duration;
//! use workqueue::{ItemExponentialFailureRateLimiter, RateLimitingQueue};
//!
//! let limiter = ItemExponentialFailureRateLimiter::new(Duration::from_secs(1), Duration::from_secs(60));
//! let queue = RateLimitingQueue::new(limiter);
//! queue.add_rate_limited("default/nginx"); // waits 1 s
//! queue.add_rate_limited("default/nginx"); // asks for 2 s; the earlier time wins
//! assert_eq!(queue.num_requeues(&"default/nginx"), 2);
//! assert_eq!(queue.get().await, Some("default/nginx"));
//! queue.forget(&"default/nginx");
//! assert_eq!(queue.num_requeues(&"default/nginx"), 0);
//! # }
//! ```

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::default_rate_limiters::RateLimiter;
use crate::delaying_queue::DelayingQueue;
use crate::queue::QueueConfig;

/// A [`DelayingQueue`] with per-item rate-limited retries (client-go's
/// `rateLimitingType`).
///
/// A cheaply cloneable handle; clones share the queue and the rate limiter.
pub struct RateLimitingQueue<T> {
    queue: DelayingQueue<T>,
    rate_limiter: Arc<dyn RateLimiter<T>>,
}

impl<T> Clone for RateLimitingQueue<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            rate_limiter: Arc::clone(&self.rate_limiter),
        }
    }
}

impl<T: Clone + Eq + Hash + Send + Sync + 'static> RateLimitingQueue<T> {
    /// Creates an unnamed queue without metrics, retrying as `rate_limiter` says.
    ///
    /// # Panics
    /// Outside a Tokio runtime, since it spawns the delaying queue's timer task.
    pub fn new(rate_limiter: impl RateLimiter<T> + 'static) -> Self {
        Self::with_config(rate_limiter, QueueConfig::default())
    }

    /// Creates a queue from `config`, retrying as `rate_limiter` says.
    ///
    /// # Panics
    /// Outside a Tokio runtime, since it spawns the delaying queue's timer task.
    pub fn with_config(rate_limiter: impl RateLimiter<T> + 'static, config: QueueConfig) -> Self {
        Self {
            queue: DelayingQueue::with_config(config),
            rate_limiter: Arc::new(rate_limiter),
        }
    }

    /// Adds `item` after the wait its rate limiter asks for, recording a failure of it.
    pub fn add_rate_limited(&self, item: T) {
        let delay = self.rate_limiter.when(&item);
        self.queue.add_after(item, delay);
    }

    /// Resets `item`'s backoff: call it when the item succeeded or is given up on. It does not
    /// remove the item from the queue.
    pub fn forget(&self, item: &T) {
        self.rate_limiter.forget(item);
    }

    /// How many times `item` was rate-limited since it was last forgotten.
    pub fn num_requeues(&self, item: &T) -> usize {
        self.rate_limiter.num_requeues(item)
    }

    /// Adds `item` once `delay` has passed. See [`DelayingQueue::add_after`].
    pub fn add_after(&self, item: T, delay: Duration) {
        self.queue.add_after(item, delay);
    }

    /// Adds `item` now. See [`Queue::add`](crate::Queue::add).
    pub fn add(&self, item: T) {
        self.queue.add(item);
    }

    /// Waits for an item. See [`Queue::get`](crate::Queue::get).
    pub async fn get(&self) -> Option<T> {
        self.queue.get().await
    }

    /// Marks `item` as processed. See [`Queue::done`](crate::Queue::done).
    pub fn done(&self, item: &T) {
        self.queue.done(item);
    }

    /// Number of items ready to be handed out. See [`DelayingQueue::len`].
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no item is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Shuts the queue down without waiting: later adds (rate-limited ones too) are ignored,
    /// items waiting for a retry are dropped, and [`get`](Self::get) keeps handing out the items
    /// already queued until none is left. See [`DelayingQueue::shut_down`].
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    /// Shuts the queue down as [`shut_down`](Self::shut_down) does and waits until every queued
    /// and in-flight item is done. See [`DelayingQueue::shut_down_with_drain`].
    pub async fn shut_down_with_drain(&self) {
        self.queue.shut_down_with_drain().await;
    }

    /// Waits for the queue's tasks (the timer of its retries, a named queue's metrics task) to
    /// end after [`shut_down`](Self::shut_down); the first that panicked, if any. See
    /// [`Queue::join_tasks`](crate::Queue::join_tasks).
    pub async fn join_tasks(&self) -> Result<(), crate::TaskPanicked> {
        self.queue.join_tasks().await
    }

    /// Every item accepted and not yet finished, including those waiting for a delayed or
    /// rate-limited add. See [`DelayingQueue::unfinished`].
    pub fn unfinished(&self) -> Vec<T> {
        self.queue.unfinished()
    }

    /// Whether the queue is shutting down.
    pub fn shutting_down(&self) -> bool {
        self.queue.shutting_down()
    }
}

impl<T> fmt::Debug for RateLimitingQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitingQueue")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    //! Scenarios of client-go's `rate_limiting_queue_test.go`, plus the metrics they feed.

    use std::sync::Arc;

    use futures::FutureExt;
    use prometheus::Registry;

    use super::*;
    use crate::default_rate_limiters::ItemExponentialFailureRateLimiter;
    use crate::metrics::PrometheusMetricsProvider;

    async fn advance(millis: u64) {
        tokio::time::advance(Duration::from_millis(millis)).await;
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    fn exponential(base_ms: u64) -> ItemExponentialFailureRateLimiter<&'static str> {
        ItemExponentialFailureRateLimiter::new(Duration::from_millis(base_ms), Duration::from_secs(1))
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_per_item() {
        let queue = RateLimitingQueue::new(exponential(1));

        queue.add_rate_limited("one"); // 1 ms
        assert_eq!(queue.num_requeues(&"one"), 1);
        queue.add_rate_limited("one"); // 2 ms, merged with the 1 ms schedule
        assert_eq!(queue.num_requeues(&"one"), 2);
        queue.add_rate_limited("two"); // 1 ms
        assert_eq!(queue.num_requeues(&"two"), 1);
        queue.add_rate_limited("two");
        assert_eq!(queue.num_requeues(&"two"), 2);
        assert_eq!(queue.len(), 0);

        advance(1).await;
        assert_eq!(queue.len(), 2, "both items are ready at their earliest time");
        for _ in 0..2 {
            let item = queue.get().now_or_never().flatten().unwrap();
            queue.done(&item);
        }

        queue.forget(&"one");
        assert_eq!(queue.num_requeues(&"one"), 0);
        queue.add_rate_limited("one");
        assert_eq!(queue.num_requeues(&"one"), 1);
        advance(1).await;
        assert_eq!(queue.get().now_or_never().flatten(), Some("one"));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_waits_the_limiter_delay() {
        let queue = RateLimitingQueue::new(exponential(100));
        queue.add_rate_limited("one");
        queue.add_rate_limited("one");
        queue.add_rate_limited("one");
        advance(99).await;
        assert!(queue.is_empty());
        advance(1).await;
        assert_eq!(queue.len(), 1);
        // `forget` resets the backoff but leaves the queued item alone.
        queue.forget(&"one");
        assert_eq!(queue.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn add_rate_limited_after_shut_down_is_ignored() {
        let queue = RateLimitingQueue::new(exponential(1));
        queue.shut_down();
        assert!(queue.shutting_down());
        queue.add_rate_limited("one");
        queue.add_after("two", Duration::ZERO);
        queue.add("three");
        advance(10).await;
        assert!(queue.is_empty());
        assert_eq!(queue.get().await, None);
    }

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
    }

    #[tokio::test(start_paused = true)]
    async fn named_queue_exports_client_go_metrics() {
        let registry = Registry::new();
        let provider = Arc::new(PrometheusMetricsProvider::new(&registry).unwrap());
        let queue = RateLimitingQueue::with_config(
            exponential(10),
            QueueConfig::default().name("test").metrics_provider(provider.clone()),
        );
        // An unnamed queue on the same provider records nothing.
        let unnamed = Queue::with_config(QueueConfig::default().metrics_provider(provider));
        unnamed.add("ignored");

        queue.add("a");
        queue.add("b");
        queue.add("a"); // merged: not an add
        let a = queue.get().await.unwrap();
        queue.add("a"); // dirty while processing: an add, and depth counts it
        queue.add_rate_limited("c");
        queue.add_after("d", Duration::ZERO);

        let scrape = || {
            prometheus::TextEncoder::new()
                .encode_to_string(&registry.gather())
                .unwrap()
        };
        let text = scrape();
        assert_eq!(sample(&text, r#"workqueue_adds_total{name="test"}"#), Some(4.0));
        assert_eq!(sample(&text, r#"workqueue_depth{name="test",priority=""}"#), Some(3.0));
        assert_eq!(sample(&text, r#"workqueue_retries_total{name="test"}"#), Some(2.0));
        assert_eq!(
            sample(&text, r#"workqueue_queue_duration_seconds_count{name="test"}"#),
            Some(1.0)
        );
        assert!(!text.contains(r#"name="""#), "unnamed queue recorded metrics:\n{text}");
        // client-go's buckets: 12 powers of ten from 10 ns (computed by repeated multiplication
        // in both languages, so the same float values), then +Inf.
        let buckets: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with(r#"workqueue_queue_duration_seconds_bucket{name="test""#))
            .collect();
        assert_eq!(buckets.len(), 13);
        assert!(buckets[0].contains(r#"le="0.00000001""#));
        assert!(buckets[11].contains(r#"le="1000""#));

        // The unfinished-work gauges follow the item in hand, refreshed every 500 ms.
        advance(1_000).await;
        let text = scrape();
        assert_eq!(
            sample(&text, r#"workqueue_unfinished_work_seconds{name="test"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"workqueue_longest_running_processor_seconds{name="test"}"#),
            Some(1.0)
        );

        queue.done(&a);
        advance(500).await;
        let text = scrape();
        assert_eq!(
            sample(&text, r#"workqueue_work_duration_seconds_sum{name="test"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"workqueue_unfinished_work_seconds{name="test"}"#),
            Some(0.0)
        );
        // "a" was requeued by done: b, a, c and d wait.
        assert_eq!(sample(&text, r#"workqueue_depth{name="test",priority=""}"#), Some(4.0));
    }

    #[tokio::test(start_paused = true)]
    async fn provider_registers_once_per_registry() {
        let registry = Registry::new();
        PrometheusMetricsProvider::new(&registry).unwrap();
        assert!(PrometheusMetricsProvider::new(&registry).is_err());
    }

    use crate::queue::Queue;
}
