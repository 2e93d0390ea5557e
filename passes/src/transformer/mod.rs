//! Large transformer language models, planned as Megatron-LM trains them (Narayanan et al.,
//! SC'21; Korthikanti et al., 2022): tensor parallelism inside a node (attention split by
//! heads, MLP column- then row-parallel, vocabulary-parallel embedding and head), pipeline
//! stages across nodes (1F1B, GPipe, interleaved 1F1B), data parallelism over what is left,
//! activation recomputation, sequence parallelism and sharded optimizer state (ZeRO 1–3),
//! with mixed-precision memory.
//!
//! A GPT-like decoder is [`recognize`]d in the verified graph; its blocks are identical, so
//! one block is priced ([`estimate`]) and composed into stages, and the search
//! ([`search`]) enumerates Megatron's whole space — (t, p, d, micro-batch, v, recompute,
//! sequence parallelism, ZeRO) — in milliseconds even for a 1 T-parameter model on
//! thousands of GPUs.

mod estimate;
mod experts;
mod kernels;
mod layered;
mod offload;
mod recognize;
mod schedule;
mod search;

pub use estimate::{
    block_activation_bytes, estimate, moe_block_activation_bytes, Estimate, MemoryBreakdown,
    Overlap, Setting, TimeBreakdown,
};
pub use estimate::{ACTIVATION_LAUNCHES, GRADIENT_BUCKET_PARAMS};
pub use experts::{Dispatcher, ExpertOptions, DEFAULT_EXPERT_IMBALANCE};
pub use kernels::GROUPED_GEMM_HALF_ROWS;
pub use layered::{layered, NotLayered};
pub use recognize::{recognize, NotATransformer};
pub(crate) use search::divisors;
pub use search::{search, Knobs, Searched};

use ralpc_ir::models::{GptSpec, LatentAttention, MoeSpec};
use serde::Serialize;

use crate::plan::Schedule;
use crate::profile::Signature;

/// The shape of a GPT-like decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Transformer {
    /// Blocks `l`.
    pub layers: u64,
    /// Hidden size `h`.
    pub hidden: u64,
    /// Attention heads `a`.
    pub heads: u64,
    /// Key and value heads (`a` for multi-head attention, fewer for grouped-query).
    pub kv_heads: u64,
    /// Sequence length `s`.
    pub sequence: u64,
    /// Vocabulary `V`.
    pub vocabulary: u64,
    /// The MLP's inner size `f` (Megatron: `4h`).
    pub ffn: u64,
    /// A gated MLP (SwiGLU's three matrices of `f`, Llama's) instead of two.
    pub gated_mlp: bool,
    /// Biases on the dense layers.
    pub biases: bool,
    /// RMSNorm instead of LayerNorm.
    pub rms_norm: bool,
    /// Whether the LM head reuses the token embedding.
    pub tied: bool,
    /// Rows of the learned position table (0: none).
    pub positions: u64,
    /// Each attention head's size (`h/a` unless the model says otherwise).
    pub head_dim: u64,
    /// Biases on Q, K and V alone (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorms of the query and key heads (Qwen3).
    pub qk_norm: bool,
    /// Multi-head latent attention (DeepSeek-V3).
    pub latent: Option<LatentAttention>,
    /// Alternate blocks attend within this many positions (gpt-oss); 0: none.
    pub sliding_window: u64,
    /// The mixture of experts replacing the MLP after the leading dense blocks.
    pub moe: Option<MoeSpec>,
    /// The graph's parameters (elements of every floating-point initializer).
    pub params: u64,
}

impl From<&GptSpec> for Transformer {
    /// The shape a model generated from `spec` ([`ralpc_ir::models::gpt`]) is recognized as,
    /// without generating it.
    fn from(spec: &GptSpec) -> Transformer {
        Transformer {
            layers: spec.layers,
            hidden: spec.hidden,
            heads: spec.heads,
            kv_heads: spec.kv_heads,
            sequence: spec.sequence,
            vocabulary: spec.vocabulary,
            ffn: spec.ffn,
            gated_mlp: spec.gated_mlp,
            biases: spec.biases,
            rms_norm: spec.rms_norm,
            tied: spec.tied,
            positions: spec.positions,
            head_dim: spec.head_dim,
            qkv_bias: spec.qkv_bias,
            qk_norm: spec.qk_norm,
            latent: spec.latent,
            sliding_window: spec.sliding_window,
            moe: spec.moe,
            params: spec.params(),
        }
    }
}

impl Transformer {
    /// Its shape as a generator spec, which owns the parameter formulas (per block,
    /// embeddings, head).
    pub fn spec(&self) -> GptSpec {
        GptSpec {
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            sequence: self.sequence,
            positions: self.positions,
            vocabulary: self.vocabulary,
            ffn: self.ffn,
            gated_mlp: self.gated_mlp,
            biases: self.biases,
            rms_norm: self.rms_norm,
            tied: self.tied,
            dropout: true,
            head_dim: self.head_dim,
            qkv_bias: self.qkv_bias,
            qk_norm: self.qk_norm,
            latent: self.latent,
            sliding_window: self.sliding_window,
            moe: self.moe,
        }
    }

    /// Columns of the QKV projection: `3h` for multi-head attention, `h + 2h·kv/a` for
    /// grouped-query.
    pub fn qkv_width(&self) -> u64 {
        self.spec().qkv_width()
    }

    /// Whether `t` tensor-parallel ranks can split every block: its query and key/value
    /// heads and the MLP's inner size, as Megatron-LM requires.
    pub fn splits_by(&self, t: u32) -> bool {
        let t = u64::from(t);
        let (dense, _) = self.spec().block_counts();
        let shared = self.moe.map_or(0, |moe| moe.shared_ffn);
        t > 0
            && self.heads % t == 0
            && self.kv_heads % t == 0
            && (dense == 0 || self.ffn % t == 0)
            && shared % t == 0
    }

    /// The block's dense products on one of `t` tensor-parallel ranks (`t` splitting the
    /// model, [`Transformer::splits_by`]): QKV and the MLP's first product column-parallel,
    /// the attention projection and the MLP's second product row-parallel; SwiGLU's gate
    /// and up products are one GEMM.
    pub fn dense_gemms(&self, t: u64) -> [DenseGemm; 4] {
        let t = t.max(1);
        let (h, f) = (self.hidden, self.ffn);
        let mlp = self.spec().mlp_matrices() - 1;
        [
            DenseGemm {
                name: DENSE_GEMMS[0],
                inner: h,
                cols: self.qkv_width() / t,
            },
            DenseGemm {
                name: DENSE_GEMMS[1],
                inner: self.spec().attention_width() / t,
                cols: h,
            },
            DenseGemm {
                name: DENSE_GEMMS[2],
                inner: h,
                cols: mlp * f / t,
            },
            DenseGemm {
                name: DENSE_GEMMS[3],
                inner: f / t,
                cols: h,
            },
        ]
    }

    /// Forward FLOPs of one block with the dense MLP per token (GEMMs; 2 per MAC): its
    /// weights' `2·params` (QKV `6h²` for multi-head attention, projection `2h²`, MLP `4hf`,
    /// SwiGLU `6hf`; biases and norms left out) and the scores and context over the whole
    /// square, `2s·a·(d_qk + d_v)` (`4sh`).
    pub fn block_flops_per_token(&self) -> f64 {
        let spec = self.spec();
        2.0 * self.attention_weights()
            + 2.0 * (spec.mlp_matrices() * self.hidden * self.ffn) as f64
            + self.core_flops_per_token()
    }

    /// Forward FLOPs of one block with the mixture of experts per token: the attention's,
    /// the router's `2hE`, `k` experts' and the shared experts'.
    pub fn moe_block_flops_per_token(&self) -> f64 {
        let Some(moe) = self.moe else {
            return self.block_flops_per_token();
        };
        let mlp = |f: u64| 2.0 * (self.spec().mlp_matrices() * self.hidden * f) as f64;
        2.0 * self.attention_weights()
            + self.core_flops_per_token()
            + 2.0 * (self.hidden * moe.experts) as f64
            + moe.top_k as f64 * mlp(moe.expert_ffn)
            + mlp(moe.shared_ffn)
    }

    /// Forward FLOPs per token of every block.
    pub fn blocks_flops_per_token(&self) -> f64 {
        let (dense, experts) = self.spec().block_counts();
        dense as f64 * self.block_flops_per_token()
            + experts as f64 * self.moe_block_flops_per_token()
    }

    /// The attention's weight elements (norms and biases left out).
    fn attention_weights(&self) -> f64 {
        let spec = self.spec();
        let biases = match (self.latent, self.biases, self.qkv_bias) {
            (Some(_), _, _) => 0,
            (None, true, _) => spec.qkv_width() + self.hidden,
            (None, false, true) => spec.qkv_width(),
            (None, false, false) => 0,
        };
        let norms = match self.latent {
            Some(l) => l.q_rank + l.kv_rank,
            None if self.qk_norm => 2 * self.head_dim,
            None => 0,
        };
        (spec.attention_params() - biases - norms) as f64
    }

    /// Scores and context of one token against the whole sequence: `2s·a·(d_qk + d_v)`.
    pub fn core_flops_per_token(&self) -> f64 {
        let (qk, v) = self.spec().head_dims();
        2.0 * self.sequence as f64 * self.heads as f64 * (qk + v) as f64
    }

    /// Forward FLOPs of the LM head per token: `2hV`.
    pub fn head_flops_per_token(&self) -> f64 {
        2.0 * self.hidden as f64 * self.vocabulary as f64
    }

    /// Forward + backward FLOPs of one iteration at `batch` sequences, no recomputation
    /// (Megatron's "model FLOPs"): `3 · B·s · (l · block + head)`.
    pub fn model_flops(&self, batch: u64) -> f64 {
        let tokens = (batch * self.sequence) as f64;
        3.0 * tokens * (self.blocks_flops_per_token() + self.head_flops_per_token())
    }
}

/// The names of a block's dense products, in [`Transformer::dense_gemms`]' order.
pub const DENSE_GEMMS: [&str; 4] = ["qkv", "projection", "mlp_in", "mlp_out"];

/// One of a block's dense products on one tensor-parallel rank, per sequence:
/// `[s, inner] × [inner, cols]`. The estimate prices these and `ralpc profile` measures
/// them, from this one list ([`Transformer::dense_gemms`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct DenseGemm {
    /// One of [`DENSE_GEMMS`].
    pub name: &'static str,
    /// The reduced dimension (the input's features on this rank).
    pub inner: u64,
    /// The output's features on this rank.
    pub cols: u64,
}

impl DenseGemm {
    /// The profile key of this product on `rows` tokens a sequence: a `MatMul` of
    /// per-sequence input `[rows, inner]` and output `[rows, cols]`.
    pub fn signature(&self, rows: u64) -> Signature {
        Signature {
            op: "MatMul".to_owned(),
            attrs: Default::default(),
            input: vec![rows, self.inner],
            output: vec![rows, self.cols],
        }
    }
}

/// How the attention core (scores, mask, softmax, context) runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// One fused kernel as FlashAttention runs it (Dao et al., 2022; Dao, 2023; Shah et al.,
    /// 2024): the scores never reach memory, the backward pass recomputes them from Q, K, V
    /// and the softmax's log-sum-exp, and a causal mask skips the blocks above the diagonal
    /// (half the work at long sequences).
    #[default]
    Fused,
    /// Batched GEMMs around a scale-mask-softmax kernel (Megatron-LM before FlashAttention):
    /// the `s × s` scores and probabilities are written, stashed and read again, and the
    /// whole square is computed.
    Unfused,
}

impl Attention {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Attention::Fused => "fused",
            Attention::Unfused => "unfused",
        }
    }

    /// Parses `fused` or `unfused`.
    pub fn parse(name: &str) -> Option<Attention> {
        [Attention::Fused, Attention::Unfused]
            .into_iter()
            .find(|a| a.name() == name)
    }
}

/// How a context-parallel group gives each rank the keys and values of the positions it
/// does not hold (Megatron-Core's `--cp-comm-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
pub enum ContextComm {
    /// Ring attention (`p2p`): each rank's key/value chunk passed around the ring in
    /// `c − 1` steps, each step behind the attention of the chunk it holds (Megatron-Core's
    /// default; Liu et al., "Ring Attention", 2023). The backward pass sends them again with
    /// their gradients.
    #[default]
    #[serde(rename = "p2p")]
    Ring,
    /// All-gather (`all_gather`): every rank gathers the whole sequence's keys and values
    /// before its attention, and reduce-scatters their gradients after the backward — the
    /// form Llama 3 trained with (Dubey et al., 2024, §3.3.2), not overlapped ("The
    /// all-gather is not async, and cannot be overlapped": Megatron-Core's
    /// `TransformerConfig.cp_comm_type`), small under grouped-query attention.
    #[serde(rename = "all_gather")]
    AllGather,
    /// DeepSpeed-Ulysses (`a2a`; Jacobs et al., 2023): all-to-alls turn each rank's
    /// positions of every head into every position of its heads before the attention, and
    /// back after it (the backward pass the same, reversed); every query, key and value and
    /// the output cross the group, not overlapped. The heads (and key/value heads) of a
    /// tensor-parallel rank must divide by the group (Transformer Engine's check).
    #[serde(rename = "a2a")]
    AllToAll,
}

impl ContextComm {
    /// Every form, in the order the search tries them.
    pub const ALL: [ContextComm; 3] = [
        ContextComm::Ring,
        ContextComm::AllGather,
        ContextComm::AllToAll,
    ];

    /// Its name on the command line and in Megatron-Core's `--cp-comm-type`.
    pub fn name(self) -> &'static str {
        match self {
            ContextComm::Ring => "p2p",
            ContextComm::AllGather => "all_gather",
            ContextComm::AllToAll => "a2a",
        }
    }

    /// Parses `p2p`, `all_gather` or `a2a`.
    pub fn parse(name: &str) -> Option<ContextComm> {
        ContextComm::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// What is recomputed in the backward pass instead of stashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Everything stashed.
    None,
    /// The attention core (scores, softmax, dropout, context): Korthikanti's selective.
    Selective,
    /// Every block from its input (one checkpoint per block).
    Full,
    /// The first `n` blocks of each pipeline chunk from their inputs, the chunk's other
    /// blocks stashed whole (Megatron-Core's `--recompute-granularity full
    /// --recompute-method block --recompute-num-layers n`): the memory a full
    /// recomputation frees where only part of it is needed, for part of its time.
    Blocks(u32),
    /// Some of a block's modules, each from its input (Megatron-Core's
    /// `--recompute-granularity selective --recompute-modules ...`); the attention core alone
    /// is [`Recompute::Selective`].
    Modules(Modules),
}

impl Recompute {
    /// The granularities, cheapest in time first (module sets apart: [`Recompute::choices`]).
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// Its granularity's name on the command line and in Megatron-LM's arguments.
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective | Recompute::Modules(_) => "selective",
            Recompute::Full | Recompute::Blocks(_) => "full",
        }
    }

    /// How many of a chunk's `blocks` are recomputed in full.
    pub fn full_blocks(self, blocks: u64) -> u64 {
        match self {
            Recompute::Full => blocks,
            Recompute::Blocks(n) => u64::from(n).min(blocks),
            _ => 0,
        }
    }

    /// What a block is recomputed as: in full where it is one of its chunk's recomputed
    /// blocks (`in_full`), stashed where it is another block under [`Recompute::Blocks`],
    /// and as every block is otherwise.
    pub fn of_block(self, in_full: bool) -> Recompute {
        match self {
            Recompute::Blocks(_) if in_full => Recompute::Full,
            Recompute::Blocks(_) => Recompute::None,
            r => r,
        }
    }

    /// Parses `none`, `selective`, `full`.
    pub fn parse(name: &str) -> Option<Recompute> {
        Recompute::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The modules recomputed (the attention core for [`Recompute::Selective`]; none for
    /// the other granularities).
    pub fn modules(self) -> Modules {
        match self {
            Recompute::Selective => Modules::CORE_ATTENTION,
            Recompute::Modules(m) => m,
            Recompute::None | Recompute::Full | Recompute::Blocks(_) => Modules::default(),
        }
    }

    /// Recomputing `modules`: [`Recompute::Selective`] for the attention core alone,
    /// [`Recompute::None`] for nothing.
    pub fn of_modules(modules: Modules) -> Recompute {
        match modules {
            m if m == Modules::default() => Recompute::None,
            Modules::CORE_ATTENTION => Recompute::Selective,
            m => Recompute::Modules(m),
        }
    }

    /// What the search tries for `model`: the granularities, and for mixtures of experts and
    /// latent attention the module sets Megatron-Bridge's recipes recompute for them (the
    /// dense MLP, latent attention's up projections, the experts' activation, the norms).
    /// A dense decoder's are tried when asked for (`--recompute-modules`): for memory the
    /// search has the full recomputation of some blocks ([`Recompute::Blocks`]), which
    /// lowers for any decoder, where module runs need blocks it can tell apart.
    pub fn choices(model: &Transformer) -> Vec<Recompute> {
        let (dense, experts) = model.spec().block_counts();
        let latent = model.latent.is_some();
        if experts == 0 && !latent {
            return Recompute::ALL.to_vec();
        }
        let sets = [
            (dense > 0, Modules::MLP),
            (dense > 0, Modules::CORE_ATTENTION.with(Modules::MLP)),
            (latent, Modules::LATENT_UP),
            (latent && dense > 0, Modules::LATENT_UP.with(Modules::MLP)),
            (experts > 0, Modules::EXPERT_ACTIVATION),
            (
                experts > 0,
                Modules::LAYER_NORM.with(Modules::EXPERT_ACTIVATION),
            ),
        ];
        let mut choices = Recompute::ALL.to_vec();
        choices.extend(
            sets.into_iter()
                .filter(|&(has, _)| has)
                .map(|(_, m)| Recompute::Modules(m)),
        );
        choices
    }
}

/// A set of a block's modules (Megatron-Core's `recompute_modules`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Modules(u8);

impl Modules {
    /// The attention core (`core_attn`).
    pub const CORE_ATTENTION: Modules = Modules(1);
    /// A dense block's MLP (`mlp`).
    pub const MLP: Modules = Modules(2);
    /// The experts' activation (`moe_act`).
    pub const EXPERT_ACTIVATION: Modules = Modules(4);
    /// The norms (`layernorm`).
    pub const LAYER_NORM: Modules = Modules(8);
    /// Latent attention's up projections (`mla_up_proj`).
    pub const LATENT_UP: Modules = Modules(16);

    const NAMES: [(Modules, &'static str); 5] = [
        (Modules::CORE_ATTENTION, "core_attn"),
        (Modules::MLP, "mlp"),
        (Modules::EXPERT_ACTIVATION, "moe_act"),
        (Modules::LAYER_NORM, "layernorm"),
        (Modules::LATENT_UP, "mla_up_proj"),
    ];

    /// Both sets.
    pub const fn with(self, other: Modules) -> Modules {
        Modules(self.0 | other.0)
    }

    /// Whether every module of `other` is in the set.
    pub fn contains(self, other: Modules) -> bool {
        self.0 & other.0 == other.0
    }

    /// Megatron-Core's names of the set's modules.
    pub fn names(self) -> Vec<&'static str> {
        Modules::NAMES
            .into_iter()
            .filter(|&(m, _)| self.contains(m))
            .map(|(_, name)| name)
            .collect()
    }

    /// Parses Megatron-Core's names, comma-separated (`core_attn,mlp`).
    ///
    /// # Errors
    /// The first name that is no module's.
    pub fn parse(list: &str) -> Result<Modules, UnknownModule> {
        list.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .try_fold(Modules::default(), |set, name| {
                Modules::NAMES
                    .into_iter()
                    .find(|&(_, n)| n == name)
                    .map(|(m, _)| set.with(m))
                    .ok_or_else(|| UnknownModule(name.to_owned()))
            })
    }
}

/// A name in a list of modules (`--recompute-modules`) that is no module's: the user's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no module `{name}` (modules: {known})", name = .0, known = Modules::NAMES.map(|(_, n)| n).join(", "))]
pub struct UnknownModule(pub String);

/// What a configuration keeps in host memory instead of on its GPUs, as Megatron-Core
/// offloads (needs host figures in the cluster: [`crate::cluster::Host`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
pub struct Offload {
    /// Blocks whose stashed activations are copied to host memory as their forward pass
    /// ends and back before their backward pass (`--cpu-offloading-num-layers`: Megatron-
    /// Core's layer-wise offload, each copy behind the next block's compute; it refuses a
    /// pipeline, recomputation, or all of a model's blocks).
    pub activation_layers: u64,
    /// Percent of the optimizer state (fp32 master weights and moments) kept in host
    /// memory and stepped there by the CPU (`--optimizer-cpu-offload
    /// --optimizer-offload-fraction`, Megatron-Core's hybrid device optimizer): each step
    /// copies its gradients down and its updated weights back.
    pub optimizer_percent: u8,
}

impl Offload {
    /// Nothing offloaded.
    pub const NONE: Offload = Offload {
        activation_layers: 0,
        optimizer_percent: 0,
    };

    /// Whether anything is offloaded.
    pub fn any(self) -> bool {
        self != Offload::NONE
    }

    /// The offloaded fraction of the optimizer state.
    pub fn optimizer_fraction(self) -> f64 {
        f64::from(self.optimizer_percent.min(100)) / 100.0
    }
}

/// A point of Megatron-LM's space: how every block, the embedding and the head are spread
/// over `tensor × pipeline × data` GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Parallelism {
    /// Tensor-parallel degree `t` (GPUs of one node splitting every block).
    pub tensor: u32,
    /// Context-parallel degree `c`: each sequence cut into `c` pieces of positions on as
    /// many GPUs (Megatron-Core's `--context-parallel-size`), the attention's keys and
    /// values exchanged as `context_comm` says. Priced and searched; not lowered yet.
    pub context: u32,
    /// How the context-parallel group exchanges keys and values (`--cp-comm-type`).
    pub context_comm: ContextComm,
    /// Pipeline stages `p`.
    pub pipeline: u32,
    /// Data-parallel replicas `d`.
    pub data: u32,
    /// Sequences per microbatch `b`.
    pub micro_batch: u64,
    /// Model chunks per GPU `v` (interleaved 1F1B when above 1).
    pub virtual_stages: u32,
    /// Activation recomputation.
    pub recompute: Recompute,
    /// Sequence parallelism (LayerNorm and dropout regions split by positions).
    pub sequence_parallel: bool,
    /// ZeRO stage: 1 shards optimizer state over `d`, 2 gradients too, 3 parameters too.
    pub zero: u8,
    /// Pipeline schedule (1F1B, interleaved when `virtual_stages > 1`, or GPipe).
    pub schedule: Schedule,
    /// Expert-parallel degree `ep`: a mixture of experts' routed experts spread over this
    /// many ranks, tokens dispatched to them and combined back by all-to-alls. Megatron-
    /// Core's parallel folding draws the expert groups from the `t·c·d` ranks of a
    /// pipeline stage (`ep · etp` divides them); 1 for a dense model.
    pub expert: u32,
    /// Expert tensor-parallel degree `etp`: each expert's inner size split over this many
    /// ranks (1: every expert whole on one rank).
    pub expert_tensor: u32,
    /// What is kept in host memory.
    pub offload: Offload,
    /// Groups the data × context ranks are cut into, each holding a whole sharded copy of
    /// the ZeRO-sharded state (hybrid sharded data parallelism: FSDP2's HSDP, Megatron-
    /// Core's `--num-distributed-optimizer-instances`): the state shards over `d·c/r`
    /// consecutive ranks, and the shards' gradients are all-reduced across the `r` groups
    /// once an iteration. 1: one group, sharded over all of them.
    pub shard_groups: u32,
    /// The embedding and the loss each take a block's place when the blocks are split
    /// over the pipeline's chunks (Megatron-Core's `--account-for-embedding-in-pipeline-
    /// split --account-for-loss-in-pipeline-split`, as Megatron-Bridge's Llama 3.1 405B
    /// recipes run): the first and last chunks hold a block fewer ([`chunk_blocks`]).
    pub ends_as_blocks: bool,
}

/// The places a pipeline split spreads over its chunks: the blocks, and with
/// `ends_as_blocks` the embedding and the loss.
pub fn split_places(layers: u64, ends_as_blocks: bool) -> u64 {
    layers + if ends_as_blocks { 2 } else { 0 }
}

/// Whether Megatron-Core takes a split of `layers` blocks over `p` stages of `v` chunks:
/// interleaving, and counting the embedding and the loss as blocks, need the places to
/// divide into the chunks (`validate_args` and `TransformerConfig`); a plain split of the
/// blocks over `p` stages takes any count (written as a layout where uneven).
pub fn split_holds(layers: u64, p: u32, v: u32, ends_as_blocks: bool) -> bool {
    let chunks = u64::from(p) * u64::from(v.max(1));
    match (v > 1, ends_as_blocks) {
        (false, false) => true,
        _ => p > 1 && split_places(layers, ends_as_blocks) % chunks == 0,
    }
}

/// The blocks of each of `chunks` pipeline chunks (chunk `j` on stage `j mod p`) of a
/// model of `layers` blocks: spread evenly, the extra ones on the earliest chunks; with
/// `ends_as_blocks`, `layers + 2` places spread so, the embedding taking the first chunk's
/// first place and the loss the last chunk's last.
pub fn chunk_blocks(layers: u64, chunks: u64, ends_as_blocks: bool) -> Vec<u64> {
    let chunks = chunks.max(1);
    let ends = ends_as_blocks && chunks > 1;
    let places = split_places(layers, ends);
    (0..chunks)
        .map(|j| {
            let n = places / chunks + u64::from(j < places % chunks);
            let taken = u64::from(ends && j == 0) + u64::from(ends && j + 1 == chunks);
            n.saturating_sub(taken)
        })
        .collect()
}

impl Parallelism {
    /// One GPU doing everything: no parallelism, recomputation, sharding or offload, at
    /// `micro_batch` sequences a microbatch.
    pub fn one_gpu(micro_batch: u64) -> Parallelism {
        Parallelism {
            tensor: 1,
            context: 1,
            context_comm: ContextComm::Ring,
            pipeline: 1,
            data: 1,
            micro_batch,
            virtual_stages: 1,
            recompute: Recompute::None,
            sequence_parallel: false,
            zero: 0,
            schedule: Schedule::OneFOneB,
            expert: 1,
            expert_tensor: 1,
            offload: Offload::NONE,
            shard_groups: 1,
            ends_as_blocks: false,
        }
    }

    /// The data × context ranks one sharded copy of the ZeRO state spans.
    pub fn shard_size(&self) -> u32 {
        let ranks = self.data * self.context.max(1);
        match self.shard_groups.max(1) {
            r if ranks % r == 0 => ranks / r,
            _ => ranks,
        }
    }

    /// GPUs used: `t · c · p · d`.
    pub fn gpus(&self) -> u64 {
        u64::from(self.tensor)
            * u64::from(self.context.max(1))
            * u64::from(self.pipeline)
            * u64::from(self.data)
    }

    /// Microbatches per iteration for a global batch: `B / (b · d)`.
    pub fn microbatches(&self, batch: u64) -> u64 {
        batch / (self.micro_batch * u64::from(self.data)).max(1)
    }

    /// The schedule's name: `1f1b`, `interleaved-1f1b` or `gpipe`.
    pub fn schedule_name(&self) -> &'static str {
        match self.schedule {
            Schedule::OneFOneB if self.virtual_stages > 1 => "interleaved-1f1b",
            s => s.name(),
        }
    }
}

#[cfg(test)]
mod pipeline_split_tests {
    use super::chunk_blocks;

    #[test]
    fn the_ends_take_a_place_each_from_the_first_and_last_chunks() {
        // Llama 3.1 405B's 126 blocks over 8 stages of 8 chunks: 128 places, 2 a chunk.
        let chunks = chunk_blocks(126, 64, true);
        assert_eq!((chunks[0], chunks[63]), (1, 1));
        assert!(chunks[1..63].iter().all(|&n| n == 2));
        assert_eq!(chunks.iter().sum::<u64>(), 126);
        // Without: the extra blocks on the first chunks.
        let even = chunk_blocks(126, 64, false);
        assert_eq!((even[0], even[61], even[62], even[63]), (2, 2, 1, 1));
        // One chunk holds everything either way.
        assert_eq!(chunk_blocks(6, 1, true), [6]);
    }

    #[test]
    fn megatron_takes_the_ends_split_only_into_equal_chunks() {
        use super::split_holds;
        // Megatron-Bridge's GB200 405B recipe, PP16 VP8: 128 places over 128 chunks, the
        // first and last holding the embedding and the loss alone.
        assert!(split_holds(126, 16, 8, true));
        let chunks = chunk_blocks(126, 128, true);
        assert_eq!((chunks[0], chunks[127]), (0, 0));
        // Without interleaving a plain split takes any count, the ends split equal ones.
        assert!(split_holds(28, 4, 1, false));
        assert!(!split_holds(28, 4, 1, true));
        assert!(split_holds(28, 2, 1, true));
        // Interleaving needs two stages.
        assert!(!split_holds(6, 1, 2, false));
    }
}
