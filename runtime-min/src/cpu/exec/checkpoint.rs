//! Checkpoints: every rank hands in the pieces of the weights and momentum it holds, and
//! one of them assembles the whole tensors and gives them to the sink (which writes them).
//!
//! Ranks that are threads of one process hand their states to a shared collector; the last
//! to arrive assembles. Ranks in processes of their own send their states to rank 0, one
//! collective of the pair `{0, r}` each, in the order of `r`; rank 0 assembles and writes,
//! so a launcher's run writes the same file as the threaded run of the same plan.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ralpc_ir::ValueId;

use super::{Prepared, Rank, RankError};
use crate::cpu::region::{place_into, Slice};
use crate::cpu::tensor::{ints_to_words, words_to_ints};
use crate::dist::comm::Comm;

/// The training state between two steps: every weight and its momentum, whole, by name,
/// and the losses so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    /// Steps done.
    pub step: u32,
    /// Loss of each step done.
    pub losses: Vec<f64>,
    /// Weights.
    pub weights: BTreeMap<String, Vec<f32>>,
    /// SGD momentum buffers (absent for weights not yet updated).
    pub velocity: BTreeMap<String, Vec<f32>>,
}

/// Where checkpoints go: writes one, or says why it could not.
pub type CheckpointSink<'a> = dyn Fn(&Checkpoint) -> Result<(), SinkError> + Sync + 'a;

/// Why a [`CheckpointSink`] could not keep a checkpoint (a file that cannot be written, say).
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// A piece of a weight (or of its momentum) as one rank holds it.
type Piece = (ValueId, Slice, Vec<f32>);

/// One rank's state at a checkpoint.
#[derive(Debug, PartialEq)]
pub(super) struct RankState {
    losses: Vec<f64>,
    weights: Vec<Piece>,
    velocity: Vec<Piece>,
    /// Momentum a sharded optimizer's replicas share: this rank's elements, zeros
    /// elsewhere; the replicas' pieces of a slice add up to its momentum.
    velocity_shares: Vec<Piece>,
}

/// Collects every rank's state at a checkpoint and hands the assembled checkpoint on.
pub(super) enum Collector<'c> {
    /// Every rank a thread of this process: the last to report assembles.
    Threads {
        ranks: usize,
        /// Per step, the states reported so far, by rank.
        pending: Mutex<BTreeMap<u32, BTreeMap<u32, RankState>>>,
        on_checkpoint: &'c CheckpointSink<'c>,
    },
    /// One rank per process: rank 0 gathers the others' states and assembles; the other
    /// processes' sinks are never called.
    Processes {
        ranks: u32,
        on_checkpoint: &'c CheckpointSink<'c>,
    },
}

impl<'c> Collector<'c> {
    pub(super) fn threads(ranks: u32, on_checkpoint: &'c CheckpointSink<'c>) -> Collector<'c> {
        Collector::Threads {
            ranks: ranks as usize,
            pending: Mutex::default(),
            on_checkpoint,
        }
    }

    fn sink(&self) -> &'c CheckpointSink<'c> {
        match self {
            Collector::Threads { on_checkpoint, .. }
            | Collector::Processes { on_checkpoint, .. } => *on_checkpoint,
        }
    }

    /// Hands in `rank`'s `state` after `step` steps: every rank's states when this rank
    /// is the one to assemble them, else `None`.
    fn gather(
        &self,
        comm: &Comm,
        step: u32,
        state: RankState,
    ) -> Result<Option<Vec<RankState>>, RankError> {
        match self {
            Collector::Threads { ranks, pending, .. } => {
                let mut pending = pending.lock().unwrap_or_else(|p| p.into_inner());
                let states = pending.entry(step).or_default();
                states.insert(comm.rank(), state);
                // In rank order, whichever thread came last: the losses' sums (and so the
                // file) as a run of processes makes them.
                Ok((states.len() == *ranks).then(|| {
                    pending
                        .remove(&step)
                        .map(|s| s.into_values().collect())
                        .unwrap_or_default()
                }))
            }
            Collector::Processes { ranks, .. } => {
                let rank = comm.rank();
                if rank != 0 {
                    comm.exchange(&[0, rank], state.to_words())?;
                    return Ok(None);
                }
                let mut states = vec![state];
                for r in 1..*ranks {
                    let mut both = comm.exchange(&[0, r], Vec::new())?;
                    let theirs = both.pop().unwrap_or_default();
                    let state = RankState::from_words(&theirs).ok_or_else(|| {
                        RankError::Inconsistent(format!(
                            "rank {r} sent a malformed state for the checkpoint after step {step}"
                        ))
                    })?;
                    states.push(state);
                }
                Ok(Some(states))
            }
        }
    }
}

impl Rank<'_, '_> {
    /// Hands this rank's state after `step` steps to the collector; the rank that
    /// assembles the checkpoint writes it.
    pub(super) fn checkpoint(&self, step: u32) -> Result<(), RankError> {
        let Some(collector) = self.collector else {
            return Ok(());
        };
        self.all_weights_whole()?;
        let mut weights = Vec::new();
        let mut velocity = Vec::new();
        let mut velocity_shares = Vec::new();
        for (&w, (slice, t)) in &self.weights {
            let l = self.p.layers.iter().find(|l| l.weights.contains(&w));
            if !l.is_some_and(|l| self.trains(l, w)) {
                continue;
            }
            weights.push((w, slice.clone(), t.floats().unwrap_or_default().to_vec()));
            let Some(v) = self.velocity.get(&w) else {
                continue;
            };
            // A sharded weight's momentum is this rank's share of it (or, resumed and not
            // yet stepped, all of it).
            match self.owned_momentum.get(&w) {
                Some(mine) if v.len() == mine.len() => {
                    let mut share = vec![0.0f32; t.len()];
                    if let Some(to) = share.get_mut(mine.clone()) {
                        to.copy_from_slice(v);
                    }
                    velocity_shares.push((w, slice.clone(), share));
                }
                _ => velocity.push((w, slice.clone(), v.to_vec())),
            }
        }
        let state = RankState {
            losses: self.report.losses.clone(),
            weights,
            velocity,
            velocity_shares,
        };
        let Some(states) = collector.gather(&self.comm, step, state)? else {
            return Ok(());
        };
        let checkpoint = Checkpoint {
            step,
            losses: (0..step as usize)
                .map(|s| {
                    states
                        .iter()
                        .map(|r| r.losses.get(s).copied().unwrap_or(0.0))
                        .sum()
                })
                .collect(),
            weights: assemble(self.p, states.iter().flat_map(|r| &r.weights).collect()),
            velocity: assemble_momentum(self.p, &states),
        };
        (collector.sink())(&checkpoint).map_err(RankError::Checkpoint)
    }
}

/// Whole tensors, by name, from ranks' slices of them. A piece whose size does not match
/// its slice of the weight is left out (it came from a rank that disagrees with the plan).
pub(super) fn assemble(p: &Prepared<'_>, list: Vec<&Piece>) -> BTreeMap<String, Vec<f32>> {
    let g = p.exe.graph;
    let mut full: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for (w, slice, data) in list {
        let Some(whole) = p.exe.weights.tensors.get(w) else {
            continue;
        };
        let entry = full
            .entry(g.value(*w).name.clone())
            .or_insert_with(|| vec![0.0; whole.len()]);
        place_into(entry, data, slice, &whole.shape);
    }
    full
}

/// Every weight's momentum, whole, by name: the pieces of replicas that each hold all of
/// it, and sharded replicas' shares put together. Each share is its rank's elements with
/// zeros elsewhere; under hybrid sharding every group holds the same shares, so they are
/// laid over each other (each element taken from a share holding it), not added.
fn assemble_momentum(p: &Prepared<'_>, states: &[RankState]) -> BTreeMap<String, Vec<f32>> {
    let mut sums: BTreeMap<(ValueId, [i64; 5]), Piece> = BTreeMap::new();
    for (w, slice, data) in states.iter().flat_map(|r| &r.velocity_shares) {
        let sum = sums
            .entry((*w, slice_ints(slice)))
            .or_insert_with(|| (*w, slice.clone(), vec![0.0; data.len()]));
        if sum.2.len() == data.len() {
            for (to, &x) in sum.2.iter_mut().zip(data) {
                if x != 0.0 {
                    *to = x;
                }
            }
        }
    }
    let whole = states.iter().flat_map(|r| &r.velocity);
    assemble(p, whole.chain(sums.values()).collect())
}

/// The integers that say which piece a slice is: a kind and four numbers.
fn slice_ints(slice: &Slice) -> [i64; 5] {
    let n = |v: usize| v as i64;
    match *slice {
        Slice::Whole => [0, 0, 0, 0, 0],
        Slice::Axis(axis, (i, of)) => [1, n(axis), 1, i.into(), of.into()],
        Slice::Groups {
            axis,
            groups,
            piece: (i, of),
        } => [2, n(axis), n(groups), i.into(), of.into()],
        Slice::FirstSliceOnly => [3, 0, 0, 0, 0],
        Slice::Vocabulary((i, of)) => [4, 0, 0, i.into(), of.into()],
    }
}

fn slice_from(ints: &[i64]) -> Option<Slice> {
    let &[kind, axis, groups, i, of] = ints else {
        return None;
    };
    let piece = (u32::try_from(i).ok()?, u32::try_from(of).ok()?);
    let axis = usize::try_from(axis).ok()?;
    Some(match kind {
        0 => Slice::Whole,
        1 => Slice::Axis(axis, piece),
        2 => Slice::Groups {
            axis,
            groups: usize::try_from(groups).ok()?,
            piece,
        },
        3 => Slice::FirstSliceOnly,
        4 => Slice::Vocabulary(piece),
        _ => return None,
    })
}

/// Integers per piece in the header: value, kind (weight, momentum, a momentum share),
/// slice (5), length.
const PIECE_INTS: usize = 8;

impl RankState {
    /// The state as words for a collective: a header of integers (its length, the losses'
    /// bits, then per piece its value, whether it is momentum, its slice and its length),
    /// each integer two words, then every piece's values in order.
    fn to_words(&self) -> Vec<f32> {
        let pieces = self.weights.iter().map(|p| (0, p));
        let pieces = pieces.chain(self.velocity.iter().map(|p| (1, p)));
        let pieces = pieces.chain(self.velocity_shares.iter().map(|p| (2, p)));
        let mut header = vec![self.losses.len() as i64];
        header.extend(self.losses.iter().map(|l| l.to_bits() as i64));
        for (kind, (w, slice, data)) in pieces.clone() {
            header.extend([w.index() as i64, kind]);
            header.extend(slice_ints(slice));
            header.push(data.len() as i64);
        }
        let mut words = ints_to_words(&[header.len() as i64]);
        words.extend(ints_to_words(&header));
        for (_, (_, _, data)) in pieces {
            words.extend_from_slice(data);
        }
        words
    }

    /// The state [`to_words`](Self::to_words) wrote, or `None` for words it cannot have
    /// written.
    fn from_words(words: &[f32]) -> Option<RankState> {
        let count = usize::try_from(*words_to_ints(words.get(..2)?)?.first()?).ok()?;
        let header = words_to_ints(words.get(2..2 + count.checked_mul(2)?)?)?;
        let mut data = &words[2 + 2 * count..];
        let (&losses, rest) = header.split_first()?;
        let losses = usize::try_from(losses).ok()?;
        let (bits, pieces) = (rest.get(..losses)?, rest.get(losses..)?);
        let mut state = RankState {
            losses: bits.iter().map(|&b| f64::from_bits(b as u64)).collect(),
            weights: Vec::new(),
            velocity: Vec::new(),
            velocity_shares: Vec::new(),
        };
        if pieces.len() % PIECE_INTS != 0 {
            return None;
        }
        for piece in pieces.chunks_exact(PIECE_INTS) {
            let value = ValueId::from_index(u32::try_from(piece[0]).ok()? as usize);
            let slice = slice_from(&piece[2..7])?;
            let len = usize::try_from(piece[7]).ok()?;
            let (values, rest) = (data.get(..len)?, data.get(len..)?);
            data = rest;
            let into = match piece[1] {
                0 => &mut state.weights,
                1 => &mut state.velocity,
                2 => &mut state.velocity_shares,
                _ => return None,
            };
            into.push((value, slice, values.to_vec()));
        }
        data.is_empty().then_some(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> RankState {
        RankState {
            losses: vec![2.5, -0.125, f64::MIN_POSITIVE],
            weights: vec![
                (ValueId::from_index(3), Slice::Whole, vec![1.0, 2.0]),
                (ValueId::from_index(7), Slice::Axis(1, (1, 4)), vec![3.0]),
                (
                    ValueId::from_index(9),
                    Slice::Groups {
                        axis: 0,
                        groups: 3,
                        piece: (0, 2),
                    },
                    vec![],
                ),
            ],
            velocity: vec![
                (
                    ValueId::from_index(3),
                    Slice::FirstSliceOnly,
                    vec![0.5, 0.25],
                ),
                (
                    ValueId::from_index(8),
                    Slice::Vocabulary((2, 3)),
                    vec![f32::NAN; 3],
                ),
            ],
            velocity_shares: vec![(ValueId::from_index(5), Slice::Whole, vec![0.0, 4.0, 0.0])],
        }
    }

    #[test]
    fn a_state_crosses_as_words_and_back() {
        let s = state();
        let back = RankState::from_words(&s.to_words()).expect("decodes");
        assert_eq!(back.losses, s.losses);
        assert_eq!(back.weights, s.weights);
        // NaN != NaN: compare the bits.
        let bits = |p: &[Piece]| -> Vec<(ValueId, Slice, Vec<u32>)> {
            p.iter()
                .map(|(w, s, d)| (*w, s.clone(), d.iter().map(|v| v.to_bits()).collect()))
                .collect()
        };
        assert_eq!(bits(&back.velocity), bits(&s.velocity));
    }

    #[test]
    fn words_it_cannot_have_written_are_refused() {
        let words = state().to_words();
        for cut in [0, 1, 2, 5, words.len() - 1] {
            assert_eq!(RankState::from_words(&words[..cut]), None, "cut at {cut}");
        }
        let mut longer = words.clone();
        longer.push(0.0);
        assert_eq!(RankState::from_words(&longer), None);
        // A piece of a kind that does not exist.
        let mut bad = words;
        // Words 0-1 are the header's length; the header holds the losses' count, the three
        // losses, the first piece's value and momentum flag, then its slice's kind.
        let kind_at = 2 + 2 * (1 + 3 + 2);
        bad[kind_at] = f32::from_bits(9);
        assert_eq!(RankState::from_words(&bad), None);
    }
}
