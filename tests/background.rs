//! `--background` (issue 64 item 1): a one-GPU job trained in the plan's idle and spare GPU
//! time, as DeepPool multiplexes GPUs, against static partitions of the GPUs between the
//! two jobs. DeepPool's measured VGG16 profile (`fixtures/anchors/deeppool`, MIT) at its
//! published setting: global batch 32 on 8 A100s.

mod common;

use ralpc::passes::cluster::Link;
use ralpc::{BackgroundOptions, BackgroundRow, ClusterOptions, PlanOptions};

fn vgg() -> std::path::PathBuf {
    common::fixture("anchors/deeppool/A100_vgg.prof")
}

/// DeepPool's planner's network: 2.66e5 bytes/µs, 240 µs a transfer (its
/// `parallelizationPlanner.py`).
const DEEPPOOL_LINK: Link = Link {
    latency_us: 240.0,
    bandwidth: 2.66e11,
};

fn options(flat: Option<Link>, background: BackgroundOptions) -> PlanOptions {
    PlanOptions {
        model: vgg(),
        gpus: Some(8),
        batch: Some(32),
        cluster: ClusterOptions {
            flat,
            ..ClusterOptions::default()
        },
        executable: true,
        tolerance: Some(1.0),
        background: Some(background),
        ..PlanOptions::default()
    }
}

fn vgg_background(interference: f64) -> BackgroundOptions {
    BackgroundOptions {
        model: vgg(),
        batch: None,
        interference,
    }
}

fn planned(options: &PlanOptions) -> (ralpc::PlanOutput, BackgroundRow) {
    let out = ralpc::plan(options).expect("plans");
    let row = out.report.background.clone().expect("a background row");
    (out, row)
}

/// DeepPool's claim holds on a DGX A100's own network. On DeepPool's planner's flat one
/// (240 µs a transfer) the gradient all-reduces take most of the plan's spare time, which
/// ralpc does not give the background (a collective's kernels hold SMs too), and the GPUs
/// split 1 + 7 train more: printed, not asserted.
#[test]
fn deeppool_vgg16_with_a_background_job_beats_every_static_partition() {
    for (network, flat) in [("dgx-a100's", None), ("DeepPool's", Some(DEEPPOOL_LINK))] {
        let (out, row) = planned(&options(flat, vgg_background(0.0)));
        println!(
            "VGG16 batch 32 on 8 A100s, {network} network: plan {:.1} + background {:.1} = \
             {:.1} samples/s",
            row.foreground_samples_per_second,
            row.filled.samples_per_second,
            row.cluster_samples_per_second
        );
        for p in &row.partitions {
            println!(
                "  {} + {}: {:.1} samples/s",
                p.foreground_gpus, p.background_gpus, p.cluster_samples_per_second
            );
        }
        // DeepPool's partitions: 1 + 7, 2 + 6, 4 + 4 and 8 for the foreground alone.
        let splits: Vec<(u32, u32)> = row
            .partitions
            .iter()
            .map(|p| (p.foreground_gpus, p.background_gpus))
            .collect();
        assert_eq!(splits, [(1, 7), (2, 6), (4, 4), (8, 0)]);
        for p in row.partitions.iter().filter(|_| flat.is_none()) {
            assert!(
                row.cluster_samples_per_second > p.cluster_samples_per_second,
                "{network}: {} + {} gives {} samples/s, the background beside the plan {}",
                p.foreground_gpus,
                p.background_gpus,
                p.cluster_samples_per_second,
                row.cluster_samples_per_second
            );
        }
        // The 8-GPU partition is the plan alone, at the simulated iteration the background
        // was packed into.
        let alone = &row.partitions[3];
        assert_eq!(alone.background_samples_per_second, 0.0);
        assert_eq!(
            alone.foreground_iteration_us,
            row.filled.foreground_iteration_us
        );
        assert_eq!(
            out.executable
                .as_ref()
                .map(|e| e.simulation.iteration_time_us),
            Some(alone.foreground_iteration_us)
        );
        // The figures add up: each GPU at most one GPU's worth of the background.
        let sum: f64 = row.filled.gpus.iter().map(|g| g.samples_per_second).sum();
        assert!((sum - row.filled.samples_per_second).abs() < 1e-6);
        assert_eq!(row.filled.gpus.len(), 8);
        for g in &row.filled.gpus {
            assert!(g.excluded.is_none());
            assert!(g.gpu_fraction > 0.0 && g.gpu_fraction <= 1.0, "{g:?}");
        }
        let fractions: f64 = row.filled.gpus.iter().map(|g| g.gpu_fraction).sum();
        assert!((row.filled.gpu_equivalents - fractions).abs() < 1e-9);
        assert_eq!(row.batch, ralpc::DEFAULT_BACKGROUND_BATCH);
        // The same model at batch 16 on one GPU: DeepPool's profile sums its layers.
        assert!(row.alone_samples_per_second > 0.0);
        assert!(out
            .report
            .warnings
            .iter()
            .any(|w| w.contains("--interference")));
    }
}

#[test]
fn interference_slows_the_plan_not_the_background() {
    let (_, free) = planned(&options(None, vgg_background(0.0)));
    let (out, slowed) = planned(&options(None, vgg_background(0.1)));
    let f = &slowed.filled;
    assert!((f.foreground_slowdown - 0.1).abs() < 1e-12);
    assert!((f.foreground_iteration_us / free.filled.foreground_iteration_us - 1.1).abs() < 1e-9);
    assert!(
        (slowed.foreground_samples_per_second * 1.1 - free.foreground_samples_per_second).abs()
            < 1e-6
    );
    // The plan's idle and spare time stretch with it: the background keeps its share.
    assert!((f.samples_per_second - free.filled.samples_per_second).abs() < 1e-6);
    assert!(!out
        .report
        .warnings
        .iter()
        .any(|w| w.contains("not priced (--interference 0)")));
}

#[test]
fn a_one_gpu_plan_leaves_no_room() {
    let mut one = options(None, vgg_background(0.0));
    one.gpus = Some(1);
    let (_, row) = planned(&one);
    let g = &row.filled.gpus[0];
    // Its passes run at one GPU's pace, back to back.
    assert!(g.spare_us.abs() < 1e-6, "{g:?}");
    assert!(g.gpu_fraction < 1e-3, "{g:?}");
    assert_eq!(row.partitions.len(), 1);
}

#[test]
fn gpus_without_memory_for_both_jobs_run_no_background() {
    // The plan holds 1.7 GiB a GPU, the background 4.2 GiB at batch 16, 1 GiB of each the
    // kernels' workspace they share: both fit 4.5 GiB alone, not together.
    let mut tight = options(None, vgg_background(0.1));
    tight.memory_limit = Some(9 << 29);
    let (_, row) = planned(&tight);
    for g in &row.filled.gpus {
        assert!(
            matches!(
                g.excluded,
                Some(ralpc::codegen::background::Excluded::Memory { capacity_bytes, .. })
                    if capacity_bytes == 9 << 29
            ),
            "{g:?}"
        );
        assert_eq!(g.samples_per_second, 0.0);
    }
    // Nothing beside it: the plan is not slowed.
    assert_eq!(row.filled.foreground_slowdown, 0.0);
}

#[test]
fn a_background_that_fits_no_gpu_is_refused_by_name() {
    let mut tight = options(None, vgg_background(0.0));
    tight.memory_limit = Some(2 << 30);
    let e = ralpc::plan(&tight).expect_err("refused");
    assert_eq!(e.exit_code(), 1);
    let text = common::train::error_chain(&e);
    assert!(
        text.contains("--background") && text.contains("A100_vgg.prof"),
        "{text}"
    );
}

#[test]
fn the_command_line_prints_and_reports_the_background() {
    let out = common::ralpc()
        .args(["plan"])
        .arg(vgg())
        .args(["--gpus", "8", "--batch", "32", "--json", "--background"])
        .arg(vgg())
        .args(["--bg-batch", "8", "--interference", "5%"])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let b = &json["background"];
    assert_eq!(b["batch"], 8);
    assert_eq!(b["interference"], 0.05);
    assert_eq!(b["gpus"].as_array().map(Vec::len), Some(8));
    assert_eq!(b["partitions"].as_array().map(Vec::len), Some(4));
    assert!(b["cluster_samples_per_second"].as_f64().unwrap_or(0.0) > 0.0);

    let dir = tempfile::tempdir().expect("temp dir");
    let out = common::ralpc()
        .args(["plan"])
        .arg(vgg())
        .args(["--gpus", "8", "--batch", "32", "--background"])
        .arg(vgg())
        .arg("-o")
        .arg(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("background: ") && text.contains("1 plan + 7 background"),
        "{text}"
    );
}

#[test]
fn background_options_are_checked() {
    let cases: [(&[&str], &str); 3] = [
        (&["--bg-batch", "8"], "--background"),
        (
            &["--background", "x.prof", "--interference", "lots"],
            "slowdown factor",
        ),
        (&["--background", "x.prof", "--bg-batch", "0"], "at least 1"),
    ];
    for (args, says) in cases {
        let out = common::ralpc()
            .args(["plan"])
            .arg(vgg())
            .args(["--gpus", "8"])
            .args(args)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    // A background model that is not there: exit 1, naming it, nothing written.
    let dir = tempfile::tempdir().expect("temp dir");
    let out = common::ralpc()
        .args(["plan"])
        .arg(vgg())
        .args(["--gpus", "8", "--background", "missing.onnx", "-o"])
        .arg(dir.path().join("out"))
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("missing.onnx"), "{stderr}");
    assert!(!dir.path().join("out").exists());
}

/// The host backend runs each GPU's copy of the background as a job of its own beside the
/// plan's ranks: the plan's losses are those it has alone, and each copy's are those of
/// its model trained alone for its steps.
#[test]
fn the_host_backend_trains_the_background_beside_the_plan() {
    let mlp = common::fixture("train/mlp.onnx");
    let base = PlanOptions {
        model: mlp.clone(),
        gpus: Some(2),
        batch: Some(8),
        ..PlanOptions::default()
    };
    let with = PlanOptions {
        background: Some(BackgroundOptions {
            model: mlp.clone(),
            batch: Some(4),
            interference: 0.0,
        }),
        ..base.clone()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |options: &PlanOptions, name: &str| {
        let out = dir.path().join(name);
        ralpc::compile(options)
            .expect("plans")
            .write(&out)
            .expect("writes");
        ralpc::run(&ralpc::RunOptions {
            plan: out,
            steps: 3,
            ..ralpc::RunOptions::default()
        })
        .expect("runs")
    };
    let alone = run(&base, "alone");
    let beside = run(&with, "beside");
    assert_eq!(beside.report.losses, alone.report.losses);
    assert!(alone.background.is_empty() && alone.background_not_run.is_none());
    assert!(
        !beside.background.is_empty(),
        "{:?}",
        beside.background_not_run
    );
    let plan = ralpc::read_plan(&dir.path().join("beside"))
        .expect("reads")
        .1;
    let recorded = plan.background.expect("the plan records its background");
    for copy in &beside.background {
        let per_step = recorded.iterations_per_step[copy.rank as usize];
        assert_eq!(copy.steps, (per_step * 3.0).floor() as u32);
        let reference = common::train::reference(&mlp, 4, copy.steps);
        assert_eq!(copy.losses, reference.losses, "GPU {}", copy.rank);
    }
}

/// A PipeDream graph keeps the batch it was measured at, as the background too; a
/// cluster of two GPU types is refused (the background's speed and memory would depend on
/// the type); a strategy file fixes the plan on every GPU count, so the partitions it
/// cannot plan are said to be left out.
#[test]
fn graphs_mixed_clusters_and_strategy_files() {
    let graph = common::fixture("anchors/pipedream/vgg16/graph.txt");
    let on = |model: &std::path::Path, extra: &[&str]| {
        common::ralpc()
            .args(["plan"])
            .arg(model)
            .args(["--json", "--background"])
            .arg(model)
            .args(extra)
            .output()
            .expect("runs")
    };
    let out = on(&graph, &["--gpus", "8"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["background"]["batch"], json["batch"]);

    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = dir.path().join("mixed.toml");
    std::fs::write(
        &cluster,
        "[[group]]\npreset = \"dgx-a100\"\n[[group]]\npreset = \"dgx-h100\"\n",
    )
    .expect("writes");
    let out = on(
        &vgg(),
        &[
            "--cluster",
            cluster.to_str().expect("utf-8"),
            "--gpus",
            "16",
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("one type"), "{said}");

    let strategy = dir.path().join("plan.strategy.json");
    let out = common::ralpc()
        .args(["plan"])
        .arg(vgg())
        .args(["--gpus", "8", "--batch", "32", "--json", "--write-strategy"])
        .arg(&strategy)
        .output()
        .expect("runs");
    assert!(out.status.success());
    let out = on(
        &vgg(),
        &[
            "--gpus",
            "8",
            "--batch",
            "32",
            "--strategy-file",
            strategy.to_str().expect("utf-8"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let left_out = json["background"]["partitions_not_planned"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(left_out, 3, "{}", json["background"]);
    assert!(json["warnings"].as_array().is_some_and(|w| w
        .iter()
        .any(|w| w.as_str().is_some_and(|w| w.contains("not compared")))));
}
