//! `bench-priority --server URL --count N [--fifo]`: P6, kinformer's priority queue, in a process
//! of its own, printing one `Outcome` as a JSON line. kinformer only: kube-runtime has no
//! priority queue.
//!
//! Against envtest: creates `--count` ConfigMaps, then starts a controller on them with one
//! worker and a reconcile of `--reconcile-ms` (a blocking sleep on tokio's blocking pool, as a
//! reconcile waiting on I/O would, so it lasts 1 ms and not a timer tick). Every object arrives
//! through the informer's initial list: a backlog of `--count` keys. While it drains, the process
//! patches `--changes` objects spread over the list, evenly over the first 40% of the expected
//! drain, and measures each change's latency: from the patch's response to the first reconcile
//! that read the patched value. With the priority queue (the default) the list's keys wait at low
//! priority and a change overtakes them; with `--fifo` (the plain queue) a change waits for the
//! backlog ahead of its key. Also reported: reconciles per second over the drain, its wall time,
//! and the process's CPU seconds in it (user + system, `kinformer_bench::process_cpu_secs`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kinformer::controller::{Action, Context, Controller, Request, reconciler_fn};
use kinformer::factory::SharedInformerFactory;
use kinformer_bench::Outcome;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// P6's client (see the module doc).
#[derive(Parser, Debug)]
struct Args {
    /// envtest's URL (kinformer-apiserver).
    #[arg(long)]
    server: String,
    /// ConfigMaps listed at start.
    #[arg(long, default_value_t = 50_000)]
    count: usize,
    /// ConfigMaps changed while the backlog drains.
    #[arg(long, default_value_t = 200)]
    changes: usize,
    /// How long one reconcile takes.
    #[arg(long, default_value_t = 1)]
    reconcile_ms: u64,
    /// The plain FIFO queue instead of the priority queue.
    #[arg(long)]
    fifo: bool,
}

/// What the reconciles saw: the first time each `(name, seq)` was read, and the count.
#[derive(Default)]
struct Seen {
    first: Mutex<HashMap<(String, u64), Instant>>,
    /// The objects reconciled at least once.
    names: Mutex<HashSet<String>>,
    reconciles: Mutex<(usize, Option<Instant>, Option<Instant>)>,
    changed: Notify,
}

impl Seen {
    fn reconciled(&self, name: &str, seq: u64) {
        let now = Instant::now();
        if let Ok(mut first) = self.first.lock() {
            first.entry((name.to_owned(), seq)).or_insert(now);
        }
        if let Ok(mut names) = self.names.lock()
            && !names.contains(name)
        {
            names.insert(name.to_owned());
        }
        if let Ok(mut r) = self.reconciles.lock() {
            r.0 += 1;
            r.1.get_or_insert(now);
            r.2 = Some(now);
        }
        self.changed.notify_waiters();
    }

    /// Objects reconciled at least once.
    fn count(&self) -> usize {
        self.names.lock().map(|n| n.len()).unwrap_or(0)
    }
}

fn name(i: usize) -> String {
    format!("p6-{i:06}")
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let client = kube::Client::try_from(kube::Config::new(args.server.parse()?))?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // Create the objects, 64 at a time.
    let created = Arc::new(tokio::sync::Semaphore::new(64));
    let mut creates = Vec::with_capacity(args.count);
    for i in 0..args.count {
        let permit = created.clone().acquire_owned().await?;
        let api = api.clone();
        creates.push(tokio::spawn(async move {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name(i)),
                    ..ObjectMeta::default()
                },
                data: Some([("seq".to_string(), "0".to_string())].into()),
                ..ConfigMap::default()
            };
            let result = api.create(&PostParams::default(), &cm).await;
            drop(permit);
            match result {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
                Err(e) => Err(e),
            }
        }));
    }
    for create in creates {
        create.await??;
    }

    let seen = Arc::new(Seen::default());
    let factory = SharedInformerFactory::builder(client.clone())
        .namespace("default")
        .build();
    let reconcile = Duration::from_millis(args.reconcile_ms);
    let reconciler = reconciler_fn({
        let seen = seen.clone();
        move |req: Request, ctx: Context<ConfigMap>| {
            let seen = seen.clone();
            let seq = match ctx.get(&req) {
                Ok(Some(cm)) => cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get("seq"))
                    .and_then(|s| s.parse::<u64>().ok()),
                _ => None,
            };
            async move {
                if let Some(seq) = seq {
                    seen.reconciled(&req.name, seq);
                }
                tokio::task::spawn_blocking(move || std::thread::sleep(reconcile))
                    .await
                    .ok();
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        }
    });
    let controller = Controller::new("p6", &factory)
        .for_resource::<ConfigMap>()
        .workers(1)
        .use_priority_queue(!args.fifo)
        .build(reconciler)?;
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let run = tokio::spawn(controller.run(shutdown.clone()));

    // The backlog is queued once the first reconcile ran (workers start after the initial list).
    while seen.reconciles.lock().map(|r| r.0).unwrap_or(0) == 0 {
        let _ = tokio::time::timeout(Duration::from_millis(5), seen.changed.notified()).await;
    }
    let cpu_start = kinformer_bench::process_cpu_secs();
    let drain_started = Instant::now();

    // The changes, spread over the list and over the first 40% of the expected drain.
    let expected_drain = reconcile.mul_f64(args.count as f64);
    let every = expected_drain.mul_f64(0.4).div_f64(args.changes.max(1) as f64);
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
    let mut written: Vec<((String, u64), Instant)> = Vec::with_capacity(args.changes);
    for k in 0..args.changes {
        tick.tick().await;
        // A stride coprime with any count below it visits objects all over the list.
        let object = name((k * 7919 + 13) % args.count.max(1));
        let patch = serde_json::json!({"data": {"seq": "1"}});
        api.patch(&object, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        written.push(((object, 1), Instant::now()));
    }

    // Drained: every object reconciled and every change seen (bounded by a deadline).
    let deadline = Instant::now() + expected_drain * 3 + Duration::from_secs(60);
    let all_seen = |seen: &Seen| {
        let first = seen.first.lock();
        first.is_ok_and(|f| written.iter().all(|(key, _)| f.contains_key(key)))
    };
    while Instant::now() < deadline && (seen.count() < args.count || !all_seen(&seen)) {
        let _ = tokio::time::timeout(Duration::from_millis(20), seen.changed.notified()).await;
    }
    let drain_secs = drain_started.elapsed().as_secs_f64();
    let cpu = kinformer_bench::process_cpu_secs() - cpu_start;
    shutdown.cancel();
    let _ = run.await;

    let first = seen.first.lock().map(|f| f.clone()).unwrap_or_default();
    let mut latencies: Vec<f64> = written
        .iter()
        .filter_map(|(key, at)| first.get(key).map(|r| r.saturating_duration_since(*at).as_secs_f64()))
        .collect();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
    };
    let (reconciles, first_at, last_at) = seen.reconciles.lock().map(|r| *r).unwrap_or((0, None, None));
    let reconcile_secs = match (first_at, last_at) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };

    let mut outcome = Outcome {
        client: if args.fifo { "fifo" } else { "priority" }.into(),
        workload: "priority".into(),
        count: args.count,
        peak_rss: kinformer_bench::proc_status_bytes("VmHWM"),
        ..Outcome::default()
    };
    let e = &mut outcome.extra;
    e.insert("changes".into(), written.len() as f64);
    e.insert("changes_seen".into(), latencies.len() as f64);
    e.insert("reconciles".into(), reconciles as f64);
    e.insert(
        "reconciles_per_sec".into(),
        reconciles as f64 / reconcile_secs.max(1e-9),
    );
    e.insert("drain_secs".into(), drain_secs);
    e.insert("cpu_secs".into(), cpu);
    if let (Some(p50), Some(p99), Some(max)) = (pct(0.5), pct(0.99), latencies.last().copied()) {
        e.insert("p50_ms".into(), p50 * 1e3);
        e.insert("p99_ms".into(), p99 * 1e3);
        e.insert("max_ms".into(), max * 1e3);
    }
    println!("{}", serde_json::to_string(&outcome)?);
    Ok(())
}
