//! `ralpc profile --device cpu`: every op of a model measured forward and backward at each
//! batch size, written in ralpc's profile format, and accepted by the planner.

mod common;

use assert_cmd::Command;
use ralpc::passes::profile::{self, Loaded};

#[test]
fn a_cpu_profile_measures_every_op_and_the_planner_reads_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("mlp.profile.json");
    let model = common::fixture("train/mlp.onnx");
    Command::cargo_bin("ralpc")
        .expect("binary")
        .args([
            "profile",
            "--device",
            "cpu",
            "--batch-sizes",
            "1,4",
            "--repeats",
            "3",
            "-o",
        ])
        .arg(&out)
        .arg(&model)
        .assert()
        .success();
    let Loaded::Profile(p) = profile::load(&out).expect("a profile") else {
        panic!("not a ralpc profile");
    };
    assert_eq!(p.device.name, "cpu");
    let ops: Vec<&str> = p.entries.iter().map(|e| e.signature.op.as_str()).collect();
    assert!(ops.contains(&"Gemm") && ops.contains(&"Relu"), "{ops:?}");
    for e in &p.entries {
        let batches: Vec<u64> = e.points.iter().map(|q| q.batch).collect();
        assert_eq!(batches, [1, 4], "{}", e.signature);
        assert!(
            e.points.iter().all(|q| q.forward_us > 0.0),
            "{}",
            e.signature
        );
        // The spread of the timed runs is recorded (noisy ones were timed again).
        assert!(
            e.points
                .iter()
                .all(|q| q.forward_spread.is_some_and(|s| s >= 0.0)),
            "{}",
            e.signature
        );
    }
    let gemm = p
        .entries
        .iter()
        .find(|e| e.signature.op == "Gemm")
        .expect("a Gemm");
    assert!(gemm.points.iter().all(|q| q.backward_us > 0.0));
    // The planner takes it.
    let compiled = ralpc::compile(&ralpc::Options {
        model,
        gpus: Some(2),
        batch: Some(8),
        profile: Some(out),
        ..Default::default()
    })
    .expect("plans with the CPU profile");
    assert!(compiled.report.iteration_time_us > 0.0);
}

#[test]
fn profiling_a_model_that_cannot_fit_is_refused_before_allocating() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("p.json");
    let run = Command::cargo_bin("ralpc")
        .expect("binary")
        .env("RALPC_MEMORY_AVAILABLE", "100")
        .args(["profile", "-o"])
        .arg(&out)
        .arg(common::fixture("train/mlp.onnx"))
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&run.get_output().stderr);
    assert!(
        stderr.contains("need") && stderr.contains("available"),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing is written");
    // A batch size whose inputs alone exceed the memory: refused before any batch is
    // allocated (before, it aborted), naming the batch size.
    let run = Command::cargo_bin("ralpc")
        .expect("binary")
        .env("RALPC_MEMORY_AVAILABLE", (1u64 << 30).to_string())
        .args(["profile", "--batch-sizes", "1,100000000", "-o"])
        .arg(&out)
        .arg(common::fixture("train/mlp.onnx"))
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&run.get_output().stderr);
    assert!(stderr.contains("batch size 100000000"), "{stderr}");
    assert!(!out.exists(), "nothing is written");
}

/// `ralpc profile` of `model` at batch sizes 1 and 2, one timed run each, with `extra`
/// options, written to `out` and read back.
fn profiled(model: &std::path::Path, out: &std::path::Path, extra: &[&str]) -> profile::Profile {
    Command::cargo_bin("ralpc")
        .expect("binary")
        .args(["profile", "--batch-sizes", "1,2", "--repeats", "1"])
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(model)
        .assert()
        .success();
    let Loaded::Profile(p) = profile::load(out).expect("a profile") else {
        panic!("not a ralpc profile");
    };
    p
}

/// `--input` sets the shapes to measure at (here a sequence length), axis 0 replaced by
/// each batch size.
#[test]
fn a_profile_is_measured_at_the_input_shapes_given() {
    let dir = tempfile::tempdir().expect("temp dir");
    let p = profiled(
        &common::fixture("train/dynamic.onnx"),
        &dir.path().join("dynamic.profile.json"),
        &["--input", "x=1,5,16"],
    );
    let matmul = p
        .entries
        .iter()
        .find(|e| e.signature.op == "MatMul")
        .expect("a MatMul");
    assert_eq!(matmul.signature.input, [5, 16]);
    let batches: Vec<u64> = matmul.points.iter().map(|q| q.batch).collect();
    assert_eq!(batches, [1, 2]);
}

/// `ralpc profile` on a GPT measures its blocks' products on one rank of each tensor-parallel
/// degree, and `ralpc plan --profile` prices its 3d plans from them.
#[test]
fn a_gpt_profile_measures_each_tensor_parallel_ranks_products_and_prices_3d_plans() {
    use ralpc::ir::models::{gpt, GptSpec};
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("gpt.onnx");
    // 2 blocks of hidden 64, 4 heads, sequence 32.
    let spec = GptSpec::megatron(2, 64, 4, 32, 128);
    std::fs::write(&model, gpt(&spec).expect("generates")).expect("writes");
    let out = dir.path().join("gpt.profile.json");
    let p = profiled(&model, &out, &["--tensor-parallel", "1,2,3,4"]);
    // Each degree that splits the 4 heads (not 3): every product of one rank, measured at
    // both micro-batch sizes.
    let shape = ralpc::passes::transformer::Transformer::from(&spec);
    for t in [1, 2, 4] {
        for g in shape.dense_gemms(t) {
            let e = p
                .entry(&g.signature(32))
                .unwrap_or_else(|| panic!("t{t} {}", g.name));
            assert_eq!(e.points.iter().map(|q| q.batch).collect::<Vec<_>>(), [1, 2]);
        }
    }
    // t = 3 splits no head evenly: its second MLP product ([32, 85] → [32, 64]) is absent.
    assert!(p.entry(&shape.dense_gemms(3)[3].signature(32)).is_none());
    let plan = |precision: &str| {
        let mut command = Command::cargo_bin("ralpc").expect("binary");
        command
            .args([
                "plan",
                "--gpus",
                "4",
                "--batch",
                "8",
                "--json",
                "--precision",
            ])
            .arg(precision)
            .arg("--profile")
            .arg(&out)
            .arg("-o")
            .arg(dir.path().join(format!("plan-{precision}")))
            .arg(&model);
        command.assert()
    };
    let summary: serde_json::Value =
        serde_json::from_slice(&plan("fp32").success().get_output().stdout).expect("JSON");
    assert_eq!(summary["strategy"], "3d");
    assert_eq!(
        summary["measured"],
        serde_json::json!(["qkv", "projection", "mlp_in", "mlp_out"])
    );
    // The measurements were taken at fp32: a bf16 plan is not priced from them.
    let refused = plan("bf16").code(1);
    let stderr = String::from_utf8_lossy(&refused.get_output().stderr).into_owned();
    assert!(stderr.contains("measured at fp32"), "{stderr}");
}
