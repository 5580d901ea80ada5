//! envtest: an in-process, Kubernetes-compatible API server on 127.0.0.1.
//!
//! Where it sits: under every kinformer integration test (informers, reflectors and controllers
//! talk to it over real HTTP through `kube::Client`, exactly as to kube-apiserver) and as the
//! embedded default server the examples run against when no KUBECONFIG is given. The
//! `kinformer-apiserver` binary serves the same thing for kubectl.
//!
//! It follows the Kubernetes API concepts
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/>): objects are JSON with
//! server-owned metadata, one global strictly increasing resourceVersion, list pagination pinned
//! to a revision, `Status` errors, and watches served from a bounded watch cache (the
//! apiserver's Cacher, one `cacheWatcher` per watch) that answers `410 Expired` once a revision
//! has left its window. A list or watch at a revision the server has not reached waits for it
//! (3 s, [`Config::too_large_resource_version_wait`]) and then answers `504` "Too large
//! resource version" with the `ResourceVersionTooLarge` cause, as kube-apiserver's watch cache
//! does. Built-in workloads, Pods and Services get kube-apiserver's defaults on every write
//! (`spec.replicas: 1`, rolling-update strategy, `imagePullPolicy` by tag, Service type and
//! target ports, …; see `defaults.rs` for the list and what is left out). [`Faults`] injects
//! failures for reliability tests.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//!
//! let env = envtest::Server::start(envtest::Config::default()).await?;
//! let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("hello".into());
//! cms.create(&PostParams::default(), &cm).await?;
//! assert_eq!(env.objects_of("/api/v1/namespaces/default/configmaps")?.len(), 1);
//! env.shutdown().await;
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

pub mod chaos;
mod config;
mod crd;
mod defaults;
mod discovery;
mod error;
mod faults;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gc;
mod kubeconfig;
mod object;
mod openapi;
mod patch;
mod protobuf;
mod request;
mod resources;
mod rest;
mod selectors;
mod server;
mod status;
mod storage;
mod tls;
mod watch_cache;

pub use config::Config;
pub use error::Error;
pub use faults::{Faults, MAX_FAULT_COUNT, MAX_LATENCY, MAX_RETRY_AFTER_SECS, RecordedRequest};
pub use kubeconfig::kubeconfig;
pub use patch::PatchKind;
pub use resources::{Registry, ResourceInfo, builtin as builtin_resources};
pub use selectors::{FieldSelector, Filter, LabelSelector};
pub use server::Server;
pub use status::ApiError;
pub use tls::HANDSHAKE_TIMEOUT;
