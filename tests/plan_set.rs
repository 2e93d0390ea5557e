//! `ralpc plan A B … --gpus N` and `--copies K` (issue 64 item 5): several models placed
//! on one cluster at once, against training them one after another and each on an even
//! share of the GPUs. DeepPool's measured A100 profiles (`fixtures/anchors/deeppool`, MIT).

mod common;

use std::path::PathBuf;

use ralpc::{PlanOptions, SetReport};

fn profile(name: &str) -> PathBuf {
    common::fixture(&format!("anchors/deeppool/A100_{name}.prof"))
}

fn options(gpus: u32) -> PlanOptions {
    PlanOptions {
        gpus: Some(gpus),
        batch: Some(32),
        tolerance: Some(1.0),
        ..PlanOptions::default()
    }
}

/// The placement holds together: every model in one group, groups of consecutive GPUs
/// within the cluster, a group's time its models' iterations in turn, the set's its
/// slowest group's; and no placement it considers beats it.
fn check(r: &SetReport, models: usize) {
    assert_eq!(r.models.len(), models);
    let mut next = 0;
    for (i, g) in r.groups.iter().enumerate() {
        assert_eq!(g.first_gpu, next, "groups are consecutive");
        // On 8-GPU nodes: a power of two within a node or whole nodes, each starting on a
        // boundary of its size, where its plan from GPU 0 was priced.
        let unit = g.gpus.min(8);
        assert!(g.gpus <= 8 && g.gpus.is_power_of_two() || g.gpus % 8 == 0 || g.gpus == r.gpus);
        assert_eq!(g.first_gpu % unit, 0, "{r:?}");
        next += g.gpus;
        let turns: f64 = g
            .models
            .iter()
            .map(|&m| r.models[m].iteration_time_us)
            .sum();
        assert!((turns - g.time_us).abs() < 1e-6 * turns);
        for &m in &g.models {
            assert_eq!((r.models[m].group, r.models[m].gpus), (i, g.gpus));
        }
    }
    assert!(next <= r.gpus);
    let mut seen: Vec<usize> = r.groups.iter().flat_map(|g| g.models.clone()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..models).collect::<Vec<_>>());
    let slowest = r.groups.iter().map(|g| g.time_us).fold(0.0, f64::max);
    assert_eq!(slowest, r.makespan_us);
    // One after another on all the GPUs, and each on an even share, are placements too.
    for baseline in [r.sequential_us, r.even_split_us].into_iter().flatten() {
        assert!(r.makespan_us <= baseline * (1.0 + 1e-12), "{r:?}");
    }
}

#[test]
fn three_convnets_on_a_dgx_a100() {
    let models = [profile("vgg"), profile("wrn"), profile("inception")];
    let r = ralpc::plan_set(&options(8), &models, 1).expect("placed");
    check(&r, 3);
    let sequential = r.sequential_us.expect("each plans on all 8");
    let even = r.even_split_us.expect("each plans on 2");
    println!(
        "VGG16 + WRN-101-2 + Inception-v3, batch 32 each, 8 A100s: set {:.3} ms, one after \
         another {:.3} ms, 2 GPUs each {:.3} ms",
        r.makespan_us / 1e3,
        sequential / 1e3,
        even / 1e3
    );
    for g in &r.groups {
        println!("  GPUs {}+{}: {:?}", g.first_gpu, g.gpus, g.models);
    }
    // Strong scaling at batch 32 is not free: the set beats taking turns on all 8.
    assert!(r.makespan_us < sequential);
}

#[test]
fn groups_start_where_they_were_priced_on_two_nodes() {
    let models = [profile("vgg"), profile("wrn"), profile("inception")];
    let r = ralpc::plan_set(&options(16), &models, 1).expect("placed");
    check(&r, 3);
    assert!(r
        .counts_priced
        .iter()
        .all(|&g| [1, 2, 4, 8, 16].contains(&g)));
}

#[test]
fn copies_of_one_model_for_a_sweep() {
    let out = common::ralpc()
        .args(["plan"])
        .arg(profile("vgg"))
        .args(["--gpus", "8", "--batch", "32", "--copies", "4", "--json"])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["models"].as_array().map(Vec::len), Some(4));
    // Four identical models: they finish no later than each on 2 GPUs.
    let makespan = r["makespan_us"].as_f64().expect("a makespan");
    let even = r["even_split_us"].as_f64().expect("each plans on 2 GPUs");
    assert!(makespan <= even);

    let text = common::ralpc()
        .args(["plan"])
        .arg(profile("vgg"))
        .arg(profile("wrn"))
        .args(["--gpus", "4", "--batch", "16"])
        .env("NO_COLOR", "1")
        .output()
        .expect("runs");
    let said = String::from_utf8_lossy(&text.stdout);
    assert!(text.status.success());
    assert!(
        said.contains("2 models on 4 GPUs") && said.contains("one after another"),
        "{said}"
    );
}

#[test]
fn a_set_is_refused_what_it_cannot_do() {
    let vgg = profile("vgg");
    let run = |extra: &[&str]| {
        common::ralpc()
            .args(["plan"])
            .arg(&vgg)
            .arg(&vgg)
            .args(["--gpus", "4"])
            .args(extra)
            .output()
            .expect("runs")
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let out = run(&["-o", dir.path().join("out").to_str().expect("utf-8")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("-o plans one model"), "{stderr}");
    assert!(!dir.path().join("out").exists());
    let out = run(&["--copies", "6"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("at most 10"), "{stderr}");
    let out = run(&["--copies", "11"]);
    assert_eq!(out.status.code(), Some(2));
    // Shapes and profiles describe one model.
    let out = common::ralpc()
        .args(["plan"])
        .arg(&vgg)
        .arg(profile("wrn"))
        .args(["--gpus", "4", "--profile"])
        .arg(&vgg)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--profile describes one model"), "{stderr}");
    // A model that plans on no count says why.
    let out = run(&["--memory-limit", "1GiB"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("plans on none") && stderr.contains("does not fit"),
        "{stderr}"
    );
    // A model that is not there, named.
    let out = common::ralpc()
        .args(["plan"])
        .arg(&vgg)
        .args(["missing.onnx", "--gpus", "4"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("missing.onnx"), "{stderr}");
}
