//! The ONNX backend node tests (onnx 1.22.0, `fixtures/onnx-node/`) run forward on the CPU
//! backend: each test's inputs through the interpreter, its outputs compared with the
//! expected ones (floats within rtol 1e-4, atol 1e-5; integers and booleans exactly).
//! `fixtures/onnx-node-run.txt` lists the tests that must pass;
//! `RALPC_BLESS=1 cargo test -p ralpc-runtime-min --test onnx_node_run` rewrites it.

use std::path::{Path, PathBuf};

use ralpc_runtime_min::cpu::graph::{self, Values, Weights};
use ralpc_runtime_min::cpu::ops::{Env, Mode};
use ralpc_runtime_min::cpu::tensor::{Data, Tensor};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn read_tensor(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let (_, data) = ralpc_ir::onnx::read_tensor(&bytes, None).map_err(|e| e.to_string())?;
    let shape: Vec<usize> = data.dims.iter().map(|&d| d as usize).collect();
    let values = data.to_f64s().map_err(|e| e.to_string())?;
    Ok(if data.dtype.is_float() {
        Tensor::f32(shape, values.iter().map(|&v| v as f32).collect())
    } else {
        Tensor::i64(shape, values.iter().map(|&v| v as i64).collect())
    })
}

fn compare(name: &str, got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!(
            "{name}: shape {:?}, expected {:?}",
            got.shape, want.shape
        ));
    }
    match (&got.data, &want.data) {
        (Data::F32(g), Data::F32(w)) => {
            for (i, (a, b)) in g.iter().zip(w.iter()).enumerate() {
                let ok =
                    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-5 + 1e-4 * b.abs();
                if !ok {
                    return Err(format!("{name}[{i}]: {a}, expected {b}"));
                }
            }
            Ok(())
        }
        (Data::I64(g), Data::I64(w)) if g == w => Ok(()),
        _ => Err(format!(
            "{name}: got {:?}, expected {:?}",
            got.data, want.data
        )),
    }
}

fn run(dir: &Path, name: &str) -> Result<(), String> {
    let mut model =
        ralpc_ir::onnx::import(&dir.join(format!("{name}.onnx"))).map_err(|e| e.to_string())?;
    let data = dir.join(name);
    // Integer inputs (shapes, axes, pads) are compile-time constants to the verifier: give
    // it the test's values, as a model would carry them.
    let inputs = model.graph.inputs();
    for (i, &v) in inputs.iter().enumerate() {
        let bytes = std::fs::read(data.join(format!("input_{i}.pb"))).map_err(|e| e.to_string())?;
        let (_, tensor) = ralpc_ir::onnx::read_tensor(&bytes, None).map_err(|e| e.to_string())?;
        if !tensor.dtype.is_float() {
            let producer = model.graph.value(v).producer;
            model.graph.node_mut(producer).op = ralpc_ir::Op::Constant {
                tensor: std::sync::Arc::new(tensor),
                initializer: false,
            };
        }
    }
    ralpc_ir::bind(&mut model.graph, &Default::default()).map_err(|e| e.to_string())?;
    let info = ralpc_ir::verify(&model.graph).map_err(|e| e.to_string())?;
    let g = &model.graph;
    let weights = Weights::load(g, 0).map_err(|e| e.to_string())?;
    let mut values = Values::new(g);
    for (&v, t) in &weights.tensors {
        values.set(v, t.clone());
    }
    for (i, &v) in inputs.iter().enumerate() {
        if matches!(g.node(g.value(v).producer).op, ralpc_ir::Op::Input) {
            values.set(v, read_tensor(&data.join(format!("input_{i}.pb")))?);
        }
    }
    let env = Env {
        mode: Mode::Inference,
        exported_batch: None,
        samples: None,
    };
    graph::forward(g, info.order(), &mut values, env).map_err(|e| e.to_string())?;
    for (k, &out) in g.outputs().iter().enumerate() {
        let want = read_tensor(&data.join(format!("output_{k}.pb")))?;
        let got = values.get(out).ok_or("an output was not computed")?;
        compare(&g.value(out).name, got, &want)?;
    }
    Ok(())
}

#[test]
fn onnx_node_tests_run_forward_on_the_cpu_backend() {
    let dir = fixtures().join("onnx-node");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixtures/onnx-node")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".onnx").map(str::to_owned))
        .collect();
    names.sort();
    let (mut passing, mut failing) = (Vec::new(), Vec::new());
    for name in &names {
        let result =
            std::panic::catch_unwind(|| run(&dir, name)).unwrap_or_else(|_| Err("panicked".into()));
        match result {
            Ok(()) => passing.push(name.clone()),
            Err(e) => failing.push(format!("{name}: {e}")),
        }
    }
    let manifest = fixtures().join("onnx-node-run.txt");
    if std::env::var_os("RALPC_BLESS").is_some() {
        std::fs::write(&manifest, passing.join("\n") + "\n").expect("write the manifest");
        eprintln!(
            "{} of {} pass; failing:\n{}",
            passing.len(),
            names.len(),
            failing.join("\n")
        );
        return;
    }
    let required = std::fs::read_to_string(&manifest).expect("fixtures/onnx-node-run.txt");
    let missing: Vec<&str> = required
        .lines()
        .filter(|t| !passing.iter().any(|p| p == t))
        .collect();
    assert!(
        missing.is_empty(),
        "node tests that must pass but fail:\n{}\n\nall failures:\n{}",
        missing.join("\n"),
        failing.join("\n")
    );
    // No test panics: bad operands are errors.
    assert!(
        !failing.iter().any(|f| f.ends_with("panicked")),
        "panics:\n{}",
        failing.join("\n")
    );
}
