//! RNN, GRU and LSTM (ONNX semantics, default activations): the forward time loop, and
//! backpropagation through time, which replays the forward loop to keep every step's
//! gates.
//!
//! Inputs: `X, W, R, B, sequence_lens, initial_h` (and `initial_c` for an LSTM); outputs
//! `Y, Y_h` (and `Y_c`). Gates are stacked in W, R and B in ONNX's order: LSTM `i, o, f,
//! c`; GRU `z, r, h`. With `sequence_lens`, sample `b` runs its first `len_b` steps
//! (backwards from `len_b − 1` in reverse), `Y` is zero past them and `Y_h` is the state
//! after its last step.
//!
//! A layer split by its gates runs on several ranks ([`Exchange`]): each holds the rows of
//! W, R and B that compute its piece of the hidden units in every gate, and writes that
//! piece of `Y`, `Y_h` and `Y_c`. Every step's recurrent product reads the whole state,
//! so the ranks gather it each step; backward, the state's gradient is a sum over the
//! ranks each step. Alone ([`Alone`]) the piece is everything and nothing is exchanged.

use ralpc_ir::{Cell, Direction, Recurrent};

use super::kernels::gemm;
use super::ops::{input, operands, optional, R};
use super::tensor::Tensor;

/// How the ranks of a gate split share the layer's state each step.
pub(crate) trait Exchange {
    /// This rank's piece of the hidden units: `(index, count)`, piece `index` holding
    /// units `index·hidden/count .. (index+1)·hidden/count`.
    fn piece(&self) -> (usize, usize);
    /// The whole `[rows, hidden]` from every rank's `[rows, its units]` piece.
    fn gather(&mut self, piece: &[f32], rows: usize, hidden: usize) -> R<Vec<f32>>;
    /// `partial` summed over the ranks, in place.
    fn sum(&mut self, partial: &mut [f32]) -> R<()>;
}

/// One rank holding the whole layer.
pub(crate) struct Alone;

impl Exchange for Alone {
    fn piece(&self) -> (usize, usize) {
        (0, 1)
    }

    fn gather(&mut self, piece: &[f32], _rows: usize, _hidden: usize) -> R<Vec<f32>> {
        Ok(piece.to_vec())
    }

    fn sum(&mut self, _partial: &mut [f32]) -> R<()> {
        Ok(())
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Sizes and index arithmetic of one layer on one set of inputs.
struct Shape {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    /// The hidden units this rank computes: `[lo, lo + local)`.
    lo: usize,
    local: usize,
    dirs: usize,
    /// `gates · local`.
    width: usize,
    batch_major: bool,
}

impl Shape {
    fn of(
        r: &Recurrent,
        x: &Tensor,
        w: &Tensor,
        rec: &Tensor,
        (index, count): (usize, usize),
    ) -> R<Shape> {
        let &[a, b, input] = x.shape.as_slice() else {
            return Err(operands(format!("X has shape {:?}, not rank 3", x.shape)));
        };
        let (seq, batch) = if r.batch_major { (b, a) } else { (a, b) };
        let (hidden, dirs) = (r.hidden as usize, r.direction.count() as usize);
        if index >= count {
            return Err(operands(format!("no piece {index} of {count}")));
        }
        // Piece `index` of `count` as the executor cuts every axis (`region::interval`).
        let lo = index * hidden / count;
        let local = (index + 1) * hidden / count - lo;
        if local == 0 {
            return Err(operands(format!(
                "hidden size {hidden} cannot be cut into {count} pieces: piece {index} holds \
                 no units"
            )));
        }
        let width = r.cell.gates() as usize * local;
        if w.shape != [dirs, width, input] || rec.shape != [dirs, width, hidden] {
            return Err(operands(format!(
                "W {:?} and R {:?} do not fit X {:?} with hidden size {hidden} in {count} \
                 piece(s)",
                w.shape, rec.shape, x.shape
            )));
        }
        Ok(Shape {
            seq,
            batch,
            input,
            hidden,
            lo,
            local,
            dirs,
            width,
            batch_major: r.batch_major,
        })
    }

    /// Offset of X's row for time `t`, sample `b`.
    fn x(&self, t: usize, b: usize) -> usize {
        let row = if self.batch_major {
            b * self.seq + t
        } else {
            t * self.batch + b
        };
        row * self.input
    }

    /// Offset of Y's row (this rank's piece) for time `t`, direction `d`, sample `b`.
    fn y(&self, t: usize, d: usize, b: usize) -> usize {
        let row = if self.batch_major {
            (b * self.seq + t) * self.dirs + d
        } else {
            (t * self.dirs + d) * self.batch + b
        };
        row * self.local
    }

    /// Offset of a state's row of `width` units (`initial_h` whole, `Y_h` this rank's
    /// piece) for direction `d`, sample `b`.
    fn state(&self, d: usize, b: usize, width: usize) -> usize {
        let row = if self.batch_major {
            b * self.dirs + d
        } else {
            d * self.batch + b
        };
        row * width
    }

    fn y_shape(&self) -> Vec<usize> {
        if self.batch_major {
            vec![self.batch, self.seq, self.dirs, self.local]
        } else {
            vec![self.seq, self.dirs, self.batch, self.local]
        }
    }

    fn state_shape(&self) -> Vec<usize> {
        if self.batch_major {
            vec![self.batch, self.dirs, self.local]
        } else {
            vec![self.dirs, self.batch, self.local]
        }
    }

    /// This rank's piece of a whole `[batch, hidden]` state.
    fn own(&self, whole: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.batch * self.local);
        for b in 0..self.batch {
            let at = b * self.hidden + self.lo;
            out.extend_from_slice(&whole[at..at + self.local]);
        }
        out
    }

    /// A whole `[batch, hidden]` state holding `piece` at this rank's units, zeros
    /// elsewhere: summed over the ranks, the whole.
    fn placed(&self, piece: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0; self.batch * self.hidden];
        for b in 0..self.batch {
            let at = b * self.hidden + self.lo;
            out[at..at + self.local].copy_from_slice(&piece[b * self.local..(b + 1) * self.local]);
        }
        out
    }
}

/// The operands, read and checked once.
struct Operands<'a> {
    shape: Shape,
    x: &'a [f32],
    w: &'a [f32],
    r: &'a [f32],
    /// `[dirs, 2·width]`: W's bias then R's, zeros when absent.
    bias: Vec<f32>,
    /// Steps per sample.
    lens: Vec<usize>,
    initial_h: Option<&'a [f32]>,
    initial_c: Option<&'a [f32]>,
}

impl<'a> Operands<'a> {
    fn read(
        r: &Recurrent,
        inputs: &[Option<&'a Tensor>],
        piece: (usize, usize),
    ) -> R<Operands<'a>> {
        let (x, w, rec) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
        let shape = Shape::of(r, x, w, rec, piece)?;
        let floats = |t: &'a Tensor, name: &str| {
            t.floats()
                .ok_or_else(|| format!("{name} must be floating-point"))
        };
        let bias = match optional(inputs, 3) {
            Some(b) if b.len() == shape.dirs * 2 * shape.width => {
                floats(b, "B").map_err(operands)?.to_vec()
            }
            Some(b) => return Err(operands(format!("B has shape {:?}", b.shape))),
            None => vec![0.0; shape.dirs * 2 * shape.width],
        };
        let lens = match optional(inputs, 4) {
            Some(l) => {
                let lens = l.to_i64s();
                if lens.len() != shape.batch
                    || lens.iter().any(|&n| n < 0 || n as usize > shape.seq)
                {
                    return Err(operands(format!(
                        "sequence_lens {lens:?} must give each of {} samples 0..={} steps",
                        shape.batch, shape.seq
                    )));
                }
                lens.iter().map(|&n| n as usize).collect()
            }
            None => vec![shape.seq; shape.batch],
        };
        let state = |slot: usize, name: &str| -> R<Option<&'a [f32]>> {
            match optional(inputs, slot) {
                Some(t) if t.len() == shape.dirs * shape.batch * shape.hidden => {
                    Ok(Some(floats(t, name).map_err(operands)?))
                }
                Some(t) => Err(operands(format!("{name} has shape {:?}", t.shape))),
                None => Ok(None),
            }
        };
        Ok(Operands {
            initial_h: state(5, "initial_h")?,
            initial_c: if r.cell == Cell::Lstm {
                state(6, "initial_c")?
            } else {
                None
            },
            x: floats(x, "X").map_err(operands)?,
            w: floats(w, "W").map_err(operands)?,
            r: floats(rec, "R").map_err(operands)?,
            bias,
            lens,
            shape,
        })
    }

    /// The time sample `b` reads at step `k` of direction `d`, if it is still running.
    fn time(&self, direction: Direction, d: usize, k: usize, b: usize) -> Option<usize> {
        let len = self.lens[b];
        let reverse = direction == Direction::Reverse || d == 1;
        (k < len).then(|| if reverse { len - 1 - k } else { k })
    }

    /// X's rows read at step `k` (zeros for finished samples).
    fn step_input(&self, direction: Direction, d: usize, k: usize) -> Vec<f32> {
        let s = &self.shape;
        let mut rows = vec![0.0; s.batch * s.input];
        for b in 0..s.batch {
            if let Some(t) = self.time(direction, d, k, b) {
                let at = s.x(t, b);
                rows[b * s.input..(b + 1) * s.input].copy_from_slice(&self.x[at..at + s.input]);
            }
        }
        rows
    }

    /// A direction's whole initial state, `[batch, hidden]`.
    fn initial(&self, state: Option<&[f32]>, d: usize) -> Vec<f32> {
        let s = &self.shape;
        let mut out = vec![0.0; s.batch * s.hidden];
        if let Some(state) = state {
            for b in 0..s.batch {
                let at = s.state(d, b, s.hidden);
                out[b * s.hidden..(b + 1) * s.hidden].copy_from_slice(&state[at..at + s.hidden]);
            }
        }
        out
    }
}

/// One direction's forward pass, step by step: what backward needs.
struct Trace {
    /// The whole `h` before each step and after the last: `(seq + 1) × batch × hidden`.
    h: Vec<Vec<f32>>,
    /// This rank's piece of `c` likewise (LSTM): `batch × local`.
    c: Vec<Vec<f32>>,
    /// Activated gates per step, `batch × width`.
    gates: Vec<Vec<f32>>,
    /// GRU: per step, `h·R_hᵀ + Rb_h` (linear before reset, `batch × local`) or the
    /// whole `r ⊙ h` (`batch × hidden`).
    extra: Vec<Vec<f32>>,
}

/// `y = x·Mᵀ + bias` for a `rows × inner` x and a `width × inner` M.
fn affine(x: &[f32], m: &[f32], bias: &[f32], rows: usize, inner: usize, width: usize) -> Vec<f32> {
    let mut y = vec![0.0; rows * width];
    for row in y.chunks_mut(width) {
        row.copy_from_slice(bias);
    }
    gemm(rows, inner, width, 1.0, x, false, m, true, 1.0, &mut y);
    y
}

fn run_direction(
    cell: Cell,
    direction: Direction,
    ops: &Operands<'_>,
    d: usize,
    ex: &mut dyn Exchange,
) -> R<Trace> {
    let s = &ops.shape;
    let (bsz, hid, loc, width) = (s.batch, s.hidden, s.local, s.width);
    let w = &ops.w[d * width * s.input..(d + 1) * width * s.input];
    let r = &ops.r[d * width * hid..(d + 1) * width * hid];
    let wb = &ops.bias[d * 2 * width..d * 2 * width + width];
    let rb = &ops.bias[d * 2 * width + width..(d + 1) * 2 * width];
    let mut trace = Trace {
        h: vec![ops.initial(ops.initial_h, d)],
        c: vec![s.own(&ops.initial(ops.initial_c, d))],
        gates: Vec::with_capacity(s.seq),
        extra: Vec::new(),
    };
    for k in 0..s.seq {
        let x = ops.step_input(direction, d, k);
        let h = &trace.h[k];
        // This rank's units of h: its own piece of the state it gathered.
        let own = s.own(h);
        let xw = affine(&x, w, wb, bsz, s.input, width);
        let hr = affine(h, r, rb, bsz, hid, width);
        let mut gates = vec![0.0; bsz * width];
        let mut h_next = own.clone();
        let mut c_next = trace.c[k].clone();
        let mut extra = vec![0.0; bsz * loc];
        if let Cell::Gru {
            linear_before_reset: false,
        } = cell
        {
            // The reset gate applies to h before the candidate's recurrent product, which
            // reads every unit of r ⊙ h.
            let mut rh = vec![0.0; bsz * loc];
            for b in 0..bsz {
                for j in 0..loc {
                    let at = b * width + loc + j;
                    rh[b * loc + j] = sigmoid(xw[at] + hr[at]) * own[b * loc + j];
                }
            }
            let rh = ex.gather(&rh, bsz, hid)?;
            let candidate = affine(&rh, &r[2 * loc * hid..], &rb[2 * loc..], bsz, hid, loc);
            for b in 0..bsz {
                for j in 0..loc {
                    let g = b * width;
                    let z = sigmoid(xw[g + j] + hr[g + j]);
                    let rr = sigmoid(xw[g + loc + j] + hr[g + loc + j]);
                    let n = (xw[g + 2 * loc + j] + candidate[b * loc + j]).tanh();
                    gates[g + j] = z;
                    gates[g + loc + j] = rr;
                    gates[g + 2 * loc + j] = n;
                }
            }
            extra = rh;
        } else {
            for b in 0..bsz {
                let g = b * width;
                for j in 0..loc {
                    match cell {
                        Cell::Rnn => gates[g + j] = (xw[g + j] + hr[g + j]).tanh(),
                        Cell::Gru { .. } => {
                            let z = sigmoid(xw[g + j] + hr[g + j]);
                            let rr = sigmoid(xw[g + loc + j] + hr[g + loc + j]);
                            let recurrent = hr[g + 2 * loc + j];
                            gates[g + j] = z;
                            gates[g + loc + j] = rr;
                            gates[g + 2 * loc + j] = (xw[g + 2 * loc + j] + rr * recurrent).tanh();
                            extra[b * loc + j] = recurrent;
                        }
                        Cell::Lstm => {
                            for q in 0..4 {
                                let at = g + q * loc + j;
                                let pre = xw[at] + hr[at];
                                gates[at] = if q == 3 { pre.tanh() } else { sigmoid(pre) };
                            }
                        }
                    }
                }
            }
        }
        for b in 0..bsz {
            if ops.time(direction, d, k, b).is_none() {
                continue;
            }
            let g = b * width;
            for j in 0..loc {
                let at = b * loc + j;
                h_next[at] = match cell {
                    Cell::Rnn => gates[g + j],
                    Cell::Gru { .. } => {
                        let z = gates[g + j];
                        (1.0 - z) * gates[g + 2 * loc + j] + z * own[at]
                    }
                    Cell::Lstm => {
                        let (i, o, f, c) = (
                            gates[g + j],
                            gates[g + loc + j],
                            gates[g + 2 * loc + j],
                            gates[g + 3 * loc + j],
                        );
                        c_next[at] = f * trace.c[k][at] + i * c;
                        o * c_next[at].tanh()
                    }
                };
            }
        }
        let h_next = ex.gather(&h_next, bsz, hid)?;
        trace.gates.push(gates);
        trace.extra.push(extra);
        trace.h.push(h_next);
        trace.c.push(c_next);
    }
    Ok(trace)
}

fn directions(r: &Recurrent) -> Vec<usize> {
    (0..r.direction.count() as usize).collect()
}

/// The forward pass: `Y`, then `Y_h` and `Y_c` as the node declares them.
pub(crate) fn forward(r: &Recurrent, inputs: &[Option<&Tensor>], outputs: usize) -> R<Vec<Tensor>> {
    forward_shared(r, inputs, outputs, &mut Alone)
}

/// [`forward`] of this rank's piece of a layer split by its gates: W, R and B hold its
/// rows of every gate, X and the initial states are whole; `Y`, `Y_h` and `Y_c` are its
/// piece of the hidden units.
pub(crate) fn forward_shared(
    r: &Recurrent,
    inputs: &[Option<&Tensor>],
    outputs: usize,
    ex: &mut dyn Exchange,
) -> R<Vec<Tensor>> {
    let ops = Operands::read(r, inputs, ex.piece())?;
    let s = &ops.shape;
    let loc = s.local;
    let mut y = vec![0.0; s.seq * s.dirs * s.batch * loc];
    let mut y_h = vec![0.0; s.dirs * s.batch * loc];
    let mut y_c = y_h.clone();
    for d in directions(r) {
        let trace = run_direction(r.cell, r.direction, &ops, d, ex)?;
        for k in 0..s.seq {
            let h = s.own(&trace.h[k + 1]);
            for b in 0..s.batch {
                if let Some(t) = ops.time(r.direction, d, k, b) {
                    let at = s.y(t, d, b);
                    y[at..at + loc].copy_from_slice(&h[b * loc..(b + 1) * loc]);
                }
            }
        }
        let h = s.own(&trace.h[s.seq]);
        for b in 0..s.batch {
            let at = s.state(d, b, loc);
            let row = b * loc..(b + 1) * loc;
            y_h[at..at + loc].copy_from_slice(&h[row.clone()]);
            y_c[at..at + loc].copy_from_slice(&trace.c[s.seq][row]);
        }
    }
    let mut outs = vec![
        Tensor::f32(s.y_shape(), y),
        Tensor::f32(s.state_shape(), y_h),
    ];
    if r.cell == Cell::Lstm {
        outs.push(Tensor::f32(s.state_shape(), y_c));
    }
    outs.truncate(outputs.max(1));
    Ok(outs)
}

/// Backpropagation through time: gradients of X, W, R, B, initial_h and initial_c (the
/// others, sequence lengths, have none) from those of `Y`, `Y_h`, `Y_c`.
pub(crate) fn backward(
    r: &Recurrent,
    inputs: &[Option<&Tensor>],
    dys: &[Option<&[f32]>],
) -> R<Vec<Option<Vec<f32>>>> {
    backward_shared(r, inputs, dys, &mut Alone)
}

/// [`backward`] of this rank's piece of a layer split by its gates ([`forward_shared`]):
/// the gradients of its rows of W, R and B, and this rank's part of the gradients of X
/// and the initial states, which summed over the ranks are theirs.
pub(crate) fn backward_shared(
    r: &Recurrent,
    inputs: &[Option<&Tensor>],
    dys: &[Option<&[f32]>],
    ex: &mut dyn Exchange,
) -> R<Vec<Option<Vec<f32>>>> {
    let ops = Operands::read(r, inputs, ex.piece())?;
    let s = &ops.shape;
    let (bsz, hid, loc, width, inp) = (s.batch, s.hidden, s.local, s.width, s.input);
    let mut dx = vec![0.0; ops.x.len()];
    let mut dw = vec![0.0; ops.w.len()];
    let mut dr = vec![0.0; ops.r.len()];
    let mut db = vec![0.0; ops.bias.len()];
    let mut dh0 = vec![0.0; s.dirs * bsz * hid];
    let mut dc0 = dh0.clone();
    let dy = dys.first().copied().flatten();
    let gru_reset_first = matches!(
        r.cell,
        Cell::Gru {
            linear_before_reset: false
        }
    );
    for d in directions(r) {
        let trace = run_direction(r.cell, r.direction, &ops, d, ex)?;
        let w = &ops.w[d * width * inp..(d + 1) * width * inp];
        let rm = &ops.r[d * width * hid..(d + 1) * width * hid];
        let from_state = |grad: Option<&[f32]>| {
            let mut out = vec![0.0; bsz * loc];
            if let Some(grad) = grad {
                for b in 0..bsz {
                    let at = s.state(d, b, loc);
                    out[b * loc..(b + 1) * loc].copy_from_slice(&grad[at..at + loc]);
                }
            }
            out
        };
        let mut dh = from_state(dys.get(1).copied().flatten());
        let mut dc = from_state(dys.get(2).copied().flatten());
        let (dw_d, dr_d, db_d) = (
            &mut dw[d * width * inp..(d + 1) * width * inp],
            &mut dr[d * width * hid..(d + 1) * width * hid],
            &mut db[d * 2 * width..(d + 1) * 2 * width],
        );
        for k in (0..s.seq).rev() {
            let (gates, h, c) = (&trace.gates[k], &trace.h[k], &trace.c[k]);
            let own = s.own(h);
            let mut d_xw = vec![0.0; bsz * width];
            let mut d_hr = vec![0.0; bsz * width];
            // Gradient reaching this rank's units of h_prev other than through R (GRU's
            // z ⊙ h term and r ⊙ h).
            let mut dh_prev = vec![0.0; bsz * loc];
            let mut dc_prev = vec![0.0; bsz * loc];
            let mut d_candidate = vec![0.0; bsz * loc];
            for b in 0..bsz {
                let rows = b * loc..(b + 1) * loc;
                let Some(t) = ops.time(r.direction, d, k, b) else {
                    // A finished sample's state passes through this step unchanged.
                    dh_prev[rows.clone()].copy_from_slice(&dh[rows.clone()]);
                    dc_prev[rows.clone()].copy_from_slice(&dc[rows]);
                    continue;
                };
                if let Some(dy) = dy {
                    let at = s.y(t, d, b);
                    for j in 0..loc {
                        dh[b * loc + j] += dy[at + j];
                    }
                }
                let g = b * width;
                for j in 0..loc {
                    let at = b * loc + j;
                    match r.cell {
                        Cell::Rnn => {
                            let y = gates[g + j];
                            d_xw[g + j] = dh[at] * (1.0 - y * y);
                        }
                        Cell::Gru {
                            linear_before_reset,
                        } => {
                            let (z, rr, n) =
                                (gates[g + j], gates[g + loc + j], gates[g + 2 * loc + j]);
                            let dn = dh[at] * (1.0 - z) * (1.0 - n * n);
                            d_xw[g + j] = dh[at] * (own[at] - n) * z * (1.0 - z);
                            d_xw[g + 2 * loc + j] = dn;
                            dh_prev[at] = dh[at] * z;
                            if linear_before_reset {
                                let recurrent = trace.extra[k][at];
                                d_xw[g + loc + j] = dn * recurrent * rr * (1.0 - rr);
                                d_hr[g + 2 * loc + j] = dn * rr;
                            } else {
                                d_candidate[at] = dn;
                            }
                        }
                        Cell::Lstm => {
                            let (i, o, f, cc) = (
                                gates[g + j],
                                gates[g + loc + j],
                                gates[g + 2 * loc + j],
                                gates[g + 3 * loc + j],
                            );
                            let tanh_c = (f * c[at] + i * cc).tanh();
                            let dct = dc[at] + dh[at] * o * (1.0 - tanh_c * tanh_c);
                            d_xw[g + j] = dct * cc * i * (1.0 - i);
                            d_xw[g + loc + j] = dh[at] * tanh_c * o * (1.0 - o);
                            d_xw[g + 2 * loc + j] = dct * c[at] * f * (1.0 - f);
                            d_xw[g + 3 * loc + j] = dct * i * (1.0 - cc * cc);
                            dc_prev[at] = dct * f;
                        }
                    }
                }
            }
            if gru_reset_first {
                // n = tanh(xw_h + (r ⊙ h)·R_hᵀ + Rb_h): back through that product, whose
                // input gradient every rank's candidate units add to.
                let rh = &trace.extra[k];
                let r_h = &rm[2 * loc * hid..];
                let mut d_rh = vec![0.0; bsz * hid];
                gemm(
                    bsz,
                    loc,
                    hid,
                    1.0,
                    &d_candidate,
                    false,
                    r_h,
                    false,
                    0.0,
                    &mut d_rh,
                );
                ex.sum(&mut d_rh)?;
                let d_rh = s.own(&d_rh);
                gemm(
                    loc,
                    bsz,
                    hid,
                    1.0,
                    &d_candidate,
                    true,
                    rh,
                    false,
                    1.0,
                    &mut dr_d[2 * loc * hid..],
                );
                for b in 0..bsz {
                    if ops.time(r.direction, d, k, b).is_none() {
                        continue;
                    }
                    for j in 0..loc {
                        let at = b * loc + j;
                        db_d[width + 2 * loc + j] += d_candidate[at];
                        let rr = gates[b * width + loc + j];
                        d_xw[b * width + loc + j] = d_rh[at] * own[at] * rr * (1.0 - rr);
                        dh_prev[at] += d_rh[at] * rr;
                    }
                }
            }
            if !matches!(r.cell, Cell::Gru { .. }) {
                d_hr.copy_from_slice(&d_xw);
            } else {
                // z and r enter through both products alike.
                for b in 0..bsz {
                    let g = b * width;
                    d_hr[g..g + 2 * loc].copy_from_slice(&d_xw[g..g + 2 * loc]);
                }
            }
            let x = ops.step_input(r.direction, d, k);
            gemm(width, bsz, inp, 1.0, &d_xw, true, &x, false, 1.0, dw_d);
            gemm(width, bsz, hid, 1.0, &d_hr, true, h, false, 1.0, dr_d);
            for b in 0..bsz {
                for q in 0..width {
                    db_d[q] += d_xw[b * width + q];
                    db_d[width + q] += d_hr[b * width + q];
                }
            }
            let mut dx_k = vec![0.0; bsz * inp];
            gemm(bsz, width, inp, 1.0, &d_xw, false, w, false, 0.0, &mut dx_k);
            // h_prev's gradient: this rank's direct terms at its units, and through R at
            // every unit; summed over the ranks.
            let mut dh_whole = s.placed(&dh_prev);
            gemm(
                bsz,
                width,
                hid,
                1.0,
                &d_hr,
                false,
                rm,
                false,
                1.0,
                &mut dh_whole,
            );
            ex.sum(&mut dh_whole)?;
            for b in 0..bsz {
                if let Some(t) = ops.time(r.direction, d, k, b) {
                    let at = s.x(t, b);
                    for (o, v) in dx[at..at + inp]
                        .iter_mut()
                        .zip(&dx_k[b * inp..(b + 1) * inp])
                    {
                        *o += v;
                    }
                }
            }
            dh = s.own(&dh_whole);
            dc = dc_prev;
        }
        // This rank's units of the initial states' gradients, zeros elsewhere.
        let (dh, dc) = (s.placed(&dh), s.placed(&dc));
        for b in 0..bsz {
            let at = s.state(d, b, hid);
            dh0[at..at + hid].copy_from_slice(&dh[b * hid..(b + 1) * hid]);
            dc0[at..at + hid].copy_from_slice(&dc[b * hid..(b + 1) * hid]);
        }
    }
    let mut grads: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
    let present = |slot: usize| inputs.get(slot).copied().flatten().is_some();
    grads[0] = Some(dx);
    grads[1] = Some(dw);
    grads[2] = Some(dr);
    if present(3) {
        grads[3] = Some(db);
    }
    if present(5) {
        grads[5] = Some(dh0);
    }
    if present(6) && r.cell == Cell::Lstm {
        grads[6] = Some(dc0);
    }
    Ok(grads)
}

#[cfg(test)]
mod tests {
    use std::sync::{Barrier, Mutex};

    use super::*;

    /// Ranks as threads: each deposits its whole-size part, all read the sum in rank order.
    struct Threads<'a> {
        rank: usize,
        count: usize,
        slots: &'a Mutex<Vec<Vec<f32>>>,
        barrier: &'a Barrier,
    }

    impl Exchange for Threads<'_> {
        fn piece(&self) -> (usize, usize) {
            (self.rank, self.count)
        }

        fn gather(&mut self, piece: &[f32], rows: usize, hidden: usize) -> R<Vec<f32>> {
            let (lo, hi) = (
                self.rank * hidden / self.count,
                (self.rank + 1) * hidden / self.count,
            );
            let mut whole = vec![0.0; rows * hidden];
            for b in 0..rows {
                whole[b * hidden + lo..b * hidden + hi]
                    .copy_from_slice(&piece[b * (hi - lo)..(b + 1) * (hi - lo)]);
            }
            self.sum(&mut whole)?;
            Ok(whole)
        }

        fn sum(&mut self, partial: &mut [f32]) -> R<()> {
            self.slots.lock().unwrap()[self.rank] = partial.to_vec();
            self.barrier.wait();
            partial.fill(0.0);
            for slot in self.slots.lock().unwrap().iter() {
                for (p, v) in partial.iter_mut().zip(slot) {
                    *p += v;
                }
            }
            self.barrier.wait();
            Ok(())
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed * 97);
                (x % 2000) as f32 / 2000.0 - 0.5
            })
            .collect()
    }

    /// Rows `[lo, hi)` of each of `groups` groups along axis 1 of a `[dirs, n, inner]`
    /// tensor.
    fn rows(t: &Tensor, groups: usize, (lo, hi): (usize, usize)) -> Tensor {
        let (dirs, n) = (t.shape[0], t.shape[1]);
        let inner: usize = t.shape[2..].iter().product();
        let per = n / groups;
        let data = t.floats().unwrap();
        let mut out = Vec::new();
        for d in 0..dirs {
            for g in 0..groups {
                let at = (d * n + g * per) * inner;
                out.extend_from_slice(&data[at + lo * inner..at + hi * inner]);
            }
        }
        let mut shape = t.shape.clone();
        shape[1] = groups * (hi - lo);
        Tensor::f32(shape, out)
    }

    /// Units `[lo, hi)` of a tensor whose last axis is the hidden units.
    fn units(t: &[f32], hidden: usize, (lo, hi): (usize, usize)) -> Vec<f32> {
        t.chunks(hidden).flat_map(|r| r[lo..hi].to_vec()).collect()
    }

    #[test]
    fn a_layer_split_by_its_gates_computes_what_one_rank_does() {
        let cells = [
            Cell::Lstm,
            Cell::Rnn,
            Cell::Gru {
                linear_before_reset: true,
            },
            Cell::Gru {
                linear_before_reset: false,
            },
        ];
        let (seq, batch, input, hidden) = (4, 3, 5, 6);
        for cell in cells {
            for (direction, count) in [(Direction::Bidirectional, 2), (Direction::Forward, 4)] {
                let r = Recurrent {
                    cell,
                    hidden: hidden as u64,
                    direction,
                    batch_major: false,
                };
                let (dirs, gates) = (direction.count() as usize, cell.gates() as usize);
                let t = |shape: Vec<usize>, seed| {
                    let n = shape.iter().product();
                    Tensor::f32(shape, values(n, seed))
                };
                let x = t(vec![seq, batch, input], 1);
                let w = t(vec![dirs, gates * hidden, input], 2);
                let rec = t(vec![dirs, gates * hidden, hidden], 3);
                let b = t(vec![dirs, 2 * gates * hidden], 4);
                let lens = Tensor::i64(vec![batch], vec![4, 2, 3]);
                let h0 = t(vec![dirs, batch, hidden], 5);
                let c0 = t(vec![dirs, batch, hidden], 6);
                let inputs = [
                    Some(&x),
                    Some(&w),
                    Some(&rec),
                    Some(&b),
                    Some(&lens),
                    Some(&h0),
                    Some(&c0),
                ];
                let dy = values(seq * dirs * batch * hidden, 7);
                let dyh = values(dirs * batch * hidden, 8);
                let dyc = values(dirs * batch * hidden, 9);
                let whole = forward(&r, &inputs, 3).unwrap();
                let grads = backward(&r, &inputs, &[Some(&dy), Some(&dyh), Some(&dyc)]).unwrap();

                let slots = Mutex::new(vec![Vec::new(); count]);
                let barrier = Barrier::new(count);
                let pieces: Vec<_> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..count)
                        .map(|rank| {
                            let (slots, barrier, inputs) = (&slots, &barrier, &inputs);
                            let (r, dy, dyh, dyc) = (&r, &dy, &dyh, &dyc);
                            scope.spawn(move || {
                                let piece = (rank * hidden / count, (rank + 1) * hidden / count);
                                let (w, rec) = (
                                    rows(inputs[1].unwrap(), gates, piece),
                                    rows(inputs[2].unwrap(), gates, piece),
                                );
                                let b = rows(inputs[3].unwrap(), 2 * gates, piece);
                                let mine = [
                                    inputs[0],
                                    Some(&w),
                                    Some(&rec),
                                    Some(&b),
                                    inputs[4],
                                    inputs[5],
                                    inputs[6],
                                ];
                                let mut ex = Threads {
                                    rank,
                                    count,
                                    slots,
                                    barrier,
                                };
                                let out = forward_shared(r, &mine, 3, &mut ex).unwrap();
                                let (dy, dyh, dyc) = (
                                    units(dy, hidden, piece),
                                    units(dyh, hidden, piece),
                                    units(dyc, hidden, piece),
                                );
                                let g = backward_shared(
                                    r,
                                    &mine,
                                    &[Some(&dy), Some(&dyh), Some(&dyc)],
                                    &mut ex,
                                )
                                .unwrap();
                                (piece, out, g, (w, rec, b))
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                let close = |a: &[f32], b: &[f32], what: &str| {
                    assert_eq!(a.len(), b.len(), "{cell:?} {what}");
                    for (x, y) in a.iter().zip(b) {
                        assert!(
                            (x - y).abs() < 1e-5,
                            "{cell:?} {direction:?} {what}: {x} vs {y}"
                        );
                    }
                };
                let mut summed: Vec<Vec<f32>> = vec![vec![0.0; x.len()], vec![0.0; h0.len()]];
                summed.push(vec![0.0; c0.len()]);
                for (piece, out, g, _) in &pieces {
                    for (o, want) in out.iter().zip(&whole) {
                        close(
                            o.floats().unwrap(),
                            &units(want.floats().unwrap(), hidden, *piece),
                            "outputs",
                        );
                    }
                    let (dw, dr, db) = (
                        Tensor::f32(w.shape.clone(), grads[1].clone().unwrap()),
                        Tensor::f32(rec.shape.clone(), grads[2].clone().unwrap()),
                        Tensor::f32(b.shape.clone(), grads[3].clone().unwrap()),
                    );
                    close(
                        g[1].as_ref().unwrap(),
                        rows(&dw, gates, *piece).floats().unwrap(),
                        "dW",
                    );
                    close(
                        g[2].as_ref().unwrap(),
                        rows(&dr, gates, *piece).floats().unwrap(),
                        "dR",
                    );
                    close(
                        g[3].as_ref().unwrap(),
                        rows(&db, 2 * gates, *piece).floats().unwrap(),
                        "dB",
                    );
                    for (i, slot) in [0, 5, 6].into_iter().enumerate() {
                        if let Some(part) = &g[slot] {
                            super::super::kernels::add(&mut summed[i], part);
                        }
                    }
                }
                close(&summed[0], grads[0].as_ref().unwrap(), "dX");
                close(&summed[1], grads[5].as_ref().unwrap(), "d initial_h");
                if cell == Cell::Lstm {
                    close(&summed[2], grads[6].as_ref().unwrap(), "d initial_c");
                }
            }
        }
    }
}
