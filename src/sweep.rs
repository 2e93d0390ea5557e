//! `ralpc sweep`: the best plan for every GPU type and count, the throughput matrix a
//! heterogeneity-aware scheduler (Gavel) needs and the scaling curve a user wants before
//! asking for GPUs.

use std::fmt::Write;

use rayon::prelude::*;
use serde::Serialize;

use ralpc_codegen::report::html;

use crate::plan::{plan, PlanOptions};
use crate::{ClusterOptions, Error};

pub mod gavel;

/// What to sweep.
#[derive(Clone, Debug, Default)]
pub struct SweepOptions {
    /// Everything but the cluster and the GPU count (the model, batch, strategy, …).
    pub base: PlanOptions,
    /// GPU counts.
    pub gpus: Vec<u32>,
    /// GPU types (`a100`, `h100`, `v100`) or cluster presets or TOML files; each grows to
    /// the GPU count.
    pub gpu_types: Vec<String>,
    /// Samples per GPU (weak scaling: each point's batch is this times its GPUs) in place
    /// of the base options' batch.
    pub per_gpu_batch: Option<u64>,
}

/// One point of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SweepRow {
    /// The GPU type as given.
    pub gpu_type: String,
    /// The cluster planned on.
    pub cluster: String,
    /// GPUs asked for.
    pub gpus: u32,
    /// GPUs the plan uses (a small model may leave some idle); 0 when nothing fits.
    pub gpus_used: u32,
    /// The winning family (`dp`, `burst`, `soap`, `pipeline`); empty when nothing fits.
    pub strategy: String,
    /// Predicted iteration time, µs (0 when nothing fits).
    pub iteration_time_us: f64,
    /// Samples per second.
    pub samples_per_second: f64,
    /// Samples per second over one GPU of this type's (its planned iteration, optimizer
    /// step included, at the one-GPU batch; or its compute alone at this batch where the
    /// model does not fit one GPU).
    pub speedup: f64,
    /// Speedup per GPU used.
    pub efficiency: f64,
    /// GPU-sec amplification.
    pub gpu_sec_amplification: f64,
    /// The fullest GPU's memory, bytes.
    #[serde(serialize_with = "ralpc_passes::units::whole_bytes")]
    #[schemars(with = "u64")]
    pub peak_memory_bytes: f64,
    /// The global batch planned, samples (0 when nothing fits).
    pub batch: u64,
    /// Why there is no plan (memory, budget), when there is none.
    pub error: Option<String>,
}

impl SweepRow {
    /// The figures of a planned point as display cells: GPUs used, strategy, iteration,
    /// samples/s, speedup, efficiency, amplification, peak memory.
    pub fn cells(&self) -> [String; 8] {
        [
            self.gpus_used.to_string(),
            self.strategy.clone(),
            format!("{:.3} ms", self.iteration_time_us / 1e3),
            format!("{:.1}", self.samples_per_second),
            format!("{:.2}×", self.speedup),
            format!("{:.0}%", self.efficiency * 100.0),
            format!("{:.2}", self.gpu_sec_amplification),
            format!("{:.2} GiB", self.peak_memory_bytes / (1u64 << 30) as f64),
        ]
    }
}

/// The cluster preset of a GPU type's name.
pub fn cluster_of_gpu_type(name: &str) -> String {
    match name.to_ascii_lowercase().as_str() {
        "a100" => "dgx-a100".into(),
        "h100" => "dgx-h100".into(),
        "h200" => "dgx-h200".into(),
        "b200" => "dgx-b200".into(),
        "gb200" => "gb200-nvl72".into(),
        "gb300" => "gb300-nvl72".into(),
        "v100" => "p3dn-v100".into(),
        _ => name.into(),
    }
}

/// Plans every (GPU type, count) point, in parallel; `tick` is called as each finishes.
/// Points where no plan fits keep their reason in [`SweepRow::error`].
///
/// # Errors
/// Anything wrong with the inputs themselves (model, profile, cluster name).
pub fn sweep(options: &SweepOptions, tick: &(dyn Fn() + Sync)) -> Result<Vec<SweepRow>, Error> {
    let points: Vec<(&String, u32)> = options
        .gpu_types
        .iter()
        .flat_map(|t| options.gpus.iter().map(move |&g| (t, g)))
        .collect();
    // Each type's one-GPU samples per second, the speedups' baseline.
    let baselines: Vec<Option<f64>> = options
        .gpu_types
        .par_iter()
        .map(|t| {
            let one = point_options(options, t, 1)?;
            Ok(plan(&one)
                .ok()
                .map(|o| o.report.batch as f64 / (o.report.iteration_time_us * 1e-6).max(1e-12)))
        })
        .collect::<Result<_, Error>>()?;
    points
        .par_iter()
        .map(|&(gpu_type, gpus)| {
            let at = options.gpu_types.iter().position(|t| t == gpu_type);
            let baseline = at.and_then(|i| baselines[i]);
            let options = point_options(options, gpu_type, gpus)?;
            let row = row(gpu_type, gpus, &options, baseline);
            tick();
            row
        })
        .collect()
}

/// The plan options of one point: the type's cluster, with as many nodes as the count
/// needs.
fn point_options(options: &SweepOptions, gpu_type: &str, gpus: u32) -> Result<PlanOptions, Error> {
    let spec = Some(cluster_of_gpu_type(gpu_type));
    let base = crate::cluster(&ClusterOptions {
        spec: spec.clone(),
        ..ClusterOptions::default()
    })?;
    let nodes = gpus.div_ceil(base.gpu_count().max(1));
    // A limit above this type's memory is that memory (plan() refuses one above).
    let own = (0..base.gpu_count())
        .map(|r| base.gpu(r).memory_bytes)
        .min();
    let memory_limit = match (options.base.memory_limit, own) {
        (Some(limit), Some(own)) => Some(limit.min(own)),
        (limit, _) => limit,
    };
    Ok(PlanOptions {
        gpus: Some(gpus),
        batch: options
            .per_gpu_batch
            .map(|b| b.saturating_mul(u64::from(gpus)))
            .or(options.base.batch),
        memory_limit,
        cluster: ClusterOptions {
            spec,
            nodes: (nodes > 1).then_some(nodes),
            ..options.base.cluster.clone()
        },
        executable: false,
        ..options.base.clone()
    })
}

/// One point; `baseline`: the type's one-GPU samples per second, when the model fits one
/// GPU.
fn row(
    gpu_type: &str,
    gpus: u32,
    options: &PlanOptions,
    baseline: Option<f64>,
) -> Result<SweepRow, Error> {
    let mut row = SweepRow {
        gpu_type: gpu_type.into(),
        cluster: cluster_of_gpu_type(gpu_type),
        gpus,
        gpus_used: 0,
        strategy: String::new(),
        iteration_time_us: 0.0,
        samples_per_second: 0.0,
        speedup: 0.0,
        efficiency: 0.0,
        gpu_sec_amplification: 0.0,
        peak_memory_bytes: 0.0,
        batch: 0,
        error: None,
    };
    match plan(options) {
        Ok(output) => {
            let r = output.report;
            let rate = r.batch as f64 / (r.iteration_time_us * 1e-6).max(1e-12);
            let one_gpu =
                baseline.unwrap_or(r.batch as f64 / (r.single_gpu_time_us * 1e-6).max(1e-12));
            let speedup = rate / one_gpu.max(1e-12);
            row.cluster = r.cluster;
            row.strategy = r.strategy.into();
            row.iteration_time_us = r.iteration_time_us;
            row.samples_per_second = rate;
            row.speedup = speedup;
            row.gpus_used = r.gpus_used;
            row.efficiency = speedup / f64::from(r.gpus_used.max(1));
            row.gpu_sec_amplification = r.gpu_sec_amplification;
            row.peak_memory_bytes = r.peak_memory_bytes;
            row.batch = r.batch;
        }
        // No plan at this point (memory, budget, a batch too small): a fact of the sweep.
        Err(Error::Plan(e)) => row.error = Some(e.to_string()),
        Err(e) => return Err(e),
    }
    Ok(row)
}

/// The rows as CSV (a header, then one line per point).
pub fn to_csv(rows: &[SweepRow]) -> String {
    let mut out = String::from(
        "gpu_type,cluster,gpus,gpus_used,strategy,iteration_time_us,samples_per_second,\
         speedup,efficiency,gpu_sec_amplification,peak_memory_bytes,error\n",
    );
    for r in rows {
        let error = r.error.as_deref().unwrap_or("").replace('"', "'");
        let _ = writeln!(
            out,
            "{},{},{},{},{},{:.3},{:.3},{:.4},{:.4},{:.4},{:.0},\"{error}\"",
            r.gpu_type,
            r.cluster,
            r.gpus,
            r.gpus_used,
            r.strategy,
            r.iteration_time_us,
            r.samples_per_second,
            r.speedup,
            r.efficiency,
            r.gpu_sec_amplification,
            r.peak_memory_bytes
        );
    }
    out
}

/// A self-contained HTML page: the scaling curves (samples/s against GPUs, one line per
/// GPU type, log-scaled GPU axis) and the table.
pub fn report_html(model: &str, rows: &[SweepRow]) -> String {
    const COLOURS: [&str; 6] = [
        "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1",
    ];
    let (left, top, width, height) = (70.0, 20.0, 640.0, 320.0);
    let ok: Vec<&SweepRow> = rows.iter().filter(|r| r.error.is_none()).collect();
    let max_gpus = ok.iter().map(|r| r.gpus).max().unwrap_or(1).max(2);
    // Ideal scaling of each GPU type: linear in GPUs from its point with the fewest.
    let ideal = |r: &SweepRow| {
        ok.iter()
            .filter(|b| b.gpu_type == r.gpu_type)
            .min_by_key(|b| b.gpus)
            .map_or(0.0, |b| {
                b.samples_per_second * f64::from(r.gpus) / f64::from(b.gpus)
            })
    };
    let max_rate = ok
        .iter()
        .map(|r| r.samples_per_second.max(ideal(r)))
        .fold(0.0, f64::max)
        .max(1e-9);
    let x = |g: u32| left + width * f64::from(g).log2() / f64::from(max_gpus).log2();
    let y = |rate: f64| top + height * (1.0 - rate / max_rate);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n",
        left + width + 150.0,
        top + height + 50.0
    );
    let _ = writeln!(
        svg,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"#333\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">GPUs (log scale)</text>\
         <text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">samples/s</text>",
        top + height,
        left + width,
        top + height,
        top + height,
        left + width / 2.0,
        top + height + 40.0,
        top + height / 2.0,
        top + height / 2.0
    );
    let mut counts: Vec<u32> = ok.iter().map(|r| r.gpus).collect();
    counts.sort_unstable();
    counts.dedup();
    for g in counts {
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{g}</text>",
            x(g),
            top + height + 16.0
        );
    }
    for k in 0..=4 {
        let rate = max_rate * f64::from(k) / 4.0;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{rate:.0}</text>\
             <line x1=\"{left}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#eee\"/>",
            left - 4.0,
            y(rate) + 4.0,
            y(rate),
            left + width,
            y(rate)
        );
    }
    let mut types: Vec<&str> = rows.iter().map(|r| r.gpu_type.as_str()).collect();
    types.dedup();
    for (i, t) in types.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let of_type: Vec<&&SweepRow> = ok.iter().filter(|r| r.gpu_type == *t).collect();
        let line = |rate: &dyn Fn(&SweepRow) -> f64| {
            of_type
                .iter()
                .map(|r| format!("{:.1},{:.1}", x(r.gpus), y(rate(r))))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\
             <polyline fill=\"none\" stroke=\"{colour}\" stroke-dasharray=\"5 4\" points=\"{}\">\
             <title>{}: ideal scaling</title></polyline>\
             <text x=\"{}\" y=\"{}\" fill=\"{colour}\">{}</text>",
            line(&|r| r.samples_per_second),
            line(&ideal),
            html(t),
            left + width + 10.0,
            top + 14.0 * (i as f64 + 1.0),
            html(t)
        );
        for r in &of_type {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"><title>{} × {}: \
                 {:.0} samples/s, {:.2}× one GPU, {} ({} GPUs used)</title></circle>",
                x(r.gpus),
                y(r.samples_per_second),
                html(t),
                r.gpus,
                r.samples_per_second,
                r.speedup,
                html(&r.strategy),
                r.gpus_used
            );
        }
    }
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" fill=\"#555\">dashed: ideal</text>",
        left + width + 10.0,
        top + 14.0 * (types.len() as f64 + 1.5)
    );
    svg.push_str("</svg>\n");
    let mut table = String::from(
        "<table><tr><th>GPU type</th><th>GPUs</th><th>used</th><th>strategy</th><th>iteration</th>\
         <th>samples/s</th><th>speedup</th><th>efficiency</th><th>amplification</th>\
         <th>peak memory</th></tr>\n",
    );
    for r in rows {
        let _ = match &r.error {
            Some(e) => writeln!(
                table,
                "<tr><td>{}</td><td>{}</td><td colspan=\"8\">no plan: {}</td></tr>",
                html(&r.gpu_type),
                r.gpus,
                html(e)
            ),
            None => writeln!(
                table,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                html(&r.gpu_type),
                r.gpus,
                r.cells().map(|c| html(&c)).join("</td><td>")
            ),
        };
    }
    table.push_str("</table>\n");
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ralpc sweep: {m}</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}</style></head>\n\
         <body><h1>Scaling of {m}</h1>\n{svg}{table}</body></html>\n",
        m = html(model)
    )
}
