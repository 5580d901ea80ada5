//! `SharedInformerFactory`: one shared informer per resource type (client-go
//! `informers.SharedInformerFactory` and `dynamicinformer`).
//!
//! Where it sits in the data path: above `informer-core`. Every consumer in a process asks
//! the factory for the informer of a type and gets the same [`SharedIndexInformer`], so one
//! list/watch per type feeds every handler and lister. `start` runs the informers requested
//! so far (call it again after requesting more); `wait_for_cache_sync` waits for their caches;
//! `shutdown` stops them all and waits.
//!
//! The factory owns every task it spawns: each informer's task and the task linking each
//! `start` caller's token to the factory's own are held by the factory and joined by `shutdown`,
//! so none outlives it; an informer's task that panics is logged at ERROR with its name.
//!
//! ```no_run
//! use std::time::Duration;
//! use factory::SharedInformerFactory;
//! use k8s_openapi::api::apps::v1::Deployment;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube::Client) -> Result<(), factory::FactoryError> {
//! let factory = SharedInformerFactory::builder(client)
//!     .default_resync(Duration::from_secs(600))
//!     .namespace("prod")
//!     .strip_managed_fields(true)
//!     .build();
//! let deployments = factory.informer_for::<Deployment>()?;
//! let shutdown = CancellationToken::new();
//! factory.start(&shutdown);
//! let synced = factory.wait_for_cache_sync(&shutdown).await;
//! assert!(synced.values().all(|ok| *ok));
//! println!("{} deployments", deployments.indexer().len());
//! factory.shutdown().await;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod cache_options;
pub mod generated;
mod resource;

pub use cache_options::{CacheOptions, NamespaceConfig, SelectorError, parse_label_selector};
pub use resource::{Compact, InformerResource};

/// Paths the generated code (and `#[derive(Informer)]` code compiled inside this crate) uses
/// in place of the `::kinformer` facade, which this crate cannot depend on.
#[doc(hidden)]
pub mod __private {
    pub use crate as factory;
    pub use informer_core as cache;
}

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use informer_core::{
    ApiListerWatcher, InformerConfig, InformerError, InformerStats, ListerWatcher, Partition, ReflectorConfig,
    SharedIndexInformer, TransformFunc,
};
use kube::api::{ApiResource, DynamicObject};
pub use kube::core::PartialObjectMeta;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

/// A typed resource the factory can make informers for: any `kube::Resource` with a static
/// type and the per-type hooks of [`InformerResource`], which the code generator emits
/// (k8s-openapi types, types generated from CRDs, `#[derive(Informer)]` types).
pub trait FactoryResource:
    Resource<DynamicType = (), Scope: 'static> + InformerResource + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> FactoryResource for K where
    K: Resource<DynamicType = (), Scope: 'static>
        + InformerResource
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// Errors from the factory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FactoryError {
    /// `shutdown` was called; the factory makes no more informers.
    #[error("the informer factory has been shut down")]
    ShutDown,
    /// Configuring the informer failed.
    #[error(transparent)]
    Informer(#[from] InformerError),
    /// Some informers did not sync within the time given to
    /// [`wait_for_cache_sync_timeout`](SharedInformerFactory::wait_for_cache_sync_timeout): a
    /// wrong group or version, a CRD that is not installed, or missing RBAC, typically.
    #[error("informers not synced within {timeout:?}: {}", informers.join(", "))]
    CacheSyncTimeout {
        /// How long the factory waited.
        timeout: Duration,
        /// The informers that had not synced (`apiVersion/Kind`).
        informers: Vec<String>,
    },
    /// A type's cache options do not parse (a label or field selector, or an empty namespace).
    #[error(transparent)]
    InvalidOptions(#[from] SelectorError),
    /// A type's shared informer was asked for with options other than those it has (or was
    /// configured with by [`by_object`](SharedInformerFactoryBuilder::by_object)): two consumers
    /// would share a cache filtered for one of them. Use
    /// [`informer_for_with`](SharedInformerFactory::informer_for_with) to say which informer is
    /// meant.
    #[error("the shared informer of {kind} has options [{existing}]; asked for with [{requested}]")]
    ConflictingOptions {
        /// `apiVersion/Kind`.
        kind: String,
        /// The options of the type's shared informer.
        existing: Box<CacheOptions>,
        /// The options asked for.
        requested: Box<CacheOptions>,
    },
    /// Shutdown fired before the informers synced.
    #[error("shut down before the informers synced: {}", informers.join(", "))]
    CacheSyncCancelled {
        /// The informers that had not synced (`apiVersion/Kind`).
        informers: Vec<String>,
    },
}

/// The list options a tweak may change for every informer of a factory (client-go
/// `TweakListOptionsFunc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListOptions {
    /// Label selector for list and watch.
    pub label_selector: Option<String>,
    /// Field selector for list and watch.
    pub field_selector: Option<String>,
    /// Objects per list page (0: no paging).
    pub page_size: u32,
}

type Tweak = Arc<dyn Fn(&mut ListOptions) + Send + Sync>;

/// Which informer: a static type with its cache options, or a dynamic resource by
/// group/version/kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum InformerKey {
    Typed(TypeId, CacheOptions),
    Dynamic {
        group: String,
        version: String,
        kind: String,
    },
}

/// What the factory needs of an informer without knowing its type.
trait Runnable: Send + Sync {
    fn run(&self, shutdown: CancellationToken) -> BoxFuture<'static, ()>;
    fn wait_for_cache_sync(&self, shutdown: CancellationToken) -> BoxFuture<'static, bool>;
    fn stats(&self) -> InformerStats;
}

impl<K: Resource + Send + Sync + 'static> Runnable for SharedIndexInformer<K> {
    fn run(&self, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        let informer = self.clone();
        Box::pin(async move { informer.run(shutdown).await })
    }

    fn wait_for_cache_sync(&self, shutdown: CancellationToken) -> BoxFuture<'static, bool> {
        let informer = self.clone();
        Box::pin(async move { informer.wait_for_cache_sync(&shutdown).await })
    }

    fn stats(&self) -> InformerStats {
        SharedIndexInformer::stats(self)
    }
}

struct Entry {
    /// `api_version/kind`, the name used in sync results and logs.
    name: String,
    /// The `SharedIndexInformer<K>`, to downcast.
    informer: Box<dyn Any + Send + Sync>,
    runnable: Arc<dyn Runnable>,
    task: Option<JoinHandle<()>>,
}

struct State {
    /// Invariant: every typed key `(t, o)` is either `shared[t] == o` or was asked for by
    /// `informer_for_with`; `shared[t]` need not have an informer yet.
    informers: HashMap<InformerKey, Entry>,
    /// The options of each type's shared informer ([`SharedInformerFactory::informer_for`]):
    /// those of `by_object`, else those of the first request for it.
    shared: HashMap<TypeId, CacheOptions>,
    shut_down: bool,
    /// The tasks `start` spawned to stop the factory when its caller's token fires, one per
    /// call still waiting; joined by `shutdown` with the informers' tasks.
    links: Vec<JoinHandle<()>>,
}

struct Inner {
    client: Client,
    default_resync: Duration,
    /// The namespaces of namespaced types without their own (empty: all).
    namespaces: Vec<String>,
    tweak: Option<Tweak>,
    custom_resync: HashMap<TypeId, Duration>,
    transforms: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    strip_managed_fields: bool,
    page_size: u32,
    server_behind_check: Duration,
    /// Every informer decodes on tokio's blocking pool (`decode_on_blocking_pool`).
    decode_on_blocking_pool: bool,
    /// Each type's configured cache options (`by_object`).
    by_object: HashMap<TypeId, CacheOptions>,
    /// Parent of every informer's shutdown token.
    stop: CancellationToken,
    state: Mutex<State>,
}

/// The name the factory gives `K`'s informer with `options`: `apiVersion/Kind`, `(metadata)`
/// for a metadata-only informer, and the options when they are not the defaults (sync results
/// and logs are keyed by it, so informers of one type with other options differ).
pub fn informer_name<K: FactoryResource>(options: &CacheOptions) -> String {
    let name = if K::metadata_api() {
        format!("{}/{} (metadata)", K::api_version(&()), K::kind(&()))
    } else if let Some(projection) = K::projection() {
        format!("{}/{} (projection {projection})", K::api_version(&()), K::kind(&()))
    } else {
        format!("{}/{}", K::api_version(&()), K::kind(&()))
    };
    if options.is_default() {
        name
    } else {
        format!("{name} [{options}]")
    }
}

/// Hands out one shared informer per resource type (client-go `SharedInformerFactory`).
/// Cloning is cheap and shares the informers.
#[derive(Clone)]
pub struct SharedInformerFactory {
    inner: Arc<Inner>,
}

/// Builds a [`SharedInformerFactory`] with client-go's options.
#[must_use]
pub struct SharedInformerFactoryBuilder {
    client: Client,
    default_resync: Duration,
    /// The namespaces of namespaced types without their own (empty: all).
    namespaces: Vec<String>,
    tweak: Option<Tweak>,
    custom_resync: HashMap<TypeId, Duration>,
    transforms: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    strip_managed_fields: bool,
    page_size: u32,
    server_behind_check: Duration,
    decode_on_blocking_pool: bool,
    by_object: HashMap<TypeId, CacheOptions>,
}

impl SharedInformerFactoryBuilder {
    /// The resync period of every informer without a custom one (zero: none).
    pub fn default_resync(mut self, period: Duration) -> Self {
        self.default_resync = period;
        self
    }

    /// Watch only this namespace (namespaced resources; cluster-scoped ones are unaffected).
    /// Replaces [`namespaces`](Self::namespaces).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespaces = vec![namespace.into()];
        self
    }

    /// Watch only these namespaces (controller-runtime's `cache.Options.DefaultNamespaces`):
    /// every namespaced type whose own options name no namespace gets one list/watch per
    /// namespace behind one informer, one cache and one lister (see [`CacheOptions::namespaces`]).
    /// Cluster-scoped types are unaffected. Replaces [`namespace`](Self::namespace).
    pub fn namespaces<S: Into<String>>(mut self, namespaces: impl IntoIterator<Item = S>) -> Self {
        let mut all: Vec<String> = namespaces.into_iter().map(Into::into).collect();
        all.sort();
        all.dedup();
        self.namespaces = all;
        self
    }

    /// Adjusts the list/watch options of every informer (e.g. a label selector).
    pub fn tweak_list_params(mut self, tweak: impl Fn(&mut ListOptions) + Send + Sync + 'static) -> Self {
        self.tweak = Some(Arc::new(tweak));
        self
    }

    /// A resync period for `K`'s informer instead of the default.
    pub fn custom_resync<K: FactoryResource>(mut self, period: Duration) -> Self {
        self.custom_resync.insert(TypeId::of::<K>(), period);
        self
    }

    /// The options of `K`'s shared informer (controller-runtime's `cache.Options.ByObject`): a
    /// label selector, a field selector, a namespace or several. Every consumer of
    /// [`informer_for::<K>()`](SharedInformerFactory::informer_for) then shares a cache of only
    /// those objects; see [`CacheOptions`]. Checked when the informer is requested.
    pub fn by_object<K: FactoryResource>(mut self, options: CacheOptions) -> Self {
        self.by_object.insert(TypeId::of::<K>(), options);
        self
    }

    /// A transform for `K`'s objects before they enter the cache (after the default one), in
    /// every informer of `K` whatever its options.
    pub fn transform<K: FactoryResource>(mut self, transform: impl Fn(K) -> K + Send + Sync + 'static) -> Self {
        let transform: TransformFunc<K> = Arc::new(transform);
        self.transforms.insert(TypeId::of::<K>(), Box::new(transform));
        self
    }

    /// Drop `metadata.managedFields` from every object, which controllers rarely read and which
    /// is often the largest part of an object. Typed objects skip them while they are decoded,
    /// so they are never allocated ([`ApiListerWatcher::skip_managed_fields`]); a transform
    /// clears them from anything decoded otherwise (dynamic objects).
    pub fn strip_managed_fields(mut self, on: bool) -> Self {
        self.strip_managed_fields = on;
        self
    }

    /// Objects per list page (default 500; 0: no paging).
    pub fn page_size(mut self, page_size: u32) -> Self {
        self.page_size = page_size;
        self
    }

    /// How long every informer's list or watch at a resourceVersion may go unanswered before
    /// its reflector checks whether the server went back in time (restored from an older
    /// backup): [`ReflectorConfig::server_behind_check`], default
    /// [`DEFAULT_SERVER_BEHIND_CHECK`](informer_core::reflector::DEFAULT_SERVER_BEHIND_CHECK);
    /// zero turns the check off.
    pub fn server_behind_check(mut self, after: Duration) -> Self {
        self.server_behind_check = after;
        self
    }

    /// Decode every informer's list pages and watch events on tokio's blocking pool instead of
    /// the informer's decoding thread (default `false`): for tests under tokio's paused clock
    /// (`#[tokio::test(start_paused = true)]`), which advances while the decoding thread works
    /// (it is not one of tokio's) but not while a blocking-pool task runs, so a timeout,
    /// backoff or resync could fire in the middle of a decode. It costs the memory the thread
    /// saves: see [`ApiListerWatcher::decode_on_blocking_pool`].
    pub fn decode_on_blocking_pool(mut self, on: bool) -> Self {
        self.decode_on_blocking_pool = on;
        self
    }

    /// The factory.
    pub fn build(self) -> SharedInformerFactory {
        SharedInformerFactory {
            inner: Arc::new(Inner {
                client: self.client,
                default_resync: self.default_resync,
                namespaces: self.namespaces,
                tweak: self.tweak,
                custom_resync: self.custom_resync,
                transforms: self.transforms,
                strip_managed_fields: self.strip_managed_fields,
                page_size: self.page_size,
                server_behind_check: self.server_behind_check,
                decode_on_blocking_pool: self.decode_on_blocking_pool,
                by_object: self.by_object.clone(),
                stop: CancellationToken::new(),
                state: Mutex::new(State {
                    informers: HashMap::new(),
                    shared: self.by_object.clone(),
                    shut_down: false,
                    links: Vec::new(),
                }),
            }),
        }
    }
}

fn strip_managed_fields<K: Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

impl SharedInformerFactory {
    /// A factory with a default resync period and no other options.
    pub fn new(client: Client, default_resync: Duration) -> Self {
        Self::builder(client).default_resync(default_resync).build()
    }

    /// A builder with client-go's options.
    pub fn builder(client: Client) -> SharedInformerFactoryBuilder {
        SharedInformerFactoryBuilder {
            client,
            default_resync: Duration::ZERO,
            namespaces: Vec::new(),
            tweak: None,
            custom_resync: HashMap::new(),
            transforms: HashMap::new(),
            strip_managed_fields: false,
            page_size: 500,
            server_behind_check: informer_core::reflector::DEFAULT_SERVER_BEHIND_CHECK,
            decode_on_blocking_pool: false,
            by_object: HashMap::new(),
        }
    }

    /// The client informers use.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    // No code panics while holding this lock; take over a poisoned one.
    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reflector_config(&self, name: String, cache: &CacheOptions) -> ReflectorConfig {
        let mut options = ListOptions {
            page_size: self.inner.page_size,
            ..ListOptions::default()
        };
        if let Some(tweak) = &self.inner.tweak {
            tweak(&mut options);
        }
        let mut config = ReflectorConfig::default()
            .name(name)
            .server_behind_check(self.inner.server_behind_check);
        // 500 is the pager's default: leave it to the reflector, whose relists at a
        // resourceVersion then go unpaginated to the watch cache, as client-go's factory
        // informers (which never set a page size) do. Any other size applies to every list.
        if options.page_size != informer_core::reflector::DEFAULT_PAGE_SIZE {
            config = config.page_size(options.page_size);
        }
        // A type's own selectors replace the factory-wide tweak's.
        if let Some(selector) = cache.label_selector.clone().or(options.label_selector) {
            config = config.labels(selector);
        }
        if let Some(selector) = cache.field_selector.clone().or(options.field_selector) {
            config = config.fields(selector);
        }
        config
    }

    /// The shared metadata-only informer for `K` (client-go's `metadatainformer`): its cache
    /// holds `PartialObjectMeta<K>`, each object's `ObjectMeta` alone (names, labels,
    /// annotations, owner references, finalizers, resourceVersion), asked of the server as
    /// `PartialObjectMetadataList`. For controllers that need to know which objects exist and
    /// who owns them, at a fraction of the memory of whole objects. It is
    /// `informer_for::<PartialObjectMeta<K>>()`: one list and watch per type, shared, and apart
    /// from `informer_for::<K>()`'s.
    pub fn metadata_informer_for<K>(&self) -> Result<SharedIndexInformer<PartialObjectMeta<K>>, FactoryError>
    where
        K: Resource<DynamicType = (), Scope: 'static> + Clone + Debug + Send + Sync + 'static,
    {
        self.informer_for::<PartialObjectMeta<K>>()
    }

    /// The shared informer for `K`: made on the first call, the same one on every later call.
    /// `K` may be `PartialObjectMeta<T>` for a metadata-only informer (see
    /// [`metadata_informer_for`](Self::metadata_informer_for)). It has the options of
    /// [`by_object`](SharedInformerFactoryBuilder::by_object), or none: this is
    /// [`shared_informer_with`](Self::shared_informer_with) with those, so it is refused once
    /// another consumer asked for `K`'s shared informer with other options, whatever the order.
    pub fn informer_for<K: FactoryResource>(&self) -> Result<SharedIndexInformer<K>, FactoryError> {
        let options = self
            .inner
            .by_object
            .get(&TypeId::of::<K>())
            .cloned()
            .unwrap_or_default();
        self.shared_informer_with(options)
    }

    /// `K`'s shared informer, which must have `options`: made with them on the first request,
    /// refused with [`FactoryError::ConflictingOptions`] if `K`'s shared informer has (or was
    /// configured with) other options, so two consumers never silently share a cache filtered
    /// for one of them.
    pub fn shared_informer_with<K: FactoryResource>(
        &self,
        options: CacheOptions,
    ) -> Result<SharedIndexInformer<K>, FactoryError> {
        let mut state = self.state();
        if let Some(existing) = state.shared.get(&TypeId::of::<K>())
            && *existing != options
        {
            return Err(FactoryError::ConflictingOptions {
                kind: format!("{}/{}", K::api_version(&()), K::kind(&())),
                existing: Box::new(existing.clone()),
                requested: Box::new(options),
            });
        }
        self.typed_informer(&mut state, options, true)
    }

    /// The informer of `K` for exactly `options` (saying which informer is meant, where
    /// [`shared_informer_with`](Self::shared_informer_with) would refuse): `K`'s shared
    /// informer if it has these options, else one of its own, shared by every request for `K`
    /// with equal options. Each is a list and watch of its own.
    ///
    /// ```no_run
    /// # fn demo(factory: &factory::SharedInformerFactory) -> Result<(), factory::FactoryError> {
    /// use factory::CacheOptions;
    /// use k8s_openapi::api::core::v1::Pod;
    ///
    /// let every_pod = factory.informer_for::<Pod>()?;
    /// let web_pods = factory.informer_for_with::<Pod>(CacheOptions::default().labels("app=web"))?;
    /// # let _ = (every_pod, web_pods); Ok(()) }
    /// ```
    pub fn informer_for_with<K: FactoryResource>(
        &self,
        options: CacheOptions,
    ) -> Result<SharedIndexInformer<K>, FactoryError> {
        let mut state = self.state();
        self.typed_informer(&mut state, options, false)
    }

    /// The informer of `K` with `options`, made if missing; `claim_shared` makes these the
    /// options of `K`'s shared informer if it has none yet.
    fn typed_informer<K: FactoryResource>(
        &self,
        state: &mut State,
        options: CacheOptions,
        claim_shared: bool,
    ) -> Result<SharedIndexInformer<K>, FactoryError> {
        if state.shut_down {
            return Err(FactoryError::ShutDown);
        }
        let key = InformerKey::Typed(TypeId::of::<K>(), options.clone());
        if let Some(entry) = state.informers.get(&key)
            && let Some(informer) = entry.informer.downcast_ref::<SharedIndexInformer<K>>()
        {
            let informer = informer.clone();
            if claim_shared {
                state.shared.entry(TypeId::of::<K>()).or_insert(options);
            }
            return Ok(informer);
        }
        options.validate()?;
        let namespaced = TypeId::of::<K::Scope>() == TypeId::of::<k8s_openapi::NamespaceResourceScope>();
        let name = informer_name::<K>(&options);
        // The namespaces listed, each with the options it lists with: the type's own, else
        // the factory's; none for a cluster-scoped type or when all are watched.
        let namespaces: Vec<(String, CacheOptions)> = if !namespaced {
            Vec::new()
        } else if !options.namespaces.is_empty() {
            options
                .namespaces
                .keys()
                .map(|namespace| (namespace.clone(), options.for_namespace(namespace)))
                .collect()
        } else if let Some(namespace) = &options.namespace {
            vec![(namespace.clone(), options.clone())]
        } else {
            let of = |namespace: &String| (namespace.clone(), options.clone().namespace(namespace.clone()));
            self.inner.namespaces.iter().map(of).collect()
        };
        // One lister-watcher's settings and decoding thread for every partition: all of the
        // informer's objects are decoded (and freed) on one thread.
        let base = ApiListerWatcher::<K>::from_url_path(self.inner.client.clone(), K::url_path(&(), None))
            // A projection holds the fields it declares; `managedFields` is bookkeeping of
            // writers, and a projection is read-only.
            .skip_managed_fields(self.inner.strip_managed_fields || K::projection().is_some())
            .compact(<K as InformerResource>::compact)
            .decode_on_blocking_pool(self.inner.decode_on_blocking_pool);
        let partitions = self.partitions(
            &name,
            namespaces,
            &options,
            |namespace| K::url_path(&(), namespace),
            |url_path| Arc::new(base.with_url_path(url_path)),
        );
        let resync = self
            .inner
            .custom_resync
            .get(&TypeId::of::<K>())
            .copied()
            .unwrap_or(self.inner.default_resync);
        // With managedFields stripped, typed objects skip them while decoding (never allocated);
        // the transform below still clears whatever a type decoded some other way.
        let informer = SharedIndexInformer::partitioned(
            partitions,
            InformerConfig::default()
                .resync_period(resync)
                .reflector(self.reflector_config(name.clone(), &options)),
        );
        let custom = self
            .inner
            .transforms
            .get(&TypeId::of::<K>())
            .and_then(|t| t.downcast_ref::<TransformFunc<K>>())
            .cloned();
        match (self.inner.strip_managed_fields, custom) {
            (true, Some(custom)) => informer.set_transform(move |obj| custom(strip_managed_fields(obj)))?,
            (true, None) => informer.set_transform(strip_managed_fields::<K>)?,
            (false, Some(custom)) => informer.set_transform(move |obj| custom(obj))?,
            (false, None) => {}
        }
        debug!(informer = %name, options = %options, "informer created");
        if claim_shared {
            state.shared.entry(TypeId::of::<K>()).or_insert(options);
        }
        state.informers.insert(
            key,
            Entry {
                name,
                informer: Box::new(informer.clone()),
                runnable: Arc::new(informer.clone()),
                task: None,
            },
        );
        Ok(informer)
    }

    /// The list/watches of an informer named `name`: one per namespace of `namespaces` (each
    /// with its options), or one of every namespace (or a cluster-scoped type) with `options`;
    /// `lister_watcher` makes each from its URL (the factory's share one decoding thread).
    fn partitions<K>(
        &self,
        name: &str,
        namespaces: Vec<(String, CacheOptions)>,
        options: &CacheOptions,
        url_path: impl Fn(Option<&str>) -> String,
        lister_watcher: impl Fn(String) -> Arc<dyn ListerWatcher<K>>,
    ) -> Vec<Partition<K>> {
        if namespaces.is_empty() {
            let reflector = self.reflector_config(name.to_owned(), options);
            return vec![Partition::new(None, lister_watcher(url_path(None)), reflector)];
        }
        let several = namespaces.len() > 1;
        namespaces
            .into_iter()
            .map(|(namespace, options)| {
                let reflector_name = if several {
                    format!("{name} (namespace {namespace})")
                } else {
                    name.to_owned()
                };
                let reflector = self.reflector_config(reflector_name, &options);
                let lister_watcher = lister_watcher(url_path(Some(&namespace)));
                Partition::new(Some(namespace), lister_watcher, reflector)
            })
            .collect()
    }

    /// The shared informer for a dynamic resource (client-go `dynamicinformer`), one per
    /// group/version/kind. `namespaced` says whether the factory's namespaces apply.
    pub fn dynamic_informer_for(
        &self,
        resource: &ApiResource,
        namespaced: bool,
    ) -> Result<SharedIndexInformer<DynamicObject>, FactoryError> {
        let key = InformerKey::Dynamic {
            group: resource.group.clone(),
            version: resource.version.clone(),
            kind: resource.kind.clone(),
        };
        let mut state = self.state();
        if state.shut_down {
            return Err(FactoryError::ShutDown);
        }
        if let Some(entry) = state.informers.get(&key)
            && let Some(informer) = entry.informer.downcast_ref::<SharedIndexInformer<DynamicObject>>()
        {
            return Ok(informer.clone());
        }
        let name = format!("{}/{} (dynamic)", resource.api_version, resource.kind);
        let options = CacheOptions::default();
        let namespaces: Vec<(String, CacheOptions)> = if namespaced {
            let of = |namespace: &String| (namespace.clone(), options.clone().namespace(namespace.clone()));
            self.inner.namespaces.iter().map(of).collect()
        } else {
            Vec::new()
        };
        // One decoding thread for every partition (see `typed_informer`).
        let base = ApiListerWatcher::<DynamicObject>::from_url_path(
            self.inner.client.clone(),
            DynamicObject::url_path(resource, None),
        )
        .decode_on_blocking_pool(self.inner.decode_on_blocking_pool);
        let partitions = self.partitions(
            &name,
            namespaces,
            &options,
            |namespace| DynamicObject::url_path(resource, namespace),
            |url_path| Arc::new(base.with_url_path(url_path)),
        );
        let informer = SharedIndexInformer::partitioned(
            partitions,
            InformerConfig::default()
                .resync_period(self.inner.default_resync)
                .reflector(self.reflector_config(name.clone(), &CacheOptions::default())),
        );
        if self.inner.strip_managed_fields {
            informer.set_transform(strip_managed_fields::<DynamicObject>)?;
        }
        state.informers.insert(
            key,
            Entry {
                name,
                informer: Box::new(informer.clone()),
                runnable: Arc::new(informer.clone()),
                task: None,
            },
        );
        Ok(informer)
    }

    /// A snapshot of every informer's counters (reflector and handlers), sorted by informer
    /// name, for metrics (the controller crate's `Manager` exports them on `/metrics`).
    pub fn informer_stats(&self) -> Vec<InformerStats> {
        let runnables: Vec<Arc<dyn Runnable>> = self.state().informers.values().map(|e| e.runnable.clone()).collect();
        let mut stats: Vec<InformerStats> = runnables.iter().map(|r| r.stats()).collect();
        stats.sort_by(|a, b| a.informer.cmp(&b.informer));
        stats
    }

    /// Starts every informer requested so far and not yet started; safe to call again after
    /// requesting more. Cancelling `shutdown` stops every informer of the factory. An
    /// informer's task that panics is logged at ERROR with the informer's name.
    pub fn start(&self, shutdown: &CancellationToken) {
        let mut state = self.state();
        if state.shut_down {
            return;
        }
        let stop = self.inner.stop.clone();
        let external = shutdown.clone();
        state.links.retain(|link| !link.is_finished());
        state.links.push(tokio::spawn(async move {
            tokio::select! {
                _ = external.cancelled() => stop.cancel(),
                _ = stop.cancelled() => {}
            }
        }));
        for entry in state.informers.values_mut() {
            if entry.task.is_none() {
                info!(informer = %entry.name, "starting informer");
                let (informer, run) = (entry.name.clone(), entry.runnable.run(self.inner.stop.child_token()));
                entry.task = Some(tokio::spawn(async move {
                    if let Err(panic) = AssertUnwindSafe(run).catch_unwind().await {
                        error!(informer = %informer, panic = %panic_message(&*panic), "informer task panicked: it stays stopped");
                    }
                }));
            }
        }
    }

    /// Waits until every started informer has synced, or `shutdown` fires. Returns, per
    /// informer (`apiVersion/Kind`, with ` (dynamic)` for dynamic ones), whether it synced
    /// (client-go `WaitForCacheSync`).
    pub async fn wait_for_cache_sync(&self, shutdown: &CancellationToken) -> BTreeMap<String, bool> {
        let started: Vec<(String, Arc<dyn Runnable>)> = self
            .state()
            .informers
            .values()
            .filter(|e| e.task.is_some())
            .map(|e| (e.name.clone(), e.runnable.clone()))
            .collect();
        // Give up when the caller's token or the factory's own shutdown fires (forwarded here,
        // in the caller's task: nothing is spawned that could outlive this call).
        let give_up = self.inner.stop.child_token();
        let mut waits = std::pin::pin!(async {
            let mut results = BTreeMap::new();
            for (name, informer) in started {
                results.insert(name, informer.wait_for_cache_sync(give_up.clone()).await);
            }
            results
        });
        tokio::select! {
            results = &mut waits => return results,
            () = shutdown.cancelled() => give_up.cancel(),
        }
        waits.await
    }

    /// [`wait_for_cache_sync`](Self::wait_for_cache_sync) with a time limit: `Ok` when every
    /// started informer synced, else an error naming the ones that did not, so a typo in a CRD
    /// group fails a controller with a message instead of hanging it.
    pub async fn wait_for_cache_sync_timeout(
        &self,
        shutdown: &CancellationToken,
        timeout: Duration,
    ) -> Result<(), FactoryError> {
        let give_up = shutdown.child_token();
        let results = tokio::select! {
            results = self.wait_for_cache_sync(&give_up) => results,
            () = tokio::time::sleep(timeout) => {
                give_up.cancel();
                self.wait_for_cache_sync(&give_up).await
            }
        };
        let informers: Vec<String> = results
            .into_iter()
            .filter(|(_, ok)| !ok)
            .map(|(name, _)| name)
            .collect();
        if informers.is_empty() {
            Ok(())
        } else if shutdown.is_cancelled() || self.inner.stop.is_cancelled() {
            Err(FactoryError::CacheSyncCancelled { informers })
        } else {
            Err(FactoryError::CacheSyncTimeout { timeout, informers })
        }
    }

    /// Stops every informer and waits for them to finish, with every other task the factory
    /// spawned: when this returns, none is left running. Later requests for informers fail.
    pub async fn shutdown(&self) {
        let (tasks, links) = {
            let mut state = self.state();
            state.shut_down = true;
            let tasks: Vec<JoinHandle<()>> = state.informers.values_mut().filter_map(|e| e.task.take()).collect();
            (tasks, std::mem::take(&mut state.links))
        };
        self.inner.stop.cancel();
        // An informer's panic was logged when it happened (`start`); links cannot panic.
        for task in tasks.into_iter().chain(links) {
            let _ = task.await;
        }
        info!("informer factory shut down");
    }
}

/// The message of a panic's payload.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}

#[cfg(test)]
mod tests;
