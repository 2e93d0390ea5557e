//! Elementwise operators: one-tensor functions, Clip, two-tensor functions (arithmetic,
//! comparisons, logic, PRelu). The defaults are the ONNX spec's.

use super::{invalid, Converting};
use crate::error::Problem;
use crate::op::*;

/// The op of `c`'s node if it is one of this family's.
pub(super) fn convert(c: &Converting<'_>) -> Result<Option<Op>, Problem> {
    let a = &c.attrs;
    Ok(Some(match c.node.op_type.as_str() {
        "Relu" => Op::Unary(Unary::Relu),
        "LeakyRelu" => Op::Unary(Unary::LeakyRelu {
            alpha: a.float("alpha")?.unwrap_or(0.01),
        }),
        "Sigmoid" => Op::Unary(Unary::Sigmoid),
        "HardSigmoid" => Op::Unary(Unary::HardSigmoid {
            alpha: a.float("alpha")?.unwrap_or(0.2),
            beta: a.float("beta")?.unwrap_or(0.5),
        }),
        "HardSwish" => Op::Unary(Unary::HardSwish),
        "Tanh" => Op::Unary(Unary::Tanh),
        "Gelu" => {
            let approx = a.string("approximate")?.unwrap_or_else(|| "none".into());
            let tanh = match approx.as_str() {
                "none" => false,
                "tanh" => true,
                other => return Err(invalid("approximate", format!("unknown value '{other}'"))),
            };
            Op::Unary(Unary::Gelu { tanh })
        }
        "Erf" => Op::Unary(Unary::Erf),
        "Sqrt" => Op::Unary(Unary::Sqrt),
        "Neg" => Op::Unary(Unary::Neg),
        "Exp" => Op::Unary(Unary::Exp),
        "Reciprocal" => Op::Unary(Unary::Reciprocal),
        "Log" => Op::Unary(Unary::Log),
        "Abs" => Op::Unary(Unary::Abs),
        "Softplus" => Op::Unary(Unary::Softplus),
        "Softsign" => Op::Unary(Unary::Softsign),
        "Elu" => Op::Unary(Unary::Elu {
            alpha: a.float("alpha")?.unwrap_or(1.0),
        }),
        "Selu" => Op::Unary(Unary::Selu {
            alpha: a.float("alpha")?.unwrap_or(1.673_263_2),
            gamma: a.float("gamma")?.unwrap_or(1.050_701),
        }),
        "Sin" => Op::Unary(Unary::Sin),
        "Cos" => Op::Unary(Unary::Cos),
        "Tan" => Op::Unary(Unary::Tan),
        "Asin" => Op::Unary(Unary::Asin),
        "Acos" => Op::Unary(Unary::Acos),
        "Atan" => Op::Unary(Unary::Atan),
        "Sinh" => Op::Unary(Unary::Sinh),
        "Cosh" => Op::Unary(Unary::Cosh),
        "Asinh" => Op::Unary(Unary::Asinh),
        "Acosh" => Op::Unary(Unary::Acosh),
        "Atanh" => Op::Unary(Unary::Atanh),
        "Mish" => Op::Unary(Unary::Mish),
        "Celu" => Op::Unary(Unary::Celu {
            alpha: a.float("alpha")?.unwrap_or(1.0),
        }),
        "ThresholdedRelu" => Op::Unary(Unary::ThresholdedRelu {
            alpha: a.float("alpha")?.unwrap_or(1.0),
        }),
        "Shrink" => Op::Unary(Unary::Shrink {
            bias: a.float("bias")?.unwrap_or(0.0),
            lambd: a.float("lambd")?.unwrap_or(0.5),
        }),
        "PRelu" => Op::Binary(Binary::PRelu),
        "Floor" => Op::Unary(Unary::Floor),
        "Ceil" => Op::Unary(Unary::Ceil),
        "Round" => Op::Unary(Unary::Round),
        "Sign" => Op::Unary(Unary::Sign),
        "Not" => Op::Unary(Unary::Not),
        "IsNaN" => Op::Unary(Unary::IsNaN),
        "IsInf" => Op::Unary(Unary::IsInf {
            negative: a.int("detect_negative")?.unwrap_or(1) != 0,
            positive: a.int("detect_positive")?.unwrap_or(1) != 0,
        }),
        "Clip" => Op::Clip {
            min: a.float("min")?,
            max: a.float("max")?,
        },
        "Add" => Op::Binary(Binary::Add),
        "Sub" => Op::Binary(Binary::Sub),
        "Mul" => Op::Binary(Binary::Mul),
        "Div" => Op::Binary(Binary::Div),
        "Pow" => Op::Binary(Binary::Pow),
        "Mod" => Op::Binary(match a.int("fmod")?.unwrap_or(0) {
            0 => Binary::Mod,
            _ => Binary::Fmod,
        }),
        "Equal" => Op::Binary(Binary::Equal),
        "Less" => Op::Binary(Binary::Less),
        "LessOrEqual" => Op::Binary(Binary::LessOrEqual),
        "Greater" => Op::Binary(Binary::Greater),
        "GreaterOrEqual" => Op::Binary(Binary::GreaterOrEqual),
        "And" => Op::Binary(Binary::And),
        "Or" => Op::Binary(Binary::Or),
        "Xor" => Op::Binary(Binary::Xor),
        _ => return Ok(None),
    }))
}
