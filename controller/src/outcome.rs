//! The errors that steer what a controller does after a failed reconcile: [`TerminalError`]
//! (do not retry), [`RequeueAfterError`] (retry after a delay, not rate-limited), and the two a
//! worker makes itself, [`ReconcileTimeout`] and [`ReconcilePanic`], which take the same error
//! path as the reconciler's own errors (the log, the metrics and the
//! [error policy](crate::Controller::error_policy) see them).
//!
//! Each is found anywhere in an error's source chain (as Go's `errors.Is`), so a reconciler may
//! wrap one in its own error type, provided that type returns it from
//! [`source`](std::error::Error::source).
//!
//! | a reconcile ends with | the controller does |
//! |---|---|
//! | `Ok(Action::Done)` | `forget` (reset the key's backoff); `result="success"` |
//! | `Ok(Action::Requeue)` | `add_rate_limited`; `result="requeue"` |
//! | `Ok(Action::RequeueAfter(d))` | `forget`, then `add_after(d)`; `result="requeue_after"` |
//! | `Err(e)`, a [`TerminalError`] in its chain | `forget`, no retry; also counted in `controller_runtime_terminal_reconcile_errors_total` |
//! | `Err(e)`, a [`RequeueAfterError`] in its chain | `add_after(d)`, backoff untouched (neither advanced nor reset) |
//! | `Err(e)`, a 409 or 404 `kube::Error::Api` in its chain ([stale-cache race](crate::error_chain)) | `add_rate_limited`, logged at INFO; `result="requeue"`, not counted as an error, the error policy not asked |
//! | `Err(e)`, otherwise, with an error policy | the policy's [`Action`](crate::Action), as above (`Done` forgets, `Requeue` is rate-limited, `RequeueAfter(d)` is `add_after(d)` with the backoff untouched) |
//! | `Err(e)`, otherwise | `add_rate_limited` (controller-runtime's default) |
//! | past the reconcile timeout | cancelled, then as `Err(ReconcileTimeout)`; also counted in `controller_runtime_reconcile_timeouts_total` |
//! | a panic (recovery on, the default) | as `Err(ReconcilePanic)`; also counted in `controller_runtime_reconcile_panics_total` |
//! | a panic (recovery off) | counted; the controller stops at once and its `run` returns [`ControllerError::ReconcilePanicked`](crate::ControllerError::ReconcilePanicked) |
//!
//! Every other error is logged with its source chain (at WARN when it is retried, at ERROR when
//! it is terminal or a recovered panic) and counted in
//! `controller_runtime_reconcile_errors_total` and `controller_runtime_reconcile_total{result="error"}`.
//!
//! ```
//! use controller::{Action, BoxError, Context, Request, RequeueAfterError, reconciler_fn, terminal};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use std::time::Duration;
//!
//! let reconciler = reconciler_fn(|req: Request, ctx: Context<ConfigMap>| async move {
//!     let Some(cm) = ctx.get(&req)? else { return Ok::<_, BoxError>(Action::Done) };
//!     match cm.data.as_ref().and_then(|d| d.get("mode")).map(String::as_str) {
//!         // Retrying cannot help until someone edits the object (which enqueues it anyway).
//!         Some("bogus") => Err(terminal("mode \"bogus\" is not supported").into()),
//!         // Waiting on something that sends no event: poll it, without the growing backoff.
//!         None => Err(RequeueAfterError::new(Duration::from_secs(10), "mode not set yet").into()),
//!         Some(_) => Ok(Action::Done),
//!     }
//! });
//! # let _ = reconciler;
//! ```

use std::time::Duration;

use crate::reconciler::BoxError;

/// A reconcile error that retrying will not fix (controller-runtime's
/// `reconcile.TerminalError`): it is logged and counted like any error, and also in
/// `controller_runtime_terminal_reconcile_errors_total`; the key is forgotten (its backoff
/// reset) and not requeued. The next change to the object enqueues it as usual.
///
/// Found anywhere in the error's source chain. It takes precedence over a
/// [`RequeueAfterError`] in the same chain and over the error policy, which is not asked.
#[derive(Debug, thiserror::Error)]
#[error("terminal error")]
pub struct TerminalError {
    #[source]
    source: BoxError,
}

impl TerminalError {
    /// Marks `source` as terminal.
    pub fn new(source: impl Into<BoxError>) -> Self {
        TerminalError { source: source.into() }
    }

    /// The error it marks.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// The error it marks, unwrapped.
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

/// Marks `error` as terminal: `Err(terminal(e).into())` (controller-runtime's
/// `reconcile.TerminalError(err)`). See [`TerminalError`].
pub fn terminal(error: impl Into<BoxError>) -> TerminalError {
    TerminalError::new(error)
}

/// A reconcile error with the delay after which to try again: the error is logged and counted
/// like any other, and the key is requeued after [`after`](Self::after), not after the rate
/// limiter's backoff, whose count for the key is left as it was (a later plain error goes on
/// from there).
///
/// Where this differs from controller-runtime: a Go reconciler may return
/// `(Result{RequeueAfter: d}, err)`, but controller-runtime (0.24 as 0.15) then ignores the
/// result, logs a warning and requeues rate-limited. The issue asked for the delay to be
/// honoured, so it is, and the shape is an error rather than a second return value so that it
/// can be returned from deep in a reconcile with `?`.
#[derive(Debug, thiserror::Error)]
#[error("retrying after {after:?}")]
pub struct RequeueAfterError {
    after: Duration,
    #[source]
    source: BoxError,
}

impl RequeueAfterError {
    /// `source`, to be retried after `after`.
    pub fn new(after: Duration, source: impl Into<BoxError>) -> Self {
        RequeueAfterError {
            after,
            source: source.into(),
        }
    }

    /// The delay before the retry.
    pub fn after(&self) -> Duration {
        self.after
    }

    /// The error itself.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

/// The error a reconcile ends with when it ran past the controller's reconcile timeout: its
/// context's token was cancelled and its future dropped.
#[derive(Debug, Clone, thiserror::Error)]
#[error("reconcile did not finish within {timeout:?}: cancelled")]
#[non_exhaustive]
pub struct ReconcileTimeout {
    /// The timeout it ran past.
    pub timeout: Duration,
}

impl ReconcileTimeout {
    /// A timeout after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        ReconcileTimeout { timeout }
    }
}

/// The error a reconcile ends with when it panicked and panic recovery is on (the default):
/// the panic's message, as controller-runtime's `panic: <message> [recovered]`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("panic: {message} [recovered]")]
#[non_exhaustive]
pub struct ReconcilePanic {
    /// The panic's message (or a placeholder for a payload that is not a string).
    pub message: String,
}

impl ReconcilePanic {
    /// A recovered panic with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        ReconcilePanic {
            message: message.into(),
        }
    }
}

/// The first error of type `E` in `e`'s source chain, `e` included.
pub fn find_in_chain<'a, E: std::error::Error + 'static>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a E> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("wrapper")]
    struct Wrapper(#[source] TerminalError);

    #[test]
    fn terminal_is_found_through_a_wrapper_and_displays_as_controller_runtime() {
        let e: BoxError = Box::new(Wrapper(terminal("boom")));
        let found = find_in_chain::<TerminalError>(&*e).expect("found");
        assert_eq!(found.to_string(), "terminal error");
        assert_eq!(found.inner().to_string(), "boom");
        assert!(find_in_chain::<RequeueAfterError>(&*e).is_none());
    }

    #[test]
    fn requeue_after_carries_its_delay() {
        let e: BoxError = RequeueAfterError::new(Duration::from_secs(3), "not yet").into();
        let found = find_in_chain::<RequeueAfterError>(&*e).expect("found");
        assert_eq!(found.after(), Duration::from_secs(3));
        assert_eq!(found.inner().to_string(), "not yet");
        assert_eq!(ReconcilePanic::new("x").to_string(), "panic: x [recovered]");
    }
}
