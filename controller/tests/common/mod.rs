//! Helpers shared by the controller integration tests: envtest with a test CRD, polling with a
//! deadline, configmaps, and a tiny HTTP GET for scraping the manager's endpoints.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A namespaced test CRD whose reconciles may create owned ConfigMaps.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "test.kinformer.dev", version = "v1", kind = "Widget", namespaced)]
pub struct WidgetSpec {
    /// Copied into the owned ConfigMap.
    pub size: i32,
}

/// Polls `cond` every 10 ms until it is true; panics after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// envtest with the Widget CRD installed and served.
pub async fn envtest_with_widgets() -> envtest::Server {
    let env = envtest::Server::start(envtest::Config::default())
        .await
        .expect("envtest");
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    crds.create(&PostParams::default(), &Widget::crd())
        .await
        .expect("create CRD");
    let client = env.client();
    eventually(Duration::from_secs(10), "Widget is served", || {
        let api: Api<Widget> = Api::all(client.clone());
        async move { api.list(&Default::default()).await.is_ok() }
    })
    .await;
    env
}

pub fn configmap(ns: &str, name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("v".to_string(), value.to_string())])),
        ..ConfigMap::default()
    }
}

/// `GET path` on a local HTTP server: (status, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("status line");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of one sample in Prometheus text (`name{labels} value`), 0 if absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// The value of a metric family's sample for a label set, read from a registry.
pub fn gather(registry: &prometheus::Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .expect("encode")
}
