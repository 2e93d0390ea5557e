//! The shape rule of Resize and Upsample.

use super::{attr_err, axis, known, mismatch, need_float, Ctx, Result};
use crate::infer::{InferError, ValueType};
use crate::op::Resize;
use crate::shape::{Dim, Shape};

/// Resize: the sizes input when given (and not empty), else the scales
/// (`floor(in · scale)`) on the resized axes.
pub(super) fn resize(ctx: &Ctx<'_>, r: &Resize) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    need_float(x, 0)?;
    let rank = x.shape.rank();
    let axes: Vec<usize> = match &r.axes {
        Some(a) => a
            .iter()
            .map(|&a| axis(a, rank, "axes"))
            .collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    let mut out = x.shape.0.clone();
    let given = |slot: usize| {
        ctx.opt(slot)
            .is_some_and(|t| t.shape.known_numel() != Some(0))
    };
    if let Some(slot) = r.slots.1.filter(|&s| given(s)) {
        let sizes = ctx.dims_of(slot)?;
        if sizes.len() != axes.len() {
            return Err(mismatch(format!(
                "sizes has {} values for {} axes",
                sizes.len(),
                axes.len()
            )));
        }
        for (&a, d) in axes.iter().zip(sizes) {
            out[a] = d;
        }
    } else {
        let scales = match &r.scales {
            Some(s) => s.iter().map(|&v| f64::from(v)).collect(),
            None if given(r.slots.0) => ctx.floats_of(r.slots.0)?,
            None => return Err(InferError::MissingInput { slot: r.slots.0 }),
        };
        if scales.len() != axes.len() {
            return Err(mismatch(format!(
                "scales has {} values for {} axes",
                scales.len(),
                axes.len()
            )));
        }
        for (&a, &scale) in axes.iter().zip(&scales) {
            if !(scale.is_finite() && scale > 0.0) {
                return Err(attr_err(
                    "scales",
                    format!("{scale} is not a positive scale"),
                ));
            }
            out[a] = scaled(&x.shape.0[a], scale)?;
        }
    }
    Ok(vec![ValueType::new(x.dtype, Shape(out))])
}

/// `floor(d · scale)`; a symbolic `d` only by a whole scale.
fn scaled(d: &Dim, scale: f64) -> Result<Dim> {
    if let Some(n) = d.as_known() {
        return Ok(Dim::known((n as f64 * scale).floor() as i64));
    }
    if scale.fract() == 0.0 {
        if let Some(d) = d.checked_mul(&Dim::known(scale as i64)) {
            return Ok(d);
        }
    }
    known(d).map(Dim::known)
}
