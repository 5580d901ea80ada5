//! Named index functions (client-go `index.go`).
//!
//! An [`IndexFunc`] maps an object to the values it is indexed under; [`Indexers`] names them.
//! The store keeps, per index name, a map from each value to the set of object keys that
//! produce it, so `by_index("namespace", "prod")` is a hash lookup instead of a scan.

use std::collections::HashMap;
use std::sync::Arc;

use kube::Resource;

/// The name of the built-in namespace index, as in client-go (`cache.NamespaceIndex`).
pub const NAMESPACE_INDEX: &str = "namespace";

/// Computes the values an object is indexed under. Returning no values leaves the object out
/// of that index; several values put it under each of them.
pub type IndexFunc<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// Index functions by index name (client-go `cache.Indexers`).
pub type Indexers<K> = HashMap<String, IndexFunc<K>>;

/// The namespace index function (client-go `MetaNamespaceIndexFunc`): an object is indexed
/// under its namespace; cluster-scoped objects are indexed under `""`.
pub fn meta_namespace_index_func<K: Resource>(obj: &K) -> Vec<String> {
    vec![obj.meta().namespace.clone().unwrap_or_default()]
}

/// One value of an index that has exactly one per object, borrowed from the object: the
/// cache compares an update's old and new values with it instead of calling the index function
/// (which allocates its values) on both.
pub(crate) type BorrowedIndexValue<K> = fn(&K) -> &str;

/// [`meta_namespace_index_func`]'s one value, borrowed: the namespace, `""` for none.
pub(crate) fn meta_namespace_index_value<K: Resource>(obj: &K) -> &str {
    obj.meta().namespace.as_deref().unwrap_or_default()
}

/// Indexers holding only the namespace index, which every informer has.
pub fn namespace_indexers<K: Resource + 'static>() -> Indexers<K> {
    let mut indexers: Indexers<K> = HashMap::new();
    indexers.insert(NAMESPACE_INDEX.to_string(), Arc::new(meta_namespace_index_func::<K>));
    indexers
}
