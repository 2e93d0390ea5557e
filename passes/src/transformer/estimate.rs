//! The price of one point of Megatron-LM's space: time per iteration and memory per GPU.
//!
//! Time, per GPU (Narayanan et al., SC'21, §3):
//! * each block's GEMMs at the shapes tensor parallelism leaves on one GPU (`t` splits the
//!   heads, the QKV and first MLP columns, the projection and second MLP rows), each
//!   `max(FLOPs / (peak · GEMM_EFFICIENCY), bytes / (HBM · HBM_EFFICIENCY))` — the batched
//!   attention GEMMs of small head size are memory-bound, large projections compute-bound;
//!   backward = the input-gradient and weight-gradient GEMMs of every forward GEMM;
//! * the memory-bound rest of the block as Megatron-LM trains it, whether or not the export
//!   kept its Dropout nodes: two LayerNorms, the fused scale-mask-softmax, dropout on the
//!   probabilities, two fused bias-dropout-adds, bias+GELU (backward twice the traffic);
//! * tensor-parallel collectives on the critical path: two all-reduces of `b·s·h` forward
//!   and two backward per block (sequence parallelism: all-gathers and reduce-scatters of
//!   the same volume), again in a full recomputation;
//! * pipeline: stage `k` takes `T_k` per microbatch (its blocks, the embedding on the first,
//!   the head and loss on the last, and its point-to-point sends, `b·s·h/t` bytes each with
//!   Megatron's scatter/gather); an iteration of `m` microbatches takes
//!   `m · max T + (Σ T − max T) / v` — (m + p − 1)·T for uniform 1F1B, Narayanan's
//!   `(p − 1)/(v·m)` bubble for interleaving;
//! * then the data-parallel gradient all-reduce (ZeRO-1: reduce-scatter plus all-gather
//!   of the parameters; ZeRO-2 reduce-scatters every microbatch's gradients, ZeRO-3
//!   gathers every block's parameters per pass), hierarchical across nodes with every GPU of a node on its own NIC
//!   at once, not overlapped with backward (as in the paper's runs), the tied embedding's
//!   all-reduce between the first and last stage, and the optimizer step (memory-bound).
//!
//! Memory, per GPU, on its fullest stage (Korthikanti et al., 2022): model states at
//! `w + g + master + moments` bytes per parameter (16 for fp16 with Adam, 18 with fp32
//! gradients), sharded by ZeRO; activations tensor by tensor as Korthikanti derives them
//! (`sbh(34 + 5as/h)` without parallelism or recomputation), times the microbatches in
//! flight on that stage under the schedule; a workspace. Gradients exist from a weight's
//! first backward, as ralpc's executor makes them: a stage whose forwards all precede its
//! first backward peaks before them or after its first microbatch's backward.

use serde::Serialize;

use crate::cluster::{Cluster, Link, Precision};
use crate::cost::comm::{ring_all_gather_us, ring_all_reduce_us};
use crate::cost::rates::{KernelRates, IN_STEP};
use crate::cost::Optimizer;
use crate::plan::order::{self, group_of_stage};
use crate::plan::{Schedule, StageCost};
use crate::profile::Profile;

use super::experts::{expert_mlp, Dispatcher, ExpertContext};
use super::kernels::Kernels;
use super::schedule::{in_flight_chunks, played_pipeline_us, weight_pass_bytes};
use super::{Attention, ContextComm, Modules, Parallelism, Recompute, Transformer};

/// Megatron-Core's gradient bucket, parameters (`--ddp-bucket-size`'s default,
/// `max(40,000,000, 1,000,000 · d)`, `megatron/core/distributed/distributed_data_parallel.py`):
/// with `--overlap-grad-reduce` each bucket's reduce-scatter starts as its last gradient is
/// made, so only the last bucket's waits for the backward pass to end.
pub const GRADIENT_BUCKET_PARAMS: f64 = 40e6;

/// Kernels of one block's memory-bound work per pass (two LayerNorms, softmax, dropout,
/// two bias-dropout-adds, bias+GELU), each paying the launch overhead.
pub const ACTIVATION_LAUNCHES: f64 = 7.0;

/// Everything an estimate depends on besides the parallelism.
#[derive(Clone, Debug)]
pub struct Setting<'a> {
    /// The model.
    pub model: &'a Transformer,
    /// Global batch, sequences.
    pub batch: u64,
    /// The most pieces the batch's sequences may be cut into (data-parallel replicas ×
    /// microbatches): the batch, or 1 for an export whose batch is fixed
    /// ([`LayerGraph::sample_pieces`](crate::layers::LayerGraph::sample_pieces)).
    pub sample_pieces: u64,
    /// The machines.
    pub cluster: &'a Cluster,
    /// GPUs to use: ranks `0..gpus`.
    pub gpus: u32,
    /// Math precision (fp16/bf16: mixed precision with fp32 master weights).
    pub precision: Precision,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Gradients accumulated and reduced in fp32 (18 B per parameter with Adam).
    pub fp32_gradients: bool,
    /// Bytes per GPU reserved for the context and workspaces.
    pub workspace_bytes: f64,
    /// A per-GPU memory limit below the GPUs' own, bytes.
    pub memory_limit: Option<u64>,
    /// How the attention core runs.
    pub attention: Attention,
    /// Which communication the engine hides behind compute.
    pub overlap: Overlap,
    /// Measured kernels (`ralpc profile`): a block's dense products found in it by their
    /// shapes are priced from the measurements (interpolated between measured micro-batch
    /// sizes, scaled beyond them) instead of the GEMM rate.
    pub profile: Option<&'a Profile>,
    /// A mixture of experts' load imbalance: the busiest expert-parallel rank's token–expert
    /// pairs over the mean (1: balanced, as Megatron-Core's forced balancing benchmarks).
    pub expert_imbalance: f64,
    /// How tokens reach their experts.
    pub dispatcher: Dispatcher,
}

/// Communication the engine overlaps with compute, each a Megatron-Core option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// Data-parallel gradient reduce-scatters (all-reduces) and parameter all-gathers
    /// overlap the backward and forward passes bucket by bucket (`--overlap-grad-reduce`,
    /// `--overlap-param-gather`).
    pub data_parallel: bool,
    /// ZeRO-3's per-block parameter gathers and gradient reduce-scatters are prefetched
    /// behind the previous block's compute (FSDP, Megatron-FSDP); ralpc's own executor
    /// gathers each block when it runs.
    pub sharded_parameters: bool,
    /// Tensor-parallel collectives of sequence-parallel blocks overlap the GEMMs beside
    /// them (`--tp-comm-overlap`).
    pub tensor_parallel: bool,
    /// An interleaved pipeline's sends and receives overlap the next chunk's compute
    /// (`--overlap-p2p-communication`).
    pub pipeline: bool,
    /// A mixture of experts' dispatch and combine overlap another microbatch's compute
    /// (`--overlap-moe-expert-parallel-comm`, Megatron-Core's 1F1B all-to-all overlap, as
    /// DeepSeek's DualPipe does).
    pub expert_parallel: bool,
}

impl Overlap {
    /// What Megatron-Core overlaps as its recipes run today (Megatron-Bridge's performance
    /// recipes turn the data-parallel, tensor-parallel and pipeline overlaps on; the
    /// experts' all-to-all overlap only in some, so it is asked for apart).
    pub const MEGATRON_CORE: Overlap = Overlap {
        data_parallel: true,
        sharded_parameters: true,
        tensor_parallel: true,
        pipeline: true,
        expert_parallel: false,
    };

    /// Nothing overlapped, as Megatron-LM ran in 2021–2022 (SC'21, Korthikanti et al.).
    pub const NONE: Overlap = Overlap {
        data_parallel: false,
        sharded_parameters: false,
        tensor_parallel: false,
        pipeline: false,
        expert_parallel: false,
    };
}

/// Where an iteration's time goes on the slowest stage, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct TimeBreakdown {
    /// Compute of every microbatch (forward, backward, recomputation).
    pub compute_us: f64,
    /// Tensor-parallel collectives.
    pub tensor_comm_us: f64,
    /// Context-parallel key/value exchanges not hidden behind attention.
    pub context_comm_us: f64,
    /// A mixture of experts' token dispatch and combine (all-to-alls) not hidden behind
    /// compute.
    pub expert_comm_us: f64,
    /// The GPU idle while the host catches up after each mixture-of-experts layer's
    /// dispatch sync ([`super::experts::MOE_HOST_STALL_US`]).
    pub host_stall_us: f64,
    /// Pipeline sends and receives.
    pub pipeline_comm_us: f64,
    /// Pipeline fill and drain.
    pub bubble_us: f64,
    /// Offloaded activations' copies to and from host memory not hidden behind compute.
    pub offload_us: f64,
    /// Data-parallel gradient synchronization (and ZeRO-3's parameter gathers) that is not
    /// hidden behind compute.
    pub data_comm_us: f64,
    /// Data-parallel collectives hidden behind compute (not part of the iteration time),
    /// with the overlap on.
    pub overlapped_data_comm_us: f64,
    /// The optimizer step (with an offloaded optimizer, its GPU share and then its host
    /// share: gradients copied down, the CPU step, weights copied back).
    pub optimizer_us: f64,
}

/// Memory of the fullest GPU at its peak by kind, bytes: what it holds at that moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct MemoryBreakdown {
    /// Weights in the math precision.
    #[serde(serialize_with = "crate::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub weights: f64,
    /// Gradients (none when the peak comes before the first backward makes any).
    #[serde(serialize_with = "crate::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub gradients: f64,
    /// Optimizer state: fp32 master weights (mixed precision) and moments.
    #[serde(serialize_with = "crate::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub optimizer: f64,
    /// Stashed activations of the microbatches in flight.
    #[serde(serialize_with = "crate::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub activations: f64,
    /// Context and library workspaces.
    #[serde(serialize_with = "crate::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub workspace: f64,
}

impl MemoryBreakdown {
    /// All of it.
    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer + self.activations + self.workspace
    }
}

/// The price of a [`Parallelism`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// The configuration.
    pub parallelism: Parallelism,
    /// Predicted time per iteration, µs.
    pub iteration_time_us: f64,
    /// Where it goes.
    pub time: TimeBreakdown,
    /// Microbatches per iteration.
    pub microbatches: u64,
    /// Blocks per pipeline stage.
    pub stage_layers: Vec<u64>,
    /// Blocks of each pipeline chunk (chunk `j` on stage `j mod p`; [`super::chunk_blocks`]).
    pub chunk_layers: Vec<u64>,
    /// Per stage, one microbatch's time through it (all its chunks), µs.
    pub stage_us: Vec<f64>,
    /// One block, one microbatch: forward (with its tensor-parallel collectives), µs.
    pub block_forward_us: f64,
    /// One block, one microbatch: backward with recomputation and collectives, µs.
    pub block_backward_us: f64,
    /// The embedding, one microbatch, forward and backward, µs.
    pub embedding_us: f64,
    /// The head and loss, one microbatch, forward and backward, µs.
    pub head_us: f64,
    /// Per stage, the memory of one of its GPUs, bytes.
    pub stage_memory_bytes: Vec<f64>,
    /// The fullest GPU's memory by kind.
    pub memory: MemoryBreakdown,
    /// The fullest GPU's memory, bytes.
    pub peak_memory_bytes: f64,
    /// What a GPU may hold, bytes.
    pub memory_capacity_bytes: f64,
    /// Host memory the fullest GPU's offloaded state takes, bytes.
    pub host_memory_bytes: f64,
    /// Host memory each GPU may fill: its share of its server's (0 without host figures).
    pub host_capacity_bytes: f64,
    /// Whether every GPU fits, and every server's host memory.
    pub fits: bool,
    /// Forward + backward FLOPs of the iteration, no recomputation.
    pub model_flops: f64,
    /// FLOPs executed, recomputation included.
    pub hardware_flops: f64,
    /// Which of the block's dense products ([`Transformer::dense_gemms`]' order, bit `k`
    /// for product `k`) were priced from a profile's measurements.
    pub measured_gemms: u8,
}

impl Estimate {
    /// The names of the block's dense products priced from measurements.
    pub fn measured(&self) -> Vec<&'static str> {
        super::DENSE_GEMMS
            .into_iter()
            .enumerate()
            .filter(|&(k, _)| self.measured_gemms & (1 << k) != 0)
            .map(|(_, name)| name)
            .collect()
    }
}

/// Bytes of one block's stashed activations for one microbatch on one GPU, tensor by
/// tensor as Korthikanti et al. (2022, §4) count them (`e` bytes an element, 2 at 16-bit
/// and FP8 precisions; masks are one byte): outside the tensor-parallel regions (LayerNorm
/// inputs, the QKV and first MLP inputs, dropout masks: `10sbh` at `e = 2`) split only by
/// sequence parallelism; inside them (`24sbh + 5as²b`) split by `t`; selective
/// recomputation drops the attention core (`5as²b`), full recomputation keeps only the
/// block's input (`2sbh`, split by sequence parallelism).
///
/// Adapted to today's kernels (derivation in `docs/cost-model.md`):
/// * fused attention keeps no `s × s` tensor: FlashAttention stashes Q, K, V, its output and
///   one fp32 log-sum-exp per query and head (`4as b` bytes) instead of `5as²b`;
/// * at FP8 precisions Transformer Engine keeps each GEMM's input as the FP8 copy its
///   weight-gradient GEMM reads (1 byte an element: the QKV, projection, first and second
///   MLP inputs); the projection's input is also kept in 16 bits by a fused attention, whose
///   backward reads its output.
pub fn block_activation_bytes(
    model: &Transformer,
    par: &Parallelism,
    attention: Attention,
    precision: Precision,
) -> f64 {
    activation_bytes(model, par, attention, precision, None)
}

/// [`block_activation_bytes`] of a block whose MLP is a mixture of experts, at an
/// `imbalance` (the busiest rank's token–expert pairs over the mean): in place of the MLP's
/// inner tensors, the router's fp32 probabilities, each pair's dispatched input (as its
/// grouped GEMM's weight gradient reads it), inner tensors and output (which the combine's
/// backward reads), and the shared experts' inner tensors.
pub fn moe_block_activation_bytes(
    model: &Transformer,
    par: &Parallelism,
    attention: Attention,
    precision: Precision,
    imbalance: f64,
) -> f64 {
    activation_bytes(model, par, attention, precision, Some(imbalance))
}

fn activation_bytes(
    model: &Transformer,
    par: &Parallelism,
    attention: Attention,
    precision: Precision,
    experts: Option<f64>,
) -> f64 {
    let (s, b, h, a) = (
        model.sequence as f64 / f64::from(par.context.max(1)),
        par.micro_batch as f64,
        model.hidden as f64,
        model.heads as f64,
    );
    let (tensor, sequence_parallel, recompute) = (par.tensor, par.sequence_parallel, par.recompute);
    let t = f64::from(tensor);
    let e = precision.activation_bytes() as f64;
    // A GEMM input as its weight gradient reads it.
    let g = if precision.is_fp8() { 1.0 } else { e };
    let sbh = s * b * h;
    let sp = if sequence_parallel { t } else { 1.0 };
    if recompute == Recompute::Full {
        return e * sbh / sp;
    }
    // Outside the parallel regions: two LayerNorm inputs (e each), the QKV and first MLP
    // inputs (g each), two dropout masks (1 byte).
    let outside = (2.0 * e + 2.0 * g + 2.0) * sbh / sp;
    // Inside: Q, K, V (grouped-query attention's K and V are kv/a of Q; latent attention's
    // keys are per head, its latents whole on every rank, normed (e) and read by the up
    // projections (g)), the projection input.
    let spec = model.spec();
    let (qk, v) = spec.head_dims();
    let (qk, v) = (qk as f64, v as f64);
    let projection_input = match attention {
        Attention::Fused if precision.is_fp8() => e + g,
        _ => g,
    };
    let modules = recompute.modules();
    // Recomputing the norms keeps their inputs and drops their outputs (the QKV and first
    // MLP inputs); the up projections, their per-head outputs.
    let outside = match modules.contains(Modules::LAYER_NORM) {
        true => outside - 2.0 * g * sbh / sp,
        false => outside,
    };
    let heads = match model.latent {
        Some(l) => {
            let latents = (l.q_rank + l.kv_rank + l.rope_dim) as f64;
            let up = match modules.contains(Modules::LATENT_UP) {
                true => 0.0,
                false => a * (2.0 * qk + v) * e / t,
            };
            (up + latents * (e + g)) * s * b
        }
        None => spec.qkv_width() as f64 * e * s * b / t,
    };
    let attention_inside = heads + projection_input * s * b * spec.attention_width() as f64 / t;
    // The MLP's inner tensors (GELU's input or SwiGLU's gate and up outputs at e, the down
    // projection's input at g, as Megatron's fused kernels keep them).
    let m = spec.mlp_matrices() as f64;
    let inner = |f: f64| ((m - 1.0) * e + g) * s * b * f;
    let mlp = match (experts, model.moe) {
        (Some(imbalance), Some(moe)) => {
            let routed = s * b / sp;
            let pairs = routed * moe.top_k as f64 * imbalance;
            // Recomputing the experts' activation drops its output (the second product's
            // input).
            let activation = match modules.contains(Modules::EXPERT_ACTIVATION) {
                true => 0.0,
                false => g,
            };
            routed * moe.experts as f64 * 4.0
                // The gathered rows' inputs and outputs (`etp` ranks' pairs), the inner
                // tensors' columns split over them.
                + pairs * f64::from(par.expert_tensor.max(1)) * h * (g + e)
                + pairs * ((m - 1.0) * e + activation) * moe.expert_ffn as f64
                + inner(moe.shared_ffn as f64) / t
        }
        // A recomputed MLP keeps only its input (counted outside).
        _ if modules.contains(Modules::MLP) => 0.0,
        _ => inner(model.ffn as f64) / t,
    };
    let inside = attention_inside + mlp;
    // The attention core: unfused, the softmax output and dropout output (e) and dropout
    // mask (1 byte) of every score (a context-parallel rank's queries against every key);
    // fused, the log-sum-exp of every query and head (fp32).
    let c = f64::from(par.context.max(1));
    let core = match attention {
        Attention::Unfused => (2.0 * e + 1.0) * a * s * (s * c) * b / t,
        Attention::Fused => 4.0 * a * s * b / t,
    };
    match attention {
        Attention::Unfused if modules.contains(Modules::CORE_ATTENTION) => outside + inside,
        _ => outside + inside + core,
    }
}

/// Prices `par` in `setting`.
pub fn estimate(setting: &Setting<'_>, par: &Parallelism) -> Estimate {
    let model = setting.model;
    let cluster = setting.cluster;
    let group = cluster.group_of(0);
    let gpn = group.gpus_per_node.max(1);
    // Offloaded state travels between each GPU and its host's memory, every GPU of the
    // host that the plan uses at once.
    let host_sharers = group
        .host
        .map_or(1, |h| h.gpus.min(gpn).min(setting.gpus.max(1)));
    let host_link = group.host.map(|h| h.copy_link(host_sharers));
    let precision = setting.precision;
    let rates = KernelRates::new(cluster.gpu(0), precision);
    let launch_us = crate::cost::compute::DEFAULT_LAUNCH_US;
    let e = precision.activation_bytes() as f64;
    let grad_e = if setting.fp32_gradients { 4.0 } else { e };
    // FP8 parameters (--fp8-param-gather, which Megatron-LM allows with a sharded
    // optimizer, and with an offloaded one only under delayed scaling) are kept and
    // gathered in FP8.
    let fp8_params = precision.is_fp8() && par.zero >= 1 && par.offload.optimizer_percent == 0;
    let gathered_e = if fp8_params { 1.0 } else { e };
    let (t, p, d, v) = (
        f64::from(par.tensor),
        par.pipeline.max(1),
        f64::from(par.data),
        par.virtual_stages.max(1),
    );
    let (s, b, h, a, f, vocab) = (
        model.sequence as f64,
        par.micro_batch as f64,
        model.hidden as f64,
        model.heads as f64,
        model.ffn as f64,
        model.vocabulary as f64,
    );
    // Context parallelism cuts each sequence: a rank's tokens are `s·b/c`.
    let c = f64::from(par.context.max(1));
    let tokens = s * b / c;
    let m = par.microbatches(setting.batch).max(1);
    let kernels = Kernels {
        rates,
        launch_us,
        e,
        fp8: precision.is_fp8(),
        quantize_launches: super::kernels::quantize_launches(precision),
    };
    let fwd_bwd =
        |rows, cols, inner, batch| kernels.forward_backward(false, rows, cols, inner, batch);
    let fwd_bwd_16 =
        |rows, cols, inner, batch| kernels.forward_backward(true, rows, cols, inner, batch);
    let heads_per_gpu = a / t;
    let (qk_dim, v_dim) = {
        let (q, v) = model.spec().head_dims();
        (q as f64, v as f64)
    };
    let mlp_matrices = model.spec().mlp_matrices() as f64;
    let sp = if par.sequence_parallel { t } else { 1.0 };
    // A measured product (an isolated kernel, as the published rates are) keeps
    // `IN_STEP` of its rate inside a step too. Measurements are of whole sequences.
    let gemms = model.dense_gemms(u64::from(par.tensor));
    let measured_gemm = |g: &super::DenseGemm| {
        let profile = setting.profile.filter(|_| par.context <= 1)?;
        // Beyond the measured micro-batch sizes the profile's own rule scales the nearest
        // measurement: every configuration whose products the profile has is priced from it,
        // so that the search does not drift to sizes it priced otherwise.
        let at = profile.lookup(&g.signature(model.sequence), b)?;
        Some((at.fwd_us / IN_STEP, at.bwd_us / IN_STEP))
    };
    let mut measured = 0u8;
    let mut dense = [(0.0, 0.0); 4];
    for (k, g) in gemms.iter().enumerate() {
        dense[k] = match measured_gemm(g) {
            Some(times) => {
                measured |= 1 << k;
                times
            }
            None => fwd_bwd(tokens, g.cols as f64, g.inner as f64, 1.0),
        };
    }
    let elementwise = |bytes: f64, launches: f64| kernels.elementwise(bytes, launches);
    // FP8: every GEMM input is cast to FP8 with its transpose (write 2 bytes) in the
    // forward pass, and every output gradient in the backward pass. Per-tensor current
    // scaling reads the tensor twice, once for its amax and once to cast it; MXFP8's
    // block scales come from the one read (Transformer Engine, "FP8 current scaling" and
    // "MXFP8" in its user guide). Arguments: the elements of the products' inputs and of
    // their outputs, and how many products (two casts each).
    let cast_reads = if precision == Precision::Fp8 {
        2.0
    } else {
        1.0
    };
    let cast = |inputs: f64, outputs: f64, products: f64| -> (f64, f64) {
        match precision.is_fp8() {
            true => (
                elementwise((cast_reads * e + 2.0) * inputs, 2.0 * products),
                elementwise((cast_reads * e + 2.0) * outputs, 2.0 * products),
            ),
            false => (0.0, 0.0),
        }
    };
    // The attention's products on this rank, `[inner, cols]` each: QKV and the projection,
    // or latent attention's down projections (replicated on every tensor-parallel rank, as
    // Megatron-Core's TE spec builds them), per-head up projections and output projection.
    // The first reads the all-gathered input, the last writes the reduce-scattered output.
    let (attention_products, attention_elements) = match model.latent {
        None => (
            dense[..2].to_vec(),
            (
                (gemms[0].inner + gemms[1].inner) as f64,
                (gemms[0].cols + gemms[1].cols) as f64,
            ),
        ),
        Some(l) => {
            let (q_rank, kv_rank) = (l.q_rank as f64, l.kv_rank as f64);
            let (rope, nope) = (l.rope_dim as f64, l.nope_dim as f64);
            let queries = match l.q_rank {
                0 => vec![(h, a * qk_dim / t)],
                _ => vec![(h, q_rank), (q_rank, a * qk_dim / t)],
            };
            let shapes: Vec<(f64, f64)> = [
                vec![(h, kv_rank + rope)],
                queries,
                vec![(kv_rank, a * (nope + v_dim) / t), (a * v_dim / t, h)],
            ]
            .concat();
            (
                shapes
                    .iter()
                    .map(|&(inner, cols)| fwd_bwd(tokens, cols, inner, 1.0))
                    .collect(),
                shapes
                    .iter()
                    .fold((0.0, 0.0), |(i, o), &(inner, cols)| (i + inner, o + cols)),
            )
        }
    };
    // Latent attention's up projections (the per-head queries and keys/values), forward.
    let latent_up_fwd = match model.latent {
        Some(l) => {
            let (nope, kv_rank) = (l.nope_dim as f64, l.kv_rank as f64);
            // Without a query latent the queries' one projection is re-run.
            let queries = match l.q_rank {
                0 => fwd_bwd(tokens, a * qk_dim / t, h, 1.0).0,
                r => fwd_bwd(tokens, a * qk_dim / t, r as f64, 1.0).0,
            };
            queries + fwd_bwd(tokens, a * (nope + v_dim) / t, kv_rank, 1.0).0
        }
        None => 0.0,
    };
    // Sliding windows (alternate blocks attend to the last `w` positions: about `sw − w²/2`
    // of the causal square's `s²/2` pairs), averaged over the blocks.
    let window_share = match model.sliding_window {
        0 => 1.0,
        w => {
            let w = (w as f64).min(s);
            0.5 + 0.5 * (s * w - w * w / 2.0) / (s * s / 2.0)
        }
    };
    // The attention core, forward and backward.
    let (core_fwd, core_bwd, core_bytes) = match setting.attention {
        Attention::Unfused => {
            let core = [
                fwd_bwd_16(s / c, s, qk_dim, b * heads_per_gpu),
                fwd_bwd_16(s / c, v_dim, s, b * heads_per_gpu),
            ];
            let bytes = b * heads_per_gpu * s / c * s * (2.0 * e + (2.0 * e + 1.0));
            (
                core.iter().map(|g| g.0).sum::<f64>() + elementwise(bytes, 2.0),
                core.iter().map(|g| g.1).sum::<f64>(),
                bytes,
            )
        }
        Attention::Fused => {
            // QKᵀ and PV over the causal half of the square; the backward pass recomputes
            // QKᵀ and makes dV, dP, dQ, dK: five products to the forward's two. Context
            // parallelism pairs each rank's early and late chunks (Megatron-Core's load
            // balancing), so each does 1/c of the square's causal half.
            let flops = 2.0 * s * s * (qk_dim + v_dim) * b * heads_per_gpu / 2.0 / c * window_share;
            (
                flops / rates.attention_forward * 1e6 + launch_us,
                2.5 * flops / rates.attention_backward * 1e6 + launch_us,
                0.0,
            )
        }
    };
    // The memory-bound rest of the attention half (a LayerNorm, a bias-dropout-add; latent
    // attention's and Qwen3's extra norms) and of a dense MLP half (a LayerNorm, a
    // bias-dropout-add, the activation).
    let latent_norms = model
        .latent
        .map_or(0.0, |l| 2.0 * tokens * (l.q_rank + l.kv_rank) as f64 * e);
    let qk_norms = match model.qk_norm {
        true => 2.0 * tokens * (a + model.kv_heads as f64) * qk_dim / t * e,
        false => 0.0,
    };
    let residual_bytes = 2.0 * tokens * h * e / sp + tokens * h * (3.0 * e + 1.0) / sp;
    // A block's two norms, forward (what recomputing them costs).
    let norms_us = elementwise(2.0 * 2.0 * tokens * h * e / sp, 2.0);
    let attention_bytes = residual_bytes + latent_norms + qk_norms;
    let attention_cast = cast(
        tokens * attention_elements.0,
        tokens * attention_elements.1,
        attention_products.len() as f64,
    );
    let attention_fwd = attention_products.iter().map(|g| g.0).sum::<f64>()
        + core_fwd
        + attention_cast.0
        + elementwise(attention_bytes, 2.0);
    let attention_bwd = attention_products.iter().map(|g| g.1).sum::<f64>()
        + core_bwd
        + attention_cast.1
        + 2.0 * elementwise(core_bytes + attention_bytes, 4.0);
    // A product reading an input gathered over the tensor-parallel ranks (the first of
    // each half, under the sequence split the executable plan runs with tensor
    // parallelism) makes its weight gradients in its backward pass, not apart: apart, the
    // gathered input would be held until then (as the layer-graph evaluator prices it).
    let gathered_apart = if par.tensor > 1 { 0.0 } else { 1.0 };
    let dense_mlp = {
        let cast = cast(
            tokens * (gemms[2].inner + gemms[3].inner) as f64,
            tokens * (gemms[2].cols + gemms[3].cols) as f64,
            2.0,
        );
        let bytes = residual_bytes + mlp_matrices * tokens * f / t * e;
        Mlp {
            forward_us: dense[2].0 + dense[3].0 + cast.0 + elementwise(bytes, 3.0),
            backward_us: dense[2].1 + dense[3].1 + cast.1 + 2.0 * elementwise(bytes, 3.0),
            beside_collectives: vec![dense[2], dense[3]],
            exchange_us: (0.0, 0.0),
            experts: false,
            activation_us: 0.0,
            host_us: 0.0,
            weight_us: (dense[2].1 * gathered_apart + dense[3].1) / 2.0,
        }
    };
    // Tensor-parallel collectives inside the node.
    let intra = group.intra_node;
    let activation = tokens * h * e;
    let tp_ar = if par.tensor > 1 {
        ring_all_reduce_us(par.tensor, intra, activation)
    } else {
        0.0
    };
    let moe_mlp = model.moe.map(|moe| {
        expert_mlp(
            &ExpertContext {
                model,
                moe,
                par,
                kernels: &kernels,
                cluster,
                tokens,
                sp,
                imbalance: setting.expert_imbalance,
                dispatcher: setting.dispatcher,
            },
            &cast,
            &fwd_bwd,
        )
    });
    // Each half's two collectives each way (an all-gather and a reduce-scatter each with
    // sequence parallelism, half an all-reduce's time; a mixture of experts has them only
    // around its shared experts): with the tensor-parallel overlap (Megatron-Core's
    // --tp-comm-overlap, Transformer Engine's userbuffers; Wang et al., ASPLOS'23) each is
    // cut into `t` chunks pipelined with the GEMM that reads or writes it — the first
    // product after its all-gather, the last before its reduce-scatter — so only what
    // outlasts the GEMM, and at least one chunk, shows.
    let overlap_tp = setting.overlap.tensor_parallel && par.sequence_parallel && par.tensor > 1;
    let tp_exposed = |products: &[(f64, f64)], pass: fn(&(f64, f64)) -> f64| -> f64 {
        let beside = match products {
            [] => vec![],
            [only] => vec![only],
            [first, .., last] => vec![first, last],
        };
        beside
            .into_iter()
            .map(|g| match overlap_tp {
                true => hide(tp_ar / 2.0, pass(g), 1.0 / t).0,
                false => tp_ar / 2.0,
            })
            .sum()
    };
    let attention_tp = (
        tp_exposed(&attention_products, |g| g.0),
        tp_exposed(&attention_products, |g| g.1),
    );
    // Data-parallel collectives run over the data × context ranks (Megatron-Core reduces
    // gradients and shards the optimizer over both); an expert's over the ranks holding
    // the same experts, `ep·etp` apart.
    // Hybrid sharding (ZeRO 1–3 over groups of `shard` consecutive ranks, repeated): the
    // sharded collectives stay inside a group, and the groups all-reduce their shards'
    // gradients once an iteration; the experts' state likewise over each group's share of
    // its expert-data-parallel ranks (Megatron-Core cuts both by the same count).
    let hybrid = par.zero >= 1 && par.shard_size() < par.data * par.context.max(1);
    let shard = par.shard_size();
    let dp = match hybrid {
        true => DataParallel::new(cluster, par.tensor, shard, gpn),
        false => DataParallel::new(cluster, par.tensor, par.data * par.context.max(1), gpn),
    };
    let shard_groups = DataParallel::new(
        cluster,
        par.tensor * shard,
        par.data * par.context.max(1) / shard,
        gpn,
    );
    let expert_ranks = par.expert.max(1) * par.expert_tensor.max(1);
    let expert_data = (par.tensor * par.context.max(1) * par.data / expert_ranks).max(1);
    let copies = match hybrid {
        true => par.shard_groups.max(1),
        false => 1,
    };
    let edp_size = (expert_data / copies).max(1);
    let edp = DataParallel::new(cluster, expert_ranks, edp_size, gpn);
    let expert_groups = DataParallel::new(cluster, expert_ranks * edp_size, copies, gpn);
    // Context parallelism over `c` ranks `t` apart, by its form (`ContextComm`):
    // * ring: keys and values go around the ring in `c − 1` steps, each behind the
    //   attention of the chunk a rank holds; the backward pass sends them again with their
    //   gradients. Each step is its own attention kernel and its own send and receive
    //   (Megatron-Core's ring attention launches them step by step), so `c − 1` more
    //   attention launches and `c − 1` exchanges' launches each way show;
    // * all-gather: the whole sequence's keys and values gathered before the attention and
    //   again for its backward, their gradients reduce-scattered after it, none of it
    //   overlapped;
    // * all-to-all (Ulysses): the queries, keys and values turned from this rank's
    //   positions of its heads into every position of `1/c` of them, the output back, each
    //   way in the backward pass too, none of it overlapped.
    let kv = tokens * model.kv_heads as f64 / t * (qk_dim + v_dim) * e;
    let (context_fwd, context_bwd) = match (par.context > 1, par.context_comm) {
        (false, _) => (0.0, 0.0),
        (true, ContextComm::Ring) => {
            let link = per_gpu_link(cluster, 0, par.tensor * (par.context - 1), gpn);
            let steps = c - 1.0;
            let launches = 2.0 * steps * launch_us;
            (
                hide(steps * link.transfer_us(kv), core_fwd, 1.0 / c).0 + launches,
                hide(2.0 * steps * link.transfer_us(kv), core_bwd, 1.0 / c).0 + launches,
            )
        }
        (true, ContextComm::AllGather) => {
            let link = per_gpu_link(cluster, 0, par.tensor * (par.context - 1), gpn);
            let gather = ring_all_gather_us(par.context, link, c * kv);
            (gather, 2.0 * gather)
        }
        (true, ContextComm::AllToAll) => {
            let a2a = |bytes: f64| {
                super::experts::group_all_to_all_us(cluster, (par.context, par.tensor), bytes)
            };
            let qkv = tokens * (a * qk_dim / t) * e + kv;
            let out = tokens * (a * v_dim / t) * e;
            (a2a(qkv) + a2a(out), a2a(out) + a2a(qkv))
        }
    };
    // One block with `mlp`, whose parameters on this rank are `params` (sharded over the
    // data-parallel ranks) and `expert_params` (over the expert-data-parallel ranks).
    let block_of = |mlp: &Mlp, params: f64, expert_params: f64, recompute: Recompute| -> Block {
        let forward = attention_fwd + mlp.forward_us;
        let backward = attention_bwd + mlp.backward_us;
        let tp_fwd = attention_tp.0 + tp_exposed(&mlp.beside_collectives, |g| g.0);
        let tp_bwd = attention_tp.1 + tp_exposed(&mlp.beside_collectives, |g| g.1);
        let (recompute_us, recompute_tp, recompute_exchange) = match recompute {
            Recompute::None => (0.0, 0.0, 0.0),
            Recompute::Full => (forward, tp_fwd, mlp.exchange_us.0),
            // Each module re-run from its input: a dense MLP with its all-gather, the
            // experts' activation, the two norms, the up projections, the attention core.
            r => {
                let m = r.modules();
                let mut us = 0.0;
                let mut tp = 0.0;
                if m.contains(Modules::CORE_ATTENTION) {
                    us += core_fwd;
                }
                if m.contains(Modules::MLP) && !mlp.experts {
                    us += mlp.forward_us;
                    tp += tp_exposed(&mlp.beside_collectives, |g| g.0);
                }
                if m.contains(Modules::EXPERT_ACTIVATION) && mlp.experts {
                    us += mlp.activation_us;
                }
                if m.contains(Modules::LAYER_NORM) {
                    us += norms_us;
                }
                if m.contains(Modules::LATENT_UP) {
                    us += latent_up_fwd;
                }
                (us, tp, 0.0)
            }
        };
        let compute = forward + backward + recompute_us;
        // The host stall is no compute for collectives to hide behind (the dispatcher syncs
        // before its own all-to-all); a full recomputation re-runs the sync.
        let host_us = match recompute {
            Recompute::Full => 2.0 * mlp.host_us,
            _ => mlp.host_us,
        };
        // ZeRO-3 gathers each block's parameters forward and backward (and for a full
        // recomputation), and reduce-scatters its gradients, every microbatch; with the
        // data-parallel overlap (FSDP's prefetching, Megatron-FSDP's) each block's behind
        // the previous block's compute.
        let gather = |weights: f64| {
            dp.all_gather_us(weights * gathered_e) + edp.all_gather_us(expert_params * gathered_e)
        };
        let (zero3_us, zero3_edges_us) = if par.zero >= 3 && (dp.size > 1 || edp.size > 1) {
            let gathers = if recompute == Recompute::Full {
                3.0
            } else {
                2.0
            };
            let reduce =
                dp.all_gather_us(params * grad_e) + edp.all_gather_us(expert_params * grad_e);
            (gathers * gather(params) + reduce, gather(params) + reduce)
        } else {
            (0.0, 0.0)
        };
        let (zero3_exposed, zero3_hidden) = match setting.overlap.sharded_parameters {
            true => hide(zero3_us, compute, 0.0),
            false => (zero3_us, 0.0),
        };
        // Dispatch and combine: with Megatron-Core's 1F1B all-to-all overlap
        // (--overlap-moe-expert-parallel-comm) behind another microbatch's compute, which it
        // runs with expert parallelism, interleaving where there are stages, and no full
        // recomputation (TransformerConfig's checks).
        let exchange = mlp.exchange_us.0 + mlp.exchange_us.1 + recompute_exchange;
        let a2a_overlap = setting.overlap.expert_parallel
            && !matches!(precision, Precision::Fp32 | Precision::Tf32)
            && par.expert > 1
            && (p == 1 || v > 1)
            && par.recompute.name() != "full";
        let exchange = match a2a_overlap {
            true => hide(exchange, compute, 0.0).0,
            false => exchange,
        };
        // Re-running the attention (a full recomputation, or of the attention core) re-runs
        // its context-parallel exchange too (Transformer Engine's context-parallel attention
        // is what is checkpointed).
        let context_rerun = match recompute {
            Recompute::Full => context_fwd,
            r if r.modules().contains(Modules::CORE_ATTENTION) => context_fwd,
            _ => 0.0,
        };
        Block {
            work: Work {
                compute_us: compute,
                context_us: context_fwd + context_bwd + context_rerun,
                tensor_us: tp_fwd + tp_bwd + recompute_tp,
                zero_us: zero3_exposed,
                expert_us: exchange,
                host_us,
                offload_us: 0.0,
            },
            forward_us: forward + tp_fwd + mlp.host_us,
            backward_us: backward + recompute_us + tp_bwd + recompute_tp + host_us - mlp.host_us,
            weight_us: (attention_products.iter().enumerate())
                .map(|(i, g)| g.1 * if i == 0 { gathered_apart } else { 1.0 })
                .sum::<f64>()
                / 2.0
                + mlp.weight_us,
            zero3_us,
            zero3_hidden_us: zero3_hidden,
            // What prefetching cannot hide: each microbatch's first gather (nothing
            // computes before it) and last reduce-scatter (nothing computes after it).
            zero3_edges_us: match setting.overlap.sharded_parameters {
                true => zero3_edges_us,
                false => 0.0,
            },
            params,
            expert_params,
        }
    };
    let spec = model.spec();
    // Latent attention's down projections (with their norms) and the router are whole on
    // every tensor-parallel rank; the rest of a block is split by `t`.
    let latent_whole = model.latent.map_or(0.0, |l| {
        (model.hidden * (l.q_rank + l.kv_rank + l.rope_dim) + l.q_rank + l.kv_rank) as f64
    });
    let split = |params: f64, whole: f64| (params - whole) / t + whole;
    // A dense and an expert block, each recomputed as `recompute`.
    let blocks_of = |recompute: Recompute| -> (Block, Block) {
        let dense = block_of(
            &dense_mlp,
            split(spec.block_params() as f64, latent_whole),
            0.0,
            recompute,
        );
        let moe = match (model.moe, &moe_mlp) {
            (Some(moe), Some(mlp)) => {
                let experts = (moe.experts * spec.mlp_params(moe.expert_ffn)) as f64;
                let rest = spec.moe_block_params().0 as f64 - experts;
                block_of(
                    mlp,
                    split(rest, latent_whole + spec.router_params() as f64),
                    experts / f64::from(expert_ranks),
                    recompute,
                )
            }
            _ => dense,
        };
        (dense, moe)
    };
    // The blocks as most are recomputed, and those recomputed in full where only some
    // of each chunk's are (`Recompute::Blocks`).
    let (dense_block, moe_block) = blocks_of(par.recompute.of_block(false));
    let (dense_full, moe_full) = match par.recompute {
        Recompute::Blocks(_) => blocks_of(Recompute::Full),
        _ => (dense_block, moe_block),
    };
    // Embedding (first stage) and head + loss (last stage), vocabulary-parallel: the
    // embedding's output and the head's input gradient are all-reduced, and the parallel
    // cross-entropy all-reduces three per-token scalars.
    let vocab_local = vocab / t;
    let embedding = Work {
        compute_us: elementwise(3.0 * tokens * h * e, 2.0),
        tensor_us: tp_ar,
        ..Work::default()
    };
    let (head_fwd, head_bwd) = fwd_bwd_16(tokens, vocab_local, h, 1.0);
    let loss_bytes = tokens * vocab_local * (e + 8.0);
    let head = Work {
        compute_us: head_fwd + head_bwd + elementwise(3.0 * loss_bytes + 6.0 * tokens * h * e, 4.0),
        tensor_us: tp_ar
            + if par.tensor > 1 {
                3.0 * ring_all_reduce_us(par.tensor, intra, tokens * 4.0)
            } else {
                0.0
            },
        ..Work::default()
    };
    // Stages: blocks spread over the chunks as `chunk_blocks` places them (the first stage
    // holds the embedding, the last the head); a mixture of experts' leading dense blocks
    // come first.
    let layers = model.layers;
    // With interleaving the blocks are spread over the `p·v` chunks and chunk `j` runs on
    // stage `j mod p` (under ZB-V, stage `j` or `2p − 1 − j`), so leading dense blocks fill
    // the first chunks, not the first stage.
    let dense_layers = model.spec().block_counts().0;
    let chunks = u64::from(p) * u64::from(v);
    let stage_of_chunk = |j: usize| group_of_stage(par.schedule, p as usize, j).0;
    // The stage holding the last chunk, with the head and the loss.
    let last_stage = stage_of_chunk(chunks as usize - 1);
    let mut stage_blocks = vec![(0.0, 0.0); p as usize];
    // Of those, the blocks recomputed in full: each chunk's first.
    let mut stage_full = vec![(0.0, 0.0); p as usize];
    // Per chunk: its (dense, expert) blocks, and of those the ones recomputed in full.
    let mut chunk_counts = Vec::with_capacity(chunks as usize);
    let mut first = 0u64;
    let chunk_layers = super::chunk_blocks(layers, chunks, par.ends_as_blocks);
    for (j, &n) in chunk_layers.iter().enumerate() {
        let dense = dense_layers.clamp(first, first + n) - first;
        let full = par.recompute.full_blocks(n);
        first += n;
        let full_dense = full.min(dense);
        let blocks = (dense as f64, (n - dense) as f64);
        let full = (full_dense as f64, (full - full_dense) as f64);
        chunk_counts.push((blocks, full));
        let k = stage_of_chunk(j);
        let add = |a: (f64, f64), b: (f64, f64)| (a.0 + b.0, a.1 + b.1);
        stage_blocks[k] = add(stage_blocks[k], blocks);
        stage_full[k] = add(stage_full[k], full);
    }
    let stage_layers: Vec<u64> = stage_blocks
        .iter()
        .map(|&(dense, moe)| (dense + moe) as u64)
        .collect();
    let of_stage = |k: usize, of: fn(&Block) -> f64| -> f64 {
        let ((dense, moe), (full_dense, full_moe)) = (stage_blocks[k], stage_full[k]);
        (dense - full_dense) * of(&dense_block)
            + full_dense * of(&dense_full)
            + (moe - full_moe) * of(&moe_block)
            + full_moe * of(&moe_full)
    };
    // Point-to-point between stages: `t·c·d` ranks apart. Overlapped in an interleaved
    // pipeline, a send waits only for its latency: its bytes travel while the next chunk
    // computes.
    let stride = par.tensor * par.context.max(1) * par.data;
    let p2p_link = if p > 1 {
        per_gpu_link(cluster, 0, stride, gpn)
    } else {
        intra
    };
    let p2p_us = if p > 1 {
        let bytes = match setting.overlap.pipeline && v > 1 {
            true => 0.0,
            false => activation / t,
        };
        2.0 * f64::from(v) * (p2p_link.latency_us + bytes / p2p_link.bandwidth * 1e6)
    } else {
        0.0
    };
    let activations_of = |recompute: Recompute| {
        let par = &Parallelism { recompute, ..*par };
        let dense = block_activation_bytes(model, par, setting.attention, precision);
        let moe = match model.moe {
            Some(_) => moe_block_activation_bytes(
                model,
                par,
                setting.attention,
                precision,
                setting.expert_imbalance,
            ),
            None => dense,
        };
        (dense, moe)
    };
    let per_block = activations_of(par.recompute.of_block(false));
    let per_full_block = activations_of(par.recompute.of_block(true));
    // Blocks whose activations are offloaded on each stage (the first ones, dense then
    // experts), and what one microbatch's copies of them add to the stage.
    let offloaded: Vec<(f64, f64)> = stage_blocks
        .iter()
        .map(|&(dense, moe)| {
            let n = (par.offload.activation_layers as f64).min(dense + moe);
            (n.min(dense), n - n.min(dense))
        })
        .collect();
    let copies_us = |k: usize| -> f64 {
        let Some(link) = host_link else {
            return 0.0;
        };
        let (dense, moe) = offloaded[k];
        let of = |b: &Block, bytes: f64| {
            super::offload::activation_copies_us(link, bytes, b.forward_us, b.backward_us)
        };
        dense * of(&dense_block, per_block.0) + moe * of(&moe_block, per_block.1)
    };
    let stage_work: Vec<Work> = stage_blocks
        .iter()
        .enumerate()
        .map(|(k, &(dense, moe))| {
            let edges = match (dense > 0.0, moe > 0.0) {
                (true, true) => dense_block.zero3_edges_us.max(moe_block.zero3_edges_us),
                (true, false) => dense_block.zero3_edges_us,
                (false, true) => moe_block.zero3_edges_us,
                (false, false) => 0.0,
            };
            let (full_dense, full_moe) = stage_full[k];
            let mut work = dense_block
                .work
                .times(dense - full_dense)
                .plus(dense_full.work.times(full_dense))
                .plus(moe_block.work.times(moe - full_moe))
                .plus(moe_full.work.times(full_moe))
                .plus(Work {
                    zero_us: edges,
                    offload_us: copies_us(k),
                    ..Work::default()
                });
            if k == 0 {
                work = work.plus(embedding);
            }
            if k == last_stage {
                work = work.plus(head);
            }
            work
        })
        .collect();
    let stage_us: Vec<f64> = stage_work.iter().map(|w| w.total() + p2p_us).collect();
    let slowest = (0..stage_us.len())
        .max_by(|&x, &y| stage_us[x].total_cmp(&stage_us[y]))
        .unwrap_or(0);
    let t_max = stage_us[slowest];
    let t_sum: f64 = stage_us.iter().sum();
    // The zero-bubble schedules' weight passes fill the bubble in an order of their own:
    // played pass by pass, each chunk its blocks' forward, backward and weight passes
    // (`Block::weight_us`; the head's products' half of their backward), as the
    // layer-graph evaluator plays the lowered plan.
    let bubble_us = match par.schedule.splits_backward() && p > 1 {
        true => {
            let of_chunk = |(blocks, full): ((f64, f64), (f64, f64)), of: fn(&Block) -> f64| {
                (blocks.0 - full.0) * of(&dense_block)
                    + full.0 * of(&dense_full)
                    + (blocks.1 - full.1) * of(&moe_block)
                    + full.1 * of(&moe_full)
            };
            let mut chunk_costs: Vec<StageCost> = (chunk_counts.iter().enumerate())
                .map(|(j, &counts)| {
                    let mut total = of_chunk(counts, |b| b.work.total());
                    let mut forward = of_chunk(counts, |b| b.forward_us);
                    let mut weight = of_chunk(counts, |b| b.weight_us);
                    if j == 0 {
                        total += embedding.total();
                        forward += embedding.total() / 2.0;
                    }
                    if j + 1 == chunk_counts.len() {
                        total += head.total();
                        forward += head_fwd;
                        weight += head_bwd / 2.0 * gathered_apart;
                    }
                    StageCost {
                        microbatch_us: total,
                        backward_us: total - forward,
                        weight_us: weight,
                        ..StageCost::default()
                    }
                })
                .collect();
            // What a stage pays beyond its chunks' blocks (its point-to-point, ZeRO-3's
            // first gather and last reduce-scatter, offloaded copies), shared by its
            // chunks' backward passes: each stage then takes its `stage_us`.
            for (k, &stage) in stage_us.iter().enumerate() {
                let of_k: Vec<usize> = (0..chunk_costs.len())
                    .filter(|&j| stage_of_chunk(j) == k)
                    .collect();
                let blocks: f64 = of_k.iter().map(|&j| chunk_costs[j].microbatch_us).sum();
                let extra = (stage - blocks).max(0.0) / of_k.len().max(1) as f64;
                for &j in &of_k {
                    chunk_costs[j].microbatch_us += extra;
                    chunk_costs[j].backward_us += extra;
                }
            }
            (played_pipeline_us(par.schedule, &chunk_costs, m, v as usize) - m as f64 * t_max)
                .max(0.0)
        }
        false => (t_sum - t_max) / f64::from(v),
    };
    let pipe_us = m as f64 * t_max + bubble_us;
    // Parameters per GPU on each stage: those sharded over the data-parallel ranks, and
    // the experts' over the expert-data-parallel ranks.
    let stage_params: Vec<(f64, f64)> = (0..stage_layers.len())
        .map(|k| {
            let last = k == last_stage;
            let mut params = of_stage(k, |b| b.params);
            if k == 0 {
                params += model.spec().embedding_params() as f64 / t;
            }
            if last {
                params += model.spec().head_params() as f64 / t;
                if model.tied && last_stage != 0 {
                    // The last stage keeps its own copy of the tied embedding (under ZB-V
                    // the first stage holds the head too, and one table).
                    params += (model.vocabulary * model.hidden) as f64 / t;
                }
            }
            (params, of_stage(k, |b| b.expert_params))
        })
        .collect();
    let all_params = |k: usize| stage_params[k].0 + stage_params[k].1;
    // Data-parallel gradient synchronization: the gradients' all-reduce (ZeRO-1 and 2:
    // reduce-scatter) and the parameters' all-gather (ZeRO-1 and 2), after the flush or,
    // overlapped, bucket by bucket behind the fullest stage's last backward pass and first
    // forward pass of a microbatch: only what outlasts them, and at least the last bucket,
    // shows. Experts' gradients are reduced over their own ranks.
    let fullest_stage = (0..stage_params.len())
        .max_by(|&x, &y| all_params(x).total_cmp(&all_params(y)))
        .unwrap_or(0);
    let (fullest_params, fullest_experts) = stage_params[fullest_stage];
    // (Under the zero-bubble schedules the last weight passes launch the buckets: they
    // hide behind those.)
    let hide_backward = match par.schedule.splits_backward() {
        true => of_stage(fullest_stage, |b| b.weight_us),
        false => of_stage(fullest_stage, |b| b.backward_us),
    };
    let hide_forward = of_stage(fullest_stage, |b| b.forward_us);
    let bucket = (GRADIENT_BUCKET_PARAMS.max(1e6 * d)
        / (fullest_params + fullest_experts).max(1.0))
    .min(1.0);
    let reduce = |bytes: fn(f64, f64, f64) -> f64, all: bool| -> f64 {
        let (dense, experts) = (fullest_params, fullest_experts);
        match all {
            true => {
                dp.all_reduce_us(bytes(dense, grad_e, gathered_e))
                    + edp.all_reduce_us(bytes(experts, grad_e, gathered_e))
            }
            false => {
                dp.all_gather_us(bytes(dense, grad_e, gathered_e))
                    + edp.all_gather_us(bytes(experts, grad_e, gathered_e))
            }
        }
    };
    let gradients = |params: f64, grad_e: f64, _: f64| params * grad_e;
    let parameters = |params: f64, _: f64, gathered_e: f64| params * gathered_e;
    let (gradient_sync, param_gather, syncs) = match par.zero {
        _ if dp.size <= 1 && edp.size <= 1 => (0.0, 0.0, 0.0),
        0 => (reduce(gradients, true), 0.0, 1.0),
        1 => (reduce(gradients, false), reduce(parameters, false), 1.0),
        // Sharded gradients cannot accumulate over microbatches: every microbatch's are
        // reduce-scattered into the shard as its backward ends (DeepSpeed's stage 2).
        2 => (
            reduce(gradients, false),
            reduce(parameters, false),
            m as f64,
        ),
        _ => (0.0, 0.0, 0.0),
    };
    let ((gradient_exposed, gradient_hidden), (param_exposed, param_hidden)) =
        match setting.overlap.data_parallel {
            true => (
                hide(gradient_sync, hide_backward, bucket),
                hide(param_gather, hide_forward, bucket),
            ),
            false => ((gradient_sync, 0.0), (param_gather, 0.0)),
        };
    let tied_us = if model.tied && last_stage != 0 {
        let link = per_gpu_link(cluster, 0, stride * (p - 1), gpn);
        ring_all_reduce_us(
            2,
            link,
            (model.vocabulary * model.hidden) as f64 / t * grad_e,
        )
    } else {
        0.0
    };
    // Hybrid sharding: each group's shard of the gradients (and of the experts') all-reduced
    // across the groups once an iteration, each bucket's after its last reduce-scatter on the
    // same stream: with the data-parallel overlap, behind what of the backward pass the
    // reduce-scatters left (as Megatron-Core and FSDP2's HSDP run it).
    let (across_us, across_hidden) = match (hybrid, setting.overlap.data_parallel) {
        (false, _) => (0.0, 0.0),
        (true, overlap) => {
            let us = shard_groups.all_reduce_us(fullest_params * grad_e / f64::from(shard))
                + expert_groups.all_reduce_us(fullest_experts * grad_e / f64::from(edp_size));
            match overlap {
                true => hide(us, (hide_backward - gradient_hidden).max(0.0), bucket),
                false => (us, 0.0),
            }
        }
    };
    let data_comm_us = syncs * gradient_exposed + param_exposed + tied_us + across_us;
    let zero3_hidden_us = of_stage(fullest_stage, |b| b.zero3_hidden_us);
    let overlapped_us =
        syncs * gradient_hidden + param_hidden + zero3_hidden_us * m as f64 + across_hidden;
    // Optimizer step over this GPU's shard: read gradient, master, state; write them back
    // and the low-precision copy.
    let (shard, expert_shard) = match par.zero >= 1 {
        true => (f64::from(par.shard_size()), f64::from(edp_size)),
        false => (1.0, 1.0),
    };
    let master: f64 = if e < 4.0 { 4.0 } else { 0.0 };
    let state = 4.0 * setting.optimizer.state_factor();
    let step_bytes = grad_e + 2.0 * (master.max(e) + state) + if e < 4.0 { e } else { 0.0 };
    // FP8: the weights' FP8 copies and their transposes are made once per iteration, at
    // the first microbatch (Transformer Engine's weight caching).
    let cast_bytes = if precision.is_fp8() { e + 2.0 } else { 0.0 };
    // An offloaded optimizer steps its share of the shard on the host, in fp32.
    let offloaded_optimizer = par.offload.optimizer_fraction();
    let host_state = 4.0 + state;
    let shard_params = fullest_params / shard + fullest_experts / expert_shard;
    let host_step_us = group.host.map_or(0.0, |h| {
        super::offload::host_step_us(
            &h,
            host_sharers,
            shard_params * offloaded_optimizer,
            host_state,
        )
    });
    // The hybrid device optimizer launches its GPU share's step, then steps its host share
    // on the CPU while those kernels run.
    let optimizer_us = ((shard_params * step_bytes * (1.0 - offloaded_optimizer)
        + (fullest_params + fullest_experts) * cast_bytes)
        / rates.hbm
        * 1e6)
        .max(host_step_us);
    let iteration_time_us = pipe_us + data_comm_us + optimizer_us;
    // Memory.
    let capacity = cluster.smallest_memory(setting.gpus);
    let capacity = setting.memory_limit.map_or(capacity, |l| l.min(capacity)) as f64;
    let working = if par.recompute.name() == "full" {
        // One block's activations while it is recomputed.
        let whole = activations_of(Recompute::None);
        whole.0.max(whole.1)
    } else {
        0.0
    };
    // The all-gather form's whole keys and values while a block's attention runs, and
    // their gradients in its backward pass.
    let gathered_kv = match par.context_comm {
        ContextComm::AllGather if par.context > 1 => 2.0 * (c - 1.0) * kv,
        _ => 0.0,
    };
    // What one block's owed weight passes keep per microbatch (zero-bubble schedules), and
    // the head's, where it runs its weight pass apart (its input whole: no tensor
    // parallelism): its input and the logits' gradient.
    let owed_block = weight_pass_bytes(model, par, precision);
    let owed_head = |holds: bool| match holds && par.tensor <= 1 {
        true => tokens * (h + vocab_local) * e,
        false => 0.0,
    };
    let stage_memory: Vec<(MemoryBreakdown, f64)> = stage_layers
        .iter()
        .enumerate()
        .map(|(k, _)| {
            // ZeRO shards the buckets' weights; a tied embedding is summed over its holders
            // apart from them, and every holder keeps it whole, with its gradient and
            // momentum.
            let holds_embedding = k == 0 || k == last_stage;
            let tied = match model.tied && holds_embedding {
                true => (model.vocabulary * model.hidden) as f64 / t,
                false => 0.0,
            };
            let (params, experts) = stage_params[k];
            let zero_div = |stage: u8| {
                if par.zero >= stage {
                    f64::from(par.shard_size())
                } else {
                    1.0
                }
            };
            let expert_div = |stage: u8| {
                if par.zero >= stage {
                    f64::from(edp_size)
                } else {
                    1.0
                }
            };
            let sharded =
                |stage: u8| (params - tied) / zero_div(stage) + tied + experts / expert_div(stage);
            let in_flight = in_flight_chunks(par, k as u64, m);
            let ((dense, moe), (full_dense, full_moe)) = (stage_blocks[k], stage_full[k]);
            // Offloaded blocks leave the GPU, but for the one whose copy is in flight.
            let (dense_off, moe_off) = offloaded[k];
            let in_flight_block = match (dense_off > 0.0, moe_off > 0.0) {
                (false, false) => 0.0,
                (true, false) => per_block.0,
                (false, true) => per_block.1,
                (true, true) => per_block.0.max(per_block.1),
            };
            let held = match par.schedule {
                // ZB-V's two chunks a stage hold their microbatches at different times:
                // the most of both at once, with what their owed weight passes keep, in
                // the stage's order (its warm-up and cool-down span fewer than `2p + 1`
                // microbatches, the rounds between them alike).
                Schedule::ZeroBubbleV if v == 2 => {
                    let order = order::group_passes(
                        par.schedule,
                        p as usize,
                        2,
                        k,
                        m.min(2 * u64::from(p) + 1) as u32,
                    );
                    let chunk = |c: usize| {
                        chunk_counts[order::stage_of_chunk(par.schedule, p as usize, c, k)]
                    };
                    order::peak_weighed(&order, 2, |c, a, w| {
                        let ((dense, moe), (full_dense, full_moe)) = chunk(c);
                        f64::from(a)
                            * ((dense - full_dense) * per_block.0
                                + (moe - full_moe) * per_block.1
                                + full_dense * per_full_block.0
                                + full_moe * per_full_block.1)
                            + f64::from(w)
                                * ((dense + moe) * owed_block + owed_head(c == 1 && k == 0))
                    })
                }
                // ZB-H1: 1F1B's microbatches in flight, and `min(p, m) − min(p − k, m)`
                // more whose weight passes are owed.
                _ => {
                    let owed = match par.schedule {
                        Schedule::ZeroBubble => {
                            (u64::from(p).min(m) - (u64::from(p) - k as u64).min(m)) as f64
                        }
                        _ => 0.0,
                    };
                    in_flight as f64 / f64::from(v)
                        * ((dense - dense_off - full_dense) * per_block.0
                            + (moe - moe_off - full_moe) * per_block.1
                            + full_dense * per_full_block.0
                            + full_moe * per_full_block.1)
                        + owed * ((dense + moe) * owed_block + owed_head(k == last_stage))
                }
            };
            let mut activations = held + in_flight_block + working;
            if k == last_stage {
                // One microbatch's logits (16-bit) and fp32 softmax with its gradient.
                activations += tokens * vocab_local * (e + 8.0);
            }
            if k == 0 {
                // The embedding's output and dropout mask, per microbatch in flight through
                // the first chunk.
                let microbatches = match par.schedule {
                    // ZB-V's first chunk: `min(2p, m)` microbatches.
                    Schedule::ZeroBubbleV if v == 2 => (2 * u64::from(p)).min(m) as f64,
                    _ => (in_flight_chunks(par, 0, m) as f64 / f64::from(v)).ceil(),
                };
                activations += microbatches * tokens * h * (e + 1.0) / sp;
            }
            // What sharding leaves whole for a while: ZeRO-2 the running unit's gradients
            // before their reduce-scatter, ZeRO-3 its gathered weights too and the next
            // block's (prefetched). The unit is a block, or the last stage's untied head,
            // whose backward comes first, at the activations' peak.
            let block = (dense_block.params + dense_block.expert_params)
                .max(moe_block.params + moe_block.expert_params);
            let head = match k == last_stage && !model.tied {
                true => model.spec().head_params() as f64 / t,
                false => 0.0,
            };
            let unit = block.max(head);
            let transient = match par.zero {
                _ if dp.size <= 1 && edp.size <= 1 => 0.0,
                2 => unit * grad_e,
                3 => (unit + block) * e + unit * grad_e,
                _ => 0.0,
            } + gathered_kv;
            let gradients = sharded(2) * grad_e;
            // ralpc's executor makes a weight's gradient at its first backward (Megatron-
            // LM's contiguous gradient buffer holds them from the start). A stage that runs
            // every forward before its first backward (GPipe, or no more microbatches than
            // 1F1B's warm-up) peaks either before any gradient exists or once the first
            // microbatch's backward has made them all and freed its own activations.
            let (gradients, activations) = if in_flight >= m * u64::from(v) {
                let first = activations / (in_flight as f64 / f64::from(v)).max(1.0);
                if first >= gradients {
                    (0.0, activations)
                } else {
                    (gradients, activations - first)
                }
            } else {
                (gradients, activations)
            };
            // FP8: each block weight's FP8 copy with its transpose (Hopper) or column-wise
            // copy (MXFP8, one 1-byte scale per 32 elements); FP8 parameters (Megatron's
            // --fp8-param-gather, as Megatron-Bridge's FP8 recipes run) replace the 16-bit
            // weight, which is otherwise kept beside them. The fp32 master weights stay in
            // the optimizer.
            let copies = match precision {
                Precision::Fp8 => 2.0,
                Precision::Mxfp8 => 2.0 * (1.0 + 1.0 / 32.0),
                _ => 0.0,
            };
            let fp8_bytes = if fp8_params { copies } else { e + copies };
            let block_weights = of_stage(k, |b| b.params);
            let expert_weights = of_stage(k, |b| b.expert_params);
            // On the host: the offloaded blocks' activations, the offloaded share of the
            // optimizer state with its gradients' pinned copies.
            let host = in_flight as f64 / f64::from(v)
                * (dense_off * per_block.0 + moe_off * per_block.1)
                + sharded(1) * offloaded_optimizer * super::offload::host_step_bytes(host_state);
            let gpu = MemoryBreakdown {
                weights: sharded(3) * e
                    + block_weights * (fp8_bytes - e) / zero_div(3)
                    + expert_weights * (fp8_bytes - e) / expert_div(3),
                gradients,
                optimizer: sharded(1) * (master + state) * (1.0 - offloaded_optimizer),
                activations,
                workspace: setting.workspace_bytes + transient,
            };
            (gpu, host)
        })
        .collect();
    let fullest = stage_memory
        .iter()
        .map(|(gpu, _)| *gpu)
        .max_by(|x, y| x.total().total_cmp(&y.total()))
        .unwrap_or_default();
    // Host memory per GPU: its offloaded activations and its host-stepped optimizer share.
    let host_memory_bytes = stage_memory
        .iter()
        .map(|(_, host)| *host)
        .fold(0.0, f64::max);
    let host_capacity_bytes = group.host.map_or(0.0, |h| h.memory_share(host_sharers));
    let model_flops = model.model_flops(setting.batch);
    let (qk, v_head) = model.spec().head_dims();
    let core = 2.0
        * model.sequence as f64
        * model.heads as f64
        * (qk + v_head) as f64
        * model.layers as f64;
    let recomputed = match par.recompute {
        Recompute::None => 0.0,
        Recompute::Full => model.blocks_flops_per_token(),
        // The blocks recomputed in full, dense and with experts.
        Recompute::Blocks(_) => {
            let (dense, moe) = stage_full
                .iter()
                .fold((0.0, 0.0), |(d, e), &(fd, fe)| (d + fd, e + fe));
            dense * model.block_flops_per_token() + moe * model.moe_block_flops_per_token()
        }
        // The attention core's and a dense MLP's FLOPs (norms, activations and the up
        // projections are left out).
        r => {
            let m = r.modules();
            let dense = model.spec().block_counts().0 as f64;
            let mlp = 2.0 * (model.spec().mlp_matrices() * model.hidden * model.ffn) as f64;
            f64::from(u8::from(m.contains(Modules::CORE_ATTENTION))) * core
                + f64::from(u8::from(m.contains(Modules::MLP))) * dense * mlp
        }
    } * (setting.batch * model.sequence) as f64;
    let slowest_work = stage_work[slowest].times(m as f64);
    let typical = match model.moe {
        Some(_) => &moe_block,
        None => &dense_block,
    };
    let block_forward_us = typical.forward_us + typical.zero3_us / 2.0;
    Estimate {
        parallelism: *par,
        iteration_time_us,
        time: TimeBreakdown {
            compute_us: slowest_work.compute_us,
            tensor_comm_us: slowest_work.tensor_us,
            context_comm_us: slowest_work.context_us,
            expert_comm_us: slowest_work.expert_us,
            host_stall_us: slowest_work.host_us,
            pipeline_comm_us: p2p_us * m as f64,
            bubble_us,
            offload_us: slowest_work.offload_us,
            data_comm_us: data_comm_us + slowest_work.zero_us,
            overlapped_data_comm_us: overlapped_us,
            optimizer_us,
        },
        microbatches: m,
        stage_layers,
        chunk_layers,
        stage_us,
        block_forward_us,
        block_backward_us: typical.work.total() - block_forward_us,
        embedding_us: embedding.total(),
        head_us: head.total(),
        stage_memory_bytes: stage_memory.iter().map(|(gpu, _)| gpu.total()).collect(),
        memory: fullest,
        peak_memory_bytes: fullest.total(),
        memory_capacity_bytes: capacity,
        host_memory_bytes,
        host_capacity_bytes,
        fits: fullest.total() <= capacity
            && (host_memory_bytes <= 0.0 || host_memory_bytes <= host_capacity_bytes),
        model_flops,
        hardware_flops: model_flops + recomputed,
        measured_gemms: measured,
    }
}

/// One block's MLP half for one microbatch on one GPU, µs.
pub(super) struct Mlp {
    pub(super) forward_us: f64,
    pub(super) backward_us: f64,
    /// Its products beside tensor-parallel collectives (the first after the all-gather,
    /// the last before the reduce-scatter): forward, backward.
    pub(super) beside_collectives: Vec<(f64, f64)>,
    /// Token dispatch and combine: forward, backward.
    pub(super) exchange_us: (f64, f64),
    /// Whether it is a mixture of experts.
    pub(super) experts: bool,
    /// The experts' activation, forward (what recomputing it costs).
    pub(super) activation_us: f64,
    /// Host time its forward leaves the GPU idle (a mixture of experts' dispatch sync).
    pub(super) host_us: f64,
    /// Its products' weight gradients (half their backward: the input and weight
    /// gradients of a product take the same FLOPs), µs: a pass of their own under the
    /// zero-bubble schedules.
    pub(super) weight_us: f64,
}

/// One block's price for one microbatch on one GPU.
#[derive(Clone, Copy, Debug)]
struct Block {
    /// Forward, backward and recomputation with their collectives.
    work: Work,
    /// The forward pass with its tensor-parallel collectives, µs.
    forward_us: f64,
    /// The backward pass (recomputation included) with its collectives, µs.
    backward_us: f64,
    /// The weight gradients' part of `backward_us`, µs.
    weight_us: f64,
    /// ZeRO-3's gathers and reduce-scatters before any hiding, µs.
    zero3_us: f64,
    /// The part of them prefetching hides, µs.
    zero3_hidden_us: f64,
    /// What prefetching cannot hide on a stage (its first gather, last reduce-scatter).
    zero3_edges_us: f64,
    /// Parameters on this rank sharded over the data-parallel ranks.
    params: f64,
    /// Experts' parameters on this rank, sharded over the expert-data-parallel ranks.
    expert_params: f64,
}

/// A collective of `comm_us` overlapped with `compute_us` of compute, at least `floor` of it
/// showing (the part that cannot start before the compute ends): (exposed, hidden), µs.
fn hide(comm_us: f64, compute_us: f64, floor: f64) -> (f64, f64) {
    let exposed = (comm_us - compute_us).max(comm_us * floor).max(0.0);
    (exposed, comm_us - exposed)
}

/// One microbatch's time through some blocks, by kind, µs.
#[derive(Clone, Copy, Debug, Default)]
struct Work {
    compute_us: f64,
    /// Tensor-parallel collectives.
    tensor_us: f64,
    /// ZeRO-3 parameter gathers and gradient reduce-scatters.
    zero_us: f64,
    /// Context-parallel key/value exchanges.
    context_us: f64,
    /// A mixture of experts' token dispatch and combine.
    expert_us: f64,
    /// The GPU idle while the host catches up after a mixture of experts' dispatch sync.
    host_us: f64,
    /// Offloaded activations' copies beyond the compute beside them.
    offload_us: f64,
}

impl Work {
    fn total(self) -> f64 {
        self.compute_us
            + self.tensor_us
            + self.zero_us
            + self.context_us
            + self.expert_us
            + self.host_us
            + self.offload_us
    }

    fn times(self, n: f64) -> Work {
        Work {
            compute_us: self.compute_us * n,
            tensor_us: self.tensor_us * n,
            zero_us: self.zero_us * n,
            context_us: self.context_us * n,
            expert_us: self.expert_us * n,
            host_us: self.host_us * n,
            offload_us: self.offload_us * n,
        }
    }

    fn plus(self, other: Work) -> Work {
        Work {
            compute_us: self.compute_us + other.compute_us,
            tensor_us: self.tensor_us + other.tensor_us,
            zero_us: self.zero_us + other.zero_us,
            context_us: self.context_us + other.context_us,
            expert_us: self.expert_us + other.expert_us,
            host_us: self.host_us + other.host_us,
            offload_us: self.offload_us + other.offload_us,
        }
    }
}

/// What one GPU gets on the link from rank `a` to rank `a + offset`: NVLink inside a node;
/// across nodes its share of the node's NICs, every GPU of the node sending at once.
pub(super) fn per_gpu_link(cluster: &Cluster, a: u32, offset: u32, gpus_per_node: u32) -> Link {
    let b = (a + offset).min(cluster.gpu_count().saturating_sub(1));
    let link = cluster.link(a, b);
    if cluster.flat.is_some() || cluster.level(&[a, b]) <= crate::cluster::LinkLevel::IntraNode {
        return link;
    }
    Link {
        latency_us: link.latency_us,
        bandwidth: link.bandwidth / f64::from(gpus_per_node),
    }
}

/// Collectives over one data-parallel group: `d` ranks `t` apart, every group of the
/// cluster at once (so each GPU has its own NIC's share across nodes).
struct DataParallel {
    /// Group members per node.
    local: u32,
    /// Nodes the group spans.
    nodes: u32,
    intra: Link,
    across: Link,
    flat: Option<Link>,
    size: u32,
}

impl DataParallel {
    fn new(cluster: &Cluster, tensor: u32, data: u32, gpus_per_node: u32) -> DataParallel {
        let local = (gpus_per_node / tensor.max(1)).clamp(1, data.max(1));
        let nodes = data.max(1).div_ceil(local);
        let across = per_gpu_link(
            cluster,
            0,
            gpus_per_node.min(cluster.gpu_count()),
            gpus_per_node,
        );
        DataParallel {
            local,
            nodes,
            intra: cluster.group_of(0).intra_node,
            across,
            flat: cluster.flat,
            size: data.max(1),
        }
    }

    /// Hierarchical all-reduce: reduce-scatter inside the node, all-reduce of each GPU's
    /// part across nodes, all-gather inside.
    fn all_reduce_us(&self, bytes: f64) -> f64 {
        if bytes <= 0.0 {
            return 0.0;
        }
        if let Some(flat) = self.flat {
            return ring_all_reduce_us(self.size, flat, bytes);
        }
        2.0 * ring_all_gather_us(self.local, self.intra, bytes)
            + ring_all_reduce_us(self.nodes, self.across, bytes / f64::from(self.local))
    }

    /// Hierarchical all-gather (or reduce-scatter).
    fn all_gather_us(&self, bytes: f64) -> f64 {
        if bytes <= 0.0 {
            return 0.0;
        }
        if let Some(flat) = self.flat {
            return ring_all_gather_us(self.size, flat, bytes);
        }
        ring_all_gather_us(self.local, self.intra, bytes)
            + ring_all_gather_us(self.nodes, self.across, bytes / f64::from(self.local))
    }
}
