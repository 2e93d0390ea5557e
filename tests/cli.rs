//! The `ralpc` command line as a user meets it.

mod common;

use common::ralpc;

use assert_cmd::Command;

#[test]
fn inspect_prints_the_layer_table() {
    let out = ralpc()
        .args(["inspect", "fixtures/onnx/vgg16/model.onnx"])
        .assert()
        .success();
    insta::assert_snapshot!(String::from_utf8_lossy(&out.get_output().stdout));
}

/// Without flags a fixed-batch export is shown at its own batch (it was re-batched to 1,
/// which a baked-in constant then blocked); `--input` gives the batch too.
#[test]
fn inspect_keeps_the_exported_batch() {
    let model = "fixtures/bad/rebatch_baked_constant.onnx";
    let out = ralpc()
        .args(["inspect", model, "--json"])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(v["batch"], 2);
    let out = ralpc()
        .args([
            "inspect",
            "fixtures/train/cnn.onnx",
            "--input",
            "image=3,3,16,16",
            "--json",
        ])
        .assert();
    let out = out.get_output();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["batch"], 3);
}

#[test]
fn inspect_json_has_the_documented_fields() {
    let out = ralpc()
        .args([
            "inspect",
            "fixtures/onnx/resnet50/model.onnx",
            "--batch",
            "32",
            "--json",
        ])
        .assert()
        .success();
    let v: serde_json::Value =
        serde_json::from_slice(&out.get_output().stdout).expect("one JSON object");
    assert_eq!(v["params"], 25_530_472);
    assert_eq!(v["macs"].as_u64().unwrap(), 32 * 4_089_184_256);
    assert_eq!(v["batch"], 32);
    let layers = v["layers"].as_array().unwrap();
    let first = &layers[0];
    for key in ["name", "op", "output_shape", "params", "macs"] {
        assert!(first.get(key).is_some(), "layer field {key}");
    }
    assert_eq!(first["op"], "Conv");
    assert_eq!(first["output_shape"], serde_json::json!([32, 64, 112, 112]));
    let sum: u64 = layers.iter().map(|l| l["macs"].as_u64().unwrap()).sum();
    assert_eq!(sum, v["macs"].as_u64().unwrap());
}

#[test]
fn json_is_byte_identical_across_runs() {
    let run = || {
        ralpc()
            .args(["inspect", "fixtures/onnx/densenet121/model.onnx", "--json"])
            .output()
            .unwrap()
            .stdout
    };
    assert_eq!(run(), run());
}

#[test]
fn input_binds_dynamic_image_sizes() {
    let dir = common::fixture("bad");
    let out = Command::cargo_bin("ralpc")
        .unwrap()
        .current_dir(&dir)
        .args([
            "inspect",
            "unbound_dimension.onnx",
            "--input",
            "images=2,3,64,48",
            "--json",
        ])
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(
        v["layers"][0]["output_shape"],
        serde_json::json!([2, 8, 62, 46])
    );
    // 2 images x 8 channels x 62 x 46 outputs x (3 x 3 x 3) MACs each.
    assert_eq!(v["macs"], 2 * 8 * 62 * 46 * 27);
}

#[test]
fn usage_errors_exit_2() {
    ralpc().args(["inspect"]).assert().code(2);
    ralpc()
        .args(["inspect", "x.onnx", "--batch", "0"])
        .assert()
        .code(2);
    ralpc()
        .args(["inspect", "x.onnx", "--input", "nodims"])
        .assert()
        .code(2);
    ralpc().args(["frobnicate"]).assert().code(2);
}

#[test]
fn bad_bindings_exit_1_and_name_the_input() {
    let out = ralpc()
        .args([
            "inspect",
            "fixtures/onnx/resnet50/model.onnx",
            "--input",
            "pixels=1,3,224,224",
        ])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.contains("the model has no input 'pixels' (its inputs: input)"),
        "{stderr}"
    );
    let out = ralpc()
        .args([
            "inspect",
            "fixtures/onnx/resnet50/model.onnx",
            "--input",
            "input=1,3,224",
        ])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr
            .contains("input 'input' has rank 4 ([batch,3,224,224]) but 3 dimension(s) were given"),
        "{stderr}"
    );
}

#[test]
fn missing_file_exits_1() {
    let out = ralpc()
        .args(["inspect", "no/such/model.onnx"])
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.starts_with(
            "error: cannot import the model\n\nCaused by:\n  cannot read 'no/such/model.onnx'"
        ),
        "{stderr}"
    );
}

#[test]
fn help_teaches_and_documents_exit_codes() {
    let out = ralpc().args(["inspect", "--help"]).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout);
    assert!(
        text.contains("Examples:") && text.contains("--batch"),
        "{text}"
    );
    let out = ralpc().arg("--help").assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout);
    assert!(
        text.contains("Exit status:") && text.contains("101"),
        "{text}"
    );
}

#[test]
fn cluster_presets_are_golden() {
    // Every preset's figures, as the summary and as a file that reads back identically.
    let mut all = String::new();
    for preset in ["dgx-a100", "dgx-h100x2", "p3dn-v100", "pcie-a100"] {
        let out = ralpc().args(["cluster", preset]).assert().success();
        all += &String::from_utf8_lossy(&out.get_output().stdout);
        let toml = ralpc()
            .args(["cluster", preset, "--toml"])
            .assert()
            .success();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, &toml.get_output().stdout).unwrap();
        let again = ralpc()
            .args(["cluster", file.to_str().unwrap(), "--toml"])
            .assert()
            .success();
        let strip_name = |b: &[u8]| {
            String::from_utf8_lossy(b)
                .lines()
                .skip(1)
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            strip_name(&again.get_output().stdout),
            strip_name(&toml.get_output().stdout),
            "{preset}"
        );
    }
    insta::assert_snapshot!(all);
}

#[test]
fn cluster_errors_and_flat_overrides() {
    let out = ralpc().args(["cluster", "tpu-v4"]).assert().code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(stderr.contains("unknown cluster 'tpu-v4'"), "{stderr}");
    ralpc()
        .args(["cluster", "--link-bandwidth", "fast"])
        .assert()
        .code(2);
    let out = ralpc()
        .args([
            "cluster",
            "dgx-a100",
            "--nodes",
            "2",
            "--link-bandwidth",
            "1GB/s",
            "--link-latency",
            "0us",
        ])
        .assert()
        .success();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(stdout.contains("16 GPUs on 2 nodes"), "{stdout}");
    assert!(
        stdout.contains("flat network: every link 1 GB/s, α 0 µs"),
        "{stdout}"
    );
}

/// Options that would silently do nothing are refused: `--tolerance nan` (it turned the
/// GPU-time budget off) is a usage error; a `--memory-limit` above the GPUs' memory (it
/// was ignored) names both.
#[test]
fn options_that_would_do_nothing_are_refused() {
    let model = common::fixture("train/cnn.onnx");
    let out = tempfile::tempdir().expect("temp dir");
    for tolerance in ["nan", "-1"] {
        ralpc()
            .arg(&model)
            .args(["--gpus", "2", "--tolerance", tolerance, "-o"])
            .arg(out.path())
            .assert()
            .code(2);
    }
    let failed = ralpc()
        .arg(&model)
        .args(["--gpus", "2", "--memory-limit", "200GiB", "-o"])
        .arg(out.path())
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&failed.get_output().stderr).into_owned();
    assert!(
        stderr.contains("--memory-limit 200.00 GiB is above the GPUs' own"),
        "{stderr}"
    );
}

/// A checkpoint that cannot be written is an output error (exit 3), not a failed run.
#[test]
fn an_unwritable_checkpoint_exits_3() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = dir.path().join("plan");
    ralpc()
        .arg(common::fixture("train/cnn.onnx"))
        .args(["--gpus", "2", "--quiet", "-o"])
        .arg(&plan)
        .assert()
        .success();
    let failed = ralpc()
        .arg("run")
        .arg(&plan)
        .args(["--steps", "2", "--checkpoint-every", "1", "--checkpoint"])
        .arg(dir.path().join("missing/folder/c.bin"))
        .assert()
        .code(3);
    let stderr = String::from_utf8_lossy(&failed.get_output().stderr).into_owned();
    assert!(stderr.contains("cannot write"), "{stderr}");
}

/// Counts below 1 are refused in words, not as clap's "0 is not in 1..18446744073709551615".
#[test]
fn a_zero_batch_is_refused_in_words() {
    let out = ralpc()
        .args(["inspect", "x.onnx", "--batch", "0"])
        .assert()
        .code(2);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(stderr.contains("must be at least 1"), "{stderr}");
    assert!(!stderr.contains("18446744073709551615"), "{stderr}");
}

/// On a terminal, a command that fails at once draws no progress bar (it drew an empty
/// "0/0" one before the error); `script` gives the command a terminal.
#[test]
fn a_quick_failure_on_a_terminal_draws_no_progress_bar() {
    let bin = assert_cmd::cargo::cargo_bin("ralpc");
    for args in [
        "plan missing.onnx --gpus 2",
        "sweep missing.onnx --gpus 2,4",
        "profile missing.onnx --device cpu -o missing.json",
    ] {
        let out = std::process::Command::new("script")
            .args(["-qec", &format!("{} {args}", bin.display()), "/dev/null"])
            .env_remove("NO_COLOR")
            .output()
            .expect("script (util-linux) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("error"), "{args}: {text}");
        for bar in ["0/0", "░", "█", "planning"] {
            assert!(!text.contains(bar), "{args} drew a progress bar: {text}");
        }
    }
}
