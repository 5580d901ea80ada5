//! [`generate`]: a [`ResourceDesc`] to `FooInformer`, `FooLister` and `FooNamespaceLister`
//! tokens. Every path in the output is absolute (`::core::...`, `#krate::...`), so the code
//! means the same in any module, whatever the user's own items are called.
//!
//! Every generated function is `#[inline]`. `FooInformer::new` instantiates the whole generic
//! informer (reflector, DeltaFIFO, indexer, the serde code of `Foo` and its list) for `Foo`; a
//! library's non-generic function is compiled in that library whether anything calls it or
//! not, so a crate of types generated for fifteen CRDs spent seven eighths of its build there.
//! `#[inline]` leaves that work to the crate that calls the function, for the types it uses.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote};
use syn::Ident;

use crate::ResourceDesc;

/// An identifier for a generated name taken from data (a plural, an API version), raw if it
/// is a keyword (`r#type`) so any resource name yields valid code.
pub(crate) fn ident(name: &str) -> Ident {
    let name = name.replace(['.', '-'], "_");
    match syn::parse_str::<Ident>(&name) {
        Ok(ident) => ident,
        Err(_) => Ident::new_raw(&name, Span::call_site()),
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
                #[inline]
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
                #[inline]
                pub fn list(&self, selector: &#krate::cache::Selector) -> ::std::vec::Vec<::std::sync::Arc<#ty>> {
                    self.lister.list(selector)
                }

                /// The object of this namespace named `name`, if cached.
                #[inline]
                pub fn get(&self, name: &str) -> ::core::option::Option<::std::sync::Arc<#ty>> {
                    self.lister.get(name)
                }

                /// The object of this namespace named `name`: cached, present on the server but
                /// undecodable (never taken for deleted), or absent.
                #[inline]
                pub fn lookup(&self, name: &str) -> #krate::cache::Lookup<#ty> {
                    self.lister.lookup(name)
                }
            }
        }
    } else {
        quote! {
            impl #lister {
                /// The object named `name`, if cached.
                #[inline]
                pub fn get(&self, name: &str) -> ::core::option::Option<::std::sync::Arc<#ty>> {
                    self.lister.get(name)
                }

                /// The object named `name`: cached, present on the server but undecodable (never
                /// taken for deleted), or absent.
                #[inline]
                pub fn lookup(&self, name: &str) -> #krate::cache::Lookup<#ty> {
                    self.lister.lookup(name)
                }
            }
        }
    };

    let inherent = if desc.inherent_impl {
        let doc = if desc.projection {
            format!(
                " The shared informer of `factory` of this projection of `{kind}` (the same one `informer_for` returns)."
            )
        } else {
            format!(" The shared `{kind}` informer of `factory` (the same one `informer_for` returns).")
        };
        // A projection has no metadata-only informer of its own: that is the full kind's.
        let metadata_informer = (!desc.projection).then(|| {
            let metadata_doc = format!(
                " The shared metadata-only `{kind}` informer of `factory`: its cache holds each object's \
                 `ObjectMeta` alone (the same one `metadata_informer_for` returns)."
            );
            quote! {
                #[doc = #metadata_doc]
                #[inline]
                pub fn metadata_informer(
                    factory: &#krate::factory::SharedInformerFactory,
                ) -> ::core::result::Result<
                    #krate::cache::SharedIndexInformer<#krate::factory::PartialObjectMeta<#ty>>,
                    #krate::factory::FactoryError,
                > {
                    factory.metadata_informer_for::<#ty>()
                }
            }
        });
        quote! {
            impl #ty {
                #[doc = #doc]
                #[inline]
                pub fn informer(
                    factory: &#krate::factory::SharedInformerFactory,
                ) -> ::core::result::Result<#informer, #krate::factory::FactoryError> {
                    #informer::new(factory)
                }

                #metadata_informer
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
            #[inline]
            pub fn new(
                factory: &#krate::factory::SharedInformerFactory,
            ) -> ::core::result::Result<Self, #krate::factory::FactoryError> {
                ::core::result::Result::Ok(Self { informer: factory.informer_for::<#ty>()? })
            }

            /// The underlying shared informer.
            #[inline]
            pub fn informer(&self) -> &#krate::cache::SharedIndexInformer<#ty> {
                &self.informer
            }

            /// A lister over the informer's cache.
            #[inline]
            pub fn lister(&self) -> #lister {
                #lister { lister: #krate::cache::Lister::new(self.informer.indexer().clone()) }
            }

            /// Adds an event handler to the shared informer.
            #[inline]
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
            #[inline]
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
            #[inline]
            pub fn list(&self, selector: &#krate::cache::Selector) -> ::std::vec::Vec<::std::sync::Arc<#ty>> {
                self.lister.list(selector)
            }

            /// The keys of the objects the server holds that do not decode into this type, with
            /// why (they are never taken for deleted; see `lookup`).
            #[inline]
            pub fn undecodable(&self) -> ::std::vec::Vec<(::std::string::String, #krate::cache::Undecodable)> {
                self.lister.undecodable()
            }
        }

        #scoped

        #inherent
    }
}

/// The `InformerResource` impl of a `#[derive(Informer)]` type: its compaction (the object's
/// metadata: the derive sees the declaration of one type, not those of its fields' types) and,
/// for a projection (`#[informer(projection, ...)]`), the rest of what makes a partial type an
/// informer's type:
///
/// - `kube::Resource`, naming the group, version, kind and plural of the attributes, so its
///   informer lists and watches the full type's collection and decodes each object straight
///   into the projection (serde skips the fields it does not declare: they are never
///   allocated). The type needs a `metadata: ObjectMeta` field.
/// - `InformerResource::projection`, which names its informer apart from the full type's.
/// - A projection is read-only: writing one back would drop every field it does not declare.
///   A compile-time check refuses `serde::Serialize` on it, so `Api::create`/`replace` (which
///   need it) cannot take one.
///
/// Types generated from CRDs and the built-in k8s-openapi types get theirs elsewhere (the CRD
/// generator, `generate_k8s_openapi_compact`), so `generate` does not emit it.
pub fn generate_informer_resource(desc: &ResourceDesc) -> TokenStream {
    let ResourceDesc { ty, name, krate, .. } = desc;
    let factory = quote!(#krate::factory);
    if !desc.projection {
        return quote! {
            impl #factory::InformerResource for #ty {
                #[inline]
                fn compact(&mut self) {
                    #factory::Compact::compact(#krate::kube::Resource::meta_mut(self));
                }
            }
        };
    }
    let (group, version, kind, plural) = (&desc.group, &desc.version, &desc.kind, &desc.plural);
    let api_version = if group.is_empty() {
        version.clone()
    } else {
        format!("{group}/{version}")
    };
    let scope = if desc.namespaced {
        quote!(#krate::k8s_openapi::NamespaceResourceScope)
    } else {
        quote!(#krate::k8s_openapi::ClusterResourceScope)
    };
    let projection = name.to_string();
    let read_only = format_ident!("{}IsAReadOnlyProjectionAndMustNotImplementSerialize", name);
    let resource = kube_resource_impl(
        krate,
        ty,
        &scope,
        ResourceNames {
            kind,
            group,
            version,
            api_version: &api_version,
            plural,
        },
    );
    quote! {
        #resource

        impl #factory::InformerResource for #ty {
            #[inline]
            fn compact(&mut self) {
                #factory::Compact::compact(&mut self.metadata);
            }

            #[inline]
            fn projection() -> ::core::option::Option<&'static str> {
                ::core::option::Option::Some(#projection)
            }
        }

        // A projection is read-only (see `generate_informer_resource`): this fails to compile,
        // naming the trait below, if the type implements `serde::Serialize` (two impls of the
        // trait then apply and the type parameter cannot be inferred).
        const _: () = {
            #[allow(non_camel_case_types, dead_code)]
            trait #read_only<A> {
                fn check() {}
            }
            impl<T: ?::core::marker::Sized> #read_only<()> for T {}
            #[allow(dead_code)]
            struct Serializable;
            impl<T: ?::core::marker::Sized + #krate::serde::Serialize> #read_only<Serializable> for T {}
            let _ = <#ty as #read_only<_>>::check;
        };
    }
}

/// The names a generated `kube::Resource` impl answers with.
pub(crate) struct ResourceNames<'a> {
    pub(crate) kind: &'a str,
    pub(crate) group: &'a str,
    pub(crate) version: &'a str,
    pub(crate) api_version: &'a str,
    pub(crate) plural: &'a str,
}

/// `impl kube::Resource for #ty` with static names and `metadata` as the object's `ObjectMeta`:
/// what a projection (here) and a CRD's root type (`crd::root`) get, instead of kube-derive's.
pub(crate) fn kube_resource_impl(
    krate: &impl ToTokens,
    ty: &impl ToTokens,
    scope: &TokenStream,
    names: ResourceNames<'_>,
) -> TokenStream {
    let ResourceNames {
        kind,
        group,
        version,
        api_version,
        plural,
    } = names;
    let object_meta = quote!(#krate::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta);
    quote! {
        impl #krate::kube::Resource for #ty {
            type DynamicType = ();
            type Scope = #scope;
            fn kind(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed(#kind)
            }
            fn group(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed(#group)
            }
            fn version(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed(#version)
            }
            fn api_version(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed(#api_version)
            }
            fn plural(_: &()) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed(#plural)
            }
            fn meta(&self) -> &#object_meta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut #object_meta {
                &mut self.metadata
            }
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
