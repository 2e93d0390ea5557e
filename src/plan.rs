//! `ralpc plan`: a model, a cluster and a batch in; the placement of every layer out.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ralpc_ir::input::{read_input, read_input_text, InputKind};
use ralpc_ir::{bind, onnx, verify, Bindings};
use ralpc_passes::cluster::{Cluster, Precision};
use ralpc_passes::cost::rates::KernelRates;
use ralpc_passes::cost::FusedAttention;
use ralpc_passes::cost::Optimizer;
use ralpc_passes::layers::{self, LayerGraph};
use ralpc_passes::plan::{
    self, CostOptions, Costs, Family, PlanError, Planned, Request, Schedule, StrategyFile,
};
use ralpc_passes::profile::{self, Loaded, Profile};
use ralpc_passes::transformer::{
    self, Attention, Estimate, Knobs, MemoryBreakdown, Overlap, Parallelism, Recompute, Setting,
    TimeBreakdown, Transformer,
};
use serde::Serialize;

use crate::error::FileError;
use crate::{cluster, ClusterOptions, Error};

mod load;
mod report;
mod svg;
mod warnings;

pub use report::{report_html, simulated_facts};

use load::*;
pub(crate) use load::{fixed_batch, model_warnings};
pub use svg::{graphviz_installed, render_svg, SvgSkipped, SVG_SECONDS};

/// The global batch when none is given and the model was not exported at a batch ≥ 2.
pub const DEFAULT_BATCH: u64 = 32;

/// The most instructions a transformer plan is lowered into unless asked for more: about
/// 2 GB of memory and 15 s on a 2-core machine.
pub const DEFAULT_MAX_INSTRUCTIONS: u64 = 2_000_000;

/// What to plan.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// An ONNX model or a PipeDream `graph.txt`.
    pub model: PathBuf,
    /// GPUs to plan for; `None`: every GPU of the cluster.
    pub gpus: Option<u32>,
    /// The cluster.
    pub cluster: ClusterOptions,
    /// Global batch (ONNX models; a PipeDream graph has its own); `None`: the batch the
    /// model was exported at when it is ≥ 2, else 32.
    pub batch: Option<u64>,
    /// Pipeline microbatches; `None`: searched.
    pub microbatches: Option<u32>,
    /// The family to search; `None`: all (`auto`).
    pub family: Option<Family>,
    /// The pipeline schedule; `None`: 1F1B.
    pub schedule: Option<Schedule>,
    /// Allowed GPU-sec amplification above 1; `None`: unbounded.
    pub tolerance: Option<f64>,
    /// A measured profile (ralpc's JSON or DeepPool's `.prof`).
    pub profile: Option<PathBuf>,
    /// A per-GPU memory limit below the GPUs' own, bytes.
    pub memory_limit: Option<u64>,
    /// The optimizer (its state counts in memory).
    pub optimizer: Optimizer,
    /// Math precision; `None`: the profile's, else TF32.
    pub precision: Option<Precision>,
    /// Evaluate this strategy file instead of searching.
    pub strategy_file: Option<PathBuf>,
    /// Also lower the chosen strategy into an executable plan.
    pub executable: bool,
    /// Megatron-LM's dimensions for transformer models; each one given fixes it.
    pub knobs: Knobs,
    /// Transformer plans: gradients kept and reduced in fp32 (18 B per parameter with Adam
    /// instead of 16).
    pub fp32_gradients: bool,
    /// Transformer plans: how the attention core is priced and sized (fused, as
    /// FlashAttention runs it, by default).
    pub attention: Attention,
    /// Transformer plans: whether sequence-parallel collectives are priced overlapped with
    /// the GEMMs beside them (Megatron-Core's `--tp-comm-overlap`); `None`: on, as
    /// Megatron-Bridge's recipes run. ralpc's own executor does not overlap them, so its
    /// simulated iteration is held to the price with it off.
    pub tp_comm_overlap: Option<bool>,
    /// Transformer plans: the most instructions the executable plan may hold (every rank's
    /// program is written out; lowering takes about 1 KB of memory per instruction); above
    /// it the plan is priced, not lowered. `None`: [`DEFAULT_MAX_INSTRUCTIONS`].
    pub max_instructions: Option<u64>,
    /// Full shapes of named inputs (`--input`), batch included: a sequence length, an
    /// image size; the rest keep the model's own.
    pub inputs: std::collections::BTreeMap<String, Vec<u64>>,
    /// Values of named inputs (`--value`): constants of the model from then on (a sample
    /// rate its branches depend on).
    pub values: std::collections::BTreeMap<String, Vec<f64>>,
}

/// A stage of the chosen plan.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct StageRow {
    /// Its first layer's name.
    pub first_layer: String,
    /// Its last layer's name.
    pub last_layer: String,
    /// Its GPUs.
    pub replicas: u32,
    /// Its first rank.
    pub first_rank: u32,
    /// Per-microbatch compute and resharding, µs.
    pub microbatch_us: f64,
    /// Gradient synchronization per iteration, µs.
    pub sync_us: f64,
    /// The most memory one of its GPUs holds, bytes.
    #[serde(serialize_with = "ralpc_passes::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub memory_bytes: f64,
}

/// SOAP degrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct SplitRow {
    /// Samples.
    pub sample: u32,
    /// Attributes (rows; a dense layer's input features).
    pub attribute: u32,
    /// Parameters (output channels or features).
    pub parameter: u32,
}

/// A layer of the chosen plan.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct PlacedLayer {
    /// Its name (what strategy files refer to).
    pub name: String,
    /// The PyTorch module it came from (`features.0`), when the export says.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub module: String,
    /// What it computes.
    pub op: String,
    /// GPUs it uses.
    pub gpus: u32,
    /// How it is split.
    pub split: SplitRow,
    /// Its stage.
    pub stage: usize,
    /// Forward compute per microbatch, µs.
    pub forward_us: f64,
    /// Backward compute per microbatch, µs.
    pub backward_us: f64,
    /// Its gradient synchronization per iteration, µs.
    pub sync_us: f64,
    /// Moving its inputs per microbatch, µs.
    pub transfer_us: f64,
}

impl PlacedLayer {
    /// What a user calls it: its PyTorch module when the export says, else its name.
    pub fn label(&self) -> &str {
        if self.module.is_empty() {
            &self.name
        } else {
            &self.module
        }
    }
}

/// One family's best plan, for comparison.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct CandidateRow {
    /// The family.
    pub strategy: &'static str,
    /// Predicted iteration time, µs.
    pub iteration_time_us: f64,
    /// GPU-sec amplification.
    pub gpu_sec_amplification: f64,
    /// GPUs used.
    pub gpus_used: u32,
    /// Peak memory of one GPU, bytes.
    #[serde(serialize_with = "ralpc_passes::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub peak_memory_bytes: f64,
    /// Whether it fits in memory.
    pub fits: bool,
}

/// The result of [`plan`]; its JSON form is what `ralpc plan --json` prints. Every field
/// is a function of the inputs except `planning_time_us`.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct PlanReport {
    /// Always [`crate::formats::PLAN_SUMMARY`].
    pub format: &'static str,
    /// The model path, as given.
    pub model: String,
    /// The cluster's name.
    pub cluster: String,
    /// GPUs planned for.
    pub gpus: u32,
    /// Global batch.
    pub batch: u64,
    /// The family of the chosen plan (`file` for a strategy file).
    pub strategy: &'static str,
    /// The schedule.
    pub schedule: &'static str,
    /// Microbatches per iteration.
    pub microbatches: u32,
    /// Predicted time per iteration (for a pipeline, per global batch in steady state), µs.
    pub iteration_time_us: f64,
    /// Data parallelism on every GPU under the same costs, µs.
    pub dp_iteration_time_us: f64,
    /// `dp_iteration_time_us / iteration_time_us`.
    pub speedup_over_dp: f64,
    /// One GPU's compute for the iteration, µs.
    pub single_gpu_time_us: f64,
    /// Busy GPU time per iteration, µs.
    pub gpu_time_us: f64,
    /// GPU time / single-GPU time.
    pub gpu_sec_amplification: f64,
    /// GPUs the plan uses.
    pub gpus_used: u32,
    /// The most memory any GPU holds, bytes.
    #[serde(serialize_with = "ralpc_passes::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub peak_memory_bytes: f64,
    /// What the smallest GPU may hold (its memory, or `--memory-limit`), bytes.
    #[serde(serialize_with = "ralpc_passes::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub memory_capacity_bytes: f64,
    /// Total FLOPs over the GPUs' combined peak, µs.
    pub lower_bound_us: f64,
    /// Wall time of loading and planning, µs (the one field that varies between runs).
    pub planning_time_us: u64,
    /// Stages.
    pub stages: Vec<StageRow>,
    /// Layers.
    pub layers: Vec<PlacedLayer>,
    /// Each searched family's best plan.
    pub candidates: Vec<CandidateRow>,
    /// What simulating the executable plan found, when it was lowered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<SimulatedRow>,
    /// What a user should know before trusting the plan (slower than data parallelism,
    /// options that cost time).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Transformer plans: Megatron-LM's configuration and where time and memory go.
    #[serde(flatten)]
    pub parallelism: Option<ParallelismRow>,
}

/// A transformer plan's configuration (Megatron-LM's arguments) and its figures.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ParallelismRow {
    /// Tensor-parallel degree.
    pub tensor_parallel: u32,
    /// Pipeline stages.
    pub pipeline_parallel: u32,
    /// Data-parallel replicas.
    pub data_parallel: u32,
    /// Sequences per microbatch.
    pub micro_batch_size: u64,
    /// Model chunks per GPU (interleaved 1F1B above 1).
    pub virtual_stages: u32,
    /// `none`, `selective` or `full`.
    pub recompute: &'static str,
    /// Sequence parallelism.
    pub sequence_parallel: bool,
    /// ZeRO stage.
    pub zero: u8,
    /// The math precision the price assumed.
    pub precision: Precision,
    /// How the price assumed attention runs: `fused` or `unfused`.
    pub attention: Attention,
    /// Whether the price assumed sequence-parallel collectives overlapped with their GEMMs
    /// (Megatron-Core's `--tp-comm-overlap`).
    pub tp_comm_overlap: bool,
    /// Forward + backward FLOPs per iteration, no recomputation.
    pub model_flops_per_iteration: f64,
    /// FLOPs executed per iteration, recomputation included.
    pub hardware_flops_per_iteration: f64,
    /// The recognized model.
    pub transformer: Transformer,
    /// Where an iteration's time goes, µs.
    pub time_breakdown: TimeBreakdown,
    /// The fullest GPU's memory by kind, bytes.
    pub memory_breakdown: MemoryBreakdown,
    /// Configurations the search priced.
    pub configurations_priced: u64,
}

/// The simulator's figures for the chosen plan.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SimulatedRow {
    /// One iteration, µs.
    pub iteration_time_us: f64,
    /// Busy GPU time over all ranks, µs.
    pub gpu_time_us: f64,
    /// Idle GPU time over all ranks, µs.
    pub idle_us: f64,
    /// Idle windows of at least 100 µs, over all ranks.
    pub idle_windows: usize,
    /// Bytes moved per link class (`intra_node`, `inter_node`, `inter_rack`).
    pub bytes_by_link: std::collections::BTreeMap<ralpc_codegen::LinkClass, u64>,
    /// Each rank's peak memory from the instruction order, bytes.
    pub peak_memory_bytes: Vec<u64>,
}

impl SimulatedRow {
    /// The row of a simulation.
    pub fn of(sim: &ralpc_codegen::Simulation) -> SimulatedRow {
        SimulatedRow {
            iteration_time_us: sim.iteration_time_us,
            gpu_time_us: sim.gpu_time_us,
            idle_us: sim.ranks.iter().map(|r| r.idle_us).sum::<f64>().max(0.0),
            idle_windows: sim.ranks.iter().map(|r| r.idle_windows.len()).sum(),
            bytes_by_link: sim.bytes_by_link.clone(),
            peak_memory_bytes: sim.ranks.iter().map(|r| r.peak_memory_bytes).collect(),
        }
    }
}

/// A plan and its strategy in file form.
#[derive(Clone, Debug)]
pub struct PlanOutput {
    /// The report.
    pub report: PlanReport,
    /// The chosen strategy (what `--write-strategy` writes); transformer plans have none.
    pub strategy: Option<StrategyFile>,
    /// The executable plan and its pictures, when asked for.
    pub executable: Option<Executable>,
    /// Why a transformer plan was not lowered, when asked for.
    pub not_lowered: Option<String>,
}

/// The executable plan, simulated, and its visualizations.
#[derive(Clone, Debug)]
pub struct Executable {
    /// The plan (`plan.json`).
    pub plan: ralpc_codegen::Plan,
    /// The simulated iteration.
    pub simulation: ralpc_codegen::Simulation,
    /// The placed layer graph, Graphviz DOT (`plan.dot`).
    pub dot: String,
    /// What `plan.svg` is drawn from: `dot`, or for a large model its runs of alike layers
    /// (`ralpc_codegen::viz::drawing`).
    pub drawing: String,
    /// The simulated timeline, Chrome trace JSON (`timeline.json`).
    pub timeline: String,
    /// Every instruction as the simulator ran it.
    pub ran: Vec<ralpc_codegen::viz::Ran>,
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1e3)
}

/// Whether the transformer planner takes the model: a recognized GPT-like decoder under
/// `auto` or `3d`. Asking for `3d` or Megatron's options on anything else says why not.
fn transformer_of(model: &Model, options: &PlanOptions) -> Result<Option<Transformer>, Error> {
    let asked = options.family == Some(Family::ThreeD);
    let knobs = options.knobs != Knobs::default() || options.fp32_gradients;
    let family_ok = matches!(options.family, None | Some(Family::Auto | Family::ThreeD));
    if knobs && !family_ok {
        return Err(request_error(format!(
            "Megatron-LM's options (--tensor-parallel, --pipeline-parallel, --recompute, …) \
             apply to the 3d strategy, not to --strategy {}",
            options.family.map_or("auto", Family::name)
        )));
    }
    if options.strategy_file.is_some() {
        if asked || knobs {
            return Err(request_error(
                "a strategy file places layers; it does not combine with the 3d strategy or \
                 Megatron-LM's options"
                    .into(),
            ));
        }
        return Ok(None);
    }
    let recognized = match model {
        Model::Graph { graph, info, .. } => transformer::recognize(graph, info),
        Model::Layers(_) => Err(transformer::NotATransformer(
            "a PipeDream layer graph has no transformer shape".into(),
        )),
    };
    match recognized {
        Ok(t) if family_ok => Ok(Some(t)),
        Ok(_) => Ok(None),
        Err(e) if asked || knobs => Err(request_error(format!(
            "{}: the 3d strategy needs a GPT-like model; {e}",
            options.model.display()
        ))),
        Err(_) => Ok(None),
    }
}

/// The cluster, grown to `gpus` when the default preset is too small.
fn cluster_for(options: &PlanOptions) -> Result<(Cluster, u32), Error> {
    let mut cluster = cluster(&options.cluster)?;
    let have = cluster.gpu_count();
    let gpus = options.gpus.unwrap_or(have);
    if gpus == 0 {
        return Err(Error::Plan(Box::new(PlanError::Request(
            "--gpus must be at least 1".into(),
        ))));
    }
    if gpus > have {
        // A bare preset name (`selene`) names a kind of node, not a count: it grows like
        // the default; a file, `NAMExN` or --nodes fix the size.
        let sized = options
            .cluster
            .spec
            .as_deref()
            .is_some_and(|s| !ralpc_passes::cluster::PRESETS.contains(&s));
        if sized || options.cluster.nodes.is_some() {
            return Err(Error::Plan(Box::new(PlanError::Request(format!(
                "--gpus {gpus}: cluster {} has {have} GPUs (add --nodes)",
                cluster.name
            )))));
        }
        cluster = cluster.times(gpus.div_ceil(have.max(1)));
    }
    Ok((cluster, gpus))
}

fn load_profile(path: &Path) -> Result<Profile, Error> {
    match profile::load(path)? {
        Loaded::Profile(p) => Ok(p),
        Loaded::LayerGraph(_) => Err(Error::Plan(Box::new(PlanError::Request(format!(
            "{} is a PipeDream layer graph: give it as the model, not as --profile",
            path.display()
        ))))),
    }
}

/// `--memory-limit` can only lower what a GPU holds: one above the smallest GPU's memory
/// would be ignored, and a plan that does not fit would then suggest raising it.
fn check_memory_limit(limit: Option<u64>, cluster: &Cluster, gpus: u32) -> Result<(), Error> {
    const GIB: f64 = (1u64 << 30) as f64;
    let Some(limit) = limit else {
        return Ok(());
    };
    let own = (0..gpus)
        .map(|r| cluster.gpu(r).memory_bytes)
        .min()
        .unwrap_or(0);
    if limit > own {
        return Err(Error::Plan(Box::new(PlanError::Request(format!(
            "--memory-limit {:.2} GiB is above the GPUs' own {:.2} GiB: it can only lower the \
             memory a plan may use",
            limit as f64 / GIB,
            own as f64 / GIB
        )))));
    }
    Ok(())
}

/// Plans a model: loads it, builds its layer graph, resolves the cluster and searches (or
/// evaluates `strategy_file`). The report warns when the plan is slower than data
/// parallelism, or when what the options fixed cost time against ralpc's own choice.
///
/// # Errors
/// Any input at fault (model, profile, cluster, strategy file), a model that does not fit
/// in memory, or a GPU-time budget no plan meets.
pub fn plan(options: &PlanOptions) -> Result<PlanOutput, Error> {
    let started = Instant::now();
    let model = model_of(options)?;
    let mut warnings = model.warnings();
    let mut out = plan_model(options, model, started)?;
    warnings.extend(warnings::warnings(&out.report, options));
    out.report.warnings = warnings;
    Ok(out)
}

/// [`plan`] without its warnings.
fn plan_as_asked(options: &PlanOptions) -> Result<PlanOutput, Error> {
    let started = Instant::now();
    plan_model(options, model_of(options)?, started)
}

/// The model `options` ask for, bound at their batch, shapes and values.
fn model_of(options: &PlanOptions) -> Result<Model, Error> {
    load_model(
        &options.model,
        options.batch,
        &options.inputs,
        &options.values,
    )
}

/// [`plan`] of the loaded `model` without its warnings.
fn plan_model(options: &PlanOptions, model: Model, started: Instant) -> Result<PlanOutput, Error> {
    let (cluster, gpus) = cluster_for(options)?;
    check_memory_limit(options.memory_limit, &cluster, gpus)?;
    if let Some(shape) = transformer_of(&model, options)? {
        return plan_transformer(options, shape, model, &cluster, gpus, started);
    }
    let profile = options.profile.as_deref().map(load_profile).transpose()?;
    let precision = options
        .precision
        .or(profile.as_ref().map(|p| p.precision))
        .unwrap_or(Precision::Tf32);
    check_precision(&cluster, gpus, precision)?;
    let (graph, ops) = load_layers(model, precision)?;
    let costs = Costs::new(
        &graph,
        &cluster,
        gpus,
        CostOptions {
            precision,
            profile: profile.as_ref(),
            optimizer: options.optimizer,
            memory_limit: options.memory_limit,
            ..CostOptions::default()
        },
    );
    let strategy = match &options.strategy_file {
        Some(path) => {
            let text = read_input_text(path, InputKind::Text).map_err(|source| {
                Error::Read(Box::new(FileError {
                    path: path.display().to_string(),
                    error: source,
                }))
            })?;
            let file = StrategyFile::parse(&text).map_err(|e| in_file(path, e))?;
            Some(file.resolve(&graph).map_err(|e| in_file(path, e))?)
        }
        None => None,
    };
    let from_file = strategy.is_some();
    let request = Request {
        family: options.family,
        schedule: options.schedule,
        microbatches: options.microbatches,
        tolerance: options.tolerance,
        strategy,
    };
    let planned = plan::plan(&costs, &request).map_err(|e| Error::Plan(Box::new(e)))?;
    let strategy = StrategyFile::of(&graph, &planned.chosen.strategy);
    let executable = if options.executable {
        Some(executable(
            options,
            &costs,
            &planned.chosen.strategy,
            ops.as_deref(),
        )?)
    } else {
        None
    };
    let planning_time_us = started.elapsed().as_micros() as u64;
    let report = report(
        options,
        &graph,
        &cluster,
        gpus,
        &planned,
        from_file,
        planning_time_us,
    );
    Ok(PlanOutput {
        report,
        strategy: Some(strategy),
        executable,
        not_lowered: None,
    })
}

/// Lowers `strategy` into the executable plan of `options.model`, simulates it and draws it.
fn executable(
    options: &PlanOptions,
    costs: &Costs<'_>,
    strategy: &ralpc_passes::plan::Strategy,
    ops: Option<&ralpc_ir::Graph>,
) -> Result<Executable, Error> {
    let graph = costs.graph;
    let bytes = read_input(&options.model, InputKind::Model).map_err(|error| {
        Error::Read(Box::new(FileError {
            path: options.model.display().to_string(),
            error,
        }))
    })?;
    let model = ralpc_codegen::ModelRef {
        name: options
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: Some(options.model.display().to_string()),
        blake3: ralpc_codegen::model_hash(&bytes),
        layers: graph.layers.len() as u32,
        inputs: options.inputs.clone(),
        values: options.values.clone(),
    };
    let mut plan =
        ralpc_codegen::lower(costs, strategy, model).map_err(|e| Error::Plan(Box::new(e)))?;
    if ops.is_some() {
        check_local_batches(options, strategy, plan.batch)?;
    }
    plan.layout = ops.and_then(|ops| ralpc_codegen::Layout::describe(ops, graph, strategy));
    let simulation = ralpc_codegen::simulate(&plan).map_err(|e| {
        // A plan ralpc lowered that cannot run is a bug in ralpc, not in the input.
        Error::Internal(Box::new(format!("the lowered plan does not run: {e}")))
    })?;
    let ran: Vec<ralpc_codegen::viz::Ran> = simulation
        .ranks
        .iter()
        .enumerate()
        .flat_map(|(rank, t)| {
            t.spans.iter().map(move |s| ralpc_codegen::viz::Ran {
                rank: rank as u32,
                index: s.index,
                start_us: s.start_us,
                end_us: s.end_us,
            })
        })
        .collect();
    Ok(Executable {
        dot: ralpc_codegen::viz::dot(&plan, graph),
        drawing: ralpc_codegen::viz::drawing(&plan, graph),
        timeline: ralpc_codegen::viz::trace(&plan, &ran),
        ran,
        simulation,
        plan,
    })
}

/// The batch sizes the ranks compute layers at under `strategy` for a global `batch`: each
/// microbatch cut into its layers' sample pieces (piece `i` of `n` of `N` samples being
/// `⌊(i+1)·N/n⌋ − ⌊i·N/n⌋`).
fn local_batches(
    batch: u64,
    strategy: &ralpc_passes::plan::Strategy,
) -> std::collections::BTreeSet<u64> {
    let piece = |n: u64, of: u64, i: u64| (i + 1) * n / of - i * n / of;
    let m = u64::from(strategy.microbatches.max(1));
    let splits: std::collections::BTreeSet<u64> = strategy
        .layers
        .iter()
        .map(|l| u64::from(l.sample.max(1)))
        .collect();
    let mut out = std::collections::BTreeSet::new();
    for j in 0..m {
        let microbatch = piece(batch, m, j);
        for &s in &splits {
            out.extend((0..s).map(|i| piece(microbatch, s, i)).filter(|&b| b > 0));
        }
    }
    out
}

/// Refuses a plan whose ranks would compute the model at a batch it cannot be re-batched
/// to (an exporter baked the batch into a node), naming the node: found now, not when a
/// rank runs it.
fn check_local_batches(
    options: &PlanOptions,
    strategy: &ralpc_passes::plan::Strategy,
    batch: u64,
) -> Result<(), Error> {
    let others: Vec<u64> = local_batches(batch, strategy)
        .into_iter()
        .filter(|&b| b != batch)
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    let mut unbound = onnx::import(&options.model)?.graph;
    ralpc_ir::bind_values(&mut unbound, &options.values)?;
    for b in others {
        if let Err(e) = crate::run::at_batch(&unbound, b, &options.inputs) {
            return Err(request_error(format!(
                "a rank of this plan computes {b} of the batch's {batch} samples at a time, \
                 which the model cannot (plan it on one GPU): {}",
                crate::run::chain(&e)
            )));
        }
    }
    Ok(())
}

/// Refuses a precision the GPUs lack tensor cores for (FP8 before Hopper, MXFP8 before
/// Blackwell), naming the GPU.
fn check_precision(cluster: &Cluster, gpus: u32, precision: Precision) -> Result<(), Error> {
    if !precision.is_fp8() {
        return Ok(());
    }
    match (0..gpus.max(1))
        .map(|r| cluster.gpu(r))
        .find(|g| g.peak(precision).is_none())
    {
        Some(gpu) => Err(request_error(format!(
            "--precision {}: the {} ({}) has no tensor cores for it (FP8 needs Hopper or \
             later, MXFP8 Blackwell)",
            precision.name(),
            gpu.name,
            gpu.generation.name()
        ))),
        None => Ok(()),
    }
}

/// The executable form of a transformer plan, where it has one: its layered strategy,
/// lowered on the model's layer graph (priced there by the layered cost model), or why not.
fn lower_transformer(
    options: &PlanOptions,
    graph: &LayerGraph,
    ops: Option<&ralpc_ir::Graph>,
    strategy: &ralpc_passes::plan::Strategy,
    cluster: &Cluster,
    gpus: u32,
    precision: Precision,
) -> Result<Result<Executable, String>, Error> {
    // Every rank's program is written out: per microbatch and layer, a forward, a backward
    // and a recomputation or collective or two.
    let instructions: u64 = strategy
        .stages
        .iter()
        .map(|s| {
            let layers = (s.last_layer + 1 - s.first_layer) as u64;
            u64::from(s.gpus) * u64::from(strategy.microbatches) * layers * 6
        })
        .sum();
    let limit = options.max_instructions.unwrap_or(DEFAULT_MAX_INSTRUCTIONS);
    if instructions > limit {
        return Ok(Err(format!(
            "its executable plan would hold about {instructions} instructions, more than \
             --max-instructions {limit} (lowering takes about 1 KB of memory each; raise \
             it to lower this plan)"
        )));
    }
    // Its GEMMs and memory-bound kernels at the rates the transformer estimate prices
    // them at, so that the lowered plan and the estimate agree on compute.
    let gpu = cluster.gpu(0);
    let rates = KernelRates::new(gpu, precision);
    let mut efficiency = ralpc_passes::cost::Efficiency::default();
    efficiency.0.insert(
        ralpc_passes::layers::LayerKind::Dense,
        rates.gemm / gpu.peak(precision).unwrap_or(gpu.fp32),
    );
    let costs = Costs::new(
        graph,
        cluster,
        gpus,
        CostOptions {
            precision,
            optimizer: options.optimizer,
            memory_limit: options.memory_limit,
            efficiency: Some(efficiency),
            hbm_efficiency: Some(rates.hbm / gpu.hbm_bandwidth),
            fused_attention: (options.attention == Attention::Fused).then_some(FusedAttention {
                forward: rates.attention_forward,
                backward: rates.attention_backward,
            }),
            ..CostOptions::default()
        },
    );
    Ok(Ok(executable(options, &costs, strategy, ops)?))
}

/// Plans a recognized transformer in Megatron-LM's space.
fn plan_transformer(
    options: &PlanOptions,
    shape: Transformer,
    model: Model,
    cluster: &Cluster,
    gpus: u32,
    started: Instant,
) -> Result<PlanOutput, Error> {
    if options.profile.is_some() {
        return Err(request_error(
            "--profile: the transformer planner prices blocks analytically and reads no \
             profile yet (use --strategy dp|burst|soap|pipeline to plan layer by layer)"
                .into(),
        ));
    }
    if options.microbatches.is_some() {
        return Err(request_error(
            "--microbatches: transformer plans take --micro-batch-size (sequences per \
             microbatch); the count follows from the batch and the data-parallel degree"
                .into(),
        ));
    }
    let Model::Graph {
        batch,
        ref fixed_batch,
        ..
    } = model
    else {
        return Err(Error::Internal(Box::new(
            "a transformer was recognized outside an ONNX graph".into(),
        )));
    };
    let precision = options.precision.unwrap_or(Precision::Tf32);
    check_precision(cluster, gpus, precision)?;
    let setting = Setting {
        model: &shape,
        batch,
        sample_pieces: if fixed_batch.is_some() { 1 } else { batch },
        cluster,
        gpus,
        precision,
        optimizer: options.optimizer,
        fp32_gradients: options.fp32_gradients,
        workspace_bytes: ralpc_passes::cost::memory::DEFAULT_WORKSPACE_BYTES,
        memory_limit: options.memory_limit,
        attention: options.attention,
        // ZeRO-3's gathers are priced as ralpc's executor runs them, one block at a time
        // when it runs: not yet as FSDP prefetches them.
        overlap: Overlap {
            tensor_parallel: options.tp_comm_overlap.unwrap_or(true),
            sharded_parameters: false,
            ..Overlap::MEGATRON_CORE
        },
    };
    let knobs = Knobs {
        schedule: options.schedule.or(options.knobs.schedule),
        ..options.knobs
    };
    let found = transformer::search(&setting, &knobs).map_err(|e| Error::Plan(Box::new(e)))?;
    // One GPU's compute for the iteration: the model unsplit, one sequence at a time.
    let one_gpu = Setting {
        gpus: 1,
        memory_limit: None,
        ..setting.clone()
    };
    let single = transformer::estimate(
        &one_gpu,
        &Parallelism {
            tensor: 1,
            context: 1,
            pipeline: 1,
            data: 1,
            micro_batch: 1,
            virtual_stages: 1,
            recompute: Recompute::None,
            sequence_parallel: false,
            zero: 0,
            schedule: Schedule::OneFOneB,
        },
    );
    let single_gpu_time_us = single.time.compute_us + single.time.optimizer_us;
    let best = &found.best;
    let par = best.parallelism;
    let peak_total = ralpc_passes::cost::combined_peak(cluster, gpus, precision);
    let used = par.gpus() as u32;
    let ranks_per_stage = par.tensor * par.data;
    let split = SplitRow {
        sample: par.data,
        attribute: 1,
        parameter: par.tensor,
    };
    let mut layers = Vec::new();
    let mut stages = Vec::new();
    let mut next = 0u64;
    for (k, &n) in best.stage_layers.iter().enumerate() {
        let last = k + 1 == best.stage_layers.len();
        let mut names = Vec::new();
        if k == 0 {
            names.push((
                "embedding".to_owned(),
                "Gather (vocabulary-parallel)",
                best.embedding_us,
                0.0,
            ));
        }
        for i in next..next + n {
            names.push((
                format!("block.{i}"),
                "attention + MLP (heads and MLP columns/rows split)",
                best.block_forward_us,
                best.block_backward_us,
            ));
        }
        if last {
            names.push((
                "head".to_owned(),
                "LayerNorm + MatMul + cross-entropy (vocabulary-parallel)",
                best.head_us,
                0.0,
            ));
        }
        stages.push(StageRow {
            first_layer: names.first().map(|n| n.0.clone()).unwrap_or_default(),
            last_layer: names.last().map(|n| n.0.clone()).unwrap_or_default(),
            replicas: ranks_per_stage,
            first_rank: k as u32 * ranks_per_stage,
            microbatch_us: best.stage_us[k],
            sync_us: best.time.data_comm_us,
            memory_bytes: best.stage_memory_bytes[k],
        });
        for (name, op, forward_us, backward_us) in names {
            layers.push(PlacedLayer {
                name,
                module: String::new(),
                op: op.to_owned(),
                gpus: ranks_per_stage,
                split,
                stage: k,
                forward_us,
                backward_us,
                sync_us: 0.0,
                transfer_us: 0.0,
            });
        }
        next += n;
    }
    let row = |strategy: &'static str, e: &Estimate| CandidateRow {
        strategy,
        iteration_time_us: e.iteration_time_us,
        gpu_sec_amplification: e.iteration_time_us * e.parallelism.gpus() as f64
            / single_gpu_time_us.max(1e-9),
        gpus_used: e.parallelism.gpus() as u32,
        peak_memory_bytes: e.peak_memory_bytes,
        fits: e.fits,
    };
    let chosen = row("3d", best);
    let report = PlanReport {
        format: crate::formats::PLAN_SUMMARY,
        warnings: Vec::new(),
        model: options.model.display().to_string(),
        cluster: cluster.name.clone(),
        gpus,
        batch,
        strategy: "3d",
        schedule: par.schedule_name(),
        microbatches: u32::try_from(best.microbatches).unwrap_or(u32::MAX),
        iteration_time_us: best.iteration_time_us,
        dp_iteration_time_us: found.data_parallel.iteration_time_us,
        speedup_over_dp: found.data_parallel.iteration_time_us / best.iteration_time_us,
        single_gpu_time_us,
        gpu_time_us: best.iteration_time_us * f64::from(used),
        gpu_sec_amplification: chosen.gpu_sec_amplification,
        gpus_used: used,
        peak_memory_bytes: best.peak_memory_bytes,
        memory_capacity_bytes: best.memory_capacity_bytes,
        lower_bound_us: best.model_flops / peak_total * 1e6,
        planning_time_us: started.elapsed().as_micros() as u64,
        stages,
        layers,
        candidates: vec![chosen, row("dp", &found.data_parallel)],
        simulated: None,
        parallelism: Some(ParallelismRow {
            tensor_parallel: par.tensor,
            pipeline_parallel: par.pipeline,
            data_parallel: par.data,
            micro_batch_size: par.micro_batch,
            virtual_stages: par.virtual_stages,
            recompute: par.recompute.name(),
            precision: options.precision.unwrap_or(Precision::Tf32),
            attention: options.attention,
            tp_comm_overlap: options.tp_comm_overlap.unwrap_or(true)
                && par.sequence_parallel
                && par.tensor > 1,
            sequence_parallel: par.sequence_parallel,
            zero: par.zero,
            model_flops_per_iteration: best.model_flops,
            hardware_flops_per_iteration: best.hardware_flops,
            transformer: shape,
            time_breakdown: best.time,
            memory_breakdown: best.memory,
            configurations_priced: found.evaluated,
        }),
    };
    // The layer-graph form names every layer's placement (what `ralpc.torch` applies),
    // also when the plan is not lowered.
    let (graph, ops) = load_layers(model, precision)?;
    let (strategy, executable, not_lowered) =
        match transformer::layered(&graph, ops.as_deref(), best) {
            Err(why) => (None, None, Some(why.0)),
            Ok(layered) => {
                let file = StrategyFile::of(&graph, &layered);
                if !options.executable {
                    (Some(file), None, None)
                } else {
                    match lower_transformer(
                        options,
                        &graph,
                        ops.as_deref(),
                        &layered,
                        cluster,
                        gpus,
                        precision,
                    )? {
                        Ok(executable) => (Some(file), Some(executable), None),
                        Err(why) => (Some(file), None, Some(why)),
                    }
                }
            }
        };
    Ok(PlanOutput {
        report,
        strategy,
        executable,
        not_lowered,
    })
}

fn in_file(path: &Path, e: PlanError) -> Error {
    Error::Plan(Box::new(PlanError::Strategy(format!(
        "{}: {}",
        path.display(),
        match e {
            PlanError::Strategy(m) => m,
            other => other.to_string(),
        }
    ))))
}

fn report(
    options: &PlanOptions,
    graph: &LayerGraph,
    cluster: &Cluster,
    gpus: u32,
    planned: &Planned,
    from_file: bool,
    planning_time_us: u64,
) -> PlanReport {
    let chosen = &planned.chosen;
    let e = &chosen.evaluation;
    let s = &chosen.strategy;
    let stage_of = s.stage_of_layers();
    PlanReport {
        format: crate::formats::PLAN_SUMMARY,
        warnings: Vec::new(),
        model: options.model.display().to_string(),
        cluster: cluster.name.clone(),
        gpus,
        batch: graph.batch,
        strategy: if from_file {
            "file"
        } else {
            chosen.family.name()
        },
        schedule: s.schedule.name(),
        microbatches: s.microbatches,
        iteration_time_us: e.iteration_time_us,
        dp_iteration_time_us: planned.data_parallel.iteration_time_us,
        speedup_over_dp: planned.data_parallel.iteration_time_us / e.iteration_time_us,
        single_gpu_time_us: planned.single_gpu_time_us,
        gpu_time_us: e.gpu_time_us,
        gpu_sec_amplification: e.gpu_sec_amplification,
        gpus_used: e.gpus_used,
        peak_memory_bytes: e.peak_memory_bytes,
        memory_capacity_bytes: (0..gpus)
            .map(|r| {
                let own = cluster.gpu(r).memory_bytes;
                options.memory_limit.map_or(own, |l| l.min(own)) as f64
            })
            .fold(f64::INFINITY, f64::min),
        lower_bound_us: planned.lower_bound_us,
        planning_time_us,
        stages: s
            .stages
            .iter()
            .zip(&e.stages)
            .map(|(st, c)| StageRow {
                first_layer: graph.layers[st.first_layer].name.clone(),
                last_layer: graph.layers[st.last_layer].name.clone(),
                replicas: st.gpus,
                first_rank: st.first_rank,
                microbatch_us: c.microbatch_us,
                sync_us: c.sync_us,
                memory_bytes: c.memory_bytes,
            })
            .collect(),
        layers: graph
            .layers
            .iter()
            .enumerate()
            .map(|(l, layer)| {
                let split = s.layers[l];
                let c = &e.layers[l];
                PlacedLayer {
                    name: layer.name.clone(),
                    module: layer.module.clone(),
                    op: layer.op.clone(),
                    gpus: split.degree(),
                    split: SplitRow {
                        sample: split.sample,
                        attribute: split.attribute,
                        parameter: split.parameter,
                    },
                    stage: stage_of[l],
                    forward_us: c.forward_us,
                    backward_us: c.backward_us,
                    sync_us: c.sync_us,
                    transfer_us: c.transfer_us,
                }
            })
            .collect(),
        candidates: planned
            .candidates
            .iter()
            .map(|c| CandidateRow {
                strategy: if from_file { "file" } else { c.family.name() },
                iteration_time_us: c.evaluation.iteration_time_us,
                gpu_sec_amplification: c.evaluation.gpu_sec_amplification,
                gpus_used: c.evaluation.gpus_used,
                peak_memory_bytes: c.evaluation.peak_memory_bytes,
                fits: c.evaluation.fits,
            })
            .collect(),
        simulated: None,
        parallelism: None,
    }
}
