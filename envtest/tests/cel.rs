//! CRD validation rules (`x-kubernetes-validations`) as kube-apiserver evaluates them: each case
//! in the shape of a rule from a well-known CRD (Gateway API, cert-manager, Cluster API), its
//! message, `messageExpression`, `fieldPath` and `reason`, transition rules with `oldSelf`
//! (`optionalOldSelf` too), the Kubernetes quantity, URL, IP/CIDR, regex and list libraries, and
//! rules refused when the CRD is written. Every request goes through `kube::Client` over HTTP.

use envtest::{Config, Server};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::core::Status;
use serde_json::{Value, json};

const GROUP: &str = "cel.example.com";

fn crd(spec_schema: Value) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('w-')", "message": "name must start with w-"}],
                "properties": {"spec": spec_schema},
            }}}],
        }
    }))
    .unwrap()
}

/// A Widget schema whose fields carry rules shaped like those of well-known CRDs.
fn widget_schema() -> Value {
    let string = json!({"type": "string"});
    json!({"type": "object",
    "x-kubernetes-validations": [
        // Cluster API / HPA-style cross-field check, reported on the field it names.
        {"rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
         "message": "minReplicas must not exceed maxReplicas", "fieldPath": ".minReplicas"},
        // A field that may not be set, reported as Forbidden.
        {"rule": "!has(self.legacy)", "message": "legacy is no longer supported", "reason": "FieldValueForbidden"},
    ],
    "properties": {
        "minReplicas": {"type": "integer"},
        "maxReplicas": {"type": "integer"},
        "legacy": string,
        // Gateway API: backendRefs of one kind, at most 16 of them.
        "backendRefs": {"type": "array", "items": {"type": "object", "properties": {"kind": string, "port": {"type": "integer"}}},
            "x-kubernetes-validations": [
                {"rule": "self.all(r, r.kind == 'Service')", "message": "backendRefs must all be of kind Service"},
                {"rule": "size(self) <= 16", "message": "may not have more than 16 backendRefs"},
                {"rule": "self.map(r, r.port).isSorted()", "message": "ports must be sorted"},
            ]},
        // Gateway API: a hostname, wildcard allowed.
        "hostname": {"type": "string", "x-kubernetes-validations": [{
            "rule": r"self.matches('^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",
            "message": "hostname must be a lowercase RFC 1123 subdomain, optionally with a leading wildcard"}]},
        // cert-manager: exactly one issuer type.
        "issuer": {"type": "object", "properties": {"ca": {"type": "object", "properties": {"secretName": string}},
            "acme": {"type": "object", "properties": {"server": string}}},
            "x-kubernetes-validations": [{"rule": "has(self.ca) != has(self.acme)", "message": "exactly one of ca or acme must be set"}]},
        // cert-manager: renewBefore shorter than duration (Go durations).
        "certificate": {"type": "object", "properties": {"duration": string, "renewBefore": string},
            "x-kubernetes-validations": [{"rule": "!has(self.renewBefore) || duration(self.renewBefore) < duration(self.duration)",
                "message": "renewBefore must be shorter than duration"}]},
        // Resource requests and limits (quantities, int-or-string).
        "resources": {"type": "object", "properties": {
                "request": {"x-kubernetes-int-or-string": true}, "limit": {"x-kubernetes-int-or-string": true}},
            "x-kubernetes-validations": [
                {"rule": "isQuantity(string(self.request)) && isQuantity(string(self.limit))", "message": "request and limit must be quantities"},
                {"rule": "!isQuantity(string(self.request)) || !isQuantity(string(self.limit)) || !quantity(string(self.limit)).isLessThan(quantity(string(self.request)))",
                 "messageExpression": "'limit ' + string(self.limit) + ' is less than request ' + string(self.request)"},
            ]},
        // A webhook-style endpoint: an https URL, message built from the value.
        "endpoint": {"type": "string", "x-kubernetes-validations": [{
            "rule": "isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != 'localhost'",
            "messageExpression": "'endpoint must be https and not localhost, got ' + url(self).getScheme() + '://' + url(self).getHost()",
            "message": "endpoint must be an https URL"}]},
        // A pod network (IP and CIDR libraries).
        "podCIDR": {"type": "string", "x-kubernetes-validations": [{
            "rule": "isCIDR(self) && cidr(self).ip().family() == 4 && cidr(self).prefixLength() <= 24",
            "message": "podCIDR must be an IPv4 CIDR of /24 or larger"}]},
        // A version tag checked with the regex library.
        "version": {"type": "string", "x-kubernetes-validations": [
            {"rule": "self.find('^v[0-9]+') != ''", "messageExpression": "'version ' + self + ' must start with v<major>'"}]},
        // Labels that may not be duplicated (the Duplicate reason shows the node's type).
        "aliases": {"type": "array", "items": string, "x-kubernetes-validations": [
            {"rule": "self.all(a, self.indexOf(a) == self.lastIndexOf(a))", "reason": "FieldValueDuplicate"}]},
        // Cluster API: immutable once set.
        "clusterName": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "field is immutable"}]},
        // A phase every Widget starts in: optionalOldSelf runs the rule on create too.
        "phase": {"type": "string", "x-kubernetes-validations": [{
            "rule": "oldSelf.hasValue() || self == 'Pending'", "optionalOldSelf": true, "message": "a new widget starts Pending"}]},
        // Items of a map list correlate with their old selves by key.
        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object", "required": ["name"], "properties": {"name": string, "number": {"type": "integer",
                "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "a port's number is immutable"}]}}}},
    }})
}

fn widgets(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, "v1", "Widget");
    Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    )
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Widget", "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

fn status_of(e: kube::Error) -> Box<Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The (field, reason) of each cause of a 422.
fn causes(s: &Status) -> Vec<(String, String)> {
    s.details
        .as_ref()
        .map(|d| d.causes.iter().map(|c| (c.field.clone(), c.reason.clone())).collect())
        .unwrap_or_default()
}

async fn start_with_widgets() -> (Server, kube::Client) {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd(widget_schema()))
        .await
        .unwrap();
    (env, client)
}

/// One rule, a spec it accepts and a spec it refuses with kube-apiserver's message and cause.
struct Case {
    name: &'static str,
    valid: Value,
    invalid: Value,
    /// The 422's error after `Widget.cel.example.com "w-<name>" is invalid: `.
    error: &'static str,
    field: &'static str,
    reason: &'static str,
}

#[tokio::test]
async fn rules_shaped_like_well_known_crds_accept_and_refuse_as_kube_apiserver() {
    let (env, client) = start_with_widgets().await;
    let api = widgets(&client);
    let svc = |port: i64| json!({"kind": "Service", "port": port});
    let cases = vec![
        Case {
            name: "backend-kind",
            valid: json!({"backendRefs": [svc(80), svc(443)]}),
            invalid: json!({"backendRefs": [svc(80), {"kind": "Pod", "port": 90}]}),
            error: r#"spec.backendRefs: Invalid value: "array": backendRefs must all be of kind Service"#,
            field: "spec.backendRefs",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "backend-count",
            valid: json!({"backendRefs": (1..=16).map(svc).collect::<Vec<_>>()}),
            invalid: json!({"backendRefs": (1..=17).map(svc).collect::<Vec<_>>()}),
            error: r#"spec.backendRefs: Invalid value: "array": may not have more than 16 backendRefs"#,
            field: "spec.backendRefs",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "backend-sorted",
            valid: json!({"backendRefs": [svc(1), svc(2)]}),
            invalid: json!({"backendRefs": [svc(2), svc(1)]}),
            error: r#"spec.backendRefs: Invalid value: "array": ports must be sorted"#,
            field: "spec.backendRefs",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "hostname",
            valid: json!({"hostname": "*.example.com"}),
            invalid: json!({"hostname": "Example..com"}),
            error: r#"spec.hostname: Invalid value: "string": hostname must be a lowercase RFC 1123 subdomain, optionally with a leading wildcard"#,
            field: "spec.hostname",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "issuer",
            valid: json!({"issuer": {"acme": {"server": "https://acme"}}}),
            invalid: json!({"issuer": {"acme": {"server": "https://acme"}, "ca": {"secretName": "ca"}}}),
            error: r#"spec.issuer: Invalid value: "object": exactly one of ca or acme must be set"#,
            field: "spec.issuer",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "renew-before",
            valid: json!({"certificate": {"duration": "2160h", "renewBefore": "360h"}}),
            invalid: json!({"certificate": {"duration": "1h", "renewBefore": "90m"}}),
            error: r#"spec.certificate: Invalid value: "object": renewBefore must be shorter than duration"#,
            field: "spec.certificate",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "quantity-order",
            valid: json!({"resources": {"request": "500Mi", "limit": "1Gi"}}),
            invalid: json!({"resources": {"request": "1Gi", "limit": "1000Mi"}}),
            error: r#"spec.resources: Invalid value: "object": limit 1000Mi is less than request 1Gi"#,
            field: "spec.resources",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "quantity-format",
            valid: json!({"resources": {"request": 1, "limit": "1.5"}}),
            invalid: json!({"resources": {"request": "1GB", "limit": "2Gi"}}),
            error: r#"spec.resources: Invalid value: "object": request and limit must be quantities"#,
            field: "spec.resources",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "url-scheme",
            valid: json!({"endpoint": "https://hooks.example.com:8443/path?x=1"}),
            invalid: json!({"endpoint": "http://hooks.example.com:8080/path"}),
            error: r#"spec.endpoint: Invalid value: "string": endpoint must be https and not localhost, got http://hooks.example.com:8080"#,
            field: "spec.endpoint",
            reason: "FieldValueInvalid",
        },
        Case {
            // The messageExpression fails on a value that is no URL: the static message is used.
            name: "url-message-fallback",
            valid: json!({"endpoint": "https://example.com"}),
            invalid: json!({"endpoint": "not a url"}),
            error: r#"spec.endpoint: Invalid value: "string": endpoint must be an https URL"#,
            field: "spec.endpoint",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "pod-cidr",
            valid: json!({"podCIDR": "10.244.0.0/16"}),
            invalid: json!({"podCIDR": "fd00::/64"}),
            error: r#"spec.podCIDR: Invalid value: "string": podCIDR must be an IPv4 CIDR of /24 or larger"#,
            field: "spec.podCIDR",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "version-regex",
            valid: json!({"version": "v1beta2"}),
            invalid: json!({"version": "1.2"}),
            error: r#"spec.version: Invalid value: "string": version 1.2 must start with v<major>"#,
            field: "spec.version",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "field-path",
            valid: json!({"minReplicas": 1, "maxReplicas": 3}),
            invalid: json!({"minReplicas": 4, "maxReplicas": 3}),
            error: r#"spec.minReplicas: Invalid value: "object": minReplicas must not exceed maxReplicas"#,
            field: "spec.minReplicas",
            reason: "FieldValueInvalid",
        },
        Case {
            name: "reason-forbidden",
            valid: json!({}),
            invalid: json!({"legacy": "x"}),
            error: "spec: Forbidden: legacy is no longer supported",
            field: "spec",
            reason: "FieldValueForbidden",
        },
        Case {
            name: "reason-duplicate",
            valid: json!({"aliases": ["a", "b"]}),
            invalid: json!({"aliases": ["a", "b", "a"]}),
            error: r#"spec.aliases: Duplicate value: "array""#,
            field: "spec.aliases",
            reason: "FieldValueDuplicate",
        },
    ];
    for case in &cases {
        let name = format!("w-{}", case.name);
        api.create(&PostParams::default(), &widget(&name, case.valid.clone()))
            .await
            .unwrap_or_else(|e| panic!("{}: the valid spec was refused: {e:?}", case.name));
        let refused = api
            .create(
                &PostParams::default(),
                &widget(&format!("{name}-bad"), case.invalid.clone()),
            )
            .await
            .map(|_| ())
            .expect_err(case.name);
        let status = status_of(refused);
        assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"), "{}", case.name);
        assert_eq!(
            status.message,
            format!(r#"Widget.{GROUP} "{name}-bad" is invalid: {}"#, case.error),
            "{}",
            case.name
        );
        assert_eq!(
            causes(&status),
            [(case.field.to_owned(), case.reason.to_owned())],
            "{}",
            case.name
        );
    }

    // A rule on the root sees metadata.name; its path is apimachinery's nil path.
    let status = status_of(
        api.create(&PostParams::default(), &widget("x-root", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        status.message,
        format!(r#"Widget.{GROUP} "x-root" is invalid: <nil>: Invalid value: "object": name must start with w-"#)
    );
    assert_eq!(causes(&status), [("<nil>".to_owned(), "FieldValueInvalid".to_owned())]);

    // A schema error of the wrong type holds the rules back, as kube-apiserver's hasBlockingErr.
    let status = status_of(
        api.create(
            &PostParams::default(),
            &widget("w-blocked", json!({"minReplicas": "one", "legacy": "x"})),
        )
        .await
        .unwrap_err(),
    );
    assert!(
        status
            .message
            .contains("some validation rules were not checked because the object was invalid"),
        "{}",
        status.message
    );
    assert!(
        !status.message.contains("legacy is no longer supported"),
        "{}",
        status.message
    );
    env.shutdown().await;
}

#[tokio::test]
async fn transition_rules_run_on_update_against_the_stored_object() {
    let (env, client) = start_with_widgets().await;
    let api = widgets(&client);
    let pp = PostParams::default();
    let ports = |n: i64| json!([{"name": "https", "number": 443}, {"name": "metrics", "number": n}]);
    // Create: no old object, so `self == oldSelf` does not run.
    let mut w = api
        .create(
            &pp,
            &widget(
                "w-capi",
                json!({"clusterName": "prod", "phase": "Pending", "ports": ports(9090)}),
            ),
        )
        .await
        .unwrap();
    // Unchanged fields pass; a change of a field the rule does not cover passes.
    w.data["spec"]["phase"] = json!("Running");
    w = api.replace("w-capi", &pp, &w).await.unwrap();

    // Cluster API's immutability: changing clusterName is refused.
    let mut renamed = w.clone();
    renamed.data["spec"]["clusterName"] = json!("staging");
    let status = status_of(api.replace("w-capi", &pp, &renamed).await.unwrap_err());
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        format!(r#"Widget.{GROUP} "w-capi" is invalid: spec.clusterName: Invalid value: "string": field is immutable"#)
    );
    assert_eq!(
        causes(&status),
        [("spec.clusterName".to_owned(), "FieldValueInvalid".to_owned())]
    );

    // Map-list items correlate by key: reordering and adding a port pass, changing one fails at
    // its index in the new list.
    let mut reordered = w.clone();
    reordered.data["spec"]["ports"] =
        json!([{"name": "metrics", "number": 9090}, {"name": "https", "number": 443}, {"name": "new", "number": 1}]);
    w = api.replace("w-capi", &pp, &reordered).await.unwrap();
    let mut changed = w.clone();
    changed.data["spec"]["ports"][1]["number"] = json!(8443);
    let status = status_of(api.replace("w-capi", &pp, &changed).await.unwrap_err());
    assert_eq!(
        status.message,
        format!(
            r#"Widget.{GROUP} "w-capi" is invalid: spec.ports[1].number: Invalid value: "integer": a port's number is immutable"#
        )
    );

    // Setting a field that was absent is no transition: the rule needs both values.
    let mut named = api
        .create(&pp, &widget("w-late", json!({"phase": "Pending"})))
        .await
        .unwrap();
    named.data["spec"]["clusterName"] = json!("prod");
    api.replace("w-late", &pp, &named).await.unwrap();
    env.shutdown().await;
}

#[tokio::test]
async fn optional_old_self_runs_on_create_with_an_absent_old_value() {
    let (env, client) = start_with_widgets().await;
    let api = widgets(&client);
    let pp = PostParams::default();
    let status = status_of(
        api.create(&pp, &widget("w-run", json!({"phase": "Running"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        status.message,
        format!(
            r#"Widget.{GROUP} "w-run" is invalid: spec.phase: Invalid value: "string": a new widget starts Pending"#
        )
    );
    let mut w = api
        .create(&pp, &widget("w-run", json!({"phase": "Pending"})))
        .await
        .unwrap();
    w.data["spec"]["phase"] = json!("Running");
    let updated = api.replace("w-run", &pp, &w).await.unwrap();
    assert_eq!(
        updated.data["spec"]["phase"], "Running",
        "on update oldSelf has a value"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn crds_with_rules_envtest_cannot_evaluate_are_refused() {
    let env = Server::start(Config::default()).await.unwrap();
    let client = env.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PostParams::default();
    let bad = |rule: &str| {
        let mut schema = widget_schema();
        schema["properties"]["hostname"]["x-kubernetes-validations"] = json!([{"rule": rule}]);
        crd(schema)
    };
    let rule_path = "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[hostname].x-kubernetes-validations[0].rule";
    for (rule, why) in [
        (
            "self.frobnicate()",
            "undeclared reference to 'frobnicate' (in container '')",
        ),
        ("isSemver(self)", "undeclared reference to 'isSemver' (in container '')"),
        ("self.size() >", "Syntax error"),
    ] {
        let status = status_of(crds.create(&pp, &bad(rule)).await.unwrap_err());
        assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"), "{rule}");
        let prefix = format!(
            r#"CustomResourceDefinition.apiextensions.k8s.io "widgets.{GROUP}" is invalid: {rule_path}: Invalid value: "#
        );
        assert!(status.message.starts_with(&prefix), "{rule}: {}", status.message);
        assert!(
            status.message.contains("compilation failed: ERROR: <input>:1:"),
            "{rule}: {}",
            status.message
        );
        assert!(status.message.contains(why), "{rule}: {}", status.message);
        assert_eq!(
            causes(&status),
            [(rule_path.to_owned(), "FieldValueInvalid".to_owned())],
            "{rule}"
        );
    }
    // A field the schema does not declare, and a transition rule under a list that cannot
    // correlate.
    let mut schema = widget_schema();
    schema["x-kubernetes-validations"] = json!([{"rule": "self.minReplica > 0"}]);
    schema["properties"]["aliases"]["items"]["x-kubernetes-validations"] = json!([{"rule": "self == oldSelf"}]);
    let status = status_of(crds.create(&pp, &crd(schema)).await.unwrap_err());
    assert!(
        status.message.contains("undefined field 'minReplica'"),
        "{}",
        status.message
    );
    assert!(
        status.message.contains("oldSelf cannot be used on the uncorrelatable portion of the schema within spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[aliases]"),
        "{}",
        status.message
    );
    assert!(
        crds.list(&Default::default()).await.unwrap().items.is_empty(),
        "nothing was created"
    );

    // The same check on update: a served CRD cannot gain a rule that does not compile.
    crds.create(&pp, &crd(widget_schema())).await.unwrap();
    // Read it back: the server has since marked it Established (a new resourceVersion).
    let mut created = crds.get(&format!("widgets.{GROUP}")).await.unwrap();
    created.spec.versions[0]
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("spec"))
        .map(|spec| {
            spec.x_kubernetes_validations = Some(vec![serde_json::from_value(json!({"rule": "nope(self)"})).unwrap()])
        })
        .unwrap();
    let status = status_of(
        crds.replace(&format!("widgets.{GROUP}"), &pp, &created)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("undeclared reference to 'nope'"),
        "{}",
        status.message
    );
    env.shutdown().await;
}
