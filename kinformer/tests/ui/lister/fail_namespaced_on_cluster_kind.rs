// A Namespace is cluster-scoped: a namespaced view of its lister would always be empty.
use kinformer::cache::{Indexer, Lister};
use kinformer::k8s_openapi::api::core::v1::Namespace;

fn main() {
    let namespaces: Lister<Namespace> = Lister::new(Indexer::default());
    let _ = namespaces.namespaced("default").get("prod");
}
