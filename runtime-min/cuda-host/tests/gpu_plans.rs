//! On an NVIDIA GPU (`cargo test -p ralpc-cuda-host --test gpu_plans -- --ignored
//! --nocapture`): plans through the plan interpreter with every rank's layers on the GPU
//! ([`OnDevice`] over [`Gpu`]), meeting at the same-device hub, against the CPU backend:
//! burst, SOAP and pipeline plans, a data-parallel plan, and a GPT in tensor × pipeline ×
//! data parallelism whose ranks sum over their groups on the GPU; and full-size steps of
//! ResNet-50, VGG16 and MobileNetV2, one rank and data parallel, timed against the
//! one-device loop (printed, a measurement). `tests/plans.rs` runs the same path on the
//! host-compiled kernels on every machine.

mod common;

use std::sync::{Arc, Mutex};

use ralpc_runtime_min::cpu::exec::Compute;
use ralpc_runtime_min::cuda::backend::Backend;
use ralpc_runtime_min::cuda::error::DeviceError;
use ralpc_runtime_min::cuda::gpu::Gpu;
use ralpc_runtime_min::cuda::on_device::{OnDevice, Transfers};
use ralpc_runtime_min::dist::same_device::{Hub, SameDevice};

/// Within this, the GPU trains as the CPU (fp32, TF32 off).
const TOLERANCE: f64 = 1e-3;

/// Every rank's layers on GPU 0 (its own streams), meeting at the same-device hub when
/// there are several, as `ralpc run --backend cuda` ranks do; each device's transfer
/// counters kept.
struct Devices {
    group: Vec<u32>,
    buffers: Arc<Hub<<Gpu as Backend>::Buf>>,
    transfers: Mutex<Vec<(u32, Arc<Transfers>)>>,
}

impl Devices {
    fn new(ranks: u32) -> Self {
        let timeout = std::time::Duration::from_secs(60);
        Self {
            group: (0..ranks).collect(),
            buffers: Arc::new(Hub::new(ranks.max(1) as usize, timeout)),
            transfers: Mutex::default(),
        }
    }

    fn open(&self, rank: u32) -> Result<Box<dyn Compute>, DeviceError> {
        let gpu = Gpu::new(0)?;
        let device = if self.group.len() > 1 {
            let hub = SameDevice::<Gpu>::new(self.buffers.clone(), rank as usize);
            OnDevice::with_replicas(gpu, &self.group, Box::new(hub))
        } else {
            OnDevice::new(gpu)
        };
        self.transfers
            .lock()
            .expect("counters")
            .push((rank, device.transfers()));
        Ok(Box::new(device))
    }

    fn report(&self, what: &str) {
        for (rank, t) in self.transfers.lock().expect("counters").iter() {
            eprintln!(
                "{what}: rank {rank} uploaded {:.2} MB, read back {:.2} MB",
                t.uploaded() as f64 / 1e6,
                t.read_back() as f64 / 1e6
            );
        }
    }
}

fn check(what: &str, model: &str, gpus: u32, strategy: &str) {
    let (_dir, options) = common::planned(&common::fixture(model), gpus, strategy);
    check_run(what, &options, gpus);
}

/// The run of `options` on `ranks` GPU devices against the CPU backend's.
fn check_run(what: &str, options: &ralpc::RunOptions, ranks: u32) {
    let want = ralpc::run(options).expect("cpu run").report;
    let devices = Devices::new(ranks);
    let got = ralpc::run_with_compute(options, &|r| devices.open(r))
        .unwrap_or_else(|e| panic!("{what}: {}", ralpc_runtime_min::error_chain(&e)))
        .report;
    eprintln!("{what}: losses {:?} (CPU {:?})", got.losses, want.losses);
    devices.report(what);
    common::assert_trains_as(what, &got, &want, TOLERANCE);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn plans_run_on_the_gpu_through_the_interpreter_as_on_the_cpu() {
    let test = "plans_run_on_the_gpu_through_the_interpreter_as_on_the_cpu";
    if common::gpu(test).is_none() {
        return;
    }
    let cnn = "train/cnn.onnx";
    for (family, strategy) in common::cnn_plans() {
        check(family, cnn, 4, &strategy);
    }
    let one = r#"{ "first_layer": "conv0", "last_layer": "fc1", "replicas": 1 }"#;
    check("one rank", cnn, 1, &common::strategy(one, &[], "1f1b", 1));
    let two = r#"{ "first_layer": "conv0", "last_layer": "fc1", "replicas": 2 }"#;
    check(
        "data parallel",
        cnn,
        2,
        &common::strategy(two, &[], "1f1b", 1),
    );
    for zero in [0, 1] {
        let (_dir, options) = common::megatron_gpt(zero);
        check_run(&format!("GPT t2 p2 d2 ZeRO-{zero}"), &options, 8);
    }
}

/// The median of `steps` after the first (start-up, uploads and the first step's
/// algorithm choices left out).
fn steady(mut steps: Vec<f64>) -> f64 {
    steps.remove(0);
    steps.sort_by(f64::total_cmp);
    steps[steps.len() / 2]
}

/// Seconds per step of `options`' plan through the interpreter on the GPU, as `ralpc run
/// --backend cuda` runs it.
fn interpreter_step_seconds(options: &ralpc::RunOptions) -> f64 {
    let run = ralpc::run(&ralpc::RunOptions {
        steps: 8,
        backend: ralpc::Backend::Cuda,
        ..options.clone()
    })
    .unwrap_or_else(|e| panic!("{}", ralpc_runtime_min::error_chain(&e)));
    steady(run.report.step_seconds)
}

/// The same model and batch in the one-device loop (`cuda::train`, which the profiler
/// times nodes in).
fn device_loop_step_seconds(gpu: &Gpu, model: &str, batch: u64) -> f64 {
    use ralpc_runtime_min::cpu::graph::Weights;
    use ralpc_runtime_min::cpu::train::{Dataset, Loss, TrainOptions};
    let (graph, info) = common::load(model, batch);
    let weights = Weights::load(&graph, 0).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 0, Loss::CrossEntropy);
    let options = TrainOptions {
        steps: 8,
        ..TrainOptions::default()
    };
    let report =
        ralpc_runtime_min::cuda::train::train(gpu, &graph, &info, &weights, &data, &options)
            .unwrap_or_else(|e| panic!("{model}: {e}"));
    steady(report.step_seconds)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn full_size_steps_through_the_interpreter_against_the_device_loop() {
    let test = "full_size_steps_through_the_interpreter_against_the_device_loop";
    let Some(gpu) = common::gpu(test) else {
        return;
    };
    for (model, batch, ranks) in [
        ("onnx/resnet50/model.onnx", 32, 1),
        ("onnx/resnet50/model.onnx", 64, 2),
        ("onnx/vgg16/model.onnx", 32, 1),
        ("onnx/mobilenet_v2/model.onnx", 64, 1),
        ("onnx/mobilenet_v2/model.onnx", 64, 2),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let compiled = ralpc::compile(&ralpc::Options {
            model: common::fixture(model),
            gpus: Some(ranks),
            batch: Some(batch),
            family: ralpc::passes::plan::Family::parse("dp"),
            tolerance: None,
            ..Default::default()
        })
        .expect("plan");
        compiled.write(dir.path()).expect("write the plan");
        let options = ralpc::RunOptions {
            plan: dir.path().to_path_buf(),
            model: Some(common::fixture(model)),
            ..Default::default()
        };
        let interpreter = interpreter_step_seconds(&options);
        let per_rank = batch / u64::from(ranks);
        let device_loop = device_loop_step_seconds(&gpu, model, per_rank);
        eprintln!(
            "{model} batch {batch}, data parallel on {ranks} rank(s) sharing the GPU: \
             interpreter {:.1} ms per step; the device loop, one rank at batch {per_rank}: \
             {:.1} ms ({:.2}×)",
            1e3 * interpreter,
            1e3 * device_loop,
            interpreter / device_loop
        );
    }
}
