//! The CPU backend's forward pass against onnxruntime's on every fixture model: the same
//! seeded weights and inputs (`fixtures/numerics/gen.py` reproduces ralpc's seeding and
//! stores onnxruntime's outputs), compared within rtol 1e-4, atol 1e-5 at every stored
//! element (a strided sample of at most 2048 per output). Small models of `fixtures/train/`
//! are checked the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ralpc_runtime_min::cpu::graph::{self, Values, Weights};
use ralpc_runtime_min::cpu::init;
use ralpc_runtime_min::cpu::ops::{Env, Mode};
use ralpc_runtime_min::cpu::tensor::Tensor;
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    seed: u64,
    inputs: BTreeMap<String, Vec<u64>>,
    outputs: Vec<Output>,
}

#[derive(Deserialize)]
struct Output {
    name: String,
    shape: Vec<usize>,
    stride: usize,
    values: Vec<f64>,
    abs_sum: f64,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// Runs `case` forward as the reference says; the outputs by name.
fn forward(case: &str, reference: &Reference) -> BTreeMap<String, Tensor> {
    // A fixture model, or one of the small models of `fixtures/train/`.
    let fixture = fixtures().join("onnx").join(case).join("model.onnx");
    let path = match fixture.exists() {
        true => fixture,
        false => fixtures().join("train").join(format!("{case}.onnx")),
    };
    let mut model = ralpc_ir::onnx::import(&path).expect("import");
    let bindings = ralpc_ir::Bindings {
        batch: None,
        inputs: reference.inputs.clone(),
    };
    ralpc_ir::bind(&mut model.graph, &bindings).expect("bind");
    let info = ralpc_ir::verify(&model.graph).expect("verify");
    let g = &model.graph;
    let weights = Weights::load(g, reference.seed).expect("weights");
    let mut values = Values::new(g);
    for (&v, t) in &weights.tensors {
        values.set(v, t.clone());
    }
    for v in g.inputs() {
        let ty = info.ty(v);
        let shape: Vec<usize> = ty
            .shape
            .as_sizes()
            .expect("bound input")
            .iter()
            .map(|&d| d as usize)
            .collect();
        let range = init::index_range(g, v, |w| info.ty(w).shape.as_sizes());
        let data = init::input(
            reference.seed,
            &g.value(v).name,
            shape.iter().product(),
            ty.dtype.is_float(),
            range,
        );
        values.set(v, Tensor { shape, data });
    }
    let env = Env {
        mode: Mode::Inference,
        exported_batch: g.rebatch().map(|r| r.exported),
        samples: None,
    };
    graph::forward(g, info.order(), &mut values, env).expect("forward");
    g.outputs()
        .iter()
        .map(|&o| (g.value(o).name.clone(), values.take(o).expect("output")))
        .collect()
}

fn check(case: &str) {
    let text = std::fs::read_to_string(fixtures().join("numerics").join(format!("{case}.json")))
        .expect("reference");
    let reference: Reference = serde_json::from_str(&text).expect("reference json");
    let outputs = forward(case, &reference);
    for want in &reference.outputs {
        let got = outputs
            .get(&want.name)
            .unwrap_or_else(|| panic!("{case}: no output {}", want.name));
        assert_eq!(got.shape, want.shape, "{case}: {}", want.name);
        let values = got.to_f64s();
        // Seeded weights do not keep activations at unit scale (a ResNet's residual sums
        // grow into the hundreds), so both are measured in units of the output's RMS:
        // |ralpc − ort| / rms ≤ 1e-5 + 1e-4 · |ort| / rms.
        let rms = (want.values.iter().map(|w| w * w).sum::<f64>() / want.values.len() as f64)
            .sqrt()
            .max(f64::MIN_POSITIVE);
        let mut worst = 0.0f64;
        for (k, &w) in want.values.iter().enumerate() {
            let g = values[k * want.stride];
            let (g, w) = (g / rms, w / rms);
            let allowed = 1e-5 + 1e-4 * w.abs();
            worst = worst.max((g - w).abs() / allowed);
            assert!(
                (g - w).abs() <= allowed,
                "{case}: {}[{}] = {g}·rms, onnxruntime {w}·rms (rms {rms})",
                want.name,
                k * want.stride
            );
        }
        let abs_sum: f64 = values.iter().map(|v| v.abs()).sum();
        assert!(
            (abs_sum - want.abs_sum).abs() <= 1e-4 * want.abs_sum.max(1e-3),
            "{case}: {} sums to {abs_sum}, onnxruntime {}",
            want.name,
            want.abs_sum
        );
        eprintln!(
            "{case}: {} matches (rms {rms:.3e}; worst element at {worst:.2} of the tolerance)",
            want.name
        );
    }
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*
    };
}

cases!(
    densenet121,
    efficientnet_b0,
    gpt2_torchscript,
    inception_v3,
    light_bvlc_alexnet,
    light_densenet121,
    light_inception_v1,
    light_inception_v2,
    light_resnet50,
    light_shufflenet,
    light_squeezenet,
    light_vgg19,
    light_zfnet512,
    mobilenet_v2,
    // The ONNX generator's mixture of experts: a softmax router's top 2 of 4 SwiGLU
    // experts (TopK, ScatterElements of the gates), a shared expert, a dense first block.
    moe,
    resnet50,
    vgg16,
    vit_b_16,
    wide_resnet101_2,
);

/// A recurrent layer written as a `Loop` (TensorFlow's exporter's way,
/// `fixtures/train/loop.onnx`): unrolled at binding, its forward pass equals onnxruntime's
/// on the file's own weights (outputs stored from onnxruntime 1.32, input
/// `linspace(-1, 1, 30)` as `[2, 5, 3]`).
#[test]
fn a_loop_unrolled_at_binding_computes_as_onnxruntime() {
    let x: Vec<f32> = (0..30).map(|i| -1.0 + 2.0 * i as f32 / 29.0).collect();
    let y = forward_file("train/loop.onnx", vec![2, 5, 3], x, |g| {
        assert!(
            g.node_ids().all(|n| g.node(n).op.name() != "Loop"),
            "the Loop is unrolled"
        );
    });
    let want = [
        -0.090_815_05,
        -1.097_444_7,
        -0.914_678_9,
        0.907_019_4,
        -0.351_280_6,
        0.314_201_44,
        1.353_219_7,
        1.070_868_8,
        -1.165_015_7,
        0.563_379_4,
    ];
    let got = y.floats().expect("floats");
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
            "{got:?} vs {want:?}"
        );
    }
}

/// A file's forward pass at batch 2 on its own weights, its one input set to `x`;
/// `inspect` sees the bound graph first.
fn forward_file(
    file: &str,
    shape: Vec<usize>,
    x: Vec<f32>,
    inspect: impl Fn(&ralpc_ir::Graph),
) -> Tensor {
    let path = fixtures().join(file);
    let mut model = ralpc_ir::onnx::import(&path).expect("import");
    let bindings = ralpc_ir::Bindings {
        batch: Some(2),
        inputs: BTreeMap::new(),
    };
    ralpc_ir::bind(&mut model.graph, &bindings).expect("bind");
    let g = &model.graph;
    inspect(g);
    let info = ralpc_ir::verify(g).expect("verify");
    let weights = Weights::load(g, 0).expect("weights");
    let mut values = Values::new(g);
    for (&v, t) in &weights.tensors {
        values.set(v, t.clone());
    }
    values.set(g.inputs()[0], Tensor::f32(shape, x));
    let env = Env {
        mode: Mode::Inference,
        exported_batch: None,
        samples: None,
    };
    graph::forward(g, info.order(), &mut values, env).expect("forward");
    values.take(g.outputs()[0]).expect("output")
}

/// ONNX's `Attention` (grouped-query, causal) and ONNX Runtime's `MultiHeadAttention`
/// (unidirectional), expanded on import (`fixtures/train/fused_attention_ort.onnx`): the
/// forward pass equals onnxruntime 1.31.1's on the file's weights, input
/// `linspace(-1, 1, 192)` as `[2, 6, 16]`.
#[test]
fn fused_attention_operators_compute_as_onnxruntime() {
    let x: Vec<f32> = (0..192).map(|i| -1.0 + 2.0 * i as f32 / 191.0).collect();
    let y = forward_file("train/fused_attention_ort.onnx", vec![2, 6, 16], x, |g| {
        assert!(g.node_ids().all(|n| g.node(n).op.name() != "Attention"));
    });
    let got = y.floats().expect("floats");
    let near = |a: f32, b: f32| (a - b).abs() <= 1e-5 + 1e-4 * b.abs();
    let first = [
        0.353_792_64,
        0.189_795_75,
        0.569_314_06,
        -1.498_982_7,
        -3.432_963,
        0.400_818_2,
        0.994_238_5,
        -0.731_910_2,
    ];
    let later = [0.297_178_54, -0.034_910_385, -0.057_871_886, 0.182_307_21];
    assert_eq!(got.len(), 192);
    for (a, b) in got[..8]
        .iter()
        .zip(first)
        .chain(got[100..104].iter().zip(later))
    {
        assert!(near(*a, b), "{:?}", &got[..8]);
    }
    let abs_sum: f32 = got.iter().map(|v| v.abs()).sum();
    assert!(near(abs_sum, 102.248_79), "{abs_sum}");
}
