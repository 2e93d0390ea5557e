//! Normalizations: softmax, batch, layer, instance, group and local response normalization.
//! The defaults are the ONNX spec's.

use super::{invalid, Converting};
use crate::error::Problem;
use crate::op::*;

/// The op of `c`'s node if it is one of this family's.
pub(super) fn convert(c: &Converting<'_>) -> Result<Option<Op>, Problem> {
    let (node, a) = (c.node, &c.attrs);
    let opset = c.opset;
    Ok(Some(match c.node.op_type.as_str() {
        "Softmax" | "LogSoftmax" => Op::Softmax {
            // The default axis moved from 1 to -1 in opset 13.
            axis: a.int("axis")?.unwrap_or(if opset >= 13 { -1 } else { 1 }),
            log: node.op_type == "LogSoftmax",
            flatten: opset < 13,
        },
        "BatchNormalization" => Op::BatchNorm {
            epsilon: a.float("epsilon")?.unwrap_or(1e-5),
            momentum: a.float("momentum")?.unwrap_or(0.9),
        },
        "LayerNormalization" => Op::LayerNorm {
            axis: a.int("axis")?.unwrap_or(-1),
            epsilon: a.float("epsilon")?.unwrap_or(1e-5),
        },
        "LRN" => {
            let size = a.int("size")?.ok_or_else(|| Problem::AttributeMissing {
                attr: "size".into(),
            })?;
            if size < 1 {
                return Err(invalid("size", format!("must be >= 1, got {size}")));
            }
            Op::Lrn {
                size: size as u64,
                alpha: a.float("alpha")?.unwrap_or(1e-4),
                beta: a.float("beta")?.unwrap_or(0.75),
                bias: a.float("bias")?.unwrap_or(1.0),
            }
        }
        "InstanceNormalization" => Op::InstanceNorm {
            epsilon: a.float("epsilon")?.unwrap_or(1e-5),
        },
        "GroupNormalization" => Op::GroupNorm {
            groups: a
                .int("num_groups")?
                .and_then(|g| usize::try_from(g).ok())
                .filter(|&g| g >= 1)
                .ok_or_else(|| invalid("num_groups", "must be given, at least 1"))?,
            epsilon: a.float("epsilon")?.unwrap_or(1e-5),
        },
        _ => return Ok(None),
    }))
}
