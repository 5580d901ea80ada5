//! Non-blocking handlers, over envtest, on both queues: a handler declared non-blocking is
//! called inline by the informer's own task, one that may block by a drain on the runtime's
//! blocking pool. Each handler still sees every
//! change in the informer's order, a handler added late gets the cache first and then live
//! changes, and a stalled blocking handler neither stalls the non-blocking ones nor is kept
//! from its notifications by them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use informer_core::{
    ApiListerWatcher, DeletedObject, HandlerOptions, InformerConfig, QueueKind, ResourceEventHandler,
    ResourceEventHandlerFuncs, SharedIndexInformer,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

const QUEUES: [QueueKind; 2] = [QueueKind::RealFifo, QueueKind::DeltaFifo];

/// One notification as a handler saw it, and the tokio task it was called in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    what: String,
    task: Option<tokio::task::Id>,
}

/// Records every notification; declares itself non-blocking (through the trait) when asked.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    non_blocking: bool,
}

fn name(cm: &ConfigMap) -> String {
    cm.metadata.name.clone().unwrap_or_default()
}

fn value(cm: &ConfigMap) -> String {
    cm.data.as_ref().and_then(|d| d.get("v")).cloned().unwrap_or_default()
}

impl Recorder {
    fn non_blocking() -> Self {
        Recorder {
            non_blocking: true,
            ..Recorder::default()
        }
    }

    fn push(&self, what: String) {
        let task = tokio::task::try_id();
        self.seen.lock().unwrap().push(Seen { what, task });
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn whats(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.what).collect()
    }

    /// Whether every call with a change made after the informer started was made in the task
    /// `id` (the informer's own; a replay of the cache to a handler registered after the start
    /// is delivered by a task of its own).
    fn all_in(&self, id: tokio::task::Id) -> bool {
        let live: Vec<Seen> = self
            .seen()
            .into_iter()
            .filter(|s| !s.what.ends_with("initial=true"))
            .collect();
        !live.is_empty() && live.iter().all(|s| s.task == Some(id))
    }

    /// Whether no call was made in the task `id`.
    fn none_in(&self, id: tokio::task::Id) -> bool {
        self.seen().iter().all(|s| s.task != Some(id))
    }
}

impl ResourceEventHandler<ConfigMap> for Recorder {
    fn on_add(&self, obj: &Arc<ConfigMap>, is_in_initial_list: bool) {
        self.push(format!("add {} {} initial={is_in_initial_list}", name(obj), value(obj)));
    }

    fn on_update(&self, old: &Arc<ConfigMap>, new: &Arc<ConfigMap>) {
        self.push(format!("update {} {}->{}", name(new), value(old), value(new)));
    }

    fn on_delete(&self, obj: DeletedObject<ConfigMap>) {
        self.push(format!("delete {} {}", name(obj.object()), value(obj.object())));
    }

    fn is_non_blocking(&self) -> bool {
        self.non_blocking
    }
}

fn configmap(name: &str, value: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some([("v".to_string(), value.to_string())].into());
    cm
}

async fn set(api: &Api<ConfigMap>, name: &str, value: &str) {
    let patch = serde_json::json!({ "data": { "v": value } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Polls `done` every few milliseconds until it holds; fails the test after 20 s.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

struct Running {
    informer: SharedIndexInformer<ConfigMap>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(client: &kube::Client, namespace: &str, queue: QueueKind) -> Self {
        let informer = SharedIndexInformer::<ConfigMap>::new(
            ApiListerWatcher::new(Api::namespaced(client.clone(), namespace)),
            InformerConfig::default().queue(queue),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (informer, shutdown) = (informer.clone(), shutdown.clone());
            async move { informer.run(shutdown).await }
        });
        Running {
            informer,
            shutdown,
            task,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the informer stopped")
            .unwrap();
    }
}

async fn namespace(client: &kube::Client, name: &str) {
    let ns = k8s_openapi::api::core::v1::Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_blocking_handlers_are_called_inline_in_order_and_a_late_one_gets_the_cache_first() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    for queue in QUEUES {
        let ns = format!("order-{queue:?}").to_lowercase();
        namespace(&client, &ns).await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        for i in 0..5 {
            api.create(&PostParams::default(), &configmap(&format!("listed-{i}"), "0"))
                .await
                .unwrap();
        }
        let running = Running::start(&client, &ns, queue);
        // Declared by the trait, by the registration option, and a handler that may block.
        let (by_trait, by_option, blocking) = (Recorder::non_blocking(), Recorder::default(), Recorder::default());
        let registrations = [
            running.informer.add_event_handler(by_trait.clone()).unwrap(),
            running
                .informer
                .add_event_handler_with_options(by_option.clone(), HandlerOptions::default().non_blocking())
                .unwrap(),
            running.informer.add_event_handler(blocking.clone()).unwrap(),
        ];
        until("the handlers synced", || registrations.iter().all(|r| r.has_synced())).await;
        for i in 0..10 {
            api.create(&PostParams::default(), &configmap(&format!("cm-{i}"), "0"))
                .await
                .unwrap();
        }
        for round in 1..=3 {
            for i in 0..10 {
                set(&api, &format!("cm-{i}"), &round.to_string()).await;
            }
        }
        // 5 listed + 10 adds + 30 updates.
        until("the first changes reached the handlers", || blocking.seen().len() == 45).await;
        // Added late, while changes keep coming: the cache as it stands, then live changes.
        let late = Recorder::non_blocking();
        let late_registration = running.informer.add_event_handler(late.clone()).unwrap();
        for i in 0..10 {
            set(&api, &format!("cm-{i}"), "4").await;
        }
        for i in 0..3 {
            api.delete(&format!("cm-{i}"), &DeleteParams::default()).await.unwrap();
        }
        // 5 listed + 10 adds + 40 updates + 3 deletes.
        let total = 58;
        until("every handler saw every change", || {
            [&by_trait, &by_option, &blocking]
                .iter()
                .all(|r| r.seen().len() == total)
        })
        .await;
        let expected = blocking.whats();
        assert_eq!(by_trait.whats(), expected, "{queue:?}: same changes, same order");
        assert_eq!(by_option.whats(), expected, "{queue:?}: same changes, same order");
        // Per object, every change in order: its values only grow, and a delete ends it.
        for i in 0..10 {
            let of: Vec<&String> = expected
                .iter()
                .filter(|w| w.split(' ').nth(1) == Some(&format!("cm-{i}")))
                .collect();
            let mut want = vec![format!("add cm-{i} 0 initial=false")];
            want.extend((1..=4).map(|v| format!("update cm-{i} {}->{v}", v - 1)));
            if i < 3 {
                want.push(format!("delete cm-{i} 4"));
            }
            assert_eq!(of, want.iter().collect::<Vec<_>>(), "{queue:?}: cm-{i}");
        }
        // Inline: in the informer's own task; the blocking one in drains of its own.
        let informer_task = running.task.id();
        assert!(
            by_trait.all_in(informer_task) && by_option.all_in(informer_task),
            "{queue:?}"
        );
        assert!(blocking.none_in(informer_task), "{queue:?}");

        // The late handler: its replay first (each object once, as an initial add), then the
        // live changes in the informer's order, each once.
        until("the late handler synced", || late_registration.has_synced()).await;
        until("the late handler saw the deletes", || {
            late.whats().iter().filter(|w| w.starts_with("delete")).count() == 3
        })
        .await;
        let seen = late.whats();
        let replayed = seen.iter().take_while(|w| w.ends_with("initial=true")).count();
        assert_eq!(replayed, 15, "{queue:?}: the whole cache replayed first: {seen:?}");
        let live = &seen[replayed..];
        assert!(live.iter().all(|w| !w.starts_with("add")), "{queue:?}: {live:?}");
        assert_eq!(
            live,
            &expected[expected.len() - live.len()..],
            "{queue:?}: live changes in order"
        );
        // What the replay showed of an object and its live updates join up.
        for i in 0..10 {
            let of: Vec<&String> = seen
                .iter()
                .filter(|w| w.split(' ').nth(1) == Some(&format!("cm-{i}")))
                .collect();
            let replayed_value: u32 = of[0].split(' ').nth(2).unwrap().parse().unwrap();
            let updates = of.iter().filter(|w| w.starts_with("update")).count() as u32;
            assert_eq!(replayed_value + updates, 4, "{queue:?}: cm-{i}: {of:?}");
        }
        running.stop().await;
    }
    env.shutdown().await;
}

/// Sets the flag however the test ends, so a stalled handler's thread is let go.
struct Release(Arc<AtomicBool>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_blocking_handler_neither_stalls_nor_is_stalled_by_non_blocking_ones() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    for queue in QUEUES {
        let ns = format!("stall-{queue:?}").to_lowercase();
        namespace(&client, &ns).await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let running = Running::start(&client, &ns, queue);
        let release = Arc::new(AtomicBool::new(false));
        let _release = Release(release.clone());
        let stalled = Recorder::default();
        let stalled_handler = {
            let (release, stalled) = (release.clone(), stalled.clone());
            ResourceEventHandlerFuncs::new().on_add(move |obj: &Arc<ConfigMap>, initial| {
                while !release.load(Ordering::SeqCst) {
                    std::thread::park_timeout(Duration::from_millis(1));
                }
                stalled.on_add(obj, initial);
            })
        };
        running.informer.add_event_handler(stalled_handler).unwrap();
        // A blocking handler that keeps up, and a non-blocking one that checks, on every add,
        // that the blocking one was handed that add before it was called: the blocking
        // handlers get each batch first, so the inline calls never hold them back.
        let blocking = Recorder::default();
        running.informer.add_event_handler(blocking.clone()).unwrap();
        let inline = Recorder::non_blocking();
        let handed_first = Arc::new(Mutex::new(Vec::<bool>::new()));
        let checker = {
            let (blocking, inline, handed_first) = (blocking.clone(), inline.clone(), handed_first.clone());
            ResourceEventHandlerFuncs::new()
                .on_add(move |obj: &Arc<ConfigMap>, initial| {
                    // Bounded: a non-blocking handler must not block; this one waits at most
                    // 5 s, only to observe the order.
                    let want = format!("add {} {} initial={initial}", name(obj), value(obj));
                    let deadline = std::time::Instant::now() + Duration::from_secs(5);
                    while !blocking.whats().contains(&want) && std::time::Instant::now() < deadline {
                        std::thread::park_timeout(Duration::from_millis(1));
                    }
                    handed_first.lock().unwrap().push(blocking.whats().contains(&want));
                    inline.on_add(obj, initial);
                })
                .non_blocking()
        };
        running.informer.add_event_handler(checker).unwrap();
        for i in 0..20 {
            api.create(&PostParams::default(), &configmap(&format!("cm-{i}"), "0"))
                .await
                .unwrap();
        }
        until("the inline handler saw every add while one handler is stalled", || {
            inline.seen().len() == 20
        })
        .await;
        until("the blocking handler saw every add", || blocking.seen().len() == 20).await;
        assert!(
            stalled.seen().is_empty(),
            "{queue:?}: the stalled handler is still stalled"
        );
        assert!(
            handed_first.lock().unwrap().iter().all(|&first| first),
            "{queue:?}: every add reached the blocking handler before the inline one"
        );
        assert!(inline.all_in(running.task.id()), "{queue:?}");
        // Released, it gets every add, in order.
        release.store(true, Ordering::SeqCst);
        until("the released handler caught up", || stalled.seen().len() == 20).await;
        assert_eq!(stalled.whats(), blocking.whats(), "{queue:?}");
        running.stop().await;
    }
    env.shutdown().await;
}
