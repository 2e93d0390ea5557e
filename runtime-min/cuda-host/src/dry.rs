//! A device that computes nothing and counts: kernel launches, GEMMs and their FLOPs, and
//! the peak of live buffer bytes. It runs the CUDA executor's exact sequence of calls for a
//! training step at full size in milliseconds, so the lowering's work and memory are
//! checked without a GPU (against the model's FLOPs, and against a GPU's memory).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ralpc_runtime_min::cuda::backend::{Backend, Gemm, R};
use ralpc_runtime_min::cuda::launch::Launch;
use ralpc_runtime_min::dist::Replicas;

use crate::streams::Streams;

/// What a device and its clones counted: launches, GEMMs, live bytes and their peaks.
#[derive(Debug, Default)]
struct Tally {
    launches: AtomicU64,
    gemms: AtomicU64,
    gemm_flops: AtomicU64,
    /// Every live buffer's bytes.
    live: Live,
    /// Those of tensors (scratch excluded).
    tensors: Live,
    /// Those of scratch space.
    scratch: Live,
    /// The communication stream a read of the device's buffers waits for
    /// ([`Dry::on_stream`]).
    stream: std::sync::OnceLock<(Arc<Streams>, u32)>,
}

impl Tally {
    /// As a GPU's host reading one of its buffers: after the collectives and messages the
    /// rank launched so far, which the buffer's producer may have waited on.
    fn read(&self) -> R<()> {
        match self.stream.get() {
            Some((streams, rank)) => streams.wait(*rank, false),
            None => Ok(()),
        }
    }
}

/// Live bytes of a kind of buffer and their peak.
#[derive(Debug, Default)]
struct Live {
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl Live {
    fn grow(&self, bytes: usize) {
        let now = self.now.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn shrink(&self, bytes: usize) {
        self.now.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// A buffer: only its length, charged to the device while it lives.
#[derive(Debug)]
pub struct DryBuf {
    len: usize,
    bytes: usize,
    scratch: bool,
    tally: Arc<Tally>,
}

impl Drop for DryBuf {
    fn drop(&mut self) {
        self.tally.live.shrink(self.bytes);
        match self.scratch {
            true => self.tally.scratch.shrink(self.bytes),
            false => self.tally.tensors.shrink(self.bytes),
        }
    }
}

/// The counting device. Its clones count into the same tally, so a caller keeps one to
/// read what a device handed to a run (a rank's) did.
#[derive(Clone, Debug, Default)]
pub struct Dry {
    tally: Arc<Tally>,
}

/// What a run cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Counts {
    /// Kernel launches (GEMMs excluded).
    pub launches: u64,
    /// GEMM calls (a batched one counts once).
    pub gemms: u64,
    /// FLOPs of every GEMM (2·m·n·k per matrix).
    pub gemm_flops: f64,
    /// The most bytes live at once.
    pub peak_bytes: usize,
    /// The most bytes of tensors live at once (scratch space excluded).
    pub tensor_peak_bytes: usize,
    /// The most bytes of scratch space live at once ([`Backend::scratch`]).
    pub scratch_peak_bytes: usize,
}

impl Dry {
    /// What was counted so far.
    pub fn counts(&self) -> Counts {
        let t = &self.tally;
        Counts {
            launches: t.launches.load(Ordering::Relaxed),
            gemms: t.gemms.load(Ordering::Relaxed),
            gemm_flops: t.gemm_flops.load(Ordering::Relaxed) as f64,
            peak_bytes: t.live.peak(),
            tensor_peak_bytes: t.tensors.peak(),
            scratch_peak_bytes: t.scratch.peak(),
        }
    }

    /// This device as rank `rank`'s, whose reads wait for the rank's communication stream
    /// in `streams` (as [`DryReplicas`] on the same `streams` fills it).
    pub fn on_stream(self, streams: Arc<Streams>, rank: u32) -> Dry {
        // A second call would name another stream for the same device: keep the first.
        let _ = self.tally.stream.set((streams, rank));
        self
    }

    fn buffer(&self, len: usize, element: usize, scratch: bool) -> DryBuf {
        let bytes = len * element;
        self.tally.live.grow(bytes);
        match scratch {
            true => self.tally.scratch.grow(bytes),
            false => self.tally.tensors.grow(bytes),
        }
        DryBuf {
            len,
            bytes,
            scratch,
            tally: self.tally.clone(),
        }
    }
}

impl Backend for Dry {
    const COMPUTES_VALUES: bool = false;
    type Buf = DryBuf;
    type Idx = DryBuf;
    type Mark = ();

    fn mark(&self) -> R<()> {
        Ok(())
    }
    fn elapsed_us(&self, _: &(), _: &()) -> R<f64> {
        Ok(1.0)
    }
    fn zeros(&self, n: usize) -> R<DryBuf> {
        Ok(self.buffer(n, 4, false))
    }
    fn scratch(&self, n: usize) -> R<DryBuf> {
        Ok(self.buffer(n, 4, true))
    }
    fn upload(&self, data: &[f32]) -> R<DryBuf> {
        Ok(self.buffer(data.len(), 4, false))
    }
    fn upload_indices(&self, data: &[i64]) -> R<DryBuf> {
        Ok(self.buffer(data.len(), 8, false))
    }
    fn index_zeros(&self, n: usize) -> R<DryBuf> {
        Ok(self.buffer(n, 8, false))
    }
    fn read_back(buf: &DryBuf) -> R<Vec<f32>> {
        buf.tally.read()?;
        Ok(vec![0.0; buf.len])
    }
    fn download(&self, buf: &DryBuf) -> R<Vec<f32>> {
        self.tally.read()?;
        Ok(vec![0.0; buf.len])
    }
    fn download_indices(&self, idx: &DryBuf) -> R<Vec<i64>> {
        self.tally.read()?;
        Ok(vec![0; idx.len])
    }
    fn synchronize(&self) -> R<()> {
        self.tally.read()
    }
    fn len(&self, buf: &DryBuf) -> usize {
        buf.len
    }
    fn index_len(&self, idx: &DryBuf) -> usize {
        idx.len
    }
    fn gemm(&self, g: &Gemm, _: &DryBuf, _: &DryBuf, _: &mut DryBuf) -> R<()> {
        self.tally.gemms.fetch_add(1, Ordering::Relaxed);
        let flops = 2 * g.m * g.n * g.k * g.batch;
        self.tally
            .gemm_flops
            .fetch_add(flops as u64, Ordering::Relaxed);
        Ok(())
    }
    /// Counts it: a counting device runs no kernel, but its buffers' lengths went
    /// through the same checks as a GPU's.
    unsafe fn launch(&self, _: Launch<'_, DryBuf, DryBuf>) -> R<()> {
        self.tally.launches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Collectives and messages between counting devices, with NCCL's memory and ordering: a
/// sum in place, a gather into new buffers on every member, a message received into a new
/// buffer on the receiver — nothing moved, since a counting device holds no elements — and
/// every operation on the rank's communication stream as NCCL's would be
/// ([`crate::streams`]): ranks that disagree on a collective's size, order their messages
/// differently or wait on each other in a cycle fail as they would on GPUs.
pub struct DryReplicas {
    streams: Arc<Streams>,
    rank: u32,
}

impl DryReplicas {
    /// Rank `rank`'s side of `streams`, every rank's communication stream.
    pub fn new(streams: Arc<Streams>, rank: u32) -> DryReplicas {
        DryReplicas { streams, rank }
    }
}

impl Replicas<Dry> for DryReplicas {
    fn reaches(&self, group: &[u32]) -> bool {
        !group.is_empty()
    }

    fn all_reduce(&self, dev: &Dry, group: &[u32], buf: &mut DryBuf) -> R<()> {
        self.streams.sum(self.rank, group, dev.len(buf))
    }

    /// The host waits for the members' lengths, as [`ralpc_runtime_min::dist::nccl`]'s
    /// gather of parts of any length does.
    fn all_gather(&self, dev: &Dry, group: &[u32], buf: &DryBuf) -> R<Option<Vec<DryBuf>>> {
        let lengths = self.streams.gather(self.rank, group, dev.len(buf))?;
        lengths
            .into_iter()
            .map(|n| dev.zeros(n))
            .collect::<R<Vec<_>>>()
            .map(Some)
    }

    fn settle(&self) -> R<()> {
        self.streams.wait(self.rank, true)
    }

    fn send(&self, dev: &Dry, to: u32, tag: u64, buf: &DryBuf) -> R<bool> {
        self.streams.send(self.rank, to, tag, dev.len(buf))?;
        Ok(true)
    }

    fn recv(&self, dev: &Dry, from: u32, tag: u64, n: usize) -> R<Option<DryBuf>> {
        self.streams.recv(self.rank, from, tag, n)?;
        dev.zeros(n).map(Some)
    }
}
