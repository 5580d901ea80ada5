//! Whether the machine's `kubectl` can run, for tests that drive envtest with the real client.
//!
//! Where it sits: outside the server, beside the tests. Tests that run kubectl against envtest
//! (what kubectl sends, what it prints, the codegen corpus applied through it) skip on a machine
//! without kubectl; CI sets `KINFORMER_REQUIRE_KUBECTL=1`, so there a missing kubectl fails those
//! tests instead of letting them pass without running.

use std::process::{Command, Stdio};

/// The environment variable that turns a missing kubectl from a skip into a failure.
pub const REQUIRE_KUBECTL_ENV: &str = "KINFORMER_REQUIRE_KUBECTL";

/// Why a test that needs kubectl cannot run where kubectl is required.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kubectl is not installed (or `kubectl version --client` failed), and {REQUIRE_KUBECTL_ENV} is set")]
#[non_exhaustive]
pub struct KubectlRequired;

/// `Ok(true)` when `kubectl version --client` succeeds, `Ok(false)` when it does not and a test
/// may skip, and [`KubectlRequired`] when it does not but `KINFORMER_REQUIRE_KUBECTL` is set
/// (to anything but empty or `0`).
pub fn available() -> Result<bool, KubectlRequired> {
    let runs = Command::new("kubectl")
        .args(["version", "--client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let required = std::env::var(REQUIRE_KUBECTL_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    match (runs, required) {
        (true, _) => Ok(true),
        (false, false) => Ok(false),
        (false, true) => Err(KubectlRequired),
    }
}
