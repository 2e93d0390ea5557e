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

/// `ralpc inspect MODEL` from a temporary copy: exit status and stderr.
fn inspect_bytes(bytes: &[u8]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, bytes).expect("writes");
    let out = Command::new(env!("CARGO_BIN_EXE_ralpc"))
        .arg("inspect")
        .arg(&path)
        .env("NO_COLOR", "1")
        .output()
        .expect("ralpc runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// 200,000 nested protobuf groups in an unknown field (800 KB) overflowed the decoder's
/// stack (exit 134); they are refused by depth, before decoding.
#[test]
fn deeply_nested_groups_are_refused_not_a_crash() {
    let mut bytes = std::fs::read(common::fixture("train/mlp.onnx")).expect("fixture");
    let n = 200_000;
    // Field 99 (tag varint 0x9b 0x06: start group; 0x9c 0x06: end group).
    bytes.extend([0x9b, 0x06].repeat(n));
    bytes.extend([0x9c, 0x06].repeat(n));
    let (code, stderr) = inspect_bytes(&bytes);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("groups nested over 100 deep"), "{stderr}");
}

/// A node named with a terminal escape, a bell and a newline followed by a forged
/// `error:` line is printed escaped, its continuation indented.
#[test]
fn names_reach_the_terminal_escaped() {
    use onnx_protobuf::{Message, ModelProto};
    let bytes = std::fs::read(common::fixture("train/mlp.onnx")).expect("fixture");
    let mut model = ModelProto::parse_from_bytes(&bytes).expect("decodes");
    let node = &mut model.graph.mut_or_insert_default().node[0];
    node.op_type = "NoSuchOp".into();
    node.name = "evil\u{1b}[2J\u{7}\nerror: forged".into();
    let (code, stderr) = inspect_bytes(&model.write_to_bytes().expect("encodes"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\u{7}'),
        "{stderr:?}"
    );
    assert!(stderr.contains("evil\\u{1b}[2J\\u{7}"), "{stderr}");
    assert!(
        !stderr.lines().any(|l| l.starts_with("error: forged")),
        "{stderr}"
    );
}

/// Devices and files over their kind's limit are refused before they are read: a profile
/// from `/dev/zero` grew to 14.7 GB before.
#[cfg(unix)]
#[test]
fn inputs_must_be_regular_files_within_their_limit() {
    let model = common::fixture("train/cnn.onnx");
    let run = |args: &[&str], env: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ralpc"));
        c.arg(&model).args(args).env("NO_COLOR", "1");
        if let Some(limit) = env {
            c.env("RALPC_MAX_INPUT_BYTES", limit);
        }
        let out = c.output().expect("ralpc runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let out = tempfile::tempdir().expect("temp dir");
    let dir = out.path().join("plan");
    let dir = dir.to_str().expect("UTF-8");
    let (code, stderr) = run(&["--gpus", "2", "--profile", "/dev/zero", "-o", dir], None);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
    let (code, stderr) = run(&["--gpus", "2", "-o", dir], Some("100"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("over the limit of 100 for a model (set RALPC_MAX_INPUT_BYTES"),
        "{stderr}"
    );
    assert!(!out.path().join("plan").exists(), "nothing written");
}

/// A PyTorch checkpoint (a zip archive) is named as such, with how to export to ONNX,
/// rather than "protobuf decoding failed / Incorrect tag".
#[test]
fn a_pytorch_file_is_named_and_the_export_suggested() {
    let mut zip = b"PK\x03\x04".to_vec();
    zip.extend([0u8; 60]);
    let (code, stderr) = inspect_bytes(&zip);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("is a zip archive"), "{stderr}");
    assert!(stderr.contains("torch.onnx.export"), "{stderr}");
}

/// An output declared with a shape the graph does not compute (exporters leave stale ones:
/// speechmos' plcmos declares a scalar and computes one score per sample) is accepted with a
/// warning, as onnxruntime accepts it; the computed shape is used.
#[test]
fn a_declared_output_shape_the_graph_contradicts_is_a_warning() {
    use onnx_protobuf::{Message, ModelProto};
    let bytes = std::fs::read(common::fixture("train/mlp.onnx")).expect("fixture");
    let mut model = ModelProto::parse_from_bytes(&bytes).expect("decodes");
    let output = &mut model.graph.mut_or_insert_default().output[0];
    let shape = output
        .type_
        .mut_or_insert_default()
        .mut_tensor_type()
        .shape
        .mut_or_insert_default();
    shape.dim.truncate(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, model.write_to_bytes().expect("encodes")).expect("writes");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ralpc"))
            .args(args)
            .arg(&path)
            .env("NO_COLOR", "1")
            .output()
            .expect("ralpc runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    for args in [&["inspect"][..], &["plan", "--gpus", "2", "--batch", "4"]] {
        let (code, text) = run(args);
        assert_eq!(code, Some(0), "{args:?}: {text}");
        assert!(
            text.contains("output 'fc2' is declared [batch] but computes"),
            "{args:?}: {text}"
        );
    }
}
