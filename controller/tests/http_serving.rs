//! The Manager's `/metrics`, `/healthz`, `/readyz` server holds no connection forever (issue
//! #28): a client that sends a partial header (or nothing) is cut after the header-read
//! timeout, an idle keep-alive connection after the idle timeout, and connections over the cap
//! wait until one closes. Short real timeouts; each assertion is "closed within a bound".

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use controller::Manager;
use controller::manager::ServingConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const SHORT: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(60);
const SLACK: Duration = Duration::from_secs(10);

/// A manager with no controllers serving its endpoints with `serving`; returns its address and
/// the token that stops it.
async fn manager(env: &envtest::Server, serving: ServingConfig) -> (SocketAddr, CancellationToken) {
    let manager = Manager::builder(env.client())
        .metrics_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
        .health_probe_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
        .http_serving(serving)
        .handle_signals(false)
        .build()
        .unwrap();
    let addr = manager.health_probe_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(manager.run(stop.clone()));
    (addr, stop)
}

async fn closed_within(mut conn: TcpStream, since: Instant, bound: Duration) -> Duration {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(bound, async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server kept the connection open past {bound:?}"));
    since.elapsed()
}

/// Sends `GET /healthz` and reads the whole response (`ok`, Content-Length 2); its status.
async fn healthz(conn: &mut TcpStream) -> u16 {
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    let mut byte = [0u8; 1];
    while !(response.ends_with(b"\r\n\r\nok")) {
        let n = tokio::time::timeout(SLACK, conn.read(&mut byte))
            .await
            .expect("a response in time")
            .unwrap();
        assert_eq!(n, 1, "closed mid-response: {}", String::from_utf8_lossy(&response));
        response.push(byte[0]);
    }
    String::from_utf8_lossy(&response)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

fn serving() -> ServingConfig {
    ServingConfig::default().read_header_timeout(LONG).idle_timeout(LONG)
}

#[tokio::test]
async fn slow_or_silent_clients_are_cut_after_the_header_timeout_and_idle_ones_after_the_idle_timeout() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let (addr, stop) = manager(&env, serving().read_header_timeout(SHORT).idle_timeout(2 * SHORT)).await;
    let start = Instant::now();
    let silent = TcpStream::connect(addr).await.unwrap();
    let mut partial = TcpStream::connect(addr).await.unwrap();
    partial
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: ")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert_eq!(healthz(&mut idle).await, 200);
    let idle_since = Instant::now();

    for conn in [silent, partial] {
        let after = closed_within(conn, start, SHORT + SLACK).await;
        assert!(
            after >= SHORT - Duration::from_millis(100),
            "cut before the timeout: {after:?}"
        );
    }
    let after = closed_within(idle, idle_since, 2 * SHORT + SLACK).await;
    // The idle timeout (2 s) applies after a response, not the header timeout (1 s).
    assert!(
        after >= 2 * SHORT - Duration::from_millis(100),
        "closed before the idle timeout: {after:?}"
    );
    stop.cancel();
    env.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_cap_wait_until_one_closes() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let (addr, stop) = manager(&env, serving().max_connections(1)).await;
    let mut held = TcpStream::connect(addr).await.unwrap();
    assert_eq!(healthz(&mut held).await, 200);
    let mut waiting = TcpStream::connect(addr).await.unwrap();
    waiting
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), waiting.read(&mut byte))
            .await
            .is_err(),
        "a connection over the cap was served"
    );
    drop(held);
    let n = tokio::time::timeout(SLACK, waiting.read(&mut byte))
        .await
        .expect("served once a slot was free")
        .unwrap();
    assert_eq!(n, 1);
    stop.cancel();
    env.shutdown().await;
}
