//! Shape rules of control flow still in the graph after binding: an `If` whose condition,
//! or a `Loop` whose trip count, depends on run-time values (binding inlines and unrolls
//! every other one, [`crate::bind`]).

use super::{Ctx, Result};
use crate::infer::{InferError, ValueType};

/// An `If` left in place: its condition is not known at compile time.
pub(super) fn unresolved_if(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let cond = ctx.input(0)?;
    match cond.content.as_deref() {
        Some([c]) if c.as_f64().is_some() => Err(InferError::Type {
            reason: "an If is inlined when the graph's inputs are bound: bind first".into(),
        }),
        _ => {
            let detail = (ctx.constant_detail)(0);
            Err(InferError::NotConstant {
                slot: 0,
                detail: if detail.is_empty() {
                    "; only the branch it takes is compiled, and it depends on sizes \
                     not bound yet (give them with --batch or --input)"
                        .into()
                } else {
                    format!("{detail}; only the branch it takes is compiled")
                },
            })
        }
    }
}

/// A `Loop` left in place: its trip count or condition is not known at compile time.
pub(super) fn unresolved_loop(ctx: &Ctx<'_>) -> Result<Vec<ValueType>> {
    let decided = |slot: usize| {
        ctx.opt(slot)
            .is_none_or(|t| matches!(t.content.as_deref(), Some([c]) if c.as_f64().is_some()))
    };
    match (decided(0), decided(1)) {
        (true, true) => Err(InferError::Type {
            reason: "a Loop is unrolled when the graph's inputs are bound: bind first".into(),
        }),
        (m, _) => {
            let slot = if m { 1 } else { 0 };
            let detail = (ctx.constant_detail)(slot);
            Err(InferError::NotConstant {
                slot,
                detail: format!(
                    "{detail}; a Loop is unrolled, so its trip count and condition \
                     must follow from sizes (give them with --batch or --input)"
                ),
            })
        }
    }
}
