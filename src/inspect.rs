//! `ralpc inspect`: per-layer accounting of a model.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ralpc_ir::{account, bind, onnx, verify, Bindings, Dim};
use serde::Serialize;

use crate::Error;

/// What to inspect.
#[derive(Clone, Debug, Default)]
pub struct InspectOptions {
    /// The ONNX file.
    pub model: PathBuf,
    /// The batch size (on every input's batch axis); `None` leaves a symbolic batch unbound.
    pub batch: Option<u64>,
    /// Full shapes for named inputs.
    pub inputs: BTreeMap<String, Vec<u64>>,
    /// Values for named inputs (`--value`), which become constants of the model.
    pub values: BTreeMap<String, Vec<f64>>,
}

/// One layer's row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct LayerRow {
    /// The ONNX node name.
    pub name: String,
    /// The ONNX op type.
    pub op: String,
    /// The first output's shape.
    pub output_shape: Vec<u64>,
    /// Parameters read first by this layer.
    pub params: u64,
    /// Forward multiply-accumulates.
    pub macs: u64,
    /// Other forward FLOPs.
    pub flops: u64,
    /// Bytes of the layer's outputs.
    pub activation_bytes: u64,
    /// Bytes of its parameters.
    pub weight_bytes: u64,
}

/// The result of [`inspect`]; its JSON form is what `ralpc inspect --json` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Inspection {
    /// Always [`crate::formats::INSPECT`].
    pub format: &'static str,
    /// The model path, as given.
    pub model: String,
    /// Producer recorded in the file.
    pub producer: String,
    /// Default-domain opset.
    pub opset: i64,
    /// IR version.
    pub ir_version: i64,
    /// The bound batch size.
    pub batch: Option<u64>,
    /// Input shapes after binding.
    pub inputs: Vec<(String, Vec<u64>)>,
    /// Total parameters.
    pub params: u64,
    /// Total forward MACs.
    pub macs: u64,
    /// Total other forward FLOPs.
    pub flops: u64,
    /// Sum of activation bytes.
    pub activation_bytes: u64,
    /// Total weight bytes.
    pub weight_bytes: u64,
    /// Layers in topological order.
    pub layers: Vec<LayerRow>,
    /// What the model holds that ralpc accepted with a warning (an output declared with
    /// a shape the graph does not compute).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

fn sizes(dims: &[Dim]) -> Vec<u64> {
    // After accounting succeeded every dimension is known.
    dims.iter().map(|d| d.as_size().unwrap_or(0)).collect()
}

/// Imports, binds, verifies and accounts for a model.
///
/// # Errors
/// [`Error::Import`], [`Error::Bind`], [`Error::Verify`] or [`Error::Account`], each
/// naming the node, attribute or input at fault.
pub fn inspect(options: &InspectOptions) -> Result<Inspection, Error> {
    let mut model = onnx::import(&options.model)?;
    ralpc_ir::bind_values(&mut model.graph, &options.values)?;
    // Unless told, the model is shown as exported: at its own fixed batch, if it has one.
    let batch = match options.batch {
        Some(b) => Some(b),
        // Showing needs no sample split: the first --input holding a batch gives it.
        None => ralpc_ir::bind::given_batch(&model.graph, &options.inputs)
            .unwrap_or_else(|(first, _)| Some(first))
            .map(|(_, b)| b)
            .or_else(|| crate::plan::fixed_batch(&model.graph))
            .or(Some(1)),
    };
    bind(
        &mut model.graph,
        &Bindings {
            batch,
            inputs: options.inputs.clone(),
        },
    )?;
    let info = verify(&model.graph)?;
    let totals = account(&model.graph, &info)?;
    let graph = &model.graph;
    let layers = totals
        .layers
        .iter()
        .map(|l| {
            let node = graph.node(l.node);
            let prov = graph.provenance(l.node);
            LayerRow {
                name: prov.name.clone(),
                op: prov.op_type.clone(),
                output_shape: sizes(&info.ty(node.outputs[0]).shape.0),
                params: l.params,
                macs: l.macs,
                flops: l.flops,
                activation_bytes: l.activation_bytes,
                weight_bytes: l.weight_bytes,
            }
        })
        .collect();
    let inputs = graph
        .inputs()
        .into_iter()
        .map(|v| (graph.value(v).name.clone(), sizes(&info.ty(v).shape.0)))
        .collect();
    Ok(Inspection {
        format: crate::formats::INSPECT,
        model: options.model.display().to_string(),
        producer: model.producer.clone(),
        opset: model.opset,
        ir_version: model.ir_version,
        batch,
        inputs,
        params: totals.params,
        macs: totals.macs,
        flops: totals.flops,
        activation_bytes: totals.activation_bytes,
        weight_bytes: totals.weight_bytes,
        layers,
        warnings: crate::plan::model_warnings(&info),
    })
}
