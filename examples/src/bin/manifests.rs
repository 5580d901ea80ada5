//! Prints the sample-controller's manifests as a JSON object: each file `cargo xtask manifests`
//! writes (`sample-controller.yaml` from `sample_controller::deploy::manifests`,
//! `sample-controller-sharded.yaml` from `deploy::sharded_manifests`) to its objects in apply
//! order.
//!
//! A binary of `examples` rather than a dependency of xtask, as the `crds` binary: the
//! manifests come from building the controller, which xtask must not need to compile.

#![forbid(unsafe_code)]

use examples::demo::DemoError;
use examples::sample_controller::deploy;

fn files() -> Result<serde_json::Value, DemoError> {
    Ok(serde_json::json!({
        "sample-controller.yaml": deploy::manifests()?.objects()?,
        "sample-controller-sharded.yaml": deploy::sharded_manifests()?.objects()?,
    }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    match files() {
        Ok(json) => println!("{json}"),
        Err(error) => {
            eprintln!("the sample-controller's manifests: {error}");
            std::process::exit(1);
        }
    }
}
