//! What each operator's backward pass reads of its forward pass: the one definition the
//! planner's activation stash and the runtime's release of activations after a layer's
//! forward pass both follow, so the memory the plan predicts is the memory a run holds.
//!
//! Shapes are always known; this is about elements. An operand whose elements the backward
//! pass does not read (a residual sum's operands, a max pool's input once its argmax is
//! saved, a ReLU's input once its output exists) need not outlive the forward pass.

use crate::graph::Node;
use crate::ids::ValueId;
use crate::op::{Binary, Op, PoolKind, ReduceKind, Unary, Variadic};

/// The operands whose elements an op's backward pass reads.
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

impl Op {
    /// Whether its first output is its first input's elements under another shape (a
    /// view), so its gradient passes back unchanged.
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::Flatten { .. }
                | Op::Reshape { .. }
                | Op::Squeeze { .. }
                | Op::Unsqueeze { .. }
                | Op::Identity
                | Op::Dropout { .. }
        )
    }

    /// What this op's forward pass keeps for its backward pass besides its operands, on
    /// the backend that keeps the most.
    pub fn forward_saves(&self) -> ForwardSaves {
        match self {
            Op::Pool(p) if p.kind == PoolKind::Max => ForwardSaves::IndexPerOutput,
            Op::LayerNorm { .. } => ForwardSaves::CopyOfOutput,
            _ => ForwardSaves::Nothing,
        }
    }

    /// What this op's backward pass reads of its forward pass, on every backend (the
    /// host's reference gradients and the device kernels alike read no more).
    pub fn backward_reads(&self) -> BackwardReads {
        match self {
            Op::Input | Op::Constant { .. } => BackwardReads::SHAPES,
            // Products: each operand's gradient is the other's product with the output's.
            Op::Conv(_)
            | Op::ConvTranspose(_)
            | Op::Gemm(_)
            | Op::MatMul
            | Op::Einsum(_)
            | Op::Recurrent(_)
            | Op::BatchNorm { .. }
            | Op::LayerNorm { .. }
            | Op::InstanceNorm { .. }
            | Op::GroupNorm { .. }
            | Op::Lrn { .. }
            | Op::Stft { .. }
            | Op::Clip { .. }
            | Op::Binary(Binary::Mul) => BackwardReads::INPUTS,
            // Derivatives that are functions of the output: max(x, 0) > 0 exactly where
            // x > 0; σ' = y(1 − y), tanh' = 1 − y², exp' = y, √' = 1/2y, (1/x)' = −y².
            Op::Unary(
                Unary::Relu
                | Unary::Sigmoid
                | Unary::Tanh
                | Unary::Exp
                | Unary::Sqrt
                | Unary::Reciprocal,
            ) => BackwardReads::OUTPUTS,
            Op::Softmax { .. } => BackwardReads::OUTPUTS,
            Op::Binary(Binary::Add | Binary::Sub)
            | Op::Variadic(Variadic::Sum | Variadic::Mean) => BackwardReads::SHAPES,
            // A sum or mean over axes spreads its gradient evenly (an RMSNorm's mean of
            // squares keeps nothing of them).
            Op::Reduce {
                kind: ReduceKind::Sum | ReduceKind::Mean,
                ..
            } => BackwardReads::SHAPES,
            // A max pool saved its argmax; an average pool spreads its gradient evenly.
            Op::Pool(p) if p.kernel.len() <= 2 => BackwardReads::SHAPES,
            Op::GlobalPool(PoolKind::Average) => BackwardReads::SHAPES,
            // Data movement: the gradient moves back as the elements moved, steered by
            // the index and attribute operands.
            op if op.is_view() => BackwardReads::SHAPES,
            Op::Cast { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Transpose { .. }
            | Op::Expand => BackwardReads::SHAPES,
            Op::Gather { .. } | Op::Trilu { .. } => BackwardReads::slot(1),
            Op::Where => BackwardReads::slot(0),
            Op::Slice { .. } | Op::Pad { .. } | Op::Resize(_) => BackwardReads::from(1),
            // No gradient flows through these.
            Op::Shape { .. }
            | Op::Size
            | Op::ConstantOfShape { .. }
            | Op::Range
            | Op::ArgExtreme { .. } => BackwardReads::SHAPES,
            _ => BackwardReads::ALL,
        }
    }
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
}
