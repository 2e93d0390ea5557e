//! The graph: nodes (operator applications) and values (their outputs).
//!
//! Every tensor is a [`Value`] produced by exactly one node at one output slot — graph
//! inputs by [`Op::Input`] nodes and weights by [`Op::Constant`] nodes — so multi-output ops
//! need no special case and every value has a producer. Node order is insertion order; a
//! topological order is computed on demand (`petgraph`, kept private here). The ONNX names
//! of nodes live in a side table ([`Provenance`]) that every diagnostic reads.

use petgraph::stable_graph::{NodeIndex, StableDiGraph};

use crate::dtype::DType;
use crate::ids::{NodeId, ValueId};
use crate::op::Op;
use crate::shape::Shape;

/// An operator application.
#[derive(Clone, Debug)]
pub struct Node {
    /// The operator.
    pub op: Op,
    /// Inputs by slot; `None` for an omitted optional input (ONNX's empty name).
    pub inputs: Vec<Option<ValueId>>,
    /// Outputs by slot.
    pub outputs: Vec<ValueId>,
}

/// A tensor-valued output of a node.
#[derive(Clone, Debug)]
pub struct Value {
    /// The ONNX name.
    pub name: String,
    /// The producing node.
    pub producer: NodeId,
    /// The output slot of the producer.
    pub slot: u32,
    /// The type the model declares for it (inputs, outputs, `value_info`), if any.
    pub declared: Option<TensorType>,
}

/// A tensor type: element type and, when known, shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Shape, when declared or inferred.
    pub shape: Option<Shape>,
}

/// Where a node came from in the ONNX file; feeds every diagnostic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provenance {
    /// The node's ONNX name, or its first output's name when the node has none.
    pub name: String,
    /// The ONNX `op_type` (`Conv`), or `input`/`initializer` for sources.
    pub op_type: String,
    /// The PyTorch module it came from (`features.0`), as the exporter recorded it; empty
    /// when the file does not say (or the node belongs to the root module).
    pub module: String,
}

/// A node named for a message: `node 'conv1' (Conv)`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Site {
    /// Node (or input, or tensor) name.
    pub name: String,
    /// Its op type.
    pub op_type: String,
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.op_type.as_str() {
            "input" => write!(f, "input '{}'", self.name),
            "initializer" => write!(f, "initializer '{}'", self.name),
            op => write!(f, "node '{}' ({op})", self.name),
        }
    }
}

/// How a fixed-batch model is re-batched: the batch size it was exported with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rebatch {
    /// The batch size baked into the exported graph.
    pub exported: i64,
    /// The batch dimension that replaces it (a size, or a symbol while unbound).
    pub batch: crate::shape::Dim,
}

/// A computation graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    nodes: StableDiGraph<Node, u32>,
    provenance: Vec<Provenance>,
    values: Vec<Value>,
    outputs: Vec<ValueId>,
    /// Set when a fixed-batch model's batch dimension has been made symbolic.
    pub(crate) rebatch: Option<Rebatch>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds a node whose outputs are named `outputs`; inputs are set with
    /// [`Graph::set_inputs`] (so that files can name values before defining them).
    pub fn add_node(&mut self, op: Op, provenance: Provenance, outputs: &[&str]) -> NodeId {
        let index = self.nodes.add_node(Node {
            op,
            inputs: Vec::new(),
            outputs: Vec::new(),
        });
        let id = NodeId(index.index() as u32);
        debug_assert_eq!(
            self.provenance.len(),
            id.index(),
            "invariant: nodes are only appended"
        );
        self.provenance.push(provenance);
        let outs: Vec<ValueId> = outputs
            .iter()
            .enumerate()
            .map(|(slot, name)| {
                let v = ValueId(self.values.len() as u32);
                self.values.push(Value {
                    name: (*name).to_owned(),
                    producer: id,
                    slot: slot as u32,
                    declared: None,
                });
                v
            })
            .collect();
        self.node_mut(id).outputs = outs;
        id
    }

    /// Sets a node's inputs (replacing any) and the dependence edges behind them.
    pub fn set_inputs(&mut self, node: NodeId, inputs: Vec<Option<ValueId>>) {
        let target = NodeIndex::new(node.index());
        let old: Vec<_> = self
            .nodes
            .edges_directed(target, petgraph::Direction::Incoming)
            .map(|e| petgraph::visit::EdgeRef::id(&e))
            .collect();
        for e in old {
            self.nodes.remove_edge(e);
        }
        for (slot, v) in inputs.iter().enumerate() {
            if let Some(v) = v {
                let from = NodeIndex::new(self.values[v.index()].producer.index());
                self.nodes.add_edge(from, target, slot as u32);
            }
        }
        self.node_mut(node).inputs = inputs;
    }

    /// Declares the graph's outputs.
    pub fn set_outputs(&mut self, outputs: Vec<ValueId>) {
        self.outputs = outputs;
    }

    /// The graph's outputs.
    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    /// A node.
    ///
    /// # Panics
    /// If `id` was not issued by this graph.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[NodeIndex::new(id.index())]
    }

    /// A node, mutably.
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[NodeIndex::new(id.index())]
    }

    /// A value.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.index()]
    }

    /// A value, mutably.
    pub fn value_mut(&mut self, id: ValueId) -> &mut Value {
        &mut self.values[id.index()]
    }

    /// Where a node came from.
    pub fn provenance(&self, id: NodeId) -> &Provenance {
        &self.provenance[id.index()]
    }

    /// Where a node came from, mutably (a pass that replaces a node says what it is now).
    pub fn provenance_mut(&mut self, id: NodeId) -> &mut Provenance {
        &mut self.provenance[id.index()]
    }

    /// The node as a diagnostic site.
    pub fn site(&self, id: NodeId) -> Site {
        let p = self.provenance(id);
        Site {
            name: p.name.clone(),
            op_type: p.op_type.clone(),
        }
    }

    /// All nodes in insertion (file) order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.node_indices().map(|i| NodeId(i.index() as u32))
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.node_count()
    }

    /// Number of values.
    pub fn value_count(&self) -> usize {
        self.values.len()
    }

    /// All values in creation order.
    pub fn value_ids(&self) -> impl Iterator<Item = ValueId> {
        (0..self.values.len() as u32).map(ValueId)
    }

    /// The graph inputs (the outputs of [`Op::Input`] nodes), in file order.
    pub fn inputs(&self) -> Vec<ValueId> {
        self.node_ids()
            .filter(|&n| matches!(self.node(n).op, Op::Input))
            .flat_map(|n| self.node(n).outputs.clone())
            .collect()
    }

    /// Nodes in a topological order, ties broken by file order (deterministic).
    ///
    /// # Errors
    /// With a node on a cycle when the graph has one.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, NodeId> {
        // Kahn's algorithm over a min-heap of indices, so the order is the file order
        // wherever the file is already topologically sorted.
        let bound = petgraph::visit::NodeIndexable::node_bound(&self.nodes);
        let mut indegree = vec![0u32; bound];
        for e in self.nodes.edge_indices() {
            if let Some((_, to)) = self.nodes.edge_endpoints(e) {
                indegree[to.index()] += 1;
            }
        }
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = self
            .nodes
            .node_indices()
            .filter(|i| indegree[i.index()] == 0)
            .map(|i| std::cmp::Reverse(i.index()))
            .collect();
        let mut order = Vec::with_capacity(self.nodes.node_count());
        while let Some(std::cmp::Reverse(i)) = ready.pop() {
            order.push(NodeId(i as u32));
            for next in self
                .nodes
                .neighbors_directed(NodeIndex::new(i), petgraph::Direction::Outgoing)
            {
                let d = &mut indegree[next.index()];
                *d -= 1;
                if *d == 0 {
                    ready.push(std::cmp::Reverse(next.index()));
                }
            }
        }
        if order.len() == self.nodes.node_count() {
            Ok(order)
        } else {
            let stuck = self
                .nodes
                .node_indices()
                .find(|i| indegree[i.index()] > 0)
                .map(|i| NodeId(i.index() as u32))
                .unwrap_or(NodeId(0));
            Err(stuck)
        }
    }

    /// The nodes that read `value`, with the input slot, in file order.
    pub fn consumers(&self, value: ValueId) -> Vec<(NodeId, usize)> {
        let producer = NodeIndex::new(self.values[value.index()].producer.index());
        let mut out: Vec<(NodeId, usize)> = self
            .nodes
            .neighbors_directed(producer, petgraph::Direction::Outgoing)
            .map(|n| NodeId(n.index() as u32))
            .flat_map(|n| {
                self.node(n)
                    .inputs
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| **v == Some(value))
                    .map(move |(slot, _)| (n, slot))
                    .collect::<Vec<_>>()
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The batch the model was exported with, when it has been made symbolic.
    pub fn rebatch(&self) -> Option<&Rebatch> {
        self.rebatch.as_ref()
    }
}
