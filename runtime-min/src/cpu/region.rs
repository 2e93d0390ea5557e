//! Regions of tensors: the index box a rank holds or needs of a tensor (one range per
//! axis), how the planner's abstract axes map onto a tensor's, and the piece of a weight a
//! rank keeps — with the copies between them that messages and collectives need.

use std::ops::Range;

use super::tensor::{self as t, Tensor};

/// How the abstract axes of a [`View`](ralpc_codegen::layout::View) map onto a tensor's axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axes {
    /// The spatial or sequence axis, if the tensor has one.
    pub rows: Option<usize>,
    /// The channel or feature axis, if the tensor has one.
    pub features: Option<usize>,
}

impl Axes {
    /// NCHW and NCL tensors (channels first) when `channels_first`, else `[B, T, D]`;
    /// `[B, F]` has no rows.
    pub fn of(rank: usize, channels_first: bool) -> Axes {
        match rank {
            0 | 1 => Axes {
                rows: None,
                features: None,
            },
            2 => Axes {
                rows: None,
                features: Some(1),
            },
            3 if !channels_first => Axes {
                rows: Some(1),
                features: Some(2),
            },
            _ => Axes {
                rows: Some(2),
                features: Some(1),
            },
        }
    }
}

/// An index range per axis.
pub(crate) type Region = Vec<Range<usize>>;

pub(crate) fn interval((i, n): (u32, u32), len: usize) -> Range<usize> {
    let (i, n) = (i as usize, n.max(1) as usize);
    i * len / n..(i + 1) * len / n
}

pub(crate) fn intersect(a: &Region, b: &Region) -> Region {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.start.max(y.start)..x.end.min(y.end).max(x.start.max(y.start)))
        .collect()
}

pub(crate) fn volume(r: &Region) -> usize {
    r.iter().map(|x| x.end - x.start).product()
}

pub(crate) fn dims(r: &Region) -> Vec<usize> {
    r.iter().map(|x| x.end - x.start).collect()
}

/// Positions in a tensor holding `holder` of the elements of `piece` (inside it).
pub(crate) fn positions_in(holder: &Region, piece: &Region) -> t::Positions {
    let st = t::strides(&dims(holder));
    let offset: usize = piece
        .iter()
        .zip(holder)
        .zip(&st)
        .map(|((p, h), s)| (p.start - h.start) * s)
        .sum();
    let strides: Vec<isize> = st.iter().map(|&s| s as isize).collect();
    t::positions(&dims(piece), &strides, offset as isize)
}

/// The part `piece` of `x`, which holds `holder`.
pub(crate) fn crop(x: &Tensor, holder: &Region, piece: &Region) -> Tensor {
    // All of it: the same elements, shared (and left where they are, host or device).
    if holder == piece && x.shape == dims(piece) {
        return x.clone();
    }
    x.select(positions_in(holder, piece))
}

/// Copies what `values` (holding `region`) has of `holder` into `out` (holding `holder`),
/// marking what it filled.
pub(crate) fn fill<T: Copy>(
    out: &mut [T],
    filled: &mut [bool],
    holder: &Region,
    values: &[T],
    region: &Region,
) {
    let piece = intersect(holder, region);
    if volume(&piece) == 0 {
        return;
    }
    for (dst, src) in positions_in(holder, &piece).zip(positions_in(region, &piece)) {
        out[dst] = values[src];
        filled[dst] = true;
    }
}

/// `x` (holding `from`) as the values of `to`: `x`'s where the two meet, zeros elsewhere.
/// It crops when `to` lies inside `from` and pads when `to` holds it; the same call takes
/// a gradient over `to` back to `from`.
pub(crate) fn reframe(x: &[f32], from: &Region, to: &Region) -> Vec<f32> {
    let mut out = vec![0.0f32; volume(to)];
    let mut filled = vec![false; out.len()];
    fill(&mut out, &mut filled, to, x, from);
    out
}

/// Writes `src` (holding `piece`) into `dst` (holding `holder`), marking what it filled.
pub(crate) fn paste(
    dst: &mut [f32],
    holder: &Region,
    src: &[f32],
    piece: &Region,
    filled: &mut [bool],
) {
    for (i, &v) in positions_in(holder, piece).zip(src) {
        dst[i] = v;
        filled[i] = true;
    }
}

/// How a rank holds a weight: whole, or a piece along one axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Slice {
    Whole,
    Axis(usize, (u32, u32)),
    /// Piece `piece` of each of `groups` equal groups along axis `axis`: a fused QKV
    /// projection's columns cut by heads, rank `i` holding `[q_i | k_i | v_i]`.
    Groups {
        axis: usize,
        groups: usize,
        piece: (u32, u32),
    },
    /// A row-parallel layer's bias, held by the first input-feature slice only; the others
    /// add zeros.
    FirstSliceOnly,
    /// Piece `(i, n)` of an embedding table's rows (its vocabulary), with one zero row
    /// appended: the row every id outside the piece looks up (Megatron's masked lookup),
    /// whose gradient is dropped.
    Vocabulary((u32, u32)),
}

/// Where a rank's piece of a weight lies in it: the box `region` of the weight seen as
/// of shape `holder` (its own, or with an axis split into groups), the piece's own shape,
/// and whether one zero row follows it (a vocabulary piece).
pub(crate) struct Piece {
    pub(crate) holder: Vec<usize>,
    pub(crate) region: Region,
    pub(crate) shape: Vec<usize>,
    pub(crate) zero_row: bool,
}

impl Piece {
    /// The whole of [`Piece::holder`], as a box.
    pub(crate) fn whole(&self) -> Region {
        self.holder.iter().map(|&d| 0..d).collect()
    }

    /// The piece as a rank holds it: its shape, with the zero row when it has one.
    pub(crate) fn held_shape(&self) -> Vec<usize> {
        let mut shape = self.shape.clone();
        if self.zero_row {
            shape[0] += 1;
        }
        shape
    }
}

impl Slice {
    /// Where this slice lies in a weight of `shape`; `None` when it is the whole weight
    /// (or a zero stand-in of its shape).
    pub(crate) fn piece(&self, shape: &[usize]) -> Option<Piece> {
        let (axis, groups, piece) = match *self {
            Slice::Axis(axis, piece) => (axis, 1, piece),
            Slice::Groups {
                axis,
                groups,
                piece,
            } => (axis, groups.max(1), piece),
            Slice::Vocabulary(piece) => {
                let mut region: Region = shape.iter().map(|&d| 0..d).collect();
                region[0] = interval(piece, *shape.first()?);
                return Some(Piece {
                    holder: shape.to_vec(),
                    shape: dims(&region),
                    region,
                    zero_row: true,
                });
            }
            Slice::Whole | Slice::FirstSliceOnly => return None,
        };
        let n = *shape.get(axis)?;
        let mut holder = shape.to_vec();
        holder.splice(axis..=axis, [groups, n / groups]);
        let mut region: Region = holder.iter().map(|&d| 0..d).collect();
        region[axis + 1] = interval(piece, holder[axis + 1]);
        let mut own = shape.to_vec();
        own[axis] = region[axis].len() * region[axis + 1].len();
        Some(Piece {
            holder,
            region,
            shape: own,
            zero_row: false,
        })
    }
}

/// A rank's share of a whole weight (or of its momentum).
pub(crate) fn share(full: &Tensor, slice: &Slice, first_slice: bool) -> Tensor {
    if let (Slice::FirstSliceOnly, false) = (slice, first_slice) {
        return Tensor::zeros(full.shape.clone());
    }
    let Some(piece) = slice.piece(&full.shape) else {
        return full.clone();
    };
    let cut = match full.seed() {
        // A seeded weight not yet made makes these elements alone.
        Some(seeded) => seeded.elements(positions_in(&piece.whole(), &piece.region)),
        None => crop(full, &piece.whole(), &piece.region)
            .floats()
            .map(<[f32]>::to_vec)
            .unwrap_or_default(),
    };
    let mut data = cut;
    if piece.zero_row {
        let width: usize = full.shape[1..].iter().product();
        data.extend(std::iter::repeat_n(0.0, width));
    }
    Tensor::f32(piece.held_shape(), data)
}

/// Writes a rank's share `data` of a weight of `shape` at its place in `whole`.
pub(crate) fn place_into(whole: &mut [f32], data: &[f32], slice: &Slice, shape: &[usize]) {
    match slice.piece(shape) {
        Some(piece) => {
            // Its box, without a vocabulary piece's zero row.
            let mut filled = vec![false; whole.len()];
            paste(whole, &piece.whole(), data, &piece.region, &mut filled);
        }
        None => whole.copy_from_slice(data),
    }
}
