//! The sample-controller's webhooks on the demo's path over envtest: the Manager serves them
//! with the demo's certificates ([`DemoCertificates`]), [`webhooks::install`] registers them
//! with the API server, and a `kube::Client` sees what a user would: the validating webhook's
//! denial as kube-apiserver words it, the mutating webhook's default label, and a Foo written
//! in `v1alpha1` (`spec.size`) read back in `v1` (`spec.replicas`) and the other way round,
//! reconciled by the controller in `v1`, and a `v1alpha1` write admitted by the `v1` webhooks.

// The resource is called Foo, as upstream: `foo` names one, not a placeholder.
#![allow(clippy::disallowed_names)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use examples::sample_controller::webhooks::{self, DemoCertificates, v1alpha1};
use examples::sample_controller::{self, Foo, FooSpec};
use k8s_openapi::api::apps::v1::Deployment;
use kinformer::controller::Manager;
use kinformer::controller::webhook::WebhookServerConfig;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

async fn eventually<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn foo(name: &str, replicas: i32) -> Foo {
    Foo::new(
        name,
        FooSpec {
            deployment_name: name.into(),
            replicas: Some(replicas),
        },
    )
}

fn managed_by(foo: &Foo) -> Option<&str> {
    foo.labels().get(webhooks::MANAGED_BY_LABEL).map(String::as_str)
}

/// The `v1alpha1` Foo `name` as the API server sends it (untyped, so a `spec.replicas` left
/// in it would show).
async fn alpha_json(client: &Client, name: &str) -> serde_json::Value {
    let gvk = GroupVersionKind::gvk("samplecontroller.k8s.io", "v1alpha1", "Foo");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let object = api.get(name).await.unwrap();
    assert_eq!(
        object.types.as_ref().map(|t| t.api_version.as_str()),
        Some("samplecontroller.k8s.io/v1alpha1")
    );
    object.data
}

#[tokio::test]
async fn the_demos_webhooks_deny_default_and_convert_foos() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let certificates =
        DemoCertificates::generate(std::env::temp_dir().join(format!("sample-webhooks-test-{}", std::process::id())))
            .unwrap();
    let mut manager = Manager::builder(client.clone())
        .no_http_servers()
        .webhook_server(
            WebhookServerConfig::default()
                .addr(SocketAddr::from(([127, 0, 0, 1], 0)))
                .cert_dir(certificates.dir()),
        )
        .build()
        .unwrap();
    let server = manager.webhook_server().unwrap().clone();
    webhooks::register(&server).unwrap();
    webhooks::install(&client, &server, certificates.ca_bundle())
        .await
        .unwrap();
    manager.add(sample_controller::controller(&manager, |inner| inner).unwrap());
    let status = manager.status();
    let stop = CancellationToken::new();
    let run = tokio::spawn(manager.run(stop.clone()));
    // The webhook server starts before the caches sync.
    eventually("the manager's caches to sync", || async { status.is_ready() }).await;

    // Denied by the validating webhook, in kube-apiserver's words; the bounds are admitted.
    let foos: Api<Foo> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    for replicas in [11, -1] {
        match foos.create(&pp, &foo("out-of-range", replicas)).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403, "{status:?}");
                assert_eq!(
                    status.message,
                    format!(
                        "admission webhook \"vfoo-v1.samplecontroller.k8s.io\" denied the request: \
                         spec.replicas must be between 0 and 10, got {replicas}"
                    )
                );
            }
            other => panic!("{replicas} replicas: expected the webhook's denial, got {other:?}"),
        }
    }
    assert!(foos.get_opt("out-of-range").await.unwrap().is_none());

    // Defaulted by the mutating webhook; a label the user set is kept.
    let ten = foos.create(&pp, &foo("ten", 10)).await.unwrap();
    assert_eq!(managed_by(&ten), Some(webhooks::MANAGED_BY));
    let mut own = foo("own-label", 0);
    own.metadata.labels = Some([(webhooks::MANAGED_BY_LABEL.to_owned(), "me".to_owned())].into());
    assert_eq!(managed_by(&foos.create(&pp, &own).await.unwrap()), Some("me"));
    // An update out of range is denied as well.
    let too_many = foos
        .patch(
            "ten",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 12}})),
        )
        .await;
    assert!(
        matches!(&too_many, Err(kube::Error::Api(s)) if s.code == 403 && s.message.ends_with("got 12")),
        "{too_many:?}"
    );

    // Written in v1alpha1 (`spec.size`), read in v1 (`spec.replicas`) and reconciled in v1.
    let alphas: Api<v1alpha1::Foo> = Api::namespaced(client.clone(), "default");
    let alpha = v1alpha1::Foo::new(
        "alpha",
        v1alpha1::FooSpec {
            deployment_name: "alpha-web".into(),
            size: Some(4),
        },
    );
    let created = alphas.create(&pp, &alpha).await.unwrap();
    assert_eq!(created.spec.size, Some(4));
    // The webhooks are registered for v1; the API server calls them for a v1alpha1 write too
    // (`matchPolicy: Equivalent`), with the object converted to v1.
    let mut too_big = alpha.clone();
    too_big.metadata.name = Some("too-big".into());
    too_big.spec.size = Some(11);
    match alphas.create(&pp, &too_big).await {
        Err(kube::Error::Api(status)) => assert_eq!(
            status.message,
            "admission webhook \"vfoo-v1.samplecontroller.k8s.io\" denied the request: \
             spec.replicas must be between 0 and 10, got 11"
        ),
        other => panic!("a v1alpha1 Foo of size 11: expected the webhook's denial, got {other:?}"),
    }
    assert_eq!(
        created.labels().get(webhooks::MANAGED_BY_LABEL).map(String::as_str),
        Some(webhooks::MANAGED_BY)
    );
    let hub = foos.get("alpha").await.unwrap();
    assert_eq!(
        (hub.spec.deployment_name.as_str(), hub.spec.replicas),
        ("alpha-web", Some(4))
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    eventually("the controller's Deployment for Foo alpha", || async {
        let deployment = deployments.get_opt("alpha-web").await.unwrap();
        deployment.and_then(|d| d.spec?.replicas) == Some(4)
    })
    .await;

    // Changed in v1, read in v1alpha1: the field is `size` there, and `replicas` is not.
    foos.patch(
        "alpha",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 6}})),
    )
    .await
    .unwrap();
    assert_eq!(alphas.get("alpha").await.unwrap().spec.size, Some(6));
    assert_eq!(
        alpha_json(&client, "alpha").await["spec"],
        serde_json::json!({"deploymentName": "alpha-web", "size": 6})
    );
    // The controller's writes (finalizer, status) went through the mutating webhook too.
    eventually("Foo alpha to be labelled and reconciled", || async {
        let hub = foos.get("alpha").await.unwrap();
        managed_by(&hub) == Some(webhooks::MANAGED_BY) && hub.status.is_some_and(|s| s.available_replicas == 0)
    })
    .await;

    stop.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}
