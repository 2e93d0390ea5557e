//! 3×3 convolutions with unit stride by Winograd's minimal filtering F(2×2, 3×3) (Lavin &
//! Gray, 2016), as onnxruntime's CPU convolutions do: each 2×2 block of output comes from
//! a 4×4 tile of input with 16 multiplies per input channel instead of im2col's 36. The
//! multiplies become 16 products `U_ξ (O×C) · V_ξ (C×tiles)`, one per point ξ of the
//! transformed tile, on the same GEMM as the rest.
//!
//! The transforms (Bᵀ d B for a tile d, G g Gᵀ for a kernel g, Aᵀ m A back) are additions
//! and halvings: outputs differ from the direct convolution by rounding only. Only the
//! forward pass takes this path; the gradients stay im2col's.

use rayon::prelude::*;

use super::conv::{with_scratch, Conv2d, Scratch};
use super::matmul::{gemm_raw, Strided};

/// Points of a transformed tile.
const POINTS: usize = 16;

impl Conv2d {
    /// Whether [`Conv2d::forward`] runs it by Winograd's algorithm: a dense 3×3 kernel with
    /// unit stride over enough channels that the products, not the transforms, dominate.
    pub(super) fn takes_winograd(&self) -> bool {
        let (oh, ow) = self.output();
        self.kernel == (3, 3)
            && self.stride == (1, 1)
            && self.dilation == (1, 1)
            && self.groups == 1
            && self.in_channels >= 16
            && self.out_channels >= 16
            && oh >= 2
            && ow >= 2
    }

    /// `y = conv(x, w) + bias` by F(2×2, 3×3): per (sample, band of tile rows) task, the
    /// band's tiles transformed, 16 products, and the outputs transformed back. Bands have
    /// a fixed number of tiles, so a sample's output does not depend on the batch or the
    /// thread count.
    pub(super) fn winograd_forward(
        &self,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) {
        let (c, o) = (self.in_channels, self.out_channels);
        let (oh, ow) = self.output();
        let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
        let u = transform_weights(w, o, c);
        // About 4 MiB of transformed input per band (as much again of products), at least
        // a row of tiles: fewer, larger products amortize the GEMM's packing.
        let band = ((1 << 20) / (POINTS * c * tw)).clamp(1, th);
        let bands = th.div_ceil(band);
        let split = self.batch * bands < rayon::current_num_threads();
        let (in_size, out_size) = (c * self.input.0 * self.input.1, o * oh * ow);
        let y_at = y.as_mut_ptr() as usize;
        (0..self.batch * bands).into_par_iter().for_each(|task| {
            let (n, first) = (task / bands, task % bands * band);
            let rows = first..(first + band).min(th);
            let tiles = rows.len() * tw;
            let xs = &x[n * in_size..(n + 1) * in_size];
            with_scratch(Scratch::Columns, POINTS * c * tiles, |v| {
                self.transform_input(xs, rows.clone(), v);
                with_scratch(Scratch::Gradients, POINTS * o * tiles, |m| {
                    for p in 0..POINTS {
                        let us = Strided {
                            at: u[p * o * c..].as_ptr(),
                            rows: c,
                            columns: 1,
                        };
                        let vs = Strided {
                            at: v[p * c * tiles..].as_ptr(),
                            rows: tiles,
                            columns: 1,
                        };
                        // SAFETY: `u` holds 16 O×C matrices, `v` 16 C×tiles, `m` 16 O×tiles.
                        unsafe {
                            gemm_raw(
                                split,
                                o,
                                c,
                                tiles,
                                1.0,
                                us,
                                vs,
                                0.0,
                                m[p * o * tiles..].as_mut_ptr(),
                                tiles,
                            );
                        }
                    }
                    // SAFETY: the assert in `forward` bounds y; this task alone writes output
                    // rows 2·rows of sample n.
                    unsafe {
                        let y = (y_at as *mut f32).add(n * out_size);
                        self.transform_output(m, rows, bias, y);
                    }
                });
            });
        });
    }

    /// Bᵀ d B of every tile of tile rows `rows`, channel by channel: `v[ξ][c][tile]`.
    ///
    /// A row of tiles at a time, each step a loop over the row's tiles that vectorizes:
    /// the four input rows are split into their even and odd columns (tile `t` reads
    /// columns `2t..2t+4`: even `t` and `t+1`, odd `t` and `t+1`), then `d B` combines
    /// columns and `Bᵀ (d B)` rows.
    fn transform_input(&self, x: &[f32], rows: std::ops::Range<usize>, v: &mut [f32]) {
        let (h, w) = self.input;
        let (_, ow) = self.output();
        let tw = ow.div_ceil(2);
        let tiles = rows.len() * tw;
        let step = self.in_channels * tiles;
        let (top, left) = (self.padding[0], self.padding[1]);
        // Each input row read, zero outside the input: column j is input column j − left.
        let width = 2 * tw + 2;
        let mut line = vec![0.0f32; width];
        let (mut even, mut odd) = (vec![0.0f32; 4 * (tw + 1)], vec![0.0f32; 4 * (tw + 1)]);
        // d B: per input row i, per column combination j, per tile.
        let mut db = vec![0.0f32; 16 * tw];
        for ch in 0..self.in_channels {
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
        &self,
        m: &[f32],
        rows: std::ops::Range<usize>,
        bias: Option<&[f32]>,
        y: *mut f32,
    ) {
        let (oh, ow) = self.output();
        let tw = ow.div_ceil(2);
        let tiles = rows.len() * tw;
        let o = self.out_channels;
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

/// G g Gᵀ of every kernel g of `w` (O×C×3×3): `u[ξ][o][c]`.
fn transform_weights(w: &[f32], o: usize, c: usize) -> Vec<f32> {
    let mut u = vec![0.0f32; POINTS * o * c];
    for (k, g) in w.chunks_exact(9).take(o * c).enumerate() {
        // t = G g (4×3), then U = t Gᵀ (4×4).
        let mut t = [[0.0f32; 3]; 4];
        for j in 0..3 {
            let (g0, g1, g2) = (g[j], g[3 + j], g[6 + j]);
            t[0][j] = g0;
            t[1][j] = 0.5 * (g0 + g1 + g2);
            t[2][j] = 0.5 * (g0 - g1 + g2);
            t[3][j] = g2;
        }
        for (i, row) in t.iter().enumerate() {
            let us = [
                row[0],
                0.5 * (row[0] + row[1] + row[2]),
                0.5 * (row[0] - row[1] + row[2]),
                row[2],
            ];
            for (j, value) in us.into_iter().enumerate() {
                u[(i * 4 + j) * o * c + k] = value;
            }
        }
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct convolution in f64, the reference.
    fn direct(c: &Conv2d, x: &[f32], w: &[f32], bias: &[f32]) -> Vec<f64> {
        let (oh, ow) = c.output();
        let (h, wd) = c.input;
        let mut y = vec![0.0; c.batch * c.out_channels * oh * ow];
        for n in 0..c.batch {
            for o in 0..c.out_channels {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = f64::from(bias[o]);
                        for ch in 0..c.in_channels {
                            for ky in 0..3 {
                                for kx in 0..3 {
                                    let (Some(iy), Some(ix)) = (
                                        (oy + ky).checked_sub(c.padding[0]),
                                        (ox + kx).checked_sub(c.padding[1]),
                                    ) else {
                                        continue;
                                    };
                                    if iy < h && ix < wd {
                                        acc += f64::from(
                                            x[((n * c.in_channels + ch) * h + iy) * wd + ix],
                                        ) * f64::from(
                                            w[((o * c.in_channels + ch) * 3 + ky) * 3 + kx],
                                        );
                                    }
                                }
                            }
                        }
                        y[((n * c.out_channels + o) * oh + oy) * ow + ox] = acc;
                    }
                }
            }
        }
        y
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let v = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                v as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Odd and even sizes, symmetric and one-sided padding, a single tile row and many:
    /// within f32 rounding of the direct convolution.
    #[test]
    fn winograd_matches_the_direct_convolution() {
        for (input, padding) in [
            ((7, 9), [1, 1, 1, 1]),
            ((8, 8), [0, 0, 0, 0]),
            ((5, 12), [2, 0, 1, 2]),
            ((2, 2), [1, 1, 1, 1]),
            ((33, 17), [1, 1, 1, 1]),
            ((11, 14), [0, 2, 1, 0]),
        ] {
            let c = Conv2d {
                batch: 2,
                in_channels: 16,
                out_channels: 24,
                input,
                kernel: (3, 3),
                stride: (1, 1),
                dilation: (1, 1),
                padding,
                groups: 1,
            };
            assert!(c.takes_winograd(), "{input:?}");
            let (oh, ow) = c.output();
            let x = values(c.batch * 16 * input.0 * input.1, 1);
            let w = values(24 * 16 * 9, 2);
            let bias = values(24, 3);
            let mut y = vec![f32::NAN; c.batch * 24 * oh * ow];
            c.forward(&x, &w, Some(&bias), &mut y);
            let want = direct(&c, &x, &w, &bias);
            for (i, (&got, &want)) in y.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(got) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{input:?} {padding:?} at {i}: {got} vs {want}"
                );
            }
        }
    }
}
