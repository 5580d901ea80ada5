//! [`CertWatcher`]: the webhook server's serving certificate, read from files and re-read when
//! they change on disk (controller-runtime's `pkg/certwatcher`).
//!
//! Where it sits: inside the TLS handshake. rustls asks the [`ResolvesServerCert`] for a
//! certificate at every handshake; the watcher then compares the files' modification time and
//! size with those it last loaded and, when either changed, reads and parses both again. A new
//! pair is used from that handshake on; connections already open keep theirs. No task, no
//! restart: cert-manager (or a Secret volume's symlink swap) rewriting `tls.crt` and `tls.key`
//! takes effect on the next connection.
//!
//! A pair that cannot be used (a file half written, a key that does not match the certificate,
//! as between the two writes of a rotation) is not taken: the previous one keeps serving, a
//! warning names the files, and the next handshake tries again. Only the first load, at start,
//! fails hard ([`WebhookError::Certificate`](super::WebhookError::Certificate)), as
//! controller-runtime's server fails to start without a certificate.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

use super::error::WebhookError;

/// What identifies one version of a file on disk: its modification time and size.
type FileStamp = Option<(SystemTime, u64)>;

/// Serves the certificate and key in two PEM files, re-read at the first TLS handshake after
/// either file's modification time or size changed; a pair that cannot be used (half written,
/// or a key that does not match) leaves the previous one serving.
#[derive(Debug)]
pub struct CertWatcher {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    /// Invariant: `current` was parsed from the files as they were at `stamps`, or `stamps`
    /// names a version that failed to parse (so it is not retried until the files change
    /// again) while `current` still holds the last good pair.
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    stamps: (FileStamp, FileStamp),
    current: Arc<CertifiedKey>,
}

impl CertWatcher {
    /// Reads `cert_path` (a PEM chain, leaf first) and `key_path` (a PEM private key: PKCS#8,
    /// PKCS#1 or SEC1).
    ///
    /// # Errors
    /// [`WebhookError::Certificate`] if either cannot be read or parsed, or they do not match.
    pub fn new(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Result<CertWatcher, WebhookError> {
        let (cert_path, key_path) = (cert_path.into(), key_path.into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let stamps = (stamp(&cert_path), stamp(&key_path));
        let current = load(&cert_path, &key_path, &provider)?;
        Ok(CertWatcher {
            cert_path,
            key_path,
            provider,
            state: Mutex::new(Loaded { stamps, current }),
        })
    }

    /// The pair to serve now: re-read first if the files changed since the last look.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (stamp(&self.cert_path), stamp(&self.key_path));
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.stamps != stamps {
            state.stamps = stamps;
            match load(&self.cert_path, &self.key_path, &self.provider) {
                Ok(pair) => {
                    info!(cert = %self.cert_path.display(), "webhook serving certificate reloaded");
                    state.current = pair;
                }
                Err(e) => {
                    warn!(error = %e, "webhook serving certificate changed but cannot be used: serving the previous one");
                }
            }
        }
        state.current.clone()
    }
}

impl ResolvesServerCert for CertWatcher {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn stamp(path: &Path) -> FileStamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn load(
    cert_path: &Path,
    key_path: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<Arc<CertifiedKey>, WebhookError> {
    let failed = |what: &Path, reason: String| WebhookError::Certificate {
        path: what.to_owned(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| failed(cert_path, e.to_string()))?;
    if chain.is_empty() {
        return Err(failed(cert_path, "no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| failed(key_path, e.to_string()))?;
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| failed(key_path, e.to_string()))?;
    let pair = CertifiedKey::new(chain, key);
    pair.keys_match().map_err(|e| {
        failed(
            cert_path,
            format!("does not match the key in {}: {e}", key_path.display()),
        )
    })?;
    Ok(Arc::new(pair))
}
