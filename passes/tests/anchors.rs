//! The two published planner inputs in fixtures/anchors: every line accounted for, and
//! DeepPool's VGG16 timings matched to the layers of an ONNX VGG16.

mod common;

use ralpc_passes::cluster::{Cluster, Precision};
use ralpc_passes::cost::{ComputeModel, Source};
use ralpc_passes::layers::{LayerKind, Split};
use ralpc_passes::profile::{self, Loaded};

fn pipedream(model: &str) -> profile::PipeDreamGraph {
    match profile::load(&common::anchor(&format!("pipedream/{model}/graph.txt"))).unwrap() {
        Loaded::LayerGraph(g) => g,
        Loaded::Profile(_) => panic!("{model}: detected as a per-op profile"),
    }
}

#[test]
fn pipedream_graphs_account_for_every_node_and_edge() {
    // (model, node lines, edge lines, batch from the Input node)
    for (model, nodes, edges, batch) in [
        ("vgg16", 41, 41, 128),
        ("alexnet", 23, 23, 256),
        ("resnet50", 177, 193, 128),
    ] {
        let text = std::fs::read_to_string(common::anchor(&format!("pipedream/{model}/graph.txt")))
            .unwrap();
        assert_eq!(
            text.lines().filter(|l| l.starts_with("node")).count(),
            nodes,
            "{model}"
        );
        let g = pipedream(model);
        assert_eq!((g.nodes, g.edges), (nodes, edges), "{model}");
        assert_eq!(g.inputs, ["node1"], "{model}");
        assert_eq!(g.graph.layers.len() + g.inputs.len(), nodes, "{model}");
        assert_eq!(g.graph.batch, batch, "{model}");
        let in_edges: usize = g.graph.layers.iter().map(|l| l.inputs.len()).sum();
        assert_eq!(in_edges, edges, "{model}");
        // Forward times survive (ms → µs), summed over all non-input nodes.
        let file_fwd_ms: f64 = text
            .lines()
            .filter(|l| l.starts_with("node") && !l.contains(" -- Input -- "))
            .map(|l| {
                l.split("forward_compute_time=")
                    .nth(1)
                    .unwrap()
                    .split(',')
                    .next()
                    .unwrap()
                    .parse::<f64>()
                    .unwrap()
            })
            .sum();
        let ours: f64 = g
            .graph
            .layers
            .iter()
            .map(|l| l.measured.unwrap().fwd_us)
            .sum();
        assert!((ours / 1000.0 - file_fwd_ms).abs() < 1e-6, "{model}");
    }
    let vgg = pipedream("vgg16");
    let params: u64 = vgg.graph.layers.iter().map(|l| l.params).sum();
    // torchvision VGG16: 138,357,544 parameters.
    assert_eq!(params, 138_357_544);
    assert_eq!(
        vgg.graph
            .layers
            .iter()
            .filter(|l| l.kind == LayerKind::Conv)
            .count(),
        13
    );
    assert_eq!(
        vgg.graph
            .layers
            .iter()
            .filter(|l| l.kind == LayerKind::Dense)
            .count(),
        3
    );
}

#[test]
fn pipedream_layers_scale_with_the_local_share() {
    let g = pipedream("vgg16").graph;
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let model = ComputeModel::new(cluster.gpu(0), Precision::Fp32);
    let conv = &g.layers.iter().find(|l| l.kind == LayerKind::Conv).unwrap();
    let whole = model.layer(conv, Split::NONE, g.batch);
    let quarter = model.layer(conv, Split::samples(4), g.batch);
    assert_eq!(whole.source, Source::Scaled);
    assert_eq!(whole.fwd_us, conv.measured.unwrap().fwd_us);
    assert!((quarter.fwd_us * 4.0 - whole.fwd_us).abs() < 1e-9);
}

fn deeppool() -> profile::Profile {
    match profile::load(&common::anchor("deeppool/A100_vgg.prof")).unwrap() {
        Loaded::Profile(p) => p,
        Loaded::LayerGraph(_) => panic!("detected as a layer graph"),
    }
}

#[test]
fn deeppool_profile_accounts_for_every_line() {
    let p = deeppool();
    // Each batch's lines add up to its SUM(avg) line (checked by the reader). VGG16 has
    // 37 layers per batch; layers of one shape share an entry: 13 convs of 9 shapes, 13
    // ReLU2d of 5 shapes, 5 pools, 1 flatten, 3 linears and 2 ReLU1d of 1 shape.
    assert_eq!(p.entries.len(), 9 + 5 + 5 + 1 + 3 + 1);
    for e in &p.entries {
        let batches: Vec<u64> = e.points.iter().map(|p| p.batch).collect();
        assert_eq!(batches, [1, 2, 3, 4, 6, 8, 16, 32, 64], "{}", e.signature);
    }
    assert_eq!(p.precision, Precision::Tf32);
    // It round-trips through ralpc's own format.
    let back = profile::Profile::from_json(&p.to_json(), "p.json").unwrap();
    assert!(back == p, "the profile changed through JSON");
}

#[test]
fn deeppool_timings_match_an_onnx_vgg16() {
    let p = deeppool();
    let (_, _, g) = common::layers("fixtures/onnx/vgg16/model.onnx", 32);
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let model = ComputeModel::new(cluster.gpu(0), Precision::Tf32).with_profile(&p);
    let mut measured_us = 0.0;
    for layer in &g.layers {
        let t = model.layer(layer, Split::NONE, g.batch);
        match layer.op.as_str() {
            // DeepPool's VGG has no average pool: that layer falls back, and says so.
            "AveragePool+Flatten" => assert_eq!(t.source, Source::Partial),
            _ => {
                assert_eq!(t.source, Source::Measured, "{} ({})", layer.name, layer.op);
                measured_us += t.fwd_us + t.bwd_us;
            }
        }
    }
    // DeepPool's own total for batch 32 is 53.734 ms (its SUM(avg) line); repeated layer
    // shapes are averaged, so allow 1%.
    let ms = measured_us / 1000.0;
    println!("VGG16 batch 32 from DeepPool's profile: {ms:.3} ms (DeepPool's sum: 53.734 ms)");
    assert!((ms - 53.734).abs() / 53.734 < 0.01, "{ms} ms");
    // Interpolation between measured batches (32 and 64 bracket 48).
    let conv = g.layers.iter().find(|l| l.kind == LayerKind::Conv).unwrap();
    let t = model.layer(conv, Split::NONE, 48);
    assert_eq!(t.source, Source::Interpolated);
}
