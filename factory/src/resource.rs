//! [`InformerResource`]: what the factory asks of a type beyond `kube::Resource`, emitted per
//! type by the code generator; and [`Compact`], the walk it is built from.
//!
//! Where it sits in the data path: the factory hands `K::compact` to `K`'s list/watch
//! (`ApiListerWatcher::compact`), which runs it on every object right after decoding, on the
//! decoding thread, before the reflector or any cache sees it. serde leaves spare capacity in
//! every `Vec` it decodes (it grows them by doubling); a cache keeps objects for their
//! lifetime, so each list is shrunk to its length once. kube-runtime's store gets the same
//! effect by cloning every object, a second allocation of all of it.
//!
//! Who implements it:
//! - every k8s-openapi type, by `cargo xtask codegen` from k8s-openapi's source (the walk of
//!   each type; `generated/compact.rs`), for every Kubernetes version k8s-openapi supports;
//! - every type generated from a CRD (`informer_codegen::crd`): the walk of every struct;
//! - `#[derive(Informer)]`: the object's metadata (the derive sees only the spec's or the
//!   type's own declaration, not the types of its fields);
//! - `PartialObjectMeta<K>` (metadata-only informers), here.
//!
//! A type used with the factory without any of these says `impl InformerResource for Foo {}`:
//! the default compacts nothing, and informer-core's list/watch still shrinks its metadata.
//!
//! Measured (`bench/examples/bench-kinds.rs`, heap per cached object against kube-runtime's
//! store, 10k objects, medians of 3): Pod 1.00×, ConfigMap 0.96×, Deployment, Service, Node,
//! Secret and a generated CRD 0.99×. Strings need nothing (serde_json allocates each at its
//! length); maps are trees of fixed-size nodes, but one emptied after decoding keeps its root
//! node, which the walk gives back.

use std::collections::BTreeMap;

use k8s_openapi::serde_json::Value;
use kube::core::PartialObjectMeta;

/// Gives back the spare capacity of a freshly decoded value: every `Vec` in it shrunk to its
/// length, at every depth. The code generator emits it per type (see the module doc).
pub trait Compact {
    /// Shrinks every list in `self` to its length; the value is otherwise unchanged.
    fn compact(&mut self);
}

/// The per-type hooks of a resource type the factory makes informers for, emitted by the code
/// generator for every k8s-openapi resource, every CRD type it generates and every
/// `#[derive(Informer)]` type (see the module doc).
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no `InformerResource` impl, which the factory needs of a resource type",
    note = "derive `Informer` on it (or on its CustomResource spec), or write an empty `impl InformerResource for {Self}` for the defaults"
)]
pub trait InformerResource {
    /// Run on every object right after it is decoded, before any cache sees it: gives back
    /// the spare capacity decoding left (the generated impls call [`Compact::compact`]). The
    /// default does nothing beyond what every list/watch does (its metadata's lists).
    #[inline]
    fn compact(&mut self) {}

    /// For a projection (a partial, read-only type bound to another type's resource by
    /// `#[derive(Informer)]`'s `projection`): the projection's own name, which names its
    /// informer apart from the full type's. `None` for every other type.
    #[inline]
    fn projection() -> Option<&'static str>
    where
        Self: Sized,
    {
        None
    }
}

impl<T: Compact> Compact for Vec<T> {
    #[inline]
    fn compact(&mut self) {
        self.shrink_to_fit();
        self.iter_mut().for_each(Compact::compact);
    }
}

impl<T: Compact> Compact for Option<T> {
    #[inline]
    fn compact(&mut self) {
        if let Some(value) = self {
            value.compact();
        }
    }
}

impl<T: Compact + ?Sized> Compact for Box<T> {
    #[inline]
    fn compact(&mut self) {
        (**self).compact();
    }
}

impl<K, V: Compact> Compact for BTreeMap<K, V> {
    #[inline]
    fn compact(&mut self) {
        // A map emptied after decoding (a generated CRD root's map of unknown fields loses
        // `apiVersion` and `kind`) keeps its root node, ~600 bytes for `Value`s; a new one
        // allocates nothing.
        if self.is_empty() {
            *self = BTreeMap::new();
        }
        self.values_mut().for_each(Compact::compact);
    }
}

/// Nothing to give back: serde_json allocates a string at its length.
macro_rules! leaves {
    ($($ty:ty),*) => {
        $(impl Compact for $ty {
            #[inline]
            fn compact(&mut self) {}
        })*
    };
}

leaves!(String, bool, i32, i64, u8, f64);

impl Compact for Value {
    fn compact(&mut self) {
        match self {
            Value::Array(items) => items.compact(),
            Value::Object(fields) => fields.values_mut().for_each(Compact::compact),
            _ => {}
        }
    }
}

impl Compact for k8s_openapi::ByteString {
    #[inline]
    fn compact(&mut self) {
        self.0.shrink_to_fit();
    }
}

impl<K> InformerResource for PartialObjectMeta<K> {
    #[inline]
    fn compact(&mut self) {
        self.metadata.compact();
    }
}
