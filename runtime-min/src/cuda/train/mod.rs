//! Training a model on one device of a [`Backend`]: every node forward as kernel launches
//! and GEMMs, the loss, every node backward, SGD with momentum — the CPU backend's
//! [`train_reference`](crate::cpu::train::train_reference), on a device.
//!
//! Shapes come from the model's verification at the batch it runs at ([`GraphInfo`]), so
//! views (Reshape, Flatten, Squeeze, Identity…) share their input's buffer and integer
//! shape arithmetic never reaches the device. Operators without a device lowering yet are
//! refused with an error naming the node. The one-device training loop and per-node
//! profiling around this runner are `one_device.rs`'s; plans, data parallel included, run
//! through the plan interpreter (`cpu::exec`) on a device.
//!
//! This module holds the runner and its dispatchers, one line per operator; each family's
//! forward and backward passes live together in `products.rs`, `elementwise.rs`,
//! `normalize.rs`, `window.rs`, `reduce.rs` and `movement.rs`.

mod elementwise;
mod movement;
mod normalize;
mod products;
mod reduce;
mod window;

use std::collections::BTreeMap;
use std::sync::Arc;

use ralpc_ir::{Graph, GraphInfo, NodeId, Op, PoolKind, ReduceKind, ValueId, Variadic};

use super::backend::{Backend, R};
use super::batch_stats;
use super::calls::Kernels;
use super::error::DeviceError;
use super::error::{inconsistent, unsupported};
use super::kernels::{BinaryOp, Strides};
use super::node_ops::{axis_of, numel, other_name, permutation, static_env};
pub use super::one_device::{profile, train, NodeTime};
use crate::cpu::graph::Weights;
use crate::cpu::ops;

/// A float tensor on the device; views share the buffer.
pub(super) struct DTensor<B: Backend> {
    pub(super) buf: Arc<B::Buf>,
    pub(super) shape: Vec<usize>,
}

impl<B: Backend> Clone for DTensor<B> {
    fn clone(&self) -> Self {
        DTensor {
            buf: self.buf.clone(),
            shape: self.shape.clone(),
        }
    }
}

/// What a node's forward pass keeps for its backward pass.
pub(super) enum Saved<B: Backend> {
    None,
    /// Max pooling's argmax.
    Argmax(B::Idx),
    /// Normalization statistics: mean and 1/std.
    Stats(B::Buf, B::Buf),
    /// Layer norm: the normalized input, and its statistics.
    Normalized(B::Buf, B::Buf, B::Buf),
}

/// What a node's forward pass made: a new buffer (and what its backward pass needs), or
/// a view of its input's.
pub(super) enum Output<B: Backend> {
    New(B::Buf, Saved<B>),
    View(Arc<B::Buf>),
}

/// The device training loop's state.
pub(super) struct Runner<'a, B: Backend> {
    pub(super) dev: &'a B,
    pub(super) graph: &'a Graph,
    /// Static shapes (the whole model at its batch); without them, a node's output shape
    /// follows from its operands, as for a rank's share of a layer.
    pub(super) info: Option<&'a GraphInfo>,
    /// The batch a fixed-batch export was made at (re-batches Reshape targets).
    pub(super) env: ops::Env,
    /// Host copies of the constants (scalars such as Clip's bounds are read here).
    pub(super) host: &'a Weights,
    pub(super) values: BTreeMap<ValueId, DTensor<B>>,
    pub(super) saved: Vec<(NodeId, Saved<B>)>,
    /// How a batch normalization adds its statistics up over the ranks sharing its
    /// channels ([`super::batch_stats`]); `None` normalizes by this device's batch.
    pub(super) batch_stats: Option<batch_stats::GroupSum<'a>>,
}

impl<'a, B: Backend> Runner<'a, B> {
    /// A runner with no values yet; `info` gives static shapes (else they follow from the
    /// operands), `host` the constants.
    pub(super) fn new(
        dev: &'a B,
        graph: &'a Graph,
        info: Option<&'a GraphInfo>,
        host: &'a Weights,
    ) -> Runner<'a, B> {
        Runner {
            dev,
            graph,
            info,
            env: static_env(graph),
            host,
            values: BTreeMap::new(),
            saved: Vec::new(),
            batch_stats: None,
        }
    }

    pub(super) fn shape(&self, v: ValueId) -> R<Vec<usize>> {
        if let Some(t) = self.values.get(&v) {
            return Ok(t.shape.clone());
        }
        self.info
            .and_then(|info| info.ty(v).shape.as_sizes())
            .map(|s| s.iter().map(|&d| d as usize).collect())
            .ok_or_else(|| {
                DeviceError::Node(format!("'{}' has no known shape", self.graph.value(v).name))
            })
    }

    /// Integers of a host constant input (a Reshape target, Squeeze axes).
    fn ints(&self, node: NodeId, slot: usize) -> Option<Vec<i64>> {
        let v = self.graph.node(node).inputs.get(slot).copied().flatten()?;
        self.host.tensors.get(&v).map(|t| t.to_i64s())
    }

    /// Node `id`'s first output's shape: static, or from its operands.
    fn output_shape(&self, id: NodeId) -> R<Vec<usize>> {
        let node = self.graph.node(id);
        let out = *node
            .outputs
            .first()
            .ok_or_else(|| unsupported("the node has no output"))?;
        if self.info.is_some() {
            return self.shape(out);
        }
        let x = || self.input(id, 0).map(|t| t.shape);
        Ok(match &node.op {
            Op::Identity
            | Op::Dropout { .. }
            | Op::Unary(_)
            | Op::Clip { .. }
            | Op::Softmax { .. }
            | Op::BatchNorm { .. }
            | Op::LayerNorm { .. } => x()?,
            Op::Flatten { axis } => {
                let s = x()?;
                let a = axis_of(*axis, s.len() + 1)?;
                vec![numel(&s[..a]), numel(&s[a..])]
            }
            Op::Reshape { allowzero } => {
                let s = x()?;
                let target = self
                    .ints(id, 1)
                    .ok_or_else(|| unsupported("the Reshape target is not a constant"))?;
                ops::rebatched_reshape(&s, &target, *allowzero, self.env)?
            }
            Op::Squeeze { axes } => {
                let s = x()?;
                let axes: Vec<usize> = match axes.clone().or_else(|| self.ints(id, 1)) {
                    Some(a) => a.iter().map(|&a| axis_of(a, s.len())).collect::<R<_>>()?,
                    None => (0..s.len()).filter(|&d| s[d] == 1).collect(),
                };
                s.iter()
                    .enumerate()
                    .filter(|(d, _)| !axes.contains(d))
                    .map(|(_, &n)| n)
                    .collect()
            }
            Op::Unsqueeze { axes } => {
                let mut s = x()?;
                let axes = axes
                    .clone()
                    .or_else(|| self.ints(id, 1))
                    .ok_or_else(|| unsupported("Unsqueeze's axes are missing"))?;
                let rank = s.len() + axes.len();
                let mut axes: Vec<usize> =
                    axes.iter().map(|&a| axis_of(a, rank)).collect::<R<_>>()?;
                axes.sort_unstable();
                for a in axes {
                    s.insert(a.min(s.len()), 1);
                }
                s
            }
            Op::Conv(c) => {
                let (xs, ws) = (x()?, self.input(id, 1)?.shape);
                let (g, one_d) = ops::conv_geometry(c, &xs, &ws)?;
                let (oh, ow) = g.output();
                if one_d {
                    vec![g.batch, g.out_channels, ow]
                } else {
                    vec![g.batch, g.out_channels, oh, ow]
                }
            }
            Op::Gemm(gm) => {
                let (a, b) = (x()?, self.input(id, 1)?.shape);
                let m = if gm.trans_a { a.get(1) } else { a.first() };
                let n = if gm.trans_b { b.first() } else { b.get(1) };
                vec![m.copied().unwrap_or(0), n.copied().unwrap_or(0)]
            }
            Op::MatMul => {
                let (a, b) = (x()?, self.input(id, 1)?.shape);
                if a.len() < 2 || b.len() < 2 {
                    return Err(unsupported(format!(
                        "MatMul of {a:?} × {b:?}: vector operands are not on the CUDA backend yet"
                    )));
                }
                let mut s = if b.len() > a.len() {
                    b[..b.len() - 2].to_vec()
                } else {
                    a[..a.len() - 2].to_vec()
                };
                s.push(a[a.len() - 2]);
                s.push(b[b.len() - 1]);
                s
            }
            Op::Binary(_) | Op::Variadic(Variadic::Sum) => {
                let mut s = x()?;
                for slot in 1..node.inputs.len() {
                    let other = self.input(id, slot)?.shape;
                    s = crate::cpu::tensor::broadcast_shapes(&s, &other).ok_or_else(|| {
                        DeviceError::Node(format!("{s:?} and {other:?} do not broadcast"))
                    })?;
                }
                s
            }
            Op::Pool(p) => {
                let s = x()?;
                let (g, one_d, (n, c)) = ops::pool_geometry(p, &s)?;
                if one_d {
                    vec![n, c, g.output.1]
                } else {
                    vec![n, c, g.output.0, g.output.1]
                }
            }
            Op::GlobalPool(_) => {
                let mut s = x()?;
                s.iter_mut().skip(2).for_each(|d| *d = 1);
                s
            }
            Op::Transpose { perm } => {
                let s = x()?;
                permutation(perm.as_deref(), s.len())?
                    .iter()
                    .map(|&p| s[p])
                    .collect()
            }
            Op::Concat { axis } => {
                let mut s = x()?;
                let a = axis_of(*axis, s.len())?;
                for slot in 1..node.inputs.len() {
                    s[a] += self.input(id, slot)?.shape.get(a).copied().unwrap_or(0);
                }
                s
            }
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes,
                keepdims,
                noop_with_empty_axes,
            } => {
                let s = x()?;
                let axes = self.reduced_axes(id, axes, *noop_with_empty_axes, s.len())?;
                s.iter()
                    .enumerate()
                    .filter_map(|(d, &n)| match (axes.contains(&d), keepdims) {
                        (false, _) => Some(n),
                        (true, true) => Some(1),
                        (true, false) => None,
                    })
                    .collect()
            }
            other => {
                return Err(unsupported(format!(
                    "{} is not on the CUDA backend yet",
                    other_name(other)
                )))
            }
        })
    }

    fn input(&self, node: NodeId, slot: usize) -> R<DTensor<B>> {
        let v = self
            .graph
            .node(node)
            .inputs
            .get(slot)
            .copied()
            .flatten()
            .ok_or_else(|| DeviceError::Node(format!("input {slot} is absent")))?;
        self.values.get(&v).cloned().ok_or_else(|| {
            DeviceError::Node(format!(
                "'{}' is not a float tensor on the device",
                self.graph.value(v).name
            ))
        })
    }

    fn optional(&self, node: NodeId, slot: usize) -> Option<DTensor<B>> {
        self.input(node, slot).ok()
    }

    /// A float scalar from a constant input (Clip's bounds).
    /// Whether input `slot` of `node` needs a gradient: all but the constants that are
    /// not weights (an attention mask, a scale), whose gradient over a large output would
    /// only be computed to be dropped.
    fn wants_gradient(&self, node: NodeId, slot: usize) -> bool {
        let Some(v) = self.graph.node(node).inputs.get(slot).copied().flatten() else {
            return false;
        };
        let producer = &self.graph.node(self.graph.value(v).producer).op;
        !matches!(producer, Op::Constant { .. }) || producer.is_weight()
    }

    fn scalar(&self, node: NodeId, slot: usize) -> Option<f32> {
        let v = self.graph.node(node).inputs.get(slot).copied().flatten()?;
        self.host
            .tensors
            .get(&v)
            .and_then(|t| t.to_f64s().first().map(|&x| x as f32))
    }

    /// ReduceMean's axes (sorted, non-negative): the attribute, else input 1, else all
    /// (none with `noop_with_empty_axes`).
    fn reduced_axes(
        &self,
        id: NodeId,
        attr: &Option<Vec<i64>>,
        noop: bool,
        rank: usize,
    ) -> R<Vec<usize>> {
        let given: Option<Vec<i64>> = attr.clone().or_else(|| {
            let v = self.graph.node(id).inputs.get(1).copied().flatten()?;
            self.host
                .tensors
                .get(&v)
                .map(|t| t.to_f64s().iter().map(|&a| a as i64).collect())
        });
        let mut axes: Vec<usize> = match given {
            Some(a) if !a.is_empty() => a.iter().map(|&a| axis_of(a, rank)).collect::<R<_>>()?,
            _ if noop => Vec::new(),
            _ => (0..rank).collect(),
        };
        axes.sort_unstable();
        axes.dedup();
        Ok(axes)
    }

    pub(super) fn forward(&mut self, id: NodeId) -> R<()> {
        let node = self.graph.node(id);
        if node.outputs.is_empty() || matches!(node.op, Op::Input | Op::Constant { .. }) {
            return Ok(());
        }
        let out_shape = self.output_shape(id)?;
        let made = match &node.op {
            Op::Input | Op::Constant { .. } => return Ok(()),
            op if op.is_view() => self.view_forward(id)?,
            Op::Conv(c) => self.conv_forward(id, c, &out_shape)?,
            Op::Gemm(gm) => self.gemm_forward(id, gm, &out_shape)?,
            Op::MatMul => self.matmul_forward(id, &out_shape)?,
            Op::Unary(u) => self.unary_forward(id, *u, &out_shape)?,
            Op::Clip { min, max } => self.clip_forward(id, *min, *max, &out_shape)?,
            Op::Binary(b) => self.binary_forward(id, *b, &out_shape)?,
            Op::Variadic(Variadic::Sum) => self.sum_forward(id, &out_shape)?,
            Op::Softmax { axis, log, flatten } => {
                self.softmax_forward(id, *axis, *log, *flatten, &out_shape)?
            }
            Op::Pool(p) => self.pool_forward(id, p, &out_shape)?,
            Op::GlobalPool(PoolKind::Average) => {
                self.global_average_pool_forward(id, &out_shape)?
            }
            Op::BatchNorm { epsilon, .. } => self.batch_norm_forward(id, *epsilon, &out_shape)?,
            Op::LayerNorm { axis, epsilon } => {
                self.layer_norm_forward(id, *axis, *epsilon, &out_shape)?
            }
            Op::Transpose { perm } => self.transpose_forward(id, perm, &out_shape)?,
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes,
                noop_with_empty_axes,
                ..
            } => self.reduce_mean_forward(id, axes, *noop_with_empty_axes)?,
            Op::Concat { axis } => self.concat_forward(id, *axis, &out_shape)?,
            other => {
                return Err(unsupported(format!(
                    "{} is not on the CUDA backend yet",
                    other_name(other)
                )))
            }
        };
        let (y, saved) = match made {
            Output::New(y, saved) => (y, saved),
            Output::View(buf) => return self.alias(id, buf, out_shape),
        };
        if let Some(&v) = node.outputs.first() {
            self.values.insert(
                v,
                DTensor {
                    buf: Arc::new(y),
                    shape: out_shape,
                },
            );
        }
        self.saved.push((id, saved));
        Ok(())
    }

    /// Node `id`'s first output, kept for a backward pass that reads it.
    fn kept_output(&self, id: NodeId) -> R<DTensor<B>> {
        self.graph
            .node(id)
            .outputs
            .first()
            .and_then(|v| self.values.get(v))
            .cloned()
            .ok_or_else(|| inconsistent("the output was not kept"))
    }

    /// A new buffer of `shape`'s elements, zeroed.
    fn fresh(&self, shape: &[usize]) -> R<B::Buf> {
        self.dev.zeros(numel(shape))
    }

    /// Node `id`'s output is a view of `buf` (Reshape, Identity, a one-input Sum…).
    fn alias(&mut self, id: NodeId, buf: Arc<B::Buf>, shape: Vec<usize>) -> R<()> {
        let out = *self
            .graph
            .node(id)
            .outputs
            .first()
            .ok_or_else(|| unsupported("the node has no output"))?;
        self.values.insert(out, DTensor { buf, shape });
        self.saved.push((id, Saved::None));
        Ok(())
    }

    /// `x` (of `shape`) summed — or averaged — over `axes` (ascending), one axis at a time
    /// in index order (deterministic); `None` when there is no axis.
    fn reduce_axes(
        &self,
        x: &B::Buf,
        shape: &[usize],
        axes: &[usize],
        mean: bool,
    ) -> R<Option<B::Buf>> {
        let mut current = shape.to_vec();
        let mut acc: Option<B::Buf> = None;
        for &a in axes {
            let (outer, inner) = (numel(&current[..a]), numel(&current[a + 1..]));
            let mut out = self.dev.zeros(outer * inner)?;
            let from = acc.as_ref().unwrap_or(x);
            self.dev
                .reduce_axis(&mut out, from, outer, current[a], inner, mean)?;
            current[a] = 1;
            acc = Some(out);
        }
        Ok(acc)
    }

    /// `y + b` with `b` broadcast as `b_shape` against `shape`.
    fn add_broadcast(
        &self,
        y: &B::Buf,
        shape: &[usize],
        b: &B::Buf,
        b_shape: &[usize],
    ) -> R<B::Buf> {
        let mut out = self.dev.zeros(numel(shape))?;
        self.dev.binary(
            &mut out,
            y,
            b,
            &Strides::broadcast(shape, shape, b_shape)?,
            BinaryOp::Add,
        )?;
        Ok(out)
    }

    /// `dy` (of `shape`) summed down to `target` (which broadcasts to `shape`), one axis at
    /// a time in index order (deterministic).
    fn reduce_to(&self, dy: &B::Buf, shape: &[usize], target: &[usize]) -> R<B::Buf> {
        let lead = shape.len() - target.len();
        let axes: Vec<usize> = (0..shape.len())
            .filter(|&d| shape[d] != 1 && (d < lead || target[d - lead] != shape[d]))
            .collect();
        match self.reduce_axes(dy, shape, &axes, false)? {
            Some(a) => Ok(a),
            None => {
                let mut copy = self.dev.zeros(numel(shape))?;
                self.dev.axpby(&mut copy, dy, 1.0, 0.0)?;
                Ok(copy)
            }
        }
    }

    /// Gradients of node `id`'s inputs from its outputs' gradient `dy`, by input slot.
    pub(super) fn backward(
        &self,
        id: NodeId,
        saved: &Saved<B>,
        dy: &B::Buf,
    ) -> R<Vec<(usize, B::Buf)>> {
        let node = self.graph.node(id);
        let out_shape = self.shape(
            *node
                .outputs
                .first()
                .ok_or_else(|| unsupported("the node has no output"))?,
        )?;
        Ok(match &node.op {
            op if op.is_view() => self.view_backward(dy)?,
            Op::Conv(c) => self.conv_backward(id, c, dy, &out_shape)?,
            Op::Gemm(gm) => self.gemm_backward(id, gm, dy, &out_shape)?,
            Op::MatMul => self.matmul_backward(id, dy)?,
            Op::Unary(u) => self.unary_backward(id, *u, dy)?,
            Op::Clip { min, max } => self.clip_backward(id, *min, *max, dy)?,
            Op::Binary(bop) => self.binary_backward(id, *bop, dy, &out_shape)?,
            Op::Variadic(Variadic::Sum) => self.sum_backward(id, dy, &out_shape)?,
            Op::Softmax { axis, log, flatten } => {
                self.softmax_backward(id, *axis, *log, *flatten, dy, &out_shape)?
            }
            Op::Pool(p) => self.pool_backward(id, p, saved, dy)?,
            Op::GlobalPool(PoolKind::Average) => self.global_average_pool_backward(id, dy)?,
            Op::BatchNorm { .. } => self.batch_norm_backward(id, saved, dy)?,
            Op::LayerNorm { axis, .. } => self.layer_norm_backward(id, *axis, saved, dy)?,
            Op::Transpose { perm } => self.transpose_backward(id, perm, dy, &out_shape)?,
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes,
                noop_with_empty_axes,
                ..
            } => self.reduce_mean_backward(id, axes, *noop_with_empty_axes, dy)?,
            Op::Concat { axis } => self.concat_backward(id, *axis, dy, &out_shape)?,
            other => {
                return Err(unsupported(format!(
                    "{}'s gradient is not on the CUDA backend yet",
                    other_name(other)
                )))
            }
        })
    }

    fn copy(&self, x: &B::Buf) -> R<B::Buf> {
        let mut out = self.dev.zeros(self.dev.len(x))?;
        self.dev.axpby(&mut out, x, 1.0, 0.0)?;
        Ok(out)
    }
}
