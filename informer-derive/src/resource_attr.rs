//! `#[kinformer::resource(...)]`: kube's `CustomResource` and kinformer's `Informer` derived
//! on a spec struct, with kube-derive pointed at kinformer's copies of kube's crates, so a crate
//! that depends on kinformer alone writes no `#[kube(crates(...))]` block.
//!
//! The arguments are kube's `#[kube(...)]` keys (`group`, `version`, `kind`, `namespaced`,
//! `status`, `shortname`, `printcolumn`, …), passed on unchanged; `crate = "path"` names a
//! kinformer renamed in Cargo.toml. Put it above the struct's own `#[derive(...)]` (Serialize,
//! Deserialize, Clone, Debug, JsonSchema, which kube's derive needs): an attribute macro below a
//! derive is a compile error. The tokens come from
//! `informer_codegen::resource_attribute`, whose docs show the expansion.

use proc_macro::TokenStream;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    informer_codegen::resource_attribute(args.into(), item.into()).into()
}
