// Included twice by `tests/undecodable.rs`, once per queue kind (`QUEUE`).
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::eventually;
use informer_core::{
    ApiListerWatcher, InformerConfig, Lister, Lookup, ReflectorMetrics, ResourceEventHandlerFuncs, SharedIndexInformer,
};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// The Rust view of a gadget: `spec.size` must be an i32.
#[derive(Clone, Debug, Deserialize)]
struct Gadget {
    metadata: ObjectMeta,
    spec: GadgetSpec,
}

#[derive(Clone, Debug, Deserialize)]
struct GadgetSpec {
    size: i32,
}

impl Resource for Gadget {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Gadget".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "test.kinformer.dev".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "gadgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Writes gadgets as JSON, whatever their spec.
fn gadgets(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("test.kinformer.dev", "v1", "Gadget"));
    Api::namespaced_with(client.clone(), "default", &resource)
}

async fn envtest_with_gadgets() -> envtest::Server {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    Api::<CustomResourceDefinition>::all(env.client())
        .create(&PostParams::default(), &envtest::fixtures::open_spec_crd("test.kinformer.dev", "Gadget", "gadgets"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while gadgets(&env.client()).list(&Default::default()).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "gadgets never served");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    env
}

async fn create(client: &kube::Client, name: &str, size: serde_json::Value) {
    let gadget: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "test.kinformer.dev/v1", "kind": "Gadget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": size},
    }))
    .unwrap();
    gadgets(client).create(&PostParams::default(), &gadget).await.unwrap();
}

async fn set_size(client: &kube::Client, name: &str, size: serde_json::Value) {
    let patch = serde_json::json!({"spec": {"size": size}});
    gadgets(client)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// What handlers were told, in order: `add a`, `update a`, `delete a`.
type Seen = Arc<Mutex<Vec<String>>>;

struct Running {
    informer: SharedIndexInformer<Gadget>,
    seen: Seen,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn start(client: &kube::Client) -> Running {
        let informer = SharedIndexInformer::new(
            ApiListerWatcher::new(Api::<Gadget>::namespaced(client.clone(), "default")),
            InformerConfig::default().queue(QUEUE),
        );
        let seen: Seen = Arc::default();
        let (a, u, d) = (seen.clone(), seen.clone(), seen.clone());
        let registration = informer
            .add_event_handler(
                ResourceEventHandlerFuncs::new()
                    .on_add(move |g: &Arc<Gadget>, _| a.lock().unwrap().push(format!("add {}", name(g))))
                    .on_update(move |_, g| u.lock().unwrap().push(format!("update {}", name(g))))
                    .on_delete(move |g| d.lock().unwrap().push(format!("delete {}", name(g.object())))),
            )
            .unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (informer, shutdown) = (informer.clone(), shutdown.clone());
            async move { informer.run(shutdown).await }
        });
        let synced = tokio::time::timeout(Duration::from_secs(20), informer.wait_for_cache_sync(&shutdown)).await;
        assert_eq!(synced.ok(), Some(true), "informer did not sync");
        eventually("the handler got the initial list", || registration.has_synced()).await;
        Running {
            informer,
            seen,
            shutdown,
            task,
        }
    }

    fn lister(&self) -> informer_core::NamespaceLister<Gadget> {
        Lister::new(self.informer.indexer().clone()).namespaced("default")
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// Forces a relist (the next watch is answered 410 and open watches close), then writes a
    /// sentinel object and waits for its add: every queued item of the relist is applied by
    /// then, on either queue.
    async fn relist(&self, env: &envtest::Server, sentinel: &str) {
        let lists = ReflectorMetrics::get(&self.informer.reflector_metrics().lists);
        env.faults().expire_next_watches(1);
        env.faults().close_watches();
        eventually("relisted", || {
            ReflectorMetrics::get(&self.informer.reflector_metrics().lists) > lists
        })
        .await;
        create(&env.client(), sentinel, serde_json::json!(1)).await;
        let expected = format!("add {sentinel}");
        eventually("the sentinel's add", || self.seen().contains(&expected)).await;
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap();
    }
}

fn name(g: &Gadget) -> String {
    g.metadata.name.clone().unwrap_or_default()
}

fn undecodable_metric(informer: &SharedIndexInformer<Gadget>) -> BTreeMap<&'static str, u64> {
    informer.stats().undecodable_objects
}

#[tokio::test]
async fn an_object_that_never_decoded_is_known_undecodable_survives_a_relist_and_is_replaced_by_a_good_version() {
    let env = envtest_with_gadgets().await;
    let client = env.client();
    create(&client, "good", serde_json::json!(1)).await;
    create(&client, "bad", serde_json::json!("big")).await;
    let running = Running::start(&client).await;

    // Synced, and the bad object is present but undecodable, not absent.
    assert!(running.informer.has_synced());
    match running.lister().lookup("bad") {
        Lookup::Undecodable {
            undecodable,
            last_decoded,
            ..
        } => {
            assert_eq!(undecodable.reason, "invalid type");
            assert!(undecodable.error.contains("big"), "{}", undecodable.error);
            assert!(!undecodable.resource_version.is_empty());
            assert!(last_decoded.is_none(), "never decoded");
        }
        other => panic!("bad: expected undecodable, got {other:?}"),
    }
    assert!(matches!(running.lister().lookup("good"), Lookup::Found(_)));
    assert!(running.lister().lookup("missing").is_absent());
    let marked: Vec<String> = running.lister().undecodable().into_iter().map(|(k, _)| k).collect();
    assert_eq!(marked, ["default/bad"]);
    assert_eq!(undecodable_metric(&running.informer), BTreeMap::from([("invalid type", 1)]));

    // A relist that still cannot decode it emits no delete and keeps it marked.
    running.relist(&env, "sentinel").await;
    assert!(running.lister().lookup("bad").is_undecodable());
    assert_eq!(undecodable_metric(&running.informer), BTreeMap::from([("invalid type", 1)]));

    // A good version replaces the mark and reaches handlers as an add (never decoded before).
    set_size(&client, "bad", serde_json::json!(3)).await;
    eventually("the good version is cached", || {
        matches!(running.lister().lookup("bad"), Lookup::Found(g) if g.spec.size == 3)
    })
    .await;
    assert!(running.lister().undecodable().is_empty());
    assert!(undecodable_metric(&running.informer).is_empty());
    // The cache is written before the handlers' drain runs: wait for the add to reach them.
    eventually("the good version's add reaches the handler", || {
        running.seen().contains(&"add bad".to_string())
    })
    .await;
    let seen = running.seen();
    assert!(seen.contains(&"add bad".to_string()), "{seen:?}");
    assert!(!seen.iter().any(|s| s.starts_with("delete")), "no delete reached a handler: {seen:?}");
    running.stop().await;
}

#[tokio::test]
async fn a_decoded_object_updated_to_an_undecodable_version_keeps_its_last_good_version_until_deleted() {
    let env = envtest_with_gadgets().await;
    let client = env.client();
    create(&client, "flip", serde_json::json!(1)).await;
    let running = Running::start(&client).await;
    assert!(matches!(running.lister().lookup("flip"), Lookup::Found(g) if g.spec.size == 1));

    set_size(&client, "flip", serde_json::json!("big")).await;
    eventually("flip marked undecodable", || running.lister().lookup("flip").is_undecodable()).await;
    let Lookup::Undecodable { last_decoded, .. } = running.lister().lookup("flip") else {
        unreachable!()
    };
    assert_eq!(last_decoded.map(|g| g.spec.size), Some(1), "the last good version");
    assert_eq!(running.lister().get("flip").map(|g| g.spec.size), Some(1), "still listed");
    assert_eq!(running.lister().list(&Default::default()).len(), 1);
    assert_eq!(undecodable_metric(&running.informer), BTreeMap::from([("invalid type", 1)]));

    running.relist(&env, "sentinel").await;
    assert!(running.lister().lookup("flip").is_undecodable());
    assert_eq!(running.lister().get("flip").map(|g| g.spec.size), Some(1));
    assert_eq!(running.seen(), ["add flip", "add sentinel"], "no update, no delete");

    // Deleting it on the server deletes it here too, undecodable as its final state is.
    gadgets(&client).delete("flip", &DeleteParams::default()).await.unwrap();
    eventually("flip gone", || running.lister().lookup("flip").is_absent()).await;
    assert!(undecodable_metric(&running.informer).is_empty());
    // The cache is written before the handlers' drain runs: wait for the delete to reach them.
    eventually("the delete reaches the handler", || running.seen().len() == 3).await;
    assert_eq!(running.seen(), ["add flip", "add sentinel", "delete flip"]);
    running.stop().await;
}
