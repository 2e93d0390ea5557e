//! How IR operators map onto the device's kernels: unary and binary op codes, matrix
//! product plans, strides and layouts of the operands.

use ralpc_ir::{Binary, Graph, Op, Unary};

use super::backend::{Gemm, R};
use super::error::unsupported;
use super::kernels::{BinaryOp, UnaryOp};
use crate::cpu::ops;

pub(super) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides of `shape`.
pub(super) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// What shape arithmetic needs when shapes follow from operands: the exported batch.
pub(super) fn static_env(graph: &Graph) -> ops::Env {
    ops::Env {
        mode: ops::Mode::Training,
        exported_batch: graph.rebatch().map(|r| r.exported),
        samples: None,
    }
}

/// A numpy matrix product as one (batched) GEMM: `[.., m, k] × [k, n]` (the batch folded
/// into the rows) or `[b.., m, k] × [b.., k, n]`.
pub(super) struct MatMulPlan {
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// B is one matrix shared by the batch (folded into A's rows).
    shared_b: bool,
}

impl MatMulPlan {
    pub(super) fn new(a: &[usize], b: &[usize]) -> R<MatMulPlan> {
        if a.len() < 2 || b.len() < 2 {
            return Err(unsupported(format!(
                "MatMul of {a:?} × {b:?}: vector operands are not on the CUDA backend yet"
            )));
        }
        let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
        let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
        if k != k2 {
            return Err(unsupported(format!(
                "MatMul of {a:?} × {b:?}: inner sizes differ"
            )));
        }
        let batch_a = numel(&a[..a.len() - 2]);
        if b.len() == 2 {
            return Ok(MatMulPlan {
                m: batch_a * m,
                n,
                k,
                batch: 1,
                shared_b: true,
            });
        }
        if a[..a.len() - 2] == b[..b.len() - 2] {
            return Ok(MatMulPlan {
                m,
                n,
                k,
                batch: batch_a,
                shared_b: false,
            });
        }
        Err(unsupported(format!(
            "MatMul of {a:?} × {b:?}: broadcast batch axes are not on the CUDA backend yet"
        )))
    }

    fn batched(&self, mut g: Gemm) -> Gemm {
        g.batch = self.batch;
        g
    }

    /// `Y = A·B`.
    pub(super) fn forward(&self) -> Gemm {
        self.batched(Gemm::new(self.m, self.n, self.k))
    }

    /// `dA = dY·Bᵀ`.
    pub(super) fn grad_a(&self) -> Gemm {
        let mut g = Gemm::new(self.m, self.k, self.n);
        g.trans_b = true;
        g.strides = [
            self.m * self.n,
            if self.shared_b { 0 } else { self.k * self.n },
            self.m * self.k,
        ];
        self.batched(g)
    }

    /// `dB = Aᵀ·dY` (summed over the batch when B is shared: one GEMM over all rows).
    pub(super) fn grad_b(&self) -> Gemm {
        let mut g = Gemm::new(self.k, self.n, self.m);
        g.trans_a = true;
        g.strides = [self.m * self.k, self.m * self.n, self.k * self.n];
        self.batched(g)
    }
}

pub(super) fn axis_of(axis: i64, rank: usize) -> R<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if (0..rank as i64).contains(&a) {
        Ok(a as usize)
    } else {
        Err(unsupported(format!(
            "axis {axis} is out of range for rank {rank}"
        )))
    }
}

pub(super) fn permutation(perm: Option<&[i64]>, rank: usize) -> R<Vec<usize>> {
    match perm {
        None => Ok((0..rank).rev().collect()),
        Some(p) => p.iter().map(|&a| axis_of(a, rank)).collect(),
    }
}

/// The strides through which `shape`, read in `perm`'s axis order, is its transpose.
pub(super) fn transposed_strides(perm: Option<&[i64]>, shape: &[usize]) -> R<Vec<usize>> {
    let strides = strides_of(shape);
    Ok(permutation(perm, shape.len())?
        .iter()
        .map(|&p| strides[p])
        .collect())
}

pub(super) fn channel_layout(shape: &[usize]) -> R<(usize, usize, usize)> {
    match shape {
        [n, c, rest @ ..] => Ok((*n, *c, numel(rest))),
        _ => Err(unsupported(format!(
            "batch norm needs N×C×…, got {shape:?}"
        ))),
    }
}

pub(crate) fn unary_op(u: Unary) -> R<(UnaryOp, f32, f32)> {
    UnaryOp::of(u).ok_or_else(|| unsupported(format!("{u:?} is not on the CUDA backend yet")))
}

pub(super) fn binary_op(b: Binary) -> R<BinaryOp> {
    Ok(match b {
        Binary::Add => BinaryOp::Add,
        Binary::Sub => BinaryOp::Sub,
        Binary::Mul => BinaryOp::Mul,
        Binary::Div => BinaryOp::Div,
        Binary::Pow => BinaryOp::Pow,
        other => {
            return Err(unsupported(format!(
                "{other:?} is not on the CUDA backend yet"
            )))
        }
    })
}

/// The operator's name for messages (`Gather`, `Pad`, …).
pub(super) fn other_name(op: &Op) -> String {
    let debug = format!("{op:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("this operator")
        .to_owned()
}
