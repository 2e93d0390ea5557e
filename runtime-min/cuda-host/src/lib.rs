//! ralpc's CUDA kernels (`runtime-min/src/cuda/kernels.cu`) compiled for the host through
//! `host_shim.h` — one block of one thread — so that their arithmetic and indexing are
//! tested against the CPU backend on machines without a GPU (`tests/kernels.rs`). On a GPU
//! the same source runs with many threads; its block reductions are tested there.
#![allow(missing_docs, reason = "the declarations mirror kernels.cu one to one")]

pub mod dry;
pub mod streams;

use ralpc_runtime_min::cuda::error::DeviceError;
use ralpc_runtime_min::cuda::kernels::{Strides, Window};

#[macro_use]
#[allow(
    unused_macros,
    reason = "the C side of the tables is the build script's"
)]
mod tables {
    include!("../../src/cuda/op_codes.rs");
    include!("../../src/cuda/kernel_table.rs");
}

/// A parameter kind's C type, as Rust declares it.
macro_rules! host_type {
    (out) => { *mut f32 };
    (input) => { *const f32 };
    (optional) => { *const f32 };
    (out_index) => { *mut i64 };
    (index) => { *const i64 };
    (i64) => { i64 };
    (i32) => { i32 };
    (f32) => { f32 };
    (Strides) => { Strides };
    (Window) => { Window };
}

/// The next argument of a launch if it matches `$p`, as `$e`; else the dispatch's mismatch.
macro_rules! take {
    ($args:ident, $kernel:ident, $p:pat => $e:expr) => {
        match $args.next() {
            Some($p) => $e,
            _ => return mismatch($kernel),
        }
    };
}

/// The next argument of a launch as its parameter kind's C value: a pointer into the
/// host buffer, or the scalar. A launch built by its kernel's constructor always matches.
macro_rules! host_value {
    ($a:ident, $k:ident, out) => { take!($a, $k, Arg::Out(b) => b.as_mut_ptr()) };
    ($a:ident, $k:ident, input) => { take!($a, $k, Arg::In(b) => b.as_ptr()) };
    ($a:ident, $k:ident, optional) => {
        take!($a, $k, Arg::Optional(b) => b.map_or(std::ptr::null(), |b| b.as_ptr()))
    };
    ($a:ident, $k:ident, out_index) => { take!($a, $k, Arg::OutIndex(b) => b.as_mut_ptr()) };
    ($a:ident, $k:ident, index) => { take!($a, $k, Arg::Index(b) => b.as_ptr()) };
    ($a:ident, $k:ident, i64) => { take!($a, $k, Arg::I64(v) => *v) };
    ($a:ident, $k:ident, i32) => { take!($a, $k, Arg::I32(v) => *v) };
    ($a:ident, $k:ident, f32) => { take!($a, $k, Arg::F32(v) => *v) };
    ($a:ident, $k:ident, Strides) => { take!($a, $k, Arg::Strides(v) => *v) };
    ($a:ident, $k:ident, Window) => { take!($a, $k, Arg::Window(v) => *v) };
}

/// The kernels' `extern "C"` declarations and [`run`], which calls the one a launch names.
macro_rules! host_kernels {
    ($(
        $(#[$doc:meta])*
        $name:ident ( $($arg:ident : $kind:ident),* $(,)? ) over $grid:ident;
    )*) => {
        unsafe extern "C" {
            $( $(#[$doc])* pub fn $name($($arg: host_type!($kind)),*); )*
        }

        /// Calls the kernel `launch` names with its arguments.
        ///
        /// # Safety
        /// As [`Backend::launch`]: every buffer holds what the kernel touches.
        unsafe fn run(launch: Launch<'_, Vec<f32>, Vec<i64>>) -> R<()> {
            let Launch { kernel, mut args, .. } = launch;
            let mut args = args.iter_mut();
            match kernel {
                $(
                    Kernel::$name => {
                        $( let $arg = host_value!(args, kernel, $kind); )*
                        // SAFETY: the buffers hold what the kernel touches (the contract
                        // of `Backend::launch`, which ralpc's checked calls keep); the
                        // arguments are its parameters in order and type.
                        unsafe { $name($($arg),*) };
                    }
                )*
            }
            Ok(())
        }
    };
}

foreach_kernel!(host_kernels);

/// A launch whose arguments are not its kernel's: not built by its constructor.
fn mismatch(kernel: Kernel) -> R<()> {
    Err(DeviceError::Inconsistent(format!(
        "a launch of {} whose arguments are not the kernel's",
        kernel.name()
    )))
}

/// The kernels on the host, behind the executor's [`Backend`]: what the CUDA executor
/// runs, one thread at a time. GEMM is the CPU backend's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Host;

use ralpc_runtime_min::cuda::backend::{Backend, Gemm, R};
use ralpc_runtime_min::cuda::launch::{Arg, Kernel, Launch};

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
    fn index_len(&self, idx: &Vec<i64>) -> usize {
        idx.len()
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

    unsafe fn launch(&self, launch: Launch<'_, Vec<f32>, Vec<i64>>) -> R<()> {
        // SAFETY: this method's contract is `run`'s.
        unsafe { run(launch) }
    }
}
