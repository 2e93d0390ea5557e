//! What the devices of one group of ranks sum their gradients and pass their messages
//! with, device to device:
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
    /// Sends `buf` to rank `to` under `tag`, device to device. `Ok(false)`: these replicas
    /// have no point-to-point path, and the interpreter sends through its communicator
    /// (every rank decides alike: the answer depends on the kind of replicas alone).
    fn send(&self, dev: &B, to: u32, tag: u64, buf: &B::Buf) -> R<bool> {
        let _ = (dev, to, tag, buf);
        Ok(false)
    }
    /// Receives the `n` elements rank `from` sent under `tag`, device to device; `None`
    /// when there is no point-to-point path ([`Replicas::send`]).
    fn recv(&self, dev: &B, from: u32, tag: u64, n: usize) -> R<Option<B::Buf>> {
        let _ = (dev, from, tag, n);
        Ok(None)
    }
}
