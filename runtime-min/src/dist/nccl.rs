//! Data-parallel replicas summing their gradients with NCCL, one process per GPU: rank 0
//! makes the NCCL unique id and the TCP rendezvous ([`crate::dist::rendezvous`]) hands it
//! to every rank. Ranks sharing one GPU cannot use NCCL (it refuses duplicate devices):
//! ranks as threads use the same-device hub ([`crate::dist::same_device`]), processes the
//! plan interpreter's communicator.

use std::time::Duration;

use cudarc::nccl::{Comm, Id, ReduceOp};

use super::Replicas;
use crate::cuda::backend::R;
use crate::cuda::error::DeviceError;
use crate::cuda::gpu::Gpu;
use crate::dist::{rendezvous, Placement};

/// This process's member of the NCCL world. Collectives run on the GPU's communication
/// stream, ordered after the computation that produced their buffers and before the one
/// that reads them, so they overlap whatever computation is independent of them.
pub struct Nccl {
    comm: Comm,
    compute: std::sync::Arc<cudarc::driver::CudaStream>,
    rank: u32,
    /// Ranks in the world.
    world: u32,
    /// How long a collective may take before this rank gives up on the others.
    timeout: Duration,
}

fn fail<E: std::fmt::Debug>(what: &'static str) -> impl FnOnce(E) -> DeviceError {
    DeviceError::debug(format!("NCCL: {what}"))
}

impl Nccl {
    /// Joins the launcher's processes on `gpu`'s stream. The caller checks that NCCL
    /// loads ([`crate::cuda::libs`]).
    ///
    /// # Errors
    /// The rendezvous or NCCL's initialization failed.
    pub fn join(gpu: &Gpu, placement: &Placement, timeout: Duration) -> R<Nccl> {
        let id = if placement.rank == 0 {
            Some(Id::new().map_err(fail("cannot make the unique id"))?)
        } else {
            None
        };
        let blobs = rendezvous::all_gather(placement, timeout, |_| {
            id.as_ref()
                .map(|id| id.internal().iter().map(|&c| c as u8).collect())
                .unwrap_or_default()
        })
        .map_err(|e| DeviceError::Replicas(e.chain()))?;
        let bytes: [u8; 128] = blobs
            .first()
            .and_then(|b| b.as_slice().try_into().ok())
            .ok_or_else(|| {
                DeviceError::Replicas("NCCL: rank 0 sent no 128-byte unique id".into())
            })?;
        let id = Id::uninit(bytes.map(|b| b as std::ffi::c_char));
        let comm = Comm::from_rank(
            gpu.comm_stream().clone(),
            placement.rank as usize,
            placement.world as usize,
            id,
        )
        .map_err(fail("cannot join the world"))?;
        Ok(Nccl {
            comm,
            compute: gpu.stream().clone(),
            rank: placement.rank,
            world: placement.world,
            timeout,
        })
    }

    /// Waits for the collective just queued, polling so that a rank that stopped
    /// responding turns into an error after the timeout instead of a hang (dropping the
    /// communicator then aborts it, which frees the GPU).
    fn wait(&self, what: &str) -> R<()> {
        let stream = self.comm.stream();
        let done = stream
            .record_event(None)
            .map_err(fail("cannot record an event"))?;
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            // SAFETY: a live event of this context.
            let status = unsafe { cudarc::driver::sys::cuEventQuery(done.cu_event()) };
            match status {
                cudarc::driver::sys::CUresult::CUDA_SUCCESS => return Ok(()),
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    return Err(DeviceError::debug(format!("rank {}: {what}", self.rank))(
                        other,
                    ))
                }
            }
            if std::time::Instant::now() >= deadline {
                return Err(DeviceError::Replicas(format!(
                    "rank {} waited more than {} s for {what}: another rank stopped responding",
                    self.rank,
                    self.timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Replicas<Gpu> for Nccl {
    /// The whole world only: a smaller group would need a communicator of its own
    /// (`ncclCommSplit`), which ralpc does not make yet. No gather either: NCCL's wants
    /// equal parts, and the pieces of a resharding may differ.
    fn reaches(&self, group: &[u32]) -> bool {
        group.iter().copied().eq(0..self.world)
    }

    /// On the communication stream, after the compute stream's work so far (which made
    /// `buf`); the compute stream's later work waits for it, the host does not.
    fn all_reduce(
        &self,
        _: &Gpu,
        group: &[u32],
        buf: &mut <Gpu as crate::cuda::backend::Backend>::Buf,
    ) -> R<()> {
        if !self.reaches(group) {
            return Err(DeviceError::Inconsistent(format!(
                "NCCL was asked to sum over ranks {group:?} of a world of {}",
                self.world
            )));
        }
        self.comm
            .stream()
            .join(&self.compute)
            .map_err(fail("cannot order the streams"))?;
        self.comm
            .all_reduce_in_place(buf, &ReduceOp::Sum)
            .map_err(fail("all-reduce failed"))?;
        self.compute
            .join(&self.comm.stream())
            .map_err(fail("cannot order the streams"))
    }

    fn settle(&self) -> R<()> {
        self.wait("the gradient all-reduces (NCCL)")?;
        self.compute
            .join(&self.comm.stream())
            .map_err(fail("cannot order the streams"))
    }
}
