//! Data-parallel training on devices: replicas that each train on their share of the
//! batch and combine gradients ([`Replicas`]: alone, through host memory, NCCL), the
//! training loop around a [`Runner`], and per-node profiling.

use std::collections::BTreeMap;
use std::sync::Arc;

use ralpc_ir::{Graph, GraphInfo, NodeId, Op, ValueId};

use super::backend::{Backend, R};
use super::error::DeviceError;
use super::node_ops::numel;
use super::train::{DTensor, Runner};
use crate::cpu::exec::{Checkpoint, CheckpointSink};
use crate::cpu::graph::{ExecError, Weights};
use crate::cpu::tensor::Data;
use crate::cpu::train::{Dataset, Loss, TrainOptions, TrainReport};

/// How data-parallel replicas combine what each computed on its share of the batch.
pub trait Replicas<B: Backend> {
    /// How many replicas train together.
    fn count(&self) -> usize;
    /// Sums `buf` over the replicas, in place (the same result on every one); later work
    /// on the device is ordered after it.
    fn all_reduce(&self, dev: &B, buf: &mut B::Buf) -> R<()>;
    /// Starts summing `buf` over the replicas, in place, leaving the device free to go on
    /// (a gradient bucket during backward): only [`Replicas::settle`] orders later work
    /// after it. `buf` must not be touched until then.
    fn start_all_reduce(&self, dev: &B, buf: &mut B::Buf) -> R<()> {
        self.all_reduce(dev, buf)
    }
    /// Sums a loss over the replicas.
    fn sum(&self, value: f64) -> R<f64>;
    /// Orders the device's later work after every sum started so far, and waits for them,
    /// giving up after the replicas' timeout.
    fn settle(&self) -> R<()> {
        Ok(())
    }
}

/// One replica: nothing to combine.
pub struct Alone;

impl<B: Backend> Replicas<B> for Alone {
    fn count(&self) -> usize {
        1
    }
    fn all_reduce(&self, _: &B, _: &mut B::Buf) -> R<()> {
        Ok(())
    }
    fn sum(&self, value: f64) -> R<f64> {
        Ok(value)
    }
}

/// Replicas combined through host memory by the CPU backend's communicator: ranks as
/// threads sharing one GPU (the same-device communicator), or processes over TCP. Sums
/// in rank order, so every replica steps identically.
pub struct HostStaged<'c> {
    /// This replica's endpoint.
    pub comm: &'c crate::dist::comm::Comm,
    /// Every replica's rank.
    pub group: Vec<u32>,
}

impl<B: Backend> Replicas<B> for HostStaged<'_> {
    fn count(&self) -> usize {
        self.group.len()
    }
    fn all_reduce(&self, dev: &B, buf: &mut B::Buf) -> R<()> {
        let mut host = dev.download(buf)?;
        self.comm
            .all_reduce(&self.group, &mut host)
            .map_err(|e| DeviceError::Replicas(e.to_string()))?;
        *buf = dev.upload(&host)?;
        Ok(())
    }
    fn sum(&self, value: f64) -> R<f64> {
        let bits = value.to_bits();
        let words = vec![
            f32::from_bits(bits as u32),
            f32::from_bits((bits >> 32) as u32),
        ];
        let all = self
            .comm
            .exchange(&self.group, words)
            .map_err(|e| DeviceError::Replicas(e.to_string()))?;
        Ok(all
            .iter()
            .map(|w| match w.as_slice() {
                [lo, hi] => f64::from_bits(u64::from(lo.to_bits()) | u64::from(hi.to_bits()) << 32),
                _ => 0.0,
            })
            .sum())
    }
}

/// Replica `rank` of `count`'s rows of the global batch: every input's equal share along
/// its batch axis — the axis on which its shape in `local` (the graph verified at the
/// replica's batch) is `count` times smaller; an input whose shape does not change is
/// every replica's whole — and the labels' share of their rows.
///
/// # Errors
/// A batch that does not divide among the replicas.
pub fn shard(
    data: &Dataset,
    rank: usize,
    count: usize,
    local: &GraphInfo,
) -> Result<Dataset, String> {
    use crate::cpu::tensor::Tensor;
    /// Block `rank` of `count` of the middle axis of `v` seen as `[outer, count·n, inner]`.
    fn part<T: Clone>(v: &[T], outer: usize, rank: usize, count: usize) -> Result<Vec<T>, String> {
        if outer == 0 || v.len() % (outer * count) != 0 {
            return Err(format!(
                "{} values do not divide among {count} replicas",
                v.len()
            ));
        }
        let block = v.len() / outer;
        let n = block / count;
        Ok((0..outer)
            .flat_map(|o| {
                v[o * block + rank * n..o * block + (rank + 1) * n]
                    .iter()
                    .cloned()
            })
            .collect())
    }
    let split = |d: &Data, outer: usize| -> Result<Data, String> {
        Ok(match d {
            Data::F32(v) => Data::F32(part(v, outer, rank, count)?.into()),
            Data::I64(v) => Data::I64(part(v, outer, rank, count)?.into()),
        })
    };
    let inputs = data
        .inputs
        .iter()
        .map(|(&v, t)| {
            let share = local.ty(v).shape.as_sizes().unwrap_or_default();
            if share
                .iter()
                .map(|&d| d as usize)
                .eq(t.shape.iter().copied())
            {
                return Ok((v, t.clone()));
            }
            let axis = t
                .shape
                .iter()
                .zip(&share)
                .position(|(&g, &l)| g != l as usize && g == l as usize * count)
                .filter(|_| share.len() == t.shape.len())
                .ok_or_else(|| {
                    format!(
                        "an input of shape {:?} does not divide among {count} replicas",
                        t.shape
                    )
                })?;
            let mut shape = t.shape.clone();
            shape[axis] /= count;
            let outer = t.shape[..axis].iter().product();
            Ok((
                v,
                Tensor {
                    shape,
                    data: split(&t.data, outer)?,
                },
            ))
        })
        .collect::<Result<_, String>>()?;
    Ok(Dataset {
        inputs,
        labels: split(&data.labels, 1)?,
    })
}

/// Trains `graph` (bound at the global batch) on `dev` as
/// [`train_reference`](crate::cpu::train::train_reference) does on the host: same
/// weights, data, loss and optimizer, so the two reports agree to rounding.
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
    train_replica(
        dev,
        graph,
        info,
        weights,
        data,
        options,
        &Alone,
        &ReplicaControl::default(),
    )
}

/// What a replica's training follows beyond its options: the plan's gradient buckets, a
/// state to resume, and where its checkpoints go.
#[derive(Clone, Copy, Default)]
pub struct ReplicaControl<'a> {
    /// The plan's gradient buckets in launch order
    /// ([`Executable::gradient_buckets`](crate::cpu::exec::Executable::gradient_buckets));
    /// none: every gradient is summed after backward.
    pub buckets: &'a [Vec<ValueId>],
    /// Start from this state (weights, momentum, the steps done and their losses) instead
    /// of the model's weights.
    pub resume: Option<&'a Checkpoint>,
    /// Hand the state to `on_checkpoint` after every this many steps.
    pub checkpoint_every: Option<u32>,
    /// Receives each checkpoint (writes it): every replica holds the same state, so one
    /// replica is given a sink.
    pub on_checkpoint: Option<&'a CheckpointSink<'a>>,
}

/// When a replica's gradient buckets launch during backward: a bucket is complete once
/// every node reading its weights ran backward (or had no gradient to run), and launches
/// when it is complete and every bucket before it launched, the order the plan gives them
/// (and the simulator timed), so the sums overlap the rest of the backward.
struct Launcher {
    buckets: Vec<Vec<ValueId>>,
    next: usize,
    /// Per bucketed weight, the nodes still to run backward that read it.
    readers_left: BTreeMap<ValueId, usize>,
}

impl Launcher {
    /// `buckets` over the nodes `backward` will visit.
    fn new(buckets: Vec<Vec<ValueId>>, graph: &Graph, backward: &[NodeId]) -> Launcher {
        let mut readers_left: BTreeMap<ValueId, usize> =
            buckets.iter().flatten().map(|&w| (w, 0)).collect();
        for &id in backward {
            for w in distinct_inputs(graph, id) {
                if let Some(n) = readers_left.get_mut(&w) {
                    *n += 1;
                }
            }
        }
        Launcher {
            buckets,
            next: 0,
            readers_left,
        }
    }

    /// Node `id` ran backward: the weights of the buckets that may launch now, in order.
    fn ran(&mut self, graph: &Graph, id: NodeId) -> Vec<ValueId> {
        for w in distinct_inputs(graph, id) {
            if let Some(n) = self.readers_left.get_mut(&w) {
                *n = n.saturating_sub(1);
            }
        }
        let mut ready = Vec::new();
        while let Some(bucket) = self.buckets.get(self.next) {
            if bucket.iter().any(|w| self.readers_left[w] > 0) {
                break;
            }
            ready.extend_from_slice(bucket);
            self.next += 1;
        }
        ready
    }
}

fn distinct_inputs(graph: &Graph, id: NodeId) -> Vec<ValueId> {
    let mut inputs: Vec<ValueId> = graph.node(id).inputs.iter().flatten().copied().collect();
    inputs.sort_unstable();
    inputs.dedup();
    inputs
}

/// Trains one data-parallel replica: `graph` is bound at this replica's share of the
/// batch and `data` is its share ([`shard`]); the loss is normalized by the global batch,
/// gradients are summed over `replicas` before every update, and the reported losses are
/// the whole batch's. The first output in the report is this replica's rows.
///
/// The sums launch during backward, bucket by bucket in the order of `control.buckets`,
/// each as soon as its weights' gradients are complete; weights in no bucket
/// are summed after backward, in the weights' order. A resumed run continues from the
/// checkpoint's step, bit for bit as the run that wrote it would have.
///
/// # Errors
/// As [`train`], and a failed combination with the other replicas.
pub fn train_replica<B: Backend>(
    dev: &B,
    graph: &Graph,
    info: &GraphInfo,
    weights: &Weights,
    data: &Dataset,
    options: &TrainOptions,
    replicas: &dyn Replicas<B>,
    control: &ReplicaControl<'_>,
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
    let resumed = |v: ValueId, of: fn(&Checkpoint) -> &BTreeMap<String, Vec<f32>>| {
        let c = control.resume?;
        of(c).get(&graph.value(v).name)
    };
    let mut params: BTreeMap<ValueId, Arc<B::Buf>> = BTreeMap::new();
    for (&v, t) in &weights.tensors {
        if let Some(f) = t.floats() {
            let f = resumed(v, |c| &c.weights).map_or(f, Vec::as_slice);
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
    for &w in &weights.trainable {
        if let Some(v) = resumed(w, |c| &c.velocity) {
            velocity.insert(w, dev.upload(v).map_err(&device)?);
        }
    }
    let mut report = TrainReport {
        losses: control.resume.map(|c| c.losses.clone()).unwrap_or_default(),
        ..TrainReport::default()
    };
    let shape_of = |v: ValueId| -> Vec<usize> {
        info.ty(v)
            .shape
            .as_sizes()
            .unwrap_or_default()
            .iter()
            .map(|&d| d as usize)
            .collect()
    };
    // The plan's buckets, of the weights this replica trains, each weight in its first.
    let mut bucketed: Vec<Vec<ValueId>> = Vec::with_capacity(control.buckets.len());
    let mut seen = std::collections::BTreeSet::new();
    for bucket in control.buckets {
        let bucket: Vec<ValueId> = bucket
            .iter()
            .copied()
            .filter(|&w| params.contains_key(&w) && weights.trainable.contains(&w))
            .filter(|&w| seen.insert(w))
            .collect();
        if !bucket.is_empty() {
            bucketed.push(bucket);
        }
    }
    let sum_replicas = |v: &mut [f64]| super::batch_stats::sum_replicas(dev, replicas, v);
    let mut last_loss = std::time::Instant::now();
    let first = control.resume.map_or(0, |c| c.step);
    for step in first..options.steps {
        let mut runner = Runner::new(dev, graph, Some(info), weights);
        if replicas.count() > 1 {
            runner.batch_stats = Some(&sum_replicas);
        }
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
        let (l, dy) =
            loss(dev, options.loss, &y, &data.labels, replicas.count()).map_err(&device)?;
        report.losses.push(replicas.sum(l).map_err(&device)?);
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
        let order: Vec<NodeId> = saved.iter().rev().map(|(id, _)| *id).collect();
        let mut launcher = Launcher::new(bucketed.clone(), graph, &order);
        let mut summed: BTreeMap<ValueId, B::Buf> = BTreeMap::new();
        // The gradient of `w`, complete, summed over the replicas (zeros where no node
        // gave it one).
        let sum = |w: ValueId,
                   grads: &mut BTreeMap<ValueId, B::Buf>,
                   summed: &mut BTreeMap<ValueId, B::Buf>|
         -> R<()> {
            let Some(param) = params.get(&w) else {
                return Ok(());
            };
            let mut g = match grads.remove(&w) {
                Some(g) => g,
                None => dev.zeros(dev.len(param))?,
            };
            replicas.start_all_reduce(dev, &mut g)?;
            summed.insert(w, g);
            Ok(())
        };
        for (id, kept) in saved.iter().rev() {
            let node = graph.node(*id);
            if let Some(dy) = node.outputs.first().and_then(|v| grads.remove(v)) {
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
            for w in launcher.ran(graph, *id) {
                sum(w, &mut grads, &mut summed).map_err(&device)?;
            }
        }
        drop(saved);
        drop(runner);
        for &w in &weights.trainable {
            if !summed.contains_key(&w) {
                sum(w, &mut grads, &mut summed).map_err(&device)?;
            } else if grads.contains_key(&w) {
                return Err(device(DeviceError::Inconsistent(format!(
                    "the gradient of '{}' grew after its bucket was summed",
                    graph.value(w).name
                ))));
            }
        }
        // The update reads every sum.
        replicas.settle().map_err(&device)?;
        for &w in &weights.trainable {
            let Some(param) = params.get_mut(&w) else {
                continue;
            };
            let n = dev.len(param);
            let Some(g) = summed.remove(&w) else {
                continue;
            };
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
        let done = step + 1;
        if let (Some(every), Some(sink)) = (control.checkpoint_every, control.on_checkpoint) {
            if every > 0 && done % every == 0 {
                let mut checkpoint = Checkpoint {
                    step: done,
                    losses: report.losses.clone(),
                    ..Checkpoint::default()
                };
                for &w in &weights.trainable {
                    let name = &graph.value(w).name;
                    if let Some(p) = params.get(&w) {
                        let p = dev.download(p).map_err(&device)?;
                        checkpoint.weights.insert(name.clone(), p);
                    }
                    if let Some(v) = velocity.get(&w) {
                        let v = dev.download(v).map_err(&device)?;
                        checkpoint.velocity.insert(name.clone(), v);
                    }
                }
                sink(&checkpoint).map_err(|message| ExecError::Checkpoint {
                    step: done,
                    message,
                })?;
            }
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

/// The loss of this replica's output, normalized by the global batch (`replicas` equal
/// shares), and its gradient.
fn loss<B: Backend>(
    dev: &B,
    kind: Loss,
    y: &DTensor<B>,
    labels: &Data,
    replicas: usize,
) -> R<(f64, B::Buf)> {
    let total = numel(&y.shape);
    let mut dy = dev.zeros(total)?;
    let per = match (kind, labels) {
        (Loss::CrossEntropy, Data::I64(classes_of)) => {
            let classes = crate::cpu::train::classes(&y.shape);
            let rows = total / classes;
            let labels = dev.upload_indices(classes_of.get(..rows).ok_or("too few labels")?)?;
            let mut per = dev.zeros(rows)?;
            dev.cross_entropy(
                &mut per,
                &mut dy,
                &y.buf,
                &labels,
                rows,
                classes,
                rows * replicas,
            )?;
            per
        }
        (Loss::Mse, Data::F32(targets)) => {
            let t = dev.upload(targets.get(..total).ok_or("too few targets")?)?;
            let mut per = dev.zeros(total)?;
            dev.mse(&mut per, &mut dy, &y.buf, &t, total * replicas)?;
            per
        }
        _ => return Err("the labels do not fit the loss".into()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A bucket launches as soon as backward ran every node reading its weights, and never
    /// ahead of the buckets before it.
    #[test]
    fn buckets_launch_as_backward_completes_them_in_order() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/train/mlp.onnx");
        let mut graph = ralpc_ir::onnx::import(&path).expect("import").graph;
        let bindings = ralpc_ir::Bindings {
            batch: Some(2),
            inputs: Default::default(),
        };
        ralpc_ir::bind(&mut graph, &bindings).expect("bind");
        let info = ralpc_ir::verify(&graph).expect("verify");
        let trained = Weights::load(&graph, 0).expect("weights").trainable;
        let backward: Vec<NodeId> = info.order().iter().rev().copied().collect();
        let reads = |n: NodeId| -> Vec<ValueId> {
            distinct_inputs(&graph, n)
                .into_iter()
                .filter(|w| trained.contains(w))
                .collect()
        };
        let with_weights: Vec<usize> = (0..backward.len())
            .filter(|&i| !reads(backward[i]).is_empty())
            .collect();
        assert!(with_weights.len() >= 2, "an MLP of several layers");
        let (late, early) = (with_weights[0], with_weights[with_weights.len() - 1]);
        let (last_layer, first_layer) = (reads(backward[late]), reads(backward[early]));
        // When each weight launches, by the backward step that launched it.
        let launches = |buckets: Vec<Vec<ValueId>>| {
            let mut launcher = Launcher::new(buckets, &graph, &backward);
            let mut at = BTreeMap::new();
            for (i, &id) in backward.iter().enumerate() {
                for w in launcher.ran(&graph, id) {
                    assert!(at.insert(w, i).is_none(), "launched twice");
                }
            }
            at
        };
        let in_order = launches(vec![last_layer.clone(), first_layer.clone()]);
        for w in &last_layer {
            assert_eq!(
                in_order[w], late,
                "the last layer's bucket, as soon as it is done"
            );
        }
        for w in &first_layer {
            assert_eq!(in_order[w], early);
        }
        let reversed = launches(vec![first_layer.clone(), last_layer.clone()]);
        for w in first_layer.iter().chain(&last_layer) {
            assert_eq!(reversed[w], early, "behind the bucket ahead of it");
        }
    }
}
