//! `ralpc profile --device cuda:N` on a GPT, run on the host-compiled kernels and on the
//! counting device: the blocks' products on one rank of each tensor-parallel degree are
//! measured, and `ralpc plan --profile` prices the 3d plan's products from them.

use ralpc::ir::models::{gpt, GptSpec};
use ralpc::passes::cluster::Precision;
use ralpc::passes::profile::{Device, Profile};
use ralpc_cuda_host::dry::Dry;
use ralpc_cuda_host::Host;
use ralpc_runtime_min::cuda::backend::Backend;

/// Profiles a 2-block GPT (hidden 64, 4 heads, sequence 32) on `dev`, checks every
/// product of t = 1, 2, 4 was measured, and plans it on 4 GPUs from the profile.
fn profile_and_plan<B: Backend>(dev: &B, name: &str) -> Profile {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("gpt.onnx");
    let spec = GptSpec::megatron(2, 64, 4, 32, 128);
    std::fs::write(&model, gpt(&spec).expect("generates")).expect("writes");
    let options = ralpc::ProfileOptions {
        model: model.clone(),
        batch_sizes: vec![1, 2],
        repeats: 1,
        tensor_parallel: vec![1, 2, 4],
        ..ralpc::ProfileOptions::default()
    };
    let device = Device {
        name: name.into(),
        note: "the CUDA executor's kernels".into(),
    };
    let profile = ralpc::profile_on(dev, device, &options, &|_, _| {}).expect("profiles");
    // The executor lacks the embedding's Gather: the model's own ops are not measured, and
    // the profile says so.
    assert!(
        profile.device.note.contains("were not measured"),
        "{}",
        profile.device.note
    );
    let (graph, info) = {
        let mut m = ralpc::ir::onnx::import(&model).expect("imports");
        ralpc::ir::bind(
            &mut m.graph,
            &ralpc::ir::Bindings {
                batch: Some(1),
                ..Default::default()
            },
        )
        .expect("binds");
        let info = ralpc::ir::verify(&m.graph).expect("verifies");
        (m.graph, info)
    };
    let shape = ralpc::passes::transformer::recognize(&graph, &info).expect("a GPT");
    for t in [1, 2, 4] {
        for g in shape.dense_gemms(t) {
            let entry = profile.entry(&g.signature(32));
            let batches: Vec<u64> =
                entry.map_or(vec![], |e| e.points.iter().map(|q| q.batch).collect());
            assert_eq!(batches, [1, 2], "t{t} {}", g.name);
        }
    }
    let path = dir.path().join("gpt.profile.json");
    std::fs::write(&path, profile.to_json()).expect("writes");
    let planned = ralpc::plan(&ralpc::PlanOptions {
        model,
        gpus: Some(4),
        batch: Some(8),
        profile: Some(path),
        precision: Some(Precision::Fp32),
        ..ralpc::PlanOptions::default()
    })
    .expect("plans");
    let parallelism = planned.report.parallelism.expect("a 3d plan");
    assert_eq!(
        parallelism.measured,
        ["qkv", "projection", "mlp_in", "mlp_out"]
    );
    profile
}

#[test]
fn a_gpts_products_are_profiled_on_the_host_kernels_and_price_its_3d_plan() {
    let profile = profile_and_plan(&Host, "host");
    for e in &profile.entries {
        assert!(e
            .points
            .iter()
            .all(|q| q.forward_us > 0.0 && q.backward_us > 0.0));
    }
}

#[test]
fn a_gpts_products_are_profiled_on_the_counting_device() {
    profile_and_plan(&Dry::default(), "dry");
}
