//! What the CUDA executor asks of a device: buffers, row-major GEMM, and one way to run
//! any kernel of `kernels.cu` ([`Backend::launch`]); the kernels' checked, typed calls are
//! written once over it ([`super::calls::Kernels`]).
//!
//! Three implementations: [`super::gpu::Gpu`] (cudarc: NVRTC modules, cuBLAS, one stream)
//! and, in the `ralpc-cuda-host` crate, the same kernels compiled for the host and a
//! device that only counts. The executor ([`super::train`]) is written once against this
//! trait and [`super::calls::Kernels`], so everything above the kernel launches — how each
//! operator maps to launches, the backward passes, the loss and the optimizer — is tested
//! against the CPU backend on machines without a GPU.

use super::launch::Launch;
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
    /// Elements of `idx`.
    fn index_len(&self, idx: &Self::Idx) -> usize;

    /// The product `g`.
    fn gemm(&self, g: &Gemm, a: &Self::Buf, b: &Self::Buf, c: &mut Self::Buf) -> R<()>;

    /// Runs `launch` (queues it on the device's stream). The executor calls the kernels
    /// through [`super::calls::Kernels`], which checks the buffers first.
    ///
    /// # Safety
    /// Every buffer of `launch` holds all the elements its kernel reads or writes (the
    /// device trusts the sizes: a GPU would read or write out of bounds).
    ///
    /// # Errors
    /// The device failed to launch it.
    unsafe fn launch(&self, launch: Launch<'_, Self::Buf, Self::Idx>) -> R<()>;
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
}
