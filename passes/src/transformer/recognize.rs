//! Recognizing a GPT-like decoder in a verified graph, whatever the exporter: the token
//! embedding (a `Gather` of a `[V, h]` weight by an integer model input), one attention
//! core per block (a `Softmax` over `[batch, heads, s, s]` scores — the heads are read
//! through the exporter's `Reshape`/`Transpose`/`Split` of the hidden dimension, since the
//! scores carry them as an axis), the MLP's inner size (the `[h, f]` and `[f, h]` weights of
//! the dense layers) and whether the LM head reuses the embedding.
//!
//! Llama's blocks are recognized too: grouped-query attention (fewer key/value heads, read
//! from the attention weights' size), a SwiGLU MLP (three weights of the inner size per
//! block, or Phi-3's gate and up fused into one twice as wide), RMSNorm and no biases; and
//! what today's families add: Qwen3's norms of each head's queries and keys (norms over a
//! head's width), Qwen2's biases on Q, K and V alone.
//!
//! The norms (LayerNorm or RMSNorm) and the dense layers' biases are read from the
//! operators: `LayerNormalization` nodes or a mean subtracted from its input, a mean of
//! squares with none subtracted, a bias added to each product. Only where the operators do
//! not say (no norm found, mixed forms) does the parameter count choose — an exporter may
//! merge identical weights (GPT-2's norms), or fold one into a constant (Gemma's `1 + w`).
//!
//! The result is checked against the graph's own parameter count: a model whose weights do
//! not add up to a GPT of the recognized shape (within 2 %) is not treated as one.

mod experts;

use std::collections::BTreeMap;

use ralpc_ir::models::MoeSpec;
use ralpc_ir::{Graph, GraphInfo, NodeId, Op, ValueId};

use super::Transformer;

/// Why a graph is not planned as a transformer (it is then planned layer by layer).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a GPT-like decoder: {0}")]
pub struct NotATransformer(pub String);

/// Finds the GPT shape of `graph`, planned at `batch`.
///
/// # Errors
/// [`NotATransformer`] saying which part is missing or does not agree.
pub fn recognize(graph: &Graph, info: &GraphInfo) -> Result<Transformer, NotATransformer> {
    let no = |m: String| Err(NotATransformer(m));
    let weight_dims = |v: ValueId| -> Option<(NodeId, Vec<u64>)> {
        let n = graph.value(v).producer;
        match &graph.node(n).op {
            Op::Constant {
                initializer: true, ..
            } if info.ty(v).dtype.is_float() => Some((n, info.ty(v).shape.as_sizes()?)),
            // A transposed weight (a tied head reads the embedding through one).
            Op::Transpose { .. } => {
                let input = graph.node(n).inputs.first().copied().flatten()?;
                let (w, _) = weight_of(graph, info, input)?;
                Some((w, info.ty(v).shape.as_sizes()?))
            }
            _ => None,
        }
    };
    // The token embedding.
    let mut embedding = None;
    for &n in info.order() {
        let node = graph.node(n);
        let (Op::Gather { .. }, [Some(table), Some(ids), ..]) = (&node.op, node.inputs.as_slice())
        else {
            continue;
        };
        let from_input = reads_input(graph, *ids);
        if let (true, Some((w, dims))) = (from_input, weight_dims(*table)) {
            if dims.len() == 2 {
                embedding = Some((w, dims[0], dims[1]));
                break;
            }
        }
    }
    let Some((wte, vocabulary, hidden)) = embedding else {
        return no("no token embedding (a Gather of a [vocabulary, hidden] weight by an integer model input)".into());
    };
    // Attention cores: softmax over [batch, heads, s, s].
    let mut cores = Vec::new();
    for &n in info.order() {
        let node = graph.node(n);
        if !matches!(node.op, Op::Softmax { .. }) {
            continue;
        }
        let Some(dims) = node
            .outputs
            .first()
            .and_then(|&v| info.ty(v).shape.as_sizes())
        else {
            continue;
        };
        if dims.len() == 4 && dims[2] == dims[3] {
            cores.push((dims[1], dims[2]));
        }
    }
    let Some(&(heads, sequence)) = cores.first() else {
        return no(
            "no attention (a Softmax over [batch, heads, sequence, sequence] scores)".into(),
        );
    };
    if let Some(other) = cores.iter().find(|&&c| c != (heads, sequence)) {
        return no(format!(
            "its attention blocks differ ({heads} heads × {sequence} positions, then {} × {})",
            other.0, other.1
        ));
    }
    if hidden == 0 {
        return no("its token embedding has no width".into());
    }
    if heads == 0 || hidden % heads != 0 {
        return no(format!(
            "hidden {hidden} is not a multiple of {heads} heads"
        ));
    }
    let experts = experts::find(graph, info, hidden, (wte, vocabulary))?;
    let routers = experts.as_ref().map(|e| &e.routers);
    // Dense weights: the MLP's inner size, and whether the head is tied.
    let mut inner: BTreeMap<u64, u64> = BTreeMap::new();
    let mut block_weights: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut tied = false;
    for &n in info.order() {
        let node = graph.node(n);
        if !matches!(node.op, Op::MatMul | Op::Gemm(_)) {
            continue;
        }
        for &v in node.inputs.iter().flatten() {
            let Some((w, dims)) = weight_dims(v) else {
                continue;
            };
            if w == wte {
                tied = true;
                continue;
            }
            if routers.is_some_and(|r| r.contains(&w)) {
                continue;
            }
            if let [r, c] = dims[..] {
                let other = if r == hidden {
                    c
                } else if c == hidden {
                    r
                } else {
                    continue;
                };
                if block_weights.insert(w, r * c).is_some() {
                    continue;
                }
                // The attention projections are [hidden, hidden] (or fused, 3·hidden
                // wide, once per block); the MLP's two weights per block (SwiGLU's three)
                // outnumber them and an untied head (even one as wide as the MLP).
                if other != hidden {
                    *inner.entry(other).or_default() += 1;
                }
            }
        }
    }
    let layers = cores.len() as u64;
    let moe_blocks = experts.as_ref().map_or(0, |e| e.blocks);
    if moe_blocks > layers {
        return no(format!(
            "{moe_blocks} expert routers for {layers} attention blocks"
        ));
    }
    // The blocks with a dense MLP (all of them, or those before the experts').
    let dense_blocks = layers - moe_blocks;
    // Experts in every block from the first with them on (as the spec writes them):
    // router `j` after block `dense_blocks + j`'s attention core, before the next one's.
    if let Some(e) = &experts {
        let mut cores_seen = 0u64;
        let mut routers_seen = 0u64;
        for &n in info.order() {
            let node = graph.node(n);
            if matches!(node.op, Op::Softmax { .. })
                && node.outputs.first().is_some_and(|&v| {
                    info.ty(v)
                        .shape
                        .as_sizes()
                        .is_some_and(|d| d.len() == 4 && d[2] == d[3])
                })
            {
                cores_seen += 1;
            } else if e.top_ks.contains(&n) {
                if cores_seen != dense_blocks + routers_seen + 1 {
                    return no(format!(
                        "its experts are not in every block from block {dense_blocks} on                          (a router after block {}'s attention): experts every few blocks                          are not planned yet",
                        cores_seen.saturating_sub(1)
                    ));
                }
                routers_seen += 1;
            }
        }
    }
    // A gate and up projection fused into one weight (Phi-3's `gate_up_proj`, [h, 2f]) beside
    // the down projection ([f, h]), each once a block: the MLP's inner size is f.
    // (Exactly once a block: Gemma 2's query and key/value widths, w and 2w twice a block
    // each, are not a fused MLP.)
    let fused_gate_up = inner.iter().find_map(|(&width, &count)| {
        (count == dense_blocks && inner.get(&(2 * width)) == Some(&count))
            .then_some((width, 3 * count))
    });
    let dense_mlp = fused_gate_up.or_else(|| {
        inner
            .iter()
            .filter(|(_, &count)| count >= dense_blocks)
            .max_by_key(|(_, &count)| count)
            .map(|(&width, &count)| (width, count))
    });
    let (ffn, ffn_weights) = match (dense_mlp, &experts) {
        (Some(found), _) if dense_blocks > 0 => found,
        // Experts in every block: the model's MLP is theirs.
        (_, Some(e)) if dense_blocks == 0 => (e.spec.expert_ffn, 0),
        _ => {
            return no(format!(
                "no MLP: no [hidden, inner] weight in each of its {dense_blocks} blocks"
            ))
        }
    };
    // With experts: the dense blocks' inner size and the shared experts' are any of the
    // widths found (or none), as the parameter count decides below.
    let mlp_shapes: Vec<(u64, Option<MoeSpec>)> = match &experts {
        None => vec![(ffn, None)],
        Some(e) => {
            // The dense MLPs and the shared experts have each of their products once in
            // each of their blocks.
            let products = if e.gated { 3 } else { 2 };
            let dense = match dense_blocks {
                0 => vec![e.spec.expert_ffn],
                _ => inner
                    .iter()
                    .filter(|(_, &count)| count >= products * dense_blocks)
                    .map(|(&width, _)| width)
                    .collect(),
            };
            let shared = std::iter::once(0).chain(
                inner
                    .iter()
                    .filter(|(_, &count)| count >= products * moe_blocks)
                    .map(|(&width, _)| width),
            );
            shared
                .flat_map(|shared_ffn| {
                    dense.iter().map(move |&ffn| {
                        let spec = MoeSpec {
                            shared_ffn,
                            dense_layers: dense_blocks,
                            ..e.spec
                        };
                        (ffn, Some(spec))
                    })
                })
                .collect()
        }
    };
    // The blocks' dense weights, without an untied head.
    let head = if tied { 0 } else { hidden * vocabulary };
    let dense = block_weights.values().sum::<u64>().saturating_sub(head);
    let ffn_weights = ffn_weights.saturating_sub(u64::from(!tied && ffn == vocabulary));
    let params: u64 = graph
        .node_ids()
        .filter(|&n| {
            matches!(
                graph.node(n).op,
                Op::Constant {
                    initializer: true,
                    ..
                }
            )
        })
        .filter_map(|n| {
            let v = *graph.node(n).outputs.first()?;
            let ty = info.ty(v);
            ty.dtype
                .is_float()
                .then(|| ty.shape.known_numel())
                .flatten()
        })
        .sum();
    // Learned positions: a [P, h] (or [1, P, h]) table that no dense layer reads.
    let positions = graph
        .node_ids()
        .filter(|&n| n != wte)
        .filter_map(|n| {
            let v = *graph.node(n).outputs.first()?;
            let (_, dims) = weight_dims(v).filter(|(w, _)| *w == n)?;
            let read_densely = graph
                .consumers(v)
                .iter()
                .any(|&(c, _)| matches!(graph.node(c).op, Op::MatMul | Op::Gemm(_)));
            match dims[..] {
                [p, h] | [1, p, h] if h == hidden && p != vocabulary && !read_densely => Some(p),
                _ => None,
            }
        })
        .max()
        .unwrap_or(0);
    // What the blocks are made of: a gated MLP or not (its weights per block), biases or
    // not and LayerNorm or RMSNorm (a few vectors per block) are the variant whose
    // parameter formula comes nearest the graph's count; the key/value heads follow from
    // the attention weights left beside the MLP's.
    let variant =
        |gated_mlp: bool, biases: bool, rms_norm: bool, (ffn, moe): (u64, Option<MoeSpec>)| {
            let matrices = if gated_mlp { 3 } else { 2 };
            // The inner widths of the dense products the blocks' MLPs hold.
            let widths = match moe {
                None => layers * ffn,
                Some(m) => dense_blocks * ffn + moe_blocks * m.shared_ffn,
            };
            let attention = dense.saturating_sub(matrices * hidden * widths) / layers;
            let head_dim = hidden / heads;
            let kv_width = (attention / hidden).saturating_sub(2 * hidden);
            let kv_heads = match kv_width / (2 * head_dim) {
                kv if attention % hidden == 0
                    && kv_width % (2 * head_dim) == 0
                    && (1..=heads).contains(&kv)
                    && heads % kv == 0 =>
                {
                    kv
                }
                _ => heads,
            };
            Transformer {
                layers,
                hidden,
                heads,
                kv_heads,
                sequence,
                vocabulary,
                ffn,
                gated_mlp,
                biases,
                rms_norm,
                tied,
                positions,
                head_dim,
                qkv_bias: false,
                qk_norm: false,
                latent: None,
                sliding_window: 0,
                moe,
                params,
            }
        };
    let gated = match &experts {
        Some(e) => e.gated,
        None => ffn_weights >= 3 * layers,
    };
    // The norms and biases the graph's operators show decide where they are plain; only
    // where they do not (no norm found, mixed forms) does the parameter count choose.
    let rms_norm = norms(graph, info, hidden);
    let (biases, qkv_bias) = match biases(graph, info, &block_weights, hidden * vocabulary, ffn) {
        Biases::Everywhere => (Some(true), false),
        Biases::Nowhere => (Some(false), false),
        Biases::QueryKeyValueOnly => (Some(false), true),
        Biases::Unclear => (None, false),
    };
    // Qwen3's norms of each head's queries and keys: two a block, over a head's width.
    let qk_norm = head_norms(graph, info, hidden) >= 2 * layers;
    let variant = |gated_mlp: bool, biases: bool, rms_norm: bool, mlp| Transformer {
        qkv_bias,
        qk_norm,
        ..variant(gated_mlp, biases, rms_norm, mlp)
    };
    // Experts say whether their MLPs are gated; a dense model's weights per block do.
    let gating = match experts {
        Some(_) => vec![gated],
        None => vec![gated, !gated],
    };
    let mut candidates = Vec::new();
    for g in gating {
        for (b, r) in [(true, false), (false, true), (true, true), (false, false)] {
            if biases.is_none_or(|x| x == b) && rms_norm.is_none_or(|x| x == r) {
                candidates.extend(mlp_shapes.iter().map(|&mlp| variant(g, b, r, mlp)));
            }
        }
    }
    let distance = |m: &Transformer| m.spec().params().abs_diff(params);
    let Some(model) = candidates.into_iter().min_by_key(distance) else {
        return no("no block shape".into());
    };
    let expected = model.spec().params();
    let off = (params as f64 - expected as f64).abs() / expected as f64;
    if off > 0.02 {
        return no(format!(
            "its weights ({params} parameters) are not those of a GPT with {layers} layers, \
             hidden {hidden}, MLP {ffn}, vocabulary {vocabulary} ({expected})"
        ));
    }
    Ok(model)
}

/// A norm the graph computes: a `LayerNormalization` node, or decomposed, a mean subtracted
/// from its input (LayerNorm) or a mean of squares with none subtracted (RMSNorm); with the
/// width it normalizes (the input's last axis).
struct Norm {
    rms: bool,
    width: Option<u64>,
    /// The normalized tensor's rank: 4 for a norm of each head (`[b, s, heads, d]`).
    rank: usize,
}

/// Every norm of the graph ([`Norm`]), in order.
fn each_norm(graph: &Graph, info: &GraphInfo) -> Vec<Norm> {
    let width = |x: ValueId| info.ty(x).shape.as_sizes().and_then(|d| d.last().copied());
    let rank = |x: ValueId| info.ty(x).shape.as_sizes().map_or(0, |d| d.len());
    let mut out = Vec::new();
    for &n in info.order() {
        let node = graph.node(n);
        let Some(x) = node.inputs.first().copied().flatten() else {
            continue;
        };
        match &node.op {
            Op::LayerNorm { .. } => out.push(Norm {
                rms: false,
                width: width(x),
                rank: rank(x),
            }),
            Op::Reduce {
                kind: ralpc_ir::ReduceKind::Mean,
                ..
            } => {
                // A mean of squares: RMSNorm's, unless what is squared had a mean subtracted
                // (a decomposed LayerNorm's variance).
                let producer = graph.node(graph.value(x).producer);
                let base = match (&producer.op, producer.inputs.as_slice()) {
                    (Op::Binary(ralpc_ir::Binary::Pow), [Some(a), ..]) => Some(*a),
                    (Op::Binary(ralpc_ir::Binary::Mul), [Some(a), Some(b)]) if a == b => Some(*a),
                    _ => None,
                };
                let squared = base.is_some_and(|a| {
                    !matches!(
                        graph.node(graph.value(a).producer).op,
                        Op::Binary(ralpc_ir::Binary::Sub)
                    )
                });
                let centred = node.outputs.iter().any(|&mean| {
                    graph.consumers(mean).iter().any(|&(c, _)| {
                        matches!(graph.node(c).op, Op::Binary(ralpc_ir::Binary::Sub))
                    })
                });
                if squared || centred {
                    out.push(Norm {
                        rms: squared,
                        width: width(x),
                        rank: rank(x),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether the blocks' norms (those over the `hidden` width) are RMSNorms (`Some(true)`) or
/// LayerNorms (`Some(false)`), as its operators show. `None` where they show neither or
/// both.
fn norms(graph: &Graph, info: &GraphInfo, hidden: u64) -> Option<bool> {
    let (mut layer, mut rms) = (0u32, 0u32);
    for norm in each_norm(graph, info) {
        match (norm.width, norm.rms) {
            (Some(w), _) if w != hidden => {}
            (_, true) => rms += 1,
            (_, false) => layer += 1,
        }
    }
    match (layer, rms) {
        (0, 0) => None,
        (_, 0) => Some(false),
        (0, _) => Some(true),
        _ => None,
    }
}

/// The norms of each head (Qwen3's QK-norm): over less than the `hidden` width of a tensor
/// holding the heads apart (rank 4), not DeepSeek's norms of its latent vectors (rank 3).
fn head_norms(graph: &Graph, info: &GraphInfo, hidden: u64) -> u64 {
    each_norm(graph, info)
        .iter()
        .filter(|n| n.rank >= 4 && n.width.is_some_and(|w| w > 1 && w < hidden))
        .count() as u64
}

/// Where the blocks' dense layers add biases, as the graph's operators show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Biases {
    Everywhere,
    Nowhere,
    /// Only the attention's input projections (Qwen2's Q/K/V biases): every biased product
    /// is narrower than the MLP, and the MLP's are not biased.
    QueryKeyValueOnly,
    /// Some do and some do not, otherwise; or no dense layer says.
    Unclear,
}

/// Whether the blocks' dense layers (`weights`, less any of the LM head's `head` elements)
/// add biases, as the graph shows: a `Gemm` with a `C` input, or a `MatMul` whose product
/// is added to a 1-D weight.
fn biases(
    graph: &Graph,
    info: &GraphInfo,
    weights: &BTreeMap<NodeId, u64>,
    head: u64,
    ffn: u64,
) -> Biases {
    let is_vector = |v: ValueId| weight_of(graph, info, v).is_some_and(|(_, d)| d.len() == 1);
    let (mut with, mut without) = (0u32, 0u32);
    // Biased products touching the MLP's width, and unbiased ones away from it.
    let (mut biased_mlp, mut unbiased_mlp) = (0u32, 0u32);
    for &n in info.order() {
        let node = graph.node(n);
        // An untied LM head often has no bias where the blocks do (GPT-NeoX): not counted.
        let block_weight = node.inputs.iter().flatten().find_map(|&v| {
            weight_of(graph, info, v)
                .filter(|(w, _)| weights.get(w).is_some_and(|&size| size != head))
        });
        let Some((_, dims)) = block_weight else {
            continue;
        };
        let mlp = dims.contains(&ffn);
        let biased = match (&node.op, node.inputs.get(2)) {
            (Op::Gemm(_), Some(Some(_))) => true,
            (Op::MatMul, _) => node.outputs.iter().any(|&y| {
                graph.consumers(y).iter().any(|&(c, _)| {
                    let add = graph.node(c);
                    matches!(add.op, Op::Binary(ralpc_ir::Binary::Add))
                        && add.inputs.iter().flatten().any(|&v| is_vector(v))
                })
            }),
            (Op::Gemm(_), _) => false,
            _ => continue,
        };
        if biased {
            with += 1;
            biased_mlp += u32::from(mlp);
        } else {
            without += 1;
            unbiased_mlp += u32::from(mlp);
        }
    }
    match (with, without) {
        (0, 0) => Biases::Unclear,
        (_, 0) => Biases::Everywhere,
        (0, _) => Biases::Nowhere,
        _ if biased_mlp == 0 && unbiased_mlp > 0 => Biases::QueryKeyValueOnly,
        _ => Biases::Unclear,
    }
}

/// Whether `v` is a model input, through casts and views (Hugging Face's GPT-2 and OPT
/// flatten their ids to `[-1, s]` before the lookup).
fn reads_input(graph: &Graph, v: ValueId) -> bool {
    let mut v = v;
    for _ in 0..8 {
        let node = graph.node(graph.value(v).producer);
        match node.op {
            Op::Input => return true,
            Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. }
            | Op::Identity => match node.inputs.first().copied().flatten() {
                Some(x) => v = x,
                None => return false,
            },
            _ => return false,
        }
    }
    false
}

/// The initializer behind `v`, through transposes.
fn weight_of(graph: &Graph, info: &GraphInfo, v: ValueId) -> Option<(NodeId, Vec<u64>)> {
    let n = graph.value(v).producer;
    match &graph.node(n).op {
        Op::Constant {
            initializer: true, ..
        } => Some((n, info.ty(v).shape.as_sizes()?)),
        Op::Transpose { .. } => weight_of(graph, info, graph.node(n).inputs.first().copied()??),
        _ => None,
    }
}
