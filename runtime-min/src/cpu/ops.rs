//! The forward semantics of every IR operator on host tensors, following the ONNX spec
//! (<https://onnx.ai/onnx/operators/>). Output shapes come from the inputs at run time —
//! never from the verifier's shapes — so that a rank computing its slice of a layer (fewer
//! samples, fewer channels) runs the same code.
//!
//! Elementwise functions live in `elementwise.rs`; convolution and pooling run on 1-d and
//! 2-d windows (1-d as 2-d with unit height, `window.rs`) and 3-d ones (`volume.rs`).

use ralpc_ir::{DType, Op, PadMode};

pub use super::elementwise::unary_value;
pub(crate) use super::elementwise::{binary, sign, softmax_layout};
use super::elementwise::{clip, dropout, softmax_of, unary, where_of};
use super::indexing;
pub(crate) use super::normalize::batch_norm_synced;
use super::normalize::{batch_norm, layer_norm, lrn};
use super::products::{gemm, matmul};
pub(crate) use super::reduce::reduce_axes;
use super::reduce::{reduce, variadic};
pub(crate) use super::resize::{resample, resize_taps};
use super::tensor::{self as t, Data, Tensor};
use super::volume;
use super::window::{conv, conv_transpose, global_pool, pool};
pub(crate) use super::window::{conv_geometry, conv_transpose_geometry, pool_geometry};

/// Why an op could not run (the caller names the node).
pub type OpError = String;

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
        .ok_or_else(|| format!("{what} must be a floating-point tensor"))
}

/// Input `i`, or an error saying it is missing.
pub(crate) fn input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> R<&'a Tensor> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| format!("input {i} is missing"))
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
        Op::Input | Op::Constant { .. } => Err("sources are not computed".into()),
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
        Op::Concat { axis } => {
            let parts: Vec<&Tensor> = (0..inputs.len())
                .map(|i| input(inputs, i))
                .collect::<R<_>>()?;
            one(concat(&parts, *axis)?)
        }
        Op::Split { axis, sizes } => {
            let x = input(inputs, 0)?;
            let ax = axis_of(*axis, x.shape.len())?;
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
                return Err(format!(
                    "split sizes {sizes:?} do not split {total} into {outputs} outputs"
                ));
            }
            Ok((split(x, ax, &sizes), Saved::None))
        }
        Op::Slice { ranges } => {
            let x = input(inputs, 0)?;
            let (_, positions) = slice_positions(&slice_ranges(ranges, inputs)?, &x.shape);
            one(x.select(positions))
        }
        Op::Flatten { axis } => {
            let x = input(inputs, 0)?;
            let r = x.shape.len() as i64;
            let a = if *axis < 0 { axis + r } else { *axis };
            if !(0..=r).contains(&a) {
                return Err(format!("axis {axis} is out of range for rank {r}"));
            }
            let outer = t::numel(&x.shape[..a as usize]);
            let inner = t::numel(&x.shape[a as usize..]);
            one(x.clone().reshaped(vec![outer, inner]))
        }
        Op::Reshape { allowzero } => {
            let x = input(inputs, 0)?;
            let target = input(inputs, 1)?.to_i64s();
            let shape = rebatched_reshape(&x.shape, &target, *allowzero, env)?;
            one(x.clone().reshaped(shape))
        }
        Op::Transpose { perm } => {
            let x = input(inputs, 0)?;
            let r = x.shape.len();
            let perm: Vec<usize> = match perm {
                Some(p) => p.iter().map(|&a| axis_of(a, r)).collect::<R<_>>()?,
                None => (0..r).rev().collect(),
            };
            one(transpose(x, &perm))
        }
        Op::Squeeze { axes } => {
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
            one(x.clone().reshaped(shape))
        }
        Op::Unsqueeze { axes } => {
            let x = input(inputs, 0)?;
            let axes = ints_or_input(axes, inputs, 1).ok_or("axes are missing")?;
            let r = x.shape.len() + axes.len();
            let mut axes: Vec<usize> = axes.iter().map(|&a| axis_of(a, r)).collect::<R<_>>()?;
            axes.sort_unstable();
            let mut shape = x.shape.clone();
            for a in axes {
                shape.insert(a.min(shape.len()), 1);
            }
            one(x.clone().reshaped(shape))
        }
        Op::Gather { axis } => one(gather(input(inputs, 0)?, input(inputs, 1)?, *axis)?),
        Op::Shape { start, end } => {
            let x = input(inputs, 0)?;
            let r = x.shape.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (s, e) = (clamp(*start), clamp(end.unwrap_or(r)));
            let dims: Vec<i64> = x.shape[s..e.max(s)].iter().map(|&d| d as i64).collect();
            one(Tensor::i64(vec![dims.len()], dims))
        }
        Op::ConstantOfShape { value, dtype } => {
            let shape: Vec<usize> = match optional(inputs, 0) {
                Some(s) => s.to_i64s().iter().map(|&d| d.max(0) as usize).collect(),
                None => Vec::new(),
            };
            let n = t::numel(&shape);
            one(if dtype.is_float() {
                Tensor::f32(shape, vec![*value as f32; n])
            } else {
                Tensor::i64(shape, vec![*value as i64; n])
            })
        }
        Op::Range => {
            let (start, limit, delta) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
            let first = |t: &Tensor| t.to_f64s().first().copied().unwrap_or(0.0);
            let (s, l, d) = (first(start), first(limit), first(delta));
            if d == 0.0 {
                return Err("delta is zero".into());
            }
            let n = ((l - s) / d).ceil().max(0.0) as usize;
            one(match start.data {
                Data::F32(_) => {
                    Tensor::f32(vec![n], (0..n).map(|i| (s + i as f64 * d) as f32).collect())
                }
                Data::I64(_) => {
                    let (s, d) = (s as i64, d as i64);
                    Tensor::i64(vec![n], (0..n as i64).map(|i| s + i * d).collect())
                }
            })
        }
        Op::Cast { to } => one(cast(input(inputs, 0)?, *to)),
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
        Op::Pad { mode, pads } => {
            let value = optional(inputs, 2)
                .and_then(|v| v.to_f64s().first().copied())
                .unwrap_or(0.0);
            one(pad(
                input(inputs, 0)?,
                pad_sources(pads, *mode, inputs)?,
                value,
            ))
        }
        Op::Resize(r) => {
            let x = input(inputs, 0)?;
            let mut data = floats(x, "X")?.to_vec();
            let mut shape = x.shape.clone();
            for (axis, taps) in resize_taps(r, inputs, &x.shape)? {
                data = resample(&data, &shape, axis, &taps, false);
                shape[axis] = taps.len();
            }
            one(Tensor::f32(shape, data))
        }
        Op::Where => one(where_of(inputs)?),
        Op::Expand => {
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
                .ok_or_else(|| format!("{:?} does not expand to {target:?}", x.shape))?;
            one(x.select(t::broadcast(&x.shape, &shape)))
        }
        Op::Recurrent(r) => Ok((super::recurrent::forward(r, inputs, outputs)?, Saved::None)),
        Op::Trilu { upper } => {
            let x = input(inputs, 0)?;
            let k = optional(inputs, 1)
                .and_then(|k| k.to_i64s().first().copied())
                .unwrap_or(0);
            one(trilu(x, *upper, k)?)
        }
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
        other => Err(format!(
            "{} is not supported by the CPU backend",
            other.name()
        )),
    }
}

pub(crate) fn axis_of(axis: i64, rank: usize) -> R<usize> {
    t::axis(axis, rank).ok_or_else(|| format!("axis {axis} is out of range for rank {rank}"))
}

/// Concatenation along `axis`.
pub(crate) fn concat(parts: &[&Tensor], axis: i64) -> R<Tensor> {
    let first = parts.first().ok_or("nothing to concatenate")?;
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
            return Err(format!(
                "{:?} and {:?} do not concatenate",
                first.shape, p.shape
            ));
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

/// Per axis: start, end, step (already clamped).
type Ranges = Vec<(usize, i64, i64, i64)>;

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
        return Err("starts, ends, axes and steps differ in length".into());
    }
    let mut out = Vec::new();
    for i in 0..starts.len() {
        let a = axis_of(axes[i], r)?;
        let dim = x.shape[a] as i64;
        let step = steps[i];
        if step == 0 {
            return Err("a slice step is zero".into());
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

trait DivCeil {
    fn div_ceil_i(self, d: i64) -> i64;
}

impl DivCeil for i64 {
    fn div_ceil_i(self, d: i64) -> i64 {
        (self + d - 1) / d
    }
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
            0 if !allowzero => {
                out.push(*shape.get(i).ok_or("a 0 in the target has no input axis")?)
            }
            d if d >= 0 => out.push(d as usize),
            _ => return Err(format!("invalid target {target:?}")),
        }
    }
    if let Some(i) = infer {
        let known = t::numel(&out);
        if known == 0 || total % known != 0 {
            return Err(format!("{shape:?} does not reshape to {target:?}"));
        }
        out[i] = total / known;
    }
    if t::numel(&out) != total {
        return Err(format!("{shape:?} does not reshape to {target:?}"));
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

fn gather(x: &Tensor, indices: &Tensor, axis: i64) -> R<Tensor> {
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
                .ok_or_else(|| format!("index {i} is out of range for {dim}"))
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

fn cast(x: &Tensor, to: DType) -> Tensor {
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
fn round_to_bf16(v: f32) -> f32 {
    if !v.is_finite() {
        return v;
    }
    let bits = v.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded)
}

/// Rounds to the nearest half-precision value (ties to even), kept in f32.
fn round_to_f16(v: f32) -> f32 {
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
fn padded_source(o: i64, before: i64, dim: i64, mode: PadMode) -> Option<usize> {
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
    let pads = ints_or_input(pads, inputs, 1).ok_or("pads are missing")?;
    let axes = optional(inputs, 3).map(Tensor::to_i64s);
    let r = x.shape.len();
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis_of(a, r)).collect::<R<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("{} pads for {} axes", pads.len(), axes.len()));
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
                .map_err(|_| "the pads remove more than the axis".to_string())
        })
        .collect::<R<_>>()?;
    if mode != PadMode::Constant && x.shape.contains(&0) {
        return Err("cannot pad an empty axis by reflection".into());
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

fn pad(x: &Tensor, (shape, sources): (Vec<usize>, Vec<Option<usize>>), value: f64) -> Tensor {
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

fn trilu(x: &Tensor, upper: bool, k: i64) -> R<Tensor> {
    let r = x.shape.len();
    if r < 2 {
        return Err("Trilu needs at least two axes".into());
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
