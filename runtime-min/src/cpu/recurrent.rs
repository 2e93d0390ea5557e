//! RNN, GRU and LSTM (ONNX semantics, default activations): the forward time loop, and
//! backpropagation through time, which replays the forward loop to keep every step's
//! gates.
//!
//! Inputs: `X, W, R, B, sequence_lens, initial_h` (and `initial_c` for an LSTM); outputs
//! `Y, Y_h` (and `Y_c`). Gates are stacked in W, R and B in ONNX's order: LSTM `i, o, f,
//! c`; GRU `z, r, h`. With `sequence_lens`, sample `b` runs its first `len_b` steps
//! (backwards from `len_b − 1` in reverse), `Y` is zero past them and `Y_h` is the state
//! after its last step.

use ralpc_ir::{Cell, Direction, Recurrent};

use super::kernels::gemm;
use super::ops::{input, optional, R};
use super::tensor::Tensor;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Sizes and index arithmetic of one layer on one set of inputs.
struct Shape {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    dirs: usize,
    /// `gates · hidden`.
    width: usize,
    batch_major: bool,
}

impl Shape {
    fn of(r: &Recurrent, x: &Tensor, w: &Tensor, rec: &Tensor) -> R<Shape> {
        let &[a, b, input] = x.shape.as_slice() else {
            return Err(format!("X has shape {:?}, not rank 3", x.shape));
        };
        let (seq, batch) = if r.batch_major { (b, a) } else { (a, b) };
        let (hidden, dirs) = (r.hidden as usize, r.direction.count() as usize);
        let width = r.cell.gates() as usize * hidden;
        if w.shape != [dirs, width, input] || rec.shape != [dirs, width, hidden] {
            return Err(format!(
                "W {:?} and R {:?} do not fit X {:?} with hidden size {hidden}",
                w.shape, rec.shape, x.shape
            ));
        }
        Ok(Shape {
            seq,
            batch,
            input,
            hidden,
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

    /// Offset of Y's row for time `t`, direction `d`, sample `b`.
    fn y(&self, t: usize, d: usize, b: usize) -> usize {
        let row = if self.batch_major {
            (b * self.seq + t) * self.dirs + d
        } else {
            (t * self.dirs + d) * self.batch + b
        };
        row * self.hidden
    }

    /// Offset of a state's row (`Y_h`, `initial_h`) for direction `d`, sample `b`.
    fn state(&self, d: usize, b: usize) -> usize {
        let row = if self.batch_major {
            b * self.dirs + d
        } else {
            d * self.batch + b
        };
        row * self.hidden
    }

    fn y_shape(&self) -> Vec<usize> {
        if self.batch_major {
            vec![self.batch, self.seq, self.dirs, self.hidden]
        } else {
            vec![self.seq, self.dirs, self.batch, self.hidden]
        }
    }

    fn state_shape(&self) -> Vec<usize> {
        if self.batch_major {
            vec![self.batch, self.dirs, self.hidden]
        } else {
            vec![self.dirs, self.batch, self.hidden]
        }
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
    fn read(r: &Recurrent, inputs: &[Option<&'a Tensor>]) -> R<Operands<'a>> {
        let (x, w, rec) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
        let shape = Shape::of(r, x, w, rec)?;
        let floats = |t: &'a Tensor, name: &str| {
            t.floats()
                .ok_or_else(|| format!("{name} must be floating-point"))
        };
        let bias = match optional(inputs, 3) {
            Some(b) if b.len() == shape.dirs * 2 * shape.width => floats(b, "B")?.to_vec(),
            Some(b) => return Err(format!("B has shape {:?}", b.shape)),
            None => vec![0.0; shape.dirs * 2 * shape.width],
        };
        let lens = match optional(inputs, 4) {
            Some(l) => {
                let lens = l.to_i64s();
                if lens.len() != shape.batch
                    || lens.iter().any(|&n| n < 0 || n as usize > shape.seq)
                {
                    return Err(format!(
                        "sequence_lens {lens:?} must give each of {} samples 0..={} steps",
                        shape.batch, shape.seq
                    ));
                }
                lens.iter().map(|&n| n as usize).collect()
            }
            None => vec![shape.seq; shape.batch],
        };
        let state = |slot: usize, name: &str| -> R<Option<&'a [f32]>> {
            match optional(inputs, slot) {
                Some(t) if t.len() == shape.dirs * shape.batch * shape.hidden => {
                    Ok(Some(floats(t, name)?))
                }
                Some(t) => Err(format!("{name} has shape {:?}", t.shape)),
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
            x: floats(x, "X")?,
            w: floats(w, "W")?,
            r: floats(rec, "R")?,
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

    /// A direction's initial state, `[batch, hidden]`.
    fn initial(&self, state: Option<&[f32]>, d: usize) -> Vec<f32> {
        let s = &self.shape;
        let mut out = vec![0.0; s.batch * s.hidden];
        if let Some(state) = state {
            for b in 0..s.batch {
                let at = s.state(d, b);
                out[b * s.hidden..(b + 1) * s.hidden].copy_from_slice(&state[at..at + s.hidden]);
            }
        }
        out
    }
}

/// One direction's forward pass, step by step: what backward needs.
struct Trace {
    /// `h` before each step and after the last: `(seq + 1) × batch × hidden`.
    h: Vec<Vec<f32>>,
    /// `c` likewise (LSTM).
    c: Vec<Vec<f32>>,
    /// Activated gates per step, `batch × width`.
    gates: Vec<Vec<f32>>,
    /// GRU: per step, `h·R_hᵀ + Rb_h` (linear before reset) or `r ⊙ h`.
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

fn run_direction(cell: Cell, direction: Direction, ops: &Operands<'_>, d: usize) -> Trace {
    let s = &ops.shape;
    let (bsz, hid, width) = (s.batch, s.hidden, s.width);
    let w = &ops.w[d * width * s.input..(d + 1) * width * s.input];
    let r = &ops.r[d * width * hid..(d + 1) * width * hid];
    let wb = &ops.bias[d * 2 * width..d * 2 * width + width];
    let rb = &ops.bias[d * 2 * width + width..(d + 1) * 2 * width];
    let mut trace = Trace {
        h: vec![ops.initial(ops.initial_h, d)],
        c: vec![ops.initial(ops.initial_c, d)],
        gates: Vec::with_capacity(s.seq),
        extra: Vec::new(),
    };
    for k in 0..s.seq {
        let x = ops.step_input(direction, d, k);
        let h = &trace.h[k];
        let xw = affine(&x, w, wb, bsz, s.input, width);
        let hr = affine(h, r, rb, bsz, hid, width);
        let mut gates = vec![0.0; bsz * width];
        let mut h_next = h.clone();
        let mut c_next = trace.c[k].clone();
        let mut extra = vec![0.0; bsz * hid];
        if let Cell::Gru {
            linear_before_reset: false,
        } = cell
        {
            // The reset gate applies to h before the candidate's recurrent product.
            let mut rh = vec![0.0; bsz * hid];
            for b in 0..bsz {
                for j in 0..hid {
                    let at = b * width + hid + j;
                    rh[b * hid + j] = sigmoid(xw[at] + hr[at]) * h[b * hid + j];
                }
            }
            let candidate = affine(&rh, &r[2 * hid * hid..], &rb[2 * hid..], bsz, hid, hid);
            for b in 0..bsz {
                extra[b * hid..(b + 1) * hid].copy_from_slice(&candidate[b * hid..(b + 1) * hid]);
            }
            // `extra` holds the candidate's recurrent term until it is replaced by r ⊙ h.
            for b in 0..bsz {
                for j in 0..hid {
                    let g = b * width;
                    let z = sigmoid(xw[g + j] + hr[g + j]);
                    let rr = sigmoid(xw[g + hid + j] + hr[g + hid + j]);
                    let n = (xw[g + 2 * hid + j] + extra[b * hid + j]).tanh();
                    gates[g + j] = z;
                    gates[g + hid + j] = rr;
                    gates[g + 2 * hid + j] = n;
                }
            }
            extra = rh;
        } else {
            for b in 0..bsz {
                let g = b * width;
                for j in 0..hid {
                    match cell {
                        Cell::Rnn => gates[g + j] = (xw[g + j] + hr[g + j]).tanh(),
                        Cell::Gru { .. } => {
                            let z = sigmoid(xw[g + j] + hr[g + j]);
                            let rr = sigmoid(xw[g + hid + j] + hr[g + hid + j]);
                            let recurrent = hr[g + 2 * hid + j];
                            gates[g + j] = z;
                            gates[g + hid + j] = rr;
                            gates[g + 2 * hid + j] = (xw[g + 2 * hid + j] + rr * recurrent).tanh();
                            extra[b * hid + j] = recurrent;
                        }
                        Cell::Lstm => {
                            for q in 0..4 {
                                let at = g + q * hid + j;
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
            for j in 0..hid {
                let at = b * hid + j;
                h_next[at] = match cell {
                    Cell::Rnn => gates[g + j],
                    Cell::Gru { .. } => {
                        let z = gates[g + j];
                        (1.0 - z) * gates[g + 2 * hid + j] + z * h[at]
                    }
                    Cell::Lstm => {
                        let (i, o, f, c) = (
                            gates[g + j],
                            gates[g + hid + j],
                            gates[g + 2 * hid + j],
                            gates[g + 3 * hid + j],
                        );
                        c_next[at] = f * trace.c[k][at] + i * c;
                        o * c_next[at].tanh()
                    }
                };
            }
        }
        trace.gates.push(gates);
        trace.extra.push(extra);
        trace.h.push(h_next);
        trace.c.push(c_next);
    }
    trace
}

fn directions(r: &Recurrent) -> Vec<usize> {
    (0..r.direction.count() as usize).collect()
}

/// The forward pass: `Y`, then `Y_h` and `Y_c` as the node declares them.
pub(crate) fn forward(r: &Recurrent, inputs: &[Option<&Tensor>], outputs: usize) -> R<Vec<Tensor>> {
    let ops = Operands::read(r, inputs)?;
    let s = &ops.shape;
    let mut y = vec![0.0; s.seq * s.dirs * s.batch * s.hidden];
    let mut y_h = vec![0.0; s.dirs * s.batch * s.hidden];
    let mut y_c = y_h.clone();
    for d in directions(r) {
        let trace = run_direction(r.cell, r.direction, &ops, d);
        for k in 0..s.seq {
            for b in 0..s.batch {
                if let Some(t) = ops.time(r.direction, d, k, b) {
                    let at = s.y(t, d, b);
                    y[at..at + s.hidden]
                        .copy_from_slice(&trace.h[k + 1][b * s.hidden..(b + 1) * s.hidden]);
                }
            }
        }
        for b in 0..s.batch {
            let at = s.state(d, b);
            let row = b * s.hidden..(b + 1) * s.hidden;
            y_h[at..at + s.hidden].copy_from_slice(&trace.h[s.seq][row.clone()]);
            y_c[at..at + s.hidden].copy_from_slice(&trace.c[s.seq][row]);
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
    let ops = Operands::read(r, inputs)?;
    let s = &ops.shape;
    let (bsz, hid, width, inp) = (s.batch, s.hidden, s.width, s.input);
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
        let trace = run_direction(r.cell, r.direction, &ops, d);
        let w = &ops.w[d * width * inp..(d + 1) * width * inp];
        let rm = &ops.r[d * width * hid..(d + 1) * width * hid];
        let from_state = |grad: Option<&[f32]>| {
            let mut out = vec![0.0; bsz * hid];
            if let Some(grad) = grad {
                for b in 0..bsz {
                    let at = s.state(d, b);
                    out[b * hid..(b + 1) * hid].copy_from_slice(&grad[at..at + hid]);
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
            let mut d_xw = vec![0.0; bsz * width];
            let mut d_hr = vec![0.0; bsz * width];
            // Gradient reaching h_prev other than through R (GRU's z ⊙ h term and r ⊙ h).
            let mut dh_prev = vec![0.0; bsz * hid];
            let mut dc_prev = vec![0.0; bsz * hid];
            let mut d_candidate = vec![0.0; bsz * hid];
            for b in 0..bsz {
                let rows = b * hid..(b + 1) * hid;
                let Some(t) = ops.time(r.direction, d, k, b) else {
                    // A finished sample's state passes through this step unchanged.
                    dh_prev[rows.clone()].copy_from_slice(&dh[rows.clone()]);
                    dc_prev[rows.clone()].copy_from_slice(&dc[rows]);
                    continue;
                };
                if let Some(dy) = dy {
                    let at = s.y(t, d, b);
                    for j in 0..hid {
                        dh[b * hid + j] += dy[at + j];
                    }
                }
                let g = b * width;
                for j in 0..hid {
                    let at = b * hid + j;
                    match r.cell {
                        Cell::Rnn => {
                            let y = gates[g + j];
                            d_xw[g + j] = dh[at] * (1.0 - y * y);
                        }
                        Cell::Gru {
                            linear_before_reset,
                        } => {
                            let (z, rr, n) =
                                (gates[g + j], gates[g + hid + j], gates[g + 2 * hid + j]);
                            let dn = dh[at] * (1.0 - z) * (1.0 - n * n);
                            d_xw[g + j] = dh[at] * (h[at] - n) * z * (1.0 - z);
                            d_xw[g + 2 * hid + j] = dn;
                            dh_prev[at] = dh[at] * z;
                            if linear_before_reset {
                                let recurrent = trace.extra[k][at];
                                d_xw[g + hid + j] = dn * recurrent * rr * (1.0 - rr);
                                d_hr[g + 2 * hid + j] = dn * rr;
                            } else {
                                d_candidate[at] = dn;
                            }
                        }
                        Cell::Lstm => {
                            let (i, o, f, cc) = (
                                gates[g + j],
                                gates[g + hid + j],
                                gates[g + 2 * hid + j],
                                gates[g + 3 * hid + j],
                            );
                            let tanh_c = (f * c[at] + i * cc).tanh();
                            let dct = dc[at] + dh[at] * o * (1.0 - tanh_c * tanh_c);
                            d_xw[g + j] = dct * cc * i * (1.0 - i);
                            d_xw[g + hid + j] = dh[at] * tanh_c * o * (1.0 - o);
                            d_xw[g + 2 * hid + j] = dct * c[at] * f * (1.0 - f);
                            d_xw[g + 3 * hid + j] = dct * i * (1.0 - cc * cc);
                            dc_prev[at] = dct * f;
                        }
                    }
                }
            }
            if gru_reset_first {
                // n = tanh(xw_h + (r ⊙ h)·R_hᵀ + Rb_h): back through that product.
                let rh = &trace.extra[k];
                let r_h = &rm[2 * hid * hid..];
                let mut d_rh = vec![0.0; bsz * hid];
                gemm(
                    bsz,
                    hid,
                    hid,
                    1.0,
                    &d_candidate,
                    false,
                    r_h,
                    false,
                    0.0,
                    &mut d_rh,
                );
                gemm(
                    hid,
                    bsz,
                    hid,
                    1.0,
                    &d_candidate,
                    true,
                    rh,
                    false,
                    1.0,
                    &mut dr_d[2 * hid * hid..],
                );
                for b in 0..bsz {
                    if ops.time(r.direction, d, k, b).is_none() {
                        continue;
                    }
                    for j in 0..hid {
                        let at = b * hid + j;
                        db_d[width + 2 * hid + j] += d_candidate[at];
                        let rr = gates[b * width + hid + j];
                        d_xw[b * width + hid + j] = d_rh[at] * h[at] * rr * (1.0 - rr);
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
                    d_hr[g..g + 2 * hid].copy_from_slice(&d_xw[g..g + 2 * hid]);
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
                &mut dh_prev,
            );
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
            dh = dh_prev;
            dc = dc_prev;
        }
        for b in 0..bsz {
            let at = s.state(d, b);
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
