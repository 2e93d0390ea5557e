//! What the ranks of one process share: the mailboxes of point-to-point messages, the
//! collectives' slots, the first failure and each rank's activity. Local ranks write them
//! directly; frames from other processes' ranks ([`super::tcp`]) land in them, so both
//! kinds of peer wait, fail and time out alike.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};

/// What travels between ranks.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// A point-to-point message.
    Message {
        /// Its tag.
        tag: u64,
        /// Its values.
        data: Vec<f32>,
    },
    /// A contribution to collective `seq` of the group `members` (sorted).
    Collective {
        /// The group.
        members: Vec<u32>,
        /// Which of the group's collectives.
        seq: u64,
        /// The contribution.
        data: Vec<f32>,
    },
    /// The sender finished its program: its connection closing is no failure.
    Done,
    /// The sender's world failed, for this reason.
    Abort(String),
}

/// One collective in progress: each member's contribution, and how many have taken the
/// result.
#[derive(Default)]
pub(super) struct Slot {
    /// Shared by the members that take them, so a collective holds each once.
    pub(super) contributions: BTreeMap<u32, std::sync::Arc<Vec<f32>>>,
    pub(super) taken: usize,
}

#[derive(Default)]
pub(super) struct State {
    /// Messages by (from, to, tag).
    pub(super) mailboxes: BTreeMap<(u32, u32, u64), std::collections::VecDeque<Vec<f32>>>,
    /// Collectives by (sorted group, sequence number within the group).
    pub(super) slots: BTreeMap<(Vec<u32>, u64), Slot>,
    /// Set by the first failure.
    pub(super) failed: Option<String>,
    /// Per rank: the instruction it is at, whether it is waiting on the others, whether it
    /// finished. A rank neither waiting nor finished when another times out is the one
    /// that stopped responding.
    pub(super) activity: BTreeMap<u32, Activity>,
    /// Ranks in other processes that said they finished: their connection closing is
    /// then no failure.
    pub(super) peers_done: std::collections::BTreeSet<u32>,
}

/// What a rank is doing, as far as the others can tell.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Activity {
    pub(super) instruction: usize,
    pub(super) waiting: bool,
    pub(super) done: bool,
}

#[derive(Default)]
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) changed: Condvar,
}

impl Shared {
    /// Applies what rank `from` (in another process) sent.
    pub(super) fn deliver(&self, from: u32, me: u32, frame: Frame) {
        let mut state = lock(self);
        match frame {
            Frame::Message { tag, data } => state
                .mailboxes
                .entry((from, me, tag))
                .or_default()
                .push_back(data),
            Frame::Collective { members, seq, data } => {
                state
                    .slots
                    .entry((members, seq))
                    .or_default()
                    .contributions
                    .insert(from, data.into());
            }
            Frame::Done => {
                state.peers_done.insert(from);
            }
            Frame::Abort(why) => {
                state.failed.get_or_insert(why);
            }
        }
        self.changed.notify_all();
    }

    /// Rank `from`'s connection closed or broke.
    pub(super) fn lost(&self, from: u32, why: &str) {
        let mut state = lock(self);
        if !state.peers_done.contains(&from) {
            state.failed.get_or_insert_with(|| {
                format!("rank {from}'s process exited or lost its connection ({why})")
            });
        }
        self.changed.notify_all();
    }
}

pub(super) fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves consistent maps (every update is one insert or
    // remove): keep going, the failure is reported through `failed`.
    shared
        .state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
