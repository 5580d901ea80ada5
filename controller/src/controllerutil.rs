//! controller-runtime's `controllerutil` for reconcilers: owner references
//! ([`set_controller_reference`], [`set_owner_reference`]), create-or-update by server-side
//! apply ([`apply`]), and a status write that is skipped when nothing changed
//! ([`patch_status_if_changed`]). The finalizer helpers are in [`finalizer`](mod@crate::finalizer).
//!
//! Where it sits in the data path: in a reconcile, on the write side. The reconcile reads the
//! primary from the cache ([`Context::get`](crate::Context::get)), builds the children it wants
//! with the primary as their controller owner, applies them, and reports what it saw in the
//! primary's status; the owner references are what make the controller's `owns::<C>()` source
//! enqueue the primary when a child changes, and let garbage collection delete the children
//! with it.
//!
//! ```
//! use controller::controllerutil::{apply, patch_status_if_changed, set_controller_reference};
//! use controller::{reconciler_fn, Action, BoxError, Context, Request};
//! use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, ObjectMeta};
//!
//! let reconciler = reconciler_fn(|req: Request, ctx: Context<Deployment>| async move {
//!     let Some(deploy) = ctx.get(&req)? else { return Ok::<_, BoxError>(Action::Done) };
//!     let ns = req.namespace.as_deref().unwrap_or("default");
//!     let mut cm = ConfigMap {
//!         metadata: ObjectMeta { name: Some(req.name.clone()), namespace: Some(ns.into()), ..Default::default() },
//!         ..Default::default()
//!     };
//!     set_controller_reference(&*deploy, &mut cm)?;
//!     ctx.ensure_leading()?;
//!     apply(&Api::namespaced(ctx.client().clone(), ns), "example-controller", &cm).await?;
//!     let status = DeploymentStatus { observed_generation: deploy.metadata.generation, ..Default::default() };
//!     patch_status_if_changed(&Api::<Deployment>::namespaced(ctx.client().clone(), ns), &*deploy, &status).await?;
//!     Ok(Action::Done)
//! });
//! # let _ = reconciler;
//! ```

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::debug;

use crate::finalizer::object_key;

/// Why an owner reference was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OwnerReferenceError {
    /// The object already has a controller owner, and it is not this owner (controllerutil's
    /// `AlreadyOwnedError`): an object has at most one controller.
    #[error("{object} is already owned by another {} controller {}", owner.kind, owner.name)]
    AlreadyOwned {
        /// `namespace/name` of the object.
        object: String,
        /// The existing controller reference.
        owner: Box<OwnerReference>,
    },
    /// A namespaced owner cannot own a cluster-scoped object (an object without a namespace).
    #[error("cluster-scoped {object} must not have a namespace-scoped owner, owner's namespace {owner_namespace}")]
    ClusterScopedObject {
        /// The name of the object.
        object: String,
        /// The owner's namespace.
        owner_namespace: String,
    },
    /// A namespaced owner can own objects of its own namespace only.
    #[error(
        "cross-namespace owner references are disallowed, owner's namespace {owner_namespace}, {object}'s namespace {object_namespace}"
    )]
    CrossNamespace {
        /// `namespace/name` of the object.
        object: String,
        /// The owner's namespace.
        owner_namespace: String,
        /// The object's namespace.
        object_namespace: String,
    },
    /// The owner has no name or uid: it was not read from the server (kube-apiserver refuses
    /// a reference without a uid).
    #[error("owner {kind} {name:?} has no name or uid: use the object as the server returned it")]
    OwnerNotStored {
        /// The owner's kind.
        kind: String,
        /// The owner's name, if it has one.
        name: Option<String>,
    },
}

/// Makes `owner` the controller of `object`: an owner reference with `controller: true` and
/// `blockOwnerDeletion: true` (controllerutil's `SetControllerReference`).
///
/// Refused with [`OwnerReferenceError::AlreadyOwned`] (naming the existing controller) if the
/// object already has a different controller owner; a reference to the same owner (same group,
/// kind and name, as controllerutil compares) is updated in place. The namespace rules are
/// controllerutil's: a namespaced owner cannot own a cluster-scoped object, nor one of another
/// namespace; a cluster-scoped owner may own anything. An object's scope is read from its
/// `metadata.namespace`, so set the namespace of a namespaced object first.
///
/// ```
/// use controller::controllerutil::{set_controller_reference, OwnerReferenceError};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::api::ObjectMeta;
///
/// let meta = |name: &str, uid: &str| ObjectMeta {
///     name: Some(name.into()), namespace: Some("default".into()), uid: Some(uid.into()), ..Default::default()
/// };
/// let (a, b) = (ConfigMap { metadata: meta("a", "1"), ..Default::default() },
///               ConfigMap { metadata: meta("b", "2"), ..Default::default() });
/// let mut child = ConfigMap { metadata: meta("child", ""), ..Default::default() };
/// set_controller_reference(&a, &mut child).unwrap();
/// set_controller_reference(&a, &mut child).unwrap(); // the same owner: updated in place
/// assert!(matches!(set_controller_reference(&b, &mut child), Err(OwnerReferenceError::AlreadyOwned { .. })));
/// assert_eq!(child.metadata.owner_references.unwrap().len(), 1);
/// ```
pub fn set_controller_reference<O, C>(owner: &O, object: &mut C) -> Result<(), OwnerReferenceError>
where
    O: Resource,
    O::DynamicType: Default,
    C: Resource,
{
    let reference = OwnerReference {
        controller: Some(true),
        block_owner_deletion: Some(true),
        ..owner_reference(owner)?
    };
    upsert_owner_reference(object, owner.meta().namespace.as_deref(), reference)
}

/// Adds a non-controller owner reference to `owner` (controllerutil's `SetOwnerReference`):
/// `object` then depends on `owner` for garbage collection, without being controlled by it. A
/// reference to the same owner is overwritten, as controllerutil does (so this also turns a
/// controller reference to `owner` into a plain one). The namespace rules are
/// [`set_controller_reference`]'s.
pub fn set_owner_reference<O, C>(owner: &O, object: &mut C) -> Result<(), OwnerReferenceError>
where
    O: Resource,
    O::DynamicType: Default,
    C: Resource,
{
    let reference = owner_reference(owner)?;
    upsert_owner_reference(object, owner.meta().namespace.as_deref(), reference)
}

/// Adds `reference` to `object`, or replaces the reference to the same owner (group, kind,
/// name): the building block of [`set_controller_reference`] and [`set_owner_reference`] for
/// owners whose type is known only at run time (a `DynamicObject` with its `ApiResource`).
/// `owner_namespace` is the owner's `metadata.namespace` (`None` for a cluster-scoped owner).
/// With `reference.controller == Some(true)`, refuses an object controlled by another owner.
pub fn upsert_owner_reference<C: Resource>(
    object: &mut C,
    owner_namespace: Option<&str>,
    reference: OwnerReference,
) -> Result<(), OwnerReferenceError> {
    validate_owner(owner_namespace, object)?;
    if reference.controller == Some(true)
        && let Some(existing) = controller_of(object)
        && !same_object(existing, &reference)
    {
        return Err(OwnerReferenceError::AlreadyOwned {
            object: object_key(object),
            owner: Box::new(existing.clone()),
        });
    }
    let references = object.owner_references_mut();
    match references.iter_mut().find(|r| same_object(r, &reference)) {
        Some(existing) => *existing = reference,
        None => references.push(reference),
    }
    Ok(())
}

/// The owner reference with `controller: true`, if any (apimachinery's `GetControllerOf`).
pub fn controller_of<C: Resource>(object: &C) -> Option<&OwnerReference> {
    object.owner_references().iter().find(|r| r.controller == Some(true))
}

fn owner_reference<O>(owner: &O) -> Result<OwnerReference, OwnerReferenceError>
where
    O: Resource,
    O::DynamicType: Default,
{
    let dt = O::DynamicType::default();
    owner
        .owner_ref(&dt)
        .filter(|r| !r.name.is_empty() && !r.uid.is_empty())
        .ok_or_else(|| OwnerReferenceError::OwnerNotStored {
            kind: O::kind(&dt).into_owned(),
            name: owner.meta().name.clone(),
        })
}

/// controllerutil's `validateOwner`: a namespaced owner owns objects of its namespace only.
fn validate_owner<C: Resource>(owner_namespace: Option<&str>, object: &C) -> Result<(), OwnerReferenceError> {
    let Some(owner_ns) = owner_namespace.filter(|ns| !ns.is_empty()) else {
        return Ok(());
    };
    match object.meta().namespace.as_deref().filter(|ns| !ns.is_empty()) {
        None => Err(OwnerReferenceError::ClusterScopedObject {
            object: object_key(object),
            owner_namespace: owner_ns.to_owned(),
        }),
        Some(object_ns) if object_ns != owner_ns => Err(OwnerReferenceError::CrossNamespace {
            object: object_key(object),
            owner_namespace: owner_ns.to_owned(),
            object_namespace: object_ns.to_owned(),
        }),
        Some(_) => Ok(()),
    }
}

/// controllerutil's `referSameObject`: the same group (the version may differ), kind and name.
fn same_object(a: &OwnerReference, b: &OwnerReference) -> bool {
    let group = |api_version: &str| api_version.rsplit_once('/').map_or("", |(group, _)| group).to_owned();
    group(&a.api_version) == group(&b.api_version) && a.kind == b.kind && a.name == b.name
}

/// Why a write of [`apply`] or [`patch_status_if_changed`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PatchError {
    /// The object has no `metadata.name`.
    #[error("the object has no name")]
    UnnamedObject,
    /// The object or status could not be encoded as JSON.
    #[error("encoding {object} failed")]
    Encode {
        /// `namespace/name` of the object.
        object: String,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The server refused the write, or it did not reach the server.
    #[error("patch of {object} failed")]
    Api {
        /// `namespace/name` of the object.
        object: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// Creates or updates `obj` by server-side apply as `field_manager`, forcing conflicts, and
/// returns the object as stored.
///
/// Send the fields this controller owns, not an object read back from the server: a field
/// left out is released by this manager (and removed if no other manager owns it), and a
/// `metadata.resourceVersion` in `obj` is a precondition (`409` if the object changed). The
/// `metadata.managedFields` of `obj` are dropped (kube-apiserver refuses them in an apply). A
/// repeated apply of the same fields is a no-op on the server: no write, the same
/// resourceVersion, no watch event.
///
/// Forced, as controller-runtime recommends for controllers (`client.ForceOwnership`: "most
/// controllers should use this") and the Kubernetes server-side apply docs advise: a
/// controller is the authority on the fields it applies, and an unforced apply would fail
/// forever once a user's `kubectl edit` took one of them. Not a default of controller-runtime's
/// client, which leaves force off unless asked; call `Api::patch` with `PatchParams::apply(m)`
/// for an unforced apply.
pub async fn apply<K>(api: &Api<K>, field_manager: &str, obj: &K) -> Result<K, PatchError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let name = obj.meta().name.as_deref().ok_or(PatchError::UnnamedObject)?;
    let key = object_key(obj);
    let body = apply_body(obj).map_err(|source| PatchError::Encode {
        object: key.clone(),
        source,
    })?;
    let applied = api
        .patch(name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&body))
        .await
        .map_err(|source| PatchError::Api {
            object: key.clone(),
            source,
        })?;
    debug!(object = %key, field_manager, resource_version = ?applied.meta().resource_version, "applied");
    Ok(applied)
}

/// The body of [`apply`]: `obj` without `metadata.managedFields` (kube-apiserver answers an
/// apply that carries them with `400 metadata.managedFields must be nil`).
fn apply_body<K: Serialize>(obj: &K) -> Result<Value, serde_json::Error> {
    let mut body = serde_json::to_value(obj)?;
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    Ok(body)
}

/// Writes `desired_status` to the status subresource of `cached`'s object with a merge patch,
/// only if that patch would change the status `cached` holds; returns the stored object, or
/// `None` when nothing was sent (no request, no new resourceVersion, no watch event for the
/// controller's own informer to wake it with).
///
/// The comparison is the merge patch's own semantics (RFC 7386) applied to `cached`'s status:
/// fields of `desired_status` absent from its JSON are left alone, `null`s delete. `cached` is
/// normally the object from the informer cache; if the cache lags behind a status this
/// controller wrote, the write is repeated, harmlessly. The kind must have a status
/// subresource.
pub async fn patch_status_if_changed<K, S>(
    api: &Api<K>,
    cached: &K,
    desired_status: &S,
) -> Result<Option<K>, PatchError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    S: Serialize,
{
    let name = cached.meta().name.as_deref().ok_or(PatchError::UnnamedObject)?;
    let key = object_key(cached);
    let encode = |source| PatchError::Encode {
        object: key.clone(),
        source,
    };
    let desired = serde_json::to_value(desired_status).map_err(encode)?;
    let current = serde_json::to_value(cached)
        .map_err(encode)?
        .get_mut("status")
        .map(Value::take)
        .unwrap_or(Value::Null);
    if !status_patch_changes(&current, &desired) {
        debug!(object = %key, "status unchanged: not written");
        return Ok(None);
    }
    let patch = serde_json::json!({ "status": desired });
    let stored = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| PatchError::Api {
            object: key.clone(),
            source,
        })?;
    debug!(object = %key, resource_version = ?stored.meta().resource_version, "status written");
    Ok(Some(stored))
}

/// Whether merging `desired` into `current` (RFC 7386) changes it. An absent status and an
/// empty one are the same: a merge of `{}` into nothing is not worth a write.
fn status_patch_changes(current: &Value, desired: &Value) -> bool {
    let mut merged = current.clone();
    json_patch::merge(&mut merged, desired);
    let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(serde_json::Map::is_empty);
    merged != *current && !(empty(current) && empty(&merged))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::api::ObjectMeta;
    use serde_json::json;

    fn meta(ns: Option<&str>, name: &str, uid: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: ns.map(Into::into),
            uid: (!uid.is_empty()).then(|| uid.into()),
            ..ObjectMeta::default()
        }
    }

    fn cm(ns: Option<&str>, name: &str, uid: &str) -> ConfigMap {
        ConfigMap {
            metadata: meta(ns, name, uid),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn controller_reference_refuses_a_second_controller_and_updates_the_same_in_place() {
        let (a, b) = (cm(Some("d"), "a", "uid-a"), cm(Some("d"), "b", "uid-b"));
        let mut child = cm(Some("d"), "child", "");
        set_controller_reference(&a, &mut child).unwrap();
        let first = child.metadata.owner_references.clone().unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].controller, Some(true));
        assert_eq!(first[0].block_owner_deletion, Some(true));
        assert_eq!(
            (first[0].api_version.as_str(), first[0].kind.as_str()),
            ("v1", "ConfigMap")
        );
        assert_eq!(first[0].uid, "uid-a");

        let err = set_controller_reference(&b, &mut child).unwrap_err();
        match &err {
            OwnerReferenceError::AlreadyOwned { object, owner } => {
                assert_eq!(object, "d/child");
                assert_eq!(owner.name, "a");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "d/child is already owned by another ConfigMap controller a"
        );
        assert_eq!(
            child.metadata.owner_references.as_ref(),
            Some(&first),
            "unchanged on refusal"
        );

        // The same owner, recreated (new uid): updated in place, not appended.
        let a2 = cm(Some("d"), "a", "uid-a2");
        set_controller_reference(&a2, &mut child).unwrap();
        let refs = child.metadata.owner_references.clone().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, "uid-a2");

        // A plain owner reference beside the controller is fine.
        set_owner_reference(&b, &mut child).unwrap();
        let refs = child.metadata.owner_references.clone().unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[1].controller, None);
        assert_eq!(controller_of(&child).map(|r| r.name.as_str()), Some("a"));
    }

    #[test]
    fn namespace_rules_are_controllerutils() {
        let namespaced_owner = cm(Some("d"), "a", "uid-a");
        let cluster_owner = Namespace {
            metadata: meta(None, "ns", "uid-ns"),
            ..Namespace::default()
        };
        let mut cluster_child = Namespace {
            metadata: meta(None, "child", ""),
            ..Namespace::default()
        };
        assert!(matches!(
            set_controller_reference(&namespaced_owner, &mut cluster_child),
            Err(OwnerReferenceError::ClusterScopedObject { .. })
        ));
        let mut other_ns = cm(Some("e"), "child", "");
        assert!(matches!(
            set_owner_reference(&namespaced_owner, &mut other_ns),
            Err(OwnerReferenceError::CrossNamespace { ref owner_namespace, ref object_namespace, .. })
                if owner_namespace == "d" && object_namespace == "e"
        ));
        assert!(other_ns.metadata.owner_references.is_none());
        // A cluster-scoped owner may own namespaced and cluster-scoped objects.
        set_controller_reference(&cluster_owner, &mut other_ns).unwrap();
        set_controller_reference(&cluster_owner, &mut cluster_child).unwrap();
    }

    #[test]
    fn an_owner_not_read_from_the_server_is_refused() {
        let unsaved = cm(Some("d"), "a", "");
        let mut child = cm(Some("d"), "child", "");
        assert_eq!(
            set_controller_reference(&unsaved, &mut child),
            Err(OwnerReferenceError::OwnerNotStored {
                kind: "ConfigMap".into(),
                name: Some("a".into())
            })
        );
    }

    #[test]
    fn same_object_ignores_the_version() {
        let r = |api_version: &str, kind: &str, name: &str| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            ..OwnerReference::default()
        };
        assert!(same_object(
            &r("apps/v1", "Deployment", "x"),
            &r("apps/v1beta1", "Deployment", "x")
        ));
        assert!(!same_object(
            &r("apps/v1", "Deployment", "x"),
            &r("extensions/v1", "Deployment", "x")
        ));
        assert!(same_object(&r("v1", "Pod", "x"), &r("v2", "Pod", "x")));
        assert!(!same_object(&r("v1", "Pod", "x"), &r("v1", "Pod", "y")));
    }

    #[test]
    fn an_apply_body_carries_no_managed_fields() {
        let mut read_back = cm(Some("d"), "x", "uid-x");
        read_back.metadata.managed_fields = Some(vec![Default::default()]);
        read_back.metadata.resource_version = Some("5".into());
        let body = apply_body(&read_back).unwrap();
        assert_eq!(body["metadata"].get("managedFields"), None);
        assert_eq!(
            body["metadata"]["resourceVersion"], "5",
            "kept: a precondition the caller chose"
        );
        assert_eq!(
            (body["apiVersion"].as_str(), body["kind"].as_str()),
            (Some("v1"), Some("ConfigMap"))
        );
    }

    #[test]
    fn status_changes_by_merge_patch_semantics() {
        let current = json!({"ready": true, "count": 2});
        assert!(!status_patch_changes(&current, &json!({"ready": true, "count": 2})));
        assert!(
            !status_patch_changes(&current, &json!({"ready": true})),
            "absent fields are left alone"
        );
        assert!(status_patch_changes(&current, &json!({"count": 3})));
        assert!(status_patch_changes(&current, &json!({"count": null})), "null deletes");
        assert!(!status_patch_changes(&current, &json!({"gone": null})));
        assert!(!status_patch_changes(&Value::Null, &json!({})));
        assert!(!status_patch_changes(&Value::Null, &Value::Null));
        assert!(status_patch_changes(&Value::Null, &json!({"ready": false})));
    }
}
