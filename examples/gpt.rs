//! Writes a structure-only GPT decoder (Megatron-LM's shape family, or Llama's) as ONNX.
//!
//! ```sh
//! cargo run --example gpt -- --layers 48 --hidden 8192 --heads 64 -o gpt-39b.onnx
//! ralpc plan gpt-39b.onnx --cluster selene --gpus 512 --batch 1536 --precision fp16 --optimizer adam
//! # Llama-2 70B: grouped-query attention over 8 key/value heads, SwiGLU, RMSNorm, rotary
//! cargo run --example gpt -- --llama --layers 80 --hidden 8192 --heads 64 --kv-heads 8 \
//!     --ffn 28672 --sequence 4096 --vocabulary 32000 -o llama-70b.onnx
//! # A Mixtral-like mixture of experts: 8 experts, each token to 2 of them
//! cargo run --example gpt -- --llama --layers 32 --hidden 4096 --heads 32 --kv-heads 8 \
//!     --experts 8 --top-k 2 --moe-ffn 14336 --sequence 4096 --vocabulary 32000 -o moe.onnx
//! ```

use clap::Parser;
use ralpc::ir::models::{gpt, GptSpec, MoeSpec, Router};

/// A GPT of any (layers, hidden, heads, sequence, vocabulary).
#[derive(Parser)]
struct Args {
    /// Transformer layers.
    #[arg(long, default_value_t = 24)]
    layers: u64,
    /// Hidden size.
    #[arg(long, default_value_t = 2304)]
    hidden: u64,
    /// Attention heads.
    #[arg(long, default_value_t = 24)]
    heads: u64,
    /// Sequence length.
    #[arg(long, default_value_t = 2048)]
    sequence: u64,
    /// Vocabulary.
    #[arg(long, default_value_t = 51200)]
    vocabulary: u64,
    /// MLP inner size [default: 4 × hidden].
    #[arg(long)]
    ffn: Option<u64>,
    /// Llama's block: rotary positions, RMSNorm, a SwiGLU MLP, no biases, no dropout, an
    /// untied head.
    #[arg(long)]
    llama: bool,
    /// Key and value heads (grouped-query attention) [default: --heads].
    #[arg(long)]
    kv_heads: Option<u64>,
    /// A separate LM head instead of the tied embedding.
    #[arg(long)]
    untied: bool,
    /// No dropout nodes (Megatron trains with dropout 0.1 on the embeddings, the attention
    /// probabilities and before each residual add).
    #[arg(long)]
    no_dropout: bool,
    /// Routed experts: a mixture of experts in place of the MLP (written in the dense form:
    /// every expert on every token, weighted by the router's top-k gates, zero elsewhere).
    #[arg(long)]
    experts: Option<u64>,
    /// Experts each token is sent to.
    #[arg(long, default_value_t = 2, requires = "experts")]
    top_k: u64,
    /// Each expert's inner size [default: --ffn].
    #[arg(long, requires = "experts")]
    moe_ffn: Option<u64>,
    /// Shared experts of --moe-ffn each, seeing every token (DeepSeek's).
    #[arg(long, default_value_t = 0, requires = "experts")]
    shared_experts: u64,
    /// Leading blocks that keep the dense MLP (DeepSeek-V3's first 3).
    #[arg(long, default_value_t = 0, requires = "experts")]
    dense_layers: u64,
    /// Sigmoid router scores normalized over the chosen experts (DeepSeek-V3's) instead of
    /// a softmax over all of them.
    #[arg(long, requires = "experts")]
    sigmoid_router: bool,
    /// Where to write the model.
    #[arg(short = 'o', long, default_value = "gpt.onnx")]
    out: std::path::PathBuf,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let ffn = args.ffn.unwrap_or(4 * args.hidden);
    let kv_heads = args.kv_heads.unwrap_or(args.heads);
    let spec = if args.llama {
        GptSpec::llama(
            args.layers,
            args.hidden,
            args.heads,
            kv_heads,
            ffn,
            args.sequence,
            args.vocabulary,
        )
    } else {
        GptSpec {
            ffn,
            kv_heads,
            tied: !args.untied,
            dropout: !args.no_dropout,
            ..GptSpec::megatron(
                args.layers,
                args.hidden,
                args.heads,
                args.sequence,
                args.vocabulary,
            )
        }
    };
    let moe_ffn = args.moe_ffn.unwrap_or(ffn);
    let spec = GptSpec {
        moe: args.experts.map(|experts| MoeSpec {
            experts,
            top_k: args.top_k,
            expert_ffn: moe_ffn,
            shared_ffn: args.shared_experts * moe_ffn,
            dense_layers: args.dense_layers,
            router: match args.sigmoid_router {
                true => Router::Sigmoid,
                false => Router::Softmax,
            },
            groups: 0,
            top_groups: 0,
        }),
        ..spec
    };
    let written = gpt(&spec).map_err(|e| e.to_string()).and_then(|bytes| {
        ralpc::write_bytes_atomically(&args.out, &bytes).map_err(|e| e.to_string())
    });
    match written {
        Ok(()) => {
            match spec.moe {
                None => println!("{}: {} parameters", args.out.display(), spec.params()),
                Some(_) => println!(
                    "{}: {} parameters, {} of them active for a token",
                    args.out.display(),
                    spec.params(),
                    spec.active_params()
                ),
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
