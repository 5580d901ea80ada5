//! [`CertWatcher`]: the webhook server's serving certificate, read from files and re-read when
//! they change on disk (controller-runtime's `pkg/certwatcher`).
//!
//! Where it sits: inside the TLS handshake. rustls asks the [`ResolvesServerCert`] for a
//! certificate at every handshake; the watcher then compares each file's metadata
//! (modification time, size, and on Unix device, inode and change time) with what it saw last
//! and, when any changed, reads and parses both again. Metadata alone misses a same-size
//! rewrite in place within one tick of the file system's clock (the modification time does not
//! move), so while a file's modification time is within `RACY_WINDOW` (2 s) of the last time the
//! contents were read (git's "racily clean" entries), the handshake also reads both files and
//! compares their bytes with those loaded. That costs two small reads per handshake only in
//! the seconds after a change; a pair older than that is checked by `stat` alone. A new pair
//! is used from that handshake on; connections already open keep theirs. No task, no
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
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

use super::error::WebhookError;

/// How close a file's modification time may be to the last read of its contents before that
/// time no longer proves the contents unchanged: a rewrite within the same tick of the file
/// system's clock keeps it. Two seconds cover the coarsest common clock (FAT's).
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// What `stat` says of one version of a file: its modification time and size, and on Unix
/// which inode it is and when its inode last changed (a rename-in or `cp -p` moves these even
/// where the modification time is kept). `None` when the file cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    modified: SystemTime,
    len: u64,
    #[cfg(unix)]
    inode: (u64, u64, i64, i64),
}

/// Serves the certificate and key in two PEM files, re-read at the first TLS handshake after
/// either file changed (see the module docs for how a change is noticed); a pair that cannot
/// be used (half written, or a key that does not match) leaves the previous one serving.
#[derive(Debug)]
pub struct CertWatcher {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    /// Invariant: `current` was parsed from `contents`, the files' bytes when their metadata
    /// was `stamps`; or `stamps` and `contents` name a version that failed to parse (so it is
    /// not retried until the files change again) while `current` still holds the last good
    /// pair. `verified_at` was taken before the files' contents were last read and found
    /// equal to `contents`.
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    stamps: (Option<FileStamp>, Option<FileStamp>),
    contents: (Vec<u8>, Vec<u8>),
    verified_at: SystemTime,
    current: Arc<CertifiedKey>,
}

impl Loaded {
    /// Whether `stat` cannot tell a rewrite from the version loaded: a file's modification
    /// time is within [`RACY_WINDOW`] of (or after) the last read of the contents.
    fn racy(&self) -> bool {
        let Some(horizon) = self.verified_at.checked_sub(RACY_WINDOW) else {
            return true;
        };
        [self.stamps.0, self.stamps.1]
            .iter()
            .flatten()
            .any(|stamp| stamp.modified >= horizon)
    }
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
        let verified_at = SystemTime::now();
        let contents = read(&cert_path, &key_path)?;
        let current = load(&cert_path, &key_path, &contents, &provider)?;
        Ok(CertWatcher {
            cert_path,
            key_path,
            provider,
            state: Mutex::new(Loaded {
                stamps,
                contents,
                verified_at,
                current,
            }),
        })
    }

    /// The pair to serve now: re-read first if the files changed since the last look.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (stamp(&self.cert_path), stamp(&self.key_path));
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.stamps == stamps && !state.racy() {
            return state.current.clone();
        }
        let read_at = SystemTime::now();
        let contents = match read(&self.cert_path, &self.key_path) {
            Ok(contents) => contents,
            Err(e) => {
                if state.stamps != stamps {
                    warn!(error = %e, "webhook serving certificate changed but cannot be read: serving the previous one");
                }
                state.stamps = stamps;
                return state.current.clone();
            }
        };
        state.stamps = stamps;
        if contents == state.contents {
            state.verified_at = read_at;
            return state.current.clone();
        }
        match load(&self.cert_path, &self.key_path, &contents, &self.provider) {
            Ok(pair) => {
                info!(cert = %self.cert_path.display(), "webhook serving certificate reloaded");
                state.current = pair;
            }
            Err(e) => {
                warn!(error = %e, "webhook serving certificate changed but cannot be used: serving the previous one");
            }
        }
        state.contents = contents;
        state.verified_at = read_at;
        state.current.clone()
    }
}

impl ResolvesServerCert for CertWatcher {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: meta.modified().ok()?,
        len: meta.len(),
        #[cfg(unix)]
        inode: {
            use std::os::unix::fs::MetadataExt as _;
            (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
        },
    })
}

/// Both files' bytes.
fn read(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), WebhookError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| WebhookError::Certificate {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    };
    Ok((read(cert_path)?, read(key_path)?))
}

/// The pair in `contents`, read from `cert_path` and `key_path` (named in errors).
fn load(
    cert_path: &Path,
    key_path: &Path,
    contents: &(Vec<u8>, Vec<u8>),
    provider: &rustls::crypto::CryptoProvider,
) -> Result<Arc<CertifiedKey>, WebhookError> {
    let failed = |what: &Path, reason: String| WebhookError::Certificate {
        path: what.to_owned(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(&contents.0)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(cert_path, e.to_string()))?;
    if chain.is_empty() {
        return Err(failed(cert_path, "no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(&contents.1).map_err(|e| failed(key_path, e.to_string()))?;
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

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    /// A self-signed pair for `localhost`: (certificate PEM, key PEM).
    fn pair() -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn served_der(watcher: &CertWatcher) -> Vec<u8> {
        watcher.current().cert[0].to_vec()
    }

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
    }

    #[test]
    fn a_same_size_rewrite_that_stat_cannot_see_is_served_at_the_next_look() {
        let dir = std::env::temp_dir().join(format!("kinformer-certwatcher-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        let first = pair();
        std::fs::write(&cert_path, &first.0).unwrap();
        std::fs::write(&key_path, &first.1).unwrap();
        let watcher = CertWatcher::new(&cert_path, &key_path).unwrap();
        assert_eq!(served_der(&watcher), der(&first.0));

        // A pair of the same sizes (ECDSA signatures vary by a byte or two), written in place.
        let second = std::iter::repeat_with(pair)
            .take(1000)
            .find(|p| p.0.len() == first.0.len() && p.1.len() == first.1.len() && p.0 != first.0)
            .expect("a same-size pair within 1000 tries");
        std::fs::write(&cert_path, &second.0).unwrap();
        std::fs::write(&key_path, &second.1).unwrap();
        // As within one tick of the file system's clock: `stat` shows what it showed before.
        watcher.state.lock().unwrap().stamps = (stamp(&cert_path), stamp(&key_path));
        assert_eq!(served_der(&watcher), der(&second.0), "the rewrite is served");

        // Once the files are older than the window, `stat` alone decides.
        let mut state = watcher.state.lock().unwrap();
        state.verified_at = SystemTime::now() + RACY_WINDOW * 2;
        assert!(!state.racy());
        state.verified_at = SystemTime::now();
        assert!(state.racy());
        drop(state);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
