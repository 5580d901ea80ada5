// Included twice by `tests/informer_fake.rs`, once per queue kind (`QUEUE`).
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{FakeApi, after_virtual_time, gone, server_error, until};
use informer_core::{
    DeletedObject, InformerConfig, InformerError, ListWatchError, ReflectorConfig, ReflectorMetrics,
    ResourceEventHandler, ResourceEventHandlerRegistration, SharedIndexInformer,
};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio_util::sync::CancellationToken;

/// What a handler saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Add {
        name: String,
        initial: bool,
    },
    Update {
        name: String,
        old_rv: String,
        new_rv: String,
    },
    Delete {
        name: String,
        tombstone: bool,
    },
}

#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn name(cm: &ConfigMap) -> String {
    cm.metadata.name.clone().unwrap_or_default()
}

fn rv(cm: &ConfigMap) -> String {
    cm.metadata.resource_version.clone().unwrap_or_default()
}

impl Recorder {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn count(&self, f: impl Fn(&Seen) -> bool) -> usize {
        self.seen().iter().filter(|s| f(s)).count()
    }

    fn resyncs(&self) -> usize {
        self.count(|s| matches!(s, Seen::Update { old_rv, new_rv, .. } if old_rv == new_rv))
    }
}

impl ResourceEventHandler<ConfigMap> for Recorder {
    fn on_add(&self, obj: &Arc<ConfigMap>, is_in_initial_list: bool) {
        self.seen.lock().unwrap().push(Seen::Add {
            name: name(obj),
            initial: is_in_initial_list,
        });
    }

    fn on_update(&self, old: &Arc<ConfigMap>, new: &Arc<ConfigMap>) {
        self.seen.lock().unwrap().push(Seen::Update {
            name: name(new),
            old_rv: rv(old),
            new_rv: rv(new),
        });
    }

    fn on_delete(&self, obj: DeletedObject<ConfigMap>) {
        self.seen.lock().unwrap().push(Seen::Delete {
            name: name(obj.object()),
            tombstone: obj.is_tombstone(),
        });
    }
}

struct Running {
    informer: SharedIndexInformer<ConfigMap>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
        assert!(self.informer.is_stopped());
    }
}

fn informer(api: &FakeApi, resync: Duration) -> SharedIndexInformer<ConfigMap> {
    SharedIndexInformer::new(
        api.clone(),
        InformerConfig::default().queue(QUEUE)
            .resync_period(resync)
            .reflector(ReflectorConfig::default().name("configmaps")),
    )
}

fn start(informer: &SharedIndexInformer<ConfigMap>) -> Running {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let informer = informer.clone();
        let shutdown = shutdown.clone();
        async move { informer.run(shutdown).await }
    });
    Running {
        informer: informer.clone(),
        shutdown,
        task,
    }
}

fn cache(informer: &SharedIndexInformer<ConfigMap>) -> BTreeMap<String, String> {
    informer
        .indexer()
        .list()
        .iter()
        .map(|o| (format!("default/{}", name(o)), rv(o)))
        .collect()
}

async fn synced(reg: &ResourceEventHandlerRegistration<ConfigMap>) {
    until("registration synced", || reg.has_synced()).await;
}

#[tokio::test]
async fn initial_list_is_delivered_as_initial_adds_then_live_events_follow() {
    let api = FakeApi::new();
    api.apply("a", "1");
    api.apply("b", "1");
    let informer = informer(&api, Duration::ZERO);
    let rec = Recorder::default();
    let reg = informer.add_event_handler(rec.clone()).unwrap();
    assert!(!informer.has_synced());
    assert!(!reg.has_synced());
    let running = start(&informer);
    synced(&reg).await;
    assert!(informer.has_synced());
    let mut initial = rec.seen();
    initial.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(
        initial,
        [
            Seen::Add {
                name: "a".into(),
                initial: true
            },
            Seen::Add {
                name: "b".into(),
                initial: true
            }
        ]
    );

    api.apply("a", "2");
    api.apply("c", "1");
    api.delete("b");
    until("live events", || rec.seen().len() == 5).await;
    assert_eq!(
        rec.seen()[2..],
        [
            Seen::Update {
                name: "a".into(),
                old_rv: "1".into(),
                new_rv: "3".into()
            },
            Seen::Add {
                name: "c".into(),
                initial: false
            },
            Seen::Delete {
                name: "b".into(),
                tombstone: false
            },
        ]
    );
    until("cache equals server", || cache(&informer) == api.objects()).await;
    assert_eq!(informer.last_sync_resource_version(), "5");
    informer.indexer().check_invariants().unwrap();
    running.stop().await;
}

#[tokio::test]
async fn registration_is_not_synced_until_its_handler_took_the_initial_list() {
    let api = FakeApi::new();
    api.apply("a", "1");
    let informer = informer(&api, Duration::ZERO);
    let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let handler = {
        let gate = gate.clone();
        informer_core::ResourceEventHandlerFuncs::new().on_add(move |_: &Arc<ConfigMap>, _| {
            let (open, cv) = &*gate;
            let mut open = open.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
        })
    };
    let reg = informer.add_event_handler(handler).unwrap();
    let running = start(&informer);
    until("informer synced", || informer.has_synced()).await;
    assert!(!reg.has_synced(), "the handler is still holding the initial add");
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    synced(&reg).await;
    running.stop().await;
}

#[tokio::test]
async fn relist_after_the_server_forgot_objects_yields_tombstone_deletes() {
    let api = FakeApi::new();
    api.apply("kept", "1");
    api.apply("lost", "1");
    let informer = informer(&api, Duration::ZERO);
    let rec = Recorder::default();
    let reg = informer.add_event_handler(rec.clone()).unwrap();
    let running = start(&informer);
    synced(&reg).await;

    // The delete of "lost" never reaches the watch, and the history that held it expires.
    api.forget("lost");
    api.break_watches(gone);
    until("tombstone delivered", || {
        rec.count(|s| matches!(s, Seen::Delete { .. })) == 1
    })
    .await;
    assert!(rec.seen().contains(&Seen::Delete {
        name: "lost".into(),
        tombstone: true
    }));
    until("cache equals server", || cache(&informer) == api.objects()).await;
    assert_eq!(
        ReflectorMetrics::get(&informer.reflector_metrics().relists_after_gone),
        1
    );
    // The relist after a watch 410 asks for the last resourceVersion the informer saw (which a
    // real server serves from its watch cache), not a consistent read from etcd.
    let lists = api.list_requests();
    assert_eq!(lists.len(), 2);
    assert_eq!(lists[0].resource_version.as_deref(), Some("0"));
    assert_eq!(lists[1].resource_version.as_deref(), Some("2"));
    assert_eq!(
        lists[1].limit, None,
        "a list at a specific resourceVersion is not paginated"
    );
    running.stop().await;
}

#[tokio::test]
async fn http_410_on_the_watch_request_relists_too() {
    let api = FakeApi::new();
    api.apply("a", "1");
    let informer = informer(&api, Duration::ZERO);
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    api.fail_next_watch(gone());
    let running = start(&informer);
    synced(&reg).await;
    until("relisted", || api.list_requests().len() == 2).await;
    api.apply("b", "1");
    until("cache equals server", || cache(&informer) == api.objects()).await;
    assert_eq!(
        ReflectorMetrics::get(&informer.reflector_metrics().relists_after_gone),
        1
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn other_watch_errors_back_off_and_resume_from_the_last_resource_version() {
    let api = FakeApi::new();
    api.apply("a", "1");
    let informer = informer(&api, Duration::ZERO);
    let errors = Arc::new(Mutex::new(Vec::new()));
    informer
        .set_watch_error_handler({
            let errors = errors.clone();
            move |e| errors.lock().unwrap().push(e.to_string())
        })
        .unwrap();
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    api.fail_next_watch(server_error());
    api.fail_next_watch(server_error());
    let running = start(&informer);
    synced(&reg).await;
    let started = tokio::time::Instant::now();
    after_virtual_time("third watch", || api.watch_requests().len() == 3).await;
    // Two failures: 800 ms + 1.6 s at least; jitter adds up to as much again (+ one 10 ms step).
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(2400) && waited <= Duration::from_millis(4810),
        "{waited:?}"
    );
    assert_eq!(api.list_requests().len(), 1, "no relist for a 500");
    assert!(api.watch_requests().iter().all(|(_, rv)| rv == "1"));
    assert_eq!(errors.lock().unwrap().len(), 2);
    running.stop().await;
}

#[tokio::test]
async fn bookmark_advances_the_resource_version_without_an_event() {
    let api = FakeApi::new();
    api.apply("a", "1");
    let informer = informer(&api, Duration::ZERO);
    let rec = Recorder::default();
    let reg = informer.add_event_handler(rec.clone()).unwrap();
    let running = start(&informer);
    synced(&reg).await;
    until("watching", || api.open_watches() == 1).await;
    api.forget("nothing"); // moves the server's RV on without any event
    let rv = api.bookmark();
    until("rv advanced", || informer.last_sync_resource_version() == rv).await;
    assert_eq!(rec.seen().len(), 1, "only the initial add");
    assert_eq!(ReflectorMetrics::get(&informer.reflector_metrics().bookmarks), 1);
    if QUEUE == informer_core::QueueKind::RealFifo {
        // The bookmark travels through the queue in order and advances the cache's RV too.
        until("the cache caught up with the bookmark", || {
            informer.last_store_sync_resource_version() == rv
        })
        .await;
    } else {
        assert_eq!(informer.last_store_sync_resource_version(), "", "not tracked on the DeltaFifo");
    }
    running.stop().await;
}

#[tokio::test]
async fn malformed_objects_are_counted_and_skipped_and_the_watch_goes_on() {
    let api = FakeApi::new();
    let informer = informer(&api, Duration::ZERO);
    let rec = Recorder::default();
    let reg = informer.add_event_handler(rec.clone()).unwrap();
    let running = start(&informer);
    synced(&reg).await;
    until("watching", || api.open_watches() == 1).await;
    api.send_malformed("default/bad");
    api.apply("good", "1");
    until("good object seen", || rec.seen().len() == 1).await;
    assert_eq!(
        ReflectorMetrics::get(&informer.reflector_metrics().malformed_objects),
        1
    );
    assert_eq!(api.watch_requests().len(), 1, "the same watch went on");
    running.stop().await;
}

#[tokio::test]
async fn handler_added_after_start_gets_the_cache_first_then_live_events() {
    let api = FakeApi::new();
    api.apply("a", "1");
    api.apply("b", "1");
    let informer = informer(&api, Duration::ZERO);
    let first = informer.add_event_handler(Recorder::default()).unwrap();
    let running = start(&informer);
    synced(&first).await;

    let late = Recorder::default();
    let reg = informer.add_event_handler(late.clone()).unwrap();
    synced(&reg).await;
    let mut replay = late.seen();
    replay.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(
        replay,
        [
            Seen::Add {
                name: "a".into(),
                initial: true
            },
            Seen::Add {
                name: "b".into(),
                initial: true
            }
        ]
    );
    api.apply("c", "1");
    until("live add", || late.seen().len() == 3).await;
    assert_eq!(
        late.seen()[2],
        Seen::Add {
            name: "c".into(),
            initial: false
        }
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handler_does_not_delay_another_handler() {
    let api = FakeApi::new();
    let informer = informer(&api, Duration::ZERO);
    let release = Arc::new(AtomicBool::new(false));
    // Released however the test ends: a failed assertion must fail the test, not leave the
    // stalled handler's thread blocked and the runtime's drop waiting for it.
    struct Release(Arc<AtomicBool>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let _release = Release(release.clone());
    let stalled_seen = Recorder::default();
    let stalled = {
        let release = release.clone();
        let seen = stalled_seen.clone();
        informer_core::ResourceEventHandlerFuncs::new().on_add(move |obj: &Arc<ConfigMap>, initial| {
            while !release.load(Ordering::SeqCst) {
                std::thread::park_timeout(Duration::from_millis(1));
            }
            seen.on_add(obj, initial);
        })
    };
    let stalled_reg = informer.add_event_handler(stalled).unwrap();
    let fast = Recorder::default();
    let fast_reg = informer.add_event_handler(fast.clone()).unwrap();
    let running = start(&informer);
    synced(&fast_reg).await;
    for i in 0..100 {
        api.apply(&format!("cm-{i}"), "1");
    }
    until("fast handler saw everything", || fast.seen().len() == 100).await;
    assert!(
        stalled_reg.pending() >= 99,
        "the stalled handler's buffer holds the rest: {}",
        stalled_reg.pending()
    );
    release.store(true, Ordering::SeqCst);
    until("stalled handler caught up", || stalled_seen.seen().len() == 100).await;
    let names: Vec<_> = stalled_seen.seen().into_iter().map(|s| format!("{s:?}")).collect();
    let expected: Vec<_> = (0..100)
        .map(|i| {
            format!(
                "{:?}",
                Seen::Add {
                    name: format!("cm-{i}"),
                    initial: false
                }
            )
        })
        .collect();
    assert_eq!(names, expected, "in order");
    running.stop().await;
}

#[tokio::test]
async fn a_panicking_handler_loses_one_notification_and_keeps_running() {
    let api = FakeApi::new();
    let informer = informer(&api, Duration::ZERO);
    let rec = Recorder::default();
    let handler = {
        let rec = rec.clone();
        informer_core::ResourceEventHandlerFuncs::new().on_add(move |obj: &Arc<ConfigMap>, initial| {
            if name(obj) == "boom" {
                panic!("handler bug");
            }
            rec.on_add(obj, initial);
        })
    };
    let reg = informer.add_event_handler(handler).unwrap();
    let running = start(&informer);
    synced(&reg).await;
    api.apply("before", "1");
    api.apply("boom", "1");
    api.apply("after", "1");
    until("after delivered", || rec.seen().len() == 2).await;
    assert_eq!(reg.handler_panics(), 1);
    assert_eq!(
        rec.seen(),
        [
            Seen::Add {
                name: "before".into(),
                initial: false
            },
            Seen::Add {
                name: "after".into(),
                initial: false
            }
        ]
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn per_handler_resync_periods_fire_on_schedule() {
    let api = FakeApi::new();
    api.apply("a", "1");
    let informer = informer(&api, Duration::from_secs(30));
    let every_10s = Recorder::default();
    let every_30s = Recorder::default();
    let never = Recorder::default();
    let reg10 = informer
        .add_event_handler_with_resync_period(every_10s.clone(), Duration::from_secs(10))
        .unwrap();
    let reg30 = informer.add_event_handler(every_30s.clone()).unwrap();
    let reg0 = informer
        .add_event_handler_with_resync_period(never.clone(), Duration::ZERO)
        .unwrap();
    // Added before start with a shorter period, the 10 s handler lowered the check period.
    assert_eq!(informer.resync_check_period(), Duration::from_secs(10));
    assert_eq!(reg30.resync_period(), Duration::from_secs(30));
    assert_eq!(reg0.resync_period(), Duration::ZERO);
    let t0 = tokio::time::Instant::now();
    let running = start(&informer);
    synced(&reg10).await;

    for (second, expect_10, expect_30) in [(10, 1, 0), (20, 2, 0), (30, 3, 1), (40, 4, 1), (60, 6, 2)] {
        tokio::time::sleep_until(t0 + Duration::from_secs(second)).await;
        until("10s handler resynced", || every_10s.resyncs() == expect_10).await;
        until("30s handler resynced", || every_30s.resyncs() == expect_30).await;
        assert_eq!(reg30.pending(), 0);
        assert_eq!(every_10s.resyncs(), expect_10, "at {second}s");
    }
    assert_eq!(never.resyncs(), 0);
    assert_eq!(reg0.pending(), 0);

    // After start, a shorter period is raised to the check period; below 1 s is raised to 1 s.
    let late = informer
        .add_event_handler_with_resync_period(Recorder::default(), Duration::from_secs(2))
        .unwrap();
    assert_eq!(late.resync_period(), Duration::from_secs(10));
    running.stop().await;
}

#[tokio::test]
async fn resync_check_period_zero_means_no_resync_and_minimum_is_one_second() {
    let api = FakeApi::new();
    let no_resync = informer(&api, Duration::ZERO);
    let reg = no_resync
        .add_event_handler_with_resync_period(Recorder::default(), Duration::from_secs(5))
        .unwrap();
    assert_eq!(no_resync.resync_check_period(), Duration::ZERO);
    assert_eq!(reg.resync_period(), Duration::ZERO);

    let informer = informer(&api, Duration::from_secs(30));
    let reg = informer
        .add_event_handler_with_resync_period(Recorder::default(), Duration::from_millis(10))
        .unwrap();
    assert_eq!(reg.resync_period(), Duration::from_secs(1));
    assert_eq!(informer.resync_check_period(), Duration::from_secs(1));
}

#[tokio::test]
async fn removed_handler_gets_nothing_more_and_stopped_informer_refuses_handlers() {
    let api = FakeApi::new();
    let informer = informer(&api, Duration::ZERO);
    let kept = Recorder::default();
    let removed = Recorder::default();
    let kept_reg = informer.add_event_handler(kept.clone()).unwrap();
    let removed_reg = informer.add_event_handler(removed.clone()).unwrap();
    let running = start(&informer);
    synced(&kept_reg).await;
    assert!(informer.remove_event_handler(&removed_reg));
    // Idempotent as client-go's RemoveEventHandler: a second removal, or a removal through
    // another informer, does nothing.
    assert!(!informer.remove_event_handler(&removed_reg));
    let other = self::informer(&FakeApi::new(), Duration::ZERO);
    assert!(!other.remove_event_handler(&kept_reg));
    api.apply("a", "1");
    until("kept handler saw it", || kept.seen().len() == 1).await;
    assert!(removed.seen().is_empty());
    assert_eq!(informer.set_transform(|cm| cm), Err(InformerError::AlreadyStarted));
    running.stop().await;
    assert!(matches!(
        informer.add_event_handler(Recorder::default()),
        Err(InformerError::Stopped)
    ));
}

#[tokio::test]
async fn transform_runs_before_objects_enter_the_cache() {
    let api = FakeApi::new();
    api.apply("a", "secret");
    let informer = informer(&api, Duration::ZERO);
    informer
        .set_transform(|mut cm: ConfigMap| {
            cm.data = None;
            cm
        })
        .unwrap();
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    let running = start(&informer);
    synced(&reg).await;
    api.apply("b", "secret");
    until("b cached", || informer.indexer().len() == 2).await;
    assert!(informer.indexer().list().iter().all(|cm| cm.data.is_none()));
    running.stop().await;
}

#[tokio::test]
async fn streaming_list_fills_the_cache_and_falls_back_when_refused() {
    for refuse in [false, true] {
        let api = FakeApi::new();
        api.apply("a", "1");
        api.apply("b", "1");
        if refuse {
            api.refuse_watch_list();
        }
        let informer = SharedIndexInformer::new(
            api.clone(),
            InformerConfig::default().queue(QUEUE).reflector(ReflectorConfig::default().use_watch_list(true)),
        );
        let rec = Recorder::default();
        let reg = informer.add_event_handler(rec.clone()).unwrap();
        let running = start(&informer);
        synced(&reg).await;
        assert_eq!(cache(&informer), api.objects());
        assert_eq!(rec.count(|s| matches!(s, Seen::Add { initial: true, .. })), 2);
        let watches = api.watch_requests();
        assert!(watches[0].0.send_initial_events);
        assert_eq!(api.list_requests().len(), usize::from(refuse), "refuse={refuse}");
        api.apply("c", "1");
        until("live event after streaming list", || rec.seen().len() == 3).await;
        running.stop().await;
    }
}

#[tokio::test]
async fn an_expired_continue_token_finishes_the_list_in_one_request() {
    let api = FakeApi::new();
    for i in 0..5 {
        api.apply(&format!("cm-{i}"), "1");
    }
    api.expire_continue_tokens();
    let informer = SharedIndexInformer::new(
        api.clone(),
        InformerConfig::default().queue(QUEUE).reflector(ReflectorConfig::default().page_size(2)),
    );
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    let running = start(&informer);
    synced(&reg).await;
    assert_eq!(cache(&informer), api.objects());
    let lists = api.list_requests();
    // Page 1; page 2's continue token is refused; then everything in one unpaginated request
    // at the original resourceVersion (client-go's pager, FullListIfExpired).
    assert_eq!(lists.len(), 3, "{lists:?}");
    assert_eq!(
        (lists[0].limit, lists[0].resource_version.as_deref()),
        (Some(2), Some("0"))
    );
    assert!(lists[1].continue_token.is_some());
    assert_eq!(
        (lists[2].limit, lists[2].resource_version.as_deref()),
        (None, Some("0"))
    );
    assert_eq!(lists[2].continue_token, None);
    assert_eq!(informer.indexer().len(), 5);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_list_410_relists_at_once_as_a_consistent_read() {
    // client-go's list(): a list answered "expired" (or "too large resource version") at a
    // resourceVersion is retried at once as a consistent read, with no backoff in between.
    let api = FakeApi::new();
    api.apply("a", "1");
    api.fail_next_list(gone());
    let informer = informer(&api, Duration::ZERO);
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    let started = tokio::time::Instant::now();
    let running = start(&informer);
    after_virtual_time("synced", || reg.has_synced()).await;
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "no backoff before the consistent read: {:?}",
        started.elapsed()
    );
    let lists = api.list_requests();
    assert_eq!(lists.len(), 2);
    assert_eq!(lists[0].resource_version.as_deref(), Some("0"));
    assert_eq!(lists[1].resource_version, None, "consistent read after the 410");
    assert_eq!(
        ReflectorMetrics::get(&informer.reflector_metrics().relists_after_gone),
        1
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn retry_after_on_a_429_or_5xx_sets_the_next_wait() {
    let api = FakeApi::new();
    api.apply("a", "1");
    api.fail_next_list(ListWatchError::api(429, "TooManyRequests", "slow down").with_retry_after(7));
    let informer = informer(&api, Duration::ZERO);
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    let started = tokio::time::Instant::now();
    let running = start(&informer);
    after_virtual_time("synced", || reg.has_synced()).await;
    // Client-go's backoff would wait 0.8-1.6 s; the server asked for 7 s.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(7) && waited < Duration::from_millis(7500),
        "waited {waited:?}"
    );
    // A 503 with Retry-After on the watch: the re-watch waits what the server asked.
    until("watching", || api.open_watches() == 1).await;
    let watches = api.watch_requests().len();
    api.fail_next_watch(ListWatchError::api(503, "ServiceUnavailable", "busy").with_retry_after(20));
    let broke = tokio::time::Instant::now();
    api.break_watches(server_error);
    after_virtual_time("re-watched", || api.watch_requests().len() >= watches + 2).await;
    // One backoff delay (at most a few seconds here), then the 20 s the server asked for.
    let waited = broke.elapsed();
    assert!(
        waited >= Duration::from_secs(20) && waited < Duration::from_secs(25),
        "waited {waited:?}"
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_watch_answered_too_large_resource_version_relists_as_a_consistent_read() {
    let api = FakeApi::new();
    api.apply("a", "1");
    let informer = informer(&api, Duration::ZERO);
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    let running = start(&informer);
    after_virtual_time("synced", || reg.has_synced()).await;
    until("watching", || api.open_watches() == 1).await;
    // After an etcd restore the server is behind our resourceVersion: client-go relists with
    // resourceVersion "" rather than retrying the watch forever.
    api.fail_next_watch(ListWatchError::api(504, "Timeout", "Too large resource version: 99, current: 2"));
    api.break_watches(server_error);
    after_virtual_time("relisted", || api.list_requests().len() == 2).await;
    assert_eq!(api.list_requests()[1].resource_version, None, "a consistent read");
    assert_eq!(
        ReflectorMetrics::get(&informer.reflector_metrics().relists_after_gone),
        1
    );
    running.stop().await;
}

#[tokio::test]
async fn a_panicking_index_function_drops_one_key_and_the_informer_goes_on() {
    let api = FakeApi::new();
    let informer = SharedIndexInformer::new(
        api.clone(),
        InformerConfig::default().queue(QUEUE).indexer("by-value", |cm: &ConfigMap| {
            let value = cm.data.as_ref().and_then(|d| d.get("v")).cloned().unwrap_or_default();
            assert_ne!(value, "poison", "index function bug");
            vec![value]
        }),
    );
    let rec = Recorder::default();
    let reg = informer.add_event_handler(rec.clone()).unwrap();
    let running = start(&informer);
    synced(&reg).await;
    api.apply("bad", "poison");
    api.apply("good", "fine");
    until("good cached", || {
        informer.indexer().get_by_key("default/good").is_some()
    })
    .await;
    assert_eq!(informer.handle_deltas_panics(), 1);
    assert!(informer.indexer().get_by_key("default/bad").is_none());
    informer.indexer().check_invariants().unwrap();
    assert_eq!(informer.indexer().by_index("by-value", "fine").unwrap().len(), 1);
    running.stop().await;
}

#[tokio::test]
async fn objects_without_a_name_are_skipped_not_fatal() {
    let api = FakeApi::new();
    api.apply("a", "1");
    api.add_nameless_to_lists();
    let informer = informer(&api, Duration::ZERO);
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    let running = start(&informer);
    synced(&reg).await;
    assert_eq!(cache(&informer), api.objects());
    assert_eq!(
        ReflectorMetrics::get(&informer.reflector_metrics().malformed_objects),
        1
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn watch_requests_carry_bookmarks_and_a_timeout_between_five_and_ten_minutes() {
    let api = FakeApi::new();
    let informer = informer(&api, Duration::ZERO);
    let reg = informer.add_event_handler(Recorder::default()).unwrap();
    let running = start(&informer);
    synced(&reg).await;
    for _ in 0..5 {
        // Each break backs off before the next watch: let virtual time pass.
        after_virtual_time("watching", || api.open_watches() == 1).await;
        api.break_watches(server_error);
    }
    for (params, _) in api.watch_requests() {
        assert!(params.bookmarks);
        let timeout = params.timeout.unwrap();
        assert!((300..600).contains(&timeout), "{timeout}");
    }
    running.stop().await;
}
