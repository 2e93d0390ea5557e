//! The CPU executor of `ralpc-plan/1`: every rank a thread, running its program in order
//! with real tensors — each forward and backward on its share of the layer, each message
//! and collective carrying the data the plan says it carries.
//!
//! What an instruction moves follows from the plan and the model alone:
//! * a layer on `s×a×p` ranks holds and needs the pieces of its tensors that the planner's
//!   [`View`]s name (samples, rows, features; piece `i` of `n` covers indices
//!   `⌊i·N/n⌋..⌊(i+1)·N/n⌋`), on the tensor axes [`Axes`] maps them to;
//! * a message's tag names its edge, microbatch and direction (the lowering's numbering),
//!   and it carries the intersection of what the receiver needs and the sender holds;
//! * a collective's buffers (the plan's `buffers`) name what it reduces or reshards.
//!
//! A weight several layers read (a tied embedding, initializers an exporter merged) is one
//! tensor: its uses add into one gradient and one update applies it — in the first
//! layer's bucket when every use holds the same piece, else after the plan's own
//! all-reduce of it over every holder (each keeping it whole).
//!
//! Activation recomputation is in [`recompute`], ZeRO's sharded gradients and steps in [`zero`].
//! A value computed from constants alone that a layer reads but no layer computes (an
//! anchor grid too large to fold) is computed by every rank reading it ([`derived`]).
//!
//! Gradients of a tensor read by several ranks with the same share are identical copies
//! after the plan's input-gradient sums, so a producer pastes the pieces it gets back and
//! checks that they cover what it holds. Anything the plan does not deliver is an error
//! naming the rank, the instruction and the tensor — never a silent zero.
//!
//! A convolution or pooling split by rows computes each piece from its rows and the halo
//! around them, exchanged as the plan's halo messages say ([`halo`]).
//!
//! Not executable yet (refused with a clear error): row-parallel dense layers with a fused
//! epilogue other than adds (of a bias, or of a residual each rank adds its feature slice
//! of); a loss over logits split by classes; the asynchronous (PipeDream) schedule. A
//! tensor held whole by replicas (a row-parallel layer's output, a LayerNorm held by a
//! tensor-parallel group) whose consumer reads a part of it fails in backward naming the
//! gradient the other replicas lack: the plan does not all-gather it yet. Batch
//! normalization uses each rank's local batch (and rows), as PyTorch's DDP does without
//! SyncBatchNorm.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ralpc_codegen::plan::{BufferKind, Instruction, Plan};
use ralpc_codegen::tag::{Tag, Tags};
use ralpc_ir::{Binary, Graph, GraphInfo, NodeId, Op, Scalar, ValueId};
use ralpc_passes::layers::{LayerGraph, LayerKind, Producer, Split};
use ralpc_passes::plan::{first_replica, gathers, scatters_gradient, Schedule, View};

use super::comm::{AbortOnPanic, Comm, World};
use super::graph::{self, Grads, Record, Values, Weights};
use super::kernels;
use super::ops::{Env, Mode};
pub use super::region::Axes;
use super::region::{
    crop, dims, fill, intersect, interval, place, place_into, reframe, share, volume, Region, Slice,
};
use super::tensor::{Data, Tensor};
use super::train::{Dataset, TrainOptions, TrainReport};

mod derived;
mod epilogue;
mod halo;
mod heads;
mod layout;
mod loss;
mod recompute;
mod vocabulary;
mod zero;

use layout::BatchAxis;

/// Why a plan could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The plan cannot run on this model with this backend.
    #[error("{0}")]
    Setup(String),
    /// A rank failed.
    #[error("rank {rank}, instruction {index} ({op}): {message}")]
    Rank {
        /// The rank.
        rank: u32,
        /// The instruction's index in its program.
        index: usize,
        /// The instruction's `op`.
        op: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// A fault injected into one rank, to test that the others stop (`ralpc run --fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The failing rank.
    pub rank: u32,
    /// The instruction (index into its program, first iteration) where it fails.
    pub instruction: usize,
    /// How it fails.
    pub kind: FaultKind,
}

/// How an injected fault fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The rank panics.
    Panic,
    /// The rank stops responding: it waits for something that never comes.
    Hang,
    /// The rank is gone without a word (a killed process).
    Exit,
}

/// The training state between two steps: every weight and its momentum, whole, by name,
/// and the losses so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    /// Steps done.
    pub step: u32,
    /// Loss of each step done.
    pub losses: Vec<f64>,
    /// Weights.
    pub weights: BTreeMap<String, Vec<f32>>,
    /// SGD momentum buffers (absent for weights not yet updated).
    pub velocity: BTreeMap<String, Vec<f32>>,
}

/// Where checkpoints go: writes one, or says why it could not.
pub type CheckpointSink<'a> = dyn Fn(&Checkpoint) -> Result<(), String> + Sync + 'a;

/// How a run is driven beyond the training options.
pub struct Control<'c> {
    /// How long a rank waits for another before every rank gives up.
    pub timeout: Duration,
    /// A fault to inject.
    pub fault: Option<Fault>,
    /// Hand the state to `on_checkpoint` after every this many steps.
    pub checkpoint_every: Option<u32>,
    /// Receives each checkpoint (writes it); an error stops the run.
    pub on_checkpoint: Option<&'c CheckpointSink<'c>>,
    /// Start from this state instead of the model's weights.
    pub resume: Option<&'c Checkpoint>,
}

impl Control<'_> {
    /// Just a timeout.
    pub fn timeout(timeout: Duration) -> Control<'static> {
        Control {
            timeout,
            fault: None,
            checkpoint_every: None,
            on_checkpoint: None,
            resume: None,
        }
    }
}

/// One rank's state at a checkpoint.
struct RankState {
    losses: Vec<f64>,
    weights: Vec<(ValueId, Slice, Vec<f32>)>,
    velocity: Vec<(ValueId, Slice, Vec<f32>)>,
}

/// Collects every rank's state at a checkpoint; the last to report hands it on.
struct Collector<'c> {
    ranks: usize,
    pending: Mutex<BTreeMap<u32, Vec<RankState>>>,
    on_checkpoint: &'c CheckpointSink<'c>,
}

/// Where a rank's layers compute. The plan's interpretation — shares, messages,
/// collectives, schedule — is the same whatever computes.
pub trait Compute {
    /// Runs `nodes` forward, as [`graph::forward`].
    ///
    /// # Errors
    /// As [`graph::forward`].
    fn forward(
        &self,
        graph: &Graph,
        nodes: &[NodeId],
        values: &mut Values,
        env: Env,
    ) -> Result<Vec<Record>, graph::ExecError>;
    /// Runs `records` backward, as [`graph::backward`].
    ///
    /// # Errors
    /// As [`graph::backward`].
    fn backward(
        &self,
        graph: &Graph,
        records: &[Record],
        values: &Values,
        grads: &mut Grads,
    ) -> Result<(), graph::ExecError>;
}

/// The CPU backend's own kernels.
pub struct OnCpu;

impl Compute for OnCpu {
    fn forward(
        &self,
        graph: &Graph,
        nodes: &[NodeId],
        values: &mut Values,
        env: Env,
    ) -> Result<Vec<Record>, graph::ExecError> {
        graph::forward(graph, nodes, values, env)
    }
    fn backward(
        &self,
        graph: &Graph,
        records: &[Record],
        values: &Values,
        grads: &mut Grads,
    ) -> Result<(), graph::ExecError> {
        graph::backward(graph, records, values, grads)
    }
}

/// Makes rank `r`'s [`Compute`] (in the rank's own thread: a GPU context per rank).
pub type ComputeFactory<'a> = dyn Fn(u32) -> Result<Box<dyn Compute>, String> + Sync + 'a;

/// Everything a run reads.
pub struct Executable<'a> {
    /// The plan.
    pub plan: &'a Plan,
    /// The model, bound at the plan's global batch.
    pub graph: &'a Graph,
    /// Its verification at that batch.
    pub info: &'a GraphInfo,
    /// Its layers, as the planner built them.
    pub layers: &'a LayerGraph,
    /// Its weights for the whole model (read or seeded).
    pub weights: &'a Weights,
    /// The global batch's inputs and labels.
    pub data: &'a Dataset,
    /// The model verified at another batch size (what a rank's share of a microbatch
    /// sees): folded shape arithmetic that depends on the batch is read from it.
    pub info_at: &'a (dyn Fn(u64) -> Result<GraphInfo, String> + Sync),
    /// Where the ranks compute: the CPU when absent.
    pub compute: Option<&'a ComputeFactory<'a>>,
}

/// What an injected `Exit` or `Hang` fault reports for its own rank (which, in a real
/// failure, reports nothing: the other ranks' errors name it).
pub const KILLED: &str = "stopped by an injected fault";

/// A piece of a gradient: the region and its values.
type GradPiece = (Region, Vec<f32>);

/// A buffer an instruction touches: its kind, layer, microbatch, and whether it writes it.
type Touch = (BufferKind, Option<u32>, Option<u32>, bool);

struct EdgeInfo {
    producer: usize,
    consumer: usize,
    value: ValueId,
    /// Its gradient returns as a reduce-scatter (the lowering's `Gather { scatter }`).
    scattered: bool,
    /// Its consumer is split by rows and reads the rows around each piece ([`halo`]).
    halo: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Edge(usize),
    GraphInput,
    Constant,
    Folded,
    /// Computed from constants by every rank that reads it ([`derived`]).
    Derived,
}

struct LayerExec {
    name: String,
    kind: LayerKind,
    split: Split,
    first: u32,
    nodes: Vec<NodeId>,
    /// Every value its nodes read from outside, with where it comes from.
    inputs: Vec<(ValueId, Source)>,
    /// The values it writes that other layers or the loss read.
    outputs: Vec<ValueId>,
    /// Its conv, Gemm or MatMul node, if any.
    main: Option<NodeId>,
    /// Its trainable weights.
    weights: Vec<ValueId>,
    /// Split by heads: the shape constants its nodes read, made local.
    local: heads::LocalShapes,
    /// The weights whose gradients its bucket all-reduces: those it reads first, but for
    /// tied weights the plan all-reduces on their own.
    owned: Vec<ValueId>,
    /// Split by rows: the halo its window reads ([`halo`]).
    halo: Option<halo::LayerHalo>,
}

impl LayerExec {
    fn view_out(&self) -> View {
        View::output(self.kind, self.split, self.first)
    }

    fn view_in(&self) -> View {
        View::input(self.kind, self.split, self.first)
    }

    fn holds(&self, rank: u32) -> Option<u32> {
        (rank >= self.first && rank < self.first + self.split.degree()).then(|| rank - self.first)
    }

    /// Whether rank index `k` holds the first slice of what the layer's ranks sum (a
    /// row-parallel layer's input features, an embedding's vocabulary): the one that adds
    /// the biases.
    fn first_slice(&self, k: u32) -> bool {
        match self.kind {
            LayerKind::Embedding => self.vocabulary_piece(k).0 == 0,
            _ => self.view_in().pieces(k)[2].0 == 0,
        }
    }

    /// The piece of the vocabulary rank index `k` of a vocabulary-parallel embedding
    /// looks up: its attribute index.
    fn vocabulary_piece(&self, k: u32) -> (u32, u32) {
        let (a, p) = (self.split.attribute.max(1), self.split.parameter.max(1));
        ((k / p) % a, a)
    }
}

/// What every rank shares.
struct Prepared<'a> {
    exe: &'a Executable<'a>,
    edges: Vec<EdgeInfo>,
    layers: Vec<LayerExec>,
    /// The layer writing the model's first output, and that value.
    output: (usize, ValueId),
    microbatch: usize,
    channels_first: BTreeSet<ValueId>,
    /// Feature axes found by following an output-feature split through the ops after its
    /// product ([`Prepared::split_epilogues`]).
    feature_axes: BTreeMap<ValueId, usize>,
    /// Tied weights with their own all-reduce: every holder keeps a whole copy, cuts what
    /// each layer holds from it, and adds each layer's gradient at its place.
    tied: BTreeSet<ValueId>,
    infos: Mutex<BTreeMap<u64, std::sync::Arc<GraphInfo>>>,
    /// Per value, its batch axis and entries per sample ([`Prepared::batch_axis`]).
    batch_axes: Mutex<BTreeMap<ValueId, Option<BatchAxis>>>,
    env: Env,
    /// Per layer, the recomputed run holding it (first and last layer).
    recompute: Vec<Option<(usize, usize)>>,
    /// Fused tensors distributed by groups along their feature axis (a QKV projection's
    /// output read by attention split by heads: each rank holds its piece of each group).
    groups: BTreeMap<ValueId, usize>,
}

fn setup(message: impl Into<String>) -> RunError {
    RunError::Setup(message.into())
}

/// Follows `aliases` to the value that carries `v`.
fn carrier(layers: &LayerGraph, mut v: ValueId) -> ValueId {
    let mut guard = 0;
    while let Some(&next) = layers.aliases.get(&v) {
        if next == v || guard > 64 {
            break;
        }
        v = next;
        guard += 1;
    }
    v
}

impl<'a> Prepared<'a> {
    fn new(exe: &'a Executable<'a>) -> Result<Prepared<'a>, RunError> {
        let plan = exe.plan;
        let lg = exe.layers;
        let g = exe.graph;
        if plan.layers.len() != lg.layers.len()
            || plan
                .layers
                .iter()
                .zip(&lg.layers)
                .any(|(a, b)| *a != b.name)
        {
            return Err(setup(
                "the plan's layers are not this model's: plan it again for this model",
            ));
        }
        let strategy = plan
            .strategy
            .resolve(lg)
            .map_err(|e| setup(format!("the plan's strategy: {e}")))?;
        if strategy.schedule == Schedule::Async {
            return Err(setup(
                "the asynchronous (PipeDream) schedule is not executable on the CPU backend: \
                 its weight versions change the numerics by design; plan with --schedule 1f1b",
            ));
        }
        let m = plan.microbatches.max(1) as u64;
        if plan.batch % m != 0 {
            return Err(setup(format!(
                "the batch {} does not divide into {m} microbatches",
                plan.batch
            )));
        }
        let stage_of = strategy.stage_of_layers();
        let place = |l: usize| (strategy.layers[l], strategy.stages[stage_of[l]].first_rank);
        // Edges in the lowering's order: by consumer, then its inputs from layers.
        let mut edges = Vec::new();
        for (c, layer) in lg.layers.iter().enumerate() {
            for e in &layer.inputs {
                let Producer::Layer(p) = e.from else { continue };
                let p = p.0 as usize;
                let value = e.value.ok_or_else(|| {
                    setup(format!("layer {} has an edge without a tensor", layer.name))
                })?;
                let kind = |l: usize| lg.layers[l].kind;
                let scattered = stage_of[p] == stage_of[c]
                    && gathers(kind(p), place(p), kind(c), place(c))
                        .is_some_and(|ranks| scatters_gradient(&ranks, kind(c), place(c)));
                edges.push(EdgeInfo {
                    producer: p,
                    consumer: c,
                    value: carrier(lg, value),
                    scattered,
                    halo: false,
                });
            }
        }
        let mut produced_by: BTreeMap<NodeId, usize> = BTreeMap::new();
        for (l, layer) in lg.layers.iter().enumerate() {
            for part in &layer.parts {
                produced_by.insert(part.node, l);
            }
        }
        let order = exe.info.positions();
        let graph_output = *g
            .outputs()
            .first()
            .ok_or_else(|| setup("the model has no output"))?;
        let graph_output = carrier(lg, graph_output);
        let mut output = None;
        let mut weight_owner: BTreeMap<ValueId, usize> = BTreeMap::new();
        let tied_all_reduced: BTreeSet<&str> = plan
            .programs
            .iter()
            .flatten()
            .filter_map(|i| match i {
                Instruction::AllReduce {
                    tied: Some(name), ..
                } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        let mut layers = Vec::with_capacity(lg.layers.len());
        for (l, layer) in lg.layers.iter().enumerate() {
            // Generated weights come from the weights, not from the layer's prologue.
            let mut nodes: Vec<NodeId> = layer
                .parts
                .iter()
                .map(|p| p.node)
                .filter(|&n| {
                    !g.node(n)
                        .outputs
                        .iter()
                        .all(|v| exe.weights.trainable.contains(v))
                })
                .collect();
            nodes.sort_by_key(|n| order.get(n).copied().unwrap_or(usize::MAX));
            let inside: BTreeSet<ValueId> = nodes
                .iter()
                .flat_map(|&n| g.node(n).outputs.iter().copied())
                .collect();
            let mut inputs: Vec<(ValueId, Source)> = Vec::new();
            let mut weights = Vec::new();
            let mut owned = Vec::new();
            for &n in &nodes {
                for v in g.node(n).inputs.iter().flatten().copied() {
                    if inside.contains(&v) || inputs.iter().any(|(w, _)| *w == v) {
                        continue;
                    }
                    let c = carrier(lg, v);
                    let producer = g.node(g.value(c).producer);
                    let source = if let Some(e) =
                        edges.iter().position(|e| e.consumer == l && e.value == c)
                    {
                        Source::Edge(e)
                    } else if matches!(producer.op, Op::Constant { .. })
                        || exe.weights.trainable.contains(&c)
                    {
                        if exe.weights.trainable.contains(&c) {
                            // The first layer reading a weight carries its gradient in its
                            // bucket, unless the plan sums it by its own all-reduce.
                            if !weight_owner.contains_key(&c) {
                                weight_owner.insert(c, l);
                                if !tied_all_reduced.contains(g.value(c).name.as_str()) {
                                    owned.push(c);
                                }
                            }
                            weights.push(c);
                        }
                        Source::Constant
                    } else if matches!(producer.op, Op::Input) {
                        Source::GraphInput
                    } else if exe.info.ty(c).content.is_some() {
                        Source::Folded
                    } else if derived::derivable(exe, c) {
                        Source::Derived
                    } else {
                        return Err(setup(format!(
                            "layer {} reads '{}', which no layer, input or constant provides",
                            layer.name,
                            g.value(v).name
                        )));
                    };
                    inputs.push((v, source));
                }
            }
            let mut outputs: Vec<ValueId> = edges
                .iter()
                .filter(|e| e.producer == l)
                .map(|e| e.value)
                .collect();
            if inside.contains(&graph_output) {
                outputs.push(graph_output);
                output = Some((l, graph_output));
            }
            outputs.sort_unstable();
            outputs.dedup();
            let main = nodes.iter().copied().find(|&n| {
                matches!(
                    g.node(n).op,
                    Op::Conv(_) | Op::ConvTranspose(_) | Op::Gemm(_) | Op::MatMul
                )
            });
            layers.push(LayerExec {
                name: layer.name.clone(),
                kind: layer.kind,
                split: strategy.layers[l],
                first: strategy.stages[stage_of[l]].first_rank,
                nodes,
                inputs,
                outputs,
                main,
                weights,
                owned,
                local: heads::LocalShapes::default(),
                halo: None,
            });
        }
        let output = output.ok_or_else(|| setup("no layer computes the model's output"))?;
        // Tensors a convolution or pooling touches are channels-first.
        let mut channels_first = BTreeSet::new();
        for id in g.node_ids() {
            let n = g.node(id);
            if matches!(
                n.op,
                Op::Conv(_)
                    | Op::ConvTranspose(_)
                    | Op::Pool(_)
                    | Op::GlobalPool(_)
                    | Op::BatchNorm { .. }
            ) {
                channels_first.extend(n.inputs.iter().flatten().map(|&v| carrier(lg, v)));
                channels_first.extend(n.outputs.iter().map(|&v| carrier(lg, v)));
            }
        }
        let tied = weight_owner
            .keys()
            .copied()
            .filter(|&w| tied_all_reduced.contains(g.value(w).name.as_str()))
            .collect();
        let mut prepared = Prepared {
            exe,
            microbatch: (plan.batch / m) as usize,
            edges,
            layers,
            output,
            channels_first,
            feature_axes: BTreeMap::new(),
            tied,
            infos: Mutex::default(),
            batch_axes: Mutex::default(),
            env: Env {
                mode: Mode::Training,
                exported_batch: g.rebatch().map(|r| r.exported),
            },
            recompute: (0..lg.layers.len())
                .map(|l| strategy.recompute_run(l))
                .collect(),
            groups: BTreeMap::new(),
        };
        prepared.split_heads()?;
        prepared.split_epilogues();
        prepared.plan_halos()?;
        prepared.check()?;
        Ok(prepared)
    }

    /// Refuses what this executor cannot run exactly.
    fn check(&self) -> Result<(), RunError> {
        let g = self.exe.graph;
        for l in &self.layers {
            let Split {
                attribute: a,
                parameter: p,
                ..
            } = l.split;
            match l.kind {
                LayerKind::Conv if p > 1 => {
                    if let Some(Op::Conv(c)) = l.main.map(|n| &g.node(n).op) {
                        if c.group != 1 {
                            return Err(setup(format!(
                                "layer {}: a grouped convolution split by channels is not executable yet",
                                l.name
                            )));
                        }
                    }
                }
                LayerKind::Embedding if a > 1 => {
                    // Its pieces' lookups are summed: it may only look up and add.
                    let linear = l.nodes.iter().all(|&n| {
                        matches!(g.node(n).op, Op::Gather { .. } | Op::Binary(Binary::Add))
                    });
                    if !linear || self.vocabulary_lookup(l).is_none() {
                        return Err(setup(format!(
                            "layer {}: a vocabulary-parallel embedding sums its pieces' \
                             lookups, so it may only look up tables and add them",
                            l.name
                        )));
                    }
                }
                LayerKind::Dense if a > 1 => {
                    let main = l
                        .main
                        .ok_or_else(|| setup(format!("layer {} has no matrix product", l.name)))?;
                    if let Some(n) = self.partial_sum_breaker(l, main) {
                        return Err(setup(format!(
                            "layer {}: a row-parallel split reduces partial sums after the \
                             layer, so only adds may follow its product (of a bias, or of an \
                             input each rank adds its feature slice of), but {} follows it",
                            l.name,
                            g.site(n)
                        )));
                    }
                }
                _ => {}
            }
            if (a > 1 || p > 1)
                && l.nodes.iter().any(|&n| {
                    // Weights computed by prologue ops cannot be sliced where they enter.
                    g.node(n).inputs.iter().flatten().any(|&v| {
                        let producer = &g.node(g.value(v).producer).op;
                        self.exe.weights.trainable.contains(&v)
                            && !matches!(producer, Op::Constant { .. } | Op::ConstantOfShape { .. })
                    })
                })
            {
                return Err(setup(format!(
                    "layer {}: its weights are computed; it cannot be split",
                    l.name
                )));
            }
        }
        Ok(())
    }

    /// The first node after a row-parallel layer's product that does not keep the sum of
    /// its ranks' partial results right. Adds do: of a bias (the first slice adds it, the
    /// others zeros), or of an input from outside the layer (each rank adds its feature
    /// slice, [`Rank::epilogue_share`]). Anything else would apply to a partial sum.
    fn partial_sum_breaker(&self, l: &LayerExec, main: NodeId) -> Option<NodeId> {
        let g = self.exe.graph;
        let mut partial: BTreeSet<ValueId> = g.node(main).outputs.iter().copied().collect();
        let outside: BTreeSet<ValueId> = l.inputs.iter().map(|&(v, _)| v).collect();
        for &n in l.nodes.iter().filter(|&&n| after(&l.nodes, main, n)) {
            let node = g.node(n);
            let inputs: Vec<ValueId> = node.inputs.iter().flatten().copied().collect();
            let adds_partial = matches!(node.op, Op::Binary(Binary::Add))
                && inputs.len() == 2
                && inputs.iter().filter(|v| partial.contains(v)).count() == 1
                && inputs.iter().any(|v| outside.contains(v));
            if !adds_partial {
                return Some(n);
            }
            partial.extend(node.outputs.iter().copied());
        }
        None
    }

    fn info_at(&self, batch: u64) -> Result<std::sync::Arc<GraphInfo>, String> {
        let mut cache = self.infos.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(info) = cache.get(&batch) {
            return Ok(info.clone());
        }
        let info = std::sync::Arc::new((self.exe.info_at)(batch)?);
        cache.insert(batch, info.clone());
        Ok(info)
    }

    /// How rank index `k` of layer `l` holds weight `w`: a piece of each group when the
    /// layer's output features are held by groups.
    fn slice_of(&self, l: &LayerExec, k: u32, w: ValueId) -> Slice {
        let slice = self.slice_within(l, k, w);
        let out = l.view_out().pieces(k)[2];
        // Its output's groups, or for an attention layer its input's (a bias it adds to
        // the QKV columns before splitting them).
        let grouped = l
            .outputs
            .iter()
            .find_map(|o| self.groups.get(o))
            .or_else(|| {
                l.inputs
                    .iter()
                    .filter(|_| l.kind == LayerKind::Attention)
                    .find_map(|&(v, _)| self.groups.get(&carrier(self.exe.layers, v)))
            });
        match (slice, grouped) {
            (Slice::Axis(axis, piece), Some(&groups)) if out.1 > 1 && piece == out => {
                Slice::Groups {
                    axis,
                    groups,
                    piece,
                }
            }
            (slice, _) => slice,
        }
    }

    /// How rank index `k` of layer `l` holds weight `w`, its groups aside.
    fn slice_within(&self, l: &LayerExec, k: u32, w: ValueId) -> Slice {
        let g = self.exe.graph;
        let Split {
            attribute: a,
            parameter: p,
            ..
        } = l.split;
        if a <= 1 && p <= 1 {
            return Slice::Whole;
        }
        let wdims = self
            .exe
            .weights
            .tensors
            .get(&w)
            .map(|t| t.shape.clone())
            .unwrap_or_default();
        // The node using it, perhaps through an alias (the `Identity` an exporter puts on
        // a merged weight).
        let lg = self.exe.layers;
        let reader = |v: ValueId| {
            l.nodes.iter().find_map(|&n| {
                g.node(n)
                    .inputs
                    .iter()
                    .position(|x| x.is_some_and(|x| carrier(lg, x) == v))
                    .map(|slot| (n, slot))
            })
        };
        let Some((mut node, mut slot)) = reader(w) else {
            return Slice::Whole;
        };
        if let Some(axis) = l.local.sliced(w) {
            // Applied along the heads: cut like the features it meets.
            return Slice::Axis(axis, l.view_in().pieces(k)[2]);
        }
        if l.kind == LayerKind::Embedding {
            // Vocabulary-parallel: the largest table by pieces of its rows, the others
            // (position embeddings) added by the first piece only.
            return match self.vocabulary_table(l) {
                Some(table) if table == w => Slice::Vocabulary(l.vocabulary_piece(k)),
                _ => Slice::FirstSliceOnly,
            };
        }
        let mut wdims = wdims;
        // A tied head reads the embedding through a transpose: slice what the product
        // reads, at the embedding's axis that becomes it.
        let mut perm: Option<Vec<usize>> = None;
        if let (Op::Transpose { perm: p }, 0) = (&g.node(node).op, slot) {
            let order: Vec<usize> = match p {
                Some(p) => p.iter().map(|&x| x.max(0) as usize).collect(),
                None => (0..wdims.len()).rev().collect(),
            };
            let transposed = g.node(node).outputs.first().copied();
            if let Some(next) = transposed.and_then(reader) {
                if order.iter().all(|&x| x < wdims.len()) {
                    wdims = order.iter().map(|&x| wdims[x]).collect();
                    (node, slot) = next;
                    perm = Some(order);
                }
            }
        }
        let slice = self.slice_at(l, k, node, slot, &wdims);
        match (slice, perm) {
            (Slice::Axis(axis, piece), Some(order)) => Slice::Axis(order[axis], piece),
            (slice, _) => slice,
        }
    }

    /// How rank index `k` of layer `l` holds the weight (of `wdims`) `node` reads at `slot`.
    fn slice_at(&self, l: &LayerExec, k: u32, node: NodeId, slot: usize, wdims: &[usize]) -> Slice {
        let g = self.exe.graph;
        let Split {
            attribute: a,
            parameter: p,
            ..
        } = l.split;
        let out = l.view_out().pieces(k);
        let inp = l.view_in().pieces(k);
        let op = &g.node(node).op;
        let last = wdims.len().saturating_sub(1);
        match (op, slot, l.kind) {
            (Op::Conv(_), 1 | 2, LayerKind::Conv) => Slice::Axis(0, out[2]),
            (Op::Gemm(gm), 1, LayerKind::Dense) => match (gm.trans_b, p > 1) {
                (true, true) => Slice::Axis(0, out[2]),
                (false, true) => Slice::Axis(1, out[2]),
                (true, false) => Slice::Axis(1, inp[2]),
                (false, false) => Slice::Axis(0, inp[2]),
            },
            (Op::Gemm(_), 2, LayerKind::Dense) if p > 1 => Slice::Axis(last, out[2]),
            (Op::Gemm(_), 2, LayerKind::Dense) => Slice::FirstSliceOnly,
            (Op::MatMul, 1, LayerKind::Dense) if p > 1 => Slice::Axis(last, out[2]),
            (Op::MatMul, 1, LayerKind::Dense) => Slice::Axis(last.saturating_sub(1), inp[2]),
            (Op::BatchNorm { .. }, 1..=4, _) => Slice::Axis(0, out[2]),
            // A bias after a row-parallel product: added once, to the first partial sum.
            (Op::Binary(Binary::Add), _, LayerKind::Dense)
                if a > 1 && l.main.is_some_and(|m| after(&l.nodes, m, node)) =>
            {
                Slice::FirstSliceOnly
            }
            _ => {
                // A constant broadcast against the layer's output: cut it where it spans
                // the features (or rows) the rank holds.
                let Some(&o) = l.outputs.first() else {
                    return Slice::Whole;
                };
                let Ok(shape) = self.microbatch_shape(o) else {
                    return Slice::Whole;
                };
                let axes = self.axes(o, shape.len());
                let lead = shape.len().saturating_sub(wdims.len());
                for (axis, piece) in [(axes.features, out[2]), (axes.rows, out[1])] {
                    if let Some(ax) = axis.filter(|&ax| ax >= lead && piece.1 > 1) {
                        if wdims[ax - lead] == shape[ax] && shape[ax] > 1 {
                            return Slice::Axis(ax - lead, piece);
                        }
                    }
                }
                Slice::Whole
            }
        }
    }
}

/// Whether `node` runs after `main` among a layer's `nodes`.
fn after(nodes: &[NodeId], main: NodeId, node: NodeId) -> bool {
    let at = |n| nodes.iter().position(|&m| m == n);
    matches!((at(main), at(node)), (Some(i), Some(j)) if j > i)
}

/// A layer's forward pass on one microbatch, kept for its backward pass.
struct LayerRun {
    values: Values,
    records: Vec<Record>,
    /// The region each output holds.
    regions: BTreeMap<ValueId, Region>,
    /// Whether what its backward reads was dropped for recomputation.
    dropped: bool,
}

/// What a rank reports.
#[derive(Default)]
struct RankReport {
    /// Per step, this rank's share of the loss.
    losses: Vec<f64>,
    /// First step's output pieces: (global element offset, values).
    output: Vec<(usize, Vec<f32>)>,
    /// Weights and first-step gradients: (name, slice, full dims, values).
    weights: Vec<(ValueId, Slice, Vec<f32>)>,
    gradients: Vec<(ValueId, Slice, Vec<f32>)>,
}

struct Rank<'p, 'a> {
    p: &'p Prepared<'a>,
    rank: u32,
    comm: Comm,
    options: TrainOptions,
    weights: BTreeMap<ValueId, (Slice, Tensor)>,
    grads: BTreeMap<ValueId, Vec<f32>>,
    velocity: BTreeMap<ValueId, Vec<f32>>,
    runs: BTreeMap<(usize, u32), LayerRun>,
    pieces: BTreeMap<(usize, u32), Vec<(Region, Tensor)>>,
    grad_pieces: BTreeMap<(usize, u32), Vec<GradPiece>>,
    input_grads: BTreeMap<(usize, u32), (Region, Vec<f32>)>,
    pending_sums: BTreeMap<(usize, u32), VecDeque<usize>>,
    /// Halo rows and their gradients in flight.
    halos: halo::HaloState,
    /// Per (output layer, microbatch), every class piece's loss statistics.
    loss_statistics: BTreeMap<(usize, u32), Vec<Vec<f32>>>,
    /// Per (edge, microbatch), the input a recomputed run keeps from outside the run.
    checkpoints: BTreeMap<(usize, u32), Tensor>,
    /// Per instruction, the buffers it reads and writes: (kind, layer, microbatch, writes).
    touches: BTreeMap<u32, Vec<Touch>>,
    step: u32,
    report: RankReport,
    fault: Option<Fault>,
    checkpoint_every: Option<u32>,
    collector: Option<&'p Collector<'p>>,
    first_step: u32,
    compute: Box<dyn Compute>,
}

impl<'p, 'a> Rank<'p, 'a> {
    fn new(
        p: &'p Prepared<'a>,
        rank: u32,
        comm: Comm,
        options: TrainOptions,
        resume: Option<&Checkpoint>,
    ) -> Result<Self, String> {
        let mut weights = BTreeMap::new();
        let mut velocity = BTreeMap::new();
        for l in &p.layers {
            let Some(k) = l.holds(rank) else { continue };
            for &w in &l.weights {
                let model = p.exe.weights.tensors.get(&w).ok_or("a weight is missing")?;
                let name = &p.exe.graph.value(w).name;
                let restored;
                let full = match resume {
                    Some(c) => {
                        let data = c
                            .weights
                            .get(name)
                            .filter(|d| d.len() == model.len())
                            .ok_or_else(|| {
                                format!(
                                    "the checkpoint has no weight '{name}' of {} elements",
                                    model.len()
                                )
                            })?;
                        restored = Tensor::f32(model.shape.clone(), data.clone());
                        &restored
                    }
                    None => model,
                };
                let slice = if p.tied.contains(&w) {
                    Slice::Whole
                } else {
                    p.slice_of(l, k, w)
                };
                if let Some((held, _)) = weights.get(&w) {
                    if *held != slice {
                        return Err(format!(
                            "the weight '{name}' is read by several layers that hold different \
                             pieces of it on rank {rank} (layer {} holds {slice:?}, an earlier \
                             one {held:?}); give them the same split",
                            l.name
                        ));
                    }
                    continue;
                }
                let first = l.first_slice(k);
                if let Some(v) = resume.and_then(|c| c.velocity.get(name)) {
                    let v = Tensor::f32(model.shape.clone(), v.clone());
                    if let Some(data) = share(&v, &slice, first).floats() {
                        velocity.insert(w, data.to_vec());
                    }
                }
                weights.insert(w, (slice.clone(), share(full, &slice, first)));
            }
        }
        let mut touches: BTreeMap<u32, Vec<_>> = BTreeMap::new();
        for b in p.exe.plan.buffers.get(rank as usize).into_iter().flatten() {
            for &i in &b.reads {
                touches
                    .entry(i)
                    .or_default()
                    .push((b.kind, b.layer, b.microbatch, false));
            }
            for &i in &b.writes {
                touches
                    .entry(i)
                    .or_default()
                    .push((b.kind, b.layer, b.microbatch, true));
            }
        }
        Ok(Rank {
            p,
            rank,
            comm,
            options,
            weights,
            grads: BTreeMap::new(),
            velocity,
            runs: BTreeMap::new(),
            pieces: BTreeMap::new(),
            grad_pieces: BTreeMap::new(),
            input_grads: BTreeMap::new(),
            pending_sums: BTreeMap::new(),
            halos: halo::HaloState::default(),
            loss_statistics: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            touches,
            step: 0,
            report: RankReport {
                // Rank 0 carries the losses so far; the others' shares of them are zero.
                losses: resume
                    .map(|c| {
                        if rank == 0 {
                            c.losses.clone()
                        } else {
                            vec![0.0; c.losses.len()]
                        }
                    })
                    .unwrap_or_default(),
                ..RankReport::default()
            },
            fault: None,
            checkpoint_every: None,
            collector: None,
            first_step: resume.map_or(0, |c| c.step),
            compute: match p.exe.compute {
                Some(make) => make(rank)?,
                None => Box::new(OnCpu),
            },
        })
    }

    /// How layer `l` holds weight `w` on this rank: as the rank keeps it, or, for a tied
    /// weight kept whole, the piece the layer's split gives it.
    fn piece(&self, l: &LayerExec, w: ValueId) -> Option<Slice> {
        let (slice, _) = self.weights.get(&w)?;
        if !self.p.tied.contains(&w) {
            return Some(slice.clone());
        }
        let k = l.holds(self.rank)?;
        Some(self.p.slice_of(l, k, w))
    }

    /// Whether this rank's weight `w` is real (not a zero stand-in for a bias it lacks).
    fn trains(&self, l: &LayerExec, w: ValueId) -> bool {
        match self.piece(l, w) {
            Some(Slice::FirstSliceOnly) => l.holds(self.rank).is_some_and(|k| l.first_slice(k)),
            Some(_) => true,
            None => false,
        }
    }

    fn run(&mut self) -> Result<(), RunError> {
        let program = self
            .p
            .exe
            .plan
            .programs
            .get(self.rank as usize)
            .cloned()
            .unwrap_or_default();
        for step in self.first_step..self.options.steps {
            self.step = step;
            self.report.losses.push(0.0);
            for (i, instruction) in program.iter().enumerate() {
                let me = self.rank;
                let fail = move |message: String| RunError::Rank {
                    rank: me,
                    index: i,
                    op: instruction.op(),
                    message,
                };
                let fault = self.fault.filter(|f| {
                    step == self.first_step && f.rank == self.rank && f.instruction == i
                });
                let panics = fault.is_some_and(|f| f.kind == FaultKind::Panic);
                if let Some(f) = fault {
                    match f.kind {
                        FaultKind::Panic => {}
                        FaultKind::Exit => {
                            self.comm.at(i);
                            return Err(fail(KILLED.into()));
                        }
                        FaultKind::Hang => {
                            // Busy with nothing, never reaching the others, until they
                            // give up.
                            self.comm.at(i);
                            while !self.comm.failed() {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            return Err(fail(KILLED.into()));
                        }
                    }
                }
                self.comm.at(i);
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if panics {
                        panic!("injected fault");
                    }
                    self.execute(i as u32, instruction)
                }))
                .unwrap_or_else(|payload| {
                    let what = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(format!("panicked: {what}"))
                });
                outcome.map_err(|message| {
                    let error = fail(message);
                    self.comm.abort(&error.to_string());
                    error
                })?;
            }
            if self
                .checkpoint_every
                .is_some_and(|n| n > 0 && (step + 1) % n == 0)
            {
                self.checkpoint(step + 1).map_err(|message| {
                    let error = RunError::Rank {
                        rank: self.rank,
                        index: program.len(),
                        op: "checkpoint",
                        message,
                    };
                    self.comm.abort(&error.to_string());
                    error
                })?;
            }
        }
        self.comm.finish();
        for (&w, (slice, t)) in &self.weights {
            let l = self.p.layers.iter().find(|l| l.weights.contains(&w));
            if l.is_some_and(|l| self.trains(l, w)) {
                self.report.weights.push((
                    w,
                    slice.clone(),
                    t.floats().unwrap_or_default().to_vec(),
                ));
            }
        }
        Ok(())
    }

    /// Hands this rank's state after `step` steps to the collector; the last rank to do so
    /// assembles the checkpoint and writes it.
    fn checkpoint(&self, step: u32) -> Result<(), String> {
        let Some(collector) = self.collector else {
            return Ok(());
        };
        let mut weights = Vec::new();
        let mut velocity = Vec::new();
        for (&w, (slice, t)) in &self.weights {
            let l = self.p.layers.iter().find(|l| l.weights.contains(&w));
            if !l.is_some_and(|l| self.trains(l, w)) {
                continue;
            }
            weights.push((w, slice.clone(), t.floats().unwrap_or_default().to_vec()));
            if let Some(v) = self.velocity.get(&w) {
                velocity.push((w, slice.clone(), v.clone()));
            }
        }
        let state = RankState {
            losses: self.report.losses.clone(),
            weights,
            velocity,
        };
        let complete = {
            let mut pending = collector.pending.lock().unwrap_or_else(|p| p.into_inner());
            let states = pending.entry(step).or_default();
            states.push(state);
            (states.len() == collector.ranks).then(|| pending.remove(&step).unwrap_or_default())
        };
        if let Some(states) = complete {
            let checkpoint = Checkpoint {
                step,
                losses: (0..step as usize)
                    .map(|s| {
                        states
                            .iter()
                            .map(|r| r.losses.get(s).copied().unwrap_or(0.0))
                            .sum()
                    })
                    .collect(),
                weights: assemble(self.p, states.iter().flat_map(|r| &r.weights).collect()),
                velocity: assemble(self.p, states.iter().flat_map(|r| &r.velocity).collect()),
            };
            (collector.on_checkpoint)(&checkpoint)?;
        }
        Ok(())
    }

    fn execute(&mut self, index: u32, instruction: &Instruction) -> Result<(), String> {
        match *instruction {
            Instruction::Forward {
                layer, microbatch, ..
            } => self.forward(layer as usize, microbatch, false),
            Instruction::Recompute {
                layer, microbatch, ..
            } => self.forward(layer as usize, microbatch, true),
            Instruction::Backward {
                layer, microbatch, ..
            } => self.backward(layer as usize, microbatch),
            Instruction::Send { to, tag, .. } => match self.decode(tag)? {
                Tag::Edge {
                    edge,
                    microbatch,
                    backward,
                } => self.send(to, tag, edge, microbatch, backward),
                Tag::Again { edge, microbatch } => self.send(to, tag, edge, microbatch, false),
                Tag::Halo {
                    edge,
                    microbatch,
                    pass,
                } => self.halo_send(to, tag, edge, microbatch, pass),
            },
            Instruction::Recv { from, tag, .. } => match self.decode(tag)? {
                Tag::Edge {
                    edge,
                    microbatch,
                    backward,
                } => self.recv(from, tag, edge, microbatch, backward),
                Tag::Again { edge, microbatch } => self.recv(from, tag, edge, microbatch, false),
                Tag::Halo {
                    edge,
                    microbatch,
                    pass,
                } => self.halo_recv(from, tag, edge, microbatch, pass),
            },
            Instruction::AllReduce {
                group,
                tied: Some(ref name),
                ..
            } => self.tied_all_reduce(name, self.group(group)?),
            Instruction::AllReduce { group, .. } => self.all_reduce(index, self.group(group)?),
            Instruction::AllGather { group, .. } if self.writes(index, BufferKind::Weights) => {
                self.all_gather_weights(index, self.group(group)?)
            }
            Instruction::ReduceScatter { group, .. }
                if self.writes(index, BufferKind::Gradients) =>
            {
                self.reduce_scatter_gradients(index, self.group(group)?)
            }
            // A row-parallel layer's partial sums, scattered by rows to readers of rows:
            // summed whole here (each reader reads the same).
            Instruction::ReduceScatter { group, .. }
                if self.writes(index, BufferKind::Activation)
                    || self.writes(index, BufferKind::Recomputed) =>
            {
                self.all_reduce(index, self.group(group)?)
            }
            Instruction::AllGather { group, .. }
            | Instruction::AllToAll { group, .. }
            | Instruction::ReduceScatter { group, .. } => {
                self.reshard_forward_or_back(index, self.group(group)?)
            }
            Instruction::Step {
                group: Some(group), ..
            } => self.sharded_step(index, self.group(group)?),
            Instruction::Step {
                tied: Some(ref name),
                ..
            } => {
                let g = self.p.exe.graph;
                let w = self
                    .p
                    .tied
                    .iter()
                    .copied()
                    .find(|&w| g.value(w).name == *name)
                    .ok_or_else(|| format!("'{name}' is not a tied weight of this plan"))?;
                self.optimizer_step(|v| v == w)
            }
            Instruction::Step { .. } => {
                // The weights of the layers whose buffers it updates (a rank running several
                // virtual stages steps each stage's in turn).
                let mine: BTreeSet<ValueId> = self
                    .touched(index)
                    .iter()
                    .filter(|&&(kind, _, _, writes)| kind == BufferKind::Weights && writes)
                    .filter_map(|&(_, l, _, _)| self.p.layers.get(l? as usize))
                    .flat_map(|l| l.weights.iter().copied())
                    .collect();
                let tied = &self.p.tied;
                self.optimizer_step(|v| !tied.contains(&v) && mine.contains(&v))
            }
        }
    }

    fn group(&self, g: u32) -> Result<Vec<u32>, String> {
        self.p
            .exe
            .plan
            .groups
            .get(g as usize)
            .cloned()
            .ok_or_else(|| format!("group {g} does not exist"))
    }

    fn comm_error(e: super::comm::CommError) -> String {
        e.to_string()
    }

    /// What a message of `tag` carries.
    fn decode(&self, tag: u64) -> Result<Tag, String> {
        let tags = Tags {
            edges: self.p.edges.len(),
            microbatches: self.p.exe.plan.microbatches,
        };
        tags.decode(tag)
            .ok_or_else(|| format!("tag {tag} names no edge"))
    }

    fn value_name(&self, v: ValueId) -> &str {
        &self.p.exe.graph.value(v).name
    }

    /// The region of edge `e`'s tensor that consumer rank `rank` needs.
    fn need(&self, e: usize, rank: u32) -> Result<Region, String> {
        let edge = &self.p.edges[e];
        let c = &self.p.layers[edge.consumer];
        let k = c
            .holds(rank)
            .ok_or_else(|| format!("rank {rank} does not run {}", c.name))?;
        self.p.region(edge.value, &c.view_in(), k)
    }

    /// The region of edge `e`'s tensor that producer rank `rank` holds.
    fn held(&self, e: usize, rank: u32) -> Result<Region, String> {
        let edge = &self.p.edges[e];
        let pl = &self.p.layers[edge.producer];
        let k = pl
            .holds(rank)
            .ok_or_else(|| format!("rank {rank} does not run {}", pl.name))?;
        self.p.region(edge.value, &pl.view_out(), k)
    }

    /// The region of an input only a split layer's epilogue reads (a residual added after
    /// the product) that the rank's output meets, where it differs from what the plan
    /// delivers: under an output-feature split, the rank's features of it (a crop); under a
    /// row-parallel split, whose ranks each add their feature slice into a partial sum of
    /// every feature, the whole output (the slice padded with zeros, so that the sum of
    /// the partial sums adds the input once). `None` for inputs used as delivered.
    fn epilogue_share(&self, l: usize, k: u32, e: usize) -> Result<Option<Region>, String> {
        let need = self.need(e, self.rank)?;
        self.epilogue_crop(l, k, self.p.edges[e].value, need)
    }

    /// As [`Rank::epilogue_share`], for any input `v` the rank reads as `need`.
    fn epilogue_crop(
        &self,
        l: usize,
        k: u32,
        v: ValueId,
        need: Region,
    ) -> Result<Option<Region>, String> {
        let layer = &self.p.layers[l];
        let g = self.p.exe.graph;
        let split_output =
            matches!(layer.kind, LayerKind::Conv | LayerKind::Dense) && (layer.split.parameter > 1);
        let row_parallel = layer.kind == LayerKind::Dense && layer.split.attribute > 1;
        if !split_output && !row_parallel {
            return Ok(None);
        }
        // Only what the epilogue alone reads: not the product's operands, nor what ops
        // before it read.
        let Some(main) = layer.main else {
            return Ok(None);
        };
        let reads = |n: &NodeId| {
            g.node(*n)
                .inputs
                .iter()
                .flatten()
                .any(|&x| carrier(self.p.exe.layers, x) == v)
        };
        if !layer
            .nodes
            .iter()
            .filter(|n| reads(n))
            .all(|&n| after(&layer.nodes, main, n))
        {
            return Ok(None);
        }
        let out = self.p.region(v, &layer.view_out(), k)?;
        Ok(Some(if split_output {
            intersect(&need, &out)
        } else {
            out
        }))
    }

    /// Edge `e`'s input as delivered (the rank's need) reframed to `share`
    /// ([`Rank::epilogue_share`]).
    fn reframe(&self, x: &Tensor, e: usize, share: &Region) -> Result<Tensor, String> {
        let need = self.need(e, self.rank)?;
        let dims = self.p.local_dims(self.p.edges[e].value, share);
        match x.floats() {
            Some(values) => Ok(Tensor::f32(dims, reframe(values, &need, share))),
            None => Ok(crop(x, &need, share).reshaped(dims)),
        }
    }

    /// The input of edge `e` this rank needs, from what it holds and what it received.
    fn assemble(&mut self, e: usize, mb: u32) -> Result<Tensor, String> {
        let edge = &self.p.edges[e];
        let need = self.need(e, self.rank)?;
        let n = volume(&need);
        let mut out = vec![0.0f32; n];
        let mut filled = vec![false; n];
        if self.p.layers[edge.producer].holds(self.rank).is_some() {
            let held = self.held(e, self.rank)?;
            if let Some(run) = self.runs.get(&(edge.producer, mb)) {
                let x = run
                    .values
                    .get(edge.value)
                    .ok_or("the producer's output is missing")?;
                let values = x
                    .floats()
                    .ok_or("only floating-point tensors flow between layers")?;
                fill(&mut out, &mut filled, &need, values, &held);
            }
        }
        for (region, part) in self.pieces.remove(&(e, mb)).unwrap_or_default() {
            fill(
                &mut out,
                &mut filled,
                &need,
                part.floats().unwrap_or_default(),
                &region,
            );
        }
        let missing = filled.iter().filter(|f| !**f).count();
        if missing > 0 {
            return Err(format!(
                "{missing} of the {n} elements of '{}' that layer {} needs never arrived",
                self.value_name(edge.value),
                self.p.layers[edge.consumer].name
            ));
        }
        Ok(Tensor::f32(self.p.local_dims(edge.value, &need), out))
    }

    /// Layer `l`'s forward on microbatch `mb`; `again` for its recomputation, which reads
    /// the run's kept inputs.
    fn forward(&mut self, l: usize, mb: u32, again: bool) -> Result<(), String> {
        let p = self.p;
        let layer = &p.layers[l];
        let run = p.recompute[l];
        if again && run.is_none() {
            return Err(format!("layer {} is not recomputed", layer.name));
        }
        let k = layer
            .holds(self.rank)
            .ok_or_else(|| format!("rank {} does not run layer {}", self.rank, layer.name))?;
        let g = p.exe.graph;
        let mut values = Values::new(g);
        let samples = interval(layer.view_in().pieces(k)[0], p.microbatch);
        for &(v, source) in &layer.inputs {
            let c = carrier(p.exe.layers, v);
            let t =
                match source {
                    Source::Edge(e) => {
                        let whole = self.layer_input(l, e, mb, again)?;
                        let whole = match p.edges[e].halo {
                            true => self.add_halo(l, k, e, mb, whole)?,
                            false => whole,
                        };
                        match self.epilogue_share(l, k, e)? {
                            Some(share) => self.reframe(&whole, e, &share)?,
                            None => whole,
                        }
                    }
                    Source::GraphInput => {
                        let full = p.exe.data.inputs.get(&c).ok_or("an input has no data")?;
                        let need = p.region(c, &layer.view_in(), k)?;
                        let need = match p.reads_halo(l, c) {
                            true => p.with_halo(l, k, c, &need)?,
                            false => need,
                        };
                        let share = self.epilogue_crop(l, k, c, need.clone())?;
                        // The rank's piece of this microbatch's rows of the global batch.
                        let offset = mb as usize * p.microbatch;
                        let global: Region = full.shape.iter().map(|&d| 0..d).collect();
                        let shifted: Region = need
                            .iter()
                            .enumerate()
                            .map(|(d, r)| {
                                if d == 0 {
                                    r.start + offset..r.end + offset
                                } else {
                                    r.clone()
                                }
                            })
                            .collect();
                        let t = crop(full, &global, &shifted);
                        match (share, t.floats()) {
                            (Some(share), Some(values)) => {
                                Tensor::f32(p.local_dims(c, &share), reframe(values, &need, &share))
                            }
                            (Some(share), None) => crop(&t, &need, &share),
                            (None, _) => t,
                        }
                    }
                    Source::Constant => match self.weights.get(&c) {
                        Some((_, t)) if p.tied.contains(&c) => {
                            let first = layer.first_slice(k);
                            share(t, &p.slice_of(layer, k, c), first)
                        }
                        Some((_, t)) => t.clone(),
                        None => p.exe.weights.tensors.get(&c).cloned().ok_or_else(|| {
                            format!("constant '{}' is missing", self.value_name(c))
                        })?,
                    },
                    Source::Derived => p.derive(c, samples.len() as u64)?,
                    Source::Folded => {
                        let info = p.info_at(samples.len() as u64)?;
                        folded(&info, c).ok_or_else(|| {
                            format!(
                                "'{}' has no value at batch {}",
                                self.value_name(c),
                                samples.len()
                            )
                        })?
                    }
                };
            // A vocabulary piece's ids: its rows, the others its zero row.
            let t = match p.vocabulary_rows(layer, k, v) {
                Some(rows) => {
                    let ids = t
                        .to_i64s()
                        .iter()
                        .map(|&id| match usize::try_from(id) {
                            Ok(i) if rows.contains(&i) => (i - rows.start) as i64,
                            _ => rows.len() as i64,
                        })
                        .collect();
                    Tensor::i64(t.shape.clone(), ids)
                }
                None => t,
            };
            // A head piece's reshape targets and split sizes.
            let t = match (source, layer.local.is_empty()) {
                (Source::Constant | Source::Folded | Source::Derived, false) => {
                    let ints = t.to_i64s();
                    match layer
                        .local
                        .apply(v, &ints)
                        .or_else(|| layer.local.apply(c, &ints))
                    {
                        Some(local) => Tensor::i64(t.shape.clone(), local),
                        None => t,
                    }
                }
                _ => t,
            };
            values.set(v, t.clone());
            if c != v {
                values.set(c, t);
            }
        }
        let records = self
            .compute
            .forward(p.graph_of(l, k), &layer.nodes, &mut values, p.env)
            .map_err(|e| e.to_string())?;
        let mut regions = BTreeMap::new();
        for &o in &layer.outputs {
            let region = p.region(o, &layer.view_out(), k)?;
            let got = values.get(o).map(|t| t.shape.clone()).unwrap_or_default();
            let want = p.local_dims(o, &region);
            if got != want {
                return Err(format!(
                    "layer {} computed '{}' of shape {got:?} where its share is {want:?}",
                    layer.name,
                    self.value_name(o),
                ));
            }
            regions.insert(o, region);
        }
        self.runs.insert(
            (l, mb),
            LayerRun {
                values,
                records,
                regions,
                dropped: false,
            },
        );
        if let Some((first, last)) = run.filter(|&(_, last)| last == l && !again) {
            self.drop_run(first, last, mb);
        }
        Ok(())
    }

    fn backward(&mut self, l: usize, mb: u32) -> Result<(), String> {
        let p = self.p;
        let layer = &p.layers[l];
        let k = layer
            .holds(self.rank)
            .ok_or_else(|| format!("rank {} does not run layer {}", self.rank, layer.name))?;
        let run = self.runs.remove(&(l, mb)).ok_or_else(|| {
            format!(
                "layer {} has no forward pass for microbatch {mb}",
                layer.name
            )
        })?;
        if run.dropped {
            return Err(format!(
                "layer {}'s activations of microbatch {mb} were dropped for recomputation \
                 and not recomputed",
                layer.name
            ));
        }
        self.spend_checkpoints(l, mb);
        let mut grads = Grads::default();
        for (&o, held) in &run.regions {
            let n = volume(held);
            let mut total = vec![0.0f32; n];
            let mut any = false;
            for e in
                (0..p.edges.len()).filter(|&e| p.edges[e].producer == l && p.edges[e].value == o)
            {
                let mut acc = vec![0.0f32; n];
                let mut filled = vec![false; n];
                if let Some((region, data)) = self.input_grads.get(&(e, mb)) {
                    fill(&mut acc, &mut filled, held, data, region);
                }
                for (region, data) in self.grad_pieces.remove(&(e, mb)).unwrap_or_default() {
                    fill(&mut acc, &mut filled, held, &data, &region);
                }
                let missing = filled.iter().filter(|f| !**f).count();
                if missing > 0 {
                    return Err(format!(
                        "{missing} of the {n} gradient elements of '{}' (read by layer {}) never came back",
                        self.value_name(o),
                        p.layers[p.edges[e].consumer].name
                    ));
                }
                kernels::add(&mut total, &acc);
                any = true;
            }
            if (l, o) == p.output {
                let y = run.values.get(o).ok_or("the output is missing")?;
                let dy = self.output_loss(l, k, mb, y, held)?;
                kernels::add(&mut total, &dy);
                any = true;
            }
            if any {
                grads.add(o, &total);
            }
        }
        self.compute
            .backward(p.graph_of(l, k), &run.records, &run.values, &mut grads)
            .map_err(|e| e.to_string())?;
        // A weight read through an alias gets its gradient there.
        for &(v, source) in &layer.inputs {
            let c = carrier(p.exe.layers, v);
            if source == Source::Constant && c != v {
                if let Some(g) = grads.take(v) {
                    grads.add(c, &g);
                }
            }
        }
        // Replicas of a layer held whole (LayerNorms over a tensor-parallel group) compute
        // the same weight gradients: the first counts them, the others add zeros.
        let counted = first_replica(layer.kind, layer.split, k);
        for &w in &layer.weights {
            if !self.trains(layer, w) {
                continue;
            }
            let gw = match (grads.take(w), self.weights.get(&w)) {
                (Some(gw), Some((_, whole))) if p.tied.contains(&w) => {
                    Some(place(gw, &p.slice_of(layer, k, w), &whole.shape))
                }
                (gw, _) => gw,
            };
            let gw = gw.map(|g| if counted { g } else { vec![0.0; g.len()] });
            // What a vocabulary piece's zero row gathered (ids it does not hold) is dropped.
            let gw = match self.weights.get(&w) {
                Some((Slice::Vocabulary(_), t)) if !p.tied.contains(&w) => gw.map(|mut g| {
                    let width: usize = t.shape[1..].iter().product();
                    let n = g.len();
                    g[n.saturating_sub(width)..].fill(0.0);
                    g
                }),
                _ => gw,
            };
            if let Some(gw) = gw {
                match self.grads.get_mut(&w) {
                    Some(acc) => kernels::add(acc, &gw),
                    None => {
                        self.grads.insert(w, gw);
                    }
                }
            }
        }
        let mut sums = VecDeque::new();
        for &(v, source) in &layer.inputs {
            let Source::Edge(e) = source else { continue };
            let need = self.need(e, self.rank)?;
            let share = self.epilogue_share(l, k, e)?;
            let halo = match p.edges[e].halo {
                true => Some(p.with_halo(l, k, p.edges[e].value, &need)?),
                false => None,
            };
            let read = halo
                .clone()
                .or_else(|| share.clone())
                .unwrap_or_else(|| need.clone());
            let gv = grads
                .take(v)
                .or_else(|| grads.take(carrier(p.exe.layers, v)))
                .unwrap_or_else(|| vec![0.0; volume(&read)]);
            let gv = match halo {
                Some(ext) => self.split_halo_gradient(e, mb, ext, gv, &need),
                None => gv,
            };
            // A cropped input's gradient is zero outside the crop; the input-gradient sum
            // over the parameter slices then assembles the whole.
            let gv = match share {
                Some(share) => reframe(&gv, &share, &need),
                None => gv,
            };
            self.input_grads.insert((e, mb), (need, gv));
            if matches!(layer.kind, LayerKind::Conv | LayerKind::Dense)
                && layer.split.parameter > 1
                && !p.edges[e].scattered
            {
                sums.push_back(e);
            }
        }
        if !sums.is_empty() {
            self.pending_sums.insert((l, mb), sums);
        }
        Ok(())
    }

    fn send(&mut self, to: u32, tag: u64, e: usize, mb: u32, backward: bool) -> Result<(), String> {
        let edge = &self.p.edges[e];
        let data = if backward {
            // From a consumer rank back to the producer rank.
            let (need, data) = self.input_grads.get(&(e, mb)).ok_or_else(|| {
                format!("no gradient of '{}' to send", self.value_name(edge.value))
            })?;
            let piece = intersect(need, &self.held(e, to)?);
            crop(&Tensor::f32(dims(need), data.clone()), need, &piece)
        } else {
            let held = self.held(e, self.rank)?;
            let piece = intersect(&self.need(e, to)?, &held);
            let run = self.runs.get(&(edge.producer, mb)).ok_or_else(|| {
                format!(
                    "'{}' was not computed before its send",
                    self.value_name(edge.value)
                )
            })?;
            let x = run.values.get(edge.value).ok_or("the output is missing")?;
            crop(x, &held, &piece)
        };
        let floats = data
            .floats()
            .ok_or("only floating-point tensors travel between ranks")?;
        self.comm
            .send(to, tag, floats.to_vec())
            .map_err(Self::comm_error)
    }

    fn recv(
        &mut self,
        from: u32,
        tag: u64,
        e: usize,
        mb: u32,
        backward: bool,
    ) -> Result<(), String> {
        let data = self.comm.recv(from, tag).map_err(Self::comm_error)?;
        let piece = if backward {
            intersect(&self.need(e, from)?, &self.held(e, self.rank)?)
        } else {
            intersect(&self.need(e, self.rank)?, &self.held(e, from)?)
        };
        if data.len() != volume(&piece) {
            return Err(format!(
                "the message from rank {from} has {} elements where {} were expected",
                data.len(),
                volume(&piece)
            ));
        }
        if backward {
            self.grad_pieces
                .entry((e, mb))
                .or_default()
                .push((piece, data));
        } else {
            self.pieces
                .entry((e, mb))
                .or_default()
                .push((piece.clone(), Tensor::f32(dims(&piece), data)));
        }
        Ok(())
    }

    /// The buffers instruction `index` touches; a recomputation's are its forward's
    /// again (its collectives reduce and gather the same tensors).
    fn touched(&self, index: u32) -> Vec<Touch> {
        let mut touches = self.touches.get(&index).cloned().unwrap_or_default();
        for t in &mut touches {
            if t.0 == BufferKind::Recomputed {
                t.0 = BufferKind::Activation;
            }
        }
        touches
    }

    /// Whether instruction `index` writes a buffer of `kind`.
    fn writes(&self, index: u32, kind: BufferKind) -> bool {
        self.touches
            .get(&index)
            .is_some_and(|t| t.iter().any(|&(k, _, _, w)| k == kind && w))
    }

    fn all_reduce(&mut self, index: u32, group: Vec<u32>) -> Result<(), String> {
        let touched = self.touched(index);
        let reads = |kind: BufferKind| {
            touched
                .iter()
                .filter(|(k, _, _, w)| *k == kind && !w)
                .filter_map(|&(_, l, mb, _)| Some((l? as usize, mb)))
                .collect::<Vec<_>>()
        };
        if !reads(BufferKind::Gradients).is_empty() {
            // A gradient bucket: this rank's gradients of those layers, in layer order.
            let keys = self.bucket_weights(index, BufferKind::Gradients);
            let mut flat = self.flat_gradients(&keys);
            self.comm
                .all_reduce(&group, &mut flat)
                .map_err(Self::comm_error)?;
            let mut at = 0;
            for &w in &keys {
                if let Some(g) = self.grads.get_mut(&w) {
                    let n = g.len();
                    g.copy_from_slice(&flat[at..at + n]);
                    at += n;
                }
            }
            return Ok(());
        }
        if let Some(&(l, Some(mb))) = reads(BufferKind::Activation).first() {
            // A row-parallel layer's partial sums.
            let run = self
                .runs
                .get_mut(&(l, mb))
                .ok_or("partial sums of a layer that did not run")?;
            let outputs: Vec<ValueId> = run.regions.keys().copied().collect();
            for o in outputs {
                let Some(Tensor {
                    shape,
                    data: Data::F32(mut x),
                }) = run.values.take(o)
                else {
                    return Err("partial sums of a missing or integer output".into());
                };
                self.comm
                    .all_reduce(&group, &mut x)
                    .map_err(Self::comm_error)?;
                run.values.set(o, Tensor::f32(shape, x));
            }
            return Ok(());
        }
        if let Some(&(l, Some(mb))) = reads(BufferKind::InputGradient).first() {
            let e = self
                .pending_sums
                .get_mut(&(l, mb))
                .and_then(VecDeque::pop_front)
                .ok_or("an input-gradient sum the layer does not need")?;
            let (_, data) = self
                .input_grads
                .get_mut(&(e, mb))
                .ok_or("no input gradient to sum")?;
            return self.comm.all_reduce(&group, data).map_err(Self::comm_error);
        }
        Err("an all-reduce whose buffers name nothing to reduce".into())
    }

    /// Sums a tied weight's gradient over every rank holding it: each keeps it whole and
    /// has added the uses it runs, each at its place.
    fn tied_all_reduce(&mut self, name: &str, group: Vec<u32>) -> Result<(), String> {
        let g = self.p.exe.graph;
        let found = self
            .weights
            .iter()
            .find(|(w, _)| g.value(**w).name == name)
            .map(|(&w, (_, t))| (w, t.len()));
        let Some((w, n)) = found else {
            return Err(format!("this rank does not hold the tied weight '{name}'"));
        };
        let gradient = self.grads.entry(w).or_insert_with(|| vec![0.0; n]);
        self.comm
            .all_reduce(&group, gradient)
            .map_err(Self::comm_error)
    }

    /// All-gather, reduce-scatter and all-to-all: every member contributes its share and
    /// takes what it needs (the CPU backend moves whole shares; the result is the same).
    fn reshard_forward_or_back(&mut self, index: u32, group: Vec<u32>) -> Result<(), String> {
        let touched = self.touched(index);
        let find = |kind: BufferKind, writes: bool| {
            touched
                .iter()
                .find(|(k, _, _, w)| *k == kind && *w == writes)
                .and_then(|&(_, l, mb, _)| Some((l? as usize, mb?)))
        };
        let mut members = group.clone();
        members.sort_unstable();
        // In place on the model's output, split by classes: the loss statistics.
        if let Some((l, mb)) = find(BufferKind::Activation, true)
            .filter(|&(l, _)| l == self.p.output.0)
            .filter(|&at| find(BufferKind::Activation, false) == Some(at))
        {
            return self.exchange_loss_statistics(l, mb, &members);
        }
        if let (Some((producer, mb)), Some((consumer, _))) = (
            find(BufferKind::Activation, false),
            find(BufferKind::Received, true),
        ) {
            let e = self.edge_between(producer, consumer)?;
            let held = self.held(e, self.rank)?;
            let mine = {
                let run = self
                    .runs
                    .get(&(producer, mb))
                    .ok_or("resharding a tensor not computed")?;
                run.values
                    .get(self.p.edges[e].value)
                    .and_then(|t| t.floats())
                    .ok_or("the output is missing")?
                    .to_vec()
            };
            let all = self.comm.exchange(&group, mine).map_err(Self::comm_error)?;
            for (&member, data) in members.iter().zip(all) {
                if member == self.rank {
                    continue;
                }
                let region = self.held(e, member)?;
                self.pieces
                    .entry((e, mb))
                    .or_default()
                    .push((region.clone(), Tensor::f32(dims(&region), data)));
            }
            let _ = held;
            return Ok(());
        }
        if let (Some((consumer, mb)), Some((producer, _))) = (
            find(BufferKind::InputGradient, false),
            find(BufferKind::Received, true),
        ) {
            let e = self.edge_between(producer, consumer)?;
            let (need, data) = self
                .input_grads
                .get(&(e, mb))
                .cloned()
                .ok_or("no input gradient to reshard")?;
            let all = self.comm.exchange(&group, data).map_err(Self::comm_error)?;
            let held = self.held(e, self.rank)?;
            let reduce = matches!(
                self.p.exe.plan.programs[self.rank as usize][index as usize],
                Instruction::ReduceScatter { .. }
            );
            if reduce {
                // Partial sums over the group: add every member's, keep this rank's share.
                let mut sum = vec![0.0f32; volume(&need)];
                for part in &all {
                    kernels::add(&mut sum, part);
                }
                let piece = intersect(&need, &held);
                let part = crop(&Tensor::f32(dims(&need), sum), &need, &piece);
                self.input_grads.remove(&(e, mb));
                self.grad_pieces
                    .entry((e, mb))
                    .or_default()
                    .push((piece, part.floats().unwrap_or_default().to_vec()));
            } else {
                for (&member, part) in members.iter().zip(all) {
                    if member == self.rank {
                        continue;
                    }
                    let region = self.need(e, member)?;
                    self.grad_pieces
                        .entry((e, mb))
                        .or_default()
                        .push((region, part));
                }
            }
            return Ok(());
        }
        Err("a resharding collective whose buffers name no tensor".into())
    }

    fn edge_between(&self, producer: usize, consumer: usize) -> Result<usize, String> {
        let found: Vec<usize> = (0..self.p.edges.len())
            .filter(|&e| {
                self.p.edges[e].producer == producer && self.p.edges[e].consumer == consumer
            })
            .collect();
        match found.as_slice() {
            [e] => Ok(*e),
            [] => Err(format!("no edge from layer {producer} to layer {consumer}")),
            _ => Err(format!(
                "several tensors flow from layer {producer} to layer {consumer}"
            )),
        }
    }

    /// Updates the weights `which` selects (the tied ones follow their own all-reduce).
    fn optimizer_step(&mut self, which: impl Fn(ValueId) -> bool) -> Result<(), String> {
        let ready: Vec<ValueId> = self.grads.keys().copied().filter(|&w| which(w)).collect();
        if self.step == 0 {
            for w in &ready {
                if let (Some((slice, _)), Some(g)) = (self.weights.get(w), self.grads.get(w)) {
                    self.report.gradients.push((*w, slice.clone(), g.clone()));
                }
            }
        }
        for w in ready {
            let Some(g) = self.grads.remove(&w) else {
                continue;
            };
            let Some((
                _,
                Tensor {
                    data: Data::F32(x), ..
                },
            )) = self.weights.get_mut(&w)
            else {
                continue;
            };
            let v = self.velocity.entry(w).or_insert_with(|| vec![0.0; g.len()]);
            kernels::sgd_momentum(x, &g, v, self.options.lr, self.options.momentum);
        }
        Ok(())
    }
}

/// A folded value's content as a tensor.
fn folded(info: &GraphInfo, v: ValueId) -> Option<Tensor> {
    let ty = info.ty(v);
    let shape: Vec<usize> = ty.shape.as_sizes()?.iter().map(|&d| d as usize).collect();
    let content = ty.content.as_ref()?;
    Some(if ty.dtype.is_float() {
        Tensor::f32(
            shape,
            content
                .iter()
                .map(|s| s.as_f64().unwrap_or(0.0) as f32)
                .collect(),
        )
    } else {
        Tensor::i64(
            shape,
            content
                .iter()
                .map(|s| match s {
                    Scalar::Int(d) => d.as_known().unwrap_or(0),
                    Scalar::Float(f) => *f as i64,
                })
                .collect(),
        )
    })
}

/// The most ranks one process runs as threads: 16,384 thread stacks aborted the process,
/// and 8,192 ranks did not finish a step (nor notice `--timeout`) in minutes.
pub const MAX_THREAD_RANKS: u32 = 1024;

/// Runs the plan's iterations up to `options.steps` (from a checkpoint's step when
/// resuming), every rank a thread.
///
/// # Errors
/// [`RunError::Setup`] when the plan cannot run here; [`RunError::Rank`] for the rank that
/// failed (the others stop within `control.timeout`, their errors naming it).
pub fn run(
    exe: &Executable<'_>,
    options: &TrainOptions,
    control: &Control<'_>,
) -> Result<(TrainReport, Duration), RunError> {
    let ranks = exe.plan.ranks;
    if ranks > MAX_THREAD_RANKS {
        return Err(RunError::Setup(format!(
            "the plan has {ranks} ranks; one process runs at most {MAX_THREAD_RANKS} of them \
             as threads (run the ranks as processes of a launcher on several machines)"
        )));
    }
    let prepared = Prepared::new(exe)?;
    let world = World::new(ranks, control.timeout);
    let collector = control.on_checkpoint.map(|on_checkpoint| Collector {
        ranks: ranks as usize,
        pending: Mutex::default(),
        on_checkpoint,
    });
    let started = Instant::now();
    let results: Vec<Result<RankReport, RunError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks)
            .map(|r| {
                let comm = world.comm(r);
                let abort = world.comm(r);
                let prepared = &prepared;
                let collector = collector.as_ref();
                let options = *options;
                scope.spawn(move || {
                    let _guard = AbortOnPanic(&abort);
                    let mut rank = Rank::new(prepared, r, comm, options, control.resume)
                        .map_err(RunError::Setup)?;
                    rank.fault = control.fault;
                    rank.checkpoint_every = control.checkpoint_every;
                    rank.collector = collector;
                    rank.run()?;
                    Ok(rank.report)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(RunError::Rank {
                        rank: r as u32,
                        index: 0,
                        op: "?",
                        message: "panicked".into(),
                    })
                })
            })
            .collect()
    });
    let elapsed = started.elapsed();
    let mut reports = Vec::with_capacity(results.len());
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(report) => reports.push(report),
            Err(e) => errors.push(e),
        }
    }
    // The cause first: a rank's own failure, then a rank that timed out waiting (it
    // names the silent rank), then the ranks the failure aborted. A rank stopped by an
    // injected fault reports nothing of itself, as a killed process could not.
    let rank_of = |e: &RunError| match e {
        RunError::Rank { message, .. } if message == KILLED => 3,
        RunError::Rank { message, .. } if message.starts_with("aborted") => 2,
        RunError::Rank { message, .. } if message.contains("waited more than") => 1,
        _ => 0,
    };
    if let Some(e) = errors.into_iter().min_by_key(|e| rank_of(e)) {
        return Err(e);
    }
    Ok((assemble_report(&prepared, reports, options), elapsed))
}

/// Runs one rank of the plan in this process, the others being other processes of
/// `world` ([`World::connect`]): what `ralpc run` does under a launcher.
///
/// The report's losses are summed over every rank (one last collective of the whole
/// world); its output, weights and gradients stay on their ranks and are left empty.
///
/// # Errors
/// As [`run`]; checkpoints need every rank in one process and are refused.
pub fn run_process(
    exe: &Executable<'_>,
    options: &TrainOptions,
    control: &Control<'_>,
    world: &World,
    rank: u32,
) -> Result<(TrainReport, Duration), RunError> {
    if control.on_checkpoint.is_some() || control.resume.is_some() {
        return Err(setup(
            "checkpoints need every rank in one process: run the plan without a launcher",
        ));
    }
    if world.ranks() != exe.plan.ranks {
        return Err(setup(format!(
            "the launcher started {} processes, but the plan has {} ranks",
            world.ranks(),
            exe.plan.ranks
        )));
    }
    let prepared = Prepared::new(exe)?;
    let guard = world.comm(rank);
    let _guard = AbortOnPanic(&guard);
    let started = Instant::now();
    let mut r =
        Rank::new(&prepared, rank, world.comm(rank), *options, None).map_err(RunError::Setup)?;
    r.fault = control.fault;
    r.run()?;
    // The rank's own endpoint: its collective numbering continues.
    let (comm, report) = (&r.comm, &r.report);
    // Losses travel as the bits of each f64, two f32 words apiece.
    let words: Vec<f32> = report
        .losses
        .iter()
        .flat_map(|l| {
            let bits = l.to_bits();
            [
                f32::from_bits(bits as u32),
                f32::from_bits((bits >> 32) as u32),
            ]
        })
        .collect();
    let everyone: Vec<u32> = (0..world.ranks()).collect();
    let all = comm
        .exchange(&everyone, words)
        .map_err(|e| RunError::Rank {
            rank,
            index: exe.plan.programs.get(rank as usize).map_or(0, Vec::len),
            op: "report",
            message: e.to_string(),
        })?;
    comm.finish();
    let elapsed = started.elapsed();
    let losses = (0..options.steps as usize)
        .map(|s| {
            all.iter()
                .map(|w| match (w.get(2 * s), w.get(2 * s + 1)) {
                    (Some(lo), Some(hi)) => {
                        f64::from_bits(u64::from(lo.to_bits()) | u64::from(hi.to_bits()) << 32)
                    }
                    _ => 0.0,
                })
                .sum()
        })
        .collect();
    Ok((
        TrainReport {
            losses,
            ..TrainReport::default()
        },
        elapsed,
    ))
}

/// Whole tensors, by name, from ranks' slices of them.
fn assemble(
    p: &Prepared<'_>,
    list: Vec<&(ValueId, Slice, Vec<f32>)>,
) -> BTreeMap<String, Vec<f32>> {
    let g = p.exe.graph;
    let mut full: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for (w, slice, data) in list {
        let Some(whole) = p.exe.weights.tensors.get(w) else {
            continue;
        };
        let entry = full
            .entry(g.value(*w).name.clone())
            .or_insert_with(|| vec![0.0; whole.len()]);
        place_into(entry, data, slice, &whole.shape);
    }
    full
}

fn assemble_report(
    p: &Prepared<'_>,
    reports: Vec<RankReport>,
    options: &TrainOptions,
) -> TrainReport {
    let losses = (0..options.steps as usize)
        .map(|s| {
            reports
                .iter()
                .map(|r| r.losses.get(s).copied().unwrap_or(0.0))
                .sum()
        })
        .collect();
    let total: usize = p
        .exe
        .info
        .ty(p.output.1)
        .shape
        .as_sizes()
        .map_or(0, |s| s.iter().product::<u64>() as usize);
    let mut output = vec![0.0f32; total];
    let mut pieces: Vec<&(usize, Vec<f32>)> = reports.iter().flat_map(|r| &r.output).collect();
    pieces.sort_by_key(|(start, _)| *start);
    for (start, data) in pieces {
        if let Some(dst) = output.get_mut(*start..*start + data.len()) {
            dst.copy_from_slice(data);
        }
    }
    let mut out = TrainReport {
        losses,
        first_output: output,
        ..TrainReport::default()
    };
    out.weights = assemble(p, reports.iter().flat_map(|r| &r.weights).collect());
    out.first_gradients = assemble(p, reports.iter().flat_map(|r| &r.gradients).collect());
    out
}
