//! The executor's [`Backend`] on an NVIDIA GPU through cudarc: the NVRTC kernels compiled
//! for the device's architecture, cuBLAS for GEMM (TF32 off: cuBLAS's default math), one
//! stream. Callers check the libraries first ([`super::libs::check`]): cudarc panics on a
//! missing one.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm as _, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};

use super::backend::{Backend, Gemm, R};
use super::calls::fits;
use super::cudnn::Convolutions;
use super::error::{DeviceError, SetupError};
use super::kernels;
use super::launch::{Arg, Grid, Kernel, Launch};
use crate::cpu::kernels::Conv2d;

/// Threads per block of every launch (a power of two, as the row kernels need).
const BLOCK: u32 = 256;

/// One GPU with ralpc's kernels loaded.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Collectives' stream, so that they can overlap computation.
    comm: Arc<CudaStream>,
    blas: CudaBlas,
    /// cuDNN, when installed; convolutions lower to im2col without it.
    convolutions: Option<Convolutions>,
    functions: BTreeMap<Kernel, CudaFunction>,
}

fn fail<E: std::fmt::Debug>(what: &'static str) -> impl FnOnce(E) -> DeviceError {
    DeviceError::debug(what)
}

impl Gpu {
    /// GPU `ordinal`, its kernels compiled by NVRTC for its architecture.
    ///
    /// # Errors
    /// No such GPU, an NVRTC newer than the driver, a kernel that does not compile or
    /// load, or cuBLAS failing to start.
    pub fn new(ordinal: usize) -> R<Gpu> {
        let ctx = CudaContext::new(ordinal).map_err(fail("cannot open the GPU"))?;
        keep_freed_memory(&ctx)?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(fail("cannot read the GPU's architecture"))?;
        // Machine code for this exact device, which loads whatever the driver's CUDA
        // version; PTX (finished by the driver) only if NVRTC cannot make it and is not newer
        // than the driver.
        let (major, minor) = (major.max(0) as u32, minor.max(0) as u32);
        let image = match kernels::compile_cubin(major, minor) {
            Ok(cubin) => cudarc::nvrtc::Ptx::from_binary(cubin),
            Err(cubin_error) => {
                let driver = super::device::driver_version()?;
                let nvrtc = kernels::nvrtc_version()?;
                if nvrtc > driver {
                    return Err(SetupError::NvrtcNewer {
                        nvrtc,
                        driver,
                        cubin: Box::new(cubin_error),
                    }
                    .into());
                }
                kernels::compile(major, minor)?.ptx
            }
        };
        let module = ctx
            .load_module(image)
            .map_err(fail("the driver cannot load the kernels"))?;
        let functions = Kernel::ALL
            .iter()
            .map(|&kernel| {
                let name = kernel.name();
                module
                    .load_function(name)
                    .map(|f| (kernel, f))
                    .map_err(DeviceError::call(format!("cannot load kernel {name}")))
            })
            .collect::<R<_>>()?;
        // The training job's stream at the highest priority the device has (CUDA clamps
        // the number into its range), so background work on the GPU yields to it.
        let stream = ctx
            .new_stream_with_priority(-1000)
            .map_err(fail("cannot create a stream"))?;
        let comm = ctx.new_stream().map_err(fail("cannot create a stream"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(fail("cannot start cuBLAS"))?;
        let convolutions = Convolutions::new(&stream)?;
        Ok(Gpu {
            ctx,
            stream,
            comm,
            blas,
            convolutions,
            functions,
        })
    }

    /// The context (for events and timing).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream collectives go to.
    pub fn comm_stream(&self) -> &Arc<CudaStream> {
        &self.comm
    }

    fn function(&self, kernel: Kernel) -> R<&CudaFunction> {
        self.functions.get(&kernel).ok_or_else(|| {
            DeviceError::Inconsistent(format!("kernel {} is not loaded", kernel.name()))
        })
    }

    /// A grid-stride launch over `n` elements.
    fn elements(n: usize) -> LaunchConfig {
        let blocks = (n as u64).div_ceil(u64::from(BLOCK)).clamp(1, 1 << 16) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One block per row, with room for the block reduction.
    fn rows(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows.clamp(1, 1 << 16) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: BLOCK * 4,
        }
    }
}

/// Makes the device's memory pool keep what is freed instead of returning it to the
/// driver at every synchronization (its default threshold is 0): buffers are freed and
/// allocated again at every step and every profiled run, and mapping fresh memory for
/// them cost more than the kernels using them. PyTorch's caching allocator keeps memory
/// the same way.
fn keep_freed_memory(ctx: &CudaContext) -> R<()> {
    use cudarc::driver::sys;
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: `pool` receives the device's default pool, which lives as long as the
    // device; the attribute takes a `u64`.
    let status = unsafe {
        let got = sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device());
        if got == sys::CUresult::CUDA_SUCCESS {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        } else {
            got
        }
    };
    match status {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(DeviceError::debug("cannot configure the GPU's memory pool")(e)),
    }
}

/// The buffers hold `g`'s input, weight and output (cuDNN reads them whole).
fn conv_fits(g: &Conv2d, x: &CudaSlice<f32>, w: &CudaSlice<f32>, y: &CudaSlice<f32>) -> R<()> {
    let (oh, ow) = g.output();
    fits(
        "convolution x",
        x.len(),
        g.batch * g.in_channels * g.input.0 * g.input.1,
    )?;
    let per_group = g.in_channels / g.groups.max(1);
    fits(
        "convolution w",
        w.len(),
        g.out_channels * per_group * g.kernel.0 * g.kernel.1,
    )?;
    fits("convolution y", y.len(), g.batch * g.out_channels * oh * ow)
}

impl Backend for Gpu {
    type Buf = CudaSlice<f32>;
    type Idx = CudaSlice<i64>;
    type Mark = cudarc::driver::CudaEvent;

    fn mark(&self) -> R<cudarc::driver::CudaEvent> {
        self.stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(fail("cannot record an event"))
    }
    fn elapsed_us(
        &self,
        start: &cudarc::driver::CudaEvent,
        end: &cudarc::driver::CudaEvent,
    ) -> R<f64> {
        start
            .elapsed_ms(end)
            .map(|ms| f64::from(ms) * 1e3)
            .map_err(fail("cannot time the GPU"))
    }

    fn zeros(&self, n: usize) -> R<CudaSlice<f32>> {
        self.stream
            .alloc_zeros(n.max(1))
            .map_err(fail("out of GPU memory"))
    }
    fn upload(&self, data: &[f32]) -> R<CudaSlice<f32>> {
        if data.is_empty() {
            return self.zeros(1);
        }
        self.stream
            .clone_htod(data)
            .map_err(fail("cannot copy to the GPU"))
    }
    fn upload_indices(&self, data: &[i64]) -> R<CudaSlice<i64>> {
        if data.is_empty() {
            return self.index_zeros(1);
        }
        self.stream
            .clone_htod(data)
            .map_err(fail("cannot copy to the GPU"))
    }
    fn index_zeros(&self, n: usize) -> R<CudaSlice<i64>> {
        self.stream
            .alloc_zeros(n.max(1))
            .map_err(fail("out of GPU memory"))
    }
    fn read_back(buf: &CudaSlice<f32>) -> R<Vec<f32>> {
        // The buffer's own stream: the one its last writer ran on.
        buf.stream()
            .clone_dtoh(buf)
            .map_err(fail("cannot copy from the GPU"))
    }
    fn download(&self, buf: &CudaSlice<f32>) -> R<Vec<f32>> {
        self.stream
            .clone_dtoh(buf)
            .map_err(fail("cannot copy from the GPU"))
    }
    fn download_indices(&self, idx: &CudaSlice<i64>) -> R<Vec<i64>> {
        self.stream
            .clone_dtoh(idx)
            .map_err(fail("cannot copy from the GPU"))
    }
    fn synchronize(&self) -> R<()> {
        self.stream.synchronize().map_err(fail("the GPU failed"))
    }
    fn len(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }
    fn index_len(&self, idx: &CudaSlice<i64>) -> usize {
        idx.len()
    }

    fn gemm(
        &self,
        g: &Gemm,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> R<()> {
        let [oa, ob, oc] = g.offsets;
        let [sa, sb, sc] = g.strides;
        let last = g.batch.saturating_sub(1);
        fits("gemm A", a.len(), oa + last * sa + g.m * g.k)?;
        fits("gemm B", b.len(), ob + last * sb + g.k * g.n)?;
        fits("gemm C", c.len(), oc + last * sc + g.m * g.n)?;
        let int = |v: usize| {
            i32::try_from(v)
                .map_err(|_| DeviceError::Node(format!("gemm size {v} exceeds cuBLAS's")))
        };
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ.
        let cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: op(g.trans_b),
                transb: op(g.trans_a),
                m: int(g.n)?,
                n: int(g.m)?,
                k: int(g.k)?,
                alpha: g.alpha,
                lda: int(if g.trans_b { g.k } else { g.n })?,
                ldb: int(if g.trans_a { g.m } else { g.k })?,
                beta: g.beta,
                ldc: int(g.n)?,
            },
            batch_size: int(g.batch)?,
            stride_a: sb as i64,
            stride_b: sa as i64,
            stride_c: sc as i64,
        };
        let (bv, av) = (b.slice(ob..), a.slice(oa..));
        let mut cv = c.slice_mut(oc..);
        // SAFETY: every matrix of the batch lies inside its buffer (checked above).
        unsafe { self.blas.gemm_strided_batched(cfg, &bv, &av, &mut cv) }
            .map_err(fail("cuBLAS gemm failed"))
    }

    unsafe fn launch(&self, launch: Launch<'_, CudaSlice<f32>, CudaSlice<i64>>) -> R<()> {
        /// An absent optional operand: a null device pointer.
        static NULL: u64 = 0;
        let Launch {
            kernel,
            extent,
            mut args,
        } = launch;
        let cfg = match kernel.grid() {
            Grid::Elements => Self::elements(extent),
            Grid::Rows => Self::rows(extent),
        };
        let f = self.function(kernel)?;
        let mut b = self.stream.launch_builder(f);
        for arg in &mut args {
            match arg {
                Arg::Out(buf) => b.arg(&mut **buf),
                Arg::In(buf) | Arg::Optional(Some(buf)) => b.arg(*buf),
                Arg::Optional(None) => b.arg(&NULL),
                Arg::OutIndex(idx) => b.arg(&mut **idx),
                Arg::Index(idx) => b.arg(*idx),
                Arg::I64(v) => b.arg(&*v),
                Arg::I32(v) => b.arg(&*v),
                Arg::F32(v) => b.arg(&*v),
                Arg::Strides(s) => b.arg(&*s),
                Arg::Window(g) => b.arg(&*g),
            };
        }
        // SAFETY: the arguments are the kernel's parameters in order and type (its typed
        // constructor in `launch.rs`, from the same table as the kernel's C prototype);
        // the buffers hold what the kernel touches (this method's contract, which the
        // checked calls in `calls.rs` keep).
        unsafe { b.launch(cfg) }.map_err(DeviceError::call(format!("kernel {}", kernel.name())))?;
        Ok(())
    }
    fn conv_forward(
        &self,
        g: &Conv2d,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> R<()> {
        conv_fits(g, x, w, y)?;
        match &self.convolutions {
            Some(dnn) if dnn.forward(g, x, w, y)? => Ok(()),
            _ => super::conv::forward(self, g, x, w, y),
        }
    }

    fn conv_backward(
        &self,
        g: &Conv2d,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
        dw: &mut CudaSlice<f32>,
    ) -> R<()> {
        conv_fits(g, x, w, dy)?;
        fits("convolution dx", dx.len(), x.len())?;
        fits("convolution dw", dw.len(), w.len())?;
        match &self.convolutions {
            Some(dnn) if dnn.backward(g, x, w, dy, dx, dw)? => Ok(()),
            _ => super::conv::backward(self, g, x, w, dy, dx, dw),
        }
    }
}
