//! The finalizer helper and controllerutil over envtest (real HTTP, the real `kube::Client`):
//! the finalizer is on the server before the first apply; a failed cleanup keeps it and is
//! retried; a deleted object without our finalizer is left alone; two controllers with two
//! finalizers both clean up before the object goes; our finalizer never keeps an object; racing
//! writers' finalizers survive. Owner references, server-side apply, and the status helper.
//! One binary for both modules (link time and disk).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Widget, WidgetSpec, configmap, envtest_with_widgets, eventually};
use controller::controllerutil::{
    OwnerReferenceError, apply, patch_status_if_changed, set_controller_reference, set_owner_reference,
};
use controller::finalizer::{Event, FinalizerError, finalizer, has_finalizer};
use controller::{Action, BoxError, Context, Controller, Reconciler, Request, reconciler_fn};
use factory::SharedInformerFactory;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);
const OURS: &str = "test.kinformer.dev/cleanup";
const HOLD: &str = "test.kinformer.dev/hold";

/// What one controller's finalizing reconciler did.
#[derive(Default)]
struct Probe {
    /// One entry per `Event::Apply`: whether the server's object carried the finalizer then.
    applies: Mutex<Vec<bool>>,
    /// Every `Event::Cleanup` started.
    cleanup_attempts: AtomicUsize,
    /// Every `Event::Cleanup` that succeeded.
    cleanups: AtomicUsize,
    /// The cleanup fails while this is false.
    allow_cleanup: AtomicBool,
    /// Every finalizer error, by variant.
    errors: Mutex<Vec<&'static str>>,
    /// Reconciles of an existing object that got through `finalizer`.
    reconciled: AtomicUsize,
}

impl Probe {
    fn new(allow_cleanup: bool) -> Arc<Self> {
        let probe = Probe::default();
        probe.allow_cleanup.store(allow_cleanup, Ordering::SeqCst);
        Arc::new(probe)
    }

    fn applies(&self) -> Vec<bool> {
        self.applies.lock().unwrap().clone()
    }
}

/// The user side of `finalizer`: apply records whether the server's object carries the
/// finalizer; cleanup fails until allowed.
async fn on_event(
    api: Api<Widget>,
    name: &'static str,
    probe: Arc<Probe>,
    event: Event<Widget>,
) -> Result<Action, BoxError> {
    match event {
        Event::Apply(obj) => {
            let server = api.get(&obj.name_any()).await?;
            probe
                .applies
                .lock()
                .unwrap()
                .push(has_finalizer(&server, name) && has_finalizer(&*obj, name));
            Ok(Action::Done)
        }
        Event::Cleanup(obj) => {
            assert!(obj.metadata.deletion_timestamp.is_some());
            probe.cleanup_attempts.fetch_add(1, Ordering::SeqCst);
            if !probe.allow_cleanup.load(Ordering::SeqCst) {
                return Err("cleanup refused by the test".into());
            }
            probe.cleanups.fetch_add(1, Ordering::SeqCst);
            Ok(Action::Done)
        }
    }
}

fn variant(e: &FinalizerError) -> &'static str {
    match e {
        FinalizerError::ApplyFailed { .. } => "ApplyFailed",
        FinalizerError::CleanupFailed { .. } => "CleanupFailed",
        FinalizerError::AddFinalizer { .. } => "AddFinalizer",
        FinalizerError::RemoveFinalizer { .. } => "RemoveFinalizer",
        _ => "other",
    }
}

/// A reconciler of Widgets behind the finalizer `name`.
fn finalizing(name: &'static str, probe: Arc<Probe>) -> impl Reconciler<Widget> {
    reconciler_fn(move |req: Request, ctx: Context<Widget>| {
        let probe = probe.clone();
        async move {
            let Some(widget) = ctx.get(&req).expect("decodes") else {
                return Ok(Action::Done);
            };
            let api: Api<Widget> = Api::namespaced(ctx.client().clone(), req.namespace.as_deref().unwrap_or("default"));
            let result = finalizer(&api, name, widget, {
                let (api, probe) = (api.clone(), probe.clone());
                move |event| on_event(api, name, probe, event)
            })
            .await;
            if let Err(e) = &result {
                probe.errors.lock().unwrap().push(variant(e));
            }
            probe.reconciled.fetch_add(1, Ordering::SeqCst);
            result
        }
    })
}

fn widget(name: &str, finalizers: &[&str]) -> Widget {
    let mut w = Widget::new(name, WidgetSpec { size: 1 });
    w.metadata.namespace = Some("default".into());
    if !finalizers.is_empty() {
        w.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
    }
    w
}

async fn finalizers_on_server(api: &Api<Widget>, name: &str) -> Option<Vec<String>> {
    api.get_opt(name).await.unwrap().map(|w| w.finalizers().to_vec())
}

/// Waits until the probe's controller has applied at least once.
async fn until_applied(probe: &Probe, what: &str) {
    eventually(WAIT, what, || {
        let n = probe.applies().len();
        async move { n >= 1 }
    })
    .await;
}

/// Starts one controller of Widgets behind `name` on `factory`.
fn start(
    factory: &SharedInformerFactory,
    controller_name: &str,
    name: &'static str,
    probe: &Arc<Probe>,
    shutdown: &CancellationToken,
) -> tokio::task::JoinHandle<Result<(), controller::ControllerError>> {
    tokio::spawn(
        Controller::new(controller_name, factory)
            .for_resource::<Widget>()
            .run(finalizing(name, probe.clone()), shutdown.clone()),
    )
}

#[tokio::test]
async fn the_finalizer_is_on_the_server_before_the_first_apply() {
    let env = envtest_with_widgets().await;
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let probe = Probe::new(true);
    let shutdown = CancellationToken::new();
    let run = start(&factory, "first-apply", OURS, &probe, &shutdown);
    let api: Api<Widget> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &widget("w", &[])).await.unwrap();

    until_applied(&probe, "applied").await;
    let applies = probe.applies();
    assert!(
        applies.iter().all(|on_server| *on_server),
        "an apply ran before the finalizer was stored: {applies:?}"
    );
    assert_eq!(
        finalizers_on_server(&api, "w").await,
        Some(vec![OURS.to_owned()]),
        "added exactly once"
    );
    assert_eq!(probe.cleanup_attempts.load(Ordering::SeqCst), 0);

    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn a_failed_cleanup_keeps_the_finalizer_and_is_retried() {
    let env = envtest_with_widgets().await;
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let probe = Probe::new(false);
    let shutdown = CancellationToken::new();
    let run = start(&factory, "failing-cleanup", OURS, &probe, &shutdown);
    let api: Api<Widget> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &widget("w", &[])).await.unwrap();
    until_applied(&probe, "finalizer added and applied").await;

    api.delete("w", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, "three failed cleanups (retried with backoff)", || {
        let n = probe.cleanup_attempts.load(Ordering::SeqCst);
        async move { n >= 3 }
    })
    .await;
    let held = api
        .get_opt("w")
        .await
        .unwrap()
        .expect("a failed cleanup keeps the object");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.finalizers(), [OURS], "the finalizer stays after a failed cleanup");
    assert_eq!(probe.cleanups.load(Ordering::SeqCst), 0);
    {
        let errors = probe.errors.lock().unwrap();
        assert!(
            errors.len() >= 3 && errors.iter().all(|e| *e == "CleanupFailed"),
            "{errors:?}"
        );
    }

    probe.allow_cleanup.store(true, Ordering::SeqCst);
    eventually(WAIT, "object gone once the cleanup succeeded", || {
        let api = api.clone();
        async move { api.get_opt("w").await.unwrap().is_none() }
    })
    .await;
    assert!(probe.cleanups.load(Ordering::SeqCst) >= 1);

    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn a_deleted_object_without_our_finalizer_is_left_alone() {
    let env = envtest_with_widgets().await;
    let api: Api<Widget> = Api::namespaced(env.client(), "default");
    // Deleted before the controller ever saw it: held by someone else's finalizer only.
    api.create(&PostParams::default(), &widget("w", &[HOLD])).await.unwrap();
    api.delete("w", &DeleteParams::default()).await.unwrap();
    assert!(api.get("w").await.unwrap().metadata.deletion_timestamp.is_some());

    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let probe = Probe::new(true);
    let shutdown = CancellationToken::new();
    let run = start(&factory, "not-ours", OURS, &probe, &shutdown);
    eventually(WAIT, "the deleting object reconciled", || {
        let n = probe.reconciled.load(Ordering::SeqCst);
        async move { n >= 1 }
    })
    .await;
    assert_eq!(
        finalizers_on_server(&api, "w").await,
        Some(vec![HOLD.to_owned()]),
        "our finalizer must not be added to a deleting object"
    );
    assert_eq!(probe.cleanup_attempts.load(Ordering::SeqCst), 0, "not ours to clean up");
    assert!(probe.applies().is_empty());
    assert!(probe.errors.lock().unwrap().is_empty());

    // The holder lets go: the object goes, and it is not re-added on the way.
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    api.patch("w", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    eventually(WAIT, "object gone", || {
        let api = api.clone();
        async move { api.get_opt("w").await.unwrap().is_none() }
    })
    .await;
    assert_eq!(probe.cleanup_attempts.load(Ordering::SeqCst), 0);

    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn two_controllers_with_two_finalizers_both_clean_up_before_the_object_goes() {
    const A: &str = "a.test.kinformer.dev/cleanup";
    const B: &str = "b.test.kinformer.dev/cleanup";
    let env = envtest_with_widgets().await;
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let (probe_a, probe_b) = (Probe::new(true), Probe::new(false));
    let shutdown = CancellationToken::new();
    let run_a = start(&factory, "controller-a", A, &probe_a, &shutdown);
    let run_b = start(&factory, "controller-b", B, &probe_b, &shutdown);
    let api: Api<Widget> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &widget("w", &[])).await.unwrap();

    // Both add theirs, racing on one list: neither is dropped, neither duplicated.
    eventually(WAIT, "both finalizers on the object and both applied", || {
        let api = api.clone();
        let applied = !probe_a.applies().is_empty() && !probe_b.applies().is_empty();
        async move {
            let mut fins = finalizers_on_server(&api, "w").await.unwrap_or_default();
            fins.sort();
            applied && fins == [A, B]
        }
    })
    .await;
    assert!(probe_a.applies().iter().chain(&probe_b.applies()).all(|on| *on));

    api.delete("w", &DeleteParams::default()).await.unwrap();
    eventually(WAIT, "A cleaned up and removed its finalizer", || {
        let api = api.clone();
        let cleaned = probe_a.cleanups.load(Ordering::SeqCst) >= 1;
        async move { cleaned && finalizers_on_server(&api, "w").await == Some(vec![B.to_owned()]) }
    })
    .await;
    eventually(WAIT, "B's cleanup attempted (and refused)", || {
        let n = probe_b.cleanup_attempts.load(Ordering::SeqCst);
        async move { n >= 2 }
    })
    .await;
    let held = api.get_opt("w").await.unwrap().expect("the object waits for B");
    assert_eq!(held.finalizers(), [B]);

    probe_b.allow_cleanup.store(true, Ordering::SeqCst);
    eventually(WAIT, "object gone after both cleanups", || {
        let api = api.clone();
        async move { api.get_opt("w").await.unwrap().is_none() }
    })
    .await;
    assert!(probe_a.cleanups.load(Ordering::SeqCst) >= 1);
    assert!(probe_b.cleanups.load(Ordering::SeqCst) >= 1);

    shutdown.cancel();
    run_a.await.unwrap().unwrap();
    run_b.await.unwrap().unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn an_object_whose_only_finalizer_is_ours_is_never_stuck() {
    let env = envtest_with_widgets().await;
    let factory = SharedInformerFactory::new(env.client(), Duration::ZERO);
    let probe = Probe::new(true);
    let shutdown = CancellationToken::new();
    let run = start(&factory, "only-ours", OURS, &probe, &shutdown);
    let api: Api<Widget> = Api::namespaced(env.client(), "default");

    for name in ["settled", "hasty"] {
        api.create(&PostParams::default(), &widget(name, &[])).await.unwrap();
        if name == "settled" {
            eventually(WAIT, "finalizer added", || {
                let api = api.clone();
                async move { finalizers_on_server(&api, "settled").await == Some(vec![OURS.to_owned()]) }
            })
            .await;
        }
        // "hasty" is deleted at once: before, while or after the controller adds its finalizer.
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for name in ["settled", "hasty"] {
        eventually(WAIT, "object gone", || {
            let api = api.clone();
            async move { api.get_opt(name).await.unwrap().is_none() }
        })
        .await;
    }
    assert!(probe.cleanups.load(Ordering::SeqCst) >= 1);

    shutdown.cancel();
    run.await.unwrap().unwrap();
    env.shutdown().await;
}

/// A stale cache: the reconcile holds an object that is neither deleting nor ours, while on
/// the server it is being deleted. Whatever the server answers to the add (kube-apiserver
/// refuses new finalizers on a deleting object, envtest accepts them), our finalizer is not
/// left behind to hold the object.
#[tokio::test]
async fn a_stale_cache_never_leaves_our_finalizer_on_a_deleting_object() {
    let env = envtest_with_widgets().await;
    let api: Api<Widget> = Api::namespaced(env.client(), "default");
    let stale = Arc::new(api.create(&PostParams::default(), &widget("w", &[HOLD])).await.unwrap());
    api.delete("w", &DeleteParams::default()).await.unwrap();

    let probe = Probe::new(true);
    let action = finalizer(&api, OURS, stale, |event| {
        on_event(api.clone(), OURS, probe.clone(), event)
    })
    .await
    .unwrap();
    assert_eq!(action, Action::Done);
    assert_eq!(finalizers_on_server(&api, "w").await, Some(vec![HOLD.to_owned()]));
    assert!(probe.applies().is_empty(), "no apply on a deleting object");
    env.shutdown().await;
}

/// Another writer changes the finalizer list between our read and our write: its finalizer
/// survives our add, and our removal after cleanup, and the cleanup runs once.
#[tokio::test]
async fn a_racing_writers_finalizer_is_never_dropped() {
    const OTHER: &str = "other.test.kinformer.dev/keep";
    const FIRST: &str = "first.test.kinformer.dev/keep";
    let env = envtest_with_widgets().await;
    let api: Api<Widget> = Api::namespaced(env.client(), "default");
    let stale = Arc::new(api.create(&PostParams::default(), &widget("w", &[])).await.unwrap());
    let add_other = serde_json::json!({"metadata": {"finalizers": [OTHER]}});
    api.patch("w", &PatchParams::default(), &Patch::Merge(&add_other))
        .await
        .unwrap();

    let probe = Probe::new(true);
    let on = |probe: &Arc<Probe>| {
        let (api, probe) = (api.clone(), probe.clone());
        move |event| on_event(api, OURS, probe, event)
    };
    finalizer(&api, OURS, stale, on(&probe)).await.unwrap();
    assert_eq!(
        finalizers_on_server(&api, "w").await,
        Some(vec![OTHER.to_owned(), OURS.to_owned()]),
        "the add kept the racing writer's finalizer"
    );
    assert_eq!(probe.applies(), [true]);

    // A third writer's finalizer in front of ours: [FIRST, OURS, OTHER] after this.
    let add_first = serde_json::json!({"metadata": {"finalizers": [FIRST, OURS, OTHER]}});
    api.patch("w", &PatchParams::default(), &Patch::Merge(&add_first))
        .await
        .unwrap();
    // Deleting: we read [FIRST, OURS, OTHER] (ours at 1), then FIRST goes (ours moves to 0):
    // a remove by the stale index 1 would drop OTHER. Our cleanup succeeds, and the removal
    // must find ours again without running the cleanup twice.
    api.delete("w", &DeleteParams::default()).await.unwrap();
    let stale = Arc::new(api.get("w").await.unwrap());
    assert_eq!(stale.finalizers(), [FIRST, OURS, OTHER]);
    let remove_first = serde_json::json!({"metadata": {"finalizers": [OURS, OTHER]}});
    api.patch("w", &PatchParams::default(), &Patch::Merge(&remove_first))
        .await
        .unwrap();
    finalizer(&api, OURS, stale, on(&probe)).await.unwrap();
    assert_eq!(
        finalizers_on_server(&api, "w").await,
        Some(vec![OTHER.to_owned()]),
        "ours removed at its new index, the other writer's kept"
    );
    assert_eq!(
        probe.cleanup_attempts.load(Ordering::SeqCst),
        1,
        "the removal was retried, not the cleanup"
    );

    // The other writer lets go: nothing of ours holds the object.
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    api.patch("w", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    assert!(api.get_opt("w").await.unwrap().is_none());

    // An invalid name is a typed error, before any write.
    let fresh = Arc::new(api.create(&PostParams::default(), &widget("v", &[])).await.unwrap());
    let err = finalizer(&api, "no-domain", fresh, on(&probe)).await.unwrap_err();
    assert!(matches!(err, FinalizerError::InvalidName(_)), "{err}");
    assert_eq!(finalizers_on_server(&api, "v").await, Some(vec![]));
    env.shutdown().await;
}

#[tokio::test]
async fn set_controller_reference_refuses_a_second_controller_owner() {
    let env = envtest_with_widgets().await;
    let widgets: Api<Widget> = Api::namespaced(env.client(), "default");
    let pp = PostParams::default();
    let first = widgets.create(&pp, &widget("first", &[])).await.unwrap();
    let second = widgets.create(&pp, &widget("second", &[])).await.unwrap();

    let mut cm = configmap("default", "child", "1");
    set_controller_reference(&first, &mut cm).unwrap();
    match set_controller_reference(&second, &mut cm) {
        Err(OwnerReferenceError::AlreadyOwned { owner, .. }) => {
            assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Widget", "first"));
        }
        other => panic!("expected AlreadyOwned, got {other:?}"),
    }
    // A plain owner beside the controller is allowed.
    set_owner_reference(&second, &mut cm).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let stored = cms.create(&pp, &cm).await.unwrap();
    let refs = stored.owner_references();
    assert_eq!(refs.len(), 2);
    assert_eq!(refs[0].uid, first.uid().unwrap());
    assert_eq!(
        (refs[0].controller, refs[0].block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!((refs[1].name.as_str(), refs[1].controller), ("second", None));

    // Garbage collection follows the controller reference: deleting both owners deletes it.
    for name in ["first", "second"] {
        widgets.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually(WAIT, "owned ConfigMap collected", || {
        let cms = cms.clone();
        async move { cms.get_opt("child").await.unwrap().is_none() }
    })
    .await;
    env.shutdown().await;
}

#[tokio::test]
async fn apply_creates_then_updates_and_a_no_op_apply_keeps_the_resource_version() {
    const MANAGER: &str = "kinformer-test-controller";
    let env = envtest_with_widgets().await;
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");

    let created = apply(&cms, MANAGER, &configmap("default", "applied", "1"))
        .await
        .unwrap();
    let rv1 = created.resource_version().unwrap();
    assert_eq!(cms.get("applied").await.unwrap().data.unwrap()["v"], "1");
    assert!(
        created
            .managed_fields()
            .iter()
            .any(|m| m.manager.as_deref() == Some(MANAGER) && m.operation.as_deref() == Some("Apply"))
    );

    let updated = apply(&cms, MANAGER, &configmap("default", "applied", "2"))
        .await
        .unwrap();
    let rv2 = updated.resource_version().unwrap();
    assert_ne!(rv1, rv2);
    assert_eq!(updated.data.as_ref().unwrap()["v"], "2");

    // The same fields again (from an object read back, managedFields and all): no write.
    let again = apply(&cms, MANAGER, &updated).await.unwrap();
    assert_eq!(again.resource_version().unwrap(), rv2);
    assert_eq!(cms.get("applied").await.unwrap().resource_version().unwrap(), rv2);

    // Another manager takes the field; an unforced apply would now conflict, ours (forced)
    // takes it back.
    let other = configmap("default", "applied", "3");
    cms.patch(
        "applied",
        &PatchParams::apply("intruder").force(),
        &Patch::Apply(&other),
    )
    .await
    .unwrap();
    let unforced = cms
        .patch(
            "applied",
            &PatchParams::apply(MANAGER),
            &Patch::Apply(&configmap("default", "applied", "2")),
        )
        .await;
    assert!(
        matches!(unforced, Err(kube::Error::Api(ref e)) if e.code == 409),
        "{unforced:?}"
    );
    let taken_back = apply(&cms, MANAGER, &configmap("default", "applied", "2"))
        .await
        .unwrap();
    assert_eq!(taken_back.data.unwrap()["v"], "2");
    env.shutdown().await;
}

/// A namespaced CRD with a status subresource.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "test.kinformer.dev",
    version = "v1",
    kind = "Gadget",
    namespaced,
    status = "GadgetStatus"
)]
pub struct GadgetSpec {
    /// Anything.
    pub size: i32,
}

/// kube's derive emits no per-type hooks: the factory's defaults (metadata lists compacted).
impl factory::InformerResource for Gadget {}

/// Gadget's status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct GadgetStatus {
    /// What the controller saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

#[tokio::test]
async fn the_status_is_written_only_when_it_changed() {
    let env = envtest_with_widgets().await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    crds.create(&PostParams::default(), &Gadget::crd()).await.unwrap();
    let gadgets: Api<Gadget> = Api::namespaced(env.client(), "default");
    eventually(WAIT, "Gadget is served", || {
        let gadgets = gadgets.clone();
        async move { gadgets.list(&Default::default()).await.is_ok() }
    })
    .await;
    let mut g = Gadget::new("g", GadgetSpec { size: 1 });
    g.metadata = ObjectMeta {
        name: Some("g".into()),
        namespace: Some("default".into()),
        ..ObjectMeta::default()
    };
    let created = gadgets.create(&PostParams::default(), &g).await.unwrap();
    let status_patches = || {
        env.requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with("/gadgets/g/status"))
            .count()
    };
    let ready = GadgetStatus {
        phase: Some("Ready".into()),
    };

    let written = patch_status_if_changed(&gadgets, &created, &ready)
        .await
        .unwrap()
        .expect("a new status is written");
    assert_eq!(written.status.as_ref(), Some(&ready));
    assert_ne!(written.resource_version(), created.resource_version());
    assert_eq!(status_patches(), 1);

    // Unchanged: no request, no new resourceVersion.
    let rv = written.resource_version();
    assert!(
        patch_status_if_changed(&gadgets, &written, &ready)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(status_patches(), 1, "no PATCH for an unchanged status");
    assert_eq!(gadgets.get("g").await.unwrap().resource_version(), rv);
    // An empty desired status on an object without one is no change either.
    assert!(
        patch_status_if_changed(&gadgets, &created, &GadgetStatus::default())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(status_patches(), 1);

    // Changed again: written.
    let failed = GadgetStatus {
        phase: Some("Failed".into()),
    };
    let written = patch_status_if_changed(&gadgets, &written, &failed)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(written.status, Some(failed));
    assert_ne!(written.resource_version(), rv);
    assert_eq!(status_patches(), 2);
    env.shutdown().await;
}
