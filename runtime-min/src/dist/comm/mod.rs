//! Communication between ranks: point-to-point messages and the collectives a plan uses,
//! with NCCL's semantics. The ranks of one process (one thread each) share memory; ranks
//! in other processes are reached over TCP (`tcp`), whose frames land in the same
//! mailboxes and collective slots, so both worlds wait, fail and time out alike.
//!
//! Reductions add contributions in rank order, whatever order ranks arrive in, so a run
//! is bit-reproducible. Every wait is bounded: when a rank fails ([`Comm::abort`], or a
//! [`AbortOnPanic`] guard dropped by a panic) or a wait exceeds the timeout, every waiting
//! rank returns an error naming the cause instead of hanging.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::dist::Placement;
use mailbox::{lock, Frame, Shared, State};
use tcp::Net;

mod mailbox;
mod tcp;

/// Why a communication did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// Another rank failed first.
    #[error("aborted: {0}")]
    Aborted(String),
    /// The connection to another process's rank broke while sending to it (that rank is
    /// gone), or there is none.
    #[error("rank {rank}'s connection to rank {peer} {why}")]
    Disconnected {
        /// The sending rank.
        rank: u32,
        /// The rank it sent to.
        peer: u32,
        /// What the operating system said.
        why: String,
    },
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

/// The ranks of a run, as seen from one process: all of them as threads, or one of them
/// with the others in other processes.
#[derive(Clone)]
pub struct World {
    shared: Arc<Shared>,
    ranks: u32,
    timeout: Duration,
    /// The connections to the other processes' ranks (absent when every rank is local).
    net: Option<Arc<Net>>,
}

impl World {
    /// A world of `ranks` ranks, all threads of this process, whose waits give up after
    /// `timeout`.
    pub fn new(ranks: u32, timeout: Duration) -> World {
        World {
            shared: Arc::default(),
            ranks,
            timeout,
            net: None,
        }
    }

    /// This process's rank in a world of one process per rank: meets the others through
    /// the rendezvous on the master address, then connects to each over TCP.
    ///
    /// # Errors
    /// The rendezvous or a connection failed within `timeout`.
    pub fn connect(
        placement: &Placement,
        timeout: Duration,
    ) -> Result<World, crate::dist::DistError> {
        let shared = Arc::new(Shared::default());
        let net = Net::connect(placement, timeout, shared.clone())?;
        Ok(World {
            shared,
            ranks: placement.world,
            timeout,
            net: Some(Arc::new(net)),
        })
    }

    /// How many ranks in all.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Whether `rank` runs in this process.
    fn is_local(&self, rank: u32) -> bool {
        self.net.as_ref().is_none_or(|n| n.rank() == rank)
    }

    /// Rank `rank`'s endpoint.
    pub fn comm(&self, rank: u32) -> Comm {
        assert!(rank < self.ranks, "rank {rank} of {}", self.ranks);
        assert!(self.is_local(rank), "rank {rank} runs in another process");
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
        {
            let mut state = lock(shared);
            state.activity.entry(self.rank).or_default().done = true;
            shared.changed.notify_all();
        }
        if let Some(net) = &self.world.net {
            net.broadcast(&Frame::Done);
        }
    }

    /// Whether the world has failed.
    pub fn failed(&self) -> bool {
        lock(&self.world.shared).failed.is_some()
    }

    /// Marks the world failed; every waiting and later call returns [`CommError::Aborted`].
    pub fn abort(&self, why: &str) {
        let shared = &self.world.shared;
        let why = {
            let mut state = lock(shared);
            let why = state.failed.get_or_insert_with(|| why.to_owned()).clone();
            shared.changed.notify_all();
            why
        };
        if let Some(net) = &self.world.net {
            net.broadcast(&Frame::Abort(why));
        }
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
                // Only this process's ranks report what they are doing.
                let stopped: Vec<String> = (0..self.world.ranks)
                    .filter(|&r| self.world.is_local(r))
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
                drop(state);
                if let Some(net) = &self.world.net {
                    net.broadcast(&Frame::Abort(error.to_string()));
                }
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
        if let Some(net) = self.world.net.as_ref().filter(|_| !self.world.is_local(to)) {
            drop(state);
            return net.send(to, &Frame::Message { tag, data });
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
    /// contribution in rank order once all have entered: the general collective the others
    /// are built on (members may contribute different sizes).
    pub fn exchange(&self, group: &[u32], data: Vec<f32>) -> Result<Vec<Vec<f32>>, CommError> {
        let all = self.exchange_shared(group, data)?;
        // The last member to take a contribution owns it: no copy.
        Ok(all.into_iter().map(Arc::unwrap_or_clone).collect())
    }

    /// [`Comm::exchange`], the contributions shared with the other members that take them
    /// (in one process, a collective over `n` ranks holds `n` contributions, not `n²`).
    fn exchange_shared(
        &self,
        group: &[u32],
        data: Vec<f32>,
    ) -> Result<Vec<Arc<Vec<f32>>>, CommError> {
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
        if let Some(net) = &self.world.net {
            let frame = Frame::Collective {
                members: members.clone(),
                seq,
                data: data.clone(),
            };
            for &m in members.iter().filter(|&&m| m != self.rank) {
                net.send(m, &frame)?;
            }
        }
        {
            let mut state = lock(&self.world.shared);
            state
                .slots
                .entry(key.clone())
                .or_default()
                .contributions
                .insert(self.rank, data.into());
            self.world.shared.changed.notify_all();
        }
        let n = members.len();
        // The slot goes once every member in this process took the result.
        let takers = members.iter().filter(|&&m| self.world.is_local(m)).count();
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
                let all: Vec<Arc<Vec<f32>>> = slot.contributions.values().cloned().collect();
                slot.taken += 1;
                if slot.taken == takers {
                    state.slots.remove(&key);
                }
                Some(all)
            },
        )
    }

    /// Sums `data` over `group` in place (contributions added in rank order).
    pub fn all_reduce(&self, group: &[u32], data: &mut [f32]) -> Result<(), CommError> {
        let all = self.exchange_shared(group, data.to_vec())?;
        data.iter_mut().for_each(|v| *v = 0.0);
        for part in &all {
            data.iter_mut().zip(part.iter()).for_each(|(v, p)| *v += p);
        }
        Ok(())
    }

    /// Concatenates every member's `data` in rank order.
    pub fn all_gather(&self, group: &[u32], data: &[f32]) -> Result<Vec<f32>, CommError> {
        let all = self.exchange_shared(group, data.to_vec())?;
        Ok(all.iter().flat_map(|part| part.iter().copied()).collect())
    }

    /// Sums `data` over `group` and returns this rank's equal share of the sum (members
    /// in rank order own consecutive shares).
    pub fn reduce_scatter(&self, group: &[u32], data: &[f32]) -> Result<Vec<f32>, CommError> {
        let mut members = group.to_vec();
        members.sort_unstable();
        let index = members.iter().position(|&r| r == self.rank).unwrap_or(0);
        let share = data.len() / members.len().max(1);
        let all = self.exchange_shared(group, data.to_vec())?;
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
        let all = self.exchange_shared(group, data.to_vec())?;
        Ok(all
            .iter()
            .flat_map(|part| part[index * share..(index + 1) * share].iter().copied())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::testing::{free_port, placement};

    /// `world` ranks, each with its own [`World::connect`] as a separate process would.
    fn connected(world: u32, timeout: Duration) -> Vec<World> {
        let port = free_port();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..world)
                .map(|rank| {
                    s.spawn(move || World::connect(&placement(rank, world, port), timeout).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn tcp_worlds_match_the_shared_one() {
        let timeout = Duration::from_secs(10);
        let program = |comm: Comm| {
            let r = comm.rank() as f32;
            let peer = comm.rank() ^ 1;
            comm.send(peer, 5, vec![r; 3]).unwrap();
            let got = comm.recv(peer, 5).unwrap();
            let mut sum = vec![r + 1.0, r * 2.0];
            comm.all_reduce(&[0, 1, 2, 3], &mut sum).unwrap();
            // Only members enter a collective.
            let gathered = (comm.rank() % 2 == 1).then(|| comm.all_gather(&[1, 3], &[r]).unwrap());
            let scattered = comm.reduce_scatter(&[0, 1, 2, 3], &[r; 8]).unwrap();
            comm.finish();
            (got, sum, gathered, scattered)
        };
        let shared = World::new(4, timeout);
        let expected: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|r| {
                    let c = shared.comm(r);
                    s.spawn(move || program(c))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let worlds = connected(4, timeout);
        let got: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = worlds
                .iter()
                .enumerate()
                .map(|(r, w)| {
                    let c = w.comm(r as u32);
                    s.spawn(move || program(c))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got, expected);
        assert_eq!(got[0].1, vec![10.0, 12.0]);
    }

    #[test]
    fn a_closed_connection_fails_the_others_at_once() {
        let mut worlds = connected(3, Duration::from_secs(30));
        let gone = worlds.pop().unwrap();
        drop(gone); // rank 2's process exits without a word
        let started = Instant::now();
        let e = worlds[0].comm(0).recv(2, 1).unwrap_err();
        assert!(e.to_string().contains("rank 2's process exited"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn an_abort_reaches_every_process() {
        let worlds = connected(3, Duration::from_secs(30));
        worlds[1].comm(1).abort("rank 1 panicked");
        let e = worlds[2].comm(2).all_gather(&[0, 2], &[1.0]).unwrap_err();
        assert_eq!(e, CommError::Aborted("rank 1 panicked".into()));
    }
}
