//! Token generation for typed informers and listers, shared by `#[derive(Informer)]` and
//! `cargo xtask codegen`, so that derived and generated code are the same code.
//!
//! Where it sits: at compile time, above the data path. For a resource type `Foo` it emits
//! `FooInformer` (a handle on the factory's shared `SharedIndexInformer<Foo>`), `FooLister`
//! (list/get from the informer's cache) and, for namespaced resources, `FooNamespaceLister`
//! served from the namespace index.
//!
//! - [`ResourceDesc::from_derive_input`] reads a derive input in either form: a spec struct
//!   carrying kube's `#[kube(group, version, kind, namespaced, plural)]` (the code is then for
//!   the root type kube generates, named by `kind`), or a hand-written resource type with
//!   `#[informer(group, version, kind, plural, namespaced)]`.
//! - [`generate`] turns a description into tokens; [`generate_group_accessors`] emits
//!   client-go style `factory.apps().v1().deployments()` accessors for `cargo xtask codegen`.
//!
//! ```
//! let input: syn::DeriveInput = syn::parse_quote! {
//!     #[informer(group = "example.com", version = "v1", kind = "Foo", namespaced)]
//!     struct Foo { metadata: ObjectMeta }
//! };
//! let desc = informer_codegen::ResourceDesc::from_derive_input(&input).unwrap();
//! assert_eq!(desc.plural, "foos");
//! let code = informer_codegen::pretty(informer_codegen::generate(&desc));
//! assert!(code.contains("pub struct FooInformer"));
//! ```

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, LitStr, Path};

/// Everything the generator needs to know about one resource type.
#[derive(Debug, Clone)]
pub struct ResourceDesc {
    /// The Rust type the informer is for (a path, e.g. `Foo` or `::k8s_openapi::api::core::v1::Pod`).
    pub ty: Path,
    /// The type's name, which prefixes the generated names (`Foo` → `FooInformer`).
    pub name: Ident,
    /// API group (`""` for core).
    pub group: String,
    /// API version (`v1`).
    pub version: String,
    /// Kind (`Foo`).
    pub kind: String,
    /// Plural resource name (`foos`), used for the namespace lister accessor.
    pub plural: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// The path generated code uses to reach kinformer (`::kinformer` by default).
    pub krate: Path,
    /// Whether to emit `impl Foo { pub fn informer(..) }` (not possible for foreign types).
    pub inherent_impl: bool,
}

/// The default plural of a kind, kube-derive's rule (so the accessor matches the CRD's plural):
/// lowercase; after `s`, `x`, `z`, `ch`, `sh` add `es`; consonant + `y` → `ies`; else add `s`.
/// Irregular plurals are given with `plural = "..."`.
pub fn default_plural(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with(['s', 'x', 'z']) || lower.ends_with("ch") || lower.ends_with("sh") {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

/// An identifier for a generated name taken from data (a plural, an API version), raw if it
/// is a keyword (`r#type`) so any resource name yields valid code.
fn ident(name: &str) -> Ident {
    let name = name.replace(['.', '-'], "_");
    match syn::parse_str::<Ident>(&name) {
        Ok(ident) => ident,
        Err(_) => Ident::new_raw(&name, Span::call_site()),
    }
}

#[derive(Default)]
struct Attrs {
    group: Option<String>,
    version: Option<String>,
    kind: Option<LitStr>,
    plural: Option<String>,
    namespaced: bool,
    krate: Option<Path>,
}

/// Skips the value of a `key = value` or `key(...)` meta item we do not own.
fn skip_value(meta: &syn::meta::ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        let _: syn::Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _: proc_macro2::TokenTree = meta.input.parse()?;
    }
    Ok(())
}

impl ResourceDesc {
    /// Reads a derive input in either form (see the crate docs). Errors carry spans: missing
    /// kind, an enum or tuple struct, an unknown `#[informer]` key.
    pub fn from_derive_input(input: &DeriveInput) -> syn::Result<Self> {
        match &input.data {
            Data::Struct(data) => {
                if let Fields::Unnamed(fields) = &data.fields {
                    return Err(syn::Error::new(
                        fields.span(),
                        "#[derive(Informer)] needs a struct with named fields, not a tuple struct",
                    ));
                }
            }
            Data::Enum(data) => {
                return Err(syn::Error::new(
                    data.enum_token.span,
                    "#[derive(Informer)] works on structs (a resource or a CustomResource spec), not enums",
                ));
            }
            Data::Union(data) => {
                return Err(syn::Error::new(
                    data.union_token.span,
                    "#[derive(Informer)] works on structs, not unions",
                ));
            }
        }

        if let Some(param) = input.generics.params.first() {
            return Err(syn::Error::new(
                param.span(),
                "#[derive(Informer)] does not support generic types: an informer is for one concrete resource type",
            ));
        }

        let mut attrs = Attrs::default();
        let mut from_kube = false;
        for attr in &input.attrs {
            if attr.path().is_ident("kube") {
                from_kube = true;
                attr.parse_nested_meta(|meta| {
                    let key = meta.path.get_ident().map(Ident::to_string).unwrap_or_default();
                    match key.as_str() {
                        "group" => attrs.group = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "version" => attrs.version = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "kind" => attrs.kind = Some(meta.value()?.parse::<LitStr>()?),
                        "plural" => attrs.plural = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "namespaced" => attrs.namespaced = true,
                        // The rest of kube's keys (status, shortname, derive, printcolumn, ...)
                        // are kube-derive's business.
                        _ => skip_value(&meta)?,
                    }
                    Ok(())
                })?;
            }
        }
        for attr in &input.attrs {
            if attr.path().is_ident("informer") {
                attr.parse_nested_meta(|meta| {
                    let key = meta.path.get_ident().map(Ident::to_string).unwrap_or_default();
                    match key.as_str() {
                        "group" => attrs.group = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "version" => attrs.version = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "kind" => attrs.kind = Some(meta.value()?.parse::<LitStr>()?),
                        "plural" => attrs.plural = Some(meta.value()?.parse::<LitStr>()?.value()),
                        "namespaced" => attrs.namespaced = true,
                        "crate" => attrs.krate = Some(meta.value()?.parse::<LitStr>()?.parse::<Path>()?),
                        _ => {
                            return Err(meta.error(format!(
                                "unknown informer attribute `{key}`; expected one of: group, version, kind, plural, namespaced, crate"
                            )));
                        }
                    }
                    Ok(())
                })?;
            }
        }

        let Some(kind) = attrs.kind else {
            return Err(syn::Error::new(
                input.ident.span(),
                "#[derive(Informer)] needs a kind: add #[informer(kind = \"...\")] (or #[kube(kind = \"...\")] next to CustomResource)",
            ));
        };
        let kind_value = kind.value();
        // Next to CustomResource the derive sits on the spec struct; the resource is the root
        // type kube generates, named after the kind.
        let name = if from_kube {
            let mut name = syn::parse_str::<Ident>(&kind_value)
                .map_err(|_| syn::Error::new(kind.span(), format!("kind \"{kind_value}\" is not a Rust type name")))?;
            name.set_span(kind.span());
            name
        } else {
            if input.ident != kind_value {
                return Err(syn::Error::new(
                    kind.span(),
                    format!("kind \"{kind_value}\" must match the type's name `{}`", input.ident),
                ));
            }
            input.ident.clone()
        };
        let Some(version) = attrs.version else {
            return Err(syn::Error::new(
                input.ident.span(),
                "#[derive(Informer)] needs a version: add #[informer(version = \"v1\")] (or #[kube(version = \"...\")])",
            ));
        };
        Ok(ResourceDesc {
            ty: name.clone().into(),
            plural: attrs.plural.unwrap_or_else(|| default_plural(&kind_value)),
            name,
            group: attrs.group.unwrap_or_default(),
            version,
            kind: kind_value,
            namespaced: attrs.namespaced,
            krate: attrs.krate.unwrap_or_else(|| syn::parse_quote!(::kinformer)),
            inherent_impl: true,
        })
    }
}

impl ResourceDesc {
    /// Reads one line of `cargo xtask codegen`'s resource table:
    /// `group version Kind plural namespaced|cluster type::path` (the core group as `core`).
    /// Generated code reaches kinformer through `krate`.
    pub fn from_table_line(line: &str, krate: Path) -> Result<Self, String> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [group, version, kind, plural, scope, ty] = fields[..] else {
            return Err(format!("expected 6 fields, got {}", fields.len()));
        };
        let namespaced = match scope {
            "namespaced" => true,
            "cluster" => false,
            other => return Err(format!("scope must be namespaced or cluster, not {other}")),
        };
        let ty: Path = syn::parse_str(ty).map_err(|e| format!("type path {ty}: {e}"))?;
        let name = syn::parse_str::<Ident>(kind).map_err(|e| format!("kind {kind}: {e}"))?;
        Ok(ResourceDesc {
            ty,
            name,
            group: if group == "core" {
                String::new()
            } else {
                group.to_string()
            },
            version: version.to_string(),
            kind: kind.to_string(),
            plural: plural.to_string(),
            namespaced,
            krate,
            inherent_impl: false,
        })
    }
}

/// Generates `FooInformer`, `FooLister` (and `FooNamespaceLister`) for one resource.
pub fn generate(desc: &ResourceDesc) -> TokenStream {
    let ResourceDesc {
        ty, name, krate, kind, ..
    } = desc;
    let informer = format_ident!("{}Informer", name);
    let lister = format_ident!("{}Lister", name);
    let namespace_lister = format_ident!("{}NamespaceLister", name);
    let api_version = if desc.group.is_empty() {
        desc.version.clone()
    } else {
        format!("{}/{}", desc.group, desc.version)
    };
    let informer_doc = format!(" The shared informer of `{api_version}` `{kind}`, from a `SharedInformerFactory`.");
    let lister_doc = format!(" Lists and gets `{kind}` objects from the informer's cache.");

    let scoped = if desc.namespaced {
        let accessor = ident(&desc.plural);
        let ns_doc = format!(" Lists and gets the `{kind}` objects of one namespace from the informer's cache.");
        let accessor_doc = format!(" The `{kind}` objects of `namespace`, served from the namespace index.");
        quote! {
            impl #lister {
                #[doc = #accessor_doc]
                pub fn #accessor(&self, namespace: &str) -> #namespace_lister {
                    #namespace_lister { lister: self.lister.namespaced(namespace) }
                }
            }

            #[doc = #ns_doc]
            pub struct #namespace_lister {
                lister: #krate::cache::NamespaceLister<#ty>,
            }

            impl #namespace_lister {
                /// Objects of this namespace matching `selector`.
                pub fn list(&self, selector: &#krate::cache::Selector) -> ::std::vec::Vec<::std::sync::Arc<#ty>> {
                    self.lister.list(selector)
                }

                /// The object of this namespace named `name`, if cached.
                pub fn get(&self, name: &str) -> ::core::option::Option<::std::sync::Arc<#ty>> {
                    self.lister.get(name)
                }
            }
        }
    } else {
        quote! {
            impl #lister {
                /// The object named `name`, if cached.
                pub fn get(&self, name: &str) -> ::core::option::Option<::std::sync::Arc<#ty>> {
                    self.lister.get(name)
                }
            }
        }
    };

    let inherent = if desc.inherent_impl {
        let doc = format!(" The shared `{kind}` informer of `factory` (the same one `informer_for` returns).");
        quote! {
            impl #ty {
                #[doc = #doc]
                pub fn informer(
                    factory: &#krate::factory::SharedInformerFactory,
                ) -> ::core::result::Result<#informer, #krate::factory::FactoryError> {
                    #informer::new(factory)
                }
            }
        }
    } else {
        TokenStream::new()
    };

    quote! {
        #[doc = #informer_doc]
        #[derive(::core::clone::Clone)]
        pub struct #informer {
            informer: #krate::cache::SharedIndexInformer<#ty>,
        }

        impl #informer {
            /// The factory's shared informer for this type, created on first use.
            pub fn new(
                factory: &#krate::factory::SharedInformerFactory,
            ) -> ::core::result::Result<Self, #krate::factory::FactoryError> {
                ::core::result::Result::Ok(Self { informer: factory.informer_for::<#ty>()? })
            }

            /// The underlying shared informer.
            pub fn informer(&self) -> &#krate::cache::SharedIndexInformer<#ty> {
                &self.informer
            }

            /// A lister over the informer's cache.
            pub fn lister(&self) -> #lister {
                #lister { lister: #krate::cache::Lister::new(self.informer.indexer().clone()) }
            }

            /// Adds an event handler to the shared informer.
            pub fn add_event_handler(
                &self,
                handler: impl #krate::cache::ResourceEventHandler<#ty>,
            ) -> ::core::result::Result<
                #krate::cache::ResourceEventHandlerRegistration<#ty>,
                #krate::cache::InformerError,
            > {
                self.informer.add_event_handler(handler)
            }

            /// Whether the informer's cache has synced.
            pub fn has_synced(&self) -> bool {
                self.informer.has_synced()
            }
        }

        #[doc = #lister_doc]
        #[derive(::core::clone::Clone)]
        pub struct #lister {
            lister: #krate::cache::Lister<#ty>,
        }

        impl #lister {
            /// Every cached object matching `selector`.
            pub fn list(&self, selector: &#krate::cache::Selector) -> ::std::vec::Vec<::std::sync::Arc<#ty>> {
                self.lister.list(selector)
            }
        }

        #scoped

        #inherent
    }
}

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

/// Formats generated tokens as Rust source (prettyplease), for snapshots and checked-in files.
pub fn pretty(tokens: TokenStream) -> String {
    match syn::parse2::<syn::File>(tokens.clone()) {
        Ok(file) => prettyplease::unparse(&file),
        Err(_) => tokens.to_string(),
    }
}
