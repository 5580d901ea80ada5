//! What a controller calls: the [`Reconciler`] (controller-runtime's `reconcile.Reconciler`),
//! its [`Action`], and the [`Context`] it reads from.
//!
//! A reconcile gets a key, not an object: it reads the current state from the informer cache
//! through the context's listers (the primary may be gone: then [`Context::get`] is `Ok(None)`
//! and the reconcile cleans up; or on the server but not decodable as `K`: then it is an
//! [`UndecodableObject`] error, never `None`), writes through `kube::Api` with
//! [`Context::client`], and says what should happen next:
//!
//! | outcome | the queue does (client-go / controller-runtime) |
//! |---|---|
//! | `Ok(Action::Done)` | `forget` (reset the key's backoff) |
//! | `Ok(Action::Requeue)` | `add_rate_limited` (retry after the key's backoff) |
//! | `Ok(Action::RequeueAfter(d))` | `forget`, then `add_after(d)` |
//! | `Err(e)`, a timeout or a panic | the error chain is logged, then `add_rate_limited`, unless the error is a [`TerminalError`](crate::TerminalError) (no retry) or a [`RequeueAfterError`](crate::RequeueAfterError) (retry after its delay), or the controller's [error policy](crate::Controller::error_policy) says otherwise |
//!
//! The [`outcome`](crate::outcome) module has the whole table.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use factory::FactoryResource;
use informer_core::{Indexer, Lister, Lookup, Undecodable};
use kube::api::{ApiResource, DynamicObject};
use kube::{Client, Resource};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::event_recorder::EventRecorder;
use crate::leadership::{Leadership, NotLeader};
use crate::object_key::Request;

/// The error type reconcilers may return: anything that converts into a boxed error
/// (`std::error::Error` types, `anyhow::Error`, `String`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What the controller should do with a key after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The object is in its desired state: reset the key's backoff.
    Done,
    /// Try again after the key's rate-limited backoff (client-go `AddRateLimited`).
    Requeue,
    /// Try again once this much time has passed, with the backoff reset (for polling
    /// something the cluster does not notify about).
    RequeueAfter(Duration),
}

/// Brings one object to its desired state. Implemented by your controller, or made from a
/// closure with [`reconciler_fn`].
///
/// A controller never runs two reconciles of one key at once, so a reconcile may read, decide
/// and write without locking; different keys run concurrently on the controller's workers.
pub trait Reconciler<K>: Send + Sync + 'static {
    /// The error a reconcile may fail with; logged with its source chain.
    type Error: Into<BoxError> + Send + 'static;

    /// Reconciles the object `req` names.
    fn reconcile(&self, req: Request, ctx: &Context<K>) -> impl Future<Output = Result<Action, Self::Error>> + Send;
}

/// A [`Reconciler`] made of a closure taking the request and a clone of the context (cheap: it
/// is a handle), for small controllers.
///
/// ```
/// use controller::{reconciler_fn, Action, Context, Request};
/// use k8s_openapi::api::core::v1::ConfigMap;
///
/// let reconciler = reconciler_fn(|req: Request, ctx: Context<ConfigMap>| async move {
///     match ctx.get(&req)? {
///         Some(cm) => println!("{req} has {} keys", cm.data.as_ref().map_or(0, |d| d.len())),
///         None => println!("{req} is gone"),
///     }
///     Ok::<_, controller::UndecodableObject>(Action::Done)
/// });
/// # let _ = reconciler;
/// ```
pub fn reconciler_fn<K, F, Fut, E>(f: F) -> FnReconciler<F, K>
where
    F: Fn(Request, Context<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Into<BoxError> + Send + 'static,
{
    FnReconciler {
        f,
        _primary: PhantomData,
    }
}

/// See [`reconciler_fn`].
pub struct FnReconciler<F, K> {
    f: F,
    _primary: PhantomData<fn(K)>,
}

impl<K, F, Fut, E> Reconciler<K> for FnReconciler<F, K>
where
    K: 'static,
    F: Fn(Request, Context<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: Into<BoxError> + Send + 'static,
{
    type Error = E;

    fn reconcile(&self, req: Request, ctx: &Context<K>) -> impl Future<Output = Result<Action, E>> + Send {
        (self.f)(req, ctx.clone())
    }
}

/// The primary object a reconcile asked for ([`Context::get`]) is on the server, but its
/// current version does not decode as the controller's Rust type (a field of another type, an
/// enum value the type does not know). It is not deleted: a reconcile returning this error
/// (`ctx.get(&req)?`) is logged with its controller and key and retried rate-limited, and
/// reconciles normally once a decodable version arrives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {key} does not decode at resourceVersion {resource_version:?} ({reason}): {error}")]
#[non_exhaustive]
pub struct UndecodableObject {
    /// The Rust type it does not decode as, without module path (`Widget`).
    pub kind: String,
    /// Its cache key: `namespace/name`, or `name`.
    pub key: String,
    /// The resourceVersion that does not decode.
    pub resource_version: String,
    /// The class of the decode error ([`Undecodable::reason`]).
    pub reason: &'static str,
    /// The decoder's whole message.
    pub error: String,
}

impl UndecodableObject {
    /// The object of type `kind` under `key` does not decode, as `undecodable` says.
    pub fn new(kind: impl Into<String>, key: impl Into<String>, undecodable: Undecodable) -> Self {
        UndecodableObject {
            kind: kind.into(),
            key: key.into(),
            resource_version: undecodable.resource_version,
            reason: undecodable.reason,
            error: undecodable.error,
        }
    }
}

/// [`Context::lister_for`] asked for a type the controller has no informer of: it neither is
/// the primary type nor owned or watched. The message names the type, the controller and the
/// builder calls that add it; the fix is in the controller's builder, not in the reconcile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "controller {controller} has no cache of {kind}: add one on its builder with \
     .owns::<{kind}>() or .watches::<{kind}>(mapper) (for PartialObjectMeta<C>: \
     .owns_metadata::<C>() or .watches_metadata::<C>(mapper))"
)]
#[non_exhaustive]
pub struct NotCached {
    /// The controller's name.
    pub controller: String,
    /// The Rust type asked for, without module paths (`ConfigMap`, `PartialObjectMeta<Secret>`).
    pub kind: String,
}

impl NotCached {
    /// `controller` has no cache of `kind`.
    pub fn new(controller: impl Into<String>, kind: impl Into<String>) -> Self {
        NotCached {
            controller: controller.into(),
            kind: kind.into(),
        }
    }
}

/// Which informer a dynamic lister comes from: group, version, kind.
pub(crate) type Gvk = (String, String, String);

pub(crate) fn gvk(resource: &ApiResource) -> Gvk {
    (resource.group.clone(), resource.version.clone(), resource.kind.clone())
}

/// What a reconcile reads from and writes with: the listers of the informers the controller
/// uses, the client, and an event recorder; and whether it may still write (see
/// [`ensure_leading`](Self::ensure_leading)). A cheap handle (clone it freely).
pub struct Context<K> {
    inner: Arc<ContextInner<K>>,
    scope: Arc<RunScope>,
}

impl<K> Clone for Context<K> {
    fn clone(&self) -> Self {
        Context {
            inner: self.inner.clone(),
            scope: self.scope.clone(),
        }
    }
}

/// What a context knows of the run it belongs to. The context of a built controller that is not
/// running has an unconditional leadership and tokens nobody cancels.
pub(crate) struct RunScope {
    /// The controller's leadership: narrowed from the manager's term, so it also ends when the
    /// controller is stopped at once.
    pub(crate) leadership: Leadership,
    /// A child of the leadership's token, also cancelled when shutdown begins.
    pub(crate) token: CancellationToken,
}

impl RunScope {
    pub(crate) fn new(leadership: Leadership) -> Self {
        let token = leadership.token().child_token();
        RunScope { leadership, token }
    }
}

pub(crate) struct ContextInner<K> {
    pub(crate) name: String,
    pub(crate) client: Client,
    pub(crate) primary: Indexer<K>,
    /// Whether the primary kind is namespaced: its cache keys are `namespace/name`, else `name`.
    pub(crate) primary_namespaced: bool,
    /// `TypeId::of::<C>()` → `Indexer<C>` for every typed informer of the controller.
    pub(crate) typed: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    /// Every dynamic informer of the controller.
    pub(crate) dynamic: HashMap<Gvk, Indexer<DynamicObject>>,
    pub(crate) recorder: EventRecorder,
}

impl<K> Context<K> {
    pub(crate) fn new(inner: ContextInner<K>) -> Self {
        Context {
            inner: Arc::new(inner),
            scope: Arc::new(RunScope::new(Leadership::unconditional())),
        }
    }

    /// This context for one reconcile: its token is a child of the run's, so the worker can
    /// cancel this reconcile alone (at its timeout) while a cancellation of the run still
    /// reaches it.
    pub(crate) fn for_one_reconcile(&self) -> Self {
        self.scoped(RunScope {
            leadership: self.scope.leadership.clone(),
            token: self.scope.token.child_token(),
        })
    }

    /// This context for one run of the controller.
    pub(crate) fn scoped(&self, scope: RunScope) -> Self {
        Context {
            inner: self.inner.clone(),
            scope: Arc::new(scope),
        }
    }

    /// Whether this replica may still write for the controller: under a
    /// [`Manager`](crate::Manager) with leader election, the lease was renewed less than
    /// `renew_deadline` ago by the local clock; and the controller was not stopped at once.
    /// Always true for a controller run without leader election (until stopped at once).
    pub fn is_leading(&self) -> bool {
        self.scope.leadership.is_valid()
    }

    /// `Ok` while [`is_leading`](Self::is_leading), [`NotLeader`] otherwise: put
    /// `ctx.ensure_leading()?` in front of every write a reconcile makes, so a leader that was
    /// stopped past its lease and resumed sends none (another replica may lead already). The
    /// worker runs this check before every reconcile and the event recorder before every write;
    /// writes through [`client`](Self::client) are yours to guard.
    ///
    /// A kinformer addition: controller-runtime has no such check (its manager stops the
    /// controllers once its elector notices the loss, and exits). An error whose source chain
    /// holds a [`NotLeader`] is logged by the worker below ERROR and the key requeued.
    ///
    /// ```
    /// use controller::{reconciler_fn, Action, BoxError, Context, Request};
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::api::{Api, Patch, PatchParams};
    ///
    /// let reconciler = reconciler_fn(|req: Request, ctx: Context<ConfigMap>| async move {
    ///     let Some(cm) = ctx.get(&req)? else { return Ok::<_, BoxError>(Action::Done) };
    ///     let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), req.namespace.as_deref().unwrap_or("default"));
    ///     let patch = serde_json::json!({"metadata": {"labels": {"seen": "yes"}}});
    ///     ctx.ensure_leading()?; // no write once this replica may no longer lead
    ///     api.patch(&req.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    ///     # let _ = cm;
    ///     Ok(Action::Done)
    /// });
    /// # let _ = reconciler;
    /// ```
    pub fn ensure_leading(&self) -> Result<(), NotLeader> {
        self.scope.leadership.check()
    }

    /// Fires when the reconcile should stop: at the instant the lease's validity lapses by the
    /// local clock (a timer to the deadline, re-armed at each renewal), when the controller is
    /// stopped at once, and when shutdown begins (the reconciles of a graceful shutdown get it
    /// already fired, and may still finish: the lease is held until they did), and when the
    /// reconcile runs past the controller's reconcile timeout (then its future is dropped
    /// right after; the token is this reconcile's own then). Select on it
    /// around long waits; check [`ensure_leading`](Self::ensure_leading) before writing.
    pub fn token(&self) -> &CancellationToken {
        &self.scope.token
    }

    /// `ctx.token().cancelled()`: completes when the reconcile should stop (see
    /// [`token`](Self::token)).
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.scope.token.cancelled()
    }

    /// The leadership the controller runs under.
    pub fn leadership(&self) -> &Leadership {
        &self.scope.leadership
    }

    /// The controller's name.
    pub fn controller_name(&self) -> &str {
        &self.inner.name
    }

    /// The client, for writes (and reads the cache cannot answer).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Records Kubernetes Events on objects.
    pub fn recorder(&self) -> &EventRecorder {
        &self.inner.recorder
    }

    /// The cache of the primary type (to query its indexes).
    pub fn indexer(&self) -> &Indexer<K> {
        &self.inner.primary
    }
}

impl<K: Resource + 'static> Context<K> {
    /// The primary object `req` names, from the cache: `Ok(None)` if it does not exist
    /// (deleted), and an [`UndecodableObject`] error if the server has it but its current
    /// version does not decode as `K` (see [`informer_core::undecodable`]).
    ///
    /// An error rather than `None`, so that a reconcile cannot take an object it cannot read
    /// for a deleted one and clean up after it; an error rather than the last decoded version,
    /// so that it does not act on state the server has moved past. `ctx.get(&req)?` hands it
    /// to the worker, which logs it with the controller and key and retries rate-limited (an
    /// error policy sees it like any error); a reconcile that wants the last decoded version
    /// reads [`Lister::lookup`](informer_core::Lister::lookup) through [`lister`](Self::lister).
    ///
    /// The kind's scope decides, not the key: a key carrying a namespace (from a mapper or a
    /// trigger) finds a cluster-scoped object by its name.
    pub fn get(&self, req: &Request) -> Result<Option<Arc<K>>, UndecodableObject> {
        let key = if self.inner.primary_namespaced {
            req.cache_key()
        } else {
            req.name.clone()
        };
        match self.inner.primary.lookup_by_key(&key) {
            Lookup::Found(obj) => Ok(Some(obj)),
            Lookup::Undecodable { undecodable, .. } => Err(UndecodableObject::new(
                informer_core::undecodable::type_name::<K>(),
                key,
                undecodable,
            )),
            _ => Ok(None),
        }
    }

    /// A lister of the primary type.
    pub fn lister(&self) -> Lister<K> {
        Lister::new(self.inner.primary.clone())
    }

    /// A lister of `C`, if the controller owns or watches `C` (or `C` is its primary type); a
    /// [`NotCached`] error naming `C`, the controller and the builder calls that add a cache of
    /// `C` if not (`ctx.lister_for::<C>()?` in a reconcile logs it with the controller and key).
    ///
    /// This is checked at run time: a compile-time check would need the builder to carry the
    /// list of its types in its type (`Controller<K, (ConfigMap, (Secret, ()))>`), and every
    /// reconciler's `Context` with it, for one mistake a first reconcile reports.
    ///
    /// A controller reads one informer per type, so this is never ambiguous: every source of
    /// `C` reads the same informer, or the controller did not build
    /// ([`ControllerError::ConflictingCaches`](crate::ControllerError::ConflictingCaches)), as
    /// controller-runtime's one cache per type refuses conflicting `ByObject` options. An
    /// informer of several namespaces ([`CacheOptions::namespaces`](factory::CacheOptions::namespaces))
    /// is one lister over all of them.
    pub fn lister_for<C: FactoryResource>(&self) -> Result<Lister<C>, NotCached> {
        self.indexer_for::<C>()
            .map(Lister::new)
            .ok_or_else(|| NotCached::new(&self.inner.name, informer_core::undecodable::type_name::<C>()))
    }

    /// The cache of `C` (to query its indexes), if the controller owns or watches `C`; the
    /// informer every source of `C` reads (see [`lister_for`](Self::lister_for)).
    pub fn indexer_for<C: FactoryResource>(&self) -> Option<Indexer<C>> {
        self.inner
            .typed
            .get(&TypeId::of::<C>())
            .and_then(|indexer| indexer.downcast_ref::<Indexer<C>>())
            .cloned()
    }

    /// A lister of a dynamic resource the controller owns or watches.
    pub fn dynamic_lister(&self, resource: &ApiResource) -> Option<Lister<DynamicObject>> {
        self.inner.dynamic.get(&gvk(resource)).cloned().map(Lister::new)
    }
}
