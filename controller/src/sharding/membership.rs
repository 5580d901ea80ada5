//! Membership of a ring: each shard's own Lease (held and renewed here, on the shard), which
//! shards are live (read by the sharder from its Lease cache), and the sharder's fences.
//!
//! Where it sits: a sharded [`BuiltController`](crate::BuiltController) joins before its
//! workers start and leaves after they stopped; the [`Sharder`](super::Sharder) reads
//! [`live_shards`] whenever it assigns an object, and fences a gone shard's Lease
//! ([`RingMembership::fenced`]) before it moves that shard's objects.
//!
//! # Fences
//! A shard's id outlives its processes: a restarted replica takes the same Lease again. So the
//! sharder never moves a gone shard's objects on its cached view alone (the Lease may have been
//! taken again since, by a new incarnation with the same id): it first writes the annotation
//! [`FENCE_ANNOTATION`](super::FENCE_ANNOTATION) on the Lease, conditional on the
//! resourceVersion of a state in which the Lease was released, expired, absent (then it creates
//! it) or already fenced. Once that write succeeded no incarnation reconciles under the Lease:
//! a later acquirer finds the fence (the elector keeps a Lease's metadata) and waits. The
//! sharder moves the shard's objects while holding its fence (shared), then lifts it (alone: no
//! move in flight) once a LIST from the server finds no object labelled for the shard. A joining
//! shard waits, after acquiring its Lease, until the Lease carries no fence; a running shard
//! whose Lease gets fenced has lost it.
//!
//! # Deleting gone shards' Leases
//! A shard id may never come back (a restarted pod's name). So the running sharder deletes a
//! shard Lease once it has been released or expired for longer than its deletion grace
//! ([`Sharder::deletion_grace`](super::Sharder::deletion_grace), by default twice the lease
//! duration), carries no fence, and no object is labelled for its shard (its cache,
//! then a LIST), conditional on the resourceVersion it read: a shard that acquires the Lease
//! meanwhile keeps it, and one that comes back later creates it again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use tokio::sync::{RwLock, RwLockReadGuard};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{FENCE_ANNOTATION, RING_LABEL, ShardingConfig};
use crate::leader_election::{LeaderElectionConfig, LeaderElectionError, LeaderElector, default_identity};
use crate::leadership::Leadership;
use crate::reconciler::BoxError;

/// Whether this replica's shard is ready: it holds its shard Lease, unfenced, by its own clock,
/// and its run has listed the shard's objects (its workers may admit keys).
/// `Manager::add` serves it as the `/readyz` check `shard-<ring>` of a sharded controller; a
/// program without a Manager can poll [`ShardReadiness::check`] itself. Cheap to clone; every
/// clone sees the same state.
#[derive(Clone, Default)]
pub struct ShardReadiness(Arc<Mutex<Option<Leadership>>>);

impl std::fmt::Debug for ShardReadiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ShardReadiness").field(&self.check().is_ok()).finish()
    }
}

impl ShardReadiness {
    /// `Ok` while the shard has joined and its Lease's term is valid (renewed within
    /// `renew_deadline`): its workers may reconcile.
    pub fn check(&self) -> Result<(), BoxError> {
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(term) if term.is_valid() => Ok(()),
            Some(_) => Err("the shard lease could not be renewed".into()),
            None => Err("the shard does not hold its shard lease".into()),
        }
    }

    fn set(&self, term: Option<Leadership>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = term;
    }
}

/// Whether `lease` carries the sharder's fence: its shard's objects are being moved away, and
/// no incarnation of the shard may reconcile until the sharder lifts it.
pub(crate) fn is_fenced(lease: &Lease) -> bool {
    lease
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(FENCE_ANNOTATION))
}

/// How long `lease` stays held by its holder at `now` (wall clock, by its `renewTime`), if it is
/// held and not expired.
fn held_for(lease: &Lease, now: jiff::Timestamp) -> Option<Duration> {
    let spec = lease.spec.as_ref()?;
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
    let duration = jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds?));
    let expires = spec.renew_time.as_ref()?.0.checked_add(duration).ok()?;
    let left = now.duration_until(expires);
    left.is_positive().then(|| Duration::try_from(left).ok()).flatten()
}

/// The shards among `leases` of `ring` that are live at `now` (wall clock), each named by its
/// Lease (`<ring>-<shard>`): their Lease names a holder, was renewed less than
/// `leaseDurationSeconds` ago by its `renewTime`, and carries no fence. Sorted, without
/// duplicates. Like kubernetes-controller-sharding, this trusts the shards' clocks to agree
/// with the sharder's within the lease duration's margin over the renew deadline (client-go's
/// leader election instead times a lease from when it saw it change, which a sharder that just
/// started could not do for the shards' leases).
pub fn live_shards(leases: &[Arc<Lease>], ring: &str, now: jiff::Timestamp) -> Vec<String> {
    let prefix = format!("{ring}-");
    let mut live: Vec<String> = leases
        .iter()
        .filter_map(|lease| {
            // The shard is named by its Lease (`<ring>-<shard>`), not by the holder: a Lease
            // another holder took keeps its shard live until it expires, by which time the
            // shard that lost it has stopped (its term ended `renew_deadline` after its last
            // renewal).
            let shard = lease.metadata.name.as_deref()?.strip_prefix(&prefix)?;
            held_for(lease, now)?;
            (!is_fenced(lease)).then(|| shard.to_owned())
        })
        .collect();
    live.sort_unstable();
    live.dedup();
    live
}

/// The sharder's view of a ring's membership: what it remembers of each shard's Lease (when it
/// expires, by its last renewal seen) and the fences it holds (see the [module docs](self)).
///
/// A Lease deleted by someone (its shard's elector may even recreate it, unlabelled) keeps its
/// shard live until its remembered expiry, as if it had not been renewed since, so the shard
/// has time to notice and stop ([`ShardMembership::join`] checks its Lease) before its objects
/// move.
pub(crate) struct RingMembership {
    expiries: Mutex<HashMap<String, jiff::Timestamp>>,
    fences: RwLock<Fences>,
    leases: Api<Lease>,
    /// The ring's primary type, for the LIST that precedes lifting a fence.
    objects: Api<DynamicObject>,
    config: ShardingConfig,
    /// How long a shard Lease must have been free before it is deleted (longer than the lease
    /// duration: checked by the [`Sharder`](super::Sharder)).
    deletion_grace: Duration,
    /// The term the sharder's reconciles last ran under: the membership check, which runs on
    /// every replica, takes over and lifts fences only while it is valid.
    term: Mutex<Option<Leadership>>,
}

/// The fences a sharder holds.
#[derive(Default)]
pub(crate) struct Fences {
    /// The shards this sharder fenced, with the value of its fence annotation.
    held: HashMap<String, String>,
    /// Shards whose Lease was found live on the server: not fenced again before then.
    refused_until: HashMap<String, tokio::time::Instant>,
}

impl Fences {
    /// How long `shard` is still not to be fenced at `now`, if its Lease was found held; drops
    /// every refusal that has run out, so shards that never come back leave no entry.
    fn refused(&mut self, shard: &str, now: tokio::time::Instant) -> Option<Duration> {
        self.refused_until.retain(|_, until| *until > now);
        self.refused_until.get(shard).map(|until| *until - now)
    }
}

/// What [`RingMembership::fenced`] found.
pub(crate) enum Fence<'a> {
    /// This sharder's fence on the shard's Lease is in place: moves of its objects may be written
    /// while this is held (the fence is not lifted meanwhile).
    Held {
        /// Shared: lifting a fence takes them alone.
        _guard: RwLockReadGuard<'a, Fences>,
    },
    /// Not fenced: the Lease is held on the server (an incarnation the sharder's cache has not
    /// seen yet, or one of an unlabelled Lease), or it changed under the write. Decide again
    /// after this long (a membership change re-examines the objects sooner).
    NotYet(Duration),
}

impl RingMembership {
    /// The membership of `config`'s ring, whose primary type is `resource`, deleting the Leases
    /// of shards gone for longer than `deletion_grace`.
    pub(crate) fn new(
        client: Client,
        config: &ShardingConfig,
        resource: &ApiResource,
        deletion_grace: Duration,
    ) -> Self {
        RingMembership {
            expiries: Mutex::default(),
            fences: RwLock::default(),
            leases: Api::namespaced(client.clone(), &config.namespace),
            objects: Api::all_with(client, resource),
            config: config.clone(),
            deletion_grace,
            term: Mutex::default(),
        }
    }

    /// The shards among `leases` whose Lease has been free for longer than the deletion grace at
    /// `now` and carries no fence: candidates for [`delete_gone`](Self::delete_gone).
    pub(crate) fn gone_shards(&self, leases: &[Arc<Lease>], now: jiff::Timestamp) -> Vec<String> {
        let prefix = format!("{}-", self.config.ring);
        leases
            .iter()
            .filter(|lease| gone_longer_than(lease, self.deletion_grace, now))
            .filter_map(|lease| Some(lease.metadata.name.as_deref()?.strip_prefix(&prefix)?.to_owned()))
            .collect()
    }

    /// Records the term the sharder's reconciles run under (each reconcile calls it).
    pub(crate) fn running_under(&self, term: &Leadership) {
        *self.term.lock().unwrap_or_else(|p| p.into_inner()) = Some(term.clone());
    }

    /// Whether this replica's sharder runs (its reconciles' term is valid): only then may the
    /// membership check write fences.
    pub(crate) fn is_running(&self) -> bool {
        self.term
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(Leadership::is_valid)
    }

    /// [`live_shards`] of `leases`, plus the shards whose Lease vanished from `leases` before
    /// its last known expiry.
    pub(crate) fn live(&self, leases: &[Arc<Lease>], ring: &str, now: jiff::Timestamp) -> Vec<String> {
        let prefix = format!("{ring}-");
        let mut memory = self.expiries.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = HashSet::new();
        for lease in leases {
            let Some(shard) = lease.metadata.name.as_deref().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            present.insert(shard.to_owned());
            let spec = lease.spec.as_ref();
            let held = spec
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| !h.is_empty());
            let expiry = spec.and_then(|s| {
                let duration = jiff::SignedDuration::from_secs(i64::from(s.lease_duration_seconds?));
                s.renew_time.as_ref()?.0.checked_add(duration).ok()
            });
            match (held, expiry) {
                (true, Some(expiry)) if !is_fenced(lease) => {
                    memory.insert(shard.to_owned(), expiry);
                }
                // Released (after its workers stopped), fenced or malformed: gone at once.
                _ => {
                    memory.remove(shard);
                }
            }
        }
        memory.retain(|_, expiry| *expiry > now);
        let mut live = live_shards(leases, ring, now);
        live.extend(memory.keys().filter(|shard| !present.contains(*shard)).cloned());
        live.sort_unstable();
        live.dedup();
        live
    }

    /// This sharder's fence on `shard`'s Lease, written first if it holds none (see the
    /// [module docs](self)): while [`Fence::Held`] is held, `shard` cannot be reconciling, so
    /// its objects may be relabelled without a drain.
    pub(crate) async fn fenced(&self, shard: &str) -> Result<Fence<'_>, kube::Error> {
        // Twice at most: the fence written by the first round may be lifted before the second
        // reads it (the object then is no longer labelled for the shard on the server).
        for _ in 0..2 {
            {
                let fences = self.fences.read().await;
                if fences.held.contains_key(shard) {
                    return Ok(Fence::Held { _guard: fences });
                }
            }
            if let Some(wait) = self.fence(shard, false).await? {
                return Ok(Fence::NotYet(wait));
            }
        }
        Ok(Fence::NotYet(self.config.membership_check_interval))
    }

    /// Writes this sharder's fence on `shard`'s Lease if the server's Lease is not held (absent,
    /// released, expired) or already fenced (only the latter with `only_fenced`): conditional on
    /// the resourceVersion read (a create if absent). `None`: fenced; `Some(wait)`: not, decide
    /// again after `wait`.
    async fn fence(&self, shard: &str, only_fenced: bool) -> Result<Option<Duration>, kube::Error> {
        let mut fences = self.fences.write().await;
        if fences.held.contains_key(shard) {
            return Ok(None);
        }
        let now = tokio::time::Instant::now();
        if let Some(wait) = fences.refused(shard, now) {
            return Ok(Some(wait));
        }
        let (ring, name) = (&self.config.ring, format!("{}-{shard}", self.config.ring));
        let token = jiff::Timestamp::now().to_string();
        let written = match self.leases.get_opt(&name).await? {
            None if only_fenced => return Ok(Some(self.config.membership_check_interval)),
            Some(lease) if only_fenced && !is_fenced(&lease) => {
                return Ok(Some(self.config.membership_check_interval));
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        labels: Some(BTreeMap::from([(RING_LABEL.to_owned(), ring.clone())])),
                        annotations: Some(BTreeMap::from([(FENCE_ANNOTATION.to_owned(), token.clone())])),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec::default()),
                };
                self.leases.create(&PostParams::default(), &lease).await.map(|_| ())
            }
            Some(lease) => {
                if !is_fenced(&lease)
                    && let Some(left) = held_for(&lease, jiff::Timestamp::now())
                {
                    // Held on the server: renewed by an incarnation the Lease cache has not
                    // shown yet (it becomes live), or by one whose Lease lost the ring label
                    // (it stops within a retry period, and the Lease expires).
                    let wait = left.clamp(self.config.membership_check_interval, self.config.lease_duration);
                    debug!(ring = %ring, shard, lease = %name, ?wait, "shard lease held on the server: not fenced");
                    fences.refused_until.insert(shard.to_owned(), now + wait);
                    return Ok(Some(wait));
                }
                let patch = serde_json::json!({"metadata": {
                    "resourceVersion": lease.metadata.resource_version,
                    "labels": {RING_LABEL: ring},
                    "annotations": {FENCE_ANNOTATION: token},
                }});
                self.leases
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
        };
        match written {
            Ok(()) => {
                info!(ring = %ring, shard, lease = %name, fence = %token,
                    "fenced the shard lease: moving the shard's objects");
                fences.refused_until.remove(shard);
                fences.held.insert(shard.to_owned(), token);
                Ok(None)
            }
            // The Lease changed (renewed, taken) or was created meanwhile: decide again.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                debug!(ring = %ring, shard, lease = %name, "shard lease changed while fencing it: not fenced");
                Ok(Some(self.config.membership_check_interval))
            }
            Err(e) => Err(e),
        }
    }

    /// Takes over the fences among `leases` that this sharder does not hold (written by a
    /// sharder that lost its leadership before lifting them), so that it lifts them once their
    /// shards' objects moved: a shard waiting on one would wait forever otherwise.
    pub(crate) async fn adopt_fences(&self, leases: &[Arc<Lease>]) {
        let prefix = format!("{}-", self.config.ring);
        for lease in leases.iter().filter(|lease| is_fenced(lease)) {
            let Some(shard) = lease.metadata.name.as_deref().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            if self.fences.read().await.held.contains_key(shard) {
                continue;
            }
            if let Err(e) = self.fence(shard, true).await {
                warn!(ring = %self.config.ring, shard, error = %e, "taking over a shard lease's fence failed");
            }
        }
    }

    /// The shards this sharder holds a fence on.
    pub(crate) async fn fenced_shards(&self) -> Vec<String> {
        self.fences.read().await.held.keys().cloned().collect()
    }

    /// Whether no object of the ring's primary type is labelled for `shard` on the server (a
    /// LIST of at most one). A failed LIST is logged as about a `kind` shard's objects, saying
    /// what `stays`, and answers `false`: the next membership check tries again.
    async fn none_labelled_for(&self, shard: &str, kind: &str, stays: &str) -> bool {
        let selector = format!("{}={shard}", self.config.shard_label());
        match self
            .objects
            .list_metadata(&ListParams::default().labels(&selector).limit(1))
            .await
        {
            Ok(list) => list.items.is_empty(),
            Err(e) => {
                warn!(ring = %self.config.ring, shard, error = %e, "listing a {kind} shard's objects failed: {stays}");
                false
            }
        }
    }

    /// Lifts this sharder's fence on `shard` if no object of the ring's primary type is labelled
    /// for it on the server (a LIST), holding the fences alone so no move under it is in flight:
    /// the shard's next incarnation may then start. Errors are logged; the next membership check
    /// tries again.
    pub(crate) async fn lift(&self, shard: &str) {
        let mut fences = self.fences.write().await;
        let Some(token) = fences.held.get(shard).cloned() else {
            return;
        };
        if !self.none_labelled_for(shard, "fenced", "the fence stays").await {
            return; // a move still to make (a conflict requeued it), or the LIST failed
        }
        let (ring, name) = (&self.config.ring, format!("{}-{shard}", self.config.ring));
        // Conditional on the resourceVersion read, and only if the fence is still this one; a
        // conflict (a renewal) reads again, a few times per membership check.
        for attempt in 1..=5 {
            let lease = match self.leases.get_opt(&name).await {
                Ok(Some(lease)) => lease,
                Ok(None) => {
                    debug!(ring = %ring, shard, lease = %name, "fenced shard lease deleted: nothing to lift");
                    break;
                }
                Err(e) => {
                    warn!(ring = %ring, shard, lease = %name, error = %e, "reading a fenced shard lease failed: the fence stays");
                    return;
                }
            };
            let ours = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(FENCE_ANNOTATION))
                == Some(&token);
            if !ours {
                // Lifted or fenced again by another sharder: not this one's to lift.
                debug!(ring = %ring, shard, lease = %name, "the shard lease carries another fence: not lifted");
                break;
            }
            let patch = serde_json::json!({"metadata": {
                "resourceVersion": lease.metadata.resource_version,
                "annotations": {FENCE_ANNOTATION: null},
            }});
            match self
                .leases
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    info!(ring = %ring, shard, lease = %name, "moved every object of the fenced shard: fence lifted");
                    break;
                }
                Err(kube::Error::Api(status)) if status.code == 409 && attempt < 5 => continue,
                Err(e) => {
                    warn!(ring = %ring, shard, lease = %name, error = %e, "lifting the fence failed: the fence stays");
                    return;
                }
            }
        }
        fences.held.remove(shard);
    }

    /// Deletes `shard`'s Lease if, on the server, it has been free for longer than the
    /// deletion grace, carries no fence, and no object of the ring's primary type is
    /// labelled for the shard (a LIST): a shard id that does not come back (a restarted pod's
    /// name) leaves no Lease behind. Holds the fences alone (no fence is written meanwhile) and
    /// deletes conditional on the resourceVersion read, so a shard acquiring the Lease meanwhile
    /// keeps it (its elector creates the Lease again if it comes back later). Errors are
    /// logged; the next membership check tries again.
    pub(crate) async fn delete_gone(&self, shard: &str) {
        let fences = self.fences.write().await;
        if fences.held.contains_key(shard) {
            return;
        }
        if !self.none_labelled_for(shard, "gone", "its lease stays").await {
            return; // a move still to make, or the LIST failed
        }
        let (ring, name) = (&self.config.ring, format!("{}-{shard}", self.config.ring));
        let lease = match self.leases.get_opt(&name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return,
            Err(e) => {
                warn!(ring = %ring, shard, lease = %name, error = %e, "reading a gone shard's lease failed: it stays");
                return;
            }
        };
        if !gone_longer_than(&lease, self.deletion_grace, jiff::Timestamp::now()) {
            return;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match self.leases.delete(&name, &params).await {
            Ok(_) => {
                info!(ring = %ring, shard, lease = %name, "deleted the lease of a shard gone longer than the grace");
            }
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                debug!(ring = %ring, shard, lease = %name, "the gone shard's lease changed while deleting it: kept");
            }
            Err(e) => {
                warn!(ring = %ring, shard, lease = %name, error = %e, "deleting a gone shard's lease failed");
            }
        }
        drop(fences);
    }
}

/// Whether `lease` has been free (released, or expired by its `renewTime`; a Lease with no
/// renewal by its creation) for longer than `grace` at `now`, and carries no fence.
fn gone_longer_than(lease: &Lease, grace: Duration, now: jiff::Timestamp) -> bool {
    if is_fenced(lease) {
        return false;
    }
    let spec = lease.spec.as_ref();
    let held = spec
        .and_then(|s| s.holder_identity.as_deref())
        .is_some_and(|h| !h.is_empty());
    let since = spec
        .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
        .map(|t| t.0)
        .or_else(|| lease.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let Some(since) = since else {
        return false;
    };
    // A held Lease is free once it expires; a released one (holder empty) since its renewal.
    let duration = if held {
        spec.and_then(|s| s.lease_duration_seconds).unwrap_or(0)
    } else {
        0
    };
    let Ok(grace) = jiff::SignedDuration::try_from(grace) else {
        return false;
    };
    since
        .checked_add(jiff::SignedDuration::from_secs(i64::from(duration)))
        .and_then(|free| free.checked_add(grace))
        .is_ok_and(|deadline| deadline < now)
}

/// The earliest instant one of the live `leases` expires, if none is renewed before.
pub(crate) fn next_expiry(leases: &[Arc<Lease>], now: jiff::Timestamp) -> Option<Duration> {
    leases
        .iter()
        .filter(|lease| !is_fenced(lease))
        .filter_map(|lease| held_for(lease, now))
        .min()
}

/// This shard's Lease: joined (acquired and labelled) before the workers start, renewed while
/// they run, released after they stopped.
///
/// The Lease is named for the shard (`<ring>-<shard-id>`, which is how the sharder knows whose it
/// is), but held under an identity of this membership's own, `<shard-id>_<uuid>`
/// ([`shard_identity`]), as client-go's leader election builds one per process: two processes
/// started with the same shard id (a misconfigured Deployment, a restarted pod whose previous
/// process still runs) are two candidates for one Lease, and only the holder reconciles. The
/// other waits in [`join`](Self::join), not ready, until the Lease is released or expires.
pub(crate) struct ShardMembership {
    elector: LeaderElector,
    leases: Api<Lease>,
    config: ShardingConfig,
    /// This membership's holder identity, `<shard-id>_<uuid>`.
    identity: String,
    /// The sharded controller's name, in every log line.
    controller: String,
}

/// A holder identity for a membership of shard `shard_id`, unique per call: `<shard-id>_<uuid>`
/// (the random UUID of [`default_identity`], after its last `_`; a UUID has none). The shard id
/// in front is for people reading `kubectl get leases`; nothing parses it.
fn shard_identity(shard_id: &str) -> String {
    let identity = default_identity();
    let uuid = identity.rsplit_once('_').map_or(identity.as_str(), |(_, uuid)| uuid);
    format!("{shard_id}_{uuid}")
}

/// The renewal of a joined shard's Lease: a task, stopped (and the Lease released) by
/// [`ShardMembership::leave`], aborted (the Lease then expires) if dropped.
pub(crate) struct Renewing {
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), String>>>,
}

impl Drop for Renewing {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl ShardMembership {
    /// The membership of `config`'s shard for the controller named `controller`; checks the
    /// Lease timing. Makes no request.
    pub(crate) fn new(
        client: kube::Client,
        config: &ShardingConfig,
        controller: &str,
    ) -> Result<Self, LeaderElectionError> {
        let identity = shard_identity(&config.shard_id);
        let election = LeaderElectionConfig::new(&config.namespace, config.lease_name(), identity.clone())
            .lease_duration(config.lease_duration)
            .renew_deadline(config.renew_deadline)
            .retry_period(config.retry_period)
            .release_on_cancel(true);
        Ok(ShardMembership {
            elector: LeaderElector::new(client.clone(), election)?,
            leases: Api::namespaced(client, &config.namespace),
            config: config.clone(),
            identity,
            controller: controller.to_owned(),
        })
    }

    /// Acquires the shard's Lease and labels it with the ring (retried every `retry_period`),
    /// renews it in a task, and waits until the Lease carries no fence (the sharder lifts it
    /// once it moved every object of this shard's previous incarnation). `None` if `shutdown`
    /// fired first (a Lease acquired meanwhile is released). A Lease lost meanwhile ends the
    /// returned term at once ([`leave`](Self::leave) says why). The shard is not reported ready
    /// yet: [`ready`](Self::ready) does that.
    pub(crate) async fn join(&self, shutdown: &CancellationToken) -> Option<(Leadership, Renewing)> {
        if !self.elector.acquire(shutdown).await {
            return None;
        }
        // The run's term: the Lease's, ended early if the Lease is found deleted, taken or
        // fenced.
        let term = self.elector.leadership().narrowed();
        let stop = CancellationToken::new();
        let labelled = CancellationToken::new();
        let unfenced = CancellationToken::new();
        let task = tokio::spawn({
            let (elector, stop, term) = (self.elector.clone(), stop.clone(), term.clone());
            let watch = watch_lease(
                self.leases.clone(),
                self.config.clone(),
                self.identity.clone(),
                self.controller.clone(),
                stop.clone(),
                labelled.clone(),
                unfenced.clone(),
            );
            async move {
                tokio::select! {
                    renewed = elector.renew(&stop) => renewed.map_err(|e| e.to_string()),
                    reason = watch => {
                        term.token().cancel();
                        Err(reason)
                    }
                }
            }
        });
        let renewing = Renewing { stop, task: Some(task) };
        let label = serde_json::json!({"metadata": {"labels": {RING_LABEL: self.config.ring}}});
        loop {
            match self
                .leases
                .patch(
                    &self.config.lease_name(),
                    &PatchParams::default(),
                    &Patch::Merge(&label),
                )
                .await
            {
                Ok(_) => break,
                Err(e) => {
                    warn!(controller = %self.controller, ring = %self.config.ring, shard = %self.config.shard_id, error = %e,
                        "failed to label the shard lease: retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => {
                            self.leave(renewing).await;
                            return None;
                        }
                        () = tokio::time::sleep(self.config.retry_period) => {}
                    }
                }
            }
        }
        labelled.cancel();
        tokio::select! {
            () = unfenced.cancelled() => {
                info!(controller = %self.controller, ring = %self.config.ring, shard = %self.config.shard_id, lease = %self.config.lease_name(),
                    identity = %self.identity, "joined the ring");
            }
            // Lost before the fence was lifted: the run ends at once, and leave() says why.
            () = term.token().cancelled() => {}
            () = shutdown.cancelled() => {
                self.leave(renewing).await;
                return None;
            }
        }
        Some((term, renewing))
    }

    /// Reports the shard ready ([`ShardReadiness`]) for as long as `term` is valid: called once
    /// the joined run took its LIST of the shard's objects, before its workers start.
    pub(crate) fn ready(&self, term: &Leadership) {
        self.config.readiness.set(Some(term.clone()));
    }

    /// Stops renewing and releases the Lease (if still held): the sharder moves this shard's
    /// objects at once. Returns why the Lease was lost, if the renewal had failed before.
    pub(crate) async fn leave(&self, mut renewing: Renewing) -> Option<String> {
        self.config.readiness.set(None);
        renewing.stop.cancel();
        let mut lost = None;
        if let Some(task) = renewing.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(controller = %self.controller, ring = %self.config.ring, shard = %self.config.shard_id, error = %e,
                        "the shard lease was lost before leaving");
                    lost = Some(e);
                }
                Err(e) if e.is_panic() => {
                    warn!(controller = %self.controller, ring = %self.config.ring, shard = %self.config.shard_id,
                        "the shard lease renewal panicked");
                    lost = Some("the shard lease renewal panicked".into());
                }
                Err(_) => {}
            }
        }
        info!(controller = %self.controller, ring = %self.config.ring, shard = %self.config.shard_id, "left the ring");
        lost
    }
}

/// Why the shard's Lease, as read (`None`: absent), is no longer this membership's: deleted (its
/// elector would recreate it, without the ring's label, unseen by the sharder), unlabelled, held
/// by another identity (another process with the same shard id among them: only the holder
/// `identity` reconciles). `Ok(fenced)` otherwise.
fn check_lease(lease: Option<Lease>, config: &ShardingConfig, identity: &str) -> Result<bool, String> {
    let name = config.lease_name();
    let Some(lease) = lease else {
        return Err(format!("shard lease {name} was deleted"));
    };
    if lease.metadata.labels.as_ref().and_then(|l| l.get(RING_LABEL)) != Some(&config.ring) {
        return Err(format!(
            "shard lease {name} lost its {RING_LABEL} label (deleted and recreated?)"
        ));
    }
    let fenced = is_fenced(&lease);
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    if holder != identity {
        return Err(format!("shard lease {name} is held by {holder:?}"));
    }
    Ok(fenced)
}

/// Reads the shard's Lease once `labelled` fired, until `stop`: first until it carries no fence
/// (then fires `unfenced`), then every `retry_period`. Returns why the shard lost it (see
/// [`check_lease`]; a fence once joined: the sharder judged the shard gone and is moving its
/// objects). A failed read proves nothing (the renewal's deadline covers an unreachable server).
/// Never returns once `stop` fired.
async fn watch_lease(
    leases: Api<Lease>,
    config: ShardingConfig,
    identity: String,
    controller: String,
    stop: CancellationToken,
    labelled: CancellationToken,
    unfenced: CancellationToken,
) -> String {
    tokio::select! {
        () = labelled.cancelled() => {}
        () = stop.cancelled() => std::future::pending::<()>().await,
    }
    let name = config.lease_name();
    let (mut first, mut waiting_logged) = (true, false);
    loop {
        if !first {
            tokio::select! {
                () = stop.cancelled() => std::future::pending::<()>().await,
                () = tokio::time::sleep(config.retry_period) => {}
            }
        }
        first = false;
        let lease = match leases.get_opt(&name).await {
            Ok(lease) => lease,
            Err(e) => {
                debug!(controller = %controller, ring = %config.ring, lease = %name, error = %e, "reading the shard lease failed");
                continue;
            }
        };
        match check_lease(lease, &config, &identity) {
            Err(reason) => return reason,
            Ok(true) if unfenced.is_cancelled() => {
                return format!("shard lease {name} was fenced by the sharder (it judged this shard gone)");
            }
            Ok(true) => {
                if !waiting_logged {
                    info!(controller = %controller, ring = %config.ring, shard = %config.shard_id, lease = %name,
                        "the sharder is moving the objects of this shard's previous incarnation: waiting for it to lift the fence");
                }
                waiting_logged = true;
            }
            Ok(false) => unfenced.cancel(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_membership_holds_its_shard_lease_under_an_identity_of_its_own() {
        let (a, b) = (shard_identity("shard-0"), shard_identity("shard-0"));
        assert_ne!(a, b, "two runs of one shard id are two candidates");
        for identity in [&a, &b] {
            let uuid = identity.strip_prefix("shard-0_").expect("<shard-id>_<uuid>");
            assert_eq!((uuid.len(), uuid.matches('-').count()), (36, 4), "{identity}");
        }
        let config = ShardingConfig::new("cms", "shard-0");
        let lease = |holder: &str| Lease {
            metadata: ObjectMeta {
                name: Some(config.lease_name()),
                labels: Some(BTreeMap::from([(RING_LABEL.to_owned(), "cms".to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                ..LeaseSpec::default()
            }),
        };
        assert_eq!(check_lease(Some(lease(&a)), &config, &a), Ok(false));
        // Held by the other process with the same shard id, or by the bare shard id: not ours.
        let err = check_lease(Some(lease(&b)), &config, &a).unwrap_err();
        assert!(err.contains(&b), "{err}");
        assert!(check_lease(Some(lease("shard-0")), &config, &a).is_err());
    }

    #[test]
    fn refusals_that_ran_out_are_dropped() {
        let now = tokio::time::Instant::now();
        let mut fences = Fences::default();
        fences.refused_until.insert("a".into(), now + Duration::from_secs(2));
        fences.refused_until.insert("gone".into(), now + Duration::from_secs(1));
        assert_eq!(fences.refused("a", now), Some(Duration::from_secs(2)));
        let later = now + Duration::from_millis(1500);
        assert_eq!(fences.refused("a", later), Some(Duration::from_millis(500)));
        // The shard that was never asked about again is gone from the map.
        assert_eq!(fences.refused_until.len(), 1);
        assert_eq!(fences.refused("a", now + Duration::from_secs(3)), None);
        assert!(fences.refused_until.is_empty());
    }
}
