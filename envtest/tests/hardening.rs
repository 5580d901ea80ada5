//! Regression tests for hostile or careless input to envtest (issue #12): each of these once
//! panicked the server, stalled it, or let an unauthenticated client in.

mod common;

use std::time::{Duration, Instant};

use envtest::{Config, Server};

/// Sends a raw HTTP/1.1 request with an optional bearer token; returns the status code and
/// whether any response came back at all.
async fn send(base: &str, method: &str, path: &str, token: Option<&str>) -> (u16, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.expect("write");
    // Read the status line only (a watch would stream on).
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap_or(Ok(0))
        .unwrap_or(0);
    let (code, _) = common::parse_response(&buf[..n]);
    (code, n > 0)
}

#[tokio::test]
async fn admin_routes_require_the_token_when_one_is_set() {
    let env = Server::start(Config::default().token("s3cret")).await.unwrap();
    let base = env.base_url().to_string();
    assert_eq!(send(&base, "GET", "/_envtest/requests", None).await.0, 401);
    assert_eq!(
        send(&base, "POST", "/_envtest/faults/latency?ms=600000", None).await.0,
        401
    );
    assert_eq!(
        send(&base, "POST", "/_envtest/faults/expire-watches?count=5", Some("wrong"))
            .await
            .0,
        401
    );
    // The refused latency fault did not take: an authorized request is answered at once.
    let started = Instant::now();
    assert_eq!(send(&base, "GET", "/api/v1/namespaces", Some("s3cret")).await.0, 200);
    assert!(started.elapsed() < Duration::from_secs(5));
    // With the token the admin routes work.
    assert_eq!(send(&base, "GET", "/_envtest/requests", Some("s3cret")).await.0, 200);
    // Health probes stay open, as kube-apiserver's.
    assert_eq!(send(&base, "GET", "/readyz", None).await.0, 200);
    env.shutdown().await;
}

#[tokio::test]
async fn a_watch_timeout_beyond_the_clock_is_no_deadline_not_a_panic() {
    let env = Server::start(Config::default()).await.unwrap();
    let base = env.base_url().to_string();
    let (code, answered) = send(
        &base,
        "GET",
        "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=18446744073709551615",
        None,
    )
    .await;
    assert!(answered, "the server answered (the request task did not panic)");
    assert_eq!(code, 200);
    let (code, _) = send(
        &base,
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=18446744073709551615",
        None,
    )
    .await;
    assert_eq!(code, 200);
    env.shutdown().await;
}

#[tokio::test]
async fn fault_counts_saturate_and_clear_resets_them() {
    let env = Server::start(Config::default()).await.unwrap();
    let base = env.base_url().to_string();
    for _ in 0..2 {
        let (code, answered) = send(
            &base,
            "POST",
            "/_envtest/faults/expire-watches?count=18446744073709551615",
            None,
        )
        .await;
        assert!(answered && code == 200, "got {code}");
    }
    assert_eq!(
        send(&base, "GET", "/api/v1/namespaces/default/configmaps?watch=true", None)
            .await
            .0,
        410,
        "the next watches expire"
    );
    assert_eq!(send(&base, "POST", "/_envtest/faults/clear", None).await.0, 200);
    assert_eq!(
        send(
            &base,
            "GET",
            "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1",
            None
        )
        .await
        .0,
        200,
        "clear reset the count"
    );
    let (code, answered) = send(
        &base,
        "POST",
        "/_envtest/faults/fail?code=503&count=18446744073709551615&retryAfter=18446744073709551615",
        None,
    )
    .await;
    assert!(answered && code == 200, "got {code}");
    assert_eq!(send(&base, "GET", "/api/v1/namespaces", None).await.0, 503);
    env.faults().clear();
    assert_eq!(send(&base, "GET", "/api/v1/namespaces", None).await.0, 200);
    env.shutdown().await;
}

#[tokio::test]
async fn the_binary_reads_its_token_from_a_file_and_writes_a_private_kubeconfig() {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("envtest-token-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), "fr0m-a-file\n").unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kinformer-apiserver"))
        .args(["--listen", "127.0.0.1:0", "--token-file"])
        .arg(dir.join("token"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut url = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let url = url.trim().to_string();

    let mode = std::fs::metadata(&kubeconfig).unwrap().permissions().mode() & 0o777;
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    let unauthenticated = send(&url, "GET", "/api/v1/namespaces", None).await.0;
    let authenticated = send(&url, "GET", "/api/v1/namespaces", Some("fr0m-a-file")).await.0;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(mode, 0o600, "the kubeconfig holds the token: owner only");
    assert!(text.contains("fr0m-a-file"));
    assert_eq!(unauthenticated, 401);
    assert_eq!(authenticated, 200);
}

#[test]
fn the_binary_refuses_both_token_flags_and_documents_its_flags() {
    let both = std::process::Command::new(env!("CARGO_BIN_EXE_kinformer-apiserver"))
        .args(["--token", "a", "--token-file", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2), "a usage error");
    let message = String::from_utf8_lossy(&both.stderr);
    assert!(
        message.contains("--token") && message.contains("--token-file"),
        "{message}"
    );

    let help = std::process::Command::new(env!("CARGO_BIN_EXE_kinformer-apiserver"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--listen",
        "--kubeconfig",
        "--token",
        "--token-file",
        "--watch-cache-size",
    ] {
        assert!(text.contains(flag), "--help lists {flag}: {text}");
    }
}
