//! Running an IR graph, or any set of its nodes, forward and backward on host tensors:
//! the single-device reference and the body of every rank's forward and backward
//! instructions.

use std::collections::BTreeMap;

use ralpc_ir::{Graph, NodeId, Op, Site, Storage, TensorData, TensorReadError, ValueId};

use super::floats::Floats;
use super::grad;
use super::init;
use super::ops::{self, inconsistent, operands, Env, OpError, Saved};
use super::tensor::Tensor;

/// Why a graph could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// A node failed.
    #[error("{site}: {message}")]
    Node {
        /// The node.
        site: Site,
        /// What went wrong.
        message: String,
    },
    /// What the executor handed a node disagrees with what it needs: a bug in ralpc.
    #[error("{site}: {message}")]
    Inconsistent {
        /// The node.
        site: Site,
        /// What disagreed.
        message: String,
    },
    /// A device failed running a node (or, with no node, around them: uploads, the
    /// loss, the update).
    #[error("{}", match .site { Some(site) => format!("{site}: on the device"), None => "on the device".to_owned() })]
    Device {
        /// The node.
        site: Option<Site>,
        /// Why.
        #[source]
        source: crate::cuda::error::DeviceError,
    },
    /// A weight's bytes could not be read.
    #[error("cannot read the weight '{name}'")]
    Weight {
        /// The initializer.
        name: String,
        /// Why.
        #[source]
        source: TensorReadError,
    },
    /// A graph input is missing or malformed.
    #[error("input '{name}': {message}")]
    Input {
        /// The input.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// The constants of a model: its weights (initializers, and the float tensors a
/// `ConstantOfShape` of a constant shape generates, as the ONNX zoo's "light" models write
/// their weights: they start at its fill value) and `Constant` payloads.
#[derive(Clone, Debug, Default)]
pub struct Weights {
    /// Every constant, by the value it produces.
    pub tensors: BTreeMap<ValueId, Tensor>,
    /// The trainable weights ([`ralpc_ir::Op::is_weight`] and generated weights), in graph
    /// order.
    pub trainable: Vec<ValueId>,
    /// How many initializers had no data and were initialized from the seed.
    pub seeded: usize,
}

/// A constant's elements, `None` when its bytes are absent (a structure-only model).
fn decode(data: &TensorData) -> Result<Option<Tensor>, TensorReadError> {
    let shape: Vec<usize> = data.dims.iter().map(|&d| d as usize).collect();
    let bytes = match (&data.storage, data.bytes()) {
        (_, Ok(b)) => b,
        (Storage::External(_), Err(TensorReadError::Io { .. })) => return Ok(None),
        (_, Err(e)) => return Err(e),
    };
    let expected = data.size_bytes().unwrap_or(u64::MAX);
    if bytes.len() as u64 != expected {
        return Ok(None);
    }
    let values = data.to_f64s()?;
    Ok(Some(if data.dtype.is_float() {
        Tensor::f32(shape, values.iter().map(|&v| v as f32).collect())
    } else {
        Tensor::i64(shape, values.iter().map(|&v| v as i64).collect())
    }))
}

impl Weights {
    /// Reads every constant of `graph`; initializers without data get seeded values
    /// ([`init::rule`]).
    ///
    /// # Errors
    /// When a constant's data is present but unreadable, or a non-float one is missing.
    pub fn load(graph: &Graph, seed: u64) -> Result<Weights, ExecError> {
        let mut w = Weights::default();
        for id in graph.node_ids() {
            let node = graph.node(id);
            if let Some((value, dims, fill)) = generated_weight(graph, id) {
                // It starts as the model says (onnxruntime computes the same) and trains.
                let n = dims.iter().product::<u64>() as usize;
                w.trainable.push(value);
                w.tensors.insert(
                    value,
                    Tensor::f32(dims.iter().map(|&d| d as usize).collect(), vec![fill; n]),
                );
                continue;
            }
            let Op::Constant { tensor, .. } = &node.op else {
                continue;
            };
            let Some(&value) = node.outputs.first() else {
                continue;
            };
            let name = graph.value(value).name.clone();
            let weight = |source| ExecError::Weight {
                name: name.clone(),
                source,
            };
            let t = match decode(tensor).map_err(weight)? {
                Some(t) => t,
                None if tensor.dtype.is_float() => {
                    w.seeded += 1;
                    let rule = init::rule(graph, value, &tensor.dims);
                    let n = tensor.numel().unwrap_or(0) as usize;
                    Tensor::seeded(
                        tensor.dims.iter().map(|&d| d as usize).collect(),
                        // Seeded by the initializer it came from: a parameter the exporter
                        // merged with another starts equal to it, as in the model.
                        init::Seeded::new(seed, &graph.provenance(id).name, n, rule),
                    )
                }
                None => match gathered_rows(graph, value) {
                    // Indices without data (a structure-only export's position ids): valid
                    // for every table they index, counting up as an `arange` would.
                    Some(rows) if !tensor.dtype.is_float() => {
                        w.seeded += 1;
                        let n = tensor.numel().unwrap_or(0);
                        Tensor::i64(
                            tensor.dims.iter().map(|&d| d as usize).collect(),
                            (0..n).map(|i| (i % rows) as i64).collect(),
                        )
                    }
                    _ => {
                        return Err(weight(TensorReadError::NotNumeric {
                            dtype: tensor.dtype,
                        }))
                    }
                },
            };
            if node.op.is_weight() {
                w.trainable.push(value);
            }
            w.tensors.insert(value, t);
        }
        Ok(w)
    }
}

/// When `value` is read only as the indices of `Gather`s of constant tables: the fewest
/// rows any of them has along its gathered axis.
fn gathered_rows(graph: &Graph, value: ValueId) -> Option<u64> {
    let consumers = graph.consumers(value);
    if consumers.is_empty() {
        return None;
    }
    consumers
        .into_iter()
        .map(|(node, slot)| {
            let n = graph.node(node);
            let Op::Gather { axis } = n.op else {
                return None;
            };
            let table = n.inputs.first().copied().flatten()?;
            let Op::Constant { tensor, .. } = &graph.node(graph.value(table).producer).op else {
                return None;
            };
            let rank = tensor.dims.len() as i64;
            let axis = usize::try_from(if axis < 0 { axis + rank } else { axis }).ok()?;
            let rows = *tensor.dims.get(axis)?;
            (slot == 1 && rows > 0).then_some(rows)
        })
        .min_by_key(|r| r.unwrap_or(0))
        .flatten()
}

/// The weight a float `ConstantOfShape` of an initializer's shape generates (value, dims
/// and fill); ralpc counts it as a parameter, so it is trained like one.
pub fn generated_weight(graph: &Graph, node: NodeId) -> Option<(ValueId, Vec<u64>, f32)> {
    let n = graph.node(node);
    let Op::ConstantOfShape { value, .. } = &n.op else {
        return None;
    };
    let out = *n.outputs.first()?;
    if !ralpc_ir::is_parameter(graph, out) {
        return None;
    }
    let shape = n.inputs.first().copied().flatten()?;
    let Op::Constant { tensor, .. } = &graph.node(graph.value(shape).producer).op else {
        return None;
    };
    let dims: Vec<u64> = tensor
        .to_f64s()
        .ok()?
        .iter()
        .map(|&d| (d >= 0.0).then_some(d as u64))
        .collect::<Option<_>>()?;
    Some((out, dims, *value as f32))
}

/// Values computed so far, by [`ValueId`].
#[derive(Clone, Debug, Default)]
pub struct Values(Vec<Option<Tensor>>);

impl Values {
    /// Room for every value of `graph`.
    pub fn new(graph: &Graph) -> Values {
        Values(vec![None; graph.value_count()])
    }

    /// Sets a value.
    pub fn set(&mut self, v: ValueId, t: Tensor) {
        self.0[v.index()] = Some(t);
    }

    /// The values `node` reads, by slot (`None` for an absent optional input or one not
    /// computed).
    pub fn inputs_of(&self, node: &ralpc_ir::Node) -> Vec<Option<&Tensor>> {
        node.inputs
            .iter()
            .map(|v| v.and_then(|v| self.get(v)))
            .collect()
    }

    /// A value, if computed.
    pub fn get(&self, v: ValueId) -> Option<&Tensor> {
        self.0.get(v.index()).and_then(Option::as_ref)
    }

    /// Removes a value.
    pub fn take(&mut self, v: ValueId) -> Option<Tensor> {
        self.0.get_mut(v.index()).and_then(Option::take)
    }

    /// After a forward pass that left `records`: releases the elements of every float
    /// value whose backward pass never reads them ([`ralpc_ir::Op::backward_reads`]),
    /// keeping its shape, except those in `keep` (read after the forward pass: a layer's
    /// outputs). What a training step holds until the backward pass is then what the
    /// planner's activation stash counts.
    pub fn release_unread(&mut self, graph: &Graph, records: &[Record], keep: &[ValueId]) {
        let mut read = vec![false; self.0.len()];
        let mut mark = |v: ValueId| {
            if let Some(r) = read.get_mut(v.index()) {
                *r = true;
            }
        };
        for record in records {
            graph
                .node(record.node)
                .read_by_backward()
                .for_each(&mut mark);
        }
        keep.iter().copied().for_each(&mut mark);
        for (slot, read) in self.0.iter_mut().zip(read) {
            if let (Some(t), false) = (slot.as_mut(), read) {
                if t.is_float() {
                    *t = t.released();
                }
            }
        }
    }
}

/// What one node's forward pass left for its backward pass.
#[derive(Clone, Debug)]
pub struct Record {
    /// The node.
    pub node: NodeId,
    /// What it saved.
    pub saved: Saved,
}

fn node_error(graph: &Graph, node: NodeId) -> impl Fn(OpError) -> ExecError + '_ {
    move |e| match e {
        OpError::Inconsistent(message) => ExecError::Inconsistent {
            site: graph.site(node),
            message,
        },
        e => ExecError::Node {
            site: graph.site(node),
            message: e.to_string(),
        },
    }
}

/// Runs `nodes` (in a topological order) forward; their inputs must be in `values`
/// already (graph inputs and constants are never computed here).
///
/// # Errors
/// When an input is missing or an op fails.
pub fn forward(
    graph: &Graph,
    nodes: &[NodeId],
    values: &mut Values,
    env: Env,
) -> Result<Vec<Record>, ExecError> {
    let mut records = Vec::with_capacity(nodes.len());
    let listed: std::collections::BTreeSet<NodeId> = nodes.iter().copied().collect();
    // ReLUs already applied in place of their input ([`relu_reading`]).
    let mut applied: Vec<NodeId> = Vec::new();
    for &id in nodes {
        let node = graph.node(id);
        if matches!(node.op, Op::Input | Op::Constant { .. }) {
            continue;
        }
        if applied.contains(&id) {
            records.push(Record {
                node: id,
                saved: Saved::None,
            });
            continue;
        }
        // A generated weight comes from the weights, like an initializer.
        if matches!(node.op, Op::ConstantOfShape { .. })
            && node.outputs.iter().all(|&v| values.get(v).is_some())
        {
            continue;
        }
        let error = node_error(graph, id);
        let inputs: Vec<Option<&Tensor>> = node
            .inputs
            .iter()
            .map(|v| {
                v.map(|v| {
                    values.get(v).ok_or_else(|| {
                        error(operands(format!(
                            "input '{}' was not computed",
                            graph.value(v).name
                        )))
                    })
                })
                .transpose()
            })
            .collect::<Result<_, _>>()?;
        let (outputs, saved) =
            ops::forward(&node.op, &inputs, node.outputs.len(), env).map_err(&error)?;
        for (&v, mut t) in node.outputs.iter().zip(outputs) {
            if let Some(relu) = relu_reading(graph, id, v, &listed) {
                if let Some(x) = t.floats_mut() {
                    super::kernels::relu_in_place(x);
                    let y = graph.node(relu).outputs[0];
                    values.set(y, t.clone());
                    applied.push(relu);
                }
            }
            values.set(v, t);
        }
        records.push(Record { node: id, saved });
    }
    Ok(records)
}

/// The ReLU among `listed` that is the only reader of `v`, which `producer` writes and is
/// no output of the graph: it is applied to `v`'s elements in place, and `v` and the
/// ReLU's output share them (ResNet's Conv → ReLU and Add → ReLU: an allocation and a pass
/// over memory saved). Forward and backward are unchanged: nothing else reads `v`, the
/// ReLU's gradient (`x > 0`) is the same read from `max(x, 0)`, and `producer` is linear
/// in its inputs, so its own gradient never reads `v`.
fn relu_reading(
    graph: &Graph,
    producer: NodeId,
    v: ValueId,
    listed: &std::collections::BTreeSet<NodeId>,
) -> Option<NodeId> {
    use ralpc_ir::Binary;
    let linear = matches!(
        graph.node(producer).op,
        Op::Conv(_)
            | Op::ConvTranspose(_)
            | Op::Gemm(_)
            | Op::MatMul
            | Op::Binary(Binary::Add | Binary::Sub)
    );
    let [(reader, 0)] = graph.consumers(v)[..] else {
        return None;
    };
    let node = graph.node(reader);
    (linear
        && matches!(node.op, Op::Unary(ralpc_ir::Unary::Relu))
        && node.outputs.len() == 1
        && listed.contains(&reader)
        && !graph.outputs().contains(&v))
    .then_some(reader)
}

/// Gradients by [`ValueId`], accumulated over consumers: on the host, or resident on the
/// device that computed them ([`Floats`]) until the host reads them.
#[derive(Clone, Debug, Default)]
pub struct Grads(BTreeMap<ValueId, Floats>);

impl Grads {
    /// Adds `g` to the gradient of `v`.
    pub fn add(&mut self, v: ValueId, g: &[f32]) {
        match self.0.get_mut(&v) {
            Some(acc) => super::kernels::add(acc.make_mut(), g),
            None => {
                self.0.insert(v, g.to_vec().into());
            }
        }
    }

    /// The gradient of `v`, if any reached it.
    pub fn get(&self, v: ValueId) -> Option<&[f32]> {
        self.0.get(&v).map(|g| &g[..])
    }

    /// Removes and returns the gradient of `v`.
    pub fn take(&mut self, v: ValueId) -> Option<Vec<f32>> {
        self.0.remove(&v).map(Floats::into_vec)
    }

    /// The gradient of `v` where it is, if any reached it.
    pub fn floats(&self, v: ValueId) -> Option<&Floats> {
        self.0.get(&v)
    }

    /// Removes and returns the gradient of `v` where it is.
    pub fn take_floats(&mut self, v: ValueId) -> Option<Floats> {
        self.0.remove(&v)
    }

    /// Adds `g` to the gradient of `v`, taking it where it is when it is the first.
    pub fn accumulate(&mut self, v: ValueId, g: Floats) {
        match self.0.get_mut(&v) {
            Some(acc) => super::kernels::add(acc.make_mut(), &g),
            None => {
                self.0.insert(v, g);
            }
        }
    }

    /// Sets the gradient of `v` (a sum a device made of it and its earlier value).
    pub fn set(&mut self, v: ValueId, g: Floats) {
        self.0.insert(v, g);
    }
}

/// Runs the backward pass of `records` (a forward pass's, replayed in reverse) from the
/// output gradients in `grads`, adding every input's gradient to `grads`.
///
/// # Errors
/// When an op has no backward pass or its operands are inconsistent.
pub fn backward(
    graph: &Graph,
    records: &[Record],
    values: &Values,
    grads: &mut Grads,
) -> Result<(), ExecError> {
    for record in records.iter().rev() {
        let node = graph.node(record.node);
        // A view's input gradient is its output's elements under another shape: handed
        // on where they are (shared on the host, or resident on a device), never copied.
        if let (true, Some(&y), Some(Some(x))) =
            (node.op.is_view(), node.outputs.first(), node.inputs.first())
        {
            if let Some(dy) = grads.floats(y).cloned() {
                grads.accumulate(*x, dy);
                continue;
            }
        }
        let dys: Vec<Option<&[f32]>> = node.outputs.iter().map(|&v| grads.get(v)).collect();
        if dys.iter().all(Option::is_none) {
            continue;
        }
        let error = node_error(graph, record.node);
        let inputs = values.inputs_of(node);
        let outputs: Vec<&Tensor> = node
            .outputs
            .iter()
            .map(|&v| {
                values
                    .get(v)
                    .ok_or_else(|| error(inconsistent("an output was not kept")))
            })
            .collect::<Result<_, _>>()?;
        let input_grads =
            grad::backward(&node.op, &inputs, &outputs, &record.saved, &dys).map_err(&error)?;
        for (slot, g) in input_grads.into_iter().enumerate() {
            if let (Some(g), Some(Some(v))) = (g, node.inputs.get(slot)) {
                grads.add(*v, &g);
            }
        }
    }
    Ok(())
}

/// Adds a vector up over the ranks sharing a batch normalization's channels, in place (the
/// same sum on every one of them).
pub type GroupSum<'a> = &'a dyn Fn(&mut [f64]) -> Result<(), ExchangeFailed>;

/// A [`GroupSum`]'s collective failed: the other ranks' or the network's fault, never the
/// model's. The caller that made the sum keeps the typed error; this is its text, for the
/// op that was waiting on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExchangeFailed(pub String);

/// Runs batch normalization `id` forward in training mode on the host, normalizing by the
/// statistics `sum` adds up over the ranks holding its channels: its outputs set in
/// `values`, its record returned.
///
/// # Errors
/// Its operands are inconsistent, or `sum` failed.
pub fn batch_norm_synced(
    graph: &Graph,
    id: NodeId,
    values: &mut Values,
    sum: GroupSum<'_>,
) -> Result<Record, ExecError> {
    let node = graph.node(id);
    let error = node_error(graph, id);
    let Op::BatchNorm { epsilon, .. } = node.op else {
        return Err(error(inconsistent("not a batch normalization")));
    };
    let inputs = values.inputs_of(node);
    let (outputs, saved) = ops::batch_norm_synced(
        epsilon,
        &inputs,
        node.outputs.len(),
        ops::Mode::Training,
        &mut |s| sum(s).map_err(|ExchangeFailed(e)| OpError::Exchange(e)),
    )
    .map_err(&error)?;
    for (&v, t) in node.outputs.iter().zip(outputs) {
        values.set(v, t);
    }
    Ok(Record { node: id, saved })
}

/// Runs `record`'s batch normalization backward on the host, its batch terms summed by
/// `sum` as [`batch_norm_synced`]'s statistics were, adding its inputs' gradients to
/// `grads`. Without its output's gradient it does nothing (and sums nothing: every rank of
/// the group has the same layer, so none sums).
///
/// # Errors
/// As [`batch_norm_synced`].
pub fn batch_norm_synced_backward(
    graph: &Graph,
    record: &Record,
    values: &Values,
    grads: &mut Grads,
    sum: GroupSum<'_>,
) -> Result<(), ExecError> {
    let node = graph.node(record.node);
    let error = node_error(graph, record.node);
    let Op::BatchNorm { epsilon, .. } = node.op else {
        return Err(error(inconsistent("not a batch normalization")));
    };
    let Some(dy) = node.outputs.first().and_then(|&y| grads.get(y)) else {
        return Ok(());
    };
    let dy = dy.to_vec();
    let inputs = values.inputs_of(node);
    let input_grads = super::normalize::batch_norm_synced_backward(
        epsilon,
        &inputs,
        &record.saved,
        &dy,
        &mut |s| sum(s).map_err(|ExchangeFailed(e)| OpError::Exchange(e)),
    )
    .map_err(&error)?;
    for (slot, g) in input_grads.into_iter().enumerate() {
        if let (Some(g), Some(Some(v))) = (g, node.inputs.get(slot)) {
            grads.add(*v, &g);
        }
    }
    Ok(())
}
