//! Shape rules of the ops that rearrange elements without arithmetic (Tile, DepthToSpace,
//! SpaceToDepth, ReverseSequence) and of ArgMax/ArgMin and TopK.

use super::{axis, mismatch, need_rank, Ctx, Result};
use crate::dtype::DType;
use crate::infer::{InferError, ValueType};
use crate::shape::{Dim, Shape};

/// Tile: each axis `repeats` times as long.
pub(super) fn tile(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let repeats = ctx.ints_of(1)?;
    if repeats.len() != x.shape.rank() {
        return Err(mismatch(format!(
            "repeats has {} values for an input of rank {} ({})",
            repeats.len(),
            x.shape.rank(),
            x.shape
        )));
    }
    let dims = x
        .shape
        .0
        .iter()
        .zip(&repeats)
        .map(|(d, &r)| {
            if r < 0 {
                return Err(mismatch(format!("repeats must not be negative, got {r}")));
            }
            d.checked_mul(&Dim::known(r)).ok_or(InferError::Overflow {
                what: "the tiled shape".into(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![ValueType::new(x.dtype, Shape(dims))])
}

/// `d / by`, or an error naming the axis.
fn divide(d: &Dim, by: i64, what: &str) -> Result<Dim> {
    d.div_exact(&Dim::known(by))
        .ok_or_else(|| mismatch(format!("{what} ({d}) must be a multiple of {by}")))
}

/// DepthToSpace: `[N, C, H, W]` to `[N, C / b², H·b, W·b]`.
pub(super) fn depth_to_space(ctx: &Ctx<'_>, b: usize) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    need_rank(x, 0, 4, "rank 4 (N, C, H, W)")?;
    let b = b as i64;
    let d = &x.shape.0;
    let grow = |d: &Dim| {
        d.checked_mul(&Dim::known(b)).ok_or(InferError::Overflow {
            what: "the output's size".into(),
        })
    };
    let shape = Shape(vec![
        d[0].clone(),
        divide(&d[1], b * b, "the channels")?,
        grow(&d[2])?,
        grow(&d[3])?,
    ]);
    Ok(vec![ValueType::new(x.dtype, shape)])
}

/// SpaceToDepth: `[N, C, H, W]` to `[N, C·b², H / b, W / b]`.
pub(super) fn space_to_depth(ctx: &Ctx<'_>, b: usize) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    need_rank(x, 0, 4, "rank 4 (N, C, H, W)")?;
    let b = b as i64;
    let d = &x.shape.0;
    let channels = d[1]
        .checked_mul(&Dim::known(b * b))
        .ok_or(InferError::Overflow {
            what: "the output's channels".into(),
        })?;
    let shape = Shape(vec![
        d[0].clone(),
        channels,
        divide(&d[2], b, "the height")?,
        divide(&d[3], b, "the width")?,
    ]);
    Ok(vec![ValueType::new(x.dtype, shape)])
}

/// ArgMax/ArgMin: `i64` indices, the axis removed or kept as 1.
pub(super) fn arg_extreme(ctx: &Ctx<'_>, a: i64, keepdims: bool) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let a = axis(a, x.shape.rank(), "axis")?;
    let mut dims = x.shape.0.clone();
    if keepdims {
        dims[a] = Dim::known(1);
    } else {
        dims.remove(a);
    }
    Ok(vec![ValueType::new(DType::I64, Shape(dims))])
}

/// TopK: the values and their `i64` indices, the axis `k` long (`k` from the attribute, or
/// the constant input 1).
pub(super) fn top_k(ctx: &Ctx<'_>, a: i64, k: Option<i64>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let a = axis(a, x.shape.rank(), "axis")?;
    let k = match k {
        Some(k) => k,
        None => match ctx.ints_of(1)?.as_slice() {
            &[k] => k,
            other => return Err(mismatch(format!("k must be one integer, got {other:?}"))),
        },
    };
    let mut dims = x.shape.0.clone();
    if k < 0 || dims[a].as_known().is_some_and(|n| k > n) {
        return Err(mismatch(format!(
            "k {k} must be from 0 to the {} elements along axis {a}",
            dims[a]
        )));
    }
    dims[a] = Dim::known(k);
    let shape = Shape(dims);
    Ok(vec![
        ValueType::new(x.dtype, shape.clone()),
        ValueType::new(DType::I64, shape),
    ])
}

/// ReverseSequence: the input's shape; one length per sample.
pub(super) fn reverse_sequence(
    ctx: &Ctx<'_>,
    batch_axis: usize,
    _time_axis: usize,
) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    need_rank(x, 0, 2, "rank >= 2 (time and batch)")?;
    let lens = ctx.input(1)?;
    if !lens.dtype.is_integer() || lens.shape.rank() != 1 {
        return Err(mismatch(format!(
            "sequence_lens must be one integer per sample, got {} {}",
            lens.dtype, lens.shape
        )));
    }
    let (n, b) = (&lens.shape.0[0], &x.shape.0[batch_axis]);
    if n.as_known().is_some() && b.as_known().is_some() && n != b {
        return Err(mismatch(format!(
            "sequence_lens has {n} lengths for {b} samples"
        )));
    }
    Ok(vec![ValueType::new(x.dtype, x.shape.clone())])
}
