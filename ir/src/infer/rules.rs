//! Per-operator shape rules (ONNX spec semantics, numpy broadcasting).

use super::fold;
use super::{InferError, Scalar, ValueType};
use crate::dtype::DType;
use crate::graph::Rebatch;
use crate::op::*;
use crate::shape::{Dim, Shape};

mod control;
mod indexing;
mod rearrange;
mod recurrent;
mod resize;
mod shape;
mod signal;
mod window;

use shape::{concat, expand, reshape, slice, split, squeeze, transpose, unsqueeze};
use window::{conv, conv_transpose, pool};

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
        Op::Unary(Unary::IsNaN | Unary::IsInf { .. }) => {
            let x = ctx.input(0)?;
            need_float(x, 0)?;
            Ok(vec![ValueType::new(DType::Bool, x.shape.clone())])
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
        Op::TopK { axis, k, .. } => rearrange::top_k(ctx, *axis, *k),
        // Binding inlines every If whose condition folds and unrolls every Loop whose trip
        // count does ([`crate::bind`]): one still here depends on run-time values.
        Op::If(_) => control::unresolved_if(ctx),
        Op::Loop(_) => control::unresolved_loop(ctx),
    }
}
