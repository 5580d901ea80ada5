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
//! - With the `crd` feature, for users' own repositories: `crd` turns a CRD's YAML into Rust
//!   types (serde; a root type with kube's `Resource` and `CustomResourceExt`; its docs list
//!   what the types do not model) plus the same informers and listers, and
//!   `project` runs a `kinformer-codegen.toml` (built-in accessors and CRDs) from a user's
//!   `cargo xtask codegen`, with a `--check` mode for CI.
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

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod compact;
#[cfg(feature = "crd")]
pub mod crd;
mod generate;
mod groups;
#[cfg(feature = "crd")]
pub mod project;
mod resource_attr;
mod resource_desc;

pub use compact::{SourceFile, generate_k8s_openapi_compact};
pub use generate::{generate, generate_informer_resource, pretty};
pub use groups::{generate_group, generate_group_accessors, group_module};
pub use resource_attr::resource_attribute;
pub use resource_desc::{ResourceDesc, default_plural};
