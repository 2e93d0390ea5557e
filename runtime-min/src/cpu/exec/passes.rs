//! A rank's forward and backward passes: each layer's inputs assembled from what it
//! holds and what it received, its compute on its share, its input gradients kept for the
//! messages and sums that return them.

use super::failure::bug;
use super::*;

impl Rank<'_, '_> {
    pub(super) fn value_name(&self, v: ValueId) -> &str {
        &self.p.exe.graph.value(v).name
    }

    /// The region of edge `e`'s tensor that consumer rank `rank` needs.
    pub(super) fn need(&self, e: usize, rank: u32) -> Result<Region, RankError> {
        let edge = &self.p.edges[e];
        let c = &self.p.layers[edge.consumer];
        let k = c
            .holds(rank)
            .ok_or_else(|| bug(format!("rank {rank} does not run {}", c.name)))?;
        self.p
            .region(edge.value, &c.view_in_as(edge.read_as), k)
            .map_err(Refusal::bug)
    }

    /// The region of edge `e`'s tensor that producer rank `rank` holds.
    pub(super) fn held(&self, e: usize, rank: u32) -> Result<Region, RankError> {
        let edge = &self.p.edges[e];
        let pl = &self.p.layers[edge.producer];
        let k = pl
            .holds(rank)
            .ok_or_else(|| bug(format!("rank {rank} does not run {}", pl.name)))?;
        self.p
            .region(edge.value, &pl.view_out_as(edge.held_as), k)
            .map_err(Refusal::bug)
    }

    /// The region of an input only a split layer's epilogue reads (a residual added after
    /// the product) that the rank's output meets, where it differs from what the plan
    /// delivers: under an output-feature split, the rank's features of it (a crop); under a
    /// row-parallel split, whose ranks each add their feature slice into a partial sum of
    /// every feature, the whole output (the slice padded with zeros, so that the sum of
    /// the partial sums adds the input once). `None` for inputs used as delivered.
    pub(super) fn epilogue_share(
        &self,
        l: usize,
        k: u32,
        e: usize,
    ) -> Result<Option<Region>, RankError> {
        let need = self.need(e, self.rank)?;
        self.epilogue_crop(l, k, self.p.edges[e].value, need)
    }

    /// As [`Rank::epilogue_share`], for any input `v` the rank reads as `need`.
    pub(super) fn epilogue_crop(
        &self,
        l: usize,
        k: u32,
        v: ValueId,
        need: Region,
    ) -> Result<Option<Region>, RankError> {
        let layer = &self.p.layers[l];
        let g = self.p.exe.graph;
        let split_output =
            matches!(layer.kind, LayerKind::Conv | LayerKind::Dense) && (layer.split.parameter > 1);
        let row_parallel = layer.kind == LayerKind::Dense && layer.split.attribute > 1;
        if !split_output && !row_parallel {
            return Ok(None);
        }
        // Only what the epilogue alone reads: not the product's operands, nor what ops
        // before it read.
        let Some(main) = layer.main else {
            return Ok(None);
        };
        let reads = |n: &NodeId| {
            g.node(*n)
                .inputs
                .iter()
                .flatten()
                .any(|&x| self.p.carrier(x) == v)
        };
        if !layer
            .nodes
            .iter()
            .filter(|n| reads(n))
            .all(|&n| after(&layer.nodes, main, n))
        {
            return Ok(None);
        }
        let out = self
            .p
            .region(v, &layer.view_out(), k)
            .map_err(Refusal::bug)?;
        Ok(Some(if split_output {
            intersect(&need, &out)
        } else {
            out
        }))
    }

    /// Edge `e`'s input as delivered (the rank's need) reframed to `share`
    /// ([`Rank::epilogue_share`]).
    pub(super) fn reframe(
        &self,
        x: &Tensor,
        e: usize,
        share: &Region,
    ) -> Result<Tensor, RankError> {
        let need = self.need(e, self.rank)?;
        let dims = self.p.local_dims(self.p.edges[e].value, share);
        match x.floats() {
            Some(values) => Ok(Tensor::f32(dims, reframe(values, &need, share))),
            None => Ok(crop(x, &need, share).reshaped(dims)),
        }
    }

    /// The input of edge `e` this rank needs, from what it holds and what it received.
    pub(super) fn assemble(&mut self, e: usize, mb: u32) -> Result<Tensor, RankError> {
        self.assemble_from(e, mb, self.p.edges[e].passes_on)
    }

    /// As [`Rank::assemble`]; what the gather brought stays when `keep` (for another
    /// edge sharing it).
    fn assemble_from(&mut self, e: usize, mb: u32, keep: bool) -> Result<Tensor, RankError> {
        let edge = &self.p.edges[e];
        let need = self.need(e, self.rank)?;
        let held = match self.p.layers[edge.producer].holds(self.rank) {
            Some(_) => Some(self.held(e, self.rank)?),
            None => None,
        };
        // What its gather brought, or the gather it shares.
        let gathered = (edge.shares.unwrap_or(e), mb);
        let received = match keep {
            true => self.pieces.get(&gathered).cloned(),
            false => self.pieces.remove(&gathered),
        }
        .unwrap_or_default();
        // This rank computed exactly what it needs: the producer's tensor itself, shared
        // (and left where it is, host or device).
        if let (Some(held), true, Some(run)) = (
            &held,
            received.is_empty(),
            self.runs.get(&(edge.producer, mb)),
        ) {
            let dims = self.p.local_dims(edge.value, &need);
            if let Some(t) = run.values.get(edge.value) {
                if *held == need && t.shape == dims {
                    return Ok(t.clone());
                }
            }
        }
        let own = match (held, self.runs.get(&(edge.producer, mb))) {
            (Some(held), Some(run)) => Some((
                held,
                run.values
                    .get(edge.value)
                    .ok_or_else(|| bug("the producer's output is missing"))?,
            )),
            _ => None,
        };
        // Received whole (device to device, left where it is).
        if let [(region, t)] = &received[..] {
            if *region == need && t.len() == volume(&need) {
                return Ok(t.clone().reshaped(self.p.local_dims(edge.value, &need)));
            }
        }
        let parts: Vec<(Region, &Tensor)> = own
            .into_iter()
            .chain(received.iter().map(|(region, part)| (region.clone(), part)))
            .collect();
        let dims = self.p.local_dims(edge.value, &need);
        // Assembled where the pieces are (on a device, when it can).
        let floats: Option<Vec<floats::Piece<'_>>> = parts
            .iter()
            .map(|(region, t)| match &t.data {
                Data::F32(f) => Some((region.as_slice(), f)),
                Data::I64(_) => None,
            })
            .collect();
        if let Some(floats) = floats.filter(|f| !f.is_empty()) {
            if let Some(f) = self
                .compute
                .paste(&need, &floats)
                .map_err(RankError::from)?
            {
                return Ok(Tensor {
                    shape: dims,
                    data: Data::F32(f),
                });
            }
        }
        let parts = parts.into_iter();
        // Integer tensors (indices, masks, shapes turned into data) have no gradient: they
        // arrive as they were computed.
        let (tensor, missing) = if self.p.exe.info.ty(edge.value).dtype.is_float() {
            let (values, missing) = gather(&need, parts, Tensor::floats);
            (Tensor::f32(dims, values), missing)
        } else {
            let (values, missing) = gather(&need, parts, Tensor::ints);
            (Tensor::i64(dims, values), missing)
        };
        if missing > 0 {
            return Err(bug(format!(
                "{missing} of the {} elements of '{}' that layer {} needs never arrived",
                volume(&need),
                self.value_name(edge.value),
                self.p.layers[edge.consumer].name
            )));
        }
        Ok(tensor)
    }

    /// Layer `l`'s forward on microbatch `mb`; `again` for its recomputation, which reads
    /// the run's kept inputs.
    pub(super) fn forward(&mut self, l: usize, mb: u32, again: bool) -> Result<(), RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        let run = p.recompute[l];
        if again && run.is_none() {
            return Err(bug(format!("layer {} is not recomputed", layer.name)));
        }
        let k = layer.holds(self.rank).ok_or_else(|| {
            bug(format!(
                "rank {} does not run layer {}",
                self.rank, layer.name
            ))
        })?;
        let g = p.exe.graph;
        let mut values = Values::new(g);
        let samples = interval(layer.view_in().pieces(k)[0], p.microbatch);
        for &(v, source) in &layer.inputs {
            let c = p.carrier(v);
            let t = match source {
                Source::Edge(e) => {
                    let whole = self.layer_input(l, e, mb, again)?;
                    let whole = match p.edges[e].halo {
                        true => self.add_halo(l, k, e, mb, whole)?,
                        false => whole,
                    };
                    self.at_read_share(l, k, e, whole)?
                }
                Source::GraphInput => {
                    let full = p
                        .exe
                        .data
                        .inputs
                        .get(&c)
                        .ok_or_else(|| bug("an input has no data"))?;
                    let read_as = edge_kinds(None, layer.kind).1;
                    let need = p
                        .region(c, &layer.view_in_as(read_as), k)
                        .map_err(Refusal::bug)?;
                    let need = match p.reads_halo(l, c) {
                        true => p.with_halo(l, k, c, &need)?,
                        false => need,
                    };
                    let share = self.epilogue_crop(l, k, c, need.clone())?;
                    // The rank's piece of this microbatch's samples of the global
                    // batch, on the input's batch axis (none: every microbatch reads
                    // all of it).
                    let offset = mb as usize * p.microbatch;
                    let samples = p.samples_axis(c);
                    let global: Region = full.shape.iter().map(|&d| 0..d).collect();
                    let shifted: Region = need
                        .iter()
                        .enumerate()
                        .map(|(d, r)| {
                            if Some(d) == samples {
                                r.start + offset..r.end + offset
                            } else {
                                r.clone()
                            }
                        })
                        .collect();
                    let t = crop(full, &global, &shifted);
                    match (share, t.floats()) {
                        (Some(share), Some(values)) => {
                            Tensor::f32(p.local_dims(c, &share), reframe(values, &need, &share))
                        }
                        (Some(share), None) => crop(&t, &need, &share),
                        (None, _) => t,
                    }
                }
                Source::Constant => match self.weights.get(&c) {
                    Some((_, t)) if p.tied.contains(&c) => self.tied_piece(layer, k, c, t)?,
                    Some((_, t)) => t.clone(),
                    None if self.released.contains_key(&c) => {
                        return Err(RankError::Inconsistent(format!(
                            "layer {} reads '{}' before its gather (ZeRO-3 released it)",
                            layer.name,
                            self.value_name(c)
                        )))
                    }
                    None => p.exe.weights.tensors.get(&c).cloned().ok_or_else(|| {
                        bug(format!("constant '{}' is missing", self.value_name(c)))
                    })?,
                },
                Source::Derived => p.derive(c, samples.len() as u64)?,
                Source::Folded => p.folded_at(c, samples.len() as u64).map_err(Refusal::bug)?,
            };
            // A vocabulary piece's ids: its rows, the others its zero row.
            let t = match p.vocabulary_rows(layer, k, v) {
                Some(rows) => {
                    let ids = t
                        .to_i64s()
                        .iter()
                        .map(|&id| match usize::try_from(id) {
                            Ok(i) if rows.contains(&i) => (i - rows.start) as i64,
                            _ => rows.len() as i64,
                        })
                        .collect();
                    Tensor::i64(t.shape.clone(), ids)
                }
                None => t,
            };
            // A head piece's reshape targets and split sizes, then a row piece's.
            let local = layer.local.is_empty() && layer.local_rows.is_empty();
            let t = match (source, local) {
                (Source::Constant | Source::Folded | Source::Derived, false) => {
                    let ints = t.to_i64s();
                    let apply = |shapes: &heads::LocalShapes, ints: &[i64]| {
                        shapes.apply(v, ints).or_else(|| shapes.apply(c, ints))
                    };
                    let heads = apply(&layer.local, &ints);
                    match apply(&layer.local_rows, heads.as_deref().unwrap_or(&ints)).or(heads) {
                        Some(local) => Tensor::i64(t.shape.clone(), local),
                        None => layer.local.pick(v, t, layer.view_in().pieces(k)[2]),
                    }
                }
                _ => t,
            };
            values.set(v, t.clone());
            if c != v {
                values.set(c, t);
            }
        }
        // (A dispatch keeps what its experts read: their backward runs them again.)
        let (records, dispatched) = match self.gates_forward(l, k, &mut values)? {
            Some(records) => (records, false),
            None => match self.experts_forward(l, k, &mut values)? {
                Some(run) => run,
                None => {
                    let records = self.forward_nodes(l, k, &mut values)?;
                    values.release_unread(p.graph_of(l, k), &records, &layer.outputs);
                    (records, false)
                }
            },
        };
        // An input gathered again for the backward pass is not kept whole: its piece stays
        // with its producer.
        for &(v, source) in &layer.inputs {
            if matches!(source, Source::Edge(e) if p.edges[e].regathered) {
                values.take(v);
                values.take(p.carrier(v));
            }
        }
        let mut regions = BTreeMap::new();
        let mut every_row = BTreeMap::new();
        for &o in &layer.outputs {
            let view = p.output_view(l, o);
            let region = p.region(o, &view, k).map_err(Refusal::bug)?;
            // A context-parallel attention core ran every query row of the keys and values
            // it gathered: it keeps its rows (an executor of reference, not a fast kernel;
            // the plan prices the rows alone).
            let computed = match layer.kind {
                LayerKind::Attention => p
                    .region(o, &view.every_context_row(), k)
                    .map_err(Refusal::bug)?,
                _ => region.clone(),
            };
            if computed != region {
                if let Some(whole) = values.take(o) {
                    if whole.shape != p.local_dims(o, &computed) {
                        return Err(bug(format!(
                            "layer {} computed '{}' of shape {:?} where the rows of its \
                             gathered sequence are {computed:?}",
                            layer.name,
                            self.value_name(o),
                            whole.shape
                        )));
                    }
                    let mine = self.cut(&whole, &computed, &region)?;
                    values.set(o, mine.reshaped(p.local_dims(o, &region)));
                    every_row.insert(o, (computed, whole));
                }
            }
            let got = values.get(o).map(|t| t.shape.clone()).unwrap_or_default();
            let want = p.local_dims(o, &region);
            if got != want {
                return Err(bug(format!(
                    "layer {} computed '{}' of shape {got:?} where its share is {want:?}",
                    layer.name,
                    self.value_name(o),
                )));
            }
            regions.insert(o, region);
        }
        self.runs.insert(
            (l, mb),
            LayerRun {
                values,
                records,
                regions,
                every_row,
                dropped: false,
                lent: Vec::new(),
                dispatched,
            },
        );
        if let Some((first, last)) = run.filter(|&(_, last)| last == l && !again) {
            self.drop_run(first, last, mb);
        }
        Ok(())
    }

    /// The gradient of layer `l`'s output `o` (held over `held`) when every consumer on
    /// this rank gave all of it and nothing else adds to it: their gradients summed by the
    /// rank's device where they are (one consumer's shared as it is), in the order the host
    /// would add them, and taken from where they were kept. `None`: some piece came from
    /// another rank or covers part of `held`, and the host assembles them.
    fn whole_gradient(
        &mut self,
        l: usize,
        o: ValueId,
        held: &Region,
        mb: u32,
    ) -> Result<Option<Floats>, RankError> {
        let p = self.p;
        if (l, o) == p.output {
            return Ok(None);
        }
        let readers = p.gradient_readers(l, o);
        let covers =
            |(region, data): &(Region, Floats)| region == held && data.len() == volume(held);
        // Given whole by a consumer on this rank, or received whole from another's.
        let whole = |e: &usize| match (
            self.input_grads.get(&(*e, mb)),
            self.grad_pieces.get(&(*e, mb)).map(Vec::as_slice),
        ) {
            (Some(given), None) => covers(given),
            (None, Some([received])) => covers(received),
            _ => false,
        };
        if readers.is_empty() || !readers.iter().all(whole) {
            return Ok(None);
        }
        // Taken: nothing reads a consumer's input gradient after its producer's backward.
        let mut sum: Option<Floats> = None;
        for e in readers {
            let given = self.input_grads.remove(&(e, mb));
            let received = || self.grad_pieces.remove(&(e, mb))?.pop();
            let Some((_, part)) = given.or_else(received) else {
                continue;
            };
            sum = Some(match sum {
                None => part,
                Some(acc) => self.compute.add(acc, &part).map_err(RankError::from)?,
            });
        }
        Ok(sum)
    }

    /// The gradient of `o` over `held` that `reader` returned as `parts` (each the box it
    /// covers and its elements): assembled on the device where the parts are resident
    /// there and cover it once, else on the host.
    fn assemble_gradient(
        &self,
        o: ValueId,
        reader: &str,
        held: &Region,
        parts: &[(Region, Floats)],
    ) -> Result<Floats, RankError> {
        let boxes: Vec<floats::Piece<'_>> = parts.iter().map(|(r, f)| (r.as_slice(), f)).collect();
        if let Some(assembled) = self.compute.paste(held, &boxes).map_err(RankError::from)? {
            return Ok(assembled);
        }
        let n = volume(held);
        let mut acc = vec![0.0f32; n];
        let mut filled = vec![false; n];
        for (region, data) in parts {
            fill(&mut acc, &mut filled, held, data, region);
        }
        let missing = filled.iter().filter(|f| !**f).count();
        if missing > 0 {
            return Err(bug(format!(
                "{missing} of the {n} gradient elements of '{}' (read by layer {reader}) never \
                 came back",
                self.value_name(o),
            )));
        }
        Ok(acc.into())
    }

    pub(super) fn backward(&mut self, l: usize, mb: u32) -> Result<(), RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        let k = layer.holds(self.rank).ok_or_else(|| {
            bug(format!(
                "rank {} does not run layer {}",
                self.rank, layer.name
            ))
        })?;
        let mut run = self.runs.remove(&(l, mb)).ok_or_else(|| {
            bug({
                format!(
                    "layer {} has no forward pass for microbatch {mb}",
                    layer.name
                )
            })
        })?;
        self.lend_back(&mut run)?;
        if run.dropped {
            return Err(bug(format!(
                "layer {}'s activations of microbatch {mb} were dropped for recomputation \
                 and not recomputed",
                layer.name
            )));
        }
        self.spend_checkpoints(l, mb);
        self.take_regathered(l, k, mb, &mut run)?;
        let mut grads = Grads::default();
        for (&o, held) in &run.regions {
            if let Some(dy) = self.whole_gradient(l, o, held, mb)? {
                grads.accumulate(o, dy);
                continue;
            }
            let readers = p.gradient_readers(l, o);
            if (l, o) == p.output && readers.is_empty() {
                // The loss's gradient alone, where the loss was computed.
                let y = run
                    .values
                    .get(o)
                    .ok_or_else(|| bug("the output is missing"))?;
                let dy = self.output_loss(l, k, mb, y, held)?;
                grads.accumulate(o, dy);
                continue;
            }
            let mut total: Option<Floats> = None;
            for e in readers {
                let mut parts: Vec<(Region, Floats)> = Vec::new();
                parts.extend(self.input_grads.remove(&(e, mb)));
                parts.extend(self.grad_pieces.remove(&(e, mb)).unwrap_or_default());
                let reader = &p.layers[p.edges[e].consumer].name;
                let acc = self.assemble_gradient(o, reader, held, &parts)?;
                total = Some(match total {
                    Some(sum) => self.compute.add(sum, &acc).map_err(RankError::from)?,
                    None => acc,
                });
            }
            if (l, o) == p.output {
                let y = run
                    .values
                    .get(o)
                    .ok_or_else(|| bug("the output is missing"))?;
                let dy = self.output_loss(l, k, mb, y, held)?;
                total = Some(match total {
                    Some(sum) => self.compute.add(sum, &dy).map_err(RankError::from)?,
                    None => dy,
                });
            }
            if let Some(total) = total {
                grads.accumulate(o, total);
            }
        }
        // What a context-parallel attention core computed beyond its rows gets no
        // gradient here: its own rows' come back, the other rows' go to their ranks.
        for (o, (computed, whole)) in std::mem::take(&mut run.every_row) {
            if let (Some(dy), Some(held)) = (grads.take_floats(o), run.regions.get(&o)) {
                grads.set(o, reframe(&dy, held, &computed).into());
            }
            run.values.set(o, whole);
        }
        if !self.gates_backward(l, k, &run.values, &mut grads)? {
            // A dispatched experts layer's experts go back first, then its router.
            if run.dispatched {
                self.experts_backward(l, k, &run.values, &mut grads)?;
            }
            self.backward_nodes(l, k, &run.records, &run.values, &mut grads)?;
        }
        // A weight read through an alias gets its gradient there.
        for &(v, source) in &layer.inputs {
            let c = p.carrier(v);
            if source == Source::Constant && c != v {
                if let Some(g) = grads.take_floats(v) {
                    let sum = match grads.take_floats(c) {
                        Some(acc) => self.compute.add(acc, &g).map_err(RankError::from)?,
                        None => g,
                    };
                    grads.set(c, sum);
                }
            }
        }
        let weight_gradients: WeightGradients = (layer.weights.iter())
            .filter(|&&w| self.trains(layer, w))
            .map(|&w| (w, grads.take_floats(w)))
            .collect();
        // A zero-bubble schedule adds them in a pass of its own. (This backend makes them
        // with the input gradients and keeps them until then: the same numbers, summed
        // in the schedule's order; the plan's buffers price the weight pass's own reads.)
        if self.weight_passes.contains(&l) {
            self.owed_weight_gradients.insert((l, mb), weight_gradients);
        } else {
            self.add_weight_gradients(l, k, weight_gradients)?;
        }
        self.input_gradients(l, k, mb, &mut grads)
    }

    /// Layer `l`'s weight pass on microbatch `mb` ([`Instruction::WeightGradient`]): adds
    /// the weight gradients its backward made.
    pub(super) fn weight_gradient(&mut self, l: usize, mb: u32) -> Result<(), RankError> {
        let layer = &self.p.layers[l];
        let k = layer.holds(self.rank).ok_or_else(|| {
            bug(format!(
                "rank {} does not run layer {}",
                self.rank, layer.name
            ))
        })?;
        let owed = self.owed_weight_gradients.remove(&(l, mb)).ok_or_else(|| {
            bug({
                format!(
                    "layer {}'s weight pass on microbatch {mb} comes before its backward",
                    layer.name
                )
            })
        })?;
        self.add_weight_gradients(l, k, owed)
    }

    /// Adds layer `l`'s weight gradients of one microbatch (rank index `k`) to the sums.
    fn add_weight_gradients(
        &mut self,
        l: usize,
        k: u32,
        weight_gradients: WeightGradients,
    ) -> Result<(), RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        // Replicas of a layer held whole (LayerNorms over a tensor-parallel group) compute
        // the same weight gradients: the first counts them, the others add zeros.
        let counted = first_replica(layer.kind, layer.split, k);
        for (w, gw) in weight_gradients {
            if p.tied.contains(&w) {
                if let Some(gw) = gw {
                    self.add_tied_gradient(layer, k, w, gw, counted)?;
                }
                continue;
            }
            let gw = gw.map(|g| {
                if counted {
                    g
                } else {
                    Floats::from(vec![0.0; g.len()])
                }
            });
            // What a vocabulary piece's zero row gathered (ids it does not hold) is dropped.
            let gw = match self.weights.get(&w) {
                Some((Slice::Vocabulary(_), t)) => gw.map(|mut g| {
                    let width: usize = t.shape[1..].iter().product();
                    let rows = g.make_mut();
                    let n = rows.len();
                    rows[n.saturating_sub(width)..].fill(0.0);
                    g
                }),
                _ => gw,
            };
            if let Some(gw) = gw {
                // A weight several layers share sums their gradients (on the device).
                let sum = match self.grads.remove(&w) {
                    Some(acc) => self.compute.add(acc, &gw).map_err(RankError::from)?,
                    None => gw,
                };
                self.grads.insert(w, sum);
            }
        }
        Ok(())
    }

    /// Layer `l`'s input gradients of microbatch `mb` (rank index `k`), from `grads`, kept
    /// for their sends and sums.
    fn input_gradients(
        &mut self,
        l: usize,
        k: u32,
        mb: u32,
        grads: &mut Grads,
    ) -> Result<(), RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        let mut sums = VecDeque::new();
        for &(v, source) in &layer.inputs {
            let Source::Edge(e) = source else { continue };
            let need = self.need(e, self.rank)?;
            let share = self.epilogue_share(l, k, e)?;
            let halo = match p.edges[e].halo {
                true => Some(p.with_halo(l, k, p.edges[e].value, &need)?),
                false => None,
            };
            let read = halo
                .clone()
                .or_else(|| share.clone())
                .unwrap_or_else(|| need.clone());
            // Where the layer computed it (resident on a device, unless reshaped here).
            let gv = grads
                .take_floats(v)
                .or_else(|| grads.take_floats(p.carrier(v)))
                .unwrap_or_else(|| vec![0.0; volume(&read)].into());
            let gv = match halo {
                Some(ext) => self.split_halo_gradient(e, mb, ext, gv, &need)?,
                None => gv,
            };
            // A cropped input's gradient is zero outside the crop; the input-gradient sum
            // over the parameter slices then assembles the whole.
            let gv = match share {
                Some(share) => reframe(&gv, &share, &need).into(),
                None => gv,
            };
            self.input_grads.insert((e, mb), (need, gv));
            // Summed over the group the plan's lowering names (`input_gradient_sums`):
            // the parameter slices of a product, a context-parallel attention core's group.
            let summed = input_gradient_sums(p.edges[e].read_as, layer.split, 0).is_some();
            if summed && !p.edges[e].scattered {
                sums.push_back(e);
            }
        }
        if !sums.is_empty() {
            self.pending_sums.insert((l, mb), sums);
        }
        Ok(())
    }

    /// Edge `e`'s input `whole` as layer `l`'s rank index `k` reads it: an epilogue input at
    /// its output's share ([`Rank::epilogue_share`]), the rest as it is.
    fn at_read_share(
        &self,
        l: usize,
        k: u32,
        e: usize,
        whole: Tensor,
    ) -> Result<Tensor, RankError> {
        match self.epilogue_share(l, k, e)? {
            Some(share) => self.reframe(&whole, e, &share),
            None => Ok(whole),
        }
    }

    /// Layer `l`'s inputs gathered again for its backward pass on microbatch `mb` (rank
    /// index `k`), put back into its forward's values as the forward read them. The
    /// pieces stay for an earlier edge sharing the gather: its layer runs backward later.
    fn take_regathered(
        &mut self,
        l: usize,
        k: u32,
        mb: u32,
        run: &mut LayerRun,
    ) -> Result<(), RankError> {
        let p = self.p;
        for &(v, source) in &p.layers[l].inputs {
            let Source::Edge(e) = source else { continue };
            if !p.edges[e].regathered {
                continue;
            }
            let whole = self.assemble_from(e, mb, p.edges[e].shares.is_some())?;
            let t = self.at_read_share(l, k, e, whole)?;
            let c = p.carrier(v);
            if c != v {
                run.values.set(c, t.clone());
            }
            run.values.set(v, t);
        }
        Ok(())
    }
}

/// The values of `need` from `parts` (each the region it holds and its tensor), read as
/// `T` by `values`, and how many were in none of them.
fn gather<'t, T: Copy + Default + 't>(
    need: &Region,
    parts: impl Iterator<Item = (Region, &'t Tensor)>,
    values: impl Fn(&'t Tensor) -> Option<&'t [T]>,
) -> (Vec<T>, usize) {
    let n = volume(need);
    let mut out = vec![T::default(); n];
    let mut filled = vec![false; n];
    for (region, part) in parts {
        fill(
            &mut out,
            &mut filled,
            need,
            values(part).unwrap_or_default(),
            &region,
        );
    }
    let missing = filled.iter().filter(|f| !**f).count();
    (out, missing)
}
