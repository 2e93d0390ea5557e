//! Elementwise operators on the device, forward and backward: one-tensor functions by op
//! code, Clip, broadcasting binary functions, Sum of n tensors.

use std::sync::Arc;

use ralpc_ir::{Binary, NodeId, Unary};

use super::super::backend::{Backend, R};
use super::super::calls::Kernels;
use super::super::error::unsupported;
use super::super::kernels::{BinaryOp, Strides, UnaryOp};
use super::super::node_ops::{binary_op, unary_op};
use super::{DTensor, Output, Runner, Saved};

impl<B: Backend> Runner<'_, B> {
    /// A one-tensor function by its op code.
    pub(super) fn unary_forward(&self, id: NodeId, u: Unary, out_shape: &[usize]) -> R<Output<B>> {
        let dev = self.dev;
        let (op, alpha, beta) = unary_op(u)?;
        let x = self.input(id, 0)?;
        let mut y = self.fresh(out_shape)?;
        dev.unary(&mut y, &x.buf, op, alpha, beta)?;
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of unary's inputs, by input slot.
    pub(super) fn unary_backward(
        &self,
        id: NodeId,
        u: Unary,
        dy: &B::Buf,
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let (op, alpha, beta) = unary_op(u)?;
        let saved_value = if op.backward_reads_output() {
            self.kept_output(id)?
        } else {
            self.input(id, 0)?
        };
        let mut dx = dev.zeros(dev.len(dy))?;
        dev.unary_backward(&mut dx, dy, &saved_value.buf, op, alpha, beta)?;
        grads.push((0, dx));
        Ok(grads)
    }

    /// Clip, its bounds from its attributes or constant inputs 1 and 2.
    pub(super) fn clip_forward(
        &self,
        id: NodeId,
        min: Option<f32>,
        max: Option<f32>,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let lo = min
            .or_else(|| self.scalar(id, 1))
            .unwrap_or(f32::NEG_INFINITY);
        let hi = max.or_else(|| self.scalar(id, 2)).unwrap_or(f32::INFINITY);
        let x = self.input(id, 0)?;
        let mut y = self.fresh(out_shape)?;
        dev.unary(&mut y, &x.buf, UnaryOp::Clip, lo, hi)?;
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of clip's inputs, by input slot.
    pub(super) fn clip_backward(
        &self,
        id: NodeId,
        min: Option<f32>,
        max: Option<f32>,
        dy: &B::Buf,
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let lo = min
            .or_else(|| self.scalar(id, 1))
            .unwrap_or(f32::NEG_INFINITY);
        let hi = max.or_else(|| self.scalar(id, 2)).unwrap_or(f32::INFINITY);
        let x = self.input(id, 0)?;
        let mut dx = dev.zeros(dev.len(dy))?;
        dev.unary_backward(&mut dx, dy, &x.buf, UnaryOp::Clip, lo, hi)?;
        grads.push((0, dx));
        Ok(grads)
    }

    /// A broadcasting two-tensor function.
    pub(super) fn binary_forward(
        &self,
        id: NodeId,
        b: Binary,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let op = binary_op(b)?;
        let (a, c) = (self.input(id, 0)?, self.input(id, 1)?);
        let mut y = self.fresh(out_shape)?;
        dev.binary(
            &mut y,
            &a.buf,
            &c.buf,
            &Strides::broadcast(out_shape, &a.shape, &c.shape)?,
            op,
        )?;
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of binary's inputs, by input slot.
    pub(super) fn binary_backward(
        &self,
        id: NodeId,
        bop: Binary,
        dy: &B::Buf,
        out_shape: &[usize],
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
        let full = |x: &DTensor<B>| Strides::broadcast(out_shape, out_shape, &x.shape);
        // An operand's gradient over the output's shape (`None`: `dy` itself).
        let over_output = |slot: usize| -> R<Option<B::Buf>> {
            let mut g = dev.zeros(dev.len(dy))?;
            match (bop, slot) {
                (Binary::Add, _) | (Binary::Sub, 0) => return Ok(None),
                (Binary::Sub, _) => dev.unary(&mut g, dy, UnaryOp::Neg, 0.0, 0.0)?,
                (Binary::Mul, 0) => dev.binary(&mut g, dy, &b.buf, &full(&b)?, BinaryOp::Mul)?,
                (Binary::Mul, _) => dev.binary(&mut g, dy, &a.buf, &full(&a)?, BinaryOp::Mul)?,
                (Binary::Div, 0) => dev.binary(&mut g, dy, &b.buf, &full(&b)?, BinaryOp::Div)?,
                (Binary::Div, _) => {
                    // d/db (a/b) = -y/b · dy
                    let y = self.kept_output(id)?;
                    let same = Strides::broadcast(out_shape, out_shape, out_shape)?;
                    let (mut ga, mut t) = (dev.zeros(dev.len(dy))?, dev.zeros(dev.len(dy))?);
                    dev.binary(&mut ga, dy, &b.buf, &full(&b)?, BinaryOp::Div)?;
                    dev.binary(&mut t, &ga, &y.buf, &same, BinaryOp::Mul)?;
                    dev.unary(&mut g, &t, UnaryOp::Neg, 0.0, 0.0)?;
                }
                (other, _) => {
                    return Err(unsupported(format!(
                        "{other:?}'s gradient is not on the CUDA backend yet"
                    )))
                }
            }
            Ok(Some(g))
        };
        for (slot, x) in [(0, &a), (1, &b)] {
            if self.wants_gradient(id, slot) {
                let g = over_output(slot)?;
                let g = g.as_ref().unwrap_or(dy);
                grads.push((slot, self.reduce_to(g, out_shape, &x.shape)?));
            }
        }
        Ok(grads)
    }

    /// Sum of n tensors, broadcast (a view of a single input).
    pub(super) fn sum_forward(&self, id: NodeId, out_shape: &[usize]) -> R<Output<B>> {
        let dev = self.dev;
        let node = self.graph.node(id);
        let mut acc = self.input(id, 0)?;
        for slot in 1..node.inputs.len() {
            let x = self.input(id, slot)?;
            let mut y = self.fresh(out_shape)?;
            dev.binary(
                &mut y,
                &acc.buf,
                &x.buf,
                &Strides::broadcast(out_shape, &acc.shape, &x.shape)?,
                BinaryOp::Add,
            )?;
            acc = DTensor {
                buf: Arc::new(y),
                shape: out_shape.to_vec(),
            };
        }
        match Arc::try_unwrap(acc.buf) {
            Ok(y) => Ok(Output::New(y, Saved::None)),
            // One input: the sum is a view of it.
            Err(buf) => Ok(Output::View(buf)),
        }
    }

    /// The gradients of sum's inputs, by input slot.
    pub(super) fn sum_backward(
        &self,
        id: NodeId,
        dy: &B::Buf,
        out_shape: &[usize],
    ) -> R<Vec<(usize, B::Buf)>> {
        let node = self.graph.node(id);
        let mut grads = Vec::new();
        for slot in (0..node.inputs.len()).filter(|&s| self.wants_gradient(id, s)) {
            let x = self.input(id, slot)?;
            grads.push((slot, self.reduce_to(dy, out_shape, &x.shape)?));
        }
        Ok(grads)
    }
}
