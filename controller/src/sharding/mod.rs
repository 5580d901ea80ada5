//! Controller sharding across replicas, with Kubernetes itself as the coordination engine
//! (the design of the kubernetes-controller-sharding project): Leases for membership, labels
//! for assignment, label-selector watches so each replica caches only its own objects.
//! Opt-in per controller: [`ControllerBuilder::sharded`](crate::ControllerBuilder::sharded).
//!
//! Where it sits in the data path: before the informers (each shard's informers of the ring's
//! types select on the shard's label, so objects of other shards never reach its cache or
//! queue) and in the worker (a key whose object is draining is handed over instead of
//! reconciled). The [`Sharder`], run by the elected leader, writes the labels.
//!
//! ```text
//!  shard Lease "<ring>-<shard>"  ──(renewed by each shard)──▶  Sharder (leader): live shards
//!                                                                  │ rendezvous hash
//!                                                                  ▼
//!  object.labels["shard.kinformer.io/<ring>"] = <shard>   ◀── labels new / moved objects
//!        │ label-selector watch
//!        ▼
//!  shard's informer ─▶ queue ─▶ worker ─▶ Reconciler          (only its own objects)
//! ```
//!
//! # Membership (`membership.rs`)
//! Each shard holds a Lease of its own, `<ring>-<shard-id>` in the configured namespace,
//! labelled `sharding.kinformer.io/ring: <ring>`, through the same [`LeaderElector`] as the
//! leader lease (renewed every `retry_period`, valid for `renew_deadline` by the shard's own
//! clock). Its holder identity is `<shard-id>_<uuid>`, new for every run (as client-go's
//! leader election makes one per process): two processes started with the same shard id (a
//! misconfigured Deployment, a restarted pod whose previous process still runs) contend for
//! one Lease, and only the one whose identity the Lease names reconciles; the other waits, not
//! ready, until the Lease is released or expires. Nothing parses the holder: the Lease's name
//! says whose shard it is. A shard whose Lease names no holder (released) or was not renewed for
//! `leaseDurationSeconds` (by its `renewTime`) is gone. The shard's reconciles run under that
//! lease's term ([`Leadership`](crate::Leadership)): a shard that cannot renew stops
//! reconciling before the sharder may consider it gone. A shard is named by its Lease, not its
//! holder: a Lease taken by another holder keeps the shard live until it expires. A shard that
//! lost its Lease while running does not rejoin in place: its workers stop at once and its run
//! returns [`ControllerError::ShardLeaseLost`](crate::ControllerError::ShardLeaseLost), so its
//! [`Manager`](crate::Manager) shuts down and fails (as on losing the leader lease) and the
//! restarted process joins as a fresh member. The shard also reads its Lease every
//! `retry_period`: deleted (its elector would recreate it without the ring's label), unlabelled,
//! held by another identity or fenced, it is lost so. The sharder remembers each shard Lease's
//! last known expiry: a Lease that vanished keeps its shard live until then, so the shard
//! notices first.
//! A Lease carrying the sharder's fence ([`FENCE_ANNOTATION`], see the handover below) is not
//! live, even held: its holder waits for the sharder to lift it.
//!
//! A person reads the ring's membership with
//!
//! ```text
//! kubectl get leases -n <namespace> -l sharding.kinformer.io/ring=<ring> \
//!   -o custom-columns='SHARD:.metadata.name,HOLDER:.spec.holderIdentity,RENEWED:.spec.renewTime,FENCED:.metadata.annotations.sharding\.kinformer\.io/fenced'
//! ```
//!
//! one row per shard: its Lease `<ring>-<shard-id>`, the holder `<shard-id>_<uuid>` (empty once
//! released), its last renewal (gone once older than `leaseDurationSeconds`) and when the
//! sharder fenced it (`<none>`: not fenced). (`tests/sharding.rs` runs this command.)
//!
//! # Assignment (`ring.rs`, `sharder.rs`)
//! The sharder watches the ring's primary type (metadata only) and the shard Leases, and
//! labels each object `shard.kinformer.io/<ring>: <shard-id>`, the live shard of highest
//! rendezvous weight for its `namespace/name`. New objects are labelled as their watch event
//! arrives; a membership change (seen in the Lease cache, checked every
//! `membership_check_interval` and at each live Lease's expiry) re-examines every object from
//! the sharder's cache. Objects of
//! the [`owned`](Sharder::owns) types carry their controller owner's label, written before the
//! owner's: a new shard's first reconcile of an object finds its children cached.
//!
//! # Handover without overlap (`drain.rs`)
//! Invariant: **at no instant do two shards reconcile the same object.**
//! 1. To move an object from a live shard, the sharder only adds
//!    `drain.shard.kinformer.io/<ring>: "true"` (and, in the same patch, the annotation
//!    `sharding.kinformer.io/drain-started`, the drain's start for the metrics; step 3's
//!    assignment removes it).
//! 2. The old shard's worker takes the key (the drain label's change is queued, at normal
//!    priority, whatever the controller's event filters and its source's predicates say: it is
//!    a label-only change that `GenerationChanged` and most update filters reject, and
//!    filtered out the object would stay draining; one worker per key, so no reconcile of it
//!    runs then), does not reconcile it, and removes both labels, conditional on the
//!    resourceVersion it read. It remembers the key as handed
//!    over: a later retry or delete notification of it is not reconciled.
//! 3. The object leaves the old shard's label selector (its watch sends a delete) and the
//!    sharder, seeing it unlabelled, assigns the new shard.
//!
//! A shard whose Lease expired or was released cannot be reconciling (its own term ended
//! first, `renew_deadline < lease_duration`; a released lease comes after its workers
//! stopped), so its objects are relabelled without a drain, but only under a *fence*: the id
//! outlives the process, and a restarted replica takes the same Lease again, perhaps after the
//! sharder's cache last showed it. So:
//! 4. Before moving a gone shard's objects, the sharder writes the annotation
//!    [`FENCE_ANNOTATION`] on its Lease, conditional on the resourceVersion of a state in which
//!    it was released, expired, absent (a create) or fenced already. A conflict (the Lease was
//!    renewed meanwhile) means no fence and no move: the object is decided again.
//! 5. A shard that acquires its Lease waits until the Lease carries no fence before its workers
//!    start (the elector keeps the Lease's metadata, so an acquirer finds the fence); a running
//!    shard whose Lease gets fenced has lost it.
//! 6. The sharder moves the objects while holding its fence (shared), and lifts it (alone, so no
//!    such move is in flight) once its cache and then a LIST from the server show no object
//!    labelled for the shard.
//! 7. A shard's cache may still show objects moved away before it joined: a run reconciles a
//!    cached object only once it knows the server had it labelled for this shard after the
//!    join. Right after the join, before it reports ready or a worker admits a key, the run
//!    LISTs the shard's objects (metadata, paged, one snapshot at resourceVersion `R`): a
//!    listed key is confirmed, and so is a cached copy newer than `R`; an older copy not listed
//!    is stale and skipped (its departure is on the way). From then on the object leaves the
//!    shard only by the shard's own acknowledgement (2) or the shard's death. The deletion of an
//!    object labelled for the shard, not draining, after `R` is the shard's to reconcile even if
//!    no worker took its key while it was cached (a *tombstone*, `drain.rs`'s `# Deletions`,
//!    which also says which deletions no shard reconciles).
//!
//! Every label write carries the resourceVersion it was computed from: a concurrent change
//! makes it fail with a conflict and it is computed again. No home-made consensus: Leases,
//! labels, annotations, optimistic concurrency and watches only.
//!
//! # Only the controller writes the labels
//! The invariant assumes that only the sharder and the shards write
//! `shard.kinformer.io/<ring>` and `drain.shard.kinformer.io/<ring>`. A person or tool that
//! removes or changes an object's shard label (a `kubectl label`, an apply of a manifest
//! without it, a copy of another object's labels) makes the object leave its shard's label
//! selector with no drain: the shard may still be reconciling it while the sharder, seeing it
//! unlabelled or labelled for another shard, hands it to that shard, and the two overlap.
//! Restrict who may write these labels to the controller's ServiceAccount, e.g. with a
//! ValidatingAdmissionPolicy that rejects a create or update which sets, changes or removes
//! either label unless the request's user is that ServiceAccount.
//!
//! # Metrics
//! `kinformer_sharding_objects{ring,shard}` (objects labelled per shard, as the sharder sees
//! them), `kinformer_sharding_moves_total{ring,reason}` (`drained`: the old shard
//! acknowledged a drain; `released`: at once, from a shard whose Lease its graceful shutdown
//! released; `expired`: at once, from a shard whose Lease expired or vanished),
//! `kinformer_sharding_drain_duration_seconds{ring}` (drain label to reassignment, timed from
//! the object's [`Sharder::DRAIN_STARTED_ANNOTATION`], so a drain begun before a sharder
//! failover is timed by the next sharder). A
//! shard's readiness ([`ShardingConfig::readiness`], for the Manager's `/readyz`) fails while it
//! does not hold its shard Lease, and until its run listed the shard's objects.

mod drain;
mod membership;
pub mod ring;
mod sharder;

use std::time::Duration;

pub(crate) use drain::{Admit, Deletions, Lookup, ShardGate};
pub(crate) use membership::ShardMembership;
pub use membership::{ShardReadiness, live_shards};
pub use sharder::{DEFAULT_WORKERS, Sharder, SharderReconciler, ShardingMetrics};

#[allow(unused_imports)] // the doc links above
use crate::leader_election::LeaderElector;

/// The label prefix of an object's shard: `shard.kinformer.io/<ring>`.
pub const SHARD_LABEL_PREFIX: &str = "shard.kinformer.io/";
/// The label prefix of an object being drained: `drain.shard.kinformer.io/<ring>`.
pub const DRAIN_LABEL_PREFIX: &str = "drain.shard.kinformer.io/";
/// The label of every shard Lease, whose value is the ring's name.
pub const RING_LABEL: &str = "sharding.kinformer.io/ring";
/// The annotation by which the sharder fences a gone shard's Lease while it moves that shard's
/// objects (its value: when the fence was written); no incarnation of the shard reconciles
/// while it is there.
pub const FENCE_ANNOTATION: &str = "sharding.kinformer.io/fenced";

/// Why `value` cannot be both a label value (or a label key's name part) and part of a Lease's
/// name (an RFC 1123 subdomain), if it cannot.
fn dns_label(value: &str) -> Result<(), &'static str> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if value.is_empty() {
        Err("is empty")
    } else if value.len() > 63 {
        Err("is longer than 63 characters")
    } else if !value.chars().all(ok_char) {
        Err("may hold only lowercase letters, digits, '-' and '.'")
    } else if [value.as_bytes()[0], value.as_bytes()[value.len() - 1]]
        .iter()
        .any(|b| !b.is_ascii_alphanumeric())
    {
        Err("must start and end with a letter or digit")
    } else {
        Ok(())
    }
}

/// One ring and this replica's shard in it: given to
/// [`ControllerBuilder::sharded`](crate::ControllerBuilder::sharded) on every replica, and to
/// [`Sharder::new`] (which ignores the shard id).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ShardingConfig {
    /// The ring's name (part of the label keys and the Lease names: checked by
    /// [`validate`](Self::validate)).
    pub ring: String,
    /// This replica's shard id (the shard label's value and part of its Lease's name: checked
    /// by [`validate`](Self::validate); a pod's name or a host name fits).
    pub shard_id: String,
    /// The namespace of the shard Leases (default `default`).
    pub namespace: String,
    /// A shard Lease's duration (default 15 s).
    pub lease_duration: Duration,
    /// How long after its last renewal a shard may still reconcile (default 10 s).
    pub renew_deadline: Duration,
    /// The pause between renewals (default 2 s).
    pub retry_period: Duration,
    /// How often the sharder re-reads the shard Leases from its cache (default 1 s): a join or
    /// a release is noticed within it; an expiry at the instant it happens (the check is also
    /// timed for the first live Lease's expiry).
    pub membership_check_interval: Duration,
    /// The readiness of this shard, for `/readyz` ([`ShardReadiness::check`]).
    pub readiness: ShardReadiness,
}

impl ShardingConfig {
    /// Shard `shard_id` of ring `ring`, with client-go's leader election timing for its Lease.
    pub fn new(ring: impl Into<String>, shard_id: impl Into<String>) -> Self {
        ShardingConfig {
            ring: ring.into(),
            shard_id: shard_id.into(),
            namespace: "default".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            membership_check_interval: Duration::from_secs(1),
            readiness: ShardReadiness::default(),
        }
    }

    /// Sets [`namespace`](Self::namespace).
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets [`lease_duration`](Self::lease_duration), [`renew_deadline`](Self::renew_deadline)
    /// and [`retry_period`](Self::retry_period) (as for a leader lease:
    /// `lease_duration > renew_deadline > 1.2 × retry_period`).
    #[must_use]
    pub fn lease_timing(mut self, lease_duration: Duration, renew_deadline: Duration, retry_period: Duration) -> Self {
        self.lease_duration = lease_duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        self
    }

    /// Sets [`membership_check_interval`](Self::membership_check_interval).
    #[must_use]
    pub fn membership_check_interval(mut self, interval: Duration) -> Self {
        self.membership_check_interval = interval;
        self
    }

    /// Checks that the ring's name and the shard id can name what they name: the label keys
    /// (`shard.kinformer.io/<ring>`), the shard label's value and the shard Lease
    /// (`<ring>-<shard-id>`): each must be lowercase letters, digits, `-` and `.`, start and end
    /// with a letter or digit, and hold at most 63 characters (a label value that is also part
    /// of an RFC 1123 subdomain). The error names the value. Called when a sharded controller
    /// or a sharder is built.
    pub fn validate(&self) -> Result<(), String> {
        for (what, value) in [("ring name", &self.ring), ("shard id", &self.shard_id)] {
            if let Err(why) = dns_label(value) {
                return Err(format!("sharding: {what} {value:?} {why}"));
            }
        }
        Ok(())
    }

    /// The label key of the ring's shard assignment, `shard.kinformer.io/<ring>`.
    pub fn shard_label(&self) -> String {
        format!("{SHARD_LABEL_PREFIX}{}", self.ring)
    }

    /// The label key of the ring's drain mark, `drain.shard.kinformer.io/<ring>`.
    pub fn drain_label(&self) -> String {
        format!("{DRAIN_LABEL_PREFIX}{}", self.ring)
    }

    /// The label selector of this shard's objects: `shard.kinformer.io/<ring>=<shard-id>`.
    pub fn selector(&self) -> String {
        format!("{}={}", self.shard_label(), self.shard_id)
    }

    /// The name of this shard's Lease, `<ring>-<shard-id>`.
    pub fn lease_name(&self) -> String {
        format!("{}-{}", self.ring, self.shard_id)
    }
}

#[cfg(test)]
mod tests {
    use super::ShardingConfig;

    #[test]
    fn ring_and_shard_id_must_be_label_safe() {
        assert_eq!(ShardingConfig::new("cms", "shard-0").validate(), Ok(()));
        assert_eq!(ShardingConfig::new("cms", "node-1.example").validate(), Ok(()));
        let long = "a".repeat(64);
        for (ring, shard, named) in [
            ("CMs", "shard-0", "ring name \"CMs\""),
            ("cms/x", "shard-0", "ring name \"cms/x\""),
            ("", "shard-0", "ring name \"\""),
            ("cms", "shard_0", "shard id \"shard_0\""),
            ("cms", "-0", "shard id \"-0\""),
            ("cms", "0.", "shard id \"0.\""),
            ("cms", long.as_str(), "is longer than 63"),
        ] {
            let err = ShardingConfig::new(ring, shard).validate().unwrap_err();
            assert!(err.contains(named), "{err}");
        }
    }
}
