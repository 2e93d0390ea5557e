//! DeepPool's profile format (`profile/A100_vgg.prof` in seojinpark/DeepPool): one line per
//! (layer, per-GPU batch),
//!
//! ```text
//! conv2d{"in_channels":3,"kernel_size":3,"out_channels":64,"padding":1,"stride":1}[64][3,224,224]   2.157   2157   6
//! ```
//!
//! the layer's parameters as JSON, the batch, the per-sample input dims (`[c,h,w]`, or a
//! bare number for 1-D inputs), then total ms, forward µs and backward µs; a
//! `SUM(avg)  <ms>` line closes each batch. Forward/backward are split unreliably (in-place
//! ReLU lines carry most of the previous conv's backward time) but totals are right, and a
//! fused `Conv+Relu` unit sums both lines.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Device, Entry, Point, Profile, ProfileError, Signature, FORMAT};
use crate::cluster::Precision;

/// Converts a DeepPool profile. Measurements are taken as TF32: on an A100 its conv
/// layers run faster than the FP32 peak allows, as PyTorch's TF32 default does.
///
/// # Errors
/// A line that does not parse, an unknown layer type, or a batch whose lines do not add
/// up to its `SUM(avg)` line (within rounding).
pub fn parse_deeppool(text: &str, path: &str) -> Result<Profile, ProfileError> {
    let mut entries: BTreeMap<Signature, BTreeMap<u64, (f64, f64, f64)>> = BTreeMap::new();
    let mut batch_total_ms = 0.0;
    for (i, raw) in text.lines().enumerate() {
        let err = |message: String| ProfileError::Line {
            path: path.to_owned(),
            line: i + 1,
            message,
        };
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(sum) = line.strip_prefix("SUM(avg)") {
            let expected: f64 = sum
                .trim()
                .parse()
                .map_err(|_| err(format!("bad SUM(avg) total '{}'", sum.trim())))?;
            // Lines carry 3 decimals of ms: allow that rounding per line.
            if (expected - batch_total_ms).abs() > 0.05 + expected * 1e-3 {
                return Err(err(format!("the batch's lines add up to {batch_total_ms:.3} ms, its SUM(avg) says {expected} ms")));
            }
            batch_total_ms = 0.0;
            continue;
        }
        let (layer, rest) = line
            .split_once('{')
            .ok_or_else(|| err("expected `layer{params}[batch][dims]`".into()))?;
        let close = rest.find('}').ok_or_else(|| err("unclosed `{`".into()))?;
        let params: Value = serde_json::from_str(&format!("{{{}}}", &rest[..close]))
            .map_err(|e| err(format!("layer parameters: {e}")))?;
        let rest = &rest[close + 1..];
        let (batch, rest) =
            bracketed(rest).ok_or_else(|| err("expected `[batch]` after the parameters".into()))?;
        let batch: u64 = batch
            .parse()
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| err(format!("bad batch '{batch}'")))?;
        let (dims, rest) = match bracketed(rest) {
            Some((dims, rest)) => (dims.to_owned(), rest),
            None => {
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                (rest[..end].to_owned(), &rest[end..])
            }
        };
        let input: Vec<u64> = dims
            .split(',')
            .map(|d| d.trim().parse::<u64>().ok().filter(|&d| d > 0))
            .collect::<Option<_>>()
            .ok_or_else(|| err(format!("bad input dims '{dims}'")))?;
        let numbers: Vec<f64> = rest
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| err("expected three numbers: total ms, forward µs, backward µs".into()))?;
        let [total_ms, fwd_us, bwd_us] = numbers[..] else {
            return Err(err(
                "expected three numbers: total ms, forward µs, backward µs".into(),
            ));
        };
        if [total_ms, fwd_us, bwd_us]
            .iter()
            .any(|t| !t.is_finite() || *t < 0.0)
        {
            return Err(err("times must be finite and ≥ 0".into()));
        }
        batch_total_ms += total_ms;
        let signature = signature(layer, &params, &input).map_err(err)?;
        // VGG repeats layers of one shape: the same kernel, so their lines are averaged.
        let sum = entries
            .entry(signature)
            .or_default()
            .entry(batch)
            .or_default();
        *sum = (sum.0 + fwd_us, sum.1 + bwd_us, sum.2 + 1.0);
    }
    Profile {
        format: FORMAT.to_owned(),
        device: Device {
            name: "a100".to_owned(),
            note: format!("converted from DeepPool profile {path}"),
        },
        precision: Precision::Tf32,
        entries: entries
            .into_iter()
            .map(|(signature, points)| Entry {
                signature,
                points: points
                    .into_iter()
                    .map(|(batch, (fwd, bwd, n))| Point {
                        batch,
                        forward_us: fwd / n,
                        backward_us: bwd / n,
                        peak_bytes: None,
                    })
                    .collect(),
            })
            .collect(),
    }
    .normalize(path)
}

/// `[text]rest` → (`text`, `rest`).
fn bracketed(s: &str) -> Option<(&str, &str)> {
    let s = s.strip_prefix('[')?;
    let end = s.find(']')?;
    Some((&s[..end], &s[end + 1..]))
}

fn signature(layer: &str, params: &Value, input: &[u64]) -> Result<Signature, String> {
    let int = |key: &str| {
        params
            .get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("{layer}: parameter '{key}' missing or not a whole number"))
    };
    let spatial = |kernel: u64, stride: u64, padding: u64| -> Result<Vec<u64>, String> {
        if input.len() != 3 || stride == 0 {
            return Err(format!(
                "{layer}: expected [c,h,w] input dims and a stride ≥ 1"
            ));
        }
        input[1..]
            .iter()
            .map(|&d| {
                (d + 2 * padding)
                    .checked_sub(kernel)
                    .map(|x| x / stride + 1)
                    .ok_or_else(|| format!("{layer}: kernel {kernel} larger than the padded input"))
            })
            .collect()
    };
    let same = |op: &str| Signature {
        op: op.to_owned(),
        attrs: BTreeMap::new(),
        input: input.to_vec(),
        output: input.to_vec(),
    };
    Ok(match layer {
        "conv2d" => {
            let (k, s) = (int("kernel_size")?, int("stride")?);
            let mut output = vec![int("out_channels")?];
            output.extend(spatial(k, s, int("padding")?)?);
            Signature {
                op: "Conv".into(),
                attrs: Signature::window(&[k, k], Some(&[s, s]), None, Some(1)),
                input: input.to_vec(),
                output,
            }
        }
        "maxPool2d" => {
            let (k, s) = (int("kernel_size")?, int("stride")?);
            let mut output = vec![input.first().copied().unwrap_or(0)];
            output.extend(spatial(k, s, int("padding")?)?);
            Signature {
                op: "MaxPool".into(),
                attrs: Signature::window(&[k, k], Some(&[s, s]), None, None),
                input: input.to_vec(),
                output,
            }
        }
        "ReLU2d" | "ReLU1d" => same("Relu"),
        "flatten" => Signature {
            op: "Flatten".into(),
            attrs: BTreeMap::new(),
            input: input.to_vec(),
            output: vec![input.iter().product()],
        },
        "linear" => Signature {
            op: "Gemm".into(),
            attrs: BTreeMap::new(),
            input: vec![int("in_features")?],
            output: vec![int("out_features")?],
        },
        other => return Err(format!("unknown DeepPool layer type '{other}'")),
    })
}
