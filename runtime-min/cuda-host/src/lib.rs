//! ralpc's CUDA kernels (`runtime-min/src/cuda/kernels.cu`) compiled for the host through
//! `host_shim.h` — one block of one thread — so that their arithmetic and indexing are
//! tested against the CPU backend on machines without a GPU (`tests/kernels.rs`). On a GPU
//! the same source runs with many threads; its block reductions are tested there.
#![allow(missing_docs, reason = "the declarations mirror kernels.cu one to one")]

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
    pub fn max_pool_backward(dx: F, dy: C, argmax: *const i64, n: i64);
    pub fn avg_pool(y: F, x: C, g: Window, count_pad: i32);
    pub fn avg_pool_backward(dx: F, dy: C, g: Window, count_pad: i32);
    pub fn im2col(cols: F, image: C, g: Window);
    pub fn col2im(image: F, cols: C, g: Window);
    pub fn sgd_momentum(w: F, velocity: F, grad: C, n: i64, lr: f32, momentum: f32);
}
