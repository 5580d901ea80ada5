//! Admission and conversion webhooks served by the Manager (controller-runtime's
//! `pkg/webhook`, `pkg/webhook/admission`, `pkg/webhook/conversion`).
//!
//! Where it sits: off the informer data path, on the API server's write path.
//!
//! ```text
//! kubectl ─▶ kube-apiserver ── HTTPS POST AdmissionReview / ConversionReview ──▶ WebhookServer
//!                                                                                │ path → webhook
//!                     AdmissionReview (allowed, status, patch, warnings) ◀────── ▼
//!                     ConversionReview (convertedObjects, result)        Validator<K> / Mutator<K> /
//!                                                                        Convertible<Hub>
//! ```
//!
//! - [`WebhookServer`] (`server.rs`): HTTPS on `0.0.0.0:9443` by default
//!   ([`WebhookServerConfig`]), run by the [`Manager`](crate::Manager) on every replica (no
//!   leader election) before its caches, so a conversion webhook is up when they list. TLS by
//!   rustls with the certificate from `tls.crt`/`tls.key` in a directory, re-read at the first
//!   handshake after the files change ([`CertWatcher`], `certwatcher.rs`): cert-manager's
//!   rotation needs no restart.
//! - [`ValidatingWebhook`], [`MutatingWebhook`] (`admission.rs`): typed handlers on kube's
//!   [`AdmissionRequest<K>`](kube::core::admission::AdmissionRequest) answering a [`Verdict`];
//!   a mutating handler returns the changed `K` and the server computes the JSON patch
//!   (`patch.rs`). Each runs in a task of its own under a timeout (default 10 s; the generated
//!   configuration's `timeoutSeconds` is a second longer, so the API server hears the
//!   handler's answer); a panic or a timeout answers an error response (`allowed: false`,
//!   code 500), never a hung connection; a request the API server abandons (the connection
//!   closed) aborts its handler.
//! - [`Conversion`], [`Convertible`] (`conversion.rs`): hub-and-spoke conversion at `/convert`.
//! - Metrics (`metrics.rs`) with controller-runtime's names in the Manager's registry, and a
//!   `webhook` tracing span per request with the path, `uid`, `kind`, `operation`, `dry_run`.
//! - Manifests (`manifests.rs`): the `ValidatingWebhookConfiguration`,
//!   `MutatingWebhookConfiguration` and CRD `spec.conversion` for the registered webhooks.
//!
//! ```no_run
//! use controller::Manager;
//! use controller::webhook::{MutatingWebhook, ValidatingWebhook, Verdict, WebhookServerConfig};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::core::admission::AdmissionRequest;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let manager = Manager::builder(client)
//!     .webhook_server(WebhookServerConfig::default().cert_dir("/tmp/k8s-webhook-server/serving-certs"))
//!     .build()?;
//! let webhooks = manager.webhook_server().expect("configured above");
//! // Served at /validate--v1-configmap (controller-runtime's default path).
//! webhooks.register_validating(ValidatingWebhook::new(|req: AdmissionRequest<ConfigMap>| async move {
//!     match req.object.as_ref().and_then(|cm| cm.data.as_ref()).and_then(|d| d.get("size")) {
//!         Some(size) if size.parse::<u32>().is_err() => Verdict::denied(format!("size {size:?} is not a number")),
//!         _ => Verdict::allowed(),
//!     }
//! }))?;
//! // Served at /mutate--v1-configmap: a default label, as a typed edit.
//! webhooks.register_mutating(MutatingWebhook::new(|mut cm: ConfigMap, _req: AdmissionRequest<ConfigMap>| async move {
//!     cm.metadata.labels.get_or_insert_default().entry("team".into()).or_insert_with(|| "core".into());
//!     Ok(cm)
//! }))?;
//! manager.run(CancellationToken::new()).await?;
//! # Ok(()) }
//! ```
//!
//! Where this differs from controller-runtime: handlers are typed closures or trait impls
//! rather than a `Defaulter`/`Validator` implemented on the API type; one validator method
//! sees every operation; the mutating patch keeps fields the Rust type does not know (see
//! `patch.rs`) where controller-runtime drops its patch's `remove` operations; a handler
//! timeout is enforced by the server (controller-runtime relies on the API server's); a
//! changed certificate is noticed at the next handshake rather than by a file watcher.

mod admission;
mod certwatcher;
mod conversion;
mod error;
mod manifests;
mod metrics;
mod patch;
mod server;

pub use admission::{
    DEFAULT_TIMEOUT, FailurePolicy, MatchPolicy, MutatingWebhook, Mutator, ReinvocationPolicy, SideEffects,
    ValidatingWebhook, Validator, Verdict, default_path,
};
pub use certwatcher::CertWatcher;
pub use conversion::{Conversion, Convertible};
pub use error::WebhookError;
pub use manifests::WebhookClient;
pub use server::{CONVERSION_PATH, WebhookServer, WebhookServerConfig};
