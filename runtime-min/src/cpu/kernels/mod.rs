//! Forward and backward kernels on `f32` slices in row-major NCHW layout.
//!
//! Matrix products go through the `gemm` crate (packed, vectorized; [`gemm()`] runs
//! blocks of large ones in parallel), never a hand-written loop nest; convolutions are
//! lowered to it with im2col, a band of output rows at a time ([`Conv2d`]), or for 3×3
//! kernels with unit stride by Winograd's F(2×2, 3×3) (`winograd.rs`). Backward
//! kernels accumulate into their gradient outputs (`+=`), as a layer's gradient sums over
//! microbatches and over consumers.

mod conv;
mod matmul;
mod winograd;

pub use conv::Conv2d;
pub use matmul::gemm;

use rayon::prelude::*;

/// `a += b`, elementwise.
pub fn add(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

/// `x = max(x, 0)` in place; above 64 K elements, blocks of it in parallel.
pub fn relu_in_place(x: &mut [f32]) {
    if x.len() < 1 << 16 {
        x.iter_mut().for_each(|v| *v = v.max(0.0));
    } else {
        x.par_chunks_mut(1 << 14)
            .for_each(|c| c.iter_mut().for_each(|v| *v = v.max(0.0)));
    }
}

/// A fully connected layer `y = x·Wᵀ + b` (ONNX Gemm with `transB = 1`): `x` is
/// `batch×inputs`, `w` `outputs×inputs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linear {
    /// Rows of `x`.
    pub batch: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
}

impl Linear {
    /// The forward pass.
    pub fn forward(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
        gemm(
            self.batch,
            self.inputs,
            self.outputs,
            1.0,
            x,
            false,
            w,
            true,
            0.0,
            y,
        );
        if let Some(b) = bias {
            for row in y.chunks_mut(self.outputs) {
                add(row, b);
            }
        }
    }

    /// Accumulates `dx = dy·W`, `dW = dyᵀ·x`, `db = Σ dy`.
    pub fn backward(
        &self,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        dw: &mut [f32],
        db: Option<&mut [f32]>,
    ) {
        if let Some(dx) = dx {
            gemm(
                self.batch,
                self.outputs,
                self.inputs,
                1.0,
                dy,
                false,
                w,
                false,
                1.0,
                dx,
            );
        }
        gemm(
            self.outputs,
            self.batch,
            self.inputs,
            1.0,
            dy,
            true,
            x,
            false,
            1.0,
            dw,
        );
        if let Some(db) = db {
            for row in dy.chunks(self.outputs) {
                add(db, row);
            }
        }
    }
}

/// `y = max(x, 0)`.
pub fn relu(x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(o, &v)| *o = v.max(0.0));
}

/// Accumulates `dx += dy · [y > 0]` from the forward output `y`.
pub fn relu_backward(y: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((d, &o), &g) in dx.iter_mut().zip(y).zip(dy) {
        if o > 0.0 {
            *d += g;
        }
    }
}

/// Mean softmax cross-entropy of `logits` (`batch×classes`) against `labels`, and its
/// gradient with respect to the logits (overwritten into `dlogits`). `scale` divides the
/// loss, e.g. the global batch when this is one rank's share.
pub fn softmax_cross_entropy(
    classes: usize,
    logits: &[f32],
    labels: &[u32],
    scale: f32,
    dlogits: &mut [f32],
) -> f64 {
    let mut loss = 0.0f64;
    for ((row, &label), drow) in logits
        .chunks(classes)
        .zip(labels)
        .zip(dlogits.chunks_mut(classes))
    {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
        let label = label as usize;
        loss -= f64::from(row[label] - max) - sum.ln();
        for (j, (d, &v)) in drow.iter_mut().zip(row).enumerate() {
            let p = (f64::from(v - max).exp() / sum) as f32;
            *d = (p - if j == label { 1.0 } else { 0.0 }) / scale;
        }
    }
    loss / f64::from(scale)
}

/// Vocabulary-parallel cross-entropy (Megatron-LM's): what one piece of each row's classes
/// contributes — per row, its max, `Σ exp(x − max)` over the piece, and the label's logit
/// where the piece holds the label (else 0). `first` is the piece's first class; `classes`
/// its width.
pub fn class_piece_statistics(
    classes: usize,
    logits: &[f32],
    labels: &[u32],
    first: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(3 * labels.len());
    for (row, &label) in logits.chunks(classes).zip(labels) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
        let own = (label as usize).checked_sub(first).filter(|&j| j < classes);
        out.extend([max, sum as f32, own.map_or(0.0, |j| row[j])]);
    }
    out
}

/// The loss and logits gradient of one class piece (as [`softmax_cross_entropy`]) from
/// every piece's [`class_piece_statistics`] of the same rows (`all`, one per piece): the
/// row's log-sum-exp and label logit are combined from them, so no piece needs another's
/// logits. The loss is the whole rows' (every piece computes the same).
pub fn class_piece_cross_entropy(
    classes: usize,
    logits: &[f32],
    labels: &[u32],
    first: usize,
    all: &[Vec<f32>],
    scale: f32,
    dlogits: &mut [f32],
) -> f64 {
    let (loss, lse) = class_piece_loss(labels.len(), all, scale);
    for (((row, &label), drow), &lse) in logits
        .chunks(classes)
        .zip(labels)
        .zip(dlogits.chunks_mut(classes))
        .zip(&lse)
    {
        for (j, (d, &v)) in drow.iter_mut().zip(row).enumerate() {
            let p = (f64::from(v) - lse).exp() as f32;
            *d = (p - if first + j == label as usize {
                1.0
            } else {
                0.0
            }) / scale;
        }
    }
    loss
}

/// The loss of `rows` rows whose classes are cut into pieces, from every piece's
/// [`class_piece_statistics`] (`all`), over `scale` rows; and each row's log-sum-exp
/// over all its classes, which gives each piece its logits' gradient.
pub fn class_piece_loss(rows: usize, all: &[Vec<f32>], scale: f32) -> (f64, Vec<f64>) {
    let mut loss = 0.0f64;
    let lse = (0..rows)
        .map(|r| {
            let stat = |piece: &Vec<f32>, i: usize| piece.get(3 * r + i).copied().unwrap_or(0.0);
            let max = all
                .iter()
                .map(|s| stat(s, 0))
                .fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = all
                .iter()
                .map(|s| f64::from(stat(s, 1)) * f64::from(stat(s, 0) - max).exp())
                .sum();
            let lse = f64::from(max) + sum.ln();
            let target: f64 = all.iter().map(|s| f64::from(stat(s, 2))).sum();
            loss += lse - target;
            lse
        })
        .collect();
    (loss / f64::from(scale), lse)
}

/// SGD with momentum (PyTorch's form): `v = μ·v + g`, `w -= lr·v`.
pub fn sgd_momentum(
    weights: &mut [f32],
    grads: &[f32],
    velocity: &mut [f32],
    lr: f32,
    momentum: f32,
) {
    for ((w, &g), v) in weights.iter_mut().zip(grads).zip(velocity.iter_mut()) {
        *v = momentum * *v + g;
        *w -= lr * *v;
    }
}

/// A 2-d pooling's geometry over `planes` planes (N·C).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2d {
    /// Planes.
    pub planes: usize,
    /// Input height and width.
    pub input: (usize, usize),
    /// Window.
    pub kernel: (usize, usize),
    /// Strides.
    pub stride: (usize, usize),
    /// Dilations.
    pub dilation: (usize, usize),
    /// Padding: top, left, bottom, right.
    pub padding: [usize; 4],
    /// Output height and width (rounded down or up by the caller).
    pub output: (usize, usize),
}

/// What a window position covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tap {
    /// An input element.
    Input(usize),
    /// The padding.
    Pad,
    /// Beyond the padding (a ceil-mode window that overhangs).
    Outside,
}

impl Pool2d {
    /// A window on an unpadded input, output rounded down.
    pub fn simple(
        planes: usize,
        input: (usize, usize),
        kernel: (usize, usize),
        stride: (usize, usize),
    ) -> Pool2d {
        Pool2d {
            planes,
            input,
            kernel,
            stride,
            dilation: (1, 1),
            padding: [0; 4],
            output: (
                (input.0 - kernel.0) / stride.0 + 1,
                (input.1 - kernel.1) / stride.1 + 1,
            ),
        }
    }

    /// Calls `visit(output, tap)` for every output position and every position of its
    /// window, planes outermost.
    fn for_each_window(&self, mut visit: impl FnMut(usize, Tap)) {
        let (oh, ow) = self.output;
        let (h, w) = self.input;
        let tap = |o: usize, k: usize, s: usize, d: usize, pad: usize, size: usize, end: usize| {
            let at = (o * s + k * d) as isize - pad as isize;
            if at >= 0 && (at as usize) < size {
                Ok(at as usize)
            } else if at < (size + end) as isize {
                Err(true)
            } else {
                Err(false)
            }
        };
        for p in 0..self.planes {
            for oy in 0..oh {
                for ox in 0..ow {
                    let o = (p * oh + oy) * ow + ox;
                    for ky in 0..self.kernel.0 {
                        let y = tap(
                            oy,
                            ky,
                            self.stride.0,
                            self.dilation.0,
                            self.padding[0],
                            h,
                            self.padding[2],
                        );
                        for kx in 0..self.kernel.1 {
                            let x = tap(
                                ox,
                                kx,
                                self.stride.1,
                                self.dilation.1,
                                self.padding[1],
                                w,
                                self.padding[3],
                            );
                            visit(
                                o,
                                match (y, x) {
                                    (Ok(y), Ok(x)) => Tap::Input((p * h + y) * w + x),
                                    (Err(false), _) | (_, Err(false)) => Tap::Outside,
                                    _ => Tap::Pad,
                                },
                            );
                        }
                    }
                }
            }
        }
    }

    /// Max pooling; returns, per output, the index of the input it took (for backward).
    pub fn max(&self, x: &[f32], y: &mut [f32]) -> Vec<u32> {
        let mut argmax = vec![0u32; y.len()];
        // Planes in parallel (a scalar walk of ResNet-50's first pooling took 8 ms).
        let (area_out, area_in) = (self.output.0 * self.output.1, self.input.0 * self.input.1);
        let plane = Pool2d { planes: 1, ..*self };
        y.par_chunks_mut(area_out.max(1))
            .zip(argmax.par_chunks_mut(area_out.max(1)))
            .enumerate()
            .for_each(|(p, (y, argmax))| {
                let x = &x[p * area_in..(p + 1) * area_in];
                y.fill(f32::NEG_INFINITY);
                if plane.dilation == (1, 1) {
                    plane.max_dense(x, y, argmax, p * area_in);
                    return;
                }
                plane.for_each_window(|o, tap| {
                    if let Tap::Input(i) = tap {
                        if x[i] > y[o] {
                            y[o] = x[i];
                            argmax[o] = (p * area_in + i) as u32;
                        }
                    }
                });
            });
        argmax
    }

    /// [`Pool2d::max`] of one plane whose windows are dense (no dilation): each window
    /// clipped to the input once, then scanned row by row (the tap-by-tap walk took 15 ms
    /// of VGG16's first pooling at batch 2).
    fn max_dense(&self, x: &[f32], y: &mut [f32], argmax: &mut [u32], first: usize) {
        let (h, w) = self.input;
        let (oh, ow) = self.output;
        // The input range of output `o`'s window along one axis, clipped to `0..size`.
        let span = |o: usize, k: usize, s: usize, pad: usize, size: usize| {
            let start = (o * s) as isize - pad as isize;
            let end = (start + k as isize).clamp(0, size as isize) as usize;
            (start.clamp(0, size as isize) as usize, end)
        };
        for oy in 0..oh {
            let (y0, y1) = span(oy, self.kernel.0, self.stride.0, self.padding[0], h);
            let (y, argmax) = (
                &mut y[oy * ow..(oy + 1) * ow],
                &mut argmax[oy * ow..(oy + 1) * ow],
            );
            if self.kernel == (2, 2)
                && self.stride == (2, 2)
                && self.padding[1] == 0
                && y1 == y0 + 2
                && 2 * ow <= w
            {
                // VGG's pooling, unclipped: four taps, compared in the general order.
                let (r0, r1) = (
                    &x[y0 * w..y0 * w + 2 * ow],
                    &x[(y0 + 1) * w..(y0 + 1) * w + 2 * ow],
                );
                for (ox, (y, argmax)) in y.iter_mut().zip(argmax.iter_mut()).enumerate() {
                    let (left, up) = (2 * ox, y0 * w + 2 * ox);
                    let taps = [
                        (r0[left], up),
                        (r0[left + 1], up + 1),
                        (r1[left], up + w),
                        (r1[left + 1], up + w + 1),
                    ];
                    let (mut best, mut at) = (f32::NEG_INFINITY, None);
                    for (v, i) in taps {
                        if v > best {
                            best = v;
                            at = Some(i);
                        }
                    }
                    *y = best;
                    if let Some(i) = at {
                        *argmax = (first + i) as u32;
                    }
                }
                continue;
            }
            for ox in 0..ow {
                let (x0, x1) = span(ox, self.kernel.1, self.stride.1, self.padding[1], w);
                let o = ox;
                let (mut best, mut at) = (f32::NEG_INFINITY, None);
                for row in y0..y1 {
                    for (i, &v) in x[row * w + x0..row * w + x1].iter().enumerate() {
                        if v > best {
                            best = v;
                            at = Some(row * w + x0 + i);
                        }
                    }
                }
                y[o] = best;
                if let Some(i) = at {
                    argmax[o] = (first + i) as u32;
                }
            }
        }
    }

    /// Each output's divisor: its window's input elements, plus the padding it covers
    /// when `count_pad`.
    fn divisors(&self, count_pad: bool) -> Vec<f32> {
        let mut count = vec![0.0f32; self.planes * self.output.0 * self.output.1];
        self.for_each_window(|o, tap| match tap {
            Tap::Input(_) => count[o] += 1.0,
            Tap::Pad if count_pad => count[o] += 1.0,
            _ => {}
        });
        count
    }

    /// Average pooling.
    pub fn average(&self, count_pad: bool, x: &[f32], y: &mut [f32]) {
        let divisors = self.divisors(count_pad);
        y.iter_mut().for_each(|v| *v = 0.0);
        self.for_each_window(|o, tap| {
            if let Tap::Input(i) = tap {
                y[o] += x[i];
            }
        });
        y.iter_mut()
            .zip(&divisors)
            .for_each(|(v, d)| *v /= d.max(1.0));
    }

    /// Accumulates average pooling's input gradient: each output's gradient spread over
    /// its window.
    pub fn average_backward(&self, count_pad: bool, dy: &[f32], dx: &mut [f32]) {
        let divisors = self.divisors(count_pad);
        self.for_each_window(|o, tap| {
            if let Tap::Input(i) = tap {
                dx[i] += dy[o] / divisors[o].max(1.0);
            }
        });
    }
}

/// Accumulates max pooling's input gradient: each output's gradient to the input it took.
pub fn max_pool_backward(argmax: &[u32], dy: &[f32], dx: &mut [f32]) {
    for (&i, &g) in argmax.iter().zip(dy) {
        dx[i as usize] += g;
    }
}

/// The layout batch normalization works on: N×C×(spatial), `spatial` elements per
/// channel plane.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNorm {
    /// Channels.
    pub channels: usize,
    /// Elements of one channel plane (H·W).
    pub spatial: usize,
    /// ε.
    pub epsilon: f32,
}

impl BatchNorm {
    fn channel(&self, i: usize) -> usize {
        (i / self.spatial) % self.channels
    }

    /// Training mode: normalizes each channel by the batch's mean and (biased) variance,
    /// then scales and shifts. Returns the per-channel mean and inverse standard deviation
    /// the backward pass needs.
    pub fn forward(
        &self,
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        y: &mut [f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let sums = self.sums(x);
        self.normalize(x, gamma, beta, y, &sums)
    }

    /// Per channel `[Σx…, Σx²…]`, then the elements per channel: the statistics' sums,
    /// which the ranks holding other samples of a batch add up (synchronized batch
    /// normalization).
    pub fn sums(&self, x: &[f32]) -> Vec<f64> {
        let c = self.channels;
        let mut sums = vec![0.0f64; 2 * c + 1];
        for (i, &v) in x.iter().enumerate() {
            let ch = self.channel(i);
            sums[ch] += f64::from(v);
            sums[c + ch] += f64::from(v) * f64::from(v);
        }
        sums[2 * c] = (x.len() / c.max(1)) as f64;
        sums
    }

    /// [`BatchNorm::forward`] with the statistics of `sums` ([`BatchNorm::sums`]).
    pub fn normalize(
        &self,
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        y: &mut [f32],
        sums: &[f64],
    ) -> (Vec<f32>, Vec<f32>) {
        let c = self.channels;
        let (sum, squares, count) = (&sums[..c], &sums[c..2 * c], sums[2 * c].max(1.0));
        let mean: Vec<f32> = sum.iter().map(|s| (s / count) as f32).collect();
        let inv_std: Vec<f32> = squares
            .iter()
            .zip(sum)
            .map(|(q, s)| {
                let m = s / count;
                (1.0 / (q / count - m * m + f64::from(self.epsilon)).sqrt()) as f32
            })
            .collect();
        for (i, (o, &v)) in y.iter_mut().zip(x).enumerate() {
            let ch = self.channel(i);
            *o = gamma[ch] * (v - mean[ch]) * inv_std[ch] + beta[ch];
        }
        (mean, inv_std)
    }

    /// Accumulates the gradients. The batch statistics depend on `x`, so each input's
    /// gradient has the batch terms: `dx = γ·σ⁻¹·(dy − mean(dy) − x̂·mean(dy·x̂))`.
    #[allow(clippy::too_many_arguments, reason = "the operands of one layer")]
    pub fn backward(
        &self,
        x: &[f32],
        gamma: &[f32],
        stats: (&[f32], &[f32]),
        dy: &[f32],
        dx: &mut [f32],
        dgamma: &mut [f32],
        dbeta: &mut [f32],
    ) {
        let sums = self.gradient_sums(x, stats, dy);
        self.parameter_gradients(&sums, dgamma, dbeta);
        self.input_gradient(x, gamma, stats, dy, dx, &sums);
    }

    /// Per channel `[Σdy…, Σdy·x̂…]`, then the elements per channel: what the input
    /// gradient needs of the whole batch (summed over the ranks holding its samples).
    pub fn gradient_sums(
        &self,
        x: &[f32],
        (mean, inv_std): (&[f32], &[f32]),
        dy: &[f32],
    ) -> Vec<f64> {
        let c = self.channels;
        let mut sums = vec![0.0f64; 2 * c + 1];
        for (i, (&v, &g)) in x.iter().zip(dy).enumerate() {
            let ch = self.channel(i);
            sums[ch] += f64::from(g);
            sums[c + ch] += f64::from(g) * f64::from((v - mean[ch]) * inv_std[ch]);
        }
        sums[2 * c] = (x.len() / c.max(1)) as f64;
        sums
    }

    /// Adds the scale's and shift's gradients from [`BatchNorm::gradient_sums`] (a rank's
    /// own: the gradient buckets sum them over the ranks).
    pub fn parameter_gradients(&self, sums: &[f64], dgamma: &mut [f32], dbeta: &mut [f32]) {
        let c = self.channels;
        for ch in 0..c {
            dgamma[ch] += sums[c + ch] as f32;
            dbeta[ch] += sums[ch] as f32;
        }
    }

    /// Adds the input gradient, with the batch's `sums` ([`BatchNorm::gradient_sums`]).
    pub fn input_gradient(
        &self,
        x: &[f32],
        gamma: &[f32],
        (mean, inv_std): (&[f32], &[f32]),
        dy: &[f32],
        dx: &mut [f32],
        sums: &[f64],
    ) {
        let c = self.channels;
        let (sum_dy, sum_dy_xhat, count) = (&sums[..c], &sums[c..2 * c], sums[2 * c].max(1.0));
        for (i, (d, (&v, &g))) in dx.iter_mut().zip(x.iter().zip(dy)).enumerate() {
            let ch = self.channel(i);
            let xhat = f64::from((v - mean[ch]) * inv_std[ch]);
            let term = f64::from(g) - sum_dy[ch] / count - xhat * sum_dy_xhat[ch] / count;
            *d += (f64::from(gamma[ch] * inv_std[ch]) * term) as f32;
        }
    }
}

/// Softmax over the last axis (rows of `width`).
pub fn softmax(width: usize, x: &[f32], y: &mut [f32]) {
    for (row, out) in x.chunks(width).zip(y.chunks_mut(width)) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
        for (o, &v) in out.iter_mut().zip(row) {
            *o = (v - max).exp() / sum;
        }
    }
}

/// Accumulates softmax's input gradient from its output `y`: `dx = y·(dy − Σ dy·y)`.
pub fn softmax_backward(width: usize, y: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((ys, gs), ds) in y
        .chunks(width)
        .zip(dy.chunks(width))
        .zip(dx.chunks_mut(width))
    {
        let inner: f32 = ys.iter().zip(gs).map(|(a, b)| a * b).sum();
        for ((d, &o), &g) in ds.iter_mut().zip(ys).zip(gs) {
            *d += o * (g - inner);
        }
    }
}

/// GELU with the tanh approximation (`tanh`) or the exact erf form.
pub fn gelu(tanh: bool, x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(1 << 14)
        .zip(x.par_chunks(1 << 14))
        .for_each(|(ys, xs)| {
            // One loop per form, each inlined whole and in f32, so both vectorize four
            // lanes wide (in f64 with a call-free exp, ViT-B/16's GELUs took a tenth of its
            // forward pass).
            if tanh {
                let c = (2.0 / std::f32::consts::PI).sqrt();
                for (o, &v) in ys.iter_mut().zip(xs) {
                    // tanh(z) = 1 − 2/(e²ᶻ + 1), so Φ = 1 − 1/(e²ᶻ + 1).
                    let z = c * (v + 0.044715 * v * v * v);
                    *o = v * (1.0 - 1.0 / (exp_f32(2.0 * z) + 1.0));
                }
            } else {
                for (o, &v) in ys.iter_mut().zip(xs) {
                    *o = v * 0.5 * (1.0 + erf_f32(v * std::f32::consts::FRAC_1_SQRT_2));
                }
            }
        });
}

/// [`erf`] in f32 (the same approximation, absolute error about 2e-7).
#[inline]
fn erf_f32(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_8 + t * (-1.453_152 + t * 1.061_405_4))));
    let e = 1.0 - poly * exp_f32(-x * x);
    if x < 0.0 {
        -e
    } else {
        e
    }
}

/// The largest of `xs` (NaNs ignored, as `f32::max` does; −∞ when empty), over 16 running
/// maxima so the loop vectorizes.
pub(crate) fn lane_max(xs: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut maxima = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for l in 0..LANES {
            maxima[l] = maxima[l].max(c[l]);
        }
    }
    maxima.iter().copied().fold(tail, f32::max)
}

/// `Σ xs` over 16 running sums, so the loop vectorizes; the order is fixed.
pub(crate) fn lane_sum(xs: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut sums = [0.0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for l in 0..LANES {
            sums[l] += c[l];
        }
    }
    sums.iter().sum::<f32>() + tail
}

/// `eˣ` in f32 without calls, as [`exp`] does in f64: relative error about 2e-7 from −87
/// to 88, 0 below, infinity above; NaN stays NaN.
#[inline]
pub(crate) fn exp_f32(x: f32) -> f32 {
    // 1.5·2²³: adding it rounds to an integer and leaves it in the low bits.
    const SHIFT: f32 = 12_582_912.0;
    let clamped = x.clamp(-87.0, 88.0);
    let shifted = clamped * std::f32::consts::LOG2_E + SHIFT;
    let k = shifted - SHIFT;
    // ln 2 in two parts (Cody and Waite): the first has trailing zeros, so k·it is exact.
    let r = (clamped - k * 0.693_145_75) - k * 1.428_606_8e-6;
    // eʳ for |r| ≤ ln 2 / 2: Taylor to r⁷ (the next term is below 2e-8).
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r / 5040.0))))));
    let k = shifted.to_bits() as i32 - SHIFT.to_bits() as i32;
    let y = p * f32::from_bits(((k + 127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else if x > 88.0 {
        f32::INFINITY
    } else {
        y
    }
}

/// Accumulates GELU's input gradient: `d/dx [x·Φ(x)] = Φ(x) + x·Φ'(x)`.
pub fn gelu_backward(tanh: bool, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    for ((d, &v), &g) in dx.iter_mut().zip(x).zip(dy) {
        let (cdf, pdf) = gelu_cdf(tanh, v);
        *d += g * (cdf + v * pdf);
    }
}

/// Φ(x): the Gaussian CDF, or its tanh approximation.
#[inline]
fn gaussian_cdf(tanh: bool, x: f64) -> f64 {
    if tanh {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    } else {
        0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2))
    }
}

/// Φ(x) and its derivative, in f64: the Gaussian CDF, or its tanh approximation.
#[inline]
fn gelu_cdf(tanh: bool, x: f32) -> (f32, f32) {
    let x = f64::from(x);
    let pdf = if tanh {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let t = (c * (x + 0.044715 * x * x * x)).tanh();
        0.5 * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
    } else {
        exp(-0.5 * x * x) / (2.0 * std::f64::consts::PI).sqrt()
    };
    (gaussian_cdf(tanh, x) as f32, pdf as f32)
}

/// The error function (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7).
#[inline]
pub(crate) fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let e = 1.0 - poly * exp(-x * x);
    if x < 0.0 {
        -e
    } else {
        e
    }
}

/// `eˣ` without calls, so loops over it vectorize (the standard library's `exp` is a call
/// per element: most of a ViT's GELU time). Relative error about 1e-16 from −708 to 709;
/// 0 below, infinity above; NaN stays NaN.
#[inline]
pub(crate) fn exp(x: f64) -> f64 {
    /// 1/n! for n = 0..=13: eʳ's Taylor series, exact to double precision for |r| ≤ ln 2 / 2.
    const INV_FACTORIAL: [f64; 14] = {
        let mut c = [1.0; 14];
        let mut n = 1;
        while n < 14 {
            c[n] = c[n - 1] / n as f64;
            n += 1;
        }
        c
    };
    // Adding 1.5·2⁵² rounds to an integer and leaves it in the low bits: `round` and
    // float-to-integer conversions would be calls or scalar instructions.
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    let clamped = x.clamp(-708.0, 710.0);
    // x = k·ln 2 + r with |r| ≤ ln 2 / 2; ln 2 in two parts (Cody and Waite), so r is
    // exact.
    let shifted = clamped * std::f64::consts::LOG2_E + SHIFT;
    let k = shifted - SHIFT;
    let r = (clamped - k * 0.693_147_180_369_123_8) - k * 1.908_214_929_270_587_7e-10;
    let p = INV_FACTORIAL.iter().rev().fold(0.0, |p, &c| p * r + c);
    // 2ᵏ from exponent bits, in two factors: k reaches 1024 after the clamp.
    let k = shifted.to_bits() as i64 - SHIFT.to_bits() as i64;
    let two_to = |e: i64| f64::from_bits(((e + 1023) as u64) << 52);
    let y = p * two_to(k >> 1) * two_to(k - (k >> 1));
    if x < -708.0 {
        0.0
    } else {
        y
    }
}

/// Each row's mean and inverse standard deviation, as a normalization's backward reads them.
pub type RowStats = (Vec<f32>, Vec<f32>);

/// Layer normalization over the last axis (rows of `width`): `y = γ·x̂ + β`. Returns each
/// row's mean and inverse standard deviation for the backward pass.
pub fn layer_norm(
    width: usize,
    epsilon: f32,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    y: &mut [f32],
) -> RowStats {
    x.par_chunks(width)
        .zip(y.par_chunks_mut(width))
        .map(|(row, out)| {
            let n = width as f64;
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n;
            let inv_std = 1.0 / (var + f64::from(epsilon)).sqrt();
            for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
                *o = gamma[j] * ((f64::from(v) - mean) * inv_std) as f32 + beta[j];
            }
            (mean as f32, inv_std as f32)
        })
        .unzip()
}

/// Accumulates layer normalization's gradients (per row:
/// `dx = σ⁻¹·(g − mean(g) − x̂·mean(g·x̂))` with `g = γ·dy`).
#[allow(clippy::too_many_arguments, reason = "the operands of one layer")]
pub fn layer_norm_backward(
    width: usize,
    x: &[f32],
    gamma: &[f32],
    (mean, inv_std): (&[f32], &[f32]),
    dy: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let n = width as f64;
    for (r, ((row, gs), ds)) in x
        .chunks(width)
        .zip(dy.chunks(width))
        .zip(dx.chunks_mut(width))
        .enumerate()
    {
        let xhat: Vec<f64> = row
            .iter()
            .map(|&v| f64::from((v - mean[r]) * inv_std[r]))
            .collect();
        let g: Vec<f64> = gs
            .iter()
            .zip(gamma)
            .map(|(&d, &w)| f64::from(d * w))
            .collect();
        let mean_g = g.iter().sum::<f64>() / n;
        let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        for j in 0..width {
            dgamma[j] += (f64::from(gs[j]) * xhat[j]) as f32;
            dbeta[j] += gs[j];
            ds[j] += (f64::from(inv_std[r]) * (g[j] - mean_g - xhat[j] * mean_gx)) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running-lane maximum is the maximum (NaNs ignored, −∞ for nothing), and the
    /// running-lane sum is the sum to f32 rounding, at every length around the lanes.
    #[test]
    fn lane_maxima_and_sums_are_the_rows() {
        for n in [0usize, 1, 15, 16, 17, 33, 197] {
            let xs: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let want = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(lane_max(&xs), want, "{n}");
            let exact: f64 = xs.iter().map(|&x| f64::from(x)).sum();
            let scale: f64 = xs.iter().map(|&x| f64::from(x.abs())).sum();
            assert!(
                (f64::from(lane_sum(&xs)) - exact).abs() <= 1e-6 * scale.max(1.0),
                "{n}"
            );
        }
        let mut with_nan = vec![1.0f32; 20];
        with_nan[3] = f32::NAN;
        with_nan[18] = 4.0;
        assert_eq!(lane_max(&with_nan), 4.0);
    }

    /// The f32 forms GELU's forward takes, against f64: `exp_f32` within a few f32 ulps
    /// over its range, and both GELUs within 1e-6 of the f64 formulas.
    #[test]
    fn the_f32_gelu_and_exp_agree_with_f64() {
        for i in -8_700..=8_800 {
            let x = i as f32 / 100.0;
            let (got, want) = (f64::from(exp_f32(x)), f64::from(x).exp());
            assert!(
                (got - want).abs() <= 3e-7 * want,
                "exp({x}): {got} vs {want}"
            );
        }
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        let x: Vec<f32> = (-2_000..=2_000).map(|i| i as f32 / 200.0).collect();
        for tanh in [false, true] {
            let mut y = vec![0.0; x.len()];
            gelu(tanh, &x, &mut y);
            for (&v, &got) in x.iter().zip(&y) {
                let want = f64::from(v) * gaussian_cdf(tanh, f64::from(v));
                let err = (f64::from(got) - want).abs();
                assert!(
                    err <= 1e-6 * (1.0 + want.abs()),
                    "gelu({v}, tanh {tanh}): {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn exp_is_the_standard_librarys_to_the_last_bits() {
        let mut worst = 0.0f64;
        for i in -70_800..=70_900 {
            let x = f64::from(i) / 100.0 + 0.003_7;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 1e-15, "relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-800.0), 0.0);
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp(710.0), f64::INFINITY);
        assert_eq!(exp(f64::INFINITY), f64::INFINITY);
        assert!(exp(f64::NAN).is_nan());
    }

    #[test]
    fn class_pieces_give_the_whole_rows_cross_entropy() {
        let (rows, classes) = (3, 8);
        let logits: Vec<f32> = (0..rows * classes)
            .map(|i| ((i * 7919) % 23) as f32 * 0.37 - 3.0)
            .collect();
        let labels = [5u32, 0, 7];
        let mut want = vec![0.0; logits.len()];
        let whole = softmax_cross_entropy(classes, &logits, &labels, 6.0, &mut want);
        for pieces in [2, 4] {
            let width = classes / pieces;
            let piece_of = |p: usize| -> Vec<f32> {
                logits
                    .chunks(classes)
                    .flat_map(|row| row[p * width..(p + 1) * width].to_vec())
                    .collect()
            };
            let all: Vec<Vec<f32>> = (0..pieces)
                .map(|p| class_piece_statistics(width, &piece_of(p), &labels, p * width))
                .collect();
            for p in 0..pieces {
                let mut got = vec![0.0; rows * width];
                let loss = class_piece_cross_entropy(
                    width,
                    &piece_of(p),
                    &labels,
                    p * width,
                    &all,
                    6.0,
                    &mut got,
                );
                assert!(
                    (loss - whole).abs() < 1e-6 * whole.abs(),
                    "{loss} vs {whole}"
                );
                for (r, row) in got.chunks(width).enumerate() {
                    let expected = &want[r * classes + p * width..r * classes + (p + 1) * width];
                    for (a, b) in row.iter().zip(expected) {
                        assert!((a - b).abs() < 1e-6, "row {r} piece {p}: {a} vs {b}");
                    }
                }
            }
        }
    }
}
