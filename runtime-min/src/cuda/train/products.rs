//! Products on the device: convolution, Gemm and MatMul, forward and backward.

use ralpc_ir::{Conv, NodeId};

use super::super::backend::{Backend, Gemm, R};
use super::super::calls::Kernels;
use super::super::kernels::Strides;
use super::super::node_ops::{numel, MatMulPlan};
use super::{Output, Runner, Saved};
use crate::cpu::ops;

impl<B: Backend> Runner<'_, B> {
    /// A convolution through the device's convolution (cuDNN, or im2col and a GEMM), its
    /// bias added.
    pub(super) fn conv_forward(&self, id: NodeId, c: &Conv, out_shape: &[usize]) -> R<Output<B>> {
        let dev = self.dev;
        let (x, w) = (self.input(id, 0)?, self.input(id, 1)?);
        let (g, _) = ops::conv_geometry(c, &x.shape, &w.shape)?;
        let mut y = self.fresh(out_shape)?;
        dev.conv_forward(&g, &x.buf, &w.buf, &mut y)?;
        if let Some(b) = self.optional(id, 2) {
            y = self.add_broadcast(
                &y,
                out_shape,
                &b.buf,
                &[g.out_channels, 1, 1][..out_shape.len() - 1],
            )?;
        }
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of conv's inputs, by input slot.
    pub(super) fn conv_backward(
        &self,
        id: NodeId,
        c: &Conv,
        dy: &B::Buf,
        out_shape: &[usize],
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let node = self.graph.node(id);
        let mut grads = Vec::new();
        let (x, w) = (self.input(id, 0)?, self.input(id, 1)?);
        let (g, _) = ops::conv_geometry(c, &x.shape, &w.shape)?;
        let (mut dx, mut dw) = (dev.zeros(numel(&x.shape))?, dev.zeros(numel(&w.shape))?);
        dev.conv_backward(&g, &x.buf, &w.buf, dy, &mut dx, &mut dw)?;
        grads.push((0, dx));
        grads.push((1, dw));
        if node.inputs.get(2).copied().flatten().is_some() {
            let (n, ch) = (out_shape[0], out_shape[1]);
            grads.push((
                2,
                self.reduce_to(dy, &[n, ch, numel(&out_shape[2..])], &[ch, 1])?,
            ));
        }
        Ok(grads)
    }

    /// Gemm: one GEMM, `C` broadcast into the output first.
    pub(super) fn gemm_forward(
        &self,
        id: NodeId,
        gm: &ralpc_ir::Gemm,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
        let (m, n) = (out_shape[0], out_shape[1]);
        let k = if gm.trans_a { a.shape[0] } else { a.shape[1] };
        let mut y = self.fresh(out_shape)?;
        let mut mm = Gemm::new(m, n, k);
        mm.trans_a = gm.trans_a;
        mm.trans_b = gm.trans_b;
        mm.alpha = gm.alpha;
        if let Some(c) = self.optional(id, 2) {
            let s = Strides::broadcast(out_shape, &c.shape, &c.shape)?;
            dev.gather(&mut y, &c.buf, &s, 0)?;
            mm.beta = gm.beta;
        }
        dev.gemm(&mm, &a.buf, &b.buf, &mut y)?;
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of gemm's inputs, by input slot.
    pub(super) fn gemm_backward(
        &self,
        id: NodeId,
        gm: &ralpc_ir::Gemm,
        dy: &B::Buf,
        out_shape: &[usize],
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
        let (m, n) = (out_shape[0], out_shape[1]);
        let k = if gm.trans_a { a.shape[0] } else { a.shape[1] };
        // dA = alpha · dY · op(B)ᵀ (stored transposed when A is).
        let mut da = dev.zeros(m * k)?;
        let mut mm = if gm.trans_a {
            let mut mm = Gemm::new(k, m, n);
            mm.trans_a = gm.trans_b;
            mm.trans_b = true;
            mm
        } else {
            let mut mm = Gemm::new(m, k, n);
            mm.trans_b = !gm.trans_b;
            mm
        };
        mm.alpha = gm.alpha;
        if gm.trans_a {
            dev.gemm(&mm, &b.buf, dy, &mut da)?;
        } else {
            dev.gemm(&mm, dy, &b.buf, &mut da)?;
        }
        // dB = alpha · op(A)ᵀ · dY (stored transposed when B is).
        let mut db = dev.zeros(k * n)?;
        let mut mm = if gm.trans_b {
            let mut mm = Gemm::new(n, k, m);
            mm.trans_a = true;
            mm.trans_b = gm.trans_a;
            mm
        } else {
            let mut mm = Gemm::new(k, n, m);
            mm.trans_a = !gm.trans_a;
            mm
        };
        mm.alpha = gm.alpha;
        if gm.trans_b {
            dev.gemm(&mm, dy, &a.buf, &mut db)?;
        } else {
            dev.gemm(&mm, &a.buf, dy, &mut db)?;
        }
        grads.push((0, da));
        grads.push((1, db));
        if let Some(c) = self.optional(id, 2) {
            let mut dc = self.reduce_to(dy, out_shape, &c.shape)?;
            if gm.beta != 1.0 {
                let copy = self.copy(&dc)?;
                dev.axpby(&mut dc, &copy, gm.beta, 0.0)?;
            }
            grads.push((2, dc));
        }
        Ok(grads)
    }

    /// MatMul: a batched GEMM.
    pub(super) fn matmul_forward(&self, id: NodeId, out_shape: &[usize]) -> R<Output<B>> {
        let dev = self.dev;
        let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
        let plan = MatMulPlan::new(&a.shape, &b.shape)?;
        let mut y = self.fresh(out_shape)?;
        dev.gemm(&plan.forward(), &a.buf, &b.buf, &mut y)?;
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of matmul's inputs, by input slot.
    pub(super) fn matmul_backward(&self, id: NodeId, dy: &B::Buf) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let (a, b) = (self.input(id, 0)?, self.input(id, 1)?);
        let plan = MatMulPlan::new(&a.shape, &b.shape)?;
        let (mut da, mut db) = (dev.zeros(numel(&a.shape))?, dev.zeros(numel(&b.shape))?);
        dev.gemm(&plan.grad_a(), dy, &b.buf, &mut da)?;
        dev.gemm(&plan.grad_b(), &a.buf, dy, &mut db)?;
        grads.push((0, da));
        grads.push((1, db));
        Ok(grads)
    }
}
