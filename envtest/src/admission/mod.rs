//! kube-apiserver's admission chain with webhooks: what runs between a write's decoding and its
//! commit to the store.
//!
//! Where it sits: `rest.rs` computes the new object of a create, update, patch, apply, `/status`
//! or `/scale` write (or reads the object a delete removes) off the store lock, then calls
//! [`Admission::mutate`] (the `MutatingWebhookConfiguration`s' webhooks), validates the object
//! (schema and object rules), calls [`Admission::validate`] (the
//! `ValidatingWebhookConfiguration`s' webhooks) and only then takes the lock to commit — if the
//! object it started from is still the stored one, else it starts again (kube-apiserver's
//! `GuaranteedUpdate`). The configurations and the namespace's labels are read under the lock
//! with the object ([`Admission::snapshot`]), so one attempt sees one consistent state.
//!
//! A webhook matched through an equivalent resource (`matchPolicy: Equivalent`, another served
//! version of a CRD; see `matching.rs`) is called with the object and old object converted to
//! that version by the CRD's conversion (`conversion.rs`: `None` or its webhook), with `kind`
//! and `resource` that version's and `requestKind`/`requestResource` the request's; a mutating
//! webhook's patch applies to the converted object, which is then converted back, as
//! kube-apiserver's `VersionedAttributes` do. A failed conversion fails the request with `500`
//! whatever the failure policy.

mod configuration;
mod matching;
mod review;

pub(crate) use configuration::{default as default_configuration, validate as validate_configuration};

use crate::conversion::Converter;
use crate::resources::ResourceInfo;
use crate::status::ApiError;
use crate::storage::Inner;
use crate::webhook_client::WebhookClient;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The operation a write is admitted as (`AdmissionRequest.operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// A create, or a server-side apply that creates.
    Create,
    /// An update, patch, apply onto an existing object, `/status` or `/scale` write.
    Update,
    /// A delete (one object, or each object of a deletecollection).
    Delete,
}

impl Operation {
    /// The name in rules and in `AdmissionRequest.operation`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// The warnings a request collects on its way (webhooks' `warnings`), sent back as
/// `Warning: 299 - "<text>"` headers whether the request succeeds or fails, as kube-apiserver's
/// warning recorder does.
#[derive(Debug, Clone, Default)]
pub(crate) struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    /// Records one warning (duplicates are sent once).
    pub(crate) fn add(&self, text: impl Into<String>) {
        let text = text.into();
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !list.contains(&text) {
            list.push(text);
        }
    }

    /// The warnings recorded so far, in order.
    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What a write is, for admission (kube-apiserver's `admission.Attributes`).
#[derive(Debug, Clone)]
pub(crate) struct Attributes<'a> {
    /// The resource written, in the version of the request.
    pub(crate) info: &'a ResourceInfo,
    /// `status`, `scale`, or none.
    pub(crate) subresource: Option<&'a str>,
    /// The object's namespace (`""` for cluster-scoped).
    pub(crate) namespace: &'a str,
    /// The object's name (may be empty on a create with `generateName`).
    pub(crate) name: &'a str,
    /// The operation.
    pub(crate) operation: Operation,
    /// The stored object an update or delete starts from.
    pub(crate) old: Option<&'a Value>,
    /// `dryRun=All`.
    pub(crate) dry_run: bool,
    /// `CreateOptions`, `UpdateOptions` or `DeleteOptions`, as sent in `AdmissionRequest.options`.
    pub(crate) options: Value,
}

/// The group of the webhook configurations: kube-apiserver calls no webhook for writes to it,
/// so a webhook cannot lock the cluster out of fixing its own configuration.
pub(crate) const GROUP: &str = "admissionregistration.k8s.io";

/// The user every request is admitted as (`AdmissionRequest.userInfo`): envtest has one
/// identity, its administrator (the bearer token, when set, names no user).
pub(crate) const USER: &str = "system:admin";

/// The storage keys of the two configuration kinds.
const MUTATING_KEY: &str = "admissionregistration.k8s.io/mutatingwebhookconfigurations";
const VALIDATING_KEY: &str = "admissionregistration.k8s.io/validatingwebhookconfigurations";

/// The admission chain's settings: the client webhooks are called with. Shared by every write.
#[derive(Debug, Clone, Default)]
pub(crate) struct Admission {
    client: WebhookClient,
}

/// The webhooks of one attempt at a write and the namespace the object lives in, read under
/// the store lock together with the object.
///
/// Invariant: each list holds `(configuration name, webhook)` in the order kube-apiserver
/// calls them: configurations by name, then each configuration's webhooks in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    mutating: Vec<(String, Value)>,
    validating: Vec<(String, Value)>,
    namespace: Option<Arc<Value>>,
    /// The CRD of a custom resource, which converts objects to an equivalent version.
    crd: Option<Arc<Value>>,
    /// The resource in every other version it is served in (a CRD's other served versions).
    equivalents: Vec<Arc<ResourceInfo>>,
}

/// Every webhook of the configurations stored under `key`, in call order.
fn webhooks_of(inner: &Inner, key: &str) -> Vec<(String, Value)> {
    let Some(configs) = inner.objects(key) else {
        return Vec::new();
    };
    // Stored by (namespace, name): cluster-scoped, so by name, kube-apiserver's order.
    configs
        .values()
        .flat_map(|c| {
            let name = crate::object::name(c).to_owned();
            c.get("webhooks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(move |w| (name.clone(), w.clone()))
        })
        .collect()
}

impl Admission {
    /// The chain, calling webhooks with `client`.
    pub(crate) fn new(client: WebhookClient) -> Self {
        Admission { client }
    }

    /// The webhook client (CRD conversion webhooks are called with it too).
    pub(crate) fn client(&self) -> &WebhookClient {
        &self.client
    }

    /// Reads, under the store lock, what admission of a write to `info` in `namespace` needs.
    pub(crate) fn snapshot(&self, inner: &Inner, info: &ResourceInfo, namespace: &str) -> Snapshot {
        if info.group == GROUP {
            return Snapshot::default();
        }
        let crd = crate::crd::of_resource(inner, info);
        // A CRD's versions share its kind, scope and names.
        let equivalents = crd
            .as_deref()
            .and_then(|c| c["spec"]["versions"].as_array())
            .into_iter()
            .flatten()
            .filter(|v| v["served"].as_bool().unwrap_or(false))
            .filter_map(|v| v["name"].as_str())
            .filter(|v| *v != info.version)
            .map(|v| {
                Arc::new(ResourceInfo {
                    version: v.to_owned(),
                    ..info.clone()
                })
            })
            .collect();
        Snapshot {
            mutating: webhooks_of(inner, MUTATING_KEY),
            validating: webhooks_of(inner, VALIDATING_KEY),
            namespace: (!namespace.is_empty())
                .then(|| inner.get("/namespaces", "", namespace))
                .flatten(),
            crd,
            equivalents,
        }
    }

    /// Calls the matching mutating webhooks on `obj` (`None` for a delete), in order, then once
    /// more those with `reinvocationPolicy: IfNeeded` that ran before a later webhook changed
    /// the object (kube-apiserver's reinvocation). Returns whether the object was changed
    /// (then the caller decodes it again, as kube-apiserver does after a patch).
    pub(crate) async fn mutate(
        &self,
        snapshot: &Snapshot,
        attrs: &Attributes<'_>,
        mut obj: Option<&mut Value>,
        warnings: &Warnings,
    ) -> Result<bool, ApiError> {
        let hooks = &snapshot.mutating;
        let mut changed_any = false;
        // Indexes into `hooks` of the IfNeeded webhooks called since the last change, and of
        // those to call again.
        let mut previously_invoked: BTreeSet<usize> = BTreeSet::new();
        let mut reinvoke: BTreeSet<usize> = BTreeSet::new();
        for pass in 0..2 {
            for (i, (_, hook)) in hooks.iter().enumerate() {
                if pass == 1 && !reinvoke.contains(&i) {
                    continue;
                }
                // Matched against the object as the webhooks before left it.
                let Some(matched) = matching::should_call(
                    hook,
                    attrs,
                    snapshot.namespace.as_deref(),
                    obj.as_deref(),
                    &snapshot.equivalents,
                ) else {
                    continue;
                };
                let changed = match self
                    .call(snapshot, hook, matched, attrs, obj.as_deref_mut(), warnings, true)
                    .await?
                {
                    Called::Changed => true,
                    Called::Unchanged | Called::Skipped => false,
                    Called::Excluded => continue,
                };
                if changed {
                    changed_any = true;
                    reinvoke.append(&mut previously_invoked);
                }
                if hook.get("reinvocationPolicy").and_then(Value::as_str) == Some("IfNeeded") {
                    previously_invoked.insert(i);
                }
            }
            if pass == 0 && (!changed_any || reinvoke.is_empty()) {
                break;
            }
        }
        Ok(changed_any)
    }

    /// Calls the matching validating webhooks on `obj` (`None` for a delete), all at once as
    /// kube-apiserver does; the first failure in webhook order fails the request.
    pub(crate) async fn validate(
        &self,
        snapshot: &Snapshot,
        attrs: &Attributes<'_>,
        obj: Option<&Value>,
        warnings: &Warnings,
    ) -> Result<(), ApiError> {
        let calls = snapshot
            .validating
            .iter()
            .filter_map(|(_, h)| {
                matching::should_call(h, attrs, snapshot.namespace.as_deref(), obj, &snapshot.equivalents)
                    .map(|m| (h, m))
            })
            .map(|(hook, matched)| async move {
                let mut copy = obj.cloned();
                self.call(snapshot, hook, matched, attrs, copy.as_mut(), warnings, false)
                    .await
            });
        for outcome in futures::future::join_all(calls).await {
            outcome?;
        }
        Ok(())
    }

    /// Calls one webhook whose rules matched as `matched` and applies its answer: `Err` for a
    /// denial, a refused dry run, a failed conversion to the matched version, a match condition
    /// or call that failed under `failurePolicy: Fail`.
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        snapshot: &Snapshot,
        hook: &Value,
        matched: matching::Matched<'_>,
        attrs: &Attributes<'_>,
        obj: Option<&mut Value>,
        warnings: &Warnings,
        mutating: bool,
    ) -> Result<Called, ApiError> {
        let name = hook.get("name").and_then(Value::as_str).unwrap_or("");
        // The objects in the version the webhook is called in (a `Scale` is the same in all).
        let matched_info = match matched {
            matching::Matched::AsRequested => attrs.info,
            matching::Matched::Equivalent(e) => e,
        };
        let converter = match (matched, snapshot.crd.as_deref()) {
            (matching::Matched::Equivalent(_), Some(crd)) if attrs.subresource != Some("scale") => {
                Some(Converter::for_crd(crd, &self.client))
            }
            _ => None,
        };
        let (versioned, versioned_old) = match &converter {
            None => (obj.as_deref().cloned(), attrs.old.cloned()),
            Some(c) => {
                let to = |o: Option<Value>| async {
                    match o {
                        None => Ok(None),
                        Some(o) => c.convert(o, &matched_info.version).await.map(Some),
                    }
                };
                let failed = |e: ApiError| {
                    tracing::warn!(webhook = name, version = %matched_info.version, error = %e.message, "converting for an equivalent-version webhook failed");
                    internal_error(&e.message)
                };
                (
                    to(obj.as_deref().cloned()).await.map_err(failed)?,
                    to(attrs.old.cloned()).await.map_err(failed)?,
                )
            }
        };
        if hook.get("matchConditions").is_some() {
            let review = review::request(
                "v1",
                "",
                attrs,
                matched_info,
                versioned.as_ref(),
                versioned_old.as_ref(),
            );
            let request = matching::condition_request(&review["request"]);
            match matching::conditions_match(hook, versioned.as_ref(), versioned_old.as_ref(), &request) {
                matching::Conditions::Call => {}
                matching::Conditions::Skip => return Ok(Called::Excluded),
                matching::Conditions::Failed(why) => {
                    tracing::warn!(webhook = name, error = %why, "failed evaluating match conditions, failing closed");
                    let resource = attrs.info.qualified();
                    let mut e = ApiError::forbidden(if attrs.name.is_empty() {
                        format!("{resource} is forbidden: {why}")
                    } else {
                        format!("{resource} {:?} is forbidden: {why}", attrs.name)
                    });
                    e.details = Some(serde_json::json!({
                        "name": attrs.name, "group": attrs.info.group, "kind": attrs.info.plural,
                    }));
                    return Err(e);
                }
            }
        }
        if attrs.dry_run {
            match hook.get("sideEffects").and_then(Value::as_str) {
                Some("None" | "NoneOnDryRun") => {}
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "admission webhook {name:?} does not support dry run"
                    )));
                }
            }
        }
        let ignore = hook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
        let outcome = self
            .exchange(
                hook,
                name,
                attrs,
                matched_info,
                versioned.as_ref(),
                versioned_old.as_ref(),
                mutating,
            )
            .await;
        let reply = match outcome {
            Ok(r) => r,
            Err(failure) if ignore => {
                tracing::warn!(webhook = name, error = %failure, "failed calling webhook, failing open");
                return Ok(Called::Skipped);
            }
            Err(failure) => {
                tracing::warn!(webhook = name, error = %failure, "failed calling webhook, failing closed");
                return Err(internal_error(&failure));
            }
        };
        for w in &reply.warnings {
            warnings.add(w.clone());
        }
        if !reply.allowed {
            return Err(review::denied(name, reply.status.as_ref()));
        }
        let Some(patch) = reply.patch else {
            return Ok(Called::Unchanged);
        };
        let (Some(obj), Some(mut patched)) = (obj, versioned) else {
            return Err(internal_error(&format!(
                "admission webhook {name:?} attempted to modify the object, which is not supported for this operation"
            )));
        };
        json_patch::patch(&mut patched, &patch).map_err(|e| internal_error(&e.to_string()))?;
        if let Some(c) = &converter {
            // Back to the request's version.
            patched = c
                .convert(patched, &attrs.info.version)
                .await
                .map_err(|e| internal_error(&e.message))?;
        }
        if patched == *obj {
            return Ok(Called::Unchanged);
        }
        *obj = patched;
        Ok(Called::Changed)
    }

    /// Sends the review and checks the reply; `Err` is a failed call (subject to the
    /// failure policy), with kube-apiserver's `failed calling webhook "<name>": ...` text.
    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &self,
        hook: &Value,
        name: &str,
        attrs: &Attributes<'_>,
        matched: &ResourceInfo,
        obj: Option<&Value>,
        old: Option<&Value>,
        mutating: bool,
    ) -> Result<review::Reply, String> {
        let failed = |why: String| format!("failed calling webhook {name:?}: {why}");
        let versions: Vec<&str> = hook
            .get("admissionReviewVersions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let Some(version) = versions.into_iter().find(|v| review::VERSIONS.contains(v)) else {
            return Err(failed(format!(
                "webhook does not accept known AdmissionReview versions ({})",
                review::VERSIONS.join(", ")
            )));
        };
        let timeout = hook
            .get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(10)
            .clamp(1, 30);
        let uid = crate::object::new_uid();
        let request = review::request(version, &uid, attrs, matched, obj, old);
        let client_config = hook.get("clientConfig").cloned().unwrap_or(Value::Null);
        let reply = self
            .client
            .post(&client_config, &request, Duration::from_secs(timeout))
            .await
            .map_err(|e| failed(e.to_string()))?;
        review::reply(version, &uid, &reply, mutating)
            .map_err(|e| failed(format!("received invalid webhook response: {e}")))
    }
}

/// What one webhook call did.
enum Called {
    /// The webhook's patch changed the object.
    Changed,
    /// Allowed without a change.
    Unchanged,
    /// The call failed and `failurePolicy: Ignore` skipped it.
    Skipped,
    /// Not called: a match condition excluded the request.
    Excluded,
}

/// kube-apiserver's `NewInternalError`: `500`, "Internal error occurred: ...".
fn internal_error(why: &str) -> ApiError {
    ApiError::with_details(
        500,
        "InternalError",
        format!("Internal error occurred: {why}"),
        serde_json::json!({"causes": [{"message": why}]}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    /// A dry run is refused (400) before any call to a webhook that may have side effects,
    /// whatever its failure policy, as kube-apiserver refuses it. (The v1 API refuses such
    /// webhooks at creation, so this is reached only by configurations stored otherwise.)
    #[tokio::test]
    async fn a_dry_run_is_refused_by_a_webhook_with_side_effects() {
        let info = Registry::new().get("", "v1", "configmaps").unwrap();
        for side_effects in ["Unknown", "Some"] {
            let hook = json!({"name": "side.example.com", "sideEffects": side_effects, "failurePolicy": "Ignore",
                "admissionReviewVersions": ["v1"], "clientConfig": {"url": "https://127.0.0.1:1/"},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "operations": ["*"]}]});
            let snapshot = Snapshot {
                validating: vec![("c".into(), hook)],
                ..Snapshot::default()
            };
            let obj = json!({"metadata": {"name": "x", "namespace": "default"}});
            let mut attrs = Attributes {
                info: &info,
                subresource: None,
                namespace: "default",
                name: "x",
                operation: Operation::Create,
                old: None,
                dry_run: true,
                options: Value::Null,
            };
            let admission = Admission::default();
            let e = admission
                .validate(&snapshot, &attrs, Some(&obj), &Warnings::default())
                .await
                .unwrap_err();
            assert_eq!((e.code, e.reason), (400, "BadRequest"), "{side_effects}");
            assert_eq!(
                e.message,
                "admission webhook \"side.example.com\" does not support dry run"
            );
            attrs.dry_run = false;
            // Not a dry run: called, failing (nothing listens) and ignored.
            admission
                .validate(&snapshot, &attrs, Some(&obj), &Warnings::default())
                .await
                .unwrap();
        }
    }
}
