//! The store interface and object keys (client-go `store.go`).
//!
//! [`Store`] is the write side shared by everything the reflector can feed: the
//! [`DeltaFifo`](crate::DeltaFifo) inside an informer, or an [`Indexer`](crate::Indexer)
//! directly. Objects are keyed by [`meta_namespace_key`]: `namespace/name`, or `name` for
//! cluster-scoped objects.

use std::sync::Arc;

use kube::Resource;

use crate::delta::DeltaType;
use crate::undecodable::Undecodable;

/// Why an object has no key: the server sent an object without `metadata.name`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("object has no metadata.name, so it has no key")]
pub struct KeyError;

/// Errors from writing to a [`Store`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The object has no key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The store is a closed queue and takes no more objects.
    #[error("the queue is closed")]
    Closed,
    /// The object's namespace is none of those a merged [`Indexer`](crate::Indexer) holds.
    #[error("namespace {namespace:?} is not held by this cache")]
    NamespaceNotHeld {
        /// The object's namespace (empty for a cluster-scoped object).
        namespace: String,
    },
}

/// The key of an object: `namespace/name`, or `name` when it has no namespace
/// (client-go `MetaNamespaceKeyFunc`).
pub fn meta_namespace_key<K: Resource>(obj: &K) -> Result<String, KeyError> {
    let meta = obj.meta();
    let name = meta.name.as_deref().filter(|n| !n.is_empty()).ok_or(KeyError)?;
    Ok(match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    })
}

/// Splits a key made by [`meta_namespace_key`] into `(namespace, name)`
/// (client-go `SplitMetaNamespaceKey`). Returns `None` for a key with more than one `/`.
pub fn split_meta_namespace_key(key: &str) -> Option<(Option<&str>, &str)> {
    let mut parts = key.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => Some((None, name)),
        (Some(ns), Some(name), None) => Some((Some(ns), name)),
        _ => None,
    }
}

/// What a reflector writes into: a cache or a queue of changes (client-go `Store`, write side).
///
/// Objects arrive as `Arc<K>` so a store never clones an object.
pub trait Store<K>: Send + Sync {
    /// An object was created.
    fn add(&self, obj: Arc<K>) -> Result<(), StoreError>;
    /// An object was modified.
    fn update(&self, obj: Arc<K>) -> Result<(), StoreError>;
    /// An object was deleted; `obj` is its last state.
    fn delete(&self, obj: Arc<K>) -> Result<(), StoreError>;
    /// The whole content is `list`, as of `resource_version` (after a list or relist).
    fn replace(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), StoreError>;
    /// Periodic resync: a queue re-delivers what it knows; a plain cache does nothing.
    fn resync(&self) -> Result<(), StoreError>;
    /// The server's resourceVersion advanced to `resource_version` with no object change (a
    /// watch BOOKMARK; client-go `ReflectorBookmarkStore`). A cache records it as its
    /// last-synced resourceVersion; an in-order queue passes it on in order. By default ignored.
    fn bookmark(&self, resource_version: &str) -> Result<(), StoreError> {
        let _ = resource_version;
        Ok(())
    }
    /// The object under `key` is on the server but does not decode (a watch ADDED or MODIFIED
    /// the reflector could not decode; see [`undecodable`](crate::undecodable)). A cache marks
    /// the key and keeps any decoded version it holds; a queue passes the mark on in order.
    /// By default ignored.
    fn mark_undecodable(&self, key: String, undecodable: Undecodable) -> Result<(), StoreError> {
        let _ = (key, undecodable);
        Ok(())
    }
    /// The object under `key`, which does not decode, was deleted at `resource_version` (a
    /// watch DELETED the reflector could not decode; empty if its metadata did not say): the
    /// mark goes and any cached version is deleted as usual. By default ignored.
    fn delete_undecodable(&self, key: String, resource_version: &str) -> Result<(), StoreError> {
        let _ = (key, resource_version);
        Ok(())
    }
    /// [`replace`](Store::replace) with the keys of the listed objects that did not decode:
    /// they are present, so nothing is deleted for them (a cached decoded version stays), and
    /// they are exactly the marked keys afterwards. By default `replace(list)`, which drops
    /// them.
    fn replace_with_undecodable(
        &self,
        list: Vec<Arc<K>>,
        undecodable: Vec<(String, Undecodable)>,
        resource_version: &str,
    ) -> Result<(), StoreError> {
        let _ = undecodable;
        self.replace(list, resource_version)
    }
    /// Applies watch events in order, with the effect of one [`add`](Store::add),
    /// [`update`](Store::update) or [`delete`](Store::delete) per change (what `kind` says;
    /// `Replaced` and `Sync` count as adds). The reflector hands over every event one read of
    /// the watch stream returned, so that a queue takes its lock and wakes its consumer once per
    /// batch rather than once per event (client-go calls the store per event). An object
    /// without a key is skipped, the others are applied, and the skipped ones' errors are
    /// returned; `Err` only for [`StoreError::Closed`]. By default, one call per change.
    fn apply_changes(&self, changes: Vec<(DeltaType, Arc<K>)>) -> Result<Vec<KeyError>, StoreError> {
        let mut skipped = Vec::new();
        for (kind, obj) in changes {
            let applied = match kind {
                DeltaType::Deleted => self.delete(obj),
                DeltaType::Updated => self.update(obj),
                DeltaType::Added | DeltaType::Replaced | DeltaType::Sync => self.add(obj),
            };
            match applied {
                Ok(()) => {}
                Err(StoreError::Key(e)) => skipped.push(e),
                Err(e) => return Err(e),
            }
        }
        Ok(skipped)
    }
}

/// Read access the [`DeltaFifo`](crate::DeltaFifo) needs to the informer's cache, to compute
/// deletions on `replace` and what to re-deliver on `resync` (client-go `KeyListerGetter`).
pub trait KnownObjects<K>: Send + Sync {
    /// Every key in the cache.
    fn list_keys(&self) -> Vec<String>;
    /// The cached object under `key`.
    fn get_by_key(&self, key: &str) -> Option<Arc<K>>;
    /// Every key the cache marks undecodable (see [`Store::mark_undecodable`]), so that a
    /// relist can drop the marks of keys it no longer lists. By default none.
    fn undecodable_keys(&self) -> Vec<String> {
        Vec::new()
    }
}
