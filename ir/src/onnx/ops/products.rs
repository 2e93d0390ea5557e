//! Products: convolutions, Gemm, MatMul, the recurrent layers, Einsum, STFT. The defaults
//! are the ONNX spec's.

use std::sync::Arc;

use super::super::attrs::Attrs;
use super::{invalid, padding, Converting};
use crate::error::Problem;
use crate::op::*;
use onnx_protobuf::NodeProto;

/// The op of `c`'s node if it is one of this family's.
pub(super) fn convert(c: &Converting<'_>) -> Result<Option<Op>, Problem> {
    let (node, a) = (c.node, &c.attrs);
    Ok(Some(match c.node.op_type.as_str() {
        "Conv" => Op::Conv(conv(a)?),
        "ConvTranspose" => Op::ConvTranspose(ConvTranspose {
            conv: conv(a)?,
            output_padding: a.sizes("output_padding", 0)?,
            output_shape: a.sizes("output_shape", 1)?,
        }),
        "Gemm" => Op::Gemm(Gemm {
            alpha: a.float("alpha")?.unwrap_or(1.0),
            beta: a.float("beta")?.unwrap_or(1.0),
            trans_a: a.flag("transA", false)?,
            trans_b: a.flag("transB", false)?,
        }),
        "MatMul" => Op::MatMul,
        "RNN" | "GRU" | "LSTM" => Op::Recurrent(recurrent(a, &node.op_type, node)?),
        "Einsum" => {
            let equation = a
                .string("equation")?
                .ok_or_else(|| Problem::AttributeMissing {
                    attr: "equation".into(),
                })?;
            Op::Einsum(Arc::new(
                Einsum::parse(&equation).map_err(|e| invalid("equation", e.to_string()))?,
            ))
        }
        "STFT" => Op::Stft {
            onesided: a.flag("onesided", true)?,
        },
        _ => return Ok(None),
    }))
}

fn conv(a: &Attrs<'_>) -> Result<Conv, Problem> {
    let group = a.int("group")?.unwrap_or(1);
    if group < 1 {
        return Err(invalid("group", format!("must be >= 1, got {group}")));
    }
    Ok(Conv {
        kernel: a.sizes("kernel_shape", 1)?,
        strides: a.sizes("strides", 1)?,
        dilations: a.sizes("dilations", 1)?,
        padding: padding(a)?,
        group: group as u64,
    })
}
/// RNN, GRU and LSTM with their default activations; what else the spec allows (other
/// activations, clipping, coupled input-forget gates, peepholes) is refused by name.
fn recurrent(a: &Attrs<'_>, op_type: &str, node: &NodeProto) -> Result<Recurrent, Problem> {
    let cell = match op_type {
        "RNN" => Cell::Rnn,
        "GRU" => Cell::Gru {
            linear_before_reset: a.flag("linear_before_reset", false)?,
        },
        _ => Cell::Lstm,
    };
    let hidden = match a.int("hidden_size")? {
        Some(h) if h > 0 => h as u64,
        Some(h) => {
            return Err(invalid(
                "hidden_size",
                format!("{h} is not a positive size"),
            ))
        }
        None => return Err(invalid("hidden_size", "required")),
    };
    let direction = match a.string("direction")?.as_deref().unwrap_or("forward") {
        "forward" => Direction::Forward,
        "reverse" => Direction::Reverse,
        "bidirectional" => Direction::Bidirectional,
        other => return Err(invalid("direction", format!("unknown direction '{other}'"))),
    };
    if let Some(acts) = a.strings("activations")? {
        let defaults: &[&str] = match cell {
            Cell::Rnn => &["Tanh"],
            Cell::Gru { .. } => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        };
        let per_direction = acts.len() / direction.count() as usize;
        let default = acts.len() == defaults.len() * direction.count() as usize
            && acts
                .iter()
                .enumerate()
                .all(|(i, act)| act.eq_ignore_ascii_case(defaults[i % per_direction.max(1)]));
        if !default {
            return Err(invalid(
                "activations",
                format!("{acts:?}: only the defaults {defaults:?} are supported"),
            ));
        }
    }
    if a.float("clip")?.is_some() {
        return Err(invalid("clip", "clipped cells are not supported"));
    }
    if a.flag("input_forget", false)? {
        return Err(invalid(
            "input_forget",
            "coupled input-forget gates are not supported",
        ));
    }
    // An LSTM's 8th input is the peephole weights.
    if cell == Cell::Lstm && node.input.get(7).is_some_and(|p| !p.is_empty()) {
        return Err(invalid("P", "peephole connections are not supported"));
    }
    Ok(Recurrent {
        cell,
        hidden,
        direction,
        batch_major: a.flag("layout", false)?,
    })
}
