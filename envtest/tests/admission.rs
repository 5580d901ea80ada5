//! envtest's admission chain against real HTTPS webhooks run by the test: validating denials
//! and warnings as a client sees them, mutating patches (then validated), the order of mutating
//! webhooks and their reinvocation, rules and selectors, failure policies against a webhook
//! that is down or never answers, a CA bundle that does not match, dry runs, and deletes;
//! `matchPolicy: Equivalent` across a CRD's versions, and `matchConditions`.

mod common;

use common::admission::{
    answer, api_error, closed_port, configmap, core_rule, mutating, patched, reviews, start_mutating, start_validating,
    validating, webhook,
};
use common::webhook_server::{WebhookServer, conversion_response};
use envtest::{Config, Server};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

/// The configurations are served as kube-apiserver serves them (cluster-scoped, defaulted) and
/// validated with its field paths.
#[tokio::test]
async fn webhook_configurations_are_served_defaulted_and_validated() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let hook = webhook(
        "check.example.com",
        json!({"url": "https://127.0.0.1:1/x"}),
        core_rule(&["configmaps"], &["CREATE"]),
        json!({}),
    );
    validating(&client, "checks", vec![hook.clone()]).await;
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let stored = serde_json::to_value(api.get("checks").await.unwrap()).unwrap();
    let w = &stored["webhooks"][0];
    assert_eq!(w["failurePolicy"], "Fail");
    assert_eq!(w["matchPolicy"], "Equivalent");
    assert_eq!(w["timeoutSeconds"], 10);
    assert_eq!(w["rules"][0]["scope"], "*");
    assert_eq!(stored["metadata"]["generation"], 1);

    let mut bad = hook.clone();
    bad["name"] = json!("two.parts");
    bad["clientConfig"]["service"] = json!({"namespace": "ns", "name": "svc"});
    let mut dup = hook.clone();
    dup["sideEffects"] = json!("Some");
    let config: ValidatingWebhookConfiguration =
        serde_json::from_value(json!({"metadata": {"name": "bad"}, "webhooks": [hook, bad, dup]})).unwrap();
    let e = api_error(api.create(&PostParams::default(), &config).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    for part in [
        "webhooks[1].name: Invalid value: \"two.parts\": should be a domain with at least three segments separated by dots",
        "webhooks[1].clientConfig: Required value: exactly one of url or service is required",
        "webhooks[2].name: Duplicate value: \"check.example.com\"",
        "webhooks[2].sideEffects: Unsupported value: \"Some\": supported values: \"None\", \"NoneOnDryRun\"",
    ] {
        assert!(e.message.contains(part), "{part} in {}", e.message);
    }
    env.shutdown().await;
}

/// A validating webhook's denial reaches the client with the webhook's code and kube-apiserver's
/// message; an allowed request is stored.
#[tokio::test]
async fn a_validating_webhook_denies_with_its_code_and_message() {
    let hooks = WebhookServer::start(|_, review| {
        let labels = &review["request"]["object"]["metadata"]["labels"];
        if labels["forbidden"] == "yes" {
            answer(
                &review,
                false,
                json!({"status": {"code": 422, "reason": "Invalid", "message": "forbidden label"}}),
            )
        } else if labels["silent"] == "yes" {
            answer(&review, false, json!({}))
        } else {
            answer(&review, true, json!({}))
        }
    })
    .await;
    let (env, client) = start_validating(
        "checks",
        vec![webhook(
            "labels.example.com",
            hooks.client_config("/validate"),
            core_rule(&["configmaps"], &["CREATE"]),
            json!({}),
        )],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let e = api_error(
        cms.create(
            &PostParams::default(),
            &configmap("denied", json!({"forbidden": "yes"})),
        )
        .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "admission webhook \"labels.example.com\" denied the request: forbidden label"
    );
    let e = api_error(
        cms.create(&PostParams::default(), &configmap("silent", json!({"silent": "yes"})))
            .await,
    );
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "admission webhook \"labels.example.com\" denied the request without explanation"
    );
    assert!(cms.get_opt("denied").await.unwrap().is_none());
    cms.create(&PostParams::default(), &configmap("fine", json!({})))
        .await
        .unwrap();
    let review = &reviews(&hooks, "/validate")[0];
    let request = &review["request"];
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(request["operation"], "CREATE");
    assert_eq!(
        request["kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "", "version": "v1", "resource": "configmaps"})
    );
    assert_eq!(request["namespace"], "default");
    assert_eq!(request["name"], "denied");
    assert_eq!(request["options"]["kind"], "CreateOptions");
    assert_eq!(request["userInfo"]["username"], "system:admin");
    assert!(request["uid"].as_str().is_some_and(|u| !u.is_empty()));
    env.shutdown().await;
}

/// kubectl applies a webhook configuration from YAML (discovery and the OpenAPI document know
/// the kind), is denied with the webhook's message, and prints a webhook's warnings (sent as
/// `Warning` headers).
#[tokio::test]
async fn kubectl_applies_a_configuration_and_prints_denials_and_warnings() {
    let kubectl_ok = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !kubectl_ok {
        eprintln!("SKIPPED: kubectl is not installed on this machine");
        return;
    }
    let hooks = WebhookServer::start(|_, review| {
        if review["request"]["name"] == "denied" {
            answer(
                &review,
                false,
                json!({"status": {"message": "configmaps named denied are not allowed"}}),
            )
        } else {
            answer(
                &review,
                true,
                json!({"warnings": ["configmaps are \"deprecated\" here", "second warning"]}),
            )
        }
    })
    .await;
    let env = Server::start(Config::default()).await.unwrap();
    let dir = std::env::temp_dir().join(format!("envtest-admission-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    env.write_kubeconfig(&kubeconfig).unwrap();
    let yaml = format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: warn}}
webhooks:
- name: warn.example.com
  clientConfig: {{url: \"{}\", caBundle: {}}}
  rules: [{{apiGroups: [\"\"], apiVersions: [v1], resources: [configmaps], operations: [CREATE]}}]
  sideEffects: None
  admissionReviewVersions: [v1]
",
        hooks.url("/warn"),
        hooks.ca_bundle()
    );
    std::fs::write(dir.join("webhook.yaml"), yaml).unwrap();
    let kubectl = move |args: &[&str]| {
        let out = std::process::Command::new("kubectl")
            .args(args)
            .arg("--request-timeout=20s")
            .env("KUBECONFIG", &kubeconfig)
            .env("HOME", kubeconfig.parent().unwrap())
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let webhook_yaml = dir.join("webhook.yaml").to_str().unwrap().to_owned();
    let (applied, denied, warned) = tokio::task::spawn_blocking(move || {
        (
            kubectl(&["apply", "-f", &webhook_yaml]),
            kubectl(&["create", "configmap", "denied", "--from-literal=a=b"]),
            kubectl(&["create", "configmap", "warned", "--from-literal=a=b"]),
        )
    })
    .await
    .unwrap();
    assert!(applied.0, "{}", applied.1);
    assert!(!denied.0);
    assert!(
        denied.1.contains(
            "admission webhook \"warn.example.com\" denied the request: configmaps named denied are not allowed"
        ),
        "{}",
        denied.1
    );
    assert!(warned.0, "{}", warned.1);
    assert!(
        warned.1.contains("Warning: configmaps are \"deprecated\" here")
            && warned.1.contains("Warning: second warning"),
        "{}",
        warned.1
    );
    let _ = std::fs::remove_dir_all(&dir);
    env.shutdown().await;
}

/// A mutating webhook's patch is applied to what is stored, and the patched object is
/// validated: a patch that breaks it fails the write with the validation's 422.
#[tokio::test]
async fn a_mutating_patch_is_applied_and_then_validated() {
    let hooks = WebhookServer::start(|_, review| {
        if review["request"]["object"]["metadata"]["name"] == "broken" {
            patched(
                &review,
                json!([{"op": "add", "path": "/metadata/labels", "value": {"team": "-not a label-"}}]),
            )
        } else {
            patched(
                &review,
                json!([{"op": "add", "path": "/metadata/labels", "value": {"team": "platform"}}]),
            )
        }
    })
    .await;
    let (env, client) = start_mutating(
        "defaults",
        vec![webhook(
            "team.example.com",
            hooks.client_config("/mutate"),
            core_rule(&["configmaps"], &["CREATE"]),
            json!({}),
        )],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &configmap("labelled", json!(null)))
        .await
        .unwrap();
    assert_eq!(created.metadata.labels.unwrap()["team"], "platform");
    let stored = cms.get("labelled").await.unwrap();
    assert_eq!(stored.metadata.labels.unwrap()["team"], "platform");
    let e = api_error(
        cms.create(&PostParams::default(), &configmap("broken", json!(null)))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message.contains("metadata.labels: Invalid value: \"-not a label-\""),
        "{}",
        e.message
    );
    env.shutdown().await;
}

/// Mutating webhooks run by configuration name, then webhook order; a webhook with
/// `reinvocationPolicy: IfNeeded` runs once more when a later one changed the object, one with
/// `Never` does not.
#[tokio::test]
async fn mutating_webhooks_run_in_order_and_are_reinvoked_if_needed() {
    // Each webhook appends its name (the path) to the `order` annotation.
    let hooks = WebhookServer::start(|path, review| {
        let before = review["request"]["object"]["metadata"]["annotations"]["order"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let name = path.trim_start_matches('/');
        let order = if before.is_empty() {
            name.to_owned()
        } else {
            format!("{before},{name}")
        };
        patched(
            &review,
            json!([{"op": "add", "path": "/metadata/annotations", "value": {"order": order}}]),
        )
    })
    .await;
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let rule = core_rule(&["configmaps"], &["CREATE"]);
    let hook = |name: &str, policy: &str| {
        webhook(
            &format!("{name}.example.com"),
            hooks.client_config(&format!("/{name}")),
            rule.clone(),
            json!({"reinvocationPolicy": policy}),
        )
    };
    // Created out of name order: the order is by name.
    mutating(&client, "b-config", vec![hook("b1", "Never")]).await;
    mutating(&client, "a-config", vec![hook("a1", "IfNeeded"), hook("a2", "Never")]).await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let cm = cms
        .create(&PostParams::default(), &configmap("ordered", json!(null)))
        .await
        .unwrap();
    assert_eq!(cm.metadata.annotations.unwrap()["order"], "a1,a2,b1,a1");
    env.shutdown().await;
}

/// Webhooks whose rules do not match the resource, the operation or the subresource are not
/// called; `deployments/status` matches a status write only.
#[tokio::test]
async fn webhooks_whose_rules_do_not_match_are_not_called() {
    let hooks = WebhookServer::start(|_, review| answer(&review, true, json!({}))).await;
    let (env, client) = start_validating(
        "rules",
        vec![
            webhook(
                "cm-create.example.com",
                hooks.client_config("/cm-create"),
                core_rule(&["configmaps"], &["CREATE"]),
                json!({}),
            ),
            webhook(
                "deploy-status.example.com",
                hooks.client_config("/deploy-status"),
                json!([{"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments/status"],
                    "operations": ["UPDATE"]}]),
                json!({}),
            ),
            webhook(
                "deploy-main.example.com",
                hooks.client_config("/deploy-main"),
                json!([{"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"],
                    "operations": ["UPDATE"]}]),
                json!({}),
            ),
            webhook(
                "cluster-only.example.com",
                hooks.client_config("/cluster-only"),
                json!([{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"],
                    "operations": ["CREATE"], "scope": "Cluster"}]),
                json!({}),
            ),
        ],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &configmap("c", json!(null)))
        .await
        .unwrap();
    cms.patch("c", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "w"}})))
        .await
        .unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap(),
        )
        .await
        .unwrap();
    let deployments = Api::<Deployment>::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}))
    .unwrap();
    deployments.create(&PostParams::default(), &d).await.unwrap();
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert!(
        reviews(&hooks, "/deploy-status").is_empty(),
        "not called for the main resource"
    );
    deployments
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let status = reviews(&hooks, "/deploy-status");
    assert_eq!(status.len(), 1, "called for the status write");
    assert_eq!(status[0]["request"]["subResource"], "status");
    let main = reviews(&hooks, "/deploy-main");
    assert_eq!(
        main.len(),
        1,
        "`deployments` is the main resource's write only, not /status"
    );
    assert_eq!(main[0]["request"]["subResource"], Value::Null);
    let cm_calls = reviews(&hooks, "/cm-create");
    assert_eq!(
        cm_calls.len(),
        1,
        "the configmap create only, not its update or the secret"
    );
    assert_eq!(cm_calls[0]["request"]["name"], "c");
    let namespaces = Api::<Namespace>::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "extra"}})).unwrap(),
        )
        .await
        .unwrap();
    let cluster: Vec<String> = reviews(&hooks, "/cluster-only")
        .iter()
        .map(|r| r["request"]["resource"]["resource"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(cluster, ["namespaces"], "scope Cluster: the namespace only");
    env.shutdown().await;
}

/// `namespaceSelector` sees the labels of the object's namespace, `objectSelector` those of the
/// object: excluded writes are not sent to the webhook (which would deny them).
#[tokio::test]
async fn selectors_exclude_namespaces_and_objects() {
    let hooks = WebhookServer::start(|_, review| {
        answer(
            &review,
            false,
            json!({"status": {"message": "denied by selector test"}}),
        )
    })
    .await;
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let namespaces = Api::<Namespace>::all(client.clone());
    for (name, labels) in [("exempt", json!({"webhooks": "skip"})), ("checked", json!({}))] {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap(),
            )
            .await
            .unwrap();
    }
    validating(
        &client,
        "selectors",
        vec![webhook(
            "deny.example.com",
            hooks.client_config("/deny"),
            core_rule(&["configmaps"], &["CREATE"]),
            json!({
                "namespaceSelector": {"matchExpressions": [{"key": "webhooks", "operator": "NotIn", "values": ["skip"]}]},
                "objectSelector": {"matchLabels": {"checked": "true"}},
            }),
        )],
    )
    .await;
    let create = |ns: &str, name: &str, labels: Value| {
        let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
        let cm = configmap(name, labels);
        async move { api.create(&PostParams::default(), &cm).await }
    };
    create("exempt", "a", json!({"checked": "true"})).await.unwrap();
    create("checked", "b", json!({"checked": "false"})).await.unwrap();
    let e = api_error(create("checked", "c", json!({"checked": "true"})).await);
    assert_eq!(e.code, 403);
    assert!(e.message.contains("denied by selector test"), "{}", e.message);
    assert_eq!(reviews(&hooks, "/deny").len(), 1, "only the write both selectors match");
    env.shutdown().await;
}

/// Against a webhook that is down: `failurePolicy: Fail` fails the write with a 500 naming the
/// webhook, `Ignore` lets it through.
#[tokio::test]
async fn failure_policy_decides_when_a_webhook_is_down() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let port = closed_port();
    let url = format!("https://127.0.0.1:{port}/validate");
    validating(
        &client,
        "down",
        vec![
            webhook(
                "fail.example.com",
                json!({"url": url}),
                core_rule(&["configmaps"], &["CREATE"]),
                json!({"failurePolicy": "Fail", "objectSelector": {"matchLabels": {"policy": "fail"}}}),
            ),
            webhook(
                "ignore.example.com",
                json!({"url": url}),
                core_rule(&["configmaps"], &["CREATE"]),
                json!({"failurePolicy": "Ignore", "objectSelector": {"matchLabels": {"policy": "ignore"}}}),
            ),
        ],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let e = api_error(
        cms.create(&PostParams::default(), &configmap("f", json!({"policy": "fail"})))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    assert!(
        e.message.starts_with(&format!(
            "Internal error occurred: failed calling webhook \"fail.example.com\": failed to call webhook: Post \"https://127.0.0.1:{port}/validate?timeout=10s\""
        )),
        "{}",
        e.message
    );
    cms.create(&PostParams::default(), &configmap("i", json!({"policy": "ignore"})))
        .await
        .unwrap();
    env.shutdown().await;
}

/// A webhook that never answers: after `timeoutSeconds`, `Fail` fails the write with kube-
/// apiserver's deadline message, `Ignore` lets it through.
#[tokio::test]
async fn a_webhook_that_never_answers_times_out() {
    // Bound but never accepting: connections queue, nothing is ever answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}/validate", silent.local_addr().unwrap());
    let (env, client) = start_validating(
        "silent",
        vec![
            webhook(
                "fail.example.com",
                json!({"url": url}),
                core_rule(&["configmaps"], &["CREATE"]),
                json!({"timeoutSeconds": 1, "objectSelector": {"matchLabels": {"policy": "fail"}}}),
            ),
            webhook(
                "ignore.example.com",
                json!({"url": url}),
                core_rule(&["configmaps"], &["CREATE"]),
                json!({"timeoutSeconds": 1, "failurePolicy": "Ignore",
                    "objectSelector": {"matchLabels": {"policy": "ignore"}}}),
            ),
        ],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let e = api_error(
        cms.create(&PostParams::default(), &configmap("f", json!({"policy": "fail"})))
            .await,
    );
    assert_eq!(e.code, 500);
    assert!(
        e.message.contains("failed calling webhook \"fail.example.com\"")
            && e.message.ends_with("?timeout=1s\": context deadline exceeded"),
        "{}",
        e.message
    );
    cms.create(&PostParams::default(), &configmap("i", json!({"policy": "ignore"})))
        .await
        .unwrap();
    drop(silent);
    env.shutdown().await;
}

/// The webhook's certificate is verified against `caBundle`: another CA's bundle makes the call
/// fail (refused before any request reaches the webhook).
#[tokio::test]
async fn a_ca_bundle_that_does_not_match_is_refused() {
    let hooks = WebhookServer::start(|_, review| answer(&review, true, json!({}))).await;
    let other = WebhookServer::start(|_, review| answer(&review, true, json!({}))).await;
    let (env, client) = start_validating(
        "tls",
        vec![webhook(
            "tls.example.com",
            json!({"url": hooks.url("/validate"), "caBundle": other.ca_bundle()}),
            core_rule(&["configmaps"], &["CREATE"]),
            json!({}),
        )],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let e = api_error(cms.create(&PostParams::default(), &configmap("c", json!(null))).await);
    assert_eq!(e.code, 500);
    assert!(
        e.message.contains("failed calling webhook \"tls.example.com\"") && e.message.contains("tls: "),
        "{}",
        e.message
    );
    assert!(hooks.received().is_empty(), "no request past the handshake");
    // The right bundle: the same webhook is called and allows.
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    api.patch(
        "tls",
        &PatchParams::default(),
        &Patch::Json::<()>(
            serde_json::from_value(json!([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle",
                "value": hooks.ca_bundle()}]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    cms.create(&PostParams::default(), &configmap("c", json!(null)))
        .await
        .unwrap();
    assert_eq!(reviews(&hooks, "/validate").len(), 1);
    env.shutdown().await;
}

/// A dry run is sent to a webhook without side effects with `dryRun: true`, and nothing is
/// stored.
#[tokio::test]
async fn a_dry_run_reaches_webhooks_without_side_effects() {
    let hooks = WebhookServer::start(|_, review| answer(&review, true, json!({}))).await;
    let (env, client) = start_validating(
        "dry",
        vec![webhook(
            "dry.example.com",
            hooks.client_config("/validate"),
            core_rule(&["configmaps"], &["CREATE"]),
            json!({"sideEffects": "NoneOnDryRun"}),
        )],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    cms.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &configmap("d", json!(null)),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("d").await.unwrap().is_none());
    let calls = reviews(&hooks, "/validate");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["request"]["dryRun"], true);
    assert_eq!(calls[0]["request"]["options"]["dryRun"], json!(["All"]));
    env.shutdown().await;
}

/// A delete is admitted with the stored object as `oldObject` and no `object`; a denial keeps
/// the object.
#[tokio::test]
async fn a_delete_is_admitted_with_the_old_object() {
    let hooks = WebhookServer::start(|_, review| {
        if review["request"]["oldObject"]["metadata"]["labels"]["protected"] == "true" {
            answer(
                &review,
                false,
                json!({"status": {"code": 403, "reason": "Forbidden", "message": "protected"}}),
            )
        } else {
            answer(&review, true, json!({}))
        }
    })
    .await;
    let (env, client) = start_validating(
        "deletes",
        vec![webhook(
            "protect.example.com",
            hooks.client_config("/delete"),
            core_rule(&["configmaps"], &["DELETE"]),
            json!({}),
        )],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &configmap("keep", json!({"protected": "true"})))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &configmap("drop", json!(null)))
        .await
        .unwrap();
    let e = api_error(cms.delete("keep", &DeleteParams::default()).await);
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "admission webhook \"protect.example.com\" denied the request: protected"
    );
    assert!(cms.get_opt("keep").await.unwrap().is_some());
    cms.delete("drop", &DeleteParams::default()).await.unwrap();
    assert!(cms.get_opt("drop").await.unwrap().is_none());
    let calls = reviews(&hooks, "/delete");
    assert_eq!(calls.len(), 2);
    let request = &calls[0]["request"];
    assert_eq!(request["operation"], "DELETE");
    assert_eq!(request["object"], Value::Null);
    assert_eq!(request["oldObject"]["metadata"]["name"], "keep");
    assert_eq!(request["options"]["kind"], "DeleteOptions");
    env.shutdown().await;
}

/// A webhook named by `service` is called at the address `Config::webhook_service` maps the
/// service to, its certificate verified for `<name>.<namespace>.svc`; a `/scale` write is
/// admitted as its `autoscaling/v1` `Scale`.
#[tokio::test]
async fn a_service_webhook_is_reached_through_the_config_and_scale_is_admitted_as_scale() {
    let hooks = WebhookServer::start_for(&["hooks.webhooks.svc"], |_, review| {
        if review["request"]["object"]["spec"]["replicas"].as_i64() > Some(5) {
            answer(&review, false, json!({"status": {"message": "at most 5 replicas"}}))
        } else {
            answer(&review, true, json!({}))
        }
    })
    .await;
    let env = Server::start(Config::default().webhook_service("webhooks", "hooks", hooks.address()))
        .await
        .unwrap();
    let client = env.client();
    validating(
        &client,
        "scale",
        vec![webhook(
            "scale.example.com",
            json!({"service": {"namespace": "webhooks", "name": "hooks", "path": "/scale"},
                "caBundle": hooks.ca_bundle()}),
            json!([{"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments/scale"],
                "operations": ["UPDATE"]}]),
            json!({}),
        )],
    )
    .await;
    let deployments = Api::<Deployment>::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}))
    .unwrap();
    deployments.create(&PostParams::default(), &d).await.unwrap();
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let e = api_error(
        deployments
            .patch_scale(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 9}})),
            )
            .await,
    );
    assert_eq!(e.code, 403);
    assert!(e.message.contains("at most 5 replicas"), "{}", e.message);
    assert_eq!(deployments.get("web").await.unwrap().spec.unwrap().replicas, Some(3));
    let calls = reviews(&hooks, "/scale");
    assert_eq!(calls.len(), 2);
    let request = &calls[0]["request"];
    assert_eq!(
        request["kind"],
        json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
    );
    assert_eq!(request["resource"]["resource"], "deployments");
    assert_eq!(request["subResource"], "scale");
    assert_eq!(request["object"]["kind"], "Scale");
    assert_eq!(request["oldObject"]["spec"]["replicas"], 1);
    // Without the mapping, the service cannot be reached: the call fails (Fail: 500).
    let unmapped = Server::start(Config::default()).await.unwrap();
    validating(
        &unmapped.client(),
        "scale",
        vec![webhook(
            "scale.example.com",
            json!({"service": {"namespace": "webhooks", "name": "hooks"}, "caBundle": hooks.ca_bundle()}),
            json!([{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "operations": ["CREATE"]}]),
            json!({}),
        )],
    )
    .await;
    let e = api_error(
        Api::<ConfigMap>::namespaced(unmapped.client(), "default")
            .create(&PostParams::default(), &configmap("c", json!(null)))
            .await,
    );
    assert_eq!(e.code, 500);
    assert!(
        e.message.contains("service \"webhooks/hooks\" has no address"),
        "{}",
        e.message
    );
    unmapped.shutdown().await;
    env.shutdown().await;
}

/// `widgets.conv.example.com`: v1alpha1 has `spec.size`, v1 (storage) `spec.replicas`,
/// converted by the webhook at `client_config` (`convert_widget`).
fn widget_crd(client_config: Value) -> CustomResourceDefinition {
    let schema = |field: &str| {
        json!({"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {field: {"type": "integer"}}}}}})
    };
    serde_json::from_value(json!({
        "metadata": {"name": "widgets.conv.example.com"},
        "spec": {
            "group": "conv.example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1alpha1", "served": true, "storage": false, "schema": schema("size")},
                {"name": "v1", "served": true, "storage": true, "schema": schema("replicas")},
            ],
            "conversion": {"strategy": "Webhook", "webhook": {
                "clientConfig": client_config, "conversionReviewVersions": ["v1"]}},
        },
    }))
    .unwrap()
}

/// The widget conversion: `spec.size` (v1alpha1) and `spec.replicas` (v1).
fn convert_widget(mut obj: Value, desired: &str) -> Value {
    let (from, to) = if desired.ends_with("/v1") {
        ("size", "replicas")
    } else {
        ("replicas", "size")
    };
    if let Some(spec) = obj["spec"].as_object_mut()
        && let Some(v) = spec.remove(from)
    {
        spec.insert(to.to_owned(), v);
    }
    obj["apiVersion"] = json!(desired);
    obj
}

fn widgets(client: &kube::Client, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("conv.example.com", version, "Widget");
    Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    )
}

/// `matchPolicy: Equivalent` (the default): webhooks whose rules name v1 of a two-version CRD
/// are called for a v1alpha1 create with the object converted to v1 (by the CRD's conversion
/// webhook), `kind`/`resource` v1 and `requestKind`/`requestResource` v1alpha1; the mutating
/// patch, written against v1, reaches the v1alpha1 object converted back. `Exact` is not called
/// for v1alpha1, and is for v1. A v1alpha1 delete sends the old object in v1.
#[tokio::test]
async fn equivalent_match_policy_calls_a_webhook_in_the_version_its_rules_name() {
    let hooks = WebhookServer::start(|path, review| match path {
        "/convert" => conversion_response(&review, convert_widget),
        "/mutate" => patched(
            &review,
            json!([{"op": "replace", "path": "/spec/replicas", "value": 5}]),
        ),
        _ => answer(&review, true, json!({})),
    })
    .await;
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &widget_crd(hooks.client_config("/convert")))
        .await
        .unwrap();
    let v1_rule = json!([{"apiGroups": ["conv.example.com"], "apiVersions": ["v1"], "resources": ["widgets"], "operations": ["CREATE"]}]);
    mutating(
        &client,
        "m",
        vec![webhook(
            "five.example.com",
            hooks.client_config("/mutate"),
            v1_rule.clone(),
            json!({}),
        )],
    )
    .await;
    validating(
        &client,
        "v",
        vec![
            webhook(
                "equivalent.example.com",
                hooks.client_config("/equivalent"),
                json!([{"apiGroups": ["conv.example.com"], "apiVersions": ["v1"], "resources": ["widgets"], "operations": ["CREATE", "DELETE"]}]),
                json!({}),
            ),
            webhook(
                "exact.example.com",
                hooks.client_config("/exact"),
                v1_rule,
                json!({"matchPolicy": "Exact"}),
            ),
        ],
    )
    .await;

    let alpha = widgets(&client, "v1alpha1");
    let widget: DynamicObject = serde_json::from_value(json!({"apiVersion": "conv.example.com/v1alpha1",
        "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}}))
    .unwrap();
    let created = alpha.create(&PostParams::default(), &widget).await.unwrap();
    assert_eq!(created.data["spec"], json!({"size": 5}), "the v1 patch, converted back");

    let mutated = reviews(&hooks, "/mutate");
    assert_eq!(mutated.len(), 1);
    let request = &mutated[0]["request"];
    assert_eq!(
        request["kind"],
        json!({"group": "conv.example.com", "version": "v1", "kind": "Widget"})
    );
    assert_eq!(
        request["resource"],
        json!({"group": "conv.example.com", "version": "v1", "resource": "widgets"})
    );
    assert_eq!(
        request["requestKind"],
        json!({"group": "conv.example.com", "version": "v1alpha1", "kind": "Widget"})
    );
    assert_eq!(
        request["requestResource"],
        json!({"group": "conv.example.com", "version": "v1alpha1", "resource": "widgets"})
    );
    assert_eq!(request["object"]["apiVersion"], "conv.example.com/v1");
    assert_eq!(request["object"]["spec"], json!({"replicas": 1}));
    let validated = reviews(&hooks, "/equivalent");
    assert_eq!(validated.len(), 1);
    assert_eq!(validated[0]["request"]["object"]["spec"], json!({"replicas": 5}));
    assert_eq!(validated[0]["request"]["requestKind"]["version"], "v1alpha1");
    assert!(reviews(&hooks, "/exact").is_empty(), "Exact is not called for v1alpha1");

    let widget: DynamicObject = serde_json::from_value(json!({"apiVersion": "conv.example.com/v1",
        "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"replicas": 1}}))
    .unwrap();
    widgets(&client, "v1")
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    let exact = reviews(&hooks, "/exact");
    assert_eq!(exact.len(), 1, "Exact is called for v1");
    assert_eq!(exact[0]["request"]["requestKind"]["version"], "v1");

    // A delete in v1alpha1 sends the old object converted to v1.
    alpha.delete("w", &DeleteParams::default()).await.unwrap();
    let deleted: Vec<Value> = reviews(&hooks, "/equivalent")
        .into_iter()
        .filter(|r| r["request"]["operation"] == "DELETE")
        .collect();
    assert_eq!(deleted.len(), 1);
    let old = &deleted[0]["request"]["oldObject"];
    assert_eq!(
        (old["apiVersion"].as_str(), &old["spec"]),
        (Some("conv.example.com/v1"), &json!({"replicas": 5}))
    );
    assert_eq!(deleted[0]["request"]["requestKind"]["version"], "v1alpha1");
    env.shutdown().await;
}

/// `matchConditions` decide whether a webhook is called: a false condition skips it; a
/// condition that fails to evaluate fails the request with `403` under `failurePolicy: Fail`
/// (kube-apiserver's message) and skips the webhook under `Ignore`.
#[tokio::test]
async fn match_conditions_decide_whether_a_webhook_is_called() {
    let hooks = WebhookServer::start(|_, review| {
        answer(
            &review,
            false,
            json!({"status": {"code": 403, "message": "denied by the test"}}),
        )
    })
    .await;
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let only = |policy: &str| json!({"matchLabels": {"policy": policy}});
    validating(
        &client,
        "conditions",
        vec![
            webhook(
                "conditioned.example.com",
                hooks.client_config("/conditioned"),
                core_rule(&["configmaps"], &["CREATE"]),
                json!({"objectSelector": only("conditioned"), "matchConditions": [
                    {"name": "not-exempt", "expression": "!('exempt' in object.metadata.labels)"},
                    {"name": "configmaps", "expression": "request.kind.kind == 'ConfigMap' && request.operation == 'CREATE' && oldObject == null"},
                ]}),
            ),
            webhook(
                "fail.example.com",
                hooks.client_config("/fail"),
                core_rule(&["configmaps"], &["CREATE"]),
                json!({"objectSelector": only("fail"), "failurePolicy": "Fail",
                    "matchConditions": [{"name": "broken", "expression": "object.data.missing == 'x'"}]}),
            ),
            webhook(
                "ignore.example.com",
                hooks.client_config("/ignore"),
                core_rule(&["configmaps"], &["CREATE"]),
                json!({"objectSelector": only("ignore"), "failurePolicy": "Ignore",
                    "matchConditions": [{"name": "broken", "expression": "object.data.missing == 'x'"}]}),
            ),
        ],
    )
    .await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &configmap("exempt", json!({"policy": "conditioned", "exempt": "yes"})),
    )
    .await
    .unwrap();
    assert!(
        reviews(&hooks, "/conditioned").is_empty(),
        "a false condition skips the webhook"
    );
    let e = api_error(
        cms.create(
            &PostParams::default(),
            &configmap("held", json!({"policy": "conditioned"})),
        )
        .await,
    );
    assert_eq!(
        e.message,
        "admission webhook \"conditioned.example.com\" denied the request: denied by the test"
    );
    assert_eq!(reviews(&hooks, "/conditioned").len(), 1, "all conditions true: called");

    let e = api_error(
        cms.create(&PostParams::default(), &configmap("f", json!({"policy": "fail"})))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "configmaps \"f\" is forbidden: expression 'object.data.missing == 'x'' resulted in error: no such key: missing"
    );
    cms.create(&PostParams::default(), &configmap("i", json!({"policy": "ignore"})))
        .await
        .unwrap();
    assert!(reviews(&hooks, "/fail").is_empty() && reviews(&hooks, "/ignore").is_empty());
    env.shutdown().await;
}

/// `matchConditions` are checked when a configuration is written, with kube-apiserver's field
/// paths: an expression that does not compile, names missing or repeated, more than 64.
#[tokio::test]
async fn match_conditions_that_do_not_compile_are_refused() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let with_conditions = |conditions: Value| {
        let hook = webhook(
            "c.example.com",
            json!({"url": "https://127.0.0.1:1/x"}),
            core_rule(&["configmaps"], &["CREATE"]),
            json!({"matchConditions": conditions}),
        );
        serde_json::from_value::<ValidatingWebhookConfiguration>(json!({"metadata": {"name": "c"}, "webhooks": [hook]}))
            .unwrap()
    };
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let e = api_error(
        api.create(
            &PostParams::default(),
            &with_conditions(json!([
                {"name": "a", "expression": "object.metadata.name =="},
                {"name": "a", "expression": "self.x == 1"},
                {"name": "", "expression": "true"},
            ])),
        )
        .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    let causes: Vec<(String, String)> = e
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| (c.field, c.message))
        .collect();
    let fields: Vec<&str> = causes.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "webhooks[0].matchConditions[0].expression",
            "webhooks[0].matchConditions[1].expression",
            "webhooks[0].matchConditions[1].name",
            "webhooks[0].matchConditions[2].name",
        ],
        "{causes:?}"
    );
    assert!(causes[0].1.contains("compilation failed: "), "{causes:?}");
    assert!(causes[1].1.contains("undeclared reference to 'self'"), "{causes:?}");
    let many: Vec<Value> = (0..65)
        .map(|i| json!({"name": format!("c{i}"), "expression": "true"}))
        .collect();
    let e = api_error(api.create(&PostParams::default(), &with_conditions(json!(many))).await);
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("webhooks[0].matchConditions: Too many: 65: must have at most 64 items"),
        "{}",
        e.message
    );
    api.create(
        &PostParams::default(),
        &with_conditions(json!([{"name": "ok", "expression": "has(object.data) && request.dryRun == false"}])),
    )
    .await
    .unwrap();
    env.shutdown().await;
}
