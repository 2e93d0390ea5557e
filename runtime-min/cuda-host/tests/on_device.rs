//! A device behind the plan interpreter ([`OnDevice`]) keeps what it computes
//! resident: a model's chain of device nodes uploads each operand once and reads nothing
//! back until the host reads a result or a gradient, and computes what the CPU backend
//! computes.

mod common;

use ralpc_cuda_host::Host;
use ralpc_ir::{Graph, GraphInfo};
use ralpc_runtime_min::cpu::exec::Compute;
use ralpc_runtime_min::cpu::graph::{self, Grads, Values, Weights};
use ralpc_runtime_min::cpu::ops::{Env, Mode};
use ralpc_runtime_min::cpu::train::{Dataset, Loss};
use ralpc_runtime_min::cuda::on_device::OnDevice;

/// The model's weights and the batch's inputs, and the float bytes among them.
fn operands(graph: &Graph, info: &GraphInfo) -> (Values, u64) {
    let weights = Weights::load(graph, 3).expect("weights");
    let data = Dataset::synthetic(graph, info, 3, Loss::CrossEntropy);
    let mut values = Values::new(graph);
    let mut bytes = 0;
    for (&v, t) in weights.tensors.iter().chain(&data.inputs) {
        bytes += t.floats().map_or(0, |f| 4 * f.len() as u64);
        values.set(v, t.clone());
    }
    (values, bytes)
}

#[test]
fn a_chain_of_device_nodes_stays_on_the_device() {
    let (graph, info) = common::load("train/cnn.onnx", 4);
    let env = Env {
        mode: Mode::Training,
        exported_batch: graph.rebatch().map(|r| r.exported),
        samples: None,
    };
    let output = graph.outputs()[0];
    let (mut want, _) = operands(&graph, &info);
    let host_records = graph::forward(&graph, info.order(), &mut want, env).expect("cpu");

    let device = OnDevice::new(Host);
    let transfers = device.transfers();
    let (mut got, operand_bytes) = operands(&graph, &info);
    let records = device
        .forward(&graph, info.order(), &mut got, env)
        .expect("forward on the device");
    assert_eq!(
        transfers.uploaded(),
        operand_bytes,
        "every float operand crosses once, nothing else"
    );
    assert_eq!(transfers.read_back(), 0, "no result read back yet");

    let y = got.get(output).and_then(|t| t.floats()).expect("output");
    let y_want = want.get(output).and_then(|t| t.floats()).expect("output");
    assert_eq!(
        transfers.read_back(),
        4 * y.len() as u64,
        "reading the output reads it back, and only it"
    );
    assert!(common::relative_error(y, y_want) <= 1e-5);
    let _ = y.to_vec();
    assert_eq!(transfers.read_back(), 4 * y.len() as u64, "read back once");

    // The backward pass, from the device's own saved state, gives the CPU's gradients.
    let dy: Vec<f32> = (0..y.len()).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let (mut g_got, mut g_want) = (Grads::default(), Grads::default());
    g_got.add(output, &dy);
    g_want.add(output, &dy);
    device
        .backward(&graph, &records, &got, &mut g_got)
        .expect("backward on the device");
    assert_eq!(
        transfers.uploaded(),
        operand_bytes + 4 * dy.len() as u64,
        "the backward pass uploads only the host's output gradient"
    );
    assert_eq!(
        transfers.read_back(),
        4 * y.len() as u64,
        "the gradients stay on the device until read"
    );
    graph::backward(&graph, &host_records, &want, &mut g_want).expect("cpu backward");
    let mut compared = 0;
    for &v in graph.inputs().iter().chain(
        info.order()
            .iter()
            .flat_map(|&n| graph.node(n).inputs.iter().flatten()),
    ) {
        if let (Some(a), Some(b)) = (g_got.get(v), g_want.get(v)) {
            let e = common::relative_error(a, b);
            assert!(e <= 1e-4, "{}: relative error {e}", graph.value(v).name);
            compared += 1;
        }
    }
    assert!(compared > 4, "{compared} gradients compared");
}

/// A box cut from a tensor resident on the device (a message's piece) is cut there: it
/// holds what the host's cut would, and nothing is read back to cut it.
#[test]
fn a_box_is_cut_where_the_tensor_is() {
    let device = OnDevice::new(Host);
    // A [3, 4, 5] tensor holding the box [2..5, 0..4, 10..15] of a larger one.
    let holder = [2..5, 0..4, 10..15];
    let values: Vec<f32> = (0..60).map(|i| i as f32).collect();
    let x = device
        .add(values.clone().into(), &vec![0.0; 60].into())
        .expect("a resident tensor");
    let read = device.transfers().read_back();
    let piece = [3..5, 1..3, 11..14];
    let cut = device
        .crop(&x, &holder, &piece)
        .expect("cut")
        .expect("cut on the device");
    assert_eq!(device.transfers().read_back(), read, "nothing read back");
    let mut want = Vec::new();
    for a in piece[0].clone() {
        for b in piece[1].clone() {
            for c in piece[2].clone() {
                want.push(values[((a - 2) * 4 + b) * 5 + (c - 10)]);
            }
        }
    }
    assert_eq!(&cut[..], &want[..]);
    assert_eq!(
        device
            .crop(&values.into(), &holder, &piece)
            .expect("cut on the host"),
        None,
        "a tensor on the host is cut there"
    );
}

/// Ranks sharing a device meet at the same-device hub over any group of them: pairs
/// summing at once, then pairs that cross the first ones, then every rank gathering
/// parts of different lengths, then the sum over all of them — each member getting the
/// same result, its parts in rank order.
#[test]
fn the_hub_sums_and_gathers_over_any_group_of_its_ranks() {
    use std::sync::Arc;
    use std::time::Duration;

    use ralpc_runtime_min::cuda::backend::Backend;
    use ralpc_runtime_min::dist::same_device::{Hub, SameDevice};
    use ralpc_runtime_min::dist::Replicas;
    let hub = Arc::new(Hub::new(4, Duration::from_secs(10)));
    let sum = |side: &SameDevice<Host>, group: &[u32], value: f32| {
        let mut buf = Host.upload(&[value; 3]).expect("upload");
        assert!(side.reaches(group));
        side.all_reduce(&Host, group, &mut buf).expect("sum");
        Host::read_back(&buf).expect("read back")
    };
    std::thread::scope(|s| {
        for rank in 0..4u32 {
            let hub = hub.clone();
            s.spawn(move || {
                let side = SameDevice::<Host>::new(hub, rank as usize);
                let pair = if rank < 2 { [0, 1] } else { [2, 3] };
                let want = if rank < 2 { 1.0 + 2.0 } else { 3.0 + 4.0 };
                assert_eq!(sum(&side, &pair, (rank + 1) as f32), [want; 3]);
                let across = [rank % 2, rank % 2 + 2];
                let want = (across[0] * 10 + across[1] * 10) as f32;
                assert_eq!(sum(&side, &across, (rank * 10) as f32), [want; 3]);
                let own = Host
                    .upload(&vec![rank as f32; rank as usize + 1])
                    .expect("upload");
                let parts = side
                    .all_gather(&Host, &[0, 1, 2, 3], &own)
                    .expect("gather")
                    .expect("the hub gathers");
                for (member, part) in parts.iter().enumerate() {
                    let got = Host::read_back(part).expect("read back");
                    assert_eq!(got, vec![member as f32; member + 1], "rank {rank}");
                }
                assert_eq!(sum(&side, &[0, 1, 2, 3], 1.0), [4.0; 3]);
            });
        }
    });
}
