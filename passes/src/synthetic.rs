//! Synthetic layer graphs for benchmarks and property tests: chains and branchy graphs
//! (residual blocks, Inception-like modules with up to four branches joined by a
//! concatenation) of CNN-sized layers, costed by the roofline. Deterministic per seed.

use std::collections::BTreeMap;

use crate::layers::{Edge, Layer, LayerGraph, LayerId, LayerKind, Producer};

/// A small deterministic generator (SplitMix64), so graphs need no RNG crate.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1).max(1)
    }
}

struct Builder {
    batch: u64,
    layers: Vec<Layer>,
}

impl Builder {
    fn push(&mut self, kind: LayerKind, inputs: &[usize], rng: &mut Rng) -> usize {
        let batch = self.batch;
        let per_sample_out = match kind {
            LayerKind::Dense => rng.range(1, 16) * 1024,
            _ => rng.range(1, 64) * 16 * 1024,
        };
        let output_bytes = per_sample_out * batch;
        let (params, flops_per_sample) = match kind {
            LayerKind::Conv => {
                let p = rng.range(1, 64) * 16 * 1024;
                (p, p * rng.range(8, 512) * 2)
            }
            LayerKind::Dense => {
                let p = rng.range(1, 64) * 64 * 1024;
                (p, 2 * p)
            }
            _ => (0, per_sample_out / 4),
        };
        let edges: Vec<Edge> = inputs
            .iter()
            .map(|&p| Edge {
                from: Producer::Layer(LayerId(p as u32)),
                value: None,
                bytes: self.layers[p].output_bytes,
                stash_kept_by: None,
                stashed: true,
                epilogue: false,
            })
            .collect();
        // The first layer reads an image of about 600 kB per sample.
        let input_bytes: u64 = if edges.is_empty() {
            batch * 600_000
        } else {
            edges.iter().map(|e| e.bytes).sum()
        };
        let fwd = flops_per_sample * batch;
        let name = format!("{}{}", kind.name(), self.layers.len());
        self.layers.push(Layer {
            name,
            op: kind.name().to_owned(),
            module: String::new(),
            kind,
            parts: Vec::new(),
            params: params / 4,
            param_bytes: params,
            fwd_flops: fwd,
            bwd_flops: if params > 0 { 2 * fwd } else { fwd },
            activation_io_bytes: input_bytes + output_bytes,
            output_bytes,
            stash_bytes: input_bytes,
            inner_stash_bytes: 0,
            kept_output_bytes: 0,
            softmax_rows_bytes: 0,
            scores_stash_bytes: 0,
            inputs: if edges.is_empty() {
                vec![Edge {
                    from: Producer::Input("input".into()),
                    value: None,
                    bytes: input_bytes,
                    stash_kept_by: None,
                    stashed: true,
                    epilogue: false,
                }]
            } else {
                edges
            },
            measured: None,
            halo: None,
            recurrence: None,
            grouped: false,
        });
        self.layers.len() - 1
    }
}

/// A graph of about `layers` layers at global batch `batch`: with `branchy`, a mix of
/// chains, residual blocks and Inception-like modules; without, a chain ending in dense
/// layers.
pub fn graph(layers: usize, batch: u64, branchy: bool, seed: u64) -> LayerGraph {
    let mut rng = Rng::new(seed);
    let mut b = Builder {
        batch: batch.max(1),
        layers: Vec::new(),
    };
    let mut last = b.push(LayerKind::Conv, &[], &mut rng);
    let body = layers.saturating_sub(3).max(1);
    while b.layers.len() < body {
        match if branchy { rng.range(0, 2) } else { 0 } {
            0 => {
                let kind = if rng.range(0, 3) == 0 {
                    LayerKind::Pool
                } else {
                    LayerKind::Conv
                };
                last = b.push(kind, &[last], &mut rng);
            }
            1 => {
                // Residual: two convolutions, then an add of the block's input.
                let x = last;
                let c1 = b.push(LayerKind::Conv, &[x], &mut rng);
                let c2 = b.push(LayerKind::Conv, &[c1], &mut rng);
                last = b.push(LayerKind::Elementwise, &[c2, x], &mut rng);
            }
            _ => {
                // Inception-like: 2..=4 branches of 1..=3 layers, concatenated.
                let x = last;
                let mut ends = Vec::new();
                for _ in 0..rng.range(2, 4) {
                    let mut y = x;
                    for _ in 0..rng.range(1, 3) {
                        y = b.push(LayerKind::Conv, &[y], &mut rng);
                    }
                    ends.push(y);
                }
                last = b.push(LayerKind::DataMovement, &ends, &mut rng);
            }
        }
    }
    while b.layers.len() < layers.max(2) {
        last = b.push(LayerKind::Dense, &[last], &mut rng);
    }
    let outputs = vec![LayerId(last as u32)];
    LayerGraph {
        batch: b.batch,
        layers: b.layers,
        outputs,
        rewrite: None,
        aliases: BTreeMap::new(),
        tied: Vec::new(),
        float_bytes: 4,
        fixed_batch: None,
    }
}
