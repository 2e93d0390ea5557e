//! 3×3 convolutions with unit stride by Winograd's minimal filtering F(m×m, 3×3) (Lavin &
//! Gray, 2016): each m×m block of output comes from an (m+2)×(m+2) tile of input, with
//! (m+2)² multiplies per input channel instead of im2col's 9m². The multiplies become
//! (m+2)² products `U_ξ (O×C) · V_ξ (C×tiles)`, one per point ξ of the transformed tile,
//! on the same GEMM as the rest.
//!
//! * [`F2`]: F(2×2, 3×3), 16 points: training, and maps under 24 on a side, where
//!   F(4×4)'s tiles would overhang the map and its weight transform weighs more than its
//!   products.
//! * [`F4`]: F(4×4, 3×3), 36 points for 16 outputs: inference only. On VGG16's larger maps
//!   it took 30–35% less time than F(2×2), weight transform included (per-convolution
//!   timings at batch 2), but it rounds about 20× more (4.5e-5 of the output's RMS against
//!   2.2e-6, 256 channels): through VGG16's 13 convolutions its gradients drifted 1.3e-3
//!   from im2col's, too far for the reference that device kernels are checked against.
//!
//! The transforms (Bᵀ d B for a tile d, G g Gᵀ for a kernel g, Aᵀ m A back) are sums with
//! small coefficients: outputs differ from the direct convolution by rounding only. Only
//! the forward pass takes this path; the gradients stay im2col's.

use std::ops::Range;

use rayon::prelude::*;

use super::conv::{with_scratch, Conv2d, Scratch};
use super::matmul::{gemm_raw, Strided};

mod f2;
mod f4;

use f2::F2;
use f4::F4;

/// One of Winograd's minimal filterings F(m×m, 3×3): its transforms.
trait Tiling {
    /// Outputs per tile side.
    const M: usize;
    /// Points of a transformed tile.
    const POINTS: usize = (Self::M + 2) * (Self::M + 2);

    /// G's `m + 2` rows applied to one column `(g0, g1, g2)` of many kernels at once.
    fn g_rows(g0: &[f32], g1: &[f32], g2: &[f32], rows: &mut [&mut [f32]]);

    /// Bᵀ d B of every tile of tile rows `rows` of one sample `x`: `v[ξ][c][tile]`.
    fn transform_input(conv: &Conv2d, x: &[f32], rows: Range<usize>, v: &mut [f32]);

    /// Aᵀ m A of every tile of tile rows `rows`, plus the bias, into one sample's output
    /// at `y` (O×OH×OW).
    ///
    /// # Safety
    /// `y` holds a sample's output, whose rows `m·rows` no one else touches meanwhile.
    unsafe fn transform_output(
        conv: &Conv2d,
        m: &[f32],
        rows: Range<usize>,
        bias: Option<&[f32]>,
        y: *mut f32,
    );
}

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

    /// `y = conv(x, w) + bias` by F(2×2, 3×3), or when `fast` by F(4×4, 3×3) on maps of
    /// at least 24×24.
    pub(super) fn winograd_forward(
        &self,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        fast: bool,
    ) {
        let (oh, ow) = self.output();
        if fast && oh >= 24 && ow >= 24 {
            self.winograd::<F4>(x, w, bias, y);
        } else {
            self.winograd::<F2>(x, w, bias, y);
        }
    }

    /// `y = conv(x, w) + bias` by `T`: per (sample, band of tile rows) task, the band's
    /// tiles transformed, the products, and the outputs transformed back. Bands have a
    /// fixed number of tiles, so a sample's output does not depend on the batch or the
    /// thread count.
    fn winograd<T: Tiling>(&self, x: &[f32], w: &[f32], bias: Option<&[f32]>, y: &mut [f32]) {
        let (c, o) = (self.in_channels, self.out_channels);
        let (oh, ow) = self.output();
        let (th, tw) = (oh.div_ceil(T::M), ow.div_ceil(T::M));
        let u = transform_weights::<T>(w, o, c);
        // About 4 MiB of transformed input per band (as much again of products), at least
        // a row of tiles: fewer, larger products amortize the GEMM's packing.
        let band = ((1 << 20) / (T::POINTS * c * tw)).clamp(1, th);
        let bands = th.div_ceil(band);
        let split = self.batch * bands < rayon::current_num_threads();
        let (in_size, out_size) = (c * self.input.0 * self.input.1, o * oh * ow);
        let y_at = y.as_mut_ptr() as usize;
        (0..self.batch * bands).into_par_iter().for_each(|task| {
            let (n, first) = (task / bands, task % bands * band);
            let rows = first..(first + band).min(th);
            let tiles = rows.len() * tw;
            let xs = &x[n * in_size..(n + 1) * in_size];
            with_scratch(Scratch::Columns, T::POINTS * c * tiles, |v| {
                T::transform_input(self, xs, rows.clone(), v);
                with_scratch(Scratch::Gradients, T::POINTS * o * tiles, |m| {
                    for p in 0..T::POINTS {
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
                        // SAFETY: `u` holds a O×C matrix per point, `v` a C×tiles one, `m`
                        // an O×tiles one.
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
                    // rows m·rows of sample n.
                    unsafe {
                        let y = (y_at as *mut f32).add(n * out_size);
                        T::transform_output(self, m, rows, bias, y);
                    }
                });
            });
        });
    }
}

/// G g Gᵀ of every kernel g of `w` (O×C×3×3): `u[ξ][o][c]`. In parallel over outputs,
/// each output's kernels tap by tap, so that every step is a loop over the input channels
/// that vectorizes (kernel by kernel, VGG16's 512×512 kernels took 5 ms for F(2×2)).
fn transform_weights<T: Tiling>(w: &[f32], o: usize, c: usize) -> Vec<f32> {
    let n = T::M + 2;
    let mut u = vec![0.0f32; T::POINTS * o * c];
    let at = u.as_mut_ptr() as usize;
    (0..o).into_par_iter().for_each(|oo| {
        let mut g = vec![0.0f32; 9 * c];
        for (cc, kernel) in w[oo * c * 9..(oo + 1) * c * 9].chunks_exact(9).enumerate() {
            for (k, &value) in kernel.iter().enumerate() {
                g[k * c + cc] = value;
            }
        }
        // t = G g (n×3): t[i][j], G's row i on column j of every kernel.
        let mut t = vec![0.0f32; 3 * n * c];
        for j in 0..3 {
            let mut rows: Vec<&mut [f32]> = t.chunks_exact_mut(c).skip(j).step_by(3).collect();
            T::g_rows(
                &g[j * c..][..c],
                &g[(3 + j) * c..][..c],
                &g[(6 + j) * c..][..c],
                &mut rows,
            );
        }
        // U = t Gᵀ (n×n): U[i][j], G's row j on row i of t.
        let mut local = vec![0.0f32; T::POINTS * c];
        for (ti, us) in t.chunks_exact(3 * c).zip(local.chunks_exact_mut(n * c)) {
            let mut rows: Vec<&mut [f32]> = us.chunks_exact_mut(c).collect();
            T::g_rows(&ti[..c], &ti[c..2 * c], &ti[2 * c..], &mut rows);
        }
        for (p, row) in local.chunks_exact(c).enumerate() {
            // SAFETY: u[ξ][oo][..] for every point ξ: this task's rows, inside u.
            unsafe {
                let dst = (at as *mut f32).add((p * o + oo) * c);
                std::ptr::copy_nonoverlapping(row.as_ptr(), dst, c);
            }
        }
    });
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

    type Run = fn(&Conv2d, &[f32], &[f32], Option<&[f32]>, &mut [f32]);

    /// Both tilings on odd and even sizes (tiles overhanging the map or not), symmetric and
    /// one-sided padding, a single tile row and many: within f32 rounding of the direct
    /// convolution, and each sample's output bit for bit what it is alone.
    #[test]
    fn winograd_matches_the_direct_convolution() {
        for (input, padding) in [
            ((7, 9), [1, 1, 1, 1]),
            ((8, 8), [0, 0, 0, 0]),
            ((5, 12), [2, 0, 1, 2]),
            ((2, 2), [1, 1, 1, 1]),
            ((3, 3), [1, 1, 1, 1]),
            ((33, 17), [1, 1, 1, 1]),
            ((11, 14), [0, 2, 1, 0]),
            ((26, 30), [1, 1, 1, 1]),
            ((6, 7), [0, 0, 0, 0]),
        ] {
            let c = Conv2d {
                batch: 5,
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
            let want = direct(&c, &x, &w, &bias);
            let tilings: [(&str, Run); 2] = [
                ("F(2×2)", Conv2d::winograd::<F2>),
                ("F(4×4)", Conv2d::winograd::<F4>),
            ];
            for (name, run) in tilings {
                let mut y = vec![f32::NAN; c.batch * 24 * oh * ow];
                run(&c, &x, &w, Some(&bias), &mut y);
                for (i, (&got, &want)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(got) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{name} {input:?} {padding:?} at {i}: {got} vs {want}"
                    );
                }
                let one = Conv2d { batch: 1, ..c };
                let (xs, ys) = (x.len() / c.batch, y.len() / c.batch);
                for n in 0..c.batch {
                    let mut alone = vec![f32::NAN; ys];
                    run(&one, &x[n * xs..(n + 1) * xs], &w, Some(&bias), &mut alone);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert!(
                        bits(&alone) == bits(&y[n * ys..(n + 1) * ys]),
                        "{name} {input:?}: sample {n} differs from itself alone"
                    );
                }
            }
        }
    }
}
