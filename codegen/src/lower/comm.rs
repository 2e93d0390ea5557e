//! The lowering's messages and collectives: point-to-point sends and receives, in-place
//! all-reduces, reduce-scatters and all-gathers over groups, and the reshardings between
//! layers placed differently; each records the buffers it reads and writes.

use ralpc_passes::cost::Comm;
use ralpc_passes::plan::{input_share, output_share};

use super::{Key, Lowering, Pattern};
use crate::plan::{BufferKind, Instruction};

/// A reduce-scatter (`scatter`) or all-gather of a tensor of `bytes` over `group`.
fn half(scatter: bool, group: u32, bytes: f64, us: f64, latency_us: f64) -> Instruction {
    let bytes = bytes.round() as u64;
    if scatter {
        Instruction::ReduceScatter {
            group,
            bytes,
            us,
            latency_us,
        }
    } else {
        Instruction::AllGather {
            group,
            bytes,
            us,
            latency_us,
        }
    }
}

impl Lowering<'_, '_> {
    /// A message of `tag` from `from`, which reads `source` there; its index in `from`'s
    /// program.
    pub(super) fn send(&mut self, from: u32, to: u32, bytes: u64, tag: u64, source: Key) -> usize {
        let link = self.costs.cluster.link(from, to);
        let at = self.push(
            from,
            Instruction::Send {
                to,
                bytes,
                tag,
                us: link.transfer_us(bytes as f64),
                latency_us: link.latency_us,
            },
        );
        self.buffers.read(from, source, at);
        at
    }

    /// A message of `tag` into `to`, written to `target` there; its index in `to`'s
    /// program.
    pub(super) fn recv(&mut self, from: u32, to: u32, bytes: u64, tag: u64, target: Key) -> usize {
        let link = self.costs.cluster.link(from, to);
        let at = self.push(
            to,
            Instruction::Recv {
                from,
                bytes,
                tag,
                us: link.transfer_us(bytes as f64),
                latency_us: link.latency_us,
            },
        );
        self.buffers.grow(to, target, bytes as f64);
        self.buffers.write(to, target, at);
        at
    }

    /// An all-reduce of `bytes` over every group of `groups` (each a list of ranks), in
    /// place on the buffers `data` of each member.
    pub(super) fn all_reduce(&mut self, groups: Vec<Vec<u32>>, bytes: f64, data: &[Key]) {
        self.in_place(groups, bytes, data, |comm, ranks, bytes| {
            let c = comm.all_reduce(ranks, bytes);
            move |group| Instruction::AllReduce {
                group,
                bytes: bytes.round() as u64,
                us: c.us,
                latency_us: c.latency_us,
                tied: None,
            }
        });
    }

    /// A reduce-scatter of `bytes` over every group of `groups`, in place (a gradient
    /// bucket under ZeRO-1, a row-parallel layer's partial sums), priced as the first half
    /// of the all-reduce it replaces.
    pub(super) fn reduce_scatter(&mut self, groups: Vec<Vec<u32>>, bytes: f64, data: &[Key]) {
        self.half_all_reduce(true, groups, bytes, data);
    }

    /// An all-gather of `bytes` over every group of `groups`, in place (ZeRO-1's updated
    /// weights, a class-split output's loss statistics), the all-reduce's second half.
    pub(super) fn all_gather(&mut self, groups: Vec<Vec<u32>>, bytes: f64, data: &[Key]) {
        self.half_all_reduce(false, groups, bytes, data);
    }

    pub(super) fn half_all_reduce(
        &mut self,
        scatter: bool,
        groups: Vec<Vec<u32>>,
        bytes: f64,
        data: &[Key],
    ) {
        self.in_place(groups, bytes, data, |comm, ranks, bytes| {
            let c = comm.all_reduce(ranks, bytes);
            move |group| half(scatter, group, bytes, c.us / 2.0, c.latency_us / 2.0)
        });
    }

    /// A collective over every group of `groups` with two or more ranks that reads and
    /// writes the buffers `data` of each member; `make` prices it for a group.
    pub(super) fn in_place<F: Fn(u32) -> Instruction>(
        &mut self,
        groups: Vec<Vec<u32>>,
        bytes: f64,
        data: &[Key],
        make: impl Fn(&Comm<'_>, &[u32], f64) -> F,
    ) {
        for mut ranks in groups {
            ranks.sort_unstable();
            if ranks.len() < 2 || bytes <= 0.0 {
                continue;
            }
            let instruction = make(&self.comm, &ranks, bytes);
            let group = self.group(&ranks);
            for &r in &ranks {
                let at = self.push(r, instruction(group));
                for &key in data {
                    self.buffers.read(r, key, at);
                    self.buffers.write(r, key, at);
                }
            }
        }
    }

    /// The index of communicator group `ranks` (sorted), adding it.
    pub(super) fn group(&mut self, ranks: &[u32]) -> u32 {
        let next = self.groups.len() as u32;
        *self.groups.entry(ranks.to_vec()).or_insert(next)
    }

    /// A resharding collective `make(group, us)` over `ranks`, reading `source` and
    /// writing `target` on every member.
    pub(super) fn reshard(
        &mut self,
        ranks: &[u32],
        us: f64,
        make: impl Fn(u32, f64) -> Instruction,
        source: Key,
        target: Key,
        bytes: f64,
    ) {
        let group = self.group(ranks);
        for &r in ranks {
            let at = self.push(r, make(group, us));
            self.buffers.read(r, source, at);
            self.buffers.grow(r, target, bytes);
            self.buffers.write(r, target, at);
        }
    }

    /// Moves edge `ei`'s tensor on microbatch `mb` as its pattern's collective (forward,
    /// or its gradient backward); false when it moves as messages.
    pub(super) fn collective_edge(&mut self, ei: usize, mb: u32, backward: bool) -> bool {
        let e = &self.edges[ei];
        let (producer, consumer) = (e.producer, e.consumer);
        let tag = self.tag(ei, mb, backward);
        let (source, target) = if backward {
            (
                Key::pass(BufferKind::InputGradient, consumer, mb),
                Key::received(producer, mb, tag),
            )
        } else {
            (
                Key::pass(BufferKind::Activation, producer, mb),
                Key::received(consumer, mb, tag),
            )
        };
        self.collective_between(ei, backward, source, target)
    }

    /// Edge `ei`'s tensor (or its gradient, `backward`) moved by its pattern's collective
    /// from buffer `source` into `target`; false when it moves as messages.
    pub(super) fn collective_between(
        &mut self,
        ei: usize,
        backward: bool,
        source: Key,
        target: Key,
    ) -> bool {
        let bytes = self.edges[ei].bytes / f64::from(self.strategy.microbatches);
        match self.patterns[ei].clone() {
            Pattern::Messages => false,
            Pattern::Gather { ranks, scatter } => {
                // Each group gathers the box its consumers read (the whole tensor, or a
                // sample shard's).
                let consumer = self.edges[ei].consumer;
                let (split, _) = self.place(consumer);
                let bytes = bytes * input_share(self.edges[ei].reads_as, split);
                let all = self.ranks(consumer);
                if !backward {
                    self.gather_in_groups(&ranks, all, bytes, false, source, target);
                } else if scatter {
                    self.gather_in_groups(&ranks, all, bytes, true, source, target);
                }
                // Otherwise every rank holds the whole gradient and keeps its piece.
                true
            }
            Pattern::GatherGradient { ranks } => {
                if backward {
                    let producer = self.edges[ei].producer;
                    let (split, _) = self.place(producer);
                    let kind = self.costs.graph.layers[producer].kind;
                    let bytes = bytes * output_share(kind, split);
                    let all = self.ranks(producer);
                    self.gather_in_groups(&ranks, all, bytes, false, source, target);
                }
                true
            }
            Pattern::AllToAll { ranks, fraction } => {
                let pair = fraction * bytes;
                let (lo, hi) = (ranks[0], ranks[ranks.len() - 1]);
                let busiest = pair * (ranks.len() - 1) as f64;
                let link = self.costs.cluster.link(lo, hi);
                let us = link.transfer_us(busiest);
                let make = |group, us| Instruction::AllToAll {
                    group,
                    bytes: pair.round() as u64,
                    us,
                    latency_us: link.latency_us,
                };
                self.reshard(&ranks, us, make, source, target, busiest);
                true
            }
        }
    }

    /// An all-gather of `bytes` (a reduce-scatter when `scatter`) over `ranks` and each of
    /// its copies covering `all`, from `source` into `target` on every member.
    pub(super) fn gather_in_groups(
        &mut self,
        ranks: &[u32],
        all: std::ops::Range<u32>,
        bytes: f64,
        scatter: bool,
        source: Key,
        target: Key,
    ) {
        let n = ranks.len() as f64;
        let c = if scatter {
            self.comm.reduce_scatter(ranks, bytes)
        } else {
            self.comm.all_gather(ranks, bytes)
        };
        let make = |group, us| half(scatter, group, bytes, us, c.latency_us);
        // What each member receives and keeps.
        let grows = if scatter {
            bytes / n
        } else {
            bytes * (n - 1.0) / n
        };
        for group in Self::copies(ranks, all) {
            self.reshard(&group, c.us, make, source, target, grows);
        }
    }

    /// The copies of rank 0's group (`ranks`) that together cover `all`: the same pattern
    /// shifted to each rank not yet in a copy.
    pub(super) fn copies(ranks: &[u32], all: std::ops::Range<u32>) -> Vec<Vec<u32>> {
        let mut used = vec![false; (all.end - all.start) as usize];
        let mut out = Vec::new();
        for start in all.clone() {
            if used[(start - all.start) as usize] {
                continue;
            }
            let shift = start - ranks[0];
            let copy: Vec<u32> = ranks.iter().map(|r| r + shift).collect();
            if copy
                .iter()
                .any(|&r| r >= all.end || used[(r - all.start) as usize])
            {
                continue;
            }
            for &r in &copy {
                used[(r - all.start) as usize] = true;
            }
            out.push(copy);
        }
        out
    }
}
