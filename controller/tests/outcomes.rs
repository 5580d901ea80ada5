//! Reconcile outcomes over envtest: terminal errors, the error policy, an error with a delay,
//! the reconcile timeout (the Manager's default and a controller's own), and panic recovery on
//! and off. Each test has a control that shows the window it waits in is long enough for the
//! behaviour it rules out.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Calls, RecordingLimiter, create_configmaps, envtest_with_factory, eventually, gather, sample};
use controller::outcome::find_in_chain;
use controller::{
    Action, BoxError, Context, Controller, ControllerError, ObjectKey, ReconcilePanic, ReconcileTimeout, Request,
    RequeueAfterError, reconciler_fn, terminal,
};
use k8s_openapi::api::core::v1::ConfigMap;
use tokio_util::sync::CancellationToken;
use workqueue::ItemExponentialFailureRateLimiter;

const WAIT: Duration = Duration::from_secs(20);

/// Per item: 5 ms doubling, as client-go's.
fn recording_limiter() -> RecordingLimiter<ItemExponentialFailureRateLimiter<ObjectKey>> {
    RecordingLimiter::new(ItemExponentialFailureRateLimiter::new(
        Duration::from_millis(5),
        Duration::from_secs(1000),
    ))
}

fn counter(registry: &prometheus::Registry, family: &str, controller: &str) -> f64 {
    sample(&gather(registry), &format!(r#"{family}{{controller="{controller}"}}"#))
}

fn result(registry: &prometheus::Registry, controller: &str, result: &str) -> f64 {
    let series = format!(r#"controller_runtime_reconcile_total{{controller="{controller}",result="{result}"}}"#);
    sample(&gather(registry), &series)
}

/// An error of the reconciler's own that wraps another: terminal and delayed errors are found
/// through it.
#[derive(Debug, thiserror::Error)]
#[error("reconciling {0}")]
struct Wrapped(String, #[source] BoxError);

#[tokio::test]
async fn a_terminal_error_is_logged_counted_and_forgotten_and_not_retried() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let calls = Calls::default();
    let reconciler = {
        let calls = calls.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let n = calls.record(&req.name);
            async move {
                match req.name.as_str() {
                    // Terminal, found through the reconciler's own wrapper.
                    "final" => Err(Wrapped(req.name.clone(), terminal("spec is invalid").into())),
                    // The control: a plain error is retried within the window the test waits.
                    "plain" if n <= 2 => Err(Wrapped(req.name.clone(), "transient".into())),
                    _ => Ok(Action::Done),
                }
            }
        })
    };
    let limiter = recording_limiter();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("terminal", &factory)
            .metrics(controller::Metrics::new(&registry).unwrap())
            .for_resource::<ConfigMap>()
            .rate_limiter(limiter.clone())
            .run(reconciler, shutdown.clone()),
    );
    create_configmaps(&client, &["final", "plain"]).await;
    eventually(WAIT, "plain retried twice and done", || {
        let n = calls.times("plain").len();
        async move { n >= 3 }
    })
    .await;
    // A retry of "final" would have come after 5 ms, as plain's did; wait a hundred times that.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(calls.times("final").len(), 1, "a terminal error was retried");
    assert_eq!(limiter.of("final"), [None], "forgotten, never rate-limited");
    assert_eq!(
        counter(
            &registry,
            "controller_runtime_terminal_reconcile_errors_total",
            "terminal"
        ),
        1.0
    );
    // Counted as an error too (controller-runtime counts both).
    assert_eq!(
        counter(&registry, "controller_runtime_reconcile_errors_total", "terminal"),
        3.0
    );
    assert_eq!(result(&registry, "terminal", "error"), 3.0);
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn the_error_policy_sees_the_error_and_its_action_is_followed() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let calls = Calls::default();
    let reconciler = {
        let calls = calls.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let n = calls.record(&req.name);
            async move {
                match n {
                    1 | 2 => Err(format!("boom {} #{n}", req.name)),
                    _ => Ok(Action::Done),
                }
            }
        })
    };
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let limiter = recording_limiter();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let seen = seen.clone();
        Controller::new("policy", &factory)
            .for_resource::<ConfigMap>()
            .rate_limiter(limiter.clone())
            .error_policy(move |err, req, ctx| {
                assert_eq!(ctx.controller_name(), "policy");
                seen.lock().unwrap().push((req.name.clone(), err.to_string()));
                match req.name.as_str() {
                    "drop" => Action::Done,
                    "later" => Action::RequeueAfter(Duration::from_millis(400)),
                    _ => Action::Requeue,
                }
            })
            .run(reconciler, shutdown.clone())
    });
    create_configmaps(&client, &["drop", "later", "again"]).await;
    eventually(WAIT, "later and again failed twice and succeeded", || {
        let (later, again) = (calls.times("later").len(), calls.times("again").len());
        async move { later >= 3 && again >= 3 }
    })
    .await;
    // Requeue: rate-limited, as without a policy (the control for "drop").
    assert_eq!(
        limiter.of("again"),
        [Some(Duration::from_millis(5)), Some(Duration::from_millis(10)), None]
    );
    // RequeueAfter: each retry no earlier than the delay, and no rate limiting.
    let later = calls.times("later");
    for pair in later.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(400),
            "{:?}",
            pair[1] - pair[0]
        );
    }
    assert_eq!(limiter.of("later"), [None], "only the final success's forget");
    // Done: forgotten, never retried (again's retries came within the time waited here).
    assert_eq!(calls.times("drop").len(), 1, "the policy's Done was not followed");
    assert_eq!(limiter.of("drop"), [None]);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.contains(&("drop".into(), "boom drop #1".into())), "{seen:?}");
    assert!(seen.contains(&("later".into(), "boom later #2".into())), "{seen:?}");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn an_error_with_a_delay_is_retried_after_it_and_not_before_without_the_rate_limiter() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let calls = Calls::default();
    let reconciler = {
        let calls = calls.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let n = calls.record(&req.name);
            async move {
                match n {
                    1 | 2 => Err(Wrapped(
                        req.name.clone(),
                        RequeueAfterError::new(Duration::from_millis(400), "dependency not ready").into(),
                    )),
                    _ => Ok(Action::Done),
                }
            }
        })
    };
    let limiter = recording_limiter();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("delayed", &factory)
            .metrics(controller::Metrics::new(&registry).unwrap())
            .for_resource::<ConfigMap>()
            .rate_limiter(limiter.clone())
            .run(reconciler, shutdown.clone()),
    );
    create_configmaps(&client, &["waiting"]).await;
    eventually(WAIT, "waiting retried twice and done", || {
        let n = calls.times("waiting").len();
        async move { n >= 3 }
    })
    .await;
    let waiting = calls.times("waiting");
    for pair in waiting.windows(2) {
        // The rate limiter would have retried after 5 ms, then 10 ms.
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(400),
            "retried early: {:?}",
            pair[1] - pair[0]
        );
    }
    assert_eq!(limiter.of("waiting"), [None], "the rate limiter was asked");
    assert_eq!(result(&registry, "delayed", "error"), 2.0);
    assert_eq!(result(&registry, "delayed", "success"), 1.0);
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

/// Set when the hung reconcile's future is dropped, with whether its token had fired by then.
struct DropProbe {
    token: CancellationToken,
    dropped: Arc<Mutex<Option<bool>>>,
}

impl Drop for DropProbe {
    fn drop(&mut self) {
        *self.dropped.lock().unwrap() = Some(self.token.is_cancelled());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_past_its_timeout_is_cancelled_and_the_worker_takes_the_next_key() {
    const TIMEOUT: Duration = Duration::from_millis(500);
    // One scheduling tick, generously: the worker's next `get` after the timer fired.
    const TICK: Duration = Duration::from_millis(500);
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let calls = Calls::default();
    let dropped: Arc<Mutex<Option<bool>>> = Arc::default();
    let policy_saw_timeout = Arc::new(AtomicBool::new(false));
    let reconciler = {
        let (calls, dropped) = (calls.clone(), dropped.clone());
        reconciler_fn(move |req: Request, ctx: Context<ConfigMap>| {
            let n = calls.record(&req.name);
            let dropped = dropped.clone();
            async move {
                if req.name == "hang" && n == 1 {
                    let _probe = DropProbe {
                        token: ctx.token().clone(),
                        dropped,
                    };
                    // Hangs, ignoring its token: only dropping the future frees the worker.
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(Action::Done)
            }
        })
    };
    let built = Controller::new("timeouts", &factory)
        .metrics(controller::Metrics::new(&registry).unwrap())
        .for_resource::<ConfigMap>()
        .workers(1)
        .reconcile_timeout(TIMEOUT)
        .error_policy({
            let saw = policy_saw_timeout.clone();
            move |err, _req, _ctx| {
                if find_in_chain::<ReconcileTimeout>(err).is_some_and(|t| t.timeout == TIMEOUT) {
                    saw.store(true, Ordering::SeqCst);
                }
                Action::Requeue
            }
        })
        .build(reconciler)
        .unwrap();
    let queue = built.queue().clone();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let run = tokio::spawn(built.run(shutdown.clone()));
    create_configmaps(&client, &["hang"]).await;
    eventually(WAIT, "hang started", || {
        let n = calls.times("hang").len();
        async move { n == 1 }
    })
    .await;
    let hang_started = calls.times("hang")[0];
    create_configmaps(&client, &["next"]).await;
    // "next" waits in the queue behind the only worker; the test means something only if it
    // was queued before the timeout.
    eventually(WAIT, "next queued", || {
        let n = queue.len();
        async move { n == 1 }
    })
    .await;
    assert!(
        hang_started.elapsed() < TIMEOUT,
        "next was queued only after the timeout: inconclusive"
    );
    eventually(TIMEOUT + TICK + Duration::from_millis(100), "next reconciled", || {
        let n = calls.times("next").len();
        async move { n == 1 }
    })
    .await;
    let next_started = calls.times("next")[0];
    let held = next_started - hang_started;
    assert!(held >= TIMEOUT, "the single worker took next while hang ran: {held:?}");
    assert!(held <= TIMEOUT + TICK, "the worker was held past the timeout: {held:?}");
    assert_eq!(
        *dropped.lock().unwrap(),
        Some(true),
        "the hung future was dropped, its token cancelled first"
    );
    // The error path: the policy saw the timeout, and its Requeue retried "hang".
    eventually(WAIT, "hang retried", || {
        let n = calls.times("hang").len();
        async move { n == 2 }
    })
    .await;
    assert!(policy_saw_timeout.load(Ordering::SeqCst));
    assert_eq!(
        counter(&registry, "controller_runtime_reconcile_timeouts_total", "timeouts"),
        1.0
    );
    assert_eq!(result(&registry, "timeouts", "error"), 1.0);
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

/// A reconciler that never finishes and ignores its token: only a timeout frees its worker.
fn hanging() -> impl controller::Reconciler<ConfigMap> {
    reconciler_fn(|_req: Request, _ctx: Context<ConfigMap>| async {
        std::future::pending::<()>().await;
        Ok::<_, BoxError>(Action::Done)
    })
}

/// The timeouts of the [`ReconcileTimeout`]s one controller's error policy saw.
type SeenTimeouts = Arc<Mutex<Vec<Duration>>>;

/// An error policy that records the timeout of every [`ReconcileTimeout`] it sees, and does
/// not retry.
fn recording_timeouts(
    seen: &SeenTimeouts,
) -> impl Fn(&(dyn std::error::Error + Send + Sync + 'static), &Request, &Context<ConfigMap>) -> Action + Send + Sync + 'static
{
    let seen = seen.clone();
    move |err, _req, _ctx| {
        if let Some(timeout) = find_in_chain::<ReconcileTimeout>(err) {
            seen.lock().unwrap().push(timeout.timeout);
        }
        Action::Done
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_managers_reconcile_timeout_applies_to_its_controllers_unless_they_set_their_own() {
    const MANAGER_TIMEOUT: Duration = Duration::from_millis(300);
    // Longer than the manager's: a manager default that overrode it, or the shorter of the two
    // winning, would show up as MANAGER_TIMEOUT.
    const OWN_TIMEOUT: Duration = Duration::from_millis(600);
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let mut manager = controller::Manager::builder(client.clone())
        .factory(factory)
        .registry(registry.clone())
        .no_http_servers()
        .reconcile_timeout(MANAGER_TIMEOUT)
        .build()
        .unwrap();
    let (inherited, own) = (SeenTimeouts::default(), SeenTimeouts::default());
    let inheriting = manager
        .controller("inherits")
        .for_resource::<ConfigMap>()
        .error_policy(recording_timeouts(&inherited))
        .build(hanging())
        .unwrap();
    let overriding = manager
        .controller("overrides")
        .for_resource::<ConfigMap>()
        .reconcile_timeout(OWN_TIMEOUT)
        .error_policy(recording_timeouts(&own))
        .build(hanging())
        .unwrap();
    manager.add(inheriting);
    manager.add(overriding);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));
    create_configmaps(&client, &["hang"]).await;
    // Without a timeout, "hang" would hold its controller's only worker for good and the
    // policy would see nothing.
    for (seen, what) in [(&inherited, "inherits timed out"), (&own, "overrides timed out")] {
        eventually(WAIT, what, || {
            let done = !seen.lock().unwrap().is_empty();
            async move { done }
        })
        .await;
    }
    assert_eq!(*inherited.lock().unwrap(), [MANAGER_TIMEOUT], "the manager's default");
    assert_eq!(*own.lock().unwrap(), [OWN_TIMEOUT], "the controller's own");
    for name in ["inherits", "overrides"] {
        assert_eq!(
            counter(&registry, "controller_runtime_reconcile_timeouts_total", name),
            1.0,
            "{name}"
        );
    }
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_panic_reaches_the_error_path_with_its_message() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let calls = Calls::default();
    let reconciler = {
        let calls = calls.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let n = calls.record(&req.name);
            async move {
                if n == 1 {
                    panic!("kaboom in {}", req.name);
                }
                Ok::<_, BoxError>(Action::Done)
            }
        })
    };
    // The error's text, and the panic message found in its chain.
    type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;
    let seen: Seen = Arc::default();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let seen = seen.clone();
        Controller::new("recovered", &factory)
            .metrics(controller::Metrics::new(&registry).unwrap())
            .for_resource::<ConfigMap>()
            .error_policy(move |err, _req, _ctx| {
                let message = find_in_chain::<ReconcilePanic>(err).map(|p| p.message.clone());
                seen.lock().unwrap().push((err.to_string(), message));
                Action::Requeue
            })
            .run(reconciler, shutdown.clone())
    });
    create_configmaps(&client, &["bomb"]).await;
    eventually(WAIT, "bomb retried after its panic", || {
        let n = calls.times("bomb").len();
        async move { n >= 2 }
    })
    .await;
    assert_eq!(
        seen.lock().unwrap().clone(),
        [(
            "panic: kaboom in bomb [recovered]".to_owned(),
            Some("kaboom in bomb".to_owned())
        )]
    );
    assert_eq!(
        counter(&registry, "controller_runtime_reconcile_panics_total", "recovered"),
        1.0
    );
    assert_eq!(result(&registry, "recovered", "error"), 1.0);
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_panic_recovery_off_a_panic_ends_the_run_with_an_error() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let calls = Calls::default();
    let reconciler = {
        let calls = calls.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            calls.record(&req.name);
            async move {
                if req.name == "bomb" {
                    panic!("kaboom unrecovered");
                }
                Ok::<_, BoxError>(Action::Done)
            }
        })
    };
    // Never cancelled: only the panic may end the run.
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("unrecovered", &factory)
            .metrics(controller::Metrics::new(&registry).unwrap())
            .for_resource::<ConfigMap>()
            .recover_panic(false)
            .run(reconciler, shutdown.clone()),
    );
    // The control: a key before the bomb is reconciled, so the controller was running.
    create_configmaps(&client, &["fine"]).await;
    eventually(WAIT, "fine reconciled", || {
        let n = calls.times("fine").len();
        async move { n == 1 }
    })
    .await;
    assert!(!run.is_finished());
    create_configmaps(&client, &["bomb"]).await;
    let ended = tokio::time::timeout(WAIT, run)
        .await
        .expect("the run did not end after an unrecovered panic")
        .expect("the run's task itself did not panic");
    match ended {
        Err(ControllerError::ReconcilePanicked { controller, message }) => {
            assert_eq!(controller, "unrecovered");
            assert_eq!(message, "kaboom unrecovered");
        }
        other => panic!("expected ReconcilePanicked, got {other:?}"),
    }
    assert_eq!(calls.times("bomb").len(), 1, "not retried");
    assert_eq!(
        counter(&registry, "controller_runtime_reconcile_panics_total", "unrecovered"),
        1.0
    );
    assert_eq!(
        counter(&registry, "controller_runtime_active_workers", "unrecovered"),
        0.0
    );
    shutdown.cancel();
    env.shutdown().await;
}
