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

use std::ops::Range;

use super::super::floats::{Floats, Piece};
use super::super::kernels;
use super::super::region::interval;
use super::super::tensor::{Data, Tensor};
use super::failure::bug;
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
            let n = self.weight_len(w);
            let g = self.grads.entry(w).or_insert_with(|| vec![0.0; n].into());
            flat.extend_from_slice(g);
        }
        flat
    }

    /// This rank's share of a bucket of `total` elements over `group`.
    pub(super) fn shard(
        &self,
        group: &[u32],
        total: usize,
    ) -> Result<std::ops::Range<usize>, RankError> {
        let mut members = group.to_vec();
        members.sort_unstable();
        let i = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| bug(format!("rank {} is not in the group {group:?}", self.rank)))?;
        Ok(interval((i as u32, members.len() as u32), total))
    }

    /// Elements `range` of `f` (of `n`), cut where `f` is: on the device when resident.
    pub(super) fn cut_range(
        &self,
        f: &Floats,
        n: usize,
        range: Range<usize>,
    ) -> Result<Floats, RankError> {
        if let Some(cut) = self
            .compute
            .crop(f, &whole(n), std::slice::from_ref(&range))
            .map_err(RankError::from)?
        {
            return Ok(cut);
        }
        f.get(range)
            .map(|part| Floats::from(part.to_vec()))
            .ok_or_else(|| bug("a share outside its tensor"))
    }

    /// `n` elements from `parts` (each a range and its elements), which cover them once:
    /// joined on the device where they are resident, else on the host.
    pub(super) fn join_ranges(
        &self,
        n: usize,
        parts: &[(Range<usize>, Floats)],
    ) -> Result<Floats, RankError> {
        let boxes: Vec<[Range<usize>; 1]> = parts.iter().map(|(r, _)| [r.clone()]).collect();
        let parts_ref: Vec<Piece<'_>> = boxes
            .iter()
            .zip(parts)
            .map(|(b, (_, f))| (b.as_slice(), f))
            .collect();
        if let Some(joined) = self
            .compute
            .paste(&whole(n), &parts_ref)
            .map_err(RankError::from)?
        {
            return Ok(joined);
        }
        let mut out = vec![0.0f32; n];
        for (range, f) in parts {
            out.get_mut(range.clone())
                .filter(|to| to.len() == f.len())
                .ok_or_else(|| bug("a part outside the tensor it joins"))?
                .copy_from_slice(f);
        }
        Ok(out.into())
    }

    /// `x` (of `n` elements) with elements `range` replaced by `part`: in place where `x`
    /// is, when nothing else holds it.
    fn write_range(
        &self,
        x: Floats,
        n: usize,
        range: Range<usize>,
        part: &Floats,
    ) -> Result<Floats, RankError> {
        let holder = whole(n);
        match self
            .compute
            .overwrite(x, &holder, std::slice::from_ref(&range), part)?
        {
            Ok(x) => Ok(x),
            Err(mut x) => {
                x.make_mut()
                    .get_mut(range)
                    .filter(|to| to.len() == part.len())
                    .ok_or_else(|| bug("a share outside the tensor it is written into"))?
                    .copy_from_slice(part);
                Ok(x)
            }
        }
    }

    /// Sums a gradient bucket over `group` and keeps this rank's share of the sum alone
    /// (added to what earlier microbatches' reduce-scatters left in it, under ZeRO-2): the
    /// whole gradients go, and the following microbatches' start from nothing, so every
    /// microbatch is summed exactly once and only the shares outlive a bucket's
    /// reduce-scatter, as the plan's memory counts them. On a device with a collective over
    /// the group, the bucket is summed there and stays there.
    pub(super) fn reduce_scatter_gradients(
        &mut self,
        index: u32,
        group: Vec<u32>,
    ) -> Result<(), RankError> {
        let keys = self.bucket_weights(index, BufferKind::Gradients);
        let lens: Vec<usize> = keys.iter().map(|&w| self.weight_len(w)).collect();
        let total = lens.iter().sum();
        let mine = self.shard(&group, total)?;
        let mut bucket = Vec::with_capacity(keys.len());
        for (w, &n) in keys.iter().zip(&lens) {
            bucket.push(match self.grads.remove(w) {
                Some(g) => g,
                None => self.compute.zeros(n).map_err(RankError::from)?,
            });
        }
        let mut members = group.clone();
        members.sort_unstable();
        let summed = self.compute.all_reduce(&members, &mut bucket);
        let on_device = summed.map_err(RankError::from);
        if !matches!(on_device, Ok(true)) {
            for (&w, g) in keys.iter().zip(bucket) {
                self.grads.insert(w, g);
            }
            on_device?;
            return self.reduce_scatter_on_host(&keys, &group, mine);
        }
        let mut at = 0;
        for ((&w, g), n) in keys.iter().zip(bucket).zip(lens) {
            let keep = mine.start.clamp(at, at + n) - at..mine.end.clamp(at, at + n) - at;
            at += n;
            if keep.is_empty() {
                continue;
            }
            let part = self.cut_range(&g, n, keep.clone())?;
            drop(g);
            self.add_gradient_share(w, keep, part)?;
        }
        Ok(())
    }

    /// Adds `part`, the elements `range` of weight `w`'s summed gradient, to this rank's
    /// share of it so far, where they are.
    fn add_gradient_share(
        &mut self,
        w: ValueId,
        range: Range<usize>,
        part: Floats,
    ) -> Result<(), RankError> {
        if range.is_empty() {
            // None of this weight is this rank's to update.
            return Ok(());
        }
        let sum = match self.gradient_shares.remove(&w) {
            Some((held, _)) if held != range => {
                return Err(RankError::Inconsistent(format!(
                    "the gradient of '{}' is reduce-scattered into shares {held:?} and \
                     {range:?} on one rank",
                    self.p.exe.graph.value(w).name
                )))
            }
            Some((_, so_far)) => self.compute.add(so_far, &part).map_err(RankError::from)?,
            None => part,
        };
        self.gradient_shares.insert(w, (range, sum));
        Ok(())
    }

    /// Hybrid sharding: this rank's shares of `keys`' gradients, reduce-scattered in its
    /// shard group, summed with the same shares of the other groups (`group`: the ranks
    /// holding them), where they are.
    pub(super) fn all_reduce_gradient_shares(
        &mut self,
        keys: &[ValueId],
        group: &[u32],
    ) -> Result<(), RankError> {
        let held: Vec<(ValueId, Range<usize>, Floats)> = keys
            .iter()
            .filter_map(|&w| self.gradient_shares.remove(&w).map(|(r, s)| (w, r, s)))
            .collect();
        let (ranges, mut bucket): (Vec<(ValueId, Range<usize>)>, Vec<Floats>) =
            held.into_iter().map(|(w, r, s)| ((w, r), s)).unzip();
        let mut members = group.to_vec();
        members.sort_unstable();
        let summed = self.compute.all_reduce(&members, &mut bucket);
        let on_device = matches!(summed, Ok(true));
        if !on_device {
            summed.map_err(RankError::from)?;
            let mut flat: Vec<f32> = bucket.iter().flat_map(|s| s.iter().copied()).collect();
            self.comm
                .all_reduce(group, &mut flat)
                .map_err(RankError::from)?;
            let mut at = 0;
            for share in &mut bucket {
                let n = share.len();
                share.make_mut().copy_from_slice(&flat[at..at + n]);
                at += n;
            }
        }
        for ((w, range), share) in ranges.into_iter().zip(bucket) {
            self.gradient_shares.insert(w, (range, share));
        }
        Ok(())
    }

    /// [`Rank::reduce_scatter_gradients`] through the communicator.
    fn reduce_scatter_on_host(
        &mut self,
        keys: &[ValueId],
        group: &[u32],
        mine: Range<usize>,
    ) -> Result<(), RankError> {
        let flat = self.flat_gradients(keys);
        // Every member sends all of it and adds the others' copies of its share (the CPU
        // backend's reduce-scatter); shares follow the executor's piece rule.
        let all = self
            .comm
            .exchange(group, flat.clone())
            .map_err(RankError::from)?;
        let mut kept = vec![0.0f32; mine.len()];
        for part in &all {
            let part = part
                .get(mine.clone())
                .ok_or_else(|| bug("a member's gradient bucket has another size"))?;
            kernels::add(&mut kept, part);
        }
        let mut at = 0;
        for &w in keys {
            let n = self.grads.remove(&w).map_or(0, |g| g.len());
            let (lo, hi) = (mine.start.clamp(at, at + n), mine.end.clamp(at, at + n));
            // Where this weight's share lies in the bucket's share.
            let part = kept
                .get(lo.saturating_sub(mine.start)..hi.saturating_sub(mine.start))
                .filter(|_| lo < hi)
                .unwrap_or_default();
            self.add_gradient_share(w, lo - at..hi - at, part.to_vec().into())?;
            at += n;
        }
        Ok(())
    }

    /// Updates this rank's share of the bucket step `index` touches, where the weights
    /// are (a device's share of the weight, gradient and momentum cut there); the
    /// gradients of the bucket are then spent. A sharded weight's momentum holds this
    /// rank's share alone. At the first step, the shares' reduced gradients are gathered
    /// for the report (a check only, not part of the plan).
    pub(super) fn sharded_step(&mut self, index: u32, group: Vec<u32>) -> Result<(), RankError> {
        let keys = self.bucket_weights(index, BufferKind::Weights);
        let total: usize = keys.iter().map(|&w| self.weight_len(w)).sum();
        let mine = self.shard(&group, total)?;
        if self.step == 0 && self.options.report_tensors {
            self.report_gradient_shares(&keys, &group)?;
        }
        let (lr, momentum) = (self.options.lr, self.options.momentum);
        let mut at = 0;
        for &w in &keys {
            let g = self.grads.remove(&w);
            let n = self.weight_len(w);
            if n == 0 {
                continue;
            }
            let own = mine.start.clamp(at, at + n) - at..mine.end.clamp(at, at + n) - at;
            at += n;
            self.owned_momentum.insert(w, own.clone());
            // A momentum resumed whole keeps this rank's share; a rank owning none of the
            // weight keeps none.
            let v = match self.velocity.remove(&w) {
                _ if own.is_empty() => continue,
                Some(v) if v.len() == n => Some(self.cut_range(&v, n, own.clone())?),
                Some(v) if v.len() == own.len() => Some(v),
                Some(_) => {
                    return Err(RankError::Inconsistent(format!(
                        "the momentum of '{}' fits neither it nor this rank's share",
                        self.p.exe.graph.value(w).name
                    )))
                }
                None => None,
            };
            // The reduce-scattered share, else (a gradient summed whole) its share, cut
            // before the weight's: the step holds no more than the gradient did.
            let g_own = match (self.gradient_shares.remove(&w), g) {
                (Some((range, share)), _) if range == own => share,
                (Some((range, _)), _) => {
                    return Err(RankError::Inconsistent(format!(
                        "the gradient share {range:?} of '{}' is not the share {own:?} its \
                         step updates",
                        self.p.exe.graph.value(w).name
                    )))
                }
                (None, Some(g)) if g.len() == n => self.cut_range(&g, n, own.clone())?,
                (None, _) => {
                    if let Some(v) = v {
                        self.velocity.insert(w, v);
                    }
                    continue;
                }
            };
            let mut v = match v {
                Some(v) => v,
                None => self.compute.zeros(own.len()).map_err(RankError::from)?,
            };
            let mut x_own = self.owned_part(w, &own)?;
            self.compute
                .sgd_momentum(&mut x_own, &mut v, &g_own, lr, momentum)?;
            self.velocity.insert(w, v);
            self.write_owned(w, own, x_own)?;
        }
        Ok(())
    }

    /// Writes `part` over elements `range` of weight `w` (of `n`), in place where it is.
    pub(super) fn write_share(
        &mut self,
        w: ValueId,
        n: usize,
        range: Range<usize>,
        part: &Floats,
    ) -> Result<(), RankError> {
        let Some((
            _,
            Tensor {
                data: Data::F32(x), ..
            },
        )) = self.weights.get_mut(&w)
        else {
            return Err(bug("a sharded weight is not held"));
        };
        // Taken out, so the device writes the buffer it holds alone.
        let x = std::mem::take(x);
        let written = self.write_range(x, n, range, part)?;
        if let Some((_, t)) = self.weights.get_mut(&w) {
            t.data = Data::F32(written);
        }
        Ok(())
    }

    /// The first step's reduced gradients of `keys`, each member's share gathered from
    /// it, for the report.
    fn report_gradient_shares(&mut self, keys: &[ValueId], group: &[u32]) -> Result<(), RankError> {
        let share: Vec<f32> = keys
            .iter()
            .filter_map(|w| self.gradient_shares.get(w))
            .flat_map(|(_, f)| f.iter().copied())
            .collect();
        let shares = self
            .comm
            .exchange(group, share)
            .map_err(RankError::from)?
            .concat();
        let mut at = 0;
        for &w in keys {
            if let Some(slice) = self.held_slice(w) {
                let n = self.weight_len(w);
                let g = shares
                    .get(at..at + n)
                    .ok_or_else(|| bug("a gradient share is missing"))?;
                self.report.gradients.push((w, slice.clone(), g.to_vec()));
                at += n;
            }
        }
        Ok(())
    }

    /// Gathers the updated shares of the bucket's weights from every member of `group`:
    /// device to device where the device has a gather over the group.
    pub(super) fn all_gather_weights(
        &mut self,
        index: u32,
        group: Vec<u32>,
    ) -> Result<(), RankError> {
        let keys = self.bucket_weights(index, BufferKind::Weights);
        // Whole float weights, and the ones ZeRO-3 released to this rank's shares.
        let held: Vec<(ValueId, usize)> = keys
            .iter()
            .filter(|w| {
                self.released.contains_key(w)
                    || matches!(self.weights.get(w), Some((_, t)) if matches!(t.data, Data::F32(_)))
            })
            .map(|&w| (w, self.weight_len(w)))
            .collect();
        let total: usize = held.iter().map(|(_, n)| n).sum();
        let mut members = group.clone();
        members.sort_unstable();
        let shares: Vec<Range<usize>> = (0..members.len() as u32)
            .map(|i| interval((i, members.len() as u32), total))
            .collect();
        let mine = self.shard(&group, total)?;
        // This rank's share, cut from the tensors it spans.
        let mut parts = Vec::new();
        let mut at = 0;
        for &(w, n) in &held {
            let (lo, hi) = (mine.start.clamp(at, at + n), mine.end.clamp(at, at + n));
            if lo < hi {
                let part = self.owned_part(w, &(lo - at..hi - at))?;
                parts.push((lo - mine.start..hi - mine.start, part));
            }
            at += n;
        }
        let share = self.join_ranges(mine.len(), &parts)?;
        let all = self.gather_over(&members, share)?;
        if all.iter().zip(&shares).any(|(f, r)| f.len() != r.len()) {
            return Err(bug("the members' weight shares do not make up the bucket"));
        }
        // The others' shares written over each weight in place (its own is there already),
        // or a released weight made whole of its share and theirs.
        let mut at = 0;
        for (w, n) in held {
            let mut others = Vec::new();
            for (f, r) in all.iter().zip(&shares).filter(|(_, r)| **r != mine) {
                let (lo, hi) = (r.start.clamp(at, at + n), r.end.clamp(at, at + n));
                if lo < hi {
                    let part = self.cut_range(f, r.len(), lo - r.start..hi - r.start)?;
                    others.push((lo - at..hi - at, part));
                }
            }
            at += n;
            if !self.restore(w, &others)? {
                for (range, part) in others {
                    self.write_share(w, n, range, &part)?;
                }
            }
        }
        Ok(())
    }
}

/// A flat tensor of `n` elements as a one-axis box.
fn whole(n: usize) -> [Range<usize>; 1] {
    std::array::from_fn(|_| 0..n)
}
