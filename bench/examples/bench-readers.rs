//! `bench-readers --client kinformer|kube-runtime --count N --readers R`: how long a cache read
//! takes while a relist of N objects is applied (issue #25, W4), for one client, printed as one
//! JSON line.
//!
//! Both clients are fed in process, without a server, the same N ConfigMaps
//! ([`kinformer_bench::configmap`]), so that what is measured is how the cache's writer and
//! its readers share it, not decoding:
//!
//! - **kinformer**: a `SharedIndexInformer` (default RealFifo queue, one handler) over an
//!   in-memory `ListerWatcher`. After the initial list, the watch ends with a 410 and the
//!   reflector relists: N new versions of the objects in one page (a list at a resourceVersion
//!   is not paged), through the queue into the informer, which applies them as one relist.
//! - **kube-runtime**: its `reflector::store` `Writer`, fed `Init`, N `InitApply`, `InitDone`
//!   (what `reflector(writer, watcher(..))` does with a relist), on a thread of its own.
//!
//! Meanwhile R reader threads each read a random object the way a controller does
//! (kinformer: `Lister::namespaced(ns).get(name)`; kube-runtime:
//! `Store::get(&ObjectRef::new(name).within(ns))`), pause about `--pause-us` and read again.
//! Each read that starts between the start of the relist and the moment its result is visible
//! is timed; the line gives their count and percentiles. A read held up for longer than the
//! reader's pace also counts the reads the reader would have made meanwhile (the standard
//! correction for coordinated omission), so a stall weighs what it weighs for a controller
//! whose reads keep arriving. Readers are paced, not spinning, so that on a small machine the
//! time a read takes is the cache's doing rather than the scheduler's (a spinning reader
//! preempted mid-read would count its time slice).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer::cache::{
    InformerConfig, ListPage, ListWatchError, Lister, ListerWatcher, ResourceEventHandlerFuncs, SharedIndexInformer,
    WatchStream,
};
use kube::api::{ListParams, WatchParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use serde::Serialize;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Client {
    Kinformer,
    KubeRuntime,
}

/// Reader latency during one relist (see the module doc).
#[derive(Parser)]
struct Args {
    /// The client measured.
    #[arg(long, value_enum)]
    client: Client,
    /// Objects in the cache and in the relist.
    #[arg(long, default_value_t = 100_000)]
    count: usize,
    /// Reader threads.
    #[arg(long, default_value_t = 4)]
    readers: usize,
    /// Pause between a reader's reads, in microseconds.
    #[arg(long, default_value_t = 50)]
    pause_us: u64,
}

/// The JSON line printed.
#[derive(Serialize)]
struct Outcome {
    client: Client,
    count: usize,
    readers: usize,
    /// From the start of the relist until its result is visible to readers.
    relist_ms: f64,
    /// Reads started in that window, with the reads a held-up reader missed.
    reads: usize,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
    /// Process CPU time (user + system) over the window, in ms.
    cpu_ms: f64,
}

/// What the readers share with the main thread.
struct Readers {
    /// Reads that start while this is set are timed.
    measuring: AtomicBool,
    stop: AtomicBool,
    /// Nanoseconds per timed read, from every reader.
    samples: Mutex<Vec<u64>>,
}

/// Object `i`'s namespace and name.
fn key(i: usize) -> (String, String) {
    (kinformer_bench::namespace(i), format!("config-{i:07}"))
}

/// Starts `count` reader threads; each reads with `read(namespace, name)` until told to stop.
fn start_readers(
    args: &Args,
    read: impl Fn(&str, &str) -> bool + Send + Sync + 'static,
) -> (Arc<Readers>, Vec<std::thread::JoinHandle<()>>) {
    let shared = Arc::new(Readers {
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        samples: Mutex::new(Vec::new()),
    });
    let keys: Arc<Vec<(String, String)>> = Arc::new((0..args.count).map(key).collect());
    let read = Arc::new(read);
    let pause = Duration::from_micros(args.pause_us);
    let threads = (0..args.readers)
        .map(|r| {
            let (shared, keys, read) = (shared.clone(), keys.clone(), read.clone());
            std::thread::spawn(move || {
                let mut samples = Vec::new();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (r as u64 + 1);
                // The reader's pace, measured before the relist: its expected interval.
                let begun = Instant::now();
                let mut untimed = 0u32;
                let mut interval = None;
                while !shared.stop.load(Ordering::Relaxed) {
                    // xorshift: a cheap spread of keys over the whole cache.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let (namespace, name) = &keys[(x % keys.len() as u64) as usize];
                    let timed = shared.measuring.load(Ordering::Acquire);
                    let started = Instant::now();
                    let found = read(namespace, name);
                    let took = started.elapsed();
                    std::hint::black_box(found);
                    if timed {
                        let interval = *interval.get_or_insert_with(|| begun.elapsed() / untimed.max(1));
                        samples.push(took.as_nanos() as u64);
                        // A read held for several intervals stands for the reads the reader
                        // would have made meanwhile, each held for what was left of it
                        // (coordinated omission, corrected as HdrHistogram's
                        // recordValueWithExpectedInterval does).
                        let mut missed = took.saturating_sub(interval);
                        while !missed.is_zero() {
                            samples.push(missed.as_nanos() as u64);
                            missed = missed.saturating_sub(interval);
                        }
                    } else {
                        untimed += 1;
                    }
                    std::thread::sleep(pause);
                }
                if let Ok(mut all) = shared.samples.lock() {
                    all.extend(samples);
                }
            })
        })
        .collect();
    (shared, threads)
}

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    // /proc/self/stat fields 14 and 15: utime and stime in clock ticks (100 per second).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Times the relist `run` (which returns once its result is visible to readers) with the
/// readers on, and stops them.
fn measure(
    args: &Args,
    readers: (Arc<Readers>, Vec<std::thread::JoinHandle<()>>),
    run: impl FnOnce(),
) -> Result<Outcome, BoxError> {
    let (shared, threads) = readers;
    // Let the readers settle into their pace first.
    std::thread::sleep(Duration::from_millis(200));
    let cpu = cpu_time();
    shared.measuring.store(true, Ordering::Release);
    let started = Instant::now();
    run();
    let relist = started.elapsed();
    shared.measuring.store(false, Ordering::Release);
    let cpu = cpu_time().saturating_sub(cpu);
    shared.stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().map_err(|_| "a reader panicked")?;
    }
    let mut samples = std::mem::take(&mut *shared.samples.lock().map_err(|_| "poisoned")?);
    samples.sort_unstable();
    let at = |q: f64| -> f64 {
        if samples.is_empty() {
            return 0.0;
        }
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i] as f64 / 1000.0
    };
    Ok(Outcome {
        client: args.client,
        count: args.count,
        readers: args.readers,
        relist_ms: relist.as_secs_f64() * 1000.0,
        reads: samples.len(),
        p50_us: at(0.50),
        p99_us: at(0.99),
        p999_us: at(0.999),
        max_us: samples.last().map_or(0.0, |ns| *ns as f64 / 1000.0),
        cpu_ms: cpu.as_secs_f64() * 1000.0,
    })
}

/// An in-memory server for kinformer: lists the current generation of the objects, and
/// ends the first watch with a 410 once told to, so the reflector relists.
struct MemoryServer {
    /// The objects a list answers, and their resourceVersion.
    objects: Mutex<(Arc<Vec<ConfigMap>>, u64)>,
    /// Set to end the first watch.
    relist: tokio::sync::Notify,
    watches: AtomicU64,
}

/// `MemoryServer` lives for the whole process (leaked), so its watch streams may borrow it.
struct StaticServer(&'static MemoryServer);

impl ListerWatcher<ConfigMap> for StaticServer {
    fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        let (objects, rv) = match self.0.objects.lock() {
            Ok(current) => current.clone(),
            Err(_) => return Box::pin(async { Err(ListWatchError::api(500, "InternalError", "poisoned")) }),
        };
        let start: usize = params
            .continue_token
            .as_deref()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        let end = match params.limit {
            Some(limit) => (start + limit as usize).min(objects.len()),
            None => objects.len(),
        };
        // A copy per list, as a decoder would make them.
        let page = ListPage::new(objects[start..end].to_vec(), rv.to_string())
            .continue_token((end < objects.len()).then(|| end.to_string()));
        Box::pin(async move { Ok(page) })
    }

    fn watch(&self, _: &WatchParams, _: &str) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
        let server = self.0;
        let first = server.watches.fetch_add(1, Ordering::SeqCst) == 0;
        let stream: WatchStream<ConfigMap> = if first {
            futures::stream::once(async move {
                server.relist.notified().await;
                Err(ListWatchError::api(410, "Expired", "too old resource version"))
            })
            .chain(futures::stream::pending())
            .boxed()
        } else {
            futures::stream::pending().boxed()
        };
        Box::pin(async move { Ok(stream) })
    }
}

fn generation(count: usize, rv: u64, generation: u64) -> Vec<ConfigMap> {
    (0..count)
        .map(|i| kinformer_bench::configmap(i, rv, generation))
        .collect()
}

/// Polls `cond` every 100 µs until it holds (20 s at most).
fn wait_for(what: &str, cond: impl Fn() -> bool) -> Result<(), BoxError> {
    let limit = Instant::now() + Duration::from_secs(20);
    while !cond() {
        if Instant::now() > limit {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(())
}

fn run_kinformer(args: &Args) -> Result<Outcome, BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let server: &'static MemoryServer = Box::leak(Box::new(MemoryServer {
        objects: Mutex::new((Arc::new(generation(args.count, 1, 0)), 1)),
        relist: tokio::sync::Notify::new(),
        watches: AtomicU64::new(0),
    }));
    let informer: SharedIndexInformer<ConfigMap> =
        SharedIndexInformer::new(StaticServer(server), InformerConfig::default());
    informer.add_event_handler(ResourceEventHandlerFuncs::new().on_update(|_, _| {}))?;
    let shutdown = kinformer::CancellationToken::new();
    let task = runtime.spawn({
        let (informer, shutdown) = (informer.clone(), shutdown.clone());
        async move { informer.run(shutdown).await }
    });
    wait_for("the initial list", || informer.has_synced())?;
    let next = Arc::new(generation(args.count, 2, 1));
    *server.objects.lock().map_err(|_| "poisoned")? = (next, 2);

    let lister = Lister::new(informer.indexer().clone());
    let readers = start_readers(args, move |namespace, name| {
        lister.namespaced(namespace).get(name).is_some()
    });
    let cache = informer.indexer().clone();
    let outcome = measure(args, readers, || {
        server.relist.notify_one();
        let _ = wait_for("the relist", || cache.last_store_sync_resource_version() == "2");
    })?;
    if informer.indexer().last_store_sync_resource_version() != "2" {
        return Err("the relist did not complete".into());
    }
    shutdown.cancel();
    runtime.block_on(task)?;
    Ok(outcome)
}

fn run_kube_runtime(args: &Args) -> Result<Outcome, BoxError> {
    let (store, mut writer) = reflector::store::<ConfigMap>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for obj in generation(args.count, 1, 0) {
        writer.apply_watcher_event(&watcher::Event::InitApply(obj));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let next = generation(args.count, 2, 1);

    let readers = start_readers(args, move |namespace, name| {
        store
            .get(&ObjectRef::<ConfigMap>::new(name).within(namespace))
            .is_some()
    });
    measure(args, readers, move || {
        // On a thread of its own, as the reflector's stream is polled on a runtime worker.
        let relist = std::thread::spawn(move || {
            writer.apply_watcher_event(&watcher::Event::Init);
            for obj in &next {
                // A copy per object, as a decoder would make it.
                writer.apply_watcher_event(&watcher::Event::InitApply(obj.clone()));
            }
            writer.apply_watcher_event(&watcher::Event::InitDone);
        });
        let _ = relist.join();
    })
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let outcome = match args.client {
        Client::Kinformer => run_kinformer(&args)?,
        Client::KubeRuntime => run_kube_runtime(&args)?,
    };
    println!("{}", serde_json::to_string(&outcome)?);
    Ok(())
}
