//! Gradient buckets as the plan lays them out: which weights a bucket's collective sums
//! (its layers' owned weights, in layer order), and a rank's buckets in launch order, for
//! the devices' own data-parallel loop.

use std::collections::BTreeMap;

use ralpc_codegen::plan::{BufferKind, Instruction, Plan};
use ralpc_ir::ValueId;

use super::{setup, Executable, LayerExec, Prepared, RunError, Touch};

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

impl Executable<'_> {
    /// Rank `rank`'s gradient buckets in the order its program launches them: per
    /// collective of gradients, the weights it sums (a weight several layers read that the
    /// plan sums by its own all-reduce: that weight alone). What a device's data-parallel
    /// loop sums as its backward completes them; a rank holding its layers whole, as data
    /// parallelism has them, trains every weight they own.
    ///
    /// # Errors
    /// The plan does not fit the model, or names a tied weight the model does not train.
    pub fn gradient_buckets(&self, rank: u32) -> Result<Vec<Vec<ValueId>>, RunError> {
        let p = Prepared::new(self)?;
        let touches = touches(self.plan, rank);
        let gradients = |i: u32, written: bool| {
            let touched = touches.get(&i).map_or(&[][..], Vec::as_slice);
            let moves = touched
                .iter()
                .any(|&(k, _, _, w)| k == BufferKind::Gradients && w == written);
            moves.then(|| p.bucket_weights(touched, BufferKind::Gradients, |_, _| true))
        };
        let program = self
            .plan
            .programs
            .get(rank as usize)
            .map_or(&[][..], Vec::as_slice);
        let mut buckets = Vec::new();
        for (i, instruction) in (0u32..).zip(program) {
            let bucket = match instruction {
                Instruction::AllReduce {
                    tied: Some(name), ..
                } => {
                    let w = self
                        .weights
                        .trainable
                        .iter()
                        .copied()
                        .find(|&w| self.graph.value(w).name == *name);
                    Some(vec![w.ok_or_else(|| {
                        setup(format!(
                            "the plan sums the tied weight '{name}', which the model does not train"
                        ))
                    })?])
                }
                Instruction::AllReduce { .. } => gradients(i, false),
                Instruction::ReduceScatter { .. } => gradients(i, true),
                _ => None,
            };
            buckets.extend(bucket.filter(|b| !b.is_empty()));
        }
        Ok(buckets)
    }
}
