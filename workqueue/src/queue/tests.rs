//! Scenarios of client-go's `queue_test.go`, plus a model-based property test.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use proptest::prelude::*;
use rand::Rng;

use super::*;

/// Lets spawned tasks run until they block.
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn len_counts_distinct_waiting_items() {
    let queue = Queue::new();
    queue.add("foo");
    assert_eq!(queue.len(), 1);
    queue.add("bar");
    assert_eq!(queue.len(), 2);
    queue.add("foo");
    assert_eq!(queue.len(), 2);
    assert!(!queue.is_empty());
    queue.check_invariants();
}

#[tokio::test(start_paused = true)]
async fn items_are_handed_out_fifo() {
    let queue = Queue::new();
    for item in [3, 1, 2, 1, 3] {
        queue.add(item);
    }
    let mut order = Vec::new();
    while let Some(item) = queue.get().now_or_never().flatten() {
        order.push(item);
        queue.done(&item);
    }
    assert_eq!(order, [3, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn adds_collapse_while_queued() {
    let queue = Queue::new();
    queue.add("bar");
    queue.add("bar");
    assert_eq!(queue.get().await, Some("bar"));
    queue.done(&"bar");
    assert!(queue.is_empty());
    assert!(queue.get().now_or_never().is_none(), "get must block");
}

#[tokio::test(start_paused = true)]
async fn readd_while_processing_requeues_once_on_done() {
    let queue = Queue::new();
    queue.add("foo");
    assert_eq!(queue.get().await, Some("foo"));
    queue.add("foo");
    queue.add("foo");
    queue.check_invariants();
    assert_eq!(queue.len(), 0, "an item being processed is not queued");
    queue.done(&"foo");
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.get().await, Some("foo"));
    queue.done(&"foo");
    assert!(queue.is_empty());
    queue.check_invariants();
}

#[tokio::test(start_paused = true)]
async fn item_being_processed_is_not_handed_to_a_second_worker() {
    let queue = Queue::new();
    queue.add(1);
    assert_eq!(queue.get().await, Some(1));
    queue.add(1);
    let second = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await }
    });
    settle().await;
    assert!(!second.is_finished(), "handed out twice");
    queue.done(&1);
    assert_eq!(second.await.unwrap(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn done_for_an_item_not_processing_is_ignored() {
    let queue = Queue::new();
    queue.add(1);
    queue.done(&1);
    queue.done(&2);
    assert_eq!(queue.len(), 1);
    queue.check_invariants();
}

#[tokio::test(start_paused = true)]
async fn blocked_get_wakes_on_add() {
    let queue = Queue::new();
    let worker = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await }
    });
    settle().await;
    assert!(!worker.is_finished());
    queue.add(7);
    assert_eq!(worker.await.unwrap(), Some(7));
}

#[tokio::test(start_paused = true)]
async fn cancelled_get_does_not_lose_the_wakeup() {
    let queue = Queue::new();
    let cancelled = tokio::spawn({
        let queue = queue.clone();
        async move { tokio::time::timeout(Duration::from_secs(1), queue.get()).await }
    });
    let worker = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await }
    });
    settle().await;
    // Wake one waiter, then cancel whichever got the wake-up; the other must still get the item.
    queue.add(1);
    cancelled.abort();
    let _ = cancelled.await;
    let got = tokio::time::timeout(Duration::from_secs(5), worker).await;
    assert_eq!(got.expect("wake-up lost").unwrap(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn get_cancelled_while_parked_leaves_the_wakeup_to_others() {
    let queue = Queue::new();
    let cancelled = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await }
    });
    let worker = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await }
    });
    settle().await;
    // The oldest parked `get` goes away before any add: the add must wake the other one.
    cancelled.abort();
    let _ = cancelled.await;
    queue.add(1);
    let got = tokio::time::timeout(Duration::from_secs(5), worker).await;
    assert_eq!(got.expect("wake-up lost").unwrap(), Some(1));
    queue.check_invariants();
}

/// The two ways of shutting down, run by the scenarios that client-go runs with both.
#[derive(Clone, Copy, Debug)]
enum ShutDown {
    Now,
    WithDrain,
}

impl ShutDown {
    async fn shut_down<T: Clone + Eq + Hash + Send + Sync + 'static>(self, queue: &Queue<T>) {
        match self {
            ShutDown::Now => queue.shut_down(),
            ShutDown::WithDrain => queue.shut_down_with_drain().await,
        }
    }
}

/// Added after the shutdown: must never be handed out.
const ADDED_AFTER_SHUTDOWN: u32 = u32::MAX;

#[tokio::test(start_paused = true)]
async fn many_producers_and_consumers_process_everything() {
    // client-go's TestBasic: 50 producers add items, 10 consumers process them; once the
    // producers are done the queue shuts down, and both kinds of shutdown let the consumers
    // finish every queued item before `get` returns `None`.
    for how in [ShutDown::Now, ShutDown::WithDrain] {
        let queue = Queue::new();
        let processed = Arc::new(Mutex::new(Vec::new()));
        let consumers: Vec<_> = (0..10)
            .map(|_| {
                let (queue, processed) = (queue.clone(), Arc::clone(&processed));
                tokio::spawn(async move {
                    while let Some(item) = queue.get().await {
                        assert_ne!(item, ADDED_AFTER_SHUTDOWN, "{how:?}: got an item added after shutdown");
                        processed.lock().unwrap().push(item);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        queue.done(&item);
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..50)
            .map(|producer| {
                let queue = queue.clone();
                tokio::spawn(async move {
                    for i in 0..50 {
                        queue.add(producer * 50 + i);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.unwrap();
        }
        // Each producer's last add and the consumers' 3 ms per item leave work queued.
        assert!(!queue.is_empty(), "{how:?}: nothing queued at shutdown proves nothing");
        how.shut_down(&queue).await;
        queue.add(ADDED_AFTER_SHUTDOWN);
        for consumer in consumers {
            consumer.await.unwrap();
        }
        let processed = processed.lock().unwrap();
        let distinct: HashSet<u32> = processed.iter().copied().collect();
        assert_eq!(distinct.len(), 2500, "{how:?}: queued items were lost");
        assert_eq!(processed.len(), 2500, "{how:?}: an item was processed twice");
        assert!(queue.is_empty());
        assert!(queue.unfinished().is_empty());
        queue.check_invariants();
    }
}

#[tokio::test(start_paused = true)]
async fn readds_while_processing_are_all_processed_before_shutdown_completes() {
    // client-go's TestAddWhileProcessing: every worker adds each item it gets back once, so
    // items are dirty while processing when the queue shuts down; `done` requeues them and the
    // workers still get them.
    for how in [ShutDown::Now, ShutDown::WithDrain] {
        let queue = Queue::new();
        for item in 0..50u32 {
            queue.add(item);
        }
        let gets = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = (0..10)
            .map(|_| {
                let (queue, gets) = (queue.clone(), Arc::clone(&gets));
                tokio::spawn(async move {
                    let mut seen = HashSet::new();
                    while let Some(item) = queue.get().await {
                        gets.lock().unwrap().push(item);
                        if seen.insert(item) {
                            queue.add(item);
                        }
                        tokio::task::yield_now().await;
                        queue.done(&item);
                    }
                })
            })
            .collect();
        // Let every worker take an item and mark it dirty, then shut down.
        tokio::task::yield_now().await;
        how.shut_down(&queue).await;
        for worker in workers {
            worker.await.unwrap();
        }
        let gets = gets.lock().unwrap();
        for item in 0..50u32 {
            assert!(gets.contains(&item), "{how:?}: item {item} never processed");
        }
        assert!(
            gets.len() > 50,
            "{how:?}: no item was added back while processing, so the scenario did not happen"
        );
        assert!(queue.is_empty());
        assert!(queue.unfinished().is_empty());
        queue.check_invariants();
    }
}

#[tokio::test(start_paused = true)]
async fn add_after_shut_down_is_ignored() {
    let queue = Queue::new();
    queue.add(1);
    queue.shut_down();
    assert!(queue.shutting_down());
    queue.add(2);
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.get().await, Some(1), "what was queued before is still handed out");
    queue.done(&1);
    assert_eq!(queue.get().await, None, "the ignored add was not queued");
}

#[tokio::test(start_paused = true)]
async fn get_after_shut_down_hands_out_queued_items_then_none() {
    // client-go's `Get`: `for len(queue) == 0 && !shuttingDown { Wait() }; if len(queue) == 0
    // { return shutdown }`: a shut-down queue is emptied first, and does not wait for anyone.
    let queue = Queue::new();
    for item in [1, 2, 3] {
        queue.add(item);
    }
    let first = queue.get().await.unwrap();
    queue.shut_down();
    assert_eq!(queue.get().now_or_never(), Some(Some(2)));
    assert_eq!(queue.get().now_or_never(), Some(Some(3)));
    assert_eq!(
        queue.get().now_or_never(),
        Some(None),
        "empty: `None` at once, although three items are still being processed"
    );
    assert_eq!(queue.get().now_or_never(), Some(None), "and again");
    for item in [first, 2, 3] {
        queue.done(&item);
    }
    assert!(queue.unfinished().is_empty());
    queue.check_invariants();
}

#[tokio::test(start_paused = true)]
async fn get_blocked_at_shut_down_returns_none_and_a_requeued_item_is_still_handed_out() {
    // client-go's TestQueueDrainageUsingShutDownWithDrainWithDirtyItem, with both shutdowns: a
    // `get` waiting on an empty queue returns `None` when it shuts down; an item added again
    // before the shutdown while it was processed is queued again by `done` and handed out.
    for how in [ShutDown::Now, ShutDown::WithDrain] {
        let queue = Queue::new();
        queue.add("foo");
        let foo = queue.get().await.unwrap();
        queue.add("foo"); // dirty
        let blocked = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        settle().await;
        assert!(
            !blocked.is_finished(),
            "{how:?}: foo is being processed: nothing to get"
        );
        let shutdown = tokio::spawn({
            let queue = queue.clone();
            async move { how.shut_down(&queue).await }
        });
        settle().await;
        assert_eq!(blocked.await.unwrap(), None, "{how:?}");
        assert_eq!(queue.get().await, None, "{how:?}: still nothing queued");
        queue.done(&foo);
        assert_eq!(queue.len(), 1, "{how:?}: done requeued the dirty item");
        assert_eq!(queue.get().await, Some("foo"), "{how:?}");
        settle().await;
        assert_eq!(
            shutdown.is_finished(),
            matches!(how, ShutDown::Now),
            "{how:?}: only the drain waits for the requeued foo"
        );
        queue.done(&"foo");
        assert_eq!(queue.get().await, None, "{how:?}");
        shutdown.await.unwrap();
        queue.check_invariants();
    }
}

#[tokio::test(start_paused = true)]
async fn shut_down_wakes_blocked_workers() {
    let queue = Queue::<u32>::new();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move { queue.get().await })
        })
        .collect();
    settle().await;
    queue.shut_down();
    for worker in workers {
        assert_eq!(worker.await.unwrap(), None);
    }
}

#[tokio::test(start_paused = true)]
async fn shut_down_does_not_wait_for_processing() {
    // client-go's TestNoQueueDrainageUsingShutDown: `shut_down` returns at once although items
    // are being processed and others are queued.
    let queue = Queue::new();
    queue.add(1);
    queue.add(2);
    let _item = queue.get().await;
    queue.shut_down();
    assert_eq!(queue.len(), 1, "the queued item stays queued for the workers");
    // Still usable for the item in hand.
    queue.done(&1);
    queue.check_invariants();
}

#[tokio::test(start_paused = true)]
async fn drain_waits_for_items_being_processed() {
    let queue = Queue::new();
    queue.add(1);
    queue.add(2);
    let one = queue.get().await.unwrap();
    let two = queue.get().await.unwrap();
    let drain = tokio::spawn({
        let queue = queue.clone();
        async move { queue.shut_down_with_drain().await }
    });
    settle().await;
    assert!(!drain.is_finished());
    queue.add(3);
    assert_eq!(queue.len(), 0, "add while draining is ignored");
    queue.done(&one);
    settle().await;
    assert!(!drain.is_finished());
    queue.done(&two);
    drain.await.unwrap();
    assert_eq!(queue.get().await, None);
}

#[tokio::test(start_paused = true)]
async fn drain_hands_out_queued_and_dirty_items() {
    let queue = Queue::new();
    queue.add(1);
    queue.add(2);
    let one = queue.get().await.unwrap();
    queue.add(one); // dirty while processing
    let drain = tokio::spawn({
        let queue = queue.clone();
        async move { queue.shut_down_with_drain().await }
    });
    settle().await;
    assert_eq!(queue.get().await, Some(2), "queued items are still handed out");
    queue.done(&2);
    queue.done(&one);
    settle().await;
    assert!(!drain.is_finished(), "the dirty item was requeued and is unfinished");
    assert_eq!(queue.get().await, Some(1));
    queue.done(&1);
    drain.await.unwrap();
    assert_eq!(queue.get().await, None);
}

#[tokio::test(start_paused = true)]
async fn drain_waits_for_queued_items_too() {
    // Stricter than client-go, which returns once nothing is being processed: the drain
    // returns only when the items still queued have been handed out and done.
    let queue = Queue::new();
    queue.add(1);
    queue.add(2);
    let drain = tokio::spawn({
        let queue = queue.clone();
        async move { queue.shut_down_with_drain().await }
    });
    settle().await;
    assert!(!drain.is_finished(), "two items are queued");
    for item in [1, 2] {
        assert_eq!(queue.get().await, Some(item));
        settle().await;
        assert!(!drain.is_finished(), "item {item} is being processed");
        queue.done(&item);
    }
    drain.await.unwrap();
    assert_eq!(queue.get().await, None);
}

#[tokio::test(start_paused = true)]
async fn drain_of_idle_queue_returns_at_once() {
    let queue = Queue::<u32>::new();
    queue.shut_down_with_drain().await;
    assert!(queue.shutting_down());
}

#[tokio::test(start_paused = true)]
async fn shut_down_cancels_a_pending_drain() {
    // client-go's TestForceQueueShutdownUsingShutDown.
    let queue = Queue::new();
    queue.add(1);
    queue.add(2);
    let _item = queue.get().await;
    let drain = tokio::spawn({
        let queue = queue.clone();
        async move { queue.shut_down_with_drain().await }
    });
    settle().await;
    assert!(!drain.is_finished());
    queue.shut_down();
    drain.await.unwrap();
    assert_eq!(
        queue.get().await,
        Some(2),
        "the forced shutdown still hands out what is queued"
    );
}

#[tokio::test(start_paused = true)]
async fn drain_stress_never_hangs_and_returns_after_all_done() {
    const WORKERS: usize = 32;
    const ITEMS: usize = 2_000;
    let queue = Queue::new();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let processed = Arc::new(AtomicUsize::new(0));
    for item in 0..ITEMS {
        queue.add(item);
    }
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let (queue, in_flight, processed) = (queue.clone(), Arc::clone(&in_flight), Arc::clone(&processed));
            tokio::spawn(async move {
                while let Some(item) = queue.get().await {
                    in_flight.fetch_add(1, Ordering::SeqCst);
                    for _ in 0..(item + worker) % 4 {
                        tokio::task::yield_now().await;
                    }
                    if item % 7 == 0 {
                        queue.add(item); // ignored once draining
                    }
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    processed.fetch_add(1, Ordering::SeqCst);
                    queue.done(&item);
                }
            })
        })
        .collect();
    settle().await;
    tokio::time::timeout(Duration::from_secs(60), queue.shut_down_with_drain())
        .await
        .expect("shut_down_with_drain hung");
    assert_eq!(
        in_flight.load(Ordering::SeqCst),
        0,
        "drain returned with work in flight"
    );
    assert!(processed.load(Ordering::SeqCst) >= ITEMS);
    assert!(queue.is_empty());
    for worker in workers {
        worker.await.unwrap();
    }
    queue.check_invariants();
}

#[test]
fn drain_stress_multi_thread() {
    // The same on a real multi-threaded runtime, where the interleavings are not cooperative.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    for round in 0..20 {
        runtime.block_on(async {
            let queue = Queue::new();
            let in_flight = Arc::new(AtomicUsize::new(0));
            for item in 0..500 {
                queue.add(item);
            }
            let workers: Vec<_> = (0..16)
                .map(|_| {
                    let (queue, in_flight) = (queue.clone(), Arc::clone(&in_flight));
                    tokio::spawn(async move {
                        while let Some(item) = queue.get().await {
                            in_flight.fetch_add(1, Ordering::SeqCst);
                            if (item + round) % 5 == 0 {
                                queue.add(item);
                                tokio::task::yield_now().await;
                            }
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                            queue.done(&item);
                        }
                    })
                })
                .collect();
            tokio::time::timeout(Duration::from_secs(30), queue.shut_down_with_drain())
                .await
                .expect("shut_down_with_drain hung");
            assert_eq!(in_flight.load(Ordering::SeqCst), 0);
            for worker in workers {
                tokio::time::timeout(Duration::from_secs(30), worker)
                    .await
                    .expect("worker hung")
                    .unwrap();
            }
            queue.check_invariants();
        });
    }
}

#[test]
fn concurrent_readds_never_overlap_and_are_all_processed() {
    // 8 workers over 10k keys, re-adding keys at random while processing. Every add is stamped
    // before it happens and every get after it happens, so "each key's last get is stamped after
    // its last add" means no add was lost.
    const KEYS: usize = 10_000;
    const WORKERS: usize = 8;
    const READDS: usize = 20_000;

    struct Tracker {
        clock: AtomicUsize,
        in_flight: Mutex<HashSet<usize>>,
        last_add: Vec<AtomicUsize>,
        last_get: Vec<AtomicUsize>,
        readds_claimed: AtomicUsize,
        readds_done: AtomicUsize,
    }
    impl Tracker {
        fn tick(&self) -> usize {
            self.clock.fetch_add(1, Ordering::SeqCst) + 1
        }
        fn add(&self, queue: &Queue<usize>, key: usize) {
            self.last_add[key].fetch_max(self.tick(), Ordering::SeqCst);
            queue.add(key);
        }
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let queue = Queue::new();
        let tracker = Arc::new(Tracker {
            clock: AtomicUsize::new(0),
            in_flight: Mutex::new(HashSet::new()),
            last_add: (0..KEYS).map(|_| AtomicUsize::new(0)).collect(),
            last_get: (0..KEYS).map(|_| AtomicUsize::new(0)).collect(),
            readds_claimed: AtomicUsize::new(0),
            readds_done: AtomicUsize::new(0),
        });
        let readds_finished = Arc::new(Notify::new());
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (queue, tracker, readds_finished) =
                    (queue.clone(), Arc::clone(&tracker), Arc::clone(&readds_finished));
                tokio::spawn(async move {
                    while let Some(key) = queue.get().await {
                        let key: usize = key;
                        let stamp = tracker.tick();
                        tracker.last_get[key].fetch_max(stamp, Ordering::SeqCst);
                        assert!(
                            tracker.in_flight.lock().unwrap().insert(key),
                            "key {key} processed by two workers at once"
                        );
                        let (readd, yield_first) = {
                            let mut rng = rand::rng();
                            // Always re-add while the budget lasts: half the time the key in
                            // hand, so the work never dies out before the budget is spent.
                            let readd = if rng.random_bool(0.5) {
                                key
                            } else {
                                rng.random_range(0..KEYS)
                            };
                            (readd, rng.random_bool(0.5))
                        };
                        if yield_first {
                            tokio::task::yield_now().await;
                        }
                        if tracker.readds_claimed.fetch_add(1, Ordering::SeqCst) < READDS {
                            tracker.add(&queue, readd);
                            if tracker.readds_done.fetch_add(1, Ordering::SeqCst) + 1 == READDS {
                                readds_finished.notify_one();
                            }
                        }
                        assert!(tracker.in_flight.lock().unwrap().remove(&key));
                        queue.done(&key);
                    }
                })
            })
            .collect();
        for key in 0..KEYS {
            tracker.add(&queue, key);
        }
        tokio::time::timeout(Duration::from_secs(60), readds_finished.notified())
            .await
            .expect("re-adds never finished");
        tokio::time::timeout(Duration::from_secs(60), queue.shut_down_with_drain())
            .await
            .expect("drain hung");
        for worker in workers {
            worker.await.unwrap();
        }
        for key in 0..KEYS {
            let (added, got) = (
                tracker.last_add[key].load(Ordering::SeqCst),
                tracker.last_get[key].load(Ordering::SeqCst),
            );
            assert!(
                got > added,
                "key {key}: last add at {added} never processed (last get {got})"
            );
        }
        queue.check_invariants();
    });
}

/// Operations on the queue, for the model test.
#[derive(Clone, Debug)]
enum Op {
    Add(u8),
    Get,
    /// Done with the n-th (modulo) item being processed, or with an arbitrary item.
    Done(usize),
    DoneUnknown(u8),
    Len,
    ShutDown,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..8).prop_map(Op::Add),
        5 => Just(Op::Get),
        4 => any::<usize>().prop_map(Op::Done),
        1 => (0u8..8).prop_map(Op::DoneUnknown),
        2 => Just(Op::Len),
        1 => Just(Op::ShutDown),
    ]
}

/// The queue's specification, written differently from the implementation: a list of waiting
/// items, the items in workers' hands, and which of those were added again meanwhile.
#[derive(Default)]
struct Model {
    waiting: VecDeque<u8>,
    in_hand: BTreeSet<u8>,
    added_again: BTreeSet<u8>,
    shut_down: bool,
}

impl Model {
    fn add(&mut self, item: u8) {
        if self.shut_down {
            return;
        }
        if self.in_hand.contains(&item) {
            self.added_again.insert(item);
        } else if !self.waiting.contains(&item) {
            self.waiting.push_back(item);
        }
    }

    /// `None` when `get` would block, `Some(None)` when it returns `None`.
    fn get(&mut self) -> Option<Option<u8>> {
        match self.waiting.pop_front() {
            Some(item) => {
                self.in_hand.insert(item);
                Some(Some(item))
            }
            None if self.shut_down => Some(None),
            None => None,
        }
    }

    fn done(&mut self, item: u8) {
        if self.in_hand.remove(&item) && self.added_again.remove(&item) {
            self.waiting.push_back(item);
        }
    }
}

proptest! {
    #[test]
    fn queue_behaves_like_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        let queue = Queue::new();
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Add(item) => {
                    queue.add(item);
                    model.add(item);
                }
                Op::Get => {
                    prop_assert_eq!(queue.get().now_or_never(), model.get());
                }
                Op::Done(n) => {
                    let in_hand: Vec<u8> = model.in_hand.iter().copied().collect();
                    if let Some(&item) = in_hand.get(n % in_hand.len().max(1)) {
                        queue.done(&item);
                        model.done(item);
                    }
                }
                Op::DoneUnknown(item) => {
                    queue.done(&item);
                    model.done(item);
                }
                Op::Len => prop_assert_eq!(queue.len(), model.waiting.len()),
                Op::ShutDown => {
                    queue.shut_down();
                    model.shut_down = true;
                }
            }
            queue.check_invariants();
            prop_assert_eq!(queue.len(), model.waiting.len());
        }
    }
}
