//! The parts of a `CustomResourceDefinition` (apiextensions.k8s.io/v1) that code generation
//! reads, as plain serde types: what is not listed here is ignored. The schema type is the
//! structural-schema subset of OpenAPI v3 that kube-apiserver accepts in `openAPIV3Schema`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A `CustomResourceDefinition` document.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Crd {
    /// `apiextensions.k8s.io/v1` (v1beta1 CRDs are refused: they were removed in Kubernetes 1.22).
    #[serde(default)]
    pub api_version: String,
    /// `CustomResourceDefinition`.
    #[serde(default)]
    pub kind: String,
    /// `metadata.name`, `<plural>.<group>`.
    #[serde(default)]
    pub metadata: CrdMeta,
    /// What the CRD defines.
    pub spec: CrdSpec,
    /// The whole document as it was read (set by [`super::crds_from_yaml`]): the generated
    /// `CustomResourceExt::crd()` returns it, so printer columns, short names, categories and
    /// subresources reach the user's code losslessly. `Null` when the CRD was built otherwise.
    #[serde(skip)]
    pub document: serde_json::Value,
}

/// The CRD's own metadata (its name only).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CrdMeta {
    /// `<plural>.<group>`.
    #[serde(default)]
    pub name: String,
}

/// `spec` of a CRD.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdSpec {
    /// The API group.
    pub group: String,
    /// Kind, plural, short names and categories.
    pub names: CrdNames,
    /// `Namespaced` or `Cluster`.
    pub scope: String,
    /// Every version the CRD declares.
    pub versions: Vec<CrdVersion>,
}

/// `spec.names` of a CRD.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdNames {
    /// The kind (`Certificate`).
    pub kind: String,
    /// The plural resource name (`certificates`).
    pub plural: String,
    /// Short names for kubectl (`cert`).
    #[serde(default)]
    pub short_names: Vec<String>,
    /// Categories (`all`).
    #[serde(default)]
    pub categories: Vec<String>,
}

/// One entry of `spec.versions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdVersion {
    /// The version's name (`v1`).
    pub name: String,
    /// Whether the server serves it.
    #[serde(default)]
    pub served: bool,
    /// Whether it is the storage version.
    #[serde(default)]
    pub storage: bool,
    /// Whether it is deprecated.
    #[serde(default)]
    pub deprecated: bool,
    /// The warning the server sends with every request to a deprecated version.
    #[serde(default)]
    pub deprecation_warning: Option<String>,
    /// The version's schema.
    #[serde(default)]
    pub schema: Option<CrdValidation>,
    /// Its subresources (status, scale).
    #[serde(default)]
    pub subresources: Option<CrdSubresources>,
}

/// `schema` of a version.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdValidation {
    /// The structural schema of the whole object.
    #[serde(rename = "openAPIV3Schema")]
    pub open_api_v3_schema: Option<Schema>,
}

/// `subresources` of a version.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CrdSubresources {
    /// Present when `/status` is enabled.
    #[serde(default)]
    pub status: Option<serde_json::Value>,
    /// Present when `/scale` is enabled.
    #[serde(default)]
    pub scale: Option<CrdScale>,
}

/// `subresources.scale` of a version: where the replica counts and the selector live.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdScale {
    /// JSON path of the desired replicas (`.spec.replicas`).
    #[serde(default)]
    pub spec_replicas_path: String,
    /// JSON path of the observed replicas (`.status.replicas`).
    #[serde(default)]
    pub status_replicas_path: String,
    /// JSON path of the label selector (`.status.selector`), if any.
    #[serde(default)]
    pub label_selector_path: Option<String>,
}

/// One node of a structural schema. It serializes (to the JSON it was read from, less what is
/// not listed here) so that code generation can tell equal shapes apart by their JSON.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Schema {
    /// `object`, `array`, `string`, `integer`, `number`, `boolean`, or absent.
    #[serde(rename = "type", default)]
    pub type_: Option<String>,
    /// `int32`, `int64`, `date-time`, `byte`, …
    #[serde(default)]
    pub format: Option<String>,
    /// The field's documentation.
    #[serde(default)]
    pub description: Option<String>,
    /// The regular expression a string must match (a resource quantity's is well known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// The fields of an object.
    #[serde(default)]
    pub properties: BTreeMap<String, Schema>,
    /// The fields an object must have.
    #[serde(default)]
    pub required: Vec<String>,
    /// The element schema of an array.
    #[serde(default)]
    pub items: Option<Box<Schema>>,
    /// The value schema of a map (`true` for any value).
    #[serde(default)]
    pub additional_properties: Option<AdditionalProperties>,
    /// Allowed values.
    #[serde(rename = "enum", default)]
    pub enum_: Option<Vec<serde_json::Value>>,
    /// The value the server fills in when the field is absent.
    #[serde(default)]
    pub default: Option<serde_json::Value>,
    /// Whether `null` is a value.
    #[serde(default)]
    pub nullable: bool,
    /// Unknown fields are kept, not pruned.
    #[serde(rename = "x-kubernetes-preserve-unknown-fields", default)]
    pub preserve_unknown_fields: bool,
    /// An integer or a string (a port, a percentage).
    #[serde(rename = "x-kubernetes-int-or-string", default)]
    pub int_or_string: bool,
    /// A whole Kubernetes object (apiVersion, kind, metadata).
    #[serde(rename = "x-kubernetes-embedded-resource", default)]
    pub embedded_resource: bool,
}

/// `additionalProperties`: a schema, or a boolean.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum AdditionalProperties {
    /// `true` (any value) or `false` (none).
    Bool(bool),
    /// The schema of every value.
    Schema(Box<Schema>),
}
