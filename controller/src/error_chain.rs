//! How a failed reconcile is reported: the worker (in [`controller`](crate::controller)) logs the
//! error with [`ErrorChain`], and asks [`stale_cache_race`] whether it is an ordinary race with
//! the informer cache rather than a failure.
//!
//! **Error chains printed once.** Errors from kube repeat their cause in their own text
//! (`kube::Error::Api` prints its `Status`, then returns that `Status` as its source; a
//! `#[error("{0}")]` wrapper prints its source, then returns it). [`ErrorChain`] prints
//! `error: source: source …` and leaves out a source whose text its parent's text already
//! contains, so every cause appears once.
//!
//! **Stale-cache races are requeues.** A reconciler reads from the cache and writes to the API
//! server; between the two the object may have changed (409 `Conflict`), been created by the
//! previous reconcile whose event the cache has not seen yet (409 `AlreadyExists`), or been deleted
//! (404 `NotFound`). Retrying with the next cache state is the whole fix, so the worker logs such
//! an error at INFO with the controller and key, requeues the key rate-limited and counts it as
//! `controller_runtime_reconcile_total{result="requeue"}`, not as an error. controller-runtime
//! counts every returned error as `result="error"`; its reconcilers conventionally catch these
//! cases and return `Result{Requeue: true}`, which is what this does for them.
//!
//! ```
//! use controller::error_chain::{ErrorChain, stale_cache_race};
//! use kube::core::Status;
//!
//! let e = kube::Error::Api(Box::new(Status::failure("the object has been modified", "Conflict").with_code(409)));
//! assert_eq!(stale_cache_race(&e).map(|s| s.code), Some(409));
//! // kube prints the Status in its own text and returns it as its source: shown once.
//! assert_eq!(ErrorChain(&e).to_string(), e.to_string());
//! ```

use std::error::Error;

use kube::core::Status;

/// Displays an error and its sources, each cause once (defined in informer-core, whose
/// reflector prints its list and watch failures with it).
pub use informer_core::ErrorChain;

/// The API server's answer if `e` (or one of its sources) is a stale-cache race: a
/// `kube::Error::Api` (or a bare [`Status`]) with code 409 (`Conflict`, `AlreadyExists`) or 404
/// (`NotFound`). `None` for any other error.
///
/// A reconciler that wants such an error treated as a real failure wraps it in a
/// [`TerminalError`](crate::TerminalError) or a [`RequeueAfterError`](crate::RequeueAfterError),
/// which the worker checks first.
pub fn stale_cache_race<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a Status> {
    let mut next = Some(e);
    while let Some(e) = next {
        let status = match e.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) => Some(&**status),
            _ => e.downcast_ref::<Status>(),
        };
        if let Some(status) = status.filter(|s| s.code == 409 || s.code == 404) {
            return Some(status);
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure(message, reason).with_code(code)))
    }

    #[derive(Debug, thiserror::Error)]
    enum SyncError {
        /// Prints its source: the chain must not print it again.
        #[error("{0}")]
        Transparent(#[source] kube::Error),
        /// Names what it did, then the source follows once.
        #[error("writing deployment foo")]
        Writing(#[source] kube::Error),
    }

    #[test]
    fn a_source_contained_in_its_parent_is_printed_once() {
        let e = SyncError::Transparent(api(404, "NotFound", "deployments.apps \"foo\" not found"));
        let shown = ErrorChain(&e).to_string();
        // Three links (the wrapper, kube's error, its Status), one copy of the message.
        assert_eq!(shown.matches("not found: NotFound").count(), 1, "{shown}");
        assert_eq!(
            shown,
            api(404, "NotFound", "deployments.apps \"foo\" not found").to_string()
        );
    }

    #[test]
    fn a_source_with_new_text_is_appended() {
        let e = SyncError::Writing(api(500, "InternalError", "etcd is down"));
        let shown = ErrorChain(&e).to_string();
        assert!(
            shown.starts_with("writing deployment foo: ApiError: etcd is down: InternalError"),
            "{shown}"
        );
        // kube's Status (the Api error's own source) is in the kube error's text: not repeated.
        assert_eq!(shown.matches("etcd is down: InternalError").count(), 1, "{shown}");
    }

    #[test]
    fn a_chain_of_distinct_texts_keeps_every_link() {
        let e = std::io::Error::other(SyncError::Writing(api(500, "InternalError", "boom")));
        // io::Error::other displays its inner error, and returns the inner's source as its own.
        let shown = ErrorChain(&e).to_string();
        assert!(
            shown.starts_with("writing deployment foo: ApiError: boom: InternalError"),
            "{shown}"
        );
    }

    #[test]
    fn conflicts_and_not_found_anywhere_in_the_chain_are_races() {
        for (code, reason) in [(409, "Conflict"), (409, "AlreadyExists"), (404, "NotFound")] {
            let e = SyncError::Writing(api(code, reason, "x"));
            assert_eq!(stale_cache_race(&e).map(|s| s.reason.as_str()), Some(reason));
            let boxed: Box<dyn Error + Send + Sync> = Box::new(e);
            assert!(stale_cache_race(&*boxed).is_some());
        }
        let bare = Status::failure("x", "Conflict").with_code(409);
        assert!(stale_cache_race(&bare).is_some());
    }

    #[test]
    fn other_errors_are_not_races() {
        for (code, reason) in [
            (500, "InternalError"),
            (422, "Invalid"),
            (403, "Forbidden"),
            (410, "Gone"),
        ] {
            assert!(
                stale_cache_race(&SyncError::Writing(api(code, reason, "x"))).is_none(),
                "{code}"
            );
        }
        assert!(stale_cache_race(&std::io::Error::other("409 conflict")).is_none());
    }
}
