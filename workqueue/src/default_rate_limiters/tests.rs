//! Scenarios of client-go's `default_rate_limiters_test.go`.

use super::*;

const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// `when` for `item`, `n` times.
fn whens<T>(limiter: &impl RateLimiter<T>, item: &T, n: usize) -> Vec<Duration> {
    (0..n).map(|_| limiter.when(item)).collect()
}

#[test]
fn exponential_doubles_per_item_and_forgets() {
    let limiter = ItemExponentialFailureRateLimiter::new(ms(1), Duration::from_secs(1));
    assert_eq!(whens(&limiter, &"one", 5), [ms(1), ms(2), ms(4), ms(8), ms(16)]);
    assert_eq!(limiter.num_requeues(&"one"), 5);
    assert_eq!(whens(&limiter, &"two", 2), [ms(1), ms(2)]);
    assert_eq!(limiter.num_requeues(&"two"), 2);
    limiter.forget(&"one");
    assert_eq!(limiter.num_requeues(&"one"), 0);
    assert_eq!(limiter.when(&"one"), ms(1));
    assert_eq!(limiter.num_requeues(&"two"), 2, "forget is per item");
}

#[test]
fn exponential_caps_at_max_delay() {
    let limiter = ItemExponentialFailureRateLimiter::new(ms(1), Duration::from_secs(1));
    let delays = whens(&limiter, &"one", 12);
    assert_eq!(delays[9], ms(512));
    assert_eq!(delays[10], Duration::from_secs(1), "1024 ms is capped");
    assert_eq!(delays[11], Duration::from_secs(1));
}

#[test]
fn exponential_does_not_overflow() {
    let limiter = ItemExponentialFailureRateLimiter::new(ms(1), Duration::from_secs(1000));
    assert_eq!(whens(&limiter, &"one", 6)[5], ms(32));
    assert_eq!(
        *whens(&limiter, &"overflow", 1000).last().unwrap(),
        Duration::from_secs(1000)
    );

    // A cap beyond what any u64 of nanoseconds holds: the cap applies, no panic.
    let limiter = ItemExponentialFailureRateLimiter::new(Duration::from_secs(60), Duration::MAX);
    assert_eq!(
        whens(&limiter, &"one", 2),
        [Duration::from_secs(60), Duration::from_secs(120)]
    );
    assert_eq!(limiter.backoff(u32::MAX), Duration::MAX);
    assert_eq!(limiter.backoff(64), Duration::MAX);

    // The failure count saturates instead of wrapping back to fast retries.
    lock(&limiter.failures).insert("saturated", u32::MAX);
    assert_eq!(limiter.when(&"saturated"), Duration::MAX);
    assert_eq!(limiter.num_requeues(&"saturated"), u32::MAX as usize);
}

#[test]
fn exponential_default_base_is_exact() {
    let limiter = ItemExponentialFailureRateLimiter::new(ms(5), Duration::from_secs(1000));
    assert_eq!(whens(&limiter, &"one", 4), [ms(5), ms(10), ms(20), ms(40)]);
}

#[test]
fn fast_slow_switches_after_max_fast_attempts() {
    let limiter = ItemFastSlowRateLimiter::new(ms(5), Duration::from_secs(10), 3);
    let slow = Duration::from_secs(10);
    assert_eq!(whens(&limiter, &"one", 5), [ms(5), ms(5), ms(5), slow, slow]);
    assert_eq!(limiter.num_requeues(&"one"), 5);
    assert_eq!(whens(&limiter, &"two", 2), [ms(5), ms(5)]);
    assert_eq!(limiter.num_requeues(&"two"), 2);
    limiter.forget(&"one");
    assert_eq!(limiter.num_requeues(&"one"), 0);
    assert_eq!(limiter.when(&"one"), ms(5));
}

#[test]
fn max_of_takes_the_longest_wait() {
    let limiter = MaxOfRateLimiter::new(vec![
        Box::new(ItemFastSlowRateLimiter::new(ms(5), Duration::from_secs(3), 3)),
        Box::new(ItemExponentialFailureRateLimiter::new(ms(1), Duration::from_secs(1))),
    ]);
    let slow = Duration::from_secs(3);
    assert_eq!(whens(&limiter, &"one", 5), [ms(5), ms(5), ms(5), slow, slow]);
    assert_eq!(limiter.num_requeues(&"one"), 5);
    assert_eq!(whens(&limiter, &"two", 2), [ms(5), ms(5)]);
    assert_eq!(limiter.num_requeues(&"two"), 2);
    limiter.forget(&"one");
    assert_eq!(limiter.num_requeues(&"one"), 0);
    assert_eq!(limiter.when(&"one"), ms(5));
}

#[test]
fn max_of_nothing_never_waits() {
    let limiter = MaxOfRateLimiter::<&str>::new(Vec::new());
    assert_eq!(limiter.when(&"one"), Duration::ZERO);
    assert_eq!(limiter.num_requeues(&"one"), 0);
}

/// Asserts two durations are within a microsecond (the bucket computes in f64 seconds).
fn assert_close(actual: Duration, expected: Duration) {
    let diff = actual.abs_diff(expected);
    assert!(diff <= Duration::from_micros(1), "{actual:?} != {expected:?}");
}

#[tokio::test(start_paused = true)]
async fn bucket_spends_burst_then_reserves_future_tokens() {
    let limiter = BucketRateLimiter::new(10.0, 100);
    for i in 0..100 {
        assert_eq!(RateLimiter::<&str>::when(&limiter, &"any"), Duration::ZERO, "token {i}");
    }
    // Reserved ahead, 100 ms apart: each call takes the next token to be refilled.
    for n in 1..=3 {
        assert_close(limiter.when(&"any"), ms(100 * n));
    }
    // One second refills 10 tokens; 3 pay back the debt, 7 are available.
    tokio::time::advance(Duration::from_secs(1)).await;
    for _ in 0..7 {
        assert_eq!(limiter.when(&"any"), Duration::ZERO);
    }
    assert_close(limiter.when(&"any"), ms(100));
    assert_eq!(RateLimiter::<&str>::num_requeues(&limiter, &"any"), 0);
}

#[tokio::test(start_paused = true)]
async fn bucket_refills_up_to_burst_only() {
    let limiter = BucketRateLimiter::new(1.0, 3);
    assert_eq!(whens(&limiter, &"a", 3), [Duration::ZERO; 3]);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(whens(&limiter, &"a", 3), [Duration::ZERO; 3]);
    assert_close(limiter.when(&"a"), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn bucket_edge_rates() {
    let unlimited = BucketRateLimiter::new(f64::INFINITY, 0);
    assert_eq!(whens(&unlimited, &"a", 1000), vec![Duration::ZERO; 1000]);

    let never_refills = BucketRateLimiter::new(0.0, 2);
    assert_eq!(
        whens(&never_refills, &"a", 3),
        [Duration::ZERO, Duration::ZERO, Duration::MAX]
    );
    let negative = BucketRateLimiter::new(-1.0, 0);
    assert_eq!(negative.when(&"a"), Duration::MAX);
    let nan = BucketRateLimiter::new(f64::NAN, 1);
    assert_eq!(whens(&nan, &"a", 2), [Duration::ZERO, Duration::MAX]);
    let no_burst = BucketRateLimiter::new(10.0, 0);
    assert_eq!(no_burst.when(&"a"), Duration::MAX);
}

#[tokio::test(start_paused = true)]
async fn default_controller_limiter_combines_backoff_and_bucket() {
    let limiter = default_controller_rate_limiter::<String>();
    let one = "one".to_owned();
    assert_eq!(whens(&limiter, &one, 3), [ms(5), ms(10), ms(20)]);
    assert_eq!(limiter.num_requeues(&one), 3);
    // 97 more distinct items spend the rest of the burst at their first, 5 ms, backoff.
    for i in 0..97 {
        assert_eq!(limiter.when(&format!("item-{i}")), ms(5));
    }
    // Now the bucket dominates a fresh item's 5 ms.
    assert_close(limiter.when(&"two".to_owned()), ms(100));
    limiter.forget(&one);
    assert_eq!(limiter.num_requeues(&one), 0);
}

#[test]
fn with_max_wait_caps_delays() {
    let limiter = with_max_wait(
        ItemExponentialFailureRateLimiter::new(Duration::from_secs(1), Duration::from_secs(1000)),
        Duration::from_secs(5),
    );
    let secs = Duration::from_secs;
    assert_eq!(
        whens(&limiter, &"one", 5),
        [secs(1), secs(2), secs(4), secs(5), secs(5)]
    );
    assert_eq!(limiter.num_requeues(&"one"), 5);
    limiter.forget(&"one");
    assert_eq!(limiter.num_requeues(&"one"), 0);
    assert_eq!(limiter.when(&"one"), secs(1));
}
