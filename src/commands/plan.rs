//! `ralpc plan MODEL --gpus N …` (also `ralpc MODEL …`).

use std::fmt::Write;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressDrawTarget};
use ralpc::passes::cluster::{Link, Precision};
use ralpc::passes::cost::Optimizer;
use ralpc::passes::plan::{Family, Schedule};
use ralpc::passes::transformer::{Knobs, Recompute};
use ralpc::passes::units::{parse_bandwidth, parse_bytes, parse_latency};
use ralpc::{ClusterOptions, PlanOptions, PlanReport};

pub const EXAMPLES: &str = "\
Examples:
  ralpc fixtures/onnx/vgg16/model.onnx --gpus 8            # shorthand for `ralpc plan`
  ralpc plan model.onnx --cluster dgx-h100x4 --batch 256 --json
  ralpc plan model.onnx --gpus 8 --strategy burst --tolerance 1.0
  ralpc plan model.onnx --gpus 16 --strategy pipeline --schedule gpipe --microbatches 8
  ralpc plan graph.txt --gpus 8 --link-bandwidth 1GB/s --strategy pipeline --schedule async
  ralpc plan gnmt/graph.txt --gpus 8 --batch 64   # a PipeDream graph that records no batch
  ralpc plan A100_wrn.prof --gpus 8 --batch 32     # a DeepPool profile: its layers as a chain
  ralpc plan model.onnx --gpus 8 --profile a100.prof --write-strategy plan.strategy.json
  ralpc plan model.onnx --gpus 8 -o out/          # out/plan.json: per-rank instructions
  ralpc plan model.onnx --gpus 8 -o out/ --check  # exit 0 if out/ is up to date, else 1
  ralpc plan model.onnx --gpus 8 --strategy-file theirs.strategy.json   # price another plan
  ralpc plan gpt.onnx --cluster selene --gpus 512 --batch 1536 --precision fp16 --optimizer adam
  ralpc plan gpt.onnx --cluster selene --gpus 512 --batch 1536 --precision fp16 --optimizer adam \
      --tensor-parallel 8 --pipeline-parallel 2 --micro-batch-size 4 --recompute full  # price it

Strategies: dp (data parallel on every GPU), burst (each layer its own GPU count),
soap (also split convolutions and dense layers by rows/features/channels), pipeline
(stages on disjoint GPU groups), 3d (tensor x pipeline x data parallelism of a
GPT-like model, as Megatron-LM trains it), auto (the fastest of all; 3d for a GPT-like
model). Every plan is compared with data parallelism under the same costs.

Transformer (3d) plans: a GPT-like decoder (token embedding, attention blocks, MLP) is
recognized in the ONNX graph and placed as Megatron-LM places it; each Megatron option
given fixes that dimension and the rest is searched (all given: only priced). Their
executable form is not written yet: they print the plan and --json only.

Artifacts go to DIR (default `<model stem>.ralpc`): plan.json, plan.dot (+ plan.svg with
Graphviz), timeline.json and report.html, each written atomically. plan.json records a
hash of every input; a run whose DIR is up to date does nothing (--force plans again).";

/// Arguments of `ralpc plan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// An ONNX model, a PipeDream profiler `graph.txt` or a DeepPool `.prof` (measured layers).
    pub model: PathBuf,
    /// GPUs to plan for (default: every GPU of the cluster; the default cluster grows to fit).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub gpus: Option<u32>,
    /// Multiply the cluster's nodes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub nodes: Option<u32>,
    /// A cluster preset (dgx-a100, dgx-h100, p3dn-v100, pcie-a100, selene, eos; NAMExN) or TOML file
    /// [default: dgx-a100, with as many nodes as --gpus needs].
    #[arg(long)]
    pub cluster: Option<String>,
    /// Global batch for ONNX models [default: the exported batch when ≥ 2, else 32]. A
    /// PipeDream graph keeps the batch it was measured at (give it where the file records
    /// none); a DeepPool profile plans any batch [default: the largest it measured].
    #[arg(long, value_parser = super::parse_positive)]
    pub batch: Option<u64>,
    /// Full shape of one input, axis 0 the batch, e.g. `input_ids=8,2048` to plan a GPT at
    /// sequence 2048 or `images=16,3,800,1333` (repeatable; the rest keep the model's own).
    #[arg(long = "input", value_name = "NAME=D0,D1,...", value_parser = super::parse_input_shape)]
    pub inputs: Vec<(String, Vec<u64>)>,
    /// Pipeline microbatches (default: searched over powers of two dividing the batch).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub microbatches: Option<u32>,
    /// Which plans to search.
    #[arg(long, default_value = "auto", value_parser = ["auto", "dp", "burst", "soap", "pipeline", "3d"])]
    pub strategy: String,
    /// Pipeline schedule: 1f1b and gpipe are synchronous, async is PipeDream's
    /// weight-stashing schedule.
    #[arg(long, value_parser = ["1f1b", "gpipe", "async"])]
    pub schedule: Option<String>,
    /// Allowed GPU-sec amplification above 1: plans use at most (1 + X) × the single-GPU
    /// time in GPU time (`inf`: no budget).
    #[arg(long, default_value_t = 1.0, value_parser = super::parse_tolerance)]
    pub tolerance: f64,
    /// Measured per-op costs (ralpc JSON or DeepPool .prof).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Make the network flat: every pair of GPUs at this bandwidth (e.g. `1GB/s`).
    #[arg(long, value_parser = parse_bandwidth)]
    pub link_bandwidth: Option<f64>,
    /// Latency of every link of the flat network (e.g. `240us`; default 0).
    #[arg(long, value_parser = parse_latency, requires = "link_bandwidth")]
    pub link_latency: Option<f64>,
    /// Per-GPU memory limit below the GPUs' own (e.g. `16GiB`).
    #[arg(long, value_parser = parse_bytes)]
    pub memory_limit: Option<u64>,
    /// The optimizer, whose state counts in memory.
    #[arg(long, default_value = "momentum", value_parser = ["sgd", "momentum", "adam"])]
    pub optimizer: String,
    /// Math precision (default: the profile's, else tf32).
    #[arg(long, value_parser = ["fp32", "tf32", "fp16", "bf16"])]
    pub precision: Option<String>,
    /// Save the chosen strategy as a strategy file.
    #[arg(long, value_name = "FILE")]
    pub write_strategy: Option<PathBuf>,
    /// Evaluate this strategy file under ralpc's costs instead of searching.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["strategy", "schedule", "microbatches", "tolerance"])]
    pub strategy_file: Option<PathBuf>,
    /// Where to write the executable plan (`plan.json`, format ralpc-plan/1), the placed
    /// graph (`plan.dot`, and `plan.svg` when Graphviz is installed), the simulated
    /// timeline (`timeline.json`, open it in ui.perfetto.dev) and `report.html`
    /// [default: `<model stem>.ralpc` in the working directory].
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print one JSON object instead of the summary (always plans).
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
    /// Print nothing but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Exit 0 when DIR holds the plan of exactly these inputs (model, cluster, profile,
    /// options, ralpc version), 1 when not; plan nothing.
    #[arg(long, conflicts_with_all = ["json", "force"])]
    pub check: bool,
    /// Plan again even when DIR is up to date.
    #[arg(long)]
    pub force: bool,
    /// Transformer plans: GPUs of one node splitting every block (attention by heads, MLP
    /// by columns then rows) [default: searched].
    #[arg(long, value_name = "T", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub tensor_parallel: Option<u32>,
    /// Pipeline stages [default: searched].
    #[arg(long, value_name = "P", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub pipeline_parallel: Option<u32>,
    /// Model chunks per GPU: interleaved 1F1B above 1 [default: searched].
    #[arg(long, value_name = "V", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u32).range(1..))]
    pub virtual_stages: Option<u32>,
    /// Sequences per microbatch [default: searched].
    #[arg(long, value_name = "B", help_heading = "Transformer (3d) plans", value_parser = super::parse_positive)]
    pub micro_batch_size: Option<u64>,
    /// Activation recomputation: none, selective (attention core) or full (every block)
    /// [default: searched].
    #[arg(long, help_heading = "Transformer (3d) plans", value_parser = ["none", "selective", "full"])]
    pub recompute: Option<String>,
    /// Split LayerNorm and dropout by sequence positions inside tensor-parallel groups
    /// (`--sequence-parallel` alone: on) [default: searched].
    #[arg(long, value_name = "on|off", help_heading = "Transformer (3d) plans", num_args = 0..=1, default_missing_value = "on", value_parser = ["on", "off"])]
    pub sequence_parallel: Option<String>,
    /// Shard optimizer state (1), gradients too (2), parameters too (3) over data-parallel
    /// replicas [default: searched].
    #[arg(long, value_name = "K", help_heading = "Transformer (3d) plans", value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Option<u8>,
    /// Keep and reduce gradients in fp32 (18 bytes per parameter with Adam, not 16).
    #[arg(long, help_heading = "Transformer (3d) plans")]
    pub fp32_gradients: bool,
    /// Lower the plan only if its instructions (every rank's program) stay below N; above
    /// it the plan is priced, not written (lowering takes about 1 KB of memory per
    /// instruction) [default: 2000000].
    #[arg(long, value_name = "N", help_heading = "Transformer (3d) plans")]
    pub max_instructions: Option<u64>,
}

fn precision(name: &str) -> Precision {
    match name {
        "fp32" => Precision::Fp32,
        "fp16" => Precision::Fp16,
        "bf16" => Precision::Bf16,
        _ => Precision::Tf32,
    }
}

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    let options = PlanOptions {
        model: args.model.clone(),
        gpus: args.gpus,
        cluster: ClusterOptions {
            spec: args.cluster.clone(),
            nodes: args.nodes,
            flat: args.link_bandwidth.map(|bandwidth| Link {
                bandwidth,
                latency_us: args.link_latency.unwrap_or(0.0),
            }),
        },
        batch: args.batch,
        inputs: args.inputs.iter().cloned().collect(),
        microbatches: args.microbatches,
        family: Family::parse(&args.strategy),
        schedule: args.schedule.as_deref().and_then(Schedule::parse),
        // A strategy file is priced as it is, whatever its GPU time.
        tolerance: (args.tolerance.is_finite() && args.strategy_file.is_none())
            .then_some(args.tolerance),
        profile: args.profile.clone(),
        memory_limit: args.memory_limit,
        optimizer: Optimizer::parse(&args.optimizer).unwrap_or_default(),
        precision: args.precision.as_deref().map(precision),
        strategy_file: args.strategy_file.clone(),
        executable: true,
        knobs: Knobs {
            tensor: args.tensor_parallel,
            pipeline: args.pipeline_parallel,
            virtual_stages: args.virtual_stages,
            micro_batch: args.micro_batch_size,
            recompute: args.recompute.as_deref().and_then(Recompute::parse),
            sequence_parallel: args.sequence_parallel.as_deref().map(|v| v == "on"),
            zero: args.zero,
            schedule: None,
        },
        fp32_gradients: args.fp32_gradients,
        max_instructions: args.max_instructions,
    };
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| ralpc::default_out_dir(&args.model));
    let shown = dir.display().to_string();
    if args.check {
        if !ralpc::up_to_date(&options, &dir)? {
            return Err(ralpc::Error::OutOfDate(Box::new(shown)));
        }
        if !args.quiet {
            super::print_stdout(&format!("{shown}: up to date\n"));
        }
        return Ok(());
    }
    // The summary and the strategy file are not kept in DIR: asking for them plans again.
    let skippable = !args.force && !args.json && args.write_strategy.is_none();
    // (An unreadable input is not up to date: planning says what is wrong with it.)
    if skippable && ralpc::up_to_date(&options, &dir).unwrap_or(false) {
        if !args.quiet {
            super::print_stdout(&format!(
                "{shown}: up to date with the model, cluster, profile and options; nothing \
                 to do (--force plans again)\n"
            ));
        }
        return Ok(());
    }
    // A spinner on a terminal (indicatif draws nothing elsewhere) while big searches run.
    let spinner = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    };
    spinner.set_message(format!("planning {}", args.model.display()));
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let compiled = ralpc::compile(&options);
    spinner.finish_and_clear();
    let compiled = compiled?;
    compiled.write(&dir)?;
    if let Some(path) = &args.write_strategy {
        let Some(strategy) = &compiled.strategy else {
            return Err(ralpc::Error::Plan(Box::new(
                ralpc::passes::plan::PlanError::Request(format!(
                    "--write-strategy: this transformer (3d) plan has no strategy file form: {} \
                     (--json prints its configuration)",
                    compiled
                        .not_lowered
                        .as_deref()
                        .unwrap_or("it was not lowered")
                )),
            )));
        };
        ralpc::write_atomically(path, &strategy.to_json())?;
    }
    if args.quiet {
        return Ok(());
    }
    if let Some(why) = &compiled.svg_skipped {
        eprintln!("note: plan.svg not written: {why}");
    }
    let text = if args.json {
        // Strings and finite numbers always serialize.
        serde_json::to_string_pretty(&compiled.report).unwrap_or_default() + "\n"
    } else {
        let simulation = compiled.executable.as_ref().map(|e| &e.simulation);
        let mut text = match &compiled.report.parallelism {
            Some(p) => summary_3d(&compiled.report, p),
            None => summary(&compiled.report, simulation),
        };
        let names: Vec<&str> = compiled.files.iter().map(|(name, _)| *name).collect();
        if let Some(why) = &compiled.not_lowered {
            let _ = writeln!(text, "wrote nothing: {why}");
        } else {
            let _ = writeln!(text, "wrote {}: {}", shown, names.join(", "));
        }
        text
    };
    super::print_stdout(&text);
    Ok(())
}

/// A duration in the unit that shows it: seconds for large models, milliseconds or
/// microseconds for small ones.
fn duration(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.3} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3} ms", us / 1e3)
    } else {
        format!("{us:.1} µs")
    }
}

/// A count with the prefix that shows it (`1.56 B`, `124.4 M`, `109312`).
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} M", n as f64 / 1e6),
        n => n.to_string(),
    }
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1e3)
}

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

/// `text` cut to `width` characters, keeping its end (layer names differ at the end).
fn shorten(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        return text.to_owned();
    }
    let tail: String = text.chars().skip(n - (width - 1)).collect();
    format!("…{tail}")
}

/// A speedup over one GPU in words: "2.41× faster than one GPU", or slower.
fn against_one_gpu(speedup: f64) -> String {
    if (speedup - 1.0).abs() < 0.005 {
        "as fast as one GPU".to_owned()
    } else if speedup > 1.0 {
        format!("{speedup:.2}× faster than one GPU")
    } else {
        format!("{:.2}× slower than one GPU", 1.0 / speedup.max(1e-9))
    }
}

/// One line per stage: its layers, GPUs, time per microbatch, sync and memory.
fn write_stages(out: &mut String, r: &PlanReport) {
    let _ = writeln!(out, "stages:");
    for (k, s) in r.stages.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {k}: {} .. {}  on {}  {} per microbatch, sync {}, {}",
            crate::printable::printable(&s.first_layer),
            crate::printable::printable(&s.last_layer),
            if s.replicas == 1 {
                format!("1 GPU (rank {})", s.first_rank)
            } else {
                format!(
                    "{} GPUs (ranks {}..{})",
                    s.replicas,
                    s.first_rank,
                    s.first_rank + s.replicas - 1
                )
            },
            ms(s.microbatch_us),
            ms(s.sync_us),
            gib(s.memory_bytes)
        );
    }
}

fn summary_3d(r: &PlanReport, p: &ralpc::ParallelismRow) -> String {
    let mut out = String::new();
    let m = &p.transformer;
    let secs = duration;
    let _ = writeln!(
        out,
        "model: {}  (GPT: {} layers, hidden {}, {} heads, MLP {}, sequence {}, vocabulary {}; \
         {} parameters)",
        r.model,
        m.layers,
        m.hidden,
        m.heads,
        m.ffn,
        m.sequence,
        m.vocabulary,
        count(m.params)
    );
    let _ = writeln!(
        out,
        "plan: 3d — tensor {} × pipeline {} × data {} on {} GPUs of {} (batch {})",
        p.tensor_parallel, p.pipeline_parallel, p.data_parallel, r.gpus_used, r.cluster, r.batch
    );
    let _ = writeln!(
        out,
        "      micro-batch {} ({} microbatches), {}{}, recompute {}, sequence parallel {}, ZeRO {}",
        p.micro_batch_size,
        r.microbatches,
        r.schedule,
        if p.virtual_stages > 1 {
            format!(" with {} chunks per GPU", p.virtual_stages)
        } else {
            String::new()
        },
        p.recompute,
        if p.sequence_parallel { "on" } else { "off" },
        p.zero
    );
    let per_gpu = |flops: f64| flops / (r.iteration_time_us * 1e-6) / f64::from(r.gpus_used) / 1e12;
    let dp = r.candidates.iter().find(|c| c.strategy == "dp");
    let _ = writeln!(
        out,
        "iteration: {}, {:.1} samples/s, {:.0} TFLOP/s per GPU ({:.0} with recomputation)  \
         (data parallel {}{}; lower bound {})",
        secs(r.iteration_time_us),
        r.batch as f64 / (r.iteration_time_us * 1e-6),
        per_gpu(p.model_flops_per_iteration),
        per_gpu(p.hardware_flops_per_iteration),
        secs(r.dp_iteration_time_us),
        if dp.is_some_and(|c| !c.fits) {
            ", does not fit"
        } else {
            ""
        },
        secs(r.lower_bound_us)
    );
    let t = &p.time_breakdown;
    let _ = writeln!(
        out,
        "time: compute {}, tensor-parallel {}, pipeline sends {}, bubble {}, gradient sync {}, \
         optimizer {}",
        secs(t.compute_us),
        secs(t.tensor_comm_us),
        secs(t.pipeline_comm_us),
        secs(t.bubble_us),
        secs(t.data_comm_us),
        secs(t.optimizer_us)
    );
    let mem = &p.memory_breakdown;
    let _ = writeln!(
        out,
        "memory per GPU: {} of {}: weights {}, gradients {}, optimizer {}, activations {}, \
         workspace {}\n",
        gib(r.peak_memory_bytes),
        gib(r.memory_capacity_bytes),
        gib(mem.weights),
        gib(mem.gradients),
        gib(mem.optimizer),
        gib(mem.activations),
        gib(mem.workspace)
    );
    write_stages(&mut out, r);
    if let Some(sim) = &r.simulated {
        // The executable plan runs the model's own layers, priced layer by layer.
        let peak = sim.peak_memory_bytes.iter().copied().max().unwrap_or(0) as f64;
        let over = if peak > r.memory_capacity_bytes {
            " (above the GPU's: the layer-by-layer count keeps more activations)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "\nexecutable plan: these stages on the model's own layers, simulated {} per \
             iteration and {} per GPU{over} under the layer-by-layer costs",
            secs(sim.iteration_time_us),
            gib(peak)
        );
    }
    let _ = writeln!(
        out,
        "\n{} configurations priced; planned in {}",
        p.configurations_priced,
        ms(r.planning_time_us as f64)
    );
    out
}

fn summary(r: &PlanReport, simulation: Option<&ralpc::runtime::Simulation>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model: {}  (batch {}, {} GPUs of {})",
        r.model, r.batch, r.gpus, r.cluster
    );
    let _ = writeln!(
        out,
        "plan: {} ({} stage{}, {} microbatch{}, {})",
        r.strategy,
        r.stages.len(),
        if r.stages.len() == 1 { "" } else { "s" },
        r.microbatches,
        if r.microbatches == 1 { "" } else { "es" },
        r.schedule
    );
    let _ = writeln!(
        out,
        "iteration: {}, {:.0} samples/s  (data parallel {}: {:.2}×; lower bound {})",
        ms(r.iteration_time_us),
        r.batch as f64 / (r.iteration_time_us * 1e-6).max(1e-12),
        ms(r.dp_iteration_time_us),
        r.speedup_over_dp,
        ms(r.lower_bound_us)
    );
    let _ = writeln!(
        out,
        "GPU time: {} on {} GPU{}, {:.2}× the single-GPU {} ({}); peak memory {} of {}\n",
        ms(r.gpu_time_us),
        r.gpus_used,
        if r.gpus_used == 1 { "" } else { "s" },
        r.gpu_sec_amplification,
        ms(r.single_gpu_time_us),
        against_one_gpu(r.single_gpu_time_us / r.iteration_time_us.max(1e-9)),
        gib(r.peak_memory_bytes),
        gib(r.memory_capacity_bytes)
    );
    write_stages(&mut out, r);
    // Placement, compactly: runs of consecutive layers placed alike.
    let _ = writeln!(
        out,
        "\n{:<9}  {:<52}  {:>4}  {:>9}  {:>5}  {:>10}",
        "layers", "from .. to", "gpus", "s×a×p", "stage", "compute"
    );
    let mut start = 0;
    while start < r.layers.len() {
        let l = &r.layers[start];
        let alike =
            |m: &ralpc::PlacedLayer| (m.gpus, m.split, m.stage) == (l.gpus, l.split, l.stage);
        let end = start + r.layers[start..].iter().take_while(|m| alike(m)).count();
        let run = &r.layers[start..end];
        let compute: f64 = run.iter().map(|m| m.forward_us + m.backward_us).sum();
        let names = if run.len() == 1 {
            l.name.clone()
        } else {
            format!("{} .. {}", l.name, run[run.len() - 1].name)
        };
        let _ = writeln!(
            out,
            "{:<9}  {:<52}  {:>4}  {:>9}  {:>5}  {:>10}",
            if run.len() == 1 {
                start.to_string()
            } else {
                format!("{start}-{}", end - 1)
            },
            shorten(&crate::printable::printable(&names), 52),
            l.gpus,
            format!(
                "{}×{}×{}",
                l.split.sample, l.split.attribute, l.split.parameter
            ),
            l.stage,
            ms(compute)
        );
        start = end;
    }
    if r.candidates.len() > 1 {
        let _ = writeln!(out, "\ncompared:");
        for c in &r.candidates {
            let _ = writeln!(
                out,
                "  {:<9} {:>12}  amplification {:.2}  {} GPUs  {}{}",
                c.strategy,
                ms(c.iteration_time_us),
                c.gpu_sec_amplification,
                c.gpus_used,
                gib(c.peak_memory_bytes),
                if c.fits { "" } else { "  (does not fit)" }
            );
        }
    }
    if let Some(sim) = simulation {
        let t = sim.iteration_time_us;
        let _ = writeln!(
            out,
            "\nsimulated iteration: {} ({:+.1}% from the prediction)",
            ms(t),
            (t / r.iteration_time_us - 1.0) * 100.0
        );
        for (label, value) in ralpc::simulated_facts(sim) {
            let _ = writeln!(out, "  {label}: {value}");
        }
    }
    let _ = writeln!(out, "\nplanned in {}", ms(r.planning_time_us as f64));
    out
}
