//! Convolution lowered to the device's im2col kernels and GEMM: what every [`Backend`]
//! runs unless it has a convolution library (the GPU's cuDNN overrides it), and the
//! lowering the host-compiled kernels and the counting device check on every machine.

use super::backend::{Backend, Gemm, R};
use super::calls::Kernels;
use super::kernels::{Strides, Window};
use crate::cpu::kernels::{Conv2d, Pool2d};

/// `y = conv(x, w)` (no bias) over the whole batch, `y` overwritten.
///
/// # Errors
/// A device call failing.
pub fn forward<B: Backend + ?Sized>(
    dev: &B,
    g: &Conv2d,
    x: &B::Buf,
    w: &B::Buf,
    y: &mut B::Buf,
) -> R<()> {
    let conv = ConvPlan::new(g);
    let mut cols = dev.scratch(conv.chunk * conv.rows * conv.spatial)?;
    for (start, count) in conv.chunks() {
        dev.im2col(&mut cols, x, start * conv.image, &conv.window, count)?;
        for grp in 0..g.groups {
            // Y[n, group] = W[group] · cols[n, group rows], every image at once.
            let mut mm = Gemm::new(conv.cout_g, conv.spatial, conv.k);
            mm.batch = count;
            mm.offsets = [
                grp * conv.cout_g * conv.k,
                grp * conv.k * conv.spatial,
                conv.output_offset(start, grp),
            ];
            mm.strides = [0, conv.rows * conv.spatial, conv.cout * conv.spatial];
            dev.gemm(&mm, w, &cols, y)?;
        }
    }
    Ok(())
}

/// The input and weight gradients of [`forward`] for the output gradient `dy`, written
/// into `dx` and `dw`.
///
/// # Errors
/// A device call failing.
pub fn backward<B: Backend + ?Sized>(
    dev: &B,
    g: &Conv2d,
    x: &B::Buf,
    w: &B::Buf,
    dy: &B::Buf,
    dx: &mut B::Buf,
    dw: &mut B::Buf,
) -> R<()> {
    let conv = ConvPlan::new(g);
    let size = conv.chunk * conv.rows * conv.spatial;
    let (mut cols, mut dcols, mut cols_t) =
        (dev.scratch(size)?, dev.scratch(size)?, dev.scratch(size)?);
    let mut dy_t = dev.scratch(conv.chunk * conv.cout * conv.spatial)?;
    // Both are sums over the chunks (col2im adds, the weight GEMMs accumulate).
    dev.fill(dx, 0.0)?;
    dev.fill(dw, 0.0)?;
    for (start, count) in conv.chunks() {
        let wide = count * conv.spatial;
        dev.im2col(&mut cols, x, start * conv.image, &conv.window, count)?;
        // dW[group] += dYᵀ[group] · colsᵀ[group]ᵀ over every image at once: channels
        // first, images and positions along the columns.
        let by_channel = |channels: usize| {
            Strides::view(
                &[channels, count, conv.spatial],
                &[conv.spatial, channels * conv.spatial, 1],
            )
        };
        dev.gather(&mut cols_t, &cols, &by_channel(conv.rows)?, 0)?;
        dev.gather(
            &mut dy_t,
            dy,
            &by_channel(conv.cout)?,
            conv.output_offset(start, 0),
        )?;
        for grp in 0..g.groups {
            let mut mm = Gemm::new(conv.cout_g, conv.k, wide);
            mm.trans_b = true;
            mm.beta = 1.0;
            mm.offsets = [
                grp * conv.cout_g * wide,
                grp * conv.k * wide,
                grp * conv.cout_g * conv.k,
            ];
            dev.gemm(&mm, &dy_t, &cols_t, dw)?;
            // dcols[n, group rows] = W[group]ᵀ · dY[n, group], every image at once.
            let mut mm = Gemm::new(conv.k, conv.spatial, conv.cout_g);
            mm.trans_a = true;
            mm.batch = count;
            mm.offsets = [
                grp * conv.cout_g * conv.k,
                conv.output_offset(start, grp),
                grp * conv.k * conv.spatial,
            ];
            mm.strides = [0, conv.cout * conv.spatial, conv.rows * conv.spatial];
            dev.gemm(&mm, w, dy, &mut dcols)?;
        }
        dev.col2im(dx, start * conv.image, &dcols, &conv.window, count)?;
    }
    Ok(())
}

/// Convolution as im2col + batched GEMM over chunks of images (each chunk's columns at
/// most [`COLUMNS_BUDGET`] floats), per channel group.
struct ConvPlan {
    window: Window,
    cout_g: usize,
    /// One group's rows of the im2col matrix: `cin_g·kh·kw`.
    k: usize,
    /// All rows: `cin·kh·kw`.
    rows: usize,
    spatial: usize,
    /// Elements of one input image.
    image: usize,
    cout: usize,
    batch: usize,
    /// Images per chunk.
    chunk: usize,
}

/// The most floats one chunk's im2col columns take (256 MiB).
const COLUMNS_BUDGET: usize = 1 << 26;

impl ConvPlan {
    fn new(g: &Conv2d) -> ConvPlan {
        let (oh, ow) = g.output();
        let cin_g = g.in_channels / g.groups.max(1);
        let rows = g.in_channels * g.kernel.0 * g.kernel.1;
        let spatial = oh * ow;
        ConvPlan {
            // The same geometry as a pooling over one image's channels.
            window: Window::from(&Pool2d {
                planes: g.in_channels,
                input: g.input,
                kernel: g.kernel,
                stride: g.stride,
                dilation: g.dilation,
                padding: g.padding,
                output: (oh, ow),
            }),
            cout_g: g.out_channels / g.groups.max(1),
            k: cin_g * g.kernel.0 * g.kernel.1,
            rows,
            spatial,
            image: g.in_channels * g.input.0 * g.input.1,
            cout: g.out_channels,
            batch: g.batch,
            chunk: (COLUMNS_BUDGET / (rows * spatial).max(1)).clamp(1, g.batch.max(1)),
        }
    }

    /// (first image, images) of each chunk.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.batch)
            .step_by(self.chunk)
            .map(|start| (start, self.chunk.min(self.batch - start)))
    }

    fn output_offset(&self, n: usize, group: usize) -> usize {
        (n * self.cout + group * self.cout_g) * self.spatial
    }
}
