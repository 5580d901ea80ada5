//! The expansion of `#[kinformer::resource(...)]` (the attribute lives in informer-derive,
//! which calls [`resource_attribute`]).
//!
//! A crate that depends on kinformer alone derives kube's `CustomResource` through kinformer's
//! copies of kube's crates, which kube-derive needs to be told about in a
//! `#[kube(crates(kube_core = …, k8s_openapi = …, serde_json = …))]` block. The attribute writes
//! that block, the `CustomResource` and `Informer` derives, and passes its own arguments on as
//! `#[kube(...)]`:
//!
//! ```ignore
//! #[kinformer::resource(group = "example.com", version = "v1", kind = "Greeting", namespaced)]
//! #[derive(Serialize, Deserialize, Clone, Debug, JsonSchema)]
//! pub struct GreetingSpec { message: String }
//! // is
//! #[derive(::kinformer::kube::CustomResource, ::kinformer::Informer)]
//! #[kube(group = "example.com", version = "v1", kind = "Greeting", namespaced)]
//! #[kube(crates(kube_core = "::kinformer::kube::core", k8s_openapi = "::kinformer::k8s_openapi",
//!     serde_json = "::kinformer::serde_json"))]
//! #[derive(Serialize, Deserialize, Clone, Debug, JsonSchema)]
//! pub struct GreetingSpec { message: String }
//! ```
//!
//! Every key of kube's `#[kube(...)]` works as an argument (`status`, `shortname`,
//! `printcolumn`, …), and more `#[kube(...)]` lines may follow. `crate = "path"` (a kinformer
//! renamed in Cargo.toml) is the attribute's own: it moves every path above.

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Item, LitStr, Meta, Path, Token};

/// Expands `#[kinformer::resource(args)]` on `item` (see the [module docs](self)); a compile
/// error, pointing at what is wrong, if the arguments do not parse or `item` is not a struct.
pub fn resource_attribute(args: TokenStream, item: TokenStream) -> TokenStream {
    match expand(args, item) {
        Ok(tokens) => tokens,
        Err(error) => error.to_compile_error(),
    }
}

fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let item: Item = syn::parse2(item)?;
    if !matches!(item, Item::Struct(_)) {
        return Err(syn::Error::new_spanned(
            &item,
            "#[kinformer::resource] goes on a custom resource's spec struct",
        ));
    }
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(args)?;
    let mut krate: Option<(Path, String)> = None;
    let mut kube_args = Vec::new();
    for meta in metas {
        match &meta {
            Meta::NameValue(nv) if nv.path.is_ident("crate") => {
                let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(lit),
                    ..
                }) = &nv.value
                else {
                    return Err(syn::Error::new_spanned(
                        &nv.value,
                        "crate = \"...\" takes the path kinformer is known by, as a string",
                    ));
                };
                krate = Some((lit.parse::<Path>()?, lit.value()));
            }
            _ => kube_args.push(meta),
        }
    }
    if kube_args.is_empty() {
        return Err(syn::Error::new(
            proc_macro2::Span::call_site(),
            "#[kinformer::resource] takes kube's keys: group = \"...\", version = \"...\", kind = \"...\" (and namespaced, status, ...)",
        ));
    }
    let (path, prefix) = krate.unwrap_or_else(|| (syn::parse_quote!(::kinformer), "::kinformer".to_string()));
    let crate_path = |tail: &str| LitStr::new(&format!("{prefix}::{tail}"), proc_macro2::Span::call_site());
    let (kube_core, k8s_openapi, serde_json) = (
        crate_path("kube::core"),
        crate_path("k8s_openapi"),
        crate_path("serde_json"),
    );
    let informer_crate = (prefix != "::kinformer").then(|| {
        let prefix = LitStr::new(&prefix, proc_macro2::Span::call_site());
        quote!(#[informer(crate = #prefix)])
    });
    Ok(quote! {
        #[derive(#path::kube::CustomResource, #path::Informer)]
        #[kube(#(#kube_args),*)]
        #[kube(crates(kube_core = #kube_core, k8s_openapi = #k8s_openapi, serde_json = #serde_json))]
        #informer_crate
        #item
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(args: &str, item: &str) -> String {
        resource_attribute(args.parse().unwrap(), item.parse().unwrap()).to_string()
    }

    #[test]
    fn writes_the_derives_the_crates_block_and_passes_kubes_keys_on() {
        let out = expanded(
            r#"group = "example.com", version = "v1", kind = "Greeting", namespaced, shortname = "gr""#,
            "#[derive(Clone)] pub struct GreetingSpec { message: String }",
        );
        let want = quote! {
            #[derive(::kinformer::kube::CustomResource, ::kinformer::Informer)]
            #[kube(group = "example.com", version = "v1", kind = "Greeting", namespaced, shortname = "gr")]
            #[kube(crates(kube_core = "::kinformer::kube::core", k8s_openapi = "::kinformer::k8s_openapi", serde_json = "::kinformer::serde_json"))]
            #[derive(Clone)] pub struct GreetingSpec { message: String }
        };
        assert_eq!(out, want.to_string());
    }

    #[test]
    fn a_renamed_kinformer_moves_every_path() {
        let out = expanded(
            r#"crate = "my::kin", group = "g", version = "v1", kind = "K""#,
            "struct KSpec {}",
        );
        assert!(
            out.contains("# [derive (my :: kin :: kube :: CustomResource , my :: kin :: Informer)]"),
            "{out}"
        );
        assert!(out.contains(r#"kube_core = "my::kin::kube::core""#), "{out}");
        assert!(out.contains(r#"# [informer (crate = "my::kin")]"#), "{out}");
        assert!(
            !out.contains("crate = \"my::kin\" ,"),
            "crate is not passed to kube: {out}"
        );
    }

    #[test]
    fn refuses_what_is_not_a_struct_and_missing_keys() {
        assert!(expanded(r#"kind = "K""#, "enum K {}").contains("goes on a custom resource's spec struct"));
        assert!(expanded("", "struct KSpec {}").contains("takes kube's keys"));
        assert!(expanded(r#"crate = my::kin, kind = "K""#, "struct KSpec {}").contains("as a string"));
    }
}
