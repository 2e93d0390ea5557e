//! Models exported by PyTorch's two ONNX exporters train as PyTorch trains them
//! (`fixtures/torch/`, made by its `gen.py` with torch 2.15): the same parameters, and the
//! same loss over three SGD steps on the same batch, on one rank and on two. Each case is
//! a way an exporter writes parameters: merged by value and named by Identities
//! (`nn.TransformerEncoder`'s deep-copied layers), a group norm's constant ones and
//! zeros, an attention mask folded into an initializer of -inf, a buffer `torch.export`
//! lifted into an initializer (a Llama's rotary frequencies); dense layers on
//! `[b, h, w, c]` tensors (Swin's); Hugging Face's GPT-2. The decoders also train split by
//! heads, as Megatron-LM splits them.

mod common;

use std::path::Path;

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(common::fixture("torch/expected.json")).expect("expected");
    serde_json::from_str(&text).expect("JSON")
}

/// What PyTorch measured of `case`.
struct Expected {
    losses: Vec<f64>,
    parameters: u64,
    /// The input `x`'s shape, the batch first.
    input: Vec<u64>,
}

fn pytorch(case: &str) -> Expected {
    let all = expected();
    let e = &all[case];
    let losses = e["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|l| l.as_f64().expect("a loss"))
        .collect();
    let parameters = e["parameters"].as_u64().expect("parameters");
    let input = e["input"]
        .as_array()
        .expect("input")
        .iter()
        .map(|d| d.as_u64().expect("a dimension"))
        .collect();
    Expected {
        losses,
        parameters,
        input,
    }
}

/// The shape of `x` to plan at: a dynamic sequence is bound as PyTorch ran it.
fn inputs(input: &[u64]) -> std::collections::BTreeMap<String, Vec<u64>> {
    [("x".to_owned(), input.to_vec())].into()
}

/// Three steps of `case` planned data parallel on `gpus` ranks, on its input.
fn train(case: &str, gpus: u32, input: &[u64], dir: &Path) -> Vec<f64> {
    train_as(
        case,
        gpus,
        input,
        dir,
        ralpc::passes::plan::Family::Dp,
        None,
    )
}

/// Three steps of `case` planned as `family` (with Megatron's `knobs`) on `gpus` ranks.
fn train_as(
    case: &str,
    gpus: u32,
    input: &[u64],
    dir: &Path,
    family: ralpc::passes::plan::Family,
    knobs: Option<ralpc::passes::transformer::Knobs>,
) -> Vec<f64> {
    let model = common::fixture(&format!("torch/{case}.onnx"));
    let compiled = ralpc::compile(&ralpc::Options {
        model: model.clone(),
        gpus: Some(gpus),
        batch: input.first().copied(),
        inputs: inputs(input),
        family: Some(family),
        knobs: knobs.unwrap_or_default(),
        executable: true,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{case}: {}", ralpc::runtime::error_chain(&e)));
    compiled.write(dir).expect("write the plan");
    let run = ralpc::run(&ralpc::RunOptions {
        plan: dir.to_path_buf(),
        steps: 3,
        data: Some(common::fixture(&format!("torch/{case}.data.json"))),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{case}: {}", ralpc::runtime::error_chain(&e)));
    assert_eq!(run.ranks, gpus, "{case}");
    run.report.losses
}

/// Whether `got` are PyTorch's losses `want` (within 2e-6 relative), saying `what` ran.
fn assert_pytorch(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (step, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 2e-6 * w.abs(),
            "{what}, step {step}: loss {g}, PyTorch {w}"
        );
    }
}

fn check(case: &str) {
    check_on(case, &[1, 2]);
}

/// `case` has PyTorch's parameters and trains as PyTorch on each of `gpus`.
fn check_on(case: &str, gpus: &[u32]) {
    let Expected {
        losses: want,
        parameters,
        input,
    } = pytorch(case);
    let inspection = ralpc::inspect(&ralpc::InspectOptions {
        model: common::fixture(&format!("torch/{case}.onnx")),
        batch: input.first().copied(),
        inputs: inputs(&input),
        ..Default::default()
    })
    .expect("inspect");
    assert_eq!(
        inspection.params, parameters,
        "{case}: PyTorch's parameters"
    );
    for &gpus in gpus {
        let dir = tempfile::tempdir().expect("temp dir");
        let got = train(case, gpus, &input, dir.path());
        assert_pytorch(&format!("{case} on {gpus} ranks"), &got, &want);
    }
}

#[test]
fn a_transformer_encoders_merged_layers_train_apart() {
    check("encoder_ts");
}

#[test]
fn a_group_norms_constants_do_not_train() {
    check("groupnorm_dynamo");
}

#[test]
fn a_folded_attention_mask_does_not_train() {
    check("mask_dynamo");
    check("mask_ts");
}

#[test]
fn dense_layers_on_channels_last_tensors_train_as_pytorch() {
    check("swin_dynamo");
}

#[test]
fn a_llama_decoder_trains_as_pytorch() {
    // RMSNorm, rotary positions, grouped-query attention, SwiGLU, no biases.
    check("llama_dynamo");
}

#[test]
fn hugging_faces_gpt2_trains_as_pytorch() {
    check("hf_gpt2_ts");
}

/// Today's Hugging Face decoders as transformers 5.25 exports them: Qwen3 (norms of each
/// head's queries and keys), Qwen2 (biases on Q, K and V alone), Phi-3 (fused Q/K/V and
/// gate/up projections) have PyTorch's parameters and train as PyTorch on 1 and 2 ranks;
/// Qwen2 also split by heads as Megatron-LM splits it.
#[test]
fn todays_hugging_face_decoders_train_as_pytorch() {
    for case in ["qwen3_dynamo", "qwen2_dynamo", "phi3_dynamo"] {
        check(case);
    }
    split_by_heads("qwen2_dynamo");
}

/// The Llama decoder planned as Megatron-LM trains one: its 4 query and 2 key/value heads,
/// SwiGLU's gate and up projections by columns and its down projection by rows over 2
/// tensor-parallel ranks, the rotary angles and causal mask (broadcast over the heads)
/// read whole by each; with 2 data-parallel replicas, then in 2 pipeline stages.
#[test]
fn a_llama_decoder_split_by_heads_trains_as_pytorch() {
    split_by_heads("llama_dynamo");
}

/// The Llama decoder's tensor-parallel traffic is Megatron-LM's kind: the row-parallel
/// partial sums (the embedding's, both projections') reduce-scattered, never all-reduced,
/// since what reads them after (the RMSNorms' decomposed ops, the next block's residual
/// added in a projection's epilogue) takes its sequence piece; and only the hidden width
/// all-gathered, never SwiGLU's inner width (the up projection reads its columns of
/// silu(gate) where the gate projection left them), once for the Q, K and V projections
/// and once for the gate and up projections, as Megatron-LM gathers for its fused ones;
/// backward, their input gradients are summed and reduce-scattered once, and the
/// gradients of a projection's output (read by the next RMSNorm's ops and the residual)
/// summed and all-gathered once.
#[test]
fn a_llama_decoders_tensor_parallel_traffic_is_megatrons() {
    use ralpc::passes::transformer::{Knobs, Recompute};
    let Expected { input, .. } = pytorch("llama_dynamo");
    let knobs = Knobs {
        tensor: Some(2),
        pipeline: Some(1),
        micro_batch: Some(2),
        recompute: Some(Recompute::None),
        ..Knobs::default()
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let family = ralpc::passes::plan::Family::parse("3d").expect("3d");
    train_as("llama_dynamo", 4, &input, dir.path(), family, Some(knobs));
    let text = std::fs::read_to_string(dir.path().join("plan.json")).expect("plan.json");
    let plan: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let program = plan["programs"][0].as_array().expect("rank 0's program");
    let forwards_end = program
        .iter()
        .rposition(|i| i["op"] == "forward")
        .expect("a forward pass");
    let (forward, backward) = program.split_at(forwards_end + 1);
    let count = |op: &str| forward.iter().filter(|i| i["op"] == op).count();
    assert_eq!(count("all_reduce"), 0, "partial sums all-reduced");
    // The embedding's and two projections per block (the fixture has two blocks).
    assert_eq!(count("reduce_scatter"), 1 + 2 * 2);
    // A rank's 2 of 4 samples × 8 positions × hidden 32, fp32; the loss's statistics
    // (three floats per row and piece) are the other gather.
    let hidden = 2 * 8 * 32 * 4;
    let statistics = 2 * 8 * 3 * 4 * 2;
    let mut gathers = 0;
    for gather in forward.iter().filter(|i| i["op"] == "all_gather") {
        let bytes = gather["bytes"].as_u64().expect("bytes");
        assert!(
            bytes == hidden || bytes == statistics,
            "an all-gather of {bytes} bytes"
        );
        gathers += usize::from(bytes == hidden);
    }
    // Two per block, and the LM head's input.
    assert_eq!(gathers, 2 * 2 + 1);
    let input_gradients = backward
        .iter()
        .filter(|i| i["op"] == "reduce_scatter" && i["bytes"] == hidden)
        .count();
    assert_eq!(input_gradients, 2 * 2 + 1);
    // The gradients of the embedding's and the projections' outputs, and the inputs of
    // the column-parallel projections and the head again: they keep their sequence piece
    // to the backward pass, as Megatron-LM's sequence parallelism does.
    let backward_gathers = backward
        .iter()
        .filter(|i| i["op"] == "all_gather" && i["bytes"] == hidden)
        .count();
    assert_eq!(backward_gathers, (1 + 2 * 2) + (2 * 2 + 1));
}

/// Hugging Face's GPT-2 as Megatron-LM splits it: its ids flattened before a
/// vocabulary-parallel lookup, its `[b·s, h]` products reshaped back (row-parallel partial
/// sums viewed), GELU and the flattening before the second MLP product on the columns, the
/// final LayerNorm's reshape on its sequence piece.
#[test]
fn hugging_faces_gpt2_split_by_heads_trains_as_pytorch() {
    split_by_heads("hf_gpt2_ts");
}

/// The Llama decoder exported at fixed shapes: the rotary tables, computed from a buffer,
/// are folded into initializers of their own, which must not train (PyTorch's parameter
/// count, and its losses). One rank: the export bakes its batch into the reshapes of
/// `[b·heads, s, s]`, so no plan splits its samples.
#[test]
fn rotary_tables_folded_by_the_exporter_do_not_train() {
    check_on("llama_static", &[1]);
}

/// Hugging Face's Gemma split by heads trains as on one rank: its token embedding is
/// scaled by √hidden, which a vocabulary-parallel embedding applies to its piece before
/// the pieces are summed (a scale by a constant commutes with the sum). Against one rank,
/// not PyTorch: the exporter folds the norms' `1 + weight` and the rotary tables alike, so
/// the tables train here (the norms' parameters gone, nothing tells them apart).
#[test]
fn gemma_split_by_heads_trains_as_on_one_rank() {
    split_by_heads_as_one_rank("gemma_dynamo");
}

/// Gemma 2's scores are soft-capped (`cap · tanh(s / cap)`) inside the attention core,
/// which is split by heads with them; its norms after the attention and the MLP follow
/// the row-parallel projections' reduce-scatter.
#[test]
fn gemma2_split_by_heads_trains_as_on_one_rank() {
    split_by_heads_as_one_rank("gemma2_dynamo");
}

fn split_by_heads_as_one_rank(case: &str) {
    let Expected { input, .. } = pytorch(case);
    let dir = tempfile::tempdir().expect("temp dir");
    let one = train(case, 1, &input, dir.path());
    split_by_heads_as(case, &input, &one);
}

/// Hugging Face's BLOOM: its fused projection interleaves Q, K and V per head
/// (`[b, s, heads, 3, d]`, Megatron-LM's own layout), so a rank's columns are whole heads;
/// ALiBi's bias, one row per head and computed from constants, is taken by each rank for
/// its own heads. On 1 and 2 ranks, then split by heads as Megatron-LM splits it.
#[test]
fn bloom_trains_as_pytorch_and_split_by_heads() {
    check("bloom_ts");
    split_by_heads("bloom_ts");
}

/// Three steps of `case` at t2 on 4 ranks: × d2, then × p2 (microbatches of one), each
/// PyTorch's losses.
fn split_by_heads(case: &str) {
    let Expected { losses, input, .. } = pytorch(case);
    split_by_heads_as(case, &input, &losses);
}

/// Three steps of `case` at t2 on 4 ranks (× d2, then × p2), each `losses`.
fn split_by_heads_as(case: &str, input: &[u64], losses: &[f64]) {
    use ralpc::passes::transformer::{Knobs, Recompute};
    for pipeline in [1, 2] {
        let knobs = Knobs {
            tensor: Some(2),
            pipeline: Some(pipeline),
            micro_batch: Some(2 / u64::from(pipeline)),
            recompute: Some(Recompute::None),
            ..Knobs::default()
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let family = ralpc::passes::plan::Family::parse("3d").expect("3d");
        let got = train_as(case, 4, input, dir.path(), family, Some(knobs));
        let what = format!("{case} at t2 p{pipeline}");
        assert_pytorch(&what, &got, losses);
    }
}
