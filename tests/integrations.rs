//! The documented build integrations run as written: the Makefile rule and the CMake
//! custom command plan once, skip when nothing changed, and plan again when the model
//! changes. (The Cargo `build.rs` example is a workspace crate: `cargo test` builds it.)

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

fn tool(name: &str) -> bool {
    let found = Command::new(name).arg("--version").output().is_ok();
    if !found {
        common::skip_without(
            name,
            "Debian: apt install make cmake",
            "the build integration",
        );
    }
    found
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

/// A model of our own, so that touching it changes nothing shared.
fn model(dir: &Path) -> std::path::PathBuf {
    let model = dir.join("model.onnx");
    std::fs::copy(common::fixture("onnx/vgg16/model.onnx"), &model).unwrap();
    model
}

/// Makes the model newer than the plan, as an edit would.
fn touch(model: &Path) {
    let later = SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(model)
        .unwrap()
        .set_modified(later)
        .unwrap();
}

#[test]
fn the_makefile_rule_plans_when_the_model_changes() {
    if !tool("make") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = model(dir.path());
    let makefile = common::root().join("tests/integrations/make/Makefile");
    let make = || {
        let mut cmd = Command::new("make");
        cmd.current_dir(dir.path())
            .arg("-f")
            .arg(&makefile)
            .arg(format!(
                "RALPC={}",
                assert_cmd::cargo::cargo_bin("ralpc").display()
            ))
            .arg(format!("MODEL={}", model.display()));
        cmd
    };
    run(&mut make());
    let plan = dir.path().join("plan/plan.json");
    assert!(plan.is_file());
    let first = modified(&plan);
    assert!(
        run(&mut make()).contains("Nothing to be done"),
        "make skips a fresh plan"
    );
    run(make().arg("check"));
    touch(&model);
    run(&mut make());
    // The inputs did not change (same bytes): ralpc keeps the plan, make is satisfied.
    assert_eq!(modified(&plan), first);
    run(make().arg("check"));
}

#[test]
fn the_cmake_custom_command_plans_at_build_time() {
    if !tool("cmake") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = model(dir.path());
    let build = dir.path().join("build");
    run(Command::new("cmake")
        .arg("-S")
        .arg(common::root().join("tests/integrations/cmake"))
        .arg("-B")
        .arg(&build)
        .arg(format!(
            "-DRALPC={}",
            assert_cmd::cargo::cargo_bin("ralpc").display()
        ))
        .arg(format!("-DMODEL={}", model.display())));
    let log = run(Command::new("cmake").arg("--build").arg(&build));
    assert!(log.contains("Planning"), "{log}");
    for name in ["plan.json", "report.html", "timeline.json"] {
        assert!(build.join("plan").join(name).is_file(), "{name}");
    }
    let again = run(Command::new("cmake").arg("--build").arg(&build));
    assert!(!again.contains("Planning"), "nothing to do:\n{again}");
}
