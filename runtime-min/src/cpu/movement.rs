//! Data movement on host tensors, forward and backward: views (Flatten, Reshape, Squeeze,
//! Unsqueeze), concatenation and splitting, slicing, transposition, gathering, padding,
//! expansion, triangles, casts, and the shape arithmetic that computes on shapes (Shape,
//! ConstantOfShape, Range). A gradient moves back as the elements moved.

use ralpc_ir::{DType, PadMode, SliceRanges};

use super::grad::InputGrads;
use super::ops::{axis_of, input, ints_or_input, operands, optional, Env, R};
use super::tensor::{self as t, Data, Tensor};

/// Per axis: start, end, step (already clamped).
type Ranges = Vec<(usize, i64, i64, i64)>;

/// A constant shape target re-batched: its leading entry, when it is the exported batch,
/// becomes the running batch.
pub(crate) fn rebatched(target: &[i64], env: Env, batch: Option<usize>) -> Option<Vec<i64>> {
    let (exported, batch) = (env.exported_batch?, batch?);
    (target.first() == Some(&exported)).then(|| {
        let mut t = target.to_vec();
        t[0] = batch as i64;
        t
    })
}

/// The shape a Reshape to a constant `target` gives `x` in a model run at another batch
/// than it was exported at: the target's leading entry, when it is the exported batch, is
/// whatever the running batch makes of it. It is inferred from the elements (as a -1
/// would be), since `x` may hold the samples merged with another axis (`[b·s, h]` back to
/// `[b, s, h]`); a target that already infers an entry takes `x`'s leading size.
pub(crate) fn rebatched_reshape(
    x: &[usize],
    target: &[i64],
    allowzero: bool,
    env: Env,
) -> R<Vec<usize>> {
    let leads_with_samples = env.samples.is_some_and(|s| {
        x.first() == Some(&s) && env.exported_batch.is_some_and(|e| e != s as i64)
    });
    if let (true, Some(t)) = (
        leads_with_samples,
        rebatched(target, env, x.first().copied()),
    ) {
        if let Ok(shape) = reshape_target(x, &t, allowzero) {
            return Ok(shape);
        }
    }
    reshape_target(x, target, allowzero).or_else(|e| {
        let Some(t) = rebatched(target, env, x.first().copied()) else {
            return Err(e);
        };
        if !target.contains(&-1) {
            let mut inferred = t.clone();
            inferred[0] = -1;
            if let Ok(shape) = reshape_target(x, &inferred, allowzero) {
                return Ok(shape);
            }
        }
        reshape_target(x, &t, allowzero)
    })
}

/// Concatenation along `axis`.
pub(crate) fn concat(parts: &[&Tensor], axis: i64) -> R<Tensor> {
    let first = parts
        .first()
        .ok_or_else(|| operands("nothing to concatenate"))?;
    let a = axis_of(axis, first.shape.len())?;
    let outer = t::numel(&first.shape[..a]);
    let mut shape = first.shape.clone();
    shape[a] = parts
        .iter()
        .map(|p| p.shape.get(a).copied().unwrap_or(0))
        .sum();
    for p in parts {
        if p.shape.len() != shape.len()
            || p.shape
                .iter()
                .enumerate()
                .any(|(d, &n)| d != a && n != first.shape[d])
        {
            return Err(operands(format!(
                "{:?} and {:?} do not concatenate",
                first.shape, p.shape
            )));
        }
    }
    let blocks: Vec<usize> = parts.iter().map(|p| t::numel(&p.shape[a..])).collect();
    let index = (0..outer).flat_map(|o| {
        blocks
            .iter()
            .enumerate()
            .flat_map(move |(k, &b)| (0..b).map(move |i| (k, o * b + i)))
    });
    Ok(if parts.iter().all(|p| matches!(p.data, Data::I64(_))) {
        let ints: Vec<&[i64]> = parts.iter().filter_map(|p| p.ints()).collect();
        Tensor::i64(shape, index.map(|(k, i)| ints[k][i]).collect())
    } else {
        let fs: Vec<Vec<f64>> = parts.iter().map(|p| p.to_f64s()).collect();
        Tensor::f32(shape, index.map(|(k, i)| fs[k][i] as f32).collect())
    })
}

/// Splits along axis `a` into parts of `sizes`.
pub(crate) fn split(x: &Tensor, a: usize, sizes: &[usize]) -> Vec<Tensor> {
    let mut start = 0;
    sizes
        .iter()
        .map(|&n| {
            let part = narrow(x, a, start, n);
            start += n;
            part
        })
        .collect()
}

/// The elements `start..start + len` of axis `a`.
pub(crate) fn narrow(x: &Tensor, a: usize, start: usize, len: usize) -> Tensor {
    let st = t::strides(&x.shape);
    let mut shape = x.shape.clone();
    shape[a] = len;
    let strides: Vec<isize> = st.iter().map(|&s| s as isize).collect();
    x.select(t::positions(&shape, &strides, (start * st[a]) as isize))
}

pub(crate) fn slice_ranges(
    ranges: &Option<ralpc_ir::SliceRanges>,
    inputs: &[Option<&Tensor>],
) -> R<Ranges> {
    let x = input(inputs, 0)?;
    let r = x.shape.len();
    let (starts, ends, axes, steps) = match ranges {
        Some(rg) => (rg.starts.clone(), rg.ends.clone(), rg.axes.clone(), None),
        None => (
            input(inputs, 1)?.to_i64s(),
            input(inputs, 2)?.to_i64s(),
            optional(inputs, 3).map(Tensor::to_i64s),
            optional(inputs, 4).map(Tensor::to_i64s),
        ),
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(operands("starts, ends, axes and steps differ in length"));
    }
    let mut out = Vec::new();
    for i in 0..starts.len() {
        let a = axis_of(axes[i], r)?;
        let dim = x.shape[a] as i64;
        let step = steps[i];
        if step == 0 {
            return Err(operands("a slice step is zero"));
        }
        let norm = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        let (s, e) = if step > 0 {
            (norm(starts[i]).clamp(0, dim), norm(ends[i]).clamp(0, dim))
        } else {
            (
                norm(starts[i]).clamp(0, dim - 1),
                norm(ends[i]).clamp(-1, dim - 1),
            )
        };
        out.push((a, s, e, step));
    }
    Ok(out)
}

/// The output shape of a slice of `shape` and the input position of each output element.
pub(crate) fn slice_positions(ranges: &Ranges, shape: &[usize]) -> (Vec<usize>, t::Positions) {
    let st = t::strides(shape);
    let mut out = shape.to_vec();
    let mut strides: Vec<isize> = st.iter().map(|&s| s as isize).collect();
    let mut offset = 0isize;
    for &(a, s, e, step) in ranges {
        let len = if step > 0 {
            (e - s).max(0).div_ceil_i(step)
        } else {
            (s - e).max(0).div_ceil_i(-step)
        };
        out[a] = len as usize;
        strides[a] = st[a] as isize * step as isize;
        if len > 0 {
            offset += s as isize * st[a] as isize;
        }
    }
    let positions = t::positions(&out, &strides, offset);
    (out, positions)
}

/// The target of a Reshape: `0` copies the input's dimension (unless `allowzero`), `-1`
/// takes what is left.
pub(crate) fn reshape_target(shape: &[usize], target: &[i64], allowzero: bool) -> R<Vec<usize>> {
    let total = t::numel(shape);
    let mut out: Vec<usize> = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(
                *shape
                    .get(i)
                    .ok_or_else(|| operands("a 0 in the target has no input axis"))?,
            ),
            d if d >= 0 => out.push(d as usize),
            _ => return Err(operands(format!("invalid target {target:?}"))),
        }
    }
    if let Some(i) = infer {
        let known = t::numel(&out);
        if known == 0 || total % known != 0 {
            return Err(operands(format!(
                "{shape:?} does not reshape to {target:?}"
            )));
        }
        out[i] = total / known;
    }
    if t::numel(&out) != total {
        return Err(operands(format!(
            "{shape:?} does not reshape to {target:?}"
        )));
    }
    Ok(out)
}

/// Axis permutation: output axis `d` is input axis `perm[d]`.
pub(crate) fn transpose(x: &Tensor, perm: &[usize]) -> Tensor {
    let st = t::strides(&x.shape);
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let strides: Vec<isize> = perm.iter().map(|&p| st[p] as isize).collect();
    x.select(t::positions(&shape, &strides, 0))
}

pub(crate) fn gather(x: &Tensor, indices: &Tensor, axis: i64) -> R<Tensor> {
    let a = axis_of(axis, x.shape.len())?;
    let dim = x.shape[a];
    let idx: Vec<usize> = indices
        .to_i64s()
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + dim as i64 } else { i };
            usize::try_from(j)
                .ok()
                .filter(|&j| j < dim)
                .ok_or_else(|| operands(format!("index {i} is out of range for {dim}")))
        })
        .collect::<R<_>>()?;
    let (outer, inner) = (t::numel(&x.shape[..a]), t::numel(&x.shape[a + 1..]));
    let mut shape = x.shape[..a].to_vec();
    shape.extend(&indices.shape);
    shape.extend(&x.shape[a + 1..]);
    // Whole rows of the axes after `axis` at a time.
    fn rows<T: Copy>(v: &[T], outer: usize, dim: usize, inner: usize, idx: &[usize]) -> Vec<T> {
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            for &j in idx {
                let at = (o * dim + j) * inner;
                out.extend_from_slice(&v[at..at + inner]);
            }
        }
        out
    }
    Ok(match &x.data {
        Data::F32(v) => Tensor::f32(shape, rows(v, outer, dim, inner, &idx)),
        Data::I64(v) => Tensor::i64(shape, rows(v, outer, dim, inner, &idx)),
    })
}

pub(crate) fn cast(x: &Tensor, to: DType) -> Tensor {
    if to.is_float() {
        let v = x.to_f64s();
        let v = match to {
            DType::F16 => v.iter().map(|&f| round_to_f16(f as f32)).collect(),
            DType::BF16 => v.iter().map(|&f| round_to_bf16(f as f32)).collect(),
            _ => v.iter().map(|&f| f as f32).collect(),
        };
        Tensor::f32(x.shape.clone(), v)
    } else if to == DType::Bool {
        Tensor::i64(
            x.shape.clone(),
            x.to_f64s().iter().map(|&v| i64::from(v != 0.0)).collect(),
        )
    } else {
        Tensor::i64(x.shape.clone(), x.to_i64s())
    }
}

/// Rounds to the nearest bfloat16 value (ties to even), kept in f32.
pub(crate) fn round_to_bf16(v: f32) -> f32 {
    if !v.is_finite() {
        return v;
    }
    let bits = v.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded)
}

/// Rounds to the nearest half-precision value (ties to even), kept in f32.
pub(crate) fn round_to_f16(v: f32) -> f32 {
    if !v.is_finite() || v == 0.0 {
        return v;
    }
    let exp = v.abs().log2().floor().max(-14.0);
    let quantum = 2f32.powf(exp - 10.0);
    let r = (v / quantum).round_ties_even() * quantum;
    if r.abs() > 65504.0 {
        f32::INFINITY.copysign(v)
    } else {
        r
    }
}

/// The input index that output index `o` of a padded axis reads, `None` for the fill.
pub(crate) fn padded_source(o: i64, before: i64, dim: i64, mode: PadMode) -> Option<usize> {
    let i = o - before;
    if (0..dim).contains(&i) {
        return Some(i as usize);
    }
    let j = match mode {
        PadMode::Constant => return None,
        PadMode::Edge => i.clamp(0, dim - 1),
        PadMode::Wrap => i.rem_euclid(dim),
        PadMode::Reflect => {
            if dim == 1 {
                0
            } else {
                let period = 2 * (dim - 1);
                let m = i.rem_euclid(period);
                if m < dim {
                    m
                } else {
                    period - m
                }
            }
        }
    };
    Some(j as usize)
}

/// The padding of an op's inputs: pads from the attribute or input 1, axes from input 3.
pub(crate) fn pad_sources(
    pads: &Option<Vec<i64>>,
    mode: PadMode,
    inputs: &[Option<&Tensor>],
) -> R<(Vec<usize>, Vec<Option<usize>>)> {
    let x = input(inputs, 0)?;
    let pads = ints_or_input(pads, inputs, 1).ok_or_else(|| operands("pads are missing"))?;
    let axes = optional(inputs, 3).map(Tensor::to_i64s);
    let r = x.shape.len();
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis_of(a, r)).collect::<R<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(operands(format!(
            "{} pads for {} axes",
            pads.len(),
            axes.len()
        )));
    }
    let mut before = vec![0i64; r];
    let mut after = vec![0i64; r];
    for (k, &a) in axes.iter().enumerate() {
        before[a] = pads[k];
        after[a] = pads[k + axes.len()];
    }
    let shape: Vec<usize> = (0..r)
        .map(|d| {
            usize::try_from(x.shape[d] as i64 + before[d] + after[d])
                .map_err(|_| operands("the pads remove more than the axis"))
        })
        .collect::<R<_>>()?;
    if mode != PadMode::Constant && x.shape.contains(&0) {
        return Err(operands("cannot pad an empty axis by reflection"));
    }
    let st = t::strides(&x.shape);
    let mut index = vec![0usize; r];
    let n = t::numel(&shape);
    let mut sources: Vec<Option<usize>> = Vec::with_capacity(n);
    for _ in 0..n {
        let mut at = Some(0usize);
        for d in 0..r {
            at = match (
                at,
                padded_source(index[d] as i64, before[d], x.shape[d] as i64, mode),
            ) {
                (Some(base), Some(i)) => Some(base + i * st[d]),
                _ => None,
            };
        }
        sources.push(at);
        for d in (0..r).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Ok((shape, sources))
}

pub(crate) fn pad(
    x: &Tensor,
    (shape, sources): (Vec<usize>, Vec<Option<usize>>),
    value: f64,
) -> Tensor {
    match &x.data {
        Data::F32(v) => Tensor::f32(
            shape,
            sources
                .iter()
                .map(|s| s.map_or(value as f32, |i| v[i]))
                .collect(),
        ),
        Data::I64(v) => Tensor::i64(
            shape,
            sources
                .iter()
                .map(|s| s.map_or(value as i64, |i| v[i]))
                .collect(),
        ),
    }
}

/// Whether element `(i, j)` of a matrix is kept by Trilu.
pub(crate) fn trilu_keeps(i: usize, j: usize, upper: bool, k: i64) -> bool {
    let diff = j as i64 - i as i64;
    if upper {
        diff >= k
    } else {
        diff <= k
    }
}

pub(crate) fn trilu(x: &Tensor, upper: bool, k: i64) -> R<Tensor> {
    let r = x.shape.len();
    if r < 2 {
        return Err(operands("Trilu needs at least two axes"));
    }
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    let keep = |e: usize| {
        let (i, j) = ((e / cols) % rows, e % cols);
        trilu_keeps(i, j, upper, k)
    };
    Ok(match &x.data {
        Data::F32(v) => Tensor::f32(
            x.shape.clone(),
            v.iter()
                .enumerate()
                .map(|(e, &v)| if keep(e) { v } else { 0.0 })
                .collect(),
        ),
        Data::I64(v) => Tensor::i64(
            x.shape.clone(),
            v.iter()
                .enumerate()
                .map(|(e, &v)| if keep(e) { v } else { 0 })
                .collect(),
        ),
    })
}

/// Concat's forward pass: every input along `axis`.
pub(crate) fn concat_inputs(inputs: &[Option<&Tensor>], axis: i64) -> R<Tensor> {
    let parts: Vec<&Tensor> = (0..inputs.len())
        .map(|i| input(inputs, i))
        .collect::<R<_>>()?;
    concat(&parts, axis)
}

/// Concat's backward pass: the output's gradient cut back into its inputs' pieces (none
/// for an integer input).
pub(crate) fn concat_backward(
    axis: i64,
    inputs: &[Option<&Tensor>],
    y: &Tensor,
    dy: &[f32],
) -> R<InputGrads> {
    let a = axis_of(axis, y.shape.len())?;
    let sizes: Vec<usize> = (0..inputs.len())
        .map(|i| input(inputs, i).map(|p| p.shape[a]))
        .collect::<R<_>>()?;
    let dyt = Tensor::f32(y.shape.clone(), dy.to_vec());
    Ok(split(&dyt, a, &sizes)
        .into_iter()
        .zip(inputs)
        .map(|(part, i)| {
            i.filter(|t| t.is_float())
                .and_then(|_| part.floats().map(<[f32]>::to_vec))
        })
        .collect())
}

/// Split's forward pass into `outputs` parts: the sizes from the attribute or input 1, else
/// equal parts (the last one shorter).
pub(crate) fn split_inputs(
    axis: i64,
    sizes: &Option<Vec<i64>>,
    inputs: &[Option<&Tensor>],
    outputs: usize,
) -> R<Vec<Tensor>> {
    let x = input(inputs, 0)?;
    let ax = axis_of(axis, x.shape.len())?;
    let total = x.shape[ax];
    let sizes: Vec<usize> = match ints_or_input(sizes, inputs, 1) {
        Some(s) => s.iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            let chunk = total.div_ceil(outputs.max(1));
            (0..outputs)
                .map(|i| chunk.min(total.saturating_sub(chunk * i)))
                .collect()
        }
    };
    if sizes.len() != outputs || sizes.iter().sum::<usize>() != total {
        return Err(operands(format!(
            "split sizes {sizes:?} do not split {total} into {outputs} outputs"
        )));
    }
    Ok(split(x, ax, &sizes))
}

/// Split's backward pass: its outputs' gradients (zeros where one has none) joined.
pub(crate) fn split_backward(
    axis: i64,
    x: &Tensor,
    outputs: &[&Tensor],
    dys: &[Option<&[f32]>],
) -> R<Vec<f32>> {
    let a = axis_of(axis, x.shape.len())?;
    let parts: Vec<Tensor> = outputs
        .iter()
        .enumerate()
        .map(|(k, o)| {
            let d = dys.get(k).copied().flatten();
            Tensor::f32(
                o.shape.clone(),
                d.map_or_else(|| vec![0.0; o.len()], <[f32]>::to_vec),
            )
        })
        .collect();
    let refs: Vec<&Tensor> = parts.iter().collect();
    let whole = concat(&refs, a as i64)?;
    Ok(whole.floats().unwrap_or_default().to_vec())
}

/// Slice's forward pass.
pub(crate) fn slice(ranges: &Option<SliceRanges>, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let (_, positions) = slice_positions(&slice_ranges(ranges, inputs)?, &x.shape);
    Ok(x.select(positions))
}

/// Slice's backward pass: each output gradient back to the element it was sliced from.
pub(crate) fn slice_backward(
    ranges: &Option<SliceRanges>,
    inputs: &[Option<&Tensor>],
    x: &Tensor,
    dy: &[f32],
) -> R<Vec<f32>> {
    let (_, positions) = slice_positions(&slice_ranges(ranges, inputs)?, &x.shape);
    let mut dx = vec![0.0; x.len()];
    for (g, i) in dy.iter().zip(positions) {
        dx[i] += g;
    }
    Ok(dx)
}

/// Flatten: the axes before `axis` into one, the rest into another.
pub(crate) fn flatten(x: &Tensor, axis: i64) -> R<Tensor> {
    let r = x.shape.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..=r).contains(&a) {
        return Err(operands(format!(
            "axis {axis} is out of range for rank {r}"
        )));
    }
    let outer = t::numel(&x.shape[..a as usize]);
    let inner = t::numel(&x.shape[a as usize..]);
    Ok(x.clone().reshaped(vec![outer, inner]))
}

/// Reshape to input 1's target, re-batched as the run needs ([`rebatched_reshape`]).
pub(crate) fn reshape(inputs: &[Option<&Tensor>], allowzero: bool, env: Env) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let target = input(inputs, 1)?.to_i64s();
    let shape = rebatched_reshape(&x.shape, &target, allowzero, env)?;
    Ok(x.clone().reshaped(shape))
}

/// Squeeze: the axes given (attribute or input 1), else every axis of size 1.
pub(crate) fn squeeze(axes: &Option<Vec<i64>>, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let r = x.shape.len();
    let axes: Vec<usize> = match ints_or_input(axes, inputs, 1) {
        Some(a) => a.iter().map(|&a| axis_of(a, r)).collect::<R<_>>()?,
        None => (0..r).filter(|&d| x.shape[d] == 1).collect(),
    };
    let shape = x
        .shape
        .iter()
        .enumerate()
        .filter(|(d, _)| !axes.contains(d))
        .map(|(_, &n)| n)
        .collect();
    Ok(x.clone().reshaped(shape))
}

/// Unsqueeze: an axis of size 1 at each position given (attribute or input 1).
pub(crate) fn unsqueeze(axes: &Option<Vec<i64>>, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let axes = ints_or_input(axes, inputs, 1).ok_or_else(|| operands("axes are missing"))?;
    let r = x.shape.len() + axes.len();
    let mut axes: Vec<usize> = axes.iter().map(|&a| axis_of(a, r)).collect::<R<_>>()?;
    axes.sort_unstable();
    let mut shape = x.shape.clone();
    for a in axes {
        shape.insert(a.min(shape.len()), 1);
    }
    Ok(x.clone().reshaped(shape))
}

/// The axis permutation of a Transpose (reversal when none is given).
fn permutation(perm: &Option<Vec<i64>>, rank: usize) -> R<Vec<usize>> {
    Ok(match perm {
        Some(p) => p.iter().map(|&a| axis_of(a, rank)).collect::<R<_>>()?,
        None => (0..rank).rev().collect(),
    })
}

/// Transpose's forward pass.
pub(crate) fn transpose_by(x: &Tensor, perm: &Option<Vec<i64>>) -> R<Tensor> {
    Ok(transpose(x, &permutation(perm, x.shape.len())?))
}

/// Transpose's backward pass: the output's gradient under the inverse permutation.
pub(crate) fn transpose_backward(
    perm: &Option<Vec<i64>>,
    x: &Tensor,
    y: &Tensor,
    dy: &[f32],
) -> R<Vec<f32>> {
    let perm = permutation(perm, x.shape.len())?;
    let mut inverse = vec![0; perm.len()];
    for (d, &p) in perm.iter().enumerate() {
        inverse[p] = d;
    }
    let dyt = Tensor::f32(y.shape.clone(), dy.to_vec());
    Ok(transpose(&dyt, &inverse)
        .floats()
        .unwrap_or_default()
        .to_vec())
}

/// Gather's backward pass: each output gradient added to the row it was gathered from.
pub(crate) fn gather_backward(axis: i64, x: &Tensor, indices: &Tensor, dy: &[f32]) -> R<Vec<f32>> {
    let a = axis_of(axis, x.shape.len())?;
    let dim = x.shape[a];
    let (outer, inner) = (t::numel(&x.shape[..a]), t::numel(&x.shape[a + 1..]));
    let mut dx = vec![0.0; x.len()];
    let picks = indices.to_i64s();
    let mut k = 0;
    for o in 0..outer {
        for &j in &picks {
            let j = if j < 0 { j + dim as i64 } else { j } as usize;
            for i in 0..inner {
                dx[(o * dim + j) * inner + i] += dy[k];
                k += 1;
            }
        }
    }
    Ok(dx)
}

/// Shape: the input's dimensions from `start` to `end`, clamped to its rank.
pub(crate) fn shape_of(x: &Tensor, start: i64, end: Option<i64>) -> Tensor {
    let r = x.shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
    let dims: Vec<i64> = x.shape[s..e.max(s)].iter().map(|&d| d as i64).collect();
    Tensor::i64(vec![dims.len()], dims)
}

/// ConstantOfShape: `value` at the shape input 0 gives (a scalar without it).
pub(crate) fn constant_of_shape(value: f64, dtype: DType, inputs: &[Option<&Tensor>]) -> Tensor {
    let shape: Vec<usize> = match optional(inputs, 0) {
        Some(s) => s.to_i64s().iter().map(|&d| d.max(0) as usize).collect(),
        None => Vec::new(),
    };
    let n = t::numel(&shape);
    if dtype.is_float() {
        Tensor::f32(shape, vec![value as f32; n])
    } else {
        Tensor::i64(shape, vec![value as i64; n])
    }
}

/// Range: `start`, `start + delta`, … up to `limit` (excluded), in `start`'s type.
pub(crate) fn range(inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let (start, limit, delta) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let first = |t: &Tensor| t.to_f64s().first().copied().unwrap_or(0.0);
    let (s, l, d) = (first(start), first(limit), first(delta));
    if d == 0.0 {
        return Err(operands("delta is zero"));
    }
    let n = ((l - s) / d).ceil().max(0.0) as usize;
    Ok(match start.data {
        Data::F32(_) => Tensor::f32(vec![n], (0..n).map(|i| (s + i as f64 * d) as f32).collect()),
        Data::I64(_) => {
            let (s, d) = (s as i64, d as i64);
            Tensor::i64(vec![n], (0..n as i64).map(|i| s + i * d).collect())
        }
    })
}

/// Pad's forward pass, its fill value from input 2 (zero without it).
pub(crate) fn pad_inputs(
    mode: PadMode,
    pads: &Option<Vec<i64>>,
    inputs: &[Option<&Tensor>],
) -> R<Tensor> {
    let value = optional(inputs, 2)
        .and_then(|v| v.to_f64s().first().copied())
        .unwrap_or(0.0);
    Ok(pad(
        input(inputs, 0)?,
        pad_sources(pads, mode, inputs)?,
        value,
    ))
}

/// Pad's backward pass: each output gradient back to the element it was copied from
/// (reflected and edge padding copy some more than once).
pub(crate) fn pad_backward(
    mode: PadMode,
    pads: &Option<Vec<i64>>,
    inputs: &[Option<&Tensor>],
    x: &Tensor,
    dy: &[f32],
) -> R<Vec<f32>> {
    let (_, sources) = pad_sources(pads, mode, inputs)?;
    let mut dx = vec![0.0; x.len()];
    for (g, src) in dy.iter().zip(sources) {
        if let Some(i) = src {
            dx[i] += g;
        }
    }
    Ok(dx)
}

/// Expand: `x` broadcast to input 1's shape, re-batched as the run needs.
pub(crate) fn expand(inputs: &[Option<&Tensor>], env: Env) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let target: Vec<usize> = input(inputs, 1)?
        .to_i64s()
        .iter()
        .map(|&d| d.max(0) as usize)
        .collect();
    let shape = t::broadcast_shapes(&x.shape, &target)
        .or_else(|| {
            let t: Vec<i64> = target.iter().map(|&d| d as i64).collect();
            let t = rebatched(&t, env, x.shape.first().copied())?;
            let t: Vec<usize> = t.iter().map(|&d| d as usize).collect();
            t::broadcast_shapes(&x.shape, &t)
        })
        .ok_or_else(|| operands(format!("{:?} does not expand to {target:?}", x.shape)))?;
    Ok(x.select(t::broadcast(&x.shape, &shape)))
}

/// The diagonal offset of a Trilu (input 1, else 0).
fn trilu_offset(inputs: &[Option<&Tensor>]) -> i64 {
    optional(inputs, 1)
        .and_then(|k| k.to_i64s().first().copied())
        .unwrap_or(0)
}

/// Trilu's forward pass.
pub(crate) fn trilu_inputs(upper: bool, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    trilu(input(inputs, 0)?, upper, trilu_offset(inputs))
}

/// Trilu's backward pass: the output's gradient where the triangle kept the element.
pub(crate) fn trilu_backward(
    upper: bool,
    inputs: &[Option<&Tensor>],
    x: &Tensor,
    dy: &[f32],
) -> Vec<f32> {
    let k = trilu_offset(inputs);
    let r = x.shape.len();
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    dy.iter()
        .enumerate()
        .map(|(e, &g)| {
            if trilu_keeps((e / cols) % rows, e % cols, upper, k) {
                g
            } else {
                0.0
            }
        })
        .collect()
}

/// Ceiling division of integers, `d` > 0.
trait DivCeil {
    fn div_ceil_i(self, d: i64) -> i64;
}

impl DivCeil for i64 {
    fn div_ceil_i(self, d: i64) -> i64 {
        (self + d - 1) / d
    }
}
