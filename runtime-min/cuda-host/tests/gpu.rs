//! On an NVIDIA GPU (`cargo test -p ralpc-cuda-host --test gpu -- --ignored`): the CUDA
//! executor on the real device trains every fixture as the CPU backend does, within 1e-3
//! (TF32 off), and reports its step times. The same executor on the host kernels is
//! checked in `tests/train.rs` on every machine.

mod common;

use std::time::Instant;

use ralpc_runtime_min::cpu::graph::Weights;
use ralpc_runtime_min::cpu::train::{train_reference, Dataset, Loss, TrainOptions};
use ralpc_runtime_min::cuda::backend::Backend as _;
use ralpc_runtime_min::cuda::gpu::Gpu;
use ralpc_runtime_min::cuda::libs::{self, Lib, Resolution};
use ralpc_runtime_min::cuda::train::train;

/// GPU 0, or `None` when this test re-ran itself in a child whose loader path has the
/// CUDA libraries (pip wheels sit outside it) and the child passed.
fn gpu(test: &str) -> Option<Gpu> {
    match libs::resolve(&Lib::ONE_GPU).unwrap_or_else(|e| panic!("{e}")) {
        Resolution::Ready => Some(Gpu::new(0).unwrap_or_else(|e| panic!("{e}"))),
        Resolution::Restart { library_path, .. } => {
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

fn check(gpu: &Gpu, model: &str, batch: u64, steps: u32) {
    let (graph, info) = common::load(model, batch);
    let weights = Weights::load(&graph, 5).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 5, Loss::CrossEntropy);
    let options = TrainOptions {
        steps,
        seed: 5,
        lr: 0.05,
        momentum: 0.9,
        loss: Loss::CrossEntropy,
    };
    let want = train_reference(&graph, &info, &weights, &data, &options).expect("cpu");
    let started = Instant::now();
    let got = train(gpu, &graph, &info, &weights, &data, &options)
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    gpu.synchronize().expect("GPU");
    eprintln!(
        "{model} batch {batch}: {steps} step(s) on the GPU in {:.3} s; losses {:?} (CPU {:?})",
        started.elapsed().as_secs_f64(),
        got.losses,
        want.losses
    );
    for (g, w) in got.losses.iter().zip(&want.losses) {
        assert!(
            (g - w).abs() <= 1e-3 * w.abs().max(1.0),
            "{model}: loss {g} against {w}"
        );
    }
    for (name, w) in &want.first_gradients {
        let e = common::relative_error(&got.first_gradients[name], w);
        assert!(e <= 1e-3, "{model}: gradient {name}: relative error {e}");
    }
    for (name, w) in &want.weights {
        let e = common::relative_error(&got.weights[name], w);
        assert!(e <= 1e-3, "{model}: weight {name}: relative error {e}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fixtures_train_on_the_gpu_as_on_the_cpu() {
    let Some(gpu) = gpu("fixtures_train_on_the_gpu_as_on_the_cpu") else {
        return;
    };
    check(&gpu, "train/mlp.onnx", 8, 3);
    check(&gpu, "train/cnn.onnx", 8, 3);
    check(&gpu, "train/transformer.onnx", 4, 3);
    check(&gpu, "onnx/resnet50/model.onnx", 4, 1);
    check(&gpu, "onnx/vgg16/model.onnx", 2, 1);
    check(&gpu, "onnx/mobilenet_v2/model.onnx", 4, 1);
    check(&gpu, "onnx/efficientnet_b0/model.onnx", 4, 1);
}
