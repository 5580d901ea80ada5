//! `SharedInformerFactory`: one shared informer per resource type.
//!
//! Where it sits in the data path: the factory owns the `SharedIndexInformer`s of
//! `informer-core` and hands the same one to every consumer of a type, so one list/watch per
//! type feeds every handler and lister in the process. Not built yet (issue 6).
