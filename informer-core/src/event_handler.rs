//! What informers notify: the [`ResourceEventHandler`] trait (client-go `controller.go`'s
//! `ResourceEventHandler`, `ResourceEventHandlerFuncs`, `FilteringResourceEventHandler`).
//!
//! Each handler is called by its own listener (`listener.rs`), one notification at a time, in
//! the order the informer saw the changes; a listener holds no thread of its own. A handler
//! that may block (the default) is called on a thread of the runtime's blocking pool, so a
//! slow one delays only itself. A handler that declares itself non-blocking
//! ([`ResourceEventHandler::is_non_blocking`], or `HandlerOptions::non_blocking` at
//! registration) is called inline, by the informer's own task right after the change reached
//! the cache: the cheapest way, and the one a handler that only filters and enqueues a key
//! (the controller's) should take.

use std::sync::Arc;

use crate::delta::DeletedObject;

/// Receives notifications about changes to objects of type `K`.
///
/// Objects are shared `Arc<K>`s straight from the cache: handlers must not expect to own them.
pub trait ResourceEventHandler<K>: Send + Sync + 'static {
    /// An object appeared. `is_in_initial_list` is true for objects from the informer's first
    /// list (and for the cache replayed to a handler added after start).
    fn on_add(&self, obj: &Arc<K>, is_in_initial_list: bool) {
        let _ = (obj, is_in_initial_list);
    }

    /// An object changed, or a periodic resync re-delivered it (then `old` and `new` have the
    /// same resourceVersion).
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        let _ = (old, new);
    }

    /// An object was deleted. If the watch missed the delete and a relist found the object
    /// gone, `obj` is a [`DeletedFinalStateUnknown`](crate::DeletedFinalStateUnknown)
    /// tombstone holding the last state the cache had.
    fn on_delete(&self, obj: DeletedObject<K>) {
        let _ = obj;
    }

    /// Whether this handler promises never to block: it only looks at the objects, filters,
    /// and hands keys on without waiting (adds them to a work queue, say). The informer then
    /// calls it inline, on its own task, right after each batch of changes reached the cache,
    /// rather than through a buffer drained by another thread: nothing is buffered for it and
    /// no thread is woken per batch. A handler that blocks anyway (I/O, a lock held long, a
    /// full bounded channel) stalls the informer and every handler on it, and a runtime worker.
    ///
    /// Default `false`: the handler may block and is called on a thread of the runtime's
    /// blocking pool. Registering
    /// with `HandlerOptions::non_blocking` declares the same for a handler that does not say so.
    fn is_non_blocking(&self) -> bool {
        false
    }
}

type AddFunc<K> = Box<dyn Fn(&Arc<K>, bool) + Send + Sync>;
type UpdateFunc<K> = Box<dyn Fn(&Arc<K>, &Arc<K>) + Send + Sync>;
type DeleteFunc<K> = Box<dyn Fn(DeletedObject<K>) + Send + Sync>;

/// A handler made of closures; missing ones ignore their notification
/// (client-go `ResourceEventHandlerFuncs`).
///
/// ```
/// # use informer_core::ResourceEventHandlerFuncs;
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// let handler = ResourceEventHandlerFuncs::<ConfigMap>::new()
///     .on_add(|cm, _initial| println!("added {:?}", cm.metadata.name))
///     .on_delete(|gone| println!("deleted {:?}", gone.object().metadata.name));
/// ```
pub struct ResourceEventHandlerFuncs<K> {
    add: Option<AddFunc<K>>,
    update: Option<UpdateFunc<K>>,
    delete: Option<DeleteFunc<K>>,
    non_blocking: bool,
}

impl<K> Default for ResourceEventHandlerFuncs<K> {
    fn default() -> Self {
        ResourceEventHandlerFuncs {
            add: None,
            update: None,
            delete: None,
            non_blocking: false,
        }
    }
}

impl<K> ResourceEventHandlerFuncs<K> {
    /// A handler that ignores everything until closures are set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the add closure.
    #[must_use]
    pub fn on_add(mut self, f: impl Fn(&Arc<K>, bool) + Send + Sync + 'static) -> Self {
        self.add = Some(Box::new(f));
        self
    }

    /// Sets the update closure.
    #[must_use]
    pub fn on_update(mut self, f: impl Fn(&Arc<K>, &Arc<K>) + Send + Sync + 'static) -> Self {
        self.update = Some(Box::new(f));
        self
    }

    /// Sets the delete closure.
    #[must_use]
    pub fn on_delete(mut self, f: impl Fn(DeletedObject<K>) + Send + Sync + 'static) -> Self {
        self.delete = Some(Box::new(f));
        self
    }

    /// Declares that none of the closures ever blocks, so the informer calls them inline (see
    /// [`ResourceEventHandler::is_non_blocking`]).
    #[must_use]
    pub fn non_blocking(mut self) -> Self {
        self.non_blocking = true;
        self
    }
}

impl<K: Send + Sync + 'static> ResourceEventHandler<K> for ResourceEventHandlerFuncs<K> {
    fn on_add(&self, obj: &Arc<K>, is_in_initial_list: bool) {
        if let Some(f) = &self.add {
            f(obj, is_in_initial_list);
        }
    }

    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        if let Some(f) = &self.update {
            f(old, new);
        }
    }

    fn on_delete(&self, obj: DeletedObject<K>) {
        if let Some(f) = &self.delete {
            f(obj);
        }
    }

    fn is_non_blocking(&self) -> bool {
        self.non_blocking
    }
}

/// Passes on only notifications about objects that match a filter
/// (client-go `FilteringResourceEventHandler`).
///
/// An update that moves an object out of the filter becomes a delete (of the old object);
/// one that moves it in becomes an add (not in the initial list). A delete is passed on if
/// the last known state matched.
pub struct FilteringResourceEventHandler<K, H> {
    filter: Box<dyn Fn(&K) -> bool + Send + Sync>,
    handler: H,
}

impl<K, H> FilteringResourceEventHandler<K, H> {
    /// Wraps `handler` so it sees only objects for which `filter` is true.
    pub fn new(filter: impl Fn(&K) -> bool + Send + Sync + 'static, handler: H) -> Self {
        FilteringResourceEventHandler {
            filter: Box::new(filter),
            handler,
        }
    }
}

impl<K, H> ResourceEventHandler<K> for FilteringResourceEventHandler<K, H>
where
    K: Send + Sync + 'static,
    H: ResourceEventHandler<K>,
{
    fn on_add(&self, obj: &Arc<K>, is_in_initial_list: bool) {
        if (self.filter)(obj) {
            self.handler.on_add(obj, is_in_initial_list);
        }
    }

    fn on_update(&self, old: &Arc<K>, new: &Arc<K>) {
        match ((self.filter)(old), (self.filter)(new)) {
            (true, true) => self.handler.on_update(old, new),
            (true, false) => self.handler.on_delete(DeletedObject::Object(old.clone())),
            (false, true) => self.handler.on_add(new, false),
            (false, false) => {}
        }
    }

    fn on_delete(&self, obj: DeletedObject<K>) {
        if (self.filter)(obj.object()) {
            self.handler.on_delete(obj);
        }
    }

    /// The wrapped handler's (the filter must not block either).
    fn is_non_blocking(&self) -> bool {
        self.handler.is_non_blocking()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;
    use crate::delta::DeletedFinalStateUnknown;

    fn cm(name: &str, team: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("team".to_string(), team.to_string())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    fn team(cm: &ConfigMap) -> &str {
        cm.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("team"))
            .map(String::as_str)
            .unwrap_or("")
    }

    #[test]
    fn filtering_turns_moves_across_the_filter_into_adds_and_deletes() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let funcs = {
            let (a, u, d) = (log.clone(), log.clone(), log.clone());
            ResourceEventHandlerFuncs::new()
                .on_add(move |o: &Arc<ConfigMap>, initial| a.lock().unwrap().push(format!("add {} {initial}", team(o))))
                .on_update(move |o, n| u.lock().unwrap().push(format!("update {}->{}", team(o), team(n))))
                .on_delete(move |o: DeletedObject<ConfigMap>| {
                    d.lock()
                        .unwrap()
                        .push(format!("delete {} tombstone={}", team(o.object()), o.is_tombstone()))
                })
        };
        let handler = FilteringResourceEventHandler::new(|cm: &ConfigMap| team(cm) == "ours", funcs);
        handler.on_add(&cm("a", "theirs"), true);
        handler.on_add(&cm("a", "ours"), true);
        handler.on_update(&cm("a", "ours"), &cm("a", "ours"));
        handler.on_update(&cm("a", "ours"), &cm("a", "theirs"));
        handler.on_update(&cm("a", "theirs"), &cm("a", "ours"));
        handler.on_update(&cm("a", "theirs"), &cm("a", "theirs"));
        handler.on_delete(DeletedObject::Object(cm("a", "theirs")));
        handler.on_delete(DeletedObject::DeletedFinalStateUnknown(DeletedFinalStateUnknown {
            key: "a".into(),
            obj: cm("a", "ours"),
        }));
        assert_eq!(
            *log.lock().unwrap(),
            [
                "add ours true",
                "update ours->ours",
                "delete ours tombstone=false",
                "add ours false",
                "delete ours tombstone=true",
            ]
        );
    }
}
