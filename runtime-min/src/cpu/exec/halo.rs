//! Convolutions and pooling split by rows: each piece computes its output rows from its
//! input rows and the halo around them, which the pieces holding those rows send before
//! the forward pass; the gradient of the halo goes back after the backward pass and is
//! added where the rows live, before the input gradient is summed or sent on.
//!
//! The rows come from the layer's [`Window`], the same one the lowering placed the
//! messages from. A piece computes with its own padding (the model's at the edges of the
//! image, none inside it), so every rank runs the window op on its model copy with that
//! padding ([`LayerHalo::graphs`]).

use std::collections::BTreeMap;
use std::ops::Range;

use ralpc_codegen::layout::{LayerKind, Split, Window};
use ralpc_codegen::tag::HaloPass;
use ralpc_ir::{Graph, NodeId, Op, Padding, ValueId};

use super::failure::bug;
use super::resolve::Resolved;
use super::{setup, Prepared, Rank, RankError, Refusal, RunError};
use crate::cpu::floats::Floats;
use crate::cpu::kernels;
use crate::cpu::region::{dims, fill, intersect, reframe, volume, Region};
use crate::cpu::tensor::{Data, Tensor};

/// A row-split window layer's halo.
pub(super) struct LayerHalo {
    window: Window,
    /// The values the window reads around each piece (carriers).
    inputs: Vec<ValueId>,
    /// Per padding `(before, after)` of the row axis a piece computes with, the model
    /// with the window node padded so.
    graphs: BTreeMap<(u64, u64), Graph>,
}

/// A rank's halo traffic in flight.
#[derive(Default)]
pub(super) struct HaloState {
    /// Per (edge, microbatch), the input a halo send cut rows from, kept for the forward.
    staged: BTreeMap<(usize, u32), Tensor>,
    /// Per (edge, microbatch), the rows received from the neighbouring pieces.
    rows: BTreeMap<(usize, u32), Vec<(Region, Tensor)>>,
    /// Per (edge, microbatch), the gradient of everything the windows read, halo included.
    grads: BTreeMap<(usize, u32), (Region, Floats)>,
}

impl Prepared<'_> {
    /// Finds every row-split convolution's and pooling's halo, refusing those whose
    /// rows cannot be split (a global pool, a transposed convolution, shapes changing
    /// before the window).
    pub(super) fn plan_halos(&mut self, resolved: &Resolved) -> Result<(), RunError> {
        for l in 0..self.layers.len() {
            let layer = &self.layers[l];
            if !matches!(layer.kind, LayerKind::Conv | LayerKind::Pool)
                || layer.split.attribute <= 1
            {
                continue;
            }
            let Some((window, node, inputs)) = resolved.layers.get(l).and_then(|x| x.halo.as_ref())
            else {
                return Err(setup(format!(
                    "layer {}: its rows cannot be split (it has no convolution or pooling \
                     window over them, or changes their shape before it); use a strategy \
                     without attribute splits here",
                    layer.name
                )));
            };
            // Nodes before the window compute on the halo rows too; a batch normalization
            // there would count a neighbour's rows in its statistics as its own. (Layers
            // are built with each normalization heading its own layer or following the
            // window, so this guards the layer builder.)
            let window_at = layer.nodes.iter().position(|n| n == node);
            if let Some(bn) = layer.nodes[..window_at.unwrap_or(0)]
                .iter()
                .find(|&&n| matches!(self.exe.graph.node(n).op, Op::BatchNorm { .. }))
            {
                return Err(setup(format!(
                    "layer {}: {} normalizes rows before the window reads its neighbours' \
                     rows; split this layer by samples or channels",
                    layer.name,
                    self.exe.graph.site(*bn)
                )));
            }
            let a = layer.split.attribute;
            let mut graphs = BTreeMap::new();
            for i in 0..a {
                let (_, padding) = window.read_rows((i, a));
                if graphs.contains_key(&padding) {
                    continue;
                }
                let mut graph = self.exe.graph.clone();
                pad_rows(&mut graph, self.exe.info, *node, padding)
                    .map_err(|m| setup(format!("layer {}: {m}", layer.name)))?;
                graphs.insert(padding, graph);
            }
            let inputs: Vec<ValueId> = inputs.iter().map(|&v| self.carrier(v)).collect();
            for e in self.edges.iter_mut().filter(|e| e.consumer == l) {
                e.halo = inputs.contains(&e.value);
            }
            self.layers[l].halo = Some(LayerHalo {
                window: *window,
                inputs,
                graphs,
            });
        }
        Ok(())
    }

    /// The model rank index `k` of layer `l` computes with: its piece's padding.
    pub(super) fn graph_of(&self, l: usize, k: u32) -> &Graph {
        let layer = &self.layers[l];
        layer
            .halo
            .as_ref()
            .and_then(|h| {
                let (_, padding) = h.window.read_rows(rows_piece(layer.split, k));
                h.graphs.get(&padding)
            })
            .unwrap_or(self.exe.graph)
    }

    /// Whether layer `l` reads `v` with a halo.
    pub(super) fn reads_halo(&self, l: usize, v: ValueId) -> bool {
        self.layers[l]
            .halo
            .as_ref()
            .is_some_and(|h| h.inputs.contains(&self.carrier(v)))
    }

    /// `need` (rank index `k`'s piece of `v`, read by layer `l`) with the rows its
    /// windows read: its halo included.
    pub(super) fn with_halo(
        &self,
        l: usize,
        k: u32,
        v: ValueId,
        need: &Region,
    ) -> Result<Region, RankError> {
        let layer = &self.layers[l];
        let halo = layer
            .halo
            .as_ref()
            .ok_or_else(|| bug(format!("layer {} reads no halo", layer.name)))?;
        let (rows, _) = halo.window.read_rows(rows_piece(layer.split, k));
        self.rows_of(v, need, rows, halo.window.input)
    }

    /// `region` of `v` with its row axis set to `rows` (of `input` rows).
    fn rows_of(
        &self,
        v: ValueId,
        region: &Region,
        rows: Range<u64>,
        input: u64,
    ) -> Result<Region, RankError> {
        let shape = self.microbatch_shape(v).map_err(Refusal::bug)?;
        let name = &self.exe.graph.value(v).name;
        let axis = self
            .axes(v, shape.len())
            .rows
            .filter(|&a| region.len() == shape.len() && shape.get(a) == Some(&(input as usize)))
            .ok_or_else(|| {
                bug({
                    format!(
                    "'{name}' (shape {shape:?}) has no axis of the {input} rows its window reads"
                )
                })
            })?;
        let mut out = region.clone();
        out[axis] = rows.start as usize..rows.end as usize;
        Ok(out)
    }
}

/// The row piece `(i, n)` of rank index `k` under `split`.
fn rows_piece(split: Split, k: u32) -> (u32, u32) {
    let (a, p) = (split.attribute.max(1), split.parameter.max(1));
    ((k / p) % a, a)
}

/// Sets the row padding of window node `node` to `(before, after)`, keeping the others.
fn pad_rows(
    graph: &mut Graph,
    info: &ralpc_ir::GraphInfo,
    node: NodeId,
    (before, after): (u64, u64),
) -> Result<(), Refusal> {
    let n = graph.node(node);
    let x = n
        .inputs
        .first()
        .copied()
        .flatten()
        .ok_or_else(|| Refusal("the window has no input".to_owned()))?;
    let input = info
        .ty(x)
        .shape
        .as_sizes()
        .ok_or_else(|| Refusal("the window's input shape is unknown".to_owned()))?;
    let spatial = &input[2.min(input.len())..];
    let k = spatial.len();
    let (kernel, strides, dilations, padding) =
        match &n.op {
            Op::Conv(c) => {
                let kernel =
                    match &c.kernel {
                        Some(kernel) => kernel.clone(),
                        None => {
                            let w = n.inputs.get(1).copied().flatten().ok_or_else(|| {
                                Refusal("the convolution has no weight".to_owned())
                            })?;
                            let shape = info.ty(w).shape.as_sizes().ok_or_else(|| {
                                Refusal("the weight's shape is unknown".to_owned())
                            })?;
                            shape
                                .get(2..)
                                .ok_or_else(|| Refusal("the weight has no kernel axes".to_owned()))?
                                .to_vec()
                        }
                    };
                (kernel, &c.strides, &c.dilations, &c.padding)
            }
            Op::Pool(p) => (p.kernel.clone(), &p.strides, &p.dilations, &p.padding),
            _ => {
                return Err(Refusal(
                    "its window is not a convolution or pooling".to_owned(),
                ))
            }
        };
    let at = |v: &Option<Vec<u64>>, i: usize| {
        v.as_ref()
            .and_then(|v| v.get(i).copied())
            .unwrap_or(1)
            .max(1)
    };
    let mut pads = match padding {
        Padding::Explicit(p) if p.len() == 2 * k => p.clone(),
        Padding::Explicit(p) if p.is_empty() => vec![0; 2 * k],
        Padding::Valid => vec![0; 2 * k],
        Padding::Explicit(p) => {
            return Err(Refusal(format!("pads {p:?} do not fit {k} spatial axes")))
        }
        Padding::SameUpper | Padding::SameLower => {
            let mut pads = vec![0; 2 * k];
            for i in 0..k {
                let (s, d) = (at(strides, i), at(dilations, i));
                let extent = (kernel.get(i).copied().unwrap_or(1).max(1) - 1) * d + 1;
                let total = ((spatial[i].div_ceil(s) - 1) * s + extent).saturating_sub(spatial[i]);
                let (lo, hi) = (total / 2, total - total / 2);
                (pads[i], pads[i + k]) = match padding {
                    Padding::SameUpper => (lo, hi),
                    _ => (hi, lo),
                };
            }
            pads
        }
    };
    if k == 0 {
        return Err(Refusal("the window has no spatial axis".to_owned()));
    }
    (pads[0], pads[k]) = (before, after);
    match &mut graph.node_mut(node).op {
        Op::Conv(c) => c.padding = Padding::Explicit(pads),
        Op::Pool(p) => p.padding = Padding::Explicit(pads),
        _ => {}
    }
    Ok(())
}

impl Rank<'_, '_> {
    /// Layer `l`'s input of edge `e` on microbatch `mb`, extended by the halo rows it
    /// received (`own` is the piece it holds).
    pub(super) fn add_halo(
        &mut self,
        l: usize,
        k: u32,
        e: usize,
        mb: u32,
        own: Tensor,
    ) -> Result<Tensor, RankError> {
        let v = self.p.edges[e].value;
        let need = self.need(e, self.rank)?;
        let ext = self.p.with_halo(l, k, v, &need)?;
        let rows = self.halos.rows.remove(&(e, mb)).unwrap_or_default();
        // Where the piece and the rows are resident (received device to device).
        if let Data::F32(f) = &own.data {
            let mut parts = vec![(need.as_slice(), f)];
            for (region, t) in &rows {
                if let Data::F32(r) = &t.data {
                    parts.push((region.as_slice(), r));
                }
            }
            if parts.len() == rows.len() + 1 {
                if let Some(out) = self.compute.paste(&ext, &parts).map_err(RankError::from)? {
                    return Ok(Tensor {
                        shape: self.p.local_dims(v, &ext),
                        data: Data::F32(out),
                    });
                }
            }
        }
        let n = volume(&ext);
        let mut out = vec![0.0f32; n];
        let mut filled = vec![false; n];
        let floats = own
            .floats()
            .ok_or_else(|| bug("only floating-point tensors have halos"))?;
        fill(&mut out, &mut filled, &ext, floats, &need);
        for (region, t) in rows {
            fill(
                &mut out,
                &mut filled,
                &ext,
                t.floats().unwrap_or_default(),
                &region,
            );
        }
        let missing = filled.iter().filter(|f| !**f).count();
        if missing > 0 {
            return Err(bug(format!(
                "{missing} of the {n} elements of '{}' around its rows that layer {} reads never arrived",
                self.value_name(v),
                self.p.layers[l].name
            )));
        }
        Ok(Tensor::f32(self.p.local_dims(v, &ext), out))
    }

    /// The input of edge `e` a layer reads on `mb` (again: for a recomputation), assembled
    /// now for a halo send and kept for the forward pass.
    fn staged(&mut self, e: usize, mb: u32, again: bool) -> Result<&Tensor, RankError> {
        if !self.halos.staged.contains_key(&(e, mb)) {
            let l = self.p.edges[e].consumer;
            let t = self.edge_input(l, e, mb, again)?;
            self.halos.staged.insert((e, mb), t);
        }
        self.halos
            .staged
            .get(&(e, mb))
            .ok_or_else(|| bug("a staged input vanished"))
    }

    /// The input of edge `e` a forward pass reads: staged by a halo send, or assembled now.
    pub(super) fn layer_input(
        &mut self,
        l: usize,
        e: usize,
        mb: u32,
        again: bool,
    ) -> Result<Tensor, RankError> {
        match self.halos.staged.remove(&(e, mb)) {
            Some(t) => Ok(t),
            None => self.edge_input(l, e, mb, again),
        }
    }

    /// Rank `rank`'s piece of edge `e`'s tensor and the rows its windows read.
    fn halo_regions(&self, e: usize, rank: u32) -> Result<(Region, Region), RankError> {
        let edge = &self.p.edges[e];
        let layer = &self.p.layers[edge.consumer];
        let k = layer
            .holds(rank)
            .ok_or_else(|| bug(format!("rank {rank} does not run {}", layer.name)))?;
        let own = self.need(e, rank)?;
        let ext = self.p.with_halo(edge.consumer, k, edge.value, &own)?;
        Ok((own, ext))
    }

    /// Sends rank `to` the rows of edge `e`'s tensor it reads around its piece (forward,
    /// again), or the gradient of the rows this rank read around its own (backward).
    pub(super) fn halo_send(
        &mut self,
        to: u32,
        tag: u64,
        e: usize,
        mb: u32,
        pass: HaloPass,
    ) -> Result<(), RankError> {
        let (own, ext) = self.halo_regions(e, self.rank)?;
        let (to_own, to_ext) = self.halo_regions(e, to)?;
        // Cut where the tensor is (on the device, when resident there).
        let data = match pass {
            HaloPass::Forward | HaloPass::Again => {
                let piece = intersect(&to_ext, &own);
                let x = self.staged(e, mb, pass == HaloPass::Again)?.clone();
                self.cut(&x, &own, &piece)?
            }
            HaloPass::Backward => {
                let piece = intersect(&ext, &to_own);
                let (region, g) = self
                    .halos
                    .grads
                    .get(&(e, mb))
                    .ok_or_else(|| bug("no halo gradient to send"))?;
                let whole = Tensor {
                    shape: dims(region),
                    data: Data::F32(g.clone()),
                };
                self.cut(&whole, &region.clone(), &piece)?
            }
        };
        let Data::F32(floats) = data.data else {
            return Err(bug("only floating-point tensors have halos"));
        };
        if self
            .compute
            .send(to, tag, &floats)
            .map_err(RankError::from)?
        {
            return Ok(());
        }
        self.comm
            .send(to, tag, floats.into_vec())
            .map_err(RankError::from)
    }

    /// Receives from rank `from` what [`Rank::halo_send`] sent.
    /// The rows of edge `e`'s input (forward) or of their gradient (backward) that rank
    /// `from`'s halo message of `pass` carries to this rank.
    pub(super) fn halo_piece(
        &self,
        from: u32,
        e: usize,
        pass: HaloPass,
    ) -> Result<Region, RankError> {
        let (own, ext) = self.halo_regions(e, self.rank)?;
        let (from_own, from_ext) = self.halo_regions(e, from)?;
        Ok(match pass {
            HaloPass::Forward | HaloPass::Again => intersect(&ext, &from_own),
            HaloPass::Backward => intersect(&from_ext, &own),
        })
    }

    pub(super) fn halo_recv(
        &mut self,
        from: u32,
        tag: u64,
        e: usize,
        mb: u32,
        pass: HaloPass,
    ) -> Result<(), RankError> {
        let piece = self.halo_piece(from, e, pass)?;
        // Sent device to device (as [`Rank::halo_send`] decides alike on both sides).
        let data = match self.device_recv(from, tag, volume(&piece))? {
            Some(data) => data,
            None => Floats::from(self.comm.recv(from, tag).map_err(RankError::from)?),
        };
        if data.len() != volume(&piece) {
            return Err(bug(format!(
                "the halo from rank {from} has {} elements where {} were expected",
                data.len(),
                volume(&piece)
            )));
        }
        match pass {
            HaloPass::Forward | HaloPass::Again => {
                let t = Tensor {
                    shape: dims(&piece),
                    data: Data::F32(data),
                };
                self.halos.rows.entry((e, mb)).or_default().push((piece, t));
            }
            HaloPass::Backward => {
                let (region, g) = self
                    .input_grads
                    .remove(&(e, mb))
                    .ok_or_else(|| bug("a halo gradient for an input without one"))?;
                let g = match self
                    .compute
                    .accumulate(g, &region, &piece, &data)
                    .map_err(RankError::from)?
                {
                    Ok(sum) => sum,
                    Err(mut g) => {
                        kernels::add(g.make_mut(), &reframe(&data, &piece, &region));
                        g
                    }
                };
                self.input_grads.insert((e, mb), (region, g));
            }
        }
        Ok(())
    }

    /// After layer `l`'s backward pass: the gradient `g` of edge `e`'s input over
    /// everything its windows read (`ext`), kept for the halo sends; the part over its own
    /// piece `need` is the input gradient.
    pub(super) fn split_halo_gradient(
        &mut self,
        e: usize,
        mb: u32,
        ext: Region,
        g: Floats,
        need: &Region,
    ) -> Result<Floats, RankError> {
        let own = match self.compute.crop(&g, &ext, need).map_err(RankError::from)? {
            Some(own) => own,
            None => reframe(&g, &ext, need).into(),
        };
        self.halos.grads.insert((e, mb), (ext, g));
        Ok(own)
    }
}
