//! The corpus round trip (issue #24's acceptance): every CRD under `crds/` is installed into
//! envtest with the machine's kubectl, every object under `objects/` is created with kubectl
//! (`create`, not `apply`: apply's merge drops the `null` of a nullable field, which `create`
//! sends as written) and its `status` written through the status subresource where the CRD has
//! one (kubectl `patch --subresource=status`); the server must then hold everything each file
//! holds (nothing pruned or rejected, so the comparison covers all of it). Then,
//! for each object and each version its CRD serves, the object the server returns at that
//! version (a raw GET through `kube::Client`) must equal, as `serde_json::Value`, the object the
//! generated informer of that version caches, read from its generated lister and serialized.
//!
//! Nothing is left out of the comparison: not even `metadata.managedFields` (the factory's
//! informers keep them unless told to strip them).
//!
//! The test also requires that every served version of every CRD has generated types (the
//! table below) and at least one object. It prints one line per object and version, and for a
//! difference the JSON paths where the server's object and the cached one differ.
//!
//! Skipped (with a message) only when kubectl is not installed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer::cache::Selector;
use kinformer::factory::SharedInformerFactory;
use kube::Resource;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// How long the lister may take to hold the resourceVersion the server returned.
const CACHE_DEADLINE: Duration = Duration::from_secs(20);

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The object of `namespace`/`name` in a generated lister, serialized.
type Cached = Box<dyn Fn(Option<&str>, &str) -> Option<Value> + Send + Sync>;
/// Decodes a server object as the generated type; the error names the field path.
type Decode = Box<dyn Fn(&Value) -> Result<(), String> + Send + Sync>;

/// One generated type (one CRD version), with its informer's lister.
struct Generated {
    api_version: String,
    kind: String,
    cached: Cached,
    decode: Decode,
}

/// Starts the informer of each listed generated type on `factory` and gives its lister as a
/// [`Generated`].
macro_rules! generated {
    ($factory:expr => $($module:ident :: $version:ident :: $kind:ident),* $(,)?) => {
        vec![$({
            use corpus::generated::$module::$version::$kind as K;
            let informer = K::informer($factory).unwrap();
            let lister = informer.lister();
            Generated {
                api_version: K::api_version(&()).into_owned(),
                kind: K::kind(&()).into_owned(),
                cached: Box::new(move |namespace: Option<&str>, name: &str| {
                    lister
                        .list(&Selector::default())
                        .into_iter()
                        .find(|o| {
                            o.metadata.name.as_deref() == Some(name) && o.metadata.namespace.as_deref() == namespace
                        })
                        .map(|o| serde_json::to_value(&*o).unwrap())
                }),
                decode: Box::new(|value: &Value| {
                    serde_path_to_error::deserialize::<_, K>(value.clone())
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }),
            }
        }),*]
    };
}

/// A CRD of the corpus.
struct Crd {
    project: String,
    crd: CustomResourceDefinition,
}

impl Crd {
    fn served(&self) -> Vec<String> {
        self.crd
            .spec
            .versions
            .iter()
            .filter(|v| v.served)
            .map(|v| v.name.clone())
            .collect()
    }

    fn has_status_subresource(&self, version: &str) -> bool {
        self.crd
            .spec
            .versions
            .iter()
            .any(|v| v.name == version && v.subresources.as_ref().is_some_and(|s| s.status.is_some()))
    }

    fn api_version(&self, version: &str) -> String {
        format!("{}/{version}", self.crd.spec.group)
    }

    /// The `resource.version.group` kubectl accepts, which pins the version.
    fn kubectl_resource(&self, version: &str) -> String {
        format!("{}.{version}.{}", self.crd.spec.names.plural, self.crd.spec.group)
    }

    fn path(&self, version: &str, namespace: Option<&str>, name: &str) -> String {
        let group = &self.crd.spec.group;
        let plural = &self.crd.spec.names.plural;
        match namespace {
            Some(ns) => format!("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}"),
            None => format!("/apis/{group}/{version}/{plural}/{name}"),
        }
    }
}

/// The YAML files of `dir`'s subdirectories (one per project), as (project, path).
fn files_by_project(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for project in std::fs::read_dir(dir).unwrap() {
        let project = project.unwrap().path();
        let name = project.file_name().unwrap().to_string_lossy().into_owned();
        for file in std::fs::read_dir(&project).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_some_and(|e| e == "yaml") {
                out.push((name.clone(), file));
            }
        }
    }
    out.sort();
    out
}

fn read_crds() -> Vec<Crd> {
    files_by_project(&corpus_dir().join("crds"))
        .into_iter()
        .map(|(project, path)| {
            let crd = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Crd { project, crd }
        })
        .collect()
}

/// Runs kubectl against envtest (the kubeconfig in `home`) and returns its stdout; panics with
/// its output if it fails.
async fn kubectl(home: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new("kubectl")
        .args(args)
        .arg("--request-timeout=30s")
        .env("HOME", home)
        .env("KUBECONFIG", home.join("kubeconfig"))
        .output()
        .await
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The paths where `server` and `cached` differ, with both values (shortened).
fn diff(path: &str, server: &Value, cached: &Value, out: &mut Vec<String>) {
    let short = |v: &Value| {
        let s = v.to_string();
        if s.chars().count() > 120 {
            format!("{}…", s.chars().take(120).collect::<String>())
        } else {
            s
        }
    };
    match (server, cached) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let here = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff(&here, x, y, out),
                    (Some(x), None) => out.push(format!("{here}: server {}, lister: absent", short(x))),
                    (None, Some(y)) => out.push(format!("{here}: server absent, lister {}", short(y))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (x, y) if x != y => out.push(format!("{path}: server {}, lister {}", short(x), short(y))),
        _ => {}
    }
}

/// The paths where `written` (an object file) has what `server` does not: a field the server
/// pruned or defaulted over would leave the round trip comparing less than the file holds.
/// Numbers compare by value (YAML's `10.00` reaches the server through kubectl as `10`).
fn missing(path: &str, written: &Value, server: &Value, out: &mut Vec<String>) {
    match (written, server) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, x) in a {
                match b.get(key) {
                    Some(y) => missing(&format!("{path}.{key}"), x, y, out),
                    None => out.push(format!("{path}.{key}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                missing(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        (x, y) if x != y => out.push(format!("{path}: written {x}, server {y}")),
        _ => {}
    }
}

/// One object read back at one served version.
struct Outcome {
    project: String,
    crd: String,
    version: String,
    object: String,
    result: Result<(), String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_corpus_object_round_trips_through_kubectl_envtest_and_a_generated_lister() {
    if !envtest::kubectl::available().expect("kubectl is required here") {
        eprintln!("SKIPPED: kubectl is not installed on this machine");
        return;
    }
    let crds = read_crds();
    let projects: BTreeSet<&str> = crds.iter().map(|c| c.project.as_str()).collect();
    assert!(projects.len() >= 8, "the corpus has CRDs of {projects:?}");

    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let home = std::env::temp_dir().join(format!("kinformer-corpus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    env.write_kubeconfig(home.join("kubeconfig")).unwrap();

    // The CRDs, unchanged, with `kubectl create` (client-side apply would copy each into its
    // last-applied annotation, over the annotation size limit for the largest).
    for project in &projects {
        let dir = corpus_dir().join("crds").join(project);
        kubectl(&home, &["create", "-f", dir.to_str().unwrap()]).await;
    }
    kubectl(
        &home,
        &["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"],
    )
    .await;

    // The objects, and their namespaces; `status` through the status subresource where the CRD
    // has one (the main resource ignores it there), see the module docs.
    let mut objects: Vec<(String, PathBuf, Value)> = Vec::new();
    for (project, path) in files_by_project(&corpus_dir().join("objects")) {
        let object: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        objects.push((project, path, object));
    }
    let namespaces: BTreeSet<&str> = objects
        .iter()
        .filter_map(|(_, _, o)| o["metadata"]["namespace"].as_str())
        .collect();
    for ns in namespaces.iter().filter(|ns| **ns != "default") {
        kubectl(&home, &["create", "namespace", ns]).await;
    }
    let mut covered: BTreeSet<(String, String)> = BTreeSet::new();
    for (_, path, object) in &objects {
        let api_version = object["apiVersion"].as_str().unwrap();
        let kind = object["kind"].as_str().unwrap();
        let crd = crds
            .iter()
            .find(|c| c.crd.spec.names.kind == kind && c.served().iter().any(|v| c.api_version(v) == api_version))
            .unwrap_or_else(|| panic!("{}: no CRD serves {api_version} {kind}", path.display()));
        let version = api_version.rsplit('/').next().unwrap();
        covered.insert((crd.crd.spec.names.kind.clone(), version.to_string()));
        kubectl(&home, &["create", "-f", path.to_str().unwrap()]).await;
        if let Some(status) = object.get("status").filter(|_| crd.has_status_subresource(version)) {
            let name = object["metadata"]["name"].as_str().unwrap();
            let mut args = vec![
                "patch".to_string(),
                crd.kubectl_resource(version),
                name.to_string(),
                "--subresource=status".to_string(),
                "--type=merge".to_string(),
                "-p".to_string(),
                serde_json::json!({ "status": status }).to_string(),
            ];
            if let Some(ns) = object["metadata"]["namespace"].as_str() {
                args.extend(["-n".to_string(), ns.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl(&home, &args).await;
        }
    }
    for crd in &crds {
        for version in crd.served() {
            assert!(
                covered.contains(&(crd.crd.spec.names.kind.clone(), version.clone())),
                "no object of {} {version} under objects/{}",
                crd.crd.spec.names.kind,
                crd.project
            );
        }
    }

    // Every generated type's informer, started once everything is written.
    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let generated = generated!(&factory =>
        appprojects_argoproj_io::v1alpha1::AppProject,
        certificaterequests_cert_manager_io::v1::CertificateRequest,
        certificates_cert_manager_io::v1::Certificate,
        environmentconfigs_apiextensions_crossplane_io::v1beta1::EnvironmentConfig,
        externalsecrets_external_secrets_io::v1::ExternalSecret,
        gateways_gateway_networking_k8s_io::v1::Gateway,
        gateways_gateway_networking_k8s_io::v1beta1::Gateway,
        kustomizations_kustomize_toolkit_fluxcd_io::v1::Kustomization,
        locks_pkg_crossplane_io::v1beta1::Lock,
        prometheusrules_monitoring_coreos_com::v1::PrometheusRule,
        referencegrants_gateway_networking_k8s_io::v1::ReferenceGrant,
        referencegrants_gateway_networking_k8s_io::v1beta1::ReferenceGrant,
        scaledobjects_keda_sh::v1alpha1::ScaledObject,
        scheduledbackups_postgresql_cnpg_io::v1::ScheduledBackup,
        schedules_velero_io::v1::Schedule,
        servicemonitors_monitoring_coreos_com::v1::ServiceMonitor,
        telemetries_telemetry_istio_io::v1::Telemetry,
        telemetries_telemetry_istio_io::v1alpha1::Telemetry,
    );
    let by_version: BTreeMap<(String, String), &Generated> = generated
        .iter()
        .map(|g| ((g.api_version.clone(), g.kind.clone()), g))
        .collect();
    for crd in &crds {
        for version in crd.served() {
            assert!(
                by_version.contains_key(&(crd.api_version(&version), crd.crd.spec.names.kind.clone())),
                "{} {version} (served) has no generated type in this test's table",
                crd.crd.metadata.name.as_deref().unwrap_or_default()
            );
        }
    }
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory
        .wait_for_cache_sync_timeout(&shutdown, Duration::from_secs(60))
        .await;
    assert!(synced.is_ok(), "informers did not sync: {synced:?}");

    let mut outcomes = Vec::new();
    for (project, path, object) in &objects {
        let kind = object["kind"].as_str().unwrap();
        let name = object["metadata"]["name"].as_str().unwrap();
        let namespace = object["metadata"]["namespace"].as_str();
        let crd = crds
            .iter()
            .find(|c| c.crd.spec.names.kind == kind && &c.project == project)
            .unwrap();
        for version in crd.served() {
            let generated = by_version[&(crd.api_version(&version), kind.to_string())];
            let request = http::Request::get(crd.path(&version, namespace, name))
                .body(Vec::new())
                .unwrap();
            let server: Value = client.request(request).await.unwrap();
            if object["apiVersion"] == server["apiVersion"] {
                let mut lost = Vec::new();
                missing("", object, &server, &mut lost);
                assert!(lost.is_empty(), "{}: the server does not hold {lost:?}", path.display());
            }
            let result = compare(generated, namespace, name, &server).await;
            outcomes.push(Outcome {
                project: project.clone(),
                crd: crd.crd.metadata.name.clone().unwrap_or_default(),
                version,
                object: path.file_name().unwrap().to_string_lossy().into_owned(),
                result,
            });
        }
    }
    shutdown.cancel();
    factory.shutdown().await;
    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&home);

    let mut failed = Vec::new();
    for o in &outcomes {
        match &o.result {
            Ok(()) => println!("ok    {} {} {} ({})", o.project, o.crd, o.version, o.object),
            Err(e) => {
                println!("FAIL  {} {} {} ({}):\n{e}", o.project, o.crd, o.version, o.object);
                failed.push(format!("{} {} ({})", o.crd, o.version, o.object));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} round trips lost data: {failed:#?}",
        failed.len(),
        outcomes.len()
    );
}

/// Waits (up to [`CACHE_DEADLINE`]) for the lister to hold the server's resourceVersion of the
/// object, then compares the cached object, serialized, with the server's.
async fn compare(generated: &Generated, namespace: Option<&str>, name: &str, server: &Value) -> Result<(), String> {
    let rv = &server["metadata"]["resourceVersion"];
    let deadline = tokio::time::Instant::now() + CACHE_DEADLINE;
    let cached = loop {
        match (generated.cached)(namespace, name) {
            Some(cached) if &cached["metadata"]["resourceVersion"] == rv => break cached,
            _ if tokio::time::Instant::now() >= deadline => {
                let why = match (generated.decode)(server) {
                    Err(e) => format!("the server's object does not decode as the generated type: {e}"),
                    Ok(()) => "it decodes, yet the lister never held this resourceVersion".to_string(),
                };
                return Err(format!("  not in the lister: {why}"));
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    if &cached == server {
        return Ok(());
    }
    let mut paths = Vec::new();
    diff("", server, &cached, &mut paths);
    Err(paths.iter().map(|p| format!("  {p}\n")).collect())
}
