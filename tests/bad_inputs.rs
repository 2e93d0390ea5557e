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

/// Numbers beyond any machine, in files and flags, are refused at the door with the field
/// named (exit 1, or 2 for a flag) — before, a PipeDream size of 1e308 or a split of
/// 2^32 GPUs overflowed (101), a DeepPool time of 1e308 or a bandwidth of 1e-300 B/s
/// planned `inf` durations, and `dgx-a100x536870912` overflowed its GPU count.
#[test]
fn absurd_numbers_are_refused_at_the_door() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ralpc = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ralpc"))
            .args(args)
            .current_dir(dir.path())
            .env("NO_COLOR", "1")
            .output()
            .expect("ralpc runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let edited = |fixture: &str, name: &str, from: &str, to: &str| {
        let text = std::fs::read_to_string(common::fixture(fixture)).expect("fixture");
        assert!(text.contains(from), "{fixture} has {from}");
        std::fs::write(dir.path().join(name), text.replacen(from, to, 1)).expect("write");
    };
    edited(
        "anchors/pipedream/alexnet/graph.txt",
        "graph.txt",
        "activation_size=44302336.000",
        "activation_size=1e308",
    );
    edited(
        "anchors/deeppool/A100_vgg.prof",
        "vgg.prof",
        "2.157      2157",
        "2.157      1e308",
    );
    let cases: [(&[&str], i32, &str); 6] = [
        (
            &["plan", "graph.txt", "--gpus", "4", "--batch", "128"],
            1,
            "activation_size",
        ),
        (
            &["plan", "vgg.prof", "--gpus", "4"],
            1,
            "between 0 and an hour",
        ),
        (
            &["cluster", "dgx-a100x536870912"],
            1,
            "a cluster has at most",
        ),
        (
            &[
                "plan",
                "graph.txt",
                "--gpus",
                "4",
                "--link-bandwidth",
                "1e-300B/s",
            ],
            2,
            "from 1B/s",
        ),
        (
            &["cluster", "dgx-a100x1000", "--nodes", "4096"],
            1,
            "a cluster has at most",
        ),
        // Work past any host's memory is refused before it starts.
        (
            &[
                "plan",
                "graph.txt",
                "--gpus",
                "4",
                "--max-instructions",
                "18446744073709551615",
            ],
            2,
            "at most 100000000",
        ),
    ];
    for (args, code, says) in cases {
        let (got, stderr) = ralpc(args);
        assert_eq!(got, Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // A strategy whose split uses 2^32 GPUs.
    let model = common::fixture("train/mlp.onnx");
    let model = model.to_str().expect("utf-8");
    let (code, stderr) = ralpc(&[
        "plan",
        model,
        "--gpus",
        "2",
        "--quiet",
        "--write-strategy",
        "s.json",
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let mut strategy: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("s.json")).expect("read"))
            .expect("JSON");
    let layers = strategy["layers"].as_array_mut().expect("layers");
    layers[0]["split"] = serde_json::json!({ "sample": 65536, "attribute": 65536, "parameter": 1 });
    layers[0].as_object_mut().expect("a layer").remove("gpus");
    std::fs::write(dir.path().join("s.json"), strategy.to_string()).expect("write");
    let (code, stderr) = ralpc(&["plan", model, "--gpus", "2", "--strategy-file", "s.json"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("its split uses more than"), "{stderr}");
}
