//! The CPU kernels against their definitions: convolution against the direct sum, every
//! backward against finite differences of its forward (exact for the linear layers, which
//! are linear in each operand), the loss gradient numerically, and SGD's closed form.

use proptest::prelude::*;
use ralpc_runtime_min::cpu::kernels::{self, Conv2d, Linear, Pool2d};

/// Seeded values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

fn conv_case() -> impl Strategy<Value = (Conv2d, u64)> {
    (
        (1usize..3, 1usize..3, 1usize..3, 1usize..3),
        (3usize..8, 3usize..8, 1usize..4, 1usize..3, 1usize..3),
        [0usize..2, 0usize..2, 0usize..2, 0usize..2],
        any::<u64>(),
    )
        .prop_map(
            |((batch, groups, ic, oc), (h, w, k, s, d), padding, seed)| {
                (
                    Conv2d {
                        batch,
                        in_channels: ic * groups,
                        out_channels: oc * groups,
                        input: (h, w),
                        kernel: (k, k),
                        stride: (s, s),
                        dilation: (d, d),
                        padding,
                        groups,
                    },
                    seed,
                )
            },
        )
        .prop_filter("the kernel fits", |(c, _)| {
            let span = (c.kernel.0 - 1) * c.dilation.0 + 1;
            span <= c.input.0 + c.padding[0] + c.padding[2]
                && span <= c.input.1 + c.padding[1] + c.padding[3]
        })
}

fn sizes(c: &Conv2d) -> (usize, usize, usize) {
    let (oh, ow) = c.output();
    (
        c.batch * c.in_channels * c.input.0 * c.input.1,
        c.out_channels * c.in_channels / c.groups * c.kernel.0 * c.kernel.1,
        c.batch * c.out_channels * oh * ow,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn convolution_is_the_direct_sum((c, seed) in conv_case()) {
        let (nx, nw, ny) = sizes(&c);
        let (x, w, b) = (values(nx, seed), values(nw, seed ^ 1), values(c.out_channels, seed ^ 2));
        let mut y = vec![0.0; ny];
        c.forward(&x, &w, Some(&b), &mut y);
        let (oh, ow) = c.output();
        let (h, wd) = c.input;
        for n in 0..c.batch {
            for o in 0..c.out_channels {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut sum = f64::from(b[o]);
                        let cg = c.in_channels / c.groups;
                        let g = o / (c.out_channels / c.groups);
                        for i in 0..cg {
                            for ky in 0..c.kernel.0 {
                                for kx in 0..c.kernel.1 {
                                    let yy = (oy * c.stride.0 + ky * c.dilation.0) as isize - c.padding[0] as isize;
                                    let xx = (ox * c.stride.1 + kx * c.dilation.1) as isize - c.padding[1] as isize;
                                    if yy < 0 || xx < 0 || yy >= h as isize || xx >= wd as isize {
                                        continue;
                                    }
                                    let xv = x[((n * c.in_channels + g * cg + i) * h + yy as usize) * wd + xx as usize];
                                    let wv = w[((o * cg + i) * c.kernel.0 + ky) * c.kernel.1 + kx];
                                    sum += f64::from(xv) * f64::from(wv);
                                }
                            }
                        }
                        let got = y[((n * c.out_channels + o) * oh + oy) * ow + ox];
                        prop_assert!(close(f64::from(got), sum, 1e-5), "{got} vs {sum}");
                    }
                }
            }
        }
    }

    /// `L = Σ r·conv(x, w)` is linear in `x`, in `w` and in `b`: its change under a unit
    /// step of one element is exactly that element's gradient.
    #[test]
    fn convolution_gradients_are_exact((c, seed) in conv_case()) {
        let (nx, nw, ny) = sizes(&c);
        let (x, w, b) = (values(nx, seed), values(nw, seed ^ 1), values(c.out_channels, seed ^ 2));
        let r = values(ny, seed ^ 3);
        let loss = |x: &[f32], w: &[f32], b: &[f32]| {
            let mut y = vec![0.0; ny];
            c.forward(x, w, Some(b), &mut y);
            dot(&y, &r)
        };
        let (mut dx, mut dw, mut db) = (vec![0.0; nx], vec![0.0; nw], vec![0.0; c.out_channels]);
        c.backward(&x, &w, &r, Some(&mut dx), &mut dw, Some(&mut db));
        let base = loss(&x, &w, &b);
        for i in (0..nx).step_by(nx / 7 + 1) {
            let mut x2 = x.clone();
            x2[i] += 1.0;
            prop_assert!(close(loss(&x2, &w, &b) - base, f64::from(dx[i]), 1e-4), "dx[{i}]");
        }
        for i in (0..nw).step_by(nw / 7 + 1) {
            let mut w2 = w.clone();
            w2[i] += 1.0;
            prop_assert!(close(loss(&x, &w2, &b) - base, f64::from(dw[i]), 1e-4), "dw[{i}]");
        }
        for o in 0..c.out_channels {
            let mut b2 = b.clone();
            b2[o] += 1.0;
            prop_assert!(close(loss(&x, &w, &b2) - base, f64::from(db[o]), 1e-4), "db[{o}]");
        }
    }

    /// The transposed convolution is the convolution's adjoint in its input:
    /// `⟨conv(x, w), r⟩ = ⟨x, convᵀ(r, w)⟩`.
    #[test]
    fn the_transposed_convolution_is_the_adjoint((c, seed) in conv_case()) {
        let (nx, nw, ny) = sizes(&c);
        let (x, w, r) = (values(nx, seed), values(nw, seed ^ 1), values(ny, seed ^ 3));
        let mut y = vec![0.0; ny];
        c.forward(&x, &w, None, &mut y);
        let mut back = vec![0.0; nx];
        c.transpose(&r, &w, &mut back);
        prop_assert!(close(dot(&y, &r), dot(&x, &back), 1e-4));
    }

    #[test]
    fn linear_gradients_are_exact(batch in 1usize..5, inputs in 1usize..9, outputs in 1usize..9, seed in any::<u64>()) {
        let l = Linear { batch, inputs, outputs };
        let (x, w, b) = (values(batch * inputs, seed), values(outputs * inputs, seed ^ 1), values(outputs, seed ^ 2));
        let r = values(batch * outputs, seed ^ 3);
        let loss = |x: &[f32], w: &[f32], b: &[f32]| {
            let mut y = vec![0.0; batch * outputs];
            l.forward(x, w, Some(b), &mut y);
            dot(&y, &r)
        };
        let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; outputs]);
        l.backward(&x, &w, &r, Some(&mut dx), &mut dw, Some(&mut db));
        let base = loss(&x, &w, &b);
        for i in 0..x.len() {
            let mut x2 = x.clone();
            x2[i] += 1.0;
            prop_assert!(close(loss(&x2, &w, &b) - base, f64::from(dx[i]), 1e-4));
        }
        for i in 0..w.len() {
            let mut w2 = w.clone();
            w2[i] += 1.0;
            prop_assert!(close(loss(&x, &w2, &b) - base, f64::from(dw[i]), 1e-4));
        }
        for o in 0..outputs {
            let mut b2 = b.clone();
            b2[o] += 1.0;
            prop_assert!(close(loss(&x, &w, &b2) - base, f64::from(db[o]), 1e-4));
        }
    }
}

#[test]
fn relu_and_max_pool_route_gradients_to_what_they_passed() {
    let x = values(2 * 4 * 4, 11);
    let mut y = vec![0.0; x.len()];
    kernels::relu(&x, &mut y);
    let dy = values(x.len(), 12);
    let mut dx = vec![0.0; x.len()];
    kernels::relu_backward(&y, &dy, &mut dx);
    for i in 0..x.len() {
        assert_eq!(dx[i], if x[i] > 0.0 { dy[i] } else { 0.0 });
    }
    // 2 planes of 4×4, 2×2 windows, stride 2: each output is its window's maximum.
    let mut pooled = vec![0.0; 2 * 2 * 2];
    let argmax = Pool2d::simple(2, (4, 4), (2, 2), (2, 2)).max(&x, &mut pooled);
    for (o, &i) in argmax.iter().enumerate() {
        let (p, oy, ox) = (o / 4, (o % 4) / 2, o % 2);
        let window: Vec<f32> = (0..4)
            .map(|k| x[(p * 4 + oy * 2 + k / 2) * 4 + ox * 2 + k % 2])
            .collect();
        let max = window.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(pooled[o], max);
        assert_eq!(x[i as usize], max);
    }
    let dpool = values(pooled.len(), 13);
    let mut dx = vec![0.0; x.len()];
    kernels::max_pool_backward(&argmax, &dpool, &mut dx);
    assert!((dx.iter().sum::<f32>() - dpool.iter().sum::<f32>()).abs() < 1e-5);
}

#[test]
fn the_loss_gradient_matches_finite_differences() {
    let (batch, classes) = (3, 5);
    let logits = values(batch * classes, 21);
    let labels = [0u32, 3, 4];
    let mut grad = vec![0.0; logits.len()];
    let mut scratch = vec![0.0; logits.len()];
    let loss = kernels::softmax_cross_entropy(classes, &logits, &labels, batch as f32, &mut grad);
    assert!(loss > 0.0);
    let eps = 1e-2f32;
    for i in 0..logits.len() {
        let (mut up, mut down) = (logits.clone(), logits.clone());
        up[i] += eps;
        down[i] -= eps;
        let numeric =
            (kernels::softmax_cross_entropy(classes, &up, &labels, batch as f32, &mut scratch)
                - kernels::softmax_cross_entropy(
                    classes,
                    &down,
                    &labels,
                    batch as f32,
                    &mut scratch,
                ))
                / f64::from(2.0 * eps);
        assert!(
            close(numeric, f64::from(grad[i]), 1e-3),
            "{i}: {numeric} vs {}",
            grad[i]
        );
    }
    // Each row's gradient sums to zero (softmax minus a one-hot).
    for row in grad.chunks(classes) {
        assert!(row.iter().sum::<f32>().abs() < 1e-6);
    }
}

#[test]
fn sgd_with_momentum_has_its_closed_form() {
    let (mut w, mut v) = (vec![1.0f32, -2.0], vec![0.0f32; 2]);
    let g = [0.5f32, 1.0];
    kernels::sgd_momentum(&mut w, &g, &mut v, 0.1, 0.9);
    kernels::sgd_momentum(&mut w, &g, &mut v, 0.1, 0.9);
    // v1 = g, v2 = 1.9·g; w = w0 − 0.1·(g + 1.9·g) = w0 − 0.29·g.
    assert!((w[0] - (1.0 - 0.29 * 0.5)).abs() < 1e-6);
    assert!((w[1] - (-2.0 - 0.29 * 1.0)).abs() < 1e-6);
}

/// `L(x) = Σ r·f(x)`, where `f` writes an output as long as `r`.
fn probed<'a>(r: &'a [f32], f: impl Fn(&[f32], &mut [f32]) + 'a) -> impl Fn(&[f32]) -> f64 + 'a {
    move |x| {
        let mut y = vec![0.0; r.len()];
        f(x, &mut y);
        dot(&y, r)
    }
}

/// `L = Σ r·f(x)` by central differences, against the analytic gradient `grad`.
fn check_gradient(x: &[f32], grad: &[f32], loss: impl Fn(&[f32]) -> f64, eps: f32, tol: f64) {
    for i in 0..x.len() {
        let (mut up, mut down) = (x.to_vec(), x.to_vec());
        up[i] += eps;
        down[i] -= eps;
        let numeric = (loss(&up) - loss(&down)) / f64::from(2.0 * eps);
        assert!(
            close(numeric, f64::from(grad[i]), tol),
            "{i}: {numeric} vs {}",
            grad[i]
        );
    }
}

#[test]
fn average_pooling_spreads_gradients_evenly() {
    // 3 planes of 4×6, 2×3 windows, stride (2, 3): linear, so unit steps are exact.
    let (planes, input, kernel, stride) = (3, (4, 6), (2, 3), (2, 3));
    let x = values(planes * 24, 31);
    let r = values(planes * 4, 32);
    let pool = Pool2d::simple(planes, input, kernel, stride);
    let loss = probed(&r, |x, y| pool.average(false, x, y));
    let mut dx = vec![0.0; x.len()];
    pool.average_backward(false, &r, &mut dx);
    check_gradient(&x, &dx, loss, 1.0, 1e-5);
}

#[test]
fn batch_norm_normalizes_and_its_gradients_match_finite_differences() {
    let bn = kernels::BatchNorm {
        channels: 3,
        spatial: 4,
        epsilon: 1e-5,
    };
    let n = 2 * 3 * 4;
    let x = values(n, 41);
    let (gamma, beta) = (values(3, 42), values(3, 43));
    let mut y = vec![0.0; n];
    bn.forward(&x, &[1.0; 3], &[0.0; 3], &mut y);
    // With γ = 1, β = 0 every channel has mean 0 and variance 1.
    for c in 0..3 {
        let of_c: Vec<f64> = (0..n)
            .filter(|i| (i / 4) % 3 == c)
            .map(|i| f64::from(y[i]))
            .collect();
        let mean = of_c.iter().sum::<f64>() / 8.0;
        let var = of_c.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 8.0;
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3,
            "{mean} {var}"
        );
    }
    let r = values(n, 44);
    let loss = |x: &[f32], gamma: &[f32], beta: &[f32]| {
        let mut y = vec![0.0; n];
        bn.forward(x, gamma, beta, &mut y);
        dot(&y, &r)
    };
    let stats_g = bn.forward(&x, &gamma, &beta, &mut y);
    let (mut dx, mut dgamma, mut dbeta) = (vec![0.0; n], vec![0.0; 3], vec![0.0; 3]);
    bn.backward(
        &x,
        &gamma,
        (&stats_g.0, &stats_g.1),
        &r,
        &mut dx,
        &mut dgamma,
        &mut dbeta,
    );
    check_gradient(&x, &dx, |x| loss(x, &gamma, &beta), 1e-2, 2e-2);
    check_gradient(&gamma, &dgamma, |g| loss(&x, g, &beta), 1e-2, 1e-3);
    check_gradient(&beta, &dbeta, |b| loss(&x, &gamma, b), 1e-2, 1e-3);
}

#[test]
fn softmax_rows_sum_to_one_and_its_gradient_matches() {
    let (rows, width) = (3, 6);
    let x = values(rows * width, 51);
    let mut y = vec![0.0; x.len()];
    kernels::softmax(width, &x, &mut y);
    for row in y.chunks(width) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
    let r = values(x.len(), 52);
    let mut dx = vec![0.0; x.len()];
    kernels::softmax_backward(width, &y, &r, &mut dx);
    let loss = probed(&r, |x, y| kernels::softmax(width, x, y));
    check_gradient(&x, &dx, loss, 1e-2, 1e-3);
}

#[test]
fn gelu_matches_its_definition_and_its_gradient() {
    let x: Vec<f32> = (0..41).map(|i| (i as f32 - 20.0) * 0.2).collect();
    for tanh in [false, true] {
        let mut y = vec![0.0; x.len()];
        kernels::gelu(tanh, &x, &mut y);
        // GELU(0) = 0, GELU(x) → x for large x, → 0 for very negative x.
        assert_eq!(y[20], 0.0);
        assert!((y[40] - 4.0).abs() < 1e-3 && y[0].abs() < 1e-3, "{tanh}");
        // Exact and tanh forms agree to about 1e-3.
        let mut other = vec![0.0; x.len()];
        kernels::gelu(!tanh, &x, &mut other);
        assert!(y.iter().zip(&other).all(|(a, b)| (a - b).abs() < 2e-3));
        let r = values(x.len(), 61);
        let mut dx = vec![0.0; x.len()];
        kernels::gelu_backward(tanh, &x, &r, &mut dx);
        let loss = probed(&r, |x, y| kernels::gelu(tanh, x, y));
        check_gradient(&x, &dx, loss, 1e-2, 1e-3);
    }
}

#[test]
fn layer_norm_gradients_match_finite_differences() {
    let (rows, width) = (3, 8);
    let x = values(rows * width, 71);
    let (gamma, beta) = (values(width, 72), values(width, 73));
    let r = values(x.len(), 74);
    let loss = |x: &[f32], gamma: &[f32], beta: &[f32]| {
        let mut y = vec![0.0; x.len()];
        kernels::layer_norm(width, 1e-5, x, gamma, beta, &mut y);
        dot(&y, &r)
    };
    let mut y = vec![0.0; x.len()];
    let (mean, inv_std) = kernels::layer_norm(width, 1e-5, &x, &gamma, &beta, &mut y);
    let (mut dx, mut dgamma, mut dbeta) = (vec![0.0; x.len()], vec![0.0; width], vec![0.0; width]);
    kernels::layer_norm_backward(
        width,
        &x,
        &gamma,
        (&mean, &inv_std),
        &r,
        &mut dx,
        &mut dgamma,
        &mut dbeta,
    );
    check_gradient(&x, &dx, |x| loss(x, &gamma, &beta), 1e-2, 2e-2);
    check_gradient(&gamma, &dgamma, |g| loss(&x, g, &beta), 1e-2, 1e-3);
    check_gradient(&beta, &dbeta, |b| loss(&x, &gamma, b), 1e-2, 1e-3);
}

proptest! {
    /// Max pooling against the definition: each output the largest input its window
    /// covers (the first of equals, in row-major order), with padding, dilation and
    /// windows that overhang the input (ceil mode).
    #[test]
    fn max_pooling_takes_each_windows_first_largest(
        h in 1usize..9,
        w in 1usize..9,
        k in (1usize..4, 1usize..4),
        s in (1usize..3, 1usize..3),
        d in prop::sample::select(vec![(1usize, 1usize), (2, 1)]),
        pad in (0usize..2, 0usize..2),
        ceil in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let extent = |n: usize, k: usize, s: usize, d: usize, p: usize| {
            let span = n + 2 * p;
            let reach = d * (k - 1) + 1;
            (span >= reach).then(|| {
                let steps = span - reach;
                if ceil { steps.div_ceil(s) + 1 } else { steps / s + 1 }
            })
        };
        let (Some(oh), Some(ow)) = (extent(h, k.0, s.0, d.0, pad.0), extent(w, k.1, s.1, d.1, pad.1)) else {
            return Ok(());
        };
        let pool = Pool2d {
            planes: 2,
            input: (h, w),
            kernel: k,
            stride: s,
            dilation: d,
            padding: [pad.0, pad.1, pad.0, pad.1],
            output: (oh, ow),
        };
        // Few distinct values, so that windows hold equals.
        let x: Vec<f32> = values(2 * h * w, seed).iter().map(|v| (v * 3.0).round()).collect();
        let mut y = vec![0.0; 2 * oh * ow];
        let argmax = pool.max(&x, &mut y);
        for p in 0..2 {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut best, mut at) = (f32::NEG_INFINITY, 0usize);
                    for ky in 0..k.0 {
                        for kx in 0..k.1 {
                            let iy = (oy * s.0 + ky * d.0) as isize - pad.0 as isize;
                            let ix = (ox * s.1 + kx * d.1) as isize - pad.1 as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            let i = (p * h + iy as usize) * w + ix as usize;
                            if x[i] > best {
                                (best, at) = (x[i], i);
                            }
                        }
                    }
                    let o = (p * oh + oy) * ow + ox;
                    prop_assert_eq!(y[o], best, "output {} of {:?}", o, pool);
                    if best > f32::NEG_INFINITY {
                        prop_assert_eq!(argmax[o] as usize, at, "argmax {} of {:?}", o, pool);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The matrix product against an f64 sum, every transposition, `beta` accumulating:
    /// few rows against a long transposed operand (a dense layer at a small batch, which
    /// runs as dot products) and the general case.
    #[test]
    fn gemm_is_the_matrix_product(
        m in prop::sample::select(vec![1usize, 2, 7, 9, 33]),
        k in prop::sample::select(vec![3usize, 255, 256, 300]),
        n in prop::sample::select(vec![1usize, 17, 40]),
        trans_a in any::<bool>(),
        trans_b in any::<bool>(),
        beta in prop::sample::select(vec![0.0f32, 0.5]),
        seed in any::<u64>(),
    ) {
        let (a, b) = (values(m * k, seed), values(k * n, seed ^ 1));
        let mut c = values(m * n, seed ^ 2);
        let before = c.clone();
        kernels::gemm(m, k, n, 1.5, &a, trans_a, &b, trans_b, beta, &mut c);
        for i in 0..m {
            for j in 0..n {
                let terms: Vec<f64> = (0..k)
                    .map(|p| {
                        let x = if trans_a { a[p * m + i] } else { a[i * k + p] };
                        let y = if trans_b { b[j * k + p] } else { b[p * n + j] };
                        f64::from(x) * f64::from(y)
                    })
                    .collect();
                let kept = f64::from(beta) * f64::from(before[i * n + j]);
                let want = 1.5 * terms.iter().sum::<f64>() + kept;
                // An f32 sum's rounding scales with its terms' magnitudes, not its value:
                // a sum that cancels to near zero is still within 1e-6 of them.
                let magnitude = 1.5 * terms.iter().map(|t| t.abs()).sum::<f64>() + kept.abs();
                let error = (f64::from(c[i * n + j]) - want).abs();
                prop_assert!(
                    error <= 1e-6 * (1.0 + magnitude),
                    "C[{i}][{j}] = {} against {want} (terms of magnitude {magnitude})",
                    c[i * n + j]
                );
            }
        }
    }
}
