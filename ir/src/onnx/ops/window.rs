//! Windows: pooling and resampling. The defaults are the ONNX spec's.

use super::super::attrs::Attrs;
use super::{invalid, padding, Converting};
use crate::error::Problem;
use crate::op::*;

/// The op of `c`'s node if it is one of this family's.
pub(super) fn convert(c: &Converting<'_>) -> Result<Option<Op>, Problem> {
    let (node, a) = (c.node, &c.attrs);
    let opset = c.opset;
    Ok(Some(match c.node.op_type.as_str() {
        "MaxPool" => Op::Pool(pool(a, PoolKind::Max)?),
        "AveragePool" => Op::Pool(pool(a, PoolKind::Average)?),
        "GlobalAveragePool" => Op::GlobalPool(PoolKind::Average),
        "GlobalMaxPool" => Op::GlobalPool(PoolKind::Max),
        "Resize" | "Upsample" => Op::Resize(resize(a, node.op_type == "Upsample", opset)?),
        _ => return Ok(None),
    }))
}

fn pool(a: &Attrs<'_>, kind: PoolKind) -> Result<Pool, Problem> {
    let kernel = a
        .sizes("kernel_shape", 1)?
        .ok_or_else(|| Problem::AttributeMissing {
            attr: "kernel_shape".into(),
        })?;
    Ok(Pool {
        kind,
        kernel,
        strides: a.sizes("strides", 1)?,
        dilations: a.sizes("dilations", 1)?,
        padding: padding(a)?,
        ceil_mode: a.flag("ceil_mode", false)?,
        count_include_pad: a.flag("count_include_pad", false)?,
    })
}
fn resize(a: &Attrs<'_>, upsample: bool, opset: i64) -> Result<Resize, Problem> {
    let mode = match a.string("mode")?.as_deref().unwrap_or("nearest") {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" | "trilinear" => ResizeMode::Linear,
        other => {
            return Err(invalid(
                "mode",
                format!("'{other}' is not supported (nearest and linear are)"),
            ))
        }
    };
    // Resize-10 and Upsample sample as `asymmetric` with `floor` rounding does.
    let legacy = upsample || opset < 11;
    let coordinates = match a.string("coordinate_transformation_mode")?.as_deref() {
        None if legacy => CoordinateMode::Asymmetric,
        None | Some("half_pixel") => CoordinateMode::HalfPixel,
        Some("half_pixel_symmetric") => CoordinateMode::HalfPixelSymmetric,
        Some("pytorch_half_pixel") => CoordinateMode::PytorchHalfPixel,
        Some("align_corners") => CoordinateMode::AlignCorners,
        Some("asymmetric") => CoordinateMode::Asymmetric,
        Some(other) => {
            return Err(invalid(
                "coordinate_transformation_mode",
                format!("'{other}' is not supported"),
            ))
        }
    };
    let nearest = match a.string("nearest_mode")?.as_deref() {
        None if legacy => NearestMode::Floor,
        None | Some("round_prefer_floor") => NearestMode::RoundPreferFloor,
        Some("round_prefer_ceil") => NearestMode::RoundPreferCeil,
        Some("floor") => NearestMode::Floor,
        Some("ceil") => NearestMode::Ceil,
        Some(other) => return Err(invalid("nearest_mode", format!("unknown mode '{other}'"))),
    };
    if a.int("antialias")?.unwrap_or(0) != 0 {
        return Err(invalid(
            "antialias",
            "antialiased resizing is not supported",
        ));
    }
    match a.string("keep_aspect_ratio_policy")?.as_deref() {
        None | Some("stretch") => {}
        Some(other) => {
            return Err(invalid(
                "keep_aspect_ratio_policy",
                format!("'{other}' is not supported (stretch is)"),
            ))
        }
    }
    Ok(Resize {
        mode,
        coordinates,
        nearest,
        scales: a.floats("scales")?,
        slots: if legacy { (1, None) } else { (2, Some(3)) },
        axes: a.ints("axes")?,
    })
}
