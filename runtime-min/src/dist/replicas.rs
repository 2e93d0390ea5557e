//! What the devices of one group of ranks sum their gradients and pass their messages
//! with, device to device:
//! the same-device hub ([`super::same_device`]) for ranks sharing a GPU, NCCL
//! ([`super::nccl`]) across GPUs. The plan interpreter's device
//! ([`crate::cuda::on_device::OnDevice::with_replicas`]) sums its gradient buckets, a
//! row-parallel layer's partial sums, input gradients and tied weights' gradients with it.

use crate::cuda::backend::{Backend, R};

/// How the devices of a run's ranks combine what each computed, device to device.
pub trait Replicas<B: Backend> {
    /// Whether these replicas run collectives over `group` (the run's ranks, sorted).
    /// Every member of the group answers alike: the answer depends on the kind of replicas
    /// and the group alone, so either all of them meet or none does.
    fn reaches(&self, group: &[u32]) -> bool;
    /// Sums `buf` over `group` (sorted, one [`Replicas::reaches`] accepts), in place: the
    /// same result on every member, its parts added in rank order. Later work on the
    /// device is ordered after it.
    fn all_reduce(&self, dev: &B, group: &[u32], buf: &mut B::Buf) -> R<()>;
    /// Every member's `buf` (their lengths may differ), in the order of `group` (sorted,
    /// one [`Replicas::reaches`] accepts), this rank's own as a copy. `None`: these
    /// replicas have no gather (every member answers alike, nothing was sent).
    fn all_gather(&self, dev: &B, group: &[u32], buf: &B::Buf) -> R<Option<Vec<B::Buf>>> {
        let _ = (dev, group, buf);
        Ok(None)
    }
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
