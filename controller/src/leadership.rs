//! [`Leadership`]: whether this replica may still act as leader *by its own clock*, and a
//! token that fires the instant it may not; [`NotLeader`], the error of a write refused for it.
//!
//! Why it exists: a leader that is stopped (SIGSTOP, a long GC-like pause of the host, a
//! frozen VM) past its lease resumes with its workers and timers all due at once. Without a
//! check by the clock, a worker woken by I/O can send a write before the task renewing the
//! lease notices the loss, seconds after another replica took over. So every write the
//! framework makes for a controller, and every reconcile it starts, first asks
//! [`Leadership::is_valid`]: *the last successful renewal was sent less than `renew_deadline`
//! ago* (see [`LeaderElector::is_leader`]), which leaves `lease_duration - renew_deadline` for
//! a write checked just in time to reach the server before any other replica may take over
//! (they wait `lease_duration` from when they *saw* that renewal, which is later).
//!
//! This is a kinformer addition: controller-runtime stops its controllers when the elector's
//! `OnStoppedLeading` runs and then exits, and hands reconcilers no way to ask. A reconciler
//! reaches it through its [`Context`](crate::Context): `ctx.ensure_leading()?` before each of
//! its own writes, `ctx.cancelled()` to stop waiting when the term ends.
//!
//! What no client-side check can close: a request that passed its check and is still inside
//! the client (kube's request buffer, the connection task) when the process stops goes out when
//! it resumes, at most one per reconcile in flight (the leader chaos test sees a few in 20
//! seeds). Only a precondition the server checks (a `resourceVersion` the new leader's writes
//! change) fences those.
//!
//! ```
//! use controller::Leadership;
//!
//! // Without leader election (or with none configured), a replica always leads:
//! let leadership = Leadership::unconditional();
//! assert!(leadership.is_valid());
//! assert!(leadership.check().is_ok());
//! assert!(!leadership.token().is_cancelled());
//! ```

use std::fmt;

use tokio_util::sync::CancellationToken;

use crate::leader_election::LeaderElector;

/// One term of leadership of this replica (or none needed): valid while the lease is held by
/// the local clock; its [`token`](Self::token) fires the instant it stops being so. Cheap to
/// clone.
///
/// From [`LeaderElector::leadership`] (the term current then; it never becomes valid again once
/// it lapsed, even if the elector acquires the lease anew) or [`Leadership::unconditional`].
#[derive(Clone)]
pub struct Leadership {
    /// `None`: unconditional.
    elector: Option<LeaderElector>,
    /// Fires when the term ends (or, for a narrowed leadership, when its owner stops at once).
    token: CancellationToken,
}

impl Leadership {
    /// A leadership that holds until its token is cancelled by hand: for a controller run
    /// without leader election.
    pub fn unconditional() -> Self {
        Leadership {
            elector: None,
            token: CancellationToken::new(),
        }
    }

    pub(crate) fn of_term(elector: LeaderElector, term: CancellationToken) -> Self {
        Leadership {
            elector: Some(elector),
            token: term,
        }
    }

    /// The same leadership, with a token of its own that also fires when the term ends: its
    /// owner cancels it to end the leadership early for itself (a controller's `stop_now`).
    pub(crate) fn narrowed(&self) -> Self {
        Leadership {
            elector: self.elector.clone(),
            token: self.token.child_token(),
        }
    }

    /// Whether this replica may act as leader now: the token has not fired and, under leader
    /// election, the lease's last successful renewal was sent less than `renew_deadline` ago
    /// by the local clock (checked at every call: right after the process resumes from a
    /// stop, this is false before any timer has run).
    pub fn is_valid(&self) -> bool {
        !self.token.is_cancelled() && self.elector.as_ref().is_none_or(LeaderElector::is_leader)
    }

    /// `Ok` while [`is_valid`](Self::is_valid); the error to refuse a write with otherwise.
    pub fn check(&self) -> Result<(), NotLeader> {
        if self.is_valid() {
            return Ok(());
        }
        Err(match &self.elector {
            Some(elector) if !elector.is_leader() => NotLeader::LeaseLapsed {
                lease: format!("{}/{}", elector.config().lease_namespace, elector.lease_name()),
                identity: elector.identity().to_owned(),
            },
            _ => NotLeader::Stopped,
        })
    }

    /// Fires the instant this leadership ends: at the lease's validity deadline by the local
    /// clock (a timer the elector's `renew` re-arms at each renewal), when the lease is lost or
    /// given back, or when its owner stops at once. Never, for an unconditional leadership
    /// nobody cancels.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The elector behind it, if any.
    pub fn elector(&self) -> Option<&LeaderElector> {
        self.elector.as_ref()
    }
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership::unconditional()
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("lease", &self.elector.as_ref().map(LeaderElector::lease_name))
            .field("valid", &self.is_valid())
            .finish_non_exhaustive()
    }
}

/// A write (or a reconcile) refused because this replica may no longer act as leader. Not a
/// failure of the program: a deposed leader meets it while it stops, and logs it below ERROR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotLeader {
    /// The lease's validity lapsed by the local clock (no renewal sent within
    /// `renew_deadline` succeeded), or the lease was lost or given back.
    #[error("{identity} no longer holds the lease {lease} by its local clock: write refused")]
    LeaseLapsed {
        /// The Lease, as `namespace/name`.
        lease: String,
        /// This replica's identity.
        identity: String,
    },
    /// The controller was stopped at once (its `stop_now` fired): another process may act on
    /// these objects already.
    #[error("the controller was stopped at once: write refused")]
    Stopped,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_narrowed_leadership_ends_with_its_parent_or_on_its_own() {
        let parent = Leadership::unconditional();
        let (a, b) = (parent.narrowed(), parent.narrowed());
        a.token().cancel();
        assert_eq!(a.check(), Err(NotLeader::Stopped));
        assert!(b.is_valid() && parent.is_valid(), "siblings and parent unaffected");
        parent.token().cancel();
        assert!(!b.is_valid());
    }
}
