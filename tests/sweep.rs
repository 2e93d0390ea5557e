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
