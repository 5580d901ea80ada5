//! Printing an error with its causes, each once: how the [`Reflector`](crate::Reflector)'s
//! failure lines, and the controller's reconcile error lines (which re-export this), show an
//! error.
//!
//! Errors from kube repeat their cause in their own text (`kube::Error::Api` prints its
//! `Status`, then returns that `Status` as its source; a `#[error("{0}")]` wrapper prints its
//! source, then returns it). [`ErrorChain`] prints `error: source: source …` and leaves out a
//! source whose text its parent's text already contains, so every cause appears once.
//!
//! ```
//! use informer_core::ErrorChain;
//!
//! let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
//! let e = kube::Error::Service(Box::new(io));
//! assert_eq!(ErrorChain(&e).to_string(), "ServiceError: connection refused");
//! ```

use std::error::Error;
use std::fmt;

/// Displays an error and its sources as `error: source: source …`, skipping a source whose text
/// is already contained in its parent's text (the parent printed it).
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parent = self.0.to_string();
        f.write_str(&parent)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if !parent.contains(&text) {
                write!(f, ": {text}")?;
            }
            parent = text;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
