//! A sharded controller's membership log lines name the controller (issue #26): several
//! sharded controllers in one process each hold a shard Lease, and a line about one must say
//! which. Real envtest, one shard, the process's log captured at INFO.

use std::time::Duration;

use controller::sharding::ShardingConfig;
use controller::{Action, Context, Manager, Request, reconciler_fn};
use envtest::logs::Logs;
use k8s_openapi::api::core::v1::ConfigMap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_and_leaving_the_ring_log_the_controller() {
    let logs = Logs::default();
    logs.set_global_default(tracing::Level::INFO).unwrap();
    let env = envtest::Server::start(envtest::Config::default())
        .await
        .expect("envtest");
    let mut manager = Manager::builder(env.client())
        .no_http_servers()
        .handle_signals(false)
        .build()
        .unwrap();
    let config = ShardingConfig::new("logged", "shard-0")
        .namespace("default")
        .lease_timing(
            Duration::from_secs(2),
            Duration::from_millis(1500),
            Duration::from_millis(300),
        );
    let controller = manager
        .controller("logged-configmaps")
        .sharded(config.clone())
        .for_resource::<ConfigMap>()
        .build(reconciler_fn(|_req: Request, _ctx: Context<ConfigMap>| async {
            Ok::<_, controller::BoxError>(Action::Done)
        }))
        .unwrap();
    manager.add(controller);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while config.readiness.check().is_err() {
        assert!(Instant::now() < deadline, "the shard did not join");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();

    let text = logs.text();
    for message in ["joined the ring", "left the ring"] {
        let line = text.lines().find(|line| line.contains(message)).expect(&text);
        assert!(line.contains(" controller=logged-configmaps "), "{line}");
    }
    env.shutdown().await;
}
