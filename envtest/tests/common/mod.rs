//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

/// The HTTP status code of a kube API error (panics on other errors: tests only).
pub fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The reason of a kube API error.
pub fn reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.reason.clone(),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Polls `cond` every 10 ms until it is true or `timeout` passes.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A raw HTTP request to the server with reqwest-free hyper plumbing: (status, body).
pub async fn raw(
    base: &str,
    method: &str,
    path_and_query: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "{method} {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write head");
    let _ = s.write_all(&body).await;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    parse_response(&buf)
}

/// Parses an HTTP/1.1 response (Content-Length or chunked) into (status, JSON body or Null).
pub fn parse_response(buf: &[u8]) -> (u16, serde_json::Value) {
    let text = String::from_utf8_lossy(buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body;
        while let Some((len, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_owned()
    };
    let v = serde_json::from_str(body.lines().next().unwrap_or("")).unwrap_or(serde_json::Value::Null);
    (code, v)
}
