//! Plans the bundled VGG16 for 8 GPUs at build time and leaves the artifacts in `OUT_DIR`;
//! Cargo reruns this when the model changes.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../..");
    let model = root.join("fixtures/onnx/vgg16/model.onnx");
    println!("cargo::rerun-if-changed={}", model.display());
    let options = ralpc::Options {
        model,
        gpus: Some(8),
        ..Default::default()
    };
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("vgg16.ralpc");
    // Deterministic inputs, deterministic plan: skip the work when it is already there.
    if !ralpc::up_to_date(&options, &out)? {
        ralpc::compile(&options)?.write(&out)?;
    }
    Ok(())
}
