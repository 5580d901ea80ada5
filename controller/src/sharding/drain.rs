//! The shard's side of a handover: before a worker reconciles a key of a sharded controller,
//! [`ShardGate::admit`] looks at the cached object; a draining one is acknowledged (its shard
//! and drain labels removed) instead of reconciled.
//!
//! Where it sits: in the worker, between taking a key from the queue and calling the
//! reconciler. The queue gives a key to one worker at a time, so when the acknowledgement is
//! written no reconcile of that object runs in this shard, and none runs after it: the key is
//! remembered as handed over, and while its object is absent from this shard's cache (it left
//! the label selector) a retry or a delete notification of it is dropped rather than
//! reconciled as a deletion (the first such drop forgets it, so deleted keys do not pile up).
//! Any other key absent from the cache is reconciled only if the server has no such object and
//! this run had confirmed the key (its deletion), or has it labelled for this shard (a GET): a
//! moved object's children are labelled for the new shard before the object, and their
//! notifications queue its key early; a stray notification of an object deleted after it left
//! this shard is the deletion of the shard that had it.
//!
//! # Trusting the cache after one LIST
//! The cache itself may be behind the moves made before this run joined: its informers listed
//! when the process started, and the sharder may have moved this shard's objects (of a previous
//! incarnation, under its fence) since; their departures may still be on the way. A cached
//! object is reconciled only once the run knows the server had it labelled for this shard at
//! some instant after the run joined (its Lease acquired and seen unfenced): from then on the
//! object leaves this shard only by this shard's own acknowledgement (the sharder never fences
//! a live shard's Lease, and this run began after any fence was lifted), so the fact holds until
//! the key is handed over. Such a key is *confirmed*.
//!
//! One LIST establishes it for every key at once: the first admission of the run lists the
//! metadata of the objects labelled for this shard (`shard.kinformer.io/<ring>=<shard>`, paged,
//! one consistent snapshot at resourceVersion `R`), after the join. Every listed key is
//! confirmed (the server had it labelled for this shard at `R`). A cached object not listed is
//! confirmed by its own resourceVersion if that is newer than `R`: the cache holds it as the
//! server had it after `R`, labelled for this shard (the informer selects on the label). One
//! not listed and not newer than `R` is a copy from before `R` of an object the server did not
//! have labelled for this shard at `R`: moved away (its departure is on the way) or deleted; it
//! is skipped, and if it comes back, its return is a newer copy. So the LIST establishes the
//! same fact a GET of each key would (labelled for this shard at an instant after the join),
//! with one request per page instead of one per object. resourceVersions are compared as
//! numbers (etcd's revisions, as the informers compare them); if one is not a number, a GET of
//! the key confirms it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::OnceCell;
use tracing::{debug, info, warn};

use super::ShardingConfig;
use crate::object_key::ObjectKey;

/// What the worker does with a key.
pub(crate) enum Admit {
    /// Reconcile it as usual.
    Reconcile,
    /// Neither reconcile nor retry it: it was handed over (or is gone).
    Skip,
    /// Try again later, rate-limited: the acknowledgement failed (a conflict: the cache is
    /// behind).
    Retry,
}

/// Reads a primary object's metadata from the shard's cache.
pub(crate) type Lookup = Arc<dyn Fn(&ObjectKey) -> Option<ObjectMeta> + Send + Sync>;

/// The page size of the LIST of the shard's objects at the start of a run.
const LIST_PAGE: u32 = 500;

/// What the LIST at the start of the run found (its keys went to `confirmed`).
struct Listed {
    /// The snapshot's resourceVersion `R`, if it is a number: a cached copy newer than it is
    /// the server's state after `R`.
    resource_version: Option<u64>,
}

/// A sharded controller's drain handling; see the [module docs](self).
pub(crate) struct ShardGate {
    pub(crate) config: ShardingConfig,
    lookup: Lookup,
    client: Client,
    resource: ApiResource,
    namespaced: bool,
    /// Keys acknowledged by this shard whose objects have not come back to it.
    handed_over: Mutex<HashSet<ObjectKey>>,
    /// Keys whose object the server had labelled for this shard since this run joined (and not
    /// handed over since).
    confirmed: Mutex<HashSet<ObjectKey>>,
    /// The LIST of this shard's objects, made by the run's first admission (see the
    /// [module docs](self)).
    listed: OnceCell<Listed>,
}

impl ShardGate {
    pub(crate) fn new(
        config: ShardingConfig,
        lookup: Lookup,
        client: Client,
        resource: ApiResource,
        namespaced: bool,
    ) -> Self {
        ShardGate {
            config,
            lookup,
            client,
            resource,
            namespaced,
            handed_over: Mutex::new(HashSet::new()),
            confirmed: Mutex::new(HashSet::new()),
            listed: OnceCell::new(),
        }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    fn handed_over(&self) -> std::sync::MutexGuard<'_, HashSet<ObjectKey>> {
        self.handed_over.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn confirmed(&self) -> std::sync::MutexGuard<'_, HashSet<ObjectKey>> {
        self.confirmed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn api(&self, key: &ObjectKey) -> Api<DynamicObject> {
        match (&key.namespace, self.namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &self.resource),
            _ => Api::all_with(self.client.clone(), &self.resource),
        }
    }

    /// The run's LIST of this shard's objects, made now if not yet (see the
    /// [module docs](self)): one consistent snapshot, in pages; its keys are confirmed. A failed
    /// LIST is logged and the worker retries the key (the next admission lists again).
    async fn listed(&self, controller: &str) -> Result<&Listed, Admit> {
        self.listed
            .get_or_try_init(|| async {
                let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.resource);
                let mut params = ListParams::default().labels(&self.config.selector()).limit(LIST_PAGE);
                let (mut keys, mut snapshot, mut pages) = (Vec::new(), None, 0_usize);
                loop {
                    let page = api.list_metadata(&params).await?;
                    pages += 1;
                    snapshot = snapshot.or(page.metadata.resource_version);
                    keys.extend(page.items.into_iter().filter_map(|item| {
                        let (namespace, name) = (item.metadata.namespace, item.metadata.name?);
                        Some(match (namespace, self.namespaced) {
                            (Some(namespace), true) => ObjectKey::namespaced(namespace, name),
                            _ => ObjectKey::cluster_scoped(name),
                        })
                    }));
                    match page.metadata.continue_.filter(|token| !token.is_empty()) {
                        Some(token) => params = params.continue_token(&token),
                        None => break,
                    }
                }
                let resource_version = snapshot.as_deref().and_then(|rv| rv.parse::<u64>().ok());
                info!(controller, ring = %self.config.ring, shard = %self.config.shard_id, objects = keys.len(), pages,
                    resource_version = ?snapshot, "listed the shard's objects: the cache is trusted from this snapshot on");
                self.confirmed().extend(keys);
                Ok::<_, kube::Error>(Listed { resource_version })
            })
            .await
            .map_err(|e| {
                warn!(controller, ring = %self.config.ring, shard = %self.config.shard_id, error = %e,
                    "listing the shard's objects failed: retrying");
                Admit::Retry
            })
    }

    /// The shard `meta` is labelled for, if any.
    fn shard_of<'m>(&self, meta: &'m ObjectMeta) -> Option<&'m String> {
        meta.labels.as_ref()?.get(&self.config.shard_label())
    }

    /// A key whose object is not in this shard's cache: reconciled only if the object is gone
    /// from the server and this run had confirmed the key (a deletion of this shard's object),
    /// or the server has it labelled for this shard (the cache is behind). A key this shard
    /// never confirmed, or handed over, is not its deletion to reconcile: the shard that had
    /// the object does. An object being assigned to this shard has its children labelled
    /// first, so their notifications may queue its key before the object itself arrives: that
    /// is not a deletion, and its own notification queues the key again.
    async fn absent(&self, controller: &str, key: &ObjectKey) -> Admit {
        if let Err(admit) = self.listed(controller).await {
            return admit;
        }
        match self.api(key).get_metadata_opt(&key.name).await {
            Ok(None) => {
                if self.confirmed().remove(key) {
                    Admit::Reconcile
                } else {
                    debug!(controller, key = %key, ring = %self.config.ring,
                        "deleted, but never confirmed as this shard's object: its deletion not reconciled here");
                    Admit::Skip
                }
            }
            Ok(Some(meta)) => {
                let label = self.shard_of(&meta.metadata);
                if label == Some(&self.config.shard_id) {
                    Admit::Reconcile // the cache is behind
                } else {
                    debug!(controller, key = %key, ring = %self.config.ring, shard = ?label,
                        "not (yet) this shard's object: not reconciled");
                    Admit::Skip
                }
            }
            Err(e) => {
                warn!(controller, key = %key, ring = %self.config.ring, error = %e,
                    "reading an object absent from the shard's cache failed: retrying");
                Admit::Retry
            }
        }
    }

    /// The metadata to decide on for cached object `cached`, if the object is confirmed for
    /// this shard (see the [module docs](self)): listed at the start of the run, or cached in
    /// a copy newer than that LIST (then it is confirmed now). Otherwise what the worker does:
    /// skip it (the copy predates the LIST, which did not find it here: the cache is behind a
    /// move or a deletion, whose notification follows) or retry (the LIST failed). If either
    /// resourceVersion is not a number, a GET decides ([`confirm`](Self::confirm)).
    async fn trusted(&self, controller: &str, key: &ObjectKey, cached: ObjectMeta) -> Result<ObjectMeta, Admit> {
        if self.confirmed().contains(key) {
            return Ok(cached);
        }
        let listed = self.listed(controller).await?;
        if self.confirmed().contains(key) {
            return Ok(cached);
        }
        let copy = cached.resource_version.as_deref().and_then(|rv| rv.parse::<u64>().ok());
        match (listed.resource_version, copy) {
            (Some(snapshot), Some(copy))
                if copy > snapshot && self.shard_of(&cached) == Some(&self.config.shard_id) =>
            {
                self.confirmed().insert(key.clone());
                Ok(cached)
            }
            (Some(snapshot), Some(copy)) => {
                debug!(controller, key = %key, ring = %self.config.ring, copy, snapshot,
                    "cached for this shard but not labelled for it at the run's LIST (the cache is behind): not reconciled");
                Err(Admit::Skip)
            }
            _ => self.confirm(controller, key).await,
        }
    }

    /// The server's metadata of a cached object not confirmed yet in this run, when the
    /// resourceVersions cannot be compared (see [`trusted`](Self::trusted)), if it is labelled
    /// for this shard (then it is confirmed); otherwise what the worker does: skip it (the
    /// cache is behind a move or a deletion, whose notification follows) or retry (the GET
    /// failed).
    async fn confirm(&self, controller: &str, key: &ObjectKey) -> Result<ObjectMeta, Admit> {
        match self.api(key).get_metadata_opt(&key.name).await {
            Ok(Some(meta)) => {
                let label = self.shard_of(&meta.metadata);
                if label == Some(&self.config.shard_id) {
                    self.confirmed().insert(key.clone());
                    Ok(meta.metadata)
                } else {
                    debug!(controller, key = %key, ring = %self.config.ring, shard = ?label,
                        "cached for this shard but labelled otherwise on the server (the cache is behind): not reconciled");
                    Err(Admit::Skip)
                }
            }
            Ok(None) => Err(Admit::Skip),
            Err(e) => {
                warn!(controller, key = %key, ring = %self.config.ring, error = %e,
                    "confirming a cached object's shard failed: retrying");
                Err(Admit::Retry)
            }
        }
    }

    /// Decides what the worker does with `key` (see [`Admit`]); writes the acknowledgement of a
    /// draining object.
    pub(crate) async fn admit(&self, controller: &str, key: &ObjectKey) -> Admit {
        let Some(cached) = (self.lookup)(key) else {
            if self.handed_over().remove(key) {
                // Forgotten here: the notification of its departure is the last one this shard
                // gets of it while it is away (so the set does not grow with deleted keys); if
                // it comes back, it is in the cache again.
                debug!(controller, key = %key, ring = %self.config.ring, "handed over to another shard: not reconciled");
                return Admit::Skip;
            }
            return self.absent(controller, key).await;
        };
        let meta = match self.trusted(controller, key, cached).await {
            Ok(meta) => meta,
            Err(admit) => return admit,
        };
        let draining = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(&self.config.drain_label()))
            .is_some_and(|v| v == "true");
        if !draining {
            self.handed_over().remove(key);
            return Admit::Reconcile;
        }
        let Some(rv) = meta.resource_version.filter(|rv| !rv.is_empty()) else {
            return Admit::Retry;
        };
        let api = self.api(key);
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": rv,
            "labels": {self.config.shard_label(): null, self.config.drain_label(): null},
        }});
        // Remembered before the write: once it is sent, this shard must not reconcile the key.
        self.handed_over().insert(key.clone());
        self.confirmed().remove(key);
        match api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(controller, key = %key, ring = %self.config.ring, shard = %self.config.shard_id,
                    "drained: handed over to the sharder");
                Admit::Skip
            }
            Err(kube::Error::Api(status)) if status.code == 404 => Admit::Skip,
            Err(e) => {
                // Perhaps not written (a conflict: the cache is behind). The key stays marked:
                // while the object is in this cache with its drain label the next attempt
                // acknowledges again, and if the write did land, the object leaves the cache.
                if matches!(&e, kube::Error::Api(status) if status.code == 409) {
                    debug!(controller, key = %key, ring = %self.config.ring, error = %e,
                        "drain acknowledgement conflicted (the cache is behind): retrying");
                } else {
                    warn!(controller, key = %key, ring = %self.config.ring, error = %e,
                        "drain acknowledgement failed: retrying");
                }
                Admit::Retry
            }
        }
    }
}
