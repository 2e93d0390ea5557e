//! Offloading to host memory (Hydra's spilling, ZeRO-Offload, Megatron-Core's layer-wise
//! activation offload and hybrid device optimizer): priced against the host figures of the
//! presets, searched only where nothing fits without it, refused where Megatron-Core
//! refuses it.

mod common;

use ralpc_ir::models::{huggingface, GptSpec};
use ralpc_passes::cluster::{Cluster, Precision};
use ralpc_passes::cost::Optimizer;
use ralpc_passes::plan::PlanError;
use ralpc_passes::transformer::{
    estimate, search, Knobs, Offload, Parallelism, Recompute, Setting, Transformer,
};

fn setting<'a>(model: &'a Transformer, cluster: &'a Cluster, gpus: u32, batch: u64) -> Setting<'a> {
    common::bf16_adam(model, cluster, gpus, batch)
}

fn llama_8b() -> Transformer {
    let spec = huggingface::spec(
        include_str!("../../fixtures/configs/llama-3.1-8b.json"),
        4096,
    )
    .expect("a configuration");
    Transformer::from(&spec)
}

/// One GPU alone, `micro_batch` sequences a microbatch, inside the distributed optimizer
/// (where Megatron-Core's hybrid device optimizer lives).
fn alone(micro_batch: u64, offload: Offload) -> Parallelism {
    Parallelism {
        zero: 1,
        offload,
        ..Parallelism::one_gpu(micro_batch)
    }
}

/// Llama 3.1 8B on one H100 needs 18 bytes per parameter of weights, gradients and Adam's
/// state: 144 GB. Without host memory it is refused; a DGX H100's 2 TB take the optimizer
/// state, and the step pays for copying gradients down and weights back.
#[test]
fn an_optimizer_too_large_for_the_gpu_is_kept_in_host_memory() {
    let model = llama_8b();
    let dgx = Cluster::preset("dgx-h100").unwrap();
    let found = search(&setting(&model, &dgx, 1, 8), &Knobs::default()).unwrap();
    let best = &found.best;
    let offload = best.parallelism.offload;
    assert_eq!(offload.optimizer_percent, 100, "{:?}", best.parallelism);
    assert_eq!(
        best.parallelism.zero, 1,
        "the distributed optimizer holds it"
    );
    assert!(best.fits);
    assert_eq!(best.memory.optimizer, 0.0);
    // Master weights, two moments and the gradients' pinned copy: 16 bytes a parameter,
    // with the activations of any offloaded block.
    assert!(best.host_memory_bytes >= 16.0 * model.params as f64 * 0.99);
    assert!(best.host_memory_bytes <= best.host_capacity_bytes);
    // The same plan without the offload costs its GPU step and no copies.
    let on_gpu = estimate(
        &setting(&model, &dgx, 1, 8),
        &Parallelism {
            offload: Offload::NONE,
            ..best.parallelism
        },
    );
    assert!(!on_gpu.fits);
    assert!(best.time.optimizer_us > 5.0 * on_gpu.time.optimizer_us);

    // Nothing offloaded when asked, or without the host's figures.
    let mut no_host = dgx.clone();
    no_host.groups[0].host = None;
    for (cluster, knobs) in [
        (
            &dgx,
            Knobs {
                offload_activations: Some(0),
                offload_optimizer: Some(0),
                ..Knobs::default()
            },
        ),
        (&no_host, Knobs::default()),
    ] {
        let refused = search(&setting(&model, cluster, 1, 8), &knobs);
        assert!(
            matches!(refused, Err(PlanError::OutOfMemory { .. })),
            "{refused:?}"
        );
    }
}

/// Layer-wise activation offload: each offloaded block leaves the GPU but for the one in
/// flight; its copies cost only what the compute beside them does not hide, more on a slow
/// link.
#[test]
fn offloaded_activations_leave_the_gpu_and_cost_what_compute_does_not_hide() {
    let model = llama_8b();
    let dgx = Cluster::preset("dgx-h100").unwrap();
    let s = setting(&model, &dgx, 1, 4);
    let half = Offload {
        activation_layers: 16,
        optimizer_percent: 100,
    };
    let none = Offload {
        activation_layers: 0,
        ..half
    };
    let kept = estimate(&s, &alone(1, none));
    let offloaded = estimate(&s, &alone(1, half));
    // 15 of 32 blocks' activations fewer (16 leave, the one in flight stays).
    let per_block = kept.memory.activations - offloaded.memory.activations;
    assert!(per_block > 0.0);
    let host_activations = offloaded.host_memory_bytes - kept.host_memory_bytes;
    assert!(
        (host_activations / per_block - 16.0 / 15.0).abs() < 0.01,
        "{host_activations} {per_block}"
    );
    // Each block's copy down shows beyond the next block's forward pass, its copy back
    // beyond the backward pass, every microbatch (4 of one sequence).
    let link = dgx.groups[0].host.unwrap().copy_link(1);
    let copy = link.transfer_us(host_activations / 16.0);
    let exposed = (copy - offloaded.block_forward_us).max(0.0)
        + (copy - offloaded.block_backward_us).max(0.0);
    assert!(exposed > 0.0, "copy {copy} µs");
    let expected = 4.0 * 16.0 * exposed;
    assert!(
        (offloaded.time.offload_us / expected - 1.0).abs() < 0.01,
        "{} vs {expected}",
        offloaded.time.offload_us
    );
    assert!(
        (offloaded.iteration_time_us - kept.iteration_time_us - expected).abs() < 0.01 * expected
    );
    // On PCIe Gen3 (a p3dn's host link) the same copies show more.
    let mut slow = dgx.clone();
    let p3dn = Cluster::preset("p3dn-v100").unwrap().groups[0].host;
    slow.groups[0].host = p3dn;
    let on_slow = estimate(&setting(&model, &slow, 1, 4), &alone(1, half));
    assert!(on_slow.time.offload_us > offloaded.time.offload_us);
    // A host too small for what is offloaded does not fit.
    let mut small = dgx.clone();
    if let Some(host) = small.groups[0].host.as_mut() {
        host.memory_bytes = 64 << 30;
    }
    assert!(!estimate(&setting(&model, &small, 1, 4), &alone(1, half)).fits);
}

/// A 20 B GPT on one 80 GB A100 (ZeRO-Offload's headline case) is planned, not refused:
/// its optimizer state in the DGX A100's host memory.
#[test]
fn a_20b_gpt_is_planned_on_one_80_gb_gpu() {
    let spec = GptSpec::llama(44, 6144, 48, 48, 16384, 2048, 50432);
    let model = Transformer::from(&spec);
    assert!(model.params > 20_000_000_000);
    let dgx = Cluster::preset("dgx-a100").unwrap();
    let best = search(&setting(&model, &dgx, 1, 16), &Knobs::default())
        .unwrap()
        .best;
    let offload = best.parallelism.offload;
    assert!(best.fits);
    assert_eq!(offload.optimizer_percent, 100);
    assert!((1..=2).contains(&best.parallelism.zero));
    assert!(best.peak_memory_bytes <= best.memory_capacity_bytes);
    // Its 41 GB of 16-bit weights leave no room for the gradients beside a step's
    // activations: they go to the host, or are recomputed.
    assert!(
        offload.activation_layers > 0 || best.parallelism.recompute != Recompute::None,
        "{:?}",
        best.parallelism
    );
    // Without the host, nothing fits.
    let mut no_host = dgx.clone();
    no_host.groups[0].host = None;
    assert!(search(&setting(&model, &no_host, 1, 16), &Knobs::default()).is_err());
}

/// What Megatron-Core refuses is refused, naming the option.
#[test]
fn offloads_megatron_core_refuses_are_refused() {
    let model = llama_8b();
    let dgx = Cluster::preset("dgx-h100").unwrap();
    let s = setting(&model, &dgx, 8, 8);
    let err = |knobs: Knobs, s: &Setting<'_>| match search(s, &knobs) {
        Err(PlanError::Request(message)) => message,
        other => panic!("{knobs:?}: {other:?}"),
    };
    let activations = |n| Knobs {
        offload_activations: Some(n),
        ..Knobs::default()
    };
    assert!(err(activations(32), &s).contains("32 blocks"));
    assert!(err(
        Knobs {
            pipeline: Some(2),
            ..activations(4)
        },
        &s
    )
    .contains("pipeline"));
    assert!(err(
        Knobs {
            recompute: Some(Recompute::Full),
            ..activations(4)
        },
        &s
    )
    .contains("recomputation"));
    let sgd = Setting {
        optimizer: Optimizer::Sgd,
        ..s.clone()
    };
    let optimizer = Knobs {
        offload_optimizer: Some(50),
        ..Knobs::default()
    };
    assert!(err(optimizer, &sgd).contains("Adam"));
    let mut no_host = dgx.clone();
    no_host.groups[0].host = None;
    let without = setting(&model, &no_host, 8, 8);
    assert!(err(optimizer, &without).contains("host memory"));
    assert!(err(
        Knobs {
            zero: Some(3),
            ..optimizer
        },
        &s
    )
    .contains("ZeRO 1 or 2"));
    // Searched with the rest, an offload comes only where Megatron-Core takes it.
    let par = search(&s, &activations(4)).unwrap().best.parallelism;
    assert_eq!((par.pipeline, par.recompute), (1, Recompute::None));
    assert_eq!(par.offload.activation_layers, 4);
    let par = search(&s, &optimizer).unwrap().best.parallelism;
    assert!((1..=2).contains(&par.zero), "{par:?}");
    // FP8 parameters are not gathered beside an offloaded optimizer (Megatron-LM allows
    // them there only with delayed scaling): its weights take 16-bit room.
    let fp8 = Setting {
        precision: Precision::Fp8,
        ..s.clone()
    };
    let at = |percent| {
        estimate(
            &fp8,
            &Parallelism {
                data: 8,
                offload: Offload {
                    activation_layers: 0,
                    optimizer_percent: percent,
                },
                ..alone(1, Offload::NONE)
            },
        )
        .memory
        .weights
    };
    assert!(at(50) > at(0));
}
