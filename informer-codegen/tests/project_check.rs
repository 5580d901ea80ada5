//! `cargo xtask codegen --check` on a generated file that went stale: the report names the CRD
//! it comes from, prints its path relative to the config's directory without the `xtask/..`
//! the config path was built with, and shows the changed lines with their line numbers.

use std::path::PathBuf;

use informer_codegen::project::{Mode, run};

fn crd(property: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: gadgets.example.com}}
spec:
  group: example.com
  scope: Namespaced
  names: {{kind: Gadget, plural: gadgets}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {{type: object, properties: {{{property}: {{type: string}}}}}}
"
    )
}

/// A fresh directory of its own under the system's temp directory, laid out like a user's
/// repository: `crds/`, `xtask/` and the config at the root.
fn repository(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kinformer-project-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("crds")).unwrap();
    std::fs::create_dir_all(dir.join("xtask")).unwrap();
    std::fs::write(
        dir.join("kinformer-codegen.toml"),
        "output = \"./controller/src/generated\"\n[[crd]]\npath = \"crds/\"\n",
    )
    .unwrap();
    dir
}

/// Whether `shown`, a line of a diff, is `line` (or its beginning, when the diff clips it).
fn shows(shown: &str, line: &str) -> bool {
    match shown.rsplit_once("… (") {
        Some((head, _)) => line.starts_with(head),
        None => shown == line,
    }
}

/// The diff lines of `report` marked `sign`, as (line number, text).
fn marked(report: &str, sign: char) -> Vec<(usize, String)> {
    report
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix(sign))
        .filter_map(|rest| {
            let (number, text) = rest.split_once(" | ")?;
            Some((number.trim().parse().ok()?, text.to_string()))
        })
        .collect()
}

#[test]
fn check_names_the_crd_the_normalised_path_and_the_changed_lines() {
    let dir = repository("stale");
    std::fs::write(dir.join("crds/gadgets.yaml"), crd("colour")).unwrap();
    // As the README's xtask builds it: its manifest directory, then `..`.
    let config = dir.join("xtask").join("..").join("kinformer-codegen.toml");
    run(&config, Mode::Write).unwrap();
    let generated = dir.join("controller/src/generated/gadgets_example_com.rs");
    let before = std::fs::read_to_string(&generated).unwrap();

    std::fs::write(dir.join("crds/gadgets.yaml"), crd("flavour")).unwrap();
    let outcome = run(&config, Mode::Check).unwrap();
    assert!(!outcome.is_up_to_date());
    let report = outcome.report(Mode::Check);
    let first = report.lines().next().unwrap();
    assert_eq!(
        first,
        "out of date: controller/src/generated/gadgets_example_com.rs, from CRD gadgets.example.com (crds/gadgets.yaml)",
        "{report}"
    );
    assert_eq!(
        report.lines().last(),
        Some("generated code is stale: run `cargo xtask codegen`"),
        "{report}"
    );

    // The old field's lines are numbered as in the file on disk, the new one's as in the file
    // the CRD generates now.
    let removed = marked(&report, '-');
    let added = marked(&report, '+');
    assert!(removed.iter().any(|(_, text)| text.contains("colour")), "{report}");
    assert!(added.iter().any(|(_, text)| text.contains("flavour")), "{report}");
    assert!(removed.len() + added.len() <= 20, "{report}");
    let before_lines: Vec<&str> = before.lines().collect();
    for (number, text) in &removed {
        assert!(
            shows(text, before_lines[number - 1]),
            "line {number} of the file on disk: {text}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&generated).unwrap(),
        before,
        "check mode changes nothing"
    );
    run(&config, Mode::Write).unwrap();
    let after = std::fs::read_to_string(&generated).unwrap();
    let after_lines: Vec<&str> = after.lines().collect();
    for (number, text) in &added {
        assert!(
            shows(text, after_lines[number - 1]),
            "line {number} of the generated file: {text}"
        );
    }

    let outcome = run(&config, Mode::Check).unwrap();
    assert!(outcome.is_up_to_date(), "{}", outcome.report(Mode::Check));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_names_a_missing_file_and_a_left_over_one_by_where_they_come_from() {
    let dir = repository("left-over");
    std::fs::write(dir.join("crds/gadgets.yaml"), crd("colour")).unwrap();
    let config = dir.join("xtask/../kinformer-codegen.toml");
    run(&config, Mode::Write).unwrap();

    // The CRD moves to another file and is renamed: its old output is left over, its new one
    // missing.
    std::fs::remove_file(dir.join("crds/gadgets.yaml")).unwrap();
    std::fs::write(
        dir.join("crds/widgets.yaml"),
        crd("colour").replace("gadgets", "widgets").replace("Gadget", "Widget"),
    )
    .unwrap();
    let report = run(&config, Mode::Check).unwrap().report(Mode::Check);
    let lines: Vec<&str> = report.lines().collect();
    assert!(
        lines.contains(
            &"missing: controller/src/generated/widgets_example_com.rs, from CRD widgets.example.com (crds/widgets.yaml)"
        ),
        "{report}"
    );
    assert!(
        lines.contains(
            &"stale: controller/src/generated/gadgets_example_com.rs, generated from crds/gadgets.yaml, which no longer generates it"
        ),
        "{report}"
    );
    assert!(
        lines.iter().any(|l| l
            .starts_with("out of date: controller/src/generated/mod.rs, from the modules of kinformer-codegen.toml")),
        "{report}"
    );
    assert!(!report.contains(".."), "{report}");
    assert!(dir.join("controller/src/generated/gadgets_example_com.rs").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
