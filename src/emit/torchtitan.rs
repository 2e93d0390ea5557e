//! `--emit torchtitan`: a transformer plan as torchtitan 0.3's job configuration.
//!
//! torchtitan 0.3 reads a job from a Python module: `torchtitan.train --module M --config F`
//! imports `M`, calls `F()` for a `Trainer.Config`, and re-parses it through tyro, whose
//! dataclasses check themselves (torchtitan/config/manager.py @ 0.3.0). The file ralpc
//! writes starts from torchtitan's own configuration of the model (its registry function:
//! model, optimizer, data) and sets what the plan decides: the degrees of
//! `ParallelismConfig`, the batch and sequence of `TrainingConfig`, activation
//! checkpointing. What torchtitan cannot express as priced is said in the file, line by
//! line, never changed silently.

use std::fmt::Write;

use ralpc_passes::cluster::Precision;
use ralpc_passes::plan::PlanError;
use ralpc_passes::transformer::Transformer;

use crate::plan::PlanReport;
use crate::ParallelismRow;

/// The module's function torchtitan calls (`--config`).
pub const CONFIG_FUNCTION: &str = "ralpc_plan";

/// A model torchtitan 0.3 configures in its registry: the family's module, the function, and
/// the shape it builds (layers, hidden, heads, key/value heads, vocabulary), read from
/// `torchtitan/models/<family>/__init__.py` @ 0.3.0.
struct Registered {
    family: &'static str,
    function: &'static str,
    shape: [u64; 5],
    experts: bool,
}

const fn registered(
    family: &'static str,
    function: &'static str,
    shape: [u64; 5],
    experts: bool,
) -> Registered {
    Registered {
        family,
        function,
        shape,
        experts,
    }
}

/// torchtitan 0.3's registered decoders (debug models left out). DeepSeek-V3's attention is
/// latent: its key/value heads are written as its heads.
const REGISTRY: [Registered; 12] = [
    registered("llama3", "llama3_8b", [32, 4096, 32, 8, 128_256], false),
    registered("llama3", "llama3_70b", [80, 8192, 64, 8, 128_256], false),
    registered(
        "llama3",
        "llama3_405b",
        [126, 16384, 128, 8, 128_256],
        false,
    ),
    registered("qwen3", "qwen3_0_6b", [28, 1024, 16, 8, 151_936], false),
    registered("qwen3", "qwen3_1_7b", [28, 2048, 16, 8, 151_936], false),
    registered("qwen3", "qwen3_14b", [40, 5120, 40, 8, 151_936], false),
    registered("qwen3", "qwen3_32b", [64, 5120, 64, 8, 151_936], false),
    registered("qwen3", "qwen3_30b_a3b", [48, 2048, 32, 4, 151_936], true),
    registered(
        "deepseek_v3",
        "deepseek_v3_16b",
        [27, 2048, 16, 16, 102_400],
        true,
    ),
    registered(
        "deepseek_v3",
        "deepseek_v3_671b",
        [61, 7168, 128, 128, 129_280],
        true,
    ),
    registered("gpt_oss", "gpt_oss_20b", [24, 2880, 64, 8, 201_088], true),
    registered("gpt_oss", "gpt_oss_120b", [36, 2880, 64, 8, 201_088], true),
];

/// The family torchtitan 0.3 trains a model of this block in, or `None`.
fn family(m: &Transformer) -> Option<&'static str> {
    let experts = m.moe.is_some();
    if m.latent.is_some() {
        Some("deepseek_v3")
    } else if experts && m.sliding_window > 0 {
        Some("gpt_oss")
    } else if m.qk_norm {
        Some("qwen3")
    } else if m.rms_norm && m.gated_mlp && !m.biases && !m.qkv_bias && !experts && !m.tied {
        // (torchtitan's Llama 3 models are untied; Gemma's tied embedding is not Llama's.)
        Some("llama3")
    } else {
        None
    }
}

/// The registered model of `m`'s family with its shape, else the family's nearest in size
/// (with `false`).
fn base(m: &Transformer) -> Option<(&'static Registered, bool)> {
    let family = family(m)?;
    let kv_heads = if m.latent.is_some() {
        m.heads
    } else {
        m.kv_heads
    };
    let shape = [m.layers, m.hidden, m.heads, kv_heads, m.vocabulary];
    let candidates = || {
        REGISTRY
            .iter()
            .filter(move |r| r.family == family && r.experts == m.moe.is_some())
    };
    if let Some(exact) = candidates().find(|r| r.shape == shape) {
        return Some((exact, true));
    }
    let size = |s: [u64; 5]| (s[0] as f64 * (s[1] as f64).powi(2)).ln();
    let mine = size(shape);
    candidates()
        .min_by(|a, b| {
            (size(a.shape) - mine)
                .abs()
                .total_cmp(&(size(b.shape) - mine).abs())
        })
        .map(|r| (r, false))
}

/// torchtitan's pipeline schedule for the plan's `schedule` (`Interleaved1F1B` for virtual
/// stages, `ZBVZeroBubble` for ZB-V; [`torchtitan_config`] refuses ZB-H1).
fn schedule(schedule: &str, p: &ParallelismRow) -> &'static str {
    match schedule {
        "zb-v" => "ZBVZeroBubble",
        _ if p.virtual_stages > 1 => "Interleaved1F1B",
        _ => "1F1B",
    }
}

/// The torchtitan 0.3 module of `report`'s transformer plan, or why there is none.
///
/// # Errors
/// The plan is not a transformer plan, its model is of no family torchtitan trains, or its
/// stages cannot be written as torchtitan splits them.
pub fn torchtitan_config(report: &PlanReport) -> Result<String, PlanError> {
    let Some(p) = &report.parallelism else {
        return Err(PlanError::Request(format!(
            "--emit torchtitan: this is a {} plan of layers; torchtitan trains transformers \
             (plan a GPT-like model, or --strategy 3d)",
            report.strategy
        )));
    };
    if report.schedule == "zb-h1" {
        return Err(PlanError::Request(
            "--emit torchtitan: torchtitan 0.3 runs PyTorch's zero-bubble schedules with two \
             or more stages a GPU (its InterleavedZeroBubble refuses one); plan with \
             --schedule zb-v or 1f1b"
                .into(),
        ));
    }
    let m = &p.transformer;
    let Some((base, exact)) = base(m) else {
        return Err(PlanError::Request(
            "--emit torchtitan: torchtitan 0.3 trains Llama 3, Qwen3, DeepSeek-V3 and gpt-oss \
             decoders; this model's block (its norms, MLP, biases or experts) is none of them \
             (--emit megatron writes Megatron-LM's arguments)"
                .into(),
        ));
    };
    let chunks = u64::from(p.pipeline_parallel * p.virtual_stages).max(1);
    // torchtitan spreads the blocks by a per-stage count, the first and last stages taking
    // `less_layers` places for the embedding and the output (as ralpc priced them: none, or
    // a block's each): ceil((L + 2·less) / per) must make exactly `chunks` stages.
    let less = u64::from(p.ends_as_blocks);
    let places = ralpc_passes::transformer::split_places(m.layers, p.ends_as_blocks);
    let per_stage = places.div_ceil(chunks);
    if p.pipeline_parallel > 1 && places.div_ceil(per_stage) != chunks {
        return Err(PlanError::Request(format!(
            "--emit torchtitan: torchtitan splits {} blocks {per_stage} a stage, which is not \
             the plan's {chunks} stages",
            m.layers
        )));
    }
    let d = u64::from(p.data_parallel);
    let b = p.micro_batch_size;
    let microbatches = (report.batch / (b * d).max(1)).max(1);
    let mut notes: Vec<String> = Vec::new();
    if !exact {
        notes.push(format!(
            "torchtitan has no {} model of this shape ({} blocks, hidden {}, {} heads): {} is \
             the nearest; set config.model_spec to your model before running (the degrees{} \
             are this model's)",
            base.family,
            m.layers,
            m.hidden,
            m.heads,
            base.function,
            if p.pipeline_parallel > 1 {
                " and blocks per stage"
            } else {
                ""
            }
        ));
    }
    // torchtitan's context parallelism is PyTorch's `context_parallel`, whose keys and
    // values are all-gathered (its default rotate method, `_RotateMethod.ALL_GATHER`).
    match p.cp_comm_type {
        Some("a2a") => {
            return Err(PlanError::Request(
                "--emit torchtitan: torchtitan's context parallelism has no all-to-all \
                 (DeepSpeed-Ulysses) form; plan with --cp-comm-type all_gather or p2p"
                    .into(),
            ))
        }
        Some("p2p") => notes.push(
            "torchtitan's context parallelism gathers each block's keys and values with \
             PyTorch's default rotate method (an all-gather behind the first chunk's \
             attention; the gradients passed around a ring) where the plan priced a ring \
             (p2p) for both: --cp-comm-type all_gather prices the gather unhidden"
                .into(),
        ),
        _ => {}
    }
    let reshard = match p.zero {
        3 => "always",
        _ => "never",
    };
    if p.dp_replicate > 1 {
        let r = p.dp_replicate;
        let sharded = p.data_parallel / r * p.context_parallel.max(1) * p.tensor_parallel;
        if p.data_parallel % r != 0 || sharded % p.expert_parallel.max(1) != 0 {
            notes.push(format!(
                "{r} hybrid-sharding groups were priced; torchtitan replicates over the \
                 data-parallel ranks alone, with expert parallelism inside the sharded ones, \
                 which these degrees do not allow: sharded over all of them here"
            ));
        } else if microbatches > 1 && p.pipeline_parallel == 1 {
            notes.push(format!(
                "hybrid sharding's all-reduce across its {r} groups was priced once an \
                 iteration; torchtitan without pipeline stages synchronizes every one of the \
                 {microbatches} gradient-accumulation steps"
            ));
        }
    }
    if p.data_parallel > 1 {
        notes.push(format!(
            "data parallelism is FSDP2 over {} ranks (torchtitan's DDP takes no other \
             dimension) where ralpc priced ZeRO-{}: weights rest sharded {}",
            p.data_parallel,
            p.zero,
            if p.zero == 3 {
                "and are gathered for each pass (ZeRO-3)"
            } else {
                "and, gathered for the forward pass, stay whole until its backward"
            }
        ));
    }
    let recompute = match p.recompute {
        "full" => {
            if let Some(n) = p.recompute_num_layers {
                notes.push(format!(
                    "the plan recomputes the first {n} blocks of each pipeline chunk; \
                     torchtitan's activation checkpointing recomputes every block (or every \
                     k-th), so more is recomputed than was priced"
                ));
            }
            "FullAC.Config()"
        }
        "selective" => {
            notes.push(
                "selective recomputation is torchtitan's (op-level: matmul outputs kept, \
                 the rest recomputed), not Megatron's attention-core recomputation ralpc priced"
                    .into(),
            );
            if !p.recompute_modules.is_empty() {
                notes.push(format!(
                    "recomputed modules ({}) have no torchtitan form",
                    p.recompute_modules.join(", ")
                ));
            }
            "SelectiveAC.Config()"
        }
        _ => "None",
    };
    if let Some(factor) = p.experts.and_then(|e| e.capacity_factor) {
        notes.push(format!(
            "an expert capacity of {factor} was priced (tokens beyond it dropped): \
             torchtitan's experts drop none, so its busiest rank computes the full imbalance"
        ));
    }
    if let Some(o) = &p.offload {
        notes.push(format!(
            "host memory was priced for the activations of {} blocks and {:.0} % of the \
             optimizer state: torchtitan offloads only parameters, gradients and optimizer \
             state together (enable_cpu_offload, FSDP2's CPUOffloadPolicy), not set here",
            o.activation_layers,
            o.optimizer_fraction * 100.0
        ));
    }
    if p.expert_parallel > 1 && p.expert_tensor_parallel > 1 {
        notes.push(format!(
            "experts split {} ways by tensor parallelism as priced: torchtitan 0.3 derives the \
             experts' layout from the other degrees",
            p.expert_tensor_parallel
        ));
    }
    let param_dtype = match p.precision {
        Precision::Fp32 | Precision::Tf32 => "float32",
        Precision::Fp16 => {
            notes.push("fp16 was priced; torchtitan mixes precision in bf16".into());
            "bfloat16"
        }
        Precision::Fp8 | Precision::Mxfp8 => {
            notes.push(format!(
                "{} GEMMs were priced: add torchtitan's Float8 converter to model_spec \
                 (torchao; rowwise scaling, not Transformer Engine's)",
                p.precision.name()
            ));
            "bfloat16"
        }
        _ => "bfloat16",
    };
    if p.tp_comm_overlap {
        notes.push(
            "tensor-parallel communication overlap was priced: torchtitan's async tensor \
             parallelism needs torch.compile (config.compile)"
                .into(),
        );
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "\"\"\"torchtitan 0.3 job of ralpc {}'s plan for {} ({} GPUs, batch {}).\n\n\
         Run it from the folder holding this file, on as many processes as the plan's GPUs \
         (torchrun's --nnodes and rendezvous over several nodes):\n\n    \
         PYTHONPATH=. torchrun --nproc-per-node GPUS_PER_NODE -m torchtitan.train \\\n        \
         --module torchtitan_plan --config {CONFIG_FUNCTION}\n\"\"\"\n",
        env!("CARGO_PKG_VERSION"),
        report.model,
        report.gpus_used,
        report.batch
    );
    let _ = writeln!(
        out,
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC\n\
         from torchtitan.models.{}.config_registry import {}\n\
         from torchtitan.trainer import Trainer\n",
        base.family, base.function
    );
    if !notes.is_empty() {
        out.push_str("# Where torchtitan differs from the plan as ralpc priced it:\n");
        for note in &notes {
            let _ = writeln!(out, "# * {note}");
        }
        out.push('\n');
    }
    let _ = writeln!(out, "\ndef {CONFIG_FUNCTION}() -> Trainer.Config:");
    let _ = writeln!(out, "    config = {}()", base.function);
    out.push_str("    p = config.parallelism\n");
    let mut set = |target: &str, field: &str, value: String| {
        let _ = writeln!(out, "    {target}.{field} = {value}");
    };
    // Hybrid sharding over the data-parallel ranks: R replicas of FSDP2's shards.
    // (Replicas only where torchtitan takes them: dividing the data-parallel ranks, and
    // leaving expert parallelism inside what is sharded, `ep | dp_shard · cp · tp`.)
    let r = p.dp_replicate.max(1);
    let sharded = p.data_parallel / r * p.context_parallel.max(1) * p.tensor_parallel;
    let replicate = match p.data_parallel % r == 0 && sharded % p.expert_parallel.max(1) == 0 {
        true => r,
        false => 1,
    };
    set("p", "data_parallel_replicate_degree", replicate.to_string());
    set(
        "p",
        "data_parallel_shard_degree",
        (p.data_parallel / replicate).to_string(),
    );
    set("p", "fsdp_reshard_after_forward", format!("\"{reshard}\""));
    set("p", "tensor_parallel_degree", p.tensor_parallel.to_string());
    set(
        "p",
        "enable_sequence_parallel",
        python_bool(p.sequence_parallel),
    );
    set(
        "p",
        "context_parallel_degree",
        p.context_parallel.to_string(),
    );
    set("p", "expert_parallel_degree", p.expert_parallel.to_string());
    set(
        "p",
        "pipeline_parallel_degree",
        p.pipeline_parallel.to_string(),
    );
    if p.pipeline_parallel > 1 {
        set(
            "p",
            "pipeline_parallel_schedule",
            format!("\"{}\"", schedule(report.schedule, p)),
        );
        set("p", "pipeline_parallel_microbatch_size", b.to_string());
        set(
            "p",
            "pipeline_parallel_layers_per_stage",
            per_stage.to_string(),
        );
        set(
            "p",
            "pipeline_parallel_first_stage_less_layers",
            less.to_string(),
        );
        set(
            "p",
            "pipeline_parallel_last_stage_less_layers",
            less.to_string(),
        );
    }
    set("config", "training.seq_len", m.sequence.to_string());
    set(
        "config",
        "training.global_batch_size",
        report.batch.to_string(),
    );
    // Per rank and step: one micro-batch without a pipeline (torchtitan accumulates the
    // rest), all of a rank's micro-batches with one.
    let local = if p.pipeline_parallel > 1 {
        b * microbatches
    } else {
        b
    };
    set("config", "training.local_batch_size", local.to_string());
    set(
        "config",
        "training.mixed_precision_param",
        format!("\"{param_dtype}\""),
    );
    if p.pipeline_parallel > 1 || p.expert_parallel > 1 {
        // torchtitan refuses CUDA graphs with pipeline parallelism and with its all-to-all
        // token dispatcher (torchtitan/trainer.py @ 0.3.0).
        set("config", "training.disable_cuda_graphs", "True".into());
    }
    set("config", "activation_checkpoint", recompute.into());
    out.push_str("    return config\n");
    Ok(out)
}

fn python_bool(b: bool) -> String {
    if b { "True" } else { "False" }.into()
}

#[cfg(test)]
mod tests {
    use super::base;
    use ralpc_passes::transformer::Transformer;

    fn model(config: &str) -> Transformer {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/configs")
                .join(config),
        )
        .expect("a bundled configuration");
        let spec = ralpc_ir::models::huggingface::spec(&text, 4096).expect("a decoder");
        Transformer::from(&spec)
    }

    #[test]
    fn each_family_starts_from_its_registered_model() {
        let named = |config: &str| base(&model(config)).map(|(r, exact)| (r.function, exact));
        assert_eq!(named("llama-3.1-8b.json"), Some(("llama3_8b", true)));
        assert_eq!(named("qwen3-30b-a3b.json"), Some(("qwen3_30b_a3b", true)));
        assert_eq!(named("deepseek-v3.json"), Some(("deepseek_v3_671b", true)));
        assert_eq!(named("gpt-oss-120b.json"), Some(("gpt_oss_120b", true)));
        // The family's nearest when torchtitan has no model of the shape: Qwen3-8B (36
        // blocks, hidden 4096) is nearest its 14B; Mistral's block is Llama's.
        assert_eq!(named("qwen3-8b.json"), Some(("qwen3_14b", false)));
        assert_eq!(named("mistral-7b-v0.3.json"), Some(("llama3_8b", false)));
        // No torchtitan family: Mixtral's experts under a Llama block, Qwen2's biases.
        assert_eq!(named("mixtral-8x7b.json"), None);
        assert_eq!(named("qwen2.5-7b.json"), None);
    }
}
