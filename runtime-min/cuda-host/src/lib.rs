//! ralpc's CUDA kernels (`runtime-min/src/cuda/kernels.cu`) compiled for the host through
//! `host_shim.h` — one block of one thread — so that their arithmetic and indexing are
//! tested against the CPU backend on machines without a GPU (`tests/kernels.rs`). On a GPU
//! the same source runs with many threads; its block reductions are tested there.
#![allow(missing_docs, reason = "the declarations mirror kernels.cu one to one")]

pub mod dry;
pub mod streams;

use ralpc_runtime_min::cuda::error::DeviceError;
use ralpc_runtime_min::cuda::kernels::{Strides, Window};

type F = *mut f32;
type C = *const f32;

unsafe extern "C" {
    pub fn binary(out: F, a: C, b: C, s: Strides, n: i64, op: i32);
    pub fn gather_strided(dst: F, src: C, s: Strides, src_offset: i64, n: i64);
    pub fn scatter_strided(dst: F, src: C, s: Strides, dst_offset: i64, n: i64, accumulate: i32);
    pub fn unary(out: F, x: C, n: i64, op: i32, alpha: f32, beta: f32);
    pub fn unary_backward(dx: F, dy: C, saved: C, n: i64, op: i32, alpha: f32, beta: f32);
    pub fn fill(out: F, n: i64, value: f32);
    pub fn axpby(out: F, x: C, n: i64, alpha: f32, beta: f32);
    pub fn reduce_axis(out: F, x: C, outer: i64, n: i64, inner: i64, mean: i32);
    pub fn softmax_rows(y: F, x: C, rows: i64, n: i64, log_space: i32);
    pub fn softmax_rows_backward(dx: F, dy: C, y: C, rows: i64, n: i64, log_space: i32);
    pub fn cross_entropy(
        loss: F,
        dlogits: F,
        logits: C,
        labels: *const i64,
        rows: i64,
        n: i64,
        total_rows: i64,
    );
    pub fn class_stats(stats: F, logits: C, labels: *const i64, rows: i64, n: i64, first: i64);
    pub fn class_piece_grad(
        dlogits: F,
        logits: C,
        lse: C,
        labels: *const i64,
        rows: i64,
        n: i64,
        first: i64,
        scale: f32,
    );
    pub fn mse(loss: F, dx: F, x: C, target: C, n: i64, total: i64);
    pub fn layer_norm(y: F, mean: F, rstd: F, x: C, gamma: C, beta: C, rows: i64, n: i64, eps: f32);
    pub fn layer_norm_backward(dx: F, dy: C, x: C, gamma: C, mean: C, rstd: C, rows: i64, n: i64);
    pub fn channel_stats(mean: F, rstd: F, x: C, batch: i64, channels: i64, spatial: i64, eps: f32);
    pub fn channel_affine(
        y: F,
        x: C,
        mean: C,
        rstd: C,
        gamma: C,
        beta: C,
        channels: i64,
        spatial: i64,
        n: i64,
        rstd_is_var: i32,
        eps: f32,
    );
    pub fn batch_norm_backward(
        dx: F,
        dgamma: F,
        dbeta: F,
        dy: C,
        x: C,
        mean: C,
        rstd: C,
        gamma: C,
        batch: i64,
        channels: i64,
        spatial: i64,
    );
    pub fn max_pool(y: F, argmax: *mut i64, x: C, g: Window);
    pub fn max_pool_backward(dx: F, dy: C, argmax: *const i64, g: Window);
    pub fn avg_pool(y: F, x: C, g: Window, count_pad: i32);
    pub fn avg_pool_backward(dx: F, dy: C, g: Window, count_pad: i32);
    pub fn im2col(cols: F, image: C, g: Window, images: i64);
    pub fn col2im(image: F, cols: C, g: Window, images: i64);
    pub fn sgd_momentum(w: F, velocity: F, grad: C, n: i64, lr: f32, momentum: f32);
}

/// The kernels on the host, behind the executor's [`Backend`]: what the CUDA executor
/// runs, one thread at a time. GEMM is the CPU backend's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Host;

use ralpc_runtime_min::cuda::backend::{Backend, Gemm, R};
use ralpc_runtime_min::cuda::kernels::{BinaryOp, UnaryOp};

fn n(len: usize) -> i64 {
    len as i64
}

impl Backend for Host {
    type Buf = Vec<f32>;
    type Idx = Vec<i64>;
    type Mark = std::time::Instant;

    fn mark(&self) -> R<std::time::Instant> {
        Ok(std::time::Instant::now())
    }
    fn elapsed_us(&self, start: &std::time::Instant, end: &std::time::Instant) -> R<f64> {
        Ok(end.duration_since(*start).as_secs_f64() * 1e6)
    }

    fn zeros(&self, len: usize) -> R<Vec<f32>> {
        Ok(vec![0.0; len])
    }
    fn upload(&self, data: &[f32]) -> R<Vec<f32>> {
        Ok(data.to_vec())
    }
    fn upload_indices(&self, data: &[i64]) -> R<Vec<i64>> {
        Ok(data.to_vec())
    }
    fn index_zeros(&self, len: usize) -> R<Vec<i64>> {
        Ok(vec![0; len])
    }
    fn read_back(buf: &Vec<f32>) -> R<Vec<f32>> {
        Ok(buf.clone())
    }
    fn download(&self, buf: &Vec<f32>) -> R<Vec<f32>> {
        Ok(buf.clone())
    }
    fn download_indices(&self, idx: &Vec<i64>) -> R<Vec<i64>> {
        Ok(idx.clone())
    }
    fn synchronize(&self) -> R<()> {
        Ok(())
    }
    fn len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn gemm(&self, g: &Gemm, a: &Vec<f32>, b: &Vec<f32>, c: &mut Vec<f32>) -> R<()> {
        let (m, n_, k) = (g.m, g.n, g.k);
        for i in 0..g.batch {
            let [oa, ob, oc] = g.offsets;
            let [sa, sb, sc] = g.strides;
            let (a0, b0, c0) = (oa + i * sa, ob + i * sb, oc + i * sc);
            if a0 + m * k > a.len() || b0 + k * n_ > b.len() || c0 + m * n_ > c.len() {
                return Err(DeviceError::Inconsistent(format!(
                    "gemm {g:?} overruns its buffers"
                )));
            }
            // The CPU backend's GEMM: the host paths differ only in how operators map to
            // kernels, not in how a product rounds.
            ralpc_runtime_min::cpu::kernels::gemm(
                m,
                k,
                n_,
                g.alpha,
                &a[a0..],
                g.trans_a,
                &b[b0..],
                g.trans_b,
                g.beta,
                &mut c[c0..],
            );
        }
        Ok(())
    }

    fn binary(
        &self,
        out: &mut Vec<f32>,
        a: &Vec<f32>,
        b: &Vec<f32>,
        s: &Strides,
        op: BinaryOp,
    ) -> R<()> {
        // SAFETY: `s` was built for these buffers by the executor.
        unsafe {
            binary(
                out.as_mut_ptr(),
                a.as_ptr(),
                b.as_ptr(),
                *s,
                n(out.len()),
                op as i32,
            )
        };
        Ok(())
    }
    fn gather(&self, dst: &mut Vec<f32>, src: &Vec<f32>, s: &Strides, offset: usize) -> R<()> {
        // SAFETY: as above.
        unsafe { gather_strided(dst.as_mut_ptr(), src.as_ptr(), *s, n(offset), s.len()) };
        Ok(())
    }
    fn scatter(
        &self,
        dst: &mut Vec<f32>,
        src: &Vec<f32>,
        s: &Strides,
        offset: usize,
        accumulate: bool,
    ) -> R<()> {
        // SAFETY: as above.
        unsafe {
            scatter_strided(
                dst.as_mut_ptr(),
                src.as_ptr(),
                *s,
                n(offset),
                s.len(),
                i32::from(accumulate),
            )
        };
        Ok(())
    }
    fn unary(&self, out: &mut Vec<f32>, x: &Vec<f32>, op: UnaryOp, alpha: f32, beta: f32) -> R<()> {
        // SAFETY: equal lengths.
        unsafe {
            unary(
                out.as_mut_ptr(),
                x.as_ptr(),
                n(x.len()),
                op as i32,
                alpha,
                beta,
            )
        };
        Ok(())
    }
    fn unary_backward(
        &self,
        dx: &mut Vec<f32>,
        dy: &Vec<f32>,
        saved: &Vec<f32>,
        op: UnaryOp,
        alpha: f32,
        beta: f32,
    ) -> R<()> {
        // SAFETY: equal lengths.
        unsafe {
            unary_backward(
                dx.as_mut_ptr(),
                dy.as_ptr(),
                saved.as_ptr(),
                n(dy.len()),
                op as i32,
                alpha,
                beta,
            )
        };
        Ok(())
    }
    fn fill(&self, out: &mut Vec<f32>, value: f32) -> R<()> {
        // SAFETY: one buffer.
        unsafe { fill(out.as_mut_ptr(), n(out.len()), value) };
        Ok(())
    }
    fn axpby(&self, out: &mut Vec<f32>, x: &Vec<f32>, alpha: f32, beta: f32) -> R<()> {
        // SAFETY: equal lengths.
        unsafe { axpby(out.as_mut_ptr(), x.as_ptr(), n(out.len()), alpha, beta) };
        Ok(())
    }
    fn reduce_axis(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        outer: usize,
        len: usize,
        inner: usize,
        mean: bool,
    ) -> R<()> {
        // SAFETY: x is outer·len·inner, out outer·inner.
        unsafe {
            reduce_axis(
                out.as_mut_ptr(),
                x.as_ptr(),
                n(outer),
                n(len),
                n(inner),
                i32::from(mean),
            )
        };
        Ok(())
    }
    fn softmax_rows(
        &self,
        y: &mut Vec<f32>,
        x: &Vec<f32>,
        rows: usize,
        len: usize,
        log: bool,
    ) -> R<()> {
        // SAFETY: rows·len each.
        unsafe { softmax_rows(y.as_mut_ptr(), x.as_ptr(), n(rows), n(len), i32::from(log)) };
        Ok(())
    }
    fn softmax_rows_backward(
        &self,
        dx: &mut Vec<f32>,
        dy: &Vec<f32>,
        y: &Vec<f32>,
        rows: usize,
        len: usize,
        log: bool,
    ) -> R<()> {
        // SAFETY: rows·len each.
        unsafe {
            softmax_rows_backward(
                dx.as_mut_ptr(),
                dy.as_ptr(),
                y.as_ptr(),
                n(rows),
                n(len),
                i32::from(log),
            )
        };
        Ok(())
    }
    fn cross_entropy(
        &self,
        loss: &mut Vec<f32>,
        dlogits: &mut Vec<f32>,
        logits: &Vec<f32>,
        labels: &Vec<i64>,
        rows: usize,
        len: usize,
        total_rows: usize,
    ) -> R<()> {
        // SAFETY: rows·len logits, rows labels and losses.
        unsafe {
            cross_entropy(
                loss.as_mut_ptr(),
                dlogits.as_mut_ptr(),
                logits.as_ptr(),
                labels.as_ptr(),
                n(rows),
                n(len),
                n(total_rows),
            )
        };
        Ok(())
    }
    fn class_stats(
        &self,
        stats: &mut Vec<f32>,
        logits: &Vec<f32>,
        labels: &Vec<i64>,
        rows: usize,
        len: usize,
        first: usize,
    ) -> R<()> {
        if logits.len() < rows * len || stats.len() < 3 * rows || labels.len() < rows {
            return Err(DeviceError::Inconsistent(
                "class statistics: short buffers".into(),
            ));
        }
        // SAFETY: rows·len logits, rows labels, 3·rows statistics (checked above).
        unsafe {
            class_stats(
                stats.as_mut_ptr(),
                logits.as_ptr(),
                labels.as_ptr(),
                n(rows),
                n(len),
                n(first),
            )
        };
        Ok(())
    }
    fn class_piece_grad(
        &self,
        dlogits: &mut Vec<f32>,
        logits: &Vec<f32>,
        lse: &Vec<f32>,
        labels: &Vec<i64>,
        rows: usize,
        len: usize,
        first: usize,
        scale: f32,
    ) -> R<()> {
        if logits.len().min(dlogits.len()) < rows * len || lse.len().min(labels.len()) < rows {
            return Err(DeviceError::Inconsistent(
                "class piece gradient: short buffers".into(),
            ));
        }
        // SAFETY: rows·len logits and gradients, rows log-sum-exps and labels (checked).
        unsafe {
            class_piece_grad(
                dlogits.as_mut_ptr(),
                logits.as_ptr(),
                lse.as_ptr(),
                labels.as_ptr(),
                n(rows),
                n(len),
                n(first),
                scale,
            )
        };
        Ok(())
    }
    fn mse(
        &self,
        loss: &mut Vec<f32>,
        dx: &mut Vec<f32>,
        x: &Vec<f32>,
        target: &Vec<f32>,
        total: usize,
    ) -> R<()> {
        // SAFETY: equal lengths.
        unsafe {
            mse(
                loss.as_mut_ptr(),
                dx.as_mut_ptr(),
                x.as_ptr(),
                target.as_ptr(),
                n(x.len()),
                n(total),
            )
        };
        Ok(())
    }
    fn layer_norm(
        &self,
        y: &mut Vec<f32>,
        mean: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
        x: &Vec<f32>,
        affine: Option<(&Vec<f32>, &Vec<f32>)>,
        rows: usize,
        len: usize,
        eps: f32,
    ) -> R<()> {
        let (g, b) = affine.map_or((std::ptr::null(), std::ptr::null()), |(g, b)| {
            (g.as_ptr(), b.as_ptr())
        });
        // SAFETY: rows·len, rows, and len-long parameters (or null).
        unsafe {
            layer_norm(
                y.as_mut_ptr(),
                mean.as_mut_ptr(),
                rstd.as_mut_ptr(),
                x.as_ptr(),
                g,
                b,
                n(rows),
                n(len),
                eps,
            )
        };
        Ok(())
    }
    fn layer_norm_backward(
        &self,
        dx: &mut Vec<f32>,
        dy: &Vec<f32>,
        x: &Vec<f32>,
        gamma: Option<&Vec<f32>>,
        mean: &Vec<f32>,
        rstd: &Vec<f32>,
        rows: usize,
        len: usize,
    ) -> R<()> {
        let g = gamma.map_or(std::ptr::null(), |g| g.as_ptr());
        // SAFETY: as above.
        unsafe {
            layer_norm_backward(
                dx.as_mut_ptr(),
                dy.as_ptr(),
                x.as_ptr(),
                g,
                mean.as_ptr(),
                rstd.as_ptr(),
                n(rows),
                n(len),
            )
        };
        Ok(())
    }
    fn channel_stats(
        &self,
        mean: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
        x: &Vec<f32>,
        batch: usize,
        channels: usize,
        spatial: usize,
        eps: f32,
    ) -> R<()> {
        // SAFETY: batch·channels·spatial, channels.
        unsafe {
            channel_stats(
                mean.as_mut_ptr(),
                rstd.as_mut_ptr(),
                x.as_ptr(),
                n(batch),
                n(channels),
                n(spatial),
                eps,
            )
        };
        Ok(())
    }
    fn channel_affine(
        &self,
        y: &mut Vec<f32>,
        x: &Vec<f32>,
        mean: &Vec<f32>,
        rstd: &Vec<f32>,
        gamma: &Vec<f32>,
        beta: &Vec<f32>,
        channels: usize,
        spatial: usize,
    ) -> R<()> {
        // SAFETY: as above.
        unsafe {
            channel_affine(
                y.as_mut_ptr(),
                x.as_ptr(),
                mean.as_ptr(),
                rstd.as_ptr(),
                gamma.as_ptr(),
                beta.as_ptr(),
                n(channels),
                n(spatial),
                n(x.len()),
                0,
                0.0,
            )
        };
        Ok(())
    }
    fn batch_norm_backward(
        &self,
        dx: &mut Vec<f32>,
        dgamma: &mut Vec<f32>,
        dbeta: &mut Vec<f32>,
        dy: &Vec<f32>,
        x: &Vec<f32>,
        (mean, rstd): (&Vec<f32>, &Vec<f32>),
        gamma: &Vec<f32>,
        batch: usize,
        channels: usize,
        spatial: usize,
    ) -> R<()> {
        // SAFETY: as above.
        unsafe {
            batch_norm_backward(
                dx.as_mut_ptr(),
                dgamma.as_mut_ptr(),
                dbeta.as_mut_ptr(),
                dy.as_ptr(),
                x.as_ptr(),
                mean.as_ptr(),
                rstd.as_ptr(),
                gamma.as_ptr(),
                n(batch),
                n(channels),
                n(spatial),
            )
        };
        Ok(())
    }
    fn max_pool(&self, y: &mut Vec<f32>, argmax: &mut Vec<i64>, x: &Vec<f32>, g: &Window) -> R<()> {
        // SAFETY: sizes from the window.
        unsafe { max_pool(y.as_mut_ptr(), argmax.as_mut_ptr(), x.as_ptr(), *g) };
        Ok(())
    }
    fn max_pool_backward(
        &self,
        dx: &mut Vec<f32>,
        dy: &Vec<f32>,
        argmax: &Vec<i64>,
        g: &Window,
    ) -> R<()> {
        // SAFETY: sizes from the window; one index per output.
        unsafe { max_pool_backward(dx.as_mut_ptr(), dy.as_ptr(), argmax.as_ptr(), *g) };
        Ok(())
    }
    fn avg_pool(&self, y: &mut Vec<f32>, x: &Vec<f32>, g: &Window, count_pad: bool) -> R<()> {
        // SAFETY: sizes from the window.
        unsafe { avg_pool(y.as_mut_ptr(), x.as_ptr(), *g, i32::from(count_pad)) };
        Ok(())
    }
    fn avg_pool_backward(
        &self,
        dx: &mut Vec<f32>,
        dy: &Vec<f32>,
        g: &Window,
        count_pad: bool,
    ) -> R<()> {
        // SAFETY: as above.
        unsafe { avg_pool_backward(dx.as_mut_ptr(), dy.as_ptr(), *g, i32::from(count_pad)) };
        Ok(())
    }
    fn im2col(
        &self,
        cols: &mut Vec<f32>,
        x: &Vec<f32>,
        offset: usize,
        g: &Window,
        images: usize,
    ) -> R<()> {
        let (image, columns) = (
            (g.planes * g.h * g.w) as usize,
            (g.planes * g.kh * g.kw * g.oh * g.ow) as usize,
        );
        if offset + images * image > x.len() || images * columns > cols.len() {
            return Err(DeviceError::Inconsistent(format!(
                "im2col of {images} images overruns its buffers"
            )));
        }
        // SAFETY: bounds checked above.
        unsafe { im2col(cols.as_mut_ptr(), x[offset..].as_ptr(), *g, n(images)) };
        Ok(())
    }
    fn col2im(
        &self,
        dx: &mut Vec<f32>,
        offset: usize,
        cols: &Vec<f32>,
        g: &Window,
        images: usize,
    ) -> R<()> {
        let (image, columns) = (
            (g.planes * g.h * g.w) as usize,
            (g.planes * g.kh * g.kw * g.oh * g.ow) as usize,
        );
        if offset + images * image > dx.len() || images * columns > cols.len() {
            return Err(DeviceError::Inconsistent(format!(
                "col2im of {images} images overruns its buffers"
            )));
        }
        // SAFETY: bounds checked above.
        unsafe { col2im(dx[offset..].as_mut_ptr(), cols.as_ptr(), *g, n(images)) };
        Ok(())
    }
    fn sgd_momentum(
        &self,
        w: &mut Vec<f32>,
        velocity: &mut Vec<f32>,
        grad: &Vec<f32>,
        lr: f32,
        momentum: f32,
    ) -> R<()> {
        // SAFETY: equal lengths.
        unsafe {
            sgd_momentum(
                w.as_mut_ptr(),
                velocity.as_mut_ptr(),
                grad.as_ptr(),
                n(w.len()),
                lr,
                momentum,
            )
        };
        Ok(())
    }
}
