//! The kernels as the executor calls them: typed (`usize` sizes, `bool` flags, the
//! operation enums), each call checking that its buffers hold what the kernel will touch
//! before it builds the [`Launch`]. Written once for every device — the GPU, the
//! host-compiled kernels and the counting device — through a blanket implementation on
//! [`Backend`], so none of them can skip a check or pass arguments in another order: the
//! device's [`Backend::launch`] is `unsafe`, and this module is its one caller.

use super::backend::{Backend, R};
use super::error::DeviceError;
use super::kernels::{BinaryOp, Strides, UnaryOp, Window};
use super::launch::Launch;

/// A buffer of `len` elements must hold the `needed` a kernel touches: the executor sized
/// it, so a shortfall is ralpc's bug, never the model's.
///
/// # Errors
/// [`DeviceError::Inconsistent`] when `needed > len`.
pub fn fits(what: &str, len: usize, needed: usize) -> R<()> {
    if needed > len {
        Err(DeviceError::Inconsistent(format!(
            "{what}: {needed} elements needed, the buffer has {len}"
        )))
    } else {
        Ok(())
    }
}

/// Runs `launch`, which the calling method built after checking every buffer against what
/// its kernel touches: the one caller of [`Backend::launch`], private to this module so
/// that no launch skips the checks.
fn checked<D: Backend + ?Sized>(dev: &D, launch: Launch<'_, D::Buf, D::Idx>) -> R<()> {
    // SAFETY: each method of `Kernels` checks its buffers with `fits` before it builds the
    // launch, and the launch's arguments are its kernel's by its typed constructor.
    unsafe { dev.launch(launch) }
}

fn int(n: usize) -> i64 {
    n as i64
}

/// The executor's calls of the kernels of `kernels.cu`, on any [`Backend`].
#[allow(
    clippy::too_many_arguments,
    reason = "each method mirrors one kernel's arguments"
)]
pub trait Kernels: Backend {
    /// `out = a op b`, broadcast as `s` says.
    fn binary(
        &self,
        out: &mut Self::Buf,
        a: &Self::Buf,
        b: &Self::Buf,
        s: &Strides,
        op: BinaryOp,
    ) -> R<()> {
        let n = s.len();
        fits("binary", self.len(out), n as usize)?;
        fits("binary a", self.len(a), s.span_a())?;
        fits("binary b", self.len(b), s.span_b())?;
        checked(
            self,
            Launch::binary(n as usize, out, a, b, *s, n, op as i32),
        )
    }
    /// `dst = src` read through the view `s` (strides in `s.a`) from `offset`.
    fn gather(&self, dst: &mut Self::Buf, src: &Self::Buf, s: &Strides, offset: usize) -> R<()> {
        let n = s.len();
        fits("gather", self.len(dst), n as usize)?;
        fits("gather source", self.len(src), offset + s.span_a())?;
        let launch = Launch::gather_strided(n as usize, dst, src, *s, int(offset), n);
        checked(self, launch)
    }
    /// `src` written (or added) into `dst` through the view `s` from `offset`.
    fn scatter(
        &self,
        dst: &mut Self::Buf,
        src: &Self::Buf,
        s: &Strides,
        offset: usize,
        accumulate: bool,
    ) -> R<()> {
        let n = s.len();
        fits("scatter", self.len(src), n as usize)?;
        fits("scatter destination", self.len(dst), offset + s.span_a())?;
        let (offset, accumulate) = (int(offset), i32::from(accumulate));
        checked(
            self,
            Launch::scatter_strided(n as usize, dst, src, *s, offset, n, accumulate),
        )
    }
    /// `out = op(x)`.
    fn unary(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        op: UnaryOp,
        alpha: f32,
        beta: f32,
    ) -> R<()> {
        let n = self.len(x);
        fits("unary", self.len(out), n)?;
        let launch = Launch::unary(n, out, x, int(n), op as i32, alpha, beta);
        checked(self, launch)
    }
    /// `dx` of `op` from `dy` and the forward's input or output (`saved`).
    fn unary_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        saved: &Self::Buf,
        op: UnaryOp,
        alpha: f32,
        beta: f32,
    ) -> R<()> {
        let n = self.len(dy);
        fits("unary backward", self.len(dx).min(self.len(saved)), n)?;
        let code = op as i32;
        let launch = Launch::unary_backward(n, dx, dy, saved, int(n), code, alpha, beta);
        checked(self, launch)
    }
    /// `out = value`.
    fn fill(&self, out: &mut Self::Buf, value: f32) -> R<()> {
        let n = self.len(out);
        checked(self, Launch::fill(n, out, int(n), value))
    }
    /// `out = alpha·x + beta·out`.
    fn axpby(&self, out: &mut Self::Buf, x: &Self::Buf, alpha: f32, beta: f32) -> R<()> {
        let n = self.len(out);
        fits("axpby", self.len(x), n)?;
        checked(self, Launch::axpby(n, out, x, int(n), alpha, beta))
    }
    /// The sum (or mean) of `x` viewed as `[outer, n, inner]` over its middle axis.
    fn reduce_axis(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        outer: usize,
        n: usize,
        inner: usize,
        mean: bool,
    ) -> R<()> {
        fits("reduce_axis", self.len(x), outer * n * inner)?;
        fits("reduce_axis", self.len(out), outer * inner)?;
        let (o, k, i, mean) = (int(outer), int(n), int(inner), i32::from(mean));
        checked(
            self,
            Launch::reduce_axis(outer * inner, out, x, o, k, i, mean),
        )
    }
    /// Softmax (or log-softmax) of each row of `x`.
    fn softmax_rows(
        &self,
        y: &mut Self::Buf,
        x: &Self::Buf,
        rows: usize,
        n: usize,
        log: bool,
    ) -> R<()> {
        fits("softmax", self.len(x).min(self.len(y)), rows * n)?;
        let (r, k, log) = (int(rows), int(n), i32::from(log));
        checked(self, Launch::softmax_rows(rows, y, x, r, k, log))
    }
    /// Its input gradient.
    fn softmax_rows_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        y: &Self::Buf,
        rows: usize,
        n: usize,
        log: bool,
    ) -> R<()> {
        let held = self.len(dx).min(self.len(dy)).min(self.len(y));
        fits("softmax backward", held, rows * n)?;
        let (r, k, log) = (int(rows), int(n), i32::from(log));
        checked(
            self,
            Launch::softmax_rows_backward(rows, dx, dy, y, r, k, log),
        )
    }
    /// Softmax cross-entropy per row (over `total_rows`) and the logits' gradient.
    fn cross_entropy(
        &self,
        loss: &mut Self::Buf,
        dlogits: &mut Self::Buf,
        logits: &Self::Buf,
        labels: &Self::Idx,
        rows: usize,
        n: usize,
        total_rows: usize,
    ) -> R<()> {
        let held = self.len(logits).min(self.len(dlogits));
        fits("cross entropy", held, rows * n)?;
        let held = self.len(loss).min(self.index_len(labels));
        fits("cross entropy", held, rows)?;
        let (r, k, t) = (int(rows), int(n), int(total_rows));
        let launch = Launch::cross_entropy(rows, loss, dlogits, logits, labels, r, k, t);
        checked(self, launch)
    }
    /// Per row of one class piece of logits [rows, n] (classes `first..first + n`), its
    /// max, sum of `exp(x − max)` and label logit (0 when the label is another piece's):
    /// `stats[3r..3r + 3]`.
    fn class_stats(
        &self,
        stats: &mut Self::Buf,
        logits: &Self::Buf,
        labels: &Self::Idx,
        rows: usize,
        n: usize,
        first: usize,
    ) -> R<()> {
        fits("class statistics", self.len(logits), rows * n)?;
        fits("class statistics", self.len(stats), 3 * rows)?;
        fits("class statistics", self.index_len(labels), rows)?;
        let (r, k, f) = (int(rows), int(n), int(first));
        checked(
            self,
            Launch::class_stats(rows, stats, logits, labels, r, k, f),
        )
    }
    /// One class piece's logits gradient from each row's log-sum-exp over every piece:
    /// `(exp(x − lse) − onehot) / scale`.
    fn class_piece_grad(
        &self,
        dlogits: &mut Self::Buf,
        logits: &Self::Buf,
        lse: &Self::Buf,
        labels: &Self::Idx,
        rows: usize,
        n: usize,
        first: usize,
        scale: f32,
    ) -> R<()> {
        let held = self.len(logits).min(self.len(dlogits));
        fits("class piece gradient", held, rows * n)?;
        let held = self.len(lse).min(self.index_len(labels));
        fits("class piece gradient", held, rows)?;
        let (r, k, f) = (int(rows), int(n), int(first));
        checked(
            self,
            Launch::class_piece_grad(rows * n, dlogits, logits, lse, labels, r, k, f, scale),
        )
    }
    /// Squared error per element (over `total`) and its gradient.
    fn mse(
        &self,
        loss: &mut Self::Buf,
        dx: &mut Self::Buf,
        x: &Self::Buf,
        target: &Self::Buf,
        total: usize,
    ) -> R<()> {
        let n = self.len(x);
        let held = self.len(loss).min(self.len(dx)).min(self.len(target));
        fits("mse", held, n)?;
        let launch = Launch::mse(n, loss, dx, x, target, int(n), int(total));
        checked(self, launch)
    }
    /// Layer norm of each row (without scale and shift when they are absent); saves the
    /// rows' mean and 1/std.
    fn layer_norm(
        &self,
        y: &mut Self::Buf,
        mean: &mut Self::Buf,
        rstd: &mut Self::Buf,
        x: &Self::Buf,
        affine: Option<(&Self::Buf, &Self::Buf)>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> R<()> {
        fits("layer norm", self.len(x).min(self.len(y)), rows * n)?;
        fits("layer norm", self.len(mean).min(self.len(rstd)), rows)?;
        if let Some((gamma, beta)) = affine {
            fits("layer norm", self.len(gamma).min(self.len(beta)), n)?;
        }
        let (gamma, beta) = (affine.map(|a| a.0), affine.map(|a| a.1));
        let (r, k) = (int(rows), int(n));
        checked(
            self,
            Launch::layer_norm(rows, y, mean, rstd, x, gamma, beta, r, k, eps),
        )
    }
    /// Its input gradient (without a scale when `gamma` is absent).
    fn layer_norm_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        x: &Self::Buf,
        gamma: Option<&Self::Buf>,
        mean: &Self::Buf,
        rstd: &Self::Buf,
        rows: usize,
        n: usize,
    ) -> R<()> {
        let held = self.len(dx).min(self.len(dy)).min(self.len(x));
        fits("layer norm backward", held, rows * n)?;
        fits(
            "layer norm backward",
            self.len(mean).min(self.len(rstd)),
            rows,
        )?;
        if let Some(gamma) = gamma {
            fits("layer norm backward", self.len(gamma), n)?;
        }
        let (r, k) = (int(rows), int(n));
        checked(
            self,
            Launch::layer_norm_backward(rows, dx, dy, x, gamma, mean, rstd, r, k),
        )
    }
    /// Per-channel mean and 1/std of `x` `[batch, channels, spatial]`.
    fn channel_stats(
        &self,
        mean: &mut Self::Buf,
        rstd: &mut Self::Buf,
        x: &Self::Buf,
        batch: usize,
        channels: usize,
        spatial: usize,
        eps: f32,
    ) -> R<()> {
        fits("batch statistics", self.len(x), batch * channels * spatial)?;
        fits(
            "batch statistics",
            self.len(mean).min(self.len(rstd)),
            channels,
        )?;
        let (b, c, s) = (int(batch), int(channels), int(spatial));
        let launch = Launch::channel_stats(channels, mean, rstd, x, b, c, s, eps);
        checked(self, launch)
    }
    /// `y = (x - mean)·rstd·gamma + beta` per channel.
    fn channel_affine(
        &self,
        y: &mut Self::Buf,
        x: &Self::Buf,
        mean: &Self::Buf,
        rstd: &Self::Buf,
        gamma: &Self::Buf,
        beta: &Self::Buf,
        channels: usize,
        spatial: usize,
    ) -> R<()> {
        let n = self.len(x);
        fits("batch norm", self.len(y), n)?;
        let held = [mean, rstd, gamma, beta].map(|b| self.len(b));
        fits(
            "batch norm",
            held.into_iter().fold(usize::MAX, usize::min),
            channels,
        )?;
        let (c, s) = (int(channels), int(spatial));
        // The kernel's other mode (a variance in `rstd`, and its `eps`) is unused here.
        let (rstd_is_var, eps) = (0, 0.0);
        checked(
            self,
            Launch::channel_affine(
                n,
                y,
                x,
                mean,
                rstd,
                gamma,
                beta,
                c,
                s,
                int(n),
                rstd_is_var,
                eps,
            ),
        )
    }
    /// Batch norm's gradients.
    fn batch_norm_backward(
        &self,
        dx: &mut Self::Buf,
        dgamma: &mut Self::Buf,
        dbeta: &mut Self::Buf,
        dy: &Self::Buf,
        x: &Self::Buf,
        stats: (&Self::Buf, &Self::Buf),
        gamma: &Self::Buf,
        batch: usize,
        channels: usize,
        spatial: usize,
    ) -> R<()> {
        let held = self.len(dx).min(self.len(dy)).min(self.len(x));
        fits("batch norm backward", held, batch * channels * spatial)?;
        let (mean, rstd) = stats;
        let held = [&*dgamma, &*dbeta, mean, rstd, gamma].map(|b| self.len(b));
        let held = held.into_iter().fold(usize::MAX, usize::min);
        fits("batch norm backward", held, channels)?;
        let (b, c, s) = (int(batch), int(channels), int(spatial));
        checked(
            self,
            Launch::batch_norm_backward(
                channels, dx, dgamma, dbeta, dy, x, mean, rstd, gamma, b, c, s,
            ),
        )
    }
    /// Max pooling; `argmax` receives each maximum's input index.
    fn max_pool(
        &self,
        y: &mut Self::Buf,
        argmax: &mut Self::Idx,
        x: &Self::Buf,
        g: &Window,
    ) -> R<()> {
        let n = g.outputs();
        fits("max pool", self.len(y).min(self.index_len(argmax)), n)?;
        fits("max pool", self.len(x), g.inputs())?;
        checked(self, Launch::max_pool(n, y, argmax, x, *g))
    }
    /// Its input gradient (added into `dx`).
    fn max_pool_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        argmax: &Self::Idx,
        g: &Window,
    ) -> R<()> {
        let n = g.inputs();
        fits("max pool backward", self.len(dx), n)?;
        let held = self.index_len(argmax).min(self.len(dy));
        fits("max pool backward", held, g.outputs())?;
        checked(self, Launch::max_pool_backward(n, dx, dy, argmax, *g))
    }
    /// Average pooling.
    fn avg_pool(&self, y: &mut Self::Buf, x: &Self::Buf, g: &Window, count_pad: bool) -> R<()> {
        let n = g.outputs();
        fits("average pool", self.len(y), n)?;
        fits("average pool", self.len(x), g.inputs())?;
        let count_pad = i32::from(count_pad);
        checked(self, Launch::avg_pool(n, y, x, *g, count_pad))
    }
    /// Its input gradient (added into `dx`).
    fn avg_pool_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        g: &Window,
        count_pad: bool,
    ) -> R<()> {
        let n = g.inputs();
        fits("average pool backward", self.len(dy), g.outputs())?;
        fits("average pool backward", self.len(dx), n)?;
        let count_pad = i32::from(count_pad);
        checked(self, Launch::avg_pool_backward(n, dx, dy, *g, count_pad))
    }
    /// im2col of `images` consecutive images from `offset` in `x`: columns
    /// `[images, planes·kh·kw, oh·ow]`.
    fn im2col(
        &self,
        cols: &mut Self::Buf,
        x: &Self::Buf,
        offset: usize,
        g: &Window,
        images: usize,
    ) -> R<()> {
        let n = images * g.columns();
        fits("im2col", self.len(cols), n)?;
        fits("im2col", self.len(x), offset + images * g.inputs())?;
        let launch = Launch::im2col(n, cols, x, int(offset), *g, int(images));
        checked(self, launch)
    }
    /// col2im of `images` images' columns, added into the images from `offset` in `dx`.
    fn col2im(
        &self,
        dx: &mut Self::Buf,
        offset: usize,
        cols: &Self::Buf,
        g: &Window,
        images: usize,
    ) -> R<()> {
        let n = images * g.inputs();
        fits("col2im", self.len(cols), images * g.columns())?;
        fits("col2im", self.len(dx), offset + n)?;
        let launch = Launch::col2im(n, dx, int(offset), cols, *g, int(images));
        checked(self, launch)
    }
    /// SGD with momentum.
    fn sgd_momentum(
        &self,
        w: &mut Self::Buf,
        velocity: &mut Self::Buf,
        grad: &Self::Buf,
        lr: f32,
        momentum: f32,
    ) -> R<()> {
        let n = self.len(w);
        fits("sgd", self.len(velocity).min(self.len(grad)), n)?;
        let launch = Launch::sgd_momentum(n, w, velocity, grad, int(n), lr, momentum);
        checked(self, launch)
    }
}

impl<T: Backend + ?Sized> Kernels for T {}
