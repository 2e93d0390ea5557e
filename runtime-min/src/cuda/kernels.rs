//! The NVRTC kernels ([`SOURCE`]): compiled at run time for the device's architecture, and
//! in CI on a machine without a GPU (NVRTC needs none), so a kernel that does not compile
//! fails the build's tests rather than a training job.

use std::time::Instant;

/// The CUDA C source of every kernel.
pub const SOURCE: &str = include_str!("kernels.cu");

/// Every kernel's name, as launches look it up.
pub const NAMES: [&str; 24] = [
    "binary",
    "gather_strided",
    "scatter_strided",
    "unary",
    "unary_backward",
    "fill",
    "axpby",
    "reduce_axis",
    "softmax_rows",
    "softmax_rows_backward",
    "cross_entropy",
    "mse",
    "layer_norm",
    "layer_norm_backward",
    "channel_stats",
    "channel_affine",
    "batch_norm_backward",
    "max_pool",
    "max_pool_backward",
    "avg_pool",
    "avg_pool_backward",
    "im2col",
    "col2im",
    "sgd_momentum",
];

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
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters NVRTC writes.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        Ok((major, minor))
    } else {
        Err(format!("nvrtcVersion failed: {status:?}"))
    }
}

/// Compiles [`SOURCE`] for compute capability `major.minor` (PTX for `compute_XY`, which
/// the driver finishes for the exact device). The caller checks that NVRTC loads first.
///
/// # Errors
/// NVRTC's log naming the line, or a kernel missing from the output.
pub fn compile(major: u32, minor: u32) -> Result<Compiled, String> {
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
        cudarc::nvrtc::CompileError::CompileError { log, .. } => format!(
            "the CUDA kernels do not compile for {arch}:\n{}",
            log.to_string_lossy().trim_end()
        ),
        other => format!("NVRTC failed for {arch}: {other:?}"),
    })?;
    let text = ptx.to_src();
    let missing: Vec<&str> = NAMES
        .iter()
        .copied()
        .filter(|n| !text.contains(&format!(".entry {n}(")))
        .collect();
    if !missing.is_empty() {
        return Err(format!("the compiled kernels lack {missing:?}"));
    }
    Ok(Compiled {
        ptx,
        arch,
        nvrtc,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`NAMES`] is exactly the source's kernels, in order.
    #[test]
    fn names_list_every_kernel() {
        let declared: Vec<&str> = SOURCE
            .split("extern \"C\" __global__ void ")
            .skip(1)
            .filter_map(|rest| rest.split('(').next())
            .collect();
        assert_eq!(declared, NAMES);
    }
}
