//! Typed informers over envtest: a derived CRD type's lister serves namespace-scoped list/get
//! from the cache, the generated built-in accessors share the factory's informer, and the
//! typed and generic ways of asking for an informer give the same one (one watch).

use std::time::Duration;

use examples::{Foo, FooSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer::cache::Selector;
use kinformer::factory::SharedInformerFactory;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn derived_crd_lister_answers_namespaced_list_and_get_from_the_cache() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    for crd in examples::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let client = env.client();
    eventually("Foo is served", || {
        let api: Api<Foo> = Api::all(client.clone());
        async move { api.list(&Default::default()).await.is_ok() }
    })
    .await;
    for (ns, name, replicas) in [("default", "a", 1), ("default", "b", 2), ("kube-system", "c", 3)] {
        let api: Api<Foo> = Api::namespaced(env.client(), ns);
        let foo = Foo::new(
            name,
            FooSpec {
                replicas,
                image: "nginx".into(),
            },
        );
        api.create(&PostParams::default(), &foo).await.unwrap();
    }

    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let typed = Foo::informer(&factory).unwrap();
    let generic = factory.informer_for::<Foo>().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    assert!(factory.wait_for_cache_sync(&shutdown).await.values().all(|ok| *ok));
    assert!(typed.has_synced() && generic.has_synced());

    let lister = typed.lister();
    assert_eq!(lister.list(&Selector::default()).len(), 3);
    let default_ns = lister.foos("default");
    let mut names: Vec<_> = default_ns
        .list(&Selector::default())
        .iter()
        .map(|f| f.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, [Some("a".to_string()), Some("b".to_string())]);
    assert_eq!(default_ns.get("b").unwrap().spec.replicas, 2);
    assert!(default_ns.get("c").is_none(), "c lives in kube-system");
    assert_eq!(lister.foos("kube-system").get("c").unwrap().spec.replicas, 3);

    let foo_watches = env
        .requests()
        .iter()
        .filter(|r| r.is_watch && r.path.ends_with("/foos"))
        .count();
    assert_eq!(foo_watches, 1, "typed and generic requests share one informer");
    factory.shutdown().await;
}

#[tokio::test]
async fn generated_built_in_accessors_return_the_shared_informer() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let api: Api<Deployment> = Api::namespaced(env.client(), "default");
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &deployment).await.unwrap();

    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let deployments = factory.apps().v1().deployments().unwrap();
    let again = factory.informer_for::<Deployment>().unwrap();
    let pods = factory.core().v1().pods().unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert_eq!(synced.len(), 2, "{synced:?}");
    assert!(again.has_synced() && pods.has_synced());
    let web = deployments.lister().deployments("default").get("web").unwrap();
    assert_eq!(web.metadata.labels.as_ref().unwrap()["app"], "web");
    let selector: Selector = kinformer::cache::Expression::Equal("app".into(), "web".into()).into();
    assert_eq!(deployments.lister().list(&selector).len(), 1);
    assert_eq!(
        env.requests()
            .iter()
            .filter(|r| r.is_watch && r.path == "/apis/apps/v1/deployments")
            .count(),
        1
    );
    factory.shutdown().await;
}
