//! Helpers shared by the tests of the CUDA executor.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::PathBuf;

use ralpc_ir::{bind, onnx, verify, Bindings, Graph, GraphInfo};

/// A path under the repository's `fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel)
}

/// The fixture `model` imported, bound at `batch` and verified.
pub fn load(model: &str, batch: u64) -> (Graph, GraphInfo) {
    let mut graph = onnx::import(&fixture(model)).expect("import").graph;
    bind(
        &mut graph,
        &Bindings {
            batch: Some(batch),
            inputs: Default::default(),
        },
    )
    .expect("bind");
    let info = verify(&graph).expect("verify");
    (graph, info)
}

/// ‖got − want‖ / ‖want‖.
pub fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|&b| f64::from(b).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}
