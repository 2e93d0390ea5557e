//! What a user should know before trusting a plan: slower than data parallelism, or
//! options that fixed part of it at a cost.

use ralpc_passes::plan::Family;
use ralpc_passes::transformer::{Knobs, Recompute};

use super::{ms, plan_as_asked, PlanOptions, PlanReport};

/// The options that fix part of the plan instead of leaving it to the search, as given.
fn fixed_options(options: &PlanOptions) -> Vec<String> {
    let mut fixed = Vec::new();
    if let Some(path) = &options.strategy_file {
        fixed.push(format!("--strategy-file {}", path.display()));
    }
    if let Some(family) = options.family.filter(|f| *f != Family::Auto) {
        fixed.push(format!("--strategy {}", family.name()));
    }
    if let Some(m) = options.microbatches {
        fixed.push(format!("--microbatches {m}"));
    }
    if let Some(s) = options.schedule {
        fixed.push(format!("--schedule {}", s.name()));
    }
    let k = &options.knobs;
    let given = |flag: &str, v: Option<String>| v.map(|v| format!("{flag} {v}"));
    fixed.extend(
        [
            given("--tensor-parallel", k.tensor.map(|v| v.to_string())),
            given("--pipeline-parallel", k.pipeline.map(|v| v.to_string())),
            given("--context-parallel", k.context.map(|v| v.to_string())),
            given("--virtual-stages", k.virtual_stages.map(|v| v.to_string())),
            given("--micro-batch-size", k.micro_batch.map(|v| v.to_string())),
            k.recompute.map(recompute_option),
            given(
                "--sequence-parallel",
                k.sequence_parallel.map(|v| v.to_string()),
            ),
            given("--zero", k.zero.map(|v| v.to_string())),
        ]
        .into_iter()
        .flatten(),
    );
    fixed
}

/// The option that gave `recompute`, with its value.
fn recompute_option(recompute: Recompute) -> String {
    match recompute {
        Recompute::Modules(m) => format!("--recompute-modules {}", m.names().join(",")),
        Recompute::Blocks(n) => format!("--recompute-num-layers {n}"),
        r => format!("--recompute {}", r.name()),
    }
}

/// What a user should know before trusting `report`: a plan slower than data parallelism
/// (when that fits), and what the fixed options cost against planning without them.
pub(super) fn warnings(report: &PlanReport, options: &PlanOptions) -> Vec<String> {
    let mut warnings = Vec::new();
    let dp = report.candidates.iter().find(|c| c.strategy == "dp");
    let dp_fits = dp.is_none_or(|c| c.fits);
    if dp_fits && report.speedup_over_dp < 0.995 {
        // The GPU-time budget is the usual reason: say so, and how to lift it.
        let why = match (dp, options.tolerance) {
            (Some(dp), Some(tolerance)) if dp.gpu_sec_amplification > 1.0 + tolerance + 1e-9 => {
                format!(
                    ": its GPU time is {:.2}× one GPU's, above the budget of {:.2}× \
                     (--tolerance {tolerance}), so ralpc chose this plan on {} of the {} GPUs \
                     (--tolerance inf plans without a budget)",
                    dp.gpu_sec_amplification,
                    1.0 + tolerance,
                    report.gpus_used,
                    report.gpus
                )
            }
            _ => String::new(),
        };
        warnings.push(format!(
            "this plan is {:.2}× slower than data parallelism on every GPU ({} against {}){why}",
            1.0 / report.speedup_over_dp.max(1e-9),
            ms(report.iteration_time_us),
            ms(report.dp_iteration_time_us)
        ));
    }
    let fixed = fixed_options(options);
    if fixed.is_empty() {
        return warnings;
    }
    let free = PlanOptions {
        family: None,
        microbatches: None,
        schedule: None,
        strategy_file: None,
        knobs: Knobs::default(),
        executable: false,
        ..options.clone()
    };
    // Planning without them may fail (nothing else fits the budget): then nothing to say.
    if let Ok(own) = plan_as_asked(&free) {
        let (this, best) = (report.iteration_time_us, own.report.iteration_time_us);
        if best < this * 0.995 {
            warnings.push(format!(
                "{} {} the iteration {:.1}% longer: without {} ralpc plans {} in {} (this plan: {})",
                fixed.join(", "),
                if fixed.len() == 1 { "makes" } else { "make" },
                (this / best - 1.0) * 100.0,
                if fixed.len() == 1 { "it" } else { "them" },
                own.report.strategy,
                ms(best),
                ms(this)
            ));
        }
    }
    warnings
}
