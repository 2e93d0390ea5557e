//! Real models (the PyTorch exports in `fixtures/onnx/`) train with the plan `ralpc` makes
//! for them by default, equal to single-device training: one step's loss, output, every
//! weight gradient and the weights after it, within 1e-5 (relative). Each case is chosen
//! so that its default plan exercises what such models need of the executor: a patch
//! embedding split by output channels whose reshape and layout follow the cut, a pooling
//! split by channels before a flattening reshape, a row-parallel projection whose residual
//! add is fused after the product, sequence-first attention tensors split by samples.
//!
//! (The ONNX zoo's `light_*` models are no such check: their last layer's weights are a
//! constant fill, so the gradient below it is the rounding noise of a sum that is zero.)
//!
//! Small batches keep these models' CPU steps to seconds.

mod common;

use common::train::{assert_same, plan_and_run, reference, run_strategy};

/// `fixtures/onnx/<case>` planned for `gpus` at `batch` with no other option, run one
/// step, against one device.
fn default_plan_trains_as_one_device(case: &str, gpus: u32, batch: u64) {
    let model = common::fixture("onnx").join(case).join("model.onnx");
    let options = ralpc::Options {
        model: model.clone(),
        gpus: Some(gpus),
        batch: Some(batch),
        ..Default::default()
    };
    let got = plan_and_run(&options, 1);
    let want = reference(&model, batch, 1);
    assert_same(&format!("{case} on {gpus} GPUs"), &got, &want);
}

#[test]
fn vit_b_16() {
    default_plan_trains_as_one_device("vit_b_16", 4, 4);
}

#[test]
fn vit_b_16_with_its_patch_embedding_split_by_channels() {
    // What ralpc picks for ViT-B/16 at batch 32 on 8 GPUs: the patch embedding's 768
    // output channels cut, its `[b, 768, 196]` reshape made local.
    let model = common::fixture("onnx/vit_b_16/model.onnx");
    let strategy = r#"{ "format": "ralpc-strategy/1", "schedule": "1f1b", "microbatches": 1,
        "stages": [{ "first_layer": "node_Conv_1063", "last_layer": "node_Gemm_1356",
                     "replicas": 4 }],
        "layers": [{ "name": "node_Conv_1063", "gpus": 4,
                     "split": { "sample": 1, "attribute": 1, "parameter": 4 } }] }"#;
    let got = run_strategy(&model, 4, 4, strategy, 1);
    assert_same("vit patch split", &got, &reference(&model, 4, 1));
}

#[test]
fn vgg16() {
    default_plan_trains_as_one_device("vgg16", 4, 4);
}

#[test]
fn gpt2() {
    default_plan_trains_as_one_device("gpt2", 4, 4);
}

/// GPT-2 at tensor 2 × data 2 under ZeRO-3, two steps: each bucket's weights are gathered
/// before every pass and released to the rank's share after it, while the LayerNorm
/// weights the exporter merged into one initializer (read by every block's layers) stay
/// whole; the second step must see the first's updated weights everywhere.
#[test]
fn gpt2_under_zero_3_trains_two_steps_as_one_device() {
    use ralpc::passes::transformer::{Knobs, Recompute};
    let model = common::fixture("onnx").join("gpt2").join("model.onnx");
    let options = ralpc::Options {
        model: model.clone(),
        gpus: Some(4),
        batch: Some(4),
        family: ralpc::passes::plan::Family::parse("3d"),
        knobs: Knobs {
            tensor: Some(2),
            pipeline: Some(1),
            recompute: Some(Recompute::None),
            zero: Some(3),
            ..Knobs::default()
        },
        ..Default::default()
    };
    let got = plan_and_run(&options, 2);
    let want = reference(&model, 4, 2);
    assert_same("gpt2 t2 d2 ZeRO-3", &got, &want);
}

#[test]
fn convnext_tiny() {
    default_plan_trains_as_one_device("convnext_tiny", 4, 4);
}

#[test]
fn mobilenet_v2() {
    // Its default plan splits convolutions by rows: halo exchange.
    default_plan_trains_as_one_device("mobilenet_v2", 4, 4);
}

#[test]
fn densenet121() {
    // Batch normalization before its convolutions (BN → ReLU → Conv): under a sample
    // split every rank normalizes by the statistics of all the samples.
    default_plan_trains_as_one_device("densenet121", 4, 4);
}

#[test]
fn resnet50() {
    default_plan_trains_as_one_device("resnet50", 4, 4);
}

#[test]
fn efficientnet_b0() {
    default_plan_trains_as_one_device("efficientnet_b0", 4, 4);
}

#[test]
fn inception_v3() {
    default_plan_trains_as_one_device("inception_v3", 4, 4);
}

/// Fixtures whose default plan at 4 GPUs and batch 4 does not train as one device, and
/// why. Each is a gap, not an accepted answer.
const NOT_EQUAL_YET: [(&str, &str); 7] = [
    (
        "light_densenet121",
        "constant-fill last layer (fc6_w_0 = 0.02): every gradient below it is rounding noise \
         (off by up to 2e2 relative), while the first output and fc6's own gradients match; \
         it passed at 098d097 and fails at f75bff2 (not bisected: the host kernels' rounding \
         changed between them)",
    ),
    (
        "light_inception_v1",
        "constant-fill last layer: gradients are rounding noise (every gradient is off by \
         the same 6.5e-2)",
    ),
    (
        "light_bvlc_alexnet",
        "constant-fill last layer: gradients are rounding noise (every gradient is off by \
         the same 0.38: one noise vector scaled through the net)",
    ),
    (
        "light_inception_v2",
        "constant-fill last layer: gradients are rounding noise",
    ),
    (
        "light_resnet50",
        "constant-fill last layer: gradients are rounding noise",
    ),
    (
        "light_shufflenet",
        "constant-fill last layer: gradients are rounding noise",
    ),
    (
        "light_vgg19",
        "constant-fill last layer: gradients are rounding noise",
    ),
];

/// Every other fixture (2.5 minutes on 2 cores, so outside the default run).
#[test]
#[ignore = "slow: every fixture's step on the CPU"]
fn every_other_fixture_trains_its_default_plan_as_one_device() {
    for case in common::onnx_cases() {
        if NOT_EQUAL_YET.iter().any(|(c, _)| *c == case) {
            continue;
        }
        default_plan_trains_as_one_device(&case, 4, 4);
    }
}
