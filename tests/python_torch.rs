//! The Python package and `ralpc.torch` on real PyTorch: `python/tests/check_torch.py`
//! exports small models, plans them through `ralpc.plan` (in-process), applies the plans
//! with `ralpc.torch.parallelize` on 4 CPU processes (gloo) and compares 3 training steps
//! with one process; `ralpc plan --emit torch`'s script does the same under torchrun.
//!
//! The Python environment is made once under the target directory (a venv with torch,
//! onnx, onnxscript and maturin from PyPI, about 4.5 GB, a few minutes), unless `RALPC_PYTHON`
//! names an interpreter that already has them; the extension is built into it with
//! `maturin develop`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the environment installs: the versions the cases were checked with.
const PACKAGES: [&str; 6] = [
    "torch==2.15.*",
    "onnx==1.22.*",
    "onnxscript",
    "numpy",
    "maturin>=1.7,<2",
    "safetensors",
];

fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{what} failed:\n{text}");
    text
}

/// An interpreter with the packages, made on first use: once, whichever test of this binary
/// asks first (two making the same venv at once collide on its files).
fn python() -> PathBuf {
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(make_python).clone()
}

fn make_python() -> PathBuf {
    if let Some(python) = std::env::var_os("RALPC_PYTHON") {
        return PathBuf::from(python);
    }
    let env = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-env");
    let python = env.join("bin/python");
    let ready = env.join(".ralpc-ready");
    let wanted = PACKAGES.join("\n");
    if std::fs::read_to_string(&ready).ok().as_deref() != Some(wanted.as_str()) {
        if !python.is_file() {
            run(
                Command::new("python3").args(["-m", "venv"]).arg(&env),
                "python3 -m venv (Debian: apt install python3-venv)",
            );
        }
        for package in resolve(&python, &env) {
            run(
                Command::new(&python)
                    .args(["-m", "pip", "install", "--quiet"])
                    .args(["--no-cache-dir", "--no-deps"])
                    .arg(&package),
                &format!("pip install {package} (needs PyPI)"),
            );
        }
        std::fs::write(&ready, wanted).expect("the venv is writable");
    }
    python
}

/// What PyTorch's wheel pulls in is most of the environment (CUDA's libraries, which
/// `import torch` loads even on a CPU): its wheels and the installed files at once took more
/// disk than a CI machine had. So pip resolves first (metadata only) and each package is then
/// installed alone, which holds one wheel at a time on disk. Triton, torch.compile's kernel
/// compiler (1 GB), is left out: nothing here compiles.
fn resolve(python: &Path, env: &Path) -> Vec<String> {
    let report = env.join("resolved.json");
    run(
        Command::new(python)
            .args(["-m", "pip", "install", "--quiet"])
            .args(["--dry-run", "--ignore-installed"])
            .arg("--report")
            .arg(&report)
            .args(PACKAGES),
        "pip install --dry-run (needs PyPI)",
    );
    let text = std::fs::read_to_string(&report).expect("pip wrote its report");
    let report: serde_json::Value = serde_json::from_str(&text).expect("pip's report is JSON");
    let packages: Vec<String> = report["install"]
        .as_array()
        .expect("pip's report lists what it installs")
        .iter()
        .map(|item| {
            let metadata = &item["metadata"];
            let field = |key: &str| metadata[key].as_str().expect("a name and a version");
            (field("name").to_owned(), field("version").to_owned())
        })
        .filter(|(name, _)| !name.eq_ignore_ascii_case("triton"))
        .map(|(name, version)| format!("{name}=={version}"))
        .collect();
    assert!(
        packages.iter().any(|p| p.starts_with("torch==")),
        "pip's resolution has no torch: {text}"
    );
    packages
}

#[test]
fn plans_apply_to_pytorch_modules_and_train_as_one_process() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = python();
    let bin = python.parent().expect("an interpreter in a folder");
    let env = bin.parent().expect("a venv");
    // The extension, built from this checkout into the environment.
    run(
        Command::new(bin.join("maturin"))
            .args(["develop", "--quiet", "--manifest-path"])
            .arg(root.join("python/Cargo.toml"))
            .env("VIRTUAL_ENV", env)
            .env("PATH", prepend_path(bin)),
        "maturin develop",
    );
    let report = run(
        Command::new(&python)
            .arg(root.join("python/tests/check_torch.py"))
            .env("PYTHONWARNINGS", "ignore")
            .env("RALPC_BIN", env!("CARGO_BIN_EXE_ralpc")),
        "python/tests/check_torch.py",
    );
    // Every case reported, none failed.
    let ok = report.lines().filter(|l| l.starts_with("ok ")).count();
    println!("{report}");
    assert!(ok >= 10, "expected every case to pass:\n{report}");
}

/// A checkpoint `ralpc run` writes is a safetensors file PyTorch loads as it is: every
/// trained weight under its ONNX name in its shape, the momentum buffers, the state.
#[test]
fn checkpoints_load_in_pytorch() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("fixtures/train/cnn.onnx");
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = env!("CARGO_BIN_EXE_ralpc");
    run(
        Command::new(bin)
            .arg("plan")
            .arg(&model)
            .args(["--gpus", "2", "--batch", "8", "-o"])
            .arg(dir.path()),
        "ralpc plan",
    );
    let checkpoint = dir.path().join("state.safetensors");
    run(
        Command::new(bin)
            .arg("run")
            .arg(dir.path())
            .args(["--steps", "2", "--checkpoint-every", "2", "--checkpoint"])
            .arg(&checkpoint),
        "ralpc run",
    );
    let script = r#"
import json, sys
import onnx, torch
from safetensors import safe_open
from safetensors.torch import load_file
state = load_file(sys.argv[1])
with safe_open(sys.argv[1], "pt") as f:
    meta = json.loads(f.metadata()["ralpc"])
assert meta["format"] == "ralpc-checkpoint/3" and meta["step"] == 2, meta
assert len(meta["losses"]) == 2, meta
model = onnx.load(sys.argv[2], load_external_data=False)
dims = {t.name: tuple(t.dims) for t in model.graph.initializer if len(t.dims) > 0}
weights = [k for k in state if not k.startswith("momentum/")]
assert weights, state.keys()
for name in weights:
    assert name in dims, name
    assert tuple(state[name].shape) == dims[name], (name, state[name].shape, dims[name])
    assert state[name].dtype == torch.float32 and torch.isfinite(state[name]).all(), name
    momentum = state.get("momentum/" + name)
    assert momentum is not None and momentum.shape == state[name].shape, name
print("ok", len(weights), "weights")
"#;
    let out = run(
        Command::new(python())
            .args(["-c", script])
            .arg(&checkpoint)
            .arg(&model),
        "load the checkpoint in PyTorch",
    );
    assert!(out.contains("ok "), "{out}");
}

fn prepend_path(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(paths).expect("PATH entries without separators")
}
