//! One type cached for several namespaces (controller-runtime's `ByObject[obj].Namespaces`)
//! over envtest: one list/watch per namespace, one informer, one cache and one lister to the
//! consumers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use factory::{CacheOptions, NamespaceConfig, SharedInformerFactory};
use informer_core::{Lister, NAMESPACE_INDEX, ResourceEventHandlerFuncs};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn configmap(namespace: &str, name: &str, app: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some([("app".to_string(), app.to_string())].into()),
            ..Default::default()
        },
        ..ConfigMap::default()
    }
}

async fn create(client: &kube::Client, namespace: &str, name: &str, app: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &configmap(namespace, name, app))
        .await
        .unwrap();
}

async fn create_namespace(namespaces: &Api<Namespace>, name: &str) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Namespace::default()
    };
    namespaces.create(&PostParams::default(), &namespace).await.unwrap();
}

fn keys(lister: &Lister<ConfigMap>) -> Vec<String> {
    let mut keys: Vec<String> = lister
        .list(&Default::default())
        .iter()
        .map(|cm| {
            format!(
                "{}/{}",
                cm.metadata.namespace.as_deref().unwrap_or(""),
                cm.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_type_cached_for_two_namespaces_is_one_informer_one_cache_and_one_lister() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in ["a", "b", "c"] {
        create_namespace(&namespaces, name).await;
    }
    for (namespace, name, app) in [
        ("a", "x", "web"),
        ("a", "y", "db"),
        ("b", "x", "web"),
        ("b", "z", "db"),
        ("c", "x", "web"),
    ] {
        create(&client, namespace, name, app).await;
    }
    // a and b, b with a label selector of its own: b's "db" object is not cached.
    let options = CacheOptions::default()
        .namespaces(["a", "b"])
        .namespace_with("b", NamespaceConfig::default().labels("app=web"));
    let factory = SharedInformerFactory::builder(client.clone())
        .by_object::<ConfigMap>(options)
        .build();
    let informer = factory.informer_for::<ConfigMap>().unwrap();
    assert_eq!(informer.name(), "v1/ConfigMap [namespaces=a,b(labels=app=web)]");
    let by_app: informer_core::Indexers<ConfigMap> = [(
        "app".to_string(),
        Arc::new(|cm: &ConfigMap| {
            cm.metadata
                .labels
                .iter()
                .flatten()
                .filter(|(k, _)| *k == "app")
                .map(|(_, v)| v.clone())
                .collect()
        }) as informer_core::IndexFunc<ConfigMap>,
    )]
    .into();
    informer.add_indexers(by_app).unwrap();
    let heard = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = heard.clone();
    informer
        .add_event_handler(
            ResourceEventHandlerFuncs::default().on_add(move |cm: &Arc<ConfigMap>, _| {
                let key = format!(
                    "{}/{}",
                    cm.metadata.namespace.as_deref().unwrap_or(""),
                    cm.metadata.name.as_deref().unwrap_or("")
                );
                sink.lock().unwrap().push(key);
            }),
        )
        .unwrap();

    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert_eq!(
        synced.into_iter().collect::<Vec<_>>(),
        [("v1/ConfigMap [namespaces=a,b(labels=app=web)]".to_string(), true)]
    );
    assert!(informer.has_synced());

    // One lister over both namespaces: list merges, get goes to the namespace's store.
    let lister = Lister::new(informer.indexer().clone());
    assert_eq!(keys(&lister), ["a/x", "a/y", "b/x"]);
    assert!(lister.namespaced("a").get("y").is_some());
    assert!(lister.namespaced("b").get("x").is_some());
    assert!(
        lister.namespaced("b").get("z").is_none(),
        "b's own selector keeps its db object out"
    );
    assert!(lister.namespaced("c").get("x").is_none(), "c is not cached");
    assert!(informer.indexer().get_by_key("a/x").is_some());
    assert_eq!(informer.indexer().len(), 3);
    // Index lookups merge across namespaces.
    let mut web: Vec<String> = informer.indexer().index_keys("app", "web").unwrap();
    web.sort();
    assert_eq!(web, ["a/x", "b/x"]);
    assert_eq!(informer.indexer().by_index(NAMESPACE_INDEX, "a").unwrap().len(), 2);
    let mut apps = informer.indexer().list_index_func_values("app");
    apps.sort();
    assert_eq!(apps, ["db", "web"]);
    // The handler registered on the one informer heard both namespaces' initial lists.
    let mut initial = heard.lock().unwrap().clone();
    initial.sort();
    assert_eq!(initial, ["a/x", "a/y", "b/x"]);

    // One list and one watch per namespace, each with its own selectors; none elsewhere.
    let reads = env.requests();
    let of = |path: &str| {
        reads
            .iter()
            .filter(|r| r.method == "GET" && r.path == path)
            .cloned()
            .collect::<Vec<_>>()
    };
    let (a, b) = (
        of("/api/v1/namespaces/a/configmaps"),
        of("/api/v1/namespaces/b/configmaps"),
    );
    assert!(!a.is_empty() && !b.is_empty());
    assert!(a.iter().all(|r| r.param("labelSelector").is_none()), "{a:?}");
    assert!(
        b.iter().all(|r| r.param("labelSelector").as_deref() == Some("app=web")),
        "{b:?}"
    );
    assert!(of("/api/v1/namespaces/c/configmaps").is_empty());
    assert!(of("/api/v1/configmaps").is_empty());

    // Later changes in either namespace reach the one cache and its handlers; c's do not.
    create(&client, "b", "w", "web").await;
    create(&client, "c", "w", "web").await;
    create(&client, "a", "w", "web").await;
    eventually("b/w and a/w cached", || {
        keys(&lister) == ["a/w", "a/x", "a/y", "b/w", "b/x"]
    })
    .await;
    eventually("b/w heard", || heard.lock().unwrap().iter().any(|k| k == "b/w")).await;
    assert!(!heard.lock().unwrap().iter().any(|k| k.starts_with("c/")));
    let a_api: Api<ConfigMap> = Api::namespaced(client.clone(), "a");
    a_api.delete("y", &DeleteParams::default()).await.unwrap();
    eventually("a/y gone", || keys(&lister) == ["a/w", "a/x", "b/w", "b/x"]).await;

    shutdown.cancel();
    factory.shutdown().await;
    assert!(informer.is_stopped());
}

#[tokio::test]
async fn a_namespace_listed_both_ways_or_empty_is_refused() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let both = factory.informer_for_with::<ConfigMap>(CacheOptions::default().namespace("a").namespaces(["b"]));
    assert!(matches!(both.err(), Some(factory::FactoryError::InvalidOptions(_))));
    let empty = factory.informer_for_with::<ConfigMap>(CacheOptions::default().namespaces([""]));
    assert!(matches!(empty.err(), Some(factory::FactoryError::InvalidOptions(_))));
}

#[tokio::test]
async fn the_factorys_namespaces_apply_to_every_namespaced_type_without_its_own() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in ["a", "b", "c"] {
        create_namespace(&namespaces, name).await;
        create(&client, name, "x", "web").await;
    }
    let factory = SharedInformerFactory::builder(client.clone())
        .namespaces(["b", "a"])
        .by_object::<k8s_openapi::api::core::v1::Secret>(CacheOptions::default().namespace("c"))
        .build();
    let configmaps = factory.informer_for::<ConfigMap>().unwrap();
    let all_namespaces = factory.informer_for::<Namespace>().unwrap();
    let secrets = factory.informer_for::<k8s_openapi::api::core::v1::Secret>().unwrap();
    let resource = kube::api::ApiResource::erase::<ConfigMap>(&());
    let dynamic = factory.dynamic_informer_for(&resource, true).unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert!(synced.values().all(|ok| *ok), "{synced:?}");

    assert_eq!(keys(&Lister::new(configmaps.indexer().clone())), ["a/x", "b/x"]);
    let mut dynamic_keys = dynamic.indexer().list_keys();
    dynamic_keys.sort();
    assert_eq!(dynamic_keys, ["a/x", "b/x"]);
    // A cluster-scoped type is not narrowed; a type's own namespace wins.
    for name in ["a", "b", "c"] {
        assert!(all_namespaces.indexer().get_by_key(name).is_some(), "namespace {name}");
    }
    let reads = env.requests();
    assert!(
        reads
            .iter()
            .any(|r| r.method == "GET" && r.path == "/api/v1/namespaces/c/secrets")
    );
    assert!(!reads.iter().any(|r| r.method == "GET"
        && (r.path == "/api/v1/namespaces/a/secrets" || r.path == "/api/v1/namespaces/c/configmaps")));
    assert!(secrets.has_synced());
    shutdown.cancel();
    factory.shutdown().await;
}

/// Where a transform saw each object: its key, and the thread's name and id.
type Sightings = Arc<Mutex<Vec<(String, Option<String>, std::thread::ThreadId)>>>;

/// A transform that records, in `seen`, the thread each object passes it on.
fn recorder<K: kube::Resource>(seen: &Sightings) -> impl Fn(K) -> K + Send + Sync + 'static {
    let seen = seen.clone();
    move |obj: K| {
        let key = format!(
            "{}/{}",
            obj.meta().namespace.as_deref().unwrap_or(""),
            obj.meta().name.as_deref().unwrap_or("")
        );
        let thread = std::thread::current();
        seen.lock()
            .unwrap()
            .push((key, thread.name().map(str::to_owned), thread.id()));
        obj
    }
}

/// The threads `seen` names for `keys`, all of which it must hold.
fn threads_of(seen: &Sightings, keys: &[&str]) -> Vec<(Option<String>, std::thread::ThreadId)> {
    let seen = seen.lock().unwrap();
    for key in keys {
        assert!(seen.iter().any(|(k, ..)| k == key), "{key} not seen: {seen:?}");
    }
    seen.iter()
        .filter(|(k, ..)| keys.contains(&k.as_str()))
        .map(|(_, name, id)| (name.clone(), *id))
        .fold(Vec::new(), |mut threads, thread| {
            if !threads.contains(&thread) {
                threads.push(thread);
            }
            threads
        })
}

#[tokio::test]
async fn an_informers_namespaces_are_decoded_on_one_thread_of_its_own() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in ["a", "b"] {
        create_namespace(&namespaces, name).await;
        create(&client, name, "x", "web").await;
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), "a");
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    // The transform runs where objects are decoded (on the informer's decoding thread, in
    // the `Arc` it is cached in): it tells which thread decoded each object.
    let (seen_configmaps, seen_secrets) = (Sightings::default(), Sightings::default());
    let factory = SharedInformerFactory::builder(client.clone())
        .namespaces(["a", "b"])
        .transform::<ConfigMap>(recorder(&seen_configmaps))
        .transform::<k8s_openapi::api::core::v1::Secret>(recorder(&seen_secrets))
        .build();
    let configmaps = factory.informer_for::<ConfigMap>().unwrap();
    factory.informer_for::<k8s_openapi::api::core::v1::Secret>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert!(synced.values().all(|ok| *ok), "{synced:?}");

    // Both namespaces' lists on one thread, the decoding thread; the other informer has its own.
    let listed = threads_of(&seen_configmaps, &["a/x", "b/x"]);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (name, listed_on) = listed.first().unwrap().clone();
    assert_eq!(name.as_deref(), Some("kinformer-decode"));
    let secrets_on = threads_of(&seen_secrets, &["a/s"]);
    assert_eq!(secrets_on.len(), 1, "{secrets_on:?}");
    assert_ne!(
        secrets_on.first().unwrap().1,
        listed_on,
        "each informer has a thread of its own"
    );

    // Both namespaces' watch events on one thread too. (The thread ends after 10 s idle and the
    // next job starts another, so the list's and the watch's threads are not compared.)
    create(&client, "a", "w", "web").await;
    create(&client, "b", "w", "web").await;
    let lister = Lister::new(configmaps.indexer().clone());
    eventually("a/w and b/w cached", || keys(&lister) == ["a/w", "a/x", "b/w", "b/x"]).await;
    let watched = threads_of(&seen_configmaps, &["a/w", "b/w"]);
    assert_eq!(watched.len(), 1, "{watched:?}");
    assert_eq!(watched.first().unwrap().0.as_deref(), Some("kinformer-decode"));

    shutdown.cancel();
    factory.shutdown().await;
}
