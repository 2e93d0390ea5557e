//! `ralpc profile MODEL --device cpu|cuda:N [--batch-sizes 1,2,4] -o profile.json`.

use std::path::PathBuf;

use ralpc::args::BadArgument;
use ralpc::ProfileOptions;

pub const EXAMPLES: &str = "\
Examples:
  ralpc profile fixtures/train/cnn.onnx --device cpu --batch-sizes 1,2,4,8 -o cnn.profile.json
  ralpc profile fixtures/onnx/resnet50/model.onnx --device cuda:0 --batch-sizes 16,32,64 -o r50.json
  ralpc profile detector.onnx --input images=1,3,640,640 --batch-sizes 1,2 -o det.json  # at 640²
  ralpc fixtures/train/cnn.onnx --gpus 4 --profile cnn.profile.json   # plan with the measurements
  ralpc profile gpt.onnx --device cuda:0 --batch-sizes 1,2,4 -o gpt.json   # + t=1,2,4,8 products
  ralpc gpt.onnx --gpus 64 --profile gpt.json --precision fp32   # a 3d plan from them

Every distinct op (type, attributes, per-sample shapes) is timed on its own, forward
and backward, at each batch size: one warm-up, then the median of --repeats runs (on a
GPU each sample is the mean of 4 runs back to back between two CUDA events, as a training
step queues them; the GPU runs ralpc's CUDA executor: NVRTC kernels, cuBLAS, cuDNN). On
the CPU each point records the runs' spread (interquartile range over the median), and
runs spreading over 20 % are timed again, up to twice more. The output is ralpc's
profile format (ralpc-profile/1), which `ralpc plan --profile` reads.

For a GPT-like model the batch sizes are micro-batch sizes, and each block's four dense
products (QKV, attention projection, MLP in and out) are also measured as one rank of
each --tensor-parallel degree holds them; a 3d plan at the profile's precision prices
those products from the measurements and the rest analytically.";

/// Arguments of `ralpc profile`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ONNX model.
    pub model: PathBuf,
    /// Where to measure: cpu, or cuda:N (GPU N; cuda is cuda:0).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: Target,
    /// Per-device batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8",
          value_parser = super::parse_positive)]
    pub batch_sizes: Vec<u64>,
    /// Full shape of one input, e.g. `images=1,3,640,640` to measure at 640×640 (its batch
    /// axis is replaced by each batch size; repeatable; the rest keep the model's own).
    #[arg(long = "input", value_name = "NAME=D0,D1,...", value_parser = super::parse_input_shape)]
    pub inputs: Vec<(String, Vec<u64>)>,
    /// Timed runs per op and direction (1 to 1000); the median is kept.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeats: u32,
    /// Seeds weights the model lacks and the inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Tensor-parallel degrees, comma-separated: for a GPT-like model, each block's dense
    /// products on one rank of each degree that splits it are measured too, so that
    /// `ralpc plan --profile` prices its 3d plans from them.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8",
          value_parser = super::parse_positive)]
    pub tensor_parallel: Vec<u64>,
    /// The profile to write (JSON).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: PathBuf,
    /// Write the profile even where it replaces the model.
    #[arg(long)]
    pub force: bool,
}

/// What `--device` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// This machine's CPU.
    Cpu,
    /// GPU N.
    Cuda(usize),
}

/// `cpu`, `cuda` (GPU 0) or `cuda:N`.
fn parse_device(s: &str) -> Result<Target, BadArgument> {
    match s {
        "cpu" => Ok(Target::Cpu),
        "cuda" => Ok(Target::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Target::Cuda)
            .ok_or_else(|| BadArgument(format!("'{s}' is not cpu, cuda or cuda:N"))),
    }
}

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    // Before measuring for minutes, not after.
    ralpc::refuse_overwriting_inputs(&args.out, &[&args.model], args.force)?;
    ralpc::check_writable(&args.out)?;
    if args.device != Target::Cpu {
        super::restart_with(&ralpc::runtime::cuda::libs::Lib::ONE_GPU)?;
    }
    let options = ProfileOptions {
        model: args.model.clone(),
        batch_sizes: args.batch_sizes.clone(),
        inputs: args.inputs.iter().cloned().collect(),
        repeats: args.repeats,
        seed: args.seed,
        tensor_parallel: args.tensor_parallel.clone(),
    };
    let bar = super::progress("profiling {bar:30} {pos}/{len} ops", Some(0), true);
    let progress = |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let profile = match args.device {
        Target::Cpu => ralpc::profile_cpu(&options, &progress),
        Target::Cuda(ordinal) => ralpc::profile_cuda(&options, ordinal, &progress),
    };
    bar.finish_and_clear();
    let profile = profile?;
    let json = serde_json::to_string_pretty(&profile).unwrap_or_default() + "\n";
    ralpc::write_atomically(&args.out, &json)?;
    let measurements: usize = profile.entries.iter().map(|e| e.points.len()).sum();
    eprintln!(
        "wrote {}: {} op signatures, {measurements} measurements\nmeasured on {}: {}",
        args.out.display(),
        profile.entries.len(),
        profile.device.name,
        profile.device.note
    );
    Ok(())
}
