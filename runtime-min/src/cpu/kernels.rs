//! Forward and backward kernels on `f32` slices in row-major NCHW layout.
//!
//! Matrix products go through the `gemm` crate (packed, vectorized; [`gemm`] runs
//! blocks of large ones in parallel), never a hand-written loop nest; convolutions are lowered to it with im2col, one sample at a
//! time in parallel (rayon). Backward kernels accumulate into their gradient outputs
//! (`+=`), as a layer's gradient sums over microbatches and over consumers.

use std::cell::Cell;
use std::ops::Range;

use rayon::prelude::*;

/// `C = alpha·op(A)·op(B) + beta·C` for row-major `A` (`m×k`, or `k×m` when `trans_a`),
/// `B` (`k×n`, or `n×k` when `trans_b`) and `C` (`m×n`).
///
/// Large products are cut into blocks of rows of `C` (or of columns, when `C` has few
/// rows) that rayon runs in parallel; each block is one `gemm::gemm` call. Inside an
/// already parallel loop (a convolution's samples) the blocks are stolen as threads free
/// up, so nothing is oversubscribed.
#[allow(clippy::too_many_arguments, reason = "the BLAS signature")]
pub fn gemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    trans_a: bool,
    b: &[f32],
    trans_b: bool,
    beta: f32,
    c: &mut [f32],
) {
    gemm_in(true, m, k, n, alpha, a, trans_a, b, trans_b, beta, c, n);
}

/// [`gemm`], cut into parallel blocks only when `split` (callers that already run one
/// product per thread pass `false`), with `C`'s rows `ldc` apart.
#[allow(clippy::too_many_arguments, reason = "the BLAS signature")]
fn gemm_in(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    trans_a: bool,
    b: &[f32],
    trans_b: bool,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(
        a.len() >= m * k
            && b.len() >= k * n
            && ldc >= n
            && (m == 0 || c.len() >= (m - 1) * ldc + n),
        "gemm operand sizes"
    );
    let (rsa, csa) = if trans_a { (1, m) } else { (k, 1) };
    let (rsb, csb) = if trans_b { (1, k) } else { (n, 1) };
    let a = Strided {
        at: a.as_ptr(),
        rows: rsa,
        columns: csa,
    };
    let b = Strided {
        at: b.as_ptr(),
        rows: rsb,
        columns: csb,
    };
    // SAFETY: the assert above bounds A, B and C for these strides.
    unsafe { gemm_raw(split, m, k, n, alpha, a, b, beta, c.as_mut_ptr(), ldc) }
}

/// A read-only matrix operand: its first element and the distance between rows and
/// between columns.
#[derive(Clone, Copy)]
struct Strided {
    at: *const f32,
    rows: usize,
    columns: usize,
}

/// [`gemm_in`] on raw operands: `C` (`m×n`, rows `ldc` apart, from `c`) =
/// `alpha·A·B + beta·C`.
///
/// # Safety
/// `a` must address `m×k` elements, `b` `k×n`, and `c` `m×n` that nothing else reads or
/// writes during the call.
#[allow(clippy::too_many_arguments, reason = "the BLAS signature")]
unsafe fn gemm_raw(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Strided,
    b: Strided,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    let threads = rayon::current_num_threads();
    // Below ~4 MFLOP a block costs more to schedule than to compute.
    let blocks = if split && threads > 1 && m * n * k >= 1 << 21 {
        threads
    } else {
        1
    };
    let (a_at, b_at, c_at) = (a.at as usize, b.at as usize, c as usize);
    let block = |i: usize, rows: bool, size: usize| {
        let lo = i * size;
        let (len, total) = if rows {
            (size.min(m.saturating_sub(lo)), m)
        } else {
            (size.min(n.saturating_sub(lo)), n)
        };
        if lo >= total || len == 0 {
            return;
        }
        // SAFETY: the caller bounds A, B and C; a block reads rows `lo..lo + len` of A (or
        // columns of B) and writes the matching rows (columns) of C, which no other block
        // writes, so the blocks' writes are disjoint.
        unsafe {
            let (a_ptr, b_ptr, c_ptr, mm, nn) = if rows {
                (
                    (a_at as *const f32).add(lo * a.rows),
                    b_at as *const f32,
                    (c_at as *mut f32).add(lo * ldc),
                    len,
                    n,
                )
            } else {
                (
                    a_at as *const f32,
                    (b_at as *const f32).add(lo * b.columns),
                    (c_at as *mut f32).add(lo),
                    m,
                    len,
                )
            };
            // gemm's `dst = alpha·dst + beta·lhs·rhs`: BLAS's alpha and beta swap places.
            gemm::gemm(
                mm,
                nn,
                k,
                c_ptr,
                1,
                ldc as isize,
                beta != 0.0,
                a_ptr,
                a.columns as isize,
                a.rows as isize,
                b_ptr,
                b.columns as isize,
                b.rows as isize,
                beta,
                alpha,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    };
    if blocks == 1 {
        block(0, true, m);
        return;
    }
    // Each block packs its share of one operand and all of the other: cut the larger
    // dimension.
    let rows = m >= n;
    let size = if rows {
        m.div_ceil(blocks)
    } else {
        n.div_ceil(blocks)
    };
    (0..blocks)
        .into_par_iter()
        .for_each(|i| block(i, rows, size));
}

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
        if self.stride != (1, 1) || self.dilation != (1, 1) {
            self.for_each_column(rows, |col, src| cols[col] = src.map_or(0.0, |i| x[i]));
            return;
        }
        let (_, ow) = self.output();
        let (h, w) = self.input;
        let (top, left) = (self.padding[0], self.padding[1]);
        let first = rows.start;
        let mut rows = cols.chunks_mut(rows.len() * ow);
        for c in 0..self.in_channels {
            for ky in 0..self.kernel.0 {
                for kx in 0..self.kernel.1 {
                    let Some(row) = rows.next() else { return };
                    // Output columns whose input column x = ox + kx − left is inside.
                    let lo = left.saturating_sub(kx).min(ow);
                    let hi = (w + left).saturating_sub(kx).min(ow).max(lo);
                    for (i, out) in row.chunks_mut(ow).enumerate() {
                        match (first + i + ky).checked_sub(top).filter(|&y| y < h) {
                            Some(y) => {
                                out[..lo].fill(0.0);
                                out[hi..].fill(0.0);
                                let start = (c * h + y) * w + lo + kx - left;
                                out[lo..hi].copy_from_slice(&x[start..start + hi - lo]);
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
    /// ([`Conv2d::band_rows`]), so they are still in cache when the GEMM packs them: VGG16's
    /// first layers have 115 MB of columns per sample, written then read back from memory.
    /// The bands of every sample run in parallel, each one product of the same shape
    /// whatever the batch, so a sample's output does not depend on how many share it.
    pub fn forward(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
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
enum Scratch {
    /// A sample's input as columns.
    Columns,
    /// Their gradient.
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
fn with_scratch<R>(which: Scratch, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buffer = SCRATCH.with(|s| s[which as usize].take());
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    let result = f(&mut buffer[..len]);
    SCRATCH.with(|s| s[which as usize].set(buffer));
    result
}

/// `a += b`, elementwise.
pub fn add(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
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
    let mut loss = 0.0f64;
    for (r, ((row, &label), drow)) in logits
        .chunks(classes)
        .zip(labels)
        .zip(dlogits.chunks_mut(classes))
        .enumerate()
    {
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
        for (j, (d, &v)) in drow.iter_mut().zip(row).enumerate() {
            let p = (f64::from(v) - lse).exp() as f32;
            *d = (p - if first + j == label as usize {
                1.0
            } else {
                0.0
            }) / scale;
        }
    }
    loss / f64::from(scale)
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
            // One loop per form, each inlined whole, so the exact one vectorizes.
            if tanh {
                for (o, &v) in ys.iter_mut().zip(xs) {
                    *o = v * gaussian_cdf(true, f64::from(v)) as f32;
                }
            } else {
                for (o, &v) in ys.iter_mut().zip(xs) {
                    *o = v * gaussian_cdf(false, f64::from(v)) as f32;
                }
            }
        });
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

/// Layer normalization over the last axis (rows of `width`): `y = γ·x̂ + β`. Returns each
/// row's mean and inverse standard deviation for the backward pass.
pub fn layer_norm(
    width: usize,
    epsilon: f32,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    y: &mut [f32],
) -> (Vec<f32>, Vec<f32>) {
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
