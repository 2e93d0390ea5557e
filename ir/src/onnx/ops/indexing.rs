//! Indexing and rearrangement: the gathers and scatters, Where, Trilu, Tile, DepthToSpace,
//! SpaceToDepth, ReverseSequence. The defaults are the ONNX spec's.

use super::super::attrs::Attrs;
use super::{invalid, Converting};
use crate::error::Problem;
use crate::op::*;

/// The op of `c`'s node if it is one of this family's.
pub(super) fn convert(c: &Converting<'_>) -> Result<Option<Op>, Problem> {
    let a = &c.attrs;
    Ok(Some(match c.node.op_type.as_str() {
        "Gather" => Op::Gather {
            axis: a.int("axis")?.unwrap_or(0),
        },
        "Where" => Op::Where,
        "Trilu" => Op::Trilu {
            upper: a.flag("upper", true)?,
        },
        "GatherElements" => Op::GatherElements {
            axis: a.int("axis")?.unwrap_or(0),
        },
        "GatherND" => Op::GatherNd {
            batch_dims: match a.int("batch_dims")?.unwrap_or(0) {
                b if b >= 0 => b as usize,
                b => return Err(invalid("batch_dims", format!("must be at least 0, is {b}"))),
            },
        },
        // `Scatter` (opsets 9–10) is ScatterElements under its old name.
        "ScatterElements" | "Scatter" => Op::ScatterElements {
            axis: a.int("axis")?.unwrap_or(0),
            reduction: reduction(a)?,
        },
        "ScatterND" => Op::ScatterNd {
            reduction: reduction(a)?,
        },
        "Tile" => Op::Tile,
        "DepthToSpace" => {
            let mode = a.string("mode")?.unwrap_or_else(|| "DCR".into());
            let crd = match mode.as_str() {
                "DCR" => false,
                "CRD" => true,
                other => return Err(invalid("mode", format!("unknown value '{other}'"))),
            };
            Op::DepthToSpace {
                blocksize: blocksize(a)?,
                crd,
            }
        }
        "SpaceToDepth" => Op::SpaceToDepth {
            blocksize: blocksize(a)?,
        },
        "ReverseSequence" => {
            let axis = |name: &str, default: i64| -> Result<usize, Problem> {
                match a.int(name)?.unwrap_or(default) {
                    v @ (0 | 1) => Ok(v as usize),
                    v => Err(invalid(name, format!("must be 0 or 1, got {v}"))),
                }
            };
            let (batch_axis, time_axis) = (axis("batch_axis", 1)?, axis("time_axis", 0)?);
            if batch_axis == time_axis {
                return Err(invalid("batch_axis", "must differ from time_axis"));
            }
            Op::ReverseSequence {
                batch_axis,
                time_axis,
            }
        }
        _ => return Ok(None),
    }))
}

/// DepthToSpace's and SpaceToDepth's `blocksize`: required, at least 1.
fn blocksize(a: &Attrs<'_>) -> Result<usize, Problem> {
    let b = a
        .int("blocksize")?
        .ok_or_else(|| Problem::AttributeMissing {
            attr: "blocksize".into(),
        })?;
    usize::try_from(b)
        .ok()
        .filter(|&b| (1..=1 << 16).contains(&b))
        .ok_or_else(|| invalid("blocksize", format!("must be between 1 and 65536, got {b}")))
}
fn reduction(a: &Attrs<'_>) -> Result<Reduction, Problem> {
    Ok(match a.string("reduction")?.as_deref().unwrap_or("none") {
        "none" => Reduction::None,
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        other => return Err(invalid("reduction", format!("unknown reduction '{other}'"))),
    })
}
