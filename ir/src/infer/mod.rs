//! Shape and type inference, with folding of shape arithmetic.
//!
//! Exporters compute reshape targets at run time (`Shape → Gather → Unsqueeze → Concat →
//! Reshape`). Inference therefore tracks, besides each value's type, the *content* of small
//! integer tensors as symbolic [`Dim`]s: `Shape` of a `[batch,512,7,7]` tensor is the
//! vector `[batch,512,7,7]`, and the Reshape downstream gets an exact, still symbolic,
//! target. This is what lets a model keep a symbolic batch until `--batch` binds it.
//!
//! Every node is inferred in topological order; a node whose inputs failed is skipped
//! silently, so one mistake is reported once, at its source.

mod fold;
mod rules;

use std::sync::Arc;

use crate::dtype::DType;
use crate::graph::{Graph, Rebatch};
use crate::op::Op;
use crate::shape::{Dim, Shape};
use crate::tensor::{decode_i64s, Storage};

pub(crate) use rules::infer_node;

/// Largest integer tensor whose content is tracked (shape vectors are far smaller).
pub(crate) const MAX_FOLD_ELEMENTS: u64 = 4096;

/// One element of a folded tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    /// An integer, possibly symbolic (a dimension).
    Int(Dim),
    /// A float.
    Float(f64),
}

impl Scalar {
    /// The integer, when this is one (floats with integral values count).
    pub fn as_dim(&self) -> Option<Dim> {
        match self {
            Scalar::Int(d) => Some(d.clone()),
            Scalar::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Some(Dim::known(*f as i64)),
            Scalar::Float(_) => None,
        }
    }

    /// The known integer value.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_dim()?.as_known()
    }

    /// The numeric value, when known.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Scalar::Int(d) => d.as_known().map(|v| v as f64),
            Scalar::Float(f) => Some(*f),
        }
    }
}

/// The inferred type of a value.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueType {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
    /// Elements, row-major, when the value is a small constant or folded shape arithmetic.
    pub content: Option<Arc<[Scalar]>>,
}

impl ValueType {
    pub(crate) fn new(dtype: DType, shape: Shape) -> ValueType {
        ValueType {
            dtype,
            shape,
            content: None,
        }
    }
}

/// Why a node's output types could not be inferred.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InferError {
    /// A required input is absent.
    #[error("input {slot} is required")]
    MissingInput {
        /// Input slot.
        slot: usize,
    },
    /// An input has the wrong rank.
    #[error("input {slot} must have {expected}, got shape {got}")]
    Rank {
        /// Input slot.
        slot: usize,
        /// Expected rank, in words.
        expected: String,
        /// The shape found.
        got: Shape,
    },
    /// Shapes that must agree do not.
    #[error("{reason}")]
    Mismatch {
        /// What disagrees with what.
        reason: String,
    },
    /// An attribute does not fit the input shapes.
    #[error("attribute '{attr}': {reason}")]
    Attribute {
        /// Attribute name.
        attr: String,
        /// Why.
        reason: String,
    },
    /// An input must be a constant (or foldable shape arithmetic) and is not.
    #[error("input {slot} must be a compile-time constant (a constant, an initializer, or shape arithmetic on known shapes){detail}")]
    NotConstant {
        /// Input slot.
        slot: usize,
        /// Extra detail (e.g. unreadable external data), with a leading separator.
        detail: String,
    },
    /// A dimension that must be known is symbolic.
    #[error("needs dimension '{dim}' to be known{hint}")]
    Unbound {
        /// The symbolic dimension.
        dim: Dim,
        /// How to bind it, filled in by the verifier.
        hint: String,
    },
    /// A size overflows 64-bit arithmetic.
    #[error("{what} overflows")]
    Overflow {
        /// What overflowed.
        what: String,
    },
    /// Element types that must agree do not, or are unsupported for the op.
    #[error("{reason}")]
    Type {
        /// Why.
        reason: String,
    },
}

/// Types of every value of a graph, in `ValueId` order (`None` where inference failed).
pub(crate) fn infer_all(
    graph: &Graph,
    order: &[crate::ids::NodeId],
) -> (
    Vec<Option<ValueType>>,
    Vec<(crate::ids::NodeId, InferError)>,
) {
    let mut types: Vec<Option<ValueType>> = vec![None; graph.value_count()];
    let mut errors = Vec::new();
    for &id in order {
        let node = graph.node(id);
        let result = match &node.op {
            Op::Input => input_type(graph, node.outputs[0]).map(|t| vec![t]),
            Op::Constant { tensor, .. } => Ok(vec![constant_type(tensor)]),
            op => {
                let inputs: Vec<Option<&ValueType>> = node
                    .inputs
                    .iter()
                    .map(|v| v.and_then(|v| types[v.index()].as_ref()))
                    .collect();
                // Skip nodes downstream of a failure: it was reported where it happened.
                if node
                    .inputs
                    .iter()
                    .zip(&inputs)
                    .any(|(v, t)| v.is_some() && t.is_none())
                {
                    continue;
                }
                let ctx = rules::Ctx {
                    op,
                    inputs: &inputs,
                    outputs: node.outputs.len(),
                    rebatch: graph.rebatch(),
                    constant_detail: &|slot| {
                        constant_detail(graph, node.inputs.get(slot).copied().flatten())
                    },
                };
                infer_node(&ctx)
            }
        };
        let result = result.and_then(|out| {
            if out.len() == node.outputs.len() {
                Ok(out)
            } else {
                Err(InferError::Mismatch {
                    reason: format!(
                        "has {} output(s) but {} produces {}",
                        node.outputs.len(),
                        node.op.name(),
                        out.len()
                    ),
                })
            }
        });
        match result {
            Ok(out) => {
                for (v, t) in node.outputs.iter().zip(out) {
                    types[v.index()] = Some(t);
                }
            }
            Err(e) => errors.push((id, e)),
        }
    }
    (types, errors)
}

fn input_type(graph: &Graph, v: crate::ids::ValueId) -> Result<ValueType, InferError> {
    let declared = graph.value(v).declared.as_ref();
    match declared {
        Some(crate::graph::TensorType {
            dtype,
            shape: Some(shape),
        }) => Ok(ValueType::new(*dtype, shape.clone())),
        _ => Err(InferError::Type {
            reason: "has no declared shape; give one with --input NAME=D0,D1,...".into(),
        }),
    }
}

/// Type and, for small integer tensors, content of a constant.
pub(crate) fn constant_type(tensor: &crate::tensor::TensorData) -> ValueType {
    let shape = Shape(tensor.dims.iter().map(|&d| Dim::known(d as i64)).collect());
    let mut t = ValueType::new(tensor.dtype, shape);
    let small = tensor.numel().is_some_and(|n| n <= MAX_FOLD_ELEMENTS);
    if small {
        // Weights are never read for planning; small integer tensors stored externally
        // (shape vectors) are, since shapes depend on them.
        if let Storage::External(_) = &tensor.storage {
            t.content = load_external_content(tensor);
        } else if let Storage::Inline(bytes) = &tensor.storage {
            t.content = if tensor.dtype.is_integer() {
                decode_i64s(tensor.dtype, bytes)
                    .ok()
                    .map(|v| v.into_iter().map(|x| Scalar::Int(Dim::known(x))).collect())
            } else if tensor.dtype.is_float() {
                crate::tensor::decode_f64s(tensor.dtype, bytes)
                    .ok()
                    .map(|v| v.into_iter().map(Scalar::Float).collect())
            } else {
                None
            };
        }
    }
    t
}

/// Why a constant input has no content, when its producer is an external tensor.
fn constant_detail(graph: &Graph, v: Option<crate::ids::ValueId>) -> String {
    let Some(v) = v else { return String::new() };
    let producer = graph.value(v).producer;
    match &graph.node(producer).op {
        Op::Constant { tensor, .. } => match &tensor.storage {
            Storage::External(ext) => match tensor.bytes() {
                Err(e) => format!("; tensor '{}' is external data that cannot be read: {e}", graph.value(v).name),
                Ok(_) => format!(
                    "; tensor '{}' is stored in '{}' (external shape tensors are read only when needed)",
                    graph.value(v).name,
                    ext.location
                ),
            },
            Storage::Inline(_) => String::new(),
        },
        _ => {
            let inputs = value_sources(graph, v);
            if inputs.is_empty() {
                let shaped = shape_sources(graph, v);
                if shaped.is_empty() {
                    return String::new();
                }
                let (names, flags) = input_hint(&shaped, "--input");
                format!("; it depends on the shape of {names}, not all known (give it: {flags})")
            } else {
                let (names, flags) = input_hint(&inputs, "--value");
                format!(
                    "; it depends on the value of {names}, known only at run time (unless \
                     given: {flags})"
                )
            }
        }
    }
}

/// The graph inputs `names` as a message names them (`input 'a', input 'b'`) and the
/// options that give them (`--flag a=… --flag b=…`).
fn input_hint(names: &[String], flag: &str) -> (String, String) {
    let named: Vec<String> = names.iter().map(|i| format!("input '{i}'")).collect();
    let given: Vec<String> = names.iter().map(|i| format!("{flag} {i}=…")).collect();
    (named.join(", "), given.join(" "))
}

/// The graph inputs whose values (not only shapes) flow into `v`, by name.
fn value_sources(graph: &Graph, v: crate::ids::ValueId) -> Vec<String> {
    let mut seen = vec![false; graph.value_count()];
    let mut stack = vec![v];
    let mut found = std::collections::BTreeSet::new();
    while let Some(v) = stack.pop() {
        if std::mem::replace(&mut seen[v.index()], true) {
            continue;
        }
        let node = graph.node(graph.value(v).producer);
        match node.op {
            Op::Input => {
                found.insert(graph.value(v).name.clone());
            }
            // These read only their input's shape.
            Op::Shape { .. } | Op::Size => {}
            _ => stack.extend(node.inputs.iter().flatten().copied()),
        }
    }
    found.into_iter().collect()
}

/// The graph inputs whose shapes (read by `Shape` or `Size`) flow into `v`, by name.
fn shape_sources(graph: &Graph, v: crate::ids::ValueId) -> Vec<String> {
    let mut seen = vec![[false; 2]; graph.value_count()];
    // Values, and whether a `Shape` read them (then every input upstream counts).
    let mut stack = vec![(v, false)];
    let mut found = std::collections::BTreeSet::new();
    while let Some((v, shaped)) = stack.pop() {
        if std::mem::replace(&mut seen[v.index()][usize::from(shaped)], true) {
            continue;
        }
        let node = graph.node(graph.value(v).producer);
        let shaped = shaped || matches!(node.op, Op::Shape { .. } | Op::Size);
        if matches!(node.op, Op::Input) && shaped {
            found.insert(graph.value(v).name.clone());
        }
        stack.extend(node.inputs.iter().flatten().map(|&i| (i, shaped)));
    }
    found.into_iter().collect()
}

/// Reads external integer constants that shape inference needs (Reshape targets stored as
/// external data): their content is filled in from the file.
pub(crate) fn load_external_content(tensor: &crate::tensor::TensorData) -> Option<Arc<[Scalar]>> {
    if !tensor.dtype.is_integer() || tensor.numel()? > MAX_FOLD_ELEMENTS {
        return None;
    }
    let bytes = tensor.bytes().ok()?;
    let v = decode_i64s(tensor.dtype, &bytes).ok()?;
    Some(v.into_iter().map(|x| Scalar::Int(Dim::known(x))).collect())
}

/// The rebatch substitution for a constant shape vector: when the graph was re-batched and
/// the target's leading entry is the exported batch size, the new batch takes its place.
pub(crate) fn rebatched(target: &[Dim], rebatch: Option<&Rebatch>) -> Option<Vec<Dim>> {
    let rb = rebatch?;
    match target.first()?.as_known() {
        Some(b) if b == rb.exported => {
            let mut t = target.to_vec();
            t[0] = rb.batch.clone();
            Some(t)
        }
        _ => None,
    }
}
