//! Helpers shared by the integration tests.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::PathBuf;

pub mod train;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A path under `fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    root().join("fixtures").join(rel)
}

/// The names of the files in `dir` ending in `suffix`, with the suffix removed, sorted.
pub fn names_with_suffix(dir: &std::path::Path, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_suffix(suffix)
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    names
}

/// Every `fixtures/onnx/<case>` with a `model.onnx`, sorted.
pub fn onnx_cases() -> Vec<String> {
    let mut cases: Vec<String> = std::fs::read_dir(fixture("onnx"))
        .expect("fixtures/onnx exists")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("model.onnx").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    cases.sort();
    cases
}

/// Imports, binds to `batch`, verifies and accounts for a fixture.
pub fn account(
    case: &str,
    batch: Option<u64>,
) -> (
    ralpc_ir::onnx::Model,
    ralpc_ir::GraphInfo,
    ralpc_ir::Accounting,
) {
    let mut model = ralpc_ir::onnx::import(&fixture(&format!("onnx/{case}/model.onnx")))
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    ralpc_ir::bind(
        &mut model.graph,
        &ralpc_ir::Bindings {
            batch,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    let info = ralpc_ir::verify(&model.graph).unwrap_or_else(|e| panic!("{case}: {e}"));
    let acc = ralpc_ir::account(&model.graph, &info).unwrap_or_else(|e| panic!("{case}: {e}"));
    (model, info, acc)
}

/// A test that needs a tool this machine lacks (`tool`, installed by `install`): under CI,
/// which installs every such tool (`.ci/run`), that is a failure; elsewhere the test is
/// skipped and says so on the terminal. The line is written to the process's stderr itself,
/// not through `eprintln!`, which the test harness captures and shows only for failures:
/// a skipped check must not read as a passed one.
pub fn skip_without(tool: &str, install: &str, what: &str) {
    use std::io::Write as _;
    assert!(
        std::env::var_os("CI").is_none(),
        "CI installs {tool} (.ci/run), but it is missing: {what} was not checked"
    );
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED: {what}: {tool} is not installed ({install})"
    );
}

/// A scratch working directory for running `ralpc` from (it writes `<stem>.ralpc/` there by
/// default), with `fixtures` linked in so that relative model paths resolve. One per test
/// process.
pub fn workdir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ralpc-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let link = dir.join("fixtures");
        // A process of an earlier run with the same id may have left a link to another
        // checkout, which may be gone: point it here.
        if std::fs::read_link(&link).ok() != Some(fixture("")) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(fixture(""), &link).expect("a fixtures link");
        }
        dir
    })
    .clone()
}

/// A 4-rank plan of the CNN fixture at batch 8 — a 1F1B pipeline of two stages, each on two
/// ranks (messages between stages, all-reduces within them) — written by `ralpc` into a
/// temporary directory: the directory and the plan's path.
pub fn pipeline_plan() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let strategy = dir.path().join("strategy.json");
    std::fs::write(
        &strategy,
        r#"{ "format": "ralpc-strategy/1", "schedule": "1f1b", "microbatches": 2,
  "stages": [ { "first_layer": "conv0", "last_layer": "pool0", "replicas": 2 },
              { "first_layer": "conv1", "last_layer": "fc1", "replicas": 2 } ] }"#,
    )
    .expect("write");
    let out = dir.path().join("plan");
    assert_cmd::Command::cargo_bin("ralpc")
        .expect("binary built")
        .env("NO_COLOR", "1")
        .arg(fixture("train/cnn.onnx"))
        .args(["--gpus", "4", "--batch", "8", "--quiet", "--strategy-file"])
        .arg(&strategy)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    (dir, out)
}

/// The `ralpc` binary, run in [`workdir`] without colour.
pub fn ralpc() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("ralpc").expect("binary built");
    cmd.current_dir(workdir()).env("NO_COLOR", "1");
    cmd
}

/// `ralpc plan`'s arguments for DeepSeek-V3 from its configuration at the layout NVIDIA
/// published for 1,024 H100s (Megatron-Bridge 25.09: TP2 PP8 EP64, FP8, its recipe's
/// HybridEP dispatcher and recomputed modules).
pub const DEEPSEEK_V3_ON_1024_H100: [&str; 19] = [
    "fixtures/configs/deepseek-v3.json",
    "--input",
    "input_ids=8192,4096",
    "--cluster",
    "eos",
    "--gpus",
    "1024",
    "--precision",
    "fp8",
    "--tensor-parallel",
    "2",
    "--pipeline-parallel",
    "8",
    "--expert-parallel",
    "64",
    "--moe-dispatcher",
    "flex",
    "--recompute-modules",
    "mla_up_proj,mlp",
];

/// `ralpc plan`'s arguments for Qwen3-30B-A3B from its configuration on 16 H100s in bf16,
/// with Megatron-Core's all-to-all overlap, the layout searched.
pub const QWEN3_30B_ON_16_H100_OVERLAPPED: [&str; 11] = [
    "fixtures/configs/qwen3-30b-a3b.json",
    "--input",
    "input_ids=512,4096",
    "--cluster",
    "eos",
    "--gpus",
    "16",
    "--precision",
    "bf16",
    "--moe-a2a-overlap",
    "on",
];
