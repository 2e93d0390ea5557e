//! DeepPool's profile format (`profile/A100_*.prof` in seojinpark/DeepPool): one line per
//! (layer, per-GPU batch),
//!
//! ```text
//! conv2d{"in_channels":3,"kernel_size":3,"out_channels":64,"padding":1,"stride":1}[64][3,224,224]   2.157   2157   6
//! ```
//!
//! the layer's parameters as JSON, the batch, the per-sample input dims (`[c,h,w]`, or a
//! bare number for 1-D inputs), then total ms, forward µs and backward µs; a
//! `SUM(avg)  <ms> [<ms>]` or `sum:  <ms>` line closes each batch's section. Forward/backward
//! are split unreliably (in-place ReLU lines carry most of the previous conv's backward
//! time) but totals are right, and a fused `Conv+Relu` unit sums both lines.
//!
//! Layers are single ops (`conv2d`, `linear`, pools, `ReLU2d`, `flatten`) or composite
//! modules: `ResnetBottleneck` is a whole residual block (three convolutions, their batch
//! norms and ReLUs, the optional downsample and the addition). A file is read two ways:
//! * [`parse_deeppool`]: a per-op [`Profile`], each line keyed by the ONNX op it times. A
//!   composite line has no single op to match, so such a file is refused with the hint to
//!   use the second way.
//! * [`deeppool_layers`]: the model itself, a chain of measured layers in the order of its
//!   sections (line *k* of every section is the same layer at another batch), each costed
//!   from its measurements at the per-GPU batch a plan gives it. Parameter and activation
//!   sizes follow from each layer's parameters.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Device, Entry, Point, Profile, ProfileError, Signature, FORMAT};
use crate::cluster::Precision;
use crate::layers::{Edge, Layer, LayerGraph, LayerId, LayerKind, Measured, Producer};

/// One line: a layer at one per-GPU batch.
struct Line {
    /// 1-based line number.
    number: usize,
    layer: String,
    params: Value,
    batch: u64,
    /// Per-sample input dims.
    input: Vec<u64>,
    fwd_us: f64,
    bwd_us: f64,
}

/// Reads every layer line, section by section, checking each section against its total.
fn read(text: &str, path: &str) -> Result<Vec<Vec<Line>>, ProfileError> {
    let mut sections: Vec<Vec<Line>> = Vec::new();
    let mut section: Vec<Line> = Vec::new();
    let mut section_ms = 0.0;
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
        if let Some(sum) = line
            .strip_prefix("SUM(avg)")
            .or_else(|| line.strip_prefix("sum:"))
        {
            // The first figure adds up the lines; a second, where present, is a whole
            // iteration timed on its own (with or without synchronization).
            let first = sum.split_whitespace().next().unwrap_or_default();
            let expected: f64 = first
                .parse()
                .map_err(|_| err(format!("bad section total '{}'", sum.trim())))?;
            // Lines carry 3 decimals of ms: allow that rounding per line.
            let slack = 0.05 + 5e-4 * section.len() as f64 + expected * 1e-3;
            if (expected - section_ms).abs() > slack {
                return Err(err(format!(
                    "the section's lines add up to {section_ms:.3} ms, its total says {expected} ms"
                )));
            }
            section_ms = 0.0;
            if !section.is_empty() {
                sections.push(std::mem::take(&mut section));
            }
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
        if [total_ms * 1e3, fwd_us, bwd_us]
            .iter()
            .any(|t| !(0.0..=super::MAX_US).contains(t))
        {
            return Err(err("times must be between 0 and an hour".into()));
        }
        if section.first().is_some_and(|l: &Line| l.batch != batch) {
            return Err(err(format!(
                "batch {batch} in a section of batch {} (a total line closes each section)",
                section[0].batch
            )));
        }
        section_ms += total_ms;
        section.push(Line {
            number: i + 1,
            layer: layer.to_owned(),
            params,
            batch,
            input,
            fwd_us,
            bwd_us,
        });
    }
    if !section.is_empty() {
        sections.push(section);
    }
    if sections.is_empty() {
        return Err(ProfileError::Invalid {
            path: path.to_owned(),
            message: "no layer lines".into(),
        });
    }
    Ok(sections)
}

/// Converts a DeepPool profile to a per-op profile. Measurements are taken as TF32: on an
/// A100 its conv layers run faster than the FP32 peak allows, as PyTorch's TF32 default
/// does.
///
/// # Errors
/// A line that does not parse, an unknown or composite layer type, or a section whose
/// lines do not add up to its total (within rounding).
pub fn parse_deeppool(text: &str, path: &str) -> Result<Profile, ProfileError> {
    let mut entries: BTreeMap<Signature, BTreeMap<u64, (f64, f64, f64)>> = BTreeMap::new();
    for line in read(text, path)?.iter().flatten() {
        let err = |message: String| ProfileError::Line {
            path: path.to_owned(),
            line: line.number,
            message,
        };
        let layer = Known::of(line).map_err(|Unreadable(message)| err(message))?;
        let signature = layer.signature.ok_or_else(|| {
            err(format!(
                "{} is a composite module, which no single ONNX op matches: give this profile \
                 as the model (`ralpc {path}`), where each line is one measured layer",
                line.layer
            ))
        })?;
        // Layers of one shape run the same kernels: their lines are averaged.
        let sum = entries
            .entry(signature)
            .or_default()
            .entry(line.batch)
            .or_default();
        *sum = (sum.0 + line.fwd_us, sum.1 + line.bwd_us, sum.2 + 1.0);
    }
    Profile {
        format: FORMAT.to_owned(),
        device: device(path),
        precision: Precision::Tf32,
        entries: entries
            .into_iter()
            .map(|(signature, sums)| Entry {
                signature,
                points: averaged(sums),
            })
            .collect(),
    }
    .normalize(path)
}

/// Points from per-batch sums of (forward µs, backward µs, lines).
fn averaged(sums: BTreeMap<u64, (f64, f64, f64)>) -> Vec<Point> {
    sums.into_iter()
        .map(|(batch, (fwd, bwd, n))| Point {
            batch,
            forward_us: fwd / n,
            backward_us: bwd / n,
            peak_bytes: None,
            forward_spread: None,
            backward_spread: None,
        })
        .collect()
}

fn device(path: &str) -> Device {
    Device {
        name: "a100".to_owned(),
        note: format!("converted from DeepPool profile {path}"),
    }
}

/// Reads a DeepPool profile as the model: a chain of measured layers at global batch
/// `batch` (the largest batch measured when not given). Each layer keeps its measurements
/// at every batch, so a share of it is timed at its own per-GPU batch.
///
/// # Errors
/// As [`parse_deeppool`] for the lines, and sections that list different layers.
pub fn deeppool_layers(
    text: &str,
    path: &str,
    batch: Option<u64>,
) -> Result<LayerGraph, ProfileError> {
    let sections = read(text, path)?;
    let first = &sections[0];
    for section in &sections[1..] {
        let differs = section.len() != first.len()
            || section
                .iter()
                .zip(first)
                .any(|(a, b)| (&a.layer, &a.params, &a.input) != (&b.layer, &b.params, &b.input));
        if differs {
            return Err(ProfileError::Line {
                path: path.to_owned(),
                line: section[0].number,
                message: format!(
                    "this section (batch {}) lists other layers than the first (line {}): \
                     line k of every section must be the same layer",
                    section[0].batch, first[0].number
                ),
            });
        }
    }
    let batch = batch.unwrap_or_else(|| sections.iter().map(|s| s[0].batch).max().unwrap_or(1));
    let mut layers: Vec<Layer> = Vec::with_capacity(first.len());
    for (k, line) in first.iter().enumerate() {
        let known = Known::of(line).map_err(|Unreadable(message)| ProfileError::Line {
            path: path.to_owned(),
            line: line.number,
            message,
        })?;
        let mut points: BTreeMap<u64, (f64, f64, f64)> = BTreeMap::new();
        for section in &sections {
            let at = &section[k];
            let sum = points.entry(at.batch).or_default();
            *sum = (sum.0 + at.fwd_us, sum.1 + at.bwd_us, sum.2 + 1.0);
        }
        let points = averaged(points);
        let at = super::interpolate(&points, batch as f64).ok_or_else(|| ProfileError::Line {
            path: path.to_owned(),
            line: line.number,
            message: "this layer has no measurement".into(),
        })?;
        let input_bytes = product(&[4, batch, product(&line.input)]);
        let output_bytes = product(&[4, batch, product(&known.output)]);
        let from = match k {
            0 => Producer::Input("input".to_owned()),
            _ => Producer::Layer(LayerId(k as u32 - 1)),
        };
        layers.push(Layer {
            name: format!("{}{}", line.layer, k),
            module: String::new(),
            op: line.layer.clone(),
            kind: known.kind,
            parts: Vec::new(),
            params: known.params,
            param_bytes: known.params.saturating_mul(4),
            fwd_flops: 0,
            bwd_flops: 0,
            activation_io_bytes: input_bytes + output_bytes,
            output_bytes,
            stash_bytes: input_bytes,
            inner_stash_bytes: 0,
            kept_output_bytes: 0,
            softmax_rows_bytes: 0,
            scores_stash_bytes: 0,
            // The layer's own input size: branches listed in sequence (Inception's) read
            // the block's input, not the line before.
            inputs: vec![Edge {
                from,
                value: None,
                bytes: input_bytes,
                stash_kept_by: None,
                stashed: true,
                epilogue: false,
            }],
            measured: Some(Measured {
                fwd_us: at.fwd_us,
                bwd_us: at.bwd_us,
                points,
            }),
            halo: None,
            recurrence: None,
            grouped: false,
        });
    }
    Ok(LayerGraph {
        batch,
        outputs: vec![LayerId(layers.len() as u32 - 1)],
        layers,
        rewrite: None,
        aliases: BTreeMap::new(),
        tied: Vec::new(),
        float_bytes: 4,
        fixed_batch: None,
    })
}

/// A product that saturates: sizes come from the file, and a bad one must not overflow.
fn product(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &x| a.saturating_mul(x))
}

/// `[text]rest` → (`text`, `rest`).
fn bracketed(s: &str) -> Option<(&str, &str)> {
    let s = s.strip_prefix('[')?;
    let end = s.find(']')?;
    Some((&s[..end], &s[end + 1..]))
}

/// What a line's layer type and parameters say.
struct Known {
    /// The ONNX op it times, `None` for a composite module.
    signature: Option<Signature>,
    kind: LayerKind,
    /// Parameters (elements).
    params: u64,
    /// Per-sample output dims.
    output: Vec<u64>,
}

/// Why a line names no layer ralpc knows (a parameter missing, an unknown type): the
/// profile's fault, reported at its line ([`ProfileError::Line`]).
struct Unreadable(String);

impl Known {
    fn of(line: &Line) -> Result<Known, Unreadable> {
        let (layer, params, input) = (line.layer.as_str(), &line.params, &line.input[..]);
        let int = |key: &str| {
            params.get(key).and_then(Value::as_u64).ok_or_else(|| {
                Unreadable(format!(
                    "{layer}: parameter '{key}' missing or not a whole number"
                ))
            })
        };
        // A size written once (`3`) or per axis (`[1,7]`); `default` when absent.
        let pair = |key: &str, default: Option<u64>| -> Result<[u64; 2], Unreadable> {
            match params.get(key) {
                None => default
                    .map(|d| [d, d])
                    .ok_or_else(|| Unreadable(format!("{layer}: parameter '{key}' missing"))),
                Some(Value::Array(a)) => match a
                    .iter()
                    .map(Value::as_u64)
                    .collect::<Option<Vec<_>>>()
                    .as_deref()
                {
                    Some(&[h, w]) => Ok([h, w]),
                    _ => Err(Unreadable(format!(
                        "{layer}: parameter '{key}' is not two whole numbers"
                    ))),
                },
                Some(v) => v.as_u64().map(|d| [d, d]).ok_or_else(|| {
                    Unreadable(format!("{layer}: parameter '{key}' is not a whole number"))
                }),
            }
        };
        let image = || -> Result<[u64; 3], Unreadable> {
            match *input {
                [c, h, w] => Ok([c, h, w]),
                _ => Err(Unreadable(format!("{layer}: expected [c,h,w] input dims"))),
            }
        };
        // Output rows and columns of a window over the input.
        let window = |kernel: [u64; 2], stride: [u64; 2], padding: [u64; 2]| {
            let [_, h, w] = image()?;
            let out = |d: u64, i: usize| {
                d.saturating_add(padding[i].saturating_mul(2))
                    .checked_sub(kernel[i])
                    .filter(|_| stride[i] > 0)
                    .map(|x| x / stride[i] + 1)
                    .ok_or_else(|| {
                        Unreadable(format!("{layer}: the kernel does not fit the padded input"))
                    })
            };
            Ok::<_, Unreadable>([out(h, 0)?, out(w, 1)?])
        };
        let op = |name: &str, attrs, output: Vec<u64>| Signature {
            op: name.to_owned(),
            attrs,
            input: input.to_vec(),
            output,
        };
        let simple = |signature: Signature, kind| Known {
            output: signature.output.clone(),
            signature: Some(signature),
            kind,
            params: 0,
        };
        Ok(match layer {
            "conv2d" => {
                let (k, s) = (pair("kernel_size", None)?, pair("stride", Some(1))?);
                let [c, _, _] = image()?;
                let out_channels = int("out_channels")?;
                let [oh, ow] = window(k, s, pair("padding", Some(0))?)?;
                // Biases unless the line says otherwise (torchvision's VGG has them, its
                // ResNets do not; a bias is a rounding error of the weight count).
                let bias = params.get("bias").and_then(Value::as_bool).unwrap_or(true);
                Known {
                    signature: Some(op(
                        "Conv",
                        Signature::window(&k, Some(&s), None, Some(1)),
                        vec![out_channels, oh, ow],
                    )),
                    kind: LayerKind::Conv,
                    params: product(&[c, out_channels, k[0], k[1]])
                        .saturating_add(u64::from(bias) * out_channels),
                    output: vec![out_channels, oh, ow],
                }
            }
            "maxPool2d" | "avgPool2d" => {
                let (k, s) = (pair("kernel_size", None)?, pair("stride", None)?);
                let [c, _, _] = image()?;
                let [oh, ow] = window(k, s, pair("padding", Some(0))?)?;
                let name = if layer == "maxPool2d" {
                    "MaxPool"
                } else {
                    "AveragePool"
                };
                simple(
                    op(
                        name,
                        Signature::window(&k, Some(&s), None, None),
                        vec![c, oh, ow],
                    ),
                    LayerKind::Pool,
                )
            }
            "adAvgPool2d" => {
                let [c, _, _] = image()?;
                let (oh, ow) = (int("output_height")?, int("output_width")?);
                if (oh, ow) != (1, 1) {
                    return Err(Unreadable(format!(
                        "{layer}: only a 1×1 output (ONNX's GlobalAveragePool) is known, not {oh}×{ow}"
                    )));
                }
                simple(
                    op("GlobalAveragePool", BTreeMap::new(), vec![c, 1, 1]),
                    LayerKind::Pool,
                )
            }
            "ReLU2d" | "ReLU1d" => simple(
                op("Relu", BTreeMap::new(), input.to_vec()),
                LayerKind::Elementwise,
            ),
            "flatten" => simple(
                op("Flatten", BTreeMap::new(), vec![input.iter().product()]),
                LayerKind::DataMovement,
            ),
            "linear" => {
                let (inputs, outputs) = (int("in_features")?, int("out_features")?);
                let bias = params.get("bias").and_then(Value::as_bool).unwrap_or(true);
                Known {
                    signature: Some(Signature {
                        op: "Gemm".into(),
                        attrs: BTreeMap::new(),
                        input: vec![inputs],
                        output: vec![outputs],
                    }),
                    kind: LayerKind::Dense,
                    params: product(&[inputs, outputs]).saturating_add(u64::from(bias) * outputs),
                    output: vec![outputs],
                }
            }
            "ResnetBottleneck" => Known::bottleneck(line, image()?, &int)?,
            other => return Err(Unreadable(format!("unknown DeepPool layer type '{other}'"))),
        })
    }

    /// torchvision's `Bottleneck`: 1×1 conv to `width`, 3×3 conv (the stride), 1×1 conv to
    /// `4·planes`, a batch norm after each, and a downsample (1×1 conv and batch norm)
    /// where `downsampleParams` is `[[in, out, stride], bn channels]`.
    fn bottleneck(
        line: &Line,
        [c, h, w]: [u64; 3],
        int: &dyn Fn(&str) -> Result<u64, Unreadable>,
    ) -> Result<Known, Unreadable> {
        let (inplanes, planes) = (int("inplanes")?, int("planes")?);
        let groups = int("groups")?.max(1);
        let base_width = line
            .params
            .get("base_width")
            .and_then(Value::as_u64)
            .unwrap_or(64);
        let stride = line
            .params
            .get("stride")
            .and_then(Value::as_u64)
            .unwrap_or(1)
            .max(1);
        if inplanes != c {
            return Err(Unreadable(format!(
                "ResnetBottleneck: inplanes {inplanes} but the input has {c} channels"
            )));
        }
        let width = (product(&[planes, base_width]) / 64).saturating_mul(groups);
        let out = planes.saturating_mul(4);
        let mut params = product(&[inplanes, width])
            .saturating_add(product(&[width, width / groups, 9]))
            .saturating_add(product(&[width, out]))
            .saturating_add(product(&[2, width.saturating_mul(2).saturating_add(out)]));
        if let Some(down) = line.params.get("downsampleParams") {
            let numbers = |v: &Value| {
                v.as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect::<Vec<_>>())
            };
            let parts = down.as_array().filter(|a| a.len() == 2);
            let (conv, bn) = match parts {
                Some(a) => (numbers(&a[0]).unwrap_or_default(), a[1].as_u64()),
                None => (Vec::new(), None),
            };
            let (&[d_in, d_out, _], Some(bn)) = (&conv[..], bn) else {
                return Err(Unreadable(
                    "ResnetBottleneck: downsampleParams is not [[in, out, stride], channels]"
                        .to_owned(),
                ));
            };
            params = params
                .saturating_add(product(&[d_in, d_out]))
                .saturating_add(bn.saturating_mul(2));
        }
        let shrink = |d: u64| (d - 1) / stride + 1;
        Ok(Known {
            signature: None,
            kind: LayerKind::Conv,
            params,
            output: vec![out, shrink(h), shrink(w)],
        })
    }
}
