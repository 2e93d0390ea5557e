//! The backward semantics of the IR operators: given a node's inputs, outputs, what its
//! forward pass saved, and the gradients of its outputs, the gradients of its inputs.
//! Integer inputs (shapes, indices, masks) get none.

use ralpc_ir::{Op, PoolKind};

use super::elementwise;
use super::indexing;
use super::kernels;
use super::normalize;
use super::ops::{self, floats, input, Saved};
use super::products;
use super::reduce;
use super::tensor::{self as t, Tensor};
use super::volume;

type R<T> = Result<T, ops::OpError>;

/// One gradient per input slot, `None` where the input is absent, an integer, or constant
/// with respect to the output.
pub type InputGrads = Vec<Option<Vec<f32>>>;

pub(crate) fn grads(n: usize) -> InputGrads {
    vec![None; n]
}

/// The gradient of a reshaping op: the output gradient under the input's shape.
pub(crate) fn passthrough(n: usize, dy: &[f32]) -> InputGrads {
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
        Op::Gemm(g) => products::gemm_backward(g, inputs, dy)?,
        Op::MatMul => products::matmul_backward(x, input(inputs, 1)?, dy)?,
        Op::Unary(u) => {
            let mut out = grads(n);
            out[0] = elementwise::unary_backward(*u, x, y, dy)?;
            out
        }
        Op::Clip { min, max } => {
            passthrough(n, &elementwise::clip_backward(*min, *max, inputs, dy)?)
        }
        Op::Binary(b) => elementwise::binary_backward(*b, x, input(inputs, 1)?, y, dy)?,
        Op::Variadic(v) => reduce::variadic_backward(*v, inputs, y, dy)?,
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
        Op::Softmax { axis, log, flatten } => passthrough(
            n,
            &elementwise::softmax_backward((*axis, *log, *flatten), y, dy)?,
        ),
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
            normalize::batch_norm_synced_backward(*epsilon, inputs, saved, dy, &mut |_| Ok(()))?
        }
        Op::LayerNorm { axis, .. } => normalize::layer_norm_backward(*axis, inputs, saved, dy)?,
        Op::Lrn {
            size,
            alpha,
            beta,
            bias,
        } => passthrough(
            n,
            &normalize::lrn_backward((*size, *alpha, *beta, *bias), x, dy)?,
        ),
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
            Some(axes) => passthrough(n, &reduce::reduce_backward(*kind, x, y, &axes, dy)?),
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
        Op::Where => elementwise::where_backward(inputs, y, dy)?,
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
