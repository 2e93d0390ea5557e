//! The backward semantics of the IR operators: given a node's inputs, outputs, what its
//! forward pass saved, and the gradients of its outputs, the gradients of its inputs.
//! Integer inputs (shapes, indices, masks) get none.
//!
//! This is the dispatcher, one line per operator: each family's backward pass lives beside
//! its forward pass (see [`super::ops`]).

use ralpc_ir::Op;

use super::elementwise;
use super::indexing;
use super::movement;
use super::normalize;
use super::ops::{self, input, operands, unsupported, Saved};
use super::products;
use super::reduce;
use super::resize;
use super::tensor::{self as t, Tensor};
use super::volume;
use super::window;

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
    let y: &Tensor = outputs
        .first()
        .ok_or_else(|| operands("the node has no output"))?;
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
            passthrough(n, &volume::pool_backward(p, x, saved, dy)?)
        }
        Op::Conv(c) => window::conv_backward(c, inputs, dy)?,
        Op::ConvTranspose(c) => window::conv_transpose_backward(c, inputs, dy)?,
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
        Op::Resize(r) => passthrough(n, &resize::resize_backward(r, inputs, x, dy)?),
        Op::Softmax { axis, log, flatten } => passthrough(
            n,
            &elementwise::softmax_backward((*axis, *log, *flatten), y, dy)?,
        ),
        Op::Pool(p) => passthrough(n, &window::pool_backward(p, x, saved, dy)?),
        Op::GlobalPool(kind) => passthrough(n, &window::global_pool_backward(*kind, x, dy)?),
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
        Op::Concat { axis } => movement::concat_backward(*axis, inputs, y, dy)?,
        Op::Split { axis, .. } => {
            passthrough(n, &movement::split_backward(*axis, x, outputs, dys)?)
        }
        Op::Slice { ranges } => passthrough(n, &movement::slice_backward(ranges, inputs, x, dy)?),
        Op::Flatten { .. }
        | Op::Reshape { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Identity
        | Op::Dropout { .. } => passthrough(n, dy),
        Op::Cast { to } if to.is_float() && x.is_float() => passthrough(n, dy),
        Op::Transpose { perm } => passthrough(n, &movement::transpose_backward(perm, x, y, dy)?),
        Op::Gather { axis } => passthrough(
            n,
            &movement::gather_backward(*axis, x, input(inputs, 1)?, dy)?,
        ),
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
            passthrough(n, &movement::pad_backward(*mode, pads, inputs, x, dy)?)
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
        Op::TopK { axis, .. } => {
            super::rearrange::top_k_backward(inputs, outputs.get(1).copied(), *axis, dy)?
        }
        Op::Trilu { upper } => passthrough(n, &movement::trilu_backward(*upper, inputs, x, dy)),
        Op::Shape { .. } | Op::ConstantOfShape { .. } | Op::Range | Op::Cast { .. } => grads(n),
        other => {
            return Err(unsupported(format!(
                "{} has no backward pass in the CPU backend",
                other.name()
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::ops::{Env, Mode, OpError};

    /// An op's failure says whose it is: what the backend lacks, operands that do not fit,
    /// or a disagreement with the executor (a bug).
    #[test]
    fn op_errors_say_what_failed() {
        let x = Tensor::f32(vec![2, 3], vec![0.0; 6]);
        let y = Tensor::i64(vec![], vec![6]);
        let size = backward(&Op::Size, &[Some(&x)], &[&y], &Saved::None, &[None]);
        assert!(matches!(size, Err(OpError::Unsupported(_))), "{size:?}");
        let env = Env {
            mode: Mode::Training,
            exported_batch: None,
            samples: None,
        };
        let far = Tensor::i64(vec![1], vec![7]);
        let gather = ops::forward(&Op::Gather { axis: 0 }, &[Some(&x), Some(&far)], 1, env);
        assert!(matches!(gather, Err(OpError::Operands(_))), "{gather:?}");
        // A max pool whose forward pass kept no argmax: the executor's fault.
        let pool = Op::Pool(ralpc_ir::Pool {
            kind: ralpc_ir::PoolKind::Max,
            kernel: vec![2, 2],
            strides: None,
            dilations: None,
            padding: ralpc_ir::Padding::Explicit(vec![0; 4]),
            ceil_mode: false,
            count_include_pad: false,
        });
        let image = Tensor::f32(vec![1, 1, 2, 2], vec![0.0; 4]);
        let pooled = Tensor::f32(vec![1, 1, 1, 1], vec![0.0]);
        let lost = backward(&pool, &[Some(&image)], &[&pooled], &Saved::None, &[None]);
        assert!(matches!(lost, Err(OpError::Inconsistent(_))), "{lost:?}");
    }
}
