//! The webhook server over real HTTPS: AdmissionReview and ConversionReview bodies POSTed with
//! kube's own rustls client trusting a test CA (made with rcgen), as kube-apiserver would send
//! them. Allow, deny, warnings, the mutating patch (applied and compared), dryRun, a handler's
//! panic and timeout, decode errors, hub-and-spoke conversion and its failure, certificate
//! rotation with no restart, and the metrics on the Manager's `/metrics`.

mod common;
mod webhook_support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::Request;
use controller::Manager;
use controller::webhook::{
    Conversion, MutatingWebhook, ValidatingWebhook, Verdict, WebhookServer, WebhookServerConfig,
};
use kube::core::admission::{AdmissionRequest, Operation};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use webhook_support::{Pki, TempDir, https_client, v1, v1alpha1};

struct Running {
    server: WebhookServer,
    registry: prometheus::Registry,
    stop: CancellationToken,
    task: JoinHandle<Result<(), controller::WebhookError>>,
    pki: Pki,
    dir: TempDir,
}

impl Running {
    /// A server on a free local port with a fresh CA; `register` adds the webhooks before it starts.
    fn start(register: impl FnOnce(&WebhookServer)) -> Running {
        let dir = TempDir::new();
        let pki = Pki::write(&dir.0, "test CA");
        let registry = prometheus::Registry::new();
        let config = WebhookServerConfig::default()
            .addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .cert_dir(&dir.0);
        let server = WebhookServer::new(config, &registry).unwrap();
        register(&server);
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (server, stop) = (server.clone(), stop.clone());
            async move { server.start(stop).await }
        });
        Running {
            server,
            registry,
            stop,
            task,
            pki,
            dir,
        }
    }

    /// A server whose one webhook validates with [`replicas_in_range`] at controller-runtime's
    /// default path.
    fn replicas_in_range() -> Running {
        Running::start(|server| {
            server
                .register_validating(ValidatingWebhook::new(replicas_in_range))
                .unwrap();
        })
    }

    fn client(&self) -> kube::Client {
        https_client(self.server.local_addr(), &self.pki.ca_der)
    }

    async fn post(&self, path: &str, body: &Value) -> Value {
        post(&self.client(), path, body).await
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

async fn try_post(client: &kube::Client, path: &str, body: Vec<u8>, content_type: &str) -> Result<String, kube::Error> {
    let request = Request::post(path)
        .header("content-type", content_type)
        .body(body)
        .unwrap();
    client.request_text(request).await
}

/// Posts `body` as JSON: the answer's text, or the error (a refused handshake, an error status).
async fn try_post_json(client: &kube::Client, path: &str, body: &Value) -> Result<String, kube::Error> {
    try_post(client, path, serde_json::to_vec(body).unwrap(), "application/json").await
}

async fn post(client: &kube::Client, path: &str, body: &Value) -> Value {
    let text = try_post_json(client, path, body).await.unwrap();
    serde_json::from_str(&text).unwrap()
}

fn foo_json(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "webhook.kinformer.dev/v1",
        "kind": "Foo",
        "metadata": {"name": name, "namespace": "default", "uid": "0b6c7a3e-obj"},
        "spec": spec,
    })
}

fn review(uid: &str, operation: &str, object: Value, dry_run: bool) -> Value {
    let (object, old) = if operation == "DELETE" {
        (Value::Null, object)
    } else {
        (object, Value::Null)
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "webhook.kinformer.dev", "version": "v1", "kind": "Foo"},
            "resource": {"group": "webhook.kinformer.dev", "version": "v1", "resource": "foos"},
            "name": "a",
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": dry_run,
        }
    })
}

/// Replicas within 0..=10; zero allowed with a warning; the dry-run flag echoed in a denial of
/// the name `tell-dry-run`; a custom code for the name `teapot`.
async fn replicas_in_range(req: AdmissionRequest<v1::Foo>) -> Verdict {
    let Some(object) = req.object.as_ref() else {
        return Verdict::allowed();
    };
    match object.metadata.name.as_deref() {
        Some("tell-dry-run") => return Verdict::denied(format!("dryRun={}", req.dry_run)),
        Some("teapot") => return Verdict::errored(418, "short and stout"),
        _ => {}
    }
    match object.spec.replicas {
        0 => Verdict::allowed().with_warning("zero replicas: nothing will run"),
        1..=10 => Verdict::allowed(),
        n => Verdict::denied(format!("spec.replicas {n} is not within 0..=10")),
    }
}

const VALIDATE: &str = "/validate-webhook-kinformer-dev-v1-foo";
const MUTATE: &str = "/mutate-webhook-kinformer-dev-v1-foo";

#[tokio::test]
async fn validating_webhook_allows_denies_and_warns() {
    let running = Running::start(|server| {
        let path = server
            .register_validating(ValidatingWebhook::new(replicas_in_range))
            .unwrap();
        assert_eq!(path, VALIDATE, "controller-runtime's default path");
    });

    let allowed = running
        .post(
            VALIDATE,
            &review("uid-1", "CREATE", foo_json("a", json!({"replicas": 3})), false),
        )
        .await;
    assert_eq!(allowed["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(allowed["kind"], "AdmissionReview");
    let response = &allowed["response"];
    assert_eq!(response["uid"], "uid-1");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["status"]["code"], 200);
    assert!(response.get("warnings").is_none());
    assert!(response.get("patch").is_none());

    let denied = running
        .post(
            VALIDATE,
            &review("uid-2", "UPDATE", foo_json("a", json!({"replicas": 11})), false),
        )
        .await;
    let response = &denied["response"];
    assert_eq!(response["uid"], "uid-2");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    assert_eq!(response["status"]["reason"], "Forbidden");
    assert_eq!(response["status"]["message"], "spec.replicas 11 is not within 0..=10");

    let warned = running
        .post(
            VALIDATE,
            &review("uid-3", "CREATE", foo_json("a", json!({"replicas": 0})), false),
        )
        .await;
    assert_eq!(warned["response"]["allowed"], true);
    assert_eq!(
        warned["response"]["warnings"],
        json!(["zero replicas: nothing will run"])
    );

    let teapot = running
        .post(
            VALIDATE,
            &review("uid-4", "CREATE", foo_json("teapot", json!({"replicas": 1})), false),
        )
        .await;
    assert_eq!(teapot["response"]["allowed"], false);
    assert_eq!(teapot["response"]["status"]["code"], 418);
    assert_eq!(teapot["response"]["status"]["message"], "short and stout");

    // DELETE: the handler sees the old object, none new.
    let deleted = running
        .post(
            VALIDATE,
            &review("uid-5", "DELETE", foo_json("a", json!({"replicas": 99})), false),
        )
        .await;
    assert_eq!(deleted["response"]["allowed"], true);
    running.stop().await;
}

#[tokio::test]
async fn dry_run_reaches_the_handler_at_a_custom_path() {
    let running = Running::start(|server| {
        let path = server
            .register_validating(ValidatingWebhook::new(replicas_in_range).path("/check-foo"))
            .unwrap();
        assert_eq!(path, "/check-foo");
        let taken = server.register_validating(ValidatingWebhook::new(replicas_in_range).path("/check-foo"));
        assert!(
            matches!(taken, Err(controller::WebhookError::PathInUse { ref path }) if path == "/check-foo"),
            "{taken:?}"
        );
    });
    for dry_run in [true, false] {
        let answer = running
            .post(
                "/check-foo",
                &review(
                    "uid-d",
                    "CREATE",
                    foo_json("tell-dry-run", json!({"replicas": 1})),
                    dry_run,
                ),
            )
            .await;
        assert_eq!(answer["response"]["status"]["message"], format!("dryRun={dry_run}"));
    }
    running.stop().await;
}

#[tokio::test]
async fn mutating_webhook_answers_the_patch_of_the_typed_change() {
    let running = Running::start(|server| {
        let mutator = |mut object: v1::Foo, req: AdmissionRequest<v1::Foo>| async move {
            assert_eq!(
                req.object.as_ref().map(|o| &o.spec),
                Some(&object.spec),
                "the request carries the object"
            );
            if object.spec.replicas > 100 {
                return Err(Verdict::denied("far too many"));
            }
            object
                .metadata
                .labels
                .get_or_insert_default()
                .insert("team".into(), "core".into());
            if object.spec.replicas == 0 {
                object.spec.replicas = 1;
            }
            object.spec.image = None;
            Ok(object)
        };
        let path = server
            .register_mutating(MutatingWebhook::new(mutator).operations([Operation::Create]))
            .unwrap();
        assert_eq!(path, MUTATE);
    });

    // `spec.future` is a field `v1::Foo` does not know: the patch must leave it alone.
    let raw = foo_json("a", json!({"replicas": 0, "image": "nginx", "future": {"keep": true}}));
    let answer = running
        .post(MUTATE, &review("uid-m", "CREATE", raw.clone(), false))
        .await;
    let response = &answer["response"];
    assert_eq!(response["uid"], "uid-m");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    // `[]byte` in Go's JSON: base64.
    let patch_bytes = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        response["patch"].as_str().expect("the patch is a base64 string"),
    )
    .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch_bytes).unwrap();
    let mut patched = raw.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    let mut expected = raw;
    expected["metadata"]["labels"] = json!({"team": "core"});
    expected["spec"]["replicas"] = json!(1);
    expected["spec"].as_object_mut().unwrap().remove("image");
    assert_eq!(patched, expected);

    // Unchanged: allowed with no patch.
    let settled = foo_json("b", json!({"replicas": 2}));
    let mut settled_labelled = settled.clone();
    settled_labelled["metadata"]["labels"] = json!({"team": "core"});
    let answer = running
        .post(MUTATE, &review("uid-n", "CREATE", settled_labelled, false))
        .await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    // The handler's Err verdict is the answer.
    let answer = running
        .post(
            MUTATE,
            &review("uid-x", "CREATE", foo_json("c", json!({"replicas": 101})), false),
        )
        .await;
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["message"], "far too many");

    // DELETE has no object to change: allowed, handler not called.
    let answer = running
        .post(
            MUTATE,
            &review("uid-del", "DELETE", foo_json("a", json!({"replicas": 1})), false),
        )
        .await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none());
    running.stop().await;
}

#[tokio::test]
async fn handler_panic_and_timeout_answer_errors() {
    let running = Running::start(|server| {
        let validator = |req: AdmissionRequest<v1::Foo>| async move {
            match req.name.as_str() {
                "panic" => panic!("boom"),
                "slow" => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Verdict::allowed()
                }
                _ => Verdict::allowed(),
            }
        };
        server
            .register_validating(ValidatingWebhook::new(validator).timeout(Duration::from_millis(500)))
            .unwrap();
    });
    let mut panicking = review("uid-p", "CREATE", foo_json("x", json!({"replicas": 1})), false);
    panicking["request"]["name"] = json!("panic");
    let answer = running.post(VALIDATE, &panicking).await;
    let response = &answer["response"];
    assert_eq!(response["uid"], "uid-p");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 500);
    assert_eq!(response["status"]["message"], "panic: boom [recovered]");

    let mut slow = review("uid-s", "CREATE", foo_json("x", json!({"replicas": 1})), false);
    slow["request"]["name"] = json!("slow");
    let started = std::time::Instant::now();
    let answer = running.post(VALIDATE, &slow).await;
    let took = started.elapsed();
    let response = &answer["response"];
    assert_eq!(response["uid"], "uid-s");
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 500);
    assert_eq!(
        response["status"]["message"],
        "webhook handler did not answer within 500ms"
    );
    // The timeout, not the handler's hour: a generous margin for a loaded machine.
    assert!(took < Duration::from_secs(30), "answered after {took:?}");

    // The server still serves.
    let ok = running
        .post(
            VALIDATE,
            &review("uid-ok", "CREATE", foo_json("x", json!({"replicas": 1})), false),
        )
        .await;
    assert_eq!(ok["response"]["allowed"], true);
    let metrics = common::gather(&running.registry);
    assert_eq!(common::sample(&metrics, "controller_runtime_webhook_panics_total"), 1.0);
    running.stop().await;
}

#[tokio::test]
async fn handler_is_aborted_when_the_client_goes_away() {
    /// Signals its channel when dropped: the handler's future was dropped (its task aborted).
    struct SignalOnDrop(tokio::sync::mpsc::UnboundedSender<()>);
    impl Drop for SignalOnDrop {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (dropped_tx, mut dropped) = tokio::sync::mpsc::unbounded_channel::<()>();
    let running = Running::start(move |server| {
        let validator = move |_: AdmissionRequest<v1::Foo>| {
            let (started, dropped) = (started_tx.clone(), dropped_tx.clone());
            async move {
                let _guard = SignalOnDrop(dropped);
                started.send(()).unwrap();
                // Blocks until cancelled: the server's own timeout is far away.
                std::future::pending::<Verdict>().await
            }
        };
        server
            .register_validating(ValidatingWebhook::new(validator).timeout(Duration::from_secs(3600)))
            .unwrap();
    });
    let client = running.client();
    let body = serde_json::to_vec(&review("uid-h", "CREATE", foo_json("x", json!({"replicas": 1})), false)).unwrap();
    // The client gives up once the handler runs (as kube-apiserver at its `timeoutSeconds`):
    // the request future is dropped, and with it the connection.
    let gave_up = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            answer = try_post(&client, VALIDATE, body, "application/json") => panic!("the handler never answers: {answer:?}"),
            _ = started.recv() => {}
        }
    })
    .await;
    assert!(gave_up.is_ok(), "the handler never started");
    drop(client);
    let aborted = tokio::time::timeout(Duration::from_secs(30), dropped.recv()).await;
    assert_eq!(
        aborted,
        Ok(Some(())),
        "the handler's task was not aborted when the client went away"
    );
    running.stop().await;
}

#[tokio::test]
async fn decode_errors_answer_400_responses() {
    let running = Running::replicas_in_range();
    let client = running.client();
    let body = serde_json::to_vec(&review("uid-c", "CREATE", foo_json("a", json!({"replicas": 1})), false)).unwrap();
    let wrong_type: Value =
        serde_json::from_str(&try_post(&client, VALIDATE, body, "text/plain").await.unwrap()).unwrap();
    assert_eq!(wrong_type["response"]["allowed"], false);
    assert_eq!(wrong_type["response"]["status"]["code"], 400);
    assert_eq!(
        wrong_type["response"]["status"]["message"],
        "contentType=text/plain, expected application/json"
    );

    let empty: Value = serde_json::from_str(
        &try_post(&client, VALIDATE, Vec::new(), "application/json")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(empty["response"]["status"]["code"], 400);
    assert_eq!(empty["response"]["status"]["message"], "request body is empty");

    let garbage: Value = serde_json::from_str(
        &try_post(&client, VALIDATE, b"{not json".to_vec(), "application/json")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(garbage["response"]["allowed"], false);
    assert_eq!(garbage["response"]["status"]["code"], 400);

    // The object is not a `v1::Foo`: the uid still comes back.
    let bad_object = running
        .post(
            VALIDATE,
            &review("uid-b", "CREATE", foo_json("a", json!({"replicas": "three"})), false),
        )
        .await;
    assert_eq!(bad_object["response"]["uid"], "uid-b");
    assert_eq!(bad_object["response"]["allowed"], false);
    assert_eq!(bad_object["response"]["status"]["code"], 400);
    assert!(
        bad_object["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid type"),
        "{bad_object}"
    );

    // No webhook at this path.
    let missing = try_post(&client, "/validate-nothing", b"{}".to_vec(), "application/json").await;
    assert!(
        matches!(missing, Err(kube::Error::Api(ref s)) if s.code == 404),
        "{missing:?}"
    );
    running.stop().await;
}

fn conversion_review(uid: &str, desired: &str, objects: Vec<Value>) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects},
    })
}

#[tokio::test]
async fn conversion_round_trips_through_the_hub_and_reports_failures() {
    let running = Running::start(|server| {
        server
            .register_conversion(Conversion::<v1::Foo>::new().spoke::<v1alpha1::Foo>())
            .unwrap();
        assert!(server.has_conversion());
        let twice = server.register_conversion(Conversion::<v1::Foo>::new());
        assert!(
            matches!(twice, Err(controller::WebhookError::Conversion { .. })),
            "{twice:?}"
        );
    });
    let alpha = json!({
        "apiVersion": "webhook.kinformer.dev/v1alpha1",
        "kind": "Foo",
        "metadata": {"name": "a", "namespace": "default", "uid": "u-1", "resourceVersion": "7", "labels": {"x": "y"}},
        "spec": {"size": "4"},
    });
    let to_v1 = running
        .post(
            "/convert",
            &conversion_review(
                "c-1",
                "webhook.kinformer.dev/v1",
                vec![alpha.clone(), foo_json("b", json!({"replicas": 2}))],
            ),
        )
        .await;
    assert_eq!(to_v1["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(to_v1["kind"], "ConversionReview");
    let response = &to_v1["response"];
    assert_eq!(response["uid"], "c-1");
    assert_eq!(response["result"]["status"], "Success");
    let converted = response["convertedObjects"].as_array().unwrap();
    assert_eq!(converted.len(), 2);
    assert_eq!(converted[0]["apiVersion"], "webhook.kinformer.dev/v1");
    assert_eq!(converted[0]["kind"], "Foo");
    assert_eq!(converted[0]["spec"], json!({"replicas": 4}));
    assert_eq!(converted[0]["metadata"], alpha["metadata"], "metadata kept");
    assert_eq!(
        converted[1],
        foo_json("b", json!({"replicas": 2})),
        "already v1: as it came"
    );

    let back = running
        .post(
            "/convert",
            &conversion_review("c-2", "webhook.kinformer.dev/v1alpha1", vec![converted[0].clone()]),
        )
        .await;
    assert_eq!(back["response"]["result"]["status"], "Success");
    assert_eq!(back["response"]["convertedObjects"], json!([alpha]), "round trip");

    // A spoke's conversion fails: the whole review fails with its message.
    let mut bad = alpha.clone();
    bad["spec"]["size"] = json!("many");
    let failed = running
        .post(
            "/convert",
            &conversion_review("c-3", "webhook.kinformer.dev/v1", vec![bad]),
        )
        .await;
    assert_eq!(failed["response"]["uid"], "c-3");
    assert_eq!(failed["response"]["result"]["status"], "Failure");
    let message = failed["response"]["result"]["message"].as_str().unwrap();
    assert!(message.contains(r#"size "many""#), "{message}");
    assert_eq!(failed["response"]["convertedObjects"], json!([]));

    // A version nobody registered.
    let unknown = running
        .post(
            "/convert",
            &conversion_review("c-4", "webhook.kinformer.dev/v2", vec![alpha]),
        )
        .await;
    assert_eq!(unknown["response"]["result"]["status"], "Failure");
    assert_eq!(
        unknown["response"]["result"]["message"],
        "no conversion to webhook.kinformer.dev/v2 Foo"
    );

    // Not a ConversionReview at all: HTTP 400, as controller-runtime.
    let garbage = try_post(&running.client(), "/convert", b"[]".to_vec(), "application/json").await;
    assert!(
        matches!(garbage, Err(kube::Error::Api(ref s)) if s.code == 400),
        "{garbage:?}"
    );
    running.stop().await;
}

#[tokio::test]
async fn rotated_certificate_is_served_without_restart() {
    let running = Running::replicas_in_range();
    let body = review("uid-r", "CREATE", foo_json("a", json!({"replicas": 1})), false);
    let old_ca = running.pki.ca_der.clone();
    assert_eq!(running.post(VALIDATE, &body).await["response"]["allowed"], true);

    let new = Pki::write(&running.dir.0, "rotated CA");
    let addr = running.server.local_addr();
    // A new client, so a new connection and handshake: the reload happens in that handshake,
    // so the first attempt is served with the new certificate.
    let client = https_client(addr, &new.ca_der);
    let attempt = try_post_json(&client, VALIDATE, &body).await;
    assert!(
        attempt.is_ok(),
        "a client trusting only the new CA is served: {attempt:?}"
    );
    assert!(!running.task.is_finished(), "the same server kept running");
    let stale = https_client(addr, &old_ca);
    let refused = try_post_json(&stale, VALIDATE, &body).await;
    assert!(refused.is_err(), "a client trusting only the old CA is refused now");
    running.stop().await;
}

#[tokio::test]
async fn certificate_rewritten_in_place_with_the_same_size_and_mtime_is_served() {
    let running = Running::replicas_in_range();
    let body = review("uid-r", "CREATE", foo_json("a", json!({"replicas": 1})), false);
    assert_eq!(running.post(VALIDATE, &body).await["response"]["allowed"], true);

    // Right after the first: same sizes, same modification times, same inodes.
    let new = Pki::rewrite_same_size_in_place(&running.dir.0, "test CA");
    let client = https_client(running.server.local_addr(), &new.ca_der);
    let attempt = try_post_json(&client, VALIDATE, &body).await;
    assert!(
        attempt.is_ok(),
        "the first handshake after the rewrite serves it: {attempt:?}"
    );
    running.stop().await;
}

#[tokio::test]
async fn manager_serves_webhooks_with_metrics() {
    let envtest = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let dir = TempDir::new();
    let pki = Pki::write(&dir.0, "manager CA");
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let manager = Manager::builder(envtest.client())
        .metrics_addr(local)
        .no_health_probe_server()
        .webhook_server(WebhookServerConfig::default().addr(local).cert_dir(&dir.0))
        .build()
        .unwrap();
    let server = manager.webhook_server().unwrap().clone();
    server
        .register_validating(ValidatingWebhook::new(replicas_in_range))
        .unwrap();
    let (webhook_addr, metrics_addr) = (manager.webhook_addr().unwrap(), manager.metrics_addr().unwrap());
    let stop = CancellationToken::new();
    let run = tokio::spawn(manager.run(stop.clone()));

    let client = https_client(webhook_addr, &pki.ca_der);
    let denied = post(
        &client,
        VALIDATE,
        &review("uid-mgr", "CREATE", foo_json("a", json!({"replicas": 50})), false),
    )
    .await;
    assert_eq!(denied["response"]["allowed"], false);

    let (status, text) = common::http_get(metrics_addr, "/metrics").await;
    assert_eq!(status, 200);
    let labels = format!("{{code=\"200\",webhook=\"{VALIDATE}\"}}");
    assert_eq!(
        common::sample(&text, &format!("controller_runtime_webhook_requests_total{labels}")),
        1.0,
        "{text}"
    );
    assert_eq!(
        common::sample(
            &text,
            &format!("controller_runtime_webhook_latency_seconds_count{{webhook=\"{VALIDATE}\"}}")
        ),
        1.0
    );
    assert!(
        text.contains(&format!(
            "controller_runtime_webhook_requests_in_flight{{webhook=\"{VALIDATE}\"}} 0"
        )),
        "{text}"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test]
async fn manager_fails_without_a_certificate() {
    let envtest = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let dir = TempDir::new();
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let manager = Manager::builder(envtest.client())
        .no_http_servers()
        .webhook_server(WebhookServerConfig::default().addr(local).cert_dir(&dir.0))
        .build()
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(60), manager.run(CancellationToken::new()))
        .await
        .expect("run returns");
    let error = result.unwrap_err();
    assert!(
        matches!(
            error,
            controller::ManagerError::Webhook(controller::WebhookError::Certificate { .. })
        ),
        "{error}"
    );
}
