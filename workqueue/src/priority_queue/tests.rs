//! The plain queue's scenarios (client-go's `queue_test.go`, `delaying_queue_test.go`,
//! `rate_limiting_queue_test.go`) run on the priority queue, controller-runtime's
//! `priorityqueue_test.go` scenarios, and a model-based property test.

use std::collections::{BTreeMap as Map, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use futures::FutureExt;
use prometheus::Registry;
use proptest::prelude::*;

use super::*;
use crate::default_rate_limiters::ItemExponentialFailureRateLimiter;
use crate::metrics::PrometheusMetricsProvider;

fn queue<T: Clone + Eq + Hash + Send + Sync + 'static>() -> PriorityQueue<T> {
    PriorityQueue::new(ItemExponentialFailureRateLimiter::new(
        Duration::from_millis(5),
        Duration::from_secs(1000),
    ))
}

/// Lets spawned tasks run until they block.
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

async fn advance(millis: u64) {
    tokio::time::advance(Duration::from_millis(millis)).await;
    settle().await;
}

/// Takes every ready item (and marks it done) without waiting: `(item, priority)` in order.
fn drain_ready<T: Clone + Eq + Hash + Send + Sync + 'static>(queue: &PriorityQueue<T>) -> Vec<(T, i32)> {
    let mut out = Vec::new();
    while let Some(Some((item, priority))) = queue.get_with_priority().now_or_never() {
        queue.done(&item);
        out.push((item, priority));
    }
    queue.check_invariants();
    out
}

fn at(priority: i32) -> AddOpts {
    AddOpts::default().priority(priority)
}

// ---- the plain queue's scenarios ----

#[tokio::test(start_paused = true)]
async fn len_counts_distinct_ready_items() {
    let queue = queue();
    queue.add("foo");
    queue.add("bar");
    queue.add_with_priority("foo", 5);
    assert_eq!(queue.len(), 2);
    assert!(!queue.is_empty());
    queue.check_invariants();
}

#[tokio::test(start_paused = true)]
async fn one_priority_is_handed_out_fifo() {
    let queue = queue();
    for item in [3, 1, 2, 1, 3] {
        queue.add(item);
    }
    assert_eq!(drain_ready(&queue), [(3, 0), (1, 0), (2, 0)]);
}

#[tokio::test(start_paused = true)]
async fn readd_while_processing_is_held_until_done() {
    let queue = queue();
    queue.add("foo");
    assert_eq!(queue.get().await, Some("foo"));
    queue.add("foo");
    queue.add("foo");
    queue.check_invariants();
    assert_eq!(queue.len(), 0, "an item being processed is not handed out again");
    assert!(queue.get().now_or_never().is_none(), "get must wait");
    queue.done(&"foo");
    assert_eq!(queue.len(), 1);
    assert_eq!(drain_ready(&queue), [("foo", 0)]);
    assert!(queue.unfinished().is_empty());
}

#[tokio::test(start_paused = true)]
async fn done_for_an_item_not_processing_is_ignored() {
    let queue = queue();
    queue.done(&1);
    queue.add(1);
    queue.done(&1);
    assert_eq!(queue.len(), 1, "still queued");
    assert_eq!(drain_ready(&queue), [(1, 0)]);
}

#[tokio::test(start_paused = true)]
async fn blocked_get_wakes_on_add() {
    let queue = queue();
    let worker = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get_with_priority().await }
    });
    settle().await;
    assert!(!worker.is_finished());
    queue.add_with_priority(7, 3);
    assert_eq!(worker.await.unwrap(), Some((7, 3)));
}

#[tokio::test(start_paused = true)]
async fn cancelled_get_does_not_lose_the_wakeup() {
    let queue = queue();
    let cancelled = tokio::spawn({
        let queue = queue.clone();
        async move { tokio::time::timeout(Duration::from_secs(1), queue.get()).await }
    });
    let worker = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await }
    });
    settle().await;
    queue.add(1);
    cancelled.abort();
    let _ = cancelled.await;
    let got = tokio::time::timeout(Duration::from_secs(5), worker).await;
    assert_eq!(got.expect("wake-up lost").unwrap(), Some(1));
}

#[tokio::test(start_paused = true)]
async fn many_producers_and_consumers_process_everything_once_at_a_time() {
    let queue = queue::<u32>();
    let in_hand = Arc::new(StdMutex::new(HashSet::new()));
    let processed = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..5)
        .map(|_| {
            let (queue, in_hand, processed) = (queue.clone(), in_hand.clone(), processed.clone());
            tokio::spawn(async move {
                while let Some(item) = queue.get().await {
                    assert!(in_hand.lock().unwrap().insert(item), "{item} handed to two workers");
                    tokio::task::yield_now().await;
                    in_hand.lock().unwrap().remove(&item);
                    processed.fetch_add(1, Ordering::SeqCst);
                    queue.done(&item);
                }
            })
        })
        .collect();
    let producers: Vec<_> = (0..4)
        .map(|p| {
            let queue = queue.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    queue.add_with_priority(i % 10, p - 2);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    queue.shut_down_with_drain().await;
    for worker in workers {
        worker.await.unwrap();
    }
    assert!(processed.load(Ordering::SeqCst) >= 10);
    assert!(queue.unfinished().is_empty());
    queue.check_invariants();
}

#[tokio::test(start_paused = true)]
async fn adds_after_shut_down_are_ignored() {
    let queue = queue();
    queue.add(1);
    queue.shut_down();
    assert!(queue.shutting_down());
    queue.add(2);
    queue.add_with_priority(3, 10);
    queue.add_after(4, Duration::from_millis(1));
    queue.add_rate_limited(5);
    assert_eq!(queue.num_requeues(&5), 0, "the rate limiter is not asked");
    advance(10).await;
    assert_eq!(
        drain_ready(&queue),
        [(1, 0)],
        "the item queued before is still handed out"
    );
    assert_eq!(queue.get().await, None);
}

#[tokio::test(start_paused = true)]
async fn get_after_shut_down_hands_out_ready_items_by_priority_then_none() {
    let queue = queue();
    queue.add(1);
    queue.add(2);
    queue.add_with_priority(3, 1);
    let first = queue.get().await.unwrap();
    assert_eq!(first, 3);
    queue.shut_down();
    assert_eq!(queue.get().now_or_never(), Some(Some(1)));
    assert_eq!(queue.get().now_or_never(), Some(Some(2)));
    assert_eq!(queue.get().now_or_never(), Some(None), "nothing ready: `None` at once");
    for item in [first, 1, 2] {
        queue.done(&item);
    }
    assert!(queue.unfinished().is_empty());
}

#[tokio::test(start_paused = true)]
async fn get_blocked_at_shut_down_returns_none_and_a_held_item_is_still_handed_out() {
    for drain in [false, true] {
        let queue = queue();
        queue.add("foo");
        let foo = queue.get().await.unwrap();
        queue.add_with_priority("foo", 2); // held
        let blocked = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        settle().await;
        assert!(!blocked.is_finished());
        let shutdown = tokio::spawn({
            let queue = queue.clone();
            async move {
                if drain {
                    queue.shut_down_with_drain().await;
                } else {
                    queue.shut_down();
                }
            }
        });
        settle().await;
        assert_eq!(blocked.await.unwrap(), None, "drain {drain}");
        queue.done(&foo);
        assert_eq!(queue.get_with_priority().await, Some(("foo", 2)), "drain {drain}");
        settle().await;
        assert_eq!(shutdown.is_finished(), !drain, "only the drain waits for the held foo");
        queue.done(&"foo");
        assert_eq!(queue.get().await, None);
        shutdown.await.unwrap();
        queue.check_invariants();
    }
}

#[tokio::test(start_paused = true)]
async fn shut_down_wakes_blocked_workers() {
    let queue = queue::<u32>();
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
async fn drain_waits_for_ready_and_processing_items_but_not_waiting_ones() {
    let queue = queue();
    queue.add(1);
    queue.add(2);
    queue.add_after(3, Duration::from_secs(60));
    let one = queue.get().await.unwrap();
    let drain = tokio::spawn({
        let queue = queue.clone();
        async move { queue.shut_down_with_drain().await }
    });
    settle().await;
    assert!(!drain.is_finished());
    queue.done(&one);
    settle().await;
    assert!(!drain.is_finished(), "2 is still ready");
    assert_eq!(queue.get().await, Some(2));
    settle().await;
    assert!(!drain.is_finished(), "2 is being processed");
    queue.done(&2);
    drain.await.unwrap();
    advance(120_000).await;
    assert_eq!(queue.get().await, None, "the waiting item was dropped at shutdown");
    assert_eq!(queue.unfinished(), [3], "and is still listed");
    assert_eq!(queue.waiting_len(), 1);
}

#[tokio::test(start_paused = true)]
async fn shut_down_cancels_a_pending_drain() {
    let queue = queue();
    queue.add(1);
    let _item = queue.get().await;
    let drain = tokio::spawn({
        let queue = queue.clone();
        async move { queue.shut_down_with_drain().await }
    });
    settle().await;
    assert!(!drain.is_finished());
    queue.shut_down();
    drain.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shut_down_ends_the_tasks_and_join_reports_none_panicked() {
    let registry = Registry::new();
    let provider = Arc::new(PrometheusMetricsProvider::new(&registry).unwrap());
    let queue = PriorityQueue::<u32>::with_config(
        ItemExponentialFailureRateLimiter::new(Duration::from_millis(1), Duration::from_secs(1)),
        QueueConfig::default().name("tasks").metrics_provider(provider),
    );
    queue.add_after(1, Duration::from_secs(1));
    queue.shut_down();
    tokio::time::timeout(Duration::from_secs(1), queue.join_tasks())
        .await
        .expect("tasks still running")
        .unwrap();
}

// ---- delays and rate limits ----

#[tokio::test(start_paused = true)]
async fn delayed_item_lands_at_its_priority_when_due() {
    let queue = queue();
    queue.add_with_opts("late", at(5).after(Duration::from_millis(50)));
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.waiting_len(), 1);
    queue.add_with_priority("early", 0);
    advance(49).await;
    assert_eq!(queue.len(), 1);
    advance(1).await;
    assert_eq!(queue.len(), 2);
    assert_eq!(drain_ready(&queue), [("late", 5), ("early", 0)]);
}

#[tokio::test(start_paused = true)]
async fn a_due_item_joins_the_back_of_its_priority() {
    let queue = queue();
    queue.add_after("delayed", Duration::from_millis(10));
    queue.add("a");
    advance(10).await;
    queue.add("b");
    assert_eq!(drain_ready(&queue), [("a", 0), ("delayed", 0), ("b", 0)]);
}

#[tokio::test(start_paused = true)]
async fn readd_keeps_the_earliest_ready_time_and_the_highest_priority() {
    let queue = queue();
    queue.add_with_opts("x", at(1).after(Duration::from_millis(100)));
    queue.add_with_opts("x", at(-5).after(Duration::from_millis(30)));
    queue.add_with_opts("x", at(0).after(Duration::from_millis(200)));
    queue.check_invariants();
    advance(29).await;
    assert!(queue.is_empty());
    advance(1).await;
    assert_eq!(drain_ready(&queue), [("x", 1)]);
    advance(200).await;
    assert!(queue.is_empty(), "one entry only");
    assert!(queue.unfinished().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_immediate_add_makes_a_waiting_item_ready_now() {
    let queue = queue();
    queue.add_after("x", Duration::from_secs(10));
    queue.add_with_priority("x", -1);
    assert_eq!(queue.waiting_len(), 0);
    assert_eq!(drain_ready(&queue), [("x", 0)], "the higher of the two priorities");
    // And a delayed add of a ready item leaves it ready.
    queue.add("y");
    queue.add_after("y", Duration::from_secs(10));
    assert_eq!(drain_ready(&queue), [("y", 0)]);
}

#[tokio::test(start_paused = true)]
async fn an_earlier_item_rearms_the_timer() {
    let queue = queue();
    queue.add_after("late", Duration::from_secs(60));
    settle().await;
    queue.add_after("soon", Duration::from_millis(10));
    advance(10).await;
    assert_eq!(drain_ready(&queue), [("soon", 0)]);
}

#[tokio::test(start_paused = true)]
async fn rate_limited_adds_back_off_per_item_at_their_priority() {
    let queue = queue();
    queue.add_with_opts("one", at(3).rate_limited()); // 5 ms
    queue.add_with_opts("one", at(3).rate_limited()); // 10 ms: the earlier time wins
    assert_eq!(queue.num_requeues(&"one"), 2);
    queue.add_with_opts("two", AddOpts::default().rate_limited().after(Duration::from_millis(1)));
    advance(1).await;
    assert_eq!(drain_ready(&queue), [("two", 0)], "a shorter explicit delay wins");
    advance(4).await;
    assert_eq!(drain_ready(&queue), [("one", 3)]);
    queue.forget(&"one");
    assert_eq!(queue.num_requeues(&"one"), 0);
}

#[tokio::test(start_paused = true)]
async fn get_waits_for_a_delayed_item() {
    let queue = queue();
    queue.add_with_opts(1, at(2).after(Duration::from_secs(5)));
    let started = Instant::now();
    assert_eq!(queue.get_with_priority().await, Some((1, 2)));
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn huge_delay_does_not_overflow() {
    let queue = queue();
    queue.add_after(1, Duration::MAX);
    advance(1000).await;
    assert!(queue.is_empty());
    assert_eq!(queue.unfinished(), [1]);
}

#[tokio::test(start_paused = true)]
async fn an_item_due_while_processing_waits_for_done() {
    let queue = queue();
    queue.add("x");
    let x = queue.get().await.unwrap();
    queue.add_with_opts("x", at(4).after(Duration::from_millis(10)));
    advance(10).await;
    assert!(queue.is_empty(), "due, but still being processed");
    queue.check_invariants();
    queue.done(&x);
    assert_eq!(drain_ready(&queue), [("x", 4)]);
}

// ---- priorities (controller-runtime's priorityqueue_test.go) ----

#[tokio::test(start_paused = true)]
async fn higher_priority_first_fifo_within_a_priority() {
    let queue = queue();
    queue.add_with_priority("low-a", -100);
    queue.add_with_priority("mid-a", 0);
    queue.add_with_priority("low-b", -100);
    queue.add_with_priority("high", 10);
    queue.add_with_priority("mid-b", 0);
    assert_eq!(
        queue.len_by_priority(),
        [(10, 1), (0, 2), (-100, 2)],
        "len_by_priority, highest first"
    );
    assert_eq!(
        drain_ready(&queue),
        [
            ("high", 10),
            ("mid-a", 0),
            ("mid-b", 0),
            ("low-a", -100),
            ("low-b", -100)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn readd_at_a_higher_priority_moves_to_the_back_of_that_priority() {
    let queue = queue();
    queue.add_with_priority("a", -100);
    queue.add_with_priority("b", -100);
    queue.add_with_priority("c", 0);
    queue.add_with_priority("b", 0); // raised: behind c
    queue.add_with_priority("a", -200); // lower: ignored, keeps its place
    assert_eq!(queue.len(), 3);
    assert_eq!(drain_ready(&queue), [("c", 0), ("b", 0), ("a", -100)]);
}

#[tokio::test(start_paused = true)]
async fn readd_while_processing_keeps_the_highest_priority_it_was_added_with() {
    let queue = queue();
    queue.add("x");
    queue.add_with_priority("y", -100);
    let x = queue.get().await.unwrap();
    queue.add_with_priority("x", -100);
    queue.add_with_priority("z", -100);
    queue.add_with_priority("x", -50);
    queue.done(&x);
    // x was added at -100 before z, then raised to -50: first.
    assert_eq!(drain_ready(&queue), [("x", -50), ("y", -100), ("z", -100)]);
}

#[tokio::test(start_paused = true)]
async fn a_held_item_keeps_the_place_it_was_added_at() {
    let queue = queue();
    queue.add("x");
    let x = queue.get().await.unwrap();
    queue.add("x"); // held, placed now
    queue.add("later");
    queue.done(&x);
    assert_eq!(drain_ready(&queue), [("x", 0), ("later", 0)]);
}

#[tokio::test(start_paused = true)]
async fn a_fresh_change_overtakes_a_backlog() {
    let queue = queue();
    for i in 0..1000 {
        queue.add_with_priority(i, -100);
    }
    for _ in 0..10 {
        let item = queue.get().await.unwrap();
        queue.done(&item);
    }
    queue.add(500); // already queued at -100: raised
    queue.add(5000);
    assert_eq!(queue.get_with_priority().await, Some((500, 0)));
    assert_eq!(queue.get_with_priority().await, Some((5000, 0)));
    assert_eq!(queue.get_with_priority().await, Some((10, -100)));
}

// ---- metrics ----

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(start_paused = true)]
async fn named_queue_exports_every_workqueue_metric_with_depth_by_priority() {
    let registry = Registry::new();
    let provider = Arc::new(PrometheusMetricsProvider::new(&registry).unwrap());
    let queue = PriorityQueue::with_config(
        ItemExponentialFailureRateLimiter::new(Duration::from_millis(10), Duration::from_secs(1)),
        QueueConfig::default().name("pq").metrics_provider(provider),
    );
    let scrape = || {
        prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap()
    };
    let depth =
        |text: &str, priority: &str| sample(text, &format!(r#"workqueue_depth{{name="pq",priority="{priority}"}}"#));

    queue.add_with_priority("a", -100);
    queue.add_with_priority("b", -100);
    queue.add_with_priority("a", -100); // merged: not an add
    queue.add("c");
    let text = scrape();
    assert_eq!(depth(&text, "-100"), Some(2.0));
    assert_eq!(depth(&text, "0"), Some(1.0));
    assert_eq!(depth(&text, ""), None, "no priority-less series for a priority queue");
    assert_eq!(sample(&text, r#"workqueue_adds_total{name="pq"}"#), Some(3.0));

    queue.add_with_priority("b", 0); // raised: moves between series
    let text = scrape();
    assert_eq!(depth(&text, "-100"), Some(1.0));
    assert_eq!(depth(&text, "0"), Some(2.0));

    let c = queue.get().await.unwrap();
    assert_eq!(c, "c");
    queue.add_rate_limited("d");
    queue.add_after("e", Duration::from_millis(10));
    let text = scrape();
    assert_eq!(depth(&text, "0"), Some(1.0), "waiting items are not counted");
    assert_eq!(sample(&text, r#"workqueue_retries_total{name="pq"}"#), Some(2.0));
    assert_eq!(
        sample(&text, r#"workqueue_queue_duration_seconds_count{name="pq"}"#),
        Some(1.0)
    );

    advance(1_000).await;
    let text = scrape();
    assert_eq!(depth(&text, "0"), Some(3.0), "d and e became ready");
    assert_eq!(sample(&text, r#"workqueue_adds_total{name="pq"}"#), Some(5.0));
    assert_eq!(
        sample(&text, r#"workqueue_unfinished_work_seconds{name="pq"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"workqueue_longest_running_processor_seconds{name="pq"}"#),
        Some(1.0)
    );
    queue.done(&c);
    let text = scrape();
    assert_eq!(
        sample(&text, r#"workqueue_work_duration_seconds_sum{name="pq"}"#),
        Some(1.0)
    );
    drain_ready(&queue);
    let text = scrape();
    assert_eq!(depth(&text, "0"), Some(0.0));
    assert_eq!(depth(&text, "-100"), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn depth_series_are_capped_as_controller_runtimes() {
    let registry = Registry::new();
    let provider = Arc::new(PrometheusMetricsProvider::new(&registry).unwrap());
    let queue = PriorityQueue::with_config(
        ItemExponentialFailureRateLimiter::new(Duration::from_millis(10), Duration::from_secs(1)),
        QueueConfig::default().name("many").metrics_provider(provider),
    );
    for priority in 0..30 {
        queue.add_with_priority(priority, priority);
    }
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    let series = text
        .lines()
        .filter(|l| l.starts_with(r#"workqueue_depth{name="many""#))
        .count();
    assert_eq!(series, crate::metrics::MAX_PRIORITY_SERIES + 1);
    assert!(text.contains(r#"priority="exceeded_cardinality_limit"} 5"#), "{text}");
}

// ---- the model ----

#[derive(Clone, Debug)]
enum Op {
    Add(u8, i8),
    AddAfter(u8, i8, u8),
    Get,
    Done(u8),
    Advance(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..6u8, -2..3i8).prop_map(|(i, p)| Op::Add(i, p)),
        1 => (0..6u8, -2..3i8, 1..5u8).prop_map(|(i, p, d)| Op::AddAfter(i, p, d)),
        3 => Just(Op::Get),
        2 => (0..6u8).prop_map(Op::Done),
        1 => (1..5u8).prop_map(Op::Advance),
    ]
}

/// The rules of the module docs, written as plainly as possible.
#[derive(Default)]
struct Model {
    now: u64,
    counter: u64,
    /// item -> (priority, counter, ready at)
    queued: Map<u8, (i32, u64, Option<u64>)>,
    processing: HashSet<u8>,
}

impl Model {
    fn tick(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    fn add(&mut self, item: u8, priority: i32, after: u64) {
        let ready_at = (after > 0).then_some(self.now + after);
        let counter = self.tick();
        let Some(&(old_p, old_c, old_at)) = self.queued.get(&item) else {
            self.queued.insert(item, (priority, counter, ready_at));
            return;
        };
        let p = old_p.max(priority);
        let new = match (old_at, ready_at) {
            (None, _) => (p, if priority > old_p { counter } else { old_c }, None),
            (Some(_), None) => (p, counter, None),
            (Some(a), Some(b)) => (p, old_c, Some(a.min(b))),
        };
        self.queued.insert(item, new);
    }

    fn advance(&mut self, by: u64) {
        self.now += by;
        let mut due: Vec<(u64, u64, u8)> = self
            .queued
            .iter()
            .filter_map(|(item, (_, c, at))| at.filter(|at| *at <= self.now).map(|at| (at, *c, *item)))
            .collect();
        due.sort();
        for (_, _, item) in due {
            let counter = self.tick();
            let entry = self.queued.get_mut(&item).unwrap();
            *entry = (entry.0, counter, None);
        }
    }

    fn get(&mut self) -> Option<(u8, i32)> {
        let (&item, &(priority, _, _)) = self
            .queued
            .iter()
            .filter(|(item, (_, _, at))| at.is_none() && !self.processing.contains(item))
            .min_by_key(|(_, (p, c, _))| (-p, *c))?;
        self.queued.remove(&item);
        self.processing.insert(item);
        Some((item, priority))
    }
}

proptest! {
    #[test]
    fn queue_behaves_like_the_model(ops in proptest::collection::vec(op(), 1..150)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        runtime.block_on(async {
            let queue = queue::<u8>();
            let mut model = Model::default();
            for op in ops {
                match op {
                    Op::Add(item, p) => {
                        queue.add_with_priority(item, i32::from(p));
                        model.add(item, i32::from(p), 0);
                    }
                    Op::AddAfter(item, p, d) => {
                        queue.add_with_opts(item, at(i32::from(p)).after(Duration::from_millis(u64::from(d))));
                        model.add(item, i32::from(p), u64::from(d));
                    }
                    Op::Get => {
                        let got = queue.get_with_priority().now_or_never().flatten();
                        prop_assert_eq!(got, model.get());
                    }
                    Op::Done(item) => {
                        queue.done(&item);
                        model.processing.remove(&item);
                    }
                    Op::Advance(by) => {
                        advance(u64::from(by)).await;
                        model.advance(u64::from(by));
                    }
                }
                queue.check_invariants();
                prop_assert_eq!(queue.len(), model.queued.iter()
                    .filter(|(item, (_, _, at))| at.is_none() && !model.processing.contains(item)).count());
            }
            Ok(())
        })?;
    }
}

/// Raising most of a line's items leaves stale entries in it; once they outnumber its live
/// ones they are swept, and neither the order nor the counts change.
#[tokio::test(start_paused = true)]
async fn raising_most_of_a_backlog_keeps_order_and_counts() {
    let queue = queue();
    for key in 0..100 {
        queue.add_with_priority(key, -1);
    }
    for key in 0..60 {
        queue.add_with_priority(key, 1);
        queue.check_invariants();
    }
    assert_eq!(queue.len(), 100);
    assert_eq!(queue.len_by_priority(), vec![(1, 60), (-1, 40)]);
    let expected: Vec<(i32, i32)> = (0..60)
        .map(|key| (key, 1))
        .chain((60..100).map(|key| (key, -1)))
        .collect();
    assert_eq!(drain_ready(&queue), expected);
    assert!(queue.is_empty());
}
