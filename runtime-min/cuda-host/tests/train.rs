//! The CUDA executor (`ralpc_runtime_min::cuda::train`) on the host kernels against the CPU
//! backend's single-device training: the same losses, first gradients and weights after
//! three SGD steps. Everything the GPU runs except the launches themselves is checked
//! here: how each operator maps to kernels and GEMMs, the backward passes, the loss and
//! the optimizer.

mod common;

use ralpc_cuda_host::Host;
use ralpc_runtime_min::cpu::graph::Weights;
use ralpc_runtime_min::cpu::train::{train_reference, Dataset, Loss, TrainOptions, TrainReport};
use ralpc_runtime_min::cuda::train::train;

fn compare(got: &TrainReport, want: &TrainReport, tol: f64) {
    assert_eq!(got.losses.len(), want.losses.len());
    for (g, w) in got.losses.iter().zip(&want.losses) {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "loss {g} against {w}"
        );
    }
    assert!(common::relative_error(&got.first_output, &want.first_output) <= tol);
    for (maps, what) in [
        ((&got.first_gradients, &want.first_gradients), "gradient"),
        ((&got.weights, &want.weights), "weight"),
    ] {
        assert_eq!(
            maps.0.keys().collect::<Vec<_>>(),
            maps.1.keys().collect::<Vec<_>>()
        );
        for (name, w) in maps.1 {
            let e = common::relative_error(&maps.0[name], w);
            assert!(e <= tol, "{what} {name}: relative error {e}");
        }
    }
}

fn check(model: &str, batch: u64, loss: Loss) {
    check_steps(model, batch, loss, 3, 1e-4);
}

fn check_steps(model: &str, batch: u64, loss: Loss, steps: u32, tol: f64) {
    let (graph, info) = common::load(model, batch);
    let weights = Weights::load(&graph, 3).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 3, loss);
    let options = TrainOptions {
        steps,
        seed: 3,
        lr: 0.05,
        momentum: 0.9,
        loss,
        ..TrainOptions::default()
    };
    let want = train_reference(&graph, &info, &weights, &data, &options).expect("cpu");
    let got = train(&Host, &graph, &info, &weights, &data, &options)
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    compare(&got, &want, tol);
    if steps > 1 {
        assert!(
            want.losses[steps as usize - 1] < want.losses[0],
            "{model} trains: {:?}",
            want.losses
        );
    }
}

#[test]
fn mlp_trains_as_on_the_cpu() {
    check("train/mlp.onnx", 8, Loss::CrossEntropy);
    check("train/mlp.onnx", 4, Loss::Mse);
}

#[test]
fn cnn_trains_as_on_the_cpu() {
    check("train/cnn.onnx", 4, Loss::CrossEntropy);
}

#[test]
fn transformer_block_trains_as_on_the_cpu() {
    check("train/transformer.onnx", 2, Loss::CrossEntropy);
}

/// Batch norm, residual additions, padded max pooling and global average pooling. Batch
/// norm over two samples amplifies rounding (the CPU accumulates its statistics in f64,
/// the kernels in f32): 1e-3, the GPU validation's tolerance.
#[test]
fn resnet50_trains_as_on_the_cpu() {
    check_steps("onnx/resnet50/model.onnx", 2, Loss::CrossEntropy, 1, 1e-3);
}

/// Depthwise (grouped) convolutions, ReLU6 as Clip, inverted residuals.
#[test]
fn mobilenet_v2_trains_as_on_the_cpu() {
    check_steps(
        "onnx/mobilenet_v2/model.onnx",
        2,
        Loss::CrossEntropy,
        1,
        1e-3,
    );
}

/// SiLU as Sigmoid·Mul, squeeze-and-excitation (broadcast multiplies), ReduceMean.
#[test]
fn efficientnet_b0_trains_as_on_the_cpu() {
    check_steps(
        "onnx/efficientnet_b0/model.onnx",
        2,
        Loss::CrossEntropy,
        1,
        1e-3,
    );
}

#[test]
fn vgg16_trains_as_on_the_cpu() {
    check_steps("onnx/vgg16/model.onnx", 1, Loss::CrossEntropy, 1, 1e-4);
}

#[test]
fn an_operator_without_a_lowering_is_named() {
    // VGG16 runs on the device path; a Gather (GPT-2's embedding) is refused by name.
    let (graph, info) = common::load("onnx/gpt2_torchscript/model.onnx", 1);
    let weights = Weights::load(&graph, 0).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 0, Loss::CrossEntropy);
    let e = train(
        &Host,
        &graph,
        &info,
        &weights,
        &data,
        &TrainOptions::default(),
    )
    .expect_err("GPT-2 needs Gather");
    // The node, then the device's reason as its cause: the model's, not a bug in ralpc.
    assert!(e.to_string().contains("/wte/Gather"), "{e}");
    let ralpc_runtime_min::cpu::graph::ExecError::Device { source, .. } = &e else {
        panic!("not the device's refusal: {e}");
    };
    assert!(!source.is_bug() && !source.is_setup(), "{source:?}");
    let e = ralpc_runtime_min::error_chain(&e);
    assert!(e.contains("is not on the CUDA backend yet"), "{e}");
}

/// `ralpc profile --device cuda:N`'s measurement, on the host kernels: every node of the
/// CNN timed forward, and backward where it has a gradient.
#[test]
fn every_node_is_timed() {
    use ralpc_ir::Op;
    use ralpc_runtime_min::cuda::train::profile;
    let (graph, info) = common::load("train/cnn.onnx", 2);
    let weights = Weights::load(&graph, 1).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 1, Loss::CrossEntropy);
    let nodes: Vec<_> = info
        .order()
        .iter()
        .copied()
        .filter(|&n| !matches!(graph.node(n).op, Op::Input | Op::Constant { .. }))
        .collect();
    let times = profile(&Host, &graph, &info, &weights, &data, &nodes, 3).expect("profile");
    assert_eq!(times.iter().map(|t| t.node).collect::<Vec<_>>(), nodes);
    for t in &times {
        let op = &graph.node(t.node).op;
        assert!(t.forward_us > 0.0, "{op:?}");
        if matches!(op, Op::Conv(_) | Op::Gemm(_)) {
            assert!(t.backward_us > 0.0, "{op:?}");
        }
    }
}
