//! `report.html`: one self-contained page (no network fetches, no scripts) that answers
//! "where does the time go": the plan's summary and warnings, the families compared, per
//! GPU the time in compute, exposed communication and idle, per layer its compute and
//! communication, per GPU its memory by kind against capacity, a Gantt chart of the
//! simulated iteration, the placement table and the placed graph. Every bar has a tooltip
//! (`<title>`) naming what it is.

use std::fmt::Write;

use crate::plan::{BufferKind, Instruction, Plan};
use crate::viz::{label, Ran};

/// Ranks drawn in the per-GPU charts at most (the rest are summarized in a line).
pub const GANTT_RANKS: u32 = 64;

/// A table: headers and rows of cells (first two columns left-aligned, the rest right).
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// Column headers.
    pub columns: Vec<String>,
    /// Rows.
    pub rows: Vec<Vec<String>>,
}

/// Where one layer's time goes, as the planner prices it per iteration.
#[derive(Clone, Debug, Default)]
pub struct LayerTime {
    /// What the user calls it (its module, else its name).
    pub label: String,
    /// Forward compute, µs.
    pub forward_us: f64,
    /// Backward compute, µs.
    pub backward_us: f64,
    /// Gradient synchronization, µs.
    pub sync_us: f64,
    /// Moving its inputs, µs.
    pub transfer_us: f64,
}

/// What the report shows besides the plan and its timeline.
#[derive(Clone, Debug, Default)]
pub struct ReportInput {
    /// Page title (the model and the cluster).
    pub title: String,
    /// Summary rows: (what, value).
    pub summary: Vec<(String, String)>,
    /// Plain warnings (slower than data parallelism, options that cost time).
    pub warnings: Vec<String>,
    /// Each family's best plan.
    pub families: Table,
    /// The placement table.
    pub placement: Table,
    /// Per layer, where its time goes.
    pub layers: Vec<LayerTime>,
    /// What one GPU may hold, bytes.
    pub memory_capacity_bytes: u64,
    /// The placed graph as SVG (Graphviz's output), when rendered.
    pub graph_svg: Option<String>,
    /// The placed graph as DOT (shown when there is no SVG).
    pub graph_dot: String,
}

/// `text` escaped for HTML text and attribute values.
pub fn html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Colour and legend entry of each kind of instruction, in legend order.
const INSTRUCTION_STYLES: [(&str, &str); 8] = [
    ("#4e79a7", "forward"),
    ("#9c755f", "recompute"),
    ("#f28e2b", "backward"),
    ("#59a14f", "optimizer step"),
    ("#b07aa1", "transfer"),
    ("#e15759", "all-reduce"),
    (
        "#76b7b2",
        "resharding collective (all-gather, reduce-scatter, all-to-all)",
    ),
    ("#edc948", "weight-gradient pass (zero-bubble)"),
];

/// Colour of an instruction's kind (an entry of [`INSTRUCTION_STYLES`]).
fn colour(i: &Instruction) -> &'static str {
    let k = match i {
        Instruction::Forward { .. } => 0,
        Instruction::Recompute { .. } => 1,
        Instruction::Backward { .. } => 2,
        Instruction::Step { .. } => 3,
        Instruction::Send { .. } | Instruction::Recv { .. } => 4,
        Instruction::AllReduce { .. } => 5,
        Instruction::AllGather { .. }
        | Instruction::ReduceScatter { .. }
        | Instruction::AllToAll { .. } => 6,
        Instruction::WeightGradient { .. } => 7,
    };
    INSTRUCTION_STYLES[k].0
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1e3)
}

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

/// A legend: a coloured square before each entry.
fn legend(entries: &[(&str, &str)]) -> String {
    let mut out = String::from("<p class=\"legend\">");
    for (colour, what) in entries {
        let _ = write!(
            out,
            "<span style=\"background:{colour}\"></span>{}",
            html(what)
        );
    }
    out.push_str("</p>");
    out
}

fn table(t: &Table) -> String {
    let mut out = String::from("<table><tr>");
    for c in &t.columns {
        let _ = write!(out, "<th>{}</th>", html(c));
    }
    out.push_str("</tr>");
    for row in &t.rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", html(cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>\n");
    out
}

/// One segment of a stacked bar: colour, what it is, its value and the value as text.
struct Segment<'a> {
    colour: &'a str,
    what: &'a str,
    value: f64,
    text: String,
}

/// Horizontal stacked bars, one per row, scaled so that `full` spans the width; an
/// optional marker line at `mark` (a capacity) labelled with its text.
fn stacked_bars(
    rows: &[(String, Vec<Segment<'_>>)],
    full: f64,
    axis: &dyn Fn(f64) -> String,
    mark: Option<(f64, String)>,
) -> String {
    let (left, width, row) = (220.0, 760.0, 14.0);
    let full = full.max(1e-9);
    let height = rows.len() as f64 * row + 34.0;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" role=\"img\">",
        left + width + 60.0
    );
    for (i, (name, segments)) in rows.iter().enumerate() {
        let y = i as f64 * row;
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{}</text>",
            left - 6.0,
            y + row - 4.0,
            html(name)
        );
        let mut x = left;
        for s in segments.iter().filter(|s| s.value > 0.0) {
            let w = s.value / full * width;
            let _ = write!(
                out,
                "<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"{}\">\
                 <title>{}: {}: {}</title></rect>",
                w.max(0.5),
                row - 3.0,
                s.colour,
                html(name),
                html(s.what),
                html(&s.text)
            );
            x += w;
        }
    }
    let base = rows.len() as f64 * row;
    for k in 0..=4 {
        let x = left + width * f64::from(k) / 4.0;
        let _ = write!(
            out,
            "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
            base + 14.0,
            axis(full * f64::from(k) / 4.0)
        );
    }
    if let Some((at, text)) = mark {
        let x = left + (at / full).min(1.0) * width;
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" y1=\"0\" x2=\"{x:.1}\" y2=\"{base:.1}\" stroke=\"#222\" \
             stroke-dasharray=\"4 3\"/><text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"10\" \
             text-anchor=\"middle\">{}</text>",
            base + 28.0,
            html(&text)
        );
    }
    out.push_str("</svg>");
    out
}

/// Total length of the union of `spans` (start, end).
fn covered(mut spans: Vec<(f64, f64)>) -> f64 {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut total, mut open) = (0.0, f64::NEG_INFINITY);
    for (start, end) in spans {
        let start = start.max(open);
        if end > start {
            total += end - start;
            open = end;
        }
    }
    total
}

/// Per GPU: time computing, communicating while not computing (exposed), and idle
/// (pipeline bubbles, waiting) over the simulated iteration.
fn time_per_gpu(plan: &Plan, ran: &[Ran], end: f64) -> String {
    let ranks = plan.ranks.min(GANTT_RANKS);
    let mut compute = vec![Vec::new(); ranks as usize];
    let mut busy = vec![Vec::new(); ranks as usize];
    for r in ran.iter().filter(|r| r.rank < ranks) {
        let Some(instr) = plan.instruction(r.rank, r.index) else {
            continue;
        };
        if instr.is_compute() {
            compute[r.rank as usize].push((r.start_us, r.end_us));
        }
        busy[r.rank as usize].push((r.start_us, r.end_us));
    }
    let rows: Vec<(String, Vec<Segment<'_>>)> = compute
        .into_iter()
        .zip(busy)
        .enumerate()
        .map(|(rank, (compute, busy))| {
            let c = covered(compute);
            let b = covered(busy).max(c);
            let segment = |colour, what, value: f64| Segment {
                colour,
                what,
                value,
                text: format!("{} ({:.0}%)", ms(value), value / end.max(1e-9) * 100.0),
            };
            (
                format!("GPU {rank}"),
                vec![
                    segment("#4e79a7", "compute", c),
                    segment("#e15759", "exposed communication", b - c),
                    segment("#cccccc", "idle (bubble, waiting)", (end - b).max(0.0)),
                ],
            )
        })
        .collect();
    stacked_bars(&rows, end, &|us| ms(us), None)
}

/// Per layer: forward, backward, gradient synchronization and transfers per iteration.
fn time_per_layer(layers: &[LayerTime]) -> String {
    let total = |l: &LayerTime| l.forward_us + l.backward_us + l.sync_us + l.transfer_us;
    let full = layers.iter().map(total).fold(0.0, f64::max);
    let rows: Vec<(String, Vec<Segment<'_>>)> = layers
        .iter()
        .map(|l| {
            let segment = |colour, what, value: f64| Segment {
                colour,
                what,
                value,
                text: ms(value),
            };
            (
                l.label.clone(),
                vec![
                    segment("#4e79a7", "forward", l.forward_us),
                    segment("#f28e2b", "backward", l.backward_us),
                    segment("#e15759", "gradient sync", l.sync_us),
                    segment("#b07aa1", "transfers", l.transfer_us),
                ],
            )
        })
        .collect();
    stacked_bars(&rows, full, &|us| ms(us), None)
}

/// Memory groups drawn, with their colours and the buffer kinds they hold.
const MEMORY_GROUPS: [(&str, &str, &[BufferKind]); 5] = [
    (
        "#4e79a7",
        "weights",
        &[BufferKind::Weights, BufferKind::WeightVersions],
    ),
    ("#f28e2b", "gradients", &[BufferKind::Gradients]),
    ("#59a14f", "optimizer state", &[BufferKind::OptimizerState]),
    (
        "#e15759",
        "activations (kept, recomputed, received, input gradients)",
        &[
            BufferKind::Activation,
            BufferKind::Recomputed,
            BufferKind::Received,
            BufferKind::InputGradient,
        ],
    ),
    ("#bab0ac", "workspace", &[BufferKind::Workspace]),
];

/// Per GPU: its memory at its peak by kind, against what one GPU may hold.
fn memory_per_gpu(plan: &Plan, capacity: u64) -> String {
    let at_peak = plan.memory_at_peak();
    let ranks = (plan.ranks.min(GANTT_RANKS)) as usize;
    let rows: Vec<(String, Vec<Segment<'_>>)> = at_peak
        .iter()
        .take(ranks)
        .enumerate()
        .map(|(rank, by_kind)| {
            let segments = MEMORY_GROUPS
                .iter()
                .map(|(colour, what, kinds)| {
                    let bytes: u64 = kinds.iter().filter_map(|k| by_kind.get(k)).sum();
                    Segment {
                        colour,
                        what,
                        value: bytes as f64,
                        text: gib(bytes as f64),
                    }
                })
                .collect();
            (format!("GPU {rank}"), segments)
        })
        .collect();
    let peak = at_peak
        .iter()
        .map(|m| m.values().sum::<u64>())
        .max()
        .unwrap_or(0);
    let full = peak.max(capacity) as f64;
    let mark = (capacity > 0).then(|| {
        (
            capacity as f64,
            format!("capacity {}", gib(capacity as f64)),
        )
    });
    stacked_bars(&rows, full, &|b| gib(b), mark)
}

/// Narrowest slice of the Gantt chart drawn on its own, px: narrower slices are pooled per
/// pixel column, so that the page stays the size of what a reader can see (a 1F1B pipeline of
/// 512 microbatches on 64 GPUs is millions of slices, hundreds of megabytes drawn one by one).
const GANTT_MIN_SLICE_PX: f64 = 2.0;

/// One drawn rectangle of a Gantt lane: a slice, or neighbouring pixel columns of narrow
/// slices whose busiest kind is the same.
struct Bar {
    from_px: f64,
    to_px: f64,
    colour: &'static str,
    tooltip: String,
}

/// The bars of one lane of the Gantt chart: `slices` are (start px, end px, colour, label)
/// sorted by start, the label given for the slices drawn on their own. Wide slices are drawn as they are; the narrow ones add their width per
/// kind to the pixel columns they cover, each column takes the colour of the kind that
/// filled it most, and a run of columns of one colour is one bar whose tooltip counts its
/// slices. The bars are then at most about twice the chart's width, whatever the plan.
fn lane_bars(
    slices: &[(f64, f64, &'static str, Option<String>)],
    rank: u32,
    us_per_px: f64,
) -> Vec<Bar> {
    let mut bars = Vec::new();
    // Pixel column -> (width per kind, slices counted).
    let mut columns: std::collections::BTreeMap<i64, ([f64; INSTRUCTION_STYLES.len()], u32)> =
        std::collections::BTreeMap::new();
    for (from, to, colour, what) in slices {
        if let (true, Some(what)) = (to - from >= GANTT_MIN_SLICE_PX, what) {
            bars.push(Bar {
                from_px: *from,
                to_px: *to,
                colour,
                tooltip: format!(
                    "GPU {rank}: {what}: {:.3}–{:.3} ms",
                    from * us_per_px / 1e3,
                    to * us_per_px / 1e3
                ),
            });
            continue;
        }
        let kind = INSTRUCTION_STYLES
            .iter()
            .position(|(c, _)| c == colour)
            .unwrap_or(0);
        // Slices are at most 2 px wide, so they touch at most three columns.
        let (mut column, mut first) = (from.floor() as i64, true);
        while (column as f64) < *to || first {
            let covered = (to.min(column as f64 + 1.0) - from.max(column as f64)).max(1e-3);
            let entry = columns.entry(column).or_default();
            entry.0[kind] += covered;
            entry.1 += u32::from(first);
            (column, first) = (column + 1, false);
        }
    }
    let mut open: Option<(i64, i64, usize, u32)> = None;
    let close = |bars: &mut Vec<Bar>, (from, to, kind, count): (i64, i64, usize, u32)| {
        let (colour, what) = INSTRUCTION_STYLES[kind];
        bars.push(Bar {
            from_px: from as f64,
            to_px: to as f64,
            colour,
            tooltip: format!(
                "GPU {rank}: {count} short slices, mostly {what}: {:.3}–{:.3} ms",
                from as f64 * us_per_px / 1e3,
                to as f64 * us_per_px / 1e3
            ),
        });
    };
    for (&column, (widths, count)) in &columns {
        let kind = (0..widths.len())
            .max_by(|&a, &b| widths[a].total_cmp(&widths[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        match &mut open {
            Some((_, to, k, n)) if *to == column && *k == kind => {
                *to += 1;
                *n += count;
            }
            _ => {
                if let Some(bar) = open.take() {
                    close(&mut bars, bar);
                }
                open = Some((column, column + 1, kind, *count));
            }
        }
    }
    if let Some(bar) = open {
        close(&mut bars, bar);
    }
    bars.sort_by(|a, b| a.from_px.total_cmp(&b.from_px));
    bars
}

/// The Gantt chart of `ran`: two rows per rank (compute, communication), time to the
/// right; each slice's tooltip names it (layer and microbatch of a pass), slices narrower
/// than [`GANTT_MIN_SLICE_PX`] pooled ([`lane_bars`]).
fn gantt(plan: &Plan, ran: &[Ran], end: f64) -> String {
    let ranks = plan.ranks.min(GANTT_RANKS);
    let (left, width, row) = (90.0, 1000.0, 14.0);
    let height = f64::from(ranks) * 2.0 * row + 40.0;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" \
         role=\"img\" aria-label=\"timeline\">",
        left + width + 40.0
    );
    for rank in 0..ranks {
        let y = f64::from(rank) * 2.0 * row;
        let _ = write!(
            out,
            "<text x=\"4\" y=\"{:.1}\" font-size=\"10\">GPU {rank}</text>\
             <rect x=\"{left}\" y=\"{y:.1}\" width=\"{width}\" height=\"{:.1}\" fill=\"#f4f4f4\"/>",
            y + row + 4.0,
            2.0 * row - 2.0
        );
    }
    // Slices per (rank, lane), in pixels from the chart's left edge.
    let mut lanes = vec![Vec::new(); 2 * ranks as usize];
    for r in ran.iter().filter(|r| r.rank < ranks) {
        let Some(instr) = plan.instruction(r.rank, r.index) else {
            continue;
        };
        let lane = usize::from(!instr.is_compute());
        let from = r.start_us / end * width;
        let to = from + ((r.end_us - r.start_us) / end * width).max(0.5);
        let what = (to - from >= GANTT_MIN_SLICE_PX).then(|| label(plan, instr));
        lanes[2 * r.rank as usize + lane].push((from, to, colour(instr), what));
    }
    for (i, slices) in lanes.iter_mut().enumerate() {
        slices.sort_by(|a, b| a.0.total_cmp(&b.0));
        let rank = (i / 2) as u32;
        let y = f64::from(rank) * 2.0 * row + (i % 2) as f64 * row;
        for bar in lane_bars(slices, rank, end / width) {
            let _ = write!(
                out,
                "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"{}\">\
                 <title>{}</title></rect>",
                left + bar.from_px,
                (bar.to_px - bar.from_px).max(0.5),
                row - 2.0,
                bar.colour,
                html(&bar.tooltip),
            );
        }
    }
    let axis = f64::from(ranks) * 2.0 * row + 16.0;
    for k in 0..=4 {
        let x = left + width * f64::from(k) / 4.0;
        let _ = write!(
            out,
            "<text x=\"{x:.1}\" y=\"{axis:.1}\" font-size=\"10\" text-anchor=\"middle\">{:.2} ms</text>",
            end / 1e3 * f64::from(k) / 4.0
        );
    }
    out.push_str("</svg>");
    out
}

/// The report page.
pub fn report(input: &ReportInput, plan: &Plan, ran: &[Ran]) -> String {
    let end = ran.iter().map(|r| r.end_us).fold(0.0, f64::max).max(1e-9);
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{}</title><style>\
         body{{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222}}\
         table{{border-collapse:collapse;font-size:12px}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}\
         td:first-child,th:first-child,td:nth-child(2),th:nth-child(2){{text-align:left}}\
         .legend span{{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}}\
         .warning{{background:#fff4e5;border-left:4px solid #f28e2b;padding:6px 10px}}\
         .graph{{max-width:100%;overflow:auto}}</style></head><body>\n",
        html(&input.title)
    );
    let _ = writeln!(out, "<h1>{}</h1>", html(&input.title));
    for w in &input.warnings {
        let _ = writeln!(out, "<p class=\"warning\">Warning: {}</p>", html(w));
    }
    out.push_str("<h2>Summary</h2><table>");
    for (k, v) in &input.summary {
        let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", html(k), html(v));
    }
    out.push_str("</table>\n");
    if input.families.rows.len() > 1 {
        out.push_str("<h2>Families compared (each one's best plan)</h2>");
        out.push_str(&table(&input.families));
    }
    let drawn = if plan.ranks > GANTT_RANKS {
        format!(
            "<p>The first {GANTT_RANKS} of {} GPUs are drawn; timeline.json has them all.</p>",
            plan.ranks
        )
    } else {
        String::new()
    };
    out.push_str("<h2>Where the time goes, per GPU (simulated iteration)</h2>");
    out.push_str(&legend(&[
        ("#4e79a7", "compute"),
        ("#e15759", "communication not hidden behind compute"),
        ("#cccccc", "idle (pipeline bubble, waiting for another GPU)"),
    ]));
    out.push_str(&drawn);
    let _ = writeln!(
        out,
        "<div class=\"graph\">{}</div>",
        time_per_gpu(plan, ran, end)
    );
    if !input.layers.is_empty() {
        out.push_str("<h2>Where the time goes, per layer (planned, per iteration)</h2>");
        out.push_str(&legend(&[
            ("#4e79a7", "forward"),
            ("#f28e2b", "backward"),
            ("#e15759", "gradient synchronization"),
            ("#b07aa1", "moving its inputs"),
        ]));
        let _ = writeln!(
            out,
            "<div class=\"graph\">{}</div>",
            time_per_layer(&input.layers)
        );
    }
    out.push_str("<h2>Memory per GPU at its peak (instruction order)</h2>");
    let memory_legend: Vec<(&str, &str)> = MEMORY_GROUPS.iter().map(|(c, w, _)| (*c, *w)).collect();
    out.push_str(&legend(&memory_legend));
    out.push_str(&drawn);
    let _ = writeln!(
        out,
        "<div class=\"graph\">{}</div>",
        memory_per_gpu(plan, input.memory_capacity_bytes)
    );
    out.push_str("<h2>Timeline of one iteration (simulated)</h2>");
    out.push_str(&legend(&INSTRUCTION_STYLES));
    out.push_str(&drawn);
    let _ = writeln!(out, "<div class=\"graph\">{}</div>", gantt(plan, ran, end));
    out.push_str("<h2>Placement</h2>");
    out.push_str(&table(&input.placement));
    out.push_str("<h2>Placed graph</h2>");
    match &input.graph_svg {
        Some(svg) => {
            // Graphviz's SVG starts with an XML prolog and DOCTYPE: keep the <svg> element.
            let element = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
            let _ = write!(out, "<div class=\"graph\">{element}</div>");
        }
        None => {
            let _ = write!(
                out,
                "<p>Install Graphviz to draw the graph; its DOT source:</p><pre>{}</pre>",
                html(&input.graph_dot)
            );
        }
    }
    out.push_str("\n</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::{covered, lane_bars, INSTRUCTION_STYLES};

    #[test]
    fn covered_counts_overlaps_once() {
        assert_eq!(covered(vec![]), 0.0);
        assert_eq!(covered(vec![(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]), 4.0);
        assert_eq!(covered(vec![(4.0, 5.0), (0.0, 10.0), (2.0, 3.0)]), 10.0);
    }

    #[test]
    fn a_lane_of_many_short_slices_is_drawn_at_the_charts_resolution() {
        let (forward, backward) = (INSTRUCTION_STYLES[0].0, INSTRUCTION_STYLES[2].0);
        // 100,000 alternating forward/backward slices of 0.01 px over 1,000 px, then one
        // wide backward slice.
        let mut slices: Vec<_> = (0..100_000)
            .map(|i| {
                let from = f64::from(i) * 0.01;
                let colour = if i % 3 == 0 { forward } else { backward };
                (from, from + 0.01, colour, None)
            })
            .collect();
        slices.push((1000.0, 1010.0, backward, Some("B layer mb7".to_owned())));
        let bars = lane_bars(&slices, 3, 2.0);
        // The short ones fill 1,000 columns, mostly backward: one bar, counting them all.
        assert_eq!(
            bars.len(),
            2,
            "{:?}",
            bars.iter().map(|b| &b.tooltip).collect::<Vec<_>>()
        );
        assert_eq!(bars[1].tooltip, "GPU 3: B layer mb7: 2.000–2.020 ms");
        assert_eq!(
            bars[0].tooltip,
            "GPU 3: 100000 short slices, mostly backward: 0.000–2.000 ms"
        );
        assert_eq!(bars[0].colour, backward);
        assert_eq!((bars[0].from_px, bars[0].to_px), (0.0, 1000.0));
    }

    #[test]
    fn wide_slices_keep_their_own_tooltips() {
        let forward = INSTRUCTION_STYLES[0].0;
        let slices = vec![
            (0.0, 10.0, forward, Some("F a mb0".to_owned())),
            (10.0, 10.5, forward, None),
            (20.0, 30.0, forward, Some("F b mb0".to_owned())),
        ];
        let tooltips: Vec<String> = lane_bars(&slices, 0, 1000.0)
            .into_iter()
            .map(|b| b.tooltip)
            .collect();
        assert_eq!(
            tooltips,
            [
                "GPU 0: F a mb0: 0.000–10.000 ms",
                "GPU 0: 1 short slices, mostly forward: 10.000–11.000 ms",
                "GPU 0: F b mb0: 20.000–30.000 ms",
            ]
        );
    }
}
