//! `ralpc sweep`: the throughput matrix as a table, CSV and JSON.

mod common;

use common::ralpc;

use serde_json::Value;

fn stdout(args: &[&str]) -> String {
    let out = ralpc().args(args).assert().success();
    String::from_utf8_lossy(&out.get_output().stdout).into_owned()
}

const VGG16: &str = "fixtures/onnx/vgg16/model.onnx";

#[test]
fn every_point_of_the_matrix_is_planned() {
    let args = [
        "sweep",
        VGG16,
        "--gpus",
        "1,2,8,16",
        "--gpu-types",
        "a100,v100",
        "--json",
    ];
    let rows: Value = serde_json::from_str(&stdout(&args)).unwrap();
    let rows = rows["points"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "2 types × 4 counts");
    for r in rows {
        assert!(r["error"].is_null(), "{r}");
        let speedup = r["speedup"].as_f64().unwrap();
        let used = r["gpus_used"].as_f64().unwrap();
        assert!(used >= 1.0 && used <= r["gpus"].as_f64().unwrap(), "{r}");
        assert!(speedup > 0.0 && speedup <= used * 1.0001, "{r}");
        // Efficiency is per GPU the plan uses, not per GPU asked for.
        assert!((r["efficiency"].as_f64().unwrap() - speedup / used).abs() < 1e-9);
        // One GPU is the baseline: exactly 1×, not its compute without the optimizer.
        if r["gpus"] == 1 {
            assert!((speedup - 1.0).abs() < 1e-9, "{r}");
        }
    }
    // More GPUs of one type never plan slower (auto keeps data parallelism's share).
    for t in ["a100", "v100"] {
        let rates: Vec<f64> = rows
            .iter()
            .filter(|r| r["gpu_type"] == t)
            .map(|r| r["samples_per_second"].as_f64().unwrap())
            .collect();
        assert!(rates.windows(2).all(|w| w[1] >= w[0]), "{t}: {rates:?}");
    }
    // The same matrix, byte for byte, on every run.
    assert_eq!(stdout(&args), stdout(&args));
}

#[test]
fn csv_and_the_table_agree_and_infeasible_points_say_why() {
    let csv = stdout(&[
        "sweep",
        VGG16,
        "--gpus",
        "1,4",
        "--csv",
        "--memory-limit",
        "2560MiB",
    ]);
    let mut lines = csv.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("gpu_type,cluster,gpus,gpus_used,strategy,"));
    let one = lines.next().unwrap();
    assert!(one.starts_with("a100,") && one.contains("memory"), "{one}");
    let four = lines.next().unwrap();
    assert!(four.ends_with(",\"\""), "{four}");
    let table = stdout(&["sweep", VGG16, "--gpus", "1,4", "--memory-limit", "2560MiB"]);
    assert!(table.contains("no plan:"), "{table}");
    assert!(table.contains("samples/s"), "{table}");
}

/// A `--memory-limit` between two types' memories applies to the larger and leaves the
/// smaller its own: every row plans (`ralpc plan` refuses a limit above its GPUs').
#[test]
fn a_memory_limit_above_a_smaller_types_memory_is_that_memory() {
    let args = [
        "sweep",
        "fixtures/train/cnn.onnx",
        "--gpus",
        "1",
        "--gpu-types",
        "a100,v100",
        "--memory-limit",
        "40GiB",
        "--json",
    ];
    let rows: Value = serde_json::from_str(&stdout(&args)).unwrap();
    let rows = rows["points"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert!(r["error"].is_null(), "{r}");
    }
}

/// `--gavel FILE` writes Gavel's throughput file (stanford-futuredata/gavel @ c4fa4009,
/// `scheduler/utils.py`'s `read_all_throughputs_json_v2`, whose keys this test parses as
/// its `parse_job_type_tuple` does): per GPU type, `('MODEL (batch size B)', N)` — B
/// samples per GPU — with its N workers' steps per second alone; a second model's sweep
/// adds its rows, and sweeping again leaves the file byte for byte.
#[test]
fn the_sweep_is_written_as_gavels_throughput_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("throughputs.json");
    let sweep = |model: &str, more: &[&str]| {
        let mut args = vec!["sweep", model, "--gpus", "1,4", "--gpu-types", "a100,v100"];
        args.extend_from_slice(more);
        ralpc()
            .args(&args)
            .arg("--gavel")
            .arg(&file)
            .assert()
            .success();
        std::fs::read_to_string(&file).unwrap()
    };
    let first = sweep(VGG16, &["--per-gpu-batch", "8"]);
    let text = sweep(
        "fixtures/onnx/mobilenet_v2/model.onnx",
        &["--per-gpu-batch", "16"],
    );
    let t: Value = serde_json::from_str(&text).unwrap();
    let workers: Vec<&String> = t.as_object().unwrap().keys().collect();
    assert_eq!(workers, ["a100", "v100"]);
    let mut jobs = Vec::new();
    for (worker, job_types) in t.as_object().unwrap() {
        for (key, alone) in job_types.as_object().unwrap() {
            // `('name', n)`, as Python prints a tuple.
            let inner = key
                .strip_prefix("('")
                .and_then(|k| k.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{key}"));
            let (name, scale) = inner.rsplit_once("', ").unwrap();
            let scale: u32 = scale.parse().unwrap();
            let steps = alone["null"].as_f64().unwrap();
            assert!(steps > 0.0, "{worker} {key}");
            jobs.push((worker.clone(), name.to_owned(), scale, steps));
        }
    }
    assert_eq!(jobs.len(), 8, "{jobs:?}");
    for name in ["vgg16 (batch size 8)", "mobilenet_v2 (batch size 16)"] {
        let of = |worker: &str, n: u32| {
            jobs.iter()
                .find(|j| j.0 == worker && j.1 == name && j.2 == n)
                .map(|j| j.3)
                .unwrap()
        };
        // Four GPUs of a type run more steps than one; an A100 more than a V100.
        assert!(of("a100", 4) > of("a100", 1) && of("a100", 1) > of("v100", 1));
    }
    // The sweep's own figures: N workers' steps per second = N / iteration, each point
    // training 8 samples per GPU.
    let rows: Value = serde_json::from_str(&stdout(&[
        "sweep",
        VGG16,
        "--gpus",
        "1,4",
        "--gpu-types",
        "a100",
        "--per-gpu-batch",
        "8",
        "--tolerance",
        "inf",
        "--json",
    ]))
    .unwrap();
    for (i, n) in [(0, 1u32), (1, 4)] {
        let point = &rows["points"][i];
        assert_eq!(point["batch"], 8 * n);
        let us = point["iteration_time_us"].as_f64().unwrap();
        let key = format!("('vgg16 (batch size 8)', {n})");
        let steps = t["a100"][&key]["null"].as_f64().unwrap();
        assert!(
            (steps - f64::from(n) * 1e6 / us).abs() < 1e-9,
            "{key}: {steps}"
        );
    }
    // Again: nothing changes; a file that is not Gavel's is refused, left as it was.
    assert_eq!(
        sweep(
            "fixtures/onnx/mobilenet_v2/model.onnx",
            &["--per-gpu-batch", "16"]
        ),
        text
    );
    assert_ne!(first, text);
    std::fs::write(&file, "[1, 2]").unwrap();
    ralpc()
        .args([
            "sweep",
            VGG16,
            "--gpus",
            "1",
            "--per-gpu-batch",
            "8",
            "--gavel",
        ])
        .arg(&file)
        .assert()
        .code(1);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "[1, 2]");
    // A Gavel job's batch is per GPU.
    ralpc()
        .args(["sweep", VGG16, "--gpus", "1", "--batch", "8", "--gavel"])
        .arg(&file)
        .assert()
        .code(2);
}
