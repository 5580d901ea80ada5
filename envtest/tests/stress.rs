//! Load: many watchers and a fast writer; a watcher that never reads.
//!
//! `ENVTEST_STRESS_SECS` (default 10) and `ENVTEST_STRESS_RATE` (writes/s, default 2000) scale
//! the load test.

mod common;

use common::{RawConn, RawWatch, event_summary, wait_for};
use envtest::{Config, Server};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const CM: &str = "/api/v1/namespaces/default/configmaps";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What one watcher saw.
#[derive(Debug, Default)]
struct Seen {
    /// Revisions of the events, in arrival order.
    rvs: Vec<u64>,
    /// Whether a resume was answered with 410 (the watcher was cut off and fell out of the
    /// cache window).
    expired: bool,
    /// Number of watch requests made (1 + re-watches).
    watches: u32,
}

/// Watches from `start` until `final_rv` (once known) is reached, re-watching from the last
/// revision whenever the server closes the stream, and stopping at a 410.
async fn watcher(base: String, start: u64, final_rv: Arc<AtomicU64>) -> Seen {
    let mut seen = Seen::default();
    let mut last = start;
    loop {
        let target = final_rv.load(Ordering::SeqCst);
        if target != 0 && last >= target {
            return seen;
        }
        seen.watches += 1;
        let mut w = RawWatch::open(
            &base,
            &format!("{CM}?watch=true&resourceVersion={last}&allowWatchBookmarks=true"),
        )
        .await
        .expect("open watch");
        assert_eq!(w.status, 200);
        loop {
            let target = final_rv.load(Ordering::SeqCst);
            if target != 0 && last >= target {
                return seen;
            }
            let Ok(next) = tokio::time::timeout(Duration::from_millis(500), w.next_line()).await else {
                continue;
            };
            let Some(line) = next else { break };
            let (ty, rv, code) = event_summary(&line);
            match ty.as_str() {
                "ERROR" => {
                    assert_eq!(code, 410, "unexpected error event {line}");
                    seen.expired = true;
                    return seen;
                }
                "BOOKMARK" => {
                    assert!(rv >= last, "bookmark went backwards: {rv} < {last}");
                    last = rv;
                }
                _ => {
                    seen.rvs.push(rv);
                    last = rv;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_watchers_and_a_fast_writer() {
    let secs = env_or("ENVTEST_STRESS_SECS", 10);
    let rate = env_or("ENVTEST_STRESS_RATE", 2000);
    let cache_size = 8192;
    let env = Server::start(
        Config::default()
            .watch_cache_size(cache_size)
            .bookmark_interval(Duration::from_millis(200))
            .request_log_capacity(1000),
    )
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let objects = 100;
    for i in 0..objects {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(format!("s{i}"));
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    let start = env.current_resource_version();
    let final_rv = Arc::new(AtomicU64::new(0));
    let watchers: Vec<_> = (0..50)
        .map(|_| tokio::spawn(watcher(env.base_url().to_owned(), start, final_rv.clone())))
        .collect();
    wait_for(Duration::from_secs(10), "50 watches to register", || {
        let n = env.watcher_count();
        async move { n >= 50 }
    })
    .await;

    // Writers: 8 keep-alive connections sharing the rate, for at most `secs` seconds; every
    // write is a change, so takes exactly one revision.
    let total = secs * rate;
    let writers = 8u64;
    let period = Duration::from_secs_f64(writers as f64 / rate as f64);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let began = std::time::Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let base = env.base_url().to_owned();
            async move {
                let mut conn = RawConn::connect(&base).await.unwrap();
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                for n in (w..total).step_by(writers as usize) {
                    tick.tick().await;
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                    let body = format!(r#"{{"data":{{"n":"{n}"}}}}"#);
                    let (code, resp) = conn
                        .request(
                            "PATCH",
                            &format!("{CM}/s{}", n % objects),
                            "application/merge-patch+json",
                            body.as_bytes(),
                        )
                        .await
                        .unwrap();
                    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&resp));
                }
            }
        })
        .collect();
    let mut peak = 0;
    let writes = futures::future::join_all(tasks);
    tokio::pin!(writes);
    loop {
        tokio::select! {
            _ = &mut writes => break,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                peak = peak.max(env.watch_cache_len());
                assert!(env.watch_cache_len() <= cache_size, "watch cache exceeded its bound");
                assert!(env.watcher_count() <= 50, "watchers leaked");
            }
        }
    }
    let elapsed = began.elapsed();
    let end = env.current_resource_version();
    let total = end - start;
    assert!(total > 0);
    final_rv.store(end, Ordering::SeqCst);

    let mut complete = 0;
    let mut cut = 0;
    let mut rewatches = 0;
    for (i, w) in watchers.into_iter().enumerate() {
        let seen = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .unwrap_or_else(|_| panic!("watcher {i} did not finish"))
            .unwrap();
        rewatches += seen.watches - 1;
        // Every event in revision order, none skipped: revisions are contiguous from the start.
        for (k, rv) in seen.rvs.iter().enumerate() {
            assert_eq!(*rv, start + 1 + k as u64, "watcher {i}: gap or reorder at event {k}");
        }
        if seen.expired {
            cut += 1;
        } else {
            assert_eq!(seen.rvs.len() as u64, total, "watcher {i} missed events");
            complete += 1;
        }
    }
    assert!(env.watch_cache_len() <= cache_size);
    eprintln!(
        "{total} writes in {elapsed:?} ({:.0}/s); watchers: {complete} complete, {cut} cut off with 410; {rewatches} re-watches; peak cache {peak}/{cache_size}",
        total as f64 / elapsed.as_secs_f64()
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_does_not_stall_writers_or_others() {
    let env = Server::start(
        Config::default()
            .watch_cache_size(4096)
            .watcher_buffer(16)
            .slow_watcher_grace(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let mut c = ConfigMap::default();
    c.metadata.name = Some("big".into());
    api.create(&PostParams::default(), &c).await.unwrap();
    let start = env.current_resource_version();

    // The stuck client: tiny receive window, never reads.
    let stuck = RawWatch::open_with_socket(
        env.base_url(),
        &format!("{CM}?watch=true&resourceVersion={start}"),
        Some(4096),
    )
    .await
    .unwrap();
    let final_rv = Arc::new(AtomicU64::new(0));
    let healthy2 = tokio::spawn(watcher(env.base_url().to_owned(), start, final_rv.clone()));
    wait_for(Duration::from_secs(10), "watches to register", || {
        let n = env.watcher_count();
        async move { n >= 2 }
    })
    .await;

    // 32 KiB per event (25 MiB in all, far beyond loopback socket buffers): the stuck watcher
    // must fill its input and be cut off. If a
    // writer ever waited for that watcher, this loop would hang and the timeout would fail it.
    let payload = "x".repeat(32 * 1024);
    let writes = 800u64;
    let pp = PatchParams::default();
    tokio::time::timeout(Duration::from_secs(60), async {
        for n in 0..writes {
            api.patch(
                "big",
                &pp,
                &Patch::Merge(json!({"data": {"n": n.to_string(), "p": payload}})),
            )
            .await
            .unwrap();
        }
    })
    .await
    .expect("writes stalled behind a slow watcher");
    let end = env.current_resource_version();
    assert_eq!(end - start, writes);
    final_rv.store(end, Ordering::SeqCst);

    // The stuck watcher is terminated after its grace period; the healthy one saw everything.
    wait_for(Duration::from_secs(10), "the stuck watcher to be terminated", || {
        let n = env.watcher_count();
        async move { n <= 1 }
    })
    .await;
    let seen = tokio::time::timeout(Duration::from_secs(60), healthy2)
        .await
        .unwrap()
        .unwrap();
    assert!(!seen.expired);
    assert_eq!(seen.rvs, (start + 1..=end).collect::<Vec<_>>());
    drop(stuck);
    env.shutdown().await;
}
