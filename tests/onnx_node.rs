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

/// Every operator of every node test that imports walks through [`ralpc_ir::Op::facts`],
/// and its facts agree with each other and with the accounting: no class without its work,
/// no computing op counted at zero FLOPs, views that move nothing.
#[test]
fn every_imported_op_has_facts_that_agree() {
    use ralpc_ir::{Elements, Joins, Op, OpClass, Work};
    let dir = common::fixture("onnx-node");
    let required = std::fs::read_to_string(common::fixture("onnx-node-tests.txt"))
        .expect("fixtures/onnx-node-tests.txt");
    let mut seen: std::collections::BTreeMap<&str, std::collections::BTreeSet<String>> =
        Default::default();
    let mut problems = Vec::new();
    let mut uncounted = Vec::new();
    for name in required.lines() {
        let mut model = ralpc_ir::onnx::import(&dir.join(format!("{name}.onnx")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        ralpc_ir::bind(&mut model.graph, &Default::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let graph = &model.graph;
        let info = ralpc_ir::verify(graph).unwrap_or_else(|e| panic!("{name}: {e}"));
        let counted = match ralpc_ir::account(graph, &info) {
            Ok(counted) => Some(counted),
            Err(e) => {
                uncounted.push(format!("{name}: {e}"));
                None
            }
        };
        for &n in info.order() {
            let op = &graph.node(n).op;
            let facts = op.facts();
            seen.entry(op.name()).or_default().insert(described(&facts));
            let mut wrong = |what: &str| problems.push(format!("{name}: {}: {what}", op.name()));
            if (facts.class == OpClass::Source) != matches!(op, Op::Input | Op::Constant { .. }) {
                wrong("only inputs and constants are sources");
            }
            if (facts.elements == Elements::Alias) != (facts.joins == Joins::View) {
                wrong("a view joins its producer as a view, and only a view does");
            }
            if facts.elements == Elements::Alias
                && (facts.work != Work::None || facts.reads != ralpc_ir::BackwardReads::SHAPES)
            {
                wrong("a view computes nothing and its backward reads nothing");
            }
            let computes = !matches!(facts.work, Work::None);
            match facts.class {
                OpClass::Conv | OpClass::Dense | OpClass::Recurrent
                    if !matches!(facts.work, Work::Product(_)) =>
                {
                    wrong("a product class without a product's work")
                }
                OpClass::Elementwise | OpClass::Norm | OpClass::Softmax if !computes => {
                    wrong("an arithmetic class with no work")
                }
                OpClass::Shape | OpClass::Source if computes => wrong("data movement with work"),
                _ => {}
            }
            if matches!(facts.joins, Joins::Activation | Joins::Arithmetic)
                && facts.class != OpClass::Elementwise
            {
                wrong("only elementwise ops join as activations or arithmetic");
            }
            // A computing op whose output has elements is counted at more than zero.
            let layer = counted
                .as_ref()
                .and_then(|c| c.layers.iter().find(|l| l.node == n));
            let operands = graph.node(n).inputs.iter().flatten().count();
            let zero_by_design = match facts.work {
                Work::PerOutput(0) | Work::PerInput(0) => true,
                Work::PerExtraOperand => operands < 2,
                _ => false,
            };
            if let Some(layer) = layer {
                let empty_input = graph
                    .node(n)
                    .inputs
                    .iter()
                    .flatten()
                    .any(|&v| info.ty(v).shape.known_numel() == Some(0));
                if computes
                    && !zero_by_design
                    && !empty_input
                    && layer.activation_bytes > 0
                    && layer.macs == 0
                    && layer.flops == 0
                {
                    wrong("counted at zero FLOPs");
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(seen.len() >= 100, "only {} operators walked", seen.len());
    // Accounting needs every shape bound; the node tests that leave one symbolic are few.
    assert!(uncounted.len() <= 5, "{}", uncounted.join("\n"));
    // Every operator's facts, as the node tests meet them, pinned in a reviewed file.
    let table: String = seen
        .iter()
        .map(|(op, facts)| {
            format!(
                "{op}: {}\n",
                facts.iter().cloned().collect::<Vec<_>>().join(" | ")
            )
        })
        .collect();
    let pinned = common::fixture("op-facts.txt");
    if std::env::var_os("RALPC_BLESS").is_some() {
        std::fs::write(&pinned, &table).expect("write fixtures/op-facts.txt");
        return;
    }
    let want = std::fs::read_to_string(&pinned).expect("fixtures/op-facts.txt");
    let changed: Vec<String> = table
        .lines()
        .filter(|l| !want.lines().any(|w| w == *l))
        .map(|l| format!("now  {l}"))
        .chain(
            want.lines()
                .filter(|w| !table.lines().any(|l| l == *w))
                .map(|w| format!("was  {w}")),
        )
        .collect();
    assert!(
        changed.is_empty(),
        "operators' facts changed; review and rerun with RALPC_BLESS=1:\n{}",
        changed.join("\n")
    );
}

/// One line of an operator's facts: class, work, what its backward reads (input slots
/// 0–3, `4+` for any later one, `y` for its outputs), saves, joins, elements.
fn described(f: &ralpc_ir::OpFacts<'_>) -> String {
    use ralpc_ir::{Product, Work};
    let work = match f.work {
        Work::Product(p) => format!(
            "{}{}",
            match p {
                Product::Conv => "Conv",
                Product::ConvTranspose => "ConvTranspose",
                Product::Gemm { trans_a: false } => "Gemm",
                Product::Gemm { trans_a: true } => "GemmTransA",
                Product::MatMul => "MatMul",
                Product::Recurrent(_) => "Recurrent",
                Product::Einsum(_) => "Einsum",
                Product::Stft { .. } => "Stft",
            },
            if p.makes_weight_gradient() { "+dW" } else { "" }
        ),
        other => format!("{other:?}"),
    };
    let mut reads: Vec<String> = (0..4)
        .filter(|&s| f.reads.input(s))
        .map(|s| s.to_string())
        .collect();
    if f.reads.input(63) {
        reads.push("4+".into());
    }
    if f.reads.outputs {
        reads.push("y".into());
    }
    format!(
        "{:?} {work} reads[{}] {:?} {:?} {:?}",
        f.class,
        reads.join(","),
        f.saves,
        f.joins,
        f.elements
    )
}
