//! Data movement: views, concatenation and splitting, slicing, transposition, padding,
//! expansion, casts, Dropout. The defaults are the ONNX spec's.

use super::{invalid, Converting};
use crate::dtype::DType;
use crate::error::Problem;
use crate::op::*;

/// The op of `c`'s node if it is one of this family's.
pub(super) fn convert(c: &Converting<'_>) -> Result<Option<Op>, Problem> {
    let a = &c.attrs;
    Ok(Some(match c.node.op_type.as_str() {
        "Concat" => Op::Concat {
            axis: a.int("axis")?.ok_or_else(|| Problem::AttributeMissing {
                attr: "axis".into(),
            })?,
        },
        "Split" => Op::Split {
            axis: a.int("axis")?.unwrap_or(0),
            sizes: a.ints("split")?,
        },
        "Slice" => Op::Slice {
            ranges: match (a.ints("starts")?, a.ints("ends")?) {
                (Some(starts), Some(ends)) => Some(SliceRanges {
                    starts,
                    ends,
                    axes: a.ints("axes")?,
                }),
                (None, None) => None,
                _ => {
                    return Err(invalid(
                        "starts",
                        "'starts' and 'ends' must be given together",
                    ))
                }
            },
        },
        "Flatten" => Op::Flatten {
            axis: a.int("axis")?.unwrap_or(1),
        },
        "Reshape" => Op::Reshape {
            allowzero: a.flag("allowzero", false)?,
        },
        "Transpose" => Op::Transpose {
            perm: a.ints("perm")?,
        },
        "Squeeze" => Op::Squeeze {
            axes: a.ints("axes")?,
        },
        "Unsqueeze" => Op::Unsqueeze {
            axes: a.ints("axes")?,
        },
        "Cast" => {
            let to = a
                .int("to")?
                .ok_or_else(|| Problem::AttributeMissing { attr: "to".into() })?;
            let to = i32::try_from(to)
                .ok()
                .and_then(DType::from_onnx)
                .ok_or_else(|| invalid("to", format!("unsupported element type code {to}")))?;
            Op::Cast { to }
        }
        "Dropout" => Op::Dropout {
            ratio: a.float("ratio")?,
        },
        "Identity" => Op::Identity,
        "Pad" => Op::Pad {
            mode: match a.string("mode")?.as_deref().unwrap_or("constant") {
                "constant" => PadMode::Constant,
                "reflect" => PadMode::Reflect,
                "edge" => PadMode::Edge,
                "wrap" => PadMode::Wrap,
                other => return Err(invalid("mode", format!("unknown mode '{other}'"))),
            },
            pads: a.ints("pads")?,
        },
        "Expand" => Op::Expand,
        _ => return Ok(None),
    }))
}
