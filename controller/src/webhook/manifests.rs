//! The configuration kube-apiserver needs to call the registered webhooks, generated from
//! them (what controller-gen writes from kubebuilder markers): a
//! `ValidatingWebhookConfiguration`, a `MutatingWebhookConfiguration`, and a CRD's
//! `spec.conversion` stanza.
//!
//! Where it sits: beside the server, not in the data path; a binary writes these (or applies
//! them) at deploy time, or a test creates them on envtest. The caller says how the API server
//! reaches the server ([`WebhookClient`]: a Service, or a URL) and gives the CA bundle that
//! signed the serving certificate (cert-manager's CA injector fills it in on a cluster).
//!
//! Every webhook gets: one rule with `K`'s group, version and plural and the operations given
//! at registration; `failurePolicy` as registered (default `Fail`); `sideEffects` as
//! registered (default `None`); `timeoutSeconds` the handler's timeout rounded up plus one
//! second (11 for the default 10 s; at most 30), so the API server receives the handler's
//! timeout answer instead of giving up first; `admissionReviewVersions: ["v1"]`;
//! `namespaceSelector`, `objectSelector`, `matchPolicy` and (mutating) `reinvocationPolicy`
//! when registered, else the API server's defaults (every namespace and object,
//! `Equivalent`, `Never`).

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1 as admissionregistration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::admission::Operation;

use super::admission::AdmissionRegistration;
use super::server::{CONVERSION_PATH, WebhookServer};

/// How kube-apiserver reaches the webhook server.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WebhookClient {
    /// Through a Service in the cluster (`https://<name>.<namespace>.svc:<port><path>`).
    Service {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
        /// The Service's port (the API server's default is 443).
        port: Option<i32>,
    },
    /// At a URL: the webhook's path is appended to this base (`https://host:port`).
    Url(String),
}

impl WebhookClient {
    /// Through the Service `namespace/name` on port 443.
    pub fn service(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        WebhookClient::Service {
            namespace: namespace.into(),
            name: name.into(),
            port: None,
        }
    }

    /// At `base` (`https://host:port`, no trailing slash), e.g. envtest calling a server on
    /// the test's machine.
    pub fn url(base: impl Into<String>) -> Self {
        WebhookClient::Url(base.into())
    }

    /// The Service's port (no effect on a URL).
    #[must_use]
    pub fn with_port(mut self, port: i32) -> Self {
        if let WebhookClient::Service { port: p, .. } = &mut self {
            *p = Some(port);
        }
        self
    }

    fn admission(&self, path: &str, ca_bundle: &[u8]) -> admissionregistration::WebhookClientConfig {
        let ca_bundle = Some(ByteString(ca_bundle.to_vec()));
        match self {
            WebhookClient::Service { namespace, name, port } => admissionregistration::WebhookClientConfig {
                ca_bundle,
                service: Some(admissionregistration::ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(path.to_owned()),
                    port: *port,
                }),
                url: None,
            },
            WebhookClient::Url(base) => admissionregistration::WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
        }
    }

    fn conversion(&self, ca_bundle: &[u8]) -> apiextensions::WebhookClientConfig {
        let config = self.admission(CONVERSION_PATH, ca_bundle);
        apiextensions::WebhookClientConfig {
            ca_bundle: config.ca_bundle,
            service: config.service.map(|s| apiextensions::ServiceReference {
                namespace: s.namespace,
                name: s.name,
                path: s.path,
                port: s.port,
            }),
            url: config.url,
        }
    }
}

fn operation(op: &Operation) -> String {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
    .to_owned()
}

fn rule(registration: &AdmissionRegistration) -> admissionregistration::RuleWithOperations {
    admissionregistration::RuleWithOperations {
        api_groups: Some(vec![registration.group.clone()]),
        api_versions: Some(vec![registration.version.clone()]),
        operations: Some(registration.operations.iter().map(operation).collect()),
        resources: Some(vec![registration.plural.clone()]),
        scope: None,
    }
}

/// One webhook of a configuration, written from its registration `$r`: `$webhook` is
/// `ValidatingWebhook` or `MutatingWebhook`, which have the same fields but for what the
/// mutating one adds (`reinvocation_policy`), given as `field: value` after the CA bundle. A
/// macro because k8s-openapi's two types share no trait to be generic over.
macro_rules! admission_webhook {
    ($webhook:path, $r:expr, $client:expr, $ca_bundle:expr $(, $field:ident: $value:expr)* $(,)?) => {{
        let r: &AdmissionRegistration = $r;
        $webhook {
            name: r.name.clone(),
            client_config: $client.admission(&r.path, $ca_bundle),
            rules: Some(vec![rule(r)]),
            failure_policy: Some(r.failure_policy.as_str().to_owned()),
            side_effects: r.side_effects.as_str().to_owned(),
            timeout_seconds: Some(r.timeout_seconds),
            namespace_selector: r.namespace_selector.clone(),
            object_selector: r.object_selector.clone(),
            match_policy: r.match_policy.map(|p| p.as_str().to_owned()),
            $($field: $value,)*
            admission_review_versions: vec!["v1".into()],
            ..Default::default()
        }
    }};
}

fn configuration_metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..Default::default()
    }
}

impl WebhookServer {
    /// A `ValidatingWebhookConfiguration` named `name` with every validating webhook
    /// registered, in the order registered. `ca_bundle`: the PEM CA that signed the serving
    /// certificate.
    pub fn validating_webhook_configuration(
        &self,
        name: &str,
        client: &WebhookClient,
        ca_bundle: &[u8],
    ) -> admissionregistration::ValidatingWebhookConfiguration {
        let webhooks = self
            .registrations()
            .iter()
            .filter(|r| !r.mutating)
            .map(|r| admission_webhook!(admissionregistration::ValidatingWebhook, r, client, ca_bundle))
            .collect();
        admissionregistration::ValidatingWebhookConfiguration {
            metadata: configuration_metadata(name),
            webhooks: Some(webhooks),
        }
    }

    /// A `MutatingWebhookConfiguration` named `name` with every mutating webhook registered,
    /// in the order registered.
    pub fn mutating_webhook_configuration(
        &self,
        name: &str,
        client: &WebhookClient,
        ca_bundle: &[u8],
    ) -> admissionregistration::MutatingWebhookConfiguration {
        let webhooks = self
            .registrations()
            .iter()
            .filter(|r| r.mutating)
            .map(|r| {
                admission_webhook!(admissionregistration::MutatingWebhook, r, client, ca_bundle,
                    reinvocation_policy: r.reinvocation_policy.map(|p| p.as_str().to_owned()))
            })
            .collect();
        admissionregistration::MutatingWebhookConfiguration {
            metadata: configuration_metadata(name),
            webhooks: Some(webhooks),
        }
    }

    /// A CRD's `spec.conversion` calling this server's [`CONVERSION_PATH`]: `strategy:
    /// Webhook`, `conversionReviewVersions: ["v1"]`.
    pub fn crd_conversion(&self, client: &WebhookClient, ca_bundle: &[u8]) -> apiextensions::CustomResourceConversion {
        apiextensions::CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: Some(apiextensions::WebhookConversion {
                client_config: Some(client.conversion(ca_bundle)),
                conversion_review_versions: vec!["v1".into()],
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;
    use crate::webhook::{FailurePolicy, ValidatingWebhook, Verdict, WebhookServerConfig};

    #[tokio::test]
    async fn configuration_from_registrations() {
        let config = WebhookServerConfig::default().addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        let server = WebhookServer::new(config, &prometheus::Registry::new()).unwrap();
        let validator = |_: kube::core::admission::AdmissionRequest<ConfigMap>| async { Verdict::allowed() };
        let path = server
            .register_validating(
                ValidatingWebhook::new(validator)
                    .operations([Operation::Create, Operation::Delete])
                    .failure_policy(FailurePolicy::Ignore),
            )
            .unwrap();
        assert_eq!(path, "/validate--v1-configmap");
        let client = WebhookClient::service("system", "webhook-service").with_port(9443);
        let vwc = server.validating_webhook_configuration("vwc", &client, b"CA");
        let hook = &vwc.webhooks.as_ref().unwrap()[0];
        assert_eq!(hook.name, "vconfigmap-v1.kb.io");
        let service = hook.client_config.service.as_ref().unwrap();
        assert_eq!(
            (
                service.namespace.as_str(),
                service.name.as_str(),
                service.path.as_deref(),
                service.port
            ),
            ("system", "webhook-service", Some("/validate--v1-configmap"), Some(9443))
        );
        assert_eq!(hook.client_config.ca_bundle, Some(ByteString(b"CA".to_vec())));
        let rule = &hook.rules.as_ref().unwrap()[0];
        assert_eq!(rule.api_groups, Some(vec![String::new()]));
        assert_eq!(rule.resources, Some(vec!["configmaps".to_owned()]));
        assert_eq!(rule.operations, Some(vec!["CREATE".to_owned(), "DELETE".to_owned()]));
        assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(hook.side_effects, "None");
        assert_eq!(hook.admission_review_versions, vec!["v1".to_owned()]);
        let mwc = server.mutating_webhook_configuration("mwc", &client, b"CA");
        assert!(mwc.webhooks.unwrap().is_empty());

        let conversion = server.crd_conversion(&WebhookClient::url("https://127.0.0.1:9443/"), b"CA");
        assert_eq!(conversion.strategy, "Webhook");
        let webhook = conversion.webhook.unwrap();
        assert_eq!(
            webhook.client_config.unwrap().url.as_deref(),
            Some("https://127.0.0.1:9443/convert")
        );
        assert_eq!(webhook.conversion_review_versions, vec!["v1".to_owned()]);
    }

    #[tokio::test]
    async fn timeout_selectors_and_policies_are_written() {
        use std::time::Duration;

        use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
        use serde_json::json;

        use crate::webhook::{MatchPolicy, MutatingWebhook, ReinvocationPolicy, SideEffects};

        let config = WebhookServerConfig::default().addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        let server = WebhookServer::new(config, &prometheus::Registry::new()).unwrap();
        let validator = |_: kube::core::admission::AdmissionRequest<ConfigMap>| async { Verdict::allowed() };
        let selector = |key: &str| LabelSelector {
            match_labels: Some([(key.to_owned(), "yes".to_owned())].into()),
            ..Default::default()
        };
        server.register_validating(ValidatingWebhook::new(validator)).unwrap();
        server
            .register_validating(
                ValidatingWebhook::new(validator)
                    .path("/v2")
                    .name("v2.kb.io")
                    .timeout(Duration::from_millis(2500))
                    .namespace_selector(selector("ns"))
                    .object_selector(selector("obj"))
                    .match_policy(MatchPolicy::Exact)
                    .side_effects(SideEffects::NoneOnDryRun),
            )
            .unwrap();
        let mutator = |cm: ConfigMap, _: kube::core::admission::AdmissionRequest<ConfigMap>| async { Ok(cm) };
        server
            .register_mutating(
                MutatingWebhook::new(mutator)
                    .timeout(Duration::from_secs(45))
                    .reinvocation_policy(ReinvocationPolicy::IfNeeded),
            )
            .unwrap();
        let client = WebhookClient::url("https://127.0.0.1:9443");
        let vwc = serde_json::to_value(server.validating_webhook_configuration("vwc", &client, b"CA")).unwrap();
        let (plain, tuned) = (&vwc["webhooks"][0], &vwc["webhooks"][1]);
        // The default 10 s handler timeout: 11 s, so the API server hears the handler's answer.
        assert_eq!(plain["timeoutSeconds"], 11);
        assert_eq!(plain["sideEffects"], "None");
        for absent in [
            "namespaceSelector",
            "objectSelector",
            "matchPolicy",
            "reinvocationPolicy",
        ] {
            assert!(plain.get(absent).is_none(), "{absent} in {plain}");
        }
        assert_eq!(tuned["timeoutSeconds"], 4);
        assert_eq!(tuned["namespaceSelector"], json!({"matchLabels": {"ns": "yes"}}));
        assert_eq!(tuned["objectSelector"], json!({"matchLabels": {"obj": "yes"}}));
        assert_eq!(tuned["matchPolicy"], "Exact");
        assert_eq!(tuned["sideEffects"], "NoneOnDryRun");
        let mwc = serde_json::to_value(server.mutating_webhook_configuration("mwc", &client, b"CA")).unwrap();
        let mutating = &mwc["webhooks"][0];
        // The API server's maximum.
        assert_eq!(mutating["timeoutSeconds"], 30);
        assert_eq!(mutating["reinvocationPolicy"], "IfNeeded");
        assert_eq!(mutating["sideEffects"], "None");

        assert_eq!(crate::webhook::admission::timeout_seconds(Duration::ZERO), 1);
        assert_eq!(crate::webhook::admission::timeout_seconds(Duration::from_millis(1)), 2);
        assert_eq!(crate::webhook::admission::timeout_seconds(Duration::from_secs(29)), 30);
    }
}
