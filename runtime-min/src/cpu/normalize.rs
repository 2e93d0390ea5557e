//! Instance and group normalization, forward and backward: each sample's channels cut into
//! groups (one channel each for instance normalization), each group normalized over its
//! channels' pixels, then a scale and a bias per channel (or, as opset 18's
//! GroupNormalization has them, per group).
//!
//! A group of a sample is a row of layer normalization ([`kernels::layer_norm`]): the
//! backward pass is that row's, after the affine part's.

use super::grad::InputGrads;
use super::kernels;
use super::ops::{floats, input, R};
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
            return Err(format!(
                "normalization needs [N, C, pixels…], got {:?}",
                x.shape
            ));
        };
        let groups = groups.unwrap_or(c);
        if groups == 0 || c % groups != 0 {
            return Err(format!("{c} channels do not divide into {groups} groups"));
        }
        let scale = floats(input(inputs, 1)?, "the scale")?;
        let bias = floats(input(inputs, 2)?, "the bias")?;
        let per_channel = scale.len() == c && bias.len() == c;
        if !per_channel && (scale.len() != groups || bias.len() != groups) {
            return Err(format!(
                "the scale ({}) and the bias ({}) must have one value per channel ({c}) or \
                 per group ({groups})",
                scale.len(),
                bias.len()
            ));
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
        return Err(format!(
            "the output gradient has {} values where {} were expected",
            dy.len(),
            xhat.len()
        ));
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
