//! The CUDA executor (`ralpc_runtime_min::cuda::train`) on the host kernels against the CPU
//! backend's single-device training: the same losses, first gradients and weights after
//! three SGD steps. Everything the GPU runs except the launches themselves is checked
//! here: how each operator maps to kernels and GEMMs, the backward passes, the loss and
//! the optimizer.

mod common;

use ralpc_cuda_host::Host;
use ralpc_runtime_min::cpu::graph::Weights;
use ralpc_runtime_min::cpu::train::{train_reference, Dataset, Loss, TrainOptions, TrainReport};
use ralpc_runtime_min::cuda::train::{train, ReplicaControl};

fn compare(got: &TrainReport, want: &TrainReport, tol: f64) {
    assert_eq!(got.losses.len(), want.losses.len());
    for (g, w) in got.losses.iter().zip(&want.losses) {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "loss {g} against {w}"
        );
    }
    assert!(common::relative_error(&got.first_output, &want.first_output) <= tol);
    for (maps, what) in [
        ((&got.first_gradients, &want.first_gradients), "gradient"),
        ((&got.weights, &want.weights), "weight"),
    ] {
        assert_eq!(
            maps.0.keys().collect::<Vec<_>>(),
            maps.1.keys().collect::<Vec<_>>()
        );
        for (name, w) in maps.1 {
            let e = common::relative_error(&maps.0[name], w);
            assert!(e <= tol, "{what} {name}: relative error {e}");
        }
    }
}

fn check(model: &str, batch: u64, loss: Loss) {
    check_steps(model, batch, loss, 3, 1e-4);
}

fn check_steps(model: &str, batch: u64, loss: Loss, steps: u32, tol: f64) {
    let (graph, info) = common::load(model, batch);
    let weights = Weights::load(&graph, 3).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 3, loss);
    let options = TrainOptions {
        steps,
        seed: 3,
        lr: 0.05,
        momentum: 0.9,
        loss,
    };
    let want = train_reference(&graph, &info, &weights, &data, &options).expect("cpu");
    let got = train(&Host, &graph, &info, &weights, &data, &options)
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    compare(&got, &want, tol);
    if steps > 1 {
        assert!(
            want.losses[steps as usize - 1] < want.losses[0],
            "{model} trains: {:?}",
            want.losses
        );
    }
}

#[test]
fn mlp_trains_as_on_the_cpu() {
    check("train/mlp.onnx", 8, Loss::CrossEntropy);
    check("train/mlp.onnx", 4, Loss::Mse);
}

#[test]
fn cnn_trains_as_on_the_cpu() {
    check("train/cnn.onnx", 4, Loss::CrossEntropy);
}

#[test]
fn transformer_block_trains_as_on_the_cpu() {
    check("train/transformer.onnx", 2, Loss::CrossEntropy);
}

/// Batch norm, residual additions, padded max pooling and global average pooling. Batch
/// norm over two samples amplifies rounding (the CPU accumulates its statistics in f64,
/// the kernels in f32): 1e-3, the GPU validation's tolerance.
#[test]
fn resnet50_trains_as_on_the_cpu() {
    check_steps("onnx/resnet50/model.onnx", 2, Loss::CrossEntropy, 1, 1e-3);
}

/// Depthwise (grouped) convolutions, ReLU6 as Clip, inverted residuals.
#[test]
fn mobilenet_v2_trains_as_on_the_cpu() {
    check_steps(
        "onnx/mobilenet_v2/model.onnx",
        2,
        Loss::CrossEntropy,
        1,
        1e-3,
    );
}

/// SiLU as Sigmoid·Mul, squeeze-and-excitation (broadcast multiplies), ReduceMean.
#[test]
fn efficientnet_b0_trains_as_on_the_cpu() {
    check_steps(
        "onnx/efficientnet_b0/model.onnx",
        2,
        Loss::CrossEntropy,
        1,
        1e-3,
    );
}

#[test]
fn vgg16_trains_as_on_the_cpu() {
    check_steps("onnx/vgg16/model.onnx", 1, Loss::CrossEntropy, 1, 1e-4);
}

#[test]
fn an_operator_without_a_lowering_is_named() {
    // VGG16 runs on the device path; a Gather (GPT-2's embedding) is refused by name.
    let (graph, info) = common::load("onnx/gpt2_torchscript/model.onnx", 1);
    let weights = Weights::load(&graph, 0).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 0, Loss::CrossEntropy);
    let e = train(
        &Host,
        &graph,
        &info,
        &weights,
        &data,
        &TrainOptions::default(),
    )
    .expect_err("GPT-2 needs Gather");
    // The node, then the device's reason as its cause.
    assert!(e.to_string().contains("/wte/Gather"), "{e}");
    let e = ralpc_runtime_min::error_chain(&e);
    assert!(e.contains("is not on the CUDA backend yet"), "{e}");
}

/// `ralpc profile --device cuda:N`'s measurement, on the host kernels: every node of the
/// CNN timed forward, and backward where it has a gradient.
#[test]
fn every_node_is_timed() {
    use ralpc_ir::Op;
    use ralpc_runtime_min::cuda::train::profile;
    let (graph, info) = common::load("train/cnn.onnx", 2);
    let weights = Weights::load(&graph, 1).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 1, Loss::CrossEntropy);
    let nodes: Vec<_> = info
        .order()
        .iter()
        .copied()
        .filter(|&n| !matches!(graph.node(n).op, Op::Input | Op::Constant { .. }))
        .collect();
    let times = profile(&Host, &graph, &info, &weights, &data, &nodes, 3).expect("profile");
    assert_eq!(times.iter().map(|t| t.node).collect::<Vec<_>>(), nodes);
    for t in &times {
        let op = &graph.node(t.node).op;
        assert!(t.forward_us > 0.0, "{op:?}");
        if matches!(op, Op::Conv(_) | Op::Gemm(_)) {
            assert!(t.backward_us > 0.0, "{op:?}");
        }
    }
}

/// A model at the global batch, its seeded weights and data, and `steps` of training it on
/// one device (the CPU backend): what replicas must reproduce.
struct Reference {
    graph: ralpc_ir::Graph,
    info: ralpc_ir::GraphInfo,
    weights: Weights,
    data: Dataset,
    options: TrainOptions,
    want: TrainReport,
}

fn reference(model: &str, global: u64, steps: u32) -> Reference {
    let (graph, info) = common::load(model, global);
    let weights = Weights::load(&graph, 4).expect("weights");
    let data = Dataset::synthetic(&graph, &info, 4, Loss::CrossEntropy);
    let options = TrainOptions {
        steps,
        seed: 4,
        lr: 0.05,
        momentum: 0.9,
        loss: Loss::CrossEntropy,
    };
    let want = train_reference(&graph, &info, &weights, &data, &options).expect("cpu");
    Reference {
        graph,
        info,
        weights,
        data,
        options,
        want,
    }
}

/// Data-parallel replicas (threads, gradients summed through host memory or, as ranks sharing
/// one GPU do, device to device at a hub) train exactly as one device on the whole batch,
/// batch normalization by the whole batch's statistics included.
#[test]
fn data_parallel_replicas_train_as_one_device() {
    use ralpc_runtime_min::cuda::train::{shard, train_replica, HostStaged};
    use ralpc_runtime_min::dist::comm::World;
    use ralpc_runtime_min::dist::same_device::{Hub, SameDevice};
    for (model, replicas) in [
        ("train/mlp.onnx", 4usize),
        ("train/cnn.onnx", 2),
        ("train/transformer.onnx", 2),
        ("train/densenet.onnx", 2),
    ] {
        let global = 8u64;
        let Reference {
            weights,
            data,
            options,
            want,
            ..
        } = reference(model, global, 3);
        let (local_graph, local_info) = common::load(model, global / replicas as u64);
        let timeout = std::time::Duration::from_secs(30);
        let world = World::new(replicas as u32, timeout);
        let group: Vec<u32> = (0..replicas as u32).collect();
        let (buffers, losses) = (
            std::sync::Arc::new(Hub::new(replicas, timeout)),
            std::sync::Arc::new(Hub::new(replicas, timeout)),
        );
        let reports: Vec<TrainReport> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2 * replicas)
                .map(|k| {
                    let (r, device_to_device) = (k % replicas, k >= replicas);
                    let comm = world.comm(r as u32);
                    let (g, i, w, d, o, group) = (
                        &local_graph,
                        &local_info,
                        &weights,
                        &data,
                        &options,
                        group.clone(),
                    );
                    let (buffers, losses) = (&buffers, &losses);
                    s.spawn(move || {
                        let part = shard(d, r, replicas, i).expect("shard");
                        if device_to_device {
                            let sync = SameDevice::<Host>::new(buffers.clone(), losses.clone(), r);
                            train_replica(&Host, g, i, w, &part, o, &sync, &Default::default())
                                .expect("replica")
                        } else {
                            let sync = HostStaged { comm: &comm, group };
                            train_replica(&Host, g, i, w, &part, o, &sync, &Default::default())
                                .expect("replica")
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("replica thread"))
                .collect()
        });
        assert_eq!(reports.len(), 2 * replicas);
        for got in &reports {
            for (g, w) in got.losses.iter().zip(&want.losses) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{model}: {g} against {w}"
                );
            }
            for (name, w) in &want.weights {
                let e = common::relative_error(&got.weights[name], w);
                assert!(e <= 1e-5, "{model}: weight {name}: {e}");
            }
        }
    }
}

/// Replicas that note the length of every buffer they are asked to sum, in order.
struct Noting<'a, R> {
    inner: &'a R,
    lengths: std::sync::Mutex<Vec<usize>>,
}

impl<R: ralpc_runtime_min::cuda::train::Replicas<Host>>
    ralpc_runtime_min::cuda::train::Replicas<Host> for Noting<'_, R>
{
    fn count(&self) -> usize {
        self.inner.count()
    }
    fn all_reduce(
        &self,
        dev: &Host,
        buf: &mut <Host as ralpc_runtime_min::cuda::backend::Backend>::Buf,
    ) -> ralpc_runtime_min::cuda::backend::R<()> {
        use ralpc_runtime_min::cuda::backend::Backend as _;
        self.lengths.lock().expect("lengths").push(dev.len(buf));
        self.inner.all_reduce(dev, buf)
    }
    fn sum(&self, value: f64) -> ralpc_runtime_min::cuda::backend::R<f64> {
        self.inner.sum(value)
    }
}

/// The device's data-parallel loop sums a plan's gradient buckets in the plan's order,
/// every trained weight once per step, and still trains as one device on the whole batch.
#[test]
fn data_parallel_replicas_sum_the_plans_buckets_in_its_order() {
    use ralpc_runtime_min::cpu::exec::Executable;
    let (model, replicas, global) = ("train/cnn.onnx", 2usize, 8u64);
    let dir = tempfile::tempdir().expect("temp dir");
    let strategy = dir.path().join("strategy.json");
    std::fs::write(
        &strategy,
        r#"{ "format": "ralpc-strategy/1", "schedule": "1f1b", "microbatches": 1,
             "stages": [{ "first_layer": "conv0", "last_layer": "fc1", "replicas": 2 }],
             "layers": [] }"#,
    )
    .expect("write");
    let compiled = ralpc::compile(&ralpc::Options {
        model: common::fixture(model),
        gpus: Some(replicas as u32),
        batch: Some(global),
        strategy_file: Some(strategy),
        ..Default::default()
    })
    .expect("plan");
    let plan = &compiled
        .executable
        .as_ref()
        .expect("an executable plan")
        .plan;
    let Reference {
        graph,
        info,
        weights,
        data,
        options,
        want,
    } = reference(model, global, 2);
    let info_at = |batch: u64| -> Result<_, String> { Ok(common::load(model, batch).1) };
    let exe = Executable {
        plan,
        graph: &graph,
        info: &info,
        weights: &weights,
        data: &data,
        info_at: &info_at,
        compute: None,
    };
    let buckets = exe.gradient_buckets(0).expect("buckets");
    assert_eq!(buckets, exe.gradient_buckets(1).expect("buckets"));
    let mut every: Vec<_> = buckets.iter().flatten().copied().collect();
    every.sort_unstable();
    let mut trained = weights.trainable.clone();
    trained.sort_unstable();
    assert_eq!(every, trained, "every trained weight in one bucket");
    let control = ReplicaControl {
        buckets: &buckets,
        ..Default::default()
    };
    let runs = train_replicas(model, replicas, global, &weights, &data, &options, |_| {
        control
    });
    let size = |v| weights.tensors[&v].len();
    let per_step: Vec<usize> = buckets.iter().flatten().map(|&w| size(w)).collect();
    println!(
        "{} bucket(s): {:?}",
        buckets.len(),
        buckets.iter().map(Vec::len).collect::<Vec<_>>()
    );
    for (report, lengths) in &runs {
        assert_eq!(*lengths, per_step.repeat(options.steps as usize));
        for (g, w) in report.losses.iter().zip(&want.losses) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} against {w}");
        }
        for (name, w) in &want.weights {
            let e = common::relative_error(&report.weights[name], w);
            assert!(e <= 1e-5, "weight {name}: {e}");
        }
    }
}

/// `replicas` threads each training a replica of `model` on its share of `global` samples
/// on the host kernels, summing through host memory under `control(rank)`: each replica's
/// report and the lengths of the buffers it summed.
fn train_replicas<'a>(
    model: &str,
    replicas: usize,
    global: u64,
    weights: &Weights,
    data: &Dataset,
    options: &TrainOptions,
    control: impl Fn(usize) -> ReplicaControl<'a> + Sync,
) -> Vec<(TrainReport, Vec<usize>)> {
    use ralpc_runtime_min::cuda::train::{shard, train_replica, HostStaged};
    use ralpc_runtime_min::dist::comm::World;
    let (graph, info) = common::load(model, global / replicas as u64);
    let world = World::new(replicas as u32, std::time::Duration::from_secs(30));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..replicas)
            .map(|r| {
                let comm = world.comm(r as u32);
                let (graph, info, control) = (&graph, &info, &control);
                s.spawn(move || {
                    let part = shard(data, r, replicas, info).expect("shard");
                    let staged = HostStaged {
                        comm: &comm,
                        group: (0..replicas as u32).collect(),
                    };
                    let noting = Noting {
                        inner: &staged,
                        lengths: Default::default(),
                    };
                    let report = train_replica(
                        &Host,
                        graph,
                        info,
                        weights,
                        &part,
                        options,
                        &noting,
                        &control(r),
                    )
                    .expect("replica");
                    (report, noting.lengths.into_inner().expect("lengths"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("replica thread"))
            .collect()
    })
}

/// The device's data-parallel loop checkpoints (one replica writes; every one holds the
/// same state) and resumes: a run resumed from step 2 of 4 ends bit for bit as the run
/// that wrote it.
#[test]
fn data_parallel_replicas_checkpoint_and_resume_bit_for_bit() {
    use ralpc_runtime_min::cpu::exec::Checkpoint;
    let (model, replicas, global) = ("train/cnn.onnx", 2usize, 8u64);
    let Reference {
        weights,
        data,
        options,
        ..
    } = reference(model, global, 4);
    let written = std::sync::Mutex::new(Vec::<Checkpoint>::new());
    let sink = |c: &Checkpoint| -> Result<(), String> {
        written.lock().expect("checkpoints").push(c.clone());
        Ok(())
    };
    let whole = train_replicas(model, replicas, global, &weights, &data, &options, |r| {
        ReplicaControl {
            checkpoint_every: Some(2),
            on_checkpoint: (r == 0).then_some(&sink as _),
            ..Default::default()
        }
    });
    let written = written.into_inner().expect("checkpoints");
    assert_eq!(written.iter().map(|c| c.step).collect::<Vec<_>>(), [2, 4]);
    let at_2 = &written[0];
    let trained = (weights.trainable.iter())
        .filter(|w| weights.tensors[w].floats().is_some())
        .count();
    assert_eq!(at_2.weights.len(), trained, "every trained weight");
    assert_eq!(at_2.velocity.len(), trained, "and its momentum");
    assert_eq!(at_2.losses, whole[0].0.losses[..2]);
    let resumed = train_replicas(model, replicas, global, &weights, &data, &options, |_| {
        ReplicaControl {
            resume: Some(at_2),
            ..Default::default()
        }
    });
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for ((whole, _), (resumed, _)) in whole.iter().zip(&resumed) {
        assert_eq!(
            resumed
                .losses
                .iter()
                .map(|l| l.to_bits())
                .collect::<Vec<_>>(),
            whole.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>()
        );
        for (name, w) in &whole.weights {
            assert!(bits(&resumed.weights[name]) == bits(w), "weight {name}");
        }
    }
}
