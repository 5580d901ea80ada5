#![deny(warnings, missing_docs)]
//! `#[informer(crate = "...")]`: generated code reaches kinformer through a re-export, here on a
//! cluster-scoped CustomResource (form 1 without `namespaced`: `get` on the lister itself).

mod deps {
    pub use kinformer as informers;
}

use kinformer::Informer;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Baz's spec.
#[derive(CustomResource, Informer, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(group = "example.com", version = "v1", kind = "Baz")]
#[informer(crate = "crate::deps::informers")]
pub struct BazSpec {
    /// A number.
    pub n: i32,
}

fn use_it(factory: &kinformer::factory::SharedInformerFactory) -> Result<(), kinformer::factory::FactoryError> {
    let lister: BazLister = Baz::informer(factory)?.lister();
    let one: Option<std::sync::Arc<Baz>> = lister.get("name");
    let all = lister.list(&kinformer::cache::Selector::default());
    let _ = (one, all);
    Ok(())
}

fn main() {
    let _ = use_it;
}
