//! The backward semantics of the IR operators: given a node's inputs, outputs, what its
//! forward pass saved, and the gradients of its outputs, the gradients of its inputs.
//! Integer inputs (shapes, indices, masks) get none.

use ralpc_ir::{Binary, Op, PoolKind, ReduceKind, Unary, Variadic};

use super::indexing;
use super::kernels;
use super::ops::{self, floats, input, Saved};
use super::tensor::{self as t, Tensor};
use super::volume;

type R<T> = Result<T, ops::OpError>;

/// One gradient per input slot, `None` where the input is absent, an integer, or constant
/// with respect to the output.
pub type InputGrads = Vec<Option<Vec<f32>>>;

fn grads(n: usize) -> InputGrads {
    vec![None; n]
}

/// The gradient of a reshaping op: the output gradient under the input's shape.
fn passthrough(n: usize, dy: &[f32]) -> InputGrads {
    let mut g = grads(n);
    g[0] = Some(dy.to_vec());
    g
}

/// Gradients of `op`'s inputs from `dy`, the gradient of its first output (the only one
/// training differentiates through; Split gets one per output in `dys`).
pub fn backward(
    op: &Op,
    inputs: &[Option<&Tensor>],
    outputs: &[&Tensor],
    saved: &Saved,
    dys: &[Option<&[f32]>],
) -> R<InputGrads> {
    let n = inputs.len();
    let y: &Tensor = outputs.first().ok_or("the node has no output")?;
    let zeros;
    let dy = match dys.first().copied().flatten() {
        Some(d) => d,
        None => {
            zeros = vec![0.0; y.len()];
            &zeros
        }
    };
    let x = input(inputs, 0)?;
    Ok(match op {
        Op::Conv(c) if x.shape.len() == 5 => volume::conv_backward(c, inputs, dy)?,
        Op::ConvTranspose(c) if x.shape.len() == 5 => {
            volume::conv_transpose_backward(c, inputs, dy)?
        }
        Op::Pool(p) if x.shape.len() > 4 => {
            let dx = match (p.kind, saved) {
                (PoolKind::Max, Saved::Argmax(argmax)) => {
                    let mut dx = vec![0.0; x.len()];
                    kernels::max_pool_backward(argmax, dy, &mut dx);
                    dx
                }
                (PoolKind::Average, _) => volume::average_backward(p, x, dy)?,
                _ => return Err("max pooling saved no argmax".into()),
            };
            passthrough(n, &dx)
        }
        Op::Conv(c) => {
            let w = input(inputs, 1)?;
            let (g, _) = ops::conv_geometry(c, &x.shape, &w.shape)?;
            let mut dx = vec![0.0; x.len()];
            let mut dw = vec![0.0; w.len()];
            let has_bias = inputs.get(2).copied().flatten().is_some();
            let mut db = vec![0.0; if has_bias { g.out_channels } else { 0 }];
            g.backward(
                floats(x, "X")?,
                floats(w, "W")?,
                dy,
                Some(&mut dx),
                &mut dw,
                has_bias.then_some(&mut db[..]),
            );
            let mut out = grads(n);
            out[0] = Some(dx);
            out[1] = Some(dw);
            if has_bias {
                out[2] = Some(db);
            }
            out
        }
        Op::ConvTranspose(c) => {
            // y = Jᵀx for the convolution J whose input gradient the op is: dx = J·dy
            // (that convolution's forward on dy), and dW is its weight gradient with dy
            // as the input and x as the output's gradient.
            let w = input(inputs, 1)?;
            let (g, _) = ops::conv_transpose_geometry(c, &x.shape, &w.shape)?;
            let (xs, ws) = (floats(x, "X")?, floats(w, "W")?);
            let mut dx = vec![0.0; x.len()];
            g.forward(dy, ws, None, &mut dx);
            let mut dw = vec![0.0; w.len()];
            g.backward(dy, ws, xs, None, &mut dw, None);
            let mut out = grads(n);
            out[0] = Some(dx);
            out[1] = Some(dw);
            if inputs.get(2).copied().flatten().is_some() {
                let pixels = g.input.0 * g.input.1;
                let mut db = vec![0.0; g.in_channels];
                for (i, plane) in dy.chunks(pixels).enumerate() {
                    db[i % g.in_channels] += plane.iter().sum::<f32>();
                }
                out[2] = Some(db);
            }
            out
        }
        Op::Gemm(g) => gemm(g, inputs, dy)?,
        Op::MatMul => matmul(x, input(inputs, 1)?, dy)?,
        // Integers and booleans (Not, Sign of a mask, IsNaN's answer) carry no gradient.
        Op::Unary(_) if !x.is_float() || !y.is_float() => grads(n),
        // Its output alone ([`Op::backward_reads`]): the input may be released.
        Op::Unary(u) if !op.backward_reads().input(0) => {
            let ys = floats(y, "Y")?;
            let dx: Vec<f32> = ys
                .iter()
                .zip(dy)
                .map(|(&v, &g)| g * output_derivative(*u, v))
                .collect();
            passthrough(n, &dx)
        }
        Op::Unary(u) => {
            let xs = floats(x, "X")?;
            let ys = floats(y, "Y")?;
            let mut dx = vec![0.0; xs.len()];
            if let Unary::Gelu { tanh } = u {
                kernels::gelu_backward(*tanh, xs, dy, &mut dx);
            } else {
                for i in 0..xs.len() {
                    dx[i] = dy[i] * unary_derivative(*u, xs[i], ys[i]);
                }
            }
            passthrough(n, &dx)
        }
        Op::Clip { min, max } => {
            let bound = |attr: &Option<f32>, i: usize| {
                attr.or_else(|| {
                    inputs
                        .get(i)
                        .copied()
                        .flatten()
                        .and_then(|t| t.to_f64s().first().map(|&v| v as f32))
                })
            };
            let (lo, hi) = (bound(min, 1), bound(max, 2));
            let xs = floats(x, "X")?;
            let dx = xs
                .iter()
                .zip(dy)
                .map(|(&v, &g)| {
                    let inside = lo.is_none_or(|l| v >= l) && hi.is_none_or(|h| v <= h);
                    if inside {
                        g
                    } else {
                        0.0
                    }
                })
                .collect::<Vec<_>>();
            passthrough(n, &dx)
        }
        Op::Binary(b) => binary(*b, x, input(inputs, 1)?, y, dy)?,
        Op::Variadic(v) => variadic(*v, inputs, y, dy)?,
        Op::Resize(r) => {
            // Back through each resampled axis, last first, from the shape it produced.
            let steps = ops::resize_taps(r, inputs, &x.shape)?;
            let mut shapes = vec![x.shape.clone()];
            for (axis, taps) in &steps {
                let mut next = shapes[shapes.len() - 1].clone();
                next[*axis] = taps.len();
                shapes.push(next);
            }
            let mut g = dy.to_vec();
            for (k, (axis, taps)) in steps.iter().enumerate().rev() {
                g = ops::resample(&g, &shapes[k], *axis, taps, true);
            }
            passthrough(n, &g)
        }
        Op::Softmax { axis, log, flatten } => {
            let (outer, width, inner) = ops::softmax_layout(&y.shape, *axis, *flatten)?;
            let ys = floats(y, "Y")?;
            let mut dx = vec![0.0; ys.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let at = |k: usize| (o * width + k) * inner + i;
                    if *log {
                        let sum: f32 = (0..width).map(|k| dy[at(k)]).sum();
                        for k in 0..width {
                            dx[at(k)] = dy[at(k)] - ys[at(k)].exp() * sum;
                        }
                    } else {
                        let dot: f32 = (0..width).map(|k| dy[at(k)] * ys[at(k)]).sum();
                        for k in 0..width {
                            dx[at(k)] = ys[at(k)] * (dy[at(k)] - dot);
                        }
                    }
                }
            }
            passthrough(n, &dx)
        }
        Op::Pool(p) => {
            let (g, _, _) = ops::pool_geometry(p, &x.shape)?;
            let mut dx = vec![0.0; x.len()];
            match (p.kind, saved) {
                (PoolKind::Max, Saved::Argmax(argmax)) => {
                    kernels::max_pool_backward(argmax, dy, &mut dx);
                }
                (PoolKind::Average, _) => g.average_backward(p.count_include_pad, dy, &mut dx),
                _ => return Err("max pooling saved no argmax".into()),
            }
            passthrough(n, &dx)
        }
        Op::GlobalPool(PoolKind::Average) => {
            let area = t::numel(&x.shape[2..]).max(1);
            let dx: Vec<f32> = (0..x.len()).map(|i| dy[i / area] / area as f32).collect();
            passthrough(n, &dx)
        }
        Op::GlobalPool(kind) => {
            let xs = floats(x, "X")?;
            let area = t::numel(&x.shape[2..]).max(1);
            let mut dx = vec![0.0; xs.len()];
            for (p, (plane, d)) in xs.chunks(area).zip(dx.chunks_mut(area)).enumerate() {
                match kind {
                    PoolKind::Average => d.iter_mut().for_each(|v| *v = dy[p] / area as f32),
                    PoolKind::Max => {
                        let best =
                            (0..plane.len())
                                .fold(0, |b, i| if plane[i] > plane[b] { i } else { b });
                        d[best] = dy[p];
                    }
                }
            }
            passthrough(n, &dx)
        }
        Op::BatchNorm { epsilon, .. } => {
            batch_norm_synced(*epsilon, inputs, saved, dy, &mut |_| Ok(()))?
        }
        Op::LayerNorm { axis, .. } => {
            let Saved::Stats(mean, inv_std) = saved else {
                return Err("layer normalization saved no statistics".into());
            };
            let a = ops::axis_of(*axis, x.shape.len())?;
            let width = t::numel(&x.shape[a..]);
            let gamma = floats(input(inputs, 1)?, "Scale")?;
            let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; width], vec![0.0; width]);
            kernels::layer_norm_backward(
                width,
                floats(x, "X")?,
                gamma,
                (mean, inv_std),
                dy,
                &mut dx,
                &mut dg,
                &mut db,
            );
            let mut out = grads(n);
            out[0] = Some(dx);
            out[1] = Some(dg);
            if inputs.get(2).copied().flatten().is_some() {
                out[2] = Some(db);
            }
            out
        }
        Op::Lrn {
            size,
            alpha,
            beta,
            bias,
        } => {
            let (size, alpha, beta, bias) = (*size as usize, *alpha, *beta, *bias);
            let channels = x.shape[1];
            let spatial = t::numel(&x.shape[2..]);
            let xs = floats(x, "X")?;
            let scale = |i: usize| {
                let (plane, c, s) = (
                    i / (channels * spatial),
                    (i / spatial) % channels,
                    i % spatial,
                );
                let sum: f32 = ops::lrn_window(c, size, channels)
                    .map(|k| xs[(plane * channels + k) * spatial + s].powi(2))
                    .sum();
                bias + alpha / size as f32 * sum
            };
            let scales: Vec<f32> = (0..xs.len()).map(scale).collect();
            let mut dx = vec![0.0; xs.len()];
            for j in 0..xs.len() {
                let (plane, c, s) = (
                    j / (channels * spatial),
                    (j / spatial) % channels,
                    j % spatial,
                );
                dx[j] += dy[j] * scales[j].powf(-beta);
                // y_j depends on every x_k in its window through s_j.
                let common =
                    -2.0 * alpha * beta / size as f32 * dy[j] * xs[j] * scales[j].powf(-beta - 1.0);
                for k in ops::lrn_window(c, size, channels) {
                    let i = (plane * channels + k) * spatial + s;
                    dx[i] += common * xs[i];
                }
            }
            passthrough(n, &dx)
        }
        Op::Concat { axis } => {
            let a = ops::axis_of(*axis, y.shape.len())?;
            let sizes: Vec<usize> = (0..n)
                .map(|i| input(inputs, i).map(|p| p.shape[a]))
                .collect::<R<_>>()?;
            let dyt = Tensor::f32(y.shape.clone(), dy.to_vec());
            ops::split(&dyt, a, &sizes)
                .into_iter()
                .zip(inputs)
                .map(|(part, i)| {
                    i.filter(|t| t.is_float())
                        .and_then(|_| part.floats().map(<[f32]>::to_vec))
                })
                .collect()
        }
        Op::Split { axis, .. } => {
            let a = ops::axis_of(*axis, x.shape.len())?;
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
            let whole = ops::concat(&refs, a as i64)?;
            passthrough(n, whole.floats().unwrap_or_default())
        }
        Op::Slice { ranges } => {
            let (_, positions) =
                ops::slice_positions(&ops::slice_ranges(ranges, inputs)?, &x.shape);
            let mut dx = vec![0.0; x.len()];
            for (g, i) in dy.iter().zip(positions) {
                dx[i] += g;
            }
            passthrough(n, &dx)
        }
        Op::Flatten { .. }
        | Op::Reshape { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Identity
        | Op::Dropout { .. } => passthrough(n, dy),
        Op::Cast { to } if to.is_float() && x.is_float() => passthrough(n, dy),
        Op::Transpose { perm } => {
            let r = x.shape.len();
            let perm: Vec<usize> = match perm {
                Some(p) => p.iter().map(|&a| ops::axis_of(a, r)).collect::<R<_>>()?,
                None => (0..r).rev().collect(),
            };
            let mut inverse = vec![0; r];
            for (d, &p) in perm.iter().enumerate() {
                inverse[p] = d;
            }
            let dyt = Tensor::f32(y.shape.clone(), dy.to_vec());
            passthrough(
                n,
                ops::transpose(&dyt, &inverse).floats().unwrap_or_default(),
            )
        }
        Op::Gather { axis } => {
            let idx = input(inputs, 1)?;
            let a = ops::axis_of(*axis, x.shape.len())?;
            let dim = x.shape[a];
            let (outer, inner) = (t::numel(&x.shape[..a]), t::numel(&x.shape[a + 1..]));
            let mut dx = vec![0.0; x.len()];
            let picks = idx.to_i64s();
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
            passthrough(n, &dx)
        }
        Op::Expand => passthrough(n, &t::unbroadcast(dy, &y.shape, &x.shape)),
        Op::Reduce {
            kind,
            axes,
            noop_with_empty_axes,
            ..
        } => match ops::reduce_axes(axes, *noop_with_empty_axes, inputs, x.shape.len())? {
            Some(axes) => passthrough(n, &reduce(*kind, x, y, &axes, dy)?),
            None => passthrough(n, dy),
        },
        Op::Pad { mode, pads } => {
            let (_, sources) = ops::pad_sources(pads, *mode, inputs)?;
            let mut dx = vec![0.0; x.len()];
            for (g, src) in dy.iter().zip(sources) {
                if let Some(i) = src {
                    dx[i] += g;
                }
            }
            passthrough(n, &dx)
        }
        Op::Where => {
            let (c, a, b) = (x, input(inputs, 1)?, input(inputs, 2)?);
            let cond: Vec<f64> = c.to_f64s();
            let mask: Vec<bool> = t::broadcast(&c.shape, &y.shape)
                .map(|i| cond[i] != 0.0)
                .collect();
            let da: Vec<f32> = dy
                .iter()
                .zip(&mask)
                .map(|(&g, &m)| if m { g } else { 0.0 })
                .collect();
            let db: Vec<f32> = dy
                .iter()
                .zip(&mask)
                .map(|(&g, &m)| if m { 0.0 } else { g })
                .collect();
            let mut out = grads(n);
            if a.is_float() {
                out[1] = Some(t::unbroadcast(&da, &y.shape, &a.shape));
            }
            if b.is_float() {
                out[2] = Some(t::unbroadcast(&db, &y.shape, &b.shape));
            }
            out
        }
        Op::Recurrent(r) => super::recurrent::backward(r, inputs, dys)?,
        Op::GatherElements { axis } => indexing::gather_elements_backward(inputs, *axis, dy)?,
        Op::GatherNd { batch_dims } => indexing::gather_nd_backward(inputs, *batch_dims, dy)?,
        Op::ScatterElements { axis, reduction } => {
            indexing::scatter_elements_backward(inputs, *axis, *reduction, dy)?
        }
        Op::ScatterNd { reduction } => indexing::scatter_nd_backward(inputs, *reduction, dy)?,
        Op::CumSum { exclusive, reverse } => {
            indexing::cumsum_backward(inputs, *exclusive, *reverse, dy)?
        }
        Op::Einsum(e) => indexing::einsum_backward(e, inputs, dy)?,
        Op::Stft { onesided } => super::signal::stft_backward(inputs, *onesided, dy)?,
        Op::Tile => super::rearrange::tile_backward(inputs, dy)?,
        Op::ReverseSequence { batch_axis, .. } => {
            super::rearrange::reverse_sequence_backward(inputs, *batch_axis, dy)?
        }
        Op::DepthToSpace { blocksize, crd } => {
            super::rearrange::to_space_backward(inputs, *blocksize, *crd, true, dy)?
        }
        Op::SpaceToDepth { blocksize } => {
            super::rearrange::to_space_backward(inputs, *blocksize, false, false, dy)?
        }
        Op::InstanceNorm { epsilon } => {
            super::normalize::group_norm_backward(inputs, None, *epsilon, dy)?
        }
        Op::GroupNorm { groups, epsilon } => {
            super::normalize::group_norm_backward(inputs, Some(*groups), *epsilon, dy)?
        }
        // Indices: no gradient.
        Op::ArgExtreme { .. } => grads(n),
        Op::Trilu { upper } => {
            let k = inputs
                .get(1)
                .copied()
                .flatten()
                .and_then(|k| k.to_i64s().first().copied())
                .unwrap_or(0);
            let r = x.shape.len();
            let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
            let dx = dy
                .iter()
                .enumerate()
                .map(|(e, &g)| {
                    if ops::trilu_keeps((e / cols) % rows, e % cols, *upper, k) {
                        g
                    } else {
                        0.0
                    }
                })
                .collect::<Vec<_>>();
            passthrough(n, &dx)
        }
        Op::Shape { .. } | Op::ConstantOfShape { .. } | Op::Range | Op::Cast { .. } => grads(n),
        other => {
            return Err(format!(
                "{} has no backward pass in the CPU backend",
                other.name()
            ))
        }
    })
}

/// The input gradient of a reduction over `axes`; the output (keepdims or not) holds one
/// value per kept index, in order.
fn reduce(kind: ReduceKind, x: &Tensor, y: &Tensor, axes: &[usize], dy: &[f32]) -> R<Vec<f32>> {
    let kept = ops::kept_shape(&x.shape, axes);
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
                        ReduceKind::L1 => ops::sign(v),
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
fn variadic(v: Variadic, inputs: &[Option<&Tensor>], y: &Tensor, dy: &[f32]) -> R<InputGrads> {
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

/// The derivative of `u` at the input whose output is `y`, for the ops whose backward
/// reads their output alone ([`Op::backward_reads`]).
fn output_derivative(u: Unary, y: f32) -> f32 {
    match u {
        Unary::Relu => f32::from(u8::from(y > 0.0)),
        Unary::Sigmoid => y * (1.0 - y),
        Unary::Tanh => 1.0 - y * y,
        Unary::Sqrt => 0.5 / y,
        Unary::Exp => y,
        Unary::Reciprocal => -y * y,
        // Not one of them: the gradient checks (`tests/grad.rs`) fail on it.
        _ => f32::NAN,
    }
}

fn unary_derivative(u: Unary, x: f32, y: f32) -> f32 {
    match u {
        Unary::LeakyRelu { alpha } => {
            if x >= 0.0 {
                1.0
            } else {
                alpha
            }
        }
        Unary::HardSigmoid { alpha, beta } => {
            let v = alpha * x + beta;
            if v > 0.0 && v < 1.0 {
                alpha
            } else {
                0.0
            }
        }
        Unary::HardSwish => {
            if x < -3.0 {
                0.0
            } else if x > 3.0 {
                1.0
            } else {
                (2.0 * x + 3.0) / 6.0
            }
        }
        Unary::Erf => 2.0 / std::f32::consts::PI.sqrt() * (-x * x).exp(),
        Unary::Neg => -1.0,
        Unary::Log => 1.0 / x,
        Unary::Abs => ops::sign(x),
        Unary::Softplus => 1.0 / (1.0 + (-x).exp()),
        Unary::Softsign => 1.0 / ((1.0 + x.abs()) * (1.0 + x.abs())),
        Unary::Elu { alpha } => {
            if x > 0.0 {
                1.0
            } else {
                alpha * x.exp()
            }
        }
        Unary::Selu { alpha, gamma } => {
            if x > 0.0 {
                gamma
            } else {
                gamma * alpha * x.exp()
            }
        }
        Unary::Sin => x.cos(),
        Unary::Cos => -x.sin(),
        Unary::Tan => 1.0 + y * y,
        Unary::Asin => 1.0 / (1.0 - x * x).sqrt(),
        Unary::Acos => -1.0 / (1.0 - x * x).sqrt(),
        Unary::Atan => 1.0 / (1.0 + x * x),
        Unary::Sinh => x.cosh(),
        Unary::Cosh => x.sinh(),
        Unary::Asinh => 1.0 / (x * x + 1.0).sqrt(),
        Unary::Acosh => 1.0 / (x * x - 1.0).sqrt(),
        Unary::Atanh => 1.0 / (1.0 - x * x),
        Unary::Mish => {
            // d/dx x·tanh(sp(x)) = tanh(sp) + x·(1 − tanh²(sp))·sigmoid(x).
            let t = ops::unary_value(Unary::Softplus, x).tanh();
            t + x * (1.0 - t * t) / (1.0 + (-x).exp())
        }
        Unary::Celu { alpha } => {
            if x > 0.0 {
                1.0
            } else {
                (x / alpha).exp()
            }
        }
        Unary::ThresholdedRelu { alpha } => {
            if x > alpha {
                1.0
            } else {
                0.0
            }
        }
        Unary::Shrink { lambd, .. } => {
            if x.abs() > lambd {
                1.0
            } else {
                0.0
            }
        }
        u if u.is_step() => 0.0,
        _ => f32::NAN,
    }
}

/// The gradients of `p ∘ q` with respect to `p` and `q`, given the output's `g`.
fn elementwise(b: Binary, p: f32, q: f32, g: f32) -> (f32, f32) {
    match b {
        Binary::Add => (g, g),
        Binary::Sub => (g, -g),
        Binary::Mul => (g * q, g * p),
        Binary::Div => (g / q, -g * p / (q * q)),
        Binary::Pow => (g * q * p.powf(q - 1.0), g * p.ln() * p.powf(q)),
        // p − q·k with k = ⌊p/q⌋ (Mod) or trunc(p/q) (Fmod), constant between its steps.
        Binary::Mod => (g, -g * (p / q).floor()),
        Binary::Fmod => (g, -g * (p / q).trunc()),
        Binary::PRelu => {
            if p >= 0.0 {
                (g, 0.0)
            } else {
                (g * q, g * p)
            }
        }
        _ => (0.0, 0.0),
    }
}

fn binary(b: Binary, x: &Tensor, z: &Tensor, y: &Tensor, dy: &[f32]) -> R<InputGrads> {
    let mut out = grads(2);
    if b.is_boolean() {
        return Ok(out);
    }
    // A sum or difference reads shapes alone ([`Op::backward_reads`]).
    if let Binary::Add | Binary::Sub = b {
        let negated: Vec<f32>;
        let dz = match b {
            Binary::Sub => {
                negated = dy.iter().map(|g| -g).collect();
                &negated
            }
            _ => dy,
        };
        if x.is_float() {
            out[0] = Some(t::unbroadcast(dy, &y.shape, &x.shape));
        }
        if z.is_float() {
            out[1] = Some(t::unbroadcast(dz, &y.shape, &z.shape));
        }
        return Ok(out);
    }
    // Both operands whole and float (a residual add): elementwise, with no index vectors
    // or widened copies (the general path below took 30 ns per element at 800 k elements).
    if let (Some(p), Some(q), true) = (x.floats(), z.floats(), x.shape == z.shape) {
        if x.shape == y.shape {
            let (da, dc): (Vec<f32>, Vec<f32>) = dy
                .iter()
                .zip(p.iter().zip(q))
                .map(|(&g, (&p, &q))| elementwise(b, p, q, g))
                .unzip();
            out[0] = Some(da);
            out[1] = Some(dc);
            return Ok(out);
        }
    }
    let (a, c) = (x.to_f64s(), z.to_f64s());
    let ia: Vec<usize> = t::broadcast(&x.shape, &y.shape).collect();
    let ic: Vec<usize> = t::broadcast(&z.shape, &y.shape).collect();
    let mut da = vec![0.0f32; dy.len()];
    let mut dc = vec![0.0f32; dy.len()];
    for k in 0..dy.len() {
        let (gp, gq) = elementwise(b, a[ia[k]] as f32, c[ic[k]] as f32, dy[k]);
        da[k] = gp;
        dc[k] = gq;
    }
    if x.is_float() {
        out[0] = Some(t::unbroadcast(&da, &y.shape, &x.shape));
    }
    if z.is_float() {
        out[1] = Some(t::unbroadcast(&dc, &y.shape, &z.shape));
    }
    Ok(out)
}

fn gemm(g: &ralpc_ir::Gemm, inputs: &[Option<&Tensor>], dy: &[f32]) -> R<InputGrads> {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    let (xa, xb) = (floats(a, "A")?, floats(b, "B")?);
    let (m, k) = if g.trans_a {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let n = if g.trans_b { b.shape[0] } else { b.shape[1] };
    let mut da = vec![0.0; a.len()];
    if g.trans_a {
        // A is k×m: dA = α·op(B)·dYᵀ.
        kernels::gemm(k, n, m, g.alpha, xb, g.trans_b, dy, true, 0.0, &mut da);
    } else {
        // dA = α·dY·op(B)ᵀ.
        kernels::gemm(m, n, k, g.alpha, dy, false, xb, !g.trans_b, 0.0, &mut da);
    }
    let mut db = vec![0.0; b.len()];
    if g.trans_b {
        // B is n×k: dB = α·dYᵀ·op(A).
        kernels::gemm(n, m, k, g.alpha, dy, true, xa, g.trans_a, 0.0, &mut db);
    } else {
        // dB = α·op(A)ᵀ·dY.
        kernels::gemm(k, m, n, g.alpha, xa, !g.trans_a, dy, false, 0.0, &mut db);
    }
    let mut out = grads(inputs.len());
    out[0] = Some(da);
    out[1] = Some(db);
    if let Some(c) = inputs.get(2).copied().flatten() {
        let scaled: Vec<f32> = dy.iter().map(|v| v * g.beta).collect();
        out[2] = Some(t::unbroadcast(&scaled, &[m, n], &c.shape));
    }
    Ok(out)
}

fn matmul(a: &Tensor, b: &Tensor, dy: &[f32]) -> R<InputGrads> {
    let (ash, bsh) = ops::matmul_shapes(&a.shape, &b.shape)?;
    let (m, k, n) = (ash[ash.len() - 2], ash[ash.len() - 1], bsh[bsh.len() - 1]);
    let (abatch, bbatch) = (&ash[..ash.len() - 2], &bsh[..bsh.len() - 2]);
    let batch = t::broadcast_shapes(abatch, bbatch).ok_or("the batch axes do not broadcast")?;
    let (xa, xb) = (floats(a, "A")?, floats(b, "B")?);
    let ia: Vec<usize> = t::broadcast(abatch, &batch).collect();
    let ib: Vec<usize> = t::broadcast(bbatch, &batch).collect();
    let mut da = vec![0.0; xa.len()];
    let mut db = vec![0.0; xb.len()];
    if bbatch.is_empty() && xa.len() == t::numel(&batch) * m * k {
        // A batch of rows times one matrix: dA = dY·Bᵀ and dB = Aᵀ·dY as single products.
        let rows = t::numel(&batch) * m;
        kernels::gemm(rows, n, k, 1.0, dy, false, xb, true, 0.0, &mut da);
        kernels::gemm(k, rows, n, 1.0, xa, true, dy, false, 0.0, &mut db);
        return Ok(vec![Some(da), Some(db)]);
    }
    // Per broadcast batch element, then summed onto the operand's own batch element.
    let mut ta = vec![0.0; m * k];
    let mut tb = vec![0.0; k * n];
    for (i, g) in dy.chunks(m * n).enumerate() {
        kernels::gemm(
            m,
            n,
            k,
            1.0,
            g,
            false,
            &xb[ib[i] * k * n..],
            true,
            0.0,
            &mut ta,
        );
        kernels::add(&mut da[ia[i] * m * k..(ia[i] + 1) * m * k], &ta);
        kernels::gemm(
            k,
            m,
            n,
            1.0,
            &xa[ia[i] * m * k..],
            true,
            g,
            false,
            0.0,
            &mut tb,
        );
        kernels::add(&mut db[ib[i] * k * n..(ib[i] + 1) * k * n], &tb);
    }
    Ok(vec![Some(da), Some(db)])
}

/// Batch normalization's backward pass, whose batch terms are those of every rank's
/// samples: `sums` adds up what each holds ([`kernels::BatchNorm::gradient_sums`]).
pub(crate) fn batch_norm_synced(
    epsilon: f32,
    inputs: &[Option<&Tensor>],
    saved: &Saved,
    dy: &[f32],
    sums: ops::BatchSums<'_>,
) -> R<InputGrads> {
    let Saved::Stats(mean, inv_std) = saved else {
        return Err("batch normalization's backward needs training-mode statistics".into());
    };
    let x = input(inputs, 0)?;
    let gamma = floats(input(inputs, 1)?, "scale")?;
    let channels = gamma.len();
    let bn = kernels::BatchNorm {
        channels,
        spatial: t::numel(&x.shape[2..]),
        epsilon,
    };
    let xs = floats(x, "X")?;
    let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; channels], vec![0.0; channels]);
    let mut batch = bn.gradient_sums(xs, (mean, inv_std), dy);
    bn.parameter_gradients(&batch, &mut dg, &mut db);
    sums(&mut batch)?;
    bn.input_gradient(xs, gamma, (mean, inv_std), dy, &mut dx, &batch);
    let mut out = grads(inputs.len());
    out[0] = Some(dx);
    out[1] = Some(dg);
    out[2] = Some(db);
    Ok(out)
}
