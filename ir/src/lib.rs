//! ralpc's intermediate representation.
//!
//! A model is a [`Graph`] of [`Node`]s, each applying one [`Op`] (a closed enum with
//! typed attributes) to input [`Value`]s and producing output values. Every tensor, graph
//! inputs and weights included, is produced by exactly one node at one output slot, so a
//! value is identified by `(node, slot)` and held by a [`ValueId`].
//!
//! The life of a model in this crate:
//! 1. [`onnx::import`] decodes an ONNX file into a well-formed graph (all names defined,
//!    unique), collecting every problem at once; weights stored as external data are
//!    validated but never read.
//! 2. [`bind`] fixes input dimensions (`--batch`, `--input`); a fixed-batch export is
//!    re-batched.
//! 3. [`verify`] checks the graph is a DAG and infers every value's type and shape, folding
//!    the exporters' shape arithmetic; it returns a [`GraphInfo`], which later phases require,
//!    so unverified IR cannot reach them.
//! 4. [`account`] counts parameters, MACs, FLOPs and bytes per layer.
//!
//! Invariants after `verify`: the graph is acyclic; every value has a dtype and a shape
//! whose dimensions are known or symbolic monomials ([`Dim`]); every node's outputs agree
//! with the ONNX semantics of its op.
//!
//! ```
//! use ralpc_ir::{account, bind, onnx, verify, Bindings};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/onnx/vgg16/model.onnx");
//! let mut model = onnx::import(&path)?;
//! bind(&mut model.graph, &Bindings { batch: Some(1), ..Bindings::default() })?;
//! let info = verify(&model.graph)?;
//! let totals = account(&model.graph, &info)?;
//! assert_eq!(totals.params, 138_357_544); // torchvision's published count
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(
        clippy::print_stdout,
        clippy::print_stderr,
        clippy::dbg_macro,
        clippy::todo
    )
)]

pub mod bind;
mod branches;
mod count;
mod dtype;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod graph;
mod ids;
mod infer;
pub mod input;
pub mod models;
pub mod onnx;
mod op;
mod shape;
mod tensor;
pub mod text;
mod verify;

pub use bind::{bind, bind_values, BindError, Bindings};
pub use count::{account, is_parameter, AccountError, Accounting, LayerStats};
pub use dtype::DType;
pub use error::{Diagnostic, ImportError, Problem};
pub use graph::{Graph, Node, Provenance, Rebatch, Site, TensorType, Value};
pub use ids::{NodeId, ValueId};
pub use infer::{InferError, Scalar, ValueType};
pub use op::*;
pub use shape::{Dim, Shape};
pub use tensor::{ExternalData, Storage, TensorData, TensorReadError};
pub use verify::{verify, GraphInfo, VerifyError, VerifyErrorKind, VerifyErrors};
