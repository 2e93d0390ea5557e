//! Fused attention operators written out as the primitives exporters use, before import:
//! ONNX's `Attention` (opset 23) and ONNX Runtime's `com.microsoft` `MultiHeadAttention`
//! become `MatMul → scale → mask → Softmax → MatMul` (with the head reshapes of 3-D inputs
//! and grouped-query attention's key/value repeat), the form the rewrite merges into one
//! attention core and the planner prices as a fused kernel. The math is the operator's: the
//! CPU backend and the devices compute it exactly, with no kernel of their own.
//!
//! Past key/value caches, extra outputs (present keys and values, the scores) and packed or
//! padded inputs are inference-time features and refused by name.

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, GraphProto, NodeProto, TensorProto};

use super::attrs::Attrs;
use crate::error::Problem;

/// ONNX element types of the tensors the expansion writes.
const FLOAT: i32 = 1;
const INT64: i32 = 7;
const BOOL: i32 = 9;

/// A fused node that could not be expanded (and was dropped).
pub(crate) struct Refused {
    /// The node's name (or `OpType_index`).
    pub name: String,
    /// Its operator.
    pub op_type: String,
    /// The values it would have written.
    pub outputs: Vec<String>,
    /// Why.
    pub problem: Problem,
}

/// Replaces every fused attention node of `graph` by its expansion. A node that cannot be
/// expanded is dropped and returned with its problem.
pub(crate) fn fused_attention(graph: &mut GraphProto) -> Vec<Refused> {
    let mut problems = Vec::new();
    let mask_types = element_types(graph);
    let mut out = Vec::with_capacity(graph.node.len());
    for (index, node) in std::mem::take(&mut graph.node).into_iter().enumerate() {
        let form = match (node.domain.as_str(), node.op_type.as_str()) {
            ("" | "ai.onnx", "Attention") => Form::Onnx,
            ("com.microsoft", "MultiHeadAttention") => Form::MultiHead,
            _ => {
                out.push(node);
                continue;
            }
        };
        match expand(&node, index, form, &mask_types) {
            Ok(nodes) => out.extend(nodes),
            Err(problem) => problems.push(Refused {
                name: super::node_name(&node, index),
                op_type: node.op_type.clone(),
                outputs: node.output.clone(),
                problem,
            }),
        }
    }
    graph.node = out;
    problems
}

/// Which operator a node is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// ONNX `Attention`: Q, K, V (3-D with `q_num_heads`/`kv_num_heads`, else 4-D),
    /// `attn_mask`, `past_key`, `past_value`; `is_causal`, `scale`, `softcap`.
    Onnx,
    /// `com.microsoft.MultiHeadAttention`: 3-D Q, K, V of `num_heads` heads, `bias`,
    /// `key_padding_mask`, `attention_bias`, past caches; `scale`, `unidirectional`.
    MultiHead,
}

/// What the graph declares of a value: its element type and, when its shape is given, its
/// rank.
#[derive(Clone, Copy)]
struct Declared {
    elem_type: i32,
    rank: Option<usize>,
}

/// The declared types of the graph's inputs, initializers and annotated values.
fn element_types(graph: &GraphProto) -> std::collections::HashMap<String, Declared> {
    let mut types: std::collections::HashMap<String, Declared> = graph
        .initializer
        .iter()
        .map(|t| {
            let declared = Declared {
                elem_type: t.data_type,
                rank: Some(t.dims.len()),
            };
            (t.name.clone(), declared)
        })
        .collect();
    for vi in graph.input.iter().chain(&graph.value_info) {
        if let Some(onnx_protobuf::type_proto::Value::TensorType(t)) =
            vi.type_.as_ref().and_then(|t| t.value.as_ref())
        {
            let rank = t.shape.as_ref().map(|s| s.dim.len());
            types.insert(
                vi.name.clone(),
                Declared {
                    elem_type: t.elem_type,
                    rank,
                },
            );
        }
    }
    types
}

fn refuse(attr: &str, reason: impl Into<String>) -> Problem {
    Problem::AttributeValue {
        attr: attr.to_owned(),
        reason: reason.into(),
    }
}

fn expand(
    node: &NodeProto,
    index: usize,
    form: Form,
    types: &std::collections::HashMap<String, Declared>,
) -> Result<Vec<NodeProto>, Problem> {
    let attrs = Attrs::of(node);
    let input = |slot: usize| node.input.get(slot).filter(|n| !n.is_empty()).cloned();
    let (q, k, v) = match (input(0), input(1), input(2)) {
        (Some(q), Some(k), Some(v)) => (q, k, v),
        _ => {
            return Err(refuse(
                "inputs",
                "query, key and value are all needed (packed forms are not expanded)",
            ))
        }
    };
    let Some(y) = node.output.first().filter(|n| !n.is_empty()).cloned() else {
        return Err(refuse("outputs", "the first output is not named"));
    };
    if node.output.iter().skip(1).any(|n| !n.is_empty()) {
        return Err(refuse(
            "outputs",
            "present keys and values and the scores are inference outputs, not expanded",
        ));
    }
    let base = if node.name.is_empty() {
        format!("{}_{index}", node.op_type)
    } else {
        node.name.clone()
    };
    let mut b = Builder {
        base,
        nodes: Vec::new(),
    };
    let (heads, mask, causal, scale, softcap) = match form {
        Form::Onnx => {
            for (slot, what) in [(4, "past_key"), (5, "past_value"), (6, "nonpad_kv_seqlen")] {
                if input(slot).is_some() {
                    return Err(refuse(what, "key/value caches are not expanded"));
                }
            }
            if attrs.int("qk_matmul_output_mode")?.unwrap_or(0) != 0 {
                return Err(refuse("qk_matmul_output_mode", "only 0 is expanded"));
            }
            let q_heads = attrs.int("q_num_heads")?;
            let kv_heads = attrs.int("kv_num_heads")?;
            let heads = match (q_heads, kv_heads) {
                (Some(q), Some(kv)) if q > 0 && kv > 0 && q % kv == 0 => Some((q, kv)),
                (None, None) => None,
                _ => {
                    return Err(refuse(
                        "q_num_heads",
                        "3-D inputs need q_num_heads and kv_num_heads, positive, the first a \
                         multiple of the second",
                    ))
                }
            };
            let mask = match input(3) {
                Some(m) => Some((m.clone(), mask_type(types, &m)?)),
                None => None,
            };
            (
                heads,
                mask,
                attrs.int("is_causal")?.unwrap_or(0) != 0,
                attrs.float("scale")?,
                attrs.float("softcap")?.filter(|&c| c != 0.0),
            )
        }
        Form::MultiHead => {
            for (slot, what) in [
                (3, "bias"),
                (4, "key_padding_mask"),
                (6, "past_key"),
                (7, "past_value"),
            ] {
                if input(slot).is_some() {
                    return Err(refuse(what, "not expanded"));
                }
            }
            let Some(h) = attrs.int("num_heads")?.filter(|&h| h > 0) else {
                return Err(refuse("num_heads", "a positive head count is needed"));
            };
            // Keys and values may also come split by heads ([b, heads, s, d]) or packed:
            // only the 3-D form is expanded, so the ranks must be declared.
            for (what, name) in [("query", &q), ("key", &k), ("value", &v)] {
                if types.get(name.as_str()).and_then(|d| d.rank) != Some(3) {
                    return Err(refuse(
                        what,
                        format!(
                            "'{name}' is not declared 3-D ([batch, sequence, hidden]); other \
                             layouts are not expanded"
                        ),
                    ));
                }
            }
            (
                Some((h, h)),
                input(5).map(|m| (m, FLOAT)),
                attrs.int("unidirectional")?.unwrap_or(0) != 0,
                attrs.float("scale")?.filter(|&s| s != 0.0),
                None,
            )
        }
    };
    // 3-D [batch, seq, heads·size] to 4-D [batch, heads, seq, size].
    let (q4, k4, v4) = match heads {
        Some((qh, kvh)) => (
            b.split_heads(&q, qh),
            b.split_heads(&k, kvh),
            b.split_heads(&v, kvh),
        ),
        None => (q, k, v),
    };
    // Grouped-query attention: each key/value head repeated for its group of query heads
    // ([b, kv, s, d] → [b, kv, g, s, d] → [b, kv·g, s, d]), the group from the shapes.
    let (k4, v4) = match heads {
        Some((qh, kvh)) if qh == kvh => (k4, v4),
        _ => {
            let group = b.group(&q4, &k4);
            (b.repeat_heads(&k4, &group), b.repeat_heads(&v4, &group))
        }
    };
    let kt = b.node("Transpose", &[&k4], &[ints("perm", &[0, 1, 3, 2])]);
    let mut scores = b.node("MatMul", &[&q4, &kt], &[]);
    let scale = match scale {
        Some(s) => b.float(s),
        None => {
            let size = b.node("Shape", &[&q4], &[int("start", 3), int("end", 4)]);
            let size = b.node("Cast", &[&size], &[int("to", i64::from(FLOAT))]);
            let root = b.node("Sqrt", &[&size], &[]);
            b.node("Reciprocal", &[&root], &[])
        }
    };
    scores = b.node("Mul", &[&scores, &scale], &[]);
    // Soft-capping (Gemma 2's) squashes the scores before the mask is added, as the
    // operator's function body orders them.
    if let Some(cap) = softcap {
        let cap = b.float(cap);
        let scaled = b.node("Div", &[&scores, &cap], &[]);
        let squashed = b.node("Tanh", &[&scaled], &[]);
        scores = b.node("Mul", &[&squashed, &cap], &[]);
    }
    if let Some((mask, ty)) = mask {
        let bias = if ty == BOOL {
            let (zero, neg) = (b.float(0.0), b.float(f32::NEG_INFINITY));
            b.node("Where", &[&mask, &zero, &neg], &[])
        } else {
            mask
        };
        scores = b.node("Add", &[&scores, &bias], &[]);
    }
    if causal {
        let bias = b.causal_bias(&q4, &k4);
        scores = b.node("Add", &[&scores, &bias], &[]);
    }
    let probs = b.node("Softmax", &[&scores], &[int("axis", -1)]);
    let context = b.node("MatMul", &[&probs, &v4], &[]);
    match heads {
        Some(_) => {
            let merged = b.node("Transpose", &[&context], &[ints("perm", &[0, 2, 1, 3])]);
            let shape = b.ints(&[0, 0, -1]);
            b.node_into("Reshape", &[&merged, &shape], &[], &y);
        }
        None => b.node_into("Identity", &[&context], &[], &y),
    }
    Ok(b.nodes)
}

/// The element type of an attention mask: booleans select, numbers add.
fn mask_type(
    types: &std::collections::HashMap<String, Declared>,
    mask: &str,
) -> Result<i32, Problem> {
    types.get(mask).map(|d| d.elem_type).ok_or_else(|| {
        refuse(
            "attn_mask",
            format!(
                "the element type of '{mask}' is not declared (a graph input, initializer or \
                 value_info entry tells whether it selects or adds)"
            ),
        )
    })
}

fn int(name: &str, value: i64) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INT.into();
    a.i = value;
    a
}

fn ints(name: &str, values: &[i64]) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = AttributeType::INTS.into();
    a.ints = values.to_vec();
    a
}

/// Nodes named after the fused node, each writing one value of the same name.
struct Builder {
    base: String,
    nodes: Vec<NodeProto>,
}

impl Builder {
    fn node(&mut self, op: &str, inputs: &[&str], attrs: &[AttributeProto]) -> String {
        let name = format!("{}/{op}_{}", self.base, self.nodes.len());
        self.node_into(op, inputs, attrs, &name);
        name
    }

    fn node_into(&mut self, op: &str, inputs: &[&str], attrs: &[AttributeProto], output: &str) {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.name = format!("{}/{op}_{}", self.base, self.nodes.len());
        n.input = inputs.iter().map(|s| (*s).to_owned()).collect();
        n.output = vec![output.to_owned()];
        n.attribute = attrs.to_vec();
        self.nodes.push(n);
    }

    fn constant(&mut self, t: TensorProto) -> String {
        let mut a = AttributeProto::new();
        a.name = "value".into();
        a.type_ = AttributeType::TENSOR.into();
        a.t = Some(t).into();
        self.node("Constant", &[], &[a])
    }

    fn float(&mut self, value: f32) -> String {
        let mut t = TensorProto::new();
        t.data_type = FLOAT;
        t.raw_data = value.to_le_bytes().to_vec();
        self.constant(t)
    }

    fn ints(&mut self, values: &[i64]) -> String {
        let mut t = TensorProto::new();
        t.data_type = INT64;
        t.dims = vec![values.len() as i64];
        t.raw_data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(t)
    }

    fn scalar_int(&mut self, value: i64) -> String {
        let mut t = TensorProto::new();
        t.data_type = INT64;
        t.raw_data = value.to_le_bytes().to_vec();
        self.constant(t)
    }

    /// `[b, s, heads·d]` → `[b, heads, s, d]`.
    fn split_heads(&mut self, x: &str, heads: i64) -> String {
        let shape = self.ints(&[0, 0, heads, -1]);
        let split = self.node("Reshape", &[x, &shape], &[]);
        self.node("Transpose", &[&split], &[ints("perm", &[0, 2, 1, 3])])
    }

    /// Query heads per key/value head, `[1]`.
    fn group(&mut self, q: &str, k: &str) -> String {
        let qh = self.node("Shape", &[q], &[int("start", 1), int("end", 2)]);
        let kvh = self.node("Shape", &[k], &[int("start", 1), int("end", 2)]);
        self.node("Div", &[&qh, &kvh], &[])
    }

    /// `[b, kv, s, d]` with each head repeated `group` times in place: `[b, kv·g, s, d]`.
    fn repeat_heads(&mut self, x: &str, group: &str) -> String {
        let two = self.ints(&[2]);
        let lifted = self.node("Unsqueeze", &[x, &two], &[]);
        let lead = self.node("Shape", &[x], &[int("start", 0), int("end", 2)]);
        let tail = self.node("Shape", &[x], &[int("start", 2), int("end", 4)]);
        let wide = self.node("Concat", &[&lead, group, &tail], &[int("axis", 0)]);
        let expanded = self.node("Expand", &[&lifted, &wide], &[]);
        let batch = self.node("Shape", &[x], &[int("start", 0), int("end", 1)]);
        let minus = self.ints(&[-1]);
        let flat = self.node("Concat", &[&batch, &minus, &tail], &[int("axis", 0)]);
        self.node("Reshape", &[&expanded, &flat], &[])
    }

    /// `[s, l]`: 0 where a query may see a key (its position or earlier), −∞ above.
    fn causal_bias(&mut self, q: &str, k: &str) -> String {
        let s = self.node("Shape", &[q], &[int("start", 2), int("end", 3)]);
        let l = self.node("Shape", &[k], &[int("start", 2), int("end", 3)]);
        let zero_axis = self.ints(&[0]);
        let s = self.node("Squeeze", &[&s, &zero_axis], &[]);
        let l = self.node("Squeeze", &[&l, &zero_axis], &[]);
        let (zero, one) = (self.scalar_int(0), self.scalar_int(1));
        let rows = self.node("Range", &[&zero, &s, &one], &[]);
        let cols = self.node("Range", &[&zero, &l, &one], &[]);
        let one_axis = self.ints(&[1]);
        let rows = self.node("Unsqueeze", &[&rows, &one_axis], &[]);
        let cols = self.node("Unsqueeze", &[&cols, &zero_axis], &[]);
        let above = self.node("Less", &[&rows, &cols], &[]);
        let (neg, fzero) = (self.float(f32::NEG_INFINITY), self.float(0.0));
        self.node("Where", &[&above, &neg, &fzero], &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attention(inputs: &[&str], outputs: &[&str]) -> GraphProto {
        let mut n = NodeProto::new();
        n.op_type = "Attention".into();
        n.name = "attn".into();
        n.input = inputs.iter().map(|s| (*s).to_owned()).collect();
        n.output = outputs.iter().map(|s| (*s).to_owned()).collect();
        let mut g = GraphProto::new();
        g.node.push(n);
        g
    }

    #[test]
    fn a_plain_attention_becomes_primitives_writing_its_output() {
        let mut g = attention(&["q", "k", "v"], &["y"]);
        assert!(fused_attention(&mut g).is_empty());
        let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
        assert!(ops.contains(&"Softmax") && ops.iter().filter(|&&o| o == "MatMul").count() == 2);
        let last = g.node.last().expect("nodes");
        assert_eq!(last.output, vec!["y".to_owned()]);
        assert!(g.node.iter().all(|n| n.name.starts_with("attn/")));
    }

    fn declared_3d(g: &mut GraphProto, name: &str) {
        use onnx_protobuf::tensor_shape_proto::Dimension;
        use onnx_protobuf::type_proto::{Tensor, Value};
        let mut shape = onnx_protobuf::TensorShapeProto::new();
        shape.dim = vec![Dimension::new(); 3];
        let mut t = Tensor::new();
        t.elem_type = FLOAT;
        t.shape = Some(shape).into();
        let mut ty = onnx_protobuf::TypeProto::new();
        ty.value = Some(Value::TensorType(t));
        let mut vi = onnx_protobuf::ValueInfoProto::new();
        vi.name = name.into();
        vi.type_ = Some(ty).into();
        g.input.push(vi);
    }

    #[test]
    fn multi_head_attention_of_declared_3d_inputs_is_expanded_and_others_refused() {
        let multi_head = |declare: bool| {
            let mut g = attention(&["q", "k", "v"], &["y"]);
            g.node[0].op_type = "MultiHeadAttention".into();
            g.node[0].domain = "com.microsoft".into();
            g.node[0].attribute.push(int("num_heads", 4));
            if declare {
                for name in ["q", "k", "v"] {
                    declared_3d(&mut g, name);
                }
            }
            g
        };
        let mut g = multi_head(true);
        assert!(fused_attention(&mut g).is_empty());
        assert!(g.node.iter().any(|n| n.op_type == "Softmax"));
        let mut g = multi_head(false);
        let refused = fused_attention(&mut g);
        assert!(
            matches!(&refused[0].problem, Problem::AttributeValue { attr, .. } if attr == "query")
        );
    }

    #[test]
    fn caches_extra_outputs_and_undeclared_masks_are_refused_by_name() {
        let cases = [
            (attention(&["q", "k", "v", "", "past"], &["y"]), "past_key"),
            (attention(&["q", "k", "v"], &["y", "present"]), "outputs"),
            (attention(&["q", "k", "v", "mask"], &["y"]), "attn_mask"),
        ];
        for (mut g, attr) in cases {
            let refused = fused_attention(&mut g);
            assert_eq!(refused.len(), 1);
            assert_eq!(refused[0].name, "attn");
            assert!(
                matches!(&refused[0].problem, Problem::AttributeValue { attr: a, .. } if a == attr),
                "{attr}"
            );
            assert!(g.node.is_empty());
        }
    }
}
