//! Controllers over envtest (real HTTP, the real `kube::Client`): what is enqueued from the
//! primary, owned and watched types; deletion; retries and RequeueAfter; no concurrent
//! reconcile of one key; panics; event filters; shared watches; shutdown with reconciles in
//! flight.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    Calls, RecordingLimiter, Widget, WidgetSpec, configmap, create_configmaps, envtest_with_factory,
    envtest_with_widgets, eventually, gather, sample,
};
use controller::predicate::LabelsChanged;
use controller::{Action, Context, Controller, ControllerError, ObjectKey, Request, reconciler_fn};
use factory::SharedInformerFactory;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

fn owner_reference(widget: &Widget) -> OwnerReference {
    OwnerReference {
        api_version: Widget::api_version(&()).into_owned(),
        kind: Widget::kind(&()).into_owned(),
        name: widget.name_any(),
        uid: widget.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// What a reconcile saw: the key and whether the lister had the primary.
type Seen = Arc<Mutex<Vec<(String, bool)>>>;

fn count(seen: &Seen, key: &str, exists: bool) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(k, e)| k == key && *e == exists)
        .count()
}

#[tokio::test]
async fn reconciles_primary_and_owned_children_and_a_deleted_primary_once() {
    let env = envtest_with_widgets().await;
    let client = env.client();
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let seen: Seen = Arc::default();
    let reconciler = {
        let seen = seen.clone();
        reconciler_fn(move |req: Request, ctx: Context<Widget>| {
            let seen = seen.clone();
            async move {
                let widget = ctx.get(&req).expect("decodes");
                seen.lock().unwrap().push((req.to_string(), widget.is_some()));
                let Some(widget) = widget else { return Ok(Action::Done) };
                // Widgets named owner-* get an owned ConfigMap, created if missing.
                if req.name.starts_with("owner-") {
                    let children = ctx.lister_for::<ConfigMap>().expect("owned type has a lister");
                    let namespace = req.namespace.clone().unwrap_or_default();
                    if children.namespaced(&namespace).get(&req.name).is_none() {
                        let mut cm = configmap(&namespace, &req.name, &widget.spec.size.to_string());
                        cm.metadata.owner_references = Some(vec![owner_reference(&widget)]);
                        let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), &namespace);
                        match api.create(&PostParams::default(), &cm).await {
                            Ok(_) => {}
                            Err(kube::Error::Api(e)) if e.code == 409 => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Ok(Action::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("widgets", &factory)
            .for_resource::<Widget>()
            .owns::<ConfigMap>()
            .workers(2)
            .run(reconciler, shutdown.clone()),
    );
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();

    // Create: reconciled, and the child is created.
    widgets
        .create(&pp, &Widget::new("owner-a", WidgetSpec { size: 1 }))
        .await
        .unwrap();
    eventually(WAIT, "owner-a reconciled and its child created", || {
        let cms = cms.clone();
        async move { cms.get_opt("owner-a").await.unwrap().is_some() }
    })
    .await;
    let after_create = count(&seen, "default/owner-a", true);
    assert!(after_create >= 1);

    // Update of the primary.
    let patch = serde_json::json!({"spec": {"size": 2}});
    widgets
        .patch("owner-a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(WAIT, "primary update reconciled", || {
        let n = count(&seen, "default/owner-a", true);
        async move { n > after_create }
    })
    .await;

    // Update of the owned child enqueues the owner.
    let before = count(&seen, "default/owner-a", true);
    let patch = serde_json::json!({"metadata": {"labels": {"touched": "yes"}}});
    cms.patch("owner-a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(WAIT, "child update reconciles the owner", || {
        let n = count(&seen, "default/owner-a", true);
        async move { n > before }
    })
    .await;

    // Deleting the child enqueues the owner, which recreates it.
    let before = count(&seen, "default/owner-a", true);
    let uid = cms.get("owner-a").await.unwrap().metadata.uid;
    cms.delete("owner-a", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, "child recreated by the owner's reconcile", || {
        let (cms, uid) = (cms.clone(), uid.clone());
        async move {
            cms.get_opt("owner-a")
                .await
                .unwrap()
                .is_some_and(|cm| cm.metadata.uid != uid)
        }
    })
    .await;
    assert!(count(&seen, "default/owner-a", true) > before);

    // A deleted primary (without children) is reconciled with "not found", once.
    widgets
        .create(&pp, &Widget::new("plain", WidgetSpec { size: 1 }))
        .await
        .unwrap();
    eventually(WAIT, "plain reconciled", || {
        let n = count(&seen, "default/plain", true);
        async move { n >= 1 }
    })
    .await;
    widgets.delete("plain", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, "deleted primary reconciled as gone", || {
        let n = count(&seen, "default/plain", false);
        async move { n >= 1 }
    })
    .await;
    // A later key reconciled proves the deletion produced no second reconcile meanwhile.
    widgets
        .create(&pp, &Widget::new("barrier", WidgetSpec { size: 1 }))
        .await
        .unwrap();
    eventually(WAIT, "barrier reconciled", || {
        let n = count(&seen, "default/barrier", true);
        async move { n >= 1 }
    })
    .await;
    assert_eq!(count(&seen, "default/plain", false), 1, "{:?}", seen.lock().unwrap());

    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn failures_back_off_exponentially_requeue_after_fires_once_and_success_resets() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let metrics = controller::Metrics::new(&registry).unwrap();
    let calls = Calls::default();
    let fail_again = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reconciler = {
        let (calls, fail_again) = (calls.clone(), fail_again.clone());
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let n = calls.record(&req.name);
            let fail_again = fail_again.clone();
            async move {
                match req.name.as_str() {
                    // Fails five times, then succeeds; fails once more when told to.
                    "flaky" if n <= 5 => Err(format!("attempt {n} failed")),
                    "flaky" if fail_again.swap(false, Ordering::SeqCst) => Err("once more".to_string()),
                    "poll" if n == 1 => Ok(Action::RequeueAfter(Duration::from_millis(400))),
                    "again" if n == 1 => Ok(Action::Requeue),
                    _ => Ok(Action::Done),
                }
            }
        })
    };
    // The controller's rate limiter (client-go's default), recording what it is asked.
    let limiter = RecordingLimiter::new(workqueue::default_controller_rate_limiter());
    let built = Controller::new("backoff", &factory)
        .metrics(metrics)
        .for_resource::<ConfigMap>()
        .rate_limiter(limiter.clone())
        .build(reconciler)
        .unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let run = tokio::spawn(built.run(shutdown.clone()));
    create_configmaps(&client, &["flaky", "poll", "again"]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let of = |name: &str| limiter.of(name);
    let ms = |m: u64| Some(Duration::from_millis(m));
    // client-go's per-item exponential limiter, asked once per failure, then forgotten once
    // by the success: 5 ms, 10 ms, 20 ms, 40 ms, 80 ms.
    eventually(WAIT, "flaky forgotten after its success", || {
        let ok = of("flaky").last() == Some(&None);
        async move { ok }
    })
    .await;
    assert_eq!(of("flaky"), [ms(5), ms(10), ms(20), ms(40), ms(80), None]);
    // A delayed add never fires early: each retry came at least its delay after the failure.
    let flaky = calls.times("flaky");
    assert_eq!(flaky.len(), 6);
    for (i, pair) in flaky.windows(2).enumerate() {
        let wanted = Duration::from_millis(5 << i);
        assert!(
            pair[1] - pair[0] >= wanted,
            "retry {i}: gap {:?} < {wanted:?}",
            pair[1] - pair[0]
        );
    }

    // After the success, a new failure starts over at the base delay.
    fail_again.store(true, Ordering::SeqCst);
    let patch = serde_json::json!({"data": {"v": "2"}});
    cms.patch("flaky", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(WAIT, "flaky failed again and recovered", || {
        let n = of("flaky").len();
        async move { n >= 8 }
    })
    .await;
    assert_eq!(of("flaky")[6..], [ms(5), None], "the success reset the backoff");

    // RequeueAfter: forgotten, then one more reconcile no earlier than the delay.
    eventually(WAIT, "poll requeued after its delay", || {
        let n = calls.times("poll").len();
        async move { n >= 2 }
    })
    .await;
    let poll = calls.times("poll");
    assert!(
        poll[1] - poll[0] >= Duration::from_millis(400),
        "{:?}",
        poll[1] - poll[0]
    );
    // Requeue: rate-limited (one `when`), then done.
    eventually(WAIT, "again requeued, reconciled again and forgotten", || {
        let ok = of("again") == [ms(5), None];
        async move { ok }
    })
    .await;
    // A third reconcile of poll would come from a second requeue; give it twice the delay.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(calls.times("poll").len(), 2, "RequeueAfter fired more than once");
    assert_eq!(
        of("poll"),
        [None, None],
        "RequeueAfter and Done both forget; no rate limiting"
    );
    let text = gather(&registry);
    let result = |r: &str| {
        let series = format!(r#"controller_runtime_reconcile_total{{controller="backoff",result="{r}"}}"#);
        sample(&text, &series)
    };
    assert_eq!(
        (result("requeue"), result("requeue_after"), result("error")),
        (1.0, 1.0, 6.0)
    );

    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_workers_never_reconcile_one_key_concurrently_and_see_the_final_state() {
    const KEYS: usize = 100;
    const UPDATES: usize = 10_000;
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for k in 0..KEYS {
        cms.create(&PostParams::default(), &configmap("default", &format!("k{k}"), "0"))
            .await
            .unwrap();
    }
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
    let overlaps = Arc::new(AtomicUsize::new(0));
    let reconciles = Arc::new(AtomicUsize::new(0));
    let last_seen: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let reconciler = {
        let (in_flight, overlaps, reconciles, last_seen) = (
            in_flight.clone(),
            overlaps.clone(),
            reconciles.clone(),
            last_seen.clone(),
        );
        reconciler_fn(move |req: Request, ctx: Context<ConfigMap>| {
            let (in_flight, overlaps, reconciles, last_seen) = (
                in_flight.clone(),
                overlaps.clone(),
                reconciles.clone(),
                last_seen.clone(),
            );
            async move {
                if !in_flight.lock().unwrap().insert(req.name.clone()) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let value = ctx
                    .get(&req)
                    .expect("decodes")
                    .and_then(|cm| cm.data.as_ref().and_then(|d| d.get("v").cloned()))
                    .unwrap_or_default();
                // Hold the key a while so concurrent deliveries would overlap.
                tokio::time::sleep(Duration::from_micros(500)).await;
                last_seen.lock().unwrap().insert(req.name.clone(), value);
                reconciles.fetch_add(1, Ordering::SeqCst);
                in_flight.lock().unwrap().remove(&req.name);
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("concurrency", &factory)
            .for_resource::<ConfigMap>()
            .workers(8)
            .run(reconciler, shutdown.clone()),
    );
    // 8 writers, each owning keys k % 8 == w, so each key's updates are ordered.
    let mut writers = Vec::new();
    for w in 0..8 {
        let cms = cms.clone();
        writers.push(tokio::spawn(async move {
            let mut finals = BTreeMap::new();
            let own: Vec<usize> = (0..KEYS).filter(|k| k % 8 == w).collect();
            for u in 0..UPDATES / 8 {
                let k = own[u % own.len()];
                let value = format!("{u}");
                let patch = serde_json::json!({"data": {"v": value}});
                cms.patch(&format!("k{k}"), &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
                finals.insert(format!("k{k}"), value);
            }
            finals
        }));
    }
    let mut finals = BTreeMap::new();
    for writer in writers {
        finals.extend(writer.await.unwrap());
    }
    assert_eq!(finals.len(), KEYS);
    eventually(
        Duration::from_secs(60),
        "every key's last reconcile saw its final state",
        || {
            let done = finals.iter().all(|(k, v)| last_seen.lock().unwrap().get(k) == Some(v));
            async move { done }
        },
    )
    .await;
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "a key was reconciled by two workers at once"
    );
    let n = reconciles.load(Ordering::SeqCst);
    assert!((KEYS..=KEYS + UPDATES).contains(&n), "{n} reconciles");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn a_panicking_reconcile_is_counted_and_retried_and_the_worker_survives() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let registry = prometheus::Registry::new();
    let metrics = controller::Metrics::new(&registry).unwrap();
    let attempts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let reconciler = {
        let attempts = attempts.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let n = {
                let mut attempts = attempts.lock().unwrap();
                let n = attempts.entry(req.name.clone()).or_default();
                *n += 1;
                *n
            };
            // A closure may panic before it returns its future ...
            if req.name == "early" && n == 1 {
                panic!("reconcile exploded before its future");
            }
            async move {
                // ... or inside it.
                if req.name == "bomb" && n == 1 {
                    panic!("reconcile exploded");
                }
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("panics", &factory)
            .metrics(metrics)
            .for_resource::<ConfigMap>()
            .run(reconciler, shutdown.clone()),
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in ["bomb", "early"] {
        cms.create(&PostParams::default(), &configmap("default", name, "1"))
            .await
            .unwrap();
    }
    eventually(WAIT, "bomb and early retried after their panics", || {
        let attempts = attempts.lock().unwrap().clone();
        async move { attempts.get("bomb") >= Some(&2) && attempts.get("early") >= Some(&2) }
    })
    .await;
    // The single worker survived: it still reconciles other keys.
    cms.create(&PostParams::default(), &configmap("default", "after", "1"))
        .await
        .unwrap();
    eventually(WAIT, "the worker goes on", || {
        let n = attempts.lock().unwrap().get("after").copied().unwrap_or(0);
        async move { n >= 1 }
    })
    .await;
    let text = gather(&registry);
    let panics = sample(
        &text,
        r#"controller_runtime_reconcile_panics_total{controller="panics"}"#,
    );
    let errors = sample(
        &text,
        r#"controller_runtime_reconcile_errors_total{controller="panics"}"#,
    );
    let results = sample(
        &text,
        r#"controller_runtime_reconcile_total{controller="panics",result="error"}"#,
    );
    assert_eq!((panics, errors, results), (2.0, 2.0, 2.0));
    assert_eq!(
        sample(&text, r#"controller_runtime_active_workers{controller="panics"}"#),
        0.0
    );
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn event_filters_drop_updates_that_do_not_pass() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let reconciler = {
        let seen = seen.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(req.name);
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        })
    };
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in ["quiet", "barrier"] {
        cms.create(&PostParams::default(), &configmap("default", name, "1"))
            .await
            .unwrap();
    }
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("filtered", &factory)
            .for_resource::<ConfigMap>()
            .with_event_filter(LabelsChanged)
            .run(reconciler, shutdown.clone()),
    );
    let n = |name: &str| seen.lock().unwrap().iter().filter(|s| *s == name).count();
    eventually(WAIT, "initial adds pass", || {
        let ok = n("quiet") == 1 && n("barrier") == 1;
        async move { ok }
    })
    .await;
    // A data change does not pass LabelsChanged; a label change on another key, notified
    // after it by the same informer, does. Once that one is reconciled, the first was dropped.
    let data = serde_json::json!({"data": {"v": "2"}});
    cms.patch("quiet", &PatchParams::default(), &Patch::Merge(&data))
        .await
        .unwrap();
    let labels = serde_json::json!({"metadata": {"labels": {"x": "y"}}});
    cms.patch("barrier", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .unwrap();
    eventually(WAIT, "label change passes", || {
        let ok = n("barrier") == 2;
        async move { ok }
    })
    .await;
    assert_eq!(n("quiet"), 1);
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn two_controllers_on_one_type_share_one_list_and_watch() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &configmap("default", "shared", "1"))
        .await
        .unwrap();
    env.faults().clear_requests();
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let counts = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let shutdown = CancellationToken::new();
    let mut built = Vec::new();
    for (i, count) in counts.iter().enumerate() {
        let count = count.clone();
        let reconciler = reconciler_fn(move |_req: Request, _ctx: Context<ConfigMap>| {
            count.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::convert::Infallible>(Action::Done) }
        });
        built.push(
            Controller::new(format!("shared-{i}"), &factory)
                .for_resource::<ConfigMap>()
                .build(reconciler)
                .unwrap(),
        );
    }
    factory.start(&shutdown);
    let runs: Vec<_> = built
        .into_iter()
        .map(|c| tokio::spawn(c.run(shutdown.clone())))
        .collect();
    eventually(WAIT, "both controllers reconciled the configmap", || {
        let ok = counts.iter().all(|c| c.load(Ordering::SeqCst) >= 1);
        async move { ok }
    })
    .await;
    let configmap_requests: Vec<_> = env
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/configmaps"))
        .collect();
    let lists = configmap_requests.iter().filter(|r| !r.is_watch).count();
    let watches = configmap_requests.iter().filter(|r| r.is_watch).count();
    assert_eq!((lists, watches), (1, 1), "{configmap_requests:?}");
    shutdown.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    env.shutdown().await;
}

#[tokio::test]
async fn a_dynamic_primary_is_reconciled_like_a_typed_one() {
    let (env, factory) = envtest_with_factory().await;
    let client = env.client();
    let resource = ApiResource::erase::<ConfigMap>(&());
    type Log = Arc<Mutex<Vec<(String, Option<String>)>>>;
    let seen: Log = Arc::default();
    let reconciler = {
        let seen = seen.clone();
        reconciler_fn(move |req: Request, ctx: Context<DynamicObject>| {
            let seen = seen.clone();
            async move {
                let value = ctx
                    .get(&req)
                    .expect("decodes")
                    .and_then(|obj| obj.data["data"]["v"].as_str().map(str::to_owned));
                seen.lock().unwrap().push((req.to_string(), value));
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("dynamic", &factory)
            .for_dynamic(&resource, true)
            .run(reconciler, shutdown.clone()),
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &configmap("default", "dyn", "42"))
        .await
        .unwrap();
    eventually(WAIT, "dynamic object reconciled with its data", || {
        let ok = seen
            .lock()
            .unwrap()
            .contains(&("default/dyn".into(), Some("42".into())));
        async move { ok }
    })
    .await;
    cms.delete("dyn", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, "dynamic deletion reconciled", || {
        let ok = seen.lock().unwrap().contains(&("default/dyn".into(), None));
        async move { ok }
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn shutdown_keeps_reconciling_queued_keys_until_the_bound_then_aborts_and_reports_the_rest() {
    const KEYS: usize = 12;
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for k in 0..KEYS {
        cms.create(&PostParams::default(), &configmap("default", &format!("s{k}"), "0"))
            .await
            .unwrap();
    }
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let registry = prometheus::Registry::new();
    let metrics = controller::Metrics::new(&registry).unwrap();
    let started: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let reconciled: Arc<Mutex<HashSet<String>>> = Arc::default();
    let reconciler = {
        let (started, reconciled) = (started.clone(), reconciled.clone());
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let (started, reconciled) = (started.clone(), reconciled.clone());
            async move {
                started.lock().unwrap().push(Instant::now());
                // s0 never finishes: it must be aborted at the bound. The others take long
                // enough that two workers cannot finish the 11 of them within the bound.
                let work = if req.name == "s0" {
                    Duration::from_secs(3600)
                } else {
                    Duration::from_millis(400)
                };
                tokio::time::sleep(work).await;
                reconciled.lock().unwrap().insert(req.name);
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        })
    };
    let bound = Duration::from_millis(1500);
    let built = Controller::new("draining", &factory)
        .metrics(metrics)
        .for_resource::<ConfigMap>()
        .workers(2)
        .graceful_shutdown_timeout(bound)
        .build(reconciler)
        .unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let run = tokio::spawn(built.run(shutdown.clone()));
    eventually(WAIT, "reconciles in flight", || {
        let n = started.lock().unwrap().len();
        async move { n >= 2 }
    })
    .await;
    let began = Instant::now();
    shutdown.cancel();
    let result = run.await.unwrap();
    let took = began.elapsed();
    // Both workers were still busy with queued keys at the bound.
    assert!(
        matches!(result, Err(ControllerError::ShutdownTimeout { in_flight: 2, .. })),
        "{result:?}"
    );
    assert!(took >= bound && took < bound + Duration::from_secs(2), "took {took:?}");
    let after_shutdown = started.lock().unwrap().iter().filter(|t| **t > began).count();
    assert!(
        after_shutdown >= 1,
        "the workers must keep taking the keys queued before the shutdown"
    );
    let done = reconciled.lock().unwrap().clone();
    assert!(!done.contains("s0"));
    assert!(done.len() < KEYS - 1, "the bound passed before the queue was empty");
    let dropped = sample(
        &gather(&registry),
        r#"kinformer_controller_dropped_keys_total{controller="draining"}"#,
    ) as usize;
    assert_eq!(done.len() + dropped, KEYS, "reconciled {done:?}, dropped {dropped}");
    env.shutdown().await;
}

/// A reconciler recording which keys it started, in order. Keys named `held*` wait until the
/// test releases them (or forever); `held-stopper` then fires `stop_now` and returns without
/// awaiting anything more; `again` asks to be requeued in an hour; the rest succeed.
#[derive(Clone, Default)]
struct Probe {
    started: Arc<Mutex<Vec<String>>>,
    gates: Arc<Mutex<HashMap<String, Arc<tokio::sync::Notify>>>>,
    stop_now: CancellationToken,
}

impl Probe {
    fn reconciler(&self) -> impl controller::Reconciler<ConfigMap> {
        let probe = self.clone();
        reconciler_fn(move |req: Request, _ctx: Context<ConfigMap>| {
            let probe = probe.clone();
            async move {
                probe.started.lock().unwrap().push(req.name.clone());
                if req.name.starts_with("held") {
                    probe.gate(&req.name).notified().await;
                }
                if req.name == "held-stopper" {
                    probe.stop_now.cancel();
                }
                if req.name == "again" {
                    return Ok(Action::RequeueAfter(Duration::from_secs(3600)));
                }
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        })
    }

    fn gate(&self, name: &str) -> Arc<tokio::sync::Notify> {
        self.gates.lock().unwrap().entry(name.to_owned()).or_default().clone()
    }

    /// Lets the reconcile of `name` finish (now, or as soon as it starts).
    fn release(&self, name: &str) {
        self.gate(name).notify_one();
    }

    fn started(&self) -> Vec<String> {
        self.started.lock().unwrap().clone()
    }

    async fn wait_started(&self, name: &str) {
        eventually(WAIT, &format!("{name} reconciled"), || {
            let ok = self.started().iter().any(|n| n == name);
            async move { ok }
        })
        .await;
    }
}

/// `workers` workers reconciling with `probe`, with a graceful shutdown timeout far above the
/// time the tests take, and its dropped-keys count read from `registry`.
fn probed_controller(
    factory: &SharedInformerFactory,
    registry: &prometheus::Registry,
    probe: &Probe,
    workers: usize,
) -> controller::BuiltController<ConfigMap, impl controller::Reconciler<ConfigMap>> {
    Controller::new("probed", factory)
        .metrics(controller::Metrics::new(registry).unwrap())
        .for_resource::<ConfigMap>()
        .workers(workers)
        .graceful_shutdown_timeout(Duration::from_secs(3600))
        .build(probe.reconciler())
        .unwrap()
}

fn dropped_keys(registry: &prometheus::Registry) -> f64 {
    sample(
        &gather(registry),
        r#"kinformer_controller_dropped_keys_total{controller="probed"}"#,
    )
}

/// Creates the `held` ConfigMaps one by one, each taken by a worker of its own (so there must
/// be as many workers), then queues `keys` behind them.
async fn queue_behind(
    cms: &Api<ConfigMap>,
    probe: &Probe,
    queue: &controller::WorkQueue,
    held: &[&str],
    keys: &[&str],
) {
    for key in held {
        cms.create(&PostParams::default(), &configmap("default", key, "0"))
            .await
            .unwrap();
        probe.wait_started(key).await;
    }
    for key in keys {
        cms.create(&PostParams::default(), &configmap("default", key, "0"))
            .await
            .unwrap();
    }
    eventually(WAIT, "keys queued behind the held reconciles", || {
        let queued = queue.len();
        async move { queued == keys.len() }
    })
    .await;
}

#[tokio::test]
async fn shutdown_reconciles_the_keys_already_queued_and_reports_a_refused_retry_once() {
    // controller-runtime's workers loop on client-go's `Get`, which keeps handing out queued
    // items after `ShutDown`: the keys queued at shutdown are reconciled, not dropped.
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let registry = prometheus::Registry::new();
    let probe = Probe::default();
    let built = probed_controller(&factory, &registry, &probe, 1);
    let queue = built.queue().clone();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let run = tokio::spawn(built.run(shutdown.clone()));
    // `again` is reconciled once and waits an hour for its requeue...
    cms.create(&PostParams::default(), &configmap("default", "again", "0"))
        .await
        .unwrap();
    probe.wait_started("again").await;
    // ...while an update queues it again, behind the held reconcile, with q0..q2.
    queue_behind(&cms, &probe, &queue, &["held"], &[]).await;
    cms.patch(
        "again",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"v": "1"}})),
    )
    .await
    .unwrap();
    for key in ["q0", "q1", "q2"] {
        cms.create(&PostParams::default(), &configmap("default", key, "0"))
            .await
            .unwrap();
    }
    eventually(WAIT, "four keys queued", || {
        let queued = queue.len();
        async move { queued == 4 }
    })
    .await;
    // The worker is held: nothing starts between this count and the shutdown.
    let before = probe.started().len();
    shutdown.cancel();
    probe.release("held");
    let result = tokio::time::timeout(WAIT, run).await.expect("run returned").unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        probe.started()[before..],
        ["again", "q0", "q1", "q2"],
        "every key queued at shutdown is reconciled, in queue order"
    );
    // `again` asked for a requeue during the drain, which the shut-down queue refused, and its
    // earlier requeue was waiting: one dropped key, not two. (The priority queue, the default,
    // merged that waiting requeue into the update's add, the earliest ready time winning, so only
    // the refused one is left; the FIFO queue keeps the requeue waiting beside it.)
    assert_eq!(dropped_keys(&registry), 1.0);
    assert_eq!(
        queue.unfinished().contains(&ObjectKey::namespaced("default", "again")),
        !queue.is_priority_queue()
    );
    env.shutdown().await;
}

#[tokio::test]
async fn stop_now_takes_no_queued_key_and_aborts_the_reconcile_in_flight() {
    // What the manager does on a lost lease: `stop_now` fires while the controller runs. One
    // worker is in a reconcile that never ends; the other is finishing one at that very moment
    // and goes on without yielding: neither may take the queued keys.
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let registry = prometheus::Registry::new();
    let probe = Probe::default();
    let built = probed_controller(&factory, &registry, &probe, 2);
    let queue = built.queue().clone();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let run = tokio::spawn(built.run_with_stop_now(shutdown.clone(), probe.stop_now.clone()));
    queue_behind(&cms, &probe, &queue, &["held", "held-stopper"], &["q0", "q1"]).await;
    probe.release("held-stopper"); // fires `stop_now` and returns
    let result = tokio::time::timeout(WAIT, run).await.expect("run returned").unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        probe.started(),
        ["held", "held-stopper"],
        "no queued key may be reconciled"
    );
    assert_eq!(dropped_keys(&registry), 3.0, "held (aborted) and q0, q1 (queued)");
    shutdown.cancel();
    env.shutdown().await;
}

#[tokio::test]
async fn stop_now_during_the_drain_stops_it_at_once() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let registry = prometheus::Registry::new();
    let probe = Probe::default();
    let built = probed_controller(&factory, &registry, &probe, 1);
    let queue = built.queue().clone();
    let (shutdown, stop_now) = (CancellationToken::new(), CancellationToken::new());
    factory.start(&shutdown);
    let run = tokio::spawn(built.run_with_stop_now(shutdown.clone(), stop_now.clone()));
    queue_behind(&cms, &probe, &queue, &["held"], &["held-q0", "q1", "q2"]).await;
    shutdown.cancel();
    probe.release("held");
    // The drain has begun: the worker took held-q0, which is never released.
    probe.wait_started("held-q0").await;
    stop_now.cancel();
    let result = tokio::time::timeout(WAIT, run).await.expect("run returned").unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(probe.started(), ["held", "held-q0"]);
    assert_eq!(dropped_keys(&registry), 3.0, "held-q0 (aborted) and q1, q2 (queued)");
    env.shutdown().await;
}

#[tokio::test]
async fn watches_map_any_object_to_keys_and_dynamic_children_enqueue_their_owner() {
    use k8s_openapi::api::core::v1::Secret;
    let env = envtest_with_widgets().await;
    let client = env.client();
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let seen: Seen = Arc::default();
    let reconciler = {
        let seen = seen.clone();
        reconciler_fn(move |req: Request, ctx: Context<Widget>| {
            let seen = seen.clone();
            async move {
                // Every type the controller uses has a lister; others do not. Recorded, and
                // asserted by the test body (a panic here would only be retried).
                let listers_ok = ctx.lister_for::<ConfigMap>().is_ok()
                    && ctx.lister_for::<Widget>().is_ok()
                    && ctx.dynamic_lister(&ApiResource::erase::<Secret>(&())).is_some()
                    && ctx.lister_for::<Secret>().is_err_and(|e| {
                        e.to_string().starts_with(
                            "controller mapped has no cache of Secret: add one on its builder with .owns::<Secret>()",
                        )
                    });
                seen.lock()
                    .unwrap()
                    .push((req.to_string(), ctx.get(&req).expect("decodes").is_some() && listers_ok));
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("mapped", &factory)
            .for_resource::<Widget>()
            // A ConfigMap labelled widget=<name> concerns that Widget.
            .watches::<ConfigMap>(|cm| {
                let widget = cm.labels().get("widget").cloned();
                widget
                    .map(|name| vec![ObjectKey::namespaced(cm.namespace().unwrap_or_default(), name)])
                    .unwrap_or_default()
            })
            .owns_dynamic(&ApiResource::erase::<Secret>(&()), true)
            .run(reconciler, shutdown.clone()),
    );
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let widget = widgets
        .create(&PostParams::default(), &Widget::new("w", WidgetSpec { size: 1 }))
        .await
        .unwrap();
    eventually(WAIT, "w reconciled", || {
        let n = count(&seen, "default/w", true);
        async move { n == 1 }
    })
    .await;

    // A labelled ConfigMap maps to the Widget's key.
    let mut cm = configmap("default", "pointer", "1");
    cm.metadata.labels = Some([("widget".to_string(), "w".to_string())].into());
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    eventually(WAIT, "mapped ConfigMap enqueued its Widget", || {
        let n = count(&seen, "default/w", true);
        async move { n == 2 }
    })
    .await;

    // A Secret controlled by the Widget, seen through a dynamic informer, enqueues it too.
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("owned-secret".into()),
            namespace: Some("default".into()),
            owner_references: Some(vec![owner_reference(&widget)]),
            ..Default::default()
        },
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    eventually(WAIT, "owned dynamic Secret enqueued its Widget", || {
        let n = count(&seen, "default/w", true);
        async move { n == 3 }
    })
    .await;
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn workers_start_only_once_every_informer_of_the_controller_synced() {
    use k8s_openapi::api::core::v1::Secret;
    let env = envtest_with_widgets().await;
    let client = env.client();
    Api::<Widget>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &Widget::new("early", WidgetSpec { size: 1 }))
        .await
        .unwrap();
    // The owned type's first lists fail: its informer syncs only after the reflector's backoff,
    // long after the Widget informer did.
    env.faults().fail_next("/api/v1/secrets", 500, 2, 0);
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let secrets = factory.informer_for::<Secret>().unwrap();
    let widgets = factory.informer_for::<Widget>().unwrap();
    let synced_at_reconcile: Arc<Mutex<Vec<bool>>> = Arc::default();
    let reconciler = {
        let (synced, secrets) = (synced_at_reconcile.clone(), secrets.clone());
        reconciler_fn(move |_req: Request, _ctx: Context<Widget>| {
            synced.lock().unwrap().push(secrets.has_synced());
            async { Ok::<_, std::convert::Infallible>(Action::Done) }
        })
    };
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("gated", &factory)
            .for_resource::<Widget>()
            .owns::<Secret>()
            .run(reconciler, shutdown.clone()),
    );
    eventually(WAIT, "the Widget informer synced first", || {
        let ok = widgets.has_synced();
        async move { ok }
    })
    .await;
    assert!(!secrets.has_synced(), "the Secret lists were to fail first");
    assert!(
        synced_at_reconcile.lock().unwrap().is_empty(),
        "a worker ran before every cache synced"
    );
    eventually(WAIT, "early reconciled", || {
        let n = synced_at_reconcile.lock().unwrap().len();
        async move { n >= 1 }
    })
    .await;
    assert!(synced_at_reconcile.lock().unwrap().iter().all(|ok| *ok));
    let secret_lists = env
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/secrets" && !r.is_watch)
        .count();
    assert!(secret_lists >= 3, "{secret_lists} lists of secrets");
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn a_custom_handler_gets_the_queue_and_the_event_filters_do_not_apply_to_it() {
    use controller::predicate::GenerationChanged;
    use informer_core::ResourceEventHandlerFuncs;
    let env = envtest_with_widgets().await;
    let client = env.client();
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    // What the custom handler observed, in order, before it enqueued.
    let observed: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen: Arc<Mutex<Vec<(String, usize, bool)>>> = Arc::default();
    let reconciler = {
        let (seen, observed) = (seen.clone(), observed.clone());
        reconciler_fn(move |req: Request, ctx: Context<Widget>| {
            let entry = (
                req.to_string(),
                observed.lock().unwrap().len(),
                ctx.lister_for::<ConfigMap>().is_ok(),
            );
            seen.lock().unwrap().push(entry);
            async { Ok::<_, std::convert::Infallible>(Action::Done) }
        })
    };
    let shutdown = CancellationToken::new();
    let handler_log = observed.clone();
    let run = tokio::spawn(
        Controller::new("custom", &factory)
            .for_resource::<Widget>()
            // Would drop every ConfigMap update (they have no generation) if it applied.
            .with_event_filter(GenerationChanged)
            .watches_with::<ConfigMap, _>(move |queue| {
                let on_update = handler_log.clone();
                ResourceEventHandlerFuncs::new().on_update(move |_old, cm: &Arc<ConfigMap>| {
                    on_update.lock().unwrap().push(cm.name_any());
                    if let Some(widget) = cm.labels().get("widget") {
                        queue.add(ObjectKey::namespaced("default", widget));
                    }
                })
            })
            .run(reconciler, shutdown.clone()),
    );
    Api::<Widget>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &Widget::new("w", WidgetSpec { size: 1 }))
        .await
        .unwrap();
    let mut cm = configmap("default", "pointer", "1");
    cm.metadata.labels = Some([("widget".to_string(), "w".to_string())].into());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm).await.unwrap();
    eventually(WAIT, "w reconciled once", || {
        let n = seen.lock().unwrap().len();
        async move { n == 1 }
    })
    .await;
    let patch = serde_json::json!({"data": {"v": "2"}});
    cms.patch("pointer", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(WAIT, "the custom handler's key reconciled", || {
        let n = seen.lock().unwrap().len();
        async move { n == 2 }
    })
    .await;
    // The handler had recorded the update before the reconcile it enqueued ran.
    let second = seen.lock().unwrap()[1].clone();
    assert_eq!(second, ("default/w".to_string(), 1, true));
    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}
