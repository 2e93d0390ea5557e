//! A mixture-of-experts MLP written as ONNX: a router, its top-k, and the experts' stacked
//! weights (`[E, h, f]`, as Megatron-Core's grouped GEMM and Hugging Face's gpt-oss store
//! them).
//!
//! ONNX has no dispatch whose sizes depend on the routing, so the block is written in the
//! dense form exporters give when they trace every expert: each expert runs on every token
//! and its output is weighted by the token's gate for it, zero for the experts its top-k did
//! not pick. That computes exactly what a dispatching MoE computes, gradients included (an
//! expert's weights get nothing from the tokens it was not sent). The planner recognizes the
//! block and prices the dispatch instead (`top_k` experts a token, not `E`).

use super::{activate, linear, Attr, Builder, GptSpec, MoeSpec, Router};

/// Writes block `p`'s mixture of experts reading `input` (`[batch, s, h]`), its weights
/// included, and returns its output's name.
pub(super) fn block(
    b: &mut Builder,
    spec: &GptSpec,
    moe: &MoeSpec,
    p: &dyn Fn(&str) -> String,
    input: &str,
) -> String {
    let (h, e) = (spec.hidden as i64, moe.experts as i64);
    let f = moe.expert_ffn as i64;
    let m = |name: &str| p(&format!("moe.{name}"));
    // The weights: the router, the experts' products stacked by expert, the shared experts.
    b.external(&m("router.weight"), &[h, e]);
    if spec.biases {
        b.external(&m("router.bias"), &[e]);
    }
    // A gated MLP's experts have a gate product beside their first.
    let has = |w: &str| w != "gate" || spec.gated_mlp;
    for (w, rows, cols) in [("fc", h, f), ("gate", h, f), ("proj", f, h)] {
        if !has(w) {
            continue;
        }
        b.external(&m(&format!("experts.{w}.weight")), &[e, rows, cols]);
        if spec.biases {
            b.external(&m(&format!("experts.{w}.bias")), &[e, 1, cols]);
        }
    }
    let shared = moe.shared_ffn as i64;
    if shared > 0 {
        for (w, rows, cols) in [("fc", h, shared), ("gate", h, shared), ("proj", shared, h)] {
            if !has(w) {
                continue;
            }
            b.external(&m(&format!("shared.{w}.weight")), &[rows, cols]);
            if spec.biases {
                b.external(&m(&format!("shared.{w}.bias")), &[cols]);
            }
        }
    }
    b.ints(&m("k"), &[1], &[moe.top_k as i64]);
    b.ints(&m("expert_axis"), &[1], &[1]);
    b.ints(&m("last_axis"), &[1], &[-1]);

    // Routing: each token's scores, its top k, their weights normalized to sum to one
    // (Mixtral and Qwen3-MoE renormalize a softmax's top k; DeepSeek-V3 its sigmoids), and
    // the gates `[batch, s, E]`: those weights at the chosen experts, zero elsewhere.
    linear(b, spec, &m("router"), input);
    let scores = m("scores");
    let score = match moe.router {
        Router::Softmax => "Softmax",
        Router::Sigmoid => "Sigmoid",
    };
    let attrs: &[Attr] = match moe.router {
        Router::Softmax => &[Attr::Int("axis", -1)],
        Router::Sigmoid => &[],
    };
    b.node(score, &m("score"), &[&m("router.out")], &[&scores], attrs);
    b.node(
        "TopK",
        &m("top_k"),
        &[&scores, &m("k")],
        &[&m("top_scores"), &m("top_experts")],
        &[Attr::Int("axis", -1)],
    );
    b.node(
        "ReduceSum",
        &m("top_sum"),
        &[&m("top_scores"), &m("last_axis")],
        &[&m("top_total")],
        &[Attr::Int("keepdims", 1)],
    );
    b.node(
        "Div",
        &m("normalize"),
        &[&m("top_scores"), &m("top_total")],
        &[&m("weights")],
        &[],
    );
    b.node(
        "Shape",
        &m("gates_shape"),
        &[&scores],
        &[&m("gates_dims")],
        &[],
    );
    b.node(
        "ConstantOfShape",
        &m("no_gates"),
        &[&m("gates_dims")],
        &[&m("zeros")],
        &[],
    );
    b.node(
        "ScatterElements",
        &m("gates"),
        &[&m("zeros"), &m("top_experts"), &m("weights")],
        &[&m("gate_values")],
        &[Attr::Int("axis", -1)],
    );

    // The experts: every token through every expert's MLP (`[batch, E, s, f]`), weighted
    // by its gates and summed over the experts.
    b.node(
        "Unsqueeze",
        &m("tokens"),
        &[input, &m("expert_axis")],
        &[&m("tokens.out")],
        &[],
    );
    let expert = |name: &str| m(&format!("experts.{name}"));
    linear(b, spec, &expert("fc"), &m("tokens.out"));
    if spec.gated_mlp {
        linear(b, spec, &expert("gate"), &m("tokens.out"));
    }
    let activated = activate(b, spec, &expert, &expert("fc.out"), &expert("gate.out"));
    linear(b, spec, &expert("proj"), &activated);
    b.node(
        "Transpose",
        &m("gates_by_expert"),
        &[&m("gate_values")],
        &[&m("gates_t")],
        &[Attr::Ints("perm", vec![0, 2, 1])],
    );
    b.node(
        "Unsqueeze",
        &m("gates_per_token"),
        &[&m("gates_t"), &m("last_axis")],
        &[&m("gates_u")],
        &[],
    );
    b.node(
        "Mul",
        &m("weigh"),
        &[&expert("proj.out"), &m("gates_u")],
        &[&m("weighted")],
        &[],
    );
    b.node(
        "ReduceSum",
        &m("combine"),
        &[&m("weighted"), &m("expert_axis")],
        &[&m("routed")],
        &[Attr::Int("keepdims", 0)],
    );
    if shared == 0 {
        return m("routed");
    }
    // The shared experts: one MLP of their inner size together, seeing every token.
    let common = |name: &str| m(&format!("shared.{name}"));
    linear(b, spec, &common("fc"), input);
    if spec.gated_mlp {
        linear(b, spec, &common("gate"), input);
    }
    let activated = activate(b, spec, &common, &common("fc.out"), &common("gate.out"));
    linear(b, spec, &common("proj"), &activated);
    b.node(
        "Add",
        &m("with_shared"),
        &[&m("routed"), &common("proj.out")],
        &[&m("out")],
        &[],
    );
    m("out")
}
