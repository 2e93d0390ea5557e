//! Times the CPU backend's forward pass of a model (for `benches/cpu_vs_onnxruntime.py`):
//! `cargo run --release --example forward_time -- MODEL BATCH [NAME=D0,D1,...] [REPEATS]`
//! prints one JSON object with the median and all times in milliseconds. Weights and inputs
//! are seeded as `fixtures/numerics/gen.py` seeds them, so onnxruntime can run the same.

use std::collections::BTreeMap;
use std::time::Instant;

use ralpc::ir::{bind, onnx, verify, Bindings};
use ralpc::runtime::cpu::graph::{self, Values, Weights};
use ralpc::runtime::cpu::ops::{Env, Mode};
use ralpc::runtime::cpu::train::{Dataset, Loss};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As `ralpc` does, so the times are what `ralpc run` sees.
    ralpc::keep_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args
        .first()
        .ok_or("usage: forward_time MODEL BATCH [NAME=DIMS] [REPEATS]")?;
    let batch: u64 = args.get(1).ok_or("BATCH is missing")?.parse()?;
    let mut inputs = BTreeMap::new();
    let mut repeats = 5usize;
    for a in &args[2..] {
        if let Some((name, dims)) = a.split_once('=') {
            let dims: Result<Vec<u64>, _> = dims.split(',').map(str::parse).collect();
            inputs.insert(name.to_owned(), dims?);
        } else {
            repeats = a.parse()?;
        }
    }
    let mut g = onnx::import(std::path::Path::new(model))?.graph;
    let batch = if inputs.is_empty() { Some(batch) } else { None };
    bind(&mut g, &Bindings { batch, inputs })?;
    let info = verify(&g)?;
    let weights = Weights::load(&g, 0)?;
    let data = Dataset::synthetic(&g, &info, 0, Loss::CrossEntropy);
    let env = Env {
        mode: Mode::Inference,
        exported_batch: g.rebatch().map(|r| r.exported),
        samples: None,
    };
    let mut times = Vec::new();
    for i in 0..=repeats {
        let mut values = Values::new(&g);
        for (&v, t) in weights.tensors.iter().chain(&data.inputs) {
            values.set(v, t.clone());
        }
        let start = Instant::now();
        graph::forward(&g, info.order(), &mut values, env)?;
        if i > 0 {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "{{\"median_ms\": {:.3}, \"times_ms\": {:?}, \"threads\": {}}}",
        sorted[sorted.len() / 2],
        times,
        rayon::current_num_threads()
    );
    Ok(())
}
