//! The CRD corpus: public CRDs of nine projects, stored unchanged under `crds/<project>/` (their
//! sources and licences in `LICENSES.md`), realistic objects of each served version under
//! `objects/<project>/`, and [`generated`], the types, informers and listers `cargo xtask codegen`
//! writes from `kinformer-codegen.toml`.
//!
//! It sits outside the data path: it exists to prove the generator on CRDs from the wild.
//! `tests/roundtrip.rs` applies every CRD and object to envtest with kubectl and requires each
//! object, read back through a generated lister at each served version, to serialize to exactly
//! the JSON the server returns.

#![forbid(unsafe_code)]
// Formatted by the generator (prettyplease), checked by `cargo xtask codegen --check`.
#[rustfmt::skip]
pub mod generated;
