//! What one GPU's kernels cost: GEMMs (grouped ones at their rows a group), and
//! memory-bound kernels, at the rates a training step keeps of the datasheet's.

use crate::cluster::Precision;
use crate::cost::rates::KernelRates;

/// Rows a group at which a grouped GEMM keeps half its large-group compute rate: a group
/// of `m` rows keeps `m / (m + 128)`. DeepGEMM's FP8 grouped GEMMs on H800 (README @
/// 327ec92f) keep 0.69, 0.77 and 0.92 of their 4,096–8,192-row rate at 256, 512 and 1,024
/// rows a group (N 4,096, K 7,168) and 0.67, 0.75 and 0.76 (N 7,168, K 2,048); `m / (m +
/// 128)` gives 0.67, 0.80 and 0.89 (a 128-row tile's padding and pipeline fill, per group).
pub const GROUPED_GEMM_HALF_ROWS: f64 = 128.0;

/// Kernel prices on one GPU, µs.
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    pub rates: KernelRates,
    pub launch_us: f64,
    /// Bytes of an activation element.
    pub e: f64,
    /// The block's dense layers run in FP8.
    pub fp8: bool,
    /// Kernels quantizing one tensor to the GEMMs' FP8 format where Transformer Engine
    /// does it tensor by tensor ([`quantize_launches`]).
    pub quantize_launches: f64,
}

/// Kernels Transformer Engine launches to quantize one tensor in `precision` when it does
/// not fuse a list of them (it fuses only delayed scaling: "Currently only have fused kernel
/// for FP8 delayed scaling", `pytorch/csrc/extensions/cast.cpp` @ v2.12): tensorwise current
/// scaling, as `--fp8-recipe tensorwise` runs, zeroes the amax, computes it, derives the scale
/// and casts (`Float8CurrentScalingQuantizer::quantize_impl`, `pytorch/csrc/quantizer.cpp`;
/// `zero_amax_kernel`, `compute_scale_from_amax_kernel` in `common/recipe/current_scaling.cu`):
/// 4; MXFP8 computes its block scales in the cast (`MXFP8Quantizer::quantize`): 1.
pub fn quantize_launches(precision: Precision) -> f64 {
    match precision {
        Precision::Fp8 => 4.0,
        Precision::Mxfp8 => 1.0,
        Precision::Fp32 | Precision::Tf32 | Precision::Fp16 | Precision::Bf16 => 0.0,
    }
}

impl Kernels {
    /// `batch` GEMMs `[rows, inner] × [inner, cols]` in one launch: in 16 bits (`sixteen`),
    /// or in the math precision, whichever of compute and memory is longer.
    pub fn gemm(&self, sixteen: bool, rows: f64, cols: f64, inner: f64, batch: f64) -> f64 {
        let (rate, input) = match sixteen || !self.fp8 {
            true => (
                if sixteen {
                    self.rates.gemm_16
                } else {
                    self.rates.gemm
                },
                self.e,
            ),
            false => (self.rates.gemm, 1.0),
        };
        let flops = 2.0 * rows * cols * inner * batch;
        let bytes = (input * (rows * inner + inner * cols) + self.e * rows * cols) * batch;
        (flops / rate).max(bytes / self.rates.hbm) * 1e6 + self.launch_us
    }

    /// Forward and backward (input and weight gradients) of one GEMM, µs.
    pub fn forward_backward(
        &self,
        sixteen: bool,
        rows: f64,
        cols: f64,
        inner: f64,
        batch: f64,
    ) -> (f64, f64) {
        (
            self.gemm(sixteen, rows, cols, inner, batch),
            self.gemm(sixteen, rows, inner, cols, batch)
                + self.gemm(sixteen, inner, cols, rows, batch),
        )
    }

    /// Forward and backward of a grouped GEMM: `groups` products of `rows` each (a local
    /// expert's tokens) in one launch, whose compute rate falls with the rows a group has
    /// ([`GROUPED_GEMM_HALF_ROWS`]), µs.
    pub fn grouped_forward_backward(
        &self,
        rows: f64,
        cols: f64,
        inner: f64,
        groups: f64,
    ) -> (f64, f64) {
        let kept = rows / (rows + GROUPED_GEMM_HALF_ROWS);
        let grouped = Kernels {
            rates: KernelRates {
                gemm: self.rates.gemm * kept,
                ..self.rates
            },
            ..*self
        };
        grouped.forward_backward(false, rows, cols, inner, groups)
    }

    /// Memory-bound kernels moving `bytes` in `launches` launches.
    pub fn elementwise(&self, bytes: f64, launches: f64) -> f64 {
        bytes / self.rates.hbm * 1e6 + launches * self.launch_us
    }
}
