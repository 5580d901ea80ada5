//! sample-controller: Kubernetes' classic example controller, on kinformer.
//!
//! A [`Foo`] (`samplecontroller.k8s.io/v1`) asks for a Deployment named
//! `spec.deploymentName` with `spec.replicas` replicas. The controller:
//! - creates that Deployment, owned by the Foo (controller ownerReference), and recreates it if
//!   someone deletes it (the Deployment's delete enqueues its owner);
//! - scales it when `spec.replicas` changes;
//! - copies the Deployment's `status.availableReplicas` into the Foo's status (status
//!   subresource);
//! - keeps one entry per Foo (`<foo>: deployment=<name> replicas=<n>`) in the index ConfigMap
//!   [`INDEX`] of the Foo's namespace, and removes it when the Foo is deleted: the ConfigMap is
//!   shared by every Foo, so garbage collection (which deletes the Deployment) cannot do that.
//!   The [`finalizer`] helper holds the deleted Foo until the entry is gone ([`FINALIZER`]);
//! - records a `Synced` Event on the Foo after each successful sync, and a Warning
//!   `ErrResourceExists` when the name is taken by a Deployment it does not own, which it then
//!   leaves untouched (the reconcile fails and is retried with backoff, as upstream; that Foo
//!   gets no index entry).
//!
//! Reconciles read only from the factory's typed listers (`FooLister` from
//! `#[derive(Informer)]`, `DeploymentLister` from `cargo xtask codegen`) and write through
//! `kube::Api`, each write behind `ctx.ensure_leading()?` (against a cluster the controller runs
//! with leader election). The Deployment source has a typed predicate of its own
//! ([`deployment_changed_for_foo`]): status writes that change nothing a Foo reads do not
//! enqueue it.
//!
//! [`deploy`] writes the manifests that run it in a cluster (CRD, RBAC from the controller's
//! declared sources and writes, Deployment); `cargo xtask manifests` puts them in
//! `examples/deploy/`.
//!
//! [`webhooks`] holds what the Manager serves for Foos besides the controller: a validating
//! webhook (`spec.replicas` within 0..=10), a mutating one (a default label), and the conversion
//! of Foo's second version, `v1alpha1` (`spec.size`), to and from `v1`, the hub, the storage
//! version and the one the controller reads.

// The resource is called Foo, as upstream: `foo` names one, not a placeholder.
#![allow(clippy::disallowed_names)]

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kinformer::Informer;
use kinformer::controller::predicate::ObjectFuncs;
use kinformer::controller::sharding::{SHARD_LABEL_PREFIX, Sharder, SharderReconciler, ShardingConfig};
use kinformer::controller::{
    Action, BuiltController, Context, ControllerError, EventType, FinalizerError, FinalizerEvent, Manager, NotLeader,
    Reconciler, Request, SourceOptions, Verb, finalizer,
};
use kinformer::factory::generated::apps::v1::DeploymentLister;
use kinformer::factory::{CacheOptions, FactoryError, PartialObjectMeta, SharedInformerFactory};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod deploy;
pub mod webhooks;

/// The desired state of a [`Foo`].
#[derive(CustomResource, Informer, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "samplecontroller.k8s.io",
    version = "v1",
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

/// The Foo CRD in `v1` only, as installed on a cluster that cannot reach the webhooks
/// ([`webhooks::crd`] has both versions and the conversion webhook).
pub fn crd() -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    Foo::crd()
}

/// The ConfigMap, one per namespace, that lists every Foo of the namespace whose Deployment the
/// controller manages: `<foo>: deployment=<name> replicas=<n>`.
pub const INDEX: &str = "foo-index";

/// The controller's finalizer on each Foo: the Foo's deletion waits until its [`INDEX`] entry
/// was removed.
pub const FINALIZER: &str = "samplecontroller.k8s.io/index-entry";

/// The [`INDEX`] entry of a Foo whose Deployment is synced.
pub fn index_entry(deployment: &str, replicas: Option<i32>) -> String {
    match replicas {
        Some(replicas) => format!("deployment={deployment} replicas={replicas}"),
        None => format!("deployment={deployment}"),
    }
}

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Writing to the API server failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// Writing the Foo's entry of the index ConfigMap failed.
    #[error("index ConfigMap {INDEX}: {0}")]
    Index(#[source] kube::Error),
    /// The Deployment's name belongs to a Deployment this Foo does not control.
    #[error("Resource {0:?} already exists and is not managed by Foo")]
    ResourceExists(String),
    /// This replica may no longer write (its leader election lease lapsed); the worker logs it
    /// below ERROR and requeues the key.
    #[error("{0}")]
    NotLeader(#[from] NotLeader),
    /// Adding or removing the finalizer failed.
    #[error("{0}")]
    Finalizer(FinalizerError),
}

impl From<FinalizerError> for SyncError {
    /// A failed apply or cleanup is the sync's own error, returned as it is (so the log and the
    /// demo's lines say "Resource \"taken\" already exists", not "apply of default/conflict
    /// failed"); the finalizer's own failures stay wrapped.
    fn from(e: FinalizerError) -> Self {
        match e {
            FinalizerError::ApplyFailed { source, object } => match source.downcast::<SyncError>() {
                Ok(sync) => *sync,
                Err(source) => SyncError::Finalizer(FinalizerError::ApplyFailed { object, source }),
            },
            FinalizerError::CleanupFailed {
                source,
                object,
                finalizer,
            } => match source.downcast::<SyncError>() {
                Ok(sync) => *sync,
                Err(source) => SyncError::Finalizer(FinalizerError::CleanupFailed {
                    object,
                    finalizer,
                    source,
                }),
            },
            other => SyncError::Finalizer(other),
        }
    }
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

/// The Deployment a Foo wants, owned by it. Sharded, it carries its Foo's shard label from the
/// start: the shard's Deployment cache, which selects on that label, holds it at once (the
/// sharder would label it so a moment later, and a reconcile in between would find no
/// Deployment cached and fail to create it again).
pub fn new_deployment(foo: &Foo) -> Deployment {
    let owner = foo.controller_owner_ref(&()).map(|mut r| {
        r.block_owner_deletion = Some(true);
        r
    });
    let shard_labels: BTreeMap<String, String> = foo
        .labels()
        .iter()
        .filter(|(key, _)| key.starts_with(SHARD_LABEL_PREFIX))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    Deployment {
        metadata: ObjectMeta {
            name: Some(foo.spec.deployment_name.clone()),
            namespace: foo.namespace(),
            labels: (!shard_labels.is_empty()).then_some(shard_labels),
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

impl SampleController {
    /// [`FinalizerEvent::Apply`]: the Deployment, the index entry, the status, the Event.
    async fn apply(&self, foo: &Foo, ctx: &Context<Foo>) -> Result<Action, SyncError> {
        let namespace = foo.namespace().unwrap_or_default();
        let name = &foo.spec.deployment_name;
        if name.is_empty() {
            // Nothing to do until the user fixes the spec; an update will enqueue it again.
            tracing::warn!(foo = %foo.name_any(), namespace, "spec.deploymentName is empty");
            return Ok(Action::Done);
        }
        let deployments: Api<Deployment> = Api::namespaced(ctx.client().clone(), &namespace);
        let deployment = match self.deployments.deployments(&namespace).get(name) {
            Some(deployment) => deployment,
            None => {
                ctx.ensure_leading()?;
                let created = deployments.create(&PostParams::default(), &new_deployment(foo)).await?;
                std::sync::Arc::new(created)
            }
        };
        if !is_controlled_by(&deployment, foo) {
            let message = format!("Resource {name:?} already exists and is not managed by Foo");
            ctx.recorder()
                .publish(foo, EventType::Warning, "ErrResourceExists", "Sync", &message);
            return Err(SyncError::ResourceExists(name.clone()));
        }
        let wanted = foo.spec.replicas;
        let current = deployment.spec.as_ref().and_then(|s| s.replicas);
        let deployment = if wanted.is_some() && wanted != current {
            tracing::info!(foo = %foo.name_any(), namespace, ?wanted, ?current, "scaling deployment");
            let patch = serde_json::json!({"spec": {"replicas": wanted}});
            ctx.ensure_leading()?;
            std::sync::Arc::new(
                deployments
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?,
            )
        } else {
            deployment
        };
        let entry = index_entry(name, deployment.spec.as_ref().and_then(|s| s.replicas));
        ctx.ensure_leading()?;
        write_index_entry(ctx, &namespace, &foo.name_any(), Some(&entry)).await?;
        let available = deployment
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        if foo.status.as_ref().map(|s| s.available_replicas) != Some(available) {
            let foos: Api<Foo> = Api::namespaced(ctx.client().clone(), &namespace);
            let status = serde_json::json!({"status": {"availableReplicas": available}});
            ctx.ensure_leading()?;
            foos.patch_status(&foo.name_any(), &PatchParams::default(), &Patch::Merge(&status))
                .await?;
        }
        ctx.recorder()
            .publish(foo, EventType::Normal, "Synced", "Sync", "Foo synced successfully");
        Ok(Action::Done)
    }
}

/// [`FinalizerEvent::Cleanup`]: removes the Foo's entry from the index (its Deployment is
/// garbage-collected through the owner reference once the Foo is gone). Idempotent: a missing
/// entry or a missing index is fine.
async fn cleanup(foo: &Foo, ctx: &Context<Foo>) -> Result<Action, SyncError> {
    let namespace = foo.namespace().unwrap_or_default();
    ctx.ensure_leading()?;
    write_index_entry(ctx, &namespace, &foo.name_any(), None).await?;
    tracing::info!(foo = %foo.name_any(), namespace, index = INDEX, "index entry removed");
    Ok(Action::Done)
}

/// Sets (`Some`) or removes (`None`) the entry `foo` of the index ConfigMap of `namespace`.
///
/// A JSON merge patch of `data.<foo>` alone: two workers writing the entries of two Foos at
/// once never overwrite each other (no read-modify-write of the whole map), and a repeated
/// write changes nothing on the server. The index is created on the first entry; it has no
/// owner, since it belongs to no single Foo.
async fn write_index_entry(
    ctx: &Context<Foo>,
    namespace: &str,
    foo: &str,
    entry: Option<&str>,
) -> Result<(), SyncError> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), namespace);
    let patch = Patch::Merge(serde_json::json!({"data": {foo: entry}}));
    let params = PatchParams::default();
    let patch_index = || api.patch(INDEX, &params, &patch);
    match patch_index().await {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(SyncError::Index(e)),
    }
    let Some(entry) = entry else {
        return Ok(()); // no index, so no entry to remove
    };
    let index = ConfigMap {
        metadata: ObjectMeta {
            name: Some(INDEX.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(foo.to_owned(), entry.to_owned())])),
        ..ConfigMap::default()
    };
    match api.create(&PostParams::default(), &index).await {
        Ok(_) => Ok(()),
        // Another worker created it in between: patch the index it made.
        Err(kube::Error::Api(e)) if e.code == 409 => patch_index().await.map(drop).map_err(SyncError::Index),
        Err(e) => Err(SyncError::Index(e)),
    }
}

impl Reconciler<Foo> for SampleController {
    type Error = SyncError;

    async fn reconcile(&self, req: Request, ctx: &Context<Foo>) -> Result<Action, SyncError> {
        let namespace = req.namespace.clone().unwrap_or_default();
        // Gone: the finalizer let it go only after the cleanup removed its index entry, and its
        // Deployment is garbage-collected through the owner reference.
        let Some(foo) = self.foos.foos(&namespace).get(&req.name) else {
            return Ok(Action::Done);
        };
        let foos: Api<Foo> = Api::namespaced(ctx.client().clone(), &namespace);
        ctx.ensure_leading()?; // the helper may add or remove the finalizer
        let action = finalizer(&foos, FINALIZER, foo, |event| async move {
            match event {
                FinalizerEvent::Apply(foo) => self.apply(&foo, ctx).await,
                FinalizerEvent::Cleanup(foo) => cleanup(&foo, ctx).await,
            }
        })
        .await?;
        Ok(action)
    }
}

/// The Deployment source's predicate: an update enqueues the owner only when it changed what
/// the Foo reads of its Deployment: the spec (a scale), `status.availableReplicas` (copied into
/// the Foo's status) or the owner references (who to enqueue). The rest of a Deployment's
/// status churn (conditions, `readyReplicas`, `observedGeneration`…) does not. Creates and
/// deletes always pass: a deleted Deployment must be recreated.
pub fn deployment_changed_for_foo(old: &Deployment, new: &Deployment) -> bool {
    let available = |d: &Deployment| d.status.as_ref().and_then(|s| s.available_replicas);
    old.spec != new.spec
        || available(old) != available(new)
        || old.metadata.owner_references != new.metadata.owner_references
}

/// The sample-controller on `manager`'s factory: Foos, and the Deployments they own.
pub fn controller<R: Reconciler<Foo>>(
    manager: &Manager,
    wrap: impl FnOnce(SampleController) -> R,
) -> Result<BuiltController<Foo, R>, ControllerError> {
    build(manager, None, wrap)
}

/// The ring's sharder for the sample-controller: it labels every Foo, and each Foo's Deployment
/// like its owner.
pub type FooSharder = BuiltController<PartialObjectMeta<Foo>, SharderReconciler<Foo>>;

/// The name of the sharded sample-controller's ring: its label is `shard.kinformer.io/foo`, its
/// shard Leases `foo-<shard-id>`.
pub const RING: &str = "foo";

/// The informer factory of shard `shard`: the Foo and Deployment informers hold only the objects
/// labelled for the shard (`by_object`, controller-runtime's `cache.Options.ByObject`), so the
/// reconciler's typed listers ([`SampleController::new`]) read the same caches as the sharded
/// controller's sources, one list and watch per type. Give it to the Manager
/// ([`ManagerBuilder::factory`](kinformer::controller::ManagerBuilder::factory)) before
/// [`sharded_controller`].
pub fn shard_factory(client: kube::Client, shard: &ShardingConfig) -> SharedInformerFactory {
    let only_shard = shard_cache(shard);
    SharedInformerFactory::builder(client)
        .strip_managed_fields(true)
        .by_object::<Foo>(only_shard.clone())
        .by_object::<Deployment>(only_shard)
        .build()
}

/// The cache options a sharded controller's sources get: the shard's label selector.
fn shard_cache(shard: &ShardingConfig) -> CacheOptions {
    CacheOptions::default().labels(shard.selector())
}

/// The sample-controller as shard `shard` of its ring (see `kinformer::controller::sharding`):
/// the controller, which caches and reconciles only the Foos (and their Deployments) labelled
/// for this shard, and the ring's sharder, which the Manager runs while it leads and which
/// labels every Foo, and each Foo's Deployment like its owner. The sharder's informers (every
/// Foo's and Deployment's metadata, the shard Leases) are on the Manager's
/// [`leader_factory`](Manager::leader_factory): a replica that does not lead caches only its
/// shard's objects.
///
/// The Manager's factory must be [`shard_factory`]'s: the reconciler's typed listers read its
/// shared Foo and Deployment informers, which must be the shard's. With another, the build
/// fails ([`FactoryError::ConflictingOptions`]) rather than caching every Foo.
pub fn sharded_controller<R: Reconciler<Foo>>(
    manager: &Manager,
    shard: ShardingConfig,
    wrap: impl FnOnce(SampleController) -> R,
) -> Result<(BuiltController<Foo, R>, FooSharder), ControllerError> {
    let sharder = Sharder::<Foo>::new(manager.leader_factory(), &shard)
        .metrics(manager.metrics().clone())
        .owns::<Deployment>()
        .build()?;
    Ok((build(manager, Some(shard), wrap)?, sharder))
}

fn build<R: Reconciler<Foo>>(
    manager: &Manager,
    shard: Option<ShardingConfig>,
    wrap: impl FnOnce(SampleController) -> R,
) -> Result<BuiltController<Foo, R>, ControllerError> {
    if let Some(shard) = &shard {
        // The shared informers the typed listers read are the shard's, or this fails (see
        // `sharded_controller`).
        manager.factory().shared_informer_with::<Foo>(shard_cache(shard))?;
        manager
            .factory()
            .shared_informer_with::<Deployment>(shard_cache(shard))?;
    }
    let reconciler = SampleController::new(manager.factory())?;
    let builder = manager.controller("foo");
    let builder = match shard {
        Some(shard) => builder.sharded(shard),
        None => builder,
    };
    builder
        .for_resource::<Foo>()
        .owns_with(
            SourceOptions::<Deployment>::new().predicate(ObjectFuncs::new().on_update(deployment_changed_for_foo)),
        )
        // The writes `reconcile` makes, for the controller's RBAC (`deploy`): the Deployment's
        // create and scale, the index ConfigMap's create and merge patches, the finalizer's
        // JSON patches of the Foo and the status merge patch. Nothing is deleted: garbage
        // collection removes a deleted Foo's Deployment.
        .writes::<Deployment>(&[Verb::Create, Verb::Patch])
        .writes::<ConfigMap>(&[Verb::Create, Verb::Patch])
        .writes::<Foo>(&[Verb::Patch])
        .writes_status::<Foo>(&[Verb::Patch])
        .workers(2)
        .build(wrap(reconciler))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};

    use super::*;

    fn deployment(replicas: i32, available: i32) -> Deployment {
        let foo = Foo::new(
            "foo",
            FooSpec {
                deployment_name: "web".into(),
                replicas: Some(replicas),
            },
        );
        Deployment {
            status: Some(DeploymentStatus {
                available_replicas: Some(available),
                ready_replicas: Some(available),
                ..DeploymentStatus::default()
            }),
            ..new_deployment(&foo)
        }
    }

    #[test]
    fn the_deployment_predicate_drops_status_churn_a_foo_does_not_read() {
        let old = deployment(3, 1);
        let mut churn = old.clone();
        if let Some(status) = churn.status.as_mut() {
            status.ready_replicas = Some(2);
            status.observed_generation = Some(4);
            status.conditions = Some(vec![DeploymentCondition {
                type_: "Progressing".into(),
                status: "True".into(),
                ..DeploymentCondition::default()
            }]);
        }
        assert!(!deployment_changed_for_foo(&old, &churn));
        assert!(!deployment_changed_for_foo(&old, &old.clone()), "a resync");
        assert!(deployment_changed_for_foo(&old, &deployment(3, 2)), "availableReplicas");
        assert!(deployment_changed_for_foo(&old, &deployment(5, 1)), "a scale");
        let mut adopted = old.clone();
        adopted.metadata.owner_references = Some(vec![OwnerReference {
            kind: "Foo".into(),
            name: "foo".into(),
            uid: "1".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        assert!(deployment_changed_for_foo(&old, &adopted), "owner references");
    }

    #[test]
    fn a_failed_apply_reads_as_the_sync_error_and_the_finalizers_own_errors_stay_wrapped() {
        let apply = FinalizerError::ApplyFailed {
            object: "default/conflict".into(),
            source: Box::new(SyncError::ResourceExists("taken".into())),
        };
        assert_eq!(
            SyncError::from(apply).to_string(),
            "Resource \"taken\" already exists and is not managed by Foo"
        );
        let other = FinalizerError::UnnamedObject;
        assert!(matches!(SyncError::from(other), SyncError::Finalizer(_)));
    }
}
