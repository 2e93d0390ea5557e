//! Finding the CUDA libraries before cudarc touches them.
//!
//! cudarc loads each library at its first call and panics when it is missing (and a
//! caught panic does not make a second call work), so every entry point checks
//! [`check`] first and turns absence into an error naming the library, where it looked
//! and how to install it.
//!
//! cudarc looks a library up by a fixed list of names (`libnccl.so`, `libnccl.so.13`, …)
//! through the dynamic loader's path. Two common installs are outside that: the pip wheels
//! (`nvidia-nccl-cu13`, `nvidia-cublas`, …) keep their libraries inside `site-packages`,
//! and NCCL ships only `libnccl.so.2`, a name cudarc does not try. [`resolve`] finds them
//! and returns a loader path — a private directory of links under the names cudarc tries,
//! then the directories they are in — that the process must start with, since the
//! loader reads `LD_LIBRARY_PATH` once at startup. The command line re-executes itself
//! with it; nobody makes symlinks by hand.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::error::SetupError;

/// A CUDA library ralpc loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lib {
    /// The driver (`libcuda`), installed with the GPU driver.
    Driver,
    /// The runtime (`libcudart`).
    Runtime,
    /// The run-time compiler of the elementwise, pooling and optimizer kernels.
    Nvrtc,
    /// Dense matrix products.
    Cublas,
    /// cuBLAS's matrix products with epilogues (and cuBLAS's own dependency).
    CublasLt,
    /// Convolutions.
    Cudnn,
    /// Collectives and transfers between ranks.
    Nccl,
}

impl Lib {
    /// Every library, in the order they are reported.
    pub const ALL: [Lib; 7] = [
        Lib::Driver,
        Lib::Runtime,
        Lib::Nvrtc,
        Lib::Cublas,
        Lib::CublasLt,
        Lib::Cudnn,
        Lib::Nccl,
    ];

    /// The libraries the CUDA backend is built on (cuDNN and NCCL for convolutions and
    /// multi-GPU runs).
    pub const TRAINING: [Lib; 6] = [
        Lib::Driver,
        Lib::Nvrtc,
        Lib::Cublas,
        Lib::CublasLt,
        Lib::Cudnn,
        Lib::Nccl,
    ];

    /// The libraries training on one GPU loads today (NVRTC kernels and cuBLAS).
    pub const ONE_GPU: [Lib; 4] = [Lib::Driver, Lib::Nvrtc, Lib::Cublas, Lib::CublasLt];

    /// The name cudarc knows it by (`lib{stem}.so` and versions of it).
    pub fn stem(self) -> &'static str {
        match self {
            Lib::Driver => "cuda",
            Lib::Runtime => "cudart",
            Lib::Nvrtc => "nvrtc",
            Lib::Cublas => "cublas",
            Lib::CublasLt => "cublasLt",
            Lib::Cudnn => "cudnn",
            Lib::Nccl => "nccl",
        }
    }

    /// Short name for messages (`libnccl`).
    pub fn name(self) -> String {
        format!("lib{}", self.stem())
    }

    /// The file names distributions install it under, newest first: what [`find`] looks
    /// for in each directory.
    fn files(self) -> &'static [&'static str] {
        match self {
            Lib::Driver => &["libcuda.so.1", "libcuda.so"],
            Lib::Runtime => &["libcudart.so.13", "libcudart.so.12", "libcudart.so"],
            Lib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            Lib::Cublas => &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
            Lib::CublasLt => &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
            Lib::Cudnn => &["libcudnn.so.9", "libcudnn.so"],
            Lib::Nccl => &["libnccl.so.2", "libnccl.so"],
        }
    }

    /// How to get it.
    pub fn install_hint(self) -> &'static str {
        match self {
            Lib::Driver => "install the NVIDIA driver (this needs a machine with an NVIDIA GPU)",
            Lib::Runtime => "pip install 'nvidia-cuda-runtime==13.0.*'",
            Lib::Nvrtc => "pip install 'nvidia-cuda-nvrtc==13.0.*'",
            Lib::Cublas | Lib::CublasLt => "pip install 'nvidia-cublas==13.*'",
            Lib::Cudnn => "pip install nvidia-cudnn-cu13",
            Lib::Nccl => "pip install nvidia-nccl-cu13",
        }
    }

    /// Whether cudarc can load it now (it tries its own list of names).
    pub fn loadable(self) -> bool {
        // SAFETY: each call only opens the library (running its initializers), as cudarc's
        // first real call would; nothing is called through it.
        unsafe {
            match self {
                Lib::Driver => cudarc::driver::sys::is_culib_present(),
                Lib::Runtime => cudarc::runtime::sys::is_culib_present(),
                Lib::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Lib::Cublas => cudarc::cublas::sys::is_culib_present(),
                Lib::CublasLt => cudarc::cublaslt::sys::is_culib_present(),
                Lib::Cudnn => cudarc::cudnn::sys::is_culib_present(),
                Lib::Nccl => cudarc::nccl::sys::is_culib_present(),
            }
        }
    }
}

/// A library cudarc cannot load and [`find`] did not find either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// The library.
    pub lib: Lib,
    /// Where it was looked for.
    pub searched: Vec<PathBuf>,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hint = self.lib.install_hint();
        if self.lib == Lib::Driver {
            return write!(
                f,
                "no CUDA driver found (libcuda.so.1 is not on the loader's path): {hint}"
            );
        }
        let n = self.searched.len();
        write!(
            f,
            "{} not found: looked for {} in {n} director{} ({}); {hint}, or name its \
             directory in LD_LIBRARY_PATH or {SEARCH_PATH_VAR}",
            self.lib.name(),
            self.lib.files().join(", "),
            if n == 1 { "y" } else { "ies" },
            shorten(&self.searched),
        )
    }
}

impl std::error::Error for Missing {}

fn shorten(dirs: &[PathBuf]) -> String {
    const SHOWN: usize = 6;
    let mut s: Vec<String> = dirs
        .iter()
        .take(SHOWN)
        .map(|d| d.display().to_string())
        .collect();
    if dirs.len() > SHOWN {
        s.push(format!("and {} more", dirs.len() - SHOWN));
    }
    s.join(", ")
}

/// Where a library is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// cudarc loads it as the process stands.
    Loadable,
    /// Found at this file; loadable once the process starts with [`Resolution::Restart`]'s
    /// path.
    Found(PathBuf),
}

/// What it takes to load a set of libraries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Every one loads now.
    Ready,
    /// Every one was found, some only outside the loader's path: start the process again
    /// with this `LD_LIBRARY_PATH`.
    Restart {
        /// The loader path to start with.
        library_path: OsString,
        /// The libraries found outside it, and where.
        found: Vec<(Lib, PathBuf)>,
    },
}

/// Environment variable: extra directories (`:`-separated) searched first.
pub const SEARCH_PATH_VAR: &str = "RALPC_CUDA_LIB_PATH";

/// Where [`find`] looks, in order: `RALPC_CUDA_LIB_PATH`, `LD_LIBRARY_PATH`, the pip
/// wheels' directories in every Python `site-packages` (virtual environment, user and
/// system ones), conda's, CUDA toolkit and system directories.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in [SEARCH_PATH_VAR, "LD_LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()));
        }
    }
    for site in site_packages() {
        // CUDA 13's wheels share `nvidia/cu13/lib`; earlier ones have one per library.
        dirs.push(site.join("nvidia/cu13/lib"));
        for sub in ["nccl", "cublas", "cudnn", "cuda_nvrtc", "cuda_runtime"] {
            dirs.push(site.join("nvidia").join(sub).join("lib"));
        }
    }
    for var in ["CONDA_PREFIX", "CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(Path::new(&v).join("lib"));
            dirs.push(Path::new(&v).join("lib64"));
        }
    }
    for d in [
        "/usr/local/cuda/lib64",
        "/usr/local/cuda/targets/x86_64-linux/lib",
        "/usr/local/nvidia/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/local/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    let mut seen = std::collections::BTreeSet::new();
    dirs.retain(|d| d.is_dir() && seen.insert(d.clone()));
    dirs
}

/// Python `site-packages` directories: the active virtual environment's, then what
/// `python3` reports (user and system), then the usual system ones.
fn site_packages() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut lib_dirs = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        lib_dirs.push(Path::new(&venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        lib_dirs.push(Path::new(&home).join(".local/lib"));
    }
    lib_dirs.extend(["/usr/local/lib", "/usr/lib", "/opt/conda/lib"].map(PathBuf::from));
    for lib in lib_dirs {
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for p in pythons.into_iter().rev() {
            out.push(p.join("site-packages"));
            out.push(p.join("dist-packages"));
        }
    }
    out.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    // Whatever else `python3` uses (pyenv, conda, a framework build): asked last, and only
    // when a library was not where the loader looks.
    let asked = std::process::Command::new("python3")
        .args([
            "-c",
            "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
        ])
        .stderr(std::process::Stdio::null())
        .output();
    if let Some(o) = asked.ok().filter(|o| o.status.success()) {
        out.extend(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(PathBuf::from),
        );
    }
    out
}

/// The first of `lib`'s files in `dirs`.
pub fn find(lib: Lib, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .flat_map(|d| lib.files().iter().map(move |f| d.join(f)))
        .find(|p| p.is_file())
}

/// Where each of `libs` is: loadable now, or a file found elsewhere.
///
/// # Errors
/// The first library that is neither.
pub fn locate(libs: &[Lib]) -> Result<Vec<(Lib, Location)>, Missing> {
    let mut dirs: Option<Vec<PathBuf>> = None;
    libs.iter()
        .map(|&lib| {
            if lib.loadable() {
                return Ok((lib, Location::Loadable));
            }
            let dirs = dirs.get_or_insert_with(search_dirs);
            match find(lib, dirs) {
                // The driver must match the kernel module: only the system's is usable.
                Some(path) if lib != Lib::Driver => Ok((lib, Location::Found(path))),
                _ => Err(Missing {
                    lib,
                    searched: dirs.clone(),
                }),
            }
        })
        .collect()
}

/// What it takes to load `libs`: nothing, or a restart with a loader path that makes
/// cudarc find them (links under the names it tries, in a private directory).
///
/// # Errors
/// A library found nowhere, or the link directory could not be made.
pub fn resolve(libs: &[Lib]) -> Result<Resolution, SetupError> {
    let located = locate(libs)?;
    let found: Vec<(Lib, PathBuf)> = located
        .into_iter()
        .filter_map(|(lib, loc)| match loc {
            Location::Found(path) => Some((lib, path)),
            Location::Loadable => None,
        })
        .collect();
    if found.is_empty() {
        return Ok(Resolution::Ready);
    }
    let links = link_dir(&found)?;
    let mut path = vec![links];
    for (_, file) in &found {
        if let Some(dir) = file.parent() {
            if !path.iter().any(|p| p == dir) {
                path.push(dir.to_path_buf());
            }
        }
    }
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.extend(std::env::split_paths(&old));
    }
    let library_path = std::env::join_paths(path).map_err(SetupError::LoaderPath)?;
    Ok(Resolution::Restart {
        library_path,
        found,
    })
}

/// A directory of links `lib{stem}.so -> file` for the found libraries, named by what
/// it links to so that concurrent ranks share it; made under a temporary name and renamed
/// into place, so a reader never sees it half-made.
fn link_dir(found: &[(Lib, PathBuf)]) -> Result<PathBuf, SetupError> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    found.hash(&mut h);
    let dir = std::env::temp_dir().join(format!("ralpc-cuda-libs-{:016x}", h.finish()));
    let complete = |dir: &Path| {
        found.iter().all(|(lib, file)| {
            std::fs::read_link(dir.join(format!("lib{}.so", lib.stem()))).is_ok_and(|t| t == *file)
        })
    };
    if complete(&dir) {
        return Ok(dir);
    }
    let fail = SetupError::Links;
    let staging = tempfile::Builder::new()
        .prefix("ralpc-cuda-libs-")
        .tempdir()
        .map_err(fail)?;
    for (lib, file) in found {
        std::os::unix::fs::symlink(file, staging.path().join(format!("lib{}.so", lib.stem())))
            .map_err(fail)?;
    }
    let staging = staging.keep();
    match std::fs::rename(&staging, &dir) {
        Ok(()) => Ok(dir),
        // Another rank made it first.
        Err(_) if complete(&dir) => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(dir)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(fail(e))
        }
    }
}

/// Checks that `libs` load as the process stands.
///
/// # Errors
/// The first that does not, with where it was looked for (and, when it was found outside
/// the loader's path, that path).
pub fn check(libs: &[Lib]) -> Result<(), SetupError> {
    match resolve(libs)? {
        Resolution::Ready => Ok(()),
        Resolution::Restart {
            library_path,
            found,
        } => {
            let names: Vec<String> = found
                .iter()
                .map(|(lib, file)| format!("{} at {}", lib.name(), file.display()))
                .collect();
            Err(SetupError::OutsidePath {
                found: names.join(", "),
                library_path: library_path.to_string_lossy().into_owned(),
            })
        }
    }
}
