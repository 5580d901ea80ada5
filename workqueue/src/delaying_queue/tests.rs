//! Scenarios of client-go's `delaying_queue_test.go`, on paused Tokio time.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use super::*;

/// Lets the timer task run until it blocks.
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

async fn advance(millis: u64) {
    tokio::time::advance(Duration::from_millis(millis)).await;
    settle().await;
}

fn drain_ready<T: Clone + Eq + Hash + Send + Sync + 'static>(queue: &DelayingQueue<T>) -> Vec<T> {
    let mut items = Vec::new();
    while let Some(item) = queue.get().now_or_never().flatten() {
        queue.done(&item);
        items.push(item);
    }
    items
}

#[tokio::test(start_paused = true)]
async fn item_is_added_after_its_delay() {
    let queue = DelayingQueue::new();
    queue.add_after("foo", Duration::from_millis(50));
    settle().await;
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.waiting_len(), 1);
    advance(49).await;
    assert_eq!(queue.len(), 0);
    advance(1).await;
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.waiting_len(), 0);
    assert_eq!(queue.get().await, Some("foo"));
    queue.done(&"foo");
    advance(100).await;
    assert!(queue.is_empty());
}

#[tokio::test(start_paused = true)]
async fn zero_delay_adds_now() {
    let queue = DelayingQueue::new();
    queue.add_after("foo", Duration::ZERO);
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.waiting_len(), 0);
}

#[tokio::test(start_paused = true)]
async fn readding_keeps_the_earliest_ready_time() {
    let queue = DelayingQueue::new();
    // A later time does not postpone the item...
    queue.add_after("foo", Duration::from_millis(50));
    queue.add_after("foo", Duration::from_millis(70));
    advance(60).await;
    assert_eq!(drain_ready(&queue), ["foo"]);
    advance(20).await;
    assert!(queue.is_empty(), "the later schedule was merged, not kept");

    // ...and an earlier time brings it forward.
    queue.add_after("foo", Duration::from_millis(70));
    queue.add_after("foo", Duration::from_millis(50));
    assert_eq!(queue.waiting_len(), 1);
    advance(60).await;
    assert_eq!(drain_ready(&queue), ["foo"]);
    advance(20).await;
    assert!(queue.is_empty(), "the stale entry must not fire");
}

#[tokio::test(start_paused = true)]
async fn an_earlier_item_rearms_the_timer() {
    let queue = DelayingQueue::new();
    queue.add_after("foo", Duration::from_secs(1));
    queue.add_after("bar", Duration::from_millis(50));
    advance(60).await;
    assert_eq!(drain_ready(&queue), ["bar"]);
    queue.add_after("foo", Duration::from_millis(50));
    advance(60).await;
    assert_eq!(drain_ready(&queue), ["foo"]);
}

#[tokio::test(start_paused = true)]
async fn items_leave_in_ready_time_order() {
    let queue = DelayingQueue::new();
    queue.add_after("foo", Duration::from_millis(3));
    queue.add_after("bar", Duration::from_millis(2));
    queue.add_after("baz", Duration::from_millis(1));
    queue.add_after("qux", Duration::from_millis(2));
    advance(5).await;
    assert_eq!(drain_ready(&queue), ["baz", "bar", "qux", "foo"]);
}

#[tokio::test(start_paused = true)]
async fn get_waits_for_a_delayed_item() {
    let queue = DelayingQueue::new();
    queue.add_after(1, Duration::from_secs(5));
    let start = Instant::now();
    assert_eq!(queue.get().await, Some(1));
    assert_eq!(start.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn huge_delay_does_not_overflow() {
    let queue = DelayingQueue::new();
    queue.add_after(1, Duration::MAX);
    advance(1_000_000).await;
    assert_eq!(queue.len(), 0);
    assert_eq!(queue.waiting_len(), 1);
}

#[tokio::test(start_paused = true)]
async fn delayed_item_already_queued_merges() {
    let queue = DelayingQueue::new();
    queue.add(1);
    queue.add_after(1, Duration::from_millis(10));
    advance(20).await;
    assert_eq!(drain_ready(&queue), [1]);
}

#[tokio::test(start_paused = true)]
async fn shut_down_stops_the_timer_task() {
    let queue = DelayingQueue::new();
    queue.add_after("foo", Duration::from_millis(50));
    settle().await;
    assert_eq!(Arc::strong_count(&queue.shared), 2, "the timer task holds the heap");
    queue.shut_down();
    settle().await;
    assert_eq!(Arc::strong_count(&queue.shared), 1, "the timer task did not stop");
    queue.add_after("bar", Duration::ZERO);
    advance(100).await;
    assert_eq!(queue.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn shut_down_hands_out_queued_items_and_drops_waiting_ones() {
    // client-go: `ShutDown` stops the waiting loop, and `Get` still returns what was queued.
    let queue = DelayingQueue::new();
    queue.add("queued");
    queue.add_after("ready-later", Duration::from_millis(50));
    queue.add_after("ready-now", Duration::from_millis(10));
    advance(10).await;
    assert_eq!(queue.len(), 2);
    queue.shut_down();
    queue.add_after("after", Duration::ZERO);
    advance(100).await;
    assert_eq!(
        queue.waiting_len(),
        1,
        "the timer stopped: the waiting item never became queued"
    );
    assert_eq!(queue.get().await, Some("queued"));
    assert_eq!(queue.get().await, Some("ready-now"));
    assert_eq!(queue.get().await, None, "nothing else is queued");
    queue.done(&"queued");
    queue.done(&"ready-now");
    assert_eq!(queue.unfinished(), ["ready-later"], "the dropped item stays reportable");
}

#[test]
fn ready_item_refused_by_the_queue_stays_waiting() {
    let start = Instant::now();
    let at = |millis| start + Duration::from_millis(millis);
    let mut heap = ReadyHeap::default();
    heap.insert("a", at(10));
    heap.insert("b", at(20));
    heap.insert("c", at(30));
    heap.insert("b", at(15)); // leaves a stale entry at 20
    let mut taken = Vec::new();
    let all_taken = heap.pop_ready(at(40), |item| {
        if item == "b" {
            return Err(item);
        }
        taken.push(item);
        Ok(())
    });
    assert!(!all_taken);
    assert_eq!(taken, ["a"], "nothing after the refused item is taken");
    assert_eq!(heap.len(), 2);
    assert_eq!(heap.next_ready_at(), Some(at(15)), "b keeps its time");
    assert_eq!(pop_ready(&mut heap, at(40)), ["b", "c"], "and its place in the order");
}

#[tokio::test(start_paused = true)]
async fn item_ready_as_the_queue_shuts_down_is_listed_unfinished() {
    // The timer found an item ready, and the queue shut down before it could be added: the
    // item must not vanish from both the heap and the queue.
    let queue = DelayingQueue::new();
    queue.add_after("late", Duration::from_millis(10));
    queue.shut_down();
    tokio::time::advance(Duration::from_millis(10)).await;
    let moved = queue
        .shared
        .lock()
        .pop_ready(Instant::now(), |item| queue.queue.try_add(item));
    assert!(!moved);
    assert_eq!(queue.get().await, None);
    assert_eq!(queue.unfinished(), ["late"]);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_handle_stops_the_timer_task() {
    let queue = DelayingQueue::new();
    queue.add_after("foo", Duration::from_secs(50));
    let shared = Arc::downgrade(&queue.shared);
    let clone = queue.clone();
    drop(queue);
    settle().await;
    assert!(shared.upgrade().is_some(), "a handle is still alive");
    drop(clone);
    settle().await;
    assert!(shared.upgrade().is_none(), "the timer task outlived every handle");
}

#[tokio::test(start_paused = true)]
async fn drain_stops_the_timer_and_finishes_work() {
    let queue = DelayingQueue::new();
    queue.add(1);
    queue.add_after(2, Duration::from_secs(1));
    let item = queue.get().await.unwrap();
    let drain = tokio::spawn({
        let queue = queue.clone();
        async move { queue.shut_down_with_drain().await }
    });
    settle().await;
    assert!(!drain.is_finished());
    queue.done(&item);
    drain.await.unwrap();
    advance(2_000).await;
    assert_eq!(queue.get().await, None);
}

/// The items `heap` holds ready at `now`, taken from it.
fn pop_ready<T: Clone + Eq + Hash>(heap: &mut ReadyHeap<T>, now: Instant) -> Vec<T> {
    let mut ready = Vec::new();
    assert!(heap.pop_ready(now, |item| {
        ready.push(item);
        Ok(())
    }));
    ready
}

#[test]
fn ready_heap_skips_stale_entries() {
    let start = Instant::now();
    let at = |millis| start + Duration::from_millis(millis);
    let mut heap = ReadyHeap::default();
    assert!(heap.insert("a", at(30)));
    assert!(!heap.insert("b", at(40)));
    assert!(!heap.insert("a", at(50)), "later time is ignored");
    assert!(heap.insert("a", at(10)), "earlier time re-arms");
    assert_eq!(heap.len(), 2);
    assert_eq!(heap.next_ready_at(), Some(at(10)));
    assert_eq!(pop_ready(&mut heap, at(35)), ["a"]);
    assert_eq!(heap.len(), 1);
    assert_eq!(pop_ready(&mut heap, at(100)), ["b"]);
    assert_eq!(heap.next_ready_at(), None);
}

#[tokio::test(start_paused = true)]
async fn unfinished_lists_queued_processing_dirty_and_waiting_items_once() {
    let queue = DelayingQueue::new();
    queue.add("processing");
    queue.add("queued");
    queue.add_after("waiting", Duration::from_secs(5));
    queue.add_after("queued", Duration::from_secs(5)); // also waiting: listed once
    assert_eq!(queue.get().await, Some("processing"));
    queue.add("processing"); // dirty while processing
    let mut unfinished = queue.unfinished();
    unfinished.sort_unstable();
    assert_eq!(unfinished, ["processing", "queued", "waiting"]);
    queue.done(&"processing");
    assert_eq!(queue.get().await, Some("queued"));
    queue.done(&"queued");
    assert_eq!(queue.get().await, Some("processing"));
    queue.done(&"processing");
    let mut unfinished = queue.unfinished();
    unfinished.sort_unstable();
    assert_eq!(
        unfinished,
        ["queued", "waiting"],
        "both still wait for their delayed add"
    );
    advance(5_000).await;
    for expected in ["waiting", "queued"] {
        assert_eq!(queue.get().await, Some(expected), "ready in add_after order");
        queue.done(&expected);
    }
    assert!(queue.unfinished().is_empty());
}

/// Tasks alive on the current runtime.
fn alive_tasks() -> usize {
    tokio::runtime::Handle::current().metrics().num_alive_tasks()
}

/// Yields until `alive_tasks() == want` or 1,000 yields passed; the last count seen.
async fn until_alive(want: usize) -> usize {
    for _ in 0..1_000 {
        if alive_tasks() == want {
            break;
        }
        tokio::task::yield_now().await;
    }
    alive_tasks()
}

fn named_config() -> QueueConfig {
    let provider = crate::PrometheusMetricsProvider::new(&prometheus::Registry::new()).unwrap();
    QueueConfig::default()
        .name("owned")
        .metrics_provider(Arc::new(provider))
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shutdown_and_join_leave_no_task_running() {
    let before = alive_tasks();
    let queue = DelayingQueue::with_config(named_config());
    assert_eq!(alive_tasks(), before + 2, "the timer and the metrics refresher");
    queue.add_after("a", Duration::from_secs(1));
    queue.shut_down();
    queue.join_tasks().await.unwrap();
    assert_eq!(alive_tasks(), before);
    assert_eq!(
        queue.join_tasks().await,
        Ok(()),
        "joined once; a second call returns at once"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_every_handle_ends_the_tasks() {
    let before = alive_tasks();
    let queue = DelayingQueue::<&str>::with_config(named_config());
    let clone = queue.clone();
    drop(queue);
    drop(clone);
    assert_eq!(until_alive(before).await, before);
}

/// An item whose `Hash` panics once armed: armed after `add_after`, it panics in the timer.
#[derive(Clone)]
struct Bomb {
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl PartialEq for Bomb {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Bomb {}

impl Hash for Bomb {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        assert!(!self.armed.load(std::sync::atomic::Ordering::SeqCst), "boom");
        0u8.hash(state);
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_panicking_timer_is_reported_by_join_tasks() {
    let before = alive_tasks();
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let queue = DelayingQueue::with_config(QueueConfig::default().name("bombs"));
    queue.add_after(Bomb { armed: armed.clone() }, Duration::from_millis(10));
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    advance(20).await;
    assert_eq!(until_alive(before).await, before, "the timer ended with its panic");
    queue.shut_down();
    let panicked = queue.join_tasks().await.unwrap_err();
    assert_eq!(
        (panicked.queue.as_str(), panicked.task),
        ("bombs", "delaying queue timer")
    );
    assert!(panicked.message.contains("boom"), "{panicked}");
}
