//! What a pipeline schedule asks of a transformer plan's price: microbatches in flight
//! on each stage, the zero-bubble schedules' played iteration and what their owed weight
//! passes keep.

use crate::cluster::Precision;
use crate::plan::{Schedule, StageCost};

use super::{Parallelism, Transformer};

/// What one block's weight passes read while owed, per microbatch, bytes: each product's
/// input and its output's gradient, for the products that run their weight gradients
/// apart (with tensor parallelism, the output projection and the MLP's last product: the
/// others read an input gathered over the tensor-parallel ranks and make their weight
/// gradients in their backward pass). A mixture of experts' block as a dense one whose
/// MLP is its routed tokens' experts.
pub(super) fn weight_pass_bytes(
    model: &Transformer,
    par: &Parallelism,
    precision: Precision,
) -> f64 {
    let tokens = model.sequence as f64 / f64::from(par.context.max(1)) * par.micro_batch as f64;
    let (h, a, kv) = (
        model.hidden as f64,
        model.heads as f64,
        model.kv_heads.max(1) as f64,
    );
    let t = f64::from(par.tensor.max(1));
    let e = precision.activation_bytes() as f64;
    let (qk, v) = model.spec().head_dims();
    let (qk, v) = (qk as f64, v as f64);
    let ffn = match model.moe {
        Some(moe) => (moe.expert_ffn * moe.top_k) as f64,
        None => model.ffn as f64,
    };
    let matrices = model.spec().mlp_matrices() as f64;
    // (input, output) features per token of each product on this rank.
    let qkv = (h, (a * qk + kv * (qk + v)) / t);
    let projection = (a * v / t, h);
    let up = (h, matrices * ffn / t);
    let down = (ffn / t, h);
    let apart = match par.tensor > 1 {
        true => vec![projection, down],
        false => vec![qkv, projection, up, down],
    };
    tokens
        * e
        * apart
            .iter()
            .map(|(input, output)| input + output)
            .sum::<f64>()
}

/// A pipeline of `stages` chunk costs, `v` a group, run through `m` microbatches in
/// `schedule`'s order ([`Schedule::iteration_us`]), µs. The order's warm-up and cool-down
/// span fewer than `4P` microbatches and every round between them is alike, so a long run
/// is played for `4P` and each further microbatch adds the last one's increment.
pub(super) fn played_pipeline_us(
    schedule: Schedule,
    stages: &[StageCost],
    m: u64,
    v: usize,
) -> f64 {
    let groups = stages.len() / v.max(1);
    let played = (4 * groups as u64).max(2);
    let at = |n: u64| schedule.iteration_us(stages, u32::try_from(n).unwrap_or(u32::MAX), v);
    if m <= played {
        return at(m);
    }
    let (last, before) = (at(played), at(played - 1));
    last + (m - played) as f64 * (last - before)
}

/// Microbatch chunks whose activations stage `k` holds at once: all `m` under GPipe; `p − k`
/// under 1F1B; Megatron's warm-up `2(p − k − 1) + (v − 1)p` plus one under interleaving;
/// under ZB-V its first chunk's `min(m, 2p − k − 1)` and its second's `min(m, k + 1)`
/// ([`crate::plan::order::group_passes`]: at most `2p`).
pub(super) fn in_flight_chunks(par: &Parallelism, k: u64, m: u64) -> u64 {
    let (p, v) = (
        u64::from(par.pipeline.max(1)),
        u64::from(par.virtual_stages.max(1)),
    );
    match par.schedule {
        Schedule::GPipe => m * v,
        // ZB-V: its group's most at once ([`crate::plan::order::group_passes`]).
        Schedule::ZeroBubbleV if v == 2 => m.min(2 * p - k - 1) + m.min(k + 1),
        _ if v > 1 => (2 * (p - k - 1) + (v - 1) * p + 1).min(m * v),
        _ => (p - k).min(m),
    }
}
