//! The request log is bounded by bytes as well as by entries (issue #28: 100,000 requests with
//! 60 KB query strings would have held ~6 GB): past the budget the oldest entries go first. It
//! records each request's `Accept` header, which counts against that budget too.

use envtest::{Config, RecordedRequest, Server};

/// The bytes of an entry's strings.
fn held_bytes(r: &RecordedRequest) -> usize {
    r.method.len() + r.path.len() + r.query.len() + r.accept.len()
}

/// `GET path` with `accept` as its `Accept` header, if any.
async fn get(client: &kube::Client, path: &str, accept: Option<&str>) {
    let mut request = http::Request::get(path);
    if let Some(accept) = accept {
        request = request.header(http::header::ACCEPT, accept);
    }
    client.request_text(request.body(Vec::new()).unwrap()).await.unwrap();
}

#[tokio::test]
async fn the_request_log_records_the_accept_header_and_empty_when_absent() {
    const METADATA: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    get(&client, "/api/v1/namespaces/default/configmaps?n=meta", Some(METADATA)).await;
    get(&client, "/api/v1/namespaces/default/configmaps?n=none", None).await;
    let log = env.requests();
    let accept = |n: &str| {
        let entry = log.iter().find(|r| r.param("n").as_deref() == Some(n));
        entry
            .unwrap_or_else(|| panic!("{n} not logged: {log:?}"))
            .accept
            .clone()
    };
    assert_eq!(accept("meta"), METADATA);
    assert_eq!(accept("none"), "");
    env.shutdown().await;
}

#[tokio::test]
async fn accept_headers_count_against_the_request_logs_byte_budget() {
    const BUDGET: usize = 1024 * 1024;
    let env = Server::start(Config::default().request_log_bytes(BUDGET))
        .await
        .unwrap();
    let client = env.client();
    // 40 × 60 KB of `Accept` and short paths: only the header can take the log past its budget.
    let accept = format!("application/json;pad={}", "x".repeat(60 * 1024));
    for i in 0..40 {
        let path = format!("/api/v1/namespaces/default/configmaps?n={i}");
        get(&client, &path, Some(&accept)).await;
    }
    let log = env.requests();
    let held: usize = log.iter().map(held_bytes).sum();
    assert!(
        held <= BUDGET,
        "the log holds {held} bytes, over its {BUDGET}-byte budget"
    );
    assert!(log.len() < 40 && log.len() >= 10, "{} entries", log.len());
    assert_eq!(log.last().unwrap().param("n").as_deref(), Some("39"));
    assert!(log.iter().all(|r| r.accept == accept));
    env.shutdown().await;
}

#[tokio::test]
async fn the_request_log_drops_its_oldest_entries_past_its_byte_budget() {
    const BUDGET: usize = 1024 * 1024;
    let env = Server::start(Config::default().request_log_bytes(BUDGET))
        .await
        .unwrap();
    let client = env.client();
    let pad = "x".repeat(60 * 1024);
    for i in 0..40 {
        let request = http::Request::get(format!("/api/v1/namespaces/default/configmaps?n={i}&pad={pad}"))
            .body(Vec::new())
            .unwrap();
        client.request_text(request).await.unwrap();
    }
    let log = env.requests();
    let held: usize = log.iter().map(held_bytes).sum();
    assert!(
        held <= BUDGET,
        "the log holds {held} bytes, over its {BUDGET}-byte budget"
    );
    // 40 × 60 KB is 2.4 MB: the oldest went, the newest stayed.
    assert!(log.len() < 40 && log.len() >= 10, "{} entries", log.len());
    assert_eq!(log.last().unwrap().param("n").as_deref(), Some("39"));
    assert!(log.iter().all(|r| r.param("n").as_deref() != Some("0")));
    env.shutdown().await;
}
