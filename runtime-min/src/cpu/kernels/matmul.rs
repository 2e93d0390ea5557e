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
