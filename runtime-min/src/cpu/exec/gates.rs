//! A recurrent layer split by its gates: each rank of a parameter group computes its
//! hidden units of every gate, and the group exchanges the state every time step. The
//! exchanges are collectives inside the layer's forward and backward passes, so the layer
//! runs here, on the host kernels of [`recurrent`], rather than through [`Compute`].

use ralpc_ir::Recurrent;

use super::super::ops::OpError;
use super::super::recurrent::{self, Exchange};
use super::*;

impl Prepared<'_> {
    /// Layer `l`'s recurrent op, when the plan splits the layer by its gates.
    pub(super) fn gate_split<'g>(&'g self, l: &LayerExec) -> Option<(NodeId, &'g Recurrent)> {
        if l.kind != LayerKind::Recurrent || l.split.parameter <= 1 {
            return None;
        }
        let &[node] = &l.nodes[..] else {
            return None;
        };
        match &self.exe.graph.node(node).op {
            Op::Recurrent(r) => Some((node, r)),
            _ => None,
        }
    }
}

/// The ranks of one parameter group of a layer split by its gates.
struct Group<'c> {
    comm: &'c Comm,
    ranks: Vec<u32>,
    piece: (usize, usize),
    /// The exchange that failed, kept typed: the kernel passes on only its message.
    failed: Option<CommError>,
}

impl Exchange for Group<'_> {
    fn piece(&self) -> (usize, usize) {
        self.piece
    }

    /// An all-reduce of the rank's piece placed among zeros.
    fn gather(&mut self, piece: &[f32], rows: usize, hidden: usize) -> Result<Vec<f32>, OpError> {
        let units = interval((self.piece.0 as u32, self.piece.1 as u32), hidden);
        let width = units.len();
        let mut whole = vec![0.0; rows * hidden];
        for (b, row) in piece.chunks(width.max(1)).take(rows).enumerate() {
            whole[b * hidden + units.start..b * hidden + units.end].copy_from_slice(row);
        }
        self.sum(&mut whole)?;
        Ok(whole)
    }

    fn sum(&mut self, partial: &mut [f32]) -> Result<(), OpError> {
        self.comm.all_reduce(&self.ranks, partial).map_err(|e| {
            let message = e.to_string();
            self.failed = Some(e);
            OpError::Exchange(message)
        })
    }
}

impl Rank<'_, '_> {
    /// The parameter group of rank index `k` of layer `l`: the ranks holding the other
    /// hidden units of the same samples.
    fn gate_group(&self, l: usize, k: u32) -> Group<'_> {
        let layer = &self.p.layers[l];
        let p = layer.split.parameter.max(1);
        let base = layer.first + k - k % p;
        Group {
            comm: &self.comm,
            ranks: (base..base + p).collect(),
            piece: ((k % p) as usize, p as usize),
            failed: None,
        }
    }

    /// Layer `l`'s forward pass on rank index `k` when it is split by its gates.
    pub(super) fn gates_forward(
        &self,
        l: usize,
        k: u32,
        values: &mut Values,
    ) -> Result<Option<Vec<Record>>, RankError> {
        let Some((node, r)) = self.p.gate_split(&self.p.layers[l]) else {
            return Ok(None);
        };
        let n = self.p.exe.graph.node(node);
        let inputs = values.inputs_of(n);
        let mut group = self.gate_group(l, k);
        let outputs =
            recurrent::forward_shared(r, &inputs, n.outputs.len(), &mut group).map_err(|e| {
                kernel_failure(
                    group.failed.map(RankError::from),
                    self.p.exe.graph,
                    node,
                    e.to_string(),
                )
            })?;
        for (&v, t) in n.outputs.iter().zip(outputs) {
            values.set(v, t);
        }
        Ok(Some(Vec::new()))
    }

    /// Layer `l`'s backward pass on rank index `k` when it is split by its gates: its
    /// input gradients are this rank's parts, which the plan's input-gradient sums add up.
    pub(super) fn gates_backward(
        &self,
        l: usize,
        k: u32,
        values: &Values,
        grads: &mut Grads,
    ) -> Result<bool, RankError> {
        let Some((node, r)) = self.p.gate_split(&self.p.layers[l]) else {
            return Ok(false);
        };
        let n = self.p.exe.graph.node(node);
        let inputs = values.inputs_of(n);
        let dys: Vec<Option<&[f32]>> = n.outputs.iter().map(|&v| grads.get(v)).collect();
        // Every rank of the group runs the exchanges, whatever gradients reached it.
        let mut group = self.gate_group(l, k);
        let input_grads =
            recurrent::backward_shared(r, &inputs, &dys, &mut group).map_err(|e| {
                kernel_failure(
                    group.failed.map(RankError::from),
                    self.p.exe.graph,
                    node,
                    e.to_string(),
                )
            })?;
        for (slot, g) in input_grads.into_iter().enumerate() {
            if let (Some(g), Some(Some(v))) = (g, n.inputs.get(slot)) {
                grads.add(*v, &g);
            }
        }
        Ok(true)
    }
}
