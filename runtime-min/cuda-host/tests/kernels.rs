//! Every CUDA kernel, run on the host (one thread), against the CPU backend's kernels or a
//! direct computation of the same formula: the arithmetic and the indexing of the GPU code
//! are checked without a GPU.
#![allow(clippy::many_single_char_names, reason = "the kernels' own names")]

use ralpc_cuda_host as k;
use ralpc_runtime_min::cpu::kernels as cpu;
use ralpc_runtime_min::cuda::kernels::{BinaryOp, Strides, UnaryOp, Window};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

#[track_caller]
fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: {g} against {w}"
        );
    }
}

#[test]
fn binary_broadcasts_like_numpy() {
    let (a_shape, b_shape, out) = ([2, 1, 4], [3, 1], [2, 3, 4]);
    let a = values(8, 1);
    let b = values(3, 2);
    let s = Strides::broadcast(&out, &a_shape, &b_shape).unwrap();
    for (op, f) in [
        (BinaryOp::Add, (|x, y| x + y) as fn(f32, f32) -> f32),
        (BinaryOp::Sub, |x, y| x - y),
        (BinaryOp::Mul, |x, y| x * y),
        (BinaryOp::Div, |x, y| x / y),
        (BinaryOp::Max, f32::max),
        (BinaryOp::Min, f32::min),
    ] {
        let mut y = vec![0.0; 24];
        // SAFETY: buffers of the sizes the strides describe.
        unsafe { k::binary(y.as_mut_ptr(), a.as_ptr(), b.as_ptr(), s, 24, op as i32) };
        let want: Vec<f32> = (0..24)
            .map(|i| {
                let (n, r, c) = (i / 12, (i / 4) % 3, i % 4);
                f(a[n * 4 + c], b[r])
            })
            .collect();
        assert_eq!(y, want, "{op:?}");
    }
    assert!(Strides::broadcast(&[2, 3], &[2, 2], &[3]).is_err());
}

#[test]
fn strided_copies_transpose_and_scatter_back() {
    // x [2, 3, 4] → transpose(0, 2, 1) → [2, 4, 3].
    let x = values(24, 3);
    let view = Strides::view(&[2, 4, 3], &[12, 1, 4]).unwrap();
    let mut t = vec![0.0; 24];
    // SAFETY: sizes as the view.
    unsafe { k::gather_strided(t.as_mut_ptr(), x.as_ptr(), view, 0, 24) };
    for n in 0..2 {
        for c in 0..4 {
            for r in 0..3 {
                assert_eq!(t[(n * 4 + c) * 3 + r], x[(n * 3 + r) * 4 + c]);
            }
        }
    }
    let mut back = vec![0.0; 24];
    // SAFETY: as above.
    unsafe { k::scatter_strided(back.as_mut_ptr(), t.as_ptr(), view, 0, 24, 0) };
    assert_eq!(back, x);
    // Accumulating a broadcast's gradient: [3] read as [2, 3] sums over the rows.
    let row = Strides::view(&[2, 3], &[0, 1]).unwrap();
    let mut g = vec![0.0; 3];
    let dy = values(6, 4);
    // SAFETY: as above.
    unsafe { k::scatter_strided(g.as_mut_ptr(), dy.as_ptr(), row, 0, 6, 1) };
    close(&g, &[dy[0] + dy[3], dy[1] + dy[4], dy[2] + dy[5]], 1e-6);
}

/// The `unary` kernel on `input`.
fn device_unary(op: UnaryOp, input: &[f32], alpha: f32, beta: f32) -> Vec<f32> {
    let mut y = vec![0.0; input.len()];
    // SAFETY: equal lengths.
    unsafe {
        k::unary(
            y.as_mut_ptr(),
            input.as_ptr(),
            input.len() as i64,
            op as i32,
            alpha,
            beta,
        )
    };
    y
}

/// The `unary_backward` kernel from `dy` and what the forward kept (`x` or `y`).
fn device_unary_backward(op: UnaryOp, dy: &[f32], kept: &[f32], alpha: f32, beta: f32) -> Vec<f32> {
    let mut dx = vec![0.0; dy.len()];
    // SAFETY: equal lengths.
    unsafe {
        k::unary_backward(
            dx.as_mut_ptr(),
            dy.as_ptr(),
            kept.as_ptr(),
            dy.len() as i64,
            op as i32,
            alpha,
            beta,
        )
    };
    dx
}

/// `dx` against the central difference of `f` at each input times `dy`, away from the
/// `kinks`.
#[track_caller]
fn assert_central_difference(
    what: &str,
    f: impl Fn(f32) -> f32,
    x: &[f32],
    dy: &[f32],
    dx: &[f32],
    kinks: &[f32],
) {
    for i in 0..x.len() {
        let h = 1e-3 * x[i].abs().max(0.1);
        let (lo, hi) = (x[i] - h, x[i] + h);
        if kinks.iter().any(|&k| lo <= k && k <= hi) {
            continue;
        }
        let numeric = f64::from(f(hi) - f(lo)) / f64::from(2.0 * h) * f64::from(dy[i]);
        assert!(
            (f64::from(dx[i]) - numeric).abs() <= 1e-2 * (1.0 + numeric.abs()),
            "{what}'s gradient at {}: {} against {numeric}",
            x[i],
            dx[i]
        );
    }
}

/// The executor's own codes, which no IR function maps to (Clip's bounds, SiLU, a scale),
/// against their formulas.
#[test]
fn the_executors_own_unary_codes_and_their_gradients() {
    let x: Vec<f32> = values(64, 5).iter().map(|v| v * 3.0).collect();
    type Case = (UnaryOp, fn(f32) -> f32, f32, f32);
    let cases: [Case; 3] = [
        (UnaryOp::Clip, |v| v.clamp(0.1, 0.5), 0.1, 0.5),
        (UnaryOp::Silu, |v| v / (1.0 + (-v).exp()), 0.0, 0.0),
        (UnaryOp::Scale, |v| 0.25 * v, 0.25, 0.0),
    ];
    for (op, f, alpha, beta) in cases {
        let want: Vec<f32> = x.iter().map(|&v| f(v)).collect();
        close(&device_unary(op, &x, alpha, beta), &want, 1e-5);
        let dy = values(x.len(), 6);
        let dx = device_unary_backward(op, &dy, &x, alpha, beta);
        assert_central_difference(&format!("{op:?}"), f, &x, &dy, &dx, &[0.1, 0.5]);
    }
    // GELU's backward against the CPU backend's kernel.
    let mut dgelu = vec![0.0; x.len()];
    let dy = values(x.len(), 7);
    cpu::gelu_backward(false, &x, &dy, &mut dgelu);
    close(
        &device_unary_backward(UnaryOp::Gelu, &dy, &x, 0.0, 0.0),
        &dgelu,
        1e-5,
    );
}

#[test]
fn fills_updates_and_the_optimizer() {
    let mut y = vec![1.0; 5];
    let x = values(5, 8);
    // SAFETY: length 5 throughout.
    unsafe {
        k::fill(y.as_mut_ptr(), 5, 2.0);
        k::axpby(y.as_mut_ptr(), x.as_ptr(), 5, 3.0, 0.5);
    }
    close(
        &y,
        &x.iter().map(|v| 3.0 * v + 1.0).collect::<Vec<_>>(),
        1e-6,
    );
    let (mut w, mut v) = (values(50, 9), values(50, 10));
    let g = values(50, 11);
    let (mut w_cpu, mut v_cpu) = (w.clone(), v.clone());
    // SAFETY: length 50 throughout.
    unsafe { k::sgd_momentum(w.as_mut_ptr(), v.as_mut_ptr(), g.as_ptr(), 50, 0.05, 0.9) };
    cpu::sgd_momentum(&mut w_cpu, &g, &mut v_cpu, 0.05, 0.9);
    assert_eq!(w, w_cpu);
    assert_eq!(v, v_cpu);
}

#[test]
fn reductions_sum_the_middle_axis() {
    let x = values(2 * 5 * 3, 12);
    let mut out = vec![0.0; 6];
    // SAFETY: [2, 5, 3] in, [2, 3] out.
    unsafe { k::reduce_axis(out.as_mut_ptr(), x.as_ptr(), 2, 5, 3, 0) };
    let want: Vec<f32> = (0..6)
        .map(|i| (0..5).map(|k| x[(i / 3) * 15 + k * 3 + i % 3]).sum())
        .collect();
    close(&out, &want, 1e-6);
    // SAFETY: as above.
    unsafe { k::reduce_axis(out.as_mut_ptr(), x.as_ptr(), 2, 5, 3, 1) };
    close(
        &out,
        &want.iter().map(|v| v / 5.0).collect::<Vec<_>>(),
        1e-6,
    );
}

#[test]
fn softmax_and_the_losses_match_the_cpu() {
    let (rows, n) = (6usize, 10usize);
    let x: Vec<f32> = values(rows * n, 13).iter().map(|v| v * 4.0).collect();
    let mut y = vec![0.0; rows * n];
    let mut want = vec![0.0; rows * n];
    // SAFETY: [rows, n] throughout.
    unsafe { k::softmax_rows(y.as_mut_ptr(), x.as_ptr(), rows as i64, n as i64, 0) };
    cpu::softmax(n, &x, &mut want);
    close(&y, &want, 1e-6);
    let dy = values(rows * n, 14);
    let mut dx = vec![0.0; rows * n];
    let mut want_dx = vec![0.0; rows * n];
    // SAFETY: as above.
    unsafe {
        k::softmax_rows_backward(
            dx.as_mut_ptr(),
            dy.as_ptr(),
            y.as_ptr(),
            rows as i64,
            n as i64,
            0,
        )
    };
    cpu::softmax_backward(n, &want, &dy, &mut want_dx);
    close(&dx, &want_dx, 1e-5);
    // Log-softmax: log of the softmax, and its gradient dy - softmax · Σdy.
    let mut log_y = vec![0.0; rows * n];
    // SAFETY: as above.
    unsafe { k::softmax_rows(log_y.as_mut_ptr(), x.as_ptr(), rows as i64, n as i64, 1) };
    close(
        &log_y,
        &want.iter().map(|p| p.ln()).collect::<Vec<_>>(),
        1e-5,
    );
    // SAFETY: as above.
    unsafe {
        k::softmax_rows_backward(
            dx.as_mut_ptr(),
            dy.as_ptr(),
            log_y.as_ptr(),
            rows as i64,
            n as i64,
            1,
        )
    };
    for r in 0..rows {
        let total: f32 = dy[r * n..(r + 1) * n].iter().sum();
        for j in 0..n {
            let want = dy[r * n + j] - want[r * n + j] * total;
            assert!((dx[r * n + j] - want).abs() < 1e-5);
        }
    }
    // Cross-entropy of a rank's 6 rows of a global batch of 12.
    let labels: Vec<i64> = (0..rows as i64).map(|r| (r * 7) % n as i64).collect();
    let mut loss = vec![0.0; rows];
    let mut dlogits = vec![0.0; rows * n];
    // SAFETY: as above; one loss per row.
    unsafe {
        k::cross_entropy(
            loss.as_mut_ptr(),
            dlogits.as_mut_ptr(),
            x.as_ptr(),
            labels.as_ptr(),
            rows as i64,
            n as i64,
            12,
        )
    };
    let mut want_d = vec![0.0; rows * n];
    let cpu_labels: Vec<u32> = labels.iter().map(|&l| l as u32).collect();
    let want_loss = cpu::softmax_cross_entropy(n, &x, &cpu_labels, 12.0, &mut want_d);
    let got_loss: f64 = loss.iter().map(|&l| f64::from(l)).sum();
    assert!(
        (got_loss - want_loss).abs() < 1e-5,
        "{got_loss} against {want_loss}"
    );
    close(&dlogits, &want_d, 1e-5);
    // The same rows cut into two class pieces (a vocabulary-parallel head): each piece's
    // statistics, then its gradient from the rows' log-sum-exp over both.
    let half = n / 2;
    let pieces: Vec<(usize, Vec<f32>)> = [(0, half), (half, n - half)]
        .iter()
        .map(|&(first, width)| {
            let cut: Vec<f32> = (0..rows)
                .flat_map(|r| x[r * n + first..r * n + first + width].to_vec())
                .collect();
            (first, cut)
        })
        .collect();
    let mut all = Vec::new();
    for (first, cut) in &pieces {
        let width = cut.len() / rows;
        let mut stats = vec![0.0; 3 * rows];
        // SAFETY: rows·width logits, rows labels, 3·rows statistics.
        unsafe {
            k::class_stats(
                stats.as_mut_ptr(),
                cut.as_ptr(),
                labels.as_ptr(),
                rows as i64,
                width as i64,
                *first as i64,
            )
        };
        let want = cpu::class_piece_statistics(width, cut, &cpu_labels, *first);
        close(&stats, &want, 1e-5);
        all.push(stats);
    }
    for (first, cut) in &pieces {
        let width = cut.len() / rows;
        let mut want = vec![0.0; cut.len()];
        let loss =
            cpu::class_piece_cross_entropy(width, cut, &cpu_labels, *first, &all, 12.0, &mut want);
        assert!(
            (loss - want_loss).abs() < 1e-5,
            "{loss} against {want_loss}"
        );
        let lse: Vec<f32> = (0..rows)
            .map(|r| {
                let max = all
                    .iter()
                    .map(|s| s[3 * r])
                    .fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = all
                    .iter()
                    .map(|s| f64::from(s[3 * r + 1]) * f64::from(s[3 * r] - max).exp())
                    .sum();
                (f64::from(max) + sum.ln()) as f32
            })
            .collect();
        let mut got = vec![0.0; cut.len()];
        // SAFETY: rows·width logits and gradients, rows log-sum-exps and labels.
        unsafe {
            k::class_piece_grad(
                got.as_mut_ptr(),
                cut.as_ptr(),
                lse.as_ptr(),
                labels.as_ptr(),
                rows as i64,
                width as i64,
                *first as i64,
                12.0,
            )
        };
        close(&got, &want, 1e-5);
    }
    // Mean squared error.
    let t = values(rows * n, 15);
    let mut l = vec![0.0; rows * n];
    // SAFETY: as above.
    unsafe {
        k::mse(
            l.as_mut_ptr(),
            dx.as_mut_ptr(),
            x.as_ptr(),
            t.as_ptr(),
            (rows * n) as i64,
            120,
        )
    };
    for i in 0..rows * n {
        let d = x[i] - t[i];
        assert!((l[i] - d * d / 120.0).abs() < 1e-6);
        assert!((dx[i] - 2.0 * d / 120.0).abs() < 1e-6);
    }
}

#[test]
fn layer_norm_matches_the_cpu() {
    let (rows, n) = (5usize, 16usize);
    let x: Vec<f32> = values(rows * n, 16).iter().map(|v| v * 2.0 + 0.5).collect();
    let gamma: Vec<f32> = values(n, 17).iter().map(|v| v + 1.0).collect();
    let beta = values(n, 18);
    let mut y = vec![0.0; rows * n];
    let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
    // SAFETY: [rows, n] and [n], [rows].
    unsafe {
        k::layer_norm(
            y.as_mut_ptr(),
            mean.as_mut_ptr(),
            rstd.as_mut_ptr(),
            x.as_ptr(),
            gamma.as_ptr(),
            beta.as_ptr(),
            rows as i64,
            n as i64,
            1e-5,
        )
    };
    let mut want = vec![0.0; rows * n];
    let (want_mean, want_rstd) = cpu::layer_norm(n, 1e-5, &x, &gamma, &beta, &mut want);
    close(&y, &want, 1e-5);
    close(&mean, &want_mean, 1e-5);
    close(&rstd, &want_rstd, 1e-5);
    let dy = values(rows * n, 19);
    let mut dx = vec![0.0; rows * n];
    // SAFETY: as above.
    unsafe {
        k::layer_norm_backward(
            dx.as_mut_ptr(),
            dy.as_ptr(),
            x.as_ptr(),
            gamma.as_ptr(),
            mean.as_ptr(),
            rstd.as_ptr(),
            rows as i64,
            n as i64,
        )
    };
    let (mut want_dx, mut dgamma, mut dbeta) = (vec![0.0; rows * n], vec![0.0; n], vec![0.0; n]);
    cpu::layer_norm_backward(
        n,
        &x,
        &gamma,
        (&want_mean, &want_rstd),
        &dy,
        &mut want_dx,
        &mut dgamma,
        &mut dbeta,
    );
    close(&dx, &want_dx, 1e-4);
}

#[test]
fn batch_norm_matches_the_cpu() {
    let (batch, channels, spatial) = (3usize, 4usize, 5usize);
    let len = batch * channels * spatial;
    let x: Vec<f32> = values(len, 20).iter().map(|v| v * 3.0 - 0.2).collect();
    let gamma: Vec<f32> = values(channels, 21).iter().map(|v| v + 1.0).collect();
    let beta = values(channels, 22);
    let bn = cpu::BatchNorm {
        channels,
        spatial,
        epsilon: 1e-5,
    };
    let mut want = vec![0.0; len];
    let (want_mean, want_rstd) = bn.forward(&x, &gamma, &beta, &mut want);
    let (mut mean, mut rstd, mut y) = (vec![0.0; channels], vec![0.0; channels], vec![0.0; len]);
    // SAFETY: [batch, channels, spatial] and per-channel vectors.
    unsafe {
        k::channel_stats(
            mean.as_mut_ptr(),
            rstd.as_mut_ptr(),
            x.as_ptr(),
            batch as i64,
            channels as i64,
            spatial as i64,
            1e-5,
        );
        k::channel_affine(
            y.as_mut_ptr(),
            x.as_ptr(),
            mean.as_ptr(),
            rstd.as_ptr(),
            gamma.as_ptr(),
            beta.as_ptr(),
            channels as i64,
            spatial as i64,
            len as i64,
            0,
            1e-5,
        );
    }
    close(&mean, &want_mean, 1e-5);
    close(&rstd, &want_rstd, 1e-4);
    close(&y, &want, 1e-4);
    let dy = values(len, 23);
    let (mut dx, mut dgamma, mut dbeta) =
        (vec![0.0; len], vec![0.0; channels], vec![0.0; channels]);
    // SAFETY: as above.
    unsafe {
        k::batch_norm_backward(
            dx.as_mut_ptr(),
            dgamma.as_mut_ptr(),
            dbeta.as_mut_ptr(),
            dy.as_ptr(),
            x.as_ptr(),
            mean.as_ptr(),
            rstd.as_ptr(),
            gamma.as_ptr(),
            batch as i64,
            channels as i64,
            spatial as i64,
        )
    };
    let (mut want_dx, mut want_dg, mut want_db) =
        (vec![0.0; len], vec![0.0; channels], vec![0.0; channels]);
    bn.backward(
        &x,
        &gamma,
        (&want_mean, &want_rstd),
        &dy,
        &mut want_dx,
        &mut want_dg,
        &mut want_db,
    );
    close(&dx, &want_dx, 1e-4);
    close(&dgamma, &want_dg, 1e-4);
    close(&dbeta, &want_db, 1e-5);
    // Inference: running statistics, the variance given.
    let var: Vec<f32> = want_rstd.iter().map(|r| 1.0 / (r * r) - 1e-5).collect();
    // SAFETY: as above.
    unsafe {
        k::channel_affine(
            y.as_mut_ptr(),
            x.as_ptr(),
            mean.as_ptr(),
            var.as_ptr(),
            gamma.as_ptr(),
            beta.as_ptr(),
            channels as i64,
            spatial as i64,
            len as i64,
            1,
            1e-5,
        )
    };
    close(&y, &want, 1e-3);
}

/// Pooling geometries: plain, padded with a ceil-mode overhang, dilated.
fn pools() -> Vec<cpu::Pool2d> {
    let mut padded = cpu::Pool2d::simple(6, (7, 6), (3, 3), (2, 2));
    padded.padding = [1, 1, 1, 0];
    padded.output = (4, 3); // ceil mode: the last window overhangs the padding
    let mut dilated = cpu::Pool2d::simple(2, (9, 9), (2, 3), (1, 2));
    dilated.dilation = (3, 2);
    dilated.output = (6, 3);
    vec![
        cpu::Pool2d::simple(4, (6, 6), (2, 2), (2, 2)),
        padded,
        dilated,
    ]
}

#[test]
fn pooling_matches_the_cpu() {
    for p in pools() {
        let g = Window::from(&p);
        let input = p.planes * p.input.0 * p.input.1;
        let output = p.planes * p.output.0 * p.output.1;
        let x = values(input, 24);
        let dy = values(output, 25);
        let mut want = vec![0.0; output];
        let argmax_cpu = p.max(&x, &mut want);
        let (mut y, mut argmax) = (vec![0.0; output], vec![0i64; output]);
        let mut dx = vec![0.0; input];
        // SAFETY: the geometry's sizes.
        unsafe {
            k::max_pool(y.as_mut_ptr(), argmax.as_mut_ptr(), x.as_ptr(), g);
            k::max_pool_backward(dx.as_mut_ptr(), dy.as_ptr(), argmax.as_ptr(), g);
        }
        assert_eq!(y, want, "{p:?}");
        assert_eq!(
            argmax,
            argmax_cpu.iter().map(|&a| i64::from(a)).collect::<Vec<_>>()
        );
        let mut want_dx = vec![0.0; input];
        cpu::max_pool_backward(&argmax_cpu, &dy, &mut want_dx);
        close(&dx, &want_dx, 1e-6);
        for count_pad in [false, true] {
            p.average(count_pad, &x, &mut want);
            let mut dx = vec![0.0; input];
            // SAFETY: as above.
            unsafe {
                k::avg_pool(y.as_mut_ptr(), x.as_ptr(), g, i32::from(count_pad));
                k::avg_pool_backward(dx.as_mut_ptr(), dy.as_ptr(), g, i32::from(count_pad));
            }
            close(&y, &want, 1e-6);
            let mut want_dx = vec![0.0; input];
            p.average_backward(count_pad, &dy, &mut want_dx);
            close(&dx, &want_dx, 1e-6);
        }
    }
}

/// Convolution as im2col + GEMM equals the CPU backend's convolution; col2im is im2col's
/// adjoint (⟨im2col x, c⟩ = ⟨x, col2im c⟩).
#[test]
fn im2col_convolution_matches_the_cpu() {
    let conv = cpu::Conv2d {
        batch: 2,
        in_channels: 3,
        out_channels: 4,
        input: (7, 6),
        kernel: (3, 2),
        stride: (2, 1),
        dilation: (1, 2),
        padding: [1, 0, 1, 1],
        groups: 1,
    };
    let (oh, ow) = conv.output();
    let (h, w) = conv.input;
    let x = values(conv.batch * conv.in_channels * h * w, 26);
    let weights = values(conv.out_channels * conv.in_channels * 6, 27);
    let mut want = vec![0.0; conv.batch * conv.out_channels * oh * ow];
    conv.forward(&x, &weights, None, &mut want);
    let g = Window {
        planes: conv.in_channels as i64,
        h: h as i64,
        w: w as i64,
        oh: oh as i64,
        ow: ow as i64,
        kh: 3,
        kw: 2,
        sh: 2,
        sw: 1,
        pt: 1,
        pl: 0,
        pb: 1,
        pr: 1,
        dh: 1,
        dw: 2,
    };
    let rows = conv.in_channels * 6;
    let spatial = oh * ow;
    let image = conv.in_channels * h * w;
    for n in 0..conv.batch {
        let mut cols = vec![0.0; rows * spatial];
        // SAFETY: image n of the batch in, [rows, spatial] out.
        unsafe { k::im2col(cols.as_mut_ptr(), x.as_ptr(), (n * image) as i64, g, 1) };
        for o in 0..conv.out_channels {
            for p in 0..spatial {
                let v: f32 = (0..rows)
                    .map(|r| weights[o * rows + r] * cols[r * spatial + p])
                    .sum();
                let at = (n * conv.out_channels + o) * spatial + p;
                assert!((v - want[at]).abs() < 1e-5, "{v} against {}", want[at]);
            }
        }
        let c = values(rows * spatial, 28);
        let mut back = vec![0.0; conv.batch * image];
        // SAFETY: into image n of a batch-sized gradient.
        unsafe { k::col2im(back.as_mut_ptr(), (n * image) as i64, c.as_ptr(), g, 1) };
        let lhs: f32 = cols.iter().zip(&c).map(|(a, b)| a * b).sum();
        let rhs: f32 = x.iter().zip(&back).map(|(a, b)| a * b).sum();
        let others = back.chunks(image).enumerate().filter(|&(m, _)| m != n);
        assert!(others.flat_map(|(_, b)| b).all(|&v| v == 0.0));
        assert!((lhs - rhs).abs() < 1e-4, "{lhs} against {rhs}");
    }
    // Both images at once: the same columns, one after the other.
    let mut both = vec![0.0; conv.batch * rows * spatial];
    let mut one = vec![0.0; rows * spatial];
    // SAFETY: two images in, [2, rows, spatial] out.
    unsafe { k::im2col(both.as_mut_ptr(), x.as_ptr(), 0, g, 2) };
    for n in 0..conv.batch {
        // SAFETY: one image.
        unsafe { k::im2col(one.as_mut_ptr(), x[n * image..].as_ptr(), 0, g, 1) };
        assert_eq!(
            &both[n * rows * spatial..(n + 1) * rows * spatial],
            &one[..]
        );
    }
}

/// Every IR function the device has ([`UnaryOp::of`]) computes what the CPU backend does,
/// its backward kernel the CPU forward's central difference, from what the IR keeps.
#[test]
fn every_device_unary_matches_the_cpu_backend() {
    use ralpc_ir::Unary;
    let every = [
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
        Unary::Sqrt,
        Unary::Neg,
        Unary::Exp,
        Unary::Reciprocal,
        Unary::Log,
        Unary::Abs,
        Unary::Softplus,
        Unary::Softsign,
        Unary::Elu { alpha: 0.7 },
        Unary::Selu {
            alpha: 1.673_263_2,
            gamma: 1.050_701,
        },
        Unary::Mish,
        Unary::Celu { alpha: 0.5 },
    ];
    // The list covers every code the IR reaches (Clip, SiLU and Scale are the executor's
    // own, tested above).
    let mut reached: Vec<UnaryOp> = every
        .iter()
        .filter_map(|&u| UnaryOp::of(u))
        .map(|c| c.0)
        .collect();
    reached.sort_by_key(|&op| op as i32);
    reached.dedup();
    let own = [UnaryOp::Clip, UnaryOp::Silu, UnaryOp::Scale];
    let all: Vec<UnaryOp> = UnaryOp::ALL
        .iter()
        .copied()
        .filter(|op| !own.contains(op))
        .collect();
    assert_eq!(
        reached, all,
        "a device code no IR function in this list reaches"
    );
    let x: Vec<f32> = values(96, 11).iter().map(|v| v * 4.0).collect();
    let positive: Vec<f32> = x.iter().map(|v| v.abs() + 0.1).collect();
    for u in every {
        let (op, alpha, beta) = UnaryOp::of(u).unwrap_or_else(|| panic!("{u:?} on the device"));
        // The backward kernel reads the output for exactly the functions whose backward the
        // IR says reads it alone: the others find their input kept.
        let reads_output =
            ralpc_ir::Op::Unary(u).backward_reads() == ralpc_ir::BackwardReads::OUTPUTS;
        assert_eq!(op.backward_reads_output(), reads_output, "{u:?}");
        let input = if matches!(u, Unary::Sqrt | Unary::Log | Unary::Reciprocal) {
            &positive
        } else {
            &x
        };
        let cpu = |v: f32| ralpc_runtime_min::cpu::ops::unary_value(u, v);
        let want: Vec<f32> = input.iter().map(|&v| cpu(v)).collect();
        let got = device_unary(op, input, alpha, beta);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{u:?} at {}: {g} against the CPU's {w}",
                input[i]
            );
        }
        let dy = values(input.len(), 12);
        let kept = if op.backward_reads_output() {
            &got
        } else {
            input
        };
        let dx = device_unary_backward(op, &dy, kept, alpha, beta);
        // Away from the kinks (ReLU's, HardSigmoid's and HardSwish's corners).
        assert_central_difference(
            &format!("{u:?}"),
            cpu,
            input,
            &dy,
            &dx,
            &[0.0, -2.5, 2.5, -3.0, 3.0],
        );
    }
}
