//! Running an attention layer on a piece of its heads, as Megatron-LM's tensor-parallel
//! attention does. The layer's nodes are the model's, written for every head, so the
//! shape constants they read — reshape targets, split sizes — name global sizes. The cut
//! is followed from the layer's inputs (their feature axis, cut into `pieces`) through the
//! view ops, products and elementwise ops to every constant that names its size, and that
//! constant is made local: the cut entry of a reshape target, every size of a split along
//! the cut axis, divided by `pieces`.
//!
//! What the cut cannot pass (a softmax or a reduction over it, a contraction over it, a
//! per-head constant) is refused with the node's name: the layer cannot run on a piece.
//!
//! The fused QKV tensor such a layer reads is held by groups — its feature axis taken as
//! `[groups, features / groups]`, one group per output of the split separating Q, K and V
//! — so that a rank's piece is `[q_i | k_i | v_i]`.

use std::collections::BTreeMap;

use ralpc_codegen::layout::{Cut, LayerKind};
use ralpc_ir::{Graph, GraphInfo, NodeId, Op, Site, ValueId};

use super::{derived, setup, Prepared, Refusal, RunError, Source};
use crate::cpu::region::{crop, interval, Region};
use crate::cpu::tensor::Tensor;

/// How a constant read by a head-split layer is made local.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Adjust {
    /// Entry `i` of a shape target, divided by the pieces.
    Entry(usize),
    /// Every entry (split sizes along the cut axis), divided by the pieces.
    Every,
}

/// What a tensor a head-split node reads whole along the cut axis is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operand {
    /// A trainable weight (a QKV bias): each rank holds its piece.
    Weight,
    /// Computed from constants alone (BLOOM's ALiBi bias, one row per head): each rank
    /// computes it whole before the layer and takes its heads.
    Constant,
    /// An activation: the layer cannot run on a piece.
    Activation,
}

/// Where a constant read per head is cut: its axis, and how many heads it holds along it
/// after any outer elements (the batch, where heads are merged under it, which varies
/// with the samples a rank runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pick {
    pub(super) axis: usize,
    pub(super) heads: u64,
}

/// The constants a layer reads that change when it runs on one of `pieces` pieces of its
/// heads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct LocalShapes {
    pub(super) pieces: i64,
    pub(super) adjust: BTreeMap<ValueId, Adjust>,
    /// Weights the layer applies along the cut axis (a QKV bias added after the product):
    /// each with its axis, cut like the features it meets.
    pub(super) sliced: BTreeMap<ValueId, usize>,
    /// Values whose cut axis merges outer ones (each rank's piece not one box of it).
    pub(super) merged: std::collections::BTreeSet<ValueId>,
    /// Constants the layer reads per head ([`Operand::Constant`]): each rank's heads of
    /// them.
    pub(super) picks: BTreeMap<ValueId, Pick>,
}

impl LocalShapes {
    /// `value` (an integer tensor the layer reads) as the local run needs it.
    pub(super) fn apply(&self, v: ValueId, value: &[i64]) -> Option<Vec<i64>> {
        let adjust = self.adjust.get(&v)?;
        let mut out = value.to_vec();
        match *adjust {
            Adjust::Entry(i) => {
                if let Some(x) = out.get_mut(i) {
                    *x /= self.pieces;
                }
            }
            Adjust::Every => out.iter_mut().for_each(|x| *x /= self.pieces),
        }
        Some(out)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.adjust.is_empty() && self.picks.is_empty()
    }

    /// Piece `piece` (index, count) of the heads of `t`, the value of `v`, where the
    /// layer reads it per head; `t` itself otherwise.
    pub(super) fn pick(&self, v: ValueId, t: Tensor, piece: (u32, u32)) -> Tensor {
        let Some(&Pick { axis, heads }) = self.picks.get(&v) else {
            return t;
        };
        let s = t.shape.clone();
        let heads = heads as usize;
        let Some(&n) = s.get(axis).filter(|&&n| heads > 0 && n % heads == 0) else {
            return t;
        };
        let view = [
            s[..axis].iter().product(),
            n / heads,
            heads,
            s[axis + 1..].iter().product(),
        ];
        let whole: Region = view.iter().map(|&d| 0..d).collect();
        let mut mine = whole.clone();
        mine[2] = interval(piece, heads);
        let mut shape = s;
        shape[axis] = view[1] * mine[2].len();
        crop(&t.reshaped(view.to_vec()), &whole, &mine).reshaped(shape)
    }

    /// The axis along which weight `w` is cut, if the layer applies it along the heads.
    pub(super) fn sliced(&self, w: ValueId) -> Option<usize> {
        self.sliced.get(&w).copied()
    }
}

impl Prepared<'_> {
    /// Attention layers split by heads: the fused QKV tensor each reads is held by groups
    /// (one per output of the split separating Q, K and V), and the shape constants the
    /// layer's nodes read are made local ([`heads`]).
    pub(super) fn split_heads(&mut self) -> Result<(), RunError> {
        let g = self.exe.graph;
        for l in 0..self.layers.len() {
            let layer = &self.layers[l];
            let pieces = layer.view_in().pieces(0)[2].1;
            if layer.kind != LayerKind::Attention || pieces <= 1 {
                continue;
            }
            let refuse = |Refusal(why): Refusal| setup(format!("layer {}: {why}", layer.name));
            let mut seeds = BTreeMap::new();
            let mut groups = Vec::new();
            for &(v, source) in &layer.inputs {
                // What its projections write, cut by heads; tables and masks broadcast
                // over the heads are read whole.
                let Source::Edge(e) = source else { continue };
                if self.edges[e].read_as != LayerKind::Attention {
                    continue;
                }
                let c = self.carrier(v);
                let rank = self.microbatch_shape(c).map_err(&refuse)?.len();
                let f = self.axes(c, rank).features.ok_or_else(|| {
                    refuse(Refusal(format!(
                        "its input '{}' has no feature axis to cut by heads",
                        g.value(c).name
                    )))
                })?;
                seeds.insert(v, f);
                seeds.insert(c, f);
                if let Some(n) = self.qkv_split(&layer.nodes, [v, c], f) {
                    groups.push((c, n.map_err(&refuse)?));
                }
            }
            let (local, cut) = local_shapes(g, self.exe.info, &layer.nodes, seeds, pieces, &|v| {
                self.operand(v)
            })
            .map_err(&refuse)?;
            // Each output as its readers hold it: the merged heads cut, a table whole;
            // a piece of it one box.
            if let Some(o) = layer.outputs.iter().find(|o| local.merged.contains(o)) {
                return Err(refuse(Refusal(format!(
                    "its output '{}' holds its heads merged with outer axes",
                    g.value(*o).name
                ))));
            }
            for &o in &layer.outputs {
                let whole = self.output_view(l, o).features == Cut::Whole;
                if whole == cut.contains_key(&o) {
                    return Err(refuse(Refusal(format!(
                        "its output '{}' is {} by heads where its readers hold it {}",
                        g.value(o).name,
                        if whole { "cut" } else { "not cut" },
                        if whole { "whole" } else { "cut" }
                    ))));
                }
            }
            let name = layer.name.clone();
            for &v in local.picks.keys() {
                self.hoist(l, v)
                    .map_err(|why| setup(format!("layer {name}: {why}")))?;
            }
            self.layers[l].local = local;
            self.groups.extend(groups);
        }
        Ok(())
    }

    /// What `v` is to a node that reads it whole along a cut axis.
    pub(super) fn operand(&self, v: ValueId) -> Operand {
        let c = self.carrier(v);
        if self.exe.weights.trainable.contains(&c) {
            Operand::Weight
        } else if derived::derivable(self.exe, c) {
            Operand::Constant
        } else {
            Operand::Activation
        }
    }

    /// Makes `v`, computed from constants alone, an input layer `l` derives before it
    /// runs, rather than computes among its nodes: the nodes computing it only for it
    /// leave the layer (every rank takes its heads of `v` as it enters). A value another
    /// node of the layer also needs is refused.
    fn hoist(&mut self, l: usize, v: ValueId) -> Result<(), Refusal> {
        let g = self.exe.graph;
        let layer = &self.layers[l];
        let made_here = |x: ValueId| layer.nodes.contains(&g.value(x).producer);
        if !made_here(v) {
            return Ok(());
        }
        // The nodes behind `v` inside the layer.
        let mut behind: Vec<NodeId> = Vec::new();
        let mut stack = vec![g.value(v).producer];
        while let Some(n) = stack.pop() {
            if behind.contains(&n) {
                continue;
            }
            behind.push(n);
            stack.extend(
                g.node(n)
                    .inputs
                    .iter()
                    .flatten()
                    .filter(|&&x| made_here(x))
                    .map(|&x| g.value(x).producer),
            );
        }
        let read_elsewhere = |x: ValueId| {
            layer.outputs.contains(&x)
                || layer.nodes.iter().any(|&n| {
                    !behind.contains(&n) && g.node(n).inputs.iter().flatten().any(|&i| i == x)
                })
        };
        if let Some(&n) = behind.iter().find(|&&n| {
            g.node(n)
                .outputs
                .iter()
                .any(|&o| o != v && read_elsewhere(o))
        }) {
            return Err(Refusal(format!(
                "{} computes a value read per head and one read whole",
                g.site(n)
            )));
        }
        let layer = &mut self.layers[l];
        layer.nodes.retain(|n| !behind.contains(n));
        let kept = &layer.nodes;
        layer.inputs.retain(|(x, _)| {
            kept.iter()
                .any(|&n| g.node(n).inputs.iter().flatten().any(|i| i == x))
        });
        layer.inputs.push((v, Source::Derived));
        Ok(())
    }

    /// How many equal parts the split among `nodes` that reads one of `input` along axis
    /// `f` makes (Q, K, V: 3), if there is one; an error for unequal parts.
    pub(super) fn qkv_split(
        &self,
        nodes: &[NodeId],
        input: [ValueId; 2],
        f: usize,
    ) -> Option<Result<usize, Refusal>> {
        let g = self.exe.graph;
        // The input, and what elementwise ops (a bias add) make of it before the split.
        let mut reach: Vec<ValueId> = input.to_vec();
        for &n in nodes {
            let node = g.node(n);
            let elementwise = matches!(
                node.op,
                Op::Binary(_) | Op::Unary(_) | Op::Identity | Op::Cast { .. }
            );
            if elementwise && node.inputs.iter().flatten().any(|x| reach.contains(x)) {
                reach.extend(node.outputs.iter().copied());
            }
        }
        let (id, node) = nodes.iter().map(|&n| (n, g.node(n))).find(|(_, n)| {
            let Op::Split { axis, .. } = n.op else {
                return false;
            };
            let rank = self.exe.info.ty(input[1]).shape.rank() as i64;
            (if axis < 0 { axis + rank } else { axis }) == f as i64
                && n.inputs
                    .first()
                    .copied()
                    .flatten()
                    .is_some_and(|x| reach.contains(&x))
        })?;
        let parts = node.outputs.len();
        let sizes: Vec<Option<u64>> = node
            .outputs
            .iter()
            .map(|&o| {
                self.exe
                    .info
                    .ty(o)
                    .shape
                    .as_sizes()
                    .and_then(|s| s.get(f).copied())
            })
            .collect();
        Some(
            if sizes.windows(2).all(|w| w[0] == w[1] && w[0].is_some()) {
                Ok(parts)
            } else {
                Err(Refusal(format!(
                    "its {} makes unequal parts {sizes:?} (grouped-query attention); only \
                 equal Q, K and V are split by heads",
                    g.site(id)
                )))
            },
        )
    }
}

/// Follows the cut of `cut` (values and the axis each is cut on, into `pieces`) through
/// `nodes` (in execution order) and collects the constants to make local; with them, the
/// axis every value the cut reached is cut on.
///
/// # Errors
/// A node the cut cannot pass, named.
pub(super) fn local_shapes(
    graph: &Graph,
    info: &GraphInfo,
    nodes: &[NodeId],
    mut cut: BTreeMap<ValueId, usize>,
    pieces: u32,
    operand: &dyn Fn(ValueId) -> Operand,
) -> Result<(LocalShapes, BTreeMap<ValueId, usize>), Refusal> {
    let sizes = |v: ValueId| -> Result<Vec<u64>, Refusal> {
        info.ty(v)
            .shape
            .as_sizes()
            .ok_or_else(|| Refusal(format!("'{}' has no static shape", graph.value(v).name)))
    };
    // An integer tensor's entries, when known before the run (shape targets, axes).
    let ints = |v: ValueId| -> Option<Vec<i64>> {
        let content = info.ty(v).content.as_ref()?;
        content.iter().map(|s| s.as_i64()).collect()
    };
    let t = u64::from(pieces.max(1));
    let mut local = LocalShapes {
        pieces: i64::from(pieces.max(1)),
        ..LocalShapes::default()
    };
    let mut sliced = BTreeMap::new();
    let mut picks = BTreeMap::new();
    let mut adjust = |v: ValueId, how: Adjust, node: &Site| -> Result<(), Refusal> {
        match local.adjust.insert(v, how) {
            Some(before) if before != how => Err(Refusal(format!(
                "{node} reads the shape '{}' that another node of the layer reads \
                 for another axis",
                graph.value(v).name
            ))),
            _ => Ok(()),
        }
    };
    // Values whose cut axis merges outer ones (SDPA's `[b·heads, s, d]`): how many outer
    // elements lead each rank's piece of it. Each rank's local reshapes still hold its
    // heads apart, and a reshape splitting the axis again finds them.
    let mut merged: BTreeMap<ValueId, u64> = BTreeMap::new();
    for (at, &n) in nodes.iter().enumerate() {
        let node = graph.node(n);
        let cuts: Vec<(usize, usize)> = node
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(slot, v)| Some((slot, *cut.get(&(*v)?)?)))
            .collect();
        if cuts.is_empty() {
            continue;
        }
        let site = graph.site(n);
        let refuse = |why: &str| {
            Err(Refusal(format!(
                "{site} {why}, so the layer cannot run on a piece of its heads"
            )))
        };
        let data = |slot: usize| node.inputs.get(slot).copied().flatten();
        // The first cut input's merged factor passes to the outputs, but through reshapes.
        let mut merged_out = cuts
            .first()
            .and_then(|&(slot, _)| merged.get(&data(slot)?).copied())
            .filter(|_| !matches!(node.op, Op::Reshape { .. }));
        let rank_of = |slot: usize| data(slot).map_or(Ok(0), |v| sizes(v).map(|s| s.len()));
        let out_rank = match node.outputs.first() {
            Some(&o) => sizes(o)?.len(),
            None => continue,
        };
        let axis = match &node.op {
            Op::Split { axis, sizes: attr } => {
                let [(0, a)] = cuts[..] else {
                    return refuse("reads a cut split-size tensor");
                };
                if axis_of(*axis, out_rank) == Some(a) {
                    match (attr, data(1)) {
                        (Some(_), _) => {
                            return refuse("splits the cut axis by sizes in an attribute");
                        }
                        (None, Some(s)) => adjust(s, Adjust::Every, &site)?,
                        (None, None) => {}
                    }
                }
                a
            }
            Op::Reshape { allowzero } => {
                let [(0, a)] = cuts[..] else {
                    return refuse("reads a cut shape");
                };
                let (Some(x), Some(target), Some(&o)) = (data(0), data(1), node.outputs.first())
                else {
                    return refuse("has no shape input");
                };
                let (from, to) = (sizes(x)?, sizes(o)?);
                let outer = merged.get(&x).copied().unwrap_or(1);
                let Some((j, o2)) = reshaped_cut(&from, a, outer, &to, t) else {
                    return refuse(&format!(
                        "reshapes {from:?} to {to:?}, which does not keep axis {a}'s \
                         {t} pieces apart"
                    ));
                };
                if o2 > 1 {
                    merged_out = Some(o2);
                }
                let Some(entries) = ints(target) else {
                    return refuse("reads a target shape not known before the run");
                };
                match entries.get(j) {
                    Some(-1) => {}
                    Some(0) if !allowzero && j == a => {}
                    Some(0) if !allowzero => {
                        return refuse("copies the cut size to another axis");
                    }
                    Some(_) => adjust(target, Adjust::Entry(j), &site)?,
                    None => return refuse("has a target shorter than its output"),
                }
                j
            }
            Op::Transpose { perm } => {
                let a = cuts[0].1;
                match perm {
                    Some(p) => match p.iter().position(|&x| axis_of(x, out_rank) == Some(a)) {
                        Some(j) => j,
                        None => return refuse("has a permutation without the cut axis"),
                    },
                    None => out_rank - 1 - a,
                }
            }
            Op::MatMul => {
                let (ra, rb) = (rank_of(0)?, rank_of(1)?);
                if ra < 2 || rb < 2 {
                    return refuse("multiplies vectors");
                }
                let mut axis = None;
                for &(slot, a) in &cuts {
                    let r = if slot == 0 { ra } else { rb };
                    let contracted = if slot == 0 { r - 1 } else { r - 2 };
                    if a == contracted {
                        return refuse("contracts over the cut axis (partial sums)");
                    }
                    let j = match (slot, a + 2 == r, a + 1 == r) {
                        (0, true, _) => out_rank - 2,
                        (1, _, true) => out_rank - 1,
                        _ => a + out_rank - r,
                    };
                    if axis.is_some_and(|x| x != j) {
                        return refuse("reads its two inputs cut on different axes");
                    }
                    axis = Some(j);
                }
                let j = axis.unwrap_or(0);
                if j + 2 < out_rank {
                    // A batch axis: both inputs must be cut on it, or broadcast over it.
                    for slot in 0..2 {
                        if cuts.iter().any(|&(s, _)| s == slot) {
                            continue;
                        }
                        let Some(v) = data(slot) else { continue };
                        let s = sizes(v)?;
                        if (j + s.len())
                            .checked_sub(out_rank)
                            .is_some_and(|i| s[i] > 1)
                        {
                            return refuse("multiplies a cut batch axis by a whole one");
                        }
                    }
                }
                j
            }
            // Per channel: pooling, batch normalization (its statistics are per channel).
            Op::Pool(_) | Op::GlobalPool(_) | Op::BatchNorm { .. } => match cuts[..] {
                [(0, a)] if a == 1 => a,
                _ => return refuse("normalizes or pools across the cut axis"),
            },
            Op::Flatten { .. } => {
                let (Some(x), Some(&o)) = (data(0), node.outputs.first()) else {
                    return refuse("has no input");
                };
                let (from, to) = (sizes(x)?, sizes(o)?);
                match cuts[..] {
                    [(0, a)] => match reshaped_cut(&from, a, 1, &to, t) {
                        Some((j, 1)) => j,
                        _ => return refuse("merges the cut axis under an outer one"),
                    },
                    _ => return refuse("reads a cut shape"),
                }
            }
            Op::Softmax { axis, flatten, .. } => {
                let a = cuts[0].1;
                let over = axis_of(*axis, out_rank);
                if over == Some(a) || (*flatten && over.is_some_and(|o| o < a)) {
                    return refuse("normalizes over the cut axis");
                }
                a
            }
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Cast { .. }
            | Op::Dropout { .. }
            | Op::Identity
            | Op::Clip { .. } => {
                // Broadcast: axes align from the right.
                let mut axis = None;
                for &(slot, a) in &cuts {
                    let j = a + out_rank - rank_of(slot)?;
                    if axis.is_some_and(|x| x != j) {
                        return refuse("reads its inputs cut on different axes");
                    }
                    axis = Some(j);
                }
                let j = axis.unwrap_or(0);
                for (slot, v) in node.inputs.iter().enumerate() {
                    let Some(v) = *v else { continue };
                    if cuts.iter().any(|&(s, _)| s == slot) {
                        continue;
                    }
                    let s = sizes(v)?;
                    let Some(i) = (j + s.len()).checked_sub(out_rank).filter(|&i| s[i] > 1) else {
                        continue;
                    };
                    let name = &graph.value(v).name;
                    match operand(v) {
                        Operand::Weight if merged_out.is_some() => {
                            return refuse(&format!(
                                "applies '{name}' along heads merged with outer axes"
                            ));
                        }
                        // A weight applied per feature (a bias): cut with them.
                        Operand::Weight => {
                            sliced.insert(v, i);
                        }
                        // A constant per head, as many as the cut tensor has, read by
                        // this node first.
                        Operand::Constant
                            if sizes(node.outputs[0])?.get(j) == Some(&s[i])
                                && !nodes[..at].iter().any(|&m| {
                                    graph.node(m).inputs.iter().flatten().any(|&x| x == v)
                                }) =>
                        {
                            let heads = s[i] / merged_out.unwrap_or(1).max(1);
                            picks.insert(v, Pick { axis: i, heads });
                            cut.insert(v, i);
                        }
                        _ => return refuse(&format!("reads '{name}', whole along the cut axis")),
                    }
                }
                j
            }
            // Rotary positions' rotate-half: halves of every head concatenated.
            Op::Concat { axis } => {
                let a = cuts[0].1;
                if cuts.iter().any(|&(_, c)| c != a) || cuts.len() != node.inputs.len() {
                    return refuse("concatenates a cut tensor with a whole one");
                }
                if axis_of(*axis, out_rank) == Some(a) {
                    return refuse("concatenates along the cut axis");
                }
                a
            }
            // Grouped-query attention's repeat of the key and value heads: the target names
            // the global heads where it does not broadcast them.
            Op::Expand => {
                let [(0, a)] = cuts[..] else {
                    return refuse("reads a cut shape");
                };
                let j = a + out_rank - rank_of(0)?;
                if let Some(target) = data(1) {
                    let Some(entries) = ints(target) else {
                        return refuse("reads a target shape not known before the run");
                    };
                    let at = (j + entries.len()).checked_sub(out_rank);
                    if let Some(&e) = at.and_then(|i| entries.get(i)) {
                        if e > 1 {
                            adjust(target, Adjust::Entry(at.unwrap_or(0)), &site)?;
                        }
                    }
                }
                j
            }
            // Axes inserted or removed around the cut one (grouped-query attention's
            // repeat of the key and value heads inserts one after them).
            Op::Unsqueeze { axes } | Op::Squeeze { axes } => {
                let [(0, a)] = cuts[..] else {
                    return refuse("reads cut axes");
                };
                let listed: Option<Vec<i64>> = match (axes, data(1)) {
                    (Some(axes), _) => Some(axes.clone()),
                    (None, Some(v)) => ints(v),
                    (None, None) => Some(Vec::new()),
                };
                let Some(listed) = listed else {
                    return refuse("reads axes not known before the run");
                };
                let inserting = matches!(node.op, Op::Unsqueeze { .. });
                let wide = if inserting { out_rank } else { rank_of(0)? };
                let mut marked: Vec<usize> =
                    listed.iter().filter_map(|&x| axis_of(x, wide)).collect();
                if !inserting && listed.is_empty() {
                    let from = data(0).map(sizes).transpose()?.unwrap_or_default();
                    marked = (0..from.len()).filter(|&i| from[i] == 1).collect();
                }
                let kept = (0..wide).filter(|i| !marked.contains(i));
                if inserting {
                    match kept.clone().nth(a) {
                        Some(j) => j,
                        None => return refuse("inserts axes past its input"),
                    }
                } else if marked.contains(&a) {
                    return refuse("removes the cut axis");
                } else {
                    kept.take_while(|&i| i < a).count()
                }
            }
            // A slice of other axes (partial rotary positions: the head dimension's first
            // part); one keeping the cut axis whole keeps it whole on the pieces too.
            Op::Slice { .. } => {
                let ([(0, a)], Some(x), Some(&o)) = (&cuts[..], data(0), node.outputs.first())
                else {
                    return refuse("reads cut slice bounds");
                };
                if sizes(x)?.get(*a) != sizes(o)?.get(*a) {
                    return refuse("slices the cut axis");
                }
                *a
            }
            // Each row normalized over axes after the cut one (a sequence-parallel
            // LayerNorm); its scale and bias are whole.
            Op::LayerNorm { axis, .. } => {
                let [(0, a)] = cuts[..] else {
                    return refuse("reads a cut scale or bias");
                };
                if axis_of(*axis, out_rank).is_none_or(|first| first <= a) {
                    return refuse("normalizes over the cut axis");
                }
                a
            }
            // A pick along another axis: BLOOM's fused projection viewed as
            // `[b, s, heads, 3, d]` and Q, K and V taken from its fourth axis.
            Op::Gather { axis } => {
                let [(0, a)] = cuts[..] else {
                    return refuse("gathers by cut indices");
                };
                let g = axis_of(*axis, rank_of(0)?);
                match g {
                    Some(g) if g > a => a,
                    Some(g) if g < a => a + rank_of(1)? - 1,
                    _ => return refuse("gathers along the cut axis"),
                }
            }
            // The shape of a piece is the piece's: it names local sizes by itself.
            Op::Shape { .. } => continue,
            _ => return refuse("is not one the head split passes through"),
        };
        for &o in &node.outputs {
            cut.insert(o, axis);
            if let Some(m) = merged_out {
                merged.insert(o, m);
            }
        }
    }
    local.sliced = sliced;
    local.picks = picks;
    local.merged = merged.keys().copied().collect();
    Ok((local, cut))
}

fn axis_of(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a).ok().filter(|&a| a < rank)
}

/// The axis of a reshape's output `to` that carries axis `a` of `from`, cut into `t`
/// pieces after its `outer` leading factor (1: the axis is cut whole), and that axis's own
/// outer factor. Each rank reshapes its piece alone: that holds where the elements before
/// the cut factor (the axes before `a`, times `outer`) end at a factor of one output axis,
/// whose rest divides by `t` — an axis merged under outer ones (`[b, heads, s, d]` to
/// `[b·heads, s, d]`) and split back.
fn reshaped_cut(from: &[u64], a: usize, outer: u64, to: &[u64], t: u64) -> Option<(usize, u64)> {
    let before = |s: &[u64], n: usize| s[..n].iter().product::<u64>();
    if outer == 0 || from[a] % outer != 0 || (from[a] / outer) % t != 0 {
        return None;
    }
    let lead = before(from, a) * outer;
    let j = (0..to.len()).find(|&j| before(to, j) <= lead && lead < before(to, j + 1))?;
    let o2 = lead / before(to, j).max(1);
    (lead % before(to, j).max(1) == 0 && to[j] % o2 == 0 && (to[j] / o2) % t == 0)
        .then_some((j, o2))
}

#[cfg(test)]
mod tests {
    use super::{reshaped_cut, LocalShapes, Pick};
    use crate::cpu::tensor::Tensor;
    use ralpc_ir::ValueId;

    #[test]
    fn a_rank_takes_its_heads_of_a_bias_merged_under_the_batch() {
        // ALiBi's `[b·heads, 1, s]` for 2 samples and 4 heads, each row its index.
        let v = ValueId::from_index(0);
        let local = LocalShapes {
            picks: [(v, Pick { axis: 0, heads: 4 })].into(),
            ..LocalShapes::default()
        };
        let rows: Vec<f32> = (0..8).flat_map(|r| [r as f32; 2]).collect();
        let bias = Tensor::f32(vec![8, 1, 2], rows);
        let second = local.pick(v, bias.clone(), (1, 2));
        assert_eq!(second.shape, [4, 1, 2]);
        assert_eq!(second.floats(), Some(&[2., 2., 3., 3., 6., 6., 7., 7.][..]));
        // At one sample (a pipeline's microbatch), the same heads.
        let one = Tensor::f32(vec![4, 1, 2], bias.floats().unwrap()[..8].to_vec());
        assert_eq!(
            local.pick(v, one, (1, 2)).floats(),
            Some(&[2., 2., 3., 3.][..])
        );
        // A value the layer does not read per head is left whole.
        assert_eq!(
            local
                .pick(ValueId::from_index(1), bias.clone(), (1, 2))
                .shape,
            bias.shape
        );
    }

    #[test]
    fn a_head_cut_passes_the_split_and_merge_of_heads() {
        // [b, s, h] -> [b, s, heads, d]: the cut hidden axis becomes the heads axis.
        assert_eq!(
            reshaped_cut(&[2, 16, 64], 2, 1, &[2, 16, 4, 16], 2),
            Some((2, 1))
        );
        // And back.
        assert_eq!(
            reshaped_cut(&[2, 16, 4, 16], 2, 1, &[2, 16, 64], 2),
            Some((2, 1))
        );
        // Three heads do not divide by two.
        assert_eq!(reshaped_cut(&[2, 16, 48], 2, 1, &[2, 16, 3, 16], 2), None);
        // Heads merged under the batch ([b·heads, s, d], as SDPA's decomposition writes
        // them): 2 samples lead each piece; split back, the heads are cut again.
        assert_eq!(reshaped_cut(&[2, 4, 16], 1, 1, &[8, 16], 2), Some((0, 2)));
        assert_eq!(reshaped_cut(&[8, 16], 0, 2, &[2, 4, 16], 2), Some((1, 1)));
        // A cut factor that does not divide by the pieces.
        assert_eq!(reshaped_cut(&[2, 3, 16], 1, 1, &[6, 16], 2), None);
    }
}
