//! The one front door ([`planner::plan`]): which planner takes a model, what each returns,
//! and the requests it refuses.

mod common;

use ralpc_ir::models::GptSpec;
use ralpc_passes::cluster::{Cluster, Precision};
use ralpc_passes::cost::rates::IN_STEP;
use ralpc_passes::plan::{evaluate, Family, PlanError};
use ralpc_passes::planner::{self, Ask, Model, Priced};
use ralpc_passes::profile::{Device, Entry, Point, Profile, Signature, FORMAT};
use ralpc_passes::transformer::{self, Knobs};

/// A small GPT: 4 blocks of hidden 256, 8 heads, sequence 128.
fn small_gpt(batch: u64) -> Model {
    let (graph, info) = common::generated(&GptSpec::megatron(4, 256, 8, 128, 1024), batch);
    Model::Graph {
        graph: Box::new(graph),
        info: Box::new(info),
        batch,
        fixed_batch: None,
    }
}

fn ask() -> Ask<'static> {
    Ask {
        model: "gpt.onnx",
        ..Ask::default()
    }
}

#[test]
fn a_gpt_is_priced_by_the_closed_form_and_layer_by_layer_side_by_side() {
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let planned = planner::plan(small_gpt(16), &cluster, 8, &ask()).unwrap();
    let Priced::Transformer(t) = &planned.priced else {
        panic!("a GPT goes to the transformer planner");
    };
    let layered = t.layered.as_ref().expect("a layered form");
    let evaluation = layered.evaluation.as_ref().expect("priced layer by layer");
    // The costs the plan hands to the lowering give the layered price it reports.
    let gap = t.gap().unwrap();
    let again = evaluate(&planned.costs(), planned.strategy().unwrap()).unwrap();
    assert_eq!(again.iteration_time_us, evaluation.iteration_time_us);
    // Both models price the same work at the same kernel rates: far apart, one is wrong.
    assert!(gap.abs() < 0.25, "gap {gap}");
    assert_eq!(planned.graph.batch, 16);
}

#[test]
fn other_families_place_a_gpt_layer_by_layer() {
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let ask = Ask {
        family: Some(Family::Dp),
        ..ask()
    };
    let planned = planner::plan(small_gpt(16), &cluster, 4, &ask).unwrap();
    let Priced::Layers(found) = &planned.priced else {
        panic!("--strategy dp places layers");
    };
    assert_eq!(found.chosen.family, Family::Dp);
    assert_eq!(
        planned.strategy().unwrap().layers.len(),
        planned.graph.layers.len()
    );
}

#[test]
fn requests_that_cannot_hold_are_refused_by_name() {
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let refused = |ask: Ask<'static>| match planner::plan(small_gpt(16), &cluster, 8, &ask) {
        Err(PlanError::Request(m)) => m,
        Err(e) => panic!("not a request error: {e}"),
        Ok(_) => panic!("planned"),
    };
    let knobs = Knobs {
        tensor: Some(2),
        ..Knobs::default()
    };
    let m = refused(Ask {
        family: Some(Family::Soap),
        knobs,
        ..ask()
    });
    assert!(m.contains("--strategy soap"), "{m}");
    let m = refused(Ask {
        precision: Some(Precision::Fp8),
        ..ask()
    });
    assert!(m.contains("fp8") && m.contains("a100"), "{m}");
    let m = refused(Ask {
        microbatches: Some(4),
        ..ask()
    });
    assert!(m.contains("--micro-batch-size"), "{m}");
}

/// A profile of `products` (at batch 1 and 2, `us` forward and twice that backward each).
fn profile_of(signatures: impl IntoIterator<Item = Signature>, us: f64) -> Profile {
    let point = |batch| Point {
        batch,
        forward_us: us * batch as f64,
        backward_us: 2.0 * us * batch as f64,
        peak_bytes: None,
        forward_spread: None,
        backward_spread: None,
    };
    Profile {
        format: FORMAT.to_owned(),
        device: Device {
            name: "test".into(),
            note: String::new(),
        },
        precision: Precision::Fp32,
        entries: signatures
            .into_iter()
            .map(|signature| Entry {
                signature,
                points: vec![point(1), point(2)],
            })
            .collect(),
    }
    .normalize("test.json")
    .unwrap()
}

#[test]
fn a_profile_prices_the_blocks_dense_products_from_its_measurements() {
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let spec = GptSpec::megatron(4, 256, 8, 128, 1024);
    let shape = common::recognized(&spec, 16);
    // Every product of one rank at t = 1 and 2, each far slower than the GEMM rate gives.
    let us = 1e5;
    let signatures = [1, 2]
        .into_iter()
        .flat_map(|t| shape.dense_gemms(t).map(|g| g.signature(shape.sequence)));
    let profile = profile_of(signatures, us);
    let pinned = |t: u32| Knobs {
        tensor: Some(t),
        pipeline: Some(1),
        micro_batch: Some(1),
        ..Knobs::default()
    };
    let plan = |profile: Option<&Profile>, t: u32| {
        let ask = Ask {
            profile,
            precision: Some(Precision::Fp32),
            knobs: pinned(t),
            ..ask()
        };
        let planned = planner::plan(small_gpt(16), &cluster, 8, &ask).unwrap();
        let Priced::Transformer(found) = planned.priced else {
            panic!("a GPT goes to the transformer planner");
        };
        found.found.best
    };
    for t in [1, 2] {
        let (analytical, measured) = (plan(None, t), plan(Some(&profile), t));
        assert!(analytical.measured().is_empty());
        assert_eq!(measured.measured(), transformer::DENSE_GEMMS);
        // The four products' forward passes at micro-batch 1, kept at IN_STEP of their
        // isolated rate like every kernel, replace the analytical products.
        let products = 4.0 * us / IN_STEP;
        let rest = measured.block_forward_us - products;
        assert!(
            rest > 0.0 && rest < analytical.block_forward_us,
            "t{t}: {} with the profile, {} without",
            measured.block_forward_us,
            analytical.block_forward_us
        );
    }
    // A product the profile lacks is priced analytically: t = 4's QKV ([128, 256] →
    // [128, 192]); its second MLP product has t = 1's projection's shapes, so it is found.
    let at_4 = plan(Some(&profile), 4).measured();
    assert!(
        !at_4.contains(&"qkv") && at_4.contains(&"mlp_out"),
        "{at_4:?}"
    );
}

#[test]
fn a_profile_at_another_precision_is_refused() {
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let profile = profile_of([], 1.0);
    let ask = Ask {
        profile: Some(&profile),
        precision: Some(Precision::Bf16),
        ..ask()
    };
    match planner::plan(small_gpt(16), &cluster, 8, &ask) {
        Err(PlanError::Request(m)) => assert!(m.contains("fp32") && m.contains("bf16"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("planned"),
    }
}

/// One GPU's own plan does on one GPU what the single-GPU baseline does, the optimizer step
/// included: its GPU-time amplification is 1, so the default budget never refuses it.
#[test]
fn one_gpus_own_plan_amplifies_nothing() {
    let cluster = Cluster::preset("dgx-a100").unwrap();
    let ask = Ask {
        family: Some(Family::Dp),
        ..ask()
    };
    let planned = planner::plan(small_gpt(16), &cluster, 1, &ask).unwrap();
    let Priced::Layers(found) = &planned.priced else {
        panic!("--strategy dp places layers");
    };
    let amplification = found.chosen.evaluation.gpu_sec_amplification;
    assert!((amplification - 1.0).abs() < 1e-9, "{amplification}");
}

/// A transformer plan's single-GPU baseline runs at its fastest micro-batch size, as the
/// plans do: no plan uses less GPU time than one GPU doing it all (it was priced one
/// sequence at a time, which made GPT-2 on 8 GPUs look 12× faster than one).
#[test]
fn no_transformer_plan_beats_one_gpus_gpu_time() {
    let cluster = Cluster::preset("dgx-a100").unwrap();
    for gpus in [1u32, 2, 8] {
        let planned = planner::plan(small_gpt(32), &cluster, gpus, &ask()).unwrap();
        let Priced::Transformer(t) = &planned.priced else {
            panic!("a GPT goes to the transformer planner");
        };
        let best = &t.found.best;
        let gpu_time = best.iteration_time_us * best.parallelism.gpus() as f64;
        let amplification = gpu_time / t.single_gpu_time_us;
        assert!(amplification >= 1.0 - 1e-9, "{gpus} GPUs: {amplification}");
    }
}

/// A cluster of 8 A100s and 8 H100s (Gavel's premise: clusters mix types): the plan is
/// faster than its 16 GPUs priced as the slowest type, and no slower than its fastest 8
/// alone, whichever GPUs it takes.
#[test]
fn a_cluster_of_two_gpu_types_plans_no_slower_than_its_fastest_gpus() {
    use ralpc_passes::plan::{self, Request};
    let (_, _, graph) = common::layers("fixtures/onnx/vgg16/model.onnx", 256);
    let mixed = Cluster::from_toml(
        "[[group]]\npreset = \"dgx-a100\"\n[[group]]\npreset = \"dgx-h100\"\n",
        "mixed.toml",
    )
    .unwrap();
    let at = |cluster: &Cluster, gpus| {
        let costs = plan::Costs::new(&graph, cluster, gpus, Default::default());
        let request = Request {
            tolerance: None,
            ..Request::default()
        };
        let found = plan::plan(&costs, &request).unwrap();
        (
            found.chosen.evaluation.iteration_time_us,
            found.chosen.strategy,
        )
    };
    let (both, strategy) = at(&mixed, 16);
    let (a100s, _) = at(&Cluster::preset("dgx-a100x2").unwrap(), 16);
    let (h100s, _) = at(&Cluster::preset("dgx-h100").unwrap(), 8);
    println!("mixed {both:.0} µs; 16 A100 {a100s:.0} µs; 8 H100 {h100s:.0} µs");
    assert!(both < a100s, "{both} vs {a100s}");
    assert!(both <= h100s * (1.0 + 1e-9), "{both} vs {h100s}");
    // It runs on the H100s: their ranks, 8 to 15.
    assert!(
        strategy.stages.iter().all(|s| s.first_rank >= 8),
        "{strategy:?}"
    );
}

/// Ranks of a node group that `--gpus` cuts through are planned as the group's part, and a
/// strategy file's `first_rank` places a stage: read back, written back, refused where it
/// would overlap another stage or run past any cluster.
#[test]
fn stages_start_where_they_say_and_partial_groups_are_planned() {
    use ralpc_passes::plan::{self, Request, StrategyFile};
    let (_, _, vgg) = common::layers("fixtures/onnx/vgg16/model.onnx", 256);
    let mixed = Cluster::from_toml(
        "[[group]]\npreset = \"dgx-a100\"\n[[group]]\npreset = \"dgx-h100\"\n",
        "mixed.toml",
    )
    .unwrap();
    for gpus in [10, 12] {
        let costs = plan::Costs::new(&vgg, &mixed, gpus, Default::default());
        let found = plan::plan(&costs, &Request::default()).unwrap();
        let last = found.chosen.strategy.stages.last().unwrap();
        assert!(last.first_rank + last.gpus <= gpus, "{last:?}");
    }
    let (_, _, cnn) = common::layers("fixtures/train/cnn.onnx", 32);
    let file = |stages: &str| -> StrategyFile {
        serde_json::from_str(&format!(
            r#"{{"format": "ralpc-strategy/1", "stages": [{stages}]}}"#
        ))
        .unwrap()
    };
    let cluster = Cluster::preset("dgx-h100").unwrap();
    let costs = plan::Costs::new(&cnn, &cluster, 4, Default::default());
    let placed =
        file(r#"{"first_layer": "conv0", "last_layer": "fc1", "replicas": 1, "first_rank": 2}"#)
            .resolve(&cnn)
            .unwrap();
    assert_eq!(placed.stages[0].first_rank, 2);
    assert!(plan::evaluate(&costs, &placed).unwrap().fits);
    assert_eq!(
        StrategyFile::of(&cnn, &placed).stages[0].first_rank,
        Some(2)
    );
    // Stages one after the other write no first rank.
    let consecutive = file(
        r#"{"first_layer": "conv0", "last_layer": "pool1", "replicas": 2},
           {"first_layer": "fc0", "last_layer": "fc1", "replicas": 2}"#,
    )
    .resolve(&cnn)
    .unwrap();
    assert!(StrategyFile::of(&cnn, &consecutive)
        .stages
        .iter()
        .all(|s| s.first_rank.is_none()));
    let overlapping = file(
        r#"{"first_layer": "conv0", "last_layer": "pool1", "replicas": 2},
           {"first_layer": "fc0", "last_layer": "fc1", "replicas": 2, "first_rank": 1}"#,
    )
    .resolve(&cnn)
    .unwrap_err()
    .to_string();
    assert!(
        overlapping.contains("stages[1].first_rank"),
        "{overlapping}"
    );
    let far = file(
        r#"{"first_layer": "conv0", "last_layer": "fc1", "replicas": 2, "first_rank": 4294967295}"#,
    )
    .resolve(&cnn)
    .unwrap();
    assert!(plan::evaluate(&costs, &far).is_err());
}
