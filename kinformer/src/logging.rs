//! One-call log setup for a controller binary (feature `logging`, on by default).
//!
//! kinformer's crates log through [`tracing`]; nothing is printed until the application
//! installs a subscriber. [`init_logging`] installs one that writes to stderr, filtered by
//! `RUST_LOG` when it is set and by [`DEFAULT_FILTER`] otherwise, so a controller shows one
//! line per reconcile (its key and result) and the warnings and errors of everything else. An
//! application that sets up its own subscriber turns the feature off
//! (`default-features = false`) and drops the `tracing-subscriber` dependency.
//!
//! ```no_run
//! fn main() -> Result<(), kinformer::LoggingError> {
//!     kinformer::init_logging()?;
//!     kinformer::tracing::info!(app = "greeter", "starting");
//!     Ok(())
//! }
//! ```

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::{SubscriberInitExt, TryInitError};

/// The filter [`init_logging`] uses when `RUST_LOG` is unset or empty: warnings and errors from
/// every crate; from kinformer's controller crate its INFO lines (caches synced, workers
/// started, shutdown) and, inside each `reconcile` span, the line with the reconcile's result
/// (`reconciled` with `controller`, `key`, `result` and `elapsed`).
pub const DEFAULT_FILTER: &str = "warn,controller=info,controller::controller[reconcile]=debug";

/// Why [`init_logging`] installed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoggingError {
    /// `RUST_LOG` is set but is not a filter `tracing-subscriber`'s `EnvFilter` reads.
    #[error("RUST_LOG={value:?} is not a valid log filter (e.g. RUST_LOG=info,controller=debug)")]
    InvalidFilter {
        /// The value of `RUST_LOG`.
        value: String,
        /// What the filter parser said.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global `tracing` subscriber (or a `log` logger) was already installed, by an earlier
    /// call or by the application itself.
    #[error("logging not set up: a global tracing subscriber is already installed")]
    AlreadySet(#[source] TryInitError),
}

/// Installs a global `tracing` subscriber writing to stderr, filtered by `RUST_LOG` if set (in
/// `EnvFilter` syntax, as `env_logger` and kube-rs's examples read it), else by
/// [`DEFAULT_FILTER`]. Colours are used only when stderr is a terminal.
///
/// # Errors
///
/// [`LoggingError::InvalidFilter`] if `RUST_LOG` does not parse, [`LoggingError::AlreadySet`]
/// if a global subscriber is already installed; in both cases nothing is installed.
pub fn init_logging() -> Result<(), LoggingError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.trim().is_empty() => {
            EnvFilter::try_new(&value).map_err(|source| LoggingError::InvalidFilter { value, source })?
        }
        _ => EnvFilter::new(DEFAULT_FILTER),
    };
    let stderr = std::io::stderr();
    let ansi = stderr.is_terminal();
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi),
        )
        .try_init()
        .map_err(LoggingError::AlreadySet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_filter_parses() {
        EnvFilter::try_new(DEFAULT_FILTER).unwrap();
    }

    #[test]
    fn a_second_setup_is_an_error_not_a_panic() {
        // Both calls run in this test binary's process: whichever comes second fails. RUST_LOG
        // is whatever the test runner has; an invalid one fails both calls with InvalidFilter.
        let first = init_logging();
        let second = init_logging();
        match (first, second) {
            (Ok(()), Err(LoggingError::AlreadySet(_))) => {}
            (Err(LoggingError::InvalidFilter { .. }), Err(LoggingError::InvalidFilter { .. })) => {}
            other => panic!("{other:?}"),
        }
    }
}
