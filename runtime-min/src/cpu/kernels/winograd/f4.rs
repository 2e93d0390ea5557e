//! F(4×4, 3×3): each 4×4 block of output from a 6×6 tile of input, 36 multiplies per input
//! channel instead of im2col's 144 (F(2×2, 3×3)'s 64). Its transforms have larger
//! coefficients (Bᵀ's 4 and 5, Aᵀ's 8, G's sixths), so it rounds a little more than F(2×2).

use std::ops::Range;

use super::super::conv::Conv2d;
use super::Tiling;

/// Winograd's F(4×4, 3×3).
pub(super) struct F4;

impl Tiling for F4 {
    const M: usize = 4;

    fn g_rows(g0: &[f32], g1: &[f32], g2: &[f32], rows: &mut [&mut [f32]]) {
        let [r0, r1, r2, r3, r4, r5] = rows else {
            unreachable!("F(4×4, 3×3) has 6 rows of G")
        };
        let (sixth, twelfth, twentyfourth) = (1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0);
        for k in 0..g0.len() {
            let (a, b, c) = (g0[k], g1[k], g2[k]);
            r0[k] = 0.25 * a;
            r1[k] = -(a + b + c) * sixth;
            r2[k] = -(a - b + c) * sixth;
            r3[k] = a * twentyfourth + b * twelfth + c * sixth;
            r4[k] = a * twentyfourth - b * twelfth + c * sixth;
            r5[k] = c;
        }
    }

    /// Bᵀ d B of every tile of tile rows `rows`: `v[ξ][c][tile]`.
    fn transform_input(conv: &Conv2d, x: &[f32], rows: Range<usize>, v: &mut [f32]) {
        let (h, w) = conv.input;
        let (_, ow) = conv.output();
        let tw = ow.div_ceil(4);
        let tiles = rows.len() * tw;
        let step = conv.in_channels * tiles;
        let (top, left) = (conv.padding[0], conv.padding[1]);
        let width = 4 * tw + 4;
        let mut line = vec![0.0f32; width];
        // Input columns by residue mod 4: q[r][t] = line[4t + r].
        let mut q = vec![0.0f32; 4 * (tw + 1)];
        // d B: per input row i, per column combination j, per tile.
        let mut db = vec![0.0f32; 36 * tw];
        for ch in 0..conv.in_channels {
            let plane = &x[ch * h * w..(ch + 1) * h * w];
            for (r, ty) in rows.clone().enumerate() {
                for i in 0..6 {
                    line.fill(0.0);
                    if let Some(yy) = (4 * ty + i).checked_sub(top).filter(|&yy| yy < h) {
                        let (lo, hi) = (left.min(width), (w + left).min(width));
                        if lo < hi {
                            line[lo..hi]
                                .copy_from_slice(&plane[yy * w + lo - left..yy * w + hi - left]);
                        }
                    }
                    for (k, quad) in line.chunks_exact(4).enumerate() {
                        for (res, &value) in quad.iter().enumerate() {
                            q[res * (tw + 1) + k] = value;
                        }
                    }
                    let col = |res: usize, shift: usize| &q[res * (tw + 1) + shift..][..tw];
                    let (d0, d1, d2, d3, d4, d5) = (
                        col(0, 0),
                        col(1, 0),
                        col(2, 0),
                        col(3, 0),
                        col(0, 1),
                        col(1, 1),
                    );
                    let mut row: Vec<&mut [f32]> = db[i * 6 * tw..(i + 1) * 6 * tw]
                        .chunks_exact_mut(tw)
                        .collect();
                    bt([d0, d1, d2, d3, d4, d5], &mut row);
                }
                let at = ch * tiles + r * tw;
                for j in 0..6 {
                    let d = |i: usize| &db[(i * 6 + j) * tw..(i * 6 + j + 1) * tw];
                    let (d0, d1, d2, d3, d4, d5) = (d(0), d(1), d(2), d(3), d(4), d(5));
                    bt([d0, d1, d2, d3, d4, d5], &mut six_rows(v, step, at, j, tw));
                }
            }
        }
    }

    /// Aᵀ m A of every tile of tile rows `rows`, plus the bias.
    ///
    /// # Safety
    /// `y` holds a sample's output, whose rows `4·rows` no one else touches meanwhile.
    unsafe fn transform_output(
        conv: &Conv2d,
        m: &[f32],
        rows: Range<usize>,
        bias: Option<&[f32]>,
        y: *mut f32,
    ) {
        let (oh, ow) = conv.output();
        let tw = ow.div_ceil(4);
        let tiles = rows.len() * tw;
        let o = conv.out_channels;
        let step = o * tiles;
        // Aᵀ m: per output row i of a tile (4), per column j (6), per tile.
        let mut am = vec![0.0f32; 24 * tw];
        let mut out = vec![0.0f32; 4 * tw];
        for oc in 0..o {
            let b = bias.map_or(0.0, |b| b[oc]);
            let plane = oc * oh * ow;
            for (r, ty) in rows.clone().enumerate() {
                let at = oc * tiles + r * tw;
                let mm = |p: usize| &m[p * step + at..p * step + at + tw];
                for j in 0..6 {
                    let (m0, m1, m2, m3, m4, m5) = (
                        mm(j),
                        mm(6 + j),
                        mm(12 + j),
                        mm(18 + j),
                        mm(24 + j),
                        mm(30 + j),
                    );
                    let (s0, rest) = am.split_at_mut(6 * tw);
                    let (s1, rest) = rest.split_at_mut(6 * tw);
                    let (s2, s3) = rest.split_at_mut(6 * tw);
                    let span = j * tw..(j + 1) * tw;
                    let (s0, s1, s2, s3) = (
                        &mut s0[span.clone()],
                        &mut s1[span.clone()],
                        &mut s2[span.clone()],
                        &mut s3[span],
                    );
                    for t in 0..tw {
                        let (s, d) = (m1[t] + m2[t], m1[t] - m2[t]);
                        let (s2_, d2_) = (m3[t] + m4[t], m3[t] - m4[t]);
                        s0[t] = m0[t] + s + s2_;
                        s1[t] = d + 2.0 * d2_;
                        s2[t] = s + 4.0 * s2_;
                        s3[t] = d + 8.0 * d2_ + m5[t];
                    }
                }
                for i in 0..4 {
                    let yy = 4 * ty + i;
                    if yy >= oh {
                        continue;
                    }
                    let s = |j: usize| &am[(i * 6 + j) * tw..(i * 6 + j + 1) * tw];
                    let (m0, m1, m2, m3, m4, m5) = (s(0), s(1), s(2), s(3), s(4), s(5));
                    for (t, quad) in out.chunks_exact_mut(4).enumerate() {
                        let (s, d) = (m1[t] + m2[t], m1[t] - m2[t]);
                        let (s2_, d2_) = (m3[t] + m4[t], m3[t] - m4[t]);
                        quad[0] = m0[t] + s + s2_ + b;
                        quad[1] = d + 2.0 * d2_ + b;
                        quad[2] = s + 4.0 * s2_ + b;
                        quad[3] = d + 8.0 * d2_ + m5[t] + b;
                    }
                    // SAFETY: row yy of channel oc of the sample's output, this task's.
                    unsafe {
                        std::ptr::copy_nonoverlapping(out.as_ptr(), y.add(plane + yy * ow), ow);
                    }
                }
            }
        }
    }
}

/// The six rows `j`, `6 + j`, … `30 + j` of `v` (each `step` long), from `at`, `tw` long.
fn six_rows(v: &mut [f32], step: usize, at: usize, j: usize, tw: usize) -> Vec<&mut [f32]> {
    v.chunks_exact_mut(step)
        .skip(j)
        .step_by(6)
        .map(|row| &mut row[at..at + tw])
        .collect()
}

/// Bᵀ's six rows on six rows `d` of tiles (the same column, or row, of each tile), into
/// `out`: `4d₀ − 5d₂ + d₄`, `±(d₃ − 4d₁) + (d₄ − 4d₂)`, `±2(d₃ − d₁) + (d₄ − d₂)`,
/// `4d₁ − 5d₃ + d₅`.
fn bt(d: [&[f32]; 6], out: &mut [&mut [f32]]) {
    let [d0, d1, d2, d3, d4, d5] = d;
    let [c0, c1, c2, c3, c4, c5] = out else {
        unreachable!("Bᵀ has 6 rows")
    };
    for t in 0..d0.len() {
        let (a, b) = (d4[t] - 4.0 * d2[t], d3[t] - 4.0 * d1[t]);
        let (s, e) = (d4[t] - d2[t], 2.0 * (d3[t] - d1[t]));
        c0[t] = 4.0 * d0[t] - 5.0 * d2[t] + d4[t];
        c1[t] = a + b;
        c2[t] = a - b;
        c3[t] = s + e;
        c4[t] = s - e;
        c5[t] = 4.0 * d1[t] - 5.0 * d3[t] + d5[t];
    }
}
