//! Hybrid sharded data parallelism (FSDP2's HSDP, Megatron-Core's partial distributed
//! optimizer): ZeRO's state sharded inside groups of the data-parallel ranks, the groups
//! all-reducing their shards' gradients once an iteration.

mod common;

use ralpc_ir::models::GptSpec;
use ralpc_passes::cluster::Cluster;
use ralpc_passes::plan::PlanError;
use ralpc_passes::transformer::{
    estimate, search, Knobs, Overlap, Parallelism, Recompute, Setting, Transformer,
};

/// A 13 B GPT (40 blocks of 5120) at sequence 4096.
fn gpt_13b() -> Transformer {
    Transformer::from(&GptSpec::llama(40, 5120, 40, 40, 13824, 4096, 32000))
}

/// On 8 DGX H100s (64 GPUs) under ZeRO-3, a shard group a node holds 8 times the sharded
/// state of one group over all 64 GPUs, gathers its weights over NVLink instead of the
/// network, and adds one all-reduce of its shards' gradients across the 8 nodes. Where the
/// gathers are not prefetched (ralpc's own executor gathers each block when it runs), the
/// node-local gathers win; with Megatron-Core's overlaps the search takes the faster.
#[test]
fn a_shard_group_a_node_trades_memory_for_the_network() {
    let model = gpt_13b();
    let cluster = Cluster::preset("eos").unwrap().times(8);
    let base = Parallelism {
        data: 64,
        zero: 3,
        ..Parallelism::one_gpu(1)
    };
    let hybrid_par = Parallelism {
        shard_groups: 8,
        ..base
    };
    assert_eq!(hybrid_par.shard_size(), 8);
    let unhidden = Setting {
        overlap: Overlap::NONE,
        ..common::bf16_adam(&model, &cluster, 64, 256)
    };
    let flat = estimate(&unhidden, &base);
    let hybrid = estimate(&unhidden, &hybrid_par);
    // The sharded states: 8 times as much per GPU (no tied embedding here).
    let ratio = hybrid.memory.optimizer / flat.memory.optimizer;
    assert!((ratio - 8.0).abs() < 0.01, "{ratio}");
    assert!(hybrid.memory.weights > flat.memory.weights);
    println!(
        "13 B ZeRO-3 on 64 H100, gathers not prefetched: sharded over 64 {:.3} s ({:.1} GiB), \
         over each node {:.3} s ({:.1} GiB)",
        flat.iteration_time_us / 1e6,
        flat.peak_memory_bytes / (1u64 << 30) as f64,
        hybrid.iteration_time_us / 1e6,
        hybrid.peak_memory_bytes / (1u64 << 30) as f64,
    );
    assert!(hybrid.time.data_comm_us < flat.time.data_comm_us);
    assert!(hybrid.iteration_time_us < flat.iteration_time_us);
    // With the overlaps, the search under ZeRO-3 (one micro-batch size, no tensor or
    // pipeline stages) takes the fastest of the two shardings and three recomputations.
    let overlapped = common::bf16_adam(&model, &cluster, 64, 256);
    let times: Vec<f64> = [base, hybrid_par]
        .iter()
        .flat_map(|p| Recompute::ALL.map(|recompute| Parallelism { recompute, ..*p }))
        .map(|p| estimate(&overlapped, &p))
        .filter(|e| e.fits)
        .map(|e| e.iteration_time_us)
        .collect();
    let found = search(
        &overlapped,
        &Knobs {
            zero: Some(3),
            tensor: Some(1),
            pipeline: Some(1),
            micro_batch: Some(1),
            ..Knobs::default()
        },
    )
    .unwrap();
    println!(
        "with Megatron-Core's overlaps: {times:?} µs, chosen {:?}",
        found.best.parallelism.shard_groups
    );
    let fastest = times.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(found.best.iteration_time_us, fastest);
}

/// Hybrid sharding repeats ZeRO's shards: without ZeRO it is refused; groups that do not
/// divide the data-parallel ranks into groups of two or more leave nothing to plan.
#[test]
fn hybrid_sharding_needs_zero_and_groups_that_divide() {
    let model = gpt_13b();
    let cluster = Cluster::preset("eos").unwrap().times(8);
    let setting = common::bf16_adam(&model, &cluster, 64, 256);
    let knobs = |zero, r| Knobs {
        zero: Some(zero),
        shard_groups: Some(r),
        tensor: Some(1),
        pipeline: Some(1),
        ..Knobs::default()
    };
    match search(&setting, &knobs(0, 8)) {
        Err(PlanError::Request(m)) => assert!(m.contains("--dp-replicate 8"), "{m}"),
        other => panic!("{other:?}"),
    }
    for r in [7, 64] {
        match search(&setting, &knobs(1, r)) {
            Err(PlanError::Request(m)) => {
                assert!(m.contains(&format!("--dp-replicate {r}")), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }
    let par = search(&setting, &knobs(1, 4)).unwrap().best.parallelism;
    assert_eq!((par.shard_groups, par.shard_size()), (4, 16));
}

/// A mixture of experts' state is cut by the same groups: Qwen3-30B-A3B on 16 H100s with
/// 8-way expert parallelism and ZeRO-1, in 2 groups, holds twice the experts' optimizer
/// state of one group over all ranks; a layout whose experts' data-parallel ranks the
/// groups do not divide is not planned.
#[test]
fn experts_shard_over_each_group_too() {
    let spec = ralpc_ir::models::huggingface::spec(
        include_str!("../../fixtures/configs/qwen3-30b-a3b.json"),
        4096,
    )
    .unwrap();
    let model = Transformer::from(&spec);
    let cluster = Cluster::preset("eos").unwrap().times(2);
    let setting = common::bf16_adam(&model, &cluster, 16, 64);
    // t1 × d16, experts over 8 ranks: 2 expert-data-parallel ranks each.
    let base = Parallelism {
        data: 16,
        zero: 1,
        expert: 8,
        ..Parallelism::one_gpu(1)
    };
    let flat = estimate(&setting, &base);
    let hybrid = estimate(
        &setting,
        &Parallelism {
            shard_groups: 2,
            ..base
        },
    );
    // Nearly all of the model is experts: the optimizer state about doubles.
    let ratio = hybrid.memory.optimizer / flat.memory.optimizer;
    assert!(ratio > 1.9 && ratio <= 2.0 + 1e-9, "{ratio}");
    assert!(hybrid.time.data_comm_us > 0.0);
    // 4 groups would leave half an expert-data-parallel rank to each: not planned.
    let knobs = Knobs {
        zero: Some(1),
        shard_groups: Some(4),
        tensor: Some(1),
        pipeline: Some(1),
        expert: Some(8),
        ..Knobs::default()
    };
    assert!(search(&setting, &knobs).is_err());
}
