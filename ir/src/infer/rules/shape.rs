//! Shape rules of the ops that only reshape or cut their input: Concat, Split, Slice,
//! Reshape, Expand, Unsqueeze, Squeeze and Transpose (contents folded when known).

use super::{attr_err, axis, broadcast, known, mismatch, overflow, Ctx, Result};
use crate::graph::Rebatch;
use crate::infer::{fold, rebatched, InferError, ValueType};
use crate::op::SliceRanges;
use crate::shape::{Dim, Shape};

pub(super) fn concat(ctx: &Ctx<'_>, a: i64) -> Result<Vec<ValueType>> {
    let first = ctx.input(0)?;
    let ax = axis(a, first.shape.rank(), "axis")?;
    let mut out = first.shape.0.clone();
    for slot in 1..ctx.inputs.len() {
        let t = ctx.input(slot)?;
        if t.shape.rank() != first.shape.rank() {
            return Err(InferError::Rank {
                slot,
                expected: format!("rank {}", first.shape.rank()),
                got: t.shape.clone(),
            });
        }
        for (i, (o, d)) in out.iter_mut().zip(&t.shape.0).enumerate() {
            if i == ax {
                *o = o.checked_add(d).ok_or_else(|| InferError::Unbound {
                    dim: if o.as_known().is_none() {
                        o.clone()
                    } else {
                        d.clone()
                    },
                    hint: String::new(),
                })?;
            } else if o != d {
                return Err(mismatch(format!(
                    "input {slot} has shape {} but input 0 has {} (they may differ only on axis {ax})",
                    t.shape, first.shape
                )));
            }
        }
    }
    let mut v = ValueType::new(first.dtype, Shape(out));
    v.content = fold::concat(ctx.inputs);
    Ok(vec![v])
}

pub(super) fn split(ctx: &Ctx<'_>, a: i64, sizes: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let ax = axis(a, x.shape.rank(), "axis")?;
    let total = known(&x.shape.0[ax])?;
    let n = ctx.outputs as i64;
    let sizes = match ctx.attr_or_input(sizes, 1)? {
        Some(s) => s,
        None => {
            // Equal parts, the last one smaller when the axis does not divide.
            let chunk = (total + n - 1) / n.max(1);
            (0..n)
                .map(|i| chunk.min(total - chunk * i).max(0))
                .collect()
        }
    };
    if sizes.len() as i64 != n || sizes.iter().any(|&s| s < 0) || sizes.iter().sum::<i64>() != total
    {
        return Err(attr_err(
            "split",
            format!("sizes {sizes:?} do not split {total} into {n} output(s)"),
        ));
    }
    Ok(sizes
        .iter()
        .map(|&s| {
            let mut shape = x.shape.clone();
            shape.0[ax] = Dim::known(s);
            ValueType::new(x.dtype, shape)
        })
        .collect())
}

/// Clamped slice length on one axis, following the ONNX spec.
fn slice_len(dim: &Dim, start: i64, end: i64, step: i64) -> Result<Dim> {
    if step == 0 {
        return Err(attr_err("steps", "a step of 0 is invalid".into()));
    }
    let Some(d) = dim.as_known() else {
        // The common symbolic case: the whole axis.
        if step == 1 && start == 0 && end >= i32::MAX as i64 {
            return Ok(dim.clone());
        }
        return Err(InferError::Unbound {
            dim: dim.clone(),
            hint: String::new(),
        });
    };
    let clamp = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
    let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (s, e) = if step > 0 {
        (clamp(norm(start), 0, d), clamp(norm(end), 0, d))
    } else {
        (clamp(norm(start), 0, d - 1), clamp(norm(end), -1, d - 1))
    };
    let len = if step > 0 {
        if e > s {
            (e - s + step - 1) / step
        } else {
            0
        }
    } else if s > e {
        (s - e + (-step) - 1) / (-step)
    } else {
        0
    };
    Ok(Dim::known(len))
}

pub(super) fn slice(ctx: &Ctx<'_>, ranges: &Option<SliceRanges>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let rank = x.shape.rank();
    let (starts, ends, axes, steps) = match ranges {
        Some(r) => (r.starts.clone(), r.ends.clone(), r.axes.clone(), None),
        None => (
            ctx.ints_of(1)?,
            ctx.ints_of(2)?,
            ctx.opt(3).map(|_| ctx.ints_of(3)).transpose()?,
            ctx.opt(4).map(|_| ctx.ints_of(4)).transpose()?,
        ),
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(attr_err(
            "starts",
            "starts, ends, axes and steps must have the same length".into(),
        ));
    }
    let mut out = x.shape.clone();
    let mut picks: Vec<(usize, i64, i64)> = Vec::new();
    for i in 0..starts.len() {
        let ax = axis(axes[i], rank, "axes")?;
        out.0[ax] = slice_len(&x.shape.0[ax], starts[i], ends[i], steps[i])?;
        picks.push((ax, starts[i], steps[i]));
    }
    let mut v = ValueType::new(x.dtype, out.clone());
    v.content = fold::slice(x, &picks, &out);
    Ok(vec![v])
}

pub(super) fn reshape(ctx: &Ctx<'_>, allowzero: bool) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let target = ctx.dims_of(1)?;
    // A target leading with the exported batch, reshaping a tensor that leads with the new
    // batch, is re-batched first: with an inferred entry (`[4, 16, -1]`, HF GPT-2 merging
    // its heads) the exported target would fit another batch by moving the samples into
    // the features.
    let leads_with_batch = ctx.rebatch.is_some_and(|rb| {
        x.shape.0.first() == Some(&rb.batch) && rb.batch.as_known() != Some(rb.exported)
    });
    if let (true, Some(t)) = (leads_with_batch, rebatched(&target, ctx.rebatch)) {
        if let Ok(out) = resolve_reshape(&x.shape, &t, allowzero) {
            let mut v = ValueType::new(x.dtype, out);
            v.content = x.content.clone();
            return Ok(vec![v]);
        }
    }
    let out = match resolve_reshape(&x.shape, &target, allowzero) {
        Ok(s) => s,
        Err(e) => match rebatched(&target, ctx.rebatch) {
            Some(t) => resolve_reshape(&x.shape, &t, allowzero)
                .map_err(|_| rebatch_error(&target, &x.shape, ctx.rebatch))?,
            // A fully constant target that no longer fits after re-batching bakes the
            // exported batch in somewhere other than its leading axis.
            None if ctx.rebatch.is_some() && target.iter().all(|d| d.as_known().is_some()) => {
                return Err(rebatch_error(&target, &x.shape, ctx.rebatch))
            }
            None => return Err(e),
        },
    };
    let mut v = ValueType::new(x.dtype, out);
    v.content = x.content.clone();
    Ok(vec![v])
}

fn rebatch_error(target: &[Dim], input: &Shape, rb: Option<&Rebatch>) -> InferError {
    let rb = rb
        .map(|r| format!(" after re-batching from {} to {}", r.exported, r.batch))
        .unwrap_or_default();
    mismatch(format!(
        "constant target {} does not fit the input {input}{rb}: the exported batch size is baked into this node; re-export the model with a dynamic batch axis",
        Shape(target.to_vec())
    ))
}

pub(crate) fn resolve_reshape(input: &Shape, target: &[Dim], allowzero: bool) -> Result<Shape> {
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, t) in target.iter().enumerate() {
        match t.as_known() {
            Some(-1) if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(Dim::known(1));
            }
            Some(-1) => return Err(mismatch("target has more than one -1".into())),
            Some(0) if !allowzero => out.push(input.0.get(i).cloned().ok_or_else(|| {
                mismatch(format!(
                    "target copies axis {i} (0) but the input has rank {}",
                    input.rank()
                ))
            })?),
            Some(v) if v < -1 => return Err(mismatch(format!("target has invalid size {v}"))),
            _ => out.push(t.clone()),
        }
    }
    let total = input.numel().ok_or_else(|| overflow("input size"))?;
    let known_part = Shape(out.clone())
        .numel()
        .ok_or_else(|| overflow("target size"))?;
    if let Some(i) = infer_at {
        out[i] = total.div_exact(&known_part).ok_or_else(|| {
            mismatch(format!(
                "cannot reshape {input} ({total} elements) to {}",
                Shape(target.to_vec())
            ))
        })?;
    } else if total != known_part {
        return Err(mismatch(format!(
            "cannot reshape {input} ({total} elements) to {}",
            Shape(target.to_vec())
        )));
    }
    Ok(Shape(out))
}

pub(super) fn expand(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let target = ctx.dims_of(1)?;
    let attempt = |t: &[Dim]| broadcast(&[&x.shape, &Shape(t.to_vec())]);
    let out = match attempt(&target) {
        Ok(s) => s,
        Err(e) => match rebatched(&target, ctx.rebatch) {
            Some(t) => attempt(&t)?,
            None => return Err(e),
        },
    };
    let mut v = ValueType::new(x.dtype, out.clone());
    v.content = fold::expand(x, &out);
    Ok(vec![v])
}

pub(super) fn unsqueeze(ctx: &Ctx<'_>, axes: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let axes = ctx
        .attr_or_input(axes, 1)?
        .ok_or(InferError::MissingInput { slot: 1 })?;
    let rank = x.shape.rank() + axes.len();
    let mut norm: Vec<usize> = axes
        .iter()
        .map(|&a| axis(a, rank, "axes"))
        .collect::<Result<_>>()?;
    norm.sort_unstable();
    if norm.windows(2).any(|w| w[0] == w[1]) {
        return Err(attr_err("axes", format!("{axes:?} repeats an axis")));
    }
    let mut out = Vec::with_capacity(rank);
    let mut src = x.shape.0.iter();
    for i in 0..rank {
        if norm.binary_search(&i).is_ok() {
            out.push(Dim::known(1));
        } else if let Some(d) = src.next() {
            out.push(d.clone());
        }
    }
    let mut v = ValueType::new(x.dtype, Shape(out));
    v.content = x.content.clone();
    Ok(vec![v])
}

pub(super) fn squeeze(ctx: &Ctx<'_>, axes: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let rank = x.shape.rank();
    let axes: Vec<usize> = match ctx.attr_or_input(axes, 1)? {
        Some(a) => a
            .iter()
            .map(|&a| axis(a, rank, "axes"))
            .collect::<Result<_>>()?,
        None => (0..rank)
            .filter(|&i| x.shape.0[i].as_known() == Some(1))
            .collect(),
    };
    for &a in &axes {
        if x.shape.0[a].as_known() != Some(1) {
            return Err(attr_err(
                "axes",
                format!("axis {a} has size {}, not 1", x.shape.0[a]),
            ));
        }
    }
    let out = (0..rank)
        .filter(|i| !axes.contains(i))
        .map(|i| x.shape.0[i].clone())
        .collect();
    let mut v = ValueType::new(x.dtype, Shape(out));
    v.content = x.content.clone();
    Ok(vec![v])
}

pub(super) fn transpose(ctx: &Ctx<'_>, perm: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let rank = x.shape.rank();
    let perm: Vec<usize> = match perm {
        Some(p) => p
            .iter()
            .map(|&a| axis(a, rank, "perm"))
            .collect::<Result<_>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen = vec![false; rank];
    for &p in &perm {
        seen[p] = true;
    }
    if perm.len() != rank || seen.contains(&false) {
        return Err(attr_err(
            "perm",
            format!("{perm:?} is not a permutation of {rank} axes"),
        ));
    }
    let mut v = ValueType::new(
        x.dtype,
        Shape(perm.iter().map(|&p| x.shape.0[p].clone()).collect()),
    );
    v.content = fold::transpose(x, &perm);
    Ok(vec![v])
}
