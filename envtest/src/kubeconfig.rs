//! Writing a kubeconfig that points at a running server.
//!
//! The file is JSON (valid YAML), which both kubectl and `kube::Client::try_default()` read.

use crate::error::Error;
use serde_json::json;
use std::path::Path;

/// The kubeconfig document for `server` (and an optional bearer token).
pub fn kubeconfig(server: &str, token: Option<&str>) -> serde_json::Value {
    let user = match token {
        Some(t) => json!({"token": t}),
        None => json!({}),
    };
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {"server": server}}],
        "users": [{"name": "envtest", "user": user}],
        "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "envtest", "namespace": "default"}}],
        "current-context": "envtest",
        "preferences": {},
    })
}

/// Writes the kubeconfig to `path`.
pub(crate) fn write(path: &Path, server: &str, token: Option<&str>) -> Result<(), Error> {
    let doc = serde_json::to_vec_pretty(&kubeconfig(server, token))?;
    std::fs::write(path, doc)?;
    Ok(())
}
