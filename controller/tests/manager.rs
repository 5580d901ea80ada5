//! The Manager over envtest: `/metrics` has the reconcile and work queue series with the
//! right counts, `/readyz` turns from 500 to 200 after sync (on the probe port), and with leader election on one
//! Lease exactly one of several managers reconciles; takeovers happen within client-go's
//! bounds, and the Lease never names a new holder before the old one released or expired.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{configmap, create_configmaps, eventually, http_get, sample, until_leading};
use controller::{Action, Context, LeaderElectionConfig, Manager, ManagerStatus, Request, reconciler_fn};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

#[tokio::test]
async fn metrics_have_reconcile_and_workqueue_series_and_readyz_flips_after_sync() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let mut manager = Manager::builder(client.clone())
        .metrics_addr(local())
        .health_probe_addr(local())
        .handle_signals(false)
        .build()
        .unwrap();
    let addr = manager.metrics_addr().unwrap();
    let probes = manager.health_probe_addr().unwrap();
    assert_ne!(addr, probes, "metrics and probes on separate ports");
    let status = manager.status();
    let outcomes: Arc<Mutex<HashMap<&'static str, usize>>> = Arc::default();
    let failed_once = Arc::new(AtomicBool::new(false));
    let reconciler = {
        let (outcomes, failed_once) = (outcomes.clone(), failed_once.clone());
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let (outcomes, failed_once) = (outcomes.clone(), failed_once.clone());
            async move {
                if req.name == "bad" && !failed_once.swap(true, Ordering::SeqCst) {
                    *outcomes.lock().unwrap().entry("error").or_default() += 1;
                    return Err("first attempt fails");
                }
                *outcomes.lock().unwrap().entry("success").or_default() += 1;
                Ok(Action::Done)
            }
        })
    };
    let built = manager
        .controller("cms")
        .for_resource::<ConfigMap>()
        .workers(2)
        .build(reconciler)
        .unwrap();
    manager.add(built);
    // The first lists fail, so the caches sync only after the reflector's backoff.
    env.faults().fail_next("/api/v1/configmaps", 500, 2, 0);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));

    let (code, body) = http_get(probes, "/readyz").await;
    assert_eq!(
        (code, body.as_str()),
        (
            500,
            "[-]informer-sync failed: reason withheld\n[+]shutdown ok\nreadyz check failed\n"
        )
    );
    assert_eq!(
        http_get(probes, "/readyz/informer-sync").await,
        (500, "internal server error: caches not synced\n".into())
    );
    assert!(!status.is_ready());
    assert_eq!(http_get(probes, "/healthz").await, (200, "ok".into()));
    assert_eq!(
        http_get(probes, "/healthz?verbose").await,
        (200, "[+]ping ok\nhealthz check passed\n".into())
    );
    eventually(WAIT, "readyz 200", || async move {
        http_get(probes, "/readyz").await == (200, "ok".into())
    })
    .await;
    // The probes are not on the metrics port, nor /metrics on the probes'.
    assert_eq!(http_get(addr, "/readyz").await.0, 404);
    assert_eq!(http_get(probes, "/metrics").await.0, 404);
    assert!(status.is_ready() && status.is_leader());

    create_configmaps(&client, &["a", "b", "bad"]).await;
    eventually(WAIT, "three successes and one error", || {
        let o = outcomes.lock().unwrap().clone();
        async move { o.get("success") == Some(&3) && o.get("error") == Some(&1) }
    })
    .await;
    let series = |name: &str| format!("{name}{{controller=\"cms\"}}");
    eventually(WAIT, "scraped counts", || async move {
        let (code, text) = http_get(addr, "/metrics").await;
        code == 200
            && sample(
                &text,
                r#"controller_runtime_reconcile_total{controller="cms",result="success"}"#,
            ) == 3.0
            && sample(
                &text,
                r#"controller_runtime_reconcile_total{controller="cms",result="error"}"#,
            ) == 1.0
            && sample(&text, r#"controller_runtime_active_workers{controller="cms"}"#) == 0.0
    })
    .await;
    let (_, text) = http_get(addr, "/metrics").await;
    assert_eq!(sample(&text, &series("controller_runtime_reconcile_errors_total")), 1.0);
    assert_eq!(sample(&text, &series("controller_runtime_reconcile_panics_total")), 0.0);
    assert_eq!(
        sample(&text, &series("controller_runtime_reconcile_time_seconds_count")),
        4.0
    );
    assert_eq!(
        sample(&text, &series("controller_runtime_max_concurrent_reconciles")),
        2.0
    );
    // Three creates and one rate-limited retry reached the queue; the retry is also counted.
    assert_eq!(sample(&text, r#"workqueue_adds_total{name="cms"}"#), 4.0, "{text}");
    assert_eq!(sample(&text, r#"workqueue_retries_total{name="cms"}"#), 1.0);
    assert_eq!(sample(&text, r#"workqueue_depth{name="cms",priority="0"}"#), 0.0);
    assert_eq!(
        sample(&text, r#"workqueue_work_duration_seconds_count{name="cms"}"#),
        4.0
    );
    // Informer and listener series, read from the factory at scrape time.
    assert_eq!(
        sample(&text, r#"kinformer_informer_synced{informer="v1/ConfigMap"}"#),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"kinformer_informer_cached_objects{informer="v1/ConfigMap"}"#),
        3.0
    );
    assert_eq!(
        sample(&text, r#"kinformer_reflector_errors_total{informer="v1/ConfigMap"}"#),
        2.0,
        "the two failed lists"
    );
    assert_eq!(
        sample(&text, r#"kinformer_reflector_lists_total{informer="v1/ConfigMap"}"#),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            r#"kinformer_informer_listener_pending{handler="cms",informer="v1/ConfigMap"}"#
        ),
        0.0
    );
    assert_eq!(
        sample(
            &text,
            r#"kinformer_informer_listener_delivered_total{handler="cms",informer="v1/ConfigMap"}"#
        ),
        3.0,
        "three adds handed to the controller's handler"
    );

    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

/// A manager with leader election on `default/kinformer-test` and a ConfigMap controller that
/// counts its reconciles.
fn elected_manager(
    client: kube::Client,
    identity: &str,
    release_on_cancel: bool,
    reconciles: Arc<Mutex<Vec<Instant>>>,
) -> Manager {
    let config = LeaderElectionConfig::new("default", "kinformer-test", identity)
        .lease_duration(Duration::from_secs(2))
        .renew_deadline(Duration::from_millis(1500))
        .retry_period(Duration::from_millis(300))
        .release_on_cancel(release_on_cancel);
    let mut manager = Manager::builder(client)
        .metrics_addr(local())
        .health_probe_addr(local())
        .handle_signals(false)
        .leader_election(config)
        .build()
        .unwrap();
    let reconciler = reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
        reconciles.lock().unwrap().push(Instant::now());
        async move {
            // "slow" holds its worker: a lost lease must abort it.
            if req.name == "slow" {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Ok::<_, std::convert::Infallible>(Action::Done)
        }
    });
    let built = manager
        .controller(format!("cms-{identity}"))
        .for_resource::<ConfigMap>()
        .build(reconciler)
        .unwrap();
    manager.add(built);
    manager
}

/// One Lease version as a watch delivered it.
#[derive(Debug, Clone)]
struct LeaseVersion {
    holder: String,
    transitions: i32,
    acquire: Option<jiff::Timestamp>,
    renew: Option<jiff::Timestamp>,
    duration_seconds: i32,
}

#[tokio::test]
async fn one_leader_among_managers_and_takeovers_within_client_go_bounds() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");

    // Every version of the Lease, from a watch started before any manager.
    let versions: Arc<Mutex<Vec<LeaseVersion>>> = Arc::default();
    let watch_stop = CancellationToken::new();
    let watcher = {
        let (leases, versions, stop) = (leases.clone(), versions.clone(), watch_stop.clone());
        tokio::spawn(async move {
            let mut stream = leases
                .watch(&WatchParams::default().fields("metadata.name=kinformer-test"), "0")
                .await
                .unwrap()
                .boxed();
            loop {
                let event = tokio::select! {
                    () = stop.cancelled() => return,
                    event = stream.try_next() => event.unwrap(),
                };
                let Some(WatchEvent::Added(lease) | WatchEvent::Modified(lease)) = event else {
                    continue;
                };
                let spec = lease.spec.unwrap_or_default();
                versions.lock().unwrap().push(LeaseVersion {
                    holder: spec.holder_identity.unwrap_or_default(),
                    transitions: spec.lease_transitions.unwrap_or(0),
                    acquire: spec.acquire_time.map(|t| t.0),
                    renew: spec.renew_time.map(|t| t.0),
                    duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
                });
            }
        })
    };

    // Sample every manager's view of leadership: never two leaders at once.
    let statuses: Arc<Mutex<Vec<ManagerStatus>>> = Arc::default();
    let two_leaders = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (statuses, two_leaders, stop) = (statuses.clone(), two_leaders.clone(), watch_stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let leaders = statuses.lock().unwrap().iter().filter(|s| s.is_leader()).count();
                if leaders > 1 {
                    two_leaders.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let counts: Vec<Arc<Mutex<Vec<Instant>>>> = (0..3).map(|_| Arc::default()).collect();
    let n = |i: usize| counts[i].lock().unwrap().len();
    // a releases the lease on shutdown; b does not (it is "dropped").
    let a = elected_manager(client.clone(), "a", true, counts[0].clone());
    let b = elected_manager(client.clone(), "b", false, counts[1].clone());
    let c = elected_manager(client.clone(), "c", true, counts[2].clone());
    let (sa, sb, sc) = (a.status(), b.status(), c.status());
    let (addr_a, addr_b) = (a.health_probe_addr().unwrap(), b.health_probe_addr().unwrap());
    statuses.lock().unwrap().extend([sa.clone(), sb.clone(), sc.clone()]);
    let (stop_a, stop_b, stop_c) = (
        CancellationToken::new(),
        CancellationToken::new(),
        CancellationToken::new(),
    );
    let run_a = tokio::spawn(a.run(stop_a.clone()));
    eventually(WAIT, "a leads", || {
        let ok = sa.is_leader();
        async move { ok }
    })
    .await;
    let run_b = tokio::spawn(b.run(stop_b.clone()));
    eventually(WAIT, "b synced, standing by", || {
        let ok = sb.is_ready();
        async move { ok }
    })
    .await;
    assert!(!sb.is_leader());
    // A standby is ready once it has read the lease (it can reach the API server).
    eventually(WAIT, "b observed a as the leader", || {
        let ok = sb.leader().as_deref() == Some("a");
        async move { ok }
    })
    .await;
    let verbose = "[+]informer-sync ok\n[+]shutdown ok\n[+]leaderElection ok\nreadyz check passed\n";
    assert_eq!(http_get(addr_a, "/readyz?verbose").await, (200, verbose.into()));
    assert_eq!(http_get(addr_b, "/readyz?verbose").await, (200, verbose.into()));
    assert_eq!(
        http_get(addr_a, "/healthz?verbose").await,
        (200, "[+]leaderElection ok\nhealthz check passed\n".into())
    );

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &configmap("default", "x", "1"))
        .await
        .unwrap();
    eventually(WAIT, "the leader reconciles", || {
        let ok = n(0) >= 1;
        async move { ok }
    })
    .await;
    assert_eq!(n(1), 0, "the standby must not reconcile");

    // a shuts down and releases: b takes over within about one retry period (jittered).
    stop_a.cancel();
    run_a.await.unwrap().unwrap();
    let released = Instant::now();
    assert!(counts[0].lock().unwrap().iter().all(|t| *t < released));
    eventually(WAIT, "b leads after a released", || {
        let ok = sb.is_leader();
        async move { ok }
    })
    .await;
    let takeover = released.elapsed();
    assert!(
        takeover < Duration::from_millis(300 * 12 / 10 + 500),
        "took {takeover:?}"
    );
    // b's warm cache and queue: it reconciles at once.
    eventually(WAIT, "b reconciles after taking over", || {
        let ok = n(1) >= 1;
        async move { ok }
    })
    .await;
    // b reconciled only after a had stopped: the controllers never ran side by side.
    assert!(counts[1].lock().unwrap().iter().all(|t| *t > released));

    // c stands by; b stops without releasing: c leads once the lease expired.
    let run_c = tokio::spawn(c.run(stop_c.clone()));
    eventually(WAIT, "c synced", || {
        let ok = sc.is_ready();
        async move { ok }
    })
    .await;
    assert!(!sc.is_leader());
    stop_b.cancel();
    run_b.await.unwrap().unwrap();
    let dropped = Instant::now();
    assert_eq!(n(2), 0, "c reconciled while b led");
    eventually(WAIT, "c leads after b's lease expired", || {
        let ok = sc.is_leader();
        async move { ok }
    })
    .await;
    let takeover = dropped.elapsed();
    // client-go: lease duration, plus up to one jittered retry period, plus a margin.
    assert!(takeover < Duration::from_millis(2000 + 360 + 700), "took {takeover:?}");

    stop_c.cancel();
    run_c.await.unwrap().unwrap();
    watch_stop.cancel();
    let _ = watcher.await;
    let _ = sampler.await;
    assert_eq!(two_leaders.load(Ordering::SeqCst), 0, "two managers led at once");

    // Every change of holder in the Lease's history happened after the old holder released
    // (empty holder) or after its last renewal expired.
    let versions = versions.lock().unwrap().clone();
    let holders: Vec<&str> = versions.iter().map(|v| v.holder.as_str()).collect();
    assert!(
        holders.contains(&"a") && holders.contains(&"b") && holders.contains(&"c"),
        "{holders:?}"
    );
    let mut last_of_holder: Option<&LeaseVersion> = None;
    for version in &versions {
        if let Some(previous) = last_of_holder
            && !version.holder.is_empty()
            && version.holder != previous.holder
        {
            if !previous.holder.is_empty() {
                let renewed = previous.renew.expect("a held lease has a renewTime");
                let acquired = version.acquire.expect("a new holder sets acquireTime");
                let expiry = renewed + jiff::SignedDuration::from_secs(previous.duration_seconds.into());
                assert!(
                    acquired >= expiry,
                    "{} took over from {} at {acquired} before its lease expired at {expiry}",
                    version.holder,
                    previous.holder
                );
            }
            assert_eq!(version.transitions, previous.transitions + 1, "{versions:?}");
        }
        last_of_holder = Some(version);
    }
    env.shutdown().await;
}

#[tokio::test]
async fn losing_the_lease_stops_the_controllers_at_once_and_fails_the_manager() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let reconciles: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let manager = elected_manager(client.clone(), "loser", true, reconciles.clone());
    let status = manager.status();
    let metrics = manager.metrics().clone();
    let run = tokio::spawn(manager.run(CancellationToken::new()));
    until_leading(WAIT, &status).await;
    // A reconcile in flight (it would take 30 s) when the lease goes.
    create_configmaps(&client, &["slow"]).await;
    eventually(WAIT, "slow reconcile started", || {
        let ok = !reconciles.lock().unwrap().is_empty();
        async move { ok }
    })
    .await;
    // Keys queued behind it: a graceful shutdown would reconcile them, a lost lease must not.
    create_configmaps(&client, &["queued-0", "queued-1", "queued-2"]).await;
    eventually(WAIT, "keys queued", || {
        let depth = sample(&metrics.encode(), r#"workqueue_depth{name="cms-loser",priority="0"}"#);
        async move { depth == 3.0 }
    })
    .await;
    // Every lease request fails from now on: renewals cannot succeed.
    env.faults().fail_next("/apis/coordination.k8s.io", 500, 100_000, 0);
    let cut = Instant::now();
    let result = tokio::time::timeout(WAIT, run)
        .await
        .expect("manager returned")
        .unwrap();
    let took = cut.elapsed();
    assert!(
        matches!(result, Err(controller::ManagerError::LeadershipLost(_))),
        "{result:?}"
    );
    // Renew deadline 1.5 s, plus one jittered retry period, plus a margin.
    assert!(took < Duration::from_millis(1500 + 360 + 700), "took {took:?}");
    assert!(!status.is_leader());
    // `run` returned: the in-flight reconcile was aborted, not waited for (30 s), and no
    // reconcile started after the lease was lost, although keys were queued.
    assert!(reconciles.lock().unwrap().iter().all(|t| *t < cut));
    assert_eq!(reconciles.lock().unwrap().len(), 1, "only the slow key was reconciled");
    env.faults().clear();
    env.shutdown().await;
}

#[tokio::test]
async fn caches_that_never_sync_fail_the_manager_naming_them() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let mut manager = Manager::builder(env.client())
        .no_http_servers()
        .handle_signals(false)
        .cache_sync_timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let typo = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("exmaple.com", "v1", "Widget"));
    let reconciler = reconciler_fn(|_req: Request, _ctx: Context<kube::api::DynamicObject>| async {
        Ok::<_, std::convert::Infallible>(Action::Done)
    });
    let built = manager
        .controller("typo")
        .for_dynamic(&typo, true)
        .build(reconciler)
        .unwrap();
    manager.add(built);
    let result = manager.run(CancellationToken::new()).await;
    match result {
        Err(controller::ManagerError::CacheSyncTimeout { informers, .. }) => {
            assert_eq!(informers, ["exmaple.com/v1/Widget (dynamic)"]);
        }
        other => panic!("{other:?}"),
    }
    env.shutdown().await;
}

#[tokio::test]
async fn a_failing_runnable_stops_the_manager_with_its_error() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let mut manager = Manager::builder(env.client())
        .no_http_servers()
        .handle_signals(false)
        .build()
        .unwrap();
    let stopped_cleanly = Arc::new(AtomicBool::new(false));
    let flag = stopped_cleanly.clone();
    manager.add(controller::runnable_fn("patient", false, move |stop| async move {
        stop.cancelled().await;
        flag.store(true, Ordering::SeqCst);
        Ok(())
    }));
    manager.add(controller::runnable_fn("doomed", false, |_stop| async {
        Err("out of coffee".into())
    }));
    let result = tokio::time::timeout(WAIT, manager.run(CancellationToken::new()))
        .await
        .unwrap();
    match result {
        Err(controller::ManagerError::Runnable { name, source }) => {
            assert_eq!(
                (name.as_str(), source.to_string().as_str()),
                ("doomed", "out of coffee")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        stopped_cleanly.load(Ordering::SeqCst),
        "the other runnable was stopped gracefully"
    );
    env.shutdown().await;
}
