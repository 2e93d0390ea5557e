use ralpc_ir::{bind, onnx, verify, Bindings};
#[test]
fn scratch() {
    for name in ["vgg16", "resnet50", "gpt2", "gpt2_torchscript", "inception_v3", "densenet121", "vit_b_16"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/onnx/{name}/model.onnx"));
        let mut model = onnx::import(&path).unwrap();
        let b = Bindings { batch: Some(2), ..Default::default() };
        if let Err(e) = bind(&mut model.graph, &b) { println!("{e}"); bind(&mut model.graph, &Default::default()).unwrap(); }
        let info = verify(&model.graph).unwrap();
        let t = std::time::Instant::now();
        let r = ralpc_passes::rewrite::rewrite(&model.graph, &info, Default::default());
        println!("{name}: {} units from {} nodes in {:?}; {:?}", r.units.len(), r.report.ir_nodes, t.elapsed(), r.report);
        let mut ops = std::collections::BTreeMap::<String, usize>::new();
        for u in &r.units { *ops.entry(u.op.clone()).or_default() += 1; }
        println!("  {ops:?}");
    }
}
