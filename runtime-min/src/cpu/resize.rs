//! Resampling (ONNX Resize and Upsample): the taps each output coordinate reads, and the
//! separable resampling along one axis with its transpose.

use ralpc_ir::Resize;

use super::ops::{axis_of, floats, input, operands, optional, R};
use super::tensor::{self as t, Tensor};

/// Per resized axis (in order), the input elements and weights each output coordinate
/// reads; axes that keep their size and read each element once are left out.
pub(crate) type ResizeTaps = Vec<(usize, Vec<Vec<(usize, f32)>>)>;

/// The taps of a Resize of an input of `shape`, from its sizes (when given) or scales.
pub(crate) fn resize_taps(
    r: &ralpc_ir::Resize,
    inputs: &[Option<&Tensor>],
    shape: &[usize],
) -> R<ResizeTaps> {
    let rank = shape.len();
    let axes: Vec<usize> = match &r.axes {
        Some(a) => a.iter().map(|&a| axis_of(a, rank)).collect::<R<_>>()?,
        None => (0..rank).collect(),
    };
    let given = |slot: usize| optional(inputs, slot).filter(|t| !t.is_empty());
    // (output size, scale) per resized axis.
    let targets: Vec<(usize, f64)> = if let Some(sizes) = r.slots.1.and_then(given) {
        let sizes = sizes.to_i64s();
        if sizes.len() != axes.len() {
            return Err(operands(format!(
                "sizes has {} values for {} axes",
                sizes.len(),
                axes.len()
            )));
        }
        axes.iter()
            .zip(sizes)
            .map(|(&a, n)| {
                let n = usize::try_from(n)
                    .map_err(|_| format!("size {n} is negative"))
                    .map_err(operands)?;
                Ok((n, n as f64 / shape[a].max(1) as f64))
            })
            .collect::<R<_>>()?
    } else {
        let scales = match &r.scales {
            Some(s) => s.iter().map(|&v| f64::from(v)).collect(),
            None => given(r.slots.0)
                .ok_or_else(|| operands("Resize needs scales or sizes"))?
                .to_f64s(),
        };
        if scales.len() != axes.len() {
            return Err(operands(format!(
                "scales has {} values for {} axes",
                scales.len(),
                axes.len()
            )));
        }
        axes.iter()
            .zip(scales)
            .map(|(&a, s)| ((shape[a] as f64 * s).floor() as usize, s))
            .collect()
    };
    Ok(axes
        .iter()
        .zip(targets)
        .filter_map(|(&a, (out, scale))| {
            let taps: Vec<Vec<(usize, f32)>> =
                (0..out).map(|j| r.taps(j, shape[a], out, scale)).collect();
            let identity =
                out == shape[a] && taps.iter().enumerate().all(|(j, t)| t[..] == [(j, 1.0)]);
            (!identity).then_some((a, taps))
        })
        .collect())
}

/// `data` of `shape` resampled along `axis`: output coordinate `j` is the weighted sum of
/// the input elements `taps[j]` names. `transposed` runs the transpose instead (the
/// gradient of the input from that of the output, `data` then being the latter).
pub(crate) fn resample(
    data: &[f32],
    shape: &[usize],
    axis: usize,
    taps: &[Vec<(usize, f32)>],
    transposed: bool,
) -> Vec<f32> {
    let (outer, inner) = (t::numel(&shape[..axis]), t::numel(&shape[axis + 1..]));
    let (n_in, n_out) = (shape[axis], taps.len());
    let mut out = vec![0.0; outer * if transposed { n_in } else { n_out } * inner];
    for o in 0..outer {
        for (j, tap) in taps.iter().enumerate() {
            for &(k, w) in tap {
                let (from, to) = if transposed {
                    (o * n_out + j, o * n_in + k)
                } else {
                    (o * n_in + k, o * n_out + j)
                };
                let src = &data[from * inner..][..inner];
                let dst = &mut out[to * inner..][..inner];
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d += w * v;
                }
            }
        }
    }
    out
}

/// Resize: each resampled axis in turn, from the taps its mode and scales give.
pub(crate) fn resize(r: &Resize, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let x = input(inputs, 0)?;
    let mut data = floats(x, "X")?.to_vec();
    let mut shape = x.shape.clone();
    for (axis, taps) in resize_taps(r, inputs, &x.shape)? {
        data = resample(&data, &shape, axis, &taps, false);
        shape[axis] = taps.len();
    }
    Ok(Tensor::f32(shape, data))
}

/// Resize's input gradient: back through each resampled axis, last first, from the shape
/// it produced.
pub(crate) fn resize_backward(
    r: &Resize,
    inputs: &[Option<&Tensor>],
    x: &Tensor,
    dy: &[f32],
) -> R<Vec<f32>> {
    let steps = resize_taps(r, inputs, &x.shape)?;
    let mut shapes = vec![x.shape.clone()];
    for (axis, taps) in &steps {
        let mut next = shapes[shapes.len() - 1].clone();
        next[*axis] = taps.len();
        shapes.push(next);
    }
    let mut g = dy.to_vec();
    for (k, (axis, taps)) in steps.iter().enumerate().rev() {
        g = resample(&g, &shapes[k], *axis, taps, true);
    }
    Ok(g)
}
