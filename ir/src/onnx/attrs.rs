//! Typed reading of ONNX attributes.
//!
//! `AttributeProto::as_value` in onnx-protobuf panics on malformed attributes, so this reads
//! the raw fields, checking the declared type, and reports problems by attribute name.

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, NodeProto, TensorProto};

use crate::error::Problem;

/// The attributes of one node.
pub(crate) struct Attrs<'a> {
    attrs: &'a [AttributeProto],
}

type AttrResult<T> = Result<Option<T>, Problem>;

fn kind_name(t: AttributeType) -> &'static str {
    match t {
        AttributeType::UNDEFINED => "undefined",
        AttributeType::FLOAT => "a float",
        AttributeType::INT => "an int",
        AttributeType::STRING => "a string",
        AttributeType::TENSOR => "a tensor",
        AttributeType::GRAPH => "a graph",
        AttributeType::SPARSE_TENSOR => "a sparse tensor",
        AttributeType::TYPE_PROTO => "a type",
        AttributeType::FLOATS => "a list of floats",
        AttributeType::INTS => "a list of ints",
        AttributeType::STRINGS => "a list of strings",
        AttributeType::TENSORS => "a list of tensors",
        AttributeType::GRAPHS => "a list of graphs",
        AttributeType::SPARSE_TENSORS => "a list of sparse tensors",
        AttributeType::TYPE_PROTOS => "a list of types",
    }
}

impl<'a> Attrs<'a> {
    pub(crate) fn of(node: &'a NodeProto) -> Attrs<'a> {
        Attrs {
            attrs: &node.attribute,
        }
    }

    fn get(&self, name: &str, want: AttributeType) -> Result<Option<&'a AttributeProto>, Problem> {
        let Some(a) = self.attrs.iter().find(|a| a.name == name) else {
            return Ok(None);
        };
        let got = a.type_.enum_value().unwrap_or(AttributeType::UNDEFINED);
        // Some old writers leave `type` unset; accept when the wanted field is populated.
        let populated = match want {
            AttributeType::INT => true,
            AttributeType::FLOAT => true,
            AttributeType::STRING => !a.s.is_empty(),
            AttributeType::INTS => !a.ints.is_empty(),
            AttributeType::FLOATS => !a.floats.is_empty(),
            AttributeType::TENSOR => a.t.is_some(),
            _ => false,
        };
        if got == want || (got == AttributeType::UNDEFINED && populated) {
            Ok(Some(a))
        } else {
            Err(Problem::AttributeType {
                attr: name.to_owned(),
                expected: kind_name(want),
                got: match a.type_.enum_value() {
                    Ok(t) => kind_name(t).to_owned(),
                    Err(code) => format!("unknown attribute type {code}"),
                },
            })
        }
    }

    pub(crate) fn int(&self, name: &str) -> AttrResult<i64> {
        Ok(self.get(name, AttributeType::INT)?.map(|a| a.i))
    }

    pub(crate) fn float(&self, name: &str) -> AttrResult<f32> {
        Ok(self.get(name, AttributeType::FLOAT)?.map(|a| a.f))
    }

    pub(crate) fn ints(&self, name: &str) -> AttrResult<Vec<i64>> {
        Ok(self.get(name, AttributeType::INTS)?.map(|a| a.ints.clone()))
    }

    pub(crate) fn floats(&self, name: &str) -> AttrResult<Vec<f32>> {
        Ok(self
            .get(name, AttributeType::FLOATS)?
            .map(|a| a.floats.clone()))
    }

    pub(crate) fn string(&self, name: &str) -> AttrResult<String> {
        Ok(self
            .get(name, AttributeType::STRING)?
            .map(|a| String::from_utf8_lossy(&a.s).into_owned()))
    }

    pub(crate) fn strings(&self, name: &str) -> AttrResult<Vec<String>> {
        Ok(self.get(name, AttributeType::STRINGS)?.map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        }))
    }

    pub(crate) fn tensor(&self, name: &str) -> AttrResult<&'a TensorProto> {
        match self.get(name, AttributeType::TENSOR)? {
            Some(a) => match a.t.as_ref() {
                Some(t) => Ok(Some(t)),
                None => Err(Problem::AttributeValue {
                    attr: name.to_owned(),
                    reason: "tensor attribute has no tensor".into(),
                }),
            },
            None => Ok(None),
        }
    }

    /// A bool stored as an int (0 or 1).
    pub(crate) fn flag(&self, name: &str, default: bool) -> Result<bool, Problem> {
        match self.int(name)? {
            None => Ok(default),
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            Some(v) => Err(Problem::AttributeValue {
                attr: name.to_owned(),
                reason: format!("expected 0 or 1, got {v}"),
            }),
        }
    }

    /// A list of non-negative sizes (`strides`, `kernel_shape`, …), each ≥ `min`.
    pub(crate) fn sizes(&self, name: &str, min: i64) -> AttrResult<Vec<u64>> {
        let Some(v) = self.ints(name)? else {
            return Ok(None);
        };
        if let Some(bad) = v.iter().find(|&&x| x < min) {
            return Err(Problem::AttributeValue {
                attr: name.to_owned(),
                reason: format!("values must be >= {min}, got {bad}"),
            });
        }
        Ok(Some(v.into_iter().map(|x| x as u64).collect()))
    }
}
