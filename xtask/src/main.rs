//! `cargo xtask`: project automation (`codegen`, `crds`). Not built yet (issue 6).

fn main() {
    eprintln!("cargo xtask: no tasks yet (codegen arrives with issue 6)");
    std::process::exit(2);
}
