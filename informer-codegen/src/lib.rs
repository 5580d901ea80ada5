//! Token generation for typed informers and listers, shared by `#[derive(Informer)]` and
//! `cargo xtask codegen` so that derived and generated code are the same code.
//! Not built yet (issue 6).
