//! Activation recomputation on the executor. A recomputed run keeps, after its forward,
//! only its inputs from outside the run (its checkpoints) and its outputs read outside
//! it; a `recompute` instruction runs a layer's forward again from those, before the
//! backward passes, which refuse a layer whose activations were dropped and not made again.

use super::super::graph::Values;
use super::super::tensor::Tensor;
use super::failure::bug;
use super::{Rank, RankError};

impl Rank<'_, '_> {
    /// Edge `e`'s tensor as layer `l` reads it on microbatch `mb`: assembled from what
    /// arrived, and kept when it enters a recomputed run from outside, for the rerun
    /// (`again`), which reads it from there.
    pub(super) fn edge_input(
        &mut self,
        l: usize,
        e: usize,
        mb: u32,
        again: bool,
    ) -> Result<Tensor, RankError> {
        let p = self.p;
        let from_outside = p.recompute[l].is_some_and(|(first, _)| p.edges[e].producer < first);
        match (from_outside, again) {
            (true, true) => self.checkpoints.get(&(e, mb)).cloned().ok_or_else(|| {
                bug(format!(
                    "layer {} recomputes without its input",
                    p.layers[l].name
                ))
            }),
            (true, false) => {
                let t = self.assemble(e, mb)?;
                self.checkpoints.insert((e, mb), t.clone());
                Ok(t)
            }
            (false, _) => self.assemble(e, mb),
        }
    }

    /// After a recomputed run's forward on `mb`: its layers keep only the outputs read
    /// outside the run; the rest is made again by the run's recomputation.
    pub(super) fn drop_run(&mut self, first: usize, last: usize, mb: u32) {
        let p = self.p;
        for j in first..=last {
            let Some(run) = self.runs.get_mut(&(j, mb)) else {
                continue;
            };
            let mut kept = Values::new(p.exe.graph);
            for &o in run.regions.keys() {
                let read_outside = p.output == (j, o)
                    || p.edges
                        .iter()
                        .any(|e| e.producer == j && e.value == o && e.consumer > last);
                if read_outside {
                    if let Some(t) = run.values.get(o) {
                        kept.set(o, t.clone());
                    }
                }
            }
            run.values = kept;
            run.records = Vec::new();
            run.every_row.clear();
            run.dropped = true;
        }
    }

    /// At the backward of a recomputed run's first layer (its last backward) on `mb`, the
    /// run's kept inputs are spent.
    pub(super) fn spend_checkpoints(&mut self, l: usize, mb: u32) {
        let p = self.p;
        if let Some((first, last)) = p.recompute[l].filter(|&(first, _)| first == l) {
            self.checkpoints
                .retain(|&(e, m), _| m != mb || !(first..=last).contains(&p.edges[e].consumer));
        }
    }
}
