//! From ONNX `op_type` and attributes to [`Op`].
//!
//! One arm per supported operator; the defaults are the ONNX spec's
//! (<https://onnx.ai/onnx/operators/>). Opset differences that move an attribute to an
//! input are absorbed by `Option` attributes (see [`crate::op`]).

use std::sync::Arc;

use onnx_protobuf::NodeProto;

use super::attrs::Attrs;
use super::tensor::{self, ExternalFiles};
use crate::dtype::DType;
use crate::error::Problem;
use crate::op::*;
use crate::tensor::{Storage, TensorData};

/// The result of converting one node.
pub(crate) enum Converted {
    /// A supported op.
    Op(Op),
    /// `op_type` is not supported.
    Unsupported,
}

fn invalid(attr: &str, reason: impl Into<String>) -> Problem {
    Problem::AttributeValue {
        attr: attr.to_owned(),
        reason: reason.into(),
    }
}

fn padding(a: &Attrs<'_>) -> Result<Padding, Problem> {
    let auto = a.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    Ok(match auto.as_str() {
        "NOTSET" | "" => Padding::Explicit(a.sizes("pads", 0)?.unwrap_or_default()),
        "SAME_UPPER" => Padding::SameUpper,
        "SAME_LOWER" => Padding::SameLower,
        "VALID" => Padding::Valid,
        other => return Err(invalid("auto_pad", format!("unknown mode '{other}'"))),
    })
}

fn conv(a: &Attrs<'_>) -> Result<Conv, Problem> {
    let group = a.int("group")?.unwrap_or(1);
    if group < 1 {
        return Err(invalid("group", format!("must be >= 1, got {group}")));
    }
    Ok(Conv {
        kernel: a.sizes("kernel_shape", 1)?,
        strides: a.sizes("strides", 1)?,
        dilations: a.sizes("dilations", 1)?,
        padding: padding(a)?,
        group: group as u64,
    })
}

fn pool(a: &Attrs<'_>, kind: PoolKind) -> Result<Pool, Problem> {
    let kernel = a
        .sizes("kernel_shape", 1)?
        .ok_or_else(|| Problem::AttributeMissing {
            attr: "kernel_shape".into(),
        })?;
    Ok(Pool {
        kind,
        kernel,
        strides: a.sizes("strides", 1)?,
        dilations: a.sizes("dilations", 1)?,
        padding: padding(a)?,
        ceil_mode: a.flag("ceil_mode", false)?,
        count_include_pad: a.flag("count_include_pad", false)?,
    })
}

/// RNN, GRU and LSTM with their default activations; what else the spec allows (other
/// activations, clipping, coupled input-forget gates, peepholes) is refused by name.
fn recurrent(a: &Attrs<'_>, op_type: &str, node: &NodeProto) -> Result<Recurrent, Problem> {
    let cell = match op_type {
        "RNN" => Cell::Rnn,
        "GRU" => Cell::Gru {
            linear_before_reset: a.flag("linear_before_reset", false)?,
        },
        _ => Cell::Lstm,
    };
    let hidden = match a.int("hidden_size")? {
        Some(h) if h > 0 => h as u64,
        Some(h) => {
            return Err(invalid(
                "hidden_size",
                format!("{h} is not a positive size"),
            ))
        }
        None => return Err(invalid("hidden_size", "required")),
    };
    let direction = match a.string("direction")?.as_deref().unwrap_or("forward") {
        "forward" => Direction::Forward,
        "reverse" => Direction::Reverse,
        "bidirectional" => Direction::Bidirectional,
        other => return Err(invalid("direction", format!("unknown direction '{other}'"))),
    };
    if let Some(acts) = a.strings("activations")? {
        let defaults: &[&str] = match cell {
            Cell::Rnn => &["Tanh"],
            Cell::Gru { .. } => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        };
        let per_direction = acts.len() / direction.count() as usize;
        let default = acts.len() == defaults.len() * direction.count() as usize
            && acts
                .iter()
                .enumerate()
                .all(|(i, act)| act.eq_ignore_ascii_case(defaults[i % per_direction.max(1)]));
        if !default {
            return Err(invalid(
                "activations",
                format!("{acts:?}: only the defaults {defaults:?} are supported"),
            ));
        }
    }
    if a.float("clip")?.is_some() {
        return Err(invalid("clip", "clipped cells are not supported"));
    }
    if a.flag("input_forget", false)? {
        return Err(invalid(
            "input_forget",
            "coupled input-forget gates are not supported",
        ));
    }
    // An LSTM's 8th input is the peephole weights.
    if cell == Cell::Lstm && node.input.get(7).is_some_and(|p| !p.is_empty()) {
        return Err(invalid("P", "peephole connections are not supported"));
    }
    Ok(Recurrent {
        cell,
        hidden,
        direction,
        batch_major: a.flag("layout", false)?,
    })
}

fn resize(a: &Attrs<'_>, upsample: bool, opset: i64) -> Result<Resize, Problem> {
    let mode = match a.string("mode")?.as_deref().unwrap_or("nearest") {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" | "trilinear" => ResizeMode::Linear,
        other => {
            return Err(invalid(
                "mode",
                format!("'{other}' is not supported (nearest and linear are)"),
            ))
        }
    };
    // Resize-10 and Upsample sample as `asymmetric` with `floor` rounding does.
    let legacy = upsample || opset < 11;
    let coordinates = match a.string("coordinate_transformation_mode")?.as_deref() {
        None if legacy => CoordinateMode::Asymmetric,
        None | Some("half_pixel") => CoordinateMode::HalfPixel,
        Some("half_pixel_symmetric") => CoordinateMode::HalfPixelSymmetric,
        Some("pytorch_half_pixel") => CoordinateMode::PytorchHalfPixel,
        Some("align_corners") => CoordinateMode::AlignCorners,
        Some("asymmetric") => CoordinateMode::Asymmetric,
        Some(other) => {
            return Err(invalid(
                "coordinate_transformation_mode",
                format!("'{other}' is not supported"),
            ))
        }
    };
    let nearest = match a.string("nearest_mode")?.as_deref() {
        None if legacy => NearestMode::Floor,
        None | Some("round_prefer_floor") => NearestMode::RoundPreferFloor,
        Some("round_prefer_ceil") => NearestMode::RoundPreferCeil,
        Some("floor") => NearestMode::Floor,
        Some("ceil") => NearestMode::Ceil,
        Some(other) => return Err(invalid("nearest_mode", format!("unknown mode '{other}'"))),
    };
    if a.int("antialias")?.unwrap_or(0) != 0 {
        return Err(invalid(
            "antialias",
            "antialiased resizing is not supported",
        ));
    }
    match a.string("keep_aspect_ratio_policy")?.as_deref() {
        None | Some("stretch") => {}
        Some(other) => {
            return Err(invalid(
                "keep_aspect_ratio_policy",
                format!("'{other}' is not supported (stretch is)"),
            ))
        }
    }
    Ok(Resize {
        mode,
        coordinates,
        nearest,
        scales: a.floats("scales")?,
        slots: if legacy { (1, None) } else { (2, Some(3)) },
        axes: a.ints("axes")?,
    })
}

/// Converts one node. `opset` is the default domain's version.
pub(crate) fn convert(
    node: &NodeProto,
    opset: i64,
    files: &ExternalFiles<'_>,
) -> Result<Converted, Problem> {
    let a = Attrs::of(node);
    let op = match node.op_type.as_str() {
        "Conv" => Op::Conv(conv(&a)?),
        "ConvTranspose" => Op::ConvTranspose(ConvTranspose {
            conv: conv(&a)?,
            output_padding: a.sizes("output_padding", 0)?,
            output_shape: a.sizes("output_shape", 1)?,
        }),
        "Gemm" => Op::Gemm(Gemm {
            alpha: a.float("alpha")?.unwrap_or(1.0),
            beta: a.float("beta")?.unwrap_or(1.0),
            trans_a: a.flag("transA", false)?,
            trans_b: a.flag("transB", false)?,
        }),
        "MatMul" => Op::MatMul,
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
        "Sum" => Op::Variadic(Variadic::Sum),
        "Mean" => Op::Variadic(Variadic::Mean),
        "Max" => Op::Variadic(Variadic::Max),
        "Min" => Op::Variadic(Variadic::Min),
        "Softmax" | "LogSoftmax" => Op::Softmax {
            // The default axis moved from 1 to -1 in opset 13.
            axis: a.int("axis")?.unwrap_or(if opset >= 13 { -1 } else { 1 }),
            log: node.op_type == "LogSoftmax",
            flatten: opset < 13,
        },
        "MaxPool" => Op::Pool(pool(&a, PoolKind::Max)?),
        "AveragePool" => Op::Pool(pool(&a, PoolKind::Average)?),
        "GlobalAveragePool" => Op::GlobalPool(PoolKind::Average),
        "GlobalMaxPool" => Op::GlobalPool(PoolKind::Max),
        "BatchNormalization" => Op::BatchNorm {
            epsilon: a.float("epsilon")?.unwrap_or(1e-5),
            momentum: a.float("momentum")?.unwrap_or(0.9),
        },
        "LayerNormalization" => Op::LayerNorm {
            axis: a.int("axis")?.unwrap_or(-1),
            epsilon: a.float("epsilon")?.unwrap_or(1e-5),
        },
        "LRN" => {
            let size = a.int("size")?.ok_or_else(|| Problem::AttributeMissing {
                attr: "size".into(),
            })?;
            if size < 1 {
                return Err(invalid("size", format!("must be >= 1, got {size}")));
            }
            Op::Lrn {
                size: size as u64,
                alpha: a.float("alpha")?.unwrap_or(1e-4),
                beta: a.float("beta")?.unwrap_or(0.75),
                bias: a.float("bias")?.unwrap_or(1.0),
            }
        }
        "Concat" => Op::Concat {
            axis: a.int("axis")?.ok_or_else(|| Problem::AttributeMissing {
                attr: "axis".into(),
            })?,
        },
        "Split" => Op::Split {
            axis: a.int("axis")?.unwrap_or(0),
            sizes: a.ints("split")?,
        },
        "Slice" => Op::Slice {
            ranges: match (a.ints("starts")?, a.ints("ends")?) {
                (Some(starts), Some(ends)) => Some(SliceRanges {
                    starts,
                    ends,
                    axes: a.ints("axes")?,
                }),
                (None, None) => None,
                _ => {
                    return Err(invalid(
                        "starts",
                        "'starts' and 'ends' must be given together",
                    ))
                }
            },
        },
        "Flatten" => Op::Flatten {
            axis: a.int("axis")?.unwrap_or(1),
        },
        "Reshape" => Op::Reshape {
            allowzero: a.flag("allowzero", false)?,
        },
        "Transpose" => Op::Transpose {
            perm: a.ints("perm")?,
        },
        "Squeeze" => Op::Squeeze {
            axes: a.ints("axes")?,
        },
        "Unsqueeze" => Op::Unsqueeze {
            axes: a.ints("axes")?,
        },
        "Gather" => Op::Gather {
            axis: a.int("axis")?.unwrap_or(0),
        },
        "Shape" => Op::Shape {
            start: a.int("start")?.unwrap_or(0),
            end: a.int("end")?,
        },
        "ConstantOfShape" => {
            let (value, dtype) = match a.tensor("value")? {
                None => (0.0, DType::F32),
                Some(t) => {
                    let t = tensor::decode(&mut t.clone(), files)?;
                    let v = t.to_f64s().map_err(|e| invalid("value", e.to_string()))?;
                    match v.as_slice() {
                        [x] => (*x, t.dtype),
                        _ => {
                            return Err(invalid(
                                "value",
                                format!("must hold one element, holds {}", v.len()),
                            ))
                        }
                    }
                }
            };
            Op::ConstantOfShape { value, dtype }
        }
        "Range" => Op::Range,
        "Cast" => {
            let to = a
                .int("to")?
                .ok_or_else(|| Problem::AttributeMissing { attr: "to".into() })?;
            let to = i32::try_from(to)
                .ok()
                .and_then(DType::from_onnx)
                .ok_or_else(|| invalid("to", format!("unsupported element type code {to}")))?;
            Op::Cast { to }
        }
        "Dropout" => Op::Dropout {
            ratio: a.float("ratio")?,
        },
        "Identity" => Op::Identity,
        reduce if reduce.starts_with("Reduce") => {
            let Some(kind) = ReduceKind::ALL.into_iter().find(|k| k.name() == reduce) else {
                return Ok(Converted::Unsupported);
            };
            Op::Reduce {
                kind,
                axes: a.ints("axes")?,
                keepdims: a.flag("keepdims", true)?,
                noop_with_empty_axes: a.flag("noop_with_empty_axes", false)?,
            }
        }
        "Pad" => Op::Pad {
            mode: match a.string("mode")?.as_deref().unwrap_or("constant") {
                "constant" => PadMode::Constant,
                "reflect" => PadMode::Reflect,
                "edge" => PadMode::Edge,
                "wrap" => PadMode::Wrap,
                other => return Err(invalid("mode", format!("unknown mode '{other}'"))),
            },
            pads: a.ints("pads")?,
        },
        "Resize" | "Upsample" => Op::Resize(resize(&a, node.op_type == "Upsample", opset)?),
        "RNN" | "GRU" | "LSTM" => Op::Recurrent(recurrent(&a, &node.op_type, node)?),
        "Where" => Op::Where,
        "Expand" => Op::Expand,
        "Trilu" => Op::Trilu {
            upper: a.flag("upper", true)?,
        },
        "Size" => Op::Size,
        "GatherElements" => Op::GatherElements {
            axis: a.int("axis")?.unwrap_or(0),
        },
        "GatherND" => Op::GatherNd {
            batch_dims: match a.int("batch_dims")?.unwrap_or(0) {
                b if b >= 0 => b as usize,
                b => return Err(invalid("batch_dims", format!("must be at least 0, is {b}"))),
            },
        },
        // `Scatter` (opsets 9–10) is ScatterElements under its old name.
        "ScatterElements" | "Scatter" => Op::ScatterElements {
            axis: a.int("axis")?.unwrap_or(0),
            reduction: reduction(&a)?,
        },
        "ScatterND" => Op::ScatterNd {
            reduction: reduction(&a)?,
        },
        "CumSum" => Op::CumSum {
            exclusive: a.flag("exclusive", false)?,
            reverse: a.flag("reverse", false)?,
        },
        "Einsum" => {
            let equation = a
                .string("equation")?
                .ok_or_else(|| Problem::AttributeMissing {
                    attr: "equation".into(),
                })?;
            Op::Einsum(Arc::new(
                Einsum::parse(&equation).map_err(|reason| invalid("equation", reason))?,
            ))
        }
        "Tile" => Op::Tile,
        "DepthToSpace" => {
            let mode = a.string("mode")?.unwrap_or_else(|| "DCR".into());
            let crd = match mode.as_str() {
                "DCR" => false,
                "CRD" => true,
                other => return Err(invalid("mode", format!("unknown value '{other}'"))),
            };
            Op::DepthToSpace {
                blocksize: blocksize(&a)?,
                crd,
            }
        }
        "SpaceToDepth" => Op::SpaceToDepth {
            blocksize: blocksize(&a)?,
        },
        "InstanceNormalization" => Op::InstanceNorm {
            epsilon: a.float("epsilon")?.unwrap_or(1e-5),
        },
        "GroupNormalization" => Op::GroupNorm {
            groups: a
                .int("num_groups")?
                .and_then(|g| usize::try_from(g).ok())
                .filter(|&g| g >= 1)
                .ok_or_else(|| invalid("num_groups", "must be given, at least 1"))?,
            epsilon: a.float("epsilon")?.unwrap_or(1e-5),
        },
        "ReverseSequence" => {
            let axis = |name: &str, default: i64| -> Result<usize, Problem> {
                match a.int(name)?.unwrap_or(default) {
                    v @ (0 | 1) => Ok(v as usize),
                    v => Err(invalid(name, format!("must be 0 or 1, got {v}"))),
                }
            };
            let (batch_axis, time_axis) = (axis("batch_axis", 1)?, axis("time_axis", 0)?);
            if batch_axis == time_axis {
                return Err(invalid("batch_axis", "must differ from time_axis"));
            }
            Op::ReverseSequence {
                batch_axis,
                time_axis,
            }
        }
        "ArgMax" | "ArgMin" => Op::ArgExtreme {
            max: node.op_type == "ArgMax",
            axis: a.int("axis")?.unwrap_or(0),
            keepdims: a.flag("keepdims", true)?,
            select_last: a.flag("select_last_index", false)?,
        },
        "STFT" => Op::Stft {
            onesided: a.flag("onesided", true)?,
        },
        "Constant" => Op::Constant {
            tensor: Arc::new(constant(&a, files)?),
            initializer: false,
        },
        _ => return Ok(Converted::Unsupported),
    };
    Ok(Converted::Op(op))
}

/// DepthToSpace's and SpaceToDepth's `blocksize`: required, at least 1.
fn blocksize(a: &Attrs<'_>) -> Result<usize, Problem> {
    let b = a
        .int("blocksize")?
        .ok_or_else(|| Problem::AttributeMissing {
            attr: "blocksize".into(),
        })?;
    usize::try_from(b)
        .ok()
        .filter(|&b| (1..=1 << 16).contains(&b))
        .ok_or_else(|| invalid("blocksize", format!("must be between 1 and 65536, got {b}")))
}

fn reduction(a: &Attrs<'_>) -> Result<Reduction, Problem> {
    Ok(match a.string("reduction")?.as_deref().unwrap_or("none") {
        "none" => Reduction::None,
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        other => return Err(invalid("reduction", format!("unknown reduction '{other}'"))),
    })
}

/// The payload of a `Constant` node: exactly one of its value attributes.
fn constant(a: &Attrs<'_>, files: &ExternalFiles<'_>) -> Result<TensorData, Problem> {
    let inline = |dtype: DType, dims: Vec<u64>, bytes: Vec<u8>| TensorData {
        dtype,
        dims,
        storage: Storage::Inline(Arc::new(bytes)),
    };
    if let Some(t) = a.tensor("value")? {
        return tensor::decode(&mut t.clone(), files);
    }
    if let Some(v) = a.float("value_float")? {
        return Ok(inline(DType::F32, vec![], v.to_le_bytes().to_vec()));
    }
    if let Some(v) = a.floats("value_floats")? {
        let n = v.len() as u64;
        return Ok(inline(
            DType::F32,
            vec![n],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
    }
    if let Some(v) = a.int("value_int")? {
        return Ok(inline(DType::I64, vec![], v.to_le_bytes().to_vec()));
    }
    if let Some(v) = a.ints("value_ints")? {
        let n = v.len() as u64;
        return Ok(inline(
            DType::I64,
            vec![n],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
    }
    Err(Problem::AttributeMissing {
        attr: "value".into(),
    })
}
