//! The factory over envtest: shared watches, sync across types, options reaching the server.

use std::time::Duration;

use factory::{CacheOptions, FactoryError, SharedInformerFactory};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ApiResource, GroupVersionKind, PostParams};
use tokio_util::sync::CancellationToken;

fn watches_of(env: &envtest::Server, path: &str) -> usize {
    env.requests().iter().filter(|r| r.is_watch && r.path == path).count()
}

fn lists_of(env: &envtest::Server, path: &str) -> Vec<envtest::RecordedRequest> {
    env.requests()
        .into_iter()
        .filter(|r| !r.is_watch && r.method == "GET" && r.path == path)
        .collect()
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn two_consumers_of_one_type_share_one_list_and_one_watch() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let first = factory.informer_for::<Deployment>().unwrap();
    let second = factory.informer_for::<Deployment>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert_eq!(
        synced.into_iter().collect::<Vec<_>>(),
        [("apps/v1/Deployment".to_string(), true)]
    );
    assert!(first.has_synced() && second.has_synced());
    eventually("watching", || watches_of(&env, "/apis/apps/v1/deployments") == 1).await;
    // Starting again starts nothing new.
    factory.start(&shutdown);
    assert_eq!(lists_of(&env, "/apis/apps/v1/deployments").len(), 1);
    assert_eq!(watches_of(&env, "/apis/apps/v1/deployments"), 1);
    shutdown.cancel();
    factory.shutdown().await;
    assert!(first.is_stopped());
}

#[tokio::test]
async fn wait_for_cache_sync_reports_every_started_type_and_later_starts_add_new_ones() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("one".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let configmaps = factory.informer_for::<ConfigMap>().unwrap();
    factory.informer_for::<Namespace>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let deployments = factory.informer_for::<Deployment>().unwrap();
    assert!(
        !deployments.has_started(),
        "requested after start: not started until start is called again"
    );
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert_eq!(
        synced.into_iter().collect::<Vec<_>>(),
        [
            ("apps/v1/Deployment".to_string(), true),
            ("v1/ConfigMap".to_string(), true),
            ("v1/Namespace".to_string(), true)
        ]
    );
    assert_eq!(configmaps.indexer().len(), 1);
    assert_eq!(lists_of(&env, "/api/v1/configmaps").len(), 1, "started once");
    factory.shutdown().await;
    assert_eq!(factory.informer_for::<ConfigMap>().err(), Some(FactoryError::ShutDown));
    assert!(configmaps.is_stopped() && deployments.is_stopped());
}

#[tokio::test]
async fn wait_for_cache_sync_respects_shutdown() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    // Every list fails, so the cache never syncs.
    env.faults().fail_next("/api/v1/configmaps", 500, usize::MAX, 0);
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    factory.informer_for::<ConfigMap>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let waiter = tokio::spawn({
        let factory = factory.clone();
        let shutdown = shutdown.clone();
        async move { factory.wait_for_cache_sync(&shutdown).await }
    });
    eventually("a list was tried", || !lists_of(&env, "/api/v1/configmaps").is_empty()).await;
    shutdown.cancel();
    let synced = waiter.await.unwrap();
    assert_eq!(synced.get("v1/ConfigMap"), Some(&false));
    factory.shutdown().await;
}

#[tokio::test]
async fn namespace_tweak_and_custom_resync_reach_the_reflector() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let factory = SharedInformerFactory::builder(env.client())
        .default_resync(Duration::from_secs(300))
        .custom_resync::<ConfigMap>(Duration::from_secs(60))
        .namespace("default")
        .tweak_list_params(|options| {
            options.label_selector = Some("team=infra".into());
            options.page_size = 100;
        })
        .build();
    let configmaps = factory.informer_for::<ConfigMap>().unwrap();
    let namespaces = factory.informer_for::<Namespace>().unwrap();
    assert_eq!(configmaps.resync_check_period(), Duration::from_secs(60));
    assert_eq!(namespaces.resync_check_period(), Duration::from_secs(300));
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    assert!(factory.wait_for_cache_sync(&shutdown).await.values().all(|ok| *ok));

    // Namespaced resources are watched in the factory's namespace; cluster-scoped ones are not.
    let cm_path = "/api/v1/namespaces/default/configmaps";
    eventually("watching both", || {
        watches_of(&env, cm_path) == 1 && watches_of(&env, "/api/v1/namespaces") == 1
    })
    .await;
    for path in [cm_path, "/api/v1/namespaces"] {
        for request in env.requests().iter().filter(|r| r.path == path) {
            assert_eq!(
                request.param("labelSelector").as_deref(),
                Some("team=infra"),
                "{request:?}"
            );
        }
        assert_eq!(lists_of(&env, path)[0].param("limit").as_deref(), Some("100"));
    }
    factory.shutdown().await;
}

#[tokio::test]
async fn dynamic_informers_are_shared_by_group_version_kind_and_transforms_apply() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("with-fields".into());
    cm.metadata.managed_fields = Some(vec![Default::default()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let factory = SharedInformerFactory::builder(env.client())
        .strip_managed_fields(true)
        .transform::<ConfigMap>(|mut cm: ConfigMap| {
            cm.metadata
                .annotations
                .get_or_insert_default()
                .insert("seen-by".into(), "transform".into());
            cm
        })
        .build();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap"));
    let dynamic = factory.dynamic_informer_for(&resource, true).unwrap();
    factory.dynamic_informer_for(&resource, true).unwrap();
    let typed = factory.informer_for::<ConfigMap>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    assert_eq!(
        factory.wait_for_cache_sync(&shutdown).await.len(),
        2,
        "one dynamic, one typed"
    );
    assert_eq!(lists_of(&env, "/api/v1/configmaps").len(), 2);

    let cached = typed.indexer().get_by_key("default/with-fields").unwrap();
    assert!(cached.metadata.managed_fields.is_none(), "managedFields stripped");
    assert_eq!(cached.metadata.annotations.as_ref().unwrap()["seen-by"], "transform");
    let raw = dynamic.indexer().get_by_key("default/with-fields").unwrap();
    assert!(raw.metadata.managed_fields.is_none());
    factory.shutdown().await;
}

#[tokio::test]
async fn wait_for_cache_sync_timeout_names_the_informers_that_did_not_sync() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    factory.informer_for::<ConfigMap>().unwrap();
    // A typo in a group: the server answers 404 to every list, so it never syncs.
    let typo = ApiResource {
        group: "exmaple.com".into(),
        version: "v1".into(),
        api_version: "exmaple.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    factory.dynamic_informer_for(&typo, true).unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let result = factory
        .wait_for_cache_sync_timeout(&shutdown, Duration::from_millis(1500))
        .await;
    assert_eq!(
        result,
        Err(FactoryError::CacheSyncTimeout {
            timeout: Duration::from_millis(1500),
            informers: vec!["exmaple.com/v1/Widget (dynamic)".into()],
        })
    );
    assert!(result.unwrap_err().to_string().contains("exmaple.com/v1/Widget"));
    shutdown.cancel();
    let cancelled = factory
        .wait_for_cache_sync_timeout(&shutdown, Duration::from_secs(60))
        .await;
    assert!(
        matches!(cancelled, Err(FactoryError::CacheSyncCancelled { .. })),
        "{cancelled:?}"
    );
    factory.shutdown().await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_metadata_informer_caches_object_meta_alone_on_a_watch_of_its_own() {
    use factory::PartialObjectMeta;
    use informer_core::{Lister, Selector};
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let configmap = |name: &str, app: &str| {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        cm.data = Some([("payload".to_string(), "x".repeat(4096))].into());
        cm
    };
    api.create(&PostParams::default(), &configmap("a", "web"))
        .await
        .unwrap();

    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let metadata = factory.metadata_informer_for::<ConfigMap>().unwrap();
    let again = factory.informer_for::<PartialObjectMeta<ConfigMap>>().unwrap();
    let full = factory.informer_for::<ConfigMap>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert_eq!(
        synced.into_iter().collect::<Vec<_>>(),
        [
            ("v1/ConfigMap".to_string(), true),
            ("v1/ConfigMap (metadata)".to_string(), true)
        ]
    );
    assert!(again.has_synced());
    eventually("two watches: full and metadata", || {
        watches_of(&env, "/api/v1/configmaps") == 2
    })
    .await;

    // The server answered in PartialObjectMetadata (not the plain-JSON fallback).
    let cached = metadata.indexer().get_by_key("default/a").unwrap();
    assert_eq!(cached.types.as_ref().unwrap().kind, "PartialObjectMetadata");
    assert_eq!(cached.metadata.labels.as_ref().unwrap()["app"], "web");
    assert!(full.indexer().get_by_key("default/a").unwrap().data.is_some());

    // Watch events: a create, a label change, a delete.
    api.create(&PostParams::default(), &configmap("b", "db")).await.unwrap();
    let mut relabel = configmap("a", "api");
    relabel.metadata.resource_version = cached.metadata.resource_version.clone();
    api.replace("a", &PostParams::default(), &relabel).await.unwrap();
    let lister = Lister::new(metadata.indexer().clone()).namespaced("default");
    let app_api = Selector::from_iter([("app", "api")]);
    eventually("b added and a relabelled", || {
        lister.get("b").is_some() && lister.list(&app_api).len() == 1
    })
    .await;
    api.delete("b", &Default::default()).await.unwrap();
    eventually("b deleted", || lister.get("b").is_none()).await;
    assert_eq!(lister.list(&Selector::default()).len(), 1);

    shutdown.cancel();
    factory.shutdown().await;
}

/// Every typed accessor `cargo xtask codegen` generates is for a resource envtest serves: each
/// informer lists, watches and syncs (a Job created beforehand is in the Job lister). Before
/// envtest served the factory's whole list, `factory.batch().v1().jobs()` never synced.
#[tokio::test]
async fn every_generated_accessor_syncs_against_envtest() {
    use k8s_openapi::api::batch::v1::Job;
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "migrate"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .unwrap();
    Api::<Job>::namespaced(env.client(), "default")
        .create(&PostParams::default(), &job)
        .await
        .unwrap();

    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let core = factory.core().v1();
    let apps = factory.apps().v1();
    let rbac = factory.rbac().v1();
    let jobs = factory.batch().v1().jobs().unwrap();
    let started = [
        core.pods().map(|_| ()),
        core.services().map(|_| ()),
        core.configmaps().map(|_| ()),
        core.secrets().map(|_| ()),
        core.namespaces().map(|_| ()),
        core.nodes().map(|_| ()),
        core.events().map(|_| ()),
        core.endpoints().map(|_| ()),
        core.serviceaccounts().map(|_| ()),
        core.persistentvolumeclaims().map(|_| ()),
        apps.deployments().map(|_| ()),
        apps.replicasets().map(|_| ()),
        apps.statefulsets().map(|_| ()),
        apps.daemonsets().map(|_| ()),
        factory.batch().v1().cronjobs().map(|_| ()),
        factory.coordination().v1().leases().map(|_| ()),
        factory.discovery().v1().endpointslices().map(|_| ()),
        factory.events().v1().events().map(|_| ()),
        factory.networking().v1().ingresses().map(|_| ()),
        rbac.roles().map(|_| ()),
        rbac.rolebindings().map(|_| ()),
        rbac.clusterroles().map(|_| ()),
        rbac.clusterrolebindings().map(|_| ()),
        factory
            .admissionregistration()
            .v1()
            .mutatingwebhookconfigurations()
            .map(|_| ()),
        factory
            .admissionregistration()
            .v1()
            .validatingwebhookconfigurations()
            .map(|_| ()),
        factory.apiextensions().v1().customresourcedefinitions().map(|_| ()),
    ];
    assert!(started.iter().all(Result::is_ok));
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = tokio::time::timeout(Duration::from_secs(30), factory.wait_for_cache_sync(&shutdown))
        .await
        .expect("every informer syncs");
    assert_eq!(synced.len(), started.len() + 1, "{synced:?}");
    assert!(synced.values().all(|ok| *ok), "{synced:?}");
    assert!(jobs.lister().jobs("default").get("migrate").is_some());
    shutdown.cancel();
    factory.shutdown().await;
}

fn labelled(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        ..ConfigMap::default()
    }
}

fn cached_names(informer: &informer_core::SharedIndexInformer<ConfigMap>) -> Vec<String> {
    let mut names: Vec<String> = informer
        .indexer()
        .list()
        .iter()
        .filter_map(|cm| cm.metadata.name.clone())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_selector_filtered_informer_holds_only_matching_objects_and_follows_label_changes() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let factory = SharedInformerFactory::builder(client.clone())
        .by_object::<ConfigMap>(CacheOptions::default().labels("app=web").namespace("default"))
        .build();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    for (name, labels) in [("web", &[("app", "web")][..]), ("db", &[("app", "db")][..])] {
        cms.create(&PostParams::default(), &labelled(name, labels))
            .await
            .unwrap();
        other
            .create(&PostParams::default(), &labelled(name, labels))
            .await
            .unwrap();
    }
    let web = factory.informer_for::<ConfigMap>().unwrap();
    // The same options say which informer: the shared one. Other options are refused...
    assert!(
        factory
            .shared_informer_with::<ConfigMap>(CacheOptions::default())
            .is_err()
    );
    let conflict = factory.shared_informer_with::<ConfigMap>(CacheOptions::default().labels("app=db"));
    assert!(matches!(conflict.err(), Some(FactoryError::ConflictingOptions { .. })));
    // ...unless the caller asks for the informer of exactly those options.
    let every = factory.informer_for_with::<ConfigMap>(CacheOptions::default()).unwrap();
    let bad = factory.informer_for_with::<ConfigMap>(CacheOptions::default().labels("app in ("));
    assert!(matches!(bad.err(), Some(FactoryError::InvalidOptions(_))));
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert_eq!(
        synced.keys().cloned().collect::<Vec<_>>(),
        ["v1/ConfigMap", "v1/ConfigMap [labels=app=web; namespace=default]"]
    );
    assert_eq!(cached_names(&web), ["web"]);
    let unfiltered = every.indexer().list();
    let ours = unfiltered.iter().filter(|cm| cm.metadata.labels.is_some()).count();
    assert_eq!(ours, 4, "the unfiltered informer has both namespaces and both labels");
    let path = "/api/v1/namespaces/default/configmaps";
    let reads: Vec<_> = env
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == path)
        .collect();
    assert!(!reads.is_empty());
    for request in reads {
        assert_eq!(
            request.param("labelSelector").as_deref(),
            Some("app=web"),
            "{request:?}"
        );
    }

    // A label change moves an object in and out.
    let relabel = |app: &str| serde_json::json!({"metadata": {"labels": {"app": app}}});
    let patch = |name: &'static str, app: &str| {
        let (cms, body) = (cms.clone(), relabel(app));
        async move {
            cms.patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&body),
            )
            .await
            .unwrap();
        }
    };
    patch("db", "web").await;
    eventually("db moved in", || cached_names(&web) == ["db", "web"]).await;
    patch("web", "api").await;
    eventually("web moved out", || cached_names(&web) == ["db"]).await;
    shutdown.cancel();
    factory.shutdown().await;
}
