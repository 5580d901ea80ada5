//! The Manager owns every task it spawns (issue #26): dropping the `Manager::run` future (here:
//! aborting the task that runs it, as a killed replica's runtime would) aborts its leader
//! election task, so its lease is no longer renewed and another Manager takes over within the
//! lease duration; its informers and servers stop with it. Real time, polled deadlines, envtest.

mod common;

use std::time::Duration;

use common::until_leading;
use controller::{LeaderElectionConfig, Manager, ManagerStatus};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(1500);
const RETRY: Duration = Duration::from_millis(300);
/// Scheduling and HTTP on a busy 2-core machine (debug build).
const SLACK: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(30);

fn start(env: &envtest::Server, identity: &str) -> (ManagerStatus, JoinHandle<Result<(), controller::ManagerError>>) {
    let election = LeaderElectionConfig::new("default", "owned-tasks", identity)
        .lease_duration(LEASE)
        .renew_deadline(RENEW)
        .retry_period(RETRY);
    let manager = Manager::builder(env.client())
        .no_http_servers()
        .handle_signals(false)
        .leader_election(election)
        .build()
        .unwrap();
    let status = manager.status();
    (status, tokio::spawn(manager.run(CancellationToken::new())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_run_future_stops_the_leader_election_task() {
    let env = envtest::Server::start(envtest::Config::default())
        .await
        .expect("envtest");
    let (first, first_task) = start(&env, "first");
    until_leading(WAIT, &first).await;
    let (second, second_task) = start(&env, "second");

    // The leader's run future is dropped: nothing of it may keep renewing the lease.
    first_task.abort();
    assert!(first_task.await.unwrap_err().is_cancelled());
    let dropped = Instant::now();
    until_leading(LEASE + RETRY + SLACK, &second).await;
    let took_over = dropped.elapsed();
    let leases: Api<Lease> = Api::namespaced(env.client(), "default");
    let holder = leases.get("owned-tasks").await.unwrap().spec.unwrap().holder_identity;
    assert_eq!(holder.as_deref(), Some("second"));
    eprintln!("the second Manager leads {took_over:?} after the first's run was dropped");

    second_task.abort();
    env.shutdown().await;
}
