//! No connection is held forever (issue #28): a client that sends a request's headers too slowly
//! (or nothing), a TLS client that never finishes its handshake, and a keep-alive connection left
//! idle are closed by their deadlines; connections over the cap wait until one closes; and a
//! watch that streams longer than the idle timeout is not cut.
//!
//! Real sockets need real time: the deadlines are short (1 s), and each test asserts that the
//! server closed the connection within a generous bound, never that it took an exact time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envtest::{Config, Server, ServingConfig};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SHORT: Duration = Duration::from_secs(1);
/// Far above SHORT: a deadline that must not be the one that closes the connection.
const LONG: Duration = Duration::from_secs(60);
/// How long past its deadline a connection may take to be seen closed (a loaded CI machine).
const SLACK: Duration = Duration::from_secs(10);

/// Reads until the server closes the connection; returns how long that took from `since`.
/// Panics if it stays open past `bound`.
async fn closed_within(mut conn: impl AsyncRead + Unpin, since: Instant, bound: Duration) -> Duration {
    let mut buf = [0u8; 4096];
    let read_to_end = async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(bound, read_to_end)
        .await
        .unwrap_or_else(|_| panic!("the server kept the connection open past {bound:?}"));
    since.elapsed()
}

/// Reads one HTTP/1.1 response with a Content-Length body; returns its status code.
async fn read_response(conn: &mut (impl AsyncRead + Unpin)) -> u16 {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(SLACK, conn.read(&mut byte))
            .await
            .expect("a response in time")
            .expect("read");
        assert_eq!(
            n,
            1,
            "connection closed mid-response: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .expect("a Content-Length");
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).await.unwrap();
    head.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn serving() -> ServingConfig {
    ServingConfig::default()
        .read_header_timeout(LONG)
        .idle_timeout(LONG)
        .tls_handshake_timeout(LONG)
}

#[tokio::test]
async fn a_client_sending_no_header_or_a_partial_one_is_cut_after_the_header_timeout() {
    let env = Server::start(Config::default().serving(serving().read_header_timeout(SHORT)))
        .await
        .unwrap();
    let start = Instant::now();
    let silent = TcpStream::connect(env.addr()).await.unwrap();
    let mut partial = TcpStream::connect(env.addr()).await.unwrap();
    partial
        .write_all(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // A slowloris: one more header byte every 200 ms, for longer than the timeout. Each byte
    // must not push the deadline back.
    let (mut read_half, mut write_half) = partial.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..50 {
            if write_half.write_all(b"X").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let silent_after = closed_within(silent, start, SHORT + SLACK).await;
    let mut buf = [0u8; 1024];
    let partial_after = tokio::time::timeout(SHORT + SLACK, async {
        loop {
            match read_half.read(&mut buf).await {
                Ok(0) | Err(_) => return start.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the slowloris connection was not cut");
    for after in [silent_after, partial_after] {
        assert!(
            after >= SHORT - Duration::from_millis(100),
            "cut before the timeout: {after:?}"
        );
    }
    trickle.abort();
    // The server still serves everybody else.
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.list(&Default::default()).await.unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn a_tls_client_that_never_finishes_its_handshake_is_cut() {
    let env = Server::start(Config::default().tls().serving(serving().tls_handshake_timeout(SHORT)))
        .await
        .unwrap();
    let start = Instant::now();
    let silent = TcpStream::connect(env.addr()).await.unwrap();
    // Half a ClientHello: a record header announcing more than is sent.
    let mut partial = TcpStream::connect(env.addr()).await.unwrap();
    partial.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await.unwrap();
    closed_within(silent, start, SHORT + SLACK).await;
    closed_within(partial, start, SHORT + SLACK).await;
    env.shutdown().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout_over_tls_without_a_token() {
    // The case observed: idle TLS connections of a client without the token stayed open.
    let env = Server::start(
        Config::default()
            .tls()
            .token("s3cret")
            .serving(serving().idle_timeout(SHORT)),
    )
    .await
    .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    let ca = env.ca_certificate_pem().unwrap();
    for cert in rustls_pemfile_certs(ca) {
        roots.add(cert).unwrap();
    }
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = TcpStream::connect(env.addr()).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut tls).await, 401);
    let idle_since = Instant::now();
    let after = closed_within(tls, idle_since, SHORT + SLACK).await;
    assert!(
        after >= SHORT - Duration::from_millis(100),
        "closed before the idle timeout: {after:?}"
    );
    env.shutdown().await;
}

fn rustls_pemfile_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(Result::unwrap)
        .collect()
}

#[tokio::test]
async fn connections_over_the_cap_wait_until_one_closes() {
    let env = Server::start(Config::default().serving(serving().max_connections(2)))
        .await
        .unwrap();
    // Two connections take the two slots (a request each proves they were accepted).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = TcpStream::connect(env.addr()).await.unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(read_response(&mut conn).await, 200);
        held.push(conn);
    }
    // A third connects (the kernel's backlog takes it) but is not served while both are held.
    let mut third = TcpStream::connect(env.addr()).await.unwrap();
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), third.read(&mut byte))
            .await
            .is_err(),
        "a connection over the cap was served"
    );
    // One closes: the third is accepted and answered.
    drop(held.pop());
    assert_eq!(read_response(&mut third).await, 200);
    env.shutdown().await;
}

#[tokio::test]
async fn a_watch_streaming_longer_than_the_idle_and_header_timeouts_is_not_cut() {
    let env = Server::start(Config::default().serving(serving().idle_timeout(SHORT).read_header_timeout(SHORT)))
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let list = api.list(&Default::default()).await.unwrap();
    let mut events = api
        .watch(
            &WatchParams::default().timeout(290).disable_bookmarks(),
            list.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    // Quiet for three idle timeouts: the watch's connection has a response in flight, so
    // neither deadline applies to it.
    tokio::time::sleep(3 * SHORT).await;
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("after-the-quiet".into());
    // A fresh client: the shared one's pooled connection was (rightly) closed as idle.
    let writer: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    writer.create(&PostParams::default(), &cm).await.unwrap();
    let event = tokio::time::timeout(SLACK, events.try_next())
        .await
        .expect("an event in time")
        .expect("the watch was cut");
    match event {
        Some(WatchEvent::Added(cm)) => assert_eq!(cm.metadata.name.as_deref(), Some("after-the-quiet")),
        other => panic!("expected the ADDED event, got {other:?}"),
    }
    env.shutdown().await;
}
