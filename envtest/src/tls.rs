//! TLS serving ([`Config::tls`](crate::Config::tls)): a certificate authority and a serving
//! certificate, made fresh at every start or kept in a directory
//! ([`Config::cert_dir`](crate::Config::cert_dir)).
//!
//! Like kube-apiserver started without certificates (it writes a self-signed pair under
//! `--cert-dir`), the server makes its own: a CA ("envtest CA") and a serving certificate it
//! signs for `127.0.0.1`, `::1`, `localhost` and the listen address. Clients trust the CA alone,
//! which [`Server::kube_config`](crate::Server::kube_config) and the written kubeconfig
//! (`certificate-authority-data`) carry, so a client verifies the server as it would a real
//! cluster, with no `insecure-skip-tls-verify`. Keys are ECDSA P-256.
//!
//! Without a cert dir the keys live only in memory, so every start has a new CA and a client
//! holding an old kubeconfig fails after a restart. With one, the files are kubeadm's names:
//!
//! | file | content | mode |
//! |---|---|---|
//! | `ca.crt`, `ca.key` | the CA, made on first start, then reused as they are | 0644, 0600 |
//! | `apiserver.crt`, `apiserver.key` | the serving pair, signed by the CA | 0644, 0600 |
//!
//! The directory is created mode 0700. A serving certificate is reused only if a client
//! trusting `ca.crt` would accept it for the listen address a day from now (so not expired, not
//! about to be, signed by this CA, naming the address) and its key matches; otherwise a new pair
//! is signed by the same CA. A CA with one of its two files missing or unreadable is an error,
//! never silently replaced (that would break every client holding the old one). Files are
//! written to a fresh temporary file and renamed into place.
//!
//! The handshake itself runs in the `http-serving` crate, per connection, under
//! [`HANDSHAKE_TIMEOUT`] (`Config::serving`'s `tls_handshake_timeout`). ALPN offers `http/1.1`
//! only: the server speaks HTTP/1.1 (kubectl and kube's client both use it when it is all that
//! is offered).

use crate::error::Error;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The default time a client may take to finish its TLS handshake before the connection is
/// closed ([`http_serving::DEFAULT_TLS_HANDSHAKE_TIMEOUT`]; set with `Config::serving`).
pub const HANDSHAKE_TIMEOUT: Duration = http_serving::DEFAULT_TLS_HANDSHAKE_TIMEOUT;

/// A reused serving certificate must stay valid at least this long.
const VALIDITY_MARGIN: Duration = Duration::from_secs(24 * 3600);

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const SERVING_CERT: &str = "apiserver.crt";
const SERVING_KEY: &str = "apiserver.key";

/// The certificates of one server start.
pub(crate) struct Certificates {
    /// The CA certificate, PEM (for kubeconfigs).
    pub(crate) ca_pem: String,
    /// The CA certificate, DER (for `kube::Config::root_cert`).
    pub(crate) ca_der: Vec<u8>,
    /// rustls' server configuration with the serving certificate.
    pub(crate) server_config: Arc<rustls::ServerConfig>,
}

fn tls(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

/// The CA's parameters: the same at every start, so a CA key read back from a cert dir signs
/// certificates whose issuer is the stored CA certificate's subject.
fn ca_params() -> Result<CertificateParams, Error> {
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name.push(DnType::CommonName, "envtest CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    Ok(ca)
}

/// A serving certificate for the loopback names and `ip`, signed by `issuer`: (DER, PEM, key).
fn sign_serving(issuer: &Issuer<'_, KeyPair>, ip: IpAddr) -> Result<(CertificateDer<'static>, String, KeyPair), Error> {
    let mut names = vec!["127.0.0.1".to_owned(), "::1".to_owned(), "localhost".to_owned()];
    if !names.contains(&ip.to_string()) {
        names.push(ip.to_string());
    }
    let mut serving = CertificateParams::new(names).map_err(tls)?;
    serving.distinguished_name.push(DnType::CommonName, "envtest");
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(tls)?;
    let cert = serving.signed_by(&key, issuer).map_err(tls)?;
    Ok((cert.der().clone(), cert.pem(), key))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(
    serving: CertificateDer<'static>,
    ca: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls)?
        .with_no_client_auth()
        .with_single_cert(vec![serving, ca], key)
        .map_err(tls)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl Certificates {
    /// Makes a CA and a serving certificate for the loopback names, signed by it, in memory.
    pub(crate) fn generate() -> Result<Certificates, Error> {
        let ca_key = KeyPair::generate().map_err(tls)?;
        let ca = ca_params()?.self_signed(&ca_key).map_err(tls)?;
        let issuer = Issuer::new(ca_params()?, ca_key);
        let (serving, _, key) = sign_serving(&issuer, IpAddr::from([127, 0, 0, 1]))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok(Certificates {
            ca_pem: ca.pem(),
            ca_der: ca.der().to_vec(),
            server_config: server_config(serving, ca.der().clone(), key)?,
        })
    }

    /// The certificates kept in `dir` (see the module docs), created there if absent; the
    /// serving certificate must name `ip`.
    pub(crate) fn load_or_create(dir: &Path, ip: IpAddr) -> Result<Certificates, Error> {
        create_private_dir(dir)?;
        let (ca_path, ca_key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
        let (ca_pem, ca_key, ca_is_new) = match (ca_path.exists(), ca_key_path.exists()) {
            (true, true) => {
                let pem = std::fs::read_to_string(&ca_path)?;
                let key = KeyPair::from_pem(&std::fs::read_to_string(&ca_key_path)?)
                    .map_err(|e| tls(format!("{}: {e}", ca_key_path.display())))?;
                (pem, key, false)
            }
            (false, false) => {
                let key = KeyPair::generate().map_err(tls)?;
                let ca = ca_params()?.self_signed(&key).map_err(tls)?;
                crate::kubeconfig::write_file(&ca_key_path, key.serialize_pem().as_bytes(), 0o600)?;
                crate::kubeconfig::write_file(&ca_path, ca.pem().as_bytes(), 0o644)?;
                tracing::info!(dir = %dir.display(), "created the envtest CA");
                (ca.pem(), key, true)
            }
            _ => {
                return Err(tls(format!(
                    "{}: {CA_CERT} and {CA_KEY} must both exist or both be absent",
                    dir.display()
                )));
            }
        };
        let ca_der = CertificateDer::from_pem_slice(ca_pem.as_bytes())
            .map_err(|e| tls(format!("{}: {e}", ca_path.display())))?;
        if !ca_is_new {
            match reuse_serving(dir, &ca_der, ip) {
                Ok(server_config) => {
                    return Ok(Certificates {
                        ca_pem,
                        ca_der: ca_der.to_vec(),
                        server_config,
                    });
                }
                Err(why) => {
                    tracing::info!(dir = %dir.display(), reason = %why, "signing a new serving certificate");
                }
            }
        }
        let issuer = Issuer::new(ca_params()?, ca_key);
        let (serving, serving_pem, key) = sign_serving(&issuer, ip)?;
        crate::kubeconfig::write_file(&dir.join(SERVING_KEY), key.serialize_pem().as_bytes(), 0o600)?;
        crate::kubeconfig::write_file(&dir.join(SERVING_CERT), serving_pem.as_bytes(), 0o644)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok(Certificates {
            ca_pem,
            ca_der: ca_der.to_vec(),
            server_config: server_config(serving, ca_der, key)?,
        })
    }
}

/// The stored serving pair, if a client trusting `ca` accepts it for `ip` a day from now and
/// its key matches; else why not.
fn reuse_serving(dir: &Path, ca: &CertificateDer<'static>, ip: IpAddr) -> Result<Arc<rustls::ServerConfig>, Error> {
    let cert_path = dir.join(SERVING_CERT);
    let serving =
        CertificateDer::from_pem_file(&cert_path).map_err(|e| tls(format!("{}: {e}", cert_path.display())))?;
    let key_path = dir.join(SERVING_KEY);
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| tls(format!("{}: {e}", key_path.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).map_err(tls)?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(tls)?;
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(VALIDITY_MARGIN);
    verifier
        .verify_server_cert(
            &serving,
            &[],
            &ServerName::IpAddress(ip.into()),
            &[],
            UnixTime::since_unix_epoch(later),
        )
        .map_err(|e| tls(format!("{}: {e}", cert_path.display())))?;
    // Also checks that the key is the certificate's.
    server_config(serving, ca.clone(), key)
}

fn create_private_dir(dir: &Path) -> Result<(), Error> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)?;
    Ok(())
}
