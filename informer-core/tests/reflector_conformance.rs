//! The reflector against client-go's behaviour (issue #15, "Conformance with client-go"), over
//! real HTTP: envtest serves the API, `kube::Client` talks to it, and the tests read what the
//! reflector actually sent from envtest's request log.
//!
//! - the first list asks for `resourceVersion=0` *and* a `limit`, as client-go's;
//! - relists at a resourceVersion are paginated exactly when client-go's are: when the first
//!   list came back in pages (`paginatedResult`) or the user set a page size, and not
//!   otherwise; an expired continue token finishes either list in one unpaginated request
//!   (`FullListIfExpired`);
//! - a list whose resourceVersion is unavailable is retried at once as a consistent read, with
//!   the paging chosen for the first attempt (client-go's `list()`);
//! - the watch timeout is never below client-go's 5 minutes;
//! - every BOOKMARK reaches `Store::bookmark`, and the `ResourceVersionUpdater` follows the
//!   watch's resourceVersion.
//!
//! The store under the reflector is a recording implementation of the `Store` trait (what
//! client-go's tests do with their `storeWithRV`). Two tests use the scripted server of
//! `common` under tokio's paused clock, where envtest cannot produce the fault (a list at an
//! expired or too large resourceVersion) or where time must stand still.

mod common;

use common::eventually;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use informer_core::reflector::ResourceVersionUpdater;
use informer_core::{
    ApiListerWatcher, BackoffConfig, ListPage, ListWatchError, ListerWatcher, Reflector, ReflectorConfig, Store,
    StoreError, WatchStream, meta_namespace_key,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, PostParams, WatchParams};
use tokio_util::sync::CancellationToken;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

fn configmap(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some(BTreeMap::from([("v".to_string(), "1".to_string())]));
    cm
}

/// What the reflector did to its store, in order.
#[derive(Default)]
struct Recorded {
    /// key → resourceVersion: the store's content.
    objects: BTreeMap<String, String>,
    /// The resourceVersion of every `replace`.
    replaces: Vec<String>,
    /// The resourceVersion of every `bookmark`.
    bookmarks: Vec<String>,
    /// Every `add`/`update`/`delete`/`bookmark` with its resourceVersion, in order.
    events: Vec<(String, String)>,
}

/// A `Store` that records what it is told (a test double of the store interface only).
#[derive(Clone, Default)]
struct RecordingStore(Arc<Mutex<Recorded>>);

impl RecordingStore {
    fn get<T>(&self, f: impl FnOnce(&Recorded) -> T) -> T {
        f(&self.0.lock().unwrap())
    }

    fn write(&self, change: &str, obj: &ConfigMap) -> Result<(), StoreError> {
        let key = meta_namespace_key(obj)?;
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        let mut recorded = self.0.lock().unwrap();
        recorded.events.push((change.to_string(), rv.clone()));
        if change == "delete" {
            recorded.objects.remove(&key);
        } else {
            recorded.objects.insert(key, rv);
        }
        Ok(())
    }
}

impl Store<ConfigMap> for RecordingStore {
    fn add(&self, obj: Arc<ConfigMap>) -> Result<(), StoreError> {
        self.write("add", &obj)
    }

    fn update(&self, obj: Arc<ConfigMap>) -> Result<(), StoreError> {
        self.write("update", &obj)
    }

    fn delete(&self, obj: Arc<ConfigMap>) -> Result<(), StoreError> {
        self.write("delete", &obj)
    }

    fn replace(&self, list: Vec<Arc<ConfigMap>>, resource_version: &str) -> Result<(), StoreError> {
        let mut objects = BTreeMap::new();
        for obj in list {
            objects.insert(
                meta_namespace_key(obj.as_ref())?,
                obj.metadata.resource_version.clone().unwrap_or_default(),
            );
        }
        let mut recorded = self.0.lock().unwrap();
        recorded.objects = objects;
        recorded.replaces.push(resource_version.to_string());
        Ok(())
    }

    fn resync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn bookmark(&self, resource_version: &str) -> Result<(), StoreError> {
        let mut recorded = self.0.lock().unwrap();
        recorded.bookmarks.push(resource_version.to_string());
        recorded
            .events
            .push(("bookmark".to_string(), resource_version.to_string()));
        Ok(())
    }
}

/// namespace/name → resourceVersion of the ConfigMaps in `default`, as the server has them.
fn server_state(env: &envtest::Server) -> BTreeMap<String, String> {
    env.objects_of(CONFIGMAPS)
        .unwrap()
        .iter()
        .map(|o| {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let rv = o["metadata"]["resourceVersion"].as_str().unwrap_or_default();
            (format!("default/{name}"), rv.to_string())
        })
        .collect()
}

/// The list requests for ConfigMaps in the log, oldest first.
fn lists(env: &envtest::Server) -> Vec<envtest::RecordedRequest> {
    env.requests()
        .into_iter()
        .filter(|r| r.method == "GET" && !r.is_watch && r.path == CONFIGMAPS)
        .collect()
}

/// (resourceVersion, limit, has a continue token) of a list request.
fn shape(request: &envtest::RecordedRequest) -> (Option<String>, Option<String>, bool) {
    (
        request.param("resourceVersion"),
        request.param("limit"),
        request.param("continue").is_some(),
    )
}

fn at(rv: &str, limit: Option<&str>) -> (Option<String>, Option<String>, bool) {
    (Some(rv.to_string()), limit.map(str::to_string), false)
}

fn next_page(limit: &str) -> (Option<String>, Option<String>, bool) {
    (None, Some(limit.to_string()), true)
}

/// A reflector's configuration for these tests: short backoff, so relists come quickly.
fn config() -> ReflectorConfig {
    ReflectorConfig::default().name("configmaps").backoff(
        BackoffConfig::default()
            .initial(Duration::from_millis(10))
            .max(Duration::from_millis(50)),
    )
}

struct Running {
    reflector: Arc<Reflector<ConfigMap>>,
    store: RecordingStore,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(reflector: Reflector<ConfigMap>, store: RecordingStore) -> Self {
        let reflector = Arc::new(reflector);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let reflector = reflector.clone();
            let shutdown = shutdown.clone();
            async move { reflector.run(shutdown).await }
        });
        Running {
            reflector,
            store,
            shutdown,
            task,
        }
    }

    fn replaces(&self) -> usize {
        self.store.get(|r| r.replaces.len())
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
    }
}

/// A reflector over envtest's ConfigMaps in `default`, feeding a recording store.
fn start(env: &envtest::Server, config: ReflectorConfig) -> Running {
    start_over(
        Arc::new(ApiListerWatcher::new(Api::<ConfigMap>::namespaced(
            env.client(),
            "default",
        ))),
        config,
    )
}

fn start_over(lister_watcher: Arc<dyn ListerWatcher<ConfigMap>>, config: ReflectorConfig) -> Running {
    let store = RecordingStore::default();
    Running::start(Reflector::new(lister_watcher, Arc::new(store.clone()), config), store)
}

async fn create(env: &envtest::Server, names: impl IntoIterator<Item = String>) {
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for name in names {
        api.create(&PostParams::default(), &configmap(&name)).await.unwrap();
    }
}

/// Waits for the reflector's `n`th list and for its watch to be open.
async fn listed_and_watching(env: &envtest::Server, running: &Running, n: usize) {
    eventually("listed", || running.replaces() >= n).await;
    eventually("watching", || env.watcher_count() == 1).await;
}

/// Makes the reflector relist at its last resourceVersion, as after a compaction: its watch
/// is closed and the re-watch is answered with HTTP 410.
async fn force_relist(env: &envtest::Server, running: &Running) {
    let before = running.replaces();
    env.faults().expire_next_watches(1);
    env.faults().close_watches();
    eventually("relisted", || running.replaces() > before).await;
}

#[tokio::test]
async fn the_first_list_sends_resource_version_0_and_a_limit() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    create(&env, (0..3).map(|i| format!("cm-{i}"))).await;
    env.faults().clear_requests();
    let running = start(&env, config());
    listed_and_watching(&env, &running, 1).await;

    // kube's ListParams alone would leave resourceVersion=0 out next to a limit.
    let lists = lists(&env);
    assert_eq!(lists.len(), 1, "{lists:?}");
    assert_eq!(shape(&lists[0]), at("0", Some("500")), "{:?}", lists[0]);
    assert_eq!(running.store.get(|r| r.objects.clone()), server_state(&env));
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_relist_at_a_resource_version_is_whole_when_the_first_list_was() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    create(&env, (0..3).map(|i| format!("cm-{i}"))).await;
    let running = start(&env, config());
    listed_and_watching(&env, &running, 1).await;
    env.faults().clear_requests();
    create(&env, ["late".to_string()]).await;
    eventually("late seen", || running.store.get(|r| r.objects.len()) == 4).await;
    let last = running.reflector.last_sync_resource_version();

    force_relist(&env, &running).await;

    // Not paginated, so a watch cache could serve it.
    let lists = lists(&env);
    assert_eq!(lists.iter().map(shape).collect::<Vec<_>>(), [at(&last, None)]);
    assert_eq!(running.store.get(|r| r.objects.clone()), server_state(&env));
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_relist_at_a_resource_version_is_paginated_when_the_first_list_was() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    // envtest has no watch cache: it pages lists at "0" as etcd does.
    create(&env, (0..501).map(|i| format!("cm-{i:03}"))).await;
    env.faults().clear_requests();
    let running = start(&env, config());
    listed_and_watching(&env, &running, 1).await;
    let first = lists(&env);
    assert_eq!(
        first.iter().map(shape).collect::<Vec<_>>(),
        [at("0", Some("500")), next_page("500")]
    );
    env.faults().clear_requests();
    let last = running.reflector.last_sync_resource_version();

    force_relist(&env, &running).await;

    let lists = lists(&env);
    assert_eq!(
        lists.iter().map(shape).collect::<Vec<_>>(),
        [at(&last, Some("500")), next_page("500")]
    );
    assert_eq!(running.store.get(|r| r.objects.len()), 501);
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn an_explicit_page_size_pages_relists_at_a_resource_version_too() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    create(&env, (0..3).map(|i| format!("cm-{i:02}"))).await;
    env.faults().clear_requests();
    let running = start(&env, config().page_size(10));
    listed_and_watching(&env, &running, 1).await;
    // One page: the first list was not paginated...
    assert_eq!(lists(&env).iter().map(shape).collect::<Vec<_>>(), [at("0", Some("10"))]);
    create(&env, (3..12).map(|i| format!("cm-{i:02}"))).await;
    eventually("all seen", || running.store.get(|r| r.objects.len()) == 12).await;
    env.faults().clear_requests();
    let last = running.reflector.last_sync_resource_version();

    force_relist(&env, &running).await;

    // ... but the user's page size applies to every list.
    let lists = lists(&env);
    assert_eq!(
        lists.iter().map(shape).collect::<Vec<_>>(),
        [at(&last, Some("10")), next_page("10")]
    );
    assert_eq!(running.store.get(|r| r.objects.clone()), server_state(&env));
    running.stop().await;
    env.shutdown().await;
}

/// Delegates to the real `ApiListerWatcher`; once armed, after the first page that carries a
/// continue token it writes an object and compacts envtest's history, so the token names a
/// revision the server no longer has and the next page is answered `410 Expired` (a list
/// slower than compaction, made deterministic).
struct CompactAfterFirstPage {
    inner: ApiListerWatcher<ConfigMap>,
    api: Api<ConfigMap>,
    faults: envtest::Faults,
    armed: AtomicBool,
}

impl ListerWatcher<ConfigMap> for CompactAfterFirstPage {
    fn list(&self, params: &ListParams) -> BoxFuture<'_, Result<ListPage<ConfigMap>, ListWatchError>> {
        let params = params.clone();
        Box::pin(async move {
            let page = self.inner.list(&params).await?;
            if page.continue_token.is_some() && self.armed.swap(false, Ordering::SeqCst) {
                self.api
                    .create(&PostParams::default(), &configmap("written-mid-list"))
                    .await?;
                self.faults.compact();
            }
            Ok(page)
        })
    }

    fn watch(
        &self,
        params: &WatchParams,
        resource_version: &str,
    ) -> BoxFuture<'_, Result<WatchStream<ConfigMap>, ListWatchError>> {
        self.inner.watch(params, resource_version)
    }
}

fn compacting(env: &envtest::Server, armed: bool) -> Arc<CompactAfterFirstPage> {
    let api = Api::<ConfigMap>::namespaced(env.client(), "default");
    Arc::new(CompactAfterFirstPage {
        // Pages strictly in sequence: the compaction must fall between page 1 and page 2,
        // which pages fetched ahead would race.
        inner: ApiListerWatcher::new(api.clone()).pages_ahead(0),
        api,
        faults: env.faults(),
        armed: AtomicBool::new(armed),
    })
}

#[tokio::test]
async fn an_expired_continue_token_finishes_the_first_list_in_one_request() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    create(&env, (0..5).map(|i| format!("cm-{i}"))).await;
    env.faults().clear_requests();
    let running = start_over(compacting(&env, true), config().page_size(2));
    listed_and_watching(&env, &running, 1).await;

    let lists = lists(&env);
    assert_eq!(
        lists.iter().map(shape).collect::<Vec<_>>(),
        [at("0", Some("2")), next_page("2"), at("0", None)],
        "page 1, page 2 refused, then everything at the list's resourceVersion"
    );
    assert_eq!(running.store.get(|r| r.objects.clone()), server_state(&env));
    assert_eq!(running.replaces(), 1);
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn an_expired_continue_token_finishes_a_relist_at_a_resource_version_in_one_request() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    create(&env, (0..5).map(|i| format!("cm-{i}"))).await;
    let lister_watcher = compacting(&env, false);
    let running = start_over(lister_watcher.clone(), config().page_size(2));
    listed_and_watching(&env, &running, 1).await;
    env.faults().clear_requests();
    let last = running.reflector.last_sync_resource_version();
    lister_watcher.armed.store(true, Ordering::SeqCst);

    force_relist(&env, &running).await;

    let lists = lists(&env);
    assert_eq!(
        lists.iter().map(shape).collect::<Vec<_>>(),
        [at(&last, Some("2")), next_page("2"), at(&last, None)],
        "page 1, page 2 refused, then everything at the relist's resourceVersion"
    );
    assert_eq!(running.store.get(|r| r.objects.clone()), server_state(&env));
    assert_eq!(running.store.get(|r| r.objects.len()), 6);
    running.stop().await;
    env.shutdown().await;
}

#[tokio::test]
async fn bookmarks_reach_the_store_and_the_updater_follows_the_watch() {
    let env = envtest::Server::start(envtest::Config::default().bookmark_interval(Duration::from_millis(100)))
        .await
        .unwrap();
    create(&env, ["a".to_string(), "b".to_string()]).await;
    env.faults().clear_requests();
    let updates = Arc::new(Mutex::new(Vec::<String>::new()));
    let updater: ResourceVersionUpdater = {
        let updates = updates.clone();
        Arc::new(move |rv: &str| updates.lock().unwrap().push(rv.to_string()))
    };
    let store = RecordingStore::default();
    let reflector = Reflector::new(
        Arc::new(ApiListerWatcher::new(Api::<ConfigMap>::namespaced(
            env.client(),
            "default",
        ))),
        Arc::new(store.clone()),
        // Below client-go's minimum: raised to 5 minutes.
        config().min_watch_timeout(Duration::from_secs(1)),
    )
    .with_resource_version_updater(updater);
    let running = Running::start(reflector, store.clone());
    listed_and_watching(&env, &running, 1).await;
    let listed_at: u64 = running.store.get(|r| r.replaces[0].parse().unwrap());

    // An event on the watch: the updater follows it at once (the watch started at a set rv).
    create(&env, ["c".to_string()]).await;
    let c_rv = server_state(&env)["default/c"].clone();
    eventually("the add moved the rv", || updates.lock().unwrap().contains(&c_rv)).await;

    // A write the watch does not carry (another resource): only a bookmark tells of it.
    Api::<Secret>::namespaced(env.client(), "default")
        .create(&PostParams::default(), &{
            let mut secret = Secret::default();
            secret.metadata.name = Some("s".into());
            secret
        })
        .await
        .unwrap();
    let secret_rv = env.current_resource_version().to_string();
    eventually("a bookmark at the secret's rv reached the store", || {
        running.store.get(|r| r.bookmarks.contains(&secret_rv))
    })
    .await;
    eventually("the updater saw it", || updates.lock().unwrap().contains(&secret_rv)).await;
    let reflector = running.reflector.clone();

    // The watch asked for bookmarks, with a timeout of at least client-go's 5 minutes.
    let watches: Vec<_> = env
        .requests()
        .into_iter()
        .filter(|r| r.is_watch && r.path == CONFIGMAPS)
        .collect();
    assert!(!watches.is_empty());
    for watch in &watches {
        assert_eq!(watch.param("allowWatchBookmarks").as_deref(), Some("true"), "{watch:?}");
        let timeout: u32 = watch.param("timeoutSeconds").unwrap().parse().unwrap();
        assert!((300..600).contains(&timeout), "{timeout}");
    }
    running.stop().await;

    // The updater was told every event's and every bookmark's resourceVersion, in the order
    // the store got them (the watch started at a set rv, so from the first event), and the
    // resourceVersion never went back. The list itself is not an update.
    let events = store.get(|r| r.events.clone());
    let updates = updates.lock().unwrap().clone();
    assert_eq!(updates, events.iter().map(|(_, rv)| rv.clone()).collect::<Vec<_>>());
    assert_eq!(updates.last(), Some(&reflector.last_sync_resource_version()));
    let numbers: Vec<u64> = updates.iter().map(|rv| rv.parse().unwrap()).collect();
    assert!(numbers.windows(2).all(|w| w[0] <= w[1]), "{updates:?}");
    assert!(numbers[0] >= listed_at, "{updates:?} after {listed_at}");
    let changes: Vec<_> = events.iter().filter(|(call, _)| call != "bookmark").cloned().collect();
    assert_eq!(changes, [("add".to_string(), c_rv)]);
    assert!(store.get(|r| r.bookmarks.contains(&secret_rv)));
    env.shutdown().await;
}

mod unavailable_resource_version {
    //! A list at a resourceVersion the server no longer has (410) or does not have yet ("too
    //! large", after an HA failover): envtest answers neither to the lists a reflector makes,
    //! so the scripted server of `common` does, under tokio's paused clock (no HTTP).

    use super::*;
    use crate::common::{FakeApi, after_virtual_time, gone, until};

    fn too_large() -> ListWatchError {
        ListWatchError::api(504, "Timeout", "Too large resource version: 9, current: 3")
    }

    /// (resourceVersion, limit, continue token?) of the fake server's list requests.
    fn fake_lists(api: &FakeApi) -> Vec<(Option<String>, Option<u32>, bool)> {
        api.list_requests()
            .into_iter()
            .map(|p| (p.resource_version, p.limit, p.continue_token.is_some()))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_list_is_retried_at_once_as_a_consistent_read_with_the_same_paging() {
        for error in [gone(), too_large()] {
            let api = FakeApi::new();
            api.apply("a", "1");
            api.fail_next_list(error);
            let running = start_over(Arc::new(api.clone()), ReflectorConfig::default());
            // `until` keeps the runtime busy: virtual time stands still, so no backoff passes.
            until("listed without a backoff", || running.replaces() == 1).await;
            assert_eq!(
                fake_lists(&api),
                [(Some("0".into()), Some(500), false), (None, Some(500), false)]
            );
            running.stop().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_whole_relist_stays_whole_when_retried_as_a_consistent_read() {
        let api = FakeApi::new();
        api.apply("a", "1");
        let running = start_over(Arc::new(api.clone()), config());
        until("listed", || running.replaces() == 1).await;
        until("watching", || api.open_watches() == 1).await;
        let last = running.reflector.last_sync_resource_version();
        api.fail_next_list(gone());
        api.break_watches(gone);
        // The relist after a watch's 410 waits a backoff (virtual time passes).
        after_virtual_time("relisted", || running.replaces() == 2).await;
        assert_eq!(
            fake_lists(&api)[1..],
            [(Some(last), None, false), (None, None, false)],
            "client-go keeps the pager's page size (none at a resourceVersion) for the retry"
        );
        running.stop().await;
    }
}
