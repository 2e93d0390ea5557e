//! ONNX import: a `ModelProto` becomes a [`Graph`].
//!
//! Contract:
//! 1. Every initializer becomes a [`Op::Constant`] node (`initializer: true`), decoded by
//!    [`tensor`] (external data validated, never read).
//! 2. Every `graph.input` that is not also an initializer (IR < 4 lists weights again as
//!    inputs) becomes an [`Op::Input`] node with its declared type; unnamed dynamic
//!    dimensions get the symbol `<input>_dim<axis>`.
//! 3. Every node becomes one node of the graph; all unsupported operators are reported
//!    together, as are all other problems (undefined or duplicate names, bad attributes,
//!    malformed tensors).
//!
//! The result is well-formed (every input defined, names unique) but not yet verified:
//! [`crate::verify`] checks acyclicity and shapes.

mod attrs;
mod expand;
mod ops;
mod params;
mod scope;
pub(crate) mod tensor;
mod wire;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use onnx_protobuf::tensor_shape_proto::dimension::Value as DimValue;
use onnx_protobuf::type_proto::Value as TypeValue;
use onnx_protobuf::{Message, ModelProto, ValueInfoProto};

use crate::dtype::DType;
use crate::error::{Diagnostic, ImportError, Problem};
use crate::graph::{Graph, Provenance, Site, TensorType};
use crate::ids::ValueId;
use crate::op::{Branch, BranchNode, IfBranches, LoopBody, Op};
use crate::shape::{Dim, Shape};

/// An imported model.
#[derive(Clone, Debug)]
pub struct Model {
    /// The graph.
    pub graph: Graph,
    /// The file's IR version.
    pub ir_version: i64,
    /// The default-domain opset version.
    pub opset: i64,
    /// `producer_name producer_version`, as written.
    pub producer: String,
}

/// Reads and imports an ONNX file; external data is resolved against its folder.
///
/// # Errors
/// [`ImportError`] for unreadable files, undecodable bytes, unsupported operators and
/// malformed models, with every problem listed.
pub fn import(path: &Path) -> Result<Model, ImportError> {
    let bytes =
        crate::input::read_input(path, crate::input::InputKind::Model).map_err(|source| {
            ImportError::Read {
                path: path.into(),
                source,
            }
        })?;
    let base = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    import_bytes(&bytes, path, base)
}

/// Imports a model from bytes. `path` names it in messages; `base` is the folder external
/// data is resolved against (`None`: relative to the working directory).
///
/// # Errors
/// As [`import`].
pub fn import_bytes(bytes: &[u8], path: &Path, base: Option<&Path>) -> Result<Model, ImportError> {
    if let Some(offset) = wire::too_deep_group(bytes) {
        return Err(ImportError::TooDeep {
            path: path.into(),
            offset,
            limit: wire::MAX_GROUP_DEPTH,
        });
    }
    if bytes.starts_with(b"PK\x03\x04") {
        return Err(ImportError::NotOnnx {
            path: path.into(),
            what: "a zip archive (a PyTorch `.pt`/`.pth` checkpoint, say)",
        });
    }
    let model = ModelProto::parse_from_bytes(bytes).map_err(|source| ImportError::Decode {
        path: path.into(),
        source,
    })?;
    convert(model, path, base)
}

/// Decodes a serialized `TensorProto` (an ONNX test's `input_0.pb`, a reference output):
/// its name and contents. External data is resolved against `base`.
///
/// # Errors
/// When the bytes are not a tensor or the tensor is malformed; the message says why.
pub fn read_tensor(
    bytes: &[u8],
    base: Option<&Path>,
) -> Result<(String, crate::tensor::TensorData), BadTensor> {
    let mut proto = onnx_protobuf::TensorProto::parse_from_bytes(bytes)
        .map_err(|e| BadTensor(e.to_string()))?;
    let data = tensor::decode(&mut proto, &tensor::ExternalFiles::new(base))
        .map_err(|p| BadTensor(p.to_string()))?;
    Ok((proto.name, data))
}

/// Bytes [`read_tensor`] cannot read as a tensor, or its external data that cannot be
/// read: the file's fault, or the file system's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadTensor(pub String);

fn convert(mut model: ModelProto, path: &Path, base: Option<&Path>) -> Result<Model, ImportError> {
    let declared = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version);
    // Every model since IR version 3 names its opset; one that does not is most likely a
    // file cut short where the graph ends (protobuf writes the opsets after it).
    if declared.is_none() && model.ir_version >= 3 {
        return Err(ImportError::NoOpset {
            path: path.into(),
            ir_version: model.ir_version,
        });
    }
    let opset = declared.unwrap_or(1);
    let producer = format!("{} {}", model.producer_name, model.producer_version)
        .trim()
        .to_owned();
    let Some(mut proto) = model.graph.take() else {
        return Err(ImportError::NoGraph {
            path: PathBuf::from(path),
        });
    };
    if proto.node.is_empty() && proto.initializer.is_empty() && proto.input.is_empty() {
        return Err(ImportError::NoGraph {
            path: PathBuf::from(path),
        });
    }

    let files = tensor::ExternalFiles::new(base);
    let mut graph = Graph::new();
    let mut problems: Vec<Diagnostic> = Vec::new();
    let mut unsupported: Vec<Site> = Vec::new();
    let mut names: HashMap<String, (ValueId, Site)> = HashMap::new();
    // Names whose definition failed to import: not reported again as undefined.
    let mut failed: std::collections::HashSet<String> = std::collections::HashSet::new();
    // Fused attention operators become the primitives the rest of ralpc reads.
    for refused in expand::fused_attention(&mut proto) {
        failed.extend(refused.outputs);
        problems.push(Diagnostic {
            site: Site {
                name: refused.name,
                op_type: refused.op_type,
            },
            kind: refused.problem,
        });
    }

    let define = |graph: &Graph,
                  names: &mut HashMap<String, (ValueId, Site)>,
                  v: ValueId,
                  site: &Site,
                  problems: &mut Vec<Diagnostic>| {
        let name = graph.value(v).name.clone();
        if name.is_empty() {
            return;
        }
        if let Some((_, first)) = names.get(&name) {
            problems.push(Diagnostic {
                site: site.clone(),
                kind: Problem::DuplicateName {
                    name,
                    first: first.clone(),
                },
            });
        } else {
            names.insert(name, (v, site.clone()));
        }
    };

    // Buffers and constants `torch.export` lifted into initializers: not weights.
    let buffers = params::exported_buffers(&proto);

    // 1. Initializers.
    for mut t in std::mem::take(&mut proto.initializer) {
        let site = Site {
            name: t.name.clone(),
            op_type: "initializer".into(),
        };
        match tensor::decode(&mut t, &files) {
            Ok(data) => {
                let prov = Provenance {
                    name: t.name.clone(),
                    op_type: "initializer".into(),
                    module: String::new(),
                };
                let op = Op::Constant {
                    tensor: Arc::new(data),
                    initializer: true,
                };
                let n = graph.add_node(op, prov, &[&t.name]);
                let v = graph.node(n).outputs[0];
                define(&graph, &mut names, v, &site, &mut problems);
            }
            Err(kind) => {
                failed.insert(t.name.clone());
                problems.push(Diagnostic { site, kind });
            }
        }
    }

    // 2. Inputs that are not initializers.
    for vi in &proto.input {
        if names.contains_key(&vi.name) {
            continue;
        }
        let site = Site {
            name: vi.name.clone(),
            op_type: "input".into(),
        };
        let prov = Provenance {
            name: vi.name.clone(),
            op_type: "input".into(),
            module: String::new(),
        };
        let n = graph.add_node(Op::Input, prov, &[&vi.name]);
        let v = graph.node(n).outputs[0];
        match declared_type(vi, true) {
            Ok(ty) => graph.value_mut(v).declared = Some(ty),
            Err(kind) => problems.push(Diagnostic {
                site: site.clone(),
                kind,
            }),
        }
        define(&graph, &mut names, v, &site, &mut problems);
    }

    // 3. Nodes: create them all, then connect, so that a file naming a value before its
    // definition is reported as a cycle by the verifier rather than an undefined name.
    let mut pending = Vec::with_capacity(proto.node.len());
    for (index, node) in proto.node.iter().enumerate() {
        let name = node_name(node, index);
        let site = Site {
            name: name.clone(),
            op_type: node.op_type.clone(),
        };
        let mut nodes = NodeImport {
            opset,
            files: &files,
            unsupported: &mut unsupported,
            problems: &mut problems,
        };
        let Some((op, input_names)) = nodes.op(node, site.clone()) else {
            failed.extend(node.output.iter().cloned());
            continue;
        };
        let prov = Provenance {
            module: scope::module_path(node, &name),
            name,
            op_type: node.op_type.clone(),
        };
        let outputs: Vec<&str> = node.output.iter().map(String::as_str).collect();
        let id = graph.add_node(op, prov, &outputs);
        for v in graph.node(id).outputs.clone() {
            define(&graph, &mut names, v, &site, &mut problems);
        }
        pending.push((id, input_names, site));
    }
    for (id, input_names, site) in pending {
        let mut inputs = Vec::with_capacity(input_names.len());
        for (slot, name) in input_names.iter().enumerate() {
            if name.is_empty() {
                inputs.push(None);
            } else if let Some((v, _)) = names.get(name) {
                inputs.push(Some(*v));
            } else if failed.contains(name) {
                inputs.push(None);
            } else {
                problems.push(Diagnostic {
                    site: site.clone(),
                    kind: Problem::UndefinedValue {
                        slot,
                        name: name.clone(),
                    },
                });
                inputs.push(None);
            }
        }
        graph.set_inputs(id, inputs);
    }

    // Which constants are trained weights: see `params`.
    params::find_weights(&mut graph, producer.starts_with("pytorch"), &buffers);

    // 4. Outputs and declared types of intermediate values.
    let mut outputs = Vec::new();
    for vi in &proto.output {
        match names.get(&vi.name) {
            Some((v, _)) => {
                outputs.push(*v);
                if let Ok(ty) = declared_type(vi, false) {
                    graph.value_mut(*v).declared.get_or_insert(ty);
                }
            }
            None if failed.contains(&vi.name) => {}
            None => problems.push(Diagnostic {
                site: Site {
                    name: vi.name.clone(),
                    op_type: "output".into(),
                },
                kind: Problem::UndefinedOutput {
                    name: vi.name.clone(),
                },
            }),
        }
    }
    graph.set_outputs(outputs);
    for vi in &proto.value_info {
        if let (Some((v, _)), Ok(ty)) = (names.get(&vi.name), declared_type(vi, false)) {
            graph.value_mut(*v).declared.get_or_insert(ty);
        }
    }

    if !unsupported.is_empty() {
        return Err(ImportError::UnsupportedOps { sites: unsupported });
    }
    if !problems.is_empty() {
        return Err(ImportError::Invalid { problems });
    }
    Ok(Model {
        graph,
        ir_version: model.ir_version,
        opset,
        producer,
    })
}

/// A node's name in messages: its own, else its first output's, else its type and index.
fn node_name(node: &onnx_protobuf::NodeProto, index: usize) -> String {
    if !node.name.is_empty() {
        node.name.clone()
    } else if let Some(out) = node.output.iter().find(|o| !o.is_empty()) {
        out.clone()
    } else {
        format!("{}_{index}", node.op_type)
    }
}

/// Importing nodes, of the main graph or of a branch: the opset, where external data is
/// read, and where unsupported operators and other problems are collected.
struct NodeImport<'a, 'f> {
    opset: i64,
    files: &'a tensor::ExternalFiles<'f>,
    unsupported: &'a mut Vec<Site>,
    problems: &'a mut Vec<Diagnostic>,
}

impl NodeImport<'_, '_> {
    /// The operator of one node and the names of its inputs (for an `If`: the condition, then
    /// the values its branches capture). `None` when it cannot be imported: the reason is in
    /// `unsupported` or `problems`.
    fn op(&mut self, node: &onnx_protobuf::NodeProto, site: Site) -> Option<(Op, Vec<String>)> {
        if !(node.domain.is_empty() || node.domain == "ai.onnx") {
            self.unsupported.push(Site {
                op_type: format!("{}.{}", node.domain, node.op_type),
                ..site
            });
            return None;
        }
        if node.op_type == "If" {
            return self.if_op(node, site);
        }
        if node.op_type == "Loop" {
            return self.loop_op(node, site);
        }
        match ops::convert(node, self.opset, self.files) {
            Ok(ops::Converted::Op(op)) => Some((op, node.input.clone())),
            Ok(ops::Converted::Unsupported) => {
                self.unsupported.push(site);
                None
            }
            Err(kind) => {
                self.problems.push(Diagnostic { site, kind });
                None
            }
        }
    }

    /// An `If` with both branches imported (every unsupported op inside them is reported).
    fn if_op(&mut self, node: &onnx_protobuf::NodeProto, site: Site) -> Option<(Op, Vec<String>)> {
        let mut branch = |attr: &str| -> Option<Branch> {
            let Some(g) = node
                .attribute
                .iter()
                .find(|a| a.name == attr)
                .and_then(|a| a.g.as_ref())
            else {
                self.problems.push(Diagnostic {
                    site: site.clone(),
                    kind: Problem::AttributeMissing { attr: attr.into() },
                });
                return None;
            };
            self.branch(g, &site)
        };
        let (then_branch, else_branch) = (branch("then_branch"), branch("else_branch"));
        let (then_branch, else_branch) = (then_branch?, else_branch?);
        let (Some(cond), 1) = (
            node.input.first().filter(|c| !c.is_empty()),
            node.input.len(),
        ) else {
            self.problems.push(Diagnostic {
                site,
                kind: Problem::AttributeValue {
                    attr: "input".into(),
                    reason: "an If takes exactly one input, the condition".into(),
                },
            });
            return None;
        };
        for b in [&then_branch, &else_branch] {
            if b.outputs.len() != node.output.len() {
                self.problems.push(Diagnostic {
                    site,
                    kind: Problem::AttributeValue {
                        attr: "then_branch".into(),
                        reason: format!(
                            "a branch returns {} value(s) where the If has {} output(s)",
                            b.outputs.len(),
                            node.output.len()
                        ),
                    },
                });
                return None;
            }
        }
        let mut captures = then_branch.free_names();
        captures.extend(else_branch.free_names());
        captures.sort_unstable();
        captures.dedup();
        let inputs = std::iter::once(cond.clone())
            .chain(captures.iter().cloned())
            .collect();
        let op = Op::If(Arc::new(IfBranches {
            then_branch,
            else_branch,
            captures,
        }));
        Some((op, inputs))
    }

    /// A `Loop` with its body imported (every unsupported op inside it is reported).
    fn loop_op(
        &mut self,
        node: &onnx_protobuf::NodeProto,
        site: Site,
    ) -> Option<(Op, Vec<String>)> {
        let Some(g) = node
            .attribute
            .iter()
            .find(|a| a.name == "body")
            .and_then(|a| a.g.as_ref())
        else {
            self.problems.push(Diagnostic {
                site,
                kind: Problem::AttributeMissing {
                    attr: "body".into(),
                },
            });
            return None;
        };
        let body = self.subgraph(g, &site)?;
        let inputs: Vec<String> = g.input.iter().map(|i| i.name.clone()).collect();
        let carried = inputs.len().saturating_sub(2);
        let shape_error = |reason: String| Diagnostic {
            site: site.clone(),
            kind: Problem::AttributeValue {
                attr: "body".into(),
                reason,
            },
        };
        if inputs.len() < 2 || node.input.len() != inputs.len() {
            self.problems.push(shape_error(format!(
                "the body takes {} input(s) where the Loop gives it the iteration number, the \
                 condition and {} carried value(s)",
                inputs.len(),
                node.input.len().saturating_sub(2)
            )));
            return None;
        }
        if body.outputs.len() < 1 + carried || node.output.len() != body.outputs.len() - 1 {
            self.problems.push(shape_error(format!(
                "the body returns {} value(s) where the Loop has {} output(s) and {carried} \
                 carried value(s)",
                body.outputs.len(),
                node.output.len()
            )));
            return None;
        }
        let captures: Vec<String> = body
            .free_names()
            .into_iter()
            .filter(|n| !inputs.contains(n))
            .collect();
        let node_inputs = node
            .input
            .iter()
            .cloned()
            .chain(captures.iter().cloned())
            .collect();
        let op = Op::Loop(Arc::new(LoopBody {
            body,
            inputs,
            captures,
            done: 0,
        }));
        Some((op, node_inputs))
    }

    /// One branch of an `If`: its initializers become constants, its nodes are imported as in
    /// the main graph (an `If` inside recursively). A branch takes no inputs.
    fn branch(&mut self, g: &onnx_protobuf::GraphProto, site: &Site) -> Option<Branch> {
        if !g.input.is_empty() {
            self.problems.push(Diagnostic {
                site: site.clone(),
                kind: Problem::AttributeValue {
                    attr: "then_branch".into(),
                    reason: format!(
                        "a branch of an If takes no inputs, '{}' has {}",
                        g.name,
                        g.input.len()
                    ),
                },
            });
            return None;
        }
        self.subgraph(g, site)
    }

    /// A subgraph's nodes and outputs (its formal inputs are the caller's to bind).
    fn subgraph(&mut self, g: &onnx_protobuf::GraphProto, _site: &Site) -> Option<Branch> {
        let mut nodes = Vec::with_capacity(g.initializer.len() + g.node.len());
        let mut complete = true;
        for t in &g.initializer {
            match tensor::decode(&mut t.clone(), self.files) {
                Ok(data) => nodes.push(BranchNode {
                    op: Op::Constant {
                        tensor: Arc::new(data),
                        initializer: true,
                    },
                    provenance: Provenance {
                        name: t.name.clone(),
                        op_type: "initializer".into(),
                        module: String::new(),
                    },
                    inputs: Vec::new(),
                    outputs: vec![t.name.clone()],
                }),
                Err(kind) => {
                    complete = false;
                    self.problems.push(Diagnostic {
                        site: Site {
                            name: t.name.clone(),
                            op_type: "initializer".into(),
                        },
                        kind,
                    });
                }
            }
        }
        for (index, node) in g.node.iter().enumerate() {
            let name = node_name(node, index);
            let inner = Site {
                name: name.clone(),
                op_type: node.op_type.clone(),
            };
            match self.op(node, inner) {
                Some((op, inputs)) => nodes.push(BranchNode {
                    op,
                    provenance: Provenance {
                        module: scope::module_path(node, &name),
                        name,
                        op_type: node.op_type.clone(),
                    },
                    inputs,
                    outputs: node.output.clone(),
                }),
                None => complete = false,
            }
        }
        complete.then(|| Branch {
            nodes,
            outputs: g.output.iter().map(|o| o.name.clone()).collect(),
        })
    }
}

/// A graph input whose declared type ralpc cannot use, and why.
fn input_type(reason: String) -> Problem {
    Problem::InputType { reason }
}

/// The tensor type a `ValueInfoProto` declares. For graph inputs (`input == true`) the
/// type is required and dynamic dimensions (unnamed, `?` or -1) get a symbol; elsewhere
/// such a dimension leaves the shape unknown.
fn declared_type(vi: &ValueInfoProto, input: bool) -> Result<TensorType, Problem> {
    let Some(TypeValue::TensorType(tt)) = vi.type_.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(input_type(
            "has no tensor type (only tensor inputs are supported)".into(),
        ));
    };
    let dtype = DType::from_onnx(tt.elem_type).ok_or_else(|| {
        input_type(format!(
            "has unsupported element type code {}",
            tt.elem_type
        ))
    })?;
    let Some(shape) = tt.shape.as_ref() else {
        return Ok(TensorType { dtype, shape: None });
    };
    let mut dims = Vec::with_capacity(shape.dim.len());
    for (axis, d) in shape.dim.iter().enumerate() {
        let dim = match &d.value {
            // PaddlePaddle and TensorFlow exports write -1 for a dynamic dimension of a
            // graph input, which onnxruntime accepts: a symbol, as unnamed. 0 stays a size:
            // zero-sized inputs are valid ONNX (the backend tests have them).
            Some(DimValue::DimValue(v)) if *v >= 0 => Dim::known(*v),
            Some(DimValue::DimValue(v)) if *v < -1 => {
                return Err(input_type(format!("dimension {axis} is negative ({v})")))
            }
            // "?" (PaddlePaddle) names no dimension: two of them need not be equal.
            Some(DimValue::DimParam(p)) if !p.is_empty() && p != "?" => Dim::sym(p),
            _ if input => Dim::sym(&format!("{}_dim{axis}", vi.name)),
            _ => return Ok(TensorType { dtype, shape: None }),
        };
        dims.push(dim);
    }
    Ok(TensorType {
        dtype,
        shape: Some(Shape(dims)),
    })
}
