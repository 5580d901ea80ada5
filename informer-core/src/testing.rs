//! Objects shared by the crate's unit tests.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

/// ConfigMap `ns/{name}` at resourceVersion `rv`.
pub(crate) fn configmap(name: &str, rv: &str) -> Arc<ConfigMap> {
    Arc::new(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some(rv.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    })
}
