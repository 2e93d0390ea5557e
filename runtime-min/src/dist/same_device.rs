//! The same-device communicator: data-parallel replicas that are threads sharing one
//! device sum their gradients there, device to device — each deposits a copy of its buffer
//! at a hub and adds everyone's copies in rank order — so several ranks are testable on
//! one GPU without NCCL (which refuses duplicate devices) and without host copies. Their
//! messages (a pipeline's activations and gradients) pass the same way, as a copy left in
//! the receiver's mailbox.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Replicas;
use crate::cuda::backend::{Backend, R};
use crate::cuda::calls::Kernels;
use crate::cuda::error::DeviceError;

/// One round of deposits at a time, for `count` ranks.
struct Round<T> {
    /// The round being filled.
    seq: u64,
    deposits: Vec<Option<T>>,
    /// Ranks that used the round's deposits.
    taken: usize,
    failed: Option<String>,
}

/// Where the ranks meet: deposits of one kind (device buffers, or losses).
pub struct Hub<T> {
    count: usize,
    timeout: Duration,
    round: Mutex<Round<T>>,
    changed: Condvar,
    /// Messages not yet received, by (sender, receiver, tag), oldest first.
    mail: Mutex<BTreeMap<(u32, u32, u64), VecDeque<T>>>,
    delivered: Condvar,
}

impl<T> Hub<T> {
    /// A hub for `count` ranks whose waits give up after `timeout`.
    pub fn new(count: usize, timeout: Duration) -> Hub<T> {
        Hub {
            count,
            timeout,
            round: Mutex::new(Round {
                seq: 0,
                deposits: (0..count).map(|_| None).collect(),
                taken: 0,
                failed: None,
            }),
            changed: Condvar::new(),
            mail: Mutex::default(),
            delivered: Condvar::new(),
        }
    }

    /// Leaves `item` for rank `to` from `from` under `tag`.
    pub fn post(&self, from: u32, to: u32, tag: u64, item: T) {
        let mut mail = self.mail.lock().unwrap_or_else(|p| p.into_inner());
        mail.entry((from, to, tag)).or_default().push_back(item);
        self.delivered.notify_all();
    }

    /// The oldest item rank `from` left for `to` under `tag`, waiting for it until the hub
    /// fails or the timeout passes.
    pub fn collect(&self, from: u32, to: u32, tag: u64) -> R<T> {
        let deadline = Instant::now() + self.timeout;
        let mut mail = self.mail.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(item) = mail.get_mut(&(from, to, tag)).and_then(VecDeque::pop_front) {
                return Ok(item);
            }
            if let Some(why) = &self.lock().failed {
                return Err(DeviceError::Replicas(format!("aborted: {why}")));
            }
            let now = Instant::now();
            if now >= deadline {
                let why = format!(
                    "rank {to} waited more than {} s for a message from rank {from}",
                    self.timeout.as_secs()
                );
                self.fail(&why);
                return Err(DeviceError::Replicas(why));
            }
            // Woken by a delivery, or at the latest every 50 ms to notice a failure.
            let wait = (deadline - now).min(Duration::from_millis(50));
            mail = self
                .delivered
                .wait_timeout(mail, wait)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Round<T>> {
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops every waiting and later round with `why`.
    pub fn fail(&self, why: &str) {
        self.lock().failed.get_or_insert_with(|| why.to_owned());
        self.changed.notify_all();
    }

    /// Waits until `ready`, the hub fails or the timeout passes.
    fn wait<'g>(
        &'g self,
        mut round: MutexGuard<'g, Round<T>>,
        rank: usize,
        what: &str,
        ready: impl Fn(&Round<T>) -> bool,
    ) -> R<MutexGuard<'g, Round<T>>> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(why) = &round.failed {
                return Err(DeviceError::Replicas(format!("aborted: {why}")));
            }
            if ready(&round) {
                return Ok(round);
            }
            let now = Instant::now();
            if now >= deadline {
                let why = format!(
                    "rank {rank} waited more than {} s for {what}",
                    self.timeout.as_secs()
                );
                round.failed = Some(why.clone());
                self.changed.notify_all();
                return Err(DeviceError::Replicas(why));
            }
            round = self
                .changed
                .wait_timeout(round, deadline - now)
                .map_or_else(|p| p.into_inner().0, |(g, _)| g);
        }
    }

    /// Round `seq`: deposits `item` as `rank`'s, waits for every rank's, and calls `use_all`
    /// with them in rank order (under the hub's lock, so what it launches can finish
    /// before the deposits go).
    pub fn round<X>(
        &self,
        rank: usize,
        seq: u64,
        item: T,
        what: &str,
        use_all: impl FnOnce(&[Option<T>]) -> R<X>,
    ) -> R<X> {
        let round = self.wait(self.lock(), rank, what, |r| r.seq == seq)?;
        let mut round = round;
        round.deposits[rank] = Some(item);
        self.changed.notify_all();
        let count = self.count;
        let mut round = self.wait(round, rank, what, |r| {
            r.deposits.iter().filter(|d| d.is_some()).count() == count
        })?;
        let out = use_all(&round.deposits);
        round.taken += 1;
        if round.taken == count {
            round.deposits.iter_mut().for_each(|d| *d = None);
            round.taken = 0;
            round.seq += 1;
        }
        self.changed.notify_all();
        out
    }
}

/// Rank `rank`'s side of the same-device communicator.
pub struct SameDevice<B: Backend> {
    buffers: Arc<Hub<B::Buf>>,
    rank: usize,
    /// Rounds this rank entered.
    seq: std::cell::Cell<u64>,
}

impl<B: Backend> SameDevice<B> {
    /// Rank `rank` at the hub (shared by every rank's thread).
    pub fn new(buffers: Arc<Hub<B::Buf>>, rank: usize) -> Self {
        SameDevice {
            buffers,
            rank,
            seq: std::cell::Cell::new(0),
        }
    }
}

/// The mailbox tag of a collective over `group` (the top bit set, which no plan's message
/// tag has): a hash of its members, so that collectives over different groups sharing two
/// ranks never take each other's parts.
pub fn group_tag(group: &[u32]) -> u64 {
    // FNV-1a: stable across runs and builds, unlike the standard library's hasher.
    let hash = group.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &r| {
        (h ^ u64::from(r)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash | 1 << 63
}

impl<B: Backend> SameDevice<B> {
    /// A copy of `buf` another rank can read from its own stream.
    fn complete_copy(dev: &B, buf: &B::Buf) -> R<B::Buf> {
        let mut copy = dev.zeros(dev.len(buf))?;
        dev.axpby(&mut copy, buf, 1.0, 0.0)?;
        // The others read the copy from their own streams: it must be complete.
        dev.synchronize()?;
        Ok(copy)
    }

    /// The other members' `buf` in group order (`None` at this rank's place), through the
    /// mailbox: each member leaves a copy for every other, then collects theirs.
    fn gather_group(&self, dev: &B, group: &[u32], buf: &B::Buf) -> R<Vec<Option<B::Buf>>> {
        let me = self.rank as u32;
        if !group.contains(&me) || !self.reaches(group) {
            return Err(DeviceError::Inconsistent(format!(
                "rank {me} was asked to meet ranks {group:?} at a hub of {}",
                self.buffers.count
            )));
        }
        let tag = group_tag(group);
        for &other in group.iter().filter(|&&r| r != me) {
            self.buffers
                .post(me, other, tag, Self::complete_copy(dev, buf)?);
        }
        group
            .iter()
            .map(|&member| match member == me {
                true => Ok(None),
                false => self.buffers.collect(member, me, tag).map(Some),
            })
            .collect()
    }

    /// Every rank's round at the hub: each deposits a copy and adds all of them.
    fn sum_of_all(&self, dev: &B, buf: &mut B::Buf) -> R<()> {
        let seq = self.seq.get();
        let n = dev.len(buf);
        let copy = Self::complete_copy(dev, buf)?;
        let sum = self
            .buffers
            .round(self.rank, seq, copy, "the gradient sum", |all| {
                let mut sum = dev.zeros(n)?;
                for part in all.iter().flatten() {
                    dev.axpby(&mut sum, part, 1.0, 1.0)?;
                }
                // Done reading the deposits before they are released.
                dev.synchronize()?;
                Ok(sum)
            })?;
        self.seq.set(seq + 1);
        *buf = sum;
        Ok(())
    }

    /// A group smaller than the hub's ranks: every member gathers the group's parts and
    /// adds them in rank order, so every member gets the same sum.
    fn sum_of_group(&self, dev: &B, group: &[u32], buf: &mut B::Buf) -> R<()> {
        let parts = self.gather_group(dev, group, buf)?;
        let n = dev.len(buf);
        let mut sum = dev.zeros(n)?;
        for (member, part) in group.iter().zip(&parts) {
            // This rank's own part is `buf` itself.
            let part = part.as_ref().unwrap_or(&*buf);
            if dev.len(part) != n {
                return Err(DeviceError::Inconsistent(format!(
                    "rank {member} summed {} elements over {group:?} where rank {} sums {n}",
                    dev.len(part),
                    self.rank
                )));
            }
            dev.axpby(&mut sum, part, 1.0, 1.0)?;
        }
        // Done reading the others' copies before they go.
        dev.synchronize()?;
        drop(parts);
        *buf = sum;
        Ok(())
    }
}

impl<B: Backend> Replicas<B> for SameDevice<B> {
    /// Any group of the hub's ranks.
    fn reaches(&self, group: &[u32]) -> bool {
        !group.is_empty() && group.iter().all(|&r| (r as usize) < self.buffers.count)
    }

    fn all_reduce(&self, dev: &B, group: &[u32], buf: &mut B::Buf) -> R<()> {
        if group.len() == self.buffers.count {
            self.sum_of_all(dev, buf)
        } else {
            self.sum_of_group(dev, group, buf)
        }
    }

    fn all_gather(&self, dev: &B, group: &[u32], buf: &B::Buf) -> R<Option<Vec<B::Buf>>> {
        let parts = self.gather_group(dev, group, buf)?;
        parts
            .into_iter()
            .map(|part| match part {
                Some(part) => Ok(part),
                None => Self::complete_copy(dev, buf),
            })
            .collect::<R<Vec<_>>>()
            .map(Some)
    }

    fn send(&self, dev: &B, to: u32, tag: u64, buf: &B::Buf) -> R<bool> {
        if tag >> 63 != 0 {
            return Err(DeviceError::Inconsistent(format!(
                "message tag {tag} has the top bit the hub's sums use"
            )));
        }
        let copy = Self::complete_copy(dev, buf)?;
        self.buffers.post(self.rank as u32, to, tag, copy);
        Ok(true)
    }

    fn recv(&self, dev: &B, from: u32, tag: u64, n: usize) -> R<Option<B::Buf>> {
        let buf = self.buffers.collect(from, self.rank as u32, tag)?;
        if dev.len(&buf) != n {
            return Err(DeviceError::Inconsistent(format!(
                "rank {from} sent {} elements under tag {tag} where {n} were expected",
                dev.len(&buf)
            )));
        }
        Ok(Some(buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_hand_every_rank_every_deposit_in_rank_order() {
        let hub: Hub<u32> = Hub::new(3, Duration::from_secs(10));
        let sums: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|r| {
                    let hub = &hub;
                    s.spawn(move || {
                        (0..4u64)
                            .map(|seq| {
                                hub.round(r, seq, r as u32 * 10 + seq as u32, "test", |all| {
                                    Ok(all.iter().flatten().fold(0, |a, &x| a * 100 + x))
                                })
                                .unwrap()
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for got in &sums {
            assert_eq!(got, &[1020, 11121, 21222, 31323]);
        }
    }

    #[test]
    fn messages_arrive_by_sender_and_tag_oldest_first() {
        let hub: Hub<u32> = Hub::new(2, Duration::from_secs(10));
        let got: Vec<u32> = std::thread::scope(|s| {
            let receiver = s.spawn(|| {
                // Tag 2 is asked for first although tag 1 is sent first.
                [(0, 2), (0, 1), (0, 1)]
                    .iter()
                    .map(|&(from, tag)| hub.collect(from, 1, tag).unwrap())
                    .collect()
            });
            hub.post(0, 1, 1, 10);
            hub.post(0, 1, 1, 11);
            hub.post(0, 1, 2, 20);
            receiver.join().unwrap()
        });
        assert_eq!(got, [20, 10, 11]);
    }

    #[test]
    fn a_message_never_sent_times_out() {
        let hub: Hub<u32> = Hub::new(2, Duration::from_millis(200));
        let error = hub.collect(0, 1, 7).unwrap_err().to_string();
        assert!(error.contains("rank 1 waited"), "{error}");
        assert!(error.contains("from rank 0"), "{error}");
    }

    #[test]
    fn a_missing_rank_times_out_and_stops_the_others() {
        let hub: Hub<u32> = Hub::new(3, Duration::from_millis(300));
        let errors: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|r| {
                    let hub = &hub;
                    s.spawn(move || {
                        hub.round(r, 0, 1, "the gradient sum", |_| Ok(()))
                            .unwrap_err()
                            .to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            errors
                .iter()
                .any(|e| e.contains("waited more than 0 s for the gradient sum")),
            "{errors:?}"
        );
    }
}
