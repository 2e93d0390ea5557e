//! The real-model corpus (`fixtures/corpus/`, ONNX files that PyPI packages ship): each
//! model is imported, planned for 8 GPUs and trained 2 steps on the CPU backend, and what
//! happened is the support matrix `docs/support.md`. The test fails when the matrix it
//! generates differs from the committed one, so that every change of coverage, forward or
//! back, is seen; `RALPC_BLESS=1 cargo test --release --test corpus` rewrites it.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One model of `fixtures/corpus/corpus.json`.
struct Entry {
    case: String,
    category: String,
    package: String,
    licence: String,
    /// `--input` shapes.
    inputs: BTreeMap<String, Vec<u64>>,
    /// `--value` values.
    values: BTreeMap<String, Vec<f64>>,
}

fn entries() -> Vec<Entry> {
    let text = std::fs::read_to_string(common::fixture("corpus/corpus.json")).expect("corpus.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("corpus.json is JSON");
    let field = |e: &serde_json::Value, k: &str| e[k].as_str().unwrap_or_default().to_string();
    json.as_array()
        .expect("a list")
        .iter()
        .map(|e| Entry {
            case: field(e, "case"),
            category: field(e, "category"),
            package: field(e, "package"),
            licence: field(e, "licence"),
            inputs: e["inputs"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            let dims = v.as_array().expect("dims");
                            (k.clone(), dims.iter().filter_map(|d| d.as_u64()).collect())
                        })
                        .collect()
                })
                .unwrap_or_default(),
            values: e["values"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| {
                            let elements = v.as_array().expect("values");
                            (
                                k.clone(),
                                elements.iter().filter_map(|x| x.as_f64()).collect(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// What one step did: `Ok(())`, or why not in one line.
type Step = Result<(), String>;

/// Why a command failed, in one line: the unsupported operator types when that is the
/// cause, else the innermost cause it printed.
fn reason(stderr: &str) -> String {
    // Under --json the error is one ralpc-error/1 object after any notes: its message and
    // causes, a line each, as the terminal prints them.
    let start = if stderr.starts_with('{') {
        Some(0)
    } else {
        stderr.find("\n{").map(|i| i + 1)
    };
    let error = start.and_then(|i| serde_json::from_str::<serde_json::Value>(&stderr[i..]).ok());
    let text;
    let stderr = match error {
        Some(e) => {
            let causes = e["causes"].as_array().cloned().unwrap_or_default();
            text = std::iter::once(&e["message"])
                .chain(&causes)
                .filter_map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            text.as_str()
        }
        None => stderr,
    };
    if let Some(line) = stderr
        .lines()
        .find(|l| l.contains("unsupported operator(s)"))
    {
        let mut ops: Vec<&str> = line
            .split(") (")
            .flat_map(|s| s.split(" ("))
            .skip(1)
            .filter_map(|s| s.split(')').next())
            .collect();
        ops.sort_unstable();
        ops.dedup();
        return format!("unsupported: {}", ops.join(", "));
    }
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("warning"))
        .collect();
    let last = lines.last().copied().unwrap_or("failed without a message");
    let last = last.trim_start_matches("error: ");
    // Sizes and timings vary with the machine; keep the message's first clause, without
    // the verifier's reminder of what a compile-time constant is.
    last.replace(
        " (a constant, an initializer, or shape arithmetic on known shapes)",
        "",
    )
    .chars()
    .take(140)
    .collect::<String>()
    .replace('|', "/")
}

fn run(args: &[&str], timeout: Duration) -> Step {
    let out = common::ralpc()
        .args(args)
        .timeout(timeout)
        .output()
        .map_err(|e| format!("could not start ralpc: {e}"))?;
    if out.status.success() {
        // A training run counts when every step's loss is finite.
        if args.contains(&"--json") {
            let json: serde_json::Value =
                serde_json::from_slice(&out.stdout).map_err(|e| format!("bad --json: {e}"))?;
            let losses = json["losses"].as_array().cloned().unwrap_or_default();
            if let Some(k) = losses
                .iter()
                .position(|l| !l.as_f64().is_some_and(f64::is_finite))
            {
                return Err(format!(
                    "runs, but the loss is not finite at step {}",
                    k + 1
                ));
            }
        }
        Ok(())
    } else if out.status.code().is_none() {
        Err(format!("stopped after {} s", timeout.as_secs()))
    } else {
        Err(reason(&String::from_utf8_lossy(&out.stderr)))
    }
}

fn cell(step: &Option<Step>) -> String {
    match step {
        None => "–".into(),
        Some(Ok(())) => "yes".into(),
        Some(Err(why)) => format!("no: {why}"),
    }
}

#[test]
fn the_corpus_imports_plans_and_trains_as_the_support_matrix_says() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rows = Vec::new();
    let mut counts = [0usize; 3];
    for e in entries() {
        let started = Instant::now();
        let model = common::fixture(&format!("corpus/{}/model.onnx", e.case));
        let model = model.to_str().expect("UTF-8 path").to_string();
        let mut shapes: Vec<String> = Vec::new();
        for (name, dims) in &e.inputs {
            let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
            shapes.extend(["--input".into(), format!("{name}={}", dims.join(","))]);
        }
        for (name, elements) in &e.values {
            let elements: Vec<String> = elements.iter().map(f64::to_string).collect();
            shapes.extend(["--value".into(), format!("{name}={}", elements.join(","))]);
        }
        let shapes: Vec<&str> = shapes.iter().map(String::as_str).collect();
        let batch = e
            .inputs
            .values()
            .next()
            .and_then(|d| d.first())
            .copied()
            .unwrap_or(1);
        let batch = batch.to_string();

        let mut inspect = vec!["inspect", &model];
        inspect.extend(&shapes);
        let imported = run(&inspect, Duration::from_secs(60));
        let out = dir.path().join(&e.case);
        let out = out.to_str().expect("UTF-8 path");
        let planned = imported.is_ok().then(|| {
            let mut plan = vec!["plan", &model, "--gpus", "8", "--batch", &batch, "--quiet"];
            plan.extend(&shapes);
            plan.extend(["-o", out]);
            run(&plan, Duration::from_secs(120))
        });
        let plan_file = format!("{out}/plan.json");
        let trained = matches!(planned, Some(Ok(()))).then(|| {
            run(
                &["run", &plan_file, "--steps", "2", "--json"],
                Duration::from_secs(180),
            )
        });
        for (k, step) in [Some(imported.clone()), planned.clone(), trained.clone()]
            .iter()
            .enumerate()
        {
            counts[k] += usize::from(matches!(step, Some(Ok(()))));
        }
        eprintln!("{:24} {:6.1} s", e.case, started.elapsed().as_secs_f64());
        let shape_text = if e.inputs.is_empty() && e.values.is_empty() {
            "as exported".to_string()
        } else {
            let shapes = e.inputs.iter().map(|(n, d)| {
                let d: Vec<String> = d.iter().map(u64::to_string).collect();
                format!("{n}={}", d.join("×"))
            });
            let values = e.values.iter().map(|(n, v)| {
                let v: Vec<String> = v.iter().map(f64::to_string).collect();
                format!("value {n}={}", v.join(","))
            });
            shapes.chain(values).collect::<Vec<_>>().join(" ")
        };
        rows.push(format!(
            "| {} | {} | {} ({}) | {} | {} | {} | {} |",
            e.case,
            e.category,
            e.package,
            e.licence,
            shape_text.replace('|', "/"),
            cell(&Some(imported)),
            cell(&planned),
            cell(&trained)
        ));
    }
    let total = rows.len();
    let matrix = format!(
        "# Support matrix: real models from PyPI packages\n\n\
         Generated by `tests/corpus.rs` (`RALPC_BLESS=1 cargo test --release --test corpus`); \
         the test fails when it differs from what ralpc does now. The models are ONNX files \
         that PyPI packages ship (`fixtures/corpus/`, structure only; provenance and licences \
         in `fixtures/corpus/corpus.json` and `fixtures/corpus/licenses/`). For each: import \
         (`ralpc inspect` at the shapes given), plan for 8 GPUs (`ralpc plan --gpus 8`) and \
         train 2 steps of that plan on the CPU backend (`ralpc run --steps 2`).\n\n\
         Of {total} models, {} import, {} plan and {} train.\n\n\
         | model | kind | package (licence) | shapes | import | plan, 8 GPUs | train 2 steps, CPU |\n\
         |---|---|---|---|---|---|---|\n{}\n",
        counts[0],
        counts[1],
        counts[2],
        rows.join("\n")
    );
    let path = common::root().join("docs/support.md");
    if std::env::var_os("RALPC_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("docs/")).expect("docs/");
        std::fs::write(&path, &matrix).expect("write docs/support.md");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == matrix,
        "docs/support.md is not what ralpc does now; rerun with RALPC_BLESS=1 and review the \
         diff. Generated:\n{matrix}"
    );
}
