//! Readers of an informer's cache are not held while a relist is applied (issue #25, W4).
//!
//! The informer applies a relist (the RealFifo's one `ReplacedAll` item) by building the new
//! content off the cache's write lock and swapping it in (see `thread_safe_store`'s module
//! doc). Here an index function holds the relist in the middle of that build until the test
//! releases it; meanwhile a reader must be answered at once, from the old content, whole. If
//! the build held the write lock, the reader would wait for the release that only comes after
//! it answers: the bounded waits turn that into a failure, not a hang.
//!
//! Only the RealFifo applies a relist as one item. The DeltaFifo queues one `Replaced` delta
//! per key and the informer applies them one pop at a time, each under a short write lock (as
//! client-go does), so its relist is neither atomic to readers nor built off-lock.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use common::{FakeApi, gone};
use informer_core::{InformerConfig, QueueKind, ReflectorConfig, SharedIndexInformer};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio_util::sync::CancellationToken;

/// Bounded real-time wait on a plain thread (the index function runs on the informer's).
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < limit, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[derive(Clone, Default)]
struct Gate {
    armed: Arc<AtomicBool>,
    building: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_is_answered_from_the_old_content_while_a_relist_is_built() {
    let api = FakeApi::new();
    api.apply("kept", "1");
    api.apply("lost", "1");
    let gate = Gate::default();
    let config = InformerConfig::default()
        .queue(QueueKind::RealFifo)
        .reflector(ReflectorConfig::default().name("configmaps"))
        .indexer("value", {
            let gate = gate.clone();
            move |cm: &ConfigMap| {
                // Armed only for the relist: the first object it indexes holds it.
                if gate.armed.swap(false, SeqCst) {
                    gate.building.store(true, SeqCst);
                    wait_for("the test to release the relist", || gate.released.load(SeqCst));
                }
                cm.data.iter().flatten().map(|(_, v)| v.clone()).collect()
            }
        });
    let informer: SharedIndexInformer<ConfigMap> = SharedIndexInformer::new(api.clone(), config);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let informer = informer.clone();
        let shutdown = shutdown.clone();
        async move { informer.run(shutdown).await }
    });
    common::until("synced", || informer.has_synced()).await;
    let cache = informer.indexer().clone();
    assert_eq!(cache.len(), 2);

    // "lost" is deleted unseen, "new" created unseen: only a relist can tell the cache.
    api.forget("lost");
    gate.armed.store(true, SeqCst);
    api.break_watches(gone);
    let building = gate.building.clone();
    tokio::task::spawn_blocking(move || wait_for("the relist to build its indexes", || building.load(SeqCst)))
        .await
        .unwrap();

    // A reader during the build: answered at once (a deadline, not a pause), from the old
    // content, whole.
    let read = tokio::task::spawn_blocking({
        let cache = cache.clone();
        move || {
            let mut keys = cache.list_keys();
            keys.sort();
            let lost = cache.get_by_key("default/lost").is_some();
            let by_value = cache.by_index("value", "1").map(|objs| objs.len());
            (keys, lost, by_value)
        }
    });
    let (keys, lost, by_value) = tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .expect("a reader was held while the relist was built")
        .unwrap();
    assert_eq!(keys, ["default/kept", "default/lost"]);
    assert!(lost, "the old content until the swap");
    assert_eq!(by_value, Ok(2), "indexes agree with the objects a reader sees");

    gate.released.store(true, SeqCst);
    common::until("the relist swapped in", || cache.get_by_key("default/lost").is_none()).await;
    assert_eq!(cache.list_keys(), ["default/kept"]);
    cache.check_invariants().unwrap();
    shutdown.cancel();
    task.await.unwrap();
}
