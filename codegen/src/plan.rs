//! The executable plan, `ralpc-plan/3` (JSON): for every rank, the ordered instructions of
//! one training iteration, each with the duration the cost model predicts for it.
//!
//! ```json
//! {
//!   "format": "ralpc-plan/3",
//!   "model": { "name": "vgg16/model.onnx", "blake3": "…64 hex digits…", "layers": 22 },
//!   "inputs": "…64 hex digits…",
//!   "cluster": "dgx-a100", "ranks": 8, "batch": 32, "microbatches": 1, "schedule": "1f1b",
//!   "precision": "tf32", "optimizer": "momentum",
//!   "sites": [ { "node": 0, "rack": 0, "nic": 0 }, …one per rank… ],
//!   "strategy": { …a ralpc-strategy/1 file… },
//!   "layers": ["/features/features.0/Conv", …],
//!   "groups": [[0, 1, 2, 3, 4, 5, 6, 7]],
//!   "programs": [
//!     [ { "op": "forward", "layer": 0, "microbatch": 0, "us": 98.7 },
//!       { "op": "send", "to": 1, "bytes": 401408, "tag": 17, "us": 4.7, "latency_us": 3.4 },
//!       { "op": "all_reduce", "group": 0, "bytes": 6924, "us": 21.3 },
//!       { "op": "step", "bytes": 6924, "us": 0.1 } ],
//!     …one list per rank…
//!   ],
//!   "buffers": [
//!     [ { "kind": "activation", "layer": 0, "microbatch": 0, "bytes": 12845056,
//!         "writes": [0], "reads": [1, 57], "live": [0, 57] }, … ],
//!     …one list per rank…
//!   ],
//!   "predicted": { "iteration_time_us": 5974.0, "peak_memory_bytes": 1.9e9,
//!                  "single_gpu_time_us": 40769.0 }
//! }
//! ```
//!
//! Instructions (`op`):
//! * `forward` / `backward` — a layer's compute on one microbatch (its share on this rank);
//! * `send` / `recv` — a point-to-point message; a send and its receive carry the same
//!   `tag`, `bytes` and endpoints; consecutive messages of one tag on a rank form a group
//!   that runs concurrently (one `latency_us`);
//! * `all_reduce` — a collective over `groups[group]`: gradient buckets, the partial sums of
//!   a row-parallel layer, a parameter-split layer's input gradient, and (`"tied": NAME`)
//!   the gradient of a weight several layers on different ranks read, over all of them,
//!   before the step;
//! * `all_gather`, `reduce_scatter`, `all_to_all` — resharding recognized as a collective
//!   (a split tensor read whole by the same ranks, its gradient, an exchange between two
//!   splits of the same ranks); every member enters a group's collectives in the same
//!   order;
//! * `step` — the optimizer update of `bytes` of this rank's weights: all but the tied ones
//!   with their own all-reduce, each of which (`"tied": NAME`) follows its all-reduce.
//!
//! Buffers (`buffers[rank]`) name the memory each rank's instructions use, by instruction
//! index: which write it, which read it, and `live: [first, last]` — allocated before
//! instruction `first` runs and freed after `last`. Weights, gradients, optimizer state,
//! stashed weight versions and the workspace live for the whole program; activations
//! (written by a forward, read by sends and the backward), received messages and input
//! gradients live from their first write to their last read. Each rank's peak memory
//! follows from the instruction order ([`Plan::peak_memory_bytes`]), and the simulator
//! derives every data dependency from them (an instruction waits for the last earlier
//! writer of each buffer it reads). Buffer sizes follow from the model, the strategy,
//! `precision` and `optimizer` alone: `ralpc run` lowers the strategy again and refuses a
//! plan whose sizes differ, so a size in the file is never trusted.
//!
//! [`Plan::parse`] validates everything before a plan is used; [`Plan::check_model`] refuses
//! a plan made for another model.

use std::collections::BTreeMap;

use ralpc_passes::cluster::Precision;
use ralpc_passes::cost::Optimizer;
use ralpc_passes::plan::StrategyFile;
use serde::{Deserialize, Serialize};

use crate::layout::Layout;

/// The format tag this version writes and reads.
pub const FORMAT: &str = "ralpc-plan/3";

/// The model a plan was made for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelRef {
    /// Its file name.
    pub name: String,
    /// Its path as given when planning (relative to where ralpc ran), so that `ralpc run`
    /// finds it; absent in plans made from bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// blake3 of the model file's bytes, lower-case hex.
    pub blake3: String,
    /// Its placement units.
    pub layers: u32,
    /// The input shapes it was planned at (`--input`, batch included), where they
    /// are not the model's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, Vec<u64>>,
    /// The inputs it was planned with a value for (`--value`): constants of the model.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, Vec<f64>>,
}

/// One instruction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Instruction {
    /// A layer's forward pass on one microbatch.
    Forward {
        /// Layer index.
        layer: u32,
        /// Microbatch.
        microbatch: u32,
        /// Predicted µs.
        us: f64,
    },
    /// A layer's forward pass run again just before its backward (activation
    /// recomputation): it makes again what the backward reads, which its first forward
    /// dropped.
    Recompute {
        /// Layer index.
        layer: u32,
        /// Microbatch.
        microbatch: u32,
        /// Predicted µs.
        us: f64,
    },
    /// A layer's backward pass on one microbatch: its input and weight gradients, or only
    /// its input gradients when the program has a [`Instruction::WeightGradient`] of the
    /// layer (zero-bubble schedules).
    Backward {
        /// Layer index.
        layer: u32,
        /// Microbatch.
        microbatch: u32,
        /// Predicted µs.
        us: f64,
    },
    /// A layer's weight gradients on one microbatch, after its backward pass, from what
    /// that read: the `W` pass of a zero-bubble schedule.
    WeightGradient {
        /// Layer index.
        layer: u32,
        /// Microbatch.
        microbatch: u32,
        /// Predicted µs.
        us: f64,
    },
    /// Send a message.
    Send {
        /// Receiving rank.
        to: u32,
        /// Size.
        bytes: u64,
        /// Matches the receive.
        tag: u64,
        /// Predicted µs.
        us: f64,
        /// The link latency inside `us`: the messages of one tag run as a group (NCCL's
        /// grouped send/receive) and pay it once.
        latency_us: f64,
    },
    /// Receive a message.
    Recv {
        /// Sending rank.
        from: u32,
        /// Size.
        bytes: u64,
        /// Matches the send.
        tag: u64,
        /// Predicted µs.
        us: f64,
        /// The link latency inside `us`.
        latency_us: f64,
    },
    /// All-reduce over a communicator group.
    AllReduce {
        /// Index into [`Plan::groups`].
        group: u32,
        /// Size of the reduced tensor.
        bytes: u64,
        /// Predicted µs.
        us: f64,
        /// The links' latency inside `us` (absent: none): collectives sharing a server's
        /// network overlap in it.
        #[serde(default, skip_serializing_if = "is_zero")]
        latency_us: f64,
        /// The weight whose gradient it sums over every holder, for a weight several
        /// layers read (a tied embedding) placed differently; absent for the rest, whose
        /// buffers say what they reduce.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tied: Option<String>,
    },
    /// All-gather over a communicator group: each member holds `bytes / members` and
    /// ends with all `bytes` (resharding a split tensor to ranks that each read it whole).
    AllGather {
        /// Index into [`Plan::groups`].
        group: u32,
        /// Size of the gathered tensor.
        bytes: u64,
        /// Predicted µs.
        us: f64,
        /// The links' latency inside `us` (absent: none): collectives sharing a server's
        /// network overlap in it.
        #[serde(default, skip_serializing_if = "is_zero")]
        latency_us: f64,
    },
    /// Reduce-scatter over a communicator group: each member holds a partial sum of
    /// `bytes` and ends with its reduced `1/members` share (an all-gather's gradient).
    ReduceScatter {
        /// Index into [`Plan::groups`].
        group: u32,
        /// Size of the reduced tensor.
        bytes: u64,
        /// Predicted µs.
        us: f64,
        /// The links' latency inside `us` (absent: none): collectives sharing a server's
        /// network overlap in it.
        #[serde(default, skip_serializing_if = "is_zero")]
        latency_us: f64,
    },
    /// All-to-all over a communicator group: each member sends `bytes` to every other
    /// (resharding between two splits of the same ranks).
    AllToAll {
        /// Index into [`Plan::groups`].
        group: u32,
        /// Bytes each member sends to each other member.
        bytes: u64,
        /// Predicted µs.
        us: f64,
        /// The links' latency inside `us` (absent: none): collectives sharing a server's
        /// network overlap in it.
        #[serde(default, skip_serializing_if = "is_zero")]
        latency_us: f64,
    },
    /// Optimizer update.
    Step {
        /// Weight bytes updated on this rank.
        bytes: u64,
        /// Predicted µs.
        us: f64,
        /// The tied weight it updates, after that weight's own all-reduce; absent: every
        /// other weight of the rank.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tied: Option<String>,
        /// ZeRO-1: the update of this rank's share of the weights whose buffers it
        /// touches, sharded over the members of this group (a gradient reduce-scatter
        /// before, a weight all-gather after); absent: whole weights.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<u32>,
    },
}

impl Instruction {
    /// Whether it runs on the compute stream (forward, backward, step) rather than the
    /// communication stream.
    pub fn is_compute(&self) -> bool {
        matches!(
            self,
            Instruction::Forward { .. }
                | Instruction::Recompute { .. }
                | Instruction::Backward { .. }
                | Instruction::WeightGradient { .. }
                | Instruction::Step { .. }
        )
    }

    /// Its predicted duration, µs.
    pub fn us(&self) -> f64 {
        match *self {
            Instruction::Forward { us, .. }
            | Instruction::Recompute { us, .. }
            | Instruction::Backward { us, .. }
            | Instruction::WeightGradient { us, .. }
            | Instruction::Send { us, .. }
            | Instruction::Recv { us, .. }
            | Instruction::AllReduce { us, .. }
            | Instruction::AllGather { us, .. }
            | Instruction::ReduceScatter { us, .. }
            | Instruction::AllToAll { us, .. }
            | Instruction::Step { us, .. } => us,
        }
    }

    /// The part of its duration that is link latency (messages and collectives), µs.
    pub fn latency_us(&self) -> f64 {
        match *self {
            Instruction::Send { latency_us, .. }
            | Instruction::Recv { latency_us, .. }
            | Instruction::AllReduce { latency_us, .. }
            | Instruction::AllGather { latency_us, .. }
            | Instruction::ReduceScatter { latency_us, .. }
            | Instruction::AllToAll { latency_us, .. } => latency_us,
            _ => 0.0,
        }
    }

    /// A collective's group and size.
    pub fn collective(&self) -> Option<(u32, u64)> {
        match *self {
            Instruction::AllReduce { group, bytes, .. }
            | Instruction::AllGather { group, bytes, .. }
            | Instruction::ReduceScatter { group, bytes, .. }
            | Instruction::AllToAll { group, bytes, .. } => Some((group, bytes)),
            _ => None,
        }
    }

    /// Its `op` name.
    pub fn op(&self) -> &'static str {
        match self {
            Instruction::Forward { .. } => "forward",
            Instruction::Recompute { .. } => "recompute",
            Instruction::Backward { .. } => "backward",
            Instruction::WeightGradient { .. } => "weight_gradient",
            Instruction::Send { .. } => "send",
            Instruction::Recv { .. } => "recv",
            Instruction::AllReduce { .. } => "all_reduce",
            Instruction::AllGather { .. } => "all_gather",
            Instruction::ReduceScatter { .. } => "reduce_scatter",
            Instruction::AllToAll { .. } => "all_to_all",
            Instruction::Step { .. } => "step",
        }
    }
}

/// What a buffer holds.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// A layer's weight slice.
    Weights,
    /// Its gradient, accumulated over microbatches: live from the first backward pass
    /// that writes it to the step that spends it.
    Gradients,
    /// Its optimizer state (momentum, …).
    OptimizerState,
    /// Weight copies an asynchronous stage stashes for in-flight microbatches.
    WeightVersions,
    /// Scratch space for kernels.
    Workspace,
    /// What a forward keeps for its backward (its output and what it stashes).
    Activation,
    /// What a recomputation makes again for the backward.
    Recomputed,
    /// A message's payload.
    Received,
    /// The gradient a backward computes for the layer's inputs.
    InputGradient,
}

impl BufferKind {
    /// Whether it lives for the whole program.
    pub fn persistent(self) -> bool {
        matches!(
            self,
            BufferKind::Weights
                | BufferKind::OptimizerState
                | BufferKind::WeightVersions
                | BufferKind::Workspace
        )
    }
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// Memory one rank's instructions use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Buffer {
    /// What it holds.
    pub kind: BufferKind,
    /// The layer it belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<u32>,
    /// The microbatch it belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microbatch: Option<u32>,
    /// Size.
    pub bytes: u64,
    /// Instructions that write it, ascending indices into the rank's program.
    pub writes: Vec<u32>,
    /// Instructions that read it, ascending.
    pub reads: Vec<u32>,
    /// Allocated before instruction `live[0]`, freed after `live[1]`.
    pub live: [u32; 2],
}

/// What the planner predicted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Predicted {
    /// One iteration, µs.
    pub iteration_time_us: f64,
    /// The most memory any GPU holds, bytes.
    pub peak_memory_bytes: f64,
    /// One GPU's compute time for the whole iteration, µs (what GPU-time amplification
    /// is measured against).
    pub single_gpu_time_us: f64,
}

/// Where a rank's GPU sits: messages between ranks of one node cross its internal links,
/// between nodes their network interfaces, between racks the racks' links.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Site {
    /// Its server.
    pub node: u32,
    /// Its rack.
    pub rack: u32,
    /// The network interface its traffic to other servers shares: its server's, or its
    /// own on a flat network.
    pub nic: u32,
}

/// The kind of link a transfer crosses.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    /// Inside one server (NVLink, PCIe).
    IntraNode,
    /// Between servers of one rack.
    InterNode,
    /// Between racks.
    InterRack,
}

impl LinkClass {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::IntraNode => "intra-node",
            LinkClass::InterNode => "inter-node",
            LinkClass::InterRack => "inter-rack",
        }
    }
}

/// An executable plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Always [`FORMAT`].
    pub format: String,
    /// The model.
    pub model: ModelRef,
    /// blake3 of everything the plan was made from (model, cluster, profile, options,
    /// ralpc's version): a build system compares it to decide whether to plan again. The
    /// lowering alone knows only the model and writes its hash.
    pub inputs: String,
    /// The cluster's name.
    pub cluster: String,
    /// Ranks (GPUs) the plan runs on.
    pub ranks: u32,
    /// Global batch.
    pub batch: u64,
    /// Microbatches per iteration.
    pub microbatches: u32,
    /// The pipeline schedule.
    pub schedule: String,
    /// The math precision its memory and times were priced at (sets the width of weights,
    /// gradients and activations in `buffers`).
    pub precision: Precision,
    /// The optimizer priced (sets the optimizer state in `buffers`).
    pub optimizer: Optimizer,
    /// Whether attention cores were priced as one fused kernel, which keeps the softmax's
    /// log-sum-exp instead of its probabilities (sets their activations in `buffers`; the
    /// executors compute the same math either way).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fused_attention: bool,
    /// The placement it was lowered from.
    pub strategy: StrategyFile,
    /// Layer names, by index.
    pub layers: Vec<String>,
    /// Where each rank sits.
    pub sites: Vec<Site>,
    /// Communicator groups, each listed once (sorted ranks).
    pub groups: Vec<Vec<u32>>,
    /// Per rank, its instructions in order.
    pub programs: Vec<Vec<Instruction>>,
    /// Per rank, the buffers its instructions use.
    pub buffers: Vec<Vec<Buffer>>,
    /// The planner's prediction.
    pub predicted: Predicted,
    /// How the layers are placed and connected, by the model's names: what an executor
    /// reads to run the plan ([`Layout`]). Absent from a plan lowered without its model's
    /// ops (an imported profile's), which is simulated but not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Layout>,
    /// A one-GPU job trained beside the plan in its spare GPU time (`ralpc plan
    /// --background`), one copy on each GPU that has room for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<BackgroundRef>,
}

/// The background job of a plan: its model, its batch, and how much of it each GPU trains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackgroundRef {
    /// Its model.
    pub model: ModelRef,
    /// Samples per iteration of it.
    pub batch: u64,
    /// Per GPU planned for (the plan's ranks, then the GPUs it leaves unused), its
    /// iterations per iteration of the plan on that GPU, as priced (0 where it does not
    /// run).
    pub iterations_per_step: Vec<f64>,
}

/// Why a plan cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanFileError {
    /// Not JSON of this schema.
    #[error("not a ralpc plan: {0}")]
    Malformed(String),
    /// A format this ralpc does not read.
    #[error("plan format is \"{found}\"; this ralpc reads \"{FORMAT}\" (another version of ralpc wrote it: plan again with this one)")]
    Format {
        /// The file's tag.
        found: String,
    },
    /// Made for another model.
    #[error("the plan was made for a model with blake3 {expected}; this model's is {found}")]
    ModelMismatch {
        /// In the plan.
        expected: String,
        /// Of the given model.
        found: String,
    },
    /// An inconsistency, naming where.
    #[error("{0}")]
    Invalid(String),
}

/// blake3 of `bytes`, lower-case hex.
pub fn model_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

impl Plan {
    /// Instruction `index` of `rank`'s program.
    pub fn instruction(&self, rank: u32, index: usize) -> Option<&Instruction> {
        self.programs.get(rank as usize)?.get(index)
    }

    /// The widest link class among `ranks` (`None` for fewer than two distinct sites
    /// or out-of-range ranks).
    pub fn link_class(&self, ranks: &[u32]) -> Option<LinkClass> {
        let sites: Vec<Site> = ranks
            .iter()
            .map(|&r| self.sites.get(r as usize).copied())
            .collect::<Option<_>>()?;
        let first = *sites.first()?;
        if ranks.len() < 2 {
            None
        } else if sites.iter().any(|s| s.rack != first.rack) {
            Some(LinkClass::InterRack)
        } else if sites.iter().any(|s| s.node != first.node) {
            Some(LinkClass::InterNode)
        } else {
            Some(LinkClass::IntraNode)
        }
    }

    /// Per rank, the bytes its live buffers hold while each instruction runs.
    ///
    /// Cost: O(buffers + instructions).
    pub fn memory_by_instruction(&self) -> Vec<Vec<u64>> {
        self.programs
            .iter()
            .zip(&self.buffers)
            .map(|(program, buffers)| {
                let mut delta = vec![0i128; program.len() + 1];
                for b in buffers {
                    let [first, last] = b.live.map(|i| (i as usize).min(program.len()));
                    delta[first] += i128::from(b.bytes);
                    delta[(last + 1).min(program.len())] -= i128::from(b.bytes);
                }
                let mut live = 0i128;
                delta[..program.len()]
                    .iter()
                    .map(|d| {
                        live += d;
                        u64::try_from(live).unwrap_or(u64::MAX)
                    })
                    .collect()
            })
            .collect()
    }

    /// Per rank, what its live buffers hold by kind at its peak (the first instruction
    /// where the total is largest).
    pub fn memory_at_peak(&self) -> Vec<BTreeMap<BufferKind, u64>> {
        self.memory_by_instruction()
            .iter()
            .zip(&self.buffers)
            .map(|(live, buffers)| {
                let peak = live.iter().copied().max().unwrap_or(0);
                let at = live.iter().position(|&b| b == peak).unwrap_or(0) as u32;
                let mut by_kind = BTreeMap::new();
                for b in buffers
                    .iter()
                    .filter(|b| b.live[0] <= at && at <= b.live[1])
                {
                    *by_kind.entry(b.kind).or_insert(0) += b.bytes;
                }
                by_kind
            })
            .collect()
    }

    /// Each rank's peak memory, bytes: the most its live buffers hold at once in program
    /// order.
    pub fn peak_memory_bytes(&self) -> Vec<u64> {
        self.memory_by_instruction()
            .into_iter()
            .map(|m| m.into_iter().max().unwrap_or(0))
            .collect()
    }

    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        // Finite numbers, strings and integers always serialize.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// Parses and validates a plan.
    ///
    /// # Errors
    /// Malformed JSON, a newer format, or any inconsistency [`Plan::validate`] finds.
    pub fn parse(text: &str) -> Result<Plan, PlanFileError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| PlanFileError::Malformed(e.to_string()))?;
        if let Some(found) = value.get("format").and_then(|f| f.as_str()) {
            if found != FORMAT {
                return Err(PlanFileError::Format {
                    found: found.to_owned(),
                });
            }
        }
        let plan: Plan =
            serde_json::from_value(value).map_err(|e| PlanFileError::Malformed(e.to_string()))?;
        plan.validate()?;
        Ok(plan)
    }

    /// Refuses a plan made for a model whose bytes differ from `model`.
    ///
    /// # Errors
    /// [`PlanFileError::ModelMismatch`].
    pub fn check_model(&self, model: &[u8]) -> Result<(), PlanFileError> {
        let found = model_hash(model);
        if found == self.model.blake3 {
            Ok(())
        } else {
            Err(PlanFileError::ModelMismatch {
                expected: self.model.blake3.clone(),
                found,
            })
        }
    }

    /// Checks the plan is self-consistent: ranks and groups in range, every send matched by
    /// one receive (same endpoints, tag and size), every group's collectives entered by all
    /// its members in the same order, layers and durations valid.
    ///
    /// # Errors
    /// The first inconsistency, naming the rank and instruction.
    pub fn validate(&self) -> Result<(), PlanFileError> {
        let bad = |m: String| Err(PlanFileError::Invalid(m));
        if self.format != FORMAT {
            return Err(PlanFileError::Format {
                found: self.format.clone(),
            });
        }
        if self.programs.len() != self.ranks as usize {
            return bad(format!(
                "ranks is {} but there are {} programs",
                self.ranks,
                self.programs.len()
            ));
        }
        if self.sites.len() != self.ranks as usize {
            return bad(format!(
                "ranks is {} but {} sites are listed",
                self.ranks,
                self.sites.len()
            ));
        }
        // Servers, racks and NICs are numbered from 0, each holding at least one rank.
        if let Some((r, site)) = self
            .sites
            .iter()
            .enumerate()
            .find(|(_, s)| [s.node, s.rack, s.nic].iter().any(|&i| i >= self.ranks))
        {
            return bad(format!(
                "sites[{r}]: node {}, rack {}, nic {}: each is one of the plan's {} ranks' \
                 places, numbered from 0",
                site.node, site.rack, site.nic, self.ranks
            ));
        }
        if self.layers.len() != self.model.layers as usize {
            return bad(format!(
                "model.layers is {} but {} layer names are listed",
                self.model.layers,
                self.layers.len()
            ));
        }
        if let Some(layout) = &self.layout {
            layout.check(self.layers.len(), self.ranks)?;
        }
        if let Some(b) = &self.background {
            if b.batch == 0 {
                return bad("background.batch must be at least 1".into());
            }
            if b.iterations_per_step.len() < self.ranks as usize {
                return bad(format!(
                    "background.iterations_per_step lists {} GPUs; the plan has {} ranks",
                    b.iterations_per_step.len(),
                    self.ranks
                ));
            }
            if let Some((r, x)) = b
                .iterations_per_step
                .iter()
                .enumerate()
                .find(|(_, x)| !(x.is_finite() && **x >= 0.0))
            {
                return bad(format!(
                    "background.iterations_per_step[{r}]: {x} is not a finite number >= 0"
                ));
            }
        }
        for (g, group) in self.groups.iter().enumerate() {
            if group.len() < 2 || group.windows(2).any(|w| w[0] >= w[1]) {
                return bad(format!("groups[{g}] must list ≥ 2 distinct ranks in order"));
            }
            if let Some(&r) = group.iter().find(|&&r| r >= self.ranks) {
                return bad(format!(
                    "groups[{g}] names rank {r}; the plan has {}",
                    self.ranks
                ));
            }
        }
        let p = &self.predicted;
        for (field, x) in [
            ("iteration_time_us", p.iteration_time_us),
            ("peak_memory_bytes", p.peak_memory_bytes),
            ("single_gpu_time_us", p.single_gpu_time_us),
        ] {
            if !(x.is_finite() && x >= 0.0) {
                return bad(format!(
                    "predicted.{field}: {x} is not a finite number >= 0"
                ));
            }
        }
        // Messages by (from, to, tag) → bytes; collectives per group per member.
        let mut sends: BTreeMap<(u32, u32, u64), u64> = BTreeMap::new();
        let mut recvs: BTreeMap<(u32, u32, u64), u64> = BTreeMap::new();
        let mut entered: BTreeMap<(u32, u32), Vec<(&str, u64)>> = BTreeMap::new();
        for (rank, program) in self.programs.iter().enumerate() {
            let rank = rank as u32;
            for (i, instr) in program.iter().enumerate() {
                let at = format!("programs[{rank}][{i}]");
                let (us, latency) = (instr.us(), instr.latency_us());
                if !(us.is_finite() && us >= 0.0) {
                    return bad(format!("{at}: duration {us} µs"));
                }
                if !(0.0..=us).contains(&latency) {
                    return bad(format!(
                        "{at}: latency {latency} µs is not within its duration {us} µs"
                    ));
                }
                match *instr {
                    Instruction::Forward {
                        layer, microbatch, ..
                    }
                    | Instruction::Recompute {
                        layer, microbatch, ..
                    }
                    | Instruction::Backward {
                        layer, microbatch, ..
                    }
                    | Instruction::WeightGradient {
                        layer, microbatch, ..
                    } => {
                        if layer >= self.model.layers || microbatch >= self.microbatches {
                            return bad(format!(
                                "{at}: layer {layer} / microbatch {microbatch} out of range"
                            ));
                        }
                    }
                    Instruction::Send { to, bytes, tag, .. } => {
                        if to >= self.ranks || to == rank {
                            return bad(format!("{at}: send to rank {to}"));
                        }
                        if sends.insert((rank, to, tag), bytes).is_some() {
                            return bad(format!("{at}: tag {tag} sent twice to rank {to}"));
                        }
                    }
                    Instruction::Recv {
                        from, bytes, tag, ..
                    } => {
                        if from >= self.ranks || from == rank {
                            return bad(format!("{at}: receive from rank {from}"));
                        }
                        if recvs.insert((from, rank, tag), bytes).is_some() {
                            return bad(format!("{at}: tag {tag} received twice from {from}"));
                        }
                    }
                    Instruction::AllReduce { group, bytes, .. }
                    | Instruction::AllGather { group, bytes, .. }
                    | Instruction::ReduceScatter { group, bytes, .. }
                    | Instruction::AllToAll { group, bytes, .. } => {
                        let Some(members) = self.groups.get(group as usize) else {
                            return bad(format!("{at}: group {group} does not exist"));
                        };
                        if !members.contains(&rank) {
                            return bad(format!("{at}: rank {rank} is not in group {group}"));
                        }
                        entered
                            .entry((group, rank))
                            .or_default()
                            .push((instr.op(), bytes));
                    }
                    Instruction::Step {
                        group: Some(group), ..
                    } => match self.groups.get(group as usize) {
                        None => return bad(format!("{at}: group {group} does not exist")),
                        Some(members) if !members.contains(&rank) => {
                            return bad(format!("{at}: rank {rank} is not in group {group}"))
                        }
                        Some(_) => {}
                    },
                    Instruction::Step { .. } => {}
                }
            }
        }
        for (key, bytes) in &sends {
            match recvs.get(key) {
                Some(b) if b == bytes => {}
                Some(b) => {
                    return bad(format!(
                        "message {} → {} tag {}: {bytes} bytes sent, {b} received",
                        key.0, key.1, key.2
                    ))
                }
                None => {
                    return bad(format!(
                        "message {} → {} tag {} is never received",
                        key.0, key.1, key.2
                    ))
                }
            }
        }
        if let Some(key) = recvs.keys().find(|k| !sends.contains_key(k)) {
            return bad(format!(
                "rank {} waits for a message from {} (tag {}) that is never sent",
                key.1, key.0, key.2
            ));
        }
        for (g, members) in self.groups.iter().enumerate() {
            let g = g as u32;
            let first = entered.get(&(g, members[0]));
            for &m in members {
                if entered.get(&(g, m)) != first {
                    return bad(format!(
                        "group {g}: rank {m} does not enter the same collectives as rank {}",
                        members[0]
                    ));
                }
            }
        }
        if self.buffers.len() != self.programs.len() {
            return bad(format!(
                "there are {} programs but {} buffer lists",
                self.programs.len(),
                self.buffers.len()
            ));
        }
        for (rank, (program, buffers)) in self.programs.iter().zip(&self.buffers).enumerate() {
            for (i, b) in buffers.iter().enumerate() {
                let at = format!("buffers[{rank}][{i}] ({:?})", b.kind);
                check_buffer(b, program.len(), &at)?;
            }
        }
        Ok(())
    }
}

/// Checks one buffer, named `at` in the errors, against its rank's program of `len`
/// instructions.
fn check_buffer(b: &Buffer, len: usize, at: &str) -> Result<(), PlanFileError> {
    let invalid = |what: String| Err(PlanFileError::Invalid(format!("{at}: {what}")));
    let [first, last] = b.live;
    if first > last || last as usize >= len {
        return invalid(format!(
            "live range [{first}, {last}] is not within the program's {len} instructions"
        ));
    }
    for (what, list) in [("writes", &b.writes), ("reads", &b.reads)] {
        if list.windows(2).any(|w| w[0] >= w[1]) {
            return invalid(format!("{what} must be ascending"));
        }
        if let Some(&i) = list.iter().find(|&&i| i < first || i > last) {
            let when = if i < first {
                "before it is allocated"
            } else {
                "after it is freed"
            };
            return invalid(format!("instruction {i} {what} it {when}"));
        }
    }
    if b.kind.persistent() {
        if first != 0 || last as usize + 1 != len {
            return invalid("a persistent buffer lives for the whole program".to_owned());
        }
    } else {
        let Some(&written) = b.writes.first() else {
            return invalid("it is never written".to_owned());
        };
        if let Some(&read) = b.reads.first().filter(|&&r| r <= written) {
            return invalid(format!(
                "instruction {read} reads it before it is written (first at {written})"
            ));
        }
    }
    Ok(())
}
