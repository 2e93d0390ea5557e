//! Measured per-layer costs.
//!
//! ralpc's own format, `ralpc-profile/1` (JSON):
//!
//! ```json
//! {
//!   "format": "ralpc-profile/1",
//!   "device": { "name": "a100-sxm4-40gb", "note": "where and how it was measured" },
//!   "precision": "tf32",
//!   "entries": [
//!     { "op": "Conv",
//!       "attrs": { "kernel": [3, 3], "stride": [1, 1], "dilation": [1, 1], "group": [1] },
//!       "input": [3, 224, 224], "output": [64, 224, 224],
//!       "points": [ { "batch": 32, "forward_us": 1088.0, "backward_us": 3.0,
//!                     "peak_bytes": null } ] }
//!   ]
//! }
//! ```
//!
//! An entry is keyed by a [`Signature`]: the ONNX op type, the attributes that change its
//! cost, and the per-sample shapes of its first input and output (batch axis removed). Its
//! points are measurements at several per-GPU batch sizes: forward and backward µs and,
//! when known, the peak bytes allocated. A lookup interpolates linearly between measured
//! batches; above the largest it scales the largest linearly, below the smallest it keeps
//! the smallest's time (a kernel does not get cheaper than its smallest measurement).
//!
//! Two planners' inputs are read too ([`load`] detects the format from the file):
//! PipeDream's `graph.txt` becomes a layer graph with measured layers, DeepPool's
//! `.prof` becomes a [`Profile`].

mod deeppool;
mod pipedream;
mod signature;

use std::path::Path;

use ralpc_ir::input::{read_input_text, InputKind};
use serde::{Deserialize, Serialize};

pub use deeppool::{deeppool_layers, parse_deeppool};
pub use pipedream::{parse_pipedream, PipeDreamGraph};
pub use signature::Signature;

use crate::cluster::Precision;
use crate::layers::LayerGraph;

/// The format tag this version writes and reads.
pub const FORMAT: &str = "ralpc-profile/1";

// Bounds far beyond any measurement, so that sums, extrapolations and unit changes of
// what a profile says stay finite (a 1e308 µs point extrapolated to inf).

/// The longest time one op's pass may take: an hour, µs.
pub(crate) const MAX_US: f64 = 3.6e9;
/// The widest spread of timed runs: a thousand times their median.
const MAX_SPREAD: f64 = 1e3;
/// The most bytes one op may allocate: a PiB.
const MAX_BYTES: u64 = 1 << 50;

/// One measurement.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// Per-GPU batch.
    pub batch: u64,
    /// Forward time, µs.
    pub forward_us: f64,
    /// Backward time, µs.
    pub backward_us: f64,
    /// Peak bytes allocated, when measured.
    #[serde(default)]
    pub peak_bytes: Option<u64>,
    /// The forward runs' interquartile range over their median (0.1: the middle half
    /// within 10 %), when ralpc timed them one by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_spread: Option<f64>,
    /// The same for the backward runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backward_spread: Option<f64>,
}

/// Measurements of one op signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// What was measured.
    #[serde(flatten)]
    pub signature: Signature,
    /// At which batches, sorted by batch.
    pub points: Vec<Point>,
}

/// The device a profile was measured on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Name.
    pub name: String,
    /// Free text: provenance, settings.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// A profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Always [`FORMAT`].
    pub format: String,
    /// Where it was measured.
    pub device: Device,
    /// The math precision of the measurements.
    pub precision: Precision,
    /// Entries, sorted by signature.
    pub entries: Vec<Entry>,
}

/// How a lookup found its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    /// A measured batch.
    Measured,
    /// Between two measured batches.
    Interpolated,
    /// Outside the measured batches.
    Extrapolated,
}

/// A lookup's answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lookup {
    /// Forward, µs.
    pub fwd_us: f64,
    /// Backward, µs.
    pub bwd_us: f64,
    /// How.
    pub found: Found,
}

/// Why a profile could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// The file could not be read.
    #[error("cannot read profile {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not a format ralpc knows.
    #[error("{path}: not a ralpc profile (JSON with \"format\": \"{FORMAT}\"), a PipeDream graph.txt or a DeepPool .prof")]
    UnknownFormat {
        /// The file.
        path: String,
    },
    /// A problem at a line of a text format.
    #[error("{path}:{line}: {message}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A problem in a JSON profile or the file as a whole.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong (names the field or entry).
        message: String,
    },
}

impl Profile {
    /// Sorts entries and points and checks the figures.
    ///
    /// # Errors
    /// A duplicate signature or batch, a zero batch, a negative or non-finite time.
    pub fn normalize(mut self, path: &str) -> Result<Profile, ProfileError> {
        let invalid = |message: String| ProfileError::Invalid {
            path: path.to_owned(),
            message,
        };
        if self.format != FORMAT {
            return Err(invalid(format!(
                "format is \"{}\"; this ralpc reads \"{FORMAT}\"",
                self.format
            )));
        }
        self.entries.sort_by(|a, b| a.signature.cmp(&b.signature));
        for pair in self.entries.windows(2) {
            if pair[0].signature == pair[1].signature {
                return Err(invalid(format!(
                    "entry {} appears twice",
                    pair[0].signature
                )));
            }
        }
        for entry in &mut self.entries {
            entry.points.sort_by_key(|p| p.batch);
            if entry.points.is_empty() {
                return Err(invalid(format!("entry {} has no points", entry.signature)));
            }
            for (i, p) in entry.points.iter().enumerate() {
                let bad_time = |t: f64| !(0.0..=MAX_US).contains(&t);
                if p.batch == 0 || bad_time(p.forward_us) || bad_time(p.backward_us) {
                    return Err(invalid(format!(
                        "entry {}: point {i}: batch must be ≥ 1 and times between 0 and an \
                         hour ({MAX_US:e} µs)",
                        entry.signature
                    )));
                }
                let bad_spread =
                    |s: Option<f64>| s.is_some_and(|s| !(0.0..=MAX_SPREAD).contains(&s));
                if bad_spread(p.forward_spread) || bad_spread(p.backward_spread) {
                    return Err(invalid(format!(
                        "entry {}: point {i}: a spread is a ratio between 0 and {MAX_SPREAD}",
                        entry.signature
                    )));
                }
                if p.peak_bytes.is_some_and(|b| b > MAX_BYTES) {
                    return Err(invalid(format!(
                        "entry {}: point {i}: peak_bytes above {MAX_BYTES} (a PiB)",
                        entry.signature
                    )));
                }
                if i > 0 && entry.points[i - 1].batch == p.batch {
                    return Err(invalid(format!(
                        "entry {}: batch {} measured twice",
                        entry.signature, p.batch
                    )));
                }
            }
        }
        Ok(self)
    }

    /// Parses and checks a JSON profile.
    ///
    /// # Errors
    /// Malformed JSON, an unknown field, a wrong version, bad figures.
    pub fn from_json(text: &str, path: &str) -> Result<Profile, ProfileError> {
        let profile: Profile = serde_json::from_str(text).map_err(|e| ProfileError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        profile.normalize(path)
    }

    /// The profile as pretty JSON (deterministic).
    pub fn to_json(&self) -> String {
        // Strings and numbers always serialize.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// The entry for a signature.
    pub fn entry(&self, signature: &Signature) -> Option<&Entry> {
        self.entries
            .binary_search_by(|e| e.signature.cmp(signature))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// Times of `signature` at a (possibly fractional) per-GPU batch.
    pub fn lookup(&self, signature: &Signature, batch: f64) -> Option<Lookup> {
        self.entry(signature)?.at(batch)
    }
}

impl Entry {
    /// Times at a per-GPU batch (see the module docs for the rule).
    /// `None` for an entry without points ([`Profile::normalize`] rejects those).
    pub fn at(&self, batch: f64) -> Option<Lookup> {
        interpolate(&self.points, batch)
    }
}

/// Times at a per-GPU batch from measurements sorted by batch (see the module docs for the
/// rule); `None` without measurements.
pub fn interpolate(points: &[Point], batch: f64) -> Option<Lookup> {
    let (&first, &last) = (points.first()?, points.last()?);
    let at = |p: Point, found| Lookup {
        fwd_us: p.forward_us,
        bwd_us: p.backward_us,
        found,
    };
    if let Some(p) = points.iter().find(|p| p.batch as f64 == batch) {
        return Some(at(*p, Found::Measured));
    }
    if batch < first.batch as f64 {
        return Some(at(first, Found::Extrapolated));
    }
    if batch > last.batch as f64 {
        let scale = batch / last.batch as f64;
        return Some(Lookup {
            fwd_us: last.forward_us * scale,
            bwd_us: last.backward_us * scale,
            found: Found::Extrapolated,
        });
    }
    let upper = points
        .iter()
        .position(|p| p.batch as f64 > batch)
        .unwrap_or(points.len() - 1);
    let (lo, hi) = (points[upper - 1], points[upper]);
    let t = (batch - lo.batch as f64) / (hi.batch - lo.batch) as f64;
    Some(Lookup {
        fwd_us: lo.forward_us + t * (hi.forward_us - lo.forward_us),
        bwd_us: lo.backward_us + t * (hi.backward_us - lo.backward_us),
        found: Found::Interpolated,
    })
}

/// What a profile file held.
#[derive(Debug)]
pub enum Loaded {
    /// A per-op profile (ralpc's format or DeepPool's).
    Profile(Profile),
    /// A layer graph with measured layers (PipeDream's).
    LayerGraph(PipeDreamGraph),
}

/// Reads a profile file, detecting its format: JSON (`{`), PipeDream (`nodeN -- ... --
/// forward_compute_time=`), or DeepPool (`layer{json}[batch]...`).
///
/// # Errors
/// Unreadable, unknown or malformed files, naming the line or field.
pub fn load(path: &Path) -> Result<Loaded, ProfileError> {
    let name = path.display().to_string();
    let text = read_input_text(path, InputKind::Text).map_err(|source| ProfileError::Read {
        path: name.clone(),
        source,
    })?;
    parse(&text, &name)
}

/// [`load`] on text already read; `path` names it in errors.
///
/// # Errors
/// See [`load`].
pub fn parse(text: &str, path: &str) -> Result<Loaded, ProfileError> {
    match detect(text) {
        Some(Format::Ralpc) => Profile::from_json(text, path).map(Loaded::Profile),
        Some(Format::PipeDream) => parse_pipedream(text, path, None).map(Loaded::LayerGraph),
        Some(Format::DeepPool) => parse_deeppool(text, path).map(Loaded::Profile),
        None => Err(unknown(path)),
    }
}

/// Reads a planner's profile given as the model: PipeDream's graph as it is, DeepPool's as
/// a chain of measured layers. `batch` is the batch to plan (DeepPool's, which measured
/// several) or the one the file was measured at (PipeDream's, when the file cannot tell).
///
/// # Errors
/// [`ProfileError::UnknownFormat`] for text of no known format (the caller may try
/// another reader); a ralpc profile, which times ops and is no model; malformed files.
pub fn parse_model(text: &str, path: &str, batch: Option<u64>) -> Result<LayerGraph, ProfileError> {
    match detect(text) {
        Some(Format::PipeDream) => parse_pipedream(text, path, batch).map(|g| g.graph),
        Some(Format::DeepPool) => deeppool_layers(text, path, batch),
        Some(Format::Ralpc) => Err(ProfileError::Invalid {
            path: path.to_owned(),
            message: "a per-op profile, not a model: give it with --profile".into(),
        }),
        None => Err(unknown(path)),
    }
}

/// Whether `text` is a PipeDream profiler graph: a model measured at one batch, which it
/// keeps (a DeepPool profile plans any batch it measured).
pub fn is_pipedream_graph(text: &str) -> bool {
    matches!(detect(text), Some(Format::PipeDream))
}

fn unknown(path: &str) -> ProfileError {
    ProfileError::UnknownFormat {
        path: path.to_owned(),
    }
}

/// The formats a profile file can have.
enum Format {
    /// `ralpc-profile/1` (JSON).
    Ralpc,
    /// `nodeN -- ... -- forward_compute_time=...`.
    PipeDream,
    /// `layer{json}[batch]...`.
    DeepPool,
}

/// The format of a text, from its first non-empty line.
fn detect(text: &str) -> Option<Format> {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if first.starts_with('{') {
        Some(Format::Ralpc)
    } else if first.starts_with("node") && first.contains(" -- ") {
        Some(Format::PipeDream)
    } else if first.contains('{') && first.contains("}[") {
        Some(Format::DeepPool)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(points: &[(u64, f64)]) -> Entry {
        Entry {
            signature: Signature {
                op: "Relu".into(),
                attrs: Default::default(),
                input: vec![4],
                output: vec![4],
            },
            points: points
                .iter()
                .map(|&(batch, t)| Point {
                    batch,
                    forward_us: t,
                    backward_us: 2.0 * t,
                    peak_bytes: None,
                    forward_spread: None,
                    backward_spread: None,
                })
                .collect(),
        }
    }

    #[test]
    fn interpolates_between_and_scales_beyond() {
        let e = entry(&[(2, 10.0), (4, 30.0)]);
        assert_eq!(e.at(2.0).unwrap().found, Found::Measured);
        assert_eq!(entry(&[]).at(2.0), None);
        assert_eq!(e.at(3.0).unwrap().fwd_us, 20.0);
        assert_eq!(e.at(3.0).unwrap().bwd_us, 40.0);
        assert_eq!(e.at(3.0).unwrap().found, Found::Interpolated);
        assert_eq!(e.at(8.0).unwrap().fwd_us, 60.0);
        assert_eq!(e.at(8.0).unwrap().found, Found::Extrapolated);
        // Never cheaper than the smallest measurement.
        assert_eq!(e.at(1.0).unwrap().fwd_us, 10.0);
    }

    #[test]
    fn json_round_trip_and_validation() {
        let profile = Profile {
            format: FORMAT.into(),
            device: Device {
                name: "toy".into(),
                note: String::new(),
            },
            precision: Precision::Fp32,
            entries: vec![entry(&[(4, 3.0), (1, 1.0)])],
        }
        .normalize("p.json")
        .unwrap();
        assert_eq!(profile.entries[0].points[0].batch, 1);
        let text = profile.to_json();
        assert_eq!(Profile::from_json(&text, "p.json").unwrap(), profile);
        let bad = [
            (text.replace(FORMAT, "ralpc-profile/9"), "ralpc-profile/9"),
            (
                text.replace("\"batch\": 1,", "\"batch\": 0,"),
                "batch must be",
            ),
            (
                text.replace("\"batch\": 1,", "\"batch\": 4,"),
                "measured twice",
            ),
            (text.replace("\"op\"", "\"opp\""), "missing field `op`"),
            (
                text.replace("\"device\"", "\"devise\""),
                "unknown field `devise`",
            ),
            (text[..text.len() / 2].to_owned(), "EOF"),
        ];
        for (text, expected) in bad {
            let message = Profile::from_json(&text, "p.json").unwrap_err().to_string();
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn unknown_formats_are_named() {
        let message = parse("hello\n", "x.txt").unwrap_err().to_string();
        assert!(message.contains("not a ralpc profile"), "{message}");
    }
}
