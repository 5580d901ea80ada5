//! A projection is read-only: writing one back would drop every field it does not declare, so
//! it must not implement `Serialize` (which `Api::create` and `Api::replace` need).

use kinformer::Informer;
use kube::api::ObjectMeta;

#[derive(Clone, Debug, serde::Deserialize, serde::Serialize, Informer)]
#[informer(version = "v1", kind = "Pod", namespaced, projection)]
pub struct PodPhase {
    metadata: ObjectMeta,
}

fn main() {}
