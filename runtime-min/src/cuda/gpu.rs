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
use super::cudnn::Convolutions;
use super::error::{DeviceError, SetupError};
use super::kernels::{self, BinaryOp, Strides, UnaryOp, Window};
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
    functions: BTreeMap<&'static str, CudaFunction>,
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
        let functions = kernels::NAMES
            .iter()
            .map(|&name| {
                module
                    .load_function(name)
                    .map(|f| (name, f))
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

    fn function(&self, name: &'static str) -> R<&CudaFunction> {
        self.functions
            .get(name)
            .ok_or_else(|| DeviceError::Inconsistent(format!("kernel {name} is not loaded")))
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

/// Launches `$name` with `$cfg` and the arguments, each pushed by reference.
macro_rules! launch {
    ($self:ident, $name:literal, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let f = $self.function($name)?;
        let mut b = $self.stream.launch_builder(f);
        $( b.arg($arg); )+
        // SAFETY: the arguments match the kernel's parameters in kernels.cu, in order and
        // type; sizes are the executor's, checked against the buffers by `fits`.
        unsafe { b.launch($cfg) }.map_err(DeviceError::call(concat!("kernel ", $name)))?;
        Ok(())
    }};
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

fn fits(what: &str, len: usize, needed: usize) -> R<()> {
    if needed > len {
        Err(DeviceError::Inconsistent(format!(
            "{what}: {needed} elements needed, the buffer has {len}"
        )))
    } else {
        Ok(())
    }
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

    fn binary(
        &self,
        out: &mut CudaSlice<f32>,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        s: &Strides,
        op: BinaryOp,
    ) -> R<()> {
        let n = s.len();
        fits("binary", out.len(), n as usize)?;
        {
            let code = op as i32;
            launch!(
                self,
                "binary",
                Self::elements(n as usize),
                out,
                a,
                b,
                s,
                &n,
                &code
            )
        }
    }
    fn gather(
        &self,
        dst: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        s: &Strides,
        offset: usize,
    ) -> R<()> {
        let n = s.len();
        fits("gather", dst.len(), n as usize)?;
        let offset = offset as i64;
        launch!(
            self,
            "gather_strided",
            Self::elements(n as usize),
            dst,
            src,
            s,
            &offset,
            &n
        )
    }
    fn scatter(
        &self,
        dst: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        s: &Strides,
        offset: usize,
        accumulate: bool,
    ) -> R<()> {
        let n = s.len();
        fits("scatter", src.len(), n as usize)?;
        let offset = offset as i64;
        {
            let accumulate = i32::from(accumulate);
            launch!(
                self,
                "scatter_strided",
                Self::elements(n as usize),
                dst,
                src,
                s,
                &offset,
                &n,
                &accumulate
            )
        }
    }
    fn unary(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        op: UnaryOp,
        alpha: f32,
        beta: f32,
    ) -> R<()> {
        let n = x.len() as i64;
        fits("unary", out.len(), x.len())?;
        {
            let code = op as i32;
            launch!(
                self,
                "unary",
                Self::elements(x.len()),
                out,
                x,
                &n,
                &code,
                &alpha,
                &beta
            )
        }
    }
    fn unary_backward(
        &self,
        dx: &mut CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        saved: &CudaSlice<f32>,
        op: UnaryOp,
        alpha: f32,
        beta: f32,
    ) -> R<()> {
        let n = dy.len() as i64;
        fits("unary_backward", dx.len().min(saved.len()), dy.len())?;
        {
            let code = op as i32;
            launch!(
                self,
                "unary_backward",
                Self::elements(dy.len()),
                dx,
                dy,
                saved,
                &n,
                &code,
                &alpha,
                &beta
            )
        }
    }
    fn fill(&self, out: &mut CudaSlice<f32>, value: f32) -> R<()> {
        let n = out.len() as i64;
        let cfg = Self::elements(out.len());
        launch!(self, "fill", cfg, out, &n, &value)
    }
    fn axpby(&self, out: &mut CudaSlice<f32>, x: &CudaSlice<f32>, alpha: f32, beta: f32) -> R<()> {
        fits("axpby", x.len(), out.len())?;
        let n = out.len() as i64;
        let cfg = Self::elements(out.len());
        launch!(self, "axpby", cfg, out, x, &n, &alpha, &beta)
    }
    fn reduce_axis(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        outer: usize,
        n: usize,
        inner: usize,
        mean: bool,
    ) -> R<()> {
        fits("reduce_axis", x.len(), outer * n * inner)?;
        fits("reduce_axis", out.len(), outer * inner)?;
        let (o, k, i) = (outer as i64, n as i64, inner as i64);
        {
            let mean = i32::from(mean);
            launch!(
                self,
                "reduce_axis",
                Self::elements(outer * inner),
                out,
                x,
                &o,
                &k,
                &i,
                &mean
            )
        }
    }
    fn softmax_rows(
        &self,
        y: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        rows: usize,
        n: usize,
        log: bool,
    ) -> R<()> {
        fits("softmax", x.len().min(y.len()), rows * n)?;
        let (r, k) = (rows as i64, n as i64);
        {
            let log = i32::from(log);
            launch!(self, "softmax_rows", Self::rows(rows), y, x, &r, &k, &log)
        }
    }
    fn softmax_rows_backward(
        &self,
        dx: &mut CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        rows: usize,
        n: usize,
        log: bool,
    ) -> R<()> {
        fits(
            "softmax backward",
            dx.len().min(dy.len()).min(y.len()),
            rows * n,
        )?;
        let (r, k) = (rows as i64, n as i64);
        {
            let log = i32::from(log);
            launch!(
                self,
                "softmax_rows_backward",
                Self::rows(rows),
                dx,
                dy,
                y,
                &r,
                &k,
                &log
            )
        }
    }
    fn cross_entropy(
        &self,
        loss: &mut CudaSlice<f32>,
        dlogits: &mut CudaSlice<f32>,
        logits: &CudaSlice<f32>,
        labels: &CudaSlice<i64>,
        rows: usize,
        n: usize,
        total_rows: usize,
    ) -> R<()> {
        fits("cross entropy", logits.len().min(dlogits.len()), rows * n)?;
        fits("cross entropy", loss.len().min(labels.len()), rows)?;
        let (r, k, t) = (rows as i64, n as i64, total_rows as i64);
        launch!(
            self,
            "cross_entropy",
            Self::rows(rows),
            loss,
            dlogits,
            logits,
            labels,
            &r,
            &k,
            &t
        )
    }
    fn class_stats(
        &self,
        stats: &mut CudaSlice<f32>,
        logits: &CudaSlice<f32>,
        labels: &CudaSlice<i64>,
        rows: usize,
        n: usize,
        first: usize,
    ) -> R<()> {
        fits("class statistics", logits.len(), rows * n)?;
        fits("class statistics", stats.len(), 3 * rows)?;
        fits("class statistics", labels.len(), rows)?;
        let (r, k, f) = (rows as i64, n as i64, first as i64);
        launch!(
            self,
            "class_stats",
            Self::rows(rows),
            stats,
            logits,
            labels,
            &r,
            &k,
            &f
        )
    }
    fn class_piece_grad(
        &self,
        dlogits: &mut CudaSlice<f32>,
        logits: &CudaSlice<f32>,
        lse: &CudaSlice<f32>,
        labels: &CudaSlice<i64>,
        rows: usize,
        n: usize,
        first: usize,
        scale: f32,
    ) -> R<()> {
        fits(
            "class piece gradient",
            logits.len().min(dlogits.len()),
            rows * n,
        )?;
        fits("class piece gradient", lse.len().min(labels.len()), rows)?;
        let (r, k, f) = (rows as i64, n as i64, first as i64);
        launch!(
            self,
            "class_piece_grad",
            Self::elements(rows * n),
            dlogits,
            logits,
            lse,
            labels,
            &r,
            &k,
            &f,
            &scale
        )
    }
    fn mse(
        &self,
        loss: &mut CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        target: &CudaSlice<f32>,
        total: usize,
    ) -> R<()> {
        fits("mse", loss.len().min(dx.len()).min(target.len()), x.len())?;
        let (n, t) = (x.len() as i64, total as i64);
        launch!(
            self,
            "mse",
            Self::elements(x.len()),
            loss,
            dx,
            x,
            target,
            &n,
            &t
        )
    }
    fn layer_norm(
        &self,
        y: &mut CudaSlice<f32>,
        mean: &mut CudaSlice<f32>,
        rstd: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        affine: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> R<()> {
        fits("layer norm", x.len().min(y.len()), rows * n)?;
        fits("layer norm", mean.len().min(rstd.len()), rows)?;
        let (r, k) = (rows as i64, n as i64);
        match affine {
            Some((g, b)) => launch!(
                self,
                "layer_norm",
                Self::rows(rows),
                y,
                mean,
                rstd,
                x,
                g,
                b,
                &r,
                &k,
                &eps
            ),
            None => {
                let null = 0u64;
                launch!(
                    self,
                    "layer_norm",
                    Self::rows(rows),
                    y,
                    mean,
                    rstd,
                    x,
                    &null,
                    &null,
                    &r,
                    &k,
                    &eps
                )
            }
        }
    }
    fn layer_norm_backward(
        &self,
        dx: &mut CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        gamma: Option<&CudaSlice<f32>>,
        mean: &CudaSlice<f32>,
        rstd: &CudaSlice<f32>,
        rows: usize,
        n: usize,
    ) -> R<()> {
        fits(
            "layer norm backward",
            dx.len().min(dy.len()).min(x.len()),
            rows * n,
        )?;
        let (r, k) = (rows as i64, n as i64);
        match gamma {
            Some(g) => launch!(
                self,
                "layer_norm_backward",
                Self::rows(rows),
                dx,
                dy,
                x,
                g,
                mean,
                rstd,
                &r,
                &k
            ),
            None => {
                let null = 0u64;
                launch!(
                    self,
                    "layer_norm_backward",
                    Self::rows(rows),
                    dx,
                    dy,
                    x,
                    &null,
                    mean,
                    rstd,
                    &r,
                    &k
                )
            }
        }
    }
    fn channel_stats(
        &self,
        mean: &mut CudaSlice<f32>,
        rstd: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        batch: usize,
        channels: usize,
        spatial: usize,
        eps: f32,
    ) -> R<()> {
        fits("batch norm", x.len(), batch * channels * spatial)?;
        let (b, c, s) = (batch as i64, channels as i64, spatial as i64);
        launch!(
            self,
            "channel_stats",
            Self::rows(channels),
            mean,
            rstd,
            x,
            &b,
            &c,
            &s,
            &eps
        )
    }
    fn channel_affine(
        &self,
        y: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        mean: &CudaSlice<f32>,
        rstd: &CudaSlice<f32>,
        gamma: &CudaSlice<f32>,
        beta: &CudaSlice<f32>,
        channels: usize,
        spatial: usize,
    ) -> R<()> {
        fits("batch norm", y.len(), x.len())?;
        let (c, s, n) = (channels as i64, spatial as i64, x.len() as i64);
        {
            let batch_stats = 0i32;
            let unused_eps = 0f32;
            launch!(
                self,
                "channel_affine",
                Self::elements(x.len()),
                y,
                x,
                mean,
                rstd,
                gamma,
                beta,
                &c,
                &s,
                &n,
                &batch_stats,
                &unused_eps
            )
        }
    }
    fn batch_norm_backward(
        &self,
        dx: &mut CudaSlice<f32>,
        dgamma: &mut CudaSlice<f32>,
        dbeta: &mut CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        (mean, rstd): (&CudaSlice<f32>, &CudaSlice<f32>),
        gamma: &CudaSlice<f32>,
        batch: usize,
        channels: usize,
        spatial: usize,
    ) -> R<()> {
        fits(
            "batch norm backward",
            dx.len().min(dy.len()).min(x.len()),
            batch * channels * spatial,
        )?;
        let (b, c, s) = (batch as i64, channels as i64, spatial as i64);
        launch!(
            self,
            "batch_norm_backward",
            Self::rows(channels),
            dx,
            dgamma,
            dbeta,
            dy,
            x,
            mean,
            rstd,
            gamma,
            &b,
            &c,
            &s
        )
    }
    fn max_pool(
        &self,
        y: &mut CudaSlice<f32>,
        argmax: &mut CudaSlice<i64>,
        x: &CudaSlice<f32>,
        g: &Window,
    ) -> R<()> {
        let n = (g.planes * g.oh * g.ow) as usize;
        fits("max pool", y.len().min(argmax.len()), n)?;
        fits("max pool", x.len(), (g.planes * g.h * g.w) as usize)?;
        launch!(self, "max_pool", Self::elements(n), y, argmax, x, g)
    }
    fn max_pool_backward(
        &self,
        dx: &mut CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        argmax: &CudaSlice<i64>,
        g: &Window,
    ) -> R<()> {
        let n = (g.planes * g.h * g.w) as usize;
        fits("max pool backward", dx.len(), n)?;
        fits(
            "max pool backward",
            argmax.len().min(dy.len()),
            (g.planes * g.oh * g.ow) as usize,
        )?;
        launch!(
            self,
            "max_pool_backward",
            Self::elements(n),
            dx,
            dy,
            argmax,
            g
        )
    }
    fn avg_pool(
        &self,
        y: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        g: &Window,
        count_pad: bool,
    ) -> R<()> {
        let n = (g.planes * g.oh * g.ow) as usize;
        fits("average pool", y.len(), n)?;
        fits("average pool", x.len(), (g.planes * g.h * g.w) as usize)?;
        {
            let count_pad = i32::from(count_pad);
            launch!(self, "avg_pool", Self::elements(n), y, x, g, &count_pad)
        }
    }
    fn avg_pool_backward(
        &self,
        dx: &mut CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        g: &Window,
        count_pad: bool,
    ) -> R<()> {
        let n = (g.planes * g.oh * g.ow) as usize;
        fits("average pool backward", dy.len(), n)?;
        fits(
            "average pool backward",
            dx.len(),
            (g.planes * g.h * g.w) as usize,
        )?;
        {
            let count_pad = i32::from(count_pad);
            launch!(
                self,
                "avg_pool_backward",
                Self::elements((g.planes * g.h * g.w) as usize),
                dx,
                dy,
                g,
                &count_pad
            )
        }
    }
    fn im2col(
        &self,
        cols: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        offset: usize,
        g: &Window,
        images: usize,
    ) -> R<()> {
        let n = images * (g.planes * g.kh * g.kw * g.oh * g.ow) as usize;
        fits("im2col", cols.len(), n)?;
        fits(
            "im2col",
            x.len(),
            offset + images * (g.planes * g.h * g.w) as usize,
        )?;
        let image = x.slice(offset..);
        let count = images as i64;
        launch!(self, "im2col", Self::elements(n), cols, &image, g, &count)
    }
    fn col2im(
        &self,
        dx: &mut CudaSlice<f32>,
        offset: usize,
        cols: &CudaSlice<f32>,
        g: &Window,
        images: usize,
    ) -> R<()> {
        let n = images * (g.planes * g.kh * g.kw * g.oh * g.ow) as usize;
        fits("col2im", cols.len(), n)?;
        fits(
            "col2im",
            dx.len(),
            offset + images * (g.planes * g.h * g.w) as usize,
        )?;
        let mut image = dx.slice_mut(offset..);
        let count = images as i64;
        launch!(
            self,
            "col2im",
            Self::elements(n),
            &mut image,
            cols,
            g,
            &count
        )
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

    fn sgd_momentum(
        &self,
        w: &mut CudaSlice<f32>,
        velocity: &mut CudaSlice<f32>,
        grad: &CudaSlice<f32>,
        lr: f32,
        momentum: f32,
    ) -> R<()> {
        fits("sgd", velocity.len().min(grad.len()), w.len())?;
        let n = w.len() as i64;
        let cfg = Self::elements(w.len());
        launch!(
            self,
            "sgd_momentum",
            cfg,
            w,
            velocity,
            grad,
            &n,
            &lr,
            &momentum
        )
    }
}
