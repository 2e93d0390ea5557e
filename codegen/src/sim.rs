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
//! Links between servers are shared: a server's network interface carries one transfer
//! at a time in each direction, so concurrent traffic into or out of one server takes as
//! long as its sum. A send between servers holds the sender's interface and the
//! receivers' while its bytes flow (its receive ends no earlier); a collective spanning
//! servers holds the interfaces of all of them while its bytes flow (its latency, the
//! steps' α, holds none). Within a server every GPU has its own links.
//!
//! A plan whose ranks wait on each other in a cycle is reported as a deadlock, naming the
//! stuck instructions.
//!
//! Besides the timelines: per-GPU busy and idle time, the idle windows a background job
//! could use (DeepPool's multiplexing), GPU-time amplification, bytes moved per link class
//! (a message's bytes; a collective's ring traffic, see `collective_bytes`) and
//! each rank's peak memory.
//!
//! ```
//! use ralpc_codegen::passes::plan::{self, CostOptions, Costs, Request};
//! use ralpc_codegen::passes as ralpc_passes;
//! use ralpc_passes::ir as ralpc_ir;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/onnx/vgg16/model.onnx");
//! let mut model = ralpc_ir::onnx::import(&path)?;
//! let batch = ralpc_ir::Bindings { batch: Some(32), ..Default::default() };
//! ralpc_ir::bind(&mut model.graph, &batch)?;
//! let info = ralpc_ir::verify(&model.graph)?;
//! let layers = ralpc_passes::layers::build(&model.graph, &info, 32, Default::default())?;
//! let cluster = ralpc_passes::cluster::Cluster::preset("dgx-a100")?;
//! let costs = Costs::new(&layers, &cluster, 8, CostOptions::default());
//! let planned = plan::plan(&costs, &Request::default())?;
//! # let model = ralpc_codegen::ModelRef { name: "vgg16".into(), path: None,
//! #     blake3: String::new(), layers: layers.layers.len() as u32, inputs: Default::default(),
//! #     values: Default::default() };
//! let plan = ralpc_codegen::lower(&costs, &planned.chosen.strategy, model)?;
//! let simulated = ralpc_codegen::simulate(&plan)?;
//! // The simulator agrees with the planner's prediction.
//! let predicted = planned.chosen.evaluation.iteration_time_us;
//! assert!((simulated.iteration_time_us / predicted - 1.0).abs() < 0.05);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;

use crate::{Instruction, LinkClass, Plan};
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

/// The shortest gap worth reporting as an idle window, µs: shorter ones fit no kernel of
/// another job.
pub const MIN_IDLE_WINDOW_US: f64 = 100.0;

/// A stretch of time with nothing running on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct IdleWindow {
    /// Start, µs.
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
    /// Time anything runs (compute or communication), µs.
    pub busy_us: f64,
    /// The rest of the iteration, µs.
    pub idle_us: f64,
    /// Idle stretches of at least [`MIN_IDLE_WINDOW_US`], in order.
    pub idle_windows: Vec<IdleWindow>,
    /// When its last instruction ended, µs.
    pub finish_us: f64,
    /// The most memory its live buffers hold at once, bytes.
    pub peak_memory_bytes: u64,
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
    /// Bytes moved per link class (messages and collectives).
    pub bytes_by_link: BTreeMap<LinkClass, u64>,
    /// Busy GPU time summed over ranks, µs.
    pub gpu_time_us: f64,
    /// GPU time over the single-GPU iteration time.
    pub gpu_sec_amplification: f64,
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

/// When a shared resource (a network interface) is busy. Ranks are simulated one after
/// another, not in time order, so a later reservation may fall into an earlier gap.
#[derive(Clone, Default)]
struct Calendar {
    /// Disjoint busy intervals, by start.
    busy: Vec<(f64, f64)>,
}

impl Calendar {
    /// The earliest start at or after `t` of a free stretch of `d`.
    fn fit(&self, mut t: f64, d: f64) -> f64 {
        for &(start, end) in &self.busy {
            if end <= t {
                continue;
            }
            if start >= t + d {
                break;
            }
            t = end;
        }
        t
    }

    fn book(&mut self, t: f64, d: f64) {
        if d > 0.0 {
            let at = self.busy.partition_point(|&(s, _)| s < t);
            self.busy.insert(at, (t, t + d));
        }
    }
}

/// Books `d` µs on every calendar of `held` at once, at the earliest common free time at
/// or after `t`; that time.
fn reserve(calendars: &mut [Calendar], held: &[usize], mut t: f64, d: f64) -> f64 {
    loop {
        let fits = held
            .iter()
            .map(|&i| calendars[i].fit(t, d))
            .fold(t, f64::max);
        if fits <= t {
            break;
        }
        t = fits;
    }
    for &i in held {
        calendars[i].book(t, d);
    }
    t
}

/// The bytes a collective moves over all its `members`: a ring all-reduce sends
/// `2(n−1)/n` of the tensor per member, an all-gather or reduce-scatter `(n−1)/n`, an
/// all-to-all `bytes` to each of the `n−1` others.
fn collective_bytes(instr: &Instruction, members: usize) -> u64 {
    let n = members as f64;
    let moved = match *instr {
        Instruction::AllReduce { bytes, .. } => 2.0 * (n - 1.0) * bytes as f64,
        Instruction::AllGather { bytes, .. } | Instruction::ReduceScatter { bytes, .. } => {
            (n - 1.0) * bytes as f64
        }
        Instruction::AllToAll { bytes, .. } => n * (n - 1.0) * bytes as f64,
        _ => 0.0,
    };
    moved.round() as u64
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
    // and when its bytes have arrived (messages between servers; 0 otherwise).
    let mut sent: BTreeMap<(u32, u32, u64), (f64, f64)> = BTreeMap::new();
    // Arrival times at each group's current collective, by group.
    let mut arrivals: BTreeMap<u32, BTreeMap<u32, f64>> = BTreeMap::new();
    let mut bytes_sent = 0u64;
    let mut bytes_by_link: BTreeMap<LinkClass, u64> = BTreeMap::new();
    // When each server's network interface is free, sending and receiving.
    let nodes = plan
        .sites
        .iter()
        .map(|s| s.nic as usize + 1)
        .max()
        .unwrap_or(1);
    // Interfaces: 2n is server n's outgoing side, 2n + 1 its incoming side.
    let mut nics = vec![Calendar::default(); 2 * nodes];
    // The interface a rank's traffic to other servers goes through.
    let node = |rank: usize| plan.sites.get(rank).map_or(0, |s| s.nic as usize);
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
                    | Instruction::Recompute { .. }
                    | Instruction::Backward { .. }
                    | Instruction::WeightGradient { .. }
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
                                        Some(&(t, _)) => ready = ready.max(t),
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
                        // Concurrent messages: one latency, the bandwidth parts in turn,
                        // through the server's network interface when one leaves it.
                        let (mut latency, mut transfer) = (0.0f64, 0.0);
                        // Servers the group's messages come from across the network.
                        let mut remote: Vec<usize> = Vec::new();
                        for m in group {
                            if let Instruction::Send {
                                us,
                                latency_us,
                                to: peer,
                                ..
                            }
                            | Instruction::Recv {
                                us,
                                latency_us,
                                from: peer,
                                ..
                            } = *m
                            {
                                latency = latency.max(latency_us);
                                transfer += us - latency_us;
                                if node(peer as usize) != node(rank) {
                                    remote.push(node(peer as usize));
                                }
                            }
                        }
                        // Across servers the bytes flow when the sender's interface and
                        // the receivers' are free, booked when they are sent; receiving
                        // them ends no earlier than they arrive.
                        let mut flowing = start + latency;
                        if sending && !remote.is_empty() {
                            let held: Vec<usize> = remote
                                .iter()
                                .map(|&n| 2 * n + 1)
                                .chain([2 * node(rank)])
                                .collect();
                            flowing = reserve(&mut nics, &held, flowing, transfer);
                        }
                        let mut finish = flowing + transfer;
                        if !sending {
                            for m in group {
                                if let Instruction::Recv { from, tag, .. } = *m {
                                    if let Some(&(_, arrival)) = sent.get(&(from, rank as u32, tag))
                                    {
                                        finish = finish.max(arrival);
                                    }
                                }
                            }
                        }
                        for (j, m) in group.iter().enumerate() {
                            if let Instruction::Send { to, bytes, tag, .. } = *m {
                                let arrival = if node(to as usize) == node(rank) {
                                    0.0
                                } else {
                                    finish
                                };
                                sent.insert((rank as u32, to, tag), (start, arrival));
                                bytes_sent += bytes;
                                if let Some(class) = plan.link_class(&[rank as u32, to]) {
                                    *bytes_by_link.entry(class).or_default() += bytes;
                                }
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
                    Instruction::AllReduce { group, .. }
                    | Instruction::AllGather { group, .. }
                    | Instruction::ReduceScatter { group, .. }
                    | Instruction::AllToAll { group, .. } => {
                        let arrived = c.send_free.max(c.recv_free).max(ready(&ended, rank, index));
                        let waiting = arrivals.entry(group).or_default();
                        waiting.insert(rank as u32, arrived);
                        let members = &plan.groups[group as usize];
                        if waiting.len() < members.len() {
                            break;
                        }
                        // Everyone is here: all start together, once the network
                        // interfaces of the servers it spans are free.
                        let mut start = waiting.values().copied().fold(0.0, f64::max);
                        arrivals.remove(&group);
                        let class = plan.link_class(members);
                        let spanned: std::collections::BTreeSet<usize> =
                            members.iter().map(|&m| node(m as usize)).collect();
                        if spanned.len() > 1 {
                            // Its bytes hold the interfaces; its latency does not.
                            let held: Vec<usize> =
                                spanned.iter().flat_map(|&n| [2 * n, 2 * n + 1]).collect();
                            let flowing = (us - instr.latency_us()).max(0.0);
                            start = reserve(&mut nics, &held, start, flowing);
                        }
                        if let Some(class) = class {
                            let moved = collective_bytes(instr, members.len());
                            *bytes_by_link.entry(class).or_default() += moved;
                        }
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
    let iteration = spans.iter().flatten().map(|s| s.end_us).fold(0.0, f64::max);
    let peaks = plan.peak_memory_bytes();
    let ranks: Vec<RankTimeline> = spans
        .into_iter()
        .zip(peaks)
        .map(|(spans, peak)| timeline(spans, iteration, peak))
        .collect();
    let gpu_time: f64 = ranks.iter().map(|r| r.busy_us).sum();
    let single = plan.predicted.single_gpu_time_us;
    Ok(Simulation {
        iteration_time_us: iteration,
        samples_per_second: if iteration > 0.0 {
            plan.batch as f64 / (iteration * 1e-6)
        } else {
            0.0
        },
        ranks,
        bytes_sent,
        bytes_by_link,
        gpu_time_us: gpu_time,
        gpu_sec_amplification: if single > 0.0 { gpu_time / single } else { 1.0 },
    })
}

/// One rank's figures from its spans, in an iteration of `iteration` µs. A rank with no
/// work holds no GPU: it is neither busy nor idle.
fn timeline(spans: Vec<Span>, iteration: f64, peak_memory_bytes: u64) -> RankTimeline {
    let time = |s: Stream| -> f64 {
        spans
            .iter()
            .filter(|x| x.stream == s)
            .map(|x| x.end_us - x.start_us)
            .sum()
    };
    // The union of both streams' spans, and the gaps between.
    let mut intervals: Vec<(f64, f64)> = spans.iter().map(|s| (s.start_us, s.end_us)).collect();
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let (mut busy, mut covered) = (0.0, 0.0f64);
    let mut idle_windows = Vec::new();
    let gap = |from: f64, to: f64, windows: &mut Vec<IdleWindow>| {
        if to - from >= MIN_IDLE_WINDOW_US {
            windows.push(IdleWindow {
                start_us: from,
                end_us: to,
            });
        }
    };
    for &(start, end) in &intervals {
        if start > covered {
            gap(covered, start, &mut idle_windows);
        }
        if end > covered {
            busy += end - start.max(covered);
            covered = end;
        }
    }
    let used = !spans.is_empty();
    if used {
        gap(covered, iteration, &mut idle_windows);
    }
    RankTimeline {
        compute_us: time(Stream::Compute),
        communication_us: time(Stream::Communication),
        busy_us: busy,
        idle_us: if used { iteration - busy } else { 0.0 },
        idle_windows,
        finish_us: covered,
        peak_memory_bytes,
        spans,
    }
}
