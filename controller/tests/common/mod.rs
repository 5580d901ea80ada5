//! Helpers shared by the controller integration tests: envtest with a test CRD, polling with a
//! deadline, configmaps, a Manager with leader election, recorders of reconciles and of
//! rate-limiter calls, a seeded writer of random ConfigMap changes, a tiny HTTP GET for scraping
//! the manager's endpoints, and reading Prometheus samples; [`sharding`] holds the sharding
//! tests' own.
#![allow(dead_code)]

pub mod sharding;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controller::{LeaderElectionConfig, Manager, ManagerStatus, ObjectKey};
use factory::SharedInformerFactory;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{CustomResource, CustomResourceExt};
use rand::Rng;
use rand::rngs::StdRng;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use workqueue::RateLimiter;

/// A namespaced test CRD whose reconciles may create owned ConfigMaps.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(group = "test.kinformer.dev", version = "v1", kind = "Widget", namespaced)]
pub struct WidgetSpec {
    /// Copied into the owned ConfigMap.
    pub size: i32,
}

/// kube's derive emits no per-type hooks: the factory's defaults (metadata lists compacted).
impl factory::InformerResource for Widget {}

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

/// envtest, and an informer factory over its client (no resync).
pub async fn envtest_with_factory() -> (envtest::Server, SharedInformerFactory) {
    let env = envtest::Server::start(envtest::Config::default())
        .await
        .expect("envtest");
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    (env, factory)
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

/// Creates ConfigMaps `names` in "default", each with `v: "1"`.
pub async fn create_configmaps(client: &kube::Client, names: &[&str]) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in names {
        cms.create(&PostParams::default(), &configmap("default", name, "1"))
            .await
            .unwrap();
    }
}

/// A Manager on `client` that elects its leader by `election`, with no HTTP servers and no
/// signal handling: one of several replicas in one test process.
pub fn elected_manager(client: kube::Client, election: LeaderElectionConfig) -> Manager {
    Manager::builder(client)
        .no_http_servers()
        .handle_signals(false)
        .leader_election(election)
        .build()
        .unwrap()
}

/// Waits until the manager behind `status` holds its lease.
pub async fn until_leading(timeout: Duration, status: &ManagerStatus) {
    eventually(timeout, "leading", || {
        let ok = status.is_leader();
        async move { ok }
    })
    .await;
}

/// When each key (by name) was reconciled: a reconciler calls `record`, the test reads `times`.
#[derive(Clone, Default)]
pub struct Calls(Arc<Mutex<HashMap<String, Vec<Instant>>>>);

impl Calls {
    /// Records a reconcile of `name` now; returns how many `name` has had, this one included.
    pub fn record(&self, name: &str) -> usize {
        let mut calls = self.0.lock().unwrap();
        let times = calls.entry(name.to_owned()).or_default();
        times.push(Instant::now());
        times.len()
    }

    pub fn times(&self, name: &str) -> Vec<Instant> {
        self.0.lock().unwrap().get(name).cloned().unwrap_or_default()
    }
}

/// A key's name and the delay `when` returned (`None`: a `forget`).
pub type LimiterCall = (String, Option<Duration>);

/// Wraps a controller's rate limiter and records what the work queue asks of it: `when` (a
/// rate-limited retry, with its delay) and `forget` (`None`).
pub struct RecordingLimiter<L> {
    inner: Arc<L>,
    log: Arc<Mutex<Vec<LimiterCall>>>,
}

impl<L> Clone for RecordingLimiter<L> {
    fn clone(&self) -> Self {
        RecordingLimiter {
            inner: self.inner.clone(),
            log: self.log.clone(),
        }
    }
}

impl<L> RecordingLimiter<L> {
    pub fn new(inner: L) -> Self {
        RecordingLimiter {
            inner: Arc::new(inner),
            log: Arc::default(),
        }
    }

    /// Every call, in order.
    pub fn log(&self) -> Vec<LimiterCall> {
        self.log.lock().unwrap().clone()
    }

    /// The calls for one key's name, in order.
    pub fn of(&self, name: &str) -> Vec<Option<Duration>> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|(n, _)| n == name).map(|(_, d)| *d).collect()
    }
}

impl<L: RateLimiter<ObjectKey>> RateLimiter<ObjectKey> for RecordingLimiter<L> {
    fn when(&self, item: &ObjectKey) -> Duration {
        let delay = self.inner.when(item);
        self.log.lock().unwrap().push((item.name.clone(), Some(delay)));
        delay
    }
    fn forget(&self, item: &ObjectKey) {
        self.log.lock().unwrap().push((item.name.clone(), None));
        self.inner.forget(item);
    }
    fn num_requeues(&self, item: &ObjectKey) -> usize {
        self.inner.num_requeues(item)
    }
}

/// One random write to ConfigMap `cm-<0..names>` in `api`'s namespace, as the chaos tests'
/// writers make them: a delete one time in four, else a create or a replace with a random `v`.
/// Errors (conflicts, not found) are ignored. Returns the name written.
pub async fn random_write(api: &Api<ConfigMap>, rng: &mut StdRng, names: usize) -> String {
    let name = format!("cm-{}", rng.random_range(0..names));
    if rng.random_range(0..4) == 0 {
        let _ = api.delete(&name, &DeleteParams::default()).await;
    } else {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.clone());
        cm.data = Some(BTreeMap::from([(
            "v".to_string(),
            rng.random_range(0..1_000_000u32).to_string(),
        )]));
        match api.get_opt(&name).await {
            Ok(Some(existing)) => {
                cm.metadata.resource_version = existing.metadata.resource_version;
                let _ = api.replace(&name, &PostParams::default(), &cm).await;
            }
            Ok(None) => {
                let _ = api.create(&PostParams::default(), &cm).await;
            }
            Err(_) => {}
        }
    }
    name
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

/// `registry`'s metrics in the Prometheus text format.
pub fn gather(registry: &prometheus::Registry) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .expect("encode")
}

/// The value of the first sample of `series` (name and labels as exposed) in `registry`;
/// `None` if it exports none.
pub fn registry_sample(registry: &prometheus::Registry, series: &str) -> Option<f64> {
    gather(registry)
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}
