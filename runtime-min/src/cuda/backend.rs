//! What the CUDA executor asks of a device: buffers, the NVRTC kernels of `kernels.cu`
//! (one method each, same arguments) and row-major GEMM.
//!
//! Two implementations: [`super::gpu::Gpu`] (cudarc: NVRTC modules, cuBLAS, one stream)
//! and, in the `ralpc-cuda-host` crate, the same kernels compiled for the host. The
//! executor ([`super::train`]) is written once against this trait, so everything above the
//! kernel launches — how each operator maps to launches, the backward passes, the loss and
//! the optimizer — is tested against the CPU backend on machines without a GPU.

use super::kernels::{BinaryOp, Strides, UnaryOp, Window};
use crate::cpu::kernels::Conv2d;

pub use super::error::R;

/// A row-major (batched) matrix product `C = alpha·op(A)·op(B) + beta·C`, with `op(A)`
/// `m×k`, `op(B)` `k×n` and `C` `m×n`, each matrix contiguous; matrix `i` of a batch
/// starts `i·stride` elements after the offset (stride 0 broadcasts one matrix).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    /// A is stored `k×m` and transposed.
    pub trans_a: bool,
    /// B is stored `n×k` and transposed.
    pub trans_b: bool,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// Scales the product.
    pub alpha: f32,
    /// Scales C's old value (0 overwrites it).
    pub beta: f32,
    /// Matrices in the batch.
    pub batch: usize,
    /// Where A, B and C start.
    pub offsets: [usize; 3],
    /// Batch strides of A, B and C.
    pub strides: [usize; 3],
}

impl Gemm {
    /// One product `C = op(A)·op(B)`.
    pub fn new(m: usize, n: usize, k: usize) -> Gemm {
        Gemm {
            trans_a: false,
            trans_b: false,
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
            batch: 1,
            offsets: [0; 3],
            strides: [m * k, k * n, m * n],
        }
    }
}

/// A device the executor runs on.
#[allow(
    clippy::too_many_arguments,
    reason = "each method mirrors one kernel's arguments"
)]
pub trait Backend {
    /// A buffer of `f32`: a tensor keeping one resident
    /// ([`Floats`](crate::cpu::floats::Floats)) reads it back from whatever thread reads it.
    type Buf: Send + Sync + 'static;
    /// A buffer of `i64` (labels, argmax indices), kept with a forward pass's state
    /// ([`ResidentSaved`](crate::cpu::ops::ResidentSaved)).
    type Idx: Send + Sync + 'static;

    /// Whether its kernels compute values (not so a device that only counts the work).
    const COMPUTES_VALUES: bool = true;
    /// A point in the device's queue of work (a CUDA event; the clock on the host).
    type Mark;

    /// Marks the work queued so far.
    fn mark(&self) -> R<Self::Mark>;
    /// Microseconds of device work between two marks (waits for the second).
    fn elapsed_us(&self, start: &Self::Mark, end: &Self::Mark) -> R<f64>;

    /// `buf`'s elements, read back without the device at hand: what a tensor's resident
    /// copy does when host code first reads it.
    ///
    /// # Errors
    /// The device failed.
    fn read_back(buf: &Self::Buf) -> R<Vec<f32>>;

    /// `n` zeros.
    fn zeros(&self, n: usize) -> R<Self::Buf>;
    /// `n` zeros of scratch space a sequence of kernels uses and frees (a convolution's
    /// im2col columns): workspace, which a plan reserves apart from its tensors.
    fn scratch(&self, n: usize) -> R<Self::Buf> {
        self.zeros(n)
    }
    /// A copy of `data` on the device.
    fn upload(&self, data: &[f32]) -> R<Self::Buf>;
    /// A copy of `data` on the device.
    fn upload_indices(&self, data: &[i64]) -> R<Self::Idx>;
    /// `n` zero indices.
    fn index_zeros(&self, n: usize) -> R<Self::Idx>;
    /// A copy of `buf` on the host.
    fn download(&self, buf: &Self::Buf) -> R<Vec<f32>>;
    /// A copy of `idx` on the host.
    fn download_indices(&self, idx: &Self::Idx) -> R<Vec<i64>>;
    /// Waits for everything queued on this device's stream.
    fn synchronize(&self) -> R<()>;
    /// Elements of `buf`.
    fn len(&self, buf: &Self::Buf) -> usize;

    /// The product `g`.
    fn gemm(&self, g: &Gemm, a: &Self::Buf, b: &Self::Buf, c: &mut Self::Buf) -> R<()>;

    /// `out = a op b`, broadcast as `s` says.
    fn binary(
        &self,
        out: &mut Self::Buf,
        a: &Self::Buf,
        b: &Self::Buf,
        s: &Strides,
        op: BinaryOp,
    ) -> R<()>;
    /// `dst = src` read through the view `s` (strides in `s.a`) from `offset`.
    fn gather(&self, dst: &mut Self::Buf, src: &Self::Buf, s: &Strides, offset: usize) -> R<()>;
    /// `src` written (or added) into `dst` through the view `s` from `offset`.
    fn scatter(
        &self,
        dst: &mut Self::Buf,
        src: &Self::Buf,
        s: &Strides,
        offset: usize,
        accumulate: bool,
    ) -> R<()>;
    /// `out = op(x)`.
    fn unary(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        op: UnaryOp,
        alpha: f32,
        beta: f32,
    ) -> R<()>;
    /// `dx` of `op` from `dy` and the forward's input or output (`saved`).
    fn unary_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        saved: &Self::Buf,
        op: UnaryOp,
        alpha: f32,
        beta: f32,
    ) -> R<()>;
    /// `out = value`.
    fn fill(&self, out: &mut Self::Buf, value: f32) -> R<()>;
    /// `out = alpha·x + beta·out`.
    fn axpby(&self, out: &mut Self::Buf, x: &Self::Buf, alpha: f32, beta: f32) -> R<()>;
    /// The sum (or mean) of `x` viewed as `[outer, n, inner]` over its middle axis.
    fn reduce_axis(
        &self,
        out: &mut Self::Buf,
        x: &Self::Buf,
        outer: usize,
        n: usize,
        inner: usize,
        mean: bool,
    ) -> R<()>;
    /// Softmax (or log-softmax) of each row of `x`.
    fn softmax_rows(
        &self,
        y: &mut Self::Buf,
        x: &Self::Buf,
        rows: usize,
        n: usize,
        log: bool,
    ) -> R<()>;
    /// Its input gradient.
    fn softmax_rows_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        y: &Self::Buf,
        rows: usize,
        n: usize,
        log: bool,
    ) -> R<()>;
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
    ) -> R<()>;
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
    ) -> R<()>;
    /// One class piece's logits gradient from each row's log-sum-exp over every piece:
    /// `(exp(x − lse) − onehot) / scale`.
    #[allow(
        clippy::too_many_arguments,
        reason = "a kernel's operands and its shape, as the CUDA kernel takes them"
    )]
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
    ) -> R<()>;
    /// Squared error per element (over `total`) and its gradient.
    fn mse(
        &self,
        loss: &mut Self::Buf,
        dx: &mut Self::Buf,
        x: &Self::Buf,
        target: &Self::Buf,
        total: usize,
    ) -> R<()>;
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
    ) -> R<()>;
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
    ) -> R<()>;
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
    ) -> R<()>;
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
    ) -> R<()>;
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
    ) -> R<()>;
    /// Max pooling; `argmax` receives each maximum's input index.
    fn max_pool(
        &self,
        y: &mut Self::Buf,
        argmax: &mut Self::Idx,
        x: &Self::Buf,
        g: &Window,
    ) -> R<()>;
    /// Its input gradient (added into `dx`).
    fn max_pool_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        argmax: &Self::Idx,
        g: &Window,
    ) -> R<()>;
    /// Average pooling.
    fn avg_pool(&self, y: &mut Self::Buf, x: &Self::Buf, g: &Window, count_pad: bool) -> R<()>;
    /// Its input gradient (added into `dx`).
    fn avg_pool_backward(
        &self,
        dx: &mut Self::Buf,
        dy: &Self::Buf,
        g: &Window,
        count_pad: bool,
    ) -> R<()>;
    /// im2col of `images` consecutive images from `offset` in `x`: columns
    /// `[images, planes·kh·kw, oh·ow]`.
    fn im2col(
        &self,
        cols: &mut Self::Buf,
        x: &Self::Buf,
        offset: usize,
        g: &Window,
        images: usize,
    ) -> R<()>;
    /// col2im of `images` images' columns, added into the images from `offset` in `dx`.
    fn col2im(
        &self,
        dx: &mut Self::Buf,
        offset: usize,
        cols: &Self::Buf,
        g: &Window,
        images: usize,
    ) -> R<()>;
    /// `y = conv(x, w)` over the whole batch (no bias), `y` overwritten. The default is
    /// im2col and GEMM ([`super::conv::forward`]).
    fn conv_forward(&self, g: &Conv2d, x: &Self::Buf, w: &Self::Buf, y: &mut Self::Buf) -> R<()> {
        super::conv::forward(self, g, x, w, y)
    }
    /// The input and weight gradients of [`Backend::conv_forward`] for `dy`, written into
    /// `dx` and `dw` (default: [`super::conv::backward`]).
    fn conv_backward(
        &self,
        g: &Conv2d,
        x: &Self::Buf,
        w: &Self::Buf,
        dy: &Self::Buf,
        dx: &mut Self::Buf,
        dw: &mut Self::Buf,
    ) -> R<()> {
        super::conv::backward(self, g, x, w, dy, dx, dw)
    }
    /// SGD with momentum.
    fn sgd_momentum(
        &self,
        w: &mut Self::Buf,
        velocity: &mut Self::Buf,
        grad: &Self::Buf,
        lr: f32,
        momentum: f32,
    ) -> R<()>;
}
