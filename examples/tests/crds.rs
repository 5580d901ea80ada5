//! The CRDs checked in under `examples/crds/` are what the types produce today, so
//! `kubectl apply -f examples/crds/` installs the schema the code expects. `cargo xtask crds`
//! rewrites them.

use std::path::Path;

#[test]
fn checked_in_crds_match_the_types() {
    for crd in examples::crds() {
        let name = crd.metadata.name.clone().expect("a CRD has a name");
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crds")
            .join(format!("{name}.yaml"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask crds`", path.display()));
        let on_disk: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(
            on_disk,
            serde_json::to_value(&crd).unwrap(),
            "{} is stale; run `cargo xtask crds`",
            path.display()
        );
    }
}
