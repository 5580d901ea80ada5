//! Which caches a controller reads, over envtest: a primary cached for several namespaces
//! (controller-runtime's `ByObject[obj].Namespaces`) and the one-cache-per-type rule behind
//! `Context::lister_for`.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{configmap, eventually};
use controller::{Action, Context, Controller, ControllerError, ObjectKey, Request, SourceOptions, reconciler_fn};
use factory::{CacheOptions, SharedInformerFactory};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

async fn namespaces(client: &kube::Client, names: &[&str]) {
    let api: Api<Namespace> = Api::all(client.clone());
    for name in names {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some((*name).into()),
                ..Default::default()
            },
            ..Namespace::default()
        };
        api.create(&PostParams::default(), &namespace).await.unwrap();
    }
}

async fn create(client: &kube::Client, namespace: &str, name: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    api.create(&PostParams::default(), &configmap(namespace, name, "1"))
        .await
        .unwrap();
}

/// What each reconcile saw: the key, whether `ctx.get` found it, and every key the one lister
/// listed then.
type Seen = Arc<Mutex<Vec<(String, bool, BTreeSet<String>)>>>;

fn reconciled(seen: &Seen) -> BTreeSet<String> {
    seen.lock().unwrap().iter().map(|(key, _, _)| key.clone()).collect()
}

#[tokio::test]
async fn a_controller_for_two_namespaces_reconciles_theirs_through_one_lister_and_nothing_else() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    namespaces(&client, &["a", "b", "c"]).await;
    for (namespace, name) in [("a", "x"), ("b", "x"), ("c", "x")] {
        create(&client, namespace, name).await;
    }
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let seen = Seen::default();
    let sink = seen.clone();
    let reconciler = reconciler_fn(move |req: Request, ctx: Context<ConfigMap>| {
        let found = ctx.get(&req).expect("decodes").is_some();
        let listed = ctx
            .lister_for::<ConfigMap>()
            .map(|lister| {
                lister
                    .list(&Default::default())
                    .iter()
                    .map(|cm| {
                        format!(
                            "{}/{}",
                            cm.metadata.namespace.as_deref().unwrap_or(""),
                            cm.metadata.name.as_deref().unwrap_or("")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        sink.lock().unwrap().push((req.cache_key(), found, listed));
        async { Ok::<_, std::convert::Infallible>(Action::Done) }
    });
    let shutdown = CancellationToken::new();
    let options = SourceOptions::<ConfigMap>::new().cache(CacheOptions::default().namespaces(["a", "b"]));
    let run = tokio::spawn(
        Controller::new("two-namespaces", &factory)
            .for_resource_with(options)
            .run(reconciler, shutdown.clone()),
    );
    eventually(WAIT, "a/x and b/x reconciled", || {
        let done = reconciled(&seen) == BTreeSet::from(["a/x".to_string(), "b/x".to_string()]);
        async move { done }
    })
    .await;

    // An object added later in b reaches the cache and is reconciled; c's never are.
    create(&client, "c", "late").await;
    create(&client, "b", "late").await;
    eventually(WAIT, "b/late reconciled", || {
        let done = reconciled(&seen).contains("b/late");
        async move { done }
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();

    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        reconciled(&Arc::new(Mutex::new(seen.clone()))),
        BTreeSet::from(["a/x".to_string(), "b/late".to_string(), "b/x".to_string()])
    );
    // Every reconcile found its object through ctx.get (routed to its namespace's store), and
    // the one lister listed both namespaces and never c's.
    for (key, found, listed) in &seen {
        assert!(found, "{key} not found by ctx.get");
        assert!(listed.contains("a/x") && listed.contains("b/x"), "{key}: {listed:?}");
        assert!(listed.iter().all(|k| !k.starts_with("c/")), "{key}: {listed:?}");
    }
    // c was never read: no list or watch of its ConfigMaps, nor of every namespace's.
    let reads = env.requests();
    for path in ["/api/v1/namespaces/c/configmaps", "/api/v1/configmaps"] {
        assert!(
            !reads.iter().any(|r| r.method == "GET" && r.path == path),
            "{path} was read"
        );
    }
    for path in ["/api/v1/namespaces/a/configmaps", "/api/v1/namespaces/b/configmaps"] {
        assert!(reads.iter().any(|r| r.path == path && r.is_watch), "{path} not watched");
    }
    env.shutdown().await;
}

fn to_primary(secret: &Secret) -> Vec<ObjectKey> {
    ObjectKey::from_object(secret).into_iter().collect()
}

#[tokio::test]
async fn two_informers_of_one_type_in_one_controller_are_refused_at_build() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let noop = || {
        reconciler_fn(|_req: Request, _ctx: Context<ConfigMap>| async {
            Ok::<_, std::convert::Infallible>(Action::Done)
        })
    };

    // Secrets through two differently filtered informers: which would lister_for::<Secret>() read?
    let built = Controller::new("two-secret-caches", &factory)
        .for_resource::<ConfigMap>()
        .owns_with(SourceOptions::<Secret>::new().informer_with(CacheOptions::default().labels("role=child")))
        .watches_with_options(
            SourceOptions::<Secret>::new().informer_with(CacheOptions::default().labels("role=config")),
            to_primary,
        )
        .build(noop());
    match built {
        Err(ControllerError::ConflictingCaches {
            controller,
            first,
            second,
        }) => {
            assert_eq!(controller, "two-secret-caches");
            assert_eq!(first, "v1/Secret [labels=role=child]");
            assert_eq!(second, "v1/Secret [labels=role=config]");
        }
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("built with two caches of Secret"),
    }
    // The primary's type too: a second informer of ConfigMap beside the primary's.
    let built = Controller::new("two-primary-caches", &factory)
        .for_resource::<ConfigMap>()
        .watches_with_options(
            SourceOptions::<ConfigMap>::new().informer_with(CacheOptions::default().namespace("kube-system")),
            |cm: &ConfigMap| {
                vec![ObjectKey::namespaced(
                    "default",
                    cm.metadata.name.clone().unwrap_or_default(),
                )]
            },
        );
    assert!(matches!(
        built.build(noop()),
        Err(ControllerError::ConflictingCaches { .. })
    ));

    // One informer read by two sources with their own predicates builds, and lister_for reads it.
    let built = Controller::new("one-secret-cache", &factory)
        .for_resource::<ConfigMap>()
        .owns_with(
            SourceOptions::<Secret>::new()
                .predicate(controller::predicate::LabelSelectorPredicate::parse("role=child").unwrap()),
        )
        .watches_with_options(
            SourceOptions::<Secret>::new()
                .predicate(controller::predicate::LabelSelectorPredicate::parse("role=config").unwrap()),
            to_primary,
        )
        .build(noop())
        .unwrap();
    let shared = factory.informer_for::<Secret>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    assert!(factory.wait_for_cache_sync(&shutdown).await.values().all(|ok| *ok));
    let secrets: Api<Secret> = Api::namespaced(env.client(), "default");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        },
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    eventually(WAIT, "the shared informer caches s", || {
        let ok = shared.indexer().get_by_key("default/s").is_some();
        async move { ok }
    })
    .await;
    let lister = built.context().lister_for::<Secret>().unwrap();
    assert!(lister.namespaced("default").get("s").is_some());
    shutdown.cancel();
    factory.shutdown().await;
    drop(built);
    env.shutdown().await;
}
