//! A seeded fault schedule for chaos tests, shared by every crate's chaos suite so that they
//! exercise the same faults and a seed means the same schedule everywhere.
//!
//! [`inject_faults`] waits 100–400 ms between faults and picks, with a seeded RNG, one of:
//! close every watch; expire the next one or two watch requests (HTTP 410); fail the next one to
//! three requests under a path with 500, 503 or 429 (`Retry-After: 1`); set 10–60 ms of latency;
//! clear the latency; compact the watch cache; restart the watch layer; expire the next watch
//! and close the open ones (an in-stream 410 on resume); or close the open watches and start the
//! next one with a malformed object (see [`Faults::malform_next_watches`]); or restart the server
//! on an older backup of its store ([`Faults::restore`]: objects and resourceVersion go back).
//! The first backup is taken when the schedule starts (a server restored from nearly empty);
//! after a restore the next such pick takes a new backup, the one after restores it. A backup is
//! restored only once the server is [`RESTORE_MIN_BEHIND`] revisions past it: a client can find
//! a server behind it only until the server's counter passes its resourceVersion again, so the
//! gap must outlast the client's check (see informer-core's reflector docs). It clears every
//! fault when it stops.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::faults::Faults;

/// How many revisions the server must be past a backup before the schedule restores it.
/// Chaos suites check for a server behind them well within the time their writers take to
/// write this many (envtest serves a few hundred writes a second to one writer).
pub const RESTORE_MIN_BEHIND: u64 = 500;

/// Injects faults on the schedule `seed` picks until `stop` fires, failing requests whose path
/// starts with `fail_prefix`; then clears every fault. Returns how many were injected.
pub async fn inject_faults(faults: &Faults, fail_prefix: &str, seed: u64, stop: CancellationToken) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut injected = 0;
    let mut backup = Some(faults.snapshot());
    while !stop.is_cancelled() {
        let wait = Duration::from_millis(rng.random_range(100..400));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        match rng.random_range(0..10) {
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
            8 => {
                faults.malform_next_watches(1);
                faults.close_watches();
            }
            _ => match backup.take() {
                None => backup = Some(faults.snapshot()),
                Some(older) => {
                    let now = faults.snapshot().resource_version();
                    if now.saturating_sub(older.resource_version()) >= RESTORE_MIN_BEHIND {
                        faults.restore(&older);
                    } else {
                        backup = Some(older);
                        continue;
                    }
                }
            },
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
