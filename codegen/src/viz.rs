//! The plan's pictures: the placed layer graph (Graphviz DOT) and the timeline of an
//! iteration (Chrome trace event JSON, which Perfetto and chrome://tracing open).
//!
//! Both are deterministic: the same plan and timeline give byte-identical files.

use std::collections::BTreeMap;
use std::fmt::Write;

use ralpc_passes::layers::{LayerGraph, Producer};
use serde::Serialize;

use crate::plan::{Instruction, Plan};

/// Fill colours for device groups (ColorBrewer Set3, readable under black text).
const PALETTE: [&str; 12] = [
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
];

fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

fn size(bytes: f64) -> String {
    for (scale, unit) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if bytes >= scale as f64 {
            return format!("{:.1} {unit}", bytes / scale as f64);
        }
    }
    format!("{bytes:.0} B")
}

/// A layer's GPUs and SOAP degrees: (gpus, sample, attribute, parameter).
type Degrees = (u32, u32, u32, u32);

/// The placed layer graph: one box per stage, layers coloured by device group (the ranks
/// and split they run on), edges labelled with the bytes they carry per iteration.
pub fn dot(plan: &Plan, graph: &LayerGraph) -> String {
    render(plan, graph, false)
}

/// Layers above which [`drawing`] collapses the graph.
pub const MAX_DRAWN_LAYERS: usize = 150;

/// The graph `plan.svg` is drawn from: [`dot`], or for a model of over
/// [`MAX_DRAWN_LAYERS`] layers each run of consecutive layers placed alike (same stage,
/// GPUs and split) as one box, edges between runs summed. A drawing of every layer of a
/// large model is unreadable, and Graphviz takes minutes to lay it out.
pub fn drawing(plan: &Plan, graph: &LayerGraph) -> String {
    render(plan, graph, graph.layers.len() > MAX_DRAWN_LAYERS)
}

fn render(plan: &Plan, graph: &LayerGraph, collapse: bool) -> String {
    let file = &plan.strategy;
    let split_of = |l: usize| -> Degrees {
        let entry = file.layers.get(l);
        let g = entry.and_then(|e| e.gpus).unwrap_or(1);
        let s = entry.and_then(|e| e.split);
        s.map_or((g, g, 1, 1), |s| (g, s.sample, s.attribute, s.parameter))
    };
    // Stage of each layer from the file's stage names.
    let index: BTreeMap<&str, usize> = graph
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| (l.name.as_str(), i))
        .collect();
    let mut stage_of = vec![0usize; graph.layers.len()];
    for (k, s) in file.stages.iter().enumerate() {
        let (Some(&a), Some(&b)) = (
            index.get(s.first_layer.as_str()),
            index.get(s.last_layer.as_str()),
        ) else {
            continue;
        };
        for slot in stage_of.iter_mut().take(b + 1).skip(a) {
            *slot = k;
        }
    }
    // The boxes: (first layer, last layer) of each run, a layer alone unless collapsed.
    // Layers are in topological order, so edges between runs only go forward.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for l in 0..graph.layers.len() {
        match runs.last_mut() {
            Some((first, last))
                if collapse
                    && (stage_of[*first], split_of(*first)) == (stage_of[l], split_of(l)) =>
            {
                *last = l;
            }
            _ => runs.push((l, l)),
        }
    }
    let mut run_of = vec![0usize; graph.layers.len()];
    for (r, &(first, last)) in runs.iter().enumerate() {
        for slot in &mut run_of[first..=last] {
            *slot = r;
        }
    }
    let mut groups: BTreeMap<(usize, Degrees), usize> = BTreeMap::new();
    let mut out = String::new();
    let _ = writeln!(out, "digraph plan {{");
    let _ = writeln!(out, "  rankdir=TB;");
    let _ = writeln!(
        out,
        "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];"
    );
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=8];");
    for (k, s) in file.stages.iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_stage{k} {{");
        let _ = writeln!(
            out,
            "    label=\"stage {k}: {} GPUs\"; style=dashed;",
            s.replicas
        );
        for &(first, last) in runs.iter().filter(|&&(first, _)| stage_of[first] == k) {
            let key = (k, split_of(first));
            let next = groups.len();
            let colour = PALETTE[*groups.entry(key).or_insert(next) % PALETTE.len()];
            let (g, sa, a, p) = key.1;
            let what = if first == last {
                let layer = &graph.layers[first];
                format!("{}\\n{}", escape(&layer.name), escape(&layer.op))
            } else {
                format!(
                    "{} ..\\n{}\\n({} layers)",
                    escape(&graph.layers[first].name),
                    escape(&graph.layers[last].name),
                    last - first + 1
                )
            };
            let _ = writeln!(
                out,
                "    l{first} [label=\"{what}\\n{g} GPU{} ({sa}×{a}×{p})\", fillcolor=\"{colour}\"];",
                if g == 1 { "" } else { "s" }
            );
        }
        let _ = writeln!(out, "  }}");
    }
    if collapse {
        let mut between: BTreeMap<(usize, usize), u64> = BTreeMap::new();
        for (c, layer) in graph.layers.iter().enumerate() {
            for e in &layer.inputs {
                if let Producer::Layer(p) = e.from {
                    let from = run_of[p.0 as usize];
                    if from != run_of[c] {
                        *between.entry((from, run_of[c])).or_default() += e.bytes;
                    }
                }
            }
        }
        for ((from, to), bytes) in between {
            let _ = writeln!(
                out,
                "  l{} -> l{} [label=\"{}\"];",
                runs[from].0,
                runs[to].0,
                size(bytes as f64)
            );
        }
    } else {
        for (c, layer) in graph.layers.iter().enumerate() {
            for e in &layer.inputs {
                if let Producer::Layer(p) = e.from {
                    let _ = writeln!(
                        out,
                        "  l{} -> l{c} [label=\"{}\"];",
                        p.0,
                        size(e.bytes as f64)
                    );
                }
            }
        }
    }
    let _ = writeln!(out, "}}");
    out
}

/// One instruction as it ran (what a simulator or executor reports).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ran {
    /// Its rank.
    pub rank: u32,
    /// Its index in the rank's program.
    pub index: usize,
    /// Start, µs.
    pub start_us: f64,
    /// End, µs.
    pub end_us: f64,
}

#[derive(Serialize)]
struct Event {
    name: String,
    ph: &'static str,
    pid: u32,
    tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bp: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<BTreeMap<&'static str, serde_json::Value>>,
}

impl Event {
    fn new(name: String, ph: &'static str, pid: u32, tid: u32) -> Event {
        Event {
            name,
            ph,
            pid,
            tid,
            ts: None,
            dur: None,
            cat: None,
            id: None,
            bp: None,
            args: None,
        }
    }
}

#[derive(Serialize)]
struct Trace {
    #[serde(rename = "traceEvents")]
    events: Vec<Event>,
    #[serde(rename = "displayTimeUnit")]
    unit: &'static str,
}

/// A slice's name: `F layer mb0`, `send 1.5 MiB → 3`, `all-reduce 98 MiB (group 2)`.
pub fn label(plan: &Plan, instr: &Instruction) -> String {
    let name = |l: u32| plan.layers.get(l as usize).map_or("?", String::as_str);
    match instr {
        Instruction::Forward {
            layer, microbatch, ..
        } => format!("F {} mb{microbatch}", name(*layer)),
        Instruction::Recompute {
            layer, microbatch, ..
        } => format!("R {} mb{microbatch}", name(*layer)),
        Instruction::Backward {
            layer, microbatch, ..
        } => format!("B {} mb{microbatch}", name(*layer)),
        Instruction::WeightGradient {
            layer, microbatch, ..
        } => format!("W {} mb{microbatch}", name(*layer)),
        Instruction::Step { bytes, .. } => format!("step {}", size(*bytes as f64)),
        Instruction::Send { to, bytes, .. } => format!("send {} → {to}", size(*bytes as f64)),
        Instruction::Recv { from, bytes, .. } => format!("recv {} ← {from}", size(*bytes as f64)),
        Instruction::AllReduce { group, bytes, .. }
        | Instruction::AllGather { group, bytes, .. }
        | Instruction::ReduceScatter { group, bytes, .. }
        | Instruction::AllToAll { group, bytes, .. } => format!(
            "{} {} (group {group})",
            instr.op().replace('_', "-"),
            size(*bytes as f64)
        ),
    }
}

/// What Perfetto's queries select a slice by (`args.layer`, `args.microbatch`, `args.bytes`,
/// `args.peers`): the rank and instruction, the layer and microbatch of a pass, the bytes
/// and peers of a transfer or collective, the predicted duration.
fn slice_args(
    plan: &Plan,
    r: &Ran,
    instr: &Instruction,
) -> BTreeMap<&'static str, serde_json::Value> {
    let mut args = BTreeMap::from([
        ("rank", r.rank.into()),
        ("instruction", r.index.into()),
        ("predicted_us", instr.us().into()),
    ]);
    let members = |group: u32| -> serde_json::Value {
        plan.groups
            .get(group as usize)
            .cloned()
            .unwrap_or_default()
            .into()
    };
    match instr {
        Instruction::Forward {
            layer, microbatch, ..
        }
        | Instruction::Recompute {
            layer, microbatch, ..
        }
        | Instruction::Backward {
            layer, microbatch, ..
        }
        | Instruction::WeightGradient {
            layer, microbatch, ..
        } => {
            let name = plan
                .layers
                .get(*layer as usize)
                .cloned()
                .unwrap_or_default();
            args.insert("layer", name.into());
            args.insert("layer_index", (*layer).into());
            args.insert("microbatch", (*microbatch).into());
        }
        Instruction::Step {
            bytes, tied, group, ..
        } => {
            args.insert("bytes", (*bytes).into());
            if let Some(tied) = tied {
                args.insert("tied", tied.clone().into());
            }
            if let Some(group) = group {
                args.insert("group", (*group).into());
                args.insert("peers", members(*group));
            }
        }
        Instruction::Send {
            to: peer,
            bytes,
            tag,
            ..
        }
        | Instruction::Recv {
            from: peer,
            bytes,
            tag,
            ..
        } => {
            args.insert("bytes", (*bytes).into());
            args.insert("peers", vec![*peer].into());
            args.insert("tag", (*tag).into());
        }
        Instruction::AllReduce { group, bytes, .. }
        | Instruction::AllGather { group, bytes, .. }
        | Instruction::ReduceScatter { group, bytes, .. }
        | Instruction::AllToAll { group, bytes, .. } => {
            args.insert("bytes", (*bytes).into());
            args.insert("group", (*group).into());
            args.insert("peers", members(*group));
        }
    }
    args
}

/// The timeline of one iteration in Chrome's trace event format: one process per server,
/// two tracks per GPU (compute, communication: Perfetto does not show overlapping slices
/// on one track), a flow arrow from each send to its receive, and a counter per GPU of
/// the memory its live buffers hold.
pub fn trace(plan: &Plan, ran: &[Ran]) -> String {
    let node_of = |rank: u32| plan.sites.get(rank as usize).map_or(0, |s| s.node);
    let memory = plan.memory_by_instruction();
    // The memory counter changes where an instruction starts with a different total.
    let mut counted: BTreeMap<u32, u64> = BTreeMap::new();
    let mut events = Vec::new();
    let mut nodes: BTreeMap<u32, ()> = BTreeMap::new();
    for rank in 0..plan.ranks {
        let node = node_of(rank);
        if nodes.insert(node, ()).is_none() {
            let mut e = Event::new("process_name".into(), "M", node, 0);
            e.args = Some(BTreeMap::from([("name", format!("node {node}").into())]));
            events.push(e);
        }
        for (track, what) in [(0, "compute"), (1, "communication")] {
            let mut e = Event::new("thread_name".into(), "M", node, rank * 2 + track);
            e.args = Some(BTreeMap::from([(
                "name",
                format!("GPU {rank} {what}").into(),
            )]));
            events.push(e);
        }
    }
    // Flow ids: one per message, from the send's slice to the receive's.
    let mut flows: BTreeMap<(u32, u32, u64), u64> = BTreeMap::new();
    for r in ran {
        let Some(instr) = plan.instruction(r.rank, r.index) else {
            continue;
        };
        let node = node_of(r.rank);
        let label = label(plan, instr);
        let track = if instr.is_compute() { 0 } else { 1 };
        let cat = instr.op();
        let tid = r.rank * 2 + track;
        let mut e = Event::new(label, "X", node, tid);
        e.ts = Some(r.start_us);
        e.dur = Some(r.end_us - r.start_us);
        e.cat = Some(cat);
        e.args = Some(slice_args(plan, r, instr));
        events.push(e);
        let live = memory
            .get(r.rank as usize)
            .and_then(|m| m.get(r.index))
            .copied();
        if let Some(bytes) = live.filter(|&b| counted.insert(r.rank, b) != Some(b)) {
            let mut c = Event::new(format!("GPU {} memory", r.rank), "C", node, 0);
            c.ts = Some(r.start_us);
            c.args = Some(BTreeMap::from([("MiB", (bytes as f64 / 1048576.0).into())]));
            events.push(c);
        }
        let flow = match *instr {
            Instruction::Send { to, tag, .. } => Some(((r.rank, to, tag), "s", r.start_us)),
            Instruction::Recv { from, tag, .. } => Some(((from, r.rank, tag), "f", r.end_us)),
            _ => None,
        };
        if let Some((key, ph, ts)) = flow {
            let next = flows.len() as u64;
            let id = *flows.entry(key).or_insert(next);
            let mut f = Event::new("transfer".into(), ph, node, tid);
            f.ts = Some(ts);
            f.id = Some(id);
            f.cat = Some("transfer");
            if ph == "f" {
                f.bp = Some("e");
            }
            events.push(f);
        }
    }
    // Finite floats, strings and integers always serialize.
    serde_json::to_string(&Trace { events, unit: "ms" }).unwrap_or_default() + "\n"
}
