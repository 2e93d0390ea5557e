//! The simulator backend: runs a plan's instruction streams with clocks instead of
//! kernels. Every instruction lasts the duration the plan gives it; the simulator only
//! decides when each can start.
//!
//! Each rank has a compute stream (forward, backward, step) and a full-duplex
//! communication stream (sends one after another, receives one after another, both at
//! once, as NCCL's grouped send/receive runs them; an all-reduce holds both), and issues
//! its instructions in program order. Data dependencies come from the plan's buffers: an
//! instruction waits for the last earlier writer of every buffer it reads.
//! * compute waits for its stream and its dependencies;
//! * consecutive sends (or receives) of one tag form a group that runs concurrently, as
//!   NCCL's grouped send/receive does: one latency, then the bandwidth parts in turn;
//! * a send group waits for its stream and the dependencies of its messages (the data it
//!   sends); the sender does not wait for the receiver (buffered);
//! * a receive group starts once all its sends have started and its stream is free;
//! * an all-reduce starts when every member of its group has reached it with its streams
//!   free and its dependencies done; so gradient buckets overlap the backward that
//!   follows them.
//!
//! Links are not shared between concurrent transfers yet: each message takes its
//! predicted time. A plan whose ranks wait on each other in a cycle is reported as a
//! deadlock, naming the stuck instructions.

use std::collections::BTreeMap;

use ralpc_codegen::{Instruction, Plan};
use serde::Serialize;

/// Which stream an instruction ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Forward, backward, optimizer step.
    Compute,
    /// Sends, receives, collectives.
    Communication,
}

/// One instruction as it ran.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Span {
    /// Index in the rank's program.
    pub index: usize,
    /// Its stream.
    pub stream: Stream,
    /// Start, µs from the iteration's start.
    pub start_us: f64,
    /// End, µs.
    pub end_us: f64,
}

/// One rank's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankTimeline {
    /// Every instruction, in program order.
    pub spans: Vec<Span>,
    /// Time computing, µs.
    pub compute_us: f64,
    /// Time spent in messages and collectives (sends and receives overlap), µs.
    pub communication_us: f64,
    /// When its last instruction ended, µs.
    pub finish_us: f64,
}

/// A simulated iteration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Simulation {
    /// From the first start to the last end, µs.
    pub iteration_time_us: f64,
    /// Samples per second at that pace.
    pub samples_per_second: f64,
    /// Per rank.
    pub ranks: Vec<RankTimeline>,
    /// Bytes sent point to point.
    pub bytes_sent: u64,
}

/// Why a plan cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// Ranks wait on each other forever.
    #[error("deadlock: {0}")]
    Deadlock(String),
}

#[derive(Clone, Copy, Default)]
struct Clock {
    compute_free: f64,
    send_free: f64,
    recv_free: f64,
}

/// Per rank and instruction, the earlier instructions it depends on: for every buffer it
/// reads, the last write before it.
fn dependencies(plan: &Plan) -> Vec<Vec<Vec<u32>>> {
    plan.programs
        .iter()
        .zip(&plan.buffers)
        .map(|(program, buffers)| {
            let mut deps: Vec<Vec<u32>> = vec![Vec::new(); program.len()];
            for b in buffers {
                for &read in &b.reads {
                    let before = b.writes.partition_point(|&w| w < read);
                    if let Some(&w) = before.checked_sub(1).and_then(|i| b.writes.get(i)) {
                        if let Some(d) = deps.get_mut(read as usize) {
                            d.push(w);
                        }
                    }
                }
            }
            for d in &mut deps {
                d.sort_unstable();
                d.dedup();
            }
            deps
        })
        .collect()
}

/// Runs `plan` (already validated) with clocks.
///
/// Cost: O(instructions × ranks) in the worst case (one pass per blocked round).
///
/// # Errors
/// [`SimError::Deadlock`] when some rank can never proceed.
pub fn simulate(plan: &Plan) -> Result<Simulation, SimError> {
    let n = plan.programs.len();
    let mut pc = vec![0usize; n];
    let mut clocks = vec![Clock::default(); n];
    let mut spans: Vec<Vec<Span>> = vec![Vec::new(); n];
    let deps = dependencies(plan);
    // When each instruction ended, by rank and index (NaN until it has run).
    let mut ended: Vec<Vec<f64>> = plan
        .programs
        .iter()
        .map(|p| vec![f64::NAN; p.len()])
        .collect();
    let ready = |ended: &[Vec<f64>], rank: usize, index: usize| -> f64 {
        deps[rank][index]
            .iter()
            .map(|&d| ended[rank][d as usize])
            .fold(0.0, f64::max)
    };
    // When each message's send started, by (from, to, tag).
    let mut sent: BTreeMap<(u32, u32, u64), f64> = BTreeMap::new();
    // Arrival times at each group's current collective, by group.
    let mut arrivals: BTreeMap<u32, BTreeMap<u32, f64>> = BTreeMap::new();
    let mut bytes_sent = 0u64;
    let total: usize = plan.programs.iter().map(Vec::len).sum();
    let mut done = 0usize;
    while done < total {
        let mut progressed = false;
        for rank in 0..n {
            while let Some(instr) = plan.programs[rank].get(pc[rank]) {
                let c = &mut clocks[rank];
                let index = pc[rank];
                let us = instr.us();
                let span = |stream, start: f64| Span {
                    index,
                    stream,
                    start_us: start,
                    end_us: start + us,
                };
                match *instr {
                    Instruction::Forward { .. }
                    | Instruction::Backward { .. }
                    | Instruction::Step { .. } => {
                        let start = c.compute_free.max(ready(&ended, rank, index));
                        c.compute_free = start + us;
                        ended[rank][index] = start + us;
                        spans[rank].push(span(Stream::Compute, start));
                    }
                    Instruction::Send { tag, .. } | Instruction::Recv { tag, .. } => {
                        // The run of messages of this tag on this rank is one group.
                        let program = &plan.programs[rank];
                        let sending = matches!(instr, Instruction::Send { .. });
                        let end = (index..program.len())
                            .find(|&j| {
                                let same = match program[j] {
                                    Instruction::Send { tag: t, .. } => sending && t == tag,
                                    Instruction::Recv { tag: t, .. } => !sending && t == tag,
                                    _ => false,
                                };
                                !same
                            })
                            .unwrap_or(program.len());
                        let group = &program[index..end];
                        let start = if sending {
                            (index..end)
                                .map(|j| ready(&ended, rank, j))
                                .fold(c.send_free, f64::max)
                        } else {
                            let mut ready = c.recv_free;
                            for m in group {
                                if let Instruction::Recv { from, tag, .. } = *m {
                                    match sent.get(&(from, rank as u32, tag)) {
                                        Some(&t) => ready = ready.max(t),
                                        None => break,
                                    }
                                }
                            }
                            let all_sent = group.iter().all(|m| match *m {
                                Instruction::Recv { from, tag, .. } => {
                                    sent.contains_key(&(from, rank as u32, tag))
                                }
                                _ => false,
                            });
                            if !all_sent {
                                break;
                            }
                            ready
                        };
                        // Concurrent messages: one latency, the bandwidth parts in turn.
                        let (mut latency, mut transfer) = (0.0f64, 0.0);
                        for m in group {
                            if let Instruction::Send { us, latency_us, .. }
                            | Instruction::Recv { us, latency_us, .. } = *m
                            {
                                latency = latency.max(latency_us);
                                transfer += us - latency_us;
                            }
                        }
                        let finish = start + latency + transfer;
                        for (j, m) in group.iter().enumerate() {
                            if let Instruction::Send { to, bytes, tag, .. } = *m {
                                sent.insert((rank as u32, to, tag), start);
                                bytes_sent += bytes;
                            }
                            spans[rank].push(Span {
                                index: index + j,
                                stream: Stream::Communication,
                                start_us: start,
                                end_us: finish,
                            });
                            ended[rank][index + j] = finish;
                        }
                        if sending {
                            c.send_free = finish;
                        } else {
                            c.recv_free = finish;
                        }
                        pc[rank] = end;
                        done += group.len();
                        progressed = true;
                        continue;
                    }
                    Instruction::AllReduce { group, .. } => {
                        let arrived = c.send_free.max(c.recv_free).max(ready(&ended, rank, index));
                        let waiting = arrivals.entry(group).or_default();
                        waiting.insert(rank as u32, arrived);
                        let members = &plan.groups[group as usize];
                        if waiting.len() < members.len() {
                            break;
                        }
                        // Everyone is here: all start together.
                        let start = waiting.values().copied().fold(0.0, f64::max);
                        arrivals.remove(&group);
                        for &m in members {
                            let m = m as usize;
                            let mc = &mut clocks[m];
                            mc.send_free = start + us;
                            mc.recv_free = start + us;
                            ended[m][pc[m]] = start + us;
                            spans[m].push(Span {
                                index: pc[m],
                                stream: Stream::Communication,
                                start_us: start,
                                end_us: start + us,
                            });
                            pc[m] += 1;
                            done += 1;
                        }
                        progressed = true;
                        continue;
                    }
                }
                pc[rank] += 1;
                done += 1;
                progressed = true;
            }
        }
        if !progressed {
            let stuck: Vec<String> = (0..n)
                .filter_map(|r| {
                    plan.programs[r]
                        .get(pc[r])
                        .map(|i| format!("rank {r} at instruction {} ({i:?})", pc[r]))
                })
                .collect();
            return Err(SimError::Deadlock(stuck.join("; ")));
        }
    }
    let ranks: Vec<RankTimeline> = spans
        .into_iter()
        .map(|spans| {
            let busy = |s: Stream| {
                spans
                    .iter()
                    .filter(|x| x.stream == s)
                    .map(|x| x.end_us - x.start_us)
                    .sum()
            };
            RankTimeline {
                compute_us: busy(Stream::Compute),
                communication_us: busy(Stream::Communication),
                finish_us: spans.iter().map(|s| s.end_us).fold(0.0, f64::max),
                spans,
            }
        })
        .collect();
    let iteration = ranks.iter().map(|r| r.finish_us).fold(0.0, f64::max);
    Ok(Simulation {
        iteration_time_us: iteration,
        samples_per_second: if iteration > 0.0 {
            plan.batch as f64 / (iteration * 1e-6)
        } else {
            0.0
        },
        ranks,
        bytes_sent,
    })
}
