//! Binding input dimensions: `--batch N` and `--input NAME=D0,D1,...`.
//!
//! Each graph input holds the samples on its batch axis ([`batch_axes`]): axis 0 for most,
//! axis 1 for a recurrent state `[directions, batch, hidden]`, none for a scalar or a table
//! every sample shares. When the batch dimension is a symbol, the symbol is replaced by N
//! wherever it occurs (inputs sharing it stay consistent). When the exporter baked a size
//! into it (a fixed-batch export), the input is re-batched and the graph remembers the
//! exported size, so that shape inference can rewrite constant Reshape and Expand targets
//! that start with it — or name the node that prevents re-batching.

use std::collections::BTreeMap;

use crate::graph::{Graph, Rebatch};
use crate::shape::{Dim, Shape};

/// Dimension bindings for a graph's inputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings {
    /// The global batch size (on every input's batch axis, see [`batch_axes`]).
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
    /// `--value` cannot be the input's value.
    #[error("--value {name}: {why}")]
    Value {
        /// The input.
        name: String,
        /// Why not.
        why: String,
    },
}

/// Makes each named input of `values` a constant of the given elements (`--value sr=16000`:
/// a voice-activity model's sample rate), so that what depends on it folds before planning
/// (an `If` on it keeps the branch taken). The input must have a fixed shape that holds
/// that many elements; integers must be whole numbers, booleans 0 or 1. Run before
/// [`bind`], which inlines the branches.
///
/// # Errors
/// An unknown input, one whose shape is not fixed or holds another number of elements, or
/// an element its type cannot hold.
pub fn bind_values(
    graph: &mut Graph,
    values: &BTreeMap<String, Vec<f64>>,
) -> Result<(), BindError> {
    use crate::dtype::DType;
    let inputs = graph.inputs();
    for (name, elements) in values {
        let error = |why: String| BindError::Value {
            name: name.clone(),
            why,
        };
        let Some(&v) = inputs.iter().find(|&&v| graph.value(v).name == *name) else {
            let available = inputs
                .iter()
                .map(|&v| graph.value(v).name.clone())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(BindError::UnknownInput {
                name: name.clone(),
                available,
            });
        };
        let declared = graph.value(v).declared.clone();
        let dtype = declared.as_ref().map_or(DType::F32, |t| t.dtype);
        let dims: Vec<u64> = declared
            .as_ref()
            .and_then(|t| t.shape.as_ref())
            .and_then(Shape::as_sizes)
            .ok_or_else(|| error("its shape is not fixed".into()))?;
        let count: u64 = dims.iter().product();
        if count != elements.len() as u64 {
            return Err(error(format!(
                "its shape {dims:?} holds {count} element(s), {} given",
                elements.len()
            )));
        }
        let whole = |x: f64, lo: f64, hi: f64| {
            (x.fract() == 0.0 && x >= lo && x <= hi)
                .then_some(x)
                .ok_or_else(|| {
                    error(format!(
                        "{x} is not a {dtype} value (a whole number in its range)"
                    ))
                })
        };
        let mut bytes = Vec::new();
        for &x in elements {
            match dtype {
                DType::F32 => bytes.extend((x as f32).to_le_bytes()),
                DType::F64 => bytes.extend(x.to_le_bytes()),
                DType::I64 => bytes.extend((whole(x, -9.0e15, 9.0e15)? as i64).to_le_bytes()),
                DType::I32 => bytes.extend((whole(x, -2.0e9, 2.0e9)? as i32).to_le_bytes()),
                DType::Bool => bytes.push(whole(x, 0.0, 1.0)? as u8),
                other => return Err(error(format!("inputs of type {other} take no --value"))),
            }
        }
        let node = graph.value(v).producer;
        graph.node_mut(node).op = crate::op::Op::Constant {
            tensor: std::sync::Arc::new(crate::tensor::TensorData {
                dtype,
                dims,
                storage: crate::tensor::Storage::Inline(std::sync::Arc::new(bytes)),
            }),
            initializer: false,
        };
    }
    Ok(())
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

/// Where each graph input holds the samples: its batch axis, by input name (inputs without
/// one are absent).
///
/// The batch is the dimension the first input with a symbolic axis 0 names there (else, a
/// symbol on axis 1 of any input: sequence-first inputs at a fixed length). An input
/// holding that symbol on another axis holds the batch there (a recurrent state
/// `[directions, batch, hidden]`); one whose axis 0 is a symbol of its own holds it on axis 0
/// (an unnamed dynamic dimension gets a symbol per input, and a state `[k, ?, …]` whose only
/// dynamic dimension is unnamed holds it on axis 1); one of fixed sizes beside a
/// symbolic batch has none (a table every sample shares). In an export at a fixed batch
/// (its other sizes fixed or not: an image of any width) the batch is the first input's axis 0, and each input holds it on its first axis of that
/// size. Scalars have no batch axis.
pub fn batch_axes(graph: &Graph) -> BTreeMap<String, usize> {
    let declared: Vec<(String, &[Dim])> = graph
        .inputs()
        .into_iter()
        .filter_map(|v| {
            let value = graph.value(v);
            let shape = value.declared.as_ref()?.shape.as_ref()?;
            (!shape.0.is_empty()).then(|| (value.name.clone(), &shape.0[..]))
        })
        .collect();
    let symbol = declared
        .iter()
        .find_map(|(_, dims)| dims[0].as_symbol())
        .or_else(|| {
            // Sequence-first inputs (`[tokens, batch, d]` at a fixed length): a symbol on
            // axis 1. A symbol further in is an image's or a sequence's size in an export
            // at a fixed batch (`[1, 1, 64, width]`).
            declared
                .iter()
                .find_map(|(_, dims)| dims.get(1).and_then(Dim::as_symbol))
        })
        .map(str::to_owned);
    let fixed = declared.first().and_then(|(_, dims)| dims[0].as_known());
    declared
        .iter()
        .filter_map(|(name, dims)| {
            let axis = match (&symbol, fixed) {
                (Some(batch), _) => dims
                    .iter()
                    .position(|d| d.as_symbol() == Some(batch.as_str()))
                    .or_else(|| dims[0].as_symbol().map(|_| 0))
                    .or_else(|| unnamed_state_axis(name, dims)),
                (None, Some(b)) => dims.iter().position(|d| d.as_known() == Some(b)),
                (None, None) => None,
            };
            Some((name.clone(), axis?))
        })
        .collect()
}

/// Axis 1 of an input `[k, ?, …]` whose only dynamic dimension is that unnamed one
/// (`<input>_dim1`): a recurrent state `[directions, batch, hidden]` in an export that
/// names no dimension, where every input's batch has a symbol of its own.
fn unnamed_state_axis(name: &str, dims: &[Dim]) -> Option<usize> {
    let own = format!("{name}_dim1");
    let state = dims.len() >= 3
        && dims[0].as_known().is_some()
        && dims[1].as_symbol() == Some(own.as_str())
        && dims[2..].iter().all(|d| d.as_known().is_some());
    state.then_some(1)
}

/// `shapes` (full shapes of named inputs) with the batch axis of each set to `batch`.
pub fn with_batch(
    graph: &Graph,
    shapes: &BTreeMap<String, Vec<u64>>,
    batch: u64,
) -> BTreeMap<String, Vec<u64>> {
    let axes = batch_axes(graph);
    shapes
        .iter()
        .map(|(name, dims)| {
            let mut dims = dims.clone();
            if let Some(d) = axes.get(name).and_then(|&a| dims.get_mut(a)) {
                *d = batch;
            }
            (name.clone(), dims)
        })
        .collect()
}

/// The batch `shapes` (full shapes of named inputs) give on their batch axes: `Ok(None)`
/// when none holds one, `Err` with two inputs that disagree (name, size each).
#[allow(
    clippy::type_complexity,
    reason = "a pair of (name, size) pairs reads plainer than a named type"
)]
pub fn given_batch(
    graph: &Graph,
    shapes: &BTreeMap<String, Vec<u64>>,
) -> Result<Option<(String, u64)>, ((String, u64), (String, u64))> {
    let axes = batch_axes(graph);
    let mut found: Option<(String, u64)> = None;
    for (name, dims) in shapes {
        let Some(&b) = axes.get(name).and_then(|&a| dims.get(a)) else {
            continue;
        };
        match &found {
            Some(first) if first.1 != b => return Err((first.clone(), (name.clone(), b))),
            Some(_) => {}
            None => found = Some((name.clone(), b)),
        }
    }
    Ok(found)
}

/// Applies `bindings` to the declared shapes of `graph`'s inputs, then inlines the branch
/// of every `If` whose condition the bound shapes decide.
///
/// # Errors
/// When an input is unknown, a rank differs, a fixed dimension is contradicted or a size
/// is zero.
pub fn bind(graph: &mut Graph, bindings: &Bindings) -> Result<(), BindError> {
    let inputs = graph.inputs();
    let batch_axes = batch_axes(graph);
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
                        if batch_axes.get(name) != Some(&axis) || bindings.batch.is_none() {
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
            let name = &graph.value(v).name;
            if bindings.inputs.contains_key(name) {
                continue;
            }
            let Some(&axis) = batch_axes.get(name.as_str()) else {
                continue;
            };
            let Some(dim) = graph
                .value(v)
                .declared
                .as_ref()
                .and_then(|t| t.shape.as_ref())
                .and_then(|s| s.0.get(axis).cloned())
            else {
                continue;
            };
            if let Some(sym) = dim.as_symbol() {
                subst.insert(sym.to_owned(), n.clone());
            } else if let Some(exported) = dim.as_known() {
                // Recorded at the exported batch too: a plan's ranks run shares of it,
                // which re-batch the same constant targets.
                graph.rebatch = Some(Rebatch {
                    exported,
                    batch: n.clone(),
                });
                if exported != batch as i64 {
                    if let Some(shape) = graph
                        .value_mut(v)
                        .declared
                        .as_mut()
                        .and_then(|t| t.shape.as_mut())
                    {
                        shape.0[axis] = n.clone();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::graph::{Provenance, TensorType};
    use crate::op::Op;

    /// A graph of inputs only, each `(name, dims)`, a dim a size or a symbol.
    fn inputs(declared: &[(&str, &[&str])]) -> Graph {
        let mut g = Graph::new();
        for (name, dims) in declared {
            let provenance = Provenance {
                name: (*name).to_owned(),
                op_type: "input".into(),
                module: String::new(),
            };
            let node = g.add_node(Op::Input, provenance, &[name]);
            let v = g.node(node).outputs[0];
            let dims = dims
                .iter()
                .map(|d| d.parse().map_or_else(|_| Dim::sym(d), Dim::known))
                .collect();
            g.value_mut(v).declared = Some(TensorType {
                dtype: DType::F32,
                shape: Some(Shape(dims)),
            });
        }
        g
    }

    fn axes(g: &Graph) -> Vec<(&str, usize)> {
        let axes = batch_axes(g);
        let mut v: Vec<(&str, usize)> = g
            .inputs()
            .iter()
            .filter_map(|&i| {
                let name = g.value(i).name.as_str();
                Some((name, *axes.get(name)?))
            })
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn each_input_holds_the_batch_where_the_batch_symbol_is() {
        // A voice-activity model: audio, a recurrent state and a sample rate.
        let g = inputs(&[
            ("input", &["batch", "sequence"]),
            ("state", &["2", "batch", "128"]),
            ("sr", &[]),
        ]);
        assert_eq!(axes(&g), [("input", 0), ("state", 1)]);
        // A fixed-size table beside a symbolic batch is every sample's.
        let g = inputs(&[("x", &["n", "16"]), ("table", &["4", "16"])]);
        assert_eq!(axes(&g), [("x", 0)]);
        // Unnamed dynamic dimensions get a symbol per input: each on its axis 0, and a
        // state's on axis 1 (silero VAD's first export names no dimension).
        let g = inputs(&[("a", &["a_dim0", "3"]), ("b", &["b_dim0", "5"])]);
        assert_eq!(axes(&g), [("a", 0), ("b", 0)]);
        let g = inputs(&[
            ("input", &["input_dim0", "input_dim1"]),
            ("state", &["2", "state_dim1", "128"]),
            ("sr", &[]),
        ]);
        assert_eq!(axes(&g), [("input", 0), ("state", 1)]);
        // A fixed-size export: the first input's axis 0, wherever each input has that size.
        let g = inputs(&[("x", &["1", "512"]), ("h", &["2", "1", "64"])]);
        assert_eq!(axes(&g), [("h", 1), ("x", 0)]);
        // Sequence-first inputs of a fixed length.
        let g = inputs(&[("x", &["6", "batch", "4"]), ("h0", &["1", "batch", "8"])]);
        assert_eq!(axes(&g), [("h0", 1), ("x", 1)]);
        // An image of any width at a fixed batch of 1: the width is no batch.
        let g = inputs(&[("image", &["1", "1", "64", "width"])]);
        assert_eq!(axes(&g), [("image", 0)]);
    }

    #[test]
    fn a_value_makes_an_input_a_constant_of_its_type() {
        let mut g = inputs(&[("x", &["batch", "4"]), ("sr", &[])]);
        let sr = g.inputs()[1];
        g.value_mut(sr).declared.as_mut().expect("declared").dtype = DType::I64;
        let values = |name: &str, v: &[f64]| BTreeMap::from([(name.to_owned(), v.to_vec())]);
        let why = |g: &mut Graph, name, v: &[f64]| match bind_values(g, &values(name, v)) {
            Err(BindError::Value { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            why(&mut g.clone(), "sr", &[1.5]),
            "1.5 is not a i64 value (a whole number in its range)"
        );
        assert!(why(&mut g.clone(), "sr", &[1.0, 2.0]).contains("holds 1 element(s), 2 given"));
        assert_eq!(why(&mut g.clone(), "x", &[1.0]), "its shape is not fixed");
        assert!(matches!(
            bind_values(&mut g.clone(), &values("rate", &[1.0])),
            Err(BindError::UnknownInput { .. })
        ));
        bind_values(&mut g, &values("sr", &[16000.0])).expect("binds");
        assert_eq!(g.inputs().len(), 1, "sr is no input any more");
        let Op::Constant { tensor, .. } = &g.node(g.value(sr).producer).op else {
            panic!("sr is not a constant");
        };
        assert_eq!(tensor.dtype, DType::I64);
        assert_eq!(tensor.to_f64s().expect("readable"), [16000.0]);
    }

    #[test]
    fn binding_the_batch_sets_every_input_on_its_batch_axis() {
        let mut g = inputs(&[("x", &["1", "512"]), ("h", &["2", "1", "64"])]);
        let bindings = Bindings {
            batch: Some(8),
            inputs: BTreeMap::new(),
        };
        bind(&mut g, &bindings).expect("binds");
        let shape = |g: &Graph, i: usize| {
            let v = g.inputs()[i];
            g.value(v).declared.as_ref().and_then(|t| t.shape.clone())
        };
        assert_eq!(shape(&g, 0).and_then(|s| s.as_sizes()), Some(vec![8, 512]));
        assert_eq!(
            shape(&g, 1).and_then(|s| s.as_sizes()),
            Some(vec![2, 8, 64])
        );

        let g = inputs(&[
            ("input", &["batch", "s"]),
            ("state", &["2", "batch", "128"]),
        ]);
        let given = BTreeMap::from([
            ("input".to_owned(), vec![8, 512]),
            ("state".to_owned(), vec![2, 8, 128]),
        ]);
        assert_eq!(given_batch(&g, &given), Ok(Some(("input".to_owned(), 8))));
        let rebatched = with_batch(&g, &given, 4);
        assert_eq!(rebatched["state"], [2, 4, 128]);
        let wrong = BTreeMap::from([
            ("input".to_owned(), vec![8, 512]),
            ("state".to_owned(), vec![2, 4, 128]),
        ]);
        assert!(given_batch(&g, &wrong).is_err());
    }
}
