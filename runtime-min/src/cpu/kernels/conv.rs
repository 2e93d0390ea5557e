//! 2-d convolutions as im2col and GEMM: forward a band of output rows at a time (3×3 ones
//! with unit stride by Winograd's algorithm, `winograd/`), backward a sample at a
//! time, in each worker's scratch buffers.

use std::cell::Cell;
use std::ops::Range;

use rayon::prelude::*;

use super::add;
use super::matmul::{gemm, gemm_in, gemm_raw, Strided};

/// A 2-d convolution's geometry (NCHW input, weight `O × C/groups × KH × KW`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2d {
    /// Samples.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Input height and width.
    pub input: (usize, usize),
    /// Kernel height and width.
    pub kernel: (usize, usize),
    /// Strides.
    pub stride: (usize, usize),
    /// Dilations (1 for a dense kernel).
    pub dilation: (usize, usize),
    /// Zero padding: top, left, bottom, right.
    pub padding: [usize; 4],
    /// Channel groups (both channel counts divide by it).
    pub groups: usize,
}

impl Conv2d {
    /// Output height and width.
    pub fn output(&self) -> (usize, usize) {
        let out = |i: usize, k: usize, s: usize, d: usize, p: usize| {
            (i + p).saturating_sub((k - 1) * d + 1) / s + 1
        };
        (
            out(
                self.input.0,
                self.kernel.0,
                self.stride.0,
                self.dilation.0,
                self.padding[0] + self.padding[2],
            ),
            out(
                self.input.1,
                self.kernel.1,
                self.stride.1,
                self.dilation.1,
                self.padding[1] + self.padding[3],
            ),
        )
    }

    /// Rows of one group's column matrix.
    fn group_patch(&self) -> usize {
        self.in_channels / self.groups * self.kernel.0 * self.kernel.1
    }

    fn pixels(&self) -> usize {
        let (oh, ow) = self.output();
        oh * ow
    }

    /// The input position read by output pixel `(oy, ox)` at kernel offset `(ky, kx)`.
    fn source(&self, oy: usize, ox: usize, ky: usize, kx: usize) -> Option<(usize, usize)> {
        let y = (oy * self.stride.0 + ky * self.dilation.0).checked_sub(self.padding[0])?;
        let x = (ox * self.stride.1 + kx * self.dilation.1).checked_sub(self.padding[1])?;
        (y < self.input.0 && x < self.input.1).then_some((y, x))
    }

    /// Calls `visit(column, input)` for every element of one sample's column matrix of
    /// output rows `rows` (`C·KH·KW × rows·OW`, each group's rows contiguous) with the
    /// input element it copies, `None` in the zero padding.
    fn for_each_column(&self, rows: Range<usize>, mut visit: impl FnMut(usize, Option<usize>)) {
        let (_, ow) = self.output();
        let (h, w) = self.input;
        let width = rows.len() * ow;
        for c in 0..self.in_channels {
            for ky in 0..self.kernel.0 {
                for kx in 0..self.kernel.1 {
                    let row = (c * self.kernel.0 + ky) * self.kernel.1 + kx;
                    for (i, oy) in rows.clone().enumerate() {
                        for ox in 0..ow {
                            let source = self.source(oy, ox, ky, kx);
                            visit(
                                row * width + i * ow + ox,
                                source.map(|(y, x)| (c * h + y) * w + x),
                            );
                        }
                    }
                }
            }
        }
    }

    /// A 1×1 convolution with unit stride and no padding: its column matrix is its input.
    fn pointwise(&self) -> bool {
        self.kernel == (1, 1) && self.stride == (1, 1) && self.padding == [0; 4]
    }

    /// Runs `f` on one sample's input as columns (the input as it is for a pointwise
    /// convolution), in this thread's scratch buffer.
    fn with_columns<R>(&self, x: &[f32], f: impl FnOnce(&[f32]) -> R) -> R {
        if self.pointwise() {
            return f(x);
        }
        with_scratch(
            Scratch::Columns,
            self.groups * self.group_patch() * self.pixels(),
            |cols| {
                self.im2col(x, 0..self.output().0, cols);
                f(cols)
            },
        )
    }

    /// One sample's input as columns, for output rows `rows`. With unit stride and dilation each output row of a
    /// column row is one contiguous run of the input, copied whole.
    fn im2col(&self, x: &[f32], rows: Range<usize>, cols: &mut [f32]) {
        let (_, ow) = self.output();
        let (h, w) = self.input;
        let ((sy, sx), (dy, dx)) = (self.stride, self.dilation);
        let (top, left) = (self.padding[0], self.padding[1]);
        let first = rows.start;
        let mut rows = cols.chunks_mut(rows.len() * ow);
        for c in 0..self.in_channels {
            for ky in 0..self.kernel.0 {
                for kx in 0..self.kernel.1 {
                    let Some(row) = rows.next() else { return };
                    // Output columns whose input column ox·sx + kx·dx − left is inside.
                    let offset = kx * dx;
                    let lo = left.saturating_sub(offset).div_ceil(sx).min(ow);
                    let hi = (w + left)
                        .saturating_sub(offset)
                        .div_ceil(sx)
                        .min(ow)
                        .max(lo);
                    for (i, out) in row.chunks_mut(ow).enumerate() {
                        let y = ((first + i) * sy + ky * dy).checked_sub(top);
                        match y.filter(|&y| y < h) {
                            Some(y) => {
                                out[..lo].fill(0.0);
                                out[hi..].fill(0.0);
                                if lo == hi {
                                    continue;
                                }
                                // The input column of output column `lo`.
                                let start = (c * h + y) * w + lo * sx + offset - left;
                                if sx == 1 {
                                    out[lo..hi].copy_from_slice(&x[start..start + hi - lo]);
                                } else {
                                    let inputs = x[start..].iter().step_by(sx);
                                    for (o, &v) in out[lo..hi].iter_mut().zip(inputs) {
                                        *o = v;
                                    }
                                }
                            }
                            None => out.fill(0.0),
                        }
                    }
                }
            }
        }
    }

    /// Adds columns back onto one sample's input (the adjoint of `im2col`).
    fn col2im(&self, cols: &[f32], dx: &mut [f32]) {
        self.for_each_column(0..self.output().0, |col, src| {
            if let Some(i) = src {
                dx[i] += cols[col];
            }
        });
    }

    fn in_size(&self) -> usize {
        self.in_channels * self.input.0 * self.input.1
    }

    /// `y = conv(x, w) + bias`: `x` is N×C×H×W, `y` N×O×OH×OW.
    ///
    /// Each sample's columns are made and multiplied a band of output rows at a time
    /// (`Conv2d::band_rows`), so they are still in cache when the GEMM packs them: VGG16's
    /// first layers have 115 MB of columns per sample, written then read back from memory.
    /// The bands of every sample run in parallel, each one product of the same shape
    /// whatever the batch, so a sample's output does not depend on how many share it.
    pub fn forward(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
        self.forward_with(x, w, bias, y, false);
    }

    /// [`Conv2d::forward`] for inference: faster algorithms that round more are allowed
    /// (Winograd's F(4×4, 3×3)).
    pub fn infer(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
        self.forward_with(x, w, bias, y, true);
    }

    fn forward_with(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32], fast: bool) {
        let (patch, pixels) = (self.group_patch(), self.pixels());
        let (oh, ow) = self.output();
        let og = self.out_channels / self.groups;
        let (in_size, out_size) = (self.in_size(), self.out_channels * pixels);
        assert!(
            x.len() >= self.batch * in_size
                && y.len() >= self.batch * out_size
                && w.len() >= self.out_channels * patch,
            "convolution operand sizes"
        );
        if self.takes_winograd() {
            return self.winograd_forward(x, w, bias, y, fast);
        }
        let band = self.band_rows();
        let bands = oh.div_ceil(band);
        // Fewer bands than threads: each product is split too.
        let split = self.batch * bands < rayon::current_num_threads();
        let y_at = y.as_mut_ptr() as usize;
        (0..self.batch * bands).into_par_iter().for_each(|task| {
            let (n, top) = (task / bands, task % bands * band);
            let rows = top..(top + band).min(oh);
            let width = rows.len() * ow;
            self.with_band(&x[n * in_size..(n + 1) * in_size], rows, |cols| {
                for g in 0..self.groups {
                    let weights = Strided {
                        at: w[g * og * patch..].as_ptr(),
                        rows: patch,
                        columns: 1,
                    };
                    let columns = Strided {
                        at: cols[g * patch * width..].as_ptr(),
                        rows: width,
                        columns: 1,
                    };
                    let out = n * out_size + g * og * pixels + top * ow;
                    // SAFETY: the assert bounds the weights and y, `with_band` gives
                    // `patch × width` columns per group; this task alone writes output
                    // rows `rows` of sample n's planes, each `width` elements from `out`,
                    // `pixels` apart.
                    unsafe {
                        gemm_raw(
                            split,
                            og,
                            patch,
                            width,
                            1.0,
                            weights,
                            columns,
                            0.0,
                            (y_at as *mut f32).add(out),
                            pixels,
                        );
                    }
                }
            });
        });
        if let Some(b) = bias {
            y.par_chunks_mut(out_size).for_each(|ys| {
                for (o, plane) in ys.chunks_mut(pixels).enumerate() {
                    plane.iter_mut().for_each(|v| *v += b[o]);
                }
            });
        }
    }

    /// Output rows per band of [`Conv2d::forward`]: columns of about 2 MiB, but at least 256
    /// pixels, below which repacking the weights for every band costs more than the cache
    /// saves. A pointwise convolution reads its input as it is, in one band.
    fn band_rows(&self) -> usize {
        let (oh, ow) = self.output();
        if self.pointwise() || ow == 0 {
            return oh.max(1);
        }
        let per_row = self.groups * self.group_patch() * ow;
        let rows = ((1 << 19) / per_row.max(1)).max(256usize.div_ceil(ow));
        rows.clamp(1, oh.max(1))
    }

    /// Runs `f` on the columns of output rows `rows` of one sample (each group's
    /// `patch × rows·ow` block contiguous), in this thread's scratch buffer; a pointwise
    /// convolution's are its input.
    fn with_band<R>(&self, x: &[f32], rows: Range<usize>, f: impl FnOnce(&[f32]) -> R) -> R {
        if self.pointwise() {
            return f(x);
        }
        let (_, ow) = self.output();
        let len = self.groups * self.group_patch() * rows.len() * ow;
        with_scratch(Scratch::Columns, len, |cols| {
            self.im2col(x, rows, cols);
            f(cols)
        })
    }

    /// Accumulates the gradients of `x`, `w` and the bias from `dy` (N×O×OH×OW).
    pub fn backward(
        &self,
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        dw: &mut [f32],
        db: Option<&mut [f32]>,
    ) {
        let (patch, pixels) = (self.group_patch(), self.pixels());
        let in_size = self.in_size();
        let out_size = self.out_channels * pixels;
        let og = self.out_channels / self.groups;
        let split = self.batch < rayon::current_num_threads();
        // Per sample: dW_n = dY_n · colsᵀ, dcols = Wᵀ · dY_n (per group); summed in sample
        // order so the result does not depend on the thread count.
        let parts: Vec<(Vec<f32>, Option<Vec<f32>>)> = (0..self.batch)
            .into_par_iter()
            .map(|n| {
                let xs = &x[n * in_size..(n + 1) * in_size];
                let dys = &dy[n * out_size..(n + 1) * out_size];
                let mut dw_n = vec![0.0; self.out_channels * patch];
                self.with_columns(xs, |cols| {
                    for g in 0..self.groups {
                        gemm_in(
                            split,
                            og,
                            pixels,
                            patch,
                            1.0,
                            &dys[g * og * pixels..],
                            false,
                            &cols[g * patch * pixels..],
                            true,
                            0.0,
                            &mut dw_n[g * og * patch..],
                            patch,
                        );
                    }
                });
                let dx_n = dx.is_some().then(|| {
                    let columns = self.groups * patch * pixels;
                    with_scratch(Scratch::Gradients, columns, |dcols| {
                        for g in 0..self.groups {
                            gemm_in(
                                split,
                                patch,
                                og,
                                pixels,
                                1.0,
                                &w[g * og * patch..],
                                true,
                                &dys[g * og * pixels..],
                                false,
                                0.0,
                                &mut dcols[g * patch * pixels..],
                                pixels,
                            );
                        }
                        if self.pointwise() {
                            return dcols.to_vec();
                        }
                        let mut dx_n = vec![0.0; in_size];
                        self.col2im(dcols, &mut dx_n);
                        dx_n
                    })
                });
                (dw_n, dx_n)
            })
            .collect();
        let mut dx = dx;
        for (n, (dw_n, dx_n)) in parts.into_iter().enumerate() {
            add(dw, &dw_n);
            if let (Some(dx), Some(dx_n)) = (dx.as_deref_mut(), dx_n) {
                add(&mut dx[n * in_size..(n + 1) * in_size], &dx_n);
            }
        }
        if let Some(db) = db {
            for dys in dy.chunks(out_size) {
                for (o, plane) in dys.chunks(pixels).enumerate() {
                    db[o] += plane.iter().sum::<f32>();
                }
            }
        }
    }

    /// The transposed convolution of `x` (N×O×OH×OW, this geometry's output) into `y`
    /// (N×C×H×W, its input), `w` as for [`Conv2d::forward`]: the adjoint of the
    /// convolution's input gradient, i.e. ONNX ConvTranspose with this geometry reversed.
    pub fn transpose(&self, x: &[f32], w: &[f32], y: &mut [f32]) {
        let (patch, pixels) = (self.group_patch(), self.pixels());
        let og = self.out_channels / self.groups;
        y.par_chunks_mut(self.in_size())
            .zip(x.par_chunks(self.out_channels * pixels))
            .for_each(|(ys, xs)| {
                let mut cols = vec![0.0; self.groups * patch * pixels];
                for g in 0..self.groups {
                    gemm(
                        patch,
                        og,
                        pixels,
                        1.0,
                        &w[g * og * patch..],
                        true,
                        &xs[g * og * pixels..],
                        false,
                        0.0,
                        &mut cols[g * patch * pixels..],
                    );
                }
                ys.iter_mut().for_each(|v| *v = 0.0);
                self.col2im(&cols, ys);
            });
    }
}

/// Which of a thread's scratch buffers.
#[derive(Clone, Copy)]
pub(super) enum Scratch {
    /// A sample's input as columns (or transformed into Winograd tiles).
    Columns,
    /// Their gradient (or the products of Winograd tiles).
    Gradients,
}

thread_local! {
    /// Each worker's scratch buffers, kept between calls: a large convolution's column
    /// matrix is tens of megabytes per sample, and allocating it afresh each time cost
    /// page faults that took a quarter of VGG16's forward pass.
    static SCRATCH: [Cell<Vec<f32>>; 2] = const { [Cell::new(Vec::new()), Cell::new(Vec::new())] };
}

/// Runs `f` on `len` floats of unspecified contents (it must write what it reads), in
/// this thread's scratch buffer `which`. A nested call on the same thread (a task stolen
/// while waiting) finds the buffer taken and uses a fresh one.
pub(super) fn with_scratch<R>(which: Scratch, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buffer = SCRATCH.with(|s| s[which as usize].take());
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    let result = f(&mut buffer[..len]);
    SCRATCH.with(|s| s[which as usize].set(buffer));
    result
}
