//! Binding input dimensions: `--batch N` and `--input NAME=D0,D1,...`.
//!
//! The batch dimension is axis 0 of every graph input. When it is a symbol, the symbol is
//! replaced by N wherever it occurs (inputs sharing it stay consistent). When the exporter
//! baked a size into it (a fixed-batch export), the input is re-batched and the graph
//! remembers the exported size, so that shape inference can rewrite constant Reshape and
//! Expand targets that start with it — or name the node that prevents re-batching.

use std::collections::BTreeMap;

use crate::graph::{Graph, Rebatch};
use crate::shape::{Dim, Shape};

/// Dimension bindings for a graph's inputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings {
    /// The global batch size (axis 0 of every input).
    pub batch: Option<u64>,
    /// Full shapes for named inputs (these override `batch` for that input).
    pub inputs: BTreeMap<String, Vec<u64>>,
}

/// Why bindings could not be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BindError {
    /// `--input` names an input the model does not have.
    #[error("the model has no input '{name}' (its inputs: {available})")]
    UnknownInput {
        /// The name given.
        name: String,
        /// The model's inputs, comma-separated.
        available: String,
    },
    /// `--input` gives a different number of dimensions than the model declares.
    #[error("input '{name}' has rank {declared} ({shape}) but {given} dimension(s) were given")]
    Rank {
        /// The input.
        name: String,
        /// Its declared shape.
        shape: Shape,
        /// Declared rank.
        declared: usize,
        /// Given rank.
        given: usize,
    },
    /// `--input` contradicts a dimension the model fixes.
    #[error("input '{name}' fixes dimension {axis} to {declared}, but {given} was given")]
    Conflict {
        /// The input.
        name: String,
        /// The axis.
        axis: usize,
        /// Declared size.
        declared: i64,
        /// Given size.
        given: u64,
    },
    /// A size is zero or does not fit.
    #[error("{what} must be between 1 and 2^62, got {value}")]
    Size {
        /// What was given.
        what: String,
        /// The value.
        value: u64,
    },
}

fn size(what: impl Into<String>, v: u64) -> Result<Dim, BindError> {
    if v == 0 || v > (1 << 62) {
        return Err(BindError::Size {
            what: what.into(),
            value: v,
        });
    }
    Ok(Dim::known(v as i64))
}

/// Applies `bindings` to the declared shapes of `graph`'s inputs, then inlines the branch
/// of every `If` whose condition the bound shapes decide.
///
/// # Errors
/// When an input is unknown, a rank differs, a fixed dimension is contradicted or a size
/// is zero.
pub fn bind(graph: &mut Graph, bindings: &Bindings) -> Result<(), BindError> {
    let inputs = graph.inputs();
    let name_of = |g: &Graph, v| g.value(v).name.clone();
    let mut subst: BTreeMap<String, Dim> = BTreeMap::new();
    let mut rebatch = None;

    for (name, dims) in &bindings.inputs {
        let Some(&v) = inputs.iter().find(|&&v| graph.value(v).name == *name) else {
            let available = inputs
                .iter()
                .map(|&v| name_of(graph, v))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(BindError::UnknownInput {
                name: name.clone(),
                available,
            });
        };
        let given: Vec<Dim> = dims
            .iter()
            .enumerate()
            .map(|(axis, &d)| size(format!("input '{name}' dimension {axis}"), d))
            .collect::<Result<_, _>>()?;
        let declared = graph.value(v).declared.clone();
        if let Some(shape) = declared.as_ref().and_then(|t| t.shape.as_ref()) {
            if shape.rank() != given.len() {
                return Err(BindError::Rank {
                    name: name.clone(),
                    shape: shape.clone(),
                    declared: shape.rank(),
                    given: given.len(),
                });
            }
            for (axis, (d, g)) in shape.0.iter().zip(&given).enumerate() {
                match (d.as_symbol(), d.as_known()) {
                    (Some(sym), _) => {
                        subst.insert(sym.to_owned(), g.clone());
                    }
                    (None, Some(k)) if Some(k) != g.as_known() => {
                        if axis != 0 || bindings.batch.is_none() {
                            return Err(BindError::Conflict {
                                name: name.clone(),
                                axis,
                                declared: k,
                                given: dims[axis],
                            });
                        }
                        // A fixed-batch export given another batch: re-batched.
                        rebatch = Some(Rebatch {
                            exported: k,
                            batch: g.clone(),
                        });
                    }
                    _ => {}
                }
            }
        }
        let dtype = declared.map_or(crate::dtype::DType::F32, |t| t.dtype);
        graph.value_mut(v).declared = Some(crate::graph::TensorType {
            dtype,
            shape: Some(Shape(given)),
        });
    }

    if rebatch.is_some() {
        graph.rebatch = rebatch;
    }
    if let Some(batch) = bindings.batch {
        let n = size("the batch size", batch)?;
        for &v in &inputs {
            if bindings.inputs.contains_key(&graph.value(v).name) {
                continue;
            }
            let Some(first) = graph
                .value(v)
                .declared
                .as_ref()
                .and_then(|t| t.shape.as_ref())
                .and_then(|s| s.0.first().cloned())
            else {
                continue;
            };
            if let Some(sym) = first.as_symbol() {
                subst.insert(sym.to_owned(), n.clone());
            } else if let Some(exported) = first.as_known() {
                if exported != batch as i64 {
                    graph.rebatch = Some(Rebatch {
                        exported,
                        batch: n.clone(),
                    });
                    if let Some(shape) = graph
                        .value_mut(v)
                        .declared
                        .as_mut()
                        .and_then(|t| t.shape.as_mut())
                    {
                        shape.0[0] = n.clone();
                    }
                }
            }
        }
    }

    for &v in &inputs {
        if let Some(shape) = graph
            .value_mut(v)
            .declared
            .as_mut()
            .and_then(|t| t.shape.as_mut())
        {
            for d in &mut shape.0 {
                for (sym, value) in &subst {
                    if let Some(new) = d.substitute(sym, value) {
                        *d = new;
                    }
                }
            }
        }
    }
    crate::branches::inline_taken(graph);
    Ok(())
}
