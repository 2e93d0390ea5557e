//! What real kernels reach of a GPU's datasheet peaks, by architecture: GEMMs (cuBLAS /
//! cuBLASLt, hipBLASLt), fused attention (FlashAttention-2 and -3, cuDNN) and memory-bound
//! kernels (STREAM-like bandwidth). Each figure is a published measurement of an isolated
//! kernel, cited where it is written; what a kernel keeps of it inside a training step is one
//! factor for every GPU, [`IN_STEP`].
//!
//! A kernel's time is its work over `peak × rate × IN_STEP` (compute) or its bytes over
//! `HBM bandwidth × hbm` (memory), whichever is longer: one model for every generation, the
//! 2021 A100 tables and the 2025 H100 and Blackwell tables alike.

use crate::cluster::{Generation, GpuType, Precision};

/// Fraction of an isolated kernel's rate it keeps inside a training step: clock throttling
/// under sustained load at the power limit, and the gaps between kernels that no term of the
/// model prices. The one parameter fitted to training runs: the value, in steps of 0.01,
/// minimizing the mean |error| on Narayanan et al.'s SC'21 Table 1 (A100) with the
/// published GEMM rate below — it was 0.68 of the peak before rates per generation, 0.68 /
/// 0.87 ≈ 0.78 — applied unchanged to every GPU, era and precision
/// (`passes/tests/megatron.rs` and `passes/tests/anchors_bridge.rs` print both tables).
pub const IN_STEP: f64 = 0.78;

/// Achievable fractions of the datasheet's dense peaks and bandwidth, isolated kernels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Large 16-bit (and TF32/FP32) GEMMs.
    pub gemm: f64,
    /// Large FP8 GEMMs (per-tensor scaled; MXFP8 on Blackwell alike).
    pub gemm_fp8: f64,
    /// Fused causal attention, forward, 16-bit, head size 128, long sequences.
    pub attention_forward: f64,
    /// Its backward pass (five GEMMs, the scores recomputed).
    pub attention_backward: f64,
    /// Memory-bound kernels: of the HBM bandwidth.
    pub hbm: f64,
}

impl Rates {
    /// The rates of `generation`.
    pub fn of(generation: Generation) -> Rates {
        // GEMMs: the "maximum achievable matmul FLOPS" sweeps of `torch.matmul` (cuBLAS,
        // hipBLASLt) over shapes, one method on every GPU (S. Bekman, *Machine Learning
        // Engineering*, `compute/accelerator/README.md`, MAMF table): A100 SXM BF16 271.2 of
        // 312 TFLOPS; H100 SXM BF16 794.5 of 989, FP8 1,402.6 of 1,979; B200 BF16 1,745 of
        // 2,250, FP8 3,432.5 of 4,500; GB200 BF16 1,822 of 2,500, FP8 3,615.6 of 5,000;
        // MI300X BF16 668.4 of 1,300.
        //
        // Attention, causal, head size 128, sequence 8k: FlashAttention-3 on H100 SXM5
        // (Shah et al., 2024, fig. 5–7) forward 602 TFLOPS, backward 559 (the backward
        // figure is for the full square: the causal one is not taken); FlashAttention-4 on
        // B200 (Zadouri et al., 2026) forward up to 1,613 TFLOPS.
        //
        // Memory-bound kernels: BabelStream Triad on A100 1.33 of 1.555 TB/s (Deakin et al.,
        // 2020); FlashMLA's memory-bound decoding on H800 (H100's HBM3) 3,000 of 3,350 GB/s
        // (deepseek-ai/FlashMLA README); CCCL's bandwidth benchmark on B200 6.72 of 8 TB/s.
        match generation {
            // Volta has no FlashAttention kernels (they need sm80): the attention figures are
            // Ampere's scaled by its GEMM's, and no figure of its own is taken for GEMMs or
            // bandwidth: Ampere's.
            Generation::Volta => Rates {
                gemm: 0.87,
                gemm_fp8: 0.87,
                attention_forward: 0.60,
                attention_backward: 0.50,
                hbm: 0.85,
            },
            // Attention: FlashAttention-2 trains whole GPTs at up to 225 TFLOPS per A100
            // (72 % of peak, Dao-AILab/flash-attention README); its kernels' backward runs
            // below their forward (the FlashAttention-3 paper's FA2 figures on H100: 0.87 of
            // the forward at 8k), so 0.65 forward and 0.55 backward.
            Generation::Ampere => Rates {
                gemm: 0.87,
                gemm_fp8: 0.87,
                attention_forward: 0.65,
                attention_backward: 0.55,
                hbm: 0.85,
            },
            // H100 and H200 (the H200's FP8 sweep: 1,453.4 of 1,979, 0.73; the H100's taken).
            Generation::Hopper => Rates {
                gemm: 0.80,
                gemm_fp8: 0.71,
                attention_forward: 0.61,
                attention_backward: 0.56,
                hbm: 0.90,
            },
            // The mean of the B200's and GB200's sweeps (BF16 0.78 and 0.73, FP8 0.76 and
            // 0.72); attention: FlashAttention-4's forward (0.72 of the B200's peak) less the
            // causal mask's loss at 8k as on Hopper (602 / 646), backward in the forward's
            // ratio on Hopper (559 / 646).
            Generation::Blackwell => Rates {
                gemm: 0.75,
                gemm_fp8: 0.74,
                attention_forward: 0.67,
                attention_backward: 0.58,
                hbm: 0.84,
            },
            // MI300X: BF16 0.51; no FP8 sweep or attention figure is taken: the BF16 GEMM's
            // fraction for FP8, attention in Hopper's ratio to the GEMM. HBM: AMD's engineers
            // state the 5.3 TB/s is not reached in practice; no figure taken, 0.80 assumed.
            Generation::Cdna3 => Rates {
                gemm: 0.51,
                gemm_fp8: 0.51,
                attention_forward: 0.39,
                attention_backward: 0.36,
                hbm: 0.80,
            },
            // Unknown: below Ampere, no fused-attention advantage.
            Generation::Other => Rates {
                gemm: 0.80,
                gemm_fp8: 0.70,
                attention_forward: 0.50,
                attention_backward: 0.40,
                hbm: 0.80,
            },
        }
    }
}

/// In-step rates of one GPU at one precision, FLOP/s and bytes/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelRates {
    /// GEMMs of the math precision (FP8 ones at FP8 precisions).
    pub gemm: f64,
    /// GEMMs kept in 16 bits whatever the precision (the LM head, as Transformer Engine
    /// recipes leave it).
    pub gemm_16: f64,
    /// Fused attention forward (16-bit).
    pub attention_forward: f64,
    /// Fused attention backward (16-bit).
    pub attention_backward: f64,
    /// Memory-bound kernels.
    pub hbm: f64,
}

impl KernelRates {
    /// The rates `gpu` reaches inside a training step at `precision`.
    pub fn new(gpu: &GpuType, precision: Precision) -> KernelRates {
        let rates = Rates::of(gpu.generation);
        let peak16 = gpu.bf16.or(gpu.fp16).unwrap_or(gpu.fp32);
        let peak = gpu.peak(precision).unwrap_or(peak16);
        let (gemm, gemm_16) = match precision {
            Precision::Fp8 | Precision::Mxfp8 if gpu.peak(precision).is_some() => {
                (peak * rates.gemm_fp8, peak16 * rates.gemm)
            }
            Precision::Fp8 | Precision::Mxfp8 => (peak16 * rates.gemm, peak16 * rates.gemm),
            _ => (peak * rates.gemm, peak * rates.gemm),
        };
        // Fused attention runs in 16 bits at 16-bit (and FP8) precisions; at FP32/TF32 its
        // GEMMs take the math precision's peak.
        let attention_peak = match precision {
            Precision::Fp32 | Precision::Tf32 => peak,
            _ => peak16,
        };
        KernelRates {
            gemm: gemm * IN_STEP,
            gemm_16: gemm_16 * IN_STEP,
            attention_forward: attention_peak * rates.attention_forward * IN_STEP,
            attention_backward: attention_peak * rates.attention_backward * IN_STEP,
            hbm: gpu.hbm_bandwidth * rates.hbm,
        }
    }
}
