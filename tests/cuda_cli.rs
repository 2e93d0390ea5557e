//! The CUDA backend's checks that need no GPU: `ralpc doctor` names every CUDA library
//! and why one is missing, finds NCCL under the name pip and Debian install it
//! (`libnccl.so.2`, which cudarc does not try) with no symlink made by hand, and NVRTC
//! compiles every kernel for Hopper. Under CI the kernels must compile (`.ci/run` installs
//! NVRTC from pip); elsewhere that test says it skipped when NVRTC is absent.

mod common;

use std::path::Path;

use assert_cmd::Command;

fn doctor(args: &[&str]) -> (serde_json::Value, i32, String) {
    let out = Command::cargo_bin("ralpc")
        .expect("binary built")
        .arg("doctor")
        .arg("--json")
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("ralpc doctor runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}); stderr: {stderr}"));
    (json, out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn doctor_names_every_library_and_how_to_get_it() {
    let (json, code, stderr) = doctor(&[]);
    let libraries = json["libraries"].as_object().expect("libraries");
    let names: Vec<&str> = libraries.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "libcublas",
            "libcublasLt",
            "libcuda",
            "libcudart",
            "libcudnn",
            "libnccl",
            "libnvrtc"
        ]
    );
    let mut training_missing = false;
    for (name, lib) in libraries {
        let status = lib["status"].as_str().expect("status");
        assert!(["loads", "missing"].contains(&status), "{name}: {status}");
        if status == "missing" {
            let detail = lib["detail"].as_str().expect("why");
            assert!(
                detail.contains("pip install") || detail.contains("NVIDIA driver"),
                "{name}: {detail}"
            );
            training_missing |= name != "libcudart";
        }
    }
    if training_missing {
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains("CUDA training is not possible here"),
            "{stderr}"
        );
    } else {
        assert_eq!(code, 0, "{stderr}");
    }
    if libraries["libcuda"]["status"] == "missing" {
        assert!(libraries["libcuda"]["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("no CUDA driver found")));
        assert_eq!(json["gpus"], serde_json::json!([]));
    }
}

/// A stand-in for `libnccl.so.2` (a link to the C math library: cudarc only opens it) in a
/// directory named by `RALPC_CUDA_LIB_PATH`: ralpc links it as `libnccl.so` and restarts.
#[test]
fn nccl_is_found_under_the_name_it_ships_with() {
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib/aarch64-linux-gnu/libm.so.6",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.is_file())
    .expect("a glibc system has libm.so.6");
    let dir = tempfile::tempdir().expect("temp dir");
    let fake = dir.path().join("libnccl.so.2");
    std::os::unix::fs::symlink(libm, &fake).expect("link");
    let out = Command::cargo_bin("ralpc")
        .expect("binary built")
        .args(["doctor", "--json"])
        .env("RALPC_CUDA_LIB_PATH", dir.path())
        .output()
        .expect("ralpc doctor runs");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let nccl = &json["libraries"]["libnccl"];
    assert_eq!(nccl["status"], "loads", "{json}");
    if nccl["detail"].is_string() {
        assert_eq!(nccl["detail"], format!("from {}", fake.display()));
    } else {
        eprintln!("note: a real NCCL is already on the loader's path");
    }
}

#[test]
fn every_kernel_compiles_for_hopper() {
    let (json, _, stderr) = {
        let out = Command::cargo_bin("ralpc")
            .expect("binary built")
            .args(["doctor", "--json", "--compile-kernels", "--arch", "9.0"])
            .output()
            .expect("ralpc doctor runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if stderr.contains("cannot compile the kernels: libnvrtc not found") {
            common::skip_without(
                "NVRTC",
                "pip install 'nvidia-cuda-nvrtc==13.0.*'",
                "compiling every kernel for Hopper",
            );
            return;
        }
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}); stderr: {stderr}"));
        (json, out.status.code(), stderr)
    };
    let kernels = &json["kernels"];
    assert_eq!(kernels["arch"], "compute_90", "{stderr}");
    let compiled: Vec<&str> = kernels["compiled"]
        .as_array()
        .expect("names")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let table: Vec<&str> = ralpc::runtime::cuda::launch::Kernel::names().collect();
    assert_eq!(compiled, table);
    assert!(kernels["ptx_bytes"].as_u64().is_some_and(|n| n > 10_000));
    // Machine code for sm_90 too, which loads whatever the driver's CUDA version.
    assert!(kernels["cubin_bytes"].as_u64().is_some_and(|n| n > 10_000));
}

/// A plan of the CNN fixture at batch 8 for `gpus` GPUs (data parallel), in a temporary
/// directory.
fn plan_for(gpus: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("cnn");
    Command::cargo_bin("ralpc")
        .expect("binary built")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/train/cnn.onnx"))
        .args([
            "--gpus",
            gpus,
            "--batch",
            "8",
            "--strategy",
            "dp",
            "--tolerance",
            "inf",
        ])
        .args(["--quiet", "-o"])
        .arg(&out)
        .assert()
        .success();
    (dir, out)
}

fn one_gpu_plan() -> (tempfile::TempDir, std::path::PathBuf) {
    plan_for("1")
}

/// Losses of `ralpc <command> PLAN --steps 3 --json <extra>`.
fn losses(command: &str, plan: &std::path::Path, extra: &[&str]) -> Vec<f64> {
    let out = Command::cargo_bin("ralpc")
        .expect("binary built")
        .arg(command)
        .arg(plan)
        .args(["--steps", "3", "--json"])
        .args(extra)
        .assert()
        .success();
    let json: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).expect("JSON");
    eprintln!("{command} {extra:?}: {json}");
    json["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect()
}

#[track_caller]
fn same_losses(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-3 * w.abs().max(1.0),
            "{got:?} against {want:?}"
        );
    }
}

fn driver_present() -> bool {
    ralpc::runtime::cuda::libs::Lib::Driver.loadable()
}

#[test]
fn running_on_cuda_without_a_gpu_is_a_clear_input_error() {
    if driver_present() {
        eprintln!("a CUDA driver is present: the GPU tests (--ignored) cover this machine");
        return;
    }
    let (_dir, plan) = one_gpu_plan();
    let out = Command::cargo_bin("ralpc")
        .expect("binary built")
        .arg("run")
        .arg(&plan)
        .args(["--backend", "cuda"])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(stderr.contains("error: no CUDA driver found"), "{stderr}");
}

/// `ralpc run --backend cuda` equals `--backend cpu` within 1e-3 on a one-rank plan.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_plan_trains_on_the_gpu_as_on_the_cpu() {
    let (_dir, plan) = one_gpu_plan();
    same_losses(
        &losses("run", &plan, &["--backend", "cuda"]),
        &losses("run", &plan, &["--backend", "cpu"]),
    );
}

/// A 4-rank data-parallel plan on one GPU — ranks as threads sharing it, and as processes
/// under `ralpc launch` — gives the one-rank losses.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn data_parallel_ranks_share_one_gpu() {
    let (_one, single) = one_gpu_plan();
    let (_four, four) = plan_for("4");
    let want = losses("run", &single, &["--backend", "cuda"]);
    same_losses(&losses("run", &four, &["--backend", "cuda"]), &want);
    same_losses(&losses("launch", &four, &["--backend", "cuda"]), &want);
}

/// A pipeline (1F1B, two stages of two ranks) on one GPU through the plan executor, its
/// layers computed on the GPU: the CPU backend's losses.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_pipeline_runs_on_one_gpu_as_on_the_cpu() {
    let (_dir, plan) = common::pipeline_plan();
    same_losses(
        &losses("run", &plan, &["--backend", "cuda"]),
        &losses("run", &plan, &["--backend", "cpu"]),
    );
}

/// `ralpc plan MODEL FLAGS --gpus 4 --batch 8` written to `out`.
fn plan_gpt(model: &std::path::Path, flags: &str, out: &std::path::Path) -> std::path::PathBuf {
    Command::cargo_bin("ralpc")
        .expect("binary built")
        .arg("plan")
        .arg(model)
        .args(flags.split_whitespace())
        .args(["--gpus", "4", "--batch", "8", "--quiet", "-o"])
        .arg(out)
        .assert()
        .success();
    out.to_path_buf()
}

/// Megatron-style plans of a generated GPT — tensor × pipeline × data parallel, ZeRO 1–3,
/// selective and full recomputation, sequence parallelism, the interleaved schedule — on
/// one GPU through `--backend cuda`: the CPU backend's losses.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn megatron_plans_run_on_one_gpu_as_on_the_cpu() {
    use ralpc::ir::models::{gpt, GptSpec};
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("gpt.onnx");
    // Four blocks, so that two stages of two chunks each hold one.
    let spec = GptSpec::megatron(4, 64, 4, 16, 200);
    std::fs::write(&model, gpt(&spec).expect("generates")).expect("writes");
    for (name, flags) in [
        ("t2p2", "--tensor-parallel 2 --pipeline-parallel 2"),
        (
            "t2d2-zero3-selective-sp",
            "--tensor-parallel 2 --zero 3 --recompute selective --sequence-parallel",
        ),
        (
            "p2d2-zero2-full",
            "--tensor-parallel 1 --pipeline-parallel 2 --zero 2 --recompute full",
        ),
        (
            "t2p2-interleaved",
            "--tensor-parallel 2 --pipeline-parallel 2 --virtual-stages 2",
        ),
    ] {
        let plan = plan_gpt(&model, flags, &dir.path().join(name));
        same_losses(
            &losses("run", &plan, &["--backend", "cuda"]),
            &losses("run", &plan, &["--backend", "cpu"]),
        );
    }
}

/// Megatron-style plans of a generated GPT on four GPUs, one process each under `ralpc
/// launch`: their collectives over the plan's groups and their activation and gradient
/// messages go through NCCL (a communicator per group and per direction of a pair), and
/// the losses are the CPU backend's. Needs four GPUs: NCCL refuses ranks sharing one.
#[test]
#[ignore = "needs four NVIDIA GPUs"]
fn megatron_plans_run_across_gpus_through_nccl() {
    use ralpc::ir::models::{gpt, GptSpec};
    let gpus = ralpc::runtime::cuda::device::count().expect("a CUDA driver");
    assert!(
        gpus >= 4,
        "this test needs four GPUs; this machine has {gpus}"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("gpt.onnx");
    let spec = GptSpec::megatron(4, 64, 4, 16, 200);
    std::fs::write(&model, gpt(&spec).expect("generates")).expect("writes");
    for (name, flags) in [
        ("t2p2", "--tensor-parallel 2 --pipeline-parallel 2"),
        ("t2d2-zero1", "--tensor-parallel 2 --zero 1"),
        (
            "t1p4",
            "--tensor-parallel 1 --pipeline-parallel 4 --virtual-stages 1",
        ),
    ] {
        let plan = plan_gpt(&model, flags, &dir.path().join(name));
        same_losses(
            &losses("launch", &plan, &["--backend", "cuda"]),
            &losses("run", &plan, &["--backend", "cpu"]),
        );
    }
}
