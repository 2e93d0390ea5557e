//! Messages received device to device in the order their sender sends them. A device's
//! point-to-point path (NCCL's send and receive) has no tags: the messages one rank sends
//! another pair with the receives in the order both issue them. A rank's program may read
//! a peer's messages in another order than the peer sends them (it receives each where its
//! layer needs it), so a receive first posts the receives of every message the sender sends
//! before it, and keeps what they bring until their own receive instruction. Posting a
//! receive does not wait for it, so this costs the early buffers only.

use super::failure::bug;
use super::*;

/// A rank's receives, in its senders' orders.
#[derive(Default)]
pub(super) struct Arrivals {
    /// Per sender, the tags of the float messages it sends this rank in a step, in its
    /// program's order (integer messages go through the communicator, by tag).
    order: BTreeMap<u32, Vec<u64>>,
    /// Per sender, how many of this step's messages were posted.
    posted: BTreeMap<u32, usize>,
    /// Messages posted before their receive instruction, by (sender, tag).
    early: BTreeMap<(u32, u64), Floats>,
}

impl Arrivals {
    /// The orders in which `p`'s ranks send rank `rank` their float messages.
    pub(super) fn new(p: &Prepared<'_>, rank: u32) -> Arrivals {
        let tags = Tags {
            edges: p.edges.len(),
            microbatches: p.exe.plan.microbatches,
        };
        let floats = |tag: u64| match tags.decode(tag) {
            Some(Tag::Edge {
                edge,
                backward: false,
                ..
            })
            | Some(Tag::Again { edge, .. }) => p
                .edges
                .get(edge)
                .is_some_and(|e| p.exe.info.ty(e.value).dtype.is_float()),
            Some(_) => true,
            None => false,
        };
        let mut order: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (from, program) in p.exe.plan.programs.iter().enumerate() {
            for instruction in program {
                if let Instruction::Send { to, tag, .. } = *instruction {
                    if to == rank && floats(tag) {
                        order.entry(from as u32).or_default().push(tag);
                    }
                }
            }
        }
        Arrivals {
            order,
            ..Arrivals::default()
        }
    }
}

impl Rank<'_, '_> {
    /// The `n` elements of message `tag` from rank `from`, received device to device (as
    /// [`Compute::recv`]), after posting the receives of every message `from` sends this
    /// rank before it. `None`: the device has no path to `from`, nothing was received, and
    /// the message comes through the communicator.
    pub(super) fn device_recv(
        &mut self,
        from: u32,
        tag: u64,
        n: usize,
    ) -> Result<Option<Floats>, RankError> {
        if let Some(data) = self.arrivals.early.remove(&(from, tag)) {
            return Ok(Some(data));
        }
        let posted = self.arrivals.posted.get(&from).copied().unwrap_or(0);
        let remaining = self
            .arrivals
            .order
            .get(&from)
            .and_then(|order| order.get(posted..))
            .unwrap_or_default();
        let Some(at) = remaining.iter().position(|&t| t == tag) else {
            // Not one of the sender's float messages in this step's remaining order.
            return self.compute.recv(from, tag, n).map_err(RankError::from);
        };
        let earlier = remaining[..at].to_vec();
        for before in earlier {
            let len = volume(&self.incoming_piece(from, before)?);
            match self
                .compute
                .recv(from, before, len)
                .map_err(RankError::from)?
            {
                Some(data) => {
                    self.arrivals.early.insert((from, before), data);
                }
                // No path: every message goes through the communicator, by tag.
                None => return Ok(None),
            }
        }
        self.arrivals.posted.insert(from, posted + at + 1);
        self.compute.recv(from, tag, n).map_err(RankError::from)
    }

    /// A new step: every sender's order starts again. A message posted early and never
    /// read is a plan whose receives do not match its sends.
    pub(super) fn restart_arrivals(&mut self) -> Result<(), RankError> {
        if let Some(&(from, tag)) = self.arrivals.early.keys().next() {
            return Err(bug(format!(
                "rank {from} sent message {tag}, which this rank's program never receives"
            )));
        }
        self.arrivals.posted.clear();
        Ok(())
    }

    /// The box of its tensor (or gradient) that message `tag` from rank `from` carries to
    /// this rank.
    pub(super) fn incoming_piece(&self, from: u32, tag: u64) -> Result<Region, RankError> {
        Ok(match self.decode(tag)? {
            Tag::Edge {
                edge,
                backward: true,
                ..
            } => intersect(&self.need(edge, from)?, &self.held(edge, self.rank)?),
            Tag::Edge { edge, .. } | Tag::Again { edge, .. } => {
                intersect(&self.need(edge, self.rank)?, &self.held(edge, from)?)
            }
            Tag::Halo { edge, pass, .. } => self.halo_piece(from, edge, pass)?,
        })
    }
}
