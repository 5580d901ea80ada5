//! sample-controller: Kubernetes' classic example controller, on kinformer.
//!
//! A [`Foo`] (`samplecontroller.k8s.io/v1alpha1`) asks for a Deployment named
//! `spec.deploymentName` with `spec.replicas` replicas. The controller:
//! - creates that Deployment, owned by the Foo (controller ownerReference), and recreates it if
//!   someone deletes it (the Deployment's delete enqueues its owner);
//! - scales it when `spec.replicas` changes;
//! - copies the Deployment's `status.availableReplicas` into the Foo's status (status
//!   subresource);
//! - records a `Synced` Event on the Foo after each successful sync, and a Warning
//!   `ErrResourceExists` when the name is taken by a Deployment it does not own, which it then
//!   leaves untouched (the reconcile fails and is retried with backoff, as upstream).
//!
//! Reconciles read only from the factory's typed listers (`FooLister` from
//! `#[derive(Informer)]`, `DeploymentLister` from `cargo xtask codegen`) and write through
//! `kube::Api`.

// The resource is called Foo, as upstream: `foo` names one, not a placeholder.
#![allow(clippy::disallowed_names)]

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kinformer::Informer;
use kinformer::controller::{
    Action, BuiltController, Context, ControllerError, EventType, Manager, Reconciler, Request,
};
use kinformer::factory::generated::apps::v1::DeploymentLister;
use kinformer::factory::{FactoryError, SharedInformerFactory};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The desired state of a [`Foo`].
#[derive(CustomResource, Informer, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "samplecontroller.k8s.io",
    version = "v1alpha1",
    kind = "Foo",
    namespaced,
    status = "FooStatus",
    printcolumn = r#"{"name":"Deployment","type":"string","jsonPath":".spec.deploymentName"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.availableReplicas"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FooSpec {
    /// The name of the Deployment the Foo owns.
    pub deployment_name: String,
    /// How many replicas the Deployment should run.
    pub replicas: Option<i32>,
}

/// The observed state of a [`Foo`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FooStatus {
    /// The Deployment's available replicas.
    pub available_replicas: i32,
}

/// The Foo CRD.
pub fn crd() -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    Foo::crd()
}

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Writing to the API server failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The Deployment's name belongs to a Deployment this Foo does not control.
    #[error("Resource {0:?} already exists and is not managed by Foo")]
    ResourceExists(String),
}

/// The reconciler: typed listers for reads, the context's client for writes.
pub struct SampleController {
    foos: FooLister,
    deployments: DeploymentLister,
}

impl SampleController {
    /// Takes its listers from `factory`'s shared informers.
    pub fn new(factory: &SharedInformerFactory) -> Result<Self, FactoryError> {
        Ok(SampleController {
            foos: Foo::informer(factory)?.lister(),
            deployments: factory.apps().v1().deployments()?.lister(),
        })
    }
}

/// The labels of a Foo's Deployment and its pods.
fn labels(foo: &Foo) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app".to_string(), "nginx".to_string()),
        ("controller".to_string(), foo.name_any()),
    ])
}

/// The Deployment a Foo wants, owned by it.
pub fn new_deployment(foo: &Foo) -> Deployment {
    let owner = foo.controller_owner_ref(&()).map(|mut r| {
        r.block_owner_deletion = Some(true);
        r
    });
    Deployment {
        metadata: ObjectMeta {
            name: Some(foo.spec.deployment_name.clone()),
            namespace: foo.namespace(),
            owner_references: owner.map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: foo.spec.replicas,
            selector: LabelSelector {
                match_labels: Some(labels(foo)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(foo)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "nginx".into(),
                        image: Some("nginx:latest".into()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

fn is_controlled_by(deployment: &Deployment, foo: &Foo) -> bool {
    let uid = foo.uid();
    deployment
        .owner_references()
        .iter()
        .any(|r: &OwnerReference| r.controller == Some(true) && Some(&r.uid) == uid.as_ref())
}

impl Reconciler<Foo> for SampleController {
    type Error = SyncError;

    async fn reconcile(&self, req: Request, ctx: &Context<Foo>) -> Result<Action, SyncError> {
        let namespace = req.namespace.clone().unwrap_or_default();
        // Gone: its Deployment is garbage-collected through the owner reference.
        let Some(foo) = self.foos.foos(&namespace).get(&req.name) else {
            return Ok(Action::Done);
        };
        let name = &foo.spec.deployment_name;
        if name.is_empty() {
            // Nothing to do until the user fixes the spec; an update will enqueue it again.
            tracing::warn!(foo = %req, "spec.deploymentName is empty");
            return Ok(Action::Done);
        }
        let deployments: Api<Deployment> = Api::namespaced(ctx.client().clone(), &namespace);
        let deployment = match self.deployments.deployments(&namespace).get(name) {
            Some(deployment) => deployment,
            None => {
                let created = deployments
                    .create(&PostParams::default(), &new_deployment(&foo))
                    .await?;
                std::sync::Arc::new(created)
            }
        };
        if !is_controlled_by(&deployment, &foo) {
            let message = format!("Resource {name:?} already exists and is not managed by Foo");
            ctx.recorder()
                .publish(&*foo, EventType::Warning, "ErrResourceExists", "Sync", &message);
            return Err(SyncError::ResourceExists(name.clone()));
        }
        let wanted = foo.spec.replicas;
        let current = deployment.spec.as_ref().and_then(|s| s.replicas);
        let deployment = if wanted.is_some() && wanted != current {
            tracing::info!(foo = %req, ?wanted, ?current, "scaling deployment");
            let patch = serde_json::json!({"spec": {"replicas": wanted}});
            std::sync::Arc::new(
                deployments
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?,
            )
        } else {
            deployment
        };
        let available = deployment
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        if foo.status.as_ref().map(|s| s.available_replicas) != Some(available) {
            let foos: Api<Foo> = Api::namespaced(ctx.client().clone(), &namespace);
            let status = serde_json::json!({"status": {"availableReplicas": available}});
            foos.patch_status(&req.name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
        ctx.recorder()
            .publish(&*foo, EventType::Normal, "Synced", "Sync", "Foo synced successfully");
        Ok(Action::Done)
    }
}

/// The sample-controller on `manager`'s factory: Foos, and the Deployments they own.
pub fn controller<R: Reconciler<Foo>>(
    manager: &Manager,
    wrap: impl FnOnce(SampleController) -> R,
) -> Result<BuiltController<Foo, R>, ControllerError> {
    let reconciler = SampleController::new(manager.factory())?;
    manager
        .controller("foo")
        .for_resource::<Foo>()
        .owns::<Deployment>()
        .workers(2)
        .build(wrap(reconciler))
}
