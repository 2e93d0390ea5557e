//! Elementwise operators on host tensors, forward and backward: unary functions, Clip,
//! broadcasting binary ones, Where, Dropout, softmax.

use ralpc_ir::{Binary, Op, Unary};

use super::grad::{grads, InputGrads};
use super::kernels;
use super::ops::{axis_of, floats, input, operands, optional, R};
use super::tensor::{self as t, Data, Tensor};

pub(crate) fn clip_value(v: f32, lo: Option<f32>, hi: Option<f32>) -> f32 {
    let v = lo.map_or(v, |lo| v.max(lo));
    hi.map_or(v, |hi| v.min(hi))
}

pub(crate) fn map_floats(x: &Tensor, f: impl Fn(f32) -> f32) -> R<Tensor> {
    Ok(match &x.data {
        Data::F32(v) => Tensor::f32(x.shape.clone(), v.iter().map(|&v| f(v)).collect()),
        Data::I64(v) => Tensor::i64(
            x.shape.clone(),
            v.iter().map(|&v| f(v as f32) as i64).collect(),
        ),
    })
}

/// One unary function on one element.
pub fn unary_value(u: Unary, v: f32) -> f32 {
    match u {
        Unary::Relu => v.max(0.0),
        Unary::LeakyRelu { alpha } => {
            if v >= 0.0 {
                v
            } else {
                alpha * v
            }
        }
        Unary::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        Unary::HardSigmoid { alpha, beta } => (alpha * v + beta).clamp(0.0, 1.0),
        Unary::HardSwish => v * (v / 6.0 + 0.5).clamp(0.0, 1.0),
        Unary::Tanh => v.tanh(),
        Unary::Gelu { tanh } => {
            let mut y = [0.0];
            kernels::gelu(tanh, &[v], &mut y);
            y[0]
        }
        Unary::Erf => kernels::erf(f64::from(v)) as f32,
        Unary::Sqrt => v.sqrt(),
        Unary::Neg => -v,
        Unary::Exp => v.exp(),
        Unary::Reciprocal => 1.0 / v,
        Unary::Log => v.ln(),
        Unary::Abs => v.abs(),
        // ln(1 + eˣ) without overflow for large x.
        Unary::Softplus => v.max(0.0) + (-v.abs()).exp().ln_1p(),
        Unary::Softsign => v / (1.0 + v.abs()),
        Unary::Elu { alpha } => {
            if v > 0.0 {
                v
            } else {
                alpha * v.exp_m1()
            }
        }
        Unary::Selu { alpha, gamma } => gamma * if v > 0.0 { v } else { alpha * v.exp_m1() },
        Unary::Sin => v.sin(),
        Unary::Cos => v.cos(),
        Unary::Tan => v.tan(),
        Unary::Asin => v.asin(),
        Unary::Acos => v.acos(),
        Unary::Atan => v.atan(),
        Unary::Sinh => v.sinh(),
        Unary::Cosh => v.cosh(),
        Unary::Asinh => v.asinh(),
        Unary::Acosh => v.acosh(),
        Unary::Atanh => v.atanh(),
        Unary::Mish => v * unary_value(Unary::Softplus, v).tanh(),
        Unary::Celu { alpha } => v.max(0.0) + (alpha * (v / alpha).exp_m1()).min(0.0),
        Unary::ThresholdedRelu { alpha } => {
            if v > alpha {
                v
            } else {
                0.0
            }
        }
        Unary::Shrink { bias, lambd } => {
            if v < -lambd {
                v + bias
            } else if v > lambd {
                v - bias
            } else {
                0.0
            }
        }
        Unary::Floor => v.floor(),
        Unary::Ceil => v.ceil(),
        Unary::Round => v.round_ties_even(),
        Unary::Sign => sign(v),
        _ => f32::NAN,
    }
}

/// −1, 0 or 1 (NaN stays NaN).
pub(crate) fn sign(v: f32) -> f32 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else {
        v
    }
}

pub(crate) fn unary(u: Unary, x: &Tensor) -> R<Tensor> {
    match (&x.data, u) {
        (Data::I64(v), Unary::Neg) => Ok(Tensor::i64(
            x.shape.clone(),
            v.iter().map(|&v| -v).collect(),
        )),
        (Data::I64(v), Unary::Relu) => Ok(Tensor::i64(
            x.shape.clone(),
            v.iter().map(|&v| v.max(0)).collect(),
        )),
        (Data::I64(v), Unary::Abs) => Ok(Tensor::i64(
            x.shape.clone(),
            v.iter().map(|&v| v.wrapping_abs()).collect(),
        )),
        (Data::I64(v), Unary::Sign) => Ok(Tensor::i64(
            x.shape.clone(),
            v.iter().map(|&v| v.signum()).collect(),
        )),
        // Booleans are held as 0/1 integers.
        (Data::I64(v), Unary::Not) => Ok(Tensor::i64(
            x.shape.clone(),
            v.iter().map(|&v| i64::from(v == 0)).collect(),
        )),
        (Data::I64(_), _) => Err(operands("this function needs a floating-point input")),
        (Data::F32(v), Unary::IsNaN) => Ok(Tensor::i64(
            x.shape.clone(),
            v.iter().map(|v| i64::from(v.is_nan())).collect(),
        )),
        (Data::F32(v), Unary::IsInf { negative, positive }) => Ok(Tensor::i64(
            x.shape.clone(),
            v.iter()
                .map(|&v| {
                    i64::from(
                        (negative && v == f32::NEG_INFINITY) || (positive && v == f32::INFINITY),
                    )
                })
                .collect(),
        )),
        (Data::F32(v), Unary::Relu) => Ok(Tensor::f32(
            x.shape.clone(),
            map_parallel(v, |v| v.max(0.0)),
        )),
        (Data::F32(v), Unary::Gelu { tanh }) => {
            let mut y = vec![0.0; v.len()];
            kernels::gelu(tanh, v, &mut y);
            Ok(Tensor::f32(x.shape.clone(), y))
        }
        (Data::F32(v), _) => Ok(Tensor::f32(
            x.shape.clone(),
            map_parallel(v, |v| unary_value(u, v)),
        )),
    }
}

/// `f` of every element; above 64 K elements, blocks of them in parallel, written in
/// place of the output's first touch (no zeroing pass).
fn map_parallel(v: &[f32], f: impl Fn(f32) -> f32 + Sync + Send) -> Vec<f32> {
    use rayon::prelude::*;
    if v.len() < 1 << 16 {
        return v.iter().map(|&x| f(x)).collect();
    }
    let mut out = Vec::new();
    v.par_iter()
        .with_min_len(1 << 14)
        .map(|&x| f(x))
        .collect_into_vec(&mut out);
    out
}

/// Applies a broadcasting binary function.
pub(crate) fn binary(b: Binary, x: &Tensor, y: &Tensor) -> R<Tensor> {
    let shape = t::broadcast_shapes(&x.shape, &y.shape).ok_or_else(|| {
        operands(format!(
            "shapes {:?} and {:?} do not broadcast",
            x.shape, y.shape
        ))
    })?;
    let n = t::numel(&shape);
    let pairs = || t::broadcast(&x.shape, &shape).zip(t::broadcast(&y.shape, &shape));
    Ok(match (&x.data, &y.data, b) {
        (Data::F32(a), Data::F32(c), b) if b.is_boolean() => Tensor::i64(
            shape.clone(),
            pairs()
                .map(|(i, j)| binary_value(b, a[i], c[j]) as i64)
                .collect(),
        ),
        (Data::I64(a), Data::I64(c), _) => {
            let mut out = Vec::with_capacity(n);
            for (i, j) in pairs() {
                let (p, q) = (a[i], c[j]);
                out.push(match b {
                    Binary::Add => p.wrapping_add(q),
                    Binary::Sub => p.wrapping_sub(q),
                    Binary::Mul => p.wrapping_mul(q),
                    Binary::Div => p
                        .checked_div(q)
                        .ok_or_else(|| operands("integer division by zero"))?,
                    Binary::Pow => p.wrapping_pow(q.clamp(0, u32::MAX as i64) as u32),
                    Binary::Mod | Binary::Fmod => b
                        .remainder(p, q)
                        .ok_or_else(|| operands("integer division by zero in Mod"))?,
                    Binary::PRelu if p < 0 => p.wrapping_mul(q),
                    Binary::PRelu => p,
                    Binary::Equal => i64::from(p == q),
                    Binary::Less
                    | Binary::LessOrEqual
                    | Binary::Greater
                    | Binary::GreaterOrEqual => i64::from(b.compare(p, q)),
                    Binary::And | Binary::Or | Binary::Xor => i64::from(b.logic(p != 0, q != 0)),
                });
            }
            Tensor::i64(shape, out)
        }
        (Data::F32(a), Data::F32(c), _) => {
            let (xs, ys) = (&x.shape[..], &y.shape[..]);
            // The arithmetic of every layer as loops of their own (one closure type each),
            // which the compiler vectorizes; the rest through `binary_value`.
            let out = match b {
                Binary::Add => float_binary(a, xs, c, ys, &shape, |p, q| p + q),
                Binary::Sub => float_binary(a, xs, c, ys, &shape, |p, q| p - q),
                Binary::Mul => float_binary(a, xs, c, ys, &shape, |p, q| p * q),
                Binary::Div => float_binary(a, xs, c, ys, &shape, |p, q| p / q),
                _ => float_binary(a, xs, c, ys, &shape, |p, q| binary_value(b, p, q)),
            };
            Tensor::f32(shape.clone(), out)
        }
        _ => {
            // A float base with an integer exponent (Pow), or mixed types.
            let (a, c) = (x.to_f64s(), y.to_f64s());
            let out: Vec<f32> = pairs()
                .map(|(i, j)| binary_value(b, a[i] as f32, c[j] as f32))
                .collect();
            if b.is_boolean() || matches!(x.data, Data::I64(_)) {
                // Comparisons give booleans; an integer base keeps its type (Pow).
                Tensor::i64(shape, out.iter().map(|&v| v as i64).collect())
            } else {
                Tensor::f32(shape, out)
            }
        }
    })
}

/// `f` over two float tensors broadcast to `shape`. The output is computed a row at a
/// time: a trailing-axes operand (a bias) is one row read again for every row, a scalar is
/// one value, an operand of the output's shape is read along; any other broadcast is first
/// copied to the output's shape. Large outputs run as blocks of rows in parallel.
pub(crate) fn float_binary(
    a: &[f32],
    ashape: &[usize],
    c: &[f32],
    cshape: &[usize],
    shape: &[usize],
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Vec<f32> {
    use rayon::prelude::*;
    let n = t::numel(shape);
    if n == 0 {
        return Vec::new();
    }
    // An operand that repeats along leading axes: the output's innermost block.
    let tail = |small: &[usize]| {
        let lead = shape.len() - small.len();
        small.iter().all(|&d| d != 1) && shape[lead..] == *small
    };
    let (a, c) = (
        Operand::of(a, ashape, shape, tail(ashape)),
        Operand::of(c, cshape, shape, tail(cshape)),
    );
    let width = match (&a, &c) {
        (Operand::Repeat(v), _) | (_, Operand::Repeat(v)) => v.len(),
        _ => n.min(1 << 12),
    };
    let row = |i: usize, out: &mut [f32]| {
        let at = i * width;
        match (a.row(at, out.len()), c.row(at, out.len())) {
            (Ok(p), Ok(q)) => {
                for ((o, &p), &q) in out.iter_mut().zip(p).zip(q) {
                    *o = f(p, q);
                }
            }
            (Ok(p), Err(q)) => out.iter_mut().zip(p).for_each(|(o, &p)| *o = f(p, q)),
            (Err(p), Ok(q)) => out.iter_mut().zip(q).for_each(|(o, &q)| *o = f(p, q)),
            (Err(p), Err(q)) => out.fill(f(p, q)),
        }
    };
    let mut out = vec![0.0; n];
    // Below ~64 K elements a parallel block costs more to schedule than to compute.
    if n < 1 << 16 {
        out.chunks_mut(width)
            .enumerate()
            .for_each(|(i, o)| row(i, o));
    } else {
        let rows = (1usize << 14).div_ceil(width);
        out.par_chunks_mut(rows * width)
            .enumerate()
            .for_each(|(b, block)| {
                for (i, o) in block.chunks_mut(width).enumerate() {
                    row(b * rows + i, o);
                }
            });
    }
    out
}

/// How one operand of [`float_binary`] is read.
enum Operand<'a> {
    /// Element `i` of the output reads element `i`.
    Along(std::borrow::Cow<'a, [f32]>),
    /// Every row of the output reads these.
    Repeat(&'a [f32]),
    /// One value for all.
    Scalar(f32),
}

impl<'a> Operand<'a> {
    fn of(v: &'a [f32], vshape: &[usize], shape: &[usize], tail: bool) -> Operand<'a> {
        if v.len() == 1 {
            Operand::Scalar(v[0])
        } else if vshape == shape {
            Operand::Along(v.into())
        } else if tail {
            Operand::Repeat(v)
        } else {
            Operand::Along(t::broadcast(vshape, shape).copy(v).into())
        }
    }

    /// What the `len` elements of the output from `at` (one row) read: their elements, or
    /// one value.
    fn row(&self, at: usize, len: usize) -> Result<&[f32], f32> {
        match self {
            Operand::Along(v) => Ok(&v[at..at + len]),
            Operand::Repeat(v) => Ok(v),
            Operand::Scalar(s) => Err(*s),
        }
    }
}

pub(crate) fn binary_value(b: Binary, p: f32, q: f32) -> f32 {
    match b {
        Binary::Add => p + q,
        Binary::Sub => p - q,
        Binary::Mul => p * q,
        Binary::Div => p / q,
        Binary::Pow => p.powf(q),
        Binary::Mod | Binary::Fmod => b.float_remainder(p, q),
        Binary::PRelu => {
            if p >= 0.0 {
                p
            } else {
                q * p
            }
        }
        Binary::Equal => f32::from(u8::from(p == q)),
        Binary::Less | Binary::LessOrEqual | Binary::Greater | Binary::GreaterOrEqual => {
            f32::from(u8::from(b.compare(p, q)))
        }
        Binary::And | Binary::Or | Binary::Xor => f32::from(u8::from(b.logic(p != 0.0, q != 0.0))),
    }
}

/// `(outer, width, inner)`: softmax runs over `width` elements `inner` apart.
pub(crate) fn softmax_layout(
    shape: &[usize],
    axis: i64,
    flatten: bool,
) -> R<(usize, usize, usize)> {
    let a = axis_of(axis, shape.len())?;
    Ok(if flatten {
        (t::numel(&shape[..a]), t::numel(&shape[a..]), 1)
    } else {
        (t::numel(&shape[..a]), shape[a], t::numel(&shape[a + 1..]))
    })
}

pub(crate) fn softmax(
    outer: usize,
    width: usize,
    inner: usize,
    log: bool,
    x: &[f32],
    y: &mut [f32],
) {
    use rayon::prelude::*;
    if inner == 1 && width > 0 {
        // Contiguous rows, in parallel; each exponential computed once, in f32, and the
        // row's maximum and sum over running lanes: ViT-B/16's attention softmax took 41 ms
        // of its 480 with an f64 exponential and one running sum.
        y.par_chunks_mut(width)
            .zip(x.par_chunks(width))
            .for_each(|(out, row)| {
                let max = kernels::lane_max(row);
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = kernels::exp_f32(v - max);
                }
                let sum = kernels::lane_sum(out);
                if log {
                    let ln = sum.ln();
                    out.iter_mut()
                        .zip(row)
                        .for_each(|(o, &v)| *o = v - max - ln);
                } else {
                    out.iter_mut().for_each(|o| *o /= sum);
                }
            });
        return;
    }
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * width + k) * inner + i;
            let max = (0..width)
                .map(|k| x[at(k)])
                .fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = (0..width).map(|k| (x[at(k)] - max).exp()).sum();
            for k in 0..width {
                y[at(k)] = if log {
                    x[at(k)] - max - sum.ln()
                } else {
                    (x[at(k)] - max).exp() / sum
                };
            }
        }
    }
}

/// Clip, its bounds from its attributes or inputs 1 and 2 (later opsets).
pub(crate) fn clip(min: Option<f32>, max: Option<f32>, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let scalar = |attr: Option<f32>, i: usize| {
        attr.or_else(|| optional(inputs, i).and_then(|t| t.to_f64s().first().map(|&v| v as f32)))
    };
    let (lo, hi) = (scalar(min, 1), scalar(max, 2));
    map_floats(input(inputs, 0)?, |v| clip_value(v, lo, hi))
}

/// Softmax (or log-softmax) of `x` over its axis.
pub(crate) fn softmax_of(x: &Tensor, axis: i64, log: bool, flatten: bool) -> R<Tensor> {
    let (outer, width, inner) = softmax_layout(&x.shape, axis, flatten)?;
    let xs = floats(x, "input")?;
    let mut y = vec![0.0; xs.len()];
    softmax(outer, width, inner, log, xs, &mut y);
    Ok(Tensor::f32(x.shape.clone(), y))
}

/// Where: each element from `x` where the condition holds, else from `y`, all three
/// broadcast.
pub(crate) fn where_of(inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let (c, x, y) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let shape = t::broadcast_shapes(&c.shape, &x.shape)
        .and_then(|s| t::broadcast_shapes(&s, &y.shape))
        .ok_or_else(|| operands("the shapes do not broadcast"))?;
    let values = c.to_f64s();
    let cond: Vec<bool> = t::broadcast(&c.shape, &shape)
        .map(|i| values[i] != 0.0)
        .collect();
    select(&cond, x, y, &shape)
}

/// Dropout is the identity: plans are compared with single-device training, which a
/// random mask would make irreproducible across partitionings. Its mask (a second output)
/// keeps every element.
pub(crate) fn dropout(x: &Tensor, outputs: usize) -> Vec<Tensor> {
    let mut outs = vec![x.clone()];
    if outputs > 1 {
        outs.push(Tensor::i64(x.shape.clone(), vec![1; x.len()]));
    }
    outs
}

fn select(cond: &[bool], x: &Tensor, y: &Tensor, shape: &[usize]) -> R<Tensor> {
    let ix: Vec<usize> = t::broadcast(&x.shape, shape).collect();
    let iy: Vec<usize> = t::broadcast(&y.shape, shape).collect();
    Ok(match (&x.data, &y.data) {
        (Data::I64(a), Data::I64(b)) => Tensor::i64(
            shape.to_vec(),
            (0..cond.len())
                .map(|k| if cond[k] { a[ix[k]] } else { b[iy[k]] })
                .collect(),
        ),
        _ => {
            let (a, b) = (x.to_f64s(), y.to_f64s());
            Tensor::f32(
                shape.to_vec(),
                (0..cond.len())
                    .map(|k| (if cond[k] { a[ix[k]] } else { b[iy[k]] }) as f32)
                    .collect(),
            )
        }
    })
}

/// A one-tensor function's input gradient: from its output alone for the functions whose
/// backward reads only that ([`ralpc_ir::Op::backward_reads`]: the input may be released),
/// else from its input; integers and booleans (Not, Sign of a mask, IsNaN's answer) carry
/// none.
pub(crate) fn unary_backward(u: Unary, x: &Tensor, y: &Tensor, dy: &[f32]) -> R<Option<Vec<f32>>> {
    if !x.is_float() || !y.is_float() {
        return Ok(None);
    }
    let ys = floats(y, "Y")?;
    if !Op::Unary(u).backward_reads().input(0) {
        let dx = ys
            .iter()
            .zip(dy)
            .map(|(&v, &g)| g * output_derivative(u, v))
            .collect();
        return Ok(Some(dx));
    }
    let xs = floats(x, "X")?;
    let mut dx = vec![0.0; xs.len()];
    if let Unary::Gelu { tanh } = u {
        kernels::gelu_backward(tanh, xs, dy, &mut dx);
    } else {
        for i in 0..xs.len() {
            dx[i] = dy[i] * unary_derivative(u, xs[i], ys[i]);
        }
    }
    Ok(Some(dx))
}

/// Clip's input gradient: the output's where the input lies between the bounds
/// (attributes, or inputs 1 and 2 in later opsets).
pub(crate) fn clip_backward(
    min: Option<f32>,
    max: Option<f32>,
    inputs: &[Option<&Tensor>],
    dy: &[f32],
) -> R<Vec<f32>> {
    let x = input(inputs, 0)?;
    let bound = |attr: &Option<f32>, i: usize| {
        attr.or_else(|| {
            inputs
                .get(i)
                .copied()
                .flatten()
                .and_then(|t| t.to_f64s().first().map(|&v| v as f32))
        })
    };
    let (lo, hi) = (bound(&min, 1), bound(&max, 2));
    let xs = floats(x, "X")?;
    let dx = xs
        .iter()
        .zip(dy)
        .map(|(&v, &g)| {
            let inside = lo.is_none_or(|l| v >= l) && hi.is_none_or(|h| v <= h);
            if inside {
                g
            } else {
                0.0
            }
        })
        .collect::<Vec<_>>();
    Ok(dx)
}

/// Softmax's (or log-softmax's) input gradient, from its output alone.
pub(crate) fn softmax_backward(
    (axis, log, flatten): (i64, bool, bool),
    y: &Tensor,
    dy: &[f32],
) -> R<Vec<f32>> {
    let (outer, width, inner) = softmax_layout(&y.shape, axis, flatten)?;
    let ys = floats(y, "Y")?;
    let mut dx = vec![0.0; ys.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * width + k) * inner + i;
            if log {
                let sum: f32 = (0..width).map(|k| dy[at(k)]).sum();
                for k in 0..width {
                    dx[at(k)] = dy[at(k)] - ys[at(k)].exp() * sum;
                }
            } else {
                let dot: f32 = (0..width).map(|k| dy[at(k)] * ys[at(k)]).sum();
                for k in 0..width {
                    dx[at(k)] = ys[at(k)] * (dy[at(k)] - dot);
                }
            }
        }
    }
    Ok(dx)
}

/// Where's gradients: the output's to the chosen operand of each element, unbroadcast.
pub(crate) fn where_backward(inputs: &[Option<&Tensor>], y: &Tensor, dy: &[f32]) -> R<InputGrads> {
    let (n, x) = (inputs.len(), input(inputs, 0)?);
    let (c, a, b) = (x, input(inputs, 1)?, input(inputs, 2)?);
    let cond: Vec<f64> = c.to_f64s();
    let mask: Vec<bool> = t::broadcast(&c.shape, &y.shape)
        .map(|i| cond[i] != 0.0)
        .collect();
    let da: Vec<f32> = dy
        .iter()
        .zip(&mask)
        .map(|(&g, &m)| if m { g } else { 0.0 })
        .collect();
    let db: Vec<f32> = dy
        .iter()
        .zip(&mask)
        .map(|(&g, &m)| if m { 0.0 } else { g })
        .collect();
    let mut out = grads(n);
    if a.is_float() {
        out[1] = Some(t::unbroadcast(&da, &y.shape, &a.shape));
    }
    if b.is_float() {
        out[2] = Some(t::unbroadcast(&db, &y.shape, &b.shape));
    }
    Ok(out)
}

/// The derivative of `u` at the input whose output is `y`, for the ops whose backward
/// reads their output alone ([`Op::backward_reads`]).
fn output_derivative(u: Unary, y: f32) -> f32 {
    match u {
        Unary::Relu => f32::from(u8::from(y > 0.0)),
        Unary::Sigmoid => y * (1.0 - y),
        Unary::Tanh => 1.0 - y * y,
        Unary::Sqrt => 0.5 / y,
        Unary::Exp => y,
        Unary::Reciprocal => -y * y,
        // Not one of them: the gradient checks (`tests/grad.rs`) fail on it.
        _ => f32::NAN,
    }
}

fn unary_derivative(u: Unary, x: f32, y: f32) -> f32 {
    match u {
        Unary::LeakyRelu { alpha } => {
            if x >= 0.0 {
                1.0
            } else {
                alpha
            }
        }
        Unary::HardSigmoid { alpha, beta } => {
            let v = alpha * x + beta;
            if v > 0.0 && v < 1.0 {
                alpha
            } else {
                0.0
            }
        }
        Unary::HardSwish => {
            if x < -3.0 {
                0.0
            } else if x > 3.0 {
                1.0
            } else {
                (2.0 * x + 3.0) / 6.0
            }
        }
        Unary::Erf => 2.0 / std::f32::consts::PI.sqrt() * (-x * x).exp(),
        Unary::Neg => -1.0,
        Unary::Log => 1.0 / x,
        Unary::Abs => sign(x),
        Unary::Softplus => 1.0 / (1.0 + (-x).exp()),
        Unary::Softsign => 1.0 / ((1.0 + x.abs()) * (1.0 + x.abs())),
        Unary::Elu { alpha } => {
            if x > 0.0 {
                1.0
            } else {
                alpha * x.exp()
            }
        }
        Unary::Selu { alpha, gamma } => {
            if x > 0.0 {
                gamma
            } else {
                gamma * alpha * x.exp()
            }
        }
        Unary::Sin => x.cos(),
        Unary::Cos => -x.sin(),
        Unary::Tan => 1.0 + y * y,
        Unary::Asin => 1.0 / (1.0 - x * x).sqrt(),
        Unary::Acos => -1.0 / (1.0 - x * x).sqrt(),
        Unary::Atan => 1.0 / (1.0 + x * x),
        Unary::Sinh => x.cosh(),
        Unary::Cosh => x.sinh(),
        Unary::Asinh => 1.0 / (x * x + 1.0).sqrt(),
        Unary::Acosh => 1.0 / (x * x - 1.0).sqrt(),
        Unary::Atanh => 1.0 / (1.0 - x * x),
        Unary::Mish => {
            // d/dx x·tanh(sp(x)) = tanh(sp) + x·(1 − tanh²(sp))·sigmoid(x).
            let t = unary_value(Unary::Softplus, x).tanh();
            t + x * (1.0 - t * t) / (1.0 + (-x).exp())
        }
        Unary::Celu { alpha } => {
            if x > 0.0 {
                1.0
            } else {
                (x / alpha).exp()
            }
        }
        Unary::ThresholdedRelu { alpha } => {
            if x > alpha {
                1.0
            } else {
                0.0
            }
        }
        Unary::Shrink { lambd, .. } => {
            if x.abs() > lambd {
                1.0
            } else {
                0.0
            }
        }
        u if u.is_step() => 0.0,
        _ => f32::NAN,
    }
}

/// The gradients of `p ∘ q` with respect to `p` and `q`, given the output's `g`.
fn binary_derivatives(b: Binary, p: f32, q: f32, g: f32) -> (f32, f32) {
    match b {
        Binary::Add => (g, g),
        Binary::Sub => (g, -g),
        Binary::Mul => (g * q, g * p),
        Binary::Div => (g / q, -g * p / (q * q)),
        Binary::Pow => (g * q * p.powf(q - 1.0), g * p.ln() * p.powf(q)),
        // p − q·k with k = ⌊p/q⌋ (Mod) or trunc(p/q) (Fmod), constant between its steps.
        Binary::Mod => (g, -g * (p / q).floor()),
        Binary::Fmod => (g, -g * (p / q).trunc()),
        Binary::PRelu => {
            if p >= 0.0 {
                (g, 0.0)
            } else {
                (g * q, g * p)
            }
        }
        _ => (0.0, 0.0),
    }
}

pub(crate) fn binary_backward(
    b: Binary,
    x: &Tensor,
    z: &Tensor,
    y: &Tensor,
    dy: &[f32],
) -> R<InputGrads> {
    let mut out = grads(2);
    if b.is_boolean() {
        return Ok(out);
    }
    // A sum or difference reads shapes alone ([`Op::backward_reads`]).
    if let Binary::Add | Binary::Sub = b {
        let negated: Vec<f32>;
        let dz = match b {
            Binary::Sub => {
                negated = dy.iter().map(|g| -g).collect();
                &negated
            }
            _ => dy,
        };
        if x.is_float() {
            out[0] = Some(t::unbroadcast(dy, &y.shape, &x.shape));
        }
        if z.is_float() {
            out[1] = Some(t::unbroadcast(dz, &y.shape, &z.shape));
        }
        return Ok(out);
    }
    // Both operands whole and float (a residual add): elementwise, with no index vectors
    // or widened copies (the general path below took 30 ns per element at 800 k elements).
    if let (Some(p), Some(q), true) = (x.floats(), z.floats(), x.shape == z.shape) {
        if x.shape == y.shape {
            let (da, dc): (Vec<f32>, Vec<f32>) = dy
                .iter()
                .zip(p.iter().zip(q))
                .map(|(&g, (&p, &q))| binary_derivatives(b, p, q, g))
                .unzip();
            out[0] = Some(da);
            out[1] = Some(dc);
            return Ok(out);
        }
    }
    let (a, c) = (x.to_f64s(), z.to_f64s());
    let ia: Vec<usize> = t::broadcast(&x.shape, &y.shape).collect();
    let ic: Vec<usize> = t::broadcast(&z.shape, &y.shape).collect();
    let mut da = vec![0.0f32; dy.len()];
    let mut dc = vec![0.0f32; dy.len()];
    for k in 0..dy.len() {
        let (gp, gq) = binary_derivatives(b, a[ia[k]] as f32, c[ic[k]] as f32, dy[k]);
        da[k] = gp;
        dc[k] = gq;
    }
    if x.is_float() {
        out[0] = Some(t::unbroadcast(&da, &y.shape, &x.shape));
    }
    if z.is_float() {
        out[1] = Some(t::unbroadcast(&dc, &y.shape, &z.shape));
    }
    Ok(out)
}
