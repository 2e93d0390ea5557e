//! Properties of the partition search over random layer graphs (chains and branchy graphs)
//! and clusters: every plan is a valid placement, fits, respects the physical bound and
//! the budget; data parallelism has its closed-form cost; `auto` is never worse than a
//! family it contains; identical inputs give identical plans.

use proptest::prelude::*;
use ralpc_passes::cluster::{Cluster, Link, Precision};
use ralpc_passes::cost::comm::ring_all_reduce_us;
use ralpc_passes::cost::{lower_bound_us, ComputeModel};
use ralpc_passes::layers::{LayerGraph, Split};
use ralpc_passes::plan::{self, CostOptions, Costs, Family, PlanError, Planned, Request};
use ralpc_passes::synthetic;

const FAMILIES: [Family; 4] = [Family::Dp, Family::Burst, Family::Soap, Family::Pipeline];

#[derive(Clone, Debug)]
struct Case {
    layers: usize,
    batch: u64,
    branchy: bool,
    seed: u64,
    nodes: u32,
    gpus: u32,
    flat: Option<Link>,
    memory_limit: Option<u64>,
    /// The export fixes its batch ([`LayerGraph::fixed_batch`]).
    fixed_batch: bool,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        2usize..30,
        prop::sample::select(vec![4u64, 16, 32, 64, 256]),
        any::<bool>(),
        any::<u64>(),
        1u32..=2,
        1u32..=16,
        prop::option::of((0.0f64..50.0, 1e9f64..3e11)),
        prop::option::weighted(0.3, 4u64 << 30..40u64 << 30),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(layers, batch, branchy, seed, nodes, gpus, flat, memory_limit, fixed_batch)| Case {
                layers,
                batch,
                branchy,
                seed,
                nodes,
                gpus: gpus.min(nodes * 8),
                flat: flat.map(|(latency_us, bandwidth)| Link {
                    latency_us,
                    bandwidth,
                }),
                memory_limit,
                fixed_batch,
            },
        )
}

fn setup(case: &Case) -> (LayerGraph, Cluster) {
    let graph = synthetic::graph(case.layers, case.batch, case.branchy, case.seed);
    let mut cluster = Cluster::preset(&format!("dgx-a100x{}", case.nodes)).unwrap();
    if let Some(link) = case.flat {
        cluster = cluster.with_flat_network(link);
    }
    (graph, cluster)
}

fn options(case: &Case) -> CostOptions<'static> {
    CostOptions {
        memory_limit: case.memory_limit,
        ..CostOptions::default()
    }
}

fn run(costs: &Costs<'_>, family: Family, tolerance: Option<f64>) -> Result<Planned, PlanError> {
    plan::plan(
        costs,
        &Request {
            family: Some(family),
            tolerance,
            ..Request::default()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn plans_are_valid_placements(case in cases()) {
        let (mut graph, cluster) = setup(&case);
        // A fixed batch: no layer's samples are split, in any family.
        graph.fixed_batch = case.fixed_batch.then(|| "baked into a node".to_owned());
        let costs = Costs::new(&graph, &cluster, case.gpus, options(&case));
        let bound = lower_bound_us(&graph, &cluster, case.gpus, Precision::Tf32);
        for family in FAMILIES.into_iter().chain([Family::Auto]) {
            let planned = match run(&costs, family, None) {
                Ok(p) => p,
                // Only memory may make planning fail without a budget.
                Err(PlanError::OutOfMemory { need, capacity, .. }) => {
                    prop_assert!(need > capacity);
                    continue;
                }
                Err(e) => return Err(TestCaseError::fail(format!("{family:?}: {e}"))),
            };
            let s = &planned.chosen.strategy;
            let e = &planned.chosen.evaluation;
            // Every layer placed exactly once, in stages that cover the layers in order.
            prop_assert_eq!(s.layers.len(), graph.layers.len());
            prop_assert_eq!(s.stages[0].first_layer, 0);
            prop_assert_eq!(s.stages.last().unwrap().last_layer, graph.layers.len() - 1);
            for pair in s.stages.windows(2) {
                prop_assert_eq!(pair[0].last_layer + 1, pair[1].first_layer);
                prop_assert!(pair[0].first_rank + pair[0].gpus <= pair[1].first_rank);
            }
            let stage_of = s.stage_of_layers();
            for (l, split) in s.layers.iter().enumerate() {
                let stage = &s.stages[stage_of[l]];
                // s·a·p is the layer's group, inside its stage and the cluster.
                prop_assert!(split.degree() >= 1 && split.degree() <= stage.gpus);
                prop_assert!(stage.first_rank + stage.gpus <= case.gpus);
                prop_assert!(u64::from(split.sample * s.microbatches) <= graph.sample_pieces());
            }
            prop_assert!(e.fits, "{family:?} chose a plan that does not fit");
            if let Some(limit) = case.memory_limit {
                prop_assert!(e.peak_memory_bytes <= limit as f64);
            }
            prop_assert!(
                e.iteration_time_us >= bound * (1.0 - 1e-9),
                "{family:?}: {} µs under the bound {bound} µs", e.iteration_time_us
            );
            // What the search reports is what the evaluator says of its strategy.
            prop_assert_eq!(&plan::evaluate(&costs, s).unwrap(), e);
        }
    }

    #[test]
    fn auto_is_never_worse_than_a_family(case in cases()) {
        let (graph, cluster) = setup(&case);
        let costs = Costs::new(&graph, &cluster, case.gpus, options(&case));
        let Ok(auto) = run(&costs, Family::Auto, None) else { return Ok(()) };
        for family in FAMILIES {
            if let Ok(p) = run(&costs, family, None) {
                prop_assert!(
                    auto.chosen.evaluation.iteration_time_us
                        <= p.chosen.evaluation.iteration_time_us * (1.0 + 1e-12),
                    "auto {} vs {family:?} {}",
                    auto.chosen.evaluation.iteration_time_us,
                    p.chosen.evaluation.iteration_time_us
                );
            }
        }
    }

    #[test]
    fn data_parallel_has_its_closed_form_cost(case in cases()) {
        // On a flat network: Σ compute of each layer's 1/N share, plus the optimizer step,
        // plus the gradients' ring all-reduce (2(N−1)α + 2(N−1)/N · bytes/β) where it is not
        // hidden behind backward: at most all of it (one fused bucket after backward), at
        // least its bandwidth part beyond the backward pass.
        let link = case.flat.unwrap_or(Link { latency_us: 10.0, bandwidth: 1e11 });
        let graph = synthetic::graph(case.layers, case.batch, case.branchy, case.seed);
        let cluster = Cluster::preset("dgx-a100x2").unwrap().with_flat_network(link);
        let n = case.gpus.min(u32::try_from(graph.batch).unwrap());
        let costs = Costs::new(&graph, &cluster, n, CostOptions::default());
        let Ok(dp) = run(&costs, Family::Dp, None) else { return Ok(()) };
        let model = ComputeModel::new(cluster.gpu(0), Precision::Tf32);
        let (mut forward, mut backward) = (0.0, 0.0);
        for l in &graph.layers {
            let t = model.layer(l, Split::samples(n), graph.batch);
            forward += t.fwd_us;
            backward += t.bwd_us;
        }
        let sync = ring_all_reduce_us(n, link, graph.param_bytes() as f64);
        let sync_bandwidth = sync - ring_all_reduce_us(n, link, 0.0);
        // The optimizer step: weights, gradients and momentum read, weights and momentum
        // written, at HBM speed.
        let step = graph.param_bytes() as f64 * 5.0 / cluster.gpu(0).hbm_bandwidth * 1e6;
        let most = forward + backward + sync + step;
        let least = forward + backward.max(sync_bandwidth) + step;
        let got = dp.chosen.evaluation.iteration_time_us;
        prop_assert!(
            got <= most * (1.0 + 1e-6) && got >= least * (1.0 - 1e-6),
            "dp {got} µs, closed form between {least} and {most} µs"
        );
        // Every GPU is busy for the whole iteration.
        prop_assert!(
            (dp.chosen.evaluation.gpu_time_us - f64::from(n) * got).abs() <= 1e-6 * got * f64::from(n)
        );
    }

    #[test]
    fn the_budget_bounds_amplification(case in cases(), tolerance in 0.0f64..2.0) {
        let (graph, cluster) = setup(&case);
        let costs = Costs::new(&graph, &cluster, case.gpus, options(&case));
        for family in [Family::Burst, Family::Soap, Family::Auto] {
            match run(&costs, family, Some(tolerance)) {
                Ok(p) => prop_assert!(
                    p.chosen.evaluation.gpu_sec_amplification <= 1.0 + tolerance + 1e-9,
                    "{family:?}: {}", p.chosen.evaluation.gpu_sec_amplification
                ),
                Err(PlanError::OutOfMemory { .. } | PlanError::OverBudget { .. }) => {}
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            }
        }
    }

    #[test]
    fn identical_inputs_give_identical_plans(case in cases()) {
        let (graph, cluster) = setup(&case);
        let first = {
            let costs = Costs::new(&graph, &cluster, case.gpus, options(&case));
            run(&costs, Family::Auto, None).map(|p| serde_json::to_string(&p).unwrap())
        };
        let second = {
            let costs = Costs::new(&graph, &cluster, case.gpus, options(&case));
            run(&costs, Family::Auto, None).map(|p| serde_json::to_string(&p).unwrap())
        };
        prop_assert_eq!(first.ok(), second.ok());
    }
}
