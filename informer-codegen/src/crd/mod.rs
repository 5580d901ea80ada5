//! Rust types, typed informers and listers from a `CustomResourceDefinition`'s YAML.
//!
//! For each served version of a CRD, [`generate_crd`] emits a module (`v1`, `v1beta1`) with:
//!
//! - the spec struct (`CertificateSpec`) carrying kube's `CustomResource` derive with the CRD's
//!   group, version, kind, plural, scope, short names and categories, so kube generates the root
//!   type (`Certificate`) and, when the schema has a `status`, its status field and subresource;
//! - one struct per object schema with properties (`CertificateSpecPrivateKey`), one enum per
//!   string enum, `Option<T>` for fields that are not required (or are nullable), `BTreeMap`
//!   for `additionalProperties`, `IntOrString` for `x-kubernetes-int-or-string`, and
//!   `serde_json::Value` for `x-kubernetes-preserve-unknown-fields` without properties and for
//!   embedded resources; an object that keeps unknown fields next to known ones gets a
//!   flattened map for them, so nothing the server sends is lost on a round trip;
//! - serde and schemars derives, with `#[serde(rename)]` wherever the Rust name (snake case,
//!   keywords raw, clashes numbered) differs from the JSON name, and doc comments from each
//!   `description` (and the server's `default`, when there is one);
//! - the same `FooInformer`, `FooLister` and `FooNamespaceLister` that `#[derive(Informer)]`
//!   emits (one generator, [`crate::generate`]).
//!
//! Every path in the output goes through the kinformer facade (`::kinformer::kube`,
//! `::kinformer::serde`, `::kinformer::schemars`, …), so a crate that uses the generated code
//! needs no dependency but `kinformer`.
//!
//! What the generated types do not model, on purpose: `default:` values are documented, not
//! applied (the server applies them; a client that decodes a stored object already has them);
//! `number` fields are `f64`, so an integral number (`1`) serializes back as `1.0`; a nullable
//! field that is not required reads `null` and absent alike and writes neither; an array or map
//! of int-or-string values is `serde_json::Value`; validation keywords (`pattern`, `minimum`,
//! `maxLength`, CEL rules) are the server's business and are not checked on the client.

mod names;
pub mod schema;

use std::collections::BTreeSet;

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Ident, Path};

use crate::{ResourceDesc, generate};
use names::{field_ident, pascal, type_ident};
use schema::{AdditionalProperties, Crd, Schema};

/// Why a CRD could not be turned into Rust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdError {
    /// The CRD's name (`certificates.cert-manager.io`), or where it came from.
    pub crd: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for CrdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.crd, self.message)
    }
}

impl std::error::Error for CrdError {}

/// The `CustomResourceDefinition`s of a YAML text (one or several documents separated by
/// `---`); documents of other kinds are skipped. A CRD of `apiextensions.k8s.io/v1beta1` is an
/// error: that API was removed in Kubernetes 1.22 and its schema layout differs.
pub fn crds_from_yaml(text: &str, origin: &str) -> Result<Vec<Crd>, CrdError> {
    let error = |message: String| CrdError {
        crd: origin.to_string(),
        message,
    };
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| error(format!("not YAML: {e}")))?;
    let mut crds = Vec::new();
    for document in documents {
        if document.get("kind").and_then(serde_json::Value::as_str) != Some("CustomResourceDefinition") {
            continue;
        }
        let crd: Crd =
            serde_json::from_value(document).map_err(|e| error(format!("not a CustomResourceDefinition: {e}")))?;
        if crd.api_version != "apiextensions.k8s.io/v1" {
            return Err(error(format!(
                "{} is {}; only apiextensions.k8s.io/v1 CRDs are read",
                crd.metadata.name, crd.api_version
            )));
        }
        crds.push(crd);
    }
    Ok(crds)
}

/// The file a CRD's code goes to: `<plural>_<group>.rs`, `.` and `-` as `_`.
pub fn file_stem(crd: &Crd) -> String {
    format!("{}_{}", crd.spec.names.plural, crd.spec.group).replace(['.', '-'], "_")
}

/// How [`generate_crd`] writes its output.
#[derive(Debug, Clone)]
pub struct CrdOptions {
    /// The path generated code reaches kinformer by (`::kinformer`).
    pub krate: Path,
    /// The versions to generate; empty means every served version.
    pub versions: Vec<String>,
}

impl Default for CrdOptions {
    fn default() -> Self {
        CrdOptions {
            krate: syn::parse_quote!(::kinformer),
            versions: Vec::new(),
        }
    }
}

/// One module per chosen version of `crd`, with its types, informer and listers (see the
/// module docs).
pub fn generate_crd(crd: &Crd, options: &CrdOptions) -> Result<TokenStream, CrdError> {
    let name = if crd.metadata.name.is_empty() {
        format!("{}.{}", crd.spec.names.plural, crd.spec.group)
    } else {
        crd.metadata.name.clone()
    };
    let error = |message: String| CrdError {
        crd: name.clone(),
        message,
    };
    for wanted in &options.versions {
        if !crd.spec.versions.iter().any(|v| &v.name == wanted) {
            return Err(error(format!("has no version {wanted}")));
        }
    }
    let chosen: Vec<_> = crd
        .spec
        .versions
        .iter()
        .filter(|v| {
            if options.versions.is_empty() {
                v.served
            } else {
                options.versions.contains(&v.name)
            }
        })
        .collect();
    if chosen.is_empty() {
        return Err(error("serves no version".to_string()));
    }
    let mut modules = TokenStream::new();
    for version in chosen {
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .ok_or_else(|| error(format!("version {} has no openAPIV3Schema", version.name)))?;
        let body = generate_version(crd, &version.name, schema, options)
            .map_err(|m| error(format!("version {}: {m}", version.name)))?;
        let module = crate::generate::ident(&version.name);
        let doc = format!(
            " `{}/{}` `{}`{}{}.",
            crd.spec.group,
            version.name,
            crd.spec.names.kind,
            if version.storage { ", the storage version" } else { "" },
            if version.deprecated { " (deprecated)" } else { "" }
        );
        modules.extend(quote! {
            #[doc = #doc]
            pub mod #module {
                #body
            }
        });
    }
    Ok(modules)
}

/// [`generate_crd`] as a formatted file: a `DO NOT EDIT` line naming `source`, a module doc,
/// the lints generated code may trip allowed, and the modules.
pub fn crd_file(crd: &Crd, options: &CrdOptions, source: &str) -> Result<String, CrdError> {
    let modules = generate_crd(crd, options)?;
    let doc = format!(
        " Types, informers and listers of the custom resource `{}` (`{}`, kind `{}`), generated from `{source}`.",
        crd.metadata.name, crd.spec.group, crd.spec.names.kind
    );
    let file = quote! {
        #![doc = #doc]
        #![allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]
        #modules
    };
    Ok(format!(
        "// Code generated by kinformer codegen from {source}. DO NOT EDIT.\n\n{}",
        crate::pretty(file)
    ))
}

/// The code of one version: its types, then its informer and listers.
fn generate_version(crd: &Crd, version: &str, schema: &Schema, options: &CrdOptions) -> Result<TokenStream, String> {
    let kind = &crd.spec.names.kind;
    let kind_ident: Ident = syn::parse_str(kind).map_err(|_| format!("kind {kind:?} is not a Rust type name"))?;
    let mut types = Types {
        krate: options.krate.clone(),
        items: Vec::new(),
        used: BTreeSet::from([kind.clone()]),
    };
    let krate = &options.krate;
    let root = &schema.properties;
    // The spec struct carries kube's derive; without a `spec` the other top-level fields are
    // flattened into the object (kube's `no_spec`).
    let (spec_schema, no_spec) = match root.get("spec") {
        Some(spec) => (spec.clone(), false),
        None => {
            let mut fields = schema.clone();
            for reserved in ["apiVersion", "kind", "metadata", "status"] {
                fields.properties.remove(reserved);
            }
            fields.required.retain(|r| fields.properties.contains_key(r));
            (fields, true)
        }
    };
    let spec_name = format!("{kind}{}", if no_spec { "Fields" } else { "Spec" });
    types.used.insert(spec_name.clone());
    let spec_ident = format_ident!("{}", spec_name);
    let spec_fields = types.fields(&spec_schema, &spec_name, true)?;
    let all_optional = spec_fields.all_optional;
    let status = match root.get("status") {
        Some(status) => {
            let name = format!("{kind}Status");
            let ty = types.ty(status, &name)?;
            match ty {
                Ty::Named(ident) => Some(ident),
                other => {
                    let alias = types.unique(&name);
                    let tokens = types.tokens(&other);
                    let doc = doc_attrs(status.description.as_deref(), None);
                    types.items.push(quote! {
                        #doc
                        pub type #alias = #tokens;
                    });
                    Some(alias)
                }
            }
        }
        None => None,
    };
    let body = spec_fields.tokens;
    let group = &crd.spec.group;
    let plural = &crd.spec.names.plural;
    let namespaced = match crd.spec.scope.as_str() {
        "Namespaced" => true,
        "Cluster" => false,
        other => return Err(format!("scope {other:?} is neither Namespaced nor Cluster")),
    };
    let mut kube_args = vec![
        quote!(group = #group),
        quote!(version = #version),
        quote!(kind = #kind),
        quote!(plural = #plural),
    ];
    if namespaced {
        kube_args.push(quote!(namespaced));
    }
    if no_spec {
        kube_args.push(quote!(no_spec));
    }
    if let Some(status) = &status {
        let status = status.to_string();
        kube_args.push(quote!(status = #status));
    }
    for short in &crd.spec.names.short_names {
        kube_args.push(quote!(shortname = #short));
    }
    for category in &crd.spec.names.categories {
        kube_args.push(quote!(category = #category));
    }
    kube_args.push(quote!(derive = "PartialEq"));
    if all_optional {
        kube_args.push(quote!(derive = "Default"));
    }
    let (kube_core, k8s_openapi, schemars, serde, serde_json) = (
        types.path("kube::core"),
        types.path("k8s_openapi"),
        types.path("schemars"),
        types.path("serde"),
        types.path("serde_json"),
    );
    kube_args.push(quote!(crates(
        kube_core = #kube_core,
        k8s_openapi = #k8s_openapi,
        schemars = #schemars,
        serde = #serde,
        serde_json = #serde_json
    )));
    let derives = types.struct_derives(all_optional);
    let serde_crate = serde.clone();
    let schemars_crate = schemars.clone();
    let doc = doc_attrs(spec_schema.description.as_deref(), None);
    let spec = quote! {
        #doc
        #[derive(#krate::kube::CustomResource, #derives)]
        #[kube(#(#kube_args),*)]
        #[serde(crate = #serde_crate)]
        #[schemars(crate = #schemars_crate)]
        pub struct #spec_ident #body
    };
    let desc = ResourceDesc {
        ty: kind_ident.clone().into(),
        name: kind_ident,
        group: group.clone(),
        version: version.to_string(),
        kind: kind.clone(),
        plural: plural.clone(),
        namespaced,
        krate: krate.clone(),
        inherent_impl: true,
    };
    let informers = generate(&desc);
    let items = types.items;
    Ok(quote! {
        #spec
        #(#items)*
        #informers
    })
}

/// A field's Rust type.
#[derive(Debug, Clone, PartialEq)]
enum Ty {
    String,
    I32,
    I64,
    F64,
    Bool,
    IntOrString,
    Value,
    Vec(Box<Ty>),
    Map(Box<Ty>),
    Named(Ident),
}

/// The fields of a struct, as a braced body.
struct Fields {
    tokens: TokenStream,
    /// Every field is an `Option` (or the flattened map), so the struct can derive `Default`.
    all_optional: bool,
}

/// The named types of one version, as they are made.
struct Types {
    krate: Path,
    items: Vec<TokenStream>,
    used: BTreeSet<String>,
}

impl Types {
    /// A type name not yet used in this version (`Name`, then `Name2`, `Name3`, …).
    fn unique(&mut self, name: &str) -> Ident {
        let base = type_ident(name);
        let mut candidate = base.clone();
        let mut n = 2;
        while self.used.contains(&candidate) {
            candidate = format!("{base}{n}");
            n += 1;
        }
        self.used.insert(candidate.clone());
        format_ident!("{}", candidate)
    }

    /// `sub` under the kinformer path, as a string for an attribute (`"::kinformer::serde"`).
    fn path(&self, sub: &str) -> String {
        let krate = &self.krate;
        format!("{}::{sub}", quote!(#krate).to_string().replace(' ', ""))
    }

    fn tokens(&self, ty: &Ty) -> TokenStream {
        let krate = &self.krate;
        match ty {
            Ty::String => quote!(::std::string::String),
            Ty::I32 => quote!(i32),
            Ty::I64 => quote!(i64),
            Ty::F64 => quote!(f64),
            Ty::Bool => quote!(bool),
            Ty::IntOrString => quote!(#krate::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString),
            Ty::Value => quote!(#krate::serde_json::Value),
            Ty::Vec(inner) => {
                let inner = self.tokens(inner);
                quote!(::std::vec::Vec<#inner>)
            }
            Ty::Map(inner) => {
                let inner = self.tokens(inner);
                quote!(::std::collections::BTreeMap<::std::string::String, #inner>)
            }
            Ty::Named(ident) => quote!(#ident),
        }
    }

    fn struct_derives(&self, default: bool) -> TokenStream {
        let krate = &self.krate;
        let default = if default {
            quote!(, ::core::default::Default)
        } else {
            TokenStream::new()
        };
        quote! {
            #krate::serde::Serialize,
            #krate::serde::Deserialize,
            ::core::clone::Clone,
            ::core::fmt::Debug,
            ::core::cmp::PartialEq,
            #krate::schemars::JsonSchema
            #default
        }
    }

    /// The Rust type of `schema`; object and enum schemas become types named after `name`.
    fn ty(&mut self, schema: &Schema, name: &str) -> Result<Ty, String> {
        if schema.int_or_string {
            return Ok(Ty::IntOrString);
        }
        if schema.embedded_resource {
            return Ok(Ty::Value);
        }
        let type_ = schema
            .type_
            .as_deref()
            .unwrap_or(if schema.properties.is_empty() { "" } else { "object" });
        Ok(match type_ {
            "object" => {
                if !schema.properties.is_empty() {
                    Ty::Named(self.object(schema, name)?)
                } else if let Some(AdditionalProperties::Schema(values)) = &schema.additional_properties {
                    Ty::Map(Box::new(self.element(values, name)?))
                } else if schema.preserve_unknown_fields {
                    Ty::Value
                } else {
                    Ty::Map(Box::new(Ty::Value))
                }
            }
            "array" => match &schema.items {
                Some(items) => Ty::Vec(Box::new(self.element(items, name)?)),
                None => Ty::Vec(Box::new(Ty::Value)),
            },
            "string" => match string_enum(schema) {
                Some(values) => Ty::Named(self.enumeration(schema, name, &values)),
                None => Ty::String,
            },
            "integer" => match schema.format.as_deref() {
                Some("int32") => Ty::I32,
                _ => Ty::I64,
            },
            "number" => Ty::F64,
            "boolean" => Ty::Bool,
            "" => Ty::Value,
            other => return Err(format!("{name}: unknown schema type {other:?}")),
        })
    }

    /// An array's element or a map's value: int-or-string there is kept as JSON (k8s-openapi
    /// gives `IntOrString` no schema to derive from in a container).
    fn element(&mut self, schema: &Schema, name: &str) -> Result<Ty, String> {
        Ok(match self.ty(schema, name)? {
            Ty::IntOrString => Ty::Value,
            other => other,
        })
    }

    /// A struct for an object schema with properties.
    fn object(&mut self, schema: &Schema, name: &str) -> Result<Ident, String> {
        let ident = self.unique(name);
        // Reserve the place: the struct reads before the types of its fields.
        let slot = self.items.len();
        self.items.push(TokenStream::new());
        let fields = self.fields(schema, &ident.to_string(), false)?;
        let derives = self.struct_derives(fields.all_optional);
        let body = fields.tokens;
        let doc = doc_attrs(schema.description.as_deref(), None);
        let (serde_crate, schemars_crate) = (self.path("serde"), self.path("schemars"));
        self.items[slot] = quote! {
            #doc
            #[derive(#derives)]
            #[serde(crate = #serde_crate)]
            #[schemars(crate = #schemars_crate)]
            pub struct #ident #body
        };
        Ok(ident)
    }

    /// The braced fields of an object schema. `force_struct` adds the flattened map of unknown
    /// fields even without `x-kubernetes-preserve-unknown-fields` when there are no properties
    /// (a spec must be a struct).
    fn fields(&mut self, schema: &Schema, owner: &str, force_struct: bool) -> Result<Fields, String> {
        let mut taken = BTreeSet::new();
        let mut fields = Vec::new();
        let mut all_optional = true;
        for (json, property) in &schema.properties {
            let ty = self.ty(property, &format!("{owner}{}", pascal(json)))?;
            let required = schema.required.iter().any(|r| r == json);
            let optional = !required || property.nullable;
            all_optional &= optional;
            let ident = field_ident(json, &mut taken);
            let mut serde_args = Vec::new();
            if ident.to_string().trim_start_matches("r#") != json {
                serde_args.push(quote!(rename = #json));
            }
            if optional {
                serde_args.push(quote!(default));
                if !required {
                    serde_args.push(quote!(skip_serializing_if = "Option::is_none"));
                }
            }
            let serde_attr = if serde_args.is_empty() {
                TokenStream::new()
            } else {
                quote!(#[serde(#(#serde_args),*)])
            };
            let schemars_attr = if ty == Ty::IntOrString {
                let with = self.path(if optional {
                    "__codegen::optional_int_or_string_schema"
                } else {
                    "__codegen::int_or_string_schema"
                });
                quote!(#[schemars(schema_with = #with)])
            } else {
                TokenStream::new()
            };
            let mut ty_tokens = self.tokens(&ty);
            if optional {
                ty_tokens = quote!(::core::option::Option<#ty_tokens>);
            }
            let doc = doc_attrs(property.description.as_deref(), property.default.as_ref());
            fields.push(quote! {
                #doc
                #serde_attr
                #schemars_attr
                pub #ident: #ty_tokens
            });
        }
        let keeps_unknown = schema.preserve_unknown_fields || (force_struct && schema.properties.is_empty());
        if keeps_unknown {
            let values = match (&schema.additional_properties, schema.properties.is_empty()) {
                (Some(AdditionalProperties::Schema(values)), true) => self.element(values, &format!("{owner}Value"))?,
                _ => Ty::Value,
            };
            let values = self.tokens(&values);
            let ident = field_ident("extra", &mut taken);
            fields.push(quote! {
                /// Fields the schema does not name, kept as the server sent them.
                #[serde(flatten)]
                pub #ident: ::std::collections::BTreeMap<::std::string::String, #values>
            });
        }
        Ok(Fields {
            tokens: quote!({ #(#fields),* }),
            all_optional,
        })
    }

    /// An enum for a string schema with an `enum` of strings.
    fn enumeration(&mut self, schema: &Schema, name: &str, values: &[String]) -> Ident {
        let ident = self.unique(name);
        let mut taken = BTreeSet::new();
        let variants = values.iter().map(|value| {
            let base = if value.is_empty() {
                "Empty".to_string()
            } else {
                type_ident(value)
            };
            let mut variant = base.clone();
            let mut n = 2;
            while !taken.insert(variant.clone()) {
                variant = format!("{base}{n}");
                n += 1;
            }
            let variant = format_ident!("{}", variant);
            quote! {
                #[serde(rename = #value)]
                #variant
            }
        });
        let doc = doc_attrs(schema.description.as_deref(), None);
        let krate = &self.krate;
        let (serde_crate, schemars_crate) = (self.path("serde"), self.path("schemars"));
        self.items.push(quote! {
            #doc
            #[derive(
                #krate::serde::Serialize,
                #krate::serde::Deserialize,
                ::core::clone::Clone,
                ::core::marker::Copy,
                ::core::fmt::Debug,
                ::core::cmp::PartialEq,
                ::core::cmp::Eq,
                ::core::hash::Hash,
                #krate::schemars::JsonSchema
            )]
            #[serde(crate = #serde_crate)]
            #[schemars(crate = #schemars_crate)]
            pub enum #ident {
                #(#variants),*
            }
        });
        ident
    }
}

/// The values of a string enum, when every value is a string (`null` aside).
fn string_enum(schema: &Schema) -> Option<Vec<String>> {
    let values = schema.enum_.as_ref()?;
    let mut out = Vec::new();
    for value in values {
        match value {
            serde_json::Value::String(s) => {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            }
            serde_json::Value::Null => {}
            _ => return None,
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Doc attributes from a schema description (and default), made safe for rustdoc: lines are
/// trimmed (an indented line would be a code block, and so a doctest) and code fences are
/// marked `text`.
fn doc_attrs(description: Option<&str>, default: Option<&serde_json::Value>) -> TokenStream {
    let mut lines: Vec<String> = Vec::new();
    let mut in_fence = false;
    for line in description.unwrap_or_default().lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("```") {
            lines.push(if in_fence {
                "```".to_string()
            } else {
                format!("```text{}", rest.trim_start_matches(char::is_alphanumeric))
            });
            in_fence = !in_fence;
        } else {
            lines.push(line.to_string());
        }
    }
    if in_fence {
        lines.push("```".to_string());
    }
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    if let Some(default) = default {
        if !lines.is_empty() {
            lines.push(String::new());
        }
        lines.push(format!("Defaults to `{default}` on the server."));
    }
    let lines = lines.into_iter().map(|l| format!(" {l}"));
    quote!(#(#[doc = #lines])*)
}

#[cfg(test)]
mod tests;
