//! An operator's facts in one place: its class, its forward arithmetic, what its forward
//! pass keeps and its backward pass reads, how it may join its producer's placement unit
//! and how its output relates to its input.
//!
//! [`Op::facts`] is one exhaustive match with no wildcard, down to every [`Unary`],
//! [`Binary`] and [`Variadic`] function: a new operator does not compile until its facts
//! are written. The accounting (`count.rs`), the activation stash and release of both the
//! planner and the runtime, the rewrite rules' fusions and the zero-bubble weight pass read
//! them here and nowhere else.

use super::{Binary, Einsum, Op, PoolKind, Recurrent, ReduceKind, ResizeMode, Unary, Variadic};
use crate::graph::Node;
use crate::ids::ValueId;

/// Everything the compiler knows about an operator besides what it computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpFacts<'a> {
    /// Its coarse class, for reports and the cost model.
    pub class: OpClass,
    /// Its forward arithmetic.
    pub work: Work<'a>,
    /// What its forward pass keeps for its backward pass besides its operands.
    pub saves: ForwardSaves,
    /// What of its forward pass its backward pass reads.
    pub reads: BackwardReads,
    /// How it may join the placement unit of the op that produces its input.
    pub joins: Joins,
    /// How its first output's elements relate to its first input's.
    pub elements: Elements,
}

/// Coarse classes of operators, for reports and cost models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpClass {
    /// Graph inputs and constants.
    Source,
    /// Conv, ConvTranspose.
    Conv,
    /// Gemm, MatMul.
    Dense,
    /// Elementwise arithmetic and activations.
    Elementwise,
    /// Pooling.
    Pool,
    /// Normalization.
    Norm,
    /// Softmax.
    Softmax,
    /// Reductions.
    Reduce,
    /// Data movement and shape arithmetic (no arithmetic on values).
    Shape,
    /// Recurrent layers: a product per time step, sequential across steps.
    Recurrent,
}

/// An operator's forward floating-point work, by the conventions of published model
/// tables (torchvision's): products count multiply-accumulates, everything else FLOPs;
/// a transcendental function counts as one operation plus its arithmetic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work<'a> {
    /// No arithmetic on values (data movement, shape arithmetic, sources).
    None,
    /// This many FLOPs per element of its first output.
    PerOutput(u64),
    /// This many FLOPs per element of its first input (reductions).
    PerInput(u64),
    /// One FLOP per output element for every operand after the first (`Sum`, `Max`, …
    /// of n tensors).
    PerExtraOperand,
    /// Multiply-accumulates of a product, counted from the operands' shapes.
    Product(Product<'a>),
}

/// The products, each counted by its own formula from its operands' shapes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Product<'a> {
    /// Output elements × the weight's elements per output channel, plus a bias add.
    Conv,
    /// Input elements × the weight's elements per input channel, plus a bias add.
    ConvTranspose,
    /// Output elements × the contracted width, plus a bias add.
    Gemm {
        /// Whether A is transposed (its contracted axis is its first).
        trans_a: bool,
    },
    /// Output elements × the contracted width.
    MatMul,
    /// The gates' products with the input and the previous state, per step.
    Recurrent(&'a Recurrent),
    /// One product per combination of all labels' indices.
    Einsum(&'a Einsum),
    /// Every output number a dot product of a frame with a DFT row.
    Stft {
        /// Only the bins up to half the frame length.
        onesided: bool,
    },
}

impl Product<'_> {
    /// Whether the backward pass makes a weight operand's gradient by a product of its
    /// own (dW = xᵀ·dy), apart from the input's gradient: the work a zero-bubble
    /// schedule defers into its weight pass. An Einsum's operands are activations in the
    /// models ralpc sees (attention scores); a spectrogram's DFT matrix is not trained.
    pub fn makes_weight_gradient(self) -> bool {
        match self {
            Product::Conv
            | Product::ConvTranspose
            | Product::Gemm { .. }
            | Product::MatMul
            | Product::Recurrent(_) => true,
            Product::Einsum(_) | Product::Stft { .. } => false,
        }
    }
}

/// How an operator may join the placement unit of the op producing its input: the rewrite
/// rules fuse placement, not arithmetic (a fused unit still runs every op it covers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Joins {
    /// Never: it is a unit of its own.
    Never,
    /// An activation or another one-operand function: `f(P(..))`.
    Activation,
    /// Arithmetic with a constant (a bias, a scale) or an activation (a residual).
    Arithmetic,
    /// Dropout: the mask is still drawn in training.
    Dropout,
    /// A view that moves no data: `view(P(..), shape)`.
    View,
}

/// How an operator's first output's elements relate to its first input's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elements {
    /// It computes new elements.
    Computed,
    /// The same elements under another shape: no kernel launches and no data moves
    /// (Reshape, Flatten, Squeeze, Unsqueeze, Identity).
    Alias,
    /// The same elements in a kernel of its own (Dropout, whose mask training draws), so
    /// its gradient passes back unchanged as an alias's does.
    Passed,
}

/// The operands whose elements an op's backward pass reads.
///
/// Shapes are always known; this is about elements. An operand whose elements the backward
/// pass does not read (a residual sum's operands, a max pool's input once its argmax is
/// saved, a ReLU's input once its output exists) need not outlive the forward pass: the
/// planner's activation stash and the runtime's release of activations after a layer's
/// forward pass both follow this, so the memory the plan predicts is the memory a run holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardReads {
    /// Bit `i`: input slot `i` (slots past 63 share bit 63).
    inputs: u64,
    /// Whether it reads its outputs.
    pub outputs: bool,
}

impl BackwardReads {
    /// Nothing but shapes.
    pub const SHAPES: BackwardReads = BackwardReads {
        inputs: 0,
        outputs: false,
    };
    /// Every input, no output.
    pub const INPUTS: BackwardReads = BackwardReads {
        inputs: u64::MAX,
        outputs: false,
    };
    /// Every operand.
    pub const ALL: BackwardReads = BackwardReads {
        inputs: u64::MAX,
        outputs: true,
    };
    /// Its outputs alone.
    pub const OUTPUTS: BackwardReads = BackwardReads {
        inputs: 0,
        outputs: true,
    };

    /// Input slot `slot` alone.
    const fn slot(slot: u32) -> BackwardReads {
        BackwardReads {
            inputs: 1 << slot,
            outputs: false,
        }
    }

    /// Input slots `first` and after (an op's attribute operands: pads, scales, ranges).
    const fn from(first: u32) -> BackwardReads {
        BackwardReads {
            inputs: u64::MAX << first,
            outputs: false,
        }
    }

    /// Whether the backward pass reads input slot `slot`'s elements.
    pub fn input(self, slot: usize) -> bool {
        self.inputs & (1 << slot.min(63)) != 0
    }
}

/// What an op's forward pass keeps for its backward pass besides its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardSaves {
    /// Nothing of a tensor's size (at most per-channel statistics).
    Nothing,
    /// An 8-byte index per element of its first output (a max pool's argmax).
    IndexPerOutput,
    /// A copy of its first output's size (a layer normalization's normalized input, on a
    /// device).
    CopyOfOutput,
}

impl<'a> OpFacts<'a> {
    /// Computes nothing and has no gradient to pass: sources, shape arithmetic.
    const INERT: OpFacts<'static> = OpFacts {
        class: OpClass::Shape,
        work: Work::None,
        saves: ForwardSaves::Nothing,
        reads: BackwardReads::SHAPES,
        joins: Joins::Never,
        elements: Elements::Computed,
    };

    /// Moves its input's elements (the gradient moves back as they moved), reading `reads`.
    const fn movement(reads: BackwardReads) -> OpFacts<'static> {
        OpFacts {
            reads,
            ..OpFacts::INERT
        }
    }

    /// A product of its inputs: each operand's gradient is the other's product with the
    /// output's, so the backward reads every input.
    const fn product(class: OpClass, product: Product<'a>) -> OpFacts<'a> {
        OpFacts {
            class,
            work: Work::Product(product),
            reads: BackwardReads::INPUTS,
            ..OpFacts::INERT
        }
    }

    /// `flops` per output element in class `class`, reading `reads`.
    const fn per_output(class: OpClass, flops: u64, reads: BackwardReads) -> OpFacts<'static> {
        OpFacts {
            class,
            work: Work::PerOutput(flops),
            reads,
            ..OpFacts::INERT
        }
    }

    /// A normalization: `flops` per output element, its backward reads its inputs.
    const fn norm(flops: u64) -> OpFacts<'static> {
        OpFacts::per_output(OpClass::Norm, flops, BackwardReads::INPUTS)
    }

    /// It may join its producer's unit as `joins`.
    const fn joining(self, joins: Joins) -> OpFacts<'a> {
        OpFacts { joins, ..self }
    }
}

impl Op {
    /// The operator's facts.
    pub fn facts(&self) -> OpFacts<'_> {
        use OpClass as C;
        match self {
            Op::Input | Op::Constant { .. } => OpFacts {
                class: C::Source,
                ..OpFacts::INERT
            },
            Op::Conv(_) => OpFacts::product(C::Conv, Product::Conv),
            Op::ConvTranspose(_) => OpFacts::product(C::Conv, Product::ConvTranspose),
            Op::Gemm(g) => OpFacts::product(C::Dense, Product::Gemm { trans_a: g.trans_a }),
            Op::MatMul => OpFacts::product(C::Dense, Product::MatMul),
            Op::Recurrent(r) => OpFacts::product(C::Recurrent, Product::Recurrent(r)),
            // A contraction is a product and a reduction; the planner splits it by samples
            // only, as a reduction (no tensor-parallel lowering of its operands). A
            // spectrogram is a product with the DFT matrix frame by frame: the same.
            Op::Einsum(e) => OpFacts::product(C::Reduce, Product::Einsum(e)),
            Op::Stft { onesided } => OpFacts::product(
                C::Reduce,
                Product::Stft {
                    onesided: *onesided,
                },
            ),
            Op::Unary(u) => unary(*u),
            // Two comparisons; the backward compares the input with the bounds.
            Op::Clip { .. } => OpFacts::per_output(C::Elementwise, 2, BackwardReads::INPUTS)
                .joining(Joins::Activation),
            Op::Binary(b) => binary(*b),
            Op::Variadic(v) => OpFacts {
                class: C::Elementwise,
                work: Work::PerExtraOperand,
                reads: match v {
                    // A sum or mean spreads its gradient; a max or min routes it by the
                    // operands' values.
                    Variadic::Sum | Variadic::Mean => BackwardReads::SHAPES,
                    Variadic::Max | Variadic::Min => BackwardReads::ALL,
                },
                ..OpFacts::INERT
            },
            // The condition steers the gradient.
            Op::Where => OpFacts::per_output(C::Elementwise, 1, BackwardReads::slot(0)),
            Op::Dropout { .. } => OpFacts {
                elements: Elements::Passed,
                ..OpFacts::per_output(C::Elementwise, 1, BackwardReads::SHAPES)
                    .joining(Joins::Dropout)
            },
            // The diagonal offset (input 1) steers the gradient.
            Op::Trilu { .. } => OpFacts::per_output(C::Elementwise, 1, BackwardReads::slot(1)),
            // A running sum is elementwise in cost: one add per element.
            Op::CumSum { .. } => OpFacts::per_output(C::Elementwise, 1, BackwardReads::ALL),
            // Max, subtract, exponentiate, sum, divide; softmax' = y(δ − y).
            Op::Softmax { .. } => OpFacts::per_output(C::Softmax, 5, BackwardReads::OUTPUTS),
            Op::Pool(p) => OpFacts {
                saves: match p.kind {
                    PoolKind::Max => ForwardSaves::IndexPerOutput,
                    PoolKind::Average => ForwardSaves::Nothing,
                },
                // A max pool saved its argmax; an average pool spreads its gradient evenly
                // (in one or two dimensions: the volume kernels read their operands).
                ..OpFacts::per_output(
                    C::Pool,
                    p.kernel.iter().fold(1, |a: u64, &k| a.saturating_mul(k)),
                    if p.kernel.len() <= 2 {
                        BackwardReads::SHAPES
                    } else {
                        BackwardReads::ALL
                    },
                )
            },
            Op::GlobalPool(kind) => OpFacts {
                class: C::Pool,
                work: Work::PerInput(1),
                reads: match kind {
                    PoolKind::Average => BackwardReads::SHAPES,
                    PoolKind::Max => BackwardReads::ALL,
                },
                ..OpFacts::INERT
            },
            // Resampling works per channel on spatial windows, as pooling does. Bilinear:
            // four taps, a multiply-add each; nearest: a copy. The scales and sizes
            // (inputs 1 and after) steer the gradient.
            Op::Resize(r) => OpFacts::per_output(
                C::Pool,
                match r.mode {
                    ResizeMode::Nearest => 0,
                    ResizeMode::Linear => 8,
                },
                BackwardReads::from(1),
            ),
            // Training-mode forward: mean, variance, normalize, scale and shift.
            Op::BatchNorm { .. } | Op::InstanceNorm { .. } | Op::GroupNorm { .. } => {
                OpFacts::norm(7)
            }
            Op::LayerNorm { .. } => OpFacts {
                saves: ForwardSaves::CopyOfOutput,
                ..OpFacts::norm(7)
            },
            // A sum of `size` squares per output, then scale, power and divide.
            Op::Lrn { size, .. } => OpFacts::norm(size.saturating_add(3)),
            Op::Reduce { kind, .. } => OpFacts {
                class: C::Reduce,
                // One operation per input element, plus what each element is mapped
                // through.
                work: Work::PerInput(match kind {
                    ReduceKind::L1 | ReduceKind::L2 | ReduceKind::SumSquare => 2,
                    ReduceKind::LogSumExp => 3,
                    ReduceKind::Sum
                    | ReduceKind::Mean
                    | ReduceKind::Max
                    | ReduceKind::Min
                    | ReduceKind::Prod
                    | ReduceKind::LogSum => 1,
                }),
                // A sum or mean over axes spreads its gradient evenly (an RMSNorm's mean
                // of squares keeps nothing of them).
                reads: match kind {
                    ReduceKind::Sum | ReduceKind::Mean => BackwardReads::SHAPES,
                    ReduceKind::Max
                    | ReduceKind::Min
                    | ReduceKind::Prod
                    | ReduceKind::L1
                    | ReduceKind::L2
                    | ReduceKind::LogSum
                    | ReduceKind::LogSumExp
                    | ReduceKind::SumSquare => BackwardReads::ALL,
                },
                ..OpFacts::INERT
            },
            // A comparison per input element; no gradient flows through an index.
            Op::ArgExtreme { .. } => OpFacts {
                class: C::Reduce,
                work: Work::PerInput(1),
                ..OpFacts::INERT
            },
            // A comparison per input element; the gradient of the values goes back to the
            // elements the indices name.
            Op::TopK { .. } => OpFacts {
                class: C::Reduce,
                work: Work::PerInput(1),
                reads: BackwardReads::OUTPUTS,
                ..OpFacts::INERT
            },
            // Views: the same elements under another shape.
            Op::Flatten { .. }
            | Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Identity => OpFacts {
                elements: Elements::Alias,
                joins: Joins::View,
                ..OpFacts::INERT
            },
            // Data movement: the gradient moves back as the elements moved, steered by the
            // index and attribute operands.
            Op::Cast { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Transpose { .. }
            | Op::Expand => OpFacts::movement(BackwardReads::SHAPES),
            Op::Gather { .. } => OpFacts::movement(BackwardReads::slot(1)),
            Op::Slice { .. } | Op::Pad { .. } => OpFacts::movement(BackwardReads::from(1)),
            // Their gradients read every operand (the scatters' updates and indices, the
            // rearrangements' layouts, the control flow's branches).
            Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::ScatterElements { .. }
            | Op::ScatterNd { .. }
            | Op::Tile
            | Op::ReverseSequence { .. }
            | Op::DepthToSpace { .. }
            | Op::SpaceToDepth { .. }
            | Op::If(_)
            | Op::Loop(_) => OpFacts::movement(BackwardReads::ALL),
            // No gradient flows through these.
            Op::Shape { .. } | Op::Size | Op::ConstantOfShape { .. } | Op::Range => OpFacts::INERT,
        }
    }

    /// The operator's class ([`OpFacts::class`]).
    pub fn class(&self) -> OpClass {
        self.facts().class
    }

    /// Whether its first output is its first input's elements, so its gradient passes back
    /// unchanged ([`Elements::Alias`] or [`Elements::Passed`]).
    pub fn is_view(&self) -> bool {
        self.facts().elements != Elements::Computed
    }

    /// What this op's forward pass keeps for its backward pass besides its operands, on
    /// the backend that keeps the most ([`OpFacts::saves`]).
    pub fn forward_saves(&self) -> ForwardSaves {
        self.facts().saves
    }

    /// What this op's backward pass reads of its forward pass, on every backend (the
    /// host's reference gradients and the device kernels alike read no more)
    /// ([`OpFacts::reads`]).
    pub fn backward_reads(&self) -> BackwardReads {
        self.facts().reads
    }
}

/// The facts of a one-tensor elementwise function: one row per function, its FLOPs per
/// element (a transcendental function as one operation plus its arithmetic), what its
/// backward pass reads and whether it joins its producer's unit.
///
/// Derivatives that are functions of the output read the output alone: max(x, 0) > 0
/// exactly where x > 0; σ' = y(1 − y), tanh' = 1 − y², exp' = y, √' = 1/2y,
/// (1/x)' = −y². The others read their input (and, on some backends, their output).
/// Activations (and the error function of a decomposed GELU) join the unit producing their
/// input, as a GEMM's or convolution's epilogue; other math stays a unit of its own unless
/// a chain of arithmetic carries it.
fn unary(u: Unary) -> OpFacts<'static> {
    use BackwardReads as R;
    use Joins::{Activation as Act, Never};
    use Unary as U;
    let (flops, reads, joins) = match u {
        U::Relu => (1, R::OUTPUTS, Act),
        U::LeakyRelu { .. } => (2, R::ALL, Act),
        U::Sigmoid => (4, R::OUTPUTS, Act),
        U::HardSigmoid { .. } => (3, R::ALL, Act),
        U::HardSwish => (4, R::ALL, Act),
        U::Tanh => (4, R::OUTPUTS, Act),
        // x·Φ(x).
        U::Gelu { .. } => (8, R::ALL, Act),
        U::Erf => (1, R::ALL, Act),
        U::Softplus | U::Softsign => (3, R::ALL, Act),
        U::Elu { .. } => (3, R::ALL, Act),
        U::Selu { .. } | U::Celu { .. } => (4, R::ALL, Act),
        // x·tanh(softplus x).
        U::Mish => (8, R::ALL, Act),
        U::ThresholdedRelu { .. } => (2, R::ALL, Act),
        U::Shrink { .. } => (2, R::ALL, Never),
        U::Sqrt | U::Exp | U::Reciprocal => (1, R::OUTPUTS, Never),
        U::Neg | U::Log | U::Abs | U::Sin | U::Cos => (1, R::ALL, Never),
        U::Tan
        | U::Asin
        | U::Acos
        | U::Atan
        | U::Sinh
        | U::Cosh
        | U::Asinh
        | U::Acosh
        | U::Atanh => (4, R::ALL, Never),
        U::Floor | U::Ceil | U::Round | U::Sign | U::Not | U::IsNaN | U::IsInf { .. } => {
            (1, R::ALL, Never)
        }
    };
    OpFacts::per_output(OpClass::Elementwise, flops, reads).joining(joins)
}

/// The facts of a two-tensor elementwise function: one FLOP per element; a sum or
/// difference spreads its gradient, a product's operand gradient is the other operand's
/// product with the output's, the rest read everything; arithmetic joins its producer's
/// unit.
fn binary(b: Binary) -> OpFacts<'static> {
    use BackwardReads as R;
    use Binary as B;
    use Joins::{Arithmetic, Never};
    let (reads, joins) = match b {
        B::Add | B::Sub => (R::SHAPES, Arithmetic),
        B::Mul => (R::INPUTS, Arithmetic),
        B::Div => (R::ALL, Arithmetic),
        B::Pow | B::PRelu | B::Mod | B::Fmod => (R::ALL, Never),
        B::Equal | B::Less | B::LessOrEqual | B::Greater | B::GreaterOrEqual => (R::ALL, Never),
        B::And | B::Or | B::Xor => (R::ALL, Never),
    };
    OpFacts::per_output(OpClass::Elementwise, 1, reads).joining(joins)
}

impl Node {
    /// The values whose elements this node's backward pass reads ([`Op::backward_reads`]):
    /// inputs and outputs, a value once per slot that reads it.
    pub fn read_by_backward(&self) -> impl Iterator<Item = ValueId> + '_ {
        let reads = self.op.backward_reads();
        let inputs = self
            .inputs
            .iter()
            .enumerate()
            .filter_map(move |(slot, v)| v.filter(|_| reads.input(slot)));
        let outputs = self.outputs.iter().copied().filter(move |_| reads.outputs);
        inputs.chain(outputs)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_read_as_declared() {
        let pad = BackwardReads::from(1);
        assert!(!pad.input(0) && pad.input(1) && pad.input(2) && pad.input(200));
        let gather = BackwardReads::slot(1);
        assert!(!gather.input(0) && gather.input(1) && !gather.input(2));
        assert!(!BackwardReads::SHAPES.input(0) && !BackwardReads::SHAPES.outputs);
        assert!(BackwardReads::ALL.input(70) && BackwardReads::ALL.outputs);
    }

    #[test]
    fn a_relu_reads_its_output_and_a_residual_sum_nothing() {
        assert_eq!(
            Op::Unary(Unary::Relu).backward_reads(),
            BackwardReads::OUTPUTS
        );
        assert_eq!(
            Op::Binary(Binary::Add).backward_reads(),
            BackwardReads::SHAPES
        );
        assert_eq!(
            Op::Unary(Unary::Tanh).backward_reads(),
            BackwardReads::OUTPUTS
        );
        assert_eq!(Op::Unary(Unary::Erf).backward_reads(), BackwardReads::ALL);
    }

    #[test]
    fn a_mean_over_axes_reads_shapes_and_a_max_its_operands() {
        let reduce = |kind| Op::Reduce {
            kind,
            axes: Some(vec![-1]),
            keepdims: true,
            noop_with_empty_axes: false,
        };
        assert_eq!(
            reduce(ReduceKind::Mean).backward_reads(),
            BackwardReads::SHAPES
        );
        assert_eq!(
            reduce(ReduceKind::Sum).backward_reads(),
            BackwardReads::SHAPES
        );
        assert_eq!(reduce(ReduceKind::Max).backward_reads(), BackwardReads::ALL);
    }

    /// The activations real exports use join a GEMM's or convolution's unit as its
    /// epilogue; math that is not an activation does not.
    #[test]
    fn activations_join_their_producer_and_other_math_does_not() {
        for u in [
            Unary::Mish,
            Unary::Softplus,
            Unary::Softsign,
            Unary::Elu { alpha: 1.0 },
            Unary::Selu {
                alpha: 1.67,
                gamma: 1.05,
            },
            Unary::Celu { alpha: 1.0 },
            Unary::Gelu { tanh: true },
            Unary::Relu,
        ] {
            assert_eq!(Op::Unary(u).facts().joins, Joins::Activation, "{u:?}");
        }
        for u in [Unary::Sin, Unary::Floor, Unary::Not, Unary::Log] {
            assert_eq!(Op::Unary(u).facts().joins, Joins::Never, "{u:?}");
        }
        assert_eq!(Op::Binary(Binary::Add).facts().joins, Joins::Arithmetic);
        assert_eq!(Op::Binary(Binary::Pow).facts().joins, Joins::Never);
    }

    /// Products are counted by their formulas, and only those multiplying a weight make
    /// its gradient apart.
    #[test]
    fn products_say_which_make_weight_gradients() {
        let gemm = Op::MatMul.facts();
        assert_eq!(gemm.class, OpClass::Dense);
        assert!(matches!(gemm.work, Work::Product(p) if p.makes_weight_gradient()));
        let stft = Op::Stft { onesided: true }.facts();
        assert!(matches!(stft.work, Work::Product(p) if !p.makes_weight_gradient()));
        assert_eq!(Op::Unary(Unary::Mish).facts().work, Work::PerOutput(8));
        assert_eq!(Op::Identity.facts().elements, Elements::Alias);
        assert!(
            Op::Dropout { ratio: None }.is_view() && Op::Reshape { allowzero: false }.is_view()
        );
        assert!(!Op::Transpose { perm: None }.is_view());
    }
}
