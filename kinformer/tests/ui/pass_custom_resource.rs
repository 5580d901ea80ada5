#![deny(warnings, missing_docs)]
//! Form 1: next to kube's CustomResource, on the spec struct.

mod crds {
    use kinformer::Informer;
    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    // User items that shadow names generated code must not rely on.
    #[allow(dead_code)]
    struct Result;
    #[allow(dead_code)]
    struct Arc;
    #[allow(dead_code)]
    struct Vec;

    /// A Foo's spec.
    #[derive(CustomResource, Informer, Serialize, Deserialize, Clone, Debug, JsonSchema)]
    #[kube(group = "example.com", version = "v1", kind = "Foo", namespaced)]
    pub struct FooSpec {
        /// Replicas.
        pub replicas: i32,
    }
}

fn use_it(factory: &kinformer::factory::SharedInformerFactory) -> Result<(), kinformer::factory::FactoryError> {
    let informer: crds::FooInformer = crds::Foo::informer(factory)?;
    let shared: kinformer::cache::SharedIndexInformer<crds::Foo> = factory.informer_for::<crds::Foo>()?;
    let _ = shared.has_synced();
    let metadata: kinformer::cache::SharedIndexInformer<kinformer::factory::PartialObjectMeta<crds::Foo>> =
        crds::Foo::metadata_informer(factory)?;
    let _ = metadata.has_synced();
    let lister: crds::FooLister = informer.lister();
    let all: Vec<std::sync::Arc<crds::Foo>> = lister.list(&kinformer::cache::Selector::default());
    let in_ns: crds::FooNamespaceLister = lister.foos("default");
    let one: Option<std::sync::Arc<crds::Foo>> = in_ns.get("name");
    let _ = (all, one, in_ns.list(&Default::default()));
    Ok(())
}

fn main() {
    let _ = use_it;
}
