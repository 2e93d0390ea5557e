//! The simulator against the planner: the iteration time it finds by running a lowered
//! plan agrees with the planner's prediction, and it detects plans that cannot run.

use std::path::Path;

use ralpc_codegen::sim::{simulate, SimError};
use ralpc_codegen::{lower, model_hash, Instruction, ModelRef, Plan};
use ralpc_passes::cluster::Cluster;
use ralpc_passes::layers::LayerGraph;
use ralpc_passes::layers::Split;
use ralpc_passes::plan::{
    self, evaluate, CostOptions, Costs, Family, Request, Schedule, Stage, Strategy,
};

fn vgg16() -> LayerGraph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/onnx/vgg16/model.onnx");
    let mut model = ralpc_ir::onnx::import(&path).unwrap();
    let bindings = ralpc_ir::Bindings {
        batch: Some(32),
        ..Default::default()
    };
    ralpc_ir::bind(&mut model.graph, &bindings).unwrap();
    let info = ralpc_ir::verify(&model.graph).unwrap();
    ralpc_passes::layers::build(&model.graph, &info, 32, Default::default()).unwrap()
}

fn model(graph: &LayerGraph) -> ModelRef {
    ModelRef {
        name: "vgg16".into(),
        blake3: model_hash(b"vgg16"),
        layers: graph.layers.len() as u32,
        inputs: Default::default(),
        values: Default::default(),
        path: None,
    }
}

#[test]
fn simulated_time_agrees_with_the_prediction() {
    agreement("dgx-a100", 8);
}

/// Two servers: transfers and collectives queue for the network interfaces.
#[test]
fn simulated_time_agrees_with_the_prediction_across_servers() {
    agreement("dgx-a100x2", 16);
}

fn agreement(preset: &str, gpus: u32) {
    let graph = vgg16();
    let cluster = Cluster::preset(preset).unwrap();
    let costs = Costs::new(&graph, &cluster, gpus, CostOptions::default());
    let cases = [
        (Family::Dp, None, None),
        (Family::Burst, None, None),
        (Family::Soap, None, None),
        (Family::Pipeline, Some(Schedule::OneFOneB), Some(4)),
        (Family::Pipeline, Some(Schedule::ZeroBubble), Some(4)),
        (Family::Pipeline, Some(Schedule::GPipe), Some(8)),
        (Family::Pipeline, Some(Schedule::Async), Some(1)),
        (Family::Pipeline, Some(Schedule::Async), Some(4)),
    ];
    println!("VGG16, batch 32, {preset} ({gpus} GPUs): predicted vs simulated iteration");
    for (family, schedule, microbatches) in cases {
        let request = Request {
            family: Some(family),
            schedule,
            microbatches,
            ..Request::default()
        };
        let planned = plan::plan(&costs, &request).unwrap();
        let lowered = lower(&costs, &planned.chosen.strategy, model(&graph)).unwrap();
        let sim = simulate(&lowered).unwrap();
        let predicted = planned.chosen.evaluation.iteration_time_us;
        let ratio = sim.iteration_time_us / predicted;
        let stages: Vec<String> = planned
            .chosen
            .strategy
            .stages
            .iter()
            .map(|s| s.gpus.to_string())
            .collect();
        println!(
            "  {:<9} {:<6} M={:<2} stages {:<7} predicted {:9.3} ms  simulated {:9.3} ms  ratio {ratio:.4}",
            family.name(),
            planned.chosen.strategy.schedule.name(),
            planned.chosen.strategy.microbatches,
            stages.join("-"),
            predicted / 1e3,
            sim.iteration_time_us / 1e3
        );
        let peak = lowered.peak_memory_bytes().into_iter().max().unwrap_or(0) as f64;
        println!(
            "      peak memory: from the instruction order {:.3} GB, predicted {:.3} GB",
            peak / 1e9,
            lowered.predicted.peak_memory_bytes / 1e9
        );
        // The planner counts the largest input gradient as if it were live with every
        // activation (an upper bound).
        let least = lowered.predicted.peak_memory_bytes * 0.97;
        assert!(
            peak >= least && peak <= lowered.predicted.peak_memory_bytes * 1.01,
            "peak memory {peak} vs predicted {}",
            lowered.predicted.peak_memory_bytes
        );
        assert!(
            (ratio - 1.0).abs() <= 0.05,
            "{family:?} {schedule:?}: simulated {} µs vs predicted {predicted} µs",
            sim.iteration_time_us
        );
    }
}

/// VGG16 cut into `stages` equal stages of `replicas` GPUs each, on `groups` GPU groups
/// (stage `k` on group `k mod groups`: interleaved when fewer than the stages).
fn equal_stages(graph: &LayerGraph, stages: usize, replicas: u32, groups: usize) -> Vec<Stage> {
    let n = graph.layers.len();
    (0..stages)
        .map(|k| Stage {
            first_layer: k * n / stages,
            last_layer: (k + 1) * n / stages - 1,
            first_rank: (k % groups) as u32 * replicas,
            gpus: replicas,
        })
        .collect()
}

/// Pipelines of several depths, microbatch counts, ZeRO stages and schedules (1F1B,
/// zero-bubble, interleaved): the simulated iteration within 3 % of the price (5 % under
/// ZeRO-2, whose every microbatch's reduce-scatters overlap the work after them), and, but
/// interleaved, each stage's fullest GPU, from the instruction order's buffers, within 5 %
/// of the evaluator's (which counts what zero-bubble's owed weight passes keep, and under
/// ZeRO-2 each layer's whole gradients while it makes them).
#[test]
fn pipelines_simulate_as_priced() {
    let graph = vgg16();
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let cases = [
        (1, 4, 4, 0, 1),
        (4, 1, 1, 0, 4),
        (4, 2, 1, 0, 4),
        (4, 8, 1, 0, 4),
        (2, 4, 2, 1, 2),
        (4, 4, 1, 0, 2),
        (8, 8, 1, 0, 4),
        (2, 8, 2, 2, 2),
    ];
    for (stages, microbatches, replicas, zero, groups) in cases {
        let schedules = match groups < stages {
            true => vec![Schedule::OneFOneB],
            false => vec![Schedule::OneFOneB, Schedule::ZeroBubble],
        };
        for schedule in schedules {
            let strategy = Strategy {
                schedule,
                microbatches,
                stages: equal_stages(&graph, stages, replicas, groups),
                layers: vec![Split::samples(replicas); graph.layers.len()],
                zero,
                shard_groups: 1,
                recompute: Vec::new(),
            };
            let costs = Costs::new(&graph, &cluster, 8, CostOptions::default());
            let priced = evaluate(&costs, &strategy).unwrap();
            let lowered = lower(&costs, &strategy, model(&graph)).unwrap();
            let sim = simulate(&lowered).unwrap();
            let held = lowered.peak_memory_bytes();
            let ratios: Vec<f64> = strategy
                .stages
                .iter()
                .zip(&priced.stages)
                .map(|(s, c)| {
                    let ranks = s.first_rank as usize..(s.first_rank + s.gpus) as usize;
                    held[ranks].iter().copied().max().unwrap_or(0) as f64 / c.memory_bytes
                })
                .collect();
            let time = sim.iteration_time_us / priced.iteration_time_us;
            println!(
                "{stages} stages on {groups} groups, M{microbatches} x{replicas} ZeRO-{zero} {:<5}: \
                 simulated/priced time {time:.4}, memory per stage {ratios:.3?}",
                schedule.name()
            );
            let tolerance = if zero >= 2 { 0.05 } else { 0.03 };
            assert!((time - 1.0).abs() <= tolerance, "time {time}");
            // Interleaved, a GPU's stages share its memory; the evaluator's in-flight chunks
            // (Megatron's warm-up) are up to 15 % under the instruction order's there.
            if groups == stages {
                assert!(
                    ratios.iter().all(|r| (r - 1.0).abs() <= 0.05),
                    "memory {ratios:?}"
                );
            }
        }
    }
}

/// ZeRO-3 pipelines hold what the evaluator prices: each layer's shards, and while its
/// backward runs its weights gathered whole and its gradients before their reduce-scatter,
/// every stage's fullest GPU within 5 %. (Their time is not yet: the per-pass gathers are
/// paid in full, 6 % under the simulation on 1F1B and up to 27 % over on zb-h1, issue 60.)
#[test]
fn zero_3_pipelines_hold_what_they_are_priced() {
    let graph = vgg16();
    let cluster = Cluster::preset("dgx-a100").unwrap();
    for schedule in [Schedule::OneFOneB, Schedule::ZeroBubble] {
        let strategy = Strategy {
            schedule,
            microbatches: 8,
            stages: equal_stages(&graph, 2, 2, 2),
            layers: vec![Split::samples(2); graph.layers.len()],
            zero: 3,
            shard_groups: 1,
            recompute: Vec::new(),
        };
        let costs = Costs::new(&graph, &cluster, 8, CostOptions::default());
        let priced = evaluate(&costs, &strategy).unwrap();
        let lowered = lower(&costs, &strategy, model(&graph)).unwrap();
        let held = lowered.peak_memory_bytes();
        for (s, c) in strategy.stages.iter().zip(&priced.stages) {
            let ranks = s.first_rank as usize..(s.first_rank + s.gpus) as usize;
            let fullest = held[ranks].iter().copied().max().unwrap_or(0) as f64;
            let ratio = fullest / c.memory_bytes;
            assert!(
                (ratio - 1.0).abs() <= 0.05,
                "{} memory {ratio}",
                schedule.name()
            );
        }
    }
}

#[test]
fn a_cycle_of_receives_is_a_deadlock() {
    let graph = vgg16();
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let costs = Costs::new(&graph, &cluster, 2, CostOptions::default());
    let strategy = plan::Strategy::data_parallel(graph.layers.len(), 2);
    let mut p: Plan = lower(&costs, &strategy, model(&graph)).unwrap();
    // Each rank first waits for a message the other sends only afterwards (inserting
    // instructions would shift the buffers' indices: drop them, dependencies do not matter).
    p.buffers = vec![Vec::new(); 2];
    for (rank, peer) in [(0u32, 1u32), (1, 0)] {
        let program = &mut p.programs[rank as usize];
        program.insert(
            0,
            Instruction::Recv {
                from: peer,
                bytes: 4,
                tag: 1_000_000,
                us: 1.0,
                latency_us: 0.0,
            },
        );
        program.push(Instruction::Send {
            to: peer,
            bytes: 4,
            tag: 1_000_000,
            us: 1.0,
            latency_us: 0.0,
        });
    }
    p.validate().expect("matched, so valid on paper");
    let err = simulate(&p).unwrap_err();
    assert!(matches!(err, SimError::Deadlock(_)));
    assert!(err.to_string().contains("rank 0 at instruction 0"), "{err}");
}
