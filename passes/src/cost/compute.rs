//! Compute time of a layer on one GPU: from a profile when one covers it, else the
//! roofline max(FLOPs / (peak · efficiency), bytes / HBM bandwidth) + launch overhead.
//!
//! Whatever the source, a layer's time is never below the physical bound FLOPs / peak of
//! its share: a profile that claims otherwise was measured at another precision or is
//! wrong, and a plan built on it would promise the impossible.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cluster::{GpuType, Precision};
use crate::layers::{Layer, LayerGraph, LayerKind, Measured, Split};
use crate::profile::{interpolate, Found, Profile};

/// Per-kind fraction of peak throughput a layer reaches.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Efficiency(pub BTreeMap<LayerKind, f64>);

impl Default for Efficiency {
    /// Defaults: cuDNN convolutions and cuBLAS GEMMs at large sizes reach about half to
    /// two thirds of peak; other kinds are memory-bound, where efficiency hardly matters.
    fn default() -> Efficiency {
        Efficiency(
            LayerKind::ALL
                .iter()
                .map(|&k| {
                    let e = match k {
                        LayerKind::Conv => 0.5,
                        // A mixture of experts' work is its experts' products.
                        LayerKind::Dense | LayerKind::Experts => 0.6,
                        _ => 0.3,
                    };
                    (k, e)
                })
                .collect(),
        )
    }
}

impl Efficiency {
    /// The efficiency of a kind.
    pub fn of(&self, kind: LayerKind) -> f64 {
        self.0.get(&kind).copied().unwrap_or(0.3)
    }
}

impl Efficiency {
    /// Fits each kind's efficiency to a profile: for every compute-bound layer whose ops
    /// are all measured at the graph's batch, achieved FLOP/s over peak; the median per
    /// kind (kinds with no such layer keep their default).
    pub fn fit(graph: &LayerGraph, model: &ComputeModel<'_>, profile: &Profile) -> Efficiency {
        let mut samples: BTreeMap<LayerKind, Vec<f64>> = BTreeMap::new();
        for layer in &graph.layers {
            let flops = layer.fwd_flops as f64;
            let bytes = layer.local(Split::NONE).fwd_bytes;
            let kernels = layer.parts.iter().filter(|p| p.launches).count() as f64;
            if flops <= 0.0 || flops / model.peak < bytes / model.gpu.hbm_bandwidth {
                continue;
            }
            let times: Option<Vec<f64>> = layer
                .parts
                .iter()
                .filter(|p| p.launches)
                .map(|p| {
                    Some(
                        profile
                            .lookup(p.signature.as_ref()?, graph.batch as f64)?
                            .fwd_us,
                    )
                })
                .collect();
            let Some(total) = times.map(|t| t.iter().sum::<f64>()) else {
                continue;
            };
            let busy = total - model.launch_us * kernels;
            if busy > 0.0 {
                samples
                    .entry(layer.kind)
                    .or_default()
                    .push((model.bound_us(flops) / busy).clamp(0.01, 1.0));
            }
        }
        let mut fitted = Efficiency::default();
        for (kind, mut s) in samples {
            s.sort_by(f64::total_cmp);
            fitted.0.insert(kind, s[s.len() / 2]);
        }
        fitted
    }
}

/// Default per-kernel launch overhead, µs (CUDA launch plus framework dispatch).
pub const DEFAULT_LAUNCH_US: f64 = 5.0;

/// Where a layer's time came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Every op at a measured batch.
    Measured,
    /// Every op in the profile, some between or beyond measured batches.
    Interpolated,
    /// Every op in the profile, some outside the measured batches.
    Extrapolated,
    /// Measured as a whole (an imported layer graph), scaled to the local share.
    Scaled,
    /// Some ops in the profile, the others from the roofline.
    Partial,
    /// No profile entry: the roofline.
    Roofline,
}

/// A layer's compute time on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ComputeTime {
    /// Forward, µs.
    pub fwd_us: f64,
    /// Backward, µs.
    pub bwd_us: f64,
    /// Where it came from.
    pub source: Source,
}

/// A fused causal attention kernel's rates (FlashAttention's), FLOP/s of the whole square's
/// count: its forward computes the causal half of the two products, its backward recomputes
/// the scores and makes four more products (2.5 times the forward's work).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedAttention {
    /// Forward rate.
    pub forward: f64,
    /// Backward rate.
    pub backward: f64,
}

/// The compute cost model of one GPU type.
#[derive(Clone, Debug)]
pub struct ComputeModel<'a> {
    /// The GPU.
    pub gpu: &'a GpuType,
    /// Peak FLOP/s at the plan's precision.
    pub peak: f64,
    /// Roofline efficiencies.
    pub efficiency: Efficiency,
    /// The fraction of HBM bandwidth memory-bound kernels reach (1: the datasheet's).
    pub hbm_efficiency: f64,
    /// Per-kernel overhead, µs.
    pub launch_us: f64,
    /// Measurements, when given.
    pub profile: Option<&'a Profile>,
    /// Attention cores as one fused kernel, when set.
    pub fused_attention: Option<FusedAttention>,
}

impl<'a> ComputeModel<'a> {
    /// The roofline model of `gpu` at `precision` (FP32 when it lacks that precision).
    pub fn new(gpu: &'a GpuType, precision: Precision) -> ComputeModel<'a> {
        ComputeModel {
            gpu,
            peak: gpu.peak(precision).unwrap_or(gpu.fp32),
            efficiency: Efficiency::default(),
            hbm_efficiency: 1.0,
            launch_us: DEFAULT_LAUNCH_US,
            profile: None,
            fused_attention: None,
        }
    }

    /// The same model with measurements.
    pub fn with_profile(mut self, profile: &'a Profile) -> ComputeModel<'a> {
        self.profile = Some(profile);
        self
    }

    /// Roofline time of `flops` and `bytes` for a layer kind with `kernels` launches, µs.
    pub fn roofline_us(&self, kind: LayerKind, flops: f64, bytes: f64, kernels: f64) -> f64 {
        let compute = flops / (self.peak * self.efficiency.of(kind));
        let memory = bytes / (self.gpu.hbm_bandwidth * self.hbm_efficiency);
        compute.max(memory) * 1e6 + self.launch_us * kernels
    }

    /// The physical bound of `flops`: FLOPs / peak, µs.
    pub fn bound_us(&self, flops: f64) -> f64 {
        flops / self.peak * 1e6
    }

    /// Compute time of one rank's share of `layer` under `split`, where the layer's
    /// figures are for the global batch `batch`.
    pub fn layer(&self, layer: &Layer, split: Split, batch: u64) -> ComputeTime {
        let local = layer.local(split);
        let kernels = layer
            .parts
            .iter()
            .filter(|p| p.launches)
            .map(|p| p.steps)
            .sum::<u64>()
            .max(1) as f64;
        let (fwd, bwd, source) = if let Some(m) = &layer.measured {
            match curve_us(m, layer, split, batch) {
                Some(timed) => timed,
                None => (
                    m.fwd_us * local.work_fraction,
                    m.bwd_us * local.work_fraction,
                    Source::Scaled,
                ),
            }
        } else if let Some(timed) = self.profiled(layer, split, batch) {
            timed
        } else if layer.kind == LayerKind::Attention {
            let (fwd, bwd) = self.attention_us(layer, local.work_fraction);
            (fwd, bwd, Source::Roofline)
        } else {
            (
                self.roofline_us(layer.kind, local.fwd_flops, local.fwd_bytes, kernels),
                self.roofline_us(layer.kind, local.bwd_flops, 2.0 * local.fwd_bytes, kernels),
                Source::Roofline,
            )
        };
        // Estimates cannot beat the physical bound; measurements can seem to, and are
        // kept: cuDNN's Winograd and FFT convolutions multiply less than the direct
        // FLOP count (VGG16's 3×3 convolutions ran at 1.4× the H100's fp32 peak by it).
        let bounded = matches!(source, Source::Roofline | Source::Partial);
        let bound = |us: f64, flops: f64| {
            if bounded {
                us.max(self.bound_us(flops))
            } else {
                us
            }
        };
        ComputeTime {
            fwd_us: bound(fwd, local.fwd_flops),
            bwd_us: bound(bwd, local.bwd_flops),
            source,
        }
    }

    /// Roofline of an attention core op by op, each on its share `work` (a core splits
    /// by samples and heads alike): its two products run as GEMMs; its softmax, splits
    /// and transposes are memory-bound on what they read and write, which the core's own
    /// inputs and outputs do not show; its elementwise scale and mask are epilogues fused
    /// into the product before them, as in any fused layer (Megatron fuses them into its
    /// `FusedScaleMaskSoftmax`): they cost their launch.
    fn attention_us(&self, layer: &Layer, work: f64) -> (f64, f64) {
        if let Some(fused) = self.fused_attention {
            let products: f64 = layer
                .parts
                .iter()
                .filter(|p| p.op == "MatMul")
                .map(|p| p.fwd_flops as f64 * work)
                .sum();
            let causal = products / 2.0;
            return (
                causal / fused.forward * 1e6 + self.launch_us,
                2.5 * causal / fused.backward * 1e6 + self.launch_us,
            );
        }
        let (mut fwd, mut bwd) = (0.0, 0.0);
        for part in layer.parts.iter().filter(|p| p.launches) {
            let (kind, backward) = match part.op {
                "MatMul" => (LayerKind::Dense, 2.0),
                "Mul" | "Div" | "Add" | "Sub" | "Where" | "Cast" | "Sqrt" => {
                    fwd += self.launch_us;
                    bwd += self.launch_us;
                    continue;
                }
                _ => (LayerKind::Elementwise, 1.0),
            };
            let flops = part.fwd_flops as f64 * work;
            let bytes = part.bytes as f64 * work;
            fwd += self.roofline_us(kind, flops, bytes, 1.0);
            bwd += self.roofline_us(kind, backward * flops, 2.0 * bytes, 1.0);
        }
        (fwd, bwd)
    }

    /// Sum over the layer's ops of their profile times at the local batch; ops missing
    /// from the profile are costed by the roofline. `None` when no op is in the profile.
    fn profiled(&self, layer: &Layer, split: Split, batch: u64) -> Option<(f64, f64, Source)> {
        let profile = self.profile?;
        // A tile of 1/a of the rows runs like 1/a of the samples (the same output elements
        // per kernel), and so does a piece of each sequence; a parameter slice keeps the
        // batch and divides the op's work.
        let local_batch = local_batch(layer, split, batch);
        let share = 1.0 / f64::from(split.parameter.max(1));
        let (mut fwd, mut bwd, mut found, mut missing) = (0.0, 0.0, Found::Measured, 0);
        let mut hits = 0;
        for part in &layer.parts {
            match part
                .signature
                .as_ref()
                .and_then(|s| profile.lookup(s, local_batch))
            {
                Some(t) => {
                    fwd += t.fwd_us * share;
                    bwd += t.bwd_us * share;
                    found = found.max(t.found);
                    hits += 1;
                }
                None if !part.launches => {}
                None => {
                    let work = layer.local(split).work_fraction;
                    let flops = part.fwd_flops as f64 * work;
                    let bytes = part.bytes as f64 / f64::from(split.sample.max(1));
                    fwd += self.roofline_us(layer.kind, flops, bytes, 1.0);
                    bwd += self.roofline_us(layer.kind, flops, 2.0 * bytes, 1.0);
                    missing += 1;
                }
            }
        }
        if hits == 0 {
            return None;
        }
        let source = match (missing, found) {
            (0, Found::Measured) => Source::Measured,
            (0, Found::Interpolated) => Source::Interpolated,
            (0, Found::Extrapolated) => Source::Extrapolated,
            _ => Source::Partial,
        };
        Some((fwd, bwd, source))
    }
}

/// The batch a rank's kernels of `layer` see under `split`: its samples, times the share
/// of each sample's rows it computes (a tile of rows, a piece of each sequence).
fn local_batch(layer: &Layer, split: Split, batch: u64) -> f64 {
    let rows = split.attribute.max(1) * crate::plan::context_pieces(layer.kind, split);
    batch as f64 / f64::from(split.sample.max(1) * rows)
}

/// A measured layer's time at its local batch, where it was measured at several batches:
/// rows and samples alike shrink the batch a kernel sees; a parameter slice divides the
/// work (as [`ComputeModel::profiled`] does for per-op profiles).
fn curve_us(
    measured: &Measured,
    layer: &Layer,
    split: Split,
    batch: u64,
) -> Option<(f64, f64, Source)> {
    let t = interpolate(&measured.points, local_batch(layer, split, batch))?;
    let share = 1.0 / f64::from(split.parameter.max(1));
    let source = match t.found {
        Found::Measured => Source::Measured,
        Found::Interpolated => Source::Interpolated,
        Found::Extrapolated => Source::Extrapolated,
    };
    Some((t.fwd_us * share, t.bwd_us * share, source))
}
