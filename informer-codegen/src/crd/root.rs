//! The root type of a custom resource version (`Certificate`): the object the server stores,
//! with its `metadata`, its `spec`, its `status` (when the version has a status subresource),
//! every other top-level field the schema declares, and the top-level fields it does not
//! declare, so that a write built from a cached object never erases what the server holds.
//!
//! kube's `CustomResource` derive makes a root of `metadata`, `spec` and `status` alone, so the
//! generator writes the root itself: the struct, its serde impls (`apiVersion` and `kind`
//! written first, as kube's derive and k8s-openapi do, and ignored when read), `kube::Resource`,
//! `HasSpec`/`HasStatus` where they apply, `new`, and `CustomResourceExt` whose `crd()` is the
//! CRD document the code was generated from.

use std::cmp::Ordering;

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Ident, Path};

use super::Field;
use super::schema::{Crd, CrdVersion};
use crate::generate::{ResourceNames, kube_resource_impl};

/// The name of the private constant holding the CRD document as JSON, one per generated file.
pub(super) const CRD_JSON: &str = "CUSTOM_RESOURCE_DEFINITION_JSON";

/// A root field with a type of its own (`spec`, `status`).
pub(super) struct Part {
    /// The field's Rust type (`CertificateSpec`).
    pub ty: TokenStream,
    /// Its doc attributes.
    pub doc: TokenStream,
    /// The type implements `Default`.
    pub default: bool,
}

/// What [`root_type`] needs to know about one version's root.
pub(super) struct Root<'a> {
    pub crd: &'a Crd,
    pub version: &'a CrdVersion,
    pub krate: &'a Path,
    pub ident: &'a Ident,
    pub namespaced: bool,
    /// The root schema's description.
    pub description: Option<&'a str>,
    /// `spec`, when the schema has one.
    pub spec: Option<Part>,
    /// `status`, when the version has a status subresource and the schema a status.
    pub status: Option<Part>,
    /// The other top-level fields, the map of undeclared ones last.
    pub fields: &'a [Field],
    /// The field holding the undeclared top-level fields (`extra`).
    pub unknown: &'a Ident,
    /// Every one of `fields` is optional.
    pub fields_optional: bool,
}

/// The root struct and its impls.
pub(super) fn root_type(root: &Root) -> TokenStream {
    let Root {
        crd,
        version,
        krate,
        ident,
        namespaced,
        ..
    } = *root;
    let object_meta = quote!(#krate::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta);
    let serde_crate = format!("{}::serde", quote!(#krate).to_string().replace(' ', ""));
    let remote = ident.to_string();
    let group = &crd.spec.group;
    let version_name = &version.name;
    let kind = &crd.spec.names.kind;
    let plural = &crd.spec.names.plural;
    let api_version = format!("{group}/{version_name}");

    // The public struct: docs and declarations. The serde mirror below: attributes and
    // declarations (serde's `remote` derive on a private twin, so the public type's serde
    // impls can write `apiVersion` and `kind` around the derived code).
    let mut public = vec![quote! {
        /// Standard object metadata.
        pub metadata: #object_meta
    }];
    let mut mirror = vec![quote! {
        #[serde(default)]
        pub metadata: #object_meta
    }];
    let mut idents = vec![quote!(metadata)];
    if let Some(Part { ty, doc, default }) = &root.spec {
        public.push(quote! { #doc pub spec: #ty });
        let attr = if *default {
            quote!(#[serde(default)])
        } else {
            TokenStream::new()
        };
        mirror.push(quote! { #attr pub spec: #ty });
    }
    if let Some(Part { ty, doc, .. }) = &root.status {
        public.push(quote! { #doc pub status: ::core::option::Option<#ty> });
        mirror.push(quote! {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub status: ::core::option::Option<#ty>
        });
    }
    for field in root.fields {
        let Field { doc, serde, decl, .. } = field;
        public.push(quote! { #doc #decl });
        mirror.push(quote! { #serde #decl });
        let ident = &field.ident;
        idents.push(quote!(#ident));
    }
    let unknown = root.unknown;

    let default = root.fields_optional && root.spec.as_ref().is_none_or(|s| s.default);
    let derives = if default {
        quote!(
            ::core::clone::Clone,
            ::core::fmt::Debug,
            ::core::cmp::PartialEq,
            ::core::default::Default
        )
    } else {
        quote!(::core::clone::Clone, ::core::fmt::Debug, ::core::cmp::PartialEq)
    };
    let deprecated = version.deprecated.then(|| {
        let note = version
            .deprecation_warning
            .clone()
            .unwrap_or_else(|| default_deprecation_warning(crd, version_name));
        quote!(#[deprecated(note = #note)])
    });
    let doc = root_doc(root);

    let scope = if namespaced {
        quote!(#krate::k8s_openapi::NamespaceResourceScope)
    } else {
        quote!(#krate::k8s_openapi::ClusterResourceScope)
    };
    let resource = kube_resource_impl(
        krate,
        ident,
        &scope,
        ResourceNames {
            kind,
            group,
            version: version_name,
            api_version: &api_version,
            plural,
        },
    );
    let has_spec = root.spec.as_ref().map(|Part { ty, .. }| {
        quote! {
            impl #krate::kube::core::object::HasSpec for #ident {
                type Spec = #ty;
                fn spec(&self) -> &#ty {
                    &self.spec
                }
                fn spec_mut(&mut self) -> &mut #ty {
                    &mut self.spec
                }
            }
        }
    });
    let has_status = root.status.as_ref().map(|Part { ty, .. }| {
        quote! {
            impl #krate::kube::core::object::HasStatus for #ident {
                type Status = #ty;
                fn status(&self) -> ::core::option::Option<&#ty> {
                    self.status.as_ref()
                }
                fn status_mut(&mut self) -> &mut ::core::option::Option<#ty> {
                    &mut self.status
                }
            }
        }
    });
    // `new` as kube's derive has it, when nothing but the spec is required.
    let new = root.fields_optional.then(|| {
        let (param, init, what) = match &root.spec {
            Some(Part { ty, .. }) => (
                quote!(, spec: #ty),
                quote!(spec,),
                format!(" A `{kind}` named `name` with `spec`"),
            ),
            None => (
                TokenStream::new(),
                TokenStream::new(),
                format!(" A `{kind}` named `name`"),
            ),
        };
        let status = root
            .status
            .as_ref()
            .map(|_| quote!(status: ::core::option::Option::None,));
        let others = idents[1..].iter();
        let doc = format!("{what}: no namespace, no status, no other field.");
        quote! {
            impl #ident {
                #[doc = #doc]
                pub fn new(name: &str #param) -> Self {
                    Self {
                        metadata: #object_meta {
                            name: ::core::option::Option::Some(::std::string::ToString::to_string(name)),
                            ..::core::default::Default::default()
                        },
                        #init
                        #status
                        #(#others: ::core::default::Default::default(),)*
                    }
                }
            }
        }
    });
    let crd_name = &crd.metadata.name;
    let short_names = &crd.spec.names.short_names;
    let crd_json = quote::format_ident!("{}", CRD_JSON);

    quote! {
        #doc
        #deprecated
        #[derive(#derives)]
        pub struct #ident {
            #(#public),*
        }

        const _: () = {
            #[derive(#krate::serde::Serialize, #krate::serde::Deserialize)]
            #[serde(crate = #serde_crate, remote = #remote)]
            struct __Fields {
                #(#mirror),*
            }
            impl #krate::__codegen::ObjectFields for #ident {
                fn serialize_fields<S: #krate::serde::Serializer>(
                    &self,
                    serializer: S,
                ) -> ::core::result::Result<S::Ok, S::Error> {
                    __Fields::serialize(self, serializer)
                }
            }
            impl #krate::serde::Serialize for #ident {
                fn serialize<S: #krate::serde::Serializer>(
                    &self,
                    serializer: S,
                ) -> ::core::result::Result<S::Ok, S::Error> {
                    #krate::__codegen::serialize_object(self, serializer)
                }
            }
            impl<'de> #krate::serde::Deserialize<'de> for #ident {
                fn deserialize<D: #krate::serde::Deserializer<'de>>(
                    deserializer: D,
                ) -> ::core::result::Result<Self, D::Error> {
                    let mut object = __Fields::deserialize(deserializer)?;
                    #krate::__codegen::drop_type_meta(&mut object.#unknown);
                    ::core::result::Result::Ok(object)
                }
            }
        };

        #resource

        #has_spec
        #has_status

        impl #krate::kube::CustomResourceExt for #ident {
            /// The CRD this type was generated from, as its YAML says (every version, printer
            /// columns, short names, categories, subresources).
            fn crd() -> #krate::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
                #krate::__codegen::custom_resource_definition(super::#crd_json)
            }
            fn crd_name() -> &'static str {
                #crd_name
            }
            fn api_resource() -> #krate::kube::core::ApiResource {
                #krate::kube::core::ApiResource::erase::<Self>(&())
            }
            fn shortnames() -> &'static [&'static str] {
                &[#(#short_names),*]
            }
        }

        #new
    }
}

/// The root type's doc: the schema's description as its own paragraph, then what the CRD
/// declares about the type.
fn root_doc(root: &Root) -> TokenStream {
    let crd = root.crd;
    let description = root.description.map(|d| {
        let lines = super::doc_attrs(Some(d), None);
        quote!(#lines #[doc = ""])
    });
    let mut lines = vec![format!(
        " `{}/{}` `{}`, {}.",
        crd.spec.group,
        root.version.name,
        crd.spec.names.kind,
        if root.namespaced {
            "namespaced"
        } else {
            "cluster-scoped"
        }
    )];
    lines.extend(subresource_lines(root));
    quote! {
        #description
        #(#[doc = #lines])*
    }
}

/// Doc lines on the subresources and the fields kept for unknown top-level names.
fn subresource_lines(root: &Root) -> Vec<String> {
    let mut lines = Vec::new();
    let subresources = root.version.subresources.as_ref();
    if subresources.is_some_and(|s| s.status.is_some()) {
        lines.push(" The status subresource is enabled: `status` is written through `/status`.".to_string());
    }
    if let Some(scale) = subresources.and_then(|s| s.scale.as_ref()) {
        let selector = match &scale.label_selector_path {
            Some(path) => format!(", label selector at `{path}`"),
            None => String::new(),
        };
        lines.push(format!(
            " The scale subresource is enabled: desired replicas at `{}`, observed replicas at `{}`{selector}.",
            scale.spec_replicas_path, scale.status_replicas_path
        ));
    }
    lines.push(format!(
        " Top-level fields this type does not declare are kept in `{}` and written back.",
        root.unknown
    ));
    lines
}

/// kube-apiserver's warning for a deprecated version without a `deprecationWarning`
/// (apiextensions-apiserver's `defaultDeprecationWarning`): `<group>/<version> <Kind> is
/// deprecated`, then `; use <group>/<version> <Kind>` naming the newest served version that is
/// not deprecated and is newer than this one, if there is one.
fn default_deprecation_warning(crd: &Crd, deprecated: &str) -> String {
    let group = &crd.spec.group;
    let kind = &crd.spec.names.kind;
    let mut message = format!("{group}/{deprecated} {kind} is deprecated");
    let newest = crd
        .spec
        .versions
        .iter()
        .filter(|v| v.served && !v.deprecated && compare_kube_aware(deprecated, &v.name) == Ordering::Less)
        .map(|v| v.name.as_str())
        .max_by(|a, b| compare_kube_aware(a, b));
    if let Some(newest) = newest {
        message.push_str(&format!("; use {group}/{newest} {kind}"));
    }
    message
}

/// apimachinery's `CompareKubeAwareVersionStrings`: versions of the form `v<major>`,
/// `v<major>beta<minor>`, `v<major>alpha<minor>` order GA above beta above alpha, then by
/// major, then by minor; any of them is above any other string; other strings order in
/// reverse lexical order.
fn compare_kube_aware(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    match (parse_kube_version(a), parse_kube_version(b)) {
        (None, None) => b.cmp(a),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some((major_a, type_a, minor_a)), Some((major_b, type_b, minor_b))) => type_a
            .cmp(&type_b)
            .then(major_a.cmp(&major_b))
            .then(minor_a.cmp(&minor_b)),
    }
}

/// `(major, type, minor)` of a Kubernetes version, as apimachinery's
/// `^v([\d]+)(?:(alpha|beta)([\d]+))?$` reads it (`v1beta2` → `(1, 1, 2)`; alpha is type 0,
/// beta 1, GA 2 with minor 0).
fn parse_kube_version(version: &str) -> Option<(u64, u8, u64)> {
    let number = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // A number too long for u64 still orders after every shorter one.
        Some(s.parse().unwrap_or(u64::MAX))
    };
    let rest = version.strip_prefix('v')?;
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (major, rest) = rest.split_at(digits);
    let major = number(major)?;
    if rest.is_empty() {
        return Some((major, 2, 0));
    }
    if let Some(minor) = rest.strip_prefix("alpha") {
        Some((major, 0, number(minor)?))
    } else {
        Some((major, 1, number(rest.strip_prefix("beta")?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_kubernetes_compares_them() {
        let mut versions = vec![
            "foo1",
            "v1beta1",
            "v2",
            "v1",
            "v10alpha1",
            "v11alpha2",
            "v1beta2",
            "foo10",
            "v12alpha1",
        ];
        versions.sort_by(|a, b| compare_kube_aware(b, a));
        assert_eq!(
            versions,
            [
                "v2",
                "v1",
                "v1beta2",
                "v1beta1",
                "v12alpha1",
                "v11alpha2",
                "v10alpha1",
                "foo1",
                "foo10"
            ]
        );
    }
}
