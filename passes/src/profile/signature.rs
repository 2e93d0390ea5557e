//! The key of a profile entry.

use std::collections::BTreeMap;
use std::fmt;

use ralpc_ir::{Graph, GraphInfo, NodeId, Op};
use serde::{Deserialize, Serialize};

/// What determines an op's cost: its type, cost-relevant attributes and per-sample shapes.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// ONNX op type.
    pub op: String,
    /// `kernel`, `stride`, `dilation`, `group` for convolutions and pooling.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attrs: BTreeMap<String, Vec<u64>>,
    /// Per-sample shape of the first input (batch axis removed).
    pub input: Vec<u64>,
    /// Per-sample shape of the first output.
    pub output: Vec<u64>,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims = |d: &[u64]| d.iter().map(u64::to_string).collect::<Vec<_>>().join("x");
        write!(f, "{}", self.op)?;
        if !self.attrs.is_empty() {
            let attrs: Vec<String> = self
                .attrs
                .iter()
                .map(|(k, v)| format!("{k}={}", dims(v)))
                .collect();
            write!(f, "{{{}}}", attrs.join(","))?;
        }
        write!(f, "[{}]->[{}]", dims(&self.input), dims(&self.output))
    }
}

impl Signature {
    /// Conv/pool attributes with ONNX defaults filled in.
    pub fn window(
        kernel: &[u64],
        stride: Option<&[u64]>,
        dilation: Option<&[u64]>,
        group: Option<u64>,
    ) -> BTreeMap<String, Vec<u64>> {
        let ones = vec![1; kernel.len()];
        let mut attrs = BTreeMap::new();
        attrs.insert("kernel".to_owned(), kernel.to_vec());
        attrs.insert(
            "stride".to_owned(),
            stride.map_or(ones.clone(), <[u64]>::to_vec),
        );
        attrs.insert(
            "dilation".to_owned(),
            dilation.map_or(ones, <[u64]>::to_vec),
        );
        if let Some(g) = group {
            attrs.insert("group".to_owned(), vec![g]);
        }
        attrs
    }

    /// The signature of an IR node whose first input and output shapes are known.
    pub fn of(graph: &Graph, info: &GraphInfo, node: NodeId) -> Option<Signature> {
        let n = graph.node(node);
        let per_sample = |v| {
            let sizes = info.ty(v).shape.as_sizes()?;
            Some(sizes.get(1..).unwrap_or_default().to_vec())
        };
        let input = per_sample(n.inputs.first().copied().flatten()?)?;
        let output = per_sample(*n.outputs.first()?)?;
        let attrs = match &n.op {
            Op::Conv(c) => {
                let weight = n.inputs.get(1).copied().flatten()?;
                let w = info.ty(weight).shape.as_sizes()?;
                let kernel = c
                    .kernel
                    .clone()
                    .unwrap_or_else(|| w.get(2..).unwrap_or_default().to_vec());
                Signature::window(
                    &kernel,
                    c.strides.as_deref(),
                    c.dilations.as_deref(),
                    Some(c.group),
                )
            }
            Op::Pool(p) => Signature::window(
                &p.kernel,
                p.strides.as_deref(),
                p.dilations.as_deref(),
                None,
            ),
            _ => BTreeMap::new(),
        };
        Some(Signature {
            op: n.op.name().to_owned(),
            attrs,
            input,
            output,
        })
    }
}
