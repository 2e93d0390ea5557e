//! ralpc's transformer prices against NVIDIA's published Megatron-Bridge runs on today's GPUs
//! (`fixtures/anchors/megatron-bridge/`, from NVIDIA-NeMo/Megatron-Bridge
//! `docs/performance-summary.md` @ df0289c1 and `docs/performance-summary-archive.md` @
//! 0a25f911; see SOURCE.md there). Each dense row is priced with its published layout
//! (tensor, pipeline, virtual and data degrees, micro and global batch, precision, the
//! distributed optimizer or Megatron-FSDP) on the preset of its GPUs, fused attention and
//! overlapped data-parallel collectives, as Megatron-Core runs them; seconds per iteration are
//! compared.
//!
//! `cargo test -p ralpc-passes --test anchors_bridge -- --nocapture` prints the table.

mod common;

use common::recognized;
use ralpc_ir::models::{huggingface, GptSpec, MoeSpec, Router};
use ralpc_passes::cluster::{Cluster, Precision};
use ralpc_passes::cost::Optimizer;
use ralpc_passes::plan::Schedule;
use ralpc_passes::transformer::{
    estimate, Attention, ContextComm, Dispatcher, Estimate, Modules, Offload, Overlap, Parallelism,
    Recompute, Setting, Transformer,
};
use serde_json::Value;

const SUMMARY: &str =
    include_str!("../../fixtures/anchors/megatron-bridge/performance-summary.jsonl");

/// One published dense run.
struct Run {
    id: String,
    gpu: String,
    gpus: u32,
    spec: GptSpec,
    layout: Parallelism,
    batch: u64,
    precision: Precision,
    published_s: f64,
}

fn number(row: &Value, key: &str) -> Option<u64> {
    row.get(key).and_then(Value::as_u64)
}

/// Every row, each model's shape with its published architecture.
fn runs() -> Vec<Run> {
    SUMMARY
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON row"))
        .map(|r| {
            let n = |key: &str| number(&r, key).unwrap_or_else(|| panic!("{key} in {r}"));
            let tp = n("tp") as u32;
            let precision = match r["precision"].as_str() {
                Some("bf16") => Precision::Bf16,
                Some("mxfp8") => Precision::Mxfp8,
                Some(p) if p.starts_with("fp8") => Precision::Fp8,
                other => panic!("precision {other:?}"),
            };
            let fsdp = r["optimizer_sharding"]
                .as_str()
                .is_some_and(|s| s.contains("FSDP"));
            let moe_ffn = number(&r, "moe_ffn");
            let llama = GptSpec::llama(
                n("layers"),
                n("hidden"),
                n("heads"),
                n("kv_heads"),
                number(&r, "ffn").or(moe_ffn).expect("ffn or moe_ffn"),
                n("seq"),
                n("vocab"),
            );
            let spec = match moe_ffn {
                None => llama,
                Some(moe_ffn) => architecture(
                    r["model"].as_str().unwrap_or_default(),
                    GptSpec {
                        moe: Some(MoeSpec {
                            experts: n("experts"),
                            top_k: n("top_k"),
                            expert_ffn: moe_ffn,
                            shared_ffn: n("shared_experts") * moe_ffn,
                            dense_layers: n("dense_layers"),
                            router: Router::Softmax,
                            groups: 0,
                            top_groups: 0,
                        }),
                        ..llama
                    },
                ),
            };
            let id = r["id"].as_str().unwrap_or_default().to_owned();
            let offloaded = offloaded_layers(&id);
            let recompute = match spec.moe {
                Some(_) => recipe(&id).2,
                None => Recompute::None,
            };
            Run {
                gpu: r["gpu"].as_str().unwrap_or_default().to_owned(),
                gpus: n("gpus") as u32,
                spec,
                layout: Parallelism {
                    tensor: tp,
                    context: n("cp") as u32,
                    // Megatron-Bridge's Llama recipes leave `cp_comm_type` unset:
                    // Megatron-Core's ring (p2p).
                    context_comm: ContextComm::Ring,
                    pipeline: n("pp") as u32,
                    data: n("dp") as u32,
                    micro_batch: n("mbs"),
                    virtual_stages: number(&r, "vp").unwrap_or(1) as u32,
                    recompute,
                    // Megatron-Bridge's recipes run sequence parallelism with tensor
                    // parallelism.
                    sequence_parallel: tp > 1,
                    zero: if fsdp { 3 } else { 1 },
                    schedule: Schedule::OneFOneB,
                    expert: number(&r, "ep").unwrap_or(1) as u32,
                    expert_tensor: number(&r, "etp").unwrap_or(1) as u32,
                    offload: Offload {
                        activation_layers: offloaded,
                        optimizer_percent: 0,
                    },
                    shard_groups: 1,
                    // Megatron-Bridge's Llama 3.1 405B recipe, which every GPU's 405B
                    // performance recipe starts from, counts the embedding and the loss as a
                    // block each in the pipeline split (recipes/llama/h100/llama3.py
                    // `llama31_405b_pretrain_256gpu_h100_bf16_config` @ 067f987d).
                    ends_as_blocks: n("pp") > 1 && id.contains("405B"),
                },
                batch: n("gbs"),
                id,
                precision,
                published_s: r["s_per_iter_derived"]
                    .as_f64()
                    .expect("s_per_iter_derived"),
            }
        })
        .collect()
}

/// The dense rows (no experts).
fn dense_runs() -> Vec<Run> {
    runs()
        .into_iter()
        .filter(|r| r.spec.moe.is_none())
        .collect()
}

/// The mixture-of-experts rows.
fn moe_runs() -> Vec<Run> {
    runs()
        .into_iter()
        .filter(|r| r.spec.moe.is_some())
        .collect()
}

/// The preset of a row's GPUs, with enough nodes.
fn cluster(gpu: &str, gpus: u32) -> Cluster {
    let (preset, per_node) = match gpu {
        "H100" => ("eos", 8),
        "B200" => ("dgx-b200", 8),
        "GB200" => ("gb200-nvl72", 72),
        "GB300" => ("gb300-nvl72", 72),
        other => panic!("GPU {other}"),
    };
    Cluster::preset(preset)
        .expect("a preset")
        .times(gpus.div_ceil(per_node))
}

fn setting<'a>(
    model: &'a Transformer,
    run: &Run,
    cluster: &'a Cluster,
    precision: Precision,
) -> Setting<'a> {
    let (dispatcher, a2a_overlap, _) = match run.spec.moe {
        Some(_) => recipe(&run.id),
        None => (Dispatcher::AllToAll, false, Recompute::None),
    };
    Setting {
        model,
        batch: run.batch,
        sample_pieces: run.batch,
        cluster,
        gpus: run.gpus,
        precision,
        optimizer: Optimizer::Adam,
        fp32_gradients: false,
        workspace_bytes: ralpc_passes::cost::memory::DEFAULT_WORKSPACE_BYTES,
        memory_limit: None,
        attention: Attention::Fused,
        overlap: Overlap {
            expert_parallel: a2a_overlap,
            ..Overlap::MEGATRON_CORE
        },
        profile: None,
        // Every mixture-of-experts recipe forces balanced routing.
        expert_imbalance: 1.0,
        dispatcher,
    }
}

fn ms(e: &Estimate) -> String {
    let t = &e.time;
    format!(
        "compute {:.1} tp {:.1} cp {:.1} ep {:.1} host {:.1} pp {:.1} bubble {:.1} dp {:.1} \
         (hidden {:.1}) opt {:.1}",
        t.compute_us / 1e6,
        t.tensor_comm_us / 1e6,
        t.context_comm_us / 1e6,
        t.expert_comm_us / 1e6,
        t.host_stall_us / 1e6,
        t.pipeline_comm_us / 1e6,
        t.bubble_us / 1e6,
        t.data_comm_us / 1e6,
        t.overlapped_data_comm_us / 1e6,
        t.optimizer_us / 1e6
    )
}

/// Prices each run with its published layout and prints the table: (mean, worst) |error|.
fn price_table(runs: &[Run], model_of: impl Fn(&Run) -> Transformer) -> (f64, f64) {
    println!(
        "{:<42} {:>5} | {:>9} {:>9} {:>7} | {:>6} {:>4} | where the time goes (s)",
        "run", "GPUs", "published", "ralpc", "error", "GiB", "fits"
    );
    let mut errors = Vec::new();
    for run in runs {
        let model = model_of(run);
        let cluster = cluster(&run.gpu, run.gpus);
        let priced = estimate(&setting(&model, run, &cluster, run.precision), &run.layout);
        let ours = priced.iteration_time_us / 1e6;
        let error = ours / run.published_s - 1.0;
        errors.push(error);
        println!(
            "{:<42} {:>5} | {:>8.2}s {:>8.2}s {:>+6.1}% | {:>6.1} {:>4} | {}",
            run.id,
            run.gpus,
            run.published_s,
            ours,
            error * 100.0,
            priced.peak_memory_bytes / (1u64 << 30) as f64,
            if priced.fits { "yes" } else { "no" },
            ms(&priced)
        );
    }
    let mean = errors.iter().map(|e| e.abs()).sum::<f64>() / errors.len() as f64;
    let worst = errors.iter().map(|e| e.abs()).fold(0.0, f64::max);
    println!(
        "{} rows priced: mean |error| {:.1}%, worst {:.1}%",
        errors.len(),
        mean * 100.0,
        worst * 100.0
    );
    (mean, worst)
}

#[test]
fn dense_runs_on_today_gpus() {
    let runs = dense_runs();
    assert!(runs.len() >= 8, "{} dense rows", runs.len());
    let (mean, worst) = price_table(&runs, |run| recognized(&run.spec, run.layout.micro_batch));
    // Where the model stands (issue 58 asks for 8 % and 15 %): a guard against getting
    // worse, not the target.
    assert!(mean <= 0.10, "mean |error| {:.1}%", mean * 100.0);
    assert!(worst <= 0.18, "worst |error| {:.1}%", worst * 100.0);
}

/// The published dense FP8 runs on H100 of 70B and 405B priced again in bf16 on the same
/// layout: FP8's speedup falls in the range published for such models on H100 (1.3–1.55×).
#[test]
fn fp8_speeds_up_large_dense_h100_runs_as_published() {
    for run in dense_runs()
        .iter()
        .filter(|r| r.gpu == "H100" && r.spec.hidden >= 8192)
    {
        let model = recognized(&run.spec, run.layout.micro_batch);
        let cluster = cluster(&run.gpu, run.gpus);
        let at = |precision| {
            estimate(&setting(&model, run, &cluster, precision), &run.layout).iteration_time_us
        };
        let speedup = at(Precision::Bf16) / at(Precision::Fp8);
        println!("{}: FP8 {speedup:.3}x bf16", run.id);
        assert!((1.3..=1.55).contains(&speedup), "{}: {speedup:.2}", run.id);
    }
}

/// Llama 3 8B at sequence 8,192 on 8 H100s trains without recomputation with fused
/// attention (its `5as/h` term gone), sharded as the published run (Megatron-FSDP);
/// unfused, the scores alone overflow the GPU.
#[test]
fn llama3_8b_fits_eight_h100s_without_recomputation() {
    let run = dense_runs()
        .into_iter()
        .find(|r| r.gpu == "H100" && r.gpus == 8)
        .expect("the 8B H100 row");
    let model = recognized(&run.spec, 1);
    let cluster = cluster("H100", 8);
    let layout = run.layout;
    assert_eq!((layout.zero, layout.recompute), (3, Recompute::None));
    for precision in [Precision::Bf16, Precision::Fp8] {
        let fused = setting(&model, &run, &cluster, precision);
        let priced = estimate(&fused, &layout);
        assert!(
            priced.fits,
            "{precision:?}: {:.1} GiB",
            priced.peak_memory_bytes / 1073741824.0
        );
        let unfused = Setting {
            attention: Attention::Unfused,
            ..fused
        };
        assert!(!estimate(&unfused, &layout).fits, "{precision:?} unfused");
    }
}

/// For every row, the search given only the model, GPUs, batch and precision (the
/// recipe's dispatcher and overlaps as the setting) finds a plan that fits, no slower than
/// the published layout wherever that layout is in its space (no context parallelism) and
/// fits ralpc's memory model; expert-parallel degrees are searched with the rest.
#[test]
fn the_search_finds_plans_no_slower_than_the_published_layouts() {
    for run in runs() {
        let model = match run.spec.moe {
            Some(_) => Transformer::from(&run.spec),
            None => recognized(&run.spec, 1),
        };
        let cluster = cluster(&run.gpu, run.gpus);
        let setting = setting(&model, &run, &cluster, run.precision);
        let published = estimate(&setting, &run.layout);
        let started = std::time::Instant::now();
        let found = ralpc_passes::transformer::search(&setting, &Default::default())
            .unwrap_or_else(|e| panic!("{}: {e}", run.id));
        let best = &found.best;
        let p = best.parallelism;
        println!(
            "{:<42} published {:>7.2}s{} | search t{} p{} v{} d{} ep{} etp{} b{} {:?} zero {} \
             {:>7.2}s ({} priced in {:.2}s)",
            run.id,
            published.iteration_time_us / 1e6,
            if published.fits {
                ""
            } else {
                " (does not fit)"
            },
            p.tensor,
            p.pipeline,
            p.virtual_stages,
            p.data,
            p.expert,
            p.expert_tensor,
            p.micro_batch,
            p.recompute,
            p.zero,
            best.iteration_time_us / 1e6,
            found.evaluated,
            started.elapsed().as_secs_f64()
        );
        assert!(best.fits, "{}", run.id);
        if run.layout.context == 1 && published.fits {
            assert!(
                best.iteration_time_us <= published.iteration_time_us * (1.0 + 1e-9),
                "{}",
                run.id
            );
        }
    }
}

#[test]
fn moe_runs_on_today_gpus() {
    let runs = moe_runs();
    assert!(runs.len() >= 8, "{} MoE rows", runs.len());
    let (mean, worst) = price_table(&runs, |run| Transformer::from(&run.spec));
    // Where the model stands (issue 65 asks for 10 % and 20 %), with one constant fitted to
    // these rows (`MOE_HOST_STALL_US`). A guard against getting worse, not the target.
    assert!(mean <= 0.12, "mean |error| {:.1}%", mean * 100.0);
    assert!(worst <= 0.34, "worst |error| {:.1}%", worst * 100.0);
}

/// A mixture-of-experts row's model read from its published configuration
/// (`fixtures/configs/`, the models' `config.json`: DeepSeek-V3's latent attention and
/// sigmoid router, Qwen3's head size and query/key norms, gpt-oss's biases and sliding
/// windows are not in the row), checked against the row's own shape.
fn architecture(model: &str, row: GptSpec) -> GptSpec {
    let config = match model {
        m if m.starts_with("DeepSeek-V3") => {
            include_str!("../../fixtures/configs/deepseek-v3.json")
        }
        "Qwen3-235B-A22B" => include_str!("../../fixtures/configs/qwen3-235b-a22b.json"),
        "Qwen3-30B-A3B" => include_str!("../../fixtures/configs/qwen3-30b-a3b.json"),
        "GPT-OSS-120B" => include_str!("../../fixtures/configs/gpt-oss-120b.json"),
        other => panic!("no configuration for {other}"),
    };
    let spec = huggingface::spec(config, row.sequence).expect("a configuration");
    let shape = |s: &GptSpec| (s.layers, s.hidden, s.heads, s.kv_heads, s.vocabulary, s.moe);
    let mut published = shape(&row);
    // The rows name no router nor routing groups: the configuration's.
    if let (Some(p), Some(c)) = (published.5.as_mut(), spec.moe) {
        p.router = c.router;
        (p.groups, p.top_groups) = (c.groups, c.top_groups);
    }
    assert_eq!(
        published,
        shape(&spec),
        "{model}: the row against its configuration"
    );
    spec
}

/// What each published mixture-of-experts run's recipe set beyond its layout
/// (Megatron-Bridge `scripts/performance/configs/{deepseek,qwen,gpt_oss}/
/// *_workload_base_configs.py` @ b7b4e11b, the last commit with them): the token
/// dispatcher (`flex` with HybridEP or DeepEP, or NCCL `alltoall`), the 1F1B all-to-all
/// overlap (`moe_a2a_overlap`) and the modules recomputed. Every one forces balanced
/// routing.
fn recipe(id: &str) -> (Dispatcher, bool, Recompute) {
    let modules = |m| Recompute::Modules(m);
    let up = Modules::LATENT_UP;
    match id {
        i if i.contains("H100-DeepSeek-V3") && !i.contains("B200") => {
            (Dispatcher::Flex, false, modules(up.with(Modules::MLP)))
        }
        i if i.contains("GB200-DeepSeek-V3-mxfp8") => (Dispatcher::Flex, true, modules(up)),
        i if i.contains("DeepSeek-V3") => (Dispatcher::Flex, false, modules(up)),
        i if i.contains("H100-Qwen3-235B") => (Dispatcher::AllToAll, true, Recompute::None),
        // The recipe's MXFP8 configuration overlaps with three virtual stages; the row's
        // layout has none, with which Megatron-Core refuses the overlap.
        i if i.contains("GB200-Qwen3-235B") => (Dispatcher::Flex, false, Recompute::None),
        i if i.contains("B200-Qwen3-235B") => (Dispatcher::AllToAll, false, Recompute::None),
        i if i.contains("Qwen3-30B") => (Dispatcher::Flex, false, Recompute::None),
        i if i.contains("GPT-OSS") => (
            Dispatcher::AllToAll,
            false,
            modules(Modules::LAYER_NORM.with(Modules::EXPERT_ACTIVATION)),
        ),
        other => panic!("no recipe for {other}"),
    }
}

/// Blocks whose activations a run's recipe offloads to host memory (Megatron-Bridge @
/// 067f987d, `src/megatron/bridge/perf_recipes/llama/`: `gb200/llama3.py`'s
/// `llama3_70b_pretrain_64gpu_gb200_fp8cs_config` sets `cpu_offloading_num_layers = 40`,
/// `b200/llama3.py`'s `llama3_70b_pretrain_64gpu_b200_fp8cs_config` 5; the table does not
/// say). Other precisions' recipes offload other counts: none is taken for them.
fn offloaded_layers(id: &str) -> u64 {
    match id {
        i if i.contains("-GB200-Llama3-70B-fp8-cs-64") => 40,
        i if i.contains("-B200-Llama3-70B-fp8-cs-64") => 5,
        _ => 0,
    }
}

/// The expert-parallel degree follows the network, as the published analyses say (Megatron-
/// Core MoE's parallel folding and DeepSeek's node-limited routing both keep the all-to-all
/// on NVLink): DeepSeek-V3 on 256 GPUs spreads its experts wider inside GB200 NVL72 domains
/// than across 8-GPU B200 nodes on 400 Gb/s NICs. Prints the sweep: for each degree, the
/// best plan with it (the rest searched).
#[test]
fn expert_parallelism_grows_inside_an_nvlink_domain() {
    let spec = huggingface::spec(
        include_str!("../../fixtures/configs/deepseek-v3.json"),
        4096,
    )
    .expect("a configuration");
    let model = Transformer::from(&spec);
    let run = Run {
        // Its recipe's dispatcher (HybridEP), no overlap.
        id: "DeepSeek-V3 sweep".into(),
        gpu: String::new(),
        gpus: 256,
        spec,
        layout: dense_runs()[0].layout,
        batch: 4096,
        precision: Precision::Bf16,
        published_s: 0.0,
    };
    let mut best = Vec::new();
    for gpu in ["GB200", "B200"] {
        let cluster = cluster(gpu, 256);
        let setting = setting(&model, &run, &cluster, Precision::Bf16);
        let mut sweep = Vec::new();
        for ep in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
            let knobs = ralpc_passes::transformer::Knobs {
                expert: Some(ep),
                ..Default::default()
            };
            if let Ok(found) = ralpc_passes::transformer::search(&setting, &knobs) {
                let p = found.best.parallelism;
                println!(
                    "{gpu:<6} ep {ep:>3}: {:>7.2} s  (t{} p{} d{} zero {}, all-to-all {:.2} s)",
                    found.best.iteration_time_us / 1e6,
                    p.tensor,
                    p.pipeline,
                    p.data,
                    p.zero,
                    found.best.time.expert_comm_us / 1e6
                );
                sweep.push((found.best.iteration_time_us, ep));
            }
        }
        let (_, fastest) = sweep
            .iter()
            .copied()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .expect("some degree plans");
        println!("{gpu}: fastest with ep {fastest}");
        best.push(fastest);
    }
    assert!(
        best[0] > best[1],
        "NVL72 ep {} vs B200 nodes ep {}",
        best[0],
        best[1]
    );
}

/// A published Qwen3-30B-A3B run outside the given rows (`SOURCE.md` there: Megatron-Bridge
/// `docs/performance-summary.md` @ cfeddcd9).
struct HeldOut {
    gpu: &'static str,
    gpus: u32,
    precision: Precision,
    batch: u64,
    micro_batch: u64,
    pipeline: u32,
    virtual_stages: u32,
    expert: u32,
    /// Tokens a second a GPU.
    rate: f64,
}

const B200_MBS1: HeldOut = HeldOut {
    gpu: "B200",
    gpus: 8,
    precision: Precision::Mxfp8,
    batch: 512,
    micro_batch: 1,
    pipeline: 1,
    virtual_stages: 1,
    expert: 8,
    rate: 9691.0,
};

const HELD_OUT: [HeldOut; 5] = [
    // The 26.02 table.
    B200_MBS1,
    HeldOut {
        gpu: "GB200",
        micro_batch: 4,
        rate: 26084.0,
        ..B200_MBS1
    },
    // The 26.02.01 table.
    HeldOut {
        micro_batch: 4,
        rate: 26695.0,
        ..B200_MBS1
    },
    HeldOut {
        gpu: "GB200",
        micro_batch: 4,
        rate: 26373.0,
        ..B200_MBS1
    },
    HeldOut {
        gpu: "H100",
        gpus: 16,
        precision: Precision::Fp8,
        batch: 1024,
        micro_batch: 1,
        pipeline: 2,
        virtual_stages: 12,
        expert: 8,
        rate: 9058.0,
    },
];

/// The one constant fitted to the given MoE rows (`MOE_HOST_STALL_US`) on runs it was not
/// fitted to: each within 30 %, and the micro-batch's effect kept in the measured order and
/// mostly its size. Within the 26.02 table, GB200 at micro-batch 4 ran 2.69× the tokens a
/// second of B200 at 1; GB200 and B200 at one micro-batch differ by 1.2 % (26.02.01), so
/// the micro-batch makes that difference.
#[test]
fn moe_prices_hold_on_runs_not_fitted() {
    let qwen = moe_runs()
        .into_iter()
        .find(|r| r.id.contains("Qwen3-30B"))
        .expect("the Qwen3-30B-A3B row");
    let mut seconds = Vec::new();
    for HeldOut {
        gpu,
        gpus,
        precision,
        batch,
        micro_batch,
        pipeline,
        virtual_stages,
        expert,
        rate,
    } in HELD_OUT
    {
        let run = Run {
            id: format!("{gpu} Qwen3-30B-A3B mbs {micro_batch}"),
            gpu: gpu.into(),
            gpus,
            layout: Parallelism {
                pipeline,
                virtual_stages,
                data: gpus / pipeline,
                expert,
                micro_batch,
                ..qwen.layout
            },
            batch,
            precision,
            published_s: (batch * qwen.spec.sequence) as f64 / (f64::from(gpus) * rate),
            spec: qwen.spec,
        };
        let model = Transformer::from(&run.spec);
        let cluster = cluster(gpu, gpus);
        let priced = estimate(&setting(&model, &run, &cluster, precision), &run.layout);
        let ours = priced.iteration_time_us / 1e6;
        let error = ours / run.published_s - 1.0;
        println!(
            "{:<32} | {:>8.2}s {:>8.2}s {:>+6.1}% | {}",
            run.id,
            run.published_s,
            ours,
            error * 100.0,
            ms(&priced)
        );
        assert!(error.abs() <= 0.30, "{}: {:+.1}%", run.id, error * 100.0);
        seconds.push(ours);
    }
    let speedup = seconds[0] / seconds[1];
    assert!(
        speedup >= 2.0,
        "micro-batch 4 over 1: {speedup:.2}× (published 2.69×)"
    );
}
