//! `ralpc plan`'s options, parsed by clap: the command line's, and the Python package's
//! keyword arguments (turned into the same tokens), so both share names, defaults and
//! checks.

use std::path::PathBuf;

use clap::Parser;
use ralpc_passes::cluster::{Link, Precision};
use ralpc_passes::cost::Optimizer;
use ralpc_passes::plan::{Family, Schedule};
use ralpc_passes::transformer::{
    Attention, ContextComm, Dispatcher, ExpertOptions, Knobs, Modules, Recompute,
    DEFAULT_EXPERT_IMBALANCE,
};
use ralpc_passes::units::{parse_bandwidth, parse_bytes, parse_latency};

use crate::{BackgroundOptions, ClusterOptions, PlanOptions};

/// Arguments of `ralpc plan` (the command line's, and `ralpc.plan`'s keyword arguments).
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// An ONNX model, a PipeDream profiler `graph.txt` or a DeepPool `.prof` (measured layers).
    pub model: PathBuf,
    /// More models to train at once on the same GPUs (Hydra's multi-model training): each
    /// is priced alone on counts of the GPUs, and the set placed in groups of GPUs, the
    /// models of a group taking turns on it, to finish the set soonest; compared with
    /// training them one after another and each on an even share. Prints the placement;
    /// writes no plan. Give the models before the options (`--sequence-parallel`, which
    /// takes an optional value, would read one).
    #[arg(value_name = "MORE")]
    pub more: Vec<PathBuf>,
    /// Train this many copies of each model at once (a hyperparameter sweep, an ensemble),
    /// placed as MORE models are.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=10))]
    pub copies: Option<u32>,
    /// GPUs to plan for (default: every GPU of the cluster; the default cluster grows to fit).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub gpus: Option<u32>,
    /// Multiply the cluster's nodes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub nodes: Option<u32>,
    /// A cluster preset (dgx-a100, dgx-h100, p3dn-v100, pcie-a100, selene, eos; NAMExN) or TOML file
    /// [default: dgx-a100, with as many nodes as --gpus needs].
    #[arg(long)]
    pub cluster: Option<String>,
    /// Global batch for ONNX models [default: the exported batch when ≥ 2, else 32]. A
    /// PipeDream graph keeps the batch it was measured at (give it where the file records
    /// none); a DeepPool profile plans any batch [default: the largest it measured].
    #[arg(long, value_parser = parse_positive)]
    pub batch: Option<u64>,
    /// Full shape of one input, batch included, e.g. `input_ids=8,2048` to plan a GPT at
    /// sequence 2048, `images=16,3,800,1333`, or a recurrent state `state=2,16,128` (the batch
    /// on axis 1, where the model's batch symbol is; repeatable; the rest keep the model's own).
    #[arg(long = "input", value_name = "NAME=D0,D1,...", value_parser = parse_input_shape)]
    pub inputs: Vec<(String, Vec<u64>)>,
    /// The value of one input, which becomes a constant of the model, e.g. `sr=16000` for a
    /// voice-activity model's sample rate: what depends on it folds, and an `If` on it keeps
    /// the branch taken (repeatable; elements comma-separated, row-major).
    #[arg(long = "value", value_name = "NAME=V0,V1,...", value_parser = parse_input_value)]
    pub values: Vec<(String, Vec<f64>)>,
    /// Pipeline microbatches (default: searched over powers of two dividing the batch).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub microbatches: Option<u32>,
    /// Which plans to search.
    #[arg(long, default_value = "auto", value_parser = ["auto", "dp", "burst", "soap", "pipeline", "3d"])]
    pub strategy: String,
    /// Pipeline schedule: 1f1b and gpipe are synchronous, async is PipeDream's
    /// weight-stashing schedule, zb-h1 is 1f1b with each backward's weight gradients run
    /// later to fill the pipeline's drain (a third of its bubble where the passes take
    /// alike; later stages hold what the owed weight passes read), zb-v runs two chunks
    /// per GPU laid out as a V (the first GPU holds the first and the last) with the
    /// weight passes apart: about half zb-h1's bubble at 1f1b's memory (a transformer's
    /// plan; PyTorch's ScheduleZBVZeroBubble). The zero-bubble schedules run without
    /// recomputation. Unset: a layer pipeline tries 1f1b and zb-h1; a transformer's plan
    /// Megatron-LM's 1f1b, interleaved where it pays.
    #[arg(long, value_parser = ["1f1b", "gpipe", "async", "zb-h1", "zb-v"])]
    pub schedule: Option<String>,
    /// Allowed GPU-sec amplification above 1: plans use at most (1 + X) × the single-GPU
    /// time in GPU time (`inf`: no budget).
    #[arg(long, default_value_t = 1.0, value_parser = parse_tolerance)]
    pub tolerance: f64,
    /// Measured per-op costs (ralpc JSON or DeepPool .prof).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Make the network flat: every pair of GPUs at this bandwidth (e.g. `1GB/s`).
    #[arg(long, value_parser = parse_bandwidth)]
    pub link_bandwidth: Option<f64>,
    /// Latency of every link of the flat network (e.g. `240us`; default 0).
    #[arg(long, value_parser = parse_latency, requires = "link_bandwidth")]
    pub link_latency: Option<f64>,
    /// Per-GPU memory limit below the GPUs' own (e.g. `16GiB`).
    #[arg(long, value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
    /// The optimizer, whose state counts in memory.
    #[arg(long, default_value = "momentum", value_parser = ["sgd", "momentum", "adam"])]
    pub optimizer: String,
    /// Math precision (default: the profile's, else tf32): fp32, tf32, fp16 or bf16 (mixed
    /// precision with fp32 master weights), fp8 (Transformer Engine's FP8 GEMMs, bf16
    /// elsewhere; Hopper and later) or mxfp8 (block-scaled FP8; Blackwell).
    #[arg(long, value_parser = ["fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8"])]
    pub precision: Option<String>,
    /// Save the chosen strategy as a strategy file.
    #[arg(long, value_name = "FILE")]
    pub write_strategy: Option<PathBuf>,
    /// Also write the plan for another engine into DIR: `torch` (train_torch.py, a
    /// standalone script applying it to your model class under torchrun), `megatron`
    /// (megatron.args, Megatron-LM's arguments of a transformer plan) or `torchtitan`
    /// (torchtitan_plan.py, torchtitan 0.3's job configuration of a transformer plan:
    /// `torchrun -m torchtitan.train --module torchtitan_plan --config ralpc_plan`).
    /// Repeatable.
    #[arg(long, value_name = "ENGINE", value_parser = ["torch", "megatron", "torchtitan"])]
    pub emit: Vec<String>,
    /// Evaluate this strategy file under ralpc's costs instead of searching.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["strategy", "schedule", "microbatches", "tolerance"])]
    pub strategy_file: Option<PathBuf>,
    /// Where to write the executable plan (`plan.json`, format ralpc-plan/3), the placed
    /// graph (`plan.dot`, and `plan.svg` when Graphviz is installed), the simulated
    /// timeline (`timeline.json`, open it in ui.perfetto.dev) and `report.html`
    /// [default: `<model stem>.ralpc` in the working directory; with --json, none unless
    /// --emit asks for files].
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print one JSON object instead of the summary (always plans). Without -o nothing is
    /// written: a query for a machine leaves no folder behind.
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// Print nothing but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Exit 0 when DIR holds the plan of exactly these inputs (model, cluster, profile,
    /// options, ralpc version), 1 when not; plan nothing.
    #[arg(long, conflicts_with_all = ["json", "force"])]
    pub check: bool,
    /// Plan again even when DIR is up to date, and write outputs where they would replace
    /// an input (the model, profile, strategy or cluster file).
    #[arg(long)]
    pub force: bool,
    /// Transformer plans: GPUs of one node splitting every block (attention by heads, MLP
    /// by columns then rows) [default: searched].
    #[arg(long, value_name = "T", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub tensor_parallel: Option<u32>,
    /// Pipeline stages [default: searched].
    #[arg(long, value_name = "P", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub pipeline_parallel: Option<u32>,
    /// GPUs splitting each sequence, two chunks a rank for causal balance, exchanging keys
    /// and values as --cp-comm-type says [default: searched].
    #[arg(long, value_name = "C", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub context_parallel: Option<u32>,
    /// How a context-parallel group exchanges keys and values (Megatron-Core's names): p2p
    /// passes chunks around a ring behind the attention; all_gather gathers the whole
    /// sequence's keys and values first (Llama 3's form, exposed, small under grouped-query
    /// attention); a2a is DeepSpeed-Ulysses, all-to-alls trading positions for heads
    /// (exposed; heads and key/value heads per tensor-parallel rank must divide by C)
    /// [default: searched].
    #[arg(long, value_name = "FORM", help_heading = "Transformer (3d) plans", value_parser = ["p2p", "all_gather", "a2a"])]
    pub cp_comm_type: Option<String>,
    /// Model chunks per GPU: interleaved 1F1B above 1 [default: searched].
    #[arg(long, value_name = "V", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub virtual_stages: Option<u32>,
    /// Sequences per microbatch [default: searched].
    #[arg(long, value_name = "B", help_heading = "Transformer (3d) plans", value_parser = parse_positive)]
    pub micro_batch_size: Option<u64>,
    /// Activation recomputation: none, selective (attention core) or full (every block)
    /// [default: searched].
    #[arg(long, help_heading = "Transformer (3d) plans", value_parser = ["none", "selective", "full"])]
    pub recompute: Option<String>,
    /// Recompute these modules of each block, each from its input (Megatron-Core's names,
    /// comma-separated: core_attn, mlp, moe_act, layernorm, mla_up_proj; selective
    /// recomputation of them, in place of --recompute) [default: searched with the rest].
    #[arg(long, value_name = "LIST", help_heading = "Transformer (3d) plans", value_parser = parse_modules, conflicts_with = "recompute")]
    pub recompute_modules: Option<Modules>,
    /// Recompute in full only the first N blocks of each pipeline chunk and stash the
    /// others' activations (Megatron-Core's `--recompute-method block
    /// --recompute-num-layers N`; full recomputation, so alone or with `--recompute full`)
    /// [default: searched: the fewest blocks that fit, where a full recomputation frees
    /// more memory than the plan needs].
    #[arg(long, value_name = "N", help_heading = "Transformer (3d) plans", value_parser = parse_positive_u32, conflicts_with = "recompute_modules")]
    pub recompute_num_layers: Option<u32>,
    /// Split LayerNorm and dropout by sequence positions inside tensor-parallel groups
    /// (`--sequence-parallel` alone: on) [default: searched].
    #[arg(long, value_name = "on|off", help_heading = "Transformer (3d) plans", num_args = 0..=1, default_missing_value = "on", value_parser = ["on", "off"])]
    pub sequence_parallel: Option<String>,
    /// Shard optimizer state (1), gradients too (2), parameters too (3) over data-parallel
    /// replicas [default: searched].
    #[arg(long, value_name = "K", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Option<u8>,
    /// Hybrid sharding: cut the data-parallel (× context) ranks into R groups, each holding
    /// a whole sharded copy of ZeRO's state, the groups all-reducing their shards'
    /// gradients once an iteration (FSDP2's HSDP; Megatron-Core's
    /// --num-distributed-optimizer-instances) [default: 1 for an ONNX model, whose
    /// executable plan does not shard hybridly yet; searched for a configuration: 1, or one
    /// group a node].
    #[arg(long, value_name = "R", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub dp_replicate: Option<u32>,
    /// How the blocks are split over the pipeline's chunks: `blocks` (evenly, the extra
    /// ones on the first chunks) or `ends` (the embedding and the loss take a block's place
    /// each, so the first and last chunks hold a block fewer: Megatron-Core's
    /// --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split, as
    /// Llama 3 trained) [default: searched].
    #[arg(long, value_name = "SPLIT", help_heading = "Transformer (3d) plans", value_parser = ["blocks", "ends"])]
    pub pipeline_split: Option<String>,
    /// Mixtures of experts: ranks each routed expert group is spread over (Megatron-Core's
    /// expert parallelism, folded into the tensor × context × data ranks of a stage)
    /// [default: searched].
    #[arg(long, value_name = "EP", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub expert_parallel: Option<u32>,
    /// Mixtures of experts: ranks of a node splitting each expert's inner size
    /// [default: searched].
    #[arg(long, value_name = "ETP", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub expert_tensor_parallel: Option<u32>,
    /// Mixtures of experts: how tokens reach their experts: alltoall (NCCL, a copy per
    /// chosen expert) or flex (DeepEP/HybridEP: one copy per remote node).
    #[arg(long, default_value = "alltoall", help_heading = "Transformer (3d) plans", value_parser = ["alltoall", "flex"])]
    pub moe_dispatcher: String,
    /// Mixtures of experts: the busiest rank's tokens over the mean (1: balanced, as forced
    /// balancing benchmarks run) [default: 1.3, the lower end measured without rebalancing].
    #[arg(long, value_name = "X", help_heading = "Transformer (3d) plans", value_parser = parse_imbalance)]
    pub moe_imbalance: Option<f64>,
    /// Mixtures of experts: each expert's capacity over its mean share of the tokens
    /// (Megatron-Core's --moe-expert-capacity-factor): tokens beyond it are dropped, so the
    /// busiest rank computes at most this factor over the mean [default: none dropped].
    #[arg(long, value_name = "C", help_heading = "Transformer (3d) plans", value_parser = parse_capacity_factor)]
    pub moe_capacity_factor: Option<f64>,
    /// Mixtures of experts: pad every expert's input to its capacity
    /// (--moe-pad-expert-input-to-capacity): each computes exactly the capacity.
    #[arg(
        long,
        help_heading = "Transformer (3d) plans",
        requires = "moe_capacity_factor"
    )]
    pub moe_pad_to_capacity: bool,
    /// Mixtures of experts: overlap dispatch and combine with another microbatch's compute
    /// (Megatron-Core's --overlap-moe-expert-parallel-comm; needs interleaving with stages).
    #[arg(long, value_name = "on|off", default_value = "off", help_heading = "Transformer (3d) plans", value_parser = ["on", "off"])]
    pub moe_a2a_overlap: String,
    /// Keep the stashed activations of the first N blocks in host memory, copied there
    /// behind the next block's forward pass and back behind the backward pass (Megatron-
    /// Core's --cpu-offloading-num-layers; no pipeline, no recomputation; 0: none)
    /// [default: searched where nothing fits without; needs the cluster's host figures].
    #[arg(long, value_name = "N", help_heading = "Transformer (3d) plans")]
    pub offload_activations: Option<u64>,
    /// Keep this fraction of the optimizer state (fp32 master weights and moments) in host
    /// memory, stepped by the CPU (Megatron-Core's --optimizer-cpu-offload
    /// --optimizer-offload-fraction; Adam; 0: none) [default: searched where nothing fits
    /// without].
    #[arg(long, value_name = "F", help_heading = "Transformer (3d) plans", value_parser = parse_fraction)]
    pub offload_optimizer: Option<u8>,
    /// Keep and reduce gradients in fp32 (18 bytes per parameter with Adam, not 16).
    #[arg(long, help_heading = "Transformer (3d) plans")]
    pub fp32_gradients: bool,
    /// How attention is priced and sized: fused (one kernel as FlashAttention runs it: no
    /// s×s scores kept, recomputed in the backward pass, the causal half only) or unfused
    /// (batched GEMMs around a softmax, Megatron-LM before FlashAttention). The runtime
    /// computes the same math either way.
    #[arg(long, default_value = "fused", help_heading = "Transformer (3d) plans", value_parser = ["fused", "unfused"])]
    pub attention: String,
    /// Price the sequence-parallel all-gathers and reduce-scatters overlapped with the GEMMs
    /// beside them, as Megatron-Core's --tp-comm-overlap runs them (on; --emit megatron
    /// then writes the flag). ralpc's own executor does not overlap them: off prices what
    /// `ralpc run` does.
    #[arg(long, value_name = "on|off", default_value = "on", help_heading = "Transformer (3d) plans", value_parser = ["on", "off"])]
    pub tp_comm_overlap: String,
    /// Lower the plan only if its instructions (every rank's program) stay below N; above
    /// it the plan is priced, not written (lowering takes about 1 KB of memory per
    /// instruction) [default: 2000000; at most 100000000].
    #[arg(long, value_name = "N", help_heading = "Transformer (3d) plans", value_parser = parse_max_instructions)]
    pub max_instructions: Option<u64>,
    /// Train this model (ONNX, PipeDream graph or DeepPool profile) on every GPU in what
    /// the plan leaves of it, as DeepPool multiplexes GPUs at low priority: the time
    /// nothing of the plan runs there, and the time its passes take beyond their share of
    /// one GPU's (SMs a small per-GPU batch leaves empty). Reports its samples/s and the
    /// cluster's against the GPUs split statically between the two jobs.
    #[arg(long, value_name = "MODEL", help_heading = "Background job (DeepPool)")]
    pub background: Option<PathBuf>,
    /// The background job's batch [default: 16, DeepPool's; a PipeDream graph's own].
    #[arg(long, value_name = "B", help_heading = "Background job (DeepPool)", requires = "background", value_parser = parse_positive)]
    pub bg_batch: Option<u64>,
    /// How much slower the foreground runs on GPUs hosting the background (0.05 or 5%:
    /// 5 % slower), for what the packing cannot see: kernels overrunning their price,
    /// caches and memory bandwidth shared [default: 0].
    #[arg(long, value_name = "F", help_heading = "Background job (DeepPool)", requires = "background", value_parser = parse_slowdown)]
    pub interference: Option<f64>,
}

fn precision(name: &str) -> Precision {
    Precision::parse(name).unwrap_or(Precision::Tf32)
}

impl PlanArgs {
    /// Parses `ralpc plan`'s arguments (`tokens[0]` is the program name), as the command
    /// line would; the error is clap's message.
    ///
    /// # Errors
    /// An unknown option, a bad value, or conflicting options.
    pub fn from_tokens<I, T>(tokens: I) -> Result<PlanArgs, BadArgument>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(Parser)]
        #[command(name = "ralpc plan")]
        struct Command {
            #[command(flatten)]
            args: PlanArgs,
        }
        Command::try_parse_from(tokens)
            .map(|c| c.args)
            .map_err(|e| BadArgument(first_line(&e)))
    }

    /// Options given together that contradict each other: `--recompute-num-layers` is a
    /// full recomputation of some blocks, so `--recompute none` or `selective` beside it.
    pub fn recompute_conflict(&self) -> Option<String> {
        match (self.recompute_num_layers, self.recompute.as_deref()) {
            (Some(n), Some(r)) if r != "full" => Some(format!(
                "--recompute-num-layers {n} recomputes blocks in full, which --recompute {r} \
                 does not (give --recompute full, or leave it out)"
            )),
            _ => None,
        }
    }

    /// The planning options these arguments ask for (the executable plan included).
    pub fn options(&self) -> PlanOptions {
        let args = self;
        PlanOptions {
            model: args.model.clone(),
            gpus: args.gpus,
            cluster: ClusterOptions {
                spec: args.cluster.clone(),
                nodes: args.nodes,
                flat: args.link_bandwidth.map(|bandwidth| Link {
                    bandwidth,
                    latency_us: args.link_latency.unwrap_or(0.0),
                }),
            },
            batch: args.batch,
            inputs: args.inputs.iter().cloned().collect(),
            values: args.values.iter().cloned().collect(),
            microbatches: args.microbatches,
            family: Family::parse(&args.strategy),
            schedule: args.schedule.as_deref().and_then(Schedule::parse),
            // A strategy file is priced as it is, whatever its GPU time.
            tolerance: (args.tolerance.is_finite() && args.strategy_file.is_none())
                .then_some(args.tolerance),
            profile: args.profile.clone(),
            memory_limit: args.memory_limit,
            optimizer: Optimizer::parse(&args.optimizer).unwrap_or_default(),
            precision: args.precision.as_deref().map(precision),
            strategy_file: args.strategy_file.clone(),
            executable: true,
            knobs: Knobs {
                tensor: args.tensor_parallel,
                pipeline: args.pipeline_parallel,
                context: args.context_parallel,
                context_comm: args.cp_comm_type.as_deref().and_then(ContextComm::parse),
                virtual_stages: args.virtual_stages,
                micro_batch: args.micro_batch_size,
                recompute: match (args.recompute_modules, args.recompute_num_layers) {
                    (Some(modules), _) => Some(Recompute::of_modules(modules)),
                    // (`--recompute none` or `selective` beside it is refused: `recompute_conflict`.)
                    (None, Some(n)) if args.recompute.as_deref().is_none_or(|r| r == "full") => {
                        Some(Recompute::Blocks(n))
                    }
                    (None, _) => args.recompute.as_deref().and_then(Recompute::parse),
                },
                sequence_parallel: args.sequence_parallel.as_deref().map(|v| v == "on"),
                zero: args.zero,
                expert: args.expert_parallel,
                expert_tensor: args.expert_tensor_parallel,
                offload_activations: args.offload_activations,
                offload_optimizer: args.offload_optimizer,
                shard_groups: args.dp_replicate,
                ends_as_blocks: args.pipeline_split.as_deref().map(|s| s == "ends"),
                schedule: None,
            },
            experts: ExpertOptions {
                imbalance: args.moe_imbalance.unwrap_or(DEFAULT_EXPERT_IMBALANCE),
                dispatcher: Dispatcher::parse(&args.moe_dispatcher).unwrap_or_default(),
                a2a_overlap: args.moe_a2a_overlap == "on",
                capacity_factor: args.moe_capacity_factor,
                pad_to_capacity: args.moe_pad_to_capacity,
            },
            fp32_gradients: args.fp32_gradients,
            attention: Attention::parse(&args.attention).unwrap_or_default(),
            tp_comm_overlap: Some(args.tp_comm_overlap == "on"),
            max_instructions: args.max_instructions,
            background: args.background.clone().map(|model| BackgroundOptions {
                model,
                batch: args.bg_batch,
                interference: args.interference.unwrap_or(0.0),
            }),
        }
    }
}

/// clap's message without its `error: ` prefix and usage lines.
fn first_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

/// A command-line argument ralpc cannot use: an unknown option, a malformed or
/// out-of-range value. Always the user's input (clap reports it with the option's name and
/// exits 2; the Python package raises it as a `ValueError`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadArgument(pub String);

/// Parses `--tolerance`: a non-negative number, or `inf` for no budget (NaN would
/// silently turn the budget off).
pub fn parse_tolerance(s: &str) -> Result<f64, BadArgument> {
    match s.trim().parse::<f64>() {
        Ok(x) if x >= 0.0 => Ok(x),
        _ => Err(BadArgument(format!(
            "expected a number >= 0 or inf, got '{s}'"
        ))),
    }
}

/// Parses a count that must be at least 1 (`--batch`, `--timeout`, …), saying so as a
/// person would (clap's range check says "0 is not in 1..18446744073709551615").
pub fn parse_positive(s: &str) -> Result<u64, BadArgument> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err(BadArgument("must be at least 1".to_owned())),
        Ok(n) => Ok(n),
        Err(_) => Err(BadArgument(format!(
            "expected a whole number of at least 1, got '{s}'"
        ))),
    }
}

/// Parses a whole number of at least 1 that fits 32 bits.
pub fn parse_positive_u32(s: &str) -> Result<u32, BadArgument> {
    u32::try_from(parse_positive(s)?)
        .map_err(|_| BadArgument(format!("expected at most {}, got '{s}'", u32::MAX)))
}

/// Parses `--max-instructions`: 1 to [`crate::plan::MAX_INSTRUCTIONS`].
pub fn parse_max_instructions(s: &str) -> Result<u64, BadArgument> {
    match parse_positive(s)? {
        n if n > crate::plan::MAX_INSTRUCTIONS => Err(BadArgument(format!(
            "at most {} (lowering takes about 1 KB of memory per instruction)",
            crate::plan::MAX_INSTRUCTIONS
        ))),
        n => Ok(n),
    }
}

/// Parses `--recompute-modules`: at least one of Megatron-Core's module names.
pub fn parse_modules(s: &str) -> Result<Modules, BadArgument> {
    match Modules::parse(s).map_err(|e| BadArgument(e.to_string()))? {
        m if m == Modules::default() => Err(BadArgument("name at least one module".to_owned())),
        m => Ok(m),
    }
}

/// Parses a load imbalance: a finite number from 1 (balanced) up to the number of ranks it
/// could concentrate on; above 64 no run has been measured.
pub fn parse_imbalance(s: &str) -> Result<f64, BadArgument> {
    match s.trim().parse::<f64>() {
        Ok(x) if (1.0..=64.0).contains(&x) => Ok(x),
        _ => Err(BadArgument(format!(
            "expected the busiest rank's load over the mean, 1 to 64, got '{s}'"
        ))),
    }
}

/// Parses a fraction from 0 to 1 in whole percent (`0.25`, or `25%`) into percent.
pub fn parse_fraction(s: &str) -> Result<u8, BadArgument> {
    let text = s.trim();
    let percent = match text.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>(),
        None => text.parse::<f64>().map(|x| x * 100.0),
    };
    match percent {
        Ok(p) if (0.0..=100.0).contains(&p) && (p - p.round()).abs() < 1e-6 => Ok(p.round() as u8),
        _ => Err(BadArgument(format!(
            "expected a fraction from 0 to 1 in whole percent (0.25, or 25%), got '{s}'"
        ))),
    }
}

/// Parses `--interference`: a slowdown factor ≥ 0 (`0.05`) or percentage (`5%`), at most
/// 10 (the foreground 11 times slower is no background job worth running).
pub fn parse_slowdown(s: &str) -> Result<f64, BadArgument> {
    let text = s.trim();
    let factor = match text.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => text.parse::<f64>(),
    };
    match factor {
        Ok(f) if (0.0..=10.0).contains(&f) => Ok(f),
        _ => Err(BadArgument(format!(
            "expected a slowdown factor from 0 to 10 (0.05, or 5%), got '{s}'"
        ))),
    }
}

/// Parses an expert capacity factor: a finite number above 0 (below 1 drops tokens even
/// when balanced) up to 64, as [`parse_imbalance`]'s bound.
pub fn parse_capacity_factor(s: &str) -> Result<f64, BadArgument> {
    match s.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 64.0 => Ok(x),
        _ => Err(BadArgument(format!(
            "expected each expert's capacity over its mean share, above 0 and at most 64, \
             got '{s}'"
        ))),
    }
}

/// The longest `--timeout` / `--grace`: a year, in seconds (a longer wait overflows the
/// clock's deadlines).
pub const MAX_SECONDS: u64 = 365 * 24 * 3600;

/// Parses a number of seconds to wait: 1 to [`MAX_SECONDS`].
pub fn parse_seconds(s: &str) -> Result<u64, BadArgument> {
    match parse_positive(s)? {
        n if n <= MAX_SECONDS => Ok(n),
        _ => Err(BadArgument(format!(
            "at most {MAX_SECONDS} s (a year), got '{s}'"
        ))),
    }
}

/// Whether a learning rate trains: finite and at least 0.
pub fn is_learning_rate(x: f32) -> bool {
    x.is_finite() && x >= 0.0
}

/// Whether a momentum trains: in [0, 1) (1 or more never forgets a gradient).
pub fn is_momentum(x: f32) -> bool {
    (0.0..1.0).contains(&x)
}

/// Parses `--lr` ([`is_learning_rate`]).
pub fn parse_learning_rate(s: &str) -> Result<f32, BadArgument> {
    match s.trim().parse::<f32>() {
        Ok(x) if is_learning_rate(x) => Ok(x),
        _ => Err(BadArgument(format!(
            "expected a finite number >= 0, got '{s}'"
        ))),
    }
}

/// Parses `--momentum` ([`is_momentum`]).
pub fn parse_momentum(s: &str) -> Result<f32, BadArgument> {
    match s.trim().parse::<f32>() {
        Ok(x) if is_momentum(x) => Ok(x),
        _ => Err(BadArgument(format!(
            "expected a number in [0, 1), got '{s}'"
        ))),
    }
}

/// Parses `NAME=D0,D1,...` for `--input`.
pub fn parse_input_shape(s: &str) -> Result<(String, Vec<u64>), BadArgument> {
    let (name, dims) = s
        .split_once('=')
        .ok_or_else(|| BadArgument(format!("expected NAME=D0,D1,..., got '{s}'")))?;
    if name.is_empty() {
        return Err(BadArgument("the input name is empty".to_owned()));
    }
    let dims = dims
        .split(',')
        .map(|d| {
            d.trim()
                .parse::<u64>()
                .map_err(|_| BadArgument(format!("'{d}' is not a dimension (a positive integer)")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_owned(), dims))
}

/// Parses `NAME=V0,V1,...` for `--value`.
pub fn parse_input_value(s: &str) -> Result<(String, Vec<f64>), BadArgument> {
    let (name, values) = s
        .split_once('=')
        .ok_or_else(|| BadArgument(format!("expected NAME=V0,V1,..., got '{s}'")))?;
    if name.is_empty() {
        return Err(BadArgument("the input name is empty".to_owned()));
    }
    let values = values
        .split(',')
        .map(|v| match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            _ => Err(BadArgument(format!("'{v}' is not a finite number"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_owned(), values))
}
