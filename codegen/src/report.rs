//! `report.html`: one self-contained page (no network fetches, no scripts) with the plan's
//! summary, the per-layer placement table, an SVG Gantt chart of the simulated iteration and
//! the placed graph.

use std::fmt::Write;

use crate::plan::{Instruction, Plan};
use crate::viz::Ran;

/// Ranks drawn in the Gantt chart at most (the rest are summarized in a line).
pub const GANTT_RANKS: u32 = 64;

/// What the report shows besides the plan and its timeline.
#[derive(Clone, Debug, Default)]
pub struct ReportInput {
    /// Page title (the model and the cluster).
    pub title: String,
    /// Summary rows: (what, value).
    pub summary: Vec<(String, String)>,
    /// Column headers of the placement table.
    pub columns: Vec<String>,
    /// Placement table rows.
    pub rows: Vec<Vec<String>>,
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

/// Colour and label of an instruction's kind.
fn style(i: &Instruction) -> (&'static str, &'static str) {
    match i {
        Instruction::Forward { .. } => ("#4e79a7", "forward"),
        Instruction::Recompute { .. } => ("#9c755f", "recompute"),
        Instruction::Backward { .. } => ("#f28e2b", "backward"),
        Instruction::Step { .. } => ("#59a14f", "optimizer step"),
        Instruction::Send { .. } | Instruction::Recv { .. } => ("#b07aa1", "transfer"),
        Instruction::AllReduce { .. } => ("#e15759", "all-reduce"),
        Instruction::AllGather { .. }
        | Instruction::ReduceScatter { .. }
        | Instruction::AllToAll { .. } => ("#76b7b2", "resharding collective"),
    }
}

/// The Gantt chart of `ran`: two rows per rank (compute, communication), time to the right.
fn gantt(plan: &Plan, ran: &[Ran]) -> String {
    let end = ran.iter().map(|r| r.end_us).fold(0.0, f64::max).max(1e-9);
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
    for r in ran.iter().filter(|r| r.rank < ranks) {
        let Some(instr) = plan.instruction(r.rank, r.index) else {
            continue;
        };
        let (colour, what) = style(instr);
        let lane = if instr.is_compute() { 0.0 } else { 1.0 };
        let x = left + r.start_us / end * width;
        let w = ((r.end_us - r.start_us) / end * width).max(0.5);
        let y = f64::from(r.rank) * 2.0 * row + lane * row;
        let _ = write!(
            out,
            "<rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{:.1}\" fill=\"{colour}\">\
             <title>{what}: {:.3}–{:.3} ms</title></rect>",
            row - 2.0,
            r.start_us / 1e3,
            r.end_us / 1e3
        );
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
         .graph{{max-width:100%;overflow:auto}}</style></head><body>\n",
        html(&input.title)
    );
    let _ = writeln!(out, "<h1>{}</h1>", html(&input.title));
    out.push_str("<h2>Summary</h2><table>");
    for (k, v) in &input.summary {
        let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", html(k), html(v));
    }
    out.push_str("</table>\n<h2>Timeline of one iteration (simulated)</h2><p class=\"legend\">");
    for (colour, what) in [
        ("#4e79a7", "forward"),
        ("#f28e2b", "backward"),
        ("#59a14f", "optimizer step"),
        ("#b07aa1", "transfer"),
        ("#e15759", "all-reduce"),
    ] {
        let _ = write!(out, "<span style=\"background:{colour}\"></span>{what}");
    }
    out.push_str("</p>");
    if plan.ranks > GANTT_RANKS {
        let _ = write!(
            out,
            "<p>The first {GANTT_RANKS} of {} GPUs are drawn; timeline.json has them all.</p>",
            plan.ranks
        );
    }
    let _ = writeln!(out, "<div class=\"graph\">{}</div>", gantt(plan, ran));
    out.push_str("<h2>Placement</h2><table><tr>");
    for c in &input.columns {
        let _ = write!(out, "<th>{}</th>", html(c));
    }
    out.push_str("</tr>");
    for row in &input.rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", html(cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>\n<h2>Placed graph</h2>");
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
