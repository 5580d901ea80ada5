//! The sources of a controller and their handlers, shared by the builder (which makes them)
//! and the runtime (which waits for their registrations to sync and removes them): a
//! [`Source`] is one informer and how its notifications become keys; [`ErasedSource`] and
//! [`ErasedRegistration`] hold them without their types. A [`Trigger`] is a source without an
//! informer: a stream of external signals (controller-runtime's channel source).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use factory::{CacheOptions, FactoryResource};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use informer_core::{
    HandlerOptions, Indexer, InformerError, ResourceEventHandler, ResourceEventHandlerRegistration, SharedIndexInformer,
};
use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::handler::{EnqueueHandler, Enqueuer, Mapping};
use crate::object_key::ObjectKey;
use crate::predicate::{EventFilters, Filters};
use crate::reconciler::{Gvk, gvk};
use crate::sharding::Deletions;
use crate::work_queue::{LOW_PRIORITY, WorkQueue};

/// Why a source could not be registered (the builder turns it into a `ControllerError`).
#[derive(Debug)]
pub(crate) enum SourceError {
    /// The informer refused the handler (it was stopped).
    Informer(InformerError),
    /// The source cannot be registered as it is.
    InvalidConfig(&'static str),
}

impl From<InformerError> for SourceError {
    fn from(e: InformerError) -> Self {
        SourceError::Informer(e)
    }
}

/// Where a typed source's cache goes, and its name (`apiVersion/Kind [options]`, as the
/// factory's).
pub(crate) fn typed_source<K: FactoryResource>(options: &CacheOptions) -> (SourceKey, String) {
    (
        SourceKey::Typed(TypeId::of::<K>()),
        factory::informer_name::<K>(options),
    )
}

/// Where a dynamic source's cache goes, and its name (as the factory's).
pub(crate) fn dynamic_source(resource: &ApiResource) -> (SourceKey, String) {
    let name = format!("{}/{} (dynamic)", resource.api_version, resource.kind);
    (SourceKey::Dynamic(gvk(resource)), name)
}

/// Which context map a source's cache goes into.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum SourceKey {
    Typed(TypeId),
    Dynamic(Gvk),
}

/// One informer of a controller and how its notifications become keys.
pub(crate) struct Source<C> {
    /// `None` only when the factory refused it (then `build` fails first).
    pub(crate) informer: Option<SharedIndexInformer<C>>,
    /// `apiVersion/Kind`, for logs and errors.
    pub(crate) name: String,
    pub(crate) handling: Handling<C>,
    /// This source's own predicates (`SourceOptions::predicate`).
    pub(crate) predicates: Filters<C>,
    pub(crate) key: SourceKey,
    /// A sharded controller's drain label, on its primary source only: its changes bypass
    /// the filters (see [`EnqueueHandler`]).
    pub(crate) drain_label: Option<String>,
    /// A sharded controller's tombstones, on its primary source only: its handler records the
    /// deletions of the shard's objects (see [`Deletions`]).
    pub(crate) deletions: Option<Arc<Deletions>>,
}

/// How a source's notifications reach the queue.
pub(crate) enum Handling<C> {
    /// Through an [`EnqueueHandler`] with the controller's event filters.
    Map(Mapping<C>),
    /// Through the user's own handler, made once at build time with the queue.
    Custom(std::sync::Mutex<Option<MakeHandler<C>>>),
}

/// Makes a custom handler, given the controller's queue.
pub(crate) type MakeHandler<C> = Box<dyn FnOnce(Enqueuer) -> Box<dyn ResourceEventHandler<C>> + Send>;

/// A boxed custom handler, registered as a handler.
struct BoxedHandler<C>(Box<dyn ResourceEventHandler<C>>);

impl<C: Send + Sync + 'static> ResourceEventHandler<C> for BoxedHandler<C> {
    fn on_add(&self, obj: &Arc<C>, is_in_initial_list: bool) {
        self.0.on_add(obj, is_in_initial_list);
    }
    fn on_update(&self, old: &Arc<C>, new: &Arc<C>) {
        self.0.on_update(old, new);
    }
    fn on_delete(&self, obj: informer_core::DeletedObject<C>) {
        self.0.on_delete(obj);
    }
    fn is_non_blocking(&self) -> bool {
        self.0.is_non_blocking()
    }
}

/// A [`Source`] without its type.
pub(crate) trait ErasedSource: Send + Sync {
    /// Registers the source's handler, named after `controller` (the `handler` label of the
    /// listener metrics).
    fn register(
        &self,
        controller: &str,
        queue: &WorkQueue,
        predicates: &EventFilters,
    ) -> Result<Box<dyn ErasedRegistration>, SourceError>;
    fn add_to_context(
        &self,
        typed: &mut HashMap<TypeId, Box<dyn Any + Send + Sync>>,
        dynamic: &mut HashMap<Gvk, Indexer<DynamicObject>>,
    );
    /// Which context slot the source's cache fills and the name of the informer filling it
    /// (unique per type and options in the factory); `None` for a source without a cache.
    fn cache(&self) -> Option<(SourceKey, &str)>;
}

impl<C: Resource + Send + Sync + 'static> ErasedSource for Source<C> {
    fn register(
        &self,
        controller: &str,
        queue: &WorkQueue,
        predicates: &EventFilters,
    ) -> Result<Box<dyn ErasedRegistration>, SourceError> {
        let Some(informer) = &self.informer else {
            return Err(SourceError::InvalidConfig("an informer is missing"));
        };
        let registration = match &self.handling {
            // Filtering and enqueueing never block: called inline by the informer.
            Handling::Map(mapping) => informer.add_event_handler_with_options(
                EnqueueHandler {
                    queue: queue.clone(),
                    predicates: predicates.clone(),
                    source_predicates: self.predicates.clone(),
                    mapping: mapping.clone(),
                    drain_label: self.drain_label.clone(),
                    deletions: self.deletions.clone(),
                },
                HandlerOptions::default().name(controller),
            )?,
            Handling::Custom(make) => {
                let make = make.lock().unwrap_or_else(|p| p.into_inner()).take();
                let Some(make) = make else {
                    return Err(SourceError::InvalidConfig("a custom handler was already used"));
                };
                informer.add_event_handler_with_options(
                    BoxedHandler(make(Enqueuer { queue: queue.clone() })),
                    HandlerOptions::default().name(controller),
                )?
            }
        };
        Ok(Box::new(Registration {
            informer: informer.clone(),
            registration,
            name: self.name.clone(),
        }))
    }

    fn cache(&self) -> Option<(SourceKey, &str)> {
        let informer = self.informer.as_ref()?;
        Some((self.key.clone(), informer.name()))
    }

    fn add_to_context(
        &self,
        typed: &mut HashMap<TypeId, Box<dyn Any + Send + Sync>>,
        dynamic: &mut HashMap<Gvk, Indexer<DynamicObject>>,
    ) {
        let Some(informer) = &self.informer else { return };
        match &self.key {
            SourceKey::Typed(type_id) => {
                typed.insert(*type_id, Box::new(informer.indexer().clone()));
            }
            SourceKey::Dynamic(gvk) => {
                let indexer: &dyn Any = informer.indexer();
                if let Some(indexer) = indexer.downcast_ref::<Indexer<DynamicObject>>() {
                    dynamic.insert(gvk.clone(), indexer.clone());
                }
            }
        }
    }
}

/// A handler registered on an informer, without its type.
pub(crate) trait ErasedRegistration: Send + Sync {
    fn has_synced(&self) -> bool;
    fn remove(&self);
    fn informer_name(&self) -> String;
    /// The task the registration spawned, if any (a trigger's), taken once so the controller
    /// joins it after [`remove`](Self::remove) ended it.
    fn take_task(&self) -> Option<JoinHandle<()>> {
        None
    }
}

struct Registration<C> {
    informer: SharedIndexInformer<C>,
    registration: ResourceEventHandlerRegistration<C>,
    name: String,
}

impl<C: Resource + Send + Sync + 'static> ErasedRegistration for Registration<C> {
    fn has_synced(&self) -> bool {
        self.registration.has_synced()
    }

    fn remove(&self) {
        // Fails only if already removed or the informer stopped: nothing is left to stop then.
        let _ = self.informer.remove_event_handler(&self.registration);
    }

    fn informer_name(&self) -> String {
        self.name.clone()
    }
}

/// What an external signal asks for ([`Controller::reconcile_on`](crate::Controller::reconcile_on),
/// [`reconcile_all_on`](crate::Controller::reconcile_all_on)).
pub(crate) enum Signal {
    /// Reconcile this key.
    Key(ObjectKey),
    /// Reconcile every primary object in the cache.
    All,
}

/// The keys of every cached primary object.
pub(crate) type PrimaryKeys = Arc<dyn Fn() -> Vec<ObjectKey> + Send + Sync>;

/// A stream of external signals feeding the queue (controller-runtime's `source.Channel`,
/// kube-runtime's `reconcile_on`). Its task is spawned when the controller is built, on the
/// caller's runtime, and ends when the stream ends or the controller's handlers are removed
/// (shutdown, or the built controller dropped), like an informer handler's registration. The
/// registration holds the task and the controller joins it when it stops; a panic in it (the
/// stream is the user's) is logged at ERROR with the controller's and the trigger's names when it
/// happens, and ends the trigger.
pub(crate) struct Trigger {
    pub(crate) name: &'static str,
    pub(crate) signals: std::sync::Mutex<Option<BoxStream<'static, Signal>>>,
    pub(crate) primary_keys: PrimaryKeys,
}

impl ErasedSource for Trigger {
    fn register(
        &self,
        controller: &str,
        queue: &WorkQueue,
        _predicates: &EventFilters,
    ) -> Result<Box<dyn ErasedRegistration>, SourceError> {
        let Some(mut signals) = self.signals.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Err(SourceError::InvalidConfig("a trigger stream was already used"));
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(SourceError::InvalidConfig(
                "a trigger needs a tokio runtime when the controller is built",
            ));
        };
        let stop = CancellationToken::new();
        let (queue, keys, done) = (queue.clone(), self.primary_keys.clone(), stop.clone());
        let (controller, trigger) = (controller.to_owned(), self.name);
        let name = controller.clone();
        let forward = async move {
            let controller = name;
            loop {
                let signal = tokio::select! {
                    () = done.cancelled() => return,
                    signal = signals.next() => signal,
                };
                match signal {
                    Some(Signal::Key(key)) => queue.add(key),
                    // Every cached object, as a resync: at low priority, so a real change is
                    // not stuck behind the whole cache (a sharder's re-examination after a
                    // membership change is one).
                    Some(Signal::All) => {
                        let keys = keys();
                        debug!(controller = %controller, keys = keys.len(), "trigger: reconciling every primary");
                        keys.into_iter()
                            .for_each(|key| queue.add_with_priority(key, LOW_PRIORITY));
                    }
                    None => {
                        warn!(controller = %controller, "trigger stream ended: no more external reconciles");
                        return;
                    }
                }
            }
        };
        let task = runtime.spawn(async move {
            if let Err(panic) = AssertUnwindSafe(forward).catch_unwind().await {
                error!(controller = %controller, trigger, panic = %crate::controller::panic_message(&*panic),
                    "trigger task panicked: no more external reconciles from it");
            }
        });
        Ok(Box::new(TriggerRegistration {
            stop,
            name: self.name,
            task: std::sync::Mutex::new(Some(task)),
        }))
    }

    fn add_to_context(
        &self,
        _typed: &mut HashMap<TypeId, Box<dyn Any + Send + Sync>>,
        _dynamic: &mut HashMap<Gvk, Indexer<DynamicObject>>,
    ) {
    }

    fn cache(&self) -> Option<(SourceKey, &str)> {
        None
    }
}

/// A trigger's task, stopped by `remove` (or when dropped with the controller) and joined by
/// the controller through `take_task`.
struct TriggerRegistration {
    stop: CancellationToken,
    name: &'static str,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl ErasedRegistration for TriggerRegistration {
    fn has_synced(&self) -> bool {
        true
    }

    fn remove(&self) {
        self.stop.cancel();
    }

    fn informer_name(&self) -> String {
        self.name.to_owned()
    }

    fn take_task(&self) -> Option<JoinHandle<()>> {
        self.task.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Drop for TriggerRegistration {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::work_queue::NORMAL_PRIORITY;

    /// `reconcile_on`'s keys are queued as changes (`NORMAL_PRIORITY`); `reconcile_all_on`'s
    /// every-primary signal (a sharder's re-examination after a membership change) at
    /// `LOW_PRIORITY`, behind real changes.
    #[tokio::test]
    async fn a_signal_for_every_primary_queues_at_low_priority() {
        let queue = WorkQueue::new(
            true,
            Box::new(workqueue::default_controller_rate_limiter()),
            workqueue::QueueConfig::default(),
        );
        let signals = futures::stream::iter([Signal::All, Signal::Key(ObjectKey::namespaced("ns", "changed"))]);
        let trigger = Trigger {
            name: "test",
            signals: std::sync::Mutex::new(Some(signals.boxed())),
            primary_keys: Arc::new(|| vec![ObjectKey::namespaced("ns", "a"), ObjectKey::namespaced("ns", "b")]),
        };
        let registration = trigger
            .register("controller", &queue, &EventFilters(Vec::new()))
            .unwrap();
        // The stream ends after its two signals, and the task with it.
        registration.take_task().expect("a task").await.unwrap();
        let mut got = Vec::new();
        while let Some((key, priority)) = queue.get().now_or_never().flatten() {
            queue.done(&key);
            got.push((key.name, priority));
        }
        let expected = [("changed", NORMAL_PRIORITY), ("a", LOW_PRIORITY), ("b", LOW_PRIORITY)];
        assert_eq!(got, expected.map(|(name, priority)| (name.to_owned(), priority)));
    }
}
