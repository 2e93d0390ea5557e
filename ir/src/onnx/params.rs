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
//! * Both exporters fold a head tied to the embedding (`x @ wte.T`, GPT-2's LM head) into
//!   a transposed copy named `onnx::MatMul_<n>` (TorchScript) or `val_<n>` (dynamo): an
//!   initializer named so whose values are exactly the transpose of a parameter's (not
//!   constant-valued) is that parameter read through a `Transpose`, one weight with the
//!   embedding.
//! * A float initializer holding an infinity, a NaN or its type's lowest finite value (an
//!   additive attention mask the exporter folded: Hugging Face fills masked positions with
//!   `torch.finfo(dtype).min`) is a constant: no parameter holds one.
//! * The scale and bias of an `InstanceNormalization` between two `Reshape`s are the
//!   ones and zeros of a group normalization as PyTorch's exporters decompose it (the
//!   module's own affine follows as a `Mul` and an `Add`): constants.
//! * PyTorch's dynamo exporter records `torch.export`'s graph signature: an initializer it
//!   names as a buffer or a lifted constant tensor (a rotary embedding's inverse
//!   frequencies, batch-norm statistics) is a constant. A buffer the exporter folded with
//!   other constants into a new initializer (a rotary table cut to a fixed sequence
//!   length, ALiBi's bias) keeps no such name; when every parameter of the signature is
//!   still there, by name or read by a node, such a fold is found by its readers' records
//!   of the FX nodes they came from: none read a parameter in its place
//!   ([`folded_constants`]). A fold of a parameter (a position table looked up at fixed
//!   positions) leaves that parameter missing, and the folds train as weights.

use std::collections::{BTreeMap, BTreeSet};
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
                is_mask(tensor)
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
    const KIND: &str = "pkg.torch.export.graph_signature.InputSpec.kind";
    let not_a_parameter = |kind: &str| matches!(kind, "BUFFER" | "CONSTANT_TENSOR");
    let mut buffers: BTreeSet<String> = signature(proto)
        .into_iter()
        .filter(|&(_, kind, _)| not_a_parameter(kind))
        .map(|(_, _, target)| target.to_owned())
        .collect();
    for t in &proto.initializer {
        if t.metadata_props
            .iter()
            .any(|e| e.key == KIND && not_a_parameter(&e.value))
        {
            buffers.insert(t.name.clone());
        }
    }
    buffers.extend(folded_constants(proto));
    buffers
}

/// The initializers the dynamo exporter folded from buffers and constants alone: a
/// rotary table cut to the sequence, ALiBi's per-head bias, a mask. The graph signature
/// lists the parameters (`p_blocks_0_attn_Wqkv_weight: PARAMETER
/// target='blocks.0.attn.Wqkv.weight'`) and each node records the FX node it came from,
/// with the parameters it read (`%p_…`). When every parameter is an initializer of its
/// name or read by a node of the graph, none was folded into a new initializer, so a float
/// initializer named otherwise that no reader reads in place of a parameter (its FX
/// node names no `%p_…`) is a constant. Where a parameter went into a fold (a position
/// table looked up at fixed positions), the folds stay weights.
fn folded_constants(proto: &GraphProto) -> BTreeSet<String> {
    let parameters: Vec<(&str, &str)> = signature(proto)
        .into_iter()
        .filter(|&(_, kind, _)| kind == "PARAMETER")
        .map(|(placeholder, _, target)| (placeholder, target))
        .collect();
    if parameters.is_empty() {
        return BTreeSet::new();
    }
    let read: BTreeSet<&str> = proto
        .node
        .iter()
        .filter_map(parameters_read)
        .flatten()
        .collect();
    let initializers: BTreeSet<&str> = proto.initializer.iter().map(|t| t.name.as_str()).collect();
    let all_there = parameters
        .iter()
        .all(|(placeholder, target)| initializers.contains(target) || read.contains(placeholder));
    if !all_there {
        return BTreeSet::new();
    }
    let targets: BTreeSet<&str> = parameters.iter().map(|&(_, t)| t).collect();
    // Per initializer named otherwise, whether every reader so far is known to read no
    // parameter in its place.
    let mut folds: BTreeMap<&str, bool> = initializers
        .iter()
        .filter(|name| !targets.contains(*name))
        .map(|&name| (name, false))
        .collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for node in &proto.node {
        let constant_there = parameters_read(node).is_some_and(|p| p.is_empty());
        for input in &node.input {
            if let Some(fold) = folds.get_mut(input.as_str()) {
                *fold = constant_there && (*fold || seen.insert(input.as_str()));
            }
        }
    }
    folds
        .into_iter()
        .filter(|&(_, constant)| constant)
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// The inputs of the graph signature the dynamo exporter keeps in the graph's metadata:
/// each line's placeholder, kind and target (`p_w: PARAMETER target='w'`).
fn signature(proto: &GraphProto) -> Vec<(&str, &str, &str)> {
    const SIGNATURE: &str = "pkg.torch.export.ExportedProgram.graph_signature";
    let mut inputs = Vec::new();
    for entry in proto.metadata_props.iter().filter(|e| e.key == SIGNATURE) {
        for line in entry.value.lines() {
            let Some((placeholder, spec)) = line.split_once(": ") else {
                continue;
            };
            let mut words = spec.split_whitespace();
            let (Some(kind), Some(target)) = (words.next(), words.next()) else {
                continue;
            };
            let target = target
                .strip_prefix("target='")
                .and_then(|t| t.strip_suffix('\''));
            if let Some(target) = target {
                inputs.push((placeholder.trim(), kind, target));
            }
        }
    }
    inputs
}

/// The parameters (`p_…` placeholders) the FX node `node` came from read, when the
/// exporter recorded it.
fn parameters_read(node: &onnx_protobuf::NodeProto) -> Option<BTreeSet<&str>> {
    const FX_NODE: &str = "pkg.torch.onnx.fx_node";
    let fx = node.metadata_props.iter().find(|e| e.key == FX_NODE)?;
    Some(
        fx.value
            .split('%')
            .skip(1)
            .map(|s| {
                let end = s
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(s.len());
                &s[..end]
            })
            .filter(|name| name.starts_with("p_"))
            .collect(),
    )
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
    // Names the exporters make up for what they fold: TorchScript's `onnx::MatMul_7`,
    // dynamo's `val_39` (a parameter keeps its module path).
    let made_up = |graph: &Graph, n: NodeId| {
        let name = named(graph, n);
        name.starts_with("onnx::")
            || name
                .strip_prefix("val_")
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
    };
    for (n, copy) in &matrices {
        if !made_up(graph, *n) {
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
            .find(|(m, t)| m != n && !made_up(graph, *m) && transposes(t))
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

/// Whether a float tensor holds an infinity, a NaN or its type's lowest finite value
/// (what an additive mask fills masked positions with). External data is read only for
/// tensors of at most [`MASK_BYTES`] whose file is there (a structure-only model has
/// none: its initializers stay weights).
fn is_mask(tensor: &TensorData) -> bool {
    if !tensor.dtype.is_float() {
        return false;
    }
    let small = tensor.size_bytes().is_some_and(|n| n <= MASK_BYTES);
    if matches!(tensor.storage, Storage::External(_)) && !small {
        return false;
    }
    match tensor.dtype {
        crate::DType::F32 => tensor.bytes().is_ok_and(|bytes| {
            bytes.chunks_exact(4).any(|b| {
                let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                !x.is_finite() || x == f32::MIN
            })
        }),
        // Other float types are rare in exports: decode them (bounded, as masks are).
        dtype => {
            let lowest = match dtype {
                crate::DType::F16 => -65504.0,
                crate::DType::BF16 => -3.389_531_389_251_535_5e38,
                _ => f64::MIN,
            };
            small
                && tensor
                    .to_f64s()
                    .is_ok_and(|v| v.iter().any(|&x| !x.is_finite() || x == lowest))
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
        // Hugging Face's: `torch.finfo(torch.float32).min` where masked.
        g.add_node(weight(&[0.0, f32::MIN]), prov("hf_mask"), &["hf_mask"]);
        g.add_node(weight(&[0.0, -3.0e38]), prov("large"), &["large"]);
        find_weights(&mut g, true, &BTreeSet::new());
        assert!(is_weight(&g, "a.bias"));
        assert!(
            is_weight(&g, "b.bias"),
            "the Identity is a weight of its own"
        );
        assert!(g.node(alias).inputs.is_empty());
        assert_eq!(g.provenance(alias).name, "a.bias", "it starts as a.bias");
        assert!(!is_weight(&g, "mask"));
        assert!(!is_weight(&g, "hf_mask"));
        assert!(is_weight(&g, "large"), "only the lowest value marks a mask");
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

    fn entry(key: &str, value: &str) -> onnx_protobuf::StringStringEntryProto {
        let mut e = onnx_protobuf::StringStringEntryProto::new();
        e.key = key.into();
        e.value = value.into();
        e
    }

    /// A dynamo export's graph: its signature's parameters, initializers, and nodes each
    /// reading one initializer, with the FX node they came from.
    fn exported(parameters: &[&str], initializers: &[&str], nodes: &[(&str, &str)]) -> GraphProto {
        let mut g = GraphProto::new();
        let signature: String = parameters
            .iter()
            .map(|t| format!("p_{}: PARAMETER target='{t}'\n", t.replace('.', "_")))
            .collect();
        g.metadata_props.push(entry(
            "pkg.torch.export.ExportedProgram.graph_signature",
            &format!("\n# inputs\n{signature}x: USER_INPUT\n"),
        ));
        for name in initializers {
            let mut t = onnx_protobuf::TensorProto::new();
            t.name = (*name).into();
            g.initializer.push(t);
        }
        for (reads, fx) in nodes {
            let mut n = onnx_protobuf::NodeProto::new();
            n.input.push((*reads).into());
            n.metadata_props.push(entry("pkg.torch.onnx.fx_node", fx));
            g.node.push(n);
        }
        g
    }

    #[test]
    fn folds_of_buffers_are_constants_when_every_parameter_is_there() {
        let linear = "%linear : [num_users=1] = call_function[target=aten.linear.default]\
                      (args = (%x, %p_q_weight), kwargs = {})";
        let rotary = "%mul_3 : [num_users=1] = call_function[target=aten.mul.Tensor]\
                      (args = (%linear, %unsqueeze_14), kwargs = {})";
        let position = "%add : [num_users=1] = call_function[target=aten.add.Tensor]\
                        (args = (%linear, %embedding_1), kwargs = {})";
        // `q.weight` folded into its transpose `val_3`, which the product reads; the
        // rotary table `unsqueeze_14` read by no parameter's reader.
        let all_there = exported(
            &["q.weight", "norm.weight"],
            &["norm.weight", "val_3", "unsqueeze_14"],
            &[
                ("val_3", linear),
                ("unsqueeze_14", rotary),
                ("norm.weight", position),
            ],
        );
        assert_eq!(
            folded_constants(&all_there),
            BTreeSet::from(["unsqueeze_14".to_owned()])
        );
        // A position table folded into the rows it looked up: `pos.weight` is gone, so a
        // fold may hold parameters, and every fold stays a weight.
        let folded_parameter = exported(
            &["q.weight", "pos.weight"],
            &["val_3", "embedding_1", "unsqueeze_14"],
            &[
                ("val_3", linear),
                ("embedding_1", position),
                ("unsqueeze_14", rotary),
            ],
        );
        assert!(folded_constants(&folded_parameter).is_empty());
        // Not a dynamo export: no signature, nothing found.
        assert!(folded_constants(&GraphProto::new()).is_empty());
    }

    fn matrix(rows: u64, values: &[f32]) -> Op {
        let mut op = weight(values);
        if let Op::Constant { tensor, .. } = &mut op {
            Arc::make_mut(tensor).dims = vec![rows, values.len() as u64 / rows];
        }
        op
    }

    #[test]
    fn a_head_folded_as_the_embeddings_transpose_is_the_embedding() {
        let mut g = Graph::default();
        let embedding = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6];
        let transposed = [0.1, 0.3, 0.5, 0.2, 0.4, 0.6];
        g.add_node(matrix(3, &embedding), prov("wte.weight"), &["wte.weight"]);
        // TorchScript's name for the folded copy, dynamo's, and a parameter's own.
        for name in ["onnx::MatMul_7", "val_230", "decoder.weight"] {
            g.add_node(matrix(2, &transposed), prov(name), &[name]);
        }
        find_weights(&mut g, true, &BTreeSet::new());
        for (name, tied) in [
            ("onnx::MatMul_7", true),
            ("val_230", true),
            ("decoder.weight", false),
        ] {
            let n = g
                .node_ids()
                .find(|&n| g.value(g.node(n).outputs[0]).name == name)
                .expect("the node");
            let reads = g.node(n).inputs.first().copied().flatten();
            assert_eq!(
                reads.map(|v| g.value(v).name.clone()).as_deref(),
                tied.then_some("wte.weight"),
                "{name}"
            );
            assert_eq!(is_weight(&g, name), !tied, "{name}");
        }
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
