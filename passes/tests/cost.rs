//! The layer graph's accounting and the cost model's invariants.

mod common;

use proptest::prelude::*;
use ralpc_passes::cluster::{Cluster, Link, Precision};
use ralpc_passes::cost::{self, comm, ComputeModel, MemoryUse, Optimizer};
use ralpc_passes::layers::{LayerKind, Split};

#[test]
fn layer_graph_keeps_every_parameter_and_flop() {
    for (model, layers) in [("vgg16", 22), ("resnet50", 56)] {
        let path = format!("fixtures/onnx/{model}/model.onnx");
        let (graph, info, g) = common::layers(&path, 8);
        let acc = ralpc_ir::account(&graph, &info).unwrap();
        assert_eq!(g.layers.len(), layers, "{model}");
        assert_eq!(
            g.layers.iter().map(|l| l.params).sum::<u64>(),
            acc.params,
            "{model}"
        );
        let fwd: u64 = g.layers.iter().map(|l| l.fwd_flops).sum();
        assert_eq!(fwd, 2 * acc.macs + acc.flops, "{model}");
        // Backward: twice the MAC FLOPs plus the other FLOPs once.
        let bwd: u64 = g.layers.iter().map(|l| l.bwd_flops).sum();
        assert_eq!(bwd, 4 * acc.macs + acc.flops, "{model}");
        // Every layer but the first reads another layer.
        assert!(g.layers.iter().skip(1).all(|l| !l.inputs.is_empty()));
        assert_eq!(g.outputs.len(), 1);
    }
    let (_, _, vgg) = common::layers("fixtures/onnx/vgg16/model.onnx", 8);
    let convs = vgg
        .layers
        .iter()
        .filter(|l| l.kind == LayerKind::Conv)
        .count();
    assert_eq!(convs, 13);
    // VGG16 forward at batch 1 is 15.47 GMACs (torchvision): 8 × 2 × that.
    let fwd = vgg.layers.iter().map(|l| l.fwd_flops).sum::<u64>() as f64;
    assert!((fwd / (8.0 * 2.0 * 15.47e9) - 1.0).abs() < 0.01, "{fwd}");
}

#[test]
fn lower_bound_is_total_flops_over_combined_peak() {
    let (_, _, g) = common::layers("fixtures/onnx/resnet50/model.onnx", 32);
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let bound = cost::lower_bound_us(&g, &cluster, 8, Precision::Tf32);
    let expected = g.total_flops() / (8.0 * 156e12) * 1e6;
    assert!((bound - expected).abs() < 1e-9 * expected);
}

#[test]
fn roofline_matches_hand_computed_values() {
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let model = ComputeModel::new(cluster.gpu(0), Precision::Fp32);
    // 19.5 GFLOP at 19.5 TFLOP/s × 0.5 = 2000 µs (compute-bound) + 5 µs launch.
    assert_eq!(model.roofline_us(LayerKind::Conv, 19.5e9, 1e6, 1.0), 2005.0);
    // 2.039 GB at 2039 GB/s = 1000 µs (memory-bound) + 2 launches.
    assert!((model.roofline_us(LayerKind::Elementwise, 1e6, 2.039e9, 2.0) - 1010.0).abs() < 1e-9);
}

#[test]
fn memory_of_a_replica() {
    let (_, _, g) = common::layers("fixtures/onnx/vgg16/model.onnx", 32);
    let params = g.param_bytes() as f64;
    let stash: f64 = g.layers.iter().map(|l| l.stash_bytes as f64).sum();
    let m = MemoryUse::new(params, stash, 1, Optimizer::Adam, 0.0);
    assert_eq!(m.total(), 4.0 * params + stash);
    // 138M fp32 parameters with Adam: 2.2 GB of weights, gradients and state.
    assert!((4.0 * params / 1e9 - 2.21).abs() < 0.01);
}

proptest! {
    #[test]
    fn roofline_is_monotone(flops in 0.0..1e13f64, bytes in 0.0..1e11f64, more in 0.0..1e12f64) {
        let cluster = Cluster::preset("dgx-h100").unwrap();
        let model = ComputeModel::new(cluster.gpu(0), Precision::Bf16);
        for kind in LayerKind::ALL {
            let base = model.roofline_us(kind, flops, bytes, 1.0);
            prop_assert!(model.roofline_us(kind, flops + more, bytes, 1.0) >= base);
            prop_assert!(model.roofline_us(kind, flops, bytes + more, 1.0) >= base);
        }
    }

    #[test]
    fn collectives_are_monotone_in_bytes(n in 1u32..64, bytes in 0.0..1e10f64, more in 0.0..1e10f64, alpha in 0.0..50.0f64, beta in 1e8..1e12f64) {
        let link = Link { latency_us: alpha, bandwidth: beta };
        prop_assert!(comm::ring_all_reduce_us(n, link, bytes + more) >= comm::ring_all_reduce_us(n, link, bytes));
        prop_assert!(comm::ring_all_gather_us(n, link, bytes + more) >= comm::ring_all_gather_us(n, link, bytes));
        prop_assert!(comm::p2p_us(link, bytes + more) >= comm::p2p_us(link, bytes));
        let cluster = Cluster::preset("dgx-a100x4").unwrap();
        let ranks: Vec<u32> = (0..n.min(32)).collect();
        let c = cost::Comm::new(&cluster);
        prop_assert!(c.all_reduce(&ranks, bytes + more).us >= c.all_reduce(&ranks, bytes).us);
    }
}

#[test]
fn a_split_never_beats_its_share_of_the_bound() {
    let (_, _, g) = common::layers("fixtures/onnx/resnet50/model.onnx", 64);
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let profile =
        match ralpc_passes::profile::load(&common::anchor("deeppool/A100_vgg.prof")).unwrap() {
            ralpc_passes::profile::Loaded::Profile(p) => p,
            _ => unreachable!(),
        };
    let roofline = ComputeModel::new(cluster.gpu(0), Precision::Tf32);
    let profiled = roofline.clone().with_profile(&profile);
    let runner = proptest::test_runner::Config::default();
    let mut runner = proptest::test_runner::TestRunner::new(runner);
    runner
        .run(
            &(0..g.layers.len(), 1u32..9, 1u32..3, 1u32..5),
            |(i, s, a, p)| {
                let layer = &g.layers[i];
                let split = Split {
                    sample: s,
                    context: 1,
                    attribute: a,
                    parameter: p,
                };
                let d = f64::from(split.degree());
                for model in [&roofline, &profiled] {
                    let t = model.layer(layer, split, g.batch);
                    prop_assert!(
                        t.fwd_us >= layer.fwd_flops as f64 / d / 156e12 * 1e6 * (1.0 - 1e-12)
                    );
                    prop_assert!(
                        t.bwd_us >= layer.bwd_flops as f64 / d / 156e12 * 1e6 * (1.0 - 1e-12)
                    );
                }
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn every_exporters_attention_core_is_one_layer_with_its_parameters_and_flops() {
    // A GPT-2 exported by torch.onnx (dynamo and TorchScript), torchvision's ViT-B/16 and
    // the generator's GPT: one attention layer per block, keeping every FLOP.
    for (model, blocks) in [
        ("fixtures/onnx/gpt2/model.onnx", None),
        ("fixtures/onnx/gpt2_torchscript/model.onnx", None),
        ("fixtures/onnx/vit_b_16/model.onnx", Some(12)),
        ("fixtures/train/transformer.onnx", Some(1)),
    ] {
        let (graph, info, g) = common::layers(model, 2);
        let softmaxes = graph
            .node_ids()
            .filter(|&n| graph.node(n).op.name() == "Softmax")
            .count();
        let cores: Vec<_> = g
            .layers
            .iter()
            .filter(|l| l.kind == LayerKind::Attention)
            .collect();
        assert_eq!(cores.len(), softmaxes, "{model}");
        if let Some(blocks) = blocks {
            assert_eq!(cores.len(), blocks, "{model}");
        }
        for core in &cores {
            let products = core.parts.iter().filter(|p| p.op == "MatMul").count();
            assert!(
                products >= 2,
                "{model}: {} has {products} products",
                core.name
            );
            assert!(core.parts.iter().any(|p| p.op == "Softmax"));
        }
        let acc = ralpc_ir::account(&graph, &info).unwrap();
        let fwd: u64 = g.layers.iter().map(|l| l.fwd_flops).sum();
        assert_eq!(fwd, 2 * acc.macs + acc.flops, "{model}");
    }
}
