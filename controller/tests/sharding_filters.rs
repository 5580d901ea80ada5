//! Sharding's handover under event filters (issue #26): the drain label is a label-only update,
//! which `GenerationChanged` and most update filters reject, yet the shard must take the key to
//! acknowledge the drain. A sharded controller whose filters reject every update (event filter
//! and primary predicate), and one filtering on `GenerationChanged`, still hand their objects
//! over when a second shard joins. Several Managers in one process against one envtest API
//! server, each with the sharded controller and the ring's sharder (run by the leader); real
//! Leases and labels, short real durations (lease 2 s, renew deadline 1.5 s, retry 300 ms,
//! membership check 100 ms).

mod common;

use std::time::Duration;

use common::sharding::{NAMESPACE, Tracker, WAIT};
use common::{Widget, WidgetSpec};
use controller::predicate::{GenerationChanged, Predicate, TypedPredicate};
use controller::sharding::ring;
use controller::{Action, Context, ControllerBuilder, Request, SourceOptions, reconciler_fn};
use factory::FactoryResource;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const RING: &str = "filtered";
/// Objects in each scenario: about half move when the second shard joins.
const N: usize = 30;

/// Rejects every update (adds and deletes pass): as a controller's event filter and as the
/// primary's own predicate.
#[derive(Clone, Copy)]
struct NoUpdates;

impl Predicate for NoUpdates {
    fn update(&self, _: &ObjectMeta, _: &ObjectMeta) -> bool {
        false
    }
}

impl<K: 'static> TypedPredicate<K> for NoUpdates {
    fn update(&self, _: &K, _: &K) -> bool {
        false
    }
}

/// A running replica: a Manager (leader election on one lease shared by all) with the sharded
/// controller and the sharder.
struct Shard {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), controller::ManagerError>>,
}

impl Shard {
    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Starts shard `id` of a controller of `K` that `filter` configures (its event filters and
/// primary predicates); the reconciler only records itself in `tracker`.
fn start_shard<K>(
    env: &envtest::Server,
    id: &str,
    tracker: &Tracker,
    filter: fn(ControllerBuilder) -> controller::Controller<K>,
) -> Shard
where
    K: FactoryResource,
{
    let mut manager = common::sharding::shard_manager(env, "sharding-filters-test", id);
    let config = common::sharding::shard_config(RING, id);
    let (tracker, shard) = (tracker.clone(), id.to_owned());
    let controller = filter(manager.controller("filtered").sharded(config.clone()))
        .workers(2)
        .build(reconciler_fn(move |req: Request, _ctx: Context<K>| {
            let (tracker, shard) = (tracker.clone(), shard.clone());
            async move {
                let in_flight = tracker.enter(&req.name, &shard, None);
                // Yield once, so a reconcile is in flight across a scheduling point.
                tokio::task::yield_now().await;
                drop(in_flight);
                Ok::<_, controller::BoxError>(Action::Done)
            }
        }))
        .unwrap();
    common::sharding::add_with_sharder::<K>(&mut manager, controller, &config);
    let (shutdown, task) = common::sharding::run(manager);
    Shard { shutdown, task }
}

/// Why the objects of `K` have not converged on `shards` yet (`None`: they have): each carries
/// the shard label the ring gives it among `shards`, no drain label, and its last reconcile was
/// by that shard.
async fn not_converged<K>(client: &kube::Client, tracker: &Tracker, shards: &[&str]) -> Option<String>
where
    K: FactoryResource + Resource<Scope = NamespaceResourceScope>,
{
    let api: Api<K> = Api::namespaced(client.clone(), NAMESPACE);
    let shard_label = format!("shard.kinformer.io/{RING}");
    let drain_label = format!("drain.shard.kinformer.io/{RING}");
    let mut objects = api.list_metadata(&ListParams::default()).await.unwrap().items;
    objects.retain(|o| o.metadata.name.as_deref().is_some_and(|n| n.starts_with("obj-")));
    if objects.len() != N {
        return Some(format!("{} objects", objects.len()));
    }
    for object in objects {
        let name = object.metadata.name.unwrap_or_default();
        let labels = object.metadata.labels.unwrap_or_default();
        if labels.contains_key(&drain_label) {
            return Some(format!("{name} draining"));
        }
        let Some(shard) = labels.get(&shard_label) else {
            return Some(format!("{name} unassigned"));
        };
        let expected = ring::assign(shards, &format!("{NAMESPACE}/{name}")).unwrap();
        if shard != expected {
            return Some(format!("{name} on {shard}, expected {expected}"));
        }
        if tracker.last(&name).as_deref() != Some(shard.as_str()) {
            return Some(format!(
                "{name} last reconciled by {:?}, labelled {shard}",
                tracker.last(&name)
            ));
        }
    }
    None
}

async fn until_converged<K>(client: &kube::Client, tracker: &Tracker, shards: &[&str])
where
    K: FactoryResource + Resource<Scope = NamespaceResourceScope>,
{
    common::sharding::until_none(
        WAIT,
        Duration::from_millis(50),
        async || not_converged::<K>(client, tracker, shards).await,
        |why| format!("not converged on {shards:?} within {WAIT:?}: {why}"),
    )
    .await;
}

/// One shard converges on its own; a second joins and the ring converges on both (the moved
/// objects drained by the first shard, whose filters reject the drain label's update), without
/// two shards ever reconciling one object. Returns the objects that moved to `shard-1`.
async fn second_shard_joins<K>(
    env: &envtest::Server,
    tracker: &Tracker,
    filter: fn(ControllerBuilder) -> controller::Controller<K>,
) -> (Vec<Shard>, Vec<String>)
where
    K: FactoryResource + Resource<Scope = NamespaceResourceScope>,
{
    let client = env.client();
    let first = start_shard(env, "shard-0", tracker, filter);
    until_converged::<K>(&client, tracker, &["shard-0"]).await;
    let second = start_shard(env, "shard-1", tracker, filter);
    let both = ["shard-0", "shard-1"];
    until_converged::<K>(&client, tracker, &both).await;
    assert_eq!(tracker.overlaps(), Vec::<String>::new());
    let moved: Vec<String> = (0..N)
        .map(|i| format!("obj-{i}"))
        .filter(|name| ring::assign(&both, &format!("{NAMESPACE}/{name}")) == Some("shard-1"))
        .collect();
    assert!(!moved.is_empty(), "no object moved");
    (vec![first, second], moved)
}

/// Filters that reject every update, the controller's event filter and the primary's own
/// predicate: the drain requests still reach the worker, and the objects move.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_whose_filters_reject_every_update_still_hands_over() {
    let env = common::sharding::envtest_with_objects(NAMESPACE, N).await;
    let tracker = Tracker::default();
    let (shards, _) = second_shard_joins::<ConfigMap>(&env, &tracker, |builder| {
        builder
            .for_resource_with(SourceOptions::<ConfigMap>::new().predicate(NoUpdates))
            .with_event_filter(NoUpdates)
    })
    .await;
    for shard in shards {
        shard.stop().await;
    }
    env.shutdown().await;
}

/// The most common filter, `GenerationChanged`, on Widgets (a label change keeps the
/// generation): the objects move, and a spec change of a moved object is reconciled by its new
/// shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_filtering_on_generation_changes_still_hands_over() {
    common::sharding::init_tracing();
    let env = common::envtest_with_widgets().await;
    let api: Api<Widget> = Api::namespaced(env.client(), NAMESPACE);
    for i in 0..N {
        let mut widget = Widget::new(&format!("obj-{i}"), WidgetSpec { size: 1 });
        widget.metadata.namespace = Some(NAMESPACE.into());
        api.create(&PostParams::default(), &widget).await.unwrap();
    }
    let tracker = Tracker::default();
    let (shards, moved) = second_shard_joins::<Widget>(&env, &tracker, |builder| {
        builder.for_resource::<Widget>().with_event_filter(GenerationChanged)
    })
    .await;

    // The filter still passes real changes: a moved object's new spec reaches its new shard.
    let name = &moved[0];
    let before = tracker.reconciles(name, "shard-1");
    let patch = serde_json::json!({"spec": {"size": 2}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    common::eventually(WAIT, "the spec change is reconciled by shard-1", || {
        let after = tracker.reconciles(name, "shard-1");
        async move { after > before }
    })
    .await;
    assert_eq!(tracker.last(name).as_deref(), Some("shard-1"));
    assert_eq!(tracker.overlaps(), Vec::<String>::new());
    for shard in shards {
        shard.stop().await;
    }
    env.shutdown().await;
}
