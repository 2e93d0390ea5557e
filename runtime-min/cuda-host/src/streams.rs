//! NCCL's ordering, modelled for counting devices, as [`ralpc_runtime_min::dist::nccl`]
//! lays its operations out: each rank's collectives go onto one stream, and its messages to
//! each peer and from each peer onto a stream of their own (a communicator per direction of
//! a pair, as PyTorch's point-to-point keeps one per pair), in the order the rank issues
//! them; the host does not wait for them. A collective runs once every member has it at the
//! head of its stream; a message once its send and its receive are both at the heads of
//! theirs, so messages in one direction pair in issue order, whatever their tags, as NCCL
//! pairs them.
//!
//! A plan whose ranks wait on each other in a cycle therefore stops here as it would on
//! GPUs: the first wait (a rank reading a device buffer, or settling its sums) gives up
//! after the timeout, naming what every stream waits on. Messages paired out of order, or a
//! collective whose members disagree on its size, are an error naming both sides.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ralpc_runtime_min::cuda::backend::R;
use ralpc_runtime_min::cuda::error::DeviceError;

/// Every rank's communication streams, for `count` ranks.
pub struct Streams {
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl fmt::Debug for Streams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Streams").finish_non_exhaustive()
    }
}

/// One of a rank's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lane {
    Collectives,
    /// Messages to this peer.
    To(u32),
    /// Messages from this peer.
    From(u32),
}

struct State {
    count: usize,
    /// Per (rank, lane), operations issued and not yet run, oldest first.
    streams: BTreeMap<(u32, Lane), VecDeque<Op>>,
    /// Per rank, collectives issued over each group so far.
    collectives: BTreeMap<(u32, Vec<u32>), u64>,
    /// Per rank, messages issued on each lane so far.
    messages: BTreeMap<(u32, Lane), u64>,
    /// Per (rank, ticket), finished gathers' member lengths, until their issuer takes them.
    lengths: BTreeMap<(u32, u64), Vec<usize>>,
    tickets: u64,
    failed: Option<String>,
}

#[derive(Clone)]
struct Op {
    ticket: u64,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Send {
        to: u32,
        seq: u64,
        tag: u64,
        len: usize,
    },
    Recv {
        from: u32,
        seq: u64,
        tag: u64,
        len: usize,
    },
    /// A sum (its members' lengths agree) or, `gather`, a gather.
    Collective {
        group: Vec<u32>,
        seq: u64,
        len: usize,
        gather: bool,
    },
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Send { to, seq, tag, len } => {
                write!(f, "message {seq} to rank {to} (tag {tag}, {len} elements)")
            }
            Kind::Recv {
                from,
                seq,
                tag,
                len,
            } => write!(
                f,
                "message {seq} from rank {from} (tag {tag}, {len} elements)"
            ),
            Kind::Collective {
                group, seq, len, ..
            } => write!(f, "collective {seq} over {group:?} ({len} elements)"),
        }
    }
}

impl Streams {
    /// The streams of `count` ranks, whose waits give up after `timeout`.
    pub fn new(count: usize, timeout: Duration) -> Streams {
        Streams {
            timeout,
            state: Mutex::new(State {
                count,
                streams: BTreeMap::new(),
                collectives: BTreeMap::new(),
                messages: BTreeMap::new(),
                lengths: BTreeMap::new(),
                tickets: 0,
                failed: None,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank` sends `len` elements to `to` under `tag`.
    ///
    /// # Errors
    /// A rank out of range.
    pub fn send(&self, rank: u32, to: u32, tag: u64, len: usize) -> R<()> {
        self.issue(rank, Lane::To(to), |s| {
            let seq = next(&mut s.messages, (rank, Lane::To(to)));
            Kind::Send { to, seq, tag, len }
        })
        .map(drop)
    }

    /// Rank `rank` receives `len` elements from `from` under `tag`.
    ///
    /// # Errors
    /// A rank out of range.
    pub fn recv(&self, rank: u32, from: u32, tag: u64, len: usize) -> R<()> {
        self.issue(rank, Lane::From(from), |s| {
            let seq = next(&mut s.messages, (rank, Lane::From(from)));
            Kind::Recv {
                from,
                seq,
                tag,
                len,
            }
        })
        .map(drop)
    }

    /// Rank `rank` sums `len` elements over `group` (sorted, with `rank`).
    ///
    /// # Errors
    /// A rank out of range, or one not in `group`.
    pub fn sum(&self, rank: u32, group: &[u32], len: usize) -> R<()> {
        self.collective(rank, group, len, false).map(drop)
    }

    /// Rank `rank` gathers `len` elements from each member of `group` (sorted, with
    /// `rank`): every member's length, in group order, once the gather ran. The host waits
    /// for it, as it waits to read a device buffer.
    ///
    /// # Errors
    /// As [`Streams::wait`], or a rank not in `group`.
    pub fn gather(&self, rank: u32, group: &[u32], len: usize) -> R<Vec<usize>> {
        let ticket = self.collective(rank, group, len, true)?;
        let mut state = self.wait_until(rank, |s| s.lengths.contains_key(&(rank, ticket)))?;
        state
            .lengths
            .remove(&(rank, ticket))
            .ok_or_else(|| inconsistent(rank, "lost a gather's lengths"))
    }

    /// Waits until every collective rank `rank` issued and every message it receives has
    /// run, as a host reading a device buffer waits for the streams the computation waited
    /// on; with `sends`, its sends too (as the optimizer step does, settling everything).
    ///
    /// # Errors
    /// Another rank failed, operations paired wrongly, or the timeout passed (the streams
    /// wait on each other in a cycle, or a rank stopped).
    pub fn wait(&self, rank: u32, sends: bool) -> R<()> {
        self.wait_until(rank, |s| {
            s.streams
                .range((rank, Lane::Collectives)..=(rank, Lane::From(u32::MAX)))
                .all(|(&(_, lane), ops)| ops.is_empty() || (!sends && matches!(lane, Lane::To(_))))
        })
        .map(drop)
    }

    fn collective(&self, rank: u32, group: &[u32], len: usize, gather: bool) -> R<u64> {
        if !group.contains(&rank) {
            return Err(inconsistent(
                rank,
                &format!("was asked into a collective of ranks {group:?}"),
            ));
        }
        self.issue(rank, Lane::Collectives, |s| {
            let seq = next(&mut s.collectives, (rank, group.to_vec()));
            Kind::Collective {
                group: group.to_vec(),
                seq,
                len,
                gather,
            }
        })
    }

    fn issue(&self, rank: u32, lane: Lane, kind: impl FnOnce(&mut State) -> Kind) -> R<u64> {
        let mut state = self.lock();
        let peer = match lane {
            Lane::Collectives => rank,
            Lane::To(p) | Lane::From(p) => p,
        };
        if rank as usize >= state.count || peer as usize >= state.count {
            return Err(inconsistent(
                rank,
                &format!("named a rank outside the {} ranks", state.count),
            ));
        }
        let ticket = state.tickets;
        state.tickets += 1;
        let kind = kind(&mut state);
        state
            .streams
            .entry((rank, lane))
            .or_default()
            .push_back(Op { ticket, kind });
        state.progress();
        self.changed.notify_all();
        Ok(ticket)
    }

    fn wait_until(&self, rank: u32, done: impl Fn(&State) -> bool) -> R<MutexGuard<'_, State>> {
        let deadline = Instant::now() + self.timeout;
        let mut state = self.lock();
        loop {
            if let Some(why) = &state.failed {
                return Err(DeviceError::Replicas(format!("aborted: {why}")));
            }
            if done(&state) {
                return Ok(state);
            }
            let now = Instant::now();
            if now >= deadline {
                let why = format!(
                    "rank {rank} waited more than {} s for its communication streams; they \
                     wait on: {}",
                    self.timeout.as_secs(),
                    state.heads()
                );
                state.failed = Some(why.clone());
                self.changed.notify_all();
                return Err(DeviceError::Replicas(why));
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// `counts[key]`, then one more.
fn next<K: Ord>(counts: &mut BTreeMap<K, u64>, key: K) -> u64 {
    let n = counts.entry(key).or_default();
    *n += 1;
    *n - 1
}

fn inconsistent(rank: u32, what: &str) -> DeviceError {
    DeviceError::Inconsistent(format!("rank {rank} {what}"))
}

impl State {
    /// Runs every operation whose partners are at the heads of their streams, until
    /// nothing moves.
    fn progress(&mut self) {
        loop {
            let heads: Vec<(u32, Op)> = self
                .streams
                .iter()
                .filter_map(|(&(rank, _), ops)| Some((rank, ops.front()?.clone())))
                .collect();
            let mut moved = false;
            for (rank, op) in heads {
                moved |= self.meet(rank, &op);
                if self.failed.is_some() {
                    return;
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// The operation at the head of `rank`'s `lane`.
    fn head(&self, rank: u32, lane: Lane) -> Option<&Op> {
        self.streams.get(&(rank, lane))?.front()
    }

    fn pop(&mut self, rank: u32, lane: Lane, ticket: u64) -> bool {
        match self.streams.get_mut(&(rank, lane)) {
            Some(ops) if ops.front().is_some_and(|op| op.ticket == ticket) => {
                ops.pop_front();
                true
            }
            _ => false,
        }
    }

    /// Runs rank `rank`'s operation `op` (at the head of its stream) if its partners have
    /// theirs at the heads of theirs.
    fn meet(&mut self, rank: u32, op: &Op) -> bool {
        match &op.kind {
            Kind::Send { to, seq, tag, len } => {
                let Some(Op {
                    ticket,
                    kind: Kind::Recv { tag: t, len: n, .. },
                }) = self.head(*to, Lane::From(rank)).cloned()
                else {
                    return false;
                };
                if (t, n) != (*tag, *len) {
                    self.failed = Some(format!(
                        "NCCL pairs rank {rank}'s message {seq} to rank {to} (tag {tag}, {len} \
                         elements) with rank {to}'s receive of tag {t} ({n} elements): the two \
                         ranks order their messages differently"
                    ));
                    return false;
                }
                self.pop(rank, Lane::To(*to), op.ticket) && self.pop(*to, Lane::From(rank), ticket)
            }
            // Its sender runs it.
            Kind::Recv { .. } => false,
            Kind::Collective {
                group,
                seq,
                len,
                gather,
            } => {
                let mut members = Vec::with_capacity(group.len());
                for &m in group {
                    match self.head(m, Lane::Collectives) {
                        Some(Op {
                            ticket,
                            kind:
                                Kind::Collective {
                                    group: g,
                                    seq: s,
                                    len,
                                    ..
                                },
                        }) if g == group && s == seq => members.push((m, *ticket, *len)),
                        _ => return false,
                    }
                }
                if let (false, Some(&(other, _, n))) =
                    (*gather, members.iter().find(|&&(_, _, n)| n != *len))
                {
                    self.failed = Some(format!(
                        "rank {rank} sums {len} elements over {group:?} where rank {other} \
                         sums {n}"
                    ));
                    return false;
                }
                let lengths: Vec<usize> = members.iter().map(|&(_, _, n)| n).collect();
                for (m, ticket, _) in members {
                    self.pop(m, Lane::Collectives, ticket);
                    if *gather {
                        self.lengths.insert((m, ticket), lengths.clone());
                    }
                }
                true
            }
        }
    }

    /// What every stream waits on.
    fn heads(&self) -> String {
        let waiting: Vec<String> = self
            .streams
            .iter()
            .filter_map(|(&(rank, _), ops)| Some(format!("rank {rank} on {}", ops.front()?.kind)))
            .collect();
        match waiting.is_empty() {
            true => "nothing (a rank stopped issuing)".into(),
            false => waiting.join("; "),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streams(n: usize) -> Streams {
        Streams::new(n, Duration::from_millis(300))
    }

    #[test]
    fn a_message_runs_once_both_ends_are_issued() {
        let s = streams(2);
        s.send(0, 1, 7, 4).unwrap();
        s.recv(1, 0, 7, 4).unwrap();
        s.wait(0, true).unwrap();
        s.wait(1, true).unwrap();
    }

    #[test]
    fn two_stages_sending_before_receiving_pass_each_other() {
        // Stage 0 sends the next activation, then receives a gradient; stage 1 sends the
        // gradient, then receives the activation. On one stream per rank each send would
        // wait for a receive behind the other's send; a stream per direction lets both run.
        let s = streams(2);
        s.send(0, 1, 1, 8).unwrap();
        s.recv(0, 1, 2, 8).unwrap();
        s.send(1, 0, 2, 8).unwrap();
        s.recv(1, 0, 1, 8).unwrap();
        s.wait(0, true).unwrap();
        s.wait(1, true).unwrap();
    }

    #[test]
    fn a_read_waits_for_receives_not_for_sends() {
        let s = streams(2);
        s.send(0, 1, 1, 8).unwrap();
        s.wait(0, false).unwrap();
        let e = s.wait(0, true).unwrap_err().to_string();
        assert!(e.contains("rank 0 on message 0 to rank 1 (tag 1"), "{e}");
    }

    #[test]
    fn messages_pair_in_issue_order_whatever_their_tags() {
        let s = streams(2);
        s.send(0, 1, 1, 8).unwrap();
        s.send(0, 1, 2, 8).unwrap();
        s.recv(1, 0, 2, 8).unwrap();
        let e = s.wait(1, false).unwrap_err().to_string();
        assert!(e.contains("order their messages differently"), "{e}");
    }

    #[test]
    fn collectives_run_in_each_members_order_and_report_lengths() {
        let s = streams(3);
        std::thread::scope(|scope| {
            let other = scope.spawn(|| s.gather(1, &[0, 1], 5).unwrap());
            assert_eq!(s.gather(0, &[0, 1], 3).unwrap(), [3, 5]);
            assert_eq!(other.join().unwrap(), [3, 5]);
        });
        // Ranks 1 and 2 sum over [1, 2] and [0, 1, 2] in opposite orders: each waits for
        // the other's first.
        s.sum(1, &[1, 2], 1).unwrap();
        s.sum(1, &[0, 1, 2], 1).unwrap();
        s.sum(2, &[0, 1, 2], 1).unwrap();
        s.sum(2, &[1, 2], 1).unwrap();
        s.sum(0, &[0, 1, 2], 1).unwrap();
        let e = s.wait(2, false).unwrap_err().to_string();
        assert!(e.contains("rank 1 on collective 0 over [1, 2]"), "{e}");
        assert!(e.contains("rank 2 on collective 0 over [0, 1, 2]"), "{e}");
    }

    #[test]
    fn members_summing_different_lengths_fail() {
        let s = streams(2);
        s.sum(0, &[0, 1], 4).unwrap();
        s.sum(1, &[0, 1], 6).unwrap();
        let e = s.wait(0, false).unwrap_err().to_string();
        assert!(
            e.contains("sums 4 elements over [0, 1] where rank 1 sums 6")
                || e.contains("sums 6 elements over [0, 1] where rank 0 sums 4"),
            "{e}"
        );
    }
}
