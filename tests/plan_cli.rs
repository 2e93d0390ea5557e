//! `ralpc plan` (and its `ralpc MODEL` shorthand) as a user and a build system meet it.

mod common;

use common::ralpc;

use serde_json::Value;

const VGG16: &str = "fixtures/onnx/vgg16/model.onnx";

fn json(args: &[&str]) -> Value {
    let out = ralpc().args(args).assert().success();
    serde_json::from_slice(&out.get_output().stdout).expect("one JSON object")
}

/// The report without its one run-dependent field.
fn deterministic(mut v: Value) -> Value {
    v.as_object_mut()
        .expect("an object")
        .remove("planning_time_us");
    v
}

#[test]
fn json_has_the_documented_fields() {
    let v = json(&["plan", VGG16, "--gpus", "8", "--json"]);
    for key in [
        "iteration_time_us",
        "dp_iteration_time_us",
        "single_gpu_time_us",
        "gpu_sec_amplification",
        "gpus_used",
        "peak_memory_bytes",
        "lower_bound_us",
        "planning_time_us",
    ] {
        assert!(v[key].is_number(), "{key}: {}", v[key]);
    }
    let t = v["iteration_time_us"].as_f64().unwrap();
    assert!(t <= v["dp_iteration_time_us"].as_f64().unwrap());
    assert!(t >= v["lower_bound_us"].as_f64().unwrap());
    assert_eq!(v["batch"], 32);
    assert!(
        v["memory_capacity_bytes"].as_f64().unwrap() >= v["peak_memory_bytes"].as_f64().unwrap()
    );
    // The simulator's figures: one peak per rank, bytes per link class.
    let simulated = &v["simulated"];
    assert!(simulated["iteration_time_us"].as_f64().unwrap() > 0.0);
    assert_eq!(simulated["peak_memory_bytes"].as_array().unwrap().len(), 8);
    assert!(simulated["bytes_by_link"]["intra_node"].as_u64().unwrap() > 0);
    let stages = v["stages"].as_array().unwrap();
    assert!(!stages.is_empty());
    for s in stages {
        assert!(s["first_layer"].is_string() && s["last_layer"].is_string());
        assert!(s["replicas"].as_u64().unwrap() >= 1);
    }
    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 22, "VGG16 has 22 placement units");
    for l in layers {
        let split = &l["split"];
        let degree: u64 = ["sample", "attribute", "parameter"]
            .iter()
            .map(|k| split[k].as_u64().unwrap())
            .product();
        assert_eq!(l["gpus"].as_u64().unwrap(), degree, "{l}");
        assert!(l["name"].is_string() && l["stage"].is_u64());
    }
}

#[test]
fn the_shorthand_is_plan() {
    let long = json(&["plan", VGG16, "--gpus", "4", "--json"]);
    let short = json(&[VGG16, "--gpus", "4", "--json"]);
    assert_eq!(deterministic(long), deterministic(short));
}

#[test]
fn identical_inputs_give_identical_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let run = |path: &std::path::Path| {
        json(&[
            "plan",
            "fixtures/onnx/resnet50/model.onnx",
            "--gpus",
            "8",
            "--json",
            "--write-strategy",
            path.to_str().unwrap(),
        ])
    };
    let (first, second) = (run(&a), run(&b));
    assert_eq!(deterministic(first), deterministic(second));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}

/// VGG16 planned for 8 GPUs (`--json`), its strategy written to `path`.
fn vgg16_writing_its_strategy(path: &std::path::Path) -> Value {
    let path = path.to_str().unwrap();
    json(&[
        "plan",
        VGG16,
        "--gpus",
        "8",
        "--json",
        "--write-strategy",
        path,
    ])
}

#[test]
fn a_written_strategy_evaluates_to_the_same_plan() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.strategy.json");
    let searched = vgg16_writing_its_strategy(&path);
    let path = path.to_str().unwrap();
    let file: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(file["format"], "ralpc-strategy/1");
    let evaluated = json(&[
        "plan",
        VGG16,
        "--gpus",
        "8",
        "--json",
        "--strategy-file",
        path,
    ]);
    assert_eq!(evaluated["strategy"], "file");
    assert_eq!(
        searched["iteration_time_us"],
        evaluated["iteration_time_us"]
    );
    assert_eq!(searched["layers"], evaluated["layers"]);
}

#[test]
fn every_strategy_can_be_asked_for() {
    let dp = json(&["plan", VGG16, "--gpus", "8", "--strategy", "dp", "--json"]);
    assert_eq!(dp["iteration_time_us"], dp["dp_iteration_time_us"]);
    assert_eq!(dp["gpus_used"], 8);
    for strategy in ["burst", "soap", "pipeline", "auto"] {
        let v = json(&[
            "plan",
            VGG16,
            "--gpus",
            "8",
            "--strategy",
            strategy,
            "--json",
        ]);
        assert!(
            v["iteration_time_us"].as_f64().unwrap()
                <= dp["iteration_time_us"].as_f64().unwrap() * (1.0 + 1e-12),
            "{strategy}"
        );
    }
    let piped = json(&[
        "plan",
        VGG16,
        "--gpus",
        "8",
        "--strategy",
        "pipeline",
        "--schedule",
        "gpipe",
        "--microbatches",
        "4",
        "--json",
    ]);
    assert_eq!(piped["schedule"], "gpipe");
    assert_eq!(piped["microbatches"], 4);
}

#[test]
fn tolerance_bounds_gpu_time() {
    let v = json(&["plan", VGG16, "--gpus", "8", "--tolerance", "0.1", "--json"]);
    assert!(v["gpu_sec_amplification"].as_f64().unwrap() <= 1.1 + 1e-9);
}

#[test]
fn a_plan_the_budget_held_back_says_so() {
    // Data parallelism on 16 GPUs is faster than any plan within the default budget of 2×
    // one GPU's GPU time: the warning names the budget and how to lift it.
    let v = json(&[
        "plan",
        "fixtures/onnx/resnet50/model.onnx",
        "--gpus",
        "16",
        "--json",
    ]);
    let warnings = v["warnings"].to_string();
    assert!(
        warnings.contains("slower than data parallelism")
            && warnings.contains("above the budget of 2.00×")
            && warnings.contains("--tolerance inf"),
        "{warnings}"
    );
    // Without the budget, data parallelism on every GPU is planned and nothing is said.
    let free = json(&[
        "plan",
        "fixtures/onnx/resnet50/model.onnx",
        "--gpus",
        "16",
        "--tolerance",
        "inf",
        "--json",
    ]);
    assert_eq!(free["gpus_used"], 16);
    assert!(!free["warnings"].to_string().contains("budget"));
}

#[test]
fn a_pipedream_graph_is_a_model() {
    let graph = "fixtures/anchors/pipedream/vgg16/graph.txt";
    let v = json(&[
        "plan",
        graph,
        "--gpus",
        "8",
        "--link-bandwidth",
        "1GB/s",
        "--strategy",
        "pipeline",
        "--schedule",
        "async",
        "--microbatches",
        "1",
        "--tolerance",
        "inf",
        "--json",
    ]);
    assert_eq!(v["batch"], 128);
    assert!(
        v["stages"].as_array().unwrap().len() >= 2,
        "{}",
        v["stages"]
    );
    // Its batch is measured, not chosen.
    let out = ralpc()
        .args(["plan", graph, "--batch", "64"])
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("measured at batch 128"), "{err}");
}

#[test]
fn a_deeppool_profile_is_a_model_at_any_batch() {
    let prof = "fixtures/anchors/deeppool/A100_wrn.prof";
    let v = json(&["plan", prof, "--gpus", "8", "--batch", "16", "--json"]);
    assert_eq!(v["batch"], 16);
    assert!(v["iteration_time_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_file_neither_onnx_nor_a_profile_gets_both_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "hello, world\n").unwrap();
    let out = ralpc()
        .args(["plan", path.to_str().unwrap(), "--gpus", "2"])
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains("neither an ONNX model"), "{err}");
    assert!(err.contains("protobuf"), "{err}");
    assert!(err.contains("not a ralpc profile"), "{err}");
}

#[test]
fn the_summary_explains_the_plan() {
    let out = ralpc()
        .args(["plan", VGG16, "--gpus", "8", "--force"])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for needle in [
        "iteration:",
        "data parallel",
        "GPU time:",
        "stages:",
        "compared:",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    let help = ralpc().args(["plan", "--help"]).assert().success();
    let help = String::from_utf8_lossy(&help.get_output().stdout).into_owned();
    assert!(
        help.contains("--strategy-file") && help.contains("burst"),
        "{help}"
    );
}

fn fails(args: &[&str], code: i32, needles: &[&str]) {
    let out = ralpc().args(args).assert().code(code);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    for needle in needles {
        assert!(err.contains(needle), "`{needle}` not in:\n{err}");
    }
    assert!(out.get_output().stdout.is_empty(), "no output on failure");
}

#[test]
fn bad_inputs_exit_1_and_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let unknown = file(
        "unknown.json",
        r#"{"format":"ralpc-strategy/1","stages":[{"first_layer":"nope","last_layer":"x","replicas":8}]}"#,
    );
    fails(
        &["plan", VGG16, "--strategy-file", &unknown],
        1,
        &[
            "stages[0].first_layer",
            "no layer or module is named \"nope\"",
        ],
    );
    let truncated = file("truncated.json", r#"{"format":"ralpc-strategy/1","sta"#);
    fails(
        &["plan", VGG16, "--strategy-file", &truncated],
        1,
        &["not a strategy file"],
    );
    let wrong_field = file(
        "field.json",
        r#"{"format":"ralpc-strategy/1","stages":[],"replicas":3}"#,
    );
    fails(
        &["plan", VGG16, "--strategy-file", &wrong_field],
        1,
        &["unknown field `replicas`"],
    );
    fails(
        &["plan", VGG16, "--memory-limit", "1GiB"],
        1,
        &["does not fit", "smallest per-GPU memory"],
    );
    // Pipelines that fit but cost too much GPU time are a budget problem, said as one.
    fails(
        &[
            "plan",
            VGG16,
            "--gpus",
            "16",
            "--strategy",
            "pipeline",
            "--microbatches",
            "8",
        ],
        1,
        &["no pipeline plan keeps GPU-sec amplification"],
    );
    // More microbatches than the batch's samples: said, not dropped from the search.
    fails(
        &[
            "plan",
            VGG16,
            "--gpus",
            "4",
            "--batch",
            "8",
            "--microbatches",
            "16",
        ],
        1,
        &["--microbatches 16: the batch of 8 samples cuts into 1 to 8 microbatches"],
    );
    fails(
        // A sized cluster does not grow (a bare preset name does).
        &["plan", VGG16, "--cluster", "dgx-a100x1", "--gpus", "12"],
        1,
        &["has 8 GPUs"],
    );
    fails(
        &["plan", "fixtures/bad/missing.onnx"],
        1,
        &["cannot import the model"],
    );
    fails(
        &[
            "plan",
            VGG16,
            "--profile",
            "fixtures/anchors/pipedream/vgg16/graph.txt",
        ],
        1,
        &["give it as the model"],
    );
}

#[test]
fn an_unwritable_strategy_exits_3_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("no-such-dir").join("plan.json");
    fails(
        &[
            "plan",
            VGG16,
            "--gpus",
            "2",
            "--write-strategy",
            target.to_str().unwrap(),
        ],
        3,
        &["cannot write"],
    );
    assert!(!target.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_mistyped_subcommand_is_a_usage_error() {
    ralpc().args(["plann"]).assert().code(2);
}

#[test]
fn out_writes_a_valid_executable_plan() {
    let dir = tempfile::tempdir().unwrap();
    let run = |sub: &str| {
        let out = dir.path().join(sub);
        ralpc()
            .args(["plan", VGG16, "--gpus", "8", "-o", out.to_str().unwrap()])
            .assert()
            .success();
        let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
        (
            read("plan.json"),
            [read("timeline.json"), read("report.html"), read("plan.dot")],
        )
    };
    let ((first, artifacts), (second, again)) = (run("a"), run("b/nested"));
    assert_eq!(
        first, second,
        "plan.json is byte-identical for identical inputs"
    );
    for (a, b) in artifacts.iter().zip(&again) {
        assert!(a == b, "the trace, report and graph are byte-identical too");
    }
    let plan = ralpc::codegen::Plan::parse(&first).expect("a valid plan");
    assert_eq!(plan.ranks, 8);
    assert_eq!(plan.layers.len(), 22);
    let model = std::fs::read(common::root().join(VGG16)).unwrap();
    plan.check_model(&model).expect("made for this model");
    assert!(plan.check_model(b"something else").is_err());
    // Every rank computes every layer it hosts, forward and backward.
    for program in &plan.programs {
        assert!(program
            .iter()
            .any(|i| matches!(i, ralpc::codegen::Instruction::Forward { .. })));
    }
}

/// VGG16 forced into an 8-microbatch pipeline on 8 GPUs (slower than ralpc's own choice).
const VGG16_PIPELINE: [&str; 8] = [
    "plan",
    VGG16,
    "--gpus",
    "8",
    "--strategy",
    "pipeline",
    "--microbatches",
    "8",
];

/// Options that fix part of the plan are compared with planning without them, and a plan
/// slower than data parallelism says so: on the terminal, in --json and in the report.
#[test]
fn forced_options_that_cost_time_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let args = [&VGG16_PIPELINE[..], &["-o", out.to_str().unwrap()]].concat();
    let text = ralpc().args(&args).assert().success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(
        text.contains("warning: --strategy pipeline, --microbatches 8 make the iteration"),
        "{text}"
    );
    assert!(text.contains("slower than data parallelism"), "{text}");
    let json = ralpc().args(&args).arg("--json").assert().success();
    let json: Value = serde_json::from_slice(&json.get_output().stdout).unwrap();
    assert_eq!(json["warnings"].as_array().map(Vec::len), Some(2), "{json}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("Warning: --strategy pipeline"));
    // Left to itself, ralpc's plan is its own best: nothing to warn about.
    let auto = ralpc()
        .args(["plan", VGG16, "--gpus", "8", "--json"])
        .assert()
        .success();
    let auto: Value = serde_json::from_slice(&auto.get_output().stdout).unwrap();
    assert!(auto.get("warnings").is_none(), "{auto}");
}

#[test]
fn out_writes_the_graph_and_the_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    ralpc()
        .args(VGG16_PIPELINE)
        .args(["-o", out.to_str().unwrap()])
        .assert()
        .success();
    // The trace: named tracks, one slice per instruction, flows from sends to receives.
    let trace: Value =
        serde_json::from_slice(&std::fs::read(out.join("timeline.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let plan =
        ralpc::codegen::Plan::parse(&std::fs::read_to_string(out.join("plan.json")).unwrap())
            .unwrap();
    let instructions: usize = plan.programs.iter().map(Vec::len).sum();
    let slices: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(slices.len(), instructions);
    // Each slice's args say what it is, as the plan does (what Perfetto queries select by).
    for s in &slices {
        let args = &s["args"];
        let rank = args["rank"].as_u64().unwrap() as usize;
        let index = args["instruction"].as_u64().unwrap() as usize;
        let instr = &plan.programs[rank][index];
        assert_eq!(s["cat"], instr.op(), "{s}");
        match instr {
            ralpc::codegen::Instruction::Forward {
                layer, microbatch, ..
            }
            | ralpc::codegen::Instruction::Backward {
                layer, microbatch, ..
            } => {
                assert_eq!(args["layer"], plan.layers[*layer as usize].as_str(), "{s}");
                assert_eq!(args["microbatch"], *microbatch, "{s}");
            }
            ralpc::codegen::Instruction::Send { to, bytes, .. } => {
                assert_eq!(args["peers"], serde_json::json!([to]), "{s}");
                assert_eq!(args["bytes"], *bytes, "{s}");
            }
            ralpc::codegen::Instruction::AllReduce { group, bytes, .. } => {
                assert_eq!(
                    args["peers"],
                    serde_json::json!(plan.groups[*group as usize])
                );
                assert_eq!(args["bytes"], *bytes, "{s}");
            }
            _ => {}
        }
    }
    let starts = events.iter().filter(|e| e["ph"] == "s").count();
    let ends = events.iter().filter(|e| e["ph"] == "f").count();
    assert!(
        starts > 0 && starts == ends,
        "{starts} flow starts, {ends} ends"
    );
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["args"]["name"] == "GPU 0 communication"));
    // Memory counters per GPU, never above the plan's peak for that rank.
    let peaks = plan.peak_memory_bytes();
    let counters: Vec<&Value> = events.iter().filter(|e| e["ph"] == "C").collect();
    assert!(counters.iter().any(|e| e["name"] == "GPU 0 memory"));
    for c in counters {
        let rank: usize = c["name"].as_str().unwrap()[4..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let mib = c["args"]["MiB"].as_f64().unwrap();
        assert!(mib * 1048576.0 <= peaks[rank] as f64 + 1.0, "{c}");
    }
    // The DOT file: one node per layer, and Graphviz accepts it.
    let dot = std::fs::read_to_string(out.join("plan.dot")).unwrap();
    assert_eq!(dot.matches("fillcolor=").count(), 22);
    assert!(
        dot.contains("subgraph cluster_stage1"),
        "a pipeline has two stages or more"
    );
    match std::process::Command::new("dot")
        .args(["-Tsvg", out.join("plan.dot").to_str().unwrap()])
        .output()
    {
        Ok(svg) => {
            assert!(
                svg.status.success(),
                "{}",
                String::from_utf8_lossy(&svg.stderr)
            );
            assert!(
                out.join("plan.svg").exists(),
                "ralpc renders plan.svg when dot exists"
            );
        }
        Err(_) => common::skip_without(
            "Graphviz (dot)",
            "Debian: apt install graphviz",
            "rendering plan.dot",
        ),
    }
}

/// The summary a user reads, as a snapshot: every figure is a function of the inputs
/// except the planning time and where the files went, which are redacted.
#[test]
fn the_summary_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let out = ralpc()
        .args(["plan", VGG16, "--gpus", "8", "-o"])
        .arg(dir.path().join("out"))
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let redacted: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with("planned in ") {
                "planned in [time]".to_owned()
            } else if let Some(rest) = line.strip_prefix("wrote ") {
                let files = rest.split_once(": ").map_or("", |(_, f)| f);
                // plan.svg only where Graphviz is installed.
                format!("wrote [dir]: {}", files.replace(", plan.svg", ""))
            } else {
                line.to_owned()
            }
        })
        .collect();
    insta::assert_snapshot!(redacted.join("\n"));
}

#[test]
fn the_default_batch_is_the_exported_one_when_it_is_real() {
    let exported = json(&[
        "plan",
        "fixtures/rules/exported_batch4.onnx",
        "--gpus",
        "2",
        "--json",
    ]);
    assert_eq!(exported["batch"], 4);
    // Exported at batch 1 (an example, not a training batch): 32.
    let vgg = json(&["plan", VGG16, "--gpus", "8", "--json"]);
    assert_eq!(vgg["batch"], 32);
}

#[test]
fn input_shapes_are_planned_recorded_in_the_plan_and_run_at() {
    let model = "fixtures/train/dynamic.onnx";
    let dir = tempfile::tempdir().unwrap();
    let losses = |gpus: &str| -> Vec<f64> {
        let out = dir.path().join(format!("g{gpus}"));
        let out = out.to_str().unwrap();
        ralpc()
            .args([
                "plan",
                model,
                "--gpus",
                gpus,
                "--strategy",
                "dp",
                "--tolerance",
                "inf",
            ])
            .args(["--input", "x=4,5,16", "-q", "-o", out])
            .assert()
            .success();
        let plan: Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{out}/plan.json")).unwrap())
                .unwrap();
        assert_eq!(plan["model"]["inputs"]["x"], serde_json::json!([4, 5, 16]));
        assert_eq!(plan["batch"], 4);
        let run = ralpc()
            .args(["run", out, "--steps", "2", "--json"])
            .assert()
            .success();
        let v: Value = serde_json::from_slice(&run.get_output().stdout).unwrap();
        v["losses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_f64().unwrap())
            .collect()
    };
    let (one, two) = (losses("1"), losses("2"));
    for (a, b) in two.iter().zip(&one) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "{two:?} vs {one:?}");
    }
    // Without the token count the model cannot be planned, and the error says how.
    fails(
        &["plan", model, "--gpus", "2"],
        1,
        &["unbound dimension 'tokens'", "--input"],
    );
    fails(
        &["plan", model, "--batch", "8", "--input", "x=4,5,16"],
        1,
        &["--input x has batch 4", "--batch is 8"],
    );
    fails(
        &["plan", VGG16, "--input", "input=8,3,112,112"],
        1,
        &["fixes dimension 2 to 224"],
    );
}

/// A large model's picture (`plan.svg`) is drawn from its runs of alike layers, one box
/// each; `plan.dot` keeps every layer. DenseNet-121's full graph took Graphviz minutes.
#[test]
fn a_large_models_drawing_collapses_runs_of_alike_layers() {
    let compiled = ralpc::compile(&ralpc::Options {
        model: common::fixture("onnx/densenet121/model.onnx"),
        gpus: Some(8),
        ..Default::default()
    })
    .expect("plans");
    let exe = compiled.executable.expect("lowered");
    let boxes = |dot: &str| dot.lines().filter(|l| l.contains("fillcolor")).count();
    let layers = compiled.report.layers.len();
    assert!(layers > ralpc::codegen::viz::MAX_DRAWN_LAYERS);
    assert_eq!(boxes(&exe.dot), layers);
    let drawn = boxes(&exe.drawing);
    assert!(
        drawn >= 1 && drawn < layers / 10,
        "{drawn} boxes for {layers} layers"
    );
    // Every layer is in one box: the runs' sizes add up.
    let counted: usize = exe
        .drawing
        .lines()
        .filter(|l| l.contains("fillcolor"))
        .map(|l| {
            l.split("\\n(")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .map_or(1, |n| n.parse::<usize>().expect("a layer count"))
        })
        .sum();
    assert_eq!(counted, layers);
}

/// A plan over the GPU-time budget says the least amplification reached and the
/// tolerance that admits it, and that tolerance plans.
#[test]
fn an_over_budget_error_says_the_tolerance_that_plans() {
    let model = common::fixture("train/cnn.onnx");
    let dir = tempfile::tempdir().expect("temp dir");
    let args = ["--gpus", "4", "--batch", "8", "--strategy", "dp", "-o"];
    let failed = ralpc()
        .arg(&model)
        .args(args)
        .arg(dir.path().join("a"))
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&failed.get_output().stderr).into_owned();
    let tolerance = stderr
        .split("raise --tolerance to at least ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no tolerance suggested: {stderr}"))
        .trim_end_matches(',')
        .to_owned();
    ralpc()
        .arg(&model)
        .args(args)
        .arg(dir.path().join("b"))
        .args(["--tolerance", &tolerance, "--quiet"])
        .assert()
        .success();
}

#[test]
fn layers_carry_their_pytorch_modules_and_strategy_files_accept_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.strategy.json");
    let searched = vgg16_writing_its_strategy(&path);
    // The TorchScript export names nodes by scope: `/features/features.0/Conv`.
    assert_eq!(searched["layers"][0]["module"], "features.0");
    let mut file: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(file["layers"][0]["module"], "features.0");
    assert_eq!(file["layers"][0]["kind"], "conv");
    // A layer named by its module: the classifier's last product on one GPU.
    file["layers"] = serde_json::json!([{ "name": "classifier.6", "gpus": 1 }]);
    std::fs::write(&path, file.to_string()).unwrap();
    let priced = json(&[
        "plan",
        VGG16,
        "--gpus",
        "8",
        "--json",
        "--strategy-file",
        path.to_str().unwrap(),
    ]);
    let last = priced["layers"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["module"].clone(), last["gpus"].clone()),
        ("classifier.6".into(), 1.into())
    );
}

#[test]
fn emit_writes_a_torch_script_and_megatron_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpt2");
    ralpc()
        .args([
            "plan",
            "fixtures/onnx/gpt2/model.onnx",
            "--gpus",
            "8",
            "--batch",
            "16",
        ])
        .args([
            "--tensor-parallel",
            "2",
            "--pipeline-parallel",
            "2",
            "-q",
            "-o",
        ])
        .arg(&out)
        .args(["--emit", "torch", "--emit", "megatron"])
        .assert()
        .success();
    let args = std::fs::read_to_string(out.join("megatron.args")).unwrap();
    for needle in [
        "--num-layers 12\n",
        "--hidden-size 768\n",
        "--tensor-model-parallel-size 2\n",
        "--pipeline-model-parallel-size 2\n",
        "--global-batch-size 16\n",
    ] {
        assert!(args.contains(needle), "`{needle}` not in:\n{args}");
    }
    let script = std::fs::read_to_string(out.join("train_torch.py")).unwrap();
    assert!(
        script.contains("PLAN = {") && script.contains("\"blocks.0.qkv\""),
        "{script}"
    );
    assert!(script.contains("def parallelize(") && script.contains("if __name__ == \"__main__\":"));
    // A plan of layers has no Megatron-LM form.
    let cnn = dir.path().join("vgg");
    fails(
        &[
            "plan",
            VGG16,
            "--gpus",
            "8",
            "--emit",
            "megatron",
            "-o",
            cnn.to_str().unwrap(),
        ],
        1,
        &["--emit megatron", "transformer (3d) plans"],
    );
    // A plan ralpc.torch will refuse is written with a warning naming the plan it runs.
    let soap = dir.path().join("soap");
    let out = ralpc()
        .args(["plan", VGG16, "--gpus", "8", "--emit", "torch", "-o"])
        .arg(&soap)
        .assert()
        .success();
    let printed = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        printed.contains("warning: train_torch.py: ralpc.torch will refuse this plan")
            && printed.contains("--strategy dp plans one PyTorch runs"),
        "{printed}"
    );
    assert!(soap.join("train_torch.py").is_file());
    // GPT-2's block (LayerNorm, a GELU MLP, biases) is of no family torchtitan trains.
    fails(
        &[
            "plan",
            "fixtures/onnx/gpt2/model.onnx",
            "--gpus",
            "8",
            "--emit",
            "torchtitan",
            "-o",
            dir.path().join("titan").to_str().unwrap(),
        ],
        1,
        &[
            "--emit torchtitan",
            "Llama 3, Qwen3, DeepSeek-V3 and gpt-oss",
        ],
    );
    // Refused before anything was written.
    assert!(!dir.path().join("titan").exists());
}

/// A model that cannot be re-batched (the exporter baked the batch into an initializer's
/// shape) is planned with every layer's samples whole, and the report says why.
#[test]
fn a_fixed_batch_export_is_planned_without_splitting_its_samples() {
    // Asked for data parallelism or not, the search keeps the batch whole: the export's
    // Concat reads a constant of the exported batch.
    for family in ["auto", "dp"] {
        let v = json(&[
            "plan",
            "fixtures/bad/rebatch_baked_constant.onnx",
            "--gpus",
            "2",
            "--strategy",
            family,
            "--json",
        ]);
        let warnings = v["warnings"].to_string();
        assert!(
            warnings.contains("no plan splits the batch's samples")
                && warnings.contains("'cat_cls'"),
            "{warnings}"
        );
        for layer in v["layers"].as_array().unwrap() {
            assert_eq!(layer["split"]["sample"], 1, "{family}: {layer}");
        }
    }
}

/// Microbatches cut the batch: asked of a model whose batch its export fixes, they are
/// refused with the reason, not reported as a GPU-time budget no plan meets.
#[test]
fn microbatches_of_a_fixed_batch_export_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let refused = ralpc()
        .args(["fixtures/bad/rebatch_baked_constant.onnx", "--gpus", "2"])
        .args([
            "--strategy",
            "pipeline",
            "--microbatches",
            "2",
            "--tolerance",
            "inf",
        ])
        .arg("-o")
        .arg(dir.path().join("plan"))
        .assert()
        .code(1);
    let stderr = String::from_utf8_lossy(&refused.get_output().stderr).into_owned();
    assert!(
        stderr.contains("2 microbatches cut the batch")
            && stderr.contains("'cls_token'")
            && !stderr.contains("tolerance"),
        "{stderr}"
    );
    assert!(!dir.path().join("plan").exists());
}

/// A strategy file may still split its samples: the plan is refused when it is made, naming
/// the node, not when a rank runs it; nothing is written.
#[test]
fn a_batch_split_the_model_cannot_take_is_refused_at_plan_time() {
    let dir = tempfile::tempdir().unwrap();
    let strategy = dir.path().join("split.strategy.json");
    let layer = r#"{"name": "cat_cls", "kind": "data_movement", "gpus": 2,
        "split": {"sample": 2, "attribute": 1, "parameter": 1}}"#;
    std::fs::write(
        &strategy,
        format!(
            r#"{{"format": "ralpc-strategy/1", "schedule": "1f1b", "microbatches": 1,
            "stages": [{{"first_layer": "cat_cls", "last_layer": "cat_cls", "replicas": 2}}],
            "layers": [{layer}]}}"#
        ),
    )
    .unwrap();
    let out = dir.path().join("plan");
    let refused = ralpc()
        .args(["fixtures/bad/rebatch_baked_constant.onnx", "--gpus", "2"])
        .arg("--strategy-file")
        .arg(&strategy)
        .arg("-o")
        .arg(&out)
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&refused.get_output().stderr).into_owned();
    assert!(
        err.contains("computes 1 of the batch's 2 samples") && err.contains("'cat_cls'"),
        "{err}"
    );
    assert!(!out.exists());
}

/// On a cluster of A100 and H100 nodes, a plan may take one type's GPUs alone: its stages
/// say which ranks and which type, in `--json` and in the report.
#[test]
fn stages_say_which_gpu_type_they_run_on() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = dir.path().join("mixed.toml");
    std::fs::write(
        &cluster,
        "[[group]]\npreset = \"dgx-a100\"\n[[group]]\npreset = \"dgx-h100\"\n",
    )
    .unwrap();
    let cluster = cluster.to_str().unwrap();
    let args = [
        "plan",
        "fixtures/onnx/vgg16/model.onnx",
        "--cluster",
        cluster,
        "--gpus",
        "16",
        "--batch",
        "256",
        "--tolerance",
        "inf",
    ];
    let plan = json(&[&args[..], &["--json"]].concat());
    let stages = plan["stages"].as_array().unwrap();
    for s in stages {
        let first = s["first_rank"].as_u64().unwrap();
        let expected = if first >= 8 {
            "h100-sxm5-80gb"
        } else {
            "a100-sxm4-80gb"
        };
        assert_eq!(s["gpu_type"], expected, "{s}");
    }
    // Eight H100s alone beat sixteen GPUs run at the A100's pace.
    assert_eq!(stages[0]["first_rank"], 8, "{plan}");
    let out = ralpc().args(args).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains("GPUs of h100-sxm5-80gb (ranks 8..15)"),
        "{text}"
    );
    // Such a plan runs: a small CNN on one H100 of two V100s and two H100s trains as on
    // one GPU alone.
    let small = dir.path().join("small.toml");
    std::fs::write(
        &small,
        "[[group]]\npreset = \"p3dn-v100\"\ngpus_per_node = 2\n\
         [[group]]\npreset = \"dgx-h100\"\ngpus_per_node = 2\n",
    )
    .unwrap();
    let losses = |cluster: &std::path::Path, gpus: &str| {
        let out = dir.path().join(format!("plan-{gpus}"));
        ralpc()
            .args([
                "plan",
                "fixtures/train/cnn.onnx",
                "--tolerance",
                "inf",
                "--gpus",
                gpus,
            ])
            .arg("--cluster")
            .arg(cluster)
            .arg("-o")
            .arg(&out)
            .assert()
            .success();
        let run = ralpc()
            .arg("run")
            .arg(&out)
            .args(["--steps", "2", "--json"])
            .assert()
            .success();
        let run: Value = serde_json::from_slice(&run.get_output().stdout).unwrap();
        (run["losses"].clone(), out)
    };
    let (mixed, out) = losses(&small, "4");
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("plan.json")).unwrap()).unwrap();
    assert_eq!(
        plan["strategy"]["stages"][0]["first_rank"], 2,
        "{}",
        plan["strategy"]
    );
    let one = dir.path().join("one.toml");
    std::fs::write(
        &one,
        "[[group]]\npreset = \"dgx-h100\"\ngpus_per_node = 1\n",
    )
    .unwrap();
    assert!(mixed.as_array().is_some_and(|l| l.len() == 2), "{mixed}");
    assert_eq!(mixed, losses(&one, "1").0);
}
