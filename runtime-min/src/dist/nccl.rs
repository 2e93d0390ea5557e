//! A plan's collectives and messages with NCCL, one process per GPU: rank 0 makes the NCCL
//! unique id and the TCP rendezvous ([`crate::dist::rendezvous`]) hands it to every rank.
//! Ranks sharing one GPU cannot use NCCL (it refuses duplicate devices): ranks as threads
//! use the same-device hub ([`crate::dist::same_device`]), processes the plan interpreter's
//! communicator.
//!
//! How the operations are laid out, which the counting devices' model of NCCL
//! (`ralpc-cuda-host`'s `streams`) checks every plan family against:
//! * **Collectives** run on the GPU's communication stream, over the world's communicator
//!   or one split from it for each smaller group the plan names (`ncclCommSplit`, made
//!   once as the rank starts: every rank splits in the same order, disjoint groups and
//!   pairs in one split).
//! * **Messages** run on a communicator and a stream of their own per direction of each
//!   pair of ranks that exchange any, as PyTorch keeps one per pair: NCCL pairs a pair's
//!   sends and receives in the order they are issued, with no tags, and one stream for
//!   both directions would let a stage sending its next activation wait on its peer
//!   sending a gradient, and the peer on it. The interpreter receives a peer's messages in
//!   the order the peer sends them.
//!
//! The host never waits for NCCL except where it reads what NCCL made (a gather's
//! lengths) and where the optimizer step settles the sums; those waits poll, so that a rank
//! that stopped answering turns into an error after the timeout instead of a hang (dropping
//! the communicators then aborts them, which frees the GPU).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result, sys, Id};

use super::Replicas;
use crate::cuda::backend::R;
use crate::cuda::error::DeviceError;
use crate::cuda::gpu::Gpu;
use crate::dist::{rendezvous, Placement};

/// `NCCL_SPLIT_NOCOLOR` (nccl.h): a rank that takes no part in the communicator split off.
const NO_COLOR: i32 = -1;

/// `NCCL_VERSION_CODE` of NCCL 2.18, the first with `ncclCommSplit`.
const SPLIT_SINCE: i32 = 21800;

/// A communicator this process owns; aborted (which never waits on the other ranks) when
/// dropped.
struct Communicator(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any one thread at a time; this process's
// rank uses it from the thread that owns it.
unsafe impl Send for Communicator {}

impl Drop for Communicator {
    fn drop(&mut self) {
        // SAFETY: a communicator this process made and nothing uses any more. A failure to
        // abort leaves nothing to do at teardown.
        let _ = unsafe { result::comm_abort(self.0) };
    }
}

/// One direction of a pair's messages, on this rank.
struct Lane {
    comm: Communicator,
    stream: Arc<CudaStream>,
    /// The other rank's rank in `comm` (a pair's ranks are ordered by their world rank).
    peer: i32,
}

/// This process's member of the NCCL world.
pub struct Nccl {
    world: Communicator,
    /// The communicators split off for the plan's smaller groups this rank is in.
    groups: BTreeMap<Vec<u32>, Communicator>,
    /// Per peer, the lane of the messages sent to it.
    to: BTreeMap<u32, Lane>,
    /// Per peer, the lane of the messages received from it.
    from: BTreeMap<u32, Lane>,
    compute: Arc<CudaStream>,
    /// The collectives' stream.
    collectives: Arc<CudaStream>,
    rank: u32,
    /// Ranks in the world.
    size: u32,
    /// How long a collective may take before this rank gives up on the others.
    timeout: Duration,
}

fn fail<E: std::fmt::Debug>(what: &'static str) -> impl FnOnce(E) -> DeviceError {
    DeviceError::debug(format!("NCCL: {what}"))
}

/// What a plan asks of NCCL: the groups its collectives run over and the pairs of ranks
/// that pass messages, in the plan's order (every rank derives the same from the plan).
#[derive(Clone, Debug, Default)]
pub struct Topology {
    /// Groups of ranks (each sorted) whose collectives NCCL runs.
    pub groups: Vec<Vec<u32>>,
    /// (sender, receiver) of every message.
    pub messages: Vec<(u32, u32)>,
}

impl Nccl {
    /// Joins the launcher's processes on `gpu`, with a communicator for each group and each
    /// direction of a pair in `topology`. The caller checks that NCCL loads
    /// ([`crate::cuda::libs`]).
    ///
    /// # Errors
    /// The rendezvous, NCCL's initialization or a split failed.
    pub fn join(
        gpu: &Gpu,
        placement: &Placement,
        timeout: Duration,
        topology: &Topology,
    ) -> R<Nccl> {
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
        let id = sys::ncclUniqueId {
            internal: bytes.map(|b| b as std::ffi::c_char),
        };
        let (rank, size) = (placement.rank, placement.world);
        let mut world = std::mem::MaybeUninit::uninit();
        // SAFETY: every rank of the world calls this once with the same id.
        let world = unsafe {
            result::comm_init_rank(world.as_mut_ptr(), size as i32, id, rank as i32)
                .map_err(fail("cannot join the world"))?;
            Communicator(world.assume_init())
        };
        let mut nccl = Nccl {
            world,
            groups: BTreeMap::new(),
            to: BTreeMap::new(),
            from: BTreeMap::new(),
            compute: gpu.stream().clone(),
            collectives: gpu.comm_stream().clone(),
            rank,
            size,
            timeout,
        };
        let mut groups: Vec<Vec<u32>> = topology
            .groups
            .iter()
            .map(|g| {
                let mut g = g.clone();
                g.sort_unstable();
                g.dedup();
                g
            })
            .filter(|g| g.len() > 1 && g.len() < size as usize)
            .collect();
        groups.sort();
        groups.dedup();
        let mut pairs: Vec<(u32, u32)> = topology
            .messages
            .iter()
            .copied()
            .filter(|&(a, b)| a != b && a < size && b < size)
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        // Every communicator's members: the groups', then each direction's pair.
        let sets: Vec<Vec<u32>> = groups
            .iter()
            .cloned()
            .chain(pairs.iter().map(|&(a, b)| vec![a.min(b), a.max(b)]))
            .collect();
        // ncclCommSplit came with NCCL 2.18: an older NCCL sums over the world alone, and
        // the rest goes through the interpreter's communicator.
        let version = result::get_nccl_version().map_err(fail("cannot read its version"))?;
        let rounds = match version >= SPLIT_SINCE {
            true => disjoint_rounds(&sets),
            false => Vec::new(),
        };
        for round in rounds {
            let mine = round.iter().copied().find(|&i| sets[i].contains(&rank));
            let Some(comm) = nccl.split(mine)? else {
                continue;
            };
            let Some(i) = mine else {
                continue;
            };
            if let Some(group) = groups.get(i) {
                nccl.groups.insert(group.clone(), comm);
                continue;
            }
            let Some(&(sender, receiver)) = pairs.get(i - groups.len()) else {
                continue;
            };
            let stream = gpu
                .stream()
                .context()
                .new_stream()
                .map_err(fail("cannot create a stream"))?;
            let (peer, lanes) = match rank == sender {
                true => (receiver, &mut nccl.to),
                false => (sender, &mut nccl.from),
            };
            let lane = Lane {
                comm,
                stream,
                peer: i32::from(peer > rank),
            };
            lanes.insert(peer, lane);
        }
        Ok(nccl)
    }

    /// One split of the world (every rank calls it, in the same order): this rank joins
    /// the communicator of set `mine` (a round's sets are disjoint, so each is one colour)
    /// or, `None`, none.
    fn split(&self, mine: Option<usize>) -> R<Option<Communicator>> {
        let color = match mine {
            Some(i) => i32::try_from(i).map_err(|_| {
                DeviceError::Inconsistent("more communicators than NCCL has colours".into())
            })?,
            None => NO_COLOR,
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: the world's communicator is live; a null config inherits the world's.
        unsafe {
            sys::ncclCommSplit(
                self.world.0,
                color,
                self.rank as i32,
                &mut comm,
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(fail("cannot split a communicator off the world"))?;
        Ok((mine.is_some() && !comm.is_null()).then_some(Communicator(comm)))
    }

    /// The communicator of the collectives over `group`.
    fn communicator(&self, group: &[u32]) -> R<&Communicator> {
        if group.iter().copied().eq(0..self.size) {
            return Ok(&self.world);
        }
        self.groups.get(group).ok_or_else(|| {
            DeviceError::Inconsistent(format!(
                "NCCL was asked for a collective over ranks {group:?}, which the plan does not \
                 name"
            ))
        })
    }

    /// Waits for the work queued on `stream` so far, polling so that a rank that stopped
    /// responding turns into an error after the timeout instead of a hang.
    fn wait(&self, stream: &CudaStream, what: &str) -> R<()> {
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

    /// Every member's length, in group order, gathered on the collectives' stream.
    fn lengths(&self, comm: &Communicator, len: usize) -> R<Vec<u64>> {
        let stream = &self.collectives;
        let n = self.group_size(comm)?;
        let mine = stream
            .clone_htod(&[len as u64])
            .map_err(fail("cannot upload a length"))?;
        let mut all = stream
            .alloc_zeros::<u64>(n)
            .map_err(fail("cannot allocate the lengths"))?;
        {
            let (src, _read) = mine.device_ptr(stream);
            let (dst, _write) = all.device_ptr_mut(stream);
            // SAFETY: one u64 from each of the group's `n` members into `n` of them.
            unsafe {
                result::all_gather(
                    src as *const c_void,
                    dst as *mut c_void,
                    1,
                    sys::ncclDataType_t::ncclUint64,
                    comm.0,
                    stream.cu_stream() as _,
                )
            }
            .map_err(fail("the gather of lengths failed"))?;
        }
        self.wait(stream, "the gather of lengths (NCCL)")?;
        stream
            .clone_dtoh(&all)
            .map_err(fail("cannot read the lengths back"))
    }

    fn group_size(&self, comm: &Communicator) -> R<usize> {
        // SAFETY: a live communicator.
        let n = unsafe { result::comm_count(comm.0) }.map_err(fail("cannot count ranks"))?;
        usize::try_from(n).map_err(|_| DeviceError::Inconsistent("NCCL counts no ranks".into()))
    }
}

/// `sets` (of ranks) in rounds of pairwise-disjoint ones, each set in the first round it
/// fits, in order: one split of the world makes a round's communicators at once (the
/// tensor-parallel groups of every stage together, a pipeline's forward pairs together).
fn disjoint_rounds(sets: &[Vec<u32>]) -> Vec<Vec<usize>> {
    let mut rounds: Vec<(Vec<usize>, std::collections::BTreeSet<u32>)> = Vec::new();
    for (i, set) in sets.iter().enumerate() {
        match rounds
            .iter_mut()
            .find(|(_, used)| set.iter().all(|r| !used.contains(r)))
        {
            Some((members, used)) => {
                members.push(i);
                used.extend(set);
            }
            None => rounds.push((vec![i], set.iter().copied().collect())),
        }
    }
    rounds.into_iter().map(|(members, _)| members).collect()
}

impl Replicas<Gpu> for Nccl {
    /// The world and the plan's groups (those it was joined with).
    fn reaches(&self, group: &[u32]) -> bool {
        group.iter().copied().eq(0..self.size) || self.groups.contains_key(group)
    }

    /// On the collectives' stream, after the compute stream's work so far (which made
    /// `buf`); the compute stream's later work waits for it, the host does not.
    fn all_reduce(&self, _: &Gpu, group: &[u32], buf: &mut CudaSlice<f32>) -> R<()> {
        let comm = self.communicator(group)?;
        let stream = &self.collectives;
        stream
            .join(&self.compute)
            .map_err(fail("cannot order the streams"))?;
        let n = buf.len();
        {
            let (ptr, _write) = buf.device_ptr_mut(stream);
            // SAFETY: `n` floats summed in place over the group's communicator.
            unsafe {
                result::all_reduce(
                    ptr as *const c_void,
                    ptr as *mut c_void,
                    n,
                    sys::ncclDataType_t::ncclFloat32,
                    sys::ncclRedOp_t::ncclSum,
                    comm.0,
                    stream.cu_stream() as _,
                )
            }
            .map_err(fail("all-reduce failed"))?;
        }
        self.compute
            .join(stream)
            .map_err(fail("cannot order the streams"))
    }

    /// NCCL gathers equal parts: the members' lengths are gathered first (the host waits
    /// for them), then every part padded to the longest, then cut out of the padding.
    fn all_gather(
        &self,
        _: &Gpu,
        group: &[u32],
        buf: &CudaSlice<f32>,
    ) -> R<Option<Vec<CudaSlice<f32>>>> {
        let comm = self.communicator(group)?;
        let stream = &self.collectives;
        stream
            .join(&self.compute)
            .map_err(fail("cannot order the streams"))?;
        let lengths = self.lengths(comm, buf.len())?;
        let lengths: Vec<usize> = lengths.into_iter().map(|n| n as usize).collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let mut padded = stream
            .alloc_zeros::<f32>(longest)
            .map_err(fail("cannot allocate a part"))?;
        stream
            .memcpy_dtod(buf, &mut padded.slice_mut(0..buf.len()))
            .map_err(fail("cannot copy a part"))?;
        let mut all = stream
            .alloc_zeros::<f32>(longest * lengths.len())
            .map_err(fail("cannot allocate the gather"))?;
        {
            let (src, _read) = padded.device_ptr(stream);
            let (dst, _write) = all.device_ptr_mut(stream);
            // SAFETY: `longest` floats from each member into as many per member.
            unsafe {
                result::all_gather(
                    src as *const c_void,
                    dst as *mut c_void,
                    longest,
                    sys::ncclDataType_t::ncclFloat32,
                    comm.0,
                    stream.cu_stream() as _,
                )
            }
            .map_err(fail("all-gather failed"))?;
        }
        let mut parts = Vec::with_capacity(lengths.len());
        for (i, &n) in lengths.iter().enumerate() {
            let mut part = stream
                .alloc_zeros::<f32>(n)
                .map_err(fail("cannot allocate a part"))?;
            stream
                .memcpy_dtod(&all.slice(i * longest..i * longest + n), &mut part)
                .map_err(fail("cannot copy a part"))?;
            parts.push(part);
        }
        self.compute
            .join(stream)
            .map_err(fail("cannot order the streams"))?;
        Ok(Some(parts))
    }

    /// Waits for every collective and message so far.
    fn settle(&self) -> R<()> {
        self.wait(&self.collectives, "the collectives (NCCL)")?;
        for (peer, lane) in self.to.iter().chain(&self.from) {
            self.wait(
                &lane.stream,
                &format!("the messages with rank {peer} (NCCL)"),
            )?;
        }
        self.compute
            .join(&self.collectives)
            .map_err(fail("cannot order the streams"))
    }

    /// On the lane to `to`, after the compute stream's work so far (which made `buf`);
    /// neither the compute stream nor the host waits for it (the buffer outlives it).
    fn send(&self, _: &Gpu, to: u32, _tag: u64, buf: &CudaSlice<f32>) -> R<bool> {
        let Some(lane) = self.to.get(&to) else {
            return Ok(false);
        };
        lane.stream
            .join(&self.compute)
            .map_err(fail("cannot order the streams"))?;
        let (ptr, _read) = buf.device_ptr(&lane.stream);
        // SAFETY: `buf`'s floats to the pair's other rank, which receives as many.
        unsafe {
            result::send(
                ptr as *const c_void,
                buf.len(),
                sys::ncclDataType_t::ncclFloat32,
                lane.peer,
                lane.comm.0,
                lane.stream.cu_stream() as _,
            )
        }
        .map_err(fail("send failed"))?;
        Ok(true)
    }

    /// Posted on the lane from `from` into a new buffer, which the compute stream's reads
    /// wait for.
    fn recv(&self, _: &Gpu, from: u32, _tag: u64, n: usize) -> R<Option<CudaSlice<f32>>> {
        let Some(lane) = self.from.get(&from) else {
            return Ok(None);
        };
        let mut buf = lane
            .stream
            .alloc_zeros::<f32>(n)
            .map_err(fail("cannot allocate a message"))?;
        {
            let (ptr, _write) = buf.device_ptr_mut(&lane.stream);
            // SAFETY: `n` floats from the pair's other rank, which sends as many.
            unsafe {
                result::recv(
                    ptr as *mut c_void,
                    n,
                    sys::ncclDataType_t::ncclFloat32,
                    lane.peer,
                    lane.comm.0,
                    lane.stream.cu_stream() as _,
                )
            }
            .map_err(fail("receive failed"))?;
        }
        Ok(Some(buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disjoint_sets_share_a_split() {
        // t2 p2 on 4 ranks: tensor groups {0,1} {2,3}, then both directions of the pairs
        // 0-2 and 1-3.
        let sets = [
            vec![0, 1],
            vec![2, 3],
            vec![0, 2],
            vec![1, 3],
            vec![0, 2],
            vec![1, 3],
        ];
        assert_eq!(disjoint_rounds(&sets), [vec![0, 1], vec![2, 3], vec![4, 5]]);
        assert_eq!(disjoint_rounds(&[]), Vec::<Vec<usize>>::new());
    }
}
