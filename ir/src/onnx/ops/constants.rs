//! Constants and shape arithmetic: Constant, Shape, Size, ConstantOfShape, Range. The
//! defaults are the ONNX spec's.

use std::sync::Arc;

use super::super::attrs::Attrs;
use super::super::tensor::{self, ExternalFiles};
use super::{invalid, Converting};
use crate::dtype::DType;
use crate::error::Problem;
use crate::op::*;
use crate::tensor::{Storage, TensorData};

/// The op of `c`'s node if it is one of this family's.
pub(super) fn convert(c: &Converting<'_>) -> Result<Option<Op>, Problem> {
    let a = &c.attrs;
    let files = c.files;
    Ok(Some(match c.node.op_type.as_str() {
        "Shape" => Op::Shape {
            start: a.int("start")?.unwrap_or(0),
            end: a.int("end")?,
        },
        "ConstantOfShape" => {
            let (value, dtype) = match a.tensor("value")? {
                None => (0.0, DType::F32),
                Some(t) => {
                    let t = tensor::decode(&mut t.clone(), files)?;
                    let v = t.to_f64s().map_err(|e| invalid("value", e.to_string()))?;
                    match v.as_slice() {
                        [x] => (*x, t.dtype),
                        _ => {
                            return Err(invalid(
                                "value",
                                format!("must hold one element, holds {}", v.len()),
                            ))
                        }
                    }
                }
            };
            Op::ConstantOfShape { value, dtype }
        }
        "Range" => Op::Range,
        "Size" => Op::Size,
        "Constant" => Op::Constant {
            tensor: Arc::new(constant(a, files)?),
            initializer: false,
        },

        _ => return Ok(None),
    }))
}

/// The payload of a `Constant` node: exactly one of its value attributes.
fn constant(a: &Attrs<'_>, files: &ExternalFiles<'_>) -> Result<TensorData, Problem> {
    let inline = |dtype: DType, dims: Vec<u64>, bytes: Vec<u8>| TensorData {
        dtype,
        dims,
        storage: Storage::Inline(Arc::new(bytes)),
    };
    if let Some(t) = a.tensor("value")? {
        return tensor::decode(&mut t.clone(), files);
    }
    if let Some(v) = a.float("value_float")? {
        return Ok(inline(DType::F32, vec![], v.to_le_bytes().to_vec()));
    }
    if let Some(v) = a.floats("value_floats")? {
        let n = v.len() as u64;
        return Ok(inline(
            DType::F32,
            vec![n],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
    }
    if let Some(v) = a.int("value_int")? {
        return Ok(inline(DType::I64, vec![], v.to_le_bytes().to_vec()));
    }
    if let Some(v) = a.ints("value_ints")? {
        let n = v.len() as u64;
        return Ok(inline(
            DType::I64,
            vec![n],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
    }
    Err(Problem::AttributeMissing {
        attr: "value".into(),
    })
}
