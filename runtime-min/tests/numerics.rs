//! The CPU backend's forward pass against onnxruntime's on every fixture model: the same
//! seeded weights and inputs (`fixtures/numerics/gen.py` reproduces ralpc's seeding and
//! stores onnxruntime's outputs), compared within rtol 1e-4, atol 1e-5 at every stored
//! element (a strided sample of at most 2048 per output).

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
    let path = fixtures().join("onnx").join(case).join("model.onnx");
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
    resnet50,
    vgg16,
    vit_b_16,
    wide_resnet101_2,
);
