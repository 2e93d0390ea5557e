//! Shape rules of signal processing: STFT.

use super::{known, mismatch, Ctx, Result};
use crate::infer::{InferError, ValueType};
use crate::shape::{Dim, Shape};

/// STFT: a real signal `[batch, length]` or `[batch, length, 1]` cut into frames of the
/// window's length (or `frame_length`) every `frame_step` samples, each transformed:
/// `[batch, frames, bins, 2]`, `bins` half the frame plus one when one-sided.
pub(super) fn stft(ctx: &Ctx<'_>, onesided: bool) -> Result<Vec<ValueType>> {
    let x = ctx.input(0)?;
    if !x.dtype.is_float() {
        return Err(InferError::Type {
            reason: format!("the signal must be floating point, got {}", x.dtype),
        });
    }
    let dims = &x.shape.0;
    match dims.len() {
        2 => {}
        3 if dims[2].as_known() == Some(1) => {}
        3 if dims[2].as_known() == Some(2) => {
            return Err(InferError::Type {
                reason: "a complex signal (last axis 2) is not supported; only real ones".into(),
            })
        }
        _ => {
            return Err(mismatch(format!(
                "the signal must be [batch, length] or [batch, length, 1], got {}",
                x.shape
            )))
        }
    }
    let one = |slot: usize, what: &str| -> Result<i64> {
        match ctx.ints_of(slot)?.as_slice() {
            [v] if *v >= 1 => Ok(*v),
            other => Err(mismatch(format!(
                "{what} must be one positive integer, got {other:?}"
            ))),
        }
    };
    let step = one(1, "frame_step")?;
    let window = ctx.opt(2).map(|w| w.shape.clone());
    let frame = match (&window, ctx.opt(3)) {
        (_, Some(_)) => {
            let n = one(3, "frame_length")?;
            if let Some(w) = window.as_ref().and_then(|w| w.0.first()?.as_known()) {
                if w != n {
                    return Err(mismatch(format!(
                        "the window has {w} values where frame_length is {n}"
                    )));
                }
            }
            n
        }
        (Some(w), None) if w.rank() == 1 => known(&w.0[0])?,
        (Some(w), None) => {
            return Err(mismatch(format!("the window must be one axis, got {w}")));
        }
        (None, None) => {
            return Err(mismatch(
                "neither a window nor frame_length says how long a frame is".into(),
            ))
        }
    };
    let length = known(&dims[1])?;
    if length < frame {
        return Err(mismatch(format!(
            "the signal's {length} samples are fewer than one frame of {frame}"
        )));
    }
    let frames = (length - frame) / step + 1;
    let bins = if onesided { frame / 2 + 1 } else { frame };
    let shape = Shape(vec![
        dims[0].clone(),
        Dim::known(frames),
        Dim::known(bins),
        Dim::known(2),
    ]);
    Ok(vec![ValueType::new(x.dtype, shape)])
}
