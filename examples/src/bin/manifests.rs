//! Prints the sample-controller's manifests (`sample_controller::deploy::manifests`) as a JSON
//! array in apply order, for `cargo xtask manifests`.
//!
//! A binary of `examples` rather than a dependency of xtask, as the `crds` binary: the
//! manifests come from building the controller, which xtask must not need to compile.

#![forbid(unsafe_code)]

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let objects = examples::sample_controller::deploy::manifests()
        .map_err(|e| e.to_string())
        .and_then(|manifests| manifests.objects().map_err(|e| e.to_string()))
        .and_then(|objects| serde_json::to_string(&objects).map_err(|e| e.to_string()));
    match objects {
        Ok(json) => println!("{json}"),
        Err(error) => {
            eprintln!("the sample-controller's manifests: {error}");
            std::process::exit(1);
        }
    }
}
