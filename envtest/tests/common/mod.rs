//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod admission;
pub mod webhook_server;

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

/// A watch read over a raw HTTP/1.1 connection with a cheap line parser, so that many watchers
/// cost little CPU on the client side (the stress tests measure the server, not serde).
pub struct RawWatch {
    reader: tokio::io::BufReader<tokio::net::TcpStream>,
    pending: std::collections::VecDeque<String>,
    partial: Vec<u8>,
    pub status: u16,
    done: bool,
}

impl RawWatch {
    /// Opens `GET path_and_query` and reads the response head.
    pub async fn open(base: &str, path_and_query: &str) -> std::io::Result<RawWatch> {
        Self::open_with_socket(base, path_and_query, None).await
    }

    /// Like `open`, with a small receive buffer (a client that will not read).
    pub async fn open_with_socket(
        base: &str,
        path_and_query: &str,
        recv_buffer: Option<u32>,
    ) -> std::io::Result<RawWatch> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().expect("socket address");
        let socket = tokio::net::TcpSocket::new_v4()?;
        if let Some(n) = recv_buffer {
            socket.set_recv_buffer_size(n)?;
        }
        let mut stream = socket.connect(addr).await?;
        stream
            .write_all(format!("GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut reader = tokio::io::BufReader::new(stream);
        let mut status = 0;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).await? == 0 {
                break;
            }
            if status == 0 {
                status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
            }
            if line == "\r\n" {
                break;
            }
        }
        Ok(RawWatch {
            reader,
            pending: Default::default(),
            partial: Vec::new(),
            status,
            done: false,
        })
    }

    /// The next event line, or `None` when the stream ends.
    pub async fn next_line(&mut self) -> Option<String> {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        loop {
            if let Some(l) = self.pending.pop_front() {
                return Some(l);
            }
            if self.done {
                return None;
            }
            let mut size = String::new();
            if self.reader.read_line(&mut size).await.ok()? == 0 {
                self.done = true;
                continue;
            }
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                self.done = true;
                continue;
            }
            let mut chunk = vec![0; n + 2];
            self.reader.read_exact(&mut chunk).await.ok()?;
            chunk.truncate(n);
            let mut rest = &chunk[..];
            while let Some(i) = rest.iter().position(|b| *b == b'\n') {
                self.partial.extend_from_slice(&rest[..i]);
                let line = String::from_utf8_lossy(&self.partial).into_owned();
                self.partial.clear();
                self.pending.push_back(line);
                rest = &rest[i + 1..];
            }
            self.partial.extend_from_slice(rest);
        }
    }
}

/// (`type`, `metadata.resourceVersion`, `code` for ERROR) of an event line, found by substring.
pub fn event_summary(line: &str) -> (String, u64, u16) {
    let ty = line
        .strip_prefix("{\"type\":\"")
        .and_then(|r| r.split('"').next())
        .unwrap_or("")
        .to_owned();
    let rv = line
        .split("\"resourceVersion\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let code = line
        .split("\"code\":")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    (ty, rv, code)
}

/// A keep-alive HTTP/1.1 connection for cheap, fast request loops (load tests).
pub struct RawConn {
    reader: tokio::io::BufReader<tokio::net::TcpStream>,
    host: String,
}

impl RawConn {
    pub async fn connect(base: &str) -> std::io::Result<RawConn> {
        let host = base.trim_start_matches("http://").to_owned();
        let stream = tokio::net::TcpStream::connect(&host).await?;
        stream.set_nodelay(true)?;
        Ok(RawConn {
            reader: tokio::io::BufReader::new(stream),
            host,
        })
    }

    /// Sends one request and reads the whole (Content-Length) response: (status, body).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let mut msg = head.into_bytes();
        msg.extend_from_slice(body);
        self.reader.get_mut().write_all(&msg).await?;
        let mut status = 0;
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).await? == 0 {
                return Err(std::io::Error::other("connection closed"));
            }
            if status == 0 {
                status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
            } else if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap_or(0);
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).await?;
        Ok((status, body))
    }
}
