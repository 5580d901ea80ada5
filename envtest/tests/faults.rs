//! Fault injection (in-process handle and admin endpoint) and the request log.

mod common;

use common::code;
use envtest::{Config, Server};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(10);

fn no_retry_client(env: &Server) -> kube::Client {
    let mut cfg = env.kube_config();
    cfg.default_retry = false;
    kube::Client::try_from(cfg).unwrap()
}

/// The raw response head (status line + headers) of a GET.
async fn head_of(base: &str, path: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    text.split("\r\n\r\n").next().unwrap_or("").to_owned()
}

#[tokio::test]
async fn injected_errors_on_a_path_prefix() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(no_retry_client(&env), "default");
    env.faults()
        .fail_next("/api/v1/namespaces/default/configmaps", 500, 2, 0);
    assert_eq!(code(&api.list(&ListParams::default()).await.unwrap_err()), 500);
    assert_eq!(code(&api.list(&ListParams::default()).await.unwrap_err()), 500);
    api.list(&ListParams::default()).await.unwrap();

    env.faults()
        .fail_next("/api/v1/namespaces/default/configmaps", 429, 1, 7);
    let head = head_of(env.base_url(), "/api/v1/namespaces/default/configmaps").await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after: 7"), "{head}");

    env.faults().fail_next("/api", 503, 1, 1);
    let head = head_of(env.base_url(), "/api/v1/namespaces").await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    // Other prefixes are untouched.
    env.faults().fail_next("/apis/apps", 500, 1, 0);
    api.list(&ListParams::default()).await.unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn expire_next_watches_answers_http_410() {
    let env = Server::start(Config::default()).await.unwrap();
    env.faults().expire_next_watches(1);
    let (c, body) = common::raw(
        env.base_url(),
        "GET",
        "/api/v1/namespaces/default/configmaps?watch=true",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(c, 410);
    assert_eq!(body["reason"], "Expired");
    // Only the next one.
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let mut s = api.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    api.create(&PostParams::default(), &named("x")).await.unwrap();
    let ev = tokio::time::timeout(T, s.next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(ev, WatchEvent::Added(_)));
    env.shutdown().await;
}

fn named(n: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(n.into());
    c
}

#[tokio::test]
async fn close_watches_and_restart_end_streams_but_keep_objects() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &named("keep")).await.unwrap();
    let rv = env.current_resource_version();
    let mut s = api
        .watch(&WatchParams::default(), &rv.to_string())
        .await
        .unwrap()
        .boxed();
    common::wait_for(T, "the watch to register", || {
        let n = env.watcher_count();
        async move { n == 1 }
    })
    .await;
    env.faults().close_watches();
    assert!(tokio::time::timeout(T, s.next()).await.unwrap().is_none());

    let mut s = api
        .watch(&WatchParams::default(), &rv.to_string())
        .await
        .unwrap()
        .boxed();
    common::wait_for(T, "the watch to register", || {
        let n = env.watcher_count();
        async move { n == 1 }
    })
    .await;
    env.faults().restart();
    assert!(tokio::time::timeout(T, s.next()).await.unwrap().is_none());
    assert_eq!(env.current_resource_version(), rv);
    assert_eq!(env.watch_cache_len(), 0);
    assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 1);
    env.shutdown().await;
}

#[tokio::test]
async fn latency_delays_requests() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    env.faults().set_latency(Duration::from_millis(200));
    let start = Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(200));
    env.faults().clear();
    env.shutdown().await;
}

#[tokio::test]
async fn admin_endpoint_and_request_log() {
    let env = Server::start(Config::default()).await.unwrap();
    let (c, _) = common::raw(
        env.base_url(),
        "POST",
        "/_envtest/faults/fail?prefix=/api/v1/namespaces&code=503&count=1",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(c, 200);
    let (c, _) = common::raw(env.base_url(), "GET", "/api/v1/namespaces", "application/json", vec![]).await;
    assert_eq!(c, 503);
    let (c, _) = common::raw(
        env.base_url(),
        "POST",
        "/_envtest/faults/bogus",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(c, 404);
    let (c, _) = common::raw(
        env.base_url(),
        "POST",
        "/_envtest/faults/fail?code=abc",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(c, 400);

    env.faults().clear_requests();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let s = api
        .watch(&WatchParams::default().labels("app=web").timeout(5), "0")
        .await
        .unwrap();
    drop(s);
    let watches: Vec<_> = env.requests().into_iter().filter(|r| r.is_watch).collect();
    assert_eq!(watches.len(), 1);
    assert_eq!(watches[0].path, "/api/v1/namespaces/default/configmaps");
    assert_eq!(watches[0].param("labelSelector").as_deref(), Some("app=web"));
    assert_eq!(watches[0].param("timeoutSeconds").as_deref(), Some("5"));
    let (c, log) = common::raw(env.base_url(), "GET", "/_envtest/requests", "application/json", vec![]).await;
    assert_eq!(c, 200);
    assert!(log.as_array().unwrap().iter().any(|r| r["watch"] == true));
    assert!(log.as_array().unwrap().iter().all(|r| r["accept"].is_string()), "{log}");
    env.shutdown().await;
}
