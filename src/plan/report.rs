//! `report.html` of a plan, and the simulator's facts the terminal summary shares with it.

use super::{ms, Executable, PlacedLayer, PlanReport};

/// Rows of the report's placement table and per-layer chart at most: past it, consecutive
/// layers share a row ([`super::layer_rows`]), so that a 100,000-layer graph's report is
/// as long as a ResNet's.
pub const REPORT_LAYER_ROWS: usize = 256;

/// What the simulator adds to the prediction, as (label, value) lines for the terminal
/// summary and the report: GPU time, idle windows, traffic per link class, peak memory
/// from the instruction order.
pub fn simulated_facts(sim: &ralpc_codegen::Simulation) -> Vec<(String, String)> {
    let idle: f64 = sim.ranks.iter().map(|r| r.idle_us).sum::<f64>().max(0.0);
    let windows: Vec<&ralpc_codegen::IdleWindow> =
        sim.ranks.iter().flat_map(|r| &r.idle_windows).collect();
    // (An empty f64 sum is −0.)
    let in_windows: f64 = windows.iter().map(|w| w.end_us - w.start_us).sum::<f64>() + 0.0;
    let peak = sim
        .ranks
        .iter()
        .map(|r| r.peak_memory_bytes)
        .max()
        .unwrap_or(0);
    let traffic = if sim.bytes_by_link.is_empty() {
        "none".to_owned()
    } else {
        sim.bytes_by_link
            .iter()
            .map(|(class, bytes)| format!("{} {:.1} MiB", class.name(), *bytes as f64 / 1048576.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        (
            "simulated GPU time".into(),
            format!(
                "{} busy ({:.2}× the single-GPU time)",
                ms(sim.gpu_time_us),
                sim.gpu_sec_amplification
            ),
        ),
        (
            "idle GPU time".into(),
            format!(
                "{} in total, {} in {} windows of ≥ {:.0} µs (room for a background job)",
                ms(idle),
                ms(in_windows),
                windows.len(),
                ralpc_codegen::MIN_IDLE_WINDOW_US
            ),
        ),
        ("bytes moved per iteration".into(), traffic),
        (
            "peak memory, instruction order".into(),
            format!(
                "{:.2} GiB on the fullest GPU",
                peak as f64 / (1u64 << 30) as f64
            ),
        ),
    ]
}

/// The self-contained HTML report of a plan: summary, placement table, simulated timeline
/// and the placed graph (`graph_svg`, or the DOT source without Graphviz).
pub fn report_html(report: &PlanReport, exe: &Executable, graph_svg: Option<String>) -> String {
    let simulated = exe.simulation.iteration_time_us;
    let mut summary = vec![
        ("model".into(), report.model.clone()),
        (
            "cluster".into(),
            format!(
                "{} ({} GPUs used of {})",
                report.cluster, report.gpus_used, report.gpus
            ),
        ),
        ("global batch".into(), report.batch.to_string()),
        (
            "plan".into(),
            format!(
                "{}, {} stage(s), {} microbatch(es), {}",
                report.strategy,
                report.stages.len(),
                report.microbatches,
                report.schedule
            ),
        ),
        ("predicted iteration".into(), ms(report.iteration_time_us)),
        (
            "simulated iteration".into(),
            format!(
                "{} ({:+.1}%)",
                ms(simulated),
                (simulated / report.iteration_time_us - 1.0) * 100.0
            ),
        ),
        (
            "data parallel".into(),
            format!(
                "{} (this plan is {:.2}× faster)",
                ms(report.dp_iteration_time_us),
                report.speedup_over_dp
            ),
        ),
        (
            "one GPU".into(),
            format!(
                "{} (this plan is {:.2}× faster)",
                ms(report.single_gpu_time_us),
                report.single_gpu_time_us / report.iteration_time_us
            ),
        ),
        (
            "GPU-sec amplification".into(),
            format!("{:.2}", report.gpu_sec_amplification),
        ),
        (
            "peak memory per GPU".into(),
            format!("{:.2} GiB", report.peak_memory_bytes / (1u64 << 30) as f64),
        ),
        (
            "lower bound".into(),
            format!(
                "{} (the plan takes {:.2}× it)",
                ms(report.lower_bound_us),
                report.iteration_time_us / report.lower_bound_us.max(1e-9)
            ),
        ),
    ];
    summary.extend(simulated_facts(&exe.simulation));
    use ralpc_codegen::report::{LayerTime, ReportInput, Table};
    let families = Table {
        columns: [
            "family",
            "iteration",
            "GPU-sec amplification",
            "GPUs used",
            "peak memory",
            "fits",
        ]
        .map(String::from)
        .to_vec(),
        rows: report
            .candidates
            .iter()
            .map(|c| {
                vec![
                    c.strategy.to_owned(),
                    ms(c.iteration_time_us),
                    format!("{:.2}", c.gpu_sec_amplification),
                    c.gpus_used.to_string(),
                    format!("{:.2} GiB", c.peak_memory_bytes / (1u64 << 30) as f64),
                    if c.fits { "yes" } else { "no" }.to_owned(),
                ]
            })
            .collect(),
    };
    // A reader takes in a few hundred rows: past that, layers placed alike are one row.
    let rows = super::layer_rows(&report.layers, REPORT_LAYER_ROWS);
    let placement = Table {
        columns: [
            "layer", "module", "op", "GPUs", "s×a×p", "stage", "compute", "sync", "transfer",
        ]
        .map(String::from)
        .to_vec(),
        rows: rows
            .iter()
            .map(|r| placement_row(&report.layers, r.clone()))
            .collect(),
    };
    // The planner prices passes per microbatch and synchronization per iteration.
    let m = f64::from(report.microbatches.max(1));
    let layers = rows
        .iter()
        .map(|r| {
            let group = &report.layers[r.clone()];
            let sum = |f: fn(&PlacedLayer) -> f64| group.iter().map(f).sum::<f64>();
            LayerTime {
                label: spanned(group, PlacedLayer::label),
                forward_us: sum(|l| l.forward_us) * m,
                backward_us: sum(|l| l.backward_us) * m,
                sync_us: sum(|l| l.sync_us),
                transfer_us: sum(|l| l.transfer_us) * m,
            }
        })
        .collect();
    let input = ReportInput {
        title: format!("ralpc plan: {} on {}", report.model, report.cluster),
        summary,
        warnings: report.warnings.clone(),
        families,
        placement,
        layers,
        memory_capacity_bytes: report.memory_capacity_bytes.round() as u64,
        graph_svg,
        graph_dot: exe.dot.clone(),
    };
    ralpc_codegen::report::report(&input, &exe.plan, &exe.ran)
}

/// `what` of the first and last of `group`, "first .. last (N layers)" when several.
fn spanned(group: &[PlacedLayer], what: fn(&PlacedLayer) -> &str) -> String {
    match group {
        [] => String::new(),
        [one] => what(one).to_owned(),
        [first, .., last] if what(first).is_empty() && what(last).is_empty() => String::new(),
        [first, .., last] => format!("{} .. {} ({} layers)", what(first), what(last), group.len()),
    }
}

/// The placement table's row of the consecutive `layers[range]`: what they share, or the
/// range of what they do not, and their summed times.
fn placement_row(layers: &[PlacedLayer], range: std::ops::Range<usize>) -> Vec<String> {
    let group = &layers[range.clone()];
    let Some(first) = group.first() else {
        return Vec::new();
    };
    let shared = |f: &dyn Fn(&PlacedLayer) -> String| {
        let value = f(first);
        if group.iter().all(|l| f(l) == value) {
            value
        } else {
            "varies".to_owned()
        }
    };
    let sum = |f: fn(&PlacedLayer) -> f64| group.iter().map(f).sum::<f64>();
    vec![
        spanned(group, |l| &l.name),
        spanned(group, |l| &l.module),
        shared(&|l| l.op.clone()),
        shared(&|l| l.gpus.to_string()),
        shared(&|l| l.split.to_string()),
        shared(&|l| l.stage.to_string()),
        ms(sum(|l| l.forward_us + l.backward_us)),
        ms(sum(|l| l.sync_us)),
        ms(sum(|l| l.transfer_us)),
    ]
}
