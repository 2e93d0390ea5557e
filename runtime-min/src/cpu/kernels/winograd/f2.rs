//! F(2×2, 3×3): each 2×2 block of output from a 4×4 tile of input, 16 multiplies per input
//! channel instead of im2col's 36.

use std::ops::Range;

use super::super::conv::Conv2d;
use super::Tiling;

/// Winograd's F(2×2, 3×3).
pub(super) struct F2;

impl Tiling for F2 {
    const M: usize = 2;

    fn g_rows(g0: &[f32], g1: &[f32], g2: &[f32], rows: &mut [&mut [f32]]) {
        let [r0, r1, r2, r3] = rows else {
            unreachable!("F(2×2, 3×3) has 4 rows of G")
        };
        for k in 0..g0.len() {
            let (a, b, c) = (g0[k], g1[k], g2[k]);
            r0[k] = a;
            r1[k] = 0.5 * (a + b + c);
            r2[k] = 0.5 * (a - b + c);
            r3[k] = c;
        }
    }

    /// Bᵀ d B of every tile of tile rows `rows`, channel by channel: `v[ξ][c][tile]`.
    ///
    /// A row of tiles at a time, each step a loop over the row's tiles that vectorizes:
    /// the four input rows are split into their even and odd columns (tile `t` reads
    /// columns `2t..2t+4`: even `t` and `t+1`, odd `t` and `t+1`), then `d B` combines
    /// columns and `Bᵀ (d B)` rows.
    fn transform_input(conv: &Conv2d, x: &[f32], rows: Range<usize>, v: &mut [f32]) {
        let (h, w) = conv.input;
        let (_, ow) = conv.output();
        let tw = ow.div_ceil(2);
        let tiles = rows.len() * tw;
        let step = conv.in_channels * tiles;
        let (top, left) = (conv.padding[0], conv.padding[1]);
        // Each input row read, zero outside the input: column j is input column j − left.
        let width = 2 * tw + 2;
        let mut line = vec![0.0f32; width];
        let (mut even, mut odd) = (vec![0.0f32; 4 * (tw + 1)], vec![0.0f32; 4 * (tw + 1)]);
        // d B: per input row i, per column combination j, per tile.
        let mut db = vec![0.0f32; 16 * tw];
        for ch in 0..conv.in_channels {
            let plane = &x[ch * h * w..(ch + 1) * h * w];
            for (r, ty) in rows.clone().enumerate() {
                for i in 0..4 {
                    line.fill(0.0);
                    if let Some(yy) = (2 * ty + i).checked_sub(top).filter(|&yy| yy < h) {
                        let (lo, hi) = (left.min(width), (w + left).min(width));
                        if lo < hi {
                            line[lo..hi]
                                .copy_from_slice(&plane[yy * w + lo - left..yy * w + hi - left]);
                        }
                    }
                    let (e, o) = (
                        &mut even[i * (tw + 1)..(i + 1) * (tw + 1)],
                        &mut odd[i * (tw + 1)..(i + 1) * (tw + 1)],
                    );
                    for (k, pair) in line.chunks_exact(2).enumerate() {
                        e[k] = pair[0];
                        o[k] = pair[1];
                    }
                    let (e0, e1, o0, o1) = (&e[..tw], &e[1..], &o[..tw], &o[1..]);
                    let row = &mut db[i * 4 * tw..(i + 1) * 4 * tw];
                    let (c0, rest) = row.split_at_mut(tw);
                    let (c1, rest) = rest.split_at_mut(tw);
                    let (c2, c3) = rest.split_at_mut(tw);
                    for t in 0..tw {
                        c0[t] = e0[t] - e1[t];
                        c1[t] = o0[t] + e1[t];
                        c2[t] = e1[t] - o0[t];
                        c3[t] = o0[t] - o1[t];
                    }
                }
                let at = ch * tiles + r * tw;
                for j in 0..4 {
                    let d = |i: usize| &db[(i * 4 + j) * tw..(i * 4 + j + 1) * tw];
                    let (d0, d1, d2, d3) = (d(0), d(1), d(2), d(3));
                    // Bᵀ's rows: d0 − d2, d1 + d2, d2 − d1, d1 − d3.
                    let span = |p: usize| p * step + at..p * step + at + tw;
                    for (t, o) in v[span(j)].iter_mut().enumerate() {
                        *o = d0[t] - d2[t];
                    }
                    for (t, o) in v[span(4 + j)].iter_mut().enumerate() {
                        *o = d1[t] + d2[t];
                    }
                    for (t, o) in v[span(8 + j)].iter_mut().enumerate() {
                        *o = d2[t] - d1[t];
                    }
                    for (t, o) in v[span(12 + j)].iter_mut().enumerate() {
                        *o = d1[t] - d3[t];
                    }
                }
            }
        }
    }

    /// Aᵀ m A of every tile of tile rows `rows`, plus the bias, into one sample's output
    /// at `y` (O×OH×OW), a row of tiles at a time as [`Conv2d::transform_input`] does.
    ///
    /// # Safety
    /// `y` holds a sample's output, whose rows `2·rows` no one else touches meanwhile.
    unsafe fn transform_output(
        conv: &Conv2d,
        m: &[f32],
        rows: Range<usize>,
        bias: Option<&[f32]>,
        y: *mut f32,
    ) {
        let (oh, ow) = conv.output();
        let tw = ow.div_ceil(2);
        let tiles = rows.len() * tw;
        let o = conv.out_channels;
        let step = o * tiles;
        // Aᵀ m: per output row i of a tile, per column j, per tile.
        let mut am = vec![0.0f32; 8 * tw];
        let mut out = vec![0.0f32; 2 * tw];
        for oc in 0..o {
            let b = bias.map_or(0.0, |b| b[oc]);
            let plane = oc * oh * ow;
            for (r, ty) in rows.clone().enumerate() {
                let at = oc * tiles + r * tw;
                let mm = |p: usize| &m[p * step + at..p * step + at + tw];
                for j in 0..4 {
                    let (m0, m1, m2, m3) = (mm(j), mm(4 + j), mm(8 + j), mm(12 + j));
                    let (s0, s1) = am.split_at_mut(4 * tw);
                    let (s0, s1) = (&mut s0[j * tw..(j + 1) * tw], &mut s1[j * tw..(j + 1) * tw]);
                    for t in 0..tw {
                        s0[t] = m0[t] + m1[t] + m2[t];
                        s1[t] = m1[t] - m2[t] - m3[t];
                    }
                }
                for i in 0..2 {
                    let yy = 2 * ty + i;
                    if yy >= oh {
                        continue;
                    }
                    let s = |j: usize| &am[(i * 4 + j) * tw..(i * 4 + j + 1) * tw];
                    let (s0, s1, s2, s3) = (s(0), s(1), s(2), s(3));
                    for (t, pair) in out.chunks_exact_mut(2).enumerate() {
                        pair[0] = s0[t] + s1[t] + s2[t] + b;
                        pair[1] = s1[t] - s2[t] - s3[t] + b;
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
