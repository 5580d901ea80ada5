//! The sources of a controller and their handlers, shared by the builder (which makes them)
//! and the runtime (which waits for their registrations to sync and removes them): a
//! [`Source`] is one informer and how its notifications become keys; [`ErasedSource`] and
//! [`ErasedRegistration`] hold them without their types.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use factory::FactoryResource;
use informer_core::{
    HandlerOptions, Indexer, InformerError, ResourceEventHandler, ResourceEventHandlerRegistration, SharedIndexInformer,
};
use kube::Resource;
use kube::api::{ApiResource, DynamicObject};
use workqueue::RateLimitingQueue;

use crate::handler::{EnqueueHandler, Enqueuer, Mapping};
use crate::object_key::ObjectKey;
use crate::predicate::All;
use crate::reconciler::{Gvk, gvk};

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

/// Where a typed source's cache goes, and its name (`apiVersion/Kind`, as the factory's).
pub(crate) fn typed_source<K: FactoryResource>() -> (SourceKey, String) {
    let name = format!("{}/{}", K::api_version(&()), K::kind(&()));
    (SourceKey::Typed(TypeId::of::<K>()), name)
}

/// Where a dynamic source's cache goes, and its name (as the factory's).
pub(crate) fn dynamic_source(resource: &ApiResource) -> (SourceKey, String) {
    let name = format!("{}/{} (dynamic)", resource.api_version, resource.kind);
    (SourceKey::Dynamic(gvk(resource)), name)
}

/// Which context map a source's cache goes into.
#[derive(Clone)]
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
    pub(crate) key: SourceKey,
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
}

/// A [`Source`] without its type.
pub(crate) trait ErasedSource: Send + Sync {
    /// Registers the source's handler, named after `controller` (the `handler` label of the
    /// listener metrics).
    fn register(
        &self,
        controller: &str,
        queue: &RateLimitingQueue<ObjectKey>,
        predicates: &All,
    ) -> Result<Box<dyn ErasedRegistration>, SourceError>;
    fn add_to_context(
        &self,
        typed: &mut HashMap<TypeId, Box<dyn Any + Send + Sync>>,
        dynamic: &mut HashMap<Gvk, Indexer<DynamicObject>>,
    );
}

impl<C: Resource + Send + Sync + 'static> ErasedSource for Source<C> {
    fn register(
        &self,
        controller: &str,
        queue: &RateLimitingQueue<ObjectKey>,
        predicates: &All,
    ) -> Result<Box<dyn ErasedRegistration>, SourceError> {
        let Some(informer) = &self.informer else {
            return Err(SourceError::InvalidConfig("an informer is missing"));
        };
        let registration = match &self.handling {
            // Filtering and enqueueing never block: delivered by a task, with no thread.
            Handling::Map(mapping) => informer.add_event_handler_with_options(
                EnqueueHandler {
                    queue: queue.clone(),
                    predicates: predicates.clone(),
                    mapping: mapping.clone(),
                },
                HandlerOptions::default().non_blocking().name(controller),
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
