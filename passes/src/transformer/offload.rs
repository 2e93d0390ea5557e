//! The price of keeping state in host memory (Hydra's spilling, ZeRO-Offload, as
//! Megatron-Core runs them today):
//! * **activations, layer by layer** (`--cpu-offloading-num-layers N`, Transformer Engine's
//!   double-buffered group offload handler): the first `N` blocks' stashed activations are
//!   copied to host memory while the next block computes its forward pass, and back while
//!   the block after them computes its backward pass. A copy longer than that compute shows.
//!   The GPU keeps the other blocks' activations and the one block whose copy is in flight.
//! * **the optimizer** (`--optimizer-cpu-offload --optimizer-offload-fraction F`, Megatron-
//!   Core's hybrid device optimizer on fp32 main parameters): a fraction `F` of the shard's
//!   master weights and moments lives in host memory; each step copies its fp32 gradients
//!   down, steps them on the CPU (memory-bound: it reads gradient, master weight and moments
//!   and writes the last two back, beside the copies' own traffic) and copies the updated
//!   weights up, the three overlapped group by group (`--overlap-cpu-optimizer-d2h-h2d`),
//!   so the slowest shows; the GPU steps its own share meanwhile.

use crate::cluster::{Host, Link};

/// Bytes of a host-stepped parameter's fp32 gradient copied down and fp32 weight copied
/// back (the hybrid device optimizer works on Megatron's fp32 main parameters).
const MAIN_BYTES: f64 = 4.0;

/// What one offloaded block's activation copies add to one microbatch, µs: the copy down
/// beyond the next block's forward pass, the copy back beyond the backward pass it hides
/// behind.
pub(super) fn activation_copies_us(
    link: Link,
    bytes: f64,
    forward_us: f64,
    backward_us: f64,
) -> f64 {
    let copy = link.transfer_us(bytes);
    (copy - forward_us).max(0.0) + (copy - backward_us).max(0.0)
}

/// The host-stepped share of an optimizer step: `params` parameters whose master weight
/// and state take `state_bytes` each, on one of `gpus_per_node` GPUs all stepping at once, µs.
pub(super) fn host_step_us(host: &Host, gpus_per_node: u32, params: f64, state_bytes: f64) -> f64 {
    if params <= 0.0 {
        return 0.0;
    }
    let link = host.copy_link(gpus_per_node);
    let copy = link.transfer_us(params * MAIN_BYTES);
    // Host memory traffic: the step reads the gradient and reads and writes the master
    // weight and moments, while the copies write the gradient and read the weight.
    let traffic = params * (3.0 * MAIN_BYTES + 2.0 * state_bytes);
    let step = traffic / host.step_bandwidth(gpus_per_node) * 1e6;
    copy.max(step)
}

/// Host bytes a host-stepped parameter takes: its master weight and state, and the pinned
/// buffer its gradient is copied into.
pub(super) fn host_step_bytes(state_bytes: f64) -> f64 {
    state_bytes + MAIN_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Cluster;

    #[test]
    fn a_copy_shorter_than_the_compute_beside_it_is_free() {
        let link = Link {
            latency_us: 0.0,
            bandwidth: 50e9,
        };
        // 50 MB at 50 GB/s: 1,000 µs each way.
        assert_eq!(activation_copies_us(link, 50e6, 2_000.0, 4_000.0), 0.0);
        assert_eq!(activation_copies_us(link, 50e6, 400.0, 4_000.0), 600.0);
        assert_eq!(activation_copies_us(link, 50e6, 400.0, 700.0), 900.0);
    }

    #[test]
    fn the_host_step_is_bound_by_the_slower_of_the_copies_and_host_memory() {
        let cluster = Cluster::preset("dgx-h100").unwrap();
        let host = cluster.groups[0].host.unwrap();
        // 1 G parameters of Adam in fp32 (12 bytes): 36 GB of host traffic (the step's 28,
        // the copies' 8) at a share of 563.2 GB/s × 0.8 over 8 GPUs (56.32 GB/s): 639 ms;
        // copies of 4 GB at 63 GB/s × 0.883 = 55.6 GB/s: 72 ms.
        let us = host_step_us(&host, 8, 1e9, 12.0);
        assert!((us - 36e9 / 56.32e9 * 1e6).abs() < 1.0, "{us}");
        assert!(host_step_us(&host, 1, 1e9, 12.0) < us);
        assert_eq!(host_step_us(&host, 8, 0.0, 12.0), 0.0);
    }
}
