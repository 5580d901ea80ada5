//! The request log is bounded by bytes as well as by entries (issue #28: 100,000 requests with
//! 60 KB query strings would have held ~6 GB): past the budget the oldest entries go first.

use envtest::{Config, Server};

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
    let held: usize = log.iter().map(|r| r.method.len() + r.path.len() + r.query.len()).sum();
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
