//! Reductions on the device, forward and backward: global average pooling and ReduceMean.

use ralpc_ir::NodeId;

use super::super::backend::{Backend, R};
use super::super::calls::Kernels;
use super::super::kernels::{Strides, UnaryOp};
use super::super::node_ops::{numel, strides_of};
use super::{Output, Runner, Saved};

impl<B: Backend> Runner<'_, B> {
    /// Global average pooling: each plane's mean.
    pub(super) fn global_average_pool_forward(
        &self,
        id: NodeId,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let x = self.input(id, 0)?;
        let planes = x.shape.iter().take(2).product::<usize>();
        let area = numel(x.shape.get(2..).unwrap_or_default());
        let mut y = self.fresh(out_shape)?;
        dev.reduce_axis(&mut y, &x.buf, planes, area, 1, true)?;
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of global average pool's inputs, by input slot.
    pub(super) fn global_average_pool_backward(
        &self,
        id: NodeId,
        dy: &B::Buf,
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let x = self.input(id, 0)?;
        let area = numel(x.shape.get(2..).unwrap_or_default());
        let planes = numel(&x.shape) / area.max(1);
        let mut spread = dev.zeros(numel(&x.shape))?;
        dev.gather(
            &mut spread,
            dy,
            &Strides::view(&[planes, area], &[1, 0])?,
            0,
        )?;
        let mut dx = dev.zeros(numel(&x.shape))?;
        dev.unary(&mut dx, &spread, UnaryOp::Scale, 1.0 / area as f32, 0.0)?;
        grads.push((0, dx));
        Ok(grads)
    }

    /// ReduceMean over its axes (a view when there are none).
    pub(super) fn reduce_mean_forward(
        &self,
        id: NodeId,
        axes: &Option<Vec<i64>>,
        noop_with_empty_axes: bool,
    ) -> R<Output<B>> {
        let x = self.input(id, 0)?;
        let axes = self.reduced_axes(id, axes, noop_with_empty_axes, x.shape.len())?;
        match self.reduce_axes(&x.buf, &x.shape, &axes, true)? {
            Some(y) => Ok(Output::New(y, Saved::None)),
            None => Ok(Output::View(x.buf)),
        }
    }

    /// The gradients of reduce mean's inputs, by input slot.
    pub(super) fn reduce_mean_backward(
        &self,
        id: NodeId,
        axes: &Option<Vec<i64>>,
        noop_with_empty_axes: bool,
        dy: &B::Buf,
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let x = self.input(id, 0)?;
        let axes = self.reduced_axes(id, axes, noop_with_empty_axes, x.shape.len())?;
        // dy, read back over every reduced position, over their count.
        let mut kept = x.shape.clone();
        for &a in &axes {
            kept[a] = 1;
        }
        let kept_strides = strides_of(&kept);
        let view: Vec<usize> = (0..x.shape.len())
            .map(|d| {
                if axes.contains(&d) {
                    0
                } else {
                    kept_strides[d]
                }
            })
            .collect();
        let mut spread = dev.zeros(numel(&x.shape))?;
        dev.gather(&mut spread, dy, &Strides::view(&x.shape, &view)?, 0)?;
        let count: usize = axes.iter().map(|&a| x.shape[a]).product();
        let mut dx = dev.zeros(numel(&x.shape))?;
        dev.unary(
            &mut dx,
            &spread,
            UnaryOp::Scale,
            1.0 / count.max(1) as f32,
            0.0,
        )?;
        grads.push((0, dx));
        Ok(grads)
    }
}
