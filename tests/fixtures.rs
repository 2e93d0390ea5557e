//! Every fixture against ground truth computed outside ralpc: parameter counts from the
//! `onnx` package (`fixtures/onnx/expected.json`, written by `expected.py`), MACs from
//! torchvision's published table, and the dynamo exporter's own `value_info` shapes.

mod common;

use std::collections::BTreeMap;

use ralpc_ir::{Op, Shape};
use serde_json::Value;

fn expected() -> BTreeMap<String, Value> {
    let text =
        std::fs::read_to_string(common::fixture("onnx/expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("expected.json parses")
}

#[test]
fn every_fixture_has_ground_truth() {
    let truth = expected();
    for case in common::onnx_cases() {
        assert!(
            truth.contains_key(&case),
            "{case} missing from expected.json: run fixtures/onnx/expected.py"
        );
    }
}

#[test]
fn params_equal_the_files_float_initializers_and_macs_match_published_figures() {
    for (case, truth) in expected() {
        let (model, _, acc) = common::account(&case, Some(1));
        assert_eq!(
            acc.params,
            truth["params"].as_u64().unwrap(),
            "{case}: params"
        );
        assert_eq!(
            model.opset,
            truth["opset"].as_i64().unwrap(),
            "{case}: opset"
        );
        assert_eq!(
            model.ir_version,
            truth["ir_version"].as_i64().unwrap(),
            "{case}: IR version"
        );
        if let Some(gmacs) = truth["published_gmacs"].as_f64() {
            let ours = acc.macs as f64 / 1e9;
            let err = (ours / gmacs - 1.0).abs();
            assert!(
                err < 0.03,
                "{case}: {ours:.3} GMACs vs published {gmacs} ({:.1}% off)",
                err * 100.0
            );
        }
    }
}

#[test]
fn macs_and_activations_scale_with_the_bound_batch() {
    // Covers both symbolic-batch exports and re-batching of fixed-batch ones.
    for case in common::onnx_cases() {
        let (_, _, one) = common::account(&case, Some(1));
        let (_, _, eight) = common::account(&case, Some(8));
        assert_eq!(eight.macs, 8 * one.macs, "{case}: MACs at batch 8");
        assert_eq!(
            eight.params, one.params,
            "{case}: params do not depend on the batch"
        );
        // Constant-shaped layers (GPT-2's causal mask) do not scale; everything else does.
        assert!(
            eight.activation_bytes > 7 * one.activation_bytes,
            "{case}: activations at batch 8"
        );
    }
}

#[test]
fn dynamo_value_info_agrees_with_inference() {
    // The dynamo exporter writes a shape for every intermediate value; ours must agree on
    // every dimension (symbolic ones by name).
    let mut checked = 0;
    for case in [
        "wide_resnet101_2",
        "mobilenet_v2",
        "convnext_tiny",
        "vit_b_16",
        "gpt2",
    ] {
        let mut model =
            ralpc_ir::onnx::import(&common::fixture(&format!("onnx/{case}/model.onnx"))).unwrap();
        ralpc_ir::bind(&mut model.graph, &Default::default()).unwrap();
        let info = ralpc_ir::verify(&model.graph).unwrap_or_else(|e| panic!("{case}: {e}"));
        for v in model.graph.value_ids() {
            let value = model.graph.value(v);
            let Some(declared) = value.declared.as_ref().and_then(|t| t.shape.as_ref()) else {
                continue;
            };
            let inferred = &info.ty(v).shape;
            assert_eq!(
                declared.to_string(),
                inferred.to_string(),
                "{case}: value '{}'",
                value.name
            );
            assert_eq!(
                value.declared.as_ref().unwrap().dtype,
                info.ty(v).dtype,
                "{case}: dtype of '{}'",
                value.name
            );
            checked += 1;
        }
    }
    assert!(
        checked > 1000,
        "only {checked} values carried declared shapes"
    );
}

#[test]
fn symbolic_batch_survives_verification() {
    let mut model = ralpc_ir::onnx::import(&common::fixture("onnx/resnet50/model.onnx")).unwrap();
    ralpc_ir::bind(&mut model.graph, &Default::default()).unwrap();
    let info = ralpc_ir::verify(&model.graph).unwrap();
    let out = model.graph.outputs()[0];
    assert_eq!(info.ty(out).shape.to_string(), "[batch,1000]");
    // Accounting needs sizes: it names the node and the dimension.
    let err = ralpc_ir::account(&model.graph, &info)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unbound dimension 'batch'"), "{err}");
}

#[test]
fn fixed_batch_exports_are_rebatched() {
    for case in ["vgg16", "inception_v3", "gpt2_torchscript", "mobilenet_v2"] {
        let (model, info, _) = common::account(case, Some(16));
        assert!(
            model.graph.rebatch().is_some(),
            "{case} was exported with a fixed batch"
        );
        let out = model.graph.outputs()[0];
        assert_eq!(info.ty(out).shape.dims()[0].as_known(), Some(16), "{case}");
    }
}

#[test]
fn structure_only_models_never_read_weights() {
    // The committed fixtures have no .data files: every weight is external and absent.
    let (model, _, acc) = common::account("vgg16", Some(1));
    let (mut external, mut large) = (0, 0);
    for n in model.graph.node_ids() {
        if let Op::Constant { tensor, .. } = &model.graph.node(n).op {
            let is_external = matches!(tensor.storage, ralpc_ir::Storage::External(_));
            external += usize::from(is_external);
            // The generator's threshold is about 1 KiB: everything larger is external.
            large += usize::from(tensor.size_bytes().unwrap_or(0) > 4096);
            assert!(is_external || tensor.size_bytes().unwrap_or(0) <= 4096);
        }
    }
    assert!(external >= large);
    assert!(
        external >= 16,
        "VGG16's 16 weight matrices are external, found {external}"
    );
    assert!(!common::fixture("onnx/vgg16/model.onnx.data").exists());
    // torchvision's published count: the ten biases the exporter merged count apart.
    assert_eq!(acc.params, 138_357_544);
}

#[test]
fn text_form_of_a_small_model() {
    let (model, info, _) = common::account("light_bvlc_alexnet", Some(1));
    insta::assert_snapshot!(ralpc_ir::text::print(&model.graph, &info));
}

#[test]
fn shapes_print_symbolically() {
    assert_eq!(Shape::known(&[2, 3]).to_string(), "[2,3]");
}

#[test]
fn totals_of_every_fixture() {
    // One line per fixture at batch 1: a regression anywhere in import, inference or
    // accounting shows up here.
    let mut out = String::from("case: layers params macs flops activation_bytes weight_bytes\n");
    for case in common::onnx_cases() {
        let (_, _, a) = common::account(&case, Some(1));
        out += &format!(
            "{case}: {} {} {} {} {} {}\n",
            a.layers.len(),
            a.params,
            a.macs,
            a.flops,
            a.activation_bytes,
            a.weight_bytes
        );
    }
    insta::assert_snapshot!(out);
}
