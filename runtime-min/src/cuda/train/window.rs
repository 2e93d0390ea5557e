//! Pooling windows on the device, forward and backward.

use ralpc_ir::{NodeId, Pool, PoolKind};

use super::super::backend::{Backend, R};
use super::super::calls::Kernels;
use super::super::error::inconsistent;
use super::super::kernels::Window;
use super::super::node_ops::numel;
use super::{Output, Runner, Saved};
use crate::cpu::kernels::Pool2d;
use crate::cpu::ops;

impl<B: Backend> Runner<'_, B> {
    /// A 1-d or 2-d max or average pool; a max pool keeps its argmax.
    pub(super) fn pool_forward(&self, id: NodeId, p: &Pool, out_shape: &[usize]) -> R<Output<B>> {
        let dev = self.dev;
        let x = self.input(id, 0)?;
        let (g, _, _) = ops::pool_geometry(p, &x.shape)?;
        let win = Window::from(&g);
        let mut y = self.fresh(out_shape)?;
        match p.kind {
            PoolKind::Max => {
                let mut argmax = dev.index_zeros(numel(out_shape))?;
                dev.max_pool(&mut y, &mut argmax, &x.buf, &win)?;
                Ok(Output::New(y, Saved::Argmax(argmax)))
            }
            PoolKind::Average => {
                dev.avg_pool(&mut y, &x.buf, &win, p.count_include_pad)?;
                Ok(Output::New(y, Saved::None))
            }
        }
    }

    /// The gradients of pool's inputs, by input slot.
    pub(super) fn pool_backward(
        &self,
        id: NodeId,
        p: &Pool,
        saved: &Saved<B>,
        dy: &B::Buf,
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let x = self.input(id, 0)?;
        let (g, _, _): (Pool2d, _, _) = ops::pool_geometry(p, &x.shape)?;
        let win = Window::from(&g);
        let mut dx = dev.zeros(numel(&x.shape))?;
        match (p.kind, saved) {
            (PoolKind::Max, Saved::Argmax(argmax)) => {
                dev.max_pool_backward(&mut dx, dy, argmax, &win)?
            }
            (PoolKind::Average, _) => {
                dev.avg_pool_backward(&mut dx, dy, &win, p.count_include_pad)?
            }
            _ => return Err(inconsistent("max pooling kept no argmax")),
        }
        grads.push((0, dx));
        Ok(grads)
    }
}
