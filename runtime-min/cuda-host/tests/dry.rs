//! The CUDA executor's training step at full size on a counting device: its GEMMs do the
//! model's work — three times the forward multiply-accumulates (forward, input gradient,
//! weight gradient) — and its peak memory at batch 64 fits an 80 GB GPU; and every plan
//! family's step through the plan interpreter, a counting device per rank. Figures are
//! printed (`-- --nocapture`).

mod common;

use std::sync::{Arc, Mutex};

use ralpc_cuda_host::dry::{Counts, Dry, DryReplicas};
use ralpc_cuda_host::streams::Streams;
use ralpc_ir::account;
use ralpc_runtime_min::cpu::exec::Compute;
use ralpc_runtime_min::cpu::graph::Weights;
use ralpc_runtime_min::cpu::train::{Dataset, Loss, TrainOptions};
use ralpc_runtime_min::cuda::error::DeviceError;
use ralpc_runtime_min::cuda::on_device::OnDevice;
use ralpc_runtime_min::cuda::train::train;

fn step(model: &str, batch: u64) {
    let (graph, info) = common::load(model, batch);
    let macs = account(&graph, &info).expect("account").macs as f64;
    let weights = Weights::load(&graph, 0).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 0, Loss::CrossEntropy);
    let dry = Dry::default();
    let options = TrainOptions {
        steps: 1,
        ..TrainOptions::default()
    };
    train(&dry, &graph, &info, &weights, &data, &options).expect("a step");
    let c = dry.counts();
    let ratio = c.gemm_flops / (6.0 * macs);
    eprintln!(
        "{model} batch {batch}: {} kernel launches + {} GEMMs per step, {:.1} GFLOP in GEMMs \
         ({ratio:.3}× 3·2·MACs), peak {:.2} GiB",
        c.launches,
        c.gemms,
        c.gemm_flops / 1e9,
        c.peak_bytes as f64 / (1u64 << 30) as f64
    );
    assert!(
        (0.98..=1.02).contains(&ratio),
        "{model}: GEMM work {ratio}× the model's"
    );
    assert!(
        c.peak_bytes < 80 << 30,
        "{model}: {} bytes at batch {batch}",
        c.peak_bytes
    );
}

#[test]
fn resnet50_at_batch_64() {
    step("onnx/resnet50/model.onnx", 64);
}

#[test]
fn vgg16_at_batch_64() {
    step("onnx/vgg16/model.onnx", 64);
}

/// Steps the plan tests run: the second holds what the plan predicts for every step (the
/// first has no momentum yet).
const STEPS: u32 = 2;

/// [`STEPS`] steps of `strategy` (a `ralpc-strategy/1` file) for `model` on `gpus` ranks,
/// run by the plan interpreter with every rank on its own counting device: what each
/// device counted, by rank.
fn plan_step(model: &str, gpus: u32, batch: u64, strategy: &str) -> (Vec<Counts>, f64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("strategy.json");
    std::fs::write(&file, strategy).expect("write the strategy");
    planned_step(
        ralpc::Options {
            model: common::fixture(model),
            gpus: Some(gpus),
            batch: Some(batch),
            strategy_file: Some(file),
            ..Default::default()
        },
        dir.path(),
    )
}

/// [`STEPS`] steps of the plan `options` make, written to `dir`, as [`plan_step`]; and the most
/// memory the plan predicts a GPU's tensors take, bytes.
fn planned_step(options: ralpc::Options, dir: &std::path::Path) -> (Vec<Counts>, f64) {
    let path = options.model.clone();
    let model = path.display().to_string();
    // Sized as ralpc's executor runs attention: its scores materialized, not fused.
    let compiled = ralpc::compile(&ralpc::Options {
        executable: true,
        attention: ralpc::passes::transformer::Attention::Unfused,
        ..options
    })
    .unwrap_or_else(|e| panic!("{model}: {}", ralpc_runtime_min::error_chain(&e)));
    compiled.write(dir).expect("write the plan");
    // The plan's tensors: its predicted peak less what it reserves for the CUDA context and
    // the libraries' workspaces, which a counting device does not hold.
    let predicted =
        compiled.report.peak_memory_bytes - ralpc::passes::cost::memory::DEFAULT_WORKSPACE_BYTES;
    // Every collective and message device to device, ordered as NCCL orders them: nothing
    // of a step's tensors crosses the host, and a plan whose ranks would wait on each
    // other on GPUs fails here.
    let ranks = compiled.report.gpus as usize;
    let streams = Arc::new(Streams::new(ranks, std::time::Duration::from_secs(60)));
    let everyone: Vec<u32> = (0..ranks as u32).collect();
    let devices: Mutex<Vec<(u32, Dry)>> = Mutex::default();
    let counting = |rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
        let dry = Dry::default().on_stream(streams.clone(), rank);
        devices.lock().expect("devices").push((rank, dry.clone()));
        let replicas = DryReplicas::new(streams.clone(), rank);
        Ok(Box::new(OnDevice::with_replicas(
            dry,
            &everyone,
            Box::new(replicas),
        )))
    };
    let options = ralpc::RunOptions {
        plan: dir.to_path_buf(),
        model: Some(path),
        steps: STEPS,
        report_tensors: false,
        ..Default::default()
    };
    ralpc::run_with_compute(&options, &counting)
        .unwrap_or_else(|e| panic!("{model}: {}", ralpc_runtime_min::error_chain(&e)));
    let mut devices = devices.into_inner().expect("devices");
    devices.sort_by_key(|&(rank, _)| rank);
    let counts = devices.iter().map(|(_, dry)| dry.counts()).collect();
    (counts, predicted)
}

/// A `ralpc-strategy/1` file: `stages` as (first layer, last layer, GPUs), `layers` as
/// (layer, samples, attributes, parameters).
fn strategy(stages: &[(&str, &str, u32)], layers: &[(&str, u32, u32, u32)], mbs: u32) -> String {
    let stages: Vec<String> = stages
        .iter()
        .map(|(first, last, gpus)| {
            format!(r#"{{ "first_layer": "{first}", "last_layer": "{last}", "replicas": {gpus} }}"#)
        })
        .collect();
    let layers: Vec<String> = layers
        .iter()
        .map(|(name, s, a, p)| {
            format!(
                r#"{{ "name": "{name}", "split": {{ "sample": {s}, "attribute": {a}, "parameter": {p} }} }}"#
            )
        })
        .collect();
    format!(
        r#"{{ "format": "ralpc-strategy/1", "schedule": "1f1b", "microbatches": {mbs},
             "stages": [{}], "layers": [{}] }}"#,
        stages.join(", "),
        layers.join(", ")
    )
}

/// Every plan family for ResNet-50 on 4 GPUs runs a full-size step through the one plan
/// interpreter on counting devices: the ranks' GEMMs together do the model's work once —
/// three times its forward multiply-accumulates, split among the ranks as the plan splits
/// the layers, none lost and none done twice.
#[test]
fn every_plan_family_does_the_models_work_once_on_counting_devices() {
    let families = Families {
        first: "/conv1/Conv",
        last: "/fc/Gemm",
        burst: &[
            ("/layer4/layer4.2/conv3/Conv", 2, 1, 1),
            ("/avgpool/GlobalAveragePool", 2, 1, 1),
            ("/fc/Gemm", 1, 1, 1),
        ],
        soap: &[
            ("/layer4/layer4.2/conv2/Conv", 2, 1, 2),
            ("/layer4/layer4.2/conv3/Conv", 2, 2, 1),
            ("/fc/Gemm", 1, 1, 4),
        ],
        two_stages: ["/layer3/layer3.5/conv3/Conv", "/layer4/layer4.0/conv1/Conv"],
        four_stages: [
            "/layer1/layer1.2/conv3/Conv",
            "/layer2/layer2.0/conv1/Conv",
            "/layer2/layer2.3/conv3/Conv",
            "/layer3/layer3.0/conv1/Conv",
            "/layer3/layer3.5/conv3/Conv",
            "/layer4/layer4.0/conv1/Conv",
        ],
    };
    families_do_the_work_once("onnx/resnet50/model.onnx", 32, &families.strategies());
}

/// VGG16's plan families on 4 GPUs, as ResNet-50's above: data parallel, DeepPool's burst
/// (the classifier on fewer GPUs), SOAP (its first dense layer split by its outputs), and
/// 2- and 4-stage pipelines.
#[test]
fn vggs_plan_families_do_its_work_once_on_counting_devices() {
    let families = Families {
        first: "/features/features.0/Conv",
        last: "/classifier/classifier.6/Gemm",
        burst: &[
            ("/classifier/classifier.0/Gemm", 2, 1, 1),
            ("/classifier/classifier.3/Gemm", 1, 1, 1),
            ("/classifier/classifier.6/Gemm", 1, 1, 1),
        ],
        soap: &[
            ("/classifier/classifier.0/Gemm", 1, 1, 4),
            ("/classifier/classifier.3/Gemm", 2, 1, 2),
        ],
        two_stages: [
            "/features/features.16/MaxPool",
            "/features/features.17/Conv",
        ],
        four_stages: [
            "/features/features.4/MaxPool",
            "/features/features.5/Conv",
            "/features/features.16/MaxPool",
            "/features/features.17/Conv",
            "/avgpool/AveragePool",
            "/classifier/classifier.0/Gemm",
        ],
    };
    families_do_the_work_once("onnx/vgg16/model.onnx", 32, &families.strategies());
}

/// A model's five plan families on 4 GPUs, by its layer names.
struct Families<'a> {
    /// The first and last layers.
    first: &'a str,
    last: &'a str,
    /// Burst: layers on fewer GPUs, as (layer, samples, attributes, parameters).
    burst: &'a [(&'a str, u32, u32, u32)],
    /// SOAP: layers split otherwise, as `burst`.
    soap: &'a [(&'a str, u32, u32, u32)],
    /// The last layer of the first of 2 stages (of 2 GPUs) and the first of the second.
    two_stages: [&'a str; 2],
    /// The last and first layers at each of the 3 cuts between 4 stages (of 1 GPU).
    four_stages: [&'a str; 6],
}

impl Families<'_> {
    /// Each family's name and strategy file: data parallel, burst, SOAP (one microbatch),
    /// and 1F1B pipelines of 2 and 4 stages (as many microbatches).
    fn strategies(&self) -> Vec<(&'static str, String)> {
        let one_stage = [(self.first, self.last, 4)];
        let [end, start] = self.two_stages;
        let [a, b, c, d, e, f] = self.four_stages;
        vec![
            ("data parallel", strategy(&one_stage, &[], 1)),
            ("burst", strategy(&one_stage, self.burst, 1)),
            ("soap", strategy(&one_stage, self.soap, 1)),
            (
                "pipeline",
                strategy(&[(self.first, end, 2), (start, self.last, 2)], &[], 2),
            ),
            (
                "4-stage pipeline",
                strategy(
                    &[(self.first, a, 1), (b, c, 1), (d, e, 1), (f, self.last, 1)],
                    &[],
                    4,
                ),
            ),
        ]
    }
}

/// Each of `families` (a name and its strategy file) of `model` at `batch` on 4 counting
/// devices: the ranks' GEMMs do the model's work once, and the fullest rank's tensors peak
/// where the plan predicts.
fn families_do_the_work_once(model: &str, batch: u64, families: &[(&str, String)]) {
    let (graph, info) = common::load(model, batch);
    let macs = account(&graph, &info).expect("account").macs as f64;
    drop((graph, info));
    for (family, strategy) in families {
        let (counts, predicted) = plan_step(model, 4, batch, strategy);
        assert_eq!(counts.len(), 4, "{family}: a device per rank");
        let flops: f64 = counts.iter().map(|c| c.gemm_flops).sum();
        let ratio = flops / (6.0 * macs * f64::from(STEPS));
        let per_rank: Vec<String> = counts
            .iter()
            .map(|c| {
                format!(
                    "{:.1} GFLOP/{:.2} GiB",
                    c.gemm_flops / 1e9,
                    c.tensor_peak_bytes as f64 / (1u64 << 30) as f64
                )
            })
            .collect();
        eprintln!(
            "{model} batch {batch}, {family} on 4 ranks: {:.1} GFLOP in GEMMs ({ratio:.3}× \
             3·2·MACs), {} GEMMs, {} launches; per rank GEMM work/peak of tensors {} (the \
             plan predicts its tensors peak at {:.2} GiB)",
            flops / 1e9,
            counts.iter().map(|c| c.gemms).sum::<u64>(),
            counts.iter().map(|c| c.launches).sum::<u64>(),
            per_rank.join(", "),
            predicted / (1u64 << 30) as f64
        );
        assert!(
            (0.98..=1.02).contains(&ratio),
            "{family}: the ranks' GEMM work is {ratio}× the model's"
        );
        assert_peak_as_predicted(family, &counts, predicted);
    }
}

/// The fullest rank's counted peak of tensors is the plan's predicted peak, within 10 %:
/// the cost model's memory (weights, gradients, momentum, stashed activations, the
/// backward's transients) is what the interpreter allocates. Every rank's scratch space
/// (the convolutions' im2col columns) fits the workspace the plan reserves beside them.
fn assert_peak_as_predicted(what: &str, counts: &[Counts], predicted: f64) {
    let counted = counts
        .iter()
        .map(|c| c.tensor_peak_bytes)
        .max()
        .unwrap_or(0) as f64;
    let scratch = counts
        .iter()
        .map(|c| c.scratch_peak_bytes)
        .max()
        .unwrap_or(0);
    let ratio = counted / predicted;
    eprintln!(
        "{what}: counted peak of tensors {ratio:.2}× the predicted; scratch {:.2} GiB",
        scratch as f64 / (1u64 << 30) as f64
    );
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{what}: the fullest rank holds {counted} bytes of tensors, the plan predicts {predicted}"
    );
    assert!(
        scratch as f64 <= ralpc::passes::cost::memory::DEFAULT_WORKSPACE_BYTES,
        "{what}: {scratch} bytes of scratch space"
    );
}

/// GPT-2 in Megatron-LM's layout — tensor parallel by 2 (attention by heads, the MLP by
/// columns then rows, the embedding and head by vocabulary) × 2 pipeline stages × 2 data
/// parallel replicas, 2 microbatches — runs a full-size step through the plan interpreter
/// on 8 counting devices, the ranks' GEMMs doing the model's work once, at the planner's
/// ZeRO stage, without ZeRO and with ZeRO-2's gradients reduce-scattered after every
/// microbatch into shares.
#[test]
fn a_gpt_in_tensor_pipeline_and_data_parallel_does_its_work_once_on_counting_devices() {
    for zero in [None, Some(0), Some(2)] {
        megatron_step(&common::fixture("onnx/gpt2/model.onnx"), 8, zero);
    }
}

/// Megatron-LM's 1.7 B GPT (24 layers, hidden 2304, 24 heads, sequence 2048, vocabulary
/// 51,200, the head tied to the embedding), structure only, its weights seeded, at t2 p2
/// d2 as above: a full-size step on 8 counting devices. The host makes each rank's pieces
/// of the weights alone and hands them to its device, so it never holds the model.
#[test]
fn a_1_7b_gpt_in_tensor_pipeline_and_data_parallel_does_its_work_once_on_counting_devices() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = ralpc_ir::models::GptSpec::megatron(24, 2304, 24, 2048, 51200);
    let params = spec.params() as f64;
    assert!((1.6e9..1.75e9).contains(&params), "{params} parameters");
    let model = dir.path().join("gpt-1.7b.onnx");
    std::fs::write(&model, ralpc_ir::models::gpt(&spec).expect("a valid GPT")).expect("write");
    megatron_step(&model, 8, None);
}

/// [`STEPS`] steps of `model` at `batch` in Megatron-LM's layout (t2 p2 d2, microbatches
/// of 2) on 8 counting devices: the ranks' GEMMs do the model's work once, and the fullest
/// rank's tensors peak where the plan predicts.
fn megatron_step(model: &std::path::Path, batch: u64, zero: Option<u8>) {
    let (graph, info) = common::load_path(model, batch);
    let macs = account(&graph, &info).expect("account").macs as f64;
    drop((graph, info));
    let dir = tempfile::tempdir().expect("temp dir");
    let (counts, predicted) = planned_step(
        ralpc::Options {
            model: model.to_path_buf(),
            gpus: Some(8),
            batch: Some(batch),
            family: ralpc::passes::plan::Family::parse("3d"),
            knobs: common::megatron_knobs(zero),
            ..Default::default()
        },
        dir.path(),
    );
    assert_eq!(counts.len(), 8, "a device per rank");
    let zero = zero.map_or("the planner's ZeRO".into(), |z| format!("ZeRO-{z}"));
    let flops: f64 = counts.iter().map(|c| c.gemm_flops).sum();
    let ratio = flops / (6.0 * macs * f64::from(STEPS));
    let per_rank: Vec<String> = counts
        .iter()
        .map(|c| {
            format!(
                "{:.0} GFLOP/{:.2} GiB",
                c.gemm_flops / 1e9,
                c.tensor_peak_bytes as f64 / (1u64 << 30) as f64
            )
        })
        .collect();
    eprintln!(
        "{} batch {batch}, t2 p2 d2, {zero}: {:.1} TFLOP in GEMMs ({ratio:.3}× 3·2·MACs), {} GEMMs, \
         {} launches; per rank GEMM work/peak of tensors {} (the plan predicts {:.2} GiB)",
        model.display(),
        flops / 1e12,
        counts.iter().map(|c| c.gemms).sum::<u64>(),
        counts.iter().map(|c| c.launches).sum::<u64>(),
        per_rank.join(", "),
        predicted / (1u64 << 30) as f64
    );
    assert!(
        (0.98..=1.02).contains(&ratio),
        "the ranks' GEMM work is {ratio}× the model's"
    );
    assert_peak_as_predicted(&format!("t2 p2 d2, {zero}"), &counts, predicted);
}

/// A one-rank plan of ResNet-50, whose blocks' outputs each feed the next block and its
/// residual sum, keeps every gradient on its device: the gradients the two readers give
/// are summed there, and the loss is taken there, so a step uploads only the weights, their
/// momentum, the batch and its labels, and reads back only each row's loss and what the
/// report reads.
#[test]
fn a_residual_networks_gradients_stay_on_its_device() {
    use ralpc_runtime_min::cuda::on_device::Transfers;
    use std::sync::Arc;
    let (model, batch) = ("onnx/resnet50/model.onnx", 8);
    let dir = tempfile::tempdir().expect("temp dir");
    let compiled = ralpc::compile(&ralpc::Options {
        model: common::fixture(model),
        gpus: Some(1),
        batch: Some(batch),
        ..Default::default()
    })
    .expect("plan");
    compiled.write(dir.path()).expect("write the plan");
    let transfers: Mutex<Option<Arc<Transfers>>> = Mutex::default();
    let counting = |_rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
        let device = OnDevice::new(Dry::default());
        *transfers.lock().expect("transfers") = Some(device.transfers());
        Ok(Box::new(device))
    };
    let options = ralpc::RunOptions {
        plan: dir.path().to_path_buf(),
        model: Some(common::fixture(model)),
        steps: 1,
        ..Default::default()
    };
    let report = ralpc::run_with_compute(&options, &counting)
        .unwrap_or_else(|e| panic!("{}", ralpc_runtime_min::error_chain(&e)))
        .report;
    let (weights, input, output) = common::sizes(model, batch, &report);
    let t = transfers
        .into_inner()
        .expect("transfers")
        .expect("one device");
    // One row of logits per sample: its label goes up (8 bytes), its loss comes back (4).
    let rows = batch;
    assert_eq!(
        t.uploaded(),
        2 * weights + input + 8 * rows,
        "weights and momentum, the batch, its labels"
    );
    assert_eq!(
        t.read_back(),
        4 * rows + output + 2 * weights,
        "the rows' losses; the output, the first gradients and the last weights (the \
         report's)"
    );
}

/// A one-rank ResNet-50 plan's second step holds no more than its first plus the
/// momentum the first update made: the gradients of its layers' inputs go as their
/// producers' backward reads them, not when the next step writes new ones.
#[test]
fn a_second_step_holds_only_the_momentum_more() {
    let (model, batch) = ("onnx/resnet50/model.onnx", 16);
    let dir = tempfile::tempdir().expect("temp dir");
    let compiled = ralpc::compile(&ralpc::Options {
        model: common::fixture(model),
        gpus: Some(1),
        batch: Some(batch),
        ..Default::default()
    })
    .expect("plan");
    compiled.write(dir.path()).expect("write the plan");
    let peak = |steps: u32| {
        let device: Mutex<Option<Dry>> = Mutex::default();
        let counting = |_rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
            let dry = Dry::default();
            *device.lock().expect("device") = Some(dry.clone());
            Ok(Box::new(OnDevice::new(dry)))
        };
        let options = ralpc::RunOptions {
            plan: dir.path().to_path_buf(),
            model: Some(common::fixture(model)),
            steps,
            ..Default::default()
        };
        let report = ralpc::run_with_compute(&options, &counting)
            .unwrap_or_else(|e| panic!("{}", ralpc_runtime_min::error_chain(&e)))
            .report;
        let dry = device.into_inner().expect("device").expect("one device");
        (dry.counts().peak_bytes as u64, report)
    };
    let (one, report) = peak(1);
    let (two, _) = peak(2);
    let (weights, _, _) = common::sizes(model, batch, &report);
    eprintln!(
        "{model} batch {batch}: peak {:.3} GiB after one step, {:.3} GiB after two",
        one as f64 / (1u64 << 30) as f64,
        two as f64 / (1u64 << 30) as f64
    );
    assert!(
        two <= one + weights,
        "a second step peaks at {two} bytes, the first at {one}; momentum is {weights}"
    );
}

/// The planner's own plan of each CNN and vision-transformer fixture and of GPT-2, on 1
/// GPU and on 4, runs a full-size step on counting devices: the ranks' GEMMs do the
/// model's work once, and the fullest rank's tensors peak where the plan predicts (within
/// 10 %). Branching networks (Inception's blocks read by four convolutions, DenseNet's
/// concatenations), large single tensors (Wide ResNet's) and GPT-2's one-microbatch steps
/// (its gradients made as its activations go; on 4 GPUs, ZeRO-3's weights released
/// between passes) are where the memory model and the runtime have parted before.
#[test]
fn default_plans_of_the_fixtures_peak_where_predicted() {
    for (model, batch) in [
        ("onnx/vit_b_16/model.onnx", 16u64),
        ("onnx/mobilenet_v2/model.onnx", 32),
        ("onnx/densenet121/model.onnx", 16),
        ("onnx/efficientnet_b0/model.onnx", 32),
        ("onnx/convnext_tiny/model.onnx", 16),
        ("onnx/inception_v3/model.onnx", 16),
        ("onnx/wide_resnet101_2/model.onnx", 16),
        ("onnx/gpt2/model.onnx", 8),
    ] {
        let (graph, info) = common::load(model, batch);
        let macs = account(&graph, &info).expect("account").macs as f64;
        drop((graph, info));
        for gpus in [1u32, 4] {
            let dir = tempfile::tempdir().expect("temp dir");
            let (counts, predicted) = planned_step(
                ralpc::Options {
                    model: common::fixture(model),
                    gpus: Some(gpus),
                    batch: Some(batch),
                    ..Default::default()
                },
                dir.path(),
            );
            let flops: f64 = counts.iter().map(|c| c.gemm_flops).sum();
            let ratio = flops / (6.0 * macs * f64::from(STEPS));
            let what = format!("{model} at batch {batch} on {gpus} GPUs");
            assert!(
                (0.98..=1.02).contains(&ratio),
                "{what}: the ranks' GEMM work is {ratio}× the model's"
            );
            assert_peak_as_predicted(&what, &counts, predicted);
        }
    }
}
