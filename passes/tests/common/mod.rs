//! Helpers shared by passes' integration tests.
#![allow(dead_code, reason = "each test file uses a subset")]

use std::path::PathBuf;

use ralpc_ir::{bind, onnx, verify, Bindings, Graph, GraphInfo};
use ralpc_passes::layers::{self, LayerGraph};

/// A path under the repository root.
pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// A path under `fixtures/anchors` (published planner inputs, with their licences).
pub fn anchor(path: &str) -> PathBuf {
    repo("fixtures/anchors").join(path)
}

/// Imports, binds the batch and verifies a model.
pub fn load(path: &str, batch: u64) -> (Graph, GraphInfo) {
    let mut model = onnx::import(&repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    bind(
        &mut model.graph,
        &Bindings {
            batch: Some(batch),
            ..Bindings::default()
        },
    )
    .unwrap();
    let info = verify(&model.graph).unwrap();
    (model.graph, info)
}

/// The layer graph of a model at a batch.
pub fn layers(path: &str, batch: u64) -> (Graph, GraphInfo, LayerGraph) {
    let (graph, info) = load(path, batch);
    let layers = layers::build(&graph, &info, batch, Default::default()).unwrap();
    (graph, info, layers)
}

/// A generated structure-only GPT, imported at `batch` and verified.
pub fn generated(spec: &ralpc_ir::models::GptSpec, batch: u64) -> (Graph, GraphInfo) {
    let bytes = ralpc_ir::models::gpt(spec).expect("generates");
    let path = std::path::Path::new("gpt.onnx");
    let mut m = onnx::import_bytes(&bytes, path, None).expect("imports");
    bind(
        &mut m.graph,
        &Bindings {
            batch: Some(batch),
            ..Bindings::default()
        },
    )
    .expect("binds");
    let info = verify(&m.graph).expect("verifies");
    (m.graph, info)
}

/// A generated structure-only GPT, imported at `batch`, verified and recognized.
pub fn recognized(
    spec: &ralpc_ir::models::GptSpec,
    batch: u64,
) -> ralpc_passes::transformer::Transformer {
    let (graph, info) = generated(spec, batch);
    ralpc_passes::transformer::recognize(&graph, &info).expect("a GPT")
}

/// Today's runs: bf16 with Adam, fused attention and Megatron-Core's overlaps, a 1 GiB
/// workspace, on `gpus` GPUs of `cluster` at `batch` sequences.
pub fn bf16_adam<'a>(
    model: &'a ralpc_passes::transformer::Transformer,
    cluster: &'a ralpc_passes::cluster::Cluster,
    gpus: u32,
    batch: u64,
) -> ralpc_passes::transformer::Setting<'a> {
    use ralpc_passes::transformer::{Attention, Dispatcher, Overlap, Setting};
    Setting {
        model,
        batch,
        sample_pieces: batch,
        cluster,
        gpus,
        precision: ralpc_passes::cluster::Precision::Bf16,
        optimizer: ralpc_passes::cost::Optimizer::Adam,
        fp32_gradients: false,
        workspace_bytes: (1u64 << 30) as f64,
        memory_limit: None,
        attention: Attention::Fused,
        overlap: Overlap::MEGATRON_CORE,
        profile: None,
        expert_imbalance: 1.0,
        dispatcher: Dispatcher::AllToAll,
    }
}
