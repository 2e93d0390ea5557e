//! The two published planners' inputs in fixtures/anchors: every line accounted for, the
//! batch each was measured at found, DeepPool's VGG16 timings matched to the layers of an
//! ONNX VGG16, and its profiles of composite modules read as models.

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
            .map(|l| l.measured.as_ref().unwrap().fwd_us)
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
    assert_eq!(whole.fwd_us, conv.measured.as_ref().unwrap().fwd_us);
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

fn anchor_text(path: &str) -> String {
    std::fs::read_to_string(common::anchor(path)).unwrap()
}

#[test]
fn pipedream_batches_are_found_at_any_resolution() {
    // The batch each profile was measured at: the input's bytes over one image, at the
    // resolution the first convolution and the classifier agree on.
    for (model, batch, side) in [
        ("alexnet", 256, 224),
        ("vgg16", 128, 224),
        ("resnet18", 256, 224),
        ("resnet50", 128, 224),
        ("densenet121", 64, 224),
        ("squeezenet1_0", 256, 224),
        ("inception_v3", 128, 299),
    ] {
        let g = pipedream(model);
        assert_eq!(g.graph.batch, batch, "{model}");
        let input_line = anchor_text(&format!("pipedream/{model}/graph.txt"));
        let bytes: f64 = input_line
            .lines()
            .find(|l| l.contains(" -- Input -- "))
            .and_then(|l| l.split("activation_size=").nth(1))
            .and_then(|v| v.split(',').next())
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(bytes as u64, batch * 3 * side * side * 4, "{model}");
        // A batch given that the file contradicts is refused, saying what it measured.
        let message = profile::parse_pipedream(&input_line, model, Some(batch * 2))
            .unwrap_err()
            .to_string();
        assert!(
            message.contains(&format!("measured at batch {batch}")),
            "{message}"
        );
    }
}

#[test]
fn pipedream_translation_profiles_need_their_batch() {
    let text = anchor_text("pipedream/gnmt/graph.txt");
    // Its inputs record no sizes: the batch must be given, and the error says how.
    let message = profile::parse_pipedream(&text, "gnmt", None)
        .unwrap_err()
        .to_string();
    assert!(message.contains("give it with --batch"), "{message}");
    let g = profile::parse_pipedream(&text, "gnmt", Some(64)).unwrap();
    assert_eq!(g.inputs, ["node1", "node2", "node3"]);
    assert_eq!(g.graph.batch, 64);
    assert_eq!(g.graph.layers.len() + 3, g.nodes);
    let lstms = g
        .graph
        .layers
        .iter()
        .filter(|l| l.op.starts_with("LSTM("))
        .count();
    assert_eq!(lstms, 6);
    // GNMT-8 as PipeDream profiled it: 2 embeddings of 32320×1024, the encoder and
    // decoder LSTMs, attention and the classifier; parameter_size is fp32 bytes.
    let params: u64 = g.graph.layers.iter().map(|l| l.params).sum();
    let file_bytes: f64 = text
        .lines()
        .filter_map(|l| l.split("parameter_size=").nth(1))
        .map(|v| v.trim().parse::<f64>().unwrap())
        .sum();
    assert_eq!(params * 4, file_bytes as u64);
}

fn deeppool_model(name: &str, batch: Option<u64>) -> ralpc_passes::layers::LayerGraph {
    let path = format!("deeppool/{name}.prof");
    profile::parse_model(&anchor_text(&path), &path, batch).unwrap()
}

/// Sections of a DeepPool profile: the lines between two total lines.
fn deeppool_sections(text: &str) -> Vec<Vec<&str>> {
    let mut sections = vec![Vec::new()];
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("SUM(avg)") || line.starts_with("sum:") {
            sections.push(Vec::new());
        } else {
            sections.last_mut().unwrap().push(line);
        }
    }
    sections.retain(|s| !s.is_empty());
    sections
}

#[test]
fn deeppool_profiles_read_as_models() {
    // (profile, layers per section, sections, default batch = the largest measured)
    for (name, layers, sections, batch) in [
        ("A100_vgg", 37, 9, 64),
        ("A100_wrn", 39, 8, 32),
        ("A100_inception", 107, 23, 64),
    ] {
        let text = anchor_text(&format!("deeppool/{name}.prof"));
        let found = deeppool_sections(&text);
        assert_eq!(found.len(), sections, "{name}");
        assert!(found.iter().all(|s| s.len() == layers), "{name}");
        let g = deeppool_model(name, None);
        assert_eq!((g.layers.len(), g.batch), (layers, batch), "{name}");
        // Every line's times are kept: each layer has one point per distinct batch.
        let points: usize = g
            .layers
            .iter()
            .map(|l| l.measured.as_ref().unwrap().points.len())
            .sum();
        let distinct: std::collections::BTreeSet<&str> = found
            .iter()
            .map(|s| s[0].split('[').nth(1).unwrap())
            .collect();
        assert_eq!(points, layers * distinct.len(), "{name}");
    }
    // VGG16's parameters from DeepPool's layer parameters: torchvision's 138,357,544.
    let vgg = deeppool_model("A100_vgg", None);
    assert_eq!(
        vgg.layers.iter().map(|l| l.params).sum::<u64>(),
        138_357_544
    );
    // Wide ResNet-101-2 (torchvision: 126,886,696): the profile has no line for the stem's
    // batch norm (128 parameters) and its stem convolution carries no bias flag, so it is
    // counted with one (64): the rest, 33 bottleneck blocks, is exact.
    let wrn = deeppool_model("A100_wrn", None);
    let bottlenecks = wrn
        .layers
        .iter()
        .filter(|l| l.op == "ResnetBottleneck")
        .count();
    assert_eq!(bottlenecks, 33);
    assert_eq!(
        wrn.layers.iter().map(|l| l.params).sum::<u64>(),
        126_886_696 - 128 + 64
    );
    // Its output shapes follow the blocks: the classifier reads 2048 features.
    let last_block = wrn
        .layers
        .iter()
        .rposition(|l| l.op == "ResnetBottleneck")
        .unwrap();
    assert_eq!(wrn.layers[last_block].output_bytes, 4 * 32 * 2048 * 7 * 7);
}

#[test]
fn deeppool_layers_are_timed_at_their_own_batch() {
    let g = deeppool_model("A100_wrn", Some(32));
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let model = ComputeModel::new(cluster.gpu(0), Precision::Tf32);
    let block = g
        .layers
        .iter()
        .find(|l| l.op == "ResnetBottleneck")
        .unwrap();
    let points = &block.measured.as_ref().unwrap().points;
    let at = |b: u64| points.iter().find(|p| p.batch == b).unwrap();
    // On 4 GPUs by samples, a block runs at batch 8: its measurement there, not a quarter
    // of batch 32's.
    let quarter = model.layer(block, Split::samples(4), g.batch);
    assert_eq!(quarter.source, Source::Measured);
    assert_eq!(
        (quarter.fwd_us, quarter.bwd_us),
        (at(8).forward_us, at(8).backward_us)
    );
    assert_ne!(quarter.fwd_us, at(32).forward_us / 4.0);
    // Between measured batches it interpolates (batch 12: between 8 and 16).
    let third = model.layer(block, Split::samples(3), 36);
    assert_eq!(third.source, Source::Interpolated);
    // The whole model at batch 32 adds up to the file's total for that section.
    let total_ms: f64 = g
        .layers
        .iter()
        .map(|l| {
            let t = model.layer(l, Split::NONE, 32);
            t.fwd_us + t.bwd_us
        })
        .sum::<f64>()
        / 1000.0;
    assert!((total_ms - 103.837).abs() < 0.1, "{total_ms} ms");
}

#[test]
fn deeppool_composite_modules_are_no_per_op_profile() {
    let path = "deeppool/A100_wrn.prof";
    let message = profile::parse(&anchor_text(path), path)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("ResnetBottleneck is a composite module"),
        "{message}"
    );
    assert!(message.contains("as the model"), "{message}");
    // Inception's lines are single ops (asymmetric kernels too): a per-op profile.
    let path = "deeppool/A100_inception.prof";
    let Loaded::Profile(p) = profile::parse(&anchor_text(path), path).unwrap() else {
        panic!("detected as a layer graph");
    };
    assert!(p
        .entries
        .iter()
        .any(|e| e.signature.attrs.get("kernel") == Some(&vec![1, 7])));
}
