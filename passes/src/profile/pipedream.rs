//! PipeDream's profile (`profiler/.../profiles/<model>/graph.txt` in msr-fiddle/pipedream):
//! a layer graph with measured costs, one node per line, then one tab-indented edge per line:
//!
//! ```text
//! node4 -- Conv2d(64, 64, kernel_size=(3, 3), ...) -- forward_compute_time=10.814, backward_compute_time=18.335, activation_size=411041792.0, parameter_size=36928.0
//! <TAB>node3 -- node4
//! ```
//!
//! Times are ms for the whole minibatch, sizes bytes (an activation list `[a; b]` sums).
//! The batch is not stored: it is the `Input` node's activation size over the bytes of one
//! input sample (ImageNet's 3×224×224 fp32 unless told otherwise). FLOPs are not stored
//! either: these layers are costed from their measurements alone.

use std::collections::{BTreeMap, BTreeSet};

use super::ProfileError;
use crate::layers::{Edge, Layer, LayerGraph, LayerId, LayerKind, Measured, Producer};

/// Bytes of one 3×224×224 fp32 image.
pub const IMAGENET_SAMPLE_BYTES: u64 = 3 * 224 * 224 * 4;

/// A PipeDream graph as a layer graph.
#[derive(Clone, Debug)]
pub struct PipeDreamGraph {
    /// The layers (every node but the inputs), with measured times.
    pub graph: LayerGraph,
    /// The input nodes' ids.
    pub inputs: Vec<String>,
    /// Node lines read.
    pub nodes: usize,
    /// Edge lines read.
    pub edges: usize,
}

struct Node {
    id: String,
    description: String,
    fwd_ms: f64,
    bwd_ms: f64,
    activation_bytes: u64,
    param_bytes: u64,
}

fn kind(description: &str) -> LayerKind {
    let op = description.split('(').next().unwrap_or_default().trim();
    match op {
        "Conv2d" | "Conv1d" | "Conv3d" => LayerKind::Conv,
        "Linear" => LayerKind::Dense,
        "BatchNorm2d" | "BatchNorm1d" | "LocalResponseNorm" => LayerKind::Norm,
        "LayerNorm" => LayerKind::LayerNorm,
        "MaxPool2d" | "AvgPool2d" | "AdaptiveAvgPool2d" => LayerKind::Pool,
        "Softmax" | "LogSoftmax" => LayerKind::Softmax,
        "ReLU" | "Dropout" | "Add" | "Mul" | "Sigmoid" | "Tanh" => LayerKind::Elementwise,
        "Embedding" => LayerKind::Embedding,
        _ => LayerKind::DataMovement,
    }
}

/// Parses a PipeDream `graph.txt`; `sample_bytes` is one input sample's size.
///
/// # Errors
/// A malformed line (named by number), an edge to an unknown node, a cycle, or an input
/// size that is not a whole number of samples.
pub fn parse_pipedream(
    text: &str,
    path: &str,
    sample_bytes: u64,
) -> Result<PipeDreamGraph, ProfileError> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut edges: Vec<(usize, String, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let err = |message: String| ProfileError::Line {
            path: path.to_owned(),
            line: i + 1,
            message,
        };
        if raw.trim().is_empty() {
            continue;
        }
        if raw.starts_with('\t') || raw.starts_with(' ') {
            let (a, b) = raw
                .trim()
                .split_once(" -- ")
                .ok_or_else(|| err("expected an edge `nodeA -- nodeB`".into()))?;
            edges.push((i + 1, a.trim().to_owned(), b.trim().to_owned()));
            continue;
        }
        let (head, metrics) = raw
            .rsplit_once(" -- ")
            .ok_or_else(|| err("expected `id -- description -- metrics`".into()))?;
        let (id, description) = head
            .split_once(" -- ")
            .ok_or_else(|| err("expected `id -- description -- metrics`".into()))?;
        let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
        for field in metrics.split(", ") {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| err(format!("bad metric '{field}'")))?;
            fields.insert(k.trim(), v.trim());
        }
        let number = |key: &str| -> Result<f64, ProfileError> {
            let text = fields
                .get(key)
                .ok_or_else(|| err(format!("missing {key}")))?;
            let parts = text.trim_start_matches('[').trim_end_matches(']');
            parts
                .split(';')
                .map(|p| {
                    p.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite() && *x >= 0.0)
                })
                .sum::<Option<f64>>()
                .ok_or_else(|| err(format!("{key}: '{text}' is not a non-negative number")))
        };
        nodes.push(Node {
            id: id.trim().to_owned(),
            description: description.trim().to_owned(),
            fwd_ms: number("forward_compute_time")?,
            bwd_ms: number("backward_compute_time")?,
            activation_bytes: number("activation_size")? as u64,
            param_bytes: number("parameter_size")? as u64,
        });
    }
    let invalid = |message: String| ProfileError::Invalid {
        path: path.to_owned(),
        message,
    };
    let index: BTreeMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    if index.len() != nodes.len() {
        return Err(invalid("a node id appears twice".into()));
    }
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (line, a, b) in &edges {
        let find = |id: &str| {
            index.get(id).copied().ok_or_else(|| ProfileError::Line {
                path: path.to_owned(),
                line: *line,
                message: format!("edge names unknown node '{id}'"),
            })
        };
        let (a, b) = (find(a)?, find(b)?);
        if !preds[b].contains(&a) {
            preds[b].push(a);
        }
    }
    // Kahn's algorithm, smallest node number first: a stable order.
    let number = |i: usize| {
        let id = &nodes[i].id;
        (
            id.trim_start_matches(|c: char| !c.is_ascii_digit())
                .parse::<u64>()
                .unwrap_or(u64::MAX),
            id.clone(),
        )
    };
    let mut remaining: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut ready: BTreeSet<((u64, String), usize)> = (0..nodes.len())
        .filter(|&i| remaining[i] == 0)
        .map(|i| (number(i), i))
        .collect();
    let mut order = Vec::new();
    while let Some(first) = ready.pop_first() {
        let i = first.1;
        order.push(i);
        for (j, p) in preds.iter().enumerate() {
            if p.contains(&i) {
                remaining[j] -= 1;
                if remaining[j] == 0 {
                    ready.insert((number(j), j));
                }
            }
        }
    }
    if order.len() != nodes.len() {
        return Err(invalid("the edges form a cycle".into()));
    }
    let is_input = |i: usize| nodes[i].description == "Input";
    let inputs: Vec<usize> = order.iter().copied().filter(|&i| is_input(i)).collect();
    let Some(&first_input) = inputs.first() else {
        return Err(invalid(
            "no Input node: the batch size cannot be inferred".into(),
        ));
    };
    let input_bytes = nodes[first_input].activation_bytes;
    if sample_bytes == 0 || input_bytes == 0 || input_bytes % sample_bytes != 0 {
        return Err(invalid(format!(
            "Input node {} holds {input_bytes} bytes, not a whole number of {sample_bytes}-byte samples",
            nodes[first_input].id
        )));
    }
    let mut layer_of: BTreeMap<usize, LayerId> = BTreeMap::new();
    let mut layers = Vec::new();
    for &i in &order {
        if is_input(i) {
            continue;
        }
        let n = &nodes[i];
        let inputs: Vec<Edge> = preds[i]
            .iter()
            .map(|&p| Edge {
                from: layer_of.get(&p).map_or_else(
                    || Producer::Input(nodes[p].id.clone()),
                    |&l| Producer::Layer(l),
                ),
                value: None,
                bytes: nodes[p].activation_bytes,
            })
            .collect();
        let input_bytes: u64 = inputs.iter().map(|e| e.bytes).sum();
        layer_of.insert(i, LayerId(layers.len() as u32));
        layers.push(Layer {
            name: n.id.clone(),
            op: n.description.clone(),
            kind: kind(&n.description),
            parts: Vec::new(),
            params: n.param_bytes / 4,
            param_bytes: n.param_bytes,
            fwd_flops: 0,
            bwd_flops: 0,
            activation_io_bytes: input_bytes + n.activation_bytes,
            output_bytes: n.activation_bytes,
            stash_bytes: input_bytes,
            inputs,
            measured: Some(Measured {
                fwd_us: n.fwd_ms * 1000.0,
                bwd_us: n.bwd_ms * 1000.0,
            }),
        });
    }
    let consumed: BTreeSet<usize> = preds.iter().flatten().copied().collect();
    let outputs = order
        .iter()
        .filter(|i| !consumed.contains(i) && !is_input(**i))
        .filter_map(|i| layer_of.get(i).copied())
        .collect();
    Ok(PipeDreamGraph {
        graph: LayerGraph {
            batch: input_bytes / sample_bytes,
            layers,
            outputs,
            rewrite: None,
            aliases: BTreeMap::new(),
            tied: Vec::new(),
            float_bytes: 4,
        },
        inputs: inputs.iter().map(|&i| nodes[i].id.clone()).collect(),
        nodes: nodes.len(),
        edges: edges.len(),
    })
}
