//! A device computing a plan's layers for the CPU backend's plan executor
//! ([`crate::cpu::exec`]): every rank runs the same interpreter — shares, messages,
//! collectives, schedules — and hands each node's arithmetic to the device, staging its
//! operands and results through host memory. Any plan the CPU backend runs (burst, SOAP,
//! pipelines) thereby runs on GPUs, ranks sharing one GPU included; the price is a copy to
//! and from the device per node, so this is the path that checks plans, not the fast one
//! (data-parallel plans keep everything on the device, [`super::train::train_replica`]).
//! Shape and integer arithmetic, and operators the device lacks, stay on the CPU.

use std::rc::Rc;

use ralpc_ir::{Graph, NodeId, Op, ReduceKind, Variadic};

use super::backend::{Backend, R};
use super::error::DeviceError;
use super::train::{DTensor, Runner, Saved};
use crate::cpu::exec::Compute;
use crate::cpu::graph::{self, ExecError, Grads, Record, Values, Weights};
use crate::cpu::ops::{self, Env, Mode};
use crate::cpu::tensor::{Data, Tensor};

/// A device behind the plan executor.
pub struct Hosted<B: Backend> {
    dev: B,
}

impl<B: Backend> Hosted<B> {
    /// Computes on `dev`.
    pub fn new(dev: B) -> Hosted<B> {
        Hosted { dev }
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
                let buf = self.dev.upload(f)?;
                runner.values.insert(
                    v,
                    DTensor {
                        buf: Rc::new(buf),
                        shape: shape.clone(),
                    },
                );
            }
        }
        Ok(runner)
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

impl<B: Backend> Compute for Hosted<B> {
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
            let error = |source: DeviceError| ExecError::Device {
                site: Some(graph.site(id)),
                source,
            };
            let host = constants(graph, id, values);
            let mut runner = self
                .runner(graph, id, values, env, &host, false)
                .map_err(error)?;
            runner.forward(id).map_err(error)?;
            for &o in &node.outputs {
                if let Some(t) = runner.values.get(&o) {
                    let data = self.dev.download(&t.buf).map_err(error)?;
                    values.set(o, Tensor::f32(t.shape.clone(), data));
                }
            }
            let saved = match runner.saved.pop().map(|(_, s)| s) {
                Some(Saved::Argmax(idx)) => ops::Saved::Argmax(
                    self.dev
                        .download_indices(&idx)
                        .map_err(error)?
                        .iter()
                        .map(|&i| i as u32)
                        .collect(),
                ),
                Some(Saved::Stats(mean, rstd) | Saved::Normalized(_, mean, rstd)) => {
                    ops::Saved::Stats(
                        self.dev.download(&mean).map_err(error)?,
                        self.dev.download(&rstd).map_err(error)?,
                    )
                }
                Some(Saved::None) | None => ops::Saved::None,
            };
            records.push(Record { node: id, saved });
        }
        Ok(records)
    }

    fn backward(
        &self,
        graph: &Graph,
        records: &[Record],
        values: &Values,
        grads: &mut Grads,
    ) -> Result<(), ExecError> {
        let env = Env {
            mode: Mode::Training,
            exported_batch: graph.rebatch().map(|r| r.exported),
        };
        for record in records.iter().rev() {
            let id = record.node;
            let node = graph.node(id);
            if !self.on_device(graph, id, values, env) {
                graph::backward(graph, std::slice::from_ref(record), values, grads)?;
                continue;
            }
            let Some(&out) = node.outputs.first() else {
                continue;
            };
            let Some(dy) = grads.get(out).map(<[f32]>::to_vec) else {
                continue;
            };
            let error = |source: DeviceError| ExecError::Device {
                site: Some(graph.site(id)),
                source,
            };
            let host = constants(graph, id, values);
            let runner = self
                .runner(graph, id, values, env, &host, true)
                .map_err(error)?;
            let dev = &self.dev;
            let saved = match (&node.op, &record.saved) {
                (_, ops::Saved::Argmax(a)) => Saved::Argmax(
                    dev.upload_indices(&a.iter().map(|&i| i64::from(i)).collect::<Vec<_>>())
                        .map_err(error)?,
                ),
                (Op::LayerNorm { axis, epsilon }, _) => {
                    // The normalized input, recomputed (the host keeps only statistics).
                    let x = runner
                        .values
                        .get(&node.inputs[0].ok_or_else(|| {
                            error(DeviceError::Inconsistent(
                                "a layer norm without its input".into(),
                            ))
                        })?)
                        .ok_or_else(|| {
                            error(DeviceError::Inconsistent(
                                "the input is not on the device".into(),
                            ))
                        })?;
                    let rank = x.shape.len() as i64;
                    let a = if *axis < 0 { axis + rank } else { *axis } as usize;
                    let rows: usize = x.shape[..a].iter().product();
                    let n: usize = x.shape[a..].iter().product();
                    let (mut xhat, mut mean, mut rstd) = (
                        dev.zeros(rows * n).map_err(error)?,
                        dev.zeros(rows).map_err(error)?,
                        dev.zeros(rows).map_err(error)?,
                    );
                    dev.layer_norm(
                        &mut xhat, &mut mean, &mut rstd, &x.buf, None, rows, n, *epsilon,
                    )
                    .map_err(error)?;
                    Saved::Normalized(xhat, mean, rstd)
                }
                (_, ops::Saved::Stats(mean, rstd)) => Saved::Stats(
                    dev.upload(mean).map_err(error)?,
                    dev.upload(rstd).map_err(error)?,
                ),
                (_, ops::Saved::None) => Saved::None,
            };
            let dy = dev.upload(&dy).map_err(error)?;
            for (slot, g) in runner.backward(id, &saved, &dy).map_err(error)? {
                if let Some(Some(v)) = node.inputs.get(slot) {
                    grads.add(*v, &dev.download(&g).map_err(error)?);
                }
            }
        }
        Ok(())
    }
}
