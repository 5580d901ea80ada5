//! Health and readiness checks: controller-runtime's `pkg/healthz`, served by the
//! [`Manager`](crate::Manager) on its health probe address as `/healthz` and `/readyz`.
//!
//! A check is a name and a function returning `Ok(())` or an error ([`Checker`]). The root
//! path runs every check and answers as controller-runtime does:
//!
//! | request | all pass | one fails |
//! |---|---|---|
//! | `/healthz` | 200 `ok` | 500, one line per check, then `healthz check failed` |
//! | `/healthz?verbose` | 200, `[+]name ok` per check, then `healthz check passed` | as above |
//! | `/healthz?exclude=name` | `[+]name excluded: ok` for it | the others decide |
//! | `/healthz/<name>` | 200 `ok` | 500 `internal server error: <error>` |
//!
//! A failing check reads `[-]name failed: reason withheld` on the root path (the endpoint is
//! public; the reason is logged at DEBUG and shown on the check's own path). With no check
//! at all, a `ping` check that always passes is installed, as controller-runtime's
//! `InstallPathHandler` does.
//!
//! ```
//! use controller::healthz::Checker;
//!
//! let check = Checker::new("disk", || Ok(()));
//! assert_eq!(check.name(), "disk");
//! assert!(check.check().is_ok());
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::http::StatusCode;
use tracing::debug;

use crate::reconciler::BoxError;

/// A named check: controller-runtime's `healthz.Checker` (`healthz.NamedCheck`). Cheap to
/// clone. The function runs on every probe, on the HTTP server's task: it must be quick and
/// must not block.
#[derive(Clone)]
pub struct Checker {
    name: String,
    check: Arc<dyn Fn() -> Result<(), BoxError> + Send + Sync>,
}

impl Checker {
    /// A check named `name` (a path segment: `/healthz/<name>`).
    pub fn new(name: impl Into<String>, check: impl Fn() -> Result<(), BoxError> + Send + Sync + 'static) -> Self {
        Checker {
            name: name.into(),
            check: Arc::new(check),
        }
    }

    /// controller-runtime's `healthz.Ping`: always passes.
    pub fn ping() -> Self {
        Checker::new("ping", || Ok(()))
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs it.
    pub fn check(&self) -> Result<(), BoxError> {
        (self.check)()
    }
}

impl fmt::Debug for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checker")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The answer to `GET <root>?<query>` over `checks` (`root` is `healthz` or `readyz`, for the
/// log): controller-runtime's `handleRootHealthz`.
pub(crate) fn root(checks: &[Checker], query: Option<&str>, root: &str) -> (StatusCode, String) {
    let (verbose, mut excluded) = parse_query(query);
    let mut out = String::new();
    let mut failed = false;
    for check in checks {
        if excluded.remove(check.name()) {
            let _ = writeln!(out, "[+]{} excluded: ok", check.name());
            continue;
        }
        match check.check() {
            Ok(()) => {
                let _ = writeln!(out, "[+]{} ok", check.name());
            }
            Err(error) => {
                debug!(endpoint = root, checker = check.name(), %error, "health check failed");
                let _ = writeln!(out, "[-]{} failed: reason withheld", check.name());
                failed = true;
            }
        }
    }
    if !excluded.is_empty() {
        let names: Vec<String> = excluded.iter().map(|name| format!("{name:?}")).collect();
        let _ = writeln!(
            out,
            "warn: some health checks cannot be excluded: no matches for {}",
            names.join(",")
        );
    }
    if failed {
        // Always verbose on failure.
        out.push_str(&format!("{root} check failed\n"));
        return (StatusCode::INTERNAL_SERVER_ERROR, out);
    }
    if !verbose {
        return (StatusCode::OK, "ok".into());
    }
    out.push_str(&format!("{root} check passed\n"));
    (StatusCode::OK, out)
}

/// The answer to `GET <root>/<name>`: controller-runtime's `adaptCheckToHandler`; `None` if no
/// check has that name (a 404).
pub(crate) fn single(checks: &[Checker], name: &str) -> Option<(StatusCode, String)> {
    let check = checks.iter().find(|c| c.name() == name)?;
    Some(match check.check() {
        Ok(()) => (StatusCode::OK, "ok".into()),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {error}\n"),
        ),
    })
}

/// `verbose` present, and the `exclude` values.
fn parse_query(query: Option<&str>) -> (bool, BTreeSet<String>) {
    let mut verbose = false;
    let mut excluded = BTreeSet::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "verbose" => verbose = true,
            "exclude" => {
                excluded.insert(percent_decode(value));
            }
            _ => {}
        }
    }
    (verbose, excluded)
}

/// Decodes `%XX` escapes and `+` of a query value (check names are plain path segments; this
/// is enough for them).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks() -> Vec<Checker> {
        vec![Checker::ping(), Checker::new("broken", || Err("disk full".into()))]
    }

    #[test]
    fn root_answers_as_controller_runtime() {
        let ok = [Checker::ping()];
        assert_eq!(root(&ok, None, "healthz"), (StatusCode::OK, "ok".into()));
        assert_eq!(
            root(&ok, Some("verbose"), "healthz"),
            (StatusCode::OK, "[+]ping ok\nhealthz check passed\n".into())
        );
        assert_eq!(
            root(&checks(), None, "readyz"),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "[+]ping ok\n[-]broken failed: reason withheld\nreadyz check failed\n".into()
            )
        );
        assert_eq!(
            root(&checks(), Some("verbose&exclude=broken&exclude=nope"), "healthz"),
            (
                StatusCode::OK,
                "[+]ping ok\n[+]broken excluded: ok\nwarn: some health checks cannot be excluded: no matches for \"nope\"\nhealthz check passed\n"
                    .into()
            )
        );
    }

    #[test]
    fn a_single_check_shows_its_error() {
        assert_eq!(single(&checks(), "ping"), Some((StatusCode::OK, "ok".into())));
        assert_eq!(
            single(&checks(), "broken"),
            Some((
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal server error: disk full\n".into()
            ))
        );
        assert_eq!(single(&checks(), "absent"), None);
        assert_eq!(percent_decode("a%2Db+c%"), "a-b c%");
    }
}
