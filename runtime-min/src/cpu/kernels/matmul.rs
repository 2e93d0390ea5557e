//! Matrix products: the `gemm` crate's packed kernels, large products cut into blocks that
//! rayon runs in parallel.

use rayon::prelude::*;

/// `C = alpha·op(A)·op(B) + beta·C` for row-major `A` (`m×k`, or `k×m` when `trans_a`),
/// `B` (`k×n`, or `n×k` when `trans_b`) and `C` (`m×n`).
///
/// Large products are cut into blocks of rows of `C` (or of columns, when `C` has few
/// rows) that rayon runs in parallel; each block is one `gemm::gemm` call. Inside an
/// already parallel loop (a convolution's samples) the blocks are stolen as threads free
/// up, so nothing is oversubscribed.
#[allow(clippy::too_many_arguments, reason = "the BLAS signature")]
pub fn gemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    trans_a: bool,
    b: &[f32],
    trans_b: bool,
    beta: f32,
    c: &mut [f32],
) {
    gemm_in(true, m, k, n, alpha, a, trans_a, b, trans_b, beta, c, n);
}

/// [`gemm`], cut into parallel blocks only when `split` (callers that already run one
/// product per thread pass `false`), with `C`'s rows `ldc` apart.
#[allow(clippy::too_many_arguments, reason = "the BLAS signature")]
pub(super) fn gemm_in(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    trans_a: bool,
    b: &[f32],
    trans_b: bool,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(
        a.len() >= m * k
            && b.len() >= k * n
            && ldc >= n
            && (m == 0 || c.len() >= (m - 1) * ldc + n),
        "gemm operand sizes"
    );
    let (rsa, csa) = if trans_a { (1, m) } else { (k, 1) };
    let (rsb, csb) = if trans_b { (1, k) } else { (n, 1) };
    let a = Strided {
        at: a.as_ptr(),
        rows: rsa,
        columns: csa,
    };
    let b = Strided {
        at: b.as_ptr(),
        rows: rsb,
        columns: csb,
    };
    // SAFETY: the assert above bounds A, B and C for these strides.
    unsafe { gemm_raw(split, m, k, n, alpha, a, b, beta, c.as_mut_ptr(), ldc) }
}

/// A read-only matrix operand: its first element and the distance between rows and
/// between columns.
#[derive(Clone, Copy)]
pub(super) struct Strided {
    pub(super) at: *const f32,
    pub(super) rows: usize,
    pub(super) columns: usize,
}

/// [`gemm_in`] on raw operands: `C` (`m×n`, rows `ldc` apart, from `c`) =
/// `alpha·A·B + beta·C`.
///
/// # Safety
/// `a` must address `m×k` elements, `b` `k×n`, and `c` `m×n` that nothing else reads or
/// writes during the call.
#[allow(clippy::too_many_arguments, reason = "the BLAS signature")]
pub(super) unsafe fn gemm_raw(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Strided,
    b: Strided,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    if m <= FEW_ROWS && a.columns == 1 && b.rows == 1 && k >= 256 {
        // SAFETY: the caller's bounds, passed on.
        unsafe { dots(split, m, k, n, alpha, a, b, beta, c, ldc) };
        return;
    }
    let threads = rayon::current_num_threads();
    // Below ~4 MFLOP a block costs more to schedule than to compute.
    let blocks = if split && threads > 1 && m * n * k >= 1 << 21 {
        threads
    } else {
        1
    };
    let (a_at, b_at, c_at) = (a.at as usize, b.at as usize, c as usize);
    let block = |i: usize, rows: bool, size: usize| {
        let lo = i * size;
        let (len, total) = if rows {
            (size.min(m.saturating_sub(lo)), m)
        } else {
            (size.min(n.saturating_sub(lo)), n)
        };
        if lo >= total || len == 0 {
            return;
        }
        // SAFETY: the caller bounds A, B and C; a block reads rows `lo..lo + len` of A (or
        // columns of B) and writes the matching rows (columns) of C, which no other block
        // writes, so the blocks' writes are disjoint.
        unsafe {
            let (a_ptr, b_ptr, c_ptr, mm, nn) = if rows {
                (
                    (a_at as *const f32).add(lo * a.rows),
                    b_at as *const f32,
                    (c_at as *mut f32).add(lo * ldc),
                    len,
                    n,
                )
            } else {
                (
                    a_at as *const f32,
                    (b_at as *const f32).add(lo * b.columns),
                    (c_at as *mut f32).add(lo),
                    m,
                    len,
                )
            };
            // gemm's `dst = alpha·dst + beta·lhs·rhs`: BLAS's alpha and beta swap places.
            gemm::gemm(
                mm,
                nn,
                k,
                c_ptr,
                1,
                ldc as isize,
                beta != 0.0,
                a_ptr,
                a.columns as isize,
                a.rows as isize,
                b_ptr,
                b.columns as isize,
                b.rows as isize,
                beta,
                alpha,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    };
    if blocks == 1 {
        block(0, true, m);
        return;
    }
    // Each block packs its share of one operand and all of the other: cut the larger
    // dimension.
    let rows = m >= n;
    let size = if rows {
        m.div_ceil(blocks)
    } else {
        n.div_ceil(blocks)
    };
    (0..blocks)
        .into_par_iter()
        .for_each(|i| block(i, rows, size));
}

/// Rows of `A` up to which a product with a transposed `B` runs as dot products.
const FEW_ROWS: usize = 8;

/// [`gemm_raw`] for a few rows of `A` against a `B` whose columns are contiguous (a
/// dense layer's weight, `n×k` row-major, at a small batch): every element of `C` one dot
/// product, each weight row read once while `A`'s rows stay in cache. The product is
/// bound by reading `B`; packing it first, as a GEMM does, reads it twice (VGG16's first
/// dense layer, 25088×4096, took 31 ms at batch 2 through the GEMM).
///
/// # Safety
/// As [`gemm_raw`], with `a.columns == 1` and `b.rows == 1`.
#[allow(clippy::too_many_arguments, reason = "the BLAS signature")]
unsafe fn dots(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Strided,
    b: Strided,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    // Columns per task: whole weight rows, enough to amortize scheduling.
    const COLUMNS: usize = 16;
    let (a_at, b_at, c_at) = (a.at as usize, b.at as usize, c as usize);
    let task = |t: usize| {
        for j in t * COLUMNS..((t + 1) * COLUMNS).min(n) {
            // SAFETY: the caller bounds A (m rows of k, `a.rows` apart), B (column j at
            // `j·b.columns`, k contiguous) and C; task t alone writes columns of its block.
            unsafe {
                let w = std::slice::from_raw_parts((b_at as *const f32).add(j * b.columns), k);
                for i in 0..m {
                    let x = std::slice::from_raw_parts((a_at as *const f32).add(i * a.rows), k);
                    let out = (c_at as *mut f32).add(i * ldc + j);
                    let product = alpha * dot(x, w);
                    *out = if beta == 0.0 {
                        product
                    } else {
                        product + beta * *out
                    };
                }
            }
        }
    };
    let tasks = n.div_ceil(COLUMNS);
    if split && rayon::current_num_threads() > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// `Σ xᵢ·yᵢ` over 16 running sums, so the loop vectorizes; the order is fixed. (AVX2 and
/// FMA made VGG16's first dense layer only 5% faster: reading the weights bounds it.)
fn dot(x: &[f32], y: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut sums = [0.0f32; LANES];
    let (xs, ys) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let tail: f32 = xs
        .remainder()
        .iter()
        .zip(ys.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in xs.zip(ys) {
        for l in 0..LANES {
            sums[l] += a[l] * b[l];
        }
    }
    sums.iter().sum::<f32>() + tail
}
