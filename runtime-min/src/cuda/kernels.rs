//! The NVRTC kernels ([`SOURCE`]): compiled at run time for the device's architecture, and
//! in CI on a machine without a GPU (NVRTC needs none), so a kernel that does not compile
//! fails the build's tests rather than a training job.

use std::time::Instant;

use super::error::{DeviceError, SetupError, R};

use super::launch::Kernel;

/// The CUDA C source of every kernel: the operation codes' `#define`s and the kernels'
/// prototypes (both from the tables in `op_codes.rs` and `kernel_table.rs`), then
/// `kernels.cu`.
pub const SOURCE: &str = concat!(c_kernel_header!(), include_str!("kernels.cu"));

/// The most dimensions a strided kernel handles.
pub const MAX_DIMS: usize = 6;

/// `struct Strides` of the kernels: an output shape and, per operand, the element stride
/// of each dimension (0 where the operand is broadcast), right-aligned to [`MAX_DIMS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    /// Output shape (leading unused dimensions are 1).
    pub shape: [i64; MAX_DIMS],
    /// Operand a's strides.
    pub a: [i64; MAX_DIMS],
    /// Operand b's strides.
    pub b: [i64; MAX_DIMS],
}

impl Strides {
    /// NumPy broadcasting of contiguous `a` and `b` to `out`.
    ///
    /// # Errors
    /// More than [`MAX_DIMS`] dimensions, or shapes that do not broadcast to `out`.
    pub fn broadcast(out: &[usize], a: &[usize], b: &[usize]) -> R<Strides> {
        if out.len() > MAX_DIMS || a.len() > out.len() || b.len() > out.len() {
            return Err(DeviceError::Node(format!(
                "cannot broadcast {a:?} and {b:?} to {out:?} (at most {MAX_DIMS} dimensions)"
            )));
        }
        let mut s = Strides {
            shape: [1; MAX_DIMS],
            a: [0; MAX_DIMS],
            b: [0; MAX_DIMS],
        };
        let lead = MAX_DIMS - out.len();
        for (d, &n) in out.iter().enumerate() {
            s.shape[lead + d] = n as i64;
        }
        for (operand, strides) in [(a, &mut s.a), (b, &mut s.b)] {
            let mut stride = 1i64;
            for (k, &n) in operand.iter().enumerate().rev() {
                let d = MAX_DIMS - operand.len() + k;
                if n != 1 && n as i64 != s.shape[d] {
                    // The IR checked the model's shapes: these are the executor's.
                    return Err(DeviceError::Inconsistent(format!(
                        "cannot broadcast {a:?} and {b:?} to {out:?}"
                    )));
                }
                strides[d] = if n == 1 { 0 } else { stride };
                stride *= n as i64;
            }
        }
        Ok(s)
    }

    /// A strided view: `shape` read with element `strides` (a transpose, a slice, a piece
    /// of a resharding), for `gather_strided` and `scatter_strided`.
    ///
    /// # Errors
    /// More than [`MAX_DIMS`] dimensions, or lengths that differ.
    pub fn view(shape: &[usize], strides: &[usize]) -> R<Strides> {
        if shape.len() > MAX_DIMS || shape.len() != strides.len() {
            return Err(DeviceError::Node(format!(
                "a view of {shape:?} with strides {strides:?} (at most {MAX_DIMS} dimensions)"
            )));
        }
        let mut s = Strides {
            shape: [1; MAX_DIMS],
            a: [0; MAX_DIMS],
            b: [0; MAX_DIMS],
        };
        let lead = MAX_DIMS - shape.len();
        for d in 0..shape.len() {
            s.shape[lead + d] = shape[d] as i64;
            s.a[lead + d] = strides[d] as i64;
        }
        Ok(s)
    }

    /// Output elements.
    pub fn len(&self) -> i64 {
        self.shape.iter().product()
    }

    /// Whether the output is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements of operand a the kernel reads (or writes) from its offset: one past the
    /// farthest element its strides reach, 0 for an empty output.
    pub fn span_a(&self) -> usize {
        Self::span(&self.shape, &self.a)
    }

    /// Elements of operand b the kernel reads: as [`Strides::span_a`].
    pub fn span_b(&self) -> usize {
        Self::span(&self.shape, &self.b)
    }

    fn span(shape: &[i64; MAX_DIMS], strides: &[i64; MAX_DIMS]) -> usize {
        if shape.contains(&0) {
            return 0;
        }
        let last: i64 = shape.iter().zip(strides).map(|(&n, &s)| (n - 1) * s).sum();
        last as usize + 1
    }
}

/// `struct Window` of the kernels: a 2-d window op's geometry, as the CPU backend's
/// [`Pool2d`](crate::cpu::kernels::Pool2d).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Input planes (N·C for pooling, one image's channels for im2col), height, width.
    pub planes: i64,
    /// Input height.
    pub h: i64,
    /// Input width.
    pub w: i64,
    /// Output height.
    pub oh: i64,
    /// Output width.
    pub ow: i64,
    /// Kernel height.
    pub kh: i64,
    /// Kernel width.
    pub kw: i64,
    /// Vertical stride.
    pub sh: i64,
    /// Horizontal stride.
    pub sw: i64,
    /// Top padding.
    pub pt: i64,
    /// Left padding.
    pub pl: i64,
    /// Bottom padding.
    pub pb: i64,
    /// Right padding.
    pub pr: i64,
    /// Vertical dilation.
    pub dh: i64,
    /// Horizontal dilation.
    pub dw: i64,
}

impl Window {
    /// Elements of the input planes.
    pub fn inputs(&self) -> usize {
        (self.planes * self.h * self.w) as usize
    }

    /// Elements of the output planes.
    pub fn outputs(&self) -> usize {
        (self.planes * self.oh * self.ow) as usize
    }

    /// Elements of one image's im2col columns: `[planes·kh·kw, oh·ow]`.
    pub fn columns(&self) -> usize {
        (self.planes * self.kh * self.kw * self.oh * self.ow) as usize
    }
}

impl From<&crate::cpu::kernels::Pool2d> for Window {
    fn from(p: &crate::cpu::kernels::Pool2d) -> Window {
        let i = |v: usize| v as i64;
        Window {
            planes: i(p.planes),
            h: i(p.input.0),
            w: i(p.input.1),
            oh: i(p.output.0),
            ow: i(p.output.1),
            kh: i(p.kernel.0),
            kw: i(p.kernel.1),
            sh: i(p.stride.0),
            sw: i(p.stride.1),
            pt: i(p.padding[0]),
            pl: i(p.padding[1]),
            pb: i(p.padding[2]),
            pr: i(p.padding[3]),
            dh: i(p.dilation.0),
            dw: i(p.dilation.1),
        }
    }
}

// SAFETY: plain `repr(C)` integers, the layout the kernels declare.
unsafe impl cudarc::driver::DeviceRepr for Strides {}
// SAFETY: as above.
unsafe impl cudarc::driver::DeviceRepr for Window {}

/// [`BinaryOp`] from its table.
macro_rules! binary_op_enum {
    ($($(#[$doc:meta])* $name:ident = $code:literal, $c:ident;)*) => {
        /// Operation codes of the `binary` kernel.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(i32)]
        pub enum BinaryOp {
            $($(#[$doc])* $name = $code,)*
        }
    };
}
foreach_binary_op!(binary_op_enum);

/// `true` where `unary_backward` takes the forward's output.
macro_rules! reads_output {
    (output) => {
        true
    };
    (input) => {
        false
    };
}

/// [`UnaryOp`] from its table.
macro_rules! unary_op_enum {
    ($($(#[$doc:meta])* $name:ident = $code:literal, $c:ident, $reads:ident;)*) => {
        /// Operation codes of the `unary` and `unary_backward` kernels (`alpha`, `beta`
        /// where noted).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(i32)]
        pub enum UnaryOp {
            $($(#[$doc])* $name = $code,)*
        }

        impl UnaryOp {
            /// Every operation, in code order.
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$name,)*];

            /// Its name in `kernels.cu` (`UNARY_MISH`).
            pub fn c_name(self) -> &'static str {
                match self {
                    $(UnaryOp::$name => stringify!($c),)*
                }
            }

            /// Whether `unary_backward` takes the forward's output (else its input). A
            /// ReLU's output is positive where its input is, and its input is released
            /// after the forward pass ([`ralpc_ir::Op::backward_reads`]).
            pub fn backward_reads_output(self) -> bool {
                match self {
                    $(UnaryOp::$name => reads_output!($reads),)*
                }
            }
        }
    };
}
foreach_unary_op!(unary_op_enum);

impl UnaryOp {
    /// The device's code for an IR function with its `alpha` and `beta`, if the device
    /// has it.
    pub fn of(u: ralpc_ir::Unary) -> Option<(UnaryOp, f32, f32)> {
        use ralpc_ir::Unary;
        Some(match u {
            Unary::Relu => (UnaryOp::Relu, 0.0, 0.0),
            Unary::LeakyRelu { alpha } => (UnaryOp::LeakyRelu, alpha, 0.0),
            Unary::Sigmoid => (UnaryOp::Sigmoid, 0.0, 0.0),
            Unary::HardSigmoid { alpha, beta } => (UnaryOp::HardSigmoid, alpha, beta),
            Unary::Tanh => (UnaryOp::Tanh, 0.0, 0.0),
            Unary::Gelu { tanh: false } => (UnaryOp::Gelu, 0.0, 0.0),
            Unary::Gelu { tanh: true } => (UnaryOp::GeluTanh, 0.0, 0.0),
            Unary::Erf => (UnaryOp::Erf, 0.0, 0.0),
            Unary::Sqrt => (UnaryOp::Sqrt, 0.0, 0.0),
            Unary::Neg => (UnaryOp::Neg, 0.0, 0.0),
            Unary::Exp => (UnaryOp::Exp, 0.0, 0.0),
            Unary::Reciprocal => (UnaryOp::Reciprocal, 0.0, 0.0),
            Unary::Log => (UnaryOp::Log, 0.0, 0.0),
            Unary::Abs => (UnaryOp::Abs, 0.0, 0.0),
            Unary::Elu { alpha } => (UnaryOp::Elu, alpha, 0.0),
            Unary::Softplus => (UnaryOp::Softplus, 0.0, 0.0),
            Unary::Softsign => (UnaryOp::Softsign, 0.0, 0.0),
            Unary::Mish => (UnaryOp::Mish, 0.0, 0.0),
            Unary::Selu { alpha, gamma } => (UnaryOp::Selu, alpha, gamma),
            Unary::Celu { alpha } => (UnaryOp::Celu, alpha, 0.0),
            Unary::HardSwish => (UnaryOp::HardSwish, 0.0, 0.0),
            _ => return None,
        })
    }
}

/// The compiled kernels.
pub struct Compiled {
    /// The PTX.
    pub ptx: cudarc::nvrtc::Ptx,
    /// The architecture compiled for (`compute_90`).
    pub arch: String,
    /// The NVRTC that compiled it (major, minor).
    pub nvrtc: (i32, i32),
    /// Compile time in seconds.
    pub seconds: f64,
}

/// NVRTC's version. The caller checks that NVRTC loads first ([`super::libs`]).
///
/// # Errors
/// NVRTC's error.
pub fn nvrtc_version() -> Result<(i32, i32), SetupError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters NVRTC writes.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        Ok((major, minor))
    } else {
        Err(SetupError::Nvrtc {
            call: "nvrtcVersion",
            status: format!("{status:?}"),
        })
    }
}

/// Compiles [`SOURCE`] for compute capability `major.minor` (PTX for `compute_XY`, which
/// the driver finishes for the exact device). The caller checks that NVRTC loads first.
///
/// # Errors
/// NVRTC's log naming the line, or a kernel missing from the output.
pub fn compile(major: u32, minor: u32) -> Result<Compiled, SetupError> {
    let nvrtc = nvrtc_version()?;
    let arch = format!("compute_{major}{minor}");
    let started = Instant::now();
    let options = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        // Same arithmetic as the CPU backend: no flush-to-zero, IEEE division and sqrt.
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(true),
        name: Some("ralpc_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, options).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => SetupError::Compile {
            arch: arch.clone(),
            log: log.to_string_lossy().trim_end().to_owned(),
        },
        other => SetupError::Nvrtc {
            call: "compiling to PTX",
            status: format!("{other:?}"),
        },
    })?;
    let text = ptx.to_src();
    let missing: Vec<&str> = Kernel::names()
        .filter(|n| !text.contains(&format!(".entry {n}(")))
        .collect();
    if !missing.is_empty() {
        return Err(SetupError::Incomplete { arch, missing });
    }
    Ok(Compiled {
        ptx,
        arch,
        nvrtc,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Compiles [`SOURCE`] to a cubin for exactly compute capability `major.minor`
/// (`sm_XY`): machine code the driver loads whatever CUDA version its NVRTC is, unlike PTX,
/// which a driver older than the NVRTC rejects. The caller checks that NVRTC loads first.
///
/// # Errors
/// NVRTC's log naming the line, or NVRTC not knowing the architecture.
pub fn compile_cubin(major: u32, minor: u32) -> Result<Vec<u8>, SetupError> {
    use cudarc::nvrtc::{result, sys};
    let arch = format!("sm_{major}{minor}");
    // The source is a constant without NUL bytes (a unit test reads it).
    let src = std::ffi::CString::new(SOURCE).map_err(nvrtc_failed("reading the source"))?;
    let name = c"ralpc_kernels.cu";
    let prog =
        result::create_program(&src, Some(name)).map_err(nvrtc_failed("creating the program"))?;
    let options = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_owned(),
        "--ftz=false".to_owned(),
        "--prec-div=true".to_owned(),
        "--prec-sqrt=true".to_owned(),
        "--fmad=true".to_owned(),
    ];
    // SAFETY: `prog` is live until the destroy below; every out-pointer is sized by the
    // size NVRTC reports for it.
    let out = unsafe {
        let compiled = result::compile_program(prog, &options);
        let out = match compiled {
            Err(_) => {
                let log = result::get_program_log(prog).unwrap_or_default();
                let text: Vec<u8> = log
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                Err(SetupError::Compile {
                    arch,
                    log: String::from_utf8_lossy(&text).trim_end().to_owned(),
                })
            }
            Ok(()) => {
                let mut size = 0usize;
                let status = sys::nvrtcGetCUBINSize(prog, &mut size);
                if status != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                    Err(nvrtc_failed("making the cubin")(status))
                } else {
                    let mut cubin = vec![0u8; size];
                    let status = sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast());
                    if status == sys::nvrtcResult::NVRTC_SUCCESS {
                        Ok(cubin)
                    } else {
                        Err(nvrtc_failed("handing over the cubin")(status))
                    }
                }
            }
        };
        let _ = result::destroy_program(prog);
        out
    };
    out
}

/// NVRTC's failure of `call`, by its status.
fn nvrtc_failed<S: std::fmt::Debug>(call: &'static str) -> impl FnOnce(S) -> SetupError {
    move |status| SetupError::Nvrtc {
        call,
        status: format!("{status:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel table names exactly the source's kernels, in order: each is declared
    /// once by the generated prototypes, then defined once by `kernels.cu`.
    #[test]
    fn the_table_names_every_kernel() {
        let named = |text: &str| -> Vec<String> {
            text.split("extern \"C\" __global__ void ")
                .skip(1)
                .filter_map(|rest| rest.split('(').next())
                .map(str::to_owned)
                .collect()
        };
        let table: Vec<String> = Kernel::names().map(str::to_owned).collect();
        assert_eq!(named(include_str!("kernels.cu")), table);
        assert_eq!(named(SOURCE), [table.clone(), table].concat());
    }

    /// Every unary code has its case in both the forward and the backward kernel, and the
    /// codes reach the source as `#define`s.
    #[test]
    fn every_unary_code_has_both_kernels() {
        for &op in UnaryOp::ALL {
            let case = format!("case {}:", op.c_name());
            assert_eq!(SOURCE.matches(&case).count(), 2, "{op:?}");
            let define = format!("#define {} {}\n", op.c_name(), op as i32);
            assert!(SOURCE.contains(&define), "{op:?}");
        }
    }
}
