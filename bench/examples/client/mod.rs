//! `bench-client --client kinformer|kube-runtime|floor --workload fill|fanout|e2e …`: one
//! benchmark client in a process of its own, printing one `Outcome` as a JSON line.
//!
//! This module is the client; `bench-client.rs` links it with glibc's malloc (the system
//! allocator) and `bench-client-mimalloc.rs` with mimalloc, each wrapped in a counting allocator
//! (`crate::ALLOC`), so both clients run with either allocator and no conclusion rests on one.
//! Every timed phase also reports the process's CPU seconds (user + system, all threads:
//! `kinformer_bench::process_cpu_secs`), so a client that is faster by using the second core
//! shows it.
//!
//! Both clients are used the way their documentation shows, with their defaults:
//!
//! - **fill** (P1, P2): kinformer's `SharedInformerFactory` informer with one event handler, or
//!   kube-runtime's `reflector(store, watcher(api, Config::default()))` consumed by a loop. The
//!   list is "synced" when the consumer has seen every listed object (the handler's initial adds;
//!   the stream's `InitDone`). Then `POST /bench/go` releases the server's watch events, and the
//!   update rate is timed until the consumer has seen all of them, and its CPU time is
//!   reported per update. Memory is the live heap's growth (the counting global allocator) from
//!   before the informer started to the synced cache.
//!   `--strip-managed-fields`: the factory's option, or kube-runtime's `.modify(…)` on the stream.
//! - **floor**: serde_json decoding the same list pages into `ObjectList<K>`, warm, one thread,
//!   keeping every object (as a cache would), best of three passes.
//! - **fanout** (P3, kinformer only: kube-runtime has no shared handlers): an informer over an
//!   in-process `ListerWatcher` streaming `--updates` events to `--handlers` counted handlers;
//!   `--stalled` registers one more handler, first, that blocks on its first update and never
//!   returns (so the stalled run and the baseline count the same handlers).
//! - **e2e** (P5): against envtest, a controller on ConfigMaps while this process patches them at
//!   `--rate` per second for `--secs`; latency from a patch's response to the reconcile call that
//!   first saw that patch. `--reconcile-ms N`: each reconcile also does N ms of work (a blocking
//!   sleep on tokio's blocking pool, as a reconcile waiting on I/O would: it lasts N ms, not a
//!   timer tick), in both controllers.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kinformer::cache::{
    ListPage, ListWatchError, ListerWatcher, ResourceEventHandler, SharedIndexInformer, WatchStream,
};
use kinformer::factory::{FactoryResource, SharedInformerFactory};
use kinformer_bench::{Encoded, Kind, Outcome, PAGE_SIZE, proc_status_bytes, process_cpu_secs};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::{ObjectList, PartialObjectMeta};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::ALLOC;

/// The error of a client run.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Client {
    Kinformer,
    KubeRuntime,
    Floor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    Fill,
    Fanout,
    E2e,
}

/// One benchmark client (see the module doc).
#[derive(Parser, Debug)]
struct Args {
    #[arg(long, value_enum)]
    client: Client,
    #[arg(long, value_enum)]
    workload: Workload,
    /// The API server's URL (fill: bench-server; e2e: envtest's kinformer-apiserver).
    #[arg(long)]
    server: Option<String>,
    #[arg(long, value_enum, default_value = "config-maps")]
    kind: Kind,
    /// Objects listed (fill, floor, fanout) or written to (e2e).
    #[arg(long, default_value_t = 1000)]
    count: usize,
    /// Watch updates after the list (fill: what the server streams; fanout: events).
    #[arg(long, default_value_t = 0)]
    updates: usize,
    #[arg(long)]
    strip_managed_fields: bool,
    /// fill, kinformer: a transform that replaces each object with a clone of it (an
    /// experiment: a clone has no spare capacity, which is what kube-runtime's store holds).
    #[arg(long)]
    clone_objects: bool,
    /// fanout: counted handlers on the informer.
    #[arg(long, default_value_t = 9)]
    handlers: usize,
    /// fanout: one more handler, registered first, blocks forever on its first update.
    #[arg(long)]
    stalled: bool,
    /// e2e: patches per second.
    #[arg(long, default_value_t = 1000)]
    rate: usize,
    /// e2e: seconds of writing.
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// e2e: milliseconds of work in each reconcile (0: none).
    #[arg(long, default_value_t = 0)]
    reconcile_ms: u64,
}

/// Runs the client the command line asks for and prints its `Outcome`; `allocator` names the
/// binary's global allocator in it.
pub fn main(allocator: &str) -> Result<(), BoxError> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut outcome = runtime.block_on(run(&args))?;
    outcome.peak_rss = proc_status_bytes("VmHWM:");
    outcome.allocator = allocator.into();
    println!("{}", serde_json::to_string(&outcome)?);
    // A stalled handler never returns; do not wait for it (or for the runtime) on the way out.
    std::process::exit(0)
}

async fn run(args: &Args) -> Result<Outcome, BoxError> {
    let mut outcome = match (args.client, args.workload, args.kind) {
        (Client::Floor, _, Kind::ConfigMaps) => floor::<ConfigMap>(args)?,
        (Client::Floor, _, Kind::Pods) => floor::<Pod>(args)?,
        (Client::Floor, _, Kind::PodMetadata) => floor::<PartialObjectMeta<Pod>>(args)?,
        (Client::Kinformer, Workload::Fill, Kind::PodMetadata) => {
            fill_kinformer::<PartialObjectMeta<Pod>>(args).await?
        }
        (Client::KubeRuntime, Workload::Fill, Kind::PodMetadata) => {
            fill_kube_runtime::<PartialObjectMeta<Pod>>(args).await?
        }
        (Client::Kinformer, Workload::Fill, Kind::ConfigMaps) => fill_kinformer::<ConfigMap>(args).await?,
        (Client::Kinformer, Workload::Fill, Kind::Pods) => fill_kinformer::<Pod>(args).await?,
        (Client::KubeRuntime, Workload::Fill, Kind::ConfigMaps) => fill_kube_runtime::<ConfigMap>(args).await?,
        (Client::KubeRuntime, Workload::Fill, Kind::Pods) => fill_kube_runtime::<Pod>(args).await?,
        (Client::Kinformer, Workload::Fanout, _) => fanout(args).await?,
        (Client::KubeRuntime, Workload::Fanout, _) => return Err("fanout: kube-runtime has no shared handlers".into()),
        (client, Workload::E2e, _) => e2e(args, client).await?,
    };
    outcome.count = args.count;
    Ok(outcome)
}

fn client_for(args: &Args) -> Result<kube::Client, BoxError> {
    let url = args.server.as_deref().ok_or("--server is required")?;
    let config = kube::Config::new(url.parse()?);
    Ok(kube::Client::try_from(config)?)
}

/// Counts what a consumer has seen and wakes whoever waits for a number, once it is reached:
/// a wake per event would put the rig's own cost (a futex wake and a task poll per event) into
/// every figure.
struct Seen {
    initial: AtomicUsize,
    updates: AtomicUsize,
    /// The count the waiter waits for (`usize::MAX` while nobody waits).
    target: AtomicUsize,
    changed: Notify,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            initial: AtomicUsize::new(0),
            updates: AtomicUsize::new(0),
            target: AtomicUsize::new(usize::MAX),
            changed: Notify::new(),
        }
    }
}

impl Seen {
    fn bump(&self, counter: &AtomicUsize) {
        let seen = counter.fetch_add(1, Ordering::SeqCst) + 1;
        if seen >= self.target.load(Ordering::SeqCst) {
            self.changed.notify_waiters();
        }
    }

    async fn wait(&self, counter: &AtomicUsize, target: usize) {
        self.target.store(target, Ordering::SeqCst);
        loop {
            let changed = self.changed.notified();
            if counter.load(Ordering::SeqCst) >= target {
                self.target.store(usize::MAX, Ordering::SeqCst);
                return;
            }
            // A bounded wait: `notify_waiters` only wakes registered waiters.
            let _ = tokio::time::timeout(Duration::from_millis(2), changed).await;
        }
    }
}

struct CountingHandler(Arc<Seen>);

impl<K> ResourceEventHandler<K> for CountingHandler {
    fn on_add(&self, _: &Arc<K>, is_in_initial_list: bool) {
        if is_in_initial_list {
            self.0.bump(&self.0.initial);
        }
    }
    fn on_update(&self, _: &Arc<K>, _: &Arc<K>) {
        self.0.bump(&self.0.updates);
    }
    /// Counting never blocks: called inline, as a controller's enqueue handler is.
    fn is_non_blocking(&self) -> bool {
        true
    }
}

async fn release_watch(client: &kube::Client) -> Result<(), BoxError> {
    let request = http::Request::post("/bench/go").body(Vec::new())?;
    client.request_text(request).await?;
    Ok(())
}

async fn fill_kinformer<K: FactoryResource>(args: &Args) -> Result<Outcome, BoxError> {
    let client = client_for(args)?;
    let shutdown = CancellationToken::new();
    let before = ALLOC.allocated();
    let cpu = process_cpu_secs();
    let start = Instant::now();
    let mut factory = SharedInformerFactory::builder(client.clone()).strip_managed_fields(args.strip_managed_fields);
    if args.clone_objects {
        factory = factory.transform::<K>(|obj: K| obj.clone());
    }
    let factory = factory.build();
    let informer = factory.informer_for::<K>()?;
    let seen = Arc::new(Seen::default());
    informer.add_event_handler(CountingHandler(seen.clone()))?;
    factory.start(&shutdown);
    seen.wait(&seen.initial, args.count).await;
    let mut outcome = listed("kinformer", args, start, cpu, before);
    update_phase(args, &client, &seen, &mut outcome).await?;
    shutdown.cancel();
    Ok(outcome)
}

/// A fill run's outcome at the moment its consumer has seen the whole list: the time since
/// `start`, the CPU time since `cpu` and the heap's growth since `before`.
fn listed(client: &str, args: &Args, start: Instant, cpu: f64, before: usize) -> Outcome {
    let list_secs = start.elapsed().as_secs_f64();
    let list_cpu_secs = process_cpu_secs() - cpu;
    let heap = ALLOC.allocated().saturating_sub(before);
    Outcome {
        client: client.into(),
        workload: "fill".into(),
        list_secs: Some(list_secs),
        list_cpu_secs: Some(list_cpu_secs),
        heap_per_object: Some(heap as f64 / args.count.max(1) as f64),
        ..Outcome::default()
    }
}

/// Releases the server's watch events and times them (wall and CPU) until the consumer has
/// seen them all.
async fn update_phase(args: &Args, client: &kube::Client, seen: &Seen, outcome: &mut Outcome) -> Result<(), BoxError> {
    if args.updates > 0 {
        let cpu = process_cpu_secs();
        let go = Instant::now();
        release_watch(client).await?;
        seen.wait(&seen.updates, args.updates).await;
        outcome.updates_per_sec = Some(args.updates as f64 / go.elapsed().as_secs_f64());
        outcome.cpu_per_update = Some((process_cpu_secs() - cpu) / args.updates as f64);
    }
    Ok(())
}

async fn fill_kube_runtime<K>(args: &Args) -> Result<Outcome, BoxError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let client = client_for(args)?;
    let before = ALLOC.allocated();
    let cpu = process_cpu_secs();
    let start = Instant::now();
    let api: Api<K> = Api::all(client.clone());
    let (store, writer) = reflector::store::<K>();
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let events = if args.strip_managed_fields {
        events.modify(|obj: &mut K| obj.managed_fields_mut().clear()).boxed()
    } else {
        events.boxed()
    };
    let seen = Arc::new(Seen::default());
    let consumer = tokio::spawn({
        let seen = seen.clone();
        reflector(writer, events).for_each(move |event| {
            match event {
                Ok(watcher::Event::InitDone) => seen.bump(&seen.initial),
                Ok(watcher::Event::Apply(_)) => seen.bump(&seen.updates),
                _ => {}
            }
            futures::future::ready(())
        })
    });
    seen.wait(&seen.initial, 1).await;
    let mut outcome = listed("kube-runtime", args, start, cpu, before);
    let cached = store.state().len();
    if cached != args.count {
        return Err(format!("kube-runtime's store holds {cached} objects, not {}", args.count).into());
    }
    update_phase(args, &client, &seen, &mut outcome).await?;
    consumer.abort();
    Ok(outcome)
}

fn floor<K: DeserializeOwned + Clone>(args: &Args) -> Result<Outcome, BoxError> {
    let encoded = Encoded::new(args.kind, args.count, 0);
    let pages = encoded.pages(args.kind, PAGE_SIZE);
    drop(encoded);
    /// One pass: wall time, CPU seconds, heap grown, and the decoded lists (kept, as a cache would).
    type Pass<K> = (Duration, f64, usize, Vec<ObjectList<K>>);
    let decode = |pages: &[bytes::Bytes]| -> Result<Pass<K>, BoxError> {
        let before = ALLOC.allocated();
        let cpu = process_cpu_secs();
        let start = Instant::now();
        let mut lists = Vec::with_capacity(pages.len());
        for page in pages {
            lists.push(serde_json::from_slice::<ObjectList<K>>(page)?);
        }
        let took = start.elapsed();
        Ok((
            took,
            process_cpu_secs() - cpu,
            ALLOC.allocated().saturating_sub(before),
            lists,
        ))
    };
    drop(decode(&pages)?);
    let (mut best, mut best_cpu) = (Duration::MAX, 0.0);
    let mut heap = 0;
    for _ in 0..3 {
        let (took, cpu, grown, lists) = decode(&pages)?;
        if took < best {
            (best, best_cpu) = (took, cpu);
        }
        heap = grown;
        drop(lists);
    }
    Ok(Outcome {
        client: "floor".into(),
        workload: "fill".into(),
        list_secs: Some(best.as_secs_f64()),
        list_cpu_secs: Some(best_cpu),
        heap_per_object: Some(heap as f64 / args.count.max(1) as f64),
        ..Outcome::default()
    })
}

/// Lists `count` small ConfigMaps, then streams `updates` MODIFIED events made as they are
/// read (a million decoded objects held at once would measure the allocator, not fan-out).
struct Scripted {
    count: usize,
    updates: usize,
    watched: AtomicBool,
}

fn small_configmap(i: usize, rv: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("cm-{i:06}")),
            namespace: Some("default".into()),
            resource_version: Some(rv.to_string()),
            ..ObjectMeta::default()
        },
        data: Some([("rv".to_string(), rv.to_string())].into()),
        ..ConfigMap::default()
    }
}

impl ListerWatcher<ConfigMap> for Scripted {
    fn list(&self, _: &ListParams) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        let items = (0..self.count).map(|i| small_configmap(i, 1)).collect();
        Box::pin(async move { Ok(ListPage::new(items, "1")) })
    }

    fn watch(&self, _: &WatchParams, _: &str) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
        let first = !self.watched.swap(true, Ordering::SeqCst);
        let (count, updates) = (self.count.max(1), if first { self.updates } else { 0 });
        Box::pin(async move {
            let events = futures::stream::iter(0..updates)
                .map(move |j| Ok(WatchEvent::Modified(small_configmap(j % count, j + 2))))
                .chain(futures::stream::pending());
            Ok(Box::pin(events) as WatchStream<ConfigMap>)
        })
    }
}

/// A handler that blocks forever on its first update, as a handler stuck on a lock would.
struct Stalled;

impl ResourceEventHandler<ConfigMap> for Stalled {
    fn on_update(&self, _: &Arc<ConfigMap>, _: &Arc<ConfigMap>) {
        loop {
            std::thread::park();
        }
    }
}

async fn fanout(args: &Args) -> Result<Outcome, BoxError> {
    let lister_watcher = Scripted {
        count: args.count,
        updates: args.updates,
        watched: AtomicBool::new(false),
    };
    let informer = SharedIndexInformer::new(lister_watcher, Default::default());
    if args.stalled {
        informer.add_event_handler(Stalled)?;
    }
    let counted = args.handlers;
    let seen: Vec<Arc<Seen>> = (0..counted).map(|_| Arc::new(Seen::default())).collect();
    for s in &seen {
        informer.add_event_handler(CountingHandler(s.clone()))?;
    }
    let shutdown = CancellationToken::new();
    let cpu = process_cpu_secs();
    let start = Instant::now();
    tokio::spawn({
        let (informer, shutdown) = (informer.clone(), shutdown.clone());
        async move { informer.run(shutdown).await }
    });
    // Handlers are waited for in turn, so each one's time is when it was seen done: never
    // earlier than its own finish, and the slowest one's is exact.
    let mut rates = Vec::new();
    for s in &seen {
        s.wait(&s.updates, args.updates).await;
        rates.push(args.updates as f64 / start.elapsed().as_secs_f64());
    }
    let cpu = process_cpu_secs() - cpu;
    shutdown.cancel();
    let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let fastest = rates.iter().copied().fold(0.0, f64::max);
    let mut outcome = Outcome {
        client: "kinformer".into(),
        workload: if args.stalled {
            "fanout-stalled".into()
        } else {
            "fanout".into()
        },
        updates_per_sec: Some(slowest),
        // The list of `count` objects and every event to every handler, per event.
        cpu_per_update: Some(cpu / args.updates.max(1) as f64),
        ..Outcome::default()
    };
    outcome.extra.insert("fastest_handler_per_sec".into(), fastest);
    outcome.extra.insert("handlers_counted".into(), counted as f64);
    Ok(outcome)
}

/// When each patch's response arrived, and when a reconcile first saw it, by (name, seq).
#[derive(Default)]
struct Timeline {
    written: Mutex<HashMap<(String, u64), Instant>>,
    reconciled: Mutex<HashMap<(String, u64), Instant>>,
    distinct: Mutex<std::collections::HashSet<String>>,
    changed: Notify,
}

impl Timeline {
    fn reconciled(&self, cm: &ConfigMap) {
        let now = Instant::now();
        let name = cm.name_any();
        let seq = cm
            .data
            .as_ref()
            .and_then(|d| d.get("seq"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if let Ok(mut seen) = self.reconciled.lock() {
            seen.entry((name.clone(), seq)).or_insert(now);
        }
        if let Ok(mut distinct) = self.distinct.lock() {
            distinct.insert(name);
        }
        self.changed.notify_waiters();
    }

    /// Whether the patches numbered `first + 1 ..= total` (each object's last one when `first`
    /// is `total - count`) have all been seen by a reconcile.
    fn saw_all(&self, first: usize, total: usize, count: usize) -> bool {
        let Ok(reconciled) = self.reconciled.lock() else {
            return false;
        };
        (first..total).all(|n| reconciled.contains_key(&(format!("e2e-{:05}", n % count.max(1)), n as u64 + 1)))
    }

    fn distinct(&self) -> usize {
        self.distinct.lock().map(|d| d.len()).unwrap_or(0)
    }
}

/// A reconcile's `work`: a blocking sleep on tokio's blocking pool (a reconcile waiting on I/O),
/// so it lasts `work` and not a timer tick of the runtime's millisecond-granular clock.
async fn reconcile_work(work: Duration) {
    if !work.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(work)).await;
    }
}

async fn e2e(args: &Args, client_kind: Client) -> Result<Outcome, BoxError> {
    let client = client_for(args)?;
    let namespace = "default";
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for i in 0..args.count {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("e2e-{i:05}")),
                ..ObjectMeta::default()
            },
            data: Some([("seq".to_string(), "0".to_string())].into()),
            ..ConfigMap::default()
        };
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let timeline = Arc::new(Timeline::default());
    let shutdown = CancellationToken::new();
    let work = Duration::from_millis(args.reconcile_ms);
    let name = match client_kind {
        Client::Kinformer => {
            let factory = SharedInformerFactory::builder(client.clone())
                .namespace(namespace)
                .build();
            let controller = kinformer::controller::Controller::new("bench", &factory).for_resource::<ConfigMap>();
            let timeline = timeline.clone();
            let reconciler = kinformer::controller::reconciler_fn(
                move |req: kinformer::controller::Request, ctx: kinformer::controller::Context<ConfigMap>| {
                    if let Ok(Some(cm)) = ctx.get(&req) {
                        timeline.reconciled(&cm);
                    }
                    async move {
                        reconcile_work(work).await;
                        Ok::<_, std::convert::Infallible>(kinformer::controller::Action::Done)
                    }
                },
            );
            let shutdown = shutdown.clone();
            tokio::spawn(async move { controller.run(reconciler, shutdown).await });
            "kinformer"
        }
        Client::KubeRuntime => {
            let timeline = timeline.clone();
            let controller = kube::runtime::Controller::new(api.clone(), watcher::Config::default())
                .graceful_shutdown_on(shutdown.clone().cancelled_owned())
                .run(
                    move |cm: Arc<ConfigMap>, timeline: Arc<Timeline>| async move {
                        timeline.reconciled(&cm);
                        reconcile_work(work).await;
                        Ok::<_, kube::Error>(kube::runtime::controller::Action::await_change())
                    },
                    |_, _, _| kube::runtime::controller::Action::await_change(),
                    timeline,
                )
                .for_each(|_| futures::future::ready(()));
            tokio::spawn(controller);
            "kube-runtime"
        }
        Client::Floor => return Err("e2e has no floor".into()),
    };
    // Ready once every object had its first reconcile.
    while timeline.distinct() < args.count {
        let _ = tokio::time::timeout(Duration::from_millis(5), timeline.changed.notified()).await;
    }
    let inflight = Arc::new(tokio::sync::Semaphore::new(256));
    // One patch per tick, evenly spaced: bursts would measure the bench's own queueing.
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate.max(1) as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = args.rate * args.secs as usize;
    let cpu = process_cpu_secs();
    let started = Instant::now();
    let mut writes = Vec::with_capacity(total);
    for n in 0..total {
        tick.tick().await;
        let permit = inflight.clone().acquire_owned().await?;
        let (api, timeline) = (api.clone(), timeline.clone());
        let name = format!("e2e-{:05}", n % args.count);
        let seq = n as u64 + 1;
        writes.push(tokio::spawn(async move {
            let patch = serde_json::json!({"data": {"seq": seq.to_string()}});
            let result = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
            let now = Instant::now();
            drop(permit);
            if result.is_ok()
                && let Ok(mut written) = timeline.written.lock()
            {
                written.insert((name, seq), now);
            }
            result.is_ok()
        }));
    }
    let mut failed = 0usize;
    for w in writes {
        if !w.await.unwrap_or(false) {
            failed += 1;
        }
    }
    let write_secs = started.elapsed().as_secs_f64();
    // Wait for the reconciles of every object's last patch (a deadline bounds a lost one: it
    // then shows as a patch no reconcile saw).
    let last = total.saturating_sub(args.count.min(total));
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !timeline.saw_all(last, total, args.count) {
        let _ = tokio::time::timeout(Duration::from_millis(5), timeline.changed.notified()).await;
    }
    let cpu = process_cpu_secs() - cpu;
    shutdown.cancel();
    let written = timeline.written.lock().map(|w| w.clone()).unwrap_or_default();
    let reconciled = timeline.reconciled.lock().map(|r| r.clone()).unwrap_or_default();
    let mut latencies: Vec<f64> = written
        .iter()
        .filter_map(|(key, at)| {
            reconciled
                .get(key)
                .map(|r| r.saturating_duration_since(*at).as_secs_f64())
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
    };
    let mut outcome = Outcome {
        client: name.into(),
        workload: "e2e".into(),
        ..Outcome::default()
    };
    let e = &mut outcome.extra;
    e.insert("writes".into(), total as f64);
    e.insert("write_failures".into(), failed as f64);
    e.insert("writes_per_sec".into(), (total - failed) as f64 / write_secs);
    e.insert("writes_seen".into(), latencies.len() as f64);
    // The writes and the controller, from the first patch to the last patch's reconcile.
    e.insert("cpu_secs".into(), cpu);
    if let (Some(p50), Some(p99), Some(max)) = (pct(0.5), pct(0.99), latencies.last().copied()) {
        e.insert("p50_ms".into(), p50 * 1e3);
        e.insert("p99_ms".into(), p99 * 1e3);
        e.insert("max_ms".into(), max * 1e3);
    }
    Ok(outcome)
}
