//! The informer's cache: a keyed, indexed, thread-safe store of `Arc<K>` (client-go `Indexer`
//! and the `cache` type of `store.go`).
//!
//! Writers are the informer's `handle_deltas` (or a reflector feeding it directly); readers
//! are listers and handlers. Cloning an `Indexer` is cheap and shares the same cache.
//!
//! ```
//! use std::sync::Arc;
//! use informer_core::{Indexer, Indexers, Store};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! let mut indexers: Indexers<ConfigMap> = Indexers::new();
//! indexers.insert("app".into(), Arc::new(|cm: &ConfigMap| {
//!     cm.metadata.labels.iter().flatten().filter(|(k, _)| *k == "app").map(|(_, v)| v.clone()).collect()
//! }));
//! let cache = Indexer::new(indexers);
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("web-config".into());
//! cm.metadata.namespace = Some("prod".into());
//! cm.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
//! cache.add(Arc::new(cm)).unwrap();
//! assert_eq!(cache.by_index("app", "web").unwrap().len(), 1);
//! assert_eq!(cache.by_index(informer_core::NAMESPACE_INDEX, "prod").unwrap().len(), 1);
//! assert!(cache.get_by_key("prod/web-config").is_some());
//! ```

use std::sync::Arc;

use kube::Resource;

use crate::index::{Indexers, NAMESPACE_INDEX, meta_namespace_index_value, namespace_indexers};
use crate::store::{KeyError, KnownObjects, Store, StoreError, meta_namespace_key};
use crate::thread_safe_store::{FastHash, IndexError, Items, ThreadSafeStore};
use crate::undecodable::{Lookup, Undecodable, type_name, warn_marked};

/// A thread-safe cache of objects with named indexes. The namespace index is always present.
///
/// Either one store, or a merged view of several (one per namespace of an informer with
/// several list/watches, [`SharedIndexInformer::partitioned`](crate::SharedIndexInformer::partitioned)):
/// a key or an object goes to the part holding its namespace, lists and index lookups
/// concatenate the parts' answers. Parts hold disjoint namespaces, so nothing is found twice.
pub struct Indexer<K> {
    backing: Backing<K>,
}

enum Backing<K> {
    One(Arc<ThreadSafeStore<K>>),
    /// Invariant: no two parts name the same namespace.
    Merged(Arc<[Part<K>]>),
}

/// One store of a merged view and the namespace it holds (`None`: any namespace, or
/// cluster-scoped objects).
struct Part<K> {
    namespace: Option<String>,
    indexer: Indexer<K>,
}

impl<K> Clone for Indexer<K> {
    fn clone(&self) -> Self {
        Indexer {
            backing: match &self.backing {
                Backing::One(store) => Backing::One(store.clone()),
                Backing::Merged(parts) => Backing::Merged(parts.clone()),
            },
        }
    }
}

/// The namespace of a cache key (`namespace/name`), `None` for a cluster-scoped `name`.
fn key_namespace(key: &str) -> Option<&str> {
    key.split_once('/').map(|(namespace, _)| namespace)
}

impl<K: Resource + 'static> Default for Indexer<K> {
    fn default() -> Self {
        Self::new(Indexers::new())
    }
}

impl<K: Resource + 'static> Indexer<K> {
    /// An empty cache with the namespace index and `indexers`.
    pub fn new(indexers: Indexers<K>) -> Self {
        Self::with_store(indexers).0
    }

    /// An empty cache with the namespace index and `indexers`, and its store, which the
    /// informer writes a batch of changes to under one lock.
    pub(crate) fn with_store(indexers: Indexers<K>) -> (Self, Arc<ThreadSafeStore<K>>) {
        // A namespace index of the caller's replaces the built-in one, whose value the store
        // may then not take for the namespace.
        let built_in_namespace_index = !indexers.contains_key(NAMESPACE_INDEX);
        let mut all = namespace_indexers::<K>();
        all.extend(indexers);
        let mut store = ThreadSafeStore::new(all);
        if built_in_namespace_index {
            store = store.with_borrowed_index_value(NAMESPACE_INDEX, meta_namespace_index_value::<K>);
        }
        let store = Arc::new(store);
        (
            Indexer {
                backing: Backing::One(store.clone()),
            },
            store,
        )
    }

    /// A merged view of `parts`, each holding the objects of one namespace (`None`: of any
    /// namespace not named by another part). One part is that part itself. Later parts naming
    /// a namespace an earlier one names are dropped.
    pub(crate) fn merged(parts: impl IntoIterator<Item = (Option<String>, Indexer<K>)>) -> Self {
        let mut merged: Vec<Part<K>> = Vec::new();
        for (namespace, indexer) in parts {
            if merged.iter().all(|p| p.namespace != namespace) {
                merged.push(Part { namespace, indexer });
            }
        }
        if merged.len() == 1
            && let Some(part) = merged.pop()
        {
            return part.indexer;
        }
        Indexer {
            backing: Backing::Merged(merged.into()),
        }
    }

    /// The parts that may hold an object of `namespace`: the one naming it, else those
    /// naming none.
    fn parts_for<'a>(parts: &'a [Part<K>], namespace: Option<&str>) -> impl Iterator<Item = &'a Indexer<K>> {
        let exact = parts
            .iter()
            .any(|p| p.namespace.is_some() && p.namespace.as_deref() == namespace);
        parts
            .iter()
            .filter(move |p| {
                if exact {
                    p.namespace.as_deref() == namespace
                } else {
                    p.namespace.is_none()
                }
            })
            .map(|p| &p.indexer)
    }

    /// Each part's answer, concatenated.
    fn concat<T>(parts: &[Part<K>], f: impl Fn(&Indexer<K>) -> Vec<T>) -> Vec<T> {
        parts.iter().flat_map(|p| f(&p.indexer)).collect()
    }

    /// Each part's answer to an index query, concatenated; the first error ends it.
    fn concat_index<T>(
        parts: &[Part<K>],
        f: impl Fn(&Indexer<K>) -> Result<Vec<T>, IndexError>,
    ) -> Result<Vec<T>, IndexError> {
        let mut all = Vec::new();
        for part in parts {
            all.extend(f(&part.indexer)?);
        }
        Ok(all)
    }

    /// The object under `key` (`namespace/name`, or `name` for cluster-scoped objects).
    pub fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        match &self.backing {
            Backing::One(store) => store.get(key),
            Backing::Merged(parts) => Self::parts_for(parts, key_namespace(key)).find_map(|p| p.get_by_key(key)),
        }
    }

    /// What the cache holds under `key`: the decoded object, a mark saying the server's
    /// version does not decode (see [`undecodable`](crate::undecodable)), or nothing. Unlike
    /// [`get_by_key`](Self::get_by_key), tells "not found" from "present but undecodable".
    pub fn lookup_by_key(&self, key: &str) -> Lookup<K> {
        match &self.backing {
            Backing::One(store) => store.lookup(key),
            Backing::Merged(parts) => Self::parts_for(parts, key_namespace(key))
                .map(|p| p.lookup_by_key(key))
                .find(|found| !found.is_absent())
                .unwrap_or(Lookup::Absent),
        }
    }

    /// Every key marked undecodable, with why: objects the server has that do not decode.
    pub fn undecodable(&self) -> Vec<(String, Undecodable)> {
        match &self.backing {
            Backing::One(store) => store.undecodable(),
            Backing::Merged(parts) => Self::concat(parts, Indexer::undecodable),
        }
    }

    /// Every key marked undecodable.
    fn undecodable_key_list(&self) -> Vec<String> {
        match &self.backing {
            Backing::One(store) => store.undecodable_keys(),
            Backing::Merged(parts) => Self::concat(parts, Indexer::undecodable_key_list),
        }
    }

    /// The cached object with the same key as `obj`.
    pub fn get(&self, obj: &K) -> Result<Option<Arc<K>>, KeyError> {
        Ok(self.get_by_key(&meta_namespace_key(obj)?))
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        match &self.backing {
            Backing::One(store) => store.list(),
            Backing::Merged(parts) => Self::concat(parts, Indexer::list),
        }
    }

    /// Every key.
    pub fn list_keys(&self) -> Vec<String> {
        match &self.backing {
            Backing::One(store) => store.list_keys(),
            Backing::Merged(parts) => Self::concat(parts, Indexer::list_keys),
        }
    }

    /// The number of cached objects.
    pub fn len(&self) -> usize {
        match &self.backing {
            Backing::One(store) => store.len(),
            Backing::Merged(parts) => parts.iter().map(|p| p.indexer.len()).sum(),
        }
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        match &self.backing {
            Backing::One(store) => store.is_empty(),
            Backing::Merged(parts) => parts.iter().all(|p| p.indexer.is_empty()),
        }
    }

    /// Objects sharing an index value with `obj` under `index_name`.
    pub fn index(&self, index_name: &str, obj: &K) -> Result<Vec<Arc<K>>, IndexError> {
        match &self.backing {
            Backing::One(store) => store.index(index_name, obj),
            Backing::Merged(parts) => Self::concat_index(parts, |p| p.index(index_name, obj)),
        }
    }

    /// Objects indexed under `value` by `index_name`.
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<K>>, IndexError> {
        match &self.backing {
            Backing::One(store) => store.by_index(index_name, value),
            Backing::Merged(parts) => Self::concat_index(parts, |p| p.by_index(index_name, value)),
        }
    }

    /// Keys of objects indexed under `value` by `index_name`.
    pub fn index_keys(&self, index_name: &str, value: &str) -> Result<Vec<String>, IndexError> {
        match &self.backing {
            Backing::One(store) => store.index_keys(index_name, value),
            Backing::Merged(parts) => Self::concat_index(parts, |p| p.index_keys(index_name, value)),
        }
    }

    /// Every value `index_name` currently holds.
    pub fn list_index_func_values(&self, index_name: &str) -> Vec<String> {
        match &self.backing {
            Backing::One(store) => store.list_index_func_values(index_name),
            Backing::Merged(parts) => {
                let values: std::collections::BTreeSet<String> =
                    Self::concat(parts, |p| p.list_index_func_values(index_name))
                        .into_iter()
                        .collect();
                values.into_iter().collect()
            }
        }
    }

    /// Registers more index functions; objects already cached are indexed at once.
    pub fn add_indexers(&self, indexers: Indexers<K>) -> Result<(), IndexError> {
        match &self.backing {
            Backing::One(store) => store.add_indexers(indexers),
            Backing::Merged(parts) => parts.iter().try_for_each(|p| p.indexer.add_indexers(indexers.clone())),
        }
    }

    /// The resourceVersion the cache last saw: of the last object written, the last relist or
    /// the last bookmark (client-go `LastStoreSyncResourceVersion`). Empty until the first.
    /// Unlike the reflector's last-sync resourceVersion, it is only ever one whose changes the
    /// cache already holds.
    ///
    /// A merged view answers the newest of its parts' (resourceVersions compared as numbers,
    /// as the API server issues them; each part's is its own namespace's).
    pub fn last_store_sync_resource_version(&self) -> String {
        match &self.backing {
            Backing::One(store) => store.last_store_sync_resource_version(),
            Backing::Merged(parts) => parts
                .iter()
                .map(|p| p.indexer.last_store_sync_resource_version())
                .max_by_key(|rv| (rv.parse::<u64>().unwrap_or(0), rv.clone()))
                .unwrap_or_default(),
        }
    }

    /// Checks that every index agrees with the objects; for tests.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        match &self.backing {
            Backing::One(store) => store.check_invariants(),
            Backing::Merged(parts) => parts.iter().try_for_each(|p| p.indexer.check_invariants()),
        }
    }
}

/// The share of a relist one part of a merged view holds: its objects and undecodable keys.
type PartOfList<K> = (Vec<Arc<K>>, Vec<(String, Undecodable)>);

/// Records `obj`'s resourceVersion, if it has one, as the store's last seen.
pub(crate) fn record_resource_version<K: Resource>(inner: &mut crate::thread_safe_store::Inner<K>, obj: &K) {
    if let Some(rv) = obj.meta().resource_version.as_deref() {
        inner.set_resource_version(rv);
    }
}

/// Writes record the resourceVersion they carry (an object's, a relist's, a bookmark's) as the
/// store's [`last_store_sync_resource_version`](Indexer::last_store_sync_resource_version), as
/// client-go's `threadSafeMap` does. An add, update or delete drops the key's undecodable mark;
/// a new mark is logged at WARN once per key and resourceVersion.
impl<K: Resource + Send + Sync + 'static> Store<K> for Indexer<K> {
    fn add(&self, obj: Arc<K>) -> Result<(), StoreError> {
        let key = meta_namespace_key(obj.as_ref())?;
        let mut inner = match &self.backing {
            Backing::One(store) => store.writer(),
            Backing::Merged(_) => return self.part_of(obj.as_ref())?.add(obj),
        };
        record_resource_version(&mut inner, obj.as_ref());
        inner.unmark(&key);
        inner.insert(key, obj);
        Ok(())
    }

    fn update(&self, obj: Arc<K>) -> Result<(), StoreError> {
        self.add(obj)
    }

    fn delete(&self, obj: Arc<K>) -> Result<(), StoreError> {
        let key = meta_namespace_key(obj.as_ref())?;
        let mut inner = match &self.backing {
            Backing::One(store) => store.writer(),
            Backing::Merged(_) => return self.part_of(obj.as_ref())?.delete(obj),
        };
        record_resource_version(&mut inner, obj.as_ref());
        inner.unmark(&key);
        inner.remove(&key);
        Ok(())
    }

    fn replace(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), StoreError> {
        self.replace_with_undecodable(list, Vec::new(), resource_version)
    }

    /// A merged view replaces every part, each with the listed objects and marks of its
    /// namespace. An undecodable key keeps the decoded version cached under it, if any.
    fn replace_with_undecodable(
        &self,
        list: Vec<Arc<K>>,
        undecodable: Vec<(String, Undecodable)>,
        resource_version: &str,
    ) -> Result<(), StoreError> {
        let store = match &self.backing {
            Backing::One(store) => store,
            Backing::Merged(parts) => {
                let mut split: Vec<PartOfList<K>> = parts.iter().map(|_| (Vec::new(), Vec::new())).collect();
                for obj in list {
                    let part = self.part_of(obj.as_ref())?;
                    if let Some(i) = parts.iter().position(|p| p.indexer.same_cache(part)) {
                        split[i].0.push(obj);
                    }
                }
                for (key, u) in undecodable {
                    let part = self.part_of_key(&key)?;
                    if let Some(i) = parts.iter().position(|p| p.indexer.same_cache(part)) {
                        split[i].1.push((key, u));
                    }
                }
                for (part, (list, undecodable)) in parts.iter().zip(split) {
                    part.indexer
                        .replace_with_undecodable(list, undecodable, resource_version)?;
                }
                return Ok(());
            }
        };
        let mut items = Items::with_capacity_and_hasher(list.len(), FastHash::default());
        for obj in list {
            items.insert(meta_namespace_key(obj.as_ref())?, obj);
        }
        let mut inner = store.writer();
        // Built off the write lock; only the swap holds readers (see `thread_safe_store`).
        inner.replace_off_lock(|current| {
            for (key, _) in &undecodable {
                if !items.contains_key(key)
                    && let Some(last_decoded) = current.get(key)
                {
                    items.insert(key.clone(), last_decoded.clone());
                }
            }
            (current.replacement(items, None), ())
        });
        let new_marks = inner.set_marks(undecodable.into_iter().collect());
        inner.set_resource_version(resource_version);
        drop(inner);
        for (key, u) in &new_marks {
            warn_marked("", &type_name::<K>(), key, u);
        }
        Ok(())
    }

    fn mark_undecodable(&self, key: String, undecodable: Undecodable) -> Result<(), StoreError> {
        let mut inner = match &self.backing {
            Backing::One(store) => store.writer(),
            Backing::Merged(_) => return self.part_of_key(&key)?.mark_undecodable(key, undecodable),
        };
        if !undecodable.resource_version.is_empty() {
            inner.set_resource_version(&undecodable.resource_version);
        }
        let log = inner.mark(key.clone(), undecodable.clone());
        drop(inner);
        if log {
            warn_marked("", &type_name::<K>(), &key, &undecodable);
        }
        Ok(())
    }

    fn delete_undecodable(&self, key: String, resource_version: &str) -> Result<(), StoreError> {
        let mut inner = match &self.backing {
            Backing::One(store) => store.writer(),
            Backing::Merged(_) => return self.part_of_key(&key)?.delete_undecodable(key, resource_version),
        };
        if !resource_version.is_empty() {
            inner.set_resource_version(resource_version);
        }
        inner.unmark(&key);
        inner.remove(&key);
        Ok(())
    }

    fn resync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn bookmark(&self, resource_version: &str) -> Result<(), StoreError> {
        match &self.backing {
            Backing::One(store) => store.set_resource_version(resource_version),
            Backing::Merged(parts) => {
                for part in parts.iter() {
                    part.indexer.bookmark(resource_version)?;
                }
            }
        }
        Ok(())
    }
}

impl<K: Resource + Send + Sync + 'static> KnownObjects<K> for Indexer<K> {
    fn list_keys(&self) -> Vec<String> {
        Indexer::list_keys(self)
    }

    fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        Indexer::get_by_key(self, key)
    }

    fn undecodable_keys(&self) -> Vec<String> {
        self.undecodable_key_list()
    }
}

impl<K: Resource + 'static> Indexer<K> {
    /// The part of a merged view holding `obj`'s namespace (`self` for one store).
    fn part_of(&self, obj: &K) -> Result<&Indexer<K>, StoreError> {
        let Backing::Merged(parts) = &self.backing else {
            return Ok(self);
        };
        let namespace = obj.meta().namespace.as_deref().filter(|ns| !ns.is_empty());
        Self::parts_for(parts, namespace)
            .next()
            .ok_or_else(|| StoreError::NamespaceNotHeld {
                namespace: namespace.unwrap_or_default().to_owned(),
            })
    }

    /// The part of a merged view holding the namespace of `key` (`self` for one store).
    fn part_of_key(&self, key: &str) -> Result<&Indexer<K>, StoreError> {
        let Backing::Merged(parts) = &self.backing else {
            return Ok(self);
        };
        let namespace = key_namespace(key);
        Self::parts_for(parts, namespace)
            .next()
            .ok_or_else(|| StoreError::NamespaceNotHeld {
                namespace: namespace.unwrap_or_default().to_owned(),
            })
    }

    /// Whether both are the same cache (clones of one another).
    fn same_cache(&self, other: &Indexer<K>) -> bool {
        match (&self.backing, &other.backing) {
            (Backing::One(a), Backing::One(b)) => Arc::ptr_eq(a, b),
            (Backing::Merged(a), Backing::Merged(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}
