//! When a layer's outputs may go before its backward pass: the plan says which
//! instructions read each activation (the consumers' forward passes, the messages and
//! collectives that carry it); after the last of them before the layer's backward, the
//! outputs its backward does not read ([`ralpc_ir::Op::backward_reads`]) are released, as
//! the cost model counts them (a layer's stash is what its backward reads).

use std::collections::BTreeMap;

use ralpc_codegen::plan::{BufferKind, Instruction, Plan};

use super::*;

/// Per instruction of rank `rank`'s program, the (layer, microbatch) activations no
/// instruction but the layer's own backward reads after it.
pub(super) fn last_forward_uses(plan: &Plan, rank: u32) -> BTreeMap<u32, Vec<(usize, u32)>> {
    let program = plan.programs.get(rank as usize).map_or(&[][..], |p| &p[..]);
    let backward_of = |l: u32, mb: u32| {
        program.iter().position(|i| {
            matches!(i, Instruction::Backward { layer, microbatch, .. }
                if *layer == l && *microbatch == mb)
        })
    };
    let mut after: BTreeMap<u32, Vec<(usize, u32)>> = BTreeMap::new();
    for b in plan.buffers.get(rank as usize).into_iter().flatten() {
        let (BufferKind::Activation, Some(l), Some(mb)) = (b.kind, b.layer, b.microbatch) else {
            continue;
        };
        let Some(backward) = backward_of(l, mb) else {
            continue;
        };
        let last = b
            .reads
            .iter()
            .chain(&b.writes)
            .copied()
            .filter(|&i| (i as usize) < backward)
            .max();
        if let Some(last) = last {
            after.entry(last).or_default().push((l as usize, mb));
        }
    }
    after
}

impl Rank<'_, '_> {
    /// Releases what the activations whose last forward use instruction `index` was hold
    /// that their layers' backward passes do not read (the model's output stays: the loss
    /// reads it).
    pub(super) fn release_after(&mut self, index: u32) {
        let p = self.p;
        let Some(done) = self.last_forward_uses.get(&index) else {
            return;
        };
        for &(l, mb) in done {
            let Some(k) = p.layers[l].holds(self.rank) else {
                continue;
            };
            // A layer split by its gates keeps no records: its backward reads all it held.
            if p.gate_split(&p.layers[l]).is_some() {
                continue;
            }
            // Nor does a dispatched experts layer keep its experts' records: their backward
            // runs them again from what the layer read.
            let Some(run) = self
                .runs
                .get_mut(&(l, mb))
                .filter(|run| !run.dropped && !run.dispatched)
            else {
                continue;
            };
            let output = [p.output.1];
            let keep = if p.output.0 == l { &output[..] } else { &[] };
            run.values
                .release_unread(p.graph_of(l, k), &run.records, keep);
        }
    }
}
