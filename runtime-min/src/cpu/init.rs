//! Seeded values for what a model does not carry: the weights of a structure-only model
//! and synthetic inputs and labels.
//!
//! Counter-based, so that any element can be computed on its own and the stream is the
//! same on every platform and for every partitioning: element `i` of the tensor named
//! `name` is `splitmix64(seed ⊕ fnv1a64(name) + (i + 1)·φ)`, its top 24 bits a uniform
//! `u ∈ [0, 1)`. `fixtures/numerics/gen.py` reproduces it in numpy so that onnxruntime
//! runs the same weights.

use ralpc_ir::{Graph, Op, ValueId};

use super::floats::{DeviceCopy, Floats, ReadBackError};

const PHI: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a, 64 bits.
fn fnv1a(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of the raw 64-bit stream whose base is `base` (`seed ⊕ fnv1a(name)`).
fn element(base: u64, i: u64) -> u64 {
    splitmix(base.wrapping_add((i + 1).wrapping_mul(PHI)))
}

/// The raw 64-bit stream of `name`, `n` elements.
fn stream(seed: u64, name: &str, n: usize) -> impl Iterator<Item = u64> {
    let base = seed ^ fnv1a(name);
    (0..n as u64).map(move |i| element(base, i))
}

/// The top 24 bits of `z` as a value uniform in `[-bound, bound)`.
fn to_uniform(z: u64, bound: f32) -> f32 {
    let u = (z >> 40) as f32 / (1u64 << 24) as f32;
    (2.0 * u - 1.0) * bound
}

/// `n` values uniform in `[-bound, bound)`.
pub fn uniform(seed: u64, name: &str, n: usize, bound: f32) -> Vec<f32> {
    stream(seed, name, n)
        .map(|z| to_uniform(z, bound))
        .collect()
}

/// `n` integers uniform in `[0, range)`.
pub fn integers(seed: u64, name: &str, n: usize, range: u64) -> Vec<i64> {
    stream(seed, name, n)
        .map(|z| (z % range.max(1)) as i64)
        .collect()
}

/// A seeded graph input of `n` elements: floats uniform in `[-1, 1)`; integers uniform
/// in `[0, range)`, where `range` is the size of the table the input indexes (see
/// [`index_range`]).
pub fn input(seed: u64, name: &str, n: usize, float: bool, range: u64) -> super::tensor::Data {
    let key = format!("input:{name}");
    if float {
        super::tensor::Data::F32(uniform(seed, &key, n, 1.0).into())
    } else {
        super::tensor::Data::I64(integers(seed, &key, n, range).into())
    }
}

/// The range of valid values of an integer input: the size of the axis a `Gather` indexes
/// with it (token ids into an embedding table), else 2.
pub fn index_range(
    graph: &Graph,
    value: ValueId,
    dims_of: impl Fn(ValueId) -> Option<Vec<u64>>,
) -> u64 {
    for (node, slot) in graph.consumers(value) {
        let n = graph.node(node);
        if let (Op::Gather { axis }, 1) = (&n.op, slot) {
            if let Some(dims) = n.inputs.first().copied().flatten().and_then(&dims_of) {
                let a = if *axis < 0 {
                    *axis + dims.len() as i64
                } else {
                    *axis
                };
                if let Some(&d) = dims.get(a as usize) {
                    return d;
                }
            }
        }
    }
    2
}

/// How a missing weight is initialized, from the op that reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// All ones (normalization scales and variances).
    Ones,
    /// All zeros (normalization shifts and means).
    Zeros,
    /// Uniform in `[-bound, bound)`.
    Uniform(f32),
}

/// The first op that reads `value`, looking through `Identity` nodes (exporters alias
/// equal tensors, e.g. a batch norm's running variance to its scale), with the slot.
fn first_use(graph: &Graph, value: ValueId) -> Option<(ralpc_ir::NodeId, usize)> {
    graph.consumers(value).into_iter().find_map(|(node, slot)| {
        let n = graph.node(node);
        match n.op {
            Op::Identity => n.outputs.first().and_then(|&out| first_use(graph, out)),
            _ => Some((node, slot)),
        }
    })
}

/// The rule for the weight `value` of `dims`: normalization parameters are the identity;
/// a matrix or kernel is uniform with bound `√(3 / fan_in)` (variance `1 / fan_in`, so
/// that inference-mode batch norm with identity statistics does not let residual and
/// dense blocks overflow), fan-in read from the consuming op's layout; vectors (biases)
/// and embedding tables are uniform in ±0.1.
pub fn rule(graph: &Graph, value: ValueId, dims: &[u64]) -> Rule {
    let consumer = first_use(graph, value);
    let tail = |from: usize| dims.iter().skip(from).product::<u64>().max(1);
    let fan_in = match consumer.map(|(node, slot)| (&graph.node(node).op, slot)) {
        Some((Op::BatchNorm { .. }, 1 | 4)) | Some((Op::LayerNorm { .. }, 1)) => return Rule::Ones,
        Some((Op::BatchNorm { .. }, 2 | 3)) | Some((Op::LayerNorm { .. }, 2)) => {
            return Rule::Zeros
        }
        Some((Op::Gather { .. }, 0)) => return Rule::Uniform(0.1),
        _ if dims.len() < 2 => return Rule::Uniform(0.1),
        Some((Op::Gemm(g), 1)) => {
            if g.trans_b {
                dims[1]
            } else {
                dims[0]
            }
        }
        Some((Op::MatMul, 1)) => dims[dims.len() - 2],
        _ => tail(1),
    };
    Rule::Uniform((3.0 / fan_in.max(1) as f32).sqrt())
}

/// The elements of a weight initialized by `rule`.
pub fn weight(seed: u64, name: &str, n: usize, rule: Rule) -> Vec<f32> {
    match rule {
        Rule::Ones => vec![1.0; n],
        Rule::Zeros => vec![0.0; n],
        Rule::Uniform(bound) => uniform(seed, name, n, bound),
    }
}

/// A weight the model carries no data for, as its seed and rule: its elements are made
/// when first read, and a rank's piece of it is made alone ([`Seeded::elements`]), so
/// that a run on devices never holds a large model's whole weights on the host.
#[derive(Clone, Debug)]
pub struct Seeded {
    base: u64,
    len: usize,
    rule: Rule,
}

impl Seeded {
    /// The weight seeded from `seed` under `name`, `len` elements, by `rule`.
    pub fn new(seed: u64, name: &str, len: usize, rule: Rule) -> Seeded {
        Seeded {
            base: seed ^ fnv1a(name),
            len,
            rule,
        }
    }

    /// Its elements at the (row-major) `indices`, in order: what [`weight`] makes there.
    pub fn elements(&self, indices: impl Iterator<Item = usize>) -> Vec<f32> {
        match self.rule {
            Rule::Ones => indices.map(|_| 1.0).collect(),
            Rule::Zeros => indices.map(|_| 0.0).collect(),
            Rule::Uniform(bound) => indices
                .map(|i| to_uniform(element(self.base, i as u64), bound))
                .collect(),
        }
    }

    /// `floats`' seed, when they are a [`Seeded`] weight not yet made.
    pub fn of(floats: &Floats) -> Option<Seeded> {
        if floats.on_host() {
            return None;
        }
        floats.device_copy(|c| c.as_any().downcast_ref::<Seeded>().cloned())
    }
}

impl DeviceCopy for Seeded {
    fn len(&self) -> usize {
        self.len
    }
    fn read_back(&self) -> Result<Vec<f32>, ReadBackError> {
        Ok(self.elements(0..self.len))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_fixed() {
        // The same figures are asserted by fixtures/numerics/gen.py.
        assert_eq!(fnv1a("x"), 0xaf63_f54c_8602_1707);
        let v = uniform(0, "x", 3, 1.0);
        assert_eq!(v.len(), 3);
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        assert_eq!(uniform(0, "x", 3, 1.0), v);
        assert_ne!(uniform(1, "x", 3, 1.0), v);
        assert!(integers(7, "ids", 100, 5)
            .iter()
            .all(|&i| (0..5).contains(&i)));
    }
}
