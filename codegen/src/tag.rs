//! What a message carries, as its `tag` in `ralpc-plan/3` numbers it.
//!
//! The lowering numbers every message by the edge of the layer graph whose tensor it
//! moves; an executor decodes the number back with the same [`Tags`], so the two agree by
//! construction rather than by matching arithmetic. Ranges, in order: each edge's forward
//! and backward messages per microbatch; the forward messages a recomputation sends again;
//! the halo rows the pieces of a row-split consumer exchange.

/// What one message moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// Edge `edge`'s tensor on microbatch `microbatch`, or its gradient (`backward`).
    Edge {
        /// The edge (index into the lowering's edges: every layer's inputs from other
        /// layers, in layer order).
        edge: usize,
        /// The microbatch.
        microbatch: u32,
        /// Its gradient, returning from the consumer to the producer.
        backward: bool,
    },
    /// Edge `edge`'s tensor sent again for a recomputation of its consumer.
    Again {
        /// The edge.
        edge: usize,
        /// The microbatch.
        microbatch: u32,
    },
    /// Rows of edge `edge`'s tensor around a piece of its row-split consumer (a
    /// convolution or pooling), from the piece holding them.
    Halo {
        /// The edge.
        edge: usize,
        /// The microbatch.
        microbatch: u32,
        /// Which pass exchanges them.
        pass: HaloPass,
    },
}

/// When halo rows move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HaloPass {
    /// Before the forward pass: the rows themselves.
    Forward,
    /// After the backward pass: their gradient, back to the piece holding them.
    Backward,
    /// Before a recomputation's forward pass: the rows again.
    Again,
}

const HALO_PASSES: [HaloPass; 3] = [HaloPass::Forward, HaloPass::Backward, HaloPass::Again];

/// The numbering of a plan's tags: its edges and microbatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tags {
    /// Edges between layers.
    pub edges: usize,
    /// Microbatches per iteration.
    pub microbatches: u32,
}

impl Tags {
    fn passes(&self) -> u64 {
        self.edges as u64 * u64::from(self.microbatches.max(1))
    }

    fn pass(&self, edge: usize, microbatch: u32) -> u64 {
        edge as u64 * u64::from(self.microbatches.max(1)) + u64::from(microbatch)
    }

    /// The number of `tag`.
    pub fn encode(&self, tag: Tag) -> u64 {
        let all = self.passes();
        match tag {
            Tag::Edge {
                edge,
                microbatch,
                backward,
            } => self.pass(edge, microbatch) * 2 + u64::from(backward),
            // Even numbers past the edges' (the forward tag's number, shifted).
            Tag::Again { edge, microbatch } => 2 * all + self.pass(edge, microbatch) * 2,
            Tag::Halo {
                edge,
                microbatch,
                pass,
            } => {
                let p = HALO_PASSES.iter().position(|&h| h == pass).unwrap_or(0) as u64;
                4 * all + self.pass(edge, microbatch) * 3 + p
            }
        }
    }

    /// What tag number `n` carries; `None` when it names no edge of the plan.
    pub fn decode(&self, n: u64) -> Option<Tag> {
        let all = self.passes();
        let m = u64::from(self.microbatches.max(1));
        let split = |pass: u64| ((pass / m) as usize, (pass % m) as u32);
        let tag = if n < 2 * all {
            let (edge, microbatch) = split(n / 2);
            Tag::Edge {
                edge,
                microbatch,
                backward: n % 2 == 1,
            }
        } else if n < 4 * all {
            if n % 2 == 1 {
                return None;
            }
            let (edge, microbatch) = split((n - 2 * all) / 2);
            Tag::Again { edge, microbatch }
        } else if n < 7 * all {
            let n = n - 4 * all;
            let (edge, microbatch) = split(n / 3);
            Tag::Halo {
                edge,
                microbatch,
                pass: HALO_PASSES[(n % 3) as usize],
            }
        } else {
            return None;
        };
        Some(tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_decodes_to_itself_and_numbers_are_distinct() {
        let tags = Tags {
            edges: 5,
            microbatches: 3,
        };
        let mut all = Vec::new();
        for edge in 0..5 {
            for microbatch in 0..3 {
                let mut each = vec![
                    Tag::Edge {
                        edge,
                        microbatch,
                        backward: false,
                    },
                    Tag::Edge {
                        edge,
                        microbatch,
                        backward: true,
                    },
                    Tag::Again { edge, microbatch },
                ];
                each.extend(HALO_PASSES.map(|pass| Tag::Halo {
                    edge,
                    microbatch,
                    pass,
                }));
                for tag in each {
                    let n = tags.encode(tag);
                    assert_eq!(tags.decode(n), Some(tag));
                    all.push(n);
                }
            }
        }
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5 * 3 * 6);
        assert_eq!(tags.decode(5 * 3 * 7), None);
        assert_eq!(tags.decode(5 * 3 * 2 + 1), None);
    }
}
