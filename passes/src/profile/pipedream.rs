//! PipeDream's profile (`profiler/.../profiles/<model>/graph.txt` in msr-fiddle/pipedream):
//! a layer graph with measured costs, one node per line, then one tab-indented edge per line:
//!
//! ```text
//! node4 -- Conv2d(64, 64, kernel_size=(3, 3), ...) -- forward_compute_time=10.814, backward_compute_time=18.335, activation_size=411041792.0, parameter_size=36928.0
//! <TAB>node3 -- node4
//! ```
//!
//! Times are ms for the whole minibatch, sizes bytes (an activation list `[a; b]` sums).
//! Inputs are the nodes described `Input`, `Input0`, `Input1`, …. The batch is not stored.
//! For an image model it follows from the first input and the convolution that reads it:
//! the input holds `batch × c × h × w` floats and the convolution's output `batch × c' ×
//! h' × w'` with `h'` given by its kernel, stride and padding; one batch fits both at any
//! resolution (224² for most of PipeDream's profiles, 299² for Inception-v3). Where the
//! file cannot tell (the translation profiles record no input sizes), the caller states
//! the batch it was measured at. FLOPs are not stored either: these layers are costed from
//! their measurements alone.

use std::collections::{BTreeMap, BTreeSet};

use super::ProfileError;
use crate::layers::{Edge, Layer, LayerGraph, LayerId, LayerKind, Measured, Producer};

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
        // Recurrent layers are gate GEMMs per time step: split by samples or by gates.
        "LSTM" | "GRU" | "RNN" | "EmuBidirLSTM" | "RecurrentAttention" | "Classifier" => {
            LayerKind::Dense
        }
        "ReLU" | "Dropout" | "Add" | "Mul" | "Sigmoid" | "Tanh" => LayerKind::Elementwise,
        "Embedding" => LayerKind::Embedding,
        _ => LayerKind::DataMovement,
    }
}

/// Whether a node is one of the graph's inputs: `Input`, `Input0`, `Input1`, ….
fn is_input_description(description: &str) -> bool {
    description
        .strip_prefix("Input")
        .is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()))
}

/// Parses a PipeDream `graph.txt`. `batch` is the batch it was measured at, when the
/// caller knows it; otherwise it is inferred (see the module docs).
///
/// # Errors
/// A malformed line (named by number), an edge to an unknown node, a cycle, a batch that
/// cannot be inferred and was not given, or one given that the file contradicts.
pub fn parse_pipedream(
    text: &str,
    path: &str,
    batch: Option<u64>,
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
        // Bounds far beyond any layer, so that sums and unit changes stay finite and
        // sizes stay exact: an hour of compute, 2^40 bytes (a TiB).
        let number = |key: &str, most: f64| -> Result<f64, ProfileError> {
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
                .filter(|&x| x <= most)
                .ok_or_else(|| {
                    err(format!(
                        "{key}: '{text}' is not a non-negative number of at most {most:e}"
                    ))
                })
        };
        const MOST_MS: f64 = super::MAX_US / 1e3;
        const MOST_BYTES: f64 = (1u64 << 40) as f64;
        nodes.push(Node {
            id: id.trim().to_owned(),
            description: description.trim().to_owned(),
            fwd_ms: number("forward_compute_time", MOST_MS)?,
            bwd_ms: number("backward_compute_time", MOST_MS)?,
            activation_bytes: number("activation_size", MOST_BYTES)? as u64,
            param_bytes: number("parameter_size", MOST_BYTES)? as u64,
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
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (j, p) in preds.iter().enumerate() {
        for &i in p {
            succs[i].push(j);
        }
    }
    let mut remaining: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut ready: BTreeSet<((u64, String), usize)> = (0..nodes.len())
        .filter(|&i| remaining[i] == 0)
        .map(|i| (number(i), i))
        .collect();
    let mut order = Vec::new();
    while let Some(first) = ready.pop_first() {
        let i = first.1;
        order.push(i);
        for &j in &succs[i] {
            remaining[j] -= 1;
            if remaining[j] == 0 {
                ready.insert((number(j), j));
            }
        }
    }
    if order.len() != nodes.len() {
        return Err(invalid("the edges form a cycle".into()));
    }
    let is_input = |i: usize| is_input_description(&nodes[i].description);
    let inputs: Vec<usize> = order.iter().copied().filter(|&i| is_input(i)).collect();
    let Some(&first_input) = inputs.first() else {
        return Err(invalid(
            "no Input node (described `Input`, `Input0`, …): the graph has no inputs".into(),
        ));
    };
    let reader = (0..nodes.len()).find(|&j| preds[j].contains(&first_input));
    let classifier_batches: BTreeSet<u64> = nodes.iter().filter_map(linear_batch).collect();
    let inferred = reader.and_then(|j| {
        let fits = image_batches(&nodes[first_input], &nodes[j])?;
        let agreed: Vec<u64> = fits
            .iter()
            .copied()
            .filter(|b| classifier_batches.is_empty() || classifier_batches.contains(b))
            .collect();
        match agreed[..] {
            [b] => Some(b),
            _ => None,
        }
    });
    let batch = match (batch, inferred) {
        (Some(given), Some(found)) if given != found => {
            return Err(invalid(format!(
                "measured at batch {found} (input {} and the convolution that reads it say \
                 so), not the batch {given} given",
                nodes[first_input].id
            )))
        }
        (Some(b), _) | (None, Some(b)) => b,
        (None, None) => {
            return Err(invalid(format!(
                "the batch it was measured at cannot be inferred (input {} holds {} bytes, \
                 read by {}): give it with --batch",
                nodes[first_input].id,
                nodes[first_input].activation_bytes,
                reader.map_or("no layer", |j| nodes[j].description.as_str())
            )))
        }
    };
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
                stash_kept_by: None,
                stashed: true,
                epilogue: false,
            })
            .collect();
        let input_bytes = inputs.iter().map(|e| e.bytes).fold(0, u64::saturating_add);
        layer_of.insert(i, LayerId(layers.len() as u32));
        layers.push(Layer {
            name: n.id.clone(),
            module: String::new(),
            op: n.description.clone(),
            kind: kind(&n.description),
            parts: Vec::new(),
            params: n.param_bytes / 4,
            param_bytes: n.param_bytes,
            fwd_flops: 0,
            bwd_flops: 0,
            activation_io_bytes: input_bytes.saturating_add(n.activation_bytes),
            output_bytes: n.activation_bytes,
            stash_bytes: input_bytes,
            inner_stash_bytes: 0,
            kept_output_bytes: 0,
            softmax_rows_bytes: 0,
            scores_stash_bytes: 0,
            inputs,
            measured: Some(Measured {
                fwd_us: n.fwd_ms * 1000.0,
                bwd_us: n.bwd_ms * 1000.0,
                points: Vec::new(),
            }),
            halo: None,
            recurrence: None,
            grouped: false,
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
            batch,
            layers,
            outputs,
            rewrite: None,
            aliases: BTreeMap::new(),
            tied: Vec::new(),
            float_bytes: 4,
            fixed_batch: None,
        },
        inputs: inputs.iter().map(|&i| nodes[i].id.clone()).collect(),
        nodes: nodes.len(),
        edges: edges.len(),
    })
}

/// The batches an image input and the convolution reading it agree on: the input holds
/// `b·c·h·w` fp32 values and the convolution's output `b·c'·h'·w'`. Square images are
/// assumed (every image profile PipeDream ships). A batch `k²` times larger at `1/k` the
/// resolution fits as well, which a classifier ([`linear_batch`]) tells apart.
fn image_batches(input: &Node, reader: &Node) -> Option<Vec<u64>> {
    let conv = Conv2d::parse(&reader.description)?;
    let per_batch_hw = |bytes: u64, channels: u64| -> Option<u64> {
        let values = bytes / 4;
        (bytes % 4 == 0 && values % channels == 0).then_some(values / channels)
    };
    let hw_total = per_batch_hw(input.activation_bytes, conv.in_channels)?;
    let out_total = per_batch_hw(reader.activation_bytes, conv.out_channels)?;
    let fits: Vec<u64> = (1..=hw_total.min(1 << 20))
        .filter(|b| hw_total % b == 0)
        .filter(|&b| {
            let hw = hw_total / b;
            let h = hw.isqrt();
            if h * h != hw {
                return false;
            }
            let out = |d: u64, i: usize| {
                d.saturating_add(conv.padding[i].saturating_mul(2))
                    .checked_sub(conv.kernel[i])
                    .map(|x| x / conv.stride[i].max(1) + 1)
            };
            matches!((out(h, 0), out(h, 1)),
                (Some(oh), Some(ow)) if b.saturating_mul(oh).saturating_mul(ow) == out_total)
        })
        .collect();
    Some(fits)
}

/// The batch a `Linear(in_features=…, out_features=n)` layer's output implies when it
/// reads one vector per sample (a classifier head): its activation over `4·n` bytes.
fn linear_batch(node: &Node) -> Option<u64> {
    let args = node.description.strip_prefix("Linear(")?;
    let features: u64 = args
        .split(", ")
        .find_map(|a| a.strip_prefix("out_features="))?
        .trim_end_matches(')')
        .parse()
        .ok()
        .filter(|&n| n > 0)?;
    let bytes = node.activation_bytes;
    (bytes > 0 && bytes % (4 * features) == 0).then(|| bytes / (4 * features))
}

/// What batch inference needs of a `Conv2d(3, 64, kernel_size=(3, 3), stride=(1, 1),
/// padding=(1, 1), bias=False)` description.
struct Conv2d {
    in_channels: u64,
    out_channels: u64,
    kernel: [u64; 2],
    stride: [u64; 2],
    padding: [u64; 2],
}

impl Conv2d {
    fn parse(description: &str) -> Option<Conv2d> {
        let args = description.strip_prefix("Conv2d(")?.strip_suffix(')')?;
        // Split on the commas outside parentheses.
        let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
        for (i, c) in args.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(args[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(args[start..].trim());
        let pair = |key: &str, default: u64| -> Option<[u64; 2]> {
            let Some(value) = parts.iter().find_map(|p| p.strip_prefix(key)) else {
                return Some([default; 2]);
            };
            let numbers: Vec<u64> = value
                .trim_matches(|c| c == '(' || c == ')')
                .split(',')
                .map(|n| n.trim().parse().ok())
                .collect::<Option<_>>()?;
            match numbers[..] {
                [n] => Some([n; 2]),
                [h, w] => Some([h, w]),
                _ => None,
            }
        };
        Some(Conv2d {
            in_channels: parts.first()?.parse().ok().filter(|&c| c > 0)?,
            out_channels: parts.get(1)?.parse().ok().filter(|&c| c > 0)?,
            kernel: pair("kernel_size=", 1)?,
            stride: pair("stride=", 1)?,
            padding: pair("padding=", 0)?,
        })
    }
}
