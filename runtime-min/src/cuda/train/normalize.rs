//! Normalizations on the device, forward and backward: batch and layer normalization,
//! softmax over rows.

use ralpc_ir::NodeId;

use super::super::backend::{Backend, R};
use super::super::batch_stats;
use super::super::calls::Kernels;
use super::super::error::{inconsistent, unsupported};
use super::super::kernels::{BinaryOp, Strides};
use super::super::node_ops::{axis_of, channel_layout, numel};
use super::{Output, Runner, Saved};
use crate::cpu::ops;

impl<B: Backend> Runner<'_, B> {
    /// Softmax (or log-softmax) over rows: the last axis.
    pub(super) fn softmax_forward(
        &self,
        id: NodeId,
        axis: i64,
        log: bool,
        flatten: bool,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let x = self.input(id, 0)?;
        let (outer, width, inner) = ops::softmax_layout(&x.shape, axis, flatten)?;
        if inner != 1 {
            return Err(unsupported(
                "softmax over an axis other than the last is not on the CUDA backend yet",
            ));
        }
        let mut y = self.fresh(out_shape)?;
        dev.softmax_rows(&mut y, &x.buf, outer, width, log)?;
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of softmax's inputs, by input slot.
    pub(super) fn softmax_backward(
        &self,
        id: NodeId,
        axis: i64,
        log: bool,
        flatten: bool,
        dy: &B::Buf,
        out_shape: &[usize],
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let (outer, width, _) = ops::softmax_layout(out_shape, axis, flatten)?;
        let y = self.kept_output(id)?;
        let mut dx = dev.zeros(dev.len(dy))?;
        dev.softmax_rows_backward(&mut dx, dy, &y.buf, outer, width, log)?;
        grads.push((0, dx));
        Ok(grads)
    }

    /// Batch normalization by the batch's statistics (summed over the ranks sharing its
    /// channels when synchronized); keeps them.
    pub(super) fn batch_norm_forward(
        &self,
        id: NodeId,
        epsilon: f32,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let node = self.graph.node(id);
        if node.outputs.len() > 1 {
            return Err(unsupported(
                "batch norm's running-statistics outputs are not on the CUDA backend yet",
            ));
        }
        let (x, gamma, beta) = (self.input(id, 0)?, self.input(id, 1)?, self.input(id, 2)?);
        let (batch, channels, spatial) = channel_layout(&x.shape)?;
        let (mut mean, mut rstd) = (dev.zeros(channels)?, dev.zeros(channels)?);
        dev.channel_stats(
            &mut mean, &mut rstd, &x.buf, batch, channels, spatial, epsilon,
        )?;
        if let Some(sum) = self.batch_stats {
            let count = batch * spatial;
            batch_stats::forward(dev, sum, &mut mean, &mut rstd, epsilon, count)?;
        }
        let mut y = self.fresh(out_shape)?;
        dev.channel_affine(
            &mut y, &x.buf, &mean, &rstd, &gamma.buf, &beta.buf, channels, spatial,
        )?;
        Ok(Output::New(y, Saved::Stats(mean, rstd)))
    }

    /// The gradients of batch norm's inputs, by input slot.
    pub(super) fn batch_norm_backward(
        &self,
        id: NodeId,
        saved: &Saved<B>,
        dy: &B::Buf,
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let (x, gamma) = (self.input(id, 0)?, self.input(id, 1)?);
        let Saved::Stats(mean, rstd) = saved else {
            return Err(inconsistent("batch norm kept no statistics"));
        };
        let (batch, channels, spatial) = channel_layout(&x.shape)?;
        let (mut dx, mut dg, mut db) = (
            dev.zeros(numel(&x.shape))?,
            dev.zeros(channels)?,
            dev.zeros(channels)?,
        );
        dev.batch_norm_backward(
            &mut dx,
            &mut dg,
            &mut db,
            dy,
            &x.buf,
            (mean, rstd),
            &gamma.buf,
            batch,
            channels,
            spatial,
        )?;
        if let Some(sum) = self.batch_stats {
            let bn = batch_stats::Backward {
                x: &*x.buf,
                mean,
                rstd,
                gamma: &*gamma.buf,
                sums: (&dg, &db),
                batch,
                channels,
                spatial,
            };
            batch_stats::backward(dev, sum, &mut dx, &bn)?;
        }
        grads.push((0, dx));
        grads.push((1, dg));
        grads.push((2, db));
        Ok(grads)
    }

    /// Layer normalization over the axes from `axis`; keeps the normalized input and its
    /// statistics.
    pub(super) fn layer_norm_forward(
        &self,
        id: NodeId,
        axis: i64,
        epsilon: f32,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let node = self.graph.node(id);
        if node.outputs.len() > 1 {
            return Err(unsupported(
                "layer norm's statistics outputs are not on the CUDA backend yet",
            ));
        }
        let x = self.input(id, 0)?;
        let a = axis_of(axis, x.shape.len())?;
        let (rows, n) = (numel(&x.shape[..a]), numel(&x.shape[a..]));
        let (mut mean, mut rstd) = (dev.zeros(rows)?, dev.zeros(rows)?);
        let mut xhat = self.fresh(out_shape)?;
        dev.layer_norm(
            &mut xhat, &mut mean, &mut rstd, &x.buf, None, rows, n, epsilon,
        )?;
        let gamma = self.input(id, 1)?;
        let mut y = self.fresh(out_shape)?;
        let param = [rows, n];
        dev.binary(
            &mut y,
            &xhat,
            &gamma.buf,
            &Strides::broadcast(&param, &param, &[n])?,
            BinaryOp::Mul,
        )?;
        if let Some(beta) = self.optional(id, 2) {
            y = self.add_broadcast(&y, &param, &beta.buf, &[n])?;
        }
        Ok(Output::New(y, Saved::Normalized(xhat, mean, rstd)))
    }

    /// The gradients of layer norm's inputs, by input slot.
    pub(super) fn layer_norm_backward(
        &self,
        id: NodeId,
        axis: i64,
        saved: &Saved<B>,
        dy: &B::Buf,
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let node = self.graph.node(id);
        let mut grads = Vec::new();
        let (x, gamma) = (self.input(id, 0)?, self.input(id, 1)?);
        let Saved::Normalized(xhat, mean, rstd) = saved else {
            return Err(inconsistent("layer norm kept no statistics"));
        };
        let a = axis_of(axis, x.shape.len())?;
        let (rows, n) = (numel(&x.shape[..a]), numel(&x.shape[a..]));
        let mut dx = dev.zeros(rows * n)?;
        dev.layer_norm_backward(&mut dx, dy, &x.buf, Some(&gamma.buf), mean, rstd, rows, n)?;
        let mut dyx = dev.zeros(rows * n)?;
        let param = [rows, n];
        dev.binary(
            &mut dyx,
            dy,
            xhat,
            &Strides::broadcast(&param, &param, &param)?,
            BinaryOp::Mul,
        )?;
        let mut dg = dev.zeros(n)?;
        dev.reduce_axis(&mut dg, &dyx, 1, rows, n, false)?;
        grads.push((0, dx));
        grads.push((1, dg));
        if node.inputs.get(2).copied().flatten().is_some() {
            let mut dbeta = dev.zeros(n)?;
            dev.reduce_axis(&mut dbeta, dy, 1, rows, n, false)?;
            grads.push((2, dbeta));
        }
        Ok(grads)
    }
}
