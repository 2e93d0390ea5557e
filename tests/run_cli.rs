//! `ralpc run`: the command line of the CPU backend — losses per step, `--json`, `--data`,
//! and clear errors for a plan that does not fit the model or data that does not fit it.

mod common;

use std::path::Path;

use assert_cmd::Command;

fn ralpc(cwd: &Path) -> Command {
    let mut cmd = Command::cargo_bin("ralpc").expect("binary built");
    cmd.current_dir(cwd).env("NO_COLOR", "1");
    cmd
}

/// Plans `model` (relative to the work directory) data-parallel on 2 GPUs at batch 4.
fn plan(cwd: &Path, model: &str, out: &str) {
    ralpc(cwd)
        .args([
            model,
            "--gpus",
            "2",
            "--batch",
            "4",
            "--strategy",
            "dp",
            "--tolerance",
            "inf",
            "--quiet",
            "-o",
            out,
        ])
        .assert()
        .success();
}

#[test]
fn a_plan_trains_and_reports_its_losses() {
    let cwd = common::workdir();
    plan(&cwd, "fixtures/train/mlp.onnx", "run-mlp.ralpc");
    let out = ralpc(&cwd)
        .args(["run", "run-mlp.ralpc", "--steps", "4", "--json"])
        .assert()
        .success();
    let json: serde_json::Value =
        serde_json::from_slice(&out.get_output().stdout).expect("one JSON object");
    let losses: Vec<f64> = json["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect();
    assert_eq!(losses.len(), 4);
    assert!(
        losses[3] < losses[0],
        "training lowers the loss: {losses:?}"
    );
    assert!(json["samples_per_s"].as_f64().expect("rate") > 0.0);
    assert_eq!(json["ranks"], 2);
    // The model carries its weights: nothing is seeded, so stderr says nothing.
    assert!(out.get_output().stderr.is_empty());
    // The human form: one line per step and the rate.
    let text = ralpc(&cwd)
        .args(["run", "run-mlp.ralpc/plan.json", "--steps", "2"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains("step    1  loss") && text.contains("samples/s"),
        "{text}"
    );
}

#[test]
fn a_structure_only_model_is_seeded_and_says_so() {
    let cwd = common::workdir();
    plan(&cwd, "fixtures/train/cnn.onnx", "run-cnn.ralpc");
    let out = ralpc(&cwd)
        .args(["run", "run-cnn.ralpc", "--seed", "3"])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.contains("seeded") && stderr.contains("--seed 3"),
        "{stderr}"
    );
}

#[test]
fn given_data_is_used_and_checked() {
    let cwd = common::workdir();
    plan(&cwd, "fixtures/train/mlp.onnx", "data-mlp.ralpc");
    let dir = tempfile::tempdir().expect("temp dir");
    let good = dir.path().join("good.json");
    let x: Vec<f32> = (0..4 * 24).map(|i| (i % 7) as f32 / 7.0).collect();
    std::fs::write(
        &good,
        serde_json::json!({ "inputs": { "x": x }, "labels": [1, 2, 3, 9] }).to_string(),
    )
    .expect("write");
    let run = |data: &Path| {
        ralpc(&cwd)
            .args(["run", "data-mlp.ralpc", "--json", "--data"])
            .arg(data)
            .assert()
    };
    run(&good).success();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        serde_json::json!({ "inputs": { "x": [1.0, 2.0] }, "labels": [1, 2, 3, 9] }).to_string(),
    )
    .expect("write");
    let out = run(&bad).code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.contains("inputs.x") && stderr.contains("96"),
        "{stderr}"
    );
    let wrong_class = dir.path().join("class.json");
    std::fs::write(
        &wrong_class,
        serde_json::json!({ "inputs": { "x": x }, "labels": [1, 2, 3, 10] }).to_string(),
    )
    .expect("write");
    let out = run(&wrong_class).code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(stderr.contains("labels: 10"), "{stderr}");
    // A value beyond f32 would become ±inf: refused, naming the element.
    let mut huge = x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    huge[5] = 1e300;
    let beyond = dir.path().join("beyond.json");
    std::fs::write(
        &beyond,
        serde_json::json!({ "inputs": { "x": huge }, "labels": [1, 2, 3, 9] }).to_string(),
    )
    .expect("write");
    let out = run(&beyond).code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(stderr.contains("inputs.x[5] is 1e300"), "{stderr}");
}

#[test]
fn a_plan_for_another_model_or_a_broken_plan_is_refused() {
    let cwd = common::workdir();
    plan(&cwd, "fixtures/train/mlp.onnx", "other-mlp.ralpc");
    let out = ralpc(&cwd)
        .args([
            "run",
            "other-mlp.ralpc",
            "--model",
            "fixtures/train/cnn.onnx",
        ])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.contains("another model") || stderr.contains("blake3"),
        "{stderr}"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let broken = dir.path().join("plan.json");
    std::fs::write(&broken, "{\"format\": \"ralpc-plan/3\"").expect("write");
    let out = ralpc(&cwd).arg("run").arg(&broken).assert().code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(stderr.starts_with("error: cannot use the plan"), "{stderr}");
}

/// `--value` makes an input a constant: an `If` on it keeps the branch it takes (without a
/// value the model is refused, the error suggesting `--value`), and the plan records the
/// value, so that `ralpc run` binds the same model.
#[test]
fn a_given_input_value_picks_a_branch_and_the_plan_keeps_it() {
    let cwd = common::workdir();
    let model = "fixtures/bad/if_on_input_value.onnx";
    let refused = ralpc(&cwd)
        .args(["inspect", model, "--batch", "4"])
        .assert()
        .failure();
    let stderr = String::from_utf8_lossy(&refused.get_output().stderr).into_owned();
    assert!(stderr.contains("--value use_relu=…"), "{stderr}");
    for (value, branch) in [("1", "Relu"), ("0", "Sigmoid")] {
        let shown = ralpc(&cwd)
            .args(["inspect", model, "--batch", "4", "--value"])
            .arg(format!("use_relu={value}"))
            .assert()
            .success();
        let table = String::from_utf8_lossy(&shown.get_output().stdout).into_owned();
        assert!(table.contains(branch), "use_relu={value}: {table}");
    }
    ralpc(&cwd)
        .args([
            "fixtures/train/recurrent.onnx",
            "--gpus",
            "2",
            "--batch",
            "4",
        ])
        .args(["--value", "sr=16000", "--quiet", "-o", "run-valued.ralpc"])
        .assert()
        .success();
    let plan = std::fs::read_to_string(cwd.join("run-valued.ralpc/plan.json")).expect("plan");
    let plan: serde_json::Value = serde_json::from_str(&plan).expect("JSON");
    assert_eq!(plan["model"]["values"]["sr"], serde_json::json!([16000.0]));
    ralpc(&cwd)
        .args(["run", "run-valued.ralpc", "--steps", "2"])
        .assert()
        .success();
}

/// A model whose output has no class axis (one score per sample) plans and trains with
/// MSE, the loss `auto` picks for it; cross-entropy asked for is refused (exit 1, naming
/// the output and `--loss mse`) instead of failing as a bug (101) once the batch is split.
#[test]
fn a_one_value_per_sample_output_asks_for_mse() {
    let cwd = common::workdir();
    plan(&cwd, "fixtures/train/scalar_head.onnx", "scalar-head.ralpc");
    let out = ralpc(&cwd)
        .args(["run", "scalar-head.ralpc", "--loss", "cross-entropy"])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.contains("output 'score' is [4]") && stderr.contains("--loss mse"),
        "{stderr}"
    );
    // The default loss is the one the output takes.
    for loss in ["mse", "auto"] {
        ralpc(&cwd)
            .args(["run", "scalar-head.ralpc", "--loss", loss])
            .assert()
            .success();
    }
    ralpc(&cwd)
        .args(["run", "scalar-head.ralpc"])
        .assert()
        .success();
}
