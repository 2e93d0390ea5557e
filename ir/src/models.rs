//! Generated ONNX models: structure-only GPT decoders of any shape, as Megatron-LM builds
//! them (learned position embeddings, pre-LayerNorm blocks, fused QKV, a GELU MLP, a tied or
//! untied LM head).
//!
//! Weights are external data whose file is never written (ralpc plans without reading
//! them); the small integer tables shape inference needs (reshape targets, split sizes,
//! position ids) are stored inline. The graph follows what PyTorch's exporters write for
//! such a model: `Split` of the fused QKV, `Reshape`/`Transpose` into heads, a scaled and
//! masked `Softmax`, `Transpose`/`Reshape` back.
//!
//! `cargo run --example gpt -- --layers 48 --hidden 8192 --heads 64 -o gpt.onnx` writes one.

mod experts;
pub mod huggingface;

use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
use onnx_protobuf::type_proto::{Tensor, Value as TypeValue};
use onnx_protobuf::{
    AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// The shape of a GPT decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptSpec {
    /// Transformer layers (blocks).
    pub layers: u64,
    /// Hidden size `h`.
    pub hidden: u64,
    /// Attention heads (divides `hidden`).
    pub heads: u64,
    /// Key and value heads: `heads` for multi-head attention, fewer for grouped-query
    /// attention (each shared by `heads / kv_heads` query heads), 1 for multi-query.
    pub kv_heads: u64,
    /// Sequence length `s`.
    pub sequence: u64,
    /// Rows of the learned position table (Megatron: `s`; 0: rotary positions, no table).
    pub positions: u64,
    /// Vocabulary `V`.
    pub vocabulary: u64,
    /// The MLP's inner size (Megatron: `4h`).
    pub ffn: u64,
    /// A gated MLP (SwiGLU: gate, up and down weights) instead of GELU between two.
    pub gated_mlp: bool,
    /// Biases on the dense layers (GPT's; Llama's have none).
    pub biases: bool,
    /// RMSNorm (a weight) instead of LayerNorm (a weight and a bias).
    pub rms_norm: bool,
    /// Whether the LM head reuses the token embedding (Megatron's default).
    pub tied: bool,
    /// Megatron's dropout (kept in training): on the embeddings, on the attention
    /// probabilities, and before each residual add.
    pub dropout: bool,
    /// Each attention head's size: `h/a` for most models, larger in Qwen3 and gpt-oss
    /// (whose queries are wider than the hidden state).
    pub head_dim: u64,
    /// Biases on the query, key and value projections only (Qwen2); `biases` puts them on
    /// every dense layer.
    pub qkv_bias: bool,
    /// An RMSNorm of each query and key head before the rotary positions (Qwen3).
    pub qk_norm: bool,
    /// Multi-head latent attention (DeepSeek-V2 and V3) in place of the Q, K, V
    /// projections.
    pub latent: Option<LatentAttention>,
    /// Every other block (the first of each pair) attends to the last `sliding_window`
    /// positions only (gpt-oss); 0: every block attends to the whole prefix.
    pub sliding_window: u64,
    /// A mixture of experts in place of the MLP, from block `dense_layers` on.
    pub moe: Option<MoeSpec>,
}

/// Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2", 2024, §2.1): queries and
/// keys/values are projected down to small latents (each RMS-normed) and up again per head;
/// each head's query and key carry `nope_dim` plain and `rope_dim` rotary features, the
/// rotary key shared by all heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct LatentAttention {
    /// The query latent's size (0: queries projected directly, as in DeepSeek-V2-Lite).
    pub q_rank: u64,
    /// The key/value latent's size.
    pub kv_rank: u64,
    /// Rotary features of each query and key head (the key's shared by every head).
    pub rope_dim: u64,
    /// Plain features of each query and key head.
    pub nope_dim: u64,
    /// Features of each value head.
    pub v_dim: u64,
}

/// How a router turns scores into the weights of the experts it picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Router {
    /// Softmax over the experts (Mixtral, Qwen3-MoE, gpt-oss).
    Softmax,
    /// A sigmoid per expert, normalised over the chosen ones (DeepSeek-V3).
    Sigmoid,
}

/// A mixture-of-experts MLP (Shazeer et al., 2017; Fedus et al., 2022): a linear router
/// scores each token against `experts` MLPs of inner size `expert_ffn` (gated as the
/// model's MLP is) and sends it to the `top_k` best, whose outputs it sums by the router's
/// weights; shared experts (DeepSeek's) see every token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct MoeSpec {
    /// Routed experts `E`.
    pub experts: u64,
    /// Experts each token goes to `k`.
    pub top_k: u64,
    /// Each routed expert's inner size.
    pub expert_ffn: u64,
    /// The shared experts' inner size together (DeepSeek: their count × `expert_ffn`);
    /// 0: none.
    pub shared_ffn: u64,
    /// Leading blocks that keep a dense MLP of `ffn` (DeepSeek-V3's first 3).
    pub dense_layers: u64,
    /// How scores become weights.
    pub router: Router,
    /// Group-limited routing (DeepSeek-V3's node-limited routing: 8 groups, 4 chosen): the
    /// experts fall into `groups` equal groups and a token's `top_k` come from its
    /// `top_groups` best groups. 0: the experts are not grouped.
    pub groups: u64,
    /// Groups a token's experts may come from; 0 without groups.
    pub top_groups: u64,
}

impl GptSpec {
    /// Megatron-LM's GPT: `ffn = 4h`, tied embeddings.
    pub fn megatron(layers: u64, hidden: u64, heads: u64, sequence: u64, vocabulary: u64) -> Self {
        GptSpec {
            layers,
            hidden,
            heads,
            kv_heads: heads,
            sequence,
            positions: sequence,
            vocabulary,
            ffn: 4 * hidden,
            gated_mlp: false,
            biases: true,
            rms_norm: false,
            tied: true,
            dropout: true,
            head_dim: hidden / heads.max(1),
            qkv_bias: false,
            qk_norm: false,
            latent: None,
            sliding_window: 0,
            moe: None,
        }
    }

    /// A Llama decoder (Touvron et al., 2023): rotary positions, RMSNorm, grouped-query
    /// attention over `kv_heads`, a SwiGLU MLP of `ffn`, no biases, no dropout, an untied
    /// head.
    pub fn llama(
        layers: u64,
        hidden: u64,
        heads: u64,
        kv_heads: u64,
        ffn: u64,
        sequence: u64,
        vocabulary: u64,
    ) -> Self {
        GptSpec {
            kv_heads,
            positions: 0,
            ffn,
            gated_mlp: true,
            biases: false,
            rms_norm: true,
            tied: false,
            dropout: false,
            ..GptSpec::megatron(layers, hidden, heads, sequence, vocabulary)
        }
    }

    /// Columns of the fused QKV projection: `a·d` for the queries, `kv·d` each for the
    /// keys and values (`d` the head size; `h`, `h·kv/a`, `h·kv/a` where `d = h/a`).
    pub fn qkv_width(&self) -> u64 {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    /// The attention's output width before its projection back to `h`: `a·d` (latent
    /// attention: `a` value heads).
    pub fn attention_width(&self) -> u64 {
        match self.latent {
            Some(l) => self.heads * l.v_dim,
            None => self.heads * self.head_dim,
        }
    }

    /// Features of each query and key head, and of each value head.
    pub fn head_dims(&self) -> (u64, u64) {
        match self.latent {
            Some(l) => (l.nope_dim + l.rope_dim, l.v_dim),
            None => (self.head_dim, self.head_dim),
        }
    }

    /// Matrices of the MLP's inner size: GELU's 2, SwiGLU's 3.
    pub fn mlp_matrices(&self) -> u64 {
        if self.gated_mlp {
            3
        } else {
            2
        }
    }

    /// One norm's parameters: LayerNorm `2h`, RMSNorm `h`.
    pub fn norm_params(&self) -> u64 {
        if self.rms_norm {
            self.hidden
        } else {
            2 * self.hidden
        }
    }

    /// The attention's parameters: QKV `h·qkv`, projection `a·d·h`, their biases, the
    /// query and key norms (Qwen3's `2d`); latent attention's down projections with their
    /// norms, up projections and output projection.
    pub fn attention_params(&self) -> u64 {
        let (h, a) = (self.hidden, self.heads);
        if let Some(l) = self.latent {
            let qk = l.nope_dim + l.rope_dim;
            let queries = match l.q_rank {
                0 => h * a * qk,
                r => h * r + r + r * a * qk,
            };
            let keys_values =
                h * (l.kv_rank + l.rope_dim) + l.kv_rank + l.kv_rank * a * (l.nope_dim + l.v_dim);
            return queries + keys_values + a * l.v_dim * h;
        }
        let qkv = self.qkv_width();
        let biases = match (self.biases, self.qkv_bias) {
            (true, _) => qkv + h,
            (false, true) => qkv,
            (false, false) => 0,
        };
        let norms = if self.qk_norm { 2 * self.head_dim } else { 0 };
        h * qkv + self.attention_width() * h + biases + norms
    }

    /// A dense MLP's parameters at inner size `f`: `m` matrices of `h·f` and, with biases,
    /// `(m − 1)f + h`.
    pub fn mlp_params(&self, f: u64) -> u64 {
        let (h, m) = (self.hidden, self.mlp_matrices());
        m * h * f + if self.biases { (m - 1) * f + h } else { 0 }
    }

    /// One block's parameters with the dense MLP. Megatron's GPT: attention `4h² + 4h`, MLP
    /// `2hf + f + h`, two LayerNorms `4h`.
    pub fn block_params(&self) -> u64 {
        self.attention_params() + self.mlp_params(self.ffn) + 2 * self.norm_params()
    }

    /// The router's parameters (`h·E`, and `E` biases with the model's biases).
    pub fn router_params(&self) -> u64 {
        self.moe.map_or(0, |moe| {
            self.hidden * moe.experts + if self.biases { moe.experts } else { 0 }
        })
    }

    /// One block's parameters with the mixture of experts, and those a token uses
    /// (its `k` experts): (total, active).
    pub fn moe_block_params(&self) -> (u64, u64) {
        let Some(moe) = self.moe else {
            return (self.block_params(), self.block_params());
        };
        let expert = self.mlp_params(moe.expert_ffn);
        let shared = match moe.shared_ffn {
            0 => 0,
            f => self.mlp_params(f),
        };
        let common =
            self.attention_params() + 2 * self.norm_params() + self.router_params() + shared;
        (common + moe.experts * expert, common + moe.top_k * expert)
    }

    /// Blocks with a dense MLP, and with experts.
    pub fn block_counts(&self) -> (u64, u64) {
        match self.moe {
            Some(moe) => {
                let dense = moe.dense_layers.min(self.layers);
                (dense, self.layers - dense)
            }
            None => (self.layers, 0),
        }
    }

    /// The token and position embeddings' parameters: `(V + positions)h`.
    pub fn embedding_params(&self) -> u64 {
        (self.vocabulary + self.positions) * self.hidden
    }

    /// The final norm and an untied head `Vh`.
    pub fn head_params(&self) -> u64 {
        self.norm_params()
            + if self.tied {
                0
            } else {
                self.vocabulary * self.hidden
            }
    }

    /// All parameters. With `f = 4h`, `s` positions and a tied head this is Megatron's
    /// `12lh²(1 + 13/12h + (V+s)/12lh)` plus the final LayerNorm.
    pub fn params(&self) -> u64 {
        let (dense, experts) = self.block_counts();
        self.total(dense, experts, self.moe_block_params().0)
    }

    /// The blocks' parameters, `moe_block` each for those with experts, and the embedding
    /// and head; `u64::MAX` where that overflows (which [`GptSpec::validate`] refuses).
    fn total(&self, dense: u64, experts: u64, moe_block: u64) -> u64 {
        dense
            .saturating_mul(self.block_params())
            .saturating_add(experts.saturating_mul(moe_block))
            .saturating_add(self.embedding_params())
            .saturating_add(self.head_params())
    }

    /// The parameters one token uses: every expert a router does not pick left out (the
    /// "active" count mixture-of-experts models publish).
    pub fn active_params(&self) -> u64 {
        let (dense, experts) = self.block_counts();
        self.total(dense, experts, self.moe_block_params().1)
    }

    /// Checks that the shape describes a model (non-zero sizes, heads dividing hidden).
    ///
    /// # Errors
    /// The first field at fault.
    pub fn validate(&self) -> Result<(), ModelError> {
        // Bounds past any model trained (each formula's products then fit in 64 bits).
        let latent = self.latent.unwrap_or(LatentAttention {
            q_rank: 0,
            kv_rank: 1,
            rope_dim: 0,
            nope_dim: 1,
            v_dim: 1,
        });
        let moe = self.moe.unwrap_or(MoeSpec {
            experts: 1,
            top_k: 1,
            expert_ffn: 1,
            shared_ffn: 0,
            dense_layers: 0,
            router: Router::Softmax,
            groups: 0,
            top_groups: 0,
        });
        for (name, v, most) in [
            ("layers", self.layers, 1 << 14),
            ("hidden", self.hidden, 1 << 20),
            ("heads", self.heads, 1 << 12),
            ("kv_heads", self.kv_heads, 1 << 12),
            ("head_dim", self.head_dim, 1 << 14),
            ("sequence", self.sequence, 1 << 24),
            ("positions", self.positions, 1 << 24),
            ("vocabulary", self.vocabulary, 1 << 24),
            ("ffn", self.ffn, 1 << 22),
            ("experts", moe.experts, 1 << 14),
            ("expert_ffn", moe.expert_ffn, 1 << 22),
            ("shared_ffn", moe.shared_ffn, 1 << 22),
            (
                "latent ranks and head sizes",
                latent.q_rank.max(latent.kv_rank),
                1 << 16,
            ),
            (
                "latent head sizes",
                latent.rope_dim.max(latent.nope_dim).max(latent.v_dim),
                1 << 14,
            ),
        ] {
            if v > most {
                return Err(ModelError::Spec(format!(
                    "{name} {v} is above {most}: no model is that large"
                )));
            }
        }
        for (name, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("sequence", self.sequence),
            ("vocabulary", self.vocabulary),
            ("ffn", self.ffn),
        ] {
            if v == 0 {
                return Err(ModelError::Spec(format!("{name} must be at least 1")));
            }
        }
        if self.positions != 0 && self.positions < self.sequence {
            return Err(ModelError::Spec(format!(
                "positions {} cannot cover the sequence {}",
                self.positions, self.sequence
            )));
        }
        if self.head_dim == 0 {
            return Err(ModelError::Spec("head_dim must be at least 1".to_owned()));
        }
        if self.hidden % self.heads != 0 && self.head_dim == self.hidden / self.heads {
            return Err(ModelError::Spec(format!(
                "hidden {} is not a multiple of heads {}",
                self.hidden, self.heads
            )));
        }
        if self.heads % self.kv_heads != 0 {
            return Err(ModelError::Spec(format!(
                "heads {} is not a multiple of kv_heads {}",
                self.heads, self.kv_heads
            )));
        }
        let rotary = match self.latent {
            Some(l) => l.rope_dim,
            None => self.head_dim,
        };
        if self.positions == 0 && rotary % 2 != 0 {
            return Err(ModelError::Spec(format!(
                "rotary positions need an even head size, not {rotary}"
            )));
        }
        if self.latent.is_some() && (self.qk_norm || self.qkv_bias) {
            return Err(ModelError::Spec(
                "latent attention has no query/key norms or Q, K, V biases".to_owned(),
            ));
        }
        if let Some(l) = self.latent {
            for (name, v) in [
                ("latent kv_rank", l.kv_rank),
                ("latent v_dim", l.v_dim),
                ("latent nope_dim + rope_dim", l.nope_dim + l.rope_dim),
            ] {
                if v == 0 {
                    return Err(ModelError::Spec(format!("{name} must be at least 1")));
                }
            }
        }
        if let Some(moe) = self.moe {
            if moe.experts == 0 || moe.expert_ffn == 0 {
                return Err(ModelError::Spec(
                    "experts and their inner size must be at least 1".to_owned(),
                ));
            }
            if moe.top_k == 0 || moe.top_k > moe.experts {
                return Err(ModelError::Spec(format!(
                    "top_k {} must pick 1 to {} experts",
                    moe.top_k, moe.experts
                )));
            }
            if moe.dense_layers > self.layers {
                return Err(ModelError::Spec(format!(
                    "dense_layers {} exceeds the {} layers",
                    moe.dense_layers, self.layers
                )));
            }
            if let Some(per_group) = moe.experts.checked_div(moe.groups) {
                if moe.experts % moe.groups != 0 {
                    return Err(ModelError::Spec(format!(
                        "{} expert groups do not divide {} experts",
                        moe.groups, moe.experts
                    )));
                }
                if moe.top_groups == 0
                    || moe.top_groups > moe.groups
                    || moe.top_k > moe.top_groups * per_group
                {
                    return Err(ModelError::Spec(format!(
                        "top {} of {} expert groups ({per_group} experts each) cannot hold \
                         a token's {} experts",
                        moe.top_groups, moe.groups, moe.top_k
                    )));
                }
            }
        }
        if self.params() == u64::MAX {
            return Err(ModelError::Spec(
                "the parameter count overflows 64 bits".to_owned(),
            ));
        }
        Ok(())
    }
}

/// Why a model cannot be written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// Its description (a shape, a configuration, a list of products) describes no model
    /// ralpc writes: the caller's input, the field named.
    #[error("{0}")]
    Spec(String),
    /// protobuf could not serialize the graph it built: a bug.
    #[error("cannot serialize the model: {0}")]
    Serialize(String),
}

/// The ONNX bytes of a structure-only GPT of shape `spec`, input `input_ids [batch, s]`,
/// output `logits [batch, s, V]`.
///
/// # Errors
/// An invalid `spec` (see [`GptSpec::validate`]).
pub fn gpt(spec: &GptSpec) -> Result<Vec<u8>, ModelError> {
    spec.validate()?;
    // Shapes the planner prices but this generator does not write yet.
    let unwritten = [
        (
            spec.head_dim != spec.hidden / spec.heads,
            "a head size other than hidden / heads",
        ),
        (spec.qk_norm, "query and key norms"),
        (spec.qkv_bias && !spec.biases, "biases on Q, K and V alone"),
        (spec.latent.is_some(), "latent attention"),
        (spec.sliding_window != 0, "sliding-window attention"),
        (
            spec.moe.is_some_and(|moe| moe.groups > 0),
            "group-limited routing",
        ),
    ];
    if let Some((_, what)) = unwritten.iter().find(|(has, _)| *has) {
        return Err(ModelError::Spec(format!(
            "the ONNX generator does not write {what} yet"
        )));
    }
    let (h, a, kv, s, v, f) = (
        spec.hidden as i64,
        spec.heads as i64,
        spec.kv_heads as i64,
        spec.sequence as i64,
        spec.vocabulary as i64,
        spec.ffn as i64,
    );
    let d = h / a;
    let rotary = spec.positions == 0;
    let mut b = Builder::default();
    b.input("input_ids", 7, &[None, Some(s)]);
    b.external("wte", &[v, h]);
    if !rotary {
        b.external("wpe", &[spec.positions as i64, h]);
        b.ints("position_ids", &[s], &(0..s).collect::<Vec<_>>());
    }
    if kv == a {
        b.ints("qkv_sizes", &[3], &[h, h, h]);
    }
    b.ints("heads_shape", &[4], &[0, s, a, d]);
    b.ints("hidden_shape", &[3], &[0, s, h]);
    if kv != a {
        // Each key and value head serves a/kv query heads: [b, s, kv, d] → unsqueezed
        // [b, s, kv, 1, d] → expanded [b, s, kv, a/kv, d] → [b, s, a, d].
        b.ints("kv_heads_shape", &[4], &[0, s, kv, d]);
        b.ints("kv_group_axis", &[1], &[3]);
        b.ints("kv_group_expand", &[5], &[1, 1, 1, a / kv, 1]);
    }
    if rotary {
        // Rotary positions (Su et al.): cos and sin of position × 10000^(−2i/d), the d/2
        // frequencies twice, [s, 1, d] to broadcast over [b, s, heads, d].
        let angles: Vec<f64> = (0..s)
            .flat_map(|p| {
                (0..d)
                    .map(move |i| p as f64 * 10000f64.powf(-2.0 * (i % (d / 2)) as f64 / d as f64))
            })
            .collect();
        let table = |f: fn(f64) -> f64| angles.iter().map(|&x| f(x) as f32).collect::<Vec<_>>();
        b.constant("rotary_cos", &[s, 1, d], &table(f64::cos));
        b.constant("rotary_sin", &[s, 1, d], &table(f64::sin));
        b.ints("rotary_halves", &[2], &[d / 2, d / 2]);
    }
    if spec.rms_norm {
        b.ints("norm_axes", &[1], &[-1]);
        b.constant("norm_epsilon", &[], &[1.0e-5]);
    }
    // Constants, not weights: 1/√(h/a), and a mask that hides later positions (−10⁴, as
    // Megatron's fused kernel fills them), built in the graph from the positions, as
    // exporters write it: a constant would hold s² floats (64 GiB at s = 131,072).
    b.constant("attention_scale", &[], &[1.0 / (d as f32).sqrt()]);
    b.ints("mask_start", &[], &[0]);
    b.ints("mask_limit", &[], &[s]);
    b.ints("mask_delta", &[], &[1]);
    b.ints("mask_rows", &[1], &[1]);
    b.ints("mask_columns", &[1], &[0]);
    b.constant("mask_hidden", &[], &[-1.0e4]);
    b.constant("mask_shown", &[], &[0.0]);
    b.node(
        "Range",
        "mask.positions",
        &["mask_start", "mask_limit", "mask_delta"],
        &["mask_positions"],
        &[],
    );
    b.node(
        "Unsqueeze",
        "mask.queries",
        &["mask_positions", "mask_rows"],
        &["mask_queries"],
        &[],
    );
    b.node(
        "Unsqueeze",
        "mask.keys",
        &["mask_positions", "mask_columns"],
        &["mask_keys"],
        &[],
    );
    b.node(
        "Less",
        "mask.later",
        &["mask_queries", "mask_keys"],
        &["mask_later"],
        &[],
    );
    b.node(
        "Where",
        "mask.fill",
        &["mask_later", "mask_hidden", "mask_shown"],
        &["causal_mask"],
        &[],
    );
    if spec.dropout {
        b.constant("dropout_ratio", &[], &[0.1]);
        b.scalar("dropout_training", 9, |t| t.int32_data = vec![1]);
    }
    // `input`, or its dropout (Megatron's p = 0.1, in training) named `name`.
    let dropout = |b: &mut Builder, name: &str, input: &str| -> String {
        if !spec.dropout {
            return input.to_owned();
        }
        let out = format!("{name}.out");
        b.node(
            "Dropout",
            name,
            &[input, "dropout_ratio", "dropout_training"],
            &[&out],
            &[],
        );
        out
    };
    // The norm `name` of `input` (its weights `{name}.weight`, `{name}.bias`), writing
    // `out`.
    let norm = |b: &mut Builder, name: &str, input: &str, out: &str| {
        let w = format!("{name}.weight");
        if !spec.rms_norm {
            let bias = format!("{name}.bias");
            b.node(
                "LayerNormalization",
                name,
                &[input, &w, &bias],
                &[out],
                &[Attr::Int("axis", -1)],
            );
            return;
        }
        // x / √(mean(x²) + ε) · w, as PyTorch's exporters write RMSNorm.
        let t = |step: &str| format!("{name}.{step}");
        b.node("Mul", &t("square"), &[input, input], &[&t("sq")], &[]);
        b.node(
            "ReduceMean",
            &t("mean"),
            &[&t("sq"), "norm_axes"],
            &[&t("ms")],
            &[],
        );
        b.node(
            "Add",
            &t("epsilon"),
            &[&t("ms"), "norm_epsilon"],
            &[&t("mse")],
            &[],
        );
        b.node("Sqrt", &t("sqrt"), &[&t("mse")], &[&t("rms")], &[]);
        b.node(
            "Div",
            &t("normalize"),
            &[input, &t("rms")],
            &[&t("normed")],
            &[],
        );
        b.node("Mul", &t("scale"), &[&t("normed"), &w], &[out], &[]);
    };
    // The weights of norm `name`.
    let norm_weights = |b: &mut Builder, name: &str| {
        b.external(&format!("{name}.weight"), &[h]);
        if !spec.rms_norm {
            b.external(&format!("{name}.bias"), &[h]);
        }
    };
    let linear = |b: &mut Builder, name: &str, input: &str| linear(b, spec, name, input);
    // Rotary positions applied to `x` ([b, s, heads, d]): x·cos + rotate_half(x)·sin.
    let rotate = |b: &mut Builder, name: &str, x: &str| -> String {
        let t = |step: &str| format!("{name}.{step}");
        b.node(
            "Split",
            &t("halves"),
            &[x, "rotary_halves"],
            &[&t("x1"), &t("x2")],
            &[Attr::Int("axis", -1)],
        );
        b.node("Neg", &t("neg"), &[&t("x2")], &[&t("nx2")], &[]);
        b.node(
            "Concat",
            &t("rotate_half"),
            &[&t("nx2"), &t("x1")],
            &[&t("rot")],
            &[Attr::Int("axis", -1)],
        );
        b.node("Mul", &t("cos"), &[x, "rotary_cos"], &[&t("xc")], &[]);
        b.node(
            "Mul",
            &t("sin"),
            &[&t("rot"), "rotary_sin"],
            &[&t("rs")],
            &[],
        );
        b.node("Add", name, &[&t("xc"), &t("rs")], &[&t("out")], &[]);
        t("out")
    };
    // Key or value heads `x` ([b, s, kv, d]) repeated for the query heads ([b, s, a, d]).
    let share = |b: &mut Builder, name: &str, x: &str| -> String {
        let t = |step: &str| format!("{name}.{step}");
        b.node(
            "Unsqueeze",
            &t("group"),
            &[x, "kv_group_axis"],
            &[&t("g")],
            &[],
        );
        b.node(
            "Expand",
            &t("expand"),
            &[&t("g"), "kv_group_expand"],
            &[&t("e")],
            &[],
        );
        b.node(
            "Reshape",
            name,
            &[&t("e"), "heads_shape"],
            &[&t("out")],
            &[],
        );
        t("out")
    };
    b.node(
        "Gather",
        "embed_tokens",
        &["wte", "input_ids"],
        &["tokens"],
        &[],
    );
    let embedded = if rotary {
        "tokens"
    } else {
        b.node(
            "Gather",
            "embed_positions",
            &["wpe", "position_ids"],
            &["positions"],
            &[],
        );
        b.node("Add", "embed", &["tokens", "positions"], &["embedded"], &[]);
        "embedded"
    };
    let mut x = dropout(&mut b, "embed.dropout", embedded);
    for i in 0..spec.layers {
        let p = |name: &str| format!("h.{i}.{name}");
        for w in ["ln_1", "ln_2"] {
            norm_weights(&mut b, &p(w));
        }
        let moe = spec.moe.filter(|moe| i >= moe.dense_layers);
        let dense = moe.is_none();
        let gate = (spec.gated_mlp && dense).then_some(("mlp.gate", h, f));
        // Grouped-query attention projects Q, K and V apart (as Hugging Face's Llama
        // does); multi-head attention through one fused QKV weight (Megatron's).
        let grouped = kv != a;
        let fused = (!grouped).then_some(("attn.qkv", h, 3 * h));
        let apart = |name, cols| grouped.then_some((name, h, cols));
        for (w, rows, cols) in [
            fused,
            apart("attn.q", h),
            apart("attn.k", kv * d),
            apart("attn.v", kv * d),
            Some(("attn.proj", h, h)),
            dense.then_some(("mlp.fc", h, f)),
            gate,
            dense.then_some(("mlp.proj", f, h)),
        ]
        .into_iter()
        .flatten()
        {
            b.external(&p(&format!("{w}.weight")), &[rows, cols]);
            if spec.biases {
                b.external(&p(&format!("{w}.bias")), &[cols]);
            }
        }
        norm(&mut b, &p("ln_1"), &x, &p("ln_1.out"));
        if grouped {
            for t in ["q", "k", "v"] {
                linear(&mut b, &p(&format!("attn.{t}")), &p("ln_1.out"));
            }
        } else {
            linear(&mut b, &p("attn.qkv"), &p("ln_1.out"));
            b.node(
                "Split",
                &p("attn.split"),
                &[&p("attn.qkv.out"), "qkv_sizes"],
                &[&p("q"), &p("k"), &p("v")],
                &[Attr::Int("axis", 2)],
            );
        }
        for (t, perm) in [
            ("q", [0, 2, 1, 3]),
            ("k", [0, 2, 3, 1]),
            ("v", [0, 2, 1, 3]),
        ] {
            let source = match grouped {
                true => p(&format!("attn.{t}.out")),
                false => p(t),
            };
            let target = if t == "q" || kv == a {
                "heads_shape"
            } else {
                "kv_heads_shape"
            };
            b.node(
                "Reshape",
                &p(&format!("attn.{t}_heads")),
                &[&source, target],
                &[&p(&format!("{t}4"))],
                &[],
            );
            let mut heads = p(&format!("{t}4"));
            if rotary && t != "v" {
                heads = rotate(&mut b, &p(&format!("attn.{t}_rotary")), &heads);
            }
            if t != "q" && kv != a {
                heads = share(&mut b, &p(&format!("attn.{t}_share")), &heads);
            }
            b.node(
                "Transpose",
                &p(&format!("attn.{t}_transpose")),
                &[&heads],
                &[&p(&format!("{t}t"))],
                &[Attr::Ints("perm", perm.to_vec())],
            );
        }
        b.node(
            "MatMul",
            &p("attn.scores"),
            &[&p("qt"), &p("kt")],
            &[&p("scores")],
            &[],
        );
        b.node(
            "Mul",
            &p("attn.scale"),
            &[&p("scores"), "attention_scale"],
            &[&p("scaled")],
            &[],
        );
        b.node(
            "Add",
            &p("attn.mask"),
            &[&p("scaled"), "causal_mask"],
            &[&p("masked")],
            &[],
        );
        b.node(
            "Softmax",
            &p("attn.softmax"),
            &[&p("masked")],
            &[&p("probs")],
            &[Attr::Int("axis", -1)],
        );
        let probs = dropout(&mut b, &p("attn.dropout"), &p("probs"));
        b.node(
            "MatMul",
            &p("attn.context"),
            &[&probs, &p("vt")],
            &[&p("ctx")],
            &[],
        );
        b.node(
            "Transpose",
            &p("attn.merge_transpose"),
            &[&p("ctx")],
            &[&p("ctx_t")],
            &[Attr::Ints("perm", vec![0, 2, 1, 3])],
        );
        b.node(
            "Reshape",
            &p("attn.merge_heads"),
            &[&p("ctx_t"), "hidden_shape"],
            &[&p("ctx_h")],
            &[],
        );
        linear(&mut b, &p("attn.proj"), &p("ctx_h"));
        let attended = dropout(&mut b, &p("attn.proj.dropout"), &p("attn.proj.out"));
        b.node("Add", &p("residual_1"), &[&x, &attended], &[&p("x1")], &[]);
        norm(&mut b, &p("ln_2"), &p("x1"), &p("ln_2.out"));
        let mlp_out = match moe {
            None => {
                linear(&mut b, &p("mlp.fc"), &p("ln_2.out"));
                if spec.gated_mlp {
                    linear(&mut b, &p("mlp.gate"), &p("ln_2.out"));
                }
                let activated = activate(&mut b, spec, &p, &p("mlp.fc.out"), &p("mlp.gate.out"));
                linear(&mut b, &p("mlp.proj"), &activated);
                p("mlp.proj.out")
            }
            Some(moe) => experts::block(&mut b, spec, &moe, &p, &p("ln_2.out")),
        };
        let mixed = dropout(&mut b, &p("mlp.proj.dropout"), &mlp_out);
        let next = format!("x{}", i + 1);
        b.node("Add", &p("residual_2"), &[&p("x1"), &mixed], &[&next], &[]);
        x = next;
    }
    norm_weights(&mut b, "ln_f");
    norm(&mut b, "ln_f", &x, "final");
    if spec.tied {
        b.node(
            "Transpose",
            "lm_head.transpose",
            &["wte"],
            &["wte_t"],
            &[Attr::Ints("perm", vec![1, 0])],
        );
        b.node("MatMul", "lm_head", &["final", "wte_t"], &["logits"], &[]);
    } else {
        b.external("lm_head.weight", &[h, v]);
        b.node(
            "MatMul",
            "lm_head",
            &["final", "lm_head.weight"],
            &["logits"],
            &[],
        );
    }
    b.output("logits");
    b.finish()
}

/// The dense layer `name` reading `input` through the weight `{name}.weight` (and adding
/// `{name}.bias` if the spec has biases), writing `{name}.out`.
fn linear(b: &mut Builder, spec: &GptSpec, name: &str, input: &str) {
    let w = format!("{name}.weight");
    let out = format!("{name}.out");
    if !spec.biases {
        b.node(
            "MatMul",
            &format!("{name}.matmul"),
            &[input, &w],
            &[&out],
            &[],
        );
        return;
    }
    let mm = format!("{name}.mm");
    b.node(
        "MatMul",
        &format!("{name}.matmul"),
        &[input, &w],
        &[&mm],
        &[],
    );
    b.node("Add", name, &[&mm, &format!("{name}.bias")], &[&out], &[]);
}

/// The MLP's activation of `fc` (the first product's output), named by `p`: SwiGLU
/// (`silu(gate) ⊙ fc`, `gate` the gate product's output) for a gated MLP, else GELU's tanh
/// form, as Megatron's GPT computes it.
fn activate(
    b: &mut Builder,
    spec: &GptSpec,
    p: &dyn Fn(&str) -> String,
    fc: &str,
    gate: &str,
) -> String {
    if !spec.gated_mlp {
        b.node(
            "Gelu",
            &p("mlp.gelu"),
            &[fc],
            &[&p("gelu")],
            &[Attr::Str("approximate", "tanh")],
        );
        return p("gelu");
    }
    b.node("Sigmoid", &p("mlp.sigmoid"), &[gate], &[&p("sigmoid")], &[]);
    b.node(
        "Mul",
        &p("mlp.silu"),
        &[gate, &p("sigmoid")],
        &[&p("silu")],
        &[],
    );
    b.node("Mul", &p("mlp.glu"), &[&p("silu"), fc], &[&p("glu")], &[]);
    p("glu")
}

/// One product `[batch, rows, inner] × [inner, cols]` of [`products`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Product {
    /// Its node's name; its input is `NAME.x`, its weight `NAME.w`, its output `NAME.y`.
    pub name: String,
    /// Rows a sample (a sequence's tokens).
    pub rows: u64,
    /// The reduced dimension.
    pub inner: u64,
    /// Output columns.
    pub cols: u64,
}

/// The ONNX bytes of independent `MatMul`s, one per product, each with its own input
/// (batch first) and structure-only weight: the kernels a profile measures where a model's
/// own graph lacks their shapes (a transformer block's products on one tensor-parallel
/// rank).
///
/// # Errors
/// No products, a zero or too large dimension, or two products of one name.
pub fn products(products: &[Product]) -> Result<Vec<u8>, ModelError> {
    if products.is_empty() {
        return Err(ModelError::Spec("no products to write".to_owned()));
    }
    let mut b = Builder::default();
    let mut names = std::collections::BTreeSet::new();
    for p in products {
        let dims = [p.rows, p.inner, p.cols];
        if dims.iter().any(|&d| d == 0 || d > i64::MAX as u64 / 2) {
            return Err(ModelError::Spec(format!(
                "{}: dimensions {dims:?} out of range",
                p.name
            )));
        }
        if !names.insert(&p.name) {
            return Err(ModelError::Spec(format!(
                "two products are named {}",
                p.name
            )));
        }
        let [rows, inner, cols] = dims.map(|d| d as i64);
        let (x, w, y) = (
            format!("{}.x", p.name),
            format!("{}.w", p.name),
            format!("{}.y", p.name),
        );
        b.input(&x, 1, &[None, Some(rows), Some(inner)]);
        b.external(&w, &[inner, cols]);
        b.node("MatMul", &p.name, &[&x, &w], &[&y], &[]);
        b.output(&y);
    }
    b.finish()
}

enum Attr<'a> {
    Int(&'a str, i64),
    Ints(&'a str, Vec<i64>),
    Str(&'a str, &'a str),
}

#[derive(Default)]
struct Builder {
    graph: GraphProto,
}

impl Builder {
    fn input(&mut self, name: &str, elem_type: i32, dims: &[Option<i64>]) {
        let mut shape = TensorShapeProto::new();
        for d in dims {
            let mut dim = Dimension::new();
            dim.value = Some(match d {
                None => DimValue::DimParam("batch".into()),
                Some(v) => DimValue::DimValue(*v),
            });
            shape.dim.push(dim);
        }
        let mut tensor = Tensor::new();
        tensor.elem_type = elem_type;
        tensor.shape = Some(shape).into();
        let mut ty = TypeProto::new();
        ty.value = Some(TypeValue::TensorType(tensor));
        let mut info = ValueInfoProto::new();
        info.name = name.into();
        info.type_ = Some(ty).into();
        self.graph.input.push(info);
    }

    fn output(&mut self, name: &str) {
        let mut info = ValueInfoProto::new();
        info.name = name.into();
        self.graph.output.push(info);
    }

    /// A float weight stored as external data that is never written.
    fn external(&mut self, name: &str, dims: &[i64]) {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = 1;
        t.dims = dims.to_vec();
        t.data_location = DataLocation::EXTERNAL.into();
        let mut location = StringStringEntryProto::new();
        location.key = "location".into();
        location.value = "model.onnx.data".into();
        t.external_data.push(location);
        self.graph.initializer.push(t);
    }

    /// A float32 `Constant` node named `name` writing `name`, its elements stored raw.
    fn constant(&mut self, name: &str, dims: &[i64], values: &[f32]) {
        let mut t = TensorProto::new();
        t.data_type = 1;
        t.dims = dims.to_vec();
        t.raw_data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut a = AttributeProto::new();
        a.name = "value".into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::TENSOR.into();
        a.t = Some(t).into();
        let mut n = NodeProto::new();
        n.op_type = "Constant".into();
        n.name = name.into();
        n.output = vec![name.into()];
        n.attribute.push(a);
        self.graph.node.push(n);
    }

    /// A scalar of ONNX type `data_type` stored inline, its value set by `fill`.
    fn scalar(&mut self, name: &str, data_type: i32, fill: impl FnOnce(&mut TensorProto)) {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = data_type;
        fill(&mut t);
        self.graph.initializer.push(t);
    }

    /// An int64 table stored inline.
    fn ints(&mut self, name: &str, dims: &[i64], values: &[i64]) {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = 7;
        t.dims = dims.to_vec();
        t.int64_data = values.to_vec();
        self.graph.initializer.push(t);
    }

    /// The model's bytes: this graph at opset 20.
    fn finish(self) -> Result<Vec<u8>, ModelError> {
        let mut m = ModelProto::new();
        m.ir_version = 10;
        m.producer_name = "ralpc".into();
        let mut opset = OperatorSetIdProto::new();
        opset.version = 20;
        m.opset_import.push(opset);
        m.graph = Some(self.graph).into();
        m.write_to_bytes()
            .map_err(|e| ModelError::Serialize(e.to_string()))
    }

    fn node(&mut self, op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: &[Attr]) {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.name = name.into();
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = outputs.iter().map(|s| s.to_string()).collect();
        for attr in attrs {
            let mut a = AttributeProto::new();
            match attr {
                Attr::Int(name, v) => {
                    a.name = (*name).into();
                    a.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
                    a.i = *v;
                }
                Attr::Ints(name, v) => {
                    a.name = (*name).into();
                    a.type_ = onnx_protobuf::attribute_proto::AttributeType::INTS.into();
                    a.ints.clone_from(v);
                }
                Attr::Str(name, v) => {
                    a.name = (*name).into();
                    a.type_ = onnx_protobuf::attribute_proto::AttributeType::STRING.into();
                    a.s = v.as_bytes().to_vec();
                }
            }
            n.attribute.push(a);
        }
        self.graph.node.push(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accounted(spec: &GptSpec, batch: u64) -> crate::Accounting {
        let bytes = gpt(spec).expect("generates");
        let path = std::path::Path::new("gpt.onnx");
        let mut model = crate::onnx::import_bytes(&bytes, path, None).expect("imports");
        crate::bind(
            &mut model.graph,
            &crate::Bindings {
                batch: Some(batch),
                ..Default::default()
            },
        )
        .expect("binds");
        let info = crate::verify(&model.graph).expect("verifies");
        crate::account(&model.graph, &info).expect("accounts")
    }

    #[test]
    fn generated_gpt_has_the_formula_parameters_and_flops() {
        for tied in [true, false] {
            let spec = GptSpec {
                tied,
                ..GptSpec::megatron(3, 64, 4, 16, 100)
            };
            let acc = accounted(&spec, 2);
            // The attention scale, the causal mask and the dropout ratio are constants, not
            // parameters.
            assert_eq!(acc.params, spec.params(), "tied: {tied}");
            // Forward MACs: per layer 12bsh² + 2bs²h (QKV, projection, MLP; scores and
            // context), plus the head bshV.
            let (b, s, h, v, l) = (2, 16, 64, 100, 3);
            let macs = l * (12 * b * s * h * h + 2 * b * s * s * h) + b * s * h * v;
            assert_eq!(acc.macs, macs);
        }
    }

    #[test]
    fn generated_mixtures_of_experts_have_the_formula_parameters() {
        // Mixtral's block (softmax router, SwiGLU experts) with a dense first block, and
        // DeepSeek's (sigmoid router, a shared expert); a GPT's (biases, GELU experts).
        let llama = GptSpec::llama(3, 64, 4, 2, 96, 16, 100);
        let gpt = GptSpec::megatron(2, 64, 4, 16, 100);
        for (base, router, shared, dense) in [
            (llama, Router::Softmax, 0, 1),
            (llama, Router::Sigmoid, 48, 0),
            (gpt, Router::Softmax, 0, 0),
        ] {
            let spec = GptSpec {
                moe: Some(MoeSpec {
                    experts: 4,
                    top_k: 2,
                    expert_ffn: 48,
                    shared_ffn: shared,
                    dense_layers: dense,
                    router,
                    groups: 0,
                    top_groups: 0,
                }),
                ..base
            };
            let acc = accounted(&spec, 2);
            assert_eq!(acc.params, spec.params(), "{router:?}, shared {shared}");
        }
    }

    #[test]
    fn generated_llama_has_the_formula_parameters_and_flops() {
        // Grouped-query attention (2 key/value heads for 4), and multi-head.
        for kv in [2, 4] {
            let spec = GptSpec::llama(3, 64, 4, kv, 96, 16, 100);
            let acc = accounted(&spec, 2);
            // The rotary tables and the norms' ε are constants, not parameters.
            assert_eq!(acc.params, spec.params(), "kv heads: {kv}");
            // Forward MACs: per layer bs·h(h + 2h·kv/a) for QKV, bsh² for the projection,
            // 3bshf for SwiGLU, 2bs²h for scores and context; the head bshV.
            let (b, s, h, f, v, l) = (2, 16, 64, 96, 100, 3);
            let qkv = h + 2 * h * kv / 4;
            let macs = l * (b * s * h * (qkv + h + 3 * f) + 2 * b * s * s * h) + b * s * h * v;
            assert_eq!(acc.macs, macs, "kv heads: {kv}");
        }
    }

    #[test]
    fn llama_2_sizes() {
        // Meta's Llama 2 checkpoints as Hugging Face counts their parameters (untied head,
        // no biases): 7 B with 32 key/value heads, 70 B with 8.
        let llama_7b = GptSpec::llama(32, 4096, 32, 32, 11008, 4096, 32000);
        assert_eq!(llama_7b.params(), 6_738_415_616);
        let llama_70b = GptSpec::llama(80, 8192, 64, 8, 28672, 4096, 32000);
        assert_eq!(llama_70b.params(), 68_976_648_192);
    }

    #[test]
    fn megatron_table_sizes() {
        // Narayanan et al. (SC'21) Table 1, as published (rounded: 1.652 B prints as 1.7 B).
        for (l, h, a, published, within) in [
            (24, 2304, 24, 1.7e9, 0.05e9),
            (48, 8192, 64, 39.1e9, 0.05e9),
            (128, 25600, 160, 1008e9, 0.5e9),
        ] {
            let p = GptSpec::megatron(l, h, a, 2048, 51200).params() as f64;
            assert!((p - published).abs() <= within, "{l}x{h}: {p}");
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let spec = GptSpec::megatron(2, 64, 5, 16, 100);
        assert!(gpt(&spec)
            .unwrap_err()
            .to_string()
            .contains("not a multiple of heads 5"));
        let spec = GptSpec::megatron(0, 64, 4, 16, 100);
        assert!(gpt(&spec)
            .unwrap_err()
            .to_string()
            .contains("layers must be at least 1"));
        let spec = GptSpec::llama(2, 64, 4, 3, 96, 16, 100);
        assert!(gpt(&spec)
            .unwrap_err()
            .to_string()
            .contains("not a multiple of kv_heads 3"));
    }
}
