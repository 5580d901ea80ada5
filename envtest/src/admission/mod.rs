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

use crate::resources::ResourceInfo;
use crate::status::ApiError;
use crate::storage::Inner;
use serde_json::Value;
use std::sync::{Arc, Mutex};

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

/// The admission chain's settings and state; shared by every write.
#[derive(Debug, Clone, Default)]
pub(crate) struct Admission {}

/// The webhook configurations and the namespace of one attempt at a write, read under the
/// store lock together with the object.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {}

impl Admission {
    /// Reads, under the store lock, what admission of a write to `info` in `namespace` needs.
    pub(crate) fn snapshot(&self, _inner: &Inner, _info: &ResourceInfo, _namespace: &str) -> Snapshot {
        Snapshot {}
    }

    /// Calls the matching mutating webhooks on `obj` (none for a delete). Returns whether the
    /// object was changed (then the caller decodes it again, as kube-apiserver does after a
    /// patch).
    pub(crate) async fn mutate(
        &self,
        _snapshot: &Snapshot,
        _attrs: &Attributes<'_>,
        _obj: Option<&mut Value>,
        _warnings: &Warnings,
    ) -> Result<bool, ApiError> {
        Ok(false)
    }

    /// Calls the matching validating webhooks on `obj` (none for a delete).
    pub(crate) async fn validate(
        &self,
        _snapshot: &Snapshot,
        _attrs: &Attributes<'_>,
        _obj: Option<&Value>,
        _warnings: &Warnings,
    ) -> Result<(), ApiError> {
        Ok(())
    }
}
