//! Errors of the import and verification phases.
//!
//! Problems in the model are collected, not stopped at: one run tells the user everything
//! they will have to fix. Each names its site (`node 'conv_3' (Conv)`) and, where it has
//! one, the attribute or tensor.

use std::fmt;
use std::path::PathBuf;

use crate::graph::Site;

/// Why a model could not be imported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read '{}'", path.display())]
    Read {
        /// The model path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not an ONNX `ModelProto`.
    #[error("'{}' is not a valid ONNX model (protobuf decoding failed)", path.display())]
    Decode {
        /// The model path.
        path: PathBuf,
        /// The decoder's error.
        #[source]
        source: protobuf::Error,
    },
    /// Another kind of file than an ONNX model.
    #[error(
        "'{}' is {what}, not an ONNX model: export the model to ONNX first (from PyTorch, \
         `torch.onnx.export(model, example_inputs, \"model.onnx\")`)",
        path.display()
    )]
    NotOnnx {
        /// The file.
        path: PathBuf,
        /// What it looks like.
        what: &'static str,
    },
    /// Protobuf groups nested deeper than the decoder can skip without overflowing.
    #[error("'{}' is not a valid ONNX model: protobuf groups nested over {limit} deep at byte {offset}", path.display())]
    TooDeep {
        /// The model path.
        path: PathBuf,
        /// Where the nesting passes the limit.
        offset: usize,
        /// The deepest nesting allowed.
        limit: u32,
    },
    /// No opset for the default domain in a model of IR version 3 or later.
    #[error(
        "'{}' declares no opset for the default ONNX domain, which every model of IR version 3 \
         or later does (this one: {ir_version}); is the file cut short?",
        path.display()
    )]
    NoOpset {
        /// The model path.
        path: PathBuf,
        /// Its IR version.
        ir_version: i64,
    },
    /// The model has no graph, or an empty one.
    #[error("'{}' contains no graph", path.display())]
    NoGraph {
        /// The model path.
        path: PathBuf,
    },
    /// Operators ralpc does not support (all of them).
    #[error("{} unsupported operator(s): {}", sites.len(), list(sites))]
    UnsupportedOps {
        /// Every node with an unsupported operator.
        sites: Vec<Site>,
    },
    /// Problems in the model's structure, attributes or tensors (all of them).
    #[error("{} problem(s) in the model:{}", problems.len(), lines(problems))]
    Invalid {
        /// Every problem found.
        problems: Vec<Diagnostic>,
    },
}

fn list(sites: &[Site]) -> String {
    sites
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn lines(problems: &[Diagnostic]) -> String {
    problems.iter().map(|p| format!("\n  {p}")).collect()
}

/// One problem, at one site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Where.
    pub site: Site,
    /// What.
    pub kind: Problem,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.site, self.kind)
    }
}

/// What is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// An attribute has the wrong type.
    #[error("attribute '{attr}': expected {expected}, got {got}")]
    AttributeType {
        /// Attribute name.
        attr: String,
        /// Expected type.
        expected: &'static str,
        /// Found type.
        got: String,
    },
    /// A required attribute is missing.
    #[error("attribute '{attr}' is required")]
    AttributeMissing {
        /// Attribute name.
        attr: String,
    },
    /// An attribute has a value out of its domain.
    #[error("attribute '{attr}': {reason}")]
    AttributeValue {
        /// Attribute name.
        attr: String,
        /// Why.
        reason: String,
    },
    /// An input names a value nothing defines.
    #[error("input {slot} reads '{name}', which no node, input or initializer defines")]
    UndefinedValue {
        /// Input slot.
        slot: usize,
        /// The name.
        name: String,
    },
    /// A graph output names a value nothing defines.
    #[error("graph output '{name}' is not defined by any node, input or initializer")]
    UndefinedOutput {
        /// The name.
        name: String,
    },
    /// Two definitions of one name.
    #[error("output '{name}' is already defined by {first}")]
    DuplicateName {
        /// The name.
        name: String,
        /// The first definition.
        first: Site,
    },
    /// The node is on a dependency cycle.
    #[error("is on a cycle: the graph is not a DAG")]
    Cycle,
    /// A constant tensor is malformed.
    #[error("tensor '{tensor}': {reason}")]
    Tensor {
        /// Tensor name.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// A tensor's external data reference is unsafe or inconsistent.
    #[error("tensor '{tensor}': external data location '{location}': {reason}")]
    ExternalData {
        /// Tensor name.
        tensor: String,
        /// The `location` as written.
        location: String,
        /// Why.
        reason: String,
    },
    /// A graph input has no usable tensor type.
    #[error("{reason}")]
    InputType {
        /// Why.
        reason: String,
    },
}
