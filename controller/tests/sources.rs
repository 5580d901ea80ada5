//! Sources over envtest: per-source predicates, every owner, metadata-only children, and
//! external triggers.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Widget, WidgetSpec, configmap, envtest_with_factory, envtest_with_widgets, eventually};
use controller::predicate::LabelSelectorPredicate;
use controller::{Action, Context, Controller, ObjectKey, Request, SourceOptions, reconciler_fn};
use factory::{PartialObjectMeta, SharedInformerFactory};
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

/// The `Accept` of a metadata-only list and watch, as informer-core's listwatch sends them.
const ACCEPT_METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const ACCEPT_METADATA: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

/// Reconciles per key.
type Counts = Arc<Mutex<HashMap<String, usize>>>;

fn counting(counts: &Counts) -> impl controller::Reconciler<Widget> {
    let counts = counts.clone();
    reconciler_fn(move |req: Request, _ctx: Context<Widget>| {
        *counts.lock().unwrap().entry(req.name).or_default() += 1;
        async { Ok::<_, std::convert::Infallible>(Action::Done) }
    })
}

fn n(counts: &Counts, name: &str) -> usize {
    counts.lock().unwrap().get(name).copied().unwrap_or(0)
}

async fn until(counts: &Counts, name: &str, at_least: usize) {
    eventually(WAIT, &format!("{name} reconciled {at_least} times"), || {
        let ok = n(counts, name) >= at_least;
        async move { ok }
    })
    .await;
}

fn owner(widget: &Widget, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: Widget::api_version(&()).into_owned(),
        kind: Widget::kind(&()).into_owned(),
        name: widget.name_any(),
        uid: widget.metadata.uid.clone().unwrap_or_default(),
        controller: Some(controller),
        block_owner_deletion: None,
    }
}

async fn widgets(client: &kube::Client, names: &[&str]) -> Vec<Widget> {
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let mut made = Vec::new();
    for name in names {
        made.push(
            api.create(&PostParams::default(), &Widget::new(name, WidgetSpec { size: 1 }))
                .await
                .unwrap(),
        );
    }
    made
}

async fn child(client: &kube::Client, name: &str, owners: Vec<OwnerReference>, labels: &[(&str, &str)]) {
    let mut cm = configmap("default", name, "1");
    cm.metadata.owner_references = Some(owners);
    cm.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm).await.unwrap();
}

#[tokio::test]
async fn a_predicate_on_owns_filters_the_children_and_not_the_primary() {
    let env = envtest_with_widgets().await;
    let client = env.client();
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let counts = Counts::default();
    let wake = LabelSelectorPredicate::parse("wake=yes").unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("owns-filtered", &factory)
            .for_resource::<Widget>()
            .owns_with(SourceOptions::<ConfigMap>::new().predicate(wake))
            .run(counting(&counts), shutdown.clone()),
    );
    let made = widgets(&client, &["quiet", "loud"]).await;
    until(&counts, "quiet", 1).await;
    until(&counts, "loud", 1).await;

    // The primary has no `wake` label: its own changes still reconcile it.
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let spec = serde_json::json!({"spec": {"size": 2}});
    api.patch("quiet", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    until(&counts, "quiet", 2).await;

    // A child without the label wakes nobody; one with it, notified after it by the same
    // informer, wakes its owner: once that happened, the first was filtered.
    child(&client, "quiet-child", vec![owner(&made[0], true)], &[]).await;
    child(&client, "loud-child", vec![owner(&made[1], true)], &[("wake", "yes")]).await;
    until(&counts, "loud", 2).await;
    assert_eq!(n(&counts, "quiet"), 2, "{counts:?}");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn owns_enqueues_every_owner_of_the_primary_kind_when_asked() {
    let env = envtest_with_widgets().await;
    let client = env.client();
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let (every, only) = (Counts::default(), Counts::default());
    let shutdown = CancellationToken::new();
    let runs = [
        tokio::spawn(
            Controller::new("every-owner", &factory)
                .for_resource::<Widget>()
                .owns_with(SourceOptions::<ConfigMap>::new().every_owner())
                .run(counting(&every), shutdown.clone()),
        ),
        tokio::spawn(
            Controller::new("controller-owner", &factory)
                .for_resource::<Widget>()
                .owns::<ConfigMap>()
                .run(counting(&only), shutdown.clone()),
        ),
    ];
    let made = widgets(&client, &["boss", "peer"]).await;
    for counts in [&every, &only] {
        until(counts, "boss", 1).await;
        until(counts, "peer", 1).await;
    }
    child(
        &client,
        "shared",
        vec![owner(&made[0], true), owner(&made[1], false)],
        &[],
    )
    .await;
    until(&every, "boss", 2).await;
    until(&every, "peer", 2).await;
    until(&only, "boss", 2).await;
    // The controller-owner controller got the same notification before the next: a second
    // child of `boss` alone, once reconciled, shows `peer` was not enqueued.
    child(&client, "second", vec![owner(&made[0], true)], &[]).await;
    until(&only, "boss", 3).await;
    assert_eq!(n(&only, "peer"), 1, "{only:?}");
    shutdown.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    env.shutdown().await;
}

#[tokio::test]
async fn a_trigger_reconciles_every_cached_primary_once_and_a_key_trigger_its_key() {
    let env = envtest_with_widgets().await;
    let client = env.client();
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let counts = Counts::default();
    let (all_tx, all_rx) = mpsc::unbounded::<()>();
    let (key_tx, key_rx) = mpsc::unbounded::<ObjectKey>();
    widgets(&client, &["a", "b", "c"]).await;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("triggered", &factory)
            .for_resource::<Widget>()
            .reconcile_all_on(all_rx)
            .reconcile_on(key_rx)
            .run(counting(&counts), shutdown.clone()),
    );
    for name in ["a", "b", "c"] {
        until(&counts, name, 1).await;
    }
    all_tx.unbounded_send(()).unwrap();
    for name in ["a", "b", "c"] {
        until(&counts, name, 2).await;
    }
    key_tx.unbounded_send(ObjectKey::namespaced("default", "b")).unwrap();
    until(&counts, "b", 3).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen: Vec<usize> = ["a", "b", "c"].iter().map(|name| n(&counts, name)).collect();
    assert_eq!(seen, [2, 3, 2], "each primary once per signal");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn metadata_children_wake_their_owner_without_a_typed_cache_of_them() {
    let env = envtest_with_widgets().await;
    let client = env.client();
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let counts = Counts::default();
    let children_seen = Arc::new(Mutex::new(Vec::<(usize, bool)>::new()));
    let reconciler = {
        let (counts, children_seen) = (counts.clone(), children_seen.clone());
        reconciler_fn(move |req: Request, ctx: Context<Widget>| {
            *counts.lock().unwrap().entry(req.name.clone()).or_default() += 1;
            let children = ctx
                .lister_for::<PartialObjectMeta<ConfigMap>>()
                .map(|l| l.list(&Default::default()).len());
            children_seen
                .lock()
                .unwrap()
                .push((children.unwrap_or(usize::MAX), ctx.lister_for::<ConfigMap>().is_ok()));
            async { Ok::<_, std::convert::Infallible>(Action::Done) }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("metadata-children", &factory)
            .for_resource::<Widget>()
            .owns_metadata::<ConfigMap>()
            .run(reconciler, shutdown.clone()),
    );
    let made = widgets(&client, &["parent"]).await;
    until(&counts, "parent", 1).await;
    child(&client, "kid", vec![owner(&made[0], true)], &[]).await;
    until(&counts, "parent", 2).await;
    let (children, typed_cache) = *children_seen.lock().unwrap().last().unwrap();
    assert!(children >= 1 && !typed_cache, "{children_seen:?}");
    // Only the metadata informer of ConfigMaps exists: nothing decoded whole ConfigMaps.
    let informers: Vec<String> = factory.informer_stats().into_iter().map(|s| s.informer).collect();
    assert!(
        informers.iter().any(|i| i == "v1/ConfigMap (metadata)"),
        "{informers:?}"
    );
    assert!(!informers.iter().any(|i| i == "v1/ConfigMap"), "{informers:?}");
    // On the wire: the ConfigMaps' list and watch asked for `PartialObjectMetadata`, the typed
    // primary's did not.
    let requests = env.requests();
    let accepts = |path: &str, watch: bool| -> Vec<String> {
        let of = requests
            .iter()
            .filter(|r| r.method == "GET" && r.path == path && r.is_watch == watch);
        let accepts: Vec<String> = of.map(|r| r.accept.clone()).collect();
        assert!(!accepts.is_empty(), "no {path} (watch: {watch}) in {requests:#?}");
        accepts
    };
    for accept in accepts("/api/v1/configmaps", false) {
        assert_eq!(accept, ACCEPT_METADATA_LIST);
    }
    for accept in accepts("/api/v1/configmaps", true) {
        assert_eq!(accept, ACCEPT_METADATA);
    }
    for watch in [false, true] {
        for accept in accepts("/apis/test.kinformer.dev/v1/widgets", watch) {
            assert!(
                !accept.contains("PartialObjectMetadata"),
                "typed widgets asked for {accept}"
            );
        }
    }
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn a_key_with_a_namespace_finds_a_cluster_scoped_primary() {
    use k8s_openapi::api::core::v1::Namespace;
    let (env, factory) = envtest_with_factory().await;
    let found: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let reconciler = {
        let found = found.clone();
        reconciler_fn(move |req: Request, ctx: Context<Namespace>| {
            found
                .lock()
                .unwrap()
                .push((req.to_string(), ctx.get(&req).expect("decodes").is_some()));
            async { Ok::<_, std::convert::Infallible>(Action::Done) }
        })
    };
    let (key_tx, key_rx) = mpsc::unbounded::<ObjectKey>();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("namespaces", &factory)
            .for_resource::<Namespace>()
            .reconcile_on(key_rx)
            .run(reconciler, shutdown.clone()),
    );
    // As a mapper from a namespaced object would give it: the object's namespace included.
    key_tx
        .unbounded_send(ObjectKey::namespaced("some-ns", "default"))
        .unwrap();
    eventually(WAIT, "the namespaced key reconciled", || {
        let seen = found.lock().unwrap().iter().any(|(key, _)| key == "some-ns/default");
        async move { seen }
    })
    .await;
    let lookups = found.lock().unwrap().clone();
    assert!(
        lookups
            .iter()
            .filter(|(key, _)| key == "some-ns/default")
            .all(|(_, exists)| *exists),
        "{lookups:?}"
    );
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn a_sharded_controller_refuses_dynamic_children() {
    let (env, factory) = envtest_with_factory().await;
    let secrets = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    let built = Controller::new("sharded-dynamic", &factory)
        .sharded(controller::sharding::ShardingConfig::new("configmaps", "shard-0"))
        .for_resource::<ConfigMap>()
        .owns_dynamic(&secrets, true)
        .build(reconciler_fn(|_req, _ctx: Context<ConfigMap>| async {
            Ok::<_, std::convert::Infallible>(Action::Done)
        }));
    match built {
        Err(controller::ControllerError::InvalidConfig(message)) => {
            assert!(message.contains("owns_dynamic(Secret)"), "{message}");
        }
        Err(other) => panic!("expected InvalidConfig, got {other}"),
        Ok(_) => panic!("a sharded controller with dynamic children was built"),
    }
    env.shutdown().await;
}
