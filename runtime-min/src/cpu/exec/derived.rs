//! Values computed from constants alone that no layer computes and shape inference could
//! not hold (a detector's anchor grid: feature-map sizes turned into float coordinates,
//! larger than what inference folds). Every rank evaluates them where a layer reads them,
//! from the constants and the folded shapes, at the samples it runs.

use std::collections::BTreeMap;

use ralpc_ir::{GraphInfo, Op, ValueId};

use super::super::graph::ExecError;
use super::super::ops;
use super::super::tensor::Tensor;
use super::failure::bug;
use super::{folded, Executable, Prepared, RankError, Refusal};

/// Deeper chains are not derived (the layer build keeps such values in layers).
const MAX_DEPTH: usize = 256;

/// Whether `v` follows from constants and folded values alone: no graph input and no
/// trainable weight (whose gradient would be lost) behind it.
pub(super) fn derivable(exe: &Executable<'_>, v: ValueId) -> bool {
    derivable_in(exe, v, &mut BTreeMap::new(), 0)
}

fn derivable_in(
    exe: &Executable<'_>,
    v: ValueId,
    memo: &mut BTreeMap<ValueId, bool>,
    depth: usize,
) -> bool {
    if let Some(&known) = memo.get(&v) {
        return known;
    }
    let g = exe.graph;
    let node = g.node(g.value(v).producer);
    let trainable = exe.weights.trainable.contains(&v);
    let ok = if exe.info.ty(v).content.is_some() {
        true
    } else {
        match node.op {
            Op::Input => false,
            Op::Constant { .. } => !trainable,
            _ => {
                depth < MAX_DEPTH
                    && !trainable
                    && node
                        .inputs
                        .iter()
                        .flatten()
                        .all(|&i| derivable_in(exe, i, memo, depth + 1))
            }
        }
    };
    memo.insert(v, ok);
    ok
}

impl Prepared<'_> {
    /// `v` evaluated at `batch` samples.
    pub(super) fn derive(&self, v: ValueId, batch: u64) -> Result<Tensor, RankError> {
        let info = self.info_at(batch).map_err(Refusal::bug)?;
        self.derive_in(&info, v, &mut BTreeMap::new())
    }

    fn derive_in(
        &self,
        info: &GraphInfo,
        v: ValueId,
        memo: &mut BTreeMap<ValueId, Tensor>,
    ) -> Result<Tensor, RankError> {
        if let Some(t) = memo.get(&v) {
            return Ok(t.clone());
        }
        let g = self.exe.graph;
        let name = || g.value(v).name.clone();
        let t = match folded(info, v) {
            Some(t) => t,
            None => {
                let producer = g.value(v).producer;
                let node = g.node(producer);
                if let Op::Constant { .. } = node.op {
                    self.exe
                        .weights
                        .tensors
                        .get(&v)
                        .cloned()
                        .ok_or_else(|| bug(format!("constant '{}' is missing", name())))?
                } else {
                    let inputs = node
                        .inputs
                        .iter()
                        .map(|i| i.map(|i| self.derive_in(info, i, memo)).transpose())
                        .collect::<Result<Vec<_>, _>>()?;
                    let refs: Vec<Option<&Tensor>> = inputs.iter().map(Option::as_ref).collect();
                    // The model's values, as in a layer: its node is named.
                    let (outs, _) = ops::forward(&node.op, &refs, node.outputs.len(), self.env)
                        .map_err(|e| {
                            RankError::Node(ExecError::Node {
                                site: g.site(producer),
                                message: format!("computing '{}' from constants: {e}", name()),
                            })
                        })?;
                    for (&o, t) in node.outputs.iter().zip(&outs) {
                        memo.insert(o, t.clone());
                    }
                    outs.into_iter()
                        .nth(g.value(v).slot as usize)
                        .ok_or_else(|| bug(format!("'{}' was not computed", name())))?
                }
            }
        };
        memo.insert(v, t.clone());
        Ok(t)
    }
}
