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
use crate::plan::Schedule;
use crate::profile::Profile;

use super::{Attention, Parallelism, Recompute, Transformer};

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
}

impl Overlap {
    /// Everything Megatron-Core overlaps, as its recipes run today (Megatron-Bridge's
    /// performance recipes turn all three on).
    pub const MEGATRON_CORE: Overlap = Overlap {
        data_parallel: true,
        sharded_parameters: true,
        tensor_parallel: true,
        pipeline: true,
    };

    /// Nothing overlapped, as Megatron-LM ran in 2021–2022 (SC'21, Korthikanti et al.).
    pub const NONE: Overlap = Overlap {
        data_parallel: false,
        sharded_parameters: false,
        tensor_parallel: false,
        pipeline: false,
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
    /// Pipeline sends and receives.
    pub pipeline_comm_us: f64,
    /// Pipeline fill and drain.
    pub bubble_us: f64,
    /// Data-parallel gradient synchronization (and ZeRO-3's parameter gathers) that is not
    /// hidden behind compute.
    pub data_comm_us: f64,
    /// Data-parallel collectives hidden behind compute (not part of the iteration time),
    /// with the overlap on.
    pub overlapped_data_comm_us: f64,
    /// The optimizer step.
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
    /// Whether every GPU fits.
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
    let (s, b, h, a, f) = (
        model.sequence as f64 / f64::from(par.context.max(1)),
        par.micro_batch as f64,
        model.hidden as f64,
        model.heads as f64,
        model.ffn as f64,
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
    // Inside: Q, K, V (e·sbh each; grouped-query attention's K and V are kv/a of that), the
    // projection input, the MLP's inner tensors (GELU's input or SwiGLU's gate and up
    // outputs at e, the down projection's input at g, as Megatron's fused kernels keep
    // them).
    let (kv, m) = (model.kv_heads as f64, model.spec().mlp_matrices() as f64);
    let projection_input = match attention {
        Attention::Fused if precision.is_fp8() => e + g,
        _ => g,
    };
    let inside =
        ((1.0 + 2.0 * kv / a) * e * sbh + projection_input * sbh + ((m - 1.0) * e + g) * s * b * f)
            / t;
    // The attention core: unfused, the softmax output and dropout output (e) and dropout
    // mask (1 byte) of every score (a context-parallel rank's queries against every key);
    // fused, the log-sum-exp of every query and head (fp32).
    let c = f64::from(par.context.max(1));
    let core = match attention {
        Attention::Unfused => (2.0 * e + 1.0) * a * s * (s * c) * b / t,
        Attention::Fused => 4.0 * a * s * b / t,
    };
    match (recompute, attention) {
        (Recompute::Selective, Attention::Unfused) => outside + inside,
        _ => outside + inside + core,
    }
}

/// Prices `par` in `setting`.
pub fn estimate(setting: &Setting<'_>, par: &Parallelism) -> Estimate {
    let model = setting.model;
    let cluster = setting.cluster;
    let group = cluster.group_of(0);
    let gpn = group.gpus_per_node.max(1);
    let precision = setting.precision;
    let rates = KernelRates::new(cluster.gpu(0), precision);
    let launch_us = crate::cost::compute::DEFAULT_LAUNCH_US;
    let e = precision.activation_bytes() as f64;
    let grad_e = if setting.fp32_gradients { 4.0 } else { e };
    // FP8 parameters (--fp8-param-gather, which Megatron-LM allows with a sharded
    // optimizer) are kept and gathered in FP8.
    let fp8_params = precision.is_fp8() && par.zero >= 1;
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
    // A GEMM at `rate` FLOP/s reading operands of `input` bytes an element, writing `e`.
    let gemm_at = |rate: f64, input: f64| {
        move |rows: f64, cols: f64, inner: f64, batch: f64| -> f64 {
            let flops = 2.0 * rows * cols * inner * batch;
            let bytes = (input * (rows * inner + inner * cols) + e * rows * cols) * batch;
            (flops / rate).max(bytes / rates.hbm) * 1e6 + launch_us
        }
    };
    // The block's dense layers in the math precision (FP8 at FP8 precisions); the LM head
    // and an unfused attention's batched GEMMs in 16 bits, as Transformer Engine's recipes
    // leave them.
    let gemm = gemm_at(rates.gemm, if precision.is_fp8() { 1.0 } else { e });
    let gemm_16 = gemm_at(rates.gemm_16, e);
    let fwd_bwd = |rows, cols, inner, batch| forward_backward(&gemm, rows, cols, inner, batch);
    let fwd_bwd_16 =
        |rows, cols, inner, batch| forward_backward(&gemm_16, rows, cols, inner, batch);
    let heads_per_gpu = a / t;
    let head_dim = h / a;
    // QKV, the attention projection, the MLP's first (SwiGLU: gate and up, one GEMM) and
    // second products.
    let mlp_matrices = model.spec().mlp_matrices() as f64;
    let qkv = model.qkv_width() as f64 / t;
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
    let elementwise = |bytes: f64, launches: f64| bytes / rates.hbm * 1e6 + launches * launch_us;
    // The attention core, forward and backward.
    let (core_fwd, core_bwd, core_bytes) = match setting.attention {
        Attention::Unfused => {
            let core = [
                fwd_bwd_16(s / c, s, head_dim, b * heads_per_gpu),
                fwd_bwd_16(s / c, head_dim, s, b * heads_per_gpu),
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
            let flops = 4.0 * s * s * head_dim * b * heads_per_gpu / 2.0 / c;
            (
                flops / rates.attention_forward * 1e6 + launch_us,
                2.5 * flops / rates.attention_backward * 1e6 + launch_us,
                0.0,
            )
        }
    };
    let sp = if par.sequence_parallel { t } else { 1.0 };
    let other_bytes = 2.0 * 2.0 * tokens * h * e / sp
        + 2.0 * tokens * h * (3.0 * e + 1.0) / sp
        + mlp_matrices * tokens * f / t * e;
    // FP8: every GEMM input is cast to FP8 with its transpose (write 2 bytes) in the
    // forward pass, and every output gradient in the backward pass. Per-tensor current
    // scaling reads the tensor twice, once for its amax and once to cast it; MXFP8's
    // block scales come from the one read (Transformer Engine, "FP8 current scaling" and
    // "MXFP8" in its user guide).
    let (cast_fwd, cast_bwd) = if precision.is_fp8() {
        let reads = if precision == Precision::Fp8 {
            2.0
        } else {
            1.0
        };
        let inputs = tokens * (h + h / t + h + f / t);
        let gradients = tokens * (qkv + h + (mlp_matrices - 1.0) * f / t + h);
        (
            elementwise((reads * e + 2.0) * inputs, 8.0),
            elementwise((reads * e + 2.0) * gradients, 8.0),
        )
    } else {
        (0.0, 0.0)
    };
    let block_fwd = dense.iter().map(|g| g.0).sum::<f64>()
        + core_fwd
        + cast_fwd
        + elementwise(other_bytes, ACTIVATION_LAUNCHES - 2.0);
    let block_bwd = dense.iter().map(|g| g.1).sum::<f64>()
        + core_bwd
        + cast_bwd
        + 2.0 * elementwise(core_bytes + other_bytes, ACTIVATION_LAUNCHES);
    // Tensor-parallel collectives inside the node.
    let intra = group.intra_node;
    let activation = tokens * h * e;
    let tp_ar = if par.tensor > 1 {
        ring_all_reduce_us(par.tensor, intra, activation)
    } else {
        0.0
    };
    // The block's four collectives each way (an all-gather and a reduce-scatter each with
    // sequence parallelism, half an all-reduce's time): with the tensor-parallel overlap
    // (Megatron-Core's --tp-comm-overlap, Transformer Engine's userbuffers; Wang et al.,
    // ASPLOS'23) each is cut into `t` chunks pipelined with the GEMM that reads or writes
    // it — the QKV and first MLP products after their all-gathers, the projection and
    // second MLP products before their reduce-scatters — so only what outlasts the GEMM,
    // and at least one chunk, shows.
    let overlap_tp = setting.overlap.tensor_parallel && par.sequence_parallel && par.tensor > 1;
    let tp_exposed = |pass: fn(&(f64, f64)) -> f64| -> f64 {
        dense
            .iter()
            .map(|g| match overlap_tp {
                true => hide(tp_ar / 2.0, pass(g), 1.0 / t).0,
                false => tp_ar / 2.0,
            })
            .sum()
    };
    let (tp_fwd, tp_bwd) = (tp_exposed(|g| g.0), tp_exposed(|g| g.1));
    let (recompute_us, recompute_tp) = match par.recompute {
        Recompute::None => (0.0, 0.0),
        Recompute::Selective => (core_fwd, 0.0),
        Recompute::Full => (block_fwd, tp_fwd),
    };
    // ZeRO-3 gathers each block's parameters forward and backward (and for a full
    // recomputation), and reduce-scatters its gradients, every microbatch; with the
    // data-parallel overlap (FSDP's prefetching, Megatron-FSDP's) each block's behind the
    // previous block's compute.
    let block_weights = model.spec().block_params() as f64 / t;
    // Data-parallel collectives run over the data × context ranks (Megatron-Core reduces
    // gradients and shards the optimizer over both).
    let dp = DataParallel::new(cluster, par.tensor, par.data * par.context.max(1), gpn);
    let zero3_us = if par.zero >= 3 && par.data > 1 {
        let gathers = if par.recompute == Recompute::Full {
            3.0
        } else {
            2.0
        };
        gathers * dp.all_gather_us(block_weights * gathered_e)
            + dp.all_gather_us(block_weights * grad_e)
    } else {
        0.0
    };
    let block_compute_us = block_fwd + block_bwd + recompute_us;
    let (zero3_exposed_us, zero3_hidden_us) = match setting.overlap.sharded_parameters {
        true => hide(zero3_us, block_compute_us, 0.0),
        false => (zero3_us, 0.0),
    };
    // What prefetching cannot hide: each microbatch's first gather (nothing computes
    // before it) and last reduce-scatter (nothing computes after it) on every stage.
    let zero3_edges = match setting.overlap.sharded_parameters && par.zero >= 3 && par.data > 1 {
        true => Work {
            zero_us: dp.all_gather_us(block_weights * gathered_e)
                + dp.all_gather_us(block_weights * grad_e),
            ..Work::default()
        },
        false => Work::default(),
    };
    // Context parallelism: keys and values go around the ring of `c` ranks (`t` apart) in
    // `c − 1` steps, each behind the attention of the chunk a rank holds; the backward pass
    // sends them again with their gradients. Each step is its own attention kernel and its
    // own send and receive (Megatron-Core's ring attention launches them step by step), so
    // `c − 1` more attention launches and `c − 1` exchanges' launches each way show.
    let (context_fwd, context_bwd) = if par.context > 1 {
        let link = per_gpu_link(cluster, 0, par.tensor * (par.context - 1), gpn);
        let kv = 2.0 * tokens * model.kv_heads as f64 / t * head_dim * e;
        let steps = c - 1.0;
        let launches = 2.0 * steps * launch_us;
        (
            hide(steps * link.transfer_us(kv), core_fwd, 1.0 / c).0 + launches,
            hide(2.0 * steps * link.transfer_us(kv), core_bwd, 1.0 / c).0 + launches,
        )
    } else {
        (0.0, 0.0)
    };
    let block = Work {
        compute_us: block_compute_us,
        context_us: context_fwd + context_bwd,
        tensor_us: tp_fwd + tp_bwd + recompute_tp,
        zero_us: zero3_exposed_us,
    };
    // Embedding (first stage) and head + loss (last stage), vocabulary-parallel: the
    // embedding's output and the head's input gradient are all-reduced, and the parallel
    // cross-entropy all-reduces three per-token scalars.
    let vocab_local = vocab / t;
    let embedding = Work {
        compute_us: elementwise(3.0 * tokens * h * e, 2.0),
        tensor_us: tp_ar,
        zero_us: 0.0,
        context_us: 0.0,
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
        zero_us: 0.0,
        context_us: 0.0,
    };
    // Stages: blocks spread evenly, the extra ones on the earliest stages (the last holds
    // the head).
    let layers = model.layers;
    let stage_layers: Vec<u64> = (0..u64::from(p))
        .map(|k| layers / u64::from(p) + u64::from(k < layers % u64::from(p)))
        .collect();
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
    let stage_work: Vec<Work> = stage_layers
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let mut work = block.times(n as f64).plus(zero3_edges);
            if k == 0 {
                work = work.plus(embedding);
            }
            if k + 1 == stage_layers.len() {
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
    let bubble_us = (t_sum - t_max) / f64::from(v);
    let pipe_us = m as f64 * t_max + bubble_us;
    // Parameters per GPU on each stage.
    let stage_params: Vec<f64> = stage_layers
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let last = k + 1 == stage_layers.len();
            let mut params = n as f64 * model.spec().block_params() as f64;
            if k == 0 {
                params += model.spec().embedding_params() as f64;
            }
            if last {
                params += model.spec().head_params() as f64;
                if model.tied && p > 1 {
                    // The last stage keeps its own copy of the tied embedding.
                    params += (model.vocabulary * model.hidden) as f64;
                }
            }
            params / t
        })
        .collect();
    let fullest_params = stage_params.iter().copied().fold(0.0, f64::max);
    // Data-parallel gradient synchronization: the gradients' all-reduce (ZeRO-1 and 2:
    // reduce-scatter) and the parameters' all-gather (ZeRO-1 and 2), after the flush or,
    // overlapped, bucket by bucket behind the fullest stage's last backward pass and first
    // forward pass of a microbatch: only what outlasts them, and at least the last bucket,
    // shows.
    let fullest_stage = (0..stage_params.len())
        .max_by(|&x, &y| stage_params[x].total_cmp(&stage_params[y]))
        .unwrap_or(0);
    let fullest_blocks = stage_layers[fullest_stage] as f64;
    let hide_backward = fullest_blocks * (block_bwd + recompute_us + tp_bwd + recompute_tp);
    let hide_forward = fullest_blocks * (block_fwd + tp_fwd);
    let bucket = (GRADIENT_BUCKET_PARAMS.max(1e6 * d) / fullest_params.max(1.0)).min(1.0);
    let (gradient_sync, param_gather, syncs) = match par.zero {
        _ if par.data <= 1 => (0.0, 0.0, 0.0),
        0 => (dp.all_reduce_us(fullest_params * grad_e), 0.0, 1.0),
        1 => (
            dp.all_gather_us(fullest_params * grad_e),
            dp.all_gather_us(fullest_params * gathered_e),
            1.0,
        ),
        // Sharded gradients cannot accumulate over microbatches: every microbatch's are
        // reduce-scattered into the shard as its backward ends (DeepSpeed's stage 2).
        2 => (
            dp.all_gather_us(fullest_params * grad_e),
            dp.all_gather_us(fullest_params * gathered_e),
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
    let tied_us = if model.tied && p > 1 {
        let link = per_gpu_link(cluster, 0, stride * (p - 1), gpn);
        ring_all_reduce_us(
            2,
            link,
            (model.vocabulary * model.hidden) as f64 / t * grad_e,
        )
    } else {
        0.0
    };
    let data_comm_us = syncs * gradient_exposed + param_exposed + tied_us;
    let overlapped_us = syncs * gradient_hidden
        + param_hidden
        + zero3_hidden_us * (stage_layers[fullest_stage] * m) as f64;
    // Optimizer step over this GPU's shard: read gradient, master, state; write them back
    // and the low-precision copy.
    let shard = if par.zero >= 1 { d * c } else { 1.0 };
    let master: f64 = if e < 4.0 { 4.0 } else { 0.0 };
    let state = 4.0 * setting.optimizer.state_factor();
    let step_bytes = grad_e + 2.0 * (master.max(e) + state) + if e < 4.0 { e } else { 0.0 };
    // FP8: the weights' FP8 copies and their transposes are made once per iteration, at
    // the first microbatch (Transformer Engine's weight caching).
    let cast_bytes = if precision.is_fp8() { e + 2.0 } else { 0.0 };
    let optimizer_us =
        (fullest_params / shard * step_bytes + fullest_params * cast_bytes) / rates.hbm * 1e6;
    let iteration_time_us = pipe_us + data_comm_us + optimizer_us;
    // Memory.
    let capacity = (0..setting.gpus.max(1))
        .map(|r| {
            cluster
                .gpu(r.min(cluster.gpu_count().saturating_sub(1)))
                .memory_bytes
        })
        .min()
        .unwrap_or(0);
    let capacity = setting.memory_limit.map_or(capacity, |l| l.min(capacity)) as f64;
    let per_block = block_activation_bytes(model, par, setting.attention, precision);
    let working = if par.recompute == Recompute::Full {
        // One block's activations while it is recomputed.
        block_activation_bytes(
            model,
            &Parallelism {
                recompute: Recompute::None,
                ..*par
            },
            setting.attention,
            precision,
        )
    } else {
        0.0
    };
    let stage_memory: Vec<MemoryBreakdown> = stage_layers
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            // ZeRO shards the buckets' weights; a tied embedding is summed over its holders
            // apart from them, and every holder keeps it whole, with its gradient and
            // momentum.
            let holds_embedding = k == 0 || k + 1 == stage_layers.len();
            let tied = match model.tied && holds_embedding {
                true => (model.vocabulary * model.hidden) as f64 / t,
                false => 0.0,
            };
            let params = stage_params[k];
            let zero_div = |stage: u8| if par.zero >= stage { d * c } else { 1.0 };
            let sharded = |stage: u8| (params - tied) / zero_div(stage) + tied;
            let in_flight = in_flight_chunks(par, k as u64, m);
            let in_flight_blocks = in_flight as f64 * n as f64 / f64::from(v);
            let mut activations = in_flight_blocks * per_block + working;
            if k + 1 == stage_layers.len() {
                // One microbatch's logits (16-bit) and fp32 softmax with its gradient.
                activations += tokens * vocab_local * (e + 8.0);
            }
            if k == 0 {
                // The embedding's output and dropout mask, per microbatch in flight through
                // the first chunk.
                let microbatches = (in_flight_chunks(par, 0, m) as f64 / f64::from(v)).ceil();
                activations += microbatches * tokens * h * (e + 1.0) / sp;
            }
            // What sharding leaves whole for a while: ZeRO-2 the running unit's gradients
            // before their reduce-scatter, ZeRO-3 its gathered weights too and the next
            // block's (prefetched). The unit is a block, or the last stage's untied head,
            // whose backward comes first, at the activations' peak.
            let block = model.spec().block_params() as f64 / t;
            let head = match k + 1 == stage_layers.len() && !model.tied {
                true => model.spec().head_params() as f64 / t,
                false => 0.0,
            };
            let unit = block.max(head);
            let transient = match par.zero {
                _ if par.data <= 1 => 0.0,
                2 => unit * grad_e,
                3 => (unit + block) * e + unit * grad_e,
                _ => 0.0,
            };
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
            let block_weights = n as f64 * model.spec().block_params() as f64 / t;
            MemoryBreakdown {
                weights: sharded(3) * e + block_weights * (fp8_bytes - e) / zero_div(3),
                gradients,
                optimizer: sharded(1) * (master + state),
                activations,
                workspace: setting.workspace_bytes + transient,
            }
        })
        .collect();
    let fullest = stage_memory
        .iter()
        .copied()
        .max_by(|x, y| x.total().total_cmp(&y.total()))
        .unwrap_or_default();
    let model_flops = model.model_flops(setting.batch);
    let recomputed = match par.recompute {
        Recompute::None => 0.0,
        Recompute::Selective => 4.0 * model.sequence as f64 * model.hidden as f64,
        Recompute::Full => model.block_flops_per_token(),
    } * (setting.batch * model.sequence * model.layers) as f64;
    let slowest_work = stage_work[slowest].times(m as f64);
    Estimate {
        parallelism: *par,
        iteration_time_us,
        time: TimeBreakdown {
            compute_us: slowest_work.compute_us,
            tensor_comm_us: slowest_work.tensor_us,
            context_comm_us: slowest_work.context_us,
            pipeline_comm_us: p2p_us * m as f64,
            bubble_us,
            data_comm_us: data_comm_us + slowest_work.zero_us,
            overlapped_data_comm_us: overlapped_us,
            optimizer_us,
        },
        microbatches: m,
        stage_layers,
        stage_us,
        block_forward_us: block_fwd + tp_fwd + zero3_us / 2.0,
        block_backward_us: block.total() - block_fwd - tp_fwd - zero3_us / 2.0,
        embedding_us: embedding.total(),
        head_us: head.total(),
        stage_memory_bytes: stage_memory.iter().map(MemoryBreakdown::total).collect(),
        memory: fullest,
        peak_memory_bytes: fullest.total(),
        memory_capacity_bytes: capacity,
        fits: fullest.total() <= capacity,
        model_flops,
        hardware_flops: model_flops + recomputed,
        measured_gemms: measured,
    }
}

/// A collective of `comm_us` overlapped with `compute_us` of compute, at least `floor` of it
/// showing (the part that cannot start before the compute ends): (exposed, hidden), µs.
fn hide(comm_us: f64, compute_us: f64, floor: f64) -> (f64, f64) {
    let exposed = (comm_us - compute_us).max(comm_us * floor).max(0.0);
    (exposed, comm_us - exposed)
}

/// Forward and backward (input and weight gradients) of one GEMM, µs.
fn forward_backward(
    gemm: &impl Fn(f64, f64, f64, f64) -> f64,
    rows: f64,
    cols: f64,
    inner: f64,
    batch: f64,
) -> (f64, f64) {
    (
        gemm(rows, cols, inner, batch),
        gemm(rows, inner, cols, batch) + gemm(inner, cols, rows, batch),
    )
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
}

impl Work {
    fn total(self) -> f64 {
        self.compute_us + self.tensor_us + self.zero_us + self.context_us
    }

    fn times(self, n: f64) -> Work {
        Work {
            compute_us: self.compute_us * n,
            tensor_us: self.tensor_us * n,
            zero_us: self.zero_us * n,
            context_us: self.context_us * n,
        }
    }

    fn plus(self, other: Work) -> Work {
        Work {
            compute_us: self.compute_us + other.compute_us,
            tensor_us: self.tensor_us + other.tensor_us,
            zero_us: self.zero_us + other.zero_us,
            context_us: self.context_us + other.context_us,
        }
    }
}

/// Microbatch chunks whose activations stage `k` holds at once: all `m` under GPipe; `p − k`
/// under 1F1B; Megatron's warm-up `2(p − k − 1) + (v − 1)p` plus one under interleaving.
fn in_flight_chunks(par: &Parallelism, k: u64, m: u64) -> u64 {
    let (p, v) = (
        u64::from(par.pipeline.max(1)),
        u64::from(par.virtual_stages.max(1)),
    );
    match par.schedule {
        Schedule::GPipe => m * v,
        _ if v > 1 => (2 * (p - k - 1) + (v - 1) * p + 1).min(m * v),
        _ => (p - k).min(m),
    }
}

/// What one GPU gets on the link from rank `a` to rank `a + offset`: NVLink inside a node;
/// across nodes its share of the node's NICs, every GPU of the node sending at once.
fn per_gpu_link(cluster: &Cluster, a: u32, offset: u32, gpus_per_node: u32) -> Link {
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
        if let Some(flat) = self.flat {
            return ring_all_reduce_us(self.size, flat, bytes);
        }
        2.0 * ring_all_gather_us(self.local, self.intra, bytes)
            + ring_all_reduce_us(self.nodes, self.across, bytes / f64::from(self.local))
    }

    /// Hierarchical all-gather (or reduce-scatter).
    fn all_gather_us(&self, bytes: f64) -> f64 {
        if let Some(flat) = self.flat {
            return ring_all_gather_us(self.size, flat, bytes);
        }
        ring_all_gather_us(self.local, self.intra, bytes)
            + ring_all_gather_us(self.nodes, self.across, bytes / f64::from(self.local))
    }
}
