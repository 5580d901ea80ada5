//! The REST verbs' semantics (kube-apiserver's generic registry store): get, list, create,
//! update, patch, delete, deletecollection, and the `/status` subresource.
//!
//! Each verb's write is one read-modify-write under the store lock, so concurrent writers are
//! serialized exactly as optimistic concurrency on etcd would order them. A patch and a
//! server-side apply are computed off the lock, from the object read under it, and written
//! only if that object is still the stored one, else computed again (kube-apiserver's
//! `GuaranteedUpdate`): a costly patch never holds up other requests. Semantics follow
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/>: `409 AlreadyExists` on create,
//! `409 Conflict` on a stale `metadata.resourceVersion`, `generation` bumped only when the desired
//! state changes, no new revision for a no-op write, finalizers keep a deleted object (with
//! `deletionTimestamp`) until they are gone.

use crate::admission::{Admission, Attributes, Operation, Snapshot as AdmissionSnapshot, Warnings};
use crate::field;
use crate::field_manager;
use crate::limits;
use crate::object;
use crate::patch::{self, PatchKind};
use crate::request::{Query, ResourcePath};
use crate::resources::{Registry, ResourceInfo};
use crate::selectors::{FieldSelector, Filter, LabelSelector};
use crate::status::{self, ApiError};
use crate::storage::{Inner, ObjectKey, Objects, Storage};
use crate::typed::{self, FieldValidation};
use serde_json::{Value, json};
use std::ops::Bound;
use std::sync::Arc;

/// The verbs over a [`Storage`] and the resource table.
#[derive(Debug, Clone)]
pub(crate) struct Rest {
    pub(crate) storage: Arc<Storage>,
    pub(crate) registry: Registry,
    /// Woken after deletes so the garbage collector runs.
    pub(crate) gc: Arc<tokio::sync::Notify>,
    /// The admission chain every write passes (webhooks).
    pub(crate) admission: Admission,
}

/// The result of a write: the HTTP status and body.
pub(crate) type WriteResult = Result<(u16, Value), ApiError>;

/// The query parameters every create, update and patch honours.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteOptions {
    /// `dryRun=All`: run every step, store nothing.
    pub(crate) dry_run: bool,
    /// `fieldValidation`: what unknown fields do.
    pub(crate) field_validation: FieldValidation,
    /// The `fieldManager` parameter, if given (server-side apply requires it).
    pub(crate) field_manager: Option<String>,
    /// The manager the write is recorded under: `fieldManager`, else from the User-Agent.
    pub(crate) manager: String,
    /// `force=true`: a server-side apply takes conflicting fields over.
    pub(crate) force: bool,
    /// Set by server-side apply: managedFields are already computed.
    pub(crate) applied: bool,
    /// Where admission webhooks' warnings go (the response's `Warning` headers).
    pub(crate) warnings: Warnings,
}

/// How a kind's registry strategy keeps `metadata.generation` (kube-apiserver sets it only for
/// kinds whose desired state it tracks; for the others it is absent or as the client sent it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GenerationRule {
    /// Never set by the server (ConfigMap, Secret, Pod in 1.32, Service, RBAC, …).
    Untracked,
    /// Bumped when anything but metadata and status changes (workloads, Ingress, CRDs).
    Spec,
    /// As `Spec`, and also on an annotation change (Deployment).
    SpecAndAnnotations,
    /// Bumped when anything but metadata changes, or the labels (EndpointSlice); custom
    /// resources the same without the labels (a main-resource write cannot change status when
    /// the status subresource is on, since it is copied over).
    AllButMetadata { labels: bool },
}

fn generation_rule(info: &ResourceInfo) -> GenerationRule {
    if !typed::is_built_in(info) {
        return GenerationRule::AllButMetadata { labels: false };
    }
    match (info.group.as_str(), info.kind.as_str()) {
        ("apps", "Deployment") => GenerationRule::SpecAndAnnotations,
        ("apps", _) | ("batch", _) | ("networking.k8s.io", "Ingress") | ("apiextensions.k8s.io", _) => {
            GenerationRule::Spec
        }
        ("discovery.k8s.io", "EndpointSlice") => GenerationRule::AllButMetadata { labels: true },
        // The webhook configurations' strategies bump it when `webhooks` changes.
        ("admissionregistration.k8s.io", _) => GenerationRule::Spec,
        _ => GenerationRule::Untracked,
    }
}

/// Whether the write from `cur` to `new` changes what `rule` tracks.
fn generation_changes(rule: GenerationRule, cur: &Value, new: &Value) -> bool {
    let meta = |o: &Value, f: &str| o.get("metadata").and_then(|m| m.get(f)).cloned();
    match rule {
        GenerationRule::Untracked => false,
        GenerationRule::Spec => object::spec_part(new) != object::spec_part(cur),
        GenerationRule::SpecAndAnnotations => {
            object::spec_part(new) != object::spec_part(cur) || meta(new, "annotations") != meta(cur, "annotations")
        }
        GenerationRule::AllButMetadata { labels } => {
            object::without_metadata(new) != object::without_metadata(cur)
                || (labels && meta(new, "labels") != meta(cur, "labels"))
        }
    }
}

fn name_of(path: &ResourcePath) -> Result<&str, ApiError> {
    path.name.as_deref().ok_or_else(ApiError::method_not_allowed)
}

fn ns_of(path: &ResourcePath) -> &str {
    path.namespace.as_deref().unwrap_or("")
}

/// The namespace a write to the object `name` in `ns` is admitted in: a Namespace's own name
/// (kube-apiserver takes it from the request's path, `/api/v1/namespaces/<name>`, through
/// RequestInfo), else `ns`.
fn admission_namespace<'a>(info: &ResourceInfo, ns: &'a str, name: &'a str) -> &'a str {
    if info.key() == "/namespaces" { name } else { ns }
}

/// Builds the filter of a list or watch from its query.
pub(crate) fn filter_from(path: &ResourcePath, q: &Query) -> Result<Filter, ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse_with(
        q.get("fieldSelector").unwrap_or(""),
        crate::events::selectable_fields(&path.info),
    )
    .map_err(ApiError::bad_request)?;
    Ok(Filter {
        namespace: path.namespace.clone(),
        labels,
        fields,
    })
}

/// Parses a resourceVersion parameter (`None` for absent/empty).
pub(crate) fn parse_rv(v: Option<&str>) -> Result<Option<u64>, ApiError> {
    match v {
        None | Some("") => Ok(None),
        Some(s) => s
            .parse::<u64>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resource version {s:?}"))),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

/// A continue token: the list's pinned revision and the last key returned.
pub(crate) fn encode_continue(rv: u64, key: &ObjectKey) -> String {
    hex(json!([rv, key.0, key.1]).to_string().as_bytes())
}

pub(crate) fn decode_continue(token: &str) -> Result<(u64, ObjectKey), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion");
    let bytes = unhex(token).ok_or_else(bad)?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let rv = v.get(0).and_then(Value::as_u64).ok_or_else(bad)?;
    let ns = v.get(1).and_then(Value::as_str).ok_or_else(bad)?;
    let name = v.get(2).and_then(Value::as_str).ok_or_else(bad)?;
    Ok((rv, (ns.to_owned(), name.to_owned())))
}

impl Rest {
    /// GET one object (or its `/status`).
    pub(crate) async fn get(&self, path: &ResourcePath) -> Result<Arc<Value>, ApiError> {
        let name = name_of(path)?;
        check_subresource(path)?;
        let (obj, crd) = {
            let inner = self.storage.lock();
            let obj = inner
                .get(&path.info.key(), ns_of(path), name)
                .ok_or_else(|| ApiError::not_found(&path.info.qualified(), name))?;
            (obj, self.crd_of(&inner, &path.info))
        };
        self.to_request_version(&path.info, crd.as_deref(), obj).await
    }

    /// LIST with selectors, pagination and resourceVersion semantics.
    pub(crate) async fn list(&self, path: &ResourcePath, q: &Query) -> Result<Value, ApiError> {
        let (mut list, items, crd) = self.list_stored(path, q)?;
        let items: Vec<Value> = items.into_iter().map(Arc::unwrap_or_clone).collect();
        // One conversion for the page, as kube-apiserver converts a list.
        let items = match crd {
            Some(crd) => {
                crate::conversion::list_to_request_version(&crd, self.admission.client(), &path.info, items).await?
            }
            None => match crate::conversion::builtin_storage_form(&path.info, self.admission.client()) {
                Some((_, to_request)) => to_request.convert_list(items, &path.info.version).await?,
                None => items,
            },
        };
        list["items"] = Value::Array(items);
        Ok(list)
    }

    /// A list's page as stored, under the lock: the list without its items, the items, and
    /// the CRD that serves the resource (for their conversion to the version of the request).
    #[allow(clippy::type_complexity)]
    fn list_stored(
        &self,
        path: &ResourcePath,
        q: &Query,
    ) -> Result<(Value, Vec<Arc<Value>>, Option<Arc<Value>>), ApiError> {
        let filter = filter_from(path, q)?;
        let limit = usize::try_from(q.uint("limit")?.unwrap_or(0)).unwrap_or(usize::MAX);
        let rv = parse_rv(q.get("resourceVersion"))?;
        let rv_match = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
        let token = q.get("continue").filter(|s| !s.is_empty());
        let info = &path.info;
        let inner = self.storage.lock();
        let crd = self.crd_of(&inner, info);
        let current = inner.current_rv();
        let (list_rv, snapshot, start): (u64, Option<Objects>, Option<ObjectKey>) = if let Some(t) = token {
            if rv.is_some_and(|rv| rv != 0) {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (rv, key) = decode_continue(t)?;
            let snap = inner.snapshot_at(&info.key(), rv).map_err(|e| {
                if e.code == 410 {
                    ApiError::expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")
                } else {
                    e
                }
            })?;
            (rv, Some(snap), Some(key))
        } else {
            match (rv, rv_match) {
                (None, Some(_)) => {
                    return Err(ApiError::bad_request(
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    ));
                }
                (Some(n), Some("Exact")) => (n, Some(inner.snapshot_at(&info.key(), n)?), None),
                (Some(n), Some("NotOlderThan") | None) if n > current => {
                    return Err(ApiError::too_large_resource_version(n, current));
                }
                (_, Some("NotOlderThan") | None) => (current, None, None),
                (_, Some(other)) => {
                    return Err(ApiError::bad_request(format!(
                        "unsupported resourceVersionMatch {other:?}"
                    )));
                }
            }
        };
        let empty = Objects::new();
        let objs = match &snapshot {
            Some(s) => s,
            None => inner.objects(&info.key()).unwrap_or(&empty),
        };
        let lower = match (&start, &path.namespace) {
            (Some(k), _) => Bound::Excluded(k.clone()),
            (None, Some(ns)) => Bound::Included((ns.clone(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut next: Option<ObjectKey> = None;
        let mut remaining = 0u64;
        for (key, obj) in objs.range((lower, Bound::Unbounded)) {
            if let Some(ns) = &path.namespace
                && &key.0 != ns
            {
                break;
            }
            if !filter.matches(obj) {
                continue;
            }
            if limit > 0 && items.len() >= limit {
                if next.is_none() {
                    next = items.last().map(|(k, _): &(ObjectKey, Arc<Value>)| k.clone());
                }
                remaining += 1;
                continue;
            }
            items.push((key.clone(), obj.clone()));
        }
        drop(inner);
        let mut metadata = json!({"resourceVersion": list_rv.to_string()});
        if let Some(k) = &next {
            metadata["continue"] = json!(encode_continue(list_rv, k));
            if q.get("labelSelector").unwrap_or("").is_empty() && q.get("fieldSelector").unwrap_or("").is_empty() {
                metadata["remainingItemCount"] = json!(remaining);
            }
        }
        let items: Vec<Arc<Value>> = items.into_iter().map(|(_, o)| o).collect();
        let list = json!({
            "kind": format!("{}List", info.kind),
            "apiVersion": info.api_version(),
            "metadata": metadata,
            "items": [],
        });
        Ok((list, items, crd))
    }

    /// Validates and normalizes the identity fields of a body for `path`.
    fn check_body(&self, path: &ResourcePath, body: &mut Value) -> Result<(), ApiError> {
        let info = &path.info;
        let Some(map) = body.as_object_mut() else {
            return Err(ApiError::bad_request("the body of the request must be a JSON object"));
        };
        match map.get("kind") {
            None => {}
            Some(Value::String(k)) if k == &info.kind => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the kind of the provided object ({other}) does not match the resource {} (kind {})",
                    info.qualified(),
                    info.kind
                )));
            }
        }
        match map.get("apiVersion") {
            None => {}
            Some(Value::String(v)) if *v == info.api_version() => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the apiVersion of the provided object ({other}) does not match {}",
                    info.api_version()
                )));
            }
        }
        map.insert("kind".into(), Value::String(info.kind.clone()));
        map.insert("apiVersion".into(), Value::String(info.api_version()));
        if map.get("metadata").is_some_and(|m| !m.is_object()) {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        let body_ns = object::namespace(body).to_owned();
        if info.namespaced {
            let ns = ns_of(path);
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            object::set_meta(body, "namespace", Value::String(ns.to_owned()));
        } else {
            object::remove_meta(body, "namespace");
        }
        for field in ["name", "generateName", "resourceVersion", "uid"] {
            if let Some(v) = body.get("metadata").and_then(|m| m.get(field))
                && !v.is_string()
                && !v.is_null()
            {
                return Err(ApiError::bad_request(format!("metadata.{field} must be a string")));
            }
        }
        Ok(())
    }

    fn check_namespace(&self, inner: &Inner, path: &ResourcePath) -> Result<(), ApiError> {
        if !path.info.namespaced {
            return Ok(());
        }
        let ns = ns_of(path);
        match inner.get("/namespaces", "", ns) {
            None => Err(ApiError::not_found("namespaces", ns)),
            Some(n) if object::is_terminating(&n) => Err(ApiError::forbidden(format!(
                "{} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                path.info.qualified()
            ))),
            Some(_) => Ok(()),
        }
    }

    /// CREATE (`POST` to the collection): decode and default, mutating admission, the
    /// server-set fields, validation, validating admission, all off the lock; then the commit
    /// under it.
    pub(crate) async fn create(&self, path: &ResourcePath, mut body: Value, opts: &WriteOptions) -> WriteResult {
        if path.name.is_some() {
            return Err(ApiError::method_not_allowed());
        }
        if path.info.namespaced && path.namespace.is_none() {
            return Err(ApiError::no_route());
        }
        self.check_body(path, &mut body)?;
        let info = &path.info;
        limits::check_object(info, &body)?;
        let (crd, snapshot) = {
            let inner = self.storage.lock();
            // kube-apiserver's NamespaceLifecycle admission plugin refuses a create in a
            // missing or terminating namespace before any webhook is called (checked again at
            // the commit, as the namespace may go meanwhile).
            self.check_namespace(&inner, path)?;
            (
                self.crd_of(&inner, info),
                self.admission.snapshot(&inner, info, ns_of(path)),
            )
        };
        let mut body = decode(info, crd.as_deref(), &body, opts.field_validation)?;
        crate::defaults::apply(&info.group, &info.kind, &mut body);
        // Mutating webhooks see the name the client sent: empty with `generateName`, whose
        // name is generated after them (kube-apiserver's BeforeCreate).
        let requested_name = object::name(&body).to_owned();
        let attrs = Attributes {
            info,
            subresource: None,
            namespace: ns_of(path),
            name: &requested_name,
            operation: Operation::Create,
            old: None,
            dry_run: opts.dry_run,
            options: admission_options("CreateOptions", opts),
        };
        if self
            .admission
            .mutate(&snapshot, &attrs, Some(&mut body), &opts.warnings)
            .await?
        {
            body = self.decode_admitted(path, crd.as_deref(), body)?;
            if !requested_name.is_empty() && object::name(&body) != requested_name {
                return Err(ApiError::bad_request(
                    "a mutating admission webhook changed the name of the object",
                ));
            }
        }
        let mut name = object::name(&body).to_owned();
        if name.is_empty() {
            let prefix = object::meta_str(&body, "generateName");
            if !prefix.is_empty() {
                name = format!("{prefix}{}", object::random_suffix(5));
                object::set_meta(&mut body, "name", Value::String(name.clone()));
            }
        }
        // Validating webhooks see the generated name (kube-apiserver's
        // AdmissionToValidateObjectFunc takes it from the object).
        let attrs = Attributes { name: &name, ..attrs };
        object::set_meta(&mut body, "uid", Value::String(object::new_uid()));
        object::set_meta(&mut body, "creationTimestamp", Value::String(object::now_timestamp()));
        if generation_rule(info) != GenerationRule::Untracked {
            object::set_meta(&mut body, "generation", json!(1));
        }
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            object::remove_meta(&mut body, f);
        }
        if info.key() == "/namespaces" {
            body["status"] = json!({"phase": "Active"});
        }
        // A custom resource with the status subresource cannot be created with a status (the
        // custom resource strategy's PrepareForCreate).
        if crd.is_some()
            && info.status_subresource
            && let Some(map) = body.as_object_mut()
        {
            map.remove("status");
        }
        validate(info, crd.as_deref(), &body, None)?;
        self.admission
            .validate(&snapshot, &attrs, Some(&body), &opts.warnings)
            .await?;
        if !opts.applied {
            let writer = writer(info, opts, None);
            field_manager::record_update(None, &mut body, &writer, fm_schema(info, crd.as_deref()));
        }
        limits::check_object(info, &body)?;
        let body = self.to_storage(info, crd.as_deref(), body).await?;
        let stored = {
            let mut inner = self.storage.lock();
            self.check_namespace(&inner, path)?;
            if inner.get(&info.key(), ns_of(path), &name).is_some() {
                return Err(ApiError::already_exists(&info.qualified(), &name));
            }
            if opts.dry_run {
                Arc::new(body)
            } else {
                let stored = inner.put(&info.key(), body);
                crate::crd::on_write(&self.registry, &mut inner, info, &stored, false);
                // A dependent created after its owner was deleted is collected too, as by
                // kube-controller-manager's garbage collector (it watches every create).
                if !object::owner_uids(&stored).is_empty() {
                    self.gc.notify_one();
                }
                stored
            }
        };
        let out = self.to_request_version(info, crd.as_deref(), stored).await?;
        Ok((201, Arc::unwrap_or_clone(out)))
    }

    /// An object a mutating webhook patched, decoded again as kube-apiserver does after a
    /// patch: its identity checked, built-in types' unknown fields dropped, a custom
    /// resource pruned and defaulted by its schema.
    fn decode_admitted(&self, path: &ResourcePath, crd: Option<&Value>, mut obj: Value) -> Result<Value, ApiError> {
        self.check_body(path, &mut obj)?;
        let mut obj = decode(&path.info, crd, &obj, FieldValidation::Ignore)?;
        crate::defaults::apply(&path.info.group, &path.info.kind, &mut obj);
        Ok(obj)
    }

    /// UPDATE (`PUT`), of the main resource or `/status`.
    pub(crate) async fn update(&self, path: &ResourcePath, mut body: Value, opts: &WriteOptions) -> WriteResult {
        let name = name_of(path)?.to_owned();
        check_subresource(path)?;
        if path.subresource.as_deref() == Some("scale") {
            return self.update_scale(path, &body, opts).await;
        }
        self.check_body(path, &mut body)?;
        let body_name = object::name(&body);
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        object::set_meta(&mut body, "name", Value::String(name.clone()));
        limits::check_object(&path.info, &body)?;
        self.guaranteed_update(path, None, opts, |_| Ok(body.clone())).await
    }

    /// PATCH (merge, JSON, strategic-as-merge, apply-as-create-or-merge).
    pub(crate) async fn patch(
        &self,
        path: &ResourcePath,
        kind: PatchKind,
        body: &[u8],
        opts: &WriteOptions,
    ) -> WriteResult {
        let name = name_of(path)?.to_owned();
        check_subresource(path)?;
        if path.subresource.as_deref() == Some("scale") {
            return self.patch_scale(path, kind, body, opts).await;
        }
        if kind == PatchKind::Apply {
            return self.server_side_apply(path, &name, body, opts).await;
        }
        if kind == PatchKind::Strategic && !typed::is_built_in(&path.info) {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        // A patch's cost is bounded by `limits.rs`, not small: it is computed off the lock.
        self.guaranteed_update(path, None, opts, |cur| {
            let mut patched = cur.clone();
            patch::apply(kind, &mut patched, body)?;
            self.check_body(path, &mut patched)?;
            Ok(patched)
        })
        .await
    }

    /// kube-apiserver's GuaranteedUpdate: read the object under the lock, compute the new one
    /// from it off the lock (`compute`), admit and validate it off the lock (webhooks are HTTP
    /// calls), then write under the lock only if the object is still the one read; if another
    /// writer won meanwhile, start again from its object.
    ///
    /// `path` is the resource written (the main resource for a `/scale` write);
    /// `admitted_as` names the subresource admission sees when it differs (`scale`).
    pub(crate) async fn guaranteed_update(
        &self,
        path: &ResourcePath,
        admitted_as: Option<&str>,
        opts: &WriteOptions,
        mut compute: impl FnMut(&Value) -> Result<Value, ApiError>,
    ) -> WriteResult {
        let info = &path.info;
        let name = name_of(path)?;
        loop {
            let (cur, crd, snapshot) = {
                let inner = self.storage.lock();
                let Some(cur) = inner.get(&info.key(), ns_of(path), name) else {
                    return Err(ApiError::not_found(&info.qualified(), name));
                };
                (
                    cur,
                    self.crd_of(&inner, info),
                    self.admission.snapshot(&inner, info, ns_of(path)),
                )
            };
            let old = self.to_request_version(info, crd.as_deref(), cur.clone()).await?;
            #[cfg(test)]
            tests::computing();
            let new = compute(&old)?;
            let new = self
                .prepare_update(path, admitted_as, &old, crd.as_deref(), &snapshot, new, opts)
                .await?;
            let new = self.to_storage(info, crd.as_deref(), new).await?;
            if let Some((code, out)) = self.commit_update(path, &cur, &crd, new, opts)? {
                let out = self.to_request_version(info, crd.as_deref(), out).await?;
                return Ok((code, Arc::unwrap_or_clone(out)));
            }
        }
    }

    /// What an update writes, computed off the lock from `new` (the object the client's
    /// update, patch or apply produced) and `cur` (the stored object it started from, in the
    /// version of the request): mutating admission, preconditions, subresource rules,
    /// server-owned fields, generation, validation, validating admission, managed fields.
    #[allow(clippy::too_many_arguments)]
    async fn prepare_update(
        &self,
        path: &ResourcePath,
        admitted_as: Option<&str>,
        cur: &Value,
        crd: Option<&Value>,
        snapshot: &AdmissionSnapshot,
        new: Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let info = &path.info;
        let mut new = decode(info, crd, &new, opts.field_validation)?;
        let name = object::name(cur).to_owned();
        let body_rv = object::resource_version(&new).to_owned();
        if !body_rv.is_empty() && body_rv != object::resource_version(cur) {
            return Err(ApiError::conflict(
                &info.qualified(),
                &name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        // Mutating admission sees the object as the client sent it, before the server-owned
        // fields are put back (kube-apiserver's update transformers run before BeforeUpdate).
        let mut attrs = Attributes {
            info,
            subresource: admitted_as.or(path.subresource.as_deref()),
            namespace: admission_namespace(info, object::namespace(cur), &name),
            name: &name,
            operation: Operation::Update,
            old: Some(cur),
            dry_run: opts.dry_run,
            options: admission_options("UpdateOptions", opts),
        };
        let scale = match admitted_as {
            Some("scale") => info.scale.as_ref(),
            _ => None,
        };
        let old_scale = scale.map(|paths| crate::scale::scale_of(paths, cur)).transpose()?;
        if let (Some(paths), Some(old_scale)) = (scale, &old_scale) {
            // A `/scale` write is admitted as the `Scale` it is (autoscaling/v1).
            let mut new_scale = crate::scale::scale_of(paths, &new)?;
            attrs.old = Some(old_scale);
            if self
                .admission
                .mutate(snapshot, &attrs, Some(&mut new_scale), &opts.warnings)
                .await?
            {
                let replicas = new_scale
                    .get("spec")
                    .and_then(|s| s.get("replicas"))
                    .cloned()
                    .unwrap_or(json!(0));
                crate::scale::set_at(&mut new, &paths.spec_replicas, replicas);
            }
        } else if self
            .admission
            .mutate(snapshot, &attrs, Some(&mut new), &opts.warnings)
            .await?
        {
            new = self.decode_admitted(path, crd, new)?;
        }
        if path.subresource.as_deref() == Some("status") {
            let status = new.get("status").cloned();
            // A status apply computed managedFields for the whole object: keep them.
            let applied_fields = opts
                .applied
                .then(|| new.get("metadata").and_then(|m| m.get("managedFields")).cloned())
                .flatten();
            new = cur.clone();
            if let Some(m) = applied_fields {
                object::set_meta(&mut new, "managedFields", m);
            }
            match status {
                Some(s) => new["status"] = s,
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        } else if info.status_subresource {
            match cur.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "resourceVersion",
        ] {
            match cur.get("metadata").and_then(|m| m.get(f)) {
                Some(v) => object::set_meta(&mut new, f, v.clone()),
                None => object::remove_meta(&mut new, f),
            }
        }
        crate::defaults::apply(&info.group, &info.kind, &mut new);
        // The client cannot set generation; the server keeps it, bumped by the kind's rule
        // (never by a /status write).
        let rule = generation_rule(info);
        match cur
            .get("metadata")
            .and_then(|m| m.get("generation"))
            .and_then(Value::as_i64)
        {
            Some(g) => {
                let bump = path.subresource.is_none() && generation_changes(rule, cur, &new);
                object::set_meta(
                    &mut new,
                    "generation",
                    json!(if bump { g.saturating_add(1) } else { g }),
                );
            }
            None => object::remove_meta(&mut new, "generation"),
        }
        validate(info, crd, &new, Some(cur))?;
        no_new_finalizers_while_deleting(info, cur, &new)?;
        match (scale, &old_scale) {
            (Some(paths), Some(_)) => {
                let new_scale = crate::scale::scale_of(paths, &new)?;
                self.admission
                    .validate(snapshot, &attrs, Some(&new_scale), &opts.warnings)
                    .await?;
            }
            _ => {
                self.admission
                    .validate(snapshot, &attrs, Some(&new), &opts.warnings)
                    .await?
            }
        }
        if !opts.applied {
            let writer = writer(info, opts, path.subresource.as_deref());
            field_manager::record_update(Some(cur), &mut new, &writer, fm_schema(info, crd));
        }
        limits::check_object(info, &new)?;
        Ok(new)
    }

    /// Commits an update prepared from `cur` (and the CRD `crd`), under the lock: `None` if
    /// another writer changed either since (the caller starts again), else the status and the
    /// object written (the object as it was for a no-op write or a dry run; as it was last
    /// for an object whose last finalizer this write removed).
    fn commit_update(
        &self,
        path: &ResourcePath,
        cur: &Arc<Value>,
        crd: &Option<Arc<Value>>,
        new: Value,
        opts: &WriteOptions,
    ) -> Result<Option<(u16, Arc<Value>)>, ApiError> {
        let info = &path.info;
        let mut inner = self.storage.lock();
        let name = object::name(cur);
        let Some(now) = inner.get(&info.key(), object::namespace(cur), name) else {
            return Err(ApiError::not_found(&info.qualified(), name));
        };
        if !Arc::ptr_eq(&now, cur) || !same(&self.crd_of(&inner, info), crd) {
            return Ok(None);
        }
        if new == **cur || opts.dry_run {
            return Ok(Some((200, Arc::new(new))));
        }
        if object::is_terminating(&new) && object::finalizers(&new).is_empty() {
            let ns = object::namespace(&new).to_owned();
            let gone = inner.remove(&info.key(), &ns, name).unwrap_or_else(|| Arc::new(new));
            crate::crd::on_write(&self.registry, &mut inner, info, &gone, true);
            self.gc.notify_one();
            return Ok(Some((200, gone)));
        }
        let stored = inner.put(&info.key(), new);
        crate::crd::on_write(&self.registry, &mut inner, info, &stored, false);
        if object::is_terminating(&stored) {
            self.gc.notify_one();
        }
        Ok(Some((200, stored)))
    }

    /// Converts an object computed in the version of the request (`info.version`) to the
    /// version it is stored in, just before it is committed. Every write passes here
    /// (`conversion.rs`; built-in kinds have one version).
    async fn to_storage(&self, info: &ResourceInfo, crd: Option<&Value>, obj: Value) -> Result<Value, ApiError> {
        match crd {
            Some(crd) => crate::conversion::to_storage_version(crd, self.admission.client(), obj).await,
            None => match crate::conversion::builtin_storage_form(info, self.admission.client()) {
                // Events: stored as core `v1` Events (`events.rs`).
                Some((to_storage, _)) => to_storage.convert(obj, "v1").await,
                None => Ok(obj),
            },
        }
    }

    /// Converts a stored object to the version of the request (`info.version`): what a read
    /// returns, what an update or delete starts from, and what a write answers.
    pub(crate) async fn to_request_version(
        &self,
        info: &ResourceInfo,
        crd: Option<&Value>,
        obj: Arc<Value>,
    ) -> Result<Arc<Value>, ApiError> {
        match crd {
            Some(crd) => crate::conversion::to_request_version(crd, self.admission.client(), info, obj).await,
            None => match crate::conversion::builtin_storage_form(info, self.admission.client()) {
                Some((_, to_request)) => to_request
                    .convert(Arc::unwrap_or_clone(obj), &info.version)
                    .await
                    .map(Arc::new),
                None => Ok(obj),
            },
        }
    }

    /// DELETE one object.
    pub(crate) async fn delete(
        &self,
        path: &ResourcePath,
        options: &Value,
        q: &Query,
        opts: &WriteOptions,
    ) -> WriteResult {
        let name = name_of(path)?.to_owned();
        if path.subresource.is_some() {
            return Err(ApiError::method_not_allowed());
        }
        self.delete_one(&path.info, ns_of(path), &name, options, q, opts).await
    }

    /// Deletes one object: preconditions and admission (mutating then validating webhooks,
    /// with the object as `oldObject`) off the lock, then the delete under it if the object is
    /// still the one admitted, else again.
    async fn delete_one(
        &self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        options: &Value,
        q: &Query,
        opts: &WriteOptions,
    ) -> WriteResult {
        loop {
            let (cur, crd, snapshot) = {
                let inner = self.storage.lock();
                let Some(cur) = inner.get(&info.key(), ns, name) else {
                    return Err(ApiError::not_found(&info.qualified(), name));
                };
                (
                    cur,
                    self.crd_of(&inner, info),
                    self.admission.snapshot(&inner, info, ns),
                )
            };
            check_preconditions(info, name, &cur, options)?;
            let old = self.to_request_version(info, crd.as_deref(), cur.clone()).await?;
            let mut delete_options = options.clone();
            if let Some(m) = delete_options.as_object_mut() {
                m.insert("kind".into(), json!("DeleteOptions"));
                m.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
                if opts.dry_run {
                    m.insert("dryRun".into(), json!(["All"]));
                }
            }
            let attrs = Attributes {
                info,
                subresource: None,
                namespace: admission_namespace(info, ns, name),
                name,
                operation: Operation::Delete,
                old: Some(&old),
                dry_run: opts.dry_run,
                options: delete_options,
            };
            self.admission.mutate(&snapshot, &attrs, None, &opts.warnings).await?;
            self.admission.validate(&snapshot, &attrs, None, &opts.warnings).await?;
            let (code, out) = {
                let mut inner = self.storage.lock();
                if !same(&inner.get(&info.key(), ns, name), &Some(cur)) {
                    continue;
                }
                self.delete_locked(&mut inner, info, ns, name, options, q, opts.dry_run)?
            };
            if out.get("kind").and_then(Value::as_str) == Some("Status") {
                return Ok((code, out));
            }
            let out = self.to_request_version(info, crd.as_deref(), Arc::new(out)).await?;
            return Ok((code, Arc::unwrap_or_clone(out)));
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn delete_locked(
        &self,
        inner: &mut Inner,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        options: &Value,
        q: &Query,
        dry_run: bool,
    ) -> WriteResult {
        let Some(cur) = inner.get(&info.key(), ns, name) else {
            return Err(ApiError::not_found(&info.qualified(), name));
        };
        check_preconditions(info, name, &cur, options)?;
        if dry_run {
            return Ok((200, (*cur).clone()));
        }
        let policy = options
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .or(q.get("propagationPolicy"))
            .unwrap_or("Background");
        if policy == "Orphan" {
            crate::gc::orphan_dependents(inner, object::uid(&cur));
        }
        let is_namespace = info.key() == "/namespaces";
        if !object::finalizers(&cur).is_empty() || is_namespace {
            if object::is_terminating(&cur) {
                return Ok((200, (*cur).clone()));
            }
            let mut next = (*cur).clone();
            object::set_meta(&mut next, "deletionTimestamp", Value::String(object::now_timestamp()));
            object::set_meta(&mut next, "deletionGracePeriodSeconds", json!(0));
            // kube-apiserver's BeforeDelete: marking for deletion is a change of desired state.
            if let Some(g) = next
                .get("metadata")
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .filter(|g| *g > 0)
            {
                object::set_meta(&mut next, "generation", json!(g.saturating_add(1)));
            }
            if is_namespace {
                next["status"] = json!({"phase": "Terminating"});
            }
            let stored = inner.put(&info.key(), next);
            self.gc.notify_one();
            return Ok((200, (*stored).clone()));
        }
        let uid = object::uid(&cur).to_owned();
        inner.remove(&info.key(), ns, name);
        crate::crd::on_write(&self.registry, inner, info, &cur, true);
        self.gc.notify_one();
        Ok((200, status::success(&info.plural, name, &uid)))
    }

    /// DELETECOLLECTION: deletes every object the selectors match, each as a delete of its
    /// own (admission included), as kube-apiserver's registry does; returns them as a list.
    /// The first failure other than an object already gone fails the request.
    pub(crate) async fn delete_collection(
        &self,
        path: &ResourcePath,
        options: &Value,
        q: &Query,
        opts: &WriteOptions,
    ) -> WriteResult {
        let filter = filter_from(path, q)?;
        let info = path.info.clone();
        let (matched, crd): (Vec<(ObjectKey, Arc<Value>)>, _) = {
            let inner = self.storage.lock();
            let matched = inner
                .objects(&info.key())
                .map(|objs| {
                    objs.iter()
                        .filter(|(_, o)| filter.matches(o))
                        .map(|(k, o)| (k.clone(), o.clone()))
                        .collect()
                })
                .unwrap_or_default();
            (matched, self.crd_of(&inner, &info))
        };
        let mut items = Vec::new();
        for ((ns, name), before) in matched {
            match self.delete_one(&info, &ns, &name, options, q, opts).await {
                Ok(_) => {
                    let before = self.to_request_version(&info, crd.as_deref(), before).await?;
                    items.push(Arc::unwrap_or_clone(before));
                }
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let rv = self.storage.lock().current_rv();
        Ok((
            200,
            json!({
                "kind": format!("{}List", info.kind),
                "apiVersion": info.api_version(),
                "metadata": {"resourceVersion": rv.to_string()},
                "items": items,
            }),
        ))
    }
}

/// Whether two reads are the same stored object (or both absent).
fn same(a: &Option<Arc<Value>>, b: &Option<Arc<Value>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// A delete's `preconditions` (uid, resourceVersion) against the stored object: `409` when
/// one does not hold.
fn check_preconditions(info: &ResourceInfo, name: &str, cur: &Value, options: &Value) -> Result<(), ApiError> {
    let pre = options.get("preconditions");
    if let Some(uid) = pre.and_then(|p| p.get("uid")).and_then(Value::as_str)
        && uid != object::uid(cur)
    {
        return Err(ApiError::conflict(
            &info.qualified(),
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                object::uid(cur)
            ),
        ));
    }
    if let Some(rv) = pre.and_then(|p| p.get("resourceVersion")).and_then(Value::as_str)
        && rv != object::resource_version(cur)
    {
        return Err(ApiError::conflict(
            &info.qualified(),
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                object::resource_version(cur)
            ),
        ));
    }
    Ok(())
}

/// `AdmissionRequest.options` of a create or an update (patches and applies are admitted
/// with `UpdateOptions`, or `CreateOptions` when an apply creates, as kube-apiserver does).
fn admission_options(kind: &str, opts: &WriteOptions) -> Value {
    let mut o = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if opts.dry_run {
        o["dryRun"] = json!(["All"]);
    }
    if let Some(m) = &opts.field_manager {
        o["fieldManager"] = json!(m);
    }
    o
}

impl Rest {
    /// Server-side apply (`application/apply-patch+yaml`): the configuration is merged with
    /// field ownership (`field_manager.rs`); creates the object if it does not exist.
    async fn server_side_apply(
        &self,
        path: &ResourcePath,
        name: &str,
        body: &[u8],
        opts: &WriteOptions,
    ) -> WriteResult {
        let info = &path.info;
        if opts.field_manager.is_none() {
            return Err(ApiError::bad_request(
                "PATCH requests of type apply must specify fieldManager",
            ));
        }
        let mut config: Value =
            serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
        if !config.is_object() {
            return Err(ApiError::bad_request("an apply configuration must be an object"));
        }
        // kube-apiserver's field manager: ownership is the server's to record.
        if config
            .get("metadata")
            .and_then(|m| m.get("managedFields"))
            .is_some_and(|f| !f.is_null())
        {
            return Err(ApiError::bad_request("metadata.managedFields must be nil"));
        }
        self.check_body(path, &mut config)?;
        object::set_meta(&mut config, "name", Value::String(name.to_owned()));
        let subresource = path.subresource.as_deref();
        // The status subresource splits ownership: a main-resource apply cannot set status, a
        // status apply sets nothing else.
        if let Some(map) = config.as_object_mut() {
            match subresource {
                Some("status") => {
                    map.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"))
                }
                _ if info.status_subresource => {
                    map.remove("status");
                }
                _ => {}
            }
        }
        limits::check_object(info, &config)?;
        let writer = writer(info, opts, subresource);
        let opts = WriteOptions {
            applied: true,
            ..opts.clone()
        };
        // As a patch (see `guaranteed_update`): merge off the lock, write if nothing changed
        // meanwhile, else merge again onto what another writer stored.
        loop {
            let (cur, crd, snapshot) = {
                let inner = self.storage.lock();
                (
                    inner.get(&info.key(), ns_of(path), name),
                    self.crd_of(&inner, info),
                    self.admission.snapshot(&inner, info, ns_of(path)),
                )
            };
            let old = match &cur {
                Some(c) => Some(self.to_request_version(info, crd.as_deref(), c.clone()).await?),
                None => None,
            };
            #[cfg(test)]
            tests::computing();
            let next = field_manager::apply(
                old.as_deref(),
                &config,
                &writer,
                opts.force,
                fm_schema(info, crd.as_deref()),
                &info.qualified(),
                name,
            )?;
            match (cur, old) {
                (Some(cur), Some(old)) => {
                    let new = self
                        .prepare_update(path, None, &old, crd.as_deref(), &snapshot, next, &opts)
                        .await?;
                    let new = self.to_storage(info, crd.as_deref(), new).await?;
                    if let Some((code, out)) = self.commit_update(path, &cur, &crd, new, &opts)? {
                        let out = self.to_request_version(info, crd.as_deref(), out).await?;
                        return Ok((code, Arc::unwrap_or_clone(out)));
                    }
                }
                _ if subresource.is_none() => {
                    let create_path = ResourcePath {
                        name: None,
                        ..path.clone()
                    };
                    match Box::pin(self.create(&create_path, next, &opts)).await {
                        // Another apply created it since the read: apply onto that one.
                        Err(e) if e.reason == "AlreadyExists" => continue,
                        other => return other,
                    }
                }
                _ => return Err(ApiError::not_found(&info.qualified(), name)),
            }
        }
    }

    /// The CustomResourceDefinition that serves `info`, if it is a custom resource.
    fn crd_of(&self, inner: &Inner, info: &ResourceInfo) -> Option<Arc<Value>> {
        if typed::is_built_in(info) {
            return None;
        }
        inner.get(crate::crd::CRD_KEY, "", &format!("{}.{}", info.plural, info.group))
    }
}

/// Who a write is recorded as.
fn writer<'a>(
    info: &'a ResourceInfo,
    opts: &'a WriteOptions,
    subresource: Option<&'a str>,
) -> field_manager::Writer<'a> {
    field_manager::Writer {
        manager: &opts.manager,
        api_version: info.api_version(),
        subresource: subresource.unwrap_or(""),
    }
}

/// Where field ownership finds list types: a custom resource's schema, or the built-in table.
fn fm_schema<'a>(info: &ResourceInfo, crd: Option<&'a Value>) -> field_manager::Schema<'a> {
    match crd {
        Some(c) if !typed::is_built_in(info) => {
            field_manager::Schema::CustomRoot(crate::schema::of_version(c, &info.version).unwrap_or(&Value::Null))
        }
        _ => field_manager::Schema::BuiltIn,
    }
}

/// Decodes a request body as kube-apiserver does before anything else: built-in kinds into
/// their type, custom resources' metadata as ObjectMeta and their body pruned and defaulted by
/// the CRD's schema; `Strict` refuses unknown fields (`400`).
fn decode(
    info: &ResourceInfo,
    crd: Option<&Value>,
    body: &Value,
    validation: FieldValidation,
) -> Result<Value, ApiError> {
    let mut obj = typed::decode(info, body, validation)?;
    if let Some(schema) = crd.and_then(|c| crate::schema::of_version(c, &info.version)) {
        let dropped = crate::schema::prune(schema, &mut obj);
        if validation == FieldValidation::Strict {
            typed::refuse_unknown(info, &dropped)?;
        }
        crate::schema::default(schema, &mut obj);
    }
    Ok(obj)
}

/// Validates an object about to be stored: its metadata, a custom resource against its
/// schema (with `old`, the stored object on update, for CEL transition rules), a CRD's own
/// rules. All failures in one `422 Invalid`.
fn validate(info: &ResourceInfo, crd: Option<&Value>, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let built_in = typed::is_built_in(info);
    let mut errs = crate::validation::object_meta(info, obj, built_in);
    errs.extend(crate::admission::validate_configuration(info, obj));
    if let Some(schema) = crd.and_then(|c| crate::schema::of_version(c, &info.version)) {
        errs.extend(crate::schema::validate(schema, obj, old));
    }
    if !errs.is_empty() {
        return Err(field::invalid(&info.group, &info.kind, object::name(obj), &errs));
    }
    crate::crd::validate(info, obj)
}

/// kube-apiserver's `ValidateObjectMetaUpdate`: an object being deleted gains no finalizer
/// (only its remaining ones may be removed), so its deletion can only move forward.
fn no_new_finalizers_while_deleting(info: &ResourceInfo, cur: &Value, new: &Value) -> Result<(), ApiError> {
    let meta_of = |o: &Value| o.get("metadata").cloned().unwrap_or(Value::Null);
    let (cur_meta, new_meta) = (meta_of(cur), meta_of(new));
    if cur_meta.get("deletionTimestamp").is_none_or(Value::is_null) {
        return Ok(());
    }
    let finalizers = |m: &Value| -> Vec<String> {
        m.get("finalizers")
            .and_then(Value::as_array)
            .map(|l| l.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let old = finalizers(&cur_meta);
    let mut added: Vec<String> = finalizers(&new_meta).into_iter().filter(|f| !old.contains(f)).collect();
    if added.is_empty() {
        return Ok(());
    }
    added.sort();
    added.dedup();
    let list: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
    let err = field::FieldError::forbidden(
        "metadata.finalizers",
        format!(
            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
            list.join(", ")
        ),
    );
    Err(field::invalid(&info.group, &info.kind, object::name(new), &[err]))
}

fn check_subresource(path: &ResourcePath) -> Result<(), ApiError> {
    match path.subresource.as_deref() {
        None => Ok(()),
        Some("status") if path.info.status_subresource => Ok(()),
        Some("scale") if path.info.scale.is_some() => Ok(()),
        Some(_) => Err(ApiError::no_route()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch_cache::{WatchCache, WatchCacheConfig};
    use futures::executor::block_on;
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    thread_local! {
        /// What [`computing`] runs on this thread, if a test set it (see [`with_hook`]).
        static COMPUTING: RefCell<Option<Box<dyn FnMut()>>> = const { RefCell::new(None) };
    }

    /// Called by `patch` and `server_side_apply` (in tests only) just before they compute the
    /// new object. The hook is taken out while it runs, so a write it makes through `Rest`
    /// computes without it.
    pub(super) fn computing() {
        if let Some(mut hook) = COMPUTING.with_borrow_mut(Option::take) {
            hook();
            COMPUTING.with_borrow_mut(|h| *h = Some(hook));
        }
    }

    /// Runs `f` with `hook` called wherever a patch or an apply is computed.
    fn with_hook<R>(hook: impl FnMut() + 'static, f: impl FnOnce() -> R) -> R {
        COMPUTING.with_borrow_mut(|h| *h = Some(Box::new(hook)));
        let out = f();
        COMPUTING.with_borrow_mut(|h| *h = None);
        out
    }

    /// A hook that records, each time a patch is computed, whether the store's lock was free,
    /// and the first time (lock free) lets another writer win: it labels `w: won` the ConfigMap
    /// `cm`, creating it if absent. The patch computed then is stale and must be computed again
    /// onto that write. With the lock held the hook writes nothing: it would deadlock.
    fn record_and_win(rest: &Rest) -> (Rc<RefCell<Vec<bool>>>, impl FnMut() + 'static) {
        let lock_free = Rc::new(RefCell::new(Vec::new()));
        let hook = {
            let (rest, lock_free) = (rest.clone(), lock_free.clone());
            move || {
                let free = !rest.storage.is_locked();
                lock_free.borrow_mut().push(free);
                if free && lock_free.borrow().len() == 1 {
                    let label = json!({"metadata": {"labels": {"w": "won"}}});
                    match block_on(rest.get(&configmap("cm"))) {
                        Ok(_) => block_on(rest.patch(
                            &configmap("cm"),
                            PatchKind::Merge,
                            label.to_string().as_bytes(),
                            &by("winner"),
                        ))
                        .unwrap(),
                        Err(_) => {
                            let mut cm = json!({"metadata": {"name": "cm"}});
                            cm["metadata"]["labels"] = label["metadata"]["labels"].clone();
                            block_on(rest.create(&configmap(""), cm, &by("winner"))).unwrap()
                        }
                    };
                }
            }
        };
        (lock_free, hook)
    }

    /// Runs a test's top-level write on a runtime of its own: futures' `block_on` inside it
    /// (the hooks' writes) is then not nested in another futures executor.
    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// A store with the namespace `default` and its verbs.
    fn rest() -> Rest {
        let cache = WatchCache::new(
            WatchCacheConfig {
                capacity: 100,
                watcher_buffer: 100,
                grace: Duration::from_secs(1),
            },
            0,
        );
        let rest = Rest {
            storage: Arc::new(Storage::new(cache)),
            registry: Registry::new(),
            gc: Arc::new(tokio::sync::Notify::new()),
            admission: Admission::default(),
        };
        let namespaces = ResourcePath {
            info: rest.registry.get("", "v1", "namespaces").unwrap(),
            namespace: None,
            name: None,
            subresource: None,
        };
        block_on(rest.create(&namespaces, json!({"metadata": {"name": "default"}}), &by("test"))).unwrap();
        rest
    }

    /// The path of the ConfigMap `name` in `default` (of the collection if `name` is empty).
    fn configmap(name: &str) -> ResourcePath {
        ResourcePath {
            info: Registry::new().get("", "v1", "configmaps").unwrap(),
            namespace: Some("default".into()),
            name: (!name.is_empty()).then(|| name.into()),
            subresource: None,
        }
    }

    fn by(manager: &str) -> WriteOptions {
        WriteOptions {
            manager: manager.into(),
            field_manager: Some(manager.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_patch_is_computed_off_the_lock_and_again_onto_a_write_that_won() {
        let patches = [
            (
                PatchKind::Json,
                json!([{"op": "add", "path": "/data/p", "value": "patched"}]),
            ),
            (PatchKind::Merge, json!({"data": {"p": "patched"}})),
            (PatchKind::Strategic, json!({"data": {"p": "patched"}})),
        ];
        for (kind, body) in patches {
            let rest = rest();
            block_on(rest.create(
                &configmap(""),
                json!({"metadata": {"name": "cm"}, "data": {"k": "v"}}),
                &by("test"),
            ))
            .unwrap();
            let (lock_free, hook) = record_and_win(&rest);
            let (code, obj) = with_hook(hook, || {
                run(rest.patch(&configmap("cm"), kind, body.to_string().as_bytes(), &by("patcher")))
            })
            .unwrap();
            assert_eq!(
                *lock_free.borrow(),
                [true, true],
                "{kind:?}: computed twice (again after the other write), with the lock free each time"
            );
            assert_eq!(code, 200, "{kind:?}: {obj}");
            assert_eq!(obj["data"], json!({"k": "v", "p": "patched"}), "{kind:?}");
            assert_eq!(
                obj["metadata"]["labels"]["w"], "won",
                "{kind:?}: applied onto the winner's write"
            );
            assert_eq!(
                *block_on(rest.get(&configmap("cm"))).unwrap(),
                obj,
                "{kind:?}: what was stored"
            );
        }
    }

    #[test]
    fn an_apply_is_computed_off_the_lock_and_again_onto_a_write_that_won() {
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"},
            "data": {"p": "applied"}});
        // Onto an object updated meanwhile, and onto one created meanwhile (the apply was
        // computed as a create).
        for exists in [true, false] {
            let rest = rest();
            if exists {
                block_on(rest.create(
                    &configmap(""),
                    json!({"metadata": {"name": "cm"}, "data": {"k": "v"}}),
                    &by("test"),
                ))
                .unwrap();
            }
            let (lock_free, hook) = record_and_win(&rest);
            let (code, obj) = with_hook(hook, || {
                run(rest.patch(
                    &configmap("cm"),
                    PatchKind::Apply,
                    config.to_string().as_bytes(),
                    &by("applier"),
                ))
            })
            .unwrap();
            assert_eq!(
                *lock_free.borrow(),
                [true, true],
                "exists: {exists}: computed twice (again after the other write), with the lock free each time"
            );
            assert_eq!(code, 200, "exists: {exists}: {obj}");
            assert_eq!(obj["data"]["p"], "applied", "exists: {exists}");
            assert_eq!(
                obj["metadata"]["labels"]["w"], "won",
                "exists: {exists}: applied onto the winner's write"
            );
            let managers: Vec<&str> = obj["metadata"]["managedFields"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["manager"].as_str())
                .collect();
            assert!(
                managers.contains(&"winner") && managers.contains(&"applier"),
                "{managers:?}"
            );
            assert_eq!(
                *block_on(rest.get(&configmap("cm"))).unwrap(),
                obj,
                "exists: {exists}: what was stored"
            );
        }
    }

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let t = encode_continue(7, &("ns".into(), "a b".into()));
        assert_eq!(decode_continue(&t).unwrap(), (7, ("ns".into(), "a b".into())));
        for bad in ["", "zz", "abc", "5b5d"] {
            assert_eq!(decode_continue(bad).unwrap_err().code, 400, "{bad}");
        }
    }
}
