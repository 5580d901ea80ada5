//! Bad requests get the right Status; random requests never crash the server.

mod common;

use common::raw;
use envtest::{Config, Server};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CM: &str = "/api/v1/namespaces/default/configmaps";

/// (method, path, content type, body, expected code, expected reason)
type Case = (&'static str, String, &'static str, Vec<u8>, u16, &'static str);

#[tokio::test]
async fn bad_requests_get_the_right_status() {
    let env = Server::start(
        Config::default()
            .max_body_bytes(4096)
            .too_large_resource_version_wait(std::time::Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let b = env.base_url();
    let cases: Vec<Case> = vec![
        (
            "POST",
            CM.into(),
            "application/json",
            b"{not json".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CM.into(),
            "application/json",
            b"[1,2]".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CM.into(),
            "application/json",
            br#"{"kind":"Pod","metadata":{"name":"x"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CM.into(),
            "application/json",
            br#"{"metadata":{"name":7}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "POST",
            CM.into(),
            "application/json",
            br#"{"metadata":{}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "POST",
            CM.into(),
            "application/json",
            vec![b' '; 10_000],
            413,
            "RequestEntityTooLarge",
        ),
        (
            "POST",
            CM.into(),
            "application/x-unknown",
            b"{}".to_vec(),
            415,
            "UnsupportedMediaType",
        ),
        ("GET", "/api/v1/nothings".into(), "", vec![], 404, "NotFound"),
        ("GET", "/apis/nope.io/v1/things".into(), "", vec![], 404, "NotFound"),
        (
            "GET",
            format!("{CM}?labelSelector=a%20in%20("),
            "",
            vec![],
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{CM}?fieldSelector=spec.nodeName%3Dx"),
            "",
            vec![],
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{CM}?resourceVersion=abc"),
            "",
            vec![],
            400,
            "BadRequest",
        ),
        ("GET", format!("{CM}?limit=-1"), "", vec![], 400, "BadRequest"),
        ("GET", format!("{CM}?continue=garbage"), "", vec![], 400, "BadRequest"),
        (
            "GET",
            format!("{CM}?resourceVersionMatch=Exact"),
            "",
            vec![],
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{CM}?resourceVersion=999999&resourceVersionMatch=Exact"),
            "",
            vec![],
            504,
            "Timeout",
        ),
        // Wrong namespace scope: namespaces are cluster-scoped, configmaps namespaced.
        (
            "GET",
            "/api/v1/namespaces/default/namespaces".into(),
            "",
            vec![],
            404,
            "NotFound",
        ),
        ("GET", "/api/v1/configmaps/x".into(), "", vec![], 404, "NotFound"),
        (
            "POST",
            "/api/v1/configmaps".into(),
            "application/json",
            br#"{"metadata":{"name":"x"}}"#.to_vec(),
            404,
            "NotFound",
        ),
        (
            "PATCH",
            format!("{CM}/x"),
            "application/bogus",
            b"{}".to_vec(),
            415,
            "UnsupportedMediaType",
        ),
        (
            "PUT",
            CM.into(),
            "application/json",
            b"{}".to_vec(),
            405,
            "MethodNotAllowed",
        ),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/x/nosuchsub".into(),
            "",
            vec![],
            404,
            "NotFound",
        ),
        (
            "DELETE",
            format!("{CM}/x"),
            "application/json",
            b"{bad".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "GET",
            format!("{CM}?watch=true&sendInitialEvents=true"),
            "",
            vec![],
            422,
            "Invalid",
        ),
    ];
    for (method, path, ct, body, want, reason) in cases {
        let (code, status) = raw(
            b,
            method,
            &path,
            if ct.is_empty() { "application/json" } else { ct },
            body,
        )
        .await;
        assert_eq!(code, want, "{method} {path}: {status}");
        assert_eq!(status["kind"], "Status", "{method} {path}");
        assert_eq!(status["reason"], reason, "{method} {path}");
        assert_eq!(status["code"], want, "{method} {path}");
    }
    env.shutdown().await;
}

fn random_body(rng: &mut StdRng) -> Vec<u8> {
    let pieces: &[&[u8]] = &[
        br#"{"metadata":{"name":"f"}}"#,
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fz","labels":{"a":"b"}},"data":{"k":"v"}}"#,
        br#"[{"op":"add","path":"/data/x","value":"1"}]"#,
        br#"[{"op":"remove","path":"/nope"}]"#,
        br#"{"metadata":{"resourceVersion":"1"}}"#,
        br#"{"metadata":null}"#,
        br#"{"spec":{"finalizers":["x"]},"metadata":{"finalizers":["a/b"],"ownerReferences":[{"uid":"u"}]}}"#,
        br#"{"propagationPolicy":"Orphan","preconditions":{"uid":"nope"}}"#,
        b"null",
        b"\"str\"",
        b"{",
        b"",
        b"k8s\x00\x0a\x02\x08\x01",
    ];
    let mut body = pieces[rng.random_range(0..pieces.len())].to_vec();
    if rng.random_bool(0.3) {
        let n = rng.random_range(0..8);
        for _ in 0..n {
            if !body.is_empty() {
                let i = rng.random_range(0..body.len());
                body[i] = rng.random();
            }
        }
    }
    body
}

fn random_request(rng: &mut StdRng) -> (String, String, String) {
    let methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"];
    let paths = [
        "/api/v1/namespaces",
        "/api/v1/namespaces/default",
        "/api/v1/namespaces/default/status",
        "/api/v1/namespaces/default/configmaps",
        "/api/v1/namespaces/default/configmaps/fz",
        "/api/v1/namespaces/default/configmaps/fz/status",
        "/api/v1/namespaces/nope/pods/x",
        "/apis/apps/v1/namespaces/default/deployments/d/status",
        "/apis/apps/v1/deployments",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        "/apis",
        "/api",
        "/version",
        "/openapi/v3",
        "/api/v1/%zz/..//x",
        "/_envtest/faults/nothing",
    ];
    let queries = [
        "",
        "watch=true&timeoutSeconds=1",
        "&&watch=1&resourceVersion=0&timeoutSeconds=1",
        "labelSelector=a%20notin%20(b)",
        "labelSelector=!!",
        "fieldSelector=metadata.name%3Dfz",
        "limit=2&continue=%ff",
        "resourceVersion=18446744073709551615&resourceVersionMatch=NotOlderThan",
        "resourceVersion=1&resourceVersionMatch=Exact",
        "dryRun=All",
        "propagationPolicy=Foreground",
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
        "%",
        "=&=&a==b",
    ];
    let cts = [
        "application/json",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "application/vnd.kubernetes.protobuf",
        "text/html",
    ];
    let m = methods[rng.random_range(0..methods.len())];
    let mut pq = paths[rng.random_range(0..paths.len())].to_owned();
    let q = queries[rng.random_range(0..queries.len())];
    if !q.is_empty() {
        pq = format!("{pq}?{q}");
    }
    (m.to_owned(), pq, cts[rng.random_range(0..cts.len())].to_owned())
}

#[tokio::test]
async fn random_requests_never_crash_the_server() {
    // Random revisions are mostly in the future: answer them without kube-apiserver's 3 s wait.
    let env = Server::start(
        Config::default()
            .watch_cache_size(16)
            .too_large_resource_version_wait(std::time::Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let seed: u64 = std::env::var("ENVTEST_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let n: usize = std::env::var("ENVTEST_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..n {
        let (m, pq, ct) = random_request(&mut rng);
        let body = random_body(&mut rng);
        let (code, _) = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            raw(env.base_url(), &m, &pq, &ct, body),
        )
        .await
        .unwrap_or_else(|_| panic!("case {i} ({m} {pq}) hung"));
        assert!(code != 0, "case {i} ({m} {pq} {ct}): no response (handler panicked?)");
        assert!(
            code < 500 || code == 504,
            "case {i} ({m} {pq} {ct}): server error {code}"
        );
    }
    let (code, _) = raw(env.base_url(), "GET", "/healthz", "text/plain", vec![]).await;
    assert_eq!(code, 200);
    env.shutdown().await;
}
