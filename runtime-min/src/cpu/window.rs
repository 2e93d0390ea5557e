//! Window operators on host tensors, forward and backward: 1-d and 2-d convolution (and its
//! transpose) and pooling, with their geometry (3-d windows are [`super::volume`]'s).

use ralpc_ir::{Conv, ConvTranspose, Padding, Pool, PoolKind};

use super::grad::{grads, InputGrads};
use super::kernels::{Conv2d, Pool2d};
use super::ops::{floats, inconsistent, input, operands, optional, unsupported, Mode, Saved, R};
use super::tensor::{self as t, Tensor};

/// Zero padding `[top, left, bottom, right]` and output size of a window op.
#[allow(clippy::too_many_arguments, reason = "one window axis pair")]
pub(crate) fn window_padding(
    padding: &Padding,
    input: (usize, usize),
    kernel: (usize, usize),
    stride: (usize, usize),
    dilation: (usize, usize),
    ceil: bool,
    one_d: bool,
) -> R<([usize; 4], (usize, usize))> {
    let span = |k: usize, d: usize| (k - 1) * d + 1;
    let pads = match padding {
        Padding::Explicit(p) if p.is_empty() => [0; 4],
        Padding::Explicit(p) if one_d && p.len() == 2 => [0, p[0] as usize, 0, p[1] as usize],
        Padding::Explicit(p) if p.len() == 4 => {
            [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
        }
        Padding::Explicit(p) => {
            return Err(operands(format!("pads {p:?} do not fit the spatial rank")))
        }
        Padding::Valid => [0; 4],
        Padding::SameUpper | Padding::SameLower => {
            let total = |i: usize, k: usize, s: usize, d: usize| {
                ((i.div_ceil(s) - 1) * s + span(k, d)).saturating_sub(i)
            };
            let (th, tw) = (
                total(input.0, kernel.0, stride.0, dilation.0),
                total(input.1, kernel.1, stride.1, dilation.1),
            );
            if *padding == Padding::SameUpper {
                [th / 2, tw / 2, th - th / 2, tw - tw / 2]
            } else {
                [th - th / 2, tw - tw / 2, th / 2, tw / 2]
            }
        }
    };
    let out = |i: usize, k: usize, s: usize, d: usize, pb: usize, pe: usize| -> R<usize> {
        let room = (i + pb + pe)
            .checked_sub(span(k, d))
            .ok_or_else(|| operands("the window is larger than the padded input"))?;
        let mut n = if ceil { room.div_ceil(s) } else { room / s } + 1;
        // A ceil-mode window must start inside the input or its leading padding.
        if ceil && (n - 1) * s >= i + pb {
            n -= 1;
        }
        Ok(n)
    };
    Ok((
        pads,
        (
            out(input.0, kernel.0, stride.0, dilation.0, pads[0], pads[2])?,
            out(input.1, kernel.1, stride.1, dilation.1, pads[1], pads[3])?,
        ),
    ))
}

/// `(N, C, H, W)` of an NCHW or NCL tensor, and whether it is 1-d.
pub(crate) fn spatial(shape: &[usize]) -> R<(usize, usize, (usize, usize), bool)> {
    match *shape {
        [n, c, l] => Ok((n, c, (1, l), true)),
        [n, c, h, w] => Ok((n, c, (h, w), false)),
        _ => Err(unsupported(format!(
            "the CPU backend runs this op on 1-d and 2-d windows; this input has shape {shape:?}"
        ))),
    }
}

pub(crate) fn pair(v: &Option<Vec<u64>>, one_d: bool, default: usize) -> R<(usize, usize)> {
    match v.as_deref() {
        None => Ok((default, default)),
        Some([x]) if one_d => Ok((1, *x as usize)),
        Some([y, x]) if !one_d => Ok((*y as usize, *x as usize)),
        Some(other) => Err(operands(format!("{other:?} does not fit the spatial rank"))),
    }
}

pub(crate) fn out_shape(n: usize, c: usize, (h, w): (usize, usize), one_d: bool) -> Vec<usize> {
    if one_d {
        vec![n, c, w]
    } else {
        vec![n, c, h, w]
    }
}

/// The geometry of a convolution of `x` by `w`.
pub(crate) fn conv_geometry(c: &Conv, x: &[usize], w: &[usize]) -> R<(Conv2d, bool)> {
    let (n, ch, input, one_d) = spatial(x)?;
    let kernel = if one_d {
        (
            1,
            *w.get(2)
                .ok_or_else(|| operands("the weight has no kernel axis"))?,
        )
    } else {
        (
            *w.get(2)
                .ok_or_else(|| operands("the weight has no kernel axes"))?,
            *w.get(3)
                .ok_or_else(|| operands("the weight has no kernel axes"))?,
        )
    };
    let stride = pair(&c.strides, one_d, 1)?;
    let dilation = pair(&c.dilations, one_d, 1)?;
    let (padding, _) = window_padding(&c.padding, input, kernel, stride, dilation, false, one_d)?;
    let groups = c.group as usize;
    if groups == 0 || ch % groups != 0 || w[0] % groups != 0 || w[1] * groups != ch {
        return Err(operands(format!(
            "input channels {ch}, weight {w:?} and group {groups} do not agree"
        )));
    }
    Ok((
        Conv2d {
            batch: n,
            in_channels: ch,
            out_channels: w[0],
            input,
            kernel,
            stride,
            dilation,
            padding,
            groups,
        },
        one_d,
    ))
}

/// A 1-d or 2-d convolution; in inference mode by the fastest algorithm, which may round
/// more ([`Conv2d::infer`]).
pub(crate) fn conv(c: &Conv, inputs: &[Option<&Tensor>], mode: Mode) -> R<Tensor> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let (g, one_d) = conv_geometry(c, &x.shape, &w.shape)?;
    let (oh, ow) = g.output();
    let mut y = vec![0.0; g.batch * g.out_channels * oh * ow];
    let bias = optional(inputs, 2).map(|b| floats(b, "bias")).transpose()?;
    let (x, w) = (floats(x, "X")?, floats(w, "W")?);
    match mode {
        Mode::Inference => g.infer(x, w, bias, &mut y),
        Mode::Training => g.forward(x, w, bias, &mut y),
    }
    Ok(Tensor::f32(
        out_shape(g.batch, g.out_channels, (oh, ow), one_d),
        y,
    ))
}

pub(crate) fn conv_transpose(c: &ralpc_ir::ConvTranspose, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let (g, one_d) = conv_transpose_geometry(c, &x.shape, &w.shape)?;
    let (n, out_channels, out_hw) = (g.batch, g.in_channels, g.input);
    let mut y = vec![0.0; n * out_channels * out_hw.0 * out_hw.1];
    g.transpose(floats(x, "X")?, floats(w, "W")?, &mut y);
    if let Some(b) = optional(inputs, 2) {
        let b = floats(b, "B")?;
        for (i, v) in y.iter_mut().enumerate() {
            *v += b[(i / (out_hw.0 * out_hw.1)) % out_channels];
        }
    }
    Ok(Tensor::f32(out_shape(n, out_channels, out_hw, one_d), y))
}

/// The convolution whose input gradient a ConvTranspose of input `x_shape` and weight
/// `w_shape` computes: its input is the ConvTranspose's output (`in_channels × input`),
/// its output the ConvTranspose's input; and whether the op is 1-D.
pub(crate) fn conv_transpose_geometry(
    c: &ralpc_ir::ConvTranspose,
    x_shape: &[usize],
    w_shape: &[usize],
) -> R<(Conv2d, bool)> {
    let (n, ch, input_hw, one_d) = spatial(x_shape)?;
    let groups = c.conv.group as usize;
    if w_shape.len() != x_shape.len() || w_shape[0] != ch || groups == 0 || ch % groups != 0 {
        return Err(operands(format!(
            "input {x_shape:?} and weight {w_shape:?} do not agree"
        )));
    }
    let out_channels = w_shape[1] * groups;
    let kernel = if one_d {
        (1, w_shape[2])
    } else {
        (w_shape[2], w_shape[3])
    };
    let stride = pair(&c.conv.strides, one_d, 1)?;
    let dilation = pair(&c.conv.dilations, one_d, 1)?;
    let extra = pair(&c.output_padding, one_d, 0)?;
    let span = |k: usize, d: usize| (k - 1) * d + 1;
    // Pads as the spec computes them, from an explicit output shape when there is one.
    let explicit = |p: &[u64]| -> R<[usize; 4]> {
        match p.len() {
            0 => Ok([0; 4]),
            2 if one_d => Ok([0, p[0] as usize, 0, p[1] as usize]),
            4 => Ok([p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]),
            _ => Err(operands(format!("pads {p:?} do not fit the spatial rank"))),
        }
    };
    let full = |i: usize, k: usize, s: usize, d: usize, e: usize| s * (i - 1) + e + span(k, d);
    let target = match (&c.output_shape, &c.conv.padding) {
        (Some(shape), _) => Some(pair(&Some(shape.clone()), one_d, 1)?),
        (None, Padding::SameUpper | Padding::SameLower) => {
            Some((input_hw.0 * stride.0, input_hw.1 * stride.1))
        }
        _ => None,
    };
    let full_hw = (
        full(input_hw.0, kernel.0, stride.0, dilation.0, extra.0),
        full(input_hw.1, kernel.1, stride.1, dilation.1, extra.1),
    );
    let (padding, out_hw) = match target {
        Some((oh, ow)) => {
            // A target beyond the full size is reached by rows the convolution never reads.
            let (th, tw) = (full_hw.0.saturating_sub(oh), full_hw.1.saturating_sub(ow));
            let pads = if c.conv.padding == Padding::SameLower {
                [th - th / 2, tw - tw / 2, th / 2, tw / 2]
            } else {
                [th / 2, tw / 2, th - th / 2, tw - tw / 2]
            };
            (pads, (oh, ow))
        }
        None => {
            let pads = match &c.conv.padding {
                Padding::Explicit(p) => explicit(p)?,
                _ => [0; 4],
            };
            let out = (
                full_hw
                    .0
                    .checked_sub(pads[0] + pads[2])
                    .ok_or_else(|| operands("the padding exceeds the output"))?,
                full_hw
                    .1
                    .checked_sub(pads[1] + pads[3])
                    .ok_or_else(|| operands("the padding exceeds the output"))?,
            );
            (pads, out)
        }
    };
    // The convolution whose input gradient this is: input = our output, output = our input.
    let g = Conv2d {
        batch: n,
        in_channels: out_channels,
        out_channels: ch,
        input: out_hw,
        kernel,
        stride,
        dilation,
        padding,
        groups,
    };
    if g.output() != input_hw {
        return Err(operands("the output shape does not invert the convolution"));
    }
    Ok((g, one_d))
}

/// The geometry of a pooling of `x`.
pub(crate) fn pool_geometry(p: &Pool, x: &[usize]) -> R<(Pool2d, bool, (usize, usize))> {
    let (n, c, input, one_d) = spatial(x)?;
    let kernel = pair(&Some(p.kernel.clone()), one_d, 1)?;
    let stride = pair(&p.strides, one_d, 1)?;
    let dilation = pair(&p.dilations, one_d, 1)?;
    let (padding, output) = window_padding(
        &p.padding,
        input,
        kernel,
        stride,
        dilation,
        p.ceil_mode,
        one_d,
    )?;
    Ok((
        Pool2d {
            planes: n * c,
            input,
            kernel,
            stride,
            dilation,
            padding,
            output,
        },
        one_d,
        (n, c),
    ))
}

pub(crate) fn pool(p: &Pool, x: &Tensor) -> R<(Vec<Tensor>, Saved)> {
    let (g, one_d, (n, c)) = pool_geometry(p, &x.shape)?;
    let xs = floats(x, "X")?;
    let mut y = vec![0.0; g.planes * g.output.0 * g.output.1];
    let saved = match p.kind {
        PoolKind::Max => Saved::Argmax(g.max(xs, &mut y)),
        PoolKind::Average => {
            g.average(p.count_include_pad, xs, &mut y);
            Saved::None
        }
    };
    Ok((
        vec![Tensor::f32(out_shape(n, c, g.output, one_d), y)],
        saved,
    ))
}

pub(crate) fn global_pool(kind: PoolKind, x: &Tensor) -> R<Tensor> {
    if x.shape.len() < 3 {
        return Err(operands(format!(
            "global pooling needs N×C×spatial, got {:?}",
            x.shape
        )));
    }
    let planes = x.shape[0] * x.shape[1];
    let area = t::numel(&x.shape[2..]).max(1);
    let xs = floats(x, "X")?;
    let y = xs
        .chunks(area)
        .map(|p| match kind {
            PoolKind::Max => p.iter().copied().fold(f32::NEG_INFINITY, f32::max),
            PoolKind::Average => p.iter().sum::<f32>() / area as f32,
        })
        .collect::<Vec<_>>();
    debug_assert_eq!(y.len(), planes);
    let mut shape = x.shape.clone();
    shape[2..].iter_mut().for_each(|d| *d = 1);
    Ok(Tensor::f32(shape, y))
}

/// A 1-d or 2-d convolution's gradients: its input's, its weight's and its bias's.
pub(crate) fn conv_backward(c: &Conv, inputs: &[Option<&Tensor>], dy: &[f32]) -> R<InputGrads> {
    let (n, x) = (inputs.len(), input(inputs, 0)?);
    let w = input(inputs, 1)?;
    let (g, _) = conv_geometry(c, &x.shape, &w.shape)?;
    let mut dx = vec![0.0; x.len()];
    let mut dw = vec![0.0; w.len()];
    let has_bias = inputs.get(2).copied().flatten().is_some();
    let mut db = vec![0.0; if has_bias { g.out_channels } else { 0 }];
    g.backward(
        floats(x, "X")?,
        floats(w, "W")?,
        dy,
        Some(&mut dx),
        &mut dw,
        has_bias.then_some(&mut db[..]),
    );
    let mut out = grads(n);
    out[0] = Some(dx);
    out[1] = Some(dw);
    if has_bias {
        out[2] = Some(db);
    }
    Ok(out)
}

/// A 1-d or 2-d transposed convolution's gradients. It is `y = Jᵀx` for the convolution
/// `J` whose input gradient it computes: `dx = J·dy` (that convolution's forward pass on
/// `dy`), and `dW` is its weight gradient with `dy` as the input and `x` as the output's
/// gradient.
pub(crate) fn conv_transpose_backward(
    c: &ConvTranspose,
    inputs: &[Option<&Tensor>],
    dy: &[f32],
) -> R<InputGrads> {
    let (n, x) = (inputs.len(), input(inputs, 0)?);
    let w = input(inputs, 1)?;
    let (g, _) = conv_transpose_geometry(c, &x.shape, &w.shape)?;
    let (xs, ws) = (floats(x, "X")?, floats(w, "W")?);
    let mut dx = vec![0.0; x.len()];
    g.forward(dy, ws, None, &mut dx);
    let mut dw = vec![0.0; w.len()];
    g.backward(dy, ws, xs, None, &mut dw, None);
    let mut out = grads(n);
    out[0] = Some(dx);
    out[1] = Some(dw);
    if inputs.get(2).copied().flatten().is_some() {
        let pixels = g.input.0 * g.input.1;
        let mut db = vec![0.0; g.in_channels];
        for (i, plane) in dy.chunks(pixels).enumerate() {
            db[i % g.in_channels] += plane.iter().sum::<f32>();
        }
        out[2] = Some(db);
    }
    Ok(out)
}

/// A 1-d or 2-d pool's input gradient: a max pool's through the argmax its forward pass
/// saved, an average pool's spread over each window.
pub(crate) fn pool_backward(p: &Pool, x: &Tensor, saved: &Saved, dy: &[f32]) -> R<Vec<f32>> {
    let (g, _, _) = pool_geometry(p, &x.shape)?;
    let mut dx = vec![0.0; x.len()];
    match (p.kind, saved) {
        (PoolKind::Max, Saved::Argmax(argmax)) => {
            super::kernels::max_pool_backward(argmax, dy, &mut dx);
        }
        (PoolKind::Average, _) => g.average_backward(p.count_include_pad, dy, &mut dx),
        _ => return Err(inconsistent("max pooling saved no argmax")),
    }
    Ok(dx)
}

/// A global pool's input gradient: an average's spread evenly over each plane, a max's
/// to each plane's first largest element.
pub(crate) fn global_pool_backward(kind: PoolKind, x: &Tensor, dy: &[f32]) -> R<Vec<f32>> {
    let area = t::numel(&x.shape[2..]).max(1);
    if kind == PoolKind::Average {
        return Ok((0..x.len()).map(|i| dy[i / area] / area as f32).collect());
    }
    let xs = floats(x, "X")?;
    let mut dx = vec![0.0; xs.len()];
    for (p, (plane, d)) in xs.chunks(area).zip(dx.chunks_mut(area)).enumerate() {
        let best = (0..plane.len()).fold(0, |b, i| if plane[i] > plane[b] { i } else { b });
        d[best] = dy[p];
    }
    Ok(dx)
}
