//! Generated ONNX models: structure-only GPT decoders of any shape, as Megatron-LM builds
//! them (learned position embeddings, pre-LayerNorm blocks, fused QKV, a GELU MLP, a tied or
//! untied LM head).
//!
//! Weights are external data whose file is never written (ralpc plans without reading
//! them); the small integer tables shape inference needs (reshape targets, split sizes,
//! position ids) are stored inline. The graph follows what PyTorch's exporters write for
//! such a model: `Split` of the fused QKV, `Reshape`/`Transpose` into heads, a scaled and
//! masked `Softmax`, `Transpose`/`Reshape` back.
//!
//! `cargo run --example gpt -- --layers 48 --hidden 8192 --heads 64 -o gpt.onnx` writes one.

use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
use onnx_protobuf::type_proto::{Tensor, Value as TypeValue};
use onnx_protobuf::{
    AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// The shape of a GPT decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptSpec {
    /// Transformer layers (blocks).
    pub layers: u64,
    /// Hidden size `h`.
    pub hidden: u64,
    /// Attention heads (divides `hidden`).
    pub heads: u64,
    /// Sequence length `s`.
    pub sequence: u64,
    /// Rows of the learned position table (Megatron: `s`; 0: none).
    pub positions: u64,
    /// Vocabulary `V`.
    pub vocabulary: u64,
    /// The MLP's inner size (Megatron: `4h`).
    pub ffn: u64,
    /// Whether the LM head reuses the token embedding (Megatron's default).
    pub tied: bool,
    /// Megatron's dropout (kept in training): on the embeddings, on the attention
    /// probabilities, and before each residual add.
    pub dropout: bool,
}

impl GptSpec {
    /// Megatron-LM's GPT: `ffn = 4h`, tied embeddings.
    pub fn megatron(layers: u64, hidden: u64, heads: u64, sequence: u64, vocabulary: u64) -> Self {
        GptSpec {
            layers,
            hidden,
            heads,
            sequence,
            positions: sequence,
            vocabulary,
            ffn: 4 * hidden,
            tied: true,
            dropout: true,
        }
    }

    /// One block's parameters: attention `4h² + 4h`, MLP `2hf + f + h`, two LayerNorms
    /// `4h`.
    pub fn block_params(&self) -> u64 {
        let (h, f) = (self.hidden, self.ffn);
        4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    }

    /// The token and position embeddings' parameters: `(V + positions)h`.
    pub fn embedding_params(&self) -> u64 {
        (self.vocabulary + self.positions) * self.hidden
    }

    /// The final LayerNorm `2h` and an untied head `Vh`.
    pub fn head_params(&self) -> u64 {
        2 * self.hidden
            + if self.tied {
                0
            } else {
                self.vocabulary * self.hidden
            }
    }

    /// All parameters. With `f = 4h`, `s` positions and a tied head this is Megatron's
    /// `12lh²(1 + 13/12h + (V+s)/12lh)` plus the final LayerNorm.
    pub fn params(&self) -> u64 {
        self.layers * self.block_params() + self.embedding_params() + self.head_params()
    }

    /// Checks that the shape describes a model (non-zero sizes, heads dividing hidden).
    ///
    /// # Errors
    /// The first field at fault.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("sequence", self.sequence),
            ("positions", self.positions),
            ("vocabulary", self.vocabulary),
            ("ffn", self.ffn),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.positions < self.sequence {
            return Err(format!(
                "positions {} cannot cover the sequence {}",
                self.positions, self.sequence
            ));
        }
        if self.hidden % self.heads != 0 {
            return Err(format!(
                "hidden {} is not a multiple of heads {}",
                self.hidden, self.heads
            ));
        }
        Ok(())
    }
}

/// The ONNX bytes of a structure-only GPT of shape `spec`, input `input_ids [batch, s]`,
/// output `logits [batch, s, V]`.
///
/// # Errors
/// An invalid `spec` (see [`GptSpec::validate`]).
pub fn gpt(spec: &GptSpec) -> Result<Vec<u8>, String> {
    spec.validate()?;
    let (h, a, s, v, f) = (
        spec.hidden as i64,
        spec.heads as i64,
        spec.sequence as i64,
        spec.vocabulary as i64,
        spec.ffn as i64,
    );
    let mut b = Builder::default();
    b.input("input_ids", 7, &[None, Some(s)]);
    b.external("wte", &[v, h]);
    b.external("wpe", &[spec.positions as i64, h]);
    b.ints("position_ids", &[s], &(0..s).collect::<Vec<_>>());
    b.ints("qkv_sizes", &[3], &[h, h, h]);
    b.ints("heads_shape", &[4], &[0, s, a, h / a]);
    b.ints("hidden_shape", &[3], &[0, s, h]);
    // Constants, not weights: 1/√(h/a), and a mask that hides later positions (−10⁴, as
    // Megatron's fused kernel fills them).
    b.constant("attention_scale", &[], &[1.0 / ((h / a) as f32).sqrt()]);
    let mask: Vec<f32> = (0..s * s)
        .map(|k| if k % s > k / s { -1.0e4 } else { 0.0 })
        .collect();
    b.constant("causal_mask", &[s, s], &mask);
    if spec.dropout {
        b.constant("dropout_ratio", &[], &[0.1]);
        b.scalar("dropout_training", 9, |t| t.int32_data = vec![1]);
    }
    // `input`, or its dropout (Megatron's p = 0.1, in training) named `name`.
    let dropout = |b: &mut Builder, name: &str, input: &str| -> String {
        if !spec.dropout {
            return input.to_owned();
        }
        let out = format!("{name}.out");
        b.node(
            "Dropout",
            name,
            &[input, "dropout_ratio", "dropout_training"],
            &[&out],
            &[],
        );
        out
    };
    b.node(
        "Gather",
        "embed_tokens",
        &["wte", "input_ids"],
        &["tokens"],
        &[],
    );
    b.node(
        "Gather",
        "embed_positions",
        &["wpe", "position_ids"],
        &["positions"],
        &[],
    );
    b.node("Add", "embed", &["tokens", "positions"], &["embedded"], &[]);
    let mut x = dropout(&mut b, "embed.dropout", "embedded");
    for i in 0..spec.layers {
        let p = |name: &str| format!("h.{i}.{name}");
        for w in ["ln_1", "ln_2"] {
            b.external(&p(&format!("{w}.weight")), &[h]);
            b.external(&p(&format!("{w}.bias")), &[h]);
        }
        for (w, rows, cols) in [
            ("attn.qkv", h, 3 * h),
            ("attn.proj", h, h),
            ("mlp.fc", h, f),
            ("mlp.proj", f, h),
        ] {
            b.external(&p(&format!("{w}.weight")), &[rows, cols]);
            b.external(&p(&format!("{w}.bias")), &[cols]);
        }
        let ln = |b: &mut Builder, name: &str, input: &str| {
            b.node(
                "LayerNormalization",
                &p(name),
                &[
                    input,
                    &p(&format!("{name}.weight")),
                    &p(&format!("{name}.bias")),
                ],
                &[&p(&format!("{name}.out"))],
                &[Attr::Int("axis", -1)],
            );
        };
        let linear = |b: &mut Builder, name: &str, input: &str| {
            b.node(
                "MatMul",
                &p(&format!("{name}.matmul")),
                &[input, &p(&format!("{name}.weight"))],
                &[&p(&format!("{name}.mm"))],
                &[],
            );
            b.node(
                "Add",
                &p(name),
                &[&p(&format!("{name}.mm")), &p(&format!("{name}.bias"))],
                &[&p(&format!("{name}.out"))],
                &[],
            );
        };
        ln(&mut b, "ln_1", &x);
        linear(&mut b, "attn.qkv", &p("ln_1.out"));
        b.node(
            "Split",
            &p("attn.split"),
            &[&p("attn.qkv.out"), "qkv_sizes"],
            &[&p("q"), &p("k"), &p("v")],
            &[Attr::Int("axis", 2)],
        );
        for (t, perm) in [
            ("q", [0, 2, 1, 3]),
            ("k", [0, 2, 3, 1]),
            ("v", [0, 2, 1, 3]),
        ] {
            b.node(
                "Reshape",
                &p(&format!("attn.{t}_heads")),
                &[&p(t), "heads_shape"],
                &[&p(&format!("{t}4"))],
                &[],
            );
            b.node(
                "Transpose",
                &p(&format!("attn.{t}_transpose")),
                &[&p(&format!("{t}4"))],
                &[&p(&format!("{t}t"))],
                &[Attr::Ints("perm", perm.to_vec())],
            );
        }
        b.node(
            "MatMul",
            &p("attn.scores"),
            &[&p("qt"), &p("kt")],
            &[&p("scores")],
            &[],
        );
        b.node(
            "Mul",
            &p("attn.scale"),
            &[&p("scores"), "attention_scale"],
            &[&p("scaled")],
            &[],
        );
        b.node(
            "Add",
            &p("attn.mask"),
            &[&p("scaled"), "causal_mask"],
            &[&p("masked")],
            &[],
        );
        b.node(
            "Softmax",
            &p("attn.softmax"),
            &[&p("masked")],
            &[&p("probs")],
            &[Attr::Int("axis", -1)],
        );
        let probs = dropout(&mut b, &p("attn.dropout"), &p("probs"));
        b.node(
            "MatMul",
            &p("attn.context"),
            &[&probs, &p("vt")],
            &[&p("ctx")],
            &[],
        );
        b.node(
            "Transpose",
            &p("attn.merge_transpose"),
            &[&p("ctx")],
            &[&p("ctx_t")],
            &[Attr::Ints("perm", vec![0, 2, 1, 3])],
        );
        b.node(
            "Reshape",
            &p("attn.merge_heads"),
            &[&p("ctx_t"), "hidden_shape"],
            &[&p("ctx_h")],
            &[],
        );
        linear(&mut b, "attn.proj", &p("ctx_h"));
        let attended = dropout(&mut b, &p("attn.proj.dropout"), &p("attn.proj.out"));
        b.node("Add", &p("residual_1"), &[&x, &attended], &[&p("x1")], &[]);
        ln(&mut b, "ln_2", &p("x1"));
        linear(&mut b, "mlp.fc", &p("ln_2.out"));
        b.node(
            "Gelu",
            &p("mlp.gelu"),
            &[&p("mlp.fc.out")],
            &[&p("gelu")],
            &[Attr::Str("approximate", "tanh")],
        );
        linear(&mut b, "mlp.proj", &p("gelu"));
        let mixed = dropout(&mut b, &p("mlp.proj.dropout"), &p("mlp.proj.out"));
        let next = format!("x{}", i + 1);
        b.node("Add", &p("residual_2"), &[&p("x1"), &mixed], &[&next], &[]);
        x = next;
    }
    b.external("ln_f.weight", &[h]);
    b.external("ln_f.bias", &[h]);
    b.node(
        "LayerNormalization",
        "ln_f",
        &[&x, "ln_f.weight", "ln_f.bias"],
        &["final"],
        &[Attr::Int("axis", -1)],
    );
    if spec.tied {
        b.node(
            "Transpose",
            "lm_head.transpose",
            &["wte"],
            &["wte_t"],
            &[Attr::Ints("perm", vec![1, 0])],
        );
        b.node("MatMul", "lm_head", &["final", "wte_t"], &["logits"], &[]);
    } else {
        b.external("lm_head.weight", &[h, v]);
        b.node(
            "MatMul",
            "lm_head",
            &["final", "lm_head.weight"],
            &["logits"],
            &[],
        );
    }
    b.output("logits");
    let mut m = ModelProto::new();
    m.ir_version = 10;
    m.producer_name = "ralpc".into();
    let mut opset = OperatorSetIdProto::new();
    opset.version = 20;
    m.opset_import.push(opset);
    m.graph = Some(b.graph).into();
    m.write_to_bytes()
        .map_err(|e| format!("cannot serialize the model: {e}"))
}

enum Attr<'a> {
    Int(&'a str, i64),
    Ints(&'a str, Vec<i64>),
    Str(&'a str, &'a str),
}

#[derive(Default)]
struct Builder {
    graph: GraphProto,
}

impl Builder {
    fn input(&mut self, name: &str, elem_type: i32, dims: &[Option<i64>]) {
        let mut shape = TensorShapeProto::new();
        for d in dims {
            let mut dim = Dimension::new();
            dim.value = Some(match d {
                None => DimValue::DimParam("batch".into()),
                Some(v) => DimValue::DimValue(*v),
            });
            shape.dim.push(dim);
        }
        let mut tensor = Tensor::new();
        tensor.elem_type = elem_type;
        tensor.shape = Some(shape).into();
        let mut ty = TypeProto::new();
        ty.value = Some(TypeValue::TensorType(tensor));
        let mut info = ValueInfoProto::new();
        info.name = name.into();
        info.type_ = Some(ty).into();
        self.graph.input.push(info);
    }

    fn output(&mut self, name: &str) {
        let mut info = ValueInfoProto::new();
        info.name = name.into();
        self.graph.output.push(info);
    }

    /// A float weight stored as external data that is never written.
    fn external(&mut self, name: &str, dims: &[i64]) {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = 1;
        t.dims = dims.to_vec();
        t.data_location = DataLocation::EXTERNAL.into();
        let mut location = StringStringEntryProto::new();
        location.key = "location".into();
        location.value = "model.onnx.data".into();
        t.external_data.push(location);
        self.graph.initializer.push(t);
    }

    /// A float32 `Constant` node named `name` writing `name`, its elements stored raw.
    fn constant(&mut self, name: &str, dims: &[i64], values: &[f32]) {
        let mut t = TensorProto::new();
        t.data_type = 1;
        t.dims = dims.to_vec();
        t.raw_data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut a = AttributeProto::new();
        a.name = "value".into();
        a.type_ = onnx_protobuf::attribute_proto::AttributeType::TENSOR.into();
        a.t = Some(t).into();
        let mut n = NodeProto::new();
        n.op_type = "Constant".into();
        n.name = name.into();
        n.output = vec![name.into()];
        n.attribute.push(a);
        self.graph.node.push(n);
    }

    /// A scalar of ONNX type `data_type` stored inline, its value set by `fill`.
    fn scalar(&mut self, name: &str, data_type: i32, fill: impl FnOnce(&mut TensorProto)) {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = data_type;
        fill(&mut t);
        self.graph.initializer.push(t);
    }

    /// An int64 table stored inline.
    fn ints(&mut self, name: &str, dims: &[i64], values: &[i64]) {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = 7;
        t.dims = dims.to_vec();
        t.int64_data = values.to_vec();
        self.graph.initializer.push(t);
    }

    fn node(&mut self, op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: &[Attr]) {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.name = name.into();
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = outputs.iter().map(|s| s.to_string()).collect();
        for attr in attrs {
            let mut a = AttributeProto::new();
            match attr {
                Attr::Int(name, v) => {
                    a.name = (*name).into();
                    a.type_ = onnx_protobuf::attribute_proto::AttributeType::INT.into();
                    a.i = *v;
                }
                Attr::Ints(name, v) => {
                    a.name = (*name).into();
                    a.type_ = onnx_protobuf::attribute_proto::AttributeType::INTS.into();
                    a.ints.clone_from(v);
                }
                Attr::Str(name, v) => {
                    a.name = (*name).into();
                    a.type_ = onnx_protobuf::attribute_proto::AttributeType::STRING.into();
                    a.s = v.as_bytes().to_vec();
                }
            }
            n.attribute.push(a);
        }
        self.graph.node.push(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accounted(spec: &GptSpec, batch: u64) -> crate::Accounting {
        let bytes = gpt(spec).expect("generates");
        let path = std::path::Path::new("gpt.onnx");
        let mut model = crate::onnx::import_bytes(&bytes, path, None).expect("imports");
        crate::bind(
            &mut model.graph,
            &crate::Bindings {
                batch: Some(batch),
                ..Default::default()
            },
        )
        .expect("binds");
        let info = crate::verify(&model.graph).expect("verifies");
        crate::account(&model.graph, &info).expect("accounts")
    }

    #[test]
    fn generated_gpt_has_the_formula_parameters_and_flops() {
        for tied in [true, false] {
            let spec = GptSpec {
                tied,
                ..GptSpec::megatron(3, 64, 4, 16, 100)
            };
            let acc = accounted(&spec, 2);
            // The attention scale, the causal mask and the dropout ratio are constants, not
            // parameters.
            assert_eq!(acc.params, spec.params(), "tied: {tied}");
            // Forward MACs: per layer 12bsh² + 2bs²h (QKV, projection, MLP; scores and
            // context), plus the head bshV.
            let (b, s, h, v, l) = (2, 16, 64, 100, 3);
            let macs = l * (12 * b * s * h * h + 2 * b * s * s * h) + b * s * h * v;
            assert_eq!(acc.macs, macs);
        }
    }

    #[test]
    fn megatron_table_sizes() {
        // Narayanan et al. (SC'21) Table 1, as published (rounded: 1.652 B prints as 1.7 B).
        for (l, h, a, published, within) in [
            (24, 2304, 24, 1.7e9, 0.05e9),
            (48, 8192, 64, 39.1e9, 0.05e9),
            (128, 25600, 160, 1008e9, 0.5e9),
        ] {
            let p = GptSpec::megatron(l, h, a, 2048, 51200).params() as f64;
            assert!((p - published).abs() <= within, "{l}x{h}: {p}");
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let spec = GptSpec::megatron(2, 64, 5, 16, 100);
        assert!(gpt(&spec)
            .unwrap_err()
            .contains("not a multiple of heads 5"));
        let spec = GptSpec::megatron(0, 64, 4, 16, 100);
        assert!(gpt(&spec)
            .unwrap_err()
            .contains("layers must be at least 1"));
    }
}
