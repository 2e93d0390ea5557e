//! Shape rules of the windowed ops: Conv, ConvTranspose and the pools (kernel, strides,
//! dilations and pads per spatial axis, `auto_pad` resolved against the input).

use super::{attr_err, known, mismatch, need_float, need_rank, overflow, Ctx, Result};
use crate::dtype::DType;
use crate::infer::{InferError, ValueType};
use crate::op::{Conv, ConvTranspose, Padding, Pool};
use crate::shape::{Dim, Shape};

/// Per-axis attribute list: absent → `default`, else exactly `k` values.
fn per_axis(v: &Option<Vec<u64>>, k: usize, default: u64, attr: &str) -> Result<Vec<u64>> {
    match v {
        None => Ok(vec![default; k]),
        Some(v) if v.len() == k => Ok(v.clone()),
        Some(v) => Err(attr_err(
            attr,
            format!("expected {k} values, got {}", v.len()),
        )),
    }
}

/// Begin and end pads per spatial axis, after `auto_pad`.
fn pads(
    padding: &Padding,
    input: &[i64],
    kernel: &[u64],
    strides: &[u64],
    dilations: &[u64],
) -> Result<Vec<(i64, i64)>> {
    let k = input.len();
    match padding {
        Padding::Explicit(p) if p.is_empty() => Ok(vec![(0, 0); k]),
        Padding::Explicit(p) if p.len() == 2 * k => {
            Ok((0..k).map(|i| (p[i] as i64, p[i + k] as i64)).collect())
        }
        Padding::Explicit(p) => Err(attr_err(
            "pads",
            format!("expected {} values, got {}", 2 * k, p.len()),
        )),
        Padding::Valid => Ok(vec![(0, 0); k]),
        Padding::SameUpper | Padding::SameLower => Ok((0..k)
            .map(|i| {
                let s = strides[i] as i64;
                let out = (input[i] + s - 1) / s;
                let eff = (kernel[i] as i64 - 1) * dilations[i] as i64 + 1;
                let total = ((out - 1) * s + eff - input[i]).max(0);
                if matches!(padding, Padding::SameUpper) {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            })
            .collect()),
    }
}

/// Output size of a sliding window on one axis.
fn window(
    input: i64,
    kernel: u64,
    stride: u64,
    dilation: u64,
    pad: (i64, i64),
    ceil: bool,
) -> Result<i64> {
    let eff = (kernel as i64 - 1)
        .checked_mul(dilation as i64)
        .and_then(|e| e.checked_add(1))
        .ok_or_else(|| overflow("kernel extent"))?;
    let span = input
        .checked_add(pad.0)
        .and_then(|x| x.checked_add(pad.1))
        .and_then(|x| x.checked_sub(eff))
        .ok_or_else(|| overflow("window extent"))?;
    if span < 0 {
        return Err(mismatch(format!(
            "window of extent {eff} does not fit an input of size {input} padded by {}+{}",
            pad.0, pad.1
        )));
    }
    let s = stride as i64;
    let mut out = if ceil {
        (span + s - 1) / s + 1
    } else {
        span / s + 1
    };
    // In ceil mode the last window must start inside the input or its left padding.
    if ceil && (out - 1) * s >= input + pad.0 {
        out -= 1;
    }
    Ok(out)
}

fn spatial(shape: &Shape, from: usize) -> Result<Vec<i64>> {
    shape.0[from..].iter().map(known).collect()
}

pub(super) fn conv(ctx: &Ctx<'_>, c: &Conv) -> Result<Vec<ValueType>> {
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    need_rank(x, 0, 3, "rank >= 3 (N, C, spatial...)")?;
    need_float(x, 0)?;
    if w.shape.rank() != x.shape.rank() {
        return Err(InferError::Rank {
            slot: 1,
            expected: format!("rank {}", x.shape.rank()),
            got: w.shape.clone(),
        });
    }
    let k = x.shape.rank() - 2;
    let kernel: Vec<u64> = spatial(&w.shape, 2)?.iter().map(|&v| v as u64).collect();
    if let Some(attr) = &c.kernel {
        if *attr != kernel {
            return Err(attr_err(
                "kernel_shape",
                format!("{attr:?} does not match the weight's {kernel:?}"),
            ));
        }
    }
    let cin = &x.shape.0[1];
    let per_group = w.shape.0[1]
        .checked_mul(&Dim::known(c.group as i64))
        .ok_or_else(|| overflow("channels"))?;
    if cin.as_known().is_some() && *cin != per_group {
        return Err(mismatch(format!(
            "input has {cin} channels but the weight {} expects {} per group x {} group(s)",
            w.shape, w.shape.0[1], c.group
        )));
    }
    let m = known(&w.shape.0[0])?;
    if m % c.group as i64 != 0 {
        return Err(attr_err(
            "group",
            format!("{} does not divide the {m} output channels", c.group),
        ));
    }
    if let Some(b) = ctx.opt(2) {
        if b.shape.0 != [Dim::known(m)] {
            return Err(mismatch(format!(
                "bias has shape {} but there are {m} output channels",
                b.shape
            )));
        }
    }
    let strides = per_axis(&c.strides, k, 1, "strides")?;
    let dilations = per_axis(&c.dilations, k, 1, "dilations")?;
    let input = spatial(&x.shape, 2)?;
    let pads = pads(&c.padding, &input, &kernel, &strides, &dilations)?;
    let mut out = vec![x.shape.0[0].clone(), Dim::known(m)];
    for i in 0..k {
        out.push(Dim::known(window(
            input[i],
            kernel[i],
            strides[i],
            dilations[i],
            pads[i],
            false,
        )?));
    }
    Ok(vec![ValueType::new(x.dtype, Shape(out))])
}

pub(super) fn conv_transpose(ctx: &Ctx<'_>, ct: &ConvTranspose) -> Result<Vec<ValueType>> {
    let c = &ct.conv;
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    need_rank(x, 0, 3, "rank >= 3 (N, C, spatial...)")?;
    if w.shape.rank() != x.shape.rank() {
        return Err(InferError::Rank {
            slot: 1,
            expected: format!("rank {}", x.shape.rank()),
            got: w.shape.clone(),
        });
    }
    let k = x.shape.rank() - 2;
    if x.shape.0[1].as_known().is_some() && x.shape.0[1] != w.shape.0[0] {
        return Err(mismatch(format!(
            "input has {} channels but the weight {} expects {}",
            x.shape.0[1], w.shape, w.shape.0[0]
        )));
    }
    let m = known(&w.shape.0[1])?
        .checked_mul(c.group as i64)
        .ok_or_else(|| overflow("channels"))?;
    let kernel: Vec<u64> = spatial(&w.shape, 2)?.iter().map(|&v| v as u64).collect();
    let strides = per_axis(&c.strides, k, 1, "strides")?;
    let dilations = per_axis(&c.dilations, k, 1, "dilations")?;
    let out_pad = per_axis(&ct.output_padding, k, 0, "output_padding")?;
    let input = spatial(&x.shape, 2)?;
    let mut out = vec![x.shape.0[0].clone(), Dim::known(m)];
    if let Some(shape) = &ct.output_shape {
        let tail = &shape[shape.len().saturating_sub(k)..];
        if tail.len() != k {
            return Err(attr_err(
                "output_shape",
                format!("expected {k} values, got {}", shape.len()),
            ));
        }
        out.extend(tail.iter().map(|&v| Dim::known(v as i64)));
    } else {
        for i in 0..k {
            let (s, d, kk) = (strides[i] as i64, dilations[i] as i64, kernel[i] as i64);
            let full = s * (input[i] - 1) + out_pad[i] as i64 + (kk - 1) * d + 1;
            let size = match &c.padding {
                Padding::SameUpper | Padding::SameLower => input[i] * s,
                Padding::Valid => full,
                Padding::Explicit(p) if p.is_empty() => full,
                Padding::Explicit(p) if p.len() == 2 * k => full - p[i] as i64 - p[i + k] as i64,
                Padding::Explicit(p) => {
                    return Err(attr_err(
                        "pads",
                        format!("expected {} values, got {}", 2 * k, p.len()),
                    ))
                }
            };
            if size < 1 {
                return Err(mismatch(format!(
                    "output size {size} on spatial axis {i} is not positive"
                )));
            }
            out.push(Dim::known(size));
        }
    }
    Ok(vec![ValueType::new(x.dtype, Shape(out))])
}

pub(super) fn pool(ctx: &Ctx<'_>, p: &Pool) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    need_rank(x, 0, 3, "rank >= 3 (N, C, spatial...)")?;
    let k = x.shape.rank() - 2;
    if p.kernel.len() != k {
        return Err(attr_err(
            "kernel_shape",
            format!("expected {k} values, got {}", p.kernel.len()),
        ));
    }
    let strides = per_axis(&p.strides, k, 1, "strides")?;
    let dilations = per_axis(&p.dilations, k, 1, "dilations")?;
    let input = spatial(&x.shape, 2)?;
    let pads = pads(&p.padding, &input, &p.kernel, &strides, &dilations)?;
    let mut out = x.shape.0[..2].to_vec();
    for i in 0..k {
        out.push(Dim::known(window(
            input[i],
            p.kernel[i],
            strides[i],
            dilations[i],
            pads[i],
            p.ceil_mode,
        )?));
    }
    let mut outs = vec![ValueType::new(x.dtype, Shape(out.clone()))];
    if ctx.outputs > 1 {
        outs.push(ValueType::new(DType::I64, Shape(out)));
    }
    Ok(outs)
}
