//! Writing a kubeconfig that points at a running server.
//!
//! The file is JSON (valid YAML), which both kubectl and `kube::Client::try_default()` read.

use crate::error::Error;
use base64::Engine;
use serde_json::json;
use std::path::Path;

/// The kubeconfig document for `server`, with an optional bearer token and, for an `https://`
/// server, the PEM of the CA that signed its certificate (`certificate-authority-data`).
pub fn kubeconfig(server: &str, token: Option<&str>, ca_pem: Option<&str>) -> serde_json::Value {
    let user = match token {
        Some(t) => json!({"token": t}),
        None => json!({}),
    };
    let mut cluster = json!({"server": server});
    if let Some(pem) = ca_pem {
        cluster["certificate-authority-data"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": cluster}],
        "users": [{"name": "envtest", "user": user}],
        "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "envtest", "namespace": "default"}}],
        "current-context": "envtest",
        "preferences": {},
    })
}

/// Writes the kubeconfig to `path`, readable by its owner only (it holds the token).
///
/// The document goes to a new file created exclusively (`O_EXCL`, mode 0600) beside `path` and
/// is then renamed over it: a file or symlink someone planted at `path` is replaced, never
/// followed or written through, and a reader never sees half a file.
pub(crate) fn write(path: &Path, server: &str, token: Option<&str>, ca_pem: Option<&str>) -> Result<(), Error> {
    let doc = serde_json::to_vec_pretty(&kubeconfig(server, token, ca_pem))?;
    write_file(path, &doc, 0o600)
}

/// Writes `contents` to a new file beside `path` (created exclusively with `mode`) and renames
/// it over `path`: a reader never sees half a key, and a planted symlink is replaced, not
/// followed.
pub(crate) fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), Error> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(
        ".{name}.{}.{:016x}.tmp",
        std::process::id(),
        rand::random::<u64>()
    ));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let written = (|| -> std::io::Result<()> {
        let mut file = options.open(&temp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    Ok(written?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(unix)]
    fn the_kubeconfig_is_private_and_replaces_a_planted_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!(
            "envtest-kubeconfig-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("victim");
        std::fs::write(&target, "do not touch").unwrap();
        let path = dir.join("kubeconfig");
        std::os::unix::fs::symlink(&target, &path).unwrap();

        write(&path, "http://127.0.0.1:1", Some("t0ken"), None).unwrap();

        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "do not touch",
            "the symlink was not followed"
        );
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file(), "the symlink itself was replaced");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(doc["users"][0]["user"]["token"], "t0ken");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
