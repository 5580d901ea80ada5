//! Event filters (controller-runtime's `pkg/predicate`): which notifications may enqueue a key.
//!
//! Two traits, for the two places a filter goes:
//! - [`TypedPredicate<K>`] sees the typed object (`&K`; old and new on updates) and is attached
//!   to one source: `SourceOptions::predicate` of `for_resource_with`, `owns_with` and
//!   `watches_with_options` (controller-runtime's `builder.WithPredicates`). It filters that
//!   source alone: a predicate on an owned type never filters the primary.
//! - [`Predicate`] sees metadata only, so one filter applies to every source of a controller
//!   whatever its type: [`with_event_filter`](crate::Controller::with_event_filter)
//!   (controller-runtime's `WithEventFilter`). A notification must pass both.
//!
//! Every metadata predicate here is also a [`TypedPredicate<K>`] for any resource `K` (write
//! [`meta(p)`](meta) for one of yours). The ready-made ones answer only for updates and let adds
//! and deletes through: a controller must see objects appear and disappear whatever changed.
//!
//! | predicate | an update passes when |
//! |---|---|
//! | [`GenerationChanged`] | `metadata.generation` differs (spec changes; status writes and resyncs do not pass) |
//! | [`LabelsChanged`] | the labels differ |
//! | [`AnnotationsChanged`] | the annotations differ |
//! | [`ResourceVersionChanged`] | the resourceVersion differs (drops periodic resyncs) |
//!
//! | [`LabelSelectorPredicate`] | *(every event)* the object's labels (the new ones, on updates) match a selector |
//!
//! Combinators, for both traits: [`not`] (`predicate.Not`), [`all`] (`predicate.And`), [`any`]
//! (`predicate.Or`), over tuples of up to four predicates. Several filters on one controller or
//! source must all pass.
//!
//! ```
//! use controller::predicate::{GenerationChanged, Predicate};
//! use kube::api::ObjectMeta;
//!
//! let old = ObjectMeta { generation: Some(1), ..ObjectMeta::default() };
//! let status_write = ObjectMeta { generation: Some(1), resource_version: Some("9".into()), ..old.clone() };
//! assert!(!GenerationChanged.update(&old, &status_write));
//! ```

use std::marker::PhantomData;
use std::sync::Arc;

use factory::SelectorError;
use kube::Resource;
use kube::api::ObjectMeta;
use kube::core::{Selector, SelectorExt};

/// Decides whether a notification about one source's object may enqueue work, seeing the typed
/// object. Attached per source; see the [module docs](self).
pub trait TypedPredicate<K>: Send + Sync + 'static {
    /// An object appeared (or was replayed by the initial list).
    fn create(&self, obj: &K) -> bool {
        let _ = obj;
        true
    }

    /// An object changed (or a resync re-delivered it).
    fn update(&self, old: &K, new: &K) -> bool {
        let _ = (old, new);
        true
    }

    /// An object was deleted (`obj` is its last known state).
    fn delete(&self, obj: &K) -> bool {
        let _ = obj;
        true
    }
}

impl<K: 'static, P: TypedPredicate<K> + ?Sized> TypedPredicate<K> for Arc<P> {
    fn create(&self, obj: &K) -> bool {
        (**self).create(obj)
    }
    fn update(&self, old: &K, new: &K) -> bool {
        (**self).update(old, new)
    }
    fn delete(&self, obj: &K) -> bool {
        (**self).delete(obj)
    }
}

/// A metadata [`Predicate`] of your own as a [`TypedPredicate`] of any resource (the ones of
/// this module are both already).
pub fn meta<P: Predicate>(predicate: P) -> Meta<P> {
    Meta(predicate)
}

/// See [`meta`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Meta<P>(pub P);

impl<K: Resource + 'static, P: Predicate> TypedPredicate<K> for Meta<P> {
    fn create(&self, obj: &K) -> bool {
        self.0.create(obj.meta())
    }
    fn update(&self, old: &K, new: &K) -> bool {
        self.0.update(old.meta(), new.meta())
    }
    fn delete(&self, obj: &K) -> bool {
        self.0.delete(obj.meta())
    }
}

/// Makes a metadata predicate a [`TypedPredicate`] of every resource.
macro_rules! typed_from_meta {
    ($($name:ty),*) => {$(
        impl<K: Resource + 'static> TypedPredicate<K> for $name {
            fn create(&self, obj: &K) -> bool {
                Predicate::create(self, obj.meta())
            }
            fn update(&self, old: &K, new: &K) -> bool {
                Predicate::update(self, old.meta(), new.meta())
            }
            fn delete(&self, obj: &K) -> bool {
                Predicate::delete(self, obj.meta())
            }
        }
    )*};
}

typed_from_meta!(
    GenerationChanged,
    LabelsChanged,
    AnnotationsChanged,
    ResourceVersionChanged,
    LabelSelectorPredicate,
    Funcs
);

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

/// Passes objects whose labels match a selector (controller-runtime's `LabelSelectorPredicate`):
/// creates and deletes by the object's labels, updates by the new object's (so an object
/// relabelled out of the selector is not notified; one relabelled into it is).
#[derive(Clone, Debug)]
pub struct LabelSelectorPredicate {
    selector: Selector,
}

impl LabelSelectorPredicate {
    /// From kube's structured [`Selector`] (`Selector::from_iter([("app", "web")])`).
    pub fn new(selector: Selector) -> Self {
        LabelSelectorPredicate { selector }
    }

    /// From a selector string (`app=web,tier in (a,b)`); a bad one is an error.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        factory::parse_label_selector(selector).map(Self::new)
    }

    fn matches(&self, obj: &ObjectMeta) -> bool {
        match &obj.labels {
            Some(labels) => self.selector.matches(labels),
            None => self.selector.matches(&Default::default()),
        }
    }
}

impl Predicate for LabelSelectorPredicate {
    fn create(&self, obj: &ObjectMeta) -> bool {
        self.matches(obj)
    }
    fn update(&self, _old: &ObjectMeta, new: &ObjectMeta) -> bool {
        self.matches(new)
    }
    fn delete(&self, obj: &ObjectMeta) -> bool {
        self.matches(obj)
    }
}

/// A predicate made of closures over metadata (controller-runtime's `predicate.Funcs`); a
/// missing closure passes everything. [`ObjectFuncs`] is its typed twin.
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

/// A typed predicate made of closures over the object (controller-runtime's typed
/// `predicate.Funcs`); a missing closure passes everything.
///
/// ```
/// use controller::predicate::{ObjectFuncs, TypedPredicate};
/// use k8s_openapi::api::core::v1::ConfigMap;
///
/// let has_data = ObjectFuncs::<ConfigMap>::new().on_create(|cm| cm.data.is_some());
/// assert!(!has_data.create(&ConfigMap::default()));
/// ```
pub struct ObjectFuncs<K> {
    create: Option<ObjectFilter<K>>,
    update: Option<ObjectUpdateFilter<K>>,
    delete: Option<ObjectFilter<K>>,
    _object: PhantomData<fn(&K)>,
}

type ObjectFilter<K> = Box<dyn Fn(&K) -> bool + Send + Sync>;
type ObjectUpdateFilter<K> = Box<dyn Fn(&K, &K) -> bool + Send + Sync>;

impl<K> Default for ObjectFuncs<K> {
    fn default() -> Self {
        ObjectFuncs {
            create: None,
            update: None,
            delete: None,
            _object: PhantomData,
        }
    }
}

impl<K> ObjectFuncs<K> {
    /// A predicate that passes everything until closures are set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the create closure.
    #[must_use]
    pub fn on_create(mut self, f: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        self.create = Some(Box::new(f));
        self
    }

    /// Sets the update closure (old, new).
    #[must_use]
    pub fn on_update(mut self, f: impl Fn(&K, &K) -> bool + Send + Sync + 'static) -> Self {
        self.update = Some(Box::new(f));
        self
    }

    /// Sets the delete closure.
    #[must_use]
    pub fn on_delete(mut self, f: impl Fn(&K) -> bool + Send + Sync + 'static) -> Self {
        self.delete = Some(Box::new(f));
        self
    }
}

impl<K: 'static> TypedPredicate<K> for ObjectFuncs<K> {
    fn create(&self, obj: &K) -> bool {
        self.create.as_ref().is_none_or(|f| f(obj))
    }
    fn update(&self, old: &K, new: &K) -> bool {
        self.update.as_ref().is_none_or(|f| f(old, new))
    }
    fn delete(&self, obj: &K) -> bool {
        self.delete.as_ref().is_none_or(|f| f(obj))
    }
}

/// Passes what `predicate` does not (controller-runtime's `predicate.Not`): a metadata
/// predicate if `predicate` is one, a typed one if it is typed.
pub fn not<P>(predicate: P) -> Not<P> {
    Not(predicate)
}

/// See [`not`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Not<P>(pub P);

impl<P: Predicate> Predicate for Not<P> {
    fn create(&self, obj: &ObjectMeta) -> bool {
        !self.0.create(obj)
    }
    fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool {
        !self.0.update(old, new)
    }
    fn delete(&self, obj: &ObjectMeta) -> bool {
        !self.0.delete(obj)
    }
}

impl<K, P: TypedPredicate<K>> TypedPredicate<K> for Not<P> {
    fn create(&self, obj: &K) -> bool {
        !self.0.create(obj)
    }
    fn update(&self, old: &K, new: &K) -> bool {
        !self.0.update(old, new)
    }
    fn delete(&self, obj: &K) -> bool {
        !self.0.delete(obj)
    }
}

/// Passes when every predicate of the tuple passes (controller-runtime's `predicate.And`):
/// `all((GenerationChanged, not(LabelsChanged)))`.
pub fn all<T>(predicates: T) -> All<T> {
    All(predicates)
}

/// Passes when one predicate of the tuple passes (controller-runtime's `predicate.Or`):
/// `any((GenerationChanged, LabelsChanged))`.
pub fn any<T>(predicates: T) -> Any<T> {
    Any(predicates)
}

/// See [`all`].
#[derive(Clone, Copy, Debug, Default)]
pub struct All<T>(pub T);

/// See [`any`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Any<T>(pub T);

/// `All` and `Any` over tuples, as metadata and as typed predicates.
macro_rules! combinators {
    ($($p:ident . $i:tt),+) => {
        impl<$($p: Predicate),+> Predicate for All<($($p,)+)> {
            fn create(&self, obj: &ObjectMeta) -> bool { $(self.0.$i.create(obj))&&+ }
            fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool { $(self.0.$i.update(old, new))&&+ }
            fn delete(&self, obj: &ObjectMeta) -> bool { $(self.0.$i.delete(obj))&&+ }
        }
        impl<$($p: Predicate),+> Predicate for Any<($($p,)+)> {
            fn create(&self, obj: &ObjectMeta) -> bool { $(self.0.$i.create(obj))||+ }
            fn update(&self, old: &ObjectMeta, new: &ObjectMeta) -> bool { $(self.0.$i.update(old, new))||+ }
            fn delete(&self, obj: &ObjectMeta) -> bool { $(self.0.$i.delete(obj))||+ }
        }
        impl<K, $($p: TypedPredicate<K>),+> TypedPredicate<K> for All<($($p,)+)> {
            fn create(&self, obj: &K) -> bool { $(self.0.$i.create(obj))&&+ }
            fn update(&self, old: &K, new: &K) -> bool { $(self.0.$i.update(old, new))&&+ }
            fn delete(&self, obj: &K) -> bool { $(self.0.$i.delete(obj))&&+ }
        }
        impl<K, $($p: TypedPredicate<K>),+> TypedPredicate<K> for Any<($($p,)+)> {
            fn create(&self, obj: &K) -> bool { $(self.0.$i.create(obj))||+ }
            fn update(&self, old: &K, new: &K) -> bool { $(self.0.$i.update(old, new))||+ }
            fn delete(&self, obj: &K) -> bool { $(self.0.$i.delete(obj))||+ }
        }
    };
}

combinators!(A.0);
combinators!(A.0, B.1);
combinators!(A.0, B.1, C.2);
combinators!(A.0, B.1, C.2, D.3);

/// Every predicate of a source, all of which must pass.
pub(crate) struct Filters<K>(pub(crate) Vec<Arc<dyn TypedPredicate<K>>>);

impl<K> Clone for Filters<K> {
    fn clone(&self) -> Self {
        Filters(self.0.clone())
    }
}

impl<K> Default for Filters<K> {
    fn default() -> Self {
        Filters(Vec::new())
    }
}

impl<K: 'static> TypedPredicate<K> for Filters<K> {
    fn create(&self, obj: &K) -> bool {
        self.0.iter().all(|p| p.create(obj))
    }
    fn update(&self, old: &K, new: &K) -> bool {
        self.0.iter().all(|p| p.update(old, new))
    }
    fn delete(&self, obj: &K) -> bool {
        self.0.iter().all(|p| p.delete(obj))
    }
}

/// The event filters of a controller (metadata), all of which must pass.
#[derive(Clone, Default)]
pub(crate) struct EventFilters(pub(crate) Vec<Arc<dyn Predicate>>);

impl Predicate for EventFilters {
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
    use k8s_openapi::api::core::v1::ConfigMap;

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
        assert!(!Predicate::update(
            &GenerationChanged,
            &ObjectMeta::default(),
            &ObjectMeta::default()
        ));
    }

    #[test]
    fn all_any_and_not_combine_as_metadata_and_typed_predicates() {
        let (a, b) = (meta(1, "1", "x", "y"), meta(2, "2", "x", "y"));
        let both = all((GenerationChanged, LabelsChanged));
        assert!(!Predicate::update(&both, &a, &b));
        let either = any((GenerationChanged, LabelsChanged));
        assert!(Predicate::update(&either, &a, &b));
        assert!(!Predicate::update(&not(either), &a, &b));
        assert!(Predicate::update(&not(LabelsChanged), &a, &b));
        let only_named = Funcs::new().on_create(|m| m.name.is_some());
        assert!(!Predicate::create(&only_named, &a) && Predicate::update(&only_named, &a, &b));

        let (old, new) = (
            ConfigMap {
                metadata: a,
                ..ConfigMap::default()
            },
            ConfigMap {
                metadata: b,
                data: Some(Default::default()),
                ..ConfigMap::default()
            },
        );
        let typed = all((
            GenerationChanged,
            ObjectFuncs::<ConfigMap>::new().on_update(|_, new| new.data.is_some()),
        ));
        assert!(typed.update(&old, &new) && !typed.update(&new, &old));
        assert!(!TypedPredicate::update(&not(typed), &old, &new));
        assert!(TypedPredicate::update(
            &any((not(GenerationChanged), LabelsChanged, meta_of(AnnotationsChanged))),
            &new,
            &new
        ));
    }

    fn meta_of<P: Predicate>(p: P) -> Meta<P> {
        super::meta(p)
    }

    #[test]
    fn a_label_selector_predicate_matches_the_new_labels() {
        let web = LabelSelectorPredicate::parse("app=web").unwrap();
        let (on, off) = (meta(1, "1", "x", "y"), meta(1, "2", "x", "y"));
        let on = ObjectMeta {
            labels: Some([("app".to_string(), "web".to_string())].into()),
            ..on
        };
        assert!(Predicate::create(&web, &on) && !Predicate::create(&web, &off));
        assert!(Predicate::update(&web, &off, &on) && !Predicate::update(&web, &on, &off));
        assert!(Predicate::delete(&web, &on) && !Predicate::delete(&web, &off));
        assert!(LabelSelectorPredicate::parse("app in (").is_err());
        let cm = ConfigMap {
            metadata: on,
            ..ConfigMap::default()
        };
        assert!(TypedPredicate::create(&web, &cm));
    }
}
