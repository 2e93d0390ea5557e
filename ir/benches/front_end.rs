//! Import + bind + verify + accounting, which must stay linear in model size.
//!
//! `cargo bench -p ralpc-ir --bench front_end` (add `-- --threads 1` for one core).
//! Target: the generated 10,000-node graph under 50 ms on one core.

use std::path::{Path, PathBuf};

use onnx_protobuf::tensor_proto::DataLocation;
use onnx_protobuf::type_proto::{Tensor, Value as TypeValue};
use onnx_protobuf::{
    GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

fn main() {
    divan::main();
}

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/onnx/{case}/model.onnx"))
}

fn front_end(bytes: &[u8], path: &Path) -> u64 {
    let mut model = ralpc_ir::onnx::import_bytes(bytes, path, path.parent()).expect("imports");
    let bindings = ralpc_ir::Bindings {
        batch: Some(32),
        ..Default::default()
    };
    ralpc_ir::bind(&mut model.graph, &bindings).expect("binds");
    let info = ralpc_ir::verify(&model.graph).expect("verifies");
    ralpc_ir::account(&model.graph, &info)
        .expect("accounts")
        .macs
}

fn external(name: &str, dims: &[i64]) -> TensorProto {
    let mut t = TensorProto::new();
    t.name = name.into();
    t.data_type = 1;
    t.dims = dims.to_vec();
    t.data_location = DataLocation::EXTERNAL.into();
    let mut kv = StringStringEntryProto::new();
    kv.key = "location".into();
    kv.value = "weights.bin".into();
    t.external_data.push(kv);
    t
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    let mut n = NodeProto::new();
    n.op_type = op.into();
    n.name = output.into();
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = vec![output.into()];
    n
}

/// A residual MLP of `blocks` × (Gemm, Relu, Add, Sigmoid): 4·blocks nodes, weights as
/// external data (never read), symbolic batch.
fn generated(blocks: usize) -> Vec<u8> {
    let mut g = GraphProto::new();
    let mut input = ValueInfoProto::new();
    input.name = "x".into();
    let mut shape = TensorShapeProto::new();
    for d in [None, Some(256)] {
        let mut dim = onnx_protobuf::tensor_shape_proto::Dimension::new();
        dim.value = Some(match d {
            None => onnx_protobuf::tensor_shape_proto::dimension::Value::DimParam("batch".into()),
            Some(v) => onnx_protobuf::tensor_shape_proto::dimension::Value::DimValue(v),
        });
        shape.dim.push(dim);
    }
    let mut tt = Tensor::new();
    tt.elem_type = 1;
    tt.shape = Some(shape).into();
    let mut ty = TypeProto::new();
    ty.value = Some(TypeValue::TensorType(tt));
    input.type_ = Some(ty).into();
    g.input.push(input);
    let mut prev = "x".to_string();
    for i in 0..blocks {
        let (w, b) = (format!("w{i}"), format!("b{i}"));
        g.initializer.push(external(&w, &[256, 256]));
        g.initializer.push(external(&b, &[256]));
        g.node
            .push(node("Gemm", &[&prev, &w, &b], &format!("gemm{i}")));
        g.node
            .push(node("Relu", &[&format!("gemm{i}")], &format!("relu{i}")));
        g.node.push(node(
            "Add",
            &[&format!("relu{i}"), &prev],
            &format!("add{i}"),
        ));
        g.node
            .push(node("Sigmoid", &[&format!("add{i}")], &format!("act{i}")));
        prev = format!("act{i}");
    }
    let mut out = ValueInfoProto::new();
    out.name = prev;
    g.output.push(out);
    let mut m = ModelProto::new();
    m.ir_version = 8;
    let mut opset = OperatorSetIdProto::new();
    opset.version = 17;
    m.opset_import.push(opset);
    m.graph = Some(g).into();
    m.write_to_bytes().expect("serializes")
}

#[divan::bench(args = ["vgg16", "resnet50", "densenet121", "vit_b_16"])]
fn fixture_model(bencher: divan::Bencher, case: &str) {
    let path = fixture(case);
    let bytes = std::fs::read(&path).expect("fixture");
    bencher.bench(|| front_end(divan::black_box(&bytes), &path));
}

#[divan::bench(args = [1_000, 10_000, 40_000])]
fn generated_graph(bencher: divan::Bencher, nodes: usize) {
    let bytes = generated(nodes / 4);
    let path = Path::new("generated.onnx");
    bencher.bench(|| front_end(divan::black_box(&bytes), path));
}
