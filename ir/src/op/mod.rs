//! Operators with typed attributes.
//!
//! `Op` is closed: the importer maps every supported ONNX `op_type` onto one variant and
//! decodes its attributes into typed fields, applying the spec's defaults, so no later phase
//! sees raw ONNX integers. Inputs that some opsets pass as attributes and others as tensors
//! (`axes`, `pads`, `split`, Clip's bounds, Slice's ranges) are kept as `Option` attributes;
//! when `None`, shape inference reads them from the constant input.

use std::sync::Arc;

use crate::dtype::DType;
use crate::tensor::TensorData;

mod facts;

pub use facts::{BackwardReads, Elements, ForwardSaves, Joins, OpClass, OpFacts, Product, Work};

/// One operator.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// A graph input (data fed per iteration).
    Input,
    /// A constant tensor: a model initializer (a weight) or an ONNX `Constant`.
    Constant {
        /// The tensor.
        tensor: Arc<TensorData>,
        /// Whether it came from `graph.initializer` (a trainable weight when floating-point).
        initializer: bool,
    },
    /// N-d convolution (ONNX Conv).
    Conv(Conv),
    /// N-d transposed convolution (ONNX ConvTranspose).
    ConvTranspose(ConvTranspose),
    /// `alpha·A'·B' + beta·C`.
    Gemm(Gemm),
    /// numpy-style batched matrix product.
    MatMul,
    /// An elementwise function of one tensor.
    Unary(Unary),
    /// `min(max(x, lo), hi)`; bounds from attributes (opset < 11) or inputs 1 and 2.
    Clip {
        /// Lower bound attribute (opset < 11).
        min: Option<f32>,
        /// Upper bound attribute (opset < 11).
        max: Option<f32>,
    },
    /// An elementwise function of two broadcast tensors.
    Binary(Binary),
    /// An elementwise function of any number of broadcast tensors (Sum, Mean, Max, Min).
    Variadic(Variadic),
    /// Softmax or LogSoftmax along `axis`.
    Softmax {
        /// Axis (may be negative).
        axis: i64,
        /// LogSoftmax.
        log: bool,
        /// Opset < 13: the axes from `axis` on are normalized together (the input is
        /// coerced to 2-D), not `axis` alone.
        flatten: bool,
    },
    /// Max or average pooling.
    Pool(Pool),
    /// Global max or average pooling over all spatial axes.
    GlobalPool(PoolKind),
    /// Batch normalization (a trainable layer in training mode).
    BatchNorm {
        /// ε.
        epsilon: f32,
        /// Running-statistics momentum.
        momentum: f32,
    },
    /// Layer normalization over the axes from `axis` on.
    LayerNorm {
        /// First normalized axis (may be negative).
        axis: i64,
        /// ε.
        epsilon: f32,
    },
    /// Local response normalization across channels.
    Lrn {
        /// Number of channels summed.
        size: u64,
        /// Scale.
        alpha: f32,
        /// Exponent.
        beta: f32,
        /// Bias.
        bias: f32,
    },
    /// Concatenation along `axis`.
    Concat {
        /// Axis (may be negative).
        axis: i64,
    },
    /// Split along `axis` into `outputs` parts.
    Split {
        /// Axis (may be negative).
        axis: i64,
        /// Part sizes from the attribute (opset < 13); else from input 1, else equal parts.
        sizes: Option<Vec<i64>>,
    },
    /// Slice; ranges from attributes (opset < 10) or inputs 1–4.
    Slice {
        /// Attribute ranges (opset < 10).
        ranges: Option<SliceRanges>,
    },
    /// Flatten to 2-D at `axis`.
    Flatten {
        /// Axis (may be negative).
        axis: i64,
    },
    /// Reshape to the shape given by input 1.
    Reshape {
        /// A `0` in the target means a zero-sized dimension, not "copy".
        allowzero: bool,
    },
    /// Axis permutation (reversal when `perm` is absent).
    Transpose {
        /// Permutation.
        perm: Option<Vec<i64>>,
    },
    /// Remove size-1 axes; axes from the attribute (opset < 13) or input 1.
    Squeeze {
        /// Attribute axes.
        axes: Option<Vec<i64>>,
    },
    /// Insert size-1 axes; axes from the attribute (opset < 13) or input 1.
    Unsqueeze {
        /// Attribute axes.
        axes: Option<Vec<i64>>,
    },
    /// Gather along `axis` with integer indices.
    Gather {
        /// Axis (may be negative).
        axis: i64,
    },
    /// The shape of a tensor as an `i64` vector.
    Shape {
        /// First axis.
        start: i64,
        /// One past the last axis.
        end: Option<i64>,
    },
    /// A tensor of the shape given by input 0, filled with `value`.
    ConstantOfShape {
        /// Fill value.
        value: f64,
        /// Element type.
        dtype: DType,
    },
    /// `[start, limit)` with step `delta` (inputs 0–2).
    Range,
    /// Element type conversion.
    Cast {
        /// Target type.
        to: DType,
    },
    /// Dropout (kept in training mode; the identity in inference).
    Dropout {
        /// Drop probability when given as an attribute (opset < 12).
        ratio: Option<f32>,
    },
    /// Identity.
    Identity,
    /// A reduction over `axes` (from the attribute, or input 1 from opset 13 for
    /// ReduceSum and 18 for the others).
    Reduce {
        /// What it computes.
        kind: ReduceKind,
        /// Attribute axes.
        axes: Option<Vec<i64>>,
        /// Keep reduced axes as size 1.
        keepdims: bool,
        /// With no axes, do nothing instead of reducing all (opset 18).
        noop_with_empty_axes: bool,
    },
    /// Padding; pads from the attribute (opset < 11) or input 1.
    Pad {
        /// Fill mode.
        mode: PadMode,
        /// Attribute pads (`[x1_begin, x2_begin, …, x1_end, x2_end, …]`).
        pads: Option<Vec<i64>>,
    },
    /// `cond ? x : y`, broadcast.
    Where,
    /// Broadcast to the shape given by input 1.
    Expand,
    /// Resampling by nearest neighbour or (multi)linear interpolation (ONNX Resize and
    /// Upsample).
    Resize(Resize),
    /// Upper or lower triangle of the last two axes (diagonal offset from input 1).
    Trilu {
        /// Keep the upper triangle.
        upper: bool,
    },
    /// A recurrent layer over a sequence (ONNX RNN, GRU, LSTM).
    Recurrent(Recurrent),
    /// The element count of a tensor, as an `i64` scalar.
    Size,
    /// `out[i…] = data[i… with axis replaced by indices[i…]]`: indices of the output's shape.
    GatherElements {
        /// Axis (may be negative).
        axis: i64,
    },
    /// `out[i…] = data[b…, indices[b…, i…, :]]`: the slices of the data that the index tuples
    /// along the indices' last axis address, after `batch_dims` leading axes both share.
    GatherNd {
        /// Leading axes of the data and the indices that index each other one to one.
        batch_dims: usize,
    },
    /// `data` with `updates` written at positions given per element along `axis`.
    ScatterElements {
        /// Axis (may be negative).
        axis: i64,
        /// How an update combines with what it overwrites.
        reduction: Reduction,
    },
    /// `data` with slices `updates[i…]` written at the index tuples `indices[i…, :]`.
    ScatterNd {
        /// How an update combines with what it overwrites.
        reduction: Reduction,
    },
    /// Running sum along the axis given by input 1.
    CumSum {
        /// Leave the current element out of its own sum.
        exclusive: bool,
        /// Sum from the last element back.
        reverse: bool,
    },
    /// Tensor contraction written in Einstein notation (explicit or implicit output).
    Einsum(Arc<Einsum>),
    /// The input repeated along each axis as often as input 1 says.
    Tile,
    /// Moves `blocksize × blocksize` channel blocks into pixels: `[N, C, H, W]` to
    /// `[N, C / b², H·b, W·b]`.
    DepthToSpace {
        /// The block's side.
        blocksize: usize,
        /// Column-row-depth order of the channels (`CRD`); else depth-column-row (`DCR`).
        crd: bool,
    },
    /// Moves pixel blocks into channels: `[N, C, H, W]` to `[N, C·b², H / b, W / b]`.
    SpaceToDepth {
        /// The block's side.
        blocksize: usize,
    },
    /// Normalization of each sample's channel over its spatial axes, then a scale and a
    /// bias per channel.
    InstanceNorm {
        /// ε.
        epsilon: f32,
    },
    /// Normalization of each sample's groups of channels over their pixels, then a scale
    /// and a bias per channel (opset 21; per group in opset 18).
    GroupNorm {
        /// Groups of channels.
        groups: usize,
        /// ε.
        epsilon: f32,
    },
    /// Each sample's first `sequence_lens[b]` time steps reversed (input 1 the lengths).
    ReverseSequence {
        /// The axis of the samples (0 or 1).
        batch_axis: usize,
        /// The axis of the time steps (1 or 0).
        time_axis: usize,
    },
    /// The index of the largest (or smallest) element along an axis, as `i64`.
    ArgExtreme {
        /// ArgMax; else ArgMin.
        max: bool,
        /// The axis (may be negative).
        axis: i64,
        /// Keep the reduced axis with size 1.
        keepdims: bool,
        /// Among equal extremes, the last index; else the first.
        select_last: bool,
    },
    /// The `k` largest (or smallest) elements along an axis and their `i64` indices, equal
    /// elements in the order of their indices (ONNX TopK; `k` is input 1 from opset 10 on).
    TopK {
        /// The axis (may be negative).
        axis: i64,
        /// The largest; else the smallest.
        largest: bool,
        /// Opset 1's attribute; `None` where input 1 gives it.
        k: Option<i64>,
    },
    /// Short-time Fourier transform of a real signal `[batch, length]` or
    /// `[batch, length, 1]`: inputs the signal, the frame step, the window, the frame
    /// length; output `[batch, frames, bins, 2]` (real and imaginary parts).
    Stft {
        /// Only the bins up to half the frame length (a real signal's spectrum is symmetric).
        onesided: bool,
    },
    /// A loop whose trip count must fold to a constant: binding the graph's inputs
    /// ([`crate::bind`]) unrolls it, one iteration per round of inference. Inputs: the
    /// maximum trip count (optional), the condition (optional), the loop-carried values,
    /// every value of the enclosing graph the body reads ([`LoopBody::captures`]), then the
    /// scan outputs of the iterations already unrolled. Outputs: the carried values' final
    /// ones, then each scan output stacked over the iterations.
    Loop(Arc<LoopBody>),
    /// A conditional whose condition must fold to a constant: binding the graph's inputs
    /// ([`crate::bind`]) inlines the taken branch. Inputs: the condition, then every value
    /// of the enclosing graph that the branches read ([`IfBranches::captures`], in order).
    If(Arc<IfBranches>),
}

/// How a scatter combines an update with the element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// Overwrite.
    None,
    /// Add.
    Add,
    /// Multiply.
    Mul,
    /// Keep the larger.
    Max,
    /// Keep the smaller.
    Min,
}

/// An Einstein summation, parsed: one label list per operand and for the output. Labels
/// are letters; an ellipsis stands for the same leading (broadcast) axes in every operand
/// and is expanded once the ranks are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Einsum {
    /// The equation as written.
    pub equation: String,
    /// Labels per operand; `None` marks where the ellipsis stood.
    pub operands: Vec<Vec<Option<char>>>,
    /// Output labels (implicit form: the labels used once, sorted, after the ellipsis).
    pub output: Vec<Option<char>>,
}

/// An [`Einsum`] at known operand ranks: every axis of every operand and of the output
/// named by a label number. Letters are their code points; the ellipsis's axes are
/// `ELLIPSIS + k`, `k` counted so that they align on the right, as broadcasting does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EinsumAxes {
    /// Labels per operand axis.
    pub operands: Vec<Vec<u32>>,
    /// Labels per output axis.
    pub output: Vec<u32>,
}

/// Why an einsum's equation cannot be used: always the model's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EinsumError {
    /// The equation is not one (a bad label, two ellipses, an output label in no operand).
    #[error("{0}")]
    Equation(String),
    /// The node's operands do not fit the equation (their count or a rank).
    #[error("{0}")]
    Operands(String),
}

impl Einsum {
    /// First label number of the ellipsis's axes.
    pub const ELLIPSIS: u32 = 0x1_0000;

    /// Parses an equation (`"bij,bjk->bik"`, `"...ii->...i"`, implicit `"ij,jk"`).
    ///
    /// # Errors
    /// When it is not one: the message says what is wrong.
    pub fn parse(equation: &str) -> Result<Einsum, EinsumError> {
        let compact: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match compact.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (compact.as_str(), None),
        };
        let term = |t: &str| -> Result<Vec<Option<char>>, EinsumError> {
            let mut labels = Vec::new();
            let mut rest = t;
            let mut ellipsis = false;
            while let Some(c) = rest.chars().next() {
                if let Some(after) = rest.strip_prefix("...") {
                    if std::mem::replace(&mut ellipsis, true) {
                        return Err(EinsumError::Equation(format!(
                            "'{t}' has more than one ellipsis"
                        )));
                    }
                    labels.push(None);
                    rest = after;
                } else if c.is_ascii_alphabetic() {
                    labels.push(Some(c));
                    rest = &rest[1..];
                } else {
                    return Err(EinsumError::Equation(format!(
                        "'{c}' is not a letter or an ellipsis"
                    )));
                }
            }
            Ok(labels)
        };
        let operands = lhs.split(',').map(term).collect::<Result<Vec<_>, _>>()?;
        let output = match rhs {
            Some(r) => {
                let out = term(r)?;
                for l in out.iter().flatten() {
                    if out.iter().filter(|o| **o == Some(*l)).count() > 1 {
                        return Err(EinsumError::Equation(format!(
                            "output label '{l}' appears twice"
                        )));
                    }
                    if !operands.iter().flatten().any(|o| *o == Some(*l)) {
                        return Err(EinsumError::Equation(format!(
                            "output label '{l}' is in no operand"
                        )));
                    }
                }
                out
            }
            None => {
                // Implicit output: the ellipsis, then the labels used once, alphabetically.
                let mut once: Vec<char> = operands
                    .iter()
                    .flatten()
                    .flatten()
                    .copied()
                    .filter(|l| {
                        operands
                            .iter()
                            .flatten()
                            .filter(|o| **o == Some(*l))
                            .count()
                            == 1
                    })
                    .collect();
                once.sort_unstable();
                let ellipsis = operands.iter().flatten().any(Option::is_none);
                ellipsis
                    .then_some(None)
                    .into_iter()
                    .chain(once.into_iter().map(Some))
                    .collect()
            }
        };
        Ok(Einsum {
            equation: equation.to_owned(),
            operands,
            output,
        })
    }

    /// The labels of every axis when the operands have ranks `ranks`.
    ///
    /// # Errors
    /// When the operand count or a rank does not fit the equation.
    pub fn axes(&self, ranks: &[usize]) -> Result<EinsumAxes, EinsumError> {
        if ranks.len() != self.operands.len() {
            return Err(EinsumError::Operands(format!(
                "the equation '{}' has {} operand(s), the node {}",
                self.equation,
                self.operands.len(),
                ranks.len()
            )));
        }
        let mut spans = Vec::with_capacity(ranks.len());
        for (i, (labels, &rank)) in self.operands.iter().zip(ranks).enumerate() {
            let named = labels.iter().flatten().count();
            let has_ellipsis = labels.len() > named;
            if rank < named || (!has_ellipsis && rank != named) {
                return Err(EinsumError::Operands(format!(
                    "operand {i} has rank {rank}, the equation '{}' gives it {named} label(s){}",
                    self.equation,
                    if has_ellipsis { " and an ellipsis" } else { "" }
                )));
            }
            spans.push(rank - named);
        }
        let widest = spans.iter().copied().max().unwrap_or(0);
        let expand = |labels: &[Option<char>], span: usize| -> Vec<u32> {
            labels
                .iter()
                .flat_map(|l| match l {
                    Some(c) => vec![u32::from(*c)],
                    None => (widest - span..widest)
                        .map(|k| Einsum::ELLIPSIS + k as u32)
                        .collect(),
                })
                .collect()
        };
        Ok(EinsumAxes {
            operands: self
                .operands
                .iter()
                .zip(&spans)
                .map(|(l, &span)| expand(l, span))
                .collect(),
            output: expand(&self.output, widest),
        })
    }
}

/// The two branches of an `If`, imported but not connected: each reads values of the
/// enclosing graph by name.
#[derive(Clone, Debug, PartialEq)]
pub struct IfBranches {
    /// Taken when the condition is true.
    pub then_branch: Branch,
    /// Taken when the condition is false.
    pub else_branch: Branch,
    /// Names of the enclosing graph's values the branches read (sorted); the `If` node's
    /// inputs from slot 1 on are these values.
    pub captures: Vec<String>,
}

/// A `Loop`'s body and how far it is unrolled.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopBody {
    /// The body. Its outputs: the condition, the carried values, the scan outputs.
    pub body: Branch,
    /// The body's formal inputs: the iteration number, the condition, the carried values.
    pub inputs: Vec<String>,
    /// Names of the enclosing graph's values the body reads (sorted).
    pub captures: Vec<String>,
    /// Iterations already unrolled (the next one's number).
    pub done: i64,
}

impl LoopBody {
    /// Loop-carried values.
    pub fn carried(&self) -> usize {
        self.inputs.len().saturating_sub(2)
    }

    /// Scan outputs.
    pub fn scans(&self) -> usize {
        self.body.outputs.len().saturating_sub(1 + self.carried())
    }
}

/// A subgraph: nodes in file order, reading each other's and captured values by name.
#[derive(Clone, Debug, PartialEq)]
pub struct Branch {
    /// Its nodes.
    pub nodes: Vec<BranchNode>,
    /// Names of the values it returns, one per output of the `If`.
    pub outputs: Vec<String>,
}

/// One node of a [`Branch`].
#[derive(Clone, Debug, PartialEq)]
pub struct BranchNode {
    /// The operator.
    pub op: Op,
    /// Its ONNX name and type.
    pub provenance: crate::graph::Provenance,
    /// Input names by slot (empty: an omitted optional input).
    pub inputs: Vec<String>,
    /// Output names by slot.
    pub outputs: Vec<String>,
}

impl Branch {
    /// The names this branch reads but does not define, sorted.
    pub fn free_names(&self) -> Vec<String> {
        let mut defined: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        let mut free: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for n in &self.nodes {
            for i in n.inputs.iter().filter(|i| !i.is_empty()) {
                if !defined.contains(i.as_str()) {
                    free.insert(i.clone());
                }
            }
            defined.extend(n.outputs.iter().map(String::as_str));
        }
        for o in &self.outputs {
            if !defined.contains(o.as_str()) {
                free.insert(o.clone());
            }
        }
        free.into_iter().collect()
    }
}

/// A recurrent layer: inputs `X, W, R, B, sequence_lens, initial_h` (and `initial_c` for
/// an LSTM), outputs `Y, Y_h` (and `Y_c`). The time loop is sequential; samples and
/// directions are independent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recurrent {
    /// The cell.
    pub cell: Cell,
    /// Hidden size.
    pub hidden: u64,
    /// Which way(s) the sequence is read.
    pub direction: Direction,
    /// `layout = 1`: X is batch × sequence × input (else sequence × batch × input).
    pub batch_major: bool,
}

/// The cell of a recurrent layer, with ONNX's default activations (tanh for RNN; sigmoid
/// gates and tanh for GRU and LSTM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    /// `h = tanh(x·Wᵀ + h·Rᵀ + b)`.
    Rnn,
    /// Gates z, r, h.
    Gru {
        /// Apply the reset gate after the recurrent product (`linear_before_reset = 1`).
        linear_before_reset: bool,
    },
    /// Gates i, o, f, c.
    Lstm,
}

impl Cell {
    /// Gates stacked in W, R and B.
    pub fn gates(self) -> u64 {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 3,
            Cell::Lstm => 4,
        }
    }

    /// The ONNX op type.
    pub fn name(self) -> &'static str {
        match self {
            Cell::Rnn => "RNN",
            Cell::Gru { .. } => "GRU",
            Cell::Lstm => "LSTM",
        }
    }
}

/// Which way a recurrent layer reads its sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// First to last.
    Forward,
    /// Last to first.
    Reverse,
    /// Both, outputs stacked forward then reverse.
    Bidirectional,
}

impl Direction {
    /// How many directions (1 or 2).
    pub fn count(self) -> u64 {
        match self {
            Direction::Bidirectional => 2,
            _ => 1,
        }
    }
}

/// Convolution attributes, for `k` spatial axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conv {
    /// Kernel size per spatial axis (from the attribute or the weight).
    pub kernel: Option<Vec<u64>>,
    /// Strides, default 1.
    pub strides: Option<Vec<u64>>,
    /// Dilations, default 1.
    pub dilations: Option<Vec<u64>>,
    /// Explicit or automatic padding.
    pub padding: Padding,
    /// Channel groups.
    pub group: u64,
}

/// Transposed convolution attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvTranspose {
    /// The shared convolution attributes.
    pub conv: Conv,
    /// Extra size added to one side of each output axis.
    pub output_padding: Option<Vec<u64>>,
    /// Explicit output spatial shape.
    pub output_shape: Option<Vec<u64>>,
}

/// Padding of a convolution or pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Padding {
    /// `[x1_begin, x2_begin, …, x1_end, x2_end, …]`; empty means zeros.
    Explicit(Vec<u64>),
    /// `SAME_UPPER`: output = ceil(input / stride), extra padding at the end.
    SameUpper,
    /// `SAME_LOWER`: as `SameUpper`, extra padding at the beginning.
    SameLower,
    /// `VALID`: no padding.
    Valid,
}

/// Gemm attributes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemm {
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C.
    pub beta: f32,
    /// Transpose A.
    pub trans_a: bool,
    /// Transpose B.
    pub trans_b: bool,
}

/// Elementwise functions of one tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Unary {
    /// max(x, 0).
    Relu,
    /// x for x ≥ 0, alpha·x otherwise.
    LeakyRelu {
        /// Slope.
        alpha: f32,
    },
    /// 1 / (1 + e^-x).
    Sigmoid,
    /// max(0, min(1, alpha·x + beta)).
    HardSigmoid {
        /// Slope.
        alpha: f32,
        /// Offset.
        beta: f32,
    },
    /// x · HardSigmoid(x; 1/6, 1/2).
    HardSwish,
    /// tanh.
    Tanh,
    /// Gaussian error linear unit.
    Gelu {
        /// The tanh approximation.
        tanh: bool,
    },
    /// Error function.
    Erf,
    /// Square root.
    Sqrt,
    /// Negation.
    Neg,
    /// e^x.
    Exp,
    /// 1/x.
    Reciprocal,
    /// ln x.
    Log,
    /// |x|.
    Abs,
    /// ln(1 + eˣ).
    Softplus,
    /// x / (1 + |x|).
    Softsign,
    /// x for x > 0, alpha·(eˣ − 1) otherwise.
    Elu {
        /// Scale of the negative part.
        alpha: f32,
    },
    /// gamma·(x for x > 0, alpha·(eˣ − 1) otherwise).
    Selu {
        /// Scale of the negative part.
        alpha: f32,
        /// Overall scale.
        gamma: f32,
    },
    /// sin x.
    Sin,
    /// cos x.
    Cos,
    /// tan x.
    Tan,
    /// arcsin x.
    Asin,
    /// arccos x.
    Acos,
    /// arctan x.
    Atan,
    /// sinh x.
    Sinh,
    /// cosh x.
    Cosh,
    /// arsinh x.
    Asinh,
    /// arcosh x.
    Acosh,
    /// artanh x.
    Atanh,
    /// x · tanh(softplus(x)) (YOLOv4's activation).
    Mish,
    /// max(0, x) + min(0, alpha·(e^(x/alpha) − 1)).
    Celu {
        /// Scale of the negative part.
        alpha: f32,
    },
    /// x for x > alpha, 0 otherwise.
    ThresholdedRelu {
        /// The threshold.
        alpha: f32,
    },
    /// x − bias for x > lambd, x + bias for x < −lambd, 0 between.
    Shrink {
        /// Shift of what is kept.
        bias: f32,
        /// Half-width of the band set to zero.
        lambd: f32,
    },
    /// Rounding down (no gradient).
    Floor,
    /// Rounding up (no gradient).
    Ceil,
    /// Rounding half to even (no gradient).
    Round,
    /// −1, 0 or 1 (no gradient).
    Sign,
    /// Logical negation of a boolean.
    Not,
    /// Whether a float is NaN (a boolean).
    IsNaN,
    /// Whether a float is infinite (a boolean), of the signs asked for.
    IsInf {
        /// Detect −∞.
        negative: bool,
        /// Detect +∞.
        positive: bool,
    },
}

impl Unary {
    /// Whether the function is piecewise constant or boolean: its gradient is zero.
    pub fn is_step(self) -> bool {
        matches!(
            self,
            Unary::Floor
                | Unary::Ceil
                | Unary::Round
                | Unary::Sign
                | Unary::Not
                | Unary::IsNaN
                | Unary::IsInf { .. }
        )
    }
}

/// Elementwise functions of two tensors, numpy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// a + b.
    Add,
    /// a − b.
    Sub,
    /// a · b.
    Mul,
    /// a / b.
    Div,
    /// a ^ b.
    Pow,
    /// a == b (boolean result).
    Equal,
    /// a < b (boolean result).
    Less,
    /// a ≤ b (boolean result).
    LessOrEqual,
    /// a > b (boolean result).
    Greater,
    /// a ≥ b (boolean result).
    GreaterOrEqual,
    /// a ∧ b of booleans.
    And,
    /// a ∨ b of booleans.
    Or,
    /// a ⊕ b of booleans.
    Xor,
    /// a for a ≥ 0, b·a otherwise (the slope `b` broadcast, one per channel).
    PRelu,
    /// a − b·⌊a/b⌋ of integers: the remainder with the divisor's sign (ONNX `Mod`, as
    /// Python's `%`).
    Mod,
    /// a − b·trunc(a/b): the remainder with the dividend's sign (ONNX `Mod` with
    /// `fmod=1`, C's `fmod`, PyTorch's `fmod`).
    Fmod,
}

impl Binary {
    /// Whether the result is boolean (comparisons and logic): no gradient flows.
    pub fn is_boolean(self) -> bool {
        !matches!(
            self,
            Binary::Add
                | Binary::Sub
                | Binary::Mul
                | Binary::Div
                | Binary::Pow
                | Binary::PRelu
                | Binary::Mod
                | Binary::Fmod
        )
    }

    /// The integer remainder `a mod c` as `self` (Mod or Fmod) takes it; `None` for a zero
    /// divisor or an overflow.
    pub fn remainder(self, a: i64, c: i64) -> Option<i64> {
        let r = a.checked_rem(c)?;
        Some(match self {
            // The divisor's sign: -7 mod 3 is 2, where Fmod gives -1.
            Binary::Mod if r != 0 && (r < 0) != (c < 0) => r + c,
            _ => r,
        })
    }

    /// The float remainder as `self` (Mod or Fmod) takes it.
    pub fn float_remainder(self, a: f32, c: f32) -> f32 {
        match self {
            Binary::Mod => a - c * (a / c).floor(),
            _ => a % c,
        }
    }

    /// The comparison `l ⋄ r` (`self` one of Equal, Less…GreaterOrEqual).
    pub fn compare<T: PartialOrd>(self, l: T, r: T) -> bool {
        match self {
            Binary::Less => l < r,
            Binary::LessOrEqual => l <= r,
            Binary::Greater => l > r,
            Binary::GreaterOrEqual => l >= r,
            _ => l == r,
        }
    }

    /// The logical `l ⋄ r` (`self` one of And, Or, Xor).
    pub fn logic(self, l: bool, r: bool) -> bool {
        match self {
            Binary::And => l && r,
            Binary::Or => l || r,
            _ => l != r,
        }
    }
}

/// Elementwise functions of any number of broadcast tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variadic {
    /// Σ.
    Sum,
    /// Σ / n.
    Mean,
    /// The largest.
    Max,
    /// The smallest.
    Min,
}

/// Pooling kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Maximum.
    Max,
    /// Average.
    Average,
}

/// Windowed pooling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Max or average.
    pub kind: PoolKind,
    /// Window per spatial axis.
    pub kernel: Vec<u64>,
    /// Strides, default 1.
    pub strides: Option<Vec<u64>>,
    /// Dilations, default 1.
    pub dilations: Option<Vec<u64>>,
    /// Padding.
    pub padding: Padding,
    /// Round the output size up.
    pub ceil_mode: bool,
    /// Average: divide by the full window, padding included.
    pub count_include_pad: bool,
}

/// Resize attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct Resize {
    /// Nearest or linear.
    pub mode: ResizeMode,
    /// How an output coordinate maps to an input one.
    pub coordinates: CoordinateMode,
    /// How a nearest-neighbour coordinate is rounded.
    pub nearest: NearestMode,
    /// Scales given as an attribute (Upsample, opset < 9).
    pub scales: Option<Vec<f32>>,
    /// Where the scales and sizes inputs are: `(1, None)` for Upsample and Resize-10,
    /// `(2, Some(3))` from Resize-11 on (input 1 is the region of interest).
    pub slots: (usize, Option<usize>),
    /// The axes the scales or sizes apply to (opset 18); all when absent.
    pub axes: Option<Vec<i64>>,
}

/// Interpolation of [`Resize`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeMode {
    /// The nearest input element.
    Nearest,
    /// Linear in every resized axis (bilinear, trilinear…).
    Linear,
}

/// ONNX Resize's `coordinate_transformation_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordinateMode {
    /// `(x + 0.5) / scale − 0.5`.
    HalfPixel,
    /// As `HalfPixel`, centred when the scale and the sizes disagree.
    HalfPixelSymmetric,
    /// As `HalfPixel`, but 0 for an output of length 1.
    PytorchHalfPixel,
    /// `x · (in − 1) / (out − 1)`.
    AlignCorners,
    /// `x / scale`.
    Asymmetric,
}

/// ONNX Resize's `nearest_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NearestMode {
    /// Round, halves down.
    RoundPreferFloor,
    /// Round, halves up.
    RoundPreferCeil,
    /// Down.
    Floor,
    /// Up.
    Ceil,
}

impl Resize {
    /// The input coordinate that output coordinate `x` maps to along an axis of `input`
    /// elements resized to `output` at `scale`.
    pub fn source(&self, x: usize, input: usize, output: usize, scale: f64) -> f64 {
        let x = x as f64;
        match self.coordinates {
            CoordinateMode::HalfPixel => (x + 0.5) / scale - 0.5,
            CoordinateMode::HalfPixelSymmetric => {
                let adjustment = output as f64 / (scale * input as f64);
                let offset = input as f64 / 2.0 * (1.0 - adjustment);
                offset + (x + 0.5) / scale - 0.5
            }
            CoordinateMode::PytorchHalfPixel if output > 1 => (x + 0.5) / scale - 0.5,
            CoordinateMode::PytorchHalfPixel => 0.0,
            CoordinateMode::AlignCorners if output > 1 => {
                x * (input as f64 - 1.0) / (output as f64 - 1.0)
            }
            CoordinateMode::AlignCorners => 0.0,
            CoordinateMode::Asymmetric => x / scale,
        }
    }

    /// The input elements output coordinate `x` reads along one axis, with their weights.
    pub fn taps(&self, x: usize, input: usize, output: usize, scale: f64) -> Vec<(usize, f32)> {
        let last = input.saturating_sub(1);
        let src = self.source(x, input, output, scale);
        match self.mode {
            ResizeMode::Nearest => {
                let frac = src - src.floor();
                let i = match self.nearest {
                    NearestMode::RoundPreferFloor if frac == 0.5 => src.floor(),
                    NearestMode::RoundPreferCeil if frac == 0.5 => src.ceil(),
                    NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => src.round(),
                    NearestMode::Floor => src.floor(),
                    NearestMode::Ceil => src.ceil(),
                };
                vec![((i.max(0.0) as usize).min(last), 1.0)]
            }
            ResizeMode::Linear => {
                let src = src.clamp(0.0, last as f64);
                let lo = src.floor() as usize;
                let hi = (lo + 1).min(last);
                let w = (src - lo as f64) as f32;
                if w == 0.0 || hi == lo {
                    vec![(lo, 1.0)]
                } else {
                    vec![(lo, 1.0 - w), (hi, w)]
                }
            }
        }
    }
}

/// Slice ranges given as attributes (opset < 10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceRanges {
    /// Start per axis.
    pub starts: Vec<i64>,
    /// End per axis.
    pub ends: Vec<i64>,
    /// Axes (default 0..n).
    pub axes: Option<Vec<i64>>,
}

/// What a reduction computes over the reduced axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    /// Σx.
    Sum,
    /// Σx / n.
    Mean,
    /// max x.
    Max,
    /// min x.
    Min,
    /// Πx.
    Prod,
    /// Σ|x|.
    L1,
    /// √Σx².
    L2,
    /// ln Σx.
    LogSum,
    /// ln Σeˣ.
    LogSumExp,
    /// Σx².
    SumSquare,
}

impl ReduceKind {
    /// The ONNX operator, `Reduce<kind>`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "ReduceSum",
            ReduceKind::Mean => "ReduceMean",
            ReduceKind::Max => "ReduceMax",
            ReduceKind::Min => "ReduceMin",
            ReduceKind::Prod => "ReduceProd",
            ReduceKind::L1 => "ReduceL1",
            ReduceKind::L2 => "ReduceL2",
            ReduceKind::LogSum => "ReduceLogSum",
            ReduceKind::LogSumExp => "ReduceLogSumExp",
            ReduceKind::SumSquare => "ReduceSumSquare",
        }
    }

    /// Every kind, for the importer.
    pub const ALL: [ReduceKind; 10] = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
        ReduceKind::L1,
        ReduceKind::L2,
        ReduceKind::LogSum,
        ReduceKind::LogSumExp,
        ReduceKind::SumSquare,
    ];
}

/// Pad fill mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    /// A constant value.
    Constant,
    /// Mirror without the edge.
    Reflect,
    /// Repeat the edge.
    Edge,
    /// Wrap around.
    Wrap,
}

impl Op {
    /// The ONNX `op_type` this variant stands for (a family name for `Unary`/`Binary`).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "Input",
            Op::Constant {
                initializer: true, ..
            } => "Initializer",
            Op::Constant {
                initializer: false, ..
            } => "Constant",
            Op::Conv(_) => "Conv",
            Op::ConvTranspose(_) => "ConvTranspose",
            Op::Gemm(_) => "Gemm",
            Op::MatMul => "MatMul",
            Op::Unary(u) => match u {
                Unary::Relu => "Relu",
                Unary::LeakyRelu { .. } => "LeakyRelu",
                Unary::Sigmoid => "Sigmoid",
                Unary::HardSigmoid { .. } => "HardSigmoid",
                Unary::HardSwish => "HardSwish",
                Unary::Tanh => "Tanh",
                Unary::Gelu { .. } => "Gelu",
                Unary::Erf => "Erf",
                Unary::Sqrt => "Sqrt",
                Unary::Neg => "Neg",
                Unary::Exp => "Exp",
                Unary::Reciprocal => "Reciprocal",
                Unary::Log => "Log",
                Unary::Abs => "Abs",
                Unary::Softplus => "Softplus",
                Unary::Softsign => "Softsign",
                Unary::Elu { .. } => "Elu",
                Unary::Selu { .. } => "Selu",
                Unary::Sin => "Sin",
                Unary::Tan => "Tan",
                Unary::Asin => "Asin",
                Unary::Acos => "Acos",
                Unary::Atan => "Atan",
                Unary::Sinh => "Sinh",
                Unary::Cosh => "Cosh",
                Unary::Asinh => "Asinh",
                Unary::Acosh => "Acosh",
                Unary::Atanh => "Atanh",
                Unary::Mish => "Mish",
                Unary::Celu { .. } => "Celu",
                Unary::ThresholdedRelu { .. } => "ThresholdedRelu",
                Unary::Shrink { .. } => "Shrink",
                Unary::Cos => "Cos",
                Unary::Floor => "Floor",
                Unary::Ceil => "Ceil",
                Unary::Round => "Round",
                Unary::Sign => "Sign",
                Unary::Not => "Not",
                Unary::IsNaN => "IsNaN",
                Unary::IsInf { .. } => "IsInf",
            },
            Op::Clip { .. } => "Clip",
            Op::Binary(b) => match b {
                Binary::Add => "Add",
                Binary::Sub => "Sub",
                Binary::Mul => "Mul",
                Binary::Div => "Div",
                Binary::Pow => "Pow",
                Binary::PRelu => "PRelu",
                Binary::Mod | Binary::Fmod => "Mod",
                Binary::Equal => "Equal",
                Binary::Less => "Less",
                Binary::LessOrEqual => "LessOrEqual",
                Binary::Greater => "Greater",
                Binary::GreaterOrEqual => "GreaterOrEqual",
                Binary::And => "And",
                Binary::Or => "Or",
                Binary::Xor => "Xor",
            },
            Op::Variadic(v) => match v {
                Variadic::Sum => "Sum",
                Variadic::Mean => "Mean",
                Variadic::Max => "Max",
                Variadic::Min => "Min",
            },
            Op::Softmax { log: false, .. } => "Softmax",
            Op::Softmax { log: true, .. } => "LogSoftmax",
            Op::Pool(Pool {
                kind: PoolKind::Max,
                ..
            }) => "MaxPool",
            Op::Pool(Pool {
                kind: PoolKind::Average,
                ..
            }) => "AveragePool",
            Op::GlobalPool(PoolKind::Max) => "GlobalMaxPool",
            Op::GlobalPool(PoolKind::Average) => "GlobalAveragePool",
            Op::BatchNorm { .. } => "BatchNormalization",
            Op::LayerNorm { .. } => "LayerNormalization",
            Op::Lrn { .. } => "LRN",
            Op::Concat { .. } => "Concat",
            Op::Split { .. } => "Split",
            Op::Slice { .. } => "Slice",
            Op::Flatten { .. } => "Flatten",
            Op::Reshape { .. } => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::Squeeze { .. } => "Squeeze",
            Op::Unsqueeze { .. } => "Unsqueeze",
            Op::Gather { .. } => "Gather",
            Op::Shape { .. } => "Shape",
            Op::ConstantOfShape { .. } => "ConstantOfShape",
            Op::Range => "Range",
            Op::Cast { .. } => "Cast",
            Op::Dropout { .. } => "Dropout",
            Op::Identity => "Identity",
            Op::Reduce { kind, .. } => kind.name(),
            Op::Pad { .. } => "Pad",
            Op::Where => "Where",
            Op::Expand => "Expand",
            Op::Resize(_) => "Resize",
            Op::Recurrent(r) => r.cell.name(),
            Op::Trilu { .. } => "Trilu",
            Op::Size => "Size",
            Op::GatherElements { .. } => "GatherElements",
            Op::GatherNd { .. } => "GatherND",
            Op::ScatterElements { .. } => "ScatterElements",
            Op::ScatterNd { .. } => "ScatterND",
            Op::CumSum { .. } => "CumSum",
            Op::Einsum(_) => "Einsum",
            Op::Stft { .. } => "STFT",
            Op::Tile => "Tile",
            Op::DepthToSpace { .. } => "DepthToSpace",
            Op::SpaceToDepth { .. } => "SpaceToDepth",
            Op::InstanceNorm { .. } => "InstanceNormalization",
            Op::GroupNorm { .. } => "GroupNormalization",
            Op::ReverseSequence { .. } => "ReverseSequence",
            Op::ArgExtreme { max: true, .. } => "ArgMax",
            Op::ArgExtreme { max: false, .. } => "ArgMin",
            Op::TopK { .. } => "TopK",
            Op::If(_) => "If",
            Op::Loop(_) => "Loop",
        }
    }

    /// Whether this is a trainable weight: a floating-point initializer of more than one
    /// element. A one-element initializer is a constant of the formula (an exponent, an
    /// ε, a scale), as in PyTorch, where such numbers are never parameters: training it
    /// would change the function (and the exponent of a negative base has no gradient).
    pub fn is_weight(&self) -> bool {
        matches!(self, Op::Constant { tensor, initializer: true }
            if tensor.dtype.is_float() && tensor.numel().is_some_and(|n| n > 1))
    }
}
