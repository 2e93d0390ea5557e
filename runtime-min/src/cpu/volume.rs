//! 3-d convolution, transposed convolution and pooling (N×C×D×H×W).
//!
//! A 3-d convolution is a sum over the kernel's depth of 2-d convolutions: output depth
//! `od` adds, for every kernel depth `kd` that lands inside the input, the 2-d convolution
//! of input depth `od·stride + kd·dilation − pad` by the kernel's slice `kd`. This reuses
//! the 2-d kernels (im2col + GEMM) forward and backward. Pooling walks its windows
//! directly, over any number of spatial axes.

use ralpc_ir::{Conv, ConvTranspose, Padding, Pool, PoolKind};

use super::grad::InputGrads;
use super::kernels::Conv2d;
use super::ops::{
    conv_geometry, conv_transpose_geometry, floats, inconsistent, input, operands, optional, Saved,
    R,
};
use super::tensor::{self as t, Tensor};

/// One window axis: its input size, kernel, stride, dilation, leading and trailing zero
/// padding, and output size.
#[derive(Clone, Copy, Debug)]
struct Axis {
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    begin: usize,
    end: usize,
    output: usize,
}

impl Axis {
    /// The input index tap `k` of output `o` reads, if inside the input.
    fn source(&self, o: usize, k: usize) -> Option<usize> {
        (o * self.stride + k * self.dilation)
            .checked_sub(self.begin)
            .filter(|&i| i < self.input)
    }

    /// Whether tap `k` of output `o` lies inside the padded input.
    fn padded(&self, o: usize, k: usize) -> bool {
        o * self.stride + k * self.dilation < self.begin + self.input + self.end
    }
}

/// The window axes of an op over spatial sizes `input` (as the 2-d geometry computes them:
/// explicit or automatic padding, ceil mode).
fn axes(
    padding: &Padding,
    input: &[usize],
    kernel: &[usize],
    strides: &Option<Vec<u64>>,
    dilations: &Option<Vec<u64>>,
    ceil: bool,
) -> R<Vec<Axis>> {
    let k = input.len();
    let per_axis = |v: &Option<Vec<u64>>, what: &str| -> R<Vec<usize>> {
        match v {
            None => Ok(vec![1; k]),
            Some(v) if v.len() == k => Ok(v.iter().map(|&x| x as usize).collect()),
            Some(v) => Err(operands(format!(
                "{what} {v:?} do not fit {k} spatial axes"
            ))),
        }
    };
    let (strides, dilations) = (
        per_axis(strides, "strides")?,
        per_axis(dilations, "dilations")?,
    );
    if kernel.len() != k {
        return Err(operands(format!(
            "kernel {kernel:?} does not fit {k} spatial axes"
        )));
    }
    (0..k)
        .map(|a| {
            let (i, kk, s, d) = (input[a], kernel[a], strides[a].max(1), dilations[a].max(1));
            let span = (kk.max(1) - 1) * d + 1;
            let (begin, end) = match padding {
                Padding::Explicit(p) if p.is_empty() => (0, 0),
                Padding::Explicit(p) if p.len() == 2 * k => (p[a] as usize, p[a + k] as usize),
                Padding::Explicit(p) => {
                    return Err(operands(format!("pads {p:?} do not fit {k} spatial axes")))
                }
                Padding::Valid => (0, 0),
                Padding::SameUpper | Padding::SameLower => {
                    let total = ((i.div_ceil(s).max(1) - 1) * s + span).saturating_sub(i);
                    if *padding == Padding::SameUpper {
                        (total / 2, total - total / 2)
                    } else {
                        (total - total / 2, total / 2)
                    }
                }
            };
            let room = (i + begin + end)
                .checked_sub(span)
                .ok_or("the window is larger than the padded input")
                .map_err(operands)?;
            let mut output = if ceil { room.div_ceil(s) } else { room / s } + 1;
            // A ceil-mode window must start inside the input or its leading padding.
            if ceil && (output - 1) * s >= i + begin {
                output -= 1;
            }
            Ok(Axis {
                input: i,
                kernel: kk,
                stride: s,
                dilation: d,
                begin,
                end,
                output,
            })
        })
        .collect()
}

/// Slice `at` of axis 2 of a `[a, b, depth, rest]` tensor, as `[a, b, rest]`.
fn depth_slice(x: &[f32], (a, depth, rest): Layout, at: usize) -> Vec<f32> {
    (0..a)
        .flat_map(|p| {
            let start = (p * depth + at) * rest;
            x[start..start + rest].iter().copied()
        })
        .collect()
}

/// Adds `src` (`[a, rest]`) into slice `at` of axis 2 of `dst` (`[a, depth, rest]`).
fn add_depth_slice(dst: &mut [f32], (a, depth, rest): Layout, at: usize, src: &[f32]) {
    for p in 0..a {
        let start = (p * depth + at) * rest;
        for (d, s) in dst[start..start + rest]
            .iter_mut()
            .zip(&src[p * rest..(p + 1) * rest])
        {
            *d += s;
        }
    }
}

/// A tensor seen as `(planes, depth, plane size)`.
type Layout = (usize, usize, usize);

/// The layouts of an op's input, kernel and output.
type Layouts = (Layout, Layout, Layout);

/// The five sizes of a 3-d input or kernel.
fn volume(shape: &[usize], what: &str) -> R<[usize; 5]> {
    <[usize; 5]>::try_from(shape)
        .map_err(|_| operands(format!("a 3-d {what} has 5 axes, not {shape:?}")))
}

/// Adds channel `i % channels`'s bias to the `i`-th run of `per_channel` outputs.
fn add_bias(y: &mut [f32], per_channel: usize, channels: usize, b: &[f32]) -> R<()> {
    if b.len() != channels {
        return Err(operands(format!(
            "the bias has {} values for {channels} channels",
            b.len()
        )));
    }
    for (i, chunk) in y.chunks_mut(per_channel.max(1)).enumerate() {
        let bias = b[i % channels];
        chunk.iter_mut().for_each(|v| *v += bias);
    }
    Ok(())
}

/// The bias gradient: each channel's sum of `dy` over its runs of `per_channel`.
fn bias_grad(dy: &[f32], per_channel: usize, channels: usize) -> Vec<f32> {
    let mut db = vec![0.0; channels];
    for (i, chunk) in dy.chunks(per_channel.max(1)).enumerate() {
        db[i % channels.max(1)] += chunk.iter().sum::<f32>();
    }
    db
}

/// The gradients of a convolution's input, weight and (when it has one) bias.
fn conv_grads(n: usize, dx: Vec<f32>, dw: Vec<f32>, db: Option<Vec<f32>>) -> InputGrads {
    let mut grads = vec![None; n];
    grads[0] = Some(dx);
    grads[1] = Some(dw);
    if let Some(slot) = grads.get_mut(2) {
        *slot = db;
    }
    grads
}

/// A 3-d convolution: its depth axis and the 2-d convolution of one depth slice.
struct Conv3d {
    depth: Axis,
    plane: Conv2d,
}

impl Conv3d {
    fn new(c: &Conv, x: &[usize], w: &[usize]) -> R<Conv3d> {
        let ([n, ch, d, h, wd], [m, cg, kd, kh, kw]) = (volume(x, "input")?, volume(w, "kernel")?);
        let depth = axes(
            &c.padding,
            &[d, h, wd],
            &[kd, kh, kw],
            &c.strides,
            &c.dilations,
            false,
        )?[0];
        // The 2-d convolution of one depth slice: the other two axes' parameters.
        let tail = |v: &Option<Vec<u64>>| v.as_ref().map(|v| v[1..].to_vec());
        let padding = match &c.padding {
            Padding::Explicit(p) if p.len() == 6 => Padding::Explicit(vec![p[1], p[2], p[4], p[5]]),
            other => other.clone(),
        };
        let plane = Conv {
            kernel: Some(vec![kh as u64, kw as u64]),
            strides: tail(&c.strides),
            dilations: tail(&c.dilations),
            padding,
            group: c.group,
        };
        let (plane, _) = conv_geometry(&plane, &[n, ch, h, wd], &[m, cg, kh, kw])?;
        Ok(Conv3d { depth, plane })
    }

    /// `(kd, id)` for every kernel depth output depth `od` reads.
    fn taps(&self, od: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.depth.kernel).filter_map(move |k| Some((k, self.depth.source(od, k)?)))
    }

    fn shapes(&self) -> Layouts {
        let g = &self.plane;
        let (oh, ow) = g.output();
        (
            (
                g.batch * g.in_channels,
                self.depth.input,
                g.input.0 * g.input.1,
            ),
            (
                g.out_channels * (g.in_channels / g.groups),
                self.depth.kernel,
                g.kernel.0 * g.kernel.1,
            ),
            (g.batch * g.out_channels, self.depth.output, oh * ow),
        )
    }
}

/// 3-d convolution forward.
pub(crate) fn conv(c: &Conv, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let g = Conv3d::new(c, &x.shape, &w.shape)?;
    let (xs, ws) = (floats(x, "X")?, floats(w, "W")?);
    let (x_shape, w_shape, y_shape) = g.shapes();
    let mut y = vec![0.0; y_shape.0 * y_shape.1 * y_shape.2];
    let mut plane = vec![0.0; y_shape.0 * y_shape.2];
    for od in 0..g.depth.output {
        for (kd, id) in g.taps(od) {
            plane.iter_mut().for_each(|v| *v = 0.0);
            g.plane.forward(
                &depth_slice(xs, x_shape, id),
                &depth_slice(ws, w_shape, kd),
                None,
                &mut plane,
            );
            add_depth_slice(&mut y, y_shape, od, &plane);
        }
    }
    if let Some(b) = optional(inputs, 2) {
        add_bias(
            &mut y,
            y_shape.1 * y_shape.2,
            g.plane.out_channels,
            floats(b, "bias")?,
        )?;
    }
    let (oh, ow) = g.plane.output();
    Ok(Tensor::f32(
        vec![g.plane.batch, g.plane.out_channels, g.depth.output, oh, ow],
        y,
    ))
}

/// 3-d convolution backward: each (output depth, kernel depth) pair's 2-d backward.
pub(crate) fn conv_backward(c: &Conv, inputs: &[Option<&Tensor>], dy: &[f32]) -> R<InputGrads> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let g = Conv3d::new(c, &x.shape, &w.shape)?;
    let (xs, ws) = (floats(x, "X")?, floats(w, "W")?);
    let (x_shape, w_shape, y_shape) = g.shapes();
    let mut dx = vec![0.0; xs.len()];
    let mut dw = vec![0.0; ws.len()];
    let (mut dx_plane, mut dw_plane) = (
        vec![0.0; x_shape.0 * x_shape.2],
        vec![0.0; w_shape.0 * w_shape.2],
    );
    for od in 0..g.depth.output {
        let dy_plane = depth_slice(dy, y_shape, od);
        for (kd, id) in g.taps(od) {
            dx_plane.iter_mut().for_each(|v| *v = 0.0);
            dw_plane.iter_mut().for_each(|v| *v = 0.0);
            g.plane.backward(
                &depth_slice(xs, x_shape, id),
                &depth_slice(ws, w_shape, kd),
                &dy_plane,
                Some(&mut dx_plane),
                &mut dw_plane,
                None,
            );
            add_depth_slice(&mut dx, x_shape, id, &dx_plane);
            add_depth_slice(&mut dw, w_shape, kd, &dw_plane);
        }
    }
    let db = optional(inputs, 2)
        .is_some()
        .then(|| bias_grad(dy, y_shape.1 * y_shape.2, g.plane.out_channels));
    Ok(conv_grads(inputs.len(), dx, dw, db))
}

/// For every output of a pooling, its taps: input positions (flat within the plane) and
/// how many taps lie inside the padded input.
struct Windows {
    axes: Vec<Axis>,
}

impl Windows {
    fn new(p: &Pool, x: &[usize]) -> R<Windows> {
        let kernel: Vec<usize> = p.kernel.iter().map(|&k| k as usize).collect();
        Ok(Windows {
            axes: axes(
                &p.padding,
                &x[2..],
                &kernel,
                &p.strides,
                &p.dilations,
                p.ceil_mode,
            )?,
        })
    }

    fn output(&self) -> Vec<usize> {
        self.axes.iter().map(|a| a.output).collect()
    }

    /// Calls `f(output index, taps inside the input, taps inside the padded input)` for
    /// every output of one plane.
    fn each(&self, mut f: impl FnMut(usize, &[usize], usize)) {
        let strides = t::strides(&self.axes.iter().map(|a| a.input).collect::<Vec<_>>());
        let kernel: Vec<usize> = self.axes.iter().map(|a| a.kernel).collect();
        let mut taps = Vec::new();
        let out = self.output();
        let mut at = vec![0usize; out.len()];
        for o in 0..t::numel(&out) {
            taps.clear();
            let mut padded = 0;
            let mut k = vec![0usize; kernel.len()];
            for _ in 0..t::numel(&kernel) {
                let mut flat = Some(0);
                let mut inside_pad = true;
                for (a, axis) in self.axes.iter().enumerate() {
                    inside_pad &= axis.padded(at[a], k[a]);
                    flat = match (flat, axis.source(at[a], k[a])) {
                        (Some(f), Some(i)) => Some(f + i * strides[a]),
                        _ => None,
                    };
                }
                padded += usize::from(inside_pad);
                taps.extend(flat);
                for d in (0..k.len()).rev() {
                    k[d] += 1;
                    if k[d] < kernel[d] {
                        break;
                    }
                    k[d] = 0;
                }
            }
            f(o, &taps, padded);
            for d in (0..at.len()).rev() {
                at[d] += 1;
                if at[d] < out[d] {
                    break;
                }
                at[d] = 0;
            }
        }
    }
}

/// Pooling over 3 or more spatial axes, forward; max pooling saves its argmax (flat into
/// the input).
pub(crate) fn pool(p: &Pool, x: &Tensor) -> R<(Tensor, Saved)> {
    let w = Windows::new(p, &x.shape)?;
    let xs = floats(x, "X")?;
    let (planes, area) = (x.shape[0] * x.shape[1], t::numel(&x.shape[2..]));
    let out = w.output();
    let per = t::numel(&out);
    let mut y = vec![0.0; planes * per];
    let mut argmax = vec![0u32; if p.kind == PoolKind::Max { y.len() } else { 0 }];
    for plane in 0..planes {
        let base = plane * area;
        w.each(|o, taps, padded| {
            let at = plane * per + o;
            match p.kind {
                PoolKind::Max => {
                    let best = taps.iter().copied().reduce(|b, i| {
                        if xs[base + i] > xs[base + b] {
                            i
                        } else {
                            b
                        }
                    });
                    if let Some(b) = best {
                        y[at] = xs[base + b];
                        argmax[at] = (base + b) as u32;
                    }
                }
                PoolKind::Average => {
                    let n = if p.count_include_pad {
                        padded
                    } else {
                        taps.len()
                    };
                    let sum: f32 = taps.iter().map(|&i| xs[base + i]).sum();
                    y[at] = sum / n.max(1) as f32;
                }
            }
        });
    }
    let mut shape = x.shape[..2].to_vec();
    shape.extend(out);
    let saved = match p.kind {
        PoolKind::Max => Saved::Argmax(argmax),
        PoolKind::Average => Saved::None,
    };
    Ok((Tensor::f32(shape, y), saved))
}

/// Average pooling over 3 or more spatial axes, backward.
pub(crate) fn average_backward(p: &Pool, x: &Tensor, dy: &[f32]) -> R<Vec<f32>> {
    let w = Windows::new(p, &x.shape)?;
    let (planes, area) = (x.shape[0] * x.shape[1], t::numel(&x.shape[2..]));
    let per = t::numel(&w.output());
    let mut dx = vec![0.0; x.len()];
    for plane in 0..planes {
        let base = plane * area;
        w.each(|o, taps, padded| {
            let n = if p.count_include_pad {
                padded
            } else {
                taps.len()
            };
            let g = dy[plane * per + o] / n.max(1) as f32;
            for &i in taps {
                dx[base + i] += g;
            }
        });
    }
    Ok(dx)
}

/// A 3-d transposed convolution: its output depth (with the leading padding cropped) and
/// the 2-d transposed convolution of one depth slice, as the convolution whose input
/// gradient it is ([`super::ops::conv_transpose_geometry`]).
struct ConvTranspose3d {
    input_depth: usize,
    kernel_depth: usize,
    stride: usize,
    dilation: usize,
    begin: usize,
    output_depth: usize,
    plane: Conv2d,
}

impl ConvTranspose3d {
    fn new(c: &ConvTranspose, x: &[usize], w: &[usize]) -> R<ConvTranspose3d> {
        let ([n, ch, d, h, wd], [wc, oc, kd, kh, kw]) = (volume(x, "input")?, volume(w, "kernel")?);
        let first = |v: &Option<Vec<u64>>, default: u64| -> R<usize> {
            match v.as_deref() {
                None => Ok(default as usize),
                Some([a, _, _]) => Ok(*a as usize),
                Some(other) => Err(operands(format!("{other:?} does not fit 3 spatial axes"))),
            }
        };
        let tail = |v: &Option<Vec<u64>>| v.as_ref().map(|v| v[1..].to_vec());
        let (stride, dilation) = (
            first(&c.conv.strides, 1)?.max(1),
            first(&c.conv.dilations, 1)?.max(1),
        );
        let extra = first(&c.output_padding, 0)?;
        let full = stride * (d.max(1) - 1) + extra + (kd.max(1) - 1) * dilation + 1;
        let target = match (&c.output_shape, &c.conv.padding) {
            (Some(_), _) => Some(first(&c.output_shape, 1)?),
            (None, Padding::SameUpper | Padding::SameLower) => Some(d * stride),
            _ => None,
        };
        let (begin, output_depth) = match (target, &c.conv.padding) {
            (Some(t), p) => {
                let total = full.saturating_sub(t);
                let begin = if *p == Padding::SameLower {
                    total - total / 2
                } else {
                    total / 2
                };
                (begin, t)
            }
            (None, Padding::Explicit(p)) if p.len() == 6 => {
                let (b, e) = (p[0] as usize, p[3] as usize);
                (
                    b,
                    full.checked_sub(b + e)
                        .ok_or_else(|| operands("the pads exceed the output"))?,
                )
            }
            (None, Padding::Explicit(p)) if p.is_empty() => (0, full),
            (None, Padding::Explicit(p)) => {
                return Err(operands(format!("pads {p:?} do not fit 3 spatial axes")))
            }
            (None, _) => (0, full),
        };
        let padding = match &c.conv.padding {
            Padding::Explicit(p) if p.len() == 6 => Padding::Explicit(vec![p[1], p[2], p[4], p[5]]),
            other => other.clone(),
        };
        let plane = ConvTranspose {
            conv: Conv {
                kernel: Some(vec![kh as u64, kw as u64]),
                strides: tail(&c.conv.strides),
                dilations: tail(&c.conv.dilations),
                padding,
                group: c.conv.group,
            },
            output_padding: tail(&c.output_padding),
            output_shape: tail(&c.output_shape),
        };
        let (plane, _) = conv_transpose_geometry(&plane, &[n, ch, h, wd], &[wc, oc, kh, kw])?;
        Ok(ConvTranspose3d {
            input_depth: d,
            kernel_depth: kd,
            stride,
            dilation,
            begin,
            output_depth,
            plane,
        })
    }

    /// `(id, kd, od)` for every input depth, kernel depth and the output depth it adds to.
    fn taps(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (0..self.input_depth).flat_map(move |id| {
            (0..self.kernel_depth).filter_map(move |kd| {
                let od = (id * self.stride + kd * self.dilation).checked_sub(self.begin)?;
                (od < self.output_depth).then_some((id, kd, od))
            })
        })
    }

    /// Layouts of x, w and y as `(planes, depth, plane size)`.
    fn shapes(&self) -> Layouts {
        let g = &self.plane;
        let (ih, iw) = g.output();
        (
            (g.batch * g.out_channels, self.input_depth, ih * iw),
            (
                g.out_channels * (g.in_channels / g.groups),
                self.kernel_depth,
                g.kernel.0 * g.kernel.1,
            ),
            (
                g.batch * g.in_channels,
                self.output_depth,
                g.input.0 * g.input.1,
            ),
        )
    }
}

/// 3-d transposed convolution forward.
pub(crate) fn conv_transpose(c: &ConvTranspose, inputs: &[Option<&Tensor>]) -> R<Tensor> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let g = ConvTranspose3d::new(c, &x.shape, &w.shape)?;
    let (xs, ws) = (floats(x, "X")?, floats(w, "W")?);
    let (x_shape, w_shape, y_shape) = g.shapes();
    let mut y = vec![0.0; y_shape.0 * y_shape.1 * y_shape.2];
    let mut plane = vec![0.0; y_shape.0 * y_shape.2];
    for (id, kd, od) in g.taps() {
        plane.iter_mut().for_each(|v| *v = 0.0);
        g.plane.transpose(
            &depth_slice(xs, x_shape, id),
            &depth_slice(ws, w_shape, kd),
            &mut plane,
        );
        add_depth_slice(&mut y, y_shape, od, &plane);
    }
    let out_channels = g.plane.in_channels;
    if let Some(b) = optional(inputs, 2) {
        add_bias(
            &mut y,
            y_shape.1 * y_shape.2,
            out_channels,
            floats(b, "bias")?,
        )?;
    }
    Ok(Tensor::f32(
        vec![
            g.plane.batch,
            out_channels,
            g.output_depth,
            g.plane.input.0,
            g.plane.input.1,
        ],
        y,
    ))
}

/// 3-d transposed convolution backward: per tap, the input gradient is the plane
/// convolution of the output gradient, the weight gradient that convolution's with the
/// output gradient as its input.
pub(crate) fn conv_transpose_backward(
    c: &ConvTranspose,
    inputs: &[Option<&Tensor>],
    dy: &[f32],
) -> R<InputGrads> {
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let g = ConvTranspose3d::new(c, &x.shape, &w.shape)?;
    let (xs, ws) = (floats(x, "X")?, floats(w, "W")?);
    let (x_shape, w_shape, y_shape) = g.shapes();
    let mut dx = vec![0.0; xs.len()];
    let mut dw = vec![0.0; ws.len()];
    let (mut dx_plane, mut dw_plane) = (
        vec![0.0; x_shape.0 * x_shape.2],
        vec![0.0; w_shape.0 * w_shape.2],
    );
    for (id, kd, od) in g.taps() {
        let dy_plane = depth_slice(dy, y_shape, od);
        let w_plane = depth_slice(ws, w_shape, kd);
        dx_plane.iter_mut().for_each(|v| *v = 0.0);
        g.plane.forward(&dy_plane, &w_plane, None, &mut dx_plane);
        add_depth_slice(&mut dx, x_shape, id, &dx_plane);
        dw_plane.iter_mut().for_each(|v| *v = 0.0);
        g.plane.backward(
            &dy_plane,
            &w_plane,
            &depth_slice(xs, x_shape, id),
            None,
            &mut dw_plane,
            None,
        );
        add_depth_slice(&mut dw, w_shape, kd, &dw_plane);
    }
    let db = optional(inputs, 2)
        .is_some()
        .then(|| bias_grad(dy, y_shape.1 * y_shape.2, g.plane.in_channels));
    Ok(conv_grads(inputs.len(), dx, dw, db))
}

/// A 3-d pool's input gradient: a max pool's through the argmax its forward pass saved.
pub(crate) fn pool_backward(p: &Pool, x: &Tensor, saved: &Saved, dy: &[f32]) -> R<Vec<f32>> {
    Ok(match (p.kind, saved) {
        (PoolKind::Max, Saved::Argmax(argmax)) => {
            let mut dx = vec![0.0; x.len()];
            super::kernels::max_pool_backward(argmax, dy, &mut dx);
            dx
        }
        (PoolKind::Average, _) => average_backward(p, x, dy)?,
        _ => return Err(inconsistent("max pooling saved no argmax")),
    })
}
