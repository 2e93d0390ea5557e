//! The plan's buffer sizes, programs and layout, recomputed: `ralpc run` never trusts a
//! size, an instruction or a layer's placement written in a plan file. Its placement is lowered again on the model,
//! at the precision and optimizer the plan records; each rank's buffers must come out the
//! sizes the file says, and its layout (which ops each layer runs where) the one the file
//! gives the executor, or the plan is refused before anything is allocated.
//!
//! Buffer sizes depend on the model, the placement, the precision and the optimizer, not on
//! the cluster's speeds (only instruction order and durations do), so the plan's cluster
//! preset stands in where it is known and the default one where it was a file.

use std::collections::BTreeMap;
use std::path::Path;

use ralpc_codegen::plan::{Buffer, BufferKind, Instruction, Plan};
use ralpc_codegen::Layout;
use ralpc_ir::Graph;
use ralpc_passes::cluster::Cluster;
use ralpc_passes::cost::compute::FusedAttention;
use ralpc_passes::cost::rates::KernelRates;
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
            // Sizes only: any kernel's rates size a fused core alike.
            fused_attention: plan.fused_attention.then(|| {
                let rates = KernelRates::new(cluster.gpu(0), plan.precision);
                FusedAttention {
                    forward: rates.attention_forward,
                    backward: rates.attention_backward,
                }
            }),
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
    check_programs(plan, &again).map_err(|Differs(m)| refuse(m))?;
    check_layout(plan, Layout::describe(model, &graph, &strategy)).map_err(|Differs(m)| refuse(m))
}

/// How an edited plan differs from what its placement lowers to: the plan file's fault
/// ([`Error::PlanFile`], with its path).
struct Differs(String);

/// Refuses programs that do not do the work the placement gives: the same microbatches
/// and groups, and on every rank the same instructions (each layer's forward and backward
/// on every microbatch once, every message, every gradient's reduction, every step), so
/// that an edited plan cannot train on part of the batch or leave a gradient unreduced
/// with exit 0. Durations are left out (they depend on the cluster, which may have been a
/// file); where they all agree — the plan was made for this cluster — the order must be
/// the lowering's too, so that an edited order is a bad plan rather than a failed run.
fn check_programs(plan: &Plan, again: &Plan) -> Result<(), Differs> {
    if plan.microbatches != again.microbatches {
        return Err(Differs(format!(
            "it says {} microbatches; its placement runs {}",
            plan.microbatches, again.microbatches
        )));
    }
    if plan.groups != again.groups {
        return Err(Differs(
            "its communicator groups are not those its placement gives".to_owned(),
        ));
    }
    if plan.programs.len() != again.programs.len() {
        return Err(Differs(format!(
            "it has programs for {} ranks; its placement gives {}",
            plan.programs.len(),
            again.programs.len()
        )));
    }
    for (rank, (written, expected)) in plan.programs.iter().zip(&again.programs).enumerate() {
        let (have, want) = (work(written), work(expected));
        if let Some(k) = have
            .keys()
            .chain(want.keys())
            .find(|k| have.get(*k) != want.get(*k))
        {
            let n = |c: &BTreeMap<Work, u64>| c.get(k).copied().unwrap_or(0);
            let (have, want) = (n(&have), n(&want));
            return Err(Differs(match k {
                Work::Each(key) => format!(
                    "rank {rank} has {have} × {}; its placement gives {want}",
                    words(key, plan)
                ),
                Work::Bytes(op, group) => format!(
                    "rank {rank}'s {op} instructions{} cover {have} bytes; its placement \
                     gives {want}",
                    group
                        .map(|g| format!(" over group {g}"))
                        .unwrap_or_default()
                ),
            }));
        }
        let priced = |program: &[Instruction]| {
            let mut keys: Vec<String> = program.iter().map(|i| key(i, true)).collect();
            keys.sort_unstable();
            keys
        };
        if priced(written) != priced(expected) {
            // Priced for another cluster: its buckets and its order may differ.
            continue;
        }
        if let Some(i) = (0..written.len()).find(|&i| written[i] != expected[i]) {
            return Err(Differs(format!(
                "rank {rank}'s instruction {i} is {}; its placement on this cluster runs {} \
                 there",
                words(&key(&written[i], false), plan),
                words(&key(&expected[i], false), plan)
            )));
        }
    }
    Ok(())
}

/// A part of a rank's work, as compared across clusters.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Work {
    /// An instruction that must appear as often (a layer's pass on a microbatch, a
    /// message, a tied weight's reduction and step): its unpriced key.
    Each(String),
    /// Collectives and sharded steps of one kind over one group: their buckets are sized
    /// for the cluster, their total bytes are not.
    Bytes(&'static str, Option<u32>),
}

/// A rank's work: how many of each instruction, and how many bytes each kind of bucketed
/// instruction moves over each group.
fn work(program: &[Instruction]) -> BTreeMap<Work, u64> {
    let mut work = BTreeMap::new();
    for i in program {
        let (part, n) = match *i {
            Instruction::AllReduce {
                group,
                bytes,
                tied: None,
                ..
            }
            | Instruction::AllGather { group, bytes, .. }
            | Instruction::ReduceScatter { group, bytes, .. }
            | Instruction::AllToAll { group, bytes, .. }
            | Instruction::Step {
                group: Some(group),
                bytes,
                tied: None,
                ..
            } => (Work::Bytes(i.op(), Some(group)), bytes),
            Instruction::Step {
                bytes, tied: None, ..
            } => (Work::Bytes(i.op(), None), bytes),
            _ => (Work::Each(key(i, false)), 1),
        };
        *work.entry(part).or_default() += n;
    }
    work
}

/// An instruction as compared, with or without its durations.
fn key(i: &Instruction, priced: bool) -> String {
    let mut i = i.clone();
    if !priced {
        match &mut i {
            Instruction::Forward { us, .. }
            | Instruction::Recompute { us, .. }
            | Instruction::Backward { us, .. }
            | Instruction::WeightGradient { us, .. }
            | Instruction::Step { us, .. } => *us = 0.0,
            Instruction::Send { us, latency_us, .. }
            | Instruction::Recv { us, latency_us, .. }
            | Instruction::AllReduce { us, latency_us, .. }
            | Instruction::AllGather { us, latency_us, .. }
            | Instruction::ReduceScatter { us, latency_us, .. }
            | Instruction::AllToAll { us, latency_us, .. } => (*us, *latency_us) = (0.0, 0.0),
        }
    }
    // Strings and finite numbers always serialize; a key is also how errors name it.
    serde_json::to_string(&i).unwrap_or_default()
}

/// An unpriced instruction's key in words, its layer named.
fn words(key: &str, plan: &Plan) -> String {
    let Ok(serde_json::Value::Object(mut fields)) = serde_json::from_str(key) else {
        return key.to_owned();
    };
    fields.remove("us");
    fields.remove("latency_us");
    if let Some(l) = fields.get("layer").and_then(serde_json::Value::as_u64) {
        let name = plan.layers.get(l as usize).map_or("?", String::as_str);
        fields.insert("layer".into(), name.into());
    }
    serde_json::Value::Object(fields).to_string()
}

/// Refuses a layout that is not `expected`, naming the first layer or edge that differs.
fn check_layout(plan: &Plan, expected: Option<Layout>) -> Result<(), Differs> {
    let Some(expected) = expected else {
        // A model without ops to lay out; the executor refuses it, saying why.
        return Ok(());
    };
    let Some(written) = &plan.layout else {
        return Err(Differs(
            "it has no layout of its layers on the model's ops: plan the model again with \
             this ralpc"
                .to_owned(),
        ));
    };
    let name = |l: usize| plan.layers.get(l).map_or("?", String::as_str);
    if let Some(l) = (0..written.layers.len().max(expected.layers.len()))
        .find(|&l| written.layers.get(l) != expected.layers.get(l))
    {
        return Err(Differs(format!(
            "its layout of layer '{}' is not the one its placement gives on this model",
            name(l)
        )));
    }
    if let Some(i) = (0..written.edges.len().max(expected.edges.len()))
        .find(|&i| written.edges.get(i) != expected.edges.get(i))
    {
        return Err(Differs(format!(
            "its layout's edge {i} is not the one its placement gives on this model"
        )));
    }
    if *written != expected {
        return Err(Differs(
            "its layout's aliases or recomputed runs are not those its placement gives on \
             this model"
                .to_owned(),
        ));
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
