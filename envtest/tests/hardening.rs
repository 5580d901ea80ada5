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

/// A private temporary directory for one test's files.
fn private_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "envtest-{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The binary, started with `args`; its URL (first stdout line) once it serves.
struct Binary(std::process::Child, String);

impl Binary {
    fn start(args: &[&std::ffi::OsStr]) -> Binary {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kinformer-apiserver"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut url = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut url)
            .unwrap();
        Binary(child, url.trim().to_string())
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lists namespaces with a client built from `kubeconfig`, with or without its token; the HTTP
/// status (200 on success).
async fn list_namespaces(kubeconfig: &std::path::Path, with_token: bool) -> u16 {
    use k8s_openapi::api::core::v1::Namespace;
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    if !with_token {
        config.auth_info.token = None;
    }
    let client = kube::Client::try_from(config).unwrap();
    match kube::Api::<Namespace>::all(client).list(&Default::default()).await {
        Ok(_) => 200,
        Err(kube::Error::Api(status)) => status.code,
        Err(e) => panic!("not an HTTP answer: {e}"),
    }
}

#[tokio::test]
async fn the_binary_reads_its_token_from_a_file_and_writes_a_private_kubeconfig() {
    use std::os::unix::fs::PermissionsExt;
    let dir = private_dir("token-file");
    std::fs::write(dir.join("token"), "fr0m-a-file\n").unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let server = Binary::start(&[
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--token-file".as_ref(),
        dir.join("token").as_os_str(),
        "--kubeconfig".as_ref(),
        kubeconfig.as_os_str(),
    ]);
    assert!(
        server.1.starts_with("https://127.0.0.1:"),
        "TLS by default: {}",
        server.1
    );

    let mode = std::fs::metadata(&kubeconfig).unwrap().permissions().mode() & 0o777;
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    assert_eq!(mode, 0o600, "the kubeconfig holds the token: owner only");
    assert!(text.contains("fr0m-a-file"));
    assert_eq!(list_namespaces(&kubeconfig, false).await, 401);
    assert_eq!(list_namespaces(&kubeconfig, true).await, 200);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_binary_serves_tls_with_a_random_token_by_default() {
    let dir = private_dir("default-token");
    let mut tokens = Vec::new();
    for run in 0..2 {
        let kubeconfig = dir.join(format!("kubeconfig{run}"));
        let server = Binary::start(&["--kubeconfig".as_ref(), kubeconfig.as_os_str()]);
        assert!(server.1.starts_with("https://127.0.0.1:"), "{}", server.1);
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&kubeconfig).unwrap()).unwrap();
        let token = doc["users"][0]["user"]["token"].as_str().unwrap().to_owned();
        assert_eq!(token.len(), 64, "32 random bytes, hex: {token}");
        assert!(
            doc["clusters"][0]["cluster"]["certificate-authority-data"].is_string(),
            "the CA is in the kubeconfig: {doc}"
        );
        assert_eq!(list_namespaces(&kubeconfig, false).await, 401);
        assert_eq!(list_namespaces(&kubeconfig, true).await, 200);
        // Plain HTTP to the TLS port gets no HTTP answer (at most a TLS alert).
        let (code, _) = send(&server.1.replace("https://", "http://"), "GET", "/api", None).await;
        assert_eq!(code, 0, "plain HTTP is not served on the TLS port");
        tokens.push(token);
    }
    assert_ne!(tokens[0], tokens[1], "a new token at every start");

    // A generated token has nowhere to go without --kubeconfig: a usage error, not an open server.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_kinformer-apiserver"))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--kubeconfig"));

    // --insecure-http: plain HTTP and, with no token given, open.
    let server = Binary::start(&["--insecure-http".as_ref()]);
    assert!(server.1.starts_with("http://127.0.0.1:"), "{}", server.1);
    assert_eq!(send(&server.1, "GET", "/api/v1/namespaces", None).await.0, 200);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
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
        "--tls",
        "--insecure-http",
    ] {
        assert!(text.contains(flag), "--help lists {flag}: {text}");
    }
}
