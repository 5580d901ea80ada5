//! Example resource types and controllers built on kinformer.
//!
//! - [`sample_controller`]: Kubernetes' sample-controller (Foo → Deployment); run
//!   `cargo run -p examples --bin sample-controller`.
//! - [`replicaset_lite`]: kube-controller-manager's ReplicaSet controller (ReplicaSet → Pods)
//!   with client-go's expectations and a Pod index by controller; run
//!   `cargo run -p examples --bin replicaset-lite`.
//! - [`demo`]: what the example binaries share (embedded server, per-reconcile lines, summary).
//! - [`generated`]: what `cargo xtask codegen` writes from `examples/kinformer-codegen.toml`
//!   with `kinformer::codegen`, as a controller repository of your own would: Rust types,
//!   informers and listers for the CRDs in `examples/crds/codegen/`, and accessors for two
//!   built-in resources the factory does not list.
//!
//! [`Foo`] is a namespaced custom resource defined the usual kube way, with
//! `#[derive(CustomResource)]` on its spec, and given typed informers and listers by
//! `#[derive(Informer)]` on the same struct: `FooInformer`, `FooLister`, `FooNamespaceLister`,
//! and `Foo::informer(&factory)`. `cargo xtask crds` writes its CRD to `examples/crds/`.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod demo;
// Formatted by the generator (prettyplease), checked by `cargo xtask codegen --check`.
#[rustfmt::skip]
pub mod generated;
pub mod replicaset_lite;
pub mod sample_controller;

use kinformer::Informer;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired state of a [`Foo`]: a deployment-like thing with a replica count.
#[derive(CustomResource, Informer, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "example.kinformer.dev",
    version = "v1",
    kind = "Foo",
    namespaced,
    status = "FooStatus"
)]
#[kube(shortname = "foo")]
pub struct FooSpec {
    /// How many replicas the Foo wants.
    pub replicas: i32,
    /// The image the replicas run.
    pub image: String,
}

/// The observed state of a [`Foo`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FooStatus {
    /// How many replicas are ready.
    pub ready_replicas: i32,
}

/// The CRDs of the example resource types, for `cargo xtask crds` and tests.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    vec![Foo::crd(), sample_controller::crd()]
}
