//! A lister's lookups follow its kind's scope (see `informer_core::listers`): a get by name alone
//! on a namespaced kind, or a namespaced view of a cluster-scoped one, does not compile, and the
//! compiler's message names the accessor to use.

#[test]
fn lister_scope_ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/lister/pass_*.rs");
    t.compile_fail("tests/ui/lister/fail_*.rs");
}
