//! Hand-off throughput: a producer adds 10k distinct keys, N workers get and mark them done, for
//! the FIFO [`Queue`] and for the [`PriorityQueue`] (every key at priority 0, as a controller adds
//! real changes: the same FIFO order, through the priority queue's ordered map and its rate
//! limiter's wrapper).
//!
//! The baseline is the bare minimum a hand-off needs: one unbounded `tokio::sync::mpsc` channel
//! per worker, fed round-robin (no dedup, no in-flight tracking, no contention between workers).
//! Both rigs keep their workers and channels across rounds, as a controller does, so a round
//! measures the steady-state hand-off, not task spawning or table growth. Each worker counts
//! the items it finishes in a shared counter; the one finishing the round's last item wakes the
//! producer. After criterion's measurements, the bench times the three rigs again, interleaved so
//! they see the same machine load, and prints the workqueue/mpsc throughput ratio and the priority
//! queue's throughput as a multiple of the workqueue's.
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
use workqueue::{PriorityQueue, Queue, default_controller_rate_limiter};

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

/// What the rig needs of a work queue: the FIFO [`Queue`] and the [`PriorityQueue`] alike.
trait WorkQueue: Clone + Send + Sync + 'static {
    fn add(&self, key: u64);
    fn get(&self) -> impl Future<Output = Option<u64>> + Send;
    fn done(&self, key: &u64);
    fn shut_down_with_drain(&self) -> impl Future<Output = ()> + Send;
}

impl WorkQueue for Queue<u64> {
    fn add(&self, key: u64) {
        Queue::add(self, key);
    }

    fn get(&self) -> impl Future<Output = Option<u64>> + Send {
        Queue::get(self)
    }

    fn done(&self, key: &u64) {
        Queue::done(self, key);
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = ()> + Send {
        Queue::shut_down_with_drain(self)
    }
}

impl WorkQueue for PriorityQueue<u64> {
    fn add(&self, key: u64) {
        PriorityQueue::add(self, key);
    }

    fn get(&self) -> impl Future<Output = Option<u64>> + Send {
        PriorityQueue::get(self)
    }

    fn done(&self, key: &u64) {
        PriorityQueue::done(self, key);
    }

    fn shut_down_with_drain(&self) -> impl Future<Output = ()> + Send {
        PriorityQueue::shut_down_with_drain(self)
    }
}

struct WorkqueueRig<Q> {
    queue: Q,
    round: Arc<Round>,
    workers: Vec<JoinHandle<()>>,
}

impl<Q: WorkQueue> WorkqueueRig<Q> {
    fn new(queue: Q, workers: usize) -> Self {
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

/// The FIFO queue's rig (inside a runtime).
fn fifo(workers: usize) -> WorkqueueRig<Queue<u64>> {
    WorkqueueRig::new(Queue::new(), workers)
}

/// The priority queue's rig (inside a runtime: the queue spawns its timer task), with the
/// controllers' default rate limiter (unused: every add is immediate).
fn priority(workers: usize) -> WorkqueueRig<PriorityQueue<u64>> {
    WorkqueueRig::new(PriorityQueue::new(default_controller_rate_limiter()), workers)
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
        let rig = runtime.block_on(async { fifo(workers) });
        group.bench_function(format!("workqueue/{workers}_workers"), |b| {
            b.to_async(&runtime).iter(|| rig.round());
        });
        runtime.block_on(rig.stop());

        let rig = runtime.block_on(async { priority(workers) });
        group.bench_function(format!("priority_queue/{workers}_workers"), |b| {
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

/// Median round time of each rig over interleaved rounds; prints ops/s and the ratios.
fn print_ratios() {
    const ROUNDS: usize = 101;
    let runtime = runtime();
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    println!(
        "\nworkqueue / mpsc and priority queue / workqueue throughput (median of {ROUNDS} interleaved rounds of {KEYS} keys):"
    );
    for workers in WORKERS {
        let (queue_rig, priority_rig, mpsc_rig) =
            runtime.block_on(async { (fifo(workers), priority(workers), MpscRig::new(workers)) });
        let (mut queue_times, mut priority_times, mut mpsc_times) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let start = Instant::now();
            runtime.block_on(queue_rig.round());
            queue_times.push(start.elapsed());
            let start = Instant::now();
            runtime.block_on(priority_rig.round());
            priority_times.push(start.elapsed());
            let start = Instant::now();
            runtime.block_on(mpsc_rig.round());
            mpsc_times.push(start.elapsed());
        }
        runtime.block_on(async {
            queue_rig.stop().await;
            priority_rig.stop().await;
            mpsc_rig.stop().await;
        });
        let (queue_time, priority_time, mpsc_time) = (
            median(&mut queue_times),
            median(&mut priority_times),
            median(&mut mpsc_times),
        );
        let mops = |time: Duration| KEYS as f64 / time.as_secs_f64() / 1e6;
        println!(
            "  {workers} worker(s): workqueue {:.2} M ops/s, mpsc {:.2} M ops/s, ratio {:.2}x; priority queue {:.2} M ops/s, {:.2}x workqueue",
            mops(queue_time),
            mops(mpsc_time),
            mpsc_time.as_secs_f64() / queue_time.as_secs_f64(),
            mops(priority_time),
            queue_time.as_secs_f64() / priority_time.as_secs_f64(),
        );
    }
}

criterion_group!(benches, throughput);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    print_ratios();
}
