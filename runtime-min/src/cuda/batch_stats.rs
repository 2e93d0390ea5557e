//! Synchronized batch normalization on devices: every rank holding some samples of a
//! layer normalizes by the statistics of all of them, as one device normalizing the whole
//! batch would, so a data-parallel run trains exactly as single-device training. The plan
//! interpreter's device ([`super::on_device`]) runs it; how the per-channel vectors are
//! added up over the ranks is the interpreter's ([`GroupSum`]).
//!
//! Forward, each rank's kernel computes its own per-channel mean and variance; the whole
//! batch's mean is the count-weighted mean of the means, and its variance the weighted
//! mean of `varᵢ + (meanᵢ − mean)²` (Chan's parallel update, no cancellation). Backward, a
//! rank's kernel computes its input gradient with its own sums `Σdy` and `Σdy·x̂`; the
//! whole batch's sums change it by `A + (x − mean)·B` per channel, which `channel_affine`
//! adds. The scale's and shift's gradients stay each rank's own sums, which the gradient
//! all-reduce adds up.
//!
//! Only per-channel vectors cross to the host, in f64: a few kilobytes per batch
//! normalization, against the activations the kernels read.

use super::backend::{Backend, R};
use super::calls::Kernels;

/// Adds a vector up over the ranks sharing a batch normalization's channels, in place
/// (the same sum on every one of them).
pub(crate) type GroupSum<'a> = &'a dyn Fn(&mut [f64]) -> R<()>;

/// The whole batch's statistics from this rank's, over `count` elements per channel:
/// `mean` and `rstd` (1/√(var + ε)) are replaced in place.
pub(super) fn forward<B: Backend>(
    dev: &B,
    sum: GroupSum<'_>,
    mean: &mut B::Buf,
    rstd: &mut B::Buf,
    eps: f32,
    count: usize,
) -> R<()> {
    let n = count as f64;
    let local_mean = wide(&dev.download(mean)?);
    let local_var: Vec<f64> = wide(&dev.download(rstd)?)
        .iter()
        .map(|&r| (1.0 / (r * r) - f64::from(eps)).max(0.0))
        .collect();
    let channels = local_mean.len();
    let mut weighted: Vec<f64> = local_mean.iter().map(|m| n * m).chain([n]).collect();
    sum(&mut weighted)?;
    let whole = weighted[channels].max(1.0);
    let global_mean: Vec<f64> = weighted[..channels].iter().map(|s| s / whole).collect();
    let mut spread: Vec<f64> = local_var
        .iter()
        .zip(&local_mean)
        .zip(&global_mean)
        .map(|((v, m), g)| n * (v + (m - g) * (m - g)))
        .collect();
    sum(&mut spread)?;
    *mean = dev.upload(&narrow(&global_mean))?;
    let global_rstd: Vec<f64> = spread
        .iter()
        .map(|s| 1.0 / (s / whole + f64::from(eps)).sqrt())
        .collect();
    *rstd = dev.upload(&narrow(&global_rstd))?;
    Ok(())
}

/// What the backward of a batch normalization read, for [`backward`].
pub(super) struct Backward<'b, B: Backend> {
    /// Its input `[batch, channels, spatial]`.
    pub x: &'b B::Buf,
    /// The whole batch's statistics it normalized by.
    pub mean: &'b B::Buf,
    /// The whole batch's 1/std.
    pub rstd: &'b B::Buf,
    /// Its scale.
    pub gamma: &'b B::Buf,
    /// This rank's `Σdy·x̂` and `Σdy` per channel (the kernel's scale and shift
    /// gradients).
    pub sums: (&'b B::Buf, &'b B::Buf),
    /// Samples of this rank's share.
    pub batch: usize,
    /// Channels.
    pub channels: usize,
    /// Positions per channel and sample.
    pub spatial: usize,
}

/// Corrects `dx`, computed by the kernel with this rank's sums, to the whole batch's.
pub(super) fn backward<B: Backend>(
    dev: &B,
    sum: GroupSum<'_>,
    dx: &mut B::Buf,
    bn: &Backward<'_, B>,
) -> R<()> {
    let n = (bn.batch * bn.spatial) as f64;
    let (sgh, sg) = (
        wide(&dev.download(bn.sums.0)?),
        wide(&dev.download(bn.sums.1)?),
    );
    let mut all: Vec<f64> = sg.iter().chain(&sgh).copied().chain([n]).collect();
    sum(&mut all)?;
    let whole = all[2 * bn.channels].max(1.0);
    let (all_sg, all_sgh) = all[..2 * bn.channels].split_at(bn.channels);
    let gamma = wide(&dev.download(bn.gamma)?);
    let rstd = wide(&dev.download(bn.rstd)?);
    let (mut shift, mut slope) = (Vec::new(), Vec::new());
    for c in 0..bn.channels {
        let scale = gamma[c] * rstd[c];
        shift.push(scale * (sg[c] / n - all_sg[c] / whole));
        slope.push(scale * rstd[c] * (sgh[c] / n - all_sgh[c] / whole));
    }
    let ones = dev.upload(&vec![1.0; bn.channels])?;
    let (shift, slope) = (dev.upload(&narrow(&shift))?, dev.upload(&narrow(&slope))?);
    let mut correction = dev.zeros(dev.len(dx))?;
    dev.channel_affine(
        &mut correction,
        bn.x,
        bn.mean,
        &slope,
        &ones,
        &shift,
        bn.channels,
        bn.spatial,
    )?;
    dev.axpby(dx, &correction, 1.0, 1.0)
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}
