//! Reductions: the `Reduce*` operators, ArgMax, ArgMin and TopK, CumSum, and Sum, Mean, Max and
//! Min of n tensors. The defaults are the ONNX spec's.

use super::Converting;
use crate::error::Problem;
use crate::op::*;

/// The op of `c`'s node if it is one of this family's.
pub(super) fn convert(c: &Converting<'_>) -> Result<Option<Op>, Problem> {
    let (node, a) = (c.node, &c.attrs);
    Ok(Some(match c.node.op_type.as_str() {
        "Sum" => Op::Variadic(Variadic::Sum),
        "Mean" => Op::Variadic(Variadic::Mean),
        "Max" => Op::Variadic(Variadic::Max),
        "Min" => Op::Variadic(Variadic::Min),
        reduce if reduce.starts_with("Reduce") => {
            let Some(kind) = ReduceKind::ALL.into_iter().find(|k| k.name() == reduce) else {
                return Ok(None);
            };
            Op::Reduce {
                kind,
                axes: a.ints("axes")?,
                keepdims: a.flag("keepdims", true)?,
                noop_with_empty_axes: a.flag("noop_with_empty_axes", false)?,
            }
        }
        "CumSum" => Op::CumSum {
            exclusive: a.flag("exclusive", false)?,
            reverse: a.flag("reverse", false)?,
        },
        "ArgMax" | "ArgMin" => Op::ArgExtreme {
            max: node.op_type == "ArgMax",
            axis: a.int("axis")?.unwrap_or(0),
            keepdims: a.flag("keepdims", true)?,
            select_last: a.flag("select_last_index", false)?,
        },
        // `sorted = 0` lets a backend return the k in any order; ralpc always sorts them,
        // which is one of the orders it allows.
        "TopK" => Op::TopK {
            axis: a.int("axis")?.unwrap_or(-1),
            largest: a.flag("largest", true)?,
            k: a.int("k")?,
        },
        _ => return Ok(None),
    }))
}
