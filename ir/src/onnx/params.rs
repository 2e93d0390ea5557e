//! Which constants of an imported model are its trained weights.
//!
//! ONNX has no notion of a parameter: an initializer may be a weight, a constant the
//! exporter folded (an attention mask, a transposed weight) or an alias of another. The
//! rules below recover the weights of the model that was exported, as PyTorch, the
//! exporter most models come from, writes them:
//!
//! * An initializer is a weight when it is a float tensor of more than one element
//!   ([`Op::is_weight`]); a scalar is a constant of a formula (an exponent, an epsilon).
//! * Exporters that store no float initializer at all (Paddle2ONNX before 1.0) keep every
//!   weight in a `Constant` node: there, float Constants of more than one element are
//!   the weights.
//! * In a PyTorch export, `Identity(w)` of a weight `w` is a weight of its own, starting
//!   equal to `w`. The TorchScript exporter merges parameters of equal value into one
//!   initializer and names each other parameter by an Identity of it: VGG16's
//!   zero-initialized biases, the deep-copied layers of an `nn.TransformerEncoder`. They
//!   train apart in PyTorch, so they do here (a weight the model really shares, a tied
//!   embedding, is read directly by every user and stays one weight). Other exporters'
//!   Identities of a weight (tf2onnx's variable reads) are the weight itself.
//! * In a PyTorch export, a weight whose elements are all equal and that several nodes
//!   read is one weight per reading node: the dynamo exporter merges equal parameters
//!   without a trace (every norm's ones and zeros in a fresh model), and a tie is between
//!   trained values, never a constant. The copies are named `<name>@<node>`. The values
//!   are read only where they are small and present (a structure-only model keeps its
//!   merges; so do deep-copied layers, whose equal values are not constant).
//! * The TorchScript exporter folds a head tied to the embedding (`x @ wte.T`, GPT-2's LM
//!   head) into a transposed copy named `onnx::MatMul_<n>`: an initializer it named so
//!   whose values are exactly the transpose of a parameter's (not constant-valued) is that
//!   parameter read through a `Transpose`, one weight with the embedding.
//! * A float initializer holding an infinity or a NaN (an additive attention mask the
//!   exporter folded) is a constant: no parameter holds one.
//! * The scale and bias of an `InstanceNormalization` between two `Reshape`s are the
//!   ones and zeros of a group normalization as PyTorch's exporters decompose it (the
//!   module's own affine follows as a `Mul` and an `Add`): constants.
//! * PyTorch's dynamo exporter records `torch.export`'s graph signature: an initializer it
//!   names as a buffer or a lifted constant tensor (a rotary embedding's inverse
//!   frequencies, batch-norm statistics) is a constant. A buffer the exporter folded with
//!   other constants into a new initializer (a rotary table cut to a fixed sequence
//!   length) keeps no such name and trains as a weight.

use std::collections::BTreeSet;
use std::sync::Arc;

use onnx_protobuf::GraphProto;

use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::{Storage, TensorData};
use crate::NodeId;

/// Applies the rules of this module to a freshly imported graph; `pytorch` when PyTorch
/// exported it.
pub(super) fn find_weights(graph: &mut Graph, pytorch: bool, buffers: &BTreeSet<String>) {
    mark_constant_weights(graph);
    if pytorch {
        untie_merged(graph);
        untie_constants(graph);
        tie_transposed(graph);
    }
    for n in graph.node_ids().collect::<Vec<_>>() {
        let frozen = match &graph.node(n).op {
            Op::Constant {
                tensor,
                initializer: true,
            } => {
                holds_non_finite(tensor)
                    || is_group_norm_constant(graph, n)
                    || graph
                        .node(n)
                        .outputs
                        .first()
                        .is_some_and(|&v| buffers.contains(&graph.value(v).name))
            }
            _ => false,
        };
        if frozen {
            if let Op::Constant { initializer, .. } = &mut graph.node_mut(n).op {
                *initializer = false;
            }
        }
    }
}

/// The initializers `torch.export` lifted from buffers and constant tensors, by the graph
/// signature the dynamo exporter keeps in the graph's metadata (`b_rot_inv_freq: BUFFER
/// target='rot.inv_freq' persistent=False`) and by each initializer's own record of it.
pub(super) fn exported_buffers(proto: &GraphProto) -> BTreeSet<String> {
    const SIGNATURE: &str = "pkg.torch.export.ExportedProgram.graph_signature";
    const KIND: &str = "pkg.torch.export.graph_signature.InputSpec.kind";
    let not_a_parameter = |kind: &str| matches!(kind, "BUFFER" | "CONSTANT_TENSOR");
    let mut buffers = BTreeSet::new();
    for entry in proto.metadata_props.iter().filter(|e| e.key == SIGNATURE) {
        for line in entry.value.lines() {
            let Some((_, spec)) = line.split_once(": ") else {
                continue;
            };
            let mut words = spec.split_whitespace();
            let (Some(kind), Some(target)) = (words.next(), words.next()) else {
                continue;
            };
            let target = target
                .strip_prefix("target='")
                .and_then(|t| t.strip_suffix('\''));
            if let (true, Some(target)) = (not_a_parameter(kind), target) {
                buffers.insert(target.to_owned());
            }
        }
    }
    for t in &proto.initializer {
        if t.metadata_props
            .iter()
            .any(|e| e.key == KIND && not_a_parameter(&e.value))
        {
            buffers.insert(t.name.clone());
        }
    }
    buffers
}

/// Marks float `Constant` nodes of more than one element as weights (`initializer: true`)
/// in a graph that has no float initializer.
fn mark_constant_weights(graph: &mut Graph) {
    let float_constants = |graph: &Graph, initializer: bool| -> Vec<NodeId> {
        graph
            .node_ids()
            .filter(|&n| match &graph.node(n).op {
                Op::Constant {
                    tensor,
                    initializer: i,
                } => *i == initializer && tensor.dtype.is_float(),
                _ => false,
            })
            .collect()
    };
    if !float_constants(graph, true).is_empty() {
        return;
    }
    for n in float_constants(graph, false) {
        if let Op::Constant {
            tensor,
            initializer,
        } = &mut graph.node_mut(n).op
        {
            *initializer = tensor.numel().is_some_and(|e| e > 1);
        }
    }
}

/// The weight `Identity` node `n` reads, if it reads one: its tensor and where it came
/// from.
fn identity_of_weight(graph: &Graph, n: NodeId) -> Option<(Arc<TensorData>, String)> {
    let node = graph.node(n);
    let (Op::Identity, [Some(x)]) = (&node.op, &node.inputs[..]) else {
        return None;
    };
    let source = graph.value(*x).producer;
    match &graph.node(source).op {
        op @ Op::Constant { tensor, .. } if op.is_weight() => {
            Some((tensor.clone(), graph.provenance(source).name.clone()))
        }
        _ => None,
    }
}

/// Turns every `Identity` of a weight into a weight of its own: its output (named as the
/// PyTorch parameter) is the weight, its provenance the initializer it was merged into,
/// whose data (or, in a model without data, whose seeded values) it starts from. Nodes are
/// in file order, so an Identity of an Identity of a weight is found once the first is a
/// weight.
fn untie_merged(graph: &mut Graph) {
    for n in graph.node_ids().collect::<Vec<_>>() {
        let Some((tensor, source)) = identity_of_weight(graph, n) else {
            continue;
        };
        graph.set_inputs(n, Vec::new());
        graph.node_mut(n).op = Op::Constant {
            tensor,
            initializer: true,
        };
        let provenance = graph.provenance_mut(n);
        provenance.name = source;
        provenance.op_type = "initializer".into();
    }
}

/// Reads every exporter-named 2-d initializer that is the transpose of a parameter as a
/// `Transpose` of that parameter (a tied head folded by the TorchScript exporter).
fn tie_transposed(graph: &mut Graph) {
    let matrices: Vec<(NodeId, Arc<TensorData>)> = graph
        .node_ids()
        .filter_map(|n| match &graph.node(n).op {
            op @ Op::Constant { tensor, .. } if op.is_weight() && tensor.dims.len() == 2 => {
                Some((n, tensor.clone()))
            }
            _ => None,
        })
        .collect();
    let named = |graph: &Graph, n: NodeId| {
        let v = graph.node(n).outputs.first().copied();
        v.map(|v| graph.value(v).name.clone()).unwrap_or_default()
    };
    for (n, copy) in &matrices {
        if !named(graph, *n).starts_with("onnx::") {
            continue;
        }
        // A constant never ties: equal zeros are no evidence of a shared parameter.
        let Ok(values) = copy.to_f64s() else { continue };
        if values.windows(2).all(|w| w[0].to_bits() == w[1].to_bits()) {
            continue;
        }
        let (rows, cols) = (copy.dims[0] as usize, copy.dims[1] as usize);
        let transposes = |t: &TensorData| {
            t.dims == [copy.dims[1], copy.dims[0]]
                && t.to_f64s().is_ok_and(|w| {
                    (0..rows).all(|i| {
                        (0..cols)
                            .all(|j| values[i * cols + j].to_bits() == w[j * rows + i].to_bits())
                    })
                })
        };
        let Some(&(parameter, _)) = matrices
            .iter()
            .find(|(m, t)| m != n && !named(graph, *m).starts_with("onnx::") && transposes(t))
        else {
            continue;
        };
        let source = graph.node(parameter).outputs.first().copied();
        graph.set_inputs(*n, vec![source]);
        graph.node_mut(*n).op = Op::Transpose {
            perm: Some(vec![1, 0]),
        };
    }
}

/// Whether every element of a float tensor of at most [`MASK_BYTES`] is the same (its data
/// being there to read).
fn is_constant_valued(tensor: &TensorData) -> bool {
    if !tensor.dtype.is_float() || tensor.size_bytes().is_none_or(|n| n > MASK_BYTES) {
        return false;
    }
    tensor.to_f64s().is_ok_and(|v| {
        v.first()
            .is_some_and(|&first| v.iter().all(|&x| x.to_bits() == first.to_bits()))
    })
}

/// Gives every node but the first that reads a constant-valued weight a copy of its own.
fn untie_constants(graph: &mut Graph) {
    for n in graph.node_ids().collect::<Vec<_>>() {
        let node = graph.node(n);
        let (op @ Op::Constant { tensor, .. }, [v]) = (&node.op, &node.outputs[..]) else {
            continue;
        };
        let v = *v;
        let mut readers: Vec<NodeId> = graph.consumers(v).into_iter().map(|(c, _)| c).collect();
        readers.sort_unstable();
        readers.dedup();
        if !op.is_weight() || readers.len() < 2 || !is_constant_valued(tensor) {
            continue;
        }
        let tensor = tensor.clone();
        let name = graph.value(v).name.clone();
        let provenance = graph.provenance(n).clone();
        for &reader in &readers[1..] {
            let copy_name = format!("{name}@{}", graph.provenance(reader).name);
            let copy = graph.add_node(
                Op::Constant {
                    tensor: tensor.clone(),
                    initializer: true,
                },
                provenance.clone(),
                &[&copy_name],
            );
            let copied = graph.node(copy).outputs[0];
            let inputs = graph
                .node(reader)
                .inputs
                .iter()
                .map(|&i| if i == Some(v) { Some(copied) } else { i })
                .collect();
            graph.set_inputs(reader, inputs);
        }
    }
}

/// The most bytes of external data read to look for a mask (the dynamo exporter stores
/// every initializer outside the model, masks included); larger tensors are weights.
const MASK_BYTES: u64 = 4 << 20;

/// Whether a float tensor holds an infinity or a NaN. External data is read only for
/// tensors of at most [`MASK_BYTES`] whose file is there (a structure-only model has
/// none: its initializers stay weights).
fn holds_non_finite(tensor: &TensorData) -> bool {
    if !tensor.dtype.is_float() {
        return false;
    }
    let small = tensor.size_bytes().is_some_and(|n| n <= MASK_BYTES);
    if matches!(tensor.storage, Storage::External(_)) && !small {
        return false;
    }
    match tensor.dtype {
        crate::DType::F32 => tensor.bytes().is_ok_and(|bytes| {
            bytes
                .chunks_exact(4)
                .any(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
        }),
        // Other float types are rare in exports: decode them (bounded, as masks are).
        _ => {
            small
                && tensor
                    .to_f64s()
                    .is_ok_and(|v| v.iter().any(|x| !x.is_finite()))
        }
    }
}

/// Whether constant node `n` is the scale or bias of an `InstanceNormalization` that
/// normalizes reshaped groups and whose result is reshaped back (PyTorch's group norm).
fn is_group_norm_constant(graph: &Graph, n: NodeId) -> bool {
    let Some(&v) = graph.node(n).outputs.first() else {
        return false;
    };
    let users = graph.consumers(v);
    !users.is_empty()
        && users.iter().all(|&(user, slot)| {
            let node = graph.node(user);
            let is_reshape = |n: NodeId| matches!(graph.node(n).op, Op::Reshape { .. });
            let input_reshaped = node
                .inputs
                .first()
                .copied()
                .flatten()
                .is_some_and(|x| is_reshape(graph.value(x).producer));
            let output_reshaped = node.outputs.first().is_some_and(|&y| {
                let after = graph.consumers(y);
                !after.is_empty() && after.iter().all(|&(c, _)| is_reshape(c))
            });
            matches!(node.op, Op::InstanceNorm { .. })
                && (slot == 1 || slot == 2)
                && input_reshaped
                && output_reshaped
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Provenance;
    use crate::DType;

    fn weight(values: &[f32]) -> Op {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Op::Constant {
            tensor: Arc::new(TensorData {
                dtype: DType::F32,
                dims: vec![values.len() as u64],
                storage: Storage::Inline(Arc::new(bytes)),
            }),
            initializer: true,
        }
    }

    fn prov(name: &str) -> Provenance {
        Provenance {
            name: name.into(),
            op_type: "test".into(),
            module: String::new(),
        }
    }

    /// Whether the node producing value `name` is a trained weight.
    fn is_weight(g: &Graph, name: &str) -> bool {
        g.node_ids().any(|n| {
            g.node(n).outputs.iter().any(|&v| g.value(v).name == name) && g.node(n).op.is_weight()
        })
    }

    #[test]
    fn merged_parameters_train_apart_and_masks_never_train() {
        let mut g = Graph::default();
        let kept = g.add_node(weight(&[0.0; 4]), prov("a.bias"), &["a.bias"]);
        let a = g.node(kept).outputs[0];
        let alias = g.add_node(Op::Identity, prov("Identity_1"), &["b.bias"]);
        g.set_inputs(alias, vec![Some(a)]);
        g.add_node(weight(&[0.0, f32::NEG_INFINITY]), prov("mask"), &["mask"]);
        find_weights(&mut g, true, &BTreeSet::new());
        assert!(is_weight(&g, "a.bias"));
        assert!(
            is_weight(&g, "b.bias"),
            "the Identity is a weight of its own"
        );
        assert!(g.node(alias).inputs.is_empty());
        assert_eq!(g.provenance(alias).name, "a.bias", "it starts as a.bias");
        assert!(!is_weight(&g, "mask"));
    }

    #[test]
    fn a_constant_weight_several_nodes_read_is_one_per_node() {
        let mut g = Graph::default();
        let ones = g.add_node(weight(&[1.0; 3]), prov("ln.weight"), &["ln.weight"]);
        let random = g.add_node(weight(&[0.5, -1.0, 2.0]), prov("emb"), &["emb"]);
        let (w, e) = (g.node(ones).outputs[0], g.node(random).outputs[0]);
        let users: Vec<NodeId> = (0..3)
            .map(|i| {
                let n = g.add_node(
                    Op::Binary(crate::Binary::Mul),
                    prov(&format!("mul{i}")),
                    &[&format!("y{i}")],
                );
                g.set_inputs(n, vec![Some(w), Some(e)]);
                n
            })
            .collect();
        find_weights(&mut g, true, &BTreeSet::new());
        let names: Vec<String> = users
            .iter()
            .map(|&n| g.value(g.node(n).inputs[0].expect("an input")).name.clone())
            .collect();
        assert_eq!(names, ["ln.weight", "ln.weight@mul1", "ln.weight@mul2"]);
        assert!(is_weight(&g, "ln.weight@mul2"));
        // A tie of values that are not all equal stays one weight.
        assert!(users.iter().all(|&n| g.node(n).inputs[1] == Some(e)));
    }

    #[test]
    fn other_exporters_identities_of_a_weight_are_the_weight() {
        let mut g = Graph::default();
        let kept = g.add_node(weight(&[0.5; 4]), prov("w"), &["w"]);
        let w = g.node(kept).outputs[0];
        let read = g.add_node(Op::Identity, prov("read"), &["w/read"]);
        g.set_inputs(read, vec![Some(w)]);
        find_weights(&mut g, false, &BTreeSet::new());
        assert!(matches!(g.node(read).op, Op::Identity));
        assert!(!is_weight(&g, "w/read"));
    }
}
