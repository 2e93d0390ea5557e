//! Every kind of plan through the CPU plan executor with its layers computed by the CUDA
//! executor on the host kernels ([`Hosted`]), against the same plan computed by the CPU
//! backend: burst parallelism, SOAP splits of convolutions and dense layers, and 1F1B and
//! GPipe pipelines, each on 4 ranks. On a GPU the same path runs with `ralpc run --backend
//! cuda` (ranks sharing one GPU, or one per GPU under a launcher).

mod common;

use std::path::Path;

use ralpc_cuda_host::Host;
use ralpc_runtime_min::cpu::exec::Compute;
use ralpc_runtime_min::cpu::train::TrainReport;
use ralpc_runtime_min::cuda::hosted::Hosted;

/// The plan of `strategy` for `model`, run on the CPU backend and through the hosted
/// device.
fn both(model: &Path, gpus: u32, strategy: &str) -> (TrainReport, TrainReport) {
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
    let cpu = ralpc::run(&options).expect("cpu run").report;
    let device = |_: u32| -> Result<Box<dyn Compute>, String> { Ok(Box::new(Hosted::new(Host))) };
    let hosted = ralpc::run_with_compute(&options, &device)
        .expect("hosted run")
        .report;
    (hosted, cpu)
}

fn check(what: &str, model: &str, gpus: u32, strategy: &str) {
    let (got, want) = both(&common::fixture(model), gpus, strategy);
    for (g, w) in got.losses.iter().zip(&want.losses) {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: loss {g} against {w}"
        );
    }
    for (name, w) in &want.weights {
        let e = common::relative_error(&got.weights[name], w);
        assert!(e <= 1e-5, "{what}: weight {name}: relative error {e}");
    }
}

fn split(layer: &str, s: u32, a: u32, p: u32) -> String {
    format!(
        r#"{{ "name": "{layer}", "split": {{ "sample": {s}, "attribute": {a}, "parameter": {p} }} }}"#
    )
}

fn strategy(stages: &str, layers: &[String], schedule: &str, microbatches: u32) -> String {
    format!(
        r#"{{ "format": "ralpc-strategy/1", "schedule": "{schedule}", "microbatches": {microbatches},
             "stages": [{stages}], "layers": [{}] }}"#,
        layers.join(", ")
    )
}

const ONE_STAGE: &str = r#"{ "first_layer": "conv0", "last_layer": "fc1", "replicas": 4 }"#;
const TWO_STAGES: &str = r#"{ "first_layer": "conv0", "last_layer": "pool0", "replicas": 2 },
    { "first_layer": "conv1", "last_layer": "fc1", "replicas": 2 }"#;

#[test]
fn burst_plans_run_on_the_device_as_on_the_cpu() {
    let layers = [
        split("conv1", 2, 1, 1),
        split("pool1", 2, 1, 1),
        split("fc0", 1, 1, 1),
        split("fc1", 1, 1, 1),
    ];
    check(
        "burst",
        "train/cnn.onnx",
        4,
        &strategy(ONE_STAGE, &layers, "1f1b", 1),
    );
}

#[test]
fn soap_plans_run_on_the_device_as_on_the_cpu() {
    let layers = [
        split("conv1", 2, 1, 2),
        split("pool1", 2, 1, 2),
        split("fc0", 1, 1, 4),
        split("fc1", 1, 4, 1),
    ];
    check(
        "soap",
        "train/cnn.onnx",
        4,
        &strategy(ONE_STAGE, &layers, "1f1b", 1),
    );
}

#[test]
fn pipelines_run_on_the_device_as_on_the_cpu() {
    check(
        "1f1b",
        "train/cnn.onnx",
        4,
        &strategy(TWO_STAGES, &[], "1f1b", 2),
    );
    check(
        "gpipe",
        "train/cnn.onnx",
        4,
        &strategy(TWO_STAGES, &[], "gpipe", 2),
    );
}
