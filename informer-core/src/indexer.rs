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

use std::collections::HashMap;
use std::sync::Arc;

use kube::Resource;

use crate::index::{Indexers, namespace_indexers};
use crate::store::{KeyError, KnownObjects, Store, StoreError, meta_namespace_key};
use crate::thread_safe_store::{IndexError, ThreadSafeStore};

/// A thread-safe cache of objects with named indexes. The namespace index is always present.
pub struct Indexer<K> {
    store: Arc<ThreadSafeStore<K>>,
}

impl<K> Clone for Indexer<K> {
    fn clone(&self) -> Self {
        Indexer {
            store: self.store.clone(),
        }
    }
}

impl<K: Resource + 'static> Default for Indexer<K> {
    fn default() -> Self {
        Self::new(Indexers::new())
    }
}

impl<K: Resource + 'static> Indexer<K> {
    /// An empty cache with the namespace index and `indexers`.
    pub fn new(indexers: Indexers<K>) -> Self {
        let mut all = namespace_indexers::<K>();
        all.extend(indexers);
        Indexer {
            store: Arc::new(ThreadSafeStore::new(all)),
        }
    }

    /// The object under `key` (`namespace/name`, or `name` for cluster-scoped objects).
    pub fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        self.store.get(key)
    }

    /// The cached object with the same key as `obj`.
    pub fn get(&self, obj: &K) -> Result<Option<Arc<K>>, KeyError> {
        Ok(self.store.get(&meta_namespace_key(obj)?))
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.store.list()
    }

    /// Every key.
    pub fn list_keys(&self) -> Vec<String> {
        self.store.list_keys()
    }

    /// The number of cached objects.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Objects sharing an index value with `obj` under `index_name`.
    pub fn index(&self, index_name: &str, obj: &K) -> Result<Vec<Arc<K>>, IndexError> {
        self.store.index(index_name, obj)
    }

    /// Objects indexed under `value` by `index_name`.
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<K>>, IndexError> {
        self.store.by_index(index_name, value)
    }

    /// Keys of objects indexed under `value` by `index_name`.
    pub fn index_keys(&self, index_name: &str, value: &str) -> Result<Vec<String>, IndexError> {
        self.store.index_keys(index_name, value)
    }

    /// Every value `index_name` currently holds.
    pub fn list_index_func_values(&self, index_name: &str) -> Vec<String> {
        self.store.list_index_func_values(index_name)
    }

    /// Registers more index functions; objects already cached are indexed at once.
    pub fn add_indexers(&self, indexers: Indexers<K>) -> Result<(), IndexError> {
        self.store.add_indexers(indexers)
    }

    /// The resourceVersion the cache last saw: of the last object written, the last relist or
    /// the last bookmark (client-go `LastStoreSyncResourceVersion`). Empty until the first.
    /// Unlike the reflector's last-sync resourceVersion, it is only ever one whose changes the
    /// cache already holds.
    pub fn last_store_sync_resource_version(&self) -> String {
        self.store.last_store_sync_resource_version()
    }

    /// Checks that every index agrees with the objects; for tests.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.store.check_invariants()
    }
}

/// Records `obj`'s resourceVersion, if it has one, as the store's last seen.
pub(crate) fn record_resource_version<K: Resource>(inner: &mut crate::thread_safe_store::Inner<K>, obj: &K) {
    if let Some(rv) = obj.meta().resource_version.as_deref() {
        inner.set_resource_version(rv);
    }
}

/// Writes record the resourceVersion they carry (an object's, a relist's, a bookmark's) as the
/// store's [`last_store_sync_resource_version`](Indexer::last_store_sync_resource_version), as
/// client-go's `threadSafeMap` does.
impl<K: Resource + Send + Sync + 'static> Store<K> for Indexer<K> {
    fn add(&self, obj: Arc<K>) -> Result<(), StoreError> {
        let key = meta_namespace_key(obj.as_ref())?;
        let mut inner = self.store.writer();
        record_resource_version(&mut inner, obj.as_ref());
        inner.insert(key, obj);
        Ok(())
    }

    fn update(&self, obj: Arc<K>) -> Result<(), StoreError> {
        self.add(obj)
    }

    fn delete(&self, obj: Arc<K>) -> Result<(), StoreError> {
        let key = meta_namespace_key(obj.as_ref())?;
        let mut inner = self.store.writer();
        record_resource_version(&mut inner, obj.as_ref());
        inner.remove(&key);
        Ok(())
    }

    fn replace(&self, list: Vec<Arc<K>>, resource_version: &str) -> Result<(), StoreError> {
        let mut items = HashMap::with_capacity(list.len());
        for obj in list {
            items.insert(meta_namespace_key(obj.as_ref())?, obj);
        }
        let mut inner = self.store.writer();
        inner.replace(items);
        inner.set_resource_version(resource_version);
        Ok(())
    }

    fn resync(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn bookmark(&self, resource_version: &str) -> Result<(), StoreError> {
        self.store.set_resource_version(resource_version);
        Ok(())
    }
}

impl<K: Resource + Send + Sync + 'static> KnownObjects<K> for Indexer<K> {
    fn list_keys(&self) -> Vec<String> {
        self.store.list_keys()
    }

    fn get_by_key(&self, key: &str) -> Option<Arc<K>> {
        self.store.get(key)
    }
}

impl<K: Resource + Send + Sync + 'static> Indexer<K> {
    /// The write lock over objects and indexes, for applying a batch of changes at once.
    pub(crate) fn writer(&self) -> std::sync::RwLockWriteGuard<'_, crate::thread_safe_store::Inner<K>> {
        self.store.writer()
    }
}
