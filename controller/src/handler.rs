//! The event handlers a controller registers on shared informers (controller-runtime's
//! `pkg/handler`): each turns a notification into [`ObjectKey`]s of the controller's primary
//! type and adds them to the controller's work queue.
//!
//! | source | handler | keys |
//! |---|---|---|
//! | `for_resource::<K>()` | [`EnqueueRequestForObject`](Mapping::Object) | the object's own |
//! | `owns::<C>()` | [`EnqueueRequestForOwner`](Mapping::Owner) | the owner in the child's *controller* ownerReference, if it has the primary's group and kind (every owner of that kind with `SourceOptions::every_owner`) |
//! | `watches::<W>(mapper)` | [`EnqueueRequestsFromMapFunc`](Mapping::Func) | whatever `mapper` returns |
//!
//! An update enqueues the keys of both the old and the new object (an owner reference or a
//! mapped key may have changed), as controller-runtime does. A notification enqueues only if
//! it passes the controller's event filters (metadata) and its source's own predicates (typed),
//! with one exception: a [sharded](crate::sharding) controller's primary handler queues, at
//! [`NORMAL_PRIORITY`] whatever the filters say, an update that changed the object's drain
//! label and an add of an object that carries it. The drain label is a label-only change that
//! `GenerationChanged` and most update filters reject, and the shard must take the key to
//! acknowledge the drain: filtered out, the object would stay draining forever and the shard
//! taking it over would never get it. (The worker hands a draining object over without
//! reconciling it.) That handler also records each delete it queues whose object is labelled
//! for the shard and not draining (a tombstone, before the key is queued): the shard reconciles
//! the deletion of its object even if no worker took the key while the object was cached (see
//! sharding's drain handling for why that is safe).
//!
//! Handlers declare themselves non-blocking ([`ResourceEventHandler::is_non_blocking`]), so the informer calls
//! them inline, on its own task, right after each batch reached the cache (no buffer, no thread):
//! they filter, compute keys and add them to the queue, nothing else, and never block; a
//! predicate or mapper must not block either. The only allocations are the keys themselves (and
//! a mapper's `Vec`).
//!
//! Priorities, as controller-runtime's handlers with its priority queue: an add from the
//! informer's initial list, and an update whose resourceVersion did not change (a resync), enqueue
//! at [`LOW_PRIORITY`] (but a draining object of a sharded primary at [`NORMAL_PRIORITY`], see
//! above); every other notification at [`NORMAL_PRIORITY`]. A custom handler ([`Enqueuer`])
//! chooses its own. Outside the handlers, `reconcile_all_on`'s keys are queued at
//! [`LOW_PRIORITY`] too (`source.rs`), and a reconcile's retries keep the priority its key came
//! with (`controller.rs`).

use std::sync::Arc;

use informer_core::{DeletedObject, ResourceEventHandler};
use kube::Resource;
use kube::api::ObjectMeta;

use crate::object_key::ObjectKey;
use crate::predicate::{EventFilters, Filters, Predicate, TypedPredicate};
use crate::sharding::Deletions;
use crate::work_queue::{LOW_PRIORITY, NORMAL_PRIORITY, WorkQueue};

/// A mapper of [`watches`](crate::Controller::watches): the primary keys an object concerns.
pub type MapFunc<W> = Arc<dyn Fn(&W) -> Vec<ObjectKey> + Send + Sync>;

/// How a notification becomes keys.
pub(crate) enum Mapping<K> {
    /// The object's own key (controller-runtime `EnqueueRequestForObject`).
    Object,
    /// The key of the object's controller owner of the primary's group and kind
    /// (`EnqueueRequestForOwner` with `OnlyControllerOwner`).
    Owner(OwnerType),
    /// Whatever the mapper returns (`EnqueueRequestsFromMapFunc`).
    Func(MapFunc<K>),
}

impl<K> Clone for Mapping<K> {
    fn clone(&self) -> Self {
        match self {
            Mapping::Object => Mapping::Object,
            Mapping::Owner(owner) => Mapping::Owner(owner.clone()),
            Mapping::Func(map) => Mapping::Func(map.clone()),
        }
    }
}

/// The primary type an owner reference must name.
#[derive(Clone, Debug)]
pub(crate) struct OwnerType {
    /// API group (`""` for the core group).
    pub(crate) group: String,
    pub(crate) kind: String,
    /// Whether the primary is namespaced (then the owner lives in the child's namespace).
    pub(crate) namespaced: bool,
    /// Only the owner reference with `controller: true` (controller-runtime's
    /// `OnlyControllerOwner`, the default), or every owner reference of this type.
    pub(crate) only_controller: bool,
}

impl OwnerType {
    /// The keys of `meta`'s owners of this type: its controller owner's, or with
    /// `only_controller` off, every owner's.
    fn owner_keys(&self, meta: &ObjectMeta, mut found: impl FnMut(ObjectKey)) {
        let Some(owners) = meta.owner_references.as_ref() else {
            return;
        };
        for owner in owners {
            if self.only_controller && owner.controller != Some(true) {
                continue;
            }
            // The group of `apiVersion` (`apps/v1` → `apps`, `v1` → ``); the version may
            // differ from the one the controller uses, as in controller-runtime.
            let group = owner.api_version.rsplit_once('/').map_or("", |(group, _)| group);
            if group != self.group || owner.kind != self.kind {
                continue;
            }
            let namespace = if self.namespaced { meta.namespace.clone() } else { None };
            found(ObjectKey {
                namespace,
                name: owner.name.clone(),
            });
        }
    }
}

/// The controller's work queue as a custom handler sees it
/// ([`watches_with`](crate::Controller::watches_with)): it may add keys, nothing else.
#[derive(Clone)]
pub struct Enqueuer {
    pub(crate) queue: WorkQueue,
}

impl Enqueuer {
    /// Enqueues `key` now at [`NORMAL_PRIORITY`] (merged with a pending add of the same key).
    pub fn add(&self, key: ObjectKey) {
        self.queue.add(key);
    }

    /// Enqueues `key` now at `priority` (higher first; [`LOW_PRIORITY`] for what the initial
    /// list or a resync brought). Ignored when the priority queue is switched off.
    pub fn add_with_priority(&self, key: ObjectKey, priority: i32) {
        self.queue.add_with_priority(key, priority);
    }

    /// Enqueues `key` once `delay` has passed.
    pub fn add_after(&self, key: ObjectKey, delay: std::time::Duration) {
        self.queue.add_after(key, delay);
    }
}

/// The handler registered on one informer of a controller.
pub(crate) struct EnqueueHandler<K> {
    pub(crate) queue: WorkQueue,
    /// The controller's event filters (metadata).
    pub(crate) predicates: EventFilters,
    /// This source's own predicates (typed).
    pub(crate) source_predicates: Filters<K>,
    pub(crate) mapping: Mapping<K>,
    /// The drain label's key if this is a sharded controller's primary source
    /// (`drain.shard.kinformer.io/<ring>`): its changes are queued whatever the filters say.
    pub(crate) drain_label: Option<String>,
    /// A sharded controller's primary source: where a queued delete of an object labelled for
    /// this shard is recorded, so the shard reconciles the deletion (see [`Deletions`]).
    pub(crate) deletions: Option<Arc<Deletions>>,
}

impl<K: Resource> EnqueueHandler<K> {
    /// The value of the drain label on `meta` (`None`: not sharded, or no such label).
    fn drain_value<'m>(&self, meta: &'m ObjectMeta) -> Option<&'m String> {
        meta.labels.as_ref()?.get(self.drain_label.as_deref()?)
    }

    /// Whether the drain label differs between `old` and `new` (a drain requested or withdrawn):
    /// the shard must take the key to acknowledge it, whatever the filters say.
    fn drain_changed(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        self.drain_label.is_some() && self.drain_value(old) != self.drain_value(new)
    }

    /// Enqueues the keys of an update: the new object's, and for a mapping that may change
    /// between the two states, the old one's.
    fn enqueue_update(&self, old: &K, new: &K, priority: i32) {
        match &self.mapping {
            // The key cannot change between old and new.
            Mapping::Object => self.enqueue(new, priority),
            // The queue merges the two adds when both give the same key.
            Mapping::Owner(_) | Mapping::Func(_) => {
                self.enqueue(old, priority);
                self.enqueue(new, priority);
            }
        }
    }

    fn enqueue(&self, obj: &K, priority: i32) {
        let add = |key| self.queue.add_with_priority(key, priority);
        match &self.mapping {
            Mapping::Object => {
                if let Some(key) = ObjectKey::from_object(obj) {
                    add(key);
                }
            }
            Mapping::Owner(owner) => owner.owner_keys(obj.meta(), add),
            Mapping::Func(map) => map(obj).into_iter().for_each(add),
        }
    }
}

impl<K: Resource + Send + Sync + 'static> ResourceEventHandler<K> for EnqueueHandler<K> {
    fn on_add(&self, obj: &Arc<K>, is_in_initial_list: bool) {
        // Already draining when this shard first sees it (listed after a restart): the drain
        // waits for this shard's acknowledgement, not behind the initial list.
        if self.drain_value(obj.meta()).is_some() {
            self.enqueue(obj, NORMAL_PRIORITY);
        } else if self.predicates.create(obj.meta()) && self.source_predicates.create(obj) {
            let priority = if is_in_initial_list {
                LOW_PRIORITY
            } else {
                NORMAL_PRIORITY
            };
            self.enqueue(obj, priority);
        }
    }

    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        if self.drain_changed(old.meta(), new.meta()) {
            self.enqueue_update(old, new, NORMAL_PRIORITY);
            return;
        }
        if !(self.predicates.update(old.meta(), new.meta()) && self.source_predicates.update(old, new)) {
            return;
        }
        // A resync delivers the cached object as both old and new: nothing changed.
        let priority = if old.meta().resource_version == new.meta().resource_version {
            LOW_PRIORITY
        } else {
            NORMAL_PRIORITY
        };
        self.enqueue_update(old, new, priority);
    }

    fn on_delete(&self, obj: DeletedObject<K>) {
        let obj = obj.object();
        if self.predicates.delete(obj.meta()) && self.source_predicates.delete(obj) {
            // A sharded primary's deletion of this shard's object is the shard's to reconcile,
            // even if no worker took its key before (recorded before the key is queued).
            if let (Some(deletions), Mapping::Object) = (&self.deletions, &self.mapping)
                && let Some(key) = ObjectKey::from_object(&**obj)
            {
                deletions.record(key, obj.meta());
            }
            self.enqueue(obj, NORMAL_PRIORITY);
        }
    }

    /// Filtering and adding keys to the queue never block: the informer calls this handler
    /// inline (predicates and mappers must not block either).
    fn is_non_blocking(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use futures::FutureExt;

    use super::*;

    fn owned(kind: &str, api_version: &str, controller: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some("child".into()),
            namespace: Some("ns".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "parent".into(),
                uid: "u".into(),
                controller: Some(controller),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        }
    }

    impl OwnerType {
        fn owner_key(&self, meta: &ObjectMeta) -> Option<ObjectKey> {
            let mut keys = Vec::new();
            self.owner_keys(meta, |key| keys.push(key));
            assert!(keys.len() <= 1, "{keys:?}");
            keys.pop()
        }
    }

    #[test]
    fn every_owner_of_the_primary_kind_when_asked() {
        let mut meta = owned("Foo", "example.com/v1", true);
        let refs = meta.owner_references.as_mut().unwrap();
        let mut second = refs[0].clone();
        (second.name, second.controller) = ("other".into(), None);
        let mut foreign = second.clone();
        (foreign.name, foreign.kind) = ("bar".into(), "Bar".into());
        refs.extend([second, foreign]);
        let mut foo = OwnerType {
            group: "example.com".into(),
            kind: "Foo".into(),
            namespaced: true,
            only_controller: false,
        };
        let mut keys = Vec::new();
        foo.owner_keys(&meta, |key| keys.push(key));
        assert_eq!(
            keys,
            [
                ObjectKey::namespaced("ns", "parent"),
                ObjectKey::namespaced("ns", "other")
            ]
        );
        foo.only_controller = true;
        assert_eq!(foo.owner_key(&meta), Some(ObjectKey::namespaced("ns", "parent")));
    }

    #[test]
    fn owner_keys_need_a_controller_reference_of_the_primary_group_and_kind() {
        let foo = OwnerType {
            group: "example.com".into(),
            kind: "Foo".into(),
            namespaced: true,
            only_controller: true,
        };
        let parent = Some(ObjectKey::namespaced("ns", "parent"));
        assert_eq!(foo.owner_key(&owned("Foo", "example.com/v1", true)), parent);
        assert_eq!(
            foo.owner_key(&owned("Foo", "example.com/v2", true)),
            parent,
            "any version"
        );
        assert_eq!(
            foo.owner_key(&owned("Foo", "example.com/v1", false)),
            None,
            "not the controller"
        );
        assert_eq!(foo.owner_key(&owned("Foo", "other.com/v1", true)), None);
        assert_eq!(foo.owner_key(&owned("Bar", "example.com/v1", true)), None);
        assert_eq!(foo.owner_key(&ObjectMeta::default()), None);

        let core = OwnerType {
            group: String::new(),
            kind: "Namespace".into(),
            namespaced: false,
            only_controller: true,
        };
        assert_eq!(
            core.owner_key(&owned("Namespace", "v1", true)),
            Some(ObjectKey::cluster_scoped("parent"))
        );
    }

    /// controller-runtime's `WithLowPriorityWhenUnchanged`: the initial list and resyncs (an
    /// update keeping the resourceVersion) at `LOW_PRIORITY`, real changes and deletes at 0.
    #[tokio::test]
    async fn the_initial_list_and_resyncs_enqueue_at_low_priority() {
        let queue = WorkQueue::new(
            true,
            Box::new(workqueue::default_controller_rate_limiter()),
            workqueue::QueueConfig::default(),
        );
        let handler = EnqueueHandler::<ConfigMap> {
            queue: queue.clone(),
            predicates: EventFilters(Vec::new()),
            source_predicates: Filters::default(),
            mapping: Mapping::Object,
            drain_label: None,
            deletions: None,
        };
        let cm = |name: &str, rv: &str| {
            Arc::new(ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("ns".into()),
                    resource_version: Some(rv.into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            })
        };
        handler.on_add(&cm("listed", "1"), true);
        handler.on_add(&cm("created", "2"), false);
        handler.on_update(&cm("resynced", "3"), &cm("resynced", "3"));
        handler.on_update(&cm("updated", "3"), &cm("updated", "4"));
        handler.on_delete(DeletedObject::Object(cm("deleted", "5")));
        let mut got = Vec::new();
        while let Some((key, priority)) = queue.get().now_or_never().flatten() {
            queue.done(&key);
            got.push((key.name, priority));
        }
        let expected = [
            ("created", NORMAL_PRIORITY),
            ("updated", NORMAL_PRIORITY),
            ("deleted", NORMAL_PRIORITY),
            ("listed", LOW_PRIORITY),
            ("resynced", LOW_PRIORITY),
        ];
        assert_eq!(got, expected.map(|(name, priority)| (name.to_owned(), priority)));
    }

    /// Passes nothing.
    struct Nothing;

    impl crate::predicate::Predicate for Nothing {
        fn create(&self, _: &ObjectMeta) -> bool {
            false
        }
        fn update(&self, _: &ObjectMeta, _: &ObjectMeta) -> bool {
            false
        }
        fn delete(&self, _: &ObjectMeta) -> bool {
            false
        }
    }

    /// A sharded primary's handler queues a drain label's change (and an object listed while
    /// draining) at `NORMAL_PRIORITY` although the filters reject every notification; other
    /// changes stay filtered.
    #[tokio::test]
    async fn drain_label_changes_bypass_the_filters() {
        let queue = WorkQueue::new(
            true,
            Box::new(workqueue::default_controller_rate_limiter()),
            workqueue::QueueConfig::default(),
        );
        let drain = "drain.shard.kinformer.io/ring".to_owned();
        let handler = EnqueueHandler::<ConfigMap> {
            queue: queue.clone(),
            predicates: EventFilters(vec![Arc::new(Nothing)]),
            source_predicates: Filters::default(),
            mapping: Mapping::Object,
            drain_label: Some(drain.clone()),
            deletions: None,
        };
        let cm = |name: &str, rv: &str, draining: bool| {
            let labels = draining.then(|| [(drain.clone(), "true".to_owned())].into());
            Arc::new(ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("ns".into()),
                    resource_version: Some(rv.into()),
                    labels,
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            })
        };
        handler.on_add(&cm("listed", "1", false), true);
        handler.on_add(&cm("created", "1", false), false);
        handler.on_update(&cm("changed", "1", false), &cm("changed", "2", false));
        handler.on_update(&cm("still-draining", "1", true), &cm("still-draining", "2", true));
        handler.on_delete(DeletedObject::Object(cm("deleted", "1", true)));
        assert!(queue.is_empty(), "filtered");
        handler.on_update(&cm("drained", "1", false), &cm("drained", "2", true));
        handler.on_update(&cm("withdrawn", "1", true), &cm("withdrawn", "2", false));
        handler.on_add(&cm("listed-draining", "1", true), true);
        let mut got = Vec::new();
        while let Some((key, priority)) = queue.get().now_or_never().flatten() {
            queue.done(&key);
            got.push((key.name, priority));
        }
        let expected = ["drained", "withdrawn", "listed-draining"].map(|name| (name.to_owned(), NORMAL_PRIORITY));
        assert_eq!(got, expected);

        // Not sharded: the same label is just a label, filtered.
        let plain = EnqueueHandler {
            drain_label: None,
            deletions: None,
            ..handler
        };
        plain.on_update(&cm("drained", "1", false), &cm("drained", "2", true));
        plain.on_add(&cm("listed-draining", "1", true), true);
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn updates_enqueue_old_and_new_owners_and_predicates_filter() {
        let queue = WorkQueue::new(
            true,
            Box::new(workqueue::default_controller_rate_limiter()),
            workqueue::QueueConfig::default(),
        );
        let handler = EnqueueHandler::<ConfigMap> {
            queue: queue.clone(),
            predicates: EventFilters(vec![Arc::new(crate::predicate::LabelsChanged)]),
            source_predicates: Filters::default(),
            mapping: Mapping::Owner(OwnerType {
                group: "example.com".into(),
                kind: "Foo".into(),
                namespaced: true,
                only_controller: true,
            }),
            drain_label: None,
            deletions: None,
        };
        let mut old = ConfigMap {
            metadata: owned("Foo", "example.com/v1", true),
            ..ConfigMap::default()
        };
        let mut new = old.clone();
        new.metadata.owner_references.as_mut().unwrap()[0].name = "adopter".into();
        handler.on_update(&Arc::new(old.clone()), &Arc::new(new.clone()));
        assert!(queue.is_empty(), "labels did not change: filtered");
        new.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        handler.on_update(&Arc::new(old.clone()), &Arc::new(new));
        let mut keys = vec![queue.get().await.unwrap().0, queue.get().await.unwrap().0];
        keys.sort();
        assert_eq!(
            keys,
            [
                ObjectKey::namespaced("ns", "adopter"),
                ObjectKey::namespaced("ns", "parent")
            ]
        );
        keys.iter().for_each(|key| queue.done(key));
        old.metadata.name = Some("other".into());
        handler.on_delete(DeletedObject::Object(Arc::new(old)));
        assert_eq!(
            queue.get().await,
            Some((ObjectKey::namespaced("ns", "parent"), NORMAL_PRIORITY))
        );
    }
}
