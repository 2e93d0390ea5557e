//! The JSON Schemas in `docs/schemas/` are the ones the types generate, and what ralpc
//! writes and prints validates against them: plans and strategies of a CNN and of a GPT,
//! the measured profiles, every cluster preset, each command's `--json` and a `--json` error.
//!
//! `RALPC_BLESS=1 cargo test --test schemas` rewrites `docs/schemas/` after a format change.

mod common;

use std::path::{Path, PathBuf};

use common::{fixture, ralpc, root};
use serde_json::Value;

fn schema_dir() -> PathBuf {
    root().join("docs/schemas")
}

/// The published schema in `file`, compiled.
fn validator(file: &str) -> jsonschema::Validator {
    let path = schema_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let schema: Value = serde_json::from_str(&text).expect("a schema is JSON");
    jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{file} is no schema: {e}"))
}

/// Panics with every violation when `instance` does not follow `file`'s schema.
fn assert_valid(file: &str, what: &str, instance: &Value) {
    let errors: Vec<String> = validator(file)
        .iter_errors(instance)
        .map(|e| format!("  {} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} breaks {file}:\n{}",
        errors.join("\n")
    );
}

fn json_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs ralpc; its stdout as JSON.
fn stdout_json(args: &[&str]) -> Value {
    let out = ralpc().args(args).output().expect("ralpc runs");
    assert!(
        out.status.success(),
        "ralpc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("ralpc {args:?}: {e}"))
}

#[test]
fn published_schemas_are_the_generated_ones() {
    let dir = schema_dir();
    let bless = std::env::var_os("RALPC_BLESS").is_some();
    let schemas = ralpc::formats::schemas();
    for s in &schemas {
        let text = serde_json::to_string_pretty(&s.schema).expect("schemas serialize") + "\n";
        let path = dir.join(s.file);
        if bless {
            std::fs::create_dir_all(&dir).expect("docs/schemas is writable");
            std::fs::write(&path, &text).expect("docs/schemas is writable");
        }
        let published = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            published == text,
            "docs/schemas/{} is stale ({}): RALPC_BLESS=1 cargo test --test schemas",
            s.file,
            s.describes
        );
        // Every schema compiles, and says what it is.
        validator(s.file);
        assert!(s.schema["$schema"].is_string(), "{}", s.file);
    }
    let mut files = common::names_with_suffix(&dir, ".schema.json");
    let mut expected: Vec<String> = schemas
        .iter()
        .map(|s| s.file.trim_end_matches(".schema.json").to_owned())
        .collect();
    files.sort();
    expected.sort();
    assert_eq!(
        files, expected,
        "docs/schemas holds exactly the generated schemas"
    );
}

#[test]
fn plans_strategies_and_summaries_validate() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "cnn",
            fixture("train/cnn.onnx"),
            vec!["--gpus", "4", "--batch", "8"],
        ),
        (
            "vgg16",
            fixture("onnx/vgg16/model.onnx"),
            vec!["--gpus", "8"],
        ),
        // A GPT: the 3d family, its Megatron-LM configuration flattened into the summary.
        ("gpt2", fixture("onnx/gpt2/model.onnx"), vec!["--gpus", "8"]),
    ];
    for (name, model, options) in cases {
        let out = dir.path().join(name);
        let strategy = dir.path().join(format!("{name}.strategy.json"));
        let mut args = vec!["plan", model.to_str().unwrap(), "--json", "-o"];
        args.push(out.to_str().unwrap());
        args.extend(["--write-strategy", strategy.to_str().unwrap()]);
        args.extend(options);
        let summary = stdout_json(&args);
        assert_valid("plan-summary.schema.json", name, &summary);
        assert_eq!(summary["format"], "ralpc-plan-summary/1");
        assert!(
            summary["peak_memory_bytes"].is_u64(),
            "byte counts are integers"
        );
        assert_valid("plan.schema.json", name, &json_file(&out.join("plan.json")));
        assert_valid("strategy.schema.json", name, &json_file(&strategy));
    }
}

#[test]
fn profiles_and_clusters_validate() {
    for name in ["resnet50", "vgg16"] {
        let path = fixture(&format!("measured/h100/{name}.profile.json"));
        assert_valid("profile.schema.json", name, &json_file(&path));
    }
    for preset in ralpc::passes::cluster::PRESETS {
        let out = ralpc()
            .args(["cluster", preset, "--toml"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{preset}");
        let toml: toml::Value = toml::from_slice(&out.stdout).expect("--toml is TOML");
        let json = serde_json::to_value(toml).expect("TOML converts to JSON");
        assert_valid("cluster.schema.json", preset, &json);
    }
    // A mistyped field fails, as reading the file would.
    let wrong = serde_json::json!({ "group": [{ "nodes": 2, "gpus": 8 }] });
    assert!(!validator("cluster.schema.json").is_valid(&wrong));
}

#[test]
fn inspect_sweep_and_run_outputs_validate() {
    let cnn = fixture("train/cnn.onnx");
    let cnn = cnn.to_str().unwrap();
    let inspect = stdout_json(&["inspect", cnn, "--json"]);
    assert_valid("inspect.schema.json", "inspect", &inspect);
    let sweep = stdout_json(&[
        "sweep",
        cnn,
        "--gpus",
        "1,4",
        "--gpu-types",
        "a100",
        "--json",
    ]);
    assert_valid("sweep.schema.json", "sweep", &sweep);
    assert_eq!(sweep["points"].as_array().map(Vec::len), Some(2));

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cnn.ralpc");
    let out = out.to_str().unwrap();
    ralpc()
        .args(["plan", cnn, "--gpus", "2", "--batch", "4", "-o", out])
        .assert()
        .success();
    let run = stdout_json(&["run", out, "--steps", "1", "--json"]);
    assert_valid("run.schema.json", "run", &run);
    assert_eq!(run["losses"].as_array().map(Vec::len), Some(1));

    // Without CUDA the doctor still answers (exit 1, "missing" libraries) in its format.
    let doctor = ralpc().args(["doctor", "--json"]).output().unwrap();
    let doctor: Value = serde_json::from_slice(&doctor.stdout).expect("doctor prints JSON");
    assert_valid("doctor.schema.json", "doctor", &doctor);
}

#[test]
fn errors_under_json_are_one_object_on_stderr() {
    let out = ralpc()
        .args([
            "plan",
            "fixtures/no-such-model.onnx",
            "--gpus",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let error: Value = serde_json::from_slice(&out.stderr).expect("stderr is one JSON object");
    assert_valid("error.schema.json", "error", &error);
    assert_eq!(error["exit_code"], 1);
    assert!(
        error["causes"][0]
            .as_str()
            .unwrap()
            .contains("no-such-model.onnx"),
        "{error}"
    );
    // The schema is not vacuous: a summary without its figures fails it.
    let mut broken = error.clone();
    broken.as_object_mut().unwrap().remove("message");
    assert!(!validator("error.schema.json").is_valid(&broken));
}

#[test]
fn sets_and_background_jobs_validate() {
    let vgg = fixture("anchors/deeppool/A100_vgg.prof");
    let vgg = vgg.to_str().unwrap();
    let wrn = fixture("anchors/deeppool/A100_wrn.prof");
    let set = stdout_json(&[
        "plan",
        vgg,
        wrn.to_str().unwrap(),
        "--gpus",
        "4",
        "--batch",
        "16",
        "--json",
    ]);
    assert_valid("plan-set.schema.json", "set", &set);
    assert_eq!(set["format"], "ralpc-plan-set/1");
    let beside = stdout_json(&[
        "plan",
        vgg,
        "--gpus",
        "4",
        "--batch",
        "16",
        "--background",
        vgg,
        "--json",
    ]);
    assert_valid("plan-summary.schema.json", "background", &beside);
    assert!(beside["background"]["partitions"].is_array());
}
