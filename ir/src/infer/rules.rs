//! Per-operator shape rules (ONNX spec semantics, numpy broadcasting).

use super::fold;
use super::{rebatched, InferError, Scalar, ValueType};
use crate::dtype::DType;
use crate::graph::Rebatch;
use crate::op::*;
use crate::shape::{Dim, Shape};

mod control;
mod indexing;
mod rearrange;
mod recurrent;
mod resize;
mod signal;

type Result<T> = std::result::Result<T, InferError>;

/// What a rule sees of its node.
pub(crate) struct Ctx<'a> {
    pub op: &'a Op,
    pub inputs: &'a [Option<&'a ValueType>],
    pub outputs: usize,
    pub rebatch: Option<&'a Rebatch>,
    /// Explains why input `slot` has no content (external data, …).
    pub constant_detail: &'a dyn Fn(usize) -> String,
}

impl Ctx<'_> {
    fn input(&self, slot: usize) -> Result<&ValueType> {
        self.inputs
            .get(slot)
            .copied()
            .flatten()
            .ok_or(InferError::MissingInput { slot })
    }

    fn opt(&self, slot: usize) -> Option<&ValueType> {
        self.inputs.get(slot).copied().flatten()
    }

    /// The content of a constant input.
    fn content_of(&self, slot: usize) -> Result<&[Scalar]> {
        let t = self.input(slot)?;
        t.content.as_deref().ok_or_else(|| InferError::NotConstant {
            slot,
            detail: (self.constant_detail)(slot),
        })
    }

    /// The content of a constant input as dimensions.
    fn dims_of(&self, slot: usize) -> Result<Vec<Dim>> {
        self.content_of(slot)?
            .iter()
            .map(|s| s.as_dim())
            .collect::<Option<Vec<_>>>()
            .ok_or(InferError::Type {
                reason: format!("input {slot} must hold integers"),
            })
    }

    /// The content of a constant input as numbers.
    fn floats_of(&self, slot: usize) -> Result<Vec<f64>> {
        self.content_of(slot)?
            .iter()
            .map(|s| s.as_f64())
            .collect::<Option<Vec<_>>>()
            .ok_or(InferError::Type {
                reason: format!("input {slot} must hold numbers"),
            })
    }

    /// The content of a constant input as known integers.
    fn ints_of(&self, slot: usize) -> Result<Vec<i64>> {
        self.dims_of(slot)?.iter().map(known).collect()
    }

    /// An integer list from the attribute when present, else from input `slot`
    /// (`None` when neither is given).
    fn attr_or_input(&self, attr: &Option<Vec<i64>>, slot: usize) -> Result<Option<Vec<i64>>> {
        match attr {
            Some(v) => Ok(Some(v.clone())),
            None if self.opt(slot).is_some() => Ok(Some(self.ints_of(slot)?)),
            None => Ok(None),
        }
    }
}

fn known(d: &Dim) -> Result<i64> {
    d.as_known().ok_or_else(|| InferError::Unbound {
        dim: d.clone(),
        hint: String::new(),
    })
}

fn mismatch(reason: String) -> InferError {
    InferError::Mismatch { reason }
}

fn overflow(what: &str) -> InferError {
    InferError::Overflow {
        what: what.to_owned(),
    }
}

fn attr_err(attr: &str, reason: String) -> InferError {
    InferError::Attribute {
        attr: attr.to_owned(),
        reason,
    }
}

/// Normalizes a possibly negative axis against `rank`.
pub(crate) fn axis(a: i64, rank: usize, attr: &str) -> Result<usize> {
    let r = rank as i64;
    let n = if a < 0 { a + r } else { a };
    if (0..r).contains(&n) {
        Ok(n as usize)
    } else {
        Err(attr_err(
            attr,
            format!("axis {a} is out of range for rank {rank}"),
        ))
    }
}

/// numpy broadcasting of several shapes.
pub(crate) fn broadcast(shapes: &[&Shape]) -> Result<Shape> {
    let rank = shapes.iter().map(|s| s.rank()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let mut dim: Option<Dim> = None;
        for s in shapes {
            let Some(d) = (i + s.rank()).checked_sub(rank).map(|j| &s.0[j]) else {
                continue;
            };
            dim = Some(match dim {
                None => d.clone(),
                Some(cur) if cur == *d => cur,
                Some(cur) if cur.as_known() == Some(1) => d.clone(),
                Some(cur) if d.as_known() == Some(1) => cur,
                // A symbol against a known size: the size wins (the symbol must equal it or 1).
                Some(cur) if cur.as_known().is_none() && d.as_known().is_some() => d.clone(),
                Some(cur) if d.as_known().is_none() => cur,
                Some(cur) => {
                    let all: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
                    return Err(mismatch(format!(
                        "shapes {} cannot be broadcast together (axis {i}: {cur} vs {d})",
                        all.join(" and ")
                    )));
                }
            });
        }
        out.push(dim.unwrap_or_else(|| Dim::known(1)));
    }
    Ok(Shape(out))
}

fn same(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    Ok(vec![ValueType::new(x.dtype, x.shape.clone())])
}

fn need_rank(t: &ValueType, slot: usize, min: usize, words: &str) -> Result<()> {
    if t.shape.rank() < min {
        return Err(InferError::Rank {
            slot,
            expected: words.into(),
            got: t.shape.clone(),
        });
    }
    Ok(())
}

fn need_float(t: &ValueType, slot: usize) -> Result<()> {
    if !t.dtype.is_float() {
        return Err(InferError::Type {
            reason: format!("input {slot} must be floating-point, got {}", t.dtype),
        });
    }
    Ok(())
}

/// Per-axis attribute list: absent → `default`, else exactly `k` values.
fn per_axis(v: &Option<Vec<u64>>, k: usize, default: u64, attr: &str) -> Result<Vec<u64>> {
    match v {
        None => Ok(vec![default; k]),
        Some(v) if v.len() == k => Ok(v.clone()),
        Some(v) => Err(attr_err(
            attr,
            format!("expected {k} values, got {}", v.len()),
        )),
    }
}

/// Begin and end pads per spatial axis, after `auto_pad`.
fn pads(
    padding: &Padding,
    input: &[i64],
    kernel: &[u64],
    strides: &[u64],
    dilations: &[u64],
) -> Result<Vec<(i64, i64)>> {
    let k = input.len();
    match padding {
        Padding::Explicit(p) if p.is_empty() => Ok(vec![(0, 0); k]),
        Padding::Explicit(p) if p.len() == 2 * k => {
            Ok((0..k).map(|i| (p[i] as i64, p[i + k] as i64)).collect())
        }
        Padding::Explicit(p) => Err(attr_err(
            "pads",
            format!("expected {} values, got {}", 2 * k, p.len()),
        )),
        Padding::Valid => Ok(vec![(0, 0); k]),
        Padding::SameUpper | Padding::SameLower => Ok((0..k)
            .map(|i| {
                let s = strides[i] as i64;
                let out = (input[i] + s - 1) / s;
                let eff = (kernel[i] as i64 - 1) * dilations[i] as i64 + 1;
                let total = ((out - 1) * s + eff - input[i]).max(0);
                if matches!(padding, Padding::SameUpper) {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            })
            .collect()),
    }
}

/// Output size of a sliding window on one axis.
fn window(
    input: i64,
    kernel: u64,
    stride: u64,
    dilation: u64,
    pad: (i64, i64),
    ceil: bool,
) -> Result<i64> {
    let eff = (kernel as i64 - 1)
        .checked_mul(dilation as i64)
        .and_then(|e| e.checked_add(1))
        .ok_or_else(|| overflow("kernel extent"))?;
    let span = input
        .checked_add(pad.0)
        .and_then(|x| x.checked_add(pad.1))
        .and_then(|x| x.checked_sub(eff))
        .ok_or_else(|| overflow("window extent"))?;
    if span < 0 {
        return Err(mismatch(format!(
            "window of extent {eff} does not fit an input of size {input} padded by {}+{}",
            pad.0, pad.1
        )));
    }
    let s = stride as i64;
    let mut out = if ceil {
        (span + s - 1) / s + 1
    } else {
        span / s + 1
    };
    // In ceil mode the last window must start inside the input or its left padding.
    if ceil && (out - 1) * s >= input + pad.0 {
        out -= 1;
    }
    Ok(out)
}

fn spatial(shape: &Shape, from: usize) -> Result<Vec<i64>> {
    shape.0[from..].iter().map(known).collect()
}

fn conv(ctx: &Ctx<'_>, c: &Conv) -> Result<Vec<ValueType>> {
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    need_rank(x, 0, 3, "rank >= 3 (N, C, spatial...)")?;
    need_float(x, 0)?;
    if w.shape.rank() != x.shape.rank() {
        return Err(InferError::Rank {
            slot: 1,
            expected: format!("rank {}", x.shape.rank()),
            got: w.shape.clone(),
        });
    }
    let k = x.shape.rank() - 2;
    let kernel: Vec<u64> = spatial(&w.shape, 2)?.iter().map(|&v| v as u64).collect();
    if let Some(attr) = &c.kernel {
        if *attr != kernel {
            return Err(attr_err(
                "kernel_shape",
                format!("{attr:?} does not match the weight's {kernel:?}"),
            ));
        }
    }
    let cin = &x.shape.0[1];
    let per_group = w.shape.0[1]
        .checked_mul(&Dim::known(c.group as i64))
        .ok_or_else(|| overflow("channels"))?;
    if cin.as_known().is_some() && *cin != per_group {
        return Err(mismatch(format!(
            "input has {cin} channels but the weight {} expects {} per group x {} group(s)",
            w.shape, w.shape.0[1], c.group
        )));
    }
    let m = known(&w.shape.0[0])?;
    if m % c.group as i64 != 0 {
        return Err(attr_err(
            "group",
            format!("{} does not divide the {m} output channels", c.group),
        ));
    }
    if let Some(b) = ctx.opt(2) {
        if b.shape.0 != [Dim::known(m)] {
            return Err(mismatch(format!(
                "bias has shape {} but there are {m} output channels",
                b.shape
            )));
        }
    }
    let strides = per_axis(&c.strides, k, 1, "strides")?;
    let dilations = per_axis(&c.dilations, k, 1, "dilations")?;
    let input = spatial(&x.shape, 2)?;
    let pads = pads(&c.padding, &input, &kernel, &strides, &dilations)?;
    let mut out = vec![x.shape.0[0].clone(), Dim::known(m)];
    for i in 0..k {
        out.push(Dim::known(window(
            input[i],
            kernel[i],
            strides[i],
            dilations[i],
            pads[i],
            false,
        )?));
    }
    Ok(vec![ValueType::new(x.dtype, Shape(out))])
}

fn conv_transpose(ctx: &Ctx<'_>, ct: &ConvTranspose) -> Result<Vec<ValueType>> {
    let c = &ct.conv;
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    need_rank(x, 0, 3, "rank >= 3 (N, C, spatial...)")?;
    if w.shape.rank() != x.shape.rank() {
        return Err(InferError::Rank {
            slot: 1,
            expected: format!("rank {}", x.shape.rank()),
            got: w.shape.clone(),
        });
    }
    let k = x.shape.rank() - 2;
    if x.shape.0[1].as_known().is_some() && x.shape.0[1] != w.shape.0[0] {
        return Err(mismatch(format!(
            "input has {} channels but the weight {} expects {}",
            x.shape.0[1], w.shape, w.shape.0[0]
        )));
    }
    let m = known(&w.shape.0[1])?
        .checked_mul(c.group as i64)
        .ok_or_else(|| overflow("channels"))?;
    let kernel: Vec<u64> = spatial(&w.shape, 2)?.iter().map(|&v| v as u64).collect();
    let strides = per_axis(&c.strides, k, 1, "strides")?;
    let dilations = per_axis(&c.dilations, k, 1, "dilations")?;
    let out_pad = per_axis(&ct.output_padding, k, 0, "output_padding")?;
    let input = spatial(&x.shape, 2)?;
    let mut out = vec![x.shape.0[0].clone(), Dim::known(m)];
    if let Some(shape) = &ct.output_shape {
        let tail = &shape[shape.len().saturating_sub(k)..];
        if tail.len() != k {
            return Err(attr_err(
                "output_shape",
                format!("expected {k} values, got {}", shape.len()),
            ));
        }
        out.extend(tail.iter().map(|&v| Dim::known(v as i64)));
    } else {
        for i in 0..k {
            let (s, d, kk) = (strides[i] as i64, dilations[i] as i64, kernel[i] as i64);
            let full = s * (input[i] - 1) + out_pad[i] as i64 + (kk - 1) * d + 1;
            let size = match &c.padding {
                Padding::SameUpper | Padding::SameLower => input[i] * s,
                Padding::Valid => full,
                Padding::Explicit(p) if p.is_empty() => full,
                Padding::Explicit(p) if p.len() == 2 * k => full - p[i] as i64 - p[i + k] as i64,
                Padding::Explicit(p) => {
                    return Err(attr_err(
                        "pads",
                        format!("expected {} values, got {}", 2 * k, p.len()),
                    ))
                }
            };
            if size < 1 {
                return Err(mismatch(format!(
                    "output size {size} on spatial axis {i} is not positive"
                )));
            }
            out.push(Dim::known(size));
        }
    }
    Ok(vec![ValueType::new(x.dtype, Shape(out))])
}

fn pool(ctx: &Ctx<'_>, p: &Pool) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    need_rank(x, 0, 3, "rank >= 3 (N, C, spatial...)")?;
    let k = x.shape.rank() - 2;
    if p.kernel.len() != k {
        return Err(attr_err(
            "kernel_shape",
            format!("expected {k} values, got {}", p.kernel.len()),
        ));
    }
    let strides = per_axis(&p.strides, k, 1, "strides")?;
    let dilations = per_axis(&p.dilations, k, 1, "dilations")?;
    let input = spatial(&x.shape, 2)?;
    let pads = pads(&p.padding, &input, &p.kernel, &strides, &dilations)?;
    let mut out = x.shape.0[..2].to_vec();
    for i in 0..k {
        out.push(Dim::known(window(
            input[i],
            p.kernel[i],
            strides[i],
            dilations[i],
            pads[i],
            p.ceil_mode,
        )?));
    }
    let mut outs = vec![ValueType::new(x.dtype, Shape(out.clone()))];
    if ctx.outputs > 1 {
        outs.push(ValueType::new(DType::I64, Shape(out)));
    }
    Ok(outs)
}

fn gemm(ctx: &Ctx<'_>, g: &Gemm) -> Result<Vec<ValueType>> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    for (slot, t) in [(0, a), (1, b)] {
        if t.shape.rank() != 2 {
            return Err(InferError::Rank {
                slot,
                expected: "rank 2".into(),
                got: t.shape.clone(),
            });
        }
    }
    let (m, ka) = if g.trans_a {
        (&a.shape.0[1], &a.shape.0[0])
    } else {
        (&a.shape.0[0], &a.shape.0[1])
    };
    let (kb, n) = if g.trans_b {
        (&b.shape.0[1], &b.shape.0[0])
    } else {
        (&b.shape.0[0], &b.shape.0[1])
    };
    if ka != kb {
        return Err(mismatch(format!(
            "inner dimensions differ: A{} (transA={}) has {ka}, B{} (transB={}) has {kb}",
            a.shape, g.trans_a as u8, b.shape, g.trans_b as u8
        )));
    }
    let out = Shape(vec![m.clone(), n.clone()]);
    if let Some(c) = ctx.opt(2) {
        let merged = broadcast(&[&out, &c.shape])?;
        if merged != out {
            return Err(mismatch(format!(
                "C of shape {} does not broadcast to the output {out}",
                c.shape
            )));
        }
    }
    Ok(vec![ValueType::new(a.dtype, out)])
}

fn matmul(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    for (slot, t) in [(0, a), (1, b)] {
        if t.shape.rank() == 0 {
            return Err(InferError::Rank {
                slot,
                expected: "rank >= 1".into(),
                got: t.shape.clone(),
            });
        }
    }
    let mut sa = a.shape.0.clone();
    let mut sb = b.shape.0.clone();
    let (va, vb) = (sa.len() == 1, sb.len() == 1);
    if va {
        sa.insert(0, Dim::known(1));
    }
    if vb {
        sb.push(Dim::known(1));
    }
    let (ka, kb) = (&sa[sa.len() - 1], &sb[sb.len() - 2]);
    if ka != kb && ka.as_known().is_some() && kb.as_known().is_some() {
        return Err(mismatch(format!(
            "inner dimensions differ: {} x {} ({ka} vs {kb})",
            a.shape, b.shape
        )));
    }
    let batch = broadcast(&[
        &Shape(sa[..sa.len() - 2].to_vec()),
        &Shape(sb[..sb.len() - 2].to_vec()),
    ])?;
    let mut out = batch.0;
    if !va {
        out.push(sa[sa.len() - 2].clone());
    }
    if !vb {
        out.push(sb[sb.len() - 1].clone());
    }
    Ok(vec![ValueType::new(a.dtype, Shape(out))])
}

fn concat(ctx: &Ctx<'_>, a: i64) -> Result<Vec<ValueType>> {
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

fn split(ctx: &Ctx<'_>, a: i64, sizes: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
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

fn slice(ctx: &Ctx<'_>, ranges: &Option<SliceRanges>) -> Result<Vec<ValueType>> {
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

fn reshape(ctx: &Ctx<'_>, allowzero: bool) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let target = ctx.dims_of(1)?;
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

fn expand(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
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

fn unsqueeze(ctx: &Ctx<'_>, axes: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
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

fn squeeze(ctx: &Ctx<'_>, axes: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
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

fn transpose(ctx: &Ctx<'_>, perm: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
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

fn gather(ctx: &Ctx<'_>, a: i64) -> Result<Vec<ValueType>> {
    let (x, idx) = (ctx.input(0)?, ctx.input(1)?);
    if !idx.dtype.is_integer() {
        return Err(InferError::Type {
            reason: format!("indices must be integers, got {}", idx.dtype),
        });
    }
    let ax = axis(a, x.shape.rank(), "axis")?;
    let mut out = x.shape.0[..ax].to_vec();
    out.extend(idx.shape.0.iter().cloned());
    out.extend(x.shape.0[ax + 1..].iter().cloned());
    let mut v = ValueType::new(x.dtype, Shape(out));
    v.content = fold::gather(x, idx, ax)?;
    Ok(vec![v])
}

fn reduce(
    ctx: &Ctx<'_>,
    kind: ReduceKind,
    axes: &Option<Vec<i64>>,
    keepdims: bool,
    noop: bool,
) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let rank = x.shape.rank();
    let axes: Vec<usize> = match ctx.attr_or_input(axes, 1)? {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|&a| axis(a, rank, "axes"))
            .collect::<Result<_>>()?,
        _ if noop => return same(ctx),
        _ => (0..rank).collect(),
    };
    let mut out = Vec::new();
    for (i, d) in x.shape.0.iter().enumerate() {
        if !axes.contains(&i) {
            out.push(d.clone());
        } else if keepdims {
            out.push(Dim::known(1));
        }
    }
    let mut v = ValueType::new(x.dtype, Shape(out));
    if axes == [0] {
        v.content = fold::reduce(kind, x);
    }
    Ok(vec![v])
}

fn pad(ctx: &Ctx<'_>, pads: &Option<Vec<i64>>) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    let rank = x.shape.rank();
    let pads = ctx
        .attr_or_input(pads, 1)?
        .ok_or(InferError::MissingInput { slot: 1 })?;
    let axes: Vec<usize> = match ctx.opt(3) {
        Some(_) => ctx
            .ints_of(3)?
            .iter()
            .map(|&a| axis(a, rank, "axes"))
            .collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(attr_err(
            "pads",
            format!("expected {} values, got {}", 2 * axes.len(), pads.len()),
        ));
    }
    let mut out = x.shape.clone();
    let n = axes.len();
    for (i, &ax) in axes.iter().enumerate() {
        let extra = Dim::known(pads[i] + pads[i + n]);
        out.0[ax] = out.0[ax]
            .checked_add(&extra)
            .ok_or_else(|| InferError::Unbound {
                dim: out.0[ax].clone(),
                hint: String::new(),
            })?;
        if out.0[ax].as_known().is_some_and(|v| v < 0) {
            return Err(attr_err("pads", format!("make axis {ax} negative")));
        }
    }
    Ok(vec![ValueType::new(x.dtype, out)])
}

fn range(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let t = ctx.input(0)?;
    let scalar = |slot| -> Result<f64> {
        let c = ctx
            .input(slot)?
            .content
            .as_ref()
            .ok_or_else(|| InferError::NotConstant {
                slot,
                detail: (ctx.constant_detail)(slot),
            })?;
        match c.first().map(|s| s.as_f64()) {
            Some(Some(v)) if c.len() == 1 => Ok(v),
            Some(None) => Err(InferError::Unbound {
                dim: c[0].as_dim().unwrap_or(Dim::known(0)),
                hint: String::new(),
            }),
            _ => Err(mismatch(format!("input {slot} must be a scalar"))),
        }
    };
    // `arange(0, n)` over a symbolic n (exporters index the batch this way): length n.
    let limit_dim = ctx.input(1)?.content.as_ref().and_then(|c| match &**c {
        [s] => s.as_dim().filter(|d| d.as_known().is_none()),
        _ => None,
    });
    if let Some(limit) = limit_dim {
        let (start, delta) = (ctx.ints_of(0)?, ctx.ints_of(2)?);
        if start.as_slice() == [0] && delta.as_slice() == [1] && t.dtype.is_integer() {
            return Ok(vec![ValueType::new(t.dtype, Shape(vec![limit]))]);
        }
    }
    let (start, limit, delta) = (scalar(0)?, scalar(1)?, scalar(2)?);
    if delta == 0.0 {
        return Err(mismatch("delta is 0".into()));
    }
    let n = ((limit - start) / delta).ceil().max(0.0);
    if n > 1e12 {
        return Err(overflow("Range length"));
    }
    let n = n as i64;
    let mut v = ValueType::new(t.dtype, Shape::known(&[n]));
    if n as u64 <= super::MAX_FOLD_ELEMENTS {
        v.content = Some(
            (0..n)
                .map(|i| {
                    let x = start + i as f64 * delta;
                    if t.dtype.is_integer() {
                        Scalar::Int(Dim::known(x as i64))
                    } else {
                        Scalar::Float(x)
                    }
                })
                .collect(),
        );
    }
    Ok(vec![v])
}

fn constant_of_shape(ctx: &Ctx<'_>, value: f64, dtype: DType) -> Result<Vec<ValueType>> {
    let shape = Shape(ctx.dims_of(0)?);
    if shape.0.iter().any(|d| d.as_known().is_some_and(|v| v < 0)) {
        return Err(mismatch(format!("shape {shape} has a negative dimension")));
    }
    let mut v = ValueType::new(dtype, shape.clone());
    if let Some(n) = shape
        .known_numel()
        .filter(|&n| n <= super::MAX_FOLD_ELEMENTS)
    {
        let s = if dtype.is_integer() {
            Scalar::Int(Dim::known(value as i64))
        } else {
            Scalar::Float(value)
        };
        v.content = Some(vec![s; n as usize].into());
    }
    Ok(vec![v])
}

fn norm_layer(ctx: &Ctx<'_>, op: &Op) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    need_float(x, 0)?;
    match op {
        Op::GroupNorm { groups, .. } => {
            need_rank(x, 0, 2, "rank >= 2 (N, C, ...)")?;
            let c = &x.shape.0[1];
            if c.as_known().is_some_and(|c| c % *groups as i64 != 0) {
                return Err(mismatch(format!(
                    "{c} channels do not divide into {groups} groups"
                )));
            }
            // Per channel (opset 21) or per group (opset 18).
            for slot in 1..3 {
                let t = ctx.input(slot)?;
                let per = &t.shape.0;
                if per.len() != 1 || (per[0] != *c && per[0].as_known() != Some(*groups as i64)) {
                    return Err(mismatch(format!(
                        "input {slot} has shape {} where {c} channels or {groups} groups are \
                         needed",
                        t.shape
                    )));
                }
            }
            Ok(vec![ValueType::new(x.dtype, x.shape.clone())])
        }
        Op::BatchNorm { .. } | Op::InstanceNorm { .. } => {
            need_rank(x, 0, 2, "rank >= 2 (N, C, ...)")?;
            let c = &x.shape.0[1];
            // BatchNormalization: scale, bias, mean, variance; InstanceNormalization: scale
            // and bias.
            let per_channel = if matches!(op, Op::BatchNorm { .. }) {
                5
            } else {
                3
            };
            for slot in 1..per_channel {
                let t = ctx.input(slot)?;
                if t.shape.0 != [c.clone()] {
                    return Err(mismatch(format!(
                        "input {slot} has shape {} but the input has {c} channels",
                        t.shape
                    )));
                }
            }
            let mut outs = vec![ValueType::new(x.dtype, x.shape.clone())];
            for _ in 1..ctx.outputs {
                outs.push(ValueType::new(x.dtype, Shape(vec![c.clone()])));
            }
            Ok(outs)
        }
        Op::LayerNorm { axis: a, .. } => {
            let ax = axis(*a, x.shape.rank(), "axis")?;
            let normalized = Shape(x.shape.0[ax..].to_vec());
            let scale = ctx.input(1)?;
            if broadcast(&[&normalized, &scale.shape])? != normalized {
                return Err(mismatch(format!(
                    "scale of shape {} does not broadcast to the normalized axes {normalized}",
                    scale.shape
                )));
            }
            let mut stats = x.shape.clone();
            for d in &mut stats.0[ax..] {
                *d = Dim::known(1);
            }
            let mut outs = vec![ValueType::new(x.dtype, x.shape.clone())];
            for _ in 1..ctx.outputs {
                outs.push(ValueType::new(DType::F32, stats.clone()));
            }
            Ok(outs)
        }
        _ => {
            need_rank(x, 0, 3, "rank >= 3 (N, C, spatial...)")?;
            same(ctx)
        }
    }
}

fn elementwise(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let present: Vec<&ValueType> = ctx.inputs.iter().flatten().copied().collect();
    if present.is_empty() {
        return Err(InferError::MissingInput { slot: 0 });
    }
    let shapes: Vec<&Shape> = present.iter().map(|t| &t.shape).collect();
    let out = broadcast(&shapes)?;
    let dtype = match ctx.op {
        Op::Binary(b) if b.is_boolean() => DType::Bool,
        Op::Where => ctx.input(1)?.dtype,
        _ => present[0].dtype,
    };
    if let Op::Binary(b) = ctx.op {
        let (l, r) = (ctx.input(0)?, ctx.input(1)?);
        if l.dtype != r.dtype && *b != Binary::Pow {
            return Err(InferError::Type {
                reason: format!(
                    "operands have different element types ({} and {})",
                    l.dtype, r.dtype
                ),
            });
        }
        if *b == Binary::Mod && l.dtype.is_float() {
            return Err(InferError::Type {
                reason: format!(
                    "Mod of {} operands needs the attribute fmod=1 (fmod=0 is for integers)",
                    l.dtype
                ),
            });
        }
    }
    let mut v = ValueType::new(dtype, out.clone());
    v.content = fold::elementwise(ctx.op, ctx.inputs, &out);
    Ok(vec![v])
}

/// Infers the output types of one (non-source) node.
pub(crate) fn infer_node(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    match ctx.op {
        Op::Input | Op::Constant { .. } => Err(InferError::Type {
            reason: "sources are typed by the importer".into(),
        }),
        Op::Conv(c) => conv(ctx, c),
        Op::ConvTranspose(c) => conv_transpose(ctx, c),
        Op::Gemm(g) => gemm(ctx, g),
        Op::MatMul => matmul(ctx),
        Op::Unary(Unary::Not) => {
            let x = ctx.input(0)?;
            if x.dtype != DType::Bool {
                return Err(InferError::Type {
                    reason: format!("Not needs a boolean input, got {}", x.dtype),
                });
            }
            let mut out = same(ctx)?;
            out[0].content = x.content.as_deref().and_then(|c| {
                c.iter()
                    .map(|s| Some(Scalar::Int(Dim::known(i64::from(s.as_i64()? == 0)))))
                    .collect()
            });
            Ok(out)
        }
        // Defined on signed integers too.
        Op::Unary(u @ (Unary::Neg | Unary::Abs | Unary::Sign)) => {
            let mut out = same(ctx)?;
            out[0].content = ctx
                .input(0)?
                .content
                .as_deref()
                .and_then(|c| fold::sign_op(*u, c));
            Ok(out)
        }
        Op::Unary(_) => {
            let x = ctx.input(0)?;
            need_float(x, 0)?;
            same(ctx)
        }
        // Clip is defined on integers too (opset 12).
        Op::Clip { .. } => same(ctx),
        Op::Binary(_) | Op::Variadic(_) | Op::Where => elementwise(ctx),
        Op::Softmax { axis: a, .. } => {
            let x = ctx.input(0)?;
            axis(*a, x.shape.rank(), "axis")?;
            same(ctx)
        }
        Op::Pool(p) => pool(ctx, p),
        Op::GlobalPool(_) => {
            let x = ctx.input(0)?;
            need_rank(x, 0, 3, "rank >= 3 (N, C, spatial...)")?;
            let mut out = x.shape.0[..2].to_vec();
            out.extend(std::iter::repeat_n(Dim::known(1), x.shape.rank() - 2));
            Ok(vec![ValueType::new(x.dtype, Shape(out))])
        }
        op @ (Op::BatchNorm { .. }
        | Op::LayerNorm { .. }
        | Op::InstanceNorm { .. }
        | Op::GroupNorm { .. }
        | Op::Lrn { .. }) => norm_layer(ctx, op),
        Op::ReverseSequence {
            batch_axis,
            time_axis,
        } => rearrange::reverse_sequence(ctx, *batch_axis, *time_axis),
        Op::Concat { axis } => concat(ctx, *axis),
        Op::Split { axis, sizes } => split(ctx, *axis, sizes),
        Op::Slice { ranges } => slice(ctx, ranges),
        Op::Flatten { axis: a } => {
            let x = ctx.input(0)?;
            let r = x.shape.rank() as i64;
            let ax = if *a < 0 { a + r } else { *a };
            if !(0..=r).contains(&ax) {
                return Err(attr_err(
                    "axis",
                    format!("axis {a} is out of range for rank {r}"),
                ));
            }
            let outer = Shape(x.shape.0[..ax as usize].to_vec())
                .numel()
                .ok_or_else(|| overflow("Flatten"))?;
            let inner = Shape(x.shape.0[ax as usize..].to_vec())
                .numel()
                .ok_or_else(|| overflow("Flatten"))?;
            Ok(vec![ValueType::new(x.dtype, Shape(vec![outer, inner]))])
        }
        Op::Reshape { allowzero } => reshape(ctx, *allowzero),
        Op::Transpose { perm } => transpose(ctx, perm),
        Op::Squeeze { axes } => squeeze(ctx, axes),
        Op::Unsqueeze { axes } => unsqueeze(ctx, axes),
        Op::Gather { axis } => gather(ctx, *axis),
        Op::Shape { start, end } => {
            let x = ctx.input(0)?;
            let r = x.shape.rank() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (s, e) = (clamp(*start), clamp(end.unwrap_or(r)));
            let dims: Vec<Dim> = if s < e {
                x.shape.0[s..e].to_vec()
            } else {
                Vec::new()
            };
            let mut v = ValueType::new(DType::I64, Shape::known(&[dims.len() as i64]));
            v.content = Some(dims.into_iter().map(Scalar::Int).collect());
            Ok(vec![v])
        }
        Op::ConstantOfShape { value, dtype } => constant_of_shape(ctx, *value, *dtype),
        Op::Range => range(ctx),
        Op::Cast { to } => {
            let x = ctx.input(0)?;
            let mut v = ValueType::new(*to, x.shape.clone());
            v.content = x.content.as_ref().and_then(|c| fold::cast(c, *to));
            Ok(vec![v])
        }
        Op::Dropout { .. } => {
            let x = ctx.input(0)?;
            let mut outs = vec![ValueType::new(x.dtype, x.shape.clone())];
            if ctx.outputs > 1 {
                outs.push(ValueType::new(DType::Bool, x.shape.clone()));
            }
            Ok(outs)
        }
        Op::Identity => {
            let x = ctx.input(0)?;
            Ok(vec![x.clone()])
        }
        Op::Reduce {
            kind,
            axes,
            keepdims,
            noop_with_empty_axes,
        } => reduce(ctx, *kind, axes, *keepdims, *noop_with_empty_axes),
        Op::Pad { pads, .. } => pad(ctx, pads),
        Op::Expand => expand(ctx),
        Op::Trilu { .. } => {
            let x = ctx.input(0)?;
            need_rank(x, 0, 2, "rank >= 2")?;
            same(ctx)
        }
        Op::Resize(r) => resize::resize(ctx, r),
        Op::Recurrent(r) => recurrent::recurrent(ctx, r),
        Op::Size => indexing::size(ctx),
        Op::GatherElements { axis } => indexing::gather_elements(ctx, *axis),
        Op::GatherNd { batch_dims } => indexing::gather_nd(ctx, *batch_dims),
        Op::ScatterElements { axis, .. } => indexing::scatter_elements(ctx, *axis),
        Op::ScatterNd { .. } => indexing::scatter_nd(ctx),
        Op::CumSum { .. } => indexing::cumsum(ctx),
        Op::Einsum(e) => indexing::einsum(ctx, e),
        Op::Stft { onesided } => signal::stft(ctx, *onesided),
        Op::Tile => rearrange::tile(ctx),
        Op::DepthToSpace { blocksize, .. } => rearrange::depth_to_space(ctx, *blocksize),
        Op::SpaceToDepth { blocksize } => rearrange::space_to_depth(ctx, *blocksize),
        Op::ArgExtreme { axis, keepdims, .. } => rearrange::arg_extreme(ctx, *axis, *keepdims),
        // Binding inlines every If whose condition folds and unrolls every Loop whose trip
        // count does ([`crate::bind`]): one still here depends on run-time values.
        Op::If(_) => control::unresolved_if(ctx),
        Op::Loop(_) => control::unresolved_loop(ctx),
    }
}
