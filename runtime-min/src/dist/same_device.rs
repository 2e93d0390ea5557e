//! The same-device communicator: data-parallel replicas that are threads sharing one
//! device sum their gradients there, device to device — each deposits a copy of its buffer
//! at a hub and adds everyone's copies in rank order — so several ranks are testable on
//! one GPU without NCCL (which refuses duplicate devices) and without host copies.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Replicas;
use crate::cuda::backend::{Backend, R};
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

impl<B: Backend> Replicas<B> for SameDevice<B> {
    fn all_reduce(&self, dev: &B, buf: &mut B::Buf) -> R<()> {
        let seq = self.seq.get();
        let n = dev.len(buf);
        let mut copy = dev.zeros(n)?;
        dev.axpby(&mut copy, buf, 1.0, 0.0)?;
        // The others read the copy from their own streams: it must be complete.
        dev.synchronize()?;
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
