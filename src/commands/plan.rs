//! `ralpc plan MODEL --gpus N …` (also `ralpc MODEL …`).

use std::fmt::Write;

use ralpc::PlanReport;

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

Transformer (3d) plans: a GPT-like decoder (token embedding, attention blocks, MLP;
GPT's blocks or Llama's: grouped-query attention, SwiGLU, RMSNorm) is recognized in the
ONNX graph and placed as Megatron-LM places it; each Megatron option given fixes that
dimension and the rest is searched (all given: only priced). The executable plan runs
the stages on the model's own layers (`ralpc run`); --emit megatron writes Megatron-LM's
arguments for it.

Artifacts go to DIR (default `<model stem>.ralpc`): plan.json, plan.dot (+ plan.svg with
Graphviz), timeline.json and report.html, each written atomically, and .ralpc-set.json,
a hash of every input and artifact; a run whose DIR is up to date does nothing (--force
plans again). Outputs that would replace an input are refused (--force writes them).";

pub use ralpc::PlanArgs as Args;

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    if let Some(why) = args.recompute_conflict() {
        return Err(ralpc::Error::Plan(Box::new(
            ralpc_passes::plan::PlanError::Request(why),
        )));
    }
    let options = args.options();
    if !args.more.is_empty() || args.copies.is_some_and(|k| k > 1) {
        return run_set(args, &options);
    }
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
    let skippable =
        !args.force && !args.json && args.write_strategy.is_none() && args.emit.is_empty();
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
    refuse_overwriting_inputs(args, &dir)?;
    let spinner = super::spinner(format!("planning {}", args.model.display()), !args.quiet);
    let compiled = ralpc::compile(&options);
    spinner.finish_and_clear();
    let mut compiled = compiled?;
    // Every engine's file made before anything is written: a refusal leaves no output.
    let engine_files = ralpc::emit::render(&args.emit, &compiled)?;
    // `--json` alone is a question asked by a program: the answer is on stdout, and a folder
    // appearing in its working directory would be a side effect it did not ask for.
    if args.json && args.out.is_none() {
        compiled.files.clear();
        compiled.svg_skipped = None;
    }
    // One plan's files at a time in DIR: another ralpc planning into it waits.
    let _lock = if compiled.files.is_empty() && args.emit.is_empty() {
        None
    } else {
        std::fs::create_dir_all(&dir).map_err(|error| {
            ralpc::Error::Write(Box::new(ralpc::FileError {
                path: shown.clone(),
                error,
            }))
        })?;
        Some(ralpc::lock_output_dir(&dir)?)
    };
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
    let emitted = ralpc::emit::write(&engine_files, &dir)?;
    compiled
        .report
        .warnings
        .extend(ralpc::emit::warnings(&args.emit, &compiled));
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
        if let Some(b) = &compiled.report.background {
            text.push_str(&background(b));
        }
        for warning in &compiled.report.warnings {
            let _ = writeln!(text, "warning: {}", crate::printable::printable(warning));
        }
        let mut names: Vec<&str> = compiled.files.iter().map(|(name, _)| *name).collect();
        names.extend(&emitted);
        if let Some(why) = &compiled.not_lowered {
            if emitted.is_empty() {
                let _ = writeln!(text, "wrote nothing: {why}");
            } else {
                let _ = writeln!(text, "wrote no executable plan: {why}");
                let _ = writeln!(text, "wrote {}: {}", shown, emitted.join(", "));
            }
        } else {
            let _ = writeln!(text, "wrote {}: {}", shown, names.join(", "));
        }
        text
    };
    super::print_stdout(&text);
    Ok(())
}

/// `ralpc plan A B … ` or `--copies K`: the models placed together, printed.
fn run_set(args: &Args, options: &ralpc::PlanOptions) -> Result<(), ralpc::Error> {
    let refused = [
        ("-o", args.out.is_some()),
        ("--emit", !args.emit.is_empty()),
        ("--write-strategy", args.write_strategy.is_some()),
        ("--strategy-file", args.strategy_file.is_some()),
        ("--background", args.background.is_some()),
        ("--check", args.check),
    ];
    if let Some((option, _)) = refused.iter().find(|(_, given)| *given) {
        return Err(ralpc::Error::Plan(Box::new(
            ralpc::passes::plan::PlanError::Request(format!(
                "{option} plans one model: several at once are placed and printed, not \
                 written (plan each on its GPUs to write it)"
            )),
        )));
    }
    let copies = args.copies.unwrap_or(1) as usize;
    let models: Vec<std::path::PathBuf> = std::iter::once(&args.model)
        .chain(&args.more)
        .flat_map(|m| std::iter::repeat_n(m.clone(), copies))
        .collect();
    let spinner = super::spinner(format!("placing {} models", models.len()), !args.quiet);
    let report = ralpc::plan_set(options, &models, 1);
    spinner.finish_and_clear();
    let report = report?;
    if args.quiet {
        return Ok(());
    }
    let text = if args.json {
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
    } else {
        set_summary(&report)
    };
    super::print_stdout(&text);
    Ok(())
}

/// The set's placement as a user reads it.
fn set_summary(r: &ralpc::SetReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} models on {} GPUs of {}, one iteration each:",
        r.models.len(),
        r.gpus,
        r.cluster
    );
    for (i, g) in r.groups.iter().enumerate() {
        let members: Vec<String> = g
            .models
            .iter()
            .filter_map(|&m| r.models.get(m))
            .map(|m| format!("{} ({}, {})", m.model, m.strategy, ms(m.iteration_time_us)))
            .collect();
        let _ = writeln!(
            out,
            "  group {i}: GPUs {}–{} ({}): {}  {}",
            g.first_gpu,
            g.first_gpu + g.gpus - 1,
            g.gpus,
            members.join(", then "),
            ms(g.time_us)
        );
    }
    let _ = writeln!(out, "set: {}", ms(r.makespan_us));
    let against = |name: String, t: Option<f64>| match t {
        Some(t) => format!("  {name}: {} ({:.2}× the set's)", ms(t), t / r.makespan_us),
        None => format!("  {name}: does not plan"),
    };
    let _ = writeln!(
        out,
        "{}",
        against(
            format!("one after another on all {} GPUs", r.gpus),
            r.sequential_us
        )
    );
    let share = r.gpus / r.models.len().max(1) as u32;
    if share >= 1 {
        let _ = writeln!(
            out,
            "{}",
            against(format!("each on {share} GPU(s) at once"), r.even_split_us)
        );
    } else {
        let _ = writeln!(out, "  each on GPUs of its own: fewer GPUs than models");
    }
    let idle = r.gpus - r.groups.iter().map(|g| g.gpus).sum::<u32>();
    if idle > 0 {
        let _ = writeln!(
            out,
            "  {idle} GPU(s) idle: no model finishes sooner on more of them"
        );
    }
    let _ = writeln!(out, "placed in {}", ms(r.planning_time_us as f64));
    out
}

/// Refuses, unless `--force`, an output path (an artifact in `dir`, an emitted file, the
/// strategy file) that names one of the inputs.
fn refuse_overwriting_inputs(args: &Args, dir: &std::path::Path) -> Result<(), ralpc::Error> {
    let cluster = args.cluster.as_deref().map(std::path::Path::new);
    let inputs: Vec<&std::path::Path> = [
        Some(args.model.as_path()),
        args.profile.as_deref(),
        args.strategy_file.as_deref(),
        cluster,
        args.background.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let artifacts = ralpc::ARTIFACTS
        .iter()
        .chain(&["plan.svg"])
        .chain(ralpc::emit::ENGINES.iter().map(|(_, file)| file))
        .map(|name| dir.join(name));
    for output in artifacts.chain(args.write_strategy.clone()) {
        ralpc::refuse_overwriting_inputs(&output, &inputs, args.force)?;
    }
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
    // On a cluster of several GPU types (stages of different types, or a plan on one
    // type's GPUs alone, past rank 0), which type each stage runs on.
    let mixed = r.stages.windows(2).any(|w| w[0].gpu_type != w[1].gpu_type)
        || r.stages.first().is_some_and(|s| s.first_rank > 0);
    for (k, s) in r.stages.iter().enumerate() {
        let of = match mixed {
            true => format!(" of {}", s.gpu_type),
            false => String::new(),
        };
        let _ = writeln!(
            out,
            "  {k}: {} .. {}  on {}  {} per microbatch, sync {}, {}",
            crate::printable::printable(&s.first_layer),
            crate::printable::printable(&s.last_layer),
            if s.replicas == 1 {
                format!("1 GPU{of} (rank {})", s.first_rank)
            } else {
                format!(
                    "{} GPUs{of} (ranks {}..{})",
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

/// The background job's lines: its throughput in the idle windows, the GPUs it could not
/// use and why, and the cluster's throughput against the static partitions.
fn background(b: &ralpc::BackgroundRow) -> String {
    use ralpc::codegen::background::Excluded;
    let mut out = String::new();
    let f = &b.filled;
    let _ = writeln!(
        out,
        "\nbackground: {} at batch {}, one GPU each, in the plan's idle and spare GPU time",
        b.model, b.batch
    );
    let _ = writeln!(
        out,
        "  alone: {} per iteration, {:.1} samples/s per GPU, {}",
        ms(b.alone_iteration_us),
        b.alone_samples_per_second,
        gib(b.memory_bytes as f64)
    );
    let _ = writeln!(
        out,
        "  beside the plan: {:.1} samples/s on {} GPUs ({:.2} GPUs' worth of it alone); {}",
        f.samples_per_second,
        f.gpus.iter().filter(|g| g.samples_per_second > 0.0).count(),
        f.gpu_equivalents,
        if b.interference > 0.0 {
            format!(
                "the plan {:.1}% slower (--interference)",
                f.foreground_slowdown * 100.0
            )
        } else {
            "the plan's slowdown not priced (--interference)".to_owned()
        }
    );
    for g in &f.gpus {
        if let Some(Excluded::Memory {
            needed_bytes,
            capacity_bytes,
        }) = &g.excluded
        {
            let _ = writeln!(
                out,
                "  GPU {}: none: beside the plan it needs {} of {}",
                g.rank,
                gib(*needed_bytes as f64),
                gib(*capacity_bytes as f64)
            );
        }
    }
    let _ = writeln!(
        out,
        "  cluster: {:.1} samples/s (plan {:.1} + background {:.1}); the GPUs split between the jobs:",
        b.cluster_samples_per_second,
        b.foreground_samples_per_second,
        f.samples_per_second
    );
    for p in &b.partitions {
        let _ = writeln!(
            out,
            "    {} plan + {} background  {:>9.1} samples/s  (plan {:.1}, background {:.1}){}",
            p.foreground_gpus,
            p.background_gpus,
            p.cluster_samples_per_second,
            p.foreground_samples_per_second,
            p.background_samples_per_second,
            if p.cluster_samples_per_second > b.cluster_samples_per_second {
                "  more than beside the plan"
            } else {
                ""
            }
        );
    }
    out
}

fn summary_3d(r: &PlanReport, p: &ralpc::ParallelismRow) -> String {
    let mut out = String::new();
    let m = &p.transformer;
    let secs = duration;
    let kv_heads = if m.kv_heads == m.heads {
        String::new()
    } else {
        format!(" ({} key/value)", m.kv_heads)
    };
    let attention = if m.latent.is_some() {
        ", latent attention"
    } else {
        ""
    };
    let gated = if m.gated_mlp { "SwiGLU " } else { "" };
    // A mixture of experts: the dense MLP in its leading blocks, experts in the rest.
    let (mlp, active) = match m.moe {
        None => (format!("{gated}MLP {}", m.ffn), String::new()),
        Some(moe) => {
            let spec = m.spec();
            let (dense, sparse) = spec.block_counts();
            let leading = match dense {
                0 => String::new(),
                n => format!("{gated}MLP {} in the first {n}, ", m.ffn),
            };
            let shared = match moe.shared_ffn {
                0 => String::new(),
                f => format!(", shared {f}"),
            };
            (
                format!(
                    "{leading}{} {gated}experts of {} (top {}{shared}) in {sparse}",
                    moe.experts, moe.expert_ffn, moe.top_k
                ),
                format!(", {} active", count(spec.active_params())),
            )
        }
    };
    let _ = writeln!(
        out,
        "model: {}  (GPT: {} layers, hidden {}, {} heads{kv_heads}{attention}, {mlp}, sequence \
         {}, vocabulary {}; {} parameters{active})",
        r.model,
        m.layers,
        m.hidden,
        m.heads,
        m.sequence,
        m.vocabulary,
        count(m.params)
    );
    let capacity = |e: &ralpc::passes::transformer::ExpertOptions| match e.capacity_factor {
        None => String::new(),
        Some(c) if e.pad_to_capacity => format!(", padded to capacity {c}"),
        Some(c) => format!(", capacity {c} (tokens beyond it dropped)"),
    };
    let experts = match (&p.experts, p.expert_tensor_parallel) {
        (None, _) => String::new(),
        (Some(e), 1) => format!(
            "; experts over {} ranks, {} dispatch, load imbalance {}{}",
            p.expert_parallel,
            e.dispatcher.name(),
            e.imbalance,
            capacity(e)
        ),
        (Some(e), etp) => format!(
            "; experts over {} ranks, each split over {etp}, {} dispatch, load imbalance {}{}",
            p.expert_parallel,
            e.dispatcher.name(),
            e.imbalance,
            capacity(e)
        ),
    };
    let _ = writeln!(
        out,
        "plan: 3d — tensor {}{} × pipeline {} × data {} on {} GPUs of {} (batch {}{experts})",
        p.tensor_parallel,
        if p.context_parallel > 1 {
            format!(
                " × context {} ({})",
                p.context_parallel,
                p.cp_comm_type.unwrap_or("p2p")
            )
        } else {
            String::new()
        },
        p.pipeline_parallel,
        p.data_parallel,
        r.gpus_used,
        r.cluster,
        r.batch
    );
    let _ = writeln!(
        out,
        "      micro-batch {} ({} microbatches), {}{}, recompute {}, sequence parallel {}, ZeRO {}; \
         {}, {} attention",
        p.micro_batch_size,
        r.microbatches,
        r.schedule,
        match (p.virtual_stages > 1, p.ends_as_blocks) {
            (true, false) => format!(" with {} chunks per GPU", p.virtual_stages),
            (true, true) => format!(
                " with {} chunks per GPU, the embedding and the loss a block each",
                p.virtual_stages
            ),
            (false, true) => " with the embedding and the loss a block each".to_owned(),
            (false, false) => String::new(),
        },
        match (p.recompute_modules.as_slice(), p.recompute_num_layers) {
            ([], Some(1)) => format!("{} (the first block of each chunk)", p.recompute),
            ([], Some(n)) => format!("{} (the first {n} blocks of each chunk)", p.recompute),
            ([], None) => p.recompute.to_owned(),
            (modules, _) => format!("{} ({})", p.recompute, modules.join(", ")),
        },
        if p.sequence_parallel { "on" } else { "off" },
        match p.dp_replicate {
            1 => p.zero.to_string(),
            r => format!(
                "{} sharded over {} ranks, {r} copies",
                p.zero,
                p.data_parallel * p.context_parallel.max(1) / r
            ),
        },
        p.precision.name(),
        p.attention.name()
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
        "time: compute {}, tensor-parallel {}{}, context-parallel {}{}, pipeline sends {}, \
         bubble {}, gradient sync {} ({} more hidden behind compute), optimizer {}",
        secs(t.compute_us),
        secs(t.tensor_comm_us),
        if p.tp_comm_overlap {
            " (overlapped with GEMMs)"
        } else {
            ""
        },
        secs(t.context_comm_us),
        match p.experts {
            Some(_) => format!(
                ", expert dispatch {}, host stalls at its syncs {}",
                secs(t.expert_comm_us),
                secs(t.host_stall_us)
            ),
            None => String::new(),
        },
        secs(t.pipeline_comm_us),
        match t.offload_us {
            0.0 => secs(t.bubble_us),
            us => format!("{}, host copies {}", secs(t.bubble_us), secs(us)),
        },
        secs(t.data_comm_us),
        secs(t.overlapped_data_comm_us),
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
    if let Some(o) = &p.offload {
        let _ = writeln!(
            out,
            "offloaded to host memory: activations of {} blocks, {:.0} % of the optimizer \
             state: {} per GPU of its {} share\n",
            o.activation_layers,
            o.optimizer_fraction * 100.0,
            gib(o.host_memory_bytes),
            gib(o.host_capacity_bytes)
        );
    }
    write_stages(&mut out, r);
    if !p.measured.is_empty() {
        let _ = writeln!(
            out,
            "\npriced from --profile's measurements: the blocks' {} products; the rest \
             analytically",
            p.measured.join(", ")
        );
    }
    if let (Some(layered), Some(gap)) = (p.layered_iteration_time_us, p.layered_gap) {
        // Both prices of one configuration: their difference is the models', not the plan's.
        let _ = writeln!(
            out,
            "\npriced layer by layer on the model's own layers: {} per iteration ({:+.1} % \
             against the closed form above)",
            secs(layered),
            gap * 100.0
        );
    }
    if let Some(sim) = &r.simulated {
        // The executable plan runs the model's own layers, priced layer by layer.
        let peak = sim.peak_memory_bytes.iter().copied().max().unwrap_or(0) as f64;
        let over = if peak > r.memory_capacity_bytes {
            " (above the GPU's: the layer-by-layer count keeps more activations)"
        } else {
            ""
        };
        // Context parallelism is lowered in its all-gather form whatever form was priced.
        let lowered = match p.cp_comm_type {
            Some(form) if form != "all_gather" => format!(
                "; its context parallelism lowered in the all_gather form (the price above \
                 is the {form} form's)"
            ),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "\nexecutable plan: these stages on the model's own layers, simulated {} per \
             iteration and {} per GPU{over} under the layer-by-layer costs{lowered}",
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

fn summary(r: &PlanReport, simulation: Option<&ralpc::codegen::Simulation>) -> String {
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
    for std::ops::Range { start, end } in ralpc::runs_placed_alike(&r.layers) {
        let (l, run) = (&r.layers[start], &r.layers[start..end]);
        let compute: f64 = run.iter().map(|m| m.forward_us + m.backward_us).sum();
        let names = if run.len() == 1 {
            l.label().to_owned()
        } else {
            format!("{} .. {}", l.label(), run[run.len() - 1].label())
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
            l.split.to_string(),
            l.stage,
            ms(compute)
        );
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
