//! TLS serving ([`Config::tls`](crate::Config::tls)): a certificate authority and a serving
//! certificate made fresh at every start, and a listener that hands axum only connections whose
//! handshake finished.
//!
//! Like kube-apiserver started without certificates (it writes a self-signed pair under
//! `--cert-dir`), the server makes its own: a CA ("envtest CA") and a serving certificate it
//! signs for `127.0.0.1`, `::1` and `localhost`. Clients trust the CA alone, which
//! [`Server::kube_config`](crate::Server::kube_config) and the written kubeconfig
//! (`certificate-authority-data`) carry, so a client verifies the server as it would a real
//! cluster, with no `insecure-skip-tls-verify`. Keys are ECDSA P-256 and live only in memory.
//!
//! Handshakes run on a task per connection with a deadline ([`HANDSHAKE_TIMEOUT`]), so a client
//! that connects and says nothing holds only its own connection, never the accept loop. ALPN
//! offers `http/1.1` only: the server speaks HTTP/1.1 (kubectl and kube's client both use it
//! when it is all that is offered).

use crate::error::Error;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// How long a client may take to finish its TLS handshake before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes finished but not yet taken by the HTTP server.
const ACCEPTED_BACKLOG: usize = 128;

/// The certificates of one server start.
pub(crate) struct Certificates {
    /// The CA certificate, PEM (for kubeconfigs).
    pub(crate) ca_pem: String,
    /// The CA certificate, DER (for `kube::Config::root_cert`).
    pub(crate) ca_der: Vec<u8>,
    /// rustls' server configuration with the serving certificate.
    pub(crate) server_config: Arc<rustls::ServerConfig>,
}

impl Certificates {
    /// Makes a CA and a serving certificate for the loopback names, signed by it.
    pub(crate) fn generate() -> Result<Certificates, Error> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let tls = |e: rcgen::Error| Error::Tls(e.to_string());
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.distinguished_name.push(DnType::CommonName, "envtest CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().map_err(tls)?).map_err(tls)?;

        let mut serving =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "::1".to_owned(), "localhost".to_owned()])
                .map_err(tls)?;
        serving.distinguished_name.push(DnType::CommonName, "envtest");
        serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate().map_err(tls)?;
        let serving_cert = serving.signed_by(&serving_key, &ca).map_err(tls)?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server_config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(
                vec![serving_cert.der().clone(), ca.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(serving_key.serialize_der())),
            )
            .map_err(|e| Error::Tls(e.to_string()))?;
        server_config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Certificates {
            ca_pem: ca.pem(),
            ca_der: CertificateDer::as_ref(ca.der()).to_vec(),
            server_config: Arc::new(server_config),
        })
    }
}

/// An [`axum::serve::Listener`] of finished TLS handshakes, fed by [`accept_loop`].
pub(crate) struct TlsListener {
    local: SocketAddr,
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept loop ended (shutdown): no more connections; graceful shutdown ends serving.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Starts accepting TCP connections on `listener` and handshaking them; returns the listener
/// axum serves. The accept loop ends with `cancel`.
pub(crate) fn listen(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    cancel: CancellationToken,
) -> std::io::Result<TlsListener> {
    let local = listener.local_addr()?;
    let (tx, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
    tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), tx, cancel));
    Ok(TlsListener { local, accepted })
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    accepted: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    cancel: CancellationToken,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = cancel.cancelled() => return,
            result = listener.accept() => match result {
                Ok(connection) => connection,
                Err(e) => {
                    // Out of file descriptors and the like: back off a little, as hyper does.
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let (acceptor, accepted) = (acceptor.clone(), accepted.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = accepted.send((stream, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}
