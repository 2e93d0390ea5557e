//! `report.html` as a reader sees it: rendered by headless Chromium (Debian's `chromium`,
//! which `.ci/run` installs), the screenshot is not blank and the page logs no errors.

mod common;

use std::path::Path;
use std::process::Command;

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
}

/// Distinct colours in a PNG (RGB or RGBA, 8-bit), sampled every 7th pixel.
fn colours(path: &Path) -> usize {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let mut seen = std::collections::BTreeSet::new();
    for px in buf[..info.buffer_size()].chunks(channels).step_by(7) {
        seen.insert(px[..3.min(px.len())].to_vec());
    }
    seen.len()
}

/// `ralpc ARGS -o DIR/out` run in the tests' working directory: its report's path and text.
fn planned_report(dir: &Path, args: &[&str]) -> (std::path::PathBuf, String) {
    let out = dir.join("out");
    common::ralpc()
        .args(args)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    let report = out.join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    (report, html)
}

#[test]
fn the_report_renders_in_headless_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let (report, html) = planned_report(
        dir.path(),
        &["plan", "fixtures/onnx/vgg16/model.onnx", "--gpus", "8"],
    );
    // Self-contained: nothing fetched from anywhere.
    for needle in ["http://", "https://", "<script", "<link"] {
        let outside_svg = html.replace("http://www.w3.org", "");
        assert!(
            !outside_svg.contains(needle),
            "report.html contains {needle}"
        );
    }
    for needle in [
        "Summary",
        "predicted iteration",
        "Families compared",
        "Where the time goes, per GPU",
        "communication not hidden behind compute",
        "Where the time goes, per layer",
        "Memory per GPU at its peak",
        "capacity 80.00 GiB",
        "resharding collective",
        "Placement",
        "<svg",
    ] {
        assert!(html.contains(needle), "{needle} missing");
    }
    // Tooltips name the GPU, the pass, the layer and the microbatch.
    assert!(html.contains("<title>GPU 0: F /features/features.0/Conv mb0:"));
    assert!(html.contains("<title>features.0: backward: "));
    renders(&report, dir.path());
}

/// A report is for a person whatever the plan's size: a 2,000-layer chain on 8 GPUs (4,000
/// passes a GPU, drawn one by one a 2 MB page) is one placement row, and its timeline is
/// drawn at the chart's resolution.
#[test]
fn a_deep_models_report_stays_the_size_of_a_small_ones() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = "forward_compute_time=0.010, backward_compute_time=0.020, \
                   activation_size=602112.0, parameter_size=0.000";
    let mut graph = String::from(
        "node1 -- Input0 -- forward_compute_time=0.000, \
        backward_compute_time=0.000, activation_size=602112.0, parameter_size=0.000\n",
    );
    for i in 2..=2000 {
        graph += &format!("node{i} -- ReLU(inplace) -- {metrics}\n");
    }
    for i in 1..2000 {
        graph += &format!("\tnode{i} -- node{}\n", i + 1);
    }
    let model = dir.path().join("graph.txt");
    std::fs::write(&model, graph).unwrap();
    let model = model.to_str().unwrap();
    let (report, html) = planned_report(
        dir.path(),
        &[
            model,
            "--gpus",
            "8",
            "--batch",
            "32",
            "--strategy",
            "dp",
            "-q",
        ],
    );
    assert!(html.len() < 200_000, "report.html is {} bytes", html.len());
    assert!(
        html.contains("node2 .. node2000 (1999 layers)"),
        "one row of placement"
    );
    assert!(html.contains("short slices, mostly"), "the timeline pooled");
    renders(&report, dir.path());
}

/// Renders `report` in headless Chromium: a screenshot that is not blank, no console
/// errors. Without Chromium it only notes so, except under CI, which installs it.
fn renders(report: &Path, scratch: &Path) {
    let Some(browser) = chromium() else {
        common::skip_without(
            "Chromium",
            "Debian: apt install chromium",
            "rendering report.html",
        );
        return;
    };
    let shot = scratch.join("shot.png");
    let profile = scratch.join("profile");
    let run = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", report.display()))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(shot.exists(), "no screenshot; chromium said:\n{log}");
    let console: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .collect();
    assert!(
        console.is_empty(),
        "console output:\n{}",
        console.join("\n")
    );
    assert!(colours(&shot) > 4, "the screenshot is blank");
}

#[test]
fn the_sweep_report_draws_the_scaling_curves() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    assert_cmd::Command::cargo_bin("ralpc")
        .unwrap()
        .current_dir(common::workdir())
        .args([
            "sweep",
            "fixtures/onnx/vgg16/model.onnx",
            "--gpus",
            "1,2,4,8,16",
            "--gpu-types",
            "a100,h100",
            "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    let report = out.join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    assert_eq!(
        html.matches("<polyline").count(),
        4,
        "one curve and one ideal line per GPU type"
    );
    assert_eq!(html.matches("ideal scaling</title>").count(), 2);
    assert_eq!(
        html.matches("<circle").count(),
        10,
        "a point per planned point"
    );
    for axis in ["GPUs (log scale)", "samples/s"] {
        assert!(html.contains(axis), "{axis} axis label missing");
    }
    assert!(!html.replace("http://www.w3.org", "").contains("http"));
    renders(&report, dir.path());
}
