#![deny(warnings, missing_docs)]
//! A projection: a partial Pod bound to the `pods` resource, read-only.

use kinformer::Informer;
use kube::api::ObjectMeta;

/// The fields of a Pod a controller reads.
#[derive(Clone, Debug, serde::Deserialize, Informer)]
#[informer(version = "v1", kind = "Pod", namespaced, projection)]
pub struct PodPhase {
    metadata: ObjectMeta,
    #[serde(default)]
    status: PodPhaseStatus,
}

/// The status fields read.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct PodPhaseStatus {
    phase: Option<String>,
}

fn use_it(factory: &kinformer::factory::SharedInformerFactory) -> Result<(), kinformer::factory::FactoryError> {
    let informer: PodPhaseInformer = PodPhase::informer(factory)?;
    let one: Option<std::sync::Arc<PodPhase>> = informer.lister().pods("default").get("name");
    let _ = one.map(|p| p.status.phase.clone());
    assert_eq!(<PodPhase as kube::Resource>::url_path(&(), Some("ns")), "/api/v1/namespaces/ns/pods");
    Ok(())
}

fn main() {
    let _ = use_it;
}
