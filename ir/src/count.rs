//! Model accounting: parameters, multiply-accumulates, other FLOPs and bytes per layer.
//!
//! Conventions (those of published model tables, e.g. torchvision's):
//! * **params**: elements of floating-point constant tensors that are model weights —
//!   initializers of more than one element ([`Op::is_weight`]), and the float
//!   `ConstantOfShape` outputs that old models use to encode weights. Each is attributed to
//!   the first layer that reads it; the total equals the file's float initializer elements
//!   that are not scalars exactly.
//! * **MACs**: forward multiply-accumulates of Conv, ConvTranspose, Gemm and MatMul only.
//! * **FLOPs**: every other forward floating-point operation (bias adds, activations,
//!   normalization, pooling, softmax), by the op's [`Work`] ([`Op::facts`]).
//! * **activation bytes**: bytes of a layer's outputs; **weight bytes**: bytes of its
//!   parameters.
//!
//! Backward costs are derived by the cost model (passes), not here.

use crate::graph::{Graph, Site};
use crate::ids::{NodeId, ValueId};
use crate::op::{Op, Product, Work};
use crate::shape::Dim;
use crate::verify::GraphInfo;

/// Accounting of one layer (a node that computes on tensors: not a source, not shape
/// arithmetic, not a weight generator).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerStats {
    /// The node.
    pub node: NodeId,
    /// Parameters it reads first.
    pub params: u64,
    /// Forward multiply-accumulates.
    pub macs: u64,
    /// Other forward FLOPs.
    pub flops: u64,
    /// Bytes of its outputs.
    pub activation_bytes: u64,
    /// Bytes of its parameters.
    pub weight_bytes: u64,
}

/// Totals and per-layer figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Layers in topological order.
    pub layers: Vec<LayerStats>,
    /// All parameters (including any read by no layer).
    pub params: u64,
    /// All MACs.
    pub macs: u64,
    /// All other FLOPs.
    pub flops: u64,
    /// Sum of the layers' activation bytes.
    pub activation_bytes: u64,
    /// All parameter bytes.
    pub weight_bytes: u64,
}

/// Why accounting failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccountError {
    /// A shape still has a symbolic dimension.
    #[error("{site}: output shape has unbound dimension '{dim}'; bind it (--batch / --input) before accounting")]
    Unbound {
        /// Where.
        site: Site,
        /// The dimension.
        dim: Dim,
    },
    /// A count overflows 64 bits.
    #[error("{site}: {what} overflows 64 bits")]
    Overflow {
        /// Where.
        site: Site,
        /// What.
        what: &'static str,
    },
}

struct Counter<'a> {
    graph: &'a Graph,
    info: &'a GraphInfo,
    node: NodeId,
}

impl Counter<'_> {
    fn numel(&self, v: ValueId) -> Result<u64, AccountError> {
        let shape = &self.info.ty(v).shape;
        for d in &shape.0 {
            if d.as_known().is_none() {
                return Err(AccountError::Unbound {
                    site: self.graph.site(self.node),
                    dim: d.clone(),
                });
            }
        }
        shape.known_numel().ok_or(self.overflow("an element count"))
    }

    fn bytes(&self, v: ValueId) -> Result<u64, AccountError> {
        self.numel(v)?
            .checked_mul(self.info.ty(v).dtype.size_bytes())
            .ok_or(self.overflow("a byte count"))
    }

    /// `*total += x`, or an overflow error naming `what`.
    fn add(&self, total: &mut u64, x: u64, what: &'static str) -> Result<(), AccountError> {
        *total = total.checked_add(x).ok_or(self.overflow(what))?;
        Ok(())
    }

    fn overflow(&self, what: &'static str) -> AccountError {
        AccountError::Overflow {
            site: self.graph.site(self.node),
            what,
        }
    }

    fn dim(&self, v: ValueId, axis: usize) -> u64 {
        self.info
            .ty(v)
            .shape
            .0
            .get(axis)
            .and_then(Dim::as_size)
            .unwrap_or(0)
    }

    fn mul(&self, xs: &[u64]) -> Result<u64, AccountError> {
        xs.iter()
            .try_fold(1u64, |a, &x| a.checked_mul(x))
            .ok_or(self.overflow("the MAC count"))
    }

    /// (MACs, other FLOPs) of the node.
    fn compute(&self) -> Result<(u64, u64), AccountError> {
        let node = self.graph.node(self.node);
        let input = |slot: usize| node.inputs.get(slot).copied().flatten();
        let out = node.outputs[0];
        let out_n = self.numel(out)?;
        let per_input = |per: u64| -> Result<u64, AccountError> {
            let n = input(0).map(|x| self.numel(x)).transpose()?.unwrap_or(0);
            self.mul(&[n, per])
        };
        Ok(match node.op.facts().work {
            Work::None => (0, 0),
            Work::PerOutput(per) => (0, self.mul(&[out_n, per])?),
            Work::PerInput(per) => (0, per_input(per)?),
            Work::PerExtraOperand => (
                0,
                self.mul(&[out_n, node.inputs.len().saturating_sub(1) as u64])?,
            ),
            Work::Product(product) => self.product(product, out_n)?,
        })
    }

    /// (MACs, other FLOPs) of a product with `out_n` output elements.
    fn product(&self, product: Product<'_>, out_n: u64) -> Result<(u64, u64), AccountError> {
        let node = self.graph.node(self.node);
        let input = |slot: usize| node.inputs.get(slot).copied().flatten();
        let out = node.outputs[0];
        let bias = |slot| input(slot).map_or(0, |_| out_n);
        Ok(match product {
            Product::Conv => {
                let Some(w) = input(1) else { return Ok((0, 0)) };
                let shape = &self.info.ty(w).shape;
                let kernel = shape.known_numel().unwrap_or(0) / self.dim(w, 0).max(1);
                (self.mul(&[out_n, kernel])?, bias(2))
            }
            Product::ConvTranspose => {
                let (Some(x), Some(w)) = (input(0), input(1)) else {
                    return Ok((0, 0));
                };
                let per_out =
                    self.info.ty(w).shape.known_numel().unwrap_or(0) / self.dim(w, 0).max(1);
                (self.mul(&[self.numel(x)?, per_out])?, bias(2))
            }
            Product::Gemm { trans_a } => {
                let Some(a) = input(0) else { return Ok((0, 0)) };
                let k = self.dim(a, if trans_a { 0 } else { 1 });
                (self.mul(&[out_n, k])?, bias(2))
            }
            Product::MatMul => {
                let Some(a) = input(0) else { return Ok((0, 0)) };
                let rank = self.info.ty(a).shape.rank();
                (self.mul(&[out_n, self.dim(a, rank.saturating_sub(1))])?, 0)
            }
            Product::Recurrent(r) => {
                // Per step, direction and sample: the gates' products with the input and
                // the previous state; then about 4 operations per gate element.
                let Some(x) = input(0) else { return Ok((0, 0)) };
                let (seq, batch) = if r.batch_major { (1, 0) } else { (0, 1) };
                let rows = self.mul(&[
                    self.dim(x, seq),
                    self.dim(x, batch),
                    r.direction.count(),
                    r.cell.gates().saturating_mul(r.hidden),
                ])?;
                let macs = self.mul(&[rows, self.dim(x, 2).saturating_add(r.hidden)])?;
                (macs, self.mul(&[rows, 4])?)
            }
            Product::Einsum(e) => {
                // One product per combination of all labels' indices (n − 1 multiplies
                // for n operands, the last one fused with the sum); one operand: an add.
                let operands: Vec<ValueId> = node.inputs.iter().flatten().copied().collect();
                let ranks: Vec<usize> = operands
                    .iter()
                    .map(|&v| self.info.ty(v).shape.rank())
                    .collect();
                let Ok(axes) = e.axes(&ranks) else {
                    return Ok((0, 0));
                };
                let mut sizes: std::collections::BTreeMap<u32, u64> = Default::default();
                for (&v, labels) in operands.iter().zip(&axes.operands) {
                    for (axis, &l) in labels.iter().enumerate() {
                        let d = self.dim(v, axis);
                        let s = sizes.entry(l).or_insert(d);
                        *s = (*s).max(d);
                    }
                }
                let combos = self.mul(&sizes.values().copied().collect::<Vec<_>>())?;
                match operands.len() {
                    0 | 1 => (0, combos),
                    n => (self.mul(&[combos, n as u64 - 1])?, 0),
                }
            }
            Product::Stft { onesided } => {
                // Every output number (a bin's real or imaginary part in a frame) is a dot
                // product of the windowed frame with one row of the DFT matrix. The frame
                // is the window's length, else what the bins imply.
                let frame = match input(2) {
                    Some(w) => self.dim(w, 0),
                    None if onesided => self.dim(out, 2).saturating_sub(1) * 2,
                    None => self.dim(out, 2),
                };
                (self.mul(&[out_n, frame])?, 0)
            }
        })
    }
}

/// Whether `v` is a parameter: a weight ([`Op::is_weight`]), or a float `ConstantOfShape`
/// of a constant shape (the ONNX zoo's "light" models write weights so).
pub fn is_parameter(graph: &Graph, v: ValueId) -> bool {
    match &graph.node(graph.value(v).producer).op {
        op @ Op::Constant { .. } => op.is_weight(),
        // A fill of a constant shape (the ONNX zoo's "light" models write weights so); one
        // of a computed shape is a state or a mask (a recurrent layer's zero state).
        Op::ConstantOfShape { dtype, .. } => {
            let node = graph.node(graph.value(v).producer);
            dtype.is_float()
                && node.inputs.first().copied().flatten().is_some_and(|s| {
                    matches!(graph.node(graph.value(s).producer).op, Op::Constant { .. })
                })
        }
        _ => false,
    }
}

/// For every value, whether it is computed from constants alone (weights, their aliases and
/// casts, shape arithmetic): such values exist before the first input arrives.
fn constant_derived(graph: &Graph, info: &GraphInfo) -> Vec<bool> {
    let mut derived = vec![false; graph.value_count()];
    for &n in info.order() {
        let node = graph.node(n);
        let yes = match node.op {
            Op::Input => false,
            Op::Constant { .. } => true,
            _ => node.inputs.iter().flatten().all(|v| derived[v.index()]),
        };
        for &v in &node.outputs {
            // Shape arithmetic on activations (`Shape(x)`) folds to constants too.
            derived[v.index()] = yes || info.ty(v).content.is_some();
        }
    }
    derived
}

/// The parameter behind a weight alias (`Identity`, `Cast`, `Transpose`, `Reshape`, … of a
/// constant-derived value, as exporters emit for shared or re-laid-out weights).
fn parameter_behind(graph: &Graph, derived: &[bool], mut v: ValueId) -> Option<ValueId> {
    for _ in 0..64 {
        if is_parameter(graph, v) {
            return Some(v);
        }
        if !derived[v.index()] {
            return None;
        }
        let node = graph.node(graph.value(v).producer);
        v = node.inputs.first().copied().flatten()?;
    }
    None
}

/// Counts parameters, MACs, FLOPs and bytes of a verified graph whose shapes are bound.
///
/// # Errors
/// When a shape is still symbolic, or a count overflows.
pub fn account(graph: &Graph, info: &GraphInfo) -> Result<Accounting, AccountError> {
    let derived = constant_derived(graph, info);
    let mut acc = Accounting::default();
    let mut claimed = vec![false; graph.value_count()];
    for &n in info.order() {
        let node = graph.node(n);
        let counter = Counter {
            graph,
            info,
            node: n,
        };
        for &v in &node.outputs {
            if is_parameter(graph, v) {
                counter.add(&mut acc.params, counter.numel(v)?, "parameters")?;
                counter.add(&mut acc.weight_bytes, counter.bytes(v)?, "weight bytes")?;
            }
        }
        if matches!(node.op, Op::Input) || node.outputs.iter().all(|v| derived[v.index()]) {
            continue;
        }
        let mut layer = LayerStats {
            node: n,
            params: 0,
            macs: 0,
            flops: 0,
            activation_bytes: 0,
            weight_bytes: 0,
        };
        for &v in node.inputs.iter().flatten() {
            let Some(p) = parameter_behind(graph, &derived, v) else {
                continue;
            };
            if !std::mem::replace(&mut claimed[p.index()], true) {
                counter.add(&mut layer.params, counter.numel(p)?, "layer parameters")?;
                counter.add(
                    &mut layer.weight_bytes,
                    counter.bytes(p)?,
                    "layer weight bytes",
                )?;
            }
        }
        (layer.macs, layer.flops) = counter.compute()?;
        for &v in &node.outputs {
            counter.add(
                &mut layer.activation_bytes,
                counter.bytes(v)?,
                "activation bytes",
            )?;
        }
        counter.add(&mut acc.macs, layer.macs, "the MAC total")?;
        counter.add(&mut acc.flops, layer.flops, "the FLOP total")?;
        acc.activation_bytes = acc.activation_bytes.saturating_add(layer.activation_bytes);
        acc.layers.push(layer);
    }
    Ok(acc)
}
