//! Instance and group normalization, forward and backward: each sample's channels cut into
//! groups (one channel each for instance normalization), each group normalized over its
//! channels' pixels, then a scale and a bias per channel (or, as opset 18's
//! GroupNormalization has them, per group).
//!
//! A group of a sample is a row of layer normalization ([`kernels::layer_norm`]): the
//! backward pass is that row's, after the affine part's.

use super::grad::{grads, InputGrads};
use super::kernels;
use super::ops::{axis_of, floats, inconsistent, input, operands, optional, Mode, Saved, R};
use super::tensor::{self as t, Tensor};

/// How the input's rows (sample × group) and their elements map to the affine parameters.
struct Groups<'a> {
    x: &'a Tensor,
    scale: &'a [f32],
    bias: &'a [f32],
    groups: usize,
    /// Elements of one group: its channels' pixels.
    width: usize,
    /// Pixels of one channel.
    pixels: usize,
    /// Whether the scale and bias are per channel (else per group).
    per_channel: bool,
}

impl<'a> Groups<'a> {
    fn new(inputs: &[Option<&'a Tensor>], groups: Option<usize>) -> R<Groups<'a>> {
        let x = input(inputs, 0)?;
        let &[_, c, ..] = x.shape.as_slice() else {
            return Err(operands(format!(
                "normalization needs [N, C, pixels…], got {:?}",
                x.shape
            )));
        };
        let groups = groups.unwrap_or(c);
        if groups == 0 || c % groups != 0 {
            return Err(operands(format!(
                "{c} channels do not divide into {groups} groups"
            )));
        }
        let scale = floats(input(inputs, 1)?, "the scale")?;
        let bias = floats(input(inputs, 2)?, "the bias")?;
        let per_channel = scale.len() == c && bias.len() == c;
        if !per_channel && (scale.len() != groups || bias.len() != groups) {
            return Err(operands(format!(
                "the scale ({}) and the bias ({}) must have one value per channel ({c}) or \
                 per group ({groups})",
                scale.len(),
                bias.len()
            )));
        }
        let pixels = t::numel(&x.shape[2..]).max(1);
        Ok(Groups {
            x,
            scale,
            bias,
            groups,
            width: c / groups * pixels,
            pixels,
            per_channel,
        })
    }

    /// The parameter index of element `j` of row `row`.
    fn param(&self, row: usize, j: usize) -> usize {
        let g = row % self.groups;
        match self.per_channel {
            true => g * (self.width / self.pixels) + j / self.pixels,
            false => g,
        }
    }

    /// Every row normalized, and each row's mean and inverse deviation.
    fn normalized(&self, epsilon: f32) -> R<(Vec<f32>, kernels::RowStats)> {
        let values = floats(self.x, "the input")?;
        let (ones, zeros) = (vec![1.0f32; self.width], vec![0.0f32; self.width]);
        let mut xhat = vec![0.0f32; values.len()];
        let stats = kernels::layer_norm(self.width, epsilon, values, &ones, &zeros, &mut xhat);
        Ok((xhat, stats))
    }
}

/// Forward: `scale·x̂ + bias` (`groups` `None`: one per channel, instance normalization).
pub(crate) fn group_norm(
    inputs: &[Option<&Tensor>],
    groups: Option<usize>,
    epsilon: f32,
) -> R<Tensor> {
    let g = Groups::new(inputs, groups)?;
    let (mut y, _) = g.normalized(epsilon)?;
    for (row, values) in y.chunks_mut(g.width).enumerate() {
        for (j, v) in values.iter_mut().enumerate() {
            let k = g.param(row, j);
            *v = g.scale[k] * *v + g.bias[k];
        }
    }
    Ok(Tensor::f32(g.x.shape.clone(), y))
}

/// Backward: the scale's and the bias's, then the input's through each row's layer
/// normalization.
pub(crate) fn group_norm_backward(
    inputs: &[Option<&Tensor>],
    groups: Option<usize>,
    epsilon: f32,
    dy: &[f32],
) -> R<InputGrads> {
    let g = Groups::new(inputs, groups)?;
    let (xhat, stats) = g.normalized(epsilon)?;
    if dy.len() != xhat.len() {
        return Err(operands(format!(
            "the output gradient has {} values where {} were expected",
            dy.len(),
            xhat.len()
        )));
    }
    let mut dscale = vec![0.0f32; g.scale.len()];
    let mut dbias = vec![0.0f32; g.bias.len()];
    let mut dxhat = vec![0.0f32; dy.len()];
    for (row, ((d, v), out)) in dy
        .chunks(g.width)
        .zip(xhat.chunks(g.width))
        .zip(dxhat.chunks_mut(g.width))
        .enumerate()
    {
        for (j, ((&d, &v), o)) in d.iter().zip(v).zip(out).enumerate() {
            let k = g.param(row, j);
            dscale[k] += d * v;
            dbias[k] += d;
            *o = d * g.scale[k];
        }
    }
    let ones = vec![1.0f32; g.width];
    let mut dx = vec![0.0f32; dy.len()];
    let (mut unused_scale, mut unused_bias) = (vec![0.0f32; g.width], vec![0.0f32; g.width]);
    kernels::layer_norm_backward(
        g.width,
        floats(g.x, "the input")?,
        &ones,
        (&stats.0, &stats.1),
        &dxhat,
        &mut dx,
        &mut unused_scale,
        &mut unused_bias,
    );
    Ok(vec![Some(dx), Some(dscale), Some(dbias)])
}

/// Sums a batch normalization's per-channel statistics over the ranks holding the other
/// samples of its batch (synchronized batch normalization); alone, nothing to add.
pub(crate) type BatchSums<'a> = &'a mut dyn FnMut(&mut [f64]) -> R<()>;

pub(crate) fn batch_norm(
    epsilon: f32,
    inputs: &[Option<&Tensor>],
    outputs: usize,
    mode: Mode,
) -> R<(Vec<Tensor>, Saved)> {
    batch_norm_synced(epsilon, inputs, outputs, mode, &mut |_| Ok(()))
}

/// [`batch_norm`] whose training-mode statistics are those of every rank's samples:
/// `sums` adds up what each holds ([`kernels::BatchNorm::sums`]).
pub(crate) fn batch_norm_synced(
    epsilon: f32,
    inputs: &[Option<&Tensor>],
    outputs: usize,
    mode: Mode,
    sums: BatchSums<'_>,
) -> R<(Vec<Tensor>, Saved)> {
    let x = input(inputs, 0)?;
    let params: Vec<&[f32]> = (1..5)
        .map(|i| floats(input(inputs, i)?, "a batch-norm parameter"))
        .collect::<R<_>>()?;
    let (gamma, beta, mean, var) = (params[0], params[1], params[2], params[3]);
    let channels = *x
        .shape
        .get(1)
        .ok_or_else(|| operands("the input has no channel axis"))?;
    if params.iter().any(|p| p.len() != channels) {
        return Err(operands(format!(
            "parameters must have {channels} elements"
        )));
    }
    let spatial = t::numel(&x.shape[2..]);
    let xs = floats(x, "X")?;
    let mut y = vec![0.0; xs.len()];
    let saved = match mode {
        Mode::Training => {
            let bn = kernels::BatchNorm {
                channels,
                spatial,
                epsilon,
            };
            let mut batch = bn.sums(xs);
            sums(&mut batch)?;
            let (m, s) = bn.normalize(xs, gamma, beta, &mut y, &batch);
            Saved::Stats(m, s)
        }
        Mode::Inference => {
            // y = x·scale + shift per channel plane.
            let plane = spatial.max(1);
            for (i, (out, xs)) in y.chunks_mut(plane).zip(xs.chunks(plane)).enumerate() {
                let c = i % channels;
                let scale = gamma[c] / (var[c] + epsilon).sqrt();
                let shift = beta[c] - mean[c] * scale;
                for (o, &v) in out.iter_mut().zip(xs) {
                    *o = v * scale + shift;
                }
            }
            Saved::None
        }
    };
    let mut outs = vec![Tensor::f32(x.shape.clone(), y)];
    // Running statistics, when the node declares them, pass through unchanged.
    for i in 3..3 + outputs.saturating_sub(1).min(2) {
        outs.push(input(inputs, i)?.clone());
    }
    Ok((outs, saved))
}

pub(crate) fn layer_norm(
    axis: i64,
    epsilon: f32,
    inputs: &[Option<&Tensor>],
    outputs: usize,
) -> R<(Vec<Tensor>, Saved)> {
    let x = input(inputs, 0)?;
    let a = axis_of(axis, x.shape.len())?;
    let width = t::numel(&x.shape[a..]);
    let gamma = floats(input(inputs, 1)?, "Scale")?;
    let zeros;
    let beta = match optional(inputs, 2) {
        Some(b) => floats(b, "B")?,
        None => {
            zeros = vec![0.0; width];
            &zeros
        }
    };
    if gamma.len() != width || beta.len() != width {
        return Err(operands(format!("Scale and B must have {width} elements")));
    }
    let xs = floats(x, "X")?;
    let mut y = vec![0.0; xs.len()];
    let (mean, inv_std) = kernels::layer_norm(width, epsilon, xs, gamma, beta, &mut y);
    let mut stat_shape = x.shape.clone();
    stat_shape[a..].iter_mut().for_each(|d| *d = 1);
    let mut outs = vec![Tensor::f32(x.shape.clone(), y)];
    if outputs > 1 {
        outs.push(Tensor::f32(stat_shape.clone(), mean.clone()));
    }
    if outputs > 2 {
        outs.push(Tensor::f32(stat_shape, inv_std.clone()));
    }
    Ok((outs, Saved::Stats(mean, inv_std)))
}

/// The channel window of local response normalization at channel `c`.
pub(crate) fn lrn_window(c: usize, size: usize, channels: usize) -> std::ops::Range<usize> {
    let lo = c.saturating_sub((size - 1) / 2);
    let hi = (c + size.div_ceil(2)).min(channels);
    lo..hi
}

/// Local response normalization's layout: channels and pixels per channel of `x`.
fn lrn_layout(x: &Tensor) -> R<(usize, usize)> {
    let channels = *x
        .shape
        .get(1)
        .ok_or_else(|| operands("the input has no channel axis"))?;
    Ok((channels, t::numel(x.shape.get(2..).unwrap_or(&[]))))
}

/// Each element's channel, and a closure from a channel to the element at it (same sample
/// and pixel).
fn lrn_site(i: usize, channels: usize, spatial: usize) -> (usize, impl Fn(usize) -> usize) {
    let (plane, c, s) = (
        i / (channels * spatial),
        (i / spatial) % channels,
        i % spatial,
    );
    (c, move |k| (plane * channels + k) * spatial + s)
}

/// Each element's scale `bias + alpha/size · Σ x²` over its channel window.
fn lrn_scales(
    xs: &[f32],
    (channels, spatial): (usize, usize),
    size: usize,
    alpha: f32,
    bias: f32,
) -> Vec<f32> {
    (0..xs.len())
        .map(|i| {
            let (c, at) = lrn_site(i, channels, spatial);
            let sum: f32 = lrn_window(c, size, channels)
                .map(|k| xs[at(k)].powi(2))
                .sum();
            bias + alpha / size as f32 * sum
        })
        .collect()
}

pub(crate) fn lrn(x: &Tensor, size: usize, alpha: f32, beta: f32, bias: f32) -> R<Tensor> {
    let xs = floats(x, "X")?;
    let scales = lrn_scales(xs, lrn_layout(x)?, size, alpha, bias);
    let y = xs
        .iter()
        .zip(&scales)
        .map(|(&v, &d)| v / d.powf(beta))
        .collect();
    Ok(Tensor::f32(x.shape.clone(), y))
}

/// Batch normalization's backward pass, whose batch terms are those of every rank's
/// samples: `sums` adds up what each holds ([`kernels::BatchNorm::gradient_sums`]).
pub(crate) fn batch_norm_synced_backward(
    epsilon: f32,
    inputs: &[Option<&Tensor>],
    saved: &Saved,
    dy: &[f32],
    sums: BatchSums<'_>,
) -> R<InputGrads> {
    let Saved::Stats(mean, inv_std) = saved else {
        return Err(inconsistent(
            "batch normalization's backward needs training-mode statistics",
        ));
    };
    let x = input(inputs, 0)?;
    let gamma = floats(input(inputs, 1)?, "scale")?;
    let channels = gamma.len();
    let bn = kernels::BatchNorm {
        channels,
        spatial: t::numel(&x.shape[2..]),
        epsilon,
    };
    let xs = floats(x, "X")?;
    let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; channels], vec![0.0; channels]);
    let mut batch = bn.gradient_sums(xs, (mean, inv_std), dy);
    bn.parameter_gradients(&batch, &mut dg, &mut db);
    sums(&mut batch)?;
    bn.input_gradient(xs, gamma, (mean, inv_std), dy, &mut dx, &batch);
    let mut out = grads(inputs.len());
    out[0] = Some(dx);
    out[1] = Some(dg);
    out[2] = Some(db);
    Ok(out)
}

/// Layer normalization's backward pass, from the statistics its forward pass saved.
pub(crate) fn layer_norm_backward(
    axis: i64,
    inputs: &[Option<&Tensor>],
    saved: &Saved,
    dy: &[f32],
) -> R<InputGrads> {
    let (n, x) = (inputs.len(), input(inputs, 0)?);
    let Saved::Stats(mean, inv_std) = saved else {
        return Err(inconsistent("layer normalization saved no statistics"));
    };
    let a = axis_of(axis, x.shape.len())?;
    let width = t::numel(&x.shape[a..]);
    let gamma = floats(input(inputs, 1)?, "Scale")?;
    let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; width], vec![0.0; width]);
    kernels::layer_norm_backward(
        width,
        floats(x, "X")?,
        gamma,
        (mean, inv_std),
        dy,
        &mut dx,
        &mut dg,
        &mut db,
    );
    let mut out = grads(n);
    out[0] = Some(dx);
    out[1] = Some(dg);
    if inputs.get(2).copied().flatten().is_some() {
        out[2] = Some(db);
    }
    Ok(out)
}

/// Local response normalization's input gradient: each output depends on every input of
/// its channel window.
pub(crate) fn lrn_backward(
    (size, alpha, beta, bias): (u64, f32, f32, f32),
    x: &Tensor,
    dy: &[f32],
) -> R<Vec<f32>> {
    let size = size as usize;
    let (channels, spatial) = lrn_layout(x)?;
    let xs = floats(x, "X")?;
    let scales = lrn_scales(xs, (channels, spatial), size, alpha, bias);
    let mut dx = vec![0.0; xs.len()];
    for j in 0..xs.len() {
        dx[j] += dy[j] * scales[j].powf(-beta);
        // y_j depends on every x_k in its window through s_j.
        let common =
            -2.0 * alpha * beta / size as f32 * dy[j] * xs[j] * scales[j].powf(-beta - 1.0);
        let (c, at) = lrn_site(j, channels, spatial);
        for k in lrn_window(c, size, channels) {
            dx[at(k)] += common * xs[at(k)];
        }
    }
    Ok(dx)
}
