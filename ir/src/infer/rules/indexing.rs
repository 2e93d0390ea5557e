//! Shape rules of the ops that index elements: GatherElements, GatherND, ScatterElements,
//! ScatterND,
//! CumSum, Size, and Einsum's contraction.

use super::{axis, known, mismatch, Ctx, Result};
use crate::dtype::DType;
use crate::infer::{InferError, Scalar, ValueType};
use crate::op::Einsum;
use crate::shape::{Dim, Shape};

fn need_indices(t: &ValueType, what: &str) -> Result<()> {
    if t.dtype.is_integer() {
        Ok(())
    } else {
        Err(InferError::Type {
            reason: format!("{what} must be integers, got {}", t.dtype),
        })
    }
}

/// Whether two shapes have one rank and agree wherever both sizes are known.
fn agree(a: &Shape, b: &Shape) -> bool {
    a.rank() == b.rank()
        && a.0.iter().zip(&b.0).all(|(x, y)| {
            x == y
                || matches!((x.as_known(), y.as_known()), (Some(p), Some(q)) if p == q)
                || x.as_known().is_none()
                || y.as_known().is_none()
        })
}

/// GatherElements: the output has the indices' shape (and the data's type).
pub(super) fn gather_elements(ctx: &Ctx<'_>, a: i64) -> Result<Vec<ValueType>> {
    let (x, idx) = (ctx.input(0)?, ctx.input(1)?);
    need_indices(idx, "indices")?;
    if x.shape.rank() != idx.shape.rank() {
        return Err(mismatch(format!(
            "indices {} must have the data's rank ({})",
            idx.shape, x.shape
        )));
    }
    axis(a, x.shape.rank(), "axis")?;
    Ok(vec![ValueType::new(x.dtype, idx.shape.clone())])
}

/// GatherND: indices `[b…, …, k]` address slices of the data's axes after `b + k`; the
/// output is `indices.shape[..-1] ++ data.shape[b + k..]`.
pub(super) fn gather_nd(ctx: &Ctx<'_>, b: usize) -> Result<Vec<ValueType>> {
    let (x, idx) = (ctx.input(0)?, ctx.input(1)?);
    need_indices(idx, "indices")?;
    let Some(last) = idx.shape.0.last() else {
        return Err(mismatch("indices must have rank >= 1".into()));
    };
    let k = usize::try_from(known(last)?).unwrap_or(usize::MAX);
    if b >= idx.shape.rank() || b.saturating_add(k) > x.shape.rank() {
        return Err(mismatch(format!(
            "indices {} address {k} axes after {b} batch axes of data {} (rank {})",
            idx.shape,
            x.shape,
            x.shape.rank()
        )));
    }
    if !agree(
        &Shape(x.shape.0[..b].to_vec()),
        &Shape(idx.shape.0[..b].to_vec()),
    ) {
        return Err(mismatch(format!(
            "the {b} batch axes of data {} and indices {} differ",
            x.shape, idx.shape
        )));
    }
    let mut out = idx.shape.0[..idx.shape.rank() - 1].to_vec();
    out.extend(x.shape.0[b + k..].iter().cloned());
    Ok(vec![ValueType::new(x.dtype, Shape(out))])
}

/// ScatterElements: `updates` has the indices' shape, of the data's rank; the output is
/// the data's type.
pub(super) fn scatter_elements(ctx: &Ctx<'_>, a: i64) -> Result<Vec<ValueType>> {
    let (x, idx, up) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    need_indices(idx, "indices")?;
    if idx.shape.rank() != x.shape.rank() || !agree(&idx.shape, &up.shape) {
        return Err(mismatch(format!(
            "indices {} and updates {} must have one shape, of the data's rank ({})",
            idx.shape, up.shape, x.shape
        )));
    }
    axis(a, x.shape.rank(), "axis")?;
    Ok(vec![ValueType::new(x.dtype, x.shape.clone())])
}

/// ScatterND: indices `[…, k]` address slices of the data's last `rank - k` axes, and
/// `updates` is `indices.shape[..-1] ++ data.shape[k..]`.
pub(super) fn scatter_nd(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let (x, idx, up) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    need_indices(idx, "indices")?;
    let Some(last) = idx.shape.0.last() else {
        return Err(mismatch("indices must have rank >= 1".into()));
    };
    let k = usize::try_from(known(last)?).unwrap_or(usize::MAX);
    if k > x.shape.rank() {
        return Err(mismatch(format!(
            "indices address {k} axes of data {} (rank {})",
            x.shape,
            x.shape.rank()
        )));
    }
    let mut want = idx.shape.0[..idx.shape.rank() - 1].to_vec();
    want.extend(x.shape.0[k..].iter().cloned());
    if !agree(&Shape(want.clone()), &up.shape) {
        return Err(mismatch(format!(
            "updates {} must be {} for indices {} into data {}",
            up.shape,
            Shape(want),
            idx.shape,
            x.shape
        )));
    }
    Ok(vec![ValueType::new(x.dtype, x.shape.clone())])
}

/// CumSum: the input's type; the axis is a scalar integer input.
pub(super) fn cumsum(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let a = ctx.input(1)?;
    need_indices(a, "axis")?;
    // The output's shape does not depend on the axis: it is checked when known.
    if a.content.is_some() {
        let a = ctx.ints_of(1)?;
        let [a] = a.as_slice() else {
            return Err(mismatch(format!(
                "axis must hold one value, holds {}",
                a.len()
            )));
        };
        axis(*a, x.shape.rank(), "axis")?;
    }
    Ok(vec![ValueType::new(x.dtype, x.shape.clone())])
}

/// Size: an `i64` scalar whose content is the element count (symbolic while unbound).
pub(super) fn size(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let mut v = ValueType::new(DType::I64, Shape(Vec::new()));
    v.content = x.shape.numel().map(|n| vec![Scalar::Int(n)].into());
    Ok(vec![v])
}

/// Einsum: every label has one size across operands (the ellipsis's axes broadcast); the
/// output's axes take their labels' sizes.
pub(super) fn einsum(ctx: &Ctx<'_>, e: &Einsum) -> Result<Vec<ValueType>> {
    let operands: Vec<&ValueType> = (0..ctx.inputs.len())
        .map(|slot| ctx.input(slot))
        .collect::<Result<_>>()?;
    let dtype = operands.first().map_or(DType::F32, |t| t.dtype);
    if let Some(t) = operands.iter().find(|t| t.dtype != dtype) {
        return Err(InferError::Type {
            reason: format!("operands mix {dtype} and {}", t.dtype),
        });
    }
    let ranks: Vec<usize> = operands.iter().map(|t| t.shape.rank()).collect();
    let axes = e.axes(&ranks).map_err(|e| mismatch(e.to_string()))?;
    let mut sizes: std::collections::BTreeMap<u32, Dim> = std::collections::BTreeMap::new();
    for (slot, (t, labels)) in operands.iter().zip(&axes.operands).enumerate() {
        for (d, &label) in t.shape.0.iter().zip(labels) {
            let broadcast = label >= Einsum::ELLIPSIS;
            match sizes.get(&label) {
                None => {
                    sizes.insert(label, d.clone());
                }
                Some(s) if s == d => {}
                Some(s) if broadcast && s.as_known() == Some(1) => {
                    sizes.insert(label, d.clone());
                }
                Some(_) if broadcast && d.as_known() == Some(1) => {}
                Some(s) => {
                    let name = char::from_u32(label)
                        .filter(|_| !broadcast)
                        .map_or_else(|| "an ellipsis axis".to_owned(), |c| format!("label '{c}'"));
                    return Err(mismatch(format!(
                        "{name} is {s} elsewhere but {d} in operand {slot} ({})",
                        t.shape
                    )));
                }
            }
        }
    }
    let out = axes
        .output
        .iter()
        .map(|l| sizes.get(l).cloned().unwrap_or_else(|| Dim::known(1)))
        .collect();
    Ok(vec![ValueType::new(dtype, Shape(out))])
}
