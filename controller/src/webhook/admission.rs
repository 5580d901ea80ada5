//! Typed admission webhooks (controller-runtime's `pkg/webhook/admission`): a [`Validator`]
//! answers allow or deny for a typed `K`, a [`Mutator`] returns the changed `K` and the server
//! answers the JSON patch.
//!
//! Where it sits: kube-apiserver POSTs an `AdmissionReview` (`admission.k8s.io/v1`) to the
//! webhook's path; the server decodes it into kube's [`AdmissionRequest<K>`], runs the handler
//! in a task of its own under the webhook's timeout, and answers an `AdmissionReview` with the
//! [`Verdict`] (and, for a mutating webhook, the patch). What can go wrong with one request is
//! answered, never raised, with an HTTP 200 whose `response.allowed` is false, as
//! controller-runtime answers:
//!
//! | case | `status.code` | `status.message` |
//! |---|---|---|
//! | empty body | 400 | `request body is empty` |
//! | `Content-Type` not `application/json` | 400 | `contentType=<it>, expected application/json` |
//! | the review or the object does not decode as `K` | 400 | the decoder's error |
//! | the handler panicked | 500 | `panic: <message> [recovered]` |
//! | the handler did not answer within the webhook's timeout | 500 | `webhook handler did not answer within <timeout>` |
//!
//! A handler that times out is aborted at its next `.await`, and so is one whose request is
//! dropped before it answered (kube-apiserver gave up at its own `timeoutSeconds` and closed
//! the connection): no handler runs on for a caller that is gone.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, Status, TypeMeta};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::{Instrument, error, warn};

use super::patch;
use super::server::{Hook, HookRequest, HookResponse, panic_message};

/// The default time a handler gets before the server answers an error. The generated
/// configuration's `timeoutSeconds` is the handler's timeout rounded up plus one second (11 s
/// for this default), so the API server waits for the handler's error answer rather than
/// giving up first with "context deadline exceeded".
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A handler's answer: allowed, denied, or errored, with warnings (controller-runtime's
/// `admission.Allowed`, `Denied`, `Errored` and `WithWarnings`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verdict {
    allowed: bool,
    code: u16,
    reason: String,
    message: String,
    warnings: Vec<String>,
}

impl Verdict {
    /// Admits the request (`status.code` 200).
    pub fn allowed() -> Self {
        Verdict {
            allowed: true,
            code: 200,
            reason: String::new(),
            message: String::new(),
            warnings: Vec::new(),
        }
    }

    /// Denies the request with `message` (`status.code` 403, reason `Forbidden`). kube-apiserver
    /// answers the client `admission webhook "<name>" denied the request: <message>`.
    pub fn denied(message: impl Into<String>) -> Self {
        Verdict {
            allowed: false,
            code: 403,
            reason: "Forbidden".into(),
            message: message.into(),
            warnings: Vec::new(),
        }
    }

    /// Denies the request because the handler failed: `status.code` is `code` (e.g. 400 for a
    /// request it cannot handle, 500 for its own failure).
    pub fn errored(code: u16, message: impl Into<String>) -> Self {
        Verdict {
            allowed: false,
            code,
            reason: String::new(),
            message: message.into(),
            warnings: Vec::new(),
        }
    }

    /// Adds a warning, sent to the API client (kubectl prints it) whether allowed or not.
    #[must_use]
    pub fn with_warning(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
        self
    }

    /// Whether the request is admitted.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The HTTP code in `status.code`.
    pub fn code(&self) -> u16 {
        self.code
    }

    /// The message in `status.message`.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The warnings.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    fn apply(self, mut response: AdmissionResponse) -> AdmissionResponse {
        response.allowed = self.allowed;
        response.result = Status {
            code: self.code,
            message: self.message,
            reason: self.reason,
            ..Status::default()
        };
        if !self.warnings.is_empty() {
            response.warnings = Some(self.warnings);
        }
        response
    }
}

/// Validates a typed `K` (controller-runtime's `CustomValidator`, one method for every
/// operation: look at `request.operation`; on DELETE the object is in `request.old_object`).
/// Implemented by every `Fn(AdmissionRequest<K>) -> impl Future<Output = Verdict>`.
///
/// `request.dry_run` is true when the API request will not be persisted: a handler with side
/// effects must then make none (the configuration says `sideEffects: None` by default, so the
/// API server calls it in dry runs too).
pub trait Validator<K: Resource>: Send + Sync + 'static {
    /// The verdict on `request`.
    fn validate(&self, request: AdmissionRequest<K>) -> impl Future<Output = Verdict> + Send;
}

impl<K, F, Fut> Validator<K> for F
where
    K: Resource,
    F: Fn(AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Verdict> + Send,
{
    fn validate(&self, request: AdmissionRequest<K>) -> impl Future<Output = Verdict> + Send {
        self(request)
    }
}

/// Changes a typed `K` before it is stored (controller-runtime's `CustomDefaulter`): gets the
/// object (also in `request.object`) and returns it changed; the server answers the JSON patch.
/// `Err(verdict)` answers that verdict instead (a denial, or an error). Not called when the
/// request has no object (DELETE): that is allowed unchanged. Implemented by every
/// `Fn(K, AdmissionRequest<K>) -> impl Future<Output = Result<K, Verdict>>`. See
/// [`Validator`] for `dry_run`.
pub trait Mutator<K: Resource>: Send + Sync + 'static {
    /// The changed object.
    fn mutate(&self, object: K, request: AdmissionRequest<K>) -> impl Future<Output = Result<K, Verdict>> + Send;
}

impl<K, F, Fut> Mutator<K> for F
where
    K: Resource,
    F: Fn(K, AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<K, Verdict>> + Send,
{
    fn mutate(&self, object: K, request: AdmissionRequest<K>) -> impl Future<Output = Result<K, Verdict>> + Send {
        self(object, request)
    }
}

/// What a webhook configuration does when the webhook cannot be reached or errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// The API request fails (the default, as kube-apiserver's for `admissionregistration/v1`).
    #[default]
    Fail,
    /// The API request goes on as if the webhook had allowed it.
    Ignore,
}

impl FailurePolicy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// A webhook configuration's `matchPolicy`: whether a request for another version (or group)
/// of the same resource than the rule names is sent too, converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MatchPolicy {
    /// Only requests for exactly the rule's group, version and resource.
    Exact,
    /// Requests for any equivalent version too, converted to the rule's (the API server's
    /// default for `admissionregistration/v1`).
    Equivalent,
}

impl MatchPolicy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MatchPolicy::Exact => "Exact",
            MatchPolicy::Equivalent => "Equivalent",
        }
    }
}

/// A webhook configuration's `sideEffects` (the two values `admissionregistration/v1`
/// accepts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SideEffects {
    /// The handler has no side effects: called in dry runs too (the default written).
    #[default]
    None,
    /// The handler has side effects it skips when `request.dry_run` is true.
    NoneOnDryRun,
}

impl SideEffects {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SideEffects::None => "None",
            SideEffects::NoneOnDryRun => "NoneOnDryRun",
        }
    }
}

/// A mutating webhook configuration's `reinvocationPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReinvocationPolicy {
    /// Called once per request (the API server's default).
    Never,
    /// Called once more if a later mutating webhook changed the object.
    IfNeeded,
}

impl ReinvocationPolicy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReinvocationPolicy::Never => "Never",
            ReinvocationPolicy::IfNeeded => "IfNeeded",
        }
    }
}

/// Settings common to validating and mutating webhooks.
#[derive(Clone, Debug)]
pub(crate) struct AdmissionOptions {
    pub(crate) path: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) timeout: Duration,
    pub(crate) operations: Vec<Operation>,
    pub(crate) failure_policy: FailurePolicy,
    pub(crate) namespace_selector: Option<LabelSelector>,
    pub(crate) object_selector: Option<LabelSelector>,
    pub(crate) match_policy: Option<MatchPolicy>,
    pub(crate) side_effects: SideEffects,
    /// Mutating webhooks only (no setter on a validating one).
    pub(crate) reinvocation_policy: Option<ReinvocationPolicy>,
}

impl Default for AdmissionOptions {
    fn default() -> Self {
        AdmissionOptions {
            path: None,
            name: None,
            timeout: DEFAULT_TIMEOUT,
            operations: vec![Operation::Create, Operation::Update],
            failure_policy: FailurePolicy::Fail,
            namespace_selector: None,
            object_selector: None,
            match_policy: None,
            side_effects: SideEffects::None,
            reinvocation_policy: None,
        }
    }
}

/// What the server keeps of a registered admission webhook to write its configuration.
#[derive(Clone, Debug)]
pub(crate) struct AdmissionRegistration {
    pub(crate) mutating: bool,
    pub(crate) path: String,
    pub(crate) name: String,
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) plural: String,
    pub(crate) operations: Vec<Operation>,
    pub(crate) failure_policy: FailurePolicy,
    /// The configuration's `timeoutSeconds`: the handler's timeout rounded up, plus one.
    pub(crate) timeout_seconds: i32,
    pub(crate) namespace_selector: Option<LabelSelector>,
    pub(crate) object_selector: Option<LabelSelector>,
    pub(crate) match_policy: Option<MatchPolicy>,
    pub(crate) side_effects: SideEffects,
    pub(crate) reinvocation_policy: Option<ReinvocationPolicy>,
}

/// The `timeoutSeconds` for a handler timeout: rounded up to whole seconds plus one, so the
/// handler's own timeout answer reaches the API server before it gives up, within the 1..=30
/// `admissionregistration/v1` accepts (a handler timeout of 29 s or more gets 30 s, and the
/// API server may give up first).
pub(crate) fn timeout_seconds(timeout: Duration) -> i32 {
    let whole = timeout.as_secs().saturating_add(u64::from(timeout.subsec_nanos() > 0));
    i32::try_from(whole.saturating_add(1).clamp(1, 30)).unwrap_or(30)
}

impl AdmissionOptions {
    pub(crate) fn registration<K: Resource<DynamicType = ()>>(&self, mutating: bool) -> AdmissionRegistration {
        let (group, version, kind) = (K::group(&()), K::version(&()), K::kind(&()));
        let prefix = if mutating { "mutate" } else { "validate" };
        let path = self.path.clone().unwrap_or_else(|| default_path::<K>(prefix));
        let name = self.name.clone().unwrap_or_else(|| {
            let domain = if group.is_empty() { "kb.io" } else { &group };
            format!("{}{}-{version}.{domain}", &prefix[..1], kind.to_lowercase())
        });
        AdmissionRegistration {
            mutating,
            path,
            name,
            group: group.into_owned(),
            version: version.into_owned(),
            plural: K::plural(&()).into_owned(),
            operations: self.operations.clone(),
            failure_policy: self.failure_policy,
            timeout_seconds: timeout_seconds(self.timeout),
            namespace_selector: self.namespace_selector.clone(),
            object_selector: self.object_selector.clone(),
            match_policy: self.match_policy,
            side_effects: self.side_effects,
            reinvocation_policy: if mutating { self.reinvocation_policy } else { None },
        }
    }
}

/// controller-runtime's default path: `/<prefix>-<group, dots as dashes>-<version>-<kind,
/// lower case>` (the core group gives `/validate--v1-pod`, as there).
pub fn default_path<K: Resource<DynamicType = ()>>(prefix: &str) -> String {
    format!(
        "/{prefix}-{}-{}-{}",
        K::group(&()).replace('.', "-"),
        K::version(&()),
        K::kind(&()).to_lowercase()
    )
}

macro_rules! admission_options {
    () => {
        /// Serves at `path` instead of the default (see [`default_path`]).
        pub fn path(mut self, path: impl Into<String>) -> Self {
            self.options.path = Some(path.into());
            self
        }

        /// The webhook's name in the generated configuration (default
        /// `<v|m><kind>-<version>.<group>`, `kb.io` for the core group); the API server names
        /// it in its denials.
        pub fn name(mut self, name: impl Into<String>) -> Self {
            self.options.name = Some(name.into());
            self
        }

        /// How long the handler may take before the server answers an error (default
        /// [`DEFAULT_TIMEOUT`]). The generated configuration's `timeoutSeconds` is this rounded
        /// up plus one second, so the API server gets the handler's error; the API server
        /// allows at most 30, so keep this under 29 s.
        pub fn timeout(mut self, timeout: Duration) -> Self {
            self.options.timeout = timeout;
            self
        }

        /// The operations the generated configuration's rule matches (default CREATE and
        /// UPDATE).
        pub fn operations(mut self, operations: impl IntoIterator<Item = Operation>) -> Self {
            self.options.operations = operations.into_iter().collect();
            self
        }

        /// The generated configuration's `failurePolicy` (default [`FailurePolicy::Fail`]).
        pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
            self.options.failure_policy = policy;
            self
        }

        /// The generated configuration's `namespaceSelector`: only objects in (or, for a
        /// Namespace, being) a namespace whose labels match are sent (default: every
        /// namespace).
        pub fn namespace_selector(mut self, selector: LabelSelector) -> Self {
            self.options.namespace_selector = Some(selector);
            self
        }

        /// The generated configuration's `objectSelector`: only objects whose labels (old or
        /// new) match are sent (default: every object).
        pub fn object_selector(mut self, selector: LabelSelector) -> Self {
            self.options.object_selector = Some(selector);
            self
        }

        /// The generated configuration's `matchPolicy` (default: not written, the API server's
        /// `Equivalent`).
        pub fn match_policy(mut self, policy: MatchPolicy) -> Self {
            self.options.match_policy = Some(policy);
            self
        }

        /// The generated configuration's `sideEffects` (default [`SideEffects::None`]).
        pub fn side_effects(mut self, side_effects: SideEffects) -> Self {
            self.options.side_effects = side_effects;
            self
        }
    };
}

/// A validating webhook for `K`: a [`Validator`] and where and how it is served. Register it
/// with [`WebhookServer::register_validating`](super::WebhookServer::register_validating).
#[must_use]
pub struct ValidatingWebhook<K, V> {
    pub(crate) validator: Arc<V>,
    pub(crate) options: AdmissionOptions,
    _kind: PhantomData<fn() -> K>,
}

impl<K, V> ValidatingWebhook<K, V>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
    V: Validator<K>,
{
    /// `validator` at the default path, CREATE and UPDATE, a 10 s timeout.
    pub fn new(validator: V) -> Self {
        ValidatingWebhook {
            validator: Arc::new(validator),
            options: AdmissionOptions::default(),
            _kind: PhantomData,
        }
    }

    admission_options!();

    pub(crate) fn into_hook(self) -> (AdmissionRegistration, Arc<dyn Hook>) {
        let registration = self.options.registration::<K>(false);
        let hook = ValidatingHook::<K, V> {
            validator: self.validator,
            timeout: self.options.timeout,
            _kind: PhantomData,
        };
        (registration, Arc::new(hook))
    }
}

/// A mutating webhook for `K`: a [`Mutator`] and where and how it is served. Register it with
/// [`WebhookServer::register_mutating`](super::WebhookServer::register_mutating).
#[must_use]
pub struct MutatingWebhook<K, M> {
    pub(crate) mutator: Arc<M>,
    pub(crate) options: AdmissionOptions,
    _kind: PhantomData<fn() -> K>,
}

impl<K, M> MutatingWebhook<K, M>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Serialize + Clone + Send + 'static,
    M: Mutator<K>,
{
    /// `mutator` at the default path, CREATE and UPDATE, a 10 s timeout.
    pub fn new(mutator: M) -> Self {
        MutatingWebhook {
            mutator: Arc::new(mutator),
            options: AdmissionOptions::default(),
            _kind: PhantomData,
        }
    }

    admission_options!();

    /// The generated configuration's `reinvocationPolicy` (default: not written, the API
    /// server's `Never`).
    pub fn reinvocation_policy(mut self, policy: ReinvocationPolicy) -> Self {
        self.options.reinvocation_policy = Some(policy);
        self
    }

    pub(crate) fn into_hook(self) -> (AdmissionRegistration, Arc<dyn Hook>) {
        let registration = self.options.registration::<K>(true);
        let hook = MutatingHook::<K, M> {
            mutator: self.mutator,
            timeout: self.options.timeout,
            _kind: PhantomData,
        };
        (registration, Arc::new(hook))
    }
}

struct ValidatingHook<K, V> {
    validator: Arc<V>,
    timeout: Duration,
    _kind: PhantomData<fn() -> K>,
}

impl<K, V> Hook for ValidatingHook<K, V>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
    V: Validator<K>,
{
    fn serve(self: Arc<Self>, request: HookRequest) -> BoxFuture<'static, HookResponse> {
        Box::pin(async move {
            let timeout = self.timeout;
            serve_admission::<K, _>(request, timeout, move |typed, _raw| {
                let base = AdmissionResponse::from(&typed);
                Box::pin(async move { self.validator.validate(typed).await.apply(base) })
            })
            .await
        })
    }
}

struct MutatingHook<K, M> {
    mutator: Arc<M>,
    timeout: Duration,
    _kind: PhantomData<fn() -> K>,
}

impl<K, M> Hook for MutatingHook<K, M>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Serialize + Clone + Send + 'static,
    M: Mutator<K>,
{
    fn serve(self: Arc<Self>, request: HookRequest) -> BoxFuture<'static, HookResponse> {
        Box::pin(async move {
            let timeout = self.timeout;
            serve_admission::<K, _>(request, timeout, move |typed, raw| {
                let base = AdmissionResponse::from(&typed);
                Box::pin(async move {
                    let Some(object) = typed.object.clone() else {
                        return Verdict::allowed().apply(base);
                    };
                    let before = match serde_json::to_value(&object) {
                        Ok(before) => before,
                        Err(e) => return Verdict::errored(500, format!("encoding the object: {e}")).apply(base),
                    };
                    let after = match self.mutator.mutate(object, typed).await {
                        Ok(after) => after,
                        Err(verdict) => return verdict.apply(base),
                    };
                    let after = match serde_json::to_value(&after) {
                        Ok(after) => after,
                        Err(e) => {
                            return Verdict::errored(500, format!("encoding the mutated object: {e}")).apply(base);
                        }
                    };
                    let patch = patch::patch(&raw, &before, &after);
                    if patch.0.is_empty() {
                        return base;
                    }
                    match base.clone().with_patch(patch) {
                        Ok(response) => response,
                        Err(e) => Verdict::errored(500, e.to_string()).apply(base),
                    }
                })
            })
            .await
        })
    }
}

/// The handler of one decoded request: its response.
type Handle<K> = Box<dyn FnOnce(AdmissionRequest<K>, Value) -> BoxFuture<'static, AdmissionResponse> + Send>;

/// Decodes the review, runs `handle` in a task under `timeout`, and encodes the answer.
async fn serve_admission<K, F>(request: HookRequest, timeout: Duration, handle: F) -> HookResponse
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
    F: FnOnce(AdmissionRequest<K>, Value) -> BoxFuture<'static, AdmissionResponse> + Send + 'static,
{
    let handle: Handle<K> = Box::new(handle);
    let mut api_version = kube::core::admission::META_API_VERSION_V1.to_owned();
    let response = match decode::<K>(&request, &mut api_version) {
        Err(rejection) => {
            warn!(uid = %rejection.uid, error = %rejection.message, "cannot decode the AdmissionReview");
            let mut response = errored(rejection.code, rejection.message);
            response.uid = rejection.uid;
            response
        }
        Ok((typed, raw)) => {
            let span = &request.span;
            span.record("uid", typed.uid.as_str());
            span.record("kind", typed.kind.kind.as_str());
            span.record("operation", tracing::field::debug(&typed.operation));
            span.record("dry_run", typed.dry_run);
            let uid = typed.uid.clone();
            // Spawned on the server's tracker (joined at shutdown) and aborted when this future
            // is dropped: the connection closed before the handler answered.
            let task = AbortOnDrop(request.tasks.spawn(handle(typed, raw).instrument(span.clone())));
            let mut response = match tokio::time::timeout(timeout, task).await {
                Ok(Ok(response)) => response,
                Ok(Err(e)) if e.is_panic() => {
                    let message = panic_message(e.into_panic());
                    error!(panic = %message, "webhook handler panicked");
                    request.metrics.panicked();
                    errored(500, format!("panic: {message} [recovered]"))
                }
                Ok(Err(e)) => errored(500, format!("webhook handler task ended: {e}")),
                Err(_) => {
                    // `timeout` dropped the task's guard, which aborted it.
                    warn!(?timeout, "webhook handler did not answer in time: aborted");
                    errored(500, format!("webhook handler did not answer within {timeout:?}"))
                }
            };
            response.uid = uid;
            response
        }
    };
    let review = AdmissionReview::<DynamicObject> {
        types: TypeMeta {
            api_version,
            kind: kube::core::admission::META_KIND.to_owned(),
        },
        request: None,
        response: Some(response),
    };
    match serde_json::to_value(&review) {
        Ok(mut review) => {
            base64_patch(&mut review);
            HookResponse::json(&review)
        }
        Err(e) => HookResponse::internal(format!("encoding the AdmissionReview: {e}")),
    }
}

/// A spawned handler task, aborted when dropped: when the request's future is dropped (the
/// client went away) or the timeout gives up on it. Awaiting it awaits the task.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        // A no-op once the task finished.
        self.0.abort();
    }
}

/// Writes `response.patch` as Go writes a `[]byte`: a base64 string, as kube-apiserver and
/// controller-runtime do (kube's `AdmissionResponse` serializes its `Vec<u8>` as an array of
/// numbers, which Go's decoder accepts but other readers of the API's JSON do not).
fn base64_patch(review: &mut Value) {
    use base64::Engine as _;
    let Some(patch) = review.pointer_mut("/response/patch") else {
        return;
    };
    if let Ok(bytes) = serde_json::from_value::<Vec<u8>>(patch.clone()) {
        *patch = Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
}

/// A request that cannot be handled: what to answer (controller-runtime's `Errored`).
struct Rejection {
    /// The request's uid, when it could be read.
    uid: String,
    code: u16,
    message: String,
}

impl Rejection {
    fn new(code: u16, message: impl Into<String>) -> Self {
        Rejection {
            uid: String::new(),
            code,
            message: message.into(),
        }
    }
}

/// The typed request and the raw object, or why not.
fn decode<K>(request: &HookRequest, api_version: &mut String) -> Result<(AdmissionRequest<K>, Value), Rejection>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    // controller-runtime's order: the body, then its type.
    if request.body.is_empty() {
        return Err(Rejection::new(400, "request body is empty"));
    }
    let content_type = request.content_type.as_deref().unwrap_or("");
    if content_type.split(';').next().map(str::trim) != Some("application/json") {
        return Err(Rejection::new(
            400,
            format!("contentType={content_type}, expected application/json"),
        ));
    }
    let value: Value = serde_json::from_slice(&request.body).map_err(|e| Rejection::new(400, e.to_string()))?;
    if let Some(version) = value.get("apiVersion").and_then(Value::as_str) {
        version.clone_into(api_version);
    }
    let uid = value
        .pointer("/request/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let raw = value.pointer("/request/object").cloned().unwrap_or(Value::Null);
    let rejected = |message: String| Rejection {
        uid: uid.clone(),
        code: 400,
        message,
    };
    let review: AdmissionReview<K> = serde_json::from_value(value).map_err(|e| rejected(e.to_string()))?;
    let typed: AdmissionRequest<K> = review
        .try_into()
        .map_err(|_| rejected("got an empty AdmissionRequest".into()))?;
    Ok((typed, raw))
}

/// controller-runtime's `admission.Errored(code, err)`.
fn errored(code: u16, message: String) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.result = Status {
        code,
        message,
        ..Status::default()
    };
    response
}
