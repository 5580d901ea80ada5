//! The versioned object store: envtest's etcd.
//!
//! Every write takes the next value of one global, strictly increasing revision counter, stamps it
//! into `metadata.resourceVersion`, and appends a [`WatchCacheEvent`] to the watch cache *under the
//! same lock*, so the order of events in the cache is the order of revisions and a watcher can
//! never see revision `n + 1` before `n`. Readers get `Arc<Value>` snapshots; nothing is cloned
//! deeply on the read path.

use crate::watch_cache::{EventType, WatchCache, WatchCacheEvent};
use crate::{object, status::ApiError};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// `(namespace, name)`; the namespace is `""` for cluster-scoped objects.
pub(crate) type ObjectKey = (String, String);

/// The objects of one resource, ordered by key (list order).
pub(crate) type Objects = BTreeMap<ObjectKey, Arc<Value>>;

/// The store's objects and revision at one moment, taken by [`Faults::snapshot`]; what
/// [`Faults::restore`] puts back, as an API server restarted on an older etcd backup.
///
/// [`Faults::snapshot`]: crate::Faults::snapshot
/// [`Faults::restore`]: crate::Faults::restore
#[derive(Debug, Clone)]
pub struct Snapshot {
    revision: u64,
    objects: HashMap<String, Objects>,
}

impl Snapshot {
    /// The revision (resourceVersion) the snapshot was taken at.
    pub fn resource_version(&self) -> u64 {
        self.revision
    }
}

/// The store. All state sits behind one mutex, reached only through [`Storage::lock`], and is
/// never held across an `.await`.
#[derive(Debug)]
pub(crate) struct Storage {
    inner: Mutex<Inner>,
}

/// The state behind the lock.
///
/// Invariants: `rv` is the revision of the last write (0 before any); every stored object's
/// `metadata.resourceVersion` is the revision that wrote it, so is `<= rv`; the watch cache holds,
/// in increasing order, every event with revision in `(cache.window_start(), rv]`.
#[derive(Debug)]
pub(crate) struct Inner {
    rv: u64,
    objects: HashMap<String, Objects>,
    /// The watch cache (the apiserver's Cacher): recent events and the registered watchers.
    pub(crate) cache: WatchCache,
    /// `rv` for those who wait for a revision (see [`Storage::revisions`]).
    revision: watch::Sender<u64>,
}

impl Storage {
    /// An empty store with a watch cache of `cache_size` events.
    pub(crate) fn new(cache: WatchCache) -> Self {
        Storage {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: HashMap::new(),
                cache,
                revision: watch::Sender::new(0),
            }),
        }
    }

    /// Locks the store. A poisoned lock is recovered: every mutation leaves `Inner` consistent
    /// before any step that could panic.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a thread holds the lock now: for tests that check what runs off it.
    #[cfg(test)]
    pub(crate) fn is_locked(&self) -> bool {
        matches!(self.inner.try_lock(), Err(std::sync::TryLockError::WouldBlock))
    }

    /// The revision of the last write, as it moves: for a request that waits until the store
    /// reaches a revision.
    pub(crate) fn revisions(&self) -> watch::Receiver<u64> {
        self.lock().revision.subscribe()
    }
}

impl Inner {
    /// Moves to the next revision and tells those waiting for one.
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.revision.send_replace(self.rv);
        self.rv
    }

    /// The revision of the last write.
    pub(crate) fn current_rv(&self) -> u64 {
        self.rv
    }

    /// The objects and the revision as they are now (the objects are shared, not copied).
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            revision: self.rv,
            objects: self.objects.clone(),
        }
    }

    /// Puts `snapshot` back as the current state, revision counter included (it may go
    /// *back*, as after an etcd restore without `--bump-revision`), and closes every watch and
    /// empties the watch cache, as a restarted API server starts with none.
    pub(crate) fn restore(&mut self, snapshot: &Snapshot) {
        self.cache.close_all();
        self.objects = snapshot.objects.clone();
        self.rv = snapshot.revision;
        self.revision.send_replace(self.rv);
        self.cache.compact(self.rv);
    }

    /// One object.
    pub(crate) fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.objects
            .get(resource)?
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// All objects of a resource (current state).
    pub(crate) fn objects(&self, resource: &str) -> Option<&Objects> {
        self.objects.get(resource)
    }

    /// Every (resource key, object) pair, for the garbage collector.
    pub(crate) fn all_objects(&self) -> impl Iterator<Item = (&str, &Arc<Value>)> {
        self.objects
            .iter()
            .flat_map(|(k, objs)| objs.values().map(move |o| (k.as_str(), o)))
    }

    /// The objects of `resource` as they were at revision `rv`, rebuilt by undoing the cached
    /// events newer than `rv`. Fails with `410 Expired` when the cache no longer reaches back to
    /// `rv`, and with `504` for a revision in the future.
    pub(crate) fn snapshot_at(&self, resource: &str, rv: u64) -> Result<Objects, ApiError> {
        if rv > self.rv {
            return Err(ApiError::too_large_resource_version(rv, self.rv));
        }
        let events = self.cache.events_since(resource, rv).ok_or_else(|| {
            ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                self.cache.window_start()
            ))
        })?;
        let mut objs = self.objects.get(resource).cloned().unwrap_or_default();
        for ev in events.iter().rev() {
            let key = (
                object::namespace(&ev.object).to_owned(),
                object::name(&ev.object).to_owned(),
            );
            match (&ev.kind, &ev.prev) {
                (EventType::Added, _) => {
                    objs.remove(&key);
                }
                (_, Some(prev)) => {
                    objs.insert(key, prev.clone());
                }
                (_, None) => {}
            }
        }
        Ok(objs)
    }

    /// Stores `obj` (created or replaced) at the next revision and records the event.
    ///
    /// The caller has set every other server-owned field; this sets `resourceVersion`.
    pub(crate) fn put(&mut self, resource: &str, mut obj: Value) -> Arc<Value> {
        let rv = self.next_rv();
        object::set_meta(&mut obj, "resourceVersion", Value::String(rv.to_string()));
        let key = (object::namespace(&obj).to_owned(), object::name(&obj).to_owned());
        let obj = Arc::new(obj);
        let prev = self
            .objects
            .entry(resource.to_owned())
            .or_default()
            .insert(key, obj.clone());
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.cache
            .push(WatchCacheEvent::new(rv, resource, kind, obj.clone(), prev));
        obj
    }

    /// Removes an object at the next revision; the DELETED event carries the object with that
    /// revision, as kube-apiserver's does.
    pub(crate) fn remove(&mut self, resource: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let key = (namespace.to_owned(), name.to_owned());
        let prev = self.objects.get_mut(resource)?.remove(&key)?;
        let rv = self.next_rv();
        let mut last = (*prev).clone();
        object::set_meta(&mut last, "resourceVersion", Value::String(rv.to_string()));
        let last = Arc::new(last);
        self.cache.push(WatchCacheEvent::new(
            rv,
            resource,
            EventType::Deleted,
            last.clone(),
            Some(prev),
        ));
        Some(last)
    }
}
