//! `#[derive(Informer)]`: a thin proc-macro shell over `informer-codegen`. Not built yet (issue 6).
