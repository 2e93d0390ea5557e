//! A rank's messages and collectives: what each carries, cut from and pasted into the
//! rank's tensors; and the optimizer step that follows the gradient all-reduces.

use super::failure::bug;
use super::*;

impl Rank<'_, '_> {
    pub(super) fn send(
        &mut self,
        to: u32,
        tag: u64,
        e: usize,
        mb: u32,
        backward: bool,
    ) -> Result<(), RankError> {
        let edge = &self.p.edges[e];
        let data = if backward {
            // From a consumer rank back to the producer rank.
            let (need, data) = self.input_grads.get(&(e, mb)).ok_or_else(|| {
                bug(format!(
                    "no gradient of '{}' to send",
                    self.value_name(edge.value)
                ))
            })?;
            let piece = intersect(need, &self.held(e, to)?);
            let whole = Tensor {
                shape: dims(need),
                data: Data::F32(data.clone()),
            };
            self.cut(&whole, need, &piece)?
        } else {
            let held = self.held(e, self.rank)?;
            let piece = intersect(&self.need(e, to)?, &held);
            let run = self.runs.get(&(edge.producer, mb)).ok_or_else(|| {
                bug({
                    format!(
                        "'{}' was not computed before its send",
                        self.value_name(edge.value)
                    )
                })
            })?;
            let x = run
                .values
                .get(edge.value)
                .ok_or_else(|| bug("the output is missing"))?;
            self.cut(x, &held, &piece)?
        };
        let words = match &data.data {
            // Device to device where the rank's device has a path to `to`.
            Data::F32(v) if self.compute.send(to, tag, v).map_err(RankError::from)? => {
                return Ok(())
            }
            Data::F32(v) => v.to_vec(),
            Data::I64(v) => ints_to_words(v),
        };
        self.comm.send(to, tag, words).map_err(RankError::from)
    }

    /// The box `piece` of `x` (holding `holder`), cut on the device where a float
    /// tensor's elements are resident (the rest of it stays there), else on the host.
    pub(super) fn cut(
        &self,
        x: &Tensor,
        holder: &Region,
        piece: &Region,
    ) -> Result<Tensor, RankError> {
        if let (Data::F32(f), false) = (&x.data, holder == piece) {
            if let Some(f) = self
                .compute
                .crop(f, holder, piece)
                .map_err(RankError::from)?
            {
                return Ok(Tensor {
                    shape: dims(piece),
                    data: Data::F32(f),
                });
            }
        }
        Ok(crop(x, holder, piece))
    }

    pub(super) fn recv(
        &mut self,
        from: u32,
        tag: u64,
        e: usize,
        mb: u32,
        backward: bool,
    ) -> Result<(), RankError> {
        let piece = self.incoming_piece(from, tag)?;
        let ints = !backward && !self.p.exe.info.ty(self.p.edges[e].value).dtype.is_float();
        // Sent device to device (as [`Rank::send`] decides alike on both sides).
        let on_device = match ints {
            true => None,
            false => self.device_recv(from, tag, volume(&piece))?,
        };
        if let Some(data) = on_device {
            self.keep_piece(e, mb, backward, piece, data);
            return Ok(());
        }
        let data = self.comm.recv(from, tag).map_err(RankError::from)?;
        if ints {
            let values = words_to_ints(&data)
                .filter(|v| v.len() == volume(&piece))
                .ok_or_else(|| {
                    bug({
                        format!(
                            "the message from rank {from} has {} words where {} integers were \
                         expected",
                            data.len(),
                            volume(&piece)
                        )
                    })
                })?;
            self.pieces
                .entry((e, mb))
                .or_default()
                .push((piece.clone(), Tensor::i64(dims(&piece), values)));
            return Ok(());
        }
        if data.len() != volume(&piece) {
            return Err(bug(format!(
                "the message from rank {from} has {} elements where {} were expected",
                data.len(),
                volume(&piece)
            )));
        }
        self.keep_piece(e, mb, backward, piece, data.into());
        Ok(())
    }

    /// Keeps a received piece of edge `e`'s tensor (or, `backward`, of its gradient) on
    /// microbatch `mb` for the layer that reads it.
    fn keep_piece(&mut self, e: usize, mb: u32, backward: bool, piece: Region, data: Floats) {
        if backward {
            self.grad_pieces
                .entry((e, mb))
                .or_default()
                .push((piece, data));
        } else {
            let tensor = Tensor {
                shape: dims(&piece),
                data: Data::F32(data),
            };
            self.pieces
                .entry((e, mb))
                .or_default()
                .push((piece, tensor));
        }
    }

    /// The buffers instruction `index` touches; a recomputation's are its forward's
    /// again (its collectives reduce and gather the same tensors).
    pub(super) fn touched(&self, index: u32) -> Vec<Touch> {
        let mut touches = self.touches.get(&index).cloned().unwrap_or_default();
        for t in &mut touches {
            if t.0 == BufferKind::Recomputed {
                t.0 = BufferKind::Activation;
            }
        }
        touches
    }

    /// Whether instruction `index` writes a buffer of `kind`.
    pub(super) fn writes(&self, index: u32, kind: BufferKind) -> bool {
        self.touches
            .get(&index)
            .is_some_and(|t| t.iter().any(|&(k, _, _, w)| k == kind && w))
    }

    pub(super) fn all_reduce(&mut self, index: u32, group: Vec<u32>) -> Result<(), RankError> {
        let touched = self.touched(index);
        let reads = |kind: BufferKind| {
            touched
                .iter()
                .filter(|(k, _, _, w)| *k == kind && !w)
                .filter_map(|&(_, l, mb, _)| Some((l? as usize, mb)))
                .collect::<Vec<_>>()
        };
        if !reads(BufferKind::Gradients).is_empty() {
            // A gradient bucket: this rank's gradients of those layers, in layer order.
            let keys = self.bucket_weights(index, BufferKind::Gradients);
            if keys.iter().any(|w| self.gradient_shares.contains_key(w)) {
                return self.all_reduce_gradient_shares(&keys, &group);
            }
            if self.device_all_reduce(&keys, &group)? {
                return Ok(());
            }
            let mut flat = self.flat_gradients(&keys);
            self.comm
                .all_reduce(&group, &mut flat)
                .map_err(RankError::from)?;
            let mut at = 0;
            for &w in &keys {
                if let Some(g) = self.grads.get_mut(&w) {
                    let n = g.len();
                    g.make_mut().copy_from_slice(&flat[at..at + n]);
                    at += n;
                }
            }
            return Ok(());
        }
        if let Some(&(l, Some(mb))) = reads(BufferKind::Activation).first() {
            // A row-parallel layer's partial sums.
            let run = self
                .runs
                .get_mut(&(l, mb))
                .ok_or_else(|| bug("partial sums of a layer that did not run"))?;
            let outputs: Vec<ValueId> = run.regions.keys().copied().collect();
            for o in outputs {
                let Some(Tensor {
                    shape,
                    data: Data::F32(mut x),
                }) = run.values.take(o)
                else {
                    return Err(bug("partial sums of a missing or integer output"));
                };
                sum_over(&*self.compute, &self.comm, &group, &mut x)?;
                run.values.set(
                    o,
                    Tensor {
                        shape,
                        data: Data::F32(x),
                    },
                );
            }
            return Ok(());
        }
        if let Some(&(l, Some(mb))) = reads(BufferKind::InputGradient).first() {
            let e = self
                .pending_sums
                .get_mut(&(l, mb))
                .and_then(VecDeque::pop_front)
                .ok_or_else(|| bug("an input-gradient sum the layer does not need"))?;
            let (_, data) = self
                .input_grads
                .get_mut(&(e, mb))
                .ok_or_else(|| bug("no input gradient to sum"))?;
            return sum_over(&*self.compute, &self.comm, &group, data);
        }
        Err(bug("an all-reduce whose buffers name nothing to reduce"))
    }

    /// Sums the gradients of `keys` over `group` with the device's own collective, if it
    /// has one over that group (zeros for a weight this rank has no gradient of yet).
    fn device_all_reduce(&mut self, keys: &[ValueId], group: &[u32]) -> Result<bool, RankError> {
        let mut bucket = Vec::with_capacity(keys.len());
        for w in keys {
            let n = self.weights.get(w).map_or(0, |(_, t)| t.len());
            bucket.push(match self.grads.remove(w) {
                Some(g) => g,
                // Made on the device: a batch norm's running statistics never get one.
                None => self.compute.zeros(n).map_err(RankError::from)?,
            });
        }
        let summed = self.compute.all_reduce(group, &mut bucket);
        for (&w, g) in keys.iter().zip(bucket) {
            self.grads.insert(w, g);
        }
        Ok(summed?)
    }

    /// Sums a tied weight's gradient over every rank holding it: each keeps it whole and
    /// has added the uses it runs, each at its place.
    pub(super) fn tied_all_reduce(&mut self, name: &str, group: Vec<u32>) -> Result<(), RankError> {
        let g = self.p.exe.graph;
        let found = self
            .weights
            .iter()
            .find(|(w, _)| g.value(**w).name == name)
            .map(|(&w, (_, t))| (w, t.len()));
        let Some((w, n)) = found else {
            return Err(bug(format!(
                "this rank does not hold the tied weight '{name}'"
            )));
        };
        let gradient = match self.grads.remove(&w) {
            Some(g) => g,
            None => self.compute.zeros(n)?,
        };
        // Its holders keep different rows: each sums its rows at their place in the whole.
        let (mut whole, piece) = self.tied_gradient_in_whole(w, gradient)?;
        sum_over(&*self.compute, &self.comm, &group, &mut whole)?;
        let own = match piece {
            Some(piece) => self.tied_rows_of(&whole, &piece)?,
            None => whole,
        };
        self.grads.insert(w, own);
        Ok(())
    }

    /// All-gather, reduce-scatter and all-to-all: every member contributes its share and
    /// takes what it needs (the CPU backend moves whole shares; the result is the same).
    pub(super) fn reshard_forward_or_back(
        &mut self,
        index: u32,
        group: Vec<u32>,
    ) -> Result<(), RankError> {
        let touched = self.touched(index);
        let find = |kind: BufferKind, writes: bool| {
            touched
                .iter()
                .find(|(k, _, _, w)| *k == kind && *w == writes)
                .and_then(|&(_, l, mb, _)| Some((l? as usize, mb?)))
        };
        let mut members = group.clone();
        members.sort_unstable();
        // In place on the model's output, split by classes: the loss statistics.
        if let Some((l, mb)) = find(BufferKind::Activation, true)
            .filter(|&(l, _)| l == self.p.output.0)
            .filter(|&at| find(BufferKind::Activation, false) == Some(at))
        {
            return self.exchange_loss_statistics(l, mb, &members);
        }
        if let (Some((producer, mb)), Some((consumer, _))) = (
            find(BufferKind::Activation, false),
            find(BufferKind::Received, true),
        ) {
            let e = self.edge_between(producer, consumer)?;
            let mine = self
                .runs
                .get(&(producer, mb))
                .ok_or_else(|| bug("resharding a tensor not computed"))?
                .values
                .get(self.p.edges[e].value)
                .and_then(|t| match &t.data {
                    Data::F32(f) => Some(f.clone()),
                    Data::I64(_) => None,
                })
                .ok_or_else(|| bug("the output is missing"))?;
            let all = self.gather_over(&members, mine)?;
            for (&member, data) in members.iter().zip(all) {
                if member == self.rank {
                    continue;
                }
                let region = self.held(e, member)?;
                let tensor = Tensor {
                    shape: dims(&region),
                    data: Data::F32(data),
                };
                self.pieces
                    .entry((e, mb))
                    .or_default()
                    .push((region, tensor));
            }
            return Ok(());
        }
        if let (Some((consumer, mb)), Some((producer, _))) = (
            find(BufferKind::InputGradient, false),
            find(BufferKind::Received, true),
        ) {
            let e = self.edge_between(producer, consumer)?;
            // A collective shared by several readers returns their input gradients summed.
            let e = self.p.edges[e].gradient_with.unwrap_or(e);
            let (need, mut data) = self
                .input_grads
                .get(&(e, mb))
                .cloned()
                .ok_or_else(|| bug("no input gradient to reshard"))?;
            let sharers: Vec<usize> = (0..self.p.edges.len())
                .filter(|&s| self.p.edges[s].gradient_with == Some(e))
                .collect();
            for s in sharers {
                let (region, part) = self.input_grads.remove(&(s, mb)).ok_or_else(|| {
                    bug({
                        format!(
                        "layer {}'s input gradient, summed into a shared collective's, is missing",
                        self.p.layers[self.p.edges[s].consumer].name
                    )
                    })
                })?;
                if region != need {
                    return Err(RankError::Inconsistent(format!(
                        "layer {}'s input gradient covers {region:?}, the shared collective's {need:?}",
                        self.p.layers[self.p.edges[s].consumer].name
                    )));
                }
                data = self.compute.add(data, &part).map_err(RankError::from)?;
                // What this rank keeps of it (an all-gather's own piece) is the sum too.
                self.input_grads
                    .insert((e, mb), (need.clone(), data.clone()));
            }
            let all = self.gather_over(&members, data)?;
            let held = self.held(e, self.rank)?;
            let reduce = matches!(
                self.p.exe.plan.programs[self.rank as usize][index as usize],
                Instruction::ReduceScatter { .. }
            );
            if reduce {
                // Partial sums over the group: add every member's, keep this rank's share.
                let mut parts = all.into_iter();
                let first = parts
                    .next()
                    .ok_or_else(|| bug("a reduce-scatter over no ranks"))?;
                let sum = parts.try_fold(first, |sum, part| {
                    self.compute.add(sum, &part).map_err(RankError::from)
                })?;
                let piece = intersect(&need, &held);
                let whole = Tensor {
                    shape: dims(&need),
                    data: Data::F32(sum),
                };
                let Data::F32(part) = self.cut(&whole, &need, &piece)?.data else {
                    return Err(bug("a gradient cut into integers"));
                };
                self.input_grads.remove(&(e, mb));
                self.grad_pieces
                    .entry((e, mb))
                    .or_default()
                    .push((piece, part));
            } else {
                for (&member, part) in members.iter().zip(all) {
                    if member == self.rank {
                        continue;
                    }
                    let region = self.need(e, member)?;
                    self.grad_pieces
                        .entry((e, mb))
                        .or_default()
                        .push((region, part));
                }
            }
            return Ok(());
        }
        Err(bug("a resharding collective whose buffers name no tensor"))
    }

    /// Every member's `data`, in the order of `members` (sorted): gathered device to
    /// device where the device has a collective over them, else through the communicator.
    pub(super) fn gather_over(
        &self,
        members: &[u32],
        data: Floats,
    ) -> Result<Vec<Floats>, RankError> {
        if let Some(all) = self
            .compute
            .all_gather(members, &data)
            .map_err(RankError::from)?
        {
            return Ok(all);
        }
        let all = self
            .comm
            .exchange(members, data.into_vec())
            .map_err(RankError::from)?;
        Ok(all.into_iter().map(Floats::from).collect())
    }

    pub(super) fn edge_between(
        &self,
        producer: usize,
        consumer: usize,
    ) -> Result<usize, RankError> {
        let found: Vec<usize> = (0..self.p.edges.len())
            .filter(|&e| {
                self.p.edges[e].producer == producer && self.p.edges[e].consumer == consumer
            })
            .collect();
        match found.as_slice() {
            [e] => Ok(*e),
            [] => Err(bug(format!(
                "no edge from layer {producer} to layer {consumer}"
            ))),
            _ => Err(bug(format!(
                "several tensors flow from layer {producer} to layer {consumer}"
            ))),
        }
    }

    /// Updates the weights `which` selects (the tied ones follow their own all-reduce).
    pub(super) fn optimizer_step(
        &mut self,
        which: impl Fn(ValueId) -> bool,
    ) -> Result<(), RankError> {
        let ready: Vec<ValueId> = self.grads.keys().copied().filter(|&w| which(w)).collect();
        if self.step == 0 && self.options.report_tensors {
            for w in &ready {
                if let (Some((slice, _)), Some(g)) = (self.weights.get(w), self.grads.get(w)) {
                    self.report.gradients.push((*w, slice.clone(), g.to_vec()));
                }
            }
        }
        for w in ready {
            let Some(g) = self.grads.remove(&w) else {
                continue;
            };
            let Some((
                _,
                Tensor {
                    data: Data::F32(x), ..
                },
            )) = self.weights.get_mut(&w)
            else {
                continue;
            };
            let v = self
                .velocity
                .entry(w)
                .or_insert_with(|| vec![0.0; g.len()].into());
            if x.len() != g.len() || v.len() != g.len() {
                return Err(RankError::Inconsistent(format!(
                    "the step of '{}': a weight of {} elements, its gradient of {}, its \
                     momentum of {}",
                    self.p.exe.graph.value(w).name,
                    x.len(),
                    g.len(),
                    v.len()
                )));
            }
            self.compute
                .sgd_momentum(x, v, &g, self.options.lr, self.options.momentum)?;
        }
        Ok(())
    }
}

/// Sums `data` over `group` in place: on the device, where it has a collective over the
/// group (the elements stay there), else through the communicator.
fn sum_over(
    compute: &dyn Compute,
    comm: &Comm,
    group: &[u32],
    data: &mut Floats,
) -> Result<(), RankError> {
    let mut one = [std::mem::take(data)];
    let on_device = compute.all_reduce(group, &mut one);
    let [summed] = one;
    *data = summed;
    if on_device.map_err(RankError::from)? {
        return Ok(());
    }
    comm.all_reduce(group, data.make_mut())
        .map_err(RankError::from)
}
