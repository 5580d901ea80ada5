//! `#[derive(Informer)]`: typed informers and listers for a resource type.
//!
//! A thin shell over `informer-codegen`, which `cargo xtask codegen` also uses for the
//! built-in types, so derived and generated code are the same code. Two forms:
//!
//! ```ignore
//! // 1. Next to kube's CustomResource, on the spec struct: reads #[kube(...)], generates for `Foo`.
//! #[derive(CustomResource, Informer, Serialize, Deserialize, Clone, Debug, JsonSchema)]
//! #[kube(group = "example.com", version = "v1", kind = "Foo", namespaced)]
//! struct FooSpec { replicas: i32 }
//!
//! // 2. On a hand-written resource type (which implements kube::Resource).
//! #[derive(Informer)]
//! #[informer(group = "example.com", version = "v1", kind = "Bar", plural = "bars")]
//! struct Bar { metadata: ObjectMeta }
//! ```
//!
//! Generated: `FooInformer`, `FooLister`, `FooNamespaceLister` (namespaced) and
//! `Foo::informer(&factory)`. Code refers to `::kinformer`; override with
//! `#[informer(crate = "path::to::kinformer")]`.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use proc_macro::TokenStream;

mod resource_attr;

/// `#[kinformer::resource(group = "...", version = "...", kind = "...", namespaced)]` on a
/// spec struct: kube's `CustomResource` and `Informer`, pointed at kinformer's re-exports (see
/// `resource_attr.rs`).
#[proc_macro_attribute]
pub fn resource(args: TokenStream, item: TokenStream) -> TokenStream {
    resource_attr::expand(args, item)
}

/// Derives `FooInformer`, `FooLister` (and `FooNamespaceLister`) for a resource type.
#[proc_macro_derive(Informer, attributes(informer))]
pub fn derive_informer(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    match informer_codegen::ResourceDesc::from_derive_input(&input) {
        Ok(desc) => {
            let mut tokens = informer_codegen::generate(&desc);
            tokens.extend(informer_codegen::generate_informer_resource(&desc));
            tokens.into()
        }
        Err(error) => error.to_compile_error().into(),
    }
}
