//! Rate limiters deciding how long a failed item waits before it is retried (client-go's
//! `default_rate_limiters.go`).
//!
//! Per-item limiters ([`ItemExponentialFailureRateLimiter`], [`ItemFastSlowRateLimiter`]) back
//! off one item that keeps failing; the overall [`BucketRateLimiter`] caps the retry rate of the
//! whole queue. [`default_controller_rate_limiter`] combines both, as client-go's controllers do.
//!
//! ```
//! use std::time::Duration;
//! use workqueue::{ItemExponentialFailureRateLimiter, RateLimiter};
//!
//! let limiter = ItemExponentialFailureRateLimiter::new(
//!     Duration::from_millis(5),
//!     Duration::from_secs(1000),
//! );
//! assert_eq!(limiter.when(&"pod"), Duration::from_millis(5));
//! assert_eq!(limiter.when(&"pod"), Duration::from_millis(10));
//! assert_eq!(limiter.num_requeues(&"pod"), 2);
//! limiter.forget(&"pod"); // it succeeded: start over
//! assert_eq!(limiter.when(&"pod"), Duration::from_millis(5));
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Decides how long an item waits before it is retried (client-go's `TypedRateLimiter`).
pub trait RateLimiter<T>: Send + Sync {
    /// Records a failure of `item` and returns how long it must wait before its retry.
    fn when(&self, item: &T) -> Duration;
    /// Forgets `item`'s failures: it succeeded, or it is given up on.
    fn forget(&self, item: &T);
    /// How many times `item` has failed (been retried) since it was last forgotten.
    fn num_requeues(&self, item: &T) -> usize;
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Box<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }
    fn forget(&self, item: &T) {
        (**self).forget(item);
    }
    fn num_requeues(&self, item: &T) -> usize {
        (**self).num_requeues(item)
    }
}

/// client-go's `DefaultControllerRateLimiter`: per-item exponential backoff from 5 ms up to
/// 1000 s, and at most 10 retries per second overall with bursts of 100.
pub fn default_controller_rate_limiter<T: Clone + Eq + Hash + Send + Sync + 'static>() -> MaxOfRateLimiter<T> {
    MaxOfRateLimiter::new(vec![
        Box::new(ItemExponentialFailureRateLimiter::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        )),
        Box::new(BucketRateLimiter::new(10.0, 100)),
    ])
}

/// Locks a limiter's state.
fn lock<S>(state: &Mutex<S>) -> MutexGuard<'_, S> {
    // A panic under these locks can only come from `T`'s `Hash`/`Eq`/`Clone`; the counters stay
    // meaningful for every other item, so keep going.
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits `base_delay * 2^failures`, capped at `max_delay` (client-go's
/// `ItemExponentialFailureRateLimiter`).
pub struct ItemExponentialFailureRateLimiter<T> {
    base_delay: Duration,
    max_delay: Duration,
    /// Failures per item since it was last forgotten; items never failed are absent.
    failures: Mutex<HashMap<T, u32>>,
}

impl<T> ItemExponentialFailureRateLimiter<T> {
    /// Backs off from `base_delay`, doubling per failure, up to `max_delay`.
    pub fn new(base_delay: Duration, max_delay: Duration) -> Self {
        Self {
            base_delay,
            max_delay,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// `base_delay * 2^exponent`, or `max_delay` if that is larger or does not fit a `Duration`.
    fn backoff(&self, exponent: u32) -> Duration {
        // In f64 the product cannot overflow (it saturates to infinity) and stays exact for every
        // value below the cap that matters: base delays are whole nanoseconds times a power of 2.
        let nanos = self.base_delay.as_nanos() as f64 * 2f64.powf(f64::from(exponent));
        if nanos >= self.max_delay.as_nanos() as f64 || nanos >= u64::MAX as f64 {
            self.max_delay
        } else {
            Duration::from_nanos(nanos as u64)
        }
    }
}

impl<T: Clone + Eq + Hash + Send + Sync> RateLimiter<T> for ItemExponentialFailureRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        let exponent = {
            let mut failures = lock(&self.failures);
            let count = failures.entry(item.clone()).or_insert(0);
            let exponent = *count;
            *count = count.saturating_add(1);
            exponent
        };
        self.backoff(exponent)
    }

    fn forget(&self, item: &T) {
        lock(&self.failures).remove(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        lock(&self.failures).get(item).map_or(0, |&n| n as usize)
    }
}

impl<T> fmt::Debug for ItemExponentialFailureRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemExponentialFailureRateLimiter")
            .field("base_delay", &self.base_delay)
            .field("max_delay", &self.max_delay)
            .finish_non_exhaustive()
    }
}

/// Waits `fast_delay` for an item's first `max_fast_attempts` failures, then `slow_delay`
/// (client-go's `ItemFastSlowRateLimiter`).
pub struct ItemFastSlowRateLimiter<T> {
    fast_delay: Duration,
    slow_delay: Duration,
    max_fast_attempts: u32,
    /// Failures per item since it was last forgotten; items never failed are absent.
    failures: Mutex<HashMap<T, u32>>,
}

impl<T> ItemFastSlowRateLimiter<T> {
    /// Retries quickly `max_fast_attempts` times, then slowly.
    pub fn new(fast_delay: Duration, slow_delay: Duration, max_fast_attempts: u32) -> Self {
        Self {
            fast_delay,
            slow_delay,
            max_fast_attempts,
            failures: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Clone + Eq + Hash + Send + Sync> RateLimiter<T> for ItemFastSlowRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        let mut failures = lock(&self.failures);
        let count = failures.entry(item.clone()).or_insert(0);
        *count = count.saturating_add(1);
        if *count <= self.max_fast_attempts {
            self.fast_delay
        } else {
            self.slow_delay
        }
    }

    fn forget(&self, item: &T) {
        lock(&self.failures).remove(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        lock(&self.failures).get(item).map_or(0, |&n| n as usize)
    }
}

impl<T> fmt::Debug for ItemFastSlowRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemFastSlowRateLimiter")
            .field("fast_delay", &self.fast_delay)
            .field("slow_delay", &self.slow_delay)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .finish_non_exhaustive()
    }
}

/// A token bucket shared by all items (client-go's `BucketRateLimiter` over
/// `golang.org/x/time/rate`).
///
/// Every call to [`when`](RateLimiter::when) takes a token. While the bucket holds tokens the
/// delay is zero; once it is empty, `when` *reserves* the next token to be refilled and returns
/// the wait until then, like `rate.Limiter.Reserve().Delay()`. The bucket goes into debt, so `n`
/// calls in a row on an empty bucket are spread `1/qps` apart rather than all waiting the same.
/// It keeps no per-item state: `forget` does nothing and `num_requeues` is 0.
#[derive(Debug)]
pub struct BucketRateLimiter {
    qps: f64,
    burst: u32,
    bucket: Mutex<Bucket>,
}

/// Invariant: `tokens <= burst`; negative while tokens are reserved ahead of their refill.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    /// When `tokens` was last brought up to date.
    updated: Instant,
}

impl BucketRateLimiter {
    /// A bucket of `burst` tokens (initially full) refilled at `qps` tokens per second.
    ///
    /// As in Go: infinite `qps` never waits; zero (or negative, or NaN) `qps` hands out the
    /// initial `burst` tokens and then returns [`Duration::MAX`], meaning "never"; a zero `burst`
    /// with finite `qps` also means never.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            qps,
            burst,
            bucket: Mutex::new(Bucket {
                tokens: f64::from(burst),
                updated: Instant::now(),
            }),
        }
    }

    /// Takes a token at `now`, returning the wait until it is actually available.
    fn reserve(&self, now: Instant) -> Duration {
        if self.qps == f64::INFINITY {
            return Duration::ZERO;
        }
        let mut bucket = lock(&self.bucket);
        let refill_rate = if self.qps > 0.0 { self.qps } else { 0.0 };
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        let tokens = (bucket.tokens + elapsed * refill_rate).min(f64::from(self.burst));
        bucket.updated = now;
        bucket.tokens = tokens;
        if self.burst == 0 || (refill_rate == 0.0 && tokens < 1.0) {
            // Go's "reservation not OK": no token is taken and the wait is infinite.
            return Duration::MAX;
        }
        bucket.tokens = tokens - 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-bucket.tokens / refill_rate).unwrap_or(Duration::MAX)
        }
    }
}

impl<T> RateLimiter<T> for BucketRateLimiter {
    fn when(&self, _item: &T) -> Duration {
        self.reserve(Instant::now())
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> usize {
        0
    }
}

/// The strictest of several limiters: the longest wait and the largest requeue count (client-go's
/// `MaxOfRateLimiter`). Every limiter sees every call.
pub struct MaxOfRateLimiter<T> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

impl<T> MaxOfRateLimiter<T> {
    /// Combines `limiters`. With none, every wait is zero.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        Self { limiters }
    }
}

impl<T> RateLimiter<T> for MaxOfRateLimiter<T> {
    fn when(&self, item: &T) -> Duration {
        // Not `max()` on an iterator chain that could short-circuit: each limiter must record
        // the failure.
        self.limiters
            .iter()
            .map(|limiter| limiter.when(item))
            .fold(Duration::ZERO, Duration::max)
    }

    fn forget(&self, item: &T) {
        for limiter in &self.limiters {
            limiter.forget(item);
        }
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.limiters
            .iter()
            .map(|limiter| limiter.num_requeues(item))
            .max()
            .unwrap_or(0)
    }
}

impl<T> fmt::Debug for MaxOfRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaxOfRateLimiter")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

/// Caps another limiter's waits at `max_delay` (client-go's `WithMaxWaitRateLimiter`).
#[derive(Debug)]
pub struct WithMaxWaitRateLimiter<R> {
    limiter: R,
    max_delay: Duration,
}

impl<R> WithMaxWaitRateLimiter<R> {
    /// Wraps `limiter` so no wait exceeds `max_delay`.
    pub fn new(limiter: R, max_delay: Duration) -> Self {
        Self { limiter, max_delay }
    }
}

/// Caps `limiter`'s waits at `max_delay`; see [`WithMaxWaitRateLimiter`].
pub fn with_max_wait<R>(limiter: R, max_delay: Duration) -> WithMaxWaitRateLimiter<R> {
    WithMaxWaitRateLimiter::new(limiter, max_delay)
}

impl<T, R: RateLimiter<T>> RateLimiter<T> for WithMaxWaitRateLimiter<R> {
    fn when(&self, item: &T) -> Duration {
        self.limiter.when(item).min(self.max_delay)
    }

    fn forget(&self, item: &T) {
        self.limiter.forget(item);
    }

    fn num_requeues(&self, item: &T) -> usize {
        self.limiter.num_requeues(item)
    }
}

#[cfg(test)]
mod tests;
