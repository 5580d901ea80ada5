//! [`generate_k8s_openapi_compact`]: the `Compact` walk of every k8s-openapi type, and the
//! `InformerResource` of every k8s-openapi resource, from k8s-openapi's own source.
//!
//! Where it sits: at `cargo xtask codegen` time, above the data path. The factory hands each
//! type's `InformerResource::compact` to its list/watch, which runs it on every object right
//! after decoding (informer-core's `compact` module says why: serde leaves spare capacity in
//! every decoded `Vec`, and a cache keeps objects for their lifetime). A walk is emitted per
//! type, never found by a type check at run time.
//!
//! The walk of a struct calls `Compact::compact` on each field whose type can hold a list
//! (`Vec`, a map of such values, another k8s-openapi type, `serde_json::Value`); strings and
//! numbers are left alone (serde_json allocates a string at its length). k8s-openapi is built
//! for one Kubernetes version chosen by the final binary, and a type's fields differ between
//! versions, so every version's source is read: a type whose fields are the same in all of them
//! gets one impl, any other gets one impl per version, inside k8s-openapi's `k8s_if_1_XX!`.

use std::collections::BTreeMap;

use proc_macro2::TokenStream;
use quote::{ToTokens, format_ident, quote};
use syn::{Fields, GenericArgument, Item, PathArguments, Type};

/// One source file of k8s-openapi: the version directory it is in (`v1_33`), its path below
/// that directory (`api/core/v1/pod_spec.rs`) and its text.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// The version directory (`v1_33`).
    pub version: String,
    /// The path below the version directory, `/`-separated.
    pub path: String,
    /// The file's text.
    pub text: String,
}

/// What one version says about one type: how to walk it, and whether it is a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    /// The body of `fn compact(&mut self)`, as text (compared between versions).
    body: String,
    resource: bool,
}

/// Whether a value of `ty` can hold a list (see the module doc).
fn can_hold_a_list(ty: &Type) -> bool {
    let Type::Path(path) = ty else {
        return false;
    };
    let Some(last) = path.path.segments.last() else {
        return false;
    };
    let first = path
        .path
        .segments
        .first()
        .map(|s| s.ident.to_string())
        .unwrap_or_default();
    let args: Vec<&Type> = match &last.arguments {
        PathArguments::AngleBracketed(args) => args
            .args
            .iter()
            .filter_map(|a| match a {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    match last.ident.to_string().as_str() {
        "Vec" => true,
        "Option" | "Box" => args.first().is_some_and(|t| can_hold_a_list(t)),
        "BTreeMap" => args.get(1).is_some_and(|t| can_hold_a_list(t)),
        "String" | "bool" | "i32" | "i64" | "f64" | "u8" | "Timestamp" => false,
        // k8s-openapi's scalars: a string, a time, a number or a string.
        "Quantity" | "Time" | "MicroTime" | "IntOrString" => false,
        "Value" | "ByteString" => true,
        // Another k8s-openapi type: its walk decides (it may be empty).
        _ => first == "crate",
    }
}

/// The walk of one item, `None` for items that are not types to walk.
fn shape(item: &Item) -> Option<(String, TokenStream)> {
    match item {
        Item::Struct(s) if s.generics.params.is_empty() => {
            let calls: Vec<TokenStream> = match &s.fields {
                Fields::Named(fields) => fields
                    .named
                    .iter()
                    .filter(|f| can_hold_a_list(&f.ty))
                    .filter_map(|f| f.ident.as_ref())
                    .map(|name| quote! { crate::Compact::compact(&mut self.#name); })
                    .collect(),
                Fields::Unnamed(fields) => fields
                    .unnamed
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| can_hold_a_list(&f.ty))
                    .map(|(i, _)| {
                        let index = syn::Index::from(i);
                        quote! { crate::Compact::compact(&mut self.#index); }
                    })
                    .collect(),
                Fields::Unit => Vec::new(),
            };
            Some((s.ident.to_string(), quote! { #(#calls)* }))
        }
        Item::Enum(e) if e.generics.params.is_empty() => {
            let mut arms = Vec::new();
            for variant in &e.variants {
                let name = &variant.ident;
                match &variant.fields {
                    Fields::Unit => {}
                    Fields::Unnamed(fields) if fields.unnamed.len() == 1 => {
                        if fields.unnamed.first().is_some_and(|f| can_hold_a_list(&f.ty)) {
                            arms.push(quote! { Self::#name(value) => crate::Compact::compact(value), });
                        }
                    }
                    // No k8s-openapi enum has other variants; one that does is not walked.
                    _ => return Some((e.ident.to_string(), TokenStream::new())),
                }
            }
            if arms.is_empty() {
                return Some((e.ident.to_string(), TokenStream::new()));
            }
            Some((
                e.ident.to_string(),
                quote! {
                    #[allow(unreachable_patterns, clippy::single_match)]
                    match self { #(#arms)* _ => {} }
                },
            ))
        }
        _ => None,
    }
}

/// Generates `impl Compact` for every type of k8s-openapi's `files` and `impl
/// InformerResource` for every resource among them (see the module doc). `versions` are all
/// the version directories read, so a type missing from one is gated.
pub fn generate_k8s_openapi_compact(files: &[SourceFile], versions: &[String]) -> Result<TokenStream, String> {
    // type path → version → shape
    let mut types: BTreeMap<String, BTreeMap<String, Shape>> = BTreeMap::new();
    for file in files {
        let Some(module) = file.path.strip_suffix(".rs") else {
            continue;
        };
        if module.ends_with("mod") || !module.contains('/') {
            continue;
        }
        let module: Vec<&str> = module.split('/').collect();
        let module_path = module[..module.len() - 1].join("::");
        let parsed = syn::parse_file(&file.text).map_err(|e| format!("{}/{}: {e}", file.version, file.path))?;
        let resources: Vec<String> = parsed
            .items
            .iter()
            .filter_map(|item| match item {
                Item::Impl(i)
                    if i.trait_
                        .as_ref()
                        .is_some_and(|(_, p, _)| p.to_token_stream().to_string() == "crate :: Resource") =>
                {
                    Some(i.self_ty.to_token_stream().to_string())
                }
                _ => None,
            })
            .collect();
        for item in &parsed.items {
            if let Some((name, body)) = shape(item) {
                let shape = Shape {
                    body: body.to_string(),
                    resource: resources.contains(&name),
                };
                types
                    .entry(format!("{module_path}::{name}"))
                    .or_default()
                    .insert(file.version.clone(), shape);
            }
        }
    }
    let mut out = TokenStream::new();
    for (path, by_version) in &types {
        let ty: syn::Path = syn::parse_str(&format!("::k8s_openapi::{path}")).map_err(|e| format!("{path}: {e}"))?;
        let impl_of = |shape: &Shape| -> Result<TokenStream, String> {
            let body: TokenStream = shape.body.parse().map_err(|e| format!("{path}: {e}"))?;
            let resource = if shape.resource {
                quote! {
                    impl crate::InformerResource for #ty {
                        #[inline]
                        fn compact(&mut self) {
                            crate::Compact::compact(self);
                        }
                    }
                }
            } else {
                TokenStream::new()
            };
            Ok(quote! {
                impl crate::Compact for #ty {
                    #[inline]
                    fn compact(&mut self) {
                        #body
                    }
                }
                #resource
            })
        };
        let shapes: Vec<&Shape> = by_version.values().collect();
        let same_everywhere = by_version.len() == versions.len() && shapes.windows(2).all(|w| w[0] == w[1]);
        if same_everywhere {
            out.extend(impl_of(shapes[0])?);
        } else {
            // One impl per run of versions with the same shape: `k8s_if_ge_1_34!` for a type
            // that appeared in 1.34, `k8s_if_le_1_35!` for one that changed after 1.35.
            let mut runs: Vec<(Vec<&String>, &Shape)> = Vec::new();
            for version in versions {
                let shape = by_version.get(version);
                match (runs.last_mut(), shape) {
                    (Some((run, last)), Some(shape))
                        if *last == shape
                            && run.last().is_some_and(|v| {
                                versions.iter().position(|x| x == *v).map(|i| i + 1)
                                    == versions.iter().position(|x| x == version)
                            }) =>
                    {
                        run.push(version)
                    }
                    (_, Some(shape)) => runs.push((vec![version], shape)),
                    (_, None) => {}
                }
            }
            for (run, shape) in runs {
                let number = |v: &str| v.trim_start_matches('v').to_string();
                let (first, last) = (number(run[0]), number(run[run.len() - 1]));
                let gate = if run.len() == 1 {
                    format_ident!("k8s_if_{}", first)
                } else if run[run.len() - 1] == &versions[versions.len() - 1] {
                    format_ident!("k8s_if_ge_{}", first)
                } else if run[0] == &versions[0] {
                    format_ident!("k8s_if_le_{}", last)
                } else {
                    // A run in the middle: one impl per version.
                    for version in run {
                        let gate = format_ident!("k8s_if_{}", number(version));
                        let tokens = impl_of(shape)?;
                        out.extend(quote! { ::k8s_openapi::#gate! { #tokens } });
                    }
                    continue;
                };
                let tokens = impl_of(shape)?;
                out.extend(quote! { ::k8s_openapi::#gate! { #tokens } });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(version: &str, path: &str, text: &str) -> SourceFile {
        SourceFile {
            version: version.into(),
            path: path.into(),
            text: text.into(),
        }
    }

    #[test]
    fn walks_the_fields_that_hold_lists_and_gates_types_that_differ_between_versions() {
        let pod = "pub struct Pod { pub metadata: crate::apimachinery::pkg::apis::meta::v1::ObjectMeta, \
                   pub name: Option<std::string::String>, pub spec: Option<crate::api::core::v1::PodSpec> }\n\
                   impl crate::Resource for Pod {}";
        let spec_33 = "pub struct PodSpec { pub containers: std::vec::Vec<crate::api::core::v1::Container>, \
                       pub labels: Option<std::collections::BTreeMap<std::string::String, std::string::String>> }";
        let spec_34 = "pub struct PodSpec { pub containers: std::vec::Vec<crate::api::core::v1::Container>, \
                       pub gates: Option<std::vec::Vec<std::string::String>> }";
        let files = [
            file("v1_33", "api/core/v1/pod.rs", pod),
            file("v1_34", "api/core/v1/pod.rs", pod),
            file("v1_33", "api/core/v1/pod_spec.rs", spec_33),
            file("v1_34", "api/core/v1/pod_spec.rs", spec_34),
            file("v1_33", "api/core/v1/mod.rs", "pub struct Ignored { pub a: Vec<u8> }"),
        ];
        let versions = ["v1_33".to_string(), "v1_34".to_string()];
        let code = crate::pretty(generate_k8s_openapi_compact(&files, &versions).unwrap());
        assert!(
            code.contains("impl crate::Compact for ::k8s_openapi::api::core::v1::Pod {"),
            "{code}"
        );
        assert!(code.contains("crate::Compact::compact(&mut self.metadata);"), "{code}");
        assert!(code.contains("crate::Compact::compact(&mut self.spec);"), "{code}");
        assert!(!code.contains("self.name"), "strings are not walked: {code}");
        assert!(!code.contains("self.labels"), "maps of strings are not walked: {code}");
        assert!(
            code.contains("impl crate::InformerResource for ::k8s_openapi::api::core::v1::Pod"),
            "{code}"
        );
        assert!(
            !code.contains("InformerResource for ::k8s_openapi::api::core::v1::PodSpec"),
            "{code}"
        );
        assert!(
            code.contains("::k8s_openapi::k8s_if_le_1_33!") || code.contains("::k8s_openapi::k8s_if_1_33!"),
            "{code}"
        );
        assert!(
            code.contains("::k8s_openapi::k8s_if_ge_1_34!") || code.contains("::k8s_openapi::k8s_if_1_34!"),
            "{code}"
        );
        assert!(code.contains("self.gates"), "{code}");
        assert!(!code.contains("Ignored"), "{code}");
    }
}
