//! Synchronized batch normalization: a layer whose samples (or rows) are split over ranks
//! normalizes by the statistics of every rank's samples, as one device normalizes by the
//! whole batch's. Each batch normalization sums its per-channel sums over the ranks that
//! hold the same channels, forward (mean and variance) and backward (the batch terms of
//! the input gradient); the scale's and shift's gradients stay each rank's own, which the
//! gradient buckets add up. The rank's [`Compute`] runs them (a device keeps the
//! activations where they are and sends only the per-channel sums), and the other nodes
//! as usual.

use std::cell::RefCell;

use super::super::ops::{Env, Mode};
use super::super::region::interval;
use super::failure::bug;
use super::*;

impl Prepared<'_> {
    /// The ranks of layer `l` holding rank index `k`'s channels of other samples or rows,
    /// when the layer normalizes by batch statistics and they are more than one.
    fn batch_stats_group(&self, l: &LayerExec, k: u32) -> Option<Vec<u32>> {
        let g = self.exe.graph;
        let normalizes = l
            .nodes
            .iter()
            .any(|&n| matches!(g.node(n).op, Op::BatchNorm { .. }));
        if self.env.mode != Mode::Training || !normalizes {
            return None;
        }
        // Its channels both where it reads them and where it writes them: a normalization
        // before the product sees whole channels, one after it the rank's slice.
        let (vin, vout) = (l.view_in(), l.view_out());
        let channels = |r: u32| (vin.pieces(r)[2], vout.pieces(r)[2]);
        let ranks: Vec<u32> = (0..l.split.degree())
            .filter(|&r| channels(r) == channels(k))
            .map(|r| l.first + r)
            .collect();
        (ranks.len() > 1).then_some(ranks)
    }
}

fn is_batch_norm(graph: &Graph, n: NodeId) -> bool {
    matches!(graph.node(n).op, Op::BatchNorm { .. })
}

impl Rank<'_, '_> {
    /// `sums` added up over `group`, in f64 as one device adds them: each rank's values
    /// travel as two f32 words (the value rounded, and what rounding dropped) in its own
    /// slot of a zero buffer, so the all-reduce only adds zeros to them, and every rank
    /// adds the slots up in rank order. (Summed as f32 words, the rounding of the sums
    /// cost DenseNet-121's gradients 1e-2 against one device.)
    fn sum_over(&self, group: &[u32], sums: &mut [f64]) -> Result<(), RankError> {
        let n = sums.len();
        let slot = group
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| bug("a rank outside its batch-statistics group"))?;
        let mut words = vec![0.0f32; group.len() * 2 * n];
        for (i, &v) in sums.iter().enumerate() {
            let high = v as f32;
            words[slot * 2 * n + 2 * i] = high;
            words[slot * 2 * n + 2 * i + 1] = (v - f64::from(high)) as f32;
        }
        self.comm.all_reduce(group, &mut words)?;
        sums.fill(0.0);
        for part in words.chunks(2 * n) {
            for (s, pair) in sums.iter_mut().zip(part.chunks(2)) {
                *s += f64::from(pair[0]) + f64::from(pair[1]);
            }
        }
        Ok(())
    }

    /// Runs layer `l`'s nodes forward on rank index `k`.
    pub(super) fn forward_nodes(
        &self,
        l: usize,
        k: u32,
        values: &mut Values,
    ) -> Result<Vec<Record>, RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        let graph = p.graph_of(l, k);
        // The samples this rank holds of the microbatch (a re-batched Reshape's target).
        let samples = interval(layer.view_out().pieces(k)[0], p.microbatch).len();
        let env = Env {
            samples: Some(samples),
            ..p.env
        };
        let run = |nodes: &[NodeId], values: &mut Values| {
            self.compute
                .forward(graph, nodes, values, env)
                .map_err(RankError::from)
        };
        let Some(group) = p.batch_stats_group(layer, k) else {
            return run(&layer.nodes, values);
        };
        let mut records = Vec::new();
        let mut rest = &layer.nodes[..];
        while !rest.is_empty() {
            let at = rest
                .iter()
                .position(|&n| is_batch_norm(graph, n))
                .unwrap_or(rest.len());
            let (before, from) = rest.split_at(at);
            if !before.is_empty() {
                records.extend(run(before, values)?);
            }
            let Some((&bn, after)) = from.split_first() else {
                break;
            };
            let failed = RefCell::new(None);
            let sum = |sums: &mut [f64]| {
                self.sum_over(&group, sums)
                    .map_err(|e| keep(&mut failed.borrow_mut(), e))
            };
            let record = self
                .compute
                .batch_norm_synced(graph, bn, values, &sum)
                .map_err(|e| failed.take().unwrap_or_else(|| e.into()))?;
            records.push(record);
            rest = after;
        }
        Ok(records)
    }

    /// Runs `records` of layer `l` backward on rank index `k`.
    pub(super) fn backward_nodes(
        &self,
        l: usize,
        k: u32,
        records: &[Record],
        values: &Values,
        grads: &mut Grads,
    ) -> Result<(), RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        let graph = p.graph_of(l, k);
        let run = |records: &[Record], grads: &mut Grads| {
            self.compute
                .backward(graph, records, values, grads)
                .map_err(RankError::from)
        };
        let Some(group) = p.batch_stats_group(layer, k) else {
            return run(records, grads);
        };
        let mut rest = records;
        while !rest.is_empty() {
            let at = rest
                .iter()
                .rposition(|r| is_batch_norm(graph, r.node))
                .map_or(0, |i| i + 1);
            let (upto, after) = rest.split_at(at);
            if !after.is_empty() {
                run(after, grads)?;
            }
            let Some((bn, before)) = upto.split_last() else {
                break;
            };
            rest = before;
            let failed = RefCell::new(None);
            let sum = |sums: &mut [f64]| {
                self.sum_over(&group, sums)
                    .map_err(|e| keep(&mut failed.borrow_mut(), e))
            };
            self.compute
                .batch_norm_synced_backward(graph, bn, values, grads, &sum)
                .map_err(|e| failed.take().unwrap_or_else(|| e.into()))?;
        }
        Ok(())
    }
}
