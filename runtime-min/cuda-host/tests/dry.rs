//! The CUDA executor's training step at full size on a counting device: its GEMMs do the
//! model's work — three times the forward multiply-accumulates (forward, input gradient,
//! weight gradient) — and its peak memory at batch 64 fits an 80 GB GPU. Figures are
//! printed (`-- --nocapture`).

mod common;

use ralpc_cuda_host::dry::Dry;
use ralpc_ir::account;
use ralpc_runtime_min::cpu::graph::Weights;
use ralpc_runtime_min::cpu::train::{Dataset, Loss, TrainOptions};
use ralpc_runtime_min::cuda::train::train;

fn step(model: &str, batch: u64) {
    let (graph, info) = common::load(model, batch);
    let macs = account(&graph, &info).expect("account").macs as f64;
    let weights = Weights::load(&graph, 0).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 0, Loss::CrossEntropy);
    let dry = Dry::default();
    let options = TrainOptions {
        steps: 1,
        ..TrainOptions::default()
    };
    train(&dry, &graph, &info, &weights, &data, &options).expect("a step");
    let c = dry.counts();
    let ratio = c.gemm_flops / (6.0 * macs);
    eprintln!(
        "{model} batch {batch}: {} kernel launches + {} GEMMs per step, {:.1} GFLOP in GEMMs \
         ({ratio:.3}× 3·2·MACs), peak {:.2} GiB",
        c.launches,
        c.gemms,
        c.gemm_flops / 1e9,
        c.peak_bytes as f64 / (1u64 << 30) as f64
    );
    assert!(
        (0.98..=1.02).contains(&ratio),
        "{model}: GEMM work {ratio}× the model's"
    );
    assert!(
        c.peak_bytes < 80 << 30,
        "{model}: {} bytes at batch {batch}",
        c.peak_bytes
    );
}

#[test]
fn resnet50_at_batch_64() {
    step("onnx/resnet50/model.onnx", 64);
}

#[test]
fn vgg16_at_batch_64() {
    step("onnx/vgg16/model.onnx", 64);
}
