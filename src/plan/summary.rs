//! The plan's report: what each planner found, as `--json` prints it and the summary
//! reads it.

use ralpc_passes::planner::TransformerPlan;
use serde::Serialize;

use super::*;

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
    /// The GPU type it is priced at: its slowest GPU's (its only one's, but on a cluster
    /// of several types).
    pub gpu_type: String,
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
    /// Sequence pieces of each sample (context parallelism); absent when 1.
    #[serde(skip_serializing_if = "is_one")]
    pub context: u32,
    /// Attributes (rows; a dense layer's input features).
    pub attribute: u32,
    /// Parameters (output channels or features).
    pub parameter: u32,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// `s×a×p`, with the context degree after it where there is one (`2×1×2 cp2`).
impl std::fmt::Display for SplitRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}×{}×{}", self.sample, self.attribute, self.parameter)?;
        match self.context {
            1 => Ok(()),
            c => write!(f, " cp{c}"),
        }
    }
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
    /// The part of `backward_us` making weight gradients (a pass of its own under
    /// `zb-h1`), µs; absent where the plan does not price it apart (transformer plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_us: Option<f64>,
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

/// Runs of consecutive layers placed alike (GPUs, split and stage): the placement as a
/// reader takes it in, one row a run.
pub fn runs_placed_alike(layers: &[PlacedLayer]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    while let Some(l) = layers.get(start) {
        let alike = |m: &PlacedLayer| (m.gpus, m.split, m.stage) == (l.gpus, l.split, l.stage);
        let end = start + layers[start..].iter().take_while(|m| alike(m)).count();
        runs.push(start..end);
        start = end;
    }
    runs
}

/// The layers in at most `rows` groups of consecutive layers: one per layer when they are
/// few, else the runs placed alike ([`runs_placed_alike`]), and when those are still too
/// many, neighbouring runs merged evenly.
pub fn layer_rows(layers: &[PlacedLayer], rows: usize) -> Vec<std::ops::Range<usize>> {
    if layers.len() <= rows {
        return (0..layers.len()).map(|i| i..i + 1).collect();
    }
    let runs = runs_placed_alike(layers);
    if runs.len() <= rows {
        return runs;
    }
    let per_row = runs.len().div_ceil(rows.max(1));
    runs.chunks(per_row)
        .map(|chunk| chunk[0].start..chunk[chunk.len() - 1].end)
        .collect()
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
    /// Predicted time per iteration (for a pipeline, its microbatches through it and its
    /// synchronization), µs.
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
    /// The background job in the plan's idle GPU time (`--background`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background: Option<super::BackgroundRow>,
}

/// A transformer plan's configuration (Megatron-LM's arguments) and its figures.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ParallelismRow {
    /// Tensor-parallel degree.
    pub tensor_parallel: u32,
    /// Pipeline stages.
    pub pipeline_parallel: u32,
    /// Ranks splitting each sequence (context parallelism).
    pub context_parallel: u32,
    /// How they exchange keys and values (`p2p`, `all_gather`, `a2a`: Megatron-Core's
    /// `--cp-comm-type`); absent without context parallelism.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cp_comm_type: Option<&'static str>,
    /// Data-parallel replicas.
    pub data_parallel: u32,
    /// Expert-parallel degree: ranks a mixture of experts' routed experts are spread over
    /// (1 without experts).
    pub expert_parallel: u32,
    /// Expert tensor-parallel degree: ranks splitting each expert (1 without experts).
    pub expert_tensor_parallel: u32,
    /// How the experts' load imbalance, dispatcher and all-to-all overlap were priced
    /// (models with experts only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<ralpc_passes::transformer::ExpertOptions>,
    /// What is kept in host memory instead of on the GPUs (absent: nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadRow>,
    /// Sequences per microbatch.
    pub micro_batch_size: u64,
    /// Model chunks per GPU (interleaved 1F1B above 1).
    pub virtual_stages: u32,
    /// Blocks of each pipeline chunk (chunk `j` on stage `j mod p`).
    pub chunk_layers: Vec<u64>,
    /// Whether the embedding and the loss took a block's place each in the pipeline split
    /// (`--pipeline-split ends`).
    pub ends_as_blocks: bool,
    /// `none`, `selective` or `full`.
    pub recompute: &'static str,
    /// The modules recomputed selectively, where they are not the attention core alone
    /// (Megatron-Core's names).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recompute_modules: Vec<&'static str>,
    /// With `full`: the blocks of each pipeline chunk recomputed, its first ones, where not
    /// all are (Megatron-Core's block method).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recompute_num_layers: Option<u32>,
    /// Sequence parallelism.
    pub sequence_parallel: bool,
    /// ZeRO stage.
    pub zero: u8,
    /// Groups of data-parallel (× context) ranks each holding a whole sharded copy of
    /// ZeRO's state (hybrid sharding; 1: sharded over all of them).
    pub dp_replicate: u32,
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
    /// The same configuration on the model's own layers, priced by the layered cost model
    /// under the same kernel rates (what the executable plan is lowered against), µs;
    /// absent where it has no layered form.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layered_iteration_time_us: Option<f64>,
    /// How far that layered price is from `iteration_time_us`, as a fraction of it
    /// (`0.05`: the layered model is 5 % slower); absent with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layered_gap: Option<f64>,
    /// Where an iteration's time goes, µs.
    pub time_breakdown: TimeBreakdown,
    /// The fullest GPU's memory by kind, bytes.
    pub memory_breakdown: MemoryBreakdown,
    /// Configurations the search priced.
    pub configurations_priced: u64,
    /// The block's dense products (`qkv`, `projection`, `mlp_in`, `mlp_out`) priced from
    /// `--profile`'s measurements; the rest of the plan is priced analytically.
    pub measured: Vec<&'static str>,
}

/// What a transformer plan keeps in host memory (Megatron-Core's offloads).
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct OffloadRow {
    /// Blocks whose stashed activations are kept in host memory
    /// (`--cpu-offloading-num-layers`).
    pub activation_layers: u64,
    /// Fraction of the optimizer state kept and stepped in host memory
    /// (`--optimizer-offload-fraction`).
    pub optimizer_fraction: f64,
    /// Host memory the fullest GPU's offloaded state takes, bytes.
    #[serde(serialize_with = "ralpc_passes::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub host_memory_bytes: f64,
    /// Each GPU's share of its server's host memory, bytes.
    #[serde(serialize_with = "ralpc_passes::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub host_capacity_bytes: f64,
}

/// The name of the GPU type with the lowest 16-bit peak among ranks `first..first + n`.
fn slowest_type(cluster: &Cluster, first: u32, n: u32) -> String {
    (first..first + n.max(1))
        .map(|r| cluster.gpu(r))
        .min_by(|a, b| {
            let peak = |g: &ralpc_passes::cluster::GpuType| g.bf16.or(g.fp16).unwrap_or(g.fp32);
            peak(a).total_cmp(&peak(b))
        })
        .map_or_else(String::new, |g| g.name.clone())
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

/// The report of a plan placed layer by layer (or a strategy file's placement).
pub(super) fn layers(
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
                gpu_type: slowest_type(cluster, st.first_rank, st.gpus),
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
                        context: split.context,
                        attribute: split.attribute,
                        parameter: split.parameter,
                    },
                    stage: stage_of[l],
                    forward_us: c.forward_us,
                    backward_us: c.backward_us,
                    weight_us: Some(c.weight_us),
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
        background: None,
    }
}

/// The report of a transformer plan: its configuration, both prices, and its stages as
/// embedding, blocks and head.
pub(super) fn transformer(
    options: &PlanOptions,
    planned: &planner::Plan<'_>,
    plan: &TransformerPlan,
    planning_time_us: u64,
) -> PlanReport {
    let (cluster, gpus, precision) = (planned.cluster, planned.gpus, planned.precision);
    let batch = planned.graph.batch;
    let TransformerPlan {
        shape,
        found,
        single_gpu_time_us,
        ..
    } = plan;
    let single_gpu_time_us = *single_gpu_time_us;
    let best = &found.best;
    let par = best.parallelism;
    let peak_total = ralpc_passes::cost::combined_peak(cluster, gpus, precision);
    let used = par.gpus() as u32;
    let ranks_per_stage = par.tensor * par.context.max(1) * par.data;
    let split = SplitRow {
        sample: par.data,
        context: par.context.max(1),
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
            gpu_type: slowest_type(cluster, k as u32 * ranks_per_stage, ranks_per_stage),
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
                weight_us: None,
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
    PlanReport {
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
        planning_time_us,
        stages,
        layers,
        candidates: vec![chosen, row("dp", &found.data_parallel)],
        simulated: None,
        parallelism: Some(ParallelismRow {
            tensor_parallel: par.tensor,
            pipeline_parallel: par.pipeline,
            context_parallel: par.context,
            cp_comm_type: (par.context > 1).then(|| par.context_comm.name()),
            data_parallel: par.data,
            expert_parallel: par.expert,
            expert_tensor_parallel: par.expert_tensor,
            experts: shape.moe.map(|_| options.experts),
            offload: par.offload.any().then(|| OffloadRow {
                activation_layers: par.offload.activation_layers,
                optimizer_fraction: par.offload.optimizer_fraction(),
                host_memory_bytes: best.host_memory_bytes,
                host_capacity_bytes: best.host_capacity_bytes,
            }),
            micro_batch_size: par.micro_batch,
            virtual_stages: par.virtual_stages,
            chunk_layers: best.chunk_layers.clone(),
            ends_as_blocks: par.ends_as_blocks,
            recompute: par.recompute.name(),
            recompute_modules: match par.recompute {
                ralpc_passes::transformer::Recompute::Modules(m) => m.names(),
                _ => Vec::new(),
            },
            recompute_num_layers: match par.recompute {
                ralpc_passes::transformer::Recompute::Blocks(n) => Some(n),
                _ => None,
            },
            precision,
            attention: options.attention,
            tp_comm_overlap: plan.tp_comm_overlap,
            sequence_parallel: par.sequence_parallel,
            zero: par.zero,
            dp_replicate: par.shard_groups.max(1),
            model_flops_per_iteration: best.model_flops,
            hardware_flops_per_iteration: best.hardware_flops,
            transformer: *shape,
            layered_iteration_time_us: plan
                .layered
                .as_ref()
                .ok()
                .and_then(|l| l.evaluation.as_ref().ok())
                .map(|e| e.iteration_time_us),
            layered_gap: plan.gap(),
            time_breakdown: best.time,
            memory_breakdown: best.memory,
            configurations_priced: found.evaluated,
            measured: best.measured(),
        }),
        background: None,
    }
}

#[cfg(test)]
mod tests {
    use super::{layer_rows, runs_placed_alike, PlacedLayer, SplitRow};

    fn layer(gpus: u32, stage: usize) -> PlacedLayer {
        PlacedLayer {
            name: format!("l{gpus}.{stage}"),
            module: String::new(),
            op: "Relu".into(),
            gpus,
            split: SplitRow {
                sample: gpus,
                context: 1,
                attribute: 1,
                parameter: 1,
            },
            stage,
            forward_us: 1.0,
            backward_us: 2.0,
            weight_us: None,
            sync_us: 0.0,
            transfer_us: 0.0,
        }
    }

    #[test]
    fn layers_share_rows_only_past_the_limit() {
        // Runs: 3 on 8 GPUs, 2 on 4, 1 on 8 in stage 1.
        let layers: Vec<PlacedLayer> = [(8, 0), (8, 0), (8, 0), (4, 0), (4, 0), (8, 1)]
            .into_iter()
            .map(|(g, s)| layer(g, s))
            .collect();
        assert_eq!(runs_placed_alike(&layers), [0..3, 3..5, 5..6]);
        assert_eq!(layer_rows(&layers, 6).len(), 6);
        assert_eq!(layer_rows(&layers, 5), [0..3, 3..5, 5..6]);
        // Still too many runs: neighbours merge, every layer in exactly one row.
        assert_eq!(layer_rows(&layers, 2), [0..5, 5..6]);
        assert_eq!(
            layer_rows(&layers, 1),
            vec![std::ops::Range { start: 0, end: 6 }]
        );
        assert!(layer_rows(&[], 4).is_empty());
    }
}
