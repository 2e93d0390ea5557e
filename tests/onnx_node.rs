//! ONNX backend node tests (from onnx 1.22.0, `fixtures/onnx-node/`) as the conformance
//! suite of shape inference: each model declares its outputs' shapes, and `verify` fails on
//! any disagreement. `fixtures/onnx-node-tests.txt` lists the tests that must pass;
//! `RALPC_BLESS=1 cargo test --test onnx_node` rewrites it.

mod common;

fn passes(path: &std::path::Path) -> Result<(), String> {
    let mut model = ralpc_ir::onnx::import(path).map_err(|e| e.to_string())?;
    ralpc_ir::bind(&mut model.graph, &Default::default()).map_err(|e| e.to_string())?;
    let info = ralpc_ir::verify(&model.graph).map_err(|e| e.to_string())?;
    // Declared output shapes are checked by `verify`; check every output was fully inferred.
    for &out in model.graph.outputs() {
        let declared = model
            .graph
            .value(out)
            .declared
            .as_ref()
            .and_then(|t| t.shape.clone());
        if declared
            .as_ref()
            .is_some_and(|d| d.to_string() != info.ty(out).shape.to_string())
        {
            return Err(format!(
                "output {}: declared {:?}, inferred {}",
                model.graph.value(out).name,
                declared,
                info.ty(out).shape
            ));
        }
    }
    Ok(())
}

#[test]
fn onnx_node_tests_infer_the_declared_shapes() {
    let dir = common::fixture("onnx-node");
    let names = common::names_with_suffix(&dir, ".onnx");
    let mut passing = Vec::new();
    let mut failing = Vec::new();
    for name in &names {
        match passes(&dir.join(format!("{name}.onnx"))) {
            Ok(()) => passing.push(name.clone()),
            Err(e) => failing.push(format!("{name}: {e}")),
        }
    }
    let manifest = common::fixture("onnx-node-tests.txt");
    if std::env::var_os("RALPC_BLESS").is_some() {
        std::fs::write(&manifest, passing.join("\n") + "\n").expect("write manifest");
        eprintln!(
            "{} of {} pass; failing:\n{}",
            passing.len(),
            names.len(),
            failing.join("\n")
        );
        return;
    }
    let required = std::fs::read_to_string(&manifest).expect("fixtures/onnx-node-tests.txt");
    let missing: Vec<&str> = required
        .lines()
        .filter(|t| !passing.iter().any(|p| p == t))
        .collect();
    assert!(
        missing.is_empty(),
        "node tests that must pass but fail:\n{}\n\nall failures:\n{}",
        missing.join("\n"),
        failing.join("\n")
    );
    assert!(
        passing.len() >= 300,
        "only {} node tests pass",
        passing.len()
    );
}
