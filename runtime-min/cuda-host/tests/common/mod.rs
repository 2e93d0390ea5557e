//! Helpers shared by the tests of the CUDA executor.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};

use ralpc_ir::{bind, onnx, verify, Bindings, Graph, GraphInfo};
use ralpc_runtime_min::cpu::train::TrainReport;
use ralpc_runtime_min::cuda::gpu::Gpu;
use ralpc_runtime_min::cuda::libs;

/// A path under the repository's `fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel)
}

/// The fixture `model` imported, bound at `batch` and verified.
pub fn load(model: &str, batch: u64) -> (Graph, GraphInfo) {
    load_path(&fixture(model), batch)
}

/// The model at `path` imported, bound at `batch` and verified.
pub fn load_path(path: &std::path::Path, batch: u64) -> (Graph, GraphInfo) {
    let mut graph = onnx::import(path).expect("import").graph;
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

/// GPU 0, or `None` when this test re-ran itself in a child whose loader path has the
/// CUDA libraries (pip wheels sit outside it) and the child passed.
pub fn gpu(test: &str) -> Option<Gpu> {
    match libs::resolve(&libs::Lib::ONE_GPU).unwrap_or_else(|e| panic!("{e}")) {
        libs::Resolution::Ready => Some(Gpu::new(0).unwrap_or_else(|e| panic!("{e}"))),
        libs::Resolution::Restart { library_path, .. } => {
            assert!(
                std::env::var_os("RALPC_TEST_RESTARTED").is_none(),
                "the CUDA libraries do not load from {library_path:?}"
            );
            let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args([test, "--exact", "--ignored", "--nocapture"])
                .env("LD_LIBRARY_PATH", library_path)
                .env("RALPC_TEST_RESTARTED", "1")
                .status()
                .expect("re-run the test");
            assert!(status.success(), "{test} failed on the GPU");
            None
        }
    }
}

/// Plans `model` with `strategy` into a temporary directory; three steps of it.
pub fn planned(model: &Path, gpus: u32, strategy: &str) -> (tempfile::TempDir, ralpc::RunOptions) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("strategy.json");
    std::fs::write(&file, strategy).expect("write");
    let compiled = ralpc::compile(&ralpc::Options {
        model: model.to_path_buf(),
        gpus: Some(gpus),
        batch: Some(8),
        strategy_file: Some(file),
        ..Default::default()
    })
    .expect("plan");
    compiled.write(dir.path()).expect("write the plan");
    let options = ralpc::RunOptions {
        plan: dir.path().to_path_buf(),
        model: Some(model.to_path_buf()),
        steps: 3,
        ..Default::default()
    };
    (dir, options)
}

/// Megatron-LM's layout the GPT tests plan: tensor 2 × pipeline 2, microbatches of 2
/// samples, no recomputation, ZeRO stage `zero` (the planner's choice when `None`).
pub fn megatron_knobs(zero: Option<u8>) -> ralpc::passes::transformer::Knobs {
    use ralpc::passes::transformer::{Knobs, Recompute};
    Knobs {
        tensor: Some(2),
        pipeline: Some(2),
        micro_batch: Some(2),
        recompute: Some(Recompute::None),
        zero,
        ..Knobs::default()
    }
}

/// A small GPT (2 layers, hidden 64, 4 heads, sequence 16, vocabulary 128, its head tied
/// to the embedding) planned as Megatron-LM plans one — tensor 2 × pipeline 2 × data 2,
/// microbatches of 2 samples, sequence parallel where the planner chooses it, ZeRO stage
/// `zero` — for 8 ranks at batch 8, into a temporary directory; two steps of it.
pub fn megatron_gpt(zero: u8) -> (tempfile::TempDir, ralpc::RunOptions) {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = ralpc_ir::models::GptSpec {
        tied: true,
        ..ralpc_ir::models::GptSpec::megatron(2, 64, 4, 16, 128)
    };
    let model = dir.path().join("gpt.onnx");
    std::fs::write(&model, ralpc_ir::models::gpt(&spec).expect("a valid GPT")).expect("write");
    let compiled = ralpc::compile(&ralpc::Options {
        model: model.clone(),
        gpus: Some(8),
        batch: Some(8),
        family: ralpc::passes::plan::Family::parse("3d"),
        knobs: megatron_knobs(Some(zero)),
        executable: true,
        ..Default::default()
    })
    .expect("plan");
    compiled.write(dir.path()).expect("write the plan");
    let options = ralpc::RunOptions {
        plan: dir.path().to_path_buf(),
        model: Some(model),
        steps: 2,
        ..Default::default()
    };
    (dir, options)
}

/// `got` trained as `want`: the same losses and final weights, within `tolerance`
/// (relative).
pub fn assert_trains_as(what: &str, got: &TrainReport, want: &TrainReport, tolerance: f64) {
    for (g, w) in got.losses.iter().zip(&want.losses) {
        assert!(
            (g - w).abs() <= tolerance * w.abs().max(1.0),
            "{what}: loss {g} against {w}"
        );
    }
    for (name, w) in &want.weights {
        let e = relative_error(&got.weights[name], w);
        assert!(e <= tolerance, "{what}: weight {name}: relative error {e}");
    }
}

/// A strategy file's entry for `layer`: its samples split `s` ways, its attribute `a`
/// ways and its parameters `p` ways.
pub fn split(layer: &str, s: u32, a: u32, p: u32) -> String {
    format!(
        r#"{{ "name": "{layer}", "split": {{ "sample": {s}, "attribute": {a}, "parameter": {p} }} }}"#
    )
}

/// A `ralpc-strategy/1` file: `stages` (JSON objects), `layers` ([`split`]s).
pub fn strategy(stages: &str, layers: &[String], schedule: &str, microbatches: u32) -> String {
    format!(
        r#"{{ "format": "ralpc-strategy/1", "schedule": "{schedule}", "microbatches": {microbatches},
             "stages": [{stages}], "layers": [{}] }}"#,
        layers.join(", ")
    )
}

/// The bytes of `model`'s trained weights (as `report` holds them), of its inputs and of
/// its first output at `batch`.
pub fn sizes(model: &str, batch: u64, report: &TrainReport) -> (u64, u64, u64) {
    let (graph, info) = load(model, batch);
    let bytes = |v| {
        4 * info
            .ty(v)
            .shape
            .as_sizes()
            .expect("sizes")
            .iter()
            .product::<u64>()
    };
    let weights = report.weights.values().map(|w| 4 * w.len() as u64).sum();
    let inputs = graph.inputs().into_iter().map(bytes).sum();
    (weights, inputs, bytes(graph.outputs()[0]))
}

/// The CNN fixture's plans on 4 ranks, one of each family, by name: burst (the second
/// convolution and pooling on 2 ranks, the dense layers on 1), SOAP (parameter and
/// feature splits), rows (convolutions and pooling split by rows, exchanging halos: of the
/// first convolution, of pooling over every rank, rows and channels at once), and 1F1B and
/// GPipe pipelines of two stages of two replicas.
pub fn cnn_plans() -> [(&'static str, String); 6] {
    const ONE_STAGE: &str = r#"{ "first_layer": "conv0", "last_layer": "fc1", "replicas": 4 }"#;
    const TWO_STAGES: &str = r#"{ "first_layer": "conv0", "last_layer": "pool0", "replicas": 2 },
        { "first_layer": "conv1", "last_layer": "fc1", "replicas": 2 }"#;
    let burst = [
        split("conv1", 2, 1, 1),
        split("pool1", 2, 1, 1),
        split("fc0", 1, 1, 1),
        split("fc1", 1, 1, 1),
    ];
    let soap = [
        split("conv1", 2, 1, 2),
        split("pool1", 2, 1, 2),
        split("fc0", 1, 1, 4),
        split("fc1", 1, 4, 1),
    ];
    let rows = [
        split("conv0", 1, 2, 1),
        split("pool0", 1, 4, 1),
        split("conv1", 1, 2, 2),
        split("pool1", 2, 1, 1),
    ];
    [
        ("burst", strategy(ONE_STAGE, &burst, "1f1b", 1)),
        ("soap", strategy(ONE_STAGE, &soap, "1f1b", 1)),
        ("rows", strategy(ONE_STAGE, &rows, "1f1b", 1)),
        ("1f1b", strategy(TWO_STAGES, &[], "1f1b", 2)),
        ("gpipe", strategy(TWO_STAGES, &[], "gpipe", 2)),
        ("zb-h1", strategy(TWO_STAGES, &[], "zb-h1", 2)),
    ]
}

/// [`cnn_plans`]'s plan `name`.
pub fn cnn_plan(name: &str) -> String {
    cnn_plans()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no CNN plan '{name}'"))
}
