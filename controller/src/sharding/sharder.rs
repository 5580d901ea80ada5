//! The sharder: a controller, run by the elected leader, that labels every object of a ring's
//! primary type with its live shard, drains objects that must move, and labels the objects
//! they own like their owner.
//!
//! Where it sits: beside the shards' controllers, on the leader only. It reads the ring's
//! primary type (and its owned types) through *metadata* informers of every object (labels and
//! owner references only) and the shard Leases through an informer of its own (the ring's
//! label, the Leases' namespace), and writes labels; the shards' informers select on them.
//! Its informers come from the factory it is given: the
//! [`Manager::leader_factory`](crate::Manager::leader_factory), whose informers start only
//! when the replica starts leading, so a replica that does not lead caches no object of
//! another shard.

use std::any::TypeId;
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use factory::{CacheOptions, FactoryResource, PartialObjectMeta, SharedInformerFactory};
use futures::StreamExt;
use futures::future::BoxFuture;
use informer_core::{IndexError, IndexFunc, Indexer, Indexers, InformerError, SharedIndexInformer};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, Resource};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::{Map, Value};
use tracing::{debug, info, warn};

use super::membership::{Fence, RingMembership, is_fenced, next_expiry};
use super::{RING_LABEL, ShardingConfig, ring};
use crate::builder::Controller;
use crate::controller::{BuiltController, ControllerError};
use crate::metrics::Metrics;
use crate::object_key::{ObjectKey, Request};
use crate::rbac::Verb;
use crate::reconciler::{Action, BoxError, Context, Reconciler};

/// The sharding metric families of one registry. Cheap to clone.
#[derive(Clone)]
pub struct ShardingMetrics {
    objects: IntGaugeVec,
    moves: IntCounterVec,
    drain_duration: HistogramVec,
}

impl std::fmt::Debug for ShardingMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardingMetrics")
            .field("objects", &"kinformer_sharding_objects")
            .field("moves", &"kinformer_sharding_moves_total")
            .field("drain_duration", &"kinformer_sharding_drain_duration_seconds")
            .finish()
    }
}

impl ShardingMetrics {
    /// Registers `kinformer_sharding_objects{ring,shard}`, `kinformer_sharding_moves_total{ring,reason}`
    /// and `kinformer_sharding_drain_duration_seconds{ring}` in `registry` (once per registry:
    /// several rings share them by their `ring` label).
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = ShardingMetrics {
            objects: IntGaugeVec::new(
                Opts::new(
                    "kinformer_sharding_objects",
                    "Objects labelled for each live shard, as the sharder sees them",
                ),
                &["ring", "shard"],
            )?,
            moves: IntCounterVec::new(
                Opts::new(
                    "kinformer_sharding_moves_total",
                    "Objects moved off their shard, by reason: drained (the old shard acknowledged a drain), \
                     released (at once, from a shard whose Lease its graceful shutdown released) or expired \
                     (at once, from a shard whose Lease expired or vanished)",
                ),
                &["ring", "reason"],
            )?,
            drain_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kinformer_sharding_drain_duration_seconds",
                    "From an object's drain label to its reassignment, by the wall clock: the start is the \
                     object's sharding.kinformer.io/drain-started annotation, written with the drain label, so \
                     a drain begun before a sharder failover is timed by the next sharder",
                )
                .buckets(prometheus::exponential_buckets(0.005, 2.0, 14)?),
                &["ring"],
            )?,
        };
        registry.register(Box::new(metrics.objects.clone()))?;
        registry.register(Box::new(metrics.moves.clone()))?;
        registry.register(Box::new(metrics.drain_duration.clone()))?;
        Ok(metrics)
    }

    /// The objects labelled for `shard` of `ring`, at the sharder's last membership check.
    pub fn objects(&self, ring: &str, shard: &str) -> i64 {
        self.objects.with_label_values(&[ring, shard]).get()
    }

    /// The objects of `ring` moved for `reason`: `drained` (the old shard acknowledged a
    /// drain), `released` (from a shard whose Lease its graceful shutdown released) or
    /// `expired` (from a shard whose Lease expired or vanished).
    pub fn moves(&self, ring: &str, reason: &str) -> u64 {
        self.moves.with_label_values(&[ring, reason]).get()
    }
}

/// [`Sharder::DRAIN_STARTED_ANNOTATION`].
const DRAIN_STARTED: &str = "sharding.kinformer.io/drain-started";

/// The sharder's workers unless [`Sharder::workers`] says otherwise.
pub const DEFAULT_WORKERS: usize = 4;

/// Labels the children of one owner: `(client, owner uid, shard)`.
type LabelChildren =
    Arc<dyn Fn(&Client, &str, Option<String>) -> BoxFuture<'static, Result<(), kube::Error>> + Send + Sync>;

/// Adds a child type's source to the sharder's controller, indexes the child type's informer
/// by controller owner ([`Sharder::OWNER_UID_INDEX`]), and returns the labeller of one
/// owner's children.
type AddChild<K> = Box<
    dyn FnOnce(
            Controller<PartialObjectMeta<K>>,
            &SharedInformerFactory,
        ) -> Result<(Controller<PartialObjectMeta<K>>, LabelChildren), ControllerError>
        + Send,
>;

/// Builds the sharder of a ring whose primary type is `K`:
/// `Sharder::<K>::new(manager.leader_factory(), &config).owns::<C>().build()`, then add it to
/// the [`Manager`](crate::Manager), which runs it while it leads.
#[must_use]
pub struct Sharder<K> {
    factory: SharedInformerFactory,
    config: ShardingConfig,
    metrics: Option<Metrics>,
    workers: usize,
    deletion_grace: Duration,
    children: Vec<AddChild<K>>,
    _k: PhantomData<fn() -> K>,
}

impl<K: FactoryResource> Sharder<K> {
    /// The sharder of `config.ring` (the shard id is not used), with its informers on
    /// `factory`: pass the Manager's [`leader_factory`](crate::Manager::leader_factory), which
    /// starts them only on the leader (the Manager's [`factory`](crate::Manager::factory)
    /// would start them on every replica, each caching every object's metadata).
    pub fn new(factory: &SharedInformerFactory, config: &ShardingConfig) -> Self {
        Sharder {
            factory: factory.clone(),
            config: config.clone(),
            metrics: None,
            workers: DEFAULT_WORKERS,
            deletion_grace: config.lease_duration * 2,
            children: Vec::new(),
            _k: PhantomData,
        }
    }

    /// Registers its controller metrics and the [`ShardingMetrics`] in `metrics`' registry (a
    /// Manager's: `manager.metrics().clone()`). Without it, a registry of its own.
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// How many objects the sharder labels at once (default [`DEFAULT_WORKERS`]): a dead
    /// shard's objects, about 1/N of all, are relabelled by this many workers in parallel. The
    /// queue gives a key to one worker at a time, so no object is labelled twice at once.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// How long a shard Lease must have been free (released, or expired by its `renewTime`)
    /// before the sharder deletes it, once it carries no fence and no object is labelled for its
    /// shard (default twice the config's `lease_duration`): a shard id that never comes back (a
    /// restarted pod's name) leaves no Lease behind, and one that comes back later creates its
    /// Lease again. It must be longer than the lease duration ([`build`](Self::build) fails
    /// with [`ControllerError::InvalidConfig`] otherwise): a shard id gets at least the time a
    /// silent shard gets to renew before its Lease, the record `kubectl get leases` shows of it,
    /// is gone.
    pub fn deletion_grace(mut self, grace: Duration) -> Self {
        self.deletion_grace = grace;
        self
    }

    /// The index of the sharder's cache of each [owned](Self::owns) type: a child is indexed
    /// under the uid of its controller owner (the ownerReference with `controller: true`), so
    /// the children of one owner are a lookup, not a scan of every child (which would make
    /// relabelling N owners cost N × the children cached). On the factory's shared metadata
    /// informer of the child type, so a controller on the same factory may use it too.
    pub const OWNER_UID_INDEX: &'static str = "sharding.kinformer.io/controller-uid";

    /// The annotation the sharder writes on an object with its drain label, in the same
    /// conditional patch: when the drain began (RFC 3339, the sharder's wall clock). The
    /// sharder that assigns the acknowledged object reads it for
    /// `kinformer_sharding_drain_duration_seconds` and removes it with the assignment, so a
    /// drain begun before a sharder failover is timed (by the new sharder's clock) and counted
    /// as `drained`. A move from a gone shard removes it too.
    pub const DRAIN_STARTED_ANNOTATION: &'static str = DRAIN_STARTED;

    /// Objects of type `C` follow their controller owner's shard label (the shards' controllers
    /// `owns::<C>()` them). The sharder finds an owner's children by
    /// [`OWNER_UID_INDEX`](Self::OWNER_UID_INDEX).
    pub fn owns<C>(mut self) -> Self
    where
        C: Resource<DynamicType = (), Scope: 'static> + Clone + std::fmt::Debug + Send + Sync + 'static,
    {
        let shard_label = self.config.shard_label();
        let add: AddChild<K> = Box::new(move |controller, factory| {
            let controller = controller.owns_metadata::<C>().writes::<C>(&[Verb::Patch]);
            // The informer `owns_metadata` reads: the factory's shared one of `C`.
            let informer = factory.metadata_informer_for::<C>()?;
            add_index(
                &informer,
                Self::OWNER_UID_INDEX,
                Arc::new(|child: &PartialObjectMeta<C>| {
                    child
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .filter(|r| r.controller == Some(true))
                        .map(|r| r.uid.clone())
                        .collect()
                }),
            )?;
            let children = informer.indexer().clone();
            let resource = ApiResource::erase::<C>(&());
            let namespaced = TypeId::of::<C::Scope>() == TypeId::of::<k8s_openapi::NamespaceResourceScope>();
            let label: LabelChildren = Arc::new(move |client, uid, shard| {
                // Registered above, so the lookup cannot fail.
                let children = children.by_index(Self::OWNER_UID_INDEX, uid).unwrap_or_default();
                let (client, resource, shard_label) = (client.clone(), resource.clone(), shard_label.clone());
                Box::pin(async move {
                    for child in children {
                        let meta = &child.metadata;
                        if meta.labels.as_ref().and_then(|l| l.get(&shard_label)) == shard.as_ref() {
                            continue;
                        }
                        let mut labels = Map::new();
                        labels.insert(shard_label.clone(), shard.clone().map_or(Value::Null, Value::String));
                        patch_meta(&client, &resource, namespaced, meta, labels, Map::new()).await?;
                    }
                    Ok(())
                })
            });
            Ok((controller, label))
        });
        self.children.push(add);
        self
    }

    /// The sharder's controller, named `sharder-<ring>`: it needs leader election, so a
    /// [`Manager`](crate::Manager) runs it only while it leads.
    pub fn build(self) -> Result<BuiltController<PartialObjectMeta<K>, SharderReconciler<K>>, ControllerError> {
        let Sharder {
            factory,
            config,
            metrics,
            workers,
            deletion_grace,
            children,
            ..
        } = self;
        config.validate().map_err(ControllerError::InvalidConfig)?;
        if deletion_grace <= config.lease_duration {
            return Err(ControllerError::InvalidConfig(format!(
                "sharding: the deletion grace ({deletion_grace:?}) must be longer than the lease duration ({:?})",
                config.lease_duration
            )));
        }
        let lease_informer = factory.informer_for_with::<Lease>(
            CacheOptions::default()
                .namespace(&config.namespace)
                .labels(format!("{RING_LABEL}={}", config.ring)),
        )?;
        let primary = factory.metadata_informer_for::<K>()?;
        // The primary objects by their shard label's value (the index is named by the label
        // key, so each ring's sharder has its own): the membership check's counts and its
        // "any object labelled for this shard?" are lookups, not scans.
        let shard_label = config.shard_label();
        add_index(
            &primary,
            &config.shard_label(),
            Arc::new(move |obj: &PartialObjectMeta<K>| {
                obj.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(&shard_label))
                    .map(|shard| vec![shard.clone()])
                    .unwrap_or_default()
            }),
        )?;
        let registry = match &metrics {
            Some(m) => m.registry().clone(),
            None => Registry::new(),
        };
        let sharding_metrics = ShardingMetrics::new(&registry)?;
        let view = Arc::new(RingView {
            memory: RingMembership::new(
                factory.client().clone(),
                &config,
                &ApiResource::erase::<K>(&()),
                deletion_grace,
            ),
            leases: lease_informer.indexer().clone(),
            objects: primary.indexer().clone(),
            config: config.clone(),
            first_sight: OnceLock::new(),
        });
        let changes = membership_changes(view.clone(), sharding_metrics.clone());
        let mut builder = Controller::new(format!("sharder-{}", config.ring), &factory);
        if let Some(metrics) = metrics {
            builder = builder.metrics(metrics);
        }
        // The Lease cache must be synced before assigning: a source whose notifications map to
        // no key, for its cache alone.
        let mut controller = builder
            .for_resource::<PartialObjectMeta<K>>()
            .workers(workers)
            .watches_with_options(
                crate::SourceOptions::<Lease>::new().informer_with(
                    CacheOptions::default()
                        .namespace(&config.namespace)
                        .labels(format!("{RING_LABEL}={}", config.ring)),
                ),
                |_: &Lease| Vec::new(),
            )
            .reconcile_all_on(changes)
            // Queued once, when built: reconciled first thing in the term, so the membership
            // check tends the ring's Leases (fences, gone shards) even with no object to label.
            .reconcile_on(futures::stream::once(async { term_key() }).chain(futures::stream::pending()))
            // Its label writes, for the RBAC rules of its permissions.
            .writes::<K>(&[Verb::Patch])
            // Fences (a create if the Lease is absent) and deleting a gone shard's Lease.
            .writes::<Lease>(&[Verb::Create, Verb::Patch, Verb::Delete]);
        let mut labellers = Vec::new();
        for add in children {
            let (with_child, label) = add(controller, &factory)?;
            controller = with_child;
            labellers.push(label);
        }
        controller.build(SharderReconciler {
            view,
            resource: ApiResource::erase::<K>(&()),
            namespaced: TypeId::of::<K::Scope>() == TypeId::of::<k8s_openapi::NamespaceResourceScope>(),
            metrics: sharding_metrics,
            children: labellers,
        })
    }
}

/// Adds the index `name` of `func` to `informer`; one already there under that name is taken
/// to be the same (every sharder names its indexes by what they index).
fn add_index<T: Resource + Send + Sync + 'static>(
    informer: &SharedIndexInformer<T>,
    name: &str,
    func: IndexFunc<T>,
) -> Result<(), ControllerError> {
    match informer.add_indexers(Indexers::from([(name.to_owned(), func)])) {
        Err(InformerError::Index(IndexError::Conflict(taken))) if taken == name => Ok(()),
        other => Ok(other?),
    }
}

/// The key the sharder's controller reconciles once at the start of its term, for the term
/// alone (see [`RingMembership::running_under`]): no object has it (a name holds no `/`).
fn term_key() -> ObjectKey {
    ObjectKey::cluster_scoped("sharding.kinformer.io/term")
}

/// The sharder's view of its ring, shared by its reconciles and its membership check: the
/// Lease cache, the primary objects' metadata, what it remembers of the Leases
/// ([`RingMembership`]), and the grace it gave the shards it found when its term began.
struct RingView<K> {
    memory: RingMembership,
    leases: Indexer<Lease>,
    /// Indexed by the shard label's value (its index named by the label key).
    objects: Indexer<PartialObjectMeta<K>>,
    config: ShardingConfig,
    /// Each shard's expiry by first sight: set once, when the sharder first judges the ring in
    /// its term (its caches synced). See [`RingView::live`].
    first_sight: OnceLock<HashMap<String, jiff::Timestamp>>,
}

impl<K: Resource + 'static> RingView<K> {
    /// The live shards at `now`, with `leases` the Lease cache's content: those of
    /// [`RingMembership::live`], and, for a lease duration from when this sharder's term
    /// first judged the ring, every shard it found then (named by a Lease, or by an object's
    /// label) unless its Lease has since been seen released or fenced.
    ///
    /// Why: client-go's elector gives a Lease it has just observed a full lease duration
    /// before taking it over, since it has seen no renewal yet; so does a new sharder. By the
    /// `renewTime`s alone, a sharder that just took over would fence at once a shard whose
    /// Lease looks expired by its clock (a shard whose clock lags, or one whose vanished Lease
    /// the previous sharder was keeping live until its remembered expiry, which died with
    /// it), and move objects off a shard that may still be reconciling them.
    fn live(&self, leases: &[Arc<Lease>], now: jiff::Timestamp) -> Vec<String> {
        let mut live = self.memory.live(leases, &self.config.ring, now);
        let first_sight = if self.memory.is_running() {
            Some(self.first_sight.get_or_init(|| self.seed(leases, now)))
        } else {
            self.first_sight.get()
        };
        let Some(first_sight) = first_sight else {
            return live;
        };
        let ended = self.ended(leases);
        live.extend(
            first_sight
                .iter()
                .filter(|(shard, until)| **until > now && !ended.contains(shard.as_str()))
                .map(|(shard, _)| shard.clone()),
        );
        live.sort_unstable();
        live.dedup();
        live
    }

    /// The shards whose Lease among `leases` is released or fenced: gone, whatever the grace.
    fn ended<'a>(&self, leases: &'a [Arc<Lease>]) -> HashSet<&'a str> {
        let prefix = format!("{}-", self.config.ring);
        leases
            .iter()
            .filter(|lease| {
                let held = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    .is_some_and(|h| !h.is_empty());
                !held || is_fenced(lease)
            })
            .filter_map(|lease| lease.metadata.name.as_deref()?.strip_prefix(&prefix))
            .collect()
    }

    /// Every shard named by a Lease among `leases` or by an object's label, not released or
    /// fenced, live until `now + lease_duration` at least.
    fn seed(&self, leases: &[Arc<Lease>], now: jiff::Timestamp) -> HashMap<String, jiff::Timestamp> {
        let prefix = format!("{}-", self.config.ring);
        let until = jiff::SignedDuration::try_from(self.config.lease_duration)
            .ok()
            .and_then(|d| now.checked_add(d).ok())
            .unwrap_or(now);
        let ended = self.ended(leases);
        let mut shards: HashSet<String> = self
            .objects
            .list_index_func_values(&self.config.shard_label())
            .into_iter()
            .collect();
        shards.extend(
            leases
                .iter()
                .filter_map(|lease| lease.metadata.name.as_deref()?.strip_prefix(&prefix))
                .map(str::to_owned),
        );
        shards.retain(|shard| !ended.contains(shard.as_str()));
        info!(ring = %self.config.ring, shards = ?shards, until = %until,
            "sharder's term began: each shard it found is live for a lease duration at least");
        shards.into_iter().map(|shard| (shard, until)).collect()
    }

    /// How long until the first grace of [`live`](Self::live) ends, if one still runs.
    fn next_grace_end(&self, now: jiff::Timestamp) -> Option<Duration> {
        self.first_sight
            .get()?
            .values()
            .filter(|until| **until > now)
            .filter_map(|until| Duration::try_from(now.duration_until(*until)).ok())
            .min()
    }

    /// Whether the sharder's cache shows an object labelled for `shard`.
    fn labelled_for(&self, shard: &str) -> bool {
        self.objects
            .index_keys(&self.config.shard_label(), shard)
            .is_ok_and(|keys| !keys.is_empty())
    }

    /// Sets `kinformer_sharding_objects` for each of the `live` shards.
    fn count_objects(&self, live: &[String], metrics: &ShardingMetrics) {
        let label = self.config.shard_label();
        metrics.objects.reset();
        for shard in live {
            let count = self.objects.index_keys(&label, shard).map_or(0, |keys| keys.len());
            metrics
                .objects
                .with_label_values(&[&self.config.ring, shard])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}

/// A signal each time the set of live shards changes, checked from the Lease cache every
/// `membership_check_interval`, at the instant the first live Lease would expire, and when a
/// grace of a new term ends ([`RingView::live`]); it also refreshes
/// `kinformer_sharding_objects`. While the sharder runs (its term, which the sharder's first
/// reconcile records, is valid) it takes over the fences another sharder left, lifts the
/// fences whose shards its cache shows no object labelled for ([`RingMembership::lift`]
/// confirms with a LIST), and deletes the Leases of shards gone longer than the grace.
fn membership_changes<K: Resource + Send + Sync + 'static>(
    view: Arc<RingView<K>>,
    metrics: ShardingMetrics,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(None::<Vec<String>>, move |mut last| {
        let (view, metrics) = (view.clone(), metrics.clone());
        async move {
            let (memory, config) = (&view.memory, &view.config);
            loop {
                let now = jiff::Timestamp::now();
                let current = view.leases.list();
                let live = view.live(&current, now);
                view.count_objects(&live, &metrics);
                // This check runs on every replica; only the one whose sharder runs writes.
                if memory.is_running() {
                    memory.adopt_fences(&current).await;
                    for shard in memory.fenced_shards().await {
                        if !view.labelled_for(&shard) {
                            memory.lift(&shard).await;
                        }
                    }
                    for shard in memory.gone_shards(&current, now) {
                        // Not one the grace of a new term keeps live.
                        if !live.contains(&shard) && !view.labelled_for(&shard) {
                            memory.delete_gone(&shard).await;
                        }
                    }
                }
                if last.as_ref() != Some(&live) {
                    if last.is_some() {
                        info!(ring = %config.ring, shards = ?live, "ring membership changed: re-examining every object");
                    }
                    last = Some(live);
                    return Some(((), last));
                }
                // A tiny margin past the expiry, so the check after it sees the lease expired.
                let wait = next_expiry(&current, now)
                    .into_iter()
                    .chain(view.next_grace_end(now))
                    .min()
                    .map(|d| d + Duration::from_millis(5))
                    .map_or(config.membership_check_interval, |d| {
                        d.min(config.membership_check_interval)
                    });
                tokio::time::sleep(wait).await;
            }
        }
    })
}

/// A merge patch of `labels` and `annotations` (a `null` removes one) on the object `meta`
/// names, conditional on its resourceVersion.
async fn patch_meta(
    client: &Client,
    resource: &ApiResource,
    namespaced: bool,
    meta: &ObjectMeta,
    labels: Map<String, Value>,
    annotations: Map<String, Value>,
) -> Result<(), kube::Error> {
    let name = meta.name.as_deref().unwrap_or_default();
    let api: Api<DynamicObject> = match (&meta.namespace, namespaced) {
        (Some(ns), true) => Api::namespaced_with(client.clone(), ns, resource),
        _ => Api::all_with(client.clone(), resource),
    };
    let mut metadata = Map::new();
    metadata.insert(
        "resourceVersion".into(),
        meta.resource_version.clone().map_or(Value::Null, Value::String),
    );
    metadata.insert("labels".into(), Value::Object(labels));
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    let patch = serde_json::json!({ "metadata": metadata });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}

/// The sharder's reconciler: assigns, drains and moves one object (see the
/// [module docs](super)).
pub struct SharderReconciler<K> {
    /// The Lease cache, the objects' metadata, the last known expiry of each shard's Lease and
    /// the fences (shared with the membership check).
    view: Arc<RingView<K>>,
    resource: ApiResource,
    namespaced: bool,
    metrics: ShardingMetrics,
    children: Vec<LabelChildren>,
}

impl<K: FactoryResource> SharderReconciler<K> {
    /// The label (and annotation) writes `meta` needs, the shard its children should carry,
    /// the gone shard the writes move the object from without a drain (only under this
    /// sharder's fence on that shard's Lease), and the move they make, for the metrics.
    fn decide(&self, key: &ObjectKey, meta: &ObjectMeta) -> Decision {
        let config = &self.view.config;
        let (shard_label, drain_label) = (config.shard_label(), config.drain_label());
        let labels = meta.labels.clone().unwrap_or_default();
        let current = labels.get(&shard_label).cloned();
        let draining = labels.get(&drain_label).is_some_and(|v| v == "true");
        let drain_started = meta.annotations.as_ref().and_then(|a| a.get(DRAIN_STARTED));
        let leases = self.view.leases.list();
        let live = self.view.live(&leases, jiff::Timestamp::now());
        let desired = ring::assign(&live, &key.cache_key()).map(str::to_owned);
        // The shard label set to `to` (removed if `None`), the drain label and its start removed.
        let assign = |to: &Option<String>| {
            let mut labels = Map::new();
            labels.insert(shard_label.clone(), to.clone().map_or(Value::Null, Value::String));
            labels.insert(drain_label.clone(), Value::Null);
            let mut annotations = Map::new();
            if drain_started.is_some() {
                annotations.insert(DRAIN_STARTED.to_owned(), Value::Null);
            }
            Some(MetaPatch { labels, annotations })
        };
        let keep = |current: Option<String>| Decision {
            patch: None,
            shard: current,
            from_gone: None,
            moved: None,
        };
        match (current, desired) {
            // No live shard: nothing to assign to.
            (None, None) => keep(None),
            (None, Some(desired)) => {
                // Acknowledged by its old shard if it carries its drain's start (a new object,
                // or one a gone shard's move left unassigned, carries none).
                let moved = drain_started.map(|started| Moved::Drained(drain_seconds(key, started)));
                let desired = Some(desired);
                Decision {
                    patch: assign(&desired),
                    shard: desired,
                    from_gone: None,
                    moved,
                }
            }
            // From a gone shard: to the live one, or unassigned if none is live (so the fence
            // on the gone shard can be lifted, and its next incarnation can take them).
            (Some(current), desired) if !live.contains(&current) => {
                let moved = gone(&leases, config, &current);
                debug!(ring = %config.ring, key = %key, from = %current, to = ?desired, reason = moved.reason(),
                    "moving from a shard that is gone");
                Decision {
                    patch: assign(&desired),
                    shard: desired,
                    from_gone: Some(current),
                    moved: Some(moved),
                }
            }
            (Some(current), Some(desired)) if current == desired || draining => keep(Some(current)),
            (Some(current), Some(desired)) => {
                debug!(ring = %config.ring, key = %key, from = %current, to = %desired, "draining");
                let mut labels = Map::new();
                labels.insert(drain_label, Value::String("true".into()));
                let mut annotations = Map::new();
                annotations.insert(
                    DRAIN_STARTED.to_owned(),
                    Value::String(jiff::Timestamp::now().to_string()),
                );
                Decision {
                    patch: Some(MetaPatch { labels, annotations }),
                    shard: Some(current),
                    from_gone: None,
                    moved: None,
                }
            }
            // Unreachable (no live shard, so `current` is not live), kept as it is.
            (Some(current), None) => keep(Some(current)),
        }
    }

    /// Counts `moved` (written), with its drain's duration if it is a timed drain.
    fn count(&self, moved: &Moved) {
        let ring = &self.view.config.ring;
        self.metrics.moves.with_label_values(&[ring, moved.reason()]).inc();
        if let Moved::Drained(Some(seconds)) = moved {
            self.metrics.drain_duration.with_label_values(&[ring]).observe(*seconds);
        }
    }
}

/// The seconds from `started`, the drain-started annotation of the object `key` names, until
/// now (wall clock, 0 if the clocks disagree); `None`, logged, if it is no timestamp.
fn drain_seconds(key: &ObjectKey, started: &str) -> Option<f64> {
    match started.parse::<jiff::Timestamp>() {
        Ok(started) => Some(jiff::Timestamp::now().duration_since(started).as_secs_f64().max(0.0)),
        Err(e) => {
            warn!(key = %key, annotation = DRAIN_STARTED, value = started, error = %e,
                "an unreadable drain start: the drain is counted, not timed");
            None
        }
    }
}

/// How `shard`, gone, went, by its Lease among `leases` (the sharder's cache): released (its
/// Lease names no holder and carries a renewal, as a graceful shutdown's release leaves it, a
/// fence since then included) or expired (held but not renewed in time, vanished, or a Lease
/// the sharder created to fence it).
fn gone(leases: &[Arc<Lease>], config: &ShardingConfig, shard: &str) -> Moved {
    let name = format!("{}-{shard}", config.ring);
    let released = leases
        .iter()
        .filter(|lease| lease.metadata.name.as_deref() == Some(name.as_str()))
        .filter_map(|lease| lease.spec.as_ref())
        .any(|spec| spec.holder_identity.as_deref().is_none_or(str::is_empty) && spec.renew_time.is_some());
    if released { Moved::Released } else { Moved::Expired }
}

/// Label and annotation writes on one object (a `null` removes one).
struct MetaPatch {
    labels: Map<String, Value>,
    annotations: Map<String, Value>,
}

/// A move of an object off its shard, as `kinformer_sharding_moves_total` counts it.
#[derive(Debug, PartialEq)]
enum Moved {
    /// Its old shard acknowledged the drain; the seconds since the drain began, if known.
    Drained(Option<f64>),
    /// At once, from a shard whose Lease its graceful shutdown released.
    Released,
    /// At once, from a shard whose Lease expired or vanished.
    Expired,
}

impl Moved {
    /// The `reason` label.
    fn reason(&self) -> &'static str {
        match self {
            Moved::Drained(_) => "drained",
            Moved::Released => "released",
            Moved::Expired => "expired",
        }
    }
}

/// What [`SharderReconciler::decide`] decided for one object.
struct Decision {
    /// The label and annotation writes.
    patch: Option<MetaPatch>,
    /// The shard the object's children should carry.
    shard: Option<String>,
    /// The gone shard the writes move the object from, without a drain.
    from_gone: Option<String>,
    /// The move the writes make, counted once they succeed.
    moved: Option<Moved>,
}

impl<K: FactoryResource> Reconciler<PartialObjectMeta<K>> for SharderReconciler<K> {
    type Error = BoxError;

    async fn reconcile(&self, req: Request, ctx: &Context<PartialObjectMeta<K>>) -> Result<Action, BoxError> {
        self.view.memory.running_under(ctx.leadership());
        if req == term_key() {
            // Its work is the line above: the membership check now tends the Leases.
            return Ok(Action::Done);
        }
        let Some(obj) = ctx.get(&req)? else {
            return Ok(Action::Done);
        };
        let Decision {
            patch,
            shard,
            from_gone,
            moved,
        } = self.decide(&req, &obj.metadata);
        // A gone shard's objects move without a drain only under this sharder's fence on its
        // Lease, held until the writes are done: no incarnation of that shard reconciles then.
        let _fence = match &from_gone {
            Some(gone) => match self.view.memory.fenced(gone).await? {
                held @ Fence::Held { .. } => Some(held),
                Fence::NotYet(wait) => return Ok(Action::RequeueAfter(wait)),
            },
            None => None,
        };
        // The children first: when the object is assigned to a new shard, that shard finds its
        // children cached by the time it reconciles the object (it skips the object's key
        // until the object itself is labelled for it). While the object drains, or stays, its
        // children keep its current shard, so this order moves nothing early.
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        for label in &self.children {
            match label(ctx.client(), &uid, shard.clone()).await {
                Ok(()) => {}
                Err(e) if is_conflict(&e) => return Ok(Action::Requeue),
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(MetaPatch { labels, annotations }) = patch {
            match patch_meta(
                ctx.client(),
                &self.resource,
                self.namespaced,
                &obj.metadata,
                labels,
                annotations,
            )
            .await
            {
                // Written on the resourceVersion decided from: counted once.
                Ok(()) => {
                    if let Some(moved) = &moved {
                        self.count(moved);
                    }
                }
                // The cache is behind: the update that made it so queues the key again.
                Err(e) if is_conflict(&e) => return Ok(Action::Requeue),
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Action::Done),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn lease(name: &str, holder: Option<&str>, renewed: bool) -> Arc<Lease> {
        Arc::new(Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                renew_time: renewed.then(|| MicroTime(jiff::Timestamp::now())),
                ..LeaseSpec::default()
            }),
        })
    }

    #[test]
    fn a_gone_shard_is_released_only_if_its_lease_was_released() {
        let config = ShardingConfig::new("cms", "any");
        let leases = [
            // A graceful shutdown's release (`""`, renewed at the release), fenced or not.
            lease("cms-released", Some(""), true),
            lease("cms-released-none", None, true),
            // Held, not renewed in time.
            lease("cms-expired", Some("expired_1"), true),
            // Created by the sharder's fence: never held.
            lease("cms-fenced", None, false),
            // Another ring's Lease of the same shard name.
            lease("other-vanished", Some(""), true),
        ];
        for (shard, moved) in [
            ("released", Moved::Released),
            ("released-none", Moved::Released),
            ("expired", Moved::Expired),
            ("fenced", Moved::Expired),
            ("vanished", Moved::Expired),
        ] {
            assert_eq!(gone(&leases, &config, shard), moved, "{shard}");
        }
        assert_eq!(Moved::Released.reason(), "released");
        assert_eq!(Moved::Expired.reason(), "expired");
        assert_eq!(Moved::Drained(None).reason(), "drained");
    }

    #[test]
    fn a_drain_is_timed_from_its_annotation() {
        let key = ObjectKey::namespaced("default", "obj");
        let started = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3);
        let seconds = drain_seconds(&key, &started.to_string()).unwrap();
        assert!((3.0..60.0).contains(&seconds), "{seconds}");
        // A start ahead of this clock (another sharder's): no negative duration.
        let ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60);
        assert_eq!(drain_seconds(&key, &ahead.to_string()), Some(0.0));
        assert_eq!(drain_seconds(&key, "yesterday"), None);
    }
}
