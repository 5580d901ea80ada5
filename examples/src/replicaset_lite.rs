//! replicaset-lite: the `apps/v1` ReplicaSet controller of kube-controller-manager
//! (`pkg/controller/replicaset`), cut down to its core, on kinformer.
//!
//! A ReplicaSet asks for `spec.replicas` Pods made from `spec.template`. The controller:
//! - finds the Pods a ReplicaSet controls through an index of the Pod informer's cache on the
//!   Pods' controller ownerReference ([`POD_CONTROLLER_UID_INDEX`], client-go's
//!   `podControllerUID`): one hash lookup per reconcile, not a scan of every Pod;
//! - creates the missing ones (`<rs-name>-<5 random chars>` through `generateName`, the
//!   template's labels and annotations, a controller ownerReference) in client-go's slow-start
//!   batches of 1, 2, 4, ... so a failing create costs one request, not `replicas`;
//! - deletes the surplus, least valuable first (unscheduled, then pending, then not ready, then
//!   most restarted, then newest);
//! - writes `replicas`, `fullyLabeledReplicas`, `readyReplicas`, `availableReplicas` and
//!   `observedGeneration` to the ReplicaSet's status subresource.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use examples::replicaset_lite::{self, ReplicaSetController};
//! use kinformer::controller::Manager;
//!
//! let mut manager = Manager::builder(client).build()?;
//! let reconciler = ReplicaSetController::new(manager.factory())?; // Pod index + expectations
//! let expectations = reconciler.expectations(); // lowered by the Pod handler before it enqueues
//! manager.add(replicaset_lite::controller(&manager, expectations, reconciler)?);
//! manager.add(replicaset_lite::fake_kubelet(manager.factory())?); // envtest only: no kubelets there
//! manager.run(kinformer::CancellationToken::new()).await?;
//! # Ok(()) }
//! ```
//!
//! # Expectations: why it never creates a Pod twice
//! The reconcile reads Pods from the informer's cache, which lags the controller's own writes:
//! right after creating three Pods, a second reconcile (woken by the ReplicaSet's status
//! update, say) may still see none of them and create three more. client-go's
//! `ControllerExpectations` close that gap, and [`ControllerExpectations`] here does the same:
//! before creating `n` Pods the reconcile records "expect `n` creations" for the ReplicaSet;
//! a handler on the Pod informer ([`ExpectationsObserver`]) lowers the count as each Pod
//! reaches the cache; a reconcile that finds the count above zero only updates the status and
//! touches no Pod. Deletions are tracked by Pod key (client-go's
//! `UIDTrackingControllerExpectations`), so a Pod somebody else deletes does not count as one
//! of ours. A failed create or delete lowers the count at once, since no event will. An
//! expectation older than [`EXPECTATIONS_TIMEOUT`] (5 minutes, client-go's) is ignored, so a
//! lost watch event cannot stall a ReplicaSet forever.
//!
//! The observer is also what enqueues the ReplicaSet of a Pod (registered with the controller's
//! `watches_with`, which hands it the queue): it lowers the count first, then enqueues, as
//! client-go's one Pod handler does, so the reconcile woken by the last Pod always sees it
//! counted, and a reconcile that finds expectations pending can simply end.
//!
//! # Compared with upstream
//! Not done: adoption and release of Pods by label selector (only Pods carrying the controller
//! ownerReference count), the `ReplicaFailure` condition, `terminatingReplicas`. Added: one
//! uncached GET of the ReplicaSet before a burst of creates, so a ReplicaSet deleted while
//! still in the cache does not get Pods made for it after the garbage collector took its old
//! ones (see `ReplicaSetController::still_exists`).
//!
//! envtest runs no kubelet; [`fake_kubelet`] stands in for one and marks Pods Running and
//! Ready. Against a real cluster kube-controller-manager's own ReplicaSet controller manages
//! the same objects: run this one only where that is disabled (`--controllers=*,-replicaset`).

use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kinformer::cache::{
    DeletedObject, IndexError, Indexer, Indexers, ResourceEventHandler, ResourceEventHandlerFuncs, SharedIndexInformer,
    meta_namespace_key,
};
use kinformer::controller::{
    Action, BuiltController, Context, ControllerError, Enqueuer, EventRecorder, EventType, Manager, ObjectKey,
    Reconciler, Request, Runnable, runnable_fn,
};
use kinformer::factory::SharedInformerFactory;
use kinformer::factory::generated::apps::v1::ReplicaSetLister;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
// Tokio's clock, so tests can move time (paused) instead of sleeping.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The name of the Pod index by controller: a Pod is indexed under the uid of its
/// ownerReference with `controller: true` (client-go's `PodControllerUIDIndex`).
pub const POD_CONTROLLER_UID_INDEX: &str = "podControllerUID";

/// How long expectations are waited for before a reconcile acts anyway (client-go's
/// `ExpectationsTimeout`): long enough for any watch to deliver, short enough that a dropped
/// event does not stall a ReplicaSet for good.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// The most Pods one reconcile creates or deletes (client-go's `BurstReplicas`).
pub const BURST_REPLICAS: usize = 500;

/// The first slow-start batch (client-go's `SlowStartInitialBatchSize`).
const SLOW_START_INITIAL_BATCH_SIZE: usize = 1;

/// The index function of [`POD_CONTROLLER_UID_INDEX`]: the uid of the Pod's controller
/// ownerReference, or nothing for a Pod no controller owns.
pub fn pod_controller_uid(pod: &Pod) -> Vec<String> {
    pod.owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| vec![r.uid.clone()])
        .unwrap_or_default()
}

/// Adds [`POD_CONTROLLER_UID_INDEX`] to the Pod informer. Another controller having added it
/// already is fine: the function is the same (as client-go's `AddPodControllerUIDIndexer`).
pub fn add_pod_controller_uid_indexer(pods: &SharedIndexInformer<Pod>) -> Result<(), ControllerError> {
    let mut indexers: Indexers<Pod> = Indexers::new();
    indexers.insert(POD_CONTROLLER_UID_INDEX.into(), Arc::new(pod_controller_uid));
    match pods.add_indexers(indexers) {
        Ok(()) => Ok(()),
        Err(kinformer::cache::InformerError::Index(IndexError::Conflict(name))) if name == POD_CONTROLLER_UID_INDEX => {
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The key (`namespace/name`) of the ReplicaSet controlling `pod`, if one does.
fn controlling_replicaset(pod: &Pod) -> Option<String> {
    controlling_replicaset_key(pod).map(|key| key.cache_key())
}

/// The key of the ReplicaSet in `pod`'s controller ownerReference.
fn controlling_replicaset_key(pod: &Pod) -> Option<ObjectKey> {
    let owner = pod.owner_references().iter().find(|r| r.controller == Some(true))?;
    let group = owner.api_version.rsplit_once('/').map_or("", |(group, _)| group);
    if owner.kind != "ReplicaSet" || group != "apps" {
        return None;
    }
    Some(ObjectKey::namespaced(pod.namespace().unwrap_or_default(), &owner.name))
}

// ---------------------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------------------

/// What one ReplicaSet waits to see (client-go's `ControlleeExpectations` plus the UID set of
/// `UIDTrackingControllerExpectations`).
#[derive(Debug)]
struct Expectee {
    /// Creations not yet observed. May drop below zero (a Pod observed after its create was
    /// reported failed); anything `<= 0` is fulfilled.
    add: i64,
    /// The keys of the Pods whose deletion is still awaited: exactly the Pods this controller
    /// asked to delete and has neither seen go nor failed to delete.
    deleting: HashSet<String>,
    /// When these expectations were set; they expire `ttl` later.
    set_at: Instant,
}

impl Expectee {
    fn fulfilled(&self) -> bool {
        self.add <= 0 && self.deleting.is_empty()
    }
}

/// The creations and deletions of Pods each ReplicaSet waits to observe (client-go's
/// `ControllerExpectations` with UID-tracked deletions), keyed by the ReplicaSet's
/// `namespace/name`. Shared by the reconciler, which sets them, and the Pod informer's
/// [`ExpectationsObserver`], which lowers them. Cheap to clone.
///
/// ```
/// use examples::replicaset_lite::ControllerExpectations;
///
/// let expectations = ControllerExpectations::default();
/// assert!(expectations.satisfied("default/web")); // never set: act
/// expectations.expect_creations("default/web", 2);
/// expectations.creation_observed("default/web");
/// assert!(!expectations.satisfied("default/web")); // one Pod still to show up
/// expectations.creation_observed("default/web");
/// assert!(expectations.satisfied("default/web"));
/// ```
#[derive(Clone)]
pub struct ControllerExpectations {
    ttl: Duration,
    records: Arc<Mutex<HashMap<String, Expectee>>>,
}

impl Default for ControllerExpectations {
    fn default() -> Self {
        Self::with_timeout(EXPECTATIONS_TIMEOUT)
    }
}

impl ControllerExpectations {
    /// Expectations that expire `ttl` after they are set (the default is
    /// [`EXPECTATIONS_TIMEOUT`]).
    pub fn with_timeout(ttl: Duration) -> Self {
        ControllerExpectations {
            ttl,
            records: Arc::default(),
        }
    }

    // Every critical section below leaves the map consistent before anything can panic.
    fn records(&self) -> MutexGuard<'_, HashMap<String, Expectee>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the ReplicaSet `key` may create or delete Pods (client-go's
    /// `SatisfiedExpectations`): it set no expectations, they are fulfilled, or they expired.
    pub fn satisfied(&self, key: &str) -> bool {
        match self.records().get(key) {
            None => true,
            Some(e) if e.fulfilled() => true,
            Some(e) if e.set_at.elapsed() > self.ttl => {
                tracing::info!(
                    replicaset = key,
                    add = e.add,
                    del = e.deleting.len(),
                    "expectations expired"
                );
                true
            }
            Some(_) => false,
        }
    }

    /// Records that `key` is about to create `adds` Pods, replacing what it expected before
    /// (client-go's `ExpectCreations`).
    pub fn expect_creations(&self, key: &str, adds: usize) {
        let expectee = Expectee {
            add: i64::try_from(adds).unwrap_or(i64::MAX),
            deleting: HashSet::new(),
            set_at: Instant::now(),
        };
        self.records().insert(key.to_owned(), expectee);
    }

    /// Records that `key` is about to delete the Pods `pod_keys`, replacing what it expected
    /// before (`UIDTrackingControllerExpectations.ExpectDeletions`).
    pub fn expect_deletions(&self, key: &str, pod_keys: impl IntoIterator<Item = String>) {
        let expectee = Expectee {
            add: 0,
            deleting: pod_keys.into_iter().collect(),
            set_at: Instant::now(),
        };
        self.records().insert(key.to_owned(), expectee);
    }

    /// One of `key`'s Pods was observed created, or a create failed (client-go's
    /// `CreationObserved`). Nothing happens if `key` expects nothing.
    pub fn creation_observed(&self, key: &str) {
        if let Some(e) = self.records().get_mut(key) {
            e.add -= 1;
        }
    }

    /// The Pod `pod_key` of `key` was observed deleted, or its delete failed. Counts only if
    /// `key` was waiting for that very Pod.
    pub fn deletion_observed(&self, key: &str, pod_key: &str) {
        if let Some(e) = self.records().get_mut(key) {
            e.deleting.remove(pod_key);
        }
    }

    /// Forgets `key` (its ReplicaSet is gone).
    pub fn delete(&self, key: &str) {
        self.records().remove(key);
    }

    /// The creations and deletions `key` still waits for, if it set any expectations.
    pub fn pending(&self, key: &str) -> Option<(i64, usize)> {
        self.records().get(key).map(|e| (e.add, e.deleting.len()))
    }
}

/// The Pod informer's handler that lowers [`ControllerExpectations`] as Pods appear and
/// disappear (the expectation half of client-go's `addPod`, `updatePod`, `deletePod`).
///
/// A Pod with a `deletionTimestamp` counts as deleted from the first time it is seen so: it
/// is no longer active, and a replacement is due at once, not when the kubelet lets go.
pub struct ExpectationsObserver {
    expectations: ControllerExpectations,
    /// The controller's queue: the owner is enqueued after its expectation was lowered.
    queue: Option<Enqueuer>,
}

impl ExpectationsObserver {
    /// Lowers `expectations` (and enqueues nothing).
    pub fn new(expectations: ControllerExpectations) -> Self {
        ExpectationsObserver {
            expectations,
            queue: None,
        }
    }

    /// Lowers `expectations`, then enqueues the Pod's ReplicaSet into `queue`: one handler does
    /// both, in that order, as client-go's `addPod`/`updatePod`/`deletePod`, so the reconcile a
    /// Pod wakes always sees it counted.
    pub fn with_queue(expectations: ControllerExpectations, queue: Enqueuer) -> Self {
        ExpectationsObserver {
            expectations,
            queue: Some(queue),
        }
    }

    fn enqueue_owner(&self, pod: &Pod) {
        if let (Some(queue), Some(key)) = (&self.queue, controlling_replicaset_key(pod)) {
            queue.add(key);
        }
    }

    fn deleted(&self, pod: &Pod) {
        if let (Some(rs), Ok(pod_key)) = (controlling_replicaset(pod), meta_namespace_key(pod)) {
            self.expectations.deletion_observed(&rs, &pod_key);
        }
    }
}

impl ResourceEventHandler<Pod> for ExpectationsObserver {
    fn on_add(&self, pod: &Arc<Pod>, _is_in_initial_list: bool) {
        if pod.metadata.deletion_timestamp.is_some() {
            // Restarted with a Pod already terminating: it must not count as a creation.
            self.deleted(pod);
        } else if let Some(rs) = controlling_replicaset(pod) {
            self.expectations.creation_observed(&rs);
        }
        self.enqueue_owner(pod);
    }

    fn on_update(&self, old: &Arc<Pod>, new: &Arc<Pod>) {
        // Idempotent: the deletion set holds each Pod once.
        if new.metadata.deletion_timestamp.is_some() {
            self.deleted(new);
        }
        // Status changes (Ready) concern the owner's status; an owner change concerns both.
        self.enqueue_owner(old);
        self.enqueue_owner(new);
    }

    fn on_delete(&self, pod: DeletedObject<Pod>) {
        self.deleted(pod.object());
        self.enqueue_owner(pod.object());
    }
}

// ---------------------------------------------------------------------------------------------
// What the controller wrote
// ---------------------------------------------------------------------------------------------

/// Pods created and deleted for one ReplicaSet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Pods created (successful POSTs).
    pub created: u64,
    /// Pods deleted (successful DELETEs).
    pub deleted: u64,
}

/// The Pods the controller created and deleted, per ReplicaSet key: what the demo and tests
/// check the never-double-create property against. Cheap to clone.
#[derive(Clone, Default)]
pub struct PodWrites {
    counts: Arc<Mutex<HashMap<String, WriteCounts>>>,
}

impl PodWrites {
    fn update(&self, key: &str, f: impl FnOnce(&mut WriteCounts)) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        f(counts.entry(key.to_owned()).or_default());
    }

    /// The counts of the ReplicaSet `key` (`namespace/name`).
    pub fn get(&self, key: &str) -> WriteCounts {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(key).copied().unwrap_or_default()
    }

    /// The counts summed over every ReplicaSet.
    pub fn total(&self) -> WriteCounts {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.values().fold(WriteCounts::default(), |sum, c| WriteCounts {
            created: sum.created + c.created,
            deleted: sum.deleted + c.deleted,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The reconciler
// ---------------------------------------------------------------------------------------------

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A request to the API server failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The Pod index is missing (the informer was built without it).
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The ReplicaSet has no `spec.template` to make Pods from.
    #[error("ReplicaSet {0} has no spec.template")]
    NoTemplate(String),
}

/// The reconciler: the ReplicaSet lister and the indexed Pod cache for reads, the context's
/// client for writes, and the expectations it shares with its [`ExpectationsObserver`].
pub struct ReplicaSetController {
    replicasets: ReplicaSetLister,
    pods: Indexer<Pod>,
    expectations: ControllerExpectations,
    writes: PodWrites,
    /// How many reconciles found expectations pending and left the Pods alone.
    expectation_waits: Arc<std::sync::atomic::AtomicUsize>,
}

impl ReplicaSetController {
    /// Takes its caches from `factory`'s shared informers, adds [`POD_CONTROLLER_UID_INDEX`]
    /// to the Pod informer and registers the [`ExpectationsObserver`] on it. Call before the
    /// factory starts, so the observer sees every Pod.
    pub fn new(factory: &SharedInformerFactory) -> Result<Self, ControllerError> {
        let pods = factory.core().v1().pods()?;
        add_pod_controller_uid_indexer(pods.informer())?;
        let expectations = ControllerExpectations::default();
        Ok(ReplicaSetController {
            replicasets: factory.apps().v1().replicasets()?.lister(),
            pods: pods.informer().indexer().clone(),
            expectations,
            writes: PodWrites::default(),
            expectation_waits: Arc::default(),
        })
    }

    /// How many reconciles so far found expectations pending and touched no Pod (a handle:
    /// it keeps counting after the reconciler moved into a controller).
    pub fn expectation_waits(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        self.expectation_waits.clone()
    }

    /// The expectations, shared with the Pod informer's observer.
    pub fn expectations(&self) -> ControllerExpectations {
        self.expectations.clone()
    }

    /// The Pods this controller created and deleted.
    pub fn writes(&self) -> PodWrites {
        self.writes.clone()
    }

    /// Whether `rs` still exists on the server, unchanged in identity and not being deleted
    /// (one uncached GET).
    ///
    /// Not in upstream: when a ReplicaSet is deleted, the garbage collector deletes its Pods,
    /// and the Pod informer may report them gone before the ReplicaSet informer reports the
    /// ReplicaSet gone. A reconcile in between sees missing replicas and would create Pods for
    /// a deleted owner. kube's garbage collector deletes such Pods later; envtest's, which
    /// wakes only on deletes, never does. The server removes the ReplicaSet before collecting
    /// its Pods, so asking it once per creation burst closes that window.
    async fn still_exists(&self, rs: &ReplicaSet, client: &Client) -> Result<bool, kube::Error> {
        let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &rs.namespace().unwrap_or_default());
        let live = replicasets.get_opt(&rs.name_any()).await?;
        Ok(live.is_some_and(|live| live.uid() == rs.uid() && live.metadata.deletion_timestamp.is_none()))
    }

    /// Creates or deletes Pods so `rs` has `spec.replicas` active ones (client-go's
    /// `manageReplicas`).
    async fn manage_replicas(
        &self,
        rs: &ReplicaSet,
        key: &str,
        active: &[Arc<Pod>],
        client: &Client,
        recorder: &EventRecorder,
    ) -> Result<(), SyncError> {
        let wanted = usize::try_from(desired_replicas(rs)).unwrap_or(0);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &rs.namespace().unwrap_or_default());
        if active.len() < wanted {
            let diff = (wanted - active.len()).min(BURST_REPLICAS);
            let pod = new_pod(rs).ok_or_else(|| SyncError::NoTemplate(key.to_owned()))?;
            if !self.still_exists(rs, client).await? {
                tracing::debug!(
                    replicaset = key,
                    "deleted meanwhile: its Pods are garbage, not missing replicas"
                );
                return Ok(());
            }
            tracing::debug!(replicaset = key, need = diff, "too few replicas: creating");
            self.expectations.expect_creations(key, diff);
            // Slow start: batches of 1, 2, 4, ...; the first failure ends the burst, so a
            // quota or admission error costs one request, not `diff`.
            let mut created = 0;
            let mut batch = SLOW_START_INITIAL_BATCH_SIZE.min(diff);
            let mut failure = None;
            while batch > 0 {
                let params = PostParams::default();
                let results = join_all((0..batch).map(|_| pods.create(&params, &pod))).await;
                for result in results {
                    match result {
                        Ok(pod) => {
                            created += 1;
                            self.writes.update(key, |c| c.created += 1);
                            let note = format!("Created pod: {}", pod.name_any());
                            recorder.publish(rs, EventType::Normal, "SuccessfulCreate", "Create", &note);
                        }
                        Err(e) => {
                            let note = format!("Error creating: {e}");
                            recorder.publish(rs, EventType::Warning, "FailedCreate", "Create", &note);
                            failure.get_or_insert(e);
                        }
                    }
                }
                if failure.is_some() {
                    break;
                }
                batch = (2 * batch).min(diff - created);
            }
            // Pods that failed or were never tried will not show up: stop waiting for them.
            for _ in created..diff {
                self.expectations.creation_observed(key);
            }
            return failure.map_or(Ok(()), |e| Err(e.into()));
        }
        if active.len() > wanted {
            let diff = (active.len() - wanted).min(BURST_REPLICAS);
            let mut ranked = active.to_vec();
            ranked.sort_by_key(|pod| deletion_rank(pod));
            ranked.truncate(diff);
            // Cached Pods always have a key; an empty one would only never be observed.
            let pod_keys: Vec<String> = ranked
                .iter()
                .map(|p| meta_namespace_key(&**p).unwrap_or_default())
                .collect();
            tracing::debug!(replicaset = key, surplus = diff, "too many replicas: deleting");
            self.expectations.expect_deletions(key, pod_keys.iter().cloned());
            let params = DeleteParams::default();
            let names: Vec<String> = ranked.iter().map(|p| p.name_any()).collect();
            let results = join_all(names.iter().map(|name| pods.delete(name, &params))).await;
            let mut failure = None;
            for ((pod, pod_key), result) in ranked.iter().zip(&pod_keys).zip(results) {
                match result {
                    Ok(_) => {
                        self.writes.update(key, |c| c.deleted += 1);
                        let note = format!("Deleted pod: {}", pod.name_any());
                        recorder.publish(rs, EventType::Normal, "SuccessfulDelete", "Delete", &note);
                    }
                    // Gone already: what we wanted, but no event of ours will come.
                    Err(kube::Error::Api(e)) if e.code == 404 => self.expectations.deletion_observed(key, pod_key),
                    Err(e) => {
                        self.expectations.deletion_observed(key, pod_key);
                        let note = format!("Error deleting: {e}");
                        recorder.publish(rs, EventType::Warning, "FailedDelete", "Delete", &note);
                        failure.get_or_insert(e);
                    }
                }
            }
            return failure.map_or(Ok(()), |e| Err(e.into()));
        }
        Ok(())
    }
}

impl Reconciler<ReplicaSet> for ReplicaSetController {
    type Error = SyncError;

    /// client-go's `syncReplicaSet`: check expectations, list the controlled Pods from the
    /// index, manage replicas if allowed, then write the status computed from the cache.
    async fn reconcile(&self, req: Request, ctx: &Context<ReplicaSet>) -> Result<Action, SyncError> {
        let key = req.cache_key();
        let namespace = req.namespace.clone().unwrap_or_default();
        let Some(rs) = self.replicasets.replicasets(&namespace).get(&req.name) else {
            // Gone: its Pods are garbage-collected through their ownerReferences.
            self.expectations.delete(&key);
            return Ok(Action::Done);
        };
        let Some(uid) = rs.uid() else {
            return Ok(Action::Done); // never from an API server
        };
        // Checked before the Pods are read (as upstream): if satisfied now, every Pod this
        // controller wrote is already in the cache read below (the observer runs after the
        // cache is updated). The other order could read a cache missing the last Pod, then
        // see that Pod's observation land, and create it again.
        let needs_sync = self.expectations.satisfied(&key);
        let active: Vec<Arc<Pod>> = self
            .pods
            .by_index(POD_CONTROLLER_UID_INDEX, &uid)?
            .into_iter()
            .filter(|pod| is_active(pod))
            .collect();

        let managed = if needs_sync && rs.metadata.deletion_timestamp.is_none() {
            self.manage_replicas(&rs, &key, &active, ctx.client(), ctx.recorder())
                .await
        } else {
            Ok(())
        };

        let now = Timestamp::now();
        let status = ReplicaCounts::calculate(&rs, &active, now);
        if ReplicaCounts::reported(&rs) != Some(status) {
            let replicasets: Api<ReplicaSet> = Api::namespaced(ctx.client().clone(), &namespace);
            let patch = serde_json::json!({"status": {
                "replicas": status.replicas,
                "fullyLabeledReplicas": status.fully_labeled_replicas,
                "readyReplicas": status.ready_replicas,
                "availableReplicas": status.available_replicas,
                "observedGeneration": status.observed_generation,
            }});
            match replicasets
                .patch_status(&req.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                // Deleted since the cache saw it: its delete event will reconcile it again.
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Action::Done),
                Err(e) => return Err(e.into()),
            }
        }
        managed?;

        if !needs_sync {
            // The Pod events still to come lower the count and enqueue this ReplicaSet again.
            self.expectation_waits
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(replicaset = %key, pending = ?self.expectations.pending(&key), "waiting for expectations");
            return Ok(Action::Done);
        }
        // Ready Pods become available only after minReadySeconds, which no event announces.
        let min_ready = rs.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0);
        let wanted = desired_replicas(&rs);
        if min_ready > 0 && status.ready_replicas == wanted && status.available_replicas != wanted {
            return Ok(Action::RequeueAfter(Duration::from_secs(
                min_ready.unsigned_abs().into(),
            )));
        }
        Ok(Action::Done)
    }
}

/// The ReplicaSet controller on `manager`'s factory: ReplicaSets, and the Pods they own (see
/// the module example).
/// Pods reach the queue through the [`ExpectationsObserver`] (`watches_with`), which lowers
/// `expectations` before it enqueues their ReplicaSet; pass the reconciler's
/// ([`ReplicaSetController::expectations`]).
pub fn controller<R: Reconciler<ReplicaSet>>(
    manager: &Manager,
    expectations: ControllerExpectations,
    reconciler: R,
) -> Result<BuiltController<ReplicaSet, R>, ControllerError> {
    manager
        .controller("replicaset")
        .for_resource::<ReplicaSet>()
        .watches_with::<Pod, _>(move |queue| ExpectationsObserver::with_queue(expectations, queue))
        .workers(2)
        .build(reconciler)
}

/// A ReplicaSet of `replicas` pause Pods labelled `app: <name>`.
pub fn example_replicaset(name: &str, replicas: i32) -> ReplicaSet {
    let labels = std::collections::BTreeMap::from([("app".to_string(), name.to_string())]);
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::apps::v1::ReplicaSetSpec {
            replicas: Some(replicas),
            selector: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: Some(k8s_openapi::api::core::v1::PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(k8s_openapi::api::core::v1::PodSpec {
                    containers: vec![k8s_openapi::api::core::v1::Container {
                        name: "app".into(),
                        image: Some("registry.k8s.io/pause:3.10".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            ..k8s_openapi::api::apps::v1::ReplicaSetSpec::default()
        }),
        status: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Pods and status
// ---------------------------------------------------------------------------------------------

/// `spec.replicas`, which the API server defaults to 1.
fn desired_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

/// A Pod that counts towards the replicas: not terminating, not finished (client-go's
/// `IsPodActive`).
pub fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The Pod's `Ready` condition, if it is `True`.
fn ready_condition(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether the Pod's `Ready` condition is `True`.
pub fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some()
}

/// Ready for at least `min_ready_seconds` at `now` (client-go's `IsPodAvailable`).
fn is_available(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    let Some(ready) = ready_condition(pod) else {
        return false;
    };
    if min_ready_seconds <= 0 {
        return true;
    }
    let since = ready.last_transition_time.as_ref().map(|t| t.0);
    since.is_some_and(|since| since + SignedDuration::from_secs(min_ready_seconds.into()) <= now)
}

/// The Pod `rs` makes: named `<rs-name>-<5 random chars>` by the API server (`generateName`),
/// labelled and annotated as the template, controlled by `rs`. `None` without a template.
pub fn new_pod(rs: &ReplicaSet) -> Option<Pod> {
    let template = rs.spec.as_ref()?.template.as_ref()?;
    let template_meta = template.metadata.clone().unwrap_or_default();
    let owner = rs.controller_owner_ref(&()).map(|mut r| {
        r.block_owner_deletion = Some(true);
        r
    });
    Some(Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", rs.name_any())),
            namespace: rs.namespace(),
            labels: template_meta.labels,
            annotations: template_meta.annotations,
            finalizers: template_meta.finalizers,
            owner_references: owner.map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: template.spec.clone(),
        status: None,
    })
}

/// Orders Pods for deletion, first to go first (client-go's `ActivePodsWithRanks`, without
/// the co-location rank): unscheduled before scheduled, Pending before Unknown before
/// Running, not ready before ready, more restarts before fewer, newer before older.
fn deletion_rank(pod: &Pod) -> impl Ord + use<> {
    let status = pod.status.as_ref();
    let scheduled = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some_and(|n| !n.is_empty());
    let phase = match status.and_then(|s| s.phase.as_deref()) {
        Some("Pending") => 0,
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 0, // no phase yet: as Pending
    };
    let restarts: i32 = status
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (
        scheduled,
        phase,
        is_ready(pod),
        Reverse(restarts),
        created.is_some(),
        Reverse(created),
        pod.name_any(),
    )
}

/// The replica counts of a ReplicaSet's status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaCounts {
    /// Active Pods.
    pub replicas: i32,
    /// Active Pods carrying every label of the template.
    pub fully_labeled_replicas: i32,
    /// Active Pods whose `Ready` condition is `True`.
    pub ready_replicas: i32,
    /// Ready Pods that have been ready for `minReadySeconds`.
    pub available_replicas: i32,
    /// The generation these counts were computed for.
    pub observed_generation: i64,
}

impl ReplicaCounts {
    /// The counts of `rs` with the active Pods `active` at `now` (client-go's
    /// `calculateStatus`).
    pub fn calculate(rs: &ReplicaSet, active: &[Arc<Pod>], now: Timestamp) -> Self {
        let spec = rs.spec.as_ref();
        let template_labels = spec
            .and_then(|s| s.template.as_ref())
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.as_ref());
        let min_ready = spec.and_then(|s| s.min_ready_seconds).unwrap_or(0);
        let count =
            |f: &dyn Fn(&Pod) -> bool| i32::try_from(active.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX);
        ReplicaCounts {
            replicas: count(&|_| true),
            fully_labeled_replicas: count(&|pod| {
                let labels = pod.labels();
                template_labels.is_none_or(|want| want.iter().all(|(k, v)| labels.get(k) == Some(v)))
            }),
            ready_replicas: count(&is_ready),
            available_replicas: count(&|pod| is_available(pod, min_ready, now)),
            observed_generation: rs.metadata.generation.unwrap_or(0),
        }
    }

    /// The counts `rs`'s status reports, if it has a status.
    pub fn reported(rs: &ReplicaSet) -> Option<Self> {
        let status = rs.status.as_ref()?;
        Some(ReplicaCounts {
            replicas: status.replicas,
            fully_labeled_replicas: status.fully_labeled_replicas.unwrap_or(0),
            ready_replicas: status.ready_replicas.unwrap_or(0),
            available_replicas: status.available_replicas.unwrap_or(0),
            observed_generation: status.observed_generation.unwrap_or(0),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The fake kubelet
// ---------------------------------------------------------------------------------------------

/// Whether the fake kubelet still has to start `pod`.
fn needs_start(pod: &Pod) -> bool {
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    pod.metadata.deletion_timestamp.is_none() && !(running && is_ready(pod))
}

/// Stands in for the kubelets envtest does not run: every Pod that appears is reported
/// `Running` with its `PodScheduled`, `ContainersReady` and `Ready` conditions `True`, through
/// the `pods/status` subresource. Needs no leader election (a kubelet is not a controller).
///
/// Registers a handler on `factory`'s Pod informer that feeds the runnable; call before the
/// factory starts.
pub fn fake_kubelet(factory: &SharedInformerFactory) -> Result<impl Runnable, ControllerError> {
    let pods = factory.core().v1().pods()?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let retry = tx.clone();
    let send = move |pod: &Pod| {
        if needs_start(pod)
            && let Ok(key) = meta_namespace_key(pod)
        {
            let _ = tx.send(key);
        }
    };
    let on_update = send.clone();
    pods.add_event_handler(
        ResourceEventHandlerFuncs::new()
            .on_add(move |pod: &Arc<Pod>, _| send(pod))
            .on_update(move |_, pod: &Arc<Pod>| on_update(pod)),
    )?;
    let cache = pods.informer().indexer().clone();
    let client = factory.client().clone();
    Ok(runnable_fn(
        "fake-kubelet",
        false,
        move |stop: CancellationToken| async move {
            loop {
                let key = tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    key = rx.recv() => match key {
                        Some(key) => key,
                        None => return Ok(()),
                    },
                };
                // The cache has the latest state: several notifications of one Pod start it once.
                let Some(pod) = cache.get_by_key(&key).filter(|p| needs_start(p)) else {
                    continue;
                };
                if let Err(e) = start_pod(&client, &pod).await {
                    // No event would bring the Pod back: queue it again after a pause.
                    tracing::debug!(pod = %key, error = %e, "fake kubelet: status update failed; retrying");
                    tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                    let _ = retry.send(key);
                }
            }
        },
    ))
}

/// Reports `pod` Running and Ready.
async fn start_pod(client: &Client, pod: &Pod) -> Result<(), kube::Error> {
    let now = Time(Timestamp::now());
    let condition = |type_: &str| PodCondition {
        type_: type_.into(),
        status: "True".into(),
        last_transition_time: Some(now.clone()),
        ..PodCondition::default()
    };
    let status = PodStatus {
        phase: Some("Running".into()),
        start_time: Some(now.clone()),
        conditions: Some(vec![
            condition("PodScheduled"),
            condition("ContainersReady"),
            condition("Ready"),
        ]),
        ..PodStatus::default()
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let patch = serde_json::json!({ "status": status });
    match api
        .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()), // deleted meanwhile
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::ReplicaSetSpec;
    use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kinformer::cache::Store;

    use super::*;

    fn owner(uid: &str, kind: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: "web".into(),
            uid: uid.into(),
            controller: Some(controller),
            ..OwnerReference::default()
        }
    }

    fn pod(name: &str, owners: Vec<OwnerReference>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                owner_references: Some(owners),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn with_status(mut pod: Pod, phase: &str, ready: bool, ready_since: Timestamp) -> Pod {
        pod.status = Some(PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                last_transition_time: Some(Time(ready_since)),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        pod
    }

    #[test]
    fn index_function_gives_the_controller_owner_uid_only() {
        assert_eq!(
            pod_controller_uid(&pod("a", vec![owner("u1", "ReplicaSet", true)])),
            ["u1"]
        );
        assert_eq!(
            pod_controller_uid(&pod(
                "a",
                vec![owner("u0", "Foo", false), owner("u1", "ReplicaSet", true)]
            )),
            ["u1"]
        );
        assert!(pod_controller_uid(&pod("a", vec![owner("u1", "ReplicaSet", false)])).is_empty());
        assert!(pod_controller_uid(&pod("a", vec![])).is_empty());
    }

    #[test]
    fn the_index_serves_a_replicasets_pods() {
        let mut indexers: Indexers<Pod> = Indexers::new();
        indexers.insert(POD_CONTROLLER_UID_INDEX.into(), Arc::new(pod_controller_uid));
        let cache = Indexer::new(indexers);
        cache
            .add(Arc::new(pod("a", vec![owner("u1", "ReplicaSet", true)])))
            .unwrap();
        cache
            .add(Arc::new(pod("b", vec![owner("u1", "ReplicaSet", true)])))
            .unwrap();
        cache
            .add(Arc::new(pod("c", vec![owner("u2", "ReplicaSet", true)])))
            .unwrap();
        cache.add(Arc::new(pod("orphan", vec![]))).unwrap();
        let mut names: Vec<String> = cache
            .by_index(POD_CONTROLLER_UID_INDEX, "u1")
            .unwrap()
            .iter()
            .map(|p| p.name_any())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn expectations_wait_for_every_creation() {
        let e = ControllerExpectations::default();
        assert!(e.satisfied("ns/rs"), "no expectations set: act");
        e.expect_creations("ns/rs", 3);
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        e.creation_observed("ns/rs");
        assert!(!e.satisfied("ns/rs"));
        assert_eq!(e.pending("ns/rs"), Some((1, 0)));
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs"));
        // A late observation (of a create reported failed) keeps it satisfied.
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs"));
        // Observing for a key that expects nothing creates nothing.
        e.creation_observed("ns/other");
        assert_eq!(e.pending("ns/other"), None);
    }

    #[test]
    fn deletions_count_only_the_pods_asked_for() {
        let e = ControllerExpectations::default();
        e.expect_deletions("ns/rs", ["ns/a".to_string(), "ns/b".to_string()]);
        e.deletion_observed("ns/rs", "ns/someone-elses");
        e.deletion_observed("ns/rs", "ns/a");
        e.deletion_observed("ns/rs", "ns/a"); // the same Pod seen terminating, then gone
        assert!(!e.satisfied("ns/rs"));
        assert_eq!(e.pending("ns/rs"), Some((0, 1)));
        e.deletion_observed("ns/rs", "ns/b");
        assert!(e.satisfied("ns/rs"));
    }

    #[test]
    fn new_expectations_replace_old_ones_and_delete_forgets() {
        let e = ControllerExpectations::default();
        e.expect_deletions("ns/rs", ["ns/a".to_string()]);
        e.expect_creations("ns/rs", 1);
        assert_eq!(e.pending("ns/rs"), Some((1, 0)));
        e.delete("ns/rs");
        assert!(e.satisfied("ns/rs"));
    }

    #[tokio::test(start_paused = true)]
    async fn expectations_expire() {
        let e = ControllerExpectations::with_timeout(Duration::from_secs(300));
        e.expect_creations("ns/rs", 1);
        assert!(!e.satisfied("ns/rs"));
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(!e.satisfied("ns/rs"), "not yet expired");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(e.satisfied("ns/rs"), "expired: no longer waited for");
    }

    #[test]
    fn the_observer_lowers_expectations_of_the_owning_replicaset() {
        let e = ControllerExpectations::default();
        let observer = ExpectationsObserver::new(e.clone());
        e.expect_creations("default/web", 2);
        observer.on_add(&Arc::new(pod("x", vec![owner("u1", "Deployment", true)])), false);
        observer.on_add(&Arc::new(pod("a", vec![owner("u1", "ReplicaSet", true)])), false);
        assert_eq!(e.pending("default/web"), Some((1, 0)));

        e.expect_deletions("default/web", ["default/a".to_string(), "default/b".to_string()]);
        let mut terminating = pod("a", vec![owner("u1", "ReplicaSet", true)]);
        terminating.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        let terminating = Arc::new(terminating);
        observer.on_update(&Arc::new(pod("a", vec![owner("u1", "ReplicaSet", true)])), &terminating);
        observer.on_delete(DeletedObject::Object(terminating));
        assert_eq!(e.pending("default/web"), Some((0, 1)));
        observer.on_delete(DeletedObject::Object(Arc::new(pod(
            "b",
            vec![owner("u1", "ReplicaSet", true)],
        ))));
        assert!(e.satisfied("default/web"));
    }

    fn replicaset(replicas: i32, min_ready_seconds: i32) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                generation: Some(4),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                min_ready_seconds: Some(min_ready_seconds),
                template: Some(PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some([("app".to_string(), "web".to_string())].into()),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec::default()),
                }),
                ..ReplicaSetSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn status_counts_labeled_ready_and_available_pods() {
        let rs = replicaset(3, 10);
        let now = Timestamp::now();
        let long_ago = now - SignedDuration::from_secs(60);
        let labeled = |mut p: Pod| {
            p.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
            p
        };
        let pods: Vec<Arc<Pod>> = vec![
            Arc::new(labeled(with_status(pod("a", vec![]), "Running", true, long_ago))),
            Arc::new(labeled(with_status(pod("b", vec![]), "Running", true, now))),
            Arc::new(with_status(pod("c", vec![]), "Pending", false, now)),
        ];
        let counts = ReplicaCounts::calculate(&rs, &pods, now);
        assert_eq!(
            counts,
            ReplicaCounts {
                replicas: 3,
                fully_labeled_replicas: 2,
                ready_replicas: 2,
                available_replicas: 1,
                observed_generation: 4,
            }
        );
    }

    #[test]
    fn inactive_pods_do_not_count() {
        let mut terminating = pod("a", vec![]);
        terminating.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert!(!is_active(&terminating));
        assert!(!is_active(&with_status(
            pod("b", vec![]),
            "Succeeded",
            false,
            Timestamp::now()
        )));
        assert!(!is_active(&with_status(
            pod("c", vec![]),
            "Failed",
            false,
            Timestamp::now()
        )));
        assert!(is_active(&with_status(
            pod("d", vec![]),
            "Running",
            true,
            Timestamp::now()
        )));
        assert!(is_active(&pod("e", vec![])));
    }

    #[test]
    fn pods_are_made_from_the_template_and_owned() {
        let rs = replicaset(1, 0);
        let pod = new_pod(&rs).unwrap();
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("web-"));
        assert_eq!(pod.metadata.name, None);
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("web"));
        let owner = &pod.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("ReplicaSet", "u1"));
        assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));
        let mut no_template = rs.clone();
        no_template.spec.as_mut().unwrap().template = None;
        assert!(new_pod(&no_template).is_none());
    }

    #[test]
    fn the_least_valuable_pods_are_deleted_first() {
        let now = Timestamp::now();
        let older = now - SignedDuration::from_secs(60);
        let created = |mut p: Pod, at: Timestamp| {
            p.metadata.creation_timestamp = Some(Time(at));
            p
        };
        let mut scheduled = with_status(pod("scheduled-pending", vec![]), "Pending", false, now);
        scheduled.spec = Some(PodSpec {
            node_name: Some("node-1".into()),
            ..PodSpec::default()
        });
        let mut pods = [
            created(with_status(pod("ready-old", vec![]), "Running", true, now), older),
            created(with_status(pod("ready-new", vec![]), "Running", true, now), now),
            with_status(pod("running-not-ready", vec![]), "Running", false, now),
            with_status(pod("pending", vec![]), "Pending", false, now),
            scheduled,
        ];
        pods.sort_by_key(deletion_rank);
        let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(
            names,
            [
                "pending",
                "running-not-ready",
                "ready-new",
                "ready-old",
                "scheduled-pending"
            ]
        );
    }
}
