//! The sample-controller in a cluster: the Manager its binary runs there (`--in-cluster` in a
//! pod, `--kubeconfig` from outside) and the manifests that deploy it, which
//! `cargo xtask manifests` writes to `examples/deploy/sample-controller.yaml`.
//!
//! Its RBAC is not written by hand: [`manifests`] builds the controller as [`manager`] does
//! (without running it) and takes the rules from
//! [`BuiltController::permissions`](kinformer::controller::BuiltController::permissions):
//! `get`/`list`/`watch` on Foos and Deployments (its sources), the writes
//! [`controller`](super::controller) declares, the event recorder's `create`/`patch` on
//! Events, and the leader election Lease in [`NAMESPACE`]. `examples/tests/manifests.rs` applies
//! them to envtest, runs [`manager`] as the ServiceAccount and checks every request it made
//! against them.

use kinformer::controller::Manager;
use kinformer::controller::manifests::Manifests;

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

/// As [`manager`], with the controller sharded: this replica is shard `shard_id` of the ring
/// `foo`, its Lease in `--namespace` beside the leader lease; the leader also runs the ring's
/// sharder.
pub fn sharded_manager(client: kube::Client, common: &CommonArgs, shard_id: &str) -> Result<Manager, DemoError> {
    let mut manager = demo::cluster_manager(client, common, NAME)?;
    let shard = kinformer::controller::sharding::ShardingConfig::new("foo", shard_id).namespace(&common.namespace);
    let readiness = shard.readiness.clone();
    let (controller, sharder) = super::sharded_controller(&manager, shard, |inner| inner)?;
    manager.add(controller);
    manager.add(sharder);
    manager.add_readyz_check("shard", move || readiness.check());
    Ok(manager)
}

/// The manifests of the sample-controller: the Foo CRD (`v1` only: a cluster cannot reach the
/// webhooks of the embedded demo), the RBAC of the controller's declarations, the Deployment
/// running [`IMAGE`] with [`args`].
///
/// Builds the controller on a Manager whose client points nowhere: building makes no request.
/// Call it inside a tokio runtime (the client's request buffer is a task).
pub fn manifests() -> Result<Manifests, DemoError> {
    let config = kube::Config::new("https://kubernetes.default.svc".parse()?);
    let manager = Manager::builder(kube::Client::try_from(config)?)
        .build()
        .map_err(demo::manager_error)?;
    let controller = super::controller(&manager, |inner| inner)?;
    Ok(Manifests::new(NAME, NAMESPACE, IMAGE)
        .args(args())
        .permissions(controller.permissions())
        .crds([super::crd()]))
}
