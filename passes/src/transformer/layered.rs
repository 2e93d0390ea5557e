//! The layer-graph form of a transformer plan: the [`Strategy`] the layered planner, the
//! lowering and the executors understand, for the configurations it can express —
//! pipeline stages holding whole blocks, each on `d × t` GPUs (Megatron-LM's tensor
//! parallelism inside `d` data-parallel replicas), with ZeRO and recomputation (full:
//! every block is a recomputed run, or each chunk's first blocks; selective: each block's
//! attention core, the weightless layers around its softmax; by module: the attention
//! core and the MLP with its norm).
//!
//! Stage boundaries are the blocks' boundaries in the model's own layer graph: the
//! attention cores (one `Softmax` layer per block) number the blocks, and block `i` starts
//! after the last *clean* cut before its attention core — a cut that only the residual
//! stream crosses (inside a block, the residual and the branch both cross). That holds
//! for any exporter's layer graph of a pre-LayerNorm decoder, whatever its node names.

use ralpc_ir::{Graph, ValueId};

use crate::layers::{carrier, Edge, Layer, LayerGraph, LayerKind, Producer, Split};
use crate::plan::order::group_of_stage;
use crate::plan::{Stage, Strategy};

use super::{Estimate, Modules, Recompute};

/// Why a transformer plan has no layer-graph form (it is priced, not lowered).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotLayered(pub String);

/// The layered strategy of `plan` for `graph` (the model's layer graph at the global batch,
/// of the model's `ops` when it has them).
///
/// # Errors
/// [`NotLayered`] naming the option the layered form cannot express yet (an interleaving
/// of unequal stages), or a layer graph whose blocks cannot be told apart.
///
/// Tensor parallelism lowers as Megatron-LM's sequence parallelism, with or without
/// `--sequence-parallel`: LayerNorms, dropout and residual layers split by sequence,
/// reached by a reduce-scatter of the row-parallel partial sums and left by an all-gather
/// before the column-parallel products — the traffic of the all-reduces they replace, with
/// less activation memory than a plan without sequence parallelism is priced at.
pub fn layered(
    graph: &LayerGraph,
    ops: Option<&Graph>,
    plan: &Estimate,
) -> Result<Strategy, NotLayered> {
    let par = plan.parallelism;
    let refuse = |what: &str, fix: &str| {
        Err(NotLayered(format!(
            "{what} is priced but not lowered to an executable plan yet (for one, add {fix})"
        )))
    };
    if par.offload.any() {
        return refuse(
            "keeping activations or optimizer state in host memory",
            "more GPUs, or --offload-activations 0 --offload-optimizer 0",
        );
    }
    // The executors run a mixture of experts whole on every rank of its data-parallel
    // group (each expert on every token, weighted by its gates): one expert group, as
    // priced at `ep = 1`; dispatching tokens to experts on other ranks is not lowered.
    if par.expert > 1 || par.expert_tensor > 1 {
        return refuse(
            &format!(
                "expert parallelism ({} expert-parallel × {} expert-tensor-parallel ranks)",
                par.expert, par.expert_tensor
            ),
            "--expert-parallel 1 --expert-tensor-parallel 1",
        );
    }
    // Megatron-Core runs the experts on each tensor-parallel rank's piece of the sequence;
    // the lowering has no such split of the routed products yet.
    let experts = graph.layers.iter().find(|l| l.kind == LayerKind::Experts);
    if let Some(router) = experts.filter(|_| par.tensor > 1 || par.context > 1) {
        return refuse(
            &format!(
                "tensor or context parallelism beside a mixture of experts (router {})",
                router.name
            ),
            "--tensor-parallel 1 --context-parallel 1",
        );
    }
    if let (Some(layer), Recompute::Modules(m)) = (experts, par.recompute) {
        if m.contains(Modules::MLP) {
            return refuse(
                &format!(
                    "recomputing the MLP of blocks with experts (layer {})",
                    layer.name
                ),
                "--recompute full or --recompute-modules core_attn",
            );
        }
    }
    let starts = block_starts(graph)?;
    let blocks = starts.len() as u64;
    // Interleaved: each pipeline rank's blocks in `v` chunks, chunk `j` of the model on
    // rank `j mod p` (Narayanan et al.'s assignment; ZB-V's V: rank `j` or `2p − 1 − j`),
    // as the plan priced them.
    let chunk_layers = &plan.chunk_layers;
    if chunk_layers.contains(&0) {
        return refuse(
            &format!(
                "a pipeline chunk with no block (chunks of {:?} blocks)",
                chunk_layers
            ),
            "fewer pipeline stages or virtual stages",
        );
    }
    let pipeline = plan.stage_layers.len();
    if chunk_layers.iter().sum::<u64>() != blocks {
        return Err(NotLayered(format!(
            "the layer graph has {blocks} attention cores where the plan places {} blocks",
            plan.stage_layers.iter().sum::<u64>()
        )));
    }
    let (d, c, t) = (par.data, par.context.max(1), par.tensor.max(1));
    // A block's softmax outside an attention core (an op between the projections the
    // head split does not take in) would be split by sequence with what it reads whole.
    if let Some(l) = softmax_layers(graph)
        .into_iter()
        .find(|&l| (t > 1 || c > 1) && graph.layers[l].kind != LayerKind::Attention)
    {
        return Err(NotLayered(format!(
            "layer {} holds a block's softmax but is no attention core (an op between the \
             projections is not one a head split runs), so tensor or context parallelism \
             cannot split it (for one, use --tensor-parallel 1 --context-parallel 1)",
            graph.layers[l].name
        )));
    }
    let mut stages = Vec::with_capacity(plan.stage_layers.len());
    let mut block = 0u64;
    for (k, &n) in chunk_layers.iter().enumerate() {
        let first_layer = if k == 0 { 0 } else { starts[block as usize] };
        block += n;
        let last_layer = match starts.get(block as usize) {
            Some(&next) if k + 1 < chunk_layers.len() => next - 1,
            _ => graph.layers.len() - 1,
        };
        if last_layer < first_layer {
            return Err(NotLayered(format!("stage {k} holds no layer")));
        }
        stages.push(Stage {
            first_layer,
            last_layer,
            first_rank: group_of_stage(par.schedule, pipeline, k).0 as u32 * d * c * t,
            gpus: d * c * t,
        });
    }
    let microbatches = u32::try_from(plan.microbatches)
        .map_err(|_| NotLayered(format!("{} microbatches", plan.microbatches)))?;
    let recompute = match par.recompute {
        Recompute::None => Vec::new(),
        Recompute::Full => block_runs(graph, &starts)?,
        // Each chunk's first blocks (the last block's run, which may run into the head,
        // only where its chunk recomputes all of its blocks).
        Recompute::Blocks(_) => {
            let last_chunk = chunk_layers.last().copied().unwrap_or(0);
            let runs = match par.recompute.full_blocks(last_chunk) == last_chunk {
                true => block_runs(graph, &starts)?,
                false => starts.windows(2).map(|w| (w[0], w[1] - 1)).collect(),
            };
            let mut first = 0usize;
            let mut kept = Vec::new();
            for &n in chunk_layers {
                let full = par.recompute.full_blocks(n) as usize;
                kept.extend(runs.iter().skip(first).take(full).copied());
                first += n as usize;
            }
            kept
        }
        Recompute::Selective => attention_cores(graph),
        Recompute::Modules(m) => module_runs(graph, &starts, m)?,
    };
    let layers = tensor_parallel(graph, ops, d, c, t);
    // A context-parallel core gathers its projections' rows; anything else it reads (a
    // mask or rotary table another layer computes, a graph input) would arrive as a
    // product's input does, in pieces of the sequence.
    if let Some(layer) = graph.layers.iter().find(|l| {
        c > 1 && l.kind == LayerKind::Attention && crate::plan::reads_beside_projections(graph, l)
    }) {
        return refuse(
            &format!(
                "context parallelism over attention core {} (which reads more than its \
                 projections: a mask, a position table or a graph input)",
                layer.name
            ),
            "--context-parallel 1",
        );
    }
    if let Some((layer, _)) = graph
        .layers
        .iter()
        .zip(&layers)
        .find(|(layer, split)| split.context > 1 && !keeps_a_sequence_axis(layer))
    {
        return refuse(
            &format!(
                "context parallelism over layer {} (which flattens its tokens: no sequence \
                 axis to cut)",
                layer.name
            ),
            "--context-parallel 1",
        );
    }
    Ok(Strategy {
        schedule: par.schedule,
        microbatches,
        stages,
        layers,
        zero: par.zero,
        shard_groups: par.shard_groups.max(1),
        recompute,
    })
}

/// Megatron-LM's split of every layer over `d` sample shards of `c` context-parallel
/// groups of `t` tensor-parallel ranks (rank `(sᵢ·c + cᵢ)·t + tᵢ`), found from the layer
/// graph's structure: attention cores by heads;
/// dense layers by columns (QKV, the MLP's first product, the LM head by vocabulary) unless
/// they read columns, then by rows (the projections), whose partial sums are reduced;
/// elementwise layers between a column and a row split by the same features; everything
/// else split by sequence where the kind cuts rows (LayerNorms, dropout, residual adds: an
/// attribute degree cuts their rows), by vocabulary (embeddings: an attribute degree cuts
/// their tables' rows, the pieces' lookups summed) or held whole by every rank of the
/// group. A context-parallel group cuts the rows of what works per token and runs the
/// rest ([`crate::plan::replicas`]) whole on each of its ranks; what looks along the
/// sequence runs whole on `d` ranks.
fn tensor_parallel(graph: &LayerGraph, ops: Option<&Graph>, d: u32, c: u32, t: u32) -> Vec<Split> {
    let columns = Split {
        sample: d,
        context: c,
        attribute: 1,
        parameter: t,
    };
    let rows = Split {
        sample: d,
        context: c,
        attribute: t,
        parameter: 1,
    };
    if t <= 1 && c <= 1 {
        return vec![Split::samples(d); graph.layers.len()];
    }
    let mut split: Vec<Split> = Vec::with_capacity(graph.layers.len());
    for layer in &graph.layers {
        let is_columns = |e: &&Edge| match e.from {
            Producer::Layer(p) => split[p.0 as usize] == columns,
            Producer::Input(_) => false,
        };
        let reads_columns = layer.inputs.iter().any(|e| is_columns(&e));
        // A dense layer is row-parallel when its product reads columns; what its epilogue
        // reads (a residual; SwiGLU's silu(gate), times the up projection) does not decide.
        let product_reads_columns = layer
            .inputs
            .iter()
            .filter(|e| {
                ops.is_none_or(|g| e.value.is_some_and(|v| product_reads(g, graph, layer, v)))
            })
            .any(|e| is_columns(&e));
        split.push(match layer.kind {
            LayerKind::Attention => columns,
            LayerKind::Dense if product_reads_columns => rows,
            LayerKind::Dense => columns,
            // What looks along the sequence cannot take a piece of it.
            LayerKind::Elementwise | LayerKind::LayerNorm if c > 1 && !cuts_rows(layer) => {
                Split::samples(d)
            }
            LayerKind::Elementwise if reads_columns => columns,
            LayerKind::Elementwise | LayerKind::LayerNorm if !cuts_rows(layer) => Split::samples(d),
            _ => rows,
        });
    }
    split
}

/// Whether the executors can cut a layer's rows by a context-parallel group: the layer
/// works on tokens or runs whole (an attention core, an embedding), and what it reshapes
/// and writes keeps a sequence axis of its own (`[batch, sequence, features]`, or a
/// projection's heads written apart, `[batch, sequence, heads, d]`), which the executors
/// follow. A layer that flattens its tokens (`[b·s, h]`) has none.
fn keeps_a_sequence_axis(layer: &Layer) -> bool {
    // Signatures give a sample's shape: at least `[sequence, features]`.
    let sequence =
        |p: &&crate::layers::Part| p.signature.as_ref().is_none_or(|s| s.output.len() >= 2);
    !matches!(
        layer.kind,
        LayerKind::Dense | LayerKind::LayerNorm | LayerKind::Elementwise
    ) || (layer
        .parts
        .iter()
        .filter(|p| p.op == "Reshape")
        .all(|p| sequence(&p))
        && layer.parts.last().as_ref().is_none_or(sequence))
}

/// Whether a matrix product of `layer` reads `v` (the value carrying it in `graph`).
fn product_reads(ops: &Graph, graph: &LayerGraph, layer: &Layer, v: ValueId) -> bool {
    layer.parts.iter().any(|part| {
        matches!(part.op, "MatMul" | "Gemm")
            && ops
                .node(part.node)
                .inputs
                .iter()
                .flatten()
                .any(|&x| carrier(&graph.aliases, x) == v)
    })
}

/// Whether a sequence split of an elementwise or normalization layer computes its rows
/// apart: its tensors have rows (`[b, s, h]`, not a `[b, s]` of token ids) and no op of it
/// looks along them (the cumulative sum that numbers a padded sequence's positions, a
/// triangular mask). Others run whole on one rank of each tensor-parallel group, as
/// Megatron-LM runs what it does not split.
fn cuts_rows(layer: &crate::layers::Layer) -> bool {
    layer.parts.iter().all(|part| {
        !matches!(part.op, "CumSum" | "Trilu" | "Range")
            && part.signature.as_ref().is_none_or(|s| s.output.len() >= 2)
    })
}

/// The attention-core layers of `layer`'s graph: each `Softmax` layer with the layers
/// without weights on either side of it (the scores and context products, the head
/// reshapes), up to the QKV and output projections.
fn attention_cores(graph: &LayerGraph) -> Vec<(usize, usize)> {
    let weightless = |l: usize| graph.layers[l].param_bytes == 0;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for core in softmax_layers(graph) {
        let mut first = core;
        while first > 0 && weightless(first - 1) && runs.last().is_none_or(|r| r.1 < first - 1) {
            first -= 1;
        }
        let mut last = core;
        while last + 1 < graph.layers.len() && weightless(last + 1) {
            last += 1;
        }
        runs.push((first, last));
    }
    runs
}

/// The recomputed runs of `modules` in every block (Megatron-Core's `--recompute-modules`),
/// found from the block's structure: of the dense layers after its attention core, the
/// first is the output projection and the next ones (as many as the first block has) the
/// MLP's.
///
/// * `core_attn`: the attention core, as selective recomputation.
/// * `mlp`: the MLP with the norm before it, from the last cut before the MLP that only
///   the residual stream crosses. The run keeps the norm's input, the residual stream's
///   sequence piece, and its recomputation gathers the norm's output again for the MLP's
///   first product: Megatron-Core's checkpointed MLP keeps its input's piece and gathers
///   it again. (A run from the first product on would keep the gathered input whole.)
/// * `layernorm` is not lowered: Megatron-Core drops a norm's output and makes it again
///   for the product that reads it, but in a plan of layers the QKV projection, in no run,
///   keeps that output, so a norm recomputed alone would free nothing.
fn module_runs(
    graph: &LayerGraph,
    starts: &[usize],
    modules: Modules,
) -> Result<Vec<(usize, usize)>, NotLayered> {
    let refuse = |why: &str| {
        Err(NotLayered(format!(
            "recomputing {} is priced, not lowered yet: {why}",
            modules.names().join(", ")
        )))
    };
    if modules.contains(Modules::EXPERT_ACTIVATION) || modules.contains(Modules::LATENT_UP) {
        return refuse("mixtures of experts and latent attention are not lowered");
    }
    if modules.contains(Modules::LAYER_NORM) {
        return refuse(
            "the QKV projection keeps the norm's output for its backward pass, so recomputing \
             the norm alone frees nothing in a plan of layers (for one, recompute core_attn \
             or mlp)",
        );
    }
    let cores = attention_cores(graph);
    let crossing = crossings(graph);
    let n = graph.layers.len();
    let dense_after = |i: usize| -> Vec<usize> {
        let end = starts.get(i + 1).copied().unwrap_or(n);
        (cores[i].1 + 1..end)
            .filter(|&l| graph.layers[l].kind == LayerKind::Dense)
            .collect()
    };
    // The output projection and the MLP's products: the first block's (a model of one
    // block: all but the last, its head).
    let per_block = match starts.len() {
        1 => dense_after(0).len().saturating_sub(1),
        _ => dense_after(0).len(),
    };
    let mut runs = Vec::new();
    for (i, &(core_first, core_last)) in cores.iter().enumerate() {
        let after = dense_after(i);
        let unlike = || {
            NotLayered(format!(
                "the block from layer {} has no output projection and MLP after its \
                 attention core like the first block's, so its modules cannot be told apart",
                graph.layers[starts[i]].name
            ))
        };
        if per_block < 2 || after.len() < per_block {
            return Err(unlike());
        }
        let (projection, mlp_first, mlp_last) = (after[0], after[1], after[per_block - 1]);
        if modules.contains(Modules::CORE_ATTENTION) {
            runs.push((core_first, core_last));
        }
        if modules.contains(Modules::MLP) {
            let norm = (projection..mlp_first)
                .rev()
                .find(|&j| crossing[j] == 1)
                .map(|j| j + 1)
                .ok_or_else(unlike)?;
            if mlp_last + 1 >= n {
                return Err(unlike());
            }
            runs.push((norm, mlp_last));
        }
    }
    Ok(runs)
}

/// Every block as a recomputed run: from its start to the layer before the next block's;
/// the last block as long as the one before it (blocks are identical), or, alone, up to
/// the last single-tensor cut before the model's last layer.
fn block_runs(graph: &LayerGraph, starts: &[usize]) -> Result<Vec<(usize, usize)>, NotLayered> {
    let n = graph.layers.len();
    let mut runs: Vec<(usize, usize)> = starts.windows(2).map(|w| (w[0], w[1] - 1)).collect();
    let last_start = *starts
        .last()
        .ok_or_else(|| NotLayered("no blocks".into()))?;
    let end = match runs.last() {
        Some(&(first, last)) => last_start + (last - first),
        None => {
            let crossing = crossings(graph);
            (last_start..n.saturating_sub(1))
                .rev()
                .find(|&j| crossing[j] == 1)
                .unwrap_or(last_start)
        }
    };
    if end >= n.saturating_sub(1) {
        return Err(NotLayered(
            "the last block runs into the model's head; its recomputation is not lowered".into(),
        ));
    }
    runs.push((last_start, end));
    Ok(runs)
}

/// Per block, the index of its first layer: after the last cut only one tensor crosses
/// before its attention core (block 0: after the embedding).
fn block_starts(graph: &LayerGraph) -> Result<Vec<usize>, NotLayered> {
    let cores = softmax_layers(graph);
    if cores.is_empty() {
        return Err(NotLayered(
            "the layer graph has no attention core (Softmax) to place stage boundaries at".into(),
        ));
    }
    let crossing = crossings(graph);
    let mut starts = Vec::with_capacity(cores.len());
    let mut previous = 0;
    for &core in &cores {
        // The clean cut nearest before the core: after layer `j`, so the block starts at
        // `j + 1`.
        let start = (previous..core)
            .rev()
            .find(|&j| crossing[j] == 1)
            .map(|j| j + 1)
            .ok_or_else(|| {
                NotLayered(format!(
                    "no single tensor enters the block of layer {} (the residual stream)",
                    graph.layers[core].name
                ))
            })?;
        starts.push(start);
        previous = core;
    }
    Ok(starts)
}

/// The layers holding a `Softmax`: one attention core per block. A mixture of experts'
/// router scores its experts by a softmax too: a softmax layer holding a `TopK`, read by
/// one (the top k of the scores) or reading one (gpt-oss: a softmax of the top k logits)
/// is a router, not an attention core.
fn softmax_layers(graph: &LayerGraph) -> Vec<usize> {
    let has = |l: &Layer, op: &str| l.parts.iter().any(|p| p.op == op);
    let producers = |l: &Layer| {
        l.inputs
            .iter()
            .filter_map(|e| match e.from {
                Producer::Layer(p) => Some(p.0 as usize),
                Producer::Input(_) => None,
            })
            .collect::<Vec<_>>()
    };
    let mut routers = std::collections::BTreeSet::new();
    for (i, l) in graph.layers.iter().enumerate() {
        if has(l, "TopK") {
            routers.insert(i);
            routers.extend(producers(l));
        } else if producers(l).iter().any(|&p| has(&graph.layers[p], "TopK")) {
            routers.insert(i);
        }
    }
    graph
        .layers
        .iter()
        .enumerate()
        .filter(|&(i, l)| has(l, "Softmax") && !routers.contains(&i))
        .map(|(i, _)| i)
        .collect()
}

/// Per layer `j`, how many distinct tensors made by layers `..=j` are read by layers after
/// `j`.
fn crossings(graph: &LayerGraph) -> Vec<u32> {
    let n = graph.layers.len();
    // Per tensor (producer and value), its last reader.
    let mut last_reader: std::collections::BTreeMap<(usize, Option<u32>), usize> =
        std::collections::BTreeMap::new();
    for (c, layer) in graph.layers.iter().enumerate() {
        for e in &layer.inputs {
            if let Producer::Layer(p) = e.from {
                let key = (p.0 as usize, e.value.map(|v| v.index() as u32));
                let reader = last_reader.entry(key).or_insert(c);
                *reader = (*reader).max(c);
            }
        }
    }
    let mut delta = vec![0i64; n + 1];
    for (&(p, _), &c) in &last_reader {
        if c > p {
            delta[p] += 1;
            delta[c] -= 1;
        }
    }
    let mut out = Vec::with_capacity(n);
    let mut running = 0i64;
    for d in delta.iter().take(n) {
        running += d;
        out.push(running.max(0) as u32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::{Layer, Part};
    use crate::profile::Signature;

    /// An elementwise layer of one `op` writing `output` per sample.
    fn elementwise(op: &'static str, output: &[u64]) -> Layer {
        Layer {
            parts: vec![Part {
                node: ralpc_ir::NodeId::from_index(0),
                op,
                signature: Some(Signature {
                    op: op.into(),
                    attrs: Default::default(),
                    input: output.to_vec(),
                    output: output.to_vec(),
                }),
                fwd_flops: 0,
                bytes: 0,
                launches: true,
                weight_product: false,
                steps: 1,
            }],
            ..Layer::bare(LayerKind::Elementwise)
        }
    }

    /// Megatron's sequence split cuts a residual add of `[b, s, h]` by positions, but not
    /// the positions RoBERTa numbers by a cumulative sum over the sequence, nor a
    /// comparison of `[b, s]` token ids, which have no rows to cut.
    #[test]
    fn only_layers_computing_each_position_apart_are_split_by_sequence() {
        assert!(cuts_rows(&elementwise("Add", &[16, 64])));
        assert!(!cuts_rows(&elementwise("CumSum", &[16, 64])));
        assert!(!cuts_rows(&elementwise("Equal", &[16])));
    }
}
