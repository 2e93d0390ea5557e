//! What each placement choice costs: compute time, communication time and memory.
//!
//! Units: time in µs, sizes in bytes, throughput in FLOP/s.

pub mod comm;
pub mod compute;
pub mod memory;
pub mod rates;

pub use comm::{Algorithm, Collective, Comm};
pub use compute::{ComputeModel, ComputeTime, Efficiency, FusedAttention, Source};
pub use memory::{MemoryUse, Optimizer};

use crate::cluster::{Cluster, Precision};
use crate::layers::LayerGraph;

/// The summed peak throughput of ranks `0..gpus` at `precision` (FP32 where a GPU lacks
/// it), FLOP/s.
pub fn combined_peak(cluster: &Cluster, gpus: u32, precision: Precision) -> f64 {
    (0..gpus)
        .map(|r| {
            let gpu = cluster.gpu(r);
            gpu.peak(precision).unwrap_or(gpu.fp32)
        })
        .sum()
}

/// The physical lower bound of one iteration on the first `gpus` GPUs of `cluster`: the
/// model's forward and backward FLOPs spread perfectly over their combined peak, µs.
///
/// Layers without FLOP counts (imported layer graphs) count their measured time, spread
/// over the GPUs, instead.
pub fn lower_bound_us(
    graph: &LayerGraph,
    cluster: &Cluster,
    gpus: u32,
    precision: Precision,
) -> f64 {
    let gpus = gpus.clamp(1, cluster.gpu_count().max(1));
    let peak = combined_peak(cluster, gpus, precision);
    let flops: f64 = graph.total_flops();
    let measured: f64 = graph
        .layers
        .iter()
        .filter(|l| l.fwd_flops == 0 && l.bwd_flops == 0)
        .filter_map(|l| l.measured.as_ref())
        .map(|m| m.fwd_us + m.bwd_us)
        .sum();
    flops / peak * 1e6 + measured / f64::from(gpus)
}
