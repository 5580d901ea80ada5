//! What the machine's kubectl shows against envtest (issue #27): `kubectl get` prints
//! kube-apiserver's columns for Pods, Deployments and Events and a CRD's printer columns, with
//! the priority-1 ones only under `-o wide`; an Event recorded through `events.k8s.io/v1` is
//! listed by `kubectl get events` and shown in `kubectl describe`'s Events section.
//! Skipped (with a message) only when kubectl is not installed.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs kubectl (off the runtime's workers) and returns its stdout; fails the test on an error.
async fn kubectl(home: &Path, args: &[&str]) -> String {
    let home = home.to_owned();
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new("kubectl")
            .args(&args)
            .arg("--request-timeout=20s")
            .env("HOME", &home)
            .env("KUBECONFIG", home.join("kubeconfig"))
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
    .await
    .unwrap()
}

/// The output's lines with runs of spaces collapsed to one (kubectl pads columns).
fn lines(out: &str) -> Vec<String> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// The header line and the line of the row starting with `first_cell`.
fn header_and_row(out: &str, first_cell: &str) -> (String, String) {
    let lines = lines(out);
    let row = lines
        .iter()
        .find(|l| l.split(' ').next() == Some(first_cell))
        .unwrap_or_else(|| panic!("no row {first_cell} in:\n{out}"))
        .clone();
    (lines[0].clone(), row)
}

fn temp_home() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("envtest-kubectl-view-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ago(seconds: i64) -> String {
    Timestamp::from_second(Timestamp::now().as_second() - seconds)
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_and_describe_show_what_a_cluster_shows() {
    if !envtest::kubectl::available().expect("kubectl is required here") {
        eprintln!("SKIPPED: kubectl is not installed on this machine");
        return;
    }
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let home = temp_home();
    env.write_kubeconfig(home.join("kubeconfig")).unwrap();
    let client = env.client();
    let pp = PostParams::default();

    // A Pod: one container ready, one crash-looping after three restarts.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web-0"}, "spec": {
        "nodeName": "node-a",
        "containers": [{"name": "app", "image": "nginx:1.27"}, {"name": "sidecar", "image": "busybox"}]}}))
    .unwrap();
    pods.create(&pp, &pod).await.unwrap();
    let status = json!({"status": {"phase": "Running", "podIP": "10.1.2.3", "podIPs": [{"ip": "10.1.2.3"}],
        "containerStatuses": [
            {"name": "app", "image": "nginx:1.27", "imageID": "", "ready": true, "restartCount": 0,
             "state": {"running": {"startedAt": ago(60)}}},
            {"name": "sidecar", "image": "busybox", "imageID": "", "ready": false, "restartCount": 3,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": {"exitCode": 1, "finishedAt": ago(300)}}}]}});
    pods.patch_status("web-0", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();

    let (header, row) = header_and_row(&kubectl(&home, &["get", "pods"]).await, "web-0");
    assert_eq!(header, "NAME READY STATUS RESTARTS AGE");
    assert!(row.starts_with("web-0 1/2 CrashLoopBackOff 3 (5m"), "{row}");
    assert!(row.contains(" ago) "), "{row}");
    let (header, row) = header_and_row(&kubectl(&home, &["get", "pods", "-o", "wide"]).await, "web-0");
    assert_eq!(
        header,
        "NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES"
    );
    assert!(row.ends_with(" 10.1.2.3 node-a <none> <none>"), "{row}");

    // A Deployment with 2 of 3 replicas ready.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let deployment: Deployment = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
        "replicas": 3, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}}))
    .unwrap();
    let deployment = deployments.create(&pp, &deployment).await.unwrap();
    let status = json!({"status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
    deployments
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let (header, row) = header_and_row(&kubectl(&home, &["get", "deployments"]).await, "web");
    assert_eq!(header, "NAME READY UP-TO-DATE AVAILABLE AGE");
    assert!(row.starts_with("web 2/3 3 2 "), "{row}");
    let (header, row) = header_and_row(&kubectl(&home, &["get", "deploy", "-o", "wide"]).await, "web");
    assert_eq!(header, "NAME READY UP-TO-DATE AVAILABLE AGE CONTAINERS IMAGES SELECTOR");
    assert!(row.ends_with(" web nginx:1.27 app=web"), "{row}");

    // A CRD with printer columns, one of them priority 1.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1}]}]}}))
    .unwrap();
    crds.create(&pp, &crd).await.unwrap();
    let widgets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        },
    );
    let widget: DynamicObject = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 7}, "status": {"phase": "Ready"}}))
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Err(e) = widgets.create(&pp, &widget).await {
        assert!(tokio::time::Instant::now() < deadline, "widgets never served: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (header, row) = header_and_row(&kubectl(&home, &["get", "widgets"]).await, "w1");
    assert_eq!(header, "NAME SIZE");
    assert_eq!(row, "w1 7");
    let (header, row) = header_and_row(&kubectl(&home, &["get", "widgets", "-o", "wide"]).await, "w1");
    assert_eq!(header, "NAME SIZE PHASE");
    assert_eq!(row, "w1 7 Ready");

    // An Event recorded through events.k8s.io/v1, as the controller's EventRecorder records.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let event: Event = serde_json::from_value(json!({"metadata": {"name": "web.scaled"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "kinformer.dev/website",
        "reportingInstance": "website-0", "action": "Scale", "reason": "ScalingUp", "type": "Normal",
        "note": "Scaled up replica set web-1 to 3",
        "regarding": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default",
            "name": "web", "uid": deployment.metadata.uid.clone().unwrap()}}))
    .unwrap();
    events.create(&pp, &event).await.unwrap();

    // The same store through core v1, with kube-apiserver's field mapping.
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let seen = core.get("web.scaled").await.unwrap();
    assert_eq!(seen.message.as_deref(), Some("Scaled up replica set web-1 to 3"));
    assert_eq!(seen.involved_object.name.as_deref(), Some("web"));
    assert_eq!(seen.reporting_component.as_deref(), Some("kinformer.dev/website"));
    let selected = core
        .list(&ListParams::default().fields("involvedObject.kind=Deployment,involvedObject.name=web"))
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 1);
    let back = events.get("web.scaled").await.unwrap();
    assert_eq!(back.note, event.note, "read back through events.k8s.io/v1 unchanged");
    assert_eq!(back.regarding, event.regarding);

    let out = kubectl(&home, &["get", "events"]).await;
    let all = lines(&out);
    let (header, row) = (
        all[0].clone(),
        all.iter()
            .find(|l| l.contains("ScalingUp"))
            .unwrap_or_else(|| panic!("no event in:\n{out}"))
            .clone(),
    );
    assert_eq!(header, "LAST SEEN TYPE REASON OBJECT MESSAGE");
    assert!(
        row.ends_with(" Normal ScalingUp deployment/web Scaled up replica set web-1 to 3"),
        "{row}"
    );

    let described = kubectl(&home, &["describe", "deployment", "web"]).await;
    let section = described
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Events section:\n{described}"));
    let section = lines(section);
    assert_eq!(section[0], "Type Reason Age From Message", "{described}");
    assert!(
        section.iter().any(|l| l.starts_with("Normal ScalingUp ")
            && l.ends_with(" kinformer.dev/website Scaled up replica set web-1 to 3")),
        "{described}"
    );

    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&home);
}
