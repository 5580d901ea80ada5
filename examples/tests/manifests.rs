//! The sample-controller's deployment (`cargo xtask manifests`) against envtest: the checked-in
//! manifests are what `examples::sample_controller::deploy` generates; applied to envtest, they
//! install the CRD, the ServiceAccount and its roles; the controller, run as that ServiceAccount
//! (kube's impersonation, which envtest's request log records) with the Deployment's own
//! arguments, converges; every request it made is allowed by the RBAC rules as the server
//! returns them (evaluated here: verb, API group, resource, subresource, namespace), and every
//! rule grants only what the run used, but for the few grants listed below with their reason;
//! no rule holds `*`. The Deployment's probe and metrics ports answer on the paths the manifests
//! name. The sharded variant (`sample-controller-sharded.yaml`) likewise: two shards run as the
//! ServiceAccount with the sharded Deployment's arguments (one joining after the other, so
//! Foos drain from one shard to the other), and every request of the shards and the sharder is
//! allowed, the Lease requests by the Roles of the Leases' namespace.

// The resource is called Foo, as upstream: `foo` names one, not a placeholder.
#![allow(clippy::disallowed_names)]

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use examples::demo::CommonArgs;
use examples::sample_controller::{self, Foo, FooSpec, deploy};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer::controller::sharding::ring;
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use support::http_get;
use tokio_util::sync::CancellationToken;

/// The flags the Deployment passes to the binary, parsed as the binary parses them.
#[derive(Parser, Debug)]
struct DeployedArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[arg(long)]
    in_cluster: bool,
    #[arg(long)]
    shards: bool,
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` after 30 s.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Server-side applies `object` (any kind the server serves), as `kubectl apply
/// --server-side` would.
async fn apply(client: &Client, object: &serde_json::Value) {
    let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", object["apiVersion"].as_str().unwrap()),
    };
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(namespace) if capabilities.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    let name = object["metadata"]["name"].as_str().unwrap();
    api.patch(
        name,
        &PatchParams::apply("manifests-test").force(),
        &Patch::Apply(object),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {} {name}: {e}", gvk.kind));
}

/// What kube-apiserver's RequestInfo makes of a request: verb, API group, resource (with
/// `/subresource`), namespace. `None` for a non-resource path (`/api`, `/version`, ...).
fn attributes(method: &str, path: &str, is_watch: bool) -> Option<(String, String, String, Option<String>)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => (String::new(), rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => ((*group).to_owned(), rest),
        _ => return None,
    };
    let (group, rest) = rest;
    let (namespace, rest) = match rest {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() => (Some((*namespace).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, named) = match rest {
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, subresource] => (format!("{resource}/{subresource}"), true),
        _ => return None,
    };
    let verb = match (method, named) {
        ("GET", _) if is_watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((verb.to_owned(), group, resource, namespace))
}

/// Whether `rules` allow `verb` on `resource` of `group`, as RBAC evaluates a rule: each of its
/// lists must hold the value (or `*`, which no generated rule holds: checked separately).
fn allowed(rules: &[PolicyRule], verb: &str, group: &str, resource: &str) -> bool {
    let holds = |list: &Option<Vec<String>>, value: &str| {
        list.as_ref().is_some_and(|l| l.iter().any(|v| v == value || v == "*"))
    };
    rules.iter().any(|rule| {
        rule.resource_names.is_none()
            && holds(&rule.api_groups, group)
            && holds(&rule.resources, resource)
            && rule.verbs.iter().any(|v| v == verb || v == "*")
    })
}

/// Checks that `objects` are what the checked-in file `deploy/<file>` holds.
fn assert_checked_in(file: &str, objects: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let checked_in: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(checked_in == objects, "{path} is stale: run `cargo xtask manifests`");
    checked_in
}

/// Applies `objects` to `server` and waits for the Foo CRD; returns the rules of the ClusterRole
/// and of the Roles `roles` of the controller's namespace, as the server stores them, checked
/// to hold no `*` and no non-resource URL.
async fn apply_all(
    server: &envtest::Server,
    objects: &[serde_json::Value],
    roles: &[String],
) -> (Vec<PolicyRule>, Vec<PolicyRule>) {
    let admin = server.client();
    for object in objects {
        apply(&admin, object).await;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    eventually("the Foo CRD to be established", || async {
        crds.get("foos.samplecontroller.k8s.io").await.is_ok_and(|crd| {
            crd.status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"))
        })
    })
    .await;
    // The rules as the server stores them.
    let cluster_rules = Api::<ClusterRole>::all(admin.clone())
        .get(deploy::NAME)
        .await
        .unwrap()
        .rules
        .unwrap_or_default();
    let mut role_rules = Vec::new();
    for role in roles {
        let rules = Api::<Role>::namespaced(admin.clone(), deploy::NAMESPACE)
            .get(role)
            .await
            .unwrap()
            .rules
            .unwrap_or_default();
        role_rules.extend(rules);
    }
    for rule in cluster_rules.iter().chain(&role_rules) {
        let lists = [
            rule.api_groups.clone().unwrap_or_default(),
            rule.resources.clone().unwrap_or_default(),
            rule.verbs.clone(),
        ];
        assert!(
            !lists.iter().flatten().any(|v| v.contains('*')),
            "a rule with *: {rule:?}"
        );
        assert!(rule.non_resource_urls.is_none(), "{rule:?}");
    }
    (cluster_rules, role_rules)
}

/// The arguments of the Deployment among `objects`, parsed as the binary parses them, with the
/// ports on loopback, free ones, in place of 8080 and 8081; and the container.
fn deployed_args(objects: &[serde_json::Value]) -> (DeployedArgs, serde_json::Value) {
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let container = deployment["spec"]["template"]["spec"]["containers"][0].clone();
    let pod_args: Vec<String> = serde_json::from_value(container["args"].clone()).unwrap();
    let mut args = DeployedArgs::try_parse_from(std::iter::once("sample-controller".to_owned()).chain(pod_args))
        .unwrap_or_else(|e| panic!("the Deployment's args: {e}"));
    assert!(args.in_cluster);
    assert_eq!(args.common.metrics_addr.map(|a| a.port()), Some(8080));
    assert_eq!(args.common.health_probe_addr.map(|a| a.port()), Some(8081));
    args.common.metrics_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    args.common.health_probe_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    (args, container)
}

/// A client of `server` impersonating `user`.
fn impersonating(server: &envtest::Server, user: &str) -> Client {
    let mut config = server.kube_config();
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).unwrap()
}

/// Checks every request `user` made against the rules (a Role's only in the controller's
/// namespace) and returns what was used: (verb, group, resource).
fn assert_allowed(
    server: &envtest::Server,
    user: &str,
    cluster_rules: &[PolicyRule],
    role_rules: &[PolicyRule],
) -> BTreeSet<(String, String, String)> {
    let requests: Vec<_> = server
        .faults()
        .requests()
        .into_iter()
        .filter(|r| r.user == user)
        .collect();
    let mut used = BTreeSet::new();
    for request in &requests {
        let Some((verb, group, resource, namespace)) = attributes(&request.method, &request.path, request.is_watch)
        else {
            panic!("a non-resource request, which the rules do not grant: {request:?}");
        };
        let by_role = namespace.as_deref() == Some(deploy::NAMESPACE) && allowed(role_rules, &verb, &group, &resource);
        assert!(
            by_role || allowed(cluster_rules, &verb, &group, &resource),
            "{verb} {group}/{resource} in {namespace:?} is not allowed: {request:?}"
        );
        used.insert((verb, group, resource));
    }
    used
}

/// Checks that every verb the rules grant was `used`, but for `unused_by_design`.
fn assert_all_used(
    rules: &[PolicyRule],
    used: &BTreeSet<(String, String, String)>,
    unused_by_design: impl Fn(&str, &str, &str) -> bool,
) {
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    assert!(
                        used.contains(&(verb.clone(), group.clone(), resource.clone()))
                            || unused_by_design(verb, group, resource),
                        "{verb} on {group}/{resource} is granted but the controller never needed it; used: {used:#?}"
                    );
                }
            }
        }
    }
}

/// Checks the requests `user` made against the rules: every request allowed
/// ([`assert_allowed`]), every grant used but for [`unused_by_design`], and each of `exercised`
/// (verb, group, resource) among the requests.
fn assert_rbac_exact(
    server: &envtest::Server,
    user: &str,
    cluster_rules: &[PolicyRule],
    role_rules: &[PolicyRule],
    exercised: &[(&str, &str, &str)],
) {
    let used = assert_allowed(server, user, cluster_rules, role_rules);
    assert_all_used(cluster_rules, &used, unused_by_design);
    assert_all_used(role_rules, &used, unused_by_design);
    for (verb, group, resource) in exercised {
        assert!(
            used.contains(&((*verb).to_owned(), (*group).to_owned(), (*resource).to_owned())),
            "no {verb} on {group}/{resource} in {used:#?}"
        );
    }
}

/// Granted and not seen in a run, each for a reason.
fn unused_by_design(verb: &str, group: &str, resource: &str) -> bool {
    match (verb, group, resource) {
        // `get` on a watched type: the kubebuilder convention for sources (a conflict's re-read
        // by the finalizer helper, a reconciler's read-through).
        ("get", "samplecontroller.k8s.io" | "apps", _) => true,
        // A series' count: only when one Event repeats within its aggregation window.
        ("patch", "events.k8s.io", "events") => true,
        // The recorder's fallback on servers without events.k8s.io/v1.
        ("create" | "patch", "", "events") => true,
        // The sharder deletes a shard Lease only once it has been free for twice the lease
        // duration (sharded_sample_controller waits for it).
        ("delete", "coordination.k8s.io", "leases") => true,
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_rbac_allows_every_request_the_deployed_controller_makes_and_no_more() {
    // The checked-in manifests are the generated ones.
    let manifests = deploy::manifests().unwrap();
    let objects = manifests.objects().unwrap();
    let checked_in = assert_checked_in("sample-controller.yaml", &objects);

    // Applied to envtest.
    let server = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let admin = server.client();
    let (cluster_rules, role_rules) = apply_all(&server, &checked_in, &[manifests.leader_election_role()]).await;

    // The controller as the binary runs it in the pod: the Deployment's arguments, the
    // ServiceAccount's identity; its ports on loopback, free ones, in place of 8080 and 8081.
    let (args, container) = deployed_args(&objects);
    assert!(!args.shards);
    let user = manifests.service_account_user();
    let as_service_account = impersonating(&server, &user);
    server.faults().clear_requests();
    let manager = deploy::manager(as_service_account, &args.common).unwrap();
    let probes = manager.health_probe_addr().unwrap();
    let metrics = manager.metrics_addr().unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));

    // The probes and metrics on the paths the Deployment names.
    let path_of = |probe: &str| container[probe]["httpGet"]["path"].as_str().unwrap().to_owned();
    let (readiness, liveness) = (path_of("readinessProbe"), path_of("livenessProbe"));
    eventually("the readiness probe to pass", || async {
        http_get(probes, &readiness).await.0 == 200
    })
    .await;
    assert_eq!(http_get(probes, &liveness).await.0, 200);

    // A Foo's life: its Deployment made, scaled, recreated; its status, index entry and
    // events written; deleted behind its finalizer.
    let namespace = "default";
    let foos: Api<Foo> = Api::namespaced(admin.clone(), namespace);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), namespace);
    let foo = |replicas| {
        Foo::new(
            "foo",
            FooSpec {
                deployment_name: "web".into(),
                replicas: Some(replicas),
            },
        )
    };
    foos.create(&PostParams::default(), &foo(1)).await.unwrap();
    let scaled_to = |replicas: i32| {
        let deployments = deployments.clone();
        async move {
            deployments
                .get_opt("web")
                .await
                .unwrap()
                .is_some_and(|d| d.spec.and_then(|s| s.replicas) == Some(replicas))
        }
    };
    eventually("Deployment web", || scaled_to(1)).await;
    eventually("Foo foo's status and index entry", || async {
        let status = foos.get("foo").await.unwrap().status.is_some();
        let entry = configmaps
            .get_opt(sample_controller::INDEX)
            .await
            .unwrap()
            .and_then(|cm| cm.data)
            .is_some_and(|d| d.contains_key("foo"));
        status && entry
    })
    .await;
    foos.patch(
        "foo",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    eventually("Deployment web scaled to 3", || scaled_to(3)).await;
    let uid = deployments.get("web").await.unwrap().uid();
    deployments.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("Deployment web recreated", || async {
        deployments
            .get_opt("web")
            .await
            .unwrap()
            .is_some_and(|d| d.uid() != uid)
    })
    .await;
    foos.delete("foo", &DeleteParams::default()).await.unwrap();
    eventually("Foo foo gone after its finalizer's cleanup", || async {
        foos.get_opt("foo").await.unwrap().is_none()
    })
    .await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), namespace);
    eventually("a Synced Event", || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Synced"))
    })
    .await;
    let (code, body) = http_get(metrics, "/metrics").await;
    assert_eq!(code, 200);
    assert!(body.contains("controller_runtime_reconcile_total"), "{body}");
    shutdown.cancel();
    run.await.unwrap().unwrap();

    // Every request the ServiceAccount made is allowed; every grant was used, but for these.
    // The run did exercise the sources, the declared writes and the Lease.
    let exercised = [
        ("list", "samplecontroller.k8s.io", "foos"),
        ("watch", "apps", "deployments"),
        ("create", "apps", "deployments"),
        ("patch", "samplecontroller.k8s.io", "foos/status"),
        ("create", "events.k8s.io", "events"),
        ("update", "coordination.k8s.io", "leases"),
    ];
    assert_rbac_exact(&server, &user, &cluster_rules, &role_rules, &exercised);
    server.shutdown().await;
}

/// Each Foo labelled for the shard the ring assigns it among `shards`, its Deployment
/// labelled the same; else why not.
async fn split_over(admin: &Client, names: &[String], shards: &[&str]) -> Result<(), String> {
    let label = format!("shard.kinformer.io/{}", sample_controller::RING);
    let foos: Api<Foo> = Api::namespaced(admin.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    for name in names {
        let wanted = ring::assign(shards, &format!("default/{name}")).unwrap();
        let foo = foos.get(name).await.map_err(|e| e.to_string())?;
        let deployment = deployments.get_opt(name).await.map_err(|e| e.to_string())?;
        let labels = (
            foo.labels().get(&label).cloned(),
            deployment.map(|d| d.labels().get(&label).cloned()),
        );
        if labels != (Some(wanted.to_owned()), Some(Some(wanted.to_owned()))) {
            return Err(format!("{name}: (Foo, Deployment) labelled {labels:?}, not {wanted}"));
        }
    }
    Ok(())
}

/// The sharded deployment (`sample-controller-sharded.yaml`): the shard Leases are granted in
/// the controller's namespace only (a Role; the ClusterRole names no Lease), and every request
/// two shards and the leader's sharder make (assigning, draining to a joining shard,
/// labelling Deployments, the shard and leader Leases) is allowed, every grant used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sharded_rbac_allows_every_request_of_the_shards_and_the_sharder_and_no_more() {
    let sharded = deploy::sharded_manifests().unwrap();
    let objects = sharded.objects().unwrap();
    let checked_in = assert_checked_in("sample-controller-sharded.yaml", &objects);
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(deployment["spec"]["replicas"], deploy::SHARDS);

    let server = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let admin = server.client();
    let roles = [sharded.manifests.leader_election_role(), deploy::SHARDS_ROLE.to_owned()];
    let (cluster_rules, role_rules) = apply_all(&server, &checked_in, &roles).await;
    assert!(
        !cluster_rules
            .iter()
            .any(|rule| rule.resources.iter().flatten().any(|r| r == "leases")),
        "the ClusterRole grants Leases: {cluster_rules:#?}"
    );
    let (args, _) = deployed_args(&objects);
    assert!(args.shards);
    let user = sharded.manifests.service_account_user();
    server.faults().clear_requests();

    // A shard as the binary runs it in a pod (`--shards`, its id the pod's name), as the
    // ServiceAccount.
    let start = |id: &str| {
        let manager = deploy::sharded_manager(impersonating(&server, &user), &args.common, id, |inner| inner).unwrap();
        let probes = manager.health_probe_addr().unwrap();
        let shutdown = CancellationToken::new();
        (probes, shutdown.clone(), tokio::spawn(manager.run(shutdown)))
    };
    // Shard one alone: it leads, and its sharder labels every Foo for it.
    let one = start("one");
    eventually("shard one to be ready", || async {
        http_get(one.0, "/readyz").await.0 == 200
    })
    .await;
    let foos: Api<Foo> = Api::namespaced(admin.clone(), "default");
    let names: Vec<String> = (0..8).map(|i| format!("foo-{i}")).collect();
    for name in &names {
        let spec = FooSpec {
            deployment_name: name.clone(),
            replicas: Some(1),
        };
        foos.create(&PostParams::default(), &Foo::new(name, spec))
            .await
            .unwrap();
    }
    eventually("every Foo on shard one", || async {
        split_over(&admin, &names, &["one"]).await.is_ok()
    })
    .await;
    // Shard two joins: the Foos the ring gives it drain from shard one (which acknowledges by
    // unlabelling them) and move.
    let two = start("two");
    assert!(
        names
            .iter()
            .any(|n| ring::assign(&["one", "two"], &format!("default/{n}")) == Some("two")),
        "no Foo moves to shard two"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(why) = split_over(&admin, &names, &["one", "two"]).await {
        assert!(
            Instant::now() < deadline,
            "the Foos did not split over the two shards: {why}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A scale and a deletion behind the finalizer, on the shard that has each.
    foos.patch(
        "foo-0",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 2}})),
    )
    .await
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    eventually("Deployment foo-0 scaled to 2", || async {
        deployments
            .get("foo-0")
            .await
            .is_ok_and(|d| d.spec.and_then(|s| s.replicas) == Some(2))
    })
    .await;
    foos.delete("foo-1", &DeleteParams::default()).await.unwrap();
    eventually("Foo foo-1 gone after its finalizer's cleanup", || async {
        foos.get_opt("foo-1").await.unwrap().is_none()
    })
    .await;
    for (_, shutdown, run) in [two, one] {
        shutdown.cancel();
        run.await.unwrap().unwrap();
    }

    // The run did exercise the sharder's and the shards' own requests.
    let exercised = [
        ("patch", "samplecontroller.k8s.io", "foos"),
        ("patch", "apps", "deployments"),
        ("list", "coordination.k8s.io", "leases"),
        ("watch", "coordination.k8s.io", "leases"),
        ("create", "coordination.k8s.io", "leases"),
        ("patch", "coordination.k8s.io", "leases"),
    ];
    assert_rbac_exact(&server, &user, &cluster_rules, &role_rules, &exercised);
    server.shutdown().await;
}

/// Outside a pod, `--in-cluster` (the Deployment's mode) fails at once, saying why.
#[test]
fn in_cluster_outside_a_pod_fails_naming_the_flag_and_the_cause() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sample-controller"))
        .args([
            "--in-cluster",
            "--metrics-addr=127.0.0.1:0",
            "--health-probe-addr=127.0.0.1:0",
        ])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--in-cluster: no in-cluster configuration (run it in a pod with a ServiceAccount)"),
        "{stderr}"
    );
}
