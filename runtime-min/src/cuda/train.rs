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

use std::collections::BTreeMap;
use std::sync::Arc;

use ralpc_ir::{Binary, Graph, GraphInfo, NodeId, Op, PoolKind, ReduceKind, ValueId, Variadic};

use super::backend::{Backend, Gemm, R};
use super::batch_stats;
use super::error::DeviceError;
use super::kernels::{BinaryOp, Strides, UnaryOp, Window};
use super::node_ops::{
    axis_of, binary_op, channel_layout, numel, other_name, permutation, static_env, strides_of,
    transposed_strides, unary_op, MatMulPlan,
};
pub use super::one_device::{profile, train, NodeTime};
use crate::cpu::graph::Weights;
use crate::cpu::kernels::Pool2d;
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
        let out = *node.outputs.first().ok_or("the node has no output")?;
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
                    .ok_or("the Reshape target is not a constant")?;
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
                    .ok_or("Unsqueeze's axes are missing")?;
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
                    return Err(format!(
                        "MatMul of {a:?} × {b:?}: vector operands are not on the CUDA backend yet"
                    )
                    .into());
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
                return Err(format!("{} is not on the CUDA backend yet", other_name(other)).into())
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
        let dev = self.dev;
        let fresh = |shape: &[usize]| dev.zeros(numel(shape));
        let (y, saved): (B::Buf, Saved<B>) = match &node.op {
            Op::Input | Op::Constant { .. } => return Ok(()),
            Op::Identity
            | Op::Flatten { .. }
            | Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Dropout { .. } => {
                if node.outputs.len() > 1 {
                    return Err("a dropout mask output is not on the CUDA backend yet".into());
                }
                let x = self.input(id, 0)?;
                return self.alias(id, x.buf, out_shape);
            }
            Op::Conv(c) => {
                let (x, w) = (self.input(id, 0)?, self.input(id, 1)?);
                let (g, _) = ops::conv_geometry(c, &x.shape, &w.shape)?;
                let mut y = fresh(&out_shape)?;
                dev.conv_forward(&g, &x.buf, &w.buf, &mut y)?;
                if let Some(b) = self.optional(id, 2) {
                    y = self.add_broadcast(
                        &y,
                        &out_shape,
                        &b.buf,
                        &[g.out_channels, 1, 1][..out_shape.len() - 1],
                    )?;
                }
                (y, Saved::None)
            }
            Op::Gemm(gm) => {
                let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
                let (m, n) = (out_shape[0], out_shape[1]);
                let k = if gm.trans_a { a.shape[0] } else { a.shape[1] };
                let mut y = fresh(&out_shape)?;
                let mut mm = Gemm::new(m, n, k);
                mm.trans_a = gm.trans_a;
                mm.trans_b = gm.trans_b;
                mm.alpha = gm.alpha;
                if let Some(c) = self.optional(id, 2) {
                    let s = Strides::broadcast(&out_shape, &c.shape, &c.shape)?;
                    dev.gather(&mut y, &c.buf, &s, 0)?;
                    mm.beta = gm.beta;
                }
                dev.gemm(&mm, &a.buf, &b.buf, &mut y)?;
                (y, Saved::None)
            }
            Op::MatMul => {
                let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
                let plan = MatMulPlan::new(&a.shape, &b.shape)?;
                let mut y = fresh(&out_shape)?;
                dev.gemm(&plan.forward(), &a.buf, &b.buf, &mut y)?;
                (y, Saved::None)
            }
            Op::Unary(u) => {
                let (op, alpha, beta) = unary_op(*u)?;
                let x = self.input(id, 0)?;
                let mut y = fresh(&out_shape)?;
                dev.unary(&mut y, &x.buf, op, alpha, beta)?;
                (y, Saved::None)
            }
            Op::Clip { min, max } => {
                let lo = min
                    .or_else(|| self.scalar(id, 1))
                    .unwrap_or(f32::NEG_INFINITY);
                let hi = max.or_else(|| self.scalar(id, 2)).unwrap_or(f32::INFINITY);
                let x = self.input(id, 0)?;
                let mut y = fresh(&out_shape)?;
                dev.unary(&mut y, &x.buf, UnaryOp::Clip, lo, hi)?;
                (y, Saved::None)
            }
            Op::Binary(b) => {
                let op = binary_op(*b)?;
                let (a, c) = (self.input(id, 0)?, self.input(id, 1)?);
                let mut y = fresh(&out_shape)?;
                dev.binary(
                    &mut y,
                    &a.buf,
                    &c.buf,
                    &Strides::broadcast(&out_shape, &a.shape, &c.shape)?,
                    op,
                )?;
                (y, Saved::None)
            }
            Op::Variadic(Variadic::Sum) => {
                let mut acc = self.input(id, 0)?;
                for slot in 1..node.inputs.len() {
                    let x = self.input(id, slot)?;
                    let mut y = fresh(&out_shape)?;
                    dev.binary(
                        &mut y,
                        &acc.buf,
                        &x.buf,
                        &Strides::broadcast(&out_shape, &acc.shape, &x.shape)?,
                        BinaryOp::Add,
                    )?;
                    acc = DTensor {
                        buf: Arc::new(y),
                        shape: out_shape.clone(),
                    };
                }
                match Arc::try_unwrap(acc.buf) {
                    Ok(y) => (y, Saved::None),
                    // One input: the sum is a view of it.
                    Err(buf) => return self.alias(id, buf, out_shape),
                }
            }
            Op::Softmax { axis, log, flatten } => {
                let x = self.input(id, 0)?;
                let (outer, width, inner) = ops::softmax_layout(&x.shape, *axis, *flatten)?;
                if inner != 1 {
                    return Err(
                        "softmax over an axis other than the last is not on the CUDA backend yet"
                            .into(),
                    );
                }
                let mut y = fresh(&out_shape)?;
                dev.softmax_rows(&mut y, &x.buf, outer, width, *log)?;
                (y, Saved::None)
            }
            Op::Pool(p) => {
                let x = self.input(id, 0)?;
                let (g, _, _) = ops::pool_geometry(p, &x.shape)?;
                let win = Window::from(&g);
                let mut y = fresh(&out_shape)?;
                match p.kind {
                    PoolKind::Max => {
                        let mut argmax = dev.index_zeros(numel(&out_shape))?;
                        dev.max_pool(&mut y, &mut argmax, &x.buf, &win)?;
                        (y, Saved::Argmax(argmax))
                    }
                    PoolKind::Average => {
                        dev.avg_pool(&mut y, &x.buf, &win, p.count_include_pad)?;
                        (y, Saved::None)
                    }
                }
            }
            Op::GlobalPool(PoolKind::Average) => {
                let x = self.input(id, 0)?;
                let planes = x.shape.iter().take(2).product::<usize>();
                let area = numel(x.shape.get(2..).unwrap_or_default());
                let mut y = fresh(&out_shape)?;
                dev.reduce_axis(&mut y, &x.buf, planes, area, 1, true)?;
                (y, Saved::None)
            }
            Op::BatchNorm { epsilon, .. } => {
                if node.outputs.len() > 1 {
                    return Err(
                        "batch norm's running-statistics outputs are not on the CUDA backend yet"
                            .into(),
                    );
                }
                let (x, gamma, beta) = (self.input(id, 0)?, self.input(id, 1)?, self.input(id, 2)?);
                let (batch, channels, spatial) = channel_layout(&x.shape)?;
                let (mut mean, mut rstd) = (dev.zeros(channels)?, dev.zeros(channels)?);
                dev.channel_stats(
                    &mut mean, &mut rstd, &x.buf, batch, channels, spatial, *epsilon,
                )?;
                if let Some(sum) = self.batch_stats {
                    let count = batch * spatial;
                    batch_stats::forward(dev, sum, &mut mean, &mut rstd, *epsilon, count)?;
                }
                let mut y = fresh(&out_shape)?;
                dev.channel_affine(
                    &mut y, &x.buf, &mean, &rstd, &gamma.buf, &beta.buf, channels, spatial,
                )?;
                (y, Saved::Stats(mean, rstd))
            }
            Op::LayerNorm { axis, epsilon } => {
                if node.outputs.len() > 1 {
                    return Err(
                        "layer norm's statistics outputs are not on the CUDA backend yet".into(),
                    );
                }
                let x = self.input(id, 0)?;
                let a = axis_of(*axis, x.shape.len())?;
                let (rows, n) = (numel(&x.shape[..a]), numel(&x.shape[a..]));
                let (mut mean, mut rstd) = (dev.zeros(rows)?, dev.zeros(rows)?);
                let mut xhat = fresh(&out_shape)?;
                dev.layer_norm(
                    &mut xhat, &mut mean, &mut rstd, &x.buf, None, rows, n, *epsilon,
                )?;
                let gamma = self.input(id, 1)?;
                let mut y = fresh(&out_shape)?;
                let param = [rows, n];
                dev.binary(
                    &mut y,
                    &xhat,
                    &gamma.buf,
                    &Strides::broadcast(&param, &param, &[n])?,
                    BinaryOp::Mul,
                )?;
                if let Some(beta) = self.optional(id, 2) {
                    y = self.add_broadcast(&y, &param, &beta.buf, &[n])?;
                }
                (y, Saved::Normalized(xhat, mean, rstd))
            }
            Op::Transpose { perm } => {
                let x = self.input(id, 0)?;
                let view = transposed_strides(perm.as_deref(), &x.shape)?;
                let mut y = fresh(&out_shape)?;
                dev.gather(&mut y, &x.buf, &Strides::view(&out_shape, &view)?, 0)?;
                (y, Saved::None)
            }
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes,
                noop_with_empty_axes,
                ..
            } => {
                let x = self.input(id, 0)?;
                let axes = self.reduced_axes(id, axes, *noop_with_empty_axes, x.shape.len())?;
                match self.reduce_axes(&x.buf, &x.shape, &axes, true)? {
                    Some(y) => (y, Saved::None),
                    None => {
                        return self.alias(id, x.buf, out_shape);
                    }
                }
            }
            Op::Concat { axis } => {
                let a = axis_of(*axis, out_shape.len())?;
                let mut y = fresh(&out_shape)?;
                let strides = strides_of(&out_shape);
                let mut start = 0;
                for slot in 0..node.inputs.len() {
                    let x = self.input(id, slot)?;
                    dev.scatter(
                        &mut y,
                        &x.buf,
                        &Strides::view(&x.shape, &strides)?,
                        start * strides[a],
                        false,
                    )?;
                    start += x.shape[a];
                }
                (y, Saved::None)
            }
            other => {
                return Err(format!("{} is not on the CUDA backend yet", other_name(other)).into())
            }
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

    /// Node `id`'s output is a view of `buf` (Reshape, Identity, a one-input Sum…).
    fn alias(&mut self, id: NodeId, buf: Arc<B::Buf>, shape: Vec<usize>) -> R<()> {
        let out = *self
            .graph
            .node(id)
            .outputs
            .first()
            .ok_or("the node has no output")?;
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
        let dev = self.dev;
        let out_shape = self.shape(*node.outputs.first().ok_or("the node has no output")?)?;
        let zeros = |n: usize| dev.zeros(n);
        let mut grads = Vec::new();
        match &node.op {
            Op::Identity
            | Op::Flatten { .. }
            | Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Dropout { .. } => {
                let mut dx = zeros(dev.len(dy))?;
                dev.axpby(&mut dx, dy, 1.0, 0.0)?;
                grads.push((0, dx));
            }
            Op::Conv(c) => {
                let (x, w) = (self.input(id, 0)?, self.input(id, 1)?);
                let (g, _) = ops::conv_geometry(c, &x.shape, &w.shape)?;
                let (mut dx, mut dw) = (zeros(numel(&x.shape))?, zeros(numel(&w.shape))?);
                dev.conv_backward(&g, &x.buf, &w.buf, dy, &mut dx, &mut dw)?;
                grads.push((0, dx));
                grads.push((1, dw));
                if node.inputs.get(2).copied().flatten().is_some() {
                    let (n, ch) = (out_shape[0], out_shape[1]);
                    grads.push((
                        2,
                        self.reduce_to(dy, &[n, ch, numel(&out_shape[2..])], &[ch, 1])?,
                    ));
                }
            }
            Op::Gemm(gm) => {
                let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
                let (m, n) = (out_shape[0], out_shape[1]);
                let k = if gm.trans_a { a.shape[0] } else { a.shape[1] };
                // dA = alpha · dY · op(B)ᵀ (stored transposed when A is).
                let mut da = zeros(m * k)?;
                let mut mm = if gm.trans_a {
                    let mut mm = Gemm::new(k, m, n);
                    mm.trans_a = gm.trans_b;
                    mm.trans_b = true;
                    mm
                } else {
                    let mut mm = Gemm::new(m, k, n);
                    mm.trans_b = !gm.trans_b;
                    mm
                };
                mm.alpha = gm.alpha;
                if gm.trans_a {
                    dev.gemm(&mm, &b.buf, dy, &mut da)?;
                } else {
                    dev.gemm(&mm, dy, &b.buf, &mut da)?;
                }
                // dB = alpha · op(A)ᵀ · dY (stored transposed when B is).
                let mut db = zeros(k * n)?;
                let mut mm = if gm.trans_b {
                    let mut mm = Gemm::new(n, k, m);
                    mm.trans_a = true;
                    mm.trans_b = gm.trans_a;
                    mm
                } else {
                    let mut mm = Gemm::new(k, n, m);
                    mm.trans_a = !gm.trans_a;
                    mm
                };
                mm.alpha = gm.alpha;
                if gm.trans_b {
                    dev.gemm(&mm, dy, &a.buf, &mut db)?;
                } else {
                    dev.gemm(&mm, &a.buf, dy, &mut db)?;
                }
                grads.push((0, da));
                grads.push((1, db));
                if let Some(c) = self.optional(id, 2) {
                    let mut dc = self.reduce_to(dy, &out_shape, &c.shape)?;
                    if gm.beta != 1.0 {
                        let copy = self.copy(&dc)?;
                        dev.axpby(&mut dc, &copy, gm.beta, 0.0)?;
                    }
                    grads.push((2, dc));
                }
            }
            Op::MatMul => {
                let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
                let plan = MatMulPlan::new(&a.shape, &b.shape)?;
                let (mut da, mut db) = (zeros(numel(&a.shape))?, zeros(numel(&b.shape))?);
                dev.gemm(&plan.grad_a(), dy, &b.buf, &mut da)?;
                dev.gemm(&plan.grad_b(), &a.buf, dy, &mut db)?;
                grads.push((0, da));
                grads.push((1, db));
            }
            Op::Unary(u) => {
                let (op, alpha, beta) = unary_op(*u)?;
                let saved_value = if op.backward_reads_output() {
                    self.values
                        .get(&node.outputs[0])
                        .cloned()
                        .ok_or("the output was not kept")?
                } else {
                    self.input(id, 0)?
                };
                let mut dx = zeros(dev.len(dy))?;
                dev.unary_backward(&mut dx, dy, &saved_value.buf, op, alpha, beta)?;
                grads.push((0, dx));
            }
            Op::Clip { min, max } => {
                let lo = min
                    .or_else(|| self.scalar(id, 1))
                    .unwrap_or(f32::NEG_INFINITY);
                let hi = max.or_else(|| self.scalar(id, 2)).unwrap_or(f32::INFINITY);
                let x = self.input(id, 0)?;
                let mut dx = zeros(dev.len(dy))?;
                dev.unary_backward(&mut dx, dy, &x.buf, UnaryOp::Clip, lo, hi)?;
                grads.push((0, dx));
            }
            Op::Binary(bop) => {
                let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
                let full = |x: &DTensor<B>| Strides::broadcast(&out_shape, &out_shape, &x.shape);
                // An operand's gradient over the output's shape (`None`: `dy` itself).
                let over_output = |slot: usize| -> R<Option<B::Buf>> {
                    let mut g = zeros(dev.len(dy))?;
                    match (bop, slot) {
                        (Binary::Add, _) | (Binary::Sub, 0) => return Ok(None),
                        (Binary::Sub, _) => dev.unary(&mut g, dy, UnaryOp::Neg, 0.0, 0.0)?,
                        (Binary::Mul, 0) => {
                            dev.binary(&mut g, dy, &b.buf, &full(&b)?, BinaryOp::Mul)?
                        }
                        (Binary::Mul, _) => {
                            dev.binary(&mut g, dy, &a.buf, &full(&a)?, BinaryOp::Mul)?
                        }
                        (Binary::Div, 0) => {
                            dev.binary(&mut g, dy, &b.buf, &full(&b)?, BinaryOp::Div)?
                        }
                        (Binary::Div, _) => {
                            // d/db (a/b) = -y/b · dy
                            let y = self
                                .values
                                .get(&node.outputs[0])
                                .cloned()
                                .ok_or("the output was not kept")?;
                            let same = Strides::broadcast(&out_shape, &out_shape, &out_shape)?;
                            let (mut ga, mut t) = (zeros(dev.len(dy))?, zeros(dev.len(dy))?);
                            dev.binary(&mut ga, dy, &b.buf, &full(&b)?, BinaryOp::Div)?;
                            dev.binary(&mut t, &ga, &y.buf, &same, BinaryOp::Mul)?;
                            dev.unary(&mut g, &t, UnaryOp::Neg, 0.0, 0.0)?;
                        }
                        (other, _) => {
                            return Err(format!(
                                "{other:?}'s gradient is not on the CUDA backend yet"
                            )
                            .into())
                        }
                    }
                    Ok(Some(g))
                };
                for (slot, x) in [(0, &a), (1, &b)] {
                    if self.wants_gradient(id, slot) {
                        let g = over_output(slot)?;
                        let g = g.as_ref().unwrap_or(dy);
                        grads.push((slot, self.reduce_to(g, &out_shape, &x.shape)?));
                    }
                }
            }
            Op::Variadic(Variadic::Sum) => {
                for slot in (0..node.inputs.len()).filter(|&s| self.wants_gradient(id, s)) {
                    let x = self.input(id, slot)?;
                    grads.push((slot, self.reduce_to(dy, &out_shape, &x.shape)?));
                }
            }
            Op::Softmax { axis, log, flatten } => {
                let (outer, width, _) = ops::softmax_layout(&out_shape, *axis, *flatten)?;
                let y = self
                    .values
                    .get(&node.outputs[0])
                    .cloned()
                    .ok_or("the output was not kept")?;
                let mut dx = zeros(dev.len(dy))?;
                dev.softmax_rows_backward(&mut dx, dy, &y.buf, outer, width, *log)?;
                grads.push((0, dx));
            }
            Op::Pool(p) => {
                let x = self.input(id, 0)?;
                let (g, _, _): (Pool2d, _, _) = ops::pool_geometry(p, &x.shape)?;
                let win = Window::from(&g);
                let mut dx = zeros(numel(&x.shape))?;
                match (p.kind, saved) {
                    (PoolKind::Max, Saved::Argmax(argmax)) => {
                        dev.max_pool_backward(&mut dx, dy, argmax, &win)?
                    }
                    (PoolKind::Average, _) => {
                        dev.avg_pool_backward(&mut dx, dy, &win, p.count_include_pad)?
                    }
                    _ => return Err("max pooling kept no argmax".into()),
                }
                grads.push((0, dx));
            }
            Op::GlobalPool(PoolKind::Average) => {
                let x = self.input(id, 0)?;
                let area = numel(x.shape.get(2..).unwrap_or_default());
                let planes = numel(&x.shape) / area.max(1);
                let mut spread = zeros(numel(&x.shape))?;
                dev.gather(
                    &mut spread,
                    dy,
                    &Strides::view(&[planes, area], &[1, 0])?,
                    0,
                )?;
                let mut dx = zeros(numel(&x.shape))?;
                dev.unary(&mut dx, &spread, UnaryOp::Scale, 1.0 / area as f32, 0.0)?;
                grads.push((0, dx));
            }
            Op::BatchNorm { .. } => {
                let (x, gamma) = (self.input(id, 0)?, self.input(id, 1)?);
                let Saved::Stats(mean, rstd) = saved else {
                    return Err("batch norm kept no statistics".into());
                };
                let (batch, channels, spatial) = channel_layout(&x.shape)?;
                let (mut dx, mut dg, mut db) =
                    (zeros(numel(&x.shape))?, zeros(channels)?, zeros(channels)?);
                dev.batch_norm_backward(
                    &mut dx,
                    &mut dg,
                    &mut db,
                    dy,
                    &x.buf,
                    (mean, rstd),
                    &gamma.buf,
                    batch,
                    channels,
                    spatial,
                )?;
                if let Some(sum) = self.batch_stats {
                    let bn = batch_stats::Backward {
                        x: &*x.buf,
                        mean,
                        rstd,
                        gamma: &*gamma.buf,
                        sums: (&dg, &db),
                        batch,
                        channels,
                        spatial,
                    };
                    batch_stats::backward(dev, sum, &mut dx, &bn)?;
                }
                grads.push((0, dx));
                grads.push((1, dg));
                grads.push((2, db));
            }
            Op::LayerNorm { axis, .. } => {
                let (x, gamma) = (self.input(id, 0)?, self.input(id, 1)?);
                let Saved::Normalized(xhat, mean, rstd) = saved else {
                    return Err("layer norm kept no statistics".into());
                };
                let a = axis_of(*axis, x.shape.len())?;
                let (rows, n) = (numel(&x.shape[..a]), numel(&x.shape[a..]));
                let mut dx = zeros(rows * n)?;
                dev.layer_norm_backward(
                    &mut dx,
                    dy,
                    &x.buf,
                    Some(&gamma.buf),
                    mean,
                    rstd,
                    rows,
                    n,
                )?;
                let mut dyx = zeros(rows * n)?;
                let param = [rows, n];
                dev.binary(
                    &mut dyx,
                    dy,
                    xhat,
                    &Strides::broadcast(&param, &param, &param)?,
                    BinaryOp::Mul,
                )?;
                let mut dg = zeros(n)?;
                dev.reduce_axis(&mut dg, &dyx, 1, rows, n, false)?;
                grads.push((0, dx));
                grads.push((1, dg));
                if node.inputs.get(2).copied().flatten().is_some() {
                    let mut dbeta = zeros(n)?;
                    dev.reduce_axis(&mut dbeta, dy, 1, rows, n, false)?;
                    grads.push((2, dbeta));
                }
            }
            Op::Transpose { perm } => {
                let x = self.input(id, 0)?;
                let view = transposed_strides(perm.as_deref(), &x.shape)?;
                let mut dx = zeros(numel(&x.shape))?;
                dev.scatter(&mut dx, dy, &Strides::view(&out_shape, &view)?, 0, false)?;
                grads.push((0, dx));
            }
            Op::Reduce {
                kind: ReduceKind::Mean,
                axes,
                noop_with_empty_axes,
                ..
            } => {
                let x = self.input(id, 0)?;
                let axes = self.reduced_axes(id, axes, *noop_with_empty_axes, x.shape.len())?;
                // dy, read back over every reduced position, over their count.
                let mut kept = x.shape.clone();
                for &a in &axes {
                    kept[a] = 1;
                }
                let kept_strides = strides_of(&kept);
                let view: Vec<usize> = (0..x.shape.len())
                    .map(|d| {
                        if axes.contains(&d) {
                            0
                        } else {
                            kept_strides[d]
                        }
                    })
                    .collect();
                let mut spread = zeros(numel(&x.shape))?;
                dev.gather(&mut spread, dy, &Strides::view(&x.shape, &view)?, 0)?;
                let count: usize = axes.iter().map(|&a| x.shape[a]).product();
                let mut dx = zeros(numel(&x.shape))?;
                dev.unary(
                    &mut dx,
                    &spread,
                    UnaryOp::Scale,
                    1.0 / count.max(1) as f32,
                    0.0,
                )?;
                grads.push((0, dx));
            }
            Op::Concat { axis } => {
                let a = axis_of(*axis, out_shape.len())?;
                let strides = strides_of(&out_shape);
                let mut start = 0;
                for slot in 0..node.inputs.len() {
                    let x = self.input(id, slot)?;
                    let mut dx = zeros(numel(&x.shape))?;
                    dev.gather(
                        &mut dx,
                        dy,
                        &Strides::view(&x.shape, &strides)?,
                        start * strides[a],
                    )?;
                    start += x.shape[a];
                    grads.push((slot, dx));
                }
            }
            other => {
                return Err(format!(
                    "{}'s gradient is not on the CUDA backend yet",
                    other_name(other)
                )
                .into())
            }
        }
        Ok(grads)
    }

    fn copy(&self, x: &B::Buf) -> R<B::Buf> {
        let mut out = self.dev.zeros(self.dev.len(x))?;
        self.dev.axpby(&mut out, x, 1.0, 0.0)?;
        Ok(out)
    }
}
