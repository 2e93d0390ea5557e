//! Measuring a model's ops on this machine's CPU (`ralpc profile MODEL --device cpu`) into
//! ralpc's profile format, which the planner reads with `--profile`.
//!
//! For each batch size the model runs forward once on seeded weights and inputs, which
//! gives every op realistic operands; then each distinct op signature is timed on its own:
//! forward and backward (from a gradient of ones), after warm-up runs, the median of the
//! repeats, with their spread; runs that spread widely are timed again.
//!
//! Measured outliers were the kernels, not the timing: ResNet-50's residual Add took
//! 25 ms backward against 0.7 ms forward because the backward of every binary op went
//! through the broadcasting path (widened copies, index vectors); equal shapes now take
//! an elementwise path (0.14 ms). Its first MaxPool (8 ms forward, 0.2 ms backward) walks
//! 9 taps per output where the backward scatters one; planes now run in parallel.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use ralpc_ir::{onnx, Graph, GraphInfo, NodeId, Op};
use ralpc_passes::cluster::Precision;
use ralpc_passes::profile::{Device, Entry, Point, Profile, Signature, FORMAT};
use ralpc_runtime_min::cpu::grad;
use ralpc_runtime_min::cpu::graph::{self, Values, Weights};
use ralpc_runtime_min::cpu::ops::{self, Env, Mode};
use ralpc_runtime_min::cpu::tensor::Tensor;
use ralpc_runtime_min::cpu::train::{Dataset, Loss};

use crate::error::Error;

/// What `ralpc profile` measures.
#[derive(Clone, Debug)]
pub struct ProfileOptions {
    /// The ONNX model.
    pub model: PathBuf,
    /// Per-device batch sizes to measure at.
    pub batch_sizes: Vec<u64>,
    /// Full shapes of inputs (`--input`), whose batch axis each batch size replaces: an image
    /// size or a sequence length to measure at; the others keep the model's own.
    pub inputs: BTreeMap<String, Vec<u64>>,
    /// Timed runs per op and direction (the median is kept), after one warm-up.
    pub repeats: u32,
    /// Seeds weights the model lacks and the inputs.
    pub seed: u64,
    /// Tensor-parallel degrees at which a recognized transformer's block products are
    /// measured too (those the model splits by), so that 3d plans are priced from them.
    pub tensor_parallel: Vec<u64>,
}

impl Default for ProfileOptions {
    fn default() -> ProfileOptions {
        ProfileOptions {
            model: PathBuf::new(),
            batch_sizes: vec![1, 2, 4, 8],
            inputs: BTreeMap::new(),
            repeats: 5,
            seed: 0,
            tensor_parallel: vec![1, 2, 4, 8],
        }
    }
}

/// A timed quantity: the median of its runs, µs, and their spread (interquartile range
/// over the median), when the runs were timed one by one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Timed {
    us: f64,
    spread: Option<f64>,
}

/// Runs whose middle half spreads wider than this around the median are timed again.
const NOISY: f64 = 0.2;

/// Rounds of runs at most (the first included) before a noisy median is kept anyway.
const ROUNDS: u32 = 3;

/// The median and relative interquartile range of `samples`.
fn summarize(samples: &mut [f64]) -> Timed {
    samples.sort_by(f64::total_cmp);
    let at = |q: usize| {
        samples
            .get(q * (samples.len() - 1) / 4)
            .copied()
            .unwrap_or(0.0)
    };
    let us = at(2);
    let spread = if us > 0.0 { (at(3) - at(1)) / us } else { 0.0 };
    Timed {
        us,
        spread: Some(spread),
    }
}

fn run_error(e: impl std::fmt::Display) -> Error {
    Error::Run(Box::new(e.to_string()))
}

/// Times `f` `repeats` times after one warm-up: the median µs and the spread. Runs that
/// spread wider than [`NOISY`] (another process took the core, a page fault storm) are
/// timed again, `repeats` more at a time, up to [`ROUNDS`] rounds; all runs count.
fn time<E>(repeats: u32, mut f: impl FnMut() -> Result<(), E>) -> Result<Timed, E> {
    f()?;
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        for _ in 0..repeats.max(1) {
            let start = Instant::now();
            f()?;
            samples.push(start.elapsed().as_secs_f64() * 1e6);
        }
        let timed = summarize(&mut samples);
        if timed.spread.is_none_or(|s| s <= NOISY) {
            break;
        }
    }
    Ok(summarize(&mut samples))
}

/// Times one batch size's op signatures: each signature's node, forward and backward µs.
type Measure<'m> = dyn FnMut(
        &Graph,
        &GraphInfo,
        &Weights,
        &Dataset,
        &[(Signature, NodeId)],
        &mut dyn FnMut(),
    ) -> Result<Vec<(Timed, Timed)>, Error>
    + 'm;

/// Measures every op signature of `options.model` on the CPU at each batch size;
/// `progress(done, total)` is called after each measurement.
///
/// # Errors
/// An unreadable or invalid model, or an op the CPU backend cannot run.
pub fn profile_cpu(
    options: &ProfileOptions,
    progress: &dyn Fn(u64, u64),
) -> Result<Profile, Error> {
    let device = Device {
        name: "cpu".to_owned(),
        note: format!(
            "ralpc {} CPU backend, {} threads; median of {} runs after a warm-up (more where \
             they spread)",
            env!("CARGO_PKG_VERSION"),
            rayon::current_num_threads(),
            options.repeats.max(1)
        ),
    };
    let repeats = options.repeats;
    profile_with(
        options,
        progress,
        device,
        &mut |g, info, weights, data, signatures, tick| {
            // Every value of the forward pass is kept: refuse a model that cannot fit.
            let totals = ralpc_ir::account(g, info).map_err(|e| Error::Account(Box::new(e)))?;
            let need = totals.weight_bytes.saturating_add(totals.activation_bytes);
            if let Some(have) = crate::run::memory_available().filter(|&have| need > have) {
                return Err(Error::setup(format!(
                    "profiling needs {:.2} GiB (weights and activations); this machine \
                         has {:.2} GiB available",
                    need as f64 / f64::from(1u32 << 30),
                    have as f64 / f64::from(1u32 << 30)
                )));
            }
            let env = Env {
                mode: Mode::Training,
                exported_batch: g.rebatch().map(|r| r.exported),
                samples: g
                    .rebatch()
                    .and_then(|r| r.batch.as_known())
                    .and_then(|b| usize::try_from(b).ok()),
            };
            let mut values = Values::new(g);
            for (&v, t) in weights.tensors.iter().chain(&data.inputs) {
                values.set(v, t.clone());
            }
            graph::forward(g, info.order(), &mut values, env).map_err(run_error)?;
            let mut out = Vec::with_capacity(signatures.len());
            for &(_, n) in signatures {
                let node = g.node(n);
                let inputs: Vec<Option<&Tensor>> = node
                    .inputs
                    .iter()
                    .map(|v| v.and_then(|v| values.get(v)))
                    .collect();
                let outputs = node.outputs.len();
                let site = g.site(n);
                let fail = |e: String| run_error(format!("{site}: {e}"));
                let mut saved = None;
                let forward_us = time(repeats, || {
                    saved = Some(ops::forward(&node.op, &inputs, outputs, env)?);
                    Ok::<(), ops::OpError>(())
                })
                .map_err(|e| fail(e.to_string()))?;
                let (outs, kept) = saved.ok_or_else(|| fail("no output".into()))?;
                let ones: Vec<Vec<f32>> = outs.iter().map(|o| vec![1.0; o.len()]).collect();
                let dys: Vec<Option<&[f32]>> = ones.iter().map(|o| Some(o.as_slice())).collect();
                let out_refs: Vec<&Tensor> = outs.iter().collect();
                // Ops without a backward pass (shape arithmetic) cost nothing backward.
                let backward_us = time(repeats, || {
                    grad::backward(&node.op, &inputs, &out_refs, &kept, &dys).map(|_| ())
                })
                .unwrap_or_default();
                out.push((forward_us, backward_us));
                tick();
            }
            Ok(out)
        },
    )
}

/// Measures every op signature of `options.model` on GPU `ordinal` at each batch size:
/// the CUDA executor's kernels and GEMMs, timed with CUDA events. The caller makes sure
/// the CUDA libraries load ([`ralpc_runtime_min::cuda::libs`]).
///
/// # Errors
/// An unreadable or invalid model, an op the CUDA backend cannot run, or the GPU failing.
pub fn profile_cuda(
    options: &ProfileOptions,
    ordinal: usize,
    progress: &dyn Fn(u64, u64),
) -> Result<Profile, Error> {
    use ralpc_runtime_min::cuda::{device, gpu::Gpu, libs};
    libs::check(&libs::Lib::ONE_GPU)?;
    let gpu = Gpu::new(ordinal).map_err(|e| Error::setup(format!("cuda:{ordinal}: {e}")))?;
    let name = device::devices()
        .ok()
        .and_then(|d| d.into_iter().find(|d| d.ordinal == ordinal))
        .map_or_else(|| format!("cuda:{ordinal}"), |d| d.name);
    let note = format!(
        "ralpc {} CUDA backend (NVRTC kernels, cuBLAS, cuDNN, fp32, TF32 off); CUDA \
         events, median of {} samples of 4 back-to-back runs after a warm-up",
        env!("CARGO_PKG_VERSION"),
        options.repeats.max(1)
    );
    profile_on(&gpu, Device { name, note }, options, progress)
}

/// Measures every op signature of `options.model` on the CUDA executor's device `dev`
/// (a GPU, the host-compiled kernels, the counting device) at each batch size, timed
/// between the device's marks.
///
/// # Errors
/// An unreadable or invalid model, an op the backend cannot run, or the device failing.
pub fn profile_on<B: ralpc_runtime_min::cuda::backend::Backend>(
    dev: &B,
    device: Device,
    options: &ProfileOptions,
    progress: &dyn Fn(u64, u64),
) -> Result<Profile, Error> {
    use ralpc_runtime_min::cuda::train as device_train;
    let repeats = options.repeats;
    profile_with(
        options,
        progress,
        device,
        &mut |g, info, weights, data, signatures, tick| {
            let nodes: Vec<NodeId> = signatures.iter().map(|&(_, n)| n).collect();
            let times = device_train::profile(dev, g, info, weights, data, &nodes, repeats)
                .map_err(run_error)?;
            let by_node: BTreeMap<NodeId, (f64, f64)> = times
                .iter()
                .map(|t| (t.node, (t.forward_us, t.backward_us)))
                .collect();
            Ok(nodes
                .iter()
                .map(|n| {
                    tick();
                    let (forward, backward) = by_node.get(n).copied().unwrap_or((0.0, 0.0));
                    let timed = |us| Timed { us, spread: None };
                    (timed(forward), timed(backward))
                })
                .collect())
        },
    )
}

/// The profile of `options.model` at each batch size, each batch's signatures timed by
/// `measure`.
fn profile_with(
    options: &ProfileOptions,
    progress: &dyn Fn(u64, u64),
    device: Device,
    measure: &mut Measure<'_>,
) -> Result<Profile, Error> {
    let model = onnx::import(&options.model)?.graph;
    let mut batches = options.batch_sizes.clone();
    batches.sort_unstable();
    batches.dedup();
    // The model's own ops, then a transformer's block products on each tensor-parallel
    // rank that the model's graph lacks.
    let mut graphs = vec![(model, options.inputs.clone())];
    if let Some(products) = block_products(&graphs[0].0, options)? {
        let bytes = ralpc_ir::models::products(&products).map_err(|e| {
            Error::Internal(Box::new(format!("the block's products as a model: {e}")))
        })?;
        let graph = onnx::import_bytes(&bytes, std::path::Path::new("products.onnx"), None)?;
        graphs.push((graph.graph, BTreeMap::new()));
    }
    let mut points: BTreeMap<Signature, Vec<Point>> = BTreeMap::new();
    // Per graph and batch size: the signatures to measure, each at one of its nodes.
    type Signatures = Vec<(Signature, NodeId)>;
    let mut plans: Vec<(usize, u64, Signatures)> = Vec::new();
    let mut total = 0u64;
    for (k, (unbound, inputs)) in graphs.iter().enumerate() {
        for &batch in &batches {
            let (g, info) = crate::run::at_batch(unbound, batch, inputs)?;
            // Every batch size before any is allocated: the largest may not fit. (Each value,
            // and the inputs with the weights, which every device loads on the host; the
            // CPU's activations before it measures.)
            let totals = ralpc_ir::account(&g, &info).map_err(|e| Error::Account(Box::new(e)))?;
            crate::run::check_value_sizes(
                &g,
                &info,
                &format!("batch size {batch}"),
                totals.weight_bytes,
            )?;
            let mut seen: BTreeMap<Signature, NodeId> = BTreeMap::new();
            for &n in info.order() {
                if matches!(g.node(n).op, Op::Input | Op::Constant { .. }) {
                    continue;
                }
                if let Some(s) = Signature::of(&g, &info, n) {
                    seen.entry(s).or_insert(n);
                }
            }
            total += seen.len() as u64;
            if !seen.is_empty() {
                plans.push((k, batch, seen.into_iter().collect()));
            }
        }
    }
    let mut done = 0;
    let mut device = device;
    let mut model_unmeasured = false;
    let mut model_measured = false;
    for (k, batch, signatures) in plans {
        // A signature the model's own graph measured at this batch is not measured again.
        let (signatures, known): (Vec<_>, Vec<_>) = signatures.into_iter().partition(|(s, _)| {
            !points
                .get(s)
                .is_some_and(|at| at.iter().any(|q| q.batch == batch))
        });
        done += known.len() as u64;
        if signatures.is_empty() || (k == 0 && model_unmeasured) {
            done += signatures.len() as u64;
            continue;
        }
        let (unbound, inputs) = &graphs[k];
        let (g, info) = crate::run::at_batch(unbound, batch, inputs)?;
        let weights = Weights::load(&g, options.seed).map_err(run_error)?;
        let data = Dataset::synthetic(&g, &info, options.seed, Loss::CrossEntropy);
        let mut tick = || {
            done += 1;
            progress(done, total);
        };
        let times = match measure(&g, &info, &weights, &data, &signatures, &mut tick) {
            Ok(times) => times,
            // A backend that cannot run the model's own ops (the CUDA executor lacks some a
            // GPT needs) still measures its blocks' products, which 3d plans price from. Only
            // a failure at the first batch falls back: one after some were measured (out of
            // memory at a larger batch) is the user's to see.
            Err(Error::Run(m)) if k == 0 && graphs.len() > 1 && !model_measured => {
                device.note.push_str(&format!(
                    "; the model's own ops were not measured (at batch {batch}: {m}), only \
                     its blocks' products"
                ));
                model_unmeasured = true;
                done = total.min(done + signatures.len() as u64);
                continue;
            }
            Err(Error::Run(m)) => return Err(run_error(format!("at batch {batch}: {m}"))),
            Err(e) => return Err(e),
        };
        model_measured |= k == 0;
        for ((signature, _), (forward, backward)) in signatures.into_iter().zip(times) {
            points.entry(signature).or_default().push(Point {
                batch,
                forward_us: forward.us,
                backward_us: backward.us,
                peak_bytes: None,
                forward_spread: forward.spread,
                backward_spread: backward.spread,
            });
        }
    }
    let profile = Profile {
        format: FORMAT.to_owned(),
        device,
        precision: Precision::Fp32,
        entries: points
            .into_iter()
            .map(|(signature, points)| Entry { signature, points })
            .collect(),
    };
    profile
        .normalize(&options.model.display().to_string())
        .map_err(|e| Error::Profile(Box::new(e)))
}

/// A recognized transformer's block products on each of `options.tensor_parallel`'s
/// degrees that split it, at its sequence length (`None`: the model is no transformer).
fn block_products(
    model: &Graph,
    options: &ProfileOptions,
) -> Result<Option<Vec<ralpc_ir::models::Product>>, Error> {
    let Some(&batch) = options.batch_sizes.first() else {
        return Ok(None);
    };
    let (g, info) = crate::run::at_batch(model, batch, &options.inputs)?;
    let Ok(shape) = ralpc_passes::transformer::recognize(&g, &info) else {
        return Ok(None);
    };
    let mut degrees = options.tensor_parallel.clone();
    degrees.sort_unstable();
    degrees.dedup();
    let products: Vec<_> = degrees
        .into_iter()
        .filter(|&t| u32::try_from(t).is_ok_and(|t| shape.splits_by(t)))
        .flat_map(|t| {
            shape.dense_gemms(t).map(|p| ralpc_ir::models::Product {
                name: format!("t{t}.{}", p.name),
                rows: shape.sequence,
                inner: p.inner,
                cols: p.cols,
            })
        })
        .collect();
    Ok((!products.is_empty()).then_some(products))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spread_is_the_interquartile_range_over_the_median() {
        let t = summarize(&mut [5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(t.us, 3.0);
        assert_eq!(t.spread, Some(2.0 / 3.0));
        assert_eq!(summarize(&mut [7.0]).spread, Some(0.0));
    }

    #[test]
    fn noisy_runs_are_timed_again() {
        // Every other run is 10× slower: wide spread, so all rounds run.
        let mut runs = 0u32;
        let mut slow = false;
        let t = time(4, || {
            runs += 1;
            slow = !slow;
            let spin = Instant::now();
            let wait = std::time::Duration::from_micros(if slow { 2000 } else { 200 });
            while spin.elapsed() < wait {}
            Ok::<(), String>(())
        })
        .unwrap();
        assert_eq!(runs, 1 + 4 * ROUNDS, "a warm-up and every round");
        assert!(t.spread.is_some_and(|s| s > NOISY));
    }
}
