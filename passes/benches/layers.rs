//! Rewriting a verified model into its layer graph (egg saturation + extraction).
//!
//! `cargo bench -p ralpc-passes --bench layers` (add `-- --threads 1` for one core).

use std::path::Path;

fn main() {
    divan::main();
}

#[divan::bench(args = ["vgg16", "resnet50", "inception_v3", "densenet121", "gpt2"])]
fn layer_graph(bencher: divan::Bencher, case: &str) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/onnx/{case}/model.onnx"));
    let mut model = ralpc_ir::onnx::import(&path).expect("imports");
    let bindings = ralpc_ir::Bindings {
        batch: Some(32),
        ..Default::default()
    };
    ralpc_ir::bind(&mut model.graph, &bindings).expect("binds");
    let info = ralpc_ir::verify(&model.graph).expect("verifies");
    bencher.bench(|| {
        ralpc_passes::rewrite::rewrite(&model.graph, &info, Default::default())
            .units
            .len()
    });
}
