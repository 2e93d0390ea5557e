//! The verifier: a graph is acyclic and every value has a type and a shape.
//!
//! `verify` is the gate every later phase stands behind: they take `&GraphInfo`, which
//! only `verify` makes, so unverified IR cannot be planned. It collects every problem.

use std::fmt;

use crate::graph::{Graph, Site};
use crate::ids::{NodeId, ValueId};
use crate::infer::{infer_all, InferError, ValueType};

/// What verification learned: a topological order and every value's type.
#[derive(Clone, Debug)]
pub struct GraphInfo {
    order: Vec<NodeId>,
    types: Vec<ValueType>,
    warnings: Vec<VerifyError>,
}

impl GraphInfo {
    /// Nodes in a deterministic topological order.
    pub fn order(&self) -> &[NodeId] {
        &self.order
    }

    /// Each node's index in [`GraphInfo::order`].
    pub fn positions(&self) -> std::collections::BTreeMap<NodeId, usize> {
        self.order
            .iter()
            .enumerate()
            .map(|(i, &n)| (n, i))
            .collect()
    }

    /// What verification accepted but a user should know: graph outputs whose declared
    /// shapes contradict what the graph computes (exporters write stale ones; onnxruntime
    /// runs such models, warning at run time, and so does ralpc, with the computed shape).
    pub fn warnings(&self) -> &[VerifyError] {
        &self.warnings
    }

    /// The type of a value.
    ///
    /// # Panics
    /// If `v` is not a value of the verified graph.
    pub fn ty(&self, v: ValueId) -> &ValueType {
        &self.types[v.index()]
    }
}

/// One verification problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// Where.
    pub site: Site,
    /// What.
    pub kind: VerifyErrorKind,
}

/// What verification found wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyErrorKind {
    /// The node is on a cycle.
    #[error("is on a cycle: the graph is not a DAG")]
    Cycle,
    /// Its output types could not be inferred.
    #[error(transparent)]
    Infer(#[from] InferError),
    /// Its output types could not be inferred after re-batching, and one of its inputs is
    /// a constant that carries the exported batch in its shape.
    #[error(
        "{source}: {what} '{name}' of shape {shape} has the exported batch {exported} baked \
         into its shape, so the model cannot be re-batched (re-export it with a dynamic batch \
         axis, or keep batch {exported})"
    )]
    BakedBatch {
        /// Why inference failed.
        source: InferError,
        /// `the initializer` or `the constant`.
        what: &'static str,
        /// Its name.
        name: String,
        /// Its shape.
        shape: crate::shape::Shape,
        /// The batch the model was exported at.
        exported: i64,
    },
    /// A graph output's declared shape contradicts the inferred one (a warning: the
    /// computed shape is kept).
    #[error("output '{name}' is declared {declared} but computes {inferred}")]
    DeclaredShape {
        /// The output.
        name: String,
        /// Declared shape.
        declared: crate::shape::Shape,
        /// Inferred shape.
        inferred: crate::shape::Shape,
    },
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.site, self.kind)
    }
}

/// Every problem verification found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} problem(s) in the model:{}", .0.len(), .0.iter().map(|e| format!("\n  {e}")).collect::<String>())]
pub struct VerifyErrors(pub Vec<VerifyError>);

/// Verifies `graph`.
///
/// # Errors
/// Every cycle, shape and type problem found, each at its node.
pub fn verify(graph: &Graph) -> Result<GraphInfo, VerifyErrors> {
    let order = graph.topo_order().map_err(|n| {
        VerifyErrors(vec![VerifyError {
            site: graph.site(n),
            kind: VerifyErrorKind::Cycle,
        }])
    })?;
    let (types, errors) = infer_all(graph, &order);
    let problems: Vec<VerifyError> = errors
        .into_iter()
        .map(|(n, e)| VerifyError {
            site: graph.site(n),
            kind: baked_batch(graph, n, with_hint(graph, e)),
        })
        .collect();

    // Declared output shapes should agree on the dimensions both sides know; after
    // re-batching, axis 0 of the declaration still carries the exported batch.
    let mut warnings = Vec::new();
    let skip = usize::from(graph.rebatch().is_some());
    for &out in graph.outputs() {
        let (Some(t), Some(declared)) = (
            &types[out.index()],
            graph
                .value(out)
                .declared
                .as_ref()
                .and_then(|d| d.shape.as_ref()),
        ) else {
            continue;
        };
        // An export at batch 1 may have squeezed its batch axis away, which a re-batched
        // graph keeps: only a graph at its exported batch keeps its declared rank.
        if skip == 1 && declared.rank() != t.shape.rank() {
            continue;
        }
        let clash =
            declared.rank() != t.shape.rank()
                || declared.0.iter().zip(&t.shape.0).skip(skip).any(
                    |(d, i)| matches!((d.as_known(), i.as_known()), (Some(a), Some(b)) if a != b),
                );
        if clash {
            let producer = graph.value(out).producer;
            warnings.push(VerifyError {
                site: graph.site(producer),
                kind: VerifyErrorKind::DeclaredShape {
                    name: graph.value(out).name.clone(),
                    declared: declared.clone(),
                    inferred: t.shape.clone(),
                },
            });
        }
    }
    if !problems.is_empty() {
        return Err(VerifyErrors(problems));
    }
    // Every node either produced all its outputs or reported an error above, so every
    // value is typed here; the fallback is unreachable and keeps this free of panics.
    let types = types
        .into_iter()
        .map(|t| {
            t.unwrap_or_else(|| {
                ValueType::new(crate::dtype::DType::F32, crate::shape::Shape(Vec::new()))
            })
        })
        .collect();
    Ok(GraphInfo {
        order,
        types,
        warnings,
    })
}

/// Adds to an unbound-dimension error which input the symbol comes from.
/// An inference error at `node` of a re-batched graph, naming the constant input whose
/// shape still holds the exported batch (a constant-folded class token of shape `[2,1,768]`
/// in an export at batch 2), when there is one.
fn baked_batch(graph: &Graph, node: NodeId, source: InferError) -> VerifyErrorKind {
    let Some(rebatch) = graph
        .rebatch()
        .filter(|r| r.exported >= 2 && r.batch.as_known() != Some(r.exported))
    else {
        return VerifyErrorKind::Infer(source);
    };
    let baked = graph.node(node).inputs.iter().flatten().find_map(|&v| {
        let crate::op::Op::Constant {
            tensor,
            initializer,
        } = &graph.node(graph.value(v).producer).op
        else {
            return None;
        };
        let dims: Vec<i64> = tensor
            .dims
            .iter()
            .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
            .collect();
        let holds = dims.contains(&rebatch.exported);
        let shape = crate::shape::Shape::known(&dims);
        holds.then(|| (*initializer, graph.value(v).name.clone(), shape))
    });
    match baked {
        Some((initializer, name, shape)) => VerifyErrorKind::BakedBatch {
            source,
            what: if initializer {
                "the initializer"
            } else {
                "the constant"
            },
            name,
            shape,
            exported: rebatch.exported,
        },
        None => VerifyErrorKind::Infer(source),
    }
}

fn with_hint(graph: &Graph, e: InferError) -> InferError {
    let InferError::Unbound { dim, .. } = e else {
        return e;
    };
    let mut hint = String::new();
    'outer: for v in graph.inputs() {
        let Some(shape) = graph
            .value(v)
            .declared
            .as_ref()
            .and_then(|t| t.shape.as_ref())
        else {
            continue;
        };
        for (axis, d) in shape.0.iter().enumerate() {
            if let Some(sym) = d.as_symbol() {
                if dim.symbols().any(|s| s == sym) {
                    let name = &graph.value(v).name;
                    hint = if axis == 0 {
                        format!(" (input '{name}' dimension 0, the batch): pass --batch N")
                    } else {
                        format!(
                            " (input '{name}' dimension {axis}): pass --input {name}={}",
                            example(shape)
                        )
                    };
                    break 'outer;
                }
            }
        }
    }
    InferError::Unbound { dim, hint }
}

fn example(shape: &crate::shape::Shape) -> String {
    shape
        .0
        .iter()
        .map(|d| {
            d.as_known()
                .map_or_else(|| "N".to_owned(), |k| k.to_string())
        })
        .collect::<Vec<_>>()
        .join(",")
}
