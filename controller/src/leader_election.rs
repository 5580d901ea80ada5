//! Leader election on a `coordination.k8s.io/v1` Lease: client-go's `tools/leaderelection`
//! with its `LeaseLock`.
//!
//! Where it sits: the [`Manager`](crate::Manager) runs one [`LeaderElector`] beside its
//! informers. Every replica lists and watches, so a standby's caches stay warm and its queues
//! fill; only the replica holding the Lease runs the controllers. The Manager calls
//! [`acquire`](LeaderElector::acquire) before starting them and [`renew`](LeaderElector::renew)
//! while they run; when `renew` returns [`LeaderElectionError::LeadershipLost`] the controllers
//! are stopped at once.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use controller::leader_election::{LeaderElectionConfig, LeaderElector};
//! use tokio_util::sync::CancellationToken;
//!
//! let env = envtest::Server::start(envtest::Config::default()).await?;
//! let config = LeaderElectionConfig::new("default", "my-controller", "pod-a")
//!     .lease_duration(Duration::from_secs(2))
//!     .renew_deadline(Duration::from_millis(1500))
//!     .retry_period(Duration::from_millis(200));
//! let elector = LeaderElector::new(env.client(), config)?;
//! let shutdown = CancellationToken::new();
//! if elector.acquire(&shutdown).await {
//!     let renewing = tokio::spawn({
//!         let (elector, shutdown) = (elector.clone(), shutdown.clone());
//!         async move { elector.renew(&shutdown).await }
//!     });
//!     assert!(elector.is_leader());
//!     // ... run the controllers; stop them; then:
//!     shutdown.cancel();
//!     renewing.await??; // released: a standby takes over within a retry period
//! }
//! assert!(!elector.is_leader());
//! env.shutdown().await;
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # The protocol (client-go's `tryAcquireOrRenew`)
//!
//! One attempt, every `retry_period` (jittered by [`JITTER_FACTOR`] while acquiring):
//!
//! 1. Fast path for the leader: if the record last observed names us and has not expired,
//!    `replace` the cached Lease with a new `renewTime` (same `acquireTime` and
//!    `leaseTransitions`). On any error, go on with 2.
//! 2. `GET` the Lease. Absent: `create` it naming us (`409 AlreadyExists`: someone else was
//!    first; not acquired this round).
//! 3. If its record differs from the one observed before, remember it and the local time now
//!    (*observedRecord*, *observedTime*). If it names another holder and
//!    `observedTime + leaseDurationSeconds > now`, that holder still leads: stop here.
//! 4. Write the record naming us with `replace`, whose `metadata.resourceVersion` makes it
//!    conditional: if anyone wrote in between, the server answers `409 Conflict` and this round
//!    is lost, so two candidates never both succeed. `acquireTime` and `leaseTransitions` are
//!    kept when we already held it; otherwise `acquireTime` is now and `leaseTransitions` is
//!    incremented.
//!
//! Expiry is judged by the *local* clock from when a change was observed, never by the
//! `renewTime` written in the Lease, so clock skew between replicas does not matter (only
//! their clock *rates*; see client-go's package docs).
//!
//! # Timing
//!
//! | setting (default) | meaning |
//! |---|---|
//! | `lease_duration` (15 s) | how long a standby waits, without seeing the record change, before taking over |
//! | `renew_deadline` (10 s) | how long after its last successful renewal was *sent* the leader may still act, retrying a failing renewal meanwhile |
//! | `retry_period` (2 s) | the pause between attempts (acquire: `retry_period..2.2 × retry_period`) |
//!
//! After a release a standby takes over at its next attempt; after a crash, `lease_duration`
//! after it last saw the record change.
//!
//! # Guarantees
//!
//! - A term of leadership is *valid* while the last successful write of the Lease (acquire or
//!   renewal) was sent less than `renew_deadline` ago by the local clock.
//!   [`LeaderElector::is_leader`] and [`Leadership::is_valid`] compute it at every call, so
//!   they are false at once when a stopped process resumes, before any timer has run.
//! - Another replica takes over no earlier than `lease_duration` after it *saw* that write,
//!   which is later than it was sent: a term's writes checked valid have `lease_duration -
//!   renew_deadline` (5 s by default) to reach the server before anyone else may lead, which
//!   also absorbs clock *rate* differences up to that ratio (client-go's reasoning for the two
//!   settings).
//! - While `renew` runs, a timer armed for the validity deadline (re-armed by each renewal)
//!   cancels the term's token ([`Leadership::token`]) at that instant, whatever the renewal in
//!   flight is doing; `renew` itself gives up at the same instant, and no attempt starts after
//!   it. A term that ended never becomes valid again (a new `acquire` starts a new term).
//! - The [`Manager`](crate::Manager) hands the term to its controllers: no reconcile starts
//!   and no event is written once it is invalid, and reconcilers can guard their own writes
//!   (`ctx.ensure_leading()?`). What no client-side check closes: a request past its check
//!   and still queued in the client when the process stops goes out when it resumes; only a
//!   server-side precondition fences that.
//! - A candidate counts as in touch with the API server ([`LeaderElector::is_observing`], what
//!   makes a standby ready) while an attempt read or wrote the Lease within
//!   [`LeaderElector::observation_bound`].
//!
//! # Differences from client-go
//!
//! - The leader acts for at most `renew_deadline` after it *sent* its last successful
//!   renewal, and a failing renewal is retried until then; client-go's renew round starts
//!   `retry_period` after the last success and gives up `renew_deadline` after its start, so
//!   its leader may act up to `retry_period + renew_deadline` after it. Other replicas cannot
//!   take over before `lease_duration` after the renewal, so this holds for every valid
//!   configuration, not only when `retry_period + renew_deadline < lease_duration` as
//!   client-go needs.
//! - [`LeaderElector::is_leader`] means "leads now" (a valid term: acquired, renewed within
//!   `renew_deadline`, and neither lost, released nor given up), not client-go's `IsLeader`
//!   ("the last observed record names us"), which stays true after a failed renewal;
//!   [`LeaderElector::leader`] is client-go's `GetLeader`. [`LeaderElector::leadership`] and its
//!   token have no client-go equivalent.
//! - `renew` returns [`LeaderElectionError::LeadershipLost`] as soon as it sees another holder
//!   whose lease is valid, instead of retrying until `renew_deadline`.
//! - The first renewal comes `retry_period` after acquiring, not at once.
//! - `leaseDurationSeconds` is `lease_duration` rounded *up* to whole seconds (client-go
//!   truncates), so a standby never waits less than the leader assumes.
//! - The record observed after a write is the one the server returned (client-go keeps the
//!   one it sent), and records are compared at the Lease's microsecond precision (client-go
//!   compares a JSON form with whole seconds), so every renewal restarts a standby's clock.
//! - No lease is released after [`LeadershipLost`](LeaderElectionError::LeadershipLost): the
//!   controllers are still stopping at that moment. A release reads the Lease first (the
//!   cached one may be stale: a renewal abandoned at cancel time may still have landed) and
//!   writes only if it still names us, conditional on what it read; a conflict or another
//!   error is retried, reading again, until `renew_deadline` (client-go gives up after one
//!   try). So a clean shutdown leaves the Lease free (`holderIdentity` empty,
//!   `leaseDurationSeconds: 1`, `leaseTransitions` kept), not held until it expires.
//! - [`LeaderCallbacks`] (client-go's) run synchronously, not on goroutines of their own:
//!   *OnStartedLeading* when `acquire` wins (with the term), *OnStoppedLeading* once when a
//!   term ends (never for a replica that never led; client-go calls it whenever `Run`
//!   returns), *OnNewLeader* when the observed holder changes to a non-empty identity.
//!   Without them, `acquire` returning `true` and `renew` returning say the same.
//! - [`LeaderElector::check`] is client-go's `HealthzAdaptor` check, measured from the last
//!   renewal *sent* against `renew_deadline` + tolerance (client-go: last observation against
//!   `lease_duration` + tolerance). No coordinated leader election, no event recording.
//! - [`default_identity`] is `<hostname>_<uuid>`, as client-go's examples and
//!   controller-runtime build it ([`LeaderElectionConfig::with_default_identity`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::leadership::Leadership;

/// client-go's `JitterFactor`: acquire attempts are `retry_period × (1 + U[0, 1.2))` apart, and
/// `renew_deadline` must exceed `JITTER_FACTOR × retry_period`.
pub const JITTER_FACTOR: f64 = 1.2;

/// Where and as whom to run for leader, and how fast. Built with [`LeaderElectionConfig::new`]
/// (client-go's defaults: 15 s / 10 s / 2 s, release on cancel) and the setters below.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease.
    pub lease_namespace: String,
    /// Name of the Lease; every replica of one controller uses the same.
    pub lease_name: String,
    /// This replica's identity, unique among the candidates (typically the pod name).
    pub identity: String,
    /// How long a standby waits after it last saw the Lease change before taking over.
    /// Written to the Lease as `leaseDurationSeconds`, rounded up. Default 15 s.
    pub lease_duration: Duration,
    /// How long the leader retries a failing renewal before it gives up leading. Default 10 s.
    pub renew_deadline: Duration,
    /// The pause between attempts to acquire or renew. Default 2 s.
    pub retry_period: Duration,
    /// Release the Lease when `renew`'s shutdown token fires, so a standby takes over at once
    /// instead of after `lease_duration`. Cancel only once everything the lease guards has
    /// stopped, or two replicas may act at once. Default `true`.
    pub release_on_cancel: bool,
    /// Called when this replica starts or stops leading and when a new leader is observed
    /// (client-go's `LeaderCallbacks`). Default: none.
    pub callbacks: LeaderCallbacks,
}

/// Functions called on leadership changes: client-go's `LeaderCallbacks`, all optional.
///
/// They run synchronously on the task that noticed the change (the elector's `acquire` or
/// `renew`, or whoever made the observation), so they must return quickly: spawn or send on a
/// channel for anything slow. A callback that blocks delays renewals.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct LeaderCallbacks {
    /// *OnStartedLeading*: `acquire` won the Lease; called with the new term.
    pub on_started_leading: Option<OnStartedLeading>,
    /// *OnStoppedLeading*: a term ended (lost, lapsed, released or given up); once per term.
    pub on_stopped_leading: Option<OnStoppedLeading>,
    /// *OnNewLeader*: the observed holder changed to this identity (ours included).
    pub on_new_leader: Option<OnNewLeader>,
}

/// [`LeaderCallbacks::on_started_leading`]'s function.
pub type OnStartedLeading = Arc<dyn Fn(&Leadership) + Send + Sync>;
/// [`LeaderCallbacks::on_stopped_leading`]'s function.
pub type OnStoppedLeading = Arc<dyn Fn() + Send + Sync>;
/// [`LeaderCallbacks::on_new_leader`]'s function.
pub type OnNewLeader = Arc<dyn Fn(&str) + Send + Sync>;

impl LeaderCallbacks {
    /// No callbacks.
    pub fn new() -> Self {
        LeaderCallbacks::default()
    }

    /// Sets [`on_started_leading`](Self::on_started_leading).
    #[must_use]
    pub fn on_started_leading(mut self, f: impl Fn(&Leadership) + Send + Sync + 'static) -> Self {
        self.on_started_leading = Some(Arc::new(f));
        self
    }

    /// Sets [`on_stopped_leading`](Self::on_stopped_leading).
    #[must_use]
    pub fn on_stopped_leading(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_stopped_leading = Some(Arc::new(f));
        self
    }

    /// Sets [`on_new_leader`](Self::on_new_leader).
    #[must_use]
    pub fn on_new_leader(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_new_leader = Some(Arc::new(f));
        self
    }
}

impl fmt::Debug for LeaderCallbacks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderCallbacks")
            .field("on_started_leading", &self.on_started_leading.is_some())
            .field("on_stopped_leading", &self.on_stopped_leading.is_some())
            .field("on_new_leader", &self.on_new_leader.is_some())
            .finish()
    }
}

/// A unique identity as client-go's examples and controller-runtime build it: the host name
/// ([`hostname`](crate::hostname): `$HOSTNAME`, a pod's name) and a random UUID,
/// `<hostname>_<uuid>`. Unique per process, so two containers of one pod, or a restarted
/// process, never share a term.
pub fn default_identity() -> String {
    let bits: u128 = rand::random();
    // A version 4 (random) UUID: version nibble 4, variant bits 10.
    let bits = (bits & !(0xf_u128 << 76) | (0x4_u128 << 76)) & !(0x3_u128 << 62) | (0x2_u128 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}_{}-{}-{}-{}-{}",
        crate::runnable::hostname(),
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

impl LeaderElectionConfig {
    /// The Lease `namespace/name`, contended for as `identity`, with client-go's default timing.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaderElectionConfig {
            lease_namespace: namespace.into(),
            lease_name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_cancel: true,
            callbacks: LeaderCallbacks::default(),
        }
    }

    /// As [`new`](Self::new), with [`default_identity`] (`<hostname>_<uuid>`) as the identity.
    pub fn with_default_identity(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        LeaderElectionConfig::new(namespace, name, default_identity())
    }

    /// Sets [`callbacks`](Self::callbacks).
    #[must_use]
    pub fn callbacks(mut self, callbacks: LeaderCallbacks) -> Self {
        self.callbacks = callbacks;
        self
    }

    /// Sets [`lease_duration`](Self::lease_duration).
    #[must_use]
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// Sets [`renew_deadline`](Self::renew_deadline).
    #[must_use]
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.renew_deadline = deadline;
        self
    }

    /// Sets [`retry_period`](Self::retry_period).
    #[must_use]
    pub fn retry_period(mut self, period: Duration) -> Self {
        self.retry_period = period;
        self
    }

    /// Sets [`release_on_cancel`](Self::release_on_cancel).
    #[must_use]
    pub fn release_on_cancel(mut self, release: bool) -> Self {
        self.release_on_cancel = release;
        self
    }

    /// client-go's `NewLeaderElector` checks (same messages), plus names that must be set and a
    /// lease duration that fits `leaseDurationSeconds`. Returns that value.
    fn validate(&self) -> Result<i32, String> {
        if self.lease_duration <= self.renew_deadline {
            return Err("leaseDuration must be greater than renewDeadline".into());
        }
        if self.renew_deadline.as_secs_f64() <= JITTER_FACTOR * self.retry_period.as_secs_f64() {
            return Err("renewDeadline must be greater than retryPeriod*JitterFactor".into());
        }
        // The two checks above already imply the first two of these; kept for client-go's
        // messages and order.
        if self.lease_duration.is_zero() {
            return Err("leaseDuration must be greater than zero".into());
        }
        if self.renew_deadline.is_zero() {
            return Err("renewDeadline must be greater than zero".into());
        }
        if self.retry_period.is_zero() {
            return Err("retryPeriod must be greater than zero".into());
        }
        if self.identity.is_empty() {
            return Err("Lock identity is empty".into());
        }
        if self.lease_name.is_empty() || self.lease_namespace.is_empty() {
            return Err("lease namespace and name must not be empty".into());
        }
        let whole_seconds = self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(whole_seconds).map_err(|_| "leaseDuration does not fit leaseDurationSeconds (i32)".into())
    }
}

/// What went wrong with leader election.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaderElectionError {
    /// The configuration breaks one of client-go's rules: `lease_duration > renew_deadline >
    /// 1.2 × retry_period > 0`, and a non-empty identity, namespace and name.
    #[error("invalid leader election config: {0}")]
    InvalidConfig(String),

    /// This replica no longer holds the Lease and must stop everything it guards. From this
    /// moment [`LeaderElector::is_leader`] is false.
    #[error("lost the lease {lease}: {}", match .holder {
        Some(holder) => format!("now held by {holder:?}"),
        None => "could not renew it within the renew deadline".to_owned(),
    })]
    LeadershipLost {
        /// The Lease, as `namespace/name`.
        lease: String,
        /// The holder that took it over, when that is how it was lost.
        holder: Option<String>,
        /// The last error of the failed renewal attempts (none if they timed out).
        #[source]
        last_error: Option<kube::Error>,
    },

    /// The health check ([`LeaderElector::check`]) found the Lease still naming this replica
    /// but not renewed for longer than `renew_deadline` plus the tolerance: whatever should
    /// renew it (or stop the process) is wedged.
    #[error("failed election to renew leadership on lease {lease}: last renewal sent {since:?} ago")]
    RenewalOverdue {
        /// The Lease, as `namespace/name`.
        lease: String,
        /// How long ago the last successful renewal was sent.
        since: Duration,
    },

    /// [`LeaderElector::renew`] was called while not holding the Lease (call `acquire` first).
    #[error("renew called while not holding the lease {lease}")]
    NotLeading {
        /// The Lease, as `namespace/name`.
        lease: String,
    },
}

/// Runs for leader on one Lease: client-go's `LeaderElector`. Cheap to clone; clones share the
/// state (attempts of clones are serialized).
#[derive(Clone)]
pub struct LeaderElector {
    inner: Arc<Inner>,
}

struct Inner {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    /// `namespace/name`, for logs and errors.
    lease: String,
    /// `leaseDurationSeconds` as written by us: `config.lease_duration` rounded up.
    lease_duration_seconds: i32,
    /// The origin of `leading_until` and `last_observed`.
    epoch: Instant,
    /// Nanoseconds after `epoch` until which this replica may act as leader: the start of its
    /// last successful write plus `renew_deadline`. 0 while not leading. Set by `acquire` and
    /// `renew`, cleared when leadership ends; read lock-free by `is_leader`.
    leading_until: AtomicU64,
    /// Nanoseconds after `epoch` when the last successful write of the Lease naming us (acquire
    /// or renewal) was sent; 0: never. Unlike `leading_until` it is not cleared when the term
    /// ends: the health check ([`LeaderElector::check`]) compares it with the clock while the
    /// observed record still names us.
    last_renewed: AtomicU64,
    /// The current term of leadership: a fresh token when `acquire` succeeds, cancelled the
    /// moment the term ends (its validity lapsed by the local clock, the lease was lost, given
    /// back or given up). Invariant: while `leading_until` is non-zero and in the future, this
    /// token is the one `acquire` installed last; once cancelled it stays so (a new term gets a
    /// new token), so a [`Leadership`] of an old term never becomes valid again.
    term: Mutex<CancellationToken>,
    /// Nanoseconds after `epoch` when an attempt last read or wrote the Lease successfully
    /// (the API server answered with the Lease); 0: never. For a standby's readiness.
    last_observed: AtomicU64,
    /// `holderIdentity` as last observed (`None`: none yet, or empty). Updated with
    /// `observation`, readable without waiting for an attempt in flight.
    leader: Mutex<Option<String>>,
    /// What the last attempt saw. The async lock is held for a whole attempt, so attempts
    /// (of clones too) never interleave.
    observation: tokio::sync::Mutex<Observation>,
}

/// What this elector last saw of the Lease: client-go's `observedRecord` and `observedTime`,
/// and the `LeaseLock`'s cached object.
///
/// Invariant: `lease` and `record` are both `Some` or both `None`, and `record.0` is the
/// record of `lease.spec`.
#[derive(Default)]
struct Observation {
    /// The Lease as last read or written; its `resourceVersion` is the precondition of our next
    /// write.
    lease: Option<Lease>,
    /// Its record, and the local time it was first seen with this content (or we wrote it).
    record: Option<(LeaderElectionRecord, Instant)>,
}

impl Observation {
    /// A Lease read from the server: the clock restarts only if the record changed.
    fn observe(&mut self, lease: Lease, now: Instant) {
        let record = LeaderElectionRecord::from_spec(lease.spec.as_ref());
        if self.record.as_ref().is_none_or(|(seen, _)| *seen != record) {
            self.record = Some((record, now));
        }
        self.lease = Some(lease);
    }

    /// A Lease we wrote, as the server returned it: the clock restarts.
    fn written(&mut self, lease: Lease, now: Instant) {
        self.record = Some((LeaderElectionRecord::from_spec(lease.spec.as_ref()), now));
        self.lease = Some(lease);
    }

    /// The cached Lease and its record, if that record names `identity`.
    fn held_by(&self, identity: &str) -> Option<(&Lease, &LeaderElectionRecord, Instant)> {
        match (&self.lease, &self.record) {
            (Some(lease), Some((record, seen))) if record.holder_identity == identity => Some((lease, record, *seen)),
            _ => None,
        }
    }

    fn holder(&self) -> Option<String> {
        self.record
            .as_ref()
            .map(|(record, _)| record.holder_identity.clone())
            .filter(|holder| !holder.is_empty())
    }
}

/// client-go's `LeaderElectionRecord`: the part of a `LeaseSpec` the election reads and writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct LeaderElectionRecord {
    /// Empty: nobody holds the lease (never acquired, or released).
    holder_identity: String,
    lease_duration_seconds: i32,
    acquire_time: Option<MicroTime>,
    renew_time: Option<MicroTime>,
    leader_transitions: i32,
}

impl LeaderElectionRecord {
    fn from_spec(spec: Option<&LeaseSpec>) -> Self {
        let Some(spec) = spec else {
            return LeaderElectionRecord::default();
        };
        LeaderElectionRecord {
            holder_identity: spec.holder_identity.clone().unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time.clone(),
            renew_time: spec.renew_time.clone(),
            leader_transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    /// The whole spec, as client-go's `LeaderElectionRecordToLeaseSpec` (other fields cleared).
    fn to_spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder_identity.clone()),
            lease_duration_seconds: Some(self.lease_duration_seconds),
            acquire_time: self.acquire_time.clone(),
            renew_time: self.renew_time.clone(),
            lease_transitions: Some(self.leader_transitions),
            ..LeaseSpec::default()
        }
    }

    /// client-go's `isLeaseValid`: whether this record, observed unchanged since `observed_at`,
    /// still binds at `now`.
    fn is_valid(&self, observed_at: Instant, now: Instant) -> bool {
        let duration = Duration::from_secs(u64::try_from(self.lease_duration_seconds).unwrap_or(0));
        observed_at.checked_add(duration).is_none_or(|expiry| expiry > now)
    }
}

/// Steps 3–4 of `tryAcquireOrRenew`, given the record just read (observed unchanged since
/// `observed_at`): whether `identity` may write, and which record.
fn decide(
    current: &LeaderElectionRecord,
    observed_at: Instant,
    identity: &str,
    now: Instant,
    mut desired: LeaderElectionRecord,
) -> Decision {
    let ours = current.holder_identity == identity;
    if !current.holder_identity.is_empty() && !ours && current.is_valid(observed_at, now) {
        return Decision::HeldByOther(current.holder_identity.clone());
    }
    if ours {
        desired.acquire_time = current.acquire_time.clone();
        desired.leader_transitions = current.leader_transitions;
    } else {
        desired.leader_transitions = current.leader_transitions.saturating_add(1);
    }
    Decision::Write(desired)
}

#[derive(Debug, PartialEq)]
enum Decision {
    /// Another holder's lease is still valid.
    HeldByOther(String),
    /// Write this record (conditional on the resourceVersion read).
    Write(LeaderElectionRecord),
}

/// The outcome of one `tryAcquireOrRenew`.
enum Attempt {
    /// The Lease names us: this attempt wrote it.
    Held,
    /// Another holder's lease is still valid.
    HeldByOther(String),
    /// An API error (logged), a lost race (409), or a timeout (`None`): nothing is known to have
    /// changed.
    Failed(Option<kube::Error>),
}

/// client-go's `wait.Jitter`: `period + U[0, max_factor) × period`.
fn jitter(period: Duration, max_factor: f64) -> Duration {
    let factor = if max_factor > 0.0 { max_factor } else { 1.0 };
    period + period.mul_f64(rand::random::<f64>() * factor)
}

/// A token that has already fired: the term of an elector that never led.
fn cancelled_token() -> CancellationToken {
    let token = CancellationToken::new();
    token.cancel();
    token
}

fn is_api_error(error: &kube::Error, check: fn(&kube::core::Status) -> bool) -> bool {
    matches!(error, kube::Error::Api(status) if check(status))
}

impl LeaderElector {
    /// An elector for `config.lease_namespace/config.lease_name`. Checks client-go's rules:
    /// `lease_duration > renew_deadline > 1.2 × retry_period > 0` and a non-empty identity
    /// (and names). Makes no request.
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Result<Self, LeaderElectionError> {
        let lease_duration_seconds = config.validate().map_err(LeaderElectionError::InvalidConfig)?;
        Ok(LeaderElector {
            inner: Arc::new(Inner {
                api: Api::namespaced(client, &config.lease_namespace),
                lease: format!("{}/{}", config.lease_namespace, config.lease_name),
                config,
                lease_duration_seconds,
                epoch: Instant::now(),
                leading_until: AtomicU64::new(0),
                last_renewed: AtomicU64::new(0),
                term: Mutex::new(cancelled_token()),
                last_observed: AtomicU64::new(0),
                leader: Mutex::new(None),
                observation: tokio::sync::Mutex::new(Observation::default()),
            }),
        })
    }

    /// Tries at once, then every `retry_period × (1 + U[0, 1.2))` (client-go's
    /// `wait.JitterUntil`), until this replica holds the Lease (`true`) or `shutdown` fires
    /// (`false`; a lease acquired just as it fired is given back as on cancel). An attempt that
    /// hangs is abandoned after `renew_deadline`.
    pub async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        let inner = &*self.inner;
        info!(identity = %inner.config.identity, lease = %inner.lease, "attempting to acquire the lease");
        loop {
            let started = Instant::now();
            let attempt = tokio::select! {
                biased;
                () = shutdown.cancelled() => return false,
                attempt = self.attempt(started + inner.config.renew_deadline) => attempt,
            };
            match attempt {
                Attempt::Held => {
                    self.begin_term(started);
                    if shutdown.is_cancelled() {
                        self.step_down().await;
                        return false;
                    }
                    info!(identity = %inner.config.identity, lease = %inner.lease, "acquired the lease");
                    if let Some(on_started) = &inner.config.callbacks.on_started_leading {
                        on_started(&self.leadership());
                    }
                    return true;
                }
                Attempt::HeldByOther(holder) => {
                    debug!(identity = %inner.config.identity, lease = %inner.lease, %holder, "the lease is held by another holder and has not expired");
                }
                Attempt::Failed(_) => {}
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(jitter(inner.config.retry_period, JITTER_FACTOR)) => {}
            }
        }
    }

    /// Keeps the Lease while this replica leads; call after [`acquire`](Self::acquire)
    /// returned `true`.
    ///
    /// Renews every `retry_period`. A renewal that fails is retried every `retry_period` until
    /// `renew_deadline` after the last successful write was sent (the instant the term's
    /// validity lapses, see [`is_leader`](Self::is_leader)); then, or as soon as another holder
    /// is seen, returns [`LeaderElectionError::LeadershipLost`], and `is_leader` is false from
    /// that moment. While it runs, a timer armed for the validity deadline (re-armed by each
    /// renewal) cancels the term's token ([`Leadership::token`]) at that instant, whatever the
    /// renewal in flight is doing. When `shutdown` fires it stops leading, releases the Lease if
    /// `release_on_cancel` (empty `holderIdentity`, `leaseDurationSeconds: 1`, as client-go),
    /// and returns `Ok(())`; a failed release is logged, and the lease then expires.
    pub async fn renew(&self, shutdown: &CancellationToken) -> Result<(), LeaderElectionError> {
        if self.leading_until().is_none() {
            return Err(LeaderElectionError::NotLeading {
                lease: self.inner.lease.clone(),
            });
        }
        let mut renewing = std::pin::pin!(self.renew_until_lost(shutdown));
        let mut watchdog = std::pin::pin!(self.end_term_when_validity_lapses());
        let mut watching = true;
        loop {
            tokio::select! {
                // The watchdog first: a renewal answered in the same poll as the deadline passed
                // must not extend a term that has already ended.
                biased;
                () = &mut watchdog, if watching => watching = false,
                result = &mut renewing => return result,
            }
        }
    }

    /// The watchdog of [`renew`](Self::renew): a timer to the term's validity deadline, re-armed
    /// when a renewal moved it; ends the term (cancels its token) at that instant. Returns once
    /// the term ended.
    async fn end_term_when_validity_lapses(&self) {
        let inner = &*self.inner;
        loop {
            let Some(until) = self.leading_until() else {
                self.end_term();
                return;
            };
            tokio::time::sleep_until(until).await;
            if self.leading_until().is_none_or(|until| until <= Instant::now()) {
                self.end_term();
                warn!(
                    identity = %inner.config.identity,
                    lease = %inner.lease,
                    renew_deadline = ?inner.config.renew_deadline,
                    "no renewal sent within the renew deadline succeeded: leadership ended by the local clock"
                );
                return;
            }
        }
    }

    /// The renewal loop of [`renew`](Self::renew).
    async fn renew_until_lost(&self, shutdown: &CancellationToken) -> Result<(), LeaderElectionError> {
        let inner = &*self.inner;
        // The term's validity deadline: `renew_deadline` after the last successful write was
        // sent. A failing renewal is retried until then, not after.
        let Some(mut deadline) = self.leading_until() else {
            return Err(LeaderElectionError::NotLeading {
                lease: inner.lease.clone(),
            });
        };
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                        self.step_down().await;
                        return Ok(());
                    }
                () = tokio::time::sleep(inner.config.retry_period) => {}
            }
            let mut last_error = None;
            loop {
                let started = Instant::now();
                let attempt = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => {
                        self.step_down().await;
                        return Ok(());
                    }
                    attempt = self.attempt(deadline) => attempt,
                };
                match attempt {
                    Attempt::Held if self.term_ended() || started >= deadline => {
                        // Written, but the term had already ended by the clock (the process was
                        // stopped, say): what the lease guards has been told to stop, so this
                        // term cannot go on.
                        self.stop_leading();
                        error!(identity = %inner.config.identity, lease = %inner.lease,
                            "renewed only after the term's validity lapsed: stopped leading");
                        return Err(LeaderElectionError::LeadershipLost {
                            lease: inner.lease.clone(),
                            holder: None,
                            last_error,
                        });
                    }
                    Attempt::Held => {
                        deadline = started + inner.config.renew_deadline;
                        self.set_leading_until(deadline);
                        debug!(identity = %inner.config.identity, lease = %inner.lease, "renewed the lease");
                        break;
                    }
                    Attempt::HeldByOther(holder) => {
                        self.stop_leading();
                        error!(identity = %inner.config.identity, lease = %inner.lease, %holder, "lost the lease to another holder");
                        return Err(LeaderElectionError::LeadershipLost {
                            lease: inner.lease.clone(),
                            holder: Some(holder),
                            last_error: None,
                        });
                    }
                    Attempt::Failed(error) => last_error = error.or(last_error),
                }
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => {
                        self.step_down().await;
                        return Ok(());
                    }
                    () = tokio::time::sleep_until(deadline) => {
                        self.stop_leading();
                        error!(
                            identity = %inner.config.identity,
                            lease = %inner.lease,
                            renew_deadline = ?inner.config.renew_deadline,
                            "failed to renew the lease in time: stopped leading"
                        );
                        return Err(LeaderElectionError::LeadershipLost {
                            lease: inner.lease.clone(),
                            holder: None,
                            last_error,
                        });
                    }
                    () = tokio::time::sleep(inner.config.retry_period) => {}
                }
            }
        }
    }

    /// Whether this replica leads now, by its local clock: it acquired or renewed the Lease
    /// with a write *sent* less than `renew_deadline` ago, and has not lost, released or given
    /// it up since. Turns false at that deadline even if the task running `renew` is not
    /// polled (the process was stopped, say). client-go's `IsLeader` ("the last observed record
    /// names us") stays true after failed renewals; see the module docs.
    pub fn is_leader(&self) -> bool {
        !self.term_ended() && self.leading_until().is_some_and(|until| Instant::now() < until)
    }

    /// The current term of leadership: valid while this replica leads, with a token that fires
    /// the instant it stops (see [`Leadership`]). Before the first `acquire`, and once the term
    /// ended, an invalid one whose token has fired.
    pub fn leadership(&self) -> Leadership {
        Leadership::of_term(self.clone(), self.term_token())
    }

    /// When an attempt last read or wrote the Lease successfully (the API server answered with
    /// the Lease), if ever.
    pub fn last_observed(&self) -> Option<Instant> {
        match self.inner.last_observed.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(self.inner.epoch + Duration::from_nanos(nanos)),
        }
    }

    /// How long a candidate may go without a successful read or write of the Lease and still
    /// count as in touch with the API server: `lease_duration` (past that it could not take
    /// over in time, nor tell whether the leader lives), or one acquire pause plus one
    /// attempt's timeout (`retry_period × 2.2 + renew_deadline`) if that is longer, so a
    /// healthy candidate never crosses it between two attempts.
    pub fn observation_bound(&self) -> Duration {
        let config = &self.inner.config;
        let between_attempts = config.retry_period.mul_f64(1.0 + JITTER_FACTOR) + config.renew_deadline;
        config.lease_duration.max(between_attempts)
    }

    /// Whether an attempt read or wrote the Lease successfully within
    /// [`observation_bound`](Self::observation_bound): what makes a standby ready.
    pub fn is_observing(&self) -> bool {
        self.last_observed()
            .is_some_and(|at| Instant::now().saturating_duration_since(at) < self.observation_bound())
    }

    /// The holder of the Lease as last observed (this replica's identity while it leads);
    /// `None` before the first observation and while nobody holds it.
    pub fn leader(&self) -> Option<String> {
        self.inner.leader.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.inner.config.identity
    }

    /// The name of the Lease.
    pub fn lease_name(&self) -> &str {
        &self.inner.config.lease_name
    }

    /// The configuration this elector runs with.
    pub fn config(&self) -> &LeaderElectionConfig {
        &self.inner.config
    }

    /// The instant the current term's validity lapses unless a renewal sent before it
    /// succeeds: the last successful write's start plus `renew_deadline`. `None` while not
    /// leading (a past instant once it lapsed, until `renew` notices).
    pub fn leading_until(&self) -> Option<Instant> {
        match self.inner.leading_until.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(self.inner.epoch + Duration::from_nanos(nanos)),
        }
    }

    fn set_leading_until(&self, until: Instant) {
        let nanos = u64::try_from(until.saturating_duration_since(self.inner.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.inner.leading_until.store(nanos.max(1), Ordering::Release);
        let sent = until
            .checked_sub(self.inner.config.renew_deadline)
            .unwrap_or(self.inner.epoch)
            .saturating_duration_since(self.inner.epoch);
        let sent = u64::try_from(sent.as_nanos()).unwrap_or(u64::MAX);
        self.inner.last_renewed.store(sent.max(1), Ordering::Release);
    }

    /// The health check of a leader (client-go's `LeaderElector.Check`, behind its
    /// `HealthzAdaptor`, which controller-runtime's manager installs as `leaderElection`):
    /// `Err` when the Lease as last observed still names this replica but its last successful
    /// renewal was sent more than `renew_deadline + tolerance` ago. A healthy leader renews
    /// well within `renew_deadline`, and one that cannot renew stops leading at it (the
    /// Manager then exits); past the tolerance, whatever should renew or stop is wedged, and a
    /// failing `/healthz` lets the kubelet restart the process. A standby, and a replica that
    /// released the Lease or saw another holder, always passes.
    ///
    /// client-go measures from when the record was last *observed* against `lease_duration`;
    /// this measures from when the last renewal was *sent* against `renew_deadline`, the bound
    /// this elector's leader acts by (see the module docs).
    pub fn check(&self, tolerance: Duration) -> Result<(), LeaderElectionError> {
        if self.leader().as_deref() != Some(self.identity()) {
            return Ok(());
        }
        let sent = match self.inner.last_renewed.load(Ordering::Acquire) {
            0 => return Ok(()),
            nanos => self.inner.epoch + Duration::from_nanos(nanos),
        };
        let since = Instant::now().saturating_duration_since(sent);
        if since > self.inner.config.renew_deadline + tolerance {
            return Err(LeaderElectionError::RenewalOverdue {
                lease: self.inner.lease.clone(),
                since,
            });
        }
        Ok(())
    }

    /// Starts a term whose first write was sent at `started`: a fresh token first, then the
    /// validity deadline, so `is_leader` never pairs the new deadline with the old (cancelled)
    /// token in a way that reads as leading early.
    fn begin_term(&self, started: Instant) {
        *self.inner.term.lock().unwrap_or_else(|e| e.into_inner()) = CancellationToken::new();
        self.set_leading_until(started + self.inner.config.renew_deadline);
    }

    /// Cancels the current term's token (idempotent); the first call of a term runs the
    /// *OnStoppedLeading* callback.
    fn end_term(&self) {
        let ended = {
            let term = self.inner.term.lock().unwrap_or_else(|e| e.into_inner());
            let ended = !term.is_cancelled();
            term.cancel();
            ended
        };
        if ended && let Some(on_stopped) = &self.inner.config.callbacks.on_stopped_leading {
            on_stopped();
        }
    }

    fn term_token(&self) -> CancellationToken {
        self.inner.term.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn term_ended(&self) -> bool {
        self.inner.term.lock().unwrap_or_else(|e| e.into_inner()).is_cancelled()
    }

    fn stop_leading(&self) {
        self.inner.leading_until.store(0, Ordering::Release);
        self.end_term();
    }

    /// Notes a successful read or write of the Lease (for [`is_observing`](Self::is_observing)).
    fn observed_now(&self) {
        let since = Instant::now().saturating_duration_since(self.inner.epoch);
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        self.inner.last_observed.store(nanos.max(1), Ordering::Release);
    }

    /// On shutdown: stop leading first (the caller has stopped what the lease guards), then
    /// give the lease back if configured.
    async fn step_down(&self) {
        self.stop_leading();
        if self.inner.config.release_on_cancel {
            self.release().await;
        }
    }

    /// One `tryAcquireOrRenew` under the observation lock, abandoned at `deadline`; not started
    /// at all once `deadline` passed (after the process resumes from a stop, say).
    async fn attempt(&self, deadline: Instant) -> Attempt {
        if Instant::now() >= deadline {
            return Attempt::Failed(None);
        }
        let attempt = tokio::time::timeout_at(deadline, async {
            let mut observation = self.inner.observation.lock().await;
            self.try_acquire_or_renew(&mut observation).await
        });
        match attempt.await {
            Ok(attempt) => attempt,
            Err(_) => {
                warn!(identity = %self.inner.config.identity, lease = %self.inner.lease, "attempt on the lease timed out");
                Attempt::Failed(None)
            }
        }
    }

    async fn try_acquire_or_renew(&self, observation: &mut Observation) -> Attempt {
        let inner = &*self.inner;
        let identity = inner.config.identity.as_str();
        let now = Instant::now();
        let wall = MicroTime(jiff::Timestamp::now());
        let desired = LeaderElectionRecord {
            holder_identity: identity.to_owned(),
            lease_duration_seconds: inner.lease_duration_seconds,
            acquire_time: Some(wall.clone()),
            renew_time: Some(wall),
            leader_transitions: 0,
        };

        // 1. Fast path: we hold it and nothing says otherwise, so the cached object is likely
        //    current.
        if let Some((lease, record, seen)) = observation.held_by(identity)
            && record.is_valid(seen, now)
        {
            let mut renewal = desired.clone();
            renewal.acquire_time = record.acquire_time.clone();
            renewal.leader_transitions = record.leader_transitions;
            match self.update(lease, &renewal).await {
                Ok(lease) => {
                    observation.written(lease, Instant::now());
                    self.observed_now();
                    self.publish_leader(observation);
                    return Attempt::Held;
                }
                Err(e) => {
                    debug!(identity, lease = %inner.lease, error = %e, "optimistic renewal failed: reading the lease");
                }
            }
        }

        // 2. Read, or create if absent.
        let lease = match inner.api.get_opt(&inner.config.lease_name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(inner.config.lease_name.clone()),
                        namespace: Some(inner.config.lease_namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(desired.to_spec()),
                };
                return match inner.api.create(&PostParams::default(), &lease).await {
                    Ok(lease) => {
                        observation.written(lease, Instant::now());
                        self.observed_now();
                        self.publish_leader(observation);
                        Attempt::Held
                    }
                    Err(e) if is_api_error(&e, kube::core::Status::is_already_exists) => {
                        debug!(identity, lease = %inner.lease, "another candidate created the lease first");
                        Attempt::Failed(Some(e))
                    }
                    Err(e) => {
                        warn!(identity, lease = %inner.lease, error = %e, "failed to create the lease");
                        Attempt::Failed(Some(e))
                    }
                };
            }
            Err(e) => {
                warn!(identity, lease = %inner.lease, error = %e, "failed to read the lease");
                return Attempt::Failed(Some(e));
            }
        };
        observation.observe(lease, Instant::now());
        self.observed_now();
        self.publish_leader(observation);

        // 3–4. Decide, then write conditionally on the resourceVersion just read.
        let (Some(lease), Some((current, seen))) = (&observation.lease, &observation.record) else {
            return Attempt::Failed(None); // unreachable: `observe` set both
        };
        let record = match decide(current, *seen, identity, now, desired) {
            Decision::HeldByOther(holder) => return Attempt::HeldByOther(holder),
            Decision::Write(record) => record,
        };
        match self.update(lease, &record).await {
            Ok(lease) => {
                observation.written(lease, Instant::now());
                self.observed_now();
                self.publish_leader(observation);
                Attempt::Held
            }
            Err(e) if is_api_error(&e, kube::core::Status::is_conflict) => {
                debug!(identity, lease = %inner.lease, "the lease changed while we wrote it: not acquired this round");
                Attempt::Failed(Some(e))
            }
            Err(e) => {
                warn!(identity, lease = %inner.lease, error = %e, "failed to update the lease");
                Attempt::Failed(Some(e))
            }
        }
    }

    /// `replace` of `lease` with `record`'s spec, conditional on `lease`'s resourceVersion.
    async fn update(&self, lease: &Lease, record: &LeaderElectionRecord) -> Result<Lease, kube::Error> {
        let inner = &*self.inner;
        if lease.metadata.resource_version.as_deref().is_none_or(str::is_empty) {
            // Without a resourceVersion the write would be unconditional and could
            // overwrite another leader: never send it.
            let status = kube::core::Status::failure(
                "the lease has no resourceVersion: refusing an unconditional update",
                "MissingResourceVersion",
            );
            return Err(kube::Error::Api(status.boxed()));
        }
        let mut lease = lease.clone();
        lease.spec = Some(record.to_spec());
        inner
            .api
            .replace(&inner.config.lease_name, &PostParams::default(), &lease)
            .await
    }

    /// client-go's `release`: reads the Lease, and if it still names us writes an empty holder
    /// with `leaseDurationSeconds: 1` (keeping `leaseTransitions`), conditional on the
    /// resourceVersion just read, so a new holder is never overwritten. The read comes first
    /// because the cached Lease may be stale: a renewal abandoned when shutdown fired may
    /// still have reached the server. A conflict (someone wrote in between) or another error
    /// is retried, reading again, every `retry_period / 4` until `renew_deadline`; then the
    /// failure is logged and the lease expires after `lease_duration`.
    async fn release(&self) {
        let inner = &*self.inner;
        let identity = inner.config.identity.as_str();
        let deadline = Instant::now() + inner.config.renew_deadline;
        let pause = (inner.config.retry_period / 4).max(Duration::from_millis(10));
        let mut observation = inner.observation.lock().await;
        let mut attempts = 0_u32;
        let outcome = loop {
            attempts += 1;
            let attempt = tokio::time::timeout_at(deadline, self.release_once(&mut observation)).await;
            match attempt {
                Ok(Ok(released)) => break Ok(released),
                Ok(Err(e)) if Instant::now() + pause < deadline => {
                    debug!(identity, lease = %inner.lease, attempts, error = %e, "releasing the lease failed: reading it again");
                    tokio::time::sleep(pause).await;
                }
                Ok(Err(e)) => break Err(Some(e)),
                Err(_) => break Err(None),
            }
        };
        self.publish_leader(&observation);
        match outcome {
            Ok(true) => info!(identity, lease = %inner.lease, attempts, "released the lease"),
            Ok(false) => debug!(identity, lease = %inner.lease, "the lease no longer names us: nothing to release"),
            Err(Some(e)) => {
                warn!(identity, lease = %inner.lease, attempts, error = %e, "failed to release the lease: it expires after its duration");
            }
            Err(None) => {
                warn!(identity, lease = %inner.lease, attempts, "timed out releasing the lease: it expires after its duration");
            }
        }
    }

    /// One read-then-write of [`release`](Self::release): `Ok(false)` if the Lease is absent or
    /// names someone else.
    async fn release_once(&self, observation: &mut Observation) -> Result<bool, kube::Error> {
        let inner = &*self.inner;
        let Some(lease) = inner.api.get_opt(&inner.config.lease_name).await? else {
            return Ok(false);
        };
        observation.observe(lease, Instant::now());
        let Some((lease, record, _)) = observation.held_by(&inner.config.identity) else {
            return Ok(false);
        };
        let now = MicroTime(jiff::Timestamp::now());
        let released = LeaderElectionRecord {
            holder_identity: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            leader_transitions: record.leader_transitions,
        };
        let lease = self.update(lease, &released).await?;
        observation.written(lease, Instant::now());
        Ok(true)
    }

    /// Publishes the observed holder for [`leader`](Self::leader), logging a change
    /// (client-go's `maybeReportTransition` / `OnNewLeader`).
    fn publish_leader(&self, observation: &Observation) {
        let holder = observation.holder();
        let mut leader = self.inner.leader.lock().unwrap_or_else(|e| e.into_inner());
        if *leader != holder {
            match &holder {
                Some(holder) => {
                    info!(identity = %self.inner.config.identity, lease = %self.inner.lease, %holder, "new leader observed")
                }
                None => info!(identity = %self.inner.config.identity, lease = %self.inner.lease, "the lease is free"),
            }
            *leader = holder.clone();
            drop(leader);
            if let (Some(holder), Some(on_new_leader)) = (holder, &self.inner.config.callbacks.on_new_leader) {
                on_new_leader(&holder);
            }
        }
    }
}

impl fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElector")
            .field("lease", &self.inner.lease)
            .field("identity", &self.inner.config.identity)
            .field("is_leader", &self.is_leader())
            .field("leader", &self.leader())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Option<MicroTime> {
        Some(MicroTime(jiff::Timestamp::from_second(seconds).unwrap()))
    }

    fn record(holder: &str, transitions: i32) -> LeaderElectionRecord {
        LeaderElectionRecord {
            holder_identity: holder.into(),
            lease_duration_seconds: 15,
            acquire_time: at(100),
            renew_time: at(110),
            leader_transitions: transitions,
        }
    }

    fn desired(identity: &str) -> LeaderElectionRecord {
        LeaderElectionRecord {
            holder_identity: identity.into(),
            lease_duration_seconds: 15,
            acquire_time: at(200),
            renew_time: at(200),
            leader_transitions: 0,
        }
    }

    #[test]
    fn defaults_and_validation_follow_client_go() {
        let config = LeaderElectionConfig::new("ns", "name", "me");
        assert_eq!(config.validate(), Ok(15));
        let secs = Duration::from_secs;
        let ms = Duration::from_millis;
        let invalid = [
            config.clone().lease_duration(secs(10)),
            config.clone().renew_deadline(ms(2400)), // 1.2 × 2 s is not enough
            config.clone().retry_period(Duration::ZERO).renew_deadline(secs(1)),
            LeaderElectionConfig::new("ns", "name", ""),
            LeaderElectionConfig::new("ns", "", "me"),
            config.clone().lease_duration(secs(u64::from(u32::MAX))),
        ];
        for config in invalid {
            assert!(config.validate().is_err(), "{config:?}");
        }
        assert_eq!(config.clone().renew_deadline(ms(2401)).validate(), Ok(15));
        assert_eq!(config.lease_duration(ms(15_001)).validate(), Ok(16), "rounded up");
    }

    #[test]
    fn a_record_survives_the_lease_spec() {
        let r = record("a", 3);
        assert_eq!(LeaderElectionRecord::from_spec(Some(&r.to_spec())), r);
        assert_eq!(LeaderElectionRecord::from_spec(None), LeaderElectionRecord::default());
    }

    #[tokio::test(start_paused = true)]
    async fn another_holder_binds_for_its_lease_duration_from_when_it_was_observed() {
        let seen = Instant::now();
        let current = record("other", 2);
        let before = seen + Duration::from_millis(14_999);
        assert_eq!(
            decide(&current, seen, "me", before, desired("me")),
            Decision::HeldByOther("other".into())
        );
        let after = seen + Duration::from_secs(15);
        let Decision::Write(taken) = decide(&current, seen, "me", after, desired("me")) else {
            panic!("an expired lease is taken");
        };
        assert_eq!((taken.leader_transitions, taken.acquire_time), (3, at(200)));
    }

    #[tokio::test(start_paused = true)]
    async fn renewing_keeps_acquire_time_and_transitions_and_a_free_lease_is_taken_at_once() {
        let seen = Instant::now();
        let Decision::Write(renewed) = decide(&record("me", 2), seen, "me", seen, desired("me")) else {
            panic!("our own lease is renewed");
        };
        assert_eq!(
            (renewed.leader_transitions, renewed.acquire_time, renewed.renew_time),
            (2, at(100), at(200))
        );
        let mut released = record("", 2);
        released.lease_duration_seconds = 1;
        let Decision::Write(taken) = decide(&released, seen, "me", seen, desired("me")) else {
            panic!("a released lease is taken");
        };
        assert_eq!(taken.leader_transitions, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_observation_clock_restarts_only_when_the_record_changes() {
        let lease = |r: &LeaderElectionRecord, rv: &str| Lease {
            metadata: ObjectMeta {
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            spec: Some(r.to_spec()),
        };
        let mut observation = Observation::default();
        let t0 = Instant::now();
        observation.observe(lease(&record("a", 0), "1"), t0);
        tokio::time::advance(Duration::from_secs(1)).await;
        // Same record, new resourceVersion (e.g. a label changed): the clock keeps running.
        observation.observe(lease(&record("a", 0), "2"), Instant::now());
        assert_eq!(observation.record.as_ref().map(|(_, t)| *t), Some(t0));
        let mut renewed = record("a", 0);
        renewed.renew_time = at(111);
        observation.observe(lease(&renewed, "3"), Instant::now());
        assert_eq!(
            observation.record.as_ref().map(|(_, t)| *t),
            Some(t0 + Duration::from_secs(1))
        );
        assert!(observation.held_by("a").is_some() && observation.held_by("b").is_none());
        assert_eq!(observation.holder().as_deref(), Some("a"));
    }

    /// A leadership is judged by the clock at every check, not by its token: right after a
    /// process resumes from a stop, no timer has run yet.
    #[tokio::test(start_paused = true)]
    async fn validity_lapses_by_the_clock_before_any_timer_runs() {
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let config = LeaderElectionConfig::new("ns", "name", "me");
        let elector = LeaderElector::new(client, config).unwrap();
        let before = elector.leadership();
        assert!(!before.is_valid() && before.token().is_cancelled(), "not leading yet");
        elector.begin_term(Instant::now());
        let leadership = elector.leadership();
        assert!(elector.is_leader() && leadership.is_valid());
        assert!(!before.is_valid(), "an earlier term never becomes valid");
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(
            leadership.check().is_ok(),
            "valid until renew_deadline after the write was sent"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        // Nothing runs `renew`, so nothing cancelled the token: the clock alone says no.
        assert!(!leadership.token().is_cancelled());
        assert!(!elector.is_leader());
        assert!(matches!(
            leadership.check(),
            Err(crate::NotLeader::LeaseLapsed { lease, identity }) if lease == "ns/name" && identity == "me"
        ));
        elector.stop_leading();
        assert!(leadership.token().is_cancelled(), "stopping ends the term's token");
    }

    #[test]
    fn jitter_stays_within_client_go_bounds() {
        let period = Duration::from_millis(100);
        for _ in 0..1000 {
            let d = jitter(period, JITTER_FACTOR);
            assert!(d >= period && d < period.mul_f64(1.0 + JITTER_FACTOR), "{d:?}");
        }
    }
}
