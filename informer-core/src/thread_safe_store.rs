//! The thread-safe map behind every informer cache (client-go `thread_safe_store.go`).
//!
//! It sits at the end of the write path (reflector → queue → the informer's `process_batch`
//! → here) and at the start of the read path (listers, `Context::get`, handlers' lookups).
//!
//! One `RwLock` guards the objects and their indexes together, so a reader never sees an
//! object without its index entries or the other way round. Index maintenance happens only
//! through [`Inner`]'s methods, which can only be reached through the lock.
//!
//! Beside the objects, the same lock guards the keys marked *undecodable*: objects the server
//! has that do not decode as `K` (see [`undecodable`](crate::undecodable)). A marked key may
//! also hold a decoded object (its last version that decoded), or none.
//!
//! # Relists without stalling readers
//!
//! Writers and readers are kept apart by two locks. Every writer first takes `writers`, a
//! mutex held for the whole of its change (a [`Writer`]); the `RwLock` is write-locked only
//! while readers must not look. A relist (a replace of the whole content) is built *off* the
//! write lock: with `writers` held, the write lock is released, the new object map and every
//! index are built from the list under a read lock (readers go on reading the old content
//! meanwhile; the writer reads it too, to diff it), and the write lock is taken again only to
//! swap the new map and indexes in, which is O(number of indexes). The old map and indexes (a
//! key and an `Arc` per object) are dropped after the write lock is released. This is
//! kube-runtime's `reflector::store` design (build the new state, then swap), kept with
//! client-go's indexes and a single store that watch events update in place, with one
//! difference: kube-runtime 5.0 frees its old map while it still holds its write lock (the
//! `InitDone` arm of `Writer::apply_watcher_event`), so its readers wait for that free, which
//! at 100k objects takes hundreds of milliseconds (`bench/examples/bench-readers.rs`).
//!
//! What a reader sees: the old content whole, then the new content whole, never a mix (the
//! swap is one step under the write lock; `a_reader_never_sees_half_of_a_relist` in
//! `shared_informer.rs` pins it). A reader that asks during the build is answered at once
//! from the old content; it waits only for the swap. Changes applied under the same
//! [`Writer`] before the relist (earlier items of the informer's batch) become visible when
//! the build starts; each such change is a state the server had, so nothing inconsistent shows.
//!
//! What happens to writes that race a relist: none do. Any other write (a watch event of the
//! next batch, `Store::add` on an `Indexer`, `add_indexers`) waits on `writers` until the relist
//! is swapped in, then applies on top of it, in the order the writers took the mutex. The
//! content the relist was diffed against is therefore the content it replaces, which the
//! informer's notifications rely on (a tombstone for every cached key the list lacks, an
//! update with the right old object for every listed one). This is the ordering client-go's
//! single `processDeltas` goroutine gives; no write is merged into a half-built map.
//!
//! ```
//! use std::sync::Arc;
//! use informer_core::{Indexer, Store};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! let cache: Indexer<ConfigMap> = Indexer::default();
//! let mut old = ConfigMap::default();
//! old.metadata.name = Some("old".into());
//! cache.add(Arc::new(old)).unwrap();
//! let mut new = ConfigMap::default();
//! new.metadata.name = Some("new".into());
//! // Built off the write lock, swapped in at once: readers see "old" or "new", never both.
//! cache.replace(vec![Arc::new(new)], "7").unwrap();
//! assert_eq!(cache.list_keys(), ["new"]);
//! ```

use std::collections::{HashMap, HashSet};
use std::ops::{Deref, DerefMut};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::index::{BorrowedIndexValue, IndexFunc, Indexers};
use crate::undecodable::{Lookup, Undecodable};

/// Errors from index queries and index registration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// No index function is registered under this name.
    #[error("index {0:?} does not exist")]
    NoSuchIndex(String),
    /// `add_indexers` was given a name that is already registered.
    #[error("indexer conflict: {0:?} is already registered")]
    Conflict(String),
}

/// The hasher of the objects' and indexes' maps: foldhash, which hashes a short key several
/// times faster than std's SipHash (every watch event looks its key up). It is not built to
/// resist HashDoS as SipHash is; it need not be here: keys and index values come from the API
/// server, a trusted peer (names and namespaces it validated), through index functions the
/// program registered.
pub(crate) type FastHash = foldhash::fast::RandomState;
/// Key → object: the objects of a store.
pub(crate) type Items<K> = HashMap<String, Arc<K>, FastHash>;
/// A set of keys of objects that share an index value.
type KeySet = HashSet<String, FastHash>;
/// Index value → keys, for one index.
type Index = HashMap<String, KeySet, FastHash>;

/// A thread-safe map from keys to `Arc<K>`, with named indexes kept in step with it.
pub struct ThreadSafeStore<K> {
    /// Held by every writer for the whole of its change, so that a relist can read the
    /// content it replaces with only a read lock (see the module doc).
    writers: Mutex<()>,
    inner: RwLock<Inner<K>>,
}

/// The write side of a [`ThreadSafeStore`]: the writers' mutex and the write lock, taken by
/// [`ThreadSafeStore::writer`]. Derefs to [`Inner`], whose methods make the changes; readers
/// see them once it is dropped (or when [`off_lock`](Writer::off_lock) releases the write lock).
pub(crate) struct Writer<'a, K> {
    store: &'a ThreadSafeStore<K>,
    /// The write lock; `None` only inside [`off_lock`](Writer::off_lock), which restores it
    /// before it returns or unwinds, so it is `Some` whenever anything else can see `self`.
    guard: Option<RwLockWriteGuard<'a, Inner<K>>>,
    /// Replaced content, dropped once the write lock is released.
    garbage: Vec<Content<K>>,
    _writers: MutexGuard<'a, ()>,
}

/// A whole content of the store: objects and the index of every index function. What a relist
/// swaps in ([`Inner::replacement`]) and what it swaps out (dropped off the write lock).
pub(crate) struct Content<K> {
    items: Items<K>,
    indices: Vec<(String, Index)>,
}

/// An index function as the store holds it.
struct IndexFn<K> {
    func: IndexFunc<K>,
    /// For an index with exactly one value per object, that value borrowed from the object
    /// (the built-in namespace index, see [`ThreadSafeStore::with_borrowed_index_value`]): an
    /// update that keeps it is told without calling `func`, which allocates, twice.
    borrowed: Option<BorrowedIndexValue<K>>,
}

/// One index whose values change with a write: its name, the old values and the new ones.
type IndexUpdate<'a> = (&'a str, Vec<String>, Vec<String>);

/// The state under the lock.
///
/// Invariants: for every index name in `indexers` there is an entry in `indices`; a key is in
/// `indices[name][value]` exactly when `items[key]` exists and `indexers[name](items[key])`
/// contains `value`; no value maps to an empty set; an index function with a borrowed value
/// returns exactly that one value for every object. `undecodable` is independent of `items`:
/// a marked key may or may not hold a decoded object, and marks are never indexed.
pub(crate) struct Inner<K> {
    items: Items<K>,
    /// Keys whose current version on the server does not decode.
    undecodable: HashMap<String, Undecodable>,
    indexers: HashMap<String, IndexFn<K>>,
    indices: HashMap<String, Index>,
    /// The resourceVersion of the last change or relist applied, or of the last bookmark
    /// (client-go `LastStoreSyncResourceVersion`); empty until the first one.
    resource_version: String,
}

impl<K> ThreadSafeStore<K> {
    /// An empty store with the given index functions.
    pub fn new(indexers: Indexers<K>) -> Self {
        let indices = indexers.keys().map(|name| (name.clone(), Index::default())).collect();
        let indexers = indexers
            .into_iter()
            .map(|(name, func)| (name, IndexFn { func, borrowed: None }))
            .collect();
        ThreadSafeStore {
            writers: Mutex::new(()),
            inner: RwLock::new(Inner {
                items: Items::default(),
                undecodable: HashMap::new(),
                indexers,
                indices,
                resource_version: String::new(),
            }),
        }
    }

    /// Declares that index `name`'s function returns exactly one value for every object,
    /// `value(obj)` (borrowed): an update whose old and new objects give the same value then
    /// costs that index nothing, where the function (which allocates its values) would be
    /// called on both. The caller vouches for the two agreeing (`check_invariants` checks it).
    /// No index `name`: nothing changes.
    pub(crate) fn with_borrowed_index_value(mut self, name: &str, value: BorrowedIndexValue<K>) -> Self {
        let inner = self.inner.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(index_fn) = inner.indexers.get_mut(name) {
            index_fn.borrowed = Some(value);
        }
        self
    }

    // A panic while holding the lock cannot leave `Inner` half-updated in a way later readers
    // could not cope with (every method restores the invariants before returning or panics in
    // user index code before touching state), so a poisoned lock is taken over, not propagated.
    fn read(&self) -> RwLockReadGuard<'_, Inner<K>> {
        self.inner.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, Inner<K>> {
        self.inner.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the writers' mutex, then the write lock.
    fn write(&self) -> Writer<'_, K> {
        let writers = self.writers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Writer {
            store: self,
            guard: Some(self.write_lock()),
            garbage: Vec::new(),
            _writers: writers,
        }
    }

    /// Inserts or replaces the object under `key`, updating every index.
    pub fn insert(&self, key: String, obj: Arc<K>) {
        self.write().insert(key, obj);
    }

    /// Removes the object under `key`, if any, with its index entries.
    pub fn remove(&self, key: &str) -> Option<Arc<K>> {
        self.write().remove(key)
    }

    /// The object under `key`.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.read().items.get(key).cloned()
    }

    /// Every object, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.read().items.values().cloned().collect()
    }

    /// Every key, in no particular order.
    pub fn list_keys(&self) -> Vec<String> {
        self.read().items.keys().cloned().collect()
    }

    /// The number of objects.
    pub fn len(&self) -> usize {
        self.read().items.len()
    }

    /// Whether the store holds no objects.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Swaps the whole content for `items` atomically and rebuilds every index; no key is
    /// marked undecodable afterwards. The new indexes are built, and the old content dropped,
    /// without holding readers (see the module doc).
    pub fn replace(&self, items: HashMap<String, Arc<K>>) {
        let items: Items<K> = items.into_iter().collect();
        let mut inner = self.write();
        inner.replace_off_lock(|current| (current.replacement(items, None), ()));
        inner.set_marks(HashMap::new());
    }

    /// What the store holds under `key`: the object, a mark saying the server's version does
    /// not decode (with the last decoded version, if any), or nothing.
    pub fn lookup(&self, key: &str) -> Lookup<K> {
        self.read().lookup(key)
    }

    /// Every key marked undecodable, with why, in no particular order.
    pub fn undecodable(&self) -> Vec<(String, Undecodable)> {
        self.read()
            .undecodable
            .iter()
            .map(|(key, u)| (key.clone(), u.clone()))
            .collect()
    }

    /// Every key marked undecodable, in no particular order.
    pub fn undecodable_keys(&self) -> Vec<String> {
        self.read().undecodable.keys().cloned().collect()
    }

    /// The resourceVersion the store last saw: from the last object written with one, the last
    /// relist, or the last bookmark (client-go `LastStoreSyncResourceVersion`). Empty at first.
    pub fn last_store_sync_resource_version(&self) -> String {
        self.read().resource_version.clone()
    }

    /// Records `resource_version` as the last one seen (client-go `Bookmark`).
    pub fn set_resource_version(&self, resource_version: &str) {
        self.write().set_resource_version(resource_version);
    }

    /// Takes the write side for a batch of changes: readers see all of them or none, except
    /// that a relist in the batch ([`Writer::replace_off_lock`]) shows what came before it.
    pub(crate) fn writer(&self) -> Writer<'_, K> {
        self.write()
    }

    /// Objects that share an index value with `obj` under index `index_name`
    /// (client-go `Index`): the union over every value `obj` produces.
    pub fn index(&self, index_name: &str, obj: &K) -> Result<Vec<Arc<K>>, IndexError> {
        let inner = self.read();
        let func = inner.index_func(index_name)?;
        let index = inner.index(index_name)?;
        let mut keys = KeySet::default();
        for value in func(obj) {
            if let Some(set) = index.get(&value) {
                keys.extend(set.iter().cloned());
            }
        }
        Ok(keys.iter().filter_map(|k| inner.items.get(k).cloned()).collect())
    }

    /// Objects whose index function `index_name` produces `value` (client-go `ByIndex`).
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<K>>, IndexError> {
        let inner = self.read();
        let index = inner.index(index_name)?;
        Ok(index
            .get(value)
            .map(|set| set.iter().filter_map(|k| inner.items.get(k).cloned()).collect())
            .unwrap_or_default())
    }

    /// Keys of objects whose index function `index_name` produces `value` (client-go `IndexKeys`).
    pub fn index_keys(&self, index_name: &str, value: &str) -> Result<Vec<String>, IndexError> {
        let inner = self.read();
        let index = inner.index(index_name)?;
        Ok(index
            .get(value)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default())
    }

    /// Every value index `index_name` currently holds (client-go `ListIndexFuncValues`).
    pub fn list_index_func_values(&self, index_name: &str) -> Vec<String> {
        self.read()
            .indices
            .get(index_name)
            .map(|index| index.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The names of the registered indexes.
    pub fn index_names(&self) -> Vec<String> {
        self.read().indexers.keys().cloned().collect()
    }

    /// Registers more index functions and indexes the objects already stored under them
    /// (client-go `AddIndexers`). Fails without changing anything if a name is taken.
    pub fn add_indexers(&self, new_indexers: Indexers<K>) -> Result<(), IndexError> {
        let mut inner = self.write();
        if let Some(name) = new_indexers.keys().find(|n| inner.indexers.contains_key(*n)) {
            return Err(IndexError::Conflict(name.clone()));
        }
        for (name, func) in new_indexers {
            let index = build_index(inner.items.iter(), &func);
            inner.indices.insert(name.clone(), index);
            inner.indexers.insert(name, IndexFn { func, borrowed: None });
        }
        Ok(())
    }

    /// Checks the invariants documented on the store's state; for tests.
    #[cfg(any(test, feature = "test-util"))]
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let inner = self.read();
        for (name, index_fn) in &inner.indexers {
            let expected = build_index(inner.items.iter(), &index_fn.func);
            let actual = inner.indices.get(name).ok_or_else(|| format!("index {name} missing"))?;
            if &expected != actual {
                return Err(format!("index {name} is {actual:?}, expected {expected:?}"));
            }
            if let Some(value) = index_fn.borrowed {
                for (key, obj) in &inner.items {
                    let values = (index_fn.func)(obj);
                    if values != [value(obj)] {
                        return Err(format!(
                            "index {name}: {key} has values {values:?}, its borrowed value is {:?}",
                            value(obj)
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

impl<K> Writer<'_, K> {
    /// Runs `read` on the current content with the write lock released and the writers' mutex
    /// still held: readers go on meanwhile, and nothing changes the content under `read`. The
    /// write lock is taken again before this returns, or before a panic in `read` goes on.
    pub(crate) fn off_lock<R>(&mut self, read: impl FnOnce(&Inner<K>) -> R) -> R {
        drop(self.guard.take());
        let result = {
            let current = self.store.read();
            catch_unwind(AssertUnwindSafe(|| read(&current)))
        };
        self.guard = Some(self.store.write_lock());
        result.unwrap_or_else(|panic| resume_unwind(panic))
    }

    /// Replaces the whole content with the one `prepare` builds from the current content (with
    /// [`Inner::replacement`]) off the write lock, and returns `prepare`'s other output. Under
    /// the write lock only the swap happens; the old content is dropped after the lock is
    /// released. A panic in `prepare` (an index function) changes nothing.
    pub(crate) fn replace_off_lock<R>(&mut self, prepare: impl FnOnce(&Inner<K>) -> (Content<K>, R)) -> R {
        let (replacement, output) = self.off_lock(prepare);
        let old = self.swap_in(replacement);
        self.garbage.push(old);
        output
    }
}

impl<K> Deref for Writer<'_, K> {
    type Target = Inner<K>;

    fn deref(&self) -> &Inner<K> {
        match &self.guard {
            Some(guard) => guard,
            None => unreachable!("the write lock is held outside Writer::off_lock"),
        }
    }
}

impl<K> DerefMut for Writer<'_, K> {
    fn deref_mut(&mut self) -> &mut Inner<K> {
        match &mut self.guard {
            Some(guard) => guard,
            None => unreachable!("the write lock is held outside Writer::off_lock"),
        }
    }
}

impl<K> Drop for Writer<'_, K> {
    /// Releases the write lock first, then drops replaced content: freeing a relist's old map
    /// (a key and an `Arc` per object) never holds readers.
    fn drop(&mut self) {
        drop(self.guard.take());
        self.garbage.clear();
    }
}

fn build_index<'a, K: 'a>(items: impl Iterator<Item = (&'a String, &'a Arc<K>)>, func: &IndexFunc<K>) -> Index {
    let mut index = Index::default();
    for (key, obj) in items {
        for value in func(obj) {
            index.entry(value).or_default().insert(key.clone());
        }
    }
    index
}

impl<K> Inner<K> {
    fn index_func(&self, name: &str) -> Result<&IndexFunc<K>, IndexError> {
        self.indexers
            .get(name)
            .map(|index_fn| &index_fn.func)
            .ok_or_else(|| IndexError::NoSuchIndex(name.to_string()))
    }

    fn index(&self, name: &str) -> Result<&Index, IndexError> {
        self.indices
            .get(name)
            .ok_or_else(|| IndexError::NoSuchIndex(name.to_string()))
    }

    /// The object under `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&Arc<K>> {
        self.items.get(key)
    }

    /// See [`ThreadSafeStore::lookup`].
    pub(crate) fn lookup(&self, key: &str) -> Lookup<K> {
        match (self.undecodable.get(key), self.items.get(key)) {
            (Some(undecodable), last_decoded) => Lookup::Undecodable {
                undecodable: undecodable.clone(),
                last_decoded: last_decoded.cloned(),
            },
            (None, Some(obj)) => Lookup::Found(obj.clone()),
            (None, None) => Lookup::Absent,
        }
    }

    /// Marks `key` undecodable; the object under it, if any, stays. `true` when the mark is
    /// new: the key was not marked, or at another resourceVersion (the caller logs those once).
    pub(crate) fn mark(&mut self, key: String, undecodable: Undecodable) -> bool {
        let new = self
            .undecodable
            .get(&key)
            .is_none_or(|old| old.resource_version != undecodable.resource_version);
        self.undecodable.insert(key, undecodable);
        new
    }

    /// Drops the mark of `key`, if any (a decodable version, or a delete, arrived).
    pub(crate) fn unmark(&mut self, key: &str) {
        if !self.undecodable.is_empty() {
            self.undecodable.remove(key);
        }
    }

    /// Makes `marks` the whole set of marks (after a relist); returns the marks that are new
    /// (see [`mark`](Self::mark)).
    pub(crate) fn set_marks(&mut self, marks: HashMap<String, Undecodable>) -> Vec<(String, Undecodable)> {
        let new = marks
            .iter()
            .filter(|(key, u)| {
                self.undecodable
                    .get(*key)
                    .is_none_or(|old| old.resource_version != u.resource_version)
            })
            .map(|(key, u)| (key.clone(), u.clone()))
            .collect();
        self.undecodable = marks;
        new
    }

    /// Every object, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<K>> {
        self.items.values()
    }

    /// Every `(key, object)`, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Arc<K>)> {
        self.items.iter()
    }

    pub(crate) fn set_resource_version(&mut self, resource_version: &str) {
        if self.resource_version != resource_version {
            resource_version.clone_into(&mut self.resource_version);
        }
    }

    /// The content of `items` with every index built anew: what
    /// [`Writer::replace_off_lock`] swaps in. Called off the write lock; nothing changes here,
    /// so a panicking index function leaves the store as it was.
    ///
    /// `listed`, when given, holds the same objects as `items` in list order, and the indexes
    /// are built walking it rather than the map: the objects were allocated in list order as
    /// they were decoded, so this reads memory in sequence instead of at random (at 100k
    /// objects, the map walk's cache misses made index building a sixth of a relist's CPU).
    pub(crate) fn replacement(&self, items: Items<K>, listed: Option<&[(String, Arc<K>)]>) -> Content<K> {
        let indices = match listed {
            // A key listed twice: the map holds the last of each, so index from the map.
            Some(listed) if listed.len() == items.len() => self.rebuilt_indexes(|| listed.iter().map(|(k, o)| (k, o))),
            _ => self.rebuilt_indexes(|| items.iter()),
        };
        Content { items, indices }
    }

    /// Every index built anew from `items` (called once per index function).
    fn rebuilt_indexes<'a, I>(&self, items: impl Fn() -> I) -> Vec<(String, Index)>
    where
        K: 'a,
        I: Iterator<Item = (&'a String, &'a Arc<K>)>,
    {
        self.indexers
            .iter()
            .map(|(name, index_fn)| (name.clone(), build_index(items(), &index_fn.func)))
            .collect()
    }

    /// Swaps `content` in and returns the content it replaced: O(number of indexes).
    fn swap_in(&mut self, content: Content<K>) -> Content<K> {
        let Content { items, indices } = content;
        let old_items = std::mem::replace(&mut self.items, items);
        let mut old_indices = Vec::with_capacity(indices.len());
        for (name, index) in indices {
            if let Some(old) = self.indices.insert(name.clone(), index) {
                old_indices.push((name, old));
            }
        }
        Content {
            items: old_items,
            indices: old_indices,
        }
    }

    pub(crate) fn insert(&mut self, key: String, obj: Arc<K>) {
        // Index values are computed before anything changes: an index function that panics
        // (user code) then leaves the store as it was. Nothing reads between the two steps
        // (the caller holds the write lock), so the indexes may move first and the key is
        // then moved into the map, not cloned.
        let Inner {
            items,
            indexers,
            indices,
            ..
        } = self;
        let updates = index_updates(indexers, items.get(&key).map(Arc::as_ref), Some(&obj));
        apply_index_updates(indices, updates, &key);
        items.insert(key, obj);
    }

    /// Inserts or replaces the object under `key`, returning the one it replaced: the hot path
    /// of watch events. The key is looked up once, and allocated only when it is new.
    pub(crate) fn upsert(&mut self, key: &str, obj: Arc<K>) -> Option<Arc<K>> {
        let Inner {
            items,
            indexers,
            indices,
            ..
        } = self;
        match items.get_mut(key) {
            Some(slot) => {
                let updates = index_updates(indexers, Some(slot.as_ref()), Some(&obj));
                apply_index_updates(indices, updates, key);
                Some(std::mem::replace(slot, obj))
            }
            None => {
                let updates = index_updates(indexers, None, Some(&obj));
                apply_index_updates(indices, updates, key);
                items.insert(key.to_string(), obj);
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<Arc<K>> {
        let Inner {
            items,
            indexers,
            indices,
            ..
        } = self;
        let updates = index_updates(indexers, Some(items.get(key)?.as_ref()), None);
        let old = items.remove(key)?;
        apply_index_updates(indices, updates, key);
        Some(old)
    }
}

/// Every index whose values differ between `old` and `new`, with both sets of values. An
/// index with a borrowed value whose old and new values are equal (an update of a namespaced
/// object, for the namespace index) is skipped without calling its function.
fn index_updates<'a, K>(
    indexers: &'a HashMap<String, IndexFn<K>>,
    old: Option<&K>,
    new: Option<&K>,
) -> Vec<IndexUpdate<'a>> {
    let mut updates = Vec::new();
    for (name, index_fn) in indexers {
        if let (Some(value), Some(old), Some(new)) = (index_fn.borrowed, old, new)
            && value(old) == value(new)
        {
            continue;
        }
        let old_values = old.map(|o| (index_fn.func)(o)).unwrap_or_default();
        let new_values = new.map(|n| (index_fn.func)(n)).unwrap_or_default();
        if old_values != new_values {
            updates.push((name.as_str(), old_values, new_values));
        }
    }
    updates
}

/// Moves `key` from each index's old values to its new ones. Sets that become empty are
/// removed so no stale value lingers.
fn apply_index_updates(indices: &mut HashMap<String, Index>, updates: Vec<IndexUpdate<'_>>, key: &str) {
    for (name, old_values, new_values) in updates {
        if !indices.contains_key(name) {
            indices.insert(name.to_string(), Index::default());
        }
        let Some(index) = indices.get_mut(name) else {
            continue;
        };
        for value in &old_values {
            if new_values.contains(value) {
                continue;
            }
            if let Some(set) = index.get_mut(value) {
                set.remove(key);
                if set.is_empty() {
                    index.remove(value);
                }
            }
        }
        for value in new_values {
            // A value it had already holds the key.
            if !old_values.contains(&value) {
                index.entry(value).or_default().insert(key.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::indexer::Indexer;
    use crate::store::Store;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(ns: &str, name: &str, tier: &[&str]) -> Arc<ConfigMap> {
        let labels = tier
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("tier{i}"), t.to_string()))
            .collect();
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    fn by_tier() -> Indexers<ConfigMap> {
        let mut indexers: Indexers<ConfigMap> = HashMap::new();
        indexers.insert(
            "tier".into(),
            Arc::new(|cm: &ConfigMap| cm.metadata.labels.iter().flatten().map(|(_, v)| v.clone()).collect()),
        );
        indexers
    }

    fn names(mut objs: Vec<Arc<ConfigMap>>) -> Vec<String> {
        objs.sort_by_key(|o| o.metadata.name.clone());
        objs.iter().filter_map(|o| o.metadata.name.clone()).collect()
    }

    #[test]
    fn namespace_index_is_built_in_and_by_index_finds_objects() {
        let indexer = Indexer::new(by_tier());
        indexer.add(cm("a", "x", &["web"])).unwrap();
        indexer.add(cm("a", "y", &["db"])).unwrap();
        indexer.add(cm("b", "z", &["web"])).unwrap();
        assert_eq!(
            names(indexer.by_index(crate::NAMESPACE_INDEX, "a").unwrap()),
            ["x", "y"]
        );
        assert_eq!(names(indexer.by_index("tier", "web").unwrap()), ["x", "z"]);
        let mut keys = indexer.index_keys("tier", "web").unwrap();
        keys.sort();
        assert_eq!(keys, ["a/x", "b/z"]);
        let mut values = indexer.list_index_func_values("tier");
        values.sort();
        assert_eq!(values, ["db", "web"]);
        assert_eq!(
            names(indexer.index("tier", &cm("q", "q", &["db", "web"])).unwrap()),
            ["x", "y", "z"]
        );
        assert_eq!(
            indexer.by_index("nope", "x"),
            Err(IndexError::NoSuchIndex("nope".into()))
        );
        indexer.check_invariants().unwrap();
    }

    #[test]
    fn update_moves_index_entries_and_leaves_no_empty_sets() {
        let indexer = Indexer::new(by_tier());
        indexer.add(cm("a", "x", &["web"])).unwrap();
        indexer.update(cm("a", "x", &["db"])).unwrap();
        assert!(indexer.by_index("tier", "web").unwrap().is_empty());
        assert_eq!(
            indexer.list_index_func_values("tier"),
            ["db"],
            "no stale value left behind"
        );
        indexer.delete(cm("a", "x", &["db"])).unwrap();
        assert!(indexer.list_index_func_values("tier").is_empty());
        assert!(indexer.list_index_func_values(crate::NAMESPACE_INDEX).is_empty());
        indexer.check_invariants().unwrap();
    }

    #[test]
    fn an_update_that_keeps_a_borrowed_index_value_does_not_call_the_index_function() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let mut indexers: Indexers<ConfigMap> = HashMap::new();
        indexers.insert(
            "ns".into(),
            Arc::new(move |cm: &ConfigMap| {
                counted.fetch_add(1, SeqCst);
                crate::meta_namespace_index_func(cm)
            }),
        );
        let store = ThreadSafeStore::new(indexers)
            .with_borrowed_index_value("ns", crate::index::meta_namespace_index_value::<ConfigMap>);
        assert!(store.writer().upsert("a/x", cm("a", "x", &[])).is_none());
        assert_eq!(calls.swap(0, SeqCst), 1, "an add indexes the new object");
        assert!(store.writer().upsert("a/x", cm("a", "x", &["web"])).is_some());
        assert_eq!(
            calls.load(SeqCst),
            0,
            "an update in the same namespace costs the index nothing"
        );
        assert_eq!(store.index_keys("ns", "a").unwrap(), ["a/x"]);
        store.check_invariants().unwrap();
        assert!(store.remove("a/x").is_some());
        assert!(store.list_index_func_values("ns").is_empty());
        store.check_invariants().unwrap();
    }

    #[test]
    fn a_namespace_index_of_the_callers_replaces_the_built_in_one() {
        // Indexed by the tier label under the built-in index's name: updates must call it.
        let mut indexers: Indexers<ConfigMap> = HashMap::new();
        indexers.insert(
            crate::NAMESPACE_INDEX.into(),
            Arc::new(|cm: &ConfigMap| cm.metadata.labels.iter().flatten().map(|(_, v)| v.clone()).collect()),
        );
        let indexer = Indexer::new(indexers);
        indexer.add(cm("a", "x", &["web"])).unwrap();
        indexer.update(cm("a", "x", &["db"])).unwrap();
        assert!(indexer.by_index(crate::NAMESPACE_INDEX, "web").unwrap().is_empty());
        assert_eq!(names(indexer.by_index(crate::NAMESPACE_INDEX, "db").unwrap()), ["x"]);
        indexer.check_invariants().unwrap();
    }

    #[test]
    fn add_indexers_indexes_existing_objects_and_rejects_conflicts() {
        let indexer: Indexer<ConfigMap> = Indexer::default();
        indexer.add(cm("a", "x", &["web"])).unwrap();
        indexer.add_indexers(by_tier()).unwrap();
        assert_eq!(names(indexer.by_index("tier", "web").unwrap()), ["x"]);
        assert_eq!(
            indexer.add_indexers(by_tier()),
            Err(IndexError::Conflict("tier".into()))
        );
        indexer.check_invariants().unwrap();
    }

    #[test]
    fn replace_swaps_content_and_rebuilds_indexes() {
        let indexer = Indexer::new(by_tier());
        indexer.add(cm("a", "old", &["web"])).unwrap();
        indexer.replace(vec![cm("b", "new", &["db"])], "9").unwrap();
        assert_eq!(indexer.list_keys(), ["b/new"]);
        assert!(indexer.by_index("tier", "web").unwrap().is_empty());
        assert_eq!(names(indexer.by_index("tier", "db").unwrap()), ["new"]);
        indexer.check_invariants().unwrap();
    }

    /// An index function that, once armed, blocks its first call until released: it holds a
    /// relist in the middle of building its indexes. Waits are bounded, so a store that holds
    /// readers during the build fails the test instead of hanging it.
    #[derive(Clone, Default)]
    struct Gate {
        armed: Arc<std::sync::atomic::AtomicBool>,
        building: Arc<std::sync::atomic::AtomicBool>,
        released: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Gate {
        fn indexers(&self) -> Indexers<ConfigMap> {
            let gate = self.clone();
            let mut indexers: Indexers<ConfigMap> = HashMap::new();
            indexers.insert(
                "gate".into(),
                Arc::new(move |_: &ConfigMap| {
                    use std::sync::atomic::Ordering::SeqCst;
                    if gate.armed.swap(false, SeqCst) {
                        gate.building.store(true, SeqCst);
                        wait_for("the test to release the relist", || gate.released.load(SeqCst));
                    }
                    Vec::new()
                }),
            );
            indexers
        }
    }

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let limit = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !cond() {
            assert!(std::time::Instant::now() < limit, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn readers_are_answered_from_the_old_content_while_a_relist_builds_and_writers_wait() {
        use std::sync::atomic::Ordering::SeqCst;
        let gate = Gate::default();
        let mut indexers = gate.indexers();
        indexers.extend(by_tier());
        let (indexer, store) = Indexer::with_store(indexers);
        indexer.add(cm("a", "old", &["web"])).unwrap();
        gate.armed.store(true, SeqCst);
        let relist = {
            let indexer = indexer.clone();
            std::thread::spawn(move || indexer.replace(vec![cm("a", "new", &["db"])], "9"))
        };
        wait_for("the relist to build its indexes", || gate.building.load(SeqCst));

        // Readers are not held: they get the old content, whole, at once.
        let reader = {
            let indexer = indexer.clone();
            std::thread::spawn(move || {
                (
                    indexer.list_keys(),
                    names(indexer.by_index("tier", "web").unwrap()),
                    indexer.get_by_key("a/new").is_none(),
                )
            })
        };
        wait_for("the reader to be answered during the relist", || reader.is_finished());
        let (keys, web, new_absent) = reader.join().unwrap();
        assert_eq!(keys, ["a/old"]);
        assert_eq!(web, ["old"]);
        assert!(new_absent);
        // Writers are: the relist holds the writers' mutex while it builds.
        assert!(
            store.writers.try_lock().is_err(),
            "a writer could change what the relist diffs"
        );

        gate.released.store(true, SeqCst);
        relist.join().unwrap().unwrap();
        indexer.add(cm("a", "after", &["web"])).unwrap();
        let mut keys = indexer.list_keys();
        keys.sort();
        assert_eq!(
            keys,
            ["a/after", "a/new"],
            "a write after the relist applies on top of it"
        );
        assert_eq!(indexer.last_store_sync_resource_version(), "9");
        indexer.check_invariants().unwrap();
    }

    #[test]
    fn a_panicking_index_function_in_a_relist_changes_nothing_and_leaves_the_store_writable() {
        let indexer = Indexer::new(by_tier());
        indexer.add(cm("a", "old", &["web"])).unwrap();
        indexer
            .add_indexers(HashMap::from([(
                "boom".to_string(),
                Arc::new(|cm: &ConfigMap| {
                    assert!(cm.metadata.name.as_deref() != Some("bad"), "index function panics");
                    Vec::new()
                }) as IndexFunc<ConfigMap>,
            )]))
            .unwrap();
        let replaced =
            std::panic::catch_unwind(AssertUnwindSafe(|| indexer.replace(vec![cm("a", "bad", &["db"])], "9")));
        assert!(replaced.is_err());
        assert_eq!(indexer.list_keys(), ["a/old"]);
        assert_eq!(names(indexer.by_index("tier", "web").unwrap()), ["old"]);
        indexer.add(cm("a", "next", &["db"])).unwrap();
        assert_eq!(names(indexer.by_index("tier", "db").unwrap()), ["next"]);
        indexer.check_invariants().unwrap();
    }

    #[test]
    fn keys_are_namespace_slash_name_or_name() {
        let ns = cm("a", "x", &[]);
        assert_eq!(crate::meta_namespace_key(ns.as_ref()).unwrap(), "a/x");
        let cluster = ConfigMap {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(crate::meta_namespace_key(&cluster).unwrap(), "n");
        assert_eq!(crate::split_meta_namespace_key("a/x"), Some((Some("a"), "x")));
        assert_eq!(crate::split_meta_namespace_key("n"), Some((None, "n")));
        assert_eq!(crate::split_meta_namespace_key("a/b/c"), None);
        assert!(crate::meta_namespace_key(&ConfigMap::default()).is_err());
    }
}
