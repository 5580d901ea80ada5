#![deny(warnings, missing_docs)]
//! Form 2: a hand-written, cluster-scoped resource type with #[informer(...)].

use std::borrow::Cow;

use kinformer::Informer;
use kube::api::ObjectMeta;

/// A cluster-scoped resource written by hand.
#[derive(Clone, Debug, serde::Deserialize, Informer)]
#[informer(group = "example.com", version = "v1", kind = "Bar", plural = "bars")]
pub struct Bar {
    metadata: ObjectMeta,
}

impl kube::Resource for Bar {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Bar".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "example.com".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "bars".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn use_it(factory: &kinformer::factory::SharedInformerFactory) -> Result<(), kinformer::factory::FactoryError> {
    let informer: BarInformer = Bar::informer(factory)?;
    let one: Option<std::sync::Arc<Bar>> = informer.lister().get("name");
    let _ = one;
    Ok(())
}

fn main() {
    let _ = use_it;
}
