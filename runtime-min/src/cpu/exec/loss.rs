//! The loss on the model's output, computed on each rank's share of it. Shares split by
//! samples each add their rows' loss. Shares split by classes (a vocabulary-parallel LM
//! head: Megatron-LM's parallel cross-entropy) first exchange per-row statistics — the
//! max, the sum of exponentials and the label's logit — in the all-gather the plan runs
//! before the head's backward, so that no rank needs another's logits.

use super::super::floats::Floats;
use super::super::kernels;
use super::super::region::Region;
use super::super::tensor::{Data, Tensor};
use super::super::train::{self, Loss};
use super::failure::bug;
use super::{Rank, RankError, Refusal, Truth};

/// Where a rank's share of the output sits in it.
struct Share {
    /// Its rows, as runs of consecutive rows of the global batch's output (first, count):
    /// one for a share of whole samples, one per sample for a context-parallel piece of
    /// each sequence.
    row_runs: Vec<(usize, usize)>,
    /// Its rows.
    rows: usize,
    /// Rows per sample in the whole output.
    rows_per_sample: usize,
    /// Classes per row in the whole output.
    classes: usize,
    /// Its classes.
    class_range: std::ops::Range<usize>,
}

impl Rank<'_, '_> {
    /// Where `held` (a region of the output on microbatch `mb`) lies in the global
    /// batch's output: rows of a sample range (all of each sample's, or a piece of each
    /// sequence), each whole or cut by classes.
    fn share(&self, mb: u32, held: &Region) -> Result<Share, RankError> {
        let p = self.p;
        let shape = p.microbatch_shape(p.output.1).map_err(Refusal::bug)?;
        let axis = train::class_axis(&shape);
        let (Some(&classes), Some(samples), Some(class_range)) =
            (shape.get(axis), held.first(), held.get(axis))
        else {
            return Err(RankError::Unsupported(
                "the model's output has no rows to take a loss of".into(),
            ));
        };
        let full: usize = shape.iter().product();
        let rows_per_sample = full / (p.microbatch.max(1) * classes.max(1));
        let rows = held.iter().map(|r| r.len()).product::<usize>() / class_range.len().max(1);
        // The element runs of the share's rows with all their classes, in rows.
        let mut whole_rows = held.clone();
        whole_rows[axis] = 0..classes;
        let row_runs = match samples.len() * rows_per_sample == rows {
            true => vec![(
                (mb as usize * p.microbatch + samples.start) * rows_per_sample,
                rows,
            )],
            false => self
                .runs(mb, &whole_rows)?
                .into_iter()
                .map(|(start, len)| (start / classes.max(1), len / classes.max(1)))
                .collect(),
        };
        Ok(Share {
            row_runs,
            rows,
            rows_per_sample,
            classes,
            class_range: class_range.clone(),
        })
    }

    /// The class labels of `share`'s rows, as the data holds them, in the share's order.
    fn label_rows(&self, share: &Share) -> Result<Vec<i64>, RankError> {
        let Data::I64(labels) = &self.p.exe.data.labels else {
            return Err(RankError::Unsupported(
                "a loss on class-split logits is cross-entropy against labels".into(),
            ));
        };
        let mut out = Vec::with_capacity(share.rows);
        for &(first, count) in &share.row_runs {
            let run = labels
                .get(first..first + count)
                .ok_or_else(|| bug("the labels do not cover the output's rows"))?;
            out.extend_from_slice(run);
        }
        Ok(out)
    }

    /// The class labels of `share`'s rows.
    fn labels(&self, share: &Share) -> Result<Vec<u32>, RankError> {
        Ok(self.label_rows(share)?.iter().map(|&c| c as u32).collect())
    }

    /// The runs of `held` (whole rows) that are contiguous in the global batch's output,
    /// each as its first element's index there and its length: one run for a share of
    /// whole samples, one per sample and channel range for a share cut on a middle axis
    /// (an `[N, C, 1, 1]` output split by channels).
    fn runs(&self, mb: u32, held: &Region) -> Result<Vec<(usize, usize)>, RankError> {
        let p = self.p;
        let shape = p.microbatch_shape(p.output.1).map_err(Refusal::bug)?;
        if held.len() != shape.len() || held.is_empty() {
            return Err(bug(format!(
                "a share {held:?} of an output of shape {shape:?}"
            )));
        }
        let strides = super::super::tensor::strides(&shape);
        // The last axis the share cuts (besides the samples): runs span it and all after.
        let cut = (1..shape.len())
            .rev()
            .find(|&a| held[a].len() != shape[a])
            .unwrap_or(0);
        let len = held[cut].len() * strides[cut];
        let first_sample = mb as usize * p.microbatch;
        let outer: Vec<usize> = held[..cut].iter().map(|r| r.len()).collect();
        let mut runs = Vec::new();
        for i in 0..outer.iter().product::<usize>() {
            // Index `i` of the axes before the cut, row-major, in the share.
            let (mut rest, mut at) = (i, held[cut].start * strides[cut]);
            for a in (0..cut).rev() {
                at += (held[a].start + rest % outer[a]) * strides[a];
                rest /= outer[a];
            }
            runs.push((first_sample * strides[0] + at, len));
        }
        Ok(runs)
    }

    /// The all-gather, over `group`, of the loss statistics of layer `l`'s class-split
    /// output on microbatch `mb`; kept for its backward.
    pub(super) fn exchange_loss_statistics(
        &mut self,
        l: usize,
        mb: u32,
        group: &[u32],
    ) -> Result<(), RankError> {
        let layer = &self.p.layers[l];
        let k = layer.holds(self.rank).ok_or_else(|| {
            bug(format!(
                "rank {} does not run layer {}",
                self.rank, layer.name
            ))
        })?;
        let run = self
            .runs
            .get(&(l, mb))
            .ok_or_else(|| bug("loss statistics of an output not computed"))?;
        let Some(Tensor {
            data: Data::F32(y), ..
        }) = run.values.get(self.p.output.1)
        else {
            return Err(bug("the output is missing"));
        };
        let held = self
            .p
            .region(self.p.output.1, &layer.view_out(), k)
            .map_err(Refusal::bug)?;
        let share = self.share(mb, &held)?;
        if share.class_range.len() == share.classes || self.options.loss != Loss::CrossEntropy {
            // Whole rows (cut on another axis), or a loss of each element alone: every rank
            // of the group takes its share's loss alone.
            return Ok(());
        }
        let (width, first) = (share.class_range.len(), share.class_range.start);
        // Where the logits are (3 numbers a row come back from a device).
        let mine = match self
            .compute
            .class_statistics(y, &self.label_rows(&share)?, width, first)
            .map_err(RankError::from)?
        {
            Some(mine) => mine,
            None => kernels::class_piece_statistics(width, y, &self.labels(&share)?, first),
        };
        let all = self.comm.exchange(group, mine).map_err(RankError::from)?;
        self.loss_statistics.insert((l, mb), all);
        Ok(())
    }

    /// The loss of this rank's share `y` (holding `held`) of the model's output on
    /// microbatch `mb`, and its gradient. The loss and the first step's output are
    /// reported once per share (replicas compute the same), the loss once per row.
    pub(super) fn output_loss(
        &mut self,
        l: usize,
        k: u32,
        mb: u32,
        y: &Tensor,
        held: &Region,
    ) -> Result<Floats, RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        let pieces = layer.view_out().pieces(k);
        let share = self.share(mb, held)?;
        let Data::F32(y) = &y.data else {
            return Err(bug("the loss needs a floating-point output"));
        };
        let whole_rows = share.class_range.len() == share.classes;
        // Whole rows, or a loss of each element alone (squared error): the share's runs
        // take their loss where they lie. Rows cut by classes need the cross-entropy's
        // exchanged statistics.
        let by_runs = whole_rows || self.options.loss != Loss::CrossEntropy;
        let runs = if by_runs {
            self.runs(mb, held)?
        } else {
            Vec::new()
        };
        let (loss, dy): (f64, Floats) = if by_runs {
            let total = p
                .microbatch_shape(p.output.1)
                .map_err(Refusal::bug)?
                .iter()
                .product::<usize>()
                / p.microbatch.max(1)
                * p.exe.plan.batch as usize;
            match self.device_loss(y, &runs, share.classes, total)? {
                Some(on_device) => on_device,
                None => self.host_loss(y, &runs, share.classes, total)?,
            }
        } else {
            let all = self.loss_statistics.remove(&(l, mb)).ok_or_else(|| {
                bug({
                    format!(
                        "layer {} splits the model's output by classes, but the plan exchanges \
                     no loss statistics before its backward",
                        layer.name
                    )
                })
            })?;
            let total_rows = share.rows_per_sample * p.exe.plan.batch as usize;
            let (width, first, scale) = (
                share.class_range.len(),
                share.class_range.start,
                total_rows as f32,
            );
            // The rows' loss from the statistics; the logits' gradient where they are.
            let (loss, lse) = kernels::class_piece_loss(share.rows, &all, scale);
            let lse: Vec<f32> = lse.iter().map(|&v| v as f32).collect();
            match self
                .compute
                .class_piece_gradient(y, &lse, &self.label_rows(&share)?, first, scale)
                .map_err(RankError::from)?
            {
                Some(dy) => (loss, dy),
                None => {
                    let mut dy = vec![0.0; y.len()];
                    let loss = kernels::class_piece_cross_entropy(
                        width,
                        y,
                        &self.labels(&share)?,
                        first,
                        &all,
                        scale,
                        &mut dy,
                    );
                    (loss, dy.into())
                }
            }
        };
        // Replicas of the same share compute the same loss: count it once.
        let owner = (0..k).all(|q| layer.view_out().pieces(q) != pieces);
        if owner {
            // A class split's pieces each know the rows' whole loss (from the exchanged
            // statistics): the first adds it. Whole rows cut elsewhere are each their own.
            if by_runs || pieces[2].0 == 0 {
                if let Some(last) = self.report.losses.last_mut() {
                    *last += loss;
                }
            }
            let reported = self.step == 0 && self.options.report_tensors;
            let values: &[f32] = if reported { y } else { &[] };
            if reported && by_runs {
                let mut at = 0;
                for &(start, len) in &runs {
                    if let Some(part) = values.get(at..at + len) {
                        self.report.output.push((start, part.to_vec()));
                    }
                    at += len;
                }
            } else if reported {
                let width = share.class_range.len();
                let global_rows = share
                    .row_runs
                    .iter()
                    .flat_map(|&(first, count)| first..first + count);
                for (row, values) in global_rows.zip(values.chunks(width.max(1))) {
                    let start = row * share.classes + share.class_range.start;
                    self.report.output.push((start, values.to_vec()));
                }
            }
        }
        Ok(dy)
    }

    /// The loss of `y` (the share's `runs`, rows of `classes` or elements) and its
    /// gradient on the device where `y` is resident there in one run; `None` otherwise.
    fn device_loss(
        &self,
        y: &Floats,
        runs: &[(usize, usize)],
        classes: usize,
        total: usize,
    ) -> Result<Option<(f64, Floats)>, RankError> {
        let &[(start, len)] = runs else {
            return Ok(None);
        };
        if len != y.len() {
            return Ok(None);
        }
        let labels = &self.p.exe.data.labels;
        let truth = match (self.options.loss, labels) {
            (Loss::CrossEntropy, Data::I64(of)) => {
                let first = start / classes.max(1);
                let Some(labels) = of.get(first..first + len / classes.max(1)) else {
                    return Ok(None);
                };
                Truth::Classes { labels, classes }
            }
            (Loss::Mse, Data::F32(targets)) => {
                let Some(targets) = targets.get(start..start + len) else {
                    return Ok(None);
                };
                Truth::Targets(targets)
            }
            _ => return Ok(None),
        };
        let total = match truth {
            Truth::Classes { classes, .. } => total / classes.max(1),
            Truth::Targets(_) => total,
        };
        self.compute.loss(y, truth, total).map_err(RankError::from)
    }

    /// [`Rank::device_loss`] on the host: each run's rows add their loss and get their
    /// gradient, in the share's order.
    fn host_loss(
        &self,
        y: &Floats,
        runs: &[(usize, usize)],
        classes: usize,
        total: usize,
    ) -> Result<(f64, Floats), RankError> {
        let (mut loss, mut dy, mut at) = (0.0, Vec::with_capacity(y.len()), 0);
        for &(start, len) in runs {
            let part = y
                .get(at..at + len)
                .ok_or_else(|| bug("the output share is shorter than its region"))?;
            let shape = match self.options.loss {
                Loss::CrossEntropy => vec![len / classes.max(1), classes],
                Loss::Mse => vec![len],
            };
            let rows = Tensor::f32(shape, part.to_vec());
            let (l, g) = train::loss(
                self.options.loss,
                &rows,
                start,
                &self.p.exe.data.labels,
                total,
            )
            .map_err(|e| RankError::Loss(e.to_string()))?;
            loss += l;
            dy.extend(g);
            at += len;
        }
        Ok((loss, dy.into()))
    }
}
