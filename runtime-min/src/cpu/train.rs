//! Training on the CPU: the loss and synthetic data every executor shares, and the
//! single-device reference that partitioned plans are held to.
//!
//! An ONNX graph is an inference graph; training adds a loss on its first output and SGD
//! with momentum (PyTorch's form) on every floating-point initializer. Inputs and labels
//! are seeded ([`init`]), fixed across steps, and defined for the whole global batch so
//! that any partitioning reads the same samples.

use std::collections::BTreeMap;

use ralpc_ir::{Graph, GraphInfo, ValueId};

use super::graph::{self, ExecError, Grads, Values, Weights};
use super::init;
use super::kernels;
use super::ops::{Env, Mode};
use super::tensor::{Data, Tensor};

/// The training objective added on the model's first output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Loss {
    /// Softmax cross-entropy over the last axis against seeded class labels, averaged over
    /// the global batch's rows.
    #[default]
    CrossEntropy,
    /// Mean squared error against seeded targets in `[-1, 1)`, averaged over elements.
    Mse,
}

impl Loss {
    /// Parses `cross-entropy` or `mse`.
    pub fn parse(name: &str) -> Option<Loss> {
        match name {
            "cross-entropy" | "ce" => Some(Loss::CrossEntropy),
            "mse" => Some(Loss::Mse),
            _ => None,
        }
    }
}

/// Options of a training run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainOptions {
    /// Optimizer steps.
    pub steps: u32,
    /// Seeds weights (when the model has none), inputs and labels.
    pub seed: u64,
    /// Learning rate.
    pub lr: f32,
    /// SGD momentum.
    pub momentum: f32,
    /// The objective.
    pub loss: Loss,
    /// Whether the plan interpreter's report carries the first output, the first-step
    /// gradients and the last weights: host copies of the whole model, which tests compare
    /// with one device's; a run that reports only its losses leaves them out (and a
    /// device never reads them back).
    pub report_tensors: bool,
}

impl Default for TrainOptions {
    fn default() -> TrainOptions {
        TrainOptions {
            steps: 1,
            seed: 0,
            lr: 0.01,
            momentum: 0.9,
            loss: Loss::CrossEntropy,
            report_tensors: true,
        }
    }
}

/// What a training run reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainReport {
    /// The loss before each step.
    pub losses: Vec<f64>,
    /// The model's first output in the first step (the whole global batch).
    pub first_output: Vec<f32>,
    /// Every trainable weight's gradient in the first step, by name.
    pub first_gradients: BTreeMap<String, Vec<f32>>,
    /// Every trainable weight after the last step, by name.
    pub weights: BTreeMap<String, Vec<f32>>,
    /// Wall-clock seconds of each step where the executor times them (the plan
    /// interpreter, on its slowest rank, from the end of the step before; the CUDA
    /// backend's one-device loop, from one loss to the next). A device runs ahead of the
    /// host, but each step waits for its loss, so a step after the first is the
    /// steady-state step time, with set-up and the first uploads left out.
    pub step_seconds: Vec<f64>,
}

/// The global batch's inputs and labels.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Each graph input for the whole batch.
    pub inputs: BTreeMap<ValueId, Tensor>,
    /// Per output row (cross-entropy), its class; or per output element (MSE), its target.
    pub labels: Data,
}

impl Dataset {
    /// Seeded inputs for a graph bound at its global batch, and labels for an output of
    /// `output_shape`.
    pub fn synthetic(graph: &Graph, info: &GraphInfo, seed: u64, loss: Loss) -> Dataset {
        let inputs = graph
            .inputs()
            .into_iter()
            .map(|v| {
                let ty = info.ty(v);
                let shape: Vec<usize> = ty
                    .shape
                    .as_sizes()
                    .unwrap_or_default()
                    .iter()
                    .map(|&d| d as usize)
                    .collect();
                let range = init::index_range(graph, v, |w| info.ty(w).shape.as_sizes());
                let n = shape.iter().product();
                let data = init::input(seed, &graph.value(v).name, n, ty.dtype.is_float(), range);
                (v, Tensor { shape, data })
            })
            .collect();
        let output: Vec<usize> = graph
            .outputs()
            .first()
            .and_then(|&o| info.ty(o).shape.as_sizes())
            .unwrap_or_default()
            .iter()
            .map(|&d| d as usize)
            .collect();
        let n: usize = output.iter().product();
        let classes = classes(&output);
        let labels = match loss {
            Loss::CrossEntropy => {
                Data::I64(init::integers(seed, "labels", n / classes, classes as u64).into())
            }
            Loss::Mse => Data::F32(init::uniform(seed, "targets", n, 1.0).into()),
        };
        Dataset { inputs, labels }
    }
}

/// The axis of the classes a cross-entropy loss reads in an output of `shape`: the last,
/// after dropping trailing axes of size 1 down to two axes. An `[N, C, 1, 1]` output (a
/// classifier ending in a 1×1 convolution, as the ONNX zoo's do) has its `C` classes on
/// axis 1, as PyTorch's cross-entropy reads it; `[N, 1]` keeps one class.
pub fn class_axis(shape: &[usize]) -> usize {
    let mut axis = shape.len().saturating_sub(1);
    while axis >= 2 && shape[axis] == 1 {
        axis -= 1;
    }
    axis
}

/// The classes of each row of an output of `shape` ([`class_axis`]); its rows are the
/// elements over them.
pub fn classes(shape: &[usize]) -> usize {
    shape.get(class_axis(shape)).copied().unwrap_or(1).max(1)
}

/// The loss of `output`, which holds output elements `start..start + len` of the global
/// batch's output (a whole number of rows), and its gradient; `total` is the global
/// output's element count. Summed over any partition of the output, the losses and
/// gradients are those of the whole batch.
pub fn loss(
    loss: Loss,
    output: &Tensor,
    start: usize,
    labels: &Data,
    total: usize,
) -> Result<(f64, Vec<f32>), ExecError> {
    let y = output.floats().ok_or_else(|| ExecError::Input {
        name: "output".into(),
        message: "the loss needs a floating-point output".into(),
    })?;
    let mut grad = vec![0.0; y.len()];
    match (loss, labels) {
        (Loss::CrossEntropy, Data::I64(classes_of)) => {
            let classes = classes(&output.shape);
            let rows = total / classes;
            let first = start / classes;
            let labels: Vec<u32> = classes_of[first..first + y.len() / classes]
                .iter()
                .map(|&c| c as u32)
                .collect();
            let l = kernels::softmax_cross_entropy(classes, y, &labels, rows as f32, &mut grad);
            Ok((l, grad))
        }
        (Loss::Mse, Data::F32(targets)) => {
            let t = &targets[start..start + y.len()];
            let mut l = 0.0f64;
            for ((g, &v), &w) in grad.iter_mut().zip(y).zip(t) {
                let d = v - w;
                l += f64::from(d) * f64::from(d);
                *g = 2.0 * d / total as f32;
            }
            Ok((l / total as f64, grad))
        }
        _ => Err(ExecError::Input {
            name: "labels".into(),
            message: "the labels do not fit the loss".into(),
        }),
    }
}

/// Trains `graph` (bound at the global batch) on one device: the reference every plan is
/// compared with.
///
/// # Errors
/// When an op fails or has no backward pass.
pub fn train_reference(
    graph: &Graph,
    info: &GraphInfo,
    weights: &Weights,
    data: &Dataset,
    options: &TrainOptions,
) -> Result<TrainReport, ExecError> {
    let env = Env {
        mode: Mode::Training,
        exported_batch: graph.rebatch().map(|r| r.exported),
        samples: graph
            .rebatch()
            .and_then(|r| r.batch.as_known())
            .and_then(|b| usize::try_from(b).ok()),
    };
    let mut tensors = weights.tensors.clone();
    let mut velocity: BTreeMap<ValueId, Vec<f32>> = BTreeMap::new();
    let output = *graph.outputs().first().ok_or_else(|| ExecError::Input {
        name: "output".into(),
        message: "the model has no output".into(),
    })?;
    let mut report = TrainReport::default();
    for step in 0..options.steps {
        let mut values = Values::new(graph);
        for (&v, t) in &tensors {
            values.set(v, t.clone());
        }
        for (&v, t) in &data.inputs {
            values.set(v, t.clone());
        }
        let records = graph::forward(graph, info.order(), &mut values, env)?;
        let y = values.get(output).ok_or_else(|| ExecError::Input {
            name: graph.value(output).name.clone(),
            message: "the output was not computed".into(),
        })?;
        let (l, dy) = loss(options.loss, y, 0, &data.labels, y.len())?;
        report.losses.push(l);
        if step == 0 {
            report.first_output = y.floats().unwrap_or_default().to_vec();
        }
        let mut grads = Grads::default();
        grads.add(output, &dy);
        graph::backward(graph, &records, &values, &mut grads)?;
        for &w in &weights.trainable {
            let g = grads
                .take(w)
                .unwrap_or_else(|| vec![0.0; tensors[&w].len()]);
            if step == 0 {
                report
                    .first_gradients
                    .insert(graph.value(w).name.clone(), g.clone());
            }
            let v = velocity.entry(w).or_insert_with(|| vec![0.0; g.len()]);
            if let Some(x) = tensors.get_mut(&w).and_then(Tensor::floats_mut) {
                kernels::sgd_momentum(x, &g, v, options.lr, options.momentum);
            }
        }
    }
    report.weights = weights
        .trainable
        .iter()
        .filter_map(|w| {
            let t = tensors.get(w)?;
            Some((graph.value(*w).name.clone(), t.floats()?.to_vec()))
        })
        .collect();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_on_the_last_axis_after_trailing_unit_axes() {
        assert_eq!(classes(&[8, 1000]), 1000);
        assert_eq!(classes(&[8, 1000, 1, 1]), 1000);
        assert_eq!(class_axis(&[8, 1000, 1, 1]), 1);
        assert_eq!(classes(&[8, 16, 50257]), 50257);
        // A single output per sample keeps one class; the batch is never the class axis.
        assert_eq!(classes(&[8, 1]), 1);
        assert_eq!(classes(&[8, 1, 1]), 1);
        assert_eq!(class_axis(&[8]), 0);
    }
}
