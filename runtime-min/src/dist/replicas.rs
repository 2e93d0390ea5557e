//! What the devices of one data-parallel group sum their gradients with, device to device:
//! the same-device hub ([`super::same_device`]) for ranks sharing a GPU, NCCL
//! ([`super::nccl`]) across GPUs. The plan interpreter's device
//! ([`crate::cuda::on_device::OnDevice::with_replicas`]) sums its gradient buckets with it.

use crate::cuda::backend::{Backend, R};

/// How data-parallel replicas combine what each computed on its share of the batch.
pub trait Replicas<B: Backend> {
    /// Sums `buf` over the replicas, in place (the same result on every one); later work
    /// on the device is ordered after it.
    fn all_reduce(&self, dev: &B, buf: &mut B::Buf) -> R<()>;
    /// Waits for every sum so far to complete, giving up after the replicas' timeout (a
    /// rank that stopped answering), and orders the device's later work after them.
    fn settle(&self) -> R<()> {
        Ok(())
    }
}
