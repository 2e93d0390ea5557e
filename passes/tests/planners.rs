//! ralpc's planner against the published plans of DeepPool and PipeDream, on their own
//! inputs (`fixtures/anchors`), every plan priced by ralpc's cost model. Run with
//! `--nocapture` to see the comparison table.

mod common;

use ralpc_passes::cluster::{Cluster, Link, Precision};
use ralpc_passes::layers::{LayerGraph, LayerKind};
use ralpc_passes::plan::{
    self, CostOptions, Costs, Family, Request, Schedule, StrategyFile, StrategyFileLayer,
    StrategyFileStage, FORMAT,
};
use ralpc_passes::profile::{self, Loaded};

fn pipedream(model: &str) -> LayerGraph {
    match profile::load(&common::anchor(&format!("pipedream/{model}/graph.txt"))).unwrap() {
        Loaded::LayerGraph(g) => g.graph,
        Loaded::Profile(_) => panic!("{model}: detected as a per-op profile"),
    }
}

fn deeppool_profile() -> profile::Profile {
    match profile::load(&common::anchor("deeppool/A100_vgg.prof")).unwrap() {
        Loaded::Profile(p) => p,
        Loaded::LayerGraph(_) => panic!("detected as a layer graph"),
    }
}

/// DeepPool's network: 2.66e5 bytes/µs and 240 µs per transfer.
const DEEPPOOL_LINK: Link = Link {
    latency_us: 240.0,
    bandwidth: 2.66e11,
};

/// PipeDream's `-b 1e9`: 1 GB/s, no latency.
const PIPEDREAM_LINK: Link = Link {
    latency_us: 0.0,
    bandwidth: 1e9,
};

#[test]
fn deeppool_vgg16_burst_plan() {
    let profile = deeppool_profile();
    let (_, _, graph) = common::layers("fixtures/onnx/vgg16/model.onnx", 32);
    let cluster = Cluster::preset("dgx-a100")
        .unwrap()
        .with_flat_network(DEEPPOOL_LINK);
    let costs = Costs::new(
        &graph,
        &cluster,
        8,
        CostOptions {
            precision: Precision::Tf32,
            profile: Some(&profile),
            ..CostOptions::default()
        },
    );
    let best = plan::plan(&costs, &Request::default()).unwrap();
    // DeepPool's published plan: conv1..conv5 (and their pools) on 8 GPUs, fc6..fc8 on 1.
    let dense: Vec<&str> = graph
        .layers
        .iter()
        .filter(|l| l.kind == LayerKind::Dense)
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(dense.len(), 3);
    let file = StrategyFile {
        format: FORMAT.into(),
        schedule: Schedule::OneFOneB,
        microbatches: 1,
        stages: vec![StrategyFileStage {
            first_layer: graph.layers[0].name.clone(),
            last_layer: graph.layers[graph.layers.len() - 1].name.clone(),
            replicas: 8,
            first_rank: None,
        }],
        layers: dense
            .iter()
            .map(|&name| StrategyFileLayer {
                name: name.into(),
                module: None,
                kind: None,
                inputs: Vec::new(),
                gpus: Some(1),
                split: None,
            })
            .collect(),
        zero: 0,
        shard_groups: 1,
        recompute: Vec::new(),
        virtual_stages: 1,
    };
    let theirs = plan::plan(
        &costs,
        &Request {
            strategy: Some(file.resolve(&graph).unwrap()),
            ..Request::default()
        },
    )
    .unwrap()
    .chosen
    .evaluation;
    let dp = &best.data_parallel;
    let ours = &best.chosen.evaluation;
    println!("DeepPool VGG16, 8 GPUs, batch 32, flat 266 GB/s, 240 µs (ralpc's costs):");
    println!(
        "  data parallel      {:8.3} ms  {:7.1} GPU-ms  amplification {:.2}",
        dp.iteration_time_us / 1e3,
        dp.gpu_time_us / 1e3,
        dp.gpu_sec_amplification
    );
    println!(
        "  DeepPool's plan    {:8.3} ms  {:7.1} GPU-ms  amplification {:.2}  ({:.3}× over DP)",
        theirs.iteration_time_us / 1e3,
        theirs.gpu_time_us / 1e3,
        theirs.gpu_sec_amplification,
        dp.iteration_time_us / theirs.iteration_time_us
    );
    println!(
        "  ralpc ({:<8})    {:8.3} ms  {:7.1} GPU-ms  amplification {:.2}  ({:.3}× over DP)",
        best.chosen.family.name(),
        ours.iteration_time_us / 1e3,
        ours.gpu_time_us / 1e3,
        ours.gpu_sec_amplification,
        dp.iteration_time_us / ours.iteration_time_us
    );
    for (layer, split) in graph.layers.iter().zip(&best.chosen.strategy.layers) {
        println!("    {:<40} {:?}", layer.name, split);
    }
    assert!(ours.iteration_time_us <= theirs.iteration_time_us * (1.0 + 1e-9));
    assert!(
        dp.iteration_time_us / ours.iteration_time_us >= 1.12,
        "DeepPool claims 1.12× over data parallel on this input"
    );
}

/// PipeDream's published replication counts per stage.
fn pipedream_shapes() -> Vec<(&'static str, u32, Vec<u32>)> {
    vec![
        ("vgg16", 4, vec![3, 1]),
        ("vgg16", 8, vec![7, 1]),
        ("vgg16", 16, vec![13, 2, 1]),
        ("resnet50", 8, vec![5, 3]),
        ("alexnet", 8, vec![6, 1, 1]),
    ]
}

#[test]
fn pipedream_plans() {
    let cluster = Cluster::preset("dgx-a100x2")
        .unwrap()
        .with_flat_network(PIPEDREAM_LINK);
    println!(
        "PipeDream graphs, flat 1 GB/s, asynchronous pipelines (ralpc's costs, ms per minibatch):"
    );
    for (model, gpus, replicas) in pipedream_shapes() {
        let graph = pipedream(model);
        let costs = Costs::new(&graph, &cluster, gpus, CostOptions::default());
        let request = Request {
            family: Some(Family::Pipeline),
            schedule: Some(Schedule::Async),
            microbatches: Some(1),
            ..Request::default()
        };
        let ours = plan::plan(&costs, &request).unwrap();
        // The published plans give replication counts, not cut points: price every cut
        // that gives those counts and keep PipeDream's best.
        let theirs = best_cuts(&costs, &graph, &replicas);
        let ours_us = ours.chosen.evaluation.iteration_time_us;
        let shape: Vec<String> = ours
            .chosen
            .strategy
            .stages
            .iter()
            .map(|s| s.gpus.to_string())
            .collect();
        let theirs_shape: Vec<String> = replicas.iter().map(u32::to_string).collect();
        println!(
            "  {model:<9} {gpus:>2} GPUs: PipeDream {:<7} {:9.3}   ralpc {:<7} {:9.3}   DP {:9.3}",
            theirs_shape.join("-"),
            theirs / 1e3,
            shape.join("-"),
            ours_us / 1e3,
            ours.data_parallel.iteration_time_us / 1e3
        );
        assert!(
            ours_us <= theirs * (1.0 + 1e-9),
            "{model} on {gpus}: ralpc {ours_us} vs PipeDream {theirs}"
        );
    }
}

/// The fastest placement with stage widths `replicas` over all single-tensor cuts.
fn best_cuts(costs: &Costs<'_>, graph: &LayerGraph, replicas: &[u32]) -> f64 {
    let n = graph.layers.len();
    let mut best = f64::INFINITY;
    let mut cuts = vec![0usize; replicas.len() - 1];
    fn rec(
        k: usize,
        start: usize,
        cuts: &mut Vec<usize>,
        n: usize,
        visit: &mut dyn FnMut(&[usize]),
    ) {
        if k == cuts.len() {
            visit(cuts);
            return;
        }
        for c in start..n - (cuts.len() - k) {
            cuts[k] = c;
            rec(k + 1, c + 1, cuts, n, visit);
        }
    }
    let names = |i: usize| graph.layers[i].name.clone();
    rec(0, 0, &mut cuts, n, &mut |cuts: &[usize]| {
        let mut stages = Vec::new();
        let mut start = 0;
        for (k, &r) in replicas.iter().enumerate() {
            let end = if k < cuts.len() { cuts[k] } else { n - 1 };
            stages.push(StrategyFileStage {
                first_layer: names(start),
                last_layer: names(end),
                replicas: r,
                first_rank: None,
            });
            start = end + 1;
        }
        let file = StrategyFile {
            format: FORMAT.into(),
            schedule: Schedule::Async,
            microbatches: 1,
            stages,
            layers: Vec::new(),
            zero: 0,
            shard_groups: 1,
            recompute: Vec::new(),
            virtual_stages: 1,
        };
        let strategy = file.resolve(graph).unwrap();
        if let Ok(e) = plan::evaluate(costs, &strategy) {
            if e.fits {
                best = best.min(e.iteration_time_us);
            }
        }
    });
    best
}
