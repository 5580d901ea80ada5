//! EventRecorder over envtest (real HTTP): what it writes, how repeats aggregate, the queue's
//! drop policy, retries, series refresh/finish, shutdown, and the core/v1 fallback.
//!
//! Waits are `flush` (deterministic: the sink answers after writing) or polls with a deadline;
//! no test sleeps for a fixed time.

use std::future::Future;
use std::time::Duration;

use controller::event_recorder::{EventRecorder, EventRecorderConfig, EventType, Reporter};
use envtest::{Config, RecordedRequest, Server};
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use kube::Resource;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(10);
const EVENTS_V1: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const CORE_V1: &str = "/api/v1/namespaces/default/events";
const CONTROLLER: &str = "kinformer.dev/test-controller";
const INSTANCE: &str = "test-host-0";

async fn start_env() -> Server {
    envtest::logs::init_from_env(tracing::Level::WARN);
    Server::start(Config::default()).await.expect("envtest starts")
}

fn recorder(env: &Server, config: EventRecorderConfig) -> EventRecorder {
    EventRecorder::with_config(env.client(), Reporter::new(CONTROLLER, INSTANCE), config)
}

/// The sink task, as the Manager would spawn it.
struct Sink {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

fn spawn_sink(recorder: &EventRecorder) -> Sink {
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (recorder, stop) = (recorder.clone(), stop.clone());
        async move { recorder.run(stop).await }
    });
    Sink { stop, task }
}

impl Sink {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(T, self.task)
            .await
            .expect("sink returns after shutdown")
            .expect("sink task does not panic");
    }
}

async fn flush(recorder: &EventRecorder) {
    tokio::time::timeout(T, recorder.flush())
        .await
        .expect("flush completes");
}

/// Polls `cond` every 10 ms; panics after `T`.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + T;
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Creates a ConfigMap in `default` and returns the server's copy (with its uid).
async fn configmap(env: &Server, name: &str) -> ConfigMap {
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &cm).await.expect("create configmap")
}

/// Writes (POST/PATCH/PUT) the server received under `prefix`, oldest first.
fn writes(env: &Server, prefix: &str) -> Vec<RecordedRequest> {
    env.requests()
        .into_iter()
        .filter(|r| matches!(r.method.as_str(), "POST" | "PATCH" | "PUT") && r.path.starts_with(prefix))
        .collect()
}

async fn events_v1(env: &Server) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(env.client(), "default");
    api.list(&ListParams::default())
        .await
        .expect("list events.k8s.io")
        .items
}

async fn core_events(env: &Server) -> Vec<CoreEvent> {
    let api: Api<CoreEvent> = Api::namespaced(env.client(), "default");
    api.list(&ListParams::default())
        .await
        .expect("list core/v1 events")
        .items
}

fn series_count(ev: &Event) -> Option<i32> {
    ev.series.as_ref().map(|s| s.count)
}

#[tokio::test]
async fn one_event_creates_one_events_v1_event() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);

    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "Foo synced");
    flush(&recorder).await;

    let events = events_v1(&env).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let ev = &events[0];
    assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
    // <regarding name>.<hex unix nanos>, the nanos those of the event time.
    let name = ev.metadata.name.as_deref().expect("name");
    let hex = name.strip_prefix("foo.").expect("name starts with the regarding name");
    let nanos = i128::from(i64::from_str_radix(hex, 16).expect("hex nanos"));
    let event_time = ev.event_time.as_ref().expect("eventTime").0;
    assert!(
        (nanos - event_time.as_nanosecond()).abs() < 1_000_000,
        "{name} vs {event_time}"
    );

    let regarding = ev.regarding.as_ref().expect("regarding");
    assert_eq!(regarding.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(regarding.api_version.as_deref(), Some("v1"));
    assert_eq!(regarding.name.as_deref(), Some("foo"));
    assert_eq!(regarding.namespace.as_deref(), Some("default"));
    assert_eq!(regarding.uid, cm.metadata.uid);
    assert!(regarding.uid.is_some());
    assert_eq!(ev.related, None);
    assert_eq!(ev.reason.as_deref(), Some("Synced"));
    assert_eq!(ev.action.as_deref(), Some("Reconcile"));
    assert_eq!(ev.note.as_deref(), Some("Foo synced"));
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    assert_eq!(ev.reporting_controller.as_deref(), Some(CONTROLLER));
    assert_eq!(ev.reporting_instance.as_deref(), Some(INSTANCE));
    assert_eq!(ev.series, None);
    // Nothing of the core/v1 shape leaks into an events.k8s.io/v1 Event.
    assert_eq!(ev.deprecated_count, None);
    assert_eq!(ev.deprecated_source, None);

    let w = writes(&env, "/apis/events.k8s.io/");
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!((w[0].method.as_str(), w[0].path.as_str()), ("POST", EVENTS_V1));
    assert!(writes(&env, CORE_V1).is_empty());
    let stats = recorder.stats();
    assert_eq!((stats.written, stats.dropped, stats.failed, stats.cached), (1, 0, 0, 1));

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_thousand_identical_events_make_one_series_and_a_handful_of_writes() {
    let env = start_env().await;
    let cm = configmap(&env, "hot").await;
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);

    for _ in 0..1000 {
        recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "Hot loop");
    }
    flush(&recorder).await;

    let events = events_v1(&env).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let ev = &events[0];
    assert_eq!(series_count(ev), Some(1000));
    let series = ev.series.as_ref().expect("series");
    assert!(series.last_observed_time.0 >= ev.event_time.as_ref().expect("eventTime").0);

    // A create, the patch that starts the series (count 2), the flush's patch (count 1000);
    // a refresh tick could add one.
    let w = writes(&env, "/apis/events.k8s.io/");
    assert!((3..=4).contains(&w.len()), "{w:?}");
    assert_eq!(w[0].method, "POST");
    assert!(w[1..].iter().all(|r| r.method == "PATCH"), "{w:?}");
    let stats = recorder.stats();
    assert_eq!(stats.written, w.len() as u64);
    assert_eq!((stats.dropped, stats.failed), (0, 0));

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn different_notes_types_and_related_objects_are_distinct_events() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let other = configmap(&env, "bar").await;
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);

    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "note a");
    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "note b");
    recorder.publish(&cm, EventType::Warning, "Synced", "Reconcile", "note a");
    recorder.publish_with_related(
        &cm.object_ref(&()),
        &other.object_ref(&()),
        EventType::Normal,
        "Synced",
        "Reconcile",
        "note a",
    );
    flush(&recorder).await;

    let events = events_v1(&env).await;
    assert_eq!(events.len(), 4, "{events:?}");
    assert!(events.iter().all(|e| e.series.is_none()), "{events:?}");
    let warnings: Vec<_> = events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .collect();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].note.as_deref(), Some("note a"));
    let related: Vec<_> = events.iter().filter_map(|e| e.related.as_ref()).collect();
    assert_eq!(related.len(), 1);
    assert_eq!(related[0].name.as_deref(), Some("bar"));
    let mut names: Vec<_> = events.iter().filter_map(|e| e.metadata.name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 4, "event names are unique");
    assert_eq!(writes(&env, EVENTS_V1).len(), 4);

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn events_about_cluster_scoped_objects_go_to_default() {
    let env = start_env().await;
    let namespaces: Api<Namespace> = Api::all(env.client());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("team-a".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let ns = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);

    recorder.publish(&ns, EventType::Warning, "QuotaLow", "Check", "quota nearly used up");
    flush(&recorder).await;

    let events = events_v1(&env).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let ev = &events[0];
    assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
    assert!(ev.metadata.name.as_deref().is_some_and(|n| n.starts_with("team-a.")));
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let regarding = ev.regarding.as_ref().expect("regarding");
    assert_eq!(regarding.kind.as_deref(), Some("Namespace"));
    assert_eq!(regarding.name.as_deref(), Some("team-a"));
    assert_eq!(regarding.namespace, None);

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_full_queue_drops_and_counts() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let recorder = recorder(&env, EventRecorderConfig::default().queue_capacity(10));

    // No sink yet: the queue fills at 10 and the rest are dropped, without blocking.
    for i in 0..15 {
        recorder.publish(&cm, EventType::Normal, "Step", "Reconcile", &format!("step {i}"));
    }
    let stats = recorder.stats();
    assert_eq!((stats.dropped, stats.written), (5, 0));

    let sink = spawn_sink(&recorder);
    flush(&recorder).await;
    let events = events_v1(&env).await;
    assert_eq!(events.len(), 10, "{events:?}");
    let mut notes: Vec<_> = events.iter().filter_map(|e| e.note.clone()).collect();
    notes.sort();
    let expected: Vec<_> = (0..10).map(|i| format!("step {i}")).collect();
    assert_eq!(notes, expected, "the first ten were kept, in order of publishing");
    // Once there is room again, publishing works.
    recorder.publish(&cm, EventType::Normal, "Step", "Reconcile", "after");
    flush(&recorder).await;
    let stats = recorder.stats();
    assert_eq!((stats.dropped, stats.written, stats.failed), (5, 11, 0));

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn falls_back_to_core_v1_when_events_api_is_not_served() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);
    // The first create in events.k8s.io is answered 404, as by a server without that group.
    env.faults().fail_next("/apis/events.k8s.io", 404, 1, 0);

    for _ in 0..3 {
        recorder.publish(&cm, EventType::Warning, "Failed", "Reconcile", "could not sync");
    }
    flush(&recorder).await;

    // envtest keeps both Event APIs in one store (as kube-apiserver), so the event is listed
    // through events.k8s.io too: what shows the fallback is that only the refused create was
    // sent there.
    assert_eq!(
        writes(&env, EVENTS_V1).len(),
        1,
        "only the refused create went to events.k8s.io"
    );
    let events = core_events(&env).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let ev = &events[0];
    assert!(ev.metadata.name.as_deref().is_some_and(|n| n.starts_with("foo.")));
    assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(ev.involved_object.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(ev.involved_object.name.as_deref(), Some("foo"));
    assert_eq!(ev.involved_object.namespace.as_deref(), Some("default"));
    assert_eq!(ev.involved_object.uid, cm.metadata.uid);
    assert_eq!(ev.reason.as_deref(), Some("Failed"));
    assert_eq!(ev.message.as_deref(), Some("could not sync"));
    assert_eq!(ev.action.as_deref(), Some("Reconcile"));
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.count, Some(3));
    let source = ev.source.as_ref().expect("source");
    assert_eq!(source.component.as_deref(), Some(CONTROLLER));
    assert_eq!(source.host.as_deref(), Some(INSTANCE));
    assert_eq!(ev.reporting_component.as_deref(), Some(CONTROLLER));
    assert_eq!(ev.reporting_instance.as_deref(), Some(INSTANCE));
    let first = ev.first_timestamp.as_ref().expect("firstTimestamp").0;
    let last = ev.last_timestamp.as_ref().expect("lastTimestamp").0;
    assert!(first <= last, "{first} <= {last}");
    assert_eq!(ev.event_time, None, "legacy core/v1 events leave eventTime unset");
    assert_eq!(ev.series, None);

    // One refused create in events.k8s.io; then create, count 2, count 3 in core/v1.
    assert_eq!(writes(&env, "/apis/events.k8s.io/").len(), 1);
    let core = writes(&env, CORE_V1);
    let methods: Vec<_> = core.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods, ["POST", "PATCH", "PATCH"]);

    // For the rest of the recorder's life, core/v1 it is.
    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "synced");
    flush(&recorder).await;
    assert_eq!(writes(&env, "/apis/events.k8s.io/").len(), 1);
    assert_eq!(core_events(&env).await.len(), 2);
    assert_eq!(recorder.stats().failed, 0);

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_missing_namespace_is_not_mistaken_for_an_unserved_api() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);

    let ghost = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: Some("nowhere".into()),
        name: Some("ghost".into()),
        ..ObjectReference::default()
    };
    recorder.publish_for(&ghost, EventType::Normal, "Synced", "Reconcile", "lost");
    flush(&recorder).await;
    let stats = recorder.stats();
    assert_eq!((stats.failed, stats.written), (1, 0));

    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "kept");
    flush(&recorder).await;
    assert_eq!(events_v1(&env).await.len(), 1);
    assert!(writes(&env, "/api/v1/").iter().all(|r| !r.path.ends_with("/events")));

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn the_periodic_refresh_writes_series_counts() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let config = EventRecorderConfig::default().refresh_period(Duration::from_millis(100));
    let recorder = recorder(&env, config);
    let sink = spawn_sink(&recorder);

    for _ in 0..5 {
        recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "again");
    }
    // No flush: the create and the first patch (count 2) are immediate, count 5 is the refresh's.
    let client = env.client();
    eventually("the refresh writes count 5", || {
        let api: Api<Event> = Api::namespaced(client.clone(), "default");
        async move {
            let items = api
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            items.len() == 1 && series_count(&items[0]) == Some(5)
        }
    })
    .await;
    // The refresh left the series clean: a flush finds nothing to write.
    let before = writes(&env, EVENTS_V1).len();
    flush(&recorder).await;
    assert_eq!(writes(&env, EVENTS_V1).len(), before, "nothing dirty, nothing written");

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn idle_series_finish_with_their_final_count_and_leave_the_cache() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let config = EventRecorderConfig::default().finish_time(Duration::from_millis(300));
    let recorder = recorder(&env, config);
    let sink = spawn_sink(&recorder);

    for _ in 0..3 {
        recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "again");
    }
    // Count 3 can only be written when the series finishes (the refresh period is 30 s and
    // nothing flushes): a create, the patch that starts the series, then the final count.
    eventually("the finished series' final count is written", || {
        let written = recorder.stats().written;
        async move { written == 3 }
    })
    .await;
    eventually("the finished series leaves the cache", || {
        let cached = recorder.stats().cached;
        async move { cached == 0 }
    })
    .await;
    let events = events_v1(&env).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(series_count(&events[0]), Some(3));

    // The same event again is a new Event, not a patch of the finished one.
    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "again");
    flush(&recorder).await;
    let events = events_v1(&env).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events.iter().filter(|e| e.series.is_none()).count(), 1);

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn shutdown_takes_queued_events_and_writes_pending_counts() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);

    for _ in 0..10 {
        recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "before shutdown");
    }
    // No flush: shutdown alone must get count 10 to the server.
    sink.stop().await;

    let events = events_v1(&env).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(series_count(&events[0]), Some(10));
    env.shutdown().await;
}

#[tokio::test]
async fn a_restarted_sink_continues_its_series_and_only_one_runs() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);

    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "again");
    flush(&recorder).await;
    // A second concurrent run returns at once instead of competing for the queue.
    tokio::time::timeout(T, recorder.run(CancellationToken::new()))
        .await
        .expect("a second run returns at once");
    sink.stop().await;

    let sink = spawn_sink(&recorder);
    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "again");
    flush(&recorder).await;
    let events = events_v1(&env).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(series_count(&events[0]), Some(2));
    let methods: Vec<_> = writes(&env, EVENTS_V1).into_iter().map(|r| r.method).collect();
    assert_eq!(methods, ["POST", "PATCH"]);

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn server_errors_are_retried() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let config = EventRecorderConfig::default().retry_delay(Duration::from_millis(50));
    let recorder = recorder(&env, config);
    let sink = spawn_sink(&recorder);
    env.faults().fail_next(EVENTS_V1, 500, 2, 0);

    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "eventually");
    // Polled through the counters: a list would hit the injected faults too.
    eventually("the third attempt creates the event", || {
        let written = recorder.stats().written;
        async move { written == 1 }
    })
    .await;
    assert_eq!(events_v1(&env).await.len(), 1);
    assert_eq!(writes(&env, EVENTS_V1).len(), 3);
    let stats = recorder.stats();
    assert_eq!((stats.written, stats.failed), (1, 0));

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn writes_are_given_up_after_max_tries() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let config = EventRecorderConfig::default()
        .retry_delay(Duration::from_millis(20))
        .max_tries(3);
    let recorder = recorder(&env, config);
    let sink = spawn_sink(&recorder);
    env.faults().fail_next(EVENTS_V1, 500, 1000, 0);

    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "doomed");
    eventually("the write is given up", || {
        let failed = recorder.stats().failed;
        async move { failed == 1 }
    })
    .await;
    assert_eq!(writes(&env, EVENTS_V1).len(), 3, "max_tries attempts");
    env.faults().clear();

    // Given up means given up: a flush does not try again; a new event is written.
    flush(&recorder).await;
    assert_eq!(writes(&env, EVENTS_V1).len(), 3);
    recorder.publish(&cm, EventType::Normal, "Synced", "Reconcile", "fine");
    flush(&recorder).await;
    assert_eq!(events_v1(&env).await.len(), 1);
    let stats = recorder.stats();
    assert_eq!((stats.written, stats.failed), (1, 1));

    sink.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn long_fields_are_cut_to_the_api_limits() {
    let env = start_env().await;
    let cm = configmap(&env, "foo").await;
    let recorder = recorder(&env, EventRecorderConfig::default());
    let sink = spawn_sink(&recorder);

    let note = "é".repeat(1500); // 3000 bytes
    let reason = "R".repeat(200);
    recorder.publish(&cm, EventType::Normal, &reason, "Reconcile", &note);
    flush(&recorder).await;

    let events = events_v1(&env).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let written_note = events[0].note.as_deref().expect("note");
    assert!(written_note.len() <= 1024, "{}", written_note.len());
    assert!(written_note.len() > 1000);
    assert!(written_note.ends_with(" ..."));
    assert!(written_note.starts_with("éé"));
    assert_eq!(events[0].reason.as_deref().map(str::len), Some(128));

    sink.stop().await;
    env.shutdown().await;
}
