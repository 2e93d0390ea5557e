//! `--emit`: a chosen plan written for another training engine.
//!
//! * [`torch_script`]: a standalone Python file that applies the plan to the user's own
//!   model class with PyTorch's distributed APIs and trains it under `torchrun`. It holds
//!   the plan and the same mapping `ralpc.torch` runs (its source, included), so it needs
//!   torch only, and can be read and edited.
//! * [`megatron_arguments`]: Megatron-LM / Megatron-Core's command-line arguments for a
//!   transformer (3d) plan.

use std::fmt::Write;

use ralpc_passes::cluster::Precision;
use ralpc_passes::plan::StrategyFile;

use crate::plan::PlanReport;
use crate::{Compiled, Error, FileError};

/// `ralpc.torch`'s source: the mapping from a plan to PyTorch's APIs.
const TORCH_MAPPING: &str = include_str!("../python/ralpc/torch.py");

/// The engines `--emit` writes for, and the file each writes into the output directory.
pub const ENGINES: [(&str, &str); 2] = [("torch", "train_torch.py"), ("megatron", "megatron.args")];

/// A Python file that trains `report`'s model with its plan (`strategy`) on PyTorch.
pub fn torch_script(report: &PlanReport, strategy: &StrategyFile) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\"\"\"Trains a model with the plan ralpc {} made for {} ({} plan, {} GPUs, batch {}).\n",
        env!("CARGO_PKG_VERSION"),
        report.model,
        report.strategy,
        report.gpus_used,
        report.batch
    );
    out.push_str(
        "Run it under torchrun with as many processes as the plan's mesh has ranks:\n\n    \
         torchrun --nproc-per-node N train_torch.py --model mymodels:Gpt \\\n        \
         --batches mymodels:batch --loss mymodels:loss --steps 100\n\n\
         --model names the nn.Module class (or a function) the ONNX file was exported from;\n\
         --batches a function of the step returning (inputs, target) of the *global* batch\n\
         (every rank calls it; each takes its data-parallel share); --loss a function\n\
         (output, target) -> mean loss. Every rank builds the model from the same seed.\n\n\
         PLAN below is ralpc's placement (edit it to change the plan); the functions after it\n\
         are ralpc.torch's mapping onto PyTorch's APIs: layout(PLAN) says what is applied\n\
         to which module.\n\"\"\"\n\nfrom __future__ import annotations\n\n",
    );
    out.push_str("# Per layer: the module it came from, what it is, its split (sample×attribute×parameter).\n");
    for layer in &strategy.layers {
        let split = layer.split.unwrap_or(ralpc_passes::plan::FileSplit {
            sample: layer.gpus.unwrap_or(1),
            attribute: 1,
            parameter: 1,
        });
        let _ = writeln!(
            out,
            "#   {:<36} {:<12} {}×{}×{}",
            layer.module.as_deref().unwrap_or(&layer.name),
            layer.kind.map_or("", |k| k.name()),
            split.sample,
            split.attribute,
            split.parameter
        );
    }
    let mut plan = serde_json::json!({
        "strategy": report.strategy,
        "gpus_used": report.gpus_used,
        "batch": report.batch,
        "placement": strategy,
    });
    if let Some(p) = &report.parallelism {
        plan["sequence_parallel"] = p.sequence_parallel.into();
    }
    // The families compared, from which a refusal names the nearest plan the model has.
    plan["candidates"] = report
        .candidates
        .iter()
        .map(|c| serde_json::json!({ "strategy": c.strategy }))
        .collect();
    let json = serde_json::to_string_pretty(&plan).unwrap_or_default();
    // JSON literals that Python spells differently.
    let python = json
        .replace(": true", ": True")
        .replace(": false", ": False")
        .replace(": null", ": None");
    let _ = writeln!(out, "PLAN = {python}\n");
    out.push_str("# ---- ralpc.torch: the plan onto PyTorch's APIs ----\n");
    out.push_str(&TORCH_MAPPING.replace("from __future__ import annotations\n", ""));
    out.push_str(TORCH_MAIN);
    out
}

const TORCH_MAIN: &str = r#"

# ---- training under torchrun ----
def _load(spec: str):
    import importlib
    import os
    import sys

    sys.path.insert(0, os.getcwd())
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="module:Class building the nn.Module")
    parser.add_argument("--batches", required=True, help="module:function, step -> (inputs, target)")
    parser.add_argument("--loss", required=True, help="module:function (output, target) -> loss")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1, help="SGD's learning rate")
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    batches, loss_fn = _load(args.batches), _load(args.loss)
    torch.manual_seed(0)
    model = _load(args.model)()
    lay = layout(PLAN)
    inputs, _ = batches(0)
    example = _microbatches(_shard(inputs, 0, lay.dp), lay.microbatches)[0]
    parallel = parallelize(model, PLAN, loss_fn=loss_fn, example_inputs=example)
    for note in parallel.notes:
        if dist.get_rank() == 0:
            print(f"note: {note}", flush=True)
    opt = torch.optim.SGD(parallel.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = batches(step)
        loss = parallel.step(x, y)
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss:.6f}", flush=True)
    # Every rank done communicating before any tears its process group down: gloo aborts a
    # process whose peer closes a connection under a pending operation.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"#;

/// Megatron-LM's arguments for a transformer (3d) plan, one per line, or why there are
/// none.
///
/// # Errors
/// The plan is not a transformer plan.
pub fn megatron_arguments(report: &PlanReport) -> Result<String, String> {
    let Some(p) = &report.parallelism else {
        return Err(format!(
            "--emit megatron: this is a {} plan of layers; Megatron-LM's arguments describe \
             transformer (3d) plans (plan a GPT-like model, or --strategy 3d)",
            report.strategy
        ));
    };
    let m = &p.transformer;
    // The precision the plan was priced at (asked, or a profile's).
    let precision = Some(p.precision);
    let mut args: Vec<String> = vec![
        format!("--num-layers {}", m.layers),
        format!("--hidden-size {}", m.hidden),
        format!("--num-attention-heads {}", m.heads),
        format!("--ffn-hidden-size {}", m.ffn),
        format!("--seq-length {}", m.sequence),
        format!(
            "--max-position-embeddings {}",
            if m.positions > 0 {
                m.positions
            } else {
                m.sequence
            }
        ),
        format!("--tensor-model-parallel-size {}", p.tensor_parallel),
        format!("--pipeline-model-parallel-size {}", p.pipeline_parallel),
    ];
    if p.context_parallel > 1 {
        // Ring attention (Megatron-Core's point-to-point key/value exchange), as priced.
        args.push(format!("--context-parallel-size {}", p.context_parallel));
        args.push("--cp-comm-type p2p".into());
    }
    let chunks = u64::from(p.pipeline_parallel * p.virtual_stages).max(1);
    if m.layers % chunks != 0 {
        // Uneven stages as priced: the blocks spread over the chunks in order, the extra
        // ones on the first (Megatron-Core's layout string: `E` the embedding, `t` a block,
        // `L` the loss, `|` between chunks, chunk `j` on stage `j mod p`).
        let layout: Vec<String> = (0..chunks)
            .map(|j| {
                let n = m.layers / chunks + u64::from(j < m.layers % chunks);
                let embedding = if j == 0 { "E" } else { "" };
                let loss = if j + 1 == chunks { "L" } else { "" };
                format!("{embedding}t*{n}{loss}")
            })
            .collect();
        args.push(format!(
            "--pipeline-model-parallel-layout {}",
            layout.join("|")
        ));
    } else if p.virtual_stages > 1 {
        let per = m.layers / chunks;
        args.push(format!("--num-layers-per-virtual-pipeline-stage {per}"));
    }
    args.push(format!("--micro-batch-size {}", p.micro_batch_size));
    args.push(format!("--global-batch-size {}", report.batch));
    match p.recompute {
        "full" => {
            args.push("--recompute-granularity full".into());
            args.push("--recompute-method uniform".into());
            args.push("--recompute-num-layers 1".into());
        }
        "selective" => {
            args.push("--recompute-granularity selective".into());
            if !p.recompute_modules.is_empty() {
                args.push(format!(
                    "--recompute-modules {}",
                    p.recompute_modules.join(" ")
                ));
            }
        }
        _ => {}
    }
    if p.sequence_parallel {
        args.push("--sequence-parallel".into());
        if p.tp_comm_overlap {
            // The price assumed its collectives overlapped with the GEMMs beside them.
            args.push("--tp-comm-overlap".into());
        }
    }
    match p.zero {
        0 => {}
        // Megatron's distributed optimizer shards optimizer state and reduce-scatters
        // gradients: ZeRO-1 with ZeRO-2's gradient traffic.
        1 | 2 => args.push("--use-distributed-optimizer".into()),
        // Weights sharded too: Megatron-FSDP, with the flags its user guide requires
        // (Megatron-LM docs/discussions/megatron-fsdp-user-guide @ f6f94c70). Not
        // `--use-torch-fsdp2`, which `validate_args` refuses with pipeline parallelism, tied
        // embeddings, fp16 and the default gradient-accumulation fusion
        // (megatron/training/arguments.py @ 307dcf37); Megatron-FSDP is refused with none
        // of them, and overlaps its gathers and reduce-scatters on its own.
        _ => args.extend(
            [
                "--use-megatron-fsdp",
                "--data-parallel-sharding-strategy optim_grads_params",
                "--no-gradient-accumulation-fusion",
                "--use-distributed-optimizer",
                "--ckpt-format fsdp_dtensor",
            ]
            .map(String::from),
        ),
    }
    if m.kv_heads != m.heads {
        args.push("--group-query-attention".into());
        args.push(format!("--num-query-groups {}", m.kv_heads));
    }
    if m.positions == 0 {
        // No learned table: rotary positions, as Llama's and GPT-NeoX's blocks apply them.
        args.push("--position-embedding-type rope".into());
    }
    if m.gated_mlp {
        args.push("--swiglu".into());
    }
    if m.rms_norm {
        args.push("--normalization RMSNorm".into());
    }
    if !m.biases {
        args.push("--disable-bias-linear".into());
    }
    if !m.tied {
        args.push("--untie-embeddings-and-output-weights".into());
    }
    args.extend(attention_arguments(m));
    args.extend(expert_arguments(p));
    match precision {
        Some(Precision::Fp16) => args.push("--fp16".into()),
        Some(Precision::Bf16) => args.push("--bf16".into()),
        // Transformer Engine's FP8 as ralpc prices it: E4M3 forward and E5M2 gradients,
        // per-tensor current scaling (Megatron-Bridge's "fp8-cs"), bf16 elsewhere.
        Some(Precision::Fp8) => {
            args.push("--bf16".into());
            args.push("--fp8-format hybrid".into());
            args.push("--fp8-recipe tensorwise".into());
        }
        Some(Precision::Mxfp8) => {
            args.push("--bf16".into());
            args.push("--fp8-format e4m3".into());
            args.push("--fp8-recipe mxfp8".into());
        }
        _ => {}
    }
    if precision.is_some_and(Precision::is_fp8) && p.zero >= 1 {
        // FP8 parameters, as priced: Megatron-LM allows them with a sharded optimizer.
        args.push("--fp8-param-gather".into());
    }
    // ralpc prices the data-parallel collectives overlapped with the backward and forward
    // passes (Megatron-FSDP's sharding strategy turns both on itself).
    match p.zero {
        _ if p.data_parallel <= 1 => {}
        0 => args.push("--overlap-grad-reduce".into()),
        1 | 2 => {
            args.push("--overlap-grad-reduce".into());
            args.push("--overlap-param-gather".into());
        }
        _ => {}
    }
    let mut out = format!(
        "# Megatron-LM arguments of ralpc's {} plan for {} on {} GPUs \
         (data parallel {} follows from the world size)\n",
        report.strategy, report.model, report.gpus_used, p.data_parallel
    );
    for a in args {
        let _ = writeln!(out, "{a}");
    }
    Ok(out)
}

/// Megatron-LM's arguments for attention other than Llama's (TransformerConfig's and
/// MLATransformerConfig's fields, megatron/core/transformer/transformer_config.py @
/// d98e8a64): a head size other than h/a, Qwen3's query/key norms, Qwen2's Q/K/V biases,
/// DeepSeek's latent attention, gpt-oss's sliding windows on alternate blocks.
fn attention_arguments(m: &ralpc_passes::transformer::Transformer) -> Vec<String> {
    let mut args = Vec::new();
    match m.latent {
        Some(l) => {
            args.push("--multi-latent-attention".into());
            if l.q_rank > 0 {
                args.push(format!("--q-lora-rank {}", l.q_rank));
            }
            args.push(format!("--kv-lora-rank {}", l.kv_rank));
            args.push(format!("--qk-head-dim {}", l.nope_dim));
            args.push(format!("--qk-pos-emb-head-dim {}", l.rope_dim));
            args.push(format!("--v-head-dim {}", l.v_dim));
        }
        None if m.head_dim * m.heads != m.hidden => {
            args.push(format!("--kv-channels {}", m.head_dim));
        }
        None => {}
    }
    if m.qk_norm {
        args.push("--qk-layernorm".into());
    }
    if m.qkv_bias && !m.biases {
        args.push("--add-qkv-bias".into());
    }
    if m.sliding_window > 0 {
        // The first block of each pair windowed: one full block after each windowed one.
        args.push(format!("--window-size {},0", m.sliding_window));
        args.push("--window-attn-skip-freq 2".into());
    }
    args
}

/// Megatron-LM's arguments for a mixture of experts as priced: experts and their router,
/// the leading dense blocks, expert (tensor) parallelism, grouped GEMMs, the dispatcher and
/// the all-to-all overlap.
fn expert_arguments(p: &crate::ParallelismRow) -> Vec<String> {
    let (Some(moe), Some(options)) = (p.transformer.moe, p.experts) else {
        return Vec::new();
    };
    let mut args = vec![
        format!("--num-experts {}", moe.experts),
        format!("--moe-router-topk {}", moe.top_k),
        format!("--moe-ffn-hidden-size {}", moe.expert_ffn),
    ];
    if moe.shared_ffn > 0 {
        args.push(format!(
            "--moe-shared-expert-intermediate-size {}",
            moe.shared_ffn
        ));
    }
    let (dense, sparse) = p.transformer.spec().block_counts();
    if dense > 0 {
        args.push(format!("--moe-layer-freq ([0]*{dense}+[1]*{sparse})"));
    }
    if moe.router == ralpc_ir::models::Router::Sigmoid {
        args.push("--moe-router-score-function sigmoid".into());
    }
    args.push(format!(
        "--expert-model-parallel-size {}",
        p.expert_parallel
    ));
    // Megatron-LM's default is the tensor-parallel degree: always said.
    args.push(format!(
        "--expert-tensor-parallel-size {}",
        p.expert_tensor_parallel
    ));
    args.push("--moe-grouped-gemm".into());
    args.push(format!(
        "--moe-token-dispatcher-type {}",
        options.dispatcher.name()
    ));
    // Megatron-Core runs the overlap in bf16 or fp16 (FP8 on top of bf16).
    if options.a2a_overlap
        && !matches!(p.precision, Precision::Fp32 | Precision::Tf32)
        && p.expert_parallel > 1
        && (p.pipeline_parallel == 1 || p.virtual_stages > 1)
        && p.recompute != "full"
    {
        args.push("--overlap-moe-expert-parallel-comm".into());
    }
    args
}

/// Writes the files of `engines` (names in [`ENGINES`]) for `compiled` into `dir`; their
/// names.
///
/// # Errors
/// [`Error::Plan`] when the plan has no form for an engine; [`Error::Write`].
pub fn write(
    engines: &[String],
    compiled: &Compiled,
    dir: &std::path::Path,
) -> Result<Vec<&'static str>, Error> {
    let refuse = |why: String| Error::Plan(Box::new(ralpc_passes::plan::PlanError::Request(why)));
    let mut written = Vec::new();
    for engine in engines {
        let Some(&(_, file)) = ENGINES.iter().find(|(e, _)| e == engine) else {
            return Err(refuse(format!(
                "--emit {engine}: not an engine (torch, megatron)"
            )));
        };
        let text = match engine.as_str() {
            "torch" => {
                let Some(strategy) = &compiled.strategy else {
                    return Err(refuse(format!(
                        "--emit torch: this plan has no per-layer placement: {}",
                        compiled
                            .not_lowered
                            .as_deref()
                            .unwrap_or("it was not lowered")
                    )));
                };
                torch_script(&compiled.report, strategy)
            }
            _ => megatron_arguments(&compiled.report).map_err(refuse)?,
        };
        std::fs::create_dir_all(dir).map_err(|error| {
            Error::Write(Box::new(FileError {
                path: dir.display().to_string(),
                error,
            }))
        })?;
        crate::output::write_atomically(&dir.join(file), &text)?;
        written.push(file);
    }
    Ok(written)
}
