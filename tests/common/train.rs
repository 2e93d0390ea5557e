//! Training runs compared with single-device training.

use std::path::Path;

use ralpc::runtime::cpu::train::TrainReport;

/// `a`'s distance from `b` in the L2 norm, relative to `b`'s.
pub fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (diff / norm.max(1e-30)).sqrt()
}

/// The L2 norm.
fn norm(a: &[f32]) -> f64 {
    a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt()
}

/// Every step's loss, the first output, every first-step weight gradient and every final
/// weight of `got` within 1e-5 (relative) of `want`; a failure lists every tensor off.
///
/// A tensor is also within when its distance is under 1e-6 of the largest tensor of its
/// kind: a gradient that cancels to almost nothing (a convolution's bias that a batch
/// normalization follows: 1e-3 of the model's largest in DenseNet) differs by more than
/// 1e-5 of itself when float sums run in another order.
pub fn assert_same(what: &str, got: &TrainReport, want: &TrainReport) {
    assert_eq!(got.losses.len(), want.losses.len(), "{what}: steps");
    let mut off = Vec::new();
    for (s, (a, b)) in got.losses.iter().zip(&want.losses).enumerate() {
        if (a - b).abs() > 1e-5 * b.abs() {
            off.push(format!("loss of step {s}: {a} vs {b}"));
        }
    }
    let e = relative_error(&got.first_output, &want.first_output);
    if e > 1e-5 {
        off.push(format!("first output off by {e:.2e}"));
    }
    let tensors = [
        ("gradient of", &got.first_gradients, &want.first_gradients),
        ("weight after the steps", &got.weights, &want.weights),
    ];
    for (kind, got, want) in tensors {
        let largest = want.values().map(|t| norm(t)).fold(0.0, f64::max);
        for (name, expected) in want {
            match got.get(name) {
                // A constant no gradient reaches (a mask) has none, or zeros.
                None if expected.iter().all(|&x| x == 0.0) => {}
                None => off.push(format!("no {kind} {name}")),
                Some(t) => {
                    let e = relative_error(t, expected);
                    if e > 1e-5 && e * norm(expected) > 1e-6 * largest {
                        off.push(format!("{kind} {name} off by {e:.2e}"));
                    }
                }
            }
        }
    }
    assert!(off.is_empty(), "{what}:\n  {}", off.join("\n  "));
}

/// Plans with `options`, writes the plan, and runs `steps` of it on the CPU backend.
pub fn plan_and_run(options: &ralpc::Options, steps: u32) -> TrainReport {
    let dir = tempfile::tempdir().expect("temp dir");
    let compiled =
        ralpc::compile(options).unwrap_or_else(|e| panic!("plan: {e}{}", error_chain(&e)));
    compiled.write(dir.path()).expect("write the plan");
    let run = ralpc::run(&ralpc::RunOptions {
        plan: dir.path().to_path_buf(),
        model: Some(options.model.clone()),
        steps,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("run: {e}{}", error_chain(&e)));
    run.report
}

/// Plans `model` for `gpus` at `batch` with `strategy` (a ralpc-strategy/1 file's JSON),
/// then runs `steps` of it.
pub fn run_strategy(
    model: &Path,
    batch: u64,
    gpus: u32,
    strategy: &str,
    steps: u32,
) -> TrainReport {
    let dir = tempfile::tempdir().expect("temp dir");
    let strategy_file = dir.path().join("strategy.json");
    std::fs::write(&strategy_file, strategy).expect("write the strategy");
    let options = ralpc::Options {
        model: model.to_path_buf(),
        gpus: Some(gpus),
        batch: Some(batch),
        strategy_file: Some(strategy_file),
        ..Default::default()
    };
    plan_and_run(&options, steps)
}

/// ` / cause` for each of `e`'s sources.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    let mut source = e.source();
    while let Some(s) = source {
        out += &format!(" / {s}");
        source = s.source();
    }
    out
}

/// `steps` of single-device training of `model` at `batch`.
pub fn reference(model: &Path, batch: u64, steps: u32) -> TrainReport {
    ralpc::train_single_device(
        model,
        batch,
        &ralpc::RunOptions {
            steps,
            ..Default::default()
        },
    )
    .expect("single-device training")
}
