//! Recognizing mixture-of-experts MLPs: a router (a product of the hidden state by an
//! `[h, E]` weight, scored by a softmax or a sigmoid, or not scored before its top-k as
//! gpt-oss does) whose `TopK` picks a token's experts, and the experts' weights stacked by
//! expert (`[E, h, f]` and `[E, f, h]`, a gate and up projection possibly fused into one
//! `[E, h, 2f]`, as Megatron-Core's grouped GEMM, Hugging Face's gpt-oss and ralpc's
//! generator store them).
//!
//! Experts written one weight per expert (the unrolled loop some exports give) are not
//! recognized yet: the graph is then refused as a transformer by name. Nor are shared
//! experts exactly as wide as the hidden size: their square products cannot be told from
//! the attention's by counting (the parameter check then refuses the graph).

use std::collections::{BTreeMap, BTreeSet};

use ralpc_ir::models::{MoeSpec, Router};
use ralpc_ir::{Graph, GraphInfo, NodeId, Op, ValueId};

use super::{weight_of, NotATransformer};

/// The mixtures of experts a graph holds, all alike.
pub(super) struct Experts {
    /// Their shape; `dense_layers` and `shared_ffn` are the caller's to fill.
    pub spec: MoeSpec,
    /// Blocks with experts: one router each.
    pub blocks: u64,
    /// The routers' weights, which are not the blocks' dense products.
    pub routers: BTreeSet<NodeId>,
    /// The routers' `TopK` nodes, in the graph's order.
    pub top_ks: Vec<NodeId>,
    /// Whether the experts' MLPs are gated (SwiGLU: three products, or a fused gate and up
    /// projection beside the down projection).
    pub gated: bool,
}

/// The graph's mixtures of experts, if it has routers.
///
/// # Errors
/// Routers that disagree, or experts whose weights are not stacked.
pub(super) fn find(
    graph: &Graph,
    info: &GraphInfo,
    hidden: u64,
    (wte, vocabulary): (NodeId, u64),
) -> Result<Option<Experts>, NotATransformer> {
    let no = |m: String| Err(NotATransformer(m));
    let mut routers = BTreeSet::new();
    let mut top_ks = Vec::new();
    let mut shape = None;
    for &n in info.order() {
        let node = graph.node(n);
        let Op::TopK { axis, .. } = node.op else {
            continue;
        };
        let (Some(Some(scores)), Some(&picked)) = (node.inputs.first(), node.outputs.first())
        else {
            continue;
        };
        let Some((router, weight)) = router_of(graph, info, *scores, hidden) else {
            continue;
        };
        let (Some(dims), Some(picked)) = (
            info.ty(*scores).shape.as_sizes(),
            info.ty(picked).shape.as_sizes(),
        ) else {
            continue;
        };
        // The experts are the scores' axis the TopK picks along, the top k its length in
        // the picked values.
        let at = usize::try_from(if axis < 0 {
            axis + dims.len() as i64
        } else {
            axis
        })
        .ok();
        let (Some(&experts), Some(&top_k)) =
            (at.and_then(|a| dims.get(a)), at.and_then(|a| picked.get(a)))
        else {
            continue;
        };
        // The top k of an LM head's logits (sampling, top-5 accuracy) picks words.
        if weight == wte || experts == vocabulary {
            continue;
        }
        let found = (experts, top_k, router);
        if shape.is_some_and(|s| s != found) {
            return no(format!(
                "its expert blocks differ (top {} of {} experts, then top {top_k} of \
                 {experts})",
                shape.map_or(0, |s: (u64, u64, Router)| s.1),
                shape.map_or(0, |s: (u64, u64, Router)| s.0),
            ));
        }
        shape = Some(found);
        routers.insert(weight);
        top_ks.push(n);
    }
    let Some((experts, top_k, router)) = shape else {
        return Ok(None);
    };
    let blocks = routers.len() as u64;
    // The stacked weights: `[E, h, w]` or `[E, w, h]`, counted by their width `w`.
    let mut widths: BTreeMap<u64, u64> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for &n in info.order() {
        let node = graph.node(n);
        if !matches!(node.op, Op::MatMul) {
            continue;
        }
        let Some(Some(b)) = node.inputs.get(1) else {
            continue;
        };
        let Some((w, dims)) = weight_of(graph, info, *b) else {
            continue;
        };
        if let [e, r, c] = dims[..] {
            let width = match (r == hidden, c == hidden) {
                (true, _) => c,
                (_, true) => r,
                _ => continue,
            };
            if e == experts && seen.insert(w) {
                *widths.entry(width).or_default() += 1;
            }
        }
    }
    let stacked: u64 = widths.values().sum();
    let (gated, expert_ffn) = match widths.iter().collect::<Vec<_>>()[..] {
        // Products in and out of one width: two (a plain MLP) or three (SwiGLU) a block.
        [(&width, &count)] if count == 2 * blocks || count == 3 * blocks => {
            (count == 3 * blocks, width)
        }
        // A gate and up projection fused into one product twice as wide.
        [(&narrow, &a), (&wide, &b)] if wide == 2 * narrow && a == blocks && b == blocks => {
            (true, narrow)
        }
        _ => {
            return no(format!(
                "its {blocks} routers choose among {experts} experts, but {stacked} weights \
                 are stacked by expert ([{experts}, hidden, inner]); experts with a weight \
                 each are not recognized yet"
            ))
        }
    };
    Ok(Some(Experts {
        spec: MoeSpec {
            experts,
            top_k,
            expert_ffn,
            shared_ffn: 0,
            dense_layers: 0,
            router,
            groups: 0,
            top_groups: 0,
        },
        blocks,
        routers,
        top_ks,
        gated,
    }))
}

/// The router behind `scores` (what a `TopK` picks from): its scoring and its `[h, E]`
/// weight, through the scoring function and an added bias.
fn router_of(
    graph: &Graph,
    info: &GraphInfo,
    scores: ValueId,
    hidden: u64,
) -> Option<(Router, NodeId)> {
    let producer = |v: ValueId| graph.node(graph.value(v).producer);
    let first = |n: &ralpc_ir::Node| n.inputs.first().copied().flatten();
    let constant = |v: ValueId| {
        matches!(producer(v).op, Op::Constant { .. }) || weight_of(graph, info, v).is_some()
    };
    // Through casts and an added constant (a bias; DeepSeek-V3's correction of the
    // scores), on either side.
    let through = |mut v: ValueId| -> Option<ValueId> {
        for _ in 0..4 {
            let n = producer(v);
            v = match (&n.op, n.inputs.as_slice()) {
                (Op::Cast { .. }, _) => first(n)?,
                (Op::Binary(ralpc_ir::Binary::Add), [Some(a), Some(b)]) if constant(*b) => *a,
                (Op::Binary(ralpc_ir::Binary::Add), [Some(a), Some(b)]) if constant(*a) => *b,
                _ => return Some(v),
            };
        }
        Some(v)
    };
    let scored = through(scores)?;
    let (router, logits) = match producer(scored).op {
        Op::Softmax { .. } => (Router::Softmax, through(first(producer(scored))?)?),
        Op::Unary(ralpc_ir::Unary::Sigmoid) => {
            (Router::Sigmoid, through(first(producer(scored))?)?)
        }
        // gpt-oss: the top k of the logits, a softmax over those k.
        _ => (Router::Softmax, scored),
    };
    let product = producer(logits);
    if !matches!(product.op, Op::MatMul | Op::Gemm(_)) {
        return None;
    }
    product.inputs.iter().flatten().find_map(|&v| {
        let (w, dims) = weight_of(graph, info, v)?;
        (dims.len() == 2 && dims.contains(&hidden)).then_some((router, w))
    })
}
