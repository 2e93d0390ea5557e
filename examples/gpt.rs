//! Writes a structure-only GPT decoder (Megatron-LM's shape family, or Llama's) as ONNX.
//!
//! ```sh
//! cargo run --example gpt -- --layers 48 --hidden 8192 --heads 64 -o gpt-39b.onnx
//! ralpc plan gpt-39b.onnx --cluster selene --gpus 512 --batch 1536 --precision fp16 --optimizer adam
//! # Llama-2 70B: grouped-query attention over 8 key/value heads, SwiGLU, RMSNorm, rotary
//! cargo run --example gpt -- --llama --layers 80 --hidden 8192 --heads 64 --kv-heads 8 \
//!     --ffn 28672 --sequence 4096 --vocabulary 32000 -o llama-70b.onnx
//! ```

use clap::Parser;
use ralpc::ir::models::{gpt, GptSpec};

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
    let written = gpt(&spec).map_err(|e| e.to_string()).and_then(|bytes| {
        ralpc::write_bytes_atomically(&args.out, &bytes).map_err(|e| e.to_string())
    });
    match written {
        Ok(()) => {
            println!("{}: {} parameters", args.out.display(), spec.params());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
