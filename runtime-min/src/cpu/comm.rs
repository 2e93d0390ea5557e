//! Shared-memory communication between the ranks of one process (one thread per rank):
//! point-to-point messages and the collectives a plan uses, with NCCL's semantics.
//!
//! Reductions add contributions in rank order, whatever order ranks arrive in, so a run
//! is bit-reproducible. Every wait is bounded: when a rank fails ([`Comm::abort`], or a
//! [`AbortOnPanic`] guard dropped by a panic) or a wait exceeds the timeout, every waiting
//! rank returns an error naming the cause instead of hanging.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a communication did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// Another rank failed first.
    #[error("aborted: {0}")]
    Aborted(String),
    /// The peers did not arrive in time.
    #[error("rank {rank} waited more than {seconds} s for {what}")]
    Timeout {
        /// The waiting rank.
        rank: u32,
        /// The limit.
        seconds: u64,
        /// What it waited for.
        what: String,
    },
}

/// One collective in progress: each member's contribution, and how many have taken the
/// result.
#[derive(Default)]
struct Slot {
    contributions: BTreeMap<u32, Vec<f32>>,
    taken: usize,
}

#[derive(Default)]
struct State {
    /// Messages by (from, to, tag).
    mailboxes: BTreeMap<(u32, u32, u64), std::collections::VecDeque<Vec<f32>>>,
    /// Collectives by (sorted group, sequence number within the group).
    slots: BTreeMap<(Vec<u32>, u64), Slot>,
    /// Set by the first failure.
    failed: Option<String>,
    /// Per rank: the instruction it is at, whether it is waiting on the others, whether it
    /// finished. A rank neither waiting nor finished when another times out is the one
    /// that stopped responding.
    activity: BTreeMap<u32, Activity>,
}

/// What a rank is doing, as far as the others can tell.
#[derive(Clone, Copy, Debug, Default)]
struct Activity {
    instruction: usize,
    waiting: bool,
    done: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// The ranks of one process.
#[derive(Clone)]
pub struct World {
    shared: Arc<Shared>,
    ranks: u32,
    timeout: Duration,
}

impl World {
    /// A world of `ranks` ranks whose waits give up after `timeout`.
    pub fn new(ranks: u32, timeout: Duration) -> World {
        World {
            shared: Arc::default(),
            ranks,
            timeout,
        }
    }

    /// Rank `rank`'s endpoint.
    pub fn comm(&self, rank: u32) -> Comm {
        assert!(rank < self.ranks, "rank {rank} of {}", self.ranks);
        Comm {
            world: self.clone(),
            rank,
            sequences: Mutex::default(),
        }
    }
}

/// One rank's endpoint.
pub struct Comm {
    world: World,
    rank: u32,
    /// Collectives entered so far per group.
    sequences: Mutex<BTreeMap<Vec<u32>, u64>>,
}

/// Aborts the world when dropped during a panic, so that a failing rank never leaves the
/// others waiting.
pub struct AbortOnPanic<'a>(pub &'a Comm);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort(&format!("rank {} panicked", self.0.rank));
        }
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves consistent maps (every update is one insert or
    // remove): keep going, the failure is reported through `failed`.
    shared
        .state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Comm {
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Records that this rank starts `instruction` of its program.
    pub fn at(&self, instruction: usize) {
        let mut state = lock(&self.world.shared);
        let a = state.activity.entry(self.rank).or_default();
        a.instruction = instruction;
        a.waiting = false;
    }

    /// Records that this rank finished its program.
    pub fn finish(&self) {
        let shared = &self.world.shared;
        let mut state = lock(shared);
        state.activity.entry(self.rank).or_default().done = true;
        shared.changed.notify_all();
    }

    /// Whether the world has failed.
    pub fn failed(&self) -> bool {
        lock(&self.world.shared).failed.is_some()
    }

    /// Marks the world failed; every waiting and later call returns [`CommError::Aborted`].
    pub fn abort(&self, why: &str) {
        let shared = &self.world.shared;
        let mut state = lock(shared);
        state.failed.get_or_insert_with(|| why.to_owned());
        shared.changed.notify_all();
    }

    /// Waits until `ready` yields a value, the world fails, or the timeout passes.
    fn wait<T>(
        &self,
        what: impl Fn(&State) -> String,
        mut ready: impl FnMut(&mut State) -> Option<T>,
    ) -> Result<T, CommError> {
        let shared = &self.world.shared;
        let deadline = Instant::now() + self.world.timeout;
        let mut state = lock(shared);
        state.activity.entry(self.rank).or_default().waiting = true;
        loop {
            if let Some(why) = &state.failed {
                return Err(CommError::Aborted(why.clone()));
            }
            if let Some(value) = ready(&mut state) {
                state.activity.entry(self.rank).or_default().waiting = false;
                shared.changed.notify_all();
                return Ok(value);
            }
            let now = Instant::now();
            if now >= deadline {
                let stopped: Vec<String> = (0..self.world.ranks)
                    .filter_map(|r| {
                        let a = state.activity.get(&r).copied().unwrap_or_default();
                        (!a.waiting && !a.done)
                            .then(|| format!("rank {r} at instruction {}", a.instruction))
                    })
                    .collect();
                let mut what = what(&state);
                if !stopped.is_empty() {
                    what += &format!("; stopped responding: {}", stopped.join(", "));
                }
                let error = CommError::Timeout {
                    rank: self.rank,
                    seconds: self.world.timeout.as_secs(),
                    what,
                };
                state.failed = Some(error.to_string());
                shared.changed.notify_all();
                return Err(error);
            }
            state = shared
                .changed
                .wait_timeout(state, deadline - now)
                .map_or_else(|p| p.into_inner().0, |(s, _)| s);
        }
    }

    /// Sends `data` to `to` under `tag` (buffered: returns at once).
    pub fn send(&self, to: u32, tag: u64, data: Vec<f32>) -> Result<(), CommError> {
        let shared = &self.world.shared;
        let mut state = lock(shared);
        if let Some(why) = &state.failed {
            return Err(CommError::Aborted(why.clone()));
        }
        state
            .mailboxes
            .entry((self.rank, to, tag))
            .or_default()
            .push_back(data);
        shared.changed.notify_all();
        Ok(())
    }

    /// Receives the message `from` sent under `tag`.
    pub fn recv(&self, from: u32, tag: u64) -> Result<Vec<f32>, CommError> {
        let key = (from, self.rank, tag);
        self.wait(
            |_| format!("the message from rank {from} with tag {tag}"),
            |state| {
                let queue = state.mailboxes.get_mut(&key)?;
                let data = queue.pop_front();
                if queue.is_empty() {
                    state.mailboxes.remove(&key);
                }
                data
            },
        )
    }

    /// Enters the next collective of `group` with `data`; returns every member's
    /// contribution in rank order once all have entered.
    /// Every member's `data`, in rank order: the general collective the others are built on
    /// (members may contribute different sizes).
    pub fn exchange(&self, group: &[u32], data: Vec<f32>) -> Result<Vec<Vec<f32>>, CommError> {
        let mut members = group.to_vec();
        members.sort_unstable();
        let seq = {
            let mut sequences = self
                .sequences
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let next = sequences.entry(members.clone()).or_default();
            *next += 1;
            *next - 1
        };
        let key = (members.clone(), seq);
        {
            let mut state = lock(&self.world.shared);
            state
                .slots
                .entry(key.clone())
                .or_default()
                .contributions
                .insert(self.rank, data);
            self.world.shared.changed.notify_all();
        }
        let n = members.len();
        self.wait(
            |state: &State| {
                let missing: Vec<u32> = members
                    .iter()
                    .copied()
                    .filter(|r| {
                        !state
                            .slots
                            .get(&key)
                            .is_some_and(|s| s.contributions.contains_key(r))
                    })
                    .collect();
                format!(
                    "collective #{seq} of group {members:?}, which ranks {missing:?} never joined"
                )
            },
            |state| {
                let slot = state.slots.get_mut(&key)?;
                if slot.contributions.len() < n {
                    return None;
                }
                let all: Vec<Vec<f32>> = slot.contributions.values().cloned().collect();
                slot.taken += 1;
                if slot.taken == n {
                    state.slots.remove(&key);
                }
                Some(all)
            },
        )
    }

    /// Sums `data` over `group` in place (contributions added in rank order).
    pub fn all_reduce(&self, group: &[u32], data: &mut [f32]) -> Result<(), CommError> {
        let all = self.exchange(group, data.to_vec())?;
        data.iter_mut().for_each(|v| *v = 0.0);
        for part in &all {
            data.iter_mut().zip(part).for_each(|(v, p)| *v += p);
        }
        Ok(())
    }

    /// Concatenates every member's `data` in rank order.
    pub fn all_gather(&self, group: &[u32], data: &[f32]) -> Result<Vec<f32>, CommError> {
        Ok(self.exchange(group, data.to_vec())?.concat())
    }

    /// Sums `data` over `group` and returns this rank's equal share of the sum (members
    /// in rank order own consecutive shares).
    pub fn reduce_scatter(&self, group: &[u32], data: &[f32]) -> Result<Vec<f32>, CommError> {
        let mut members = group.to_vec();
        members.sort_unstable();
        let index = members.iter().position(|&r| r == self.rank).unwrap_or(0);
        let share = data.len() / members.len().max(1);
        let all = self.exchange(group, data.to_vec())?;
        let mut out = vec![0.0; share];
        for part in &all {
            out.iter_mut()
                .zip(&part[index * share..(index + 1) * share])
                .for_each(|(v, p)| *v += p);
        }
        Ok(out)
    }

    /// Sends share `j` of `data` to the `j`-th member and returns what each member sent
    /// this rank, concatenated in rank order.
    pub fn all_to_all(&self, group: &[u32], data: &[f32]) -> Result<Vec<f32>, CommError> {
        let mut members = group.to_vec();
        members.sort_unstable();
        let index = members.iter().position(|&r| r == self.rank).unwrap_or(0);
        let share = data.len() / members.len().max(1);
        let all = self.exchange(group, data.to_vec())?;
        Ok(all
            .iter()
            .flat_map(|part| part[index * share..(index + 1) * share].iter().copied())
            .collect())
    }
}
