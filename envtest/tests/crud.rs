//! Every non-watch verb and its errors, through `kube::Api` over HTTP.

mod common;

use common::{code, reason};
use envtest::{Config, Server};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, VersionMatch};
use serde_json::json;
use std::collections::BTreeMap;

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    c.data = Some(BTreeMap::from([("k".to_owned(), name.to_owned())]));
    c
}

fn rv(o: &impl kube::ResourceExt) -> u64 {
    o.resource_version().unwrap_or_default().parse().unwrap()
}

#[tokio::test]
async fn default_namespaces_exist() {
    let env = Server::start(Config::default()).await.unwrap();
    let ns: Api<Namespace> = Api::all(env.client());
    let names: Vec<String> = ns
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert!(names.contains(&"default".to_owned()));
    assert!(names.contains(&"kube-system".to_owned()));
    env.shutdown().await;
}

#[tokio::test]
async fn create_get_update_delete_with_server_metadata() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let created = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1 = rv(&created);
    assert_eq!(rv1, env.current_resource_version());

    let e = api.create(&PostParams::default(), &cm("a", &[])).await.unwrap_err();
    assert_eq!((code(&e), reason(&e).as_str()), (409, "AlreadyExists"));

    let got = api.get("a").await.unwrap();
    assert_eq!(got, created);
    let e = api.get("missing").await.unwrap_err();
    assert_eq!((code(&e), reason(&e).as_str()), (404, "NotFound"));

    let mut next = got.clone();
    next.data = Some(BTreeMap::from([("k".into(), "v2".into())]));
    let updated = api.replace("a", &PostParams::default(), &next).await.unwrap();
    assert!(rv(&updated) > rv1);
    assert_eq!(updated.metadata.uid, created.metadata.uid);

    // Stale resourceVersion → 409 Conflict.
    let e = api.replace("a", &PostParams::default(), &next).await.unwrap_err();
    assert_eq!((code(&e), reason(&e).as_str()), (409, "Conflict"));

    // A no-op update does not take a new revision.
    let same = api.replace("a", &PostParams::default(), &updated).await.unwrap();
    assert_eq!(rv(&same), rv(&updated));

    api.delete("a", &DeleteParams::default()).await.unwrap();
    let e = api.get("a").await.unwrap_err();
    assert_eq!(code(&e), 404);
    let e = api.delete("a", &DeleteParams::default()).await.unwrap_err();
    assert_eq!(code(&e), 404);
    env.shutdown().await;
}

#[tokio::test]
async fn patches_merge_json_strategic_apply() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    api.create(&PostParams::default(), &cm("p", &[])).await.unwrap();
    let pp = PatchParams::default();
    let o = api
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "1"}}, "data": {"x": "y"}})),
        )
        .await
        .unwrap();
    assert_eq!(o.labels().get("a").map(String::as_str), Some("1"));
    assert_eq!(o.data.as_ref().unwrap().get("x").map(String::as_str), Some("y"));
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/data/x", "value": "z"}])).unwrap();
    let o = api.patch("p", &pp, &Patch::<()>::Json(jp)).await.unwrap();
    assert_eq!(o.data.as_ref().unwrap()["x"], "z");
    let o = api
        .patch("p", &pp, &Patch::Strategic(json!({"data": {"s": "t"}})))
        .await
        .unwrap();
    assert_eq!(o.data.as_ref().unwrap()["s"], "t");
    // Failing JSON patch test op → 422.
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/x", "value": "nope"}])).unwrap();
    let e = api.patch("p", &pp, &Patch::<()>::Json(jp)).await.unwrap_err();
    assert_eq!(code(&e), 422);
    // Stale resourceVersion in a patch → 409.
    let e = api
        .patch("p", &pp, &Patch::Merge(json!({"metadata": {"resourceVersion": "1"}})))
        .await
        .unwrap_err();
    assert_eq!(code(&e), 409);
    // Patch of a missing object → 404; apply creates it.
    let e = api.patch("none", &pp, &Patch::Merge(json!({}))).await.unwrap_err();
    assert_eq!(code(&e), 404);
    let apply = PatchParams::apply("test");
    let o = api
        .patch(
            "applied",
            &apply,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "b"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(o.data.unwrap()["a"], "b");
    env.shutdown().await;
}

#[tokio::test]
async fn generation_tracks_spec_and_status_subresource_is_separate() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<Deployment> = Api::namespaced(env.client(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}},
        "status": {"replicas": 7}
    }))
    .unwrap();
    let d = api.create(&PostParams::default(), &d).await.unwrap();
    assert_eq!(d.metadata.generation, Some(1));
    let pp = PatchParams::default();
    let d = api
        .patch("d", &pp, &Patch::Merge(json!({"spec": {"replicas": 3}})))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2));
    let d = api
        .patch("d", &pp, &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2), "metadata-only change");
    // Main-resource writes ignore status.
    let d = api
        .patch("d", &pp, &Patch::Merge(json!({"status": {"replicas": 9}})))
        .await
        .unwrap();
    assert_ne!(d.status.as_ref().and_then(|s| s.replicas), Some(9));
    // Status writes ignore spec and do not bump generation.
    let d = api
        .patch_status(
            "d",
            &pp,
            &Patch::Merge(json!({"spec": {"replicas": 5}, "status": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(d.status.unwrap().replicas, Some(3));
    assert_eq!(d.spec.unwrap().replicas, Some(3));
    assert_eq!(d.metadata.generation, Some(2));
    env.shutdown().await;
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for i in 0..10 {
        let tier = if i % 2 == 0 { "fe" } else { "be" };
        api.create(
            &PostParams::default(),
            &cm(&format!("c{i}"), &[("tier", tier), ("app", "x")]),
        )
        .await
        .unwrap();
    }
    let names = |l: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        l.items.into_iter().map(|c| c.metadata.name.unwrap()).collect()
    };
    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 10);
    assert_eq!(
        all.metadata.resource_version.as_deref().unwrap(),
        env.current_resource_version().to_string()
    );
    for (sel, n) in [
        ("tier=fe", 5),
        ("tier==be", 5),
        ("tier!=fe", 5),
        ("tier in (fe,be)", 10),
        ("tier notin (fe)", 5),
        ("app", 10),
        ("!app", 0),
    ] {
        let l = api.list(&ListParams::default().labels(sel)).await.unwrap();
        assert_eq!(l.items.len(), n, "{sel}");
    }
    let l = api
        .list(&ListParams::default().fields("metadata.name=c3"))
        .await
        .unwrap();
    assert_eq!(names(l), vec!["c3"]);
    let e = api.list(&ListParams::default().labels("a in (")).await.unwrap_err();
    assert_eq!(code(&e), 400);
    let e = api.list(&ListParams::default().fields("spec.x=1")).await.unwrap_err();
    assert_eq!(code(&e), 400);

    // Pagination pins the revision: writes between pages do not show up.
    let p1 = api.list(&ListParams::default().limit(4)).await.unwrap();
    assert_eq!(p1.items.len(), 4);
    let token = p1.metadata.continue_.clone().unwrap();
    api.create(&PostParams::default(), &cm("c99", &[])).await.unwrap();
    api.delete("c9", &DeleteParams::default()).await.unwrap();
    let mut seen = names(p1.clone());
    let mut token = Some(token);
    while let Some(t) = token {
        let page = api
            .list(&ListParams::default().limit(4).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(page.metadata.resource_version, p1.metadata.resource_version);
        token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        seen.extend(names(page));
    }
    let mut want: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    want.sort();
    assert_eq!(seen, want);

    // Exact read at an old revision.
    let old_rv = p1.metadata.resource_version.clone().unwrap();
    let exact = api
        .list(&ListParams::default().at(&old_rv).matching(VersionMatch::Exact))
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 10);
    assert!(exact.items.iter().any(|c| c.metadata.name.as_deref() == Some("c9")));
    let now = api.list(&ListParams::default()).await.unwrap();
    assert!(now.items.iter().any(|c| c.metadata.name.as_deref() == Some("c99")));

    // After compaction the old revision and the token are expired; the current one is not.
    env.faults().compact();
    let e = api
        .list(&ListParams::default().at(&old_rv).matching(VersionMatch::Exact))
        .await
        .unwrap_err();
    assert_eq!((code(&e), reason(&e).as_str()), (410, "Expired"));
    let e = api
        .list(
            &ListParams::default()
                .limit(4)
                .continue_token(p1.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), 410);
    let cur = env.current_resource_version().to_string();
    let ok = api
        .list(&ListParams::default().at(&cur).matching(VersionMatch::Exact))
        .await
        .unwrap();
    assert_eq!(ok.items.len(), 10);
    let ok = api
        .list(&ListParams::default().at(&old_rv).matching(VersionMatch::NotOlderThan))
        .await
        .unwrap();
    assert_eq!(ok.items.len(), 10);
    env.shutdown().await;
}

#[tokio::test]
async fn scope_and_namespace_errors() {
    let env = Server::start(Config::default()).await.unwrap();
    let missing: Api<ConfigMap> = Api::namespaced(env.client(), "nope");
    let e = missing.create(&PostParams::default(), &cm("a", &[])).await.unwrap_err();
    assert_eq!((code(&e), reason(&e).as_str()), (404, "NotFound"));
    // Body namespace differing from the path → 400.
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let mut c = cm("a", &[]);
    c.metadata.namespace = Some("kube-system".into());
    let e = api.create(&PostParams::default(), &c).await.unwrap_err();
    assert_eq!(code(&e), 400);
    // Invalid name → 422.
    let e = api
        .create(&PostParams::default(), &cm("Bad_Name", &[]))
        .await
        .unwrap_err();
    assert_eq!((code(&e), reason(&e).as_str()), (422, "Invalid"));
    // generateName.
    let mut g = ConfigMap::default();
    g.metadata.generate_name = Some("gen-".into());
    let o = api.create(&PostParams::default(), &g).await.unwrap();
    assert!(o.metadata.name.unwrap().starts_with("gen-"));
    // Cluster-wide list of a namespaced resource works.
    let all: Api<Pod> = Api::all(env.client());
    assert!(all.list(&ListParams::default()).await.unwrap().items.is_empty());
    env.shutdown().await;
}

#[tokio::test]
async fn delete_collection_and_finalizers() {
    let env = Server::start(Config::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    for i in 0..4 {
        api.create(
            &PostParams::default(),
            &cm(&format!("d{i}"), &[("g", if i < 2 { "a" } else { "b" })]),
        )
        .await
        .unwrap();
    }
    api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("g=a"))
        .await
        .unwrap();
    assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 2);

    let mut f = cm("fin", &[]);
    f.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &f).await.unwrap();
    api.delete("fin", &DeleteParams::default()).await.unwrap();
    let held = api.get("fin").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "fin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(code(&api.get("fin").await.unwrap_err()), 404);
    env.shutdown().await;
}

#[tokio::test]
async fn resource_versions_strictly_increase_across_resources() {
    let env = Server::start(Config::default()).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let nss: Api<Namespace> = Api::all(env.client());
    let mut last = 0;
    for i in 0..5 {
        let c = cms
            .create(&PostParams::default(), &cm(&format!("r{i}"), &[]))
            .await
            .unwrap();
        assert!(rv(&c) > last);
        last = rv(&c);
        let mut n = Namespace::default();
        n.metadata.name = Some(format!("ns{i}"));
        let n = nss.create(&PostParams::default(), &n).await.unwrap();
        assert!(rv(&n) > last);
        last = rv(&n);
    }
    env.shutdown().await;
}

/// envtest serves exactly the built-in resources `cargo xtask codegen` generates the factory's
/// typed informers for (`xtask/builtin-resources.txt`), with the same kind and scope, so every
/// generated accessor has a server to sync against.
#[test]
fn the_built_in_resources_are_the_factorys_list() {
    let table = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/builtin-resources.txt");
    let text = std::fs::read_to_string(&table).unwrap();
    let mut generated: Vec<(String, String, String, String, bool)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let group = if f[0] == "core" { "" } else { f[0] };
            (
                group.into(),
                f[1].into(),
                f[2].into(),
                f[3].into(),
                f[4] == "namespaced",
            )
        })
        .collect();
    let mut served: Vec<(String, String, String, String, bool)> = envtest::builtin_resources()
        .into_iter()
        .map(|r| (r.group, r.version, r.kind, r.plural, r.namespaced))
        .collect();
    generated.sort();
    served.sort();
    assert_eq!(served, generated);
}

/// kube-apiserver fills the fields a client leaves unset; a controller that reads
/// `spec.replicas` or a container's `imagePullPolicy` must see the same here. Defaulting on an
/// update does not count as a spec change (the generation stays).
#[tokio::test]
async fn built_in_objects_get_kube_apiservers_defaults() {
    use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let template = json!({"metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}]}});
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template}
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let created = deployments.create(&PostParams::default(), &deployment).await.unwrap();
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.revision_history_limit, Some(10));
    assert_eq!(spec.progress_deadline_seconds, Some(600));
    let strategy = spec.strategy.as_ref().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.as_ref().unwrap();
    assert_eq!(rolling.max_surge, Some(IntOrString::String("25%".into())));
    assert_eq!(rolling.max_unavailable, Some(IntOrString::String("25%".into())));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirst"));
    assert_eq!(pod.scheduler_name.as_deref(), Some("default-scheduler"));
    assert_eq!(pod.termination_grace_period_seconds, Some(30));
    let container = &pod.containers[0];
    assert_eq!(container.image_pull_policy.as_deref(), Some("Always"), "untagged image");
    assert_eq!(
        container.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    assert_eq!(container.ports.as_ref().unwrap()[0].protocol.as_deref(), Some("TCP"));
    assert_eq!(created.metadata.generation, Some(1));

    // The client's own object again (without the defaults): no spec change, no new generation.
    let mut again = deployment.clone();
    again.metadata.resource_version = created.metadata.resource_version.clone();
    let replaced = deployments
        .replace("web", &PostParams::default(), &again)
        .await
        .unwrap();
    assert_eq!(replaced.metadata.generation, Some(1));
    assert_eq!(replaced.spec.as_ref().unwrap().replicas, Some(1));
    let scaled = deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(
        (scaled.metadata.generation, scaled.spec.unwrap().replicas),
        (Some(2), Some(3))
    );

    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let set: StatefulSet = serde_json::from_value(json!({"metadata": {"name": "db"},
        "spec": {"serviceName": "db", "selector": {"matchLabels": {"app": "web"}}, "template": template}}))
    .unwrap();
    let spec = sets.create(&PostParams::default(), &set).await.unwrap().spec.unwrap();
    assert_eq!(spec.pod_management_policy.as_deref(), Some("OrderedReady"));
    assert_eq!(spec.update_strategy.unwrap().rolling_update.unwrap().partition, Some(0));

    let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    let daemon: DaemonSet = serde_json::from_value(json!({"metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template}}))
    .unwrap();
    let spec = daemons
        .create(&PostParams::default(), &daemon)
        .await
        .unwrap()
        .spec
        .unwrap();
    let rolling = spec.update_strategy.unwrap().rolling_update.unwrap();
    assert_eq!(
        (rolling.max_unavailable, rolling.max_surge),
        (Some(IntOrString::Int(1)), Some(IntOrString::Int(0)))
    );

    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let job: Job = serde_json::from_value(json!({"metadata": {"name": "once"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}}))
    .unwrap();
    let spec = jobs.create(&PostParams::default(), &job).await.unwrap().spec.unwrap();
    assert_eq!(
        (spec.completions, spec.parallelism, spec.backoff_limit),
        (Some(1), Some(1), Some(6))
    );
    assert_eq!(
        spec.template.spec.unwrap().restart_policy.as_deref(),
        Some("Never"),
        "kept as sent"
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "registry.local:5000/app:v2"}]}}))
    .unwrap();
    let spec = pods.create(&PostParams::default(), &pod).await.unwrap().spec.unwrap();
    assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(spec.enable_service_links, Some(true));

    let services: Api<Service> = Api::namespaced(client, "default");
    let service: Service =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 8080}]}})).unwrap();
    let spec = services
        .create(&PostParams::default(), &service)
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.session_affinity.as_deref(), Some("None"));
    let port = &spec.ports.unwrap()[0];
    assert_eq!(
        (port.target_port.clone(), port.protocol.as_deref()),
        (Some(IntOrString::Int(8080)), Some("TCP"))
    );
    env.shutdown().await;
}
