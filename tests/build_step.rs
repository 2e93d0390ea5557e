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
    } else {
        common::skip_without(
            "Graphviz (dot)",
            "Debian: apt install graphviz",
            "a missing plan.svg making the directory stale",
        );
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

/// `--json` alone is a program's question: the answer goes to stdout and nothing appears in
/// its working directory; with `-o` the artifacts are written as usual.
#[test]
fn json_without_an_output_directory_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::root().join(VGG16);
    let model = model.to_str().unwrap();
    let printed = stdout(ralpc(dir.path()).args([model, "--gpus", "8", "--json"]));
    let _: serde_json::Value = serde_json::from_str(&printed).expect("one JSON object");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "--json wrote {left:?}");
    stdout(ralpc(dir.path()).args([model, "--gpus", "8", "--json", "-o", "out"]));
    assert!(dir.path().join("out/plan.json").is_file());
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

/// Someone who can write into the output directory plants links at every name a write
/// uses (the artifacts and the old scheme's `.NAME.<pid>.tmp`, for the next pids): ralpc
/// replaces the links and never writes through them.
#[cfg(unix)]
#[test]
fn links_planted_in_the_output_directory_are_replaced_not_followed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").expect("write");
    for name in ralpc::ARTIFACTS
        .iter()
        .chain(&["plan.svg", "megatron.args"])
    {
        std::os::unix::fs::symlink(&victim, out.join(name)).expect("link");
        for pid in 0..64u32 {
            let guess = out.join(format!(".{name}.{pid}.tmp"));
            std::os::unix::fs::symlink(&victim, guess).expect("link");
        }
    }
    ralpc(dir.path())
        .arg(common::fixture("train/cnn.onnx"))
        .args(["--gpus", "2", "--quiet", "-o"])
        .arg(&out)
        .assert()
        .success();
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
    for name in ralpc::ARTIFACTS {
        let kind = std::fs::symlink_metadata(out.join(name))
            .expect("written")
            .file_type();
        assert!(kind.is_file(), "{name} is a file of its own");
    }
}

/// An output that names an input (through any path) is refused with exit 1 before any
/// work, and the input stays; `--force` allows it.
#[test]
fn outputs_that_would_replace_an_input_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("cnn.onnx");
    std::fs::copy(common::fixture("train/cnn.onnx"), &model).expect("copy");
    let before = std::fs::read(&model).expect("read");
    let refused = |args: &[&str]| {
        let out = ralpc(dir.path()).args(args).assert().code(1);
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(err.contains("an input of this command"), "{args:?}: {err}");
        assert_eq!(std::fs::read(&model).expect("read"), before, "{args:?}");
    };
    refused(&["cnn.onnx", "--gpus", "2", "--write-strategy", "./cnn.onnx"]);
    refused(&[
        "profile",
        "cnn.onnx",
        "--batch-sizes",
        "1",
        "-o",
        "cnn.onnx",
    ]);
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    std::fs::copy(&model, dir.path().join("sub/report.html")).expect("copy");
    let inside = dir.path().join("sub/report.html");
    let inside = inside.to_str().expect("utf-8");
    let out = ralpc(dir.path())
        .args([inside, "--gpus", "2", "-o", "sub"])
        .assert()
        .code(1);
    assert!(String::from_utf8_lossy(&out.get_output().stderr).contains("report.html"));
    ralpc(dir.path())
        .args([
            "cnn.onnx",
            "--gpus",
            "2",
            "--quiet",
            "--force",
            "--write-strategy",
            "cnn.onnx",
        ])
        .assert()
        .success();
    assert_ne!(
        std::fs::read(&model).expect("read"),
        before,
        "--force replaced it"
    );
}

/// `--check` trusts a directory only when every file is the one its plan wrote: an edited
/// plan.json that keeps its inputs hash, or a set mixed from two plans, is out of date.
#[test]
fn an_edited_or_mixed_output_directory_is_not_up_to_date() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::fixture("train/cnn.onnx");
    let model = model.to_str().expect("utf-8");
    let plan = |gpus: &str, out: &str| {
        ralpc(dir.path())
            .args([model, "--gpus", gpus, "--quiet", "-o", out])
            .assert()
            .success();
    };
    let check = |out: &str| {
        ralpc(dir.path())
            .args([model, "--gpus", "2", "--check", "-o", out])
            .assert()
            .get_output()
            .status
            .code()
    };
    plan("2", "a");
    assert_eq!(check("a"), Some(0));
    let path = dir.path().join("a/plan.json");
    let text = std::fs::read_to_string(&path).expect("read");
    let edited = text.replacen("\"microbatches\": 1", "\"microbatches\": 2", 1);
    assert_ne!(edited, text, "the plan names its microbatches");
    std::fs::write(&path, edited).expect("write");
    assert_eq!(check("a"), Some(1), "an edited plan.json");
    // Another plan's report beside this plan's plan.json.
    plan("2", "b");
    plan("4", "c");
    std::fs::copy(
        dir.path().join("c/report.html"),
        dir.path().join("b/report.html"),
    )
    .expect("copy");
    assert_eq!(check("b"), Some(1), "a mixed set");
}
