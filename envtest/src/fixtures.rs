//! Objects tests install into envtest often enough to share.
//!
//! Where it sits: outside the server, beside the tests (like [`crate::kubectl`]); nothing in
//! the request path uses it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
    CustomResourceDefinitionVersion, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A namespaced CRD `<plural>.<group>` served and stored at `v1` whose `spec` keeps whatever it
/// is given (`x-kubernetes-preserve-unknown-fields`): the server stores a `spec` no Rust type of
/// the test may decode (`spec.size: "big"` where the type has an `i32`).
pub fn open_spec_crd(group: &str, kind: &str, plural: &str) -> CustomResourceDefinition {
    let spec = JSONSchemaProps {
        type_: Some("object".into()),
        x_kubernetes_preserve_unknown_fields: Some(true),
        ..Default::default()
    };
    let schema = JSONSchemaProps {
        type_: Some("object".into()),
        properties: Some([("spec".to_string(), spec)].into()),
        ..Default::default()
    };
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{plural}.{group}")),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: group.into(),
            names: CustomResourceDefinitionNames {
                kind: kind.into(),
                plural: plural.into(),
                singular: Some(kind.to_lowercase()),
                list_kind: Some(format!("{kind}List")),
                ..Default::default()
            },
            scope: "Namespaced".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: "v1".into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(schema),
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    }
}
