//! The layer graph: the units of placement with their forward and backward work, the
//! bytes they keep and the tensors they exchange.
//!
//! Built from an ONNX model (through [`rewrite`](crate::rewrite)) or read from a planner's
//! profile (PipeDream's `graph.txt`, see [`profile`](crate::profile)). Figures are for the
//! whole global batch `LayerGraph::batch`; [`Layer::local`] gives one rank's share under a
//! split.
//!
//! Backward conventions (per layer, documented so plans can be checked by hand):
//! * layers with MACs (conv, dense, batched matmul): backward = 2 × forward MAC FLOPs (the
//!   input gradient and the weight gradient) + their other FLOPs once;
//! * all other layers: backward FLOPs = forward FLOPs;
//! * backward memory traffic = 2 × forward (gradients in and out plus stashed inputs).
//! * stashed bytes: the activations a layer reads (kept for its backward) plus the values
//!   inside a fused unit; each tensor is counted once, by its reader.

use std::collections::{BTreeMap, BTreeSet};

use ralpc_ir::{
    account, AccountError, Elements, ForwardSaves, Graph, GraphInfo, NodeId, Op, OpClass,
    Recurrent, ValueId, Work,
};
use serde::{Deserialize, Serialize};

use crate::plan::Window;
use crate::rewrite::{self, Limits, Report, Rewritten};

/// Index of a layer in [`LayerGraph::layers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct LayerId(pub u32);

/// What kind of work a layer does (selects the roofline efficiency).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Convolutions: compute-heavy, few parameters.
    Conv,
    /// Matrix products (Gemm, MatMul): fully connected and attention layers.
    Dense,
    /// Normalization over the batch or channels (BatchNorm, LRN).
    Norm,
    /// LayerNorm: each row normalized over its own features, so rows (a sequence) split
    /// freely — Megatron-LM's sequence parallelism. A reduction over the last axis alone
    /// (a decomposed RMSNorm's mean of squares) is one too.
    LayerNorm,
    /// Pooling.
    Pool,
    /// Softmax.
    Softmax,
    /// Elementwise arithmetic and activations.
    Elementwise,
    /// Reductions.
    Reduce,
    /// A lookup into a weight table (Gather on a parameter).
    Embedding,
    /// Copies, concatenations, transposes, slices.
    DataMovement,
    /// A scaled dot-product attention core (merged by the rewrite): independent per head,
    /// which are its features.
    Attention,
    /// A recurrent layer (RNN, GRU, LSTM): a small product per time step, the steps in
    /// sequence; split by samples, and when it is one op also by its gates
    /// ([`Recurrence`]).
    Recurrent,
    /// A mixture of experts' routed part (merged by the rewrite): a router sends each token
    /// to `k` of `E` experts, stacked by expert, and sums their outputs by its gates. Its
    /// work is `k/E` of its products by every expert.
    Experts,
}

impl LayerKind {
    /// All kinds.
    pub const ALL: [LayerKind; 13] = [
        LayerKind::Conv,
        LayerKind::Dense,
        LayerKind::Norm,
        LayerKind::LayerNorm,
        LayerKind::Pool,
        LayerKind::Softmax,
        LayerKind::Elementwise,
        LayerKind::Reduce,
        LayerKind::Embedding,
        LayerKind::DataMovement,
        LayerKind::Attention,
        LayerKind::Recurrent,
        LayerKind::Experts,
    ];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Conv => "conv",
            LayerKind::Dense => "dense",
            LayerKind::Norm => "norm",
            LayerKind::LayerNorm => "layer_norm",
            LayerKind::Pool => "pool",
            LayerKind::Softmax => "softmax",
            LayerKind::Elementwise => "elementwise",
            LayerKind::Reduce => "reduce",
            LayerKind::Embedding => "embedding",
            LayerKind::DataMovement => "data_movement",
            LayerKind::Attention => "attention",
            LayerKind::Experts => "experts",
            LayerKind::Recurrent => "recurrent",
        }
    }
}

/// Where a layer's input comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Producer {
    /// Another layer.
    Layer(LayerId),
    /// A graph input, by name.
    Input(String),
}

/// A tensor a layer reads from a neighbour.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Edge {
    /// Who produces it.
    pub from: Producer,
    /// The IR value (absent for imported layer graphs).
    #[serde(skip)]
    pub value: Option<ValueId>,
    /// Its size for the whole batch.
    pub bytes: u64,
    /// An earlier reader that keeps this tensor for its backward pass, which this reader's
    /// backward reads too: on the same ranks the tensor is kept once, so this reader's stash
    /// leaves it out; placed elsewhere, this reader keeps its own copy.
    #[serde(skip)]
    pub stash_kept_by: Option<LayerId>,
    /// Its reader keeps it to its backward pass: it is in the reader's `stash_bytes`.
    #[serde(skip)]
    pub stashed: bool,
    /// Only ops after the reader's matrix product read it (a residual added to the
    /// product, SwiGLU's gate multiplied into it): a split dense layer reads it at the share
    /// its output holds ([`Layer::reads_as`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub epilogue: bool,
}

/// One IR op inside a layer, with what a profile lookup needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Part {
    /// The IR node.
    #[serde(skip)]
    pub node: NodeId,
    /// Its ONNX op type.
    pub op: &'static str,
    /// Its profile signature, when its shapes are known.
    pub signature: Option<crate::profile::Signature>,
    /// Forward FLOPs (2 per MAC).
    pub fwd_flops: u64,
    /// Bytes it reads and writes (activations and weights).
    pub bytes: u64,
    /// Whether it launches a kernel (views and identities do not).
    pub launches: bool,
    /// Whether its backward pass makes a weight's gradient by a product of its own
    /// ([`ralpc_ir::Product::makes_weight_gradient`]): zero-bubble schedules defer it.
    #[serde(skip)]
    pub weight_product: bool,
    /// Kernels it launches one after another: 1, or for a recurrent layer two per time
    /// step (the recurrent product, then the gates), which no batch makes shorter.
    pub steps: u64,
}

/// Times measured for a layer as a whole (imported layer graphs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measured {
    /// Forward, µs, for the graph's batch.
    pub fwd_us: f64,
    /// Backward, µs.
    pub bwd_us: f64,
    /// Measurements at several per-GPU batches, sorted by batch (DeepPool's profiles):
    /// a share of the layer is then timed at its own batch rather than scaled. Empty when
    /// only the graph's batch was measured (PipeDream's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<crate::profile::Point>,
}

/// A unit of placement.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Layer {
    /// Name of its main op.
    pub name: String,
    /// The PyTorch module its main op came from (`features.0`), when the export says.
    pub module: String,
    /// What it computes (`Conv+Relu`).
    pub op: String,
    /// Its work class.
    pub kind: LayerKind,
    /// Its IR ops (empty for imported layer graphs).
    pub parts: Vec<Part>,
    /// Parameters (elements).
    pub params: u64,
    /// Parameter bytes (gradients are as large).
    pub param_bytes: u64,
    /// Forward FLOPs for the whole batch.
    pub fwd_flops: u64,
    /// Backward FLOPs for the whole batch.
    pub bwd_flops: u64,
    /// Activation bytes read and written in the forward pass (weights excluded).
    pub activation_io_bytes: u64,
    /// Bytes of its outputs.
    pub output_bytes: u64,
    /// Bytes kept from forward to backward besides its outputs: what its ops' backward
    /// passes read of the values made inside it and of the graph's inputs
    /// ([`Op::backward_reads`]).
    pub stash_bytes: u64,
    /// The part of `stash_bytes` a split cuts as it cuts the work, not as it cuts the
    /// layer's inputs: values made inside the layer, and inputs only its epilogue reads.
    pub inner_stash_bytes: u64,
    /// Bytes of its outputs it keeps until its backward pass (the runtime's layers hold
    /// them; its consumers share them). 0 for imported profiles, whose stash is counted
    /// by their own convention.
    pub kept_output_bytes: u64,
    /// What a fused attention kernel keeps of its softmax in place of the probabilities
    /// (FlashAttention's log-sum-exp: 4 bytes per query row and head), bytes; 0 for a
    /// layer without a softmax.
    pub softmax_rows_bytes: u64,
    /// The part of `inner_stash_bytes` shaped as a softmax's input or output (the
    /// scores, the probabilities, their dropout mask), which a fused attention kernel
    /// does not keep: it keeps the queries, keys and values, and recomputes the rest.
    pub scores_stash_bytes: u64,
    /// Tensors it reads from other layers and graph inputs.
    pub inputs: Vec<Edge>,
    /// Whole-layer measurements, when imported.
    pub measured: Option<Measured>,
    /// What a row split of it reads of its neighbours' rows, when it is a convolution or
    /// pooling whose rows a split can cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub halo: Option<Halo>,
    /// Its time loop, when it is one recurrent op (which a split by its gates can cut).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recurrence: Option<Recurrence>,
    /// Whether it holds a grouped (or depthwise) convolution. Its output channels are not
    /// offered as a split: each rank would read only its groups' input channels, which no
    /// executor here cuts yet.
    #[serde(skip)]
    pub grouped: bool,
}

/// The time loop of a layer that is one recurrent op (RNN, GRU, LSTM). Its steps run in
/// sequence; a split by its gates gives each rank a piece of the hidden units of every
/// gate, and the ranks exchange the whole state every step, because every step's
/// recurrent product reads all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Recurrence {
    /// Time steps, over every direction (the directions run one after the other).
    pub steps: u64,
    /// Hidden units: the most pieces a split by gates cuts it into.
    pub hidden: u64,
    /// Bytes of one step's whole state for the global batch (`batch × hidden` values).
    pub state_bytes: u64,
    /// Whole states a split by gates gathers per forward step: `h`, and for a GRU that
    /// resets before its recurrent product, also `r ⊙ h`. Backward replays the forward
    /// steps and sums as many gradients per step.
    pub exchanges: u64,
}

/// The halo of a layer split by rows: the row axis of its window op, and the tensors it
/// reads that need the rows around each piece.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Halo {
    /// Its convolution's or pooling's row axis.
    pub window: Window,
    /// The node it is.
    #[serde(skip)]
    pub node: NodeId,
    /// The layer's inputs its window reads, directly or through elementwise ops before it
    /// (a DenseNet block's BatchNorm and ReLU): each piece needs their rows around its own.
    #[serde(skip)]
    pub inputs: Vec<ValueId>,
}

/// How a layer is split over a device group (SOAP degrees).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Split {
    /// Sample (batch) degree.
    pub sample: u32,
    /// Context degree: every sample's sequence cut into this many pieces, one per rank of a
    /// context-parallel group (Megatron-Core's `--context-parallel-size`). The layers
    /// that work per token take their piece of the rows; an attention core, which relates
    /// every query to every key, reads the whole sequence's keys and values on each of
    /// them and writes its queries' rows. 1 (and not written) outside transformer plans.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub context: u32,
    /// Attribute (spatial / sequence) degree.
    pub attribute: u32,
    /// Parameter (output channels / features) degree.
    pub parameter: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Split {
    /// No split.
    pub const NONE: Split = Split {
        sample: 1,
        context: 1,
        attribute: 1,
        parameter: 1,
    };

    /// Data parallel over `n` devices.
    pub fn samples(n: u32) -> Split {
        Split {
            sample: n.max(1),
            ..Split::NONE
        }
    }

    /// Devices used: s · c · a · p.
    pub fn degree(&self) -> u32 {
        self.sample.max(1) * self.context.max(1) * self.attribute.max(1) * self.parameter.max(1)
    }
}

/// One rank's share of a layer under a split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalWork {
    /// Forward FLOPs.
    pub fwd_flops: f64,
    /// Backward FLOPs.
    pub bwd_flops: f64,
    /// Forward bytes moved to and from HBM (activations and its weight slice).
    pub fwd_bytes: f64,
    /// Parameter bytes it holds.
    pub param_bytes: f64,
    /// Bytes it stashes for backward.
    pub stash_bytes: f64,
    /// The fraction of the batch it computes on (1/s).
    pub batch_fraction: f64,
    /// The fraction of the layer's work it does (1/(s·a·p)).
    pub work_fraction: f64,
}

impl Layer {
    /// A `kind` layer of nothing, named after its kind: tests fill in what they need.
    #[cfg(test)]
    pub(crate) fn bare(kind: LayerKind) -> Layer {
        Layer {
            name: kind.name().into(),
            module: String::new(),
            op: kind.name().into(),
            kind,
            parts: Vec::new(),
            params: 0,
            param_bytes: 0,
            fwd_flops: 0,
            bwd_flops: 0,
            activation_io_bytes: 0,
            output_bytes: 0,
            stash_bytes: 0,
            inner_stash_bytes: 0,
            kept_output_bytes: 0,
            softmax_rows_bytes: 0,
            scores_stash_bytes: 0,
            inputs: Vec::new(),
            measured: None,
            halo: None,
            recurrence: None,
            grouped: false,
        }
    }

    /// The kind `edge`'s tensor is read as under `split` ([`epilogue_reads_as`]).
    pub fn reads_as(&self, edge: &Edge, split: Split) -> LayerKind {
        crate::plan::epilogue_reads_as(self.kind, split, edge.epilogue)
    }

    /// Whether it has parameters.
    pub fn has_params(&self) -> bool {
        self.params > 0
    }

    /// The share of its backward work that makes weight gradients, which a zero-bubble
    /// schedule runs apart from the input gradients. A product by a weight (a dense
    /// layer's GEMM, a convolution, a recurrent layer's gate products) has two backward
    /// products of its forward's FLOPs, one per gradient (Qi et al. §2: `T_B ≈ T_W`); the
    /// other ops' backward makes input gradients, or weight gradients at a cost a
    /// reduction's bytes and not FLOPs set (norms' scales, an embedding's rows), counted
    /// with the input gradients. A layer known only as a whole (an imported profile) of a
    /// weighted kind splits its backward in two halves.
    pub fn weight_gradient_share(&self) -> f64 {
        if self.params == 0 {
            return 0.0;
        }
        if self.parts.is_empty() || self.bwd_flops == 0 {
            return match self.kind {
                LayerKind::Dense | LayerKind::Conv | LayerKind::Recurrent => 0.5,
                _ => 0.0,
            };
        }
        let weighted: u64 = self
            .parts
            .iter()
            .filter(|p| p.weight_product)
            .map(|p| p.fwd_flops)
            .sum();
        (weighted as f64 / self.bwd_flops as f64).min(0.5)
    }

    /// One rank's work under `split`: FLOPs divide by s·a·p over the ranks that do not
    /// repeat each other's work ([`replicas`](crate::plan::replicas)); inputs and what is
    /// stashed of them by the share of its input view ([`input_share`](crate::plan::input_share):
    /// a dense layer's parameter split reads its input whole, an attention core's cuts its
    /// heads, an elementwise layer's its features); outputs by the work; weights by p.
    pub fn local(&self, split: Split) -> LocalWork {
        self.local_as(split, false)
    }

    /// [`Layer::local`], with an attention core run as one fused kernel (`fused`), which
    /// keeps its queries, keys and values and the softmax's log-sum-exp instead of the
    /// probabilities and what else its ops would keep of the scores (Dao et al., 2022,
    /// §3.1: the backward pass recomputes them).
    pub fn local_as(&self, split: Split, fused: bool) -> LocalWork {
        let (s, p) = (
            f64::from(split.sample.max(1)),
            f64::from(split.parameter.max(1)),
        );
        let replicas = f64::from(crate::plan::replicas(self.kind, split));
        let work = replicas / f64::from(split.degree());
        // What each rank reads of its inputs (and stashes of them): the share its input
        // view names, whole where the layer is replicated.
        let read = crate::plan::input_share(self.kind, split);
        let inputs = self.activation_io_bytes.saturating_sub(self.output_bytes) as f64;
        let inner = match fused && self.kind == LayerKind::Attention && self.softmax_rows_bytes > 0
        {
            true => {
                self.inner_stash_bytes
                    .saturating_sub(self.scores_stash_bytes)
                    + self.softmax_rows_bytes
            }
            false => self.inner_stash_bytes,
        };
        LocalWork {
            fwd_flops: self.fwd_flops as f64 * work,
            bwd_flops: self.bwd_flops as f64 * work,
            fwd_bytes: inputs * read
                + self.output_bytes as f64 * work
                + self.param_bytes as f64 / p,
            param_bytes: self.param_bytes as f64 / p,
            stash_bytes: self.stash_bytes.saturating_sub(self.inner_stash_bytes) as f64 * read
                + (inner + self.kept_output_bytes) as f64 * work,
            batch_fraction: 1.0 / s,
            work_fraction: work,
        }
    }
}

/// The layers of a model.
#[derive(Clone, Debug, Serialize)]
pub struct LayerGraph {
    /// The global batch the figures are for.
    pub batch: u64,
    /// Layers, producers before consumers.
    pub layers: Vec<Layer>,
    /// Layers whose outputs are the model's outputs.
    pub outputs: Vec<LayerId>,
    /// The rewrite's statistics (absent for imported layer graphs).
    #[serde(skip)]
    pub rewrite: Option<Report>,
    /// IR values carried by another value after rewriting.
    #[serde(skip)]
    pub aliases: BTreeMap<ValueId, ValueId>,
    /// Weights read by more than one layer.
    pub tied: Vec<TiedWeight>,
    /// Bytes of one element of its floating-point activations (4 for an fp32 export).
    pub float_bytes: u64,
    /// Why no rank may compute fewer samples than the whole batch, when that is so: an
    /// exporter baked the batch into a node the model cannot be re-batched at. The search
    /// then splits no layer's samples ([`LayerGraph::sample_pieces`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed_batch: Option<String>,
}

impl LayerGraph {
    /// No layers, at `batch`: what a model known only by its shape has.
    pub fn empty(batch: u64) -> LayerGraph {
        LayerGraph {
            batch,
            layers: Vec::new(),
            outputs: Vec::new(),
            rewrite: None,
            aliases: BTreeMap::new(),
            tied: Vec::new(),
            float_bytes: 4,
            fixed_batch: None,
        }
    }
}

/// A weight several layers read: a tied embedding, or initializers an exporter merged
/// because their values were equal. It is one tensor: its gradient is the sum over every
/// use and one update applies it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TiedWeight {
    /// The initializer's name.
    pub name: String,
    /// Its value in the IR.
    #[serde(skip)]
    pub value: Option<ValueId>,
    /// Its bytes.
    pub bytes: u64,
    /// The layers reading it, ascending; the first counts it in its `params` and
    /// `param_bytes` and carries its gradient.
    pub layers: Vec<LayerId>,
}

/// Why a layer graph could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayerError {
    /// Counting failed (unbound shapes, overflow).
    #[error(transparent)]
    Account(#[from] AccountError),
    /// The batch is not known.
    #[error("the batch size is not known: bind it (--batch) before building layers")]
    UnknownBatch,
}

impl LayerGraph {
    /// The most pieces a layer's samples may be cut into: one per sample, or 1 when the
    /// batch is fixed ([`LayerGraph::fixed_batch`]).
    pub fn sample_pieces(&self) -> u64 {
        if self.fixed_batch.is_some() {
            1
        } else {
            self.batch
        }
    }

    /// The same layers trained in mixed precision, activations `element_bytes` wide (2 for
    /// fp16 and bf16): the activation figures of a wider export shrink to that width.
    /// Weights keep theirs: in mixed precision the 16-bit weights and gradients plus the
    /// fp32 master copy cost what fp32 weights and gradients do.
    pub fn with_activation_bytes(mut self, element_bytes: u64) -> LayerGraph {
        let wide = self.float_bytes;
        if element_bytes == 0 || element_bytes >= wide {
            return self;
        }
        let narrow =
            |b: &mut u64| *b = (*b as u128 * u128::from(element_bytes) / u128::from(wide)) as u64;
        for layer in &mut self.layers {
            narrow(&mut layer.output_bytes);
            narrow(&mut layer.stash_bytes);
            narrow(&mut layer.inner_stash_bytes);
            narrow(&mut layer.kept_output_bytes);
            narrow(&mut layer.activation_io_bytes);
            for edge in &mut layer.inputs {
                narrow(&mut edge.bytes);
            }
            for part in &mut layer.parts {
                narrow(&mut part.bytes);
            }
        }
        self.float_bytes = element_bytes;
        self
    }

    /// Total forward + backward FLOPs of one iteration.
    pub fn total_flops(&self) -> f64 {
        self.layers
            .iter()
            .map(|l| (l.fwd_flops + l.bwd_flops) as f64)
            .sum()
    }

    /// Total parameter bytes.
    pub fn param_bytes(&self) -> u64 {
        // Saturating: imported profiles give each layer's size.
        self.layers
            .iter()
            .map(|l| l.param_bytes)
            .fold(0, u64::saturating_add)
    }

    /// Each weight's owner: the first layer that reads it, whose `param_bytes` count it
    /// and whose gradient bucket carries its gradient.
    pub fn weight_owners(&self, graph: &Graph) -> BTreeMap<ValueId, LayerId> {
        weight_readers(graph, &self.aliases, &self.layers)
            .into_iter()
            .filter_map(|(v, ids)| Some((v, LayerId(*ids.first()? as u32))))
            .collect()
    }

    /// The layers that read a layer's output.
    pub fn consumers(&self, id: LayerId) -> Vec<LayerId> {
        (0..self.layers.len() as u32)
            .map(LayerId)
            .filter(|&c| {
                self.layers[c.0 as usize]
                    .inputs
                    .iter()
                    .any(|e| e.from == Producer::Layer(id))
            })
            .collect()
    }
}

/// Builds the layer graph of a verified graph whose shapes are bound; `batch` is the bound
/// global batch.
///
/// # Errors
/// When counting fails (a symbolic shape, an overflow).
pub fn build(
    graph: &Graph,
    info: &GraphInfo,
    batch: u64,
    limits: Limits,
) -> Result<LayerGraph, LayerError> {
    let accounting = account(graph, info)?;
    let rewritten = rewrite::rewrite(graph, info, limits);
    Ok(assemble(graph, info, batch, &accounting, rewritten))
}

fn bytes_of(info: &GraphInfo, v: ValueId) -> u64 {
    let ty = info.ty(v);
    ty.shape
        .known_numel()
        .unwrap_or(0)
        .saturating_mul(ty.dtype.size_bytes())
}

fn kind_of(
    graph: &Graph,
    info: &GraphInfo,
    node: NodeId,
    parameters: &dyn Fn(ValueId) -> bool,
) -> LayerKind {
    let n = graph.node(node);
    match n.op.class() {
        OpClass::Conv => LayerKind::Conv,
        OpClass::Dense => LayerKind::Dense,
        OpClass::Norm if matches!(n.op, Op::LayerNorm { .. }) => LayerKind::LayerNorm,
        OpClass::Norm => LayerKind::Norm,
        OpClass::Pool => LayerKind::Pool,
        OpClass::Softmax => LayerKind::Softmax,
        OpClass::Elementwise => LayerKind::Elementwise,
        OpClass::Reduce if reduces_rows_apart(info, n) => LayerKind::LayerNorm,
        OpClass::Reduce => LayerKind::Reduce,
        OpClass::Recurrent => LayerKind::Recurrent,
        OpClass::Shape | OpClass::Source => {
            let table = n.inputs.first().copied().flatten();
            if matches!(n.op, Op::Gather { .. })
                && table.is_some_and(|t| parameters(t) && info.ty(t).shape.rank() == 2)
            {
                LayerKind::Embedding
            } else {
                LayerKind::DataMovement
            }
        }
    }
}

/// The members of a mixture-of-experts unit that work over every expert (computed from a
/// weight stacked by expert, `[E, …]`, up to the sum over experts), with the router's `k`
/// and `E`; `None` where the unit has no `TopK` of known size. `derived` says which values
/// are weights or computed from them alone.
fn routed_members(
    graph: &Graph,
    info: &GraphInfo,
    derived: &[bool],
    members: &[NodeId],
) -> Option<(BTreeSet<NodeId>, u64, u64)> {
    let sizes = |v: ValueId| info.ty(v).shape.as_sizes();
    let (node, axis) = members.iter().find_map(|&m| match graph.node(m).op {
        Op::TopK { axis, .. } => Some((graph.node(m), axis)),
        _ => None,
    })?;
    let scores = sizes(node.inputs.first().copied().flatten()?)?;
    let picked = sizes(*node.outputs.first()?)?;
    let at = usize::try_from(if axis < 0 {
        axis + scores.len() as i64
    } else {
        axis
    })
    .ok()?;
    let (e, k) = (*scores.get(at)?, *picked.get(at)?);
    // Values computed over every expert, in the members' order; a sum over them ends it.
    let mut over_experts: BTreeSet<ValueId> = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for &m in members {
        let n = graph.node(m);
        let stacked = |v: ValueId| {
            over_experts.contains(&v)
                || (derived[v.index()] && sizes(v).is_some_and(|d| d.len() == 3 && d[0] == e))
        };
        if n.inputs.iter().flatten().any(|&v| stacked(v)) {
            nodes.insert(m);
            let sums = matches!(
                n.op,
                Op::Reduce {
                    kind: ralpc_ir::ReduceKind::Sum,
                    ..
                } | Op::Variadic(ralpc_ir::Variadic::Sum)
            );
            if !sums {
                over_experts.extend(n.outputs.iter().copied());
            }
        }
    }
    Some((nodes, k, e))
}

/// Whether reduction `n` reduces the last axis of a tensor of rows alone (`[b, s, h]` to
/// `[b, s, 1]` or `[b, s]`): each row apart, as a LayerNorm computes its statistics.
fn reduces_rows_apart(info: &GraphInfo, n: &ralpc_ir::Node) -> bool {
    let sizes = |v: ValueId| info.ty(v).shape.as_sizes();
    let (Some(x), Some(y)) = (
        n.inputs.first().copied().flatten().and_then(sizes),
        n.outputs.first().copied().and_then(sizes),
    ) else {
        return false;
    };
    let Some((&features, rows)) = x.split_last() else {
        return false;
    };
    x.len() >= 3 && features > 1 && (y == rows || (y.split_last() == Some((&1, rows))))
}

fn assemble(
    graph: &Graph,
    info: &GraphInfo,
    batch: u64,
    accounting: &ralpc_ir::Accounting,
    rewritten: Rewritten,
) -> LayerGraph {
    let stats: BTreeMap<NodeId, &ralpc_ir::LayerStats> =
        accounting.layers.iter().map(|l| (l.node, l)).collect();
    let facts = rewritten.facts.clone();
    let parameters = |v: ValueId| facts.parameter[v.index()];
    // Weight-only units join the first layer that reads them.
    let mut producer_unit: BTreeMap<ValueId, usize> = BTreeMap::new();
    for (i, u) in rewritten.units.iter().enumerate() {
        for &v in &u.outputs {
            producer_unit.insert(v, i);
        }
    }
    let mut layer_of_unit: Vec<Option<LayerId>> = vec![None; rewritten.units.len()];
    let mut layers: Vec<Layer> = Vec::new();
    let mut claimed = vec![false; rewritten.units.len()];
    // Layer outputs their producer keeps to its backward pass (its own backward reads them).
    let mut kept_by_producer = vec![false; graph.value_count()];
    // Per value another layer's backward reads, the first reader that keeps it.
    let mut kept_by_reader: Vec<Option<LayerId>> = vec![None; graph.value_count()];
    for (i, unit) in rewritten.units.iter().enumerate() {
        if unit.weight_only {
            continue;
        }
        let id = LayerId(layers.len() as u32);
        layer_of_unit[i] = Some(id);
        // Gather the weight-only units behind this unit's inputs (not yet claimed).
        let mut prologue: Vec<NodeId> = Vec::new();
        let mut stack: Vec<ValueId> = unit.inputs.clone();
        while let Some(v) = stack.pop() {
            if let Some(&p) = producer_unit.get(&v) {
                let u = &rewritten.units[p];
                if u.weight_only && !std::mem::replace(&mut claimed[p], true) {
                    prologue.extend(u.members.iter().copied());
                    stack.extend(u.inputs.iter().copied());
                }
            }
        }
        prologue.sort_by_key(|n| info.order().iter().position(|m| m == n));
        let members: Vec<NodeId> = prologue
            .iter()
            .chain(unit.members.iter())
            .copied()
            .collect();
        let attention = unit.op == crate::rewrite::ATTENTION;
        // An attention core is named after its softmax, a mixture of experts after its
        // router's top k.
        let routed = unit.op == crate::rewrite::EXPERTS;
        let named = match attention || routed {
            true => unit
                .members
                .iter()
                .copied()
                .find(|&m| graph.node(m).op.name() == if routed { "TopK" } else { "Softmax" })
                .unwrap_or(unit.members[0]),
            false => unit.members[0],
        };
        let mut layer = Layer {
            name: graph.provenance(named).name.clone(),
            module: graph.provenance(named).module.clone(),
            op: unit.op.clone(),
            kind: match attention {
                true => LayerKind::Attention,
                false if routed => LayerKind::Experts,
                false => kind_of(graph, info, unit.members[0], &parameters),
            },
            parts: Vec::new(),
            params: 0,
            param_bytes: 0,
            fwd_flops: 0,
            bwd_flops: 0,
            activation_io_bytes: 0,
            output_bytes: unit.outputs.iter().map(|&v| bytes_of(info, v)).sum(),
            stash_bytes: 0,
            inner_stash_bytes: 0,
            kept_output_bytes: 0,
            softmax_rows_bytes: 0,
            scores_stash_bytes: 0,
            inputs: Vec::new(),
            measured: None,
            halo: None,
            recurrence: None,
            grouped: members
                .iter()
                .any(|&m| matches!(&graph.node(m).op, Op::Conv(c) if c.group != 1)),
        };
        let inside: Vec<ValueId> = members
            .iter()
            .flat_map(|&m| graph.node(m).outputs.clone())
            .collect();
        // A mixture of experts computes, for each token, the `k` experts it is sent to:
        // the share `k/E` of what its ops written over every expert do.
        let routed = (unit.op == crate::rewrite::EXPERTS)
            .then(|| routed_members(graph, info, &facts.derived, &members))
            .flatten();
        let share = |m: NodeId, x: u64| match &routed {
            Some((over_experts, k, e)) if over_experts.contains(&m) => {
                (u128::from(x) * u128::from(*k) / u128::from((*e).max(1))) as u64
            }
            _ => x,
        };
        let mut mac_flops = 0u64;
        let mut other_flops = 0u64;
        // Kept values made inside, (elements, bytes), and the softmaxes' sizes: what a
        // fused attention kernel would not keep.
        let mut kept_inside: Vec<(u64, u64)> = Vec::new();
        let mut softmaxes: Vec<u64> = Vec::new();
        let numel = |v: ValueId| info.ty(v).shape.known_numel().unwrap_or(0);
        for &m in &members {
            let node = graph.node(m);
            let op_facts = node.op.facts();
            let s = stats.get(&m);
            let macs2 = share(m, s.map_or(0, |s| s.macs.saturating_mul(2)));
            let flops = share(m, s.map_or(0, |s| s.flops));
            mac_flops = mac_flops.saturating_add(macs2);
            other_flops = other_flops.saturating_add(flops);
            let part_bytes = node
                .inputs
                .iter()
                .flatten()
                .chain(node.outputs.iter())
                .filter(|v| !facts.folded[v.index()])
                .map(|&v| bytes_of(info, v))
                .sum();
            let part_bytes = share(m, part_bytes);
            layer.parts.push(Part {
                node: m,
                op: node.op.name(),
                signature: crate::profile::Signature::of(graph, info, m),
                fwd_flops: macs2.saturating_add(flops),
                bytes: part_bytes,
                launches: op_facts.elements != Elements::Alias
                    && !facts.derived[node.outputs[0].index()],
                weight_product: matches!(op_facts.work, Work::Product(p) if p.makes_weight_gradient()),
                steps: match &node.op {
                    Op::Recurrent(r) => 2 * time_and_batch(graph, info, m, r).map_or(1, |(t, _)| t),
                    _ => 1,
                },
            });
            // Values made inside the unit are kept when an op's backward pass reads them
            // (fused chains keep those of their intermediate results), its outputs too,
            // to its backward pass; the others go once the readers in other layers have
            // them (which keep them when their backward reads them).
            for &v in &node.outputs {
                if facts.uses[v.index()] == 0 || facts.derived[v.index()] {
                    continue;
                }
                if unit.outputs.contains(&v) {
                    if read_for_backward(graph, &members, v) {
                        layer.kept_output_bytes += bytes_of(info, v);
                        kept_by_producer[v.index()] = true;
                    }
                } else if read_for_backward(graph, &members, v) {
                    let bytes = share(m, bytes_of(info, v));
                    layer.stash_bytes += bytes;
                    layer.inner_stash_bytes += bytes;
                    kept_inside.push((numel(v), bytes));
                }
            }
            if let Some(&y) = node.outputs.first() {
                if node.op.name() == "Softmax" {
                    let rows = info.ty(y).shape.as_sizes().and_then(|d| {
                        let last = *d.last()?;
                        Some(d.iter().product::<u64>() / last.max(1))
                    });
                    layer.softmax_rows_bytes += 4 * rows.unwrap_or(0);
                    softmaxes.push(numel(y));
                }
                let saved = match node.op.forward_saves() {
                    ForwardSaves::Nothing => 0,
                    ForwardSaves::IndexPerOutput => {
                        8 * bytes_of(info, y) / info.ty(y).dtype.size_bytes().max(1)
                    }
                    ForwardSaves::CopyOfOutput => bytes_of(info, y),
                };
                let saved = share(m, saved);
                layer.stash_bytes += saved;
                layer.inner_stash_bytes += saved;
                kept_inside.push((numel(y), saved));
            }
        }
        layer.scores_stash_bytes = kept_inside
            .iter()
            .filter(|&&(n, _)| n > 0 && softmaxes.contains(&n))
            .map(|&(_, bytes)| bytes)
            .sum();
        layer.fwd_flops = mac_flops.saturating_add(other_flops);
        layer.bwd_flops = mac_flops.saturating_mul(2).saturating_add(other_flops);
        let mut seen = Vec::new();
        for &v in &unit.inputs {
            if facts.derived[v.index()] || inside.contains(&v) || seen.contains(&v) {
                continue;
            }
            seen.push(v);
            let bytes = bytes_of(info, v);
            layer.activation_io_bytes += bytes;
            let from = match producer_unit.get(&v).and_then(|&p| layer_of_unit[p]) {
                Some(l) => Producer::Layer(l),
                None => Producer::Input(graph.value(v).name.clone()),
            };
            // An input its backward reads is kept to it: a graph input cut into the
            // layer's share, another layer's output that layer does not keep itself (the
            // same elements on its rank, a received copy on another).
            let epilogue = layer.kind == LayerKind::Dense
                && info.ty(v).shape.rank() >= 3
                && read_after_product(graph, &members, &rewritten.aliases, v);
            let mut stash_kept_by = None;
            let mut stashed = false;
            if !kept_by_producer[v.index()] && read_for_backward(graph, &members, v) {
                match kept_by_reader[v.index()] {
                    Some(reader) => stash_kept_by = Some(reader),
                    None => {
                        stashed = true;
                        layer.stash_bytes += bytes;
                        // Kept at the share the layer's output holds.
                        if epilogue {
                            layer.inner_stash_bytes += bytes;
                        }
                        kept_by_reader[v.index()] = Some(id);
                    }
                }
            }
            layer.inputs.push(Edge {
                from,
                value: Some(v),
                bytes,
                stash_kept_by,
                stashed,
                epilogue,
            });
        }
        layer.activation_io_bytes += layer.output_bytes;
        if matches!(layer.kind, LayerKind::Conv | LayerKind::Pool) {
            layer.halo = halo(graph, info, &members, &layer.inputs, &facts);
        }
        if let [only] = members[..] {
            layer.recurrence = recurrence(graph, info, only);
        }
        layers.push(layer);
    }
    let outputs = graph
        .outputs()
        .iter()
        .filter_map(|v| {
            let v = rewritten.aliases.get(v).unwrap_or(v);
            producer_unit.get(v).and_then(|&p| layer_of_unit[p])
        })
        .collect();
    let tied = own_weights(graph, info, &rewritten.aliases, &mut layers);
    LayerGraph {
        batch,
        layers,
        outputs,
        rewrite: Some(rewritten.report),
        aliases: rewritten.aliases,
        tied,
        float_bytes: float_bytes(graph, info),
        fixed_batch: None,
    }
}

/// The halo of a layer made of `members` reading `inputs`: its one convolution or pooling
/// and the inputs that reach it through ops that keep its input's shape. `None` when the
/// layer has another shape between them, several windows, or no window at all.
fn halo(
    graph: &Graph,
    info: &GraphInfo,
    members: &[NodeId],
    inputs: &[Edge],
    facts: &rewrite::Facts,
) -> Option<Halo> {
    let mut windows = members
        .iter()
        .copied()
        .filter(|&m| matches!(graph.node(m).op, Op::Conv(_) | Op::Pool(_)));
    let node = windows.next()?;
    if windows.next().is_some() {
        return None;
    }
    let window = Window::of(graph, info, node)?;
    let x = graph.node(node).inputs.first().copied().flatten()?;
    let shape = &info.ty(x).shape;
    let from_outside = |v: ValueId| inputs.iter().any(|e| e.value == Some(v));
    let constant = |v: ValueId| {
        facts.parameter[v.index()] || facts.derived[v.index()] || facts.folded[v.index()]
    };
    let mut reads = Vec::new();
    let mut stack = vec![x];
    while let Some(v) = stack.pop() {
        if from_outside(v) {
            if !reads.contains(&v) {
                reads.push(v);
            }
            continue;
        }
        let m = members
            .iter()
            .copied()
            .find(|&m| graph.node(m).outputs.contains(&v))?;
        for u in graph.node(m).inputs.iter().flatten().copied() {
            if &info.ty(u).shape == shape {
                stack.push(u);
            } else if !constant(u) {
                return None;
            }
        }
    }
    reads.sort_unstable();
    Some(Halo {
        window,
        node,
        inputs: reads,
    })
}

/// The time loop of `node`, when it is a recurrent op whose shapes are known.
fn recurrence(graph: &Graph, info: &GraphInfo, node: NodeId) -> Option<Recurrence> {
    let Op::Recurrent(r) = &graph.node(node).op else {
        return None;
    };
    let (seq, batch) = time_and_batch(graph, info, node, r)?;
    let element = graph.node(node).inputs.first().copied().flatten();
    let element = element.map_or(4, |x| info.ty(x).dtype.size_bytes());
    let reset_first = matches!(
        r.cell,
        ralpc_ir::Cell::Gru {
            linear_before_reset: false
        }
    );
    Some(Recurrence {
        steps: seq.saturating_mul(r.direction.count()),
        hidden: r.hidden,
        state_bytes: batch.saturating_mul(r.hidden).saturating_mul(element),
        exchanges: 1 + u64::from(reset_first),
    })
}

/// Time steps and samples of recurrent op `node`'s input X (`[seq, batch, input]`, or
/// batch first with `layout = 1`), when its shape is known.
fn time_and_batch(
    graph: &Graph,
    info: &GraphInfo,
    node: NodeId,
    r: &Recurrent,
) -> Option<(u64, u64)> {
    let x = graph.node(node).inputs.first().copied().flatten()?;
    match (r.batch_major, &info.ty(x).shape.as_sizes()?[..]) {
        (false, &[seq, batch, _]) | (true, &[batch, seq, _]) => Some((seq, batch)),
        _ => None,
    }
}

/// Whether the backward pass of a node of `members` reads `v`'s elements, as an input or
/// as its output ([`Op::backward_reads`]: the runtime releases the others after the
/// forward pass).
/// Whether only `members` after the first matrix product read `v` (directly or through
/// an alias): an input of the product's epilogue, not of the product.
fn read_after_product(
    graph: &Graph,
    members: &[NodeId],
    aliases: &BTreeMap<ValueId, ValueId>,
    v: ValueId,
) -> bool {
    let Some(main) = members
        .iter()
        .position(|&m| matches!(graph.node(m).op, Op::MatMul | Op::Gemm(_)))
    else {
        return false;
    };
    let reads = |m: NodeId| {
        graph
            .node(m)
            .inputs
            .iter()
            .flatten()
            .any(|&x| carrier(aliases, x) == carrier(aliases, v))
    };
    let readers: Vec<usize> = (0..members.len()).filter(|&i| reads(members[i])).collect();
    !readers.is_empty() && readers.iter().all(|&i| i > main)
}

fn read_for_backward(graph: &Graph, members: &[NodeId], v: ValueId) -> bool {
    members
        .iter()
        .any(|&m| graph.node(m).read_by_backward().any(|x| x == v))
}

/// The element size of most of the graph's floating-point values (4 when it has none).
fn float_bytes(graph: &Graph, info: &GraphInfo) -> u64 {
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for v in graph.value_ids() {
        let dtype = info.ty(v).dtype;
        if dtype.is_float() {
            *count.entry(dtype.size_bytes()).or_default() += 1;
        }
    }
    count
        .into_iter()
        .max_by_key(|&(bytes, n)| (n, bytes))
        .map_or(4, |(bytes, _)| bytes)
}

/// Credits every weight to the first layer (in layer order) that reads it, through
/// aliases, and returns the weights several layers read. The runtime keeps a weight's
/// gradient in its owner's bucket by the same rule ([`LayerGraph::weight_owners`]), so
/// the plan all-reduces exactly the gradients the layers compute. (The node accounting
/// credits a weight to the first node reading it, which may sit in no layer: an exporter's
/// dead first step of a recurrent loop, kept only for its shape.)
fn own_weights(
    graph: &Graph,
    info: &GraphInfo,
    aliases: &BTreeMap<ValueId, ValueId>,
    layers: &mut [Layer],
) -> Vec<TiedWeight> {
    let readers = weight_readers(graph, aliases, layers);
    let mut tied = Vec::new();
    for (v, ids) in readers {
        let Some(&owner) = ids.first() else { continue };
        let bytes = bytes_of(info, v);
        layers[owner].params += info.ty(v).shape.known_numel().unwrap_or(0);
        layers[owner].param_bytes += bytes;
        if ids.len() < 2 {
            continue;
        }
        tied.push(TiedWeight {
            name: graph.value(v).name.clone(),
            value: Some(v),
            bytes,
            layers: ids.into_iter().map(|l| LayerId(l as u32)).collect(),
        });
    }
    tied
}

/// Per weight (after aliases), the layers whose ops read it, ascending.
fn weight_readers(
    graph: &Graph,
    aliases: &BTreeMap<ValueId, ValueId>,
    layers: &[Layer],
) -> BTreeMap<ValueId, Vec<usize>> {
    let mut readers: BTreeMap<ValueId, Vec<usize>> = BTreeMap::new();
    for (l, layer) in layers.iter().enumerate() {
        for part in &layer.parts {
            for &v in graph.node(part.node).inputs.iter().flatten() {
                let v = carrier(aliases, v);
                if ralpc_ir::is_parameter(graph, v) {
                    let ids = readers.entry(v).or_default();
                    if !ids.contains(&l) {
                        ids.push(l);
                    }
                }
            }
        }
    }
    readers
}

/// The value that carries `v` after rewriting (`v` itself when it was not rewritten).
pub fn carrier(aliases: &BTreeMap<ValueId, ValueId>, mut v: ValueId) -> ValueId {
    for _ in 0..64 {
        match aliases.get(&v) {
            Some(&next) if next != v => v = next,
            _ => break,
        }
    }
    v
}
