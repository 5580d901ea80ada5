//! The Manager's lifecycle over envtest (issue #22): runnables that need no leader election
//! start on synced caches, a zero grace period does not wait, several failures are all
//! returned, runnables added while `run` runs start under the leadership rules, the probes
//! have their own port and custom checks, and adding after shutdown is refused.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, http_get};
use controller::{
    Action, Context, LeaderElectionConfig, LeaderElector, Manager, ManagerError, Request, reconciler_fn, runnable_fn,
};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn noop_controller(manager: &Manager, name: &str) -> impl controller::Runnable {
    let reconciler = reconciler_fn(|_req: Request, _ctx: Context<ConfigMap>| async {
        Ok::<_, std::convert::Infallible>(Action::Done)
    });
    manager
        .controller(name)
        .for_resource::<ConfigMap>()
        .build(reconciler)
        .unwrap()
}

/// controller-runtime starts its `Others` group after the caches: a runnable that needs no
/// leader election finds them synced when it starts (it started before them until now).
#[tokio::test]
async fn runnables_without_leader_election_start_on_synced_caches() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let mut manager = Manager::builder(env.client()).no_http_servers().build().unwrap();
    let controller = noop_controller(&manager, "cms");
    manager.add(controller);
    let status = manager.status();
    let seen: Arc<Mutex<Option<bool>>> = Arc::default();
    let observer = {
        let (seen, status) = (seen.clone(), status.clone());
        runnable_fn("observer", false, move |stop| async move {
            *seen.lock().unwrap() = Some(status.is_ready());
            stop.cancelled().await;
            Ok(())
        })
    };
    manager.add(observer);
    // The first lists fail: the caches sync only after the reflector's backoff.
    env.faults().fail_next("/api/v1/configmaps", 500, 2, 0);
    let stop = CancellationToken::new();
    let run = tokio::spawn(manager.run(stop.clone()));
    eventually(WAIT, "the observer started", || {
        let started = seen.lock().unwrap().is_some();
        async move { started }
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), Some(true), "started before the caches synced");
    stop.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

/// A zero graceful-shutdown timeout means "do not wait" (controller-runtime returns at once),
/// and is no error, even with a runnable that ignores its token.
#[tokio::test]
async fn a_zero_grace_period_returns_at_once_without_error() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let mut manager = Manager::builder(env.client())
        .no_http_servers()
        .graceful_shutdown_timeout(Duration::ZERO)
        .build()
        .unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    manager.add(runnable_fn("deaf", false, move |_stop| async move {
        flag.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(())
    }));
    let stop = CancellationToken::new();
    let run = tokio::spawn(manager.run(stop.clone()));
    eventually(WAIT, "deaf started", || {
        let ok = started.load(Ordering::SeqCst);
        async move { ok }
    })
    .await;
    let cancelled = Instant::now();
    stop.cancel();
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("returned at once")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert!(
        cancelled.elapsed() < Duration::from_secs(2),
        "{:?}",
        cancelled.elapsed()
    );
    env.shutdown().await;
}

/// A runnable fails, and the graceful shutdown that follows runs out: both are returned.
#[tokio::test]
async fn a_failure_and_an_expired_grace_period_are_both_returned() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let mut manager = Manager::builder(env.client())
        .no_http_servers()
        .graceful_shutdown_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    manager.add(runnable_fn("stubborn", false, |_stop| async {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(())
    }));
    manager.add(runnable_fn("doomed", false, |_stop| async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Err("out of coffee".into())
    }));
    let result = tokio::time::timeout(WAIT, manager.run(CancellationToken::new()))
        .await
        .unwrap();
    let Err(ManagerError::Multiple(errors)) = &result else {
        panic!("{result:?}");
    };
    assert!(
        matches!(&errors[..], [
            ManagerError::Runnable { name, source },
            ManagerError::ShutdownTimeout { names, timeout },
        ] if name == "doomed" && source.to_string() == "out of coffee"
            && names == &["stubborn"] && *timeout == Duration::from_millis(300)),
        "{errors:?}"
    );
    let err = result.unwrap_err();
    assert_eq!(err.failures().len(), 2);
    assert!(
        err.to_string()
            .starts_with("2 failures: doomed failed: out of coffee; "),
        "{err}"
    );
    env.shutdown().await;
}

/// `ManagerHandle::add` while `run` runs: a plain runnable starts at once; one that needs
/// leader election starts only once this replica leads, and sees itself leading; after
/// shutdown, adding is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runnables_added_while_running_start_under_the_leadership_rules() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let config = |identity: &str| {
        LeaderElectionConfig::new("default", "late", identity)
            .lease_duration(Duration::from_secs(2))
            .renew_deadline(Duration::from_millis(1500))
            .retry_period(Duration::from_millis(250))
    };
    // Another replica leads first.
    let other = LeaderElector::new(env.client(), config("other")).unwrap();
    let other_stop = CancellationToken::new();
    assert!(other.acquire(&other_stop).await);
    let other_renew = tokio::spawn({
        let (other, stop) = (other.clone(), other_stop.clone());
        async move { other.renew(&stop).await }
    });

    let mut manager = Manager::builder(env.client())
        .no_http_servers()
        .leader_election(config("me"))
        .build()
        .unwrap();
    let controller = noop_controller(&manager, "cms");
    manager.add(controller);
    let (status, handle) = (manager.status(), manager.handle());
    let stop = CancellationToken::new();
    let run = tokio::spawn(manager.run(stop.clone()));
    eventually(WAIT, "synced and standing by", || {
        let ok = status.is_ready() && status.leader().as_deref() == Some("other");
        async move { ok }
    })
    .await;

    let plain = Arc::new(AtomicUsize::new(0));
    let leader_started: Arc<Mutex<Option<bool>>> = Arc::default();
    handle
        .add(runnable_fn("late-plain", false, {
            let plain = plain.clone();
            move |stop| async move {
                plain.fetch_add(1, Ordering::SeqCst);
                stop.cancelled().await;
                Ok(())
            }
        }))
        .unwrap();
    handle
        .add(runnable_fn("late-leader", true, {
            let (seen, status) = (leader_started.clone(), status.clone());
            move |stop| async move {
                *seen.lock().unwrap() = Some(status.is_leader());
                stop.cancelled().await;
                Ok(())
            }
        }))
        .unwrap();
    eventually(WAIT, "late-plain started", || {
        let ok = plain.load(Ordering::SeqCst) == 1;
        async move { ok }
    })
    .await;
    // The other replica leads for a while yet: the leader runnable waits.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(*leader_started.lock().unwrap(), None, "started while standing by");

    other_stop.cancel();
    other_renew.await.unwrap().unwrap(); // released
    eventually(WAIT, "late-leader started", || {
        let started = leader_started.lock().unwrap().is_some();
        async move { started }
    })
    .await;
    assert_eq!(*leader_started.lock().unwrap(), Some(true));
    assert_eq!(plain.load(Ordering::SeqCst), 1);

    stop.cancel();
    run.await.unwrap().unwrap();
    let refused = handle.add(runnable_fn("too-late", false, |_stop| async { Ok(()) }));
    assert!(
        matches!(&refused, Err(ManagerError::Stopped { name }) if name == "too-late"),
        "{refused:?}"
    );
    env.shutdown().await;
}

/// Custom checks on the probe port, reported per check as controller-runtime's `pkg/healthz`.
#[tokio::test]
async fn custom_health_and_readiness_checks_are_reported_per_check() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let mut manager = Manager::builder(env.client())
        .metrics_addr(local())
        .health_probe_addr(local())
        .build()
        .unwrap();
    let disk_full = Arc::new(AtomicBool::new(false));
    let db_down = Arc::new(AtomicBool::new(true));
    manager.add_healthz_check("disk", {
        let full = disk_full.clone();
        move || {
            if full.load(Ordering::SeqCst) {
                Err("disk full".into())
            } else {
                Ok(())
            }
        }
    });
    manager.add_readyz_check("db", {
        let down = db_down.clone();
        move || {
            if down.load(Ordering::SeqCst) {
                Err("no connection".into())
            } else {
                Ok(())
            }
        }
    });
    let (metrics, probes) = (manager.metrics_addr().unwrap(), manager.health_probe_addr().unwrap());
    assert_ne!(metrics.port(), probes.port());
    let status = manager.status();
    let stop = CancellationToken::new();
    let run = tokio::spawn(manager.run(stop.clone()));
    eventually(WAIT, "synced", || {
        let ok = status.is_ready();
        async move { ok }
    })
    .await;

    assert_eq!(http_get(probes, "/healthz").await, (200, "ok".into()));
    assert_eq!(
        http_get(probes, "/healthz?verbose").await,
        (200, "[+]disk ok\nhealthz check passed\n".into())
    );
    assert_eq!(
        http_get(probes, "/readyz").await,
        (
            500,
            "[+]informer-sync ok\n[+]shutdown ok\n[-]db failed: reason withheld\nreadyz check failed\n".into()
        )
    );
    assert_eq!(
        http_get(probes, "/readyz/db").await,
        (500, "internal server error: no connection\n".into())
    );
    assert_eq!(http_get(probes, "/readyz/informer-sync").await, (200, "ok".into()));
    assert_eq!(http_get(probes, "/readyz?exclude=db").await, (200, "ok".into()));
    assert_eq!(http_get(probes, "/readyz/absent").await.0, 404);

    db_down.store(false, Ordering::SeqCst);
    disk_full.store(true, Ordering::SeqCst);
    assert_eq!(http_get(probes, "/readyz").await, (200, "ok".into()));
    assert_eq!(
        http_get(probes, "/healthz").await,
        (500, "[-]disk failed: reason withheld\nhealthz check failed\n".into())
    );
    assert_eq!(
        http_get(probes, "/healthz/disk").await,
        (500, "internal server error: disk full\n".into())
    );
    stop.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

/// The defaults are reachable in a cluster: every interface, 8080 and 8081 (not bound here:
/// checked through the error of a port already taken).
#[tokio::test]
async fn a_port_in_use_names_the_address_the_cause_and_the_setting() {
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let metrics = Manager::builder(client.clone())
        .no_health_probe_server()
        .metrics_addr(addr)
        .build();
    let probes = Manager::builder(client)
        .no_metrics_server()
        .health_probe_addr(addr)
        .build();
    for (result, setting) in [
        (metrics, "ManagerBuilder::metrics_addr"),
        (probes, "ManagerBuilder::health_probe_addr"),
    ] {
        let Err(e @ ManagerError::Bind { .. }) = result else {
            panic!("{:?}", result.err())
        };
        let message = e.to_string();
        assert!(message.contains(&addr.to_string()), "{message}");
        assert!(message.contains(setting), "{message}");
        let ManagerError::Bind { source, .. } = &e else {
            unreachable!()
        };
        assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse, "{message}");
        assert!(message.contains(&source.to_string()), "{message}");
    }
}

#[tokio::test]
async fn default_addresses_are_every_interface_on_8080_and_8081() {
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    // Take both ports on every interface first, if free, so `build` must fail binding them.
    let held: Vec<_> = [8080, 8081]
        .into_iter()
        .map(|port| std::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port))))
        .collect();
    match Manager::builder(client.clone()).no_health_probe_server().build() {
        Err(ManagerError::Bind {
            what: "metrics", addr, ..
        }) => {
            assert_eq!(addr, SocketAddr::from(([0, 0, 0, 0], 8080)));
        }
        Ok(manager) if held[0].is_err() => drop(manager), // someone else holds it: unknown
        other => panic!("{:?}", other.err()),
    }
    match Manager::builder(client).no_metrics_server().build() {
        Err(ManagerError::Bind {
            what: "health probe",
            addr,
            ..
        }) => {
            assert_eq!(addr, SocketAddr::from(([0, 0, 0, 0], 8081)));
        }
        Ok(manager) if held[1].is_err() => drop(manager),
        other => panic!("{:?}", other.err()),
    }
}
