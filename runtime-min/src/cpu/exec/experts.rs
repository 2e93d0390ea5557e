//! A mixture of experts' layer run as a dispatch: each token through the `k` experts its
//! router picked, not every expert.
//!
//! The model writes the layer densely (every expert on every token, weighted by zero gates
//! off the top k: `fixtures/train/moe.onnx`, `ralpc_ir::models::gpt`). Its members split in
//! two: those *over experts* (computed from a weight stacked by expert, `[E, …]`: the
//! experts' products, their activation, the gating and the sum over experts) and the
//! router before them. The router runs as written; then, for each expert in order, the
//! members over experts run on the tokens routed to it (`[1, 1, n, h]`, their gates
//! `[1, 1, n, 1]`, the expert's slice of every stacked weight `[1, …]`) and their outputs
//! are added into the tokens' rows (in f64, in the experts' order, as the dense sum adds).
//! That is the dense layer's forward arithmetic without its zero terms (the k picked
//! experts come from the TopK's indices, so a picked expert whose gate is zero still passes
//! its gradient to the router). The backward pass runs each expert's members again and
//! back, then the router's members as usual; its sums are grouped by expert, so they may
//! differ from the dense form's in the last bits.
//!
//! Where the layer does not have that form (other shapes of tokens or gates, gates nonzero
//! off the picked experts, another tensor the experts read whole, tensors resident on a
//! device), it runs densely, as written: every expert's work.

use super::*;

/// What the dispatch of an experts layer reads and writes.
struct Dispatch {
    /// Members over experts, in order.
    over: Vec<NodeId>,
    /// The TopK's indices, `[b, s, k]`.
    indices: ValueId,
    /// The tokens the experts read, `[b, 1, s, h]`.
    tokens: ValueId,
    /// The gates the experts' outputs are weighted by, `[b, E, s, 1]`.
    gates: ValueId,
    /// The weights stacked by expert.
    stacked: Vec<ValueId>,
    /// What else the members over experts read as it is (axes, shapes, scalars).
    constants: Vec<ValueId>,
    /// The sum over experts, `[b, s, h]`.
    output: ValueId,
    /// `E`.
    experts: usize,
}

/// The members of an experts layer of `graph` that are not over experts (the router), in
/// order, and those that are, when the router's outputs let it be dispatched.
fn split_members(graph: &Graph, nodes: &[NodeId], values: &Values) -> (Vec<NodeId>, Vec<NodeId>) {
    let stacked = |v: ValueId| {
        graph.node(graph.value(v).producer).op.is_weight()
            && values.get(v).is_some_and(|t| t.shape.len() == 3)
    };
    let mut made: BTreeSet<ValueId> = BTreeSet::new();
    let (mut before, mut over) = (Vec::new(), Vec::new());
    for &n in nodes {
        let node = graph.node(n);
        if node
            .inputs
            .iter()
            .flatten()
            .any(|&v| made.contains(&v) || stacked(v))
        {
            made.extend(node.outputs.iter().copied());
            over.push(n);
        } else {
            before.push(n);
        }
    }
    (before, over)
}

/// The dispatch of layer `layer` once its router has run (`values` holds its outputs), or
/// `None` where the layer runs densely.
fn dispatch(
    graph: &Graph,
    layer: &LayerExec,
    over: Vec<NodeId>,
    values: &Values,
) -> Option<Dispatch> {
    let in_over: BTreeSet<NodeId> = over.iter().copied().collect();
    let made: BTreeSet<ValueId> = over
        .iter()
        .flat_map(|&n| graph.node(n).outputs.iter().copied())
        .collect();
    let top_k = layer
        .nodes
        .iter()
        .copied()
        .find(|&n| !in_over.contains(&n) && matches!(graph.node(n).op, Op::TopK { .. }))?;
    let indices = *graph.node(top_k).outputs.get(1)?;
    let mut stacked = Vec::new();
    let mut read = Vec::new();
    for &n in &over {
        for &v in graph.node(n).inputs.iter().flatten() {
            if made.contains(&v) || stacked.contains(&v) || read.contains(&v) {
                continue;
            }
            let t = values.get(v)?;
            if graph.node(graph.value(v).producer).op.is_weight() && t.shape.len() == 3 {
                stacked.push(v);
            } else {
                read.push(v);
            }
        }
    }
    let experts = values.get(*stacked.first()?)?.shape[0];
    // Every stacked weight by the same experts, on the host (a device's resident weights
    // run densely there).
    let on_host = |v: ValueId| {
        values
            .get(v)
            .is_some_and(|t| matches!(&t.data, Data::F32(f) if f.on_host()))
    };
    if experts < 2
        || stacked
            .iter()
            .any(|&w| values.get(w).map(|t| t.shape[0]) != Some(experts) || !on_host(w))
    {
        return None;
    }
    let shape = |v: ValueId| values.get(v).map(|t| t.shape.clone());
    let (mut tokens, mut gates, mut constants) = (None, None, Vec::new());
    for v in read {
        let t = values.get(v)?;
        match &t.data {
            // Axes, shapes: the same for every expert.
            Data::I64(_) => {
                constants.push(v);
                continue;
            }
            // A number of the formula (an ε, a scale) too; any other tensor would be read
            // whole by every expert (and its gradient lost): the layer runs densely.
            Data::F32(f) if t.shape.len() < 4 => {
                if f.len() > 1 || !f.on_host() {
                    return None;
                }
                constants.push(v);
                continue;
            }
            Data::F32(f) if !f.on_host() => return None,
            Data::F32(_) => {}
        }
        match t.shape[..] {
            [_, 1, _, _] if tokens.is_none() => tokens = Some(v),
            [_, e, _, 1] if e == experts && gates.is_none() => gates = Some(v),
            _ => return None,
        }
    }
    let (tokens, gates) = (tokens?, gates?);
    let (t, g, i) = (shape(tokens)?, shape(gates)?, shape(indices)?);
    let output = *layer.outputs.iter().find(|v| made.contains(v))?;
    // Every other value over experts stays inside the layer.
    let leaves = layer.outputs.iter().filter(|v| made.contains(v)).count();
    let fits = t.len() == 4
        && g[0] == t[0]
        && g[2] == t[2]
        && i.len() == 3
        && i[0] == t[0]
        && i[1] == t[2]
        && values.get(tokens)?.floats().is_some()
        && values.get(gates)?.floats().is_some();
    if !(fits && leaves == 1) {
        return None;
    }
    // The gates are zero off the experts the TopK picked (else the dense sum has terms
    // the dispatch would drop).
    let picked = values.get(indices)?.to_i64s();
    let k = i[2].max(1);
    let gate = values.get(gates)?.floats()?;
    let s = t[2].max(1);
    for (token, chosen) in picked.chunks(k).enumerate() {
        let (b, p) = (token / s, token % s);
        for e in 0..experts {
            let g = gate.get((b * experts + e) * s + p).copied().unwrap_or(0.0);
            if g != 0.0 && !chosen.contains(&(e as i64)) {
                return None;
            }
        }
    }
    Some(Dispatch {
        over,
        indices,
        tokens,
        gates,
        stacked,
        constants,
        output,
        experts,
    })
}

/// The tokens each expert gets, `(sample, position)` in the tokens' order, from the TopK's
/// indices.
fn routes(d: &Dispatch, values: &Values) -> Result<Vec<Vec<(usize, usize)>>, RankError> {
    let indices = values
        .get(d.indices)
        .ok_or_else(|| bug("the router's choices are missing"))?;
    let (s, k) = (indices.shape[1], indices.shape[2]);
    let mut routes = vec![Vec::new(); d.experts];
    for (at, &e) in indices.to_i64s().iter().enumerate() {
        let e = usize::try_from(e)
            .ok()
            .filter(|&e| e < d.experts)
            .ok_or_else(|| bug(format!("the router chose expert {e} of {}", d.experts)))?;
        let token = at / k.max(1);
        routes[e].push((token / s.max(1), token % s.max(1)));
    }
    Ok(routes)
}

/// Rows `rows` (`(sample, position)`) of a `[b, x, s, w]` tensor at `x = e` (the tokens'
/// `[b, 1, s, h]` at 0, the gates' `[b, E, s, 1]` at the expert): `[1, 1, n, w]`.
fn gather_rows(t: &Tensor, e: usize, rows: &[(usize, usize)]) -> Result<Tensor, RankError> {
    let (x, s, w) = (t.shape[1], t.shape[2], t.shape[3]);
    let data = t
        .floats()
        .ok_or_else(|| bug("a dispatched tensor is not on the host"))?;
    let mut out = Vec::with_capacity(rows.len() * w);
    for &(b, p) in rows {
        let at = ((b * x + e) * s + p) * w;
        out.extend_from_slice(&data[at..at + w]);
    }
    Ok(Tensor::f32(vec![1, 1, rows.len(), w], out))
}

/// Adds `[.., n, w]` rows back into a `[b, x, s, w]` buffer at `x = e`.
fn scatter_rows(
    into: &mut [f32],
    shape: &[usize],
    e: usize,
    rows: &[(usize, usize)],
    from: &[f32],
) {
    let (x, s, w) = (shape[1], shape[2], shape[3]);
    for (&(b, p), row) in rows.iter().zip(from.chunks(w)) {
        let at = ((b * x + e) * s + p) * w;
        for (acc, v) in into[at..at + w].iter_mut().zip(row) {
            *acc += v;
        }
    }
}

/// Expert `e`'s slice of stacked weight `w`, `[1, …]`.
fn slice(t: &Tensor, e: usize) -> Result<Tensor, RankError> {
    let per: usize = t.shape[1..].iter().product();
    let data = t
        .floats()
        .ok_or_else(|| bug("a stacked weight is not on the host"))?;
    let mut shape = t.shape.clone();
    shape[0] = 1;
    Ok(Tensor::f32(shape, data[e * per..(e + 1) * per].to_vec()))
}

impl Rank<'_, '_> {
    /// The values expert `e`'s members read: its tokens, their gates, its weights.
    fn expert_inputs(
        &self,
        graph: &Graph,
        d: &Dispatch,
        e: usize,
        rows: &[(usize, usize)],
        values: &Values,
    ) -> Result<Values, RankError> {
        let get = |v: ValueId| {
            values
                .get(v)
                .ok_or_else(|| bug("a dispatched value is missing"))
        };
        let mut sub = Values::new(graph);
        sub.set(d.tokens, gather_rows(get(d.tokens)?, 0, rows)?);
        sub.set(d.gates, gather_rows(get(d.gates)?, e, rows)?);
        for &w in &d.stacked {
            sub.set(w, slice(get(w)?, e)?);
        }
        for &c in &d.constants {
            sub.set(c, get(c)?.clone());
        }
        Ok(sub)
    }

    /// Runs experts layer `l`'s forward pass, as a dispatch where its form allows (then
    /// `true`: its records are the router's alone, and what it read stays for its
    /// backward), else as written; `None` where it is no experts layer.
    pub(super) fn experts_forward(
        &self,
        l: usize,
        k: u32,
        values: &mut Values,
    ) -> Result<Option<(Vec<Record>, bool)>, RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        if layer.kind != LayerKind::Experts || !self.compute.computes_values() {
            return Ok(None);
        }
        let graph = p.graph_of(l, k);
        let (before, over) = split_members(graph, &layer.nodes, values);
        // The router on the rank's samples (a re-batched Reshape's target), each expert
        // on its tokens.
        let samples = interval(layer.view_out().pieces(k)[0], p.microbatch).len();
        let run = |nodes: &[NodeId], values: &mut Values, samples| {
            let env = Env { samples, ..p.env };
            self.compute
                .forward(graph, nodes, values, env)
                .map_err(RankError::from)
        };
        let mut records = run(&before, values, Some(samples))?;
        let Some(d) = dispatch(graph, layer, over.clone(), values) else {
            records.extend(run(&over, values, Some(samples))?);
            values.release_unread(graph, &records, &layer.outputs);
            return Ok(Some((records, false)));
        };
        let tokens = values
            .get(d.tokens)
            .ok_or_else(|| bug("the experts' tokens are missing"))?;
        let (b, s) = (tokens.shape[0], tokens.shape[2]);
        // Summed in f64 and rounded once, in the experts' order, as the dense sum over
        // experts adds (its zero terms change nothing).
        let mut sum: Option<(usize, Vec<f64>)> = None;
        for (e, rows) in routes(&d, values)?.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let mut sub = self.expert_inputs(graph, &d, e, rows, values)?;
            run(&d.over, &mut sub, None)?;
            let y = sub
                .take(d.output)
                .ok_or_else(|| bug("an expert's output is missing"))?;
            let w = *y.shape.last().unwrap_or(&0);
            if w == 0 || y.shape != [1, rows.len(), w] {
                return Err(bug(format!(
                    "layer {}: an expert's output {:?} is not a row for each of its {} tokens",
                    layer.name,
                    y.shape,
                    rows.len()
                )));
            }
            let (width, acc) = sum.get_or_insert_with(|| (w, vec![0.0; b * s * w]));
            if *width != w {
                return Err(bug(format!(
                    "layer {}: its experts write rows of different widths",
                    layer.name
                )));
            }
            let y = y
                .floats()
                .ok_or_else(|| bug("an expert's output is not on the host"))?;
            for (&(sample, position), row) in rows.iter().zip(y.chunks(w)) {
                let at = (sample * s + position) * w;
                for (a, v) in acc[at..at + w].iter_mut().zip(row) {
                    *a += f64::from(*v);
                }
            }
        }
        let (w, acc) = sum.ok_or_else(|| bug("no token was routed to any expert"))?;
        let acc = acc.into_iter().map(|v| v as f32).collect();
        values.set(d.output, Tensor::f32(vec![b, s, w], acc));
        Ok(Some((records, true)))
    }

    /// Experts layer `l`'s backward pass over its experts, when its forward pass was a
    /// dispatch: the gradients of the tokens, the gates and the stacked weights added to
    /// `grads` (the router's members then go back as usual).
    pub(super) fn experts_backward(
        &self,
        l: usize,
        k: u32,
        values: &Values,
        grads: &mut Grads,
    ) -> Result<(), RankError> {
        let p = self.p;
        let layer = &p.layers[l];
        let graph = p.graph_of(l, k);
        let (_, over) = split_members(graph, &layer.nodes, values);
        let d = dispatch(graph, layer, over, values).ok_or_else(|| {
            bug(format!(
                "layer {}: its dispatch no longer holds for its backward pass",
                layer.name
            ))
        })?;
        let Some(dy) = grads.take(d.output) else {
            return Ok(());
        };
        let env = Env {
            samples: None,
            ..p.env
        };
        let shape_of = |v: ValueId| -> Result<Vec<usize>, RankError> {
            Ok(values
                .get(v)
                .ok_or_else(|| bug("a dispatched value is missing"))?
                .shape
                .clone())
        };
        let (tokens_shape, gates_shape) = (shape_of(d.tokens)?, shape_of(d.gates)?);
        let (b, s) = (tokens_shape[0], tokens_shape[2]);
        let width = dy.len() / (b * s).max(1);
        let mut d_tokens = vec![0.0f32; tokens_shape.iter().product()];
        let mut d_gates = vec![0.0f32; gates_shape.iter().product()];
        let mut d_stacked: Vec<Vec<f32>> = d
            .stacked
            .iter()
            .map(|&w| shape_of(w).map(|s| vec![0.0; s.iter().product()]))
            .collect::<Result<_, _>>()?;
        for (e, rows) in routes(&d, values)?.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let mut sub = self.expert_inputs(graph, &d, e, rows, values)?;
            let records = self
                .compute
                .forward(graph, &d.over, &mut sub, env)
                .map_err(RankError::from)?;
            let mut dy_rows = Vec::with_capacity(rows.len() * width);
            for &(sample, position) in rows {
                let at = (sample * s + position) * width;
                dy_rows.extend_from_slice(&dy[at..at + width]);
            }
            let mut sub_grads = Grads::default();
            sub_grads.add(d.output, &dy_rows);
            self.compute
                .backward(graph, &records, &sub, &mut sub_grads)
                .map_err(RankError::from)?;
            if let Some(g) = sub_grads.take(d.tokens) {
                scatter_rows(&mut d_tokens, &tokens_shape, 0, rows, &g);
            }
            if let Some(g) = sub_grads.take(d.gates) {
                scatter_rows(&mut d_gates, &gates_shape, e, rows, &g);
            }
            for (&w, acc) in d.stacked.iter().zip(&mut d_stacked) {
                if let Some(g) = sub_grads.take(w) {
                    let per = g.len();
                    for (a, v) in acc[e * per..(e + 1) * per].iter_mut().zip(&g) {
                        *a += v;
                    }
                }
            }
        }
        grads.add(d.tokens, &d_tokens);
        grads.add(d.gates, &d_gates);
        for (&w, g) in d.stacked.iter().zip(&d_stacked) {
            grads.add(w, g);
        }
        Ok(())
    }
}
