//! From ONNX `op_type` and attributes to [`Op`].
//!
//! One converter per family of operators (`products.rs`, `elementwise.rs`, `reduce.rs`,
//! `normalize.rs`, `window.rs`, `movement.rs`, `indexing.rs`, `constants.rs`), one arm per
//! supported operator; the defaults are the ONNX spec's
//! (<https://onnx.ai/onnx/operators/>). Opset differences that move an attribute to an
//! input are absorbed by `Option` attributes (see [`crate::op`]).

mod constants;
mod elementwise;
mod indexing;
mod movement;
mod normalize;
mod products;
mod reduce;
mod window;

use onnx_protobuf::NodeProto;

use super::attrs::Attrs;
use super::tensor::ExternalFiles;
use crate::error::Problem;
use crate::op::*;

/// The result of converting one node.
pub(crate) enum Converted {
    /// A supported op.
    Op(Op),
    /// `op_type` is not supported.
    Unsupported,
}

pub(super) fn invalid(attr: &str, reason: impl Into<String>) -> Problem {
    Problem::AttributeValue {
        attr: attr.to_owned(),
        reason: reason.into(),
    }
}

pub(super) fn padding(a: &Attrs<'_>) -> Result<Padding, Problem> {
    let auto = a.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    Ok(match auto.as_str() {
        "NOTSET" | "" => Padding::Explicit(a.sizes("pads", 0)?.unwrap_or_default()),
        "SAME_UPPER" => Padding::SameUpper,
        "SAME_LOWER" => Padding::SameLower,
        "VALID" => Padding::Valid,
        other => return Err(invalid("auto_pad", format!("unknown mode '{other}'"))),
    })
}

/// A node being converted: the proto, its attributes, the default domain's opset and
/// where external tensors live.
pub(super) struct Converting<'a> {
    node: &'a NodeProto,
    attrs: Attrs<'a>,
    opset: i64,
    files: &'a ExternalFiles<'a>,
}

/// A family's converter: its operators' ops, `None` for the others.
type Family = fn(&Converting<'_>) -> Result<Option<Op>, Problem>;

/// The families, each converting its own operators.
const FAMILIES: [Family; 8] = [
    products::convert,
    elementwise::convert,
    reduce::convert,
    normalize::convert,
    window::convert,
    movement::convert,
    indexing::convert,
    constants::convert,
];

/// Converts one node. `opset` is the default domain's version.
pub(crate) fn convert(
    node: &NodeProto,
    opset: i64,
    files: &ExternalFiles<'_>,
) -> Result<Converted, Problem> {
    let c = Converting {
        node,
        attrs: Attrs::of(node),
        opset,
        files,
    };
    for family in FAMILIES {
        if let Some(op) = family(&c)? {
            return Ok(Converted::Op(op));
        }
    }
    Ok(Converted::Unsupported)
}
