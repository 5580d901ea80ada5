//! Informer throughput on each queue, and what listeners cost.
//!
//! `cargo bench -p kinformer-core --bench informer [-- --quick]`
//!
//! **Throughput.** A `SharedIndexInformer<ConfigMap>` over an in-memory `ListerWatcher` whose
//! list and watch hand over objects decoded beforehand, so what is timed is the informer
//! alone: reflector → queue → cache → listeners → handlers. Phase 1 lists N ConfigMaps (~1 KB)
//! until every handler has taken the initial adds; phase 2 streams M MODIFIED events (watch
//! opened only once phase 1 is done) until every handler has seen them. Runs alternate
//! RealFifo / DeltaFifo over several rounds on one 2-worker runtime; medians are printed with
//! the ratio RealFifo / DeltaFifo (time: below 1 is faster; rate: above 1 is faster).
//!
//! **Listeners.** 1,000 registrations on one informer (100 objects, then 100 updates), with
//! the OS thread count and resident memory of this process before registering, once every
//! registration has synced, and after the updates were delivered.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use informer_core::{
    HandlerOptions, InformerConfig, ListPage, ListWatchError, ListerWatcher, QueueKind, ResourceEventHandler,
    SharedIndexInformer, WatchStream,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, WatchEvent, WatchParams};
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

/// A watch's events, served once `go` fires.
type GatedEvents = (oneshot::Receiver<()>, Vec<WatchEvent<ConfigMap>>);

/// Serves one prepared list, then one prepared watch once `go` fires; later watches pend.
struct Prepared {
    list: Mutex<Option<Vec<ConfigMap>>>,
    events: Mutex<Option<GatedEvents>>,
}

impl ListerWatcher<ConfigMap> for Prepared {
    fn list(&self, _: &ListParams) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        let items = self.list.lock().unwrap().take().unwrap_or_default();
        Box::pin(async move { Ok(ListPage::new(items, "1")) })
    }

    fn watch(&self, _: &WatchParams, _: &str) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
        let prepared = self.events.lock().unwrap().take();
        Box::pin(async move {
            let stream: WatchStream<ConfigMap> = match prepared {
                Some((go, events)) => {
                    let _ = go.await;
                    Box::pin(futures::stream::iter(events.into_iter().map(Ok)).chain(futures::stream::pending()))
                }
                None => Box::pin(futures::stream::pending()),
            };
            Ok(stream)
        })
    }
}

use futures::StreamExt;

fn configmap(i: usize, rv: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("cm-{i:06}")),
            namespace: Some("default".into()),
            resource_version: Some(rv.to_string()),
            labels: Some([("app".to_string(), format!("app-{}", i % 50))].into()),
            ..ObjectMeta::default()
        },
        data: Some([("payload".to_string(), "x".repeat(900))].into()),
        ..ConfigMap::default()
    }
}

/// Counts notifications and wakes the bench when a target is reached.
struct Counter {
    seen: AtomicUsize,
    target: AtomicUsize,
    reached: Arc<Notify>,
}

impl Counter {
    fn bump(&self) {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.target.load(Ordering::Relaxed) {
            self.reached.notify_one();
        }
    }
}

struct Counting(Arc<Counter>);

impl ResourceEventHandler<ConfigMap> for Counting {
    fn on_add(&self, _: &Arc<ConfigMap>, _: bool) {
        self.0.bump();
    }
    fn on_update(&self, _: &Arc<ConfigMap>, _: &Arc<ConfigMap>) {
        self.0.bump();
    }
}

struct Round {
    list: Duration,
    watch: Duration,
}

async fn wait_all(counters: &[Arc<Counter>], target: usize) {
    for c in counters {
        c.target.store(target, Ordering::Relaxed);
    }
    for c in counters {
        while c.seen.load(Ordering::Relaxed) < target {
            let _ = tokio::time::timeout(Duration::from_millis(5), c.reached.notified()).await;
        }
    }
}

async fn round(queue: QueueKind, n: usize, m: usize, handlers: usize) -> Round {
    let list: Vec<ConfigMap> = (0..n).map(|i| configmap(i, 1)).collect();
    let events: Vec<WatchEvent<ConfigMap>> = (0..m).map(|j| WatchEvent::Modified(configmap(j % n, 2 + j))).collect();
    let (go_tx, go_rx) = oneshot::channel();
    let lw = Prepared {
        list: Mutex::new(Some(list)),
        events: Mutex::new(Some((go_rx, events))),
    };
    let informer = SharedIndexInformer::new(lw, InformerConfig::default().queue(queue));
    let counters: Vec<Arc<Counter>> = (0..handlers)
        .map(|_| {
            Arc::new(Counter {
                seen: AtomicUsize::new(0),
                target: AtomicUsize::new(usize::MAX),
                reached: Arc::new(Notify::new()),
            })
        })
        .collect();
    for c in &counters {
        informer
            .add_event_handler_with_options(Counting(c.clone()), HandlerOptions::default().non_blocking())
            .unwrap();
    }
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let task = tokio::spawn({
        let informer = informer.clone();
        let shutdown = shutdown.clone();
        async move { informer.run(shutdown).await }
    });
    wait_all(&counters, n).await;
    while !informer.has_synced() {
        tokio::task::yield_now().await;
    }
    let list = start.elapsed();
    let start = Instant::now();
    let _ = go_tx.send(());
    wait_all(&counters, n + m).await;
    let watch = start.elapsed();
    shutdown.cancel();
    let _ = task.await;
    Round { list, watch }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `Threads:` and `VmRSS:` (KiB) of this process, from /proc (Linux).
fn threads_and_rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

async fn listeners(registrations: usize, non_blocking: bool) {
    let objects = 100;
    let list: Vec<ConfigMap> = (0..objects).map(|i| configmap(i, 1)).collect();
    let events: Vec<WatchEvent<ConfigMap>> = (0..objects)
        .map(|i| WatchEvent::Modified(configmap(i, 2 + i)))
        .collect();
    let (go_tx, go_rx) = oneshot::channel();
    let lw = Prepared {
        list: Mutex::new(Some(list)),
        events: Mutex::new(Some((go_rx, events))),
    };
    let (threads0, rss0) = threads_and_rss();
    let informer = SharedIndexInformer::new(lw, InformerConfig::default());
    let mut counters = Vec::new();
    let mut regs = Vec::new();
    for _ in 0..registrations {
        let c = Arc::new(Counter {
            seen: AtomicUsize::new(0),
            target: AtomicUsize::new(usize::MAX),
            reached: Arc::new(Notify::new()),
        });
        let options = if non_blocking {
            HandlerOptions::default().non_blocking()
        } else {
            HandlerOptions::default()
        };
        regs.push(
            informer
                .add_event_handler_with_options(Counting(c.clone()), options)
                .unwrap(),
        );
        counters.push(c);
    }
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let informer = informer.clone();
        let shutdown = shutdown.clone();
        async move { informer.run(shutdown).await }
    });
    while !regs.iter().all(|r| r.has_synced()) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (threads1, rss1) = threads_and_rss();
    let _ = go_tx.send(());
    wait_all(&counters, 2 * objects).await;
    let (threads2, rss2) = threads_and_rss();
    println!(
        "| {registrations} | {} | {threads0} | {threads1} | {threads2} | {:.1} | {:.1} |",
        if non_blocking {
            "non-blocking (task)"
        } else {
            "default (blocking pool)"
        },
        (rss1 as f64 - rss0 as f64) / 1024.0,
        (rss2 as f64 - rss0 as f64) / 1024.0,
    );
    shutdown.cancel();
    let _ = task.await;
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, m, rounds) = if quick {
        (5_000, 20_000, 3)
    } else {
        (20_000, 100_000, 5)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!("## informer throughput: {n} ConfigMaps listed, then {m} watch updates; medians of {rounds} interleaved rounds\n");
        println!("| handlers | queue | list → synced (ms) | watch updates/s | ratio list time Real/Delta | ratio rate Real/Delta |");
        println!("|---|---|---|---|---|---|");
        for handlers in [1, 10] {
            let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
            // One warm-up round each, not counted.
            round(QueueKind::RealFifo, n / 10, m / 10, handlers).await;
            round(QueueKind::DeltaFifo, n / 10, m / 10, handlers).await;
            for _ in 0..rounds {
                for (i, queue) in [QueueKind::RealFifo, QueueKind::DeltaFifo].into_iter().enumerate() {
                    let r = round(queue, n, m, handlers).await;
                    results[i].0.push(r.list.as_secs_f64() * 1e3);
                    results[i].1.push(m as f64 / r.watch.as_secs_f64());
                }
            }
            let real = (median(results[0].0.clone()), median(results[0].1.clone()));
            let delta = (median(results[1].0.clone()), median(results[1].1.clone()));
            println!("| {handlers} | RealFifo | {:.0} | {:.0} | {:.2}× | {:.2}× |", real.0, real.1, real.0 / delta.0, real.1 / delta.1);
            println!("| {handlers} | DeltaFifo | {:.0} | {:.0} | | |", delta.0, delta.1);
        }
        println!("\n## listeners: threads and resident memory of the process (RSS deltas in MiB)\n");
        println!("| registrations | handlers | threads before | threads synced | threads after 100 updates | RSS synced | RSS after updates |");
        println!("|---|---|---|---|---|---|---|");
        listeners(1000, true).await;
        listeners(1000, false).await;
    });
}
