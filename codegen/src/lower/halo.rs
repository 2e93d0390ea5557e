//! Halo exchanges: the rows around each piece of a convolution or pooling split by rows,
//! sent by the pieces holding them before the forward pass (and a recomputation's), and
//! their gradients returned after the backward pass, ahead of the input-gradient sums.

use ralpc_passes::plan::input_share;

use super::buffers::Key;
use super::Lowering;
use crate::tag::{HaloPass, Tag};

/// One halo message: `rows` rows of a tensor from the rank holding them to the rank whose
/// windows read them.
struct HaloMessage {
    holder: u32,
    reader: u32,
    rows: u64,
}

impl Lowering<'_, '_> {
    /// Layer `l`'s halo exchanges on microbatch `mb` in `pass`: for each input edge with
    /// one, its tag and its messages with their bytes (none unless `l` is split by rows).
    fn halo_exchanges(
        &self,
        l: usize,
        mb: u32,
        pass: HaloPass,
    ) -> Vec<(u64, Vec<(HaloMessage, u64)>)> {
        self.into[l]
            .iter()
            .filter_map(|&ei| {
                let (messages, row) = self.halo_messages(ei);
                if messages.is_empty() {
                    return None;
                }
                let tag = self.tags().encode(Tag::Halo {
                    edge: ei,
                    microbatch: mb,
                    pass,
                });
                let sized = messages
                    .into_iter()
                    .map(|m| {
                        let bytes = (m.rows as f64 * row).round() as u64;
                        (m, bytes)
                    })
                    .collect();
                Some((tag, sized))
            })
            .collect()
    }

    /// Edge `ei`'s halo messages and the bytes of one row of a rank's share on one
    /// microbatch.
    fn halo_messages(&self, ei: usize) -> (Vec<HaloMessage>, f64) {
        let e = &self.edges[ei];
        let layer = &self.costs.graph.layers[e.consumer];
        let (split, first) = self.place(e.consumer);
        let (Some(halo), true) = (&layer.halo, e.halo && split.attribute > 1) else {
            return (Vec::new(), 0.0);
        };
        let (a, p) = (split.attribute, split.parameter.max(1));
        let mut messages = Vec::new();
        for k in 0..split.degree() {
            let (si, ai, pi) = (k / (a * p), (k / p) % a, k % p);
            for (j, rows) in halo.window.halo_from((ai, a)) {
                messages.push(HaloMessage {
                    holder: first + (si * a + j) * p + pi,
                    reader: first + k,
                    rows: rows.end - rows.start,
                });
            }
        }
        let share = input_share(layer.kind, split) * f64::from(a);
        let row = e.bytes * share
            / halo.window.input.max(1) as f64
            / f64::from(self.strategy.microbatches);
        (messages, row)
    }

    /// Before layer `l`'s forward pass (`pass`: its first, or a recomputation's) on
    /// microbatch `mb`: every halo of its inputs, received into buffers the pass reads
    /// (added to `inputs`).
    pub(super) fn halos_forward(
        &mut self,
        l: usize,
        mb: u32,
        pass: HaloPass,
        inputs: &mut Vec<Key>,
    ) {
        for (tag, messages) in self.halo_exchanges(l, mb, pass) {
            let payload = match pass {
                HaloPass::Again => Key::received_again(l, mb, tag),
                _ => Key::received(l, mb, tag),
            };
            // The holder sends from what the layer reads there.
            let sources = inputs.clone();
            for (m, bytes) in &messages {
                let at = self.send(m.holder, m.reader, *bytes, tag, payload);
                for &key in &sources {
                    self.buffers.read(m.holder, key, at);
                }
            }
            for (m, bytes) in &messages {
                self.recv(m.holder, m.reader, *bytes, tag, payload);
            }
            inputs.push(payload);
        }
    }

    /// After layer `l`'s backward pass on microbatch `mb`: the gradients of every halo
    /// its ranks read, returned to the ranks holding those rows, which add them into
    /// `input_gradient` before it is summed or sent on.
    pub(super) fn halos_backward(&mut self, l: usize, mb: u32, input_gradient: Key) {
        for (tag, messages) in self.halo_exchanges(l, mb, HaloPass::Backward) {
            for (m, bytes) in &messages {
                self.send(m.reader, m.holder, *bytes, tag, input_gradient);
            }
            for (m, bytes) in &messages {
                let at = self.recv(m.reader, m.holder, *bytes, tag, Key::received(l, mb, tag));
                self.buffers.read(m.holder, input_gradient, at);
                self.buffers.write(m.holder, input_gradient, at);
            }
        }
    }
}
