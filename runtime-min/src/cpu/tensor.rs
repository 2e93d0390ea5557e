//! Host tensors for the CPU interpreter: row-major, `f32` for every floating-point type
//! (the precision plans are trained in) and `i64` for integers and booleans (shape
//! arithmetic, indices, masks).

use std::sync::Arc;

pub use super::floats::Floats;
use super::init::Seeded;

/// A tensor's elements, shared: a view (Reshape, Flatten, Squeeze, Unsqueeze, Identity)
/// and a copy of a value are the same elements under another shape, never a copy of them.
/// Writing into shared elements copies them first ([`Arc::make_mut`], [`Floats::make_mut`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// Floating point (f16, bf16 and f64 are computed in f32), on the host or resident on
    /// a device.
    F32(Floats),
    /// Integers and booleans (0 or 1).
    I64(Arc<Vec<i64>>),
}

/// A row-major tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Elements.
    pub data: Data,
}

impl Tensor {
    /// A float tensor; `data` must have `shape`'s element count.
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        debug_assert_eq!(numel(&shape), data.len());
        Tensor {
            shape,
            data: Data::F32(data.into()),
        }
    }

    /// An integer tensor.
    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Tensor {
        debug_assert_eq!(numel(&shape), data.len());
        Tensor {
            shape,
            data: Data::I64(Arc::new(data)),
        }
    }

    /// A weight of `shape` the model carries no data for, its elements made when first
    /// read ([`Seeded`]).
    pub fn seeded(shape: Vec<usize>, seeded: Seeded) -> Tensor {
        debug_assert_eq!(numel(&shape), super::floats::DeviceCopy::len(&seeded));
        Tensor {
            shape,
            data: Data::F32(Floats::resident(Arc::new(seeded))),
        }
    }

    /// Its seed, when it is a [`Tensor::seeded`] weight whose elements are not yet made.
    pub fn seed(&self) -> Option<Seeded> {
        match &self.data {
            Data::F32(f) => Seeded::of(f),
            Data::I64(_) => None,
        }
    }

    /// Zeros of `shape`.
    pub fn zeros(shape: Vec<usize>) -> Tensor {
        let n = numel(&shape);
        Tensor::f32(shape, vec![0.0; n])
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        numel(&self.shape)
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether it is a float tensor (its elements are not read).
    pub fn is_float(&self) -> bool {
        matches!(self.data, Data::F32(_))
    }

    /// This float tensor's shape without its elements ([`Floats::released`]); an
    /// integer tensor (shapes, indices, masks: small, and read as data) is kept.
    pub fn released(&self) -> Tensor {
        match &self.data {
            Data::F32(f) => Tensor {
                shape: self.shape.clone(),
                data: Data::F32(Floats::released(f.len())),
            },
            Data::I64(_) => self.clone(),
        }
    }

    /// The float elements, if it is a float tensor.
    pub fn floats(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            Data::I64(_) => None,
        }
    }

    /// The integer elements, if it is an integer tensor.
    pub fn ints(&self) -> Option<&[i64]> {
        match &self.data {
            Data::I64(v) => Some(v),
            Data::F32(_) => None,
        }
    }

    /// The float elements to write, if it is a float tensor (copied first when shared).
    pub fn floats_mut(&mut self) -> Option<&mut Vec<f32>> {
        match &mut self.data {
            Data::F32(v) => Some(v.make_mut()),
            Data::I64(_) => None,
        }
    }

    /// The float elements, owned (copied when shared), if it is a float tensor.
    pub fn into_floats(self) -> Option<Vec<f32>> {
        match self.data {
            Data::F32(v) => Some(v.into_vec()),
            Data::I64(_) => None,
        }
    }

    /// The elements as `f64` whatever the type.
    pub fn to_f64s(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    /// The elements as `i64` (floats truncated).
    pub fn to_i64s(&self) -> Vec<i64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I64(v) => v.to_vec(),
        }
    }

    /// The same elements under another shape of the same size.
    pub fn reshaped(mut self, shape: Vec<usize>) -> Tensor {
        debug_assert_eq!(numel(&shape), self.len());
        self.shape = shape;
        self
    }

    /// The elements at `positions`, shaped as they walk, keeping the type: what
    /// [`Tensor::pick`] does with them, a run of the innermost axes at a time.
    pub fn select(&self, positions: Positions) -> Tensor {
        let shape = positions.shape.clone();
        match &self.data {
            Data::F32(v) => Tensor::f32(shape, positions.copy(v)),
            Data::I64(v) => Tensor::i64(shape, positions.copy(v)),
        }
    }

    /// Gathers the elements at `indices` (flat positions), keeping the type.
    pub fn pick(&self, shape: Vec<usize>, indices: impl Iterator<Item = usize>) -> Tensor {
        match &self.data {
            Data::F32(v) => Tensor::f32(shape, indices.map(|i| v[i]).collect()),
            Data::I64(v) => Tensor::i64(shape, indices.map(|i| v[i]).collect()),
        }
    }
}

/// Element count of a shape.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The flat positions `offset + Σ index_d · strides[d]` for every multi-index of `shape`,
/// in row-major order (strides may be zero, for broadcasting, or negative).
pub fn positions(shape: &[usize], strides: &[isize], offset: isize) -> Positions {
    Positions {
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        index: vec![0; shape.len()],
        at: offset,
        left: numel(shape),
    }
}

/// Iterator of [`positions`].
pub struct Positions {
    shape: Vec<usize>,
    strides: Vec<isize>,
    index: Vec<usize>,
    at: isize,
    left: usize,
}

impl Positions {
    /// The elements of `src` at these positions, from the first: whole runs of the
    /// innermost axes at once (a slice copy where they are contiguous, a fill where they
    /// are broadcast), which the element-wise odometer made ten times slower.
    pub fn copy<T: Copy>(self, src: &[T]) -> Vec<T> {
        let n = self.left;
        debug_assert_eq!(n, numel(&self.shape), "copy starts at the first position");
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return out;
        }
        // Merge each axis into the next where walking one steps as walking the other.
        let (mut shape, mut strides) = (Vec::new(), Vec::new());
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            if d == 1 {
                continue;
            }
            match (shape.last_mut(), strides.last()) {
                (Some(last), Some(&ls)) if ls == s * d as isize => *last *= d,
                _ => {
                    shape.push(d);
                    strides.push(s);
                    continue;
                }
            }
            if let Some(ls) = strides.last_mut() {
                *ls = s;
            }
        }
        let (Some(&len), Some(&step)) = (shape.last(), strides.last()) else {
            out.push(src[self.at as usize]);
            return out;
        };
        let outer = shape.len() - 1;
        for start in positions(&shape[..outer], &strides[..outer], self.at) {
            match step {
                1 => out.extend_from_slice(&src[start..start + len]),
                0 => out.extend(std::iter::repeat_n(src[start], len)),
                s => {
                    let start = start as isize;
                    out.extend((0..len as isize).map(|i| src[(start + i * s) as usize]));
                }
            }
        }
        out
    }
}

impl Iterator for Positions {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let here = self.at as usize;
        // Advance the odometer.
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            self.at += self.strides[d];
            if self.index[d] < self.shape[d] {
                break;
            }
            self.at -= self.strides[d] * self.shape[d] as isize;
            self.index[d] = 0;
        }
        Some(here)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// numpy broadcasting of two shapes; `None` when they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let db = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            match (da, db) {
                (x, y) if x == y => Some(x),
                (1, y) => Some(y),
                (x, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// The strides that read a tensor of `shape` broadcast to `target` (zero on broadcast axes).
pub fn broadcast_strides(shape: &[usize], target: &[usize]) -> Vec<isize> {
    let own = strides(shape);
    let lead = target.len() - shape.len();
    (0..target.len())
        .map(|d| {
            if d < lead || shape[d - lead] == 1 {
                0
            } else {
                own[d - lead] as isize
            }
        })
        .collect()
}

/// The flat positions of a tensor of `shape` read at every element of `target`.
pub fn broadcast(shape: &[usize], target: &[usize]) -> Positions {
    positions(target, &broadcast_strides(shape, target), 0)
}

/// Sums a gradient of broadcast shape `from` back onto `shape` (the adjoint of
/// broadcasting).
pub fn unbroadcast(grad: &[f32], from: &[usize], shape: &[usize]) -> Vec<f32> {
    if from == shape {
        return grad.to_vec();
    }
    let mut out = vec![0.0; numel(shape)];
    for (g, i) in grad.iter().zip(broadcast(shape, from)) {
        out[i] += g;
    }
    out
}

/// Normalizes a possibly negative axis of a rank-`rank` tensor.
pub fn axis(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

/// Integers as message words: each one's bits in two `f32` words (low, high), so an integer
/// tensor crosses the float transports exactly.
pub fn ints_to_words(v: &[i64]) -> Vec<f32> {
    v.iter()
        .flat_map(|&x| {
            let bits = x as u64;
            [
                f32::from_bits(bits as u32),
                f32::from_bits((bits >> 32) as u32),
            ]
        })
        .collect()
}

/// The integers [`ints_to_words`] made, or `None` for an odd count of words.
pub fn words_to_ints(words: &[f32]) -> Option<Vec<i64>> {
    (words.len() % 2 == 0).then(|| {
        words
            .chunks_exact(2)
            .map(|w| (u64::from(w[0].to_bits()) | u64::from(w[1].to_bits()) << 32) as i64)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_walk_row_major_with_any_strides() {
        let p: Vec<usize> = positions(&[2, 3], &[1, 2], 0).collect();
        assert_eq!(p, vec![0, 2, 4, 1, 3, 5]);
        let b: Vec<usize> = broadcast(&[3], &[2, 3]).collect();
        assert_eq!(b, vec![0, 1, 2, 0, 1, 2]);
        let b: Vec<usize> = broadcast(&[2, 1], &[2, 3]).collect();
        assert_eq!(b, vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_shapes(&[4, 1, 3], &[2, 1]), Some(vec![4, 2, 3]));
        assert_eq!(broadcast_shapes(&[2], &[3]), None);
        assert_eq!(unbroadcast(&[1.0; 6], &[2, 3], &[1, 3]), vec![2.0; 3]);
    }

    proptest::proptest! {
        /// Copying by runs reads what walking element by element reads: slices (steps
        /// forward and back), transposes, broadcasts and axes of one.
        #[test]
        fn a_copy_by_runs_reads_each_position(
            axes in proptest::collection::vec((1usize..4, -2isize..3), 0..5),
            permute in proptest::bool::ANY,
        ) {
            let shape: Vec<usize> = axes.iter().map(|a| a.0).collect();
            let mut strides: Vec<isize> = axes.iter().map(|a| a.1).collect();
            if permute {
                // Row-major strides, reversed: a transpose.
                strides = super::strides(&shape).iter().rev().map(|&s| s as isize).collect();
            }
            // A source large enough for any walk that starts in its middle.
            let reach: isize =
                shape.iter().zip(&strides).map(|(&d, s)| s.abs() * (d as isize - 1)).sum();
            let src: Vec<u32> = (0..(2 * reach + 1) as u32).collect();
            let at = reach;
            let walked: Vec<u32> = positions(&shape, &strides, at).map(|i| src[i]).collect();
            proptest::prop_assert_eq!(positions(&shape, &strides, at).copy(&src), walked);
        }
    }

    #[test]
    fn integers_cross_float_words_exactly() {
        // Bit patterns that are NaNs, infinities and subnormals as floats.
        let v = [0, 1, -1, i64::MIN, i64::MAX, 0x7fc0_0001_7f80_0001, 1 << 40];
        assert_eq!(words_to_ints(&ints_to_words(&v)).as_deref(), Some(&v[..]));
        assert_eq!(words_to_ints(&[0.0; 3]), None);
    }
}
