//! The shape rule of recurrent layers (ONNX RNN, GRU, LSTM).

use super::{mismatch, need_float, Ctx, Result};
use crate::infer::{InferError, ValueType};
use crate::op::{Cell, Recurrent};
use crate::shape::{Dim, Shape};

/// RNN, GRU, LSTM: `Y` is `[seq, dirs, batch, hidden]` (`[batch, seq, dirs, hidden]`
/// batch-major), `Y_h` and `Y_c` `[dirs, batch, hidden]` (`[batch, dirs, hidden]`).
pub(super) fn recurrent(ctx: &Ctx<'_>, r: &Recurrent) -> Result<Vec<ValueType>> {
    let (x, w, rec) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    need_float(x, 0)?;
    for (slot, t) in [(0, x), (1, w), (2, rec)] {
        if t.shape.rank() != 3 {
            return Err(InferError::Rank {
                slot,
                expected: "rank 3".into(),
                got: t.shape.clone(),
            });
        }
    }
    let (seq, batch) = if r.batch_major {
        (&x.shape.0[1], &x.shape.0[0])
    } else {
        (&x.shape.0[0], &x.shape.0[1])
    };
    let input = &x.shape.0[2];
    let (dirs, hidden) = (
        Dim::known(r.direction.count() as i64),
        Dim::known(i64::try_from(r.hidden).unwrap_or(i64::MAX)),
    );
    // Sizes from attributes: a huge hidden size must be an error, not an overflow.
    let width = i64::try_from(r.cell.gates().saturating_mul(r.hidden)).unwrap_or(i64::MAX);
    let gates = Dim::known(width);
    let expect =
        |slot: usize, t: &ValueType, want: [&Dim; 3]| -> Result<()> {
            let clash =
                t.shape.0.iter().zip(want).any(
                    |(a, b)| matches!((a.as_known(), b.as_known()), (Some(a), Some(b)) if a != b),
                );
            if clash {
                let want: Vec<String> = want.iter().map(ToString::to_string).collect();
                return Err(mismatch(format!(
                    "input {slot} has shape {} where [{}] is needed",
                    t.shape,
                    want.join(",")
                )));
            }
            Ok(())
        };
    expect(1, w, [&dirs, &gates, input])?;
    expect(2, rec, [&dirs, &gates, &hidden])?;
    if let Some(b) = ctx.opt(3) {
        let double = Dim::known(width.saturating_mul(2));
        let clash = b.shape.rank() != 2
            || b.shape.0[0].as_known() != Some(r.direction.count() as i64)
            || b.shape.0[1]
                .as_known()
                .is_some_and(|d| Some(d) != double.as_known());
        if clash {
            return Err(mismatch(format!(
                "B has shape {} where [{dirs},{double}] is needed",
                b.shape
            )));
        }
    }
    let state_dims = if r.batch_major {
        [batch, &dirs, &hidden]
    } else {
        [&dirs, batch, &hidden]
    };
    let states: &[usize] = if r.cell == Cell::Lstm { &[5, 6] } else { &[5] };
    for &slot in states {
        if let Some(t) = ctx.opt(slot) {
            expect(slot, t, state_dims)?;
        }
    }
    let y = if r.batch_major {
        vec![batch.clone(), seq.clone(), dirs.clone(), hidden.clone()]
    } else {
        vec![seq.clone(), dirs.clone(), batch.clone(), hidden.clone()]
    };
    let state = if r.batch_major {
        vec![batch.clone(), dirs.clone(), hidden.clone()]
    } else {
        vec![dirs.clone(), batch.clone(), hidden.clone()]
    };
    let mut outs = vec![ValueType::new(x.dtype, Shape(y))];
    while outs.len() < ctx.outputs {
        outs.push(ValueType::new(x.dtype, Shape(state.clone())));
    }
    Ok(outs)
}
