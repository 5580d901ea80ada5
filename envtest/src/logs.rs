//! `tracing` output in tests: log lines a test reads back ([`Logs`]), and a test's own log
//! filtered by `RUST_LOG` ([`init_from_env`]).
//!
//! Where it sits: outside the server, beside the tests (like [`crate::fixtures`]); nothing in
//! the request path uses it. It lives here because every crate whose tests assert on a log line
//! (kinformer-core, kinformer-factory, kinformer-controller) already has envtest as a
//! dev-dependency, and envtest depends on none of them, so one copy serves them all.
//!
//! [`Logs`] is the writer; [`Logs::set_default`] installs a plain-text (no ANSI colours)
//! `tracing_subscriber::fmt` subscriber that writes into it for the current thread, and
//! [`Logs::set_global_default`] for the whole process, every thread. [`init_from_env`] is for
//! the other tests: their log goes through the test harness's output capture, for reading a
//! failure, and no test asserts on it.
//!
//! ```
//! use envtest::logs::Logs;
//!
//! let logs = Logs::default();
//! let _guard = logs.set_default(tracing::Level::INFO);
//! tracing::warn!(resource = "configmaps", "list failed");
//! tracing::debug!("below the level: not kept");
//! let text = logs.text();
//! let line = text.lines().find(|line| line.contains("list failed")).expect(&text);
//! assert!(line.contains(" WARN ") && line.contains("resource=\"configmaps\""), "{line}");
//! assert!(!text.contains("below the level"), "{text}");
//! ```

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tracing::Level;
use tracing::subscriber::{DefaultGuard, SetGlobalDefaultError};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Installs, once per process, a `fmt` subscriber that writes through the test harness's output
/// capture (printed for a failing test, and for every test under `--nocapture`), filtered by
/// `RUST_LOG`, or keeping `default` and above where `RUST_LOG` is unset or names no directive.
///
/// Every test of a binary may call it: a later call, or one after another global subscriber
/// was set, leaves that subscriber in place.
pub fn init_from_env(default: Level) {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::from_level(default).into())
        .from_env_lossy();
    // An error only says a global subscriber (or `log` logger) is set already: it stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// The bytes a `tracing` subscriber wrote, kept for a test to read with [`Logs::text`].
///
/// Clones share one buffer: the subscriber writes through its clone, the test reads through
/// its own.
#[derive(Clone, Debug, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Installs a plain-text `fmt` subscriber writing here, keeping events up to `max_level`,
    /// as the current thread's default until the guard is dropped.
    ///
    /// Only events on this thread are seen: suited to a `current_thread` runtime.
    #[must_use = "the subscriber is the default only while the guard lives"]
    pub fn set_default(&self, max_level: Level) -> DefaultGuard {
        tracing::subscriber::set_default(self.subscriber(max_level))
    }

    /// Installs a plain-text `fmt` subscriber writing here, keeping events up to `max_level`,
    /// as the process's global default.
    ///
    /// A process has one global default: this fails if one is set already, so a test that
    /// calls it is best alone in its test binary.
    pub fn set_global_default(&self, max_level: Level) -> Result<(), SetGlobalDefaultError> {
        tracing::subscriber::set_global_default(self.subscriber(max_level))
    }

    /// Everything written so far, as text (invalid UTF-8 replaced by U+FFFD).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer()).into_owned()
    }

    fn subscriber(&self, max_level: Level) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .with_max_level(max_level)
            .finish()
    }

    /// The buffer, also after a test thread panicked while writing: the bytes are still the
    /// log's, and a test reading them wants to see them.
    fn buffer(&self) -> MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl MakeWriter<'_> for Logs {
    type Writer = Logs;

    fn make_writer(&self) -> Logs {
        self.clone()
    }
}
