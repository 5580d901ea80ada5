//! The machine's kubectl against the `kinformer-apiserver` binary: discovery, protobuf create (the
//! generators of every built-in kind envtest decodes, and run),
//! OpenAPI-validated apply of a CRD and a custom object, strict field validation, `scale`, label,
//! delete, and `get --watch`.
//! Skipped (with a message) only when kubectl is not installed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Kills the child (by its own handle) if the test ends early.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kubectl(home: &Path, args: &[&str]) -> Output {
    Command::new("kubectl")
        .args(args)
        .arg("--request-timeout=20s")
        .env("HOME", home)
        .env("KUBECONFIG", home.join("kubeconfig"))
        .output()
        .expect("run kubectl")
}

fn ok(home: &Path, args: &[&str]) -> String {
    let out = kubectl(home, args);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl get <kind> <name> -o jsonpath=<path>`.
fn jsonpath(home: &Path, kind: &str, name: &str, path: &str) -> String {
    ok(home, &["get", kind, name, "-o", &format!("jsonpath={path}")])
}

fn temp_home() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("envtest-kubectl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            description: What the widget should be.
            properties:
              size: {type: integer, minimum: 0, description: How big the widget is.}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
    subresources: {status: {}}
"#;

const WIDGET: &str = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n";

const SSA_CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ssa}\ndata:\n  a: one\n  b: two\n";

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: 'nginx:1.27'}]}
";

#[test]
fn kubectl_works_against_the_binary() {
    if !envtest::kubectl::available().expect("kubectl is required here") {
        eprintln!("SKIPPED: kubectl is not installed on this machine");
        return;
    }
    let home = temp_home();
    let mut server = Guard(
        Command::new(env!("CARGO_BIN_EXE_kinformer-apiserver"))
            .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
            .arg(home.join("kubeconfig"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start kinformer-apiserver"),
    );
    let mut url = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    assert!(url.starts_with("https://127.0.0.1:"), "TLS by default: {url}");

    let ns = ok(&home, &["get", "ns"]);
    assert!(ns.contains("default") && ns.contains("kube-system"), "{ns}");

    ok(&home, &["create", "configmap", "c1", "--from-literal=a=b"]);
    let cm: serde_json::Value = serde_json::from_str(&ok(&home, &["get", "cm", "c1", "-o", "json"])).unwrap();
    assert_eq!(cm["data"]["a"], "b");
    assert_eq!(cm["metadata"]["namespace"], "default");

    std::fs::write(home.join("crd.yaml"), CRD).unwrap();
    std::fs::write(home.join("w.yaml"), WIDGET).unwrap();
    ok(&home, &["apply", "-f", home.join("crd.yaml").to_str().unwrap()]);
    ok(&home, &["apply", "-f", home.join("w.yaml").to_str().unwrap()]);
    assert!(ok(&home, &["get", "wd"]).contains("w1"));
    std::fs::write(home.join("w.yaml"), WIDGET.replace("size: 3", "size: 4")).unwrap();
    ok(&home, &["apply", "-f", home.join("w.yaml").to_str().unwrap()]);
    assert_eq!(jsonpath(&home, "widget", "w1", "{.spec.size}"), "4");

    // Validation: kubectl sends fieldValidation=Strict, so an unknown field is refused as by
    // kube-apiserver, and a bad label value is a 422 naming the field.
    std::fs::write(home.join("deploy.yaml"), DEPLOYMENT).unwrap();
    ok(&home, &["apply", "-f", home.join("deploy.yaml").to_str().unwrap()]);
    std::fs::write(
        home.join("bad.yaml"),
        DEPLOYMENT.replace("replicas: 1", "replicas: 1\n  replicaz: 2"),
    )
    .unwrap();
    let refused = kubectl(&home, &["apply", "-f", home.join("bad.yaml").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("unknown field \"spec.replicaz\""),
        "{stderr}"
    );
    let refused = kubectl(
        &home,
        &[
            "patch",
            "deploy",
            "web",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"tier":"not valid"}}}"#,
        ],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("metadata.labels: Invalid value"),
        "{stderr}"
    );
    // kubectl's create generators and run post protobuf for built-in kinds.
    ok(
        &home,
        &[
            "create",
            "deployment",
            "gen",
            "--image=nginx:1.27",
            "--replicas=2",
            "--port=80",
        ],
    );
    let generated: serde_json::Value =
        serde_json::from_str(&ok(&home, &["get", "deploy", "gen", "-o", "json"])).unwrap();
    assert_eq!(generated["spec"]["replicas"], 2);
    assert_eq!(generated["spec"]["selector"]["matchLabels"]["app"], "gen");
    let container = &generated["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        (container["name"].as_str(), container["image"].as_str()),
        (Some("nginx"), Some("nginx:1.27"))
    );
    assert_eq!(container["ports"][0]["containerPort"], 80);
    assert_eq!(
        generated["spec"]["strategy"]["type"], "RollingUpdate",
        "defaulted after decoding"
    );
    // (No `-- command`: the helper's own flags follow the arguments.)
    ok(&home, &["create", "job", "once", "--image=busybox:1"]);
    let job: serde_json::Value = serde_json::from_str(&ok(&home, &["get", "job", "once", "-o", "json"])).unwrap();
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["image"], "busybox:1");
    assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");
    ok(
        &home,
        &[
            "create",
            "cronjob",
            "nightly",
            "--image=busybox:1",
            "--schedule=0 3 * * *",
        ],
    );
    assert_eq!(jsonpath(&home, "cronjob", "nightly", "{.spec.schedule}"), "0 3 * * *");
    ok(&home, &["create", "service", "clusterip", "gen", "--tcp=80:8080"]);
    let svc: serde_json::Value = serde_json::from_str(&ok(&home, &["get", "svc", "gen", "-o", "json"])).unwrap();
    assert_eq!(
        (
            svc["spec"]["ports"][0]["port"].as_i64(),
            svc["spec"]["ports"][0]["targetPort"].as_i64()
        ),
        (Some(80), Some(8080))
    );
    ok(
        &home,
        &["create", "role", "reader", "--verb=get,list", "--resource=pods"],
    );
    ok(
        &home,
        &["create", "rolebinding", "reader", "--role=reader", "--user=alice"],
    );
    assert_eq!(jsonpath(&home, "rolebinding", "reader", "{.roleRef.name}"), "reader");
    ok(
        &home,
        &["create", "clusterrole", "viewer", "--verb=get", "--resource=nodes"],
    );
    ok(
        &home,
        &[
            "create",
            "clusterrolebinding",
            "viewer",
            "--clusterrole=viewer",
            "--group=ops",
        ],
    );
    assert_eq!(
        jsonpath(&home, "clusterrolebinding", "viewer", "{.subjects[0].name}"),
        "ops"
    );
    ok(&home, &["create", "service", "nodeport", "np", "--tcp=81:8081"]);
    assert_eq!(jsonpath(&home, "svc", "np", "{.spec.type}"), "NodePort");
    ok(&home, &["create", "secret", "generic", "s1", "--from-literal=k=v"]);
    assert_eq!(jsonpath(&home, "secret", "s1", "{.data.k}"), "dg==");
    ok(&home, &["create", "serviceaccount", "robot"]);
    ok(&home, &["create", "ingress", "web", "--rule=example.com/*=gen:80"]);
    assert_eq!(
        jsonpath(
            &home,
            "ingress",
            "web",
            "{.spec.rules[0].http.paths[0].backend.service.name}"
        ),
        "gen"
    );
    ok(
        &home,
        &["run", "one", "--image=busybox:1", "--restart=Never", "--labels=app=one"],
    );
    assert_eq!(
        jsonpath(&home, "pod", "one", "{.spec.containers[0].image}"),
        "busybox:1"
    );

    // kubectl explain reads the OpenAPI v3 schemas, of built-in kinds and of CRDs.
    let explained = ok(&home, &["explain", "deployment.spec.replicas"]);
    assert!(
        explained.contains("FIELD: replicas <integer>") && explained.contains("Number of desired pods"),
        "{explained}"
    );
    let explained = ok(&home, &["explain", "widget.spec"]);
    assert!(
        explained.contains("What the widget should be") && explained.contains("size\t<integer>"),
        "{explained}"
    );
    // Server-side apply with field ownership: a field dropped from the configuration is removed;
    // a second manager changing a field the first owns conflicts unless it forces.
    std::fs::write(home.join("ssa.yaml"), SSA_CM).unwrap();
    let ssa = home.join("ssa.yaml");
    ok(&home, &["apply", "--server-side", "-f", ssa.to_str().unwrap()]);
    std::fs::write(&ssa, SSA_CM.replace("  b: two\n", "")).unwrap();
    ok(&home, &["apply", "--server-side", "-f", ssa.to_str().unwrap()]);
    let data: serde_json::Value = serde_json::from_str(&jsonpath(&home, "cm", "ssa", "{.data}")).unwrap();
    assert_eq!(
        data,
        serde_json::json!({"a": "one"}),
        "b was removed by the second apply"
    );
    std::fs::write(&ssa, SSA_CM.replace("a: one", "a: uno")).unwrap();
    let refused = kubectl(
        &home,
        &[
            "apply",
            "--server-side",
            "--field-manager=other",
            "-f",
            ssa.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("conflict") && stderr.contains(".data.a"),
        "{stderr}"
    );
    ok(
        &home,
        &[
            "apply",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            ssa.to_str().unwrap(),
        ],
    );
    assert_eq!(jsonpath(&home, "cm", "ssa", "{.data.a}"), "uno");

    // kubectl scale goes through the /scale subresource.
    ok(&home, &["scale", "deployment", "web", "--replicas=3"]);
    assert_eq!(jsonpath(&home, "deploy", "web", "{.spec.replicas}"), "3");
    ok(
        &home,
        &["scale", "deployment", "web", "--current-replicas=3", "--replicas=4"],
    );
    assert_eq!(jsonpath(&home, "deploy", "web", "{.spec.replicas}"), "4");

    ok(&home, &["label", "cm", "c1", "tier=web"]);
    assert!(ok(&home, &["get", "cm", "-l", "tier=web"]).contains("c1"));
    assert!(!ok(&home, &["get", "cm", "-l", "tier=db"]).contains("c1"));

    ok(&home, &["delete", "cm", "c1"]);
    let gone = kubectl(&home, &["get", "cm", "c1"]);
    assert!(!gone.status.success());

    // get --watch sees a create made after it started.
    let mut watch = Guard(
        Command::new("kubectl")
            .args(["get", "cm", "--watch", "--output-watch-events"])
            .env("HOME", &home)
            .env("KUBECONFIG", home.join("kubeconfig"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl get --watch"),
    );
    let stdout = watch.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Create until the watch reports it (the first create may land before the watch opens;
    // the list then shows it and a second object is created after).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut created = 0;
    let mut seen_added = false;
    while !seen_added && std::time::Instant::now() < deadline {
        ok(&home, &["create", "configmap", &format!("w{created}")]);
        created += 1;
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            if line.contains("ADDED") && line.contains(&format!("w{}", created - 1)) {
                seen_added = true;
                break;
            }
        }
    }
    assert!(seen_added, "kubectl get --watch never showed an ADDED event");
    drop(watch);

    // SIGTERM stops the server cleanly.
    let pid = server.0.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            assert!(status.success(), "server exit: {status:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&home);
}
