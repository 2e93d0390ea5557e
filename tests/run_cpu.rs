//! Partitioned training on the CPU backend equals single-device training: for every
//! strategy kind (data parallel, burst, SOAP splits of convolutions and dense layers,
//! GPipe, 1F1B and zero-bubble pipelines) on 2, 4 and 8 ranks, the first step's output, loss and every
//! weight gradient, and the weights after three SGD steps, against one device (relative
//! error of each tensor, in the L2 norm, at most 1e-5).

mod common;

use std::path::{Path, PathBuf};

use common::train::{assert_same, error_chain, plan_and_run, reference, run_strategy as run_plan};

fn fixture(name: &str) -> PathBuf {
    common::fixture("train").join(name)
}

fn stage(first: &str, last: &str, replicas: u32) -> String {
    format!(r#"{{ "first_layer": "{first}", "last_layer": "{last}", "replicas": {replicas} }}"#)
}

fn strategy(stages: &[String], layers: &str, schedule: &str, microbatches: u32) -> String {
    format!(
        r#"{{ "format": "ralpc-strategy/1", "schedule": "{schedule}", "microbatches": {microbatches},
             "stages": [{}], "layers": [{layers}] }}"#,
        stages.join(", ")
    )
}

#[test]
fn data_parallel_equals_one_device() {
    let model = fixture("mlp.onnx");
    let want = reference(&model, 8, 3);
    for gpus in [2, 4, 8] {
        let s = strategy(&[stage("fc0", "fc2", gpus)], "", "1f1b", 1);
        assert_same(
            &format!("dp{gpus}"),
            &run_plan(&model, 8, gpus, &s, 3),
            &want,
        );
    }
}

fn check(model: &str, batch: u64, gpus: u32, strategy: &str, what: &str) {
    let model = fixture(model);
    let want = reference(&model, batch, 3);
    assert_same(what, &run_plan(&model, batch, gpus, strategy, 3), &want);
}

fn split(layer: &str, s: u32, a: u32, p: u32) -> String {
    format!(
        r#"{{ "name": "{layer}", "split": {{ "sample": {s}, "attribute": {a}, "parameter": {p} }} }}"#
    )
}

#[test]
fn burst_parallelism_equals_one_device() {
    // Per-layer GPU counts inside one stage of 4: the convolutions on 4, the rest on fewer.
    let layers = [
        split("conv1", 2, 1, 1),
        split("pool1", 2, 1, 1),
        split("fc0", 1, 1, 1),
        split("fc1", 1, 1, 1),
    ]
    .join(", ");
    let s = strategy(&[stage("conv0", "fc1", 4)], &layers, "1f1b", 1);
    check("cnn.onnx", 8, 4, &s, "burst");
}

#[test]
fn soap_splits_of_convolutions_and_dense_layers_equal_one_device() {
    // Output channels of a convolution, column- and row-parallel dense layers.
    let layers = [
        split("conv1", 2, 1, 2),
        split("pool1", 2, 1, 2),
        split("fc0", 1, 1, 4),
        split("fc1", 1, 4, 1),
    ]
    .join(", ");
    let s = strategy(&[stage("conv0", "fc1", 4)], &layers, "1f1b", 1);
    check("cnn.onnx", 8, 4, &s, "soap-cnn");
    let layers = [
        split("fc0", 4, 1, 2),
        split("fc1", 2, 1, 4),
        split("fc2", 1, 8, 1),
    ]
    .join(", ");
    let s = strategy(&[stage("fc0", "fc2", 8)], &layers, "1f1b", 1);
    check("mlp.onnx", 8, 8, &s, "soap-mlp");
}

#[test]
fn pipelines_equal_one_device() {
    for (schedule, microbatches) in [("gpipe", 4), ("1f1b", 2), ("zb-h1", 4)] {
        let s = strategy(
            &[stage("conv0", "pool0", 1), stage("conv1", "fc1", 1)],
            "",
            schedule,
            microbatches,
        );
        check("cnn.onnx", 8, 2, &s, &format!("{schedule}-2"));
        let s = strategy(
            &[
                stage("conv0", "pool0", 2),
                stage("conv1", "pool1", 1),
                stage("fc0", "fc1", 1),
            ],
            "",
            schedule,
            microbatches,
        );
        check("cnn.onnx", 8, 4, &s, &format!("{schedule}-4"));
    }
}

#[test]
fn a_transformer_block_trains_the_same_on_every_layout() {
    let s = strategy(&[stage("ln1", "fc2", 2)], "", "1f1b", 1);
    check("transformer.onnx", 4, 2, &s, "transformer-dp");
    let s = strategy(
        &[stage("ln1", "proj", 2), stage("ln2", "fc2", 2)],
        "",
        "gpipe",
        2,
    );
    check("transformer.onnx", 4, 4, &s, "transformer-pipeline");
    // Column-parallel projections: one with a residual added after it, one with a bias
    // and GELU.
    let layers = [split("proj", 1, 1, 2), split("fc1", 1, 1, 2)].join(", ");
    let s = strategy(&[stage("ln1", "fc2", 2)], &layers, "1f1b", 1);
    check("transformer.onnx", 4, 2, &s, "transformer-soap");
}

/// ONNX's fused `Attention` (opset 23) is expanded on import into the primitives, so the
/// same block trains as one device on every layout, its heads split too.
#[test]
fn a_fused_attention_operator_trains_the_same_on_every_layout() {
    let s = strategy(&[stage("ln1", "fc2", 2)], "", "1f1b", 1);
    check("fused_attention.onnx", 4, 2, &s, "fused-attention-dp");
    let s = strategy(
        &[stage("ln1", "proj", 2), stage("ln2", "fc2", 2)],
        "",
        "gpipe",
        2,
    );
    check("fused_attention.onnx", 4, 4, &s, "fused-attention-pipeline");
    let layers = [split("proj", 1, 1, 2), split("fc1", 1, 1, 2)].join(", ");
    let s = strategy(&[stage("ln1", "fc2", 2)], &layers, "1f1b", 1);
    check("fused_attention.onnx", 4, 2, &s, "fused-attention-soap");
}

/// The ONNX generator's mixture of experts (`fixtures/train/moe.onnx`: a router's top 2 of
/// 4 SwiGLU experts, the gates scattered by TopK's indices, a shared expert, a dense first
/// block) is one layer, `h.1.moe.top_k`, from its router to its gated sum; it trains as one
/// device data-parallel and pipelined with a stage starting at it, and a split of it by
/// parameters is refused by name.
#[test]
fn a_mixture_of_experts_trains_as_one_device() {
    let s = strategy(&[stage("embed_tokens", "lm_head", 2)], "", "1f1b", 1);
    check("moe.onnx", 4, 2, &s, "moe-dp");
    let s = strategy(
        &[
            stage("embed_tokens", "h.1.ln_2.normalize", 1),
            stage("h.1.moe.top_k", "lm_head", 2),
        ],
        "",
        "gpipe",
        2,
    );
    check("moe.onnx", 4, 3, &s, "moe-pipeline");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("strategy.json");
    let s = strategy(
        &[stage("embed_tokens", "lm_head", 2)],
        &split("h.1.moe.top_k", 1, 1, 2),
        "1f1b",
        1,
    );
    std::fs::write(&file, s).expect("write the strategy");
    let Err(e) = ralpc::compile(&ralpc::Options {
        model: fixture("moe.onnx"),
        gpus: Some(2),
        batch: Some(4),
        strategy_file: Some(file),
        ..Default::default()
    }) else {
        panic!("the experts were split by parameters");
    };
    let chain = format!("{e}{}", error_chain(&e));
    assert!(
        chain.contains("layer h.1.moe.top_k (experts) can only split samples"),
        "{chain}"
    );
}

/// The executor runs a mixture of experts as a dispatch (each token through the 2 experts
/// its router picked, the dense form's zero terms left out): the first step's logits
/// equal onnxruntime's dense forward pass of the same seeded weights and tokens
/// (`fixtures/numerics/moe.json`, onnxruntime 1.31.1), within 1e-4 of the output's RMS.
#[test]
fn a_dispatched_mixture_of_experts_computes_as_onnxruntime() {
    let report = plan_and_run(
        &ralpc::Options {
            model: fixture("moe.onnx"),
            gpus: Some(1),
            batch: Some(2),
            ..Default::default()
        },
        1,
    );
    let text = std::fs::read_to_string(common::fixture("numerics/moe.json")).expect("reference");
    let reference: serde_json::Value = serde_json::from_str(&text).expect("json");
    let output = &reference["outputs"][0];
    assert_eq!(output["stride"].as_u64(), Some(1));
    let want: Vec<f64> = output["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect();
    assert_eq!(report.first_output.len(), want.len());
    let rms = (want.iter().map(|w| w * w).sum::<f64>() / want.len() as f64).sqrt();
    for (i, (&got, &w)) in report.first_output.iter().zip(&want).enumerate() {
        assert!(
            (f64::from(got) - w).abs() <= rms * 1e-5 + 1e-4 * w.abs(),
            "logit {i}: {got} against onnxruntime's {w}"
        );
    }
}

#[test]
fn eight_ranks_in_four_stages_of_two() {
    let stages = [
        stage("conv0", "conv0", 2),
        stage("pool0", "conv1", 2),
        stage("pool1", "fc0", 2),
        stage("fc1", "fc1", 2),
    ];
    for schedule in ["1f1b", "zb-h1"] {
        let s = strategy(&stages, "", schedule, 4);
        check("cnn.onnx", 8, 8, &s, &format!("{schedule}-8"));
    }
}

#[test]
fn row_splits_of_convolutions_and_pooling_exchange_halos_and_equal_one_device() {
    // Rows of the first convolution (cut from the input), of pooling, of a convolution
    // fed by another layout, rows and channels at once, and rows over every rank.
    let layers = [
        split("conv0", 1, 2, 1),
        split("pool0", 1, 4, 1),
        split("conv1", 1, 2, 2),
        split("pool1", 2, 1, 1),
    ]
    .join(", ");
    let s = strategy(&[stage("conv0", "fc1", 4)], &layers, "1f1b", 1);
    check("cnn.onnx", 8, 4, &s, "rows-cnn");
    // In a pipeline of two microbatches.
    let layers = [split("conv0", 1, 2, 1), split("conv1", 1, 2, 1)].join(", ");
    let s = strategy(
        &[stage("conv0", "pool0", 2), stage("conv1", "fc1", 2)],
        &layers,
        "1f1b",
        2,
    );
    check("cnn.onnx", 8, 4, &s, "rows-pipeline");
}

/// A small GPT with its head tied to the token embedding (and the attention scale and
/// mask shared by both blocks), written where the test can run it.
fn tied_gpt(dir: &Path) -> PathBuf {
    let spec = ralpc_ir::models::GptSpec {
        ffn: 64,
        ..ralpc_ir::models::GptSpec::megatron(2, 32, 4, 8, 64)
    };
    let path = dir.join("gpt.onnx");
    std::fs::write(&path, ralpc_ir::models::gpt(&spec).expect("a valid GPT")).expect("write");
    path
}

#[test]
fn tied_weights_sum_their_gradients_over_every_use() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = tied_gpt(dir.path());
    let want = reference(&model, 4, 3);
    // Every use on the same ranks: the sum forms in place, all-reduced in one bucket.
    let s = strategy(&[stage("embed_tokens", "lm_head", 2)], "", "1f1b", 1);
    assert_same("tied-dp", &run_plan(&model, 4, 2, &s, 3), &want);
    // Embedding and head on different stages: their own all-reduce before the step.
    let s = strategy(
        &[
            stage("embed_tokens", "h.0.mlp.proj.dropout", 2),
            stage("h.1.ln_1", "lm_head", 2),
        ],
        "",
        "1f1b",
        2,
    );
    assert_same("tied-pipeline", &run_plan(&model, 4, 4, &s, 3), &want);
    // One stage, the embedding on fewer GPUs than the head.
    let layers = split("embed_tokens", 1, 1, 1);
    let s = strategy(&[stage("embed_tokens", "lm_head", 2)], &layers, "1f1b", 1);
    assert_same("tied-burst", &run_plan(&model, 4, 2, &s, 3), &want);
}

#[test]
fn an_initializer_merged_by_the_exporter_trains_as_one_weight_on_any_split() {
    // fc1 reads fc0's bias: the same split keeps one piece per rank, summed in place;
    // different splits or stages keep whole copies with their own all-reduce.
    let same = [split("fc0", 1, 1, 2), split("fc1", 1, 1, 2)].join(", ");
    let s = strategy(&[stage("fc0", "fc2", 2)], &same, "1f1b", 1);
    check("merged.onnx", 8, 2, &s, "merged-same-split");
    let different = [split("fc0", 2, 1, 2), split("fc1", 4, 1, 1)].join(", ");
    let s = strategy(&[stage("fc0", "fc2", 4)], &different, "1f1b", 1);
    check("merged.onnx", 8, 4, &s, "merged-different-splits");
    let s = strategy(
        &[stage("fc0", "fc0", 2), stage("fc1", "fc2", 1)],
        "",
        "gpipe",
        2,
    );
    check("merged.onnx", 8, 3, &s, "merged-pipeline");
    // ZeRO-3 releases a bucket's weights after its passes; the merged bias, read by a
    // layer of another bucket too, stays whole.
    let s = with_fields(
        &strategy(&[stage("fc0", "fc2", 4)], "", "1f1b", 2),
        r#""zero": 3"#,
    );
    check("merged.onnx", 8, 4, &s, "merged-zero3");
}

#[test]
fn weights_a_model_generates_are_seeded_and_trained_on_any_split() {
    // The ONNX zoo's "light" models make their weights with ConstantOfShape.
    let s = strategy(&[stage("fc0", "fc1", 4)], "", "1f1b", 1);
    check("generated.onnx", 8, 4, &s, "generated-dp");
    let layers = [split("fc0", 1, 1, 4), split("fc1", 1, 4, 1)].join(", ");
    let s = strategy(&[stage("fc0", "fc1", 4)], &layers, "1f1b", 1);
    check("generated.onnx", 8, 4, &s, "generated-soap");
}

#[test]
fn sequence_first_tensors_split_by_samples_on_their_batch_axis() {
    // `[tokens, batch, 16]` flows from to_seq_first to proj to to_batch_first.
    let s = strategy(&[stage("to_seq_first", "out", 2)], "", "1f1b", 1);
    check("seqfirst.onnx", 4, 2, &s, "seqfirst-dp");
    let s = strategy(
        &[
            stage("to_seq_first", "proj", 2),
            stage("to_batch_first", "out", 1),
        ],
        "",
        "gpipe",
        2,
    );
    check("seqfirst.onnx", 4, 3, &s, "seqfirst-pipeline");
}

#[test]
fn a_row_parallel_product_adds_its_fused_bias_once() {
    // `out` is MatMul+Add: split by input features, the first slice adds the bias to its
    // partial sum and the others zeros, before the sum.
    let layers = split("out", 1, 2, 1);
    let s = strategy(&[stage("to_seq_first", "out", 2)], &layers, "1f1b", 1);
    check("seqfirst.onnx", 4, 2, &s, "seqfirst-row-parallel-bias");
}

/// `strategy` with extra top-level fields (`"zero": 1`, `"recompute": […]`).
fn with_fields(strategy: &str, fields: &str) -> String {
    strategy.replacen('{', &format!("{{ {fields},"), 1)
}

fn run(first: &str, last: &str) -> String {
    format!(r#"{{ "first_layer": "{first}", "last_layer": "{last}" }}"#)
}

#[test]
fn a_sharded_optimizer_and_recomputation_train_the_same_as_one_device() {
    // ZeRO-1 on replicas of two pipeline stages, then with a parameter-split layer whose
    // replica groups interleave.
    let stages = [stage("conv0", "pool0", 2), stage("conv1", "fc1", 2)];
    let s = with_fields(&strategy(&stages, "", "1f1b", 2), r#""zero": 1"#);
    check("cnn.onnx", 8, 4, &s, "zero-1f1b");
    let layers = split("fc0", 2, 1, 2);
    let s = with_fields(
        &strategy(&[stage("conv0", "fc1", 4)], &layers, "gpipe", 2),
        r#""zero": 1"#,
    );
    check("cnn.onnx", 8, 4, &s, "zero-soap");
    // ZeRO-2 (every microbatch's gradients reduce-scattered into the shard) and ZeRO-3
    // (the weights gathered before every pass) over the same two layouts.
    let s = with_fields(&strategy(&stages, "", "1f1b", 2), r#""zero": 2"#);
    check("cnn.onnx", 8, 4, &s, "zero2-1f1b");
    let s = with_fields(
        &strategy(&[stage("conv0", "fc1", 4)], &layers, "gpipe", 2),
        r#""zero": 3"#,
    );
    check("cnn.onnx", 8, 4, &s, "zero3-soap");
    // Recomputation of a run on each stage (one holds an input from the stage before),
    // alone and with ZeRO-1.
    let runs = format!(
        r#""recompute": [{}, {}]"#,
        run("conv0", "conv0"),
        run("conv1", "fc0")
    );
    let s = with_fields(&strategy(&stages, "", "1f1b", 2), &runs);
    check("cnn.onnx", 8, 4, &s, "recompute-1f1b");
    let s = with_fields(
        &strategy(&stages, "", "gpipe", 2),
        &format!(r#"{runs}, "zero": 1"#),
    );
    check("cnn.onnx", 8, 4, &s, "recompute-zero-gpipe");
    // A run holding a parameter split: its gathers and reductions run again.
    let soap = strategy(
        &[stage("conv0", "fc1", 4)],
        &split("fc0", 2, 1, 2),
        "1f1b",
        1,
    );
    let s = with_fields(&soap, &format!(r#""recompute": [{}]"#, run("fc0", "fc1")));
    check("cnn.onnx", 8, 4, &s, "recompute-soap");
    // A transformer block recomputed whole, and its attention core alone.
    for runs in [run("ln1", "fc2"), run("softmax", "softmax")] {
        let s = with_fields(
            &strategy(&[stage("ln1", "fc2", 2)], "", "1f1b", 2),
            &format!(r#""recompute": [{runs}], "zero": 1"#),
        );
        check("transformer.onnx", 4, 2, &s, &format!("transformer {runs}"));
    }
}

#[test]
fn recomputed_runs_and_zero_stages_a_layered_plan_cannot_take_are_refused_by_name() {
    let model = fixture("cnn.onnx");
    let stages = [stage("conv0", "pool0", 2), stage("conv1", "fc1", 2)];
    let base = strategy(&stages, "", "1f1b", 2);
    let async_base = strategy(&stages, "", "async", 2);
    for (s, expected) in [
        (with_fields(&base, r#""zero": 4"#), "zero is 4"),
        (
            with_fields(&async_base, r#""zero": 1"#),
            "synchronous schedule",
        ),
        (
            with_fields(
                &base,
                &format!(r#""recompute": [{}]"#, run("conv0", "conv1")),
            ),
            "inside one stage",
        ),
        (
            with_fields(
                &base,
                &format!(r#""recompute": [{}]"#, run("conv0", "nope")),
            ),
            r#"recompute[0].last_layer: no layer or module is named "nope""#,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("strategy.json");
        std::fs::write(&file, &s).unwrap();
        let options = ralpc::Options {
            model: model.clone(),
            gpus: Some(4),
            batch: Some(8),
            strategy_file: Some(file),
            ..Default::default()
        };
        let Err(e) = ralpc::compile(&options) else {
            panic!("{s} was accepted");
        };
        let text = format!("{e}{}", error_chain(&e));
        assert!(text.contains(expected), "{expected}: {text}");
    }
}

/// Megatron's tensor-parallel split of one of a GPT's layers over `t` ranks (after `d`
/// sample shards): QKV, the MLP's first product and the LM head (by vocabulary) by
/// columns, the attention core by heads, the projections by rows; everything else
/// replicated over the group.
fn megatron_split(name: &str, d: u32, t: u32) -> String {
    let (a, p) = if name.ends_with("qkv.matmul")
        || name.ends_with("fc.matmul")
        || name.ends_with("attn.softmax")
        || name == "lm_head"
    {
        (1, t)
    } else {
        (t, 1)
    };
    split(name, d, a, p)
}

fn gpt_layers(layers: u32) -> Vec<String> {
    let mut names = vec!["embed_tokens".to_string(), "embed.dropout".to_string()];
    for i in 0..layers {
        for part in [
            "ln_1",
            "attn.qkv.matmul",
            "attn.softmax",
            "attn.proj.matmul",
            "attn.proj.dropout",
            "ln_2",
            "mlp.fc.matmul",
            "mlp.proj.matmul",
            "mlp.proj.dropout",
        ] {
            names.push(format!("h.{i}.{part}"));
        }
    }
    names.extend(["ln_f".to_string(), "lm_head".to_string()]);
    names
}

#[test]
fn megatron_tensor_parallelism_trains_the_same_as_one_device() {
    for tied in [false, true] {
        megatron_gpt_trains_the_same_as_one_device(tied);
    }
}

/// A GPT (head tied to the embedding or not) at t=2: alone, with d=2, with p=2 × d=2,
/// and so with ZeRO-1 and full or selective recomputation.
fn megatron_gpt_trains_the_same_as_one_device(tied: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = ralpc_ir::models::GptSpec {
        tied,
        ..ralpc_ir::models::GptSpec::megatron(2, 64, 4, 16, 128)
    };
    let model = dir.path().join("gpt.onnx");
    std::fs::write(&model, ralpc_ir::models::gpt(&spec).expect("a valid GPT")).expect("write");
    let want = reference(&model, 8, 3);
    let layers = |d| {
        gpt_layers(2)
            .iter()
            .map(|n| megatron_split(n, d, 2))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let whole = [stage("embed_tokens", "lm_head", 2)];
    let s = strategy(&whole, &layers(1), "1f1b", 1);
    assert_same(
        &format!("t2 tied {tied}"),
        &run_plan(&model, 8, 2, &s, 3),
        &want,
    );
    let s = strategy(
        &[stage("embed_tokens", "lm_head", 4)],
        &layers(2),
        "1f1b",
        2,
    );
    assert_same(
        &format!("t2 d2 tied {tied}"),
        &run_plan(&model, 8, 4, &s, 3),
        &want,
    );
    let stages = [
        stage("embed_tokens", "h.0.mlp.proj.dropout", 4),
        stage("h.1.ln_1", "lm_head", 4),
    ];
    let s = strategy(&stages, &layers(2), "1f1b", 2);
    assert_same(
        &format!("t2 p2 d2 tied {tied}"),
        &run_plan(&model, 8, 8, &s, 3),
        &want,
    );
    // With ZeRO-1, and each block recomputed whole (full: the tensor-parallel collectives
    // run again) or its attention core alone (selective).
    for runs in [
        [
            run("h.0.ln_1", "h.0.mlp.proj.dropout"),
            run("h.1.ln_1", "h.1.mlp.proj.dropout"),
        ],
        [
            run("h.0.attn.softmax", "h.0.attn.softmax"),
            run("h.1.attn.softmax", "h.1.attn.softmax"),
        ],
    ] {
        let fields = format!(r#""recompute": [{}], "zero": 1"#, runs.join(", "));
        let s = with_fields(&strategy(&stages, &layers(2), "1f1b", 2), &fields);
        let what = format!("t2 p2 d2 tied {tied} {fields}");
        assert_same(&what, &run_plan(&model, 8, 8, &s, 3), &want);
    }
}

/// A Llama (rotary positions, RMSNorm, SwiGLU, no biases) with grouped-query attention
/// (4 query heads sharing 2 key/value heads) planned as Megatron-LM trains one: t=2 alone,
/// with d=2, and with p=2 × d=2, each the same as one device.
#[test]
fn megatron_tensor_parallelism_of_a_llama_trains_the_same_as_one_device() {
    use ralpc::passes::transformer::{Knobs, Recompute};
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = ralpc_ir::models::GptSpec::llama(2, 64, 4, 2, 96, 16, 128);
    let model = dir.path().join("llama.onnx");
    std::fs::write(&model, ralpc_ir::models::gpt(&spec).expect("a valid Llama")).expect("write");
    let want = reference(&model, 8, 3);
    for (gpus, pipeline) in [(2, 1), (4, 1), (8, 2)] {
        let options = ralpc::Options {
            model: model.clone(),
            gpus: Some(gpus),
            batch: Some(8),
            family: ralpc::passes::plan::Family::parse("3d"),
            knobs: Knobs {
                tensor: Some(2),
                pipeline: Some(pipeline),
                micro_batch: Some(2),
                recompute: Some(Recompute::None),
                ..Knobs::default()
            },
            executable: true,
            ..Default::default()
        };
        let what = format!("Llama t2 p{pipeline} on {gpus} ranks");
        assert_same(&what, &plan_and_run(&options, 3), &want);
    }
}

#[test]
fn a_torch_exports_attention_adding_the_qkv_bias_splits_by_heads_as_one_device() {
    // The TorchScript export adds the QKV bias inside the attention core (`Add(bias, mm)`)
    // and splits Q, K, V by a constant: the bias is cut by the same groups as the columns.
    let model = common::fixture("onnx/gpt2_torchscript/model.onnx");
    // One step at batch 2: the model is GPT-2's size on the CPU.
    let want = reference(&model, 2, 1);
    let layers = [
        split("/blocks.0/qkv/MatMul", 1, 1, 2),
        split("/blocks.0/Softmax", 1, 1, 2),
    ]
    .join(", ");
    let s = strategy(
        &[stage("/wte/Gather", "/head/MatMul", 2)],
        &layers,
        "1f1b",
        1,
    );
    assert_same("torchscript heads", &run_plan(&model, 2, 2, &s, 1), &want);
}

#[test]
fn branches_chosen_by_shapes_are_inlined_and_trained_on_any_split() {
    // branches.onnx: nested Ifs on the batch and the width; at batch 8 the taken branch
    // runs a CumSum and adds a bias that is the branch's own initializer.
    let s = strategy(&[stage("fc0", "fc1", 4)], "", "1f1b", 1);
    check("branches.onnx", 8, 4, &s, "branches-dp");
    let s = strategy(
        &[stage("fc0", "fc0", 2), stage("cumsum", "fc1", 2)],
        &split("fc1", 1, 1, 2),
        "gpipe",
        2,
    );
    check("branches.onnx", 8, 4, &s, "branches-pipeline-soap");
}

#[test]
fn values_computed_from_constants_are_computed_by_every_layer_reading_them() {
    // anchors.onnx: a grid built from a feature map's width (not folded: Sqrt) is read by
    // both convolution layers; the second computes it where it runs.
    let s = strategy(
        &[stage("conv", "conv", 2), stage("conv2", "fc", 2)],
        "",
        "gpipe",
        2,
    );
    check("anchors.onnx", 8, 4, &s, "anchors-pipeline");
    let s = strategy(
        &[stage("conv", "fc", 4)],
        &split("conv2", 2, 1, 2),
        "1f1b",
        1,
    );
    check("anchors.onnx", 8, 4, &s, "anchors-soap");
}

#[test]
fn a_loop_over_time_steps_is_unrolled_and_trains_as_one_device() {
    // loop.onnx: TensorFlow's way of writing a recurrent layer, a Loop whose condition
    // compares a carried counter with the sequence length; unrolled when the batch is bound.
    let s = strategy(&[stage("to_time_major", "fc", 4)], "", "1f1b", 1);
    check("loop.onnx", 8, 4, &s, "loop-dp");
    let s = strategy(
        &[
            stage("to_time_major", "while/iteration2/input_product", 2),
            stage("while/iteration3/step_input", "fc", 2),
        ],
        "",
        "gpipe",
        2,
    );
    check("loop.onnx", 8, 4, &s, "loop-pipeline");
}

#[test]
fn a_transposed_convolution_split_by_output_channels_trains_as_one_device() {
    // unet.onnx: its ConvTranspose's weight is [C_in, C_out, 2, 2], cut on axis 1 by output
    // channels, its bias on axis 0; the convolution after the skip concatenation split by
    // rows (halos) and the first by output channels, on a 2-stage pipeline too.
    let layers = [
        split("down", 1, 1, 4),
        split("up", 1, 1, 4),
        split("fuse", 1, 4, 1),
    ]
    .join(", ");
    let s = strategy(&[stage("down", "fc", 4)], &layers, "1f1b", 1);
    check("unet.onnx", 8, 4, &s, "unet-soap");
    let layers = [split("up", 1, 1, 2), split("fuse", 1, 2, 1)].join(", ");
    let s = strategy(
        &[stage("down", "mid", 2), stage("up", "fc", 2)],
        &layers,
        "1f1b",
        2,
    );
    check("unet.onnx", 8, 4, &s, "unet-pipeline");
}

#[test]
fn a_1d_convolution_split_by_rows_trains_as_one_device() {
    // conv1d.onnx: the second convolution's output leaves its layer through a LeakyRelu as
    // `[batch, channels, length]`; split by rows (its length, halos exchanged), its share
    // is cut on the length axis, channels first.
    let layers = [split("conv0", 1, 1, 4), split("conv1", 1, 4, 1)].join(", ");
    let s = strategy(&[stage("conv0", "fc", 4)], &layers, "1f1b", 1);
    check("conv1d.onnx", 8, 4, &s, "conv1d-soap");
    let s = strategy(
        &[stage("conv0", "pool", 2), stage("conv1", "fc", 2)],
        &split("conv1", 1, 2, 1),
        "1f1b",
        1,
    );
    check("conv1d.onnx", 8, 4, &s, "conv1d-pipeline");
}

/// A transposed convolution has no window the pieces of a row split could exchange
/// halos through: a strategy splitting its rows is refused when planned, naming it,
/// rather than failing when it runs (the SOAP search never proposes it:
/// `passes` `a_layer_without_a_window_is_never_split_by_rows`).
#[test]
fn a_transposed_convolution_is_never_split_by_rows() {
    let model = fixture("unet.onnx");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("strategy.json");
    let s = strategy(&[stage("down", "fc", 4)], &split("up", 1, 4, 1), "1f1b", 1);
    std::fs::write(&file, s).expect("write the strategy");
    let planned = ralpc::compile(&ralpc::Options {
        model,
        gpus: Some(4),
        batch: Some(8),
        strategy_file: Some(file),
        ..Default::default()
    });
    let Err(e) = planned else {
        panic!("a row split of a transposed convolution was planned");
    };
    assert_eq!(e.exit_code(), 1);
    let chain = format!("{e}{}", error_chain(&e));
    assert!(
        chain.contains("layer up: its rows cannot be split"),
        "{chain}"
    );
}

#[test]
fn pixel_shuffles_instance_norms_and_tiles_train_as_one_device() {
    // upscale.onnx: InstanceNormalization, PRelu, DepthToSpace, Mish, SpaceToDepth, Tile.
    let s = strategy(&[stage("conv0", "fc", 4)], "", "1f1b", 1);
    check("upscale.onnx", 8, 4, &s, "upscale-dp");
    let s = strategy(
        &[stage("conv0", "conv1", 2), stage("shuffle", "fc", 2)],
        &split("conv0", 1, 1, 2),
        "gpipe",
        2,
    );
    check("upscale.onnx", 8, 4, &s, "upscale-pipeline-channels");
}

#[test]
fn a_state_holding_the_batch_on_axis_1_and_integers_between_layers_train_as_one_device() {
    // recurrent.onnx: a GRU from an initial state [1, batch, 8]: each rank gets its samples
    // of the state on axis 1. A flag computed from an integer input (Less → bool) is its own
    // layer: on a pipeline it crosses stages as a message.
    let s = strategy(&[stage("to_seq_first", "fc", 4)], "", "1f1b", 1);
    check("recurrent.onnx", 8, 4, &s, "recurrent-dp");
    let s = strategy(
        &[stage("to_seq_first", "low_rate", 2), stage("flag", "fc", 2)],
        "",
        "gpipe",
        2,
    );
    check("recurrent.onnx", 8, 4, &s, "recurrent-pipeline");
}

#[test]
fn a_three_dimensional_cnn_trains_the_same_on_any_split_of_its_samples_and_channels() {
    // video.onnx: Conv3d, MaxPool3d, AveragePool3d over clips of 4 frames.
    let s = strategy(&[stage("conv0", "fc", 4)], "", "1f1b", 1);
    check("video.onnx", 8, 4, &s, "video-dp");
    let layers = [split("conv0", 2, 1, 2), split("conv1", 1, 1, 4)].join(", ");
    let s = strategy(
        &[stage("conv0", "pool0", 4), stage("conv1", "fc", 4)],
        &layers,
        "gpipe",
        2,
    );
    check("video.onnx", 8, 8, &s, "video-soap-pipeline");
}

#[test]
fn a_recurrent_layer_split_by_its_gates_trains_as_one_device() {
    // recurrent.onnx's GRU (reset before its recurrent product: two exchanges a step) on
    // gate pieces of its 8 hidden units, with and without a sample split beside them.
    let s = strategy(
        &[stage("to_seq_first", "fc", 4)],
        &split("gru", 2, 1, 2),
        "1f1b",
        1,
    );
    check("recurrent.onnx", 8, 4, &s, "recurrent-gates-2x2");
    let s = strategy(
        &[stage("to_seq_first", "fc", 4)],
        &split("gru", 1, 1, 4),
        "gpipe",
        2,
    );
    check("recurrent.onnx", 8, 4, &s, "recurrent-gates-4");
    // lstm.onnx: a bidirectional, batch-major LSTM whose 6 hidden units cut 4 ways give
    // pieces of 1 and 2 units; then on the first stage of a pipeline.
    let s = strategy(
        &[stage("lstm", "fc", 4)],
        &split("lstm", 1, 1, 4),
        "1f1b",
        1,
    );
    check("lstm.onnx", 8, 4, &s, "lstm-gates-4");
    let s = strategy(
        &[stage("lstm", "lstm", 2), stage("flatten", "fc", 2)],
        &split("lstm", 1, 1, 2),
        "gpipe",
        2,
    );
    check("lstm.onnx", 8, 4, &s, "lstm-gates-pipeline");
}

/// A split of a recurrence's gates into more pieces than it has hidden units is refused
/// by name when planned, never run with empty pieces.
#[test]
fn a_recurrence_is_never_split_into_more_pieces_than_hidden_units() {
    let model = fixture("lstm.onnx");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("strategy.json");
    let s = strategy(
        &[stage("lstm", "fc", 8)],
        &split("lstm", 1, 1, 8),
        "1f1b",
        1,
    );
    std::fs::write(&file, s).expect("write the strategy");
    let planned = ralpc::compile(&ralpc::Options {
        model,
        gpus: Some(8),
        batch: Some(8),
        strategy_file: Some(file),
        ..Default::default()
    });
    let Err(e) = planned else {
        panic!("6 hidden units were split 8 ways");
    };
    assert_eq!(e.exit_code(), 1);
    let chain = format!("{e}{}", error_chain(&e));
    assert!(
        chain.contains("layer lstm: its 6 hidden units cannot be split into 8 pieces"),
        "{chain}"
    );
}

#[test]
fn weights_a_dead_step_reads_first_are_all_reduced_with_their_layers() {
    // nakdimon (TensorFlow LSTMs as Loops) computes a first step outside each loop that
    // only its shape is used of; its weights were counted there, in no layer, so no bucket
    // all-reduced their gradients and 2 data-parallel ranks trained apart (~90 % off).
    let model = common::fixture("corpus/nakdimon/model.onnx");
    let options = |gpus| ralpc::Options {
        model: model.clone(),
        gpus: Some(gpus),
        batch: Some(8),
        family: Some(ralpc_passes::plan::Family::Dp),
        tolerance: Some(1000.0),
        inputs: [("input_1".to_string(), vec![8, 2])].into_iter().collect(),
        ..Default::default()
    };
    assert_same(
        "nakdimon-dp",
        &plan_and_run(&options(2), 1),
        &plan_and_run(&options(1), 1),
    );
}

#[test]
fn batch_normalization_under_split_samples_uses_the_whole_batch() {
    // densenet.onnx: BN → ReLU → Conv, the second BN on a concatenation. Every rank
    // normalizes by the statistics of the samples of all its layer's ranks, and its input
    // gradient by their batch terms: as one device normalizes by the whole batch.
    let s = strategy(&[stage("conv0", "fc", 4)], "", "1f1b", 1);
    check("densenet.onnx", 8, 4, &s, "densenet-dp");
    // 3 ranks for 8 samples (3, 3, 2), and output channels split beside the samples.
    let layers = [split("conv0", 2, 1, 2), split("conv2", 3, 1, 1)].join(", ");
    let s = strategy(&[stage("conv0", "fc", 4)], &layers, "1f1b", 1);
    check("densenet.onnx", 8, 4, &s, "densenet-burst-soap");
}

#[test]
fn batch_normalization_split_by_rows_uses_the_whole_batch() {
    // Each normalization is a layer of its own (with its ReLU), here split by rows; the
    // convolutions after them read a halo row of their neighbours'. Every rank normalizes
    // by the statistics of all its layer's rows and samples, as one device does.
    let rows = |a: u32, s: u32| {
        ["norm1", "conv1", "norm2", "conv2"]
            .map(|l| split(l, s, a, 1))
            .join(", ")
    };
    let s = strategy(&[stage("conv0", "fc", 2)], &rows(2, 1), "1f1b", 1);
    check("densenet.onnx", 8, 2, &s, "densenet-rows");
    let s = strategy(&[stage("conv0", "fc", 4)], &rows(2, 2), "1f1b", 1);
    check("densenet.onnx", 8, 4, &s, "densenet-rows-and-samples");
}

#[test]
fn an_output_cut_by_channels_before_unit_axes_trains_as_one_device() {
    // caffe.onnx ends in a 1×1 convolution to [N, 6, 1, 1], as the ONNX zoo's Caffe2
    // classifiers do: its 6 classes are on axis 1. Split by channels, a rank's share is a
    // run of channels in every sample: squared error takes each run's loss where it lies,
    // cross-entropy exchanges the rows' statistics as for a vocabulary-parallel head. Its
    // scale and shift enter through Unsqueeze and train as one device trains them.
    use ralpc::runtime::cpu::train::Loss;
    let model = fixture("caffe.onnx");
    for loss in [Loss::Mse, Loss::CrossEntropy] {
        let run = |plan: PathBuf| ralpc::RunOptions {
            plan,
            model: Some(model.clone()),
            steps: 3,
            loss: Some(loss),
            ..Default::default()
        };
        let want = ralpc::train_single_device(&model, 8, &run(PathBuf::new()))
            .expect("single-device training");
        // Cross-entropy over 6 classes, not over the size-1 last axis (which is 0).
        assert!(want.losses[0] > 0.1, "{loss:?}: {:?}", want.losses);
        for (gpus, split) in [(2, split("fc", 1, 1, 2)), (4, split("fc", 2, 1, 2))] {
            let dir = tempfile::tempdir().expect("temp dir");
            let file = dir.path().join("strategy.json");
            let s = strategy(&[stage("conv0", "fc", gpus)], &split, "1f1b", 1);
            std::fs::write(&file, s).expect("write the strategy");
            ralpc::compile(&ralpc::Options {
                model: model.clone(),
                gpus: Some(gpus),
                batch: Some(8),
                strategy_file: Some(file),
                ..Default::default()
            })
            .expect("plans")
            .write(dir.path())
            .expect("writes");
            let got = ralpc::run(&run(dir.path().to_path_buf()))
                .unwrap_or_else(|e| panic!("run: {e}{}", error_chain(&e)))
                .report;
            assert_same(&format!("caffe, {loss:?}, fc split {split}"), &got, &want);
        }
    }
}

/// A model exported at a fixed batch and planned at that batch: every rank runs its share
/// of the samples (or of a microbatch) through the Reshape whose constant target leads with
/// the exported batch, re-batched as the verifier re-batches it.
#[test]
fn a_fixed_batch_export_splits_its_batch_as_one_device() {
    let model = fixture("fixedbatch.onnx");
    let want = reference(&model, 4, 3);
    let dp = strategy(&[stage("conv", "fc", 2)], "", "1f1b", 1);
    assert_same("fixed batch, dp2", &run_plan(&model, 4, 2, &dp, 3), &want);
    let pipeline = strategy(
        &[stage("conv", "conv", 1), stage("fc", "fc", 1)],
        "",
        "1f1b",
        2,
    );
    assert_same(
        "fixed batch, 2 stages of 2 microbatches",
        &run_plan(&model, 4, 2, &pipeline, 3),
        &want,
    );
}

#[test]
fn dense_layers_on_channels_last_tensors_split_by_output_features_train_as_one_device() {
    // channels_last.onnx: a Swin-like MLP on `[batch, h, w, c]`. The first dense layer is
    // split by output features; its cut follows the last axis through the layers after it
    // (the IsNaN guard, the Where), which are not NCHW images though they have four axes.
    let layers = [
        split("norm", 2, 1, 1),
        split("fc1", 1, 1, 4),
        split("isnan", 1, 1, 4),
        split("guard", 1, 1, 4),
        split("fc2", 1, 4, 1),
    ]
    .join(", ");
    let s = strategy(&[stage("norm", "head", 4)], &layers, "1f1b", 1);
    check("channels_last.onnx", 8, 4, &s, "channels-last-soap");
}

#[test]
fn a_column_parallel_bias_added_before_the_product_trains_as_one_device() {
    // bias_first.onnx: `Add(bias, x·W)`, as the TorchScript exporter writes a Hugging Face
    // `Linear`, then a reshape into heads that the layer leaves as `[b, s, heads, d]`: the
    // bias is cut by the output features the rank holds, not by that output's axes.
    let layers = [split("q", 2, 1, 2), split("o", 1, 2, 1)].join(", ");
    let s = strategy(&[stage("q", "head", 4)], &layers, "1f1b", 1);
    check("bias_first.onnx", 8, 4, &s, "bias-first-columns");
}

/// A model traced at a fixed batch merges its heads back with `Reshape([4, 6, -1])`, as the
/// TorchScript exporter writes Hugging Face GPT-2's. Run at batch 2, the inferred entry
/// would fit `[4, 6, 8]` by moving samples into the features; re-batched first, two
/// samples train exactly as the same two twice over at the exported batch, and a
/// pipeline of two microbatches at the exported batch as one device.
#[test]
fn a_fixed_batch_reshape_with_an_inferred_entry_keeps_its_samples_apart() {
    let model = fixture("mergeheads.onnx");
    let dir = tempfile::tempdir().expect("temp dir");
    let x: Vec<f64> = (0..2 * 6 * 8)
        .map(|i| ((i * 37 % 23) as f64 - 11.0) / 7.0)
        .collect();
    let labels = [3, 1];
    let write = |name: &str, copies: usize| {
        let path = dir.path().join(name);
        let data = serde_json::json!({
            "inputs": { "x": x.repeat(copies) },
            "labels": labels.repeat(copies),
        });
        std::fs::write(&path, data.to_string()).expect("write data");
        path
    };
    let run = |batch: u64, data: std::path::PathBuf| {
        let plan = dir.path().join(format!("plan{batch}"));
        let compiled = ralpc::compile(&ralpc::Options {
            model: model.clone(),
            gpus: Some(1),
            batch: Some(batch),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("plan: {e}{}", error_chain(&e)));
        compiled.write(&plan).expect("write the plan");
        ralpc::run(&ralpc::RunOptions {
            plan,
            model: Some(model.clone()),
            steps: 3,
            data: Some(data),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("run: {e}{}", error_chain(&e)))
        .report
        .losses
    };
    let two = run(2, write("two.json", 1));
    let twice = run(4, write("twice.json", 2));
    for (a, b) in two.iter().zip(&twice) {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs(),
            "batch 2 {two:?}, batch 4 {twice:?}"
        );
    }
    let want = reference(&model, 4, 3);
    let pipeline = strategy(
        &[stage("q", "softmax", 1), stage("unswap", "head", 1)],
        "",
        "1f1b",
        2,
    );
    assert_same(
        "merged heads, 2 stages of 2 microbatches",
        &run_plan(&model, 4, 2, &pipeline, 3),
        &want,
    );
}
