//! How a rank's share of a tensor is laid out: which axis holds the samples and how
//! ([`BatchAxis`]), which hold rows and features ([`Axes`]), and the index box
//! ([`Region`]) a view's rank holds of it, with the axes held as `[outer, rest]` split.

use std::collections::BTreeMap;

use ralpc_codegen::layout::View;
use ralpc_ir::{GraphInfo, Op, ValueId};

use super::super::region::{dims, interval, Axes, Region};
use super::{Prepared, Refusal};

/// How a tensor's batch axis holds the samples: `outer` blocks (the sequence positions
/// of a `[seq · batch, d]` tensor), each of the batch's samples in order, each sample
/// `per_sample` entries long (the heads of a `[batch · heads, s, d]` tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BatchAxis {
    axis: usize,
    outer: usize,
    per_sample: usize,
}

impl BatchAxis {
    /// Samples on the first axis, one entry each.
    fn first() -> BatchAxis {
        BatchAxis {
            axis: 0,
            outer: 1,
            per_sample: 1,
        }
    }
}

impl Prepared<'_> {
    pub(super) fn axes(&self, v: ValueId, rank: usize) -> Axes {
        let axes = self.axes_by_layout(v, rank);
        match self.row_axes.get(&v) {
            // The features follow the rows (`[b, s, heads, d]` holds its heads after its
            // sequence), whatever a layout guessed.
            Some(&rows) => Axes {
                rows: Some(rows),
                features: match axes.features {
                    Some(f) if f == rows => (rows + 1 < rank).then_some(rows + 1),
                    f => f,
                },
            },
            None => axes,
        }
    }

    /// [`Prepared::axes`] from the layouts alone: the features a split followed, else
    /// where a layout puts them.
    fn axes_by_layout(&self, v: ValueId, rank: usize) -> Axes {
        if let Some(&f) = self.feature_axes.get(&v) {
            // Rows follow channels (`[b, c, l]`) or precede features (`[b, t, d]`).
            let rows = match f {
                1 if rank >= 3 => Some(2),
                f if f + 1 == rank && rank >= 3 => Some(f - 1),
                _ => None,
            };
            return Axes {
                rows,
                features: Some(f),
            };
        }
        match self.batch_axis(v).map(|b| b.axis) {
            // Sequence-first tensors (`[s, b, h]`, PyTorch's attention without batch_first):
            // features last, no row split.
            Some(a) if a > 0 => Axes {
                rows: None,
                features: (rank > a + 1).then(|| rank - 1),
            },
            _ if self.features_last.contains(&v) => Axes {
                rows: Some(1),
                features: Some(rank - 1),
            },
            _ => Axes::of(rank, self.channels_first.contains(&v)),
        }
    }

    /// The axis of `v` that indexes the samples and how it holds them
    /// ([`BatchAxis`]): the first axis when its size is the batch; else the one axis whose
    /// size follows the batch (the model verified at twice the batch tells), laid out as the
    /// ops that made it (reshapes merging the batch with its neighbours, transposes) say.
    pub(super) fn batch_axis(&self, v: ValueId) -> Option<BatchAxis> {
        if let Some(&known) = self.lock_batch_axes().get(&v) {
            return known;
        }
        let found = self.find_batch_axis(v, 0);
        self.lock_batch_axes().insert(v, found);
        found
    }

    /// The axis of `v` that holds the samples, if one does.
    pub(super) fn samples_axis(&self, v: ValueId) -> Option<usize> {
        self.batch_axis(v).map(|b| b.axis)
    }

    fn lock_batch_axes(&self) -> std::sync::MutexGuard<'_, BTreeMap<ValueId, Option<BatchAxis>>> {
        self.batch_axes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn find_batch_axis(&self, v: ValueId, depth: usize) -> Option<BatchAxis> {
        let batch = self.exe.plan.batch;
        let sizes = self.exe.info.ty(v).shape.as_sizes()?;
        let doubled = self
            .info_at(2 * batch)
            .ok()
            .and_then(|info| info.ty(v).shape.as_sizes());
        // A first axis as long as the batch holds it, unless it does not follow the batch (a
        // recurrent state `[directions, batch, hidden]` with as many directions as samples).
        if sizes.first() == Some(&batch)
            && doubled
                .as_ref()
                .is_none_or(|d| d.first() == Some(&(2 * batch)))
        {
            return Some(BatchAxis::first());
        }
        let doubled = doubled?;
        if doubled.len() != sizes.len() {
            return None;
        }
        let mut axis = None;
        for (a, (&x, &y)) in sizes.iter().zip(&doubled).enumerate() {
            match (x > 0 && x % batch == 0 && y == 2 * x, x == y) {
                (true, _) if axis.is_none() => axis = Some(a),
                (_, true) => {}
                _ => return None,
            }
        }
        let a = axis?;
        if sizes[a] == batch {
            return Some(BatchAxis {
                axis: a,
                ..BatchAxis::first()
            });
        }
        // Several entries per sample: where they lie, the op that made it says.
        let g = self.exe.graph;
        let node = g.node(g.value(v).producer);
        let input = node.inputs.first().copied().flatten()?;
        if depth > 64 {
            return None;
        }
        let from = self.find_batch_axis(input, depth + 1)?;
        let in_sizes = self.exe.info.ty(input).shape.as_sizes()?;
        let found = match &node.op {
            Op::Transpose { perm } => {
                let source = match perm {
                    Some(p) => usize::try_from(*p.get(a)?).ok()?,
                    None => sizes.len() - 1 - a,
                };
                (from.axis == source).then_some(BatchAxis { axis: a, ..from })
            }
            Op::Reshape { .. } | Op::Flatten { .. } => {
                // The merged axis `a` spans the batch axis: what it merged before the
                // batch axis repeats the samples, what it merged after goes with each.
                let before = |s: &[u64], n: usize| s[..n].iter().product::<u64>();
                let (start, end) = (before(&sizes, a), before(&sizes, a + 1));
                let (b, b_end) = (
                    before(&in_sizes, from.axis),
                    before(&in_sizes, from.axis + 1),
                );
                (start > 0 && b % start == 0 && b_end > 0 && end % b_end == 0).then(|| BatchAxis {
                    axis: a,
                    outer: from.outer * (b / start) as usize,
                    per_sample: from.per_sample * (end / b_end) as usize,
                })
            }
            _ => (in_sizes == sizes && from.axis == a).then_some(from),
        };
        found.filter(|f| f.outer * batch as usize * f.per_sample == sizes[a] as usize)
    }

    /// Whether `v` is the same whatever the batch (a scalar input, a flag computed from it):
    /// every microbatch has all of it.
    fn batch_independent(&self, v: ValueId) -> bool {
        let sizes = |info: &GraphInfo| info.ty(v).shape.as_sizes();
        self.info_at(2 * self.exe.plan.batch).is_ok_and(|doubled| {
            sizes(&doubled).is_some() && sizes(&doubled) == sizes(self.exe.info)
        })
    }

    /// `v`'s shape on one microbatch.
    pub(super) fn microbatch_shape(&self, v: ValueId) -> Result<Vec<usize>, Refusal> {
        let mut shape: Vec<usize> = self
            .exe
            .info
            .ty(v)
            .shape
            .as_sizes()
            .ok_or_else(|| {
                Refusal(format!(
                    "'{}' has no static shape",
                    self.exe.graph.value(v).name
                ))
            })?
            .iter()
            .map(|&d| d as usize)
            .collect();
        if let Some(b) = self.batch_axis(v) {
            shape[b.axis] = b.outer * self.microbatch * b.per_sample;
        } else if self.exe.plan.microbatches > 1 && !self.batch_independent(v) {
            return Err(Refusal(format!(
                "'{}' has no batch axis and cannot be split into microbatches",
                self.exe.graph.value(v).name
            )));
        }
        Ok(shape)
    }

    /// The axes of `v` (of `rank` axes) held as `[outer, rest]` and cut on `rest`, with
    /// their `outer`, in axis order: a feature axis held by groups (`[groups, features /
    /// groups]`), a batch axis under an outer one (`[seq, batch]` merged by a reshape).
    fn held_axes(&self, v: ValueId, rank: usize) -> Vec<(usize, usize)> {
        let mut held = Vec::new();
        if let (Some(&groups), Some(f)) = (self.groups.get(&v), self.axes(v, rank).features) {
            held.push((f, groups));
        }
        if let Some(b) = self.batch_axis(v).filter(|b| b.outer > 1) {
            held.push((b.axis, b.outer));
        }
        held.sort_unstable();
        held
    }

    /// The share of layer `l`'s output `v` its ranks hold: as the layer's kind says, or as
    /// the edges reading it hold it (an attention layer's table for the next one: whole).
    pub(super) fn output_view(&self, l: usize, v: ValueId) -> View {
        let layer = &self.layers[l];
        let held_as = self
            .edges
            .iter()
            .find(|e| e.producer == l && self.carrier(e.value) == self.carrier(v))
            .map_or(layer.kind, |e| e.held_as);
        layer.view_out_as(held_as)
    }

    /// The region of `v` a view's rank index `k` holds (or needs), in `v`'s shape with its
    /// [held axes](Prepared::held_axes) split.
    pub(super) fn region(&self, v: ValueId, view: &View, k: u32) -> Result<Region, Refusal> {
        let shape = self.microbatch_shape(v)?;
        let axes = self.axes(v, shape.len());
        let held = self.held_axes(v, shape.len());
        let name = &self.exe.graph.value(v).name;
        if held.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(Refusal(format!(
                "'{name}' (shape {shape:?}) holds its samples and its feature groups on one axis"
            )));
        }
        // Where axis `a`'s cut part lies in the split shape.
        let at = |a: usize| a + held.iter().filter(|&&(h, _)| h <= a).count();
        let mut split = Vec::with_capacity(shape.len() + held.len());
        for (a, &d) in shape.iter().enumerate() {
            match held.iter().find(|&&(h, _)| h == a) {
                Some(&(_, outer)) => split.extend([outer, d / outer.max(1)]),
                None => split.push(d),
            }
        }
        let pieces = view.pieces(k);
        let mut r: Region = split.iter().map(|&d| 0..d).collect();
        if shape.is_empty() {
            return Ok(r);
        }
        if let Some(b) = self.batch_axis(v) {
            let samples = interval(pieces[0], self.microbatch);
            r[at(b.axis)] = samples.start * b.per_sample..samples.end * b.per_sample;
        } else if pieces[0].1 > 1 {
            return Err(Refusal(format!(
                "'{name}' (shape {shape:?}) has no batch axis a sample split can cut: its samples \
                 are not one contiguous run per rank (a reshape merged the batch under another \
                 axis); place the layers around it on the same ranks"
            )));
        }
        for (axis, piece) in [(axes.rows, pieces[1]), (axes.features, pieces[2])] {
            match axis {
                Some(a) => r[at(a)] = interval(piece, split[at(a)]),
                None if piece.1 > 1 => {
                    return Err(Refusal(format!(
                        "'{name}' (shape {shape:?}) has no axis for a split into {} pieces",
                        piece.1
                    )))
                }
                None => {}
            }
        }
        Ok(r)
    }

    /// The shape of `v`'s tensor holding `region` of it: its held axes merged again.
    pub(super) fn local_dims(&self, v: ValueId, region: &Region) -> Vec<usize> {
        let mut d = dims(region);
        let held = self.held_axes(v, self.exe.info.ty(v).shape.rank());
        for (i, &(a, _)) in held.iter().enumerate().rev() {
            let at = a + i;
            if at + 1 < d.len() {
                let merged = d[at] * d[at + 1];
                d.splice(at..=at + 1, [merged]);
            }
        }
        d
    }
}
