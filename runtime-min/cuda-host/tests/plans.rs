//! Every kind of plan through the plan interpreter with its layers computed by the CUDA
//! executor on the host kernels ([`OnDevice`]), against the same plan computed by the CPU
//! backend: burst parallelism, SOAP splits of convolutions and dense layers, and 1F1B and
//! GPipe pipelines, each on 4 ranks. On a GPU the same path runs with `ralpc run --backend
//! cuda` (ranks sharing one GPU, or one per GPU under a launcher), and so does a
//! data-parallel plan with a fault injected.

mod common;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use ralpc_cuda_host::Host;
use ralpc_runtime_min::cpu::exec::Compute;
use ralpc_runtime_min::cpu::train::TrainReport;
use ralpc_runtime_min::cuda::backend::Backend;
use ralpc_runtime_min::cuda::error::DeviceError;
use ralpc_runtime_min::cuda::on_device::OnDevice;
use ralpc_runtime_min::dist::Replicas;

/// The plan of `strategy` for `model`, run on the CPU backend and on the device
/// ([`OnDevice`]): its messages through the interpreter's communicator, and device to
/// device through the same-device hub.
fn both(model: &std::path::Path, gpus: u32, strategy: &str) -> ([TrainReport; 2], TrainReport) {
    use ralpc_runtime_min::dist::same_device::{Hub, SameDevice};
    let (_dir, options) = common::planned(model, gpus, strategy);
    let cpu = ralpc::run(&options).expect("cpu run").report;
    let on_device = ralpc::run_with_compute(&options, &host_kernels)
        .expect("run on the device")
        .report;
    let hub = std::sync::Arc::new(Hub::new(gpus as usize, std::time::Duration::from_secs(30)));
    let ranks: Vec<u32> = (0..gpus).collect();
    let meeting = |rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
        let side = SameDevice::<Host>::new(hub.clone(), rank as usize);
        Ok(Box::new(OnDevice::with_replicas(
            Host,
            &ranks,
            Box::new(side),
        )))
    };
    let through_hub = ralpc::run_with_compute(&options, &meeting)
        .expect("run on the devices, meeting at the hub")
        .report;
    ([on_device, through_hub], cpu)
}

/// Every rank's layers on the host-compiled CUDA kernels.
fn host_kernels(_rank: u32) -> Result<Box<dyn Compute>, DeviceError> {
    Ok(Box::new(OnDevice::new(Host)))
}

fn check(what: &str, model: &str, gpus: u32, strategy: &str) {
    let ([got, through_hub], want) = both(&common::fixture(model), gpus, strategy);
    common::assert_trains_as(what, &got, &want, 1e-5);
    common::assert_trains_as(what, &through_hub, &want, 1e-5);
}

#[test]
fn burst_plans_run_on_the_device_as_on_the_cpu() {
    check("burst", "train/cnn.onnx", 4, &common::cnn_plan("burst"));
}

#[test]
fn soap_plans_run_on_the_device_as_on_the_cpu() {
    check("soap", "train/cnn.onnx", 4, &common::cnn_plan("soap"));
}

/// Convolutions and pooling split by rows exchange their halos, and the halos' gradients,
/// device to device through the hub: every message of the plan is a device call.
#[test]
fn row_splits_exchange_halos_on_the_device_as_on_the_cpu() {
    use ralpc::codegen::plan::Instruction;
    check("rows", "train/cnn.onnx", 4, &common::cnn_plan("rows"));
    let (_dir, options) = common::planned(
        &common::fixture("train/cnn.onnx"),
        4,
        &common::cnn_plan("rows"),
    );
    let calls = trains_through_counted_hub("rows", &options, 4);
    let (_, plan) = ralpc::read_plan(&options.plan).expect("the plan");
    let sends = plan
        .programs
        .iter()
        .flatten()
        .filter(|i| matches!(i, Instruction::Send { .. }))
        .count() as u64;
    assert!(sends > 0, "the pieces exchange halos");
    assert_eq!(
        Calls::get(&calls.sends),
        u64::from(options.steps) * sends,
        "every halo and every other message on the devices"
    );
}

#[test]
fn pipelines_run_on_the_device_as_on_the_cpu() {
    check("1f1b", "train/cnn.onnx", 4, &common::cnn_plan("1f1b"));
    check("gpipe", "train/cnn.onnx", 4, &common::cnn_plan("gpipe"));
    check("zb-h1", "train/cnn.onnx", 4, &common::cnn_plan("zb-h1"));
}

/// An activation real exports use, end to end (issue 61's example of adding an operator):
/// imported, counted by its facts, fused into its producer's unit as an epilogue, planned,
/// and trained on the host-compiled kernels as on the CPU backend. activations.onnx is
/// cnn.onnx with Mish, Softplus and HardSwish for its ReLUs.
#[test]
fn mish_softplus_and_hardswish_epilogues_run_on_the_device_as_on_the_cpu() {
    use ralpc::ir::{Op, Unary};
    let path = common::fixture("train/activations.onnx");
    let mut model = ralpc::ir::onnx::import(&path).expect("imports");
    let bindings = ralpc::ir::Bindings {
        batch: Some(8),
        ..Default::default()
    };
    ralpc::ir::bind(&mut model.graph, &bindings).expect("binds");
    let info = ralpc::ir::verify(&model.graph).expect("verifies");
    let graph = &model.graph;
    // Counted: Mish at 8 FLOPs per element of conv0's [8, 8, 16, 16] output.
    let counted = ralpc::ir::account(graph, &info).expect("counts");
    let mish = counted
        .layers
        .iter()
        .find(|l| matches!(graph.node(l.node).op, Op::Unary(Unary::Mish)))
        .expect("Mish is a counted op");
    assert_eq!(mish.flops, 8 * 8 * 8 * 16 * 16);
    // Fused: each activation joins its producer's layer.
    let layers = ralpc::passes::layers::build(graph, &info, 8, Default::default()).expect("layers");
    let ops = |name: &str| -> Vec<&str> {
        let layer = layers
            .layers
            .iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("no layer {name}"));
        layer.parts.iter().map(|p| p.op).collect()
    };
    assert_eq!(ops("conv0"), ["Conv", "Mish"]);
    assert_eq!(ops("conv1"), ["Conv", "Softplus"]);
    assert_eq!(ops("fc0"), ["Gemm", "HardSwish"]);
    // Trained: a SOAP split and a two-stage pipeline, on the device as on the CPU.
    check(
        "soap",
        "train/activations.onnx",
        4,
        &common::cnn_plan("soap"),
    );
    check(
        "1f1b",
        "train/activations.onnx",
        4,
        &common::cnn_plan("1f1b"),
    );
}

#[test]
fn data_parallel_checkpoints_resume_and_faults_run_through_the_interpreter() {
    use ralpc_runtime_min::cpu::exec::{Fault, FaultKind};
    let one_stage = r#"{ "first_layer": "conv0", "last_layer": "fc1", "replicas": 2 }"#;
    let (dir, options) = common::planned(
        &common::fixture("train/cnn.onnx"),
        2,
        &common::strategy(one_stage, &[], "1f1b", 1),
    );
    let options = ralpc::RunOptions {
        timeout: std::time::Duration::from_secs(2),
        ..options
    };
    let run = |o: &ralpc::RunOptions| ralpc::run_with_compute(o, &host_kernels);
    let whole = run(&ralpc::RunOptions {
        steps: 4,
        ..options.clone()
    })
    .expect("four steps");
    let checkpoint = dir.path().join("state.safetensors");
    run(&ralpc::RunOptions {
        steps: 2,
        checkpoint_every: Some(2),
        checkpoint: Some(checkpoint.clone()),
        ..options.clone()
    })
    .expect("two steps and a checkpoint");
    let resumed = run(&ralpc::RunOptions {
        steps: 4,
        resume: Some(checkpoint),
        ..options.clone()
    })
    .expect("two more");
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&resumed.report.losses), bits(&whole.report.losses));
    let error = run(&ralpc::RunOptions {
        fault: Some(Fault {
            rank: 1,
            instruction: 1,
            kind: FaultKind::Exit,
        }),
        ..options
    })
    .expect_err("an injected fault fails the run");
    assert_eq!(error.exit_code(), 4, "{error}");
    let message = ralpc_runtime_min::error_chain(&error);
    assert!(
        message.contains("rank 1 at instruction 1"),
        "the failed rank is named: {message}"
    );
}

/// A one-rank plan keeps its weights, momentum and gradients on the device, and takes the
/// loss there: after the first step's uploads (weights, their zero momentum, the batch)
/// only the labels go up each step and only each row's loss comes back, besides what the
/// report reads: the first output, the first step's gradients and the last weights.
#[test]
fn a_one_rank_plan_trains_on_the_device_without_its_weights_crossing() {
    use std::sync::{Arc, Mutex};

    use ralpc_runtime_min::cuda::on_device::Transfers;
    let one = r#"{ "first_layer": "conv0", "last_layer": "fc1", "replicas": 1 }"#;
    let model = common::fixture("train/cnn.onnx");
    let (_dir, options) = common::planned(&model, 1, &common::strategy(one, &[], "1f1b", 1));
    let counters: Mutex<Vec<Arc<Transfers>>> = Mutex::default();
    let counted = |_rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
        let device = OnDevice::new(Host);
        counters.lock().expect("counters").push(device.transfers());
        Ok(Box::new(device))
    };
    let steps = 5;
    let options = ralpc::RunOptions { steps, ..options };
    let got = ralpc::run_with_compute(&options, &counted).expect("run on the device");
    let want = ralpc::run(&options).expect("cpu run");
    common::assert_trains_as("one rank", &got.report, &want.report, 1e-5);
    let (weights, input, output) = common::sizes("train/cnn.onnx", 8, &want.report);
    let counters = counters.into_inner().expect("counters");
    assert_eq!(counters.len(), 1, "one rank, one device");
    let transfers = &counters[0];
    // A row of logits per sample: its label goes up (8 bytes), its loss comes back (4).
    let (steps, rows) = (u64::from(steps), 8);
    assert_eq!(
        transfers.uploaded(),
        2 * weights + input + steps * 8 * rows,
        "weights and momentum once, the batch once, the labels each step"
    );
    assert_eq!(
        transfers.read_back(),
        steps * 4 * rows + output + 2 * weights,
        "the rows' losses each step; the first output, the first step's gradients and the \
         last weights (the report's)"
    );
}

/// A data-parallel plan whose ranks' devices sum gradient buckets themselves (here the
/// same-device hub, as ranks sharing one GPU do; NCCL across GPUs) trains as the CPU
/// backend does, its gradients never read back: each rank's device reads back only its
/// rows' losses and what the report reads.
#[test]
fn data_parallel_gradients_are_summed_device_to_device() {
    data_parallel_on_devices("train/cnn.onnx", "conv0", "fc1");
}

/// Batch normalizations of a data-parallel plan normalize by the whole batch's statistics
/// on the devices, as the CPU backend does: only per-channel sums reach the host, never
/// an activation or a gradient.
#[test]
fn data_parallel_batch_norm_syncs_its_statistics_on_the_devices() {
    data_parallel_on_devices("train/densenet.onnx", "conv0", "fc");
}

/// [`data_parallel_gradients_are_summed_device_to_device`] for `model`, whose layers run
/// from `first` to `last`.
fn data_parallel_on_devices(model: &str, first: &str, last: &str) {
    use std::sync::{Arc, Mutex};

    use ralpc_runtime_min::cuda::on_device::Transfers;
    use ralpc_runtime_min::dist::same_device::{Hub, SameDevice};
    let ranks = 2;
    let dp =
        format!(r#"{{ "first_layer": "{first}", "last_layer": "{last}", "replicas": {ranks} }}"#);
    let (_dir, options) = common::planned(
        &common::fixture(model),
        ranks,
        &common::strategy(&dp, &[], "1f1b", 1),
    );
    let timeout = std::time::Duration::from_secs(30);
    let buffers = Arc::new(Hub::new(ranks as usize, timeout));
    let counters: Mutex<Vec<(u32, Arc<Transfers>)>> = Mutex::default();
    let group: Vec<u32> = (0..ranks).collect();
    let calls = Arc::new(Calls::default());
    let summing = |rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
        let hub = Counted {
            inner: SameDevice::<Host>::new(buffers.clone(), rank as usize),
            calls: calls.clone(),
        };
        let device = OnDevice::with_replicas(Host, &group, Box::new(hub));
        counters
            .lock()
            .expect("counters")
            .push((rank, device.transfers()));
        Ok(Box::new(device))
    };
    let steps = 4;
    let options = ralpc::RunOptions { steps, ..options };
    let got = ralpc::run_with_compute(&options, &summing).expect("run on the devices");
    let want = ralpc::run(&options).expect("cpu run");
    common::assert_trains_as(model, &got.report, &want.report, 1e-5);
    let (weights, input, output) = common::sizes(model, 8, &want.report);
    let (input, output) = (input / u64::from(ranks), output / u64::from(ranks));
    let steps = u64::from(steps);
    // One sum per gradient bucket: every all-reduce of a data-parallel rank's program.
    let (_, plan) = ralpc::read_plan(&options.plan).expect("the plan");
    let buckets: u64 = plan
        .programs
        .iter()
        .flatten()
        .filter(|i| matches!(i, ralpc::codegen::plan::Instruction::AllReduce { .. }))
        .count() as u64;
    assert_eq!(
        Calls::get(&calls.sums),
        steps * buckets,
        "one device collective per bucket and step"
    );
    let counters = counters.into_inner().expect("counters");
    assert_eq!(counters.len(), ranks as usize);
    // A row of logits per sample: its label goes up (8 bytes), its loss comes back (4).
    let rows = 8 / u64::from(ranks);
    for (rank, t) in counters {
        assert_eq!(
            t.uploaded(),
            2 * weights + steps * (input + 8 * rows),
            "rank {rank}: weights and momentum once; its samples and their labels each step"
        );
        assert_eq!(
            t.read_back(),
            steps * 4 * rows + output + 2 * weights,
            "rank {rank}: its rows' losses each step; its first output, the first gradients \
             and the last weights (the report's), no gradient for the sums"
        );
    }
}

/// Runs the plan of `options` with its `ranks` ranks on host kernels meeting at the
/// same-device hub, every device collective and message counted; checks that it trains as
/// the CPU backend does (`what` names it) and returns the counts.
fn trains_through_counted_hub(what: &str, options: &ralpc::RunOptions, ranks: u32) -> Arc<Calls> {
    use ralpc_runtime_min::dist::same_device::{Hub, SameDevice};
    let hub = Arc::new(Hub::new(ranks as usize, std::time::Duration::from_secs(30)));
    let calls = Arc::new(Calls::default());
    let group: Vec<u32> = (0..ranks).collect();
    let meeting = |rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
        let side = Counted {
            inner: SameDevice::<Host>::new(hub.clone(), rank as usize),
            calls: calls.clone(),
        };
        Ok(Box::new(OnDevice::with_replicas(
            Host,
            &group,
            Box::new(side),
        )))
    };
    let got = ralpc::run_with_compute(options, &meeting).expect("run on the devices");
    let want = ralpc::run(options).expect("cpu run");
    common::assert_trains_as(what, &got.report, &want.report, 1e-5);
    calls
}

/// What a [`Counted`] device collective was asked to do, over every rank.
#[derive(Default)]
struct Calls {
    sums: AtomicU64,
    gathers: AtomicU64,
    sends: AtomicU64,
}

impl Calls {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A device collective that counts its calls.
struct Counted<R> {
    inner: R,
    calls: std::sync::Arc<Calls>,
}

impl<R: Replicas<Host>> Replicas<Host> for Counted<R> {
    fn reaches(&self, group: &[u32]) -> bool {
        self.inner.reaches(group)
    }
    fn all_reduce(
        &self,
        dev: &Host,
        group: &[u32],
        buf: &mut <Host as Backend>::Buf,
    ) -> Result<(), DeviceError> {
        Calls::add(&self.calls.sums);
        self.inner.all_reduce(dev, group, buf)
    }
    fn all_gather(
        &self,
        dev: &Host,
        group: &[u32],
        buf: &<Host as Backend>::Buf,
    ) -> Result<Option<Vec<<Host as Backend>::Buf>>, DeviceError> {
        Calls::add(&self.calls.gathers);
        self.inner.all_gather(dev, group, buf)
    }
    fn send(
        &self,
        dev: &Host,
        to: u32,
        tag: u64,
        buf: &<Host as Backend>::Buf,
    ) -> Result<bool, DeviceError> {
        Calls::add(&self.calls.sends);
        self.inner.send(dev, to, tag, buf)
    }
    fn recv(
        &self,
        dev: &Host,
        from: u32,
        tag: u64,
        n: usize,
    ) -> Result<Option<<Host as Backend>::Buf>, DeviceError> {
        self.inner.recv(dev, from, tag, n)
    }
}

/// A two-stage pipeline whose ranks' devices pass its messages themselves (the
/// same-device hub, as ranks sharing one GPU do) trains as the CPU backend does, and its
/// activations and gradients never cross to the host: the devices move what a one-rank
/// plan's device moves, plus each step's microbatches of the batch, cut on the host.
#[test]
fn pipeline_messages_pass_device_to_device() {
    use std::sync::{Arc, Mutex};

    use ralpc_runtime_min::cuda::on_device::Transfers;
    use ralpc_runtime_min::dist::same_device::{Hub, SameDevice};
    let model = "train/cnn.onnx";
    let stages = r#"{ "first_layer": "conv0", "last_layer": "pool0", "replicas": 1 },
        { "first_layer": "conv1", "last_layer": "fc1", "replicas": 1 }"#;
    let (_dir, options) = common::planned(
        &common::fixture(model),
        2,
        &common::strategy(stages, &[], "1f1b", 2),
    );
    let steps = 3;
    let options = ralpc::RunOptions { steps, ..options };
    let hub = Arc::new(Hub::new(2, std::time::Duration::from_secs(30)));
    let calls = Arc::new(Calls::default());
    let counters: Mutex<Vec<Arc<Transfers>>> = Mutex::default();
    let passing = |rank: u32| -> Result<Box<dyn Compute>, DeviceError> {
        let side = Counted {
            inner: SameDevice::<Host>::new(hub.clone(), rank as usize),
            calls: calls.clone(),
        };
        let device = OnDevice::with_replicas(Host, &[0, 1], Box::new(side));
        counters.lock().expect("counters").push(device.transfers());
        Ok(Box::new(device))
    };
    let got = ralpc::run_with_compute(&options, &passing).expect("run on the devices");
    let want = ralpc::run(&options).expect("cpu run");
    common::assert_trains_as("pipeline", &got.report, &want.report, 1e-5);
    let (_, plan) = ralpc::read_plan(&options.plan).expect("the plan");
    let messages = plan
        .programs
        .iter()
        .flatten()
        .filter(|i| matches!(i, ralpc::codegen::plan::Instruction::Send { .. }))
        .count() as u64;
    assert!(messages > 0, "the stages exchange messages");
    assert_eq!(
        Calls::get(&calls.sends),
        u64::from(steps) * messages,
        "every message passes device to device"
    );
    let (weights, input, output) = common::sizes(model, 8, &want.report);
    let counters = counters.into_inner().expect("counters");
    let uploaded: u64 = counters.iter().map(|t| t.uploaded()).sum();
    let read_back: u64 = counters.iter().map(|t| t.read_back()).sum();
    let steps = u64::from(steps);
    // A row of logits per sample: its label goes up (8 bytes), its loss comes back (4).
    let rows = 8;
    assert_eq!(
        uploaded,
        2 * weights + steps * (input + 8 * rows),
        "weights and momentum once; each step its microbatches and their labels"
    );
    assert_eq!(
        read_back,
        steps * 4 * rows + output + 2 * weights,
        "the rows' losses each step; the first output, the first gradients and the last \
         weights (the report's)"
    );
}

/// A GPT planned as Megatron-LM plans one — tensor 2 × pipeline 2 × data 2, its head tied
/// to the embedding — on devices meeting at the same-device hub trains as the CPU backend
/// does, and every sum of the plan (the tensor-parallel groups' partial sums and input
/// gradients, the data-parallel groups' gradient buckets, the tied weight's gradient over
/// the first and last stages) is a device collective over its group: none goes through the
/// host.
#[test]
fn megatron_plans_sum_over_their_groups_device_to_device() {
    megatron_on_devices(0);
}

/// [`megatron_plans_sum_over_their_groups_device_to_device`] with ZeRO-1 (Megatron-LM's
/// distributed optimizer): the data-parallel groups reduce-scatter each gradient bucket on
/// the devices, each replica updates its share there, and the shares are gathered there.
#[test]
fn a_sharded_optimizer_reduces_updates_and_gathers_on_the_devices() {
    megatron_on_devices(1);
}

/// The Megatron GPT plan at ZeRO stage `zero` through the hub, against the CPU backend,
/// every collective and message of the plan a device call.
fn megatron_on_devices(zero: u8) {
    use ralpc::codegen::plan::{BufferKind, Instruction};
    let (_dir, options) = common::megatron_gpt(zero);
    let calls = trains_through_counted_hub(&format!("t2 p2 d2 ZeRO-{zero}"), &options, 8);
    let (_, plan) = ralpc::read_plan(&options.plan).expect("the plan");
    let count = |f: fn(&Instruction) -> bool| {
        plan.programs.iter().flatten().filter(|&i| f(i)).count() as u64
    };
    let tied = count(|i| matches!(i, Instruction::AllReduce { tied: Some(_), .. }));
    assert!(tied > 0, "the tied weight has its own sum");
    let collectives = count(|i| {
        matches!(
            i,
            Instruction::AllReduce { .. }
                | Instruction::ReduceScatter { .. }
                | Instruction::AllGather { .. }
                | Instruction::AllToAll { .. }
        )
    });
    // The loss statistics of the head split by vocabulary are gathered in place on the
    // output, on the host, where the loss is computed.
    let statistics = (plan.programs.iter().zip(&plan.buffers))
        .flat_map(|(program, buffers)| {
            program.iter().enumerate().filter(move |&(at, i)| {
                let at = at as u32;
                matches!(i, Instruction::AllGather { .. })
                    && buffers.iter().any(|b| {
                        b.kind == BufferKind::Activation
                            && b.reads.contains(&at)
                            && b.writes.contains(&at)
                    })
            })
        })
        .count() as u64;
    let steps = u64::from(options.steps);
    assert_eq!(
        Calls::get(&calls.sums) + Calls::get(&calls.gathers),
        steps * (collectives - statistics),
        "every collective but the loss statistics' on the devices"
    );
    let sends = count(|i| matches!(i, Instruction::Send { .. }));
    assert_eq!(
        Calls::get(&calls.sends),
        steps * sends,
        "every message on the devices"
    );
}

/// Ranks as processes would be, each meeting the others over TCP (here threads, each
/// with its own world and device, as `ralpc launch` starts them): data-parallel and
/// pipeline plans give the losses of the same plan in one process on the CPU, and the
/// checkpoint rank 0 gathers from the devices resumes there to the same losses.
#[test]
fn plans_over_tcp_run_on_the_devices_as_in_one_process() {
    use ralpc_runtime_min::dist::{auth::Secret, Launcher, Placement};
    let dp = r#"{ "first_layer": "conv0", "last_layer": "fc1", "replicas": 2 }"#;
    for (what, ranks, strategy) in [
        ("data parallel", 2, common::strategy(dp, &[], "1f1b", 1)),
        ("1f1b", 4, common::cnn_plan("1f1b")),
    ] {
        let (dir, options) = common::planned(&common::fixture("train/cnn.onnx"), ranks, &strategy);
        let want = ralpc::run(&options).expect("cpu run").report.losses;
        // Rank 0 gathers the ranks' device-resident weights into a checkpoint after two
        // steps; the CPU resumes from it below.
        let checkpoint = dir.path().join("tcp.safetensors");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let losses: Vec<Vec<f64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..ranks)
                .map(|rank| {
                    let options = ralpc::RunOptions {
                        placement: Some(Placement {
                            rank,
                            world: ranks,
                            local_rank: rank,
                            master_addr: "127.0.0.1".into(),
                            master_port: port,
                            launcher: Launcher::Torchrun,
                            secret: Some(Secret::new("a test run's secret").expect("secret")),
                        }),
                        timeout: std::time::Duration::from_secs(30),
                        checkpoint_every: Some(2),
                        checkpoint: Some(checkpoint.clone()),
                        ..options.clone()
                    };
                    s.spawn(move || {
                        ralpc::run_with_compute(&options, &host_kernels)
                            .unwrap_or_else(|e| {
                                panic!("rank {rank}: {}", ralpc_runtime_min::error_chain(&e))
                            })
                            .report
                            .losses
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank"))
                .collect()
        });
        for got in &losses {
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{what}: loss {g} against {w}"
                );
            }
            assert_eq!(got.len(), want.len(), "{what}");
        }
        let resumed = ralpc::run(&ralpc::RunOptions {
            resume: Some(checkpoint),
            ..options
        })
        .expect("the CPU resumes from the ranks' checkpoint");
        for (g, w) in resumed.report.losses.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{what}, resumed: loss {g} against {w}"
            );
        }
    }
}
