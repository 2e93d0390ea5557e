//! A layer whose product is split by output features — a column-parallel dense layer, a
//! convolution or pooling split by channels — runs the ops fused after its product on its
//! piece too. Those ops are the model's, written for every feature, so the cut is followed
//! from the product's output through them as for a head split ([`heads::local_shapes`]):
//! the shape constants they read (a flattening reshape's target) are made local, and the
//! axis each of the layer's outputs is cut on is that tensor's feature axis (a patch
//! embedding's `[b, channels, patches]` is channels-first though nothing convolves it).

use std::collections::BTreeMap;

use ralpc_codegen::layout::LayerKind;
use ralpc_ir::{NodeId, Op, ValueId};

use super::heads::{self, local_shapes, Operand};
use super::{after, Axes, LayerExec, Prepared, Source};

impl Prepared<'_> {
    /// Follows every output-feature split through its layer's epilogue. What the cut
    /// cannot pass (a reduction over the features) keeps the layout the tensors' ranks
    /// suggest: such a layer runs as before or is refused where it reads a wrong share.
    pub(super) fn split_epilogues(&mut self) {
        let g = self.exe.graph;
        // Constants read per feature are taken apart by the head split alone.
        let operand = |v| match self.operand(v) {
            Operand::Constant => Operand::Activation,
            o => o,
        };
        let mut found = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            let pieces = layer.split.parameter;
            if pieces <= 1 || !layer.local.is_empty() {
                continue;
            }
            // The product, or the pooling a pooling layer's channels are cut at.
            let main = match layer.kind {
                LayerKind::Conv | LayerKind::Dense => layer.main,
                LayerKind::Pool => layer
                    .nodes
                    .iter()
                    .copied()
                    .find(|&n| matches!(g.node(n).op, Op::Pool(_) | Op::GlobalPool(_))),
                _ => None,
            };
            let (seed, epilogue) = match main {
                Some(main) => {
                    let Some(&product) = g.node(main).outputs.first() else {
                        continue;
                    };
                    let Some(rank) = self.exe.info.ty(product).shape.as_sizes().map(|s| s.len())
                    else {
                        continue;
                    };
                    // Channels, or a product's last axis.
                    let axis = match layer.kind {
                        LayerKind::Dense => rank.saturating_sub(1),
                        _ => 1,
                    };
                    let epilogue: Vec<NodeId> = layer
                        .nodes
                        .iter()
                        .copied()
                        .filter(|&n| after(&layer.nodes, main, n))
                        .collect();
                    (BTreeMap::from([(product, axis)]), epilogue)
                }
                // An elementwise layer between column- and row-parallel products (GELU
                // and the flattening reshape before Hugging Face's GPT-2 `c_proj`): its
                // inputs' features.
                None if layer.kind == LayerKind::Elementwise => {
                    (self.input_cuts(layer, |a| a.features), layer.nodes.clone())
                }
                None => continue,
            };
            let Ok((local, cut)) =
                local_shapes(g, self.exe.info, &epilogue, seed, pieces, &operand)
            else {
                continue;
            };
            let outputs: Vec<(_, usize)> = layer
                .outputs
                .iter()
                .filter_map(|o| Some((*o, *cut.get(o)?)))
                .collect();
            found.push((l, local, outputs));
        }
        for (l, local, outputs) in found {
            // Biases after the product are cut by the output features it holds
            // (`Prepared::slice_at`), not like a head split's inputs.
            self.layers[l].local = heads::LocalShapes {
                sliced: BTreeMap::new(),
                ..local
            };
            self.feature_axes.extend(outputs);
        }
    }

    /// The axis `pick` chooses of each input `layer` reads from another layer or the
    /// graph (under its own name and its carrier's): where a split of it cuts them.
    fn input_cuts(
        &self,
        layer: &LayerExec,
        pick: impl Fn(Axes) -> Option<usize>,
    ) -> BTreeMap<ValueId, usize> {
        let mut cuts = BTreeMap::new();
        for &(v, source) in &layer.inputs {
            if !matches!(source, Source::Edge(_) | Source::GraphInput) {
                continue;
            }
            let c = self.carrier(v);
            let Some(rank) = self.exe.info.ty(c).shape.as_sizes().map(|s| s.len()) else {
                continue;
            };
            if let Some(axis) = pick(self.axes(c, rank)) {
                cuts.insert(v, axis);
                cuts.insert(c, axis);
            }
        }
        cuts
    }

    /// Makes local the shape constants of layers split by rows that are not windows (a
    /// sequence-parallel LayerNorm reshaping to `[b, s, h]` names the whole sequence, a
    /// context-parallel projection writing its heads apart `[b, s, heads, d]`): the cut is
    /// followed from the inputs' row axes as for a head split, after it, and the row axis
    /// of what the layer writes is kept (in layer order, so that a later layer reading it
    /// starts from it; not where its rows merge with the samples, `[b·s, h]`, which no
    /// axis holds apart).
    pub(super) fn split_row_shapes(&mut self) {
        for l in 0..self.layers.len() {
            if let Some((local, outputs)) = self.row_shapes(l) {
                if !local.is_empty() {
                    self.layers[l].local_rows = local;
                }
                self.row_axes.extend(outputs);
            }
        }
    }

    /// Layer `l`'s constants made local to its rows and its outputs' row axes, where its
    /// rows are cut and it reshapes ([`Prepared::split_row_shapes`]).
    fn row_shapes(&self, l: usize) -> Option<(heads::LocalShapes, Vec<(ValueId, usize)>)> {
        let g = self.exe.graph;
        // Constants read per feature are taken apart by the head split alone.
        let operand = |v| match self.operand(v) {
            Operand::Constant => Operand::Activation,
            o => o,
        };
        {
            let layer = &self.layers[l];
            // Cut by sequence parallelism, context parallelism or both (a dense layer's
            // rows only by the context: its attribute degree cuts its input features).
            let pieces = layer.view_in().pieces(0)[1].1;
            let window = matches!(layer.kind, LayerKind::Conv | LayerKind::Pool);
            let reshapes = layer
                .nodes
                .iter()
                .any(|&n| matches!(g.node(n).op, Op::Reshape { .. }));
            if pieces <= 1 || window || !reshapes {
                return None;
            }
            let seed = self.input_cuts(layer, |a| a.rows);
            let (local, cut) =
                local_shapes(g, self.exe.info, &layer.nodes, seed, pieces, &operand).ok()?;
            let outputs: Vec<(ValueId, usize)> = layer
                .outputs
                .iter()
                .filter(|o| !local.merged.contains(o))
                .filter_map(|o| Some((*o, *cut.get(o)?)))
                .collect();
            Some((local, outputs))
        }
    }
}
