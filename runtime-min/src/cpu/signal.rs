//! Signal processing forward and backward: STFT, a windowed DFT of every frame.
//!
//! A frame's transform is a product with the DFT matrix, computed directly (frames are a
//! few hundred samples: the O(N²) product costs a spectrogram layer far less than the
//! network after it). The twiddles are computed once per call in f64 from `k·n mod N`, so
//! every entry is exact to f32 rounding whatever the frame length.

use rayon::prelude::*;

use super::grad::InputGrads;
use super::ops::{floats, input, operands, optional, R};
use super::tensor::Tensor;

/// How an STFT cuts its signal: `batch` signals of `length` samples, frames of `frame`
/// samples every `step`, `bins` frequencies each.
struct Framing {
    batch: usize,
    length: usize,
    step: usize,
    frame: usize,
    frames: usize,
    bins: usize,
}

impl Framing {
    fn new(inputs: &[Option<&Tensor>], onesided: bool) -> R<Framing> {
        let x = input(inputs, 0)?;
        let (batch, length) = match x.shape.as_slice() {
            &[b, l] | &[b, l, 1] => (b, l),
            other => {
                return Err(operands(format!(
                    "the signal must be [batch, length] or [batch, length, 1], got {other:?}"
                )))
            }
        };
        let one = |i: usize, what: &str| -> R<usize> {
            match input(inputs, i)?.to_i64s().as_slice() {
                &[v] if v >= 1 => Ok(v as usize),
                other => Err(operands(format!(
                    "{what} must be one positive integer, got {other:?}"
                ))),
            }
        };
        let step = one(1, "frame_step")?;
        let window = optional(inputs, 2).map(|w| w.shape.iter().product::<usize>());
        let frame = match (window, optional(inputs, 3)) {
            (Some(w), Some(_)) => {
                let n = one(3, "frame_length")?;
                if n != w {
                    return Err(operands(format!(
                        "the window has {w} values where frame_length is {n}"
                    )));
                }
                n
            }
            (None, Some(_)) => one(3, "frame_length")?,
            (Some(w), None) => w,
            (None, None) => {
                return Err(operands(
                    "neither a window nor frame_length says how long a frame is",
                ))
            }
        };
        if frame == 0 || length < frame {
            return Err(operands(format!(
                "the signal's {length} samples are fewer than one frame of {frame}"
            )));
        }
        Ok(Framing {
            batch,
            length,
            step,
            frame,
            frames: (length - frame) / step + 1,
            bins: if onesided { frame / 2 + 1 } else { frame },
        })
    }

    /// `(cos, sin)` of `2π·k·n / frame` for every bin `k` (rows) and sample `n`.
    fn twiddles(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.frame;
        let mut cos = vec![0.0f32; self.bins * n];
        let mut sin = vec![0.0f32; self.bins * n];
        for k in 0..self.bins {
            for j in 0..n {
                let angle = std::f64::consts::TAU * ((k * j) % n) as f64 / n as f64;
                cos[k * n + j] = angle.cos() as f32;
                sin[k * n + j] = angle.sin() as f32;
            }
        }
        (cos, sin)
    }

    /// Where frame `f` of signal `b` starts in the flat signal.
    fn start(&self, b: usize, f: usize) -> usize {
        b * self.length + f * self.step
    }
}

/// The window, or ones.
fn window(inputs: &[Option<&Tensor>], frame: usize) -> R<Vec<f32>> {
    match optional(inputs, 2) {
        Some(w) => Ok(floats(w, "the window")?.to_vec()),
        None => Ok(vec![1.0; frame]),
    }
}

/// STFT forward: `[batch, frames, bins, 2]`, each bin's real part then its imaginary part,
/// `Σₙ w[n]·x[start + n]·e^{−2πi·k·n/N}`.
pub(crate) fn stft(inputs: &[Option<&Tensor>], onesided: bool) -> R<Tensor> {
    let s = Framing::new(inputs, onesided)?;
    let x = floats(input(inputs, 0)?, "the signal")?;
    let w = window(inputs, s.frame)?;
    let (cos, sin) = s.twiddles();
    let mut out = vec![0.0f32; s.batch * s.frames * s.bins * 2];
    out.par_chunks_mut(s.bins * 2)
        .enumerate()
        .for_each(|(bf, spectrum)| {
            let start = s.start(bf / s.frames, bf % s.frames);
            let windowed: Vec<f32> = (0..s.frame).map(|n| w[n] * x[start + n]).collect();
            for k in 0..s.bins {
                let row = k * s.frame..(k + 1) * s.frame;
                let (re, im) = windowed
                    .iter()
                    .zip(&cos[row.clone()])
                    .zip(&sin[row])
                    .fold((0.0f32, 0.0f32), |(re, im), ((&v, &c), &sn)| {
                        (re + v * c, im - v * sn)
                    });
                spectrum[2 * k] = re;
                spectrum[2 * k + 1] = im;
            }
        });
    Ok(Tensor::f32(vec![s.batch, s.frames, s.bins, 2], out))
}

/// STFT backward. With `g[n] = Σₖ dRe[k]·cos(2πkn/N) − dIm[k]·sin(2πkn/N)` per frame, the
/// signal's gradient adds `w[n]·g[n]` at every sample a frame covers (frames overlap) and
/// the window's adds `x[start + n]·g[n]` over every frame.
pub(crate) fn stft_backward(
    inputs: &[Option<&Tensor>],
    onesided: bool,
    dy: &[f32],
) -> R<InputGrads> {
    let s = Framing::new(inputs, onesided)?;
    if dy.len() != s.batch * s.frames * s.bins * 2 {
        return Err(operands(format!(
            "the output gradient has {} values where {} were expected",
            dy.len(),
            s.batch * s.frames * s.bins * 2
        )));
    }
    let x = floats(input(inputs, 0)?, "the signal")?;
    let w = window(inputs, s.frame)?;
    let (cos, sin) = s.twiddles();
    // Per frame, the gradient of its windowed samples.
    let mut per_frame = vec![0.0f32; s.batch * s.frames * s.frame];
    per_frame
        .par_chunks_mut(s.frame)
        .enumerate()
        .for_each(|(bf, g)| {
            let d = &dy[bf * s.bins * 2..(bf + 1) * s.bins * 2];
            for k in 0..s.bins {
                let (re, im) = (d[2 * k], d[2 * k + 1]);
                let row = k * s.frame..(k + 1) * s.frame;
                for ((gn, &c), &sn) in g.iter_mut().zip(&cos[row.clone()]).zip(&sin[row]) {
                    *gn += re * c - im * sn;
                }
            }
        });
    // Frames of one signal overlap: each signal adds its frames in order.
    let mut dx = vec![0.0f32; x.len()];
    let mut dw = vec![0.0f32; s.frame];
    for b in 0..s.batch {
        for f in 0..s.frames {
            let start = s.start(b, f);
            let g = &per_frame[(b * s.frames + f) * s.frame..][..s.frame];
            for n in 0..s.frame {
                dx[start + n] += w[n] * g[n];
                dw[n] += x[start + n] * g[n];
            }
        }
    }
    let mut grads = vec![None; inputs.len()];
    grads[0] = Some(dx);
    if optional(inputs, 2).is_some() {
        grads[2] = Some(dw);
    }
    Ok(grads)
}
