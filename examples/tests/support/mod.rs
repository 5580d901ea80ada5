//! Helpers shared by the examples' tests that read a running Manager's HTTP endpoints.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on `addr` over plain HTTP/1.0: the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (code, body)
}

/// Every sample of `family` in a Prometheus text exposition: its labels as written between
/// the braces (`informer="apps/v1/Deployment"`) and its value.
#[allow(dead_code)] // not every test target reads metrics
pub fn samples<'a>(exposition: &'a str, family: &str) -> Vec<(&'a str, f64)> {
    let prefix = format!("{family}{{");
    exposition
        .lines()
        .filter_map(|line| {
            let (labels, value) = line.strip_prefix(&prefix)?.rsplit_once("} ")?;
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}
