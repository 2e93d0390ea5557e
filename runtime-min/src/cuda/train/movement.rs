//! Data movement on the device, forward and backward: views (which share their input's
//! buffer), Transpose, Concat.

use ralpc_ir::NodeId;

use super::super::backend::{Backend, R};
use super::super::calls::Kernels;
use super::super::error::unsupported;
use super::super::kernels::Strides;
use super::super::node_ops::{axis_of, numel, strides_of, transposed_strides};
use super::{Output, Runner, Saved};

impl<B: Backend> Runner<'_, B> {
    /// A view (Identity, Flatten, Reshape, Squeeze, Unsqueeze, Dropout): its input's
    /// buffer under the output's shape. Dropout is the identity, as on the CPU backend.
    pub(super) fn view_forward(&self, id: NodeId) -> R<Output<B>> {
        if self.graph.node(id).outputs.len() > 1 {
            return Err(unsupported(
                "a dropout mask output is not on the CUDA backend yet",
            ));
        }
        Ok(Output::View(self.input(id, 0)?.buf))
    }

    /// A view's input gradient: its output's, copied.
    pub(super) fn view_backward(&self, dy: &B::Buf) -> R<Vec<(usize, B::Buf)>> {
        let mut dx = self.dev.zeros(self.dev.len(dy))?;
        self.dev.axpby(&mut dx, dy, 1.0, 0.0)?;
        Ok(vec![(0, dx)])
    }

    /// Transpose: a strided copy.
    pub(super) fn transpose_forward(
        &self,
        id: NodeId,
        perm: &Option<Vec<i64>>,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let x = self.input(id, 0)?;
        let view = transposed_strides(perm.as_deref(), &x.shape)?;
        let mut y = self.fresh(out_shape)?;
        dev.gather(&mut y, &x.buf, &Strides::view(out_shape, &view)?, 0)?;
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of transpose's inputs, by input slot.
    pub(super) fn transpose_backward(
        &self,
        id: NodeId,
        perm: &Option<Vec<i64>>,
        dy: &B::Buf,
        out_shape: &[usize],
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let mut grads = Vec::new();
        let x = self.input(id, 0)?;
        let view = transposed_strides(perm.as_deref(), &x.shape)?;
        let mut dx = dev.zeros(numel(&x.shape))?;
        dev.scatter(&mut dx, dy, &Strides::view(out_shape, &view)?, 0, false)?;
        grads.push((0, dx));
        Ok(grads)
    }

    /// Concat: each input scattered into its place.
    pub(super) fn concat_forward(
        &self,
        id: NodeId,
        axis: i64,
        out_shape: &[usize],
    ) -> R<Output<B>> {
        let dev = self.dev;
        let node = self.graph.node(id);
        let a = axis_of(axis, out_shape.len())?;
        let mut y = self.fresh(out_shape)?;
        let strides = strides_of(out_shape);
        let mut start = 0;
        for slot in 0..node.inputs.len() {
            let x = self.input(id, slot)?;
            dev.scatter(
                &mut y,
                &x.buf,
                &Strides::view(&x.shape, &strides)?,
                start * strides[a],
                false,
            )?;
            start += x.shape[a];
        }
        Ok(Output::New(y, Saved::None))
    }

    /// The gradients of concat's inputs, by input slot.
    pub(super) fn concat_backward(
        &self,
        id: NodeId,
        axis: i64,
        dy: &B::Buf,
        out_shape: &[usize],
    ) -> R<Vec<(usize, B::Buf)>> {
        let dev = self.dev;
        let node = self.graph.node(id);
        let mut grads = Vec::new();
        let a = axis_of(axis, out_shape.len())?;
        let strides = strides_of(out_shape);
        let mut start = 0;
        for slot in 0..node.inputs.len() {
            let x = self.input(id, slot)?;
            let mut dx = dev.zeros(numel(&x.shape))?;
            dev.gather(
                &mut dx,
                dy,
                &Strides::view(&x.shape, &strides)?,
                start * strides[a],
            )?;
            start += x.shape[a];
            grads.push((slot, dx));
        }
        Ok(grads)
    }
}
