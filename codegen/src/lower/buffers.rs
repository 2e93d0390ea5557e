//! The buffers a lowering's instructions use, recorded as instructions are emitted.

use std::collections::BTreeMap;

use crate::plan::{Buffer, BufferKind};

/// Which buffer of a rank: its kind, layer and microbatch, and for a message its tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    kind: BufferKind,
    layer: Option<u32>,
    microbatch: Option<u32>,
    tag: Option<u64>,
    /// Received again, by a recomputation.
    again: bool,
}

impl Key {
    fn of(kind: BufferKind, layer: Option<usize>, microbatch: Option<u32>) -> Key {
        Key {
            kind,
            layer: layer.map(|l| l as u32),
            microbatch,
            tag: None,
            again: false,
        }
    }

    /// Layer `l`'s weights, gradients or optimizer state.
    pub(super) fn layer(kind: BufferKind, l: usize) -> Key {
        Key::of(kind, Some(l), None)
    }

    /// Layer `l`'s activation or input gradient on microbatch `mb`.
    pub(super) fn pass(kind: BufferKind, l: usize, mb: u32) -> Key {
        Key::of(kind, Some(l), Some(mb))
    }

    /// A rank-wide buffer (workspace, weight versions).
    pub(super) fn rank(kind: BufferKind) -> Key {
        Key::of(kind, None, None)
    }

    /// Layer `l`'s weights gathered whole (ZeRO-3, an all-gather's payload) while its
    /// backward on microbatch `mb` runs.
    pub(super) fn gathered(l: usize, mb: u32) -> Key {
        Key::of(BufferKind::Received, Some(l), Some(mb))
    }

    /// The payload of the messages of `tag` into layer `l` (forward) or out of it
    /// (backward), on microbatch `mb`.
    pub(super) fn received(l: usize, mb: u32, tag: u64) -> Key {
        Key {
            tag: Some(tag),
            ..Key::of(BufferKind::Received, Some(l), Some(mb))
        }
    }

    /// The payload of the forward messages of `tag` into layer `l` when they arrive again:
    /// for its recomputation, or for its backward pass (an input it kept as its piece). A
    /// buffer of its own, live only around that pass.
    pub(super) fn received_again(l: usize, mb: u32, tag: u64) -> Key {
        Key {
            again: true,
            ..Key::received(l, mb, tag)
        }
    }
}

/// Per rank, its buffers in the order they were first used.
pub(super) struct Tracker {
    index: Vec<BTreeMap<Key, usize>>,
    buffers: Vec<Vec<Buffer>>,
}

impl Tracker {
    pub(super) fn new(ranks: usize) -> Tracker {
        Tracker {
            index: vec![BTreeMap::new(); ranks],
            buffers: vec![Vec::new(); ranks],
        }
    }

    /// Adds `bytes` to buffer `key` of `rank`, creating it.
    pub(super) fn grow(&mut self, rank: u32, key: Key, bytes: f64) {
        let r = rank as usize;
        let next = self.buffers[r].len();
        let i = *self.index[r].entry(key).or_insert(next);
        if i == next {
            self.buffers[r].push(Buffer {
                kind: key.kind,
                layer: key.layer,
                microbatch: key.microbatch,
                bytes: 0,
                writes: Vec::new(),
                reads: Vec::new(),
                live: [0, 0],
            });
        }
        self.buffers[r][i].bytes += bytes.max(0.0).round() as u64;
    }

    fn mark(&mut self, rank: u32, key: Key, at: usize, write: bool) {
        let r = rank as usize;
        let Some(&i) = self.index[r].get(&key) else {
            return;
        };
        let b = &mut self.buffers[r][i];
        let list = if write { &mut b.writes } else { &mut b.reads };
        let at = at as u32;
        if list.last() != Some(&at) {
            list.push(at);
        }
    }

    /// Instruction `at` of `rank` reads `key` (nothing when the rank has no such buffer:
    /// a layer without weights, a tensor it holds whole).
    pub(super) fn read(&mut self, rank: u32, key: Key, at: usize) {
        self.mark(rank, key, at, false);
    }

    /// Instruction `at` of `rank` writes `key`.
    pub(super) fn write(&mut self, rank: u32, key: Key, at: usize) {
        self.mark(rank, key, at, true);
    }

    /// The buffers with their live ranges, given each rank's program length: persistent
    /// ones live throughout, the others from their first write to their last use.
    pub(super) fn finish(self, lengths: &[usize]) -> Vec<Vec<Buffer>> {
        self.buffers
            .into_iter()
            .zip(lengths)
            .map(|(buffers, &len)| {
                let last = len.saturating_sub(1) as u32;
                buffers
                    .into_iter()
                    .filter(|b| len > 0 && (b.kind.persistent() || !b.writes.is_empty()))
                    .map(|mut b| {
                        b.live = if b.kind.persistent() {
                            [0, last]
                        } else {
                            let first = b.writes[0];
                            let end = b.reads.iter().chain(&b.writes).copied().max();
                            [first, end.unwrap_or(first)]
                        };
                        b
                    })
                    .collect()
            })
            .collect()
    }
}
