//! Objects the server has that do not decode as `K`: how the cache keeps them known.
//!
//! Where it sits in the data path: [`ApiListerWatcher`](crate::ApiListerWatcher) reports an
//! object that fails to decode as a [`MalformedObject`](crate::MalformedObject) with its key
//! (read from its metadata alone); the reflector hands it to the store as an [`Undecodable`]
//! mark ([`Store::mark_undecodable`](crate::Store::mark_undecodable), or with a relist,
//! [`Store::replace_with_undecodable`](crate::Store::replace_with_undecodable)); the queues pass
//! marks on in order with the other changes ([`UndecodableChange`]); the informer keeps them in
//! its [`Indexer`](crate::Indexer) beside the decoded objects, and listers answer
//! [`Lookup::Undecodable`] for them.
//!
//! Why: an object that fails to decode (a field of a type the Rust type does not expect, an
//! enum value added on the server later) must never look deleted. Dropping it would make a
//! relist emit a delete for it and listers answer "not found", and a controller would clean up
//! after an object that still exists. So:
//!
//! - a watch ADDED/MODIFIED that does not decode marks the key; a decoded version already
//!   cached stays, and handlers hear nothing;
//! - a later decodable version clears the mark and reaches handlers as an add (never decoded
//!   before) or an update (from the last decoded version);
//! - a watch DELETED that does not decode deletes the key as usual (the cached version, if any,
//!   reaches handlers as a [`DeletedFinalStateUnknown`](crate::DeletedFinalStateUnknown)
//!   tombstone: its final state is unknown) and drops the mark;
//! - a relist counts marked keys as present: no delete for them, their decoded version stays,
//!   marks of keys missing from the list are dropped.
//!
//! An object whose metadata does not decode has no key: it cannot be marked, and is logged and
//! counted ([`ReflectorMetrics::malformed_objects`](crate::ReflectorMetrics)) as before.
//!
//! ```
//! use std::sync::Arc;
//! use informer_core::{Indexer, Lister, Lookup, Store, Undecodable};
//! use k8s_openapi::api::core::v1::ConfigMap;
//!
//! let cache: Indexer<ConfigMap> = Indexer::default();
//! let error = "invalid type: string \"big\", expected i32 at line 1 column 40";
//! cache.mark_undecodable("prod/web".into(), Undecodable::new("42", error)).unwrap();
//! let lister = Lister::new(cache);
//! match lister.namespaced("prod").lookup("web") {
//!     Lookup::Undecodable { undecodable, last_decoded, .. } => {
//!         assert_eq!(undecodable.reason, "invalid type");
//!         assert!(last_decoded.is_none()); // never decoded
//!     }
//!     other => panic!("expected undecodable, got {other:?}"),
//! }
//! assert!(matches!(lister.namespaced("prod").lookup("db"), Lookup::Absent));
//! ```

use std::sync::Arc;

/// Why the object under a key does not decode, as of one resourceVersion.
///
/// Made with [`Undecodable::new`], which classifies the error into a [`reason`](Self::reason).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Undecodable {
    /// The resourceVersion of the version that does not decode (empty if its metadata did
    /// not say).
    pub resource_version: String,
    /// A short, low-cardinality class of the error, for metrics: `unknown variant`,
    /// `invalid type`, `invalid value`, `missing field`, `unknown field`, `duplicate field`,
    /// `invalid length`, or `other`.
    pub reason: &'static str,
    /// The decoder's whole message, for logs.
    pub error: String,
}

impl Undecodable {
    /// The version at `resource_version` failed to decode with `error` (serde's message).
    pub fn new(resource_version: impl Into<String>, error: impl Into<String>) -> Self {
        let error = error.into();
        Undecodable {
            resource_version: resource_version.into(),
            reason: reason_of(&error),
            error,
        }
    }
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at resourceVersion {:?}: {}",
            self.reason, self.resource_version, self.error
        )
    }
}

/// The classes serde's messages start with (serde `de::Error`'s provided constructors).
const REASONS: &[&str] = &[
    "unknown variant",
    "invalid type",
    "invalid value",
    "missing field",
    "unknown field",
    "duplicate field",
    "invalid length",
];

/// The class of a decode error message: one of [`REASONS`], or `other`.
fn reason_of(error: &str) -> &'static str {
    REASONS
        .iter()
        .find(|reason| error.starts_with(**reason))
        .copied()
        .unwrap_or("other")
}

/// What a lookup by key finds in the cache: a decoded object, an object the server has that
/// does not decode, or nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum Lookup<K> {
    /// The object, decoded.
    Found(Arc<K>),
    /// The server has an object under this key that does not decode: it is not deleted.
    #[non_exhaustive]
    Undecodable {
        /// Why, and as of which resourceVersion.
        undecodable: Undecodable,
        /// The last version that did decode, if one ever did. Older than the server's.
        last_decoded: Option<Arc<K>>,
    },
    /// Nothing under this key: not found (or deleted).
    Absent,
}

impl<K> Clone for Lookup<K> {
    fn clone(&self) -> Self {
        match self {
            Lookup::Found(obj) => Lookup::Found(obj.clone()),
            Lookup::Undecodable {
                undecodable,
                last_decoded,
            } => Lookup::Undecodable {
                undecodable: undecodable.clone(),
                last_decoded: last_decoded.clone(),
            },
            Lookup::Absent => Lookup::Absent,
        }
    }
}

impl<K> Lookup<K> {
    /// The decoded object, if found and not marked undecodable.
    pub fn found(self) -> Option<Arc<K>> {
        match self {
            Lookup::Found(obj) => Some(obj),
            _ => None,
        }
    }

    /// Whether the server has an object under this key that does not decode.
    pub fn is_undecodable(&self) -> bool {
        matches!(self, Lookup::Undecodable { .. })
    }

    /// Whether nothing is known under this key.
    pub fn is_absent(&self) -> bool {
        matches!(self, Lookup::Absent)
    }
}

/// A change to the undecodable marks, as the queues carry it to the informer in order with
/// the other changes of its key ([`QueueItem::Undecodable`](crate::QueueItem::Undecodable)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UndecodableChange {
    /// The object under `key` does not decode: mark it. A cached decoded version stays and
    /// handlers hear nothing.
    #[non_exhaustive]
    Marked {
        /// The object's key.
        key: String,
        /// Why it does not decode.
        undecodable: Undecodable,
    },
    /// The object under `key`, which did not decode, is gone (a watch DELETED, or missing from
    /// a relist): drop the mark and delete any cached version (handlers get a tombstone).
    #[non_exhaustive]
    Deleted {
        /// The object's key.
        key: String,
        /// The resourceVersion of the delete (empty when a relist found the key gone).
        resource_version: String,
    },
}

impl UndecodableChange {
    /// The key the change is about.
    pub fn key(&self) -> &str {
        match self {
            UndecodableChange::Marked { key, .. } | UndecodableChange::Deleted { key, .. } => key,
        }
    }
}

/// The WARN line of a new mark: once per key and resourceVersion, wherever the mark is made.
pub(crate) fn warn_marked(informer: &str, kind: &str, key: &str, undecodable: &Undecodable) {
    tracing::warn!(
        informer,
        kind,
        key,
        resource_version = %undecodable.resource_version,
        reason = undecodable.reason,
        error = %undecodable.error,
        "object does not decode: kept in the cache as undecodable, not deleted",
    );
}

/// The short name of `K` for logs and errors: its type name without module paths
/// (`k8s_openapi::api::core::v1::ConfigMap` is `ConfigMap`).
pub fn type_name<K: ?Sized>() -> String {
    let full = std::any::type_name::<K>();
    let mut short = String::with_capacity(full.len());
    let mut segment_start = 0;
    for (i, c) in full.char_indices() {
        if matches!(c, '<' | '>' | ',' | ' ' | '(' | ')' | '[' | ']' | '&' | ';') {
            short.push_str(last_segment(&full[segment_start..i]));
            short.push(c);
            segment_start = i + c.len_utf8();
        }
    }
    short.push_str(last_segment(&full[segment_start..]));
    short
}

fn last_segment(path: &str) -> &str {
    path.rsplit("::").next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_messages_are_classified_by_their_leading_words() {
        let cases = [
            ("unknown variant `Big`, expected `Small` or `Large`", "unknown variant"),
            (
                "invalid type: string \"big\", expected i32 at line 1 column 9",
                "invalid type",
            ),
            ("invalid value: integer `-1`, expected u32", "invalid value"),
            ("missing field `size` at line 1 column 2", "missing field"),
            ("unknown field `x`, expected `size`", "unknown field"),
            ("duplicate field `size`", "duplicate field"),
            ("invalid length 3, expected a tuple of size 2", "invalid length"),
            ("expected value at line 1 column 1", "other"),
        ];
        for (error, reason) in cases {
            assert_eq!(Undecodable::new("1", error).reason, reason, "{error}");
        }
    }

    #[test]
    fn type_names_lose_their_module_paths() {
        assert_eq!(type_name::<k8s_openapi::api::core::v1::ConfigMap>(), "ConfigMap");
        assert_eq!(
            type_name::<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>>(),
            "PartialObjectMeta<ConfigMap>"
        );
    }
}
