//! Preparing a plan to run: the layers' shares, tensors and weights as the executor
//! needs them, and what it refuses.

use super::resolve::Resolved;
use super::*;

impl<'a> Prepared<'a> {
    pub(super) fn new(exe: &'a Executable<'a>) -> Result<Prepared<'a>, RunError> {
        let plan = exe.plan;
        let g = exe.graph;
        let layout = plan.layout.as_ref().ok_or_else(|| {
            setup(
                "the plan does not lay out its layers on the model's ops (it was lowered \
                 from a profile, without the model): plan the ONNX model to run it",
            )
        })?;
        let resolved = Resolved::new(layout, g)?;
        if plan.schedule == "async" {
            return Err(setup(
                "the asynchronous (PipeDream) schedule is not executable on the CPU backend: \
                 its weight versions change the numerics by design; plan with --schedule 1f1b",
            ));
        }
        let m = plan.microbatches.max(1) as u64;
        if plan.batch % m != 0 {
            return Err(setup(format!(
                "the batch {} does not divide into {m} microbatches",
                plan.batch
            )));
        }
        let aliases = resolved.aliases.clone();
        let carried = |v| carrier(&aliases, v);
        // Edges in the lowering's order: by consumer, then its inputs from layers.
        let mut edges: Vec<EdgeInfo> = layout
            .edges
            .iter()
            .zip(&resolved.edges)
            .map(|(e, &value)| {
                let kind = |l: u32| layout.layers.get(l as usize).map(|l| l.kind);
                let consumer = match layout.layers.get(e.consumer as usize) {
                    Some(c) => epilogue_reads_as(c.kind, c.split, e.epilogue),
                    None => LayerKind::DataMovement,
                };
                let (held_as, read_as) = edge_kinds(kind(e.producer), consumer);
                EdgeInfo {
                    producer: e.producer as usize,
                    consumer: e.consumer as usize,
                    value: carried(value),
                    scattered: e.scattered,
                    halo: false,
                    held_as,
                    read_as,
                    shares: e.shares.map(|first| first as usize),
                    gradient_with: e.gradient_with.map(|first| first as usize),
                    passes_on: false,
                    regathered: e.regathered,
                }
            })
            .collect();
        // A gather's pieces stay for the later edges sharing it, up to the last of them.
        for j in 0..edges.len() {
            let first = edges[j].shares.unwrap_or(j);
            edges[j].passes_on = edges[j + 1..].iter().any(|x| x.shares == Some(first));
        }
        let order = exe.info.positions();
        let graph_output = *g
            .outputs()
            .first()
            .ok_or_else(|| setup("the model has no output"))?;
        let graph_output = carried(graph_output);
        let mut output = None;
        let owners: BTreeMap<ValueId, usize> = resolved
            .layers
            .iter()
            .enumerate()
            .flat_map(|(l, r)| r.weights.iter().map(move |&w| (carried(w), l)))
            .collect();
        let mut weight_owner: BTreeMap<ValueId, usize> = BTreeMap::new();
        let tied_all_reduced: BTreeSet<&str> = plan
            .programs
            .iter()
            .flatten()
            .filter_map(|i| match i {
                Instruction::AllReduce {
                    tied: Some(name), ..
                } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        let mut layers = Vec::with_capacity(layout.layers.len());
        for (l, (placed, found)) in layout.layers.iter().zip(&resolved.layers).enumerate() {
            let name = plan.layers.get(l).map_or("", String::as_str);
            // Generated weights come from the weights, not from the layer's prologue.
            let mut nodes: Vec<NodeId> = found
                .nodes
                .iter()
                .copied()
                .filter(|&n| {
                    !g.node(n)
                        .outputs
                        .iter()
                        .all(|v| exe.weights.trainable.contains(v))
                })
                .collect();
            nodes.sort_by_key(|n| order.get(n).copied().unwrap_or(usize::MAX));
            let inside: BTreeSet<ValueId> = nodes
                .iter()
                .flat_map(|&n| g.node(n).outputs.iter().copied())
                .collect();
            let mut inputs: Vec<(ValueId, Source)> = Vec::new();
            let mut weights = Vec::new();
            let mut owned = Vec::new();
            for &n in &nodes {
                for v in g.node(n).inputs.iter().flatten().copied() {
                    if inside.contains(&v) || inputs.iter().any(|(w, _)| *w == v) {
                        continue;
                    }
                    let c = carried(v);
                    let producer = g.node(g.value(c).producer);
                    let source = if let Some(e) =
                        edges.iter().position(|e| e.consumer == l && e.value == c)
                    {
                        Source::Edge(e)
                    } else if matches!(producer.op, Op::Constant { .. })
                        || exe.weights.trainable.contains(&c)
                    {
                        if exe.weights.trainable.contains(&c) {
                            // The layer the plan counts a weight in carries its gradient in
                            // its bucket, unless the plan sums it by its own all-reduce.
                            let owner = owners.get(&c).ok_or_else(|| {
                                setup(format!(
                                    "layer {name} reads the weight '{}', which no layer owns",
                                    g.value(c).name
                                ))
                            })?;
                            if *owner == l && !weight_owner.contains_key(&c) {
                                weight_owner.insert(c, l);
                                if !tied_all_reduced.contains(g.value(c).name.as_str()) {
                                    owned.push(c);
                                }
                            }
                            weights.push(c);
                        }
                        Source::Constant
                    } else if matches!(producer.op, Op::Input) {
                        Source::GraphInput
                    } else if exe.info.ty(c).content.is_some() {
                        Source::Folded
                    } else if derived::derivable(exe, c) {
                        Source::Derived
                    } else {
                        return Err(setup(format!(
                            "layer {name} reads '{}', which no layer, input or constant provides",
                            g.value(v).name
                        )));
                    };
                    inputs.push((v, source));
                }
            }
            let mut outputs: Vec<ValueId> = edges
                .iter()
                .filter(|e| e.producer == l)
                .map(|e| e.value)
                .collect();
            if inside.contains(&graph_output) {
                outputs.push(graph_output);
                output = Some((l, graph_output));
            }
            outputs.sort_unstable();
            outputs.dedup();
            let main = nodes.iter().copied().find(|&n| {
                matches!(
                    g.node(n).op,
                    Op::Conv(_) | Op::ConvTranspose(_) | Op::Gemm(_) | Op::MatMul
                )
            });
            layers.push(LayerExec {
                name: name.to_owned(),
                kind: placed.kind,
                split: placed.split,
                first: placed.first_rank,
                nodes,
                inputs,
                outputs,
                main,
                weights,
                owned,
                local: heads::LocalShapes::default(),
                local_rows: heads::LocalShapes::default(),
                halo: None,
            });
        }
        let output = output.ok_or_else(|| setup("no layer computes the model's output"))?;
        let channels_first = channels_first(exe, &carried);
        let features_last = features_last(exe, &carried, &channels_first);
        let tied = weight_owner
            .keys()
            .copied()
            .filter(|&w| tied_all_reduced.contains(g.value(w).name.as_str()))
            .collect();
        let mut prepared = Prepared {
            exe,
            microbatch: (plan.batch / m) as usize,
            edges,
            layers,
            output,
            channels_first,
            features_last,
            feature_axes: BTreeMap::new(),
            row_axes: BTreeMap::new(),
            tied,
            infos: Mutex::default(),
            folded: Mutex::default(),
            batch_axes: Mutex::default(),
            env: Env {
                mode: Mode::Training,
                exported_batch: g.rebatch().map(|r| r.exported),
                samples: None,
            },
            recompute: (0..layout.layers.len())
                .map(|l| layout.recompute_run(l))
                .collect(),
            groups: BTreeMap::new(),
            aliases,
        };
        // Column-parallel products first: the axis their epilogues' outputs are cut on (a
        // projection reshaped into heads: the heads) is where an attention layer reading
        // them finds its heads.
        prepared.split_epilogues();
        prepared.split_heads()?;
        prepared.split_row_shapes();
        prepared.plan_halos(&resolved)?;
        prepared.check()?;
        Ok(prepared)
    }

    /// Refuses what this executor cannot run exactly.
    pub(super) fn check(&self) -> Result<(), RunError> {
        let g = self.exe.graph;
        for l in &self.layers {
            let Split {
                attribute: a,
                parameter: p,
                ..
            } = l.split;
            match l.kind {
                LayerKind::Conv if p > 1 => {
                    if let Some(Op::Conv(c)) = l.main.map(|n| &g.node(n).op) {
                        if c.group != 1 {
                            return Err(setup(format!(
                                "layer {}: a grouped convolution split by channels is not executable yet",
                                l.name
                            )));
                        }
                    }
                }
                LayerKind::Embedding if a > 1 => {
                    // Its pieces' lookups are summed: what it computes of them may only
                    // add and view them (a sum of views is the view of the sum) and scale
                    // them by a constant (Gemma's √hidden); what computes the ids (OPT's
                    // positions from the mask) is free.
                    let mut looked_up: BTreeSet<ValueId> = BTreeSet::new();
                    let mut linear = true;
                    for &n in &l.nodes {
                        let node = g.node(n);
                        let lookup = matches!(node.op, Op::Gather { .. })
                            && node.inputs.first().copied().flatten().is_some_and(|t| {
                                self.exe.weights.trainable.contains(&self.carrier(t))
                            });
                        let reads = node.inputs.iter().flatten().any(|v| looked_up.contains(v));
                        let scaled = match (&node.op, &node.inputs[..]) {
                            (Op::Binary(Binary::Mul), [Some(a), Some(b)]) => {
                                let constant = |v: &ValueId| {
                                    !looked_up.contains(v)
                                        && self.operand(*v) == heads::Operand::Constant
                                };
                                constant(a) || constant(b)
                            }
                            (Op::Binary(Binary::Div), [Some(a), Some(b)]) => {
                                looked_up.contains(a)
                                    && self.operand(*b) == heads::Operand::Constant
                            }
                            _ => false,
                        };
                        if reads {
                            linear &= is_view(&node.op)
                                || scaled
                                || matches!(node.op, Op::Binary(Binary::Add));
                        }
                        if lookup || reads {
                            looked_up.extend(node.outputs.iter().copied());
                        }
                    }
                    if !linear || self.vocabulary_lookup(l).is_none() {
                        return Err(setup(format!(
                            "layer {}: a vocabulary-parallel embedding sums its pieces' \
                             lookups, so it may only look up tables and add them",
                            l.name
                        )));
                    }
                }
                LayerKind::Recurrent if p > 1 && self.gate_split(l).is_none() => {
                    return Err(setup(format!(
                        "layer {}: only a layer that is one RNN, GRU or LSTM op can be split \
                         by its gates",
                        l.name
                    )));
                }
                LayerKind::Dense if a > 1 => {
                    let main = l
                        .main
                        .ok_or_else(|| setup(format!("layer {} has no matrix product", l.name)))?;
                    if let Some(n) = self.partial_sum_breaker(l, main) {
                        return Err(setup(format!(
                            "layer {}: a row-parallel split reduces partial sums after the \
                             layer, so only adds may follow its product (of a bias, or of an \
                             input each rank adds its feature slice of), but {} follows it",
                            l.name,
                            g.site(n)
                        )));
                    }
                }
                _ => {}
            }
            if (a > 1 || p > 1)
                && l.nodes.iter().any(|&n| {
                    // Weights computed by prologue ops cannot be sliced where they enter.
                    g.node(n).inputs.iter().flatten().any(|&v| {
                        let producer = &g.node(g.value(v).producer).op;
                        self.exe.weights.trainable.contains(&v)
                            && !matches!(producer, Op::Constant { .. } | Op::ConstantOfShape { .. })
                    })
                })
            {
                return Err(setup(format!(
                    "layer {}: its weights are computed; it cannot be split",
                    l.name
                )));
            }
        }
        Ok(())
    }

    /// The first node after a row-parallel layer's product that does not keep the sum of
    /// its ranks' partial results right. Adds do: of a bias (the first slice adds it, the
    /// others zeros), or of an input from outside the layer (each rank adds its feature
    /// slice, [`Rank::epilogue_share`]). Anything else would apply to a partial sum.
    pub(super) fn partial_sum_breaker(&self, l: &LayerExec, main: NodeId) -> Option<NodeId> {
        let g = self.exe.graph;
        let mut partial: BTreeSet<ValueId> = g.node(main).outputs.iter().copied().collect();
        let outside: BTreeSet<ValueId> = l.inputs.iter().map(|&(v, _)| v).collect();
        for &n in l.nodes.iter().filter(|&&n| after(&l.nodes, main, n)) {
            let node = g.node(n);
            let inputs: Vec<ValueId> = node.inputs.iter().flatten().copied().collect();
            let adds_partial = matches!(node.op, Op::Binary(Binary::Add))
                && inputs.len() == 2
                && inputs.iter().filter(|v| partial.contains(v)).count() == 1
                && inputs.iter().any(|v| outside.contains(v));
            // A view of a partial sum is a partial sum of the view (Hugging Face's GPT-2
            // reshapes its `[b·s, h]` products back to `[b, s, h]`).
            let views_partial =
                is_view(&node.op) && inputs.first().is_some_and(|v| partial.contains(v));
            if !adds_partial && !views_partial {
                return Some(n);
            }
            partial.extend(node.outputs.iter().copied());
        }
        None
    }

    pub(super) fn info_at(&self, batch: u64) -> Result<std::sync::Arc<GraphInfo>, Refusal> {
        let mut cache = self.infos.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(info) = cache.get(&batch) {
            return Ok(info.clone());
        }
        let info = std::sync::Arc::new((self.exe.info_at)(batch)?);
        cache.insert(batch, info.clone());
        Ok(info)
    }

    /// The value `v` folds to at `batch` samples, as [`folded`] makes it, shared by
    /// every step and rank.
    pub(super) fn folded_at(&self, v: ValueId, batch: u64) -> Result<Tensor, Refusal> {
        let mut cache = self.folded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = cache.get(&(v, batch)) {
            return Ok(t.clone());
        }
        let info = self.info_at(batch)?;
        let t = folded(&info, v).ok_or_else(|| {
            Refusal(format!(
                "'{}' has no value at batch {batch}",
                self.exe.graph.value(v).name
            ))
        })?;
        cache.insert((v, batch), t.clone());
        Ok(t)
    }

    /// How rank index `k` of layer `l` holds weight `w`: a piece of each group when the
    /// layer's output features are held by groups.
    pub(super) fn slice_of(&self, l: &LayerExec, k: u32, w: ValueId) -> Slice {
        let slice = self.slice_within(l, k, w);
        let out = l.view_out().pieces(k)[2];
        // Its output's groups, or for an attention layer its input's (a bias it adds to
        // the QKV columns before splitting them: as wide as they are, unlike a bias per
        // head added after).
        let wide = |v: ValueId| {
            let columns = self
                .exe
                .info
                .ty(v)
                .shape
                .as_sizes()
                .and_then(|s| s.last().copied());
            let width = match slice {
                Slice::Axis(axis, _) => self
                    .exe
                    .weights
                    .tensors
                    .get(&w)
                    .and_then(|t| t.shape.get(axis).copied()),
                _ => None,
            };
            columns.is_some_and(|c| width == Some(c as usize))
        };
        let grouped = l
            .outputs
            .iter()
            .find_map(|o| self.groups.get(o))
            .or_else(|| {
                l.inputs
                    .iter()
                    .filter(|_| l.kind == LayerKind::Attention)
                    .map(|&(v, _)| self.carrier(v))
                    .find_map(|c| self.groups.get(&c).filter(|_| wide(c)))
            });
        match (slice, grouped) {
            (Slice::Axis(axis, piece), Some(&groups)) if out.1 > 1 && piece == out => {
                Slice::Groups {
                    axis,
                    groups,
                    piece,
                }
            }
            (slice, _) => slice,
        }
    }

    /// How rank index `k` of layer `l` holds weight `w`, its groups aside.
    pub(super) fn slice_within(&self, l: &LayerExec, k: u32, w: ValueId) -> Slice {
        let g = self.exe.graph;
        let Split {
            attribute: a,
            parameter: p,
            ..
        } = l.split;
        if a <= 1 && p <= 1 {
            return Slice::Whole;
        }
        let wdims = self
            .exe
            .weights
            .tensors
            .get(&w)
            .map(|t| t.shape.clone())
            .unwrap_or_default();
        // The node using it, perhaps through an alias (the `Identity` an exporter puts on
        // a merged weight).
        let reader = |v: ValueId| {
            l.nodes.iter().find_map(|&n| {
                g.node(n)
                    .inputs
                    .iter()
                    .position(|x| x.is_some_and(|x| self.carrier(x) == v))
                    .map(|slot| (n, slot))
            })
        };
        let Some((mut node, mut slot)) = reader(w) else {
            return Slice::Whole;
        };
        if let Some(axis) = l.local.sliced(w) {
            // Applied along the heads: cut like the features it meets.
            return Slice::Axis(axis, l.view_in().pieces(k)[2]);
        }
        if l.kind == LayerKind::Embedding {
            // Vocabulary-parallel: the largest table by pieces of its rows, the others
            // (position embeddings) added by the first piece only.
            return match self.vocabulary_table(l) {
                Some(table) if table == w => Slice::Vocabulary(l.vocabulary_piece(k)),
                _ => Slice::FirstSliceOnly,
            };
        }
        let mut wdims = wdims;
        // A tied head reads the embedding through a transpose: slice what the product
        // reads, at the embedding's axis that becomes it.
        let mut perm: Option<Vec<usize>> = None;
        if let (Op::Transpose { perm: p }, 0) = (&g.node(node).op, slot) {
            let order: Vec<usize> = match p {
                Some(p) => p.iter().map(|&x| x.max(0) as usize).collect(),
                None => (0..wdims.len()).rev().collect(),
            };
            let transposed = g.node(node).outputs.first().copied();
            if let Some(next) = transposed.and_then(reader) {
                if order.iter().all(|&x| x < wdims.len()) {
                    wdims = order.iter().map(|&x| wdims[x]).collect();
                    (node, slot) = next;
                    perm = Some(order);
                }
            }
        }
        let slice = self.slice_at(l, k, node, slot, &wdims);
        match (slice, perm) {
            (Slice::Axis(axis, piece), Some(order)) => Slice::Axis(order[axis], piece),
            (slice, _) => slice,
        }
    }

    /// How rank index `k` of layer `l` holds the weight (of `wdims`) `node` reads at `slot`.
    pub(super) fn slice_at(
        &self,
        l: &LayerExec,
        k: u32,
        node: NodeId,
        slot: usize,
        wdims: &[usize],
    ) -> Slice {
        let g = self.exe.graph;
        let Split {
            attribute: a,
            parameter: p,
            ..
        } = l.split;
        let out = l.view_out().pieces(k);
        let inp = l.view_in().pieces(k);
        let op = &g.node(node).op;
        let last = wdims.len().saturating_sub(1);
        match (op, slot, l.kind) {
            (Op::Conv(_), 1 | 2, LayerKind::Conv) => Slice::Axis(0, out[2]),
            // A transposed convolution's weight is [C_in, C_out / groups, …] (a grouped one
            // is never split by its output channels); its bias is per output channel.
            (Op::ConvTranspose(_), 1, LayerKind::Conv) => Slice::Axis(1, out[2]),
            (Op::ConvTranspose(_), 2, LayerKind::Conv) => Slice::Axis(0, out[2]),
            (Op::Gemm(gm), 1, LayerKind::Dense) => match (gm.trans_b, p > 1) {
                (true, true) => Slice::Axis(0, out[2]),
                (false, true) => Slice::Axis(1, out[2]),
                (true, false) => Slice::Axis(1, inp[2]),
                (false, false) => Slice::Axis(0, inp[2]),
            },
            (Op::Gemm(_), 2, LayerKind::Dense) if p > 1 => Slice::Axis(last, out[2]),
            (Op::Gemm(_), 2, LayerKind::Dense) => Slice::FirstSliceOnly,
            (Op::MatMul, 1, LayerKind::Dense) if p > 1 => Slice::Axis(last, out[2]),
            (Op::MatMul, 1, LayerKind::Dense) => Slice::Axis(last.saturating_sub(1), inp[2]),
            (Op::BatchNorm { .. }, 1..=4, _) => Slice::Axis(0, out[2]),
            // Split by its gates: the rows of W and R, and of both biases, that compute the
            // rank's hidden units in every gate.
            (Op::Recurrent(r), 1..=3, LayerKind::Recurrent) if p > 1 => Slice::Groups {
                axis: 1,
                groups: r.cell.gates() as usize * if slot == 3 { 2 } else { 1 },
                piece: out[2],
            },
            // A bias after a row-parallel product: added once, to the first partial sum.
            (Op::Binary(Binary::Add), _, LayerKind::Dense)
                if a > 1 && l.main.is_some_and(|m| after(&l.nodes, m, node)) =>
            {
                Slice::FirstSliceOnly
            }
            // A bias after a column-parallel product (`Add(bias, x·W)` as the TorchScript
            // exporter writes a `Linear` on three axes, the bias first): cut by the output
            // features the rank holds, whatever the layer's output is reshaped to after.
            (Op::Binary(Binary::Add), _, LayerKind::Dense)
                if p > 1 && self.adds_to_product(l, node, wdims) =>
            {
                Slice::Axis(last, out[2])
            }
            _ => {
                // A constant broadcast against the layer's output: cut it where it spans
                // the features (or rows) the rank holds.
                let Some(&o) = l.outputs.first() else {
                    return Slice::Whole;
                };
                let Ok(shape) = self.microbatch_shape(o) else {
                    return Slice::Whole;
                };
                let axes = self.axes(o, shape.len());
                let lead = shape.len().saturating_sub(wdims.len());
                for (axis, piece) in [(axes.features, out[2]), (axes.rows, out[1])] {
                    if let Some(ax) = axis.filter(|&ax| ax >= lead && piece.1 > 1) {
                        if wdims[ax - lead] == shape[ax] && shape[ax] > 1 {
                            return Slice::Axis(ax - lead, piece);
                        }
                    }
                }
                Slice::Whole
            }
        }
    }
}

/// Tensors a convolution, pooling or batch normalization touches, and what elementwise ops
/// carry at the same shape to or from them (a 1-d convolution's `[b, c, l]` through its
/// activation): channels-first.
fn channels_first(exe: &Executable, carried: &impl Fn(ValueId) -> ValueId) -> BTreeSet<ValueId> {
    let g = exe.graph;
    let seeds = g.node_ids().flat_map(|id| {
        let n = g.node(id);
        let convolves = matches!(
            n.op,
            Op::Conv(_)
                | Op::ConvTranspose(_)
                | Op::Pool(_)
                | Op::GlobalPool(_)
                | Op::BatchNorm { .. }
        );
        n.inputs
            .iter()
            .flatten()
            .chain(&n.outputs)
            .copied()
            .filter(move |_| convolves)
            .map(carried)
            .collect::<Vec<_>>()
    });
    same_shape_closure(exe, seeds.collect(), carried)
}

/// Tensors of four or more axes a dense layer's product makes (`[b, h, w, c]` through a
/// `Linear`, as in Swin's blocks), and what elementwise ops carry from them at the same
/// shape: their features are the last axis, not the second as an image's. Products of two
/// activations (attention's scores, `[b, heads, t, t]`) are not dense layers.
fn features_last(
    exe: &Executable,
    carried: &impl Fn(ValueId) -> ValueId,
    channels_first: &BTreeSet<ValueId>,
) -> BTreeSet<ValueId> {
    let g = exe.graph;
    let is_weight = |v: ValueId| exe.weights.trainable.contains(&carried(v));
    let seeds = g
        .node_ids()
        .filter(|&id| {
            let n = g.node(id);
            matches!(n.op, Op::MatMul) && n.inputs.get(1).copied().flatten().is_some_and(is_weight)
        })
        .flat_map(|id| g.node(id).outputs.iter().copied().map(carried))
        .filter(|&v| {
            exe.info
                .ty(v)
                .shape
                .as_sizes()
                .is_some_and(|s| s.len() >= 4)
        })
        .filter(|v| !channels_first.contains(v))
        .collect();
    let mut found = same_shape_closure(exe, seeds, carried);
    found.retain(|v| !channels_first.contains(v));
    found
}

/// `seeds` and every tensor an elementwise op carries at the same shape to or from one
/// of them.
fn same_shape_closure(
    exe: &Executable,
    mut found: BTreeSet<ValueId>,
    carried: &impl Fn(ValueId) -> ValueId,
) -> BTreeSet<ValueId> {
    let g = exe.graph;
    let same_shape = |a: ValueId, b: ValueId| exe.info.ty(a).shape == exe.info.ty(b).shape;
    let mut grew = true;
    while grew {
        grew = false;
        for id in g.node_ids() {
            let n = g.node(id);
            let Some(&out) = n.outputs.first() else {
                continue;
            };
            if n.op.class() != ralpc_ir::OpClass::Elementwise {
                continue;
            }
            let chain: Vec<ValueId> = n
                .inputs
                .iter()
                .flatten()
                .chain(&n.outputs)
                .copied()
                .filter(|&v| same_shape(v, out))
                .map(carried)
                .collect();
            if chain.iter().any(|v| found.contains(v)) {
                for v in chain {
                    grew |= found.insert(v);
                }
            }
        }
    }
    found
}

impl Prepared<'_> {
    /// The edges whose input gradients return `o` of layer `l` to it: every reader's,
    /// but those added to a shared gather's and returned with it.
    pub(super) fn gradient_readers(&self, l: usize, o: ValueId) -> Vec<usize> {
        (0..self.edges.len())
            .filter(|&e| {
                let edge = &self.edges[e];
                edge.producer == l && edge.value == o && edge.gradient_with.is_none()
            })
            .collect()
    }

    /// Whether `node`, an add of a weight of `wdims` in layer `l`, adds it along the
    /// features of the layer's product: it reads the product itself (or what elementwise
    /// ops made of it), whose last axis the weight's last axis spans whole.
    fn adds_to_product(&self, l: &LayerExec, node: NodeId, wdims: &[usize]) -> bool {
        let g = self.exe.graph;
        let Some(product) = l.main.and_then(|m| g.node(m).outputs.first().copied()) else {
            return false;
        };
        let Some(features) = self
            .exe
            .info
            .ty(product)
            .shape
            .as_sizes()
            .and_then(|s| s.last().copied())
        else {
            return false;
        };
        if wdims.last().is_none_or(|&w| w as u64 != features) {
            return false;
        }
        // Back from the add through elementwise ops of the product's shape.
        let same = |v: ValueId| self.exe.info.ty(v).shape == self.exe.info.ty(product).shape;
        let mut stack: Vec<ValueId> = g.node(node).inputs.iter().flatten().copied().collect();
        let mut seen = BTreeSet::new();
        while let Some(v) = stack.pop() {
            if v == product {
                return true;
            }
            if !seen.insert(v) || !same(v) {
                continue;
            }
            let producer = g.value(v).producer;
            if l.nodes.contains(&producer)
                && g.node(producer).op.class() == ralpc_ir::OpClass::Elementwise
            {
                stack.extend(g.node(producer).inputs.iter().flatten().copied());
            }
        }
        false
    }
}

/// Whether `node` runs after `main` among a layer's `nodes`.
pub(super) fn after(nodes: &[NodeId], main: NodeId, node: NodeId) -> bool {
    let at = |n| nodes.iter().position(|&m| m == n);
    matches!((at(main), at(node)), (Some(i), Some(j)) if j > i)
}

/// Whether `op` only moves or converts elements (a reshape, squeeze, identity or cast):
/// it commutes with sums.
fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Flatten { .. }
            | Op::Identity
            | Op::Cast { .. }
    )
}
