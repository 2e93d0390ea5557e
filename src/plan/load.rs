//! Reading what a plan is made for: an ONNX model bound to its batch (checking that a
//! fixed-batch export can take it), a layer graph, as the layers the planners place, or a
//! Hugging Face configuration, as a decoder's shape.

use super::*;

/// The batch a model was exported with, when it is a real one to plan at: a
/// [`fixed_batch`] of at least 2 (exports at batch 1 are only examples).
pub(super) fn exported_batch(graph: &ralpc_ir::Graph) -> Option<u64> {
    fixed_batch(graph).filter(|&b| b >= 2)
}

/// The batch fixed in the model's inputs: every input of rank ≥ 2 holds the same known
/// size on its batch axis ([`ralpc_ir::bind::batch_axes`]).
pub(crate) fn fixed_batch(graph: &ralpc_ir::Graph) -> Option<u64> {
    let axes = ralpc_ir::bind::batch_axes(graph);
    let mut batch = None;
    for input in graph.inputs() {
        let value = graph.value(input);
        let shape = value.declared.as_ref()?.shape.as_ref()?;
        if shape.rank() < 2 {
            return None;
        }
        let b = shape.0.get(*axes.get(&value.name)?)?.as_size()?;
        if batch.is_some_and(|x| x != b) {
            return None;
        }
        batch = Some(b);
    }
    batch
}

/// What verifying `model` accepted with a warning ([`ralpc_ir::GraphInfo::warnings`]).
pub(super) fn warnings_of(model: &Model) -> Vec<String> {
    match model {
        Model::Layers(_) | Model::Shape { .. } => Vec::new(),
        Model::Graph {
            info, fixed_batch, ..
        } => {
            let mut warnings = model_warnings(info);
            warnings.extend(
                fixed_batch
                    .as_ref()
                    .map(|why| format!("no plan splits the batch's samples: {why}")),
            );
            warnings
        }
    }
}

/// The warnings of a verified model, as a user reads them.
pub(crate) fn model_warnings(info: &ralpc_ir::GraphInfo) -> Vec<String> {
    info.warnings()
        .iter()
        .map(|w| format!("{w}: the computed shape is used, as onnxruntime does"))
        .collect()
}

pub(super) fn request_error(message: String) -> Error {
    Error::Plan(Box::new(PlanError::Request(message)))
}

/// The batch the `--input` shapes give on their batch axes, if any; they must agree.
/// Scalar inputs (a sample rate, a flag) have no batch.
pub(super) fn input_batch(
    graph: &ralpc_ir::Graph,
    inputs: &std::collections::BTreeMap<String, Vec<u64>>,
) -> Result<Option<(String, u64)>, Error> {
    ralpc_ir::bind::given_batch(graph, inputs).map_err(|((first, fb), (name, b))| {
        request_error(format!(
            "--input {first} has batch {fb} and --input {name} batch {b}: planning splits \
             samples on every input's batch axis, so their batches must agree"
        ))
    })
}

/// The decoder a Hugging Face configuration describes, at the sequence and batch of
/// `--input input_ids=B,S` (the configuration holds neither).
fn configured(
    model: &Path,
    text: &str,
    batch: Option<u64>,
    inputs: &std::collections::BTreeMap<String, Vec<u64>>,
    values: &std::collections::BTreeMap<String, Vec<f64>>,
) -> Result<Model, Error> {
    let name = model.display();
    if !values.is_empty() {
        return Err(request_error(format!(
            "{name} is a Hugging Face configuration: it has no inputs for --value to fix"
        )));
    }
    let Some((input, shape)) = inputs.iter().next().filter(|_| inputs.len() == 1) else {
        return Err(request_error(format!(
            "{name} is a Hugging Face configuration, which holds no sequence length: give it \
             as --input input_ids=BATCH,SEQUENCE"
        )));
    };
    let &[given, sequence] = shape.as_slice() else {
        return Err(request_error(format!(
            "--input {input}: a decoder's tokens are [batch, sequence], not {} sizes",
            shape.len()
        )));
    };
    if given == 0 || sequence == 0 || given.saturating_mul(sequence) > 1 << 40 {
        return Err(request_error(format!(
            "--input {input}={given},{sequence}: a batch and a sequence of at least 1, and at \
             most 2^40 tokens in all"
        )));
    }
    if batch.is_some_and(|b| b != given) {
        return Err(request_error(format!(
            "--input {input} has batch {given} where --batch is {}",
            batch.unwrap_or_default()
        )));
    }
    let spec = ralpc_ir::models::huggingface::spec(text, sequence)
        .map_err(|e| request_error(format!("{name}: {e}")))?;
    Ok(Model::Shape {
        shape: Box::new(Transformer::from(&spec)),
        batch: given,
    })
}

pub(super) fn load_model(
    model: &Path,
    batch: Option<u64>,
    inputs: &std::collections::BTreeMap<String, Vec<u64>>,
    values: &std::collections::BTreeMap<String, Vec<f64>>,
) -> Result<Model, Error> {
    let is_onnx = model
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
    // A file that is no ONNX model may be a planner's profile; if it is neither, the
    // error gives both reasons.
    let mut not_a_profile = None;
    if !is_onnx {
        if let Ok(text) = read_input_text(model, InputKind::Text) {
            if ralpc_ir::models::huggingface::is_config(&text) {
                return configured(model, &text, batch, inputs, values);
            }
            match profile::parse_model(&text, &model.display().to_string(), batch) {
                Ok(graph) => {
                    if !inputs.is_empty() || !values.is_empty() {
                        return Err(request_error(format!(
                            "{} is a planner's profile: its layers were measured at their own \
                             input shapes and values, which --input and --value cannot change",
                            model.display()
                        )));
                    }
                    return Ok(Model::Layers(graph));
                }
                Err(e @ profile::ProfileError::UnknownFormat { .. }) => {
                    not_a_profile = Some(e);
                }
                Err(e) => return Err(Error::Profile(Box::new(e))),
            }
        }
    }
    let mut imported = match (onnx::import(model), not_a_profile) {
        (Ok(imported), _) => imported,
        (Err(e), Some(profile)) => {
            return Err(request_error(format!(
                "{} is neither an ONNX model ({}) nor a profile ({profile})",
                model.display(),
                crate::run::chain(&e)
            )))
        }
        (Err(e), None) => return Err(e.into()),
    };
    ralpc_ir::bind_values(&mut imported.graph, values)?;
    let batch = match (batch, input_batch(&imported.graph, inputs)?) {
        (Some(b), Some((name, given))) if b != given => {
            return Err(request_error(format!(
                "--input {name} has batch {given} (on its batch axis) where --batch is {b}"
            )))
        }
        (b, given) => b
            .or(given.map(|(_, g)| g))
            .or_else(|| exported_batch(&imported.graph))
            .unwrap_or(DEFAULT_BATCH),
    };
    // A fixed-batch export is re-batched for each rank's share: whether it can be is
    // probed on a copy before binding.
    let unbound = fixed_batch(&imported.graph).map(|_| imported.graph.clone());
    bind(
        &mut imported.graph,
        &Bindings {
            batch: Some(batch),
            inputs: inputs.clone(),
        },
    )?;
    let info = verify(&imported.graph)?;
    let fixed_batch = unbound.and_then(|unbound| batch_fixed_by(&unbound, batch, inputs));
    Ok(Model::Graph {
        graph: Box::new(imported.graph),
        info: Box::new(info),
        batch,
        fixed_batch,
    })
}

/// Why the ranks of a plan of `unbound`, a fixed-batch export planned at `batch`, cannot
/// compute shares of the batch, if they cannot: an exporter baked the batch into a node
/// that re-batching does not reach. One share is tried, the smallest that differs from the
/// exported batch (a model that re-batches does so to any size).
pub(super) fn batch_fixed_by(
    unbound: &ralpc_ir::Graph,
    batch: u64,
    inputs: &std::collections::BTreeMap<String, Vec<u64>>,
) -> Option<String> {
    let exported = fixed_batch(unbound)?;
    let share = if exported == 1 { 2 } else { 1 };
    if batch < 2 || share > batch {
        return None;
    }
    let samples = if share == 1 { "sample" } else { "samples" };
    let (graph, info) = match crate::run::at_batch(unbound, share, inputs) {
        Ok(bound) => bound,
        Err(e) => {
            return Some(format!(
                "the export fixes its batch at {exported} and cannot compute {share} \
                 {samples} at a time ({})",
                crate::run::chain(&e)
            ))
        }
    };
    // The shapes may still agree where a constant baked at the exported batch broadcasts
    // over the samples (a mask of [exported, 1, s, s]; one of batch 1 broadcasts rightly):
    // an output whose first axis is the batch at the exported batch then keeps the
    // exported batch there.
    if exported < 2 {
        return None;
    }
    let (whole, whole_info) = crate::run::at_batch(unbound, exported, inputs).ok()?;
    let first = |info: &ralpc_ir::GraphInfo, v| -> Option<u64> {
        info.ty(v).shape.as_sizes()?.first().copied()
    };
    whole
        .outputs()
        .iter()
        .zip(graph.outputs())
        .find_map(|(&at_exported, &at_share)| {
            let computed = first(&info, at_share)?;
            (first(&whole_info, at_exported)? == exported && computed != share).then(|| {
                format!(
                    "the export fixes its batch at {exported}: at {share} {samples} its output \
                 '{}' still holds {computed} on its batch axis",
                    graph.value(at_share).name
                )
            })
        })
}
