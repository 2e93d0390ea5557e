//! Folding the contents of small tensors (shape arithmetic).
//!
//! Each function returns `None` when the result is not foldable (an input without
//! content, a non-monomial symbolic result, a tensor too large): the value then simply has
//! no known content, which is only an error where a consumer needs it.

use std::sync::Arc;

use super::{InferError, Scalar, ValueType, MAX_FOLD_ELEMENTS};
use crate::dtype::DType;
use crate::op::{Binary, Op, ReduceKind, Unary, Variadic};
use crate::shape::{Dim, Shape};

type Content = Option<Arc<[Scalar]>>;

fn row_major_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
    }
    strides
}

/// Index into a broadcast input for the flat output index `flat`.
fn broadcast_index(flat: u64, out: &[u64], input: &[u64]) -> usize {
    let out_strides = row_major_strides(out);
    let in_strides = row_major_strides(input);
    let offset = out.len() - input.len();
    let mut idx = 0u64;
    for (i, (&stride, &extent)) in out_strides.iter().zip(out).enumerate() {
        let coord = if extent == 0 {
            0
        } else {
            (flat / stride) % extent
        };
        if i >= offset {
            let j = i - offset;
            if input[j] != 1 {
                idx += coord * in_strides[j];
            }
        }
    }
    idx as usize
}

fn sizes(t: &ValueType) -> Option<Vec<u64>> {
    t.shape.as_sizes()
}

pub(super) fn concat(inputs: &[Option<&ValueType>]) -> Content {
    let mut out = Vec::new();
    for t in inputs {
        let t = (*t)?;
        if t.shape.rank() != 1 {
            return None;
        }
        out.extend(t.content.as_ref()?.iter().cloned());
    }
    (out.len() as u64 <= MAX_FOLD_ELEMENTS).then(|| out.into())
}

/// Slice of a content; `picks` lists (axis, start, step) of the sliced axes.
pub(super) fn slice(x: &ValueType, picks: &[(usize, i64, i64)], out: &Shape) -> Content {
    let content = x.content.as_ref()?;
    let in_sizes = sizes(x)?;
    let out_sizes = out.as_sizes()?;
    let total = out.known_numel().filter(|&n| n <= MAX_FOLD_ELEMENTS)?;
    // Per axis: the first input index and the step.
    let mut first = vec![0i64; in_sizes.len()];
    let mut steps = vec![1i64; in_sizes.len()];
    for &(axis, start, step) in picks {
        let n = *in_sizes.get(axis)? as i64;
        let s = if start < 0 { start + n } else { start };
        first[axis] = if step > 0 {
            s.clamp(0, n)
        } else {
            s.clamp(0, n - 1)
        };
        steps[axis] = step;
    }
    let strides = row_major_strides(&in_sizes);
    (0..total)
        .map(|f| {
            let mut rest = f;
            let mut at = 0i64;
            for d in (0..out_sizes.len()).rev() {
                let i = (rest % out_sizes[d]) as i64;
                rest /= out_sizes[d];
                at += (first[d] + i * steps[d]) * strides[d] as i64;
            }
            content.get(usize::try_from(at).ok()?).cloned()
        })
        .collect::<Option<Vec<_>>>()
        .map(Into::into)
}

/// A content with its axes permuted (`perm[k]` is the input axis of output axis `k`).
pub(super) fn transpose(x: &ValueType, perm: &[usize]) -> Content {
    let content = x.content.as_ref()?;
    let in_sizes = sizes(x)?;
    let strides = row_major_strides(&in_sizes);
    let out_sizes: Vec<u64> = perm.iter().map(|&p| in_sizes[p]).collect();
    let total: u64 = out_sizes.iter().product();
    (0..total)
        .map(|f| {
            let mut rest = f;
            let mut at = 0;
            for d in (0..out_sizes.len()).rev() {
                at += (rest % out_sizes[d]) * strides[perm[d]];
                rest /= out_sizes[d];
            }
            content.get(at as usize).cloned()
        })
        .collect::<Option<Vec<_>>>()
        .map(Into::into)
}

pub(super) fn expand(x: &ValueType, out: &Shape) -> Content {
    let content = x.content.as_ref()?;
    let out_sizes = out.as_sizes()?;
    let total = out.known_numel().filter(|&n| n <= MAX_FOLD_ELEMENTS)?;
    let in_sizes = sizes(x)?;
    Some(
        (0..total)
            .map(|f| content[broadcast_index(f, &out_sizes, &in_sizes)].clone())
            .collect(),
    )
}

pub(super) fn gather(x: &ValueType, idx: &ValueType, axis: usize) -> Result<Content, InferError> {
    let (Some(data), Some(indices)) = (x.content.as_ref(), idx.content.as_ref()) else {
        return Ok(None);
    };
    // Folding is only needed for shape vectors: 1-D data.
    if x.shape.rank() != 1 || axis != 0 {
        return Ok(None);
    }
    let n = data.len() as i64;
    let mut out = Vec::with_capacity(indices.len());
    for i in indices.iter() {
        let Some(i) = i.as_i64() else { return Ok(None) };
        let j = if i < 0 { i + n } else { i };
        if !(0..n).contains(&j) {
            return Err(InferError::Mismatch {
                reason: format!("index {i} is out of range for an axis of size {n}"),
            });
        }
        out.push(data[j as usize].clone());
    }
    Ok(Some(out.into()))
}

fn int_op(op: Binary, l: &Dim, r: &Dim) -> Option<Scalar> {
    Some(match op {
        Binary::Add => Scalar::Int(l.checked_add(r)?),
        Binary::Sub => Scalar::Int(l.checked_sub(r)?),
        Binary::Mul => Scalar::Int(l.checked_mul(r)?),
        Binary::Div => match (l.as_known(), r.as_known()) {
            (Some(a), Some(b)) if b != 0 => Scalar::Int(Dim::known(a.div_euclid(b))),
            _ => Scalar::Int(l.div_exact(r)?),
        },
        Binary::Equal => Scalar::Int(Dim::known(match (l.as_known(), r.as_known()) {
            (Some(a), Some(b)) => (a == b) as i64,
            _ if l == r => 1,
            // Symbols are sizes, never the -1 / 0 markers they are compared with.
            (None, Some(b)) | (Some(b), None) if b <= 0 => 0,
            _ => return None,
        })),
        Binary::Less | Binary::LessOrEqual | Binary::Greater | Binary::GreaterOrEqual => {
            let (a, c) = (l.as_known()?, r.as_known()?);
            Scalar::Int(Dim::known(i64::from(op.compare(a, c))))
        }
        Binary::And | Binary::Or | Binary::Xor => {
            let (a, c) = (l.as_known()? != 0, r.as_known()? != 0);
            Scalar::Int(Dim::known(i64::from(op.logic(a, c))))
        }
        Binary::Mod | Binary::Fmod => {
            let (a, c) = (l.as_known()?, r.as_known()?);
            Scalar::Int(Dim::known(op.remainder(a, c)?))
        }
        Binary::Pow | Binary::PRelu => return None,
    })
}

fn float_op(b: Binary, l: f64, r: f64) -> Scalar {
    match b {
        Binary::Add => Scalar::Float(l + r),
        Binary::Sub => Scalar::Float(l - r),
        Binary::Mul => Scalar::Float(l * r),
        Binary::Div => Scalar::Float(l / r),
        Binary::Pow => Scalar::Float(l.powf(r)),
        Binary::PRelu => Scalar::Float(if l >= 0.0 { l } else { r * l }),
        Binary::Mod | Binary::Fmod => {
            Scalar::Float(f64::from(b.float_remainder(l as f32, r as f32)))
        }
        Binary::Equal => Scalar::Int(Dim::known((l == r) as i64)),
        Binary::Less | Binary::LessOrEqual | Binary::Greater | Binary::GreaterOrEqual => {
            Scalar::Int(Dim::known(i64::from(b.compare(l, r))))
        }
        Binary::And | Binary::Or | Binary::Xor => {
            Scalar::Int(Dim::known(i64::from(b.logic(l != 0.0, r != 0.0))))
        }
    }
}

pub(super) fn elementwise(op: &Op, inputs: &[Option<&ValueType>], out: &Shape) -> Content {
    let total = out.known_numel().filter(|&n| n <= MAX_FOLD_ELEMENTS)?;
    let out_sizes = out.as_sizes()?;
    let present: Vec<&ValueType> = inputs.iter().copied().collect::<Option<_>>()?;
    let contents: Vec<&Arc<[Scalar]>> = present
        .iter()
        .map(|t| t.content.as_ref())
        .collect::<Option<_>>()?;
    let in_sizes: Vec<Vec<u64>> = present.iter().map(|t| sizes(t)).collect::<Option<_>>()?;
    let at = |k: usize, f: u64| &contents[k][broadcast_index(f, &out_sizes, &in_sizes[k])];
    let mut result = Vec::with_capacity(total as usize);
    for f in 0..total {
        let v = match op {
            Op::Binary(b) => match (at(0, f), at(1, f)) {
                (Scalar::Int(l), Scalar::Int(r)) => int_op(*b, l, r)?,
                (l, r) => float_op(*b, l.as_f64()?, r.as_f64()?),
            },
            Op::Where => {
                let c = at(0, f).as_i64()?;
                if c != 0 {
                    at(1, f).clone()
                } else {
                    at(2, f).clone()
                }
            }
            Op::Variadic(v) => {
                let mut acc = at(0, f).clone();
                for k in 1..contents.len() {
                    acc = variadic(*v, &acc, at(k, f))?;
                }
                if *v == Variadic::Mean {
                    acc = Scalar::Float(acc.as_f64()? / contents.len() as f64);
                }
                acc
            }
            _ => return None,
        };
        result.push(v);
    }
    Some(result.into())
}

/// Neg, Abs or Sign of known numbers (shape arithmetic negates axis counts).
pub(super) fn sign_op(u: Unary, content: &[Scalar]) -> Content {
    content
        .iter()
        .map(|s| match s {
            Scalar::Int(d) => {
                let v = d.as_known()?;
                let r = match u {
                    Unary::Neg => v.checked_neg()?,
                    Unary::Abs => v.checked_abs()?,
                    _ => v.signum(),
                };
                Some(Scalar::Int(Dim::known(r)))
            }
            Scalar::Float(x) => Some(Scalar::Float(match u {
                Unary::Neg => -x,
                Unary::Abs => x.abs(),
                _ if *x == 0.0 => 0.0,
                _ => x.signum(),
            })),
        })
        .collect()
}

/// One step of a variadic fold (Mean sums; the caller divides).
fn variadic(v: Variadic, l: &Scalar, r: &Scalar) -> Option<Scalar> {
    Some(match (v, l, r) {
        (Variadic::Sum | Variadic::Mean, Scalar::Int(l), Scalar::Int(r)) => {
            Scalar::Int(l.checked_add(r)?)
        }
        (Variadic::Sum | Variadic::Mean, l, r) => Scalar::Float(l.as_f64()? + r.as_f64()?),
        (Variadic::Max | Variadic::Min, Scalar::Int(a), Scalar::Int(b)) => {
            let (p, q) = (a.as_known()?, b.as_known()?);
            let pick = if v == Variadic::Max {
                p.max(q)
            } else {
                p.min(q)
            };
            Scalar::Int(Dim::known(pick))
        }
        (Variadic::Max, l, r) => Scalar::Float(l.as_f64()?.max(r.as_f64()?)),
        (Variadic::Min, l, r) => Scalar::Float(l.as_f64()?.min(r.as_f64()?)),
    })
}

/// A reduction of a 1-D content over its only axis (shape arithmetic: the product of a
/// shape's dimensions, their sum); `None` for other kinds or ranks.
pub(super) fn reduce(kind: ReduceKind, x: &ValueType) -> Content {
    if x.shape.rank() != 1 {
        return None;
    }
    let c = x.content.as_ref()?;
    let (first, rest) = c.split_first()?;
    let mut acc = first.clone();
    for s in rest {
        acc = match (kind, &acc, s) {
            (ReduceKind::Sum, Scalar::Int(l), Scalar::Int(r)) => Scalar::Int(l.checked_add(r)?),
            (ReduceKind::Prod, Scalar::Int(l), Scalar::Int(r)) => Scalar::Int(l.checked_mul(r)?),
            (ReduceKind::Max, l, r) => variadic(Variadic::Max, l, r)?,
            (ReduceKind::Min, l, r) => variadic(Variadic::Min, l, r)?,
            (ReduceKind::Sum, l, r) => Scalar::Float(l.as_f64()? + r.as_f64()?),
            (ReduceKind::Prod, l, r) => Scalar::Float(l.as_f64()? * r.as_f64()?),
            _ => return None,
        };
    }
    Some(vec![acc].into())
}

pub(super) fn cast(content: &Arc<[Scalar]>, to: DType) -> Content {
    content
        .iter()
        .map(|s| match (s, to.is_integer()) {
            (Scalar::Int(d), true) => Some(Scalar::Int(d.clone())),
            (Scalar::Float(f), true) => Some(Scalar::Int(Dim::known(f.trunc() as i64))),
            (s, false) => s.as_f64().map(Scalar::Float),
        })
        .collect::<Option<Vec<_>>>()
        .map(Into::into)
}
