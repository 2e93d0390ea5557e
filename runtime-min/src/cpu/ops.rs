//! The forward semantics of every IR operator on host tensors, following the ONNX spec
//! (<https://onnx.ai/onnx/operators/>). Output shapes come from the inputs at run time —
//! never from the verifier's shapes — so that a rank computing its slice of a layer (fewer
//! samples, fewer channels) runs the same code.
//!
//! This is the dispatcher, one line per operator, and what every family shares (inputs,
//! axes, the run's [`Env`]). Each family's forward and backward passes live together:
//! `products.rs` (Gemm, MatMul), `elementwise.rs` (unary functions, Clip, binary ops,
//! Where, Dropout, softmax), `reduce.rs` (reductions, Sum/Mean/Max/Min of n tensors),
//! `normalize.rs` (batch, layer, instance, group and local response normalization),
//! `window.rs` (1-d and 2-d convolution and pooling; 1-d as 2-d with unit height) and
//! `volume.rs` (3-d), `movement.rs` (views, concatenation, slicing, transposition,
//! gathering, padding, casts, shape arithmetic), `resize.rs`, `indexing.rs` (the
//! element-indexed ops, Einsum), `rearrange.rs`, `signal.rs`, `recurrent.rs`.

use ralpc_ir::Op;

pub use super::elementwise::unary_value;
pub(crate) use super::elementwise::{binary, sign, softmax_layout};
use super::elementwise::{clip, dropout, softmax_of, unary, where_of};
use super::indexing;
use super::movement;
pub(crate) use super::movement::rebatched_reshape;
pub(crate) use super::normalize::batch_norm_synced;
use super::normalize::{batch_norm, layer_norm, lrn};
use super::products::{gemm, matmul};
pub(crate) use super::reduce::reduce_axes;
use super::reduce::{reduce, variadic};
use super::tensor::{self as t, Tensor};
use super::volume;
use super::window::{conv, conv_transpose, global_pool, pool};
pub(crate) use super::window::{conv_geometry, conv_transpose_geometry, pool_geometry};

/// Why an op could not run on the CPU backend (the caller names the node): the model's
/// problem, which no plan of it runs past.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// The backend has no semantics for this operator, or this use of it, yet.
    #[error("{0}")]
    Unsupported(String),
    /// Its operands or attributes do not fit what the operator needs (shapes, ranks,
    /// types, values).
    #[error("{0}")]
    Operands(String),
    /// An exchange among the ranks computing the op together failed (a recurrent layer
    /// split by its gates); the caller keeps the collective's typed error.
    #[error("{0}")]
    Exchange(String),
    /// What the executor hands the op disagrees with what the op needs (a forward pass
    /// that kept nothing for its backward, an input never computed): a bug in ralpc.
    #[error("{0}")]
    Inconsistent(String),
}

/// Operands or attributes that do not fit the operator ([`OpError::Operands`]).
pub(crate) fn operands(message: impl Into<String>) -> OpError {
    OpError::Operands(message.into())
}

/// A disagreement between the executor and the op ([`OpError::Inconsistent`]).
pub(crate) fn inconsistent(message: impl Into<String>) -> OpError {
    OpError::Inconsistent(message.into())
}

/// What the CPU backend does not compute ([`OpError::Unsupported`]).
pub(crate) fn unsupported(message: impl Into<String>) -> OpError {
    OpError::Unsupported(message.into())
}

pub(crate) type R<T> = Result<T, OpError>;

/// What a forward pass keeps for its backward pass beyond its inputs and outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Saved {
    /// Nothing.
    #[default]
    None,
    /// Max pooling: the input each output took.
    Argmax(Vec<u32>),
    /// Normalization: per-group mean and inverse standard deviation.
    Stats(Vec<f32>, Vec<f32>),
    /// Kept on the device that ran the forward pass, for its own backward pass.
    Resident(ResidentSaved),
}

/// What a device's forward pass kept for its backward pass, opaque to the host.
#[derive(Clone)]
pub struct ResidentSaved(pub std::sync::Arc<dyn std::any::Any + Send + Sync>);

impl std::fmt::Debug for ResidentSaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResidentSaved")
    }
}

impl PartialEq for ResidentSaved {
    /// The same state (not merely equal contents, which the host cannot see).
    fn eq(&self, other: &ResidentSaved) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Whether normalization uses batch statistics (training) or running ones (inference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Inference: batch normalization reads its running statistics, and convolutions may
    /// take faster algorithms that round more.
    Inference,
    /// Training: batch normalization normalizes by the batch's statistics.
    Training,
}

pub(crate) fn floats<'a>(x: &'a Tensor, what: &str) -> R<&'a [f32]> {
    x.floats()
        .ok_or_else(|| operands(format!("{what} must be a floating-point tensor")))
}

/// Input `i`, or an error saying it is missing.
pub(crate) fn input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> R<&'a Tensor> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| operands(format!("input {i} is missing")))
}

pub(crate) fn optional<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Option<&'a Tensor> {
    inputs.get(i).copied().flatten()
}

/// An attribute, or the integer tensor input `i` that replaces it in later opsets.
pub(crate) fn ints_or_input(
    attr: &Option<Vec<i64>>,
    inputs: &[Option<&Tensor>],
    i: usize,
) -> Option<Vec<i64>> {
    attr.clone()
        .or_else(|| optional(inputs, i).map(Tensor::to_i64s))
}

/// What every op of one run shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Env {
    /// Batch statistics or running ones.
    pub mode: Mode,
    /// The batch size a fixed-batch model was exported with, when it runs at another: a
    /// constant Reshape or Expand target that leads with it is re-batched, as the verifier
    /// does.
    pub exported_batch: Option<i64>,
    /// The samples the running computation holds (its share of the microbatch), when
    /// known: a Reshape of a tensor leading with them re-batches its target first, as the
    /// verifier does.
    pub samples: Option<usize>,
}

/// Runs `op` on `inputs`; `outputs` is how many outputs the node declares.
pub fn forward(
    op: &Op,
    inputs: &[Option<&Tensor>],
    outputs: usize,
    env: Env,
) -> R<(Vec<Tensor>, Saved)> {
    let mode = env.mode;
    let one = |t: Tensor| Ok((vec![t], Saved::None));
    match op {
        Op::Input | Op::Constant { .. } => Err(inconsistent("sources are not computed")),
        Op::Conv(c) if input(inputs, 0)?.shape.len() == 5 => one(volume::conv(c, inputs)?),
        Op::Conv(c) => one(conv(c, inputs, mode)?),
        Op::ConvTranspose(c) if input(inputs, 0)?.shape.len() == 5 => {
            one(volume::conv_transpose(c, inputs)?)
        }
        Op::ConvTranspose(c) => one(conv_transpose(c, inputs)?),
        Op::Gemm(g) => one(gemm(g, inputs)?),
        Op::MatMul => one(matmul(input(inputs, 0)?, input(inputs, 1)?)?),
        Op::Unary(u) => one(unary(*u, input(inputs, 0)?)?),
        Op::Clip { min, max } => one(clip(*min, *max, inputs)?),
        Op::Binary(b) => one(binary(*b, input(inputs, 0)?, input(inputs, 1)?)?),
        Op::Variadic(v) => one(variadic(*v, inputs)?),
        Op::Softmax { axis, log, flatten } => {
            one(softmax_of(input(inputs, 0)?, *axis, *log, *flatten)?)
        }
        Op::Pool(p) if input(inputs, 0)?.shape.len() > 4 => {
            let (y, saved) = volume::pool(p, input(inputs, 0)?)?;
            Ok((vec![y], saved))
        }
        Op::Pool(p) => pool(p, input(inputs, 0)?),
        Op::GlobalPool(kind) => one(global_pool(*kind, input(inputs, 0)?)?),
        Op::BatchNorm { epsilon, .. } => batch_norm(*epsilon, inputs, outputs, mode),
        Op::LayerNorm { axis, epsilon } => layer_norm(*axis, *epsilon, inputs, outputs),
        Op::Lrn {
            size,
            alpha,
            beta,
            bias,
        } => one(lrn(
            input(inputs, 0)?,
            *size as usize,
            *alpha,
            *beta,
            *bias,
        )?),
        Op::Concat { axis } => one(movement::concat_inputs(inputs, *axis)?),
        Op::Split { axis, sizes } => Ok((
            movement::split_inputs(*axis, sizes, inputs, outputs)?,
            Saved::None,
        )),
        Op::Slice { ranges } => one(movement::slice(ranges, inputs)?),
        Op::Flatten { axis } => one(movement::flatten(input(inputs, 0)?, *axis)?),
        Op::Reshape { allowzero } => one(movement::reshape(inputs, *allowzero, env)?),
        Op::Transpose { perm } => one(movement::transpose_by(input(inputs, 0)?, perm)?),
        Op::Squeeze { axes } => one(movement::squeeze(axes, inputs)?),
        Op::Unsqueeze { axes } => one(movement::unsqueeze(axes, inputs)?),
        Op::Gather { axis } => one(movement::gather(
            input(inputs, 0)?,
            input(inputs, 1)?,
            *axis,
        )?),
        Op::Shape { start, end } => one(movement::shape_of(input(inputs, 0)?, *start, *end)),
        Op::ConstantOfShape { value, dtype } => {
            one(movement::constant_of_shape(*value, *dtype, inputs))
        }
        Op::Range => one(movement::range(inputs)?),
        Op::Cast { to } => one(movement::cast(input(inputs, 0)?, *to)),
        Op::Dropout { .. } => Ok((dropout(input(inputs, 0)?, outputs), Saved::None)),
        Op::Identity => one(input(inputs, 0)?.clone()),
        Op::Reduce {
            kind,
            axes,
            keepdims,
            noop_with_empty_axes,
        } => {
            let x = input(inputs, 0)?;
            match reduce_axes(axes, *noop_with_empty_axes, inputs, x.shape.len())? {
                Some(axes) => one(reduce(*kind, x, &axes, *keepdims)?),
                None => one(x.clone()),
            }
        }
        Op::Pad { mode, pads } => one(movement::pad_inputs(*mode, pads, inputs)?),
        Op::Resize(r) => one(super::resize::resize(r, inputs)?),
        Op::Where => one(where_of(inputs)?),
        Op::Expand => one(movement::expand(inputs, env)?),
        Op::Recurrent(r) => Ok((super::recurrent::forward(r, inputs, outputs)?, Saved::None)),
        Op::Trilu { upper } => one(movement::trilu_inputs(*upper, inputs)?),
        Op::Size => one(Tensor::i64(vec![], vec![input(inputs, 0)?.len() as i64])),
        Op::GatherElements { axis } => one(indexing::gather_elements(inputs, *axis)?),
        Op::GatherNd { batch_dims } => one(indexing::gather_nd(inputs, *batch_dims)?),
        Op::ScatterElements { axis, reduction } => {
            one(indexing::scatter_elements(inputs, *axis, *reduction)?)
        }
        Op::ScatterNd { reduction } => one(indexing::scatter_nd(inputs, *reduction)?),
        Op::CumSum { exclusive, reverse } => one(indexing::cumsum(inputs, *exclusive, *reverse)?),
        Op::Einsum(e) => one(indexing::einsum(e, inputs)?),
        Op::Stft { onesided } => one(super::signal::stft(inputs, *onesided)?),
        Op::Tile => one(super::rearrange::tile(inputs)?),
        Op::ReverseSequence { batch_axis, .. } => {
            one(super::rearrange::reverse_sequence(inputs, *batch_axis)?)
        }
        Op::DepthToSpace { blocksize, crd } => {
            one(super::rearrange::to_space(inputs, *blocksize, *crd, true)?)
        }
        Op::SpaceToDepth { blocksize } => one(super::rearrange::to_space(
            inputs, *blocksize, false, false,
        )?),
        Op::InstanceNorm { epsilon } => one(super::normalize::group_norm(inputs, None, *epsilon)?),
        Op::GroupNorm { groups, epsilon } => one(super::normalize::group_norm(
            inputs,
            Some(*groups),
            *epsilon,
        )?),
        &Op::ArgExtreme {
            max,
            axis,
            keepdims,
            select_last,
        } => one(super::rearrange::arg_extreme(
            input(inputs, 0)?,
            max,
            axis,
            keepdims,
            select_last,
        )?),
        &Op::TopK { axis, largest, k } => Ok((
            super::rearrange::top_k(inputs, axis, largest, k)?,
            Saved::None,
        )),
        other => Err(unsupported(format!(
            "{} is not supported by the CPU backend",
            other.name()
        ))),
    }
}

pub(crate) fn axis_of(axis: i64, rank: usize) -> R<usize> {
    t::axis(axis, rank)
        .ok_or_else(|| operands(format!("axis {axis} is out of range for rank {rank}")))
}
