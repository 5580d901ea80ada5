//! A seeded fault schedule for chaos tests, shared by every crate's chaos suite so that they
//! exercise the same faults and a seed means the same schedule everywhere.
//!
//! [`inject_faults`] waits 100–400 ms between faults and picks, with a seeded RNG, one of:
//! close every watch; expire the next one or two watch requests (HTTP 410); fail the next one to
//! three requests under a path with 500, 503 or 429 (`Retry-After: 1`); set 10–60 ms of latency;
//! clear the latency; compact the watch cache; restart the watch layer; expire the next watch
//! and close the open ones (an in-stream 410 on resume); or close the open watches and start the
//! next one with a malformed object (see [`Faults::malform_next_watches`]). It clears every fault
//! when it stops.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::faults::Faults;

/// Injects faults on the schedule `seed` picks until `stop` fires, failing requests whose path
/// starts with `fail_prefix`; then clears every fault. Returns how many were injected.
pub async fn inject_faults(faults: &Faults, fail_prefix: &str, seed: u64, stop: CancellationToken) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut injected = 0;
    while !stop.is_cancelled() {
        let wait = Duration::from_millis(rng.random_range(100..400));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        match rng.random_range(0..9) {
            0 => faults.close_watches(),
            1 => faults.expire_next_watches(rng.random_range(1..3)),
            2 => faults.fail_next(
                fail_prefix,
                [500, 503, 429][rng.random_range(0..3)],
                rng.random_range(1..4),
                1,
            ),
            3 => faults.set_latency(Duration::from_millis(rng.random_range(10..60))),
            4 => faults.set_latency(Duration::ZERO),
            5 => faults.compact(),
            6 => faults.restart(),
            7 => {
                faults.expire_next_watches(1);
                faults.close_watches();
            }
            _ => {
                faults.malform_next_watches(1);
                faults.close_watches();
            }
        }
        injected += 1;
    }
    faults.clear();
    injected
}

/// The seeds to run: the one in `KINFORMER_CHAOS_SEED` (to replay a failure), else `default`.
pub fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("KINFORMER_CHAOS_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(seed) => vec![seed],
        None => default.to_vec(),
    }
}

/// How long each seed's chaos lasts: `KINFORMER_CHAOS_SECS` seconds, else `default_secs`.
pub fn chaos_time(default_secs: u64) -> Duration {
    Duration::from_secs(
        std::env::var("KINFORMER_CHAOS_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default_secs),
    )
}
