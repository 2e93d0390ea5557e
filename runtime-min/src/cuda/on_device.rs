//! A device computing a plan's layers for the plan executor ([`crate::cpu::exec`]): every
//! rank runs the same interpreter — shares, messages, collectives, schedules — and hands
//! each node's arithmetic to the device. Results stay resident on the device
//! ([`Floats::resident`]): the next device node reads them where they are, and host code
//! (a message, a region, an operator the device lacks) reads them back once, on first
//! use. An operand the host made is uploaded once and kept with it, so a weight crosses
//! to the device once per update. Gradients stay resident the same way, summed on the
//! device where several readers give one, and the optimizer steps weights and momentum
//! where they are. Between layers on one rank a tensor is handed on whole, so a rank whose
//! gradients no collective reads trains without its weights or activations crossing.
//! Shape and integer arithmetic, and operators the device lacks, stay on the host.

use crate::cpu::region::{intersect, volume};
use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ralpc_ir::{Graph, NodeId, Op, ReduceKind, Variadic};

use super::backend::{Backend, R};
use super::batch_stats::GroupSum;
use super::calls::Kernels;
use super::error::DeviceError;
use super::kernels::Strides;
use super::train::{DTensor, Runner, Saved};
use crate::cpu::exec::{Compute, Truth};
use crate::cpu::floats::{DeviceCopy, Floats, Piece, ReadBackError};
use crate::cpu::graph::{self, ExecError, Grads, Record, Values, Weights};
use crate::cpu::ops::{self, Env, Mode, ResidentSaved};
use crate::cpu::tensor::{numel, Data, Tensor};
use crate::dist::Replicas;

/// A device behind the plan interpreter: [`Compute`] on a [`Backend`], its tensors resident.
pub struct OnDevice<B: Backend> {
    dev: B,
    /// Tells this device's resident copies from any other's.
    id: u64,
    transfers: Arc<Transfers>,
    /// The device's own collective and the ranks it sums over (sorted).
    replicas: Option<(Vec<u32>, Box<dyn Replicas<B>>)>,
    /// Sums started since the last update waited for them.
    unsettled: AtomicBool,
}

/// Bytes that crossed between the host and an [`OnDevice`] device.
#[derive(Debug, Default)]
pub struct Transfers {
    uploaded: AtomicU64,
    read_back: AtomicU64,
}

impl Transfers {
    /// Bytes uploaded so far.
    pub fn uploaded(&self) -> u64 {
        self.uploaded.load(Ordering::Relaxed)
    }
    /// Bytes read back so far.
    pub fn read_back(&self) -> u64 {
        self.read_back.load(Ordering::Relaxed)
    }
    fn count(counter: &AtomicU64, elements: usize) {
        Transfers::count_bytes(counter, 4 * elements);
    }
    fn count_bytes(counter: &AtomicU64, bytes: usize) {
        counter.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// A buffer of device `B` kept as a tensor's resident copy.
struct Kept<B: Backend> {
    owner: u64,
    buf: Arc<B::Buf>,
    len: usize,
    transfers: Arc<Transfers>,
    device: PhantomData<fn() -> B>,
}

impl<B: Backend + 'static> DeviceCopy for Kept<B> {
    fn len(&self) -> usize {
        self.len
    }
    fn read_back(&self) -> Result<Vec<f32>, ReadBackError> {
        Transfers::count(&self.transfers.read_back, self.len);
        B::read_back(&self.buf).map_err(|e| Box::new(e) as ReadBackError)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<B: Backend + 'static> OnDevice<B> {
    /// Computes on `dev`.
    pub fn new(dev: B) -> OnDevice<B> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        OnDevice {
            dev,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            transfers: Arc::default(),
            replicas: None,
            unsettled: AtomicBool::new(false),
        }
    }

    /// Computes on `dev`, meeting the devices of the ranks of `group` through `replicas`
    /// (NCCL across GPUs, the same-device hub for ranks sharing one): the sums over groups
    /// the replicas cover and the messages between members never leave the devices.
    pub fn with_replicas(dev: B, group: &[u32], replicas: Box<dyn Replicas<B>>) -> OnDevice<B> {
        let mut members = group.to_vec();
        members.sort_unstable();
        OnDevice {
            replicas: Some((members, replicas)),
            ..OnDevice::new(dev)
        }
    }

    /// What crossed between the host and the device so far (and goes on counting).
    pub fn transfers(&self) -> Arc<Transfers> {
        self.transfers.clone()
    }

    /// `buf` (of `len` elements) as a tensor's resident copy.
    fn keep(&self, buf: Arc<B::Buf>, len: usize) -> Arc<dyn DeviceCopy> {
        Arc::new(Kept::<B> {
            owner: self.id,
            buf,
            len,
            transfers: self.transfers.clone(),
            device: PhantomData,
        })
    }

    /// `f` on this device: its resident copy when this device made one, else uploaded
    /// (and the upload kept with `f` for the next reader).
    fn on_this_device(&self, f: &Floats) -> R<Arc<B::Buf>> {
        if let Some(buf) = self.own_copy(f) {
            return Ok(buf);
        }
        Transfers::count(&self.transfers.uploaded, f.len());
        let buf = Arc::new(self.dev.upload(f)?);
        f.keep_on_device(self.keep(buf.clone(), f.len()));
        Ok(buf)
    }

    /// `f`'s buffer on this device when its elements are there and not on the host (so
    /// that cutting or assembling them there saves reading them back).
    fn resident_here(&self, f: &Floats) -> Option<Arc<B::Buf>> {
        self.own_copy(f).filter(|_| !f.on_host())
    }

    /// `x` (holding `holder`) with `part` written into its box `piece` (added to it when
    /// `add`), in place when nothing else holds `x`'s buffer: [`Compute::accumulate`] and
    /// [`Compute::overwrite`].
    fn scatter_into(
        &self,
        x: Floats,
        holder: &[std::ops::Range<usize>],
        piece: &[std::ops::Range<usize>],
        part: &Floats,
        add: bool,
    ) -> Result<Result<Floats, Floats>, ExecError> {
        if self.resident_here(&x).is_none() {
            return Ok(Err(x));
        }
        let Ok(view) = box_view(holder, piece) else {
            return Ok(Err(x));
        };
        let part = self.on_this_device(part).map_err(off_node)?;
        let n = x.len();
        let mut out = self.to_write(x).map_err(off_node)?;
        self.dev
            .scatter(&mut out, &part, &view.0, view.1, add)
            .map_err(off_node)?;
        Ok(Ok(Floats::resident(self.keep(Arc::new(out), n))))
    }

    /// `f`'s copy on this device, if it has one.
    fn own_copy(&self, f: &Floats) -> Option<Arc<B::Buf>> {
        f.device_copy(|c| {
            c.as_any()
                .downcast_ref::<Kept<B>>()
                .filter(|k| k.owner == self.id)
                .map(|k| k.buf.clone())
        })
    }

    /// `f`'s elements in a buffer of this device to write: its own resident buffer when
    /// nothing else holds it, else a copy.
    fn to_write(&self, f: Floats) -> R<B::Buf> {
        let n = f.len();
        let buf = self.on_this_device(&f)?;
        // The last other holder of the buffer, when `f` held it alone.
        drop(f);
        match Arc::try_unwrap(buf) {
            Ok(buf) => Ok(buf),
            Err(shared) => {
                let mut copy = self.dev.zeros(n)?;
                self.dev.axpby(&mut copy, &shared, 1.0, 0.0)?;
                Ok(copy)
            }
        }
    }

    /// Whether node `id` runs on the device with these operands: a float op the device
    /// lowers, on float inputs, in training mode.
    fn on_device(&self, graph: &Graph, id: NodeId, values: &Values, env: Env) -> bool {
        let node = graph.node(id);
        let floats = node.inputs.iter().flatten().take(1).all(|&v| {
            values
                .get(v)
                .is_some_and(|t| matches!(t.data, Data::F32(_)))
        });
        let supported = match &node.op {
            Op::Conv(_)
            | Op::Gemm(_)
            | Op::MatMul
            | Op::Clip { .. }
            | Op::Variadic(Variadic::Sum)
            | Op::Pool(_)
            | Op::Transpose { .. }
            | Op::Concat { .. }
            | Op::Reduce {
                kind: ReduceKind::Mean,
                ..
            }
            | Op::GlobalPool(ralpc_ir::PoolKind::Average) => true,
            Op::Unary(u) => super::node_ops::unary_op(*u).is_ok(),
            Op::Binary(b) => matches!(
                b,
                ralpc_ir::Binary::Add
                    | ralpc_ir::Binary::Sub
                    | ralpc_ir::Binary::Mul
                    | ralpc_ir::Binary::Div
            ),
            Op::Softmax { axis, flatten, .. } => node
                .inputs
                .first()
                .copied()
                .flatten()
                .and_then(|v| values.get(v))
                .and_then(|x| ops::softmax_layout(&x.shape, *axis, *flatten).ok())
                .is_some_and(|(_, _, inner)| inner == 1),
            Op::BatchNorm { .. } | Op::LayerNorm { .. } => {
                node.outputs.len() == 1 && env.mode == Mode::Training
            }
            _ => false,
        };
        // Every input of a device op is a float tensor, except the small constants its
        // attributes come from (ReduceMean's axes, Clip's bounds).
        let all_floats = node.inputs.iter().enumerate().all(|(slot, v)| {
            v.and_then(|v| values.get(v)).is_none_or(|t| {
                matches!(t.data, Data::F32(_))
                    || (slot > 0 && matches!(node.op, Op::Reduce { .. } | Op::Clip { .. }))
            })
        });
        floats && supported && all_floats
    }

    /// Node `id` forward on the device, its outputs left resident; a batch normalization
    /// adds its statistics up with `batch_stats` when given.
    fn forward_on_device(
        &self,
        graph: &Graph,
        id: NodeId,
        values: &mut Values,
        env: Env,
        batch_stats: Option<GroupSum<'_>>,
    ) -> Result<Record, ExecError> {
        let node = graph.node(id);
        let error = |source: DeviceError| ExecError::Device {
            site: Some(graph.site(id)),
            source,
        };
        let host = constants(graph, id, values);
        let mut runner = self
            .runner(graph, id, values, env, &host, false)
            .map_err(error)?;
        runner.batch_stats = batch_stats;
        runner.forward(id).map_err(error)?;
        for &o in &node.outputs {
            if let Some(t) = runner.values.get(&o) {
                let kept = self.keep(t.buf.clone(), numel(&t.shape));
                values.set(
                    o,
                    Tensor {
                        shape: t.shape.clone(),
                        data: Data::F32(Floats::resident(kept)),
                    },
                );
            }
        }
        let saved = match runner.saved.pop().map(|(_, s)| s) {
            Some(Saved::None) | None => ops::Saved::None,
            Some(kept) => ops::Saved::Resident(ResidentSaved(Arc::new(kept))),
        };
        Ok(Record { node: id, saved })
    }

    /// `record`'s node backward on the device, its input gradients left resident (added
    /// to any earlier reader's there); a batch normalization sums its batch terms with
    /// `batch_stats` when given.
    fn backward_on_device(
        &self,
        graph: &Graph,
        record: &Record,
        values: &Values,
        grads: &mut Grads,
        batch_stats: Option<GroupSum<'_>>,
    ) -> Result<(), ExecError> {
        let env = training(graph);
        let id = record.node;
        let node = graph.node(id);
        let Some(&out) = node.outputs.first() else {
            return Ok(());
        };
        let Some(dy) = grads.floats(out).cloned() else {
            return Ok(());
        };
        let error = |source: DeviceError| ExecError::Device {
            site: Some(graph.site(id)),
            source,
        };
        let host = constants(graph, id, values);
        let mut runner = self
            .runner(graph, id, values, env, &host, true)
            .map_err(error)?;
        runner.batch_stats = batch_stats;
        let dev = &self.dev;
        let none = Saved::None;
        let saved = match &record.saved {
            ops::Saved::None => &none,
            ops::Saved::Resident(ResidentSaved(kept)) => {
                kept.downcast_ref::<Saved<B>>().ok_or_else(|| {
                    error(DeviceError::Inconsistent(
                        "the forward pass's state was kept by another kind of device".into(),
                    ))
                })?
            }
            ops::Saved::Argmax(_) | ops::Saved::Stats(..) => {
                return Err(error(DeviceError::Inconsistent(
                    "the forward pass ran on the host, the backward pass on the device".into(),
                )))
            }
        };
        let dy = self.on_this_device(&dy).map_err(error)?;
        for (slot, mut sum) in runner.backward(id, saved, &dy).map_err(error)? {
            let Some(Some(v)) = node.inputs.get(slot).copied() else {
                continue;
            };
            // Earlier readers' gradient of the same input, added where both are.
            if let Some(earlier) = grads.take_floats(v) {
                if earlier.len() != dev.len(&sum) {
                    return Err(error(DeviceError::Inconsistent(format!(
                        "gradients of {} and {} elements for '{}'",
                        earlier.len(),
                        dev.len(&sum),
                        graph.value(v).name
                    ))));
                }
                let earlier = self.on_this_device(&earlier).map_err(error)?;
                dev.axpby(&mut sum, &earlier, 1.0, 1.0).map_err(error)?;
            }
            let n = dev.len(&sum);
            grads.set(v, Floats::resident(self.keep(Arc::new(sum), n)));
        }
        Ok(())
    }

    /// A runner for node `id` with its operands (and, for backward, its outputs) uploaded.
    fn runner<'r>(
        &'r self,
        graph: &'r Graph,
        id: NodeId,
        values: &Values,
        env: Env,
        host: &'r Weights,
        with_outputs: bool,
    ) -> R<Runner<'r, B>> {
        let node = graph.node(id);
        let mut runner = Runner::new(&self.dev, graph, None, host);
        runner.env = env;
        let outputs = node
            .outputs
            .iter()
            .map(|&v| Some(v))
            .filter(|_| with_outputs);
        for v in node.inputs.iter().copied().chain(outputs).flatten() {
            if let Some(Tensor {
                shape,
                data: Data::F32(f),
            }) = values.get(v)
            {
                // Released after the forward pass: its shape, and one element standing in
                // for what the backward pass does not read.
                let buf = match f.is_released() {
                    true => Arc::new(self.dev.zeros(1)?),
                    false => self.on_this_device(f)?,
                };
                runner.values.insert(
                    v,
                    DTensor {
                        buf,
                        shape: shape.clone(),
                    },
                );
            }
        }
        Ok(runner)
    }
}

/// The view of the box `piece` inside a row-major tensor holding the box `holder`: its
/// shape read with the holder's strides, from the element where it starts.
fn box_view(
    holder: &[std::ops::Range<usize>],
    piece: &[std::ops::Range<usize>],
) -> R<(Strides, usize)> {
    let dims: Vec<usize> = holder.iter().map(|r| r.len()).collect();
    let mut strides = vec![1usize; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let offset = piece
        .iter()
        .zip(holder)
        .zip(&strides)
        .map(|((p, h), s)| p.start.saturating_sub(h.start) * s)
        .sum();
    let shape: Vec<usize> = piece.iter().map(|r| r.len()).collect();
    Ok((Strides::view(&shape, &strides)?, offset))
}

/// A device failure outside any node's arithmetic (uploads, sums, the update).
fn off_node(source: DeviceError) -> ExecError {
    ExecError::Device { site: None, source }
}

/// How `graph` runs in a training step.
fn training(graph: &Graph) -> Env {
    Env {
        mode: Mode::Training,
        exported_batch: graph.rebatch().map(|r| r.exported),
        samples: None,
    }
}

/// The node's small host operands (constants its attributes come from).
fn constants(graph: &Graph, id: NodeId, values: &Values) -> Weights {
    let mut w = Weights::default();
    for v in graph.node(id).inputs.iter().skip(1).flatten() {
        if let Some(t) = values.get(*v).filter(|t| t.len() <= 64) {
            w.tensors.insert(*v, t.clone());
        }
    }
    w
}

/// Tensors of a gradient bucket at least this long are summed in place, each on its own.
const IN_PLACE_ELEMENTS: usize = 1 << 20;

impl<B: Backend + 'static> OnDevice<B> {
    /// Sums `g` over `group` in place on the device.
    fn sum_in_place(
        &self,
        replicas: &dyn Replicas<B>,
        group: &[u32],
        g: &mut Floats,
    ) -> Result<(), ExecError> {
        let n = g.len();
        let mut buf = self.to_write(std::mem::take(g)).map_err(off_node)?;
        replicas
            .all_reduce(&self.dev, group, &mut buf)
            .map_err(off_node)?;
        *g = Floats::resident(self.keep(Arc::new(buf), n));
        Ok(())
    }

    /// Sums `tensors` over `group` with one collective, laid end to end.
    fn sum_end_to_end(
        &self,
        replicas: &dyn Replicas<B>,
        group: &[u32],
        tensors: &mut [&mut Floats],
    ) -> Result<(), ExecError> {
        let dev = &self.dev;
        let total = tensors.iter().map(|g| g.len()).sum();
        let mut flat = dev.zeros(total).map_err(off_node)?;
        let mut at = 0;
        for g in tensors.iter() {
            let n = g.len();
            let buf = self.on_this_device(g).map_err(off_node)?;
            let view = Strides::view(&[n], &[1]).map_err(off_node)?;
            dev.scatter(&mut flat, &buf, &view, at, false)
                .map_err(off_node)?;
            at += n;
        }
        replicas
            .all_reduce(dev, group, &mut flat)
            .map_err(off_node)?;
        let mut at = 0;
        for g in tensors.iter_mut() {
            let n = g.len();
            let mut sum = dev.zeros(n).map_err(off_node)?;
            let view = Strides::view(&[n], &[1]).map_err(off_node)?;
            dev.gather(&mut sum, &flat, &view, at).map_err(off_node)?;
            **g = Floats::resident(self.keep(Arc::new(sum), n));
            at += n;
        }
        Ok(())
    }
}

impl<B: Backend + 'static> Compute for OnDevice<B> {
    fn computes_values(&self) -> bool {
        B::COMPUTES_VALUES
    }

    fn forward(
        &self,
        graph: &Graph,
        nodes: &[NodeId],
        values: &mut Values,
        env: Env,
    ) -> Result<Vec<Record>, ExecError> {
        let mut records = Vec::with_capacity(nodes.len());
        for &id in nodes {
            let node = graph.node(id);
            if matches!(node.op, Op::Input | Op::Constant { .. }) {
                continue;
            }
            if !self.on_device(graph, id, values, env) {
                records.extend(graph::forward(graph, &[id], values, env)?);
                continue;
            }
            records.push(self.forward_on_device(graph, id, values, env, None)?);
        }
        Ok(records)
    }

    fn sgd_momentum(
        &self,
        weight: &mut Floats,
        velocity: &mut Floats,
        grad: &Floats,
        lr: f32,
        momentum: f32,
    ) -> Result<(), ExecError> {
        // The update reads the sums: wait for them here, where a rank that stopped
        // answering turns into an error after the timeout.
        if let Some((_, replicas)) = &self.replicas {
            if self.unsettled.swap(false, Ordering::Relaxed) {
                replicas.settle().map_err(off_node)?;
            }
        }
        let n = grad.len();
        let g = self.on_this_device(grad).map_err(off_node)?;
        let mut w = self.to_write(std::mem::take(weight)).map_err(off_node)?;
        let mut v = self.to_write(std::mem::take(velocity)).map_err(off_node)?;
        self.dev
            .sgd_momentum(&mut w, &mut v, &g, lr, momentum)
            .map_err(off_node)?;
        *weight = Floats::resident(self.keep(Arc::new(w), n));
        *velocity = Floats::resident(self.keep(Arc::new(v), n));
        Ok(())
    }

    fn batch_norm_synced(
        &self,
        graph: &Graph,
        id: NodeId,
        values: &mut Values,
        sum: graph::GroupSum<'_>,
    ) -> Result<Record, ExecError> {
        let env = training(graph);
        if !self.on_device(graph, id, values, env) {
            return graph::batch_norm_synced(graph, id, values, sum);
        }
        let sum =
            |v: &mut [f64]| sum(v).map_err(|graph::ExchangeFailed(e)| DeviceError::Replicas(e));
        self.forward_on_device(graph, id, values, env, Some(&sum))
    }

    fn batch_norm_synced_backward(
        &self,
        graph: &Graph,
        record: &Record,
        values: &Values,
        grads: &mut Grads,
        sum: graph::GroupSum<'_>,
    ) -> Result<(), ExecError> {
        if !self.on_device(graph, record.node, values, training(graph)) {
            return graph::batch_norm_synced_backward(graph, record, values, grads, sum);
        }
        let sum =
            |v: &mut [f64]| sum(v).map_err(|graph::ExchangeFailed(e)| DeviceError::Replicas(e));
        self.backward_on_device(graph, record, values, grads, Some(&sum))
    }

    fn hold(&self, f: Floats) -> Result<Floats, DeviceError> {
        let n = f.len();
        let buf = self.on_this_device(&f)?;
        Ok(Floats::resident(self.keep(buf, n)))
    }

    fn zeros(&self, n: usize) -> Result<Floats, ExecError> {
        let buf = self.dev.zeros(n).map_err(off_node)?;
        Ok(Floats::resident(self.keep(Arc::new(buf), n)))
    }

    fn add(&self, a: Floats, b: &Floats) -> Result<Floats, ExecError> {
        let n = a.len();
        let b = self.on_this_device(b).map_err(off_node)?;
        let mut sum = self.to_write(a).map_err(off_node)?;
        self.dev.axpby(&mut sum, &b, 1.0, 1.0).map_err(off_node)?;
        Ok(Floats::resident(self.keep(Arc::new(sum), n)))
    }

    fn crop(
        &self,
        x: &Floats,
        holder: &[std::ops::Range<usize>],
        piece: &[std::ops::Range<usize>],
    ) -> Result<Option<Floats>, ExecError> {
        let Some(buf) = self.resident_here(x) else {
            return Ok(None);
        };
        let Ok(view) = box_view(holder, piece) else {
            return Ok(None);
        };
        let n = volume(&piece.to_vec());
        let mut out = self.dev.zeros(n).map_err(off_node)?;
        self.dev
            .gather(&mut out, &buf, &view.0, view.1)
            .map_err(off_node)?;
        Ok(Some(Floats::resident(self.keep(Arc::new(out), n))))
    }

    fn loss(
        &self,
        output: &Floats,
        truth: Truth<'_>,
        total: usize,
    ) -> Result<Option<(f64, Floats)>, ExecError> {
        let Some(y) = self.resident_here(output) else {
            return Ok(None);
        };
        let (dev, n) = (&self.dev, output.len());
        let mut dy = dev.zeros(n).map_err(off_node)?;
        let per = match truth {
            Truth::Classes { labels, classes } => {
                let rows = n / classes.max(1);
                if labels.len() != rows {
                    return Ok(None);
                }
                Transfers::count_bytes(&self.transfers.uploaded, 8 * rows);
                let labels = dev.upload_indices(labels).map_err(off_node)?;
                let mut per = dev.zeros(rows).map_err(off_node)?;
                dev.cross_entropy(&mut per, &mut dy, &y, &labels, rows, classes, total)
                    .map_err(off_node)?;
                per
            }
            Truth::Targets(targets) => {
                if targets.len() != n {
                    return Ok(None);
                }
                Transfers::count(&self.transfers.uploaded, n);
                let targets = dev.upload(targets).map_err(off_node)?;
                let mut per = dev.zeros(n).map_err(off_node)?;
                dev.mse(&mut per, &mut dy, &y, &targets, total)
                    .map_err(off_node)?;
                per
            }
        };
        Transfers::count(&self.transfers.read_back, dev.len(&per));
        let loss = dev
            .download(&per)
            .map_err(off_node)?
            .iter()
            .map(|&v| f64::from(v))
            .sum();
        Ok(Some((loss, Floats::resident(self.keep(Arc::new(dy), n)))))
    }

    fn class_statistics(
        &self,
        logits: &Floats,
        labels: &[i64],
        classes: usize,
        first: usize,
    ) -> Result<Option<Vec<f32>>, ExecError> {
        let Some(y) = self.resident_here(logits) else {
            return Ok(None);
        };
        let rows = labels.len();
        if rows * classes != logits.len() {
            return Ok(None);
        }
        let dev = &self.dev;
        Transfers::count_bytes(&self.transfers.uploaded, 8 * rows);
        let labels = dev.upload_indices(labels).map_err(off_node)?;
        let mut stats = dev.zeros(3 * rows).map_err(off_node)?;
        dev.class_stats(&mut stats, &y, &labels, rows, classes, first)
            .map_err(off_node)?;
        Transfers::count(&self.transfers.read_back, 3 * rows);
        dev.download(&stats).map(Some).map_err(off_node)
    }

    fn class_piece_gradient(
        &self,
        logits: &Floats,
        lse: &[f32],
        labels: &[i64],
        first: usize,
        scale: f32,
    ) -> Result<Option<Floats>, ExecError> {
        let Some(y) = self.resident_here(logits) else {
            return Ok(None);
        };
        let (rows, n) = (labels.len(), logits.len());
        if rows == 0 || n % rows != 0 || lse.len() != rows {
            return Ok(None);
        }
        let dev = &self.dev;
        Transfers::count_bytes(&self.transfers.uploaded, 8 * rows);
        Transfers::count(&self.transfers.uploaded, rows);
        let labels = dev.upload_indices(labels).map_err(off_node)?;
        let lse = dev.upload(lse).map_err(off_node)?;
        let mut dy = dev.zeros(n).map_err(off_node)?;
        dev.class_piece_grad(&mut dy, &y, &lse, &labels, rows, n / rows, first, scale)
            .map_err(off_node)?;
        Ok(Some(Floats::resident(self.keep(Arc::new(dy), n))))
    }

    fn accumulate(
        &self,
        x: Floats,
        holder: &[std::ops::Range<usize>],
        piece: &[std::ops::Range<usize>],
        part: &Floats,
    ) -> Result<Result<Floats, Floats>, ExecError> {
        self.scatter_into(x, holder, piece, part, true)
    }

    fn overwrite(
        &self,
        x: Floats,
        holder: &[std::ops::Range<usize>],
        piece: &[std::ops::Range<usize>],
        part: &Floats,
    ) -> Result<Result<Floats, Floats>, ExecError> {
        self.scatter_into(x, holder, piece, part, false)
    }

    fn paste(
        &self,
        need: &[std::ops::Range<usize>],
        parts: &[Piece<'_>],
    ) -> Result<Option<Floats>, ExecError> {
        let need = need.to_vec();
        let mut boxes = Vec::with_capacity(parts.len());
        for (held, f) in parts {
            let Some(buf) = self.resident_here(f) else {
                return Ok(None);
            };
            let held = held.to_vec();
            let inside = intersect(&held, &need);
            boxes.push((held, inside, buf));
        }
        // Covered once, else the host assembles it (and names what is missing).
        let covered: usize = boxes.iter().map(|(_, inside, _)| volume(inside)).sum();
        if covered != volume(&need) {
            return Ok(None);
        }
        let dev = &self.dev;
        let n = volume(&need);
        let mut out = dev.zeros(n).map_err(off_node)?;
        for (held, inside, buf) in boxes {
            let m = volume(&inside);
            if m == 0 {
                continue;
            }
            let (Ok(from), Ok(to)) = (box_view(&held, &inside), box_view(&need, &inside)) else {
                return Ok(None);
            };
            let mut piece = dev.zeros(m).map_err(off_node)?;
            dev.gather(&mut piece, &buf, &from.0, from.1)
                .map_err(off_node)?;
            dev.scatter(&mut out, &piece, &to.0, to.1, false)
                .map_err(off_node)?;
        }
        Ok(Some(Floats::resident(self.keep(Arc::new(out), n))))
    }

    fn send(&self, to: u32, tag: u64, data: &Floats) -> Result<bool, ExecError> {
        let Some((members, replicas)) = &self.replicas else {
            return Ok(false);
        };
        if !members.contains(&to) {
            return Ok(false);
        }
        let buf = self.on_this_device(data).map_err(off_node)?;
        replicas.send(&self.dev, to, tag, &buf).map_err(off_node)
    }

    fn recv(&self, from: u32, tag: u64, n: usize) -> Result<Option<Floats>, ExecError> {
        let Some((members, replicas)) = &self.replicas else {
            return Ok(None);
        };
        if !members.contains(&from) {
            return Ok(None);
        }
        Ok(replicas
            .recv(&self.dev, from, tag, n)
            .map_err(off_node)?
            .map(|buf| Floats::resident(self.keep(Arc::new(buf), n))))
    }

    fn all_gather(&self, group: &[u32], data: &Floats) -> Result<Option<Vec<Floats>>, ExecError> {
        let Some((members, replicas)) = &self.replicas else {
            return Ok(None);
        };
        if !group.iter().all(|r| members.contains(r)) || !replicas.reaches(group) {
            return Ok(None);
        }
        let buf = self.on_this_device(data).map_err(off_node)?;
        let Some(all) = replicas
            .all_gather(&self.dev, group, &buf)
            .map_err(off_node)?
        else {
            return Ok(None);
        };
        Ok(Some(
            all.into_iter()
                .map(|part| {
                    let n = self.dev.len(&part);
                    Floats::resident(self.keep(Arc::new(part), n))
                })
                .collect(),
        ))
    }

    fn all_reduce(&self, group: &[u32], bucket: &mut [Floats]) -> Result<bool, ExecError> {
        let Some((members, replicas)) = &self.replicas else {
            return Ok(false);
        };
        let mut group = group.to_vec();
        group.sort_unstable();
        if !group.iter().all(|r| members.contains(r)) || !replicas.reaches(&group) {
            return Ok(false);
        }
        self.unsettled.store(true, Ordering::Relaxed);
        // A large tensor is summed in place on its own (no second copy of it, which the
        // plan's memory does not hold); the small ones together, end to end: a collective
        // call (and, for ranks sharing a GPU, a wait for the device) per bucket of them,
        // not per tensor; an empty bucket still meets the others once. Every member splits
        // its bucket alike.
        let (large, small): (Vec<usize>, Vec<usize>) =
            (0..bucket.len()).partition(|&i| bucket[i].len() >= IN_PLACE_ELEMENTS);
        let nothing_large = large.is_empty();
        for i in large {
            self.sum_in_place(replicas.as_ref(), &group, &mut bucket[i])?;
        }
        match small[..] {
            [] if !nothing_large => {}
            [i] => self.sum_in_place(replicas.as_ref(), &group, &mut bucket[i])?,
            _ => {
                let mut tensors: Vec<&mut Floats> = bucket
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| small.contains(i))
                    .map(|(_, g)| g)
                    .collect();
                self.sum_end_to_end(replicas.as_ref(), &group, &mut tensors)?;
            }
        }
        Ok(true)
    }

    fn backward(
        &self,
        graph: &Graph,
        records: &[Record],
        values: &Values,
        grads: &mut Grads,
    ) -> Result<(), ExecError> {
        let env = training(graph);
        for record in records.iter().rev() {
            if !self.on_device(graph, record.node, values, env) {
                graph::backward(graph, std::slice::from_ref(record), values, grads)?;
                continue;
            }
            self.backward_on_device(graph, record, values, grads, None)?;
        }
        Ok(())
    }
}
