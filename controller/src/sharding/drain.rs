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
//! its deletion is this shard's (the key was confirmed by this run, or its deletion was; see
//! [Deletions](#deletions)), or the server has it labelled for this shard (a GET): a moved
//! object's children are labelled for the new shard before the object, and their
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
//! One LIST establishes it for every key at once: right after the join, before the shard is
//! reported ready and before any worker admits a key, the run lists the metadata of the objects
//! labelled for this shard (`shard.kinformer.io/<ring>=<shard>`, paged, one consistent snapshot
//! at resourceVersion `R`; retried every `retry_period` until it succeeds). The LIST is sent
//! after the run read its Lease unfenced, so `R` follows the fence's lifting and every move the
//! sharder wrote under the fence (those writes completed before it lifted it). Every listed key
//! is confirmed (the server had it labelled for this shard at `R`). A cached object not listed
//! is confirmed by its own resourceVersion if that is newer than `R`: the cache holds it as the
//! server had it after `R`, labelled for this shard (the informer selects on the label). One
//! not listed and not newer than `R` is a copy from before `R` of an object the server did not
//! have labelled for this shard at `R`: moved away (its departure is on the way) or deleted; it
//! is skipped, and if it comes back, its return is a newer copy. So the LIST establishes the
//! same fact a GET of each key would (labelled for this shard at an instant after the join),
//! with one request per page instead of one per object. resourceVersions are compared as
//! numbers (etcd's revisions, as the informers compare them); if one is not a number, a GET of
//! the key confirms it.
//!
//! # Deletions
//! A key is confirmed when a worker first admits it, so an object that arrived in this shard
//! (assigned, or moved in) and was deleted before the shard's first reconcile of it would be
//! absent and unconfirmed at its deletion: skipped, where an unsharded controller reconciles the
//! deletion once. Its deletion is confirmed instead, from the notification: when the primary
//! informer delivers a delete that the controller queues, its handler records a *tombstone*
//! (key and the delivered state's resourceVersion, [`Deletions::record`]) if that state is
//! labelled for this shard and not draining. When the key is admitted and absent from the cache
//! and the server has no such object, a tombstone newer than the run's LIST (`R`) confirms the
//! deletion, as a cached copy newer than `R` confirms a key. A label-selector watch also sends
//! a delete when an object leaves the selector by a label change, with the object's *previous*
//! state at the change's resourceVersion, so a tombstone is either a deletion or a departure;
//! neither one newer than `R` can be a departure to another shard: after the run joined, an
//! object labelled for this shard leaves it only by this shard's acknowledgement, whose
//! previous state is draining (no tombstone) and whose key is handed over (skipped before its
//! tombstone is looked at). A departure under a fence of an earlier incarnation precedes the
//! fence's lifting, hence the join and `R`: its tombstone is ignored, also if the object is
//! deleted later on another shard. So a tombstone newer than `R` of an object the server no
//! longer has says: the server had it labelled for this shard, not draining, after the run
//! joined (at its deletion, or for a `DeletedFinalStateUnknown` at the last cached copy, the
//! GET deciding that it is gone), and it was deleted without leaving: no other shard had it
//! since, nor confirmed it, so no other shard reconciles it or its deletion, and the
//! no-overlap invariant holds as for a confirmed key. A tombstone not newer than `R` (or when
//! either resourceVersion is not a number) proves nothing about this run and is ignored.
//!
//! Which deletions that leaves to no shard: those at or before `R` of objects not listed (no
//! worker admits a key before `R`, so none was confirmed either). `R` is the earliest revision
//! of the primary type known to follow the join, which is why the LIST is taken at the join and
//! not by the run's first admission (which may be the deletion's own key, after the deletion).
//! A cut-off at the join itself would be the Lease's resourceVersion, comparable with an
//! object's only if both are stored in one etcd (an API server may store Leases apart,
//! `--etcd-servers-overrides`), so it is not used. Not reconciled, then: an object deleted
//! while its shard was dead or not yet joined (as a deletion made while an unsharded controller
//! is down), and an object assigned to this shard and deleted within the window from the
//! sharder's first sight of the shard as live (its Lease held, labelled and unfenced: it
//! assigns at once) to `R`. The run reads its Lease right after labelling it (a Lease that kept
//! an earlier run's label is live from its acquisition) and, while it is fenced, every
//! `retry_period`, then sends its LIST: the window is a few round trips (the label, a Lease
//! read, the LIST), plus up to a `retry_period` after a lifted fence, and longer while the LIST
//! fails.
//!
//! A limit: one name, two objects. A tombstone is looked at when its key is admitted, which may
//! be late (a backlog). A name deleted on this shard, created again, assigned to another shard
//! and deleted there before this shard admits the key is found gone by the GET, and this
//! shard's tombstone (of the first object) confirms the deletion while the other shard
//! reconciles the second object's: the two may reconcile the one key at the same instant, each
//! with the object absent. They are two objects (two uids), each reconciled by one shard; a key
//! confirmed and then deleted had the same case before tombstones. A reconciler that acts on
//! an absent object by its name alone (not by its children's owner uid) must allow for it.
//!
//! Tombstones stay bounded: one is recorded only with its key queued, and the admission of the
//! key removes it (a failed admission that retries the key keeps it).

use std::collections::{HashMap, HashSet};
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

/// Deletions of this shard's objects that its primary informer delivered and its workers have
/// not admitted yet: the *tombstones* of the [module docs](self#deletions). Shared by the
/// primary's event handler, which records them, and the [`ShardGate`], which decides on them.
pub(crate) struct Deletions {
    shard_label: String,
    drain_label: String,
    shard_id: String,
    /// Key -> the delivered state's resourceVersion (`None` if it is not a number).
    tombstones: Mutex<HashMap<ObjectKey, Option<u64>>>,
}

impl Deletions {
    pub(crate) fn new(config: &ShardingConfig) -> Self {
        Deletions {
            shard_label: config.shard_label(),
            drain_label: config.drain_label(),
            shard_id: config.shard_id.clone(),
            tombstones: Mutex::new(HashMap::new()),
        }
    }

    fn tombstones(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Option<u64>>> {
        self.tombstones.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the deletion of `key`, delivered with state `meta`, if that state is labelled for
    /// this shard and not draining. The primary's handler calls it for a delete it queues,
    /// before queueing the key (the admission that takes the key finds the tombstone).
    pub(crate) fn record(&self, key: ObjectKey, meta: &ObjectMeta) {
        let Some(labels) = meta.labels.as_ref() else { return };
        let ours = labels.get(&self.shard_label) == Some(&self.shard_id);
        let draining = labels.get(&self.drain_label).is_some_and(|v| v == "true");
        if ours && !draining {
            let rv = meta.resource_version.as_deref().and_then(|rv| rv.parse::<u64>().ok());
            self.tombstones().insert(key, rv);
        }
    }

    /// Removes `key`'s tombstone: `Some(rv)` if it had one.
    fn take(&self, key: &ObjectKey) -> Option<Option<u64>> {
        self.tombstones().remove(key)
    }

    /// Puts back a tombstone taken by an admission that retries the key (a newer one recorded
    /// meanwhile stays).
    fn restore(&self, key: &ObjectKey, rv: Option<u64>) {
        self.tombstones().entry(key.clone()).or_insert(rv);
    }
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
    /// The LIST of this shard's objects, made when the run joined (see the
    /// [module docs](self)).
    listed: OnceCell<Listed>,
    /// The tombstones the primary's handler records (see the [module docs](self#deletions)).
    deletions: Arc<Deletions>,
}

impl ShardGate {
    pub(crate) fn new(
        config: ShardingConfig,
        lookup: Lookup,
        client: Client,
        resource: ApiResource,
        namespaced: bool,
        deletions: Arc<Deletions>,
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
            deletions,
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

    /// Takes the run's LIST of this shard's objects right after the join, before the shard is
    /// reported ready and before any worker admits a key (see the [module docs](self#deletions)):
    /// retried every `retry_period` until it succeeds. The run stops waiting for it on shutdown
    /// or when its term ends (then an admission lists, as [`listed`](Self::listed) does).
    pub(crate) async fn list_at_join(&self, controller: &str) {
        while self.listed(controller).await.is_err() {
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// The run's LIST of this shard's objects, made now if not yet (the run makes it at its
    /// join, [`list_at_join`](Self::list_at_join); see the [module docs](self)): one consistent
    /// snapshot, in pages; its keys are confirmed. A failed LIST is logged and the worker
    /// retries the key (the next admission lists again).
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
    /// from the server and its deletion is this shard's (this run had confirmed the key, or
    /// `tombstone`, the resourceVersion of a deletion of it labelled for this shard, is newer
    /// than the run's LIST: see the [module docs](self#deletions)), or the server has it
    /// labelled for this shard (the cache is behind). A key this shard never confirmed, or
    /// handed over, is not its deletion to reconcile: the shard that had the object does. An
    /// object being assigned to this shard has its children labelled first, so their
    /// notifications may queue its key before the object itself arrives: that is not a
    /// deletion, and its own notification queues the key again.
    async fn absent(&self, controller: &str, key: &ObjectKey, tombstone: Option<Option<u64>>) -> Admit {
        let snapshot = match self.listed(controller).await {
            Ok(listed) => listed.resource_version,
            Err(admit) => return admit,
        };
        match self.api(key).get_metadata_opt(&key.name).await {
            Ok(None) => {
                let deleted_here = tombstone
                    .flatten()
                    .zip(snapshot)
                    .is_some_and(|(deletion, snapshot)| deletion > snapshot);
                if self.confirmed().remove(key) {
                    Admit::Reconcile
                } else if deleted_here {
                    debug!(controller, key = %key, ring = %self.config.ring, shard = %self.config.shard_id,
                        "deleted while labelled for this shard after the run's LIST: its deletion reconciled here");
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
        // Taken before the cache is read: the handler records a tombstone after its deletion
        // reached the cache, so a tombstone taken here while the object is still cached is of
        // an earlier deletion (the object was created again), and a later one stays for the
        // key's next admission.
        let tombstone = self.deletions.take(key);
        let Some(cached) = (self.lookup)(key) else {
            if self.handed_over().remove(key) {
                // Forgotten here: the notification of its departure is the last one this shard
                // gets of it while it is away (so the set does not grow with deleted keys); if
                // it comes back, it is in the cache again.
                debug!(controller, key = %key, ring = %self.config.ring, "handed over to another shard: not reconciled");
                return Admit::Skip;
            }
            let admit = self.absent(controller, key, tombstone).await;
            if let (Admit::Retry, Some(rv)) = (&admit, tombstone) {
                self.deletions.restore(key, rv);
            }
            return admit;
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn meta(labels: &[(String, &str)], rv: &str) -> ObjectMeta {
        ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.clone(), (*v).to_owned()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            resource_version: Some(rv.to_owned()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_tombstone_is_recorded_for_this_shards_object_not_draining() {
        let config = ShardingConfig::new("cms", "shard-0");
        let (shard, drain) = (config.shard_label(), config.drain_label());
        let deletions = Deletions::new(&config);
        let key = |name: &str| ObjectKey::namespaced("ns", name);
        deletions.record(key("ours"), &meta(&[(shard.clone(), "shard-0")], "12"));
        deletions.record(key("other"), &meta(&[(shard.clone(), "shard-1")], "13"));
        deletions.record(
            key("draining"),
            &meta(&[(shard.clone(), "shard-0"), (drain, "true")], "14"),
        );
        deletions.record(key("unlabelled"), &meta(&[], "15"));
        deletions.record(key("opaque"), &meta(&[(shard, "shard-0")], "x"));
        assert_eq!(deletions.take(&key("ours")), Some(Some(12)));
        assert_eq!(deletions.take(&key("ours")), None, "taken once");
        for name in ["other", "draining", "unlabelled"] {
            assert_eq!(deletions.take(&key(name)), None, "{name}");
        }
        assert_eq!(deletions.take(&key("opaque")), Some(None));
        // A retried admission puts its tombstone back, but not over a newer one.
        deletions.restore(&key("ours"), Some(12));
        assert_eq!(deletions.take(&key("ours")), Some(Some(12)));
        deletions.tombstones().insert(key("ours"), Some(20));
        deletions.restore(&key("ours"), Some(12));
        assert_eq!(deletions.take(&key("ours")), Some(Some(20)));
    }
}
