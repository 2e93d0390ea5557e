//! Training on one device: the loop around a [`Runner`] that the GPU tests time the plan
//! interpreter against, and per-node profiling (`ralpc profile --device cuda:N`).

use std::collections::BTreeMap;
use std::sync::Arc;

use ralpc_ir::{Graph, GraphInfo, NodeId, Op, ValueId};

use super::backend::{Backend, R};
use super::calls::Kernels;
use super::error::unsupported;
use super::error::DeviceError;
use super::node_ops::numel;
use super::train::{DTensor, Runner};
use crate::cpu::graph::{ExecError, Weights};
use crate::cpu::tensor::Data;
use crate::cpu::train::{Dataset, Loss, TrainOptions, TrainReport};

/// Trains `graph` (bound at the global batch) on `dev` as
/// [`train_reference`](crate::cpu::train::train_reference) does on the host: same
/// weights, data, loss and optimizer, so the two reports agree to rounding. Each step's
/// time runs from one loss to the next.
///
/// # Errors
/// An operator the device cannot run yet (naming the node), or a device failure.
pub fn train<B: Backend>(
    dev: &B,
    graph: &Graph,
    info: &GraphInfo,
    weights: &Weights,
    data: &Dataset,
    options: &TrainOptions,
) -> Result<TrainReport, ExecError> {
    let at = |node: Option<NodeId>| {
        move |source: DeviceError| ExecError::Device {
            site: node.map(|n| graph.site(n)),
            source,
        }
    };
    let device = at(None);
    let output = *graph.outputs().first().ok_or_else(|| ExecError::Input {
        name: "output".into(),
        message: "the model has no output".into(),
    })?;
    // Float constants and inputs live on the device; integer ones (shapes) stay here.
    let mut params: BTreeMap<ValueId, Arc<B::Buf>> = BTreeMap::new();
    for (&v, t) in &weights.tensors {
        if let Some(f) = t.floats() {
            params.insert(v, Arc::new(dev.upload(f).map_err(&device)?));
        }
    }
    let mut inputs: BTreeMap<ValueId, Arc<B::Buf>> = BTreeMap::new();
    for (&v, t) in &data.inputs {
        if let Some(f) = t.floats() {
            inputs.insert(v, Arc::new(dev.upload(f).map_err(&device)?));
        }
    }
    let mut velocity: BTreeMap<ValueId, B::Buf> = BTreeMap::new();
    let mut report = TrainReport::default();
    let shape_of = |v: ValueId| -> Vec<usize> {
        info.ty(v)
            .shape
            .as_sizes()
            .unwrap_or_default()
            .iter()
            .map(|&d| d as usize)
            .collect()
    };
    let mut last_loss = std::time::Instant::now();
    for step in 0..options.steps {
        let mut runner = Runner::new(dev, graph, Some(info), weights);
        for (&v, buf) in params.iter().chain(&inputs) {
            runner.values.insert(
                v,
                DTensor {
                    buf: buf.clone(),
                    shape: shape_of(v),
                },
            );
        }
        for &id in info.order() {
            runner.forward(id).map_err(at(Some(id)))?;
        }
        let y = runner
            .values
            .get(&output)
            .cloned()
            .ok_or_else(|| ExecError::Input {
                name: graph.value(output).name.clone(),
                message: "the output is not a float tensor on the device".into(),
            })?;
        let (l, dy) = loss(dev, options.loss, &y, &data.labels).map_err(&device)?;
        report.losses.push(l);
        let now = std::time::Instant::now();
        report
            .step_seconds
            .push(now.duration_since(last_loss).as_secs_f64());
        last_loss = now;
        if step == 0 {
            report.first_output = dev.download(&y.buf).map_err(&device)?;
        }
        let mut grads: BTreeMap<ValueId, B::Buf> = BTreeMap::new();
        grads.insert(output, dy);
        let saved = std::mem::take(&mut runner.saved);
        for (id, kept) in saved.iter().rev() {
            let node = graph.node(*id);
            let Some(dy) = node.outputs.first().and_then(|v| grads.remove(v)) else {
                continue;
            };
            let input_grads = runner.backward(*id, kept, &dy).map_err(at(Some(*id)))?;
            for (slot, g) in input_grads {
                let Some(Some(v)) = node.inputs.get(slot).copied() else {
                    continue;
                };
                match grads.get_mut(&v) {
                    Some(acc) => dev.axpby(acc, &g, 1.0, 1.0).map_err(&device)?,
                    None => {
                        grads.insert(v, g);
                    }
                }
            }
        }
        drop(saved);
        drop(runner);
        for &w in &weights.trainable {
            let (Some(param), Some(g)) = (params.get_mut(&w), grads.remove(&w)) else {
                continue;
            };
            let n = dev.len(param);
            if step == 0 {
                report.first_gradients.insert(
                    graph.value(w).name.clone(),
                    dev.download(&g).map_err(&device)?,
                );
            }
            let v = match velocity.entry(w) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(dev.zeros(n).map_err(&device)?)
                }
            };
            let param = Arc::get_mut(param).ok_or_else(|| {
                device(DeviceError::Inconsistent(
                    "a weight is still shared after the step".into(),
                ))
            })?;
            dev.sgd_momentum(param, v, &g, options.lr, options.momentum)
                .map_err(&device)?;
        }
    }
    for &w in &weights.trainable {
        if let Some(p) = params.get(&w) {
            report.weights.insert(
                graph.value(w).name.clone(),
                dev.download(p).map_err(&device)?,
            );
        }
    }
    Ok(report)
}

/// The loss of the output, normalized by its rows, and its gradient.
fn loss<B: Backend>(dev: &B, kind: Loss, y: &DTensor<B>, labels: &Data) -> R<(f64, B::Buf)> {
    let total = numel(&y.shape);
    let mut dy = dev.zeros(total)?;
    let per = match (kind, labels) {
        (Loss::CrossEntropy, Data::I64(classes_of)) => {
            let classes = crate::cpu::train::classes(&y.shape);
            let rows = total / classes;
            let labels = dev.upload_indices(
                classes_of
                    .get(..rows)
                    .ok_or_else(|| unsupported("too few labels"))?,
            )?;
            let mut per = dev.zeros(rows)?;
            dev.cross_entropy(&mut per, &mut dy, &y.buf, &labels, rows, classes, rows)?;
            per
        }
        (Loss::Mse, Data::F32(targets)) => {
            let t = dev.upload(
                targets
                    .get(..total)
                    .ok_or_else(|| unsupported("too few targets"))?,
            )?;
            let mut per = dev.zeros(total)?;
            dev.mse(&mut per, &mut dy, &y.buf, &t, total)?;
            per
        }
        _ => return Err(unsupported("the labels do not fit the loss")),
    };
    let l = dev.download(&per)?.iter().map(|&v| f64::from(v)).sum();
    Ok((l, dy))
}

/// One node's measured times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeTime {
    /// The node.
    pub node: NodeId,
    /// Forward, µs.
    pub forward_us: f64,
    /// Backward (all its input gradients from a gradient of ones), µs; 0 for a node
    /// without one.
    pub backward_us: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs of one op timed back to back between two marks, their mean one sample: in a
/// training step the host enqueues ahead of the GPU, so an op costs its time on the
/// device, not the launch latency one run alone between two events would add.
const BURST: u32 = 4;

/// Times `nodes` of `graph` (bound at its batch) on `dev`, forward and backward, each on
/// its own with the operands a forward pass of the whole model gives it: one warm-up, then
/// the median of `repeats` samples, each the mean of `BURST` runs between two
/// [`Backend::mark`]s (CUDA events on a GPU).
///
/// # Errors
/// An operator the device cannot run yet (naming the node), or a device failure.
pub fn profile<B: Backend>(
    dev: &B,
    graph: &Graph,
    info: &GraphInfo,
    weights: &Weights,
    data: &Dataset,
    nodes: &[NodeId],
    repeats: u32,
) -> Result<Vec<NodeTime>, ExecError> {
    let at = |id: NodeId| {
        move |source: DeviceError| ExecError::Device {
            site: Some(graph.site(id)),
            source,
        }
    };
    let device = |source: DeviceError| ExecError::Device { site: None, source };
    let mut runner = Runner::new(dev, graph, Some(info), weights);
    for (&v, t) in weights.tensors.iter().chain(&data.inputs) {
        if let (Some(f), Ok(shape)) = (t.floats(), runner.shape(v)) {
            let buf = dev.upload(f).map_err(&device)?;
            runner.values.insert(
                v,
                DTensor {
                    buf: Arc::new(buf),
                    shape,
                },
            );
        }
    }
    for &id in info.order() {
        runner.forward(id).map_err(at(id))?;
    }
    runner.saved.clear();
    let timed =
        |runner: &mut Runner<'_, B>, f: &mut dyn FnMut(&mut Runner<'_, B>) -> R<()>| -> R<f64> {
            f(runner)?;
            let mut samples = Vec::with_capacity(repeats.max(1) as usize);
            for _ in 0..repeats.max(1) {
                let start = dev.mark()?;
                for _ in 0..BURST {
                    f(runner)?;
                }
                let end = dev.mark()?;
                samples.push(dev.elapsed_us(&start, &end)? / f64::from(BURST));
            }
            Ok(median(samples))
        };
    let mut times = Vec::with_capacity(nodes.len());
    for &id in nodes {
        let node = graph.node(id);
        if matches!(node.op, Op::Input | Op::Constant { .. }) || node.outputs.is_empty() {
            continue;
        }
        let forward_us = timed(&mut runner, &mut |r| {
            r.forward(id)?;
            r.saved.pop();
            Ok(())
        })
        .map_err(at(id))?;
        runner.forward(id).map_err(at(id))?;
        let (_, kept) = runner
            .saved
            .pop()
            .ok_or_else(|| at(id)(DeviceError::Inconsistent("nothing was saved".into())))?;
        let n = numel(&runner.shape(node.outputs[0]).map_err(at(id))?);
        let mut ones = dev.zeros(n).map_err(&device)?;
        dev.fill(&mut ones, 1.0).map_err(&device)?;
        // Nodes without a gradient (shape arithmetic) cost nothing backward.
        let backward_us =
            timed(&mut runner, &mut |r| r.backward(id, &kept, &ones).map(drop)).unwrap_or(0.0);
        times.push(NodeTime {
            node: id,
            forward_us,
            backward_us,
        });
    }
    Ok(times)
}
