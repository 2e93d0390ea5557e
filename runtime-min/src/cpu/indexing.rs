//! Element-indexed ops forward and backward: GatherElements, GatherND, ScatterElements, ScatterND,
//! CumSum, Size; and Einsum, a contraction over labelled axes.
//!
//! Each op is first reduced to *positions* (for every element of the indices or updates,
//! the flat position in the data it reads or writes), checked once; the forward and the
//! backward pass then only move values along them.

use std::sync::Arc;

use ralpc_ir::{Einsum, Reduction};

use super::grad::InputGrads;
use super::ops::{floats, input, operands, unsupported, R};
use super::tensor::{self as t, Data, Tensor};

/// An index read from a tensor, made non-negative against `dim` and bounds-checked.
fn index(i: i64, dim: usize, what: &str) -> R<usize> {
    let d = dim as i64;
    let j = if i < 0 { i + d } else { i };
    if (0..d).contains(&j) {
        Ok(j as usize)
    } else {
        Err(operands(format!(
            "{what} {i} is out of range for a dimension of {dim}"
        )))
    }
}

/// For GatherElements and ScatterElements: the data position of every element of
/// `indices` (same rank as the data), along `axis`.
fn element_positions(data: &[usize], indices: &Tensor, axis: i64) -> R<Vec<usize>> {
    if indices.shape.len() != data.len() {
        return Err(operands(format!(
            "indices {:?} must have the data's rank ({data:?})",
            indices.shape
        )));
    }
    let a = t::axis(axis, data.len())
        .ok_or_else(|| operands(format!("axis {axis} is out of range")))?;
    let strides = t::strides(data);
    let idx = indices.to_i64s();
    let mut at = vec![0usize; data.len()];
    let mut out = Vec::with_capacity(idx.len());
    for &i in &idx {
        let mut p = 0;
        for (d, (&k, &s)) in at.iter().zip(&strides).enumerate() {
            let k = if d == a {
                index(i, data[a], "index")?
            } else {
                k
            };
            if k >= data[d] {
                return Err(operands(format!(
                    "indices {:?} do not fit in data {data:?} off axis {a}",
                    indices.shape
                )));
            }
            p += k * s;
        }
        out.push(p);
        for d in (0..at.len()).rev() {
            at[d] += 1;
            if at[d] < indices.shape[d] {
                break;
            }
            at[d] = 0;
        }
    }
    Ok(out)
}

/// For ScatterND: the first data position of every slice `indices[i…, :]` addresses, and
/// the slice's length.
fn slice_positions(data: &[usize], indices: &Tensor) -> R<(Vec<usize>, usize)> {
    let k = *indices
        .shape
        .last()
        .ok_or_else(|| operands("indices must have rank >= 1"))?;
    if k > data.len() {
        return Err(operands(format!(
            "indices address {k} axes of data {data:?} (rank {})",
            data.len()
        )));
    }
    let strides = t::strides(data);
    let len = t::numel(&data[k..]);
    let idx = indices.to_i64s();
    let tuples = t::numel(&indices.shape[..indices.shape.len() - 1]);
    let starts = (0..tuples)
        .map(|tuple| {
            idx[tuple * k..(tuple + 1) * k]
                .iter()
                .enumerate()
                .try_fold(0, |p, (d, &i)| {
                    Ok(p + index(i, data[d], "index")? * strides[d])
                })
        })
        .collect::<R<Vec<usize>>>()?;
    Ok((starts, len))
}

/// For GatherND: the first data position of every slice the index tuples address after
/// `b` batch axes, and the slice's length.
fn gather_nd_positions(data: &[usize], indices: &Tensor, b: usize) -> R<(Vec<usize>, usize)> {
    let q = indices.shape.len();
    let k = *indices
        .shape
        .last()
        .ok_or_else(|| operands("indices must have rank >= 1"))?;
    if b >= q || b + k > data.len() || data[..b] != indices.shape[..b] {
        return Err(operands(format!(
            "indices {:?} do not address data {data:?} after {b} batch axes",
            indices.shape
        )));
    }
    let strides = t::strides(data);
    let len = t::numel(&data[b + k..]);
    // Per batch position, the index tuples it holds; the data's block is its stride.
    let per_batch = t::numel(&indices.shape[b..q - 1]);
    let block = t::numel(&data[b..]);
    let idx = indices.to_i64s();
    let starts = (0..t::numel(&indices.shape[..q - 1]))
        .map(|tuple| {
            let base = tuple / per_batch.max(1) * block;
            idx[tuple * k..(tuple + 1) * k]
                .iter()
                .enumerate()
                .try_fold(base, |p, (d, &i)| {
                    Ok(p + index(i, data[b + d], "index")? * strides[b + d])
                })
        })
        .collect::<R<Vec<usize>>>()?;
    Ok((starts, len))
}

fn combine_f32(r: Reduction, old: f32, new: f32) -> f32 {
    match r {
        Reduction::None => new,
        Reduction::Add => old + new,
        Reduction::Mul => old * new,
        Reduction::Max => old.max(new),
        Reduction::Min => old.min(new),
    }
}

fn combine_i64(r: Reduction, old: i64, new: i64) -> i64 {
    match r {
        Reduction::None => new,
        Reduction::Add => old.wrapping_add(new),
        Reduction::Mul => old.wrapping_mul(new),
        Reduction::Max => old.max(new),
        Reduction::Min => old.min(new),
    }
}

/// `data` with `updates` written at `starts[i] + j` (`j < len`), combined by `r`.
fn scatter(
    data: &Tensor,
    updates: &Tensor,
    starts: &[usize],
    len: usize,
    r: Reduction,
) -> R<Tensor> {
    if updates.len() != starts.len() * len {
        return Err(operands(format!(
            "updates {:?} hold {} elements where {} are written",
            updates.shape,
            updates.len(),
            starts.len() * len
        )));
    }
    let mut out = data.clone();
    let targets = starts.iter().flat_map(|&s| s..s + len);
    match (&mut out.data, &updates.data) {
        (Data::F32(o), Data::F32(u)) => {
            let o = o.make_mut();
            for (p, &v) in targets.zip(u.iter()) {
                o[p] = combine_f32(r, o[p], v);
            }
        }
        (Data::I64(o), Data::I64(u)) => {
            let o = Arc::make_mut(o);
            for (p, &v) in targets.zip(u.iter()) {
                o[p] = combine_i64(r, o[p], v);
            }
        }
        _ => return Err(operands("data and updates must have one element type")),
    }
    Ok(out)
}

/// GatherElements forward.
pub(crate) fn gather_elements(inputs: &[Option<&Tensor>], axis: i64) -> R<Tensor> {
    let (x, idx) = (input(inputs, 0)?, input(inputs, 1)?);
    let at = element_positions(&x.shape, idx, axis)?;
    Ok(x.pick(idx.shape.clone(), at.into_iter()))
}

/// GatherND forward.
pub(crate) fn gather_nd(inputs: &[Option<&Tensor>], b: usize) -> R<Tensor> {
    let (x, idx) = (input(inputs, 0)?, input(inputs, 1)?);
    let (starts, len) = gather_nd_positions(&x.shape, idx, b)?;
    let k = idx.shape.last().copied().unwrap_or(0);
    let mut shape = idx.shape[..idx.shape.len() - 1].to_vec();
    shape.extend_from_slice(&x.shape[b + k..]);
    Ok(x.pick(shape, starts.into_iter().flat_map(|s| s..s + len)))
}

/// ScatterElements forward.
pub(crate) fn scatter_elements(inputs: &[Option<&Tensor>], axis: i64, r: Reduction) -> R<Tensor> {
    let (x, idx, up) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let at = element_positions(&x.shape, idx, axis)?;
    scatter(x, up, &at, 1, r)
}

/// ScatterND forward.
pub(crate) fn scatter_nd(inputs: &[Option<&Tensor>], r: Reduction) -> R<Tensor> {
    let (x, idx, up) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let (starts, len) = slice_positions(&x.shape, idx)?;
    scatter(x, up, &starts, len, r)
}

/// The gradients of a scatter: the data's is `dy` where no update landed (`dy` itself when
/// updates add), the updates' is `dy` where each landed. Products and extrema have no
/// gradient here.
fn scatter_backward(
    n: usize,
    dy: &[f32],
    starts: &[usize],
    len: usize,
    r: Reduction,
) -> R<InputGrads> {
    let targets = || starts.iter().flat_map(|&s| s..s + len);
    let mut dx = dy.to_vec();
    match r {
        Reduction::None => targets().for_each(|p| dx[p] = 0.0),
        Reduction::Add => {}
        other => {
            return Err(unsupported(format!(
                "the backward pass of a scatter with reduction {other:?} is not supported"
            )))
        }
    }
    let mut g = vec![None; n];
    g[0] = Some(dx);
    g[2] = Some(targets().map(|p| dy[p]).collect());
    Ok(g)
}

/// A gather's gradients: the data's is each output's gradient added at the position it
/// was read from; the indices have none.
fn gather_backward(
    inputs: &[Option<&Tensor>],
    data_len: usize,
    read: impl Iterator<Item = usize>,
    dy: &[f32],
) -> InputGrads {
    let mut dx = vec![0.0; data_len];
    for (p, &g) in read.zip(dy) {
        dx[p] += g;
    }
    let mut g = vec![None; inputs.len()];
    g[0] = Some(dx);
    g
}

/// GatherElements backward.
pub(crate) fn gather_elements_backward(
    inputs: &[Option<&Tensor>],
    axis: i64,
    dy: &[f32],
) -> R<InputGrads> {
    let (x, idx) = (input(inputs, 0)?, input(inputs, 1)?);
    let at = element_positions(&x.shape, idx, axis)?;
    Ok(gather_backward(inputs, x.len(), at.into_iter(), dy))
}

/// GatherND backward.
pub(crate) fn gather_nd_backward(
    inputs: &[Option<&Tensor>],
    b: usize,
    dy: &[f32],
) -> R<InputGrads> {
    let (x, idx) = (input(inputs, 0)?, input(inputs, 1)?);
    let (starts, len) = gather_nd_positions(&x.shape, idx, b)?;
    let read = starts.into_iter().flat_map(|s| s..s + len);
    Ok(gather_backward(inputs, x.len(), read, dy))
}

/// ScatterElements backward.
pub(crate) fn scatter_elements_backward(
    inputs: &[Option<&Tensor>],
    axis: i64,
    r: Reduction,
    dy: &[f32],
) -> R<InputGrads> {
    let (x, idx) = (input(inputs, 0)?, input(inputs, 1)?);
    let at = element_positions(&x.shape, idx, axis)?;
    scatter_backward(inputs.len(), dy, &at, 1, r)
}

/// ScatterND backward.
pub(crate) fn scatter_nd_backward(
    inputs: &[Option<&Tensor>],
    r: Reduction,
    dy: &[f32],
) -> R<InputGrads> {
    let (x, idx) = (input(inputs, 0)?, input(inputs, 1)?);
    let (starts, len) = slice_positions(&x.shape, idx)?;
    scatter_backward(inputs.len(), dy, &starts, len, r)
}

/// The axis of a CumSum (input 1, a scalar).
fn cumsum_axis(inputs: &[Option<&Tensor>], rank: usize) -> R<usize> {
    let a = input(inputs, 1)?.to_i64s();
    let [a] = a.as_slice() else {
        return Err(operands(format!(
            "axis must hold one value, holds {}",
            a.len()
        )));
    };
    t::axis(*a, rank).ok_or_else(|| operands(format!("axis {a} is out of range for rank {rank}")))
}

/// Running sums of `v` (shape `shape`) along `axis`.
fn running<T: Copy + Default + std::ops::Add<Output = T>>(
    v: &[T],
    shape: &[usize],
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    let (n, inner) = (shape[axis], t::numel(&shape[axis + 1..]));
    let mut out = vec![T::default(); v.len()];
    for outer in 0..t::numel(&shape[..axis]) {
        for i in 0..inner {
            let at = |k: usize| (outer * n + if reverse { n - 1 - k } else { k }) * inner + i;
            let mut sum = T::default();
            for k in 0..n {
                let p = at(k);
                if exclusive {
                    out[p] = sum;
                    sum = sum + v[p];
                } else {
                    sum = sum + v[p];
                    out[p] = sum;
                }
            }
        }
    }
    out
}

/// CumSum forward.
pub(crate) fn cumsum(inputs: &[Option<&Tensor>], exclusive: bool, reverse: bool) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let a = cumsum_axis(inputs, x.shape.len())?;
    Ok(match &x.data {
        Data::F32(v) => Tensor::f32(x.shape.clone(), running(v, &x.shape, a, exclusive, reverse)),
        Data::I64(v) => Tensor::i64(x.shape.clone(), running(v, &x.shape, a, exclusive, reverse)),
    })
}

/// CumSum backward: the running sum of `dy` the other way (each input reaches the outputs
/// after it, or before it when reversed).
pub(crate) fn cumsum_backward(
    inputs: &[Option<&Tensor>],
    exclusive: bool,
    reverse: bool,
    dy: &[f32],
) -> R<InputGrads> {
    let x = input(inputs, 0)?;
    let a = cumsum_axis(inputs, x.shape.len())?;
    let mut g = vec![None; inputs.len()];
    g[0] = Some(running(dy, &x.shape, a, exclusive, !reverse));
    Ok(g)
}

/// An Einsum prepared for its operands' shapes: every label's size, and per operand and
/// for the output the stride each label steps (0 where a label is absent or broadcast;
/// repeated labels add their strides, which walks a diagonal).
struct Contraction {
    /// Sizes of the output's labels, then of the summed ones.
    sizes: Vec<usize>,
    /// How many of `sizes` are the output's.
    kept: usize,
    /// Per operand, its stride along each label of `sizes`.
    operands: Vec<Vec<usize>>,
    /// The output's shape.
    shape: Vec<usize>,
}

impl Contraction {
    fn new(e: &Einsum, shapes: &[&[usize]]) -> R<Contraction> {
        let ranks: Vec<usize> = shapes.iter().map(|s| s.len()).collect();
        let axes = e.axes(&ranks).map_err(|e| operands(e.to_string()))?;
        let mut sizes: Vec<(u32, usize)> = Vec::new();
        for (shape, labels) in shapes.iter().zip(&axes.operands) {
            for (&d, &l) in shape.iter().zip(labels) {
                match sizes.iter_mut().find(|(k, _)| *k == l) {
                    None => sizes.push((l, d)),
                    Some((_, s)) if *s == d || d == 1 => {}
                    Some((_, s)) if *s == 1 => *s = d,
                    Some((_, s)) => {
                        return Err(operands(format!(
                            "a label is {s} in one operand and {d} in another"
                        )))
                    }
                }
            }
        }
        let size_of = |l: u32| sizes.iter().find(|(k, _)| *k == l).map_or(1, |(_, s)| *s);
        let mut order: Vec<u32> = axes.output.clone();
        order.extend(
            sizes
                .iter()
                .map(|(l, _)| *l)
                .filter(|l| !axes.output.contains(l)),
        );
        let operands = shapes
            .iter()
            .zip(&axes.operands)
            .map(|(shape, labels)| {
                let strides = t::strides(shape);
                order
                    .iter()
                    .map(|&l| {
                        labels
                            .iter()
                            .zip(shape.iter().zip(&strides))
                            .filter(|(&k, (&d, _))| k == l && d != 1)
                            .map(|(_, (_, &s))| s)
                            .sum()
                    })
                    .collect()
            })
            .collect();
        Ok(Contraction {
            sizes: order.iter().map(|&l| size_of(l)).collect(),
            kept: axes.output.len(),
            operands,
            shape: axes.output.iter().map(|&l| size_of(l)).collect(),
        })
    }

    /// Calls `f(output position, operand positions)` for every combination of label
    /// indices, output-major.
    fn each(&self, mut f: impl FnMut(usize, &[usize])) {
        let total = t::numel(&self.sizes);
        let summed = t::numel(&self.sizes[self.kept..]).max(1);
        let mut at = vec![0usize; self.sizes.len()];
        let mut pos = vec![0usize; self.operands.len()];
        for step in 0..total {
            f(step / summed, &pos);
            for d in (0..at.len()).rev() {
                at[d] += 1;
                for (p, s) in pos.iter_mut().zip(&self.operands) {
                    *p += s[d];
                }
                if at[d] < self.sizes[d] {
                    break;
                }
                for (p, s) in pos.iter_mut().zip(&self.operands) {
                    *p -= s[d] * self.sizes[d];
                }
                at[d] = 0;
            }
        }
    }
}

/// Every operand's values and shape.
type Operands<'a> = (Vec<&'a [f32]>, Vec<&'a [usize]>);

fn float_operands<'a>(inputs: &[Option<&'a Tensor>]) -> R<Operands<'a>> {
    let mut values = Vec::with_capacity(inputs.len());
    let mut shapes = Vec::with_capacity(inputs.len());
    for i in 0..inputs.len() {
        let x = input(inputs, i)?;
        values.push(floats(x, "an Einsum operand")?);
        shapes.push(x.shape.as_slice());
    }
    Ok((values, shapes))
}

/// Einsum forward.
pub(crate) fn einsum(e: &Einsum, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let (values, shapes) = float_operands(inputs)?;
    let c = Contraction::new(e, &shapes)?;
    let mut y = vec![0.0f32; t::numel(&c.shape)];
    c.each(|o, pos| {
        y[o] += pos.iter().zip(&values).map(|(&p, v)| v[p]).product::<f32>();
    });
    Ok(Tensor::f32(c.shape, y))
}

/// Einsum backward: each operand's gradient collects `dy` times the other operands, over
/// the same combinations as the forward pass.
pub(crate) fn einsum_backward(e: &Einsum, inputs: &[Option<&Tensor>], dy: &[f32]) -> R<InputGrads> {
    let (values, shapes) = float_operands(inputs)?;
    let c = Contraction::new(e, &shapes)?;
    let mut grads: Vec<Vec<f32>> = values.iter().map(|v| vec![0.0; v.len()]).collect();
    c.each(|o, pos| {
        for (k, g) in grads.iter_mut().enumerate() {
            let others: f32 = pos
                .iter()
                .zip(&values)
                .enumerate()
                .filter(|(j, _)| *j != k)
                .map(|(_, (&p, v))| v[p])
                .product();
            g[pos[k]] += dy[o] * others;
        }
    });
    Ok(grads.into_iter().map(Some).collect())
}
