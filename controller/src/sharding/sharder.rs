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
use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use factory::{CacheOptions, FactoryResource, PartialObjectMeta, SharedInformerFactory};
use futures::future::BoxFuture;
use informer_core::Indexer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, Resource};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::{Map, Value};
use tracing::{debug, info};

use super::membership::{Fence, RingMembership, gone_shards, next_expiry};
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
                    "Objects moved to another shard: after a drain, or at once from a shard whose lease expired",
                ),
                &["ring", "reason"],
            )?,
            drain_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kinformer_sharding_drain_duration_seconds",
                    "From an object's drain label to its reassignment",
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

    /// The objects of `ring` moved for `reason` (`drained` or `expired`).
    pub fn moves(&self, ring: &str, reason: &str) -> u64 {
        self.moves.with_label_values(&[ring, reason]).get()
    }
}

/// The sharder's workers unless [`Sharder::workers`] says otherwise.
pub const DEFAULT_WORKERS: usize = 4;

/// Labels the children of one owner: `(ctx, owner uid, owner namespace, shard)`.
type LabelChildren<K> = Arc<
    dyn Fn(
            &Context<PartialObjectMeta<K>>,
            String,
            Option<String>,
            Option<String>,
        ) -> BoxFuture<'static, Result<(), kube::Error>>
        + Send
        + Sync,
>;

/// Adds a child type's source to the sharder's controller.
type AddChild<K> = Box<dyn FnOnce(Controller<PartialObjectMeta<K>>) -> Controller<PartialObjectMeta<K>> + Send>;

/// Builds the sharder of a ring whose primary type is `K`:
/// `Sharder::<K>::new(manager.leader_factory(), &config).owns::<C>().build()`, then add it to
/// the [`Manager`](crate::Manager), which runs it while it leads.
#[must_use]
pub struct Sharder<K> {
    factory: SharedInformerFactory,
    config: ShardingConfig,
    metrics: Option<Metrics>,
    workers: usize,
    children: Vec<(AddChild<K>, LabelChildren<K>)>,
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

    /// Objects of type `C` follow their controller owner's shard label (the shards' controllers
    /// `owns::<C>()` them).
    pub fn owns<C>(mut self) -> Self
    where
        C: Resource<DynamicType = (), Scope: 'static> + Clone + std::fmt::Debug + Send + Sync + 'static,
    {
        let resource = ApiResource::erase::<C>(&());
        let namespaced = TypeId::of::<C::Scope>() == TypeId::of::<k8s_openapi::NamespaceResourceScope>();
        let shard_label = self.config.shard_label();
        let label: LabelChildren<K> = Arc::new(move |ctx, uid, _namespace, shard| {
            let children: Vec<Arc<PartialObjectMeta<C>>> = ctx
                .indexer_for::<PartialObjectMeta<C>>()
                .map(|indexer| indexer.list())
                .unwrap_or_default();
            let client = ctx.client().clone();
            let (resource, shard_label) = (resource.clone(), shard_label.clone());
            Box::pin(async move {
                for child in children {
                    let meta = &child.metadata;
                    let owned = meta
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|r| r.controller == Some(true) && r.uid == uid);
                    let current = meta.labels.as_ref().and_then(|l| l.get(&shard_label));
                    if !owned || current == shard.as_ref() {
                        continue;
                    }
                    let mut labels = Map::new();
                    labels.insert(shard_label.clone(), shard.clone().map_or(Value::Null, Value::String));
                    patch_labels(&client, &resource, namespaced, meta, labels).await?;
                }
                Ok(())
            })
        });
        let add: AddChild<K> = Box::new(|controller| controller.owns_metadata::<C>().writes::<C>(&[Verb::Patch]));
        self.children.push((add, label));
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
            children,
            ..
        } = self;
        config.validate().map_err(ControllerError::InvalidConfig)?;
        let lease_informer = factory.informer_for_with::<Lease>(
            CacheOptions::default()
                .namespace(&config.namespace)
                .labels(format!("{RING_LABEL}={}", config.ring)),
        )?;
        let primary = factory.metadata_informer_for::<K>()?;
        let registry = match &metrics {
            Some(m) => m.registry().clone(),
            None => Registry::new(),
        };
        let sharding_metrics = ShardingMetrics::new(&registry)?;
        let memory = Arc::new(RingMembership::new(
            factory.client().clone(),
            &config,
            &ApiResource::erase::<K>(&()),
        ));
        let changes = membership_changes(
            memory.clone(),
            lease_informer.indexer().clone(),
            primary.indexer().clone(),
            config.clone(),
            sharding_metrics.clone(),
        );
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
            // Its label writes, for the RBAC rules of its permissions.
            .writes::<K>(&[Verb::Patch])
            // Fences (a create if the Lease is absent) and deleting a gone shard's Lease.
            .writes::<Lease>(&[Verb::Create, Verb::Patch, Verb::Delete]);
        let mut labellers = Vec::new();
        for (add, label) in children {
            controller = add(controller);
            labellers.push(label);
        }
        controller.build(SharderReconciler {
            leases: lease_informer.indexer().clone(),
            memory,
            resource: ApiResource::erase::<K>(&()),
            namespaced: TypeId::of::<K::Scope>() == TypeId::of::<k8s_openapi::NamespaceResourceScope>(),
            config,
            metrics: sharding_metrics,
            drains: Mutex::new(HashMap::new()),
            children: labellers,
        })
    }
}

/// A signal each time the set of live shards changes, checked from the Lease cache every
/// `membership_check_interval` and at the instant the first live Lease would expire; it also
/// refreshes `kinformer_sharding_objects`; while the sharder runs (its reconciles' term is
/// valid) it takes over the fences another sharder left, and lifts the fences whose shards its
/// cache shows no object labelled for ([`RingMembership::lift`] confirms with a LIST).
fn membership_changes<K: Resource + Send + Sync + 'static>(
    memory: Arc<RingMembership>,
    leases: Indexer<Lease>,
    objects: Indexer<PartialObjectMeta<K>>,
    config: ShardingConfig,
    metrics: ShardingMetrics,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(None::<Vec<String>>, move |mut last| {
        let (memory, leases, objects, config, metrics) = (
            memory.clone(),
            leases.clone(),
            objects.clone(),
            config.clone(),
            metrics.clone(),
        );
        async move {
            loop {
                let now = jiff::Timestamp::now();
                let current = leases.list();
                let live = memory.live(&current, &config.ring, now);
                count_objects(&objects, &config, &live, &metrics);
                // This check runs on every replica; only the one whose sharder runs writes.
                if memory.is_running() {
                    memory.adopt_fences(&current).await;
                    for shard in memory.fenced_shards().await {
                        if !labelled_for(&objects, &config, &shard) {
                            memory.lift(&shard).await;
                        }
                    }
                    for shard in gone_shards(&current, &config, now) {
                        if !labelled_for(&objects, &config, &shard) {
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
                    .map(|d| d + std::time::Duration::from_millis(5))
                    .map_or(config.membership_check_interval, |d| {
                        d.min(config.membership_check_interval)
                    });
                tokio::time::sleep(wait).await;
            }
        }
    })
}

/// Whether the sharder's cache shows an object labelled for `shard`.
fn labelled_for<K: Resource + 'static>(
    objects: &Indexer<PartialObjectMeta<K>>,
    config: &ShardingConfig,
    shard: &str,
) -> bool {
    let label = config.shard_label();
    objects.list().iter().any(|obj| {
        obj.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(&label))
            .map(String::as_str)
            == Some(shard)
    })
}

fn count_objects<K: Resource + 'static>(
    objects: &Indexer<PartialObjectMeta<K>>,
    config: &ShardingConfig,
    live: &[String],
    metrics: &ShardingMetrics,
) {
    let label = config.shard_label();
    let mut counts: BTreeMap<&str, i64> = live.iter().map(|s| (s.as_str(), 0)).collect();
    let all = objects.list();
    for obj in &all {
        if let Some(shard) = obj.metadata.labels.as_ref().and_then(|l| l.get(&label))
            && let Some(count) = counts.get_mut(shard.as_str())
        {
            *count += 1;
        }
    }
    metrics.objects.reset();
    for (shard, count) in counts {
        metrics.objects.with_label_values(&[&config.ring, shard]).set(count);
    }
}

/// A merge patch of `labels` (a `null` removes one) on the object `meta` names, conditional on
/// its resourceVersion.
async fn patch_labels(
    client: &Client,
    resource: &ApiResource,
    namespaced: bool,
    meta: &ObjectMeta,
    labels: Map<String, Value>,
) -> Result<(), kube::Error> {
    let name = meta.name.as_deref().unwrap_or_default();
    let api: Api<DynamicObject> = match (&meta.namespace, namespaced) {
        (Some(ns), true) => Api::namespaced_with(client.clone(), ns, resource),
        _ => Api::all_with(client.clone(), resource),
    };
    let patch = serde_json::json!({"metadata": {"resourceVersion": meta.resource_version, "labels": labels}});
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
    leases: Indexer<Lease>,
    /// The last known expiry of each shard's Lease and the fences (shared with the membership
    /// check).
    memory: Arc<RingMembership>,
    resource: ApiResource,
    namespaced: bool,
    config: ShardingConfig,
    metrics: ShardingMetrics,
    /// When each drain this sharder started began (for the drain duration).
    drains: Mutex<HashMap<ObjectKey, Instant>>,
    children: Vec<LabelChildren<K>>,
}

impl<K: FactoryResource> SharderReconciler<K> {
    /// The label writes `meta` needs, the shard its children should carry, and the gone shard
    /// the writes move the object from without a drain (only under this sharder's fence on
    /// that shard's Lease).
    fn decide(&self, key: &ObjectKey, meta: &ObjectMeta) -> Decision {
        let (shard_label, drain_label) = (self.config.shard_label(), self.config.drain_label());
        let labels = meta.labels.clone().unwrap_or_default();
        let current = labels.get(&shard_label).cloned();
        let draining = labels.get(&drain_label).is_some_and(|v| v == "true");
        let live = self
            .memory
            .live(&self.leases.list(), &self.config.ring, jiff::Timestamp::now());
        let desired = ring::assign(&live, &key.cache_key()).map(str::to_owned);
        // The shard label set to `to` (removed if `None`), the drain label removed.
        let assign = |to: &Option<String>| {
            let mut patch = Map::new();
            patch.insert(shard_label.clone(), to.clone().map_or(Value::Null, Value::String));
            patch.insert(drain_label.clone(), Value::Null);
            patch
        };
        let drains = || self.drains.lock().unwrap_or_else(|p| p.into_inner());
        let keep = |current: Option<String>| Decision {
            patch: None,
            shard: current,
            from_gone: None,
        };
        match (current, desired) {
            // No live shard: nothing to assign to.
            (None, None) => keep(None),
            (None, Some(desired)) => {
                if let Some(started) = drains().remove(key) {
                    self.metrics
                        .drain_duration
                        .with_label_values(&[&self.config.ring])
                        .observe(started.elapsed().as_secs_f64());
                    self.metrics
                        .moves
                        .with_label_values(&[&self.config.ring, "drained"])
                        .inc();
                }
                let desired = Some(desired);
                Decision {
                    patch: Some(assign(&desired)),
                    shard: desired,
                    from_gone: None,
                }
            }
            // From a gone shard: to the live one, or unassigned if none is live (so the fence
            // on the gone shard can be lifted, and its next incarnation can take them).
            (Some(current), desired) if !live.contains(&current) => {
                drains().remove(key);
                debug!(ring = %self.config.ring, key = %key, from = %current, to = ?desired, "moving from a shard that is gone");
                Decision {
                    patch: Some(assign(&desired)),
                    shard: desired,
                    from_gone: Some(current),
                }
            }
            (Some(current), Some(desired)) if current == desired || draining => keep(Some(current)),
            (Some(current), Some(desired)) => {
                drains().entry(key.clone()).or_insert_with(Instant::now);
                debug!(ring = %self.config.ring, key = %key, from = %current, to = %desired, "draining");
                let mut patch = Map::new();
                patch.insert(drain_label, Value::String("true".into()));
                Decision {
                    patch: Some(patch),
                    shard: Some(current),
                    from_gone: None,
                }
            }
            // Unreachable (no live shard, so `current` is not live), kept as it is.
            (Some(current), None) => keep(Some(current)),
        }
    }
}

/// What [`SharderReconciler::decide`] decided for one object.
struct Decision {
    /// The label writes.
    patch: Option<Map<String, Value>>,
    /// The shard the object's children should carry.
    shard: Option<String>,
    /// The gone shard the writes move the object from, without a drain.
    from_gone: Option<String>,
}

impl<K: FactoryResource> Reconciler<PartialObjectMeta<K>> for SharderReconciler<K> {
    type Error = BoxError;

    async fn reconcile(&self, req: Request, ctx: &Context<PartialObjectMeta<K>>) -> Result<Action, BoxError> {
        self.memory.running_under(ctx.leadership());
        let Some(obj) = ctx.get(&req)? else {
            self.drains.lock().unwrap_or_else(|p| p.into_inner()).remove(&req);
            return Ok(Action::Done);
        };
        let Decision {
            patch,
            shard,
            from_gone,
        } = self.decide(&req, &obj.metadata);
        // A gone shard's objects move without a drain only under this sharder's fence on its
        // Lease, held until the writes are done: no incarnation of that shard reconciles then.
        let _fence = match &from_gone {
            Some(gone) => match self.memory.fenced(gone).await? {
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
            match label(ctx, uid.clone(), obj.metadata.namespace.clone(), shard.clone()).await {
                Ok(()) => {}
                Err(e) if is_conflict(&e) => return Ok(Action::Requeue),
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(labels) = patch {
            match patch_labels(ctx.client(), &self.resource, self.namespaced, &obj.metadata, labels).await {
                Ok(()) if from_gone.is_some() => {
                    self.metrics
                        .moves
                        .with_label_values(&[&self.config.ring, "expired"])
                        .inc();
                }
                Ok(()) => {}
                // The cache is behind: the update that made it so queues the key again.
                Err(e) if is_conflict(&e) => return Ok(Action::Requeue),
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Action::Done),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::Done)
    }
}
