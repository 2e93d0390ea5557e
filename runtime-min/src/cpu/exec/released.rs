//! ZeRO-3's weights between the passes that read them: after the last read of a pass,
//! a rank keeps only its share of each weight of the bucket (the elements it owns of the
//! bucket laid end to end), as the plan's memory counts them; the bucket's next
//! all-gather makes them whole again. A gather no pass reads after in the step (the
//! step's own, after the sharded update) leaves its weights whole for the report, the
//! checkpoint and the next step's first pass.

use std::collections::BTreeMap;
use std::ops::Range;

use ralpc_codegen::plan::{BufferKind, Instruction, Plan};
use ralpc_ir::ValueId;

use super::super::floats::Floats;
use super::super::region::Slice;
use super::super::tensor::{Data, Tensor};
use super::failure::bug;
use super::{LayerRun, Rank, RankError, Source, Touch};

/// A weight this rank holds only its share of until the next gather.
pub(super) struct Released {
    slice: Slice,
    shape: Vec<usize>,
    /// The weight's element count.
    len: usize,
    /// The elements of the weight this rank owns (possibly none), and their values.
    own: Range<usize>,
    part: Floats,
}

/// Per instruction of rank `rank`'s program under ZeRO-3, the weight all-gathers whose
/// weights it is the last to read before they are written again (by the next gather or
/// the step): after it, they go back to this rank's shares.
pub(super) fn weight_releases(
    plan: &Plan,
    rank: u32,
    touches: &BTreeMap<u32, Vec<Touch>>,
) -> BTreeMap<u32, Vec<u32>> {
    let mut releases: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let program = plan.programs.get(rank as usize).map_or(&[][..], |p| &p[..]);
    if plan.strategy.zero < 3 {
        return releases;
    }
    let weights = |i: u32, writes: bool| -> Vec<u32> {
        touches.get(&i).map_or_else(Vec::new, |t| {
            t.iter()
                .filter(|&&(kind, _, _, w)| kind == BufferKind::Weights && w == writes)
                .filter_map(|t| t.1)
                .collect()
        })
    };
    for (g, instruction) in (0u32..).zip(program) {
        if !matches!(instruction, Instruction::AllGather { .. }) {
            continue;
        }
        let layers = weights(g, true);
        if layers.is_empty() {
            continue;
        }
        let mut last = g;
        for i in g + 1..program.len() as u32 {
            if weights(i, true).iter().any(|l| layers.contains(l)) {
                releases.entry(last).or_default().push(g);
                break;
            }
            if weights(i, false).iter().any(|l| layers.contains(l)) {
                last = i;
            }
        }
    }
    releases
}

impl Rank<'_, '_> {
    /// How this rank holds weight `w`, whole or released.
    pub(super) fn held_slice(&self, w: ValueId) -> Option<&Slice> {
        match self.weights.get(&w) {
            Some((slice, _)) => Some(slice),
            None => self.released.get(&w).map(|r| &r.slice),
        }
    }

    /// Weight `w`'s element count on this rank (0: not held).
    pub(super) fn weight_len(&self, w: ValueId) -> usize {
        match self.weights.get(&w) {
            Some((_, t)) => t.len(),
            None => self.released.get(&w).map_or(0, |r| r.len),
        }
    }

    /// The elements `own` of weight `w`: its released share, or cut from it whole.
    pub(super) fn owned_part(&self, w: ValueId, own: &Range<usize>) -> Result<Floats, RankError> {
        if let Some(r) = self.released.get(&w) {
            if r.own != *own {
                return Err(RankError::Inconsistent(format!(
                    "'{}' was released as its elements {:?}, not {own:?}",
                    self.p.exe.graph.value(w).name,
                    r.own
                )));
            }
            return Ok(r.part.clone());
        }
        let Some((_, t)) = self.weights.get(&w) else {
            return Err(bug("a sharded weight is not held"));
        };
        let Data::F32(x) = &t.data else {
            return Err(bug("a sharded weight is not a float tensor"));
        };
        self.cut_range(x, t.len(), own.clone())
    }

    /// Writes the updated elements `own` of weight `w`: its released share replaced, or
    /// written over it whole.
    pub(super) fn write_owned(
        &mut self,
        w: ValueId,
        own: Range<usize>,
        part: Floats,
    ) -> Result<(), RankError> {
        if let Some(r) = self.released.get_mut(&w) {
            r.part = part;
            return Ok(());
        }
        let n = self.weight_len(w);
        self.write_share(w, n, own, &part)
    }

    /// Makes weight `w` whole from its pieces (each a range of its elements and their
    /// values, covering it once) if it was released.
    pub(super) fn restore(
        &mut self,
        w: ValueId,
        others: &[(Range<usize>, Floats)],
    ) -> Result<bool, RankError> {
        let Some(r) = self.released.remove(&w) else {
            return Ok(false);
        };
        let mut parts = others.to_vec();
        if !r.own.is_empty() {
            parts.push((r.own.clone(), r.part));
        }
        let whole = self.join_ranges(r.len, &parts)?;
        let tensor = Tensor {
            shape: r.shape,
            data: Data::F32(whole),
        };
        self.weights.insert(w, (r.slice, tensor));
        Ok(true)
    }

    /// After instruction `index`, releases the weights of the ZeRO-3 gathers it was the
    /// last pass to read.
    pub(super) fn release_weights_after(&mut self, index: u32) -> Result<(), RankError> {
        let Some(gathers) = self.weight_releases.get(&index).cloned() else {
            return Ok(());
        };
        for g in gathers {
            let keys = self.bucket_weights(g, BufferKind::Weights);
            let gathered: Vec<usize> = self
                .touched(g)
                .iter()
                .filter(|&&(kind, _, _, writes)| kind == BufferKind::Weights && writes)
                .filter_map(|t| t.1.map(|l| l as usize))
                .collect();
            // A weight a layer of another bucket reads here too (an initializer the
            // exporter merged) stays whole: that layer's passes do not gather it.
            let (p, rank) = (self.p, self.rank);
            let shared = |w: ValueId| {
                p.layers.iter().enumerate().any(|(l, layer)| {
                    !gathered.contains(&l)
                        && layer.holds(rank).is_some()
                        && layer.weights.contains(&w)
                })
            };
            let group = self.gather_group(g)?;
            let total: usize = keys.iter().map(|&w| self.weight_len(w)).sum();
            let mine = self.shard(&group, total)?;
            let mut at = 0;
            for w in keys {
                let n = self.weight_len(w);
                let own = mine.start.clamp(at, at + n) - at..mine.end.clamp(at, at + n) - at;
                at += n;
                if self.released.contains_key(&w) || shared(w) {
                    continue;
                }
                let part = self.owned_part(w, &own)?;
                let Some((slice, t)) = self.weights.remove(&w) else {
                    continue;
                };
                self.take_from_runs(w);
                self.released.insert(
                    w,
                    Released {
                        slice,
                        shape: t.shape,
                        len: n,
                        own,
                        part,
                    },
                );
            }
        }
        Ok(())
    }

    /// Takes weight `w` out of the forward passes waiting for their backward, so that
    /// releasing it frees it.
    fn take_from_runs(&mut self, w: ValueId) {
        let p = self.p;
        for (&(l, _), run) in self.runs.iter_mut() {
            for &(v, source) in &p.layers[l].inputs {
                if source != Source::Constant || p.carrier(v) != w {
                    continue;
                }
                let taken = run.values.take(v).is_some();
                if v != w {
                    run.values.take(w);
                }
                if taken {
                    run.lent.push((v, w));
                }
            }
        }
    }

    /// Sets the weights released while `run` waited for its backward again, from the
    /// weights gathered for it.
    pub(super) fn lend_back(&self, run: &mut LayerRun) -> Result<(), RankError> {
        for (v, w) in std::mem::take(&mut run.lent) {
            let Some((_, t)) = self.weights.get(&w) else {
                return Err(RankError::Inconsistent(format!(
                    "the backward of a pass reading '{}' runs before its gather",
                    self.p.exe.graph.value(w).name
                )));
            };
            run.values.set(v, t.clone());
            if v != w {
                run.values.set(w, t.clone());
            }
        }
        Ok(())
    }

    /// Every weight is whole, as a step leaves them (its gathers are read by no pass
    /// after them): what the report and the checkpoint read.
    pub(super) fn all_weights_whole(&self) -> Result<(), RankError> {
        match self.released.keys().next() {
            None => Ok(()),
            Some(&w) => Err(RankError::Inconsistent(format!(
                "the step ended with '{}' held as this rank's share",
                self.p.exe.graph.value(w).name
            ))),
        }
    }

    /// The group of all-gather `index`.
    fn gather_group(&self, index: u32) -> Result<Vec<u32>, RankError> {
        let program = self.p.exe.plan.programs.get(self.rank as usize);
        match program.and_then(|p| p.get(index as usize)) {
            Some(Instruction::AllGather { group, .. }) => self.group(*group),
            _ => Err(RankError::Inconsistent(format!(
                "instruction {index} is not the all-gather that releases its weights"
            ))),
        }
    }
}
