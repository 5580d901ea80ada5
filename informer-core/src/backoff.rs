//! Exponential backoff with jitter for list/watch retries (client-go's
//! `wait.NewExponentialBackoffManager` as the reflector configures it).
//!
//! ```
//! use std::time::Duration;
//! use informer_core::{Backoff, BackoffConfig};
//!
//! let mut backoff = Backoff::new(BackoffConfig::default().initial(Duration::from_millis(100)).jitter(0.0));
//! assert_eq!(backoff.next_delay(), Duration::from_millis(100));
//! assert_eq!(backoff.next_delay(), Duration::from_millis(200));
//! ```

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// Backoff parameters. The default is client-go's reflector backoff: 800 ms doubling to 30 s,
/// each wait stretched by up to 100 % jitter, back to 800 ms after 2 minutes without failure.
///
/// Built from `Default` with the setters, so that fields can be added without a breaking change.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct BackoffConfig {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait before jitter.
    pub max: Duration,
    /// Growth per failure.
    pub factor: f64,
    /// Each wait is `d + random(0..jitter) * d`.
    pub jitter: f64,
    /// A failure this long after the previous one starts again from `initial`.
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: 1.0,
            reset_after: Duration::from_secs(120),
        }
    }
}

impl BackoffConfig {
    /// Sets the first wait.
    #[must_use]
    pub fn initial(mut self, initial: Duration) -> Self {
        self.initial = initial;
        self
    }

    /// Sets the longest wait before jitter.
    #[must_use]
    pub fn max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// Sets the growth per failure (values below 1 count as 1).
    #[must_use]
    pub fn factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// Sets the jitter: each wait is `d + random(0..jitter) * d` (0: none).
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets how long without a failure starts the waits again from `initial`.
    #[must_use]
    pub fn reset_after(mut self, reset_after: Duration) -> Self {
        self.reset_after = reset_after;
        self
    }
}

/// Backoff state: how long to wait after the next failure.
#[derive(Debug)]
pub struct Backoff {
    config: BackoffConfig,
    next: Duration,
    last_failure: Option<Instant>,
}

impl Backoff {
    /// A fresh backoff.
    pub fn new(config: BackoffConfig) -> Self {
        Backoff {
            next: config.initial,
            config,
            last_failure: None,
        }
    }

    /// The wait after a failure now, growing with each failure that follows another within
    /// `reset_after`.
    pub fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        if let Some(last) = self.last_failure
            && now.duration_since(last) > self.config.reset_after
        {
            self.next = self.config.initial;
        }
        self.last_failure = Some(now);
        let base = self.next.min(self.config.max);
        self.next = base.mul_f64(self.config.factor.max(1.0)).min(self.config.max);
        let jitter = if self.config.jitter > 0.0 {
            base.mul_f64(rand::rng().random_range(0.0..self.config.jitter))
        } else {
            Duration::ZERO
        };
        base + jitter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn grows_to_max_and_resets_after_quiet_period() {
        let mut backoff = Backoff::new(BackoffConfig::default().jitter(0.0));
        let delays: Vec<_> = (0..8).map(|_| backoff.next_delay()).collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        tokio::time::advance(Duration::from_secs(121)).await;
        assert_eq!(backoff.next_delay(), Duration::from_millis(800));
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_stays_within_one_base_delay() {
        let mut backoff = Backoff::new(BackoffConfig::default());
        let first = backoff.next_delay();
        assert!(
            first >= Duration::from_millis(800) && first < Duration::from_millis(1600),
            "{first:?}"
        );
    }
}
