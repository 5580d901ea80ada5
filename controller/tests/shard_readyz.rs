//! `/readyz` of a Manager with sharded controllers (issue #26), over real HTTP against envtest.
//! A sharded controller brings its `shard-<ring>` check when it is added to the Manager
//! (`Manager::add`, or `ManagerHandle::add` while it runs): it fails (500, as
//! controller-runtime's failing checks) while another process holds the shard's Lease and while
//! the shard holds it fenced, and passes (200) once the shard holds it unfenced; `/readyz`
//! aggregates it. An unsharded controller brings none. No sharder runs: the test plays the other
//! process and the sharder on the Lease itself.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{eventually, http_get};
use controller::sharding::{FENCE_ANNOTATION, RING_LABEL, ShardingConfig};
use controller::{Action, Context, Manager, Request, reconciler_fn};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "default";
const WAIT: Duration = Duration::from_secs(30);
/// The holder of the shard's Lease before the shard: another process of the same shard id.
const OTHER: &str = "another-process";

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Shard `shard-0` of `ring`, with short Lease timing (the shard retries acquiring every 300 ms).
fn shard(ring: &str) -> ShardingConfig {
    ShardingConfig::new(ring, "shard-0").namespace(NAMESPACE).lease_timing(
        Duration::from_secs(2),
        Duration::from_millis(1500),
        Duration::from_millis(300),
    )
}

fn holder(lease: &Lease) -> String {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_controller_brings_its_shard_readyz_check() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let config = shard("cms");
    let lease_name = config.lease_name();
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);

    // Another process holds the shard's Lease, renewed just now for an hour: the shard waits.
    let held = Lease {
        metadata: ObjectMeta {
            name: Some(lease_name.clone()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(BTreeMap::from([(RING_LABEL.to_owned(), "cms".to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(OTHER.into()),
            lease_duration_seconds: Some(3600),
            acquire_time: Some(MicroTime(jiff::Timestamp::now())),
            renew_time: Some(MicroTime(jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &held).await.unwrap();

    let mut manager = Manager::builder(client.clone())
        .no_metrics_server()
        .health_probe_addr(local())
        .build()
        .unwrap();
    let probes = manager.health_probe_addr().unwrap();
    let sharded = manager
        .controller("configmaps")
        .sharded(config.clone())
        .for_resource::<ConfigMap>()
        .build(reconciler_fn(|_req: Request, _ctx: Context<ConfigMap>| async {
            Ok::<_, kube::Error>(Action::Done)
        }))
        .unwrap();
    let plain = manager
        .controller("secrets")
        .for_resource::<Secret>()
        .build(reconciler_fn(|_req: Request, _ctx: Context<Secret>| async {
            Ok::<_, kube::Error>(Action::Done)
        }))
        .unwrap();
    // Added through the handle once the Manager runs.
    let late = manager
        .controller("serviceaccounts")
        .sharded(shard("sas"))
        .for_resource::<ServiceAccount>()
        .build(reconciler_fn(|_req: Request, _ctx: Context<ServiceAccount>| async {
            Ok::<_, kube::Error>(Action::Done)
        }))
        .unwrap();
    manager.add(sharded);
    manager.add(plain);
    let handle = manager.handle();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));

    // The caches synced; the shard has not joined: its check fails, and fails `/readyz`.
    eventually(WAIT, "caches synced", || async move {
        http_get(probes, "/readyz/informer-sync").await.0 == 200
    })
    .await;
    let not_ready = |code: u16, body: &str| code == 500 && body.starts_with("internal server error: ");
    let (code, body) = http_get(probes, "/readyz/shard-cms").await;
    assert!(not_ready(code, &body), "{code} {body}");
    assert!(body.contains("does not hold its shard lease"), "{body}");
    assert_eq!(
        http_get(probes, "/readyz").await,
        (
            500,
            "[+]informer-sync ok\n[+]shutdown ok\n[-]shard-cms failed: reason withheld\nreadyz check failed\n".into()
        )
    );
    assert_eq!(http_get(probes, "/readyz?exclude=shard-cms").await, (200, "ok".into()));

    // The other process releases the Lease and the sharder fences it (as it does before moving a
    // gone shard's objects): the shard takes it, but is not ready until the fence is lifted.
    loop {
        let mut lease = leases.get(&lease_name).await.unwrap();
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(FENCE_ANNOTATION.to_owned(), jiff::Timestamp::now().to_string());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        match leases.replace(&lease_name, &PostParams::default(), &lease).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => panic!("releasing and fencing the lease: {e}"),
        }
    }
    eventually(WAIT, "the shard takes its fenced Lease", || {
        let leases = leases.clone();
        let lease_name = lease_name.clone();
        async move {
            let lease = leases.get(&lease_name).await.unwrap();
            let holder = holder(&lease);
            !holder.is_empty() && holder != OTHER
        }
    })
    .await;
    let lease = leases.get(&lease_name).await.unwrap();
    assert!(holder(&lease).starts_with("shard-0"), "{}", holder(&lease));
    assert!(
        lease
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(FENCE_ANNOTATION)),
        "still fenced"
    );
    let (code, body) = http_get(probes, "/readyz/shard-cms").await;
    assert!(not_ready(code, &body), "held but fenced: {code} {body}");
    assert_eq!(http_get(probes, "/readyz").await.0, 500);

    // The sharder lifts the fence: the shard joins and is ready, and so is the Manager.
    let lift = serde_json::json!({"metadata": {"annotations": {FENCE_ANNOTATION: null}}});
    leases
        .patch(&lease_name, &PatchParams::default(), &Patch::Merge(&lift))
        .await
        .unwrap();
    eventually(WAIT, "/readyz/shard-cms 200", || async move {
        http_get(probes, "/readyz/shard-cms").await == (200, "ok".into())
    })
    .await;
    assert!(config.readiness.check().is_ok());
    assert_eq!(http_get(probes, "/readyz").await, (200, "ok".into()));
    // Only the sharded controller brought a check.
    assert_eq!(
        http_get(probes, "/readyz?verbose").await,
        (
            200,
            "[+]informer-sync ok\n[+]shutdown ok\n[+]shard-cms ok\nreadyz check passed\n".into()
        )
    );

    // A sharded controller added while the Manager runs brings its check too; its Lease is free,
    // so it joins at once.
    handle.add(late).unwrap();
    eventually(WAIT, "/readyz/shard-sas 200", || async move {
        http_get(probes, "/readyz/shard-sas").await == (200, "ok".into())
    })
    .await;
    assert_eq!(
        http_get(probes, "/readyz?verbose").await,
        (
            200,
            "[+]informer-sync ok\n[+]shutdown ok\n[+]shard-cms ok\n[+]shard-sas ok\nreadyz check passed\n".into()
        )
    );

    shutdown.cancel();
    run.await.unwrap().unwrap();
    // The shard left the ring: its readiness fails again.
    assert!(config.readiness.check().is_err());
    env.shutdown().await;
}
