//! Ops that move elements without arithmetic — Tile, DepthToSpace, SpaceToDepth — and
//! the selections ArgMax/ArgMin and TopK, forward and backward.
//!
//! Each rearrangement is a walk of the input in the output's order: a higher-rank view of
//! the output with the input's stride along each of its axes ([`t::positions`]). The
//! forward pass gathers along it; the backward pass adds the output's gradient back along
//! the same walk (Tile visits an input element once per repeat).

use super::grad::InputGrads;
use super::ops::{input, operands, R};
use super::tensor::{self as t, Data, Tensor};

/// A rearrangement: the output's shape, and the view (shape, input strides) that walks
/// the input in the output's order.
struct Walk {
    shape: Vec<usize>,
    view: Vec<usize>,
    strides: Vec<isize>,
}

impl Walk {
    fn positions(&self) -> t::Positions {
        t::positions(&self.view, &self.strides, 0)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.select(self.positions()).reshaped(self.shape.clone())
    }

    fn backward(&self, x: &Tensor, dy: &[f32]) -> Vec<f32> {
        let mut dx = vec![0.0f32; x.len()];
        for (p, &g) in self.positions().zip(dy) {
            dx[p] += g;
        }
        dx
    }
}

fn strides(shape: &[usize]) -> Vec<isize> {
    t::strides(shape).iter().map(|&s| s as isize).collect()
}

/// Tile: the output `[r₀·x₀, r₁·x₁, …]` is the view `[r₀, x₀, r₁, x₁, …]` whose repeat
/// axes step nowhere.
fn tile_walk(inputs: &[Option<&Tensor>]) -> R<Walk> {
    let x = input(inputs, 0)?;
    let repeats = input(inputs, 1)?.to_i64s();
    if repeats.len() != x.shape.len() || repeats.iter().any(|&r| r < 0) {
        return Err(operands(format!(
            "repeats {repeats:?} do not tile an input of shape {:?}",
            x.shape
        )));
    }
    let st = strides(&x.shape);
    let mut walk = Walk {
        shape: Vec::new(),
        view: Vec::new(),
        strides: Vec::new(),
    };
    for ((&d, &r), &s) in x.shape.iter().zip(&repeats).zip(&st) {
        walk.shape.push(d * r as usize);
        walk.view.extend([r as usize, d]);
        walk.strides.extend([0, s]);
    }
    Ok(walk)
}

/// `[N, C, H, W]` of a 4-d input.
fn nchw(x: &Tensor) -> R<[usize; 4]> {
    match *x.shape.as_slice() {
        [n, c, h, w] => Ok([n, c, h, w]),
        ref other => Err(operands(format!(
            "the input must be [N, C, H, W], got {other:?}"
        ))),
    }
}

/// DepthToSpace: output `(n, c', h·b + i, w·b + j)` in the order of the view
/// `[N, C', H, b, W, b]`, read from channel `(i·b + j)·C' + c'` (DCR) or `c'·b² + i·b + j`
/// (CRD).
fn depth_to_space_walk(x: &Tensor, b: usize, crd: bool) -> R<Walk> {
    let [n, c, h, w] = nchw(x)?;
    if b == 0 || c % (b * b) != 0 {
        return Err(operands(format!(
            "{c} channels do not divide into blocks of {b}×{b}"
        )));
    }
    let out_c = c / (b * b);
    let plane = (h * w) as isize;
    let (channel, row, column) = if crd {
        ((b * b) as isize * plane, b as isize * plane, plane)
    } else {
        (plane, (b * out_c) as isize * plane, out_c as isize * plane)
    };
    Ok(Walk {
        shape: vec![n, out_c, h * b, w * b],
        view: vec![n, out_c, h, b, w, b],
        strides: vec![c as isize * plane, channel, w as isize, row, 1, column],
    })
}

/// SpaceToDepth: output `((i·b + j)·C + c, h', w')` in the order of the view
/// `[N, b, b, C, H/b, W/b]`, read from pixel `(h'·b + i, w'·b + j)`.
fn space_to_depth_walk(x: &Tensor, b: usize) -> R<Walk> {
    let [n, c, h, w] = nchw(x)?;
    if b == 0 || h % b != 0 || w % b != 0 {
        return Err(operands(format!(
            "{h}×{w} pixels do not divide into blocks of {b}×{b}"
        )));
    }
    let (plane, (bi, wi)) = ((h * w) as isize, (b as isize, w as isize));
    Ok(Walk {
        shape: vec![n, c * b * b, h / b, w / b],
        view: vec![n, b, b, c, h / b, w / b],
        strides: vec![c as isize * plane, wi, 1, plane, bi * wi, bi],
    })
}

/// Tile forward.
pub(crate) fn tile(inputs: &[Option<&Tensor>]) -> R<Tensor> {
    Ok(tile_walk(inputs)?.forward(input(inputs, 0)?))
}

/// Tile backward: each input element's gradient sums its copies'.
pub(crate) fn tile_backward(inputs: &[Option<&Tensor>], dy: &[f32]) -> R<InputGrads> {
    let mut g = vec![None; inputs.len()];
    g[0] = Some(tile_walk(inputs)?.backward(input(inputs, 0)?, dy));
    Ok(g)
}

/// DepthToSpace (`space == false`: SpaceToDepth) forward.
pub(crate) fn to_space(inputs: &[Option<&Tensor>], b: usize, crd: bool, space: bool) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let walk = match space {
        true => depth_to_space_walk(x, b, crd)?,
        false => space_to_depth_walk(x, b)?,
    };
    Ok(walk.forward(x))
}

/// DepthToSpace (`space == false`: SpaceToDepth) backward: the permutation undone.
pub(crate) fn to_space_backward(
    inputs: &[Option<&Tensor>],
    b: usize,
    crd: bool,
    space: bool,
    dy: &[f32],
) -> R<InputGrads> {
    let x = input(inputs, 0)?;
    let walk = match space {
        true => depth_to_space_walk(x, b, crd)?,
        false => space_to_depth_walk(x, b)?,
    };
    let mut g = vec![None; inputs.len()];
    g[0] = Some(walk.backward(x, dy));
    Ok(g)
}

/// ArgMax (`max`) or ArgMin along `axis`: the first index of the extreme, or the last
/// with `select_last`. NaN is never an extreme.
pub(crate) fn arg_extreme(
    x: &Tensor,
    max: bool,
    axis: i64,
    keepdims: bool,
    select_last: bool,
) -> R<Tensor> {
    let rank = x.shape.len();
    let a = t::axis(axis, rank).ok_or_else(|| operands(format!("axis {axis} is out of range")))?;
    let (outer, n, inner) = (
        t::numel(&x.shape[..a]),
        x.shape[a],
        t::numel(&x.shape[a + 1..]),
    );
    if n == 0 {
        return Err(operands("ArgMax/ArgMin of an empty axis"));
    }
    let values: Vec<f64> = match &x.data {
        Data::F32(v) => v.iter().map(|&v| f64::from(v)).collect(),
        Data::I64(v) => v.iter().map(|&v| v as f64).collect(),
    };
    let better = |candidate: f64, best: f64| {
        let (strictly, equal) = match max {
            true => (candidate > best, candidate == best),
            false => (candidate < best, candidate == best),
        };
        strictly || (select_last && equal) || best.is_nan()
    };
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| values[(o * n + k) * inner + i];
            let mut best = 0;
            for k in 1..n {
                if !at(k).is_nan() && better(at(k), at(best)) {
                    best = k;
                }
            }
            out.push(best as i64);
        }
    }
    let mut shape = x.shape.clone();
    if keepdims {
        shape[a] = 1;
    } else {
        shape.remove(a);
    }
    Ok(Tensor::i64(shape, out))
}

/// `x` viewed as `[outer, n, inner]` around `axis`.
fn around(x: &Tensor, axis: i64) -> R<(usize, usize, usize, usize)> {
    let a = t::axis(axis, x.shape.len())
        .ok_or_else(|| operands(format!("axis {axis} is out of range")))?;
    Ok((
        a,
        t::numel(&x.shape[..a]),
        x.shape[a],
        t::numel(&x.shape[a + 1..]),
    ))
}

/// TopK: the `k` largest (or smallest) elements along `axis`, sorted, equal ones in the
/// order of their indices (ONNX's rule, which makes a router's choice deterministic), NaN
/// after every number either way (ONNX leaves it open; PyTorch puts it first for the
/// largest); and their indices.
pub(crate) fn top_k(
    inputs: &[Option<&Tensor>],
    axis: i64,
    largest: bool,
    k: Option<i64>,
) -> R<Vec<Tensor>> {
    let x = input(inputs, 0)?;
    let k = match k {
        Some(k) => k,
        None => match input(inputs, 1)?.to_i64s().as_slice() {
            &[k] => k,
            other => return Err(operands(format!("k must be one integer, got {other:?}"))),
        },
    };
    let (a, outer, n, inner) = around(x, axis)?;
    let k = usize::try_from(k).ok().filter(|&k| k <= n).ok_or_else(|| {
        operands(format!(
            "k {k} must be from 0 to the {n} elements along axis {a}"
        ))
    })?;
    // Better first: by value (NaN last, -0 equal to +0), then by index; integers compared
    // as integers.
    let order = |p: usize, q: usize| -> std::cmp::Ordering {
        let by_value = match &x.data {
            Data::F32(v) => match (v[p].is_nan(), v[q].is_nan()) {
                (false, false) => v[p].partial_cmp(&v[q]).unwrap_or(std::cmp::Ordering::Equal),
                (nan_p, nan_q) => return nan_p.cmp(&nan_q),
            },
            Data::I64(v) => v[p].cmp(&v[q]),
        };
        if largest {
            by_value.reverse()
        } else {
            by_value
        }
    };
    let mut picked = vec![0usize; outer * k * inner];
    let mut lane: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            lane.clear();
            lane.extend(0..n);
            // Stable: equal values keep their indices' order.
            lane.sort_by(|&p, &q| order(at(p), at(q)));
            for (j, &from) in lane[..k].iter().enumerate() {
                picked[(o * k + j) * inner + i] = (o * n + from) * inner + i;
            }
        }
    }
    let mut shape = x.shape.clone();
    shape[a] = k;
    let index_of = |p: usize| ((p / inner) % n) as i64;
    let indices = Tensor::i64(shape.clone(), picked.iter().map(|&p| index_of(p)).collect());
    let selected = x.pick(shape, picked.into_iter());
    Ok(vec![selected, indices])
}

/// TopK backward: each value's gradient to the element its index names.
pub(crate) fn top_k_backward(
    inputs: &[Option<&Tensor>],
    indices: Option<&Tensor>,
    axis: i64,
    dy: &[f32],
) -> R<InputGrads> {
    let x = input(inputs, 0)?;
    let indices = indices.ok_or_else(|| operands("TopK's backward needs its indices"))?;
    let (a, _, n, inner) = around(x, axis)?;
    let k = indices.shape.get(a).copied().unwrap_or(0);
    let mut expected = x.shape.clone();
    expected[a] = k;
    if indices.shape != expected || dy.len() != indices.len() {
        return Err(operands(format!(
            "TopK's indices {:?} and gradient ({} values) do not fit its input {:?}",
            indices.shape,
            dy.len(),
            x.shape
        )));
    }
    let mut dx = vec![0.0f32; x.len()];
    for (p, (&j, &g)) in indices.to_i64s().iter().zip(dy).enumerate() {
        let (o, i) = (p / (k * inner), p % inner);
        let j = usize::try_from(j)
            .ok()
            .filter(|&j| j < n)
            .ok_or_else(|| operands(format!("TopK index {j} is out of range")))?;
        dx[(o * n + j) * inner + i] += g;
    }
    let mut g = vec![None; inputs.len()];
    g[0] = Some(dx);
    Ok(g)
}

/// ReverseSequence: for every output element, the input element it copies — each
/// sample's first `sequence_lens[b]` time steps in reverse, the rest in place.
fn reversed_positions(inputs: &[Option<&Tensor>], batch_axis: usize) -> R<Vec<usize>> {
    let x = input(inputs, 0)?;
    let lens = input(inputs, 1)?.to_i64s();
    let (time_axis, shape) = (1 - batch_axis, &x.shape);
    if shape.len() < 2 || lens.len() != shape[batch_axis] {
        return Err(operands(format!(
            "{} sequence lengths for an input of shape {shape:?} (samples on axis {batch_axis})",
            lens.len()
        )));
    }
    let (steps, inner) = (shape[time_axis], t::numel(&shape[2..]));
    let st = t::strides(shape);
    let mut positions = Vec::with_capacity(x.len());
    for i in 0..shape[0] {
        for j in 0..shape[1] {
            let (step, sample) = if time_axis == 0 { (i, j) } else { (j, i) };
            let len = usize::try_from(lens[sample])
                .ok()
                .filter(|&l| l <= steps)
                .ok_or_else(|| {
                    operands(format!(
                        "sequence length {} is not in 0..={steps}",
                        lens[sample]
                    ))
                })?;
            let from = if step < len { len - 1 - step } else { step };
            let (a, b) = if time_axis == 0 { (from, j) } else { (i, from) };
            let base = a * st[0] + b * st[1];
            positions.extend(base..base + inner);
        }
    }
    Ok(positions)
}

/// ReverseSequence forward.
pub(crate) fn reverse_sequence(inputs: &[Option<&Tensor>], batch_axis: usize) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let positions = reversed_positions(inputs, batch_axis)?;
    Ok(x.pick(x.shape.clone(), positions.into_iter()))
}

/// ReverseSequence backward: the same permutation, undone.
pub(crate) fn reverse_sequence_backward(
    inputs: &[Option<&Tensor>],
    batch_axis: usize,
    dy: &[f32],
) -> R<InputGrads> {
    let x = input(inputs, 0)?;
    let mut dx = vec![0.0f32; x.len()];
    for (p, &g) in reversed_positions(inputs, batch_axis)?.into_iter().zip(dy) {
        dx[p] += g;
    }
    let mut grads = vec![None; inputs.len()];
    grads[0] = Some(dx);
    Ok(grads)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(x: &Tensor, largest: bool, k: i64) -> (Vec<f64>, Vec<i64>) {
        let out = top_k(&[Some(x)], -1, largest, Some(k)).expect("top k");
        (out[0].to_f64s(), out[1].to_i64s())
    }

    #[test]
    fn top_k_ties_by_index_with_signed_zeros_equal_and_nan_last() {
        let x = Tensor::f32(vec![5], vec![3.0, -0.0, f32::NAN, 0.0, 3.0]);
        assert_eq!(top(&x, true, 4).1, [0, 4, 1, 3]);
        assert_eq!(top(&x, false, 4).1, [1, 3, 0, 4]);
        assert!(top(&x, true, 5).0[4].is_nan());
        // Integers compare as integers, beyond what an f64 holds exactly.
        let big = Tensor::i64(vec![3], vec![i64::MAX - 1, i64::MAX, i64::MIN]);
        assert_eq!(top(&big, true, 2).1, [1, 0]);
        assert_eq!(top(&big, false, 1).1, [2]);
        assert!(top_k(&[Some(&x)], 0, true, Some(6)).is_err());
    }
}
