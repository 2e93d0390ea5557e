//! Golden plans: small strategies lowered, written one instruction per line, and compared
//! with the committed snapshots (`cargo insta review` after an intended change).

use std::fmt::Write;

use ralpc_codegen::{lower, model_hash, Instruction, ModelRef, Plan};
use ralpc_passes::cluster::{Cluster, Link};
use ralpc_passes::layers::{LayerGraph, Split};
use ralpc_passes::plan::{CostOptions, Costs, Schedule, Stage, Strategy};
use ralpc_passes::synthetic;

fn setup() -> (LayerGraph, Cluster) {
    let graph = synthetic::graph(6, 16, false, 7);
    let cluster = Cluster::preset("dgx-a100")
        .unwrap()
        .with_flat_network(Link {
            latency_us: 5.0,
            bandwidth: 1e11,
        });
    (graph, cluster)
}

fn lowered(graph: &LayerGraph, cluster: &Cluster, gpus: u32, strategy: &Strategy) -> Plan {
    let costs = Costs::new(graph, cluster, gpus, CostOptions::default());
    let model = ModelRef {
        name: "golden".into(),
        blake3: model_hash(b"golden"),
        layers: graph.layers.len() as u32,
        inputs: Default::default(),
        values: Default::default(),
        path: None,
    };
    let plan = lower(&costs, strategy, model).unwrap();
    plan.validate().unwrap();
    plan
}

/// One line per instruction (durations to 0.1 µs), then each rank's buffers and peak.
fn listing(plan: &Plan) -> String {
    let mut out = String::new();
    for (rank, program) in plan.programs.iter().enumerate() {
        let _ = writeln!(out, "rank {rank}:");
        for i in program {
            let what = match *i {
                Instruction::Forward {
                    layer, microbatch, ..
                } => format!("forward  L{layer} mb{microbatch}"),
                Instruction::Backward {
                    layer, microbatch, ..
                } => format!("backward L{layer} mb{microbatch}"),
                Instruction::Send { to, bytes, tag, .. } => {
                    format!("send → {to} {bytes} B tag {tag}")
                }
                Instruction::Recv {
                    from, bytes, tag, ..
                } => format!("recv ← {from} {bytes} B tag {tag}"),
                Instruction::Step { bytes, .. } => format!("step {bytes} B"),
                _ => {
                    let (group, bytes) = i.collective().unwrap_or_default();
                    format!("{} group {group} {bytes} B", i.op())
                }
            };
            let _ = writeln!(out, "  {what:<40} {:>9.1} µs", i.us());
        }
        let peak = plan.peak_memory_bytes()[rank];
        let _ = writeln!(out, "  {} buffers, peak {peak} B", plan.buffers[rank].len());
    }
    let _ = writeln!(out, "groups: {:?}", plan.groups);
    out
}

#[test]
fn data_parallel_on_two_gpus() {
    let (graph, cluster) = setup();
    let strategy = Strategy::data_parallel(graph.layers.len(), 2);
    insta::assert_snapshot!(listing(&lowered(&graph, &cluster, 2, &strategy)));
}

#[test]
fn two_stage_1f1b_pipeline() {
    let (graph, cluster) = setup();
    let n = graph.layers.len();
    let strategy = Strategy {
        schedule: Schedule::OneFOneB,
        microbatches: 2,
        stages: vec![
            Stage {
                first_layer: 0,
                last_layer: 2,
                first_rank: 0,
                gpus: 1,
            },
            Stage {
                first_layer: 3,
                last_layer: n - 1,
                first_rank: 1,
                gpus: 1,
            },
        ],
        layers: vec![Split::NONE; n],
        zero: 0,
        shard_groups: 1,
        recompute: Vec::new(),
    };
    insta::assert_snapshot!(listing(&lowered(&graph, &cluster, 2, &strategy)));
}

#[test]
fn soap_dense_layer_over_two_gpus() {
    let (graph, cluster) = setup();
    let n = graph.layers.len();
    let mut strategy = Strategy::data_parallel(n, 2);
    strategy.layers[n - 1] = Split {
        sample: 1,
        context: 1,
        attribute: 1,
        parameter: 2,
    };
    insta::assert_snapshot!(listing(&lowered(&graph, &cluster, 2, &strategy)));
}
