//! The finalizer helper: kube-runtime's `finalizer`, and controller-runtime's
//! `controllerutil.{Add,Remove,Contains}Finalizer`, for a [`Reconciler`](crate::Reconciler) that
//! must clean up something garbage collection cannot (an entry in a shared index, a cloud
//! resource) before its object goes away.
//!
//! Where it sits in the data path: inside a reconcile, between the cached object the worker
//! hands out ([`Context::get`](crate::Context::get), an `Arc<K>`) and the writes the reconcile
//! makes. [`finalizer`] decides from the cached object which branch of your reconcile runs:
//!
//! | our finalizer on the object | `deletionTimestamp` | the helper does |
//! |---|---|---|
//! | absent | unset | adds it (a JSON patch), then runs [`Event::Apply`] on the object the server returned |
//! | present | unset | runs [`Event::Apply`] |
//! | present | set | runs [`Event::Cleanup`]; only if that succeeded, removes the finalizer |
//! | absent | set | nothing: not ours to clean up, and a finalizer is never added to a deleting object |
//!
//! So [`Event::Apply`] runs only once the finalizer is on the server's object, and the object
//! cannot be gone before [`Event::Cleanup`] succeeded: a failed cleanup keeps the finalizer and
//! returns [`FinalizerError::CleanupFailed`], which the worker retries with backoff.
//!
//! ## Concurrent writers
//!
//! Two controllers (or a user) may change `metadata.finalizers` at once; a helper that wrote the
//! whole list from a stale cache would drop the other's entry, and the other's cleanup would never
//! run. Every write here is a JSON patch guarded by a `test` operation, as kube-runtime's:
//!
//! - add: `test` that the list is still the one we saw (or, when we saw none, that
//!   `metadata.resourceVersion` is the one we saw: RFC 6902 `test` of an absent path fails on
//!   some servers and succeeds on others), then append;
//! - remove: `test` that index *i* still holds our name, then remove index *i*.
//!
//! A failed test (`422`) or a conflict (`409`) re-reads the object and decides again, at most
//! [`MAX_ATTEMPTS`] times, without running the cleanup a second time: where kube-runtime returns
//! the error (and runs the cleanup again on the retry), this helper only repeats the patch.
//!
//! ## Example
//!
//! ```
//! use controller::finalizer::{finalizer, Event};
//! use controller::{reconciler_fn, Action, BoxError, Context, Request};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::Api;
//!
//! let reconciler = reconciler_fn(|req: Request, ctx: Context<ConfigMap>| async move {
//!     let Some(cm) = ctx.get(&req)? else { return Ok::<_, BoxError>(Action::Done) };
//!     let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), req.namespace.as_deref().unwrap_or("default"));
//!     ctx.ensure_leading()?;
//!     let action = finalizer(&api, "example.com/index-entry", cm, |event| async move {
//!         match event {
//!             Event::Apply(cm) => { /* write cm's entry in the index */ let _ = cm; }
//!             Event::Cleanup(cm) => { /* remove cm's entry from the index */ let _ = cm; }
//!         }
//!         Ok::<_, BoxError>(Action::Done)
//!     })
//!     .await?;
//!     Ok(action)
//! });
//! # let _ = reconciler;
//! ```
//!
//! ## Caveats (as kube-runtime's)
//!
//! - A deletion waits for the controller: while it is not running, or while the cleanup fails,
//!   the object stays (with `deletionTimestamp` set).
//! - Predicates of the controller must let the update that sets `deletionTimestamp` through
//!   (`GenerationChanged` does: the deletion bumps the generation of custom resources).
//! - Both branches must be idempotent: either may run again (after a restart, a failed write, a
//!   later event), and the cleanup must cope with an apply that never ran.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, TestOperation};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::debug;

use crate::reconciler::{Action, BoxError};

/// How many times [`finalizer`] writes the finalizer list before it gives up on a conflict
/// (a failed `test` or a `409`); each retry re-reads the object first.
pub const MAX_ATTEMPTS: usize = 5;

/// What [`finalizer`] asks your reconcile to do.
pub enum Event<K> {
    /// Bring the world to the object's desired state. Our finalizer is on the object on the
    /// server, so a later deletion waits for [`Event::Cleanup`].
    Apply(Arc<K>),
    /// The object is being deleted and carries our finalizer: undo what apply did. The
    /// finalizer is removed only if this returns `Ok`.
    Cleanup(Arc<K>),
}

impl<K> Debug for Event<K>
where
    K: Resource,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (branch, obj) = match self {
            Event::Apply(obj) => ("Apply", obj),
            Event::Cleanup(obj) => ("Cleanup", obj),
        };
        write!(f, "{branch}({})", object_key(&**obj))
    }
}

/// Which step of [`finalizer`] failed.
///
/// The reconcile's own error is kept as this error's [`source`](std::error::Error::source),
/// boxed: reconcilers here return anything `Into<BoxError>` (a `String`, a boxed error), and an
/// error generic over that type could not implement `std::error::Error` when it is itself a
/// `Box<dyn Error>` (kube-runtime's generic `finalizer::Error` has that limit). Reach your own
/// type with `err.source().and_then(|s| s.downcast_ref::<MyError>())`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FinalizerError {
    /// The finalizer name is not one kube-apiserver accepts; nothing was written.
    #[error(transparent)]
    InvalidName(#[from] InvalidFinalizerName),
    /// The object has no `metadata.name` (an object that was never stored).
    #[error("the object has no name")]
    UnnamedObject,
    /// [`Event::Apply`] failed.
    #[error("apply of {object} failed")]
    ApplyFailed {
        /// `namespace/name` of the object.
        object: String,
        /// The reconcile's error.
        #[source]
        source: BoxError,
    },
    /// [`Event::Cleanup`] failed: the finalizer was kept, so the deletion waits for a retry.
    #[error("cleanup of {object} failed; finalizer {finalizer} kept")]
    CleanupFailed {
        /// `namespace/name` of the object.
        object: String,
        /// The finalizer that stays on the object.
        finalizer: String,
        /// The reconcile's error.
        #[source]
        source: BoxError,
    },
    /// Adding the finalizer failed (after [`MAX_ATTEMPTS`] conflicts, or for another reason);
    /// [`Event::Apply`] did not run.
    #[error("adding finalizer {finalizer} to {object} failed")]
    AddFinalizer {
        /// `namespace/name` of the object.
        object: String,
        /// The finalizer.
        finalizer: String,
        /// The last error of the patch.
        #[source]
        source: kube::Error,
    },
    /// The cleanup succeeded but removing the finalizer failed: the next reconcile runs the
    /// cleanup again (it must be idempotent) and retries the removal.
    #[error("cleanup of {object} succeeded but removing finalizer {finalizer} failed")]
    RemoveFinalizer {
        /// `namespace/name` of the object.
        object: String,
        /// The finalizer.
        finalizer: String,
        /// The last error of the patch.
        #[source]
        source: kube::Error,
    },
    /// Re-reading the object after a conflicting write failed.
    #[error("re-reading {object} after a conflict failed")]
    Get {
        /// `namespace/name` of the object.
        object: String,
        /// The error of the GET.
        #[source]
        source: kube::Error,
    },
}

/// A finalizer name kube-apiserver would refuse, with the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid finalizer name {name:?}: {reason}")]
#[non_exhaustive]
pub struct InvalidFinalizerName {
    /// The name given.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Checks a controller's finalizer name as kube-apiserver does (`ValidateFinalizerName`): a
/// qualified name (`prefix/name`: a DNS-1123 subdomain of at most 253 characters, then at most 63
/// alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric), and domain-prefixed (a name
/// without `/` is reserved for Kubernetes' own finalizers, and refused on built-in kinds).
///
/// ```
/// use controller::finalizer::validate_finalizer_name;
/// assert!(validate_finalizer_name("example.com/cleanup").is_ok());
/// assert!(validate_finalizer_name("cleanup").is_err()); // no domain prefix
/// assert!(validate_finalizer_name("Example.com/cleanup").is_err()); // prefix not lower case
/// ```
pub fn validate_finalizer_name(name: &str) -> Result<(), InvalidFinalizerName> {
    let invalid = |reason: String| InvalidFinalizerName {
        name: name.to_owned(),
        reason,
    };
    let Some((prefix, local)) = name.split_once('/') else {
        return Err(invalid(
            "must be domain-prefixed (e.g. 'example.com/cleanup'): names without '/' are reserved for Kubernetes"
                .into(),
        ));
    };
    if local.contains('/') {
        return Err(invalid("a qualified name has at most one '/'".into()));
    }
    if let Some(reason) = dns1123_subdomain(prefix) {
        return Err(invalid(format!("prefix part {reason}")));
    }
    if local.is_empty() {
        return Err(invalid("name part must be non-empty".into()));
    }
    if local.len() > 63 {
        return Err(invalid("name part must be no more than 63 characters".into()));
    }
    let bytes = local.as_bytes();
    let edge_ok = |b: u8| b.is_ascii_alphanumeric();
    let inner_ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    if !(bytes.iter().all(|&b| inner_ok(b))
        && bytes.first().is_some_and(|&b| edge_ok(b))
        && bytes.last().is_some_and(|&b| edge_ok(b)))
    {
        return Err(invalid(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into(),
        ));
    }
    Ok(())
}

/// `IsDNS1123Subdomain`: `None` if valid, else the reason.
fn dns1123_subdomain(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must be non-empty".into());
    }
    if s.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    let label_ok = |label: &str| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && b.first().is_some_and(|&c| c != b'-')
            && b.last().is_some_and(|&c| c != b'-')
    };
    if s.split('.').all(label_ok) {
        None
    } else {
        Some(
            "must be a lowercase RFC 1123 subdomain: lower case alphanumerics, '-' and '.', starting and ending alphanumeric".into(),
        )
    }
}

/// Whether `obj` carries `finalizer` (controller-runtime's `ContainsFinalizer`).
pub fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}

/// Adds `finalizer` to the object in memory if it is missing; returns whether it changed
/// (controller-runtime's `AddFinalizer`). For objects you write yourself (an update or an
/// apply); [`finalizer`] writes only the list, guarded against concurrent writers.
pub fn add_finalizer<K: Resource>(obj: &mut K, finalizer: &str) -> bool {
    if has_finalizer(obj, finalizer) {
        return false;
    }
    obj.finalizers_mut().push(finalizer.to_owned());
    true
}

/// Removes every occurrence of `finalizer` from the object in memory; returns whether it changed
/// (controller-runtime's `RemoveFinalizer`).
pub fn remove_finalizer<K: Resource>(obj: &mut K, finalizer: &str) -> bool {
    if !has_finalizer(obj, finalizer) {
        return false;
    }
    obj.finalizers_mut().retain(|f| f != finalizer);
    true
}

/// Runs one reconcile of `obj` behind the finalizer `finalizer_name`: adds the finalizer before
/// the first [`Event::Apply`], runs [`Event::Cleanup`] once the object is being deleted, and
/// removes the finalizer only after the cleanup succeeded (see the [module docs](self) for the
/// table and the concurrency rules).
///
/// `api` must address the object's namespace (`Api::namespaced`), or be `Api::all` for a
/// cluster-scoped kind. `finalizer_name` must be unique to this controller. Returns the
/// reconcile's [`Action`]; [`Action::Done`] when nothing ran (a deleting object without our
/// finalizer).
pub async fn finalizer<K, F, Fut, E>(
    api: &Api<K>,
    finalizer_name: &str,
    obj: Arc<K>,
    reconcile: F,
) -> Result<Action, FinalizerError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    F: FnOnce(Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: Into<BoxError>,
{
    validate_finalizer_name(finalizer_name)?;
    let name = obj.meta().name.clone().ok_or(FinalizerError::UnnamedObject)?;
    let key = object_key(&*obj);
    let mut reconcile = Some(reconcile);
    let mut obj = obj;
    // The cleanup's action, once it succeeded: from then on only the removal is retried.
    let mut cleaned: Option<Action> = None;
    let mut attempt = 0;
    loop {
        let index = obj.finalizers().iter().position(|f| f == finalizer_name);
        let deleting = obj.meta().deletion_timestamp.is_some();
        let conflict = match (index, deleting) {
            (Some(_), false) => {
                let Some(reconcile) = reconcile.take() else {
                    // Unreachable: apply ends the loop; a cleaned object stays deleting.
                    return Ok(cleaned.unwrap_or(Action::Done));
                };
                debug!(finalizer = finalizer_name, object = %key, "finalizer: apply");
                return reconcile(Event::Apply(obj))
                    .await
                    .map_err(|e| FinalizerError::ApplyFailed {
                        object: key,
                        source: e.into(),
                    });
            }
            (Some(index), true) => {
                if cleaned.is_none() {
                    let Some(reconcile) = reconcile.take() else {
                        return Ok(Action::Done);
                    };
                    debug!(finalizer = finalizer_name, object = %key, "finalizer: cleanup");
                    let action =
                        reconcile(Event::Cleanup(obj.clone()))
                            .await
                            .map_err(|e| FinalizerError::CleanupFailed {
                                object: key.clone(),
                                finalizer: finalizer_name.to_owned(),
                                source: e.into(),
                            })?;
                    cleaned = Some(action);
                }
                match api
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Json::<()>(remove_patch(finalizer_name, index)),
                    )
                    .await
                {
                    // Removed: the object is gone (ours was the last) or waits for the others.
                    Ok(_) => {
                        debug!(finalizer = finalizer_name, object = %key, "finalizer: removed after cleanup");
                        return Ok(cleaned.unwrap_or(Action::Done));
                    }
                    Err(e) if is_not_found(&e) => return Ok(cleaned.unwrap_or(Action::Done)),
                    Err(e) if is_conflict(&e) && attempt + 1 < MAX_ATTEMPTS => e,
                    Err(source) => {
                        return Err(FinalizerError::RemoveFinalizer {
                            object: key,
                            finalizer: finalizer_name.to_owned(),
                            source,
                        });
                    }
                }
            }
            (None, false) => {
                if cleaned.is_some() {
                    // Cleaned up and no longer deleting: cannot happen (a deletion is final).
                    return Ok(cleaned.unwrap_or(Action::Done));
                }
                match api
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Json::<()>(add_patch(&*obj, finalizer_name)),
                    )
                    .await
                {
                    Ok(patched) => {
                        debug!(finalizer = finalizer_name, object = %key, "finalizer: added");
                        // Decide again on the server's object: apply, or (if it is being
                        // deleted already) cleanup.
                        obj = Arc::new(patched);
                        continue;
                    }
                    Err(e) if is_conflict(&e) && attempt + 1 < MAX_ATTEMPTS => e,
                    Err(e) if is_not_found(&e) => return Ok(Action::Done),
                    Err(source) => {
                        return Err(FinalizerError::AddFinalizer {
                            object: key,
                            finalizer: finalizer_name.to_owned(),
                            source,
                        });
                    }
                }
            }
            // Not ours (never added, or removed after our cleanup): nothing to do, and adding a
            // finalizer to a deleting object would hold it for no cleanup.
            (None, true) => return Ok(cleaned.unwrap_or(Action::Done)),
        };
        debug!(finalizer = finalizer_name, object = %key, attempt, error = %conflict, "finalizer: conflicting write, re-reading the object");
        attempt += 1;
        obj = match api.get_opt(&name).await {
            Ok(Some(fresh)) => Arc::new(fresh),
            Ok(None) => return Ok(cleaned.unwrap_or(Action::Done)),
            Err(source) => return Err(FinalizerError::Get { object: key, source }),
        };
    }
}

/// `test` that the finalizer list is still the one in `obj` (or, when `obj` has none, that the
/// resourceVersion is), then append `finalizer`.
fn add_patch<K: Resource>(obj: &K, finalizer: &str) -> json_patch::Patch {
    let finalizers = PointerBuf::from_tokens(["metadata", "finalizers"]);
    let current = obj.finalizers();
    let ops = if current.is_empty() {
        // `test` of an absent path against null succeeds on kube-apiserver (evanphx/json-patch)
        // and fails on RFC 6902 implementations: test the resourceVersion instead, portable.
        vec![
            PatchOperation::Test(TestOperation {
                path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
                value: obj
                    .meta()
                    .resource_version
                    .clone()
                    .map_or(serde_json::Value::Null, Into::into),
            }),
            PatchOperation::Add(AddOperation {
                path: finalizers,
                value: serde_json::json!([finalizer]),
            }),
        ]
    } else {
        vec![
            // kube-apiserver does not deduplicate finalizers: fail (and re-read) if anyone
            // changed the list since we read it.
            PatchOperation::Test(TestOperation {
                path: finalizers.clone(),
                value: serde_json::json!(current),
            }),
            PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "finalizers", "-"]),
                value: finalizer.into(),
            }),
        ]
    };
    json_patch::Patch(ops)
}

/// `test` that index `index` of the finalizer list holds `finalizer`, then remove it: another
/// controller's removal shifts the indexes, and a bare remove would drop its neighbour.
fn remove_patch(finalizer: &str, index: usize) -> json_patch::Patch {
    let path = PointerBuf::from_tokens(["metadata".to_owned(), "finalizers".to_owned(), index.to_string()]);
    json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: path.clone(),
            value: finalizer.into(),
        }),
        PatchOperation::Remove(RemoveOperation { path }),
    ])
}

/// A write lost a race: a JSON patch `test` failed (`422`), or a conflict (`409`).
fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409 || status.code == 422)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 404)
}

/// `namespace/name` (or `name`) for logs and errors.
pub(crate) fn object_key<K: Resource>(obj: &K) -> String {
    match obj.meta().namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", obj.name_any()),
        _ => obj.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(finalizers: &[&str], rv: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("x".into()),
                namespace: Some("default".into()),
                resource_version: rv.map(Into::into),
                finalizers: (!finalizers.is_empty()).then(|| finalizers.iter().map(|f| (*f).to_owned()).collect()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn names_follow_kube_apiserver() {
        for ok in [
            "example.com/cleanup",
            "a/b",
            "x.y.z/A_b-c.d",
            &format!("e.com/{}", "a".repeat(63)),
        ] {
            assert_eq!(validate_finalizer_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "cleanup",
            "kubernetes",
            "/cleanup",
            "example.com/",
            "example.com/a/b",
            "Example.com/cleanup",
            "-example.com/cleanup",
            "example..com/cleanup",
            "example.com/-cleanup",
            "example.com/clean up",
            &format!("e.com/{}", "a".repeat(64)),
            &format!("{}/x", "a".repeat(254)),
        ] {
            let err = validate_finalizer_name(bad).expect_err(bad);
            assert_eq!(err.name, bad);
        }
    }

    #[test]
    fn in_memory_helpers() {
        let mut obj = cm(&["a/x", "b/y", "a/x"], None);
        assert!(has_finalizer(&obj, "b/y"));
        assert!(!add_finalizer(&mut obj, "b/y"));
        assert!(remove_finalizer(&mut obj, "a/x"), "every occurrence, as controllerutil");
        assert_eq!(obj.finalizers(), ["b/y"]);
        assert!(!remove_finalizer(&mut obj, "a/x"));
        assert!(add_finalizer(&mut obj, "c/z"));
        assert_eq!(obj.finalizers(), ["b/y", "c/z"]);
    }

    #[test]
    fn patches_are_guarded_by_a_test() {
        let add = serde_json::to_value(add_patch(&cm(&[], Some("7")), "a/x")).unwrap();
        assert_eq!(
            add,
            serde_json::json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/finalizers", "value": ["a/x"]},
            ])
        );
        let add = serde_json::to_value(add_patch(&cm(&["b/y"], Some("7")), "a/x")).unwrap();
        assert_eq!(
            add,
            serde_json::json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["b/y"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "a/x"},
            ])
        );
        let remove = serde_json::to_value(remove_patch("a/x", 2)).unwrap();
        assert_eq!(
            remove,
            serde_json::json!([
                {"op": "test", "path": "/metadata/finalizers/2", "value": "a/x"},
                {"op": "remove", "path": "/metadata/finalizers/2"},
            ])
        );
    }

    /// The pure state machine: a patch applied to a server object the cache no longer matches
    /// fails instead of dropping another writer's finalizer.
    #[test]
    fn a_stale_patch_fails_instead_of_dropping_a_finalizer() {
        // Cache: [ours] at 0. Server meanwhile: [other, ours].
        let mut server = serde_json::json!({"metadata": {"resourceVersion": "9", "finalizers": ["b/other", "a/ours"]}});
        let stale = remove_patch("a/ours", 0);
        assert!(json_patch::patch(&mut server, &stale).is_err());
        assert_eq!(
            server["metadata"]["finalizers"],
            serde_json::json!(["b/other", "a/ours"])
        );
        // Cache: none, rv 8. Server: [other] at rv 9.
        let stale = add_patch(&cm(&[], Some("8")), "a/ours");
        assert!(json_patch::patch(&mut server, &stale).is_err());
    }
}
