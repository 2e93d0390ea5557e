//! Reductions over axes (the ten ONNX `Reduce*` operators) and elementwise functions of
//! any number of broadcast tensors (Sum, Mean, Max, Min), forward and backward.

use ralpc_ir::{Binary, ReduceKind, Variadic};

use super::grad::{grads, InputGrads};
use super::ops::{axis_of, binary, floats, ints_or_input, operands, sign, R};
use super::tensor::{self as t, Data, Tensor};

/// The axes a reduction runs over, from its attribute or input 1; `None` when it is the
/// identity (no axes with `noop_with_empty_axes`).
pub(crate) fn reduce_axes(
    axes: &Option<Vec<i64>>,
    noop: bool,
    inputs: &[Option<&Tensor>],
    rank: usize,
) -> R<Option<Vec<usize>>> {
    Ok(match ints_or_input(axes, inputs, 1) {
        Some(a) if !a.is_empty() => Some(a.iter().map(|&a| axis_of(a, rank)).collect::<R<_>>()?),
        _ if noop => None,
        _ => Some((0..rank).collect()),
    })
}

/// `shape` with the reduced `axes` set to 1: the output's shape under keepdims, whose
/// row-major order is the output's either way.
pub(crate) fn kept_shape(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| if axes.contains(&d) { 1 } else { n })
        .collect()
}

/// A reduction of `x` over `axes`, accumulated in f64.
pub(crate) fn reduce(kind: ReduceKind, x: &Tensor, axes: &[usize], keepdims: bool) -> R<Tensor> {
    let xs = x.to_f64s();
    let kept = kept_shape(&x.shape, axes);
    let count = axes.iter().map(|&a| x.shape[a]).product::<usize>().max(1) as f64;
    let init = match kind {
        ReduceKind::Prod => 1.0,
        ReduceKind::Max | ReduceKind::LogSumExp => f64::NEG_INFINITY,
        ReduceKind::Min => f64::INFINITY,
        _ => 0.0,
    };
    let mut acc = vec![init; t::numel(&kept)];
    let at = || xs.iter().zip(t::broadcast(&kept, &x.shape));
    // LogSumExp sums e^(x − max) and adds the max back, so that large inputs stay finite.
    let shift = if kind == ReduceKind::LogSumExp {
        for (&v, o) in at() {
            acc[o] = acc[o].max(v);
        }
        let shift = acc
            .iter()
            .map(|&m| if m.is_finite() { m } else { 0.0 })
            .collect();
        acc.fill(0.0);
        shift
    } else {
        Vec::new()
    };
    for (&v, o) in at() {
        let a = &mut acc[o];
        match kind {
            ReduceKind::Sum | ReduceKind::Mean | ReduceKind::LogSum => *a += v,
            ReduceKind::Max => *a = if v > *a || v.is_nan() { v } else { *a },
            ReduceKind::Min => *a = if v < *a || v.is_nan() { v } else { *a },
            ReduceKind::Prod => *a *= v,
            ReduceKind::L1 => *a += v.abs(),
            ReduceKind::L2 | ReduceKind::SumSquare => *a += v * v,
            ReduceKind::LogSumExp => *a += (v - shift[o]).exp(),
        }
    }
    for (o, a) in acc.iter_mut().enumerate() {
        *a = match kind {
            ReduceKind::Mean => *a / count,
            ReduceKind::L2 => a.sqrt(),
            ReduceKind::LogSum => a.ln(),
            ReduceKind::LogSumExp => a.ln() + shift[o],
            _ => *a,
        };
    }
    let shape = if keepdims {
        kept
    } else {
        x.shape
            .iter()
            .enumerate()
            .filter(|(d, _)| !axes.contains(d))
            .map(|(_, &n)| n)
            .collect()
    };
    Ok(match x.data {
        Data::F32(_) => Tensor::f32(shape, acc.iter().map(|&a| a as f32).collect()),
        Data::I64(_) => Tensor::i64(shape, acc.iter().map(|&a| a as i64).collect()),
    })
}

/// Sum, Mean, Max or Min of any number of broadcast tensors.
pub(crate) fn variadic(v: Variadic, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let xs: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
    let first = xs
        .first()
        .ok_or_else(|| operands("the node has no input"))?;
    if v == Variadic::Sum {
        // In the inputs' own type, as chained Adds compute it.
        let mut acc = (*first).clone();
        for x in &xs[1..] {
            acc = binary(Binary::Add, &acc, x)?;
        }
        return Ok(acc);
    }
    let mut shape = first.shape.clone();
    for x in &xs[1..] {
        shape = t::broadcast_shapes(&shape, &x.shape).ok_or_else(|| {
            operands(format!(
                "shapes {shape:?} and {:?} do not broadcast",
                x.shape
            ))
        })?;
    }
    let values = first.to_f64s();
    let mut acc: Vec<f64> = t::broadcast(&first.shape, &shape)
        .map(|i| values[i])
        .collect();
    for x in &xs[1..] {
        let vals = x.to_f64s();
        for (a, i) in acc.iter_mut().zip(t::broadcast(&x.shape, &shape)) {
            let b = vals[i];
            *a = match v {
                Variadic::Sum | Variadic::Mean => *a + b,
                Variadic::Max => a.max(b),
                Variadic::Min => a.min(b),
            };
        }
    }
    if v == Variadic::Mean {
        let n = xs.len() as f64;
        acc.iter_mut().for_each(|a| *a /= n);
    }
    Ok(match first.data {
        Data::F32(_) => Tensor::f32(shape, acc.iter().map(|&a| a as f32).collect()),
        Data::I64(_) => Tensor::i64(shape, acc.iter().map(|&a| a as i64).collect()),
    })
}

/// The input gradient of a reduction over `axes`; the output (keepdims or not) holds one
/// value per kept index, in order.
pub(crate) fn reduce_backward(
    kind: ReduceKind,
    x: &Tensor,
    y: &Tensor,
    axes: &[usize],
    dy: &[f32],
) -> R<Vec<f32>> {
    let kept = kept_shape(&x.shape, axes);
    let count = (x.len() / y.len().max(1)).max(1) as f32;
    let at = || t::broadcast(&kept, &x.shape).enumerate();
    // A sum or mean reads shapes alone ([`Op::backward_reads`]).
    if let ReduceKind::Sum | ReduceKind::Mean = kind {
        let scale = match kind {
            ReduceKind::Mean => 1.0 / count,
            _ => 1.0,
        };
        return Ok(at().map(|(_, o)| dy[o] * scale).collect());
    }
    let xs = floats(x, "data")?;
    let ys = floats(y, "reduced")?;
    let mut dx = vec![0.0; xs.len()];
    match kind {
        // The first extreme element of each group takes the gradient (as a max pool does).
        ReduceKind::Max | ReduceKind::Min => {
            let mut taken = vec![false; ys.len()];
            for (i, o) in at() {
                if !taken[o] && xs[i] == ys[o] {
                    taken[o] = true;
                    dx[i] = dy[o];
                }
            }
        }
        // ∂Πx/∂xᵢ is the product of the others: y/xᵢ, unless xᵢ is the group's only zero.
        ReduceKind::Prod => {
            let mut zeros = vec![0usize; ys.len()];
            let mut others = vec![1.0f64; ys.len()];
            for (i, o) in at() {
                if xs[i] == 0.0 {
                    zeros[o] += 1;
                } else {
                    others[o] *= f64::from(xs[i]);
                }
            }
            for (i, o) in at() {
                dx[i] = dy[o]
                    * match (xs[i] == 0.0, zeros[o]) {
                        (false, _) => ys[o] / xs[i],
                        (true, 1) => others[o] as f32,
                        (true, _) => 0.0,
                    };
            }
        }
        _ => {
            for (i, o) in at() {
                let (v, r) = (xs[i], ys[o]);
                dx[i] = dy[o]
                    * match kind {
                        ReduceKind::L1 => sign(v),
                        ReduceKind::L2 if r != 0.0 => v / r,
                        ReduceKind::L2 => 0.0,
                        ReduceKind::LogSum => (-r).exp(),
                        ReduceKind::LogSumExp => (v - r).exp(),
                        ReduceKind::SumSquare => 2.0 * v,
                        _ => 1.0,
                    };
            }
        }
    }
    Ok(dx)
}

/// The input gradients of Sum, Mean, Max or Min over broadcast inputs: Max and Min send
/// each output's gradient to the first input that holds the extreme.
pub(crate) fn variadic_backward(
    v: Variadic,
    inputs: &[Option<&Tensor>],
    y: &Tensor,
    dy: &[f32],
) -> R<InputGrads> {
    let n = inputs.len();
    let mut out = grads(n);
    // Sum and Mean read shapes alone ([`Op::backward_reads`]).
    let ys = match v {
        Variadic::Max | Variadic::Min => y.to_f64s(),
        Variadic::Sum | Variadic::Mean => Vec::new(),
    };
    let mut taken = vec![false; dy.len()];
    for (slot, x) in inputs.iter().enumerate() {
        let Some(x) = x else { continue };
        if !x.is_float() {
            continue;
        }
        let full: Vec<f32> = match v {
            Variadic::Sum => dy.to_vec(),
            Variadic::Mean => dy.iter().map(|&g| g / n as f32).collect(),
            Variadic::Max | Variadic::Min => {
                let vals = x.to_f64s();
                t::broadcast(&x.shape, &y.shape)
                    .enumerate()
                    .map(|(k, i)| {
                        if !taken[k] && vals[i] == ys[k] {
                            taken[k] = true;
                            dy[k]
                        } else {
                            0.0
                        }
                    })
                    .collect()
            }
        };
        out[slot] = Some(t::unbroadcast(&full, &y.shape, &x.shape));
    }
    Ok(out)
}
