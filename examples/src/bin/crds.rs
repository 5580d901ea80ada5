//! Prints the CRDs of the example resource types as a JSON array, for `cargo xtask crds`.
//!
//! A separate binary rather than a dependency of xtask, so that `cargo xtask codegen` never
//! needs the factory crate (whose generated code it writes) to compile.

#![forbid(unsafe_code)]
fn main() {
    let crds = examples::crds();
    match serde_json::to_string(&crds) {
        Ok(json) => println!("{json}"),
        Err(error) => {
            eprintln!("serializing the CRDs: {error}");
            std::process::exit(1);
        }
    }
}
