//! The Manager's `/healthz` under leader election (controller-runtime's `leaderElection`
//! check, client-go's `HealthzAdaptor`), over envtest with real time: a leader wedged after its
//! renewals stopped turns `/healthz` 500 once its last renewal is `renew_deadline` plus the
//! tolerance old, so the kubelet restarts it.
//!
//! The wedge: a runnable sits in a blocking call (where neither cancellation nor an abort
//! reaches it) and the Lease's writes fail (envtest faults), so the leader loses its term and
//! its shutdown waits for the runnable forever: the Lease still names this replica (its release comes after the
//! runnables), nothing renews it, and the probe server still answers.

mod common;

use std::time::Duration;

use common::{eventually, http_get, until_leading};
use controller::{LeaderElectionConfig, Manager, runnable_fn};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases/wedged";
const WAIT: Duration = Duration::from_secs(20);
const RENEW_DEADLINE: Duration = Duration::from_millis(1500);
const TOLERANCE: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wedged_leader_fails_healthz_after_the_renew_deadline_and_tolerance() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let config = LeaderElectionConfig::new("default", "wedged", "leader")
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(RENEW_DEADLINE)
        .retry_period(Duration::from_millis(300));
    let mut manager = Manager::builder(env.client())
        .handle_signals(false)
        .no_metrics_server()
        .health_probe_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .leader_election(config)
        .leader_election_health_tolerance(TOLERANCE)
        .build()
        .unwrap();
    // Stuck in a blocking call from the start, where neither its token nor an abort reaches
    // it: the Manager's shutdown waits for it and never reaches the Lease's release.
    let (unblock, blocked) = std::sync::mpsc::channel::<()>();
    let (entered, in_call) = tokio::sync::oneshot::channel::<()>();
    manager.add(runnable_fn(
        "stuck",
        true,
        move |_shutdown: CancellationToken| async move {
            tokio::task::block_in_place(|| {
                let _ = entered.send(());
                let _ = blocked.recv();
            });
            Ok(())
        },
    ));
    let probes = manager.health_probe_addr().unwrap();
    let status = manager.status();
    let run = tokio::spawn(manager.run(CancellationToken::new()));
    until_leading(WAIT, &status).await;
    tokio::time::timeout(WAIT, in_call)
        .await
        .expect("the runnable started")
        .unwrap();
    assert_eq!(
        http_get(probes, "/healthz?verbose").await,
        (200, "[+]leaderElection ok\nhealthz check passed\n".into())
    );

    // Every Lease write fails from now on: no renewal succeeds after this instant.
    env.faults().fail_next(LEASE_PATH, 500, envtest::MAX_FAULT_COUNT, 0);
    let faulted = Instant::now();
    eventually(WAIT, "the leader loses its term", || {
        let lost = !status.is_leader();
        async move { lost }
    })
    .await;
    eventually(WAIT, "/healthz fails", || async move {
        http_get(probes, "/healthz").await.0 == 500
    })
    .await;
    let failed = faulted.elapsed();
    // The last renewal was sent before the faults began, at most one renew interval (the
    // retry period and an attempt) before: the check cannot fail much sooner than this.
    assert!(
        failed >= RENEW_DEADLINE + TOLERANCE - Duration::from_secs(1),
        "failed after {failed:?}"
    );
    assert!(!run.is_finished(), "the manager is wedged, not stopped");
    let (code, body) = http_get(probes, "/healthz").await;
    assert_eq!(
        (code, body.as_str()),
        (500, "[-]leaderElection failed: reason withheld\nhealthz check failed\n")
    );
    let (code, body) = http_get(probes, "/healthz/leaderElection").await;
    assert_eq!(code, 500);
    assert!(
        body.contains("failed election to renew leadership on lease default/wedged"),
        "{body}"
    );

    // Unwedged, the manager finishes its shutdown and reports the lost lease.
    unblock.send(()).unwrap();
    env.faults().clear();
    let result = tokio::time::timeout(WAIT, run)
        .await
        .expect("the manager stopped")
        .unwrap();
    let error = result.expect_err("a lost lease fails the manager");
    assert!(error.to_string().contains("wedged"), "{error}");
    env.shutdown().await;
}
