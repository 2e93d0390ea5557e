//! Halo rows: what a convolution or pooling split by rows reads beyond its own piece.
//!
//! Piece `i` of `n` of a row split computes output rows `⌊i·O/n⌋..⌊(i+1)·O/n⌋` and holds
//! input rows `⌊i·I/n⌋..⌊(i+1)·I/n⌋` ([`View`](super::View)'s pieces). Its windows read
//! input rows a little outside that piece: the halo, which the neighbouring pieces hold and
//! send before the forward pass (their gradients return the other way after the backward
//! pass). [`Window`] is the row axis of the layer's window op; the lowering places the
//! halo messages from it and the executors cut the same rows from it, so the two agree by
//! construction.

use std::ops::Range;

use ralpc_ir::{Graph, GraphInfo, NodeId, Op, Padding};

/// The first spatial axis (rows) of a convolution or pooling: sizes and window geometry.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Input rows.
    pub input: u64,
    /// Output rows.
    pub output: u64,
    /// Rows one window spans: `(kernel − 1)·dilation + 1`.
    pub extent: u64,
    /// Rows between windows.
    pub stride: u64,
    /// Padding rows before the first input row (after `auto_pad`).
    pub pad_before: u64,
}

impl Window {
    /// The row axis of node `node`'s window, for a 2-D or higher Conv or a Pool whose
    /// input and output shapes are known; `None` otherwise (a transposed convolution's
    /// rows map the other way).
    pub fn of(graph: &Graph, info: &GraphInfo, node: NodeId) -> Option<Window> {
        let n = graph.node(node);
        let x = n.inputs.first().copied().flatten()?;
        let input_shape = info.ty(x).shape.as_sizes()?;
        let output_shape = info.ty(*n.outputs.first()?).shape.as_sizes()?;
        let spatial = input_shape.len().checked_sub(2).filter(|&k| k >= 1)?;
        let (kernel, strides, dilations, padding) = match &n.op {
            Op::Conv(c) => {
                let kernel = match &c.kernel {
                    Some(k) => k.first().copied()?,
                    None => {
                        let w = n.inputs.get(1).copied().flatten()?;
                        info.ty(w).shape.as_sizes()?.get(2).copied()?
                    }
                };
                (kernel, &c.strides, &c.dilations, &c.padding)
            }
            Op::Pool(p) => (
                p.kernel.first().copied()?,
                &p.strides,
                &p.dilations,
                &p.padding,
            ),
            _ => return None,
        };
        let first = |v: &Option<Vec<u64>>| v.as_ref().and_then(|v| v.first().copied()).unwrap_or(1);
        let (stride, dilation) = (first(strides).max(1), first(dilations).max(1));
        let extent = kernel
            .checked_sub(1)?
            .checked_mul(dilation)?
            .checked_add(1)?;
        let (input, output) = (*input_shape.get(2)?, *output_shape.get(2)?);
        let pad_before = match padding {
            Padding::Explicit(p) if p.is_empty() => 0,
            Padding::Valid => 0,
            Padding::Explicit(p) if p.len() == 2 * spatial => p[0],
            Padding::Explicit(_) => return None,
            Padding::SameUpper | Padding::SameLower => {
                let total = ((input.div_ceil(stride) - 1) * stride + extent).saturating_sub(input);
                match padding {
                    Padding::SameUpper => total / 2,
                    _ => total - total / 2,
                }
            }
        };
        (output > 0).then_some(Window {
            input,
            output,
            extent,
            stride,
            pad_before,
        })
    }

    /// The output rows piece `(i, n)` computes.
    pub fn output_rows(&self, (i, n): (u32, u32)) -> Range<u64> {
        piece(i, n, self.output)
    }

    /// The input rows piece `(i, n)` holds (the input's piece, as a row split delivers it).
    pub fn held_rows(&self, (i, n): (u32, u32)) -> Range<u64> {
        piece(i, n, self.input)
    }

    /// The input rows piece `(i, n)`'s windows read, clipped to the input; and the
    /// padding rows above and below them that the piece's windows read as zeros (or
    /// skip, for a max pool): the padding the piece computes with.
    pub fn read_rows(&self, at: (u32, u32)) -> (Range<u64>, (u64, u64)) {
        let out = self.output_rows(at);
        if out.is_empty() {
            return (0..0, (0, 0));
        }
        let start = i128::from(out.start) * i128::from(self.stride) - i128::from(self.pad_before);
        let end = i128::from(out.end - 1) * i128::from(self.stride) - i128::from(self.pad_before)
            + i128::from(self.extent);
        let input = i128::from(self.input);
        let (lo, hi) = (
            start.clamp(0, input),
            end.clamp(0, input).max(start.clamp(0, input)),
        );
        let before = (lo - start).max(0) as u64;
        let after = (end - hi).max(0) as u64;
        (lo as u64..hi as u64, (before, after))
    }

    /// How many rows piece `at` reads beyond its own: its halo's size.
    pub fn halo_rows(&self, at: (u32, u32)) -> u64 {
        let (reads, _) = self.read_rows(at);
        let own = self.held_rows(at);
        let overlap = reads
            .end
            .min(own.end)
            .saturating_sub(reads.start.max(own.start));
        (reads.end - reads.start) - overlap
    }

    /// The pieces whose input rows piece `at` of `n` reads besides its own, with the
    /// rows each sends it: its halo, in piece order.
    pub fn halo_from(&self, at: (u32, u32)) -> Vec<(u32, Range<u64>)> {
        let (reads, _) = self.read_rows(at);
        (0..at.1)
            .filter(|&j| j != at.0)
            .filter_map(|j| {
                let held = self.held_rows((j, at.1));
                let rows = reads.start.max(held.start)..reads.end.min(held.end);
                (!rows.is_empty()).then_some((j, rows))
            })
            .collect()
    }
}

fn piece(i: u32, n: u32, len: u64) -> Range<u64> {
    let (i, n) = (u64::from(i), u64::from(n.max(1)));
    i * len / n..(i + 1) * len / n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv3x3(input: u64) -> Window {
        Window {
            input,
            output: input,
            extent: 3,
            stride: 1,
            pad_before: 1,
        }
    }

    #[test]
    fn a_same_convolution_reads_one_row_from_each_neighbour() {
        let w = conv3x3(8);
        assert_eq!(w.read_rows((0, 2)), (0..5, (1, 0)));
        assert_eq!(w.read_rows((1, 2)), (3..8, (0, 1)));
        assert_eq!(w.halo_from((0, 4)), vec![(1, 2..3)]);
        assert_eq!(w.halo_from((1, 4)), vec![(0, 1..2), (2, 4..5)]);
        assert_eq!(w.halo_from((3, 4)), vec![(2, 5..6)]);
    }

    #[test]
    fn a_strided_window_reads_where_its_outputs_start() {
        // 7x7 stride 2 pad 3 on 224 rows (ResNet's stem) in 4 pieces.
        let w = Window {
            input: 224,
            output: 112,
            extent: 7,
            stride: 2,
            pad_before: 3,
        };
        assert_eq!(w.output_rows((1, 4)), 28..56);
        assert_eq!(w.read_rows((1, 4)), (53..114, (0, 0)));
        assert_eq!(w.halo_from((1, 4)), vec![(0, 53..56), (2, 112..114)]);
        // The last piece's windows reach past the input into the padding.
        assert_eq!(w.read_rows((3, 4)), (165..224, (0, 2)));
    }

    #[test]
    fn every_row_a_piece_reads_is_held_by_someone() {
        for (input, extent, stride, pad) in
            [(13, 3, 2, 1), (9, 5, 1, 2), (17, 2, 2, 0), (5, 3, 1, 1)]
        {
            let output = (input + 2 * pad - extent) / stride + 1;
            let w = Window {
                input,
                output,
                extent,
                stride,
                pad_before: pad,
            };
            for n in 1..=4u32 {
                for i in 0..n {
                    let (reads, _) = w.read_rows((i, n));
                    let own = w.held_rows((i, n));
                    let mut covered: Vec<u64> = own.clone().filter(|r| reads.contains(r)).collect();
                    for (_, rows) in w.halo_from((i, n)) {
                        covered.extend(rows);
                    }
                    let halo: u64 = w
                        .halo_from((i, n))
                        .iter()
                        .map(|(_, r)| r.end - r.start)
                        .sum();
                    assert_eq!(w.halo_rows((i, n)), halo);
                    covered.sort_unstable();
                    assert_eq!(
                        covered,
                        reads.clone().collect::<Vec<_>>(),
                        "{w:?} piece {i}/{n}"
                    );
                }
            }
        }
    }
}
