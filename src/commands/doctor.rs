//! `ralpc doctor [--compile-kernels] [--json]`: can this machine train on CUDA?

use std::fmt::Write;

use ralpc::args::BadArgument;
use ralpc::runtime::cuda::launch::Kernel;
use ralpc::runtime::cuda::libs::{self, Lib, Location};
use ralpc::runtime::cuda::{device, kernels};

pub const EXAMPLES: &str = "\
Examples:
  ralpc doctor                       # CUDA libraries, driver, GPUs
  ralpc doctor --compile-kernels     # also compile ralpc's kernels with NVRTC
  ralpc doctor --compile-kernels --arch 9.0 --json   # for an H100 (works without a GPU)

Each library is looked for where cudarc loads it from (the loader's path), then in
RALPC_CUDA_LIB_PATH, LD_LIBRARY_PATH, the pip wheels' directories (nvidia-nccl-cu13,
nvidia-cublas, nvidia-cudnn-cu13, nvidia-cuda-nvrtc) of every Python environment, conda,
CUDA_HOME and the system's. Libraries found outside the loader's path (and NCCL's
libnccl.so.2, a name cudarc does not try) are linked into a private directory and ralpc
restarts itself with it on LD_LIBRARY_PATH: nothing to set up by hand. Exit status 1
when CUDA training is not possible here (or the kernels do not compile).";

/// Arguments of `ralpc doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Compile every NVRTC kernel (needs NVRTC, not a GPU).
    #[arg(long)]
    pub compile_kernels: bool,
    /// Compute capability to compile for, MAJOR.MINOR [default: GPU 0's, else 9.0].
    #[arg(long, value_parser = parse_arch)]
    pub arch: Option<(u32, u32)>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn parse_arch(s: &str) -> Result<(u32, u32), BadArgument> {
    let (major, minor) = s.split_once('.').unwrap_or((s, "0"));
    match (major.parse(), minor.parse()) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        _ => Err(BadArgument(format!(
            "'{s}' is not MAJOR.MINOR (9.0 for H100/H200)"
        ))),
    }
}

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    // What was found outside the loader's path, in a restart (see `restart_with`).
    let linked = super::linked_cuda_libs();
    let mut rows = Vec::new();
    let mut outside = Vec::new();
    for lib in Lib::ALL {
        let row = match libs::locate(&[lib]) {
            Ok(found) => match found.into_iter().next().map(|(_, l)| l) {
                Some(Location::Found(path)) => {
                    outside.push(lib);
                    (lib, "found", Some(path.display().to_string()))
                }
                _ => (lib, "loads", linked.get(&lib).cloned()),
            },
            Err(missing) => (lib, "missing", Some(missing.to_string())),
        };
        rows.push(row);
    }
    if !outside.is_empty() {
        super::restart_with(&outside)?;
    }
    let loads = |lib: Lib| rows.iter().any(|(l, s, _)| *l == lib && *s == "loads");
    let (driver, gpus) = if loads(Lib::Driver) {
        (
            device::driver_version().ok(),
            device::devices().map_err(ralpc::Error::from),
        )
    } else {
        (None, Ok(Vec::new()))
    };
    let gpus = gpus?;
    let compiled = if args.compile_kernels {
        if !loads(Lib::Nvrtc) {
            return Err(ralpc::Error::setup(format!(
                "cannot compile the kernels: {}",
                rows.iter()
                    .find(|(l, _, _)| *l == Lib::Nvrtc)
                    .and_then(|(_, _, why)| why.clone())
                    .unwrap_or_default()
            )));
        }
        let (major, minor) = args
            .arch
            .or_else(|| gpus.first().map(|g| g.compute_capability))
            .unwrap_or((9, 0));
        let ptx = kernels::compile(major, minor)?;
        let cubin = kernels::compile_cubin(major, minor)?;
        Some((ptx, cubin))
    } else {
        None
    };
    let text = if args.json {
        use ralpc::formats::{CompiledKernels, DoctorGpu, DoctorReport, LibraryStatus};
        let report = DoctorReport {
            format: ralpc::formats::DOCTOR,
            libraries: rows
                .iter()
                .map(|(lib, status, detail)| {
                    let detail = detail.clone();
                    (lib.name().to_owned(), LibraryStatus { status, detail })
                })
                .collect(),
            driver_cuda_version: driver.map(|(a, b)| format!("{a}.{b}")),
            gpus: gpus
                .iter()
                .map(|g| DoctorGpu {
                    ordinal: g.ordinal,
                    name: g.name.clone(),
                    compute_capability: g.compute_capability,
                    memory: g.memory,
                })
                .collect(),
            kernels: compiled.as_ref().map(|(c, cubin)| CompiledKernels {
                arch: c.arch.clone(),
                nvrtc: format!("{}.{}", c.nvrtc.0, c.nvrtc.1),
                compiled: Kernel::names().collect(),
                ptx_bytes: c.ptx.to_src().len(),
                cubin_bytes: cubin.len(),
                seconds: c.seconds,
            }),
        };
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
    } else {
        let mut t = String::from("CUDA libraries:\n");
        for (lib, status, detail) in &rows {
            let _ = writeln!(
                t,
                "  {:<12} {status:<8} {}",
                lib.name(),
                detail.as_deref().unwrap_or("")
            );
        }
        match driver {
            Some((a, b)) => {
                let _ = writeln!(t, "driver: CUDA {a}.{b}");
            }
            None => t.push_str("driver: none\n"),
        }
        for g in &gpus {
            let _ = writeln!(
                t,
                "cuda:{}  {}  sm_{}{}  {:.0} GiB",
                g.ordinal,
                g.name,
                g.compute_capability.0,
                g.compute_capability.1,
                g.memory as f64 / (1u64 << 30) as f64
            );
        }
        if let Some((c, cubin)) = &compiled {
            let _ = writeln!(
                t,
                "kernels: {} compiled for {} by NVRTC {}.{} in {:.2} s (PTX {} KiB, cubin {} KiB)",
                Kernel::ALL.len(),
                c.arch,
                c.nvrtc.0,
                c.nvrtc.1,
                c.seconds,
                c.ptx.to_src().len() / 1024,
                cubin.len() / 1024
            );
        }
        t
    };
    super::print_stdout(&text);
    match rows
        .iter()
        .find(|(lib, status, _)| Lib::TRAINING.contains(lib) && *status == "missing")
    {
        Some((_, _, why)) => Err(ralpc::Error::setup(format!(
            "CUDA training is not possible here: {}",
            why.as_deref().unwrap_or("")
        ))),
        None => Ok(()),
    }
}
