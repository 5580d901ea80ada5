//! envtest: an in-process, Kubernetes-compatible API server on 127.0.0.1.
//!
//! Where it sits: under every kinformer integration test (informers, reflectors and controllers
//! talk to it over real HTTP through `kube::Client`, exactly as to kube-apiserver) and as the
//! embedded default server the examples run against when no KUBECONFIG is given. The
//! `kinformer-apiserver` binary serves the same thing for kubectl.
//!
//! It follows the Kubernetes API concepts
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/>): objects are JSON with
//! server-owned metadata, one global strictly increasing resourceVersion, list pagination pinned
//! to a revision, `Status` errors, and watches served from a bounded watch cache (the
//! apiserver's Cacher, one `cacheWatcher` per watch) that answers `410 Expired` once a revision
//! has left its window. A list or watch at a revision the server has not reached waits for it
//! (3 s, [`Config::too_large_resource_version_wait`]) and then answers `504` "Too large
//! resource version" with the `ResourceVersionTooLarge` cause, as kube-apiserver's watch cache
//! does. Built-in workloads, Pods and Services get kube-apiserver's defaults on every write
//! (`spec.replicas: 1`, rolling-update strategy, `imagePullPolicy` by tag, Service type and
//! target ports, …; see `defaults.rs` for the list and what is left out). [`Faults`] injects
//! failures for reliability tests.
//!
//! Writes are checked as kube-apiserver checks them: built-in kinds are decoded into their
//! Kubernetes type (a wrong JSON type is a `400`, unknown fields are dropped, or refused under
//! `fieldValidation=Strict`, which kubectl sends), metadata follows ObjectMeta's rules (`422
//! Invalid` with kube-apiserver's field paths and messages), and custom resources are pruned,
//! defaulted and validated by their CRD version's structural schema and its CEL rules
//! (`x-kubernetes-validations`, transition rules included). `metadata.generation` is
//! kept only by the kinds whose registry tracks it. Deployments, ReplicaSets, StatefulSets and
//! CRDs that declare it serve `/scale`. Every write records `metadata.managedFields`, and
//! server-side apply follows field ownership (removal of fields no longer applied, `409`
//! conflicts between managers unless `force=true`). The OpenAPI v3 documents carry every served kind's schema
//! (built-in and CRD), so `kubectl explain` works and `kubectl apply` validates on the server.
//!
//! CRDs serve every version as kube-apiserver does: objects are stored in the one storage
//! version and converted to and from the version each request names (`None`: `apiVersion`
//! only; `Webhook`: a `ConversionReview` to the CRD's webhook, whose failure fails the request
//! with `500`), the preferred version is the highest by Kubernetes' version priority, and
//! `deprecated` versions answer with a `Warning`. `kubectl get` receives a `Table` with a CRD
//! version's `additionalPrinterColumns`, and for a built-in kind kube-apiserver's printer
//! columns (a Pod's `READY`, `STATUS`, `RESTARTS`; a Deployment's `READY`, `UP-TO-DATE`,
//! `AVAILABLE`; an Event's `LAST SEEN`, `TYPE`, `REASON`, `OBJECT`, `MESSAGE`; …), the
//! priority-1 ones shown by `-o wide`. `events.k8s.io/v1` and core `v1` Events are one store,
//! as on kube-apiserver: an Event written through either API is read, listed and watched
//! through both with kube-apiserver's field mapping, and core Events can be selected by
//! `involvedObject.*`, `reason`, `type`, `source` and `reportingComponent`, so `kubectl
//! describe` lists the Events a controller records through `events.k8s.io/v1`.
//!
//! Admission webhooks run as kube-apiserver runs them (`admission/`). On a create, update,
//! patch, apply, `/status` or `/scale` write and on a delete, in this order: the matching
//! webhooks of the `MutatingWebhookConfiguration`s (configurations by name, then each one's
//! webhooks in order; those with `reinvocationPolicy: IfNeeded` once more if a later webhook
//! changed the object), each JSON patch applied and the object decoded again; then validation
//! (ObjectMeta, the CRD schema, CEL rules); then the `ValidatingWebhookConfiguration`s' webhooks,
//! called in parallel; then the commit. Matching follows `rules` (groups, versions, resources
//! with `*`, `*/*` and `x/sub` subresources, operations, scope), `namespaceSelector` (a
//! namespace's own labels for a Namespace) and `objectSelector` (old or new object).
//! `failurePolicy`, `timeoutSeconds`, `sideEffects` with `dryRun` (`400` "does not support dry
//! run"), `admissionReviewVersions` (v1, else v1beta1) and `caBundle` (verified by rustls) apply
//! as on a cluster. A denial answers the webhook's code (`403` by default) and `admission webhook
//! "<name>" denied the request: <message>`; a failed call under `Fail` answers `500` `failed
//! calling webhook "<name>": ...`; warnings become `Warning: 299 - "<text>"` headers. A webhook
//! named by `service` is reached at the address [`Config::webhook_service`] maps it to (envtest
//! has no cluster network; the certificate is verified for `<name>.<namespace>.svc`); `url` is
//! called as is. Every request is admitted as the user `system:admin` (group `system:masters`).
//!
//! # Differences from kube-apiserver
//!
//! What a test against envtest can still see differently from a cluster, one line each:
//! - decode errors name serde's reason at the field path, not Go's struct field and type;
//! - `fieldValidation=Warn` drops unknown fields without a `Warning` header;
//! - known fields are the k8s-openapi version's in the build (a field of a newer Kubernetes is
//!   unknown), and `Strict` checks a patch's result, not only the patch;
//! - a `/scale` patch racing another write answers `409` (kube-apiserver retries it);
//! - an object may nest at most [`MAX_DEPTH`] (100) levels, where kube-apiserver's decoder allows
//!   10,000: a deeper object, or a patch that would build one, is refused with `422` (see Limits);
//! - kind-specific validation (a Deployment's selector matching its template, container names,
//!   ports, …) is not run: only ObjectMeta's rules and CRD schemas are;
//! - CRD schemas: no `allOf`/`anyOf`/`oneOf`/`not`, `format`, or `x-kubernetes-list-type`
//!   uniqueness; a CRD's own schema is not checked for being structural;
//! - CEL rules (`x-kubernetes-validations`) run with the standard library, the strings extension
//!   and Kubernetes' lists, regex, URL, quantity, IP and CIDR libraries; a rule using anything else
//!   (`format`, `semver`) is refused when the CRD is written. No type checker (a type
//!   mismatch fails when the rule runs, not at CRD creation), no cost limits, no ratcheting;
//!   an expression nesting brackets or conditionals deeper than 32 is refused (cel-go allows
//!   250, the `cel` crate's parser would overflow the stack first), and cel-go's limit of 250
//!   on a chain like `1 + 1 + …` is checked on a count that can be slightly higher than cel-go's;
//! - strategic merge patch knows the merge keys of the lists controllers patch (containers, env,
//!   ports, volumes, conditions, …), not every list of every type;
//! - field ownership: built-in kinds' list types come from a table of common lists (other lists
//!   are atomic), a map a manager created empty is not a `.` member, no field-level
//!   `managedFields` reset with `[{}]`;
//! - protobuf request bodies are decoded for the kinds kubectl's `create` generators and `run`
//!   send (Namespace, ConfigMap, Secret, ServiceAccount, Pod, Service, Deployment, Job, CronJob,
//!   RBAC, Ingress) and the fields those carry; responses are always JSON;
//! - OpenAPI: v3 only (no v2 document), built-in schemas from k8s-openapi (no `default`s or
//!   `x-kubernetes-patch-*` extensions), a few operations per kind rather than every one;
//! - admission: webhooks only. No ValidatingAdmissionPolicy or MutatingAdmissionPolicy, no
//!   built-in plugins (quota, limit ranges, default service account or token, allocated
//!   `clusterIP`, Pod default tolerations); `matchPolicy: Equivalent` finds equivalents only among
//!   a CRD's served versions (envtest serves each built-in resource in one version); webhook
//!   `matchConditions` have no `authorizer` variable (refused when a configuration is written)
//!   and, without a type checker, an expression that is not boolean is accepted at write and
//!   fails when evaluated (then the failure policy decides); writes made by
//!   envtest's own garbage collector and namespace finalizer skip admission; a denial's
//!   `reason` outside the standard `StatusReason`s is sent empty; validating webhooks' failures
//!   are reported in webhook order (kube-apiserver reports the first to finish); a response
//!   that does not decode (a `patch` neither base64 nor an array of bytes) is reported as
//!   `received invalid webhook response: json: cannot unmarshal …` (kube-apiserver: `failed to
//!   call webhook: …`); a server-side apply that creates a Namespace is admitted with an empty
//!   `namespace` (kube-apiserver: the Namespace's name, from the request path);
//! - no controllers but the CRD, namespace and garbage-collection ones (no Deployment → ReplicaSet
//!   → Pod; write status yourself);
//! - one version served per built-in group; custom objects are not defaulted again on read in
//!   the storage version's schema (kube-apiserver does);
//! - `kubectl get` Tables: kube-apiserver's columns (names, order, types, `-o wide` priorities)
//!   for every built-in kind envtest serves, checked against the Go printers
//!   (`pkg/printers/internalversion/printers.go`, Kubernetes 1.32); kinds without a Go printer
//!   (CRDs themselves, Roles, ClusterRoles) show `Name` and `Created At`, as there. What differs:
//!   a column's description taken from a field's documentation is k8s-openapi's (the Go printer
//!   reads the Go type's `SwaggerDoc`, in places of an older API version, so the wording may
//!   differ); kinds envtest does not serve (PersistentVolumes, HPAs, PodDisruptionBudgets,
//!   StorageClasses, …) have no printer; Tables are built from the stored object only, so a cell
//!   the Go printer computes from other objects or server state is not reproduced (none of the
//!   served kinds' printers needs one); a CRD column's JSONPath is evaluated as RFC 9535 (after rewriting `.name`
//!   steps), so Kubernetes JSONPath beyond a path with filters (templates, `range`) is not
//!   understood;
//! - Events: `events.k8s.io/v1` field selectors take the core names (`involvedObject.name`,
//!   not `regarding.name`); no Event-specific validation (kube-apiserver requires
//!   `eventTime`, `reportingController` and `reportingInstance` on `events.k8s.io/v1` writes)
//!   and no Event TTL; `managedFields` of an Event written through `events.k8s.io/v1` name
//!   that API's field paths while the stored object has the core form; other kinds' field
//!   selectors (a Pod's `spec.nodeName`, `status.phase`) are not supported (`400`).
//!
//! # Limits
//!
//! What one request may build, so that no single request can crash envtest or exhaust its
//! memory (each a public constant; the reasons for each value are in `limits.rs`):
//! - [`MAX_DEPTH`], 100: the nesting of a stored object, of the result of every patch type and
//!   server-side apply, and so of a CRD's `openAPIV3Schema` (`422 Invalid`);
//! - [`MAX_JSON_PATCH_OPERATIONS`], 10,000: the operations of a JSON patch, as kube-apiserver
//!   (`413`, "The allowed maximum operations in a JSON patch is 10000, got N");
//! - [`MAX_JSON_PATCH_COPY_BYTES`], 3 MiB: what a JSON patch's `copy` operations may add, checked
//!   before each copy, as kube-apiserver's `--json-patch-max-copy-bytes` (`422`);
//! - [`MAX_OBJECT_BYTES`], 3 MiB: the JSON encoding of an object after any write (create,
//!   update, every patch type, apply, status, scale), kube-apiserver's request body limit rather
//!   than etcd's 1.5 MiB value limit (`413 RequestEntityTooLarge`).
//!
//! What a client may hold ([`Config::serving`], a [`ServingConfig`]; the `http-serving` crate,
//! shared with the controller Manager):
//! - a request's line and headers must arrive within 32 s (kube-apiserver's
//!   `ReadHeaderTimeout`), else the connection is closed;
//! - a keep-alive connection with no request in flight is closed after 90 s (`IdleTimeout`); a
//!   watch has its response in flight, so no idle timeout ever cuts it;
//! - headers: 1 MiB (`MaxHeaderBytes`, `431`); TLS handshake: 10 s ([`HANDSHAKE_TIMEOUT`]);
//! - 900 connections at once: more wait in the listen backlog until one closes;
//! - the request log: 100,000 entries and 64 MiB ([`Config::request_log_bytes`]), oldest first.
//!
//! Bearer tokens are compared in constant time. With [`Config::cert_dir`] the TLS CA and serving
//! key pair are kept across restarts, so a kubeconfig written before a restart works after it.
//!
//! Every write is computed, admitted (webhook calls are HTTP) and validated off the store's
//! lock and committed only if the object it started from is still the stored one (else done
//! again on the new object), as kube-apiserver's GuaranteedUpdate: the lock is never held while
//! a patch is computed or a webhook answers.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, PostParams};
//!
//! let env = envtest::Server::start(envtest::Config::default()).await?;
//! let cms: Api<ConfigMap> = Api::namespaced(env.client(), "default");
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("hello".into());
//! cms.create(&PostParams::default(), &cm).await?;
//! assert_eq!(env.objects_of("/api/v1/namespaces/default/configmaps")?.len(), 1);
//! env.shutdown().await;
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(missing_docs)]

mod admission;
mod cel;
pub mod chaos;
mod config;
mod conversion;
mod crd;
mod defaults;
mod discovery;
mod error;
mod events;
mod faults;
mod field;
mod field_manager;
pub mod fixtures;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gc;
mod kubeconfig;
pub mod kubectl;
mod limits;
pub mod logs;
mod object;
mod openapi;
mod patch;
mod protobuf;
mod request;
mod resources;
mod rest;
mod scale;
mod schema;
mod selectors;
mod server;
mod status;
mod storage;
mod strategic;
mod table;
pub mod tasks;
mod tls;
mod typed;
mod validation;
mod watch_cache;
mod webhook_client;

pub use config::Config;
pub use error::Error;
pub use faults::{Faults, MAX_FAULT_COUNT, MAX_LATENCY, MAX_RETRY_AFTER_SECS, RecordedRequest};
pub use http_serving::ServingConfig;
pub use kubeconfig::kubeconfig;
pub use limits::{MAX_DEPTH, MAX_JSON_PATCH_COPY_BYTES, MAX_JSON_PATCH_OPERATIONS, MAX_OBJECT_BYTES};
pub use patch::PatchKind;
pub use resources::{Registry, ResourceInfo, ScalePaths, builtin as builtin_resources};
pub use selectors::{FieldSelector, Filter, LabelSelector};
pub use server::Server;
pub use status::ApiError;
pub use storage::Snapshot;
pub use tls::HANDSHAKE_TIMEOUT;
