//! The CPU executor of `ralpc-plan/3`: every rank a thread, running its program in order
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
//! Activation recomputation is in `recompute`, ZeRO's sharded gradients and steps in `zero`.
//! A value computed from constants alone that a layer reads but no layer computes (an
//! anchor grid too large to fold) is computed by every rank reading it (`derived`).
//!
//! Gradients of a tensor read by several ranks with the same share are identical copies
//! after the plan's input-gradient sums, so a producer pastes the pieces it gets back and
//! checks that they cover what it holds. Anything the plan does not deliver is an error
//! naming the rank, the instruction and the tensor — never a silent zero.
//!
//! A rank's failure is typed ([`RankError`]): a node failing on its values, a peer gone or
//! silent, an injected fault, a layout not executable yet — or, the plan having been
//! checked before it ran, a disagreement between the plan and what the rank holds, or a
//! panic: ralpc's own bug ([`RunError::is_bug`], exit 101 in the CLI).
//!
//! A convolution or pooling split by rows computes each piece from its rows and the halo
//! around them, exchanged as the plan's halo messages say (`halo`).
//!
//! Not executable yet (refused with a clear error): row-parallel dense layers with a fused
//! epilogue other than adds (of a bias, or of a residual each rank adds its feature slice
//! of); a loss over logits split by classes; the asynchronous (PipeDream) schedule. A
//! tensor held whole by replicas (a row-parallel layer's output, a LayerNorm held by a
//! tensor-parallel group) whose consumer reads a part of it fails in backward naming the
//! gradient the other replicas lack: the plan does not all-gather it yet. Batch
//! normalization is synchronized (`batch_stats`): the whole batch's statistics, as on
//! one device.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ralpc_codegen::layout::{
    carrier, edge_kinds, epilogue_reads_as, first_replica, input_gradient_sums, LayerKind, Split,
    View,
};
use ralpc_codegen::plan::{BufferKind, Instruction, Plan};
use ralpc_codegen::tag::{Tag, Tags};
use ralpc_ir::{Binary, Graph, GraphInfo, NodeId, Op, Scalar, ValueId};

use super::floats::{self, Floats, ReadBackFailed};
use super::graph::{self, Grads, Record, Values, Weights};
use super::kernels;
use super::ops::{Env, Mode};
pub use super::region::Axes;
use super::region::{crop, dims, fill, intersect, interval, reframe, share, volume, Region, Slice};
use super::tensor::{ints_to_words, words_to_ints, Data, Tensor};
use super::train::{Dataset, TrainOptions, TrainReport};
use crate::cuda::error::DeviceError;
use crate::dist::comm::{AbortOnPanic, Comm, CommError, World};

mod arrivals;
mod batch_stats;
mod buckets;
mod checkpoint;
mod derived;
mod epilogue;
mod experts;
mod failure;
mod gates;
mod halo;
mod heads;
mod layout;
mod loss;
mod passes;
mod prepare;
mod recompute;
mod release;
mod released;
mod resolve;
mod tied;
mod transfers;
mod vocabulary;
mod zero;

use checkpoint::{assemble, Collector};
pub use checkpoint::{Checkpoint, CheckpointSink, SinkError};
use failure::{bug, keep, kernel_failure};
pub use failure::{Fault, FaultKind, RankError, RunError, KILLED};
use prepare::after;

use layout::BatchAxis;

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

/// What a loss compares the output with.
#[derive(Clone, Copy, Debug)]
pub enum Truth<'a> {
    /// Each row's class, the output's rows of `classes` logits (cross-entropy).
    Classes {
        /// Per row.
        labels: &'a [i64],
        /// Logits per row.
        classes: usize,
    },
    /// Each element's target (squared error).
    Targets(&'a [f32]),
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
    /// One step of SGD with momentum: `velocity ← momentum·velocity + grad`, `weight ←
    /// weight − lr·velocity`, where the three are (on the host here; a device keeps its
    /// results resident).
    ///
    /// The three have one length (the interpreter checks).
    ///
    /// # Errors
    /// The device failed.
    fn sgd_momentum(
        &self,
        weight: &mut Floats,
        velocity: &mut Floats,
        grad: &Floats,
        lr: f32,
        momentum: f32,
    ) -> Result<(), graph::ExecError> {
        kernels::sgd_momentum(weight.make_mut(), grad, velocity.make_mut(), lr, momentum);
        Ok(())
    }
    /// Runs batch normalization `id` forward in training mode, normalizing by the
    /// statistics `sum` adds up over the ranks holding its channels, as
    /// [`graph::batch_norm_synced`].
    ///
    /// # Errors
    /// As [`graph::batch_norm_synced`], or the device failed.
    fn batch_norm_synced(
        &self,
        graph: &Graph,
        id: NodeId,
        values: &mut Values,
        sum: graph::GroupSum<'_>,
    ) -> Result<Record, graph::ExecError> {
        graph::batch_norm_synced(graph, id, values, sum)
    }
    /// Its backward pass, as [`graph::batch_norm_synced_backward`].
    ///
    /// # Errors
    /// As [`graph::batch_norm_synced_backward`], or the device failed.
    fn batch_norm_synced_backward(
        &self,
        graph: &Graph,
        record: &Record,
        values: &Values,
        grads: &mut Grads,
        sum: graph::GroupSum<'_>,
    ) -> Result<(), graph::ExecError> {
        graph::batch_norm_synced_backward(graph, record, values, grads, sum)
    }
    /// `f`, a tensor a rank keeps through the run (its piece of a weight), placed where
    /// this device computes and only there: a device uploads it now and the host's copy
    /// goes, so that the host never holds every rank's piece of a large model at once.
    ///
    /// # Errors
    /// The device failed.
    fn hold(&self, f: Floats) -> Result<Floats, DeviceError> {
        Ok(f)
    }
    /// Whether it computes the values (a counting device only tallies the work and the
    /// memory, and its losses mean nothing).
    fn computes_values(&self) -> bool {
        true
    }

    /// `n` zeros, made where this device computes (no upload).
    ///
    /// # Errors
    /// The device failed.
    fn zeros(&self, n: usize) -> Result<Floats, graph::ExecError> {
        Ok(vec![0.0; n].into())
    }
    /// `a + b`, elementwise (one length): on the device where they are resident.
    ///
    /// # Errors
    /// The device failed.
    fn add(&self, a: Floats, b: &Floats) -> Result<Floats, graph::ExecError> {
        let mut a = a;
        kernels::add(a.make_mut(), b);
        Ok(a)
    }
    /// Sums `bucket` (its tensors in order: gradients, partial sums) over `group` in
    /// place, with the device's own collective when it has one over that group (the
    /// tensors stay on the device); `Ok(false)`: it has none, nothing changed, and the
    /// interpreter sums through its communicator. Every member answers alike.
    ///
    /// # Errors
    /// The device or the collective failed.
    fn all_reduce(&self, group: &[u32], bucket: &mut [Floats]) -> Result<bool, graph::ExecError> {
        let _ = (group, bucket);
        Ok(false)
    }
    /// Every member's `data` (their lengths may differ), in the order of `group`
    /// (sorted), gathered with the device's own collective when it has one over that group
    /// (the elements stay on devices); `None`: it has none, nothing was sent, and the
    /// interpreter gathers through its communicator. Every member answers alike.
    ///
    /// # Errors
    /// The device or the collective failed.
    fn all_gather(
        &self,
        group: &[u32],
        data: &Floats,
    ) -> Result<Option<Vec<Floats>>, graph::ExecError> {
        let _ = (group, data);
        Ok(None)
    }
    /// The box `piece` of `x`, a row-major tensor holding the box `holder` (one range
    /// per axis), cut where `x`'s elements are: on the device, when they are resident there
    /// alone. `None`: it is cut on the host.
    ///
    /// # Errors
    /// The device failed.
    fn crop(
        &self,
        x: &Floats,
        holder: &[std::ops::Range<usize>],
        piece: &[std::ops::Range<usize>],
    ) -> Result<Option<Floats>, graph::ExecError> {
        let _ = (x, holder, piece);
        Ok(None)
    }
    /// The loss of `output` against `truth`, normalized over `total` (rows for a
    /// cross-entropy, elements for a squared error) of the global batch, and the output's
    /// gradient: on the device, when `output` is resident there (the gradient stays
    /// there; the labels or targets go up, the per-row losses come back). `None`: the host
    /// computes it.
    ///
    /// # Errors
    /// The device failed.
    fn loss(
        &self,
        output: &Floats,
        truth: Truth<'_>,
        total: usize,
    ) -> Result<Option<(f64, Floats)>, graph::ExecError> {
        let _ = (output, truth, total);
        Ok(None)
    }
    /// Per row of one class piece of logits (`classes` of them per row, the piece's first
    /// being class `first`), its max, `Σ exp(x − max)` and the label's logit, as
    /// [`kernels::class_piece_statistics`]: computed on the device when the logits are
    /// resident there (only these come back). `None`: on the host.
    ///
    /// # Errors
    /// The device failed.
    fn class_statistics(
        &self,
        logits: &Floats,
        labels: &[i64],
        classes: usize,
        first: usize,
    ) -> Result<Option<Vec<f32>>, graph::ExecError> {
        let _ = (logits, labels, classes, first);
        Ok(None)
    }
    /// One class piece's logits gradient, `(exp(x − lse) − onehot) / scale`, from each
    /// row's log-sum-exp over all its classes: on the device when the logits are resident
    /// there (the gradient stays there). `None`: on the host.
    ///
    /// # Errors
    /// The device failed.
    fn class_piece_gradient(
        &self,
        logits: &Floats,
        lse: &[f32],
        labels: &[i64],
        first: usize,
        scale: f32,
    ) -> Result<Option<Floats>, graph::ExecError> {
        let _ = (logits, lse, labels, first, scale);
        Ok(None)
    }
    /// `x` (a row-major tensor holding the box `holder`) with `part`, the elements of its
    /// box `piece`, added there: on the device, when `x` is resident there (`part` is
    /// uploaded if it is not). `Err(x)`: it is not, and the host adds them.
    ///
    /// # Errors
    /// The device failed.
    fn accumulate(
        &self,
        x: Floats,
        holder: &[std::ops::Range<usize>],
        piece: &[std::ops::Range<usize>],
        part: &Floats,
    ) -> Result<Result<Floats, Floats>, graph::ExecError> {
        let _ = (holder, piece, part);
        Ok(Err(x))
    }
    /// `x` (a row-major tensor holding the box `holder`) with its box `piece` replaced by
    /// `part`: in place on the device, when `x` is resident there (`part` is uploaded if it
    /// is not). `Err(x)`: it is not, and the host writes it.
    ///
    /// # Errors
    /// The device failed.
    fn overwrite(
        &self,
        x: Floats,
        holder: &[std::ops::Range<usize>],
        piece: &[std::ops::Range<usize>],
        part: &Floats,
    ) -> Result<Result<Floats, Floats>, graph::ExecError> {
        let _ = (holder, piece, part);
        Ok(Err(x))
    }
    /// The box `need` assembled from `parts` (each the box it holds and its elements,
    /// row-major), where their elements are: on the device, when they are all resident
    /// there alone and cover `need` once. `None`: it is assembled on the host.
    ///
    /// # Errors
    /// The device failed.
    fn paste(
        &self,
        need: &[std::ops::Range<usize>],
        parts: &[floats::Piece<'_>],
    ) -> Result<Option<Floats>, graph::ExecError> {
        let _ = (need, parts);
        Ok(None)
    }
    /// Sends `data` to rank `to` under `tag` with the device's own point-to-point path
    /// (the tensor stays on devices); `Ok(false)`: it has none, and the interpreter sends
    /// through its communicator. Every rank of a run answers alike for the same peer.
    ///
    /// # Errors
    /// The device or the transfer failed.
    fn send(&self, to: u32, tag: u64, data: &Floats) -> Result<bool, graph::ExecError> {
        let _ = (to, tag, data);
        Ok(false)
    }
    /// Receives the `n` elements rank `from` sent under `tag` through
    /// [`Compute::send`]'s path; `None` when there is none.
    ///
    /// # Errors
    /// The device or the transfer failed, or the message has another size.
    fn recv(&self, from: u32, tag: u64, n: usize) -> Result<Option<Floats>, graph::ExecError> {
        let _ = (from, tag, n);
        Ok(None)
    }
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
pub type ComputeFactory<'a> = dyn Fn(u32) -> Result<Box<dyn Compute>, DeviceError> + Sync + 'a;

/// Everything a run reads.
pub struct Executable<'a> {
    /// The plan.
    pub plan: &'a Plan,
    /// The model, bound at the plan's global batch.
    pub graph: &'a Graph,
    /// Its verification at that batch.
    pub info: &'a GraphInfo,
    /// Its weights for the whole model (read or seeded).
    pub weights: &'a Weights,
    /// The global batch's inputs and labels.
    pub data: &'a Dataset,
    /// The model verified at another batch size (what a rank's share of a microbatch
    /// sees): folded shape arithmetic that depends on the batch is read from it.
    pub info_at: &'a (dyn Fn(u64) -> Result<GraphInfo, Refusal> + Sync),
    /// Where the ranks compute: the CPU when absent.
    pub compute: Option<&'a ComputeFactory<'a>>,
}

/// A piece of a gradient: the region and its values.
type GradPiece = (Region, Floats);

/// A buffer an instruction touches: its kind, layer, microbatch, and whether it writes it.
type Touch = (BufferKind, Option<u32>, Option<u32>, bool);

struct EdgeInfo {
    producer: usize,
    consumer: usize,
    value: ValueId,
    /// Its gradient returns as a reduce-scatter (the lowering's `Gather { scatter }`).
    scattered: bool,
    /// Its consumer is split by rows and reads the rows around each piece (`halo`).
    halo: bool,
    /// The kinds its tensor is held and read as ([`edge_kinds`]: an attention layer reads
    /// what is broadcast over its heads whole).
    held_as: LayerKind,
    read_as: LayerKind,
    /// The earlier edge whose gather brings its tensor (`LayoutEdge::shares`).
    shares: Option<usize>,
    /// The earlier edge whose gradient's collective returns its input gradient, added
    /// to that edge's (`LayoutEdge::gradient_with`).
    gradient_with: Option<usize>,
    /// A later edge shares the gather it reads: its pieces stay for that edge.
    passes_on: bool,
    /// Its consumer keeps only its piece and gathers it again for its backward pass
    /// (`LayoutEdge::regathered`).
    regathered: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Edge(usize),
    GraphInput,
    Constant,
    Folded,
    /// Computed from constants by every rank that reads it (`derived`).
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
    /// Split by rows (sequence or context parallelism): the shape constants its nodes
    /// read, made local to its rows after `local` (`Prepared::split_row_shapes`).
    local_rows: heads::LocalShapes,
    /// The weights whose gradients its bucket all-reduces: those it reads first, but for
    /// tied weights the plan all-reduces on their own.
    owned: Vec<ValueId>,
    /// Split by rows: the halo its window reads (`halo`).
    halo: Option<halo::LayerHalo>,
}

impl LayerExec {
    fn view_out(&self) -> View {
        View::output(self.kind, self.split, self.first)
    }

    fn view_in(&self) -> View {
        View::input(self.kind, self.split, self.first)
    }

    /// The share of an input it reads as a `read_as` layer would ([`edge_kinds`]).
    fn view_in_as(&self, read_as: LayerKind) -> View {
        View::input(read_as, self.split, self.first)
    }

    /// The share of an output it holds as a `held_as` layer would ([`edge_kinds`]).
    fn view_out_as(&self, held_as: LayerKind) -> View {
        View::output(held_as, self.split, self.first)
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
    /// Tensors of four or more axes whose features are the last (`prepare::features_last`).
    features_last: BTreeSet<ValueId>,
    /// Feature axes found by following an output-feature split through the ops after its
    /// product ([`Prepared::split_epilogues`]).
    feature_axes: BTreeMap<ValueId, usize>,
    /// Row axes found by following a row split through a layer's reshapes
    /// ([`Prepared::split_row_shapes`]: a projection writing its heads apart,
    /// `[b, s, heads, d]`, holds its rows on the second axis).
    row_axes: BTreeMap<ValueId, usize>,
    /// Tied weights with their own all-reduce: every holder keeps a whole copy, cuts what
    /// each layer holds from it, and adds each layer's gradient at its place.
    tied: BTreeSet<ValueId>,
    infos: Mutex<BTreeMap<u64, std::sync::Arc<GraphInfo>>>,
    /// Folded values by (value, batch), made once: a device keeps its upload of one with
    /// it, so the next step finds it there.
    folded: Mutex<BTreeMap<(ValueId, u64), Tensor>>,
    /// Per value, its batch axis and entries per sample ([`Prepared::batch_axis`]).
    batch_axes: Mutex<BTreeMap<ValueId, Option<BatchAxis>>>,
    env: Env,
    /// Per layer, the recomputed run holding it (first and last layer).
    recompute: Vec<Option<(usize, usize)>>,
    /// Fused tensors distributed by groups along their feature axis (a QKV projection's
    /// output read by attention split by heads: each rank holds its piece of each group).
    groups: BTreeMap<ValueId, usize>,
    /// Values carried by another after the planner's rewrite (the plan's layout).
    aliases: BTreeMap<ValueId, ValueId>,
}

fn setup(message: impl Into<String>) -> RunError {
    RunError::Setup(message.into())
}

/// Why preparing a plan refuses it before any rank starts: a shape or value the executor
/// needs that the model does not give (at that batch, or statically), a layer that cannot
/// run on a piece of its heads or rows. The plan's or the model's fault, a
/// [`RunError::Setup`] once its layer is named; met after the plan was prepared, the same
/// reason is ralpc's bug ([`Refusal::bug`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl Refusal {
    /// The reason met by a rank after preparation checked it: a bug.
    fn bug(self) -> RankError {
        failure::bug(self.0)
    }
}

impl Prepared<'_> {
    /// The value that carries `v`.
    fn carrier(&self, v: ValueId) -> ValueId {
        carrier(&self.aliases, v)
    }
}

/// A layer's forward pass on one microbatch, kept for its backward pass.
struct LayerRun {
    values: Values,
    records: Vec<Record>,
    /// The region each output holds.
    regions: BTreeMap<ValueId, Region>,
    /// Outputs computed over more rows than they hold (a context-parallel attention core
    /// computes every query row of the sequence it gathered and keeps its piece): the
    /// rows computed and the whole value, for the backward pass.
    every_row: BTreeMap<ValueId, (Region, Tensor)>,
    /// Whether what its backward reads was dropped for recomputation.
    dropped: bool,
    /// The weights (its input, the weight) ZeRO-3 released while it waited for its
    /// backward, set again from the gathered weights when the backward runs.
    lent: Vec<(ValueId, ValueId)>,
    /// A mixture of experts run as a dispatch: its records are the router's, and its
    /// backward reads all it held (`experts.rs`).
    dispatched: bool,
}

/// A layer's weight gradients of one microbatch, by weight (none where the backward made
/// none).
pub(super) type WeightGradients = Vec<(ValueId, Option<Floats>)>;

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
    /// Per step run here, wall-clock seconds from the end of the one before (or from the
    /// start) to its end.
    step_seconds: Vec<f64>,
}

struct Rank<'p, 'a> {
    p: &'p Prepared<'a>,
    rank: u32,
    comm: Comm,
    options: TrainOptions,
    weights: BTreeMap<ValueId, (Slice, Tensor)>,
    /// Per weight, its gradient so far this step, where it was computed.
    grads: BTreeMap<ValueId, Floats>,
    /// Per weight whose gradient is reduce-scattered (ZeRO), the elements of the summed
    /// gradient this rank owns and their sum so far this step, where it was computed.
    gradient_shares: BTreeMap<ValueId, (std::ops::Range<usize>, Floats)>,
    /// Per weight, its momentum, where the last step left it.
    velocity: BTreeMap<ValueId, Floats>,
    /// Per weight a sharded optimizer updates here, the elements of its momentum this
    /// rank owns (the rest are its replicas').
    owned_momentum: BTreeMap<ValueId, std::ops::Range<usize>>,
    runs: BTreeMap<(usize, u32), LayerRun>,
    pieces: BTreeMap<(usize, u32), Vec<(Region, Tensor)>>,
    grad_pieces: BTreeMap<(usize, u32), Vec<GradPiece>>,
    /// Per (edge, microbatch), the gradient of the input this rank's consumer read, over
    /// the region it read, where it was computed.
    input_grads: BTreeMap<(usize, u32), (Region, Floats)>,
    pending_sums: BTreeMap<(usize, u32), VecDeque<usize>>,
    /// The layers this rank makes weight gradients of in passes of their own
    /// ([`Instruction::WeightGradient`]), and per (layer, microbatch) the gradients its
    /// backward made for that pass.
    weight_passes: BTreeSet<usize>,
    owed_weight_gradients: BTreeMap<(usize, u32), WeightGradients>,
    /// Halo rows and their gradients in flight.
    halos: halo::HaloState,
    /// Messages received device to device in their senders' order.
    arrivals: arrivals::Arrivals,
    /// Per (output layer, microbatch), every class piece's loss statistics.
    loss_statistics: BTreeMap<(usize, u32), Vec<Vec<f32>>>,
    /// Per (edge, microbatch), the input a recomputed run keeps from outside the run.
    checkpoints: BTreeMap<(usize, u32), Tensor>,
    /// Per instruction, the buffers it reads and writes: (kind, layer, microbatch, writes).
    touches: BTreeMap<u32, Vec<Touch>>,
    /// After which instruction a layer's outputs are read by its backward alone.
    last_forward_uses: BTreeMap<u32, Vec<(usize, u32)>>,
    /// Under ZeRO-3, after which instruction the weights of which all-gathers go back to
    /// this rank's shares ([`released`]).
    weight_releases: BTreeMap<u32, Vec<u32>>,
    /// ZeRO-3's weights held as this rank's shares until their next gather.
    released: BTreeMap<ValueId, released::Released>,
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
    ) -> Result<Self, RunError> {
        let compute = match p.exe.compute {
            Some(make) => make(rank).map_err(|source| RunError::Device { rank, source })?,
            None => Box::new(OnCpu),
        };
        let mut weights = BTreeMap::new();
        let mut velocity = BTreeMap::new();
        for l in &p.layers {
            let Some(k) = l.holds(rank) else { continue };
            for &w in &l.weights {
                let model = p
                    .exe
                    .weights
                    .tensors
                    .get(&w)
                    .ok_or_else(|| setup("a weight is missing"))?;
                let name = &p.exe.graph.value(w).name;
                let restored;
                let full = match resume {
                    Some(c) => {
                        let data = c
                            .weights
                            .get(name)
                            .filter(|d| d.len() == model.len())
                            .ok_or_else(|| {
                                setup(format!(
                                    "the checkpoint has no weight '{name}' of {} elements",
                                    model.len()
                                ))
                            })?;
                        restored = Tensor::f32(model.shape.clone(), data.clone());
                        &restored
                    }
                    None => model,
                };
                let slice = if p.tied.contains(&w) {
                    p.tied_holding(rank, w)
                } else {
                    p.slice_of(l, k, w)
                };
                if let Some((held, _)) = weights.get(&w) {
                    if *held != slice {
                        return Err(setup(format!(
                            "the weight '{name}' is read by several layers that hold different \
                             pieces of it on rank {rank} (layer {} holds {slice:?}, an earlier \
                             one {held:?}); give them the same split",
                            l.name
                        )));
                    }
                    continue;
                }
                let first = l.first_slice(k);
                if let Some(v) = resume.and_then(|c| c.velocity.get(name)) {
                    let v = Tensor::f32(model.shape.clone(), v.clone());
                    if let Some(data) = share(&v, &slice, first).floats() {
                        velocity.insert(w, Floats::from(data.to_vec()));
                    }
                }
                // The rank's own: a device's uploads of it go when the rank steps it.
                let mut held = share(full, &slice, first);
                if let Data::F32(f) = &held.data {
                    let own = compute
                        .hold(f.detached())
                        .map_err(|source| RunError::Device { rank, source })?;
                    held.data = Data::F32(own);
                }
                weights.insert(w, (slice.clone(), held));
            }
        }
        let touches = buckets::touches(p.exe.plan, rank);
        let weight_releases = released::weight_releases(p.exe.plan, rank, &touches);
        Ok(Rank {
            p,
            rank,
            comm,
            options,
            weights,
            grads: BTreeMap::new(),
            gradient_shares: BTreeMap::new(),
            velocity,
            owned_momentum: BTreeMap::new(),
            runs: BTreeMap::new(),
            pieces: BTreeMap::new(),
            grad_pieces: BTreeMap::new(),
            input_grads: BTreeMap::new(),
            pending_sums: BTreeMap::new(),
            weight_passes: p.exe.plan.programs[rank as usize]
                .iter()
                .filter_map(|i| match *i {
                    Instruction::WeightGradient { layer, .. } => Some(layer as usize),
                    _ => None,
                })
                .collect(),
            owed_weight_gradients: BTreeMap::new(),
            halos: halo::HaloState::default(),
            arrivals: arrivals::Arrivals::new(p, rank),
            loss_statistics: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            touches,
            last_forward_uses: release::last_forward_uses(p.exe.plan, rank),
            weight_releases,
            released: BTreeMap::new(),
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
            compute,
        })
    }

    /// How layer `l` holds weight `w` on this rank: as the rank keeps it, or, for a tied
    /// weight, the piece the layer's split gives it.
    fn piece(&self, l: &LayerExec, w: ValueId) -> Option<Slice> {
        let slice = self.held_slice(w)?;
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

    /// The first weight this rank holds on the host with a value that is not finite, said
    /// in words (a loss can stay finite while weights are NaN: ReLU maps NaN to 0). Weights
    /// resident on a device are not read back for it: the loss, and the checkpoint's own
    /// check, still stop a diverged run there.
    fn non_finite_weight(&self) -> Option<String> {
        self.weights.iter().find_map(|(&w, (_, t))| {
            let Data::F32(floats) = &t.data else {
                return None;
            };
            if !floats.on_host() || floats.is_released() {
                return None;
            }
            let x = t.floats()?.iter().find(|x| !x.is_finite())?;
            let name = &self.p.exe.graph.value(w).name;
            Some(format!("weight '{name}' holds {x} after its update"))
        })
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
        let mut step_started = Instant::now();
        for step in self.first_step..self.options.steps {
            self.step = step;
            self.report.losses.push(0.0);
            self.restart_arrivals()
                .map_err(|cause| RunError::rank(self.rank, 0, "recv", cause))?;
            for (i, instruction) in program.iter().enumerate() {
                let me = self.rank;
                let fail = move |cause: RankError| RunError::rank(me, i, instruction.op(), cause);
                let fault = self.fault.filter(|f| {
                    step == self.first_step && f.rank == self.rank && f.instruction == i
                });
                let panics = fault.is_some_and(|f| f.kind == FaultKind::Panic);
                if let Some(f) = fault {
                    match f.kind {
                        FaultKind::Panic => {}
                        FaultKind::Exit => {
                            self.comm.at(i);
                            return Err(fail(RankError::Killed));
                        }
                        FaultKind::Hang => {
                            // Busy with nothing, never reaching the others, until they
                            // give up.
                            self.comm.at(i);
                            while !self.comm.failed() {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            return Err(fail(RankError::Killed));
                        }
                    }
                }
                self.comm.at(i);
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if panics {
                        panic!("injected fault");
                    }
                    self.execute(i as u32, instruction)?;
                    self.release_weights_after(i as u32)
                }))
                .unwrap_or_else(|payload| {
                    if let Some(failed) = payload.downcast_ref::<ReadBackFailed>() {
                        return Err(RankError::ReadBack(failed.0.clone()));
                    }
                    let what = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(if panics {
                        RankError::InjectedPanic
                    } else {
                        RankError::Panicked(what)
                    })
                });
                outcome.map_err(|cause| {
                    let error = fail(cause);
                    self.comm.abort(&error.to_string());
                    error
                })?;
                self.release_after(i as u32);
            }
            // A diverged run stops here: no later step can recover, and the checkpoint
            // due now would replace the last good one.
            let values = self.compute.computes_values();
            let loss = self
                .report
                .losses
                .last()
                .filter(|l| values && !l.is_finite());
            let diverged = loss
                .map(|loss| format!("this rank's loss is {loss}"))
                .or_else(|| values.then(|| self.non_finite_weight()).flatten());
            if let Some(what) = diverged {
                let cause = RankError::Loss(format!(
                    "step {}: {what}; the training diverged (a smaller --lr may not), the \
                     last checkpoint is kept",
                    step + 1
                ));
                let error = RunError::rank(self.rank, program.len(), "loss", cause);
                self.comm.abort(&error.to_string());
                return Err(error);
            }
            if self
                .checkpoint_every
                .is_some_and(|n| n > 0 && (step + 1) % n == 0)
            {
                self.checkpoint(step + 1).map_err(|cause| {
                    let error = RunError::rank(self.rank, program.len(), "checkpoint", cause);
                    self.comm.abort(&error.to_string());
                    error
                })?;
            }
            let now = Instant::now();
            self.report
                .step_seconds
                .push(now.duration_since(step_started).as_secs_f64());
            step_started = now;
        }
        self.restart_arrivals()
            .map_err(|cause| RunError::rank(self.rank, program.len(), "recv", cause))?;
        self.comm.finish();
        if !self.options.report_tensors {
            return Ok(());
        }
        self.all_weights_whole()
            .map_err(|cause| RunError::rank(self.rank, program.len(), "report", cause))?;
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

    fn execute(&mut self, index: u32, instruction: &Instruction) -> Result<(), RankError> {
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
            Instruction::WeightGradient {
                layer, microbatch, ..
            } => self.weight_gradient(layer as usize, microbatch),
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
                    .ok_or_else(|| bug(format!("'{name}' is not a tied weight of this plan")))?;
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

    fn group(&self, g: u32) -> Result<Vec<u32>, RankError> {
        self.p
            .exe
            .plan
            .groups
            .get(g as usize)
            .cloned()
            .ok_or_else(|| bug(format!("group {g} does not exist")))
    }

    /// What a message of `tag` carries.
    fn decode(&self, tag: u64) -> Result<Tag, RankError> {
        let tags = Tags {
            edges: self.p.edges.len(),
            microbatches: self.p.exe.plan.microbatches,
        };
        tags.decode(tag)
            .ok_or_else(|| bug(format!("tag {tag} names no edge")))
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
    let collector = control
        .on_checkpoint
        .map(|on_checkpoint| Collector::threads(ranks, on_checkpoint));
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
                    let mut rank = Rank::new(prepared, r, comm, options, control.resume)?;
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
                    Err(RunError::rank(
                        r as u32,
                        0,
                        "?",
                        RankError::Panicked(String::new()),
                    ))
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
    if let Some(e) = errors.into_iter().min_by_key(RunError::precedence) {
        return Err(e);
    }
    Ok((assemble_report(&prepared, reports, options), elapsed))
}

/// Runs one rank of the plan in this process, the others being other processes of
/// `world` ([`World::connect`]): what `ralpc run` does under a launcher.
///
/// The report's losses are summed over every rank (one last collective of the whole
/// world); its output, weights and gradients stay on their ranks and are left empty.
/// Checkpoints are gathered by rank 0, whose sink alone writes them; every process resumes
/// from the same checkpoint.
///
/// # Errors
/// As [`run`].
pub fn run_process(
    exe: &Executable<'_>,
    options: &TrainOptions,
    control: &Control<'_>,
    world: &World,
    rank: u32,
) -> Result<(TrainReport, Duration), RunError> {
    if world.ranks() != exe.plan.ranks {
        return Err(setup(format!(
            "the launcher started {} processes, but the plan has {} ranks",
            world.ranks(),
            exe.plan.ranks
        )));
    }
    let prepared = Prepared::new(exe)?;
    let collector = control
        .on_checkpoint
        .map(|on_checkpoint| Collector::Processes {
            ranks: world.ranks(),
            on_checkpoint,
        });
    let guard = world.comm(rank);
    let _guard = AbortOnPanic(&guard);
    let started = Instant::now();
    let mut r = Rank::new(&prepared, rank, world.comm(rank), *options, control.resume)?;
    r.fault = control.fault;
    r.checkpoint_every = control.checkpoint_every;
    r.collector = collector.as_ref();
    r.run()?;
    // The rank's own endpoint: its collective numbering continues.
    let (comm, report) = (&r.comm, &r.report);
    // Losses travel as the bits of each f64.
    let bits: Vec<i64> = report.losses.iter().map(|l| l.to_bits() as i64).collect();
    let everyone: Vec<u32> = (0..world.ranks()).collect();
    let all = comm
        .exchange(&everyone, ints_to_words(&bits))
        .map_err(|e| {
            let index = exe.plan.programs.get(rank as usize).map_or(0, Vec::len);
            RunError::rank(rank, index, "report", e.into())
        })?;
    comm.finish();
    let elapsed = started.elapsed();
    let all: Vec<Vec<i64>> = all
        .iter()
        .map(|w| words_to_ints(w).unwrap_or_default())
        .collect();
    let losses = (0..options.steps as usize)
        .map(|s| {
            all.iter()
                .map(|bits| bits.get(s).map_or(0.0, |&b| f64::from_bits(b as u64)))
                .sum()
        })
        .collect();
    Ok((
        TrainReport {
            losses,
            step_seconds: r.report.step_seconds.clone(),
            ..TrainReport::default()
        },
        elapsed,
    ))
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
    let total: usize = match options.report_tensors {
        true => p
            .exe
            .info
            .ty(p.output.1)
            .shape
            .as_sizes()
            .map_or(0, |s| s.iter().product::<u64>() as usize),
        false => 0,
    };
    let mut output = vec![0.0f32; total];
    let mut pieces: Vec<&(usize, Vec<f32>)> = reports.iter().flat_map(|r| &r.output).collect();
    pieces.sort_by_key(|(start, _)| *start);
    for (start, data) in pieces {
        if let Some(dst) = output.get_mut(*start..*start + data.len()) {
            dst.copy_from_slice(data);
        }
    }
    // A step ends when its slowest rank ends it.
    let steps = reports
        .iter()
        .map(|r| r.step_seconds.len())
        .max()
        .unwrap_or(0);
    let step_seconds = (0..steps)
        .map(|s| {
            reports
                .iter()
                .filter_map(|r| r.step_seconds.get(s).copied())
                .fold(0.0, f64::max)
        })
        .collect();
    let mut out = TrainReport {
        losses,
        first_output: output,
        step_seconds,
        ..TrainReport::default()
    };
    out.weights = assemble(p, reports.iter().flat_map(|r| &r.weights).collect());
    out.first_gradients = assemble(p, reports.iter().flat_map(|r| &r.gradients).collect());
    out
}
