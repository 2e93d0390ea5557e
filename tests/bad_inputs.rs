//! Every file in `fixtures/bad/` makes `ralpc inspect` exit 1 with a message naming what
//! is wrong; the full rendered message is snapshotted (`tests/snapshots/bad_inputs__*.snap`).

mod common;

use std::process::Command;

#[test]
fn every_bad_model_fails_cleanly_with_a_named_cause() {
    let dir = common::fixture("bad");
    let cases = common::names_with_suffix(&dir, ".onnx");
    assert!(cases.len() >= 20, "the corpus has {} files", cases.len());
    for case in cases {
        // Run from the corpus folder with a relative path, so messages are machine-independent.
        let out = Command::new(env!("CARGO_BIN_EXE_ralpc"))
            .current_dir(&dir)
            .args(["inspect", &format!("{case}.onnx"), "--batch", "4"])
            .env("NO_COLOR", "1")
            .output()
            .expect("ralpc runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{case}: exit status; stderr:\n{stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "{case}: nothing on stdout on failure"
        );
        assert!(stderr.starts_with("error: "), "{case}: {stderr}");
        assert!(!stderr.contains("panicked"), "{case}: {stderr}");
        insta::assert_snapshot!(case, stderr);
    }
}
