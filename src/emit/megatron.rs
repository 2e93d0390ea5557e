//! `--emit megatron`: Megatron-LM / Megatron-Core's command-line arguments for a
//! transformer (3d) plan.

use std::fmt::Write;

use ralpc_passes::cluster::Precision;
use ralpc_passes::plan::PlanError;

use crate::plan::PlanReport;

/// Megatron-LM's arguments for a transformer (3d) plan, one per line, or why there are
/// none.
///
/// # Errors
/// The plan is not a transformer plan.
pub fn megatron_arguments(report: &PlanReport) -> Result<String, PlanError> {
    let Some(p) = &report.parallelism else {
        return Err(PlanError::Request(format!(
            "--emit megatron: this is a {} plan of layers; Megatron-LM's arguments describe \
             transformer (3d) plans (plan a GPT-like model, or --strategy 3d)",
            report.strategy
        )));
    };
    if matches!(report.schedule, "zb-h1" | "zb-v") {
        return Err(PlanError::Request(format!(
            "--emit megatron: Megatron-LM has no zero-bubble schedule ({}); --emit torchtitan \
             writes it as PyTorch's, or plan with --schedule 1f1b",
            report.schedule
        )));
    }
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
        // The key/value exchange the plan priced.
        args.push(format!("--context-parallel-size {}", p.context_parallel));
        args.push(format!(
            "--cp-comm-type {}",
            p.cp_comm_type.unwrap_or("p2p")
        ));
    }
    let chunks = u64::from(p.pipeline_parallel * p.virtual_stages).max(1);
    let places = ralpc_passes::transformer::split_places(m.layers, p.ends_as_blocks);
    if p.ends_as_blocks {
        // The embedding and the loss a block each, as Megatron-Bridge's 405B recipes set
        // them (megatron/core/transformer/transformer_block.py @ d98e8a64).
        args.push("--account-for-embedding-in-pipeline-split".into());
        args.push("--account-for-loss-in-pipeline-split".into());
        if p.virtual_stages > 1 {
            args.push(format!(
                "--num-layers-per-virtual-pipeline-stage {}",
                places / chunks
            ));
        }
    } else if places % chunks != 0 {
        // Uneven stages as priced (Megatron-Core's layout string: `E` the embedding, `t` a
        // block, `L` the loss, `|` between chunks, chunk `j` on stage `j mod p`).
        let layout: Vec<String> = p
            .chunk_layers
            .iter()
            .enumerate()
            .map(|(j, n)| {
                let embedding = if j == 0 { "E" } else { "" };
                let loss = if j as u64 + 1 == chunks { "L" } else { "" };
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
            match p.recompute_num_layers {
                // The first `n` layers of each chunk.
                Some(n) => {
                    args.push("--recompute-method block".into());
                    args.push(format!("--recompute-num-layers {n}"));
                }
                None => {
                    args.push("--recompute-method uniform".into());
                    args.push("--recompute-num-layers 1".into());
                }
            }
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
    if let Some(o) = &p.offload {
        if o.activation_layers > 0 {
            // Megatron-LM turns its layer-wise offload on with the count
            // (megatron/training/arguments.py @ d98e8a64).
            args.push(format!(
                "--cpu-offloading-num-layers {}",
                o.activation_layers
            ));
        }
        if o.optimizer_fraction > 0.0 {
            // The hybrid device optimizer needs the precision-aware optimizer; its copies
            // overlap the CPU step as priced.
            args.extend([
                "--optimizer-cpu-offload".into(),
                format!("--optimizer-offload-fraction {}", o.optimizer_fraction),
                "--use-precision-aware-optimizer".into(),
                "--overlap-cpu-optimizer-d2h-h2d".into(),
            ]);
        }
    }
    if p.dp_replicate > 1 {
        // Hybrid sharding: the distributed optimizer's (or Megatron-FSDP's) shards over
        // each of R groups of the data × context ranks.
        args.push(format!(
            "--num-distributed-optimizer-instances {}",
            p.dp_replicate
        ));
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
    let offloads_optimizer = p
        .offload
        .as_ref()
        .is_some_and(|o| o.optimizer_fraction > 0.0);
    if precision.is_some_and(Precision::is_fp8) && p.zero >= 1 && !offloads_optimizer {
        // FP8 parameters, as priced: Megatron-LM allows them with a sharded optimizer, and
        // beside an offloaded optimizer only with delayed scaling, which ralpc does not
        // price.
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
    if moe.groups > 0 {
        // Group-limited routing as the model routes (Megatron-Core's group top-k router).
        args.push(format!("--moe-router-num-groups {}", moe.groups));
        args.push(format!("--moe-router-group-topk {}", moe.top_groups));
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
    if let Some(factor) = options.capacity_factor {
        args.push(format!("--moe-expert-capacity-factor {factor}"));
        if options.pad_to_capacity {
            args.push("--moe-pad-expert-input-to-capacity".into());
        }
    }
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
