//! `#[derive(Informer)]` as users write it: both forms compile (in a module, next to user
//! items that shadow std names, under `-D warnings`), and mistakes fail with clear messages.

#[test]
fn derive_informer_ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass_*.rs");
    t.compile_fail("tests/ui/fail_*.rs");
}
