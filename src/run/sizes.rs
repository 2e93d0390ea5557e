//! The plan's buffer sizes and layout, recomputed: `ralpc run` never trusts a size or a
//! layer's placement written in a plan file. Its placement is lowered again on the model,
//! at the precision and optimizer the plan records; each rank's buffers must come out the
//! sizes the file says, and its layout (which ops each layer runs where) the one the file
//! gives the executor, or the plan is refused before anything is allocated.
//!
//! Buffer sizes depend on the model, the placement, the precision and the optimizer, not on
//! the cluster's speeds (only instruction order and durations do), so the plan's cluster
//! preset stands in where it is known and the default one where it was a file.

use std::path::Path;

use ralpc_codegen::plan::{Buffer, BufferKind, Plan};
use ralpc_codegen::Layout;
use ralpc_ir::Graph;
use ralpc_passes::cluster::Cluster;
use ralpc_passes::layers::LayerGraph;
use ralpc_passes::plan::{CostOptions, Costs};

use crate::cluster::DEFAULT_CLUSTER;
use crate::error::Error;

/// A buffer as compared: what it holds, and its size.
type Sized = (BufferKind, Option<u32>, Option<u32>, u64);

/// Refuses `plan` (read from `file`) when a rank's buffers or its layout are not those its
/// placement gives on `layers` (the layer graph of `model` at the plan's batch).
///
/// # Errors
/// [`Error::PlanFile`] naming the rank and the first buffer that differs, or the first
/// layer or edge of the layout.
pub(super) fn check(
    plan: &Plan,
    file: &Path,
    model: &Graph,
    layers: &LayerGraph,
) -> Result<(), Error> {
    let refuse = |m: String| Error::PlanFile(Box::new(format!("{}: {m}", file.display())));
    let graph = layers
        .clone()
        .with_activation_bytes(plan.precision.activation_bytes());
    let cluster = Cluster::resolve(&plan.cluster)
        .or_else(|_| Cluster::resolve(DEFAULT_CLUSTER))
        .map_err(|e| Error::Internal(Box::new(format!("the default cluster: {e}"))))?;
    let have = cluster.gpu_count().max(1);
    let cluster = if plan.ranks > have {
        cluster.times(plan.ranks.div_ceil(have))
    } else {
        cluster
    };
    let costs = Costs::new(
        &graph,
        &cluster,
        plan.ranks,
        CostOptions {
            precision: plan.precision,
            optimizer: plan.optimizer,
            ..CostOptions::default()
        },
    );
    let strategy = plan
        .strategy
        .resolve(&graph)
        .map_err(|e| refuse(format!("its strategy: {e}")))?;
    let again = ralpc_codegen::lower(&costs, &strategy, plan.model.clone())
        .map_err(|e| refuse(format!("its placement does not lower on this model: {e}")))?;
    for (rank, (written, expected)) in plan.buffers.iter().zip(&again.buffers).enumerate() {
        let (written, expected) = (sorted(written), sorted(expected));
        if written.len() != expected.len() {
            return Err(refuse(format!(
                "rank {rank} lists {} buffers; its placement on the model gives {}",
                written.len(),
                expected.len()
            )));
        }
        if let Some((w, e)) = written.iter().zip(&expected).find(|(w, e)| w != e) {
            return Err(refuse(format!(
                "rank {rank}: {} is {} bytes in the plan; the model and the plan's placement \
                 give {}",
                describe(e, plan),
                w.3,
                e.3
            )));
        }
    }
    if plan.buffers.len() != again.buffers.len() {
        return Err(refuse(format!(
            "it lists buffers for {} ranks; its placement gives {}",
            plan.buffers.len(),
            again.buffers.len()
        )));
    }
    check_layout(plan, Layout::describe(model, &graph, &strategy)).map_err(refuse)
}

/// Refuses a layout that is not `expected`, naming the first layer or edge that differs.
fn check_layout(plan: &Plan, expected: Option<Layout>) -> Result<(), String> {
    let Some(expected) = expected else {
        // A model without ops to lay out; the executor refuses it, saying why.
        return Ok(());
    };
    let Some(written) = &plan.layout else {
        return Err(
            "it has no layout of its layers on the model's ops: plan the model again \
                    with this ralpc"
                .to_owned(),
        );
    };
    let name = |l: usize| plan.layers.get(l).map_or("?", String::as_str);
    if let Some(l) = (0..written.layers.len().max(expected.layers.len()))
        .find(|&l| written.layers.get(l) != expected.layers.get(l))
    {
        return Err(format!(
            "its layout of layer '{}' is not the one its placement gives on this model",
            name(l)
        ));
    }
    if let Some(i) = (0..written.edges.len().max(expected.edges.len()))
        .find(|&i| written.edges.get(i) != expected.edges.get(i))
    {
        return Err(format!(
            "its layout's edge {i} is not the one its placement gives on this model"
        ));
    }
    if *written != expected {
        return Err(
            "its layout's aliases or recomputed runs are not those its placement gives on \
             this model"
                .to_owned(),
        );
    }
    Ok(())
}

/// A rank's buffers in a canonical order: instruction order depends on the cluster, their
/// set does not.
fn sorted(buffers: &[Buffer]) -> Vec<Sized> {
    let mut v: Vec<Sized> = buffers
        .iter()
        .map(|b| (b.kind, b.layer, b.microbatch, b.bytes))
        .collect();
    v.sort_unstable();
    v
}

/// "the activation of layer 'conv1' on microbatch 2", for an error.
fn describe(&(kind, layer, microbatch, _): &Sized, plan: &Plan) -> String {
    // The name the plan file gives the kind (`input_gradient`).
    let kind = serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut s = format!("its {kind} buffer");
    if let Some(l) = layer {
        let name = plan.layers.get(l as usize).map_or("?", String::as_str);
        s += &format!(" of layer '{}'", name);
    }
    if let Some(mb) = microbatch {
        s += &format!(" on microbatch {mb}");
    }
    s
}
