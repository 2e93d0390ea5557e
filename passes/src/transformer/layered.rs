//! The layer-graph form of a transformer plan: the [`Strategy`] the layered planner, the
//! lowering and the executors understand, for the configurations it can express —
//! pipeline stages holding whole blocks, each replicated over its data-parallel GPUs.
//!
//! Stage boundaries are the blocks' boundaries in the model's own layer graph: the
//! attention cores (one `Softmax` layer per block) number the blocks, and block `i` starts
//! after the last *clean* cut before its attention core — a cut that only the residual
//! stream crosses (inside a block, the residual and the branch both cross). That holds
//! for any exporter's layer graph of a pre-LayerNorm decoder, whatever its node names.

use crate::layers::{LayerGraph, Producer, Split};
use crate::plan::{Stage, Strategy};

use super::{Estimate, Recompute};

/// Why a transformer plan has no layer-graph form (it is priced, not lowered).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotLayered(pub String);

/// The layered strategy of `plan` for `graph` (the model's layer graph at the global batch).
///
/// # Errors
/// [`NotLayered`] naming the option the layered form cannot express yet (tensor or
/// sequence parallelism, interleaving, recomputation, ZeRO), or a layer graph whose blocks
/// cannot be told apart.
pub fn layered(graph: &LayerGraph, plan: &Estimate) -> Result<Strategy, NotLayered> {
    let par = plan.parallelism;
    let refuse = |what: &str, fix: &str| {
        Err(NotLayered(format!(
            "{what} is priced but not lowered to an executable plan yet (for one, add {fix})"
        )))
    };
    if par.tensor > 1 {
        return refuse("tensor parallelism", "--tensor-parallel 1");
    }
    if par.sequence_parallel {
        return refuse("sequence parallelism", "--sequence-parallel off");
    }
    if par.virtual_stages > 1 {
        return refuse("the interleaved schedule", "--virtual-stages 1");
    }
    if par.recompute != Recompute::None {
        return refuse("activation recomputation", "--recompute none");
    }
    if par.zero > 0 {
        return refuse("ZeRO sharding", "--zero 0");
    }
    let starts = block_starts(graph)?;
    let blocks = starts.len() as u64;
    if plan.stage_layers.iter().sum::<u64>() != blocks {
        return Err(NotLayered(format!(
            "the layer graph has {blocks} attention cores where the plan places {} blocks",
            plan.stage_layers.iter().sum::<u64>()
        )));
    }
    let d = par.data;
    let mut stages = Vec::with_capacity(plan.stage_layers.len());
    let mut block = 0u64;
    for (k, &n) in plan.stage_layers.iter().enumerate() {
        let first_layer = if k == 0 { 0 } else { starts[block as usize] };
        block += n;
        let last_layer = match starts.get(block as usize) {
            Some(&next) if k + 1 < plan.stage_layers.len() => next - 1,
            _ => graph.layers.len() - 1,
        };
        if last_layer < first_layer {
            return Err(NotLayered(format!("stage {k} holds no layer")));
        }
        stages.push(Stage {
            first_layer,
            last_layer,
            first_rank: k as u32 * d,
            gpus: d,
        });
    }
    let microbatches = u32::try_from(plan.microbatches)
        .map_err(|_| NotLayered(format!("{} microbatches", plan.microbatches)))?;
    Ok(Strategy {
        schedule: par.schedule,
        microbatches,
        stages,
        layers: vec![Split::samples(d); graph.layers.len()],
    })
}

/// Per block, the index of its first layer: after the last cut only one tensor crosses
/// before its attention core (block 0: after the embedding).
fn block_starts(graph: &LayerGraph) -> Result<Vec<usize>, NotLayered> {
    let cores: Vec<usize> = graph
        .layers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.parts.iter().any(|p| p.op == "Softmax"))
        .map(|(i, _)| i)
        .collect();
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
