//! Gradient buckets as the plan lays them out: which weights a bucket's collective sums
//! (its layers' owned weights, in layer order).

use std::collections::BTreeMap;

use ralpc_codegen::plan::{BufferKind, Plan};
use ralpc_ir::ValueId;

use super::{LayerExec, Prepared, Touch};

impl Prepared<'_> {
    /// The weights of the bucket whose buffers of `kind` an instruction touches
    /// (`touched`), in layer order: what its collective lays end to end. `trains` says
    /// whether the rank trains a weight in a layer (holds its piece).
    pub(super) fn bucket_weights(
        &self,
        touched: &[Touch],
        kind: BufferKind,
        trains: impl Fn(&LayerExec, ValueId) -> bool,
    ) -> Vec<ValueId> {
        let mut layers: Vec<usize> = touched
            .iter()
            .filter(|t| t.0 == kind)
            .filter_map(|t| Some(t.1? as usize))
            .collect();
        layers.sort_unstable();
        layers.dedup();
        let mut keys = Vec::new();
        for l in layers {
            let layer = &self.layers[l];
            for &w in &layer.owned {
                if trains(layer, w) && !keys.contains(&w) {
                    keys.push(w);
                }
            }
        }
        keys
    }
}

/// Per instruction of rank `rank`'s program, the buffers it reads and writes.
pub(super) fn touches(plan: &Plan, rank: u32) -> BTreeMap<u32, Vec<Touch>> {
    let mut touches: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for b in plan.buffers.get(rank as usize).into_iter().flatten() {
        for (instructions, writes) in [(&b.reads, false), (&b.writes, true)] {
            for &i in instructions {
                touches
                    .entry(i)
                    .or_default()
                    .push((b.kind, b.layer, b.microbatch, writes));
            }
        }
    }
    touches
}
