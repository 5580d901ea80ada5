//! The sample-controller in a cluster: the Manager its binary runs there (`--in-cluster` in a
//! pod, `--kubeconfig` from outside; sharded with `--shards`) and the manifests that deploy it,
//! which `cargo xtask manifests` writes to `examples/deploy/sample-controller.yaml` and, sharded,
//! `examples/deploy/sample-controller-sharded.yaml` (apply one of the two).
//!
//! Its RBAC is not written by hand: [`manifests`] builds the controller as [`manager`] does
//! (without running it) and takes the rules from
//! [`BuiltController::permissions`](kinformer::controller::BuiltController::permissions):
//! `get`/`list`/`watch` on Foos and Deployments (its sources), the writes
//! [`controller`](super::controller) declares, the event recorder's `create`/`patch` on
//! Events, and the leader election Lease in [`NAMESPACE`]. [`sharded_manifests`] does the same
//! for [`sharded_manager`]'s shard controller and sharder, whose Lease grants (the shard Leases,
//! the sharder's Lease informer) go to a Role in [`NAMESPACE`], where the Leases are, rather
//! than the ClusterRole. `examples/tests/manifests.rs` applies each to envtest, runs the
//! Managers as the ServiceAccount and checks every request they made against them.

use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer::controller::manifests::{Manifests, NAME_LABEL};
use kinformer::controller::sharding::ShardingConfig;
use kinformer::controller::{Manager, Permissions, Reconciler};

use super::{Foo, SampleController};
use crate::demo::{self, CommonArgs, DemoError};

/// The name of the ServiceAccount, the roles, the Deployment and the leader election Lease.
pub const NAME: &str = "sample-controller";

/// The namespace the controller runs in, and where its Lease lives.
pub const NAMESPACE: &str = "sample-controller-system";

/// The image `examples/deploy/sample-controller.Dockerfile` builds (`docker build -t
/// sample-controller:dev -f examples/deploy/sample-controller.Dockerfile .`, then load it into
/// the cluster, e.g. `kind load docker-image sample-controller:dev`).
pub const IMAGE: &str = "sample-controller:dev";

/// The binary's arguments in the pod: in-cluster config, the Lease in [`NAMESPACE`], the
/// Manager's ports on every interface, as the Deployment's ports and probes expect.
pub fn args() -> Vec<String> {
    vec![
        "--in-cluster".into(),
        format!("--namespace={NAMESPACE}"),
        "--metrics-addr=0.0.0.0:8080".into(),
        "--health-probe-addr=0.0.0.0:8081".into(),
    ]
}

/// The Manager the binary runs against a cluster, with the controller added: leader election
/// on the Lease [`NAME`] in `--namespace`, `/metrics` and the probes on `--metrics-addr` and
/// `--health-probe-addr` (see [`demo::cluster_manager`]).
pub fn manager(client: kube::Client, common: &CommonArgs) -> Result<Manager, DemoError> {
    let mut manager = demo::cluster_manager(client, common, NAME)?;
    manager.add(super::controller(&manager, |inner| inner)?);
    Ok(manager)
}

/// As [`manager`], with the controller sharded (`--shards`): this replica is shard `shard_id` of
/// the ring [`RING`](super::RING), its Lease in `--namespace` beside the leader lease, its Foo
/// and Deployment caches holding only its shard's objects ([`shard_factory`](super::shard_factory));
/// the leader also runs the ring's sharder, whose informers start only while it leads
/// ([`Manager::leader_factory`]). `/readyz` fails while the replica holds no shard Lease (its
/// check `shard-foo`, which the sharded controller brings).
/// `wrap` wraps the reconciler, as in [`controller`](super::controller) (the binary's is
/// `|inner| inner`).
pub fn sharded_manager<R: Reconciler<Foo>>(
    client: kube::Client,
    common: &CommonArgs,
    shard_id: &str,
    wrap: impl FnOnce(SampleController) -> R,
) -> Result<Manager, DemoError> {
    let shard = ShardingConfig::new(super::RING, shard_id).namespace(&common.namespace);
    let mut manager = demo::cluster_manager_builder(client.clone(), common, NAME)
        .factory(super::shard_factory(client, &shard))
        .build()
        .map_err(demo::manager_error)?;
    let (controller, sharder) = super::sharded_controller(&manager, shard, wrap)?;
    manager.add(controller);
    manager.add(sharder);
    Ok(manager)
}

/// The manifests of the sample-controller: the Foo CRD (`v1` only: a cluster cannot reach the
/// webhooks of the embedded demo), the RBAC of the controller's declarations, the Deployment
/// running [`IMAGE`] with [`args`].
///
/// Builds the controller on a Manager whose client points nowhere: building makes no request.
/// Call it inside a tokio runtime (the client's request buffer is a task).
pub fn manifests() -> Result<Manifests, DemoError> {
    let manager = Manager::builder(nowhere()?)
        .no_http_servers()
        .build()
        .map_err(demo::manager_error)?;
    let controller = super::controller(&manager, |inner| inner)?;
    Ok(Manifests::new(NAME, NAMESPACE, IMAGE)
        .args(args())
        .permissions(controller.permissions())
        .crds([super::crd()]))
}

/// A client of the in-cluster address, for building controllers without running them.
fn nowhere() -> Result<kube::Client, DemoError> {
    let config = kube::Config::new("https://kubernetes.default.svc".parse()?);
    Ok(kube::Client::try_from(config)?)
}

/// The name of the Role (and its RoleBinding) granting the sharded controller's Lease access in
/// [`NAMESPACE`].
pub const SHARDS_ROLE: &str = "sample-controller-shards";

/// The sharded Deployment's replicas: three shards.
pub const SHARDS: i32 = 3;

/// The sharded binary's arguments in the pod: [`args`] and `--shards` (each pod's shard id is
/// its hostname, the pod's name).
pub fn sharded_args() -> Vec<String> {
    let mut args = args();
    args.push("--shards".into());
    args
}

/// The manifests of the sharded sample-controller ([`sharded_manifests`]).
#[derive(Debug, Clone)]
pub struct ShardedManifests {
    /// The CRD, the ServiceAccount, the ClusterRole of everything the shard's controller and
    /// the sharder need but Leases, the leader election Role, the Service and the Deployment
    /// (with [`sharded_args`]).
    pub manifests: Manifests,
    /// What the shards and the sharder do to Leases, all in [`NAMESPACE`]: a shard creates,
    /// renews, labels and re-reads its own Lease; the sharder lists and watches them, fences
    /// a gone shard's (a create if it is absent) and deletes one free for longer than the grace.
    /// Granted by the Role [`SHARDS_ROLE`].
    pub leases: Permissions,
}

impl ShardedManifests {
    /// The Role granting [`leases`](Self::leases) in [`NAMESPACE`].
    pub fn shards_role(&self) -> Role {
        Role {
            metadata: meta(SHARDS_ROLE),
            rules: Some(self.leases.rules()),
        }
    }

    /// Every object, in apply order: [`Manifests::objects`] with the Role [`SHARDS_ROLE`] and its
    /// RoleBinding after the leader election Role, and [`SHARDS`] replicas.
    pub fn objects(&self) -> Result<Vec<serde_json::Value>, serde_json::Error> {
        let mut objects = self.manifests.objects()?;
        let binding = RoleBinding {
            metadata: meta(SHARDS_ROLE),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: SHARDS_ROLE.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: NAME.into(),
                namespace: Some(NAMESPACE.into()),
                ..Subject::default()
            }]),
        };
        let role = [
            serde_json::to_value(self.shards_role())?,
            serde_json::to_value(binding)?,
        ];
        // Manifests writes no replica count of its own: one replica is its design, as leader
        // election makes more safe, not faster; sharded, each replica is a shard.
        for object in &mut objects {
            if object["kind"] == "Deployment" {
                object["spec"]["replicas"] = SHARDS.into();
            }
        }
        let at = objects
            .iter()
            .position(|o| o["kind"] == "Service")
            .unwrap_or(objects.len());
        objects.splice(at..at, role);
        Ok(objects)
    }
}

/// The metadata of an object of [`NAMESPACE`] named `name`, labelled as [`Manifests`] labels
/// its objects.
fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NAMESPACE.into()),
        labels: Some([(NAME_LABEL.to_owned(), NAME.to_owned())].into()),
        ..ObjectMeta::default()
    }
}

/// The manifests of the sharded sample-controller: as [`manifests`], with the permissions of
/// the shard's controller and the ring's sharder (built as [`sharded_manager`] builds them),
/// the Lease grants in a Role of [`NAMESPACE`] (see [`ShardedManifests`]), [`sharded_args`] and
/// [`SHARDS`] replicas. Call it inside a tokio runtime.
pub fn sharded_manifests() -> Result<ShardedManifests, DemoError> {
    let client = nowhere()?;
    let shard = ShardingConfig::new(super::RING, "manifests").namespace(NAMESPACE);
    let manager = Manager::builder(client.clone())
        .factory(super::shard_factory(client, &shard))
        .no_http_servers()
        .build()
        .map_err(demo::manager_error)?;
    let (controller, sharder) = super::sharded_controller(&manager, shard, |inner| inner)?;
    let (mut cluster, mut leases) = (Permissions::new(), Permissions::new());
    for permissions in [controller.permissions(), sharder.permissions()] {
        for (group, resource, verbs) in permissions.iter() {
            let verbs: Vec<_> = verbs.iter().copied().collect();
            let into = if (group, resource) == ("coordination.k8s.io", "leases") {
                &mut leases
            } else {
                &mut cluster
            };
            into.grant(group, resource, &verbs);
        }
    }
    Ok(ShardedManifests {
        manifests: Manifests::new(NAME, NAMESPACE, IMAGE)
            .args(sharded_args())
            .permissions(&cluster)
            .crds([super::crd()]),
        leases,
    })
}
