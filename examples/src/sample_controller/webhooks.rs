//! The sample-controller's webhooks, served over HTTPS by its Manager beside the controller:
//!
//! - validating ([`validate`]): `spec.replicas` within 0..=[`MAX_REPLICAS`], or the write is
//!   denied with `spec.replicas must be between 0 and 10, got 11`;
//! - mutating ([`default_labels`]): the label [`MANAGED_BY_LABEL`]`: sample-controller` when
//!   absent;
//! - conversion: Foo's second version, [`v1alpha1`], names the replica count `spec.size`; it is
//!   a spoke converted to and from `v1` (the hub, the storage version, and the version the
//!   controller reads), so `kubectl get foos.v1alpha1.samplecontroller.k8s.io` works.
//!
//! Where it sits: on the API server's write and read path, not the informers'. The API server
//! calls the admission webhooks on every create and update of a Foo (the controller's own
//! writes included), and the conversion webhook on every read or write in `v1alpha1`.
//!
//! [`register`] puts the three on the Manager's webhook server; [`install`] tells the API
//! server about them (the CRD in both versions with its `conversion: Webhook` stanza, a
//! `ValidatingWebhookConfiguration` and a `MutatingWebhookConfiguration`, each reaching the
//! server by URL with the CA that signed its certificate). The demo's certificate comes from
//! [`DemoCertificates`], which plays cert-manager.

// The resource is called Foo, as upstream: `foo` names one, not a placeholder.
#![allow(clippy::disallowed_names)]

use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer::controller::BoxError;
use kinformer::controller::webhook::{
    Conversion, Convertible, MutatingWebhook, ValidatingWebhook, Verdict, WebhookClient, WebhookError, WebhookServer,
};
use kube::CustomResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::core::admission::AdmissionRequest;

use super::{Foo, FooSpec};
use crate::demo::{self, DemoError};

/// The largest `spec.replicas` the validating webhook admits.
pub const MAX_REPLICAS: i32 = 10;

/// The label the mutating webhook sets on every Foo that has none by that key.
pub const MANAGED_BY_LABEL: &str = "samplecontroller.k8s.io/managed-by";

/// The value of [`MANAGED_BY_LABEL`] the mutating webhook sets.
pub const MANAGED_BY: &str = "sample-controller";

/// The name of the generated webhook configurations (one validating, one mutating).
pub const CONFIGURATION: &str = "sample-controller";

/// Foo's older version: the same object, with the replica count named `spec.size`.
pub mod v1alpha1 {
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use crate::sample_controller::FooStatus;

    /// The desired state of a `v1alpha1` Foo.
    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
    #[kube(
        group = "samplecontroller.k8s.io",
        version = "v1alpha1",
        kind = "Foo",
        namespaced,
        status = "FooStatus",
        printcolumn = r#"{"name":"Deployment","type":"string","jsonPath":".spec.deploymentName"}"#,
        printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size"}"#,
        printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.availableReplicas"}"#
    )]
    #[serde(rename_all = "camelCase")]
    pub struct FooSpec {
        /// The name of the Deployment the Foo owns.
        pub deployment_name: String,
        /// How many replicas the Deployment should run (`spec.replicas` in `v1`).
        pub size: Option<i32>,
    }
}

impl Convertible<Foo> for v1alpha1::Foo {
    fn to_hub(self) -> Result<Foo, BoxError> {
        Ok(Foo {
            metadata: self.metadata,
            spec: FooSpec {
                deployment_name: self.spec.deployment_name,
                replicas: self.spec.size,
            },
            status: self.status,
        })
    }

    fn from_hub(hub: Foo) -> Result<Self, BoxError> {
        Ok(v1alpha1::Foo {
            metadata: hub.metadata,
            spec: v1alpha1::FooSpec {
                deployment_name: hub.spec.deployment_name,
                size: hub.spec.replicas,
            },
            status: hub.status,
        })
    }
}

/// The validating webhook: denies a Foo whose `spec.replicas` is outside 0..=[`MAX_REPLICAS`].
/// A `v1alpha1` write is validated too: the API server converts it to `v1` for this webhook
/// (`matchPolicy: Equivalent`), so the message names the hub's field.
pub async fn validate(request: AdmissionRequest<Foo>) -> Verdict {
    match request.object.and_then(|foo| foo.spec.replicas) {
        Some(replicas) if !(0..=MAX_REPLICAS).contains(&replicas) => Verdict::denied(format!(
            "spec.replicas must be between 0 and {MAX_REPLICAS}, got {replicas}"
        )),
        _ => Verdict::allowed(),
    }
}

/// The mutating webhook: sets [`MANAGED_BY_LABEL`] to [`MANAGED_BY`] unless the Foo has that
/// label already (a user's value is kept).
pub async fn default_labels(mut foo: Foo, _request: AdmissionRequest<Foo>) -> Result<Foo, Verdict> {
    foo.metadata
        .labels
        .get_or_insert_default()
        .entry(MANAGED_BY_LABEL.into())
        .or_insert_with(|| MANAGED_BY.into());
    Ok(foo)
}

/// Registers the validating, mutating and conversion webhooks on `server` (served at
/// `/validate-samplecontroller-k8s-io-v1-foo`, `/mutate-samplecontroller-k8s-io-v1-foo` and
/// `/convert`).
pub fn register(server: &WebhookServer) -> Result<(), WebhookError> {
    server.register_validating(ValidatingWebhook::new(validate))?;
    server.register_mutating(MutatingWebhook::new(default_labels))?;
    server.register_conversion(Conversion::<Foo>::new().spoke::<v1alpha1::Foo>())
}

/// The Foo CRD in both versions, `v1` stored, converted by `server` at `client`; `ca_bundle` is
/// the PEM CA that signed its serving certificate.
pub fn crd(
    server: &WebhookServer,
    client: &WebhookClient,
    ca_bundle: &[u8],
) -> Result<CustomResourceDefinition, DemoError> {
    let mut crd = kube::core::crd::merge_crds(vec![Foo::crd(), v1alpha1::Foo::crd()], "v1")?;
    crd.spec.conversion = Some(server.crd_conversion(client, ca_bundle));
    Ok(crd)
}

/// Tells the API server behind `client` about the webhooks [`register`]ed on `server`, which it
/// reaches at `https://<server's address>` trusting `ca_bundle`: installs the Foo [`crd`] (and
/// waits until it is established), then server-side applies the two webhook configurations
/// named [`CONFIGURATION`].
pub async fn install(client: &kube::Client, server: &WebhookServer, ca_bundle: &[u8]) -> Result<(), DemoError> {
    let target = WebhookClient::url(format!("https://{}", server.local_addr()));
    demo::install_crds(client, &[crd(server, &target, ca_bundle)?]).await?;
    let apply = PatchParams::apply("sample-controller").force();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            CONFIGURATION,
            &apply,
            &Patch::Apply(server.validating_webhook_configuration(CONFIGURATION, &target, ca_bundle)),
        )
        .await?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            CONFIGURATION,
            &apply,
            &Patch::Apply(server.mutating_webhook_configuration(CONFIGURATION, &target, ca_bundle)),
        )
        .await?;
    Ok(())
}

/// The demo's stand-in for cert-manager: a self-signed CA and a serving certificate for
/// `127.0.0.1` and `localhost` it signed, written as `tls.crt` and `tls.key` into a directory
/// the webhook server reads (cert-manager's Secret layout). On a cluster, cert-manager issues
/// the certificate and its CA injector fills in the configurations' `caBundle`. The directory
/// is removed when this is dropped.
pub struct DemoCertificates {
    dir: PathBuf,
    ca_pem: String,
}

impl DemoCertificates {
    /// Generates the CA and the serving certificate into `dir` (created if missing).
    pub fn generate(dir: impl Into<PathBuf>) -> Result<DemoCertificates, DemoError> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sample-controller demo CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_key = KeyPair::generate()?;
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let mut serving = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "sample-controller webhook");
        let key = KeyPair::generate()?;
        let cert = serving.signed_by(&key, &issuer)?;
        for (name, pem) in [("tls.key", key.serialize_pem()), ("tls.crt", cert.pem())] {
            let path = dir.join(name);
            std::fs::write(&path, pem).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        Ok(DemoCertificates { dir, ca_pem: ca.pem() })
    }

    /// The directory holding `tls.crt` and `tls.key`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate (PEM), for the configurations' `caBundle`.
    pub fn ca_bundle(&self) -> &[u8] {
        self.ca_pem.as_bytes()
    }
}

impl Drop for DemoCertificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
