//! Elementwise operators on host tensors: unary functions, broadcasting binary ones,
//! softmax.

use ralpc_ir::{Binary, Unary};

use super::kernels;
use super::ops::{axis_of, R};
use super::tensor::{self as t, Data, Tensor};

pub(crate) fn clip(v: f32, lo: Option<f32>, hi: Option<f32>) -> f32 {
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
        (Data::I64(_), _) => Err("this function needs a floating-point input".into()),
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
    let shape = t::broadcast_shapes(&x.shape, &y.shape)
        .ok_or_else(|| format!("shapes {:?} and {:?} do not broadcast", x.shape, y.shape))?;
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
                    Binary::Div => p.checked_div(q).ok_or("integer division by zero")?,
                    Binary::Pow => p.wrapping_pow(q.clamp(0, u32::MAX as i64) as u32),
                    Binary::Mod | Binary::Fmod => {
                        b.remainder(p, q).ok_or("integer division by zero in Mod")?
                    }
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
