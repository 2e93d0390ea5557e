//! `ralpc plan`: a model, a cluster and a batch in; the placement of every layer out.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ralpc_ir::input::{read_input, read_input_text, InputKind};
use ralpc_ir::{bind, onnx, verify, Bindings};
use ralpc_passes::cluster::{Cluster, Precision};
use ralpc_passes::cost::Optimizer;
use ralpc_passes::layers::LayerGraph;
use ralpc_passes::plan::{Costs, Family, PlanError, Planned, Schedule, StrategyFile};
use ralpc_passes::planner::{self, Ask, Model, Priced};
use ralpc_passes::profile::{self, Loaded, Profile};
use ralpc_passes::transformer::{
    Attention, Estimate, ExpertOptions, Knobs, MemoryBreakdown, NotLayered, TimeBreakdown,
    Transformer,
};

use crate::error::FileError;
use crate::{cluster, ClusterOptions, Error};

mod background;
mod load;
mod report;
mod set;
mod summary;
mod svg;
mod warnings;

pub use background::{BackgroundOptions, BackgroundRow, PartitionRow, DEFAULT_BACKGROUND_BATCH};
pub use report::{report_html, simulated_facts};
pub use set::{plan_set, SetGroup, SetModel, SetReport};
pub use summary::{
    layer_rows, runs_placed_alike, CandidateRow, ParallelismRow, PlacedLayer, PlanReport,
    SimulatedRow, SplitRow, StageRow,
};

use load::*;
pub(crate) use load::{fixed_batch, model_warnings};
pub use svg::{graphviz_installed, render_svg, SvgSkipped, SVG_SECONDS};

/// The global batch when none is given and the model was not exported at a batch ≥ 2.
pub const DEFAULT_BATCH: u64 = 32;

/// The most instructions a transformer plan is lowered into unless asked for more: about
/// 2 GB of memory and 15 s on a 2-core machine.
pub const DEFAULT_MAX_INSTRUCTIONS: u64 = 2_000_000;

/// The most instructions any plan may be lowered into: about 100 GB of memory to lower,
/// more than a host planning it holds (a larger `--max-instructions` would be minutes of
/// work ending in an allocation failure, not a plan).
pub const MAX_INSTRUCTIONS: u64 = 100_000_000;

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
    /// Transformer plans with experts: their load imbalance, dispatcher and all-to-all
    /// overlap.
    pub experts: ExpertOptions,
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
    /// A one-GPU job trained in the foreground plan's idle GPU time (DeepPool's GPU
    /// multiplexing), priced against static partitions of the GPUs.
    pub background: Option<BackgroundOptions>,
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
    /// Each rank's passes' time beyond their share of one GPU's
    /// ([`ralpc_codegen::background::spare_compute_us`]), µs; found only for a plan with a
    /// background job (empty otherwise).
    pub spare_us: Vec<f64>,
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1e3)
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
    let mut warnings = warnings_of(&model);
    let mut out = plan_model(options, model, started)?;
    if let Some(asked) = &options.background {
        let (row, recorded) = background::background(options, asked, &out)?;
        warnings.extend(background::warnings(&row));
        out.report.background = Some(row);
        if let Some(executable) = &mut out.executable {
            executable.plan.background = Some(recorded);
        }
    }
    warnings.extend(warnings::warnings(&out.report, options));
    out.report.warnings = warnings;
    Ok(out)
}

/// Refuses a cluster of several GPU types for `what`: its figures (a one-GPU job's speed
/// and memory, the GPUs a share gets) would depend on which type each GPU is, which it
/// does not price yet.
fn one_gpu_type(options: &PlanOptions, what: &str) -> Result<(), Error> {
    let (cluster, gpus) = cluster_for(options)?;
    let first = &cluster.gpu(0).name;
    match (1..gpus)
        .map(|r| &cluster.gpu(r).name)
        .find(|n| *n != first)
    {
        Some(other) => Err(request_error(format!(
            "{what} on GPUs of one type: these {gpus} are {first} and {other}"
        ))),
        None => Ok(()),
    }
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

/// [`plan`] of the loaded `model` without its warnings: load → plan (the one front door,
/// [`planner::plan`]) → lower.
fn plan_model(options: &PlanOptions, model: Model, started: Instant) -> Result<PlanOutput, Error> {
    let (cluster, gpus) = cluster_for(options)?;
    check_memory_limit(options.memory_limit, &cluster, gpus)?;
    let profile = options.profile.as_deref().map(load_profile).transpose()?;
    let strategy_file = options
        .strategy_file
        .as_deref()
        .map(read_strategy_file)
        .transpose()?;
    let name = options.model.display().to_string();
    let strategy_name = options
        .strategy_file
        .as_ref()
        .map(|p| p.display().to_string());
    let ask = Ask {
        model: &name,
        family: options.family,
        schedule: options.schedule,
        microbatches: options.microbatches,
        tolerance: options.tolerance,
        strategy: strategy_file.as_ref().zip(strategy_name.as_deref()),
        profile: profile.as_ref(),
        memory_limit: options.memory_limit,
        optimizer: options.optimizer,
        precision: options.precision,
        knobs: options.knobs,
        fp32_gradients: options.fp32_gradients,
        attention: options.attention,
        tp_comm_overlap: options.tp_comm_overlap,
        experts: options.experts,
    };
    let planned = planner::plan(model, &cluster, gpus, &ask).map_err(plan_error)?;
    let planning_time_us = started.elapsed().as_micros() as u64;
    match &planned.priced {
        Priced::Layers(found) => {
            let report = summary::layers(
                options,
                &planned.graph,
                &cluster,
                gpus,
                found,
                strategy_file.is_some(),
                planning_time_us,
            );
            let executable = if options.executable {
                let costs = planned.costs();
                Some(executable(
                    options,
                    &costs,
                    &found.chosen.strategy,
                    planned.ops.as_deref(),
                )?)
            } else {
                None
            };
            Ok(PlanOutput {
                report,
                strategy: Some(StrategyFile::of(&planned.graph, &found.chosen.strategy)),
                executable,
                not_lowered: None,
            })
        }
        Priced::Transformer(found) => {
            let report = summary::transformer(options, &planned, found, planning_time_us);
            // The layer-graph form names every layer's placement (what `ralpc.torch`
            // applies), also when the plan is not lowered.
            let (strategy, executable, not_lowered) = match &found.layered {
                Err(why) => (None, None, Some(why.0.clone())),
                Ok(layered) => {
                    let file = Some(StrategyFile::of(&planned.graph, &layered.strategy));
                    match options
                        .executable
                        .then(|| lower_transformer(options, &planned, &layered.strategy))
                        .transpose()?
                    {
                        None => (file, None, None),
                        Some(Ok(executable)) => (file, Some(executable), None),
                        Some(Err(NotLayered(why))) => (file, None, Some(why)),
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
    }
}

/// A strategy file, read and parsed (its layers are resolved against the model's when
/// planning).
fn read_strategy_file(path: &Path) -> Result<StrategyFile, Error> {
    let text = read_input_text(path, InputKind::Text).map_err(|source| {
        Error::Read(Box::new(FileError {
            path: path.display().to_string(),
            error: source,
        }))
    })?;
    StrategyFile::parse(&text).map_err(|e| in_file(path, e))
}

/// The library's error for a planner's: a layer graph that could not be built keeps its
/// own kind.
fn plan_error(e: PlanError) -> Error {
    match e {
        PlanError::Layers(e) => Error::Layers(Box::new(e)),
        e => Error::Plan(Box::new(e)),
    }
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
    let spare_us = if options.background.is_some() {
        ralpc_codegen::background::spare_compute_us(&plan, &simulation, |layer, rank| {
            costs.one_gpu_pass_us(layer as usize, rank, strategy.microbatches)
        })
    } else {
        Vec::new()
    };
    Ok(Executable {
        spare_us,
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

/// The executable form of a transformer plan's layered `strategy`, lowered against the
/// costs it was priced under, or why it is not lowered.
fn lower_transformer(
    options: &PlanOptions,
    planned: &planner::Plan<'_>,
    strategy: &ralpc_passes::plan::Strategy,
) -> Result<Result<Executable, NotLayered>, Error> {
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
    if limit > MAX_INSTRUCTIONS {
        return Err(Error::Plan(Box::new(
            ralpc_passes::plan::PlanError::Request(format!(
                "--max-instructions {limit}: at most {MAX_INSTRUCTIONS} (about 100 GB of \
                 memory to lower)"
            )),
        )));
    }
    if instructions > limit {
        let advice = if instructions > MAX_INSTRUCTIONS {
            "more than any plan is lowered into: fewer microbatches or GPUs make it smaller"
        } else {
            "raise it to lower this plan"
        };
        return Ok(Err(NotLayered(format!(
            "its executable plan would hold about {instructions} instructions, more than \
             --max-instructions {limit} (lowering takes about 1 KB of memory each; {advice})"
        ))));
    }
    let costs = planned.costs();
    Ok(Ok(executable(
        options,
        &costs,
        strategy,
        planned.ops.as_deref(),
    )?))
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
