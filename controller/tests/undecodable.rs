//! A primary object that does not decode as the controller's type is never reconciled as
//! deleted (issue #24): `ctx.get` is an `UndecodableObject` error, the worker's error path
//! (logged with controller and key, handed to the error policy) takes it, and the informer's
//! `kinformer_informer_undecodable_objects` gauge counts it, until a decodable version arrives
//! and is reconciled normally.
//!
//! A mark notifies no handler, so what reconciles the key here is the reconciler's own
//! periodic requeue (as a trigger, an owned object or a resync would).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Widget, eventually, gather};
use controller::outcome::find_in_chain;
use controller::{Action, BoxError, Context, Controller, InformerCollector, Request, UndecodableObject, reconciler_fn};
use factory::SharedInformerFactory;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

fn widgets(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("test.kinformer.dev", "v1", "Widget"));
    Api::namespaced_with(client.clone(), "default", &resource)
}

#[tokio::test]
async fn an_undecodable_primary_is_a_typed_error_never_a_delete_and_reconciles_once_it_decodes() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(
            &PostParams::default(),
            &envtest::fixtures::open_spec_crd("test.kinformer.dev", "Widget", "widgets"),
        )
        .await
        .unwrap();
    eventually(WAIT, "widgets served", || {
        let api = widgets(&client);
        async move { api.list(&Default::default()).await.is_ok() }
    })
    .await;
    let bad: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "test.kinformer.dev/v1", "kind": "Widget",
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {"size": 1},
    }))
    .unwrap();
    widgets(&client).create(&PostParams::default(), &bad).await.unwrap();

    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    // What each reconcile of `bad` read: `size N`, `absent` or the error's text.
    let reads: Arc<Mutex<Vec<String>>> = Arc::default();
    // What the error policy was handed.
    let policy_saw: Arc<Mutex<Vec<UndecodableObject>>> = Arc::default();
    let reconciler = {
        let reads = reads.clone();
        reconciler_fn(move |req: Request, ctx: Context<Widget>| {
            let reads = reads.clone();
            async move {
                let read = ctx.get(&req);
                reads.lock().unwrap().push(match &read {
                    Ok(Some(widget)) => format!("size {}", widget.spec.size),
                    Ok(None) => "absent".to_string(),
                    Err(e) => e.to_string(),
                });
                let Some(_widget) = read? else {
                    return Ok::<_, BoxError>(Action::Done);
                };
                // Polls, so the key is reconciled again after it stops decoding.
                Ok(Action::RequeueAfter(Duration::from_millis(50)))
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("widgets", &factory)
            .for_resource::<Widget>()
            .error_policy({
                let policy_saw = policy_saw.clone();
                move |e, _req, _ctx| {
                    if let Some(undecodable) = find_in_chain::<UndecodableObject>(e) {
                        policy_saw.lock().unwrap().push(undecodable.clone());
                    }
                    Action::Requeue
                }
            })
            .run(reconciler, shutdown.clone()),
    );

    eventually(WAIT, "reconciled while it decodes", || {
        let done = reads.lock().unwrap().contains(&"size 1".to_string());
        async move { done }
    })
    .await;
    let big = serde_json::json!({"spec": {"size": "big"}});
    widgets(&client)
        .patch("bad", &PatchParams::default(), &Patch::Merge(&big))
        .await
        .unwrap();
    eventually(WAIT, "the error policy got the undecodable primary", || {
        let seen = !policy_saw.lock().unwrap().is_empty();
        async move { seen }
    })
    .await;
    let error = policy_saw.lock().unwrap()[0].clone();
    assert_eq!((error.kind.as_str(), error.key.as_str()), ("Widget", "default/bad"));
    assert_eq!(error.reason, "invalid type");
    assert!(!error.resource_version.is_empty());
    assert!(error.to_string().contains("Widget default/bad"), "{error}");

    // The informer's gauge counts it, as the Manager exports it on /metrics.
    let registry = prometheus::Registry::new();
    let stats_factory = factory.clone();
    registry
        .register(Box::new(
            InformerCollector::new(Arc::new(move || stats_factory.informer_stats())).unwrap(),
        ))
        .unwrap();
    let text = gather(&registry);
    let series = text
        .lines()
        .find(|l| l.starts_with("kinformer_informer_undecodable_objects{"))
        .unwrap_or_else(|| panic!("no undecodable series in:\n{text}"));
    assert!(series.contains(r#"reason="invalid type""#), "{series}");
    assert!(series.ends_with(" 1"), "{series}");

    // A decodable version is reconciled normally; the mark and its series are gone.
    let patch = serde_json::json!({"spec": {"size": 3}});
    widgets(&client)
        .patch("bad", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(WAIT, "reconciled with the good version", || {
        let done = reads.lock().unwrap().contains(&"size 3".to_string());
        async move { done }
    })
    .await;
    let reads = reads.lock().unwrap().clone();
    assert!(
        !reads.contains(&"absent".to_string()),
        "never read as deleted: {reads:?}"
    );
    assert!(reads.iter().any(|r| r.contains("does not decode")), "{reads:?}");
    let text = gather(&registry);
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("kinformer_informer_undecodable_objects{")),
        "no series left:\n{text}"
    );
    shutdown.cancel();
    run.await.unwrap().unwrap();
}
