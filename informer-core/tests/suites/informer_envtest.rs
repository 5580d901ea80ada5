// Included twice by `tests/informer_envtest.rs`, once per queue kind (`QUEUE`).
use crate::common::eventually;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use informer_core::{
    ApiListerWatcher, InformerConfig, ReflectorConfig, ReflectorMetrics, ResourceEventHandlerFuncs, SharedIndexInformer,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use tokio_util::sync::CancellationToken;

fn configmap(name: &str, value: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(BTreeMap::from([("v".to_string(), value.to_string())]));
    cm
}

/// namespace/name → resourceVersion, as the server has it.
fn server_state(env: &envtest::Server, path: &str) -> BTreeMap<String, String> {
    env.objects_of(path)
        .unwrap()
        .iter()
        .map(|o| {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let rv = o["metadata"]["resourceVersion"].as_str().unwrap_or_default();
            (format!("{ns}/{name}"), rv.to_string())
        })
        .collect()
}

fn cache_state<K: Resource + Send + Sync + 'static>(informer: &SharedIndexInformer<K>) -> BTreeMap<String, String> {
    informer
        .indexer()
        .list()
        .iter()
        .map(|o| {
            let meta = o.meta();
            let key = format!(
                "{}/{}",
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default()
            );
            (key, meta.resource_version.clone().unwrap_or_default())
        })
        .collect()
}

struct Running<K> {
    informer: SharedIndexInformer<K>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl<K: Resource + Send + Sync + 'static> Running<K> {
    fn start(informer: SharedIndexInformer<K>) -> Self {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let informer = informer.clone();
            let shutdown = shutdown.clone();
            async move { informer.run(shutdown).await }
        });
        Running {
            informer,
            shutdown,
            task,
        }
    }

    async fn synced(&self) {
        assert!(
            tokio::time::timeout(
                Duration::from_secs(20),
                self.informer.wait_for_cache_sync(&self.shutdown)
            )
            .await
            .unwrap_or(false),
            "cache did not sync"
        );
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
        assert!(self.informer.is_stopped());
    }
}

fn configmap_informer(client: kube::Client, reflector: ReflectorConfig) -> SharedIndexInformer<ConfigMap> {
    SharedIndexInformer::new(
        ApiListerWatcher::new(Api::<ConfigMap>::namespaced(client, "default")),
        InformerConfig::default().queue(QUEUE).reflector(reflector),
    )
}

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn paginated_initial_list_then_watch_keeps_the_cache_equal_to_the_server() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for i in 0..1203 {
        api.create(&PostParams::default(), &configmap(&format!("cm-{i:04}"), "1"))
            .await
            .unwrap();
    }
    let informer = configmap_informer(env.client(), ReflectorConfig::default().page_size(500));
    let events = Arc::new(Mutex::new(Vec::new()));
    let reg = informer
        .add_event_handler({
            let (a, u, d) = (events.clone(), events.clone(), events.clone());
            ResourceEventHandlerFuncs::new()
                .on_add(move |cm: &Arc<ConfigMap>, initial| {
                    a.lock().unwrap().push(("add", cm.metadata.name.clone(), initial))
                })
                .on_update(move |_, cm| u.lock().unwrap().push(("update", cm.metadata.name.clone(), false)))
                .on_delete(move |cm| {
                    d.lock()
                        .unwrap()
                        .push(("delete", cm.object().metadata.name.clone(), cm.is_tombstone()))
                })
        })
        .unwrap();
    env.faults().clear_requests();
    let running = Running::start(informer.clone());
    running.synced().await;
    assert_eq!(cache_state(&informer), server_state(&env, CONFIGMAPS));
    let lists: Vec<_> = env
        .requests()
        .into_iter()
        .filter(|r| !r.is_watch && r.path == CONFIGMAPS)
        .collect();
    assert_eq!(lists.len(), 3, "1203 objects in pages of 500: {lists:?}");
    assert!(lists.iter().all(|r| r.param("limit").as_deref() == Some("500")));
    eventually("handler got the initial list", || reg.has_synced()).await;
    assert_eq!(
        events.lock().unwrap().iter().filter(|e| e.0 == "add" && e.2).count(),
        1203
    );

    let mut changed = configmap("cm-0000", "2");
    changed.metadata.resource_version = None;
    api.replace("cm-0000", &PostParams::default(), &{
        let mut cm = api.get("cm-0000").await.unwrap();
        cm.data = changed.data;
        cm
    })
    .await
    .unwrap();
    api.delete("cm-0001", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &configmap("new", "1"))
        .await
        .unwrap();
    eventually("cache follows the watch", || {
        cache_state(&informer) == server_state(&env, CONFIGMAPS)
    })
    .await;
    eventually("handler saw the three live events", || {
        events.lock().unwrap().len() == 1206
    })
    .await;
    let live: Vec<_> = events.lock().unwrap()[1203..].to_vec();
    assert_eq!(
        live,
        [
            ("update", Some("cm-0000".into()), false),
            ("delete", Some("cm-0001".into()), false),
            ("add", Some("new".into()), false)
        ]
    );
    assert_eq!(
        informer.last_sync_resource_version(),
        env.current_resource_version().to_string()
    );
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn in_stream_410_after_compaction_relists_and_converges_with_tombstones() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for name in ["a", "b", "c"] {
        api.create(&PostParams::default(), &configmap(name, "1")).await.unwrap();
    }
    let informer = configmap_informer(env.client(), ReflectorConfig::default());
    let deletes = Arc::new(Mutex::new(Vec::new()));
    informer
        .add_event_handler({
            let deletes = deletes.clone();
            ResourceEventHandlerFuncs::new().on_delete(move |cm: informer_core::DeletedObject<ConfigMap>| {
                deletes
                    .lock()
                    .unwrap()
                    .push((cm.object().metadata.name.clone(), cm.is_tombstone()))
            })
        })
        .unwrap();
    let running = Running::start(informer.clone());
    running.synced().await;
    eventually("watching", || env.watcher_count() == 1).await;

    // Restart the server's watch cache (dropping every watch), change things while no watch
    // is open, then compact: the informer's resourceVersion is now older than the window.
    env.faults().restart();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &configmap("d", "1")).await.unwrap();
    env.faults().compact();
    eventually("cache equals the server", || {
        cache_state(&informer) == server_state(&env, CONFIGMAPS)
    })
    .await;
    eventually("delete of b delivered", || !deletes.lock().unwrap().is_empty()).await;
    let gone_b: Vec<_> = deletes.lock().unwrap().clone();
    assert_eq!(gone_b.len(), 1);
    assert_eq!(gone_b[0].0.as_deref(), Some("b"));
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn http_410_on_the_watch_request_relists_and_converges() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &configmap("a", "1")).await.unwrap();
    let informer = configmap_informer(env.client(), ReflectorConfig::default());
    let running = Running::start(informer.clone());
    running.synced().await;
    eventually("watching", || env.watcher_count() == 1).await;
    env.faults().expire_next_watches(1);
    env.faults().close_watches();
    api.create(&PostParams::default(), &configmap("b", "1")).await.unwrap();
    eventually("relisted after the 410", || {
        ReflectorMetrics::get(&informer.reflector_metrics().relists_after_gone) == 1
    })
    .await;
    eventually("cache equals the server", || {
        cache_state(&informer) == server_state(&env, CONFIGMAPS)
    })
    .await;
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn server_errors_back_off_and_the_watch_resumes_from_the_same_resource_version() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &configmap("a", "1")).await.unwrap();
    let informer = configmap_informer(env.client(), ReflectorConfig::default());
    let running = Running::start(informer.clone());
    running.synced().await;
    eventually("watching", || env.watcher_count() == 1).await;
    let metrics = informer.reflector_metrics();
    env.faults().fail_next(CONFIGMAPS, 500, 1, 0);
    env.faults().close_watches();
    eventually("the re-watch failed with the 500", || {
        ReflectorMetrics::get(&metrics.errors) == 1
    })
    .await;
    api.create(&PostParams::default(), &configmap("b", "1")).await.unwrap();
    eventually("cache equals the server", || {
        cache_state(&informer) == server_state(&env, CONFIGMAPS)
    })
    .await;
    assert_eq!(
        ReflectorMetrics::get(&metrics.lists),
        1,
        "a 500 does not force a relist"
    );
    let watches: Vec<_> = env.requests().into_iter().filter(|r| r.is_watch).collect();
    assert_eq!(watches.len(), 3, "watch, failed re-watch, re-watch after backoff");
    let first_rv = watches[0].param("resourceVersion");
    assert!(first_rv.is_some());
    assert!(
        watches.iter().all(|w| w.param("resourceVersion") == first_rv),
        "{watches:?}"
    );
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn streaming_initial_list_over_http() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for i in 0..20 {
        api.create(&PostParams::default(), &configmap(&format!("cm-{i}"), "1"))
            .await
            .unwrap();
    }
    let informer = configmap_informer(env.client(), ReflectorConfig::default().use_watch_list(true));
    let running = Running::start(informer.clone());
    running.synced().await;
    assert_eq!(cache_state(&informer), server_state(&env, CONFIGMAPS));
    assert!(
        env.requests()
            .iter()
            .all(|r| r.is_watch || r.method != "GET" || r.path != CONFIGMAPS),
        "no list request: the initial list was streamed"
    );
    api.create(&PostParams::default(), &configmap("late", "1"))
        .await
        .unwrap();
    eventually("live event on the same stream", || {
        cache_state(&informer) == server_state(&env, CONFIGMAPS)
    })
    .await;
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn dynamic_informer_over_dynamic_objects() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &configmap("a", "1")).await.unwrap();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap"));
    let dynamic: Api<DynamicObject> = Api::namespaced_with(env.client(), "default", &resource);
    let informer = SharedIndexInformer::new(ApiListerWatcher::new(dynamic), InformerConfig::default().queue(QUEUE));
    let running = Running::start(informer.clone());
    running.synced().await;
    api.create(&PostParams::default(), &configmap("b", "1")).await.unwrap();
    eventually("dynamic cache equals the server", || {
        cache_state(&informer) == server_state(&env, CONFIGMAPS)
    })
    .await;
    let b = informer.indexer().get_by_key("default/b").unwrap();
    assert_eq!(b.data["data"]["v"], "1");
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn the_servers_malformed_watch_fault_is_skipped_counted_and_nothing_is_lost() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let informer = configmap_informer(env.client(), ReflectorConfig::default());
    let running = Running::start(informer.clone());
    running.synced().await;
    eventually("watching", || env.watcher_count() == 1).await;
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    // Three times: the next watch starts with an object that does not decode, then the open
    // watch is closed so the reflector re-watches into it; a write lands between each.
    for i in 0..3 {
        env.faults().malform_next_watches(1);
        env.faults().close_watches();
        api.create(&PostParams::default(), &configmap(&format!("cm{i}"), "1"))
            .await
            .unwrap();
        eventually("the malformed event counted", || {
            ReflectorMetrics::get(&informer.reflector_metrics().malformed_objects) == i + 1
        })
        .await;
    }
    eventually("every write cached", || {
        (0..3).all(|i| informer.indexer().get_by_key(&format!("default/cm{i}")).is_some())
    })
    .await;
    assert_eq!(env.faults().malformed_watches_sent(), 3);
    assert!(informer.indexer().get_by_key("default/envtest-malformed").is_none());
    assert_eq!(informer.indexer().list().len(), 3, "nothing but the three writes");
    assert_eq!(
        ReflectorMetrics::get(&informer.reflector_metrics().watches),
        4,
        "one watch, and one more per close: a malformed event does not restart the watch"
    );
    running.stop().await;
    env.shutdown().await;
}


#[tokio::test]
async fn a_server_restored_from_an_older_backup_is_relisted_whatever_the_clients_retries() {
    // kube's client retries a 504 ("too large resource version") on its own (`default_retry`),
    // so the reflector may never see that answer: it must find the server behind by itself.
    for (default_retry, from_empty) in [(true, false), (true, true), (false, false)] {
        let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
        let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
        let empty = env.faults().snapshot();
        for name in ["a", "b"] {
            api.create(&PostParams::default(), &configmap(name, "1")).await.unwrap();
        }
        let older = env.faults().snapshot();
        // The server moves well past the backup before the informer starts.
        for i in 0..40 {
            api.create(&PostParams::default(), &configmap(&format!("later-{i}"), "1"))
                .await
                .unwrap();
        }
        let mut config = env.kube_config();
        config.default_retry = default_retry;
        let informer = configmap_informer(
            kube::Client::try_from(config).unwrap(),
            ReflectorConfig::default().server_behind_check(Duration::from_secs(1)),
        );
        let running = Running::start(informer.clone());
        running.synced().await;
        assert_eq!(cache_state(&informer), server_state(&env, CONFIGMAPS));

        env.faults().restore(if from_empty { &empty } else { &older });
        env.faults().clear_requests();
        // The restored server goes on, its counter still far behind the informer's.
        api.create(&PostParams::default(), &configmap("after-restore", "1"))
            .await
            .unwrap();
        if !from_empty {
            let mut a = api.get("a").await.unwrap();
            a.data = Some(BTreeMap::from([("v".to_string(), "2".to_string())]));
            api.replace("a", &PostParams::default(), &a).await.unwrap();
        }
        eventually("the cache holds what the restored server holds", || {
            cache_state(&informer) == server_state(&env, CONFIGMAPS)
        })
        .await;
        assert!(
            env.requests()
                .iter()
                .any(|r| !r.is_watch && r.path == CONFIGMAPS && r.param("resourceVersion").is_none()),
            "relisted as a consistent read (default_retry {default_retry}, from empty {from_empty})"
        );
        running.stop().await;
        env.shutdown().await;
    }
}
