// A Pod is namespaced: its cache key is `namespace/name`, so a get by name alone would never
// find it. The lister has no such method for a namespaced kind; the error names the accessor.
use kinformer::cache::{Indexer, Lister};
use kinformer::k8s_openapi::api::core::v1::Pod;

fn main() {
    let pods: Lister<Pod> = Lister::new(Indexer::default());
    let _ = pods.get("web");
}
