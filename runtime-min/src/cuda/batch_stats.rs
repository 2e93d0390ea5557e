//! Synchronized batch normalization for data-parallel replicas on devices, as the plan
//! interpreter does it (`cpu/exec/batch_stats.rs`): every replica normalizes by the whole
//! batch's per-channel statistics, as one device normalizing the whole batch would, so a
//! data-parallel run trains exactly as single-device training.
//!
//! Replicas hold equal shares of the batch. Forward, the mean is the replicas' mean of
//! their means, and the variance their mean of `varᵢ + (meanᵢ − mean)²` (Chan's parallel
//! update, no cancellation). Backward, a replica's kernel computes its input gradient
//! with its own sums `Σdy` and `Σdy·x̂`; the whole batch's sums change it by
//! `A + (x − mean)·B` per channel, which `channel_affine` adds. The scale's and shift's
//! gradients stay each replica's own sums, which the gradient all-reduce adds up.
//!
//! The per-channel vectors are combined in f64 on the host: a few kilobytes per batch
//! normalization, against the activations the kernels read.

use super::backend::{Backend, R};
use super::replicas::Replicas;

/// The whole batch's statistics from this replica's: `mean` and `rstd` (1/√(var + ε))
/// are replaced in place.
pub(super) fn forward<B: Backend>(
    dev: &B,
    replicas: &dyn Replicas<B>,
    mean: &mut B::Buf,
    rstd: &mut B::Buf,
    eps: f32,
) -> R<()> {
    let count = replicas.count() as f64;
    let local_mean = wide(&dev.download(mean)?);
    let local_var: Vec<f64> = wide(&dev.download(rstd)?)
        .iter()
        .map(|&r| (1.0 / (r * r) - f64::from(eps)).max(0.0))
        .collect();
    let global_mean = summed(dev, replicas, local_mean.iter().map(|m| m / count))?;
    let spread = local_var
        .iter()
        .zip(&local_mean)
        .zip(&global_mean)
        .map(|((v, m), g)| (v + (m - g) * (m - g)) / count);
    let global_var = summed(dev, replicas, spread)?;
    *mean = dev.upload(&narrow(&global_mean))?;
    let global_rstd: Vec<f64> = global_var
        .iter()
        .map(|v| 1.0 / (v + f64::from(eps)).sqrt())
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
    /// This replica's `Σdy·x̂` and `Σdy` per channel (the kernel's scale and shift
    /// gradients).
    pub sums: (&'b B::Buf, &'b B::Buf),
    /// Samples and spatial size of this replica's share.
    pub batch: usize,
    /// Channels.
    pub channels: usize,
    /// Positions per channel and sample.
    pub spatial: usize,
}

/// Corrects `dx`, computed by the kernel with this replica's sums, to the whole batch's.
pub(super) fn backward<B: Backend>(
    dev: &B,
    replicas: &dyn Replicas<B>,
    dx: &mut B::Buf,
    bn: &Backward<'_, B>,
) -> R<()> {
    let n = (bn.batch * bn.spatial) as f64;
    let whole = n * replicas.count() as f64;
    let (sgh, sg) = (
        wide(&dev.download(bn.sums.0)?),
        wide(&dev.download(bn.sums.1)?),
    );
    let all = summed(dev, replicas, sg.iter().chain(&sgh).copied())?;
    let (all_sg, all_sgh) = all.split_at(bn.channels);
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

/// The replicas' sum of `values` (f32 on the wire, as every all-reduce), once it is done.
fn summed<B: Backend>(
    dev: &B,
    replicas: &dyn Replicas<B>,
    values: impl Iterator<Item = f64>,
) -> R<Vec<f64>> {
    let values: Vec<f32> = values.map(|v| v as f32).collect();
    let mut buf = dev.upload(&values)?;
    replicas.all_reduce(dev, &mut buf)?;
    replicas.settle()?;
    Ok(wide(&dev.download(&buf)?))
}

fn wide(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}
