//! The example binaries end to end: the sample-controller demo converges and says so (its
//! index ConfigMap and its webhooks included), kubectl sees what a `--keep-running` demo left
//! behind (is denied an invalid Foo, reads Foos in v1alpha1), the README's walkthrough is the
//! `greeter` binary verbatim, and `greeter` reconciles against an envtest it reaches through
//! KUBECONFIG.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};

/// Kills the child if the test ends early.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An exported KUBECONFIG (here one that points nowhere) does not send the demo to a cluster: it
/// runs on its embedded server, converges, and says why it ignored KUBECONFIG.
#[test]
fn an_exported_kubeconfig_alone_keeps_the_demo_on_its_embedded_server() {
    let dir = temp_dir("demo-kubeconfig-ignored");
    let out = Command::new(env!("CARGO_BIN_EXE_sample-controller"))
        .args(["--timeout", "90"])
        .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.contains("▸ KUBECONFIG is set but not used: the demo runs on its embedded API server"),
        "no line about the ignored KUBECONFIG:\n{stdout}"
    );
    assert!(
        stdout.contains("▸ caches synced"),
        "the embedded demo did not run:\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sample_controller_demo_converges_and_prints_its_summary() {
    let out = Command::new(env!("CARGO_BIN_EXE_sample-controller"))
        .args(["--embedded", "--timeout", "90"])
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{stderr}", out.status);
    for line in [
        "▸ caches synced",
        "converged: 4 Foos (foo-1, foo-2, foo-3, foo-5), each with its Deployment scaled and available",
        "recreated: Deployment foo-3 (deleted behind the controller's back)",
        "conflict: Foo conflict reported with Event ErrResourceExists; Deployment taken left untouched",
        "✓ foo-4 gone after its finalizer removed its index entry; its Deployment garbage-collected",
        // The validating webhook's denial as the client gets it, and the other two webhooks.
        "✓ denied: admission webhook \"vfoo-v1.samplecontroller.k8s.io\" denied the request: \
         spec.replicas must be between 0 and 10, got 11",
        "✓ foo-1 labelled samplecontroller.k8s.io/managed-by=sample-controller by the mutating webhook; \
         foo-2 read as v1alpha1: spec.size=2",
        // The index's final content, read back from the server after the scenario: the live,
        // synced Foos' entries only (foo-4's removed by the finalizer's cleanup).
        "index: ConfigMap foo-index holds foo-1 (deployment=foo-1 replicas=1), \
         foo-2 (deployment=foo-2 replicas=7), foo-3 (deployment=foo-3 replicas=3), \
         foo-5 (deployment=foo-5 replicas=5); none for foo-4 (removed by its finalizer before it \
         went away) or conflict (no Deployment of its own)",
        "RESULT: converged",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    // One readable line per reconcile, and the summary table's rows.
    assert!(stdout.contains("reconcile foo        default/foo-1"), "{stdout}");
    assert!(
        stdout.contains("default/conflict             error: Resource \"taken\" already exists"),
        "{stdout}"
    );
    for row in [
        "│ Foos",
        "│ Deployments",
        "│ Index entries            │        4 │",
        "│ reconciles",
        "│ errors",
        "│ p50 reconcile latency",
        "│ p99 reconcile latency",
    ] {
        assert!(stdout.contains(row), "missing {row:?}:\n{stdout}");
    }
}

/// The demo at its default log filter (RUST_LOG unset): a successful run logs no ERROR line
/// (the conflicting Foo's retried error is a WARN naming the controller and the key; a 409 or
/// 404 race with the cache is a requeue, not an error), and prints one line per reconcile with
/// its key and result, as many as the summary counts.
#[test]
fn sample_controller_demo_logs_no_error_and_one_line_per_reconcile() {
    let out = Command::new(env!("CARGO_BIN_EXE_sample-controller"))
        .args(["--embedded", "--timeout", "90"])
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{stderr}", out.status);
    let errors: Vec<&str> = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|l| l.contains(" ERROR "))
        .collect();
    assert!(errors.is_empty(), "ERROR lines:\n{}", errors.join("\n"));
    // The conflicting Foo's error, at the default level, names its controller and key itself.
    assert!(
        stderr.lines().any(|l| l.contains(" WARN ")
            && l.contains("reconcile failed")
            && l.contains("controller=foo")
            && l.contains("key=default/conflict")
            && l.contains("Resource \"taken\" already exists")),
        "no WARN line naming controller=foo key=default/conflict:\n{stderr}"
    );

    // The lines above the summary table are the reconciles it counts (printed under one lock);
    // the conflicting Foo's retries may go on below it until the demo stops.
    let (above, _) = stdout
        .split_once("  ┌")
        .unwrap_or_else(|| panic!("no summary table:\n{stdout}"));
    let lines: Vec<&str> = above.lines().filter(|l| l.starts_with("  reconcile ")).collect();
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (controller, key, result) = (words[1], words[2], words[3].trim_end_matches(':'));
        assert_eq!(controller, "foo", "{line}");
        assert!(
            key.starts_with("default/") && key.len() > "default/".len(),
            "no key: {line}"
        );
        assert!(
            ["success", "requeue", "requeue_after", "error"].contains(&result),
            "no result: {line}"
        );
        assert!(line.ends_with(" ms)"), "no duration: {line}");
        // Only the Foo whose Deployment belongs to someone else fails; a race with the cache
        // (e.g. 409 AlreadyExists for a Deployment the cache has not seen yet) is a requeue.
        if result == "error" {
            assert_eq!(key, "default/conflict", "{line}");
        }
    }
    let counted: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("  │ reconciles"))
        .and_then(|row| row.trim_matches(|c: char| c == '│' || c.is_whitespace()).parse().ok())
        .unwrap_or_else(|| panic!("no reconciles row:\n{stdout}"));
    assert_eq!(lines.len(), counted, "one line per reconcile:\n{stdout}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("default/foo-1") && l.contains(" success ")),
        "{stdout}"
    );
}

#[test]
fn sample_controller_fails_with_a_message_when_it_cannot_converge_in_time() {
    let out = Command::new(env!("CARGO_BIN_EXE_sample-controller"))
        .args(["--embedded", "--quiet", "--timeout", "0"])
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did not converge: timed out waiting for"), "{stderr}");
}

fn kubectl(home: &Path, kubeconfig: &str, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .args(args)
        .args(["--kubeconfig", kubeconfig, "--request-timeout=20s"])
        .env("HOME", home)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kubectl_sees_the_foos_deployments_and_events_of_a_keep_running_demo() {
    if !envtest::kubectl::available().expect("kubectl is required here") {
        eprintln!("SKIPPED: kubectl is not installed (CI installs v1.32)");
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_sample-controller"))
        .args(["--embedded", "--quiet", "--keep-running"])
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = Guard(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut kubeconfig = None;
    let mut seen = Vec::new();
    while kubeconfig.is_none() {
        let line = rx
            .recv_timeout(Duration::from_secs(90))
            .unwrap_or_else(|_| panic!("no kubeconfig line: {seen:?}"));
        kubeconfig = line.strip_prefix("KUBECONFIG=").map(str::to_owned);
        seen.push(line);
    }
    assert!(seen.iter().any(|l| l.starts_with("RESULT: converged")), "{seen:?}");
    let kubeconfig = kubeconfig.unwrap();
    let home = temp_dir("sample-controller-kubectl");

    let foos = kubectl(&home, &kubeconfig, &["get", "foos", "-o", "name"]);
    for foo in [
        "foo.samplecontroller.k8s.io/foo-1",
        "foo.samplecontroller.k8s.io/conflict",
    ] {
        assert!(foos.contains(foo), "{foos}");
    }
    assert!(!foos.contains("foo-4"), "{foos}");
    let deployments = kubectl(&home, &kubeconfig, &["get", "deployments", "-o", "name"]);
    for deployment in [
        "deployment.apps/foo-1",
        "deployment.apps/foo-3",
        "deployment.apps/taken",
    ] {
        assert!(deployments.contains(deployment), "{deployments}");
    }
    // kubectl's tables show a few columns of each kind: read the fields from YAML.
    let all = kubectl(
        &home,
        &kubeconfig,
        &["get", "foos,deployments,events.events.k8s.io", "-o", "yaml"],
    );
    assert!(
        all.contains("foo-5") && all.contains("Synced") && all.contains("ErrResourceExists"),
        "{all}"
    );
    // The shared index: one entry per synced Foo, foo-4's removed by the finalizer's cleanup.
    let index = kubectl(&home, &kubeconfig, &["get", "configmap", "foo-index", "-o", "json"]);
    let index: serde_json::Value = serde_json::from_str(&index).unwrap();
    assert_eq!(
        index["data"],
        serde_json::json!({
            "foo-1": "deployment=foo-1 replicas=1",
            "foo-2": "deployment=foo-2 replicas=7",
            "foo-3": "deployment=foo-3 replicas=3",
            "foo-5": "deployment=foo-5 replicas=5",
        }),
        "{index}"
    );
    assert!(
        index["metadata"]["ownerReferences"].is_null(),
        "shared, so owned by no Foo: {index}"
    );
    // kubectl apply of an invalid Foo prints the validating webhook's message, as the demo says.
    let invalid = home.join("too-big.json");
    let invalid_foo = serde_json::json!({
        "apiVersion": "samplecontroller.k8s.io/v1", "kind": "Foo", "metadata": {"name": "too-big"},
        "spec": {"deploymentName": "too-big", "replicas": 11},
    });
    std::fs::write(&invalid, invalid_foo.to_string()).unwrap();
    let out = Command::new("kubectl")
        .args(["apply", "-f"])
        .arg(&invalid)
        .args(["--kubeconfig", &kubeconfig, "--request-timeout=20s"])
        .env("HOME", &home)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "admission webhook \"vfoo-v1.samplecontroller.k8s.io\" denied the request: \
             spec.replicas must be between 0 and 10, got 11"
        ),
        "{stderr}"
    );
    // The Foos in v1alpha1, converted by the webhook: `size` there, and its printer column.
    let alphas = kubectl(
        &home,
        &kubeconfig,
        &["get", "foos.v1alpha1.samplecontroller.k8s.io", "foo-5", "-o", "json"],
    );
    let alpha: serde_json::Value = serde_json::from_str(&alphas).unwrap();
    assert_eq!(alpha["apiVersion"], "samplecontroller.k8s.io/v1alpha1", "{alpha}");
    assert_eq!(
        alpha["spec"],
        serde_json::json!({"deploymentName": "foo-5", "size": 5}),
        "{alpha}"
    );
    let table = kubectl(&home, &kubeconfig, &["get", "foos.v1alpha1.samplecontroller.k8s.io"]);
    assert!(
        table.lines().next().is_some_and(|header| header.contains("SIZE")),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn a_metrics_port_in_use_names_the_address_the_cause_and_the_flag() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let dir = temp_dir("port-in-use");
    let output = Command::new(env!("CARGO_BIN_EXE_sample-controller"))
        .args(["--metrics-addr", &addr])
        .env("HOME", &dir)
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the demo ran on a port in use: {stderr}");
    let line = stderr
        .lines()
        .find(|line| line.starts_with("sample-controller: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    for part in [addr.as_str(), "metrics", "Address already in use", "--metrics-addr"] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
    drop(held);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn readme_walkthrough_is_the_greeter_binary() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let greeter = include_str!("../src/bin/greeter.rs");
    let block = readme
        .split("<!-- walkthrough: examples/src/bin/greeter.rs -->\n```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```\n").next())
        .expect("README has the walkthrough block");
    assert_eq!(
        block, greeter,
        "README's walkthrough and examples/src/bin/greeter.rs differ"
    );
    // It names only the crates the README says a controller needs (the examples crate has
    // more, so this is checked on the text).
    for line in greeter.lines().filter(|l| l.starts_with("use ")) {
        let root = line.trim_start_matches("use ").split("::").next().unwrap_or_default();
        assert!(
            ["kinformer", "serde", "schemars", "std", "tokio"].contains(&root),
            "{line}"
        );
    }
    for other in ["kube::", "k8s_openapi::", "tokio_util::", "serde_json::"] {
        let bare = greeter
            .match_indices(other)
            .filter(|(i, _)| !greeter[..*i].ends_with("kinformer::"));
        assert_eq!(bare.count(), 0, "{other} used other than through kinformer");
    }
}

#[tokio::test]
async fn greeter_reconciles_against_the_cluster_of_its_kubeconfig() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let dir = temp_dir("greeter");
    let kubeconfig = dir.join("kubeconfig");
    env.write_kubeconfig(&kubeconfig).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_greeter"))
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", &dir)
        // The default filter of kinformer::init_logging: it must show the reconcile's result.
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    // Read on a thread of its own; the test's runtime also serves envtest, so it must not block.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let _guard = Guard(child);
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Greeting");
    let resource = ApiResource::from_gvk(&gvk);
    let greetings: Api<DynamicObject> = Api::namespaced_with(env.client(), "default", &resource);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut greeting = DynamicObject::new("hello", &resource);
    greeting.data = serde_json::json!({"spec": {"message": "hi there"}});
    // The greeter installs its CRD at start-up.
    while greetings.create(&PostParams::default(), &greeting).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Greeting CRD never got served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    loop {
        let cm = cms.get_opt("hello").await.unwrap();
        let message = cm.as_ref().and_then(|cm| cm.data.as_ref()?.get("message").cloned());
        if message.as_deref() == Some("hi there") {
            let owner = &cm.unwrap().metadata.owner_references.unwrap()[0];
            assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Greeting", "hello"));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no ConfigMap for the Greeting");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One line per reconcile on stderr with controller, key and result, at the default filter.
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, lines.recv()).await {
            Ok(Some(line)) => {
                if line.contains("reconciled")
                    && line.contains("controller=greeter")
                    && line.contains("key=default/hello")
                    && line.contains("result=\"success\"")
                {
                    break;
                }
                seen.push(line);
            }
            Ok(None) | Err(_) => panic!("no reconcile result line on stderr; it printed:\n{}", seen.join("\n")),
        }
    }
    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The greeter's client (kinformer's `client::infer`, as the README's walkthrough builds it)
/// names the server it could not reach: kube's own `Client::try_default()` would report only
/// hyper's "tcp connect error: Connection refused".
#[test]
fn greeter_names_the_server_it_cannot_reach() {
    let dir = temp_dir("greeter-unreachable");
    let kubeconfig = dir.join("kubeconfig");
    // Port 9 (discard) on loopback: nothing listens there, the connection is refused.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n\
         clusters: [{name: nowhere, cluster: {server: \"https://127.0.0.1:9\"}}]\n\
         contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]\n\
         users: [{name: nobody, user: {token: none}}]\n",
    )
    .unwrap();
    let mut child = Guard(
        Command::new(env!("CARGO_BIN_EXE_greeter"))
            .env("KUBECONFIG", &kubeconfig)
            .env("HOME", &dir)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the greeter did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "the greeter succeeded without a server: {stderr}");
    assert!(
        stderr.contains("https://127.0.0.1:9"),
        "the error does not name the server: {stderr}"
    );
    assert!(
        stderr.to_lowercase().contains("connection refused"),
        "the error does not name the cause: {stderr}"
    );
}

#[tokio::test]
async fn sample_controller_runs_against_the_cluster_of_its_kubeconfig_with_leader_election() {
    use examples::sample_controller::{FINALIZER, Foo, FooSpec, INDEX};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::DeleteParams;
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let dir = temp_dir("sample-controller-cluster");
    let kubeconfig = dir.join("kubeconfig");
    env.write_kubeconfig(&kubeconfig).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sample-controller"))
        .args(["--metrics-addr", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kubeconfig)
        .env("HOME", &dir)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _guard = Guard(child);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let foos: Api<Foo> = Api::namespaced(env.client(), "default");
    let foo = Foo::new(
        "remote",
        FooSpec {
            deployment_name: "remote-web".into(),
            replicas: Some(2),
        },
    );
    // The controller installs the CRD at start-up.
    while foos.create(&PostParams::default(), &foo).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the Foo CRD never got served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deployments: Api<Deployment> = Api::namespaced(env.client(), "default");
    loop {
        let replicas = deployments
            .get_opt("remote-web")
            .await
            .unwrap()
            .and_then(|d| d.spec.and_then(|s| s.replicas));
        if replicas == Some(2) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no Deployment for the Foo");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // It leads through a Lease, as it must against a real cluster.
    let lease = Api::<Lease>::namespaced(env.client(), "default")
        .get("sample-controller")
        .await
        .unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert!(!holder.is_empty(), "the Lease has no holder");
    // The leader keeps the index and its finalizer on the Foo...
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let entry = |cm: Option<ConfigMap>| cm.and_then(|cm| cm.data?.get("remote").cloned());
    loop {
        let indexed = entry(cms.get_opt(INDEX).await.unwrap());
        let finalized = foos
            .get("remote")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap_or_default();
        if indexed.as_deref() == Some("deployment=remote-web replicas=2") && finalized.iter().any(|f| f == FINALIZER) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no index entry or finalizer: {indexed:?} {finalized:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ...and on deletion removes the entry, then the finalizer, so the Foo goes away.
    foos.delete("remote", &DeleteParams::default()).await.unwrap();
    while foos.get_opt("remote").await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deleted Foo stayed: its finalizer was not removed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        entry(cms.get_opt(INDEX).await.unwrap()),
        None,
        "the deleted Foo's index entry stayed"
    );
    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
