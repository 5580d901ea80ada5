//! Hand-off throughput: a producer adds 10k distinct keys, N workers get and mark them done.
//!
//! The baseline is the bare minimum a hand-off needs: one unbounded `tokio::sync::mpsc` channel
//! per worker, fed round-robin (no dedup, no in-flight tracking, no contention between workers).
//! Both rigs keep their workers and channels across rounds, as a controller does, so a round
//! measures the steady-state hand-off, not task spawning or table growth. Each worker counts
//! the items it finishes in a shared counter; the one finishing the round's last item wakes the
//! producer. After criterion's measurements, the bench times both rigs again, interleaved so they
//! see the same machine load, and prints the workqueue/mpsc throughput ratio.
//!
//! `cargo bench -p kinformer-workqueue --bench throughput -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use tokio::runtime::Runtime;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use workqueue::Queue;

const KEYS: u64 = 10_000;
const WORKERS: [usize; 2] = [1, 2];

/// Counts finished items; wakes the producer when a round is complete.
#[derive(Default)]
struct Round {
    finished: AtomicU64,
    complete: Notify,
}

impl Round {
    fn finish_one(&self) {
        if self.finished.fetch_add(1, Ordering::Relaxed) + 1 == KEYS {
            self.complete.notify_one();
        }
    }

    async fn wait(&self) {
        self.complete.notified().await;
        self.finished.store(0, Ordering::Relaxed);
    }
}

struct WorkqueueRig {
    queue: Queue<u64>,
    round: Arc<Round>,
    workers: Vec<JoinHandle<()>>,
}

impl WorkqueueRig {
    fn new(workers: usize) -> Self {
        let queue = Queue::new();
        let round = Arc::new(Round::default());
        let workers = (0..workers)
            .map(|_| {
                let (queue, round) = (queue.clone(), Arc::clone(&round));
                tokio::spawn(async move {
                    while let Some(key) = queue.get().await {
                        black_box(key);
                        queue.done(&key);
                        round.finish_one();
                    }
                })
            })
            .collect();
        Self { queue, round, workers }
    }

    async fn round(&self) {
        for key in 0..KEYS {
            self.queue.add(key);
        }
        self.round.wait().await;
    }

    async fn stop(self) {
        self.queue.shut_down_with_drain().await;
        for worker in self.workers {
            worker.await.expect("worker panicked");
        }
    }
}

struct MpscRig {
    senders: Vec<mpsc::UnboundedSender<u64>>,
    round: Arc<Round>,
    workers: Vec<JoinHandle<()>>,
}

impl MpscRig {
    fn new(workers: usize) -> Self {
        let round = Arc::new(Round::default());
        let (senders, workers) = (0..workers)
            .map(|_| {
                let (sender, mut receiver) = mpsc::unbounded_channel::<u64>();
                let round = Arc::clone(&round);
                let worker = tokio::spawn(async move {
                    while let Some(key) = receiver.recv().await {
                        black_box(key);
                        round.finish_one();
                    }
                });
                (sender, worker)
            })
            .unzip();
        Self {
            senders,
            round,
            workers,
        }
    }

    async fn round(&self) {
        for key in 0..KEYS {
            // Round-robin. The receivers live until `stop`, so sending cannot fail.
            let _ = self.senders[key as usize % self.senders.len()].send(key);
        }
        self.round.wait().await;
    }

    async fn stop(self) {
        drop(self.senders);
        for worker in self.workers {
            worker.await.expect("worker panicked");
        }
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("building the Tokio runtime")
}

fn throughput(c: &mut Criterion) {
    let runtime = runtime();
    let mut group = c.benchmark_group("handoff_10k_keys");
    group.throughput(Throughput::Elements(KEYS));
    for workers in WORKERS {
        let rig = runtime.block_on(async { WorkqueueRig::new(workers) });
        group.bench_function(format!("workqueue/{workers}_workers"), |b| {
            b.to_async(&runtime).iter(|| rig.round());
        });
        runtime.block_on(rig.stop());

        let rig = runtime.block_on(async { MpscRig::new(workers) });
        group.bench_function(format!("mpsc/{workers}_workers"), |b| {
            b.to_async(&runtime).iter(|| rig.round());
        });
        runtime.block_on(rig.stop());
    }
    group.finish();
}

/// Median round time of each rig over interleaved rounds; prints ops/s and the ratio.
fn print_ratios() {
    const ROUNDS: usize = 101;
    let runtime = runtime();
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    println!("\nworkqueue / mpsc throughput (median of {ROUNDS} interleaved rounds of {KEYS} keys):");
    for workers in WORKERS {
        let (queue_rig, mpsc_rig) = runtime.block_on(async { (WorkqueueRig::new(workers), MpscRig::new(workers)) });
        let (mut queue_times, mut mpsc_times) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let start = Instant::now();
            runtime.block_on(queue_rig.round());
            queue_times.push(start.elapsed());
            let start = Instant::now();
            runtime.block_on(mpsc_rig.round());
            mpsc_times.push(start.elapsed());
        }
        runtime.block_on(async {
            queue_rig.stop().await;
            mpsc_rig.stop().await;
        });
        let (queue_time, mpsc_time) = (median(&mut queue_times), median(&mut mpsc_times));
        let mops = |time: Duration| KEYS as f64 / time.as_secs_f64() / 1e6;
        println!(
            "  {workers} worker(s): workqueue {:.2} M ops/s, mpsc {:.2} M ops/s, ratio {:.2}x",
            mops(queue_time),
            mops(mpsc_time),
            mpsc_time.as_secs_f64() / queue_time.as_secs_f64(),
        );
    }
}

criterion_group!(benches, throughput);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    print_ratios();
}
