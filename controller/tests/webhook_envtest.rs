//! The Manager's webhook server called by envtest as kube-apiserver calls it: the configurations
//! generated from the registered webhooks (caBundle = the test CA, so envtest verifies TLS),
//! a denied create reaching the client with kube-apiserver's message, a mutating webhook's
//! patch applied to the stored object, and a two-version CRD converted through `/convert`.

mod common;
mod webhook_support;

use std::net::SocketAddr;
use std::time::Duration;

use common::eventually;
use controller::Manager;
use controller::webhook::{
    Conversion, MutatingWebhook, ValidatingWebhook, Verdict, WebhookClient, WebhookServerConfig,
};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, PostParams};
use kube::core::admission::AdmissionRequest;
use tokio_util::sync::CancellationToken;
use webhook_support::{Pki, TempDir, v1, v1alpha1};

async fn validate_replicas(req: AdmissionRequest<v1::Foo>) -> Verdict {
    match req.object.as_ref().map(|object| object.spec.replicas) {
        Some(n) if !(0..=10).contains(&n) => Verdict::denied(format!("spec.replicas {n} is not within 0..=10")),
        _ => Verdict::allowed(),
    }
}

async fn default_team(mut object: v1::Foo, _req: AdmissionRequest<v1::Foo>) -> Result<v1::Foo, Verdict> {
    object
        .metadata
        .labels
        .get_or_insert_default()
        .entry("team".into())
        .or_insert_with(|| "core".into());
    Ok(object)
}

#[tokio::test]
async fn envtest_calls_the_managers_webhooks() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let dir = TempDir::new();
    let pki = Pki::write(&dir.0, "webhook CA");
    let manager = Manager::builder(client.clone())
        .no_http_servers()
        .webhook_server(
            WebhookServerConfig::default()
                .addr(SocketAddr::from(([127, 0, 0, 1], 0)))
                .cert_dir(&dir.0),
        )
        .build()
        .unwrap();
    let webhooks = manager.webhook_server().unwrap().clone();
    webhooks
        .register_validating(ValidatingWebhook::new(validate_replicas))
        .unwrap();
    webhooks.register_mutating(MutatingWebhook::new(default_team)).unwrap();
    webhooks
        .register_conversion(Conversion::<v1::Foo>::new().spoke::<v1alpha1::Foo>())
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(manager.run(stop.clone()));

    // The CRD in two versions, v1 stored, converted by the webhook server.
    let target = WebhookClient::url(format!("https://{}", webhooks.local_addr()));
    let ca_bundle = pki.ca_pem.as_bytes();
    let mut crd = kube::core::crd::merge_crds(vec![v1::Foo::crd(), v1alpha1::Foo::crd()], "v1").unwrap();
    crd.spec.conversion = Some(webhooks.crd_conversion(&target, ca_bundle));
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    let foos: Api<v1::Foo> = Api::namespaced(client.clone(), "default");
    eventually(Duration::from_secs(10), "Foo is served", || {
        let foos = foos.clone();
        async move { foos.list(&Default::default()).await.is_ok() }
    })
    .await;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &webhooks.validating_webhook_configuration("foo-validation", &target, ca_bundle),
        )
        .await
        .unwrap();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &webhooks.mutating_webhook_configuration("foo-defaults", &target, ca_bundle),
        )
        .await
        .unwrap();

    // Denied by the validating webhook, with kube-apiserver's message.
    let invalid = v1::Foo::new(
        "too-many",
        v1::FooSpec {
            replicas: 50,
            image: None,
        },
    );
    match foos.create(&PostParams::default(), &invalid).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert_eq!(
                status.message,
                "admission webhook \"vfoo-v1.webhook.kinformer.dev\" denied the request: spec.replicas 50 is not within 0..=10"
            );
        }
        other => panic!("expected the webhook's denial, got {other:?}"),
    }

    // Admitted, defaulted by the mutating webhook.
    let created = foos
        .create(
            &PostParams::default(),
            &v1::Foo::new(
                "fine",
                v1::FooSpec {
                    replicas: 3,
                    image: None,
                },
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        created
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("team"))
            .map(String::as_str),
        Some("core")
    );

    // The same object read as v1alpha1 goes through `/convert`, and a v1alpha1 write comes back
    // to v1 through it.
    let alphas: Api<v1alpha1::Foo> = Api::namespaced(client.clone(), "default");
    let alpha = alphas.get("fine").await.unwrap();
    assert_eq!(alpha.spec.size, "3");
    let written = alphas
        .create(
            &PostParams::default(),
            &v1alpha1::Foo::new("from-alpha", v1alpha1::FooSpec { size: "7".into() }),
        )
        .await
        .unwrap();
    assert_eq!(written.spec.size, "7");
    assert_eq!(foos.get("from-alpha").await.unwrap().spec.replicas, 7);

    stop.cancel();
    run.await.unwrap().unwrap();
}
