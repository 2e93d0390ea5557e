//! The text form of a verified graph, for snapshots and reading.
//!
//! ```text
//! input %data: f32[1,3,224,224]
//! weight %conv1.weight: f32[64,3,3,3]
//! %conv1_out: f32[1,64,224,224] = Conv[...](%data, %conv1.weight, %conv1.bias)
//! output %logits
//! ```
//!
//! Shape arithmetic that folded to constants is printed with its content (`= [1,25088]`).

use std::fmt::Write;

use crate::graph::Graph;
use crate::ids::ValueId;
use crate::infer::{Scalar, ValueType};
use crate::op::Op;
use crate::verify::GraphInfo;

fn ty(t: &ValueType) -> String {
    format!("{}{}", t.dtype, t.shape)
}

fn content(t: &ValueType) -> Option<String> {
    let c = t.content.as_ref()?;
    if c.len() > 8 {
        return None;
    }
    let items: Vec<String> = c
        .iter()
        .map(|s| match s {
            Scalar::Int(d) => d.to_string(),
            Scalar::Float(f) => format!("{f}"),
        })
        .collect();
    Some(format!("[{}]", items.join(",")))
}

/// Attributes of an op, compactly (`Debug` of the typed attributes, without the variant).
fn attrs(op: &Op) -> String {
    let full = format!("{op:?}");
    match full.find(['(', '{']) {
        Some(i) if !matches!(op, Op::Constant { .. }) => {
            let inner = full[i..].trim_start_matches('(').trim_end_matches(')');
            format!("[{}]", inner.trim())
        }
        _ => String::new(),
    }
}

/// Prints `graph` with the types in `info`.
pub fn print(graph: &Graph, info: &GraphInfo) -> String {
    let name = |v: ValueId| format!("%{}", graph.value(v).name);
    let mut out = String::new();
    for &n in info.order() {
        let node = graph.node(n);
        match &node.op {
            Op::Input => {
                let v = node.outputs[0];
                let _ = writeln!(out, "input {}: {}", name(v), ty(info.ty(v)));
            }
            Op::Constant {
                initializer: true, ..
            } => {
                let v = node.outputs[0];
                let _ = writeln!(out, "weight {}: {}", name(v), ty(info.ty(v)));
            }
            op => {
                let outs: Vec<String> = node
                    .outputs
                    .iter()
                    .map(|&v| format!("{}: {}", name(v), ty(info.ty(v))))
                    .collect();
                let ins: Vec<String> = node
                    .inputs
                    .iter()
                    .map(|v| v.map_or_else(|| "_".to_owned(), name))
                    .collect();
                let _ = write!(
                    out,
                    "{} = {}{}({})",
                    outs.join(", "),
                    op.name(),
                    attrs(op),
                    ins.join(", ")
                );
                if let Some(c) = node.outputs.first().and_then(|&v| content(info.ty(v))) {
                    let _ = write!(out, " = {c}");
                }
                out.push('\n');
            }
        }
    }
    for &v in graph.outputs() {
        let _ = writeln!(out, "output {}", name(v));
    }
    out
}
