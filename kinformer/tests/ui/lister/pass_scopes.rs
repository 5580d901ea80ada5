// Each kind gets the lookups its scope allows; dynamic objects (scope known at run time) get both.
use kinformer::cache::{Indexer, Lister};
use kinformer::k8s_openapi::api::core::v1::{Namespace, Pod};
use kinformer::kube::api::{DynamicObject, PartialObjectMeta};

fn main() {
    let pods: Lister<Pod> = Lister::new(Indexer::default());
    assert!(pods.namespaced("default").get("web").is_none());
    let namespaces: Lister<Namespace> = Lister::new(Indexer::default());
    assert!(namespaces.get("prod").is_none());
    let metadata: Lister<PartialObjectMeta<Pod>> = Lister::new(Indexer::default());
    assert!(metadata.namespaced("default").lookup("web").is_absent());
    let dynamic: Lister<DynamicObject> = Lister::new(Indexer::default());
    assert!(dynamic.get("prod").is_none());
    assert!(dynamic.namespaced("default").get("web").is_none());
}
