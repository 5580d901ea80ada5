//! The code `cargo xtask codegen` generates from `examples/kinformer-codegen.toml` (see
//! `examples::generated`): objects valid under each CRD's schema decode into the generated
//! types and encode back to the same JSON; over envtest, the CRDs installed from the same YAML
//! serve objects that the generated informers cache and the generated listers return.

use std::time::Duration;

use examples::generated::builtin::GeneratedInformers;
use examples::generated::certificates_certs_kinformer_dev::v1::{
    Certificate, CertificateSpec, CertificateSpecUsages, IssuerRef, PrivateKey, PrivateKeyAlgorithm,
};
use examples::generated::gatewayclasses_gateway_kinformer_dev::{v1 as gateway_v1, v1beta1 as gateway_v1beta1};
use examples::generated::profiles_config_kinformer_dev::v1::{
    Profile, ProfileSpec, ProfileSpecHosts, ProfileSpecMode, ProfileStatusPhase, RulesOperator,
};
use examples::generated::profiles_config_kinformer_dev::v1beta1 as profile_v1beta1;
use examples::generated::servicemonitors_monitoring_kinformer_dev::v1::{
    EndpointsScheme, RelabelingsAction, ServiceMonitor,
};
use examples::generated::workflows_flow_kinformer_dev::v1alpha1::Workflow;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kinformer::cache::Selector;
use kinformer::factory::SharedInformerFactory;
use kinformer::quantity::Quantity;
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Decodes `sample` as `T`, encodes it again, and requires the same JSON back.
fn round_trip<T: DeserializeOwned + Serialize>(sample: Value) -> T {
    let decoded: T = serde_json::from_value(sample.clone()).unwrap_or_else(|e| panic!("{e}: {sample:#}"));
    let encoded = serde_json::to_value(&decoded).unwrap();
    assert_eq!(encoded, sample, "the round trip changed the object");
    decoded
}

fn certificate_sample() -> Value {
    json!({
        "apiVersion": "certs.kinformer.dev/v1",
        "kind": "Certificate",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "secretName": "web-tls",
            "commonName": "web.example.com",
            "dnsNames": ["web.example.com", "www.example.com"],
            "ipAddresses": ["10.0.0.1"],
            "duration": "2160h",
            "renewBefore": "360h",
            "revisionHistoryLimit": 3,
            "isCA": false,
            "usages": ["digital signature", "server auth"],
            "privateKey": {"algorithm": "ECDSA", "encoding": "PKCS8", "size": 256, "rotationPolicy": "Always"},
            "issuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer", "group": "certs.kinformer.dev"},
            "secretTemplate": {"annotations": {"a": "1"}, "labels": {"tier": "edge"}},
            "subject": {"organizations": ["Example"], "serialNumber": "42"}
        },
        "status": {
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Issued", "message": "ok",
                "lastTransitionTime": "2026-11-25T10:00:00Z", "observedGeneration": 4
            }],
            "notAfter": "2027-02-23T10:00:00Z",
            "revision": 7,
            "failedIssuanceAttempts": 0
        }
    })
}

#[test]
fn valid_objects_of_every_generated_type_round_trip_through_json() {
    let cert: Certificate = round_trip(certificate_sample());
    assert_eq!(cert.spec.issuer_ref.name, "letsencrypt");
    assert_eq!(
        cert.spec.private_key.as_ref().and_then(|k| k.algorithm.clone()),
        Some(PrivateKeyAlgorithm::Ecdsa)
    );
    assert_eq!(
        cert.spec.usages.as_deref(),
        Some(
            &[
                CertificateSpecUsages::DigitalSignature,
                CertificateSpecUsages::ServerAuth
            ][..]
        )
    );
    // Only what is required: the optional fields stay absent.
    round_trip::<Certificate>(json!({
        "apiVersion": "certs.kinformer.dev/v1", "kind": "Certificate",
        "metadata": {"name": "min"},
        "spec": {"secretName": "s", "issuerRef": {"name": "i"}}
    }));

    let monitor: ServiceMonitor = round_trip(json!({
        "apiVersion": "monitoring.kinformer.dev/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "api", "namespace": "monitoring"},
        "spec": {
            "jobLabel": "app",
            "type": "keyword",
            "sampleLimit": 5000,
            "selector": {
                "matchLabels": {"app": "api"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]
            },
            "namespaceSelector": {"any": false, "matchNames": ["prod"]},
            "endpoints": [
                {
                    "port": "metrics", "path": "/metrics", "scheme": "https", "interval": "30s",
                    "honorLabels": true, "sampleRatio": 0.25,
                    "params": {"module": ["http_2xx"]},
                    "relabelings": [{"action": "labelmap", "regex": "__meta_(.+)", "sourceLabels": ["a", "b"], "modulus": 8}],
                    "tlsConfig": {"insecureSkipVerify": false, "serverName": "api", "ca": {"secret": {"key": "ca.crt", "name": "ca"}}}
                },
                {"targetPort": 9090},
                {"targetPort": "web"}
            ]
        }
    }));
    let endpoints = &monitor.spec.endpoints;
    assert_eq!(endpoints[0].scheme, Some(EndpointsScheme::Https));
    assert_eq!(
        endpoints[0].relabelings.as_ref().and_then(|r| r[0].action.clone()),
        Some(RelabelingsAction::Labelmap)
    );
    assert_eq!(endpoints[1].target_port, Some(IntOrString::Int(9090)));
    assert_eq!(endpoints[2].target_port, Some(IntOrString::String("web".into())));
    assert_eq!(monitor.spec.r#type.as_deref(), Some("keyword"));

    let class: gateway_v1::GatewayClass = round_trip(json!({
        "apiVersion": "gateway.kinformer.dev/v1",
        "kind": "GatewayClass",
        "metadata": {"name": "internet"},
        "spec": {
            "controllerName": "example.com/gateway",
            "description": "public",
            "parametersRef": {"group": "", "kind": "ConfigMap", "name": "params", "namespace": "gw"}
        },
        "status": {
            "conditions": [{"type": "Accepted", "status": "Unknown", "reason": "Pending", "message": "Waiting", "lastTransitionTime": "1970-01-01T00:00:00Z"}],
            "supportedFeatures": [{"name": "HTTPRoute"}]
        }
    }));
    assert_eq!(
        class
            .spec
            .parameters_ref
            .as_ref()
            .and_then(Option::as_ref)
            .map(|p| p.kind.as_str()),
        Some("ConfigMap")
    );
    #[allow(deprecated)] // v1beta1 is deprecated in the CRD, so its type is too.
    round_trip::<gateway_v1beta1::GatewayClass>(json!({
        "apiVersion": "gateway.kinformer.dev/v1beta1",
        "kind": "GatewayClass",
        "metadata": {"name": "old"},
        "spec": {"controllerName": "example.com/gateway"}
    }));

    // Fields the schema does not name are kept where it says to keep them.
    let workflow: Workflow = round_trip(json!({
        "apiVersion": "flow.kinformer.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "build", "namespace": "ci"},
        "spec": {
            "entrypoint": "main",
            "parallelism": 2,
            "serviceAccountName": "builder",
            "arguments": {"parameters": [{"name": "rev", "value": "abc"}]},
            "templates": [{"name": "main", "container": {"image": "alpine", "command": ["true"]}}],
            "podResources": {"limits": {"cpu": 1, "memory": "1Gi"}, "requests": {"memory": 8_589_934_592_u64, "cpu": "500m"}},
            "exposedPorts": [8080, "metrics"]
        },
        "status": {"phase": "Running", "nodes": {"build-1": {"phase": "Succeeded"}}}
    }));
    assert_eq!(workflow.spec.extra["serviceAccountName"], "builder");
    assert_eq!(workflow.spec.parallelism, Some(2));
    // Quantities keep their JSON form (a number stays a number, even past i32), int-or-string
    // values in an array are IntOrString.
    let resources = workflow.spec.pod_resources.as_ref().unwrap();
    let limits = resources.limits.as_ref().unwrap();
    assert_eq!(limits["cpu"], Quantity::from(1));
    assert_eq!(limits["memory"], Quantity::from("1Gi"));
    assert_eq!(resources.requests.as_ref().unwrap()["memory"].to_string(), "8589934592");
    assert_eq!(
        workflow.spec.exposed_ports.as_deref(),
        Some(&[IntOrString::Int(8080), IntOrString::String("metrics".into())][..])
    );
}

/// The CRDs the code was generated from, as the server gets them.
fn crds_from_yaml() -> Vec<CustomResourceDefinition> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/codegen");
    let mut paths: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            serde_saphyr::from_str(&std::fs::read_to_string(p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        })
        .collect()
}

#[tokio::test]
async fn generated_informers_and_listers_serve_objects_of_crds_installed_from_the_yaml() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    examples::demo::install_crds(&client, &crds_from_yaml()).await.unwrap();

    let certs: Api<Certificate> = Api::namespaced(client.clone(), "default");
    let mut cert = Certificate::new(
        "web",
        CertificateSpec {
            secret_name: "web-tls".into(),
            issuer_ref: IssuerRef {
                name: "letsencrypt".into(),
                kind: Some("ClusterIssuer".into()),
                group: None,
            },
            dns_names: Some(vec!["web.example.com".into()]),
            private_key: Some(PrivateKey {
                algorithm: Some(PrivateKeyAlgorithm::Ed25519),
                ..Default::default()
            }),
            common_name: None,
            ip_addresses: None,
            duration: None,
            renew_before: None,
            revision_history_limit: Some(2),
            is_ca: None,
            usages: None,
            secret_template: None,
            subject: None,
        },
    );
    cert.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    certs.create(&PostParams::default(), &cert).await.unwrap();
    let classes: Api<gateway_v1::GatewayClass> = Api::all(client.clone());
    let class = gateway_v1::GatewayClass::new(
        "internet",
        gateway_v1::GatewayClassSpec {
            controller_name: "example.com/gateway".into(),
            description: None,
            parameters_ref: None,
        },
    );
    classes.create(&PostParams::default(), &class).await.unwrap();
    let workflows: Api<Workflow> = Api::namespaced(client.clone(), "default");
    let workflow: Workflow = serde_json::from_value(json!({
        "apiVersion": "flow.kinformer.dev/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "build", "namespace": "default"},
        "spec": {"entrypoint": "main", "serviceAccountName": "builder", "podResources": {"limits": {"cpu": 2, "memory": "1Gi"}}}
    }))
    .unwrap();
    workflows.create(&PostParams::default(), &workflow).await.unwrap();

    let factory = SharedInformerFactory::new(client, Duration::ZERO);
    let cert_informer = Certificate::informer(&factory).unwrap();
    let class_informer = gateway_v1::GatewayClassInformer::new(&factory).unwrap();
    let workflow_informer = Workflow::informer(&factory).unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert!(synced.len() == 3 && synced.values().all(|ok| *ok), "{synced:?}");

    let cached = cert_informer.lister().certificates("default").get("web").unwrap();
    assert_eq!(cached.spec.secret_name, "web-tls");
    assert_eq!(
        cached.spec.private_key.as_ref().and_then(|k| k.algorithm.clone()),
        Some(PrivateKeyAlgorithm::Ed25519)
    );
    let selector: Selector = kinformer::cache::Expression::Equal("app".into(), "web".into()).into();
    assert_eq!(cert_informer.lister().list(&selector).len(), 1);
    assert!(cert_informer.lister().certificates("other").get("web").is_none());
    let cached = class_informer.lister().get("internet").unwrap();
    assert_eq!(cached.spec.controller_name, "example.com/gateway");
    let cached = workflow_informer.lister().workflows("default").get("build").unwrap();
    assert_eq!(
        cached.spec.extra["serviceAccountName"], "builder",
        "unknown fields survive the server and the cache"
    );
    let limits = cached
        .spec
        .pod_resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .unwrap();
    assert_eq!(
        serde_json::to_value(limits).unwrap(),
        json!({"cpu": 2, "memory": "1Gi"}),
        "a quantity written as a number comes back from the server and the cache as a number"
    );
    factory.shutdown().await;
}

#[test]
fn generated_built_in_accessors_hand_out_typed_informers() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let factory = SharedInformerFactory::new(client, Duration::ZERO);
    let pdbs = factory.generated().policy().v1().poddisruptionbudgets().unwrap();
    let limits = factory.generated().core().v1().limitranges().unwrap();
    assert!(!pdbs.has_synced() && !limits.has_synced(), "nothing started");
    assert!(pdbs.lister().poddisruptionbudgets("default").get("x").is_none());
}

#[test]
fn the_generated_types_give_kube_a_schema_that_says_what_the_yaml_says() {
    use kube::CustomResourceExt;
    let crd = ServiceMonitor::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("servicemonitors.monitoring.kinformer.dev")
    );
    assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["smon".to_string()][..]));
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    let endpoint = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["endpoints"]["items"]["properties"];
    assert_eq!(
        endpoint["targetPort"]["x-kubernetes-int-or-string"], true,
        "{endpoint:#}"
    );
    // kube's schema for an optional enum adds `null` to the values.
    let schemes: Vec<&Value> = endpoint["scheme"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| !v.is_null())
        .collect();
    assert_eq!(
        schemes,
        [&json!("http"), &json!("https"), &json!("HTTP"), &json!("HTTPS")]
    );
    let class = gateway_v1::GatewayClass::crd();
    assert_eq!(class.spec.scope, "Cluster");
    assert!(
        class.spec.versions[0]
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some())
    );
}

#[test]
fn the_checked_in_generated_code_is_what_kinformer_codegen_makes_of_the_config() {
    use kinformer::codegen::project::{Mode, run};
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kinformer-codegen.toml");
    let outcome = run(&config, Mode::Check).unwrap();
    assert!(
        outcome.changed.is_empty() && outcome.stale.is_empty(),
        "examples/src/generated is stale, run `cargo xtask codegen`: {outcome:?}"
    );
    assert_eq!(outcome.unchanged, 7, "five CRDs, builtin.rs and mod.rs");
}

fn profile_sample() -> Value {
    json!({
        "apiVersion": "config.kinformer.dev/v1",
        "kind": "Profile",
        "metadata": {"name": "edge", "namespace": "default"},
        "spec": {
            "mode": "Permissive",
            "replicas": 2,
            "weight": 100,
            "ratios": [0.5, 2, -3, 1e300],
            "hosts": ["*", "LOCAL", "local", "Other"]
        },
        "data": {"tier": "edge"},
        "rules": [
            {"key": "cpu", "operator": ">=", "threshold": 3},
            {"key": "zone", "operator": "in"},
            {"key": "arch", "operator": "-", "threshold": 0.25}
        ],
        "status": {"replicas": 2, "selector": "app=edge", "phase": "Ready"},
        "owner": "team-a"
    })
}

#[test]
fn a_root_with_top_level_fields_numbers_and_odd_enum_values_round_trips_through_json() {
    let profile: Profile = round_trip(profile_sample());
    // Top-level fields other than spec and status are typed fields of the root…
    assert_eq!(profile.data.as_ref().map(|d| d["tier"].as_str()), Some("edge"));
    let rules = profile.rules.as_deref().unwrap();
    assert_eq!(
        rules.iter().map(|r| r.operator.clone()).collect::<Vec<_>>(),
        [RulesOperator::GreaterEqual, RulesOperator::In2, RulesOperator::Dash]
    );
    // …and the ones the schema does not declare are kept, apiVersion and kind aside.
    assert_eq!(profile.extra, [("owner".to_string(), json!("team-a"))].into());
    // Numbers are f64 for arithmetic; integral ones were written back as integers above.
    assert_eq!(profile.spec.weight, Some(100.0));
    assert_eq!(rules[0].threshold.map(|t| t * 2.0), Some(6.0));
    // Names for values that are not identifiers, and for values that differ only in case (the
    // one spelled most like the name keeps it); `Other` stays the catch-all.
    assert_eq!(
        profile.spec.hosts.as_deref().unwrap(),
        [
            ProfileSpecHosts::Star,
            ProfileSpecHosts::Local2,
            ProfileSpecHosts::Local,
            ProfileSpecHosts::Other2
        ]
    );
    assert_eq!(
        profile.status.as_ref().and_then(|s| s.phase.clone()),
        Some(ProfileStatusPhase::Ready)
    );
    // The schema's default is the enum's Default.
    assert_eq!(ProfileSpecMode::default(), ProfileSpecMode::Strict);

    // A value added to the CRD later decodes as `Other` and is written back unchanged.
    let mut newer = profile_sample();
    newer["spec"]["mode"] = json!("Audit");
    newer["rules"][1]["operator"] = json!("Matches");
    let profile: Profile = round_trip(newer);
    assert_eq!(profile.spec.mode, ProfileSpecMode::Other("Audit".into()));

    // `new` writes apiVersion and kind first, as kube's derive does.
    let written = serde_json::to_string(&Profile::new(
        "min",
        ProfileSpec {
            mode: ProfileSpecMode::Strict,
            hosts: None,
            ratios: None,
            replicas: None,
            weight: None,
        },
    ))
    .unwrap();
    assert!(
        written.starts_with(r#"{"apiVersion":"config.kinformer.dev/v1","kind":"Profile","metadata":{"name":"min"}"#),
        "{written}"
    );
}

#[test]
#[allow(deprecated)] // v1beta1 is deprecated in the CRD, so its type is too.
fn the_generated_root_carries_the_crd_as_its_yaml_says() {
    use kube::core::object::{HasSpec, HasStatus};
    use kube::{CustomResourceExt, Resource};
    let crd = Profile::crd();
    let from_yaml = crds_from_yaml()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("profiles.config.kinformer.dev"))
        .unwrap();
    assert_eq!(
        crd, from_yaml,
        "crd() is the CRD of the YAML, every version and field of it"
    );
    let v1 = &crd.spec.versions[0];
    let scale = v1.subresources.as_ref().and_then(|s| s.scale.as_ref()).unwrap();
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(
        v1.additional_printer_columns.as_ref().unwrap()[0].json_path,
        ".spec.mode"
    );
    assert_eq!(Profile::shortnames(), ["prof"]);
    assert_eq!(Profile::crd_name(), "profiles.config.kinformer.dev");
    let resource = Profile::api_resource();
    assert_eq!(
        (
            resource.api_version.as_str(),
            resource.kind.as_str(),
            resource.plural.as_str()
        ),
        ("config.kinformer.dev/v1", "Profile", "profiles")
    );
    assert_eq!(Profile::api_version(&()), "config.kinformer.dev/v1");
    let mut profile: Profile = serde_json::from_value(profile_sample()).unwrap();
    profile.spec_mut().replicas = Some(3);
    assert_eq!(profile.spec().replicas, Some(3));
    assert!(profile.status().is_some());
    *profile.status_mut() = None;
    assert!(profile.status.is_none());
    // v1beta1 has no status subresource: `status` is a plain field there.
    let old: profile_v1beta1::Profile = round_trip(json!({
        "apiVersion": "config.kinformer.dev/v1beta1", "kind": "Profile",
        "metadata": {"name": "old"},
        "spec": {"mode": "Strict"},
        "status": {"phase": "Pending"}
    }));
    assert!(old.status.is_some());
}

/// The acceptance test of issue #24: the server's CRD gains an enum value and a top-level field
/// after the types were generated; an object using both stays in the informer's cache, the
/// lister returns it, and a replace built from the cached object keeps both.
#[tokio::test]
async fn an_object_newer_than_the_types_is_cached_listed_and_written_back_unchanged() {
    let env = envtest::Server::start(envtest::Config::default()).await.unwrap();
    let client = env.client();
    let crd = crds_from_yaml()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("profiles.config.kinformer.dev"))
        .unwrap();
    examples::demo::install_crds(&client, &[crd]).await.unwrap();
    let profiles: Api<Profile> = Api::namespaced(client.clone(), "default");
    let known = Profile::new(
        "known",
        ProfileSpec {
            mode: ProfileSpecMode::Permissive,
            weight: Some(100.0),
            hosts: None,
            ratios: None,
            replicas: None,
        },
    );
    profiles.create(&PostParams::default(), &known).await.unwrap();

    let factory = SharedInformerFactory::new(client.clone(), Duration::ZERO);
    let informer = Profile::informer(&factory).unwrap();
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    let synced = factory.wait_for_cache_sync(&shutdown).await;
    assert!(synced.values().all(|ok| *ok), "{synced:?}");

    // The CRD gains the mode `Audit` and the top-level field `owner`.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "profiles.config.kinformer.dev";
    let mut updated = serde_json::to_value(crds.get(name).await.unwrap()).unwrap();
    for version in updated["spec"]["versions"].as_array_mut().unwrap() {
        let Some(schema) = version.pointer_mut("/schema/openAPIV3Schema") else {
            continue;
        };
        if let Some(modes) = schema.pointer_mut("/properties/spec/properties/mode/enum") {
            modes.as_array_mut().unwrap().push(json!("Audit"));
            schema["properties"]["owner"] = json!({"type": "string"});
        }
    }
    crds.replace(name, &PostParams::default(), &serde_json::from_value(updated).unwrap())
        .await
        .unwrap();

    // A newer writer creates an object with both.
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), "default", &{
        use kube::CustomResourceExt;
        Profile::api_resource()
    });
    let newer = json!({
        "apiVersion": "config.kinformer.dev/v1", "kind": "Profile",
        "metadata": {"name": "newer", "namespace": "default"},
        "spec": {"mode": "Audit", "weight": 7},
        "owner": "team-a"
    });
    raw.create(&PostParams::default(), &serde_json::from_value(newer).unwrap())
        .await
        .unwrap();

    let lister = informer.lister();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let cached = loop {
        if let Some(cached) = lister.profiles("default").get("newer") {
            break cached;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the informer never cached the newer object"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(cached.spec.mode, ProfileSpecMode::Other("Audit".into()));
    assert_eq!(cached.extra.get("owner"), Some(&json!("team-a")));
    assert_eq!(lister.list(&Selector::default()).len(), 2, "both objects are listed");

    // A replace built from the cached object keeps what the types do not know.
    let mut write = (*cached).clone();
    write.metadata.labels = Some([("touched".to_string(), "yes".to_string())].into());
    write.spec.replicas = Some(1);
    let replaced = profiles.replace("newer", &PostParams::default(), &write).await.unwrap();
    assert_eq!(replaced.spec.mode, ProfileSpecMode::Other("Audit".into()));
    let stored = raw.get("newer").await.unwrap().data;
    assert_eq!(stored["spec"], json!({"mode": "Audit", "weight": 7, "replicas": 1}));
    assert_eq!(stored["owner"], "team-a");
    shutdown.cancel();
    factory.shutdown().await;
}
