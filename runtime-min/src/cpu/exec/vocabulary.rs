//! Megatron-LM's vocabulary-parallel embedding on the executor: an attribute degree on an
//! embedding layer cuts its largest table's rows (the vocabulary). Each piece holds its
//! rows and one appended zero row, which every id outside the piece looks up; the pieces'
//! lookups are then summed like a row-parallel layer's partial outputs, and what the zero
//! row gathers in the backward is dropped.

use ralpc_codegen::layout::LayerKind;
use ralpc_ir::{Op, ValueId};

use super::super::region::interval;
use super::{LayerExec, Prepared};

impl Prepared<'_> {
    /// The rows of its table rank index `k` of vocabulary-parallel embedding `l` holds, when
    /// `v` is the ids it looks them up by.
    pub(super) fn vocabulary_rows(
        &self,
        l: &LayerExec,
        k: u32,
        v: ValueId,
    ) -> Option<std::ops::Range<usize>> {
        if l.kind != LayerKind::Embedding || l.split.attribute <= 1 {
            return None;
        }
        let (table, ids) = self.vocabulary_lookup(l)?;
        if ids != v && self.carrier(ids) != self.carrier(v) {
            return None;
        }
        let rows = self.rows(table)?;
        Some(interval(l.vocabulary_piece(k), rows))
    }

    /// The rows of weight `table`.
    fn rows(&self, table: ValueId) -> Option<usize> {
        self.exe.weights.tensors.get(&table)?.shape.first().copied()
    }

    /// The table a vocabulary-parallel embedding layer splits: the largest one its
    /// `Gather`s read, with the node that reads it.
    pub(super) fn vocabulary_table(&self, l: &LayerExec) -> Option<ValueId> {
        self.vocabulary_lookup(l).map(|(table, _)| table)
    }

    /// A vocabulary-parallel embedding's table and the ids its lookup reads.
    pub(super) fn vocabulary_lookup(&self, l: &LayerExec) -> Option<(ValueId, ValueId)> {
        let g = self.exe.graph;
        l.nodes
            .iter()
            .filter(|&&n| matches!(g.node(n).op, Op::Gather { .. }))
            .filter_map(|&n| {
                let inputs = &g.node(n).inputs;
                let table = self.carrier(inputs.first().copied().flatten()?);
                let ids = inputs.get(1).copied().flatten()?;
                let rows = self.rows(table)?;
                self.exe
                    .weights
                    .trainable
                    .contains(&table)
                    .then_some((rows, table, ids))
            })
            .max_by_key(|&(rows, table, _)| (rows, std::cmp::Reverse(table)))
            .map(|(_, table, ids)| (table, ids))
    }
}
