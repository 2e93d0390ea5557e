//! One test per rewrite rule (passes/RULES.md), on the tiny models of fixtures/rules/.

mod common;

use ralpc_passes::rewrite::{rewrite, Rewritten};

fn run(name: &str) -> Rewritten {
    let (graph, info) = common::load(&format!("fixtures/rules/{name}.onnx"), 2);
    let r = rewrite(&graph, &info, Default::default());
    assert_eq!(r.report.stop_reason, "saturated", "{name}");
    r
}

fn ops(r: &Rewritten) -> Vec<&str> {
    r.units
        .iter()
        .filter(|u| !u.weight_only)
        .map(|u| u.op.as_str())
        .collect()
}

fn applied(r: &Rewritten, rule: &str) -> usize {
    r.report
        .applied
        .iter()
        .find(|(n, _)| n == rule)
        .map_or(0, |(_, c)| *c)
}

#[test]
fn fuse_identity_then_activation() {
    let r = run("conv_identity_relu");
    // The identity of a computed value joins its producer as a view (it moves no data),
    // then the activation joins them: one unit, every op still run.
    assert_eq!(ops(&r), ["Conv+Identity+Relu"]);
    assert!(applied(&r, "fuse-view") > 0);
    assert!(applied(&r, "fuse-activation") > 0);
    assert_eq!(r.units[0].members.len(), 3);
}

#[test]
fn gemm_from_matmul_add() {
    let r = run("matmul_add_relu");
    assert_eq!(ops(&r), ["Gemm+Relu"]);
    assert!(applied(&r, "gemm-from-matmul-add") > 0);
    let unit = &r.units[0];
    assert_eq!(unit.members.len(), 3, "MatMul, Add and Relu all still run");
}

#[test]
fn gemm_from_add_matmul() {
    let r = run("add_matmul");
    assert_eq!(ops(&r), ["Gemm"]);
    assert!(applied(&r, "gemm-from-add-matmul") > 0);
}

#[test]
fn fuse_bias_into_batched_matmul() {
    // A 3-D MatMul is no Gemm: the bias fuses instead.
    let r = run("matmul3d_bias");
    assert_eq!(ops(&r), ["MatMul+Add"]);
    assert_eq!(applied(&r, "gemm-from-matmul-add"), 0);
    assert!(applied(&r, "fuse-bias") > 0);
}

#[test]
fn fuse_elementwise_residual_but_not_a_shared_producer() {
    let r = run("residual");
    // c1 is read by conv2 and by the add: it stays a unit of its own.
    assert_eq!(ops(&r), ["Conv", "Conv+Add+Relu"]);
    assert!(applied(&r, "fuse-elementwise") > 0);
    let fused = &r.units[1];
    assert_eq!(
        fused.inputs.len(),
        2,
        "c1 (as conv input and residual, once) and w2"
    );
}

#[test]
fn training_semantics_are_kept() {
    let r = run("conv_bn_relu_dropout");
    // BatchNormalization stays a layer of its own; Dropout is fused, not removed.
    assert_eq!(ops(&r), ["Conv", "BatchNormalization+Relu+Dropout"]);
    assert!(applied(&r, "fuse-dropout") > 0);
}

#[test]
fn fuse_view_and_fold_shape_arithmetic() {
    let r = run("pool_reshape_gemm");
    // Shape/Gather/Unsqueeze/Concat fold into a constant; the reshape joins the pool.
    assert_eq!(ops(&r), ["GlobalAveragePool+Reshape", "Gemm"]);
    assert!(applied(&r, "fuse-view") > 0);
    assert_eq!(r.units.iter().map(|u| u.members.len()).sum::<usize>(), 3);
}

#[test]
fn rewriting_is_deterministic() {
    for name in ["residual", "conv_bn_relu_dropout"] {
        let a = run(name);
        let b = run(name);
        assert_eq!(a.units, b.units);
        assert_eq!(a.report, b.report);
    }
}

#[test]
fn tight_limits_are_reported() {
    let (graph, info) = common::load("fixtures/rules/residual.onnx", 2);
    let r = rewrite(
        &graph,
        &info,
        ralpc_passes::rewrite::Limits {
            iterations: 1,
            nodes: 1_000,
        },
    );
    assert_eq!(r.report.stop_reason, "iteration limit (1)");
    // Still a valid cover: every compute node is in exactly one unit.
    let members: usize = r.units.iter().map(|u| u.members.len()).sum();
    assert_eq!(members, 4);
}

/// The Gathers of the attention core of fixture `name`.
fn gathers_in_core(name: &str) -> usize {
    let (graph, info) = common::load(&format!("fixtures/rules/{name}.onnx"), 2);
    let r = rewrite(&graph, &info, Default::default());
    let cores: Vec<_> = r.units.iter().filter(|u| u.op == "Attention").collect();
    assert_eq!(cores.len(), 1, "{name}: one attention core");
    cores[0]
        .members
        .iter()
        .filter(|&&m| graph.node(m).op.name() == "Gather")
        .count()
}

#[test]
fn an_attention_core_takes_in_picks_of_q_k_v_beside_the_head_dimension_only() {
    // BLOOM's `[b, s, heads, 3, d]`: a rank's columns of the fused projection are whole
    // heads, so the picks run on the pieces.
    assert_eq!(gathers_in_core("qkv_picked_beside_heads"), 3);
    // Swin's `qkv[0]` of `[3, b, heads, s, d]`: picked before the heads, so the columns
    // are not cut by heads and the picks stay a layer of their own.
    assert_eq!(gathers_in_core("qkv_picked_before_heads"), 0);
}

/// ONNX's fused `Attention` operator, expanded on import, is one attention core: the
/// planner splits it by heads and prices it as a fused kernel like an exporter's form.
#[test]
fn a_fused_attention_operator_is_one_attention_core() {
    let (graph, info) = common::load("fixtures/train/fused_attention.onnx", 2);
    let r = rewrite(&graph, &info, Default::default());
    let cores: Vec<_> = r.units.iter().filter(|u| u.op == "Attention").collect();
    assert_eq!(cores.len(), 1);
    let ops: Vec<&str> = cores[0]
        .members
        .iter()
        .map(|&m| graph.node(m).op.name())
        .collect();
    for op in ["MatMul", "Softmax"] {
        assert_eq!(
            ops.iter().filter(|&&o| o == op).count(),
            if op == "MatMul" { 2 } else { 1 },
            "{ops:?}"
        );
    }
}
