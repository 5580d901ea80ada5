//! Event filters (controller-runtime's `pkg/predicate`): which notifications may enqueue a key.
//!
//! A [`Predicate`] looks at object metadata only, so one filter applies to every source of a
//! controller (its primary type, owned types and watched types), as controller-runtime's
//! `WithEventFilter` does. The ready-made ones answer only for updates and let adds and deletes
//! through: a controller must see objects appear and disappear whatever changed.
//!
//! | predicate | an update passes when |
//! |---|---|
//! | [`GenerationChanged`] | `metadata.generation` differs (spec changes; status writes and resyncs do not pass) |
//! | [`LabelsChanged`] | the labels differ |
//! | [`AnnotationsChanged`] | the annotations differ |
//! | [`ResourceVersionChanged`] | the resourceVersion differs (drops periodic resyncs) |
//!
//! Several filters on one controller must all pass; [`any`] passes when one of its filters
//! does (`predicate.Or`).
//!
//! ```
//! use controller::predicate::{GenerationChanged, Predicate};
//! use kube::api::ObjectMeta;
//!
//! let old = ObjectMeta { generation: Some(1), ..ObjectMeta::default() };
//! let status_write = ObjectMeta { generation: Some(1), resource_version: Some("9".into()), ..old.clone() };
//! assert!(!GenerationChanged.update(&old, &status_write));
//! ```

use std::sync::Arc;

use kube::api::ObjectMeta;

/// Decides whether a notification about an object may enqueue work.
pub trait Predicate: Send + Sync + 'static {
    /// An object appeared (or was replayed by the initial list).
    fn create(&self, obj: &ObjectMeta) -> bool {
        let _ = obj;
        true
    }

    /// An object changed (or a resync re-delivered it: then both have the same resourceVersion).
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        let _ = (old, new);
        true
    }

    /// An object was deleted (`obj` is its last known state).
    fn delete(&self, obj: &ObjectMeta) -> bool {
        let _ = obj;
        true
    }
}

impl<P: Predicate + ?Sized> Predicate for Arc<P> {
    fn create(&self, obj: &ObjectMeta) -> bool {
        (**self).create(obj)
    }
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        (**self).update(old, new)
    }
    fn delete(&self, obj: &ObjectMeta) -> bool {
        (**self).delete(obj)
    }
}

/// Passes updates that changed `metadata.generation` (controller-runtime's
/// `GenerationChangedPredicate`). The API server bumps the generation on spec changes only,
/// so a controller writing its own status does not wake itself up. Objects without a
/// generation (ConfigMaps, for instance) never pass an update: do not use it for them.
#[derive(Clone, Copy, Debug, Default)]
pub struct GenerationChanged;

impl Predicate for GenerationChanged {
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        matches!((old.generation, new.generation), (Some(a), Some(b)) if a != b)
    }
}

/// Passes updates that changed the labels (controller-runtime's `LabelChangedPredicate`).
#[derive(Clone, Copy, Debug, Default)]
pub struct LabelsChanged;

impl Predicate for LabelsChanged {
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        old.labels != new.labels
    }
}

/// Passes updates that changed the annotations (controller-runtime's
/// `AnnotationChangedPredicate`).
#[derive(Clone, Copy, Debug, Default)]
pub struct AnnotationsChanged;

impl Predicate for AnnotationsChanged {
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        old.annotations != new.annotations
    }
}

/// Passes updates that changed the resourceVersion (controller-runtime's
/// `ResourceVersionChangedPredicate`): drops the informer's periodic resyncs.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResourceVersionChanged;

impl Predicate for ResourceVersionChanged {
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        old.resource_version != new.resource_version
    }
}

/// A predicate made of closures over metadata (controller-runtime's `predicate.Funcs`); a
/// missing closure passes everything.
#[derive(Default)]
pub struct Funcs {
    create: Option<MetaFilter>,
    update: Option<UpdateFilter>,
    delete: Option<MetaFilter>,
}

type MetaFilter = Box<dyn Fn(&ObjectMeta) -> bool + Send + Sync>;
type UpdateFilter = Box<dyn Fn(&ObjectMeta, &ObjectMeta) -> bool + Send + Sync>;

impl Funcs {
    /// A predicate that passes everything until closures are set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the create closure.
    #[must_use]
    pub fn on_create(mut self, f: impl Fn(&ObjectMeta) -> bool + Send + Sync + 'static) -> Self {
        self.create = Some(Box::new(f));
        self
    }

    /// Sets the update closure.
    #[must_use]
    pub fn on_update(mut self, f: impl Fn(&ObjectMeta, &ObjectMeta) -> bool + Send + Sync + 'static) -> Self {
        self.update = Some(Box::new(f));
        self
    }

    /// Sets the delete closure.
    #[must_use]
    pub fn on_delete(mut self, f: impl Fn(&ObjectMeta) -> bool + Send + Sync + 'static) -> Self {
        self.delete = Some(Box::new(f));
        self
    }
}

impl Predicate for Funcs {
    fn create(&self, obj: &ObjectMeta) -> bool {
        self.create.as_ref().is_none_or(|f| f(obj))
    }
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        self.update.as_ref().is_none_or(|f| f(old, new))
    }
    fn delete(&self, obj: &ObjectMeta) -> bool {
        self.delete.as_ref().is_none_or(|f| f(obj))
    }
}

/// Passes when any of `predicates` passes (controller-runtime's `predicate.Or`).
pub fn any(predicates: Vec<Arc<dyn Predicate>>) -> Any {
    Any(predicates)
}

/// See [`any`].
pub struct Any(Vec<Arc<dyn Predicate>>);

impl Predicate for Any {
    fn create(&self, obj: &ObjectMeta) -> bool {
        self.0.iter().any(|p| p.create(obj))
    }
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        self.0.iter().any(|p| p.update(old, new))
    }
    fn delete(&self, obj: &ObjectMeta) -> bool {
        self.0.iter().any(|p| p.delete(obj))
    }
}

/// Every filter of a controller, all of which must pass (controller-runtime's `predicate.And`).
#[derive(Clone, Default)]
pub(crate) struct All(pub(crate) Vec<Arc<dyn Predicate>>);

impl Predicate for All {
    fn create(&self, obj: &ObjectMeta) -> bool {
        self.0.iter().all(|p| p.create(obj))
    }
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        self.0.iter().all(|p| p.update(old, new))
    }
    fn delete(&self, obj: &ObjectMeta) -> bool {
        self.0.iter().all(|p| p.delete(obj))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(generation: i64, rv: &str, label: &str, annotation: &str) -> ObjectMeta {
        ObjectMeta {
            generation: Some(generation),
            resource_version: Some(rv.into()),
            labels: Some([("l".to_string(), label.to_string())].into()),
            annotations: Some([("a".to_string(), annotation.to_string())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn ready_made_predicates_look_at_their_field_only() {
        let base = meta(1, "10", "x", "y");
        let cases: [(&dyn Predicate, ObjectMeta); 4] = [
            (&GenerationChanged, meta(2, "10", "x", "y")),
            (&ResourceVersionChanged, meta(1, "11", "x", "y")),
            (&LabelsChanged, meta(1, "10", "z", "y")),
            (&AnnotationsChanged, meta(1, "10", "x", "z")),
        ];
        for (index, (predicate, changed)) in cases.iter().enumerate() {
            assert!(predicate.update(&base, changed), "case {index}: its own change passes");
            assert!(!predicate.update(&base, &base), "case {index}: a resync does not pass");
            assert!(predicate.create(&base) && predicate.delete(&base), "case {index}");
            for (other, (_, other_change)) in cases.iter().enumerate() {
                if other != index {
                    assert!(
                        !predicate.update(&base, other_change),
                        "case {index} passed change {other}"
                    );
                }
            }
        }
        assert!(!GenerationChanged.update(&ObjectMeta::default(), &ObjectMeta::default()));
    }

    #[test]
    fn all_and_any_combine() {
        let (a, b) = (meta(1, "1", "x", "y"), meta(2, "2", "x", "y"));
        let both = All(vec![Arc::new(GenerationChanged), Arc::new(LabelsChanged)]);
        assert!(!both.update(&a, &b));
        let either = any(vec![Arc::new(GenerationChanged), Arc::new(LabelsChanged)]);
        assert!(either.update(&a, &b));
        let only_named = Funcs::new().on_create(|m| m.name.is_some());
        assert!(!only_named.create(&a) && only_named.update(&a, &b));
    }
}
