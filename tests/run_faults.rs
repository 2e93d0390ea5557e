//! Reliability of runs and artifacts. A failing rank never hangs a run: a rank that
//! panics, is killed or stops responding at any instruction makes every rank stop within
//! the timeout, and the error names the rank and its instruction. Checkpoints resume
//! bit-identically; training, plans, traces and reports are bit-identical whatever the
//! thread count.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ralpc::runtime::cpu::exec::{Fault, FaultKind};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

/// Plans the CNN fixture with `strategy` into a temporary directory.
fn plan(strategy: &str, gpus: u32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("strategy.json");
    std::fs::write(&file, strategy).expect("write");
    let model = common::fixture("train/cnn.onnx");
    let compiled = ralpc::compile(&ralpc::Options {
        model: model.clone(),
        gpus: Some(gpus),
        batch: Some(8),
        strategy_file: Some(file),
        ..Default::default()
    })
    .expect("plan");
    compiled.write(dir.path()).expect("write the plan");
    (dir, model)
}

const PIPELINE: &str = r#"{ "format": "ralpc-strategy/1", "schedule": "1f1b", "microbatches": 2,
  "stages": [ { "first_layer": "conv0", "last_layer": "pool0", "replicas": 2 },
              { "first_layer": "conv1", "last_layer": "fc1", "replicas": 2 } ] }"#;

fn options(dir: &Path, model: &Path) -> ralpc::RunOptions {
    ralpc::RunOptions {
        plan: dir.to_path_buf(),
        model: Some(model.to_path_buf()),
        timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

#[test]
fn a_failing_rank_stops_every_rank_and_is_named() {
    let (dir, model) = plan(PIPELINE, 4);
    let text = std::fs::read_to_string(dir.path().join("plan.json")).expect("plan");
    let plan = ralpc::codegen::plan::Plan::parse(&text).expect("valid plan");
    // Deterministic "random" instructions: a splitmix stream over ranks and programs.
    let mut state = 0x5eed_u64;
    let mut next = |n: usize| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    };
    for kind in [FaultKind::Panic, FaultKind::Exit, FaultKind::Hang] {
        for _ in 0..3 {
            let rank = next(plan.ranks as usize) as u32;
            let instruction = next(plan.programs[rank as usize].len());
            // A panic aborts the others at once: its run waits far longer than it may take
            // (setup included, on a loaded machine), so only the abort can stop it in time.
            let timeout = match kind {
                FaultKind::Panic => Duration::from_secs(20),
                _ => Duration::from_secs(2),
            };
            let started = Instant::now();
            let error = ralpc::run(&ralpc::RunOptions {
                fault: Some(Fault {
                    rank,
                    instruction,
                    kind,
                }),
                timeout,
                ..options(dir.path(), &model)
            })
            .expect_err("a failed rank fails the run");
            let took = started.elapsed();
            assert_eq!(error.exit_code(), 4, "{error}");
            let message = format!("{error}{}", common::train::error_chain(&error));
            let named = match kind {
                FaultKind::Panic => format!("rank {rank}, instruction {instruction}"),
                _ => format!("rank {rank} at instruction {instruction}"),
            };
            // A rank that is the last to act may fail with nobody left to wait on it: then
            // the run succeeded for everyone else, which is not this test's case.
            assert!(
                message.contains(&named),
                "{kind:?} at {rank}:{instruction}: {message}"
            );
            let bound = match kind {
                FaultKind::Panic => timeout / 2,
                _ => 2 * timeout + Duration::from_secs(3),
            };
            assert!(took < bound, "{kind:?}: stopped after {took:?}");
        }
    }
}

/// A checkpoint that cannot be written stops the run: the error is the write's, naming the
/// file (exit 3), not a rank's failure, and nothing is left at the path.
#[test]
fn a_checkpoint_that_cannot_be_written_stops_the_run() {
    let (dir, model) = plan(PIPELINE, 4);
    let checkpoint = dir.path().join("missing-folder").join("state.safetensors");
    let error = ralpc::run(&ralpc::RunOptions {
        steps: 2,
        checkpoint_every: Some(1),
        checkpoint: Some(checkpoint.clone()),
        ..options(dir.path(), &model)
    })
    .expect_err("the checkpoint's folder does not exist");
    assert_eq!(error.exit_code(), 3, "{error}");
    assert!(error.to_string().contains("state.safetensors"), "{error}");
    assert!(!checkpoint.exists());
}

/// [`PIPELINE`] with ZeRO-1: each replica keeps the momentum of its share of a bucket.
const PIPELINE_ZERO: &str = r#"{ "format": "ralpc-strategy/1", "schedule": "1f1b", "microbatches": 2,
  "stages": [ { "first_layer": "conv0", "last_layer": "pool0", "replicas": 2 },
              { "first_layer": "conv1", "last_layer": "fc1", "replicas": 2 } ], "zero": 1 }"#;

#[test]
fn a_sharded_optimizers_run_resumes_bit_identically() {
    let (dir, model) = plan(PIPELINE_ZERO, 4);
    resumes_bit_identically(&dir, &model);
}

/// Six steps of the plan in `dir` equal three steps, a checkpoint, and three more from
/// it, bit for bit; the checkpoint's path.
fn resumes_bit_identically(dir: &tempfile::TempDir, model: &Path) -> PathBuf {
    let whole = ralpc::run(&ralpc::RunOptions {
        steps: 6,
        ..options(dir.path(), model)
    })
    .expect("six steps");
    let checkpoint = dir.path().join("state.bin");
    ralpc::run(&ralpc::RunOptions {
        steps: 3,
        checkpoint_every: Some(3),
        checkpoint: Some(checkpoint.clone()),
        ..options(dir.path(), model)
    })
    .expect("three steps and a checkpoint");
    let resumed = ralpc::run(&ralpc::RunOptions {
        steps: 6,
        resume: Some(checkpoint.clone()),
        ..options(dir.path(), model)
    })
    .expect("three more");
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&resumed.report.losses), bits(&whole.report.losses));
    for (name, w) in &whole.report.weights {
        let r = &resumed.report.weights[name];
        assert!(
            w.iter().zip(r).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name} differs after resuming"
        );
    }
    checkpoint
}

#[test]
fn a_resumed_run_continues_bit_identically() {
    let (dir, model) = plan(PIPELINE, 4);
    let checkpoint = resumes_bit_identically(&dir, &model);
    // A checkpoint of another plan is refused.
    let (other, model2) = plan(
        r#"{ "format": "ralpc-strategy/1", "stages": [ { "first_layer": "conv0", "last_layer": "fc1", "replicas": 2 } ] }"#,
        2,
    );
    let error = ralpc::run(&ralpc::RunOptions {
        steps: 6,
        resume: Some(checkpoint),
        ..options(other.path(), &model2)
    })
    .expect_err("another plan's checkpoint");
    assert!(error.to_string().contains("another plan"), "{error}");
}

#[test]
fn training_is_bit_reproducible_whatever_the_thread_count() {
    let (dir, _) = plan(PIPELINE, 4);
    let run = |threads: &str| {
        let out = assert_cmd::Command::cargo_bin("ralpc")
            .expect("binary")
            .current_dir(common::root())
            .env("RAYON_NUM_THREADS", threads)
            .args(["run", "--steps", "3", "--json"])
            .arg(dir.path())
            .assert()
            .success();
        let json: serde_json::Value =
            serde_json::from_slice(&out.get_output().stdout).expect("JSON");
        json["losses"].to_string()
    };
    assert_eq!(run("1"), run("2"));
}

#[test]
fn a_plan_that_does_not_fit_in_memory_is_refused_before_it_starts() {
    let (dir, model) = plan(PIPELINE, 4);
    let out = assert_cmd::Command::cargo_bin("ralpc")
        .expect("binary")
        .env("RALPC_MEMORY_AVAILABLE", "1000")
        .args(["run", "--model"])
        .arg(&model)
        .arg(dir.path())
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.contains("need") && stderr.contains("available"),
        "{stderr}"
    );
}

#[test]
fn plans_traces_and_reports_are_byte_identical_whatever_the_thread_count() {
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().expect("dir")).collect();
    for (dir, threads) in dirs.iter().zip(["1", "2"]) {
        assert_cmd::Command::cargo_bin("ralpc")
            .expect("binary")
            .current_dir(common::root())
            .env("RAYON_NUM_THREADS", threads)
            .args([
                "fixtures/onnx/resnet50/model.onnx",
                "--gpus",
                "16",
                "--quiet",
                "-o",
            ])
            .arg(dir.path())
            .assert()
            .success();
    }
    for artifact in ["plan.json", "timeline.json", "report.html", "plan.dot"] {
        let read = |d: &tempfile::TempDir| std::fs::read(d.path().join(artifact)).expect(artifact);
        assert!(
            read(&dirs[0]) == read(&dirs[1]),
            "{artifact} differs between 1 and 2 threads"
        );
    }
}

/// A damaged or doctored checkpoint is refused when it is read, naming what is wrong: a
/// flipped bit (its hash), a NaN weight, a renamed or a missing tensor. Before, these
/// were accepted or failed only after the whole timeout.
#[test]
fn damaged_checkpoints_are_refused_before_the_run() {
    let (dir, model) = plan(PIPELINE, 4);
    let checkpoint = dir.path().join("state.bin");
    ralpc::run(&ralpc::RunOptions {
        steps: 2,
        checkpoint_every: Some(2),
        checkpoint: Some(checkpoint.clone()),
        ..options(dir.path(), &model)
    })
    .expect("two steps and a checkpoint");
    let bytes = std::fs::read(&checkpoint).expect("written");
    let (header, metadata) = SafeTensors::read_metadata(&bytes).expect("a safetensors file");
    let state: serde_json::Value = serde_json::from_str(
        metadata
            .metadata()
            .as_ref()
            .and_then(|m| m.get("ralpc"))
            .expect("ralpc's metadata"),
    )
    .expect("JSON");
    let file = SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let mut names = file.names();
    names.sort_unstable();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = names
        .iter()
        .map(|&n| {
            let t = file.tensor(n).expect("a tensor");
            (n.to_owned(), t.shape().to_vec(), t.data().to_vec())
        })
        .collect();
    // A checkpoint of `tensors`, its hash recomputed over their data.
    let doctored = |tensors: &[(String, Vec<usize>, Vec<u8>)]| {
        let write = |state: &serde_json::Value| {
            let views = tensors.iter().map(|(n, shape, data)| {
                let view = TensorView::new(Dtype::F32, shape.clone(), data).expect("a view");
                (n.as_str(), view)
            });
            let metadata = HashMap::from([("ralpc".to_owned(), state.to_string())]);
            safetensors::serialize(views, Some(metadata)).expect("serialize")
        };
        let mut state = state.clone();
        let draft = write(&state);
        let (n, _) = SafeTensors::read_metadata(&draft).expect("a safetensors file");
        // The documented digest: format, plan (length-prefixed), step, losses, data.
        let mut hasher = blake3::Hasher::new();
        for key in ["format", "plan"] {
            let text = state[key].as_str().expect("a string");
            hasher.update(&(text.len() as u64).to_le_bytes());
            hasher.update(text.as_bytes());
        }
        let step = u32::try_from(state["step"].as_u64().expect("a step")).expect("u32");
        hasher.update(&step.to_le_bytes());
        let losses = state["losses"].as_array().expect("losses");
        hasher.update(&(losses.len() as u64).to_le_bytes());
        for loss in losses {
            hasher.update(&loss.as_f64().expect("a loss").to_bits().to_le_bytes());
        }
        hasher.update(&draft[8 + n..]);
        state["blake3"] = hasher.finalize().to_hex().to_string().into();
        write(&state)
    };
    let mut flipped = bytes.clone();
    flipped[8 + header + 5] ^= 0x10;
    let mut nan = tensors.clone();
    nan[0].2[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    let mut renamed = tensors.clone();
    renamed[0].0 = "no.such.weight".into();
    let missing = tensors[1..].to_vec();
    let mut extra = tensors.clone();
    extra.push((
        "momentum/stray".into(),
        vec![1],
        0f32.to_le_bytes().to_vec(),
    ));
    let cases = [
        ("flipped bit", flipped, "do not match their hash"),
        ("NaN", doctored(&nan), "holds NaN"),
        (
            "renamed",
            doctored(&renamed),
            "it has no weight 'conv0.bias'",
        ),
        ("missing", doctored(&missing), "it has no weight"),
        (
            "extra",
            doctored(&extra),
            "momentum 'stray' is not a weight of the model",
        ),
        (
            "not a checkpoint",
            b"{\"format\": \"ralpc-checkpoint/2\"}\n".to_vec(),
            "not a safetensors file",
        ),
    ];
    for (what, bytes, says) in cases {
        std::fs::write(&checkpoint, bytes).expect("write");
        let started = Instant::now();
        let error = ralpc::run(&ralpc::RunOptions {
            steps: 4,
            resume: Some(checkpoint.clone()),
            ..options(dir.path(), &model)
        })
        .expect_err(what);
        assert!(format!("{error:?}").contains(says), "{what}: {error:?}");
        assert_eq!(error.exit_code(), 1, "{what}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{what}: at once"
        );
    }
}

/// `--fault` naming a rank or an instruction the plan does not have is refused (it would
/// never fire, and a fault test would pass without its fault).
#[test]
fn a_fault_that_cannot_fire_is_refused() {
    let (dir, model) = plan(PIPELINE, 4);
    for (rank, instruction, says) in [
        (9, 0, "the plan has 4 rank(s)"),
        (1, 1 << 20, "rank 1's program has"),
    ] {
        let error = ralpc::run(&ralpc::RunOptions {
            steps: 1,
            fault: Some(Fault {
                rank,
                instruction,
                kind: FaultKind::Panic,
            }),
            ..options(dir.path(), &model)
        })
        .expect_err("refused");
        assert!(error.to_string().contains(says), "{error}");
        assert_eq!(error.exit_code(), 1);
    }
}

/// More ranks than one process runs as threads are refused up front, not by an abort.
#[test]
fn too_many_ranks_for_one_process_are_refused_up_front() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::fixture("train/mlp.onnx");
    let gpus = ralpc::runtime::cpu::exec::MAX_THREAD_RANKS + 1;
    ralpc::compile(&ralpc::Options {
        model: model.clone(),
        gpus: Some(gpus),
        batch: Some(u64::from(gpus)),
        family: ralpc::passes::plan::Family::parse("dp"),
        tolerance: None,
        ..Default::default()
    })
    .expect("plans")
    .write(dir.path())
    .expect("writes");
    let error = ralpc::run(&ralpc::RunOptions {
        steps: 1,
        ..options(dir.path(), &model)
    })
    .expect_err("refused");
    let message = format!("{error}{}", common::train::error_chain(&error));
    assert!(message.contains("runs at most 1024"), "{error:?}");
}

/// Sizes written in a plan are not trusted: a doctored batch of 2^40, two buffers of 2^63
/// bytes (whose sum wrapped to nothing), or every buffer understated to 1 byte (which
/// passed the memory pre-check) are refused before anything is allocated, as a bad plan
/// file (exit 1), naming the rank and the buffer; so is a layout that is not the one the
/// plan's placement gives (a layer's split, an edge's tensor) or none at all.
#[test]
fn doctored_sizes_in_a_plan_are_refused_before_allocating() {
    let (dir, model) = plan(PIPELINE, 4);
    let path = dir.path().join("plan.json");
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("plan")).expect("JSON");
    let mut batch = original.clone();
    batch["batch"] = (1u64 << 40).into();
    let mut wrapping = original.clone();
    wrapping["buffers"][0][0]["bytes"] = (1u64 << 63).into();
    wrapping["buffers"][0][1]["bytes"] = (1u64 << 63).into();
    let mut understated = original.clone();
    for rank in understated["buffers"].as_array_mut().expect("buffers") {
        for buffer in rank.as_array_mut().expect("a rank's buffers") {
            buffer["bytes"] = 1.into();
        }
    }
    let mut one_less = original.clone();
    let last = one_less["buffers"][3].as_array().expect("rank 3").len() - 1;
    let bytes = one_less["buffers"][3][last]["bytes"]
        .as_u64()
        .expect("bytes");
    one_less["buffers"][3][last]["bytes"] = (bytes - 1).into();
    let mut mixed = original.clone();
    mixed["precision"] = "fp16".into();
    // The layout the executor runs from is checked the same way.
    let mut resplit = original.clone();
    resplit["layout"]["layers"][0]["split"]["sample"] = 1.into();
    let mut rewired = original.clone();
    rewired["layout"]["edges"][0]["value"] = "input".into();
    let mut unlaid = original.clone();
    unlaid.as_object_mut().expect("a plan").remove("layout");
    let mut misplaced = original.clone();
    misplaced["sites"][0]["node"] = 3.into();
    misplaced["sites"][1]["nic"] = 4.into();
    for (what, plan, says) in [
        ("a layer's split", resplit, "its layout of layer"),
        ("an edge's tensor", rewired, "its layout's edge 0"),
        ("no layout", unlaid, "no layout of its layers"),
        ("a site beyond the ranks", misplaced, "sites[1]: node"),
        ("batch", batch, "the plan's batch 1099511627776 makes"),
        (
            "wrapping",
            wrapping,
            "9223372036854775808 bytes in the plan",
        ),
        (
            "understated",
            understated,
            "rank 0: its weights buffer of layer",
        ),
        ("one byte less", one_less, "rank 3: its"),
        (
            "another precision",
            mixed,
            "bytes in the plan; the model and the plan's placement give",
        ),
    ] {
        std::fs::write(&path, serde_json::to_string(&plan).expect("JSON")).expect("write");
        let error = ralpc::run(&ralpc::RunOptions {
            steps: 1,
            ..options(dir.path(), &model)
        })
        .expect_err(what);
        assert!(
            error.to_string().contains(says) || format!("{error:?}").contains(says),
            "{what}: {error:?}"
        );
        if what != "batch" {
            assert_eq!(error.exit_code(), 1, "{what}: {error:?}");
        }
    }
    std::fs::write(&path, serde_json::to_string(&original).expect("JSON")).expect("write");
    ralpc::run(&ralpc::RunOptions {
        steps: 1,
        ..options(dir.path(), &model)
    })
    .expect("the plan as written runs");
}

/// A run whose loss stops being finite stops at that step with the reason (exit 4), and
/// the checkpoint of the last good step stays; options that cannot train are refused
/// before any rank starts (exit 1).
#[test]
fn a_diverging_run_stops_and_keeps_the_last_good_checkpoint() {
    let (dir, model) = plan(PIPELINE, 4);
    let checkpoint = dir.path().join("state.bin");
    let diverging = ralpc::RunOptions {
        steps: 6,
        lr: 1e30,
        momentum: 0.0,
        checkpoint_every: Some(1),
        checkpoint: Some(checkpoint.clone()),
        ..options(dir.path(), &model)
    };
    let error = ralpc::run(&diverging).expect_err("diverges");
    let text = format!("{error:?}");
    assert!(text.contains("diverged"), "{text}");
    assert_eq!(error.exit_code(), 4, "{text}");
    // What is on disk is a good checkpoint: it resumes (and diverges again).
    let resumed = ralpc::run(&ralpc::RunOptions {
        resume: Some(checkpoint.clone()),
        checkpoint: None,
        checkpoint_every: None,
        ..diverging.clone()
    })
    .expect_err("diverges again");
    assert!(format!("{resumed:?}").contains("diverged"), "{resumed:?}");
    for (lr, momentum) in [
        (f32::NAN, 0.9),
        (0.01, f32::INFINITY),
        (0.01, 1.0),
        (-1.0, 0.9),
    ] {
        let error = ralpc::run(&ralpc::RunOptions {
            lr,
            momentum,
            ..options(dir.path(), &model)
        })
        .expect_err("refused");
        assert_eq!(error.exit_code(), 1, "{lr} {momentum}: {error}");
    }
}

/// An edited but self-consistent plan is refused before training (exit 1), naming the rank
/// and the work that differs: fewer microbatches (half the batch), no gradient
/// reductions (every all-reduce of 0 bytes), no optimizer step, a message's tag changed on both ends, two instructions
/// swapped. Before, each trained wrongly with exit 0 or was reported as a bug (101).
#[test]
fn edited_programs_are_refused_before_training() {
    let (dir, model) = plan(PIPELINE, 4);
    let path = dir.path().join("plan.json");
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("plan")).expect("JSON");
    let edit = |f: &dyn Fn(&mut Vec<serde_json::Value>)| {
        let mut plan = original.clone();
        for program in plan["programs"].as_array_mut().expect("programs") {
            f(program.as_array_mut().expect("a program"));
        }
        plan
    };
    let mut halved = original.clone();
    halved["microbatches"] = 1.into();
    halved["strategy"]["microbatches"] = 1.into();
    // (Removing instructions leaves buffers live past the program's end, which is refused
    // as before; emptying them keeps the plan self-consistent.)
    let empty = |op: &'static str| {
        edit(&move |p| {
            for i in p.iter_mut().filter(|i| i["op"] == op) {
                i["bytes"] = 0.into();
            }
        })
    };
    let no_reduce = empty("all_reduce");
    let no_step = empty("step");
    let retagged = edit(&|p| {
        for i in p
            .iter_mut()
            .filter(|i| i["op"] == "send" || i["op"] == "recv")
        {
            i["tag"] = (i["tag"].as_u64().expect("a tag") + 1_000_000).into();
        }
    });
    let swapped = edit(&|p| {
        if let Some(k) =
            (1..p.len()).find(|&k| p[k - 1]["op"] == "forward" && p[k]["op"] == "backward")
        {
            p.swap(k - 1, k);
        }
    });
    for (what, plan, says) in [
        ("half the batch", halved, "microbatch"),
        ("no all-reduce", no_reduce, "all_reduce instructions"),
        ("no step", no_step, "step instructions"),
        ("retagged", retagged, "\"tag\":100000"),
        ("swapped", swapped, "instruction"),
    ] {
        assert_ne!(plan, original, "{what}: the edit changed the plan");
        std::fs::write(&path, serde_json::to_string(&plan).expect("JSON")).expect("write");
        let error = ralpc::run(&ralpc::RunOptions {
            steps: 1,
            ..options(dir.path(), &model)
        })
        .expect_err(what);
        let text = format!("{error}: {error:?}");
        assert!(text.contains(says), "{what}: {text}");
        assert_eq!(error.exit_code(), 1, "{what}: {text}");
    }
}

/// A tiny model that plans (its weights are a few kB) but whose constants expand to a
/// [2^20, 2^20] tensor (4 TiB) on the way to its output: `ralpc run` refuses it before
/// allocating, naming the value (exit 1); before, the allocation aborted the process.
#[test]
fn a_huge_tensor_built_from_constants_is_refused_before_allocating() {
    use onnx_protobuf::{Message, ModelProto, NodeProto, TensorProto};
    let bytes = std::fs::read(common::fixture("train/mlp.onnx")).expect("fixture");
    let mut model = ModelProto::parse_from_bytes(&bytes).expect("decodes");
    let graph = model.graph.mut_or_insert_default();
    let tensor = |name: &str, data_type: i32, dims: Vec<i64>, raw: Vec<u8>| {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = data_type;
        t.dims = dims;
        t.raw_data = raw;
        t
    };
    let side = 1i64 << 20;
    let shape: Vec<u8> = [side, side].iter().flat_map(|d| d.to_le_bytes()).collect();
    graph
        .initializer
        .push(tensor("bomb_shape", 7, vec![2], shape));
    graph
        .initializer
        .push(tensor("one", 1, vec![1], 1f32.to_le_bytes().to_vec()));
    let node = |op: &str, inputs: &[&str], output: &str| {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.name = output.into();
        n.input = inputs.iter().map(|s| (*s).to_owned()).collect();
        n.output = vec![output.into()];
        n
    };
    graph
        .node
        .push(node("Expand", &["one", "bomb_shape"], "bomb"));
    graph.node.push(node("ReduceSum", &["bomb"], "bomb_sum"));
    graph.node.push(node("Add", &["fc2", "bomb_sum"], "scored"));
    graph.output[0].name = "scored".into();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bomb.onnx");
    std::fs::write(&path, model.write_to_bytes().expect("encodes")).expect("writes");
    let ralpc = || {
        let mut cmd = assert_cmd::Command::cargo_bin("ralpc").expect("binary");
        cmd.current_dir(dir.path());
        cmd
    };
    ralpc()
        .args([
            "plan",
            "bomb.onnx",
            "--gpus",
            "1",
            "--batch",
            "4",
            "--quiet",
            "-o",
            "out",
        ])
        .assert()
        .success();
    let out = ralpc().args(["run", "out"]).assert().code(1);
    let stderr = String::from_utf8_lossy(&out.get_output().stderr);
    assert!(
        stderr.contains("value 'bomb' [1048576, 1048576] need 4096.00 GiB"),
        "{stderr}"
    );
}
