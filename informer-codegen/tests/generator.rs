//! The generator's output, pinned by a snapshot, and the two front ends (the derive's
//! `#[informer(...)]`/`#[kube(...)]` attributes and xtask's resource table) agreeing.

use informer_codegen::{ResourceDesc, default_plural, generate, pretty};

fn snapshot(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "generated code differs from {} (UPDATE_SNAPSHOTS=1 to accept):\n{actual}",
        path.display()
    );
}

#[test]
fn generated_code_for_a_namespaced_resource_matches_the_snapshot() {
    let input: syn::DeriveInput = syn::parse_quote! {
        #[informer(group = "example.com", version = "v1", kind = "Foo", namespaced)]
        pub struct Foo { metadata: ObjectMeta }
    };
    let desc = ResourceDesc::from_derive_input(&input).unwrap();
    snapshot("foo_namespaced.rs", &pretty(generate(&desc)));
}

#[test]
fn generated_code_for_a_cluster_scoped_resource_matches_the_snapshot() {
    let input: syn::DeriveInput = syn::parse_quote! {
        #[informer(group = "example.com", version = "v1", kind = "Widget", plural = "widgetz", crate = "my::kinformer")]
        pub struct Widget { metadata: ObjectMeta }
    };
    let desc = ResourceDesc::from_derive_input(&input).unwrap();
    assert_eq!(desc.plural, "widgetz");
    snapshot("widget_cluster.rs", &pretty(generate(&desc)));
}

#[test]
fn derive_and_xtask_descriptions_generate_the_same_code() {
    let input: syn::DeriveInput = syn::parse_quote! {
        #[informer(group = "apps", version = "v1", kind = "Deployment", namespaced, crate = "crate::__private")]
        pub struct Deployment { metadata: ObjectMeta }
    };
    let mut derived = ResourceDesc::from_derive_input(&input).unwrap();
    let table = ResourceDesc::from_table_line(
        "apps v1 Deployment deployments namespaced Deployment",
        syn::parse_quote!(crate::__private),
    )
    .unwrap();
    // xtask generates for foreign (k8s-openapi) types, which cannot get an inherent impl.
    derived.inherent_impl = false;
    assert_eq!(pretty(generate(&derived)), pretty(generate(&table)));
}

#[test]
fn kube_attributes_next_to_custom_resource_name_the_root_type() {
    let input: syn::DeriveInput = syn::parse_quote! {
        #[kube(group = "example.com", version = "v1", kind = "Foo", namespaced, status = "FooStatus")]
        #[kube(shortname = "f", printcolumn = r#"{"name":"x"}"#, scale(spec_replicas_path = ".spec.replicas"))]
        pub struct FooSpec { replicas: i32 }
    };
    let desc = ResourceDesc::from_derive_input(&input).unwrap();
    assert_eq!(desc.name, "Foo");
    assert!(desc.namespaced);
    assert_eq!(
        (desc.group.as_str(), desc.version.as_str(), desc.plural.as_str()),
        ("example.com", "v1", "foos")
    );
    let code = pretty(generate(&desc));
    assert!(code.contains("impl Foo {"), "{code}");
    assert!(code.contains("SharedIndexInformer<Foo>"));
}

#[test]
fn errors_point_at_the_problem() {
    let cases: [(syn::DeriveInput, &str); 10] = [
        (
            syn::parse_quote! { #[informer(version = "v1")] struct Foo { m: u8 } },
            "needs a kind",
        ),
        (
            syn::parse_quote! { #[informer(kind = "Foo", version = "v1")] enum Foo { A } },
            "not enums",
        ),
        (
            syn::parse_quote! { #[informer(kind = "Foo", version = "v1")] struct Foo(u8); },
            "tuple struct",
        ),
        (
            syn::parse_quote! { #[informer(kind = "Foo", version = "v1", color = "red")] struct Foo { m: u8 } },
            "unknown informer attribute `color`",
        ),
        (
            syn::parse_quote! { #[informer(kind = "Bar", version = "v1")] struct Foo { m: u8 } },
            "must match",
        ),
        (
            syn::parse_quote! { #[informer(kind = "Foo")] struct Foo { m: u8 } },
            "needs a version",
        ),
        (
            syn::parse_quote! { #[informer(kind = "Foo", version = "v1")] struct Foo<T> { m: T } },
            "does not support generic types",
        ),
        (
            syn::parse_quote! { #[informer(kind = "Foo", version = "v1")] union Foo { m: u8 } },
            "not unions",
        ),
        (
            syn::parse_quote! { #[kube(kind = "foo-bar", version = "v1")] struct FooSpec { m: u8 } },
            "not a Rust type name",
        ),
        (
            syn::parse_quote! { #[informer(kind = "Foo", version = "v1", plural = "3foos")] struct Foo { m: u8 } },
            "cannot name the namespace lister accessor",
        ),
    ];
    for (input, expected) in cases {
        let error = ResourceDesc::from_derive_input(&input).unwrap_err().to_string();
        assert!(error.contains(expected), "{error:?} should contain {expected:?}");
    }
}

#[test]
fn default_plurals() {
    assert_eq!(default_plural("Foo"), "foos");
    assert_eq!(default_plural("Policy"), "policies");
    assert_eq!(default_plural("Gateway"), "gateways");
    assert_eq!(default_plural("Ingress"), "ingresses");
    assert_eq!(default_plural("Box"), "boxes");
    assert_eq!(default_plural("Quiz"), "quizes");
}

#[test]
fn a_plural_that_is_a_keyword_becomes_a_raw_identifier() {
    let input: syn::DeriveInput = syn::parse_quote! {
        #[informer(version = "v1", kind = "Type", plural = "type", namespaced)]
        pub struct Type { metadata: ObjectMeta }
    };
    let desc = ResourceDesc::from_derive_input(&input).unwrap();
    let code = pretty(generate(&desc));
    assert!(
        code.contains("pub fn r#type(&self, namespace: &str) -> TypeNamespaceLister"),
        "{code}"
    );
}
