//! The [`Controller`] builder (controller-runtime's `pkg/builder`): choose the primary type
//! (`for_resource`), the other sources (`owns`, `watches`, `watches_with`), the event filters
//! and the settings, then [`build`](Controller::build) a [`BuiltController`] (whose runtime is
//! in `controller.rs`) or [`run`](Controller::run) it. The sources' plumbing is in `source.rs`.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use factory::{CacheOptions, FactoryError, FactoryResource, PartialObjectMeta, SharedInformerFactory};
use futures::{Stream, StreamExt};
use informer_core::{ResourceEventHandler, SharedIndexInformer};
use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use tokio_util::sync::CancellationToken;
use tracing::debug;
use workqueue::{QueueConfig, RateLimiter, default_controller_rate_limiter};

use crate::controller::{
    BuiltController, ControllerError, DEFAULT_CACHE_SYNC_TIMEOUT, DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT, ErrorPolicy,
    Outcomes, RefusedRetries,
};
use crate::event_recorder::{EventRecorder, Reporter};
use crate::handler::{Enqueuer, MapFunc, Mapping, OwnerType};
use crate::metrics::Metrics;
use crate::object_key::{ObjectKey, Request};
use crate::predicate::{EventFilters, Filters, Predicate, TypedPredicate};
use crate::rbac::{Permissions, Verb};
use crate::reconciler::{Action, Context, ContextInner, Reconciler};
use crate::runnable::hostname;
use crate::sharding::{Deletions, ShardGate, ShardingConfig};
use crate::source::{
    ErasedRegistration, ErasedSource, Handling, MakeHandler, PrimaryKeys, Signal, Source, SourceError, SourceKey,
    Trigger, dynamic_source, typed_source,
};
use crate::work_queue::WorkQueue;

/// How one source of a controller filters and which cache it reads (controller-runtime's
/// `builder.WithPredicates`, `builder.OnlyMetadata`'s cousin `ByObject`, and `Owns`'
/// `MatchEveryOwner`): given to [`for_resource_with`](ControllerBuilder::for_resource_with),
/// [`owns_with`](Controller::owns_with) and
/// [`watches_with_options`](Controller::watches_with_options).
///
/// ```no_run
/// use controller::SourceOptions;
/// use controller::predicate::{GenerationChanged, LabelSelectorPredicate, not};
/// use factory::CacheOptions;
/// use k8s_openapi::api::apps::v1::Deployment;
/// use k8s_openapi::api::core::v1::ConfigMap;
///
/// # fn demo(factory: &factory::SharedInformerFactory) -> Result<(), Box<dyn std::error::Error>> {
/// let controller = controller::Controller::new("deployments", factory)
///     .for_resource_with(SourceOptions::<Deployment>::new().predicate(GenerationChanged))
///     .owns_with(
///         SourceOptions::<ConfigMap>::new()
///             .predicate(not(LabelSelectorPredicate::parse("skip=true")?))
///             .informer_with(CacheOptions::default().labels("app=web")),
///     );
/// # let _ = controller; Ok(()) }
/// ```
#[must_use]
#[non_exhaustive]
pub struct SourceOptions<C> {
    predicates: Filters<C>,
    cache: Cache,
    every_owner: bool,
}

/// Which informer of the factory a source uses.
#[derive(Clone, Default)]
enum Cache {
    /// The type's shared informer ([`SharedInformerFactory::informer_for`]).
    #[default]
    Shared,
    /// The type's shared informer, which must have these options
    /// ([`SharedInformerFactory::shared_informer_with`]).
    SharedWith(CacheOptions),
    /// The informer for exactly these options ([`SharedInformerFactory::informer_for_with`]).
    Exactly(CacheOptions),
}

impl<C> Default for SourceOptions<C> {
    fn default() -> Self {
        SourceOptions {
            predicates: Filters::default(),
            cache: Cache::Shared,
            every_owner: false,
        }
    }
}

impl<C: 'static> SourceOptions<C> {
    /// No predicates, the type's shared informer, the controller owner only.
    pub fn new() -> Self {
        Self::default()
    }

    /// A predicate this source's notifications must pass (besides the controller's event
    /// filters); several combine with "and". It filters this source alone. On a
    /// [sharded](ControllerBuilder::sharded) controller's primary type, sharding's drain
    /// acknowledgements bypass filters: a change of the drain label is queued whatever the
    /// predicates say.
    pub fn predicate(mut self, predicate: impl TypedPredicate<C>) -> Self {
        self.predicates.0.push(Arc::new(predicate));
        self
    }

    /// Read the type's shared informer, which must have `options`: building fails with
    /// [`FactoryError::ConflictingOptions`] if another consumer asked for it with other options
    /// (or the factory's `by_object` set others).
    pub fn cache(mut self, options: CacheOptions) -> Self {
        self.cache = Cache::SharedWith(options);
        self
    }

    /// Read the informer for exactly `options`, shared only with requests for the same
    /// options (a list and watch of its own if they differ from the type's shared informer's).
    /// A controller reads one informer per type (what
    /// [`Context::lister_for`](crate::Context::lister_for) returns): every other source of the
    /// type must read the same one, or building fails with
    /// [`ControllerError::ConflictingCaches`].
    pub fn informer_with(mut self, options: CacheOptions) -> Self {
        self.cache = Cache::Exactly(options);
        self
    }

    /// For [`owns_with`](Controller::owns_with): enqueue every owner of the primary's kind, not
    /// only the controller owner (controller-runtime's `Owns(.., MatchEveryOwner)`). Building
    /// fails if given to another source.
    pub fn every_owner(mut self) -> Self {
        self.every_owner = true;
        self
    }
}

impl<C: FactoryResource> SourceOptions<C> {
    /// The informer these options ask for, and the options it has (for its name).
    /// The options with `selector` added to the informer's label selector: the informer for
    /// exactly those options (a sharded controller's cache of its shard's objects).
    fn select(mut self, selector: Option<String>) -> Self {
        let Some(selector) = selector else { return self };
        let mut options = match std::mem::take(&mut self.cache) {
            Cache::Shared => CacheOptions::default(),
            Cache::SharedWith(options) | Cache::Exactly(options) => options,
        };
        options.label_selector = Some(match options.label_selector.take().filter(|s| !s.is_empty()) {
            Some(own) => format!("{own},{selector}"),
            None => selector,
        });
        self.cache = Cache::Exactly(options);
        self
    }

    fn informer(
        &self,
        factory: &SharedInformerFactory,
    ) -> (Result<SharedIndexInformer<C>, FactoryError>, CacheOptions) {
        match &self.cache {
            Cache::Shared => (factory.informer_for::<C>(), CacheOptions::default()),
            Cache::SharedWith(options) => (factory.shared_informer_with::<C>(options.clone()), options.clone()),
            Cache::Exactly(options) => (factory.informer_for_with::<C>(options.clone()), options.clone()),
        }
    }
}

/// Starts building a controller: `Controller::new(name, &factory).for_resource::<K>()`.
pub struct Controller<K> {
    common: Common,
    primary: Source<K>,
    primary_type: OwnerType,
    /// The primary type's resource (for a sharded controller's label writes).
    primary_resource: ApiResource,
    sources: Vec<Box<dyn ErasedSource>>,
    error_policy: Option<ErrorPolicy<K>>,
    /// The first error met while requesting informers, reported by `build`.
    error: Option<ControllerError>,
    /// The API access the sources and the declared writes need (see [`crate::rbac`]).
    permissions: Permissions,
}

/// The settings of a controller that do not depend on its primary type.
struct Common {
    name: String,
    factory: SharedInformerFactory,
    metrics: Option<Metrics>,
    recorder: Option<EventRecorder>,
    predicates: Vec<Arc<dyn Predicate>>,
    /// External signals ([`Controller::reconcile_on`], [`Controller::reconcile_all_on`]).
    triggers: Vec<Trigger>,
    workers: usize,
    rate_limiter: Option<Box<dyn RateLimiter<ObjectKey>>>,
    /// A priority queue (the default) or the FIFO one.
    use_priority_queue: bool,
    graceful_shutdown_timeout: Duration,
    cache_sync_timeout: Duration,
    reconcile_timeout: Option<Duration>,
    recover_panic: bool,
    /// This replica's shard of a ring ([`ControllerBuilder::sharded`]).
    sharding: Option<ShardingConfig>,
}

impl Common {
    /// The label selector of this shard's objects, if sharded.
    fn shard_selector(&self) -> Option<String> {
        self.sharding.as_ref().map(ShardingConfig::selector)
    }
}

/// The first step of [`Controller::new`]: choose the primary type.
#[must_use]
pub struct ControllerBuilder {
    common: Common,
}

impl Controller<()> {
    // `Controller::new(name, &factory).for_resource::<K>()` reads as controller-runtime's
    // builder; the primary type is chosen in the second step, so `new` returns the builder.
    #[allow(clippy::new_ret_no_self)]
    /// A controller named `name` (its metrics' `controller` label, its work queue's name, its
    /// log field) on `factory`'s shared informers. Names should be unique in a process.
    pub fn new(name: impl Into<String>, factory: &SharedInformerFactory) -> ControllerBuilder {
        ControllerBuilder {
            common: Common {
                name: name.into(),
                factory: factory.clone(),
                metrics: None,
                recorder: None,
                predicates: Vec::new(),
                triggers: Vec::new(),
                workers: 1,
                rate_limiter: None,
                use_priority_queue: true,
                graceful_shutdown_timeout: DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT,
                cache_sync_timeout: DEFAULT_CACHE_SYNC_TIMEOUT,
                reconcile_timeout: None,
                recover_panic: true,
                sharding: None,
            },
        }
    }
}

impl ControllerBuilder {
    /// Registers the metrics in `metrics`' registry (the [`Manager`](crate::Manager) passes its
    /// own). Without it, a controller registers them in a registry of its own.
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.common.metrics = Some(metrics);
        self
    }

    /// Records events through `recorder`, whose sink task the caller runs. Without it, the
    /// controller makes one reporting as the controller's name and runs it itself.
    pub fn recorder(mut self, recorder: EventRecorder) -> Self {
        self.common.recorder = Some(recorder);
        self
    }

    /// How long the workers may take after shutdown to finish the keys already queued and the
    /// reconciles in flight (default 30 s; the [`Manager`](crate::Manager) sets it a little
    /// below its own bound). Also settable later.
    pub fn graceful_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.common.graceful_shutdown_timeout = timeout;
        self
    }

    /// A default [reconcile timeout](Controller::reconcile_timeout), which the controller's own
    /// setting overrides (the [`Manager`](crate::Manager) passes its
    /// [`reconcile_timeout`](crate::ManagerBuilder::reconcile_timeout)).
    pub fn reconcile_timeout(mut self, timeout: Duration) -> Self {
        self.common.reconcile_timeout = Some(timeout);
        self
    }

    /// Makes this controller one shard of a ring (see [`sharding`](crate::sharding)): its
    /// informers of the primary and owned types cache only the objects labelled
    /// `shard.kinformer.io/<ring>: <shard-id>`; it runs on every replica (not only the leader),
    /// holding its shard Lease while its workers run, and hands draining objects over instead
    /// of reconciling them. The [`Sharder`](crate::sharding::Sharder), run by the leader,
    /// assigns the objects. Call it before `for_resource`; a typed primary type only.
    /// Sharding's drain acknowledgements bypass filters: a change of a primary object's drain
    /// label is queued whatever [`with_event_filter`](Controller::with_event_filter) and the
    /// primary's own predicates say (the worker hands a draining object over, it does not
    /// reconcile it), so a controller filtering on `GenerationChanged` still hands its objects
    /// over.
    ///
    /// ```no_run
    /// # use controller::sharding::{Sharder, ShardingConfig};
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # fn demo(manager: &mut controller::Manager) -> Result<(), controller::ControllerError> {
    /// let config = ShardingConfig::new("configmaps", "shard-0").namespace("kube-system");
    /// let shard = manager
    ///     .controller("configmaps")
    ///     .sharded(config.clone())
    ///     .for_resource::<ConfigMap>()
    ///     .build(controller::reconciler_fn(|_req, _ctx: controller::Context<ConfigMap>| async {
    ///         Ok::<_, std::convert::Infallible>(controller::Action::Done)
    ///     }))?;
    /// let sharder = Sharder::<ConfigMap>::new(manager.leader_factory(), &config)
    ///     .metrics(manager.metrics().clone())
    ///     .build()?;
    /// manager.add(shard);
    /// manager.add(sharder);
    /// # Ok(()) }
    /// ```
    pub fn sharded(mut self, config: ShardingConfig) -> Self {
        self.common.sharding = Some(config);
        self
    }

    /// The primary type: adds, updates and deletes of `K` enqueue the object's own key.
    pub fn for_resource<K: FactoryResource>(self) -> Controller<K> {
        self.for_resource_with(SourceOptions::<K>::new())
    }

    /// The primary type with predicates of its own and a choice of informer (see
    /// [`SourceOptions`]): `for_resource_with(SourceOptions::<K>::new().predicate(p))`.
    pub fn for_resource_with<K: FactoryResource>(self, options: SourceOptions<K>) -> Controller<K> {
        let options = options.select(self.common.shard_selector());
        let (informer, cache) = options.informer(&self.common.factory);
        let primary_type = OwnerType {
            group: K::group(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            namespaced: is_namespaced::<K>(),
            only_controller: true,
        };
        let mut controller = Controller::with_primary(
            self.common,
            informer,
            typed_source::<K>(&cache),
            primary_type,
            ApiResource::erase::<K>(&()),
            options.predicates,
        );
        controller.permissions.grant_for::<K>(&Verb::READ);
        if options.every_owner {
            controller.error.get_or_insert(ControllerError::InvalidConfig(
                "every_owner applies to owns_with only".into(),
            ));
        }
        controller
    }

    /// A dynamic primary type (by group/version/kind), as `for_resource` for typed ones.
    pub fn for_dynamic(self, resource: &ApiResource, namespaced: bool) -> Controller<DynamicObject> {
        let informer = self.common.factory.dynamic_informer_for(resource, namespaced);
        let primary_type = OwnerType {
            group: resource.group.clone(),
            kind: resource.kind.clone(),
            namespaced,
            only_controller: true,
        };
        let predicates = Filters::default();
        let sharded = self.common.sharding.is_some();
        let mut controller = Controller::with_primary(
            self.common,
            informer,
            dynamic_source(resource),
            primary_type,
            resource.clone(),
            predicates,
        );
        if sharded {
            controller.error.get_or_insert(ControllerError::InvalidConfig(
                "a sharded controller needs a typed primary type".into(),
            ));
        }
        controller.permissions.grant_dynamic(resource, &Verb::READ);
        controller
    }
}

fn is_namespaced<K: FactoryResource>() -> bool {
    TypeId::of::<K::Scope>() == TypeId::of::<k8s_openapi::NamespaceResourceScope>()
}

impl<K: Resource + Clone + Send + Sync + 'static> Controller<K> {
    fn with_primary(
        common: Common,
        informer: Result<SharedIndexInformer<K>, FactoryError>,
        (key, name): (SourceKey, String),
        primary_type: OwnerType,
        primary_resource: ApiResource,
        predicates: Filters<K>,
    ) -> Self {
        let (informer, error) = match informer {
            Ok(informer) => (Some(informer), None),
            Err(e) => (None, Some(e.into())),
        };
        // A shard must see its objects' drain requests whatever the filters say.
        let drain_label = common.sharding.as_ref().map(ShardingConfig::drain_label);
        // And record the deletions of its objects, so that it reconciles them.
        let deletions = common.sharding.as_ref().map(|config| Arc::new(Deletions::new(config)));
        Controller {
            common,
            primary: Source {
                informer,
                name,
                handling: Handling::Map(Mapping::Object),
                predicates,
                key,
                drain_label,
                deletions,
            },
            primary_type,
            primary_resource,
            sources: Vec::new(),
            error_policy: None,
            error,
            permissions: Permissions::new(),
        }
    }

    fn add_source<C: Resource + Send + Sync + 'static>(
        mut self,
        informer: Result<SharedIndexInformer<C>, FactoryError>,
        handling: Handling<C>,
        (key, name): (SourceKey, String),
        predicates: Filters<C>,
    ) -> Self {
        match informer {
            Ok(informer) => self.sources.push(Box::new(Source {
                informer: Some(informer),
                name,
                handling,
                predicates,
                key,
                drain_label: None,
                deletions: None,
            })),
            Err(e) => {
                self.error.get_or_insert(e.into());
            }
        }
        self
    }

    /// Children of type `C`: a change to one enqueues the key of its controller owner (the
    /// ownerReference with `controller: true`) when that owner is of the primary type.
    #[must_use]
    pub fn owns<C: FactoryResource>(self) -> Self {
        self.owns_with(SourceOptions::<C>::new())
    }

    /// Children of type `C` with predicates of their own, a choice of informer, and
    /// optionally every owner of the primary's kind enqueued (see [`SourceOptions`]).
    #[must_use]
    pub fn owns_with<C: FactoryResource>(mut self, options: SourceOptions<C>) -> Self {
        self.permissions.grant_for::<C>(&Verb::READ);
        let options = options.select(self.common.shard_selector());
        let (informer, cache) = options.informer(&self.common.factory);
        let mut owner = self.primary_type.clone();
        owner.only_controller = !options.every_owner;
        let handling = Handling::Map(Mapping::Owner(owner));
        self.add_source(informer, handling, typed_source::<C>(&cache), options.predicates)
    }

    /// Children of type `C` seen through the factory's shared *metadata* informer
    /// ([`metadata_informer_for`](SharedInformerFactory::metadata_informer_for)): enough to
    /// know which children exist and who owns them, without decoding (or caching) their
    /// specs. Their cache is `ctx.lister_for::<PartialObjectMeta<C>>()`. Predicates over
    /// metadata ([`predicate`](crate::predicate)) apply as to any source: use
    /// `owns_with(SourceOptions::<PartialObjectMeta<C>>::new()...)` for them.
    #[must_use]
    pub fn owns_metadata<C>(self) -> Self
    where
        C: Resource<DynamicType = (), Scope: 'static> + Clone + std::fmt::Debug + Send + Sync + 'static,
    {
        self.owns::<PartialObjectMeta<C>>()
    }

    /// Objects of type `W` seen through the factory's shared metadata informer, as
    /// [`owns_metadata`](Self::owns_metadata): `mapper` gets each object's metadata.
    #[must_use]
    pub fn watches_metadata<W>(
        self,
        mapper: impl Fn(&PartialObjectMeta<W>) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Self
    where
        W: Resource<DynamicType = (), Scope: 'static> + Clone + std::fmt::Debug + Send + Sync + 'static,
    {
        self.watches::<PartialObjectMeta<W>>(mapper)
    }

    /// Dynamic children (by group/version/kind), as [`owns`](Self::owns). Not for a
    /// [`sharded`](ControllerBuilder::sharded) controller: the [`Sharder`](crate::sharding::Sharder) labels
    /// typed children only, so a sharded controller with dynamic children fails to build with
    /// [`ControllerError::InvalidConfig`] rather than caching every child on every shard.
    #[must_use]
    pub fn owns_dynamic(mut self, resource: &ApiResource, namespaced: bool) -> Self {
        if self.common.sharding.is_some() {
            self.error.get_or_insert(ControllerError::InvalidConfig(format!(
                "owns_dynamic({}) on a sharded controller: the sharder labels typed children only; use owns::<C>()",
                resource.kind
            )));
            return self;
        }
        self.permissions.grant_dynamic(resource, &Verb::READ);
        let informer = self.common.factory.dynamic_informer_for(resource, namespaced);
        let mapping = Mapping::Owner(self.primary_type.clone());
        self.add_source(
            informer,
            Handling::Map(mapping),
            dynamic_source(resource),
            Filters::default(),
        )
    }

    /// Objects of type `W`: a change to one enqueues the keys `mapper` returns for it (for
    /// the old and the new state of an update).
    #[must_use]
    pub fn watches<W: FactoryResource>(self, mapper: impl Fn(&W) -> Vec<ObjectKey> + Send + Sync + 'static) -> Self {
        self.watches_with_options(SourceOptions::<W>::new(), mapper)
    }

    /// Objects of type `W` mapped to keys as [`watches`](Self::watches), with predicates of
    /// their own and a choice of informer (see [`SourceOptions`]).
    #[must_use]
    pub fn watches_with_options<W: FactoryResource>(
        mut self,
        options: SourceOptions<W>,
        mapper: impl Fn(&W) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Self {
        if options.every_owner {
            self.error.get_or_insert(ControllerError::InvalidConfig(
                "every_owner applies to owns_with only".into(),
            ));
        }
        self.permissions.grant_for::<W>(&Verb::READ);
        let (informer, cache) = options.informer(&self.common.factory);
        let mapper: MapFunc<W> = Arc::new(mapper);
        let handling = Handling::Map(Mapping::Func(mapper));
        self.add_source(informer, handling, typed_source::<W>(&cache), options.predicates)
    }

    /// Reconciles the key of each item of `keys` as it arrives (kube-runtime's `reconcile_on`,
    /// controller-runtime's channel source): for objects that depend on something outside the
    /// cluster. The stream is read from the time the controller is built (on the caller's tokio
    /// runtime) until it ends or the controller stops taking keys.
    #[must_use]
    pub fn reconcile_on(mut self, keys: impl Stream<Item = ObjectKey> + Send + 'static) -> Self {
        self.common.triggers.push(Trigger {
            name: "reconcile_on",
            signals: std::sync::Mutex::new(Some(keys.map(Signal::Key).boxed())),
            primary_keys: self.primary_keys(),
        });
        self
    }

    /// Reconciles every primary object in the cache once per item of `signals` (kube-runtime's
    /// `reconcile_all_on`), e.g. when a configuration file all of them depend on changed. Keys
    /// already queued are merged, so a burst of signals reconciles each object about once.
    /// The keys are queued at [`LOW_PRIORITY`](crate::LOW_PRIORITY), as a resync's:
    /// a real change is not stuck behind the whole cache.
    #[must_use]
    pub fn reconcile_all_on<T>(mut self, signals: impl Stream<Item = T> + Send + 'static) -> Self {
        self.common.triggers.push(Trigger {
            name: "reconcile_all_on",
            signals: std::sync::Mutex::new(Some(signals.map(|_| Signal::All).boxed())),
            primary_keys: self.primary_keys(),
        });
        self
    }

    /// The keys of every primary object in the cache, read when called.
    fn primary_keys(&self) -> PrimaryKeys {
        let indexer = self
            .primary
            .informer
            .as_ref()
            .map(|informer| informer.indexer().clone());
        Arc::new(move || {
            indexer.as_ref().map_or_else(Vec::new, |indexer| {
                indexer
                    .list()
                    .iter()
                    .filter_map(|obj| ObjectKey::from_object(&**obj))
                    .collect()
            })
        })
    }

    /// Dynamic objects (by group/version/kind), as [`watches`](Self::watches).
    #[must_use]
    pub fn watches_dynamic(
        mut self,
        resource: &ApiResource,
        namespaced: bool,
        mapper: impl Fn(&DynamicObject) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Self {
        self.permissions.grant_dynamic(resource, &Verb::READ);
        let informer = self.common.factory.dynamic_informer_for(resource, namespaced);
        let mapper: MapFunc<DynamicObject> = Arc::new(mapper);
        let handling = Handling::Map(Mapping::Func(mapper));
        self.add_source(informer, handling, dynamic_source(resource), Filters::default())
    }

    /// Objects of type `W`, through a handler of your own that is given the controller's queue
    /// (controller-runtime's `Watches(object, handler)`): for a handler that must act before it
    /// enqueues, such as client-go's expectations, which must count an observed Pod before the
    /// reconcile it wakes can run. The event filters do not apply to it. Its informer's cache is
    /// in the context as for any other source.
    ///
    /// ```no_run
    /// # use controller::{Controller, ObjectKey};
    /// # use informer_core::ResourceEventHandlerFuncs;
    /// # use k8s_openapi::api::apps::v1::ReplicaSet;
    /// # use k8s_openapi::api::core::v1::Pod;
    /// # fn demo(factory: &factory::SharedInformerFactory) {
    /// let controller = Controller::new("replicaset", factory)
    ///     .for_resource::<ReplicaSet>()
    ///     .watches_with::<Pod, _>(|queue| {
    ///         ResourceEventHandlerFuncs::new().on_add(move |pod: &std::sync::Arc<Pod>, _| {
    ///             // ... note the Pod as observed, then wake its owner:
    ///             let owner = pod.metadata.owner_references.as_ref().and_then(|r| r.first());
    ///             if let (Some(owner), Some(ns)) = (owner, &pod.metadata.namespace) {
    ///                 queue.add(ObjectKey::namespaced(ns, &owner.name));
    ///             }
    ///         })
    ///     });
    /// # let _ = controller; }
    /// ```
    #[must_use]
    pub fn watches_with<W: FactoryResource, H: ResourceEventHandler<W>>(
        mut self,
        make: impl FnOnce(Enqueuer) -> H + Send + 'static,
    ) -> Self {
        self.permissions.grant_for::<W>(&Verb::READ);
        let informer = self.common.factory.informer_for::<W>();
        let make: MakeHandler<W> = Box::new(move |queue| Box::new(make(queue)));
        let handling = Handling::Custom(std::sync::Mutex::new(Some(make)));
        let source = typed_source::<W>(&CacheOptions::default());
        self.add_source(informer, handling, source, Filters::default())
    }

    /// Declares the writes the reconciler makes to `C` (kubebuilder's `+kubebuilder:rbac`
    /// marker, checked into the controller): `writes::<Deployment>(&[Verb::Create,
    /// Verb::Patch])`. They go into [`BuiltController::permissions`] and from there into the
    /// controller's RBAC rules ([`crate::manifests`]); an owned type gets no write verb unless
    /// declared. Any verb may be declared, `get` of a type read outside the sources included.
    #[must_use]
    pub fn writes<C: Resource<DynamicType = ()>>(mut self, verbs: &[Verb]) -> Self {
        self.permissions.grant_for::<C>(verbs);
        self
    }

    /// Declares the writes the reconciler makes to `C`'s status subresource (`foos/status`),
    /// as [`writes`](Self::writes).
    #[must_use]
    pub fn writes_status<C: Resource<DynamicType = ()>>(mut self, verbs: &[Verb]) -> Self {
        self.permissions.grant_subresource_for::<C>("status", verbs);
        self
    }

    /// Declares that the reconciler reads `C` through the factory outside the controller's
    /// sources (a lister of a type nothing here watches): `get`, `list`, `watch` on it.
    #[must_use]
    pub fn reads<C: Resource<DynamicType = ()>>(mut self) -> Self {
        self.permissions.grant_for::<C>(&Verb::READ);
        self
    }

    /// Adds a filter every notification (of every source) must pass to enqueue a key; see
    /// [`predicate`](crate::predicate) for the ready-made ones. Filters combine with "and",
    /// and with each source's own predicates ([`SourceOptions::predicate`]). They see metadata
    /// only, as they apply to sources of every type.
    ///
    /// On a [sharded](ControllerBuilder::sharded) controller, sharding's drain acknowledgements
    /// bypass filters: an update of a primary object that changed its drain label
    /// (`drain.shard.kinformer.io/<ring>`), or a primary object listed while draining, is queued
    /// at [`NORMAL_PRIORITY`](crate::NORMAL_PRIORITY) whatever the filters say, so
    /// that the shard hands the object over (a draining object is handed over, not
    /// reconciled). Filtered out, a label-only change under `GenerationChanged` say, the object
    /// would stay draining forever.
    #[must_use]
    pub fn with_event_filter(mut self, predicate: impl Predicate) -> Self {
        self.common.predicates.push(Arc::new(predicate));
        self
    }

    /// How many reconciles may run at once (controller-runtime's `MaxConcurrentReconciles`;
    /// default 1). Never two of one key.
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.common.workers = workers;
        self
    }

    /// The rate limiter of failed and requeued keys (default: client-go's
    /// [`default_controller_rate_limiter`]: 5 ms doubling per failure up to 1000 s, and an
    /// overall 10 qps / burst 100 bucket).
    #[must_use]
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<ObjectKey> + 'static) -> Self {
        self.common.rate_limiter = Some(Box::new(limiter));
        self
    }

    /// Whether the work queue is a priority queue (default `true`, controller-runtime's
    /// `UsePriorityQueue`): keys from the initial list and from resyncs wait behind keys from real
    /// changes, so after a restart a change is reconciled before the backlog (see
    /// [`WorkQueue`](crate::WorkQueue)). `false`: the plain FIFO queue of client-go.
    #[must_use]
    pub fn use_priority_queue(mut self, use_priority_queue: bool) -> Self {
        self.common.use_priority_queue = use_priority_queue;
        self
    }

    /// How long the workers may take after shutdown to finish the keys already queued and the
    /// reconciles in flight (default 30 s).
    #[must_use]
    pub fn graceful_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.common.graceful_shutdown_timeout = timeout;
        self
    }

    /// How long to wait for the caches before failing with
    /// [`ControllerError::CacheSyncTimeout`] (default 2 min).
    #[must_use]
    pub fn cache_sync_timeout(mut self, timeout: Duration) -> Self {
        self.common.cache_sync_timeout = timeout;
        self
    }

    /// How long a reconcile may run (controller-runtime's `ReconciliationTimeout`; default:
    /// none). Past it the reconcile's [`Context::token`] is cancelled and its future dropped at
    /// once, so a hung reconcile never holds a worker longer; it is counted in
    /// `controller_runtime_reconcile_timeouts_total` and takes the error path with a
    /// [`ReconcileTimeout`](crate::ReconcileTimeout) error. (controller-runtime only cancels the
    /// reconcile's `context.Context` and waits for the reconciler to notice.)
    #[must_use]
    pub fn reconcile_timeout(mut self, timeout: Duration) -> Self {
        self.common.reconcile_timeout = Some(timeout);
        self
    }

    /// Whether a panicking reconcile is caught (controller-runtime's `RecoverPanic`; default
    /// true): it then takes the error path with a [`ReconcilePanic`](crate::ReconcilePanic)
    /// error carrying its message. Off, the panic is counted and the controller stops at once,
    /// its run returning [`ControllerError::ReconcilePanicked`] (under a
    /// [`Manager`](crate::Manager), which then shuts down and fails).
    #[must_use]
    pub fn recover_panic(mut self, recover: bool) -> Self {
        self.common.recover_panic = recover;
        self
    }

    /// What to do with a key whose reconcile failed (kube-runtime's `error_policy`): `policy`
    /// gets the error (the reconciler's, a [`ReconcileTimeout`](crate::ReconcileTimeout) or a
    /// [`ReconcilePanic`](crate::ReconcilePanic)), the request and the context, and returns the
    /// [`Action`]. Not asked for a [`TerminalError`](crate::TerminalError) or a
    /// [`RequeueAfterError`](crate::RequeueAfterError), which say themselves. Without one, a
    /// failed key is retried rate-limited, as in controller-runtime. See
    /// [`outcome`](crate::outcome).
    ///
    /// ```no_run
    /// # use controller::{Action, Controller, ReconcileTimeout, outcome::find_in_chain};
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use std::time::Duration;
    /// # fn demo(factory: &factory::SharedInformerFactory) {
    /// let controller = Controller::new("configmaps", factory)
    ///     .for_resource::<ConfigMap>()
    ///     .error_policy(|err, _req, _ctx| match find_in_chain::<ReconcileTimeout>(err) {
    ///         Some(_) => Action::RequeueAfter(Duration::from_secs(60)),
    ///         None => Action::Requeue,
    ///     });
    /// # let _ = controller; }
    /// ```
    #[must_use]
    pub fn error_policy(
        mut self,
        policy: impl Fn(&(dyn std::error::Error + Send + Sync + 'static), &Request, &Context<K>) -> Action
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.error_policy = Some(Arc::new(policy));
        self
    }

    /// Registers the controller's handlers on the shared informers and binds `reconciler`;
    /// run the result with [`BuiltController::run`] or add it to a [`Manager`](crate::Manager).
    ///
    /// From here on the handlers enqueue keys (also while a manager stands by for leadership),
    /// but nothing is reconciled until the controller runs.
    pub fn build<R: Reconciler<K>>(self, reconciler: R) -> Result<BuiltController<K, R>, ControllerError> {
        let Controller {
            common,
            primary,
            primary_type,
            primary_resource,
            sources,
            error_policy,
            error,
            mut permissions,
            ..
        } = self;
        if let Some(error) = error {
            return Err(error);
        }
        if let Some(sharding) = &common.sharding {
            sharding.validate().map_err(ControllerError::InvalidConfig)?;
        }
        if common.workers == 0 {
            return Err(ControllerError::InvalidConfig("workers must be at least 1".into()));
        }
        let Some(primary_informer) = primary.informer.clone() else {
            return Err(ControllerError::InvalidConfig("no primary informer".into()));
        };
        let metrics = match common.metrics {
            Some(metrics) => metrics,
            None => Metrics::new(&prometheus::Registry::new())?,
        };
        let rate_limiter = common
            .rate_limiter
            .unwrap_or_else(|| Box::new(default_controller_rate_limiter()));
        let queue = WorkQueue::new(
            common.use_priority_queue,
            rate_limiter,
            QueueConfig::default()
                .name(common.name.clone())
                .metrics_provider(metrics.workqueue_provider()),
        );
        permissions.merge(&Permissions::events());
        let (recorder, owns_recorder) = match common.recorder {
            Some(recorder) => (recorder, false),
            None => {
                let reporter = Reporter {
                    controller: common.name.clone(),
                    instance: hostname(),
                };
                (EventRecorder::new(common.factory.client().clone(), reporter), true)
            }
        };

        // One cache per type: `Context::lister_for::<C>()` must not have two to choose from.
        let all_sources = || {
            std::iter::once(&primary as &dyn ErasedSource)
                .chain(sources.iter().map(|s| &**s))
                .chain(common.triggers.iter().map(|t| t as &dyn ErasedSource))
        };
        let mut caches: Vec<(SourceKey, &str)> = Vec::new();
        for (key, name) in all_sources().filter_map(|source| source.cache()) {
            if let Some((_, first)) = caches.iter().find(|(k, n)| *k == key && *n != name) {
                return Err(ControllerError::ConflictingCaches {
                    controller: common.name.clone(),
                    first: (*first).to_owned(),
                    second: name.to_owned(),
                });
            }
            caches.push((key, name));
        }
        let predicates = EventFilters(common.predicates);
        let mut typed = HashMap::new();
        let mut dynamic = HashMap::new();
        let mut registrations: Vec<Box<dyn ErasedRegistration>> = Vec::new();
        for source in all_sources() {
            source.add_to_context(&mut typed, &mut dynamic);
            match source.register(&common.name, &queue, &predicates) {
                Ok(registration) => registrations.push(registration),
                Err(e) => {
                    registrations.iter().for_each(|r| r.remove());
                    return Err(e.into());
                }
            }
        }
        let context = Context::new(ContextInner {
            name: common.name.clone(),
            client: common.factory.client().clone(),
            primary: primary_informer.indexer().clone(),
            primary_namespaced: primary_type.namespaced,
            typed,
            dynamic,
            recorder: recorder.clone(),
        });
        if common.sharding.is_some() {
            // The drain acknowledgement's label patch, and the shard's own Lease.
            permissions.grant_dynamic(&primary_resource, &[Verb::Patch]);
            permissions.grant_for::<k8s_openapi::api::coordination::v1::Lease>(&[
                Verb::Get,
                Verb::Create,
                Verb::Update,
                Verb::Patch,
            ]);
        }
        let sharding = common.sharding.map(|config| {
            let indexer = primary_informer.indexer().clone();
            let namespaced = primary_type.namespaced;
            let lookup: crate::sharding::Lookup = Arc::new(move |key: &ObjectKey| {
                let key = if namespaced { key.cache_key() } else { key.name.clone() };
                indexer.get_by_key(&key).map(|obj| obj.meta().clone())
            });
            let deletions = primary
                .deletions
                .clone()
                .unwrap_or_else(|| Arc::new(Deletions::new(&config)));
            Arc::new(ShardGate::new(
                config,
                lookup,
                common.factory.client().clone(),
                primary_resource,
                namespaced,
                deletions,
            ))
        });
        debug!(controller = %common.name, sources = registrations.len(), sharded = sharding.is_some(), "controller built");
        Ok(BuiltController {
            name: common.name.clone(),
            factory: common.factory,
            queue,
            reconciler: Arc::new(reconciler),
            context,
            registrations,
            metrics: metrics.for_controller(&common.name),
            workers: common.workers,
            graceful_shutdown_timeout: common.graceful_shutdown_timeout,
            cache_sync_timeout: common.cache_sync_timeout,
            recorder,
            owns_recorder,
            outcomes: Outcomes {
                error_policy,
                reconcile_timeout: common.reconcile_timeout,
                recover_panic: common.recover_panic,
            },
            refused_retries: RefusedRetries::default(),
            sharding,
            permissions,
        })
    }

    /// Builds the controller, starts the factory's informers and runs until `shutdown` fires
    /// (a controller on its own; a [`Manager`](crate::Manager) does this for its controllers).
    pub async fn run<R: Reconciler<K>>(
        self,
        reconciler: R,
        shutdown: CancellationToken,
    ) -> Result<(), ControllerError> {
        let controller = self.build(reconciler)?;
        controller.factory.start(&shutdown);
        controller.run(shutdown).await
    }
}

impl From<SourceError> for ControllerError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::Informer(e) => ControllerError::Informer(e),
            SourceError::InvalidConfig(reason) => ControllerError::InvalidConfig(reason.into()),
        }
    }
}
