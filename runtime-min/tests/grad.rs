//! Every backward pass of the CPU backend against central differences of its forward pass:
//! for `L = Σ r·op(x…)`, the analytic gradient of each floating-point input matches
//! `(L(x + ε) − L(x − ε)) / 2ε` at sampled elements. Each backward pass runs with the
//! operands its op declares unread ([`Op::backward_reads`]) released, as a training run
//! releases them: reading one fails the check.

use ralpc_ir::{
    Binary, Conv, ConvTranspose, DType, Gemm, Op, PadMode, Padding, Pool, PoolKind, ReduceKind,
    SliceRanges, Unary, Variadic,
};
use ralpc_runtime_min::cpu::grad;
use ralpc_runtime_min::cpu::init;
use ralpc_runtime_min::cpu::ops::{self, Env, Mode};
use ralpc_runtime_min::cpu::tensor::{Data, Tensor};

const ENV: Env = Env {
    mode: Mode::Training,
    exported_batch: None,
    samples: None,
};

fn rand(shape: &[usize], seed: &str) -> Tensor {
    let n = shape.iter().product();
    Tensor::f32(shape.to_vec(), init::uniform(1, seed, n, 1.0))
}

/// Values in 0.5..1.5.
fn positive_tensor(shape: &[usize]) -> Tensor {
    let mut t = rand(shape, "positive");
    if let Some(v) = t.floats_mut() {
        v.iter_mut().for_each(|x| *x = 1.0 + *x / 2.0);
    }
    t
}

fn ints(shape: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::i64(shape.to_vec(), v)
}

fn loss(op: &Op, inputs: &[Option<Tensor>], probes: &[Vec<f32>]) -> f64 {
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(Option::as_ref).collect();
    let (outs, _) = ops::forward(op, &refs, probes.len(), ENV).expect("forward");
    // Integer outputs (indices) carry no gradient.
    outs.iter()
        .zip(probes)
        .filter_map(|(o, r)| {
            let o = o.floats()?;
            Some(
                o.iter()
                    .zip(r)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>(),
            )
        })
        .sum()
}

/// Checks the gradients of `op` at `inputs` (`None` for an omitted optional input).
fn check(name: &str, op: Op, inputs: Vec<Option<Tensor>>, outputs: usize) {
    check_except(name, op, inputs, outputs, &[]);
}

/// As [`check`], with the inputs in `constant` having no gradient.
fn check_except(
    name: &str,
    op: Op,
    inputs: Vec<Option<Tensor>>,
    outputs: usize,
    constant: &[usize],
) {
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(Option::as_ref).collect();
    let (outs, saved) = ops::forward(&op, &refs, outputs, ENV).expect(name);
    let probes: Vec<Vec<f32>> = outs
        .iter()
        .enumerate()
        .map(|(k, o)| init::uniform(2, &format!("{name}{k}"), o.len(), 1.0))
        .collect();
    let reads = op.backward_reads();
    let kept: Vec<Option<Tensor>> = inputs
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_ref().map(|x| {
                if reads.input(i) {
                    x.clone()
                } else {
                    x.released()
                }
            })
        })
        .collect();
    let kept_refs: Vec<Option<&Tensor>> = kept.iter().map(Option::as_ref).collect();
    let kept_outs: Vec<Tensor> = outs
        .iter()
        .map(|o| {
            if reads.outputs {
                o.clone()
            } else {
                o.released()
            }
        })
        .collect();
    let out_refs: Vec<&Tensor> = kept_outs.iter().collect();
    let dys: Vec<Option<&[f32]>> = probes.iter().map(|p| Some(p.as_slice())).collect();
    let grads = grad::backward(&op, &kept_refs, &out_refs, &saved, &dys).expect(name);
    let eps = 1e-2f32;
    for (i, x) in inputs.iter().enumerate() {
        let Some(Tensor {
            data: Data::F32(values),
            ..
        }) = x
        else {
            continue;
        };
        if constant.contains(&i) {
            assert!(grads[i].is_none(), "{name}: input {i} is constant");
            continue;
        }
        let g = grads[i]
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no gradient for input {i}"));
        assert_eq!(
            g.len(),
            values.len(),
            "{name}: gradient {i} has the wrong size"
        );
        for e in (0..values.len()).step_by(values.len() / 9 + 1) {
            let at = |delta: f32| {
                let mut moved = inputs.clone();
                if let Some(v) = moved[i].as_mut().and_then(Tensor::floats_mut) {
                    v[e] += delta;
                }
                loss(&op, &moved, &probes)
            };
            let numeric = (at(eps) - at(-eps)) / f64::from(2.0 * eps);
            let analytic = f64::from(g[e]);
            assert!(
                (numeric - analytic).abs() <= 2e-2 * (1.0 + numeric.abs().max(analytic.abs())),
                "{name}: d input {i} [{e}]: numeric {numeric}, analytic {analytic}"
            );
        }
    }
}

#[test]
fn dense_and_convolution() {
    let conv = Conv {
        kernel: None,
        strides: Some(vec![2, 1]),
        dilations: Some(vec![1, 2]),
        padding: Padding::Explicit(vec![1, 0, 0, 2]),
        group: 2,
    };
    check(
        "conv",
        Op::Conv(conv),
        vec![
            Some(rand(&[2, 4, 5, 6], "x")),
            Some(rand(&[6, 2, 3, 2], "w")),
            Some(rand(&[6], "b")),
        ],
        1,
    );
    // Transposed: strided, grouped, padded, with an output padding; and 1-D.
    let transposed = ConvTranspose {
        conv: Conv {
            kernel: None,
            strides: Some(vec![2, 3]),
            dilations: Some(vec![1, 2]),
            padding: Padding::Explicit(vec![1, 0, 0, 1]),
            group: 2,
        },
        output_padding: Some(vec![1, 0]),
        output_shape: None,
    };
    check(
        "conv_transpose",
        Op::ConvTranspose(transposed),
        vec![
            Some(rand(&[2, 4, 3, 4], "x")),
            Some(rand(&[4, 3, 3, 2], "w")),
            Some(rand(&[6], "b")),
        ],
        1,
    );
    let one_d = ConvTranspose {
        conv: Conv {
            kernel: None,
            strides: Some(vec![2]),
            dilations: None,
            padding: Padding::Explicit(Vec::new()),
            group: 1,
        },
        output_padding: None,
        output_shape: None,
    };
    check(
        "conv_transpose_1d",
        Op::ConvTranspose(one_d),
        vec![
            Some(rand(&[2, 3, 5], "x")),
            Some(rand(&[3, 2, 4], "w")),
            None,
        ],
        1,
    );
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = if ta { [4, 3] } else { [3, 4] };
        let b = if tb { [5, 4] } else { [4, 5] };
        check(
            "gemm",
            Op::Gemm(Gemm {
                alpha: 0.5,
                beta: 2.0,
                trans_a: ta,
                trans_b: tb,
            }),
            vec![
                Some(rand(&a, "a")),
                Some(rand(&b, "b")),
                Some(rand(&[5], "c")),
            ],
            1,
        );
    }
    check(
        "matmul",
        Op::MatMul,
        vec![Some(rand(&[2, 1, 3, 4], "a")), Some(rand(&[3, 4, 2], "b"))],
        1,
    );
    check(
        "matmul-vector",
        Op::MatMul,
        vec![Some(rand(&[4], "a")), Some(rand(&[2, 4, 3], "b"))],
        1,
    );
}

#[test]
fn elementwise() {
    let unaries = [
        Unary::Relu,
        Unary::LeakyRelu { alpha: 0.1 },
        Unary::Sigmoid,
        Unary::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        Unary::HardSwish,
        Unary::Tanh,
        Unary::Gelu { tanh: false },
        Unary::Gelu { tanh: true },
        Unary::Erf,
        Unary::Neg,
        Unary::Exp,
        Unary::Abs,
        Unary::Softplus,
        Unary::Softsign,
        Unary::Elu { alpha: 0.7 },
        Unary::Selu {
            alpha: 1.67,
            gamma: 1.05,
        },
        Unary::Sin,
        Unary::Cos,
        Unary::Tan,
        Unary::Atan,
        Unary::Sinh,
        Unary::Cosh,
        Unary::Asinh,
        Unary::Mish,
        Unary::Celu { alpha: 0.8 },
        Unary::ThresholdedRelu { alpha: 0.2 },
        Unary::Shrink {
            bias: 0.1,
            lambd: 0.3,
        },
    ];
    for u in unaries {
        check(
            &format!("{u:?}"),
            Op::Unary(u),
            vec![Some(rand(&[3, 7], "x"))],
            1,
        );
    }
    let positive = Tensor::f32(vec![5], vec![0.5, 1.0, 1.5, 2.0, 3.0]);
    for u in [Unary::Sqrt, Unary::Reciprocal, Unary::Log] {
        check(
            &format!("{u:?}"),
            Op::Unary(u),
            vec![Some(positive.clone())],
            1,
        );
    }
    check(
        "clip",
        Op::Clip {
            min: Some(-0.5),
            max: Some(0.4),
        },
        vec![Some(rand(&[20], "x"))],
        1,
    );
    for b in [
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::Div,
        Binary::Mod,
        Binary::Fmod,
    ] {
        let divisor = Tensor::f32(vec![3, 1], vec![1.5, -2.0, 0.7]);
        check(
            &format!("{b:?}"),
            Op::Binary(b),
            vec![Some(rand(&[2, 1, 4], "a")), Some(divisor)],
            1,
        );
    }
    check(
        "pow",
        Op::Binary(Binary::Pow),
        vec![Some(positive.clone()), Some(rand(&[5], "e"))],
        1,
    );
    // A slope per channel, broadcast over the batch and the pixels.
    check(
        "prelu",
        Op::Binary(Binary::PRelu),
        vec![
            Some(rand(&[2, 3, 2, 2], "x")),
            Some(Tensor::f32(vec![3, 1, 1], vec![0.25, -0.5, 0.1])),
        ],
        1,
    );
    // Inside their domains, away from its edges.
    let inside = Tensor::f32(vec![5], vec![-0.5, -0.2, 0.1, 0.3, 0.6]);
    for u in [Unary::Asin, Unary::Acos, Unary::Atanh] {
        check(
            &format!("{u:?}"),
            Op::Unary(u),
            vec![Some(inside.clone())],
            1,
        );
    }
    let above_one = Tensor::f32(vec![4], vec![1.5, 2.0, 3.0, 5.0]);
    check("acosh", Op::Unary(Unary::Acosh), vec![Some(above_one)], 1);
    for v in [Variadic::Sum, Variadic::Mean, Variadic::Max, Variadic::Min] {
        check(
            &format!("{v:?}"),
            Op::Variadic(v),
            vec![
                Some(rand(&[2, 3], "a")),
                Some(rand(&[3], "b")),
                Some(rand(&[2, 1], "c")),
            ],
            1,
        );
    }
    check(
        "where",
        Op::Where,
        vec![
            Some(ints(&[3], vec![1, 0, 1])),
            Some(rand(&[2, 3], "a")),
            Some(rand(&[3], "b")),
        ],
        1,
    );
    check(
        "expand",
        Op::Expand,
        vec![Some(rand(&[3, 1], "x")), Some(ints(&[3], vec![2, 3, 4]))],
        1,
    );
}

#[test]
fn normalization_softmax_and_pooling() {
    for (axis, log, flatten) in [(1, false, false), (-1, true, false), (1, false, true)] {
        check(
            "softmax",
            Op::Softmax { axis, log, flatten },
            vec![Some(rand(&[2, 3, 4], "x"))],
            1,
        );
    }
    check_except(
        "batchnorm",
        Op::BatchNorm {
            epsilon: 1e-5,
            momentum: 0.9,
        },
        vec![
            Some(rand(&[3, 2, 2, 2], "x")),
            Some(rand(&[2], "g")),
            Some(rand(&[2], "b")),
            Some(Tensor::f32(vec![2], vec![0.0; 2])),
            Some(Tensor::f32(vec![2], vec![1.0; 2])),
        ],
        1,
        &[3, 4],
    );
    check(
        "layernorm",
        Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        },
        vec![
            Some(rand(&[3, 5], "x")),
            Some(rand(&[5], "g")),
            Some(rand(&[5], "b")),
        ],
        1,
    );
    check(
        "lrn",
        Op::Lrn {
            size: 3,
            alpha: 0.5,
            beta: 0.75,
            bias: 1.0,
        },
        vec![Some(rand(&[2, 5, 2, 2], "x"))],
        1,
    );
    for kind in [PoolKind::Max, PoolKind::Average] {
        let pool = Pool {
            kind,
            kernel: vec![3, 2],
            strides: Some(vec![2, 2]),
            dilations: None,
            padding: Padding::Explicit(vec![1, 0, 1, 1]),
            ceil_mode: true,
            count_include_pad: false,
        };
        check(
            "pool",
            Op::Pool(pool),
            vec![Some(rand(&[2, 2, 5, 5], "x"))],
            1,
        );
        check(
            "global",
            Op::GlobalPool(kind),
            vec![Some(rand(&[2, 3, 2, 3], "x"))],
            1,
        );
    }
    for kind in ReduceKind::ALL {
        for keepdims in [true, false] {
            // LogSum and L2 need positive sums; the others any input.
            let x = match kind {
                ReduceKind::LogSum => positive_tensor(&[2, 3, 4]),
                _ => rand(&[2, 3, 4], "x"),
            };
            check(
                &format!("{kind:?} keepdims={keepdims}"),
                Op::Reduce {
                    kind,
                    axes: Some(vec![1, -1]),
                    keepdims,
                    noop_with_empty_axes: false,
                },
                vec![Some(x)],
                1,
            );
        }
    }
    // Prod with one zero in a group: the gradient of the zero is the product of the others.
    let mut with_zero = rand(&[2, 3], "x");
    if let Some(v) = with_zero.floats_mut() {
        v[1] = 0.0;
    }
    check(
        "prod with a zero",
        Op::Reduce {
            kind: ReduceKind::Prod,
            axes: Some(vec![1]),
            keepdims: false,
            noop_with_empty_axes: false,
        },
        vec![Some(with_zero)],
        1,
    );
}

#[test]
fn resize() {
    use ralpc_ir::{CoordinateMode, NearestMode, Resize, ResizeMode};
    for (mode, coordinates) in [
        (ResizeMode::Nearest, CoordinateMode::Asymmetric),
        (ResizeMode::Linear, CoordinateMode::HalfPixel),
        (ResizeMode::Linear, CoordinateMode::AlignCorners),
    ] {
        let r = Resize {
            mode,
            coordinates,
            nearest: NearestMode::RoundPreferFloor,
            scales: None,
            slots: (2, Some(3)),
            axes: None,
        };
        // Up by 2 on rows and down to 3 of 5 on columns (scales), then to given sizes.
        let scales = Tensor::f32(vec![4], vec![1.0, 1.0, 2.0, 0.6]);
        check_except(
            &format!("resize {mode:?} {coordinates:?} by scales"),
            Op::Resize(r.clone()),
            vec![Some(rand(&[2, 3, 4, 5], "x")), None, Some(scales), None],
            1,
            &[2],
        );
        let sizes = ints(&[4], vec![2, 3, 7, 9]);
        check(
            &format!("resize {mode:?} {coordinates:?} to sizes"),
            Op::Resize(r),
            vec![Some(rand(&[2, 3, 4, 5], "x")), None, None, Some(sizes)],
            1,
        );
    }
}

#[test]
fn data_movement() {
    check(
        "concat",
        Op::Concat { axis: 1 },
        vec![Some(rand(&[2, 1, 3], "a")), Some(rand(&[2, 2, 3], "b"))],
        1,
    );
    check(
        "split",
        Op::Split {
            axis: -1,
            sizes: Some(vec![1, 3]),
        },
        vec![Some(rand(&[2, 4], "x"))],
        2,
    );
    check(
        "slice",
        Op::Slice {
            ranges: Some(SliceRanges {
                starts: vec![-1, 0],
                ends: vec![0, 3],
                axes: Some(vec![0, 1]),
            }),
        },
        vec![Some(rand(&[4, 5], "x"))],
        1,
    );
    check(
        "slice-steps",
        Op::Slice { ranges: None },
        vec![
            Some(rand(&[6, 5], "x")),
            Some(ints(&[2], vec![5, 0])),
            Some(ints(&[2], vec![0, 5])),
            Some(ints(&[2], vec![0, 1])),
            Some(ints(&[2], vec![-2, 2])),
        ],
        1,
    );
    check(
        "transpose",
        Op::Transpose {
            perm: Some(vec![2, 0, 1]),
        },
        vec![Some(rand(&[2, 3, 4], "x"))],
        1,
    );
    check(
        "gather",
        Op::Gather { axis: 1 },
        vec![
            Some(rand(&[2, 5, 3], "x")),
            Some(ints(&[2, 2], vec![0, 4, 4, -1])),
        ],
        1,
    );
    check(
        "reshape",
        Op::Reshape { allowzero: false },
        vec![Some(rand(&[2, 3, 4], "x")), Some(ints(&[2], vec![0, -1]))],
        1,
    );
    for mode in [
        PadMode::Constant,
        PadMode::Reflect,
        PadMode::Edge,
        PadMode::Wrap,
    ] {
        check(
            "pad",
            Op::Pad {
                mode,
                pads: Some(vec![1, 2, 2, 1]),
            },
            vec![Some(rand(&[3, 4], "x"))],
            1,
        );
    }
    check(
        "trilu",
        Op::Trilu { upper: false },
        vec![Some(rand(&[2, 3, 4], "x")), Some(ints(&[], vec![1]))],
        1,
    );
    check(
        "cast",
        Op::Cast { to: DType::F32 },
        vec![Some(rand(&[4], "x"))],
        1,
    );
}

#[test]
fn recurrent_layers() {
    use ralpc_ir::{Cell, Direction, Recurrent};
    let (seq, batch, input, hidden) = (3, 2, 3, 2);
    for cell in [
        Cell::Rnn,
        Cell::Gru {
            linear_before_reset: false,
        },
        Cell::Gru {
            linear_before_reset: true,
        },
        Cell::Lstm,
    ] {
        for (direction, batch_major) in [
            (Direction::Forward, false),
            (Direction::Reverse, true),
            (Direction::Bidirectional, false),
        ] {
            let dirs = direction.count() as usize;
            let width = cell.gates() as usize * hidden;
            let x_shape = if batch_major {
                [batch, seq, input]
            } else {
                [seq, batch, input]
            };
            let state = if batch_major {
                [batch, dirs, hidden]
            } else {
                [dirs, batch, hidden]
            };
            let lstm = cell == Cell::Lstm;
            let name = format!("{}-{direction:?}-{batch_major}", cell.name());
            let mut inputs = vec![
                Some(rand(&x_shape, "x")),
                Some(rand(&[dirs, width, input], "w")),
                Some(rand(&[dirs, width, hidden], "r")),
                Some(rand(&[dirs, 2 * width], "b")),
                // The second sample runs 2 of the 3 steps.
                Some(ints(&[batch], vec![3, 2])),
                Some(rand(&state, "h0")),
            ];
            if lstm {
                inputs.push(Some(rand(&state, "c0")));
            }
            let op = Op::Recurrent(Recurrent {
                cell,
                hidden: hidden as u64,
                direction,
                batch_major,
            });
            check(&name, op, inputs, if lstm { 3 } else { 2 });
        }
    }
}

#[test]
fn indexed_ops() {
    use ralpc_ir::Reduction;
    let x = rand(&[3, 4], "x");
    // Column 1 is read twice: its gradient adds.
    let idx = ints(&[2, 4], vec![0, 1, 2, -1, 1, 1, 0, 2]);
    check_except(
        "gather_elements",
        Op::GatherElements { axis: 0 },
        vec![Some(x.clone()), Some(idx)],
        1,
        &[1],
    );
    // Rows 2 and 0, then row 2 again (its gradient adds); and, per batch row, one element.
    let rows = ints(&[3, 1], vec![2, 0, -1]);
    check_except(
        "gather_nd",
        Op::GatherNd { batch_dims: 0 },
        vec![Some(x.clone()), Some(rows)],
        1,
        &[1],
    );
    let per_row = ints(&[3, 2, 1], vec![0, 3, 1, 1, 2, 0]);
    check_except(
        "gather_nd_batch",
        Op::GatherNd { batch_dims: 1 },
        vec![Some(x.clone()), Some(per_row)],
        1,
        &[1],
    );
    for reduction in [Reduction::None, Reduction::Add] {
        let idx = ints(&[2, 2], vec![3, 0, 1, 2]);
        check_except(
            &format!("scatter_elements_{reduction:?}"),
            Op::ScatterElements { axis: 1, reduction },
            vec![Some(x.clone()), Some(idx), Some(rand(&[2, 2], "up"))],
            1,
            &[1],
        );
        let idx = ints(&[2, 1], vec![2, 0]);
        check_except(
            &format!("scatter_nd_{reduction:?}"),
            Op::ScatterNd { reduction },
            vec![Some(x.clone()), Some(idx), Some(rand(&[2, 4], "rows"))],
            1,
            &[1],
        );
    }
    for (exclusive, reverse) in [(false, false), (true, false), (false, true), (true, true)] {
        check_except(
            &format!("cumsum_{exclusive}_{reverse}"),
            Op::CumSum { exclusive, reverse },
            vec![Some(rand(&[2, 3, 4], "c")), Some(ints(&[], vec![-2]))],
            1,
            &[1],
        );
    }
}

#[test]
fn einsum_contractions() {
    use std::sync::Arc;
    let cases: [(&str, &[&[usize]]); 6] = [
        ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 2]]),
        ("ij,jk", &[&[3, 4], &[4, 2]]),
        ("...ii->...i", &[&[2, 3, 3]]),
        ("i,i->", &[&[5], &[5]]),
        ("bhqd,bhkd->bhqk", &[&[1, 2, 3, 4], &[1, 2, 2, 4]]),
        // The ellipsis broadcasts a 1 against a 2.
        ("...j,jk->...k", &[&[2, 1, 3], &[3, 2]]),
    ];
    for (equation, shapes) in cases {
        let e = ralpc_ir::Einsum::parse(equation).expect(equation);
        let inputs = shapes
            .iter()
            .enumerate()
            .map(|(k, s)| Some(rand(s, &format!("{equation}{k}"))))
            .collect();
        check(equation, Op::Einsum(Arc::new(e)), inputs, 1);
    }
}

#[test]
fn rearrangements_and_instance_normalization() {
    let x = || Some(rand(&[2, 8, 2, 3], "x"));
    // Values 0.1 apart, so that no finite-difference step reorders them.
    let spread: Vec<f32> = (0..30).map(|i| ((i * 7) % 30) as f32 / 10.0).collect();
    for (axis, largest, k) in [(1, true, 2), (-1, false, 3), (0, true, 1)] {
        check_except(
            &format!("top {k} along {axis}, largest {largest}"),
            Op::TopK {
                axis,
                largest,
                k: None,
            },
            vec![
                Some(Tensor::f32(vec![2, 5, 3], spread.clone())),
                Some(ints(&[1], vec![k])),
            ],
            2,
            &[1],
        );
    }
    check(
        "tile",
        Op::Tile,
        vec![x(), Some(ints(&[4], vec![1, 2, 1, 3]))],
        1,
    );
    for crd in [false, true] {
        check(
            &format!("depth to space crd={crd}"),
            Op::DepthToSpace { blocksize: 2, crd },
            vec![x()],
            1,
        );
    }
    check(
        "space to depth",
        Op::SpaceToDepth { blocksize: 2 },
        vec![Some(rand(&[2, 3, 4, 6], "x"))],
        1,
    );
    for (batch_axis, time_axis, shape) in [(1, 0, [4, 3, 2]), (0, 1, [3, 4, 2])] {
        check_except(
            "reverse sequence",
            Op::ReverseSequence {
                batch_axis,
                time_axis,
            },
            vec![Some(rand(&shape, "x")), Some(ints(&[3], vec![4, 0, 2]))],
            1,
            &[1],
        );
    }
    for (groups, per) in [(2, 4), (2, 2), (4, 4)] {
        check(
            &format!("group norm {groups} groups, {per} parameters"),
            Op::GroupNorm {
                groups,
                epsilon: 1e-5,
            },
            vec![
                Some(rand(&[2, 4, 3], "x")),
                Some(rand(&[per], "scale")),
                Some(rand(&[per], "bias")),
            ],
            1,
        );
    }
    check(
        "instance norm",
        Op::InstanceNorm { epsilon: 1e-5 },
        vec![
            Some(rand(&[2, 3, 4, 5], "x")),
            Some(rand(&[3], "scale")),
            Some(rand(&[3], "bias")),
        ],
        1,
    );
}

#[test]
fn short_time_fourier_transforms() {
    // Overlapping frames (step below the frame), with a window and without (frame_length),
    // one-sided and two-sided, a [batch, length, 1] signal.
    let signal = |shape: &[usize]| Some(rand(shape, "signal"));
    let step = |s: i64| Some(ints(&[], vec![s]));
    for onesided in [true, false] {
        let op = Op::Stft { onesided };
        let name = format!("stft onesided={onesided}");
        check(
            &name,
            op.clone(),
            vec![signal(&[2, 20]), step(3), Some(rand(&[8], "window")), None],
            1,
        );
        check(
            &name,
            op,
            vec![signal(&[1, 13, 1]), step(4), None, Some(ints(&[], vec![5]))],
            1,
        );
    }
}

/// A 3-d convolution computed directly from its definition.
fn direct_conv3d(
    x: &Tensor,
    w: &Tensor,
    b: &[f32],
    stride: [usize; 3],
    dilation: [usize; 3],
    pad: [usize; 3],
    group: usize,
) -> (Vec<usize>, Vec<f32>) {
    let (xs, ws) = (x.floats().unwrap(), w.floats().unwrap());
    let (n, c, d, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3], x.shape[4]);
    let (m, cg, k) = (w.shape[0], w.shape[1], [w.shape[2], w.shape[3], w.shape[4]]);
    let input = [d, h, wd];
    let out: Vec<usize> = (0..3)
        .map(|a| (input[a] + 2 * pad[a] - (k[a] - 1) * dilation[a] - 1) / stride[a] + 1)
        .collect();
    let mut y = vec![0.0f32; n * m * out.iter().product::<usize>()];
    let mut at = 0;
    for s in 0..n {
        for o in 0..m {
            let g = o / (m / group);
            for od in 0..out[0] {
                for oh in 0..out[1] {
                    for ow in 0..out[2] {
                        let mut sum = b[o];
                        for ci in 0..cg {
                            let ch = g * cg + ci;
                            for kd in 0..k[0] {
                                for kh in 0..k[1] {
                                    for kw in 0..k[2] {
                                        let p = [
                                            od * stride[0] + kd * dilation[0],
                                            oh * stride[1] + kh * dilation[1],
                                            ow * stride[2] + kw * dilation[2],
                                        ];
                                        if (0..3)
                                            .any(|a| p[a] < pad[a] || p[a] - pad[a] >= input[a])
                                        {
                                            continue;
                                        }
                                        let (id, ih, iw) =
                                            (p[0] - pad[0], p[1] - pad[1], p[2] - pad[2]);
                                        sum += xs[(((s * c + ch) * d + id) * h + ih) * wd + iw]
                                            * ws[(((o * cg + ci) * k[0] + kd) * k[1] + kh) * k[2]
                                                + kw];
                                    }
                                }
                            }
                        }
                        y[at] = sum;
                        at += 1;
                    }
                }
            }
        }
    }
    let mut shape = vec![n, m];
    shape.extend(out);
    (shape, y)
}

#[test]
fn volumes() {
    let conv = Conv {
        kernel: None,
        strides: Some(vec![2, 1, 1]),
        dilations: Some(vec![1, 1, 2]),
        padding: Padding::Explicit(vec![1, 1, 0, 1, 1, 0]),
        group: 2,
    };
    let (x, w, b) = (
        rand(&[2, 4, 5, 4, 6], "x3"),
        rand(&[4, 2, 3, 2, 2], "w3"),
        rand(&[4], "b3"),
    );
    let inputs = [Some(&x), Some(&w), Some(&b)];
    let (outs, _) = ops::forward(&Op::Conv(conv.clone()), &inputs, 1, ENV).expect("conv3d");
    let (shape, want) = direct_conv3d(
        &x,
        &w,
        b.floats().unwrap(),
        [2, 1, 1],
        [1, 1, 2],
        [1, 1, 0],
        2,
    );
    assert_eq!(outs[0].shape, shape);
    for (a, e) in outs[0].floats().unwrap().iter().zip(&want) {
        assert!(
            (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
            "conv3d: {a} vs {e}"
        );
    }
    check("conv3d", Op::Conv(conv), vec![Some(x), Some(w), Some(b)], 1);
    for (kind, count_include_pad) in [
        (PoolKind::Max, false),
        (PoolKind::Average, false),
        (PoolKind::Average, true),
    ] {
        let pool = Pool {
            kind,
            kernel: vec![2, 3, 2],
            strides: Some(vec![1, 2, 2]),
            dilations: None,
            padding: Padding::Explicit(vec![0, 1, 1, 1, 1, 0]),
            ceil_mode: true,
            count_include_pad,
        };
        check(
            &format!("pool3d {kind:?} {count_include_pad}"),
            Op::Pool(pool),
            vec![Some(rand(&[2, 2, 4, 5, 5], "p3"))],
            1,
        );
    }
}

#[test]
fn transposed_volumes() {
    // Strided, dilated, grouped, padded and output-padded in depth and in plane.
    let transposed = ConvTranspose {
        conv: Conv {
            kernel: None,
            strides: Some(vec![2, 1, 2]),
            dilations: Some(vec![1, 2, 1]),
            padding: Padding::Explicit(vec![1, 0, 1, 0, 1, 0]),
            group: 2,
        },
        output_padding: Some(vec![1, 0, 1]),
        output_shape: None,
    };
    check(
        "convtranspose3d",
        Op::ConvTranspose(transposed),
        vec![
            Some(rand(&[2, 4, 3, 3, 2], "tx")),
            Some(rand(&[4, 1, 2, 2, 3], "tw")),
            Some(rand(&[2], "tb")),
        ],
        1,
    );
}

/// A whole graph's backward against finite differences of its forward, where ReLUs run in
/// place of the Conv and Gemm outputs they read (`graph::forward`): the CNN fixture's
/// gradients of its first convolution's weights and its input, through both ReLU kinds.
#[test]
fn relus_applied_in_place_keep_the_graphs_gradients() {
    use ralpc_runtime_min::cpu::graph::{self, Grads, Values, Weights};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/train/cnn.onnx");
    let mut model = ralpc_ir::onnx::import(&path).expect("import");
    let bindings = ralpc_ir::Bindings {
        batch: Some(2),
        ..Default::default()
    };
    ralpc_ir::bind(&mut model.graph, &bindings).expect("bind");
    let info = ralpc_ir::verify(&model.graph).expect("verify");
    let g = &model.graph;
    let weights = Weights::load(g, 7).expect("weights");
    let image = g.inputs()[0];
    let shape: Vec<usize> = info
        .ty(image)
        .shape
        .as_sizes()
        .expect("bound")
        .iter()
        .map(|&d| d as usize)
        .collect();
    let x = rand(&shape, "image");
    let output = g.outputs()[0];
    let env = Env {
        mode: Mode::Training,
        exported_batch: None,
        samples: None,
    };
    let run = |tensors: &[(ralpc_ir::ValueId, Tensor)]| {
        let mut values = Values::new(g);
        for (&v, t) in &weights.tensors {
            values.set(v, t.clone());
        }
        values.set(image, x.clone());
        for (v, t) in tensors {
            values.set(*v, t.clone());
        }
        let records = graph::forward(g, info.order(), &mut values, env).expect("forward");
        (values, records)
    };
    let (values, records) = run(&[]);
    let y = values.get(output).expect("output");
    let probe = rand(&y.shape, "probe").floats().expect("floats").to_vec();
    let loss = |values: &Values| -> f64 {
        let y = values.get(output).and_then(Tensor::floats).expect("output");
        y.iter()
            .zip(&probe)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()
    };
    let mut grads = Grads::default();
    grads.add(output, &probe);
    graph::backward(g, &records, &values, &mut grads).expect("backward");
    let conv = weights.trainable[0];
    for (v, base) in [(conv, &weights.tensors[&conv]), (image, &x)] {
        let analytic = grads.get(v).expect("a gradient").to_vec();
        for e in (0..base.len()).step_by(base.len() / 7 + 1) {
            let at = |delta: f32| {
                let mut moved = base.clone();
                moved.floats_mut().expect("floats")[e] += delta;
                loss(&run(&[(v, moved)]).0)
            };
            // One-sided slopes: where a ReLU or max pool switches within ±h the loss has a
            // kink there, and the central difference mixes both sides' slopes; the
            // gradient is then the slope on its own side, between the two (or near one).
            let h = 1e-3;
            let centre = at(0.0);
            let slopes = [
                (centre - at(-h)) / f64::from(h),
                (at(h) - centre) / f64::from(h),
            ];
            let (low, high) = (slopes[0].min(slopes[1]), slopes[0].max(slopes[1]));
            let analytic_e = f64::from(analytic[e]);
            let tolerance = 2e-2 * high.abs().max(low.abs()).max(1.0);
            assert!(
                analytic_e >= low - tolerance && analytic_e <= high + tolerance,
                "{} element {e}: one-sided slopes {slopes:?}, backward {}",
                g.value(v).name,
                analytic[e]
            );
        }
    }
}
