//! ZeRO on the executor (1: a sharded optimizer, Megatron-LM's distributed optimizer; 2:
//! sharded gradients; 3: sharded weights): a gradient bucket is reduce-scattered over its
//! replica group (under ZeRO-2 and 3 after every microbatch), each member updates its
//! share of the bucket's weights, and the updated shares are all-gathered (under ZeRO-3
//! before every pass too: the executor holds whole weights, and gathering the shares of
//! equal copies leaves them equal).
//!
//! A bucket's tensors are this rank's trained weights of its layers in layer order, laid
//! end to end (as the bucket's all-reduce lays them); member `i` of `n` (ranks in order)
//! owns elements `⌊i·N/n⌋..⌊(i+1)·N/n⌋` of the `N`. The update is elementwise, so training
//! equals the unsharded update exactly.

use ralpc_codegen::plan::BufferKind;
use ralpc_ir::ValueId;

use super::super::floats::Floats;
use super::super::kernels;
use super::super::region::interval;
use super::{Rank, RankError};

impl Rank<'_, '_> {
    /// The weights of the bucket instruction `index` touches (its buffers of `kind`).
    pub(super) fn bucket_weights(&self, index: u32, kind: BufferKind) -> Vec<ValueId> {
        self.p
            .bucket_weights(&self.touched(index), kind, |l, w| self.trains(l, w))
    }

    /// This rank's gradients of `keys`, end to end (zeros for a weight it has none of yet).
    pub(super) fn flat_gradients(&mut self, keys: &[ValueId]) -> Vec<f32> {
        let mut flat = Vec::new();
        for &w in keys {
            let n = self.weights.get(&w).map_or(0, |(_, t)| t.len());
            let g = self.grads.entry(w).or_insert_with(|| vec![0.0; n].into());
            flat.extend_from_slice(g);
        }
        flat
    }

    /// Writes `flat[range]` back into the gradients of `keys` laid end to end.
    fn store_gradients(&mut self, keys: &[ValueId], range: std::ops::Range<usize>, flat: &[f32]) {
        let mut at = 0;
        for &w in keys {
            let Some(g) = self.grads.get_mut(&w) else {
                continue;
            };
            let n = g.len();
            let lo = range.start.clamp(at, at + n);
            let hi = range.end.clamp(at, at + n);
            if lo < hi {
                g.make_mut()[lo - at..hi - at]
                    .copy_from_slice(&flat[lo - range.start..hi - range.start]);
            }
            at += n;
        }
    }

    /// This rank's share of a bucket of `total` elements over `group`.
    fn shard(&self, group: &[u32], total: usize) -> Result<std::ops::Range<usize>, RankError> {
        let mut members = group.to_vec();
        members.sort_unstable();
        let i = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| format!("rank {} is not in the group {group:?}", self.rank))?;
        Ok(interval((i as u32, members.len() as u32), total))
    }

    /// Sums a gradient bucket over `group`, keeping this rank's share of the sum and
    /// zeroing the rest: what the following microbatches add to it is theirs alone, so a
    /// reduce-scatter after each (ZeRO-2) sums every microbatch exactly once.
    pub(super) fn reduce_scatter_gradients(
        &mut self,
        index: u32,
        group: Vec<u32>,
    ) -> Result<(), RankError> {
        let keys = self.bucket_weights(index, BufferKind::Gradients);
        let flat = self.flat_gradients(&keys);
        // Every member sends all of it and adds the others' copies of its share (the CPU
        // backend's reduce-scatter); shares follow the executor's piece rule.
        let all = self
            .comm
            .exchange(&group, flat.clone())
            .map_err(RankError::from)?;
        let mine = self.shard(&group, flat.len())?;
        let mut kept = vec![0.0f32; flat.len()];
        for part in &all {
            let part = part
                .get(mine.clone())
                .ok_or("a member's gradient bucket has another size")?;
            kernels::add(&mut kept[mine.clone()], part);
        }
        self.store_gradients(&keys, 0..flat.len(), &kept);
        Ok(())
    }

    /// Updates this rank's share of the bucket step `index` touches; the gradients of the
    /// bucket are then spent. At the first step, the shares' reduced gradients are
    /// gathered for the report (a check only, not part of the plan).
    pub(super) fn sharded_step(&mut self, index: u32, group: Vec<u32>) -> Result<(), RankError> {
        let keys = self.bucket_weights(index, BufferKind::Weights);
        let total: usize = keys
            .iter()
            .map(|w| self.weights.get(w).map_or(0, |(_, t)| t.len()))
            .sum();
        let mine = self.shard(&group, total)?;
        if self.step == 0 && self.options.report_tensors {
            let flat = self.flat_gradients(&keys);
            let shares = self
                .comm
                .exchange(&group, flat[mine.clone()].to_vec())
                .map_err(RankError::from)?
                .concat();
            let mut at = 0;
            for &w in &keys {
                if let Some((slice, t)) = self.weights.get(&w) {
                    let n = t.len();
                    let g = shares
                        .get(at..at + n)
                        .ok_or("a gradient share is missing")?;
                    self.report.gradients.push((w, slice.clone(), g.to_vec()));
                    at += n;
                }
            }
        }
        let (lr, momentum) = (self.options.lr, self.options.momentum);
        let mut at = 0;
        for &w in &keys {
            let g = self
                .grads
                .remove(&w)
                .map(Floats::into_vec)
                .unwrap_or_default();
            let Some((_, t)) = self.weights.get_mut(&w) else {
                continue;
            };
            let n = t.len();
            let Some(x) = t.floats_mut() else {
                return Err(
                    format!("weight '{}' is not float", self.p.exe.graph.value(w).name).into(),
                );
            };
            let (lo, hi) = (mine.start.clamp(at, at + n), mine.end.clamp(at, at + n));
            self.owned_momentum.insert(w, lo - at..hi - at);
            if lo < hi && g.len() == n {
                let v = self
                    .velocity
                    .entry(w)
                    .or_insert_with(|| vec![0.0; n].into())
                    .make_mut();
                kernels::sgd_momentum(
                    &mut x[lo - at..hi - at],
                    &g[lo - at..hi - at],
                    &mut v[lo - at..hi - at],
                    lr,
                    momentum,
                );
            }
            at += n;
        }
        Ok(())
    }

    /// Gathers the updated shares of the bucket's weights from every member of `group`.
    pub(super) fn all_gather_weights(
        &mut self,
        index: u32,
        group: Vec<u32>,
    ) -> Result<(), RankError> {
        let keys = self.bucket_weights(index, BufferKind::Weights);
        let mut flat = Vec::new();
        for w in &keys {
            if let Some(x) = self.weights.get(w).and_then(|(_, t)| t.floats()) {
                flat.extend_from_slice(x);
            }
        }
        let mine = self.shard(&group, flat.len())?;
        let all = self
            .comm
            .exchange(&group, flat[mine].to_vec())
            .map_err(RankError::from)?
            .concat();
        if all.len() != flat.len() {
            return Err("the members' weight shares do not make up the bucket".into());
        }
        let mut at = 0;
        for w in &keys {
            if let Some((_, t)) = self.weights.get_mut(w) {
                let n = t.len();
                if let Some(x) = t.floats_mut() {
                    x.copy_from_slice(&all[at..at + n]);
                }
                at += n;
            }
        }
        Ok(())
    }
}
