//! The client-go style accessors `cargo xtask codegen` writes into the factory crate:
//! `factory.apps()` → `apps::Group`, `.v1()` → `apps::v1::Version`, `.deployments()` →
//! `DeploymentInformer`, with each group's informer and lister types beside them.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::Path;

use crate::ResourceDesc;
use crate::generate::{generate, ident};

/// The module name for an API group: its first DNS label, or `core` for the core group.
pub fn group_module(group: &str) -> String {
    if group.is_empty() {
        "core".to_string()
    } else {
        group.split('.').next().unwrap_or(group).replace('-', "_")
    }
}

/// Generates one group's module body for `cargo xtask codegen`: per version a `Version`
/// accessor struct with one method per resource (`pods()`), plus each resource's informer and
/// lister types, and the group's `Group` accessor. `factory` is the path of the factory type.
pub fn generate_group(group: &str, resources: &[ResourceDesc], factory: &Path) -> TokenStream {
    let group_doc = if group.is_empty() {
        " Informers of the core API group.".to_string()
    } else {
        format!(" Informers of the `{group}` API group.")
    };
    let mut versions: Vec<&str> = resources.iter().map(|r| r.version.as_str()).collect();
    versions.sort();
    versions.dedup();
    let version_mods = versions.iter().map(|version| {
        let module = ident(version);
        let in_version: Vec<&ResourceDesc> = resources.iter().filter(|r| r.version == *version).collect();
        let types = in_version.iter().map(|r| generate(r));
        let accessors = in_version.iter().map(|r| {
            let method = ident(&r.plural);
            let informer = format_ident!("{}Informer", r.name);
            let krate = &r.krate;
            let doc = format!(" The shared informer of `{}`.", r.kind);
            quote! {
                #[doc = #doc]
                #[inline]
                pub fn #method(&self) -> ::core::result::Result<#informer, #krate::factory::FactoryError> {
                    #informer::new(self.factory)
                }
            }
        });
        let version_doc = format!(" Informers of version `{version}`.");
        quote! {
            #[doc = #version_doc]
            pub mod #module {
                #[doc = #version_doc]
                #[derive(Clone, Copy)]
                pub struct Version<'a> {
                    pub(crate) factory: &'a #factory,
                }

                impl Version<'_> {
                    #(#accessors)*
                }

                #(#types)*
            }
        }
    });
    let version_accessors = versions.iter().map(|version| {
        let module = ident(version);
        let doc = format!(" Informers of version `{version}`.");
        quote! {
            #[doc = #doc]
            pub fn #module(&self) -> #module::Version<'a> {
                #module::Version { factory: self.factory }
            }
        }
    });
    quote! {
        #[doc = #group_doc]
        #[derive(Clone, Copy)]
        pub struct Group<'a> {
            pub(crate) factory: &'a #factory,
        }

        impl<'a> Group<'a> {
            #(#version_accessors)*
        }

        #(#version_mods)*
    }
}

/// Generates the `impl SharedInformerFactory { pub fn core(&self) .. }` group accessors.
pub fn generate_group_accessors(groups: &[String], factory: &Path) -> TokenStream {
    let methods = groups.iter().map(|group| {
        let module = ident(&group_module(group));
        let doc = if group.is_empty() {
            " Informers of the core API group (`factory.core().v1().pods()`).".to_string()
        } else {
            format!(" Informers of the `{group}` API group.")
        };
        quote! {
            #[doc = #doc]
            pub fn #module(&self) -> #module::Group<'_> {
                #module::Group { factory: self }
            }
        }
    });
    quote! {
        impl #factory {
            #(#methods)*
        }
    }
}
