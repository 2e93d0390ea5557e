//! The one front door for planning: a model, a cluster and what the user asked in; the
//! plan and its prices out.
//!
//! Two planners share the door. A recognized GPT-like decoder (under `auto` or `3d`) is
//! searched in Megatron-LM's space and priced by its closed form ([`transformer`]); its
//! layered form — the same placement on the model's own layers, which is what the lowering
//! executes — is then priced again by the layered cost model under the same kernel rates,
//! and the two prices are returned side by side ([`TransformerPlan::gap`]). Everything else
//! is placed layer by layer ([`plan::plan`]). Either way the caller lowers the chosen
//! strategy against [`Plan::costs`], so the executable plan is priced where it was chosen.

use ralpc_ir::{Graph, GraphInfo};

use crate::cluster::{Cluster, Precision};
use crate::cost::rates::KernelRates;
use crate::cost::{Efficiency, FusedAttention, Optimizer};
use crate::layers::{self, LayerGraph, LayerKind};
use crate::plan::{
    self, evaluate, CostOptions, Costs, Evaluation, Family, PlanError, Planned, Request, Schedule,
    Strategy, StrategyFile,
};
use crate::profile::Profile;
use crate::transformer::{
    self, Attention, ExpertOptions, Knobs, NotLayered, Overlap, Parallelism, Searched, Setting,
    Transformer,
};

/// A model as read: a planner's layer graph (PipeDream's, DeepPool's), or a verified ONNX
/// graph bound at its batch.
pub enum Model {
    /// Layers measured or described by another planner.
    Layers(LayerGraph),
    /// A decoder known by its shape alone (a Hugging Face configuration): planned and
    /// priced in Megatron-LM's space, with no graph to lower.
    Shape {
        /// The decoder.
        shape: Box<Transformer>,
        /// The global batch, sequences.
        batch: u64,
    },
    /// An ONNX model's graph.
    Graph {
        /// The graph, bound at `batch`.
        graph: Box<Graph>,
        /// What verifying it found.
        info: Box<GraphInfo>,
        /// The global batch it is bound at.
        batch: u64,
        /// Why no rank may compute a share of the batch, when that is so.
        fixed_batch: Option<String>,
    },
}

/// What the user asked of the planner, files already read.
#[derive(Clone, Debug, Default)]
pub struct Ask<'a> {
    /// The model's name, as messages call it.
    pub model: &'a str,
    /// The family to search; `None`: all (`auto`).
    pub family: Option<Family>,
    /// The pipeline schedule; `None`: the faster of 1F1B and ZB-H1 for layer pipelines,
    /// 1F1B for transformers.
    pub schedule: Option<Schedule>,
    /// Pipeline microbatches of layered plans; `None`: searched.
    pub microbatches: Option<u32>,
    /// Allowed GPU-sec amplification above 1; `None`: unbounded.
    pub tolerance: Option<f64>,
    /// A placement to evaluate instead of searching, and its file's name (as messages
    /// call it).
    pub strategy: Option<(&'a StrategyFile, &'a str)>,
    /// Measured layer costs.
    pub profile: Option<&'a Profile>,
    /// A per-GPU memory limit below the GPUs' own, bytes.
    pub memory_limit: Option<u64>,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Math precision; `None`: the profile's, else TF32.
    pub precision: Option<Precision>,
    /// Megatron-LM's dimensions; each one given fixes it.
    pub knobs: Knobs,
    /// Transformer plans: gradients kept and reduced in fp32.
    pub fp32_gradients: bool,
    /// Transformer plans: how the attention core runs.
    pub attention: Attention,
    /// Transformer plans: sequence-parallel collectives overlapped with their GEMMs;
    /// `None`: on, as Megatron-Bridge's recipes run.
    pub tp_comm_overlap: Option<bool>,
    /// Transformer plans with experts: imbalance, dispatcher, all-to-all overlap.
    pub experts: ExpertOptions,
}

/// A plan: the model's layers, the precision and costs it was priced under, and what
/// each planner found.
pub struct Plan<'a> {
    /// The model's layer graph, its activations as wide as [`Plan::precision`] keeps them.
    pub graph: LayerGraph,
    /// The model's ops, where it has them (an ONNX model's, which a plan's layout names).
    pub ops: Option<Box<Graph>>,
    /// The math precision priced.
    pub precision: Precision,
    /// The machines.
    pub cluster: &'a Cluster,
    /// GPUs planned for: ranks `0..gpus`.
    pub gpus: u32,
    /// What each planner found.
    pub priced: Priced,
    options: CostOptions<'a>,
}

/// What the planner that took the model found.
pub enum Priced {
    /// Placed layer by layer (or a strategy file's placement, evaluated).
    Layers(Box<Planned>),
    /// Searched in Megatron-LM's space.
    Transformer(Box<TransformerPlan>),
}

/// A transformer plan, priced twice.
pub struct TransformerPlan {
    /// The model's shape.
    pub shape: Transformer,
    /// The search's result, priced by the closed form.
    pub found: Searched,
    /// One GPU's compute for the iteration (the model unsplit, at its fastest micro-batch
    /// size), µs.
    pub single_gpu_time_us: f64,
    /// Whether sequence-parallel collectives were priced hidden behind their GEMMs.
    pub tp_comm_overlap: bool,
    /// The chosen configuration on the model's own layers and its layered price, or why it
    /// has no such form.
    pub layered: Result<LayeredForm, NotLayered>,
}

/// A transformer plan on the model's own layers.
pub struct LayeredForm {
    /// The placement of every layer.
    pub strategy: Strategy,
    /// Its price under the layered cost model, or why that model refused it.
    pub evaluation: Result<Evaluation, PlanError>,
}

impl TransformerPlan {
    /// How far the layered price of the chosen configuration is from its closed-form price,
    /// as a fraction of the closed form (`+0.05`: the layered model is 5 % slower).
    pub fn gap(&self) -> Option<f64> {
        let layered = self.layered.as_ref().ok()?.evaluation.as_ref().ok()?;
        let closed = self.found.best.iteration_time_us;
        (closed > 0.0).then(|| layered.iteration_time_us / closed - 1.0)
    }
}

impl<'a> Plan<'a> {
    /// The layered cost model the plan was priced under, for lowering its strategy.
    pub fn costs(&self) -> Costs<'_> {
        Costs::new(&self.graph, self.cluster, self.gpus, self.options.clone())
    }

    /// The strategy to lower: the layered search's choice, or the transformer plan's
    /// layered form (`None` when it has none).
    pub fn strategy(&self) -> Option<&Strategy> {
        match &self.priced {
            Priced::Layers(planned) => Some(&planned.chosen.strategy),
            Priced::Transformer(t) => t.layered.as_ref().ok().map(|l| &l.strategy),
        }
    }
}

/// Plans `model` on ranks `0..gpus` of `cluster` as `ask` says.
///
/// # Errors
/// A request that cannot hold (Megatron-LM's options on a model or family that has no
/// blocks, a precision the GPUs lack, a strategy that does not fit the model), a model
/// that fits no plan's memory, or a budget no plan meets.
pub fn plan<'a>(
    model: Model,
    cluster: &'a Cluster,
    gpus: u32,
    ask: &Ask<'a>,
) -> Result<Plan<'a>, PlanError> {
    if let Some(shape) = transformer_of(&model, ask)? {
        match &model {
            Model::Graph {
                batch, fixed_batch, ..
            } => {
                // An export whose batch is fixed keeps its sequences whole.
                let pieces = if fixed_batch.is_some() { 1 } else { *batch };
                let batch = *batch;
                return plan_transformer(shape, (batch, pieces), model, cluster, gpus, ask);
            }
            &Model::Shape { batch, .. } => {
                return plan_transformer(shape, (batch, batch), model, cluster, gpus, ask);
            }
            Model::Layers(_) => {}
        }
    }
    let precision = precision_of(cluster, gpus, ask)?;
    let (graph, ops) = layer_graph(model, precision)?;
    let options = CostOptions {
        precision,
        profile: ask.profile,
        optimizer: ask.optimizer,
        memory_limit: ask.memory_limit,
        ..CostOptions::default()
    };
    let strategy = ask
        .strategy
        .map(|(file, name)| {
            file.resolve(&graph).map_err(|e| {
                PlanError::Strategy(match e {
                    PlanError::Strategy(m) => format!("{name}: {m}"),
                    other => format!("{name}: {other}"),
                })
            })
        })
        .transpose()?;
    let planned = {
        let costs = Costs::new(&graph, cluster, gpus, options.clone());
        plan::plan(
            &costs,
            &Request {
                family: ask.family,
                schedule: ask.schedule,
                microbatches: ask.microbatches,
                tolerance: ask.tolerance,
                strategy,
            },
        )?
    };
    Ok(Plan {
        graph,
        ops,
        precision,
        cluster,
        gpus,
        priced: Priced::Layers(Box::new(planned)),
        options,
    })
}

/// Whether the transformer planner takes the model: a recognized GPT-like decoder under
/// `auto` or `3d`. Asking for `3d` or Megatron's options on anything else says why not.
fn transformer_of(model: &Model, ask: &Ask<'_>) -> Result<Option<Transformer>, PlanError> {
    let asked = ask.family == Some(Family::ThreeD);
    let knobs = ask.knobs != Knobs::default() || ask.fp32_gradients;
    let family_ok = matches!(ask.family, None | Some(Family::Auto | Family::ThreeD));
    if knobs && !family_ok {
        return Err(PlanError::Request(format!(
            "Megatron-LM's options (--tensor-parallel, --pipeline-parallel, --recompute, …) \
             apply to the 3d strategy, not to --strategy {}",
            ask.family.map_or("auto", Family::name)
        )));
    }
    if matches!(model, Model::Shape { .. }) && !family_ok {
        return Err(PlanError::Request(format!(
            "{}: a configuration describes a decoder's shape, not its layers: plan it with \
             --strategy auto or 3d (export it to ONNX to place its layers)",
            ask.model
        )));
    }
    if ask.strategy.is_some() {
        if matches!(model, Model::Shape { .. }) {
            return Err(PlanError::Request(format!(
                "{}: a configuration describes a decoder's shape, not its layers, which a \
                 strategy file places (export it to ONNX to place its layers)",
                ask.model
            )));
        }
        if asked || knobs {
            return Err(PlanError::Request(
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
        Model::Shape { shape, .. } => return Ok(Some(**shape)),
    };
    match recognized {
        Ok(t) if family_ok => Ok(Some(t)),
        Ok(_) => Ok(None),
        Err(e) if asked || knobs => Err(PlanError::Request(format!(
            "{}: the 3d strategy needs a GPT-like model; {e}",
            ask.model
        ))),
        Err(_) => Ok(None),
    }
}

/// The precision to plan at (asked, else the profile's, else TF32), refused where the GPUs
/// lack tensor cores for it (FP8 before Hopper, MXFP8 before Blackwell), naming the GPU.
fn precision_of(cluster: &Cluster, gpus: u32, ask: &Ask<'_>) -> Result<Precision, PlanError> {
    let precision = ask
        .precision
        .or(ask.profile.map(|p| p.precision))
        .unwrap_or(Precision::Tf32);
    if !precision.is_fp8() {
        return Ok(precision);
    }
    match (0..gpus.max(1))
        .map(|r| cluster.gpu(r))
        .find(|g| g.peak(precision).is_none())
    {
        Some(gpu) => Err(PlanError::Request(format!(
            "--precision {}: the {} ({}) has no tensor cores for it (FP8 needs Hopper or \
             later, MXFP8 Blackwell)",
            precision.name(),
            gpu.name,
            gpu.generation.name()
        ))),
        None => Ok(precision),
    }
}

/// The model's layer graph, its activations as wide as `precision` keeps them, and the
/// model's ops when it has them.
fn layer_graph(
    model: Model,
    precision: Precision,
) -> Result<(LayerGraph, Option<Box<Graph>>), PlanError> {
    let (layers, ops) = match model {
        Model::Layers(g) => (g, None),
        Model::Graph {
            graph,
            info,
            batch,
            fixed_batch,
        } => {
            let mut layers = layers::build(&graph, &info, batch, Default::default())?;
            layers.fixed_batch = fixed_batch;
            (layers, Some(graph))
        }
        // No layers: the plan is priced in Megatron-LM's space only.
        Model::Shape { batch, .. } => (LayerGraph::empty(batch), None),
    };
    Ok((
        layers.with_activation_bytes(precision.activation_bytes()),
        ops,
    ))
}

/// The layered cost model's options that price a transformer's layers at the kernel rates
/// its closed form uses — GEMMs, memory-bound kernels and fused attention alike — so that
/// the two prices differ only where the models do. A profile is left out: the layered
/// model reads a measured op as in-step time and splits a whole layer's measurement by the
/// degree, where the closed form measures each rank's own product and keeps `IN_STEP` of
/// it; with `--profile` the gap also holds what the measurements changed.
fn transformer_cost_options<'a>(
    cluster: &Cluster,
    precision: Precision,
    ask: &Ask<'a>,
) -> CostOptions<'a> {
    let gpu = cluster.gpu(0);
    let rates = KernelRates::new(gpu, precision);
    let mut efficiency = Efficiency::default();
    for kind in [LayerKind::Dense, LayerKind::Experts] {
        efficiency
            .0
            .insert(kind, rates.gemm / gpu.peak(precision).unwrap_or(gpu.fp32));
    }
    CostOptions {
        precision,
        optimizer: ask.optimizer,
        memory_limit: ask.memory_limit,
        efficiency: Some(efficiency),
        hbm_efficiency: Some(rates.hbm / gpu.hbm_bandwidth),
        fused_attention: (ask.attention == Attention::Fused).then_some(FusedAttention {
            forward: rates.attention_forward,
            backward: rates.attention_backward,
        }),
        ..CostOptions::default()
    }
}

/// Plans a recognized transformer in Megatron-LM's space, then prices the chosen
/// configuration's layered form.
fn plan_transformer<'a>(
    shape: Transformer,
    (batch, sample_pieces): (u64, u64),
    model: Model,
    cluster: &'a Cluster,
    gpus: u32,
    ask: &Ask<'a>,
) -> Result<Plan<'a>, PlanError> {
    if ask.microbatches.is_some() {
        return Err(PlanError::Request(
            "--microbatches: transformer plans take --micro-batch-size (sequences per \
             microbatch); the count follows from the batch and the data-parallel degree"
                .into(),
        ));
    }
    let precision = precision_of(cluster, gpus, ask)?;
    if let Some(profile) = ask.profile.filter(|p| p.precision != precision) {
        return Err(PlanError::Request(format!(
            "--profile was measured at {} and the plan is asked at --precision {}: a \
             transformer's kernels are priced from measurements at the plan's own precision \
             (plan at --precision {}, or leave out --profile)",
            profile.precision.name(),
            precision.name(),
            profile.precision.name()
        )));
    }
    let tp_comm_overlap = ask.tp_comm_overlap.unwrap_or(true);
    // Whether the plan is lowered for ralpc's executor (an export), or only emitted (a
    // configuration).
    let lowered = !matches!(model, Model::Shape { .. });
    let setting = Setting {
        model: &shape,
        batch,
        sample_pieces,
        cluster,
        gpus,
        precision,
        optimizer: ask.optimizer,
        fp32_gradients: ask.fp32_gradients,
        workspace_bytes: crate::cost::memory::DEFAULT_WORKSPACE_BYTES,
        memory_limit: ask.memory_limit,
        attention: ask.attention,
        // ZeRO-3's gathers are priced as ralpc's executor runs them, one block at a time
        // when it runs, for a model it runs; a configuration's plan goes only to Megatron-
        // FSDP or FSDP2, which prefetch each behind the block before.
        overlap: Overlap {
            tensor_parallel: tp_comm_overlap,
            sharded_parameters: !lowered,
            expert_parallel: ask.experts.a2a_overlap,
            ..Overlap::MEGATRON_CORE
        },
        profile: ask.profile,
        expert_imbalance: ask.experts.load(),
        dispatcher: ask.experts.dispatcher,
    };
    // A model with layers to lower is planned with one shard group unless asked for more:
    // its executable plan shards hybridly, but the layered price of the ZeRO-2 and 3
    // microbatches' reduce-scatters counts the groups' all-reduce in each.
    let knobs = Knobs {
        schedule: ask.schedule.or(ask.knobs.schedule),
        shard_groups: ask.knobs.shard_groups.or(lowered.then_some(1)),
        ..ask.knobs
    };
    let found = transformer::search(&setting, &knobs)?;
    // One GPU doing the whole iteration, the model unsplit (its memory not asked), at the
    // micro-batch size that runs it fastest: a baseline as good as a plan's own kernels, so
    // that GPU-time amplification compares like with like.
    let one_gpu = Setting {
        gpus: 1,
        memory_limit: None,
        ..setting.clone()
    };
    let single_gpu_time_us = transformer::divisors(batch)
        .into_iter()
        // As many microbatches as the batch may be cut into (one for a fixed-batch export).
        .filter(|&b| batch / b <= sample_pieces.max(1))
        .map(|micro_batch| {
            let e = transformer::estimate(&one_gpu, &Parallelism::one_gpu(micro_batch));
            e.time.compute_us + e.time.optimizer_us
        })
        .fold(f64::INFINITY, f64::min);
    let configured = matches!(model, Model::Shape { .. });
    let (graph, ops) = layer_graph(model, precision)?;
    let options = transformer_cost_options(cluster, precision, ask);
    let layered = match configured {
        true => Err(NotLayered(
            "the model is a configuration, with no graph to lower: export it to ONNX for an \
             executable plan of its layers"
                .into(),
        )),
        false => transformer::layered(&graph, ops.as_deref(), &found.best),
    };
    let layered = layered.map(|strategy| {
        let costs = Costs::new(&graph, cluster, gpus, options.clone());
        let evaluation = evaluate(&costs, &strategy);
        LayeredForm {
            strategy,
            evaluation,
        }
    });
    Ok(Plan {
        graph,
        ops,
        precision,
        cluster,
        gpus,
        priced: Priced::Transformer(Box::new(TransformerPlan {
            shape,
            single_gpu_time_us,
            tp_comm_overlap: tp_comm_overlap
                && found.best.parallelism.sequence_parallel
                && found.best.parallelism.tensor > 1,
            found,
            layered,
        })),
        options,
    })
}
