//! The Python package and `ralpc.torch` on real PyTorch, and Megatron-Core's own checks of
//! `--emit megatron`: `python/tests/check_torch.py`
//! exports small models, plans them through `ralpc.plan` (in-process), applies the plans
//! with `ralpc.torch.parallelize` on 4 CPU processes (gloo) and compares 3 training steps
//! with one process; `ralpc plan --emit torch`'s script does the same under torchrun.
//!
//! The Python environment is made once under the target directory (a venv with the packages
//! pinned in `python/tests/torch-env.txt`: torch, onnx, onnxscript and maturin from PyPI,
//! about 4.2 GB, a minute or two), unless `RALPC_PYTHON` names an interpreter that already
//! has them; the extension is built into it with `maturin develop`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the environment installs: every package pinned, one per line (`#` starts a comment).
const PACKAGES: &str = include_str!("../python/tests/torch-env.txt");

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

/// PyTorch's wheel pulls in CUDA's libraries (`import torch` loads them even on a CPU), so
/// the environment is most of 4.2 GB. Each pinned package is installed alone, without
/// resolving (pip's resolution downloads every wheel first) and without a cache, so that
/// one wheel at a time sits on disk beside what is installed; pip's temporary files go
/// beside the environment, on the disk that holds it.
fn make_python() -> PathBuf {
    if let Some(python) = std::env::var_os("RALPC_PYTHON") {
        return PathBuf::from(python);
    }
    let env = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-env");
    let python = env.join("bin/python");
    let ready = env.join(".ralpc-ready");
    if std::fs::read_to_string(&ready).ok().as_deref() == Some(PACKAGES) {
        return python;
    }
    if !python.is_file() {
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&env),
            "python3 -m venv (Debian: apt install python3-venv)",
        );
    }
    let scratch = env.join("tmp");
    std::fs::create_dir_all(&scratch).expect("the venv is writable");
    let pins = PACKAGES
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|pin| !pin.is_empty());
    for pin in pins {
        let output = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet"])
            .args(["--no-cache-dir", "--no-deps", "--disable-pip-version-check"])
            .arg(pin)
            .env("TMPDIR", &scratch)
            .output()
            .unwrap_or_else(|e| panic!("pip install {pin}: cannot start: {e}"));
        assert!(
            output.status.success(),
            "pip install {pin} (needs PyPI) failed; free disk where the environment is:\n{}\n{}",
            free_disk(&env),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::write(&ready, PACKAGES).expect("the venv is writable");
    python
}

/// `df -h` of the folder, for a failure message (an install that fills the disk says so
/// only deep in pip's traceback).
fn free_disk(path: &Path) -> String {
    Command::new("df")
        .arg("-h")
        .arg(path)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("(df: {e})"))
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
assert meta["format"] == "ralpc-checkpoint/4" and meta["step"] == 2, meta
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

/// Megatron-Core (PyPI's `megatron-core`) builds its `TransformerConfig` from the
/// arguments `ralpc plan --emit megatron` writes and accepts them
/// (`python/tests/check_megatron.py`): the bundled GPT-2's default and ZeRO-3 plans, FP8 on
/// H100s, and mixtures of experts from their configurations (DeepSeek-V3 at its published
/// layout, with latent attention and uneven stages; Qwen3-30B-A3B with the all-to-all
/// overlap), Llama 3.1 8B on one H100 with its optimizer and 8 blocks' activations in host
/// memory, GPT-2 under hybrid sharding; an overlap Megatron-Core does not run is refused.
#[test]
fn megatron_core_accepts_the_arguments_ralpc_emits() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let gpt2 = "fixtures/onnx/gpt2/model.onnx";
    let llama_8b_on_one_h100: &[&str] = &[
        "fixtures/configs/llama-3.1-8b.json",
        "--input",
        "input_ids=8,4096",
        "--cluster",
        "dgx-h100",
        "--gpus",
        "1",
        "--precision",
        "bf16",
        "--optimizer",
        "adam",
        "--offload-activations",
        "8",
    ];
    // Qwen2.5 7B's 28 blocks with the embedding and the loss are 30 places: 5 a chunk over
    // 2 stages of 3 chunks.
    let ends: &[&str] = &[
        "fixtures/configs/qwen2.5-7b.json",
        "--input",
        "input_ids=64,4096",
        "--cluster",
        "eos",
        "--gpus",
        "8",
        "--tensor-parallel",
        "4",
        "--pipeline-parallel",
        "2",
        "--virtual-stages",
        "3",
        "--pipeline-split",
        "ends",
    ];
    let plans: [(&str, &[&str]); 8] = [
        ("gpt2", &[gpt2, "--gpus", "8"]),
        ("zero3", &[gpt2, "--gpus", "8", "--zero", "3"]),
        (
            "fp8",
            &[
                gpt2,
                "--cluster",
                "eos",
                "--gpus",
                "16",
                "--precision",
                "fp8",
            ],
        ),
        ("deepseek", &common::DEEPSEEK_V3_ON_1024_H100),
        ("qwen", &common::QWEN3_30B_ON_16_H100_OVERLAPPED),
        // Its optimizer state and 8 blocks' activations in host memory.
        ("offload", llama_8b_on_one_h100),
        (
            "hsdp",
            &[
                gpt2,
                "--cluster",
                "eos",
                "--gpus",
                "16",
                "--zero",
                "3",
                "--dp-replicate",
                "2",
            ],
        ),
        ("ends", ends),
    ];
    let files: Vec<PathBuf> = plans
        .into_iter()
        .map(|(name, args)| emitted("megatron", "megatron.args", args, &dir.path().join(name)))
        .collect();
    let check = root.join("python/tests/check_megatron.py");
    let out = run(
        Command::new(python()).arg(&check).args(&files),
        "Megatron-Core's checks",
    );
    assert_eq!(out.matches(": accepted").count(), files.len(), "{out}");
    // The checks bite: the all-to-all overlap on 8 stages without interleaving.
    let deepseek = std::fs::read_to_string(&files[3]).expect("emitted");
    let staged = dir.path().join("staged.args");
    std::fs::write(
        &staged,
        deepseek.replace(
            "--moe-token-dispatcher-type flex",
            "--moe-token-dispatcher-type flex\n--overlap-moe-expert-parallel-comm",
        ),
    )
    .expect("write");
    let refused = Command::new(python())
        .arg(&check)
        .arg(&staged)
        .output()
        .expect("python");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stdout).contains("virtual_pipeline"));
}

/// torchtitan 0.3 (PyPI) loads the job files `ralpc plan --emit torchtitan` writes and
/// accepts them for their world (`python/tests/check_torchtitan.py`: its ConfigManager, its
/// `ParallelDims`, its pipeline stage count, its batch and sequence checks): Llama 3.1 8B
/// on 32 H100s with tensor, pipeline and interleaved stages and full recomputation,
/// Llama 3.1 8B under hybrid sharding (4 replicas of 8 shards), Qwen3-30B-A3B with expert
/// parallelism, DeepSeek-V3 at its published layout on 1,024.
/// An edited file whose degrees do not make the world is refused.
#[test]
fn torchtitan_loads_the_jobs_ralpc_emits() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("temp dir");
    let llama: &[&str] = &[
        "fixtures/configs/llama-3.1-8b.json",
        "--input",
        "input_ids=64,8192",
        "--cluster",
        "dgx-h100x4",
        "--gpus",
        "32",
        "--precision",
        "bf16",
        "--optimizer",
        "adam",
    ];
    let interleaved: Vec<&str> = llama
        .iter()
        .copied()
        .chain([
            "--tensor-parallel",
            "4",
            "--pipeline-parallel",
            "2",
            "--virtual-stages",
            "2",
            "--recompute",
            "full",
        ])
        .collect();
    let hybrid: Vec<&str> = llama
        .iter()
        .copied()
        .chain([
            "--tensor-parallel",
            "1",
            "--pipeline-parallel",
            "1",
            "--zero",
            "3",
            "--dp-replicate",
            "4",
        ])
        .collect();
    let plans: [(&str, &[&str], u32); 5] = [
        ("llama", llama, 32),
        ("interleaved", &interleaved, 32),
        ("hybrid", &hybrid, 32),
        ("qwen", &common::QWEN3_30B_ON_16_H100_OVERLAPPED, 16),
        ("deepseek", &common::DEEPSEEK_V3_ON_1024_H100, 1024),
    ];
    let files: Vec<String> = plans
        .into_iter()
        .map(|(name, args, world)| {
            let file = emitted(
                "torchtitan",
                "torchtitan_plan.py",
                args,
                &dir.path().join(name),
            );
            format!("{world}:{}", file.display())
        })
        .collect();
    let check = root.join("python/tests/check_torchtitan.py");
    let out = run(
        Command::new(python()).arg(&check).args(&files),
        "torchtitan's checks",
    );
    assert_eq!(out.matches(": accepted").count(), files.len(), "{out}");
    assert!(out.contains("deepseek_v3 671B on 1024 ranks"), "{out}");
    assert!(out.contains("4 stages over 32 blocks"), "{out}");
    // The checks bite: the data-parallel degree doubled.
    let llama = dir.path().join("llama/torchtitan_plan.py");
    let text = std::fs::read_to_string(&llama).expect("emitted");
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).expect("mkdir");
    let degree = text
        .lines()
        .find(|l| l.contains("data_parallel_shard_degree"))
        .expect("a data-parallel degree");
    std::fs::write(
        bad.join("torchtitan_plan.py"),
        text.replace(degree, &format!("{degree}0")),
    )
    .expect("write");
    let refused = Command::new(python())
        .arg(&check)
        .arg(format!("32:{}", bad.join("torchtitan_plan.py").display()))
        .output()
        .expect("python");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stdout).contains("Invalid parallel dims"),
        "{}",
        String::from_utf8_lossy(&refused.stdout)
    );
}

/// Plans `args` (from the repository root) into `out` with `--emit engine`: the path of
/// the engine's `file`.
fn emitted(engine: &str, file: &str, args: &[&str], out: &Path) -> PathBuf {
    run(
        Command::new(env!("CARGO_BIN_EXE_ralpc"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .arg("plan")
            .args(args)
            .args(["--emit", engine, "-q", "-o"])
            .arg(out),
        &format!("ralpc plan --emit {engine}"),
    );
    out.join(file)
}

fn prepend_path(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(paths).expect("PATH entries without separators")
}
