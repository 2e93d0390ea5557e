//! ralpc as a build step: the default output directory, `--check`, skipping up-to-date
//! work, `--quiet`, and atomic artifacts under `kill`.

mod common;

use std::path::Path;
use std::time::Duration;

use assert_cmd::Command;

const VGG16: &str = "fixtures/onnx/vgg16/model.onnx";

fn ralpc(cwd: &Path) -> Command {
    let mut cmd = Command::cargo_bin("ralpc").expect("binary built");
    cmd.current_dir(cwd).env("NO_COLOR", "1");
    cmd
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&cmd.assert().success().get_output().stdout).into_owned()
}

#[test]
fn a_plan_is_written_once_and_checked_after() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::root().join(VGG16);
    let model = model.to_str().unwrap();
    // Not there yet: --check fails, and says why.
    let out = ralpc(dir.path())
        .args([model, "--gpus", "8", "--check"])
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("model.ralpc is not up to date"), "{err}");
    // The default directory is `<stem>.ralpc` in the working directory.
    let first = stdout(ralpc(dir.path()).args([model, "--gpus", "8"]));
    assert!(first.contains("wrote model.ralpc: plan.json"), "{first}");
    for name in ralpc::ARTIFACTS {
        assert!(
            dir.path().join("model.ralpc").join(name).is_file(),
            "{name}"
        );
    }
    let plan = std::fs::read_to_string(dir.path().join("model.ralpc/plan.json")).unwrap();
    // Up to date now: --check passes, a plain run does nothing.
    ralpc(dir.path())
        .args([model, "--gpus", "8", "--check"])
        .assert()
        .success();
    let again = stdout(ralpc(dir.path()).args([model, "--gpus", "8"]));
    assert!(again.contains("up to date"), "{again}");
    // Every artifact counts: with Graphviz installed (CI installs it), a missing drawing
    // makes the directory stale, and a plain run draws it again.
    if ralpc::graphviz_installed() {
        let svg = dir.path().join("model.ralpc/plan.svg");
        std::fs::remove_file(&svg).unwrap();
        ralpc(dir.path())
            .args([model, "--gpus", "8", "--check"])
            .assert()
            .code(1);
        stdout(ralpc(dir.path()).args([model, "--gpus", "8"]));
        assert!(svg.is_file());
    }
    // Other options are other inputs.
    ralpc(dir.path())
        .args([model, "--gpus", "4", "--check"])
        .assert()
        .code(1);
    // --force plans again, identically; --quiet prints nothing.
    let quiet = stdout(ralpc(dir.path()).args([model, "--gpus", "8", "--force", "--quiet"]));
    assert!(quiet.is_empty(), "{quiet}");
    let replanned = std::fs::read_to_string(dir.path().join("model.ralpc/plan.json")).unwrap();
    assert_eq!(plan, replanned);
    // A changed model is a changed input.
    let copy = dir.path().join("copy.onnx");
    std::fs::copy(common::root().join(VGG16), &copy).unwrap();
    let copy = copy.to_str().unwrap();
    stdout(ralpc(dir.path()).args([copy, "--gpus", "8", "-o", "c"]));
    ralpc(dir.path())
        .args([copy, "--gpus", "8", "-o", "c", "--check"])
        .assert()
        .success();
    let mut bytes = std::fs::read(copy).unwrap();
    bytes.extend_from_slice(b"\0");
    std::fs::write(copy, bytes).unwrap();
    ralpc(dir.path())
        .args([copy, "--gpus", "8", "-o", "c", "--check"])
        .assert()
        .code(1);
}

#[test]
fn killing_a_run_leaves_complete_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::root().join("fixtures/onnx/resnet50/model.onnx");
    let model = model.to_str().unwrap();
    let args = [model, "--gpus", "16", "-o", "out", "--force", "--quiet"];
    ralpc(dir.path()).args(args).assert().success();
    let read = |name: &str| std::fs::read_to_string(dir.path().join("out").join(name)).unwrap();
    let before: Vec<String> = ralpc::ARTIFACTS.iter().map(|n| read(n)).collect();
    let binary = assert_cmd::cargo::cargo_bin("ralpc");
    // Kill runs at spread-out moments: whatever is in `out/` is a whole artifact.
    for delay_ms in [5u64, 20, 40, 60, 80, 100, 130, 160, 200, 300] {
        let mut child = std::process::Command::new(&binary)
            .current_dir(dir.path())
            .args(args)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill();
        let _ = child.wait();
        for (name, old) in ralpc::ARTIFACTS.iter().zip(&before) {
            assert_eq!(&read(name), old, "{name} after a kill at {delay_ms} ms");
        }
    }
}

/// A plan that cannot be written leaves nothing of itself behind: with `plan.json` taken by
/// a folder, not one artifact is written (before, three were) and the exit status is 3.
#[test]
fn a_failed_write_leaves_no_partial_set() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("plan.json")).expect("a folder in the way");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_ralpc"))
        .arg(common::fixture("train/cnn.onnx"))
        .args(["--gpus", "2", "--quiet", "-o"])
        .arg(&out)
        .status()
        .expect("ralpc runs");
    assert_eq!(status.code(), Some(3));
    let left: Vec<_> = std::fs::read_dir(&out)
        .expect("listed")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("plan.json")]);
}
